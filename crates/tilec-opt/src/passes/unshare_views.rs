//! `unshare-constant-views`: a re-indexing op (reshape, transpose, slice, expand) of
//! constants that several nodes read is copied, one copy per reader.
//!
//! The partitioner puts every node in one kernel group, so a view read by several groups is
//! computed by one of them and written to memory, and the others read the written copy: a
//! weight shared by several layers (ALBERT's one set of layer weights, tied embeddings)
//! whose `transpose` the exporter wrote once (or `cse` merged) was transposed into a buffer
//! at every run by the first layer's product. Copied per reader, each view folds into its
//! reader as index arithmetic, as an unshared one does, and nothing is materialized. Views
//! of views of constants are copied too (outermost first, over a few rounds). The pass runs
//! after the last `cse`, which would merge the copies again.

use super::{finish, ir};
use crate::{OptError, Pass};
use tilec_ir::op::LayoutOp;
use tilec_ir::{Graph, Op, ValueDef, ValueId};

pub struct UnshareConstantViews;

/// Whether `op` only re-indexes its input.
fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Layout(LayoutOp::Reshape { .. } | LayoutOp::Transpose { .. } | LayoutOp::Slice { .. } | LayoutOp::Expand { .. })
    )
}

/// Whether `v` is a constant or a view of views of constants.
fn const_like(g: &Graph, v: ValueId, depth: usize) -> bool {
    match g.value(v).def {
        ValueDef::Const(_) => true,
        ValueDef::Node { node, .. } if depth < 8 => {
            let n = &g.nodes()[node.0 as usize];
            is_view(&n.op) && n.inputs.iter().all(|&x| const_like(g, x, depth + 1))
        }
        _ => false,
    }
}

impl Pass for UnshareConstantViews {
    fn name(&self) -> &'static str {
        "unshare-constant-views"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let mut changed = false;
        for _round in 0..8 {
            let uses = g.uses();
            let mut copies = vec![];
            for (ni, n) in g.nodes().iter().enumerate() {
                if !is_view(&n.op) || n.outputs.len() != 1 || !n.inputs.iter().all(|&x| const_like(g, x, 0)) {
                    continue;
                }
                let readers = &uses[n.outputs[0].index()].by_node;
                for &(reader, input) in readers.iter().skip(1) {
                    copies.push((ni, reader, input));
                }
            }
            if copies.is_empty() {
                break;
            }
            for (ni, reader, input) in copies {
                let n = &g.nodes()[ni];
                let (name, op, inputs) = (format!("{}.copy{}", n.name, reader.0), n.op.clone(), n.inputs.clone());
                let out = g.add_node(&name, op, &inputs).map_err(ir("unshare-constant-views"))?[0];
                g.replace_use(reader, input, out).map_err(ir("unshare-constant-views"))?;
            }
            // The copies are appended: the next round's uses see them, and `finish` sorts
            // and renumbers once at the end.
            changed = true;
        }
        finish(g, "unshare-constant-views", changed)
    }
}
