//! ONNX mappings for the elementwise family: unary and binary functions, variadic
//! Max/Min/Sum/Mean (binary chains), Clip (Max/Min), Dropout (inference identity),
//! Where, Cast/CastLike/BitCast and linear quantization.
//!
//! Binary ops and casts on integer tensors whose contents are known at import (shape
//! computations such as `Shape → Gather → Mul → Concat → Reshape`) also record their
//! folded contents, symbolically where a dimension is symbolic.

use super::{ImportError, MapFn, NodeCx, ShapeElem};
use tilec_ir::op::{norm_axis, BinaryOp, QuantOp, UnaryOp};
use tilec_ir::{DType, Dim, Op, SymExpr, Tensor, ValueId};

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    Some(match op_type {
        "Abs" | "Neg" | "Exp" | "Log" | "Sqrt" | "Reciprocal" | "Sin" | "Cos" | "Tan" | "Asin" | "Acos" | "Atan"
        | "Sinh" | "Cosh" | "Asinh" | "Acosh" | "Atanh" | "Tanh" | "Sigmoid" | "Relu" | "Erf" | "Floor" | "Ceil"
        | "Round" | "Sign" | "Not" | "BitwiseNot" | "IsNaN" | "IsInf" | "Softplus" | "Softsign" | "Mish" | "Gelu"
        | "LeakyRelu" | "Elu" | "Selu" | "Celu" | "HardSigmoid" | "HardSwish" | "ThresholdedRelu" | "Shrink"
        | "Swish" => map_unary,
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "And" | "Or" | "Xor" | "Equal" | "Less" | "LessOrEqual"
        | "Greater" | "GreaterOrEqual" | "BitShift" | "BitwiseAnd" | "BitwiseOr" | "BitwiseXor" | "PRelu" => map_binary,
        "Max" | "Min" | "Sum" | "Mean" => map_variadic,
        "Clip" => map_clip,
        "Dropout" => map_dropout,
        "Where" => map_where,
        "Cast" => map_cast,
        "CastLike" => map_castlike,
        "BitCast" => map_bitcast,
        "QuantizeLinear" => map_quantize,
        "DequantizeLinear" => map_dequantize,
        "DynamicQuantizeLinear" => map_dynamic_quantize,
        _ => return None,
    })
}

fn unary_op(cx: &NodeCx) -> Result<UnaryOp, ImportError> {
    use UnaryOp::*;
    Ok(match cx.op_type() {
        "Abs" => Abs,
        "Neg" => Neg,
        "Exp" => Exp,
        "Log" => Log,
        "Sqrt" => Sqrt,
        "Reciprocal" => Reciprocal,
        "Sin" => Sin,
        "Cos" => Cos,
        "Tan" => Tan,
        "Asin" => Asin,
        "Acos" => Acos,
        "Atan" => Atan,
        "Sinh" => Sinh,
        "Cosh" => Cosh,
        "Asinh" => Asinh,
        "Acosh" => Acosh,
        "Atanh" => Atanh,
        "Tanh" => Tanh,
        "Sigmoid" => Sigmoid,
        "Relu" => Relu,
        "Erf" => Erf,
        "Floor" => Floor,
        "Ceil" => Ceil,
        "Round" => Round,
        "Sign" => Sign,
        "Not" => Not,
        "BitwiseNot" => BitwiseNot,
        "IsNaN" => IsNaN,
        "IsInf" => IsInf {
            detect_negative: cx.attr_i("detect_negative", 1)? != 0,
            detect_positive: cx.attr_i("detect_positive", 1)? != 0,
        },
        "Softplus" => Softplus,
        "Softsign" => Softsign,
        "Mish" => Mish,
        "Gelu" => match cx.attr_s("approximate")?.as_deref().unwrap_or("none") {
            "none" => Gelu { tanh_approx: false },
            "tanh" => Gelu { tanh_approx: true },
            other => {
                return Err(cx.invalid(format!("attribute 'approximate' must be \"none\" or \"tanh\", got {other:?}")))
            }
        },
        "LeakyRelu" => LeakyRelu { alpha: cx.attr_f("alpha", 0.01)? },
        "Elu" => Elu { alpha: cx.attr_f("alpha", 1.0)? },
        "Selu" => Selu { alpha: cx.attr_f("alpha", 1.673_263_2)?, gamma: cx.attr_f("gamma", 1.050_701)? },
        "Celu" => Celu { alpha: cx.attr_f("alpha", 1.0)? },
        "HardSigmoid" => HardSigmoid { alpha: cx.attr_f("alpha", 0.2)?, beta: cx.attr_f("beta", 0.5)? },
        "HardSwish" => HardSwish,
        "ThresholdedRelu" => ThresholdedRelu { alpha: cx.attr_f("alpha", 1.0)? },
        "Shrink" => Shrink { lambd: cx.attr_f("lambd", 0.5)?, bias: cx.attr_f("bias", 0.0)? },
        "Swish" => Swish { alpha: cx.attr_f("alpha", 1.0)? },
        other => return Err(cx.unsupported(format!("no unary mapping for {other}"))),
    })
}

