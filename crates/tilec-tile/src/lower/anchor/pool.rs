//! Window kernels: pools over spatial windows, global pools, and LRN's window over channels.

use tilec_ir::op::{window_geometry, LinalgOp, NormOp, PoolKind, Window};
use tilec_ir::{DType, NodeId, Op};

use super::common::{accumulate, neg_inf, outer_space, output_nest, val};
use super::super::{bin, compute_dtype, lit, lit_i, Lowerer, R};
use crate::ir::*;

/// Per spatial axis: (output length, pad begin, pad end).
pub(super) fn geometry(
    l: &Lowerer,
    n: NodeId,
    xs_sp: &[i64],
    w: &Window,
    ceil: bool,
) -> R<Vec<(i64, i64, i64)>> {
    let mut v = Vec::new();
    for (i, &s) in xs_sp.iter().enumerate() {
        match window_geometry(s as usize, w, i, ceil) {
            Ok((o, pb, pe)) => v.push((o as i64, pb as i64, pe as i64)),
            Err(e) => return l.unsupported(n, e),
        }
    }
    Ok(v)
}

pub(super) fn pool(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Linalg(LinalgOp::Pool { kind, window: w, ceil_mode, channels_last }) = op else {
        return l.unsupported(n, "not a pool");
    };
    let (ceil, cl) = (*ceil_mode, *channels_last);
    let node = l.node(n);
    let x = node.inputs[0];
    let outs = node.outputs.clone();
    let xs = l.shape(x);
    let r = xs.len();
    let d = l.dtype(x);
    let cd = compute_dtype(d);
    let sp_axes: Vec<usize> = if cl {
        (1..r - 1).collect()
    } else {
        (2..r).collect()
    };
    let c_axis = if cl { r - 1 } else { 1 };
    let sp: Vec<i64> = sp_axes.iter().map(|&a| xs[a]).collect();
    let geo = geometry(l, n, &sp, w, ceil)?;
    let want_idx = matches!(kind, PoolKind::Max { indices: true, .. })
        && outs.len() > 1
        && l.is_used(outs[1]);
    let column_major = matches!(
        kind,
        PoolKind::Max {
            column_major: true,
            ..
        }
    );
    let oshape = l.shape(outs[0]);
    let kernel: Vec<i64> = w.kernel.iter().map(|&k| k as i64).collect();
    if cl && !want_idx && r >= 3 && xs[r - 1] > 1 && l.opts().pool == super::super::PoolAlgo::ChannelBlocks {
        return pool_channels_last(l, x, outs[0], kind, w, &geo, &oshape);
    }
    let kind = kind.clone();
    output_nest(l, &oshape, &mut |l, oidx| {
        // Accumulators: value (max or sum), count (avg) or best index (max with indices).
        let mut accs = vec![(
            cd,
            match kind {
                PoolKind::Max { .. } => neg_inf(cd),
                _ => lit(0.0, cd),
            },
        )];
        let count_acc = matches!(kind, PoolKind::Avg { .. });
        if count_acc || want_idx {
            accs.push((DType::I64, lit_i(if want_idx { -1 } else { 0 }, DType::I64)));
        }
        let mut rvars = Vec::new();
        let mut loops = Vec::new();
        for &k in &kernel {
            let v = l.loop_var("r", k);
            loops.push((v, k));
            rvars.push(Expr::Var(v));
        }
        let mut vars = Vec::new();
        let mut st = Vec::new();
        for (dt, init) in accs {
            let a = l.elem_var("acc", dt, true);
            st.push(Stmt::Let {
                var: a,
                value: init,
            });
            vars.push(a);
        }
        // Tap coordinates.
        let mut xi = oidx.to_vec();
        let mut inside: Option<Expr> = None;
        let mut in_pad: Option<Expr> = None;
        let mut coords = Vec::new();
        for (j, &a) in sp_axes.iter().enumerate() {
            let (_, pb, pe) = geo[j];
            let c = bin(
                BinOp::Sub,
                bin(
                    BinOp::Add,
                    bin(BinOp::Mul, oidx[a].clone(), Expr::Int(w.strides[j] as i64)),
                    bin(
                        BinOp::Mul,
                        rvars[j].clone(),
                        Expr::Int(w.dilations[j] as i64),
                    ),
                ),
                Expr::Int(pb),
            );
            let c = l.simp(c);
            let ok = bin(
                BinOp::And,
                bin(BinOp::Ge, c.clone(), Expr::Int(0)),
                bin(BinOp::Lt, c.clone(), Expr::Int(sp[j])),
            );
            inside = Some(match inside {
                None => ok,
                Some(p) => bin(BinOp::And, p, ok),
            });
            let okp = bin(BinOp::Lt, c.clone(), Expr::Int(sp[j] + pe));
            in_pad = Some(match in_pad {
                None => okp,
                Some(p) => bin(BinOp::And, p, okp),
            });
            xi[a] = c.clone();
            coords.push(c);
        }
        let inside = inside.unwrap_or(Expr::Lit(Lit::Bool(true)));
        let in_pad = in_pad.unwrap_or(Expr::Lit(Lit::Bool(true)));
        let m = l.begin_block();
        let v = l.guarded(true, |l| val(l, x, &xi));
        let mut inner = l.end_block(m);
        let v = v?;
        let a0 = Expr::Var(vars[0]);
        match kind {
            PoolKind::Max { .. } if want_idx => {
                let bi = Expr::Var(vars[1]);
                // A select, not `and`: the load must not be evaluated outside the input.
                let better = Expr::select(
                    inside.clone(),
                    bin(
                        BinOp::Or,
                        bin(BinOp::Lt, bi.clone(), lit_i(0, DType::I64)),
                        bin(BinOp::Gt, v.clone(), a0.clone()),
                    ),
                    Expr::Lit(Lit::Bool(false)),
                );
                let t = l.elem_var("t", DType::Bool, false);
                inner.push(Stmt::Let {
                    var: t,
                    value: better,
                });
                // Flat spatial index of the tap (row-major, or column-major spatial part).
                let mut flat = Expr::Int(0);
                if column_major {
                    let mut stride = 1;
                    for (j, c) in coords.iter().enumerate() {
                        flat = bin(
                            BinOp::Add,
                            flat,
                            bin(BinOp::Mul, c.clone(), Expr::Int(stride)),
                        );
                        stride *= sp[j];
                    }
                } else {
                    for (j, c) in coords.iter().enumerate() {
                        let stride: i64 = sp[j + 1..].iter().product();
                        flat = bin(
                            BinOp::Add,
                            flat,
                            bin(BinOp::Mul, c.clone(), Expr::Int(stride)),
                        );
                    }
                }
                let flat = l.simp(flat);
                inner.push(Stmt::Assign {
                    var: vars[0],
                    value: Expr::select(Expr::Var(t), v, a0.clone()),
                });
                inner.push(Stmt::Assign {
                    var: vars[1],
                    value: Expr::select(Expr::Var(t), Expr::cast(DType::I64, flat), bi),
                });
            }
            PoolKind::Max { .. } => {
                inner.push(Stmt::Assign {
                    var: vars[0],
                    value: Expr::select(inside, bin(BinOp::Max, a0.clone(), v), a0.clone()),
                });
            }
            PoolKind::Avg { count_include_pad } => {
                inner.push(Stmt::Assign {
                    var: vars[0],
                    value: Expr::select(inside.clone(), bin(BinOp::Add, a0.clone(), v), a0.clone()),
                });
                let cnt_if = if count_include_pad { in_pad } else { inside };
                let c1 = Expr::Var(vars[1]);
                inner.push(Stmt::Assign {
                    var: vars[1],
                    value: Expr::select(
                        cnt_if,
                        bin(BinOp::Add, c1.clone(), lit_i(1, DType::I64)),
                        c1,
                    ),
                });
            }
            PoolKind::Lp { p } => {
                let t = bin(BinOp::Pow, Expr::un(UnOp::Abs, v), lit(p as f64, cd));
                inner.push(Stmt::Assign {
                    var: vars[0],
                    value: Expr::select(inside, bin(BinOp::Add, a0.clone(), t), a0.clone()),
                });
            }
        }
        st.extend(Lowerer::nest(&loops, inner));
        let res = match kind {
            PoolKind::Max { .. } => a0.clone(),
            PoolKind::Avg { count_include_pad } => {
                let c = Expr::cast(cd, Expr::Var(vars[1]));
                let c = if count_include_pad {
                    bin(BinOp::Max, c, lit(1.0, cd))
                } else {
                    c
                };
                bin(BinOp::Div, a0.clone(), c)
            }
            PoolKind::Lp { p } => bin(BinOp::Pow, a0.clone(), lit(1.0 / p as f64, cd)),
        };
        st.extend(l.take_lets());
        st.extend(l.epilogue(outs[0], oidx, l.down(res, d))?);
        if want_idx {
            // Plane offset: (n * C + c) * prod(spatial).
            let spn: i64 = sp.iter().product();
            let plane = bin(
                BinOp::Add,
                bin(BinOp::Mul, oidx[0].clone(), Expr::Int(xs[c_axis])),
                oidx[c_axis].clone(),
            );
            let bi = bin(BinOp::Max, Expr::Var(vars[1]), lit_i(0, DType::I64));
            let e = bin(
                BinOp::Add,
                Expr::cast(DType::I64, bin(BinOp::Mul, plane, Expr::Int(spn))),
                bi,
            );
            st.extend(l.epilogue(outs[1], oidx, e)?);
        }
        Ok(st)
    })
}

