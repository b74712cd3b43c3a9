//! Transposed convolutions as output phases: one [`Gemm`] per phase instead of a scatter.
//!
//! Along an axis with stride `s`, output `o = i·s + t − pb` (input `i`, tap `t`, begin pad
//! `pb`). Split the outputs by their phase `r = o mod s`, `o = q·s + r`: the taps that reach
//! phase `r` are `t = t0 + u·s` with `t0 = (r + pb) mod s`, and they read input
//! `i = q + ⌊(r + pb) / s⌋ − u`. So each phase is an ordinary (stride-1) convolution of the
//! input with the sub-kernel `w[.., t0 :: s]`, a matrix product
//! `out[m, (q..)] = Σ_(c, u..) w[c, m, t0 + u·s] · x[c, q + off − u]` per image and group.
//!
//! Each phase is one `Gemm` (batch: image and group; rows: the output channels of a group;
//! columns: the phase's grid of `⌈(O − r)/s⌉` positions per axis; depth: the input channels
//! of a group times the phase's `⌈(K − t0)/s⌉` taps per axis), so no multiply-add is wasted
//! when `K` is not a multiple of `s`, and a phase that no tap reaches (`K < s`) is a nest
//! storing the bias. The input operand is an implicit im2col (bounds only where the grid and
//! taps leave the input) that the CPU packs with vector loads; the weights are constants
//! packed once ahead of the calls. Every phase runs the group's epilogue at its strided
//! output positions (bias and the fused elementwise ops). Where every phase reads the input
//! alike (same grid, taps and offset: no padding, kernel and output multiples of the stride,
//! as UNet's 2×2 stride 2), the phases are one product whose rows are (phase, channel).
//!
//! Dilations other than 1 are not taken: a dilated tap list per phase is not every `s`-th
//! tap. [`refusal`] says so, and what else the lowering needs.

use tilec_ir::NodeId;

use super::common::val;
use super::conv::bias_epilogue;
use super::matmul::{gemm_vars, operand};
use super::super::{bin, compute_dtype, lit, unravel, Lowerer, R};
use crate::ir::*;

/// Depth (input channels per group × taps per phase) under which the register tiles would
/// run mostly empty.
pub const MIN_DEPTH: i64 = 4;
/// Depth × output channels per group under which a direct nest is as good.
pub const MIN_WORK: i64 = 32;

/// Why a transposed convolution of input shape `xs` (channels-first), weights `ws`
/// (`[C, M/group, *K]`), `strides`, `dilations` and `group` is not lowered as phases
/// (`None`: it is).
pub fn refusal(xs: &[i64], ws: &[i64], strides: &[usize], dilations: &[usize], group: usize) -> Option<String> {
    if xs.len() < 3 || ws.len() != xs.len() || strides.len() + 2 != xs.len() {
        return Some("not a [N, C, spatial...] input".into());
    }
    if dilations.iter().any(|&d| d != 1) {
        return Some(format!("dilations {dilations:?}: a phase's taps are not every stride-th one"));
    }
    let g = group.max(1) as i64;
    let cg = xs[1] / g;
    let mg = ws[1];
    let taps: i64 = ws[2..].iter().zip(strides).map(|(&k, &s)| ceil_div(k, s as i64)).product();
    let depth = cg * taps;
    if depth < MIN_DEPTH || depth * mg < MIN_WORK {
        return Some(format!(
            "a depth of {depth} (channels x taps per phase) and {mg} output channels per group: too small for a matrix product"
        ));
    }
    None
}

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b.max(1)
}

/// One axis of one phase: its residue `r`, grid length `⌈(O − r) / s⌉`, first tap `t0`, taps
/// `⌈(K − t0) / s⌉` and input offset `⌊(r + pb) / s⌋`.
struct AxisPhase {
    r: i64,
    grid: i64,
    t0: i64,
    taps: i64,
    off: i64,
}

