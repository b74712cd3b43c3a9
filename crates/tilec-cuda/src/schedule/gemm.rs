//! The SIMT GEMM schedule: a kernel whose body is one [`Stmt::Gemm`] becomes a block-tiled
//! matrix product. Each thread block owns a `BM × BN` tile of one batch's output; per `BK`-deep
//! step of the reduction, the block's 256 threads stage the A and B tiles in shared memory (the
//! operand expressions, im2col and transposes included, evaluated once per element, zero
//! outside the matrix), synchronize, and each thread accumulates a `BM/16 × BN/16` register
//! micro-tile (rows `ty + 16 r`, columns `tx + 16 c`: conflict-free shared reads, coalesced
//! stores). The epilogue runs per output element with the accumulator in the Gemm's own
//! accumulation type (f32 for every float dtype).
//!
//! It keeps the serial semantics: run by the tile interpreter, a scheduled kernel computes what
//! the original does (the GEMM sums in the same order).

use tilec_tile::*;

use super::*;
use crate::error::Result;

/// Threads per GEMM block (a 16 × 16 grid of threads).
pub const GEMM_THREADS: i64 = 256;
/// Depth of one shared-memory stage of the GEMM.
pub const GEMM_BK: i64 = 16;

/// The output tile edge for a matrix dimension: 16, 32 or 64.
fn tile_edge(n: i64) -> i64 {
    if n <= 16 {
        16
    } else if n <= 32 {
        32
    } else {
        64
    }
}

