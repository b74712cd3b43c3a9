//! Linear algebra and windowed ops: matmul, convolution, pooling, einsum.
//!
//! Window geometry (output length, resolved pads) is computed by [`window_geometry`], shared
//! by shape inference and the reference kernels so both agree by construction.

use super::{broadcast_shapes, expect_arity, fmt_dims, InferCtx, OpInfo};
use crate::{DType, Dim, SymExpr, SymbolTable, TensorType};

/// Padding of a windowed op along its spatial axes.
#[derive(Clone, Debug, PartialEq)]
pub enum Padding {
    /// `[begin_0, .., begin_{n-1}, end_0, .., end_{n-1}]` (ONNX `pads` order).
    Explicit(Vec<usize>),
    /// `auto_pad = SAME_UPPER`: output length `ceil(in / stride)`, extra padding at the end.
    SameUpper,
    /// `auto_pad = SAME_LOWER`: like `SameUpper` with the extra padding at the beginning.
    SameLower,
}

/// Spatial attributes shared by convolutions and pools. All vectors have one entry per
/// spatial axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    pub pads: Padding,
}

impl Window {
    pub fn rank(&self) -> usize {
        self.kernel.len()
    }
}

/// Output length and resolved `(pad_begin, pad_end)` of one spatial axis.
///
/// `ceil_mode` rounds the window count up, dropping a last window that would start in the
/// end padding (ONNX/PyTorch semantics).
pub fn window_geometry(
    input: usize,
    w: &Window,
    axis: usize,
    ceil_mode: bool,
) -> Result<(usize, usize, usize), String> {
    let k = w.kernel[axis];
    let s = w.strides[axis];
    let d = w.dilations[axis];
    if s == 0 || d == 0 || k == 0 {
        return Err(format!(
            "kernel, stride and dilation must be positive on spatial axis {axis}"
        ));
    }
    let eff = (k - 1) * d + 1;
    match &w.pads {
        Padding::Explicit(p) => {
            let n = w.rank();
            let (pb, pe) = (p[axis], p[n + axis]);
            let padded = input + pb + pe;
            if padded < eff {
                return Err(format!(
                    "spatial axis {axis}: padded input length {padded} is shorter than the dilated kernel {eff}"
                ));
            }
            let span = padded - eff;
            let mut out = if ceil_mode {
                span.div_ceil(s) + 1
            } else {
                span / s + 1
            };
            if ceil_mode && out > 1 && (out - 1) * s >= input + pb {
                out -= 1;
            }
            Ok((out, pb, pe))
        }
        Padding::SameUpper | Padding::SameLower => {
            let out = input.div_ceil(s);
            let need = ((out.max(1) - 1) * s + eff).saturating_sub(input);
            let small = need / 2;
            let big = need - small;
            if matches!(w.pads, Padding::SameUpper) {
                Ok((out, small, big))
            } else {
                Ok((out, big, small))
            }
        }
    }
}

/// Symbolic output length of one spatial axis (for inference on symbolic inputs).
fn window_dim(
    input: Dim,
    w: &Window,
    axis: usize,
    ceil_mode: bool,
    syms: &mut SymbolTable,
) -> Result<Dim, String> {
    if let Dim::Fixed(n) = input {
        return Ok(Dim::Fixed(window_geometry(n, w, axis, ceil_mode)?.0));
    }
    let s = Dim::Fixed(w.strides[axis]);
    match &w.pads {
        Padding::SameUpper | Padding::SameLower => Ok(syms.derive(SymExpr::CeilDiv(input, s))),
        Padding::Explicit(p) if !ceil_mode => {
            let n = w.rank();
            let eff = (w.kernel[axis] - 1) * w.dilations[axis] + 1;
            let padded = syms.derive(SymExpr::Add(input, Dim::Fixed(p[axis] + p[n + axis])));
            let span = syms.derive(SymExpr::Sub(padded, Dim::Fixed(eff)));
            let q = syms.derive(SymExpr::Div(span, s));
            Ok(syms.derive(SymExpr::Add(q, Dim::Fixed(1))))
        }
        Padding::Explicit(_) => Err("ceil_mode needs fixed spatial dimensions".into()),
    }
}