fn map_unary(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let op = unary_op(cx)?;
    let x = cx.req_input(0)?;
    Ok(vec![cx.emit1(Op::Unary(op), &[x])?])
}

fn binary_op(cx: &NodeCx) -> Result<BinaryOp, ImportError> {
    use BinaryOp::*;
    Ok(match cx.op_type() {
        "Add" => Add,
        "Sub" => Sub,
        "Mul" => Mul,
        "Div" => Div,
        "Pow" => Pow,
        "Mod" => Mod { fmod: cx.attr_i("fmod", 0)? != 0 },
        "And" => And,
        "Or" => Or,
        "Xor" => Xor,
        "Equal" => Equal,
        "Less" => Less,
        "LessOrEqual" => LessOrEqual,
        "Greater" => Greater,
        "GreaterOrEqual" => GreaterOrEqual,
        "BitShift" => match cx.attr_s("direction")?.as_deref() {
            Some("LEFT") => BitShiftLeft,
            Some("RIGHT") => BitShiftRight,
            Some(d) => {
                return Err(cx.invalid(format!("attribute 'direction' must be \"LEFT\" or \"RIGHT\", got {d:?}")))
            }
            None => return Err(cx.invalid("attribute 'direction' is required")),
        },
        "BitwiseAnd" => BitwiseAnd,
        "BitwiseOr" => BitwiseOr,
        "BitwiseXor" => BitwiseXor,
        "PRelu" => PRelu,
        other => return Err(cx.unsupported(format!("no binary mapping for {other}"))),
    })
}

fn map_binary(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let op = binary_op(cx)?;
    let a = cx.req_input(0)?;
    let b = cx.req_input(1)?;
    // Opsets before 7 broadcast only with `broadcast=1`, optionally aligned at `axis`.
    if cx.opset < 7 && cx.attr_i("broadcast", 0)? != 0 {
        if let Some(axis) = cx.attr_i_opt("axis")? {
            let (ra, rb) = (cx.ty(a).rank() as i64, cx.ty(b).rank() as i64);
            let axis = if axis < 0 { axis + ra } else { axis };
            if axis != ra - rb {
                return Err(cx.unsupported("legacy broadcast with an 'axis' that is not suffix-aligned"));
            }
        }
    }
    let out = cx.emit1(Op::Binary(op.clone()), &[a, b])?;
    fold_binary(cx, &op, a, b, out);
    Ok(vec![out])
}

/// Chains a variadic op into binary ops; one input is returned as is.
fn map_variadic(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let op = match cx.op_type() {
        "Max" => BinaryOp::Max,
        "Min" => BinaryOp::Min,
        _ => BinaryOp::Add,
    };
    let mut inputs = Vec::new();
    for i in 0..cx.n_inputs() {
        inputs.push(cx.req_input(i)?);
    }
    let Some((&first, rest)) = inputs.split_first() else {
        return Err(cx.invalid("expects at least one input"));
    };
    let mut acc = first;
    for &v in rest {
        let out = cx.emit1(Op::Binary(op.clone()), &[acc, v])?;
        fold_binary(cx, &op, acc, v, out);
        acc = out;
    }
    if cx.op_type() == "Mean" && inputs.len() > 1 {
        let dt = cx.ty(acc).dtype;
        if !dt.is_float() {
            return Err(cx.invalid(format!("Mean expects float inputs, got {dt}")));
        }
        let n = Tensor::from_f64s(dt, vec![], &[inputs.len() as f64]).map_err(|e| cx.invalid(e.to_string()))?;
        let n = cx.constant(n);
        acc = cx.emit1(Op::Binary(BinaryOp::Div), &[acc, n])?;
    }
    Ok(vec![acc])
}