/// Schedules a kernel whose body is a single [`Stmt::Gemm`] as a block-tiled GEMM (see the
/// module documentation).
pub fn schedule_gemm(k: &Kernel) -> Result<Kernel> {
    let g = match k.body.as_slice() {
        [Stmt::Gemm(g)] => (**g).clone(),
        _ => return Err(bad(k, "the body is not a single matrix product")),
    };
    if g.m < 1 || g.n < 1 || g.batch < 1 {
        return Err(bad(k, format!("empty matrix product {}x{}x{} (batch {})", g.m, g.n, g.k, g.batch)));
    }
    let ad = g.acc_dtype;
    let (bm, bn, bk) = (tile_edge(g.m), tile_edge(g.n), GEMM_BK);
    let (tm, tn) = (bm / 16, bn / 16);
    let t_n = GEMM_THREADS;
    let (mt, nt) = ((g.m + bm - 1) / bm, (g.n + bn - 1) / bn);
    let kt_n = (g.k + bk - 1) / bk;
    let blocks = g.batch * mt * nt;
    if blocks > i32::MAX as i64 {
        return Err(bad(k, format!("{blocks} thread blocks exceed the grid limit")));
    }

    let mut out = k.clone();
    let as_ = fresh_buf(&mut out, "gemm_a", ad, vec![bk, bm], Scope::Local);
    let bs = fresh_buf(&mut out, "gemm_b", ad, vec![bk, bn], Scope::Local);
    let acc = fresh_buf(&mut out, "gemm_acc", ad, vec![t_n, tm, tn], Scope::Register);
    let blk = fresh(&mut out, "blk", Ty::Index, false);
    let kt = fresh(&mut out, "kt", Ty::Index, false);
    let tv = |out: &mut Kernel, n: &str| fresh(out, n, Ty::Index, false);
    let (t0, r0, c0) = (tv(&mut out, "t_init"), tv(&mut out, "r_init"), tv(&mut out, "c_init"));
    let (ta, la) = (tv(&mut out, "t_lda"), tv(&mut out, "l_lda"));
    let (tb, lb) = (tv(&mut out, "t_ldb"), tv(&mut out, "l_ldb"));
    let (tc, kk, rc, cc) = (tv(&mut out, "t_mma"), tv(&mut out, "kk"), tv(&mut out, "r_mma"), tv(&mut out, "c_mma"));
    let (te, re, ce) = (tv(&mut out, "t_epi"), tv(&mut out, "r_epi"), tv(&mut out, "c_epi"));

    // Block coordinates.
    let bexpr = Expr::div(v(blk), mt * nt);
    let mi = Expr::rem(Expr::div(v(blk), nt), mt);
    let nj = Expr::rem(v(blk), nt);
    let row0 = Expr::mul(mi, Expr::Int(bm));
    let col0 = Expr::mul(nj, Expr::Int(bn));
    let ty = |t: VarId| Expr::div(v(t), 16);
    let tx = |t: VarId| Expr::rem(v(t), 16);
    let acc_at = |t: VarId, r: VarId, c: VarId| Expr::load(acc, vec![v(t), v(r), v(c)]);

    // acc = 0
    let init = bound(
        t0,
        t_n,
        GpuAxis::ThreadX,
        vec![unrolled(r0, tm, vec![unrolled(c0, tn, vec![Stmt::store(acc, vec![v(t0), v(r0), v(c0)], zero_of(ad))])])],
    );

    // A tile: element f = l * T + t is (ii = f / BK, kk = f % BK): consecutive threads read
    // consecutive k.
    let gk0 = Expr::mul(v(kt), Expr::Int(bk));
    let load_a = {
        let f = Expr::add(Expr::mul(v(la), Expr::Int(t_n)), v(ta));
        let ii = Expr::div(f.clone(), bk);
        let kki = Expr::rem(f, bk);
        let gi = Expr::add(row0.clone(), ii.clone());
        let gk = Expr::add(gk0.clone(), kki.clone());
        let a = g.a.clone().substitute(g.b_var, &bexpr).substitute(g.i_var, &gi).substitute(g.k_var, &gk);
        let a = if k.type_of(&a) == Ty::Elem(ad) { a } else { Expr::cast(ad, a) };
        let cond = and(
            (g.m % bm != 0).then(|| lt(gi.clone(), g.m)),
            (g.k % bk != 0).then(|| lt(gk.clone(), g.k)),
        );
        let dst = vec![kki, ii];
        bound(
            ta,
            t_n,
            GpuAxis::ThreadX,
            vec![Stmt::For(Loop {
                var: la,
                extent: bm * bk / t_n,
                kind: LoopKind::Unrolled,
                body: guard(cond, vec![Stmt::store(as_, dst.clone(), a)], vec![Stmt::store(as_, dst, zero_of(ad))]),
            })],
        )
    };
    // B tile: element f is (kk = f / BN, jj = f % BN): consecutive threads read consecutive j.
    let load_b = {
        let f = Expr::add(Expr::mul(v(lb), Expr::Int(t_n)), v(tb));
        let kki = Expr::div(f.clone(), bn);
        let jj = Expr::rem(f, bn);
        let gj = Expr::add(col0.clone(), jj.clone());
        let gk = Expr::add(gk0.clone(), kki.clone());
        let b = g.b.clone().substitute(g.b_var, &bexpr).substitute(g.j_var, &gj).substitute(g.k_var, &gk);
        let b = if k.type_of(&b) == Ty::Elem(ad) { b } else { Expr::cast(ad, b) };
        let cond = and(
            (g.n % bn != 0).then(|| lt(gj.clone(), g.n)),
            (g.k % bk != 0).then(|| lt(gk.clone(), g.k)),
        );
        let dst = vec![kki, jj];
        bound(
            tb,
            t_n,
            GpuAxis::ThreadX,
            vec![Stmt::For(Loop {
                var: lb,
                extent: bn * bk / t_n,
                kind: LoopKind::Unrolled,
                body: guard(cond, vec![Stmt::store(bs, dst.clone(), b)], vec![Stmt::store(bs, dst, zero_of(ad))]),
            })],
        )
    };
    // acc[r][c] += A[kk][ty + 16 r] * B[kk][tx + 16 c]
    let mma = {
        let a = Expr::load(as_, vec![v(kk), Expr::add(ty(tc), Expr::mul(v(rc), Expr::Int(16)))]);
        let b = Expr::load(bs, vec![v(kk), Expr::add(tx(tc), Expr::mul(v(cc), Expr::Int(16)))]);
        let upd = Stmt::store(acc, vec![v(tc), v(rc), v(cc)], Expr::bin(BinOp::Add, acc_at(tc, rc, cc), Expr::bin(BinOp::Mul, a, b)));
        bound(
            tc,
            t_n,
            GpuAxis::ThreadX,
            vec![Stmt::For(Loop {
                var: kk,
                extent: bk,
                kind: LoopKind::Unrolled,
                body: vec![unrolled(rc, tm, vec![unrolled(cc, tn, vec![upd])])],
            })],
        )
    };
    let kloop = Stmt::for_(kt, kt_n, vec![load_a, load_b, Stmt::Barrier, mma, Stmt::Barrier]);

    // Epilogue per element of the micro-tile.
    let epi = {
        let gi = Expr::add(row0, Expr::add(ty(te), Expr::mul(v(re), Expr::Int(16))));
        let gj = Expr::add(col0, Expr::add(tx(te), Expr::mul(v(ce), Expr::Int(16))));
        let cond = and((g.m % bm != 0).then(|| lt(gi.clone(), g.m)), (g.n % bn != 0).then(|| lt(gj.clone(), g.n)));
        let mut body = vec![
            Stmt::Let { var: g.b_var, value: bexpr.clone() },
            Stmt::Let { var: g.i_var, value: gi },
            Stmt::Let { var: g.j_var, value: gj },
            Stmt::Let { var: g.acc_var, value: acc_at(te, re, ce) },
        ];
        body.extend(g.epilogue.iter().cloned());
        bound(te, t_n, GpuAxis::ThreadX, vec![unrolled(re, tm, vec![unrolled(ce, tn, guard(cond, body, vec![]))])])
    };
    out.body = vec![bound(
        blk,
        blocks,
        GpuAxis::BlockX,
        vec![Stmt::Alloc(as_), Stmt::Alloc(bs), Stmt::Alloc(acc), init, kloop, epi],
    )];
    Ok(out)
}


