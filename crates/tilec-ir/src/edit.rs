//! The one editing API for graphs. Passes never poke at the arenas directly: they add
//! nodes (appended, so temporarily out of order), redirect uses with
//! [`Graph::replace_all_uses`], and finish with [`Graph::cleanup`], which restores
//! topological order, drops what became dead and renumbers ids densely. Between edits the
//! graph may be unsorted; after `cleanup` every invariant of [`crate::verify`] holds again.

use crate::graph::{Graph, IrError, NodeId, ValueDef, ValueId};
use std::collections::HashSet;

/// Who reads a value: `(node, input position)` pairs, plus graph-output positions.
#[derive(Clone, Debug, Default)]
pub struct Uses {
    pub by_node: Vec<(NodeId, usize)>,
    pub by_output: Vec<usize>,
}

impl Uses {
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty() && self.by_output.is_empty()
    }
    pub fn count(&self) -> usize {
        self.by_node.len() + self.by_output.len()
    }
}

impl Graph {
    /// The uses of every value, indexed by `ValueId`.
    pub fn uses(&self) -> Vec<Uses> {
        let mut u = vec![Uses::default(); self.values().len()];
        for (ni, n) in self.nodes().iter().enumerate() {
            for (k, &x) in n.inputs.iter().enumerate() {
                u[x.index()].by_node.push((NodeId(ni as u32), k));
            }
        }
        for (k, &o) in self.outputs().iter().enumerate() {
            u[o.index()].by_output.push(k);
        }
        u
    }

    /// The node defining `v`, if a node does.
    pub fn producer(&self, v: ValueId) -> Option<NodeId> {
        match self.value(v).def {
            ValueDef::Node { node, .. } => Some(node),
            _ => None,
        }
    }

    /// Makes every reader of `old` (nodes and graph outputs) read `new` instead. The two
    /// values must have the same type, so no reader's inference changes.
    pub fn replace_all_uses(&mut self, old: ValueId, new: ValueId) -> Result<(), IrError> {
        if old == new {
            return Ok(());
        }
        if self.value(old).ty != self.value(new).ty {
            return Err(IrError::Graph(format!(
                "cannot replace '{}' ({:?}) by '{}' ({:?}): types differ",
                self.value(old).name,
                self.value(old).ty,
                self.value(new).name,
                self.value(new).ty
            )));
        }
        for n in self.nodes_mut_unchecked().iter_mut() {
            for x in n.inputs.iter_mut() {
                if *x == old {
                    *x = new;
                }
            }
        }
        let outs: Vec<ValueId> = self.outputs().iter().map(|&o| if o == old { new } else { o }).collect();
        self.set_outputs(outs);
        Ok(())
    }

    /// Makes input `input` of `node` read `new` instead (one use; [`Graph::replace_all_uses`]
    /// redirects them all). The old and new values must have the same type.
    pub fn replace_use(&mut self, node: NodeId, input: usize, new: ValueId) -> Result<(), IrError> {
        let ni = node.0 as usize;
        let old = match self.nodes().get(ni).and_then(|n| n.inputs.get(input)) {
            Some(&v) => v,
            None => return Err(IrError::Graph(format!("node {ni} has no input {input}"))),
        };
        if new.index() >= self.values().len() {
            return Err(IrError::Graph(format!("node {ni}: value {new:?} does not exist")));
        }
        if self.value(old).ty != self.value(new).ty {
            return Err(IrError::Graph(format!(
                "cannot make node {ni} read '{}' in place of '{}': types differ",
                self.value(new).name,
                self.value(old).name
            )));
        }
        self.nodes_mut_unchecked()[ni].inputs[input] = new;
        Ok(())
    }

    /// Drops graph inputs from the signature (a rewrite that replaces them, such as a decoder's
    /// past keys by a paged cache). Each must be an input nobody reads any more: call after
    /// the uses are redirected and dead nodes are cleaned up.
    pub fn remove_inputs(&mut self, drop: &[ValueId]) -> Result<(), IrError> {
        let uses = self.uses();
        for &v in drop {
            if !self.inputs.contains(&v) {
                return Err(IrError::Graph(format!("'{}' is not a graph input", self.value(v).name)));
            }
            if !uses[v.index()].is_empty() {
                return Err(IrError::Graph(format!("input '{}' is still read", self.value(v).name)));
            }
        }
        self.inputs.retain(|v| !drop.contains(v));
        self.cleanup().map(|_| ())
    }

    /// Restores the graph's invariants after edits: sorts nodes topologically (stable:
    /// nodes keep their relative order where dependencies allow), removes nodes none of
    /// whose outputs is used (transitively) and constants nobody reads, and renumbers
    /// values and nodes densely. Returns how many nodes were removed. Errors on a cycle.
    pub fn cleanup(&mut self) -> Result<usize, IrError> {
        self.toposort()?;
        // Liveness: graph outputs, then backwards through node inputs.
        let nn = self.nodes().len();
        let mut live_val = vec![false; self.values().len()];
        for &o in self.outputs() {
            live_val[o.index()] = true;
        }
        let mut live_node = vec![false; nn];
        for ni in (0..nn).rev() {
            let n = &self.nodes()[ni];
            if n.outputs.iter().any(|o| live_val[o.index()]) {
                live_node[ni] = true;
                for &x in &n.inputs {
                    live_val[x.index()] = true;
                }
            }
        }
        let removed = live_node.iter().filter(|l| !**l).count();
        for &i in self.inputs() {
            live_val[i.index()] = true; // inputs stay, used or not: they are the signature
        }
        // Values to keep: live values, plus every output of a live node (positions matter).
        let mut keep = live_val.clone();
        for (ni, n) in self.nodes().iter().enumerate() {
            if live_node[ni] {
                for &o in &n.outputs {
                    keep[o.index()] = true;
                }
            }
        }
        self.renumber(&keep, &live_node);
        Ok(removed)
    }

