//! Convolutions: a `Gemm` over an implicit im2col, a direct nest, or Winograd (as the
//! kernel family chose); transposed convolutions as a direct nest, or as one `Gemm` over their
//! output phases (`conv_transpose.rs`).

use tilec_ir::op::LinalgOp;
use tilec_ir::{NodeId, Op};

use super::common::{output_nest, val};
use super::matmul::{gemm_vars, operand};
use super::pool::geometry;
use super::super::{bin, compute_dtype, lit, unravel, ConvAlgo, Fail, Lowerer, R};
use crate::ir::*;

pub(super) fn conv(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Linalg(LinalgOp::Conv { window: w, group, channels_last }) = op else {
        return l.unsupported(n, "not a convolution");
    };
    let (group, cl) = (*group, *channels_last);
    let node = l.node(n);
    let (x, wt, bias, out) = (
        node.inputs[0],
        node.inputs[1],
        node.inputs[2],
        node.outputs[0],
    );
    let (xs, ws, os) = (l.shape(x), l.shape(wt), l.shape(out));
    let r = xs.len();
    let d = l.dtype(out);
    let cd = compute_dtype(d);
    let g = group as i64;
    let sp_axes: Vec<usize> = if cl {
        (1..r - 1).collect()
    } else {
        (2..r).collect()
    };
    let c_axis = if cl { r - 1 } else { 1 };
    let sp: Vec<i64> = sp_axes.iter().map(|&a| xs[a]).collect();
    let geo = geometry(l, n, &sp, w, false)?;
    let osp: Vec<i64> = geo.iter().map(|t| t.0).collect();
    let (c, m) = (xs[c_axis], ws[0]);
    let (cg, mg) = (c / g, m / g);
    let kern: Vec<i64> = ws[2..].to_vec();
    let taps: i64 = kern.iter().product();
    let kk = cg * taps;
    let p: i64 = osp.iter().product();
    let nb = xs[0];
    // Input coordinates (and the in-bounds condition) of a tap for output spatial index `o`.
    let tap = |l: &Lowerer, o: &[Expr], t: &[Expr]| -> (Vec<Expr>, Option<Expr>) {
        let mut coords = Vec::new();
        let mut cond: Option<Expr> = None;
        for j in 0..sp.len() {
            let (_, pb, pe) = geo[j];
            let e = bin(
                BinOp::Sub,
                bin(
                    BinOp::Add,
                    bin(BinOp::Mul, o[j].clone(), Expr::Int(w.strides[j] as i64)),
                    bin(BinOp::Mul, t[j].clone(), Expr::Int(w.dilations[j] as i64)),
                ),
                Expr::Int(pb),
            );
            let e = l.simp(e);
            if pb > 0 || pe > 0 {
                let ok = bin(
                    BinOp::And,
                    bin(BinOp::Ge, e.clone(), Expr::Int(0)),
                    bin(BinOp::Lt, e.clone(), Expr::Int(sp[j])),
                );
                cond = Some(match cond {
                    None => ok,
                    Some(p) => bin(BinOp::And, p, ok),
                });
            }
            coords.push(e);
        }
        (coords, cond)
    };
    let x_at = |n_: Expr, ch: Expr, coords: Vec<Expr>| -> Vec<Expr> {
        let mut v = vec![n_];
        if cl {
            v.extend(coords);
            v.push(ch);
        } else {
            v.push(ch);
            v.extend(coords);
        }
        v
    };
    let out_at = |n_: Expr, ch: Expr, o: Vec<Expr>| -> Vec<Expr> { x_at(n_, ch, o) };
    let use_gemm = match l.opts().conv {
        ConvAlgo::Auto => kk >= 16 && mg >= 4,
        ConvAlgo::Direct => false,
        ConvAlgo::Gemm | ConvAlgo::GroupedGemm { .. } => true,
        ConvAlgo::Depthwise { wide } => return super::depthwise::conv(l, n, w, group, cl, &geo, wide),
        ConvAlgo::GroupDirect { pixels } => return super::group_direct::conv(l, n, w, group, cl, &geo, pixels as i64),
        ConvAlgo::Winograd => {
            let st = if cl { super::winograd::conv(l, n, w, group, &geo)? } else { None };
            return st.ok_or_else(|| {
                Fail::Unsupported(n, "Winograd needs a 3x3 stride-1 f32 channels-last convolution over at least 32 input and 16 output channels and 32 tiles (dilated: at least 6 outputs per phase), reading a plain input".into())
            });
        }
    };
    if !use_gemm {
        // Direct loop nest: out[n, m, o] = bias[m] + sum_{c, taps} x * w.
        return output_nest(l, &os, &mut |l, oidx| {
            let (n_, mch) = (oidx[0].clone(), oidx[c_axis].clone());
            let o: Vec<Expr> = sp_axes.iter().map(|&a| oidx[a].clone()).collect();
            let grp = bin(BinOp::Div, mch.clone(), Expr::Int(mg));
            let cv = l.loop_var("r", cg);
            let mut loops = vec![(cv, cg)];
            let mut t = Vec::new();
            for &kx in &kern {
                let v = l.loop_var("r", kx);
                loops.push((v, kx));
                t.push(Expr::Var(v));
            }
            let (coords, cond) = tap(l, &o, &t);
            let ch = bin(
                BinOp::Add,
                bin(BinOp::Mul, grp, Expr::Int(cg)),
                Expr::Var(cv),
            );
            let acc = l.elem_var("acc", cd, true);
            let m2 = l.begin_block();
            let xv = l.guarded(cond.is_some(), |l| val(l, x, &x_at(n_.clone(), ch, coords)));
            let mut wi = vec![mch.clone(), Expr::Var(cv)];
            wi.extend(t.iter().cloned());
            let wv = val(l, wt, &wi);
            let inner = l.end_block(m2);
            let sum = DirectSum { acc, cd, loops: &loops, cond };
            sum.finish(l, inner, (xv?, wv?), (bias, mch), (out, oidx, d))
        });
    }
    // Groups merged `merge` at a time: a merged group's weights are block-diagonal.
    let merge = match l.opts().conv {
        ConvAlgo::GroupedGemm { merge } => merge.max(1) as i64,
        _ => 1,
    };
    if g % merge != 0 {
        return l.unsupported(n, format!("{g} groups cannot be merged {merge} at a time"));
    }
    let (g, cg0, mg0) = (g / merge, cg, mg);
    let (cg, mg) = (cg * merge, mg * merge);
    // Taps that read only padding for every output position contribute nothing (a dilation
    // far beyond the input, as an ASPP head's): the reduction runs over the live taps alone,
    // tap `t` of the reduction being `t + first[j]` of the kernel along axis `j`.
    let (first, kern) = live_taps(&sp, &kern, w, &geo);
    let taps: i64 = kern.iter().product();
    let kk = cg * taps;
    // GEMM with an implicit im2col operand; batch over (n, group).
    let batch = nb * g;
    let (rows, cols) = if cl { (p, mg) } else { (mg, p) };
    let gv = gemm_vars(l, batch, rows, cols, kk, cd);
    let (vb, vi, vj, vk) = (
        Expr::Var(gv.b),
        Expr::Var(gv.i),
        Expr::Var(gv.j),
        Expr::Var(gv.k),
    );
    let n_ = bin(BinOp::Div, vb.clone(), Expr::Int(g));
    let grp = bin(BinOp::Rem, vb.clone(), Expr::Int(g));
    // k = (c, taps) channels-first; (taps, c) channels-last (contiguous channels in x).
    let (cidx, tflat) = if cl {
        (
            bin(BinOp::Rem, vk.clone(), Expr::Int(cg)),
            bin(BinOp::Div, vk.clone(), Expr::Int(cg)),
        )
    } else {
        (
            bin(BinOp::Div, vk.clone(), Expr::Int(taps)),
            bin(BinOp::Rem, vk.clone(), Expr::Int(taps)),
        )
    };
    let t: Vec<Expr> = unravel(tflat, &kern)
        .into_iter()
        .zip(&first)
        .map(|(t, &f)| if f == 0 { t } else { bin(BinOp::Add, t, Expr::Int(f)) })
        .collect();
    let (pos, mloc) = if cl {
        (vi.clone(), vj.clone())
    } else {
        (vj.clone(), vi.clone())
    };
    let o = unravel(pos, &osp);
    let (coords, cond) = tap(l, &o, &t);
    let ch = bin(
        BinOp::Add,
        bin(BinOp::Mul, grp.clone(), Expr::Int(cg)),
        cidx.clone(),
    );
    let mch = bin(BinOp::Add, bin(BinOp::Mul, grp, Expr::Int(mg)), mloc.clone());
    let xi = x_at(n_.clone(), ch, coords);
    let xe = operand(l, &mut |l| {
        let v = l.guarded(true, |l| l.value_at(x, &xi))?;
        let v = l.up(v, l.dtype(x));
        Ok(match &cond {
            Some(c) => Expr::select(c.clone(), v, lit(0.0, cd)),
            None => v,
        })
    })?;
    // Within a merged group, input channel `cidx` meets output channel `mloc` where both
    // lie in the same original group.
    let same_group = (merge > 1).then(|| {
        bin(
            BinOp::Eq,
            bin(BinOp::Div, cidx.clone(), Expr::Int(cg0)),
            bin(BinOp::Div, mloc.clone(), Expr::Int(mg0)),
        )
    });
    let wc = if merge > 1 { bin(BinOp::Rem, cidx.clone(), Expr::Int(cg0)) } else { cidx };
    let mut wi = vec![mch.clone(), wc];
    wi.extend(t);
    let we = operand(l, &mut |l| {
        let v = val(l, wt, &wi)?;
        Ok(match &same_group {
            Some(c) => Expr::select(c.clone(), v, lit(0.0, cd)),
            None => v,
        })
    })?;
    // A channels-last input scaled per channel (a squeeze-and-excitation's `x · s`, s one
    // value per image and channel) is a factor of the depth index alone: on the weights it
    // costs K × N products per call instead of M × K, and the CPU GEMM reads the input in
    // place again (`ConvAlgo::Gemm` is the CPU's choice; other back ends keep the form).
    let movable = cl && rows >= cols && l.opts().conv == ConvAlgo::Gemm;
    let (xe, we) = match movable.then(|| depth_factor(&xe, gv.i)).flatten() {
        Some((plain, factor)) => (plain, bin(BinOp::Mul, we, factor)),
        None => (xe, we),
    };
    let (ae, be) = if cl { (xe, we) } else { (we, xe) };
    let oidx = out_at(n_, mch.clone(), o);
    let e = bias_epilogue(l, Expr::Var(gv.acc), bias, mch, d, out, &oidx)?;
    Ok(vec![gv.gemm(ae, be, e)])
}

