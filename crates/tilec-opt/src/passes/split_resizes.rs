//! `split-resizes` (CPU): a linear resize over several axes becomes one resize per axis, when
//! the last of them makes at least [`MIN_LAST_RATIO`] outputs of each input.
//!
//! Linear interpolation is a product over the axes, so resizing one axis after the other
//! computes the same values (up to float rounding). Fused, every output element weighs the
//! `2^k` corners of its cell, read at positions that vary along the innermost axis (gathers);
//! split, each pass weighs two taps, the passes before the last run over an intermediate a
//! fraction of the output's size, and the last pass resizes an outer axis, whose two taps are
//! the same for a whole row: plain vector loads. DeepLab-V3's head upsamples 21 maps of 14×14
//! to 224×224: 1M outputs of four gathered corners each before, 66K of two and 1M of two
//! contiguous rows after. Axes are taken by increasing ratio (the intermediates stay
//! smallest), the innermost first among equal ratios. The partitioner keeps the passes apart
//! (`partition`: a resize is not inlined into a resize).

use super::{finish, ir};
use crate::{OptError, Pass};
use tilec_ir::op::{CoordMode, LayoutOp, ResizeAttrs, ResizeMode};
use tilec_ir::{Dim, Graph, Op};

/// Least ratio of output to input size along the last resized axis for a split: the
/// intermediate is then at most this fraction of the output.
pub const MIN_LAST_RATIO: usize = 4;

pub struct SplitResizes;

impl Pass for SplitResizes {
    fn name(&self) -> &'static str {
        "split-resizes"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let mut edits = vec![];
        for n in g.nodes() {
            let Op::Layout(LayoutOp::Resize(a)) = &n.op else { continue };
            if n.inputs.len() != 1 || n.outputs.len() != 1 {
                continue;
            }
            let (Some(xs), Some(os)) = (g.value(n.inputs[0]).ty.fixed_shape(), g.value(n.outputs[0]).ty.fixed_shape()) else {
                continue;
            };
            if let Some(axes) = split_order(a, &xs, &os) {
                edits.push((n.name.clone(), n.inputs[0], n.outputs[0], (**a).clone(), xs, os, axes));
            }
        }
        let changed = !edits.is_empty();
        for (name, x, out, a, xs, os, axes) in edits {
            let mut cur = x;
            let mut shape = xs.clone();
            for &j in &axes {
                shape[j] = os[j];
                let step = ResizeAttrs {
                    sizes: shape.iter().map(|&d| Dim::Fixed(d)).collect(),
                    scales: (0..shape.len()).map(|k| if k == j { a.scales[k] } else { 1.0 }).collect(),
                    ..a.clone()
                };
                let v = g
                    .add_node(&format!("{name}.axis{j}"), Op::Layout(LayoutOp::Resize(Box::new(step))), &[cur])
                    .map_err(ir("split-resizes"))?;
                cur = v[0];
            }
            g.replace_all_uses(out, cur).map_err(ir("split-resizes"))?;
        }
        finish(g, "split-resizes", changed)
    }
}

/// The resized axes of a resize to split, in the order to resize them; `None` when it stays
/// one resize (other modes or coordinates than the CPU lowers, fewer than two resized axes,
/// an axis of one input, a last ratio under [`MIN_LAST_RATIO`]).
fn split_order(a: &ResizeAttrs, xs: &[usize], os: &[usize]) -> Option<Vec<usize>> {
    if a.mode != ResizeMode::Linear
        || a.antialias
        || !matches!(a.coord, CoordMode::HalfPixel | CoordMode::PytorchHalfPixel)
        || xs.len() != os.len()
        || a.scales.len() != xs.len()
        || a.sizes.len() != xs.len()
    {
        return None;
    }
    let fixed = a.sizes.iter().zip(os).all(|(d, &o)| *d == Dim::Fixed(o));
    let mut axes: Vec<usize> = (0..xs.len()).filter(|&j| xs[j] != os[j] || a.scales[j] != 1.0).collect();
    // An axis of one input is a broadcast, no interpolation: such resizes stay whole.
    if !fixed || axes.len() < 2 || axes.iter().any(|&j| xs[j] < 2) {
        return None;
    }
    // Increasing ratio (compared exactly: o1 / i1 < o2 / i2), the innermost axis first on ties.
    axes.sort_by(|&p, &q| (os[p] * xs[q]).cmp(&(os[q] * xs[p])).then(q.cmp(&p)));
    let last = *axes.last()?;
    (os[last] >= MIN_LAST_RATIO * xs[last]).then_some(axes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilec_ir::op::NearestMode;

    fn attrs(xs: &[usize], os: &[usize]) -> ResizeAttrs {
        ResizeAttrs {
            mode: ResizeMode::Linear,
            coord: CoordMode::HalfPixel,
            nearest: NearestMode::RoundPreferFloor,
            cubic_a: -0.75,
            exclude_outside: false,
            antialias: false,
            extrapolation_value: 0.0,
            sizes: os.iter().map(|&d| Dim::Fixed(d)).collect(),
            scales: xs.iter().zip(os).map(|(&i, &o)| o as f64 / i as f64).collect(),
            roi: vec![],
        }
    }

    #[test]
    fn order_and_threshold() {
        let order = |xs: &[usize], os: &[usize]| split_order(&attrs(xs, os), xs, os);
        // Equal ratios: the innermost axis first.
        assert_eq!(order(&[1, 21, 14, 14], &[1, 21, 224, 224]), Some(vec![3, 2]));
        // The smaller ratio first.
        assert_eq!(order(&[1, 2, 4, 8], &[1, 2, 32, 16]), Some(vec![3, 2]));
        assert_eq!(order(&[1, 2, 8, 4], &[1, 2, 16, 32]), Some(vec![2, 3]));
        // Last ratio under 4, one axis, a broadcast axis, other modes: one resize.
        assert_eq!(order(&[1, 2, 1, 1], &[1, 2, 14, 14]), None);
        assert_eq!(order(&[1, 2, 8, 8], &[1, 2, 16, 16]), None);
        assert_eq!(order(&[1, 2, 8, 8], &[1, 2, 8, 64]), None);
        let mut near = attrs(&[1, 2, 4, 4], &[1, 2, 32, 32]);
        near.mode = ResizeMode::Nearest;
        assert_eq!(split_order(&near, &[1, 2, 4, 4], &[1, 2, 32, 32]), None);
    }
}
