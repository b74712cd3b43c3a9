//! `sink-transposes`: moves `transpose` ops towards the graph outputs, through ops that
//! commute with a permutation of the axes, so that transposes meet (and cancel against,
//! or merge with) each other, shrink (after a reduction) or merge (several transposed
//! concat inputs become one transposed concat).
//!
//! For a node `U` some of whose inputs are `transpose(x, p)`, `U(transpose(x, p), ..)` is
//! rewritten to `transpose(U'(x, ..), q)` where:
//!
//! | `U`                                    | `U'`                          | `q`             |
//! |----------------------------------------|-------------------------------|-----------------|
//! | unary, cast, binary, where             | same op; constant operands permuted by `p⁻¹` (after padding their rank), rank-0 operands kept, other operands must be transposed by the same `p` | `p` |
//! | concat(axis)                           | concat(`p[axis]`), same operand rules | `p` |
//! | softmax / log_softmax / hardmax / lp_norm / cumsum-scan (axis) | axis `p[axis]` | `p` |
//! | reduce(axes, keepdims), argmax/argmin  | axes `{p[a]}`                 | `p` with keepdims, else `p` restricted to the kept axes (no transpose at all when that is the identity) |
//!
//! Count rule: a rewrite removes every transposed operand all of whose uses are `U` and adds
//! at most one transpose, and it is done only when it removes at least as many as it adds,
//! so the number of transposes never grows. `transpose(transpose(x))` composes into one
//! (or none). A transpose whose input comes from a `reshape` (the "split heads" pattern
//! `reshape → transpose`) is left where it is: later stages fold that pair into index
//! math, and a transpose feeding a reshape ("merge heads") is never sunk into the reshape.
//!
//! Every rewrite is checked to give exactly the old output type; one that does not (e.g.
//! symbolic broadcasting deriving different symbols) is dropped.

use super::super::{finish, ir};
use crate::{OptError, Pass};
use std::collections::{HashMap, HashSet};
use tilec_ir::op::{LayoutOp, NormOp, ReduceOp};
use tilec_ir::{Graph, Op, Tensor, Uses, ValueId};

pub struct SinkTransposes;

/// Upper bound on sinking rounds (each moves transposes down by at least one node).
const MAX_ROUNDS: usize = 10_000;
/// Constants larger than this are not copied into a permuted version.
const MAX_CONST_ELEMS: usize = 1 << 20;

/// `(perm, input)` when `v` is the output of a transpose.
pub fn transpose_of(g: &Graph, v: ValueId) -> Option<(Vec<usize>, ValueId)> {
    let n = g.node(g.producer(v)?);
    match &n.op {
        Op::Layout(LayoutOp::Transpose { perm }) => Some((perm.clone(), *n.inputs.first()?)),
        _ => None,
    }
}

/// The number of transpose nodes in `g`.
pub fn count_transposes(g: &Graph) -> usize {
    g.nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Layout(LayoutOp::Transpose { .. })))
        .count()
}

pub fn inverse(p: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; p.len()];
    for (i, &pi) in p.iter().enumerate() {
        inv[pi] = i;
    }
    inv
}

fn is_identity(p: &[usize]) -> bool {
    p.iter().enumerate().all(|(i, &pi)| i == pi)
}

/// How `U` maps onto its untransposed inputs.
enum Kind {
    /// Elementwise (any operand may be transposed, constant or rank 0).
    Elementwise,
    /// Concat: every operand transposed or constant.
    Concat,
    /// One transposed operand; the op with its axis remapped.
    Axis,
    /// Reduction over axes.
    Reduce { axes: Vec<usize>, keepdims: bool },
}

