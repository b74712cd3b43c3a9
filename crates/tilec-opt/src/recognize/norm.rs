//! Normalization recognizers: LayerNorm, RMSNorm, Softmax, and group norms spelled as an
//! instance norm between reshapes.

use super::pattern::{approx, emit, scalar_const, Build, Matcher, Product};
use tilec_ir::op::{BinaryOp, LayoutOp, NormOp, ReduceKind, ReduceOp, UnaryOp};
use tilec_ir::{DType, Dim, Op, ValueId};

/// `v = reduce_<kind>(x, axes = axis..rank, keepdims)`: returns `(x, axis)`.
fn trailing_reduce(m: &mut Matcher, v: ValueId, kind: ReduceKind) -> Option<(ValueId, usize)> {
    m.attempt(|m| {
        let n = m.op_where(v, |op| {
            matches!(op, Op::Reduce(ReduceOp::Reduce { keepdims: true, .. }))
        })?;
        let Op::Reduce(ReduceOp::Reduce { kind: k, axes, .. }) = &n.op else {
            return None;
        };
        let x = n.inputs[0];
        let rank = m.g.value(x).ty.rank();
        let first = *axes.first()?;
        let trailing = axes.iter().copied().eq(first..rank);
        (*k == kind && trailing).then_some((x, first))
    })
}

/// `v = x * x` or `x ^ 2`: returns `x`.
fn square_of(m: &mut Matcher, v: ValueId) -> Option<ValueId> {
    m.attempt(|m| {
        if let Some((a, b)) = m.attempt(|m| m.binary(v, BinaryOp::Mul)) {
            return (a == b).then_some(a);
        }
        let (a, e) = m.binary(v, BinaryOp::Pow)?;
        m.const_is(e, 2.0, 0.0).then_some(a)
    })
}

/// The statistics part of a norm, found in a flattened product: a denominator
/// `sqrt(mean(d^2) + eps)` or a factor `1 / sqrt(...)` (Reciprocal, or Pow -0.5).
/// Returns `(d, axis, eps)` and removes the consumed factor from `p`.
fn inv_std(m: &mut Matcher, p: &mut Product) -> Option<(ValueId, usize, f64)> {
    let stats = |m: &mut Matcher, s: ValueId| -> Option<(ValueId, usize, f64)> {
        let (a, b) = m.binary(s, BinaryOp::Add)?;
        let (ms, eps) = if let Some(e) = m.const_scalar(b) {
            (a, e)
        } else {
            (b, m.const_scalar(a)?)
        };
        let (sq, axis) = trailing_reduce(m, ms, ReduceKind::Mean)?;
        let d = square_of(m, sq)?;
        Some((d, axis, eps))
    };
    if p.denoms.len() == 1 {
        let den = p.denoms[0];
        let r = m.attempt(|m| {
            let s = m.unary(den, UnaryOp::Sqrt)?;
            stats(m, s)
        })?;
        p.denoms.clear();
        return Some(r);
    }
    if !p.denoms.is_empty() {
        return None;
    }
    for i in 0..p.factors.len() {
        let f = p.factors[i];
        let r = m.attempt(|m| {
            if let Some(q) = m.attempt(|m| m.unary(f, UnaryOp::Reciprocal)) {
                let s = m.unary(q, UnaryOp::Sqrt)?;
                return stats(m, s);
            }
            let (s, e) = m.binary(f, BinaryOp::Pow)?;
            if !m.const_is(e, -0.5, 0.0) {
                return None;
            }
            stats(m, s)
        });
        if let Some(r) = r {
            p.factors.remove(i);
            return Some(r);
        }
    }
    None
}

/// `v` with a single-use float upcast stripped when it casts from `dtype`.
fn strip_cast_from(m: &mut Matcher, v: ValueId, dtype: DType) -> ValueId {
    m.attempt(|m| {
        let x = m.skip_float_cast(v);
        (x != v && m.g.value(x).ty.dtype == dtype).then_some(x)
    })
    .unwrap_or(v)
}

