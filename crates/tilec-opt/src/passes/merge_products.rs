//! `merge-products`: matrix products of one activation by different constant weights become
//! one product by the weights concatenated along N, its result split into the former results.
//!
//! Transformer exports compute attention's q, k and v, and a gated MLP's gate and up, as
//! separate `MatMul`s of the same normalized hidden state. Merged, the activation is read once
//! and the weights stream in one kernel: at decode sizes (a few rows) a product's time is its
//! weights' bytes plus a fixed cost per kernel, which the merge pays once instead of two or
//! three times, and at prefill sizes one wide product fills the machine better than three
//! narrow ones.
//!
//! Taken: `MatMul` nodes whose first input is the same (non-constant) value and whose second
//! is a 2-D constant `[K, N_i]` of the activation's dtype, read by nothing else. When every
//! member's only reader is an `Add` of a constant bias over the last axis (`[N_i]`, or with
//! leading ones no longer than the product's rank), the biases are merged too, so the bias
//! stays in the product's epilogue. The split runs along the last axis in the members' order;
//! the concatenated constants are computed with the reference interpreter (so they are
//! exactly the ONNX `Concat`), and the members' own constants are left to dead-code
//! elimination.

use super::{finish, ir};
use crate::{OptError, Pass};
use std::collections::{BTreeMap, HashMap};
use tilec_ir::edit::Uses;
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp};
use tilec_ir::{Dim, Graph, Op, Tensor, ValueId};
use tilec_ref::EvalCtx;

pub struct MergeProducts;

impl Pass for MergeProducts {
    fn name(&self) -> &'static str {
        "merge-products"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let uses = g.uses();
        // (activation, K) -> the members' node indices, in graph order.
        let mut groups: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
        for (ni, n) in g.nodes().iter().enumerate() {
            if n.op != Op::Linalg(LinalgOp::MatMul) || n.inputs.len() != 2 {
                continue;
            }
            let (x, w) = (n.inputs[0], n.inputs[1]);
            let Some(t) = g.const_value(w) else { continue };
            let xt = &g.value(x).ty;
            let merge_able = t.shape().len() == 2
                && xt.dtype == t.dtype()
                && xt.shape.len() >= 2
                && g.const_value(x).is_none()
                && uses[w.index()].count() == 1;
            if merge_able {
                groups.entry((x.index(), t.shape()[0])).or_default().push(ni);
            }
        }
        let mut changed = false;
        for members in groups.into_values() {
            if members.len() >= 2 {
                changed |= merge(g, &uses, &members)?;
            }
        }
        finish(g, "merge-products", changed)
    }
}

/// A member's bias: the `Add` node reading the product and the bias flattened to `[N_i]`.
fn bias_of(g: &Graph, uses: &[Uses], product: ValueId, n: usize) -> Option<(ValueId, Tensor)> {
    let u = &uses[product.index()];
    if u.by_node.len() != 1 || !u.by_output.is_empty() {
        return None;
    }
    let (add, pos) = u.by_node[0];
    let node = g.node(add);
    if node.op != Op::Binary(BinaryOp::Add) || node.inputs.len() != 2 {
        return None;
    }
    let b = g.const_value(node.inputs[1 - pos])?;
    let rank = g.value(product).ty.shape.len();
    let (last, lead) = b.shape().split_last()?;
    let fits = *last == n && lead.iter().all(|&d| d == 1) && b.rank() <= rank && b.dtype() == g.value(product).ty.dtype;
    fits.then(|| Some((node.outputs[0], b.clone().reshaped(vec![n]).ok()?)))?
}

fn concat(g: &Graph, parts: &[&Tensor], axis: usize) -> Option<Tensor> {
    let bound = HashMap::new();
    let op = Op::Layout(LayoutOp::Concat { axis });
    tilec_ref::eval_op(&op, parts, &EvalCtx { graph: g, bound: &bound }).ok()?.into_iter().next()
}

/// Merges one group; false when its constants could not be concatenated.
fn merge(g: &mut Graph, uses: &[Uses], members: &[usize]) -> Result<bool, OptError> {
    let err = ir("merge-products");
    let x = g.nodes()[members[0]].inputs[0];
    let weights: Vec<&Tensor> = members.iter().filter_map(|&m| g.const_value(g.nodes()[m].inputs[1])).collect();
    let widths: Vec<usize> = weights.iter().map(|t| t.shape()[1]).collect();
    let products: Vec<ValueId> = members.iter().map(|&m| g.nodes()[m].outputs[0]).collect();
    let biases: Option<Vec<(ValueId, Tensor)>> = products.iter().zip(&widths).map(|(&p, &n)| bias_of(g, uses, p, n)).collect();
    let Some(w) = concat(g, &weights, 1) else { return Ok(false) };
    let (outs, bias) = match biases {
        Some(b) => {
            let (outs, parts): (Vec<ValueId>, Vec<Tensor>) = b.into_iter().unzip();
            match concat(g, &parts.iter().collect::<Vec<_>>(), 0) {
                Some(t) => (outs, Some(t)),
                None => (products, None),
            }
        }
        None => (products, None),
    };
    let name = g.nodes()[members[0]].name.clone();
    let wc = g.add_const(&format!("{name}.merged_weight"), w);
    let mut y = g.add_node(&format!("{name}.merged"), Op::Linalg(LinalgOp::MatMul), &[x, wc]).map_err(&err)?[0];
    if let Some(b) = bias {
        let bc = g.add_const(&format!("{name}.merged_bias"), b);
        y = g.add_node(&format!("{name}.merged_bias_add"), Op::Binary(BinaryOp::Add), &[y, bc]).map_err(&err)?[0];
    }
    // One split along the last axis, as exporters write a fused projection's pieces (the
    // attention families read such pieces in place).
    let axis = g.value(y).ty.shape.len() - 1;
    let split = Op::Layout(LayoutOp::Split { axis, sizes: widths.iter().map(|&n| Dim::Fixed(n)).collect() });
    let parts = g.add_node(&format!("{name}.split"), split, &[y]).map_err(&err)?;
    for (&o, &s) in outs.iter().zip(&parts) {
        g.replace_all_uses(o, s).map_err(&err)?;
    }
    Ok(true)
}
