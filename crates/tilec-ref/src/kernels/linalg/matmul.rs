//! MatMul, MatMulInteger, QLinearMatMul.

use super::{from_f64, par_chunks, threads_for, Num};
use crate::kernels::util::{broadcast, broadcast_index_map};
use half::{bf16, f16};
use tilec_ir::{DType, Tensor};

/// Shapes of a matmul after promoting 1-D operands: `(batch, m, k, n, out_shape)`.
struct MatShape {
    batch: Vec<usize>,
    a_batch: Vec<usize>,
    b_batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    out: Vec<usize>,
}

fn mat_shape(sa: &[usize], sb: &[usize]) -> Result<MatShape, String> {
    if sa.is_empty() || sb.is_empty() {
        return Err("matmul operands must have rank >= 1".into());
    }
    let mut a = sa.to_vec();
    let mut b = sb.to_vec();
    let (a1, b1) = (a.len() == 1, b.len() == 1);
    if a1 {
        a.insert(0, 1);
    }
    if b1 {
        b.push(1);
    }
    let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
    let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
    if k != k2 {
        return Err(format!("inner dimensions differ: {sa:?} @ {sb:?}"));
    }
    let a_batch = a[..a.len() - 2].to_vec();
    let b_batch = b[..b.len() - 2].to_vec();
    let batch = broadcast(&a_batch, &b_batch)?;
    let mut out = batch.clone();
    if !a1 {
        out.push(m);
    }
    if !b1 {
        out.push(n);
    }
    Ok(MatShape {
        batch,
        a_batch,
        b_batch,
        m,
        k,
        n,
        out,
    })
}

/// Batched `a @ b` with per-element conversion `cv` into the accumulator type.
/// Row `i` of each batch accumulates `a[i, kk] * b[kk, :]` over `kk`: contiguous rows of
/// `b` and of the output, an inner loop the compiler vectorizes.
fn matmul_core<T: Copy + Sync, A: Num>(
    a: &[T],
    b: &[T],
    s: &MatShape,
    cv: impl Fn(T) -> A + Copy + Sync,
) -> Result<Vec<A>, String> {
    let (m, k, n) = (s.m, s.k, s.n);
    let ma = broadcast_index_map(&s.a_batch, &s.batch)?;
    let mb = broadcast_index_map(&s.b_batch, &s.batch)?;
    let nb: usize = s.batch.iter().product();
    let mut out = vec![A::default(); nb * m * n];
    if n == 0 {
        return Ok(out);
    }
    let threads = threads_for(nb * m * n * k);
    par_chunks(&mut out, n, threads, |row, acc| {
        let (bi, i) = (row / m.max(1), row % m.max(1));
        let abase = ma[bi] * m * k + i * k;
        let bbase = mb[bi] * k * n;
        for kk in 0..k {
            let av = cv(a[abase + kk]);
            let brow = &b[bbase + kk * n..bbase + kk * n + n];
            for (o, &bv) in acc.iter_mut().zip(brow) {
                *o = o.madd(av, cv(bv));
            }
        }
    });
    Ok(out)
}

pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let s = mat_shape(a.shape(), b.shape())?;
    let dt = a.dtype();
    if b.dtype() != dt {
        return Err(format!("operand dtypes differ: {dt} vs {}", b.dtype()));
    }
    if dt.is_float() {
        let out: Vec<f64> = match (
            a.as_slice::<f64>(),
            b.as_slice::<f64>(),
            a.as_slice::<f32>(),
            b.as_slice::<f32>(),
        ) {
            (Some(x), Some(y), _, _) => matmul_core(x, y, &s, |v| v)?,
            (_, _, Some(x), Some(y)) => matmul_core(x, y, &s, |v| v as f64)?,
            _ => matmul_core(&a.to_f64_vec(), &b.to_f64_vec(), &s, |v| v)?,
        };
        from_f64(dt, s.out, &out)
    } else if dt.is_int() {
        let out = matmul_core(&a.to_i64_vec(), &b.to_i64_vec(), &s, |v| v)?;
        Tensor::from_i64s(dt, s.out, &out).map_err(|e| e.to_string())
    } else {
        Err(format!("matmul does not support {dt}"))
    }
}

/// Subtracts a zero point that is a scalar, or per row (`axis = -2`) / per column
/// (`axis = -1`) of the operand's trailing matrix.
fn sub_zero_point(
    v: &mut [i64],
    shape: &[usize],
    zp: &Tensor,
    per_row: bool,
) -> Result<(), String> {
    let z = zp.to_i64_vec();
    if z.len() == 1 {
        v.iter_mut().for_each(|x| *x -= z[0]);
        return Ok(());
    }
    let r = shape.len();
    let (rows, cols) = if r >= 2 {
        (shape[r - 2], shape[r - 1])
    } else {
        (1, shape.first().copied().unwrap_or(1))
    };
    let want = if per_row { rows } else { cols };
    if zp.rank() != 1 || z.len() != want {
        return Err(format!(
            "zero point of shape {:?} does not match operand {shape:?}",
            zp.shape()
        ));
    }
    for (i, x) in v.iter_mut().enumerate() {
        let j = if per_row {
            (i / cols.max(1)) % rows.max(1)
        } else {
            i % cols.max(1)
        };
        *x -= z[j];
    }
    Ok(())
}

pub fn matmul_integer(args: &[&Tensor]) -> Result<Tensor, String> {
    let (a, b) = (args[0], args[1]);
    let s = mat_shape(a.shape(), b.shape())?;
    let mut av = a.to_i64_vec();
    let mut bv = b.to_i64_vec();
    sub_zero_point(&mut av, a.shape(), args[2], true)?;
    sub_zero_point(&mut bv, b.shape(), args[3], false)?;
    let out = matmul_core(&av, &bv, &s, |v| v)?;
    Tensor::from_i64s(DType::I32, s.out, &out).map_err(|e| e.to_string())
}