/// A channels-last window pool `[N, *S, C] → [N, *S', C]`, vectorized along the channels:
/// per output position one accumulator per channel in a local buffer, the window's taps in
/// the loops around a contiguous loop over the channels (each tap inside the input adds its
/// row of channels; the tap's bounds check is one branch for all of them), then the result
/// and the group's epilogue per channel. The per-element form puts the taps innermost, under
/// a vector loop over channels that the C compiler then fails to vectorize.
fn pool_channels_last(l: &mut Lowerer, x: tilec_ir::ValueId, out: tilec_ir::ValueId, kind: &PoolKind, w: &Window, geo: &[(i64, i64, i64)], oshape: &[i64]) -> R<Vec<Stmt>> {
    let xs = l.shape(x);
    let r = xs.len();
    let d = l.dtype(x);
    let cd = compute_dtype(d);
    let c = xs[r - 1];
    let (pos_loops, pos) = l.index_space(&oshape[..r - 1], "i");
    let (acc, op, mut body) = channel_accumulators(l, kind, cd, c, POOL_CHANNEL);
    let count = matches!(kind, PoolKind::Avg { .. }).then(|| l.elem_var("cnt", DType::I64, true));
    if let Some(cnt) = count {
        body.push(Stmt::Let { var: cnt, value: lit_i(0, DType::I64) });
    }
    // The taps: per spatial axis its coordinate, inside the input or not, inside the padded
    // input or not.
    let mut taps = Vec::new();
    let mut xi = pos.clone();
    let (mut inside, mut in_pad) = (Expr::Lit(Lit::Bool(true)), Expr::Lit(Lit::Bool(true)));
    for (j, &(_, pb, pe)) in geo.iter().enumerate() {
        let k = w.kernel[j] as i64;
        let rv = l.loop_var("r", k);
        taps.push((rv, k));
        let at = bin(
            BinOp::Sub,
            bin(
                BinOp::Add,
                bin(BinOp::Mul, pos[j + 1].clone(), Expr::Int(w.strides[j] as i64)),
                bin(BinOp::Mul, Expr::Var(rv), Expr::Int(w.dilations[j] as i64)),
            ),
            Expr::Int(pb),
        );
        let at = l.simp(at);
        let s = xs[j + 1];
        let ok = bin(BinOp::And, bin(BinOp::Ge, at.clone(), Expr::Int(0)), bin(BinOp::Lt, at.clone(), Expr::Int(s)));
        inside = if j == 0 { ok } else { bin(BinOp::And, inside, ok) };
        let okp = bin(BinOp::Lt, at.clone(), Expr::Int(s + pe));
        in_pad = if j == 0 { okp } else { bin(BinOp::And, in_pad, okp) };
        xi[j + 1] = at;
    }
    let ci = l.loop_var(POOL_CHANNEL, c);
    xi.push(Expr::Var(ci));
    let per_channel = accumulate_channel(l, x, &xi, kind, cd, (acc, op, ci), true)?;
    let mut then_ = vec![Stmt::for_(ci, c, per_channel)];
    let mut tap_body = vec![];
    if let (Some(cnt), PoolKind::Avg { count_include_pad }) = (count, kind) {
        let plus1 = bin(BinOp::Add, Expr::Var(cnt), lit_i(1, DType::I64));
        if *count_include_pad {
            tap_body.push(Stmt::Assign { var: cnt, value: Expr::select(in_pad, plus1, Expr::Var(cnt)) });
        } else {
            then_.insert(0, Stmt::Assign { var: cnt, value: plus1 });
        }
    }
    tap_body.push(Stmt::If { cond: inside, then_, else_: vec![] });
    body.extend(Lowerer::nest(&taps, tap_body));
    // The result and the epilogue per channel.
    let ci = l.loop_var(POOL_CHANNEL, c);
    let a = Expr::Load(acc, vec![Expr::Var(ci)]);
    let res = match (kind, count) {
        (PoolKind::Avg { count_include_pad }, Some(cnt)) => {
            let n = Expr::cast(cd, Expr::Var(cnt));
            let n = if *count_include_pad { bin(BinOp::Max, n, lit(1.0, cd)) } else { n };
            bin(BinOp::Div, a, n)
        }
        (PoolKind::Lp { p }, _) => bin(BinOp::Pow, a, lit(1.0 / *p as f64, cd)),
        _ => a,
    };
    let mut oidx = pos;
    oidx.push(Expr::Var(ci));
    let m = l.begin_block();
    let e = l.down(res, d);
    let st = l.epilogue(out, &oidx, e);
    let mut fin = l.end_block(m);
    fin.extend(st?);
    body.push(Stmt::for_(ci, c, fin));
    Ok(Lowerer::nest(&pos_loops, body))
}