/// What a pool computes over each window.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolKind {
    /// Max; with `indices`, a second i64 output holds the flat input index of each max
    /// (row-major over `[N, C, *S]`; with `column_major` (storage_order=1) the spatial
    /// part of the index is column-major).
    Max { indices: bool, column_major: bool },
    /// Mean; `count_include_pad` divides by the window size including explicit padding.
    Avg { count_include_pad: bool },
    /// `(sum |x|^p)^(1/p)`.
    Lp { p: i64 },
}

#[derive(Clone, Debug, PartialEq)]
pub enum LinalgOp {
    /// numpy `matmul`: batched with broadcasting, 1-D operands promoted and squeezed.
    MatMul,
    /// Integer matmul; inputs `a, b, a_zero_point, b_zero_point` (zero points are scalars,
    /// per-row of `a` (`[M]`), or per-column of `b` (`[N]`); absent ones materialized as 0).
    /// Output i32.
    MatMulInteger,
    /// Quantized matmul; inputs `a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp`.
    /// Output has `y_zp`'s dtype.
    QLinearMatMul,
    /// Convolution; inputs `x [N, C, *S], w [M, C/group, *K], bias [M]`. With
    /// `channels_last`, the activations `x` and the output are `[N, *S, C]` (weights stay
    /// `[M, C/group, *K]`).
    Conv {
        window: Window,
        group: usize,
        channels_last: bool,
    },
    /// Integer convolution; inputs `x, w, x_zero_point, w_zero_point` (scalar or per output
    /// channel). Output i32.
    ConvInteger { window: Window, group: usize },
    /// Quantized convolution; inputs `x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp,
    /// bias (i32 [M])`.
    QLinearConv { window: Window, group: usize },
    /// Transposed convolution; inputs `x [N, C, *S], w [C, M/group, *K], bias [M]`.
    /// `pads` are begin..., end... and may be negative (an `output_shape` larger than the
    /// natural one); output length `stride*(in-1) + output_padding + (k-1)*dil + 1 - pb - pe`.
    ConvTranspose {
        kernel: Vec<usize>,
        strides: Vec<usize>,
        dilations: Vec<usize>,
        pads: Vec<i64>,
        output_padding: Vec<usize>,
        group: usize,
    },
    /// Windowed pooling over the spatial axes of `[N, C, *S]` (`[N, *S, C]` with
    /// `channels_last`; max-pool indices stay flat indices of the channels-first view).
    Pool {
        kind: PoolKind,
        window: Window,
        ceil_mode: bool,
        channels_last: bool,
    },
    /// Pooling over all spatial axes; output `[N, C, 1, ...]` (`[N, 1, ..., C]` with
    /// `channels_last`).
    GlobalPool { kind: PoolKind, channels_last: bool },
    /// Einstein summation. Labels are bytes; ellipsis dimensions were expanded at import
    /// into labels of their own. Repeated labels within one input take diagonals; labels
    /// absent from `output` are summed; size-1 dims broadcast.
    Einsum {
        inputs: Vec<Vec<u8>>,
        output: Vec<u8>,
    },
    /// Determinant of the trailing square matrices `[*, n, n]` → `[*]`.
    Det,
    /// Scatter `x` into zeros at `indices` (flat indices from MaxPool); inputs `x, indices`.
    /// `output_shape` is the full output shape when given, else derived from the window.
    MaxUnpool {
        window: Window,
        output_shape: Option<Vec<Dim>>,
    },
    /// Sums column blocks back into an image; input `[N, C*prod(block), L]`.
    Col2Im {
        image_shape: Vec<usize>,
        block_shape: Vec<usize>,
        dilations: Vec<usize>,
        pads: Vec<usize>,
        strides: Vec<usize>,
    },
    /// Deformable convolution; inputs `x, w, offset, bias, mask` (bias zeros and mask ones
    /// when absent).
    DeformConv {
        window: Window,
        group: usize,
        offset_group: usize,
    },
}

