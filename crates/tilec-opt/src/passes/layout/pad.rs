//! `pad-thin-convs` (CPU): a channels-last convolution over at most [`MAX_CHANNELS`] input
//! channels per group (an image's first convolution) gets its zero padding as an explicit
//! `pad` in front of it, and no padding of its own.
//!
//! Such a convolution reads each input element once per tap, and its im2col rows are only
//! `channels × kernel width` long. With the padding inside the conv, every element read checks
//! bounds, which splits those rows into single-channel pieces; with a padded copy (which the
//! partitioner materializes in front of a thin convolution rather than folding it into the
//! operand), the conv's operand is a plain read of contiguous `kernel width × channels` runs,
//! and the CPU GEMM reads it in place. The copy is small: the input image with its border.
//! Depthwise convolutions (one input channel per group, any channel multiplier) and grouped
//! ones of at least [`MIN_GROUPS`] groups keep their padding: `cpu.depthwise` computes the
//! border pixels without bounds checks.

use super::super::{finish, ir};
use crate::{OptError, Pass};
use tilec_ir::op::{window_geometry, LayoutOp, LinalgOp, PadMode, Padding};
use tilec_ir::{Graph, Op, Tensor};

/// Most input channels per group of a convolution this pass pads explicitly.
pub const MAX_CHANNELS: usize = 4;
/// Fewest groups of a grouped convolution that keeps its padding (a vector's lanes of groups,
/// which `cpu.depthwise` takes).
pub const MIN_GROUPS: usize = 16;

pub struct PadThinConvs;

impl Pass for PadThinConvs {
    fn name(&self) -> &'static str {
        "pad-thin-convs"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let mut edits = vec![];
        for n in g.nodes() {
            let Op::Linalg(LinalgOp::Conv { window, group, channels_last: true }) = &n.op else {
                continue;
            };
            let (Some(xs), Some(ws)) = (g.value(n.inputs[0]).ty.fixed_shape(), g.value(n.inputs[1]).ty.fixed_shape()) else {
                continue;
            };
            let r = xs.len();
            if r < 3 || ws.len() != r || ws[1] > MAX_CHANNELS || !g.value(n.inputs[0]).ty.dtype.is_float() {
                continue;
            }
            // A depthwise convolution (one input channel per group, output channels a multiple
            // of the input's), or a grouped one of at least [`MIN_GROUPS`] groups: the CPU's
            // depthwise family splits the padding off into border code, a copy only costs.
            let grouped = *group > 1 && xs[r - 1] == *group * ws[1] && ws[0] % *group == 0;
            if grouped && (ws[1] == 1 || *group >= MIN_GROUPS) {
                continue;
            }
            // The spatial padding the conv applies (channels-last: axes 1..r-1).
            let mut begin = vec![0i64; r];
            let mut end = vec![0i64; r];
            let mut any = false;
            let mut ok = true;
            for (j, &s) in xs[1..r - 1].iter().enumerate() {
                match window_geometry(s, window, j, false) {
                    Ok((_, pb, pe)) => {
                        begin[j + 1] = pb as i64;
                        end[j + 1] = pe as i64;
                        any |= pb > 0 || pe > 0;
                    }
                    Err(_) => ok = false,
                }
            }
            if !ok || !any {
                continue;
            }
            let mut w2 = window.clone();
            w2.pads = Padding::Explicit(vec![0; 2 * (r - 2)]);
            let mut pads = begin;
            pads.extend(end);
            edits.push((n.name.clone(), n.inputs.clone(), n.outputs[0], pads, w2, *group));
        }
        let changed = !edits.is_empty();
        for (name, inputs, out, pads, window, group) in edits {
            let d = g.value(inputs[0]).ty.dtype;
            let zero = Tensor::from_f64s(d, vec![], &[0.0])
                .map_err(|e| OptError::Pass { pass: "pad-thin-convs", msg: e.to_string() })?;
            let zero = g.add_const(&format!("{name}.pad_value"), zero);
            let padded = g
                .add_node(&format!("{name}.pad"), Op::Layout(LayoutOp::Pad { pads, mode: PadMode::Constant }), &[inputs[0], zero])
                .map_err(ir("pad-thin-convs"))?;
            let conv = g
                .add_node(
                    &name,
                    Op::Linalg(LinalgOp::Conv { window, group, channels_last: true }),
                    &[padded[0], inputs[1], inputs[2]],
                )
                .map_err(ir("pad-thin-convs"))?;
            g.replace_all_uses(out, conv[0]).map_err(ir("pad-thin-convs"))?;
        }
        finish(g, "pad-thin-convs", changed)
    }
}
