//! Indexing ops: gathers, scatters and data-dependent selections.
//!
//! Index operands are integer tensors (any integer dtype); negative indices count from
//! the end of the indexed dimension and out-of-range indices are run-time errors.
//!
//! Ops whose output size depends on the data (NonZero, Compress, Unique,
//! NonMaxSuppression) carry that size as a `count` dimension in their attributes: the
//! importer mints a fresh free symbol for it (or a fixed size when it can tell), so that
//! inference stays a pure function of the op and its input types (the verifier re-infers
//! and compares). The executor binds the symbol from the first actual output.

use super::{dims_product, expect_arity, fmt_dims, InferCtx, OpInfo};
use crate::{DType, Dim, TensorType};

/// How a scatter combines an update with the value already at its destination.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ScatterReduction {
    /// Overwrite (with duplicate indices the last update in index order wins).
    None,
    Add,
    Mul,
    Max,
    Min,
}

impl ScatterReduction {
    pub fn from_onnx(s: &str) -> Option<ScatterReduction> {
        Some(match s {
            "none" => ScatterReduction::None,
            "add" => ScatterReduction::Add,
            "mul" => ScatterReduction::Mul,
            "max" => ScatterReduction::Max,
            "min" => ScatterReduction::Min,
            _ => return None,
        })
    }
}

/// Pooling within a RoiAlign bin.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RoiPoolMode {
    Avg,
    Max,
}

#[derive(Clone, Debug, PartialEq)]
pub enum IndexOp {
    /// `numpy.take(data, indices, axis)`; negative indices count from the end.
    /// Output shape: `data[..axis] ++ indices ++ data[axis+1..]`.
    Gather { axis: usize },
    /// `numpy.take_along_axis`: output has the shape of `indices` (same rank as data);
    /// `out[i..] = data[i.. with the axis coordinate replaced by indices[i..]]`.
    GatherElements { axis: usize },
    /// Gathers slices addressed by the last dimension of `indices` (its size `k` must be
    /// fixed); the first `batch_dims` dimensions of data and indices are batch dims.
    /// Output: `indices[..q-1] ++ data[batch_dims+k..]`.
    GatherND { batch_dims: usize },
    /// Inputs `(data, indices, updates)`; `indices` and `updates` have one shape, of
    /// data's rank. Writes `updates[i..]` at `data[i.. with the axis coordinate
    /// replaced by indices[i..]]`, combining by `reduction`, in row-major order.
    ScatterElements { axis: usize, reduction: ScatterReduction },
    /// Inputs `(data, indices, updates)`: `indices[..q-1]` address slices of data by
    /// their last dimension (size `k`, fixed); `updates` has shape
    /// `indices[..q-1] ++ data[k..]`.
    ScatterND { reduction: ScatterReduction },
    /// Inputs `(indices, values)` with `values = [off, on]`: output has `indices`' shape
    /// with a new dimension of size `depth` inserted at `axis` (an axis of the output);
    /// dtype of `values`. Indices may be any numeric type (truncated to integers);
    /// negative ones in `[-depth, 0)` count from the end, others out of range give a
    /// row of `off`.
    OneHot { axis: usize, depth: usize },
    /// Coordinates of the non-zero elements, i64 `[rank, count]`, in row-major order.
    NonZero { count: Dim },
    /// Inputs `(data, condition)` with `condition` 1-D bool: keeps the slices along
    /// `axis` (or elements of the flattened data when `axis` is `None`) where condition
    /// is true. `count` is the number kept.
    Compress { axis: Option<usize>, count: Dim },
    /// Inputs `(data, sequence_lens)`: for each batch index `b` (along `batch_axis`), the
    /// first `sequence_lens[b]` elements along `time_axis` are reversed.
    ReverseSequence { batch_axis: usize, time_axis: usize },
    /// Unique elements (or slices along `axis`). Outputs: `Y` (data's dtype; `count`
    /// elements or slices), `indices` (first occurrence, i64 `[count]`),
    /// `inverse_indices` (i64, one per input element or slice) and `counts`
    /// (i64 `[count]`). `sorted`: ascending order, else order of first occurrence.
    Unique { axis: Option<usize>, sorted: bool, count: Dim },
    /// Inputs `(past_cache, update, write_indices)` (ONNX TensorScatter, opset 24):
    /// `update` has past's shape except along `axis` (>= 1, not larger); for each
    /// prefix index `p` (dims before `axis`), update slices go to positions
    /// `write_indices[p0] + s` along `axis` (modulo its size when `circular`).
    TensorScatter { axis: usize, circular: bool },
    /// Inputs `(boxes [B, N, 4], scores [B, C, N])`; output i64 `[count, 3]` rows
    /// `(batch, class, box)`. Boxes are `[y1, x1, y2, x2]` corners or, with
    /// `center_point_box`, `[x_center, y_center, width, height]`.
    NonMaxSuppression {
        center_point_box: bool,
        max_output_boxes_per_class: usize,
        iou_threshold: f32,
        score_threshold: Option<f32>,
        count: Dim,
    },
    /// Inputs `(X [N, C, H, W], rois [R, 4] as (x1, y1, x2, y2), batch_indices [R])`;
    /// output `[R, C, output_height, output_width]`. `half_pixel` shifts ROI
    /// coordinates by -0.5 (ONNX `coordinate_transformation_mode = half_pixel`);
    /// `sampling_ratio` 0 means adaptive.
    RoiAlign {
        mode: RoiPoolMode,
        output_height: usize,
        output_width: usize,
        sampling_ratio: usize,
        spatial_scale: f32,
        half_pixel: bool,
    },
    /// Inputs `(X [N, C, H, W], rois [R, 5] as (batch, x1, y1, x2, y2))`; output
    /// `[R, C, pooled_h, pooled_w]`: max over each bin of the (rounded, scaled) ROI.
    MaxRoiPool { pooled_h: usize, pooled_w: usize, spatial_scale: f32 },
}

