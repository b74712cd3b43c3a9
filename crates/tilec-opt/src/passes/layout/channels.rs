//! `pad-thin-channels` (CUDA): a channels-last 2-D convolution of one group over 16-bit
//! inputs of 1 to 3 (or 5 to 7) channels, with constant weights (an image's first
//! convolution), reads an input padded with zero channels to 4 (or 8), and weights padded
//! with zero input channels to match. The result is the same: the added channels are zeros
//! on both sides.
//!
//! The tensor-core convolution copies its input into shared memory asynchronously, in whole
//! pixels of 8 or 16 bytes; a pixel of 3 half-precision channels (6 bytes) can only be read
//! element by element, with the tap's bounds worked out per element, which left ResNet-50's
//! first convolution bound by that arithmetic (about a third of cuDNN's speed). The padded
//! copy of the input is a memory-bound kernel of its own, in which the layout transpose in
//! front of a channels-first model's first convolution fuses.

use super::super::{finish, ir};
use crate::{OptError, Pass};
use tilec_ir::op::{LayoutOp, LinalgOp, PadMode};
use tilec_ir::{DType, Graph, Op, Tensor};

/// The channel count a convolution over `c` input channels is padded to, if any: 4 for 1 to
/// 3, 8 for 5 to 7 (whole 8- and 16-byte pixels of 16-bit elements).
pub fn padded_channels(c: usize) -> Option<usize> {
    match c {
        1..=3 => Some(4),
        5..=7 => Some(8),
        _ => None,
    }
}

pub struct PadThinChannels;

impl Pass for PadThinChannels {
    fn name(&self) -> &'static str {
        "pad-thin-channels"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let mut edits = vec![];
        for n in g.nodes() {
            let Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: true }) = &n.op else {
                continue;
            };
            if window.rank() != 2 || n.inputs.len() < 2 {
                continue;
            }
            let (Some(xs), Some(w)) = (g.value(n.inputs[0]).ty.fixed_shape(), g.const_value(n.inputs[1])) else {
                continue;
            };
            let dt = g.value(n.inputs[0]).ty.dtype;
            if xs.len() != 4 || w.rank() != 4 || w.dtype() != dt || !matches!(dt, DType::F16 | DType::BF16) {
                continue;
            }
            let c = xs[3];
            let Some(cp) = padded_channels(c) else {
                continue;
            };
            if w.shape()[1] != c {
                continue;
            }
            edits.push((n.name.clone(), n.inputs.clone(), n.outputs[0], cp, window.clone(), w.clone()));
        }
        let changed = !edits.is_empty();
        for (name, inputs, out, cp, window, w) in edits {
            let d = g.value(inputs[0]).ty.dtype;
            let c = w.shape()[1];
            // The input: zero channels after its own (channels-last: the last axis).
            let mut pads = vec![0i64; 8];
            pads[7] = (cp - c) as i64;
            let zero = Tensor::from_f64s(d, vec![], &[0.0]).map_err(|e| OptError::Pass { pass: self.name(), msg: e.to_string() })?;
            let zero = g.add_const(&format!("{name}.channel_pad_value"), zero);
            let padded = g
                .add_node(&format!("{name}.channel_pad"), Op::Layout(LayoutOp::Pad { pads, mode: PadMode::Constant }), &[inputs[0], zero])
                .map_err(ir(self.name()))?;
            let weights = g.add_const(&format!("{name}.channel_padded_weights"), pad_weights(&w, cp).map_err(|msg| OptError::Pass { pass: self.name(), msg })?);
            let mut args = vec![padded[0], weights];
            args.extend_from_slice(&inputs[2..]);
            let conv = g
                .add_node(&name, Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: true }), &args)
                .map_err(ir(self.name()))?;
            g.replace_all_uses(out, conv[0]).map_err(ir(self.name()))?;
        }
        finish(g, "pad-thin-channels", changed)
    }
}

/// Weights `[O][C][KH][KW]` with zero input channels appended up to `cp`.
fn pad_weights(w: &Tensor, cp: usize) -> Result<Tensor, String> {
    let s = w.shape();
    let (o, c, taps) = (s[0], s[1], s[2] * s[3]);
    let es = w.dtype().size_bytes();
    let bytes = w.to_le_bytes();
    let mut out = vec![0u8; o * cp * taps * es];
    for oi in 0..o {
        let src = oi * c * taps * es;
        let dst = oi * cp * taps * es;
        out[dst..dst + c * taps * es].copy_from_slice(&bytes[src..src + c * taps * es]);
    }
    Tensor::from_le_bytes(w.dtype(), vec![o, cp, s[2], s[3]], &out).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_counts_and_weights() {
        assert_eq!(padded_channels(3), Some(4));
        assert_eq!(padded_channels(6), Some(8));
        assert_eq!(padded_channels(4), None);
        assert_eq!(padded_channels(8), None);
        assert_eq!(padded_channels(64), None);
        let vals: Vec<f64> = (0..2 * 3 * 2 * 2).map(|i| i as f64 + 1.0).collect();
        let w = Tensor::from_f64s(DType::F16, vec![2, 3, 2, 2], &vals).unwrap();
        let p = pad_weights(&w, 4).unwrap();
        assert_eq!(p.shape(), &[2, 4, 2, 2]);
        let got = p.to_f64_vec();
        // Output channel 1 starts after 4 padded channels of 4 taps; its first 12 are kept.
        assert_eq!(&got[..12], &vals[..12]);
        assert!(got[12..16].iter().all(|&x| x == 0.0));
        assert_eq!(&got[16..28], &vals[12..24]);
        assert!(got[28..].iter().all(|&x| x == 0.0));
    }
}