/// A convolution's output step: `acc + bias[ch]` cast to `d`, through the group's epilogue
/// into `out` at `oidx`, after the statements computing the bias needs.
pub(super) fn bias_epilogue(
    l: &mut Lowerer,
    acc: Expr,
    bias: tilec_ir::ValueId,
    ch: Expr,
    d: tilec_ir::DType,
    out: tilec_ir::ValueId,
    oidx: &[Expr],
) -> R<Vec<Stmt>> {
    let m = l.begin_block();
    let epi = (|| -> R<Vec<Stmt>> {
        let bv = val(l, bias, &[ch])?;
        let e = l.down(bin(BinOp::Add, acc, bv), d);
        l.epilogue(out, oidx, e)
    })();
    let mut e = l.end_block(m);
    e.extend(epi?);
    Ok(e)
}

/// Per spatial axis, the first tap that reads the input for some output position and the
/// number of taps from it to the last such (all of them when none does: the sum is then
/// zero either way).
fn live_taps(sp: &[i64], kern: &[i64], w: &tilec_ir::op::Window, geo: &[(i64, i64, i64)]) -> (Vec<i64>, Vec<i64>) {
    let mut first = Vec::with_capacity(kern.len());
    let mut count = Vec::with_capacity(kern.len());
    for (j, &k) in kern.iter().enumerate() {
        let (o, pb, _) = geo[j];
        let (s, d) = (w.strides[j] as i64, w.dilations[j] as i64);
        // Output positions `o*s + t*d - pb` cover [t*d - pb, (o-1)*s + t*d - pb].
        let live = |t: i64| t * d - pb < sp[j] && (o - 1) * s + t * d - pb >= 0;
        match ((0..k).find(|&t| live(t)), (0..k).rev().find(|&t| live(t))) {
            (Some(a), Some(b)) => {
                first.push(a);
                count.push(b - a + 1);
            }
            _ => {
                first.push(0);
                count.push(k);
            }
        }
    }
    (first, count)
}