fn kind(op: &Op) -> Option<Kind> {
    Some(match op {
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } => Kind::Elementwise,
        Op::Layout(LayoutOp::Concat { .. }) => Kind::Concat,
        Op::Norm(NormOp::Softmax { .. } | NormOp::LogSoftmax { .. } | NormOp::Hardmax { .. })
        | Op::Norm(NormOp::LpNorm { .. })
        | Op::Reduce(ReduceOp::Scan { .. }) => Kind::Axis,
        Op::Reduce(ReduceOp::Reduce { axes, keepdims, .. }) => Kind::Reduce {
            axes: axes.clone(),
            keepdims: *keepdims,
        },
        Op::Reduce(ReduceOp::ArgMax { axis, keepdims, .. })
        | Op::Reduce(ReduceOp::ArgMin { axis, keepdims, .. }) => Kind::Reduce {
            axes: vec![*axis],
            keepdims: *keepdims,
        },
        _ => return None,
    })
}

/// `op` with its axes mapped through `p` (an axis `a` of the transposed tensor is axis
/// `p[a]` of the untransposed one).
fn remap_op(op: &Op, p: &[usize]) -> Option<Op> {
    let m = |a: usize| p.get(a).copied();
    Some(match op {
        Op::Layout(LayoutOp::Concat { axis }) => Op::Layout(LayoutOp::Concat { axis: m(*axis)? }),
        Op::Norm(NormOp::Softmax { axis }) => Op::Norm(NormOp::Softmax { axis: m(*axis)? }),
        Op::Norm(NormOp::LogSoftmax { axis }) => Op::Norm(NormOp::LogSoftmax { axis: m(*axis)? }),
        Op::Norm(NormOp::Hardmax { axis }) => Op::Norm(NormOp::Hardmax { axis: m(*axis)? }),
        Op::Norm(NormOp::LpNorm { axis, p: pn }) => Op::Norm(NormOp::LpNorm {
            axis: m(*axis)?,
            p: *pn,
        }),
        Op::Reduce(ReduceOp::Scan {
            kind,
            axis,
            exclusive,
            reverse,
        }) => Op::Reduce(ReduceOp::Scan {
            kind: *kind,
            axis: m(*axis)?,
            exclusive: *exclusive,
            reverse: *reverse,
        }),
        Op::Reduce(ReduceOp::Reduce {
            kind,
            axes,
            keepdims,
        }) => {
            let mut a: Vec<usize> = axes.iter().map(|&x| m(x)).collect::<Option<_>>()?;
            a.sort_unstable();
            Op::Reduce(ReduceOp::Reduce {
                kind: *kind,
                axes: a,
                keepdims: *keepdims,
            })
        }
        Op::Reduce(ReduceOp::ArgMax {
            axis,
            keepdims,
            select_last_index,
        }) => Op::Reduce(ReduceOp::ArgMax {
            axis: m(*axis)?,
            keepdims: *keepdims,
            select_last_index: *select_last_index,
        }),
        Op::Reduce(ReduceOp::ArgMin {
            axis,
            keepdims,
            select_last_index,
        }) => Op::Reduce(ReduceOp::ArgMin {
            axis: m(*axis)?,
            keepdims: *keepdims,
            select_last_index: *select_last_index,
        }),
        other => other.clone(),
    })
}

/// The permutation to apply after reducing the untransposed tensor over `{p[a]}`.
pub fn reduced_perm(p: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    if keepdims {
        return p.to_vec();
    }
    let n = p.len();
    let mapped: HashSet<usize> = axes.iter().filter_map(|&a| p.get(a).copied()).collect();
    let kept_x: Vec<usize> = (0..n).filter(|j| !mapped.contains(j)).collect();
    (0..n)
        .filter(|i| !axes.contains(i))
        .filter_map(|i| kept_x.iter().position(|&j| j == p[i]))
        .collect()
}

/// `t` (rank ≤ `p.len()`) padded with leading 1s to rank `p.len()` and permuted by `p⁻¹`.
fn permute_const(g: &Graph, t: &Tensor, p: &[usize]) -> Option<Tensor> {
    let r = p.len();
    if t.rank() > r || t.numel() > MAX_CONST_ELEMS {
        return None;
    }
    let mut shape = vec![1usize; r - t.rank()];
    shape.extend_from_slice(t.shape());
    let padded = t.clone().reshaped(shape).ok()?;
    let bound = HashMap::new();
    let cx = tilec_ref::EvalCtx {
        graph: g,
        bound: &bound,
    };
    let op = Op::Layout(LayoutOp::Transpose { perm: inverse(p) });
    tilec_ref::eval_op(&op, &[&padded], &cx)
        .ok()?
        .into_iter()
        .next()
}

