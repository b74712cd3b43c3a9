//! Source ops: values produced from attributes and shapes rather than data.

use super::{expect_arity, InferCtx, OpInfo};
use crate::{DType, Dim, Tensor, TensorType};

/// One element of a [`SourceOp::DimValues`] tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DimValue {
    Int(i64),
    /// The run-time size of a (symbolic) dimension.
    Dim(Dim),
}

#[derive(Clone, Debug, PartialEq)]
pub enum SourceOp {
    /// A tensor of `shape` filled with `value` (a one-element tensor whose dtype is the
    /// output dtype). Kept as an op so that large splats are not materialized as constants.
    Fill { shape: Vec<Dim>, value: Tensor },
    /// A small integer tensor of `shape` whose elements are known integers or the run-time
    /// values of symbolic dimensions: what a folded shape computation (`Shape(x)[0]`,
    /// `Concat(Shape(x)[:1], [-1])`, ...) becomes when it depends on symbols.
    DimValues { elems: Vec<DimValue>, shape: Vec<usize>, dtype: DType },
    /// `start, start + delta, ...` below `limit` (above it for a negative delta). Inputs:
    /// three scalars of `dtype`. The length is data-dependent: `len` is a symbol the
    /// importer minted (or a fixed size when known).
    Range { len: Dim },
    /// A `rows x cols` matrix with ones on diagonal `k` (above the main one for k > 0).
    Eye { rows: Dim, cols: Dim, k: i64, dtype: DType },
}

/// The number of elements of a float `range(start, limit, delta)`. Lengths beyond
/// `usize` saturate; the size check of the result rejects them.
pub fn range_len_f64(start: f64, limit: f64, delta: f64) -> Result<usize, String> {
    if delta == 0.0 || !delta.is_finite() {
        return Err(format!("range delta must be finite and non-zero, got {delta}"));
    }
    let n = ((limit - start) / delta).ceil();
    if !n.is_finite() {
        return Err(format!("range({start}, {limit}, {delta}) has no finite length"));
    }
    Ok(n.max(0.0) as usize)
}

/// The number of elements of an integer `range(start, limit, delta)`, exactly (it is below
/// 2^64: the span of two i64s is).
pub fn range_len_i64(start: i64, limit: i64, delta: i64) -> Result<usize, String> {
    if delta == 0 {
        return Err("range delta must be non-zero".into());
    }
    let span = limit as i128 - start as i128;
    let d = delta as i128;
    // div_euclid floors for a positive divisor and ceils for a negative one.
    let n = if d > 0 { (span + d - 1).div_euclid(d) } else { span.div_euclid(d) };
    Ok(n.max(0) as usize)
}

/// The length of a range over scalars of `dtype` whose element count is checked to be
/// addressable (see [`crate::size`]), from its operands as integers or floats.
pub fn range_len(dtype: DType, ints: [i64; 3], floats: [f64; 3]) -> Result<usize, String> {
    let n = if dtype.is_int() {
        range_len_i64(ints[0], ints[1], ints[2])?
    } else {
        range_len_f64(floats[0], floats[1], floats[2])?
    };
    crate::size::byte_size(dtype, &[n]).map_err(|_| {
        let [s, l, d] = if dtype.is_int() { ints.map(|x| x.to_string()) } else { floats.map(|x| x.to_string()) };
        format!("range({s}, {l}, {d}) of {dtype} has {n} elements: too many to address")
    })?;
    Ok(n)
}

impl OpInfo for SourceOp {
    fn name(&self) -> &'static str {
        match self {
            SourceOp::Fill { .. } => "fill",
            SourceOp::DimValues { .. } => "dim_values",
            SourceOp::Range { .. } => "range",
            SourceOp::Eye { .. } => "eye",
        }
    }

    fn infer(&self, inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            SourceOp::Fill { shape, value } => {
                if value.numel() != 1 {
                    return Err(format!("fill value must have one element, has {}", value.numel()));
                }
                if !inputs.is_empty() {
                    return Err(format!("expected no inputs, got {}", inputs.len()));
                }
                Ok(vec![TensorType::new(value.dtype(), shape.clone())])
            }
            SourceOp::DimValues { elems, shape, dtype } => {
                expect_arity(inputs, 0)?;
                if crate::size::numel(shape).ok() != Some(elems.len()) {
                    return Err(format!("{} elements for shape {shape:?}", elems.len()));
                }
                if !dtype.is_int() {
                    return Err(format!("dim values must be integers, got {dtype}"));
                }
                Ok(vec![TensorType::fixed(*dtype, shape)])
            }
            SourceOp::Range { len } => {
                expect_arity(inputs, 3)?;
                let dt = inputs[0].dtype;
                for (k, t) in inputs.iter().enumerate() {
                    if t.dtype != dt {
                        return Err(format!("input {k} has dtype {}, input 0 has {dt}", t.dtype));
                    }
                    if !t.shape.is_empty() && t.shape != [Dim::Fixed(1)] {
                        return Err(format!("input {k} must be a scalar"));
                    }
                }
                if dt == DType::Bool {
                    return Err("range of bool".into());
                }
                Ok(vec![TensorType::new(dt, vec![*len])])
            }
            SourceOp::Eye { rows, cols, dtype, .. } => {
                expect_arity(inputs, 0)?;
                Ok(vec![TensorType::new(*dtype, vec![*rows, *cols])])
            }
        }
    }
}
