//! Elementwise ops: unary functions, broadcasting binary functions, quantization.

use super::{broadcast_shapes, expect_arity, InferCtx, OpInfo};
use crate::{DType, Dim, TensorType};

/// Elementwise unary functions. Parameters are f32 as in ONNX.
#[derive(Clone, Debug, PartialEq)]
pub enum UnaryOp {
    Abs,
    Neg,
    Exp,
    Log,
    Sqrt,
    Reciprocal,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Tanh,
    Sigmoid,
    Relu,
    Erf,
    Floor,
    Ceil,
    /// Round half to even.
    Round,
    Sign,
    Not,
    BitwiseNot,
    IsNaN,
    IsInf {
        detect_negative: bool,
        detect_positive: bool,
    },
    Softplus,
    Softsign,
    Mish,
    Gelu {
        tanh_approx: bool,
    },
    LeakyRelu {
        alpha: f32,
    },
    Elu {
        alpha: f32,
    },
    Selu {
        alpha: f32,
        gamma: f32,
    },
    Celu {
        alpha: f32,
    },
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    HardSwish,
    ThresholdedRelu {
        alpha: f32,
    },
    Shrink {
        lambd: f32,
        bias: f32,
    },
    Swish {
        alpha: f32,
    },
    /// Reinterprets the bits of each element as `to` (same byte size).
    BitCast {
        to: DType,
    },
}

impl OpInfo for UnaryOp {
    fn name(&self) -> &'static str {
        use UnaryOp::*;
        match self {
            Abs => "abs",
            Neg => "neg",
            Exp => "exp",
            Log => "log",
            Sqrt => "sqrt",
            Reciprocal => "reciprocal",
            Sin => "sin",
            Cos => "cos",
            Tan => "tan",
            Asin => "asin",
            Acos => "acos",
            Atan => "atan",
            Sinh => "sinh",
            Cosh => "cosh",
            Asinh => "asinh",
            Acosh => "acosh",
            Atanh => "atanh",
            Tanh => "tanh",
            Sigmoid => "sigmoid",
            Relu => "relu",
            Erf => "erf",
            Floor => "floor",
            Ceil => "ceil",
            Round => "round",
            Sign => "sign",
            Not => "not",
            BitwiseNot => "bitwise_not",
            IsNaN => "isnan",
            IsInf { .. } => "isinf",
            Softplus => "softplus",
            Softsign => "softsign",
            Mish => "mish",
            Gelu { .. } => "gelu",
            LeakyRelu { .. } => "leaky_relu",
            Elu { .. } => "elu",
            Selu { .. } => "selu",
            Celu { .. } => "celu",
            HardSigmoid { .. } => "hard_sigmoid",
            HardSwish => "hard_swish",
            ThresholdedRelu { .. } => "thresholded_relu",
            Shrink { .. } => "shrink",
            Swish { .. } => "swish",
            BitCast { .. } => "bitcast",
        }
    }

    fn infer(&self, inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        expect_arity(inputs, 1)?;
        let x = inputs[0];
        let dt = x.dtype;
        use UnaryOp::*;
        let out = match self {
            Not => {
                if dt != DType::Bool {
                    return Err(format!("expects bool, got {dt}"));
                }
                DType::Bool
            }
            BitwiseNot => {
                if !dt.is_int() {
                    return Err(format!("expects an integer type, got {dt}"));
                }
                dt
            }
            IsNaN | IsInf { .. } => {
                if !dt.is_float() {
                    return Err(format!("expects a float type, got {dt}"));
                }
                DType::Bool
            }
            BitCast { to } => {
                if to.size_bytes() != dt.size_bytes() {
                    return Err(format!("cannot bitcast {dt} to {to}: element sizes differ"));
                }
                *to
            }
            Abs | Neg | Sign | Relu | Shrink { .. } => {
                if dt == DType::Bool {
                    return Err("expects a numeric type, got bool".into());
                }
                dt
            }
            // Everything else is a real function of a float.
            _ => {
                if !dt.is_float() {
                    return Err(format!("expects a float type, got {dt}"));
                }
                dt
            }
        };
        Ok(vec![TensorType::new(out, x.shape.clone())])
    }
}