/// The loop name prefix of [`pool_channels_last`]'s channel loops (vectorized).
pub const POOL_CHANNEL: &str = "plc";

/// A local buffer of `c` accumulators (dtype `cd`) for a pool of `kind` along the channels,
/// the op that accumulates into it, and the statements that allocate it and set it to the
/// op's identity (a loop named `name`).
fn channel_accumulators(l: &mut Lowerer, kind: &PoolKind, cd: DType, c: i64, name: &'static str) -> (BufId, BinOp, Vec<Stmt>) {
    let acc = l.scratch(cd, vec![c]);
    let (init, op) = match kind {
        PoolKind::Max { .. } => (neg_inf(cd), BinOp::Max),
        _ => (lit(0.0, cd), BinOp::Add),
    };
    let ci = l.loop_var(name, c);
    let body = vec![Stmt::Alloc(acc), Stmt::for_(ci, c, vec![Stmt::store(acc, vec![Expr::Var(ci)], init)])];
    (acc, op, body)
}

/// The body of a channel loop `ci` that adds `x` at `idx` (its last index `ci`) into its
/// accumulator `acc[ci]` with `op` (Lp pools add `|x|^p`); `guarded`: the read sits under a
/// bounds check, so nothing it reads is hoisted out of it.
fn accumulate_channel(l: &mut Lowerer, x: tilec_ir::ValueId, idx: &[Expr], kind: &PoolKind, cd: DType, (acc, op, ci): (BufId, BinOp, VarId), guarded: bool) -> R<Vec<Stmt>> {
    let m = l.begin_block();
    let v = l.guarded(guarded, |l| val(l, x, idx));
    let mut body = l.end_block(m);
    let t = match kind {
        PoolKind::Lp { p } => bin(BinOp::Pow, Expr::un(UnOp::Abs, v?), lit(*p as f64, cd)),
        _ => v?,
    };
    body.push(Stmt::store(acc, vec![Expr::Var(ci)], bin(op, Expr::Load(acc, vec![Expr::Var(ci)]), t)));
    Ok(body)
}

