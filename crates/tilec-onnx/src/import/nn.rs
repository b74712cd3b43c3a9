//! ONNX mappings for the nn family: Attention, RotaryEmbedding, SwiGLU, RNN/GRU/LSTM,
//! GridSample, AffineGrid, DFT, STFT, LinearAttention, CausalConvWithState, and the
//! window functions / MelWeightMatrix (folded into constants: their outputs depend only
//! on compile-time operands).

use super::{ImportError, MapFn, NodeCx, ShapeElem};
use tilec_ir::op::{GridPadding, GridSampleMode, LinearAttentionRule, NnOp, RnnAct, RnnCell, RnnDirection};
use tilec_ir::{DType, Dim, Op, Tensor, ValueId};

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    Some(match op_type {
        "Attention" => map_attention,
        "RotaryEmbedding" => map_rotary,
        "SwiGLU" => map_swiglu,
        "RNN" | "GRU" | "LSTM" => map_rnn,
        "GridSample" => map_grid_sample,
        "AffineGrid" => map_affine_grid,
        "DFT" => map_dft,
        "STFT" => map_stft,
        "HannWindow" | "HammingWindow" | "BlackmanWindow" => map_window,
        "MelWeightMatrix" => map_mel,
        "LinearAttention" => map_linear_attention,
        "CausalConvWithState" => map_causal_conv,
        _ => return None,
    })
}

fn nonneg(cx: &NodeCx, name: &str, v: i64) -> Result<usize, ImportError> {
    usize::try_from(v).map_err(|_| cx.invalid(format!("attribute '{name}' must be non-negative, got {v}")))
}

fn bool_attr(cx: &NodeCx, name: &str, default: i64) -> Result<bool, ImportError> {
    match cx.attr_i(name, default)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(cx.invalid(format!("attribute '{name}' must be 0 or 1, got {v}"))),
    }
}

/// A scalar (or one-element) constant integer operand.
fn const_scalar(cx: &NodeCx, i: usize, what: &str) -> Result<i64, ImportError> {
    let v = cx.const_ints(i, what)?;
    match v.as_slice() {
        [x] => Ok(*x),
        _ => Err(cx.invalid(format!("{what} must be a scalar, got {} elements", v.len()))),
    }
}

fn map_attention(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let q = cx.req_input(0)?;
    let k = cx.req_input(1)?;
    let v = cx.req_input(2)?;
    let rank = cx.ty(q).rank();
    let mask = cx.input(3);
    let (pk, pv) = (cx.input(4), cx.input(5));
    if pk.is_some() != pv.is_some() {
        return Err(cx.invalid("past_key and past_value must be given together"));
    }
    let nonpad = cx.input(6);
    if nonpad.is_some() && pk.is_some() {
        return Err(cx.invalid("nonpad_kv_seqlen cannot be combined with past_key/past_value"));
    }
    let (mut qh, mut kvh) = (0, 0);
    if rank == 3 {
        let a = cx.attr_i_opt("q_num_heads")?;
        let b = cx.attr_i_opt("kv_num_heads")?;
        match (a, b) {
            (Some(a), Some(b)) if a > 0 && b > 0 => {
                qh = a as usize;
                kvh = b as usize;
            }
            _ => return Err(cx.invalid("3-D inputs need positive q_num_heads and kv_num_heads")),
        }
    }
    let mode = cx.attr_i("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        return Err(cx.invalid(format!("qk_matmul_output_mode must be 0..3, got {mode}")));
    }
    let softmax_precision = cx.attr_dtype("softmax_precision")?;
    if let Some(p) = softmax_precision {
        if !p.is_float() {
            return Err(cx.invalid(format!("softmax_precision must be a float type, got {p}")));
        }
    }
    let left = cx.attr_i("left_window_size", -1)?;
    let right = cx.attr_i("right_window_size", -1)?;
    if left < -1 || right < -1 {
        return Err(cx.invalid("window sizes must be -1 or non-negative"));
    }
    let op = NnOp::Attention {
        q_num_heads: qh,
        kv_num_heads: kvh,
        scale: cx.attr_f_opt("scale")?,
        is_causal: bool_attr(cx, "is_causal", 0)?,
        softcap: cx.attr_f("softcap", 0.0)?,
        qk_matmul_output_mode: mode as u8,
        softmax_precision,
        left_window: left,
        right_window: right,
        has_mask: mask.is_some(),
        has_past: pk.is_some(),
        has_nonpad: nonpad.is_some(),
        zero_nan_rows: false,
    };
    let mut ins = vec![q, k, v];
    ins.extend(mask);
    ins.extend(pk);
    ins.extend(pv);
    ins.extend(nonpad);
    cx.emit(Op::Nn(op), &ins)
}

