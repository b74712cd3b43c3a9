//! Normalizations: softmax family, layer/RMS/batch/instance/group norms, LRN, Lp and
//! mean-variance normalization, and the negative-log-likelihood loss.
//!
//! Kernels compute statistics in f64 and round once to the output dtype.

use super::{expect_arity, InferCtx, OpInfo};
use crate::{DType, Dim, SymbolTable, TensorType};

/// How a loss is reduced over its elements.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum LossReduction {
    /// Per-element losses, shaped like the target.
    None,
    Sum,
    /// Weighted mean: `sum(w * l) / sum(w)` over the elements not ignored.
    Mean,
}

#[derive(Clone, Debug, PartialEq)]
pub enum NormOp {
    /// Softmax over one axis (opset-13 semantics; older coerced-2D forms are rewritten by
    /// the importer).
    Softmax { axis: usize },
    /// `log(softmax(x))` over one axis, computed stably.
    LogSoftmax { axis: usize },
    /// One-hot of the first maximum along `axis`, in the input's dtype.
    Hardmax { axis: usize },
    /// Normalizes over the dims `axis..rank`. Inputs: x, scale, and bias when `has_bias`
    /// (scale and bias broadcast to x). Outputs: y, mean and inverse standard deviation
    /// (the latter two of dtype `stash`, shaped `x.shape[..axis] + [1; rank-axis]`).
    LayerNorm {
        axis: usize,
        epsilon: f32,
        stash: DType,
        has_bias: bool,
    },
    /// `x / sqrt(mean(x^2 over axis..rank) + epsilon) * scale`. Inputs: x, scale.
    RmsNorm { axis: usize, epsilon: f32 },
    /// Inference-mode batch norm per channel. Inputs: x, scale, bias, mean, var (each
    /// `[C]`). The channel axis is 1 (`[N, C, *S]`), or the last one (`[N, *S, C]`) with
    /// `channels_last`.
    BatchNorm { epsilon: f32, channels_last: bool },
    /// Per (n, c) normalization over the spatial dims. Inputs: x, scale `[C]`, bias `[C]`.
    InstanceNorm { epsilon: f32 },
    /// Per (n, group) normalization over the group's channels and the spatial dims, then a
    /// per-channel affine. Inputs: x, scale `[C]`, bias `[C]` (opset-18 per-group scales
    /// are expanded to per-channel by the importer). The channel axis is 1 (`[N, C, *S]`), or
    /// the last one (`[N, *S, C]`) with `channels_last`.
    GroupNorm { num_groups: usize, epsilon: f32, channels_last: bool },
    /// Local response normalization across channels:
    /// `x / (bias + alpha / size * sum(x^2 over the window)) ^ beta`. The channel axis is 1
    /// (`[N, C, *S]`), or the last one (`[N, *S, C]`) with `channels_last`.
    Lrn {
        size: usize,
        alpha: f32,
        beta: f32,
        bias: f32,
        channels_last: bool,
    },
    /// `x / ||x||_p` along `axis` (`p` is 1 or 2); zero norms give 0.
    LpNorm { axis: usize, p: u32 },
    /// `(x - mean) / (sqrt(var) + 1e-9)` with statistics over `axes` (sorted, unique).
    MeanVarianceNorm { axes: Vec<usize> },
    /// Negative log-likelihood loss. Inputs: log-probabilities `[N, C, d...]`, integer
    /// targets `[N, d...]`, and class weights `[C]` when `has_weight`. Targets equal to
    /// `ignore_index` contribute nothing; other targets must be in `0..C`.
    NllLoss {
        reduction: LossReduction,
        ignore_index: Option<i64>,
        has_weight: bool,
    },
}

/// Whether `small` broadcasts to `big` one way (numpy, aligned at the end).
fn check_unidirectional(
    what: &str,
    small: &[Dim],
    big: &[Dim],
    syms: &SymbolTable,
) -> Result<(), String> {
    let bad = || {
        format!(
            "{what} of shape {} does not broadcast to {}",
            super::fmt_dims(small, syms),
            super::fmt_dims(big, syms)
        )
    };
    if small.len() > big.len() {
        return Err(bad());
    }
    let off = big.len() - small.len();
    for (i, &d) in small.iter().enumerate() {
        if let (Dim::Fixed(a), Dim::Fixed(b)) = (d, big[off + i]) {
            if a != 1 && a != b {
                return Err(bad());
            }
        }
    }
    Ok(())
}