/// A scalar constant of `dtype` holding `v`.
fn scalar_const(cx: &mut NodeCx, dtype: DType, v: f64) -> Result<ValueId, ImportError> {
    let t = Tensor::from_f64s(dtype, vec![], &[v]).map_err(|e| cx.invalid(e.to_string()))?;
    Ok(cx.constant(t))
}

/// Clip as `min(max(x, lo), hi)` with whichever bounds are given.
fn map_clip(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let dt = cx.ty(x).dtype;
    let (lo, hi) = if cx.opset < 11 {
        let lo = match cx.attr_f_opt("min")? {
            Some(v) => Some(scalar_const(cx, dt, v as f64)?),
            None => None,
        };
        let hi = match cx.attr_f_opt("max")? {
            Some(v) => Some(scalar_const(cx, dt, v as f64)?),
            None => None,
        };
        (lo, hi)
    } else {
        (cx.input(1), cx.input(2))
    };
    let mut y = x;
    for (bound, op, what) in [(lo, BinaryOp::Max, "min"), (hi, BinaryOp::Min, "max")] {
        if let Some(b) = bound {
            let bt = cx.ty(b).clone();
            if bt.rank() != 0 && bt.numel() != Some(1) {
                return Err(cx.invalid(format!("'{what}' must be a scalar, got rank {}", bt.rank())));
            }
            y = cx.emit1(Op::Binary(op), &[y, b])?;
        }
    }
    Ok(vec![y])
}

/// An all-true bool tensor with the shape of `x`.
fn all_true_like(cx: &mut NodeCx, x: ValueId) -> Result<ValueId, ImportError> {
    let ty = cx.ty(x).clone();
    if let Some(shape) = ty.fixed_shape() {
        let n: usize = shape.iter().product();
        let t = Tensor::from_vec(shape, vec![true; n]).map_err(|e| cx.invalid(e.to_string()))?;
        return Ok(cx.constant(t));
    }
    if !ty.dtype.is_float() {
        return Err(cx.unsupported("mask output of a non-float input with a symbolic shape"));
    }
    // x == x is false only for NaN.
    let eq = cx.emit1(Op::Binary(BinaryOp::Equal), &[x, x])?;
    let nan = cx.emit1(Op::Unary(UnaryOp::IsNaN), &[x])?;
    cx.emit1(Op::Binary(BinaryOp::Or), &[eq, nan])
}

/// Dropout at inference: the output is the input; the mask is all true (all ones of the
/// input's type before opset 10). Training mode with a non-zero ratio is unsupported.
fn map_dropout(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    if cx.opset >= 12 && cx.input(2).is_some() {
        let training = cx.const_ints(2, "training_mode")?;
        if training.first().copied().unwrap_or(0) != 0 {
            let ratio =
                if cx.input(1).is_some() { cx.const_floats(1, "ratio")?.first().copied().unwrap_or(0.5) } else { 0.5 };
            if ratio != 0.0 {
                return Err(cx.unsupported("training mode with a non-zero ratio (random output)"));
            }
        }
    }
    let mut outs = vec![x];
    if cx.node.output.get(1).is_some_and(|n| !n.is_empty()) {
        let mask = all_true_like(cx, x)?;
        let mask = if cx.opset < 10 {
            let dt = cx.ty(x).dtype;
            cx.emit1(Op::Cast { to: dt, saturate: true }, &[mask])?
        } else {
            mask
        };
        outs.push(mask);
    }
    Ok(outs)
}

