//! `cpu.conv_transpose`: transposed convolutions (UNet and FCN decoders, DCGAN generators,
//! 1-D upsamplers) as one batched `Gemm` over their output phases
//! (`tilec_tile::lower::conv_transpose`): per image, group and phase of the stride, the
//! phase's sub-kernel times an implicit im2col of the input, rendered by the GEMM template
//! (weights packed once ahead of the calls, input panels packed with vector loads), bias and
//! the following elementwise ops in the epilogue. Its schedule is the default CPU one (the
//! GEMM's orientation and blocking). Dilated ones, and ones too small for a matrix product,
//! stay with `cpu.direct`.

use tilec_ir::op::LinalgOp;
use tilec_ir::Op;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, Params, Problem};
use tilec_tile::lower::conv_transpose::refusal;
use tilec_tile::lower::{ConvAlgo, LowerOptions};
use tilec_tile::schedule::default_cpu;

use super::{build_with, has_gemm, CpuBuilt};

pub struct ConvTranspose;
pub static CONV_TRANSPOSE: ConvTranspose = ConvTranspose;

const OPTS: LowerOptions = LowerOptions {
    conv: ConvAlgo::Gemm,
    attention: tilec_tile::lower::AttentionAlgo::Rows,
    pool: tilec_tile::lower::PoolAlgo::PerOutput,
};

impl Family for ConvTranspose {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.conv_transpose"
    }

    /// The shape tests ([`refusal`]), then a lowering that holds the matrix product (dtypes).
    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        let Some(Op::Linalg(LinalgOp::ConvTranspose { strides, dilations, group, .. })) = p.anchor_op() else {
            return Err("not a transposed convolution".into());
        };
        let node = p.graph.node(p.anchor.unwrap_or(p.nodes[0]));
        let fixed = |v| p.graph.value(v).ty.fixed_shape().map(|s| s.into_iter().map(|d| d as i64).collect::<Vec<_>>());
        let (Some(xs), Some(ws)) = (fixed(node.inputs[0]), fixed(node.inputs[1])) else {
            return Err("symbolic shapes".into());
        };
        if let Some(why) = refusal(&xs, &ws, strides, dilations, *group) {
            return Err(why);
        }
        let l = p.lower(OPTS).map_err(|e| e.to_string())?;
        if !has_gemm(&l.kernel) {
            return Err("it lowers to no matrix product".into());
        }
        Ok(())
    }

    fn build(&self, p: &Problem, t: &Target, _params: &Params) -> Result<CpuBuilt, String> {
        build_with(p, OPTS, |k| default_cpu(k, &t.cpu))
    }
}