pub(super) fn global_pool(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Linalg(LinalgOp::GlobalPool { kind, channels_last: cl }) = op else {
        return l.unsupported(n, "not a global pool");
    };
    let cl = *cl;
    let node = l.node(n);
    let (x, out) = (node.inputs[0], node.outputs[0]);
    let xs = l.shape(x);
    let r = xs.len();
    // (Empty images or channels: the per-output form, which has nothing to divide.)
    if cl && r >= 3 && xs[0] > 0 && xs[r - 1] > 0 && l.opts().pool == super::super::PoolAlgo::ChannelBlocks {
        return global_pool_channels_last(l, x, out, kind, &xs);
    }
    let d = l.dtype(x);
    let cd = compute_dtype(d);
    let sp: Vec<usize> = if cl {
        (1..r - 1).collect()
    } else {
        (2..r).collect()
    };
    let cnt: i64 = sp.iter().map(|&a| xs[a]).product();
    let row: Vec<(usize, i64)> = sp.iter().map(|&a| (a, xs[a])).collect();
    let (loops, base) = outer_space(l, &xs, &sp);
    let m = l.begin_block();
    let (init, op) = match kind {
        PoolKind::Max { .. } => (neg_inf(cd), BinOp::Max),
        _ => (lit(0.0, cd), BinOp::Add),
    };
    let kind2 = kind.clone();
    let (mut body, acc) = accumulate(l, &row, &base, vec![(cd, init)], &mut |l, i, a| {
        let v = val(l, x, i)?;
        let t = match kind2 {
            PoolKind::Lp { p } => bin(BinOp::Pow, Expr::un(UnOp::Abs, v), lit(p as f64, cd)),
            _ => v,
        };
        Ok(vec![bin(op, a[0].clone(), t)])
    })?;
    let res = match kind {
        PoolKind::Max { .. } => acc[0].clone(),
        PoolKind::Avg { .. } => bin(BinOp::Div, acc[0].clone(), lit(cnt as f64, cd)),
        PoolKind::Lp { p } => bin(BinOp::Pow, acc[0].clone(), lit(1.0 / *p as f64, cd)),
    };
    body.extend(l.take_lets());
    body.extend(l.epilogue(out, &base, l.down(res, d))?);
    let mut inner = l.end_block(m);
    inner.extend(body);
    Ok(Lowerer::nest(&loops, inner))
}