fn map_rotary(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let cos = cx.req_input(1)?;
    let sin = cx.req_input(2)?;
    let pos = cx.input(3);
    let num_heads = cx.attr_i("num_heads", 0)?;
    let num_heads = nonneg(cx, "num_heads", num_heads)?;
    if cx.ty(x).rank() == 3 && num_heads == 0 {
        return Err(cx.invalid("3-D input needs num_heads"));
    }
    let rd = cx.attr_i("rotary_embedding_dim", 0)?;
    let op = NnOp::RotaryEmbedding {
        interleaved: bool_attr(cx, "interleaved", 0)?,
        rotary_dim: nonneg(cx, "rotary_embedding_dim", rd)?,
        num_heads,
        has_position_ids: pos.is_some(),
    };
    let mut ins = vec![x, cos, sin];
    ins.extend(pos);
    cx.emit(Op::Nn(op), &ins)
}

fn map_swiglu(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let a = cx.req_input(0)?;
    let b = cx.req_input(1)?;
    let alpha = cx.attr_f("alpha", 1.0)?;
    cx.emit(Op::Nn(NnOp::SwiGlu { alpha }), &[a, b])
}

fn parse_act(
    cx: &NodeCx,
    name: &str,
    alphas: &[f32],
    betas: &[f32],
    ai: &mut usize,
    bi: &mut usize,
) -> Result<RnnAct, ImportError> {
    let take = |list: &[f32], i: &mut usize, default: f32| {
        let v = list.get(*i).copied().unwrap_or(default);
        *i += 1;
        v
    };
    Ok(match name.to_ascii_lowercase().as_str() {
        "relu" => RnnAct::Relu,
        "tanh" => RnnAct::Tanh,
        "sigmoid" => RnnAct::Sigmoid,
        "affine" => RnnAct::Affine {
            alpha: take(alphas, ai, 1.0),
            beta: take(betas, bi, 0.0),
        },
        "leakyrelu" => RnnAct::LeakyRelu {
            alpha: take(alphas, ai, 0.01),
        },
        "thresholdedrelu" => RnnAct::ThresholdedRelu {
            alpha: take(alphas, ai, 1.0),
        },
        "scaledtanh" => RnnAct::ScaledTanh {
            alpha: take(alphas, ai, 1.0),
            beta: take(betas, bi, 1.0),
        },
        "hardsigmoid" => RnnAct::HardSigmoid {
            alpha: take(alphas, ai, 0.2),
            beta: take(betas, bi, 0.5),
        },
        "elu" => RnnAct::Elu {
            alpha: take(alphas, ai, 1.0),
        },
        "softsign" => RnnAct::Softsign,
        "softplus" => RnnAct::Softplus,
        other => return Err(cx.unsupported(format!("activation '{other}'"))),
    })
}