/// Elementwise binary functions with numpy broadcasting.
#[derive(Clone, Debug, PartialEq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Integer division truncates toward zero (C semantics), as ONNX specifies.
    Div,
    Pow,
    /// `fmod: false` is Python's sign-of-divisor modulo; `true` is C's fmod.
    Mod {
        fmod: bool,
    },
    Min,
    Max,
    And,
    Or,
    Xor,
    Equal,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
    BitShiftLeft,
    BitShiftRight,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
    /// `x < 0 ? slope * x : x`.
    PRelu,
}

impl BinaryOp {
    pub fn is_comparison(&self) -> bool {
        use BinaryOp::*;
        matches!(self, Equal | Less | LessOrEqual | Greater | GreaterOrEqual)
    }
    pub fn is_logical(&self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }
}

impl OpInfo for BinaryOp {
    fn name(&self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Pow => "pow",
            Mod { .. } => "mod",
            Min => "min",
            Max => "max",
            And => "and",
            Or => "or",
            Xor => "xor",
            Equal => "equal",
            Less => "less",
            LessOrEqual => "less_equal",
            Greater => "greater",
            GreaterOrEqual => "greater_equal",
            BitShiftLeft => "shl",
            BitShiftRight => "shr",
            BitwiseAnd => "bitwise_and",
            BitwiseOr => "bitwise_or",
            BitwiseXor => "bitwise_xor",
            PRelu => "prelu",
        }
    }

    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        expect_arity(inputs, 2)?;
        let (a, b) = (inputs[0], inputs[1]);
        // Pow allows a different exponent type; everything else needs equal dtypes.
        if *self != BinaryOp::Pow && a.dtype != b.dtype {
            return Err(format!("operand dtypes differ: {} vs {}", a.dtype, b.dtype));
        }
        use BinaryOp::*;
        let out = match self {
            Pow => {
                if a.dtype == DType::Bool || b.dtype == DType::Bool {
                    return Err(format!("expects numeric operands, got {} and {}", a.dtype, b.dtype));
                }
                a.dtype
            }
            And | Or | Xor => {
                if a.dtype != DType::Bool {
                    return Err(format!("expects bool operands, got {}", a.dtype));
                }
                DType::Bool
            }
            BitShiftLeft | BitShiftRight | BitwiseAnd | BitwiseOr | BitwiseXor => {
                if !a.dtype.is_int() {
                    return Err(format!("expects integer operands, got {}", a.dtype));
                }
                a.dtype
            }
            Equal | Less | LessOrEqual | Greater | GreaterOrEqual => DType::Bool,
            _ => a.dtype,
        };
        let shape = broadcast_shapes(&a.shape, &b.shape, cx.syms)?;
        Ok(vec![TensorType::new(out, shape)])
    }
}

/// Linear quantization with per-tensor, per-axis or blocked scales.
///
/// The granularity follows from the scale's shape: one element (scalar or `[1]`) is
/// per-tensor; with `block_size > 0` the scale has the input's shape except along
/// `axis`, where it has `ceil(dim / block_size)` elements; otherwise it is a 1-D tensor
/// of the input's `axis` dimension (per-axis). `zero_point` has the scale's shape or a
/// single element. `axis` is normalized (non-negative) at import.
#[derive(Clone, Debug, PartialEq)]
pub enum QuantOp {
    /// `y = saturate(round_half_even(x / scale) + zero_point)`; inputs: x, scale,
    /// zero_point (the importer materializes a zero `zero_point` of type `to` when
    /// absent). For fp8 targets `y = cast(x / scale)` (saturating when `saturate`).
    QuantizeLinear { axis: usize, block_size: usize, saturate: bool, to: DType },
    /// `y = (x - zero_point) * scale`; inputs: x, scale, zero_point.
    DequantizeLinear { axis: usize, block_size: usize, to: DType },
    /// u8 quantization with a scale and zero point computed from the data's range:
    /// input x (f32); outputs y (u8, x's shape), y_scale (f32 scalar), y_zero_point
    /// (u8 scalar).
    DynamicQuantizeLinear,
}

