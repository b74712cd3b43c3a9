//! Sequence-to-image views around convolutions, in the order `choose-layout` recognizes.
//!
//! Transformers that convolve their token sequence (SegFormer's Mix-FFN, PVT's spatial
//! reductions) export the sequence `[B, L, C]` as an image through `transpose(0, 2, 1)` and a
//! reshape to `[B, C, H, W]`, and back through a reshape to `[B, C, L]` and the same
//! transpose. The same values are `reshape [B, H, W, C]` then `transpose(0, 3, 1, 2)`, and
//! `transpose(0, 2, 3, 1)` then a reshape to `[B, L, C]`: written so, a convolution region
//! is entered from channels-last and left into channels-last, transposes that its NHWC form
//! cancels. [`normalize`] rewrites both patterns where they feed or read a convolution (or
//! an activation of one).

use tilec_ir::op::{LayoutOp, LinalgOp};
use tilec_ir::{Dim, Graph, IrError, Op, ValueId};

fn is_conv(op: &Op) -> bool {
    matches!(op, Op::Linalg(LinalgOp::Conv { channels_last: false, .. }))
}

/// `(input, perm)` of a transpose producing `v`.
fn transpose_in(g: &Graph, v: ValueId) -> Option<(ValueId, Vec<usize>)> {
    let n = g.node(g.producer(v)?);
    match &n.op {
        Op::Layout(LayoutOp::Transpose { perm }) => Some((n.inputs[0], perm.clone())),
        _ => None,
    }
}

fn reshape_in(g: &Graph, v: ValueId) -> Option<ValueId> {
    let n = g.node(g.producer(v)?);
    matches!(n.op, Op::Layout(LayoutOp::Reshape { .. })).then(|| n.inputs[0])
}

fn dims(g: &Graph, v: ValueId) -> Option<Vec<usize>> {
    g.value(v).ty.fixed_shape()
}

fn reshape(g: &mut Graph, x: ValueId, shape: &[usize]) -> Result<ValueId, IrError> {
    let shape = shape.iter().map(|&d| Dim::Fixed(d)).collect();
    Ok(g.add_node("seq_view", Op::Layout(LayoutOp::Reshape { shape }), &[x])?[0])
}

fn transpose(g: &mut Graph, x: ValueId, perm: &[usize]) -> Result<ValueId, IrError> {
    Ok(g.add_node("seq_view", Op::Layout(LayoutOp::Transpose { perm: perm.to_vec() }), &[x])?[0])
}

/// Rewrites the sequence-to-image views into and out of channels-first convolutions (see
/// the module doc); returns how many. Leaves dead nodes behind: the caller cleans up.
pub fn normalize(g: &mut Graph) -> Result<usize, IrError> {
    let mut count = 0;
    let convs: Vec<usize> = (0..g.nodes().len()).filter(|&i| is_conv(&g.nodes()[i].op)).collect();
    for ci in convs {
        let (x_img, y) = (g.nodes()[ci].inputs[0], g.nodes()[ci].outputs[0]);
        // In: reshape([B, C, H, W]) of transpose(0, 2, 1) of [B, L, C].
        if let Some(t) = reshape_in(g, x_img) {
            if let (Some((seq, perm)), Some(img), Some(s)) = (transpose_in(g, t), dims(g, x_img), dims(g, t)) {
                if perm == [0, 2, 1] && img.len() == 4 && s.len() == 3 && s[1] == img[1] && s[2] == img[2] * img[3] {
                    let r = reshape(g, seq, &[img[0], img[2], img[3], img[1]])?;
                    let back = transpose(g, r, &[0, 3, 1, 2])?;
                    g.replace_all_uses(x_img, back)?;
                    count += 1;
                }
            }
        }
        // Out: transpose(0, 2, 1) of reshape([B, C, L]) of the convolution's [B, C, H, W]
        // (or of an activation's, read alone from it).
        let mut y = y;
        loop {
            let uses = g.uses();
            match uses[y.index()].by_node[..] {
                [(r, _)] if uses[y.index()].by_output.is_empty() && matches!(g.node(r).op, Op::Unary(_)) => y = g.node(r).outputs[0],
                _ => break,
            }
        }
        let Some(img) = dims(g, y) else { continue };
        if img.len() != 4 {
            continue;
        }
        let uses = g.uses();
        for &(r, _) in &uses[y.index()].by_node {
            let rn = g.node(r);
            if !matches!(rn.op, Op::Layout(LayoutOp::Reshape { .. })) {
                continue;
            }
            let flat = rn.outputs[0];
            if dims(g, flat) != Some(vec![img[0], img[1], img[2] * img[3]]) {
                continue;
            }
            for &(t, _) in &uses[flat.index()].by_node {
                let tn = g.node(t);
                if !matches!(&tn.op, Op::Layout(LayoutOp::Transpose { perm }) if perm[..] == [0, 2, 1]) {
                    continue;
                }
                let seq = tn.outputs[0];
                let nhwc = transpose(g, y, &[0, 2, 3, 1])?;
                let back = reshape(g, nhwc, &[img[0], img[2] * img[3], img[1]])?;
                g.replace_all_uses(seq, back)?;
                count += 1;
            }
        }
    }
    Ok(count)
}
