//! Elementwise kernels: unary and broadcasting binary functions, `where`, casts and
//! linear quantization.
//!
//! Floats are computed in f64 and rounded once to the output type (for +, -, *, / and
//! sqrt that is exactly IEEE arithmetic in the narrower type). Integers are computed in
//! i128 and wrapped to the output type, so every integer type (u64 included) is exact and
//! overflow wraps as in C. Integer division or modulo by zero yields 0 (as numpy does).

use super::util::{broadcast, broadcast_index_map};
use half::{bf16, f16};
use tilec_ir::op::{BinaryOp, QuantOp, UnaryOp};
use tilec_ir::{dispatch, DType, Element, Tensor, TensorData, F8E4M3, F8E5M2};

// ---- element helpers ----

/// Rounds an f64 to f32 with round-to-odd, so that a second rounding to a narrower
/// format (f16, bf16) is a correct single rounding of the f64 value.
fn f64_to_f32_odd(x: f64) -> f32 {
    let f = x as f32;
    if !f.is_finite() || f as f64 == x {
        return f;
    }
    let mut bits = f.to_bits();
    if (f as f64).abs() > x.abs() {
        bits -= 1; // truncate toward zero (same sign, one ulp smaller in magnitude)
    }
    f32::from_bits(bits | 1)
}

/// Element types with a correctly rounded conversion from f64 (round to nearest even;
/// fp8 saturates; integers truncate toward zero and wrap; bool is `x != 0`).
trait Elem: Element {
    fn from_f64r(x: f64) -> Self;
}

impl Elem for f32 {
    fn from_f64r(x: f64) -> Self {
        x as f32
    }
}
impl Elem for f64 {
    fn from_f64r(x: f64) -> Self {
        x
    }
}
impl Elem for f16 {
    fn from_f64r(x: f64) -> Self {
        f16::from_f32(f64_to_f32_odd(x))
    }
}
impl Elem for bf16 {
    fn from_f64r(x: f64) -> Self {
        bf16::from_f32(f64_to_f32_odd(x))
    }
}
impl Elem for F8E4M3 {
    fn from_f64r(x: f64) -> Self {
        F8E4M3::from_f64(x, true)
    }
}
impl Elem for F8E5M2 {
    fn from_f64r(x: f64) -> Self {
        F8E5M2::from_f64(x, true)
    }
}
impl Elem for bool {
    fn from_f64r(x: f64) -> Self {
        x != 0.0
    }
}

/// Integer-like element types (bool counts as 0/1), computed in i128.
trait Int: Elem {
    const BITS: u32;
    fn to_i128(self) -> i128;
    /// Wraps (two's complement truncation); bool is `x != 0`.
    fn from_i128(x: i128) -> Self;
}

macro_rules! int_impl {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn from_f64r(x: f64) -> Self {
                if x.is_nan() { 0 } else { (x.trunc() as i128) as $t }
            }
        }
        impl Int for $t {
            const BITS: u32 = <$t>::BITS;
            fn to_i128(self) -> i128 { self as i128 }
            fn from_i128(x: i128) -> Self { x as $t }
        }
    )*};
}
int_impl!(i8, i16, i32, i64, u8, u16, u32, u64);

impl Int for bool {
    const BITS: u32 = 1;
    fn to_i128(self) -> i128 {
        self as i128
    }
    fn from_i128(x: i128) -> Self {
        x != 0
    }
}

/// Runs `$body` with `$v` bound to the slice of an integer or bool tensor; `$other`
/// for float tensors.
macro_rules! int_dispatch {
    ($data:expr, $v:ident => $body:expr, _ => $other:expr) => {
        match $data {
            TensorData::I8($v) => $body,
            TensorData::I16($v) => $body,
            TensorData::I32($v) => $body,
            TensorData::I64($v) => $body,
            TensorData::U8($v) => $body,
            TensorData::U16($v) => $body,
            TensorData::U32($v) => $body,
            TensorData::U64($v) => $body,
            TensorData::Bool($v) => $body,
            _ => $other,
        }
    };
}

/// The elements of an integer or bool tensor as i128 (`None` for floats).
fn to_i128_vec(t: &Tensor) -> Option<Vec<i128>> {
    int_dispatch!(t.data(), v => Some(v.iter().map(|&x| x.to_i128()).collect()), _ => None)
}

fn wrap_ints<T: Int>(v: &[i128]) -> TensorData {
    T::wrap(v.iter().map(|&x| T::from_i128(x)).collect())
}

fn round_f64s<T: Elem>(v: &[f64]) -> TensorData {
    T::wrap(v.iter().map(|&x| T::from_f64r(x)).collect())
}

/// Wraps i128 values into an integer dtype (`None` for floats).
fn ints_to_data(dt: DType, v: &[i128]) -> Option<TensorData> {
    Some(match dt {
        DType::I8 => wrap_ints::<i8>(v),
        DType::I16 => wrap_ints::<i16>(v),
        DType::I32 => wrap_ints::<i32>(v),
        DType::I64 => wrap_ints::<i64>(v),
        DType::U8 => wrap_ints::<u8>(v),
        DType::U16 => wrap_ints::<u16>(v),
        DType::U32 => wrap_ints::<u32>(v),
        DType::U64 => wrap_ints::<u64>(v),
        DType::Bool => wrap_ints::<bool>(v),
        _ => return None,
    })
}

