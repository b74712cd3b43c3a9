//! `einsum-to-matmul`: a two-input `einsum` that is a batched matrix product becomes
//! `transpose`s around a `matmul`, which the GEMM and attention families take (an `einsum`
//! lowers to a direct nest: MaxViT's attention, written as `bghqd,bghkd->bghqk` and
//! `bghqk,bghkd->bghqd`, ran at 0.1 GFLOP/s).
//!
//! Every label must be one of: a batch label (in both inputs and the output), the one `M`
//! label (in the first input and the output), the one `N` label (in the second input and the
//! output) and the one contracted `K` label (in both inputs, not the output); no label may
//! repeat within an operand (a diagonal). The inputs are transposed to `[batch.., M, K]` and
//! `[batch.., K, N]` (batch labels in the output's order; a transpose that is the identity is
//! left out), multiplied, and the product `[batch.., M, N]` transposed to the output's
//! order. A batch dimension of extent 1 on one side broadcasts as in `matmul`. Other einsums
//! stay as they are.

use super::{finish, ir};
use crate::{OptError, Pass};
use tilec_ir::op::{LayoutOp, LinalgOp};
use tilec_ir::{Graph, Op, ValueId};

pub struct EinsumToMatmul;

/// The permutations (first input, second input, product to output) of a matrix-product
/// einsum, `None` for any other.
fn plan(subs: &[Vec<u8>], out: &[u8]) -> Option<(Vec<usize>, Vec<usize>, Vec<usize>)> {
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
            (true, true, false) => k.push(l),
            _ => return None,
        }
    }
    k.dedup();
    let (m, n, k) = match (&m[..], &n[..], &k[..]) {
        ([m], [n], [k]) => (*m, *n, *k),
        _ => return None,
    };
    if out.iter().any(|l| !a.contains(l) && !b.contains(l)) {
        return None;
    }
    let batch: Vec<u8> = out.iter().copied().filter(|&l| l != m && l != n).collect();
    let pos = |s: &[u8], l: u8| s.iter().position(|&x| x == l);
    let perm = |s: &[u8], order: &[u8]| order.iter().map(|&l| pos(s, l)).collect::<Option<Vec<usize>>>();
    let order_a: Vec<u8> = batch.iter().copied().chain([m, k]).collect();
    let order_b: Vec<u8> = batch.iter().copied().chain([k, n]).collect();
    let prod: Vec<u8> = batch.iter().copied().chain([m, n]).collect();
    Some((perm(a, &order_a)?, perm(b, &order_b)?, perm(&prod, out)?))
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

impl Pass for EinsumToMatmul {
    fn name(&self) -> &'static str {
        "einsum-to-matmul"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let (mut changed, mut added) = (false, false);
        for ni in 0..g.nodes().len() {
            let node = &g.nodes()[ni];
            let Op::Linalg(LinalgOp::Einsum { inputs, output }) = &node.op else { continue };
            let Some((pa, pb, po)) = plan(inputs, output) else { continue };
            let (name, ins, out) = (node.name.clone(), node.inputs.clone(), node.outputs[0]);
            if ins.len() != 2 || g.value(ins[0]).ty.dtype != g.value(ins[1]).ty.dtype {
                continue;
            }
            // Built aside first: a product whose shapes do not infer (unequal batch extents
            // neither of which is 1) leaves the einsum as it is.
            added = true;
            let a = transposed(g, &format!("{name}.a"), ins[0], pa)?;
            let b = transposed(g, &format!("{name}.b"), ins[1], pb)?;
            let Ok(p) = g.add_node(&format!("{name}.matmul"), Op::Linalg(LinalgOp::MatMul), &[a, b]) else { continue };
            let y = transposed(g, &format!("{name}.out"), p[0], po)?;
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
        let (a, b, o) = plan(&[vec![0, 1, 2, 3, 4], vec![0, 1, 2, 5, 4]], &[0, 1, 2, 3, 5]).unwrap();
        assert_eq!((a, b, o), (vec![0, 1, 2, 3, 4], vec![0, 1, 2, 4, 3], vec![0, 1, 2, 3, 4]));
        // ij,jk->ki: the product transposed.
        let (a, b, o) = plan(&[vec![0, 1], vec![1, 2]], &[2, 0]).unwrap();
        assert_eq!((a, b, o), (vec![0, 1], vec![0, 1], vec![1, 0]));
        // A trace, a diagonal, an outer product, two contracted labels: not products.
        assert!(plan(&[vec![0, 0]], &[]).is_none());
        assert!(plan(&[vec![0, 0], vec![0, 1]], &[1]).is_none());
        assert!(plan(&[vec![0], vec![1]], &[0, 1]).is_none());
        assert!(plan(&[vec![0, 1, 2], vec![1, 2, 3]], &[0, 3]).is_none());
    }
}
