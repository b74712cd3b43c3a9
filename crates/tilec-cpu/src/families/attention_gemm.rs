//! `cpu.attention_gemm`: attention as two matrix products around a row softmax per (batch,
//! head), the score matrix in scratch (f32 attention without past, per-batch lengths or a
//! requested QK output; softcapping and sliding windows in the scores' epilogue).

use tilec_opt::target::Target;
use tilec_tile::family::{Family, Params, Problem};
use tilec_tile::lower::{AttentionAlgo, LowerOptions};
use tilec_tile::schedule::default_cpu;

use super::{build_with, CpuBuilt};

pub struct AttentionGemm;
pub static ATTENTION_GEMM: AttentionGemm = AttentionGemm;

impl Family for AttentionGemm {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.attention_gemm"
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        match p.anchor_op() {
            Some(tilec_ir::Op::Nn(tilec_ir::op::NnOp::Attention { .. })) => Ok(()),
            _ => Err("not attention".into()),
        }
    }

    fn build(&self, p: &Problem, t: &Target, _params: &Params) -> Result<CpuBuilt, String> {
        let opts = LowerOptions { attention: AttentionAlgo::Gemm, ..Default::default() };
        build_with(p, opts, |k| default_cpu(k, &t.cpu))
    }
}
