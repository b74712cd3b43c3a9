//! `cpu.winograd`: 3×3 stride-1 channels-last convolutions, dilated ones phase by phase
//! (at least 6 outputs per phase), as Winograd F(4×4, 3×3) or F(2×2, 3×3) (input transform,
//! a batched `Gemm` against the transformed filter, output transform; `tilec_tile::lower`
//! carries it out), 2.25 to 4 times fewer multiply-adds.

use tilec_ir::op::LinalgOp;
use tilec_ir::Op;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, Params, Problem};
use tilec_tile::lower::{ConvAlgo, LowerOptions};
use tilec_tile::schedule::default_cpu;

use super::{build_with, CpuBuilt};

pub struct Winograd;
pub static WINOGRAD: Winograd = Winograd;

impl Family for Winograd {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.winograd"
    }

    /// The shape tests that need no lowering; lowering checks the rest (channels, tiles,
    /// dtypes, a plain input).
    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        let Some(Op::Linalg(LinalgOp::Conv { window: w, group, channels_last })) = p.anchor_op() else {
            return Err("not a convolution".into());
        };
        if w.kernel != [3, 3] {
            return Err(format!("a {:?} kernel, not 3x3", w.kernel));
        }
        if w.strides.iter().any(|&s| s != 1) {
            return Err("strided".into());
        }
        if *group != 1 {
            return Err(format!("{group} groups"));
        }
        if !channels_last {
            return Err("not channels-last".into());
        }
        Ok(())
    }

    fn build(&self, p: &Problem, t: &Target, _params: &Params) -> Result<CpuBuilt, String> {
        let opts = LowerOptions { conv: ConvAlgo::Winograd, ..Default::default() };
        build_with(p, opts, |k| default_cpu(k, &t.cpu))
    }
}
