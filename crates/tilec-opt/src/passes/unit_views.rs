//! Elementwise ops under a view with leading unit dims, done in the unviewed shape (part of
//! `simplify`).
//!
//! `reshape(binary(reshape(x, [1.., *S]), c), S)`, where the inner reshape only puts ones in
//! front of `x`'s shape `S` and the outer one takes them away again, is `binary(x, c')` with
//! `c'` the operand without its leading ones (broadcasting aligns shapes on the right, so
//! dropping leading ones changes no element). Swin's shifted windows add their mask this way
//! (`attn.view(B, nW, heads, N, N) + mask`, then back to `[B * nW, heads, N, N]`; at batch 1
//! the view only adds a leading 1): once the view is gone, the scores plus the bias plus the
//! mask are attention's additive terms and the recognizer sees them.

use super::ir;
use crate::OptError;
use tilec_ir::op::LayoutOp;
use tilec_ir::{Dim, Graph, Op, ValueId};

/// `x` when `v` is `reshape(x)` that only puts `k` ones in front of `x`'s shape.
fn leading_ones_of(g: &Graph, v: ValueId) -> Option<(ValueId, usize)> {
    let p = g.node(g.producer(v)?);
    let Op::Layout(LayoutOp::Reshape { .. }) = p.op else { return None };
    let x = *p.inputs.first()?;
    let (xs, vs) = (&g.value(x).ty.shape, &g.value(v).ty.shape);
    let k = vs.len().checked_sub(xs.len())?;
    (k > 0 && vs[k..] == xs[..] && vs[..k].iter().all(|d| *d == Dim::Fixed(1))).then_some((x, k))
}

/// Rewrites every such op; true when one was.
pub(super) fn rewrite(g: &mut Graph) -> Result<bool, OptError> {
    let uses = g.uses();
    let mut edits = vec![];
    for n in g.nodes() {
        let Op::Layout(LayoutOp::Reshape { .. }) = n.op else { continue };
        let (Some(&a), Some(&out)) = (n.inputs.first(), n.outputs.first()) else { continue };
        let Some(b) = g.producer(a) else { continue };
        let bn = g.node(b);
        let Op::Binary(op) = &bn.op else { continue };
        let u = &uses[a.index()];
        if bn.inputs.len() != 2 || !u.by_output.is_empty() || u.by_node.len() != 1 {
            continue;
        }
        for side in 0..2 {
            let (v, c) = (bn.inputs[side], bn.inputs[1 - side]);
            let Some((x, k)) = leading_ones_of(g, v) else { continue };
            let (cs, xs) = (&g.value(c).ty.shape, &g.value(x).ty.shape);
            // The op's result keeps the viewed shape, the outer reshape returns to x's, and
            // c's dims in front of x's rank are ones.
            let lead = cs.len().saturating_sub(xs.len());
            if g.value(a).ty.shape != g.value(v).ty.shape
                || g.value(out).ty.shape != *xs
                || lead > k
                || cs[..lead].iter().any(|d| *d != Dim::Fixed(1))
            {
                continue;
            }
            edits.push((bn.name.clone(), op.clone(), side, x, c, lead, out));
            break;
        }
    }
    let mut changed = false;
    for (name, op, side, x, c, lead, out) in edits {
        let mut c2 = c;
        if lead > 0 {
            let shape = g.value(c).ty.shape[lead..].to_vec();
            c2 = g.add_node(&format!("{name}.operand"), Op::Layout(LayoutOp::Reshape { shape }), &[c]).map_err(ir("simplify"))?[0];
        }
        let ins = if side == 0 { [x, c2] } else { [c2, x] };
        let new = g.add_node(&format!("{name}.unviewed"), Op::Binary(op), &ins).map_err(ir("simplify"))?[0];
        if g.value(new).ty == g.value(out).ty {
            g.replace_all_uses(out, new).map_err(ir("simplify"))?;
            changed = true;
        }
    }
    Ok(changed)
}