fn axis_phase(r: i64, s: i64, k: i64, o: i64, pb: i64) -> AxisPhase {
    let t0 = (r + pb).rem_euclid(s);
    AxisPhase { r, grid: ceil_div((o - r).max(0), s), t0, taps: ceil_div((k - t0).max(0), s), off: (r + pb).div_euclid(s) }
}

/// The phase lowering of transposed convolution `n` (the caller checked [`refusal`]): one
/// `Gemm` per phase with outputs, a bias-only nest for a phase that no tap reaches.
pub(super) fn lower(l: &mut Lowerer, n: NodeId, strides: &[usize], pads: &[i64], group: usize) -> R<Vec<Stmt>> {
    let node = l.node(n);
    let (xs, ws, os) = (l.shape(node.inputs[0]), l.shape(node.inputs[1]), l.shape(node.outputs[0]));
    let nd = xs.len() - 2;
    let s: Vec<i64> = strides.iter().map(|&v| v as i64).collect();
    if xs[2..].iter().all(|&d| d == 1) {
        return pixel(l, n, pads, group);
    }
    let phases: i64 = s.iter().product();
    // Phases that read the input alike (the same grid, taps and offset on every axis: no
    // padding and kernels and outputs multiples of the strides, as UNet's 2×2 stride 2) are
    // one product whose rows are (phase, output channel): the input packed once, not per
    // phase.
    let alike: Option<Vec<AxisPhase>> = (0..nd)
        .map(|j| {
            let a = axis_phase(0, s[j], ws[2 + j], os[2 + j], pads[j]);
            let same = (1..s[j]).all(|r| {
                let b = axis_phase(r, s[j], ws[2 + j], os[2 + j], pads[j]);
                (b.grid, b.taps, b.off) == (a.grid, a.taps, a.off)
            });
            (same && a.grid > 0 && a.taps > 0).then_some(a)
        })
        .collect();
    if let (Some(axes), true) = (alike, phases > 1) {
        return phase(l, n, &s, &axes, group, true);
    }
    let mut out = vec![];
    // Every phase runs the epilogue (stores the group's outputs) from the same state.
    let stored = l.stored();
    for p in 0..phases {
        l.restore_stored(stored.clone());
        // Row-major residues of phase `p` over the strides.
        let mut rest = p;
        let mut axes = Vec::with_capacity(nd);
        for j in (0..nd).rev() {
            axes.push(axis_phase(rest % s[j], s[j], ws[2 + j], os[2 + j], pads[j]));
            rest /= s[j];
        }
        axes.reverse();
        if axes.iter().any(|a| a.grid == 0) {
            continue;
        }
        out.extend(phase(l, n, &s, &axes, group, false)?);
    }
    Ok(out)
}