/// Rounds f64 values to `dt` (see [`Elem`]); fp8 honours `saturate`.
fn f64s_to_data(dt: DType, v: &[f64], saturate: bool) -> TensorData {
    match dt {
        DType::F32 => round_f64s::<f32>(v),
        DType::F64 => round_f64s::<f64>(v),
        DType::F16 => round_f64s::<f16>(v),
        DType::BF16 => round_f64s::<bf16>(v),
        DType::F8E4M3 => TensorData::F8E4M3(v.iter().map(|&x| F8E4M3::from_f64(x, saturate)).collect()),
        DType::F8E5M2 => TensorData::F8E5M2(v.iter().map(|&x| F8E5M2::from_f64(x, saturate)).collect()),
        DType::I8 => round_f64s::<i8>(v),
        DType::I16 => round_f64s::<i16>(v),
        DType::I32 => round_f64s::<i32>(v),
        DType::I64 => round_f64s::<i64>(v),
        DType::U8 => round_f64s::<u8>(v),
        DType::U16 => round_f64s::<u16>(v),
        DType::U32 => round_f64s::<u32>(v),
        DType::U64 => round_f64s::<u64>(v),
        DType::Bool => round_f64s::<bool>(v),
    }
}

/// Rounds `x` to the precision of float dtype `dt` and back (identity for f64).
fn round_as(dt: DType, x: f64) -> f64 {
    match dt {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64r(x).to_f64(),
        DType::BF16 => bf16::from_f64r(x).to_f64(),
        DType::F8E4M3 => F8E4M3::from_f64(x, true).to_f64(),
        DType::F8E5M2 => F8E5M2::from_f64(x, true).to_f64(),
        _ => x,
    }
}

fn tensor(shape: Vec<usize>, data: TensorData) -> Result<Tensor, String> {
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

fn arg<'a>(args: &[&'a Tensor], i: usize, what: &str) -> Result<&'a Tensor, String> {
    args.get(i).copied().ok_or_else(|| format!("missing input {i} ({what})"))
}

// ---- scalar functions ----

/// The error function, to about 1e-16 relative: `erf(x) = 2/sqrt(pi) * exp(-x^2) *
/// sum_n (2x^2)^n x / (1*3*...*(2n+1))` (all terms positive, no cancellation);
/// `|erf(x)| = 1` in f64 beyond 6.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    while n < 400.0 {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
        if term.abs() <= sum.abs() * 1e-17 {
            break;
        }
    }
    std::f64::consts::FRAC_2_SQRT_PI * (-x2).exp() * sum
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn softplus(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// numpy's `maximum`/`minimum`: NaN propagates.
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// numpy's float `mod`: the result has the divisor's sign.
fn py_fmod(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m != 0.0 {
        if (b < 0.0) != (m < 0.0) {
            m + b
        } else {
            m
        }
    } else {
        0.0f64.copysign(b)
    }
}

/// Integer power with wrapping; negative exponents give the truncated reciprocal.
fn ipow(base: i128, exp: i128) -> i128 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut b, mut e, mut r) = (base, exp, 1i128);
    while e > 0 {
        if e & 1 == 1 {
            r = r.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    r
}

// ---- unary ----

type F1 = Box<dyn Fn(f64) -> f64>;

fn float_unary_fn(op: &UnaryOp) -> Option<F1> {
    use UnaryOp::*;
    Some(match *op {
        Abs => Box::new(f64::abs),
        Neg => Box::new(|x: f64| -x),
        Exp => Box::new(f64::exp),
        Log => Box::new(f64::ln),
        Sqrt => Box::new(f64::sqrt),
        Reciprocal => Box::new(|x: f64| 1.0 / x),
        Sin => Box::new(f64::sin),
        Cos => Box::new(f64::cos),
        Tan => Box::new(f64::tan),
        Asin => Box::new(f64::asin),
        Acos => Box::new(f64::acos),
        Atan => Box::new(f64::atan),
        Sinh => Box::new(f64::sinh),
        Cosh => Box::new(f64::cosh),
        Asinh => Box::new(f64::asinh),
        Acosh => Box::new(f64::acosh),
        Atanh => Box::new(f64::atanh),
        Tanh => Box::new(f64::tanh),
        Sigmoid => Box::new(sigmoid),
        Relu => Box::new(|x: f64| if x.is_nan() || x > 0.0 { x } else { 0.0 }),
        Erf => Box::new(erf),
        Floor => Box::new(f64::floor),
        Ceil => Box::new(f64::ceil),
        Round => Box::new(f64::round_ties_even),
        Sign => Box::new(|x: f64| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }),
        Softplus => Box::new(softplus),
        Softsign => Box::new(|x: f64| x / (1.0 + x.abs())),
        Mish => Box::new(|x: f64| x * softplus(x).tanh()),
        Gelu { tanh_approx: false } => Box::new(|x: f64| 0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))),
        Gelu { tanh_approx: true } => Box::new(|x: f64| {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }),
        LeakyRelu { alpha } => {
            let a = alpha as f64;
            Box::new(move |x: f64| if x < 0.0 { a * x } else { x })
        }
        Elu { alpha } => {
            let a = alpha as f64;
            Box::new(move |x: f64| if x < 0.0 { a * x.exp_m1() } else { x })
        }
        Selu { alpha, gamma } => {
            let (a, g) = (alpha as f64, gamma as f64);
            Box::new(move |x: f64| if x > 0.0 { g * x } else { g * (a * x.exp() - a) })
        }
        Celu { alpha } => {
            let a = alpha as f64;
            Box::new(move |x: f64| x.max(0.0) + (a * (x / a).exp_m1()).min(0.0))
        }
        HardSigmoid { alpha, beta } => {
            let (a, b) = (alpha as f64, beta as f64);
            Box::new(move |x: f64| (a * x + b).clamp(0.0, 1.0))
        }
        HardSwish => Box::new(|x: f64| x * (x / 6.0 + 0.5).clamp(0.0, 1.0)),
        ThresholdedRelu { alpha } => {
            let a = alpha as f64;
            Box::new(move |x: f64| if x > a { x } else { 0.0 })
        }
        Shrink { lambd, bias } => {
            let (l, b) = (lambd as f64, bias as f64);
            Box::new(move |x: f64| {
                if x < -l {
                    x + b
                } else if x > l {
                    x - b
                } else {
                    0.0
                }
            })
        }
        Swish { alpha } => {
            let a = alpha as f64;
            Box::new(move |x: f64| x * sigmoid(a * x))
        }
        Not | BitwiseNot | IsNaN | IsInf { .. } | BitCast { .. } => return None,
    })
}

