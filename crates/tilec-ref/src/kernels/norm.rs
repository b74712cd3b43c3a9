//! Normalization kernels. Statistics are computed in f64 on every float dtype (f16,
//! bf16 and fp8 inputs are widened exactly) and results are rounded once to the output
//! dtype.

use super::util::{broadcast_index_map, split_at_axis};
use crate::EvalCtx;
use tilec_ir::op::{LossReduction, NormOp};
use tilec_ir::{DType, Tensor};

pub fn eval(op: &NormOp, args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    let x = *args.first().ok_or("expected at least one input")?;
    let arg = |i: usize| {
        args.get(i)
            .copied()
            .ok_or_else(|| format!("missing input {i}"))
    };
    let axis_ok = |axis: usize| {
        if axis >= x.rank() {
            Err(format!("axis {axis} out of range for rank {}", x.rank()))
        } else {
            Ok(())
        }
    };
    let out =
        |v: &[f64]| Tensor::from_f64s(x.dtype(), x.shape().to_vec(), v).map_err(|e| e.to_string());
    match op {
        NormOp::Softmax { axis } | NormOp::LogSoftmax { axis } => {
            axis_ok(*axis)?;
            let log = matches!(op, NormOp::LogSoftmax { .. });
            Ok(vec![out(&softmax(&x.to_f64_vec(), x.shape(), *axis, log))?])
        }
        NormOp::Hardmax { axis } => {
            axis_ok(*axis)?;
            let mut v = vec![0.0f64; x.numel()];
            if x.numel() > 0 {
                let am = super::reduce::arg_reduce(x, *axis, true, false, true)?.to_i64_vec();
                let (outer, len, inner) = split_at_axis(x.shape(), *axis);
                for o in 0..outer {
                    for i in 0..inner {
                        let k = am[o * inner + i] as usize;
                        v[o * len * inner + k * inner + i] = 1.0;
                    }
                }
            }
            Ok(vec![out(&v)?])
        }
        NormOp::LayerNorm {
            axis,
            epsilon,
            stash,
            has_bias,
        } => {
            axis_ok(*axis)?;
            let bias = if *has_bias { Some(arg(2)?) } else { None };
            layer_norm(x, arg(1)?, bias, *axis, *epsilon as f64, *stash, false)
        }
        NormOp::RmsNorm { axis, epsilon } => {
            axis_ok(*axis)?;
            let r = layer_norm(x, arg(1)?, None, *axis, *epsilon as f64, DType::F32, true)?;
            Ok(r.into_iter().take(1).collect())
        }
        NormOp::BatchNorm {
            epsilon,
            channels_last,
        } => {
            let (n, c, inner) = channels(x, *channels_last)?;
            let p: Vec<Vec<f64>> = (1..5)
                .map(|i| channel_param(arg(i)?, c))
                .collect::<Result<_, _>>()?;
            let v = x.to_f64_vec();
            let mut y = vec![0.0f64; v.len()];
            for ch in 0..c {
                let a = p[0][ch] / (p[3][ch] + *epsilon as f64).sqrt();
                let b = p[1][ch] - p[2][ch] * a;
                for b0 in 0..n {
                    let base = (b0 * c + ch) * inner;
                    for j in base..base + inner {
                        y[j] = v[j] * a + b;
                    }
                }
            }
            Ok(vec![out(&y)?])
        }
        NormOp::InstanceNorm { epsilon } => {
            let (_, c, _) = channels(x, false)?;
            let s = channel_param(arg(1)?, c)?;
            let b = channel_param(arg(2)?, c)?;
            Ok(vec![out(&group_norm(x, c, &s, &b, *epsilon as f64, false)?)?])
        }
        NormOp::GroupNorm {
            num_groups,
            epsilon,
            channels_last,
        } => {
            let (_, c, _) = channels(x, *channels_last)?;
            let s = channel_param(arg(1)?, c)?;
            let b = channel_param(arg(2)?, c)?;
            Ok(vec![out(&group_norm(x, *num_groups, &s, &b, *epsilon as f64, *channels_last)?)?])
        }
        NormOp::Lrn {
            size,
            alpha,
            beta,
            bias,
            channels_last,
        } => {
            let (n, c, inner) = channels(x, *channels_last)?;
            let v = x.to_f64_vec();
            let (lo, hi) = (
                size.saturating_sub(1) / 2,
                size.saturating_sub(1).div_ceil(2),
            );
            let (alpha, beta, bias) = (*alpha as f64, *beta as f64, *bias as f64);
            let mut y = vec![0.0f64; v.len()];
            for b0 in 0..n {
                for ch in 0..c {
                    let first = ch.saturating_sub(lo);
                    let last = (ch + hi).min(c - 1);
                    for i in 0..inner {
                        let at = |k: usize| v[(b0 * c + k) * inner + i];
                        let sq: f64 = (first..=last).map(|k| at(k) * at(k)).sum();
                        y[(b0 * c + ch) * inner + i] =
                            at(ch) / (bias + alpha / *size as f64 * sq).powf(beta);
                    }
                }
            }
            Ok(vec![out(&y)?])
        }
        NormOp::LpNorm { axis, p } => {
            axis_ok(*axis)?;
            let v = x.to_f64_vec();
            let (outer, len, inner) = split_at_axis(x.shape(), *axis);
            let mut y = vec![0.0f64; v.len()];
            for o in 0..outer {
                for i in 0..inner {
                    let idx = |k: usize| o * len * inner + k * inner + i;
                    let norm = if *p == 1 {
                        (0..len).map(|k| v[idx(k)].abs()).sum::<f64>()
                    } else {
                        (0..len).map(|k| v[idx(k)] * v[idx(k)]).sum::<f64>().sqrt()
                    };
                    for k in 0..len {
                        y[idx(k)] = if norm == 0.0 { 0.0 } else { v[idx(k)] / norm };
                    }
                }
            }
            Ok(vec![out(&y)?])
        }
        NormOp::MeanVarianceNorm { axes } => {
            let shape = x.shape();
            if let Some(&a) = axes.iter().find(|&&a| a >= shape.len()) {
                return Err(format!("axis {a} out of range for rank {}", shape.len()));
            }
            let kept: Vec<usize> = shape
                .iter()
                .enumerate()
                .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
                .collect();
            let map = broadcast_index_map(&kept, shape)?;
            let nout: usize = kept.iter().product();
            let count = axes.iter().map(|&a| shape[a]).product::<usize>() as f64;
            let v = x.to_f64_vec();
            let mut mean = vec![0.0f64; nout];
            for (&a, &o) in v.iter().zip(&map) {
                mean[o] += a;
            }
            mean.iter_mut().for_each(|m| *m /= count);
            let mut var = vec![0.0f64; nout];
            for (&a, &o) in v.iter().zip(&map) {
                var[o] += (a - mean[o]) * (a - mean[o]);
            }
            var.iter_mut().for_each(|s| *s /= count);
            let y: Vec<f64> = v
                .iter()
                .zip(&map)
                .map(|(&a, &o)| (a - mean[o]) / (var[o].sqrt() + 1e-9))
                .collect();
            Ok(vec![out(&y)?])
        }
        NormOp::NllLoss {
            reduction,
            ignore_index,
            has_weight,
        } => {
            let w = if *has_weight { Some(arg(2)?) } else { None };
            nll_loss(x, arg(1)?, w, *reduction, *ignore_index).map(|t| vec![t])
        }
    }
}