/// `[N, *S, C]` → `[N, C, *S]` (rank ≥ 2; shorter shapes are returned unchanged).
pub fn channels_first_dims<T: Clone>(s: &[T]) -> Vec<T> {
    if s.len() < 2 {
        return s.to_vec();
    }
    let mut v = vec![s[0].clone(), s[s.len() - 1].clone()];
    v.extend_from_slice(&s[1..s.len() - 1]);
    v
}

/// `[N, C, *S]` → `[N, *S, C]` (rank ≥ 2; shorter shapes are returned unchanged).
pub fn channels_last_dims<T: Clone>(s: &[T]) -> Vec<T> {
    if s.len() < 2 {
        return s.to_vec();
    }
    let mut v = vec![s[0].clone()];
    v.extend_from_slice(&s[2..]);
    v.push(s[1].clone());
    v
}

/// The transpose permutation taking `[N, C, *S]` of the given rank to `[N, *S, C]`.
pub fn to_channels_last_perm(rank: usize) -> Vec<usize> {
    channels_last_dims(&(0..rank).collect::<Vec<_>>())
}

/// The transpose permutation taking `[N, *S, C]` of the given rank to `[N, C, *S]`.
pub fn to_channels_first_perm(rank: usize) -> Vec<usize> {
    channels_first_dims(&(0..rank).collect::<Vec<_>>())
}

impl LinalgOp {
    /// Whether this is a conv/pool in channels-last layout.
    pub fn is_channels_last(&self) -> bool {
        matches!(
            self,
            LinalgOp::Conv {
                channels_last: true,
                ..
            } | LinalgOp::Pool {
                channels_last: true,
                ..
            } | LinalgOp::GlobalPool {
                channels_last: true,
                ..
            }
        )
    }

    /// For a channels-last conv/pool, the same op in channels-first layout; `None` for
    /// every other op.
    pub fn as_channels_first(&self) -> Option<LinalgOp> {
        if !self.is_channels_last() {
            return None;
        }
        Some(self.with_channels_last(false))
    }

    /// The same conv/pool with `channels_last` set to `cl` (other ops unchanged).
    pub fn with_channels_last(&self, cl: bool) -> LinalgOp {
        let mut op = self.clone();
        if let LinalgOp::Conv { channels_last, .. }
        | LinalgOp::Pool { channels_last, .. }
        | LinalgOp::GlobalPool { channels_last, .. } = &mut op
        {
            *channels_last = cl;
        }
        op
    }
}

fn check_float(dt: DType, what: &str) -> Result<(), String> {
    if !dt.is_float() {
        return Err(format!("{what} must be a float type, got {dt}"));
    }
    Ok(())
}

fn check_window(w: &Window, spatial: usize) -> Result<(), String> {
    let n = w.rank();
    if n != spatial || w.strides.len() != n || w.dilations.len() != n {
        return Err(format!(
            "window attributes (kernel {:?}, strides {:?}, dilations {:?}) do not match {spatial} spatial axes",
            w.kernel, w.strides, w.dilations
        ));
    }
    if let Padding::Explicit(p) = &w.pads {
        if p.len() != 2 * n {
            return Err(format!("pads {p:?} must have {} entries", 2 * n));
        }
    }
    Ok(())
}

/// Shape of a convolution output `[N, M, *out]`.
fn conv_shape(
    x: &TensorType,
    wt: &TensorType,
    window: &Window,
    group: usize,
    cx: &mut InferCtx,
) -> Result<Vec<Dim>, String> {
    if x.rank() < 3 {
        return Err(format!(
            "input must be [N, C, spatial...], got rank {}",
            x.rank()
        ));
    }
    if wt.rank() != x.rank() {
        return Err(format!(
            "weights must have rank {} like the input, got {}",
            x.rank(),
            wt.rank()
        ));
    }
    let spatial = x.rank() - 2;
    check_window(window, spatial)?;
    if group == 0 {
        return Err("group must be positive".into());
    }
    for i in 0..spatial {
        if let Dim::Fixed(k) = wt.shape[2 + i] {
            if k != window.kernel[i] {
                return Err(format!(
                    "kernel_shape {:?} does not match weights {}",
                    window.kernel,
                    fmt_dims(&wt.shape, cx.syms)
                ));
            }
        }
    }
    if let (Dim::Fixed(c), Dim::Fixed(cg)) = (x.shape[1], wt.shape[1]) {
        if c != cg * group {
            return Err(format!(
                "input has {c} channels, weights expect {cg} x group {group}"
            ));
        }
    }
    if let Dim::Fixed(m) = wt.shape[0] {
        if m % group != 0 {
            return Err(format!(
                "{m} output channels are not divisible by group {group}"
            ));
        }
    }
    let mut out = vec![x.shape[0], wt.shape[0]];
    for i in 0..spatial {
        out.push(window_dim(x.shape[2 + i], window, i, false, cx.syms)?);
    }
    Ok(out)
}

