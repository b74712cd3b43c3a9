//! Source kernels: tensors built from attributes and (run-time) dimension values.

use crate::EvalCtx;
use tilec_ir::op::range_len;
#[cfg(test)]
use tilec_ir::op::range_len_i64;
use tilec_ir::op::{DimValue, SourceOp};
use tilec_ir::size::try_filled;
use tilec_ir::{dispatch, Element, Tensor, TensorData};

fn splat_t<T: Element>(v: &[T], n: usize) -> Result<TensorData, String> {
    let x = *v.first().ok_or("fill value is empty")?;
    Ok(T::wrap(try_filled(n, x)?))
}

fn scalars<T: Copy + Default>(a: &Tensor, b: &Tensor, c: &Tensor, f: fn(&Tensor) -> Vec<T>) -> [T; 3] {
    [a, b, c].map(|t| f(t).first().copied().unwrap_or_default())
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
    let (ints, floats) = (scalars(start, limit, delta, Tensor::to_i64_vec), scalars(start, limit, delta, Tensor::to_f64_vec));
    let n = range_len(dt, ints, floats)?;
    // Built in the output dtype directly: the length is checked, the memory may still fail.
    if dt.is_int() {
        let [s, _, d] = ints;
        let mut v = try_filled(n, 0i64)?;
        for (i, x) in v.iter_mut().enumerate() {
            *x = s.wrapping_add((i as i64).wrapping_mul(d));
        }
        Tensor::from_i64s(dt, vec![n], &v).map_err(|e| e.to_string())
    } else {
        let [s, _, d] = floats;
        let mut v = try_filled(n, 0f64)?;
        for (i, x) in v.iter_mut().enumerate() {
            *x = s + i as f64 * d;
        }
        Tensor::from_f64s(dt, vec![n], &v).map_err(|e| e.to_string())
    }
}

pub fn eval(op: &SourceOp, args: &[&Tensor], cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    match op {
        SourceOp::Fill { shape, value } => {
            let s = cx.dims(shape)?;
            let n = tilec_ir::size::byte_size(value.dtype(), &s).map_err(|e| e.to_string())? / value.dtype().size_bytes();
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
            tilec_ir::size::byte_size(*dtype, &[r, c]).map_err(|e| e.to_string())?;
            let mut v = try_filled(r * c, 0i64)?;
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
