//! The graph: an SSA graph of tensor values in arenas with typed ids.
//!
//! Invariants (checked by [`crate::verify`]): every value is defined exactly once (graph
//! input, constant, or one output of one node); `nodes` is in topological order, so a node
//! only reads values defined by earlier nodes, inputs or constants; every value's type is
//! what its defining op infers.

use crate::op::{InferCtx, Op};
use crate::{SymbolTable, Tensor, TensorType};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Where a value comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueDef {
    /// A graph input, bound by the caller at run time.
    Input,
    /// A constant (an ONNX initializer or a folded value).
    Const(Tensor),
    /// Output `index` of `node`.
    Node { node: NodeId, index: usize },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub name: String,
    pub ty: TensorType,
    pub def: ValueDef,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// An error building or checking a graph; names the node and op where there is one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IrError {
    #[error("node '{node}' ({op}): {msg}")]
    Node { node: String, op: &'static str, msg: String },
    #[error("{0}")]
    Graph(String),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub name: String,
    pub syms: SymbolTable,
    values: Vec<Value>,
    nodes: Vec<Node>,
    pub(crate) inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
}

impl Graph {
    pub fn new(name: &str) -> Graph {
        Graph { name: name.to_string(), ..Default::default() }
    }

    fn push_value(&mut self, name: String, ty: TensorType, def: ValueDef) -> ValueId {
        self.values.push(Value { name, ty, def });
        ValueId(self.values.len() as u32 - 1)
    }

    /// Adds a graph input of the given type.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> ValueId {
        let id = self.push_value(name.to_string(), ty, ValueDef::Input);
        self.inputs.push(id);
        id
    }

    /// Adds a constant.
    pub fn add_const(&mut self, name: &str, t: Tensor) -> ValueId {
        let ty = t.tensor_type();
        self.push_value(name.to_string(), ty, ValueDef::Const(t))
    }

    /// Adds a node; its output types come from shape inference. Output values are named
    /// `out_names[i]` when given, else `<node>.<i>`.
    pub fn add_node_named(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[ValueId],
        out_names: &[&str],
    ) -> Result<Vec<ValueId>, IrError> {
        let err = |msg: String| IrError::Node { node: name.to_string(), op: op.name(), msg };
        for &v in inputs {
            if v.index() >= self.values.len() {
                return Err(err(format!("input {v:?} does not exist")));
            }
        }
        let tys: Vec<TensorType> = inputs.iter().map(|v| self.values[v.index()].ty.clone()).collect();
        let refs: Vec<&TensorType> = tys.iter().collect();
        let outs = op.infer(&refs, &mut InferCtx { syms: &mut self.syms }).map_err(err)?;
        for (i, ty) in outs.iter().enumerate() {
            if let Some(&d) = ty.shape.iter().find(|&&d| self.syms.undefined(d)) {
                return Err(err(format!("output {i}: dimension {} overflows or is undefined", self.syms.display(d))));
            }
            crate::size::check_type(ty).map_err(|e| err(format!("output {i}: {e}")))?;
        }
        let node = NodeId(self.nodes.len() as u32);
        let mut out_ids = Vec::with_capacity(outs.len());
        for (i, ty) in outs.into_iter().enumerate() {
            let vname = match out_names.get(i) {
                Some(n) if !n.is_empty() => n.to_string(),
                _ => format!("{name}.{i}"),
            };
            out_ids.push(self.push_value(vname, ty, ValueDef::Node { node, index: i }));
        }
        self.nodes.push(Node { name: name.to_string(), op, inputs: inputs.to_vec(), outputs: out_ids.clone() });
        Ok(out_ids)
    }

    pub fn add_node(&mut self, name: &str, op: Op, inputs: &[ValueId]) -> Result<Vec<ValueId>, IrError> {
        self.add_node_named(name, op, inputs, &[])
    }

    /// Adds a node and returns its first output; for single-output ops in builders.
    pub fn add(&mut self, op: Op, inputs: &[ValueId]) -> Result<ValueId, IrError> {
        let name = format!("n{}", self.nodes.len());
        let outs = self.add_node(&name, op, inputs)?;
        outs.first()
            .copied()
            .ok_or_else(|| IrError::Graph(format!("node '{name}' has no outputs")))
    }

    pub fn set_outputs(&mut self, outputs: Vec<ValueId>) {
        self.outputs = outputs;
    }

    pub fn value(&self, v: ValueId) -> &Value {
        &self.values[v.index()]
    }

    pub fn value_mut(&mut self, v: ValueId) -> &mut Value {
        &mut self.values[v.index()]
    }

    pub fn node(&self, n: NodeId) -> &Node {
        &self.nodes[n.index()]
    }

    pub fn values(&self) -> &[Value] {
        &self.values
    }

    pub fn value_ids(&self) -> impl Iterator<Item = ValueId> {
        (0..self.values.len() as u32).map(ValueId)
    }

    /// Nodes in topological order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn inputs(&self) -> &[ValueId] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[ValueId] {
        &self.outputs
    }

    /// The constant tensor behind a value, if it is a constant.
    pub fn const_value(&self, v: ValueId) -> Option<&Tensor> {
        match &self.values.get(v.index())?.def {
            ValueDef::Const(t) => Some(t),
            _ => None,
        }
    }

    /// Keeps the values and nodes flagged in `keep_val`/`keep_node`, renumbering both
    /// densely in their current order. Kept nodes must only read kept values.
    pub(crate) fn renumber(&mut self, keep_val: &[bool], keep_node: &[bool]) {
        let mut vmap: Vec<u32> = vec![u32::MAX; self.values.len()];
        let old_vals = std::mem::take(&mut self.values);
        for (i, v) in old_vals.into_iter().enumerate() {
            if keep_val[i] {
                vmap[i] = self.values.len() as u32;
                self.values.push(v);
            }
        }
        let m = |v: &ValueId| ValueId(vmap[v.index()]);
        let old_nodes = std::mem::take(&mut self.nodes);
        for (i, mut n) in old_nodes.into_iter().enumerate() {
            if keep_node[i] {
                n.inputs = n.inputs.iter().map(m).collect();
                n.outputs = n.outputs.iter().map(m).collect();
                self.nodes.push(n);
            }
        }
        self.inputs = self.inputs.iter().map(m).collect();
        self.outputs = self.outputs.iter().map(m).collect();
        for (ni, n) in self.nodes.iter().enumerate() {
            for (k, &o) in n.outputs.iter().enumerate() {
                self.values[o.index()].def = ValueDef::Node { node: NodeId(ni as u32), index: k };
            }
        }
    }

    /// Raw access for verifier tests that must build broken graphs.
    #[doc(hidden)]
    pub fn nodes_mut_unchecked(&mut self) -> &mut Vec<Node> {
        &mut self.nodes
    }
}