fn map_rnn(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let cell = match cx.op_type() {
        "RNN" => RnnCell::Rnn,
        "GRU" => RnnCell::Gru {
            linear_before_reset: bool_attr(cx, "linear_before_reset", 0)?,
        },
        _ => RnnCell::Lstm {
            input_forget: bool_attr(cx, "input_forget", 0)?,
        },
    };
    let is_lstm = matches!(cell, RnnCell::Lstm { .. });
    let x = cx.req_input(0)?;
    let w = cx.req_input(1)?;
    let r = cx.req_input(2)?;
    let dt = cx.ty(x).dtype;
    let direction = match cx.attr_s("direction")?.as_deref().unwrap_or("forward") {
        "forward" => RnnDirection::Forward,
        "reverse" => RnnDirection::Reverse,
        "bidirectional" => RnnDirection::Bidirectional,
        d => return Err(cx.invalid(format!("unknown direction '{d}'"))),
    };
    let d = direction.count();
    let hidden = match cx.attr_i_opt("hidden_size")? {
        Some(h) => nonneg(cx, "hidden_size", h)?,
        None => match cx.ty(r).shape.get(2) {
            Some(Dim::Fixed(h)) => *h,
            _ => return Err(cx.invalid("hidden_size is missing and R has no static shape")),
        },
    };
    if hidden == 0 {
        return Err(cx.invalid("hidden_size must be positive"));
    }
    let batch_first = bool_attr(cx, "layout", 0)?;
    // Activations: given per direction (forward first), or the defaults.
    let per = cell.n_acts();
    let names: Vec<String> = match cx.attr("activations") {
        Some(a) => a
            .strings
            .iter()
            .map(|s| String::from_utf8(s.clone()).map_err(|_| cx.invalid("activation name is not UTF-8")))
            .collect::<Result<_, _>>()?,
        None => match cell {
            RnnCell::Rnn => vec!["Tanh".into()],
            RnnCell::Gru { .. } => vec!["Sigmoid".into(), "Tanh".into()],
            RnnCell::Lstm { .. } => vec!["Sigmoid".into(), "Tanh".into(), "Tanh".into()],
        },
    };
    let names: Vec<String> = if names.len() == per && d == 2 {
        names.iter().chain(names.iter()).cloned().collect()
    } else {
        names
    };
    if names.len() != per * d {
        return Err(cx.invalid(format!("expected {} activations, got {}", per * d, names.len())));
    }
    let alphas = cx.attr_floats("activation_alpha")?.unwrap_or_default();
    let betas = cx.attr_floats("activation_beta")?.unwrap_or_default();
    let (mut ai, mut bi) = (0, 0);
    let mut acts = Vec::new();
    for n in &names {
        acts.push(parse_act(cx, n, &alphas, &betas, &mut ai, &mut bi)?);
    }
    let clip = cx.attr_f_opt("clip")?;
    if let Some(c) = clip {
        if !(c > 0.0) {
            return Err(cx.invalid(format!("clip must be positive, got {c}")));
        }
    }
    let g = cell.gates();
    let b = match cx.input(3) {
        Some(b) => b,
        None => cx.constant(Tensor::zeros(dt, vec![d, 2 * g * hidden])),
    };
    let seq_lens = cx.input(4);
    let init_h = cx.input(5);
    let (init_c, p) = if is_lstm {
        let p = match cx.input(7) {
            Some(p) => p,
            None => cx.constant(Tensor::zeros(dt, vec![d, 3 * hidden])),
        };
        (cx.input(6), Some(p))
    } else {
        (None, None)
    };
    let op = NnOp::Rnn {
        cell,
        direction,
        hidden_size: hidden,
        batch_first,
        acts,
        clip,
        has_seq_lens: seq_lens.is_some(),
        has_initial_h: init_h.is_some(),
        has_initial_c: init_c.is_some(),
    };
    let mut ins = vec![x, w, r, b];
    ins.extend(seq_lens);
    ins.extend(init_h);
    ins.extend(init_c);
    ins.extend(p);
    cx.emit(Op::Nn(op), &ins)
}

fn map_grid_sample(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let g = cx.req_input(1)?;
    let mode = match cx
        .attr_s("mode")?
        .as_deref()
        .unwrap_or(if cx.opset >= 20 { "linear" } else { "bilinear" })
    {
        "linear" | "bilinear" => GridSampleMode::Linear,
        "nearest" => GridSampleMode::Nearest,
        "cubic" | "bicubic" => GridSampleMode::Cubic,
        m => return Err(cx.invalid(format!("unknown mode '{m}'"))),
    };
    let padding = match cx.attr_s("padding_mode")?.as_deref().unwrap_or("zeros") {
        "zeros" => GridPadding::Zeros,
        "border" => GridPadding::Border,
        "reflection" => GridPadding::Reflection,
        m => return Err(cx.invalid(format!("unknown padding_mode '{m}'"))),
    };
    let align_corners = bool_attr(cx, "align_corners", 0)?;
    cx.emit(
        Op::Nn(NnOp::GridSample {
            mode,
            padding,
            align_corners,
        }),
        &[x, g],
    )
}

fn map_affine_grid(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let theta = cx.req_input(0)?;
    let els = cx.shape_input(1, "the output size")?;
    let mut size = Vec::new();
    for e in els {
        size.push(match e {
            ShapeElem::Int(n) if n >= 0 => Dim::Fixed(n as usize),
            ShapeElem::Int(n) => return Err(cx.invalid(format!("size has a negative element {n}"))),
            ShapeElem::Sym(s) => Dim::Sym(s),
        });
    }
    let align_corners = bool_attr(cx, "align_corners", 0)?;
    cx.emit(Op::Nn(NnOp::AffineGrid { align_corners, size }), &[theta])
}