    /// Stable topological sort of the nodes (Kahn's algorithm, lowest original index
    /// first). Errors when the nodes form a cycle.
    pub fn toposort(&mut self) -> Result<(), IrError> {
        let nn = self.nodes().len();
        let mut producer = vec![usize::MAX; self.values().len()];
        for (ni, n) in self.nodes().iter().enumerate() {
            for &o in &n.outputs {
                producer[o.index()] = ni;
            }
        }
        let mut indeg = vec![0usize; nn];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); nn];
        for (ni, n) in self.nodes().iter().enumerate() {
            let mut seen = HashSet::new();
            for &x in &n.inputs {
                let p = producer[x.index()];
                if p != usize::MAX && seen.insert(p) {
                    indeg[ni] += 1;
                    users[p].push(ni);
                }
            }
        }
        let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> =
            (0..nn).filter(|&i| indeg[i] == 0).map(std::cmp::Reverse).collect();
        let mut order = Vec::with_capacity(nn);
        while let Some(std::cmp::Reverse(i)) = ready.pop() {
            order.push(i);
            for &u in &users[i] {
                indeg[u] -= 1;
                if indeg[u] == 0 {
                    ready.push(std::cmp::Reverse(u));
                }
            }
        }
        if order.len() != nn {
            let stuck = (0..nn).find(|&i| indeg[i] > 0).map(|i| self.nodes()[i].name.clone()).unwrap_or_default();
            return Err(IrError::Graph(format!("the graph has a cycle through node '{stuck}'")));
        }
        if order.iter().enumerate().all(|(k, &i)| k == i) {
            return Ok(());
        }
        let old = std::mem::take(self.nodes_mut_unchecked());
        let mut slots: Vec<Option<crate::Node>> = old.into_iter().map(Some).collect();
        let mut new_nodes = Vec::with_capacity(nn);
        for &i in &order {
            if let Some(n) = slots[i].take() {
                new_nodes.push(n);
            }
        }
        *self.nodes_mut_unchecked() = new_nodes;
        self.relink_defs();
        Ok(())
    }

    /// Points every node output's `ValueDef` at its node's current position.
    fn relink_defs(&mut self) {
        let defs: Vec<(ValueId, NodeId, usize)> = self
            .nodes()
            .iter()
            .enumerate()
            .flat_map(|(ni, n)| n.outputs.iter().enumerate().map(move |(k, &o)| (o, NodeId(ni as u32), k)))
            .collect();
        for (o, node, index) in defs {
            self.value_mut(o).def = ValueDef::Node { node, index };
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::op::{BinaryOp, UnaryOp};
    use crate::*;

    #[test]
    fn replace_and_cleanup_restore_invariants() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[4]));
        let a = g.add(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
        let b = g.add(Op::Unary(UnaryOp::Exp), &[a]).unwrap();
        g.set_outputs(vec![b]);
        // Rewrite exp(relu(x)) into exp(x + x) with the new node appended after its user.
        let s = g.add(Op::Binary(BinaryOp::Add), &[x, x]).unwrap();
        let e = g.add(Op::Unary(UnaryOp::Exp), &[s]).unwrap();
        g.replace_all_uses(b, e).unwrap();
        let removed = g.cleanup().unwrap();
        assert_eq!(removed, 2, "relu and the old exp are dead");
        verify(&g).unwrap();
        assert_eq!(g.nodes().len(), 2);
        assert_eq!(g.nodes()[0].op.name(), "add");
        let out = g.outputs()[0];
        assert_eq!(g.value(out).def, ValueDef::Node { node: NodeId(1), index: 0 });
    }

    #[test]
    fn cleanup_sorts_out_of_order_nodes_and_detects_cycles() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
        let a = g.add(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
        let b = g.add(Op::Unary(UnaryOp::Exp), &[a]).unwrap();
        g.set_outputs(vec![b]);
        g.nodes_mut_unchecked().swap(0, 1);
        assert!(verify(&g).is_err());
        g.cleanup().unwrap();
        verify(&g).unwrap();
        // A cycle: relu reads exp's output.
        g.nodes_mut_unchecked()[0].inputs[0] = b;
        let e = g.cleanup().unwrap_err().to_string();
        assert!(e.contains("cycle"), "{e}");
    }

    #[test]
    fn replace_rejects_type_change() {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[2]));
        let y = g.add_input("y", TensorType::fixed(DType::F32, &[3]));
        assert!(g.replace_all_uses(x, y).is_err());
    }
}
