//! ONNX mappings for the source family: ConstantOfShape, Range, EyeLike.

use super::{ImportError, MapFn, NodeCx, ShapeElem};
use tilec_ir::op::SourceOp;
use tilec_ir::{Dim, Op, SymExpr, Tensor, ValueId};

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    Some(match op_type {
        "ConstantOfShape" => map_constant_of_shape,
        "Range" => map_range,
        "EyeLike" => map_eye_like,
        _ => return None,
    })
}

fn map_constant_of_shape(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let spec = cx.shape_input(0, "output shape")?;
    let mut shape = Vec::with_capacity(spec.len());
    for e in spec {
        shape.push(match e {
            ShapeElem::Int(n) if n >= 0 => Dim::Fixed(n as usize),
            ShapeElem::Int(n) => return Err(cx.invalid(format!("negative dimension {n}"))),
            ShapeElem::Sym(s) => Dim::Sym(s),
        });
    }
    let value = match cx.attr_t("value")? {
        Some(t) => {
            if t.numel() != 1 {
                return Err(cx.invalid(format!("value must have one element, has {}", t.numel())));
            }
            t.reshaped(vec![]).map_err(|e| cx.invalid(e.to_string()))?
        }
        None => Tensor::scalar(0.0f32),
    };
    // Small fixed results become constants; everything else stays a fill op.
    if let Some(n) = shape.iter().map(|d| d.fixed()).collect::<Option<Vec<usize>>>() {
        let total = n.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if total.is_none() {
            return Err(cx.invalid(format!("shape {n:?} has more elements than this machine can address")));
        }
        if let Some(total) = total.filter(|&t| t <= 16) {
            let t = match value.dtype() {
                d if d.is_int() || d.is_bool() => Tensor::from_i64s(d, n, &vec![value.to_i64_vec()[0]; total]),
                d => Tensor::from_f64s(d, n, &vec![value.to_f64_vec()[0]; total]),
            }
            .map_err(|e| cx.invalid(e.to_string()))?;
            return Ok(vec![cx.constant(t)]);
        }
    }
    Ok(vec![cx.emit1(Op::Source(SourceOp::Fill { shape, value }), &[])?])
}

fn map_range(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let s = cx.req_input(0)?;
    let l = cx.req_input(1)?;
    let d = cx.req_input(2)?;
    // Constant operands fold to a constant (integer ranges of known values already
    // folded in layout::fold_shape_op).
    if let (Some(a), Some(b), Some(c)) = (cx.const_input(0), cx.const_input(1), cx.const_input(2)) {
        let (a, b, c) = (a.clone(), b.clone(), c.clone());
        let t = range_const(&a, &b, &c).map_err(|e| cx.invalid(e))?;
        return Ok(vec![cx.constant(t)]);
    }
    // `range(k, n, 1)` over a known (symbolic) size n has n - k elements (k <= n): the
    // position ids of transformer exports. Otherwise the length is data-dependent.
    let one = |c: Option<Vec<ShapeElem>>| c.and_then(|v| if v.len() == 1 { Some(v[0]) } else { None });
    let len = match (one(cx.contents(0)), one(cx.contents(1)), one(cx.contents(2))) {
        (Some(ShapeElem::Int(0)), Some(ShapeElem::Sym(n)), Some(ShapeElem::Int(1))) => Dim::Sym(n),
        (Some(ShapeElem::Int(k)), Some(ShapeElem::Sym(n)), Some(ShapeElem::Int(1))) if k > 0 => {
            let syms = &mut cx.graph_mut().syms;
            let m = syms.derive(SymExpr::Min(Dim::Sym(n), Dim::Fixed(k as usize)));
            syms.derive(SymExpr::Sub(Dim::Sym(n), m))
        }
        _ => Dim::Sym(cx.graph_mut().syms.fresh("range")),
    };
    Ok(vec![cx.emit1(Op::Source(SourceOp::Range { len }), &[s, l, d])?])
}

/// Range on constant scalars (same semantics as the reference kernel).
fn range_const(start: &Tensor, limit: &Tensor, delta: &Tensor) -> Result<Tensor, String> {
    let dt = start.dtype();
    if limit.dtype() != dt || delta.dtype() != dt {
        return Err("range operands differ in dtype".into());
    }
    if start.numel() != 1 || limit.numel() != 1 || delta.numel() != 1 {
        return Err("range operands must be scalars".into());
    }
    if dt.is_int() {
        let (s, l, d) = (start.to_i64_vec()[0], limit.to_i64_vec()[0], delta.to_i64_vec()[0]);
        if d == 0 {
            return Err("range delta is 0".into());
        }
        let span = l as i128 - s as i128;
        let n = if d > 0 { (span + d as i128 - 1).div_euclid(d as i128) } else { span.div_euclid(d as i128) };
        let n = n.max(0) as usize;
        let v: Vec<i64> = (0..n as i64).map(|i| s.wrapping_add(i.wrapping_mul(d))).collect();
        Tensor::from_i64s(dt, vec![n], &v).map_err(|e| e.to_string())
    } else {
        let (s, l, d) = (start.to_f64_vec()[0], limit.to_f64_vec()[0], delta.to_f64_vec()[0]);
        if d == 0.0 || !d.is_finite() {
            return Err(format!("range delta {d} must be finite and non-zero"));
        }
        let n = ((l - s) / d).ceil();
        if !n.is_finite() || n > 1e9 {
            return Err("range is too long".into());
        }
        let n = n.max(0.0) as usize;
        let v: Vec<f64> = (0..n).map(|i| s + i as f64 * d).collect();
        Tensor::from_f64s(dt, vec![n], &v).map_err(|e| e.to_string())
    }
}

fn map_eye_like(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let ty = cx.input_ty(0)?;
    let _ = x;
    if ty.rank() != 2 {
        return Err(cx.invalid(format!("EyeLike expects a rank-2 input, got rank {}", ty.rank())));
    }
    let dtype = cx.attr_dtype("dtype")?.unwrap_or(ty.dtype);
    let k = cx.attr_i("k", 0)?;
    Ok(vec![cx.emit1(Op::Source(SourceOp::Eye { rows: ty.shape[0], cols: ty.shape[1], k, dtype }), &[])?])
}
