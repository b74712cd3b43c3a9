//! Reduction kernels: reduce over axes, arg-reductions, scans, top-k.
//!
//! Floats accumulate in f64 and round once to the output dtype. Integers (and bool) are
//! read exactly as i128 and combined with wrapping integer arithmetic, so u64/i64 values
//! beyond 2^53 stay exact and overflow wraps like the native type.

use super::util::{broadcast_index_map, split_at_axis};
use crate::EvalCtx;
use std::cmp::Ordering;
use tilec_ir::op::{ReduceKind, ReduceOp, ScanKind};
use tilec_ir::{dispatch, DType, Element, Tensor, TensorData};

pub fn eval(op: &ReduceOp, args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    let x = *args.first().ok_or("expected one input")?;
    match op {
        ReduceOp::Reduce {
            kind,
            axes,
            keepdims,
        } => reduce(*kind, axes, *keepdims, x).map(|t| vec![t]),
        ReduceOp::ArgMax {
            axis,
            keepdims,
            select_last_index,
        } => arg_reduce(x, *axis, *keepdims, *select_last_index, true).map(|t| vec![t]),
        ReduceOp::ArgMin {
            axis,
            keepdims,
            select_last_index,
        } => arg_reduce(x, *axis, *keepdims, *select_last_index, false).map(|t| vec![t]),
        ReduceOp::Scan {
            kind,
            axis,
            exclusive,
            reverse,
        } => scan(x, *kind, *axis, *exclusive, *reverse).map(|t| vec![t]),
        ReduceOp::TopK {
            axis,
            k,
            largest,
            sorted: _,
        } => topk(x, *axis, *k, *largest),
    }
}

/// Integer (and bool) elements as exact i128; `None` for float tensors.
pub fn ints_i128(t: &Tensor) -> Option<Vec<i128>> {
    fn c<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
        v.iter().map(|&x| x.into()).collect()
    }
    Some(match t.data() {
        TensorData::I8(v) => c(v),
        TensorData::I16(v) => c(v),
        TensorData::I32(v) => c(v),
        TensorData::I64(v) => c(v),
        TensorData::U8(v) => c(v),
        TensorData::U16(v) => c(v),
        TensorData::U32(v) => c(v),
        TensorData::U64(v) => c(v),
        TensorData::Bool(v) => v.iter().map(|&b| b as i128).collect(),
        _ => return None,
    })
}

/// Builds an integer/bool tensor from i128 values, wrapping like a C cast.
fn from_i128s(dtype: DType, shape: Vec<usize>, v: &[i128]) -> Result<Tensor, String> {
    let w: Vec<i64> = v.iter().map(|&x| x as i64).collect();
    Tensor::from_i64s(dtype, shape, &w).map_err(|e| e.to_string())
}

/// The smallest and largest value of an integer (or bool) dtype.
fn int_bounds(dtype: DType) -> (i128, i128) {
    match dtype {
        DType::I8 => (i8::MIN as i128, i8::MAX as i128),
        DType::I16 => (i16::MIN as i128, i16::MAX as i128),
        DType::I32 => (i32::MIN as i128, i32::MAX as i128),
        DType::I64 => (i64::MIN as i128, i64::MAX as i128),
        DType::U8 => (0, u8::MAX as i128),
        DType::U16 => (0, u16::MAX as i128),
        DType::U32 => (0, u32::MAX as i128),
        DType::U64 => (0, u64::MAX as i128),
        _ => (0, 1), // bool
    }
}