fn map_float<T: Elem>(v: &[T], f: &dyn Fn(f64) -> f64) -> TensorData {
    T::wrap(v.iter().map(|&x| T::from_f64r(f(x.to_f64()))).collect())
}

fn map_to_bool<T: Element>(v: &[T], f: &dyn Fn(f64) -> bool) -> TensorData {
    TensorData::Bool(v.iter().map(|&x| f(x.to_f64())).collect())
}

fn map_int<T: Int>(v: &[T], f: &dyn Fn(i128) -> i128) -> TensorData {
    T::wrap(v.iter().map(|&x| T::from_i128(f(x.to_i128()))).collect())
}

pub fn unary(op: &UnaryOp, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let x = arg(args, 0, "x")?;
    let shape = x.shape().to_vec();
    let dt = x.dtype();
    let data = match op {
        UnaryOp::BitCast { to } => {
            if to.size_bytes() != dt.size_bytes() {
                return Err(format!("cannot bitcast {dt} to {to}: element sizes differ"));
            }
            return Ok(vec![Tensor::from_le_bytes(*to, shape, &x.to_le_bytes()).map_err(|e| e.to_string())?]);
        }
        UnaryOp::IsNaN => dispatch!(x.data(), v => map_to_bool(v, &|e| e.is_nan())),
        UnaryOp::IsInf { detect_negative, detect_positive } => {
            let (n, p) = (*detect_negative, *detect_positive);
            dispatch!(x.data(), v => map_to_bool(v, &|e| (p && e == f64::INFINITY) || (n && e == f64::NEG_INFINITY)))
        }
        UnaryOp::Not => match x.data() {
            TensorData::Bool(v) => TensorData::Bool(v.iter().map(|b| !b).collect()),
            _ => return Err(format!("not expects bool, got {dt}")),
        },
        _ if dt.is_float() => {
            let f = float_unary_fn(op).ok_or_else(|| format!("{} does not apply to {dt}", op_name(op)))?;
            match x.data() {
                TensorData::F32(v) => map_float(v, &f),
                TensorData::F64(v) => map_float(v, &f),
                TensorData::F16(v) => map_float(v, &f),
                TensorData::BF16(v) => map_float(v, &f),
                TensorData::F8E4M3(v) => map_float(v, &f),
                TensorData::F8E5M2(v) => map_float(v, &f),
                _ => return Err(format!("unexpected dtype {dt}")),
            }
        }
        _ => {
            let f: Box<dyn Fn(i128) -> i128> = match op {
                UnaryOp::Abs => Box::new(|x: i128| x.abs()),
                UnaryOp::Neg => Box::new(|x: i128| -x),
                UnaryOp::Sign => Box::new(|x: i128| x.signum()),
                UnaryOp::Relu => Box::new(|x: i128| x.max(0)),
                UnaryOp::BitwiseNot => Box::new(|x: i128| !x),
                UnaryOp::Shrink { .. } => {
                    // Integer Shrink: exact through f64 for the values it sees.
                    let f = float_unary_fn(op).ok_or("shrink")?;
                    let v: Vec<f64> = x.to_f64_vec().into_iter().map(f).collect();
                    return Ok(vec![tensor(shape, f64s_to_data(dt, &v, true))?]);
                }
                _ => return Err(format!("{} does not apply to {dt}", op_name(op))),
            };
            if dt == DType::Bool {
                return Err(format!("{} does not apply to bool", op_name(op)));
            }
            int_dispatch!(x.data(), v => map_int(v, &f), _ => return Err(format!("unexpected dtype {dt}")))
        }
    };
    Ok(vec![tensor(shape, data)?])
}

fn op_name(op: &UnaryOp) -> &'static str {
    use tilec_ir::op::OpInfo;
    op.name()
}

// ---- broadcasting ----

/// Numpy broadcasting of several operands: the output shape and, per operand, the flat
/// input index of every output element (`None` when the operand already has the output
/// shape).
struct Bcast {
    shape: Vec<usize>,
    n: usize,
    maps: Vec<Option<Vec<usize>>>,
}

impl Bcast {
    fn new(shapes: &[&[usize]]) -> Result<Bcast, String> {
        let mut shape: Vec<usize> = Vec::new();
        for s in shapes {
            shape = broadcast(&shape, s)?;
        }
        let maps = shapes
            .iter()
            .map(|s| if *s == shape.as_slice() { Ok(None) } else { broadcast_index_map(s, &shape).map(Some) })
            .collect::<Result<_, String>>()?;
        let n = shape.iter().product();
        Ok(Bcast { shape, n, maps })
    }

    #[inline]
    fn at(&self, operand: usize, k: usize) -> usize {
        match &self.maps[operand] {
            None => k,
            Some(m) => m[k],
        }
    }
}

fn zip_map<A: Copy, B: Copy, O>(a: &[A], b: &[B], bc: &Bcast, f: impl Fn(A, B) -> O) -> Vec<O> {
    (0..bc.n).map(|k| f(a[bc.at(0, k)], b[bc.at(1, k)])).collect()
}

// ---- binary ----

fn same<T: Element>(b: &Tensor) -> Result<&[T], String> {
    T::slice(b.data()).ok_or_else(|| format!("operand dtypes differ: {} vs {}", T::DTYPE, b.dtype()))
}