fn check_bias(b: &TensorType, m: Dim, dt: DType) -> Result<(), String> {
    if b.dtype != dt {
        return Err(format!("bias must be {dt}, got {}", b.dtype));
    }
    if b.rank() != 1 || (matches!((b.shape[0], m), (Dim::Fixed(x), Dim::Fixed(y)) if x != y)) {
        return Err("bias must be 1-D with one entry per output channel".into());
    }
    Ok(())
}

/// Matmul output shape (numpy rules).
fn matmul_shape(a: &TensorType, b: &TensorType, cx: &mut InferCtx) -> Result<Vec<Dim>, String> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err("matmul operands must have rank >= 1".into());
    }
    let mut sa = a.shape.clone();
    let mut sb = b.shape.clone();
    let a1 = sa.len() == 1;
    let b1 = sb.len() == 1;
    if a1 {
        sa.insert(0, Dim::Fixed(1));
    }
    if b1 {
        sb.push(Dim::Fixed(1));
    }
    let (m, ka) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (kb, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if let (Dim::Fixed(x), Dim::Fixed(y)) = (ka, kb) {
        if x != y {
            return Err(format!("inner dimensions differ: {x} vs {y}"));
        }
    }
    let batch = broadcast_shapes(&sa[..sa.len() - 2], &sb[..sb.len() - 2], cx.syms)?;
    let mut out = batch;
    if !a1 {
        out.push(m);
    }
    if !b1 {
        out.push(n);
    }
    Ok(out)
}

fn is_quant8(dt: DType) -> bool {
    matches!(dt, DType::I8 | DType::U8)
}