fn reduce(kind: ReduceKind, axes: &[usize], keepdims: bool, x: &Tensor) -> Result<Tensor, String> {
    let shape = x.shape();
    if let Some(&a) = axes.iter().find(|&&a| a >= shape.len()) {
        return Err(format!("axis {a} out of range for rank {}", shape.len()));
    }
    // The keepdims shape, broadcast back over the input, maps every input element to the
    // output element it contributes to.
    let kept: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let out_shape: Vec<usize> = if keepdims {
        kept.clone()
    } else {
        shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    let nout: usize = kept.iter().product();
    let count: usize = axes.iter().map(|&a| shape[a]).product();
    let map = broadcast_index_map(&kept, shape)?;
    if let Some(v) = ints_i128(x) {
        let out = reduce_int(kind, x.dtype(), &v, &map, nout, count);
        return from_i128s(x.dtype(), out_shape, &out);
    }
    let v = x.to_f64_vec();
    let out = reduce_float(kind, &v, &map, nout, count);
    Tensor::from_f64s(x.dtype(), out_shape, &out).map_err(|e| e.to_string())
}

fn reduce_float(kind: ReduceKind, v: &[f64], map: &[usize], nout: usize, count: usize) -> Vec<f64> {
    use ReduceKind::*;
    let sum_of = |f: &dyn Fn(f64) -> f64| {
        let mut acc = vec![0.0f64; nout];
        for (&x, &o) in v.iter().zip(map) {
            acc[o] += f(x);
        }
        acc
    };
    match kind {
        Sum => sum_of(&|x| x),
        Mean => sum_of(&|x| x)
            .into_iter()
            .map(|s| s / count as f64)
            .collect(),
        L1 => sum_of(&f64::abs),
        L2 => sum_of(&|x| x * x).into_iter().map(f64::sqrt).collect(),
        SumSquare => sum_of(&|x| x * x),
        LogSum => sum_of(&|x| x).into_iter().map(f64::ln).collect(),
        Prod => {
            let mut acc = vec![1.0f64; nout];
            for (&x, &o) in v.iter().zip(map) {
                acc[o] *= x;
            }
            acc
        }
        Max | Min => {
            let max = kind == Max;
            let mut acc = vec![
                if max {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                };
                nout
            ];
            for (&x, &o) in v.iter().zip(map) {
                let a = acc[o];
                // NaN is sticky, as in numpy.
                if !a.is_nan() && (x.is_nan() || (max && x > a) || (!max && x < a)) {
                    acc[o] = x;
                }
            }
            acc
        }
        LogSumExp => {
            let m = reduce_float(Max, v, map, nout, count);
            let mut acc = vec![0.0f64; nout];
            for (&x, &o) in v.iter().zip(map) {
                if m[o].is_finite() {
                    acc[o] += (x - m[o]).exp();
                }
            }
            // An all -inf (or empty) set gives -inf; +inf or NaN propagate through m.
            acc.iter()
                .zip(&m)
                .map(|(&s, &mx)| if mx.is_finite() { s.ln() + mx } else { mx })
                .collect()
        }
    }
}

fn reduce_int(
    kind: ReduceKind,
    dtype: DType,
    v: &[i128],
    map: &[usize],
    nout: usize,
    count: usize,
) -> Vec<i128> {
    use ReduceKind::*;
    let sum_of = |f: &dyn Fn(i128) -> i128| {
        let mut acc = vec![0i128; nout];
        for (&x, &o) in v.iter().zip(map) {
            acc[o] = acc[o].wrapping_add(f(x));
        }
        acc
    };
    // Real-valued results of integer inputs are computed in f64 and truncated.
    let via_f64 = |k: ReduceKind| -> Vec<i128> {
        let f: Vec<f64> = v.iter().map(|&x| x as f64).collect();
        reduce_float(k, &f, map, nout, count)
            .into_iter()
            .map(|y| if y.is_nan() { 0 } else { y.trunc() as i128 })
            .collect()
    };
    match kind {
        Sum => sum_of(&|x| x),
        Mean => sum_of(&|x| x)
            .into_iter()
            .map(|s| if count == 0 { 0 } else { s / count as i128 })
            .collect(),
        L1 => sum_of(&|x| x.wrapping_abs()),
        SumSquare => sum_of(&|x| x.wrapping_mul(x)),
        Prod => {
            let mut acc = vec![1i128; nout];
            for (&x, &o) in v.iter().zip(map) {
                acc[o] = acc[o].wrapping_mul(x);
            }
            acc
        }
        Max | Min => {
            let (lo, hi) = int_bounds(dtype);
            let max = kind == Max;
            let mut acc = vec![if max { lo } else { hi }; nout];
            for (&x, &o) in v.iter().zip(map) {
                acc[o] = if max { acc[o].max(x) } else { acc[o].min(x) };
            }
            acc
        }
        L2 | LogSum | LogSumExp => via_f64(kind),
    }
}

/// Compares two candidates of an arg-reduction: whether `c` (later along the axis)
/// replaces the current best `b`. NaN counts as the extreme, as in numpy.
fn arg_better<T: PartialOrd>(
    c: &T,
    b: &T,
    is_nan: impl Fn(&T) -> bool,
    max: bool,
    last: bool,
) -> bool {
    let (cn, bn) = (is_nan(c), is_nan(b));
    if cn || bn {
        return if last { cn } else { cn && !bn };
    }
    match (max, last) {
        (true, false) => c > b,
        (true, true) => c >= b,
        (false, false) => c < b,
        (false, true) => c <= b,
    }
}

fn arg_loop<T: PartialOrd>(
    v: &[T],
    shape: &[usize],
    axis: usize,
    is_nan: impl Fn(&T) -> bool + Copy,
    max: bool,
    last: bool,
) -> Vec<i64> {
    let (outer, len, inner) = split_at_axis(shape, axis);
    let mut out = vec![0i64; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let base = o * len * inner + i;
            let mut best = 0usize;
            for k in 1..len {
                if arg_better(
                    &v[base + k * inner],
                    &v[base + best * inner],
                    is_nan,
                    max,
                    last,
                ) {
                    best = k;
                }
            }
            out[o * inner + i] = best as i64;
        }
    }
    out
}