/// The factors left besides the normalized value: none, or one gamma (coef must be 1).
fn gamma_of(m: &Matcher, p: &Product, num: ValueId) -> Option<Option<ValueId>> {
    if !approx(p.coef, 1.0, 1e-6) || p.factors.iter().filter(|&&f| f == num).count() != 1 {
        return None;
    }
    let rest: Vec<ValueId> = p.factors.iter().copied().filter(|&f| f != num).collect();
    match rest.as_slice() {
        [] => Some(None),
        [g] => {
            let _ = m;
            Some(Some(*g))
        }
        _ => None,
    }
}

/// The scale operand: gamma, or a scalar 1 of `dtype` when there is none.
fn scale_or_ones(
    g: &mut tilec_ir::Graph,
    name: &str,
    gamma: Option<ValueId>,
    dtype: DType,
) -> Result<ValueId, tilec_ir::IrError> {
    match gamma {
        Some(v) => Ok(v),
        None => scalar_const(g, &format!("{name}/ones"), dtype, 1.0),
    }
}

/// `x * rsqrt(mean(x^2, trailing axes) + eps) [* gamma]`, with the rsqrt spelled as
/// `1/sqrt`, `reciprocal(sqrt)` or `pow(-0.5)`, and optionally computed in f32 between
/// casts → `RmsNorm { axis, epsilon }(x, gamma | 1)`.
pub fn rms_norm(m: &mut Matcher, root: ValueId) -> Option<Build> {
    m.node(root).filter(|n| {
        matches!(
            n.op,
            Op::Binary(BinaryOp::Mul) | Op::Binary(BinaryOp::Div) | Op::Cast { .. }
        )
    })?;
    let dtype = m.g.value(root).ty.dtype;
    if !dtype.is_float() {
        return None;
    }
    m.through_casts = true;
    let mut p = m.product(root);
    m.through_casts = false;
    let (xf, axis, eps) = inv_std(m, &mut p)?;
    let gamma = gamma_of(m, &p, xf)?;
    // `(x - mean(x))` normalized this way is a layer norm whose mean is shared: leave it.
    let centered = m.attempt(|m| {
        let (a, mean) = m.binary(xf, BinaryOp::Sub)?;
        let (b, _) = trailing_reduce(m, mean, ReduceKind::Mean)?;
        (a == b).then_some(())
    });
    if centered.is_some() {
        return None;
    }
    let x = strip_cast_from(m, xf, dtype);
    if m.g.value(x).ty.dtype != dtype || gamma.is_some_and(|g| m.g.value(g).ty.dtype != dtype) {
        return None;
    }
    let name = m.g.value(root).name.clone();
    Some(Box::new(move |g| {
        let scale = scale_or_ones(g, &name, gamma, dtype)?;
        emit(
            g,
            &name,
            Op::Norm(NormOp::RmsNorm {
                axis,
                epsilon: eps as f32,
            }),
            &[x, scale],
        )
    }))
}