fn map_dft(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let r = cx.ty(x).rank();
    let axis = if cx.opset >= 20 {
        if cx.input(2).is_some() {
            const_scalar(cx, 2, "DFT axis")?
        } else {
            -2
        }
    } else {
        cx.attr_i("axis", 1)?
    };
    let ax = if axis < 0 { axis + r as i64 } else { axis };
    if ax < 0 || ax + 1 >= r as i64 {
        return Err(cx.invalid(format!(
            "axis {axis} must name a signal axis of a rank-{r} input (not the last)"
        )));
    }
    let ax = ax as usize;
    let inverse = bool_attr(cx, "inverse", 0)?;
    let onesided = bool_attr(cx, "onesided", 0)?;
    let length = if cx.input(1).is_some() {
        let n = const_scalar(cx, 1, "dft_length")?;
        if n <= 0 {
            return Err(cx.invalid(format!("dft_length must be positive, got {n}")));
        }
        n as usize
    } else {
        let n = cx.ty(x).shape[ax]
            .fixed()
            .ok_or_else(|| cx.unsupported("DFT over a symbolic axis without dft_length"))?;
        if inverse && onesided {
            2 * n.saturating_sub(1)
        } else {
            n
        }
    };
    cx.emit(
        Op::Nn(NnOp::Dft {
            axis: ax,
            inverse,
            onesided,
            length,
        }),
        &[x],
    )
}

fn map_stft(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let step = const_scalar(cx, 1, "frame_step")?;
    let window = cx.input(2);
    let frame_length = if cx.input(3).is_some() {
        const_scalar(cx, 3, "frame_length")?
    } else if let Some(w) = window {
        match cx.ty(w).shape.as_slice() {
            [Dim::Fixed(n)] => *n as i64,
            _ => return Err(cx.invalid("window must be 1-D with a static size")),
        }
    } else {
        match cx.ty(x).shape.get(1) {
            Some(Dim::Fixed(n)) => *n as i64,
            _ => return Err(cx.invalid("signal length must be static")),
        }
    };
    if step <= 0 || frame_length <= 0 {
        return Err(cx.invalid(format!(
            "frame_step ({step}) and frame_length ({frame_length}) must be positive"
        )));
    }
    let onesided = bool_attr(cx, "onesided", 1)?;
    let op = NnOp::Stft {
        frame_step: step as usize,
        frame_length: frame_length as usize,
        onesided,
        has_window: window.is_some(),
    };
    let mut ins = vec![x];
    ins.extend(window);
    cx.emit(Op::Nn(op), &ins)
}

/// Window function values in f64 (the output dtype's rounding comes later).
pub(crate) fn window_values(kind: &str, size: usize, periodic: bool) -> Vec<f64> {
    let denom = if periodic { size as f64 } else { size as f64 - 1.0 };
    let pi = std::f64::consts::PI;
    (0..size)
        .map(|n| {
            let n = n as f64;
            match kind {
                "HannWindow" => (pi * n / denom).sin().powi(2),
                "HammingWindow" => {
                    let a = 25.0 / 46.0;
                    a - (1.0 - a) * (2.0 * pi * n / denom).cos()
                }
                _ => 0.42 - 0.5 * (2.0 * pi * n / denom).cos() + 0.08 * (4.0 * pi * n / denom).cos(),
            }
        })
        .collect()
}

fn map_window(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let size = const_scalar(cx, 0, "window size")?;
    if size < 0 {
        return Err(cx.invalid(format!("window size must be non-negative, got {size}")));
    }
    let dt = cx.attr_dtype("output_datatype")?.unwrap_or(DType::F32);
    let periodic = bool_attr(cx, "periodic", 1)?;
    let v = window_values(cx.op_type(), size as usize, periodic);
    let t = Tensor::from_f64s(dt, vec![size as usize], &v).map_err(|e| cx.invalid(e.to_string()))?;
    Ok(vec![cx.constant(t)])
}

/// The MelWeightMatrix `[dft_length/2 + 1, num_mel_bins]` in f64, as the ONNX reference
/// computes it (the edge frequencies' mel values are computed in f32 as there).
pub(crate) fn mel_matrix(
    bins: usize,
    dft_length: i64,
    sample_rate: i64,
    lower: f32,
    upper: f32,
) -> Result<Vec<f64>, String> {
    if dft_length <= 0 || sample_rate <= 0 {
        return Err("dft_length and sample_rate must be positive".into());
    }
    let spec = (dft_length / 2 + 1) as usize;
    let to_mel = |hz: f32| -> f64 {
        let l = ((hz / 700.0f32) as f64).ln_1p() as f32;
        (2595.0f32 * l) as f64 / std::f64::consts::LN_10
    };
    let (lo, hi) = (to_mel(lower), to_mel(upper));
    let step = (hi - lo) / (bins + 2) as f64;
    let mut fb = Vec::with_capacity(bins + 2);
    for k in 0..bins + 2 {
        let m = k as f64 * step + lo;
        let hz = 700.0 * (m / 2595.0 * std::f64::consts::LN_10).exp_m1();
        let b = ((dft_length + 1) as f64 * hz / sample_rate as f64).floor();
        if !(b >= 0.0 && b < spec as f64 + 1.0) && bins > 0 {
            return Err(format!("mel band edge {b} falls outside the {spec} spectrogram bins"));
        }
        fb.push(b as i64);
    }
    let mut out = vec![0.0; spec * bins];
    let mut set = |j: i64, i: usize, v: f64| -> Result<(), String> {
        if j < 0 || j as usize >= spec {
            return Err(format!("mel band index {j} outside the {spec} spectrogram bins"));
        }
        out[j as usize * bins + i] = v;
        Ok(())
    };
    for i in 0..bins {
        let (l, c, h) = (fb[i], fb[i + 1], fb[i + 2]);
        if c == l {
            set(c, i, 1.0)?;
        } else {
            for j in l..=c {
                set(j, i, (j - l) as f64 / (c - l) as f64)?;
            }
        }
        if h > c {
            for j in c..h {
                set(j, i, (h - j) as f64 / (h - c) as f64)?;
            }
        }
    }
    Ok(out)
}