pub(crate) fn arg_reduce(
    x: &Tensor,
    axis: usize,
    keepdims: bool,
    last: bool,
    max: bool,
) -> Result<Tensor, String> {
    let shape = x.shape();
    if axis >= shape.len() {
        return Err(format!("axis {axis} out of range for rank {}", shape.len()));
    }
    if shape[axis] == 0 {
        return Err("arg-reduction over an empty axis has no result".into());
    }
    let out = match ints_i128(x) {
        Some(v) => arg_loop(&v, shape, axis, |_| false, max, last),
        None => arg_loop(
            &x.to_f64_vec(),
            shape,
            axis,
            |y: &f64| y.is_nan(),
            max,
            last,
        ),
    };
    let mut out_shape = shape.to_vec();
    if keepdims {
        out_shape[axis] = 1;
    } else {
        out_shape.remove(axis);
    }
    Tensor::from_vec(out_shape, out).map_err(|e| e.to_string())
}

fn scan(
    x: &Tensor,
    kind: ScanKind,
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> Result<Tensor, String> {
    let shape = x.shape();
    if axis >= shape.len() {
        return Err(format!("axis {axis} out of range for rank {}", shape.len()));
    }
    let (outer, len, inner) = split_at_axis(shape, axis);
    // Positions along the axis in scan order.
    let order: Vec<usize> = if reverse {
        (0..len).rev().collect()
    } else {
        (0..len).collect()
    };
    fn run<T: Copy>(
        v: &[T],
        out: &mut [T],
        outer: usize,
        len: usize,
        inner: usize,
        order: &[usize],
        init: T,
        f: impl Fn(T, T) -> T,
        exclusive: bool,
    ) {
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = init;
                for &k in order {
                    let idx = o * len * inner + k * inner + i;
                    if exclusive {
                        out[idx] = acc;
                        acc = f(acc, v[idx]);
                    } else {
                        acc = f(acc, v[idx]);
                        out[idx] = acc;
                    }
                }
            }
        }
    }
    let prod = kind == ScanKind::Prod;
    if let Some(v) = ints_i128(x) {
        let mut out = vec![0i128; v.len()];
        let f = move |a: i128, b: i128| {
            if prod {
                a.wrapping_mul(b)
            } else {
                a.wrapping_add(b)
            }
        };
        run(
            &v,
            &mut out,
            outer,
            len,
            inner,
            &order,
            if prod { 1 } else { 0 },
            f,
            exclusive,
        );
        return from_i128s(x.dtype(), shape.to_vec(), &out);
    }
    let v = x.to_f64_vec();
    let mut out = vec![0.0f64; v.len()];
    let f = move |a: f64, b: f64| if prod { a * b } else { a + b };
    run(
        &v,
        &mut out,
        outer,
        len,
        inner,
        &order,
        if prod { 1.0 } else { 0.0 },
        f,
        exclusive,
    );
    Tensor::from_f64s(x.dtype(), shape.to_vec(), &out).map_err(|e| e.to_string())
}