/// The loop name prefixes of [`global_pool_channels_last`]: the blocks of channels (made
/// parallel by the default schedule) and the channel loops inside (vectorized).
pub const GLOBAL_POOL_BLOCK: &str = "gpblk";
pub const GLOBAL_POOL_CHANNEL: &str = "gpc";

/// Channels per block of a channels-last global pool over `n` images: a divisor of `c` up
/// to 64 that is a multiple of 8 (whole vectors), the largest that still gives two blocks or
/// more (one per thread); else all the channels.
pub fn global_pool_block(n: i64, c: i64) -> i64 {
    let fits: Vec<i64> = (8..=64.min(c)).rev().filter(|&d| d % 8 == 0 && c % d == 0).collect();
    fits.iter().copied().find(|&d| n * (c / d) >= 2).or(fits.first().copied()).unwrap_or(c)
}

/// A channels-last global pool `[N, *S, C] → [N, 1.., C]`, vectorized along the channels:
/// per image and block of channels (the parallel loop) one accumulator per channel in a
/// local buffer, a pass over the spatial positions adding each row of channels to it (a
/// contiguous, vectorizable loop), then the result and the group's epilogue per channel.
/// The accumulate-per-channel form reads the input once, in order, where a loop per
/// channel over the positions would stride through it `C` times.
fn global_pool_channels_last(l: &mut Lowerer, x: tilec_ir::ValueId, out: tilec_ir::ValueId, kind: &PoolKind, xs: &[i64]) -> R<Vec<Stmt>> {
    let r = xs.len();
    let d = l.dtype(x);
    let cd = compute_dtype(d);
    let (nb, c) = (xs[0], xs[r - 1]);
    let cnt: i64 = xs[1..r - 1].iter().product();
    let cb = global_pool_block(nb, c);
    let per_image = c / cb;
    let blk = l.loop_var(GLOBAL_POOL_BLOCK, nb * per_image);
    let n_e = l.simp(bin(BinOp::Div, Expr::Var(blk), Expr::Int(per_image)));
    let c0 = l.simp(bin(BinOp::Mul, bin(BinOp::Rem, Expr::Var(blk), Expr::Int(per_image)), Expr::Int(cb)));
    let (acc, op, mut body) = channel_accumulators(l, kind, cd, cb, GLOBAL_POOL_CHANNEL);
    // acc = op(acc, f(x)) over the positions
    let sp: Vec<(VarId, i64)> = xs[1..r - 1].iter().map(|&e| (l.loop_var("gps", e), e)).collect();
    let ci = l.loop_var(GLOBAL_POOL_CHANNEL, cb);
    let ch = l.simp(bin(BinOp::Add, c0.clone(), Expr::Var(ci)));
    let mut idx = vec![n_e.clone()];
    idx.extend(sp.iter().map(|&(v, _)| Expr::Var(v)));
    idx.push(ch);
    let inner = accumulate_channel(l, x, &idx, kind, cd, (acc, op, ci), false)?;
    body.extend(Lowerer::nest(&sp, vec![Stmt::for_(ci, cb, inner)]));
    // the result and the epilogue
    let ci = l.loop_var(GLOBAL_POOL_CHANNEL, cb);
    let ch = l.simp(bin(BinOp::Add, c0, Expr::Var(ci)));
    let a = Expr::Load(acc, vec![Expr::Var(ci)]);
    let res = match kind {
        PoolKind::Max { .. } => a,
        PoolKind::Avg { .. } => bin(BinOp::Div, a, lit(cnt as f64, cd)),
        PoolKind::Lp { p } => bin(BinOp::Pow, a, lit(1.0 / *p as f64, cd)),
    };
    let mut oidx = vec![n_e];
    oidx.extend((1..r - 1).map(|_| Expr::Int(0)));
    oidx.push(ch);
    let m = l.begin_block();
    let e = l.down(res, d);
    let st = l.epilogue(out, &oidx, e);
    let mut fin = l.end_block(m);
    fin.extend(st?);
    body.push(Stmt::for_(ci, cb, fin));
    Ok(vec![Stmt::for_(blk, nb * per_image, body)])
}

