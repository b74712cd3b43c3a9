//! Higher-level neural-network ops: attention, rotary embeddings, recurrent cells,
//! sampling and signal processing.
//!
//! Optional ONNX inputs are recorded as `has_*` flags; the op's inputs are the present
//! ones in ONNX order (documented on each variant). Window functions and
//! MelWeightMatrix have no op: their outputs depend only on compile-time constants, so
//! the importer folds them into constants.

use super::{expect_arity, fmt_dims, InferCtx, OpInfo};
use crate::{DType, Dim, SymExpr, SymbolTable, TensorType};

/// An activation function of a recurrent cell (ONNX RNN/GRU/LSTM `activations`).
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum RnnAct {
    Relu,
    Tanh,
    Sigmoid,
    /// `alpha * x + beta`.
    Affine {
        alpha: f32,
        beta: f32,
    },
    LeakyRelu {
        alpha: f32,
    },
    ThresholdedRelu {
        alpha: f32,
    },
    /// `alpha * tanh(beta * x)`.
    ScaledTanh {
        alpha: f32,
        beta: f32,
    },
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    Elu {
        alpha: f32,
    },
    Softsign,
    Softplus,
}

impl RnnAct {
    pub fn apply(self, x: f64) -> f64 {
        match self {
            RnnAct::Relu => x.max(0.0),
            RnnAct::Tanh => x.tanh(),
            RnnAct::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            RnnAct::Affine { alpha, beta } => alpha as f64 * x + beta as f64,
            RnnAct::LeakyRelu { alpha } => {
                if x >= 0.0 {
                    x
                } else {
                    alpha as f64 * x
                }
            }
            RnnAct::ThresholdedRelu { alpha } => {
                if x > alpha as f64 {
                    x
                } else {
                    0.0
                }
            }
            RnnAct::ScaledTanh { alpha, beta } => alpha as f64 * (beta as f64 * x).tanh(),
            RnnAct::HardSigmoid { alpha, beta } => (alpha as f64 * x + beta as f64).clamp(0.0, 1.0),
            RnnAct::Elu { alpha } => {
                if x >= 0.0 {
                    x
                } else {
                    alpha as f64 * (x.exp() - 1.0)
                }
            }
            RnnAct::Softsign => x / (1.0 + x.abs()),
            RnnAct::Softplus => {
                if x > 30.0 {
                    x
                } else {
                    x.exp().ln_1p()
                }
            }
        }
    }
}

/// The cell of a recurrent layer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RnnCell {
    /// Elman RNN: one gate, one activation per direction.
    Rnn,
    /// Gates z, r, h; two activations per direction.
    Gru { linear_before_reset: bool },
    /// Gates i, o, f, c; three activations per direction.
    Lstm { input_forget: bool },
}