fn map_where(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let c = cx.req_input(0)?;
    let a = cx.req_input(1)?;
    let b = cx.req_input(2)?;
    let out = cx.emit1(Op::Where, &[c, a, b])?;
    // Fold known contents (shape computations select between dimensions).
    if let (Some(cc), Some(ca), Some(cb)) = (cx.value_contents(c), cx.value_contents(a), cx.value_contents(b)) {
        if let Some(n) = folded_len(cx, out, &[cc.len(), ca.len(), cb.len()]) {
            let pick = |v: &[ShapeElem], k: usize| if v.len() == 1 { v[0] } else { v[k] };
            let mut res = Vec::with_capacity(n);
            for k in 0..n {
                match pick(&cc, k) {
                    ShapeElem::Int(0) => res.push(pick(&cb, k)),
                    ShapeElem::Int(_) => res.push(pick(&ca, k)),
                    ShapeElem::Sym(_) => return Ok(vec![out]),
                }
            }
            cx.set_contents(out, res);
        }
    }
    Ok(vec![out])
}

fn map_cast_to(cx: &mut NodeCx, to: DType) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let saturate = cx.attr_i("saturate", 1)? != 0;
    let from = cx.ty(x).dtype;
    let out = cx.emit1(Op::Cast { to, saturate }, &[x])?;
    // Integer shape values keep their contents through integer casts.
    if (from.is_int() || from.is_bool()) && to.is_int() {
        if let Some(c) = cx.value_contents(x) {
            cx.set_contents(out, c);
        }
    }
    Ok(vec![out])
}

fn map_cast(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    if let Some(mode) = cx.attr_s("round_mode")? {
        if mode != "up" {
            return Err(cx.unsupported(format!("round_mode {mode:?} (only for float8e8m0)")));
        }
    }
    let to = cx.attr_dtype("to")?.ok_or_else(|| cx.invalid("attribute 'to' is required"))?;
    map_cast_to(cx, to)
}

fn map_castlike(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let to = cx.input_ty(1)?.dtype;
    map_cast_to(cx, to)
}

fn map_bitcast(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let to = cx.attr_dtype("to")?.ok_or_else(|| cx.invalid("attribute 'to' is required"))?;
    let x = cx.req_input(0)?;
    Ok(vec![cx.emit1(Op::Unary(UnaryOp::BitCast { to }), &[x])?])
}

/// Normalizes the quantization axis; a single-element scale needs none.
fn quant_axis(cx: &NodeCx, x: ValueId, scale: ValueId) -> Result<usize, ImportError> {
    let axis = cx.attr_i("axis", 1)?;
    let st = cx.ty(scale);
    if st.rank() <= 1 && st.shape.iter().all(|d| *d == Dim::Fixed(1)) {
        return Ok(0);
    }
    norm_axis(axis, cx.ty(x).rank()).map_err(|e| cx.invalid(e))
}

fn quant_block(cx: &NodeCx) -> Result<usize, ImportError> {
    let b = cx.attr_i("block_size", 0)?;
    if b < 0 {
        return Err(cx.invalid(format!("block_size must be non-negative, got {b}")));
    }
    Ok(b as usize)
}

fn check_precision(cx: &NodeCx) -> Result<(), ImportError> {
    if cx.attr_i("precision", 0)? != 0 {
        return Err(cx.unsupported("attribute 'precision'"));
    }
    Ok(())
}

fn map_quantize(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    check_precision(cx)?;
    let x = cx.req_input(0)?;
    let scale = cx.req_input(1)?;
    let zp = cx.input(2);
    let out_dt = cx.attr_dtype("output_dtype")?;
    let to = match (zp, out_dt) {
        (Some(z), Some(o)) if cx.ty(z).dtype != o => {
            return Err(cx.invalid(format!("output_dtype {o} differs from the zero point's type {}", cx.ty(z).dtype)))
        }
        (Some(z), _) => cx.ty(z).dtype,
        (None, Some(o)) => o,
        (None, None) => DType::U8,
    };
    if !matches!(to, DType::U8 | DType::I8 | DType::U16 | DType::I16 | DType::F8E4M3 | DType::F8E5M2) {
        return Err(cx.unsupported(format!("quantized type {to}")));
    }
    let axis = quant_axis(cx, x, scale)?;
    let block_size = quant_block(cx)?;
    let saturate = cx.attr_i("saturate", 1)? != 0;
    let zp = match zp {
        Some(z) => z,
        None => cx.constant(Tensor::zeros(to, vec![])),
    };
    let op = QuantOp::QuantizeLinear { axis, block_size, saturate, to };
    Ok(vec![cx.emit1(Op::Quant(op), &[x, scale, zp])?])
}

