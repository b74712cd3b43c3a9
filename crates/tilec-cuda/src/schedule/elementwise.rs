//! The elementwise schedule: a perfect loop nest whose innermost body stores element by
//! element becomes a loop over 16-byte vectors, a few per thread in an unrolled loop, with the
//! grid covering the tensor (or a grid-stride loop, on request).

use tilec_tile::*;

use super::*;
use crate::error::Result;

/// Schedules an elementwise kernel (a perfect loop nest storing element by element) over
/// 16-byte vectors: each thread handles a few vectors in an unrolled loop (their loads are in
/// flight together) and the grid covers the whole tensor, so that a kernel whose register use
/// lowers the resident blocks per SM does not leave a partly filled last wave behind.
pub fn schedule_elementwise(k: &Kernel, target: &GpuTarget) -> Result<Kernel> {
    schedule_elementwise_with(k, target, None)
}

/// [`schedule_elementwise`] with the vectors per thread fixed: `Some(0)` is a grid-stride loop
/// over a grid sized for `target.blocks_per_sm` resident blocks per SM; `None` picks 4 vectors
/// per thread for large tensors and 1 for small ones.
pub fn schedule_elementwise_with(
    k: &Kernel,
    target: &GpuTarget,
    vectors_per_thread: Option<i64>,
) -> Result<Kernel> {
    let (loops, body) = row_nest(&k.body);
    if loops.is_empty() {
        return Err(bad(k, "no loop nest"));
    }
    if loops.iter().any(|l| matches!(l.kind, LoopKind::Bound(_))) {
        return Err(bad(k, "already bound to GPU axes"));
    }
    for s in body {
        let mut ok = true;
        s.visit(&mut |x| {
            if matches!(
                x,
                Stmt::For(_)
                    | Stmt::Gemm(_)
                    | Stmt::Barrier
                    | Stmt::BlockReduce { .. }
                    | Stmt::Alloc(_)
                    | Stmt::Assign { .. }
            ) {
                ok = false
            }
        });
        if !ok {
            return Err(bad(
                k,
                "the innermost body is not elementwise (loops, allocations or accumulators inside)",
            ));
        }
    }
    let n: i64 = loops.iter().map(|l| l.extent).product();
    let c = loops.last().map(|l| l.extent).unwrap_or(1);
    let lanes = vector_lanes(c, &global_dtypes(k, body));
    let threads = 256i64.min(target.max_threads_per_block as i64).max(32);
    let nv = n / lanes;
    let waves_of = |u: i64| nv / (threads * u * (target.sm_count as i64).max(1) * 8);
    let per_thread = match vectors_per_thread {
        Some(u) => u.max(0),
        None if waves_of(4) >= 4 => 4,
        None => 1,
    };
    // Grid-stride (per_thread == 0): a grid of resident blocks looping over the tensor;
    // otherwise every block covers `threads * per_thread` consecutive vectors once.
    let grid_stride = per_thread == 0
        || (nv + threads * per_thread - 1) / (threads * per_thread) > i32::MAX as i64;
    let (blocks, iters) = if grid_stride {
        let max_blocks = (target.sm_count as i64 * target.blocks_per_sm as i64).max(1);
        let blocks = ((nv + threads - 1) / threads).clamp(1, max_blocks);
        (blocks, (nv + blocks * threads - 1) / (blocks * threads))
    } else {
        let per_thread = per_thread.min((nv + threads - 1) / threads).max(1);
        ((nv + threads * per_thread - 1) / (threads * per_thread), per_thread)
    };

    let mut out = k.clone();
    let b = fresh(&mut out, "blk", Ty::Index, false);
    let t = fresh(&mut out, "thr", Ty::Index, false);
    let it = fresh(&mut out, "it", Ty::Index, false);
    let f = fresh(&mut out, "vec", Ty::Index, false);
    let v = fresh(&mut out, "lane", Ty::Index, false);
    // Element index = f * V + v; the last loop variable = (f % (C/V)) * V + v, the others from
    // f / (C/V).
    let cv = c / lanes;
    let vars: Vec<(VarId, i64)> = loops.iter().map(|l| (l.var, l.extent)).collect();
    let mut subs = decompose(&vars[..vars.len() - 1], Expr::div(Expr::Var(f), cv));
    let lane_expr = if lanes > 1 {
        Expr::Var(v)
    } else {
        Expr::Int(0)
    };
    let last = Expr::add(
        Expr::mul(Expr::rem(Expr::Var(f), cv), Expr::Int(lanes)),
        lane_expr,
    );
    subs.push((vars[vars.len() - 1].0, last));
    let mut inner = body.to_vec();
    subst_all(&mut inner, &subs);
    let inner = if lanes > 1 {
        vec![Stmt::For(Loop {
            var: v,
            extent: lanes,
            kind: LoopKind::Vectorized,
            body: inner,
        })]
    } else {
        inner
    };
    // Grid-stride: vector (it * blocks + blk) * threads + thr; blocked: (blk * iters + it) *
    // threads + thr. Both keep a warp's accesses consecutive.
    let chunk = if grid_stride {
        Expr::add(Expr::mul(Expr::Var(it), Expr::Int(blocks)), Expr::Var(b))
    } else {
        Expr::add(Expr::mul(Expr::Var(b), Expr::Int(iters)), Expr::Var(it))
    };
    let fval = Expr::add(Expr::mul(chunk, Expr::Int(threads)), Expr::Var(t));
    let mut per_iter = vec![Stmt::Let {
        var: f,
        value: fval,
    }];
    if blocks * threads * iters != nv {
        per_iter.push(Stmt::If {
            cond: Expr::bin(BinOp::Lt, Expr::Var(f), Expr::Int(nv)),
            then_: inner,
            else_: vec![],
        });
    } else {
        per_iter.extend(inner);
    }
    let itloop = if iters == 1 {
        let mut p = per_iter;
        subst_all(&mut p, &[(it, Expr::Int(0))]);
        p
    } else if grid_stride {
        vec![Stmt::for_(it, iters, per_iter)]
    } else {
        vec![Stmt::For(Loop {
            var: it,
            extent: iters,
            kind: LoopKind::Unrolled,
            body: per_iter,
        })]
    };
    out.body = vec![Stmt::For(Loop {
        var: b,
        extent: blocks,
        kind: LoopKind::Bound(GpuAxis::BlockX),
        body: vec![Stmt::For(Loop {
            var: t,
            extent: threads,
            kind: LoopKind::Bound(GpuAxis::ThreadX),
            body: itloop,
        })],
    })];
    Ok(out)
}