/// The statements of one phase: `out[img, grp·mg + m, q·s + r] = epilogue(bias + Σ w · x)`;
/// with `stacked`, of every phase at once, row `i` being phase `i / mg` and channel `i % mg`
/// (`axes` then holds what all phases share; residues and first taps follow the row).
fn phase(l: &mut Lowerer, n: NodeId, s: &[i64], axes: &[AxisPhase], group: usize, stacked: bool) -> R<Vec<Stmt>> {
    let node = l.node(n);
    let (x, wt, bias, out) = (node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0]);
    let (xs, ws) = (l.shape(x), l.shape(wt));
    let d = l.dtype(out);
    let cd = compute_dtype(d);
    let g = group as i64;
    let (cg, mg) = (xs[1] / g, ws[1]);
    let grid: Vec<i64> = axes.iter().map(|a| a.grid).collect();
    let per: Vec<i64> = axes.iter().map(|a| a.taps).collect();
    let taps: i64 = per.iter().product();
    let (cols, kk, batch) = (grid.iter().product::<i64>(), cg * taps, xs[0] * g);
    // The output position of grid point `q` and the epilogue there, given the sum `acc`.
    let store = |l: &mut Lowerer, img: Expr, mch: Expr, q: &[Expr], r: &[Expr], acc: Expr| -> R<Vec<Stmt>> {
        let mut oidx = vec![img, mch.clone()];
        for j in 0..axes.len() {
            oidx.push(bin(BinOp::Add, bin(BinOp::Mul, q[j].clone(), Expr::Int(s[j])), r[j].clone()));
        }
        bias_epilogue(l, acc, bias, mch, d, out, &oidx)
    };
    if taps == 0 {
        // No tap reaches these outputs (a kernel shorter than the stride): the bias alone.
        let (vb, vm) = (l.loop_var("b", batch), l.loop_var("m", mg));
        let qv: Vec<VarId> = grid.iter().map(|&e| l.loop_var("q", e)).collect();
        let img = bin(BinOp::Div, Expr::Var(vb), Expr::Int(g));
        let mch = bin(BinOp::Add, bin(BinOp::Mul, bin(BinOp::Rem, Expr::Var(vb), Expr::Int(g)), Expr::Int(mg)), Expr::Var(vm));
        let q: Vec<Expr> = qv.iter().map(|&v| Expr::Var(v)).collect();
        let r: Vec<Expr> = axes.iter().map(|a| Expr::Int(a.r)).collect();
        let body = store(l, img, mch, &q, &r, lit(0.0, cd))?;
        let mut loops = vec![(vb, batch), (vm, mg)];
        loops.extend(qv.iter().copied().zip(grid.iter().copied()));
        return Ok(Lowerer::nest(&loops, body));
    }
    let rows = if stacked { mg * s.iter().product::<i64>() } else { mg };
    let gv = gemm_vars(l, batch, rows, cols, kk, cd);
    // The row's output channel, and per axis its residue and first tap.
    let (m, r, t0): (Expr, Vec<Expr>, Vec<Expr>) = if stacked {
        let r = unravel(bin(BinOp::Div, Expr::Var(gv.i), Expr::Int(mg)), s);
        let t0 = axes.iter().zip(&r).map(|(a, rj)| bin(BinOp::Add, rj.clone(), Expr::Int(a.t0 - a.r))).collect();
        (bin(BinOp::Rem, Expr::Var(gv.i), Expr::Int(mg)), r, t0)
    } else {
        (Expr::Var(gv.i), axes.iter().map(|a| Expr::Int(a.r)).collect(), axes.iter().map(|a| Expr::Int(a.t0)).collect())
    };
    let (vb, vk) = (Expr::Var(gv.b), Expr::Var(gv.k));
    // b = image · g + group; k = channel · taps + (u..); j = (q..).
    let img = bin(BinOp::Div, vb.clone(), Expr::Int(g));
    let grp = bin(BinOp::Rem, vb, Expr::Int(g));
    let cidx = bin(BinOp::Div, vk.clone(), Expr::Int(taps));
    let u = unravel(bin(BinOp::Rem, vk, Expr::Int(taps)), &per);
    let q = unravel(Expr::Var(gv.j), &grid);
    let (mut in_ok, mut t, mut xi) = (vec![], vec![], vec![]);
    for (j, a) in axes.iter().enumerate() {
        t.push(l.simp(bin(BinOp::Add, t0[j].clone(), bin(BinOp::Mul, u[j].clone(), Expr::Int(s[j])))));
        let ij = l.simp(bin(BinOp::Sub, bin(BinOp::Add, q[j].clone(), Expr::Int(a.off)), u[j].clone()));
        // Bounds only where the grid and taps can leave the input.
        if a.off - (a.taps - 1) < 0 {
            in_ok.push(bin(BinOp::Ge, ij.clone(), Expr::Int(0)));
        }
        if a.grid - 1 + a.off >= xs[2 + j] {
            in_ok.push(bin(BinOp::Lt, ij.clone(), Expr::Int(xs[2 + j])));
        }
        xi.push(ij);
    }
    let in_ok = in_ok.into_iter().reduce(|a, b| bin(BinOp::And, a, b));
    let ch = bin(BinOp::Add, bin(BinOp::Mul, grp.clone(), Expr::Int(cg)), cidx);
    let mch = bin(BinOp::Add, bin(BinOp::Mul, grp, Expr::Int(mg)), m.clone());
    // A: the phase's sub-kernel w[c, m, t0 + u·s].
    let mut wi = vec![ch.clone(), m];
    wi.extend(t);
    let we = operand(l, &mut |l| val(l, wt, &wi))?;
    // B: the input at the phase's taps (zero outside it).
    let mut xidx = vec![img.clone(), ch];
    xidx.extend(xi);
    let xe = operand(l, &mut |l| {
        let v = l.guarded(in_ok.is_some(), |l| l.value_at(x, &xidx))?;
        let v = l.up(v, l.dtype(x));
        Ok(match &in_ok {
            Some(c) => Expr::select(c.clone(), v, lit(0.0, cd)),
            None => v,
        })
    })?;
    let epilogue = store(l, img, mch, &q, &r, Expr::Var(gv.acc))?;
    Ok(vec![gv.gemm(we, xe, epilogue)])
}

