//! Graph execution: binds inputs (and the free symbols in their shapes), runs nodes in
//! order, checks each output against its static type, frees values after their last use.

use crate::kernels;
use std::collections::HashMap;
use tilec_ir::{Dim, Graph, Op, SymbolId, Tensor, TensorType, ValueDef, ValueId};

#[derive(Debug, Clone, thiserror::Error)]
pub enum RefError {
    #[error("input '{name}': {msg}")]
    Input { name: String, msg: String },
    #[error("node '{node}' ({op}): {msg}")]
    Node { node: String, op: &'static str, msg: String },
    #[error("{0}")]
    Other(String),
}

/// What a kernel may need beyond its inputs: the values of symbolic dimensions.
pub struct EvalCtx<'a> {
    pub graph: &'a Graph,
    pub bound: &'a HashMap<SymbolId, usize>,
}

impl EvalCtx<'_> {
    /// The run-time value of a (possibly symbolic) dimension.
    pub fn dim(&self, d: Dim) -> Result<usize, String> {
        self.graph
            .syms
            .eval(d, self.bound)
            .ok_or_else(|| format!("dimension {} is not bound", self.graph.syms.display(d)))
    }

    pub fn dims(&self, ds: &[Dim]) -> Result<Vec<usize>, String> {
        ds.iter().map(|&d| self.dim(d)).collect()
    }
}

