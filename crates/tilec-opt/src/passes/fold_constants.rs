//! `fold-constants`: a node whose inputs are all constants (or that has no inputs, like
//! `fill`, `range`, `eye`) is evaluated with the reference interpreter's
//! [`tilec_ref::eval_op`] and its outputs become constants, so folded values are exactly
//! what execution would compute.
//!
//! Size rule (so that folding never bloats the model): a node is folded only when its
//! outputs have fixed shapes, at most `max_elems` (64K) elements in total, and no more
//! than the elements of its inputs plus `slack` (1K). So shape arithmetic, small
//! reshapes/transposes/casts of constants fold, but a `fill` or `expand` of a large shape
//! stays an op (it would materialize a big splat), and a big weight is never duplicated
//! into a transformed copy larger than what it replaces. Ops whose evaluation fails (e.g.
//! a value depending on a symbolic dimension's run-time size) are left alone.

use super::{finish, ir};
use crate::{OptError, Pass};
use std::collections::HashMap;
use tilec_ir::{Graph, Tensor};
use tilec_ref::EvalCtx;

pub struct FoldConstants {
    pub max_elems: usize,
    pub slack: usize,
}

impl Default for FoldConstants {
    fn default() -> Self {
        FoldConstants {
            max_elems: 1 << 16,
            slack: 1024,
        }
    }
}

impl FoldConstants {
    /// The folded outputs of node `ni`, when it may and can be folded.
    fn try_fold(&self, g: &Graph, ni: usize) -> Option<Vec<Tensor>> {
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
        if out_elems > self.max_elems || out_elems > in_elems.saturating_add(self.slack) {
            return None;
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
        // In order: a folded node's users see constants right away, so chains fold in one run.
        for ni in 0..g.nodes().len() {
            let Some(outs) = self.try_fold(g, ni) else {
                continue;
            };
            let olds = g.nodes()[ni].outputs.clone();
            for (o, t) in olds.into_iter().zip(outs) {
                let name = g.value(o).name.clone();
                let c = g.add_const(&name, t);
                g.replace_all_uses(o, c).map_err(ir("fold-constants"))?;
            }
            changed = true;
        }
        finish(g, "fold-constants", changed)
    }
}