/// A transposed convolution of a single input position (a generator's first layer, from a
/// latent vector to a 4×4 map): every output position `o` takes tap `o + pb` alone, so per
/// image and group it is one product `x[c] · w[c, (m, o..)]`, a single row against the
/// weights (zero where `o + pb` is past the kernel), with no phase decomposition and none of
/// a phase's taps that read no input.
fn pixel(l: &mut Lowerer, n: NodeId, pads: &[i64], group: usize) -> R<Vec<Stmt>> {
    let node = l.node(n);
    let (x, wt, bias, out) = (node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0]);
    let (xs, ws, os) = (l.shape(x), l.shape(wt), l.shape(out));
    let d = l.dtype(out);
    let cd = compute_dtype(d);
    let nd = xs.len() - 2;
    let g = group as i64;
    let (cg, mg) = (xs[1] / g, ws[1]);
    let mut cols_shape = vec![mg];
    cols_shape.extend(&os[2..]);
    let cols: i64 = cols_shape.iter().product();
    let gv = gemm_vars(l, xs[0] * g, 1, cols, cg, cd);
    let vb = Expr::Var(gv.b);
    let img = bin(BinOp::Div, vb.clone(), Expr::Int(g));
    let grp = bin(BinOp::Rem, vb, Expr::Int(g));
    let ch = bin(BinOp::Add, bin(BinOp::Mul, grp.clone(), Expr::Int(cg)), Expr::Var(gv.k));
    let jj = unravel(Expr::Var(gv.j), &cols_shape);
    let (mut ok, mut t) = (vec![], vec![]);
    for j in 0..nd {
        let tj = l.simp(bin(BinOp::Add, jj[1 + j].clone(), Expr::Int(pads[j])));
        if pads[j] < 0 {
            ok.push(bin(BinOp::Ge, tj.clone(), Expr::Int(0)));
        }
        if os[2 + j] + pads[j] > ws[2 + j] {
            ok.push(bin(BinOp::Lt, tj.clone(), Expr::Int(ws[2 + j])));
        }
        t.push(tj);
    }
    let ok = ok.into_iter().reduce(|a, b| bin(BinOp::And, a, b));
    let mut xidx = vec![img.clone(), ch.clone()];
    xidx.extend(std::iter::repeat_n(Expr::Int(0), nd));
    let xe = operand(l, &mut |l| val(l, x, &xidx))?;
    let mut wi = vec![ch, jj[0].clone()];
    wi.extend(t);
    let we = operand(l, &mut |l| {
        let v = l.guarded(ok.is_some(), |l| val(l, wt, &wi))?;
        Ok(match &ok {
            Some(c) => Expr::select(c.clone(), v, lit(0.0, cd)),
            None => v,
        })
    })?;
    let mch = bin(BinOp::Add, bin(BinOp::Mul, grp, Expr::Int(mg)), jj[0].clone());
    let mut oidx = vec![img, mch.clone()];
    oidx.extend(jj[1..].iter().cloned());
    let e = bias_epilogue(l, Expr::Var(gv.acc), bias, mch, d, out, &oidx)?;
    Ok(vec![gv.gemm(xe, we, e)])
}