/// Rounds to the precision of a float dtype (scales multiply in their own type).
pub(super) fn round_to(dt: DType, x: f64) -> f64 {
    match dt {
        DType::F32 => x as f32 as f64,
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        _ => x,
    }
}

/// Requantizes `acc * mult + zp`: round half to even, saturate to the output's range.
pub(super) fn requantize(acc: i64, mult: f64, zp: i64, dt: DType) -> i64 {
    let (lo, hi) = if dt == DType::I8 {
        (-128.0, 127.0)
    } else {
        (0.0, 255.0)
    };
    let v = (acc as f64 * mult + zp as f64).clamp(lo, hi);
    v.round_ties_even() as i64
}

/// Values of a scalar or 1-D per-row/per-column parameter, indexed by `i`.
pub(super) fn param_at(v: &[f64], i: usize) -> f64 {
    if v.len() == 1 {
        v[0]
    } else {
        v.get(i).copied().unwrap_or(f64::NAN)
    }
}

pub fn qlinear_matmul(args: &[&Tensor]) -> Result<Tensor, String> {
    let (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) = (
        args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7],
    );
    let s = mat_shape(a.shape(), b.shape())?;
    let mut av = a.to_i64_vec();
    let mut bv = b.to_i64_vec();
    sub_zero_point(&mut av, a.shape(), a_zp, true)?;
    sub_zero_point(&mut bv, b.shape(), b_zp, false)?;
    let acc = matmul_core(&av, &bv, &s, |v| v)?;
    let (sa, sb, sy) = (
        a_scale.to_f64_vec(),
        b_scale.to_f64_vec(),
        y_scale.to_f64_vec(),
    );
    let yz = y_zp.to_i64_vec();
    if sy.len() != 1 || yz.len() != 1 {
        return Err("y_scale and y_zero_point must be scalars".into());
    }
    for (p, len, what) in [(&sa, s.m, "a_scale"), (&sb, s.n, "b_scale")] {
        if p.len() != 1 && p.len() != len {
            return Err(format!(
                "{what} has {} elements, expected 1 or {len}",
                p.len()
            ));
        }
    }
    let sdt = a_scale.dtype();
    let odt = y_zp.dtype();
    let (m, n) = (s.m.max(1), s.n.max(1));
    let out: Vec<i64> = acc
        .iter()
        .enumerate()
        .map(|(idx, &c)| {
            let (i, j) = ((idx / n) % m, idx % n);
            let mult = round_to(
                sdt,
                round_to(sdt, param_at(&sa, i) * param_at(&sb, j)) / sy[0],
            );
            requantize(c, mult, yz[0], odt)
        })
        .collect();
    Tensor::from_i64s(odt, s.out, &out).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut o = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                for kk in 0..k {
                    o[i * n + j] += a[i * k + kk] * b[kk * n + j];
                }
            }
        }
        o
    }

    #[test]
    fn batched_broadcast_matches_naive() {
        // a [2, 1, 3, 4] @ b [3, 4, 5] → [2, 3, 3, 5]
        let av: Vec<f64> = (0..24).map(|x| (x as f64 * 0.37).sin()).collect();
        let bv: Vec<f64> = (0..60).map(|x| (x as f64 * 0.11).cos()).collect();
        let a = Tensor::from_vec(vec![2, 1, 3, 4], av.clone()).unwrap();
        let b = Tensor::from_vec(vec![3, 4, 5], bv.clone()).unwrap();
        let y = matmul(&a, &b).unwrap();
        assert_eq!(y.shape(), &[2, 3, 3, 5]);
        let yv = y.to_f64_vec();
        for i in 0..2 {
            for j in 0..3 {
                let want = naive(&av[i * 12..i * 12 + 12], &bv[j * 20..j * 20 + 20], 3, 4, 5);
                let got = &yv[(i * 3 + j) * 15..(i * 3 + j) * 15 + 15];
                for (w, g) in want.iter().zip(got) {
                    assert!((w - g).abs() < 1e-12);
                }
            }
        }
    }

    #[test]
    fn vectors_and_ints() {
        let a = Tensor::from_vec(vec![3], vec![1i64, 2, 3]).unwrap();
        let b = Tensor::from_vec(vec![3], vec![4i64, 5, 6]).unwrap();
        let y = matmul(&a, &b).unwrap();
        assert_eq!(y.shape(), &[] as &[usize]);
        assert_eq!(y.to_i64_vec(), vec![32]);
        // Exact beyond 2^53.
        let a = Tensor::from_vec(vec![1, 1], vec![(1i64 << 60) + 1]).unwrap();
        let b = Tensor::from_vec(vec![1], vec![1i64]).unwrap();
        assert_eq!(matmul(&a, &b).unwrap().to_i64_vec(), vec![(1i64 << 60) + 1]);
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// VGG's fc6 (1x25088 @ 25088x4096): `cargo test -p tilec-ref matmul_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn matmul_timing() {
        let a = Tensor::from_vec(
            vec![1, 25088],
            (0..25088).map(|i| (i % 13) as f32 * 0.1).collect(),
        )
        .unwrap();
        let b = Tensor::from_vec(
            vec![25088, 4096],
            (0..25088 * 4096).map(|i| (i % 7) as f32 * 0.01).collect(),
        )
        .unwrap();
        let t = std::time::Instant::now();
        let y = matmul(&a, &b).unwrap();
        eprintln!(
            "matmul 1x25088 @ 25088x4096: {:?}, out {:?}",
            t.elapsed(),
            y.shape()
        );
    }
}
