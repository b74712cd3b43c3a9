//! Linear algebra kernels: matmuls, convolutions, pools, einsum, det, and friends.
//!
//! Floats of 32 bits or fewer compute in f32 inside convolutions (one rounding per tap,
//! like the ONNX reference and ORT) and in f64 inside matmuls; f64 computes in f64;
//! integer variants compute in wrapping i64.

mod conv;
mod matmul;
mod misc;
mod pool;

use crate::EvalCtx;
use tilec_ir::op::{to_channels_first_perm, to_channels_last_perm, LayoutOp, LinalgOp};
use tilec_ir::{DType, Tensor};

fn transpose(x: &Tensor, perm: Vec<usize>, cx: &EvalCtx) -> Result<Tensor, String> {
    let mut out = super::layout::eval(&LayoutOp::Transpose { perm }, &[x], cx)?;
    out.pop()
        .ok_or_else(|| "transpose produced no output".to_string())
}

pub fn eval(op: &LinalgOp, args: &[&Tensor], cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    if let Some(nchw) = op.as_channels_first() {
        // Channels-last conv/pool: transpose the activation to channels-first, run the
        // channels-first kernel, and move the channel axis of each output back to the end.
        let x = *args.first().ok_or("missing input")?;
        let rank = x.shape().len();
        if rank < 3 {
            return Err(format!(
                "channels-last input must have rank >= 3, got {rank}"
            ));
        }
        let xt = transpose(x, to_channels_first_perm(rank), cx)?;
        let mut v: Vec<&Tensor> = args.to_vec();
        v[0] = &xt;
        return eval(&nchw, &v, cx)?
            .iter()
            .map(|t| transpose(t, to_channels_last_perm(t.shape().len()), cx))
            .collect();
    }
    let _ = cx;
    let need = |n: usize| -> Result<(), String> {
        if args.len() != n {
            return Err(format!("expected {n} inputs, got {}", args.len()));
        }
        Ok(())
    };
    match op {
        LinalgOp::MatMul => {
            need(2)?;
            Ok(vec![matmul::matmul(args[0], args[1])?])
        }
        LinalgOp::MatMulInteger => {
            need(4)?;
            Ok(vec![matmul::matmul_integer(args)?])
        }
        LinalgOp::QLinearMatMul => {
            need(8)?;
            Ok(vec![matmul::qlinear_matmul(args)?])
        }
        LinalgOp::Conv { window, group, .. } => {
            need(3)?;
            Ok(vec![conv::conv(args, window, *group)?])
        }
        LinalgOp::ConvInteger { window, group } => {
            need(4)?;
            Ok(vec![conv::conv_integer(args, window, *group)?])
        }
        LinalgOp::QLinearConv { window, group } => {
            need(9)?;
            Ok(vec![conv::qlinear_conv(args, window, *group)?])
        }
        LinalgOp::ConvTranspose {
            kernel,
            strides,
            dilations,
            pads,
            output_padding,
            group,
        } => {
            need(3)?;
            let p = conv::TransposeParams {
                kernel,
                strides,
                dilations,
                pads,
                output_padding,
                group: *group,
            };
            Ok(vec![conv::conv_transpose(args, &p)?])
        }
        LinalgOp::DeformConv {
            window,
            group,
            offset_group,
        } => {
            need(5)?;
            Ok(vec![conv::deform_conv(
                args,
                window,
                *group,
                *offset_group,
            )?])
        }
        LinalgOp::Pool {
            kind,
            window,
            ceil_mode,
            ..
        } => {
            need(1)?;
            pool::pool(args[0], kind, window, *ceil_mode)
        }
        LinalgOp::GlobalPool { kind, .. } => {
            need(1)?;
            Ok(vec![pool::global_pool(args[0], kind)?])
        }
        LinalgOp::MaxUnpool {
            window,
            output_shape,
        } => {
            need(2)?;
            let os = match output_shape {
                Some(s) => Some(cx.dims(s)?),
                None => None,
            };
            Ok(vec![pool::max_unpool(args[0], args[1], window, os)?])
        }
        LinalgOp::Einsum { inputs, output } => Ok(vec![misc::einsum(args, inputs, output)?]),
        LinalgOp::Det => {
            need(1)?;
            Ok(vec![misc::det(args[0])?])
        }
        LinalgOp::Col2Im {
            image_shape,
            block_shape,
            dilations,
            pads,
            strides,
        } => {
            need(1)?;
            let p = misc::Col2ImParams {
                image_shape,
                block_shape,
                dilations,
                pads,
                strides,
            };
            Ok(vec![misc::col2im(args[0], &p)?])
        }
    }
}

