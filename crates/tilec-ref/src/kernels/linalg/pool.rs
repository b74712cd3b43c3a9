//! MaxPool (with indices), AveragePool, LpPool, their global forms, MaxUnpool.

use super::from_f64;
use tilec_ir::op::{window_geometry, Padding, PoolKind, Window};
use tilec_ir::Tensor;

fn pad3(v: &[usize], fill: usize) -> Result<[usize; 3], String> {
    if v.len() > 3 {
        return Err(format!(
            "{} spatial axes are not supported (at most 3)",
            v.len()
        ));
    }
    let mut o = [fill; 3];
    o[3 - v.len()..].copy_from_slice(v);
    Ok(o)
}

pub fn pool(
    x: &Tensor,
    kind: &PoolKind,
    window: &Window,
    ceil_mode: bool,
) -> Result<Vec<Tensor>, String> {
    let xs = x.shape();
    if xs.len() < 3 || xs.len() - 2 != window.rank() {
        return Err(format!(
            "input {xs:?} does not match a {}-D window",
            window.rank()
        ));
    }
    let sp = xs.len() - 2;
    let (mut outs, mut pbs, mut pes) = (vec![], vec![], vec![]);
    for i in 0..sp {
        let (o, pb, pe) = window_geometry(xs[2 + i], window, i, ceil_mode)?;
        outs.push(o);
        pbs.push(pb);
        pes.push(pe);
    }
    let ins = pad3(&xs[2..], 1)?;
    let on = pad3(&outs, 1)?;
    let k = pad3(&window.kernel, 1)?;
    let s = pad3(&window.strides, 1)?;
    let d = pad3(&window.dilations, 1)?;
    let pb = pad3(&pbs, 0)?;
    let pe = pad3(&pes, 0)?;
    let planes = xs[0] * xs[1];
    let ip: usize = ins.iter().product();
    let op: usize = on.iter().product();
    let xv = x.to_f64_vec();
    let mut out = vec![0.0; planes * op];
    let want_idx = matches!(kind, PoolKind::Max { indices: true, .. });
    let column_major = matches!(
        kind,
        PoolKind::Max {
            column_major: true,
            ..
        }
    );
    let mut idx_out = if want_idx {
        vec![0i64; planes * op]
    } else {
        vec![]
    };
    // Window taps along one axis for output position `o`: (input index, inside input,
    // inside explicit padding).
    let taps = |axis: usize, o: usize| -> Vec<(isize, bool, bool)> {
        (0..k[axis])
            .map(|t| {
                let i = (o * s[axis] + t * d[axis]) as isize - pb[axis] as isize;
                let inside = i >= 0 && (i as usize) < ins[axis];
                let in_pad = i < (ins[axis] + pe[axis]) as isize;
                (i, inside, in_pad)
            })
            .collect()
    };
    let td: Vec<Vec<_>> = (0..on[0]).map(|o| taps(0, o)).collect();
    let th: Vec<Vec<_>> = (0..on[1]).map(|o| taps(1, o)).collect();
    let tw: Vec<Vec<_>> = (0..on[2]).map(|o| taps(2, o)).collect();
    for p in 0..planes {
        let xp = &xv[p * ip..(p + 1) * ip];
        for od in 0..on[0] {
            for oh in 0..on[1] {
                for ow in 0..on[2] {
                    let oi = p * op + (od * on[1] + oh) * on[2] + ow;
                    let mut best = f64::NEG_INFINITY;
                    let mut best_i: Option<usize> = None;
                    let (mut sum, mut count, mut padded_count) = (0.0, 0usize, 0usize);
                    for &(id, din, dpad) in &td[od] {
                        for &(ih, hin, hpad) in &th[oh] {
                            for &(iw, win, wpad) in &tw[ow] {
                                if dpad && hpad && wpad {
                                    padded_count += 1;
                                }
                                if !(din && hin && win) {
                                    continue;
                                }
                                let (id, ih, iw) = (id as usize, ih as usize, iw as usize);
                                let si = (id * ins[1] + ih) * ins[2] + iw;
                                let v = xp[si];
                                count += 1;
                                match kind {
                                    PoolKind::Max { .. } => {
                                        if best_i.is_none() || v > best {
                                            best = v;
                                            best_i = Some(if column_major {
                                                id + ih * ins[0] + iw * ins[0] * ins[1]
                                            } else {
                                                si
                                            });
                                        }
                                    }
                                    PoolKind::Avg { .. } => sum += v,
                                    PoolKind::Lp { p } => sum += v.abs().powi(*p as i32),
                                }
                            }
                        }
                    }
                    out[oi] = match kind {
                        PoolKind::Max { .. } => best,
                        PoolKind::Avg {
                            count_include_pad: true,
                        } => sum / padded_count.max(1) as f64,
                        PoolKind::Avg {
                            count_include_pad: false,
                        } => sum / count as f64,
                        PoolKind::Lp { p } => sum.powf(1.0 / *p as f64),
                    };
                    if want_idx {
                        idx_out[oi] = (p * ip + best_i.unwrap_or(0)) as i64;
                    }
                }
            }
        }
    }
    let mut shape = vec![xs[0], xs[1]];
    shape.extend_from_slice(&outs);
    let mut res = vec![from_f64(x.dtype(), shape.clone(), &out)?];
    if want_idx {
        res.push(Tensor::from_vec(shape, idx_out).map_err(|e| e.to_string())?);
    }
    Ok(res)
}

