//! `fold-batchnorm`: `batch_norm(conv(x, w, b), scale, bias, mean, var)` with constant
//! `w`, `b` and batch-norm parameters becomes one `conv(x, w', b')`:
//!
//! ```text
//! a[m]     = scale[m] / sqrt(var[m] + epsilon)
//! w'[m,..] = w[m,..] * a[m]
//! b'[m]    = (b[m] - mean[m]) * a[m] + bias[m]
//! ```
//!
//! computed in f64 and stored in the weight dtype. The conv bias and weights may also be a
//! `fill` of a fixed shape: the importer's materialized zero bias (which `fold-constants`
//! keeps as an op when it is large), or splat weights as in ONNX's weight-stripped "light"
//! models. The folded weights differ per output channel, so such a splat becomes a dense
//! constant of the weights' size (what a real model stores anyway). Only when the conv's output has no
//! other reader (otherwise the unnormalized value is still needed and the conv would be
//! computed twice). Inference-mode batch norm is a per-channel affine map on axis 1, the
//! conv's output-channel axis, so the fold is exact up to rounding of the new weights.

use super::{finish, ir};
use crate::{OptError, Pass};
use tilec_ir::op::{LinalgOp, NormOp, SourceOp};
use tilec_ir::{Graph, Op, Tensor, ValueId};

pub struct FoldBatchNorm;

struct Fold {
    bn_out: ValueId,
    conv_op: Op,
    x: ValueId,
    w: Tensor,
    b: Tensor,
    name: String,
}

/// A constant, or the value of a `fill` of a fixed shape.
fn known_value(g: &Graph, v: ValueId) -> Option<Tensor> {
    if let Some(t) = g.const_value(v) {
        return Some(t.clone());
    }
    let n = g.node(g.producer(v)?);
    let Op::Source(SourceOp::Fill { shape, value }) = &n.op else {
        return None;
    };
    let shape: Vec<usize> = shape.iter().map(|d| d.fixed()).collect::<Option<_>>()?;
    let numel: usize = shape.iter().product();
    if numel > 1 << 24 {
        return None;
    }
    let x = *value.to_f64_vec().first()?;
    Tensor::from_f64s(value.dtype(), shape, &vec![x; numel]).ok()
}

fn plan(g: &Graph, uses: &[tilec_ir::Uses], ni: usize) -> Option<Fold> {
    let n = &g.nodes()[ni];
    let Op::Norm(NormOp::BatchNorm {
        epsilon,
        channels_last,
    }) = n.op
    else {
        return None;
    };
    let y = n.inputs[0];
    let conv = g.node(g.producer(y)?);
    // Weights are `[M, C/group, *K]` in either layout; the norm's channel axis must be the
    // conv's output-channel axis.
    let same_layout = matches!(&conv.op, Op::Linalg(l @ LinalgOp::Conv { .. }) if l.is_channels_last() == channels_last);
    if !same_layout || uses[y.index()].count() != 1 {
        return None;
    }
    let x = conv.inputs[0];
    let (w, b) = (
        &known_value(g, conv.inputs[1])?,
        &known_value(g, conv.inputs[2])?,
    );
    let p: Vec<Vec<f64>> = n.inputs[1..5]
        .iter()
        .map(|&v| g.const_value(v).map(|t| t.to_f64_vec()))
        .collect::<Option<_>>()?;
    let m = *w.shape().first()?;
    if b.numel() != m || p.iter().any(|v| v.len() != m) || m == 0 {
        return None;
    }
    let a: Vec<f64> = (0..m)
        .map(|c| p[0][c] / (p[3][c] + epsilon as f64).sqrt())
        .collect();
    let per = w.numel() / m;
    let wv = w.to_f64_vec();
    let w2: Vec<f64> = wv
        .iter()
        .enumerate()
        .map(|(i, &v)| v * a[i / per])
        .collect();
    let bv = b.to_f64_vec();
    let b2: Vec<f64> = (0..m).map(|c| (bv[c] - p[2][c]) * a[c] + p[1][c]).collect();
    Some(Fold {
        bn_out: n.outputs[0],
        conv_op: conv.op.clone(),
        x,
        w: Tensor::from_f64s(w.dtype(), w.shape().to_vec(), &w2).ok()?,
        b: Tensor::from_f64s(b.dtype(), b.shape().to_vec(), &b2).ok()?,
        name: format!("{}.bn_folded", conv.name),
    })
}

impl Pass for FoldBatchNorm {
    fn name(&self) -> &'static str {
        "fold-batchnorm"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        let uses = g.uses();
        let folds: Vec<Fold> = (0..g.nodes().len())
            .filter_map(|ni| plan(g, &uses, ni))
            .collect();
        let changed = !folds.is_empty();
        for f in folds {
            let w = g.add_const(&format!("{}.w", f.name), f.w);
            let b = g.add_const(&format!("{}.b", f.name), f.b);
            let out = g
                .add_node(&f.name, f.conv_op, &[f.x, w, b])
                .map_err(ir("fold-batchnorm"))?;
            g.replace_all_uses(f.bn_out, out[0])
                .map_err(ir("fold-batchnorm"))?;
        }
        finish(g, "fold-batchnorm", changed)
    }
}