fn is_quant_storage(dt: DType) -> bool {
    matches!(dt, DType::U8 | DType::I8 | DType::U16 | DType::I16 | DType::I32 | DType::F8E4M3 | DType::F8E5M2)
}

/// Checks a scale / zero-point shape against the input's for the granularity rules.
fn check_param_shape(what: &str, x: &TensorType, p: &TensorType, axis: usize, block_size: usize) -> Result<(), String> {
    let single = p.rank() <= 1 && p.shape.iter().all(|d| *d == Dim::Fixed(1));
    if single {
        return Ok(());
    }
    if axis >= x.rank() {
        return Err(format!("axis {axis} out of range for rank {}", x.rank()));
    }
    if block_size == 0 {
        if p.rank() != 1 {
            return Err(format!("per-axis {what} must be 1-D, got rank {}", p.rank()));
        }
        match (p.shape[0], x.shape[axis]) {
            (Dim::Fixed(a), Dim::Fixed(b)) if a != b => {
                Err(format!("per-axis {what} has {a} elements, input dimension {axis} is {b}"))
            }
            _ => Ok(()),
        }
    } else {
        if p.rank() != x.rank() {
            return Err(format!("blocked {what} must have the input's rank {}, got {}", x.rank(), p.rank()));
        }
        for (k, (&pd, &xd)) in p.shape.iter().zip(&x.shape).enumerate() {
            if let (Dim::Fixed(a), Dim::Fixed(b)) = (pd, xd) {
                let want = if k == axis { b.div_ceil(block_size) } else { b };
                if a != want {
                    return Err(format!(
                        "blocked {what} dimension {k} is {a}, expected {want} (input {b}, block size {block_size})"
                    ));
                }
            }
        }
        Ok(())
    }
}

impl OpInfo for QuantOp {
    fn name(&self) -> &'static str {
        match self {
            QuantOp::QuantizeLinear { .. } => "quantize_linear",
            QuantOp::DequantizeLinear { .. } => "dequantize_linear",
            QuantOp::DynamicQuantizeLinear => "dynamic_quantize_linear",
        }
    }

    fn infer(&self, inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            QuantOp::QuantizeLinear { axis, block_size, to, .. } => {
                expect_arity(inputs, 3)?;
                let (x, s, z) = (inputs[0], inputs[1], inputs[2]);
                if !(x.dtype.is_float() || x.dtype == DType::I32) {
                    return Err(format!("input must be float or i32, got {}", x.dtype));
                }
                if !s.dtype.is_float() {
                    return Err(format!("scale must be float, got {}", s.dtype));
                }
                if z.dtype != *to || !is_quant_storage(*to) {
                    return Err(format!("zero point must have the quantized type {to}, got {}", z.dtype));
                }
                check_param_shape("scale", x, s, *axis, *block_size)?;
                check_param_shape("zero point", x, z, *axis, *block_size)?;
                Ok(vec![TensorType::new(*to, x.shape.clone())])
            }
            QuantOp::DequantizeLinear { axis, block_size, to } => {
                expect_arity(inputs, 3)?;
                let (x, s, z) = (inputs[0], inputs[1], inputs[2]);
                if !is_quant_storage(x.dtype) {
                    return Err(format!("input must be a quantized type, got {}", x.dtype));
                }
                if !s.dtype.is_float() || !to.is_float() {
                    return Err(format!("scale and output must be float, got {} and {to}", s.dtype));
                }
                if z.dtype != x.dtype {
                    return Err(format!("zero point must have the input's type {}, got {}", x.dtype, z.dtype));
                }
                check_param_shape("scale", x, s, *axis, *block_size)?;
                check_param_shape("zero point", x, z, *axis, *block_size)?;
                Ok(vec![TensorType::new(*to, x.shape.clone())])
            }
            QuantOp::DynamicQuantizeLinear => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                if x.dtype != DType::F32 {
                    return Err(format!("input must be f32, got {}", x.dtype));
                }
                Ok(vec![
                    TensorType::new(DType::U8, x.shape.clone()),
                    TensorType::new(DType::F32, vec![]),
                    TensorType::new(DType::U8, vec![]),
                ])
            }
        }
    }
}
