//! Slice assignments written as scatters, made concatenations (part of `simplify`).
//!
//! PyTorch exports `x[a:b] = y` (and, after a transpose that brings the assigned axis first,
//! `x[:, :, a:b] = y`) as `ScatterND(x, indices, y)` with constant indices `[[a], [a + 1], ...,
//! [b - 1]]`. Such a scatter overwrites one contiguous run of the first axis, which is
//! `concat(x[:a], y, x[b:])` along it: ops that compile (and fuse) where a general scatter
//! runs on the interpreter. MViT-v2's decomposed relative positions assign into the
//! attention scores this way, twice per block.

use super::ir;
use crate::OptError;
use tilec_ir::op::{IndexOp, LayoutOp, ScatterReduction, SliceBound};
use tilec_ir::{Dim, Graph, Op, ValueId};

/// The first-axis run `[start, start + len)` a `ScatterND` without reduction overwrites, when
/// its indices are constant, one coordinate each (`[..., 1]`), and consecutive.
fn contiguous_run(g: &Graph, data: ValueId, idx: ValueId) -> Option<(usize, usize)> {
    let t = g.const_value(idx)?;
    let shape = t.shape();
    if !t.dtype().is_int() || shape.last() != Some(&1) {
        return None;
    }
    let d0 = g.value(data).ty.shape.first()?.fixed()? as i64;
    let v: Vec<i64> = t.to_i64_vec().into_iter().map(|i| if i < 0 { i + d0 } else { i }).collect();
    let start = *v.first()?;
    let ok = start >= 0 && v.iter().enumerate().all(|(i, &x)| x == start + i as i64) && start + v.len() as i64 <= d0;
    ok.then_some((start as usize, v.len()))
}

/// Rewrites every such scatter; true when one was.
pub(super) fn rewrite(g: &mut Graph) -> Result<bool, OptError> {
    let mut edits = vec![];
    for n in g.nodes() {
        let Op::Index(IndexOp::ScatterND { reduction: ScatterReduction::None }) = n.op else { continue };
        let (&[data, idx, upd], &[out]) = (&n.inputs[..], &n.outputs[..]) else { continue };
        if let Some(run) = contiguous_run(g, data, idx) {
            edits.push((n.name.clone(), data, upd, out, run));
        }
    }
    let mut changed = false;
    for (name, data, upd, out, (start, len)) in edits {
        let ds = g.value(data).ty.shape.clone();
        let d0 = ds[0].fixed().unwrap_or(0);
        let slice = |g: &mut Graph, a: usize, b: usize| {
            let op = Op::Layout(LayoutOp::Slice {
                axes: vec![0],
                starts: vec![SliceBound::Index(a as i64)],
                ends: vec![SliceBound::Index(b as i64)],
                steps: vec![1],
            });
            g.add_node(&format!("{name}.keep{a}"), op, &[data]).map(|o| o[0])
        };
        // The updates as rows of the first axis ([len, *rest]).
        let mut rows = vec![Dim::Fixed(len)];
        rows.extend_from_slice(&ds[1..]);
        let mut y = upd;
        if g.value(upd).ty.shape != rows {
            let op = Op::Layout(LayoutOp::Reshape { shape: rows });
            y = g.add_node(&format!("{name}.rows"), op, &[upd]).map_err(ir("simplify"))?[0];
        }
        let mut parts = vec![];
        if start > 0 {
            parts.push(slice(g, 0, start).map_err(ir("simplify"))?);
        }
        parts.push(y);
        if start + len < d0 {
            parts.push(slice(g, start + len, d0).map_err(ir("simplify"))?);
        }
        let new = if parts.len() == 1 {
            y
        } else {
            g.add_node(&format!("{name}.concat"), Op::Layout(LayoutOp::Concat { axis: 0 }), &parts).map_err(ir("simplify"))?[0]
        };
        // Kept only when the types agree (the cleanup drops what a rejected rewrite added).
        if g.value(new).ty == g.value(out).ty {
            g.replace_all_uses(out, new).map_err(ir("simplify"))?;
            changed = true;
        }
    }
    Ok(changed)
}