/// `(x - mean(x)) / sqrt(mean((x - mean)^2) + eps) [* gamma] [+ beta]` over trailing
/// axes (also with `* reciprocal(sqrt(..))`) → `LayerNorm(x, gamma | 1 [, beta])`.
pub fn layer_norm(m: &mut Matcher, root: ValueId) -> Option<Build> {
    let dtype = m.g.value(root).ty.dtype;
    if !dtype.is_float() {
        return None;
    }
    let core = |m: &mut Matcher, v: ValueId| -> Option<(ValueId, usize, f64, Option<ValueId>)> {
        m.node(v).filter(|n| {
            matches!(
                n.op,
                Op::Binary(BinaryOp::Mul) | Op::Binary(BinaryOp::Div) | Op::Cast { .. }
            )
        })?;
        m.through_casts = true;
        let mut p = m.product(v);
        m.through_casts = false;
        let (d, axis, eps) = inv_std(m, &mut p)?;
        let gamma = gamma_of(m, &p, d)?;
        let (x0, mean) = m.binary(d, BinaryOp::Sub)?;
        let (x1, axis2) = trailing_reduce(m, mean, ReduceKind::Mean)?;
        if x1 != x0 || axis2 != axis {
            return None;
        }
        let x = strip_cast_from(m, x0, dtype);
        Some((x, axis, eps, gamma))
    };
    let mut found = None;
    if let Some((a, b)) = m.attempt(|m| m.binary(root, BinaryOp::Add)) {
        for (v, beta) in [(a, b), (b, a)] {
            if let Some(c) = m.attempt(|m| {
                let c = core(m, v)?;
                // A norm must be read only through this Add.
                (m.use_count(v) == 1).then_some(c)
            }) {
                found = Some((c, Some(beta)));
                break;
            }
        }
        found.as_ref()?;
    } else {
        found = Some((m.attempt(|m| core(m, root))?, None));
    }
    let ((x, axis, eps, gamma), beta) = found?;
    let ok_dtype = |v: Option<ValueId>| v.map(|v| m.g.value(v).ty.dtype == dtype).unwrap_or(true);
    if m.g.value(x).ty.dtype != dtype || !ok_dtype(gamma) || !ok_dtype(beta) {
        return None;
    }
    let name = m.g.value(root).name.clone();
    Some(Box::new(move |g| {
        let scale = scale_or_ones(g, &name, gamma, dtype)?;
        let mut ins = vec![x, scale];
        ins.extend(beta);
        let op = NormOp::LayerNorm {
            axis,
            epsilon: eps as f32,
            stash: DType::F32,
            has_bias: beta.is_some(),
        };
        emit(g, &name, Op::Norm(op), &ins)
    }))
}

/// `exp(x - max(x, a)) / sum(exp(x - max(x, a)), a)` (or without the max, or with
/// `* reciprocal(sum)`) along one axis → `Softmax { axis }`.
pub fn softmax(m: &mut Matcher, root: ValueId) -> Option<Build> {
    if !m.g.value(root).ty.dtype.is_float() {
        return None;
    }
    let (e, s) = if let Some(r) = m.attempt(|m| m.binary(root, BinaryOp::Div)) {
        r
    } else {
        let (a, b) = m.binary(root, BinaryOp::Mul)?;
        if let Some(s) = m.attempt(|m| m.unary(b, UnaryOp::Reciprocal)) {
            (a, s)
        } else {
            (b, m.unary(a, UnaryOp::Reciprocal)?)
        }
    };
    let z = m.unary(e, UnaryOp::Exp)?;
    let (e2, axis) = m.attempt(|m| {
        let n = m.op_where(s, |op| {
            matches!(
                op,
                Op::Reduce(ReduceOp::Reduce {
                    kind: ReduceKind::Sum,
                    keepdims: true,
                    ..
                })
            )
        })?;
        let Op::Reduce(ReduceOp::Reduce { axes, .. }) = &n.op else {
            return None;
        };
        match axes.as_slice() {
            [a] => Some((n.inputs[0], *a)),
            _ => None,
        }
    })?;
    if e2 != e {
        return None;
    }
    let x = m
        .attempt(|m| {
            let (x, mx) = m.binary(z, BinaryOp::Sub)?;
            let n = m.op_where(mx, |op| {
                matches!(
                    op,
                    Op::Reduce(ReduceOp::Reduce {
                        kind: ReduceKind::Max,
                        keepdims: true,
                        ..
                    })
                )
            })?;
            let Op::Reduce(ReduceOp::Reduce { axes, .. }) = &n.op else {
                return None;
            };
            (n.inputs[0] == x && axes.as_slice() == [axis]).then_some(x)
        })
        .unwrap_or(z);
    let name = m.g.value(root).name.clone();
    Some(Box::new(move |g| {
        emit(g, &name, Op::Norm(NormOp::Softmax { axis }), &[x])
    }))
}

/// `v` is a constant whose every element is `want` (at most `limit` elements).
fn const_all(m: &Matcher, v: ValueId, want: f64, limit: usize) -> bool {
    m.const_tensor_upto(v, limit)
        .is_some_and(|t| t.to_f64_vec().iter().all(|&x| x == want))
}