/// `[N, C, ...]` as (N, C, spatial element count), or with `channels_last` `[N, ..., C]`
/// as (N times the spatial element count, C, 1): the element of channel `ch` at outer
/// index `o` and inner index `i` is at `(o * C + ch) * inner + i` either way.
fn channels(x: &Tensor, channels_last: bool) -> Result<(usize, usize, usize), String> {
    if x.rank() < 2 {
        return Err(format!(
            "x must have rank >= 2 ([N, C, ...] or [N, ..., C]), got rank {}",
            x.rank()
        ));
    }
    let axis = if channels_last { x.rank() - 1 } else { 1 };
    Ok(split_at_axis(x.shape(), axis))
}

fn channel_param(p: &Tensor, c: usize) -> Result<Vec<f64>, String> {
    if p.numel() != c {
        return Err(format!(
            "per-channel parameter has {} elements, expected {c}",
            p.numel()
        ));
    }
    Ok(p.to_f64_vec())
}

/// Softmax (or log-softmax) along `axis`, subtracting the maximum for stability.
pub fn softmax(v: &[f64], shape: &[usize], axis: usize, log: bool) -> Vec<f64> {
    let (outer, len, inner) = split_at_axis(shape, axis);
    let mut y = vec![0.0f64; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let idx = |k: usize| o * len * inner + k * inner + i;
            let m = (0..len).map(|k| v[idx(k)]).fold(f64::NEG_INFINITY, |a, b| {
                if b > a || b.is_nan() {
                    b
                } else {
                    a
                }
            });
            let s: f64 = (0..len).map(|k| (v[idx(k)] - m).exp()).sum();
            for k in 0..len {
                let d = v[idx(k)] - m;
                y[idx(k)] = if log { d - s.ln() } else { d.exp() / s };
            }
        }
    }
    y
}