fn cmp_fn(op: &BinaryOp) -> Option<fn(f64, f64) -> bool> {
    use BinaryOp::*;
    Some(match op {
        Equal => |a, b| a == b,
        Less => |a, b| a < b,
        LessOrEqual => |a, b| a <= b,
        Greater => |a, b| a > b,
        GreaterOrEqual => |a, b| a >= b,
        _ => return None,
    })
}

fn float_binary<T: Elem>(op: &BinaryOp, a: &[T], b: &Tensor, bc: &Bcast) -> Result<TensorData, String> {
    use BinaryOp::*;
    if *op == Pow {
        // The exponent may have another type; the result has the base's.
        let e = b.to_f64_vec();
        return Ok(T::wrap(zip_map(a, &e, bc, |x, y| T::from_f64r(x.to_f64().powf(y)))));
    }
    let b = same::<T>(b)?;
    if let Some(c) = cmp_fn(op) {
        return Ok(TensorData::Bool(zip_map(a, b, bc, |x, y| c(x.to_f64(), y.to_f64()))));
    }
    let f: fn(f64, f64) -> f64 = match op {
        Add => |x, y| x + y,
        Sub => |x, y| x - y,
        Mul => |x, y| x * y,
        Div => |x, y| x / y,
        Mod { fmod: true } => |x, y| x % y,
        Mod { fmod: false } => py_fmod,
        Max => nan_max,
        Min => nan_min,
        PRelu => |x, s| if x < 0.0 { s * x } else { x },
        _ => return Err(format!("{op:?} does not apply to {}", T::DTYPE)),
    };
    Ok(T::wrap(zip_map(a, b, bc, |x, y| T::from_f64r(f(x.to_f64(), y.to_f64())))))
}

fn int_binary<T: Int>(op: &BinaryOp, a: &[T], b: &Tensor, bc: &Bcast) -> Result<TensorData, String> {
    use BinaryOp::*;
    if *op == Pow {
        if let Some(e) = to_i128_vec(b) {
            return Ok(T::wrap(zip_map(a, &e, bc, |x, y| T::from_i128(ipow(x.to_i128(), y)))));
        }
        let e = b.to_f64_vec();
        return Ok(T::wrap(zip_map(a, &e, bc, |x, y| T::from_f64r((x.to_i128() as f64).powf(y)))));
    }
    let b = same::<T>(b)?;
    let bool_out: Option<fn(i128, i128) -> bool> = match op {
        Equal => Some(|x, y| x == y),
        Less => Some(|x, y| x < y),
        LessOrEqual => Some(|x, y| x <= y),
        Greater => Some(|x, y| x > y),
        GreaterOrEqual => Some(|x, y| x >= y),
        _ => None,
    };
    if let Some(c) = bool_out {
        return Ok(TensorData::Bool(zip_map(a, b, bc, |x, y| c(x.to_i128(), y.to_i128()))));
    }
    let bits = T::BITS as i128;
    let signed = T::to_i128(T::from_i128(-1)) < 0;
    let f: Box<dyn Fn(i128, i128) -> i128> = match op {
        Add => Box::new(|x, y| x.wrapping_add(y)),
        Sub => Box::new(|x, y| x.wrapping_sub(y)),
        Mul => Box::new(|x, y| x.wrapping_mul(y)),
        // Truncation toward zero; x / 0 is 0.
        Div => Box::new(|x, y| if y == 0 { 0 } else { x.wrapping_div(y) }),
        Mod { fmod: true } => Box::new(|x, y| if y == 0 { 0 } else { x.wrapping_rem(y) }),
        Mod { fmod: false } => Box::new(|x, y| {
            if y == 0 {
                return 0;
            }
            let r = x.wrapping_rem(y);
            if r != 0 && ((r < 0) != (y < 0)) {
                r + y
            } else {
                r
            }
        }),
        Max => Box::new(|x, y| x.max(y)),
        Min => Box::new(|x, y| x.min(y)),
        And => Box::new(|x, y| ((x != 0) && (y != 0)) as i128),
        Or => Box::new(|x, y| ((x != 0) || (y != 0)) as i128),
        Xor => Box::new(|x, y| ((x != 0) != (y != 0)) as i128),
        BitwiseAnd => Box::new(|x, y| x & y),
        BitwiseOr => Box::new(|x, y| x | y),
        BitwiseXor => Box::new(|x, y| x ^ y),
        // Shifts by a negative amount or by the bit width or more give 0 (or -1 for
        // a right shift of a negative value), as onnx's reference does.
        BitShiftLeft => Box::new(move |x, s| if s < 0 || s >= bits { 0 } else { x.wrapping_shl(s as u32) }),
        BitShiftRight => Box::new(move |x, s| {
            if s < 0 || s >= bits {
                if signed && x < 0 {
                    -1
                } else {
                    0
                }
            } else {
                x >> s
            }
        }),
        PRelu => Box::new(|x, s| if x < 0 { x.wrapping_mul(s) } else { x }),
        _ => return Err(format!("{op:?} does not apply to {}", T::DTYPE)),
    };
    Ok(T::wrap(zip_map(a, b, bc, |x, y| T::from_i128(f(x.to_i128(), y.to_i128())))))
}

