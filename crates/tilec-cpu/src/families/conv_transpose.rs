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
use tilec_tile::schedule::{apply, default_cpu, gemm_params, Primitive, Schedule};
use tilec_tile::indirect::indirect_form;
use tilec_tile::{Kernel, Stmt};

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
        build_with(p, OPTS, |k| schedule(k, t))
    }
}

/// The default CPU schedule, except for each phase's orientation: the register tile runs
/// along whichever of output channels and grid positions wastes less of it; a product of one
/// row (a single input position) is a matrix-vector product. (The default
/// keeps an implicit im2col with bounds as `B` whatever its width; a phase of a decoder's
/// first layers has a grid of 4×4 positions and hundreds of channels.)
fn schedule(k: &Kernel, t: &Target) -> Schedule {
    let mut flips = vec![];
    for st in &k.body {
        st.visit(&mut |st| {
            if let Stmt::Gemm(g) = st {
                let p = gemm_params(g, &t.cpu, false);
                let pad = |x: i64, r: i64| (x.max(1) + r - 1) / r * r;
                let now = pad(g.m, p.mr) as i128 * pad(g.n, p.nr) as i128;
                let swapped = pad(g.n, p.mr) as i128 * pad(g.m, p.nr) as i128;
                if swapped * 10 < now * 9 {
                    flips.push(k.var_info(g.i_var).name.clone());
                }
            }
        });
    }
    let mut s = Schedule::new();
    let mut w = k.clone();
    for name in flips {
        let step = Primitive::GemmTranspose { gemm: Some(name) };
        let mut trial = w.clone();
        if apply(&mut trial, &Schedule { steps: vec![step.clone()] }).is_ok() {
            w = trial;
            s.push(step);
        }
    }
    // The blocking of each phase in that orientation; the rest (loops, partitions) as the
    // default has it.
    let mut blockings = vec![];
    for st in &w.body {
        st.visit(&mut |st| {
            if let Stmt::Gemm(g) = st {
                let gemm = Some(w.var_info(g.i_var).name.clone());
                if g.m == 1 {
                    // A single input position: one row against the weights, streamed by the
                    // matrix-vector template.
                    blockings.push(Primitive::GemmVector { gemm });
                    return;
                }
                let p = gemm_params(g, &t.cpu, indirect_form(&w, g).is_some());
                blockings.push(Primitive::GemmBlocking { gemm, mr: p.mr, nr: p.nr, kc: p.kc, mc: p.mc, nc: p.nc });
            }
        });
    }
    s.steps.extend(blockings);
    for step in default_cpu(&w, &t.cpu).steps {
        if !matches!(step, Primitive::GemmTranspose { .. } | Primitive::GemmBlocking { .. }) {
            s.push(step);
        }
    }
    s
}
