//! Activation recognizers: GELU (erf and tanh forms), SiLU/Swish, SwiGLU.

use super::pattern::{approx, emit, Build, Matcher};
use tilec_ir::op::{BinaryOp, NnOp, UnaryOp};
use tilec_ir::{Op, ValueId};

/// Relative tolerance for recognizing the constants exporters write out (they round
/// 1/sqrt(2) to 0.7071, sqrt(2/pi) to 0.7978846, ...).
const RTOL: f64 = 1e-3;

/// `x * 0.5 * (1 + erf(x / sqrt(2)))` or `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`,
/// with the factors in any order and grouping.
pub fn gelu(m: &mut Matcher, root: ValueId) -> Option<Build> {
    if !m.g.value(root).ty.dtype.is_float() {
        return None;
    }
    m.node(root).filter(|n| n.op == Op::Binary(BinaryOp::Mul))?;
    let p = m.product(root);
    if !p.denoms.is_empty() || p.factors.len() != 2 || !approx(p.coef, 0.5, RTOL) {
        return None;
    }
    for (x, phi) in [(p.factors[0], p.factors[1]), (p.factors[1], p.factors[0])] {
        if let Some(tanh_approx) = m.attempt(|m| gelu_phi(m, x, phi)) {
            let name = m.g.value(root).name.clone();
            return Some(Box::new(move |g| {
                emit(g, &name, Op::Unary(UnaryOp::Gelu { tanh_approx }), &[x])
            }));
        }
    }
    None
}

/// `phi = 1 + erf(x / sqrt 2)` (false) or `1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))` (true).
fn gelu_phi(m: &mut Matcher, x: ValueId, phi: ValueId) -> Option<bool> {
    let t = m.add_const(phi, 1.0, RTOL)?;
    if let Some(arg) = m.attempt(|m| m.unary(t, UnaryOp::Erf)) {
        let p = m.product(arg);
        return (p.denoms.is_empty()
            && p.factors == [x]
            && approx(p.coef, std::f64::consts::FRAC_1_SQRT_2, RTOL))
        .then_some(false);
    }
    let arg = m.unary(t, UnaryOp::Tanh)?;
    let p = m.product(arg);
    if !p.denoms.is_empty()
        || p.factors.len() != 1
        || !approx(p.coef, (2.0 / std::f64::consts::PI).sqrt(), RTOL)
    {
        return None;
    }
    let (a, b) = m.binary(p.factors[0], BinaryOp::Add)?;
    let cubic = if a == x {
        b
    } else if b == x {
        a
    } else {
        return None;
    };
    let c = m.product(cubic);
    if !c.denoms.is_empty() || !approx(c.coef, 0.044715, RTOL) {
        return None;
    }
    let is_cube = match c.factors.as_slice() {
        [a, b, d] => *a == x && *b == x && *d == x,
        [a, b] => (*a == x && is_square(m, *b, x)) || (*b == x && is_square(m, *a, x)),
        [f] => m
            .attempt(|m| {
                let (base, e) = m.binary(*f, BinaryOp::Pow)?;
                (base == x && m.const_is(e, 3.0, 0.0)).then_some(())
            })
            .is_some(),
        _ => false,
    };
    is_cube.then_some(true)
}

/// `v = x * x` or `x ^ 2`.
fn is_square(m: &mut Matcher, v: ValueId, x: ValueId) -> bool {
    m.attempt(|m| {
        if let Some((a, b)) = m.attempt(|m| m.binary(v, BinaryOp::Mul)) {
            return (a == x && b == x).then_some(());
        }
        let (a, e) = m.binary(v, BinaryOp::Pow)?;
        (a == x && m.const_is(e, 2.0, 0.0)).then_some(())
    })
    .is_some()
}

/// `x * sigmoid(x)` (or `x * sigmoid(alpha * x)`) in either operand order → `Swish { alpha }`.
pub fn silu(m: &mut Matcher, root: ValueId) -> Option<Build> {
    let (a, b) = m.binary(root, BinaryOp::Mul)?;
    if !m.g.value(root).ty.dtype.is_float() {
        return None;
    }
    for (x, s) in [(a, b), (b, a)] {
        let alpha = m.attempt(|m| {
            let arg = m.unary(s, UnaryOp::Sigmoid)?;
            if arg == x {
                return Some(1.0);
            }
            let p = m.product(arg);
            (p.denoms.is_empty() && p.factors == [x]).then_some(p.coef)
        });
        if let Some(alpha) = alpha {
            let name = m.g.value(root).name.clone();
            let op = Op::Unary(UnaryOp::Swish {
                alpha: alpha as f32,
            });
            return Some(Box::new(move |g| emit(g, &name, op, &[x])));
        }
    }
    None
}

/// `swish(a, alpha) * b` with `a` and `b` of the same type → `SwiGlu { alpha }(a, b)`,
/// which is exactly that (no broadcasting, same dtype). Runs after `recognize-silu`.
pub fn swiglu(m: &mut Matcher, root: ValueId) -> Option<Build> {
    let (l, r) = m.binary(root, BinaryOp::Mul)?;
    for (s, b) in [(l, r), (r, l)] {
        let found = m.attempt(|m| {
            let n = m.op_where(s, |op| matches!(op, Op::Unary(UnaryOp::Swish { .. })))?;
            let Op::Unary(UnaryOp::Swish { alpha }) = n.op else {
                return None;
            };
            let a = n.inputs[0];
            (m.g.value(a).ty == m.g.value(b).ty).then_some((a, alpha))
        });
        if let Some((a, alpha)) = found {
            let name = m.g.value(root).name.clone();
            return Some(Box::new(move |g| {
                emit(g, &name, Op::Nn(NnOp::SwiGlu { alpha }), &[a, b])
            }));
        }
    }
    None
}
