//! Layout ops: re-indexing without arithmetic (reshape, transpose, slice, concat, ...).
//! Later stages turn most of them into index expressions rather than kernels.
//! Resize lives here too: it is a re-indexing with interpolation weights.

use super::{broadcast_shapes, dims_product, expect_arity, fmt_dims, InferCtx, OpInfo};
use crate::{DType, Dim, SymExpr, TensorType};

/// How Pad fills the border.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum PadMode {
    /// The scalar second input.
    Constant,
    /// Mirror without repeating the edge element.
    Reflect,
    /// Repeat the edge element.
    Edge,
    /// Wrap around (periodic).
    Wrap,
}

/// Resize interpolation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ResizeMode {
    Nearest,
    Linear,
    Cubic,
}

/// How an output coordinate maps to an input coordinate (ONNX names).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CoordMode {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

/// Rounding of the source coordinate for nearest interpolation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// Resize attributes, normalized: one entry per input axis.
#[derive(Clone, Debug, PartialEq)]
pub struct ResizeAttrs {
    pub mode: ResizeMode,
    pub coord: CoordMode,
    pub nearest: NearestMode,
    pub cubic_a: f64,
    pub exclude_outside: bool,
    pub antialias: bool,
    pub extrapolation_value: f64,
    /// Output shape.
    pub sizes: Vec<Dim>,
    /// Scale per axis (output / input) used by the coordinate transformation.
    pub scales: Vec<f64>,
    /// Region of interest (starts then ends, `2 * rank` values), for `TfCropAndResize`;
    /// empty otherwise.
    pub roi: Vec<f64>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum LayoutOp {
    /// Reshape to a fully resolved target shape (no 0 or -1 placeholders: the importer
    /// resolves them, symbolically when needed).
    Reshape { shape: Vec<Dim> },
    /// Output dim `i` is input dim `perm[i]`.
    Transpose { perm: Vec<usize> },
    /// Concatenation of all inputs along `axis`.
    Concat { axis: usize },
    /// Splits along `axis` into pieces of the given sizes (one output each).
    Split { axis: usize, sizes: Vec<Dim> },
    /// ONNX Slice semantics per listed axis (negative starts/ends count from the end,
    /// clamped to the dim; steps are non-zero, possibly negative). `axes` are unique.
    Slice { axes: Vec<usize>, starts: Vec<SliceBound>, ends: Vec<SliceBound>, steps: Vec<i64> },
    /// Broadcast to `shape` (numpy rules: the output is `broadcast(x.shape, shape)`).
    Expand { shape: Vec<Dim> },
    /// Repeats the input `repeats[i]` times along axis `i`.
    Tile { repeats: Vec<usize> },
    /// Pads (or crops, for negative amounts) each axis: `pads` is all begins then all
    /// ends. Inputs: x and a scalar fill value of x's dtype (used by `Constant`).
    Pad { pads: Vec<i64>, mode: PadMode },
    /// Keeps the upper (`j - i >= k`) or lower (`j - i <= k`) triangle of the last two
    /// dims, zeroing the rest.
    Trilu { upper: bool, k: i64 },
    /// Interpolating resize (Resize/Upsample).
    Resize(Box<ResizeAttrs>),
}

/// ONNX Slice on one axis of length `dim`: the first index and the output length.
pub fn slice_range(dim: i64, start: i64, end: i64, step: i64) -> (i64, i64) {
    if step == 0 {
        return (0, 0);
    }
    let norm = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
    let (s, e) = (norm(start), norm(end));
    if step > 0 {
        let s = s.clamp(0, dim);
        let e = e.clamp(0, dim);
        let len = if e > s { (e - s + step - 1) / step } else { 0 };
        (s, len)
    } else {
        let s = s.clamp(-1, dim - 1);
        let e = e.clamp(-1, dim - 1);
        let st = -step;
        let len = if s > e { (s - e + st - 1) / st } else { 0 };
        (s, len)
    }
}

/// A slice start or end: a literal index (negative counts from the end) or a symbolic
/// index that is the run-time value of a dimension (hence non-negative), as exporters
/// write `x[:, :seq]`.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum SliceBound {
    Index(i64),
    Dim(Dim),
}