/// Layer normalization (or, with `rms`, RMS normalization) over dims `axis..`.
/// Returns y and, for layer norm, the mean and inverse standard deviation.
fn layer_norm(
    x: &Tensor,
    scale: &Tensor,
    bias: Option<&Tensor>,
    axis: usize,
    eps: f64,
    stash: DType,
    rms: bool,
) -> Result<Vec<Tensor>, String> {
    let shape = x.shape();
    let check = |p: &Tensor, what: &str| {
        let ok = p.rank() <= shape.len()
            && p.shape()
                .iter()
                .zip(&shape[shape.len() - p.rank()..])
                .all(|(&a, &b)| a == 1 || a == b);
        if ok {
            broadcast_index_map(p.shape(), shape)
        } else {
            Err(format!(
                "{what} of shape {:?} does not broadcast to {shape:?}",
                p.shape()
            ))
        }
    };
    let smap = check(scale, "scale")?;
    let sv = scale.to_f64_vec();
    let bias = match bias {
        Some(b) => Some((check(b, "bias")?, b.to_f64_vec())),
        None => None,
    };
    let rows: usize = shape[..axis].iter().product();
    let cols: usize = shape[axis..].iter().product();
    let v = x.to_f64_vec();
    let mut y = vec![0.0f64; v.len()];
    let mut means = vec![0.0f64; rows];
    let mut inv = vec![0.0f64; rows];
    for r in 0..rows {
        let row = &v[r * cols..(r + 1) * cols];
        let n = cols as f64;
        let mean = if rms {
            0.0
        } else {
            row.iter().sum::<f64>() / n
        };
        let var = row.iter().map(|&a| (a - mean) * (a - mean)).sum::<f64>() / n;
        let is = 1.0 / (var + eps).sqrt();
        means[r] = mean;
        inv[r] = is;
        for j in 0..cols {
            let k = r * cols + j;
            let mut o = (v[k] - mean) * is * sv[smap[k]];
            if let Some((bm, bv)) = &bias {
                o += bv[bm[k]];
            }
            y[k] = o;
        }
    }
    let mut stat_shape = shape[..axis].to_vec();
    stat_shape.resize(shape.len(), 1);
    let e = |e: tilec_ir::TensorSizeError| e.to_string();
    Ok(vec![
        Tensor::from_f64s(x.dtype(), shape.to_vec(), &y).map_err(e)?,
        Tensor::from_f64s(stash, stat_shape.clone(), &means).map_err(e)?,
        Tensor::from_f64s(stash, stat_shape, &inv).map_err(e)?,
    ])
}