fn expect_int(t: &TensorType, what: &str) -> Result<(), String> {
    if !t.dtype.is_int() {
        return Err(format!("{what} must be integers, got {}", t.dtype));
    }
    Ok(())
}

fn expect_float(t: &TensorType, what: &str) -> Result<(), String> {
    if !t.dtype.is_float() {
        return Err(format!("{what} must be floating point, got {}", t.dtype));
    }
    Ok(())
}

fn expect_rank(t: &TensorType, r: usize, what: &str) -> Result<(), String> {
    if t.rank() != r {
        return Err(format!("{what} must have rank {r}, has rank {}", t.rank()));
    }
    Ok(())
}

/// Dims that must agree: equal, or either symbolic (checked at run time).
fn dims_compatible(a: Dim, b: Dim) -> bool {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x == y,
        _ => true,
    }
}

/// `a` must not exceed `b` when both are fixed.
fn dim_at_most(a: Dim, b: Dim) -> bool {
    match (a, b) {
        (Dim::Fixed(x), Dim::Fixed(y)) => x <= y,
        _ => true,
    }
}

/// The fixed size of the last dimension of an index tensor (GatherND / ScatterND).
fn index_depth(i: &TensorType, cx: &InferCtx) -> Result<usize, String> {
    match i.shape.last() {
        None => Err("indices must have rank >= 1".into()),
        Some(Dim::Fixed(k)) => Ok(*k),
        Some(d) => Err(format!("the last dimension of indices must be fixed, is {}", cx.syms.display(*d))),
    }
}

