//! `cse`: common-subexpression elimination.
//!
//! Two nodes with equal ops (`PartialEq` on [`tilec_ir::Op`], attributes included; a NaN
//! attribute compares unequal, which only means the nodes are not merged), the same inputs
//! and the same output types compute the same values (every op is a pure function of its
//! inputs and attributes), so the later one is replaced by the earlier. Identical small
//! constants (same dtype, shape and bytes, at most `max_const_elems` elements) are merged
//! first, so nodes reading equal copies of a constant become identical too. Large
//! constants (weights) are not compared: hashing them costs more than duplicates are
//! likely to save.

use super::{finish, ir};
use crate::{OptError, Pass};
use std::collections::HashMap;
use tilec_ir::{DType, Graph, ValueDef, ValueId};

pub struct Cse {
    pub max_const_elems: usize,
}

impl Default for Cse {
    fn default() -> Self {
        Cse {
            max_const_elems: 4096,
        }
    }
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let mut repl: Vec<ValueId> = g.value_ids().collect();
        // Constants, keyed by their exact contents.
        let mut consts: HashMap<(DType, Vec<usize>, Vec<u8>), ValueId> = HashMap::new();
        for v in g.value_ids() {
            if let ValueDef::Const(t) = &g.value(v).def {
                if t.numel() <= self.max_const_elems {
                    let key = (t.dtype(), t.shape().to_vec(), t.to_le_bytes());
                    repl[v.index()] = *consts.entry(key).or_insert(v);
                }
            }
        }
        // Nodes, in topological order so that inputs are already canonical.
        let mut seen: HashMap<(&'static str, Vec<ValueId>), Vec<usize>> = HashMap::new();
        for (ni, n) in g.nodes().iter().enumerate() {
            let ins: Vec<ValueId> = n.inputs.iter().map(|x| repl[x.index()]).collect();
            let cands = seen.entry((n.op.name(), ins)).or_default();
            let same = cands.iter().copied().find(|&c| {
                let m = &g.nodes()[c];
                m.op == n.op
                    && m.outputs.len() == n.outputs.len()
                    && m.outputs
                        .iter()
                        .zip(&n.outputs)
                        .all(|(a, b)| g.value(*a).ty == g.value(*b).ty)
            });
            match same {
                Some(c) => {
                    for (k, &o) in n.outputs.iter().enumerate() {
                        repl[o.index()] = g.nodes()[c].outputs[k];
                    }
                }
                None => cands.push(ni),
            }
        }
        let mut changed = false;
        for v in g.value_ids().collect::<Vec<_>>() {
            let r = repl[v.index()];
            if r != v {
                g.replace_all_uses(v, r).map_err(ir("cse"))?;
                changed = true;
            }
        }
        finish(g, "cse", changed)
    }
}