/// Group normalization with per-channel affine parameters; instance normalization is the
/// case `groups == C`.
fn group_norm(
    x: &Tensor,
    groups: usize,
    scale: &[f64],
    bias: &[f64],
    eps: f64,
    channels_last: bool,
) -> Result<Vec<f64>, String> {
    let (_, c, _) = channels(x, channels_last)?;
    let n = x.shape()[0];
    let inner = x.numel() / (n * c).max(1);
    if groups == 0 || c % groups != 0 {
        return Err(format!("{c} channels do not divide into {groups} groups"));
    }
    let cpg = c / groups;
    // The offset of channel `j` of group `g` at spatial position `s` of batch `b`.
    let at = |b: usize, g: usize, s: usize, j: usize| {
        let ch = g * cpg + j;
        if channels_last {
            (b * inner + s) * c + ch
        } else {
            (b * c + ch) * inner + s
        }
    };
    let v = x.to_f64_vec();
    let mut y = vec![0.0f64; v.len()];
    let cnt = (cpg * inner) as f64;
    for b in 0..n {
        for g in 0..groups {
            let elems = || (0..cpg).flat_map(move |j| (0..inner).map(move |s| (j, at(b, g, s, j))));
            let mean = elems().map(|(_, i)| v[i]).sum::<f64>() / cnt;
            let var = elems().map(|(_, i)| (v[i] - mean) * (v[i] - mean)).sum::<f64>() / cnt;
            let is = 1.0 / (var + eps).sqrt();
            for (j, i) in elems() {
                let ch = g * cpg + j;
                y[i] = (v[i] - mean) * is * scale[ch] + bias[ch];
            }
        }
    }
    Ok(y)
}

