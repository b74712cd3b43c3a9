//! `einsum-to-matmul`: a two-input `einsum` that is a batched matrix product becomes
//! `transpose`s around a `matmul`, which the GEMM and attention families take (an `einsum`
//! lowers to a direct nest: MaxViT's attention, written as `bghqd,bghkd->bghqk` and
//! `bghqk,bghkd->bghqd`, ran at 0.1 GFLOP/s).
//!
//! Every label must be one of: a batch label (in both inputs and the output), an `M` label
//! (in the first input and the output), an `N` label (in the second input and the output) or a
//! contracted `K` label (in both inputs, not the output), with at least one `K`; no label may
//! repeat within an operand (a diagonal). The inputs are transposed to `[batch.., M.., K..]`
//! and `[batch.., K.., N..]` (batch labels in the output's order; a transpose that is the
//! identity is left out); several (or no) `M`, `N` or `K` labels are flattened into one
//! dimension by a reshape (their extents must be fixed: `ij,jkl->ikl` with a 3-D weight, as
//! Funnel's relative attention writes its projections, is a `[i, j] x [j, k*l]` product).
//! The product `[batch.., M, N]` is reshaped back and transposed to the output's order. A
//! batch dimension of extent 1 on one side broadcasts as in `matmul`. Other einsums stay as
//! they are.

use super::{finish, ir};
use crate::{OptError, Pass};
use tilec_ir::op::{LayoutOp, LinalgOp};
use tilec_ir::{Dim, Graph, Op, ValueId};

pub struct EinsumToMatmul;

/// How a two-input einsum is a matrix product: its labels by role, and the permutations of
/// the inputs to `[batch.., M.., K..]` and `[batch.., K.., N..]` and of the product's
/// `[batch.., M.., N..]` to the output.
#[derive(Debug, PartialEq)]
struct Plan {
    batch: Vec<u8>,
    m: Vec<u8>,
    n: Vec<u8>,
    k: Vec<u8>,
    pa: Vec<usize>,
    pb: Vec<usize>,
    po: Vec<usize>,
}

impl Plan {
    /// One label per role: no reshapes.
    fn simple(&self) -> bool {
        self.m.len() == 1 && self.n.len() == 1 && self.k.len() == 1
    }
}

/// The plan of a matrix-product einsum, `None` for any other.
fn plan(subs: &[Vec<u8>], out: &[u8]) -> Option<Plan> {
    let [a, b] = subs else { return None };
    let distinct = |s: &[u8]| s.iter().enumerate().all(|(i, x)| !s[..i].contains(x));
    if !distinct(a) || !distinct(b) || !distinct(out) {
        return None;
    }
    let (mut m, mut n, mut k) = (vec![], vec![], vec![]);
    for &l in a.iter().chain(b.iter()) {
        let (ia, ib, io) = (a.contains(&l), b.contains(&l), out.contains(&l));
        match (ia, ib, io) {
            (true, true, true) => {}
            (true, false, true) => m.push(l),
            (false, true, true) => n.push(l),
            (true, true, false) if !k.contains(&l) => k.push(l),
            (true, true, false) => {}
            _ => return None,
        }
    }
    if k.is_empty() || out.iter().any(|l| !a.contains(l) && !b.contains(l)) {
        return None;
    }
    // M and N in the output's order (no transpose after the product when it allows).
    let in_out = |l: &u8| out.iter().position(|x| x == l);
    m.sort_by_key(in_out);
    n.sort_by_key(in_out);
    let batch: Vec<u8> = out.iter().copied().filter(|l| !m.contains(l) && !n.contains(l)).collect();
    let pos = |s: &[u8], l: u8| s.iter().position(|&x| x == l);
    let perm = |s: &[u8], order: &[u8]| order.iter().map(|&l| pos(s, l)).collect::<Option<Vec<usize>>>();
    let cat = |parts: &[&[u8]]| parts.concat();
    let pa = perm(a, &cat(&[&batch, &m, &k]))?;
    let pb = perm(b, &cat(&[&batch, &k, &n]))?;
    let po = perm(&cat(&[&batch, &m, &n]), out)?;
    Some(Plan { batch, m, n, k, pa, pb, po })
}

fn identity(p: &[usize]) -> bool {
    p.iter().enumerate().all(|(i, &x)| i == x)
}

fn transposed(g: &mut Graph, name: &str, x: ValueId, perm: Vec<usize>) -> Result<ValueId, OptError> {
    if identity(&perm) {
        return Ok(x);
    }
    Ok(g.add_node(name, Op::Layout(LayoutOp::Transpose { perm }), &[x]).map_err(ir("einsum-to-matmul"))?[0])
}

fn reshaped(g: &mut Graph, name: &str, x: ValueId, shape: Vec<Dim>) -> Result<ValueId, OptError> {
    if g.value(x).ty.shape == shape {
        return Ok(x);
    }
    Ok(g.add_node(name, Op::Layout(LayoutOp::Reshape { shape }), &[x]).map_err(ir("einsum-to-matmul"))?[0])
}