/// Local response normalization: each element over a window of channels around its own.
pub(super) fn lrn(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Norm(NormOp::Lrn { size, alpha, beta, bias, channels_last }) = *op else {
        return l.unsupported(n, "not a local response normalization");
    };
    let node = l.node(n);
    let (x, y) = (node.inputs[0], node.outputs[0]);
    let xs = l.shape(x);
    let d = l.dtype(x);
    let cd = compute_dtype(d);
    // The channel axis: 1, or the last one when channels-last.
    let cax = if channels_last { xs.len() - 1 } else { 1 };
    let c = xs[cax];
    let (lo, hi) = ((size as i64 - 1) / 2, (size as i64 - 1 + 1) / 2);
    let (alpha, beta, bias, size) =
        (alpha as f64, beta as f64, bias as f64, size as i64);
    output_nest(l, &xs, &mut |l, idx| {
        let ch = idx[cax].clone();
        let mut st = Vec::new();
        // Window over channels ch - lo ..= ch + hi, clipped to 0..C.
        let wv = l.loop_var("r", lo + hi + 1);
        let a = l.elem_var("acc", cd, true);
        st.push(Stmt::Let {
            var: a,
            value: lit(0.0, cd),
        });
        let k = bin(
            BinOp::Add,
            bin(BinOp::Sub, ch.clone(), Expr::Int(lo)),
            Expr::Var(wv),
        );
        let inside = bin(
            BinOp::And,
            bin(BinOp::Ge, k.clone(), Expr::Int(0)),
            bin(BinOp::Lt, k.clone(), Expr::Int(c)),
        );
        let mut xi = idx.to_vec();
        xi[cax] = k;
        let m = l.begin_block();
        let v = l.guarded(true, |l| val(l, x, &xi));
        let lets = l.end_block(m);
        let v = v?;
        let sq = bin(BinOp::Mul, v.clone(), v);
        let mut inner = lets;
        inner.push(Stmt::Assign {
            var: a,
            value: Expr::select(inside, bin(BinOp::Add, Expr::Var(a), sq), Expr::Var(a)),
        });
        st.push(Stmt::for_(wv, lo + hi + 1, inner));
        let xv = val(l, x, idx)?;
        let den = bin(
            BinOp::Pow,
            bin(
                BinOp::Add,
                lit(bias, cd),
                bin(BinOp::Mul, lit(alpha / size as f64, cd), Expr::Var(a)),
            ),
            lit(beta, cd),
        );
        let e = l.down(bin(BinOp::Div, xv, den), d);
        st.extend(l.take_lets());
        st.extend(l.epilogue(y, idx, e)?);
        Ok(st)
    })
}