pub fn global_pool(x: &Tensor, kind: &PoolKind) -> Result<Tensor, String> {
    let xs = x.shape();
    if xs.len() < 2 {
        return Err(format!("input {xs:?} must be [N, C, spatial...]"));
    }
    let planes = xs[0] * xs[1];
    let ip: usize = xs[2..].iter().product();
    let xv = x.to_f64_vec();
    let out: Vec<f64> = (0..planes)
        .map(|p| {
            let s = &xv[p * ip..(p + 1) * ip];
            match kind {
                PoolKind::Max { .. } => s.iter().copied().fold(f64::NEG_INFINITY, |a, b| {
                    if b > a || b.is_nan() {
                        b
                    } else {
                        a
                    }
                }),
                PoolKind::Avg { .. } => s.iter().sum::<f64>() / ip as f64,
                PoolKind::Lp { p } => s
                    .iter()
                    .map(|v| v.abs().powi(*p as i32))
                    .sum::<f64>()
                    .powf(1.0 / *p as f64),
            }
        })
        .collect();
    let mut shape = vec![xs[0], xs[1]];
    shape.extend(std::iter::repeat(1).take(xs.len() - 2));
    from_f64(x.dtype(), shape, &out)
}

/// Scatters `x` to the flat `indices` of the shape MaxPool would have had as input, then
/// places that into the top-left corner of `output_shape` when one is given.
pub fn max_unpool(
    x: &Tensor,
    indices: &Tensor,
    window: &Window,
    output_shape: Option<Vec<usize>>,
) -> Result<Tensor, String> {
    let xs = x.shape();
    if xs.len() < 3 || xs.len() - 2 != window.rank() || indices.shape() != xs {
        return Err(format!(
            "input {xs:?} and indices {:?} must match a {}-D window",
            indices.shape(),
            window.rank()
        ));
    }
    let sp = xs.len() - 2;
    let Padding::Explicit(p) = &window.pads else {
        return Err("max unpool needs explicit pads".into());
    };
    let mut inferred = vec![xs[0], xs[1]];
    for i in 0..sp {
        let v = (xs[2 + i] as i64 - 1) * window.strides[i] as i64 + window.kernel[i] as i64
            - (p[i] + p[sp + i]) as i64;
        if v <= 0 {
            return Err(format!(
                "spatial axis {i}: output length {v} is not positive"
            ));
        }
        inferred.push(v as usize);
    }
    let total: usize = inferred.iter().product();
    let mut y = vec![0.0; total];
    let xv = x.to_f64_vec();
    for (v, &i) in xv.iter().zip(&indices.to_i64_vec()) {
        if i < 0 || i as usize >= total {
            return Err(format!("index {i} is out of range for output {inferred:?}"));
        }
        y[i as usize] = *v;
    }
    let out_shape = output_shape.unwrap_or_else(|| inferred.clone());
    if out_shape == inferred {
        return from_f64(x.dtype(), out_shape, &y);
    }
    if out_shape.len() != inferred.len() || out_shape.iter().zip(&inferred).any(|(o, i)| o < i) {
        return Err(format!(
            "output_shape {out_shape:?} is smaller than the unpooled shape {inferred:?}"
        ));
    }
    let n: usize = out_shape.iter().product();
    let mut out = vec![0.0; n];
    let ost = tilec_ir::strides(&out_shape);
    let ist = tilec_ir::strides(&inferred);
    for (flat, &v) in y.iter().enumerate() {
        let mut o = 0;
        for a in 0..inferred.len() {
            o += (flat / ist[a]) % inferred[a] * ost[a];
        }
        out[o] = v;
    }
    from_f64(x.dtype(), out_shape, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_with_indices_and_avg_pads() {
        // 1x1x3x3, k 2, s 1, pads 1 on all sides → 4x4.
        let x = Tensor::from_vec(vec![1, 1, 3, 3], (1..=9).map(|v| v as f32).collect()).unwrap();
        let w = Window {
            kernel: vec![2, 2],
            strides: vec![1, 1],
            dilations: vec![1, 1],
            pads: Padding::Explicit(vec![1; 4]),
        };
        let r = pool(
            &x,
            &PoolKind::Max {
                indices: true,
                column_major: false,
            },
            &w,
            false,
        )
        .unwrap();
        assert_eq!(r[0].shape(), &[1, 1, 4, 4]);
        assert_eq!(r[0].to_f64_vec()[..4], [1.0, 2.0, 3.0, 3.0]);
        assert_eq!(r[1].to_i64_vec()[5], 4); // window rows 0-1, cols 0-1 → max 5 at flat 4
        let r = pool(
            &x,
            &PoolKind::Max {
                indices: true,
                column_major: true,
            },
            &w,
            false,
        )
        .unwrap();
        assert_eq!(r[1].to_i64_vec()[5], 4); // (1,1) column-major is also 4
        assert_eq!(r[1].to_i64_vec()[6], 7); // max 6 at (1,2) → 1 + 2*3
        let avg = pool(
            &x,
            &PoolKind::Avg {
                count_include_pad: false,
            },
            &w,
            false,
        )
        .unwrap();
        assert_eq!(avg[0].to_f64_vec()[0], 1.0);
        let avg = pool(
            &x,
            &PoolKind::Avg {
                count_include_pad: true,
            },
            &w,
            false,
        )
        .unwrap();
        assert_eq!(avg[0].to_f64_vec()[0], 0.25);
    }
}
