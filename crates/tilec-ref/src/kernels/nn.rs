//! nn kernels: attention, rotary embedding, SwiGLU, recurrent layers, grid sampling,
//! Fourier transforms, linear attention, causal depthwise conv with state.
//!
//! Everything is computed in f64 and rounded to the output dtype at the end, except
//! where ONNX's reference rounds an intermediate to the input type (noted inline).

use crate::EvalCtx;
use tilec_ir::op::{GridPadding, GridSampleMode, LinearAttentionRule, NnOp, RnnAct, RnnCell, RnnDirection};
use tilec_ir::{DType, Tensor};

pub fn eval(op: &NnOp, args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    match op {
        NnOp::Attention { .. } => attention(op, args),
        NnOp::RotaryEmbedding {
            interleaved,
            rotary_dim,
            num_heads,
            has_position_ids,
        } => rotary(args, *interleaved, *rotary_dim, *num_heads, *has_position_ids),
        NnOp::SwiGlu { alpha } => swiglu(args, *alpha),
        NnOp::Rnn { .. } => rnn(op, args),
        NnOp::GridSample {
            mode,
            padding,
            align_corners,
        } => grid_sample(args, *mode, *padding, *align_corners),
        NnOp::AffineGrid { align_corners, size } => {
            let size = _cx.dims(size)?;
            affine_grid(args, *align_corners, &size)
        }
        NnOp::Dft {
            axis,
            inverse,
            onesided,
            length,
        } => dft(args, *axis, *inverse, *onesided, *length),
        NnOp::Stft {
            frame_step,
            frame_length,
            onesided,
            has_window,
        } => stft(args, *frame_step, *frame_length, *onesided, *has_window),
        NnOp::LinearAttention {
            q_num_heads,
            kv_num_heads,
            scale,
            rule,
            has_past,
        } => linear_attention(args, *q_num_heads, *kv_num_heads, *scale, *rule, *has_past),
        NnOp::CausalConvWithState {
            silu,
            has_bias,
            has_past,
        } => causal_conv(args, *silu, *has_bias, *has_past),
        NnOp::PagedAttention { scale } => super::paged::paged_attention(args, *scale),
    }
}

fn arg<'a>(args: &[&'a Tensor], i: usize) -> Result<&'a Tensor, String> {
    args.get(i).copied().ok_or_else(|| format!("missing input {i}"))
}

fn make(dt: DType, shape: Vec<usize>, v: &[f64]) -> Result<Tensor, String> {
    Tensor::from_f64s(dt, shape, v).map_err(|e| e.to_string())
}