fn expect_float(t: &TensorType, what: &str) -> Result<(), String> {
    if !t.dtype.is_float() {
        return Err(format!("{what} must be a float tensor, got {}", t.dtype));
    }
    Ok(())
}

/// Checks a per-channel parameter: 1-D `[C]` with the dtype of x.
fn expect_channel_param(
    p: &TensorType,
    what: &str,
    x: &TensorType,
    channel_axis: usize,
    syms: &SymbolTable,
) -> Result<(), String> {
    if p.rank() != 1 {
        return Err(format!("{what} must be 1-D [C], got rank {}", p.rank()));
    }
    if let (Dim::Fixed(a), Dim::Fixed(b)) = (p.shape[0], x.shape[channel_axis]) {
        if a != b {
            return Err(format!(
                "{what} has {a} elements, x has {b} channels (shape {})",
                super::fmt_dims(&x.shape, syms)
            ));
        }
    }
    if p.dtype != x.dtype {
        return Err(format!(
            "{what} dtype {} differs from x dtype {}",
            p.dtype, x.dtype
        ));
    }
    Ok(())
}

impl NormOp {
    /// Whether this is a batch norm, group norm or LRN with the channel axis last.
    pub fn is_channels_last(&self) -> bool {
        matches!(
            self,
            NormOp::BatchNorm { channels_last: true, .. }
                | NormOp::GroupNorm { channels_last: true, .. }
                | NormOp::Lrn { channels_last: true, .. }
        )
    }

    /// The same batch norm, group norm or LRN with `channels_last` set to `cl`; `None` for every other
    /// op (they have no channels-last form).
    pub fn with_channels_last(&self, cl: bool) -> Option<NormOp> {
        let mut op = self.clone();
        match &mut op {
            NormOp::BatchNorm { channels_last, .. }
            | NormOp::GroupNorm { channels_last, .. }
            | NormOp::Lrn { channels_last, .. } => {
                *channels_last = cl;
                Some(op)
            }
            _ => None,
        }
    }
}