impl SliceBound {
    pub fn index(self) -> Option<i64> {
        match self {
            SliceBound::Index(v) => Some(v),
            SliceBound::Dim(Dim::Fixed(n)) => Some(n as i64),
            SliceBound::Dim(Dim::Sym(_)) => None,
        }
    }
}

/// Output length of a slice along a symbolic dim or with symbolic bounds, when
/// expressible.
fn slice_sym(d: Dim, start: SliceBound, end: SliceBound, step: i64, cx: &mut InferCtx) -> Result<Dim, String> {
    if step <= 0 {
        return Err("a negative-step slice of a symbolic dimension or with symbolic bounds is not supported".into());
    }
    // Effective clamped position in [0, d] of an index (sizes are non-negative, so
    // 0 and "past the end" need no symbol).
    let pos = |b: SliceBound, cx: &mut InferCtx| -> Dim {
        let v = match b {
            SliceBound::Dim(x) => return cx.syms.derive(SymExpr::Min(d, x)),
            SliceBound::Index(v) => v,
        };
        if v == 0 {
            Dim::Fixed(0)
        } else if v >= i64::MAX / 2 {
            d
        } else if v > 0 {
            cx.syms.derive(SymExpr::Min(d, Dim::Fixed(v as usize)))
        } else {
            let k = v.checked_neg().unwrap_or(i64::MAX).min(i64::MAX / 2) as usize;
            let m = cx.syms.derive(SymExpr::Min(d, Dim::Fixed(k)));
            cx.syms.derive(SymExpr::Sub(d, m))
        }
    };
    let (s, e) = (pos(start, cx), pos(end, cx));
    // max(e - s, 0) = e - min(s, e)
    let len = if s == Dim::Fixed(0) {
        e
    } else {
        let m = cx.syms.derive(SymExpr::Min(s, e));
        cx.syms.derive(SymExpr::Sub(e, m))
    };
    Ok(if step == 1 { len } else { cx.syms.derive(SymExpr::CeilDiv(len, Dim::Fixed(step as usize))) })
}

fn check_axes(axes: &[usize], rank: usize) -> Result<(), String> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= rank {
            return Err(format!("axis {a} out of range for rank {rank}"));
        }
        if axes[..i].contains(&a) {
            return Err(format!("axis {a} repeated"));
        }
    }
    Ok(())
}