/// Folds a GEMM's scratch consumer into its epilogue: a kernel `[alloc L; gemm (epilogue ends
/// with L[.., i, j] = v); nest reading L]`, where the nest walks L's elements in order (its
/// flattened iteration index is L's flattened offset in every read) becomes a single GEMM whose
/// epilogue computes the nest's body for element (i, j) with `v` in place of the reads. The
/// lowering spells a GEMM followed by re-indexing consumers (a reshape of its rows) this way;
/// the fused kernel takes the block-tiled GEMM schedule and never materializes L. `None` when
/// the kernel does not have that shape. A consumer that splits L (see [`fuse_split_epilogue`])
/// is folded too.
pub fn fuse_scratch_epilogue(k: &Kernel) -> Option<Kernel> {
    fuse_in_order(k).or_else(|| fuse_split_epilogue(k))
}

fn fuse_in_order(k: &Kernel) -> Option<Kernel> {
    let [Stmt::Alloc(l), Stmt::Gemm(g), nest @ Stmt::For(_)] = k.body.as_slice() else {
        return None;
    };
    let lbuf = k.buf(*l);
    if lbuf.scope != Scope::Local {
        return None;
    }
    // The epilogue's last statement stores the value into L at [b?, i, j], row-major.
    let (last, lets) = g.epilogue.split_last()?;
    let Stmt::Store { buf, index, value } = last else { return None };
    if *buf != *l || value.reads(*l) || lets.iter().any(|s| !matches!(s, Stmt::Let { .. })) {
        return None;
    }
    let want_idx: Vec<Expr> = match lbuf.shape.len() {
        2 if g.batch == 1 => vec![v(g.i_var), v(g.j_var)],
        3 => vec![v(g.b_var), v(g.i_var), v(g.j_var)],
        _ => return None,
    };
    if *index != want_idx || lbuf.numel() != g.batch * g.m * g.n {
        return None;
    }
    // The nest: a perfect chain of serial loops covering L exactly once, in order.
    let (loops, inner) = row_nest(std::slice::from_ref(nest));
    if loops.iter().any(|lp| lp.kind != LoopKind::Serial) || loops.iter().map(|lp| lp.extent).product::<i64>() != lbuf.numel() {
        return None;
    }
    let mut nest_terms = vec![];
    let mut stride = 1i64;
    for lp in loops.iter().rev() {
        nest_terms.push((Expr::Var(lp.var), stride));
        stride *= lp.extent;
    }
    let canon = |terms: &[(Expr, i64)]| {
        canonical(tilec_tile::affine::linear_offset(terms))
    };
    let nest_flat = canon(&nest_terms)?;
    let lstrides = lbuf.strides();
    let mut ok = true;
    let mut stores_l = false;
    for s in inner {
        s.visit(&mut |x| {
            if matches!(x, Stmt::For(_) | Stmt::Gemm(_) | Stmt::Alloc(_) | Stmt::Barrier | Stmt::BlockReduce { .. }) {
                ok = false;
            }
            if let Stmt::Store { buf, .. } = x {
                stores_l |= *buf == *l;
            }
        });
        each_expr_in(s, &mut |e| {
            if let Expr::Load(b, idx) = e {
                if *b == *l {
                    let terms: Vec<(Expr, i64)> = idx.iter().cloned().zip(lstrides.iter().copied()).collect();
                    if canon(&terms) != Some(nest_flat.clone()) {
                        ok = false;
                    }
                }
            }
        });
    }
    if !ok || stores_l {
        return None;
    }
    // Build: lets, `let t = value`, then the nest body with L's reads as t and the nest
    // variables recovered from the element's flat offset (b * M + i) * N + j.
    let mut out = k.clone();
    let tname = format!("{}_v", lbuf.name);
    let t = out.new_var(tname, Ty::Elem(lbuf.dtype), false);
    let flat = Expr::add(
        Expr::mul(Expr::add(Expr::mul(v(g.b_var), Expr::Int(g.m)), v(g.i_var)), Expr::Int(g.n)),
        v(g.j_var),
    );
    let mut epi: Vec<Stmt> = lets.to_vec();
    epi.push(Stmt::Let { var: t, value: value.clone() });
    let mut body: Vec<Stmt> = inner.to_vec();
    let lid = *l;
    for s in body.iter_mut() {
        s.map_exprs(&mut |e| {
            e.rewrite(&mut |x| match x {
                Expr::Load(b, _) if b == lid => Expr::Var(t),
                other => other,
            })
        });
    }
    let mut rest = flat;
    let mut subs = vec![];
    for (d, lp) in loops.iter().enumerate().rev() {
        let e = if d == 0 { rest.clone() } else { Expr::rem(rest.clone(), lp.extent) };
        subs.push((lp.var, e));
        rest = Expr::div(rest, lp.extent);
    }
    for s in body.iter_mut() {
        for (var, e) in &subs {
            s.substitute(*var, e);
        }
    }
    epi.extend(body);
    let mut g2 = (**g).clone();
    g2.epilogue = epi;
    out.body = vec![Stmt::Gemm(Box::new(g2))];
    Some(out)
}