/// True when every use of `v` is by node `ni` (and `v` is not a graph output).
fn only_used_by(uses: &[Uses], v: ValueId, ni: usize) -> bool {
    let u = &uses[v.index()];
    u.by_output.is_empty() && u.by_node.iter().all(|(n, _)| n.index() == ni)
}

enum Operand {
    Transposed { t: ValueId, src: ValueId },
    Const(Tensor),
    Keep(ValueId),
}

/// Tries to sink the transposed operands of node `ni`; returns the transposes it made dead.
fn try_sink(g: &mut Graph, ni: usize, uses: &[Uses]) -> Result<Option<Vec<ValueId>>, OptError> {
    let n = &g.nodes()[ni];
    if n.outputs.len() != 1 || uses[n.outputs[0].index()].is_empty() {
        return Ok(None);
    }
    let Some(k) = kind(&n.op) else {
        return Ok(None);
    };
    let out = n.outputs[0];
    let out_rank = g.value(out).ty.rank();
    let name = n.name.clone();
    let op = n.op.clone();
    let inputs = n.inputs.clone();
    // Classify operands; all transposed operands must share one permutation.
    let mut perm: Option<Vec<usize>> = None;
    let mut ops = Vec::with_capacity(inputs.len());
    for &x in &inputs {
        if let Some((p, src)) = transpose_of(g, x) {
            let from_reshape = g
                .producer(src)
                .is_some_and(|s| matches!(g.node(s).op, Op::Layout(LayoutOp::Reshape { .. })));
            if from_reshape || perm.as_ref().is_some_and(|q| *q != p) {
                return Ok(None);
            }
            perm = Some(p);
            ops.push(Operand::Transposed { t: x, src });
        } else if let Some(c) = g.const_value(x) {
            ops.push(Operand::Const(c.clone()));
        } else if g.value(x).ty.rank() == 0 && matches!(k, Kind::Elementwise) {
            ops.push(Operand::Keep(x));
        } else {
            return Ok(None);
        }
    }
    let Some(p) = perm else { return Ok(None) };
    let single = matches!(k, Kind::Axis | Kind::Reduce { .. });
    if single && inputs.len() != 1 {
        return Ok(None);
    }
    if matches!(k, Kind::Elementwise | Kind::Concat) && p.len() != out_rank {
        return Ok(None);
    }
    let q = match &k {
        Kind::Reduce { axes, keepdims } => reduced_perm(&p, axes, *keepdims),
        _ => p.clone(),
    };
    let added = usize::from(!is_identity(&q));
    let mut removed: Vec<ValueId> = Vec::new();
    for o in &ops {
        if let Operand::Transposed { t, .. } = o {
            if !removed.contains(t) && only_used_by(uses, *t, ni) {
                removed.push(*t);
            }
        }
    }
    if removed.len() < added {
        return Ok(None);
    }
    // Build U' on the untransposed operands.
    let mut new_inputs = Vec::with_capacity(ops.len());
    for o in ops {
        new_inputs.push(match o {
            Operand::Transposed { src, .. } => src,
            Operand::Keep(v) => v,
            Operand::Const(c) => {
                let Some(pc) = permute_const(g, &c, &p) else {
                    return Ok(None);
                };
                g.add_const(&format!("{name}.permuted"), pc)
            }
        });
    }
    let Some(new_op) = remap_op(&op, &p) else {
        return Ok(None);
    };
    let Ok(o) = g.add_node(&format!("{name}.sunk"), new_op, &new_inputs) else {
        return Ok(None);
    };
    let mut v = o[0];
    if added == 1 {
        let Ok(o) = g.add_node(
            &format!("{name}.transpose"),
            Op::Layout(LayoutOp::Transpose { perm: q }),
            &[v],
        ) else {
            return Ok(None);
        };
        v = o[0];
    }
    if g.value(v).ty != g.value(out).ty {
        return Ok(None); // the appended nodes are dead; cleanup drops them
    }
    g.replace_all_uses(out, v).map_err(ir("sink-transposes"))?;
    Ok(Some(inputs))
}