pub fn binary(op: &BinaryOp, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let (a, b) = (arg(args, 0, "a")?, arg(args, 1, "b")?);
    let bc = Bcast::new(&[a.shape(), b.shape()])?;
    let logical = op.is_logical();
    if logical && (a.dtype() != DType::Bool || b.dtype() != DType::Bool) {
        return Err(format!("{op:?} expects bool operands, got {} and {}", a.dtype(), b.dtype()));
    }
    let data = match a.data() {
        TensorData::F32(v) => float_binary(op, v, b, &bc)?,
        TensorData::F64(v) => float_binary(op, v, b, &bc)?,
        TensorData::F16(v) => float_binary(op, v, b, &bc)?,
        TensorData::BF16(v) => float_binary(op, v, b, &bc)?,
        TensorData::F8E4M3(v) => float_binary(op, v, b, &bc)?,
        TensorData::F8E5M2(v) => float_binary(op, v, b, &bc)?,
        TensorData::I8(v) => int_binary(op, v, b, &bc)?,
        TensorData::I16(v) => int_binary(op, v, b, &bc)?,
        TensorData::I32(v) => int_binary(op, v, b, &bc)?,
        TensorData::I64(v) => int_binary(op, v, b, &bc)?,
        TensorData::U8(v) => int_binary(op, v, b, &bc)?,
        TensorData::U16(v) => int_binary(op, v, b, &bc)?,
        TensorData::U32(v) => int_binary(op, v, b, &bc)?,
        TensorData::U64(v) => int_binary(op, v, b, &bc)?,
        TensorData::Bool(v) => {
            let allowed = logical || op.is_comparison();
            if !allowed {
                return Err(format!("{op:?} does not apply to bool"));
            }
            int_binary(op, v, b, &bc)?
        }
    };
    Ok(vec![tensor(bc.shape, data)?])
}

// ---- where ----

fn where_t<T: Element>(c: &[bool], x: &[T], y: &Tensor, bc: &Bcast) -> Result<TensorData, String> {
    let y = same::<T>(y)?;
    Ok(T::wrap((0..bc.n).map(|k| if c[bc.at(0, k)] { x[bc.at(1, k)] } else { y[bc.at(2, k)] }).collect()))
}

pub fn where_(args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let c = arg(args, 0, "condition")?;
    let (x, y) = (arg(args, 1, "x")?, arg(args, 2, "y")?);
    let cv = c.as_slice::<bool>().ok_or_else(|| format!("condition must be bool, got {}", c.dtype()))?;
    let bc = Bcast::new(&[c.shape(), x.shape(), y.shape()])?;
    let data = dispatch!(x.data(), v => where_t(cv, v, y, &bc)?);
    Ok(vec![tensor(bc.shape, data)?])
}

// ---- cast ----

/// ONNX Cast: floats round to nearest even (fp8 saturating when `saturate`: infinities
/// and out-of-range values clamp to the largest finite value); float to integer
/// truncates toward zero (NaN gives 0) and wraps; integer to integer wraps; to bool is
/// `x != 0`; bool is 0/1.
pub fn cast_tensor(x: &Tensor, to: DType, saturate: bool) -> Result<Tensor, String> {
    if x.dtype() == to {
        return Ok(x.clone());
    }
    let shape = x.shape().to_vec();
    let data = match to_i128_vec(x) {
        Some(v) => match ints_to_data(to, &v) {
            Some(d) => d,
            None if to == DType::F32 => TensorData::F32(v.iter().map(|&i| i as f32).collect()),
            None => {
                let f: Vec<f64> = v.iter().map(|&i| i as f64).collect();
                f64s_to_data(to, &f, saturate)
            }
        },
        None => f64s_to_data(to, &x.to_f64_vec(), saturate),
    };
    tensor(shape, data)
}

pub fn cast(to: DType, saturate: bool, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    Ok(vec![cast_tensor(arg(args, 0, "x")?, to, saturate)?])
}

// ---- quantization ----

/// For each element of a tensor of shape `xs`, the flat index into a scale or zero
/// point of shape `ps` (per-tensor, per-axis along `axis`, or blocked along `axis`).
fn param_index(xs: &[usize], ps: &[usize], axis: usize, block: usize, what: &str) -> Result<Vec<usize>, String> {
    let n: usize = xs.iter().product();
    let pn: usize = ps.iter().product();
    if ps.len() <= 1 && pn == 1 {
        return Ok(vec![0; n]);
    }
    if axis >= xs.len() {
        return Err(format!("axis {axis} out of range for rank {}", xs.len()));
    }
    let len = xs[axis];
    let inner: usize = xs[axis + 1..].iter().product();
    if block == 0 {
        if ps != [len] {
            return Err(format!("per-axis {what} must have shape [{len}], got {ps:?}"));
        }
        return Ok((0..n).map(|k| (k / inner.max(1)) % len.max(1)).collect());
    }
    let plen = len.div_ceil(block);
    let mut want = xs.to_vec();
    want[axis] = plen;
    if ps != want.as_slice() {
        return Err(format!("blocked {what} must have shape {want:?}, got {ps:?}"));
    }
    Ok((0..n)
        .map(|k| {
            let i = k % inner.max(1);
            let a = (k / inner.max(1)) % len.max(1);
            let o = k / (inner * len).max(1);
            (o * plen + a / block) * inner + i
        })
        .collect())
}

/// The dtype numpy computes `x / scale` in.
fn promote_float(a: DType, b: DType) -> DType {
    if a == b && a.is_float() {
        a
    } else if a == DType::F64 || b == DType::F64 || !a.is_float() || !b.is_float() {
        DType::F64
    } else {
        DType::F32
    }
}

fn quant_range(to: DType) -> Option<(f64, f64)> {
    Some(match to {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        _ => return None,
    })
}

fn quantize(
    x: &Tensor,
    s: &Tensor,
    z: &Tensor,
    axis: usize,
    block: usize,
    saturate: bool,
    to: DType,
) -> Result<Tensor, String> {
    let si = param_index(x.shape(), s.shape(), axis, block, "scale")?;
    let zi = param_index(x.shape(), z.shape(), axis, block, "zero point")?;
    let (xv, sv, zv) = (x.to_f64_vec(), s.to_f64_vec(), z.to_f64_vec());
    let cd = promote_float(x.dtype(), s.dtype());
    let q: Vec<f64> = xv.iter().zip(&si).map(|(&e, &k)| round_as(cd, e / sv[k])).collect();
    let data = match quant_range(to) {
        Some((lo, hi)) => {
            let v: Vec<f64> = q
                .iter()
                .zip(&zi)
                .map(|(&e, &k)| if e.is_nan() { lo } else { (e.round_ties_even() + zv[k]).clamp(lo, hi) })
                .collect();
            f64s_to_data(to, &v, true)
        }
        None if matches!(to, DType::F8E4M3 | DType::F8E5M2) => f64s_to_data(to, &q, saturate),
        None => return Err(format!("unsupported quantized type {to}")),
    };
    tensor(x.shape().to_vec(), data)
}