fn map_dequantize(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    check_precision(cx)?;
    let x = cx.req_input(0)?;
    let scale = cx.req_input(1)?;
    let xdt = cx.ty(x).dtype;
    let to = match cx.attr_dtype("output_dtype")? {
        Some(o) => o,
        None => cx.ty(scale).dtype,
    };
    let axis = quant_axis(cx, x, scale)?;
    let block_size = quant_block(cx)?;
    let zp = match cx.input(2) {
        Some(z) => z,
        None => cx.constant(Tensor::zeros(xdt, vec![])),
    };
    let op = QuantOp::DequantizeLinear { axis, block_size, to };
    Ok(vec![cx.emit1(Op::Quant(op), &[x, scale, zp])?])
}

fn map_dynamic_quantize(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    cx.emit(Op::Quant(QuantOp::DynamicQuantizeLinear), &[x])
}

// ---- folding of known integer contents (shape computations) ----

/// The element count of a folded result: the output must be a fixed scalar or vector
/// and every operand a single element or of that length.
fn folded_len(cx: &NodeCx, out: ValueId, lens: &[usize]) -> Option<usize> {
    let ty = cx.ty(out);
    if !(ty.dtype.is_int() || ty.dtype.is_bool()) || ty.rank() > 1 {
        return None;
    }
    let n = ty.numel()?;
    if n > 64 || lens.iter().any(|&l| l != 1 && l != n) {
        return None;
    }
    Some(n)
}

fn fold_binary(cx: &mut NodeCx, op: &BinaryOp, a: ValueId, b: ValueId, out: ValueId) {
    let (Some(ca), Some(cb)) = (cx.value_contents(a), cx.value_contents(b)) else { return };
    let Some(n) = folded_len(cx, out, &[ca.len(), cb.len()]) else { return };
    let mut res = Vec::with_capacity(n);
    for k in 0..n {
        let x = if ca.len() == 1 { ca[0] } else { ca[k] };
        let y = if cb.len() == 1 { cb[0] } else { cb[k] };
        match fold_elem(cx, op, x, y) {
            Some(r) => res.push(r),
            None => return,
        }
    }
    cx.set_contents(out, res);
}

fn dim_of(e: ShapeElem) -> Option<Dim> {
    match e {
        ShapeElem::Int(v) if v >= 0 => Some(Dim::Fixed(v as usize)),
        ShapeElem::Int(_) => None,
        ShapeElem::Sym(s) => Some(Dim::Sym(s)),
    }
}