/// Matches an actual shape against a type, binding free symbols on first sight.
fn bind_shape(
    g: &Graph,
    ty: &TensorType,
    actual: &[usize],
    bound: &mut HashMap<SymbolId, usize>,
) -> Result<(), String> {
    let want = || {
        let d: Vec<String> = ty.shape.iter().map(|&d| g.syms.display(d)).collect();
        format!("[{}]", d.join(", "))
    };
    if ty.shape.len() != actual.len() {
        return Err(format!("expected shape {} (rank {}), got {:?}", want(), ty.rank(), actual));
    }
    for (&d, &a) in ty.shape.iter().zip(actual) {
        match d {
            Dim::Fixed(n) if n != a => return Err(format!("expected shape {}, got {:?}", want(), actual)),
            Dim::Fixed(_) => {}
            Dim::Sym(s) => {
                let is_free = g.syms.symbols.get(s.0 as usize).map(|x| x.expr.is_none()).unwrap_or(false);
                match g.syms.eval(d, bound) {
                    Some(v) if v != a => {
                        return Err(format!(
                            "expected shape {} with {} = {v}, got {:?}",
                            want(),
                            g.syms.display(d),
                            actual
                        ))
                    }
                    Some(_) => {}
                    None if is_free => {
                        bound.insert(s, a);
                    }
                    // A derived symbol whose operands are unknown yet: bind it directly.
                    None => {
                        bound.insert(s, a);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Runs the graph on positional inputs; returns the graph outputs in order.
pub fn run(g: &Graph, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, RefError> {
    if inputs.len() != g.inputs().len() {
        return Err(RefError::Other(format!(
            "graph has {} inputs, {} were given",
            g.inputs().len(),
            inputs.len()
        )));
    }
    let mut env: Vec<Option<Tensor>> = vec![None; g.values().len()];
    let mut bound = HashMap::new();
    for (&v, t) in g.inputs().iter().zip(inputs) {
        let val = g.value(v);
        if t.dtype() != val.ty.dtype {
            return Err(RefError::Input {
                name: val.name.clone(),
                msg: format!("expected dtype {}, got {}", val.ty.dtype, t.dtype()),
            });
        }
        bind_shape(g, &val.ty, t.shape(), &mut bound)
            .map_err(|msg| RefError::Input { name: val.name.clone(), msg })?;
        env[v.index()] = Some(t);
    }
    // Last use of each value, so intermediates can be freed early.
    let mut last_use = vec![usize::MAX; g.values().len()];
    for (i, n) in g.nodes().iter().enumerate() {
        for &x in &n.inputs {
            last_use[x.index()] = i;
        }
    }
    let keep: Vec<ValueId> = g.outputs().to_vec();
    for (i, n) in g.nodes().iter().enumerate() {
        let err = |msg: String| RefError::Node { node: n.name.clone(), op: n.op.name(), msg };
        let mut args: Vec<&Tensor> = Vec::with_capacity(n.inputs.len());
        for &x in &n.inputs {
            let t = match (&env[x.index()], &g.value(x).def) {
                (Some(t), _) => t,
                (None, ValueDef::Const(t)) => t,
                _ => return Err(err(format!("input '{}' has no value", g.value(x).name))),
            };
            args.push(t);
        }
        let cx = EvalCtx { graph: g, bound: &bound };
        // Sizes known before the kernel runs (symbols bound from the inputs) are checked
        // first, so that no kernel is asked for a buffer that cannot exist.
        for &o in &n.outputs {
            let ty = &g.value(o).ty;
            if let Ok(shape) = cx.dims(&ty.shape) {
                tilec_ir::size::byte_size(ty.dtype, &shape)
                    .map_err(|e| err(format!("output '{}': {e}", g.value(o).name)))?;
            }
        }
        let outs = eval_op(&n.op, &args, &cx).map_err(err)?;
        if outs.len() != n.outputs.len() {
            return Err(err(format!("kernel produced {} outputs, node has {}", outs.len(), n.outputs.len())));
        }
        for (&o, t) in n.outputs.iter().zip(outs) {
            let ty = &g.value(o).ty;
            if t.dtype() != ty.dtype {
                return Err(err(format!("kernel produced {} for output of type {}", t.dtype(), ty.dtype)));
            }
            bind_shape(g, ty, t.shape(), &mut bound).map_err(|m| err(format!("output '{}': {m}", g.value(o).name)))?;
            env[o.index()] = Some(t);
        }
        for &x in &n.inputs {
            if last_use[x.index()] == i && !keep.contains(&x) {
                env[x.index()] = None;
            }
        }
    }
    g.outputs()
        .iter()
        .map(|&o| match (&env[o.index()], &g.value(o).def) {
            (Some(t), _) => Ok(t.clone()),
            (None, ValueDef::Const(t)) => Ok(t.clone()),
            _ => Err(RefError::Other(format!("output '{}' was not computed", g.value(o).name))),
        })
        .collect()
}

/// Runs the graph with inputs given by name (any order).
pub fn run_named(g: &Graph, mut inputs: HashMap<String, Tensor>) -> Result<Vec<Tensor>, RefError> {
    let mut pos = Vec::with_capacity(g.inputs().len());
    for &v in g.inputs() {
        let name = &g.value(v).name;
        let t = inputs
            .remove(name)
            .ok_or_else(|| RefError::Input { name: name.clone(), msg: "missing".into() })?;
        pos.push(t);
    }
    if let Some(extra) = inputs.keys().next() {
        let names: Vec<&str> = g.inputs().iter().map(|&v| g.value(v).name.as_str()).collect();
        return Err(RefError::Input {
            name: extra.clone(),
            msg: format!("the graph has no such input (inputs: {})", names.join(", ")),
        });
    }
    run(g, pos)
}

/// Evaluates one op on concrete tensors.
pub fn eval_op(op: &Op, args: &[&Tensor], cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    match op {
        Op::Unary(o) => kernels::elementwise::unary(o, args),
        Op::Binary(o) => kernels::elementwise::binary(o, args),
        Op::Where => kernels::elementwise::where_(args),
        Op::Cast { to, saturate } => kernels::elementwise::cast(*to, *saturate, args),
        Op::Quant(o) => kernels::elementwise::quant(o, args),
        Op::Reduce(o) => kernels::reduce::eval(o, args, cx),
        Op::Norm(o) => kernels::norm::eval(o, args, cx),
        Op::Linalg(o) => kernels::linalg::eval(o, args, cx),
        Op::Nn(o) => kernels::nn::eval(o, args, cx),
        Op::Layout(o) => kernels::layout::eval(o, args, cx),
        Op::Index(o) => kernels::index::eval(o, args, cx),
        Op::Source(o) => kernels::source::eval(o, args, cx),
        Op::Control(o) => kernels::control::eval(o, args, cx),
    }
}
