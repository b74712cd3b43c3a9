//! Einsum, Det, Col2Im.

use super::{from_f64, Num};
use tilec_ir::Tensor;

/// Sizes of every label (size-1 dims broadcast) and, per input, each label's element
/// stride (summed over repeated labels, which walks the diagonal; 0 when broadcast).
fn einsum_plan(
    args: &[&Tensor],
    subs: &[Vec<u8>],
) -> Result<(Vec<u8>, Vec<usize>, Vec<Vec<usize>>), String> {
    let mut labels: Vec<u8> = Vec::new();
    let mut sizes: Vec<usize> = Vec::new();
    for (t, s) in args.iter().zip(subs) {
        if t.rank() != s.len() {
            return Err(format!(
                "operand of shape {:?} has {} subscripts",
                t.shape(),
                s.len()
            ));
        }
        for (&l, &d) in s.iter().zip(t.shape()) {
            match labels.iter().position(|&x| x == l) {
                None => {
                    labels.push(l);
                    sizes.push(d);
                }
                Some(i) => {
                    if sizes[i] == 1 {
                        sizes[i] = d;
                    } else if d != 1 && d != sizes[i] {
                        return Err(format!("label {} has sizes {} and {d}", l, sizes[i]));
                    }
                }
            }
        }
    }
    let mut strides = Vec::new();
    for (t, s) in args.iter().zip(subs) {
        let ts = tilec_ir::strides(t.shape());
        let mut st = vec![0usize; labels.len()];
        for (j, &l) in s.iter().enumerate() {
            let i = labels.iter().position(|&x| x == l).unwrap_or(0);
            if t.shape()[j] != 1 || sizes[i] == 1 {
                st[i] += ts[j];
            }
        }
        strides.push(st);
    }
    Ok((labels, sizes, strides))
}

/// Runs the einsum loop nest: output labels outermost, summed labels innermost.
fn einsum_core<A: Num>(
    vals: &[Vec<A>],
    order: &[usize],
    sizes: &[usize],
    strides: &[Vec<usize>],
    n_out: usize,
    one: A,
) -> Vec<A> {
    let out_len: usize = order[..n_out].iter().map(|&l| sizes[l]).product();
    let sum_len: usize = order[n_out..].iter().map(|&l| sizes[l]).product();
    let mut out = vec![A::default(); out_len];
    if out_len == 0 || sum_len == 0 {
        return out;
    }
    let dims: Vec<usize> = order.iter().map(|&l| sizes[l]).collect();
    let st: Vec<Vec<usize>> = strides
        .iter()
        .map(|s| order.iter().map(|&l| s[l]).collect())
        .collect();
    let mut idx = vec![0usize; order.len()];
    let mut off = vec![0usize; vals.len()];
    for o in out.iter_mut() {
        let mut acc = A::default();
        for _ in 0..sum_len {
            let mut prod = one;
            for (v, &f) in vals.iter().zip(&off) {
                prod = A::default().madd(prod, v[f]);
            }
            acc = acc.plus(prod);
            // Odometer increment over all labels (output labels carry into the next o).
            for p in (0..order.len()).rev() {
                idx[p] += 1;
                for (f, s) in off.iter_mut().zip(&st) {
                    *f += s[p];
                }
                if idx[p] < dims[p] {
                    break;
                }
                for (f, s) in off.iter_mut().zip(&st) {
                    *f -= s[p] * dims[p];
                }
                idx[p] = 0;
            }
        }
        *o = acc;
    }
    out
}

pub fn einsum(args: &[&Tensor], subs: &[Vec<u8>], output: &[u8]) -> Result<Tensor, String> {
    if args.len() != subs.len() || args.is_empty() {
        return Err(format!(
            "equation has {} operands, got {} inputs",
            subs.len(),
            args.len()
        ));
    }
    let (labels, sizes, strides) = einsum_plan(args, subs)?;
    let mut order = Vec::new();
    for &l in output {
        order.push(
            labels
                .iter()
                .position(|&x| x == l)
                .ok_or("output label is not in any input")?,
        );
    }
    let n_out = order.len();
    for i in 0..labels.len() {
        if !order.contains(&i) {
            order.push(i);
        }
    }
    let shape: Vec<usize> = order[..n_out].iter().map(|&l| sizes[l]).collect();
    let dt = args[0].dtype();
    if dt.is_int() {
        let vals: Vec<Vec<i64>> = args.iter().map(|t| t.to_i64_vec()).collect();
        let out = einsum_core(&vals, &order, &sizes, &strides, n_out, 1i64);
        Tensor::from_i64s(dt, shape, &out).map_err(|e| e.to_string())
    } else {
        let vals: Vec<Vec<f64>> = args.iter().map(|t| t.to_f64_vec()).collect();
        let out = einsum_core(&vals, &order, &sizes, &strides, n_out, 1.0f64);
        from_f64(dt, shape, &out)
    }
}