/// `transpose(transpose(x, p1), p2)` → `transpose(x, p1∘p2)` or `x`.
fn try_compose(g: &mut Graph, ni: usize) -> Result<bool, OptError> {
    let n = &g.nodes()[ni];
    let Op::Layout(LayoutOp::Transpose { perm }) = &n.op else {
        return Ok(false);
    };
    let (Some(&x), Some(&out)) = (n.inputs.first(), n.outputs.first()) else {
        return Ok(false);
    };
    let Some((inner, y)) = transpose_of(g, x) else {
        return Ok(false);
    };
    let q: Vec<usize> = perm.iter().map(|&i| inner[i]).collect();
    let name = n.name.clone();
    let v = if is_identity(&q) {
        y
    } else {
        match g.add_node(
            &format!("{name}.composed"),
            Op::Layout(LayoutOp::Transpose { perm: q }),
            &[y],
        ) {
            Ok(o) => o[0],
            Err(_) => return Ok(false),
        }
    };
    if g.value(v).ty != g.value(out).ty {
        return Ok(false);
    }
    g.replace_all_uses(out, v).map_err(ir("sink-transposes"))?;
    Ok(true)
}

/// One sweep over the nodes present at its start. A node whose inputs were touched by an
/// earlier rewrite of the same sweep waits for the next one (its use lists are stale).
fn sweep(g: &mut Graph) -> Result<bool, OptError> {
    let uses = g.uses();
    let nv = g.values().len();
    let nn = g.nodes().len();
    let mut touched: HashSet<ValueId> = HashSet::new();
    let mut changed = false;
    for ni in 0..nn {
        let n = &g.nodes()[ni];
        if n.inputs
            .iter()
            .any(|x| x.index() >= nv || touched.contains(x))
        {
            continue;
        }
        let ins = n.inputs.clone();
        if try_compose(g, ni)? {
            touched.extend(ins);
            changed = true;
        } else if let Some(ins) = try_sink(g, ni, &uses)? {
            touched.extend(ins);
            changed = true;
        }
    }
    Ok(changed)
}

impl Pass for SinkTransposes {
    fn name(&self) -> &'static str {
        "sink-transposes"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let mut changed = false;
        for _ in 0..MAX_ROUNDS {
            let c = sweep(g)?;
            // Drops the replaced nodes and any rejected rewrite's dead nodes.
            g.cleanup().map_err(ir("sink-transposes"))?;
            if !c {
                break;
            }
            changed = true;
        }
        finish(g, "sink-transposes", changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduced_perm_matches_a_naive_shape_walk() {
        // Transposed tensor axes i come from x axes p[i]; reducing axes A of the transposed
        // tensor without keepdims leaves the x axes p[i] (i ∉ A) in the order of i.
        let p = [2, 0, 3, 1];
        for axes in [vec![0], vec![1, 2], vec![3], vec![0, 3], vec![]] {
            let q = reduced_perm(&p, &axes, false);
            let mapped: Vec<usize> = axes.iter().map(|&a| p[a]).collect();
            let kept_x: Vec<usize> = (0..4).filter(|j| !mapped.contains(j)).collect();
            let want: Vec<usize> = (0..4).filter(|i| !axes.contains(i)).map(|i| p[i]).collect();
            let got: Vec<usize> = q.iter().map(|&k| kept_x[k]).collect();
            assert_eq!(got, want, "axes {axes:?}");
        }
        assert_eq!(reduced_perm(&p, &[1], true), p.to_vec());
    }

    #[test]
    fn inverse_composes_to_identity() {
        let p = [3, 1, 0, 2];
        let inv = inverse(&p);
        let q: Vec<usize> = inv.iter().map(|&i| p[i]).collect();
        assert!(is_identity(&q));
    }
}