impl RnnCell {
    /// Gates stacked in W/R.
    pub fn gates(self) -> usize {
        match self {
            RnnCell::Rnn => 1,
            RnnCell::Gru { .. } => 3,
            RnnCell::Lstm { .. } => 4,
        }
    }
    /// Activation functions per direction.
    pub fn n_acts(self) -> usize {
        match self {
            RnnCell::Rnn => 1,
            RnnCell::Gru { .. } => 2,
            RnnCell::Lstm { .. } => 3,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RnnDirection {
    Forward,
    Reverse,
    Bidirectional,
}

impl RnnDirection {
    pub fn count(self) -> usize {
        if self == RnnDirection::Bidirectional {
            2
        } else {
            1
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum GridSampleMode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum GridPadding {
    Zeros,
    Border,
    Reflection,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LinearAttentionRule {
    Linear,
    Gated,
    Delta,
    GatedDelta,
}

impl LinearAttentionRule {
    pub fn gating(self) -> bool {
        matches!(self, LinearAttentionRule::Gated | LinearAttentionRule::GatedDelta)
    }
    pub fn delta(self) -> bool {
        matches!(self, LinearAttentionRule::Delta | LinearAttentionRule::GatedDelta)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum NnOp {
    /// Scaled dot-product attention (ONNX Attention 23/24/25).
    /// Inputs: q, k, v, then `attn_mask` if `has_mask`, `past_key, past_value` if
    /// `has_past`, `nonpad_kv_seqlen` (i64 `[batch]`) if `has_nonpad`.
    /// Outputs: y, present_key, present_value, qk_matmul_output (always all four).
    /// `q_num_heads`/`kv_num_heads` are used for 3-D inputs only (0 for 4-D).
    Attention {
        q_num_heads: usize,
        kv_num_heads: usize,
        /// `None`: `1/sqrt(head_size)`.
        scale: Option<f32>,
        is_causal: bool,
        /// 0 disables softcapping.
        softcap: f32,
        /// 0: raw QK (after softcap), 1: after softcap, 2: after mask/bias, 3: after softmax.
        qk_matmul_output_mode: u8,
        /// Precision of the softmax (`None`: the input type).
        softmax_precision: Option<DType>,
        /// Sliding window sizes; -1 is unbounded.
        left_window: i64,
        right_window: i64,
        has_mask: bool,
        has_past: bool,
        has_nonpad: bool,
        /// Not part of ONNX Attention: a row whose softmax is not a number (a NaN or `+inf`
        /// logit, from non-finite inputs or an overflowing product) gets zero probabilities
        /// instead of NaN, as `where(isnan(p), 0, p)` after the softmax gives (the guard of
        /// PyTorch's exported SDPA; a fully masked row gives zeros either way).
        zero_nan_rows: bool,
    },
    /// Rotary position embedding. Inputs: x (`[B, H, S, D]` or `[B, S, H*D]`), cos_cache,
    /// sin_cache, then position_ids if `has_position_ids`.
    RotaryEmbedding {
        interleaved: bool,
        rotary_dim: usize,
        num_heads: usize,
        has_position_ids: bool,
    },
    /// `swish(a, alpha) * b`. Inputs: a, b (same shape).
    SwiGlu { alpha: f32 },
    /// RNN/GRU/LSTM layer. Inputs: x, w, r, b (materialized), then sequence_lens
    /// if `has_seq_lens`, initial_h if `has_initial_h`, and for LSTM initial_c if
    /// `has_initial_c` and p (materialized). Outputs: y, y_h (and y_c for LSTM).
    /// `acts` holds `cell.n_acts()` activations per direction.
    Rnn {
        cell: RnnCell,
        direction: RnnDirection,
        hidden_size: usize,
        /// Batch-major layout (`layout = 1`).
        batch_first: bool,
        acts: Vec<RnnAct>,
        clip: Option<f32>,
        has_seq_lens: bool,
        has_initial_h: bool,
        has_initial_c: bool,
    },
    /// Inputs: x `[N, C, d...]`, grid `[N, o..., nd]`.
    GridSample {
        mode: GridSampleMode,
        padding: GridPadding,
        align_corners: bool,
    },
    /// Input: theta `[N, 2, 3]` or `[N, 3, 4]`; `size` is the output image size (N, C, spatial...).
    AffineGrid { align_corners: bool, size: Vec<Dim> },
    /// Discrete Fourier transform along `axis` of x `[..., 1|2]` (real or complex last dim).
    Dft {
        axis: usize,
        inverse: bool,
        onesided: bool,
        length: usize,
    },
    /// Short-time Fourier transform. Inputs: signal `[B, L, 1|2]`, then window if `has_window`.
    Stft {
        frame_step: usize,
        frame_length: usize,
        onesided: bool,
        has_window: bool,
    },
    /// Linear attention recurrence. Inputs: query, key, value, then past_state if
    /// `has_past`, decay if the rule gates, beta if the rule has delta correction.
    /// Outputs: output, present_state.
    LinearAttention {
        q_num_heads: usize,
        kv_num_heads: usize,
        /// 0: `1/sqrt(d_k)`.
        scale: f32,
        rule: LinearAttentionRule,
        has_past: bool,
    },
    /// Depthwise causal conv1d with carried state. Inputs: input `[B, C, L]`, weight
    /// `[C, 1, K]`, then bias if `has_bias`, past_state `[B, C, K-1]` if `has_past`.
    /// Outputs: output, present_state.
    CausalConvWithState { silu: bool, has_bias: bool, has_past: bool },
    /// Attention of new tokens over a paged KV cache, appending their keys and values to it
    /// (not in ONNX: decode steps of `tilec generate`; see `paged.rs` for the layout).
    PagedAttention { scale: f32 },
}

fn expect_float(t: &TensorType, what: &str) -> Result<(), String> {
    if !t.dtype.is_float() {
        return Err(format!("{what} must be a float type, got {}", t.dtype));
    }
    Ok(())
}

fn same_dtype(a: &TensorType, b: &TensorType, what: &str) -> Result<(), String> {
    if a.dtype != b.dtype {
        return Err(format!("{what}: dtypes differ ({} vs {})", a.dtype, b.dtype));
    }
    Ok(())
}

fn expect_rank(t: &TensorType, r: usize, what: &str, syms: &SymbolTable) -> Result<(), String> {
    if t.rank() != r {
        return Err(format!("{what} must have rank {r}, got {}", fmt_dims(&t.shape, syms)));
    }
    Ok(())
}

/// `a / n` where `a` must be divisible by `n` when known.
fn div_dim(a: Dim, n: usize, what: &str, syms: &mut SymbolTable) -> Result<Dim, String> {
    if n == 0 {
        return Err(format!("{what}: number of heads must be positive"));
    }
    if let Dim::Fixed(x) = a {
        if x % n != 0 {
            return Err(format!("{what}: size {x} is not divisible by {n} heads"));
        }
    }
    Ok(syms.derive(SymExpr::Div(a, Dim::Fixed(n))))
}

impl OpInfo for NnOp {
    fn name(&self) -> &'static str {
        match self {
            NnOp::Attention { .. } => "attention",
            NnOp::RotaryEmbedding { .. } => "rotary_embedding",
            NnOp::SwiGlu { .. } => "swiglu",
            NnOp::Rnn { cell, .. } => match cell {
                RnnCell::Rnn => "rnn",
                RnnCell::Gru { .. } => "gru",
                RnnCell::Lstm { .. } => "lstm",
            },
            NnOp::GridSample { .. } => "grid_sample",
            NnOp::AffineGrid { .. } => "affine_grid",
            NnOp::Dft { .. } => "dft",
            NnOp::Stft { .. } => "stft",
            NnOp::LinearAttention { .. } => "linear_attention",
            NnOp::CausalConvWithState { .. } => "causal_conv_with_state",
            NnOp::PagedAttention { .. } => "paged_attention",
        }
    }

    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            NnOp::Attention {
                q_num_heads,
                kv_num_heads,
                has_mask,
                has_past,
                has_nonpad,
                ..
            } => {
                let n = 3 + *has_mask as usize + 2 * *has_past as usize + *has_nonpad as usize;
                expect_arity(inputs, n)?;
                let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
                expect_float(q, "Q")?;
                same_dtype(q, k, "Q and K")?;
                same_dtype(q, v, "Q and V")?;
                let r = q.rank();
                if r != 3 && r != 4 {
                    return Err(format!("Q must have rank 3 or 4, got {}", fmt_dims(&q.shape, cx.syms)));
                }
                expect_rank(k, r, "K", cx.syms)?;
                expect_rank(v, r, "V", cx.syms)?;
                let mut idx = 3;
                if *has_mask {
                    let m = inputs[idx];
                    if m.dtype != DType::Bool && m.dtype != q.dtype {
                        return Err(format!("attn_mask must be bool or {}, got {}", q.dtype, m.dtype));
                    }
                    if m.rank() == 0 || m.rank() > 4 {
                        return Err(format!("attn_mask must have rank 1 to 4, got {}", m.rank()));
                    }
                    idx += 1;
                }
                let (batch, hq, sq, dk, hkv, skv, dv);
                if r == 4 {
                    batch = q.shape[0];
                    hq = q.shape[1];
                    sq = q.shape[2];
                    dk = k.shape[3];
                    hkv = k.shape[1];
                    skv = k.shape[2];
                    dv = v.shape[3];
                } else {
                    batch = q.shape[0];
                    sq = q.shape[1];
                    hq = Dim::Fixed(*q_num_heads);
                    hkv = Dim::Fixed(*kv_num_heads);
                    div_dim(q.shape[2], *q_num_heads, "Q hidden size", cx.syms)?;
                    dk = div_dim(k.shape[2], *kv_num_heads, "K hidden size", cx.syms)?;
                    dv = div_dim(v.shape[2], *kv_num_heads, "V hidden size", cx.syms)?;
                    skv = k.shape[1];
                }
                if let (Dim::Fixed(a), Dim::Fixed(b)) = (hq, hkv) {
                    if b == 0 || a % b != 0 {
                        return Err(format!("q heads ({a}) must be a multiple of kv heads ({b})"));
                    }
                }
                let total = if *has_past {
                    let (pk, pv) = (inputs[idx], inputs[idx + 1]);
                    same_dtype(q, pk, "Q and past_key")?;
                    same_dtype(q, pv, "Q and past_value")?;
                    expect_rank(pk, 4, "past_key", cx.syms)?;
                    expect_rank(pv, 4, "past_value", cx.syms)?;
                    idx += 2;
                    cx.syms.derive(SymExpr::Add(pk.shape[2], skv))
                } else {
                    skv
                };
                if *has_nonpad {
                    let np = inputs[idx];
                    if np.dtype != DType::I64 || np.rank() != 1 {
                        return Err(format!("nonpad_kv_seqlen must be a 1-D int64, got {}", np.dtype));
                    }
                }
                let y = if r == 4 {
                    vec![batch, hq, sq, dv]
                } else {
                    vec![batch, sq, cx.syms.derive(SymExpr::Mul(hq, dv))]
                };
                let dt = q.dtype;
                Ok(vec![
                    TensorType::new(dt, y),
                    TensorType::new(dt, vec![batch, hkv, total, dk]),
                    TensorType::new(dt, vec![batch, hkv, total, dv]),
                    TensorType::new(dt, vec![batch, hq, sq, total]),
                ])
            }
            NnOp::RotaryEmbedding {
                num_heads,
                has_position_ids,
                rotary_dim,
                ..
            } => {
                expect_arity(inputs, 3 + *has_position_ids as usize)?;
                let x = inputs[0];
                expect_float(x, "input")?;
                same_dtype(x, inputs[1], "input and cos_cache")?;
                same_dtype(x, inputs[2], "input and sin_cache")?;
                match x.rank() {
                    4 => {}
                    3 => {
                        div_dim(x.shape[2], *num_heads, "hidden size", cx.syms)?;
                    }
                    _ => {
                        return Err(format!(
                            "input must have rank 3 or 4, got {}",
                            fmt_dims(&x.shape, cx.syms)
                        ))
                    }
                }
                if rotary_dim % 2 != 0 {
                    return Err(format!("rotary_embedding_dim must be even, got {rotary_dim}"));
                }
                if *has_position_ids {
                    let p = inputs[3];
                    if !p.dtype.is_int() || p.rank() != 2 {
                        return Err(format!(
                            "position_ids must be a 2-D integer tensor, got {} rank {}",
                            p.dtype,
                            p.rank()
                        ));
                    }
                    expect_rank(inputs[1], 2, "cos_cache", cx.syms)?;
                } else {
                    expect_rank(inputs[1], 3, "cos_cache (without position_ids)", cx.syms)?;
                }
                Ok(vec![x.clone()])
            }
            NnOp::SwiGlu { .. } => {
                expect_arity(inputs, 2)?;
                expect_float(inputs[0], "A")?;
                same_dtype(inputs[0], inputs[1], "A and B")?;
                if inputs[0].shape != inputs[1].shape {
                    return Err(format!(
                        "A and B must have the same shape, got {} and {}",
                        fmt_dims(&inputs[0].shape, cx.syms),
                        fmt_dims(&inputs[1].shape, cx.syms)
                    ));
                }
                Ok(vec![inputs[0].clone()])
            }
            NnOp::Rnn {
                cell,
                direction,
                hidden_size,
                batch_first,
                acts,
                has_seq_lens,
                has_initial_h,
                has_initial_c,
                ..
            } => {
                let is_lstm = matches!(cell, RnnCell::Lstm { .. });
                let n = 4
                    + *has_seq_lens as usize
                    + *has_initial_h as usize
                    + if is_lstm { 1 + *has_initial_c as usize } else { 0 };
                expect_arity(inputs, n)?;
                let (x, w, r, b) = (inputs[0], inputs[1], inputs[2], inputs[3]);
                expect_float(x, "X")?;
                for (t, nm) in [(w, "W"), (r, "R"), (b, "B")] {
                    same_dtype(x, t, &format!("X and {nm}"))?;
                }
                expect_rank(x, 3, "X", cx.syms)?;
                expect_rank(w, 3, "W", cx.syms)?;
                expect_rank(r, 3, "R", cx.syms)?;
                let d = direction.count();
                let h = *hidden_size;
                let g = cell.gates();
                if acts.len() != d * cell.n_acts() {
                    return Err(format!(
                        "expected {} activations, got {}",
                        d * cell.n_acts(),
                        acts.len()
                    ));
                }
                let want_w = [Dim::Fixed(d), Dim::Fixed(g * h)];
                if w.shape[..2] != want_w || r.shape != [Dim::Fixed(d), Dim::Fixed(g * h), Dim::Fixed(h)] {
                    return Err(format!(
                        "W {} / R {} do not match {d} direction(s), {g} gate(s), hidden size {h}",
                        fmt_dims(&w.shape, cx.syms),
                        fmt_dims(&r.shape, cx.syms)
                    ));
                }
                if b.shape != [Dim::Fixed(d), Dim::Fixed(2 * g * h)] {
                    return Err(format!(
                        "B must be [{d}, {}], got {}",
                        2 * g * h,
                        fmt_dims(&b.shape, cx.syms)
                    ));
                }
                if x.shape[2] != w.shape[2] {
                    return Err(format!(
                        "X input size {} does not match W {}",
                        fmt_dims(&x.shape, cx.syms),
                        fmt_dims(&w.shape, cx.syms)
                    ));
                }
                let (seq, batch) = if *batch_first {
                    (x.shape[1], x.shape[0])
                } else {
                    (x.shape[0], x.shape[1])
                };
                let mut idx = 4;
                if *has_seq_lens {
                    let s = inputs[idx];
                    if !s.dtype.is_int() || s.rank() != 1 {
                        return Err(format!("sequence_lens must be a 1-D integer tensor, got {}", s.dtype));
                    }
                    idx += 1;
                }
                let state_shape = if *batch_first {
                    vec![batch, Dim::Fixed(d), Dim::Fixed(h)]
                } else {
                    vec![Dim::Fixed(d), batch, Dim::Fixed(h)]
                };
                let n_states = *has_initial_h as usize + (is_lstm && *has_initial_c) as usize;
                for k in 0..n_states {
                    let s = inputs[idx + k];
                    if s.rank() != 3 || s.shape[2] != Dim::Fixed(h) {
                        return Err(format!(
                            "initial state must be {}, got {}",
                            fmt_dims(&state_shape, cx.syms),
                            fmt_dims(&s.shape, cx.syms)
                        ));
                    }
                    same_dtype(x, s, "X and state")?;
                }
                if is_lstm {
                    let p = inputs[n - 1];
                    if p.shape != [Dim::Fixed(d), Dim::Fixed(3 * h)] {
                        return Err(format!(
                            "P must be [{d}, {}], got {}",
                            3 * h,
                            fmt_dims(&p.shape, cx.syms)
                        ));
                    }
                }
                let y = if *batch_first {
                    vec![batch, seq, Dim::Fixed(d), Dim::Fixed(h)]
                } else {
                    vec![seq, Dim::Fixed(d), batch, Dim::Fixed(h)]
                };
                let mut out = vec![
                    TensorType::new(x.dtype, y),
                    TensorType::new(x.dtype, state_shape.clone()),
                ];
                if is_lstm {
                    out.push(TensorType::new(x.dtype, state_shape));
                }
                Ok(out)
            }
            NnOp::GridSample { mode, .. } => {
                expect_arity(inputs, 2)?;
                let (x, g) = (inputs[0], inputs[1]);
                if x.dtype == DType::Bool {
                    return Err("X must be numeric".into());
                }
                expect_float(g, "grid")?;
                let nd = x.rank().saturating_sub(2);
                if x.rank() < 3 || g.rank() != x.rank() || g.shape[nd + 1] != Dim::Fixed(nd) {
                    return Err(format!(
                        "X {} and grid {} must be [N, C, d1..dn] and [N, o1..on, {nd}]",
                        fmt_dims(&x.shape, cx.syms),
                        fmt_dims(&g.shape, cx.syms)
                    ));
                }
                if *mode == GridSampleMode::Cubic && nd != 2 {
                    return Err("cubic mode supports 4-D input only".into());
                }
                let mut y = vec![x.shape[0], x.shape[1]];
                y.extend_from_slice(&g.shape[1..=nd]);
                Ok(vec![TensorType::new(x.dtype, y)])
            }
            NnOp::AffineGrid { size, .. } => {
                expect_arity(inputs, 1)?;
                let t = inputs[0];
                expect_float(t, "theta")?;
                let nd = size.len().saturating_sub(2);
                if !(nd == 2 || nd == 3) {
                    return Err(format!("size must have 4 or 5 elements, got {}", size.len()));
                }
                if t.rank() != 3 || t.shape[1] != Dim::Fixed(nd) || t.shape[2] != Dim::Fixed(nd + 1) {
                    return Err(format!(
                        "theta must be [N, {nd}, {}], got {}",
                        nd + 1,
                        fmt_dims(&t.shape, cx.syms)
                    ));
                }
                let mut y = vec![t.shape[0]];
                y.extend_from_slice(&size[2..]);
                y.push(Dim::Fixed(nd));
                Ok(vec![TensorType::new(t.dtype, y)])
            }
            NnOp::Dft {
                axis,
                inverse,
                onesided,
                length,
            } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                expect_float(x, "input")?;
                let r = x.rank();
                if r < 2 || *axis >= r - 1 {
                    return Err(format!("axis {axis} must be below the last (complex) axis of rank {r}"));
                }
                let c = x.shape[r - 1];
                if c != Dim::Fixed(1) && c != Dim::Fixed(2) {
                    return Err(format!(
                        "last dimension must be 1 (real) or 2 (complex), got {}",
                        cx.syms.display(c)
                    ));
                }
                if *length == 0 {
                    return Err("dft_length must be positive".into());
                }
                let mut y = x.shape.clone();
                let (n, last) = match (*inverse, *onesided) {
                    (true, true) => (*length, 1),
                    (false, true) => (*length / 2 + 1, 2),
                    _ => (*length, 2),
                };
                y[*axis] = Dim::Fixed(n);
                y[r - 1] = Dim::Fixed(last);
                Ok(vec![TensorType::new(x.dtype, y)])
            }
            NnOp::Stft {
                frame_step,
                frame_length,
                onesided,
                has_window,
            } => {
                expect_arity(inputs, 1 + *has_window as usize)?;
                let x = inputs[0];
                expect_float(x, "signal")?;
                if x.rank() != 3 || !(x.shape[2] == Dim::Fixed(1) || x.shape[2] == Dim::Fixed(2)) {
                    return Err(format!(
                        "signal must be [batch, length, 1|2], got {}",
                        fmt_dims(&x.shape, cx.syms)
                    ));
                }
                if *frame_step == 0 || *frame_length == 0 {
                    return Err("frame_step and frame_length must be positive".into());
                }
                if *has_window {
                    let w = inputs[1];
                    same_dtype(x, w, "signal and window")?;
                    if w.shape != [Dim::Fixed(*frame_length)] {
                        return Err(format!(
                            "window must be [{frame_length}], got {}",
                            fmt_dims(&w.shape, cx.syms)
                        ));
                    }
                }
                let len = x.shape[1]
                    .fixed()
                    .ok_or_else(|| "signal length must be static".to_string())?;
                if len < *frame_length {
                    return Err(format!(
                        "signal length {len} is shorter than frame_length {frame_length}"
                    ));
                }
                let frames = 1 + (len - frame_length) / frame_step;
                let bins = if *onesided { frame_length / 2 + 1 } else { *frame_length };
                Ok(vec![TensorType::new(
                    x.dtype,
                    vec![x.shape[0], Dim::Fixed(frames), Dim::Fixed(bins), Dim::Fixed(2)],
                )])
            }
            NnOp::LinearAttention {
                q_num_heads,
                kv_num_heads,
                rule,
                has_past,
                ..
            } => {
                let n = 3 + *has_past as usize + rule.gating() as usize + rule.delta() as usize;
                expect_arity(inputs, n)?;
                let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
                expect_float(q, "query")?;
                same_dtype(q, k, "query and key")?;
                same_dtype(q, v, "query and value")?;
                for (t, nm) in [(q, "query"), (k, "key"), (v, "value")] {
                    expect_rank(t, 3, nm, cx.syms)?;
                }
                if *kv_num_heads == 0 || q_num_heads % kv_num_heads != 0 {
                    return Err(format!(
                        "q_num_heads ({q_num_heads}) must be a multiple of kv_num_heads ({kv_num_heads})"
                    ));
                }
                let dk = div_dim(q.shape[2], *q_num_heads, "query hidden size", cx.syms)?;
                let dv = div_dim(v.shape[2], *kv_num_heads, "value hidden size", cx.syms)?;
                let (b, t) = (q.shape[0], q.shape[1]);
                let state = vec![b, Dim::Fixed(*kv_num_heads), dk, dv];
                let mut sdt = q.dtype;
                let mut idx = 3;
                if *has_past {
                    let p = inputs[idx];
                    expect_float(p, "past_state")?;
                    expect_rank(p, 4, "past_state", cx.syms)?;
                    sdt = p.dtype;
                    idx += 1;
                }
                for t in &inputs[idx..n] {
                    expect_float(t, "decay/beta")?;
                    expect_rank(t, 3, "decay/beta", cx.syms)?;
                }
                let out = vec![b, t, cx.syms.derive(SymExpr::Mul(Dim::Fixed(*q_num_heads), dv))];
                Ok(vec![TensorType::new(q.dtype, out), TensorType::new(sdt, state)])
            }
            NnOp::CausalConvWithState { has_bias, has_past, .. } => {
                expect_arity(inputs, 2 + *has_bias as usize + *has_past as usize)?;
                let (x, w) = (inputs[0], inputs[1]);
                expect_float(x, "input")?;
                same_dtype(x, w, "input and weight")?;
                expect_rank(x, 3, "input", cx.syms)?;
                expect_rank(w, 3, "weight", cx.syms)?;
                if w.shape[1] != Dim::Fixed(1) {
                    return Err(format!("weight must be [C, 1, K], got {}", fmt_dims(&w.shape, cx.syms)));
                }
                let k = w.shape[2]
                    .fixed()
                    .ok_or_else(|| "kernel size must be static".to_string())?;
                if k == 0 {
                    return Err("kernel size must be positive".into());
                }
                let state = vec![x.shape[0], x.shape[1], Dim::Fixed(k - 1)];
                for t in &inputs[2..] {
                    same_dtype(x, t, "input and bias/state")?;
                }
                if *has_past {
                    let p = inputs[inputs.len() - 1];
                    if p.rank() != 3 || p.shape[2] != Dim::Fixed(k - 1) {
                        return Err(format!(
                            "past_state must be {}, got {}",
                            fmt_dims(&state, cx.syms),
                            fmt_dims(&p.shape, cx.syms)
                        ));
                    }
                }
                Ok(vec![x.clone(), TensorType::new(x.dtype, state)])
            }
            NnOp::PagedAttention { .. } => super::paged::infer(inputs, cx.syms),
        }
    }
}