impl OpInfo for NormOp {
    fn name(&self) -> &'static str {
        match self {
            NormOp::Softmax { .. } => "softmax",
            NormOp::LogSoftmax { .. } => "log_softmax",
            NormOp::Hardmax { .. } => "hardmax",
            NormOp::LayerNorm { .. } => "layer_norm",
            NormOp::RmsNorm { .. } => "rms_norm",
            NormOp::BatchNorm { .. } => "batch_norm",
            NormOp::InstanceNorm { .. } => "instance_norm",
            NormOp::GroupNorm { .. } => "group_norm",
            NormOp::Lrn { .. } => "lrn",
            NormOp::LpNorm { .. } => "lp_norm",
            NormOp::MeanVarianceNorm { .. } => "mean_variance_norm",
            NormOp::NllLoss { .. } => "nll_loss",
        }
    }

    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        let syms = &*cx.syms;
        let axis_ok = |axis: usize, x: &TensorType| {
            if axis >= x.rank() {
                Err(format!("axis {axis} out of range for rank {}", x.rank()))
            } else {
                Ok(())
            }
        };
        match self {
            NormOp::Softmax { axis } | NormOp::LogSoftmax { axis } | NormOp::Hardmax { axis } => {
                expect_arity(inputs, 1)?;
                axis_ok(*axis, inputs[0])?;
                if !matches!(self, NormOp::Hardmax { .. }) {
                    expect_float(inputs[0], "x")?;
                } else if inputs[0].dtype == DType::Bool {
                    return Err("hardmax expects a numeric type, got bool".into());
                }
                Ok(vec![inputs[0].clone()])
            }
            NormOp::LayerNorm {
                axis,
                stash,
                has_bias,
                ..
            } => {
                expect_arity(inputs, if *has_bias { 3 } else { 2 })?;
                let x = inputs[0];
                expect_float(x, "x")?;
                axis_ok(*axis, x)?;
                if !stash.is_float() {
                    return Err(format!("stash type must be a float type, got {stash}"));
                }
                for (p, what) in inputs[1..].iter().zip(["scale", "bias"]) {
                    check_unidirectional(what, &p.shape, &x.shape, syms)?;
                    if p.dtype != x.dtype {
                        return Err(format!(
                            "{what} dtype {} differs from x dtype {}",
                            p.dtype, x.dtype
                        ));
                    }
                }
                let mut stat = x.shape[..*axis].to_vec();
                stat.resize(x.rank(), Dim::Fixed(1));
                Ok(vec![
                    x.clone(),
                    TensorType::new(*stash, stat.clone()),
                    TensorType::new(*stash, stat),
                ])
            }
            NormOp::RmsNorm { axis, .. } => {
                expect_arity(inputs, 2)?;
                let x = inputs[0];
                expect_float(x, "x")?;
                axis_ok(*axis, x)?;
                check_unidirectional("scale", &inputs[1].shape, &x.shape, syms)?;
                if inputs[1].dtype != x.dtype {
                    return Err(format!(
                        "scale dtype {} differs from x dtype {}",
                        inputs[1].dtype, x.dtype
                    ));
                }
                Ok(vec![x.clone()])
            }
            NormOp::BatchNorm { .. } | NormOp::InstanceNorm { .. } | NormOp::GroupNorm { .. } => {
                let names: &[&str] = if let NormOp::BatchNorm { .. } = self {
                    &["scale", "bias", "mean", "var"]
                } else {
                    &["scale", "bias"]
                };
                expect_arity(inputs, 1 + names.len())?;
                let x = inputs[0];
                expect_float(x, "x")?;
                if x.rank() < 2 {
                    return Err(format!(
                        "x must have rank >= 2 ([N, C, ...]), got rank {}",
                        x.rank()
                    ));
                }
                let channel_axis = if self.is_channels_last() { x.rank() - 1 } else { 1 };
                for (p, what) in inputs[1..].iter().zip(names) {
                    expect_channel_param(p, what, x, channel_axis, syms)?;
                }
                if let NormOp::GroupNorm { num_groups, .. } = self {
                    if *num_groups == 0 {
                        return Err("num_groups must be positive".into());
                    }
                    if let Dim::Fixed(c) = x.shape[channel_axis] {
                        if c % num_groups != 0 {
                            return Err(format!(
                                "{c} channels do not divide into {num_groups} groups"
                            ));
                        }
                    }
                }
                Ok(vec![x.clone()])
            }
            NormOp::Lrn { size, .. } => {
                expect_arity(inputs, 1)?;
                expect_float(inputs[0], "x")?;
                if inputs[0].rank() < 2 {
                    return Err(format!("x must have rank >= 2, got {}", inputs[0].rank()));
                }
                if *size == 0 {
                    return Err("size must be positive".into());
                }
                Ok(vec![inputs[0].clone()])
            }
            NormOp::LpNorm { axis, p } => {
                expect_arity(inputs, 1)?;
                expect_float(inputs[0], "x")?;
                axis_ok(*axis, inputs[0])?;
                if *p != 1 && *p != 2 {
                    return Err(format!("p must be 1 or 2, got {p}"));
                }
                Ok(vec![inputs[0].clone()])
            }
            NormOp::MeanVarianceNorm { axes } => {
                expect_arity(inputs, 1)?;
                expect_float(inputs[0], "x")?;
                if let Some(&a) = axes.iter().find(|&&a| a >= inputs[0].rank()) {
                    return Err(format!(
                        "axis {a} out of range for rank {}",
                        inputs[0].rank()
                    ));
                }
                if axes.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(format!("axes {axes:?} must be sorted and unique"));
                }
                Ok(vec![inputs[0].clone()])
            }
            NormOp::NllLoss {
                reduction,
                has_weight,
                ..
            } => {
                expect_arity(inputs, if *has_weight { 3 } else { 2 })?;
                let (x, t) = (inputs[0], inputs[1]);
                expect_float(x, "input")?;
                if !t.dtype.is_int() {
                    return Err(format!("target must be an integer tensor, got {}", t.dtype));
                }
                if x.rank() < 2 {
                    return Err(format!(
                        "input must have rank >= 2 ([N, C, ...]), got rank {}",
                        x.rank()
                    ));
                }
                let mut want = vec![x.shape[0]];
                want.extend_from_slice(&x.shape[2..]);
                let fixed_mismatch = t.rank() != want.len()
                    || t.shape
                        .iter()
                        .zip(&want)
                        .any(|(a, b)| matches!((a, b), (Dim::Fixed(p), Dim::Fixed(q)) if p != q));
                if fixed_mismatch {
                    return Err(format!(
                        "target shape {} does not match input shape {} without the class dim",
                        super::fmt_dims(&t.shape, syms),
                        super::fmt_dims(&x.shape, syms)
                    ));
                }
                if *has_weight {
                    let w = inputs[2];
                    expect_channel_param(w, "weight", x, 1, syms)?;
                }
                let shape = match reduction {
                    LossReduction::None => t.shape.clone(),
                    _ => vec![],
                };
                Ok(vec![TensorType::new(x.dtype, shape)])
            }
        }
    }
}