/// `x`'s dimensions with the last `groups.len()` runs of them (of those lengths) each
/// flattened into one; `None` when a flattened extent is not fixed.
fn flatten(dims: &[Dim], keep: usize, groups: &[usize]) -> Option<Vec<Dim>> {
    let mut out = dims[..keep].to_vec();
    let mut at = keep;
    for &len in groups {
        let mut p = 1usize;
        for d in &dims[at..at + len] {
            p = p.checked_mul(d.fixed()?)?;
        }
        out.push(Dim::Fixed(p));
        at += len;
    }
    (at == dims.len()).then_some(out)
}

impl Pass for EinsumToMatmul {
    fn name(&self) -> &'static str {
        "einsum-to-matmul"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let (mut changed, mut added) = (false, false);
        for ni in 0..g.nodes().len() {
            let node = &g.nodes()[ni];
            let Op::Linalg(LinalgOp::Einsum { inputs, output }) = &node.op else { continue };
            let Some(plan) = plan(inputs, output) else { continue };
            let (name, ins, out) = (node.name.clone(), node.inputs.clone(), node.outputs[0]);
            if ins.len() != 2 || g.value(ins[0]).ty.dtype != g.value(ins[1]).ty.dtype {
                continue;
            }
            let nb = plan.batch.len();
            // Built aside first: a product whose shapes do not infer (unequal batch extents
            // neither of which is 1), or groups of labels whose extents are not fixed, leave
            // the einsum as it is.
            added = true;
            let a = transposed(g, &format!("{name}.a"), ins[0], plan.pa.clone())?;
            let b = transposed(g, &format!("{name}.b"), ins[1], plan.pb.clone())?;
            let (a, b) = if plan.simple() {
                (a, b)
            } else {
                let fa = flatten(&g.value(a).ty.shape, nb, &[plan.m.len(), plan.k.len()]);
                let fb = flatten(&g.value(b).ty.shape, nb, &[plan.k.len(), plan.n.len()]);
                let (Some(fa), Some(fb)) = (fa, fb) else { continue };
                (reshaped(g, &format!("{name}.a2"), a, fa)?, reshaped(g, &format!("{name}.b2"), b, fb)?)
            };
            let Ok(p) = g.add_node(&format!("{name}.matmul"), Op::Linalg(LinalgOp::MatMul), &[a, b]) else { continue };
            let mut y = p[0];
            if !plan.simple() {
                // [batch.., M, N] back to [batch.., M.., N..], the extents from the inputs.
                let ta = g.value(ins[0]).ty.shape.clone();
                let tb = g.value(ins[1]).ty.shape.clone();
                let mut shape = g.value(y).ty.shape[..nb].to_vec();
                shape.extend(plan.pa[nb..nb + plan.m.len()].iter().map(|&i| ta[i]));
                shape.extend(plan.pb[nb + plan.k.len()..].iter().map(|&i| tb[i]));
                y = reshaped(g, &format!("{name}.mn"), y, shape)?;
            }
            let y = transposed(g, &format!("{name}.out"), y, plan.po.clone())?;
            if g.value(y).ty != g.value(out).ty {
                continue;
            }
            g.replace_all_uses(out, y).map_err(ir("einsum-to-matmul"))?;
            changed = true;
        }
        // Nodes built for an einsum that stayed are dead: the cleanup drops them.
        finish(g, "einsum-to-matmul", added)?;
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn plans() {
        // bghqd,bghkd->bghqk: B transposed, the product in order.
        let p = plan(&[vec![0, 1, 2, 3, 4], vec![0, 1, 2, 5, 4]], &[0, 1, 2, 3, 5]).unwrap();
        assert_eq!((p.pa, p.pb, p.po), (vec![0, 1, 2, 3, 4], vec![0, 1, 2, 4, 3], vec![0, 1, 2, 3, 4]));
        // ij,jk->ki: the product transposed.
        let p = plan(&[vec![0, 1], vec![1, 2]], &[2, 0]).unwrap();
        assert!(p.simple());
        assert_eq!((p.pa, p.pb, p.po), (vec![0, 1], vec![0, 1], vec![1, 0]));
        // ij,jkl->ikl (a 3-D weight): N is the group (k, l), flattened.
        let p = plan(&[vec![0, 1], vec![1, 2, 3]], &[0, 2, 3]).unwrap();
        assert!(!p.simple());
        assert_eq!((&p.m[..], &p.n[..], &p.k[..]), (&[0u8][..], &[2u8, 3][..], &[1u8][..]));
        assert_eq!((p.pa, p.pb, p.po), (vec![0, 1], vec![0, 1, 2], vec![0, 1, 2]));
        // Two contracted labels, ijk,jkl->il: K is (j, k).
        let p = plan(&[vec![0, 1, 2], vec![1, 2, 3]], &[0, 3]).unwrap();
        assert_eq!(p.k, vec![1, 2]);
        // A trace, a diagonal, an outer product: not products.
        assert!(plan(&[vec![0, 0]], &[]).is_none());
        assert!(plan(&[vec![0, 0], vec![0, 1]], &[1]).is_none());
        assert!(plan(&[vec![0], vec![1]], &[0, 1]).is_none());
    }
}