fn nll_loss(
    x: &Tensor,
    target: &Tensor,
    weight: Option<&Tensor>,
    reduction: LossReduction,
    ignore_index: Option<i64>,
) -> Result<Tensor, String> {
    let shape = x.shape();
    if shape.len() < 2 {
        return Err(format!(
            "input must have rank >= 2 ([N, C, ...]), got rank {}",
            shape.len()
        ));
    }
    let (n, c, d) = split_at_axis(shape, 1);
    let mut want = vec![shape[0]];
    want.extend_from_slice(&shape[2..]);
    if target.shape() != want.as_slice() {
        return Err(format!(
            "target shape {:?} does not match input shape {shape:?}",
            target.shape()
        ));
    }
    let w = match weight {
        Some(w) => Some(channel_param(w, c)?),
        None => None,
    };
    let v = x.to_f64_vec();
    let t = target.to_i64_vec();
    let mut loss = vec![0.0f64; n * d];
    let mut wsum = 0.0f64;
    for b0 in 0..n {
        for j in 0..d {
            let k = b0 * d + j;
            let cls = t[k];
            if Some(cls) == ignore_index {
                continue;
            }
            if cls < 0 || cls as usize >= c {
                return Err(format!("target {cls} at element {k} is out of range for {c} classes"));
            }
            let cls = cls as usize;
            let wt = w.as_ref().map(|w| w[cls]).unwrap_or(1.0);
            loss[k] = -v[(b0 * c + cls) * d + j] * wt;
            wsum += wt;
        }
    }
    let e = |e: tilec_ir::TensorSizeError| e.to_string();
    match reduction {
        LossReduction::None => Tensor::from_f64s(x.dtype(), want, &loss).map_err(e),
        LossReduction::Sum => Tensor::from_f64s(x.dtype(), vec![], &[loss.iter().sum()]).map_err(e),
        LossReduction::Mean => {
            Tensor::from_f64s(x.dtype(), vec![], &[loss.iter().sum::<f64>() / wsum]).map_err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_rows_sum_to_one_and_log_matches() {
        let v: Vec<f64> = (0..24).map(|i| ((i * 5) % 7) as f64 * 0.3).collect();
        for axis in 0..3 {
            let s = softmax(&v, &[2, 3, 4], axis, false);
            let l = softmax(&v, &[2, 3, 4], axis, true);
            let (outer, len, inner) = split_at_axis(&[2, 3, 4], axis);
            for o in 0..outer {
                for i in 0..inner {
                    let sum: f64 = (0..len).map(|k| s[o * len * inner + k * inner + i]).sum();
                    assert!((sum - 1.0).abs() < 1e-12);
                }
            }
            for (a, b) in s.iter().zip(&l) {
                assert!((a.ln() - b).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn group_norm_with_one_channel_per_group_is_instance_norm() {
        let x = Tensor::from_vec(vec![1, 2, 3], vec![1.0f32, 2.0, 3.0, 10.0, 10.0, 16.0]).unwrap();
        let y = group_norm(&x, 2, &[1.0, 2.0], &[0.0, 1.0], 0.0, false).unwrap();
        let s = (2.0f64 / 3.0).sqrt();
        let want = [-1.0 / s, 0.0, 1.0 / s];
        for j in 0..3 {
            assert!((y[j] - want[j]).abs() < 1e-9);
        }
        // Channel 1: mean 12, var 8; y = 2 * (x - 12) / sqrt(8) + 1.
        assert!((y[5] - (2.0 * 4.0 / 8f64.sqrt() + 1.0)).abs() < 1e-9);
    }

    /// `[N, C, H, W]` → `[N, H, W, C]`.
    fn to_nhwc(v: &[f64], [n, c, h, w]: [usize; 4]) -> Vec<f64> {
        let mut out = vec![f64::NAN; v.len()];
        for b in 0..n {
            for ch in 0..c {
                for s in 0..h * w {
                    out[(b * h * w + s) * c + ch] = v[(b * c + ch) * h * w + s];
                }
            }
        }
        out
    }

    #[test]
    fn batch_norm_and_lrn_channels_last_match_channels_first() {
        let dims = [2, 5, 3, 2];
        let numel: usize = dims.iter().product();
        let v: Vec<f64> = (0..numel)
            .map(|i| ((i * 7) % 11) as f64 * 0.25 - 1.0)
            .collect();
        let x = Tensor::from_f64s(DType::F32, dims.to_vec(), &v).unwrap();
        let xl = Tensor::from_f64s(
            DType::F32,
            vec![dims[0], dims[2], dims[3], dims[1]],
            &to_nhwc(&v, dims),
        )
        .unwrap();
        let p = |k: usize| {
            let pv: Vec<f64> = (0..dims[1])
                .map(|c| 0.5 + (c * k % 5) as f64 * 0.3)
                .collect();
            Tensor::from_f64s(DType::F32, vec![dims[1]], &pv).unwrap()
        };
        let (s, b, m, var) = (p(1), p(2), p(3), p(4));
        let g = tilec_ir::Graph::new("t");
        let bound = std::collections::HashMap::new();
        let cx = EvalCtx {
            graph: &g,
            bound: &bound,
        };
        for cl in [false, true] {
            let ops = [
                NormOp::BatchNorm {
                    epsilon: 1e-3,
                    channels_last: cl,
                },
                NormOp::Lrn {
                    size: 3,
                    alpha: 0.1,
                    beta: 0.75,
                    bias: 2.0,
                    channels_last: cl,
                },
            ];
            for op in ops {
                let first = op.with_channels_last(false).unwrap();
                let args: Vec<&Tensor> = if matches!(op, NormOp::BatchNorm { .. }) {
                    vec![&x, &s, &b, &m, &var]
                } else {
                    vec![&x]
                };
                let want = eval(&first, &args, &cx).unwrap()[0].to_f64_vec();
                let mut largs = args.clone();
                largs[0] = if cl { &xl } else { &x };
                let got = eval(&op, &largs, &cx).unwrap()[0].to_f64_vec();
                let want = if cl { to_nhwc(&want, dims) } else { want };
                assert_eq!(got.len(), want.len());
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-6, "{op:?}: {a} vs {b}");
                }
            }
        }
        // A channels-last batch norm checks its parameters against the last axis.
        let bad = NormOp::BatchNorm {
            epsilon: 1e-3,
            channels_last: true,
        };
        assert!(eval(&bad, &[&x, &s, &b, &m, &var], &cx).is_err());
    }

    #[test]
    fn nll_loss_mean_weights_and_ignore() {
        let x = Tensor::from_vec(vec![2, 3], vec![-1.0f32, -2.0, -3.0, -4.0, -5.0, -6.0]).unwrap();
        let t = Tensor::from_vec(vec![2], vec![2i64, 0]).unwrap();
        let w = Tensor::from_vec(vec![3], vec![0.5f32, 1.0, 2.0]).unwrap();
        let r = nll_loss(&x, &t, Some(&w), LossReduction::Mean, None).unwrap();
        assert!((r.to_f64_vec()[0] - (3.0 * 2.0 + 4.0 * 0.5) / 2.5).abs() < 1e-6);
        let r = nll_loss(&x, &t, None, LossReduction::Mean, Some(0)).unwrap();
        assert_eq!(r.to_f64_vec(), vec![3.0]);
        let r = nll_loss(&x, &t, None, LossReduction::None, Some(2)).unwrap();
        assert_eq!(r.to_f64_vec(), vec![0.0, 4.0]);
    }
}