/// `a · f` (or `f · a`) split into `a`, which reads the row variable `i`, and the factor
/// `f`, which does not (it reads only the batch and depth variables); `None` for any other
/// form.
fn depth_factor(e: &Expr, i: VarId) -> Option<(Expr, Expr)> {
    let Expr::Binary(BinOp::Mul, a, b) = e else { return None };
    match (a.uses_var(i), b.uses_var(i)) {
        (true, false) => Some(((**a).clone(), (**b).clone())),
        (false, true) => Some(((**b).clone(), (**a).clone())),
        _ => None,
    }
}

pub(super) fn conv_transpose(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Linalg(LinalgOp::ConvTranspose { strides, dilations: dil, pads, group, .. }) = op else {
        return l.unsupported(n, "not a transposed convolution");
    };
    let group = *group;
    let node = l.node(n);
    let (x, wt, bias, out) = (
        node.inputs[0],
        node.inputs[1],
        node.inputs[2],
        node.outputs[0],
    );
    let (xs, ws, os) = (l.shape(x), l.shape(wt), l.shape(out));
    // As a GEMM: one matrix product per output phase (`conv_transpose.rs`), where it takes
    // the shape; else (and under every other choice) the direct nest below.
    if l.opts().conv == ConvAlgo::Gemm && super::conv_transpose::refusal(&xs, &ws, strides, dil, group).is_none() {
        return super::conv_transpose::lower(l, n, strides, pads, group);
    }
    let d = l.dtype(out);
    let cd = compute_dtype(d);
    let g = group as i64;
    let (c, mg) = (xs[1], ws[1]);
    let cg = c / g;
    let sp: Vec<i64> = xs[2..].to_vec();
    let kern: Vec<i64> = ws[2..].to_vec();
    output_nest(l, &os, &mut |l, oidx| {
        let (n_, mch) = (oidx[0].clone(), oidx[1].clone());
        let grp = bin(BinOp::Div, mch.clone(), Expr::Int(mg));
        let mloc = bin(BinOp::Rem, mch.clone(), Expr::Int(mg));
        let cv = l.loop_var("r", cg);
        let mut loops = vec![(cv, cg)];
        let mut t = Vec::new();
        for &kx in &kern {
            let v = l.loop_var("r", kx);
            loops.push((v, kx));
            t.push(Expr::Var(v));
        }
        let mut cond: Option<Expr> = None;
        let mut coords = Vec::new();
        for j in 0..sp.len() {
            // i * s + t * dil - pb = o  →  i = (o + pb - t * dil) / s when exact.
            let num = bin(
                BinOp::Sub,
                bin(BinOp::Add, oidx[2 + j].clone(), Expr::Int(pads[j])),
                bin(BinOp::Mul, t[j].clone(), Expr::Int(dil[j] as i64)),
            );
            let num = l.simp(num);
            let s = strides[j] as i64;
            let i = l.simp(bin(BinOp::FloorDiv, num.clone(), Expr::Int(s)));
            let ok = bin(
                BinOp::And,
                bin(
                    BinOp::Eq,
                    l.simp(bin(BinOp::FloorMod, num, Expr::Int(s))),
                    Expr::Int(0),
                ),
                bin(
                    BinOp::And,
                    bin(BinOp::Ge, i.clone(), Expr::Int(0)),
                    bin(BinOp::Lt, i.clone(), Expr::Int(sp[j])),
                ),
            );
            cond = Some(match cond {
                None => ok,
                Some(p) => bin(BinOp::And, p, ok),
            });
            coords.push(i);
        }
        let ch = bin(
            BinOp::Add,
            bin(BinOp::Mul, grp, Expr::Int(cg)),
            Expr::Var(cv),
        );
        let acc = l.elem_var("acc", cd, true);
        let mut xi = vec![n_.clone(), ch.clone()];
        xi.extend(coords);
        let mut wi = vec![ch, mloc];
        wi.extend(t.iter().cloned());
        let m2 = l.begin_block();
        let xv = l.guarded(true, |l| val(l, x, &xi));
        let wv = val(l, wt, &wi);
        let inner = l.end_block(m2);
        let sum = DirectSum { acc, cd, loops: &loops, cond };
        sum.finish(l, inner, (xv?, wv?), (bias, mch), (out, oidx, d))
    })
}

