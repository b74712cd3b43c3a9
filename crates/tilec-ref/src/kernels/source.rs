//! Source kernels: tensors built from attributes and (run-time) dimension values.

use crate::EvalCtx;
use tilec_ir::op::{DimValue, SourceOp};
use tilec_ir::{dispatch, Element, Tensor, TensorData};

fn splat_t<T: Element>(v: &[T], n: usize) -> Result<TensorData, String> {
    let x = *v.first().ok_or("fill value is empty")?;
    Ok(T::wrap(vec![x; n]))
}

/// Number of elements of `range(start, limit, delta)`.
pub fn range_len_f64(start: f64, limit: f64, delta: f64) -> Result<usize, String> {
    if delta == 0.0 || !delta.is_finite() {
        return Err(format!("range delta must be finite and non-zero, got {delta}"));
    }
    let n = ((limit - start) / delta).ceil();
    if !n.is_finite() {
        return Err("range length is not finite".into());
    }
    Ok(n.max(0.0) as usize)
}

/// Number of elements of an integer `range(start, limit, delta)`, exactly.
pub fn range_len_i64(start: i64, limit: i64, delta: i64) -> Result<usize, String> {
    if delta == 0 {
        return Err("range delta must be non-zero".into());
    }
    let span = limit as i128 - start as i128;
    let d = delta as i128;
    // div_euclid floors for a positive divisor and ceils for a negative one.
    let n = if d > 0 { (span + d - 1).div_euclid(d) } else { span.div_euclid(d) };
    Ok(n.max(0) as usize)
}

/// Evaluates Range on scalar tensors of one dtype.
pub fn range(start: &Tensor, limit: &Tensor, delta: &Tensor) -> Result<Tensor, String> {
    let dt = start.dtype();
    if limit.dtype() != dt || delta.dtype() != dt {
        return Err("range operands differ in dtype".into());
    }
    let one = |t: &Tensor| t.numel() == 1;
    if !(one(start) && one(limit) && one(delta)) {
        return Err("range operands must be scalars".into());
    }
    if dt.is_int() {
        let (s, l, d) = (start.to_i64_vec()[0], limit.to_i64_vec()[0], delta.to_i64_vec()[0]);
        let n = range_len_i64(s, l, d)?;
        let v: Vec<i64> = (0..n as i64).map(|i| s.wrapping_add(i.wrapping_mul(d))).collect();
        Tensor::from_i64s(dt, vec![n], &v).map_err(|e| e.to_string())
    } else {
        let (s, l, d) = (start.to_f64_vec()[0], limit.to_f64_vec()[0], delta.to_f64_vec()[0]);
        let n = range_len_f64(s, l, d)?;
        let v: Vec<f64> = (0..n).map(|i| s + i as f64 * d).collect();
        Tensor::from_f64s(dt, vec![n], &v).map_err(|e| e.to_string())
    }
}

pub fn eval(op: &SourceOp, args: &[&Tensor], cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    match op {
        SourceOp::Fill { shape, value } => {
            let s = cx.dims(shape)?;
            let n = s.iter().product();
            let data = dispatch!(value.data(), v => splat_t(&v[..], n))?;
            Ok(vec![Tensor::new(s, data).map_err(|e| e.to_string())?])
        }
        SourceOp::DimValues { elems, shape, dtype } => {
            let mut v = Vec::with_capacity(elems.len());
            for e in elems {
                v.push(match e {
                    DimValue::Int(i) => *i,
                    DimValue::Dim(d) => cx.dim(*d)? as i64,
                });
            }
            Ok(vec![Tensor::from_i64s(*dtype, shape.clone(), &v).map_err(|e| e.to_string())?])
        }
        SourceOp::Range { .. } => {
            if args.len() != 3 {
                return Err("range takes 3 inputs".into());
            }
            Ok(vec![range(args[0], args[1], args[2])?])
        }
        SourceOp::Eye { rows, cols, k, dtype } => {
            let (r, c) = (cx.dim(*rows)?, cx.dim(*cols)?);
            let mut v = vec![0i64; r * c];
            for i in 0..r {
                let j = i as i64 + k;
                if j >= 0 && (j as usize) < c {
                    v[i * c + j as usize] = 1;
                }
            }
            Ok(vec![Tensor::from_i64s(*dtype, vec![r, c], &v).map_err(|e| e.to_string())?])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_range_len_matches_naive() {
        for s in -7..7i64 {
            for l in -7..7i64 {
                for d in [-3i64, -2, -1, 1, 2, 3] {
                    let mut n = 0;
                    let mut x = s;
                    while (d > 0 && x < l) || (d < 0 && x > l) {
                        n += 1;
                        x += d;
                    }
                    assert_eq!(range_len_i64(s, l, d).unwrap(), n, "{s} {l} {d}");
                }
            }
        }
    }
}