/// Determinant by LU decomposition with partial pivoting.
fn det_one(mut a: Vec<f64>, n: usize) -> f64 {
    let mut det = 1.0;
    for c in 0..n {
        let p = (c..n)
            .max_by(|&i, &j| a[i * n + c].abs().total_cmp(&a[j * n + c].abs()))
            .unwrap_or(c);
        if a[p * n + c] == 0.0 {
            return 0.0;
        }
        if p != c {
            for j in 0..n {
                a.swap(p * n + j, c * n + j);
            }
            det = -det;
        }
        let piv = a[c * n + c];
        det *= piv;
        for r in c + 1..n {
            let f = a[r * n + c] / piv;
            if f != 0.0 {
                for j in c..n {
                    a[r * n + j] -= f * a[c * n + j];
                }
            }
        }
    }
    det
}

pub fn det(x: &Tensor) -> Result<Tensor, String> {
    let s = x.shape();
    let r = s.len();
    if r < 2 || s[r - 1] != s[r - 2] {
        return Err(format!("det needs square matrices [*, n, n], got {s:?}"));
    }
    let n = s[r - 1];
    let v = x.to_f64_vec();
    let count: usize = s[..r - 2].iter().product();
    let out: Vec<f64> = (0..count)
        .map(|i| det_one(v[i * n * n..(i + 1) * n * n].to_vec(), n))
        .collect();
    from_f64(x.dtype(), s[..r - 2].to_vec(), &out)
}

pub struct Col2ImParams<'a> {
    pub image_shape: &'a [usize],
    pub block_shape: &'a [usize],
    pub dilations: &'a [usize],
    pub pads: &'a [usize],
    pub strides: &'a [usize],
}

/// Unravels a flat row-major index.
fn unravel(mut flat: usize, dims: &[usize], out: &mut [usize]) {
    for a in (0..dims.len()).rev() {
        out[a] = flat % dims[a].max(1);
        flat /= dims[a].max(1);
    }
}

pub fn col2im(x: &Tensor, p: &Col2ImParams) -> Result<Tensor, String> {
    let xs = x.shape();
    let nd = p.image_shape.len();
    let bsz: usize = p.block_shape.iter().product();
    if xs.len() != 3 || bsz == 0 || xs[1] % bsz != 0 {
        return Err(format!("input {xs:?} must be [N, C*{bsz}, L]"));
    }
    let (n, c, l) = (xs[0], xs[1] / bsz, xs[2]);
    let mut grid = Vec::new();
    for i in 0..nd {
        let eff = (p.block_shape[i] - 1) * p.dilations[i] + 1;
        let padded = p.image_shape[i] + p.pads[i] + p.pads[nd + i];
        if padded < eff || p.strides[i] == 0 {
            return Err(format!("axis {i}: the block does not fit the padded image"));
        }
        grid.push((padded - eff) / p.strides[i] + 1);
    }
    if grid.iter().product::<usize>() != l {
        return Err(format!("input has {l} blocks, the geometry gives {grid:?}"));
    }
    let img: usize = p.image_shape.iter().product();
    let ist = tilec_ir::strides(p.image_shape);
    let xv = x.to_f64_vec();
    let mut out = vec![0.0; n * c * img];
    let mut kb = vec![0; nd];
    let mut gb = vec![0; nd];
    for b in 0..n {
        for ch in 0..c {
            for k in 0..bsz {
                unravel(k, p.block_shape, &mut kb);
                let row = &xv[((b * c + ch) * bsz + k) * l..][..l];
                for (li, &v) in row.iter().enumerate() {
                    unravel(li, &grid, &mut gb);
                    let mut pos = 0usize;
                    let mut inside = true;
                    for a in 0..nd {
                        let q = (gb[a] * p.strides[a] + kb[a] * p.dilations[a]) as isize
                            - p.pads[a] as isize;
                        if q < 0 || q as usize >= p.image_shape[a] {
                            inside = false;
                            break;
                        }
                        pos += q as usize * ist[a];
                    }
                    if inside {
                        out[(b * c + ch) * img + pos] += v;
                    }
                }
            }
        }
    }
    let mut shape = vec![n, c];
    shape.extend_from_slice(p.image_shape);
    from_f64(x.dtype(), shape, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn einsum_diagonal_trace_and_matmul() {
        let m = Tensor::from_vec(vec![3, 3], (0..9).map(|v| v as f64).collect()).unwrap();
        let t = einsum(&[&m], &[b"ii".to_vec()], b"").unwrap();
        assert_eq!(t.to_f64_vec(), vec![12.0]);
        let d = einsum(&[&m], &[b"ii".to_vec()], b"i").unwrap();
        assert_eq!(d.to_f64_vec(), vec![0.0, 4.0, 8.0]);
        let p = einsum(&[&m, &m], &[b"ij".to_vec(), b"jk".to_vec()], b"ik").unwrap();
        let want = super::super::matmul::matmul(&m, &m).unwrap();
        assert_eq!(p.to_f64_vec(), want.to_f64_vec());
        let tr = einsum(&[&m], &[b"ij".to_vec()], b"ji").unwrap();
        assert_eq!(tr.to_f64_vec()[1], 3.0);
    }

    #[test]
    fn det_known_values() {
        let a = Tensor::from_vec(
            vec![2, 2, 2],
            vec![1.0f64, 2.0, 3.0, 4.0, 0.0, 1.0, 1.0, 0.0],
        )
        .unwrap();
        let d = det(&a).unwrap().to_f64_vec();
        assert!((d[0] + 2.0).abs() < 1e-12 && (d[1] + 1.0).abs() < 1e-12);
    }
}
