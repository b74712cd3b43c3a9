//! The verifier: SSA, topological order (hence acyclic), arity, and types re-inferred.

use crate::graph::{Graph, IrError, NodeId, ValueDef};
use crate::op::InferCtx;
use crate::TensorType;

/// Checks every invariant of [`Graph`]; returns the first violation.
pub fn verify(g: &Graph) -> Result<(), IrError> {
    let nv = g.values().len();
    let mut defined = vec![false; nv];
    for (i, v) in g.values().iter().enumerate() {
        match v.def {
            ValueDef::Input => {
                if !g.inputs().iter().any(|x| x.index() == i) {
                    return Err(IrError::Graph(format!("value '{}' is an input not listed in the graph inputs", v.name)));
                }
                crate::size::check_type(&v.ty).map_err(|e| IrError::Graph(format!("input '{}': {e}", v.name)))?;
                defined[i] = true;
            }
            ValueDef::Const(ref t) => {
                if t.tensor_type() != v.ty {
                    return Err(IrError::Graph(format!("constant '{}' has a type that differs from its tensor", v.name)));
                }
                defined[i] = true;
            }
            ValueDef::Node { .. } => {}
        }
    }
    let mut syms = g.syms.clone();
    // Symbols minted while re-inferring (data-dependent sizes) are new each time; such a
    // dimension matches whatever the graph recorded.
    let known = g.syms.symbols.len();
    for (ni, n) in g.nodes().iter().enumerate() {
        let err = |msg: String| IrError::Node { node: n.name.clone(), op: n.op.name(), msg };
        for &x in &n.inputs {
            if x.index() >= nv {
                return Err(err(format!("reads value {} which does not exist", x.0)));
            }
            if !defined[x.index()] {
                return Err(err(format!(
                    "reads '{}' before it is defined (dangling value or cycle)",
                    g.value(x).name
                )));
            }
        }
        for (k, &o) in n.outputs.iter().enumerate() {
            if o.index() >= nv {
                return Err(err(format!("writes value {} which does not exist", o.0)));
            }
            if defined[o.index()] {
                return Err(err(format!("redefines '{}' (not SSA)", g.value(o).name)));
            }
            if g.value(o).def != (ValueDef::Node { node: NodeId(ni as u32), index: k }) {
                return Err(err(format!("output '{}' does not point back at this node", g.value(o).name)));
            }
            defined[o.index()] = true;
        }
        let tys: Vec<&TensorType> = n.inputs.iter().map(|&x| &g.value(x).ty).collect();
        let inferred = n.op.infer(&tys, &mut InferCtx { syms: &mut syms }).map_err(err)?;
        if inferred.len() != n.outputs.len() {
            return Err(err(format!("has {} outputs, op defines {}", n.outputs.len(), inferred.len())));
        }
        for (t, &o) in inferred.iter().zip(&n.outputs) {
            crate::size::check_type(t).map_err(|e| err(format!("output '{}': {e}", g.value(o).name)))?;
            if !same_type(t, &g.value(o).ty, known) {
                return Err(err(format!("output '{}' has type {:?}, op infers {:?}", g.value(o).name, g.value(o).ty, t)));
            }
        }
        // Subgraphs (control flow) are closed graphs: verify them on their own.
        if let crate::Op::Control(c) = &n.op {
            for (what, sg) in c.subgraphs() {
                verify(sg).map_err(|e| err(format!("{what} subgraph: {e}")))?;
            }
        }
    }
    for &o in g.outputs() {
        if o.index() >= nv || !defined[o.index()] {
            return Err(IrError::Graph(format!("graph output {} is not defined", o.0)));
        }
    }
    Ok(())
}

/// Type equality where a dimension the re-inference minted (id >= `known`) matches any.
fn same_type(inferred: &TensorType, recorded: &TensorType, known: usize) -> bool {
    inferred.dtype == recorded.dtype
        && inferred.rank() == recorded.rank()
        && inferred.shape.iter().zip(&recorded.shape).all(|(a, b)| {
            a == b || matches!(a, crate::Dim::Sym(s) if s.0 as usize >= known)
        })
}