fn dequantize(x: &Tensor, s: &Tensor, z: &Tensor, axis: usize, block: usize, to: DType) -> Result<Tensor, String> {
    let si = param_index(x.shape(), s.shape(), axis, block, "scale")?;
    let zi = param_index(x.shape(), z.shape(), axis, block, "zero point")?;
    let (xv, sv, zv) = (x.to_f64_vec(), s.to_f64_vec(), z.to_f64_vec());
    let fp8 = matches!(x.dtype(), DType::F8E4M3 | DType::F8E5M2);
    // onnx computes in f32 (f64 for f64 scales or i32 inputs), then casts.
    let cd = if s.dtype() == DType::F64 || x.dtype() == DType::I32 { DType::F64 } else { DType::F32 };
    let v: Vec<f64> = (0..xv.len())
        .map(|k| {
            let d = if fp8 { xv[k] } else { xv[k] - zv[zi[k]] };
            round_as(cd, d * sv[si[k]])
        })
        .collect();
    tensor(x.shape().to_vec(), f64s_to_data(to, &v, true))
}

/// DynamicQuantizeLinear in f32 arithmetic, as onnx specifies it.
fn dynamic_quantize(x: &Tensor) -> Result<Vec<Tensor>, String> {
    let xv = x.as_slice::<f32>().ok_or_else(|| format!("input must be f32, got {}", x.dtype()))?;
    let mut maxx = 0.0f32;
    let mut minx = 0.0f32;
    for &e in xv {
        maxx = if e.is_nan() || maxx.is_nan() { f32::NAN } else { maxx.max(e) };
        minx = if e.is_nan() || minx.is_nan() { f32::NAN } else { minx.min(e) };
    }
    let range = if maxx == minx { 1.0 } else { maxx - minx };
    let scale = range / 255.0f32;
    let zp = (0.0f32 - minx / scale).clamp(0.0, 255.0);
    let zp = if zp.is_nan() { 0.0 } else { zp.round_ties_even() };
    let y: Vec<u8> = xv
        .iter()
        .map(|&e| {
            let q = (e / scale).round_ties_even() + zp;
            if q.is_nan() {
                0
            } else {
                q.clamp(0.0, 255.0) as u8
            }
        })
        .collect();
    Ok(vec![
        Tensor::from_vec(x.shape().to_vec(), y).map_err(|e| e.to_string())?,
        Tensor::scalar(scale),
        Tensor::scalar(zp as u8),
    ])
}

