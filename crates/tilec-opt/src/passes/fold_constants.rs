//! `fold-constants`: a node whose inputs are all constants (or that has no inputs, like
//! `fill`, `range`, `eye`) is evaluated with the reference interpreter's
//! [`tilec_ref::eval_op`] and its outputs become constants, so folded values are exactly
//! what execution would compute.
//!
//! Size rule (so that folding never bloats the model): a node is folded only when its
//! outputs have fixed shapes, no more elements than its inputs plus `slack` (1K), and
//! either at most `max_elems` (64K) elements in total, or at most `max_large` (16M) when the
//! model does not grow by them: an elementwise computation (`sin` of a position table), or a
//! node whose constant inputs die with it (their only reader; a concatenation or gather of
//! such tables, a product of one with a weight read nowhere else), so input-independent
//! position encodings fold whole, as onnxruntime folds them, instead of running every time
//! (of the products, a `matmul` of at most `max_macs` (256M) multiply-adds: the interpreter
//! evaluates it at compile time).
//! So shape arithmetic, small reshapes/transposes/casts of constants fold, but a `fill` or
//! `expand` of a large shape stays an op (it would materialize a big splat), and a big
//! weight read elsewhere too is never duplicated into a transposed or cast copy. Ops whose
//! evaluation fails (e.g. a value depending on a symbolic dimension's run-time size) are
//! left alone.

use super::{finish, ir};
use crate::{OptError, Pass};
use std::collections::HashMap;
use tilec_ir::op::LinalgOp;
use tilec_ir::{Graph, Op, Tensor};
use tilec_ref::EvalCtx;

pub struct FoldConstants {
    pub max_elems: usize,
    /// The limit for folds that do not grow the model (see the module's documentation).
    pub max_large: usize,
    /// The most multiply-adds of a product folded under `max_large`.
    pub max_macs: usize,
    pub slack: usize,
}

impl Default for FoldConstants {
    fn default() -> Self {
        FoldConstants {
            max_elems: 1 << 16,
            max_large: 1 << 24,
            max_macs: 1 << 28,
            slack: 1024,
        }
    }
}

impl FoldConstants {
    /// The folded outputs of node `ni`, when it may and can be folded; `readers[v]` counts
    /// the nodes and graph outputs that read value `v`.
    fn try_fold(&self, g: &Graph, ni: usize, readers: &[usize]) -> Option<Vec<Tensor>> {
        let n = &g.nodes()[ni];
        let mut args = Vec::with_capacity(n.inputs.len());
        for &x in &n.inputs {
            args.push(g.const_value(x)?);
        }
        let mut out_elems = 0usize;
        for &o in &n.outputs {
            out_elems = out_elems.checked_add(g.value(o).ty.numel()?)?;
        }
        let in_elems: usize = args.iter().map(|t| t.numel()).sum();
        if out_elems > in_elems.saturating_add(self.slack) {
            return None;
        }
        if out_elems > self.max_elems {
            // Constant inputs read by this node alone (once or more) die with it.
            let mut freed = 0usize;
            for (i, &x) in n.inputs.iter().enumerate() {
                let here = n.inputs.iter().filter(|&&y| y == x).count();
                if !n.inputs[..i].contains(&x) && readers.get(x.index()) == Some(&here) {
                    freed += args[i].numel();
                }
            }
            let elementwise = matches!(n.op, Op::Unary(_) | Op::Binary(_) | Op::Where);
            if out_elems > self.max_large || !(elementwise || out_elems <= freed.saturating_add(self.slack)) {
                return None;
            }
            // Products are evaluated by the interpreter at compile time: only those of at most
            // `max_macs` multiply-adds (a product of two large weights stays an op).
            if let Op::Linalg(l) = &n.op {
                let macs = match l {
                    LinalgOp::MatMul => args.first().and_then(|a| a.shape().last()).map(|&k| out_elems.saturating_mul(k)),
                    _ => None,
                };
                if macs.is_none_or(|m| m > self.max_macs) {
                    return None;
                }
            }
        }
        let bound = HashMap::new();
        let outs = tilec_ref::eval_op(
            &n.op,
            &args,
            &EvalCtx {
                graph: g,
                bound: &bound,
            },
        )
        .ok()?;
        let ok = outs.len() == n.outputs.len()
            && outs
                .iter()
                .zip(&n.outputs)
                .all(|(t, &o)| t.tensor_type() == g.value(o).ty);
        ok.then_some(outs)
    }
}

impl Pass for FoldConstants {
    fn name(&self) -> &'static str {
        "fold-constants"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let mut changed = false;
        let mut readers: Vec<usize> = g.uses().iter().map(|u| u.count()).collect();
        // In order: a folded node's users see constants right away, so chains fold in one run.
        for ni in 0..g.nodes().len() {
            let Some(outs) = self.try_fold(g, ni, &readers) else {
                continue;
            };
            // The folded node is dead: its inputs lose a reader each time it read them.
            for x in g.nodes()[ni].inputs.clone() {
                readers[x.index()] = readers[x.index()].saturating_sub(1);
            }
            let olds = g.nodes()[ni].outputs.clone();
            for (o, t) in olds.into_iter().zip(outs) {
                let name = g.value(o).name.clone();
                let c = g.add_const(&name, t);
                g.replace_all_uses(o, c).map_err(ir("fold-constants"))?;
                readers.resize(g.values().len(), 0);
                readers[c.index()] = readers[o.index()];
                readers[o.index()] = 0;
            }
            changed = true;
        }
        finish(g, "fold-constants", changed)
    }
}