impl OpInfo for LinalgOp {
    fn name(&self) -> &'static str {
        match self {
            LinalgOp::MatMul => "matmul",
            LinalgOp::MatMulInteger => "matmul_integer",
            LinalgOp::QLinearMatMul => "qlinear_matmul",
            LinalgOp::Conv { .. } => "conv",
            LinalgOp::ConvInteger { .. } => "conv_integer",
            LinalgOp::QLinearConv { .. } => "qlinear_conv",
            LinalgOp::ConvTranspose { .. } => "conv_transpose",
            LinalgOp::Pool {
                kind: PoolKind::Max { .. },
                ..
            } => "max_pool",
            LinalgOp::Pool {
                kind: PoolKind::Avg { .. },
                ..
            } => "avg_pool",
            LinalgOp::Pool {
                kind: PoolKind::Lp { .. },
                ..
            } => "lp_pool",
            LinalgOp::GlobalPool {
                kind: PoolKind::Max { .. },
                ..
            } => "global_max_pool",
            LinalgOp::GlobalPool {
                kind: PoolKind::Avg { .. },
                ..
            } => "global_avg_pool",
            LinalgOp::GlobalPool {
                kind: PoolKind::Lp { .. },
                ..
            } => "global_lp_pool",
            LinalgOp::Einsum { .. } => "einsum",
            LinalgOp::Det => "det",
            LinalgOp::MaxUnpool { .. } => "max_unpool",
            LinalgOp::Col2Im { .. } => "col2im",
            LinalgOp::DeformConv { .. } => "deform_conv",
        }
    }

    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        if let Some(nchw) = self.as_channels_first() {
            // Channels-last: infer on the channels-first view of the activation (input 0),
            // then move the channel axis of every output back to the end.
            let x = inputs.first().ok_or("missing input")?;
            if x.rank() < 3 {
                return Err(format!(
                    "channels-last input must be [N, *S, C], got rank {}",
                    x.rank()
                ));
            }
            let xt = TensorType::new(x.dtype, channels_first_dims(&x.shape));
            let mut v: Vec<&TensorType> = inputs.to_vec();
            v[0] = &xt;
            let outs = nchw.infer(&v, cx)?;
            return Ok(outs
                .into_iter()
                .map(|t| TensorType::new(t.dtype, channels_last_dims(&t.shape)))
                .collect());
        }
        match self {
            LinalgOp::MatMul => {
                expect_arity(inputs, 2)?;
                let (a, b) = (inputs[0], inputs[1]);
                if a.dtype != b.dtype {
                    return Err(format!("operand dtypes differ: {} vs {}", a.dtype, b.dtype));
                }
                if a.dtype == DType::Bool {
                    return Err("matmul of bool tensors is not defined".into());
                }
                Ok(vec![TensorType::new(a.dtype, matmul_shape(a, b, cx)?)])
            }
            LinalgOp::MatMulInteger => {
                expect_arity(inputs, 4)?;
                let (a, b) = (inputs[0], inputs[1]);
                if !is_quant8(a.dtype) || !is_quant8(b.dtype) {
                    return Err(format!(
                        "operands must be int8/uint8, got {} and {}",
                        a.dtype, b.dtype
                    ));
                }
                if inputs[2].dtype != a.dtype || inputs[3].dtype != b.dtype {
                    return Err("zero points must have their operand's dtype".into());
                }
                if inputs[2].rank() > 1 || inputs[3].rank() > 1 {
                    return Err("zero points must be scalars or 1-D".into());
                }
                Ok(vec![TensorType::new(DType::I32, matmul_shape(a, b, cx)?)])
            }
            LinalgOp::QLinearMatMul => {
                expect_arity(inputs, 8)?;
                let (a, b) = (inputs[0], inputs[3]);
                if !is_quant8(a.dtype) || !is_quant8(b.dtype) || !is_quant8(inputs[7].dtype) {
                    return Err("operands and output zero point must be int8/uint8".into());
                }
                if inputs[2].dtype != a.dtype || inputs[5].dtype != b.dtype {
                    return Err("zero points must have their operand's dtype".into());
                }
                for i in [1, 4, 6] {
                    check_float(inputs[i].dtype, "scales")?;
                }
                Ok(vec![TensorType::new(
                    inputs[7].dtype,
                    matmul_shape(a, b, cx)?,
                )])
            }
            LinalgOp::Conv { window, group, .. } => {
                expect_arity(inputs, 3)?;
                let (x, w, b) = (inputs[0], inputs[1], inputs[2]);
                check_float(x.dtype, "input")?;
                if w.dtype != x.dtype {
                    return Err(format!("weights must be {}, got {}", x.dtype, w.dtype));
                }
                let out = conv_shape(x, w, window, *group, cx)?;
                check_bias(b, out[1], x.dtype)?;
                Ok(vec![TensorType::new(x.dtype, out)])
            }
            LinalgOp::ConvInteger { window, group } => {
                expect_arity(inputs, 4)?;
                let (x, w) = (inputs[0], inputs[1]);
                if !is_quant8(x.dtype) || !is_quant8(w.dtype) {
                    return Err(format!(
                        "operands must be int8/uint8, got {} and {}",
                        x.dtype, w.dtype
                    ));
                }
                if inputs[2].dtype != x.dtype || inputs[3].dtype != w.dtype {
                    return Err("zero points must have their operand's dtype".into());
                }
                let out = conv_shape(x, w, window, *group, cx)?;
                Ok(vec![TensorType::new(DType::I32, out)])
            }
            LinalgOp::QLinearConv { window, group } => {
                expect_arity(inputs, 9)?;
                let (x, w) = (inputs[0], inputs[3]);
                if !is_quant8(x.dtype) || !is_quant8(w.dtype) || !is_quant8(inputs[7].dtype) {
                    return Err("operands and output zero point must be int8/uint8".into());
                }
                if inputs[2].dtype != x.dtype || inputs[5].dtype != w.dtype {
                    return Err("zero points must have their operand's dtype".into());
                }
                for i in [1, 4, 6] {
                    check_float(inputs[i].dtype, "scales")?;
                }
                let out = conv_shape(x, w, window, *group, cx)?;
                check_bias(inputs[8], out[1], DType::I32)?;
                Ok(vec![TensorType::new(inputs[7].dtype, out)])
            }
            LinalgOp::ConvTranspose {
                kernel,
                strides,
                dilations,
                pads,
                output_padding,
                group,
            } => {
                expect_arity(inputs, 3)?;
                let (x, w, b) = (inputs[0], inputs[1], inputs[2]);
                check_float(x.dtype, "input")?;
                if w.dtype != x.dtype {
                    return Err(format!("weights must be {}, got {}", x.dtype, w.dtype));
                }
                if x.rank() < 3 || w.rank() != x.rank() {
                    return Err("input and weights must be [N, C, spatial...] of equal rank".into());
                }
                let n = x.rank() - 2;
                if kernel.len() != n
                    || strides.len() != n
                    || dilations.len() != n
                    || pads.len() != 2 * n
                    || output_padding.len() != n
                {
                    return Err(format!("window attributes do not match {n} spatial axes"));
                }
                if *group == 0 {
                    return Err("group must be positive".into());
                }
                if let (Dim::Fixed(c), Dim::Fixed(_)) = (x.shape[1], w.shape[0]) {
                    if Dim::Fixed(c) != w.shape[0] {
                        return Err(format!(
                            "input has {c} channels, weights {}",
                            fmt_dims(&w.shape, cx.syms)
                        ));
                    }
                }
                let m = cx.syms.derive(SymExpr::Mul(w.shape[1], Dim::Fixed(*group)));
                let mut out = vec![x.shape[0], m];
                for i in 0..n {
                    let natural = (kernel[i].max(1) - 1) * dilations[i] + 1 + output_padding[i];
                    let delta = natural as i64 - pads[i] - pads[n + i];
                    let d = match x.shape[2 + i] {
                        Dim::Fixed(len) => {
                            let v = strides[i] as i64 * (len as i64 - 1) + delta;
                            if v <= 0 {
                                return Err(format!(
                                    "spatial axis {i}: output length {v} is not positive"
                                ));
                            }
                            Dim::Fixed(v as usize)
                        }
                        s => {
                            let t = cx.syms.derive(SymExpr::Sub(s, Dim::Fixed(1)));
                            let t = cx.syms.derive(SymExpr::Mul(t, Dim::Fixed(strides[i])));
                            if delta >= 0 {
                                cx.syms.derive(SymExpr::Add(t, Dim::Fixed(delta as usize)))
                            } else {
                                cx.syms
                                    .derive(SymExpr::Sub(t, Dim::Fixed((-delta) as usize)))
                            }
                        }
                    };
                    out.push(d);
                }
                check_bias(b, out[1], x.dtype)?;
                Ok(vec![TensorType::new(x.dtype, out)])
            }
            LinalgOp::Pool {
                kind,
                window,
                ceil_mode,
                ..
            } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                match kind {
                    PoolKind::Max { .. } => {
                        if !(x.dtype.is_float() || is_quant8(x.dtype)) {
                            return Err(format!(
                                "input must be float or int8/uint8, got {}",
                                x.dtype
                            ));
                        }
                    }
                    _ => check_float(x.dtype, "input")?,
                }
                if x.rank() < 3 {
                    return Err(format!(
                        "input must be [N, C, spatial...], got rank {}",
                        x.rank()
                    ));
                }
                check_window(window, x.rank() - 2)?;
                let mut out = vec![x.shape[0], x.shape[1]];
                for i in 0..window.rank() {
                    out.push(window_dim(x.shape[2 + i], window, i, *ceil_mode, cx.syms)?);
                }
                let mut res = vec![TensorType::new(x.dtype, out.clone())];
                if let PoolKind::Max { indices: true, .. } = kind {
                    res.push(TensorType::new(DType::I64, out));
                }
                Ok(res)
            }
            LinalgOp::GlobalPool { kind, .. } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                check_float(x.dtype, "input")?;
                if x.rank() < 2 {
                    return Err(format!(
                        "input must be [N, C, spatial...], got rank {}",
                        x.rank()
                    ));
                }
                if let PoolKind::Max { indices: true, .. } = kind {
                    return Err("global max pool has no indices output".into());
                }
                let mut out = vec![x.shape[0], x.shape[1]];
                out.extend(std::iter::repeat(Dim::Fixed(1)).take(x.rank() - 2));
                Ok(vec![TensorType::new(x.dtype, out)])
            }
            LinalgOp::Einsum {
                inputs: subs,
                output,
            } => {
                if inputs.len() != subs.len() || inputs.is_empty() {
                    return Err(format!(
                        "equation has {} operands, got {} inputs",
                        subs.len(),
                        inputs.len()
                    ));
                }
                let dt = inputs[0].dtype;
                if dt == DType::Bool {
                    return Err("einsum of bool tensors is not supported".into());
                }
                let mut sizes: Vec<(u8, Dim)> = Vec::new();
                for (t, s) in inputs.iter().zip(subs) {
                    if t.dtype != dt {
                        return Err(format!("operand dtypes differ: {dt} vs {}", t.dtype));
                    }
                    if t.rank() != s.len() {
                        return Err(format!(
                            "operand of rank {} has {} subscripts",
                            t.rank(),
                            s.len()
                        ));
                    }
                    for (&l, &d) in s.iter().zip(&t.shape) {
                        match sizes.iter_mut().find(|(x, _)| *x == l) {
                            None => sizes.push((l, d)),
                            Some((_, cur)) => {
                                *cur = match (*cur, d) {
                                    (a, b) if a == b => a,
                                    (Dim::Fixed(1), b) => b,
                                    (a, Dim::Fixed(1)) => a,
                                    (Dim::Fixed(a), Dim::Fixed(b)) => {
                                        return Err(format!(
                                            "label '{}' has sizes {a} and {b}",
                                            l as char
                                        ))
                                    }
                                    (a, b) => cx.syms.derive(SymExpr::Max(a, b)),
                                }
                            }
                        }
                    }
                }
                let mut out = Vec::new();
                for (i, l) in output.iter().enumerate() {
                    if output[..i].contains(l) {
                        return Err(format!("output label '{}' repeated", *l as char));
                    }
                    let d = sizes
                        .iter()
                        .find(|(x, _)| x == l)
                        .map(|x| x.1)
                        .ok_or_else(|| {
                            format!("output label '{}' is not in any input", *l as char)
                        })?;
                    out.push(d);
                }
                Ok(vec![TensorType::new(dt, out)])
            }
            LinalgOp::Det => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                check_float(x.dtype, "input")?;
                let r = x.rank();
                if r < 2 {
                    return Err("det needs [*, n, n]".into());
                }
                if let (Dim::Fixed(a), Dim::Fixed(b)) = (x.shape[r - 2], x.shape[r - 1]) {
                    if a != b {
                        return Err(format!("matrices must be square, got {a}x{b}"));
                    }
                }
                Ok(vec![TensorType::new(x.dtype, x.shape[..r - 2].to_vec())])
            }
            LinalgOp::MaxUnpool {
                window,
                output_shape,
            } => {
                expect_arity(inputs, 2)?;
                let (x, ind) = (inputs[0], inputs[1]);
                if ind.dtype != DType::I64 {
                    return Err(format!("indices must be int64, got {}", ind.dtype));
                }
                if x.rank() < 3 {
                    return Err("input must be [N, C, spatial...]".into());
                }
                check_window(window, x.rank() - 2)?;
                if let Some(s) = output_shape {
                    if s.len() != x.rank() {
                        return Err("output_shape must have the input's rank".into());
                    }
                    return Ok(vec![TensorType::new(x.dtype, s.clone())]);
                }
                let Padding::Explicit(p) = &window.pads else {
                    return Err("max unpool needs explicit pads".into());
                };
                let n = window.rank();
                let mut out = vec![x.shape[0], x.shape[1]];
                for i in 0..n {
                    let d = x.shape[2 + i];
                    let t = cx.syms.derive(SymExpr::Sub(d, Dim::Fixed(1)));
                    let t = cx
                        .syms
                        .derive(SymExpr::Mul(t, Dim::Fixed(window.strides[i])));
                    let t = cx
                        .syms
                        .derive(SymExpr::Add(t, Dim::Fixed(window.kernel[i])));
                    out.push(cx.syms.derive(SymExpr::Sub(t, Dim::Fixed(p[i] + p[n + i]))));
                }
                Ok(vec![TensorType::new(x.dtype, out)])
            }
            LinalgOp::Col2Im {
                image_shape,
                block_shape,
                dilations,
                pads,
                strides,
            } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                let n = image_shape.len();
                if block_shape.len() != n
                    || dilations.len() != n
                    || strides.len() != n
                    || pads.len() != 2 * n
                {
                    return Err("col2im attributes do not match the image rank".into());
                }
                if x.rank() != 3 {
                    return Err("input must be [N, C*prod(block), L]".into());
                }
                let bs: usize = block_shape.iter().product();
                if bs == 0 {
                    return Err("block shape must be positive".into());
                }
                let c = match x.shape[1] {
                    Dim::Fixed(v) if v % bs != 0 => {
                        return Err(format!("{v} is not divisible by the block size {bs}"))
                    }
                    d => cx.syms.derive(SymExpr::Div(d, Dim::Fixed(bs))),
                };
                let mut out = vec![x.shape[0], c];
                out.extend(image_shape.iter().map(|&d| Dim::Fixed(d)));
                Ok(vec![TensorType::new(x.dtype, out)])
            }
            LinalgOp::DeformConv {
                window,
                group,
                offset_group,
            } => {
                expect_arity(inputs, 5)?;
                let (x, w) = (inputs[0], inputs[1]);
                check_float(x.dtype, "input")?;
                for (i, t) in inputs.iter().enumerate().skip(1) {
                    if t.dtype != x.dtype {
                        return Err(format!("input {i} must be {}, got {}", x.dtype, t.dtype));
                    }
                }
                if *offset_group == 0 {
                    return Err("offset_group must be positive".into());
                }
                let out = conv_shape(x, w, window, *group, cx)?;
                check_bias(inputs[3], out[1], x.dtype)?;
                Ok(vec![TensorType::new(x.dtype, out)])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win(k: usize, s: usize, d: usize, pads: Padding) -> Window {
        Window {
            kernel: vec![k],
            strides: vec![s],
            dilations: vec![d],
            pads,
        }
    }

    #[test]
    fn geometry_floor_ceil_same() {
        // 5 inputs, k 2, s 2: floor → 2, ceil → 3.
        let w = win(2, 2, 1, Padding::Explicit(vec![0, 0]));
        assert_eq!(window_geometry(5, &w, 0, false).unwrap().0, 2);
        assert_eq!(window_geometry(5, &w, 0, true).unwrap().0, 3);
        // Last window would start in the end padding: dropped.
        let w = win(3, 2, 1, Padding::Explicit(vec![1, 1]));
        // padded 6, span 3 → ceil(3/2)+1 = 3; third window starts at 4 >= 4+1? no: 4 < 5 kept.
        assert_eq!(window_geometry(4, &w, 0, true).unwrap().0, 3);
        let w = win(2, 2, 1, Padding::Explicit(vec![0, 1]));
        // 4 + 1 = 5, span 3 → 3 windows, the third starts at 4 >= 4 → dropped.
        assert_eq!(window_geometry(4, &w, 0, true).unwrap().0, 2);
        let w = win(3, 2, 1, Padding::SameUpper);
        assert_eq!(window_geometry(5, &w, 0, false).unwrap(), (3, 1, 1));
        let w = win(4, 1, 1, Padding::SameLower);
        assert_eq!(window_geometry(5, &w, 0, false).unwrap(), (5, 2, 1));
        let w = win(4, 1, 1, Padding::SameUpper);
        assert_eq!(window_geometry(5, &w, 0, false).unwrap(), (5, 1, 2));
    }
}
