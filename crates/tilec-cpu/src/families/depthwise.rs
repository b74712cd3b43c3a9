//! `cpu.depthwise`: depthwise convolutions (one input channel per group) and grouped ones
//! with at most 8 input and output channels per group and at least a vector's lanes of
//! groups, channels-last and 2-D, as loops vectorized along the groups with register blocks of
//! output pixels and the padding split off into border code without bounds checks
//! (`tilec_tile::lower::depthwise`). Its schedule: the row loop parallel, every channel loop
//! vectorized; nothing else moves. Grouped convolutions whose groups' output channels fill
//! whole vectors (groups of 8 with AVX2) go to `cpu.group_direct`, tried first.

use tilec_ir::op::LinalgOp;
use tilec_ir::Op;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, Params, Problem};
use tilec_tile::lower::depthwise::{refusal, CHANNEL_LOOP, ROW_LOOP};
use tilec_tile::lower::{ConvAlgo, LowerOptions};
use tilec_tile::schedule::Schedule;
use tilec_tile::Kernel;

use super::{build_with, fixed_dims as dims, CpuBuilt};

pub struct Depthwise;
pub static DEPTHWISE: Depthwise = Depthwise;

/// The lowering, with two-pixel blocks of 8 output channels where AVX-512's 32 vector
/// registers hold their 16 accumulators.
fn opts(t: &Target) -> LowerOptions {
    let conv = ConvAlgo::Depthwise { wide: t.cpu.avx512f };
    LowerOptions { conv, attention: tilec_tile::lower::AttentionAlgo::Rows, pool: tilec_tile::lower::PoolAlgo::PerOutput }
}

/// The schedule: the row loop parallel, the lane loops vectorized.
fn schedule(k: &Kernel) -> Schedule {
    super::by_loop_names(k, ROW_LOOP, CHANNEL_LOOP)
}

impl Family for Depthwise {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.depthwise"
    }

    /// The shape tests; lowering checks the dtypes.
    fn applies(&self, p: &Problem, t: &Target) -> Result<(), String> {
        let Some(Op::Linalg(LinalgOp::Conv { window: w, group, channels_last })) = p.anchor_op() else {
            return Err("not a convolution".into());
        };
        let node = p.graph.node(p.anchor.unwrap_or(p.nodes[0]));
        let (Some(xs), Some(ws), Some(os)) = (dims(p, node.inputs[0]), dims(p, node.inputs[1]), dims(p, node.outputs[0])) else {
            return Err("symbolic shapes".into());
        };
        if xs.len() != 4 || ws.len() != 4 || os.len() != 4 {
            return Err(format!("a {}-D convolution, not 2-D", xs.len().saturating_sub(2)));
        }
        let Ok(geo) = (0..2)
            .map(|j| {
                tilec_ir::op::window_geometry(xs[1 + j] as usize, w, j, false).map(|(o, pb, pe)| (o as i64, pb as i64, pe as i64))
            })
            .collect::<Result<Vec<_>, _>>()
        else {
            return Err("its window does not fit the input".into());
        };
        // Channels-first the spatial axes are 2 and 3: the shape test reads them as
        // channels-last, so say "not channels-last" first.
        if !channels_last {
            return Err("not channels-last".into());
        }
        if let Some(why) = refusal(&xs, &ws, *group, *channels_last, w, &geo) {
            return Err(why);
        }
        // A grouped convolution's lanes are its groups: with fewer groups than a vector holds,
        // the GEMM families (`cpu.grouped`, `cpu.blis_gemm`) fill their registers better.
        let lanes = t.cpu.lanes(p.graph.value(node.outputs[0]).ty.dtype);
        if ws[1] > 1 && (*group as i64) < lanes {
            return Err(format!("{group} groups of {} input channels, fewer groups than the {lanes} lanes of a vector", ws[1]));
        }
        Ok(())
    }

    fn build(&self, p: &Problem, t: &Target, _params: &Params) -> Result<CpuBuilt, String> {
        build_with(p, opts(t), schedule)
    }
}