impl OpInfo for LayoutOp {
    fn name(&self) -> &'static str {
        match self {
            LayoutOp::Reshape { .. } => "reshape",
            LayoutOp::Transpose { .. } => "transpose",
            LayoutOp::Concat { .. } => "concat",
            LayoutOp::Split { .. } => "split",
            LayoutOp::Slice { .. } => "slice",
            LayoutOp::Expand { .. } => "expand",
            LayoutOp::Tile { .. } => "tile",
            LayoutOp::Pad { .. } => "pad",
            LayoutOp::Trilu { .. } => "trilu",
            LayoutOp::Resize(_) => "resize",
        }
    }

    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            LayoutOp::Reshape { shape } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                let a = dims_product(&x.shape, cx.syms);
                let b = dims_product(shape, cx.syms);
                if let (Dim::Fixed(p), Dim::Fixed(q)) = (a, b) {
                    if p != q {
                        return Err(format!(
                            "cannot reshape {} ({p} elements) to {} ({q} elements)",
                            fmt_dims(&x.shape, cx.syms),
                            fmt_dims(shape, cx.syms)
                        ));
                    }
                }
                Ok(vec![TensorType::new(x.dtype, shape.clone())])
            }
            LayoutOp::Transpose { perm } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                let mut seen = vec![false; x.rank()];
                if perm.len() != x.rank() {
                    return Err(format!("perm {perm:?} does not match rank {}", x.rank()));
                }
                for &p in perm {
                    if p >= x.rank() || seen[p] {
                        return Err(format!("perm {perm:?} is not a permutation"));
                    }
                    seen[p] = true;
                }
                Ok(vec![TensorType::new(x.dtype, perm.iter().map(|&p| x.shape[p]).collect())])
            }
            LayoutOp::Concat { axis } => {
                let first = inputs.first().ok_or("concat needs at least one input")?;
                let r = first.rank();
                if *axis >= r {
                    return Err(format!("axis {axis} out of range for rank {r}"));
                }
                let mut shape = first.shape.clone();
                for (k, t) in inputs.iter().enumerate().skip(1) {
                    if t.dtype != first.dtype {
                        return Err(format!("input {k} has dtype {}, input 0 has {}", t.dtype, first.dtype));
                    }
                    if t.rank() != r {
                        return Err(format!("input {k} has rank {}, input 0 has rank {r}", t.rank()));
                    }
                    for i in 0..r {
                        if i == *axis {
                            shape[i] = cx.syms.derive(SymExpr::Add(shape[i], t.shape[i]));
                        } else if let (Dim::Fixed(a), Dim::Fixed(b)) = (shape[i], t.shape[i]) {
                            if a != b {
                                return Err(format!(
                                    "input {k} has shape {}, incompatible with {} off axis {axis}",
                                    fmt_dims(&t.shape, cx.syms),
                                    fmt_dims(&first.shape, cx.syms)
                                ));
                            }
                        } else if let Dim::Fixed(_) = t.shape[i] {
                            shape[i] = t.shape[i];
                        }
                    }
                }
                Ok(vec![TensorType::new(first.dtype, shape)])
            }
            LayoutOp::Split { axis, sizes } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                if *axis >= x.rank() {
                    return Err(format!("axis {axis} out of range for rank {}", x.rank()));
                }
                if sizes.is_empty() {
                    return Err("split needs at least one output".into());
                }
                let total = sizes.iter().fold(Dim::Fixed(0), |acc, &d| cx.syms.derive(SymExpr::Add(acc, d)));
                if let (Dim::Fixed(t), Dim::Fixed(n)) = (total, x.shape[*axis]) {
                    if t != n {
                        return Err(format!("split sizes {sizes:?} sum to {t}, axis {axis} has {n}"));
                    }
                }
                Ok(sizes
                    .iter()
                    .map(|&s| {
                        let mut sh = x.shape.clone();
                        sh[*axis] = s;
                        TensorType::new(x.dtype, sh)
                    })
                    .collect())
            }
            LayoutOp::Slice { axes, starts, ends, steps } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                if starts.len() != axes.len() || ends.len() != axes.len() || steps.len() != axes.len() {
                    return Err("slice starts/ends/steps must have one entry per axis".into());
                }
                check_axes(axes, x.rank())?;
                let mut shape = x.shape.clone();
                for (i, &a) in axes.iter().enumerate() {
                    if steps[i] == 0 {
                        return Err("slice step must not be 0".into());
                    }
                    shape[a] = match (x.shape[a], starts[i].index(), ends[i].index()) {
                        (Dim::Fixed(n), Some(s), Some(e)) => Dim::Fixed(slice_range(n as i64, s, e, steps[i]).1 as usize),
                        (d, _, _) => slice_sym(d, starts[i], ends[i], steps[i], cx)?,
                    };
                }
                Ok(vec![TensorType::new(x.dtype, shape)])
            }
            LayoutOp::Expand { shape } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                let s = broadcast_shapes(&x.shape, shape, cx.syms)?;
                Ok(vec![TensorType::new(x.dtype, s)])
            }
            LayoutOp::Tile { repeats } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                if repeats.len() != x.rank() {
                    return Err(format!("{} repeats for rank {}", repeats.len(), x.rank()));
                }
                let shape = x
                    .shape
                    .iter()
                    .zip(repeats)
                    .map(|(&d, &r)| cx.syms.derive(SymExpr::Mul(d, Dim::Fixed(r))))
                    .collect();
                Ok(vec![TensorType::new(x.dtype, shape)])
            }
            LayoutOp::Pad { pads, mode } => {
                expect_arity(inputs, 2)?;
                let (x, v) = (inputs[0], inputs[1]);
                let r = x.rank();
                if pads.len() != 2 * r {
                    return Err(format!("{} pads for rank {r} (expected {})", pads.len(), 2 * r));
                }
                if v.dtype != x.dtype || !v.shape.is_empty() {
                    return Err(format!("pad value must be a {} scalar", x.dtype));
                }
                let mut shape = Vec::with_capacity(r);
                for i in 0..r {
                    let (b, e) = (pads[i], pads[i + r]);
                    let d = match x.shape[i] {
                        Dim::Fixed(n) => {
                            let m = n as i64 + b + e;
                            if m < 0 {
                                return Err(format!("pads {b}, {e} crop more than dim {i} ({n})"));
                            }
                            if n == 0 && m > 0 && *mode != PadMode::Constant {
                                return Err(format!("cannot pad an empty dim {i} in {mode:?} mode"));
                            }
                            Dim::Fixed(m as usize)
                        }
                        d => {
                            let mut d = d;
                            for p in [b, e] {
                                d = if p >= 0 {
                                    cx.syms.derive(SymExpr::Add(d, Dim::Fixed(p as usize)))
                                } else {
                                    cx.syms.derive(SymExpr::Sub(d, Dim::Fixed(p.unsigned_abs() as usize)))
                                };
                            }
                            d
                        }
                    };
                    shape.push(d);
                }
                Ok(vec![TensorType::new(x.dtype, shape)])
            }
            LayoutOp::Trilu { .. } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                if x.rank() < 2 {
                    return Err(format!("trilu needs rank >= 2, got {}", x.rank()));
                }
                Ok(vec![x.clone()])
            }
            LayoutOp::Resize(a) => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                if a.sizes.len() != x.rank() || a.scales.len() != x.rank() {
                    return Err(format!("resize sizes/scales must have {} entries", x.rank()));
                }
                if !a.roi.is_empty() && a.roi.len() != 2 * x.rank() {
                    return Err(format!("resize roi must have {} entries", 2 * x.rank()));
                }
                if x.dtype == DType::Bool {
                    return Err("cannot resize bool".into());
                }
                Ok(vec![TensorType::new(x.dtype, a.sizes.clone())])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(dim: i64, start: i64, end: i64, step: i64) -> Vec<i64> {
        // Python-style slicing, as numpy does it.
        let mut out = Vec::new();
        let norm = |v: i64| if v < 0 { v + dim } else { v };
        if step > 0 {
            let s = norm(start).clamp(0, dim);
            let e = norm(end).clamp(0, dim);
            let mut i = s;
            while i < e {
                out.push(i);
                i += step;
            }
        } else {
            let s = norm(start).clamp(-1, dim - 1);
            let e = norm(end).clamp(-1, dim - 1);
            let mut i = s;
            while i > e {
                out.push(i);
                i += step;
            }
        }
        out
    }

    #[test]
    fn slice_range_matches_python_slicing() {
        for dim in 0..6 {
            for start in -8..8 {
                for end in [-9, -3, -1, 0, 1, 3, 5, 9, i64::MAX, i64::MIN] {
                    for step in [-3, -2, -1, 1, 2, 3] {
                        let want = naive(dim, start, end, step);
                        let (s, n) = slice_range(dim, start, end, step);
                        let got: Vec<i64> = (0..n).map(|k| s + k * step).collect();
                        assert_eq!(got, want, "dim {dim} {start}:{end}:{step}");
                    }
                }
            }
        }
    }

    #[test]
    fn symbolic_slice_evaluates_like_fixed() {
        use crate::SymbolTable;
        use std::collections::HashMap;
        let mut syms = SymbolTable::default();
        let b = syms.free("b");
        let whole = slice_sym(Dim::Sym(b), SliceBound::Index(0), SliceBound::Index(i64::MAX), 1, &mut InferCtx { syms: &mut syms }).unwrap();
        assert_eq!(whole, Dim::Sym(b), "x[0:] keeps the symbol itself");
        for (start, end) in [(0, i64::MAX), (1, i64::MAX), (-2, i64::MAX), (0, -1), (2, 4), (-3, -1)] {
            for step in [1, 2] {
                let d = slice_sym(Dim::Sym(b), SliceBound::Index(start), SliceBound::Index(end), step, &mut InferCtx { syms: &mut syms }).unwrap();
                for n in 0..7usize {
                    let bound: HashMap<_, _> = [(b, n)].into_iter().collect();
                    let want = slice_range(n as i64, start, end, step).1 as usize;
                    assert_eq!(syms.eval(d, &bound), Some(want), "{start}:{end}:{step} at {n}");
                }
            }
        }
    }
}