pub fn quant(op: &QuantOp, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    match op {
        QuantOp::QuantizeLinear { axis, block_size, saturate, to } => {
            let (x, s, z) = (arg(args, 0, "x")?, arg(args, 1, "scale")?, arg(args, 2, "zero point")?);
            Ok(vec![quantize(x, s, z, *axis, *block_size, *saturate, *to)?])
        }
        QuantOp::DequantizeLinear { axis, block_size, to } => {
            let (x, s, z) = (arg(args, 0, "x")?, arg(args, 1, "scale")?, arg(args, 2, "zero point")?);
            Ok(vec![dequantize(x, s, z, *axis, *block_size, *to)?])
        }
        QuantOp::DynamicQuantizeLinear => dynamic_quantize(arg(args, 0, "x")?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<T: Element>(shape: &[usize], v: Vec<T>) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v).unwrap()
    }

    fn bin(op: BinaryOp, a: &Tensor, b: &Tensor) -> Tensor {
        binary(&op, &[a, b]).unwrap().remove(0)
    }

    #[test]
    fn erf_matches_known_values() {
        // erf values from tables (15+ digits).
        let cases = [
            (0.0, 0.0),
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (5.0, 0.999_999_999_998_462_5),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() <= 1e-15, "erf({x}) = {}, want {want}", erf(x));
            assert!((erf(-x) + want).abs() <= 1e-15);
        }
        assert_eq!(erf(7.0), 1.0);
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn narrow_float_rounding_is_single_rounding() {
        // 1 + 2^-11 is exactly halfway between two f16 values: ties to even (1.0); a hair
        // above must round up even though the excess is far below f32 precision.
        let half = 1.0 + 2f64.powi(-11);
        assert_eq!(f16::from_f64r(half).to_f64(), 1.0);
        assert_eq!(f16::from_f64r(half + 2f64.powi(-40)).to_f64(), 1.0 + 2f64.powi(-10));
        let bhalf = 1.0 + 2f64.powi(-8);
        assert_eq!(bf16::from_f64r(bhalf).to_f64(), 1.0);
        assert_eq!(bf16::from_f64r(bhalf + 2f64.powi(-45)).to_f64(), 1.0 + 2f64.powi(-7));
        assert_eq!(bf16::from_f64r(-bhalf - 2f64.powi(-45)).to_f64(), -(1.0 + 2f64.powi(-7)));
        // Exact values stay exact.
        for x in [0.0, -0.0, 1.5, -65504.0, 6.103_515_625e-5] {
            assert_eq!(f16::from_f64r(x).to_f64(), x);
        }
    }

    #[test]
    fn integer_arithmetic_is_exact_and_c_like() {
        let a = t(&[4], vec![7i32, -7, 7, -7]);
        let b = t(&[4], vec![2i32, 2, -2, -2]);
        assert_eq!(bin(BinaryOp::Div, &a, &b).to_i64_vec(), vec![3, -3, -3, 3]);
        assert_eq!(bin(BinaryOp::Mod { fmod: false }, &a, &b).to_i64_vec(), vec![1, 1, -1, -1]);
        assert_eq!(bin(BinaryOp::Mod { fmod: true }, &a, &b).to_i64_vec(), vec![1, -1, 1, -1]);
        // Division by zero gives 0, not a panic.
        let z = t(&[1], vec![0i32]);
        assert_eq!(bin(BinaryOp::Div, &a, &z).to_i64_vec(), vec![0; 4]);
        assert_eq!(bin(BinaryOp::Mod { fmod: false }, &a, &z).to_i64_vec(), vec![0; 4]);
        // u64 beyond 2^63 (and i64 beyond 2^53) stay exact.
        let big = t(&[2], vec![u64::MAX - 1, 1u64 << 63]);
        let one = t(&[], vec![1u64]);
        let s = bin(BinaryOp::Add, &big, &one);
        assert_eq!(s.as_slice::<u64>().unwrap(), &[u64::MAX, (1u64 << 63) + 1]);
        assert_eq!(bin(BinaryOp::Add, &s, &one).as_slice::<u64>().unwrap()[0], 0); // wraps
        let q = bin(BinaryOp::Div, &big, &t(&[], vec![3u64]));
        assert_eq!(q.as_slice::<u64>().unwrap(), &[(u64::MAX - 1) / 3, (1u64 << 63) / 3]);
        let gt = bin(BinaryOp::Greater, &big, &one);
        assert_eq!(gt.as_slice::<bool>().unwrap(), &[true, true]);
        let i = t(&[1], vec![(1i64 << 53) + 1]);
        let r = bin(BinaryOp::Mul, &i, &t(&[1], vec![3i64]));
        assert_eq!(r.to_i64_vec(), vec![3 * ((1i64 << 53) + 1)]);
        // i8 overflow wraps.
        let m = bin(BinaryOp::Mul, &t(&[1], vec![100i8]), &t(&[1], vec![3i8]));
        assert_eq!(m.to_i64_vec(), vec![44]);
    }

    #[test]
    fn shifts_follow_onnx_reference() {
        let x = t(&[4], vec![-16i8, 16, 1, -1]);
        let s = t(&[4], vec![2i8, 8, -1, 9]);
        assert_eq!(bin(BinaryOp::BitShiftRight, &x, &s).to_i64_vec(), vec![-4, 0, 0, -1]);
        assert_eq!(bin(BinaryOp::BitShiftLeft, &x, &s).to_i64_vec(), vec![-64, 0, 0, 0]);
        let u = t(&[2], vec![0x81u8, 3]);
        let us = t(&[2], vec![1u8, 7]);
        assert_eq!(bin(BinaryOp::BitShiftLeft, &u, &us).to_i64_vec(), vec![2, 128]);
        assert_eq!(bin(BinaryOp::BitShiftRight, &u, &us).to_i64_vec(), vec![0x40, 0]);
    }

    #[test]
    fn float_mod_and_minmax_follow_numpy() {
        let a = t(&[4], vec![5.0f32, -5.0, 5.0, 6.0]);
        let b = t(&[4], vec![-3.0f32, 3.0, f32::INFINITY, 3.0]);
        let m = bin(BinaryOp::Mod { fmod: false }, &a, &b);
        assert_eq!(m.as_slice::<f32>().unwrap()[..3], [-1.0, 1.0, 5.0]);
        // A zero result takes the divisor's sign.
        assert!(m.as_slice::<f32>().unwrap()[3] == 0.0);
        let n = t(&[2], vec![f32::NAN, 1.0]);
        let mx = bin(BinaryOp::Max, &n, &t(&[], vec![0.0f32]));
        assert!(mx.as_slice::<f32>().unwrap()[0].is_nan());
        assert_eq!(mx.as_slice::<f32>().unwrap()[1], 1.0);
    }

    #[test]
    fn pow_keeps_the_base_type() {
        let base = t(&[3], vec![2i32, 3, -2]);
        let e = t(&[3], vec![10i64, 0, 3]);
        assert_eq!(bin(BinaryOp::Pow, &base, &e).to_i64_vec(), vec![1024, 1, -8]);
        let ef = t(&[3], vec![0.5f32, 2.0, 2.0]);
        let r = bin(BinaryOp::Pow, &base, &ef);
        assert_eq!(r.dtype(), DType::I32);
        assert_eq!(r.to_i64_vec(), vec![1, 9, 4]);
        let fb = t(&[2], vec![2.0f32, 4.0]);
        let r = bin(BinaryOp::Pow, &fb, &t(&[], vec![3u64]));
        assert_eq!(r.as_slice::<f32>().unwrap(), &[8.0, 64.0]);
    }

    #[test]
    fn where_broadcasts_three_ways_like_a_naive_loop() {
        let c = t(&[2, 1, 3], vec![true, false, true, false, false, true]);
        let x = t(&[4, 1], (0..4).map(|i| i as i64).collect());
        let y = t(&[1], vec![-1i64]);
        let out = where_(&[&c, &x, &y]).unwrap().remove(0);
        assert_eq!(out.shape(), &[2, 4, 3]);
        let v = out.to_i64_vec();
        let cv = c.as_slice::<bool>().unwrap();
        for i in 0..2 {
            for j in 0..4 {
                for k in 0..3 {
                    let want = if cv[i * 3 + k] { j as i64 } else { -1 };
                    assert_eq!(v[(i * 4 + j) * 3 + k], want);
                }
            }
        }
    }

    #[test]
    fn cast_semantics() {
        let f = t(&[6], vec![-1.7f32, 2.9, f32::NAN, 0.0, 1e9, -0.0]);
        assert_eq!(cast_tensor(&f, DType::I32, true).unwrap().to_i64_vec(), vec![-1, 2, 0, 0, 1_000_000_000, 0]);
        let b = cast_tensor(&f, DType::Bool, true).unwrap();
        assert_eq!(b.as_slice::<bool>().unwrap(), &[true, true, true, false, true, false]);
        // u64 above 2^63 converts by value.
        let u = t(&[1], vec![u64::MAX]);
        assert_eq!(cast_tensor(&u, DType::F32, true).unwrap().as_slice::<f32>().unwrap(), &[u64::MAX as f32]);
        assert_eq!(cast_tensor(&u, DType::I8, true).unwrap().to_i64_vec(), vec![-1]);
        // fp8: saturation clamps to the largest finite value; without it e4m3 gives NaN.
        let big = t(&[2], vec![1000.0f32, f32::NEG_INFINITY]);
        let s = cast_tensor(&big, DType::F8E4M3, true).unwrap();
        assert_eq!(s.to_f64_vec(), vec![448.0, -448.0]);
        let ns = cast_tensor(&big, DType::F8E4M3, false).unwrap();
        assert!(ns.to_f64_vec().iter().all(|x| x.is_nan()));
        let e5 = cast_tensor(&big, DType::F8E5M2, false).unwrap();
        assert_eq!(e5.to_f64_vec(), vec![1024.0, f64::NEG_INFINITY]);
        let huge = t(&[1], vec![1e5f32]);
        assert_eq!(cast_tensor(&huge, DType::F8E5M2, false).unwrap().to_f64_vec(), vec![f64::INFINITY]);
        assert_eq!(cast_tensor(&huge, DType::F8E5M2, true).unwrap().to_f64_vec(), vec![57344.0]);
        // bool to float.
        let bb = t(&[2], vec![true, false]);
        assert_eq!(cast_tensor(&bb, DType::F16, true).unwrap().to_f64_vec(), vec![1.0, 0.0]);
    }

    #[test]
    fn blocked_param_index_matches_naive() {
        let xs = [2, 5, 3];
        let (axis, block) = (1, 2);
        let ps = [2, 3, 3];
        let m = param_index(&xs, &ps, axis, block, "scale").unwrap();
        let mut k = 0;
        for i in 0..2 {
            for j in 0..5 {
                for l in 0..3 {
                    assert_eq!(m[k], (i * 3 + j / block) * 3 + l);
                    k += 1;
                }
            }
        }
        let per_axis = param_index(&xs, &[5], 1, 0, "scale").unwrap();
        assert_eq!(&per_axis[..7], &[0, 0, 0, 1, 1, 1, 2]);
        assert!(param_index(&xs, &[4], 1, 0, "scale").is_err());
        assert!(param_index(&xs, &[2, 2, 3], 1, 2, "scale").is_err());
    }

    #[test]
    fn quantize_rounds_half_to_even_and_saturates() {
        let x = t(&[6], vec![0.5f32, 1.5, 2.5, -0.5, 1000.0, -1000.0]);
        let s = t(&[], vec![1.0f32]);
        let z = t(&[], vec![10u8]);
        let op = QuantOp::QuantizeLinear { axis: 0, block_size: 0, saturate: true, to: DType::U8 };
        let y = quant(&op, &[&x, &s, &z]).unwrap().remove(0);
        assert_eq!(y.to_i64_vec(), vec![10, 12, 12, 10, 255, 0]);
        let dq = QuantOp::DequantizeLinear { axis: 0, block_size: 0, to: DType::F32 };
        let back = quant(&dq, &[&y, &t(&[], vec![0.5f32]), &z]).unwrap().remove(0);
        assert_eq!(back.as_slice::<f32>().unwrap(), &[0.0, 1.0, 1.0, 0.0, 122.5, -5.0]);
    }

    #[test]
    fn dynamic_quantize_covers_the_range() {
        let x = t(&[4], vec![0.0f32, 2.0, -3.0, 1.0]);
        let r = quant(&QuantOp::DynamicQuantizeLinear, &[&x]).unwrap();
        let scale = r[1].as_slice::<f32>().unwrap()[0];
        assert_eq!(scale, 5.0 / 255.0);
        assert_eq!(r[2].to_i64_vec(), vec![153]);
        assert_eq!(r[0].to_i64_vec(), vec![153, 255, 0, 204]);
    }

    #[test]
    fn unary_int_and_bitcast() {
        let x = t(&[3], vec![-128i8, -3, 5]);
        let a = unary(&UnaryOp::Abs, &[&x]).unwrap().remove(0);
        assert_eq!(a.to_i64_vec(), vec![-128, 3, 5]); // wraps like numpy
        let r = unary(&UnaryOp::Relu, &[&x]).unwrap().remove(0);
        assert_eq!(r.to_i64_vec(), vec![0, 0, 5]);
        let u = t(&[1], vec![5u8]);
        assert_eq!(unary(&UnaryOp::BitwiseNot, &[&u]).unwrap()[0].to_i64_vec(), vec![250]);
        let f = t(&[1], vec![1.0f32]);
        let bc = unary(&UnaryOp::BitCast { to: DType::I32 }, &[&f]).unwrap().remove(0);
        assert_eq!(bc.to_i64_vec(), vec![0x3f80_0000]);
        assert!(unary(&UnaryOp::BitCast { to: DType::I64 }, &[&f]).is_err());
        let sh = unary(&UnaryOp::Shrink { lambd: 1.5, bias: 1.0 }, &[&t(&[3], vec![-3i32, 1, 3])]).unwrap().remove(0);
        assert_eq!(sh.to_i64_vec(), vec![-2, 0, 2]);
        let rnd = unary(&UnaryOp::Round, &[&t(&[4], vec![0.5f32, 1.5, 2.5, -2.5])]).unwrap().remove(0);
        assert_eq!(rnd.as_slice::<f32>().unwrap(), &[0.0, 2.0, 2.0, -2.0]);
    }
}
