//! Elementwise ops: unary functions, broadcasting binary functions, quantization.

use super::{broadcast_shapes, expect_arity, expect_arity_range, InferCtx, OpInfo};
use crate::{DType, TensorType};

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
    IsInf { detect_negative: bool, detect_positive: bool },
    Softplus,
    Softsign,
    Mish,
    Gelu { tanh_approx: bool },
    LeakyRelu { alpha: f32 },
    Elu { alpha: f32 },
    Selu { alpha: f32, gamma: f32 },
    Celu { alpha: f32 },
    HardSigmoid { alpha: f32, beta: f32 },
    HardSwish,
    ThresholdedRelu { alpha: f32 },
    Shrink { lambd: f32, bias: f32 },
    Swish { alpha: f32 },
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
            Abs | Neg | Sign | Relu => {
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
    Mod { fmod: bool },
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
#[derive(Clone, Debug, PartialEq)]
pub enum QuantOp {
    /// `y = saturate(round(x / scale) + zero_point)`; inputs: x, scale, zero_point
    /// (the importer materializes a zero `zero_point` of type `to` when absent).
    QuantizeLinear { axis: i64, block_size: i64, saturate: bool, to: DType },
    /// `y = (x - zero_point) * scale`; inputs: x, scale, zero_point.
    DequantizeLinear { axis: i64, block_size: i64, to: DType },
}

impl OpInfo for QuantOp {
    fn name(&self) -> &'static str {
        match self {
            QuantOp::QuantizeLinear { .. } => "quantize_linear",
            QuantOp::DequantizeLinear { .. } => "dequantize_linear",
        }
    }

    fn infer(&self, inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        expect_arity_range(inputs, 3, 3)?;
        let to = match self {
            QuantOp::QuantizeLinear { to, .. } => *to,
            QuantOp::DequantizeLinear { to, .. } => *to,
        };
        Ok(vec![TensorType::new(to, inputs[0].shape.clone())])
    }
}
