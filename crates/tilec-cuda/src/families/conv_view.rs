//! A convolution group's kernel seen as an implicit GEMM: the anchor is a channels-last 2-D
//! convolution of one group, lowered to one `Gemm` that reads the input (or the channels-first
//! tensor a fused transpose makes it from) and the constant weights straight from their
//! buffers. Both tensor-core templates take this view: A is the input read through an im2col
//! (computed addresses, or the copy engine's im2col mode), B the weights repacked at bind.

use tilec_ir::op::{window_geometry, LinalgOp, Padding};
use tilec_ir::{DType, Op};
use tilec_tile::family::Problem as FProblem;
use tilec_tile::{BufId, Expr, Gemm, Kernel, Stmt};

use super::operands::{epilogue_fn, GemmView};
use super::template::OperandRef;
use crate::gemm::{ConvGeom, Problem};

/// The buffers an expression loads.
fn loads(e: &Expr) -> Vec<BufId> {
    let mut v = vec![];
    e.visit(&mut |x| {
        if let Expr::Load(b, _) = x {
            if !v.contains(b) {
                v.push(*b);
            }
        }
    });
    v
}

/// A convolution group's kernel as an implicit GEMM: `Some` when the anchor is a channels-last
/// 2-D convolution of one group whose lowered kernel is one `Gemm` reading the input and the
/// constant weights straight from their buffers.
pub fn conv_view(p: &FProblem, k: &Kernel) -> Option<Result<GemmView, String>> {
    let Some(Op::Linalg(LinalgOp::Conv { window, group, channels_last })) = p.anchor_op() else {
        return None;
    };
    Some((|| {
        if !*channels_last || *group != 1 || window.rank() != 2 {
            return Err(format!(
                "convolution: {}-D, {} groups, channels {} (the template takes 2-D, one group, channels-last)",
                window.rank(),
                group,
                if *channels_last { "last" } else { "first" }
            ));
        }
        let node = p.graph.node(p.anchor.ok_or("no anchor")?);
        let (xv, wv) = (node.inputs[0], node.inputs[1]);
        if !matches!(p.graph.value(wv).def, tilec_ir::ValueDef::Const(_)) {
            return Err("convolution weights are not a constant (they are repacked once, when the kernel is bound)".into());
        }
        let fused = crate::schedule::fuse_scratch_epilogue(k);
        let k = fused.as_ref().unwrap_or(k);
        let g: &Gemm = match k.body.as_slice() {
            [Stmt::Gemm(g)] => g,
            _ => return Err("the convolution's kernel is not one matrix product".into()),
        };
        if !k.checks.is_empty() {
            return Err("the kernel checks indices".into());
        }
        if g.acc_dtype != DType::F32 {
            return Err(format!("accumulates in {}", g.acc_dtype.name()));
        }
        let (la, lb) = (loads(&g.a), loads(&g.b));
        let (&[xb], &[wb]) = (la.as_slice(), lb.as_slice()) else {
            return Err("the convolution's operands are computed (a fused prologue)".into());
        };
        // The input as stored: the conv's own input (channels-last), or the channels-first
        // tensor a transpose fused into this kernel makes it from.
        let fused_transpose = match p.graph.value(xv).def {
            tilec_ir::ValueDef::Node { node: t, .. } if p.nodes.contains(&t) => match &p.graph.node(t).op {
                Op::Layout(tilec_ir::op::LayoutOp::Transpose { perm }) if perm == &[0, 2, 3, 1] => Some(p.graph.node(t).inputs[0]),
                _ => return Err("the convolution's input is computed in its kernel (a fused prologue)".into()),
            },
            _ => None,
        };
        let (xs, ws) = (&k.buf(xb).shape, &k.buf(wb).shape);
        let same = |v, s: &[i64]| p.graph.value(v).ty.fixed_shape() == Some(s.iter().map(|&d| d as usize).collect());
        if !same(fused_transpose.unwrap_or(xv), xs) || !same(wv, ws) || xs.len() != 4 || ws.len() != 4 {
            return Err("the convolution's operands are not its input and weights".into());
        }
        let (dx, dw) = (k.buf(xb).dtype, k.buf(wb).dtype);
        if dx != dw || !matches!(dx, DType::F16 | DType::BF16) {
            return Err(format!("convolution over {} and {} (bf16 or f16)", dx.name(), dw.name()));
        }
        let u = |x: i64| x as usize;
        let (n, h, w, c) = match fused_transpose {
            Some(_) => (u(xs[0]), u(xs[2]), u(xs[3]), u(xs[1])),
            None => (u(xs[0]), u(xs[1]), u(xs[2]), u(xs[3])),
        };
        let (o, kh, kw) = (u(ws[0]), u(ws[2]), u(ws[3]));
        let (oh, ph, _) = window_geometry(h, window, 0, false)?;
        let (ow, pw, _) = window_geometry(w, window, 1, false)?;
        if matches!(window.pads, Padding::SameLower | Padding::SameUpper) {
            return Err("SAME padding is resolved by the importer; an unresolved one is not taken".into());
        }
        let geom = ConvGeom {
            n,
            h,
            w,
            c,
            kh,
            kw,
            oh,
            ow,
            stride: (window.strides[0], window.strides[1]),
            pad: (ph, pw),
            dil: (window.dilations[0], window.dilations[1]),
            nchw_input: fused_transpose.is_some(),
        };
        if u(g.batch) != n || u(g.m) != oh * ow || u(g.n) != o || u(g.k) != geom.k() {
            return Err(format!(
                "the lowered product {}x{}x{} x{} is not the convolution's {}x{}x{} x{n}",
                g.m,
                g.n,
                g.k,
                g.batch,
                oh * ow,
                o,
                geom.k()
            ));
        }
        let mut gemm = Problem::for_conv(geom, o, dx);
        gemm.custom = Some(epilogue_fn(k, g, Some(oh * ow))?);
        let pos = |buf: BufId| k.params.iter().position(|&b| b == buf).unwrap_or(0);
        Ok(GemmView { problem: gemm, a: OperandRef { param: pos(xb), offset_bytes: 0 }, b: OperandRef { param: pos(wb), offset_bytes: 0 } })
    })())
}