fn fold_elem(cx: &mut NodeCx, op: &BinaryOp, x: ShapeElem, y: ShapeElem) -> Option<ShapeElem> {
    use BinaryOp::*;
    use ShapeElem::{Int, Sym};
    let b = |v: bool| Some(Int(v as i64));
    if let (Int(p), Int(q)) = (x, y) {
        return match op {
            Add => p.checked_add(q).map(Int),
            Sub => p.checked_sub(q).map(Int),
            Mul => p.checked_mul(q).map(Int),
            Div => p.checked_div(q).map(Int),
            Max => Some(Int(p.max(q))),
            Min => Some(Int(p.min(q))),
            Equal => b(p == q),
            Less => b(p < q),
            LessOrEqual => b(p <= q),
            Greater => b(p > q),
            GreaterOrEqual => b(p >= q),
            And => b(p != 0 && q != 0),
            Or => b(p != 0 || q != 0),
            Xor => b((p != 0) != (q != 0)),
            _ => None,
        };
    }
    match op {
        // A dimension is never negative: comparisons against negative constants fold.
        Equal => match (x, y) {
            (Sym(s), Sym(t)) if s == t => b(true),
            (Sym(_), Int(v)) | (Int(v), Sym(_)) if v < 0 => b(false),
            _ => None,
        },
        Add | Sub | Mul | Div | Max | Min => {
            let (dx, dy) = (dim_of(x)?, dim_of(y)?);
            // `k - n` could be negative for a symbolic `n`: not a dimension.
            if *op == Sub && matches!((dx, dy), (Dim::Fixed(_), Dim::Sym(_))) {
                return None;
            }
            let e = match op {
                Add => SymExpr::Add(dx, dy),
                Sub => SymExpr::Sub(dx, dy),
                Mul => SymExpr::Mul(dx, dy),
                Div => {
                    if dy == Dim::Fixed(0) {
                        return None;
                    }
                    SymExpr::Div(dx, dy)
                }
                Max => SymExpr::Max(dx, dy),
                _ => SymExpr::Min(dx, dy),
            };
            Some(ShapeElem::from_dim(cx.graph_mut().syms.derive(e)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::Importer;
    use super::*;
    use crate::proto::{AttributeProto, ModelProto, NodeProto};
    use std::collections::HashMap;
    use tilec_ir::{Graph, TensorType};

    fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: format!("{op}_node"),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..Default::default()
        }
    }

    fn attr_f(name: &str, f: f32) -> AttributeProto {
        AttributeProto { name: name.into(), r#type: 1, f, ..Default::default() }
    }

    /// An importer with the given inputs (name, type, known contents) and constants.
    fn importer(
        opset: i64,
        inputs: &[(&str, TensorType, Option<Vec<ShapeElem>>)],
        consts: &[(&str, Tensor)],
    ) -> Importer {
        let mut imp = Importer {
            graph: Graph::new("t"),
            names: HashMap::new(),
            contents: HashMap::new(),
            opsets: HashMap::from([(String::new(), opset)]),
            node_counter: 0,
        };
        for (name, ty, c) in inputs {
            let v = imp.graph.add_input(name, ty.clone());
            imp.names.insert(name.to_string(), v);
            if let Some(c) = c {
                imp.contents.insert(v, c.clone());
            }
        }
        for (name, t) in consts {
            let v = imp.graph.add_const(name, t.clone());
            imp.names.insert(name.to_string(), v);
        }
        imp
    }

    fn run(imp: &mut Importer, nodes: &[NodeProto]) {
        let model = ModelProto::default();
        for (i, n) in nodes.iter().enumerate() {
            imp.import_node(n, i, &model).unwrap();
        }
    }

    fn ops(imp: &Importer) -> Vec<&'static str> {
        imp.graph.nodes().iter().map(|n| n.op.name()).collect()
    }

    #[test]
    fn clip_decomposes_into_max_min() {
        let x = TensorType::fixed(DType::F32, &[2, 3]);
        let lo = Tensor::scalar(0.0f32);
        let mut imp = importer(13, &[("x", x.clone(), None)], &[("lo", lo)]);
        run(&mut imp, &[node("Clip", &["x", "lo"], &["y"], vec![])]);
        assert_eq!(ops(&imp), vec!["max"]);
        // Opset 6: bounds are attributes.
        let mut imp = importer(6, &[("x", x, None)], &[]);
        run(&mut imp, &[node("Clip", &["x"], &["y"], vec![attr_f("min", -1.0), attr_f("max", 1.0)])]);
        assert_eq!(ops(&imp), vec!["max", "min"]);
        let y = imp.names["y"];
        assert_eq!(imp.graph.value(y).ty, TensorType::fixed(DType::F32, &[2, 3]));
    }

    #[test]
    fn variadic_ops_chain_and_mean_divides() {
        let ty = TensorType::fixed(DType::F16, &[3]);
        let ins = [("a", ty.clone(), None), ("b", ty.clone(), None), ("c", ty, None)];
        let mut imp = importer(13, &ins, &[]);
        run(&mut imp, &[node("Mean", &["a", "b", "c"], &["m"], vec![]), node("Max", &["a"], &["x"], vec![])]);
        assert_eq!(ops(&imp), vec!["add", "add", "div"]);
        // One input is the input itself.
        assert_eq!(imp.names["x"], imp.names["a"]);
        let div = &imp.graph.nodes()[2];
        let n = imp.graph.const_value(div.inputs[1]).unwrap();
        assert_eq!(n.to_f64_vec(), vec![3.0]);
        assert_eq!(n.dtype(), DType::F16);
    }

    #[test]
    fn quantize_materializes_a_zero_point_and_normalizes_axis() {
        let x = TensorType::fixed(DType::F32, &[2, 4]);
        let scale = Tensor::from_vec(vec![4], vec![1.0f32; 4]).unwrap();
        let mut imp = importer(21, &[("x", x, None)], &[("s", scale)]);
        let axis = AttributeProto { name: "axis".into(), r#type: 2, i: -1, ..Default::default() };
        run(&mut imp, &[node("QuantizeLinear", &["x", "s"], &["y"], vec![axis])]);
        let n = &imp.graph.nodes()[0];
        assert_eq!(n.op, Op::Quant(QuantOp::QuantizeLinear { axis: 1, block_size: 0, saturate: true, to: DType::U8 }));
        assert_eq!(imp.graph.const_value(n.inputs[2]).unwrap().dtype(), DType::U8);
    }

    #[test]
    fn shape_arithmetic_folds_symbolically() {
        let s_ty = TensorType::fixed(DType::I64, &[2]);
        let mut imp2 = importer(
            13,
            &[("s", s_ty, None)],
            &[
                ("two", Tensor::from_vec(vec![1], vec![2i64]).unwrap()),
                ("neg", Tensor::from_vec(vec![2], vec![-1i64, 3]).unwrap()),
                ("ones", Tensor::from_vec(vec![2], vec![1i64, 1]).unwrap()),
            ],
        );
        // `s` holds the shape [N, 3] of some tensor with a symbolic batch N.
        let n = imp2.graph.syms.free("N");
        imp2.contents.insert(imp2.names["s"], vec![ShapeElem::Sym(n), ShapeElem::Int(3)]);
        run(
            &mut imp2,
            &[
                node("Mul", &["s", "two"], &["m"], vec![]),
                node("Equal", &["s", "neg"], &["e"], vec![]),
                node("Where", &["e", "ones", "s"], &["w"], vec![]),
                node(
                    "Cast",
                    &["m"],
                    &["c"],
                    vec![AttributeProto { name: "to".into(), r#type: 2, i: 6, ..Default::default() }],
                ),
            ],
        );
        // Fully known results become constants; partly symbolic ones stay as contents.
        let get = |name: &str| {
            let v = imp2.names[name];
            imp2.contents.get(&v).cloned().or_else(|| {
                imp2.graph.const_value(v).map(|t| t.to_i64_vec().into_iter().map(ShapeElem::Int).collect())
            })
        };
        let m = get("m").unwrap();
        assert_eq!(m[1], ShapeElem::Int(6));
        let ShapeElem::Sym(d) = m[0] else { panic!("expected a symbolic product, got {m:?}") };
        let bound = HashMap::from([(n, 5usize)]);
        assert_eq!(imp2.graph.syms.eval(Dim::Sym(d), &bound), Some(10));
        // A dimension never equals -1; 3 == 3.
        assert_eq!(get("e").unwrap(), vec![ShapeElem::Int(0), ShapeElem::Int(1)]);
        assert_eq!(get("w").unwrap(), vec![ShapeElem::Sym(n), ShapeElem::Int(1)]);
        assert_eq!(get("c").unwrap(), m);
    }

    #[test]
    fn dropout_training_with_ratio_is_unsupported() {
        let x = TensorType::fixed(DType::F32, &[2]);
        let consts = [("r", Tensor::scalar(0.5f32)), ("t", Tensor::scalar(true))];
        let mut imp = importer(13, &[("x", x.clone(), None)], &consts);
        let err = imp.import_node(&node("Dropout", &["x", "r", "t"], &["y"], vec![]), 0, &ModelProto::default());
        assert!(matches!(err, Err(ImportError::Unsupported { .. })), "{err:?}");
        let mut imp = importer(13, &[("x", x, None)], &[]);
        run(&mut imp, &[node("Dropout", &["x"], &["y", "mask"], vec![])]);
        assert_eq!(imp.names["y"], imp.names["x"]);
        let mask = imp.graph.const_value(imp.names["mask"]).unwrap();
        assert_eq!(mask.as_slice::<bool>().unwrap(), &[true, true]);
    }
}
