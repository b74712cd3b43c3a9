//! `cpu.group_direct`: channels-last 2-D grouped convolutions whose groups hold whole vectors
//! of output channels (16 and 32 per group: RegNet-X's stages, ResNeXt's last two), as a
//! direct kernel vectorized within each group (`tilec_tile::lower::group_direct`): a vector's
//! lanes are output channels of one group, each input value broadcast to them, a register
//! block of output pixels sharing each weight vector. No block-diagonal zeros, no im2col, no
//! packing per call. Its schedule: the row loop parallel, the lane loop vectorized.

use tilec_ir::op::LinalgOp;
use tilec_ir::Op;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, Params, Problem};
use tilec_tile::lower::group_direct::{refusal, LANE_LOOP, ROW_LOOP};
use tilec_tile::lower::{ConvAlgo, LowerOptions};
use tilec_tile::schedule::Schedule;
use tilec_tile::Kernel;

use super::{build_with, fixed_dims as dims, CpuBuilt};

pub struct GroupDirect;
pub static GROUP_DIRECT: GroupDirect = GroupDirect;

/// Most input channels per group it takes: deeper groups are products deep enough for the
/// GEMM template's packed panels.
pub const MAX_IN_CHANNELS: i64 = 32;

/// Pixels per register block, one accumulator register each: of AVX-512's 32 vector
/// registers or the 16 of AVX2, the rest keep weight vectors, the broadcast input and the
/// compiler's temporaries.
fn pixels(t: &Target) -> i64 {
    if t.cpu.avx512f {
        12
    } else {
        8
    }
}

fn opts(t: &Target) -> LowerOptions {
    let conv = ConvAlgo::GroupDirect { pixels: pixels(t) as u32 };
    LowerOptions { conv, ..Default::default() }
}

/// The schedule: the row loop parallel, the lane loops vectorized.
fn schedule(k: &Kernel) -> Schedule {
    super::by_loop_names(k, ROW_LOOP, LANE_LOOP)
}

/// The vector lanes of the convolution's output channels, or why it is not one this family
/// takes (the shape tests; lowering checks the rest).
fn lanes(p: &Problem, t: &Target) -> Result<i64, String> {
    let Some(Op::Linalg(LinalgOp::Conv { window: w, group, channels_last })) = p.anchor_op() else {
        return Err("not a convolution".into());
    };
    if !channels_last {
        return Err("not channels-last".into());
    }
    let node = p.graph.node(p.anchor.unwrap_or(p.nodes[0]));
    let (Some(xs), Some(ws), Some(os)) = (dims(p, node.inputs[0]), dims(p, node.inputs[1]), dims(p, node.outputs[0])) else {
        return Err("symbolic shapes".into());
    };
    if xs.len() != 4 || ws.len() != 4 || os.len() != 4 {
        return Err(format!("a {}-D convolution, not 2-D", xs.len().saturating_sub(2)));
    }
    let geo = (0..2)
        .map(|j| tilec_ir::op::window_geometry(xs[1 + j] as usize, w, j, false).map(|(o, pb, pe)| (o as i64, pb as i64, pe as i64)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "its window does not fit the input".to_string())?;
    if let Some(why) = refusal(&xs, &ws, *group, *channels_last, w, &geo) {
        return Err(why);
    }
    let dtype = p.graph.value(node.outputs[0]).ty.dtype;
    if !dtype.is_float() {
        return Err("not a floating-point convolution".into());
    }
    let lanes = t.cpu.lanes(dtype);
    let (cg, mg) = (ws[1], ws[0] / *group as i64);
    if cg < 2 {
        return Err("one input channel per group (depthwise)".into());
    }
    if cg > MAX_IN_CHANNELS {
        return Err(format!("{cg} input channels per group, more than {MAX_IN_CHANNELS}: deep enough for the GEMM template"));
    }
    // Strided with output rows shorter than a block (ResNeXt-50's and RegNet-X's last
    // stride-2 convolutions into 7x7): each row stages input rows twice as wide, and the
    // block broadcasts twice the columns; measured 1.03-1.09 of the GEMM family's time.
    let (stride, ow) = (w.strides.iter().copied().max().unwrap_or(1), os[2]);
    if stride > 1 && ow < pixels(t) {
        return Err(format!("strided, with output rows of {ow} pixels, shorter than a block of {}", pixels(t)));
    }
    if mg % lanes != 0 {
        return Err(format!("{mg} output channels per group, not whole vectors of {lanes}"));
    }
    Ok(lanes)
}

impl Family for GroupDirect {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.group_direct"
    }

    fn applies(&self, p: &Problem, t: &Target) -> Result<(), String> {
        lanes(p, t).map(|_| ())
    }

    fn build(&self, p: &Problem, t: &Target, _params: &Params) -> Result<CpuBuilt, String> {
        lanes(p, t)?;
        build_with(p, opts(t), schedule)
    }
}
