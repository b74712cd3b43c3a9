//! `--dtype f16|bf16`: an f32 graph run in 16-bit where that is safe, as automatic mixed
//! precision does it.
//!
//! Every f32 value becomes 16-bit (f32 constants are rounded once; `cast` to f32 becomes a
//! cast to the 16-bit type), except around the ops whose results lose range or accuracy in 16
//! bits: reductions (a sum over many elements leaves f16's range), `exp`, `log` and `pow`
//! (a decomposed normalization squares its inputs), quantization and control flow. Those run
//! as they are on f32 values, with casts at their edges. Matrix products, convolutions,
//! attention and normalizations take 16-bit tensors; their kernels accumulate and keep their
//! statistics in f32. The graph's interface does not change: f32 inputs are cast on entry and
//! f32 outputs on exit, so the result compares directly with the f32 model's.
//!
//! An op that shape inference refuses in 16-bit (an attribute fixing f32) also stays f32.

use std::collections::HashSet;

use tilec_ir::op::{BinaryOp, SourceOp, UnaryOp};
use tilec_ir::{DType, Graph, Op, ValueDef, ValueId};

use crate::OptError;

const PASS: &str = "convert-precision";

fn err(msg: String) -> OptError {
    OptError::Pass { pass: PASS, msg }
}

/// Ops kept in f32 (their float inputs cast up, their outputs down).
fn keeps_f32(op: &Op) -> bool {
    matches!(
        op,
        Op::Reduce(_)
            | Op::Quant(_)
            | Op::Control(_)
            | Op::Unary(UnaryOp::Exp | UnaryOp::Log)
            | Op::Binary(BinaryOp::Pow)
    )
}

/// The op with its f32 attributes in `to` (a cast's target, a fill's value, a source's dtype).
fn retyped(op: &Op, to: DType) -> Op {
    match op {
        Op::Cast { to: DType::F32, saturate } => Op::Cast { to, saturate: *saturate },
        Op::Source(SourceOp::Fill { shape, value }) if value.dtype() == DType::F32 => {
            Op::Source(SourceOp::Fill { shape: shape.clone(), value: value.cast(to) })
        }
        Op::Source(SourceOp::Eye { rows, cols, k, dtype: DType::F32 }) => {
            Op::Source(SourceOp::Eye { rows: *rows, cols: *cols, k: *k, dtype: to })
        }
        op => op.clone(),
    }
}

/// Two forms of each original value in the new graph: as it was, and in 16 bits (for f32
/// values), made on demand.
struct Forms {
    orig: Vec<Option<ValueId>>,
    half: Vec<Option<ValueId>>,
}

struct Rebuild<'a> {
    g: &'a Graph,
    h: Graph,
    to: DType,
    forms: Forms,
    casts: usize,
}

impl Rebuild<'_> {
    fn is_f32(&self, v: ValueId) -> bool {
        self.g.value(v).ty.dtype == DType::F32
    }

    fn cast(&mut self, from: ValueId, to: DType, name: &str) -> Result<ValueId, OptError> {
        self.casts += 1;
        let n = format!("{name}.to_{}", to.name());
        let outs = self
            .h
            .add_node_named(&n, Op::Cast { to, saturate: false }, &[from], &[&n])
            .map_err(|e| err(e.to_string()))?;
        outs.first().copied().ok_or_else(|| err(format!("cast of '{name}' has no output")))
    }

    /// Value `v` in its original dtype.
    fn orig(&mut self, v: ValueId) -> Result<ValueId, OptError> {
        if let Some(x) = self.forms.orig[v.index()] {
            return Ok(x);
        }
        let val = self.g.value(v);
        let x = match &val.def {
            ValueDef::Const(t) => self.h.add_const(&val.name, t.clone()),
            _ => {
                let half = self.forms.half[v.index()]
                    .ok_or_else(|| err(format!("value '{}' is read before it is made", val.name)))?;
                let name = val.name.clone();
                self.cast(half, DType::F32, &name)?
            }
        };
        self.forms.orig[v.index()] = Some(x);
        Ok(x)
    }

    /// Value `v` in 16 bits (an f32 value) or as it is (any other).
    fn half(&mut self, v: ValueId) -> Result<ValueId, OptError> {
        if !self.is_f32(v) {
            return self.orig(v);
        }
        if let Some(x) = self.forms.half[v.index()] {
            return Ok(x);
        }
        let val = self.g.value(v);
        let x = match &val.def {
            ValueDef::Const(t) => self.h.add_const(&format!("{}.{}", val.name, self.to.name()), t.cast(self.to)),
            _ => {
                let name = val.name.clone();
                let o = self.orig(v)?;
                self.cast(o, self.to, &name)?
            }
        };
        self.forms.half[v.index()] = Some(x);
        Ok(x)
    }
}