/// [`fuse_scratch_epilogue`] for a consumer that splits L: a kernel `[alloc L; gemm (epilogue
/// ends with L[b?, i, j] = v); nest]` whose nest has one loop per dimension of L and whose
/// statements (stores, after lets that do not read L) each read L at the nest's variables
/// shifted by constants, `L[x0 + c0, x1 + c1]` (a split of a QKV product into Q, K and V).
/// The epilogue then runs, for element (i, j), each statement whose shifted window holds it,
/// with `x_d = g_d - c_d` and `v` in place of the read. `None` when the kernel does not have
/// that shape.
fn fuse_split_epilogue(k: &Kernel) -> Option<Kernel> {
    let [Stmt::Alloc(l), Stmt::Gemm(g), nest @ Stmt::For(_)] = k.body.as_slice() else {
        return None;
    };
    let lbuf = k.buf(*l);
    let (last, lets) = g.epilogue.split_last()?;
    let Stmt::Store { buf, index, value } = last else { return None };
    if lbuf.scope != Scope::Local || *buf != *l || value.reads(*l) || lets.iter().any(|s| !matches!(s, Stmt::Let { .. })) {
        return None;
    }
    let gvars: Vec<VarId> = match lbuf.shape.len() {
        2 if g.batch == 1 => vec![g.i_var, g.j_var],
        3 => vec![g.b_var, g.i_var, g.j_var],
        _ => return None,
    };
    if *index != gvars.iter().map(|&x| v(x)).collect::<Vec<_>>() {
        return None;
    }
    let (loops, inner) = row_nest(std::slice::from_ref(nest));
    if loops.len() < gvars.len() || loops.iter().any(|lp| lp.kind != LoopKind::Serial) {
        return None;
    }
    // A read `L[x0 + c0, ..]` where each index is a contiguous run of the nest's loops
    // flattened row-major (one loop, or several: a reshape of L's rows such as
    // `[b * 512 + s, ..]`) plus a constant shift; the runs cover the loops in order. Each
    // dimension's (first loop, end, shift), when the read has that form.
    let shift_of = |idx: &[Expr]| -> Option<Vec<(usize, usize, i64)>> {
        let mut next = 0usize;
        let mut dims = vec![];
        for (d, e) in idx.iter().enumerate() {
            let (atoms, c) = tilec_tile::affine::linear_offset(&[(e.clone(), 1)])?;
            let start = next;
            let mut stride = 1i64;
            let mut run: Vec<(i64, usize)> = vec![];
            for (coef, a) in atoms {
                let Expr::Var(x) = a else { return None };
                let pos = loops.iter().position(|lp| lp.var == x)?;
                run.push((coef, pos));
            }
            run.sort_by_key(|r| std::cmp::Reverse(r.1));
            // Innermost first: coefficients 1, extent, extent * extent', ...
            let end = run.first()?.1 + 1;
            for (i, &(coef, pos)) in run.iter().enumerate() {
                if pos != end - 1 - i || coef != stride {
                    return None;
                }
                stride *= loops[pos].extent;
            }
            if end - run.len() != start {
                return None;
            }
            next = end;
            dims.push((start, end, c));
            // The last dimension takes the remaining loops.
            if d + 1 == idx.len() && next != loops.len() {
                return None;
            }
        }
        Some(dims)
    };
    let mut shared_lets = vec![];
    let mut parts: Vec<(Vec<(usize, usize, i64)>, Stmt)> = vec![];
    for s in inner {
        let mut bad = false;
        s.visit(&mut |x| bad |= !matches!(x, Stmt::Store { .. } | Stmt::Let { .. }));
        let mut shifts: Vec<Option<Vec<(usize, usize, i64)>>> = vec![];
        each_expr_in(s, &mut |e| {
            e.visit(&mut |x| {
                if let Expr::Load(b, idx) = x {
                    if *b == *l {
                        shifts.push(shift_of(idx));
                    }
                }
            })
        });
        if bad || matches!(s, Stmt::Store { buf, .. } if *buf == *l) {
            return None;
        }
        match (s, shifts.first()) {
            (Stmt::Let { .. }, None) if parts.is_empty() => shared_lets.push(s.clone()),
            (Stmt::Store { .. }, Some(Some(c))) if shifts.iter().all(|x| x.as_ref() == Some(c)) => parts.push((c.clone(), s.clone())),
            _ => return None,
        }
    }
    if parts.is_empty() {
        return None;
    }
    let mut out = k.clone();
    let t = out.new_var(format!("{}_v", lbuf.name), Ty::Elem(lbuf.dtype), false);
    let mut epi: Vec<Stmt> = lets.to_vec();
    epi.push(Stmt::Let { var: t, value: value.clone() });
    let lid = *l;
    for (shift, store) in parts {
        let mut body: Vec<Stmt> = shared_lets.clone();
        body.push(store);
        let mut cond: Option<Expr> = None;
        for (&gv, &(start, end, c)) in gvars.iter().zip(&shift) {
            let x = Expr::add(v(gv), Expr::Int(-c));
            // The run's loops recovered from the flat index: the innermost is x % extent, the
            // next (x / extent) % extent', ..., the outermost a plain quotient.
            let mut below = 1i64;
            for pos in (start..end).rev() {
                let lp = &loops[pos];
                let q = if below == 1 { x.clone() } else { Expr::Binary(BinOp::Div, Box::new(x.clone()), Box::new(Expr::Int(below))) };
                let val = if pos == start { q } else { Expr::Binary(BinOp::Rem, Box::new(q), Box::new(Expr::Int(lp.extent))) };
                for st in body.iter_mut() {
                    st.substitute(lp.var, &val);
                }
                below *= lp.extent;
            }
            let inside = Expr::Binary(
                BinOp::And,
                Box::new(Expr::Binary(BinOp::Ge, Box::new(x.clone()), Box::new(Expr::Int(0)))),
                Box::new(Expr::Binary(BinOp::Lt, Box::new(x), Box::new(Expr::Int(below)))),
            );
            cond = Some(match cond {
                None => inside,
                Some(p) => Expr::Binary(BinOp::And, Box::new(p), Box::new(inside)),
            });
        }
        for st in body.iter_mut() {
            st.map_exprs(&mut |e| {
                e.rewrite(&mut |x| match x {
                    Expr::Load(b, _) if b == lid => Expr::Var(t),
                    other => other,
                })
            });
        }
        epi.push(Stmt::If { cond: cond?, then_: body, else_: vec![] });
    }
    let mut g2 = (**g).clone();
    g2.epilogue = epi;
    out.body = vec![Stmt::Gemm(Box::new(g2))];
    Some(out)
}

/// An affine offset in a canonical order (atoms sorted by their printed form), for equality.
fn canonical(x: Option<(Vec<(i64, Expr)>, i64)>) -> Option<(Vec<(i64, String)>, i64)> {
    let (atoms, k) = x?;
    let mut a: Vec<(i64, String)> = atoms.into_iter().map(|(c, e)| (c, format!("{e:?}"))).collect();
    a.sort_by(|p, q| p.1.cmp(&q.1).then(p.0.cmp(&q.0)));
    Some((a, k))
}