/// The reduction of a direct convolution: accumulator `acc` (type `cd`) summed over `loops`,
/// each term counted where `cond` holds (padding, transposed strides).
struct DirectSum<'a> {
    acc: VarId,
    cd: tilec_ir::DType,
    loops: &'a [(VarId, i64)],
    cond: Option<Expr>,
}

impl DirectSum<'_> {
    /// `acc += x * w` at the end of the innermost body `inner`, the accumulator started at zero
    /// around the nest, then `bias[mch]` added and the output's epilogue at `oidx`.
    fn finish(
        self,
        l: &mut Lowerer,
        mut inner: Vec<Stmt>,
        (xv, wv): (Expr, Expr),
        (bias, mch): (tilec_ir::ValueId, Expr),
        (out, oidx, d): (tilec_ir::ValueId, &[Expr], tilec_ir::DType),
    ) -> R<Vec<Stmt>> {
        let acc = self.acc;
        let upd = bin(BinOp::Add, Expr::Var(acc), bin(BinOp::Mul, xv, wv));
        let upd = match self.cond {
            Some(c) => Expr::select(c, upd, Expr::Var(acc)),
            None => upd,
        };
        inner.push(Stmt::Assign { var: acc, value: upd });
        let mut st = vec![Stmt::Let { var: acc, value: lit(0.0, self.cd) }];
        st.extend(Lowerer::nest(self.loops, inner));
        let bv = val(l, bias, &[mch])?;
        st.extend(l.take_lets());
        st.extend(l.epilogue(out, oidx, l.down(bin(BinOp::Add, Expr::Var(acc), bv), d))?);
        Ok(st)
    }
}