/// `g` with its f32 computation in `to` (f16 or bf16), interface unchanged; returns the graph
/// and how many nodes run in 16 bits.
pub fn convert_precision(g: &Graph, to: DType) -> Result<(Graph, usize), OptError> {
    if !matches!(to, DType::F16 | DType::BF16) {
        return Err(err(format!("--dtype {}: f16 or bf16", to.name())));
    }
    let n = g.values().len();
    let mut r = Rebuild {
        g,
        h: Graph::new(&g.name),
        to,
        forms: Forms { orig: vec![None; n], half: vec![None; n] },
        casts: 0,
    };
    r.h.syms = g.syms.clone();
    for &v in g.inputs() {
        let val = g.value(v);
        let x = r.h.add_input(&val.name, val.ty.clone());
        r.forms.orig[v.index()] = Some(x);
    }
    let outputs: HashSet<ValueId> = g.outputs().iter().copied().collect();
    let mut converted = 0;
    for node in g.nodes() {
        let out_names: Vec<String> = node
            .outputs
            .iter()
            .map(|&o| {
                let name = &g.value(o).name;
                if outputs.contains(&o) && g.value(o).ty.dtype == DType::F32 {
                    format!("{name}.{}", to.name())
                } else {
                    name.clone()
                }
            })
            .collect();
        let names: Vec<&str> = out_names.iter().map(String::as_str).collect();
        let mut done = None;
        if !keeps_f32(&node.op) {
            let ins: Vec<ValueId> = node.inputs.iter().map(|&v| r.half(v)).collect::<Result<_, _>>()?;
            // Shape inference refusing the 16-bit form (an attribute that fixes f32): keep f32.
            if let Ok(outs) = r.h.add_node_named(&node.name, retyped(&node.op, to), &ins, &names) {
                converted += 1;
                done = Some(outs);
            }
        }
        let outs = match done {
            Some(outs) => outs,
            None => {
                let ins: Vec<ValueId> = node.inputs.iter().map(|&v| r.orig(v)).collect::<Result<_, _>>()?;
                let orig_names: Vec<&str> = node.outputs.iter().map(|&o| g.value(o).name.as_str()).collect();
                r.h.add_node_named(&node.name, node.op.clone(), &ins, &orig_names)
                    .map_err(|e| err(format!("node '{}' ({}): {e}", node.name, node.op.name())))?
            }
        };
        for (&o, &x) in node.outputs.iter().zip(&outs) {
            let (was, now) = (g.value(o).ty.dtype, r.h.value(x).ty.dtype);
            if was == DType::F32 && now == to {
                r.forms.half[o.index()] = Some(x);
            } else if now == was {
                r.forms.orig[o.index()] = Some(x);
            } else {
                return Err(err(format!(
                    "node '{}' ({}): output '{}' became {} (was {})",
                    node.name,
                    node.op.name(),
                    g.value(o).name,
                    now.name(),
                    was.name()
                )));
            }
        }
    }
    // Outputs in their original dtypes, under their original names.
    let mut outs = vec![];
    for &o in g.outputs() {
        let x = match (r.forms.orig[o.index()], r.forms.half[o.index()]) {
            (Some(x), _) => x,
            (None, Some(hv)) => {
                let name = g.value(o).name.clone();
                let c = r
                    .h
                    .add_node_named(&format!("{name}.to_f32"), Op::Cast { to: DType::F32, saturate: false }, &[hv], &[&name])
                    .map_err(|e| err(e.to_string()))?;
                c[0]
            }
            (None, None) => r.orig(o)?,
        };
        outs.push(x);
    }
    r.h.set_outputs(outs);
    tilec_ir::verify(&r.h).map_err(|e| err(e.to_string()))?;
    Ok((r.h, converted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilec_ir::op::{LinalgOp, ReduceKind, ReduceOp};
    use tilec_ir::{Tensor, TensorType};

    fn graph() -> Graph {
        let mut g = Graph::new("mixed");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[4, 8]));
        let w = g.add_const("w", Tensor::from_f64s(DType::F32, vec![8, 6], &vec![0.25; 48]).unwrap());
        let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
        let e = g.add(Op::Unary(UnaryOp::Exp), &[y]).unwrap();
        let s = g
            .add(Op::Reduce(ReduceOp::Reduce { kind: ReduceKind::Sum, axes: vec![1], keepdims: true }), &[e])
            .unwrap();
        let z = g.add(Op::Binary(BinaryOp::Div), &[e, s]).unwrap();
        g.set_outputs(vec![z]);
        g
    }

    #[test]
    fn products_run_in_16_bits_and_risky_ops_in_f32() {
        let g = graph();
        let (h, converted) = convert_precision(&g, DType::F16).unwrap();
        // matmul and div converted; exp and the sum kept in f32.
        assert_eq!(converted, 2);
        let dt = |name: &str| h.values().iter().find(|v| v.name == name).map(|v| v.ty.dtype);
        let op_out = |op: &str| {
            h.nodes().iter().filter(|n| n.op.name() == op).map(|n| h.value(n.outputs[0]).ty.dtype).collect::<Vec<_>>()
        };
        assert_eq!(op_out("matmul"), vec![DType::F16]);
        assert_eq!(op_out("exp"), vec![DType::F32]);
        assert_eq!(op_out("div"), vec![DType::F16]);
        // The interface is unchanged: f32 in, f32 out under the original name.
        assert_eq!(h.value(h.inputs()[0]).ty.dtype, DType::F32);
        let out = h.value(h.outputs()[0]);
        assert_eq!((out.name.as_str(), out.ty.dtype), (g.value(g.outputs()[0]).name.as_str(), DType::F32));
        assert_eq!(dt("w.f16"), Some(DType::F16));
        assert!(convert_precision(&g, DType::I32).is_err());
    }
}