fn map_mel(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let bins = const_scalar(cx, 0, "num_mel_bins")?;
    let dft_length = const_scalar(cx, 1, "dft_length")?;
    let sample_rate = const_scalar(cx, 2, "sample_rate")?;
    let lo = cx.const_floats(3, "lower_edge_hertz")?;
    let hi = cx.const_floats(4, "upper_edge_hertz")?;
    let (lo, hi) = match (lo.as_slice(), hi.as_slice()) {
        ([a], [b]) => (*a as f32, *b as f32),
        _ => return Err(cx.invalid("edge frequencies must be scalars")),
    };
    if bins < 0 {
        return Err(cx.invalid(format!("num_mel_bins must be non-negative, got {bins}")));
    }
    let dt = cx.attr_dtype("output_datatype")?.unwrap_or(DType::F32);
    let v = mel_matrix(bins as usize, dft_length, sample_rate, lo, hi).map_err(|e| cx.invalid(e))?;
    let spec = (dft_length / 2 + 1) as usize;
    let t = Tensor::from_f64s(dt, vec![spec, bins as usize], &v).map_err(|e| cx.invalid(e.to_string()))?;
    Ok(vec![cx.constant(t)])
}

fn map_linear_attention(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let q = cx.req_input(0)?;
    let k = cx.req_input(1)?;
    let v = cx.req_input(2)?;
    let past = cx.input(3);
    let decay = cx.input(4);
    let beta = cx.input(5);
    let rule = match cx.attr_s("update_rule")?.as_deref().unwrap_or("gated_delta") {
        "linear" => LinearAttentionRule::Linear,
        "gated" => LinearAttentionRule::Gated,
        "delta" => LinearAttentionRule::Delta,
        "gated_delta" => LinearAttentionRule::GatedDelta,
        r => return Err(cx.invalid(format!("unknown update_rule '{r}'"))),
    };
    if rule.gating() != decay.is_some() {
        return Err(cx.invalid(format!(
            "update_rule {rule:?} {} the decay input",
            if rule.gating() { "requires" } else { "forbids" }
        )));
    }
    if rule.delta() != beta.is_some() {
        return Err(cx.invalid(format!(
            "update_rule {rule:?} {} the beta input",
            if rule.delta() { "requires" } else { "forbids" }
        )));
    }
    let qh = cx.attr_i("q_num_heads", 0)?;
    let kvh = cx.attr_i("kv_num_heads", 0)?;
    if qh <= 0 || kvh <= 0 {
        return Err(cx.invalid("q_num_heads and kv_num_heads must be positive"));
    }
    let op = NnOp::LinearAttention {
        q_num_heads: qh as usize,
        kv_num_heads: kvh as usize,
        scale: cx.attr_f("scale", 0.0)?,
        rule,
        has_past: past.is_some(),
    };
    let mut ins = vec![q, k, v];
    ins.extend(past);
    ins.extend(decay);
    ins.extend(beta);
    cx.emit(Op::Nn(op), &ins)
}

fn map_causal_conv(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let w = cx.req_input(1)?;
    let bias = cx.input(2);
    let past = cx.input(3);
    let silu = match cx.attr_s("activation")?.as_deref().unwrap_or("none") {
        "none" => false,
        "silu" | "swish" => true,
        a => return Err(cx.invalid(format!("unknown activation '{a}'"))),
    };
    let op = NnOp::CausalConvWithState {
        silu,
        has_bias: bias.is_some(),
        has_past: past.is_some(),
    };
    let mut ins = vec![x, w];
    ins.extend(bias);
    ins.extend(past);
    cx.emit(Op::Nn(op), &ins)
}
