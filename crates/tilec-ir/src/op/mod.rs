//! The canonical op set. Ops are grouped into families by how a compiler treats them
//! (elementwise, reduction, normalization, linear algebra, layout, indexing, sources);
//! each family lives in its own module with its typed attributes and shape inference.
//!
//! Invariants: attributes are typed and normalized at import (axes non-negative and
//! sorted where order does not matter, shape operands resolved to [`Dim`]s); an op's
//! inputs are always present (optional ONNX inputs are either materialized by the
//! importer or recorded as a flag in the attributes).

mod control;
mod elementwise;
mod index;
mod layout;
mod linalg;
mod nn;
mod norm;
mod paged;
mod reduce;
mod source;

pub use control::*;
pub use elementwise::*;
pub use index::*;
pub use layout::*;
pub use linalg::*;
pub use nn::*;
pub use norm::*;
pub use paged::*;
pub use reduce::*;
pub use source::*;

use crate::{DType, Dim, SymExpr, SymbolTable, TensorType};

/// One canonical operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Elementwise function of one tensor.
    Unary(UnaryOp),
    /// Elementwise function of two tensors with numpy broadcasting.
    Binary(BinaryOp),
    /// `where(cond, x, y)` with three-way broadcasting.
    Where,
    /// Elementwise conversion; `saturate` applies to fp8 targets.
    Cast { to: DType, saturate: bool },
    /// Quantize/dequantize and other scale-carrying elementwise ops.
    Quant(QuantOp),
    Reduce(ReduceOp),
    Norm(NormOp),
    Linalg(LinalgOp),
    Nn(NnOp),
    Layout(LayoutOp),
    Index(IndexOp),
    Source(SourceOp),
    /// Ops that own subgraphs (if, loop, scan).
    Control(ControlOp),
}

/// Context for shape inference: the graph's symbols, so that inference can derive new
/// symbolic dimensions (e.g. `n * 2`) or mint fresh ones for data-dependent sizes.
pub struct InferCtx<'a> {
    pub syms: &'a mut SymbolTable,
}

/// What every op family implements.
pub trait OpInfo {
    /// Lower-case op name used by the printer (`add`, `conv`, `reshape`).
    fn name(&self) -> &'static str;
    /// Output types from input types. Errors say what was expected.
    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String>;
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary(o) => o.name(),
            Op::Binary(o) => o.name(),
            Op::Where => "where",
            Op::Cast { .. } => "cast",
            Op::Quant(o) => o.name(),
            Op::Reduce(o) => o.name(),
            Op::Norm(o) => o.name(),
            Op::Linalg(o) => o.name(),
            Op::Nn(o) => o.name(),
            Op::Layout(o) => o.name(),
            Op::Index(o) => o.name(),
            Op::Source(o) => o.name(),
            Op::Control(o) => o.name(),
        }
    }

    /// Infers output types. `inputs` must have the arity the op expects.
    pub fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            Op::Unary(o) => o.infer(inputs, cx),
            Op::Binary(o) => o.infer(inputs, cx),
            Op::Where => {
                expect_arity(inputs, 3)?;
                if inputs[0].dtype != DType::Bool {
                    return Err(format!("condition must be bool, got {}", inputs[0].dtype));
                }
                if inputs[1].dtype != inputs[2].dtype {
                    return Err(format!("branches differ in dtype: {} vs {}", inputs[1].dtype, inputs[2].dtype));
                }
                let s = broadcast_shapes(&inputs[0].shape, &inputs[1].shape, cx.syms)?;
                let s = broadcast_shapes(&s, &inputs[2].shape, cx.syms)?;
                Ok(vec![TensorType::new(inputs[1].dtype, s)])
            }
            Op::Cast { to, .. } => {
                expect_arity(inputs, 1)?;
                Ok(vec![TensorType::new(*to, inputs[0].shape.clone())])
            }
            Op::Quant(o) => o.infer(inputs, cx),
            Op::Reduce(o) => o.infer(inputs, cx),
            Op::Norm(o) => o.infer(inputs, cx),
            Op::Linalg(o) => o.infer(inputs, cx),
            Op::Nn(o) => o.infer(inputs, cx),
            Op::Layout(o) => o.infer(inputs, cx),
            Op::Index(o) => o.infer(inputs, cx),
            Op::Source(o) => o.infer(inputs, cx),
            Op::Control(o) => o.infer(inputs, cx),
        }
    }

    /// Attributes as printed by the IR printer (empty when the op has none).
    pub fn attrs_string(&self) -> String {
        let dbg = match self {
            Op::Unary(o) => format!("{o:?}"),
            Op::Binary(o) => format!("{o:?}"),
            Op::Where => String::new(),
            Op::Cast { to, saturate } => {
                return if *saturate { format!("to={to}") } else { format!("to={to}, saturate=false") }
            }
            Op::Quant(o) => format!("{o:?}"),
            Op::Reduce(o) => format!("{o:?}"),
            Op::Norm(o) => format!("{o:?}"),
            Op::Linalg(o) => format!("{o:?}"),
            Op::Nn(o) => format!("{o:?}"),
            Op::Layout(o) => format!("{o:?}"),
            Op::Index(o) => format!("{o:?}"),
            Op::Source(o) => format!("{o:?}"),
            Op::Control(o) => return o.attrs_string(),
        };
        // `Variant { a: 1, b: 2 }` prints as `a: 1, b: 2`; unit variants print nothing.
        match (dbg.find('{'), dbg.rfind('}')) {
            (Some(l), Some(r)) if r > l => dbg[l + 1..r].trim().to_string(),
            _ => match (dbg.find('('), dbg.rfind(')')) {
                (Some(l), Some(r)) if r > l => dbg[l + 1..r].trim().to_string(),
                _ => String::new(),
            },
        }
    }
}