/// A per-channel parameter of `x: [N, C, *S]` as an elementwise operand: `c` elements,
/// shaped `[C, 1, ..]` or `[1, C, 1, ..]` (broadcast along axis 1 only).
fn per_channel(m: &Matcher, p: ValueId, rank: usize, c: usize) -> bool {
    let Some(ps) = m.g.value(p).ty.fixed_shape() else {
        return false;
    };
    if ps.len() > rank || ps.len() < rank - 1 {
        return false;
    }
    let pad = rank - ps.len();
    (0..rank).all(|d| {
        let n = if d < pad { 1 } else { ps[d - pad] };
        n == if d == 1 { c } else { 1 }
    })
}

/// What PyTorch's exporter writes for a group norm: `reshape(x, [N, G, -1])`, an instance
/// norm with unit scale and zero bias, `reshape` back to `x`'s shape, then the per-channel
/// affine `* gamma + beta` (`gamma`, `beta` of `C` elements along axis 1) →
/// `GroupNorm { G, eps }(x, gamma, beta)`, whose lowering reads `x` along its channels and
/// spatial dimensions directly.
pub fn group_norm(m: &mut Matcher, root: ValueId) -> Option<Build> {
    let dtype = m.g.value(root).ty.dtype;
    if !dtype.is_float() {
        return None;
    }
    let (a, b) = m.binary(root, BinaryOp::Add)?;
    let mut found = None;
    for (prod, beta) in [(a, b), (b, a)] {
        found = m.attempt(|m| {
            let (p, q) = m.binary(prod, BinaryOp::Mul)?;
            if m.use_count(prod) != 1 {
                return None;
            }
            let (back, gamma) = if m
                .node(p)
                .is_some_and(|n| matches!(n.op, Op::Layout(LayoutOp::Reshape { .. })))
            {
                (p, q)
            } else {
                (q, p)
            };
            let n_back = m.op_where(back, |op| {
                matches!(op, Op::Layout(LayoutOp::Reshape { .. }))
            })?;
            let inorm = n_back.inputs[0];
            let n_in = m.op_where(inorm, |op| {
                matches!(op, Op::Norm(NormOp::InstanceNorm { .. }))
            })?;
            let Op::Norm(NormOp::InstanceNorm { epsilon }) = n_in.op else {
                return None;
            };
            let (xr, ones, zeros) = (n_in.inputs[0], n_in.inputs[1], n_in.inputs[2]);
            let n_fwd = m.op_where(xr, |op| matches!(op, Op::Layout(LayoutOp::Reshape { .. })))?;
            let x = n_fwd.inputs[0];
            Some((x, xr, ones, zeros, epsilon, gamma, beta, back))
        });
        if found.is_some() {
            break;
        }
    }
    let (x, xr, ones, zeros, eps, gamma, beta, back) = found?;
    let xs = m.g.value(x).ty.fixed_shape()?;
    let rs = m.g.value(xr).ty.fixed_shape()?;
    if xs.len() < 3 || rs.len() != 3 || rs[0] != xs[0] || m.g.value(back).ty.fixed_shape()? != xs {
        return None;
    }
    let (c, groups) = (xs[1], rs[1]);
    if groups == 0 || c % groups != 0 || rs[2] != xs[1..].iter().product::<usize>() / groups {
        return None;
    }
    if !const_all(m, ones, 1.0, 1 << 16) || !const_all(m, zeros, 0.0, 1 << 16) {
        return None;
    }
    let rank = xs.len();
    if !per_channel(m, gamma, rank, c) || !per_channel(m, beta, rank, c) {
        return None;
    }
    let ok = |v: ValueId| m.g.value(v).ty.dtype == dtype;
    if !ok(x) || !ok(gamma) || !ok(beta) {
        return None;
    }
    let name = m.g.value(root).name.clone();
    Some(Box::new(move |g| {
        let flat = |g: &mut tilec_ir::Graph, v: ValueId| {
            let op = Op::Layout(LayoutOp::Reshape {
                shape: vec![Dim::Fixed(c)],
            });
            emit(g, &name, op, &[v])
        };
        let (s, b) = (flat(g, gamma)?, flat(g, beta)?);
        let op = NormOp::GroupNorm {
            num_groups: groups,
            epsilon: eps,
            channels_last: false,
        };
        emit(g, &name, Op::Norm(op), &[x, s, b])
    }))
}