/// Rounds a value to the precision of `dt` (identity for f64).
fn round_to(dt: DType, x: f64) -> f64 {
    match dt {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::BF16 => half::bf16::from_f64(x).to_f64(),
        _ => make(dt, vec![], &[x]).map(|t| t.to_f64_vec()[0]).unwrap_or(x),
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

// ---------------------------------------------------------------- attention

/// Q/K/V as 4-D `[B, H, S, D]` arrays in f64.
struct Heads {
    v: Vec<f64>,
    h: usize,
    s: usize,
    d: usize,
}

impl Heads {
    fn at(&self, b: usize, h: usize, s: usize) -> &[f64] {
        let o = ((b * self.h + h) * self.s + s) * self.d;
        &self.v[o..o + self.d]
    }

    /// From a 4-D tensor, or a 3-D `[B, S, H*D]` one split into `heads`.
    fn new(t: &Tensor, heads: usize, what: &str) -> Result<Heads, String> {
        let sh = t.shape();
        let v = t.to_f64_vec();
        match *sh {
            [_, h, s, d] => Ok(Heads { v, h, s, d }),
            [b, s, hd] => {
                if heads == 0 || hd % heads != 0 {
                    return Err(format!("{what}: hidden size {hd} is not divisible by {heads} heads"));
                }
                let d = hd / heads;
                let mut out = vec![0.0; v.len()];
                for bi in 0..b {
                    for si in 0..s {
                        for hi in 0..heads {
                            for di in 0..d {
                                out[((bi * heads + hi) * s + si) * d + di] = v[(bi * s + si) * hd + hi * d + di];
                            }
                        }
                    }
                }
                Ok(Heads { v: out, h: heads, s, d })
            }
            _ => Err(format!("{what} must have rank 3 or 4, got {sh:?}")),
        }
    }

    /// Concatenates `past` (4-D) before `self` along the sequence axis.
    fn with_past(self, past: &Tensor, b: usize, what: &str) -> Result<Heads, String> {
        let ps = past.shape();
        if ps.len() != 4 || ps[0] != b || ps[1] != self.h || ps[3] != self.d {
            return Err(format!(
                "{what} has shape {ps:?}, expected [{b}, {}, *, {}]",
                self.h, self.d
            ));
        }
        let pv = past.to_f64_vec();
        let (pl, s, d) = (ps[2], self.s, self.d);
        let t = pl + s;
        let mut v = Vec::with_capacity(b * self.h * t * d);
        for bi in 0..b {
            for hi in 0..self.h {
                let po = (bi * self.h + hi) * pl * d;
                v.extend_from_slice(&pv[po..po + pl * d]);
                let so = (bi * self.h + hi) * s * d;
                v.extend_from_slice(&self.v[so..so + s * d]);
            }
        }
        Ok(Heads { v, h: self.h, s: t, d })
    }
}

fn attention(op: &NnOp, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let NnOp::Attention {
        q_num_heads,
        kv_num_heads,
        scale,
        is_causal,
        softcap,
        qk_matmul_output_mode,
        softmax_precision,
        left_window,
        right_window,
        has_mask,
        has_past,
        has_nonpad,
        zero_nan_rows,
    } = op
    else {
        return Err("not an attention op".into());
    };
    let (qt, kt, vt) = (arg(args, 0)?, arg(args, 1)?, arg(args, 2)?);
    let dt = qt.dtype();
    let rank3 = qt.rank() == 3;
    let batch = *qt.shape().first().ok_or("Q must have rank 3 or 4")?;
    let q = Heads::new(qt, *q_num_heads, "Q")?;
    let mut k = Heads::new(kt, *kv_num_heads, "K")?;
    let mut v = Heads::new(vt, *kv_num_heads, "V")?;
    if kt.shape()[0] != batch || vt.shape()[0] != batch || k.h != v.h || k.s != v.s || k.d != q.d {
        return Err(format!(
            "Q {:?}, K {:?}, V {:?} do not agree",
            qt.shape(),
            kt.shape(),
            vt.shape()
        ));
    }
    if k.h == 0 || q.h % k.h != 0 {
        return Err(format!("q heads ({}) must be a multiple of kv heads ({})", q.h, k.h));
    }
    let mut idx = 3;
    let mask = if *has_mask {
        idx += 1;
        Some(arg(args, idx - 1)?)
    } else {
        None
    };
    let mut past_len = 0;
    if *has_past {
        let (pk, pv) = (arg(args, idx)?, arg(args, idx + 1)?);
        past_len = pk.shape().get(2).copied().unwrap_or(0);
        k = k.with_past(pk, batch, "past_key")?;
        v = v.with_past(pv, batch, "past_value")?;
        idx += 2;
    }
    let nonpad: Option<Vec<i64>> = if *has_nonpad {
        let t = arg(args, idx)?;
        if t.shape() != [batch] {
            return Err(format!(
                "nonpad_kv_seqlen has shape {:?}, expected [{batch}]",
                t.shape()
            ));
        }
        Some(t.to_i64_vec())
    } else {
        None
    };
    let (hq, hkv, sq, tk, dh, dv) = (q.h, k.h, q.s, k.s, q.d, v.d);
    let reps = hq / hkv;
    let sm_dt = softmax_precision.unwrap_or(dt);
    // The reference scales Q and K each by sqrt(scale), rounded to the input type.
    let sc = round_to(dt, (scale.map(|s| s as f64).unwrap_or(1.0 / (dh as f64).sqrt())).sqrt());

    // The mask, right-aligned against [B, Hq, Sq, T], padded along the last axis.
    let (mvals, mshape) = match mask {
        Some(m) => {
            let ms = m.shape().to_vec();
            if ms.is_empty() || ms.len() > 4 {
                return Err(format!("attn_mask must have rank 1 to 4, got {ms:?}"));
            }
            let full = [batch, hq, sq, tk];
            let off = 4 - ms.len();
            for (i, &d) in ms.iter().enumerate() {
                let want = full[off + i];
                let ok = if off + i == 3 { d <= want } else { d == 1 || d == want };
                if !ok {
                    return Err(format!("attn_mask {ms:?} does not broadcast to {full:?}"));
                }
            }
            let vals: Vec<f64> = if m.dtype() == DType::Bool {
                m.to_i64_vec()
                    .into_iter()
                    .map(|x| if x != 0 { 0.0 } else { f64::NEG_INFINITY })
                    .collect()
            } else {
                m.to_f64_vec()
            };
            let mut shape4 = vec![1; off];
            shape4.extend_from_slice(&ms);
            (vals, shape4)
        }
        None => (vec![], vec![]),
    };
    let mstr = tilec_ir::strides(&mshape);
    let mask_at = |b: usize, h: usize, i: usize, j: usize| -> f64 {
        if mshape.is_empty() {
            return 0.0;
        }
        if j >= mshape[3] {
            return f64::NEG_INFINITY;
        }
        let ix = [b, h, i, j];
        let mut o = 0;
        for a in 0..4 {
            if mshape[a] != 1 {
                o += ix[a] * mstr[a];
            }
        }
        mvals[o]
    };
    let windowed = *left_window >= 0 || *right_window >= 0;
    let bias_at = |b: usize, h: usize, i: usize, j: usize| -> f64 {
        let mut x = mask_at(b, h, i, j);
        let offset: i64 = match &nonpad {
            Some(np) if !*has_past => np[b] - sq as i64,
            _ => past_len as i64,
        };
        let diff = i as i64 + offset - j as i64;
        if *is_causal && diff < 0 {
            x += f64::NEG_INFINITY;
        }
        if windowed {
            let ok = (*left_window < 0 || diff <= *left_window) && (*right_window < 0 || -diff <= *right_window);
            if !ok {
                x += f64::NEG_INFINITY;
            }
        }
        if let Some(np) = &nonpad {
            if j as i64 >= np[b] {
                x += f64::NEG_INFINITY;
            }
        }
        x
    };

    let mut y = vec![0.0; batch * hq * sq * dv];
    let mut qk_out = vec![0.0; batch * hq * sq * tk];
    let mut scores = vec![0.0; tk];
    let mut bias = vec![0.0; tk];
    let cap = *softcap as f64;
    for b in 0..batch {
        for h in 0..hq {
            let kh = h / reps;
            for i in 0..sq {
                let qrow = q.at(b, h, i);
                for j in 0..tk {
                    let krow = k.at(b, kh, j);
                    let mut s = 0.0;
                    for d in 0..dh {
                        s += round_to(dt, qrow[d] * sc) * round_to(dt, krow[d] * sc);
                    }
                    // The reference computes in the input type: round where it rounds.
                    s = round_to(dt, s);
                    if cap > 0.0 {
                        s = round_to(dt, cap * round_to(dt, round_to(dt, s / cap).tanh()));
                    }
                    scores[j] = s;
                    bias[j] = bias_at(b, h, i, j);
                }
                let o = ((b * hq + h) * sq + i) * tk;
                let all_masked = bias.iter().all(|&x| x == f64::NEG_INFINITY);
                let logits: Vec<f64> = scores
                    .iter()
                    .zip(&bias)
                    .map(|(s, m)| round_to(dt, s + round_to(dt, *m)))
                    .collect();
                match qk_matmul_output_mode {
                    0 | 1 => qk_out[o..o + tk].copy_from_slice(&scores),
                    2 => qk_out[o..o + tk].copy_from_slice(&logits),
                    _ => {}
                }
                let mut probs = softmax_row(&logits, all_masked, sm_dt);
                if *zero_nan_rows && probs.iter().any(|p| p.is_nan()) {
                    probs.iter_mut().for_each(|p| *p = 0.0);
                }
                if *qk_matmul_output_mode == 3 {
                    qk_out[o..o + tk].copy_from_slice(&probs);
                }
                let yo = ((b * hq + h) * sq + i) * dv;
                for (j, &p) in probs.iter().enumerate() {
                    let p = round_to(dt, p);
                    if p == 0.0 {
                        continue;
                    }
                    let vrow = v.at(b, kh, j);
                    for d in 0..dv {
                        y[yo + d] += p * vrow[d];
                    }
                }
            }
        }
    }
    let y_t = if rank3 {
        // [B, Hq, Sq, Dv] -> [B, Sq, Hq*Dv]
        let mut out = vec![0.0; y.len()];
        for b in 0..batch {
            for h in 0..hq {
                for i in 0..sq {
                    for d in 0..dv {
                        out[(b * sq + i) * hq * dv + h * dv + d] = y[((b * hq + h) * sq + i) * dv + d];
                    }
                }
            }
        }
        make(dt, vec![batch, sq, hq * dv], &out)?
    } else {
        make(dt, vec![batch, hq, sq, dv], &y)?
    };
    Ok(vec![
        y_t,
        make(dt, vec![batch, hkv, tk, dh], &k.v)?,
        make(dt, vec![batch, hkv, tk, dv], &v.v)?,
        make(dt, vec![batch, hq, sq, tk], &qk_out)?,
    ])
}

/// Softmax of one row, rounding each step to `dt` as the reference does; a fully
/// masked row (by the additive bias) gives zeros.
fn softmax_row(x: &[f64], all_masked: bool, dt: DType) -> Vec<f64> {
    if all_masked {
        return vec![0.0; x.len()];
    }
    let x: Vec<f64> = x.iter().map(|&v| round_to(dt, v)).collect();
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let m = if m == f64::NEG_INFINITY { 0.0 } else { m };
    let e: Vec<f64> = x.iter().map(|&v| round_to(dt, round_to(dt, v - m).exp())).collect();
    let s = round_to(dt, e.iter().sum());
    let s = if s == 0.0 { 1.0 } else { s };
    e.into_iter().map(|v| round_to(dt, v / s)).collect()
}

// ---------------------------------------------------------------- rotary / swiglu

fn rotary(
    args: &[&Tensor],
    interleaved: bool,
    rotary_dim: usize,
    num_heads: usize,
    has_pos: bool,
) -> Result<Vec<Tensor>, String> {
    let x = arg(args, 0)?;
    let (cos_t, sin_t) = (arg(args, 1)?, arg(args, 2)?);
    let xs = x.shape().to_vec();
    // (batch, seq, heads, head size) and the flat offset of element (b, s, h, d).
    let (b_n, s_n, h_n, d_n) = match *xs.as_slice() {
        [b, h, s, d] => (b, s, h, d),
        [b, s, hd] => {
            if num_heads == 0 || hd % num_heads != 0 {
                return Err(format!("hidden size {hd} is not divisible by num_heads {num_heads}"));
            }
            (b, s, num_heads, hd / num_heads)
        }
        _ => return Err(format!("input must have rank 3 or 4, got {xs:?}")),
    };
    let offset = |b: usize, s: usize, h: usize, d: usize| -> usize {
        if xs.len() == 4 {
            ((b * h_n + h) * s_n + s) * d_n + d
        } else {
            (b * s_n + s) * h_n * d_n + h * d_n + d
        }
    };
    let rd = if rotary_dim == 0 { d_n } else { rotary_dim };
    if rd > d_n || rd % 2 != 0 {
        return Err(format!(
            "rotary_embedding_dim {rd} must be even and at most the head size {d_n}"
        ));
    }
    let half = rd / 2;
    let (cv, sv) = (cos_t.to_f64_vec(), sin_t.to_f64_vec());
    if cos_t.shape() != sin_t.shape() || cos_t.shape().last() != Some(&half) {
        return Err(format!(
            "cos/sin caches {:?}/{:?} must end in rotary_dim/2 = {half}",
            cos_t.shape(),
            sin_t.shape()
        ));
    }
    // Row of the caches for (b, s).
    let pos: Option<Vec<i64>> = if has_pos {
        let p = arg(args, 3)?;
        if p.shape() != [b_n, s_n] {
            return Err(format!(
                "position_ids has shape {:?}, expected [{b_n}, {s_n}]",
                p.shape()
            ));
        }
        Some(p.to_i64_vec())
    } else {
        if cos_t.shape() != [b_n, s_n, half] {
            return Err(format!(
                "cos_cache has shape {:?}, expected [{b_n}, {s_n}, {half}]",
                cos_t.shape()
            ));
        }
        None
    };
    let rows = cv.len() / half.max(1);
    let xv = x.to_f64_vec();
    let mut out = xv.clone();
    for b in 0..b_n {
        for s in 0..s_n {
            let row = match &pos {
                Some(p) => {
                    let r = p[b * s_n + s];
                    if r < 0 || r as usize >= rows {
                        return Err(format!("position id {r} out of range for a cache of {rows} rows"));
                    }
                    r as usize
                }
                None => b * s_n + s,
            };
            for h in 0..h_n {
                for i in 0..half {
                    let (c, sn) = (cv[row * half + i], sv[row * half + i]);
                    let (i1, i2) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                    let (o1, o2) = (offset(b, s, h, i1), offset(b, s, h, i2));
                    let (x1, x2) = (xv[o1], xv[o2]);
                    out[o1] = c * x1 - sn * x2;
                    out[o2] = sn * x1 + c * x2;
                }
            }
        }
    }
    Ok(vec![make(x.dtype(), xs, &out)?])
}

fn swiglu(args: &[&Tensor], alpha: f32) -> Result<Vec<Tensor>, String> {
    let (a, b) = (arg(args, 0)?, arg(args, 1)?);
    if a.shape() != b.shape() {
        return Err(format!("A {:?} and B {:?} differ in shape", a.shape(), b.shape()));
    }
    let dt = a.dtype();
    let out: Vec<f64> = a
        .to_f64_vec()
        .iter()
        .zip(b.to_f64_vec())
        .map(|(&x, y)| round_to(dt, x * round_to(dt, sigmoid(alpha as f64 * x))) * y)
        .collect();
    Ok(vec![make(dt, a.shape().to_vec(), &out)?])
}

// ---------------------------------------------------------------- recurrent layers

fn rnn(op: &NnOp, args: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let NnOp::Rnn {
        cell,
        direction,
        hidden_size,
        batch_first,
        acts,
        clip,
        has_seq_lens,
        has_initial_h,
        has_initial_c,
    } = op
    else {
        return Err("not a recurrent op".into());
    };
    let is_lstm = matches!(cell, RnnCell::Lstm { .. });
    let (xt, wt, rt, bt) = (arg(args, 0)?, arg(args, 1)?, arg(args, 2)?, arg(args, 3)?);
    let dt = xt.dtype();
    let xs = xt.shape();
    if xs.len() != 3 {
        return Err(format!("X must have rank 3, got {xs:?}"));
    }
    let (seq, batch, inp) = if *batch_first {
        (xs[1], xs[0], xs[2])
    } else {
        (xs[0], xs[1], xs[2])
    };
    let nd = direction.count();
    let h = *hidden_size;
    let g = cell.gates();
    if wt.shape() != [nd, g * h, inp] || rt.shape() != [nd, g * h, h] || bt.shape() != [nd, 2 * g * h] {
        return Err(format!(
            "W {:?}, R {:?}, B {:?} do not match X {xs:?}",
            wt.shape(),
            rt.shape(),
            bt.shape()
        ));
    }
    let (x, w, r, bias) = (xt.to_f64_vec(), wt.to_f64_vec(), rt.to_f64_vec(), bt.to_f64_vec());
    let x_at = |t: usize, b: usize| -> &[f64] {
        let o = if *batch_first {
            (b * seq + t) * inp
        } else {
            (t * batch + b) * inp
        };
        &x[o..o + inp]
    };
    let mut idx = 4;
    let lens: Vec<usize> = if *has_seq_lens {
        let s = arg(args, idx)?;
        idx += 1;
        if s.shape() != [batch] {
            return Err(format!("sequence_lens has shape {:?}, expected [{batch}]", s.shape()));
        }
        s.to_i64_vec()
            .into_iter()
            .map(|l| {
                if l < 0 || l as usize > seq {
                    Err(format!("sequence length {l} outside 0..={seq}"))
                } else {
                    Ok(l as usize)
                }
            })
            .collect::<Result<_, _>>()?
    } else {
        vec![seq; batch]
    };
    // State tensors come as [D, B, H] (or [B, D, H] batch-first); index (d, b).
    let state_index = |d: usize, b: usize| {
        if *batch_first {
            (b * nd + d) * h
        } else {
            (d * batch + b) * h
        }
    };
    let mut load_state = |present: bool| -> Result<Vec<f64>, String> {
        if !present {
            return Ok(vec![0.0; nd * batch * h]);
        }
        let t = arg(args, idx)?;
        idx += 1;
        let want = if *batch_first { [batch, nd, h] } else { [nd, batch, h] };
        if t.shape() != want {
            return Err(format!("initial state has shape {:?}, expected {want:?}", t.shape()));
        }
        Ok(t.to_f64_vec())
    };
    let h0 = load_state(*has_initial_h)?;
    let c0 = if is_lstm { load_state(*has_initial_c)? } else { vec![] };
    let p = if is_lstm {
        let t = arg(args, idx)?;
        if t.shape() != [nd, 3 * h] {
            return Err(format!("P has shape {:?}, expected [{nd}, {}]", t.shape(), 3 * h));
        }
        t.to_f64_vec()
    } else {
        vec![]
    };
    let clip_f = |v: f64| match clip {
        Some(c) => v.clamp(-(*c as f64), *c as f64),
        None => v,
    };
    let na = cell.n_acts();
    let y_index = |t: usize, d: usize, b: usize| {
        if *batch_first {
            ((b * seq + t) * nd + d) * h
        } else {
            ((t * nd + d) * batch + b) * h
        }
    };
    let mut y = vec![0.0; seq * nd * batch * h];
    let mut yh = vec![0.0; nd * batch * h];
    let mut yc = vec![0.0; nd * batch * h];
    // Gate pre-activations: W x + R h + Wb + Rb for gate rows [lo, hi).
    let gh = g * h;
    for d in 0..nd {
        let reverse = *direction == RnnDirection::Reverse || d == 1;
        let wd = &w[d * gh * inp..(d + 1) * gh * inp];
        let rd = &r[d * gh * h..(d + 1) * gh * h];
        let wb = &bias[d * 2 * gh..d * 2 * gh + gh];
        let rb = &bias[d * 2 * gh + gh..(d + 1) * 2 * gh];
        let a = &acts[d * na..(d + 1) * na];
        let act = |k: usize, v: f64| a.get(k).copied().unwrap_or(RnnAct::Tanh).apply(v);
        for b in 0..batch {
            let so = state_index(d, b);
            let mut hs = h0[so..so + h].to_vec();
            let mut cs = if is_lstm { c0[so..so + h].to_vec() } else { vec![] };
            for step in 0..lens[b] {
                let t = if reverse { lens[b] - 1 - step } else { step };
                let xv = x_at(t, b);
                let wx: Vec<f64> = (0..gh)
                    .map(|row| dot(&wd[row * inp..(row + 1) * inp], xv) + wb[row])
                    .collect();
                let rh_of = |hv: &[f64], row: usize| dot(&rd[row * h..(row + 1) * h], hv) + rb[row];
                let new_h: Vec<f64> = match cell {
                    RnnCell::Rnn => (0..h).map(|j| act(0, clip_f(wx[j] + rh_of(&hs, j)))).collect(),
                    RnnCell::Gru { linear_before_reset } => {
                        let z: Vec<f64> = (0..h).map(|j| act(0, clip_f(wx[j] + rh_of(&hs, j)))).collect();
                        let rg: Vec<f64> = (0..h).map(|j| act(0, clip_f(wx[h + j] + rh_of(&hs, h + j)))).collect();
                        let rhs: Vec<f64> = hs.iter().zip(&rg).map(|(a, b)| a * b).collect();
                        (0..h)
                            .map(|j| {
                                let pre = if *linear_before_reset {
                                    wx[2 * h + j] + rg[j] * rh_of(&hs, 2 * h + j)
                                } else {
                                    wx[2 * h + j] + rh_of(&rhs, 2 * h + j)
                                };
                                let hh = act(1, clip_f(pre));
                                (1.0 - z[j]) * hh + z[j] * hs[j]
                            })
                            .collect()
                    }
                    RnnCell::Lstm { input_forget } => {
                        let pd = &p[d * 3 * h..(d + 1) * 3 * h];
                        let mut nh = vec![0.0; h];
                        let mut nc = vec![0.0; h];
                        for j in 0..h {
                            let pre = |gate: usize| wx[gate * h + j] + rh_of(&hs, gate * h + j);
                            let i = act(0, clip_f(pre(0) + pd[j] * cs[j]));
                            let f = if *input_forget {
                                1.0 - i
                            } else {
                                act(0, clip_f(pre(2) + pd[2 * h + j] * cs[j]))
                            };
                            let c = act(1, clip_f(pre(3)));
                            nc[j] = f * cs[j] + i * c;
                            let o = act(0, clip_f(pre(1) + pd[h + j] * nc[j]));
                            nh[j] = o * act(2, nc[j]);
                        }
                        cs = nc;
                        nh
                    }
                };
                hs = new_h;
                let yo = y_index(t, d, b);
                y[yo..yo + h].copy_from_slice(&hs);
            }
            yh[so..so + h].copy_from_slice(&hs);
            if is_lstm {
                yc[so..so + h].copy_from_slice(&cs);
            }
        }
    }
    let y_shape = if *batch_first {
        vec![batch, seq, nd, h]
    } else {
        vec![seq, nd, batch, h]
    };
    let s_shape = if *batch_first {
        vec![batch, nd, h]
    } else {
        vec![nd, batch, h]
    };
    let mut out = vec![make(dt, y_shape, &y)?, make(dt, s_shape.clone(), &yh)?];
    if is_lstm {
        out.push(make(dt, s_shape, &yc)?);
    }
    Ok(out)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

// ---------------------------------------------------------------- grid sampling

/// Reflects `x` into `[lo, hi]` by the nearest border, as ONNX's reference does.
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let rng = hi - lo;
    if !(rng > 0.0) {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n % 2.0 == 0.0 {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let dx = x - hi;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n % 2.0 == 0.0 {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

fn cubic_coeffs(t: f64) -> [f64; 4] {
    let a = -0.75;
    let x = t.abs();
    [
        ((a * (x + 1.0) - 5.0 * a) * (x + 1.0) + 8.0 * a) * (x + 1.0) - 4.0 * a,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        ((a + 2.0) * (1.0 - x) - (a + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0,
        ((a * (2.0 - x) - 5.0 * a) * (2.0 - x) + 8.0 * a) * (2.0 - x) - 4.0 * a,
    ]
}

fn grid_sample(
    args: &[&Tensor],
    mode: GridSampleMode,
    padding: GridPadding,
    align: bool,
) -> Result<Vec<Tensor>, String> {
    let (xt, gt) = (arg(args, 0)?, arg(args, 1)?);
    let xs = xt.shape().to_vec();
    let gs = gt.shape().to_vec();
    let nd = xs.len().saturating_sub(2);
    if xs.len() < 3 || gs.len() != xs.len() || gs[nd + 1] != nd || gs[0] != xs[0] {
        return Err(format!("X {xs:?} and grid {gs:?} do not match"));
    }
    let (n_n, c_n) = (xs[0], xs[1]);
    let dims = &xs[2..];
    let in_sp: usize = dims.iter().product();
    let out_sp: usize = gs[1..=nd].iter().product();
    let x = xt.to_f64_vec();
    let grid = gt.to_f64_vec();
    let f32_grid = gt.dtype() != DType::F64;
    let dstr = tilec_ir::strides(dims);
    // Borders of the valid coordinate range per spatial dim.
    let (lo, hi): (Vec<f64>, Vec<f64>) = dims
        .iter()
        .map(|&d| {
            if align {
                (0.0, d as f64 - 1.0)
            } else {
                (-0.5, d as f64 - 0.5)
            }
        })
        .unzip();
    // Maps an integer index per the padding mode; None means "zero".
    let fix_index = |i: i64, k: usize| -> Option<usize> {
        let d = dims[k] as i64;
        match padding {
            GridPadding::Zeros => (i >= 0 && i < d).then_some(i as usize),
            GridPadding::Border => Some(i.clamp(0, d - 1) as usize),
            GridPadding::Reflection => {
                let r = reflect(i as f64, lo[k], hi[k]) as i64;
                (r >= 0 && r < d).then_some(r as usize)
            }
        }
    };
    let mut y = vec![0.0; n_n * c_n * out_sp];
    let mut coords = vec![0.0; nd];
    let taps = match mode {
        GridSampleMode::Nearest => 1,
        GridSampleMode::Linear => 2,
        GridSampleMode::Cubic => 4,
    };
    // Per dim: the taps' indices (already padded) and weights.
    let mut tap_idx = vec![vec![None; taps]; nd];
    let mut tap_w = vec![vec![0.0; taps]; nd];
    for n in 0..n_n {
        for o in 0..out_sp {
            let gp = &grid[(n * out_sp + o) * nd..(n * out_sp + o + 1) * nd];
            for k in 0..nd {
                // Grid components are (x, y[, z]): the last spatial dim first.
                let v = gp[nd - 1 - k];
                let len = dims[k] as f64;
                let mut c = if f32_grid {
                    let (v, len) = (v as f32, len as f32);
                    (if align {
                        (v + 1.0) / 2.0 * (len - 1.0)
                    } else {
                        ((v + 1.0) * len - 1.0) / 2.0
                    }) as f64
                } else if align {
                    (v + 1.0) / 2.0 * (len - 1.0)
                } else {
                    ((v + 1.0) * len - 1.0) / 2.0
                };
                if mode == GridSampleMode::Nearest {
                    c = c.round_ties_even();
                }
                if c < lo[k] || c > hi[k] {
                    match padding {
                        GridPadding::Border => c = c.clamp(0.0, len - 1.0),
                        GridPadding::Reflection => c = reflect(c, lo[k], hi[k]),
                        GridPadding::Zeros => {}
                    }
                }
                coords[k] = c;
            }
            for k in 0..nd {
                let c = coords[k];
                match mode {
                    GridSampleMode::Nearest => {
                        tap_idx[k][0] = fix_index(c.trunc() as i64, k);
                        tap_w[k][0] = 1.0;
                    }
                    GridSampleMode::Linear => {
                        let f = c.floor();
                        let t = c - f;
                        tap_idx[k][0] = fix_index(f as i64, k);
                        tap_idx[k][1] = fix_index(f as i64 + 1, k);
                        tap_w[k][0] = 1.0 - t;
                        tap_w[k][1] = t;
                    }
                    GridSampleMode::Cubic => {
                        let f = c.floor();
                        let cf = cubic_coeffs(c - f);
                        for m in 0..4 {
                            tap_idx[k][m] = fix_index(f as i64 - 1 + m as i64, k);
                            tap_w[k][m] = cf[m];
                        }
                    }
                }
            }
            // Sum over the tensor product of taps.
            let total = taps.pow(nd as u32);
            for c in 0..c_n {
                let base = (n * c_n + c) * in_sp;
                let mut acc = 0.0;
                for combo in 0..total {
                    let mut rem = combo;
                    let mut off = 0;
                    let mut wgt = 1.0;
                    let mut zero = false;
                    for k in (0..nd).rev() {
                        let m = rem % taps;
                        rem /= taps;
                        wgt *= tap_w[k][m];
                        match tap_idx[k][m] {
                            Some(i) => off += i * dstr[k],
                            None => zero = true,
                        }
                    }
                    if !zero && wgt != 0.0 {
                        acc += wgt * x[base + off];
                    }
                }
                y[(n * c_n + c) * out_sp + o] = acc;
            }
        }
    }
    let mut ys = vec![n_n, c_n];
    ys.extend_from_slice(&gs[1..=nd]);
    Ok(vec![make(xt.dtype(), ys, &y)?])
}

fn affine_grid(args: &[&Tensor], align: bool, size: &[usize]) -> Result<Vec<Tensor>, String> {
    let t = arg(args, 0)?;
    let nd = size.len().saturating_sub(2);
    let n = *size.first().ok_or("empty size")?;
    if !(nd == 2 || nd == 3) || t.shape() != [n, nd, nd + 1] {
        return Err(format!("theta {:?} does not match size {size:?}", t.shape()));
    }
    let th = t.to_f64_vec();
    let sp = &size[2..];
    let base = |len: usize, k: usize| -> f64 {
        if align {
            if len <= 1 {
                -1.0
            } else {
                -1.0 + k as f64 * (2.0 / (len as f64 - 1.0))
            }
        } else {
            let step = 2.0 / len as f64;
            -1.0 + step / 2.0 + k as f64 * step
        }
    };
    let count: usize = sp.iter().product();
    let mut out = Vec::with_capacity(n * count * nd);
    let st = tilec_ir::strides(sp);
    for b in 0..n {
        let tb = &th[b * nd * (nd + 1)..(b + 1) * nd * (nd + 1)];
        for p in 0..count {
            // Homogeneous point (x, y[, z], 1): x runs along the last spatial dim.
            let mut pt = vec![1.0; nd + 1];
            for k in 0..nd {
                let idx = (p / st[k]) % sp[k];
                pt[nd - 1 - k] = base(sp[k], idx);
            }
            for row in 0..nd {
                out.push(dot(&tb[row * (nd + 1)..(row + 1) * (nd + 1)], &pt));
            }
        }
    }
    let mut shape = vec![n];
    shape.extend_from_slice(sp);
    shape.push(nd);
    Ok(vec![make(t.dtype(), shape, &out)?])
}

// ---------------------------------------------------------------- Fourier transforms

/// cos/sin of `2*pi*m/n` for m in 0..n (exact index reduction keeps accuracy).
fn twiddles(n: usize) -> Vec<(f64, f64)> {
    (0..n)
        .map(|m| {
            let a = 2.0 * std::f64::consts::PI * m as f64 / n as f64;
            (a.cos(), a.sin())
        })
        .collect()
}

/// One transform of `z` (complex, any length) to `out_len` outputs of an `n`-point DFT.
fn dft_1d(z: &[(f64, f64)], n: usize, out_len: usize, inverse: bool, tw: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let m_n = z.len().min(n);
    let sign = if inverse { 1.0 } else { -1.0 };
    (0..out_len)
        .map(|k| {
            let (mut re, mut im) = (0.0, 0.0);
            for (m, &(a, b)) in z[..m_n].iter().enumerate() {
                let (c, s) = tw[(k * m) % n];
                let s = sign * s;
                re += a * c - b * s;
                im += a * s + b * c;
            }
            if inverse {
                (re / n as f64, im / n as f64)
            } else {
                (re, im)
            }
        })
        .collect()
}

/// numpy's `irfft(z, n)`: a real signal from the first `n/2+1` bins of a Hermitian spectrum.
fn irfft_1d(z: &[(f64, f64)], n: usize, tw: &[(f64, f64)]) -> Vec<f64> {
    let bins = n / 2 + 1;
    let get = |k: usize| if k < z.len() { z[k] } else { (0.0, 0.0) };
    (0..n)
        .map(|m| {
            let mut acc = get(0).0;
            for k in 1..bins {
                let (a, b) = get(k);
                let (c, s) = tw[(k * m) % n];
                if 2 * k == n {
                    acc += a * c - b * s;
                } else {
                    acc += 2.0 * (a * c - b * s);
                }
            }
            acc / n as f64
        })
        .collect()
}

fn dft(args: &[&Tensor], axis: usize, inverse: bool, onesided: bool, length: usize) -> Result<Vec<Tensor>, String> {
    let x = arg(args, 0)?;
    let xs = x.shape().to_vec();
    let r = xs.len();
    if r < 2 || axis >= r - 1 || !(xs[r - 1] == 1 || xs[r - 1] == 2) || length == 0 {
        return Err(format!("bad DFT input {xs:?} for axis {axis}"));
    }
    let comp = xs[r - 1];
    let n_in = xs[axis];
    let outer: usize = xs[..axis].iter().product();
    let inner: usize = xs[axis + 1..r - 1].iter().product();
    let xv = x.to_f64_vec();
    let tw = twiddles(length);
    let (out_len, out_comp) = match (inverse, onesided) {
        (true, true) => (length, 1),
        (false, true) => (length / 2 + 1, 2),
        _ => (length, 2),
    };
    let mut out = vec![0.0; outer * out_len * inner * out_comp];
    let mut z = vec![(0.0, 0.0); n_in];
    for o in 0..outer {
        for i in 0..inner {
            for (m, zm) in z.iter_mut().enumerate() {
                let off = ((o * n_in + m) * inner + i) * comp;
                *zm = (xv[off], if comp == 2 { xv[off + 1] } else { 0.0 });
            }
            let put = |out: &mut Vec<f64>, k: usize, c: usize, v: f64| {
                out[((o * out_len + k) * inner + i) * out_comp + c] = v;
            };
            if inverse && onesided {
                for (k, v) in irfft_1d(&z, length, &tw).into_iter().enumerate() {
                    put(&mut out, k, 0, v);
                }
            } else {
                for (k, (re, im)) in dft_1d(&z, length, out_len, inverse, &tw).into_iter().enumerate() {
                    put(&mut out, k, 0, re);
                    put(&mut out, k, 1, im);
                }
            }
        }
    }
    let mut shape = xs.clone();
    shape[axis] = out_len;
    shape[r - 1] = out_comp;
    Ok(vec![make(x.dtype(), shape, &out)?])
}

fn stft(args: &[&Tensor], step: usize, fl: usize, onesided: bool, has_window: bool) -> Result<Vec<Tensor>, String> {
    let x = arg(args, 0)?;
    let xs = x.shape().to_vec();
    if xs.len() != 3 || !(xs[2] == 1 || xs[2] == 2) || step == 0 || fl == 0 || xs[1] < fl {
        return Err(format!("bad STFT signal {xs:?} for frame length {fl}, step {step}"));
    }
    let win: Vec<f64> = if has_window {
        let w = arg(args, 1)?;
        if w.shape() != [fl] {
            return Err(format!("window has shape {:?}, expected [{fl}]", w.shape()));
        }
        w.to_f64_vec()
    } else {
        vec![1.0; fl]
    };
    let (b_n, len, comp) = (xs[0], xs[1], xs[2]);
    let frames = 1 + (len - fl) / step;
    let bins = if onesided { fl / 2 + 1 } else { fl };
    let xv = x.to_f64_vec();
    let tw = twiddles(fl);
    let mut out = Vec::with_capacity(b_n * frames * bins * 2);
    for b in 0..b_n {
        for f in 0..frames {
            let z: Vec<(f64, f64)> = (0..fl)
                .map(|m| {
                    let off = (b * len + f * step + m) * comp;
                    let im = if comp == 2 { xv[off + 1] } else { 0.0 };
                    (xv[off] * win[m], im * win[m])
                })
                .collect();
            for (re, im) in dft_1d(&z, fl, bins, false, &tw) {
                out.push(re);
                out.push(im);
            }
        }
    }
    Ok(vec![make(x.dtype(), vec![b_n, frames, bins, 2], &out)?])
}

// ---------------------------------------------------------------- linear attention

fn linear_attention(
    args: &[&Tensor],
    hq: usize,
    hkv: usize,
    scale: f32,
    rule: LinearAttentionRule,
    has_past: bool,
) -> Result<Vec<Tensor>, String> {
    let (qt, kt, vt) = (arg(args, 0)?, arg(args, 1)?, arg(args, 2)?);
    let (qs, ks, vs) = (qt.shape(), kt.shape(), vt.shape());
    if qs.len() != 3 || ks.len() != 3 || vs.len() != 3 || hkv == 0 || hq % hkv != 0 {
        return Err(format!("bad shapes {qs:?} {ks:?} {vs:?}"));
    }
    let (b_n, t_n) = (qs[0], qs[1]);
    if qs[2] % hq != 0 || vs[2] % hkv != 0 {
        return Err("hidden sizes are not divisible by the head counts".into());
    }
    let dk = qs[2] / hq;
    let dv = vs[2] / hkv;
    if ks != [b_n, t_n, hkv * dk] || vs[..2] != [b_n, t_n] {
        return Err(format!("key {ks:?} / value {vs:?} do not match query {qs:?}"));
    }
    let group = hq / hkv;
    let (q, k, v) = (qt.to_f64_vec(), kt.to_f64_vec(), vt.to_f64_vec());
    let mut idx = 3;
    let (mut state, state_dt) = if has_past {
        let p = arg(args, idx)?;
        idx += 1;
        if p.shape() != [b_n, hkv, dk, dv] {
            return Err(format!(
                "past_state has shape {:?}, expected [{b_n}, {hkv}, {dk}, {dv}]",
                p.shape()
            ));
        }
        (p.to_f64_vec(), p.dtype())
    } else {
        (vec![0.0; b_n * hkv * dk * dv], qt.dtype())
    };
    // Decay per (b, t, h, i) with i over d_k (or 1 when per head).
    let decay = if rule.gating() {
        let d = arg(args, idx)?;
        idx += 1;
        let last = *d.shape().last().unwrap_or(&0);
        if d.shape()[..d.rank().min(2)] != [b_n, t_n] || d.rank() != 3 || !(last == hkv || last == hkv * dk) {
            return Err(format!("decay has shape {:?}", d.shape()));
        }
        Some((d.to_f64_vec(), last / hkv))
    } else {
        None
    };
    let beta = if rule.delta() {
        let bt = arg(args, idx)?;
        let last = *bt.shape().last().unwrap_or(&0);
        if bt.rank() != 3 || bt.shape()[..2] != [b_n, t_n] || !(last == hkv || last == 1) {
            return Err(format!("beta has shape {:?}", bt.shape()));
        }
        Some((bt.to_f64_vec(), last))
    } else {
        None
    };
    let sc = if scale == 0.0 {
        1.0 / (dk as f64).sqrt()
    } else {
        scale as f64
    };
    let mut out = vec![0.0; b_n * t_n * hq * dv];
    let mut vt_buf = vec![0.0; dv];
    for b in 0..b_n {
        for t in 0..t_n {
            for h in 0..hkv {
                let s = &mut state[(b * hkv + h) * dk * dv..(b * hkv + h + 1) * dk * dv];
                let kv = &k[(b * t_n + t) * hkv * dk + h * dk..][..dk];
                vt_buf.copy_from_slice(&v[(b * t_n + t) * hkv * dv + h * dv..][..dv]);
                if let Some((dec, per)) = &decay {
                    for i in 0..dk {
                        let g = dec[(b * t_n + t) * hkv * per + h * per + if *per == 1 { 0 } else { i }];
                        let e = g.exp();
                        for m in 0..dv {
                            s[i * dv + m] *= e;
                        }
                    }
                }
                if let Some((bv, last)) = &beta {
                    let bb = bv[(b * t_n + t) * last + if *last == 1 { 0 } else { h }];
                    for m in 0..dv {
                        let retrieved: f64 = (0..dk).map(|i| s[i * dv + m] * kv[i]).sum();
                        vt_buf[m] = bb * (vt_buf[m] - retrieved);
                    }
                }
                for i in 0..dk {
                    for m in 0..dv {
                        s[i * dv + m] += kv[i] * vt_buf[m];
                    }
                }
                for qh in h * group..(h + 1) * group {
                    let qv = &q[(b * t_n + t) * hq * dk + qh * dk..][..dk];
                    for m in 0..dv {
                        let acc: f64 = (0..dk).map(|i| qv[i] * s[i * dv + m]).sum();
                        out[(b * t_n + t) * hq * dv + qh * dv + m] = sc * acc;
                    }
                }
            }
        }
    }
    Ok(vec![
        make(qt.dtype(), vec![b_n, t_n, hq * dv], &out)?,
        make(state_dt, vec![b_n, hkv, dk, dv], &state)?,
    ])
}

// ---------------------------------------------------------------- causal conv with state

fn causal_conv(args: &[&Tensor], silu: bool, has_bias: bool, has_past: bool) -> Result<Vec<Tensor>, String> {
    let (xt, wt) = (arg(args, 0)?, arg(args, 1)?);
    let xs = xt.shape();
    let ws = wt.shape();
    if xs.len() != 3 || ws.len() != 3 || ws[0] != xs[1] || ws[1] != 1 || ws[2] == 0 {
        return Err(format!("input {xs:?} / weight {ws:?} must be [B, C, L] / [C, 1, K]"));
    }
    let dt = xt.dtype();
    let (b_n, c_n, l_n, k_n) = (xs[0], xs[1], xs[2], ws[2]);
    let mut idx = 2;
    let bias = if has_bias {
        let t = arg(args, idx)?;
        idx += 1;
        if t.shape() != [c_n] {
            return Err(format!("bias has shape {:?}, expected [{c_n}]", t.shape()));
        }
        t.to_f64_vec()
    } else {
        vec![0.0; c_n]
    };
    let past = if has_past {
        let t = arg(args, idx)?;
        if t.shape() != [b_n, c_n, k_n - 1] {
            return Err(format!(
                "past_state has shape {:?}, expected [{b_n}, {c_n}, {}]",
                t.shape(),
                k_n - 1
            ));
        }
        t.to_f64_vec()
    } else {
        vec![0.0; b_n * c_n * (k_n - 1)]
    };
    let (x, w) = (xt.to_f64_vec(), wt.to_f64_vec());
    let p_n = k_n - 1 + l_n;
    let mut out = vec![0.0; b_n * c_n * l_n];
    let mut present = Vec::with_capacity(b_n * c_n * (k_n - 1));
    let mut padded = vec![0.0; p_n];
    for b in 0..b_n {
        for c in 0..c_n {
            let bc = b * c_n + c;
            padded[..k_n - 1].copy_from_slice(&past[bc * (k_n - 1)..(bc + 1) * (k_n - 1)]);
            padded[k_n - 1..].copy_from_slice(&x[bc * l_n..(bc + 1) * l_n]);
            let wc = &w[c * k_n..(c + 1) * k_n];
            for t in 0..l_n {
                let mut acc = bias[c];
                for j in 0..k_n {
                    acc += wc[j] * padded[t + j];
                }
                if silu {
                    // The reference rounds the conv output before the activation.
                    let a = round_to(dt, acc);
                    acc = a * sigmoid(a);
                }
                out[bc * l_n + t] = acc;
            }
            present.extend_from_slice(&padded[p_n - (k_n - 1)..]);
        }
    }
    Ok(vec![
        make(dt, vec![b_n, c_n, l_n], &out)?,
        make(dt, vec![b_n, c_n, k_n - 1], &present)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive complex DFT straight from the definition.
    fn naive(z: &[(f64, f64)], inverse: bool) -> Vec<(f64, f64)> {
        let n = z.len();
        let sign = if inverse { 1.0 } else { -1.0 };
        (0..n)
            .map(|k| {
                let mut acc = (0.0, 0.0);
                for (m, &(a, b)) in z.iter().enumerate() {
                    let ang = sign * 2.0 * std::f64::consts::PI * (k * m) as f64 / n as f64;
                    acc.0 += a * ang.cos() - b * ang.sin();
                    acc.1 += a * ang.sin() + b * ang.cos();
                }
                if inverse {
                    (acc.0 / n as f64, acc.1 / n as f64)
                } else {
                    acc
                }
            })
            .collect()
    }

    #[test]
    fn dft_matches_definition_and_inverts() {
        let z: Vec<(f64, f64)> = (0..7)
            .map(|i| ((i as f64 * 0.7).sin(), (i as f64 * 1.3).cos()))
            .collect();
        let tw = twiddles(7);
        let f = dft_1d(&z, 7, 7, false, &tw);
        for (a, b) in f.iter().zip(naive(&z, false)) {
            assert!((a.0 - b.0).abs() < 1e-12 && (a.1 - b.1).abs() < 1e-12);
        }
        let back = dft_1d(&f, 7, 7, true, &tw);
        for (a, b) in back.iter().zip(&z) {
            assert!((a.0 - b.0).abs() < 1e-12 && (a.1 - b.1).abs() < 1e-12);
        }
    }

    #[test]
    fn irfft_inverts_rfft() {
        for n in [6usize, 7] {
            let x: Vec<(f64, f64)> = (0..n).map(|i| ((i as f64).sqrt() - 1.0, 0.0)).collect();
            let tw = twiddles(n);
            let spec = dft_1d(&x, n, n / 2 + 1, false, &tw);
            let back = irfft_1d(&spec, n, &tw);
            for (a, b) in back.iter().zip(&x) {
                assert!((a - b.0).abs() < 1e-12, "n={n}: {a} vs {}", b.0);
            }
        }
    }

    #[test]
    fn reflect_stays_in_range() {
        assert_eq!(reflect(-1.5, -0.5, 2.5), 0.5);
        assert_eq!(reflect(3.0, -0.5, 2.5), 2.0);
        assert_eq!(reflect(7.0, 0.0, 2.0), 1.0);
        assert_eq!(reflect(1.0, 0.0, 2.0), 1.0);
    }

    #[test]
    fn gqa_attention_matches_repeated_heads() {
        // GQA with 2 q heads on 1 kv head equals MHA with the kv head duplicated.
        let q = Tensor::from_vec(vec![1, 2, 2, 2], vec![0.1f32, 0.2, 0.3, -0.4, 0.5, 0.6, -0.7, 0.8]).unwrap();
        let k1 = Tensor::from_vec(vec![1, 1, 3, 2], vec![0.3f32, -0.1, 0.2, 0.4, -0.5, 0.6]).unwrap();
        let v1 = Tensor::from_vec(vec![1, 1, 3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let dup = |t: &Tensor| {
            let v: Vec<f32> = t.as_slice::<f32>().unwrap().to_vec();
            Tensor::from_vec(vec![1, 2, 3, 2], [v.clone(), v].concat()).unwrap()
        };
        let op = NnOp::Attention {
            q_num_heads: 0,
            kv_num_heads: 0,
            scale: None,
            is_causal: true,
            softcap: 0.0,
            qk_matmul_output_mode: 0,
            softmax_precision: None,
            left_window: -1,
            right_window: -1,
            has_mask: false,
            has_past: false,
            has_nonpad: false,
            zero_nan_rows: false,
        };
        let a = attention(&op, &[&q, &k1, &v1]).unwrap();
        let (k2, v2) = (dup(&k1), dup(&v1));
        let b = attention(&op, &[&q, &k2, &v2]).unwrap();
        assert_eq!(a[0], b[0]);
        // Causal: query 0 sees only key 0, so its output is V[0].
        let y = a[0].to_f64_vec();
        assert!((y[0] - 1.0).abs() < 1e-6 && (y[1] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn rnn_sequence_lens_truncate_each_batch() {
        // A GRU over two batch rows where row 1 has length 2 must give, for row 1, the
        // same Y_h as running on its first two steps alone, and zeros in Y after it.
        let (s, i, h) = (3usize, 2usize, 2usize);
        let op = NnOp::Rnn {
            cell: RnnCell::Gru {
                linear_before_reset: false,
            },
            direction: RnnDirection::Forward,
            hidden_size: h,
            batch_first: false,
            acts: vec![RnnAct::Sigmoid, RnnAct::Tanh],
            clip: None,
            has_seq_lens: true,
            has_initial_h: false,
            has_initial_c: false,
        };
        let xs: Vec<f32> = (0..s * 2 * i).map(|k| (k as f32 * 0.37).sin()).collect();
        let x = Tensor::from_vec(vec![s, 2, i], xs.clone()).unwrap();
        let w = Tensor::from_vec(
            vec![1, 3 * h, i],
            (0..3 * h * i).map(|k| (k as f32 * 0.11).cos()).collect(),
        )
        .unwrap();
        let r = Tensor::from_vec(
            vec![1, 3 * h, h],
            (0..3 * h * h).map(|k| (k as f32 * 0.23).sin()).collect(),
        )
        .unwrap();
        let b = Tensor::from_vec(vec![1, 6 * h], (0..6 * h).map(|k| k as f32 * 0.01).collect()).unwrap();
        let lens = Tensor::from_vec(vec![2], vec![3i32, 2]).unwrap();
        let out = rnn(&op, &[&x, &w, &r, &b, &lens]).unwrap();
        // Row 1 alone, two steps.
        let x1: Vec<f32> = (0..2)
            .flat_map(|t| xs[(t * 2 + 1) * i..(t * 2 + 2) * i].to_vec())
            .collect();
        let x1 = Tensor::from_vec(vec![2, 1, i], x1).unwrap();
        let lens1 = Tensor::from_vec(vec![1], vec![2i32]).unwrap();
        let out1 = rnn(&op, &[&x1, &w, &r, &b, &lens1]).unwrap();
        let (yh, yh1) = (out[1].to_f64_vec(), out1[1].to_f64_vec());
        assert_eq!(&yh[h..2 * h], &yh1[..]);
        let y = out[0].to_f64_vec(); // [S, 1, B, H]
        assert_eq!(&y[(2 * 2 + 1) * h..(2 * 2 + 2) * h], &[0.0, 0.0]);
        assert_ne!(&y[(2 * 2) * h..(2 * 2 + 1) * h], &[0.0, 0.0]);
    }
}