// ---- shared numeric helpers ----

/// Accumulator arithmetic: `f32`/`f64` as usual, `i64` wrapping (integer ops wrap like
/// their fixed-width results would).
pub(crate) trait Num: Copy + Default + Send + Sync + PartialEq + 'static {
    /// `self + a * b`.
    fn madd(self, a: Self, b: Self) -> Self;
    fn plus(self, o: Self) -> Self;
}

impl Num for f32 {
    #[inline(always)]
    fn madd(self, a: f32, b: f32) -> f32 {
        self + a * b
    }
    #[inline(always)]
    fn plus(self, o: f32) -> f32 {
        self + o
    }
}

impl Num for f64 {
    #[inline(always)]
    fn madd(self, a: f64, b: f64) -> f64 {
        self + a * b
    }
    #[inline(always)]
    fn plus(self, o: f64) -> f64 {
        self + o
    }
}

impl Num for i64 {
    #[inline(always)]
    fn madd(self, a: i64, b: i64) -> i64 {
        self.wrapping_add(a.wrapping_mul(b))
    }
    #[inline(always)]
    fn plus(self, o: i64) -> i64 {
        self.wrapping_add(o)
    }
}

/// The elements of a float tensor as f32 (exact for every float dtype except f64).
pub(crate) fn f32_vec(t: &Tensor) -> Vec<f32> {
    match t.as_slice::<f32>() {
        Some(s) => s.to_vec(),
        None => t.to_f64_vec().into_iter().map(|x| x as f32).collect(),
    }
}

/// Builds a float tensor of `dt` from f32 results (rounding once for narrower types).
pub(crate) fn from_f32(dt: DType, shape: Vec<usize>, v: Vec<f32>) -> Result<Tensor, String> {
    if dt == DType::F32 {
        return Tensor::from_vec(shape, v).map_err(|e| e.to_string());
    }
    let f: Vec<f64> = v.into_iter().map(|x| x as f64).collect();
    Tensor::from_f64s(dt, shape, &f).map_err(|e| e.to_string())
}

pub(crate) fn from_f64(dt: DType, shape: Vec<usize>, v: &[f64]) -> Result<Tensor, String> {
    Tensor::from_f64s(dt, shape, v).map_err(|e| e.to_string())
}

/// Threads for a kernel doing about `work` multiply-adds.
pub(crate) fn threads_for(work: usize) -> usize {
    if work < 1 << 22 {
        return 1;
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8)
}

/// Calls `f(i, chunk)` for each `chunk_len`-sized chunk of `out`, spread over `threads`
/// scoped threads in contiguous runs of chunks.
pub(crate) fn par_chunks<A: Send>(
    out: &mut [A],
    chunk_len: usize,
    threads: usize,
    f: impl Fn(usize, &mut [A]) + Sync,
) {
    if chunk_len == 0 {
        return;
    }
    let n_chunks = out.len().div_ceil(chunk_len);
    if threads <= 1 || n_chunks <= 1 {
        for (i, c) in out.chunks_mut(chunk_len).enumerate() {
            f(i, c);
        }
        return;
    }
    let per = n_chunks.div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        for (t, part) in out.chunks_mut(per * chunk_len).enumerate() {
            s.spawn(move || {
                for (j, c) in part.chunks_mut(chunk_len).enumerate() {
                    f(t * per + j, c);
                }
            });
        }
    });
}