/// Total order for top-k on floats: NaN above everything (as numpy's sort).
fn cmp_f64(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Selects elements by flat index, keeping the exact element values.
fn pick(x: &Tensor, idx: &[usize], shape: Vec<usize>) -> Result<Tensor, String> {
    fn p<T: Element>(v: &[T], idx: &[usize]) -> TensorData {
        T::wrap(idx.iter().map(|&i| v[i]).collect())
    }
    Tensor::new(shape, dispatch!(x.data(), v => p(v, idx))).map_err(|e| e.to_string())
}

fn topk(x: &Tensor, axis: usize, k: usize, largest: bool) -> Result<Vec<Tensor>, String> {
    let shape = x.shape();
    if axis >= shape.len() {
        return Err(format!("axis {axis} out of range for rank {}", shape.len()));
    }
    let (outer, len, inner) = split_at_axis(shape, axis);
    if k > len {
        return Err(format!("k = {k} exceeds the axis length {len}"));
    }
    let ints = ints_i128(x);
    let floats = if ints.is_none() {
        x.to_f64_vec()
    } else {
        Vec::new()
    };
    let cmp = |a: usize, b: usize| match &ints {
        Some(v) => v[a].cmp(&v[b]),
        None => cmp_f64(floats[a], floats[b]),
    };
    let mut src = vec![0usize; outer * k * inner];
    let mut ind = vec![0i64; outer * k * inner];
    let mut cand: Vec<usize> = Vec::with_capacity(len);
    for o in 0..outer {
        for i in 0..inner {
            cand.clear();
            cand.extend(0..len);
            let flat = |j: usize| o * len * inner + j * inner + i;
            // Ties keep the lower index first for both directions.
            cand.sort_by(|&a, &b| {
                let c = cmp(flat(a), flat(b));
                let c = if largest { c.reverse() } else { c };
                c.then(a.cmp(&b))
            });
            for (j, &c) in cand.iter().take(k).enumerate() {
                let dst = o * k * inner + j * inner + i;
                src[dst] = flat(c);
                ind[dst] = c as i64;
            }
        }
    }
    let mut out_shape = shape.to_vec();
    out_shape[axis] = k;
    let values = pick(x, &src, out_shape.clone())?;
    let indices = Tensor::from_vec(out_shape, ind).map_err(|e| e.to_string())?;
    Ok(vec![values, indices])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t<T: Element>(shape: &[usize], v: Vec<T>) -> Tensor {
        Tensor::from_vec(shape.to_vec(), v).unwrap()
    }

    /// Naive reduction over a 3-D tensor for a set of axes, by explicit loops.
    fn naive_sum(x: &[f64], s: [usize; 3], axes: &[usize]) -> Vec<f64> {
        let os: Vec<usize> = (0..3)
            .map(|i| if axes.contains(&i) { 1 } else { s[i] })
            .collect();
        let mut out = vec![0.0; os.iter().product()];
        for a in 0..s[0] {
            for b in 0..s[1] {
                for c in 0..s[2] {
                    let idx = [a, b, c];
                    let oi: Vec<usize> = (0..3)
                        .map(|i| if axes.contains(&i) { 0 } else { idx[i] })
                        .collect();
                    out[(oi[0] * os[1] + oi[1]) * os[2] + oi[2]] += x[(a * s[1] + b) * s[2] + c];
                }
            }
        }
        out
    }

    #[test]
    fn sum_matches_naive_for_every_axis_set() {
        let s = [2, 3, 4];
        let x: Vec<f64> = (0..24).map(|i| (i * 7 % 11) as f64 - 3.0).collect();
        let xt = t(&s, x.clone());
        for axes in [
            vec![],
            vec![0],
            vec![1],
            vec![2],
            vec![0, 2],
            vec![1, 2],
            vec![0, 1, 2],
        ] {
            let r = reduce(ReduceKind::Sum, &axes, true, &xt).unwrap();
            assert_eq!(r.to_f64_vec(), naive_sum(&x, s, &axes), "axes {axes:?}");
        }
    }

    #[test]
    fn empty_reductions_give_identities() {
        let x = t::<f32>(&[2, 0, 4], vec![]);
        let r = |k| reduce(k, &[1], true, &x).unwrap().to_f64_vec();
        assert_eq!(r(ReduceKind::Sum), vec![0.0; 8]);
        assert_eq!(r(ReduceKind::Prod), vec![1.0; 8]);
        assert_eq!(r(ReduceKind::Min), vec![f64::INFINITY; 8]);
        assert_eq!(r(ReduceKind::Max), vec![f64::NEG_INFINITY; 8]);
        assert_eq!(r(ReduceKind::LogSumExp), vec![f64::NEG_INFINITY; 8]);
        let xi = t::<i32>(&[0, 2], vec![]);
        assert_eq!(
            reduce(ReduceKind::Max, &[0], false, &xi)
                .unwrap()
                .to_i64_vec(),
            vec![i32::MIN as i64; 2]
        );
    }

    #[test]
    fn integer_reductions_are_exact_and_wrap() {
        let big = u64::MAX - 1;
        let x = t(&[2], vec![big, 1u64]);
        let r = reduce(ReduceKind::Max, &[0], false, &x).unwrap();
        assert_eq!(r.as_slice::<u64>().unwrap(), &[big]);
        let r = reduce(ReduceKind::Sum, &[0], false, &x).unwrap();
        assert_eq!(r.as_slice::<u64>().unwrap(), &[u64::MAX]);
        let y = t(&[2], vec![i64::MAX, 2]);
        let r = reduce(ReduceKind::Sum, &[0], false, &y).unwrap();
        assert_eq!(r.as_slice::<i64>().unwrap(), &[i64::MAX.wrapping_add(2)]);
    }

    #[test]
    fn argmax_ties_and_last_index() {
        let x = t(&[2, 3], vec![1.0f32, 3.0, 3.0, 2.0, 0.0, 2.0]);
        let f = |last| arg_reduce(&x, 1, false, last, true).unwrap().to_i64_vec();
        assert_eq!(f(false), vec![1, 0]);
        assert_eq!(f(true), vec![2, 2]);
        let m = arg_reduce(&x, 0, true, false, false).unwrap();
        assert_eq!(m.shape(), &[1, 3]);
        assert_eq!(m.to_i64_vec(), vec![0, 1, 1]);
    }

    #[test]
    fn scan_variants_match_naive() {
        let x = t(&[2, 3], vec![1i32, 2, 3, 4, 5, 6]);
        let s = |e, r| scan(&x, ScanKind::Sum, 1, e, r).unwrap().to_i64_vec();
        assert_eq!(s(false, false), vec![1, 3, 6, 4, 9, 15]);
        assert_eq!(s(true, false), vec![0, 1, 3, 0, 4, 9]);
        assert_eq!(s(false, true), vec![6, 5, 3, 15, 11, 6]);
        assert_eq!(s(true, true), vec![5, 3, 0, 11, 6, 0]);
        let p = scan(&x, ScanKind::Prod, 0, false, false)
            .unwrap()
            .to_i64_vec();
        assert_eq!(p, vec![1, 2, 3, 4, 10, 18]);
    }

    #[test]
    fn topk_orders_ties_by_index() {
        let x = t(&[1, 5], vec![2.0f64, 5.0, 2.0, 5.0, 1.0]);
        let r = topk(&x, 1, 3, true).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![5.0, 5.0, 2.0]);
        assert_eq!(r[1].to_i64_vec(), vec![1, 3, 0]);
        let r = topk(&x, 1, 2, false).unwrap();
        assert_eq!(r[1].to_i64_vec(), vec![4, 0]);
    }
}