// ---- helpers shared by the families' shape inference ----

pub fn expect_arity(inputs: &[&TensorType], n: usize) -> Result<(), String> {
    if inputs.len() != n {
        return Err(format!("expected {n} inputs, got {}", inputs.len()));
    }
    Ok(())
}

pub fn expect_arity_range(inputs: &[&TensorType], lo: usize, hi: usize) -> Result<(), String> {
    if inputs.len() < lo || inputs.len() > hi {
        return Err(format!("expected {lo} to {hi} inputs, got {}", inputs.len()));
    }
    Ok(())
}

/// Normalizes a possibly negative axis against `rank`.
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) && !(r == 0 && a == 0) {
        return Err(format!("axis {axis} out of range for rank {rank}"));
    }
    Ok(a as usize)
}

/// Numpy broadcasting of two shapes. Two different symbols broadcast to their maximum
/// (one of them must be 1 at run time or they must be equal; the executor checks).
pub fn broadcast_shapes(a: &[Dim], b: &[Dim], syms: &mut SymbolTable) -> Result<Vec<Dim>, String> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { Dim::Fixed(1) };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { Dim::Fixed(1) };
        let d = match (da, db) {
            (x, y) if x == y => x,
            (Dim::Fixed(1), y) => y,
            (x, Dim::Fixed(1)) => x,
            (Dim::Fixed(x), Dim::Fixed(y)) => {
                return Err(format!(
                    "shapes {} and {} do not broadcast (dim {x} vs {y})",
                    fmt_dims(a, syms),
                    fmt_dims(b, syms)
                ))
            }
            (x, y) => syms.derive(SymExpr::Max(x, y)),
        };
        out.push(d);
    }
    Ok(out)
}

/// `[2, batch, 3]` for error messages.
pub fn fmt_dims(d: &[Dim], syms: &SymbolTable) -> String {
    let parts: Vec<String> = d.iter().map(|&x| syms.display(x)).collect();
    format!("[{}]", parts.join(", "))
}

/// Product of dimensions, symbolic when needed.
pub fn dims_product(d: &[Dim], syms: &mut SymbolTable) -> Dim {
    d.iter().fold(Dim::Fixed(1), |acc, &x| syms.derive(SymExpr::Mul(acc, x)))
}