impl OpInfo for IndexOp {
    fn name(&self) -> &'static str {
        match self {
            IndexOp::Gather { .. } => "gather",
            IndexOp::GatherElements { .. } => "gather_elements",
            IndexOp::GatherND { .. } => "gather_nd",
            IndexOp::ScatterElements { .. } => "scatter_elements",
            IndexOp::ScatterND { .. } => "scatter_nd",
            IndexOp::OneHot { .. } => "one_hot",
            IndexOp::NonZero { .. } => "nonzero",
            IndexOp::Compress { .. } => "compress",
            IndexOp::ReverseSequence { .. } => "reverse_sequence",
            IndexOp::Unique { .. } => "unique",
            IndexOp::TensorScatter { .. } => "tensor_scatter",
            IndexOp::NonMaxSuppression { .. } => "non_max_suppression",
            IndexOp::RoiAlign { .. } => "roi_align",
            IndexOp::MaxRoiPool { .. } => "max_roi_pool",
        }
    }

    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            IndexOp::Gather { axis } => {
                expect_arity(inputs, 2)?;
                let (d, i) = (inputs[0], inputs[1]);
                let axis = *axis;
                if axis >= d.rank() {
                    return Err(format!("axis {axis} out of range for data of rank {}", d.rank()));
                }
                expect_int(i, "indices")?;
                let mut shape = d.shape[..axis].to_vec();
                shape.extend_from_slice(&i.shape);
                shape.extend_from_slice(&d.shape[axis + 1..]);
                Ok(vec![TensorType::new(d.dtype, shape)])
            }
            IndexOp::GatherElements { axis } => {
                expect_arity(inputs, 2)?;
                let (d, i) = (inputs[0], inputs[1]);
                if *axis >= d.rank() {
                    return Err(format!("axis {axis} out of range for data of rank {}", d.rank()));
                }
                expect_int(i, "indices")?;
                expect_rank(i, d.rank(), "indices (same as data)")?;
                for k in 0..d.rank() {
                    if k != *axis && !dim_at_most(i.shape[k], d.shape[k]) {
                        return Err(format!(
                            "indices shape {} exceeds data shape {} in dimension {k}",
                            fmt_dims(&i.shape, cx.syms),
                            fmt_dims(&d.shape, cx.syms)
                        ));
                    }
                }
                Ok(vec![TensorType::new(d.dtype, i.shape.clone())])
            }
            IndexOp::GatherND { batch_dims } => {
                expect_arity(inputs, 2)?;
                let (d, i) = (inputs[0], inputs[1]);
                expect_int(i, "indices")?;
                let b = *batch_dims;
                let k = index_depth(i, cx)?;
                if b >= i.rank() || b + k > d.rank() {
                    return Err(format!(
                        "batch_dims {b} with index depth {k} does not fit data of rank {} and indices of rank {}",
                        d.rank(),
                        i.rank()
                    ));
                }
                for x in 0..b {
                    if !dims_compatible(d.shape[x], i.shape[x]) {
                        return Err(format!(
                            "batch dimension {x} differs: data {} vs indices {}",
                            fmt_dims(&d.shape, cx.syms),
                            fmt_dims(&i.shape, cx.syms)
                        ));
                    }
                }
                let mut shape = i.shape[..i.rank() - 1].to_vec();
                shape.extend_from_slice(&d.shape[b + k..]);
                Ok(vec![TensorType::new(d.dtype, shape)])
            }
            IndexOp::ScatterElements { axis, .. } => {
                expect_arity(inputs, 3)?;
                let (d, i, u) = (inputs[0], inputs[1], inputs[2]);
                if *axis >= d.rank() {
                    return Err(format!("axis {axis} out of range for data of rank {}", d.rank()));
                }
                expect_int(i, "indices")?;
                expect_rank(i, d.rank(), "indices (same as data)")?;
                if u.dtype != d.dtype {
                    return Err(format!("updates must have data's dtype {}, got {}", d.dtype, u.dtype));
                }
                if u.rank() != i.rank() || !u.shape.iter().zip(&i.shape).all(|(&a, &b)| dims_compatible(a, b)) {
                    return Err(format!(
                        "updates shape {} must equal indices shape {}",
                        fmt_dims(&u.shape, cx.syms),
                        fmt_dims(&i.shape, cx.syms)
                    ));
                }
                for k in 0..d.rank() {
                    if k != *axis && !dim_at_most(i.shape[k], d.shape[k]) {
                        return Err(format!(
                            "indices shape {} exceeds data shape {} in dimension {k}",
                            fmt_dims(&i.shape, cx.syms),
                            fmt_dims(&d.shape, cx.syms)
                        ));
                    }
                }
                Ok(vec![d.clone()])
            }
            IndexOp::ScatterND { .. } => {
                expect_arity(inputs, 3)?;
                let (d, i, u) = (inputs[0], inputs[1], inputs[2]);
                expect_int(i, "indices")?;
                let k = index_depth(i, cx)?;
                if k > d.rank() {
                    return Err(format!("index depth {k} exceeds data rank {}", d.rank()));
                }
                if u.dtype != d.dtype {
                    return Err(format!("updates must have data's dtype {}, got {}", d.dtype, u.dtype));
                }
                let mut want = i.shape[..i.rank() - 1].to_vec();
                want.extend_from_slice(&d.shape[k..]);
                if u.rank() != want.len() || !u.shape.iter().zip(&want).all(|(&a, &b)| dims_compatible(a, b)) {
                    return Err(format!(
                        "updates shape {} must be {}",
                        fmt_dims(&u.shape, cx.syms),
                        fmt_dims(&want, cx.syms)
                    ));
                }
                Ok(vec![d.clone()])
            }
            IndexOp::OneHot { axis, depth } => {
                expect_arity(inputs, 2)?;
                let (i, v) = (inputs[0], inputs[1]);
                if i.dtype.is_bool() {
                    return Err("indices must be numeric, got bool".into());
                }
                if v.rank() != 1 || !dims_compatible(v.shape[0], Dim::Fixed(2)) {
                    return Err(format!("values must be [off, on] of shape [2], got {}", fmt_dims(&v.shape, cx.syms)));
                }
                if *axis > i.rank() {
                    return Err(format!("axis {axis} out of range for output of rank {}", i.rank() + 1));
                }
                let mut shape = i.shape.clone();
                shape.insert(*axis, Dim::Fixed(*depth));
                Ok(vec![TensorType::new(v.dtype, shape)])
            }
            IndexOp::NonZero { count } => {
                expect_arity(inputs, 1)?;
                Ok(vec![TensorType::new(DType::I64, vec![Dim::Fixed(inputs[0].rank()), *count])])
            }
            IndexOp::Compress { axis, count } => {
                expect_arity(inputs, 2)?;
                let (d, c) = (inputs[0], inputs[1]);
                if c.dtype != DType::Bool || c.rank() != 1 {
                    return Err(format!(
                        "condition must be a 1-D bool tensor, got {} of shape {}",
                        c.dtype,
                        fmt_dims(&c.shape, cx.syms)
                    ));
                }
                match axis {
                    None => Ok(vec![TensorType::new(d.dtype, vec![*count])]),
                    Some(a) => {
                        if *a >= d.rank() {
                            return Err(format!("axis {a} out of range for data of rank {}", d.rank()));
                        }
                        let mut shape = d.shape.clone();
                        shape[*a] = *count;
                        Ok(vec![TensorType::new(d.dtype, shape)])
                    }
                }
            }
            IndexOp::ReverseSequence { batch_axis, time_axis } => {
                expect_arity(inputs, 2)?;
                let (d, l) = (inputs[0], inputs[1]);
                if d.rank() < 2 {
                    return Err(format!("data must have rank >= 2, has rank {}", d.rank()));
                }
                if *batch_axis > 1 || *time_axis > 1 || batch_axis == time_axis {
                    return Err(format!(
                        "batch_axis ({batch_axis}) and time_axis ({time_axis}) must be 0 and 1 in some order"
                    ));
                }
                expect_int(l, "sequence_lens")?;
                expect_rank(l, 1, "sequence_lens")?;
                if !dims_compatible(l.shape[0], d.shape[*batch_axis]) {
                    return Err(format!(
                        "sequence_lens has {} entries, the batch dimension is {}",
                        cx.syms.display(l.shape[0]),
                        cx.syms.display(d.shape[*batch_axis])
                    ));
                }
                Ok(vec![d.clone()])
            }
            IndexOp::Unique { axis, count, .. } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                let (y, n) = match axis {
                    None => (vec![*count], dims_product(&x.shape, cx.syms)),
                    Some(a) => {
                        if *a >= x.rank() {
                            return Err(format!("axis {a} out of range for rank {}", x.rank()));
                        }
                        let mut s = x.shape.clone();
                        s[*a] = *count;
                        (s, x.shape[*a])
                    }
                };
                Ok(vec![
                    TensorType::new(x.dtype, y),
                    TensorType::new(DType::I64, vec![*count]),
                    TensorType::new(DType::I64, vec![n]),
                    TensorType::new(DType::I64, vec![*count]),
                ])
            }
            IndexOp::TensorScatter { axis, .. } => {
                expect_arity(inputs, 3)?;
                let (p, u, w) = (inputs[0], inputs[1], inputs[2]);
                if *axis == 0 || *axis >= p.rank() {
                    return Err(format!("axis {axis} must be in [1, {}) (0 is the batch dimension)", p.rank()));
                }
                if u.dtype != p.dtype {
                    return Err(format!("update must have past_cache's dtype {}, got {}", p.dtype, u.dtype));
                }
                let bad = || {
                    format!(
                        "update shape {} does not fit past_cache shape {} (equal except along axis {axis}, not larger there)",
                        fmt_dims(&u.shape, cx.syms),
                        fmt_dims(&p.shape, cx.syms)
                    )
                };
                if u.rank() != p.rank() {
                    return Err(bad());
                }
                for k in 0..p.rank() {
                    let ok = if k == *axis {
                        dim_at_most(u.shape[k], p.shape[k])
                    } else {
                        dims_compatible(u.shape[k], p.shape[k])
                    };
                    if !ok {
                        return Err(bad());
                    }
                }
                expect_int(w, "write_indices")?;
                expect_rank(w, 1, "write_indices")?;
                if !dims_compatible(w.shape[0], p.shape[0]) {
                    return Err(format!(
                        "write_indices has {} entries, the batch dimension is {}",
                        cx.syms.display(w.shape[0]),
                        cx.syms.display(p.shape[0])
                    ));
                }
                Ok(vec![p.clone()])
            }
            IndexOp::NonMaxSuppression { count, .. } => {
                expect_arity(inputs, 2)?;
                let (b, s) = (inputs[0], inputs[1]);
                expect_float(b, "boxes")?;
                expect_float(s, "scores")?;
                expect_rank(b, 3, "boxes [batch, boxes, 4]")?;
                expect_rank(s, 3, "scores [batch, classes, boxes]")?;
                if !dims_compatible(b.shape[2], Dim::Fixed(4))
                    || !dims_compatible(b.shape[0], s.shape[0])
                    || !dims_compatible(b.shape[1], s.shape[2])
                {
                    return Err(format!(
                        "boxes {} and scores {} must be [batch, boxes, 4] and [batch, classes, boxes]",
                        fmt_dims(&b.shape, cx.syms),
                        fmt_dims(&s.shape, cx.syms)
                    ));
                }
                Ok(vec![TensorType::new(DType::I64, vec![*count, Dim::Fixed(3)])])
            }
            IndexOp::RoiAlign { output_height, output_width, .. } => {
                expect_arity(inputs, 3)?;
                let (x, r, bi) = (inputs[0], inputs[1], inputs[2]);
                expect_float(x, "X")?;
                expect_rank(x, 4, "X [N, C, H, W]")?;
                if r.dtype != x.dtype {
                    return Err(format!("rois must have X's dtype {}, got {}", x.dtype, r.dtype));
                }
                expect_rank(r, 2, "rois [num_rois, 4]")?;
                if !dims_compatible(r.shape[1], Dim::Fixed(4)) {
                    return Err(format!("rois must be [num_rois, 4], got {}", fmt_dims(&r.shape, cx.syms)));
                }
                expect_int(bi, "batch_indices")?;
                expect_rank(bi, 1, "batch_indices")?;
                if !dims_compatible(bi.shape[0], r.shape[0]) {
                    return Err(format!(
                        "batch_indices {} and rois {} disagree on the number of rois",
                        fmt_dims(&bi.shape, cx.syms),
                        fmt_dims(&r.shape, cx.syms)
                    ));
                }
                let shape = vec![r.shape[0], x.shape[1], Dim::Fixed(*output_height), Dim::Fixed(*output_width)];
                Ok(vec![TensorType::new(x.dtype, shape)])
            }
            IndexOp::MaxRoiPool { pooled_h, pooled_w, .. } => {
                expect_arity(inputs, 2)?;
                let (x, r) = (inputs[0], inputs[1]);
                expect_float(x, "X")?;
                expect_rank(x, 4, "X [N, C, H, W]")?;
                if r.dtype != x.dtype {
                    return Err(format!("rois must have X's dtype {}, got {}", x.dtype, r.dtype));
                }
                expect_rank(r, 2, "rois [num_rois, 5]")?;
                if !dims_compatible(r.shape[1], Dim::Fixed(5)) {
                    return Err(format!("rois must be [num_rois, 5], got {}", fmt_dims(&r.shape, cx.syms)));
                }
                let shape = vec![r.shape[0], x.shape[1], Dim::Fixed(*pooled_h), Dim::Fixed(*pooled_w)];
                Ok(vec![TensorType::new(x.dtype, shape)])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SymbolTable;

    fn infer(op: IndexOp, ins: &[TensorType], syms: &mut SymbolTable) -> Result<Vec<TensorType>, String> {
        let refs: Vec<&TensorType> = ins.iter().collect();
        op.infer(&refs, &mut InferCtx { syms })
    }

    #[test]
    fn gather_shapes_and_errors() {
        let mut s = SymbolTable::default();
        let d = TensorType::fixed(DType::F32, &[5, 4, 3]);
        let i = TensorType::fixed(DType::I32, &[2, 7]);
        let o = infer(IndexOp::Gather { axis: 1 }, &[d.clone(), i.clone()], &mut s).unwrap();
        assert_eq!(o[0], TensorType::fixed(DType::F32, &[5, 2, 7, 3]));
        assert!(infer(IndexOp::Gather { axis: 3 }, &[d.clone(), i], &mut s).is_err());
        let scalar = TensorType::fixed(DType::F32, &[]);
        assert!(infer(IndexOp::Gather { axis: 0 }, &[scalar, TensorType::fixed(DType::I64, &[])], &mut s).is_err());
        let fi = TensorType::fixed(DType::F32, &[2]);
        assert!(infer(IndexOp::Gather { axis: 0 }, &[d, fi], &mut s).is_err());
    }

    #[test]
    fn gather_nd_batch_dims() {
        let mut s = SymbolTable::default();
        let d = TensorType::fixed(DType::I32, &[2, 2, 2]);
        let i = TensorType::fixed(DType::I64, &[2, 1]);
        let o = infer(IndexOp::GatherND { batch_dims: 1 }, &[d.clone(), i], &mut s).unwrap();
        assert_eq!(o[0], TensorType::fixed(DType::I32, &[2, 2]));
        let i = TensorType::fixed(DType::I64, &[2, 1, 2]);
        let o = infer(IndexOp::GatherND { batch_dims: 0 }, &[d.clone(), i], &mut s).unwrap();
        assert_eq!(o[0], TensorType::fixed(DType::I32, &[2, 1, 2]));
        let i = TensorType::fixed(DType::I64, &[2, 4]);
        assert!(infer(IndexOp::GatherND { batch_dims: 0 }, &[d, i], &mut s).is_err());
    }

    #[test]
    fn data_dependent_counts_are_stable() {
        let mut s = SymbolTable::default();
        let c = Dim::Sym(s.fresh("nonzero"));
        let x = TensorType::fixed(DType::F32, &[2, 3]);
        let op = IndexOp::NonZero { count: c };
        let a = infer(op.clone(), &[x.clone()], &mut s).unwrap();
        let b = infer(op, &[x], &mut s).unwrap();
        assert_eq!(a, b);
        assert_eq!(a[0].shape, vec![Dim::Fixed(2), c]);
    }

    #[test]
    fn one_hot_inserts_depth() {
        let mut s = SymbolTable::default();
        let i = TensorType::fixed(DType::I64, &[2, 3]);
        let v = TensorType::fixed(DType::F16, &[2]);
        let o = infer(IndexOp::OneHot { axis: 1, depth: 10 }, &[i.clone(), v.clone()], &mut s).unwrap();
        assert_eq!(o[0], TensorType::fixed(DType::F16, &[2, 10, 3]));
        assert!(infer(IndexOp::OneHot { axis: 3, depth: 10 }, &[i, v], &mut s).is_err());
    }

    #[test]
    fn unique_outputs() {
        let mut s = SymbolTable::default();
        let c = Dim::Sym(s.fresh("unique"));
        let x = TensorType::fixed(DType::F32, &[3, 4]);
        let o = infer(IndexOp::Unique { axis: Some(1), sorted: true, count: c }, &[x.clone()], &mut s).unwrap();
        assert_eq!(o[0].shape, vec![Dim::Fixed(3), c]);
        assert_eq!(o[2], TensorType::fixed(DType::I64, &[4]));
        let o = infer(IndexOp::Unique { axis: None, sorted: true, count: c }, &[x], &mut s).unwrap();
        assert_eq!(o[2], TensorType::fixed(DType::I64, &[12]));
    }
}
