//! ONNX mappings for the source family: ConstantOfShape, Range, EyeLike.

use super::{ImportError, MapFn, NodeCx, ShapeElem};
use tilec_ir::op::{range_len, SourceOp};
use tilec_ir::{Dim, Op, SymExpr, Tensor, ValueId};

/// Ranges up to this length with constant operands become constants at import.
const MAX_FOLDED_RANGE: usize = 1 << 20;

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
        return Ok(vec![range_const(cx, [&a, &b, &c], [s, l, d])?]);
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

/// Range on constant scalars: a constant when short, else a `range` op of fixed length
/// (evaluated when the model runs; the graph's size check rejects what cannot exist).
fn range_const(cx: &mut NodeCx, args: [&Tensor; 3], inputs: [ValueId; 3]) -> Result<ValueId, ImportError> {
    let dt = args[0].dtype();
    if args.iter().any(|t| t.dtype() != dt) {
        return Err(cx.invalid("range operands differ in dtype"));
    }
    if args.iter().any(|t| t.numel() != 1) {
        return Err(cx.invalid("range operands must be scalars"));
    }
    let ints = args.map(|t| t.to_i64_vec()[0]);
    let floats = args.map(|t| t.to_f64_vec()[0]);
    let n = range_len(dt, ints, floats).map_err(|e| cx.invalid(e))?;
    if n > MAX_FOLDED_RANGE {
        return cx.emit1(Op::Source(SourceOp::Range { len: Dim::Fixed(n) }), &inputs);
    }
    let t = if dt.is_int() {
        let [s, _, d] = ints;
        let v: Vec<i64> = (0..n as i64).map(|i| s.wrapping_add(i.wrapping_mul(d))).collect();
        Tensor::from_i64s(dt, vec![n], &v)
    } else {
        let [s, _, d] = floats;
        let v: Vec<f64> = (0..n).map(|i| s + i as f64 * d).collect();
        Tensor::from_f64s(dt, vec![n], &v)
    };
    Ok(cx.constant(t.map_err(|e| cx.invalid(e.to_string()))?))
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
