//! Loop-structure primitives: split, reorder, fuse, and the loop-kind annotations unroll,
//! vectorize and parallel; gemm blocking.

use std::collections::{BTreeSet, HashMap};

use super::deps::{iterations_independent, sharing, Region};
use super::{
    atomically, block_mut, err, find_loop, fresh_var, loop_mut, loop_ref, var_name, ScheduleError,
};
use crate::ir::*;

/// The largest extent `unroll` accepts (the back end emits the body that many times).
pub const MAX_UNROLL: i64 = 256;

/// Splits loop `name` (extent `n`) by `factor` into `name_o` (extent `ceil(n / factor)`) around
/// `name_i` (extent `factor`), with `name = name_o * factor + name_i` substituted in the body.
///
/// A factor that does not divide `n` guards the body with `if name_o * factor + name_i < n`
/// (no remainder loop, so the body, and the names of the variables it defines, exist once).
/// A factor larger than `n` is clamped to `n`. The kind of a parallel loop goes to the outer
/// loop; that of a vectorized or unrolled loop to the inner one.
/// Returns the names of the new outer and inner loops.
pub fn split(k: &mut Kernel, name: &str, factor: i64) -> Result<(String, String), ScheduleError> {
    atomically(k, |k| {
        let (o, i) = split_vars(k, name, factor)?;
        Ok((var_name(k, o), var_name(k, i)))
    })
}

/// [`split`] returning the new variables (the kernel is modified in place even on error: callers
/// run it inside `atomically`).
pub(crate) fn split_vars(
    k: &mut Kernel,
    name: &str,
    factor: i64,
) -> Result<(VarId, VarId), ScheduleError> {
    const P: &str = "split";
    let (v, pos) = find_loop(k, P, name)?;
    if factor < 1 {
        return Err(err(
            k,
            P,
            format!("factor {factor} of loop `{name}` must be at least 1"),
        ));
    }
    let l = loop_ref(k, &pos).ok_or_else(|| err(k, P, "loop vanished"))?;
    let (n, kind) = (l.extent, l.kind);
    if n < 0 {
        return Err(err(
            k,
            P,
            format!("loop `{name}` has a negative extent {n}"),
        ));
    }
    let (outer_kind, inner_kind) = match kind {
        LoopKind::Serial => (LoopKind::Serial, LoopKind::Serial),
        LoopKind::Parallel => (LoopKind::Parallel, LoopKind::Serial),
        LoopKind::Vectorized => (LoopKind::Serial, LoopKind::Vectorized),
        LoopKind::Unrolled => (LoopKind::Serial, LoopKind::Unrolled),
        LoopKind::Bound(a) => {
            return Err(err(
                k,
                P,
                format!("loop `{name}` is bound to {a:?}; split it before binding"),
            ));
        }
    };
    let f = factor.min(n).max(1);
    let outer_n = n / f + i64::from(n % f != 0);
    let o = fresh_var(k, &format!("{name}_o"), Ty::Index, false);
    let i = fresh_var(k, &format!("{name}_i"), Ty::Index, false);
    let index = Expr::add(Expr::mul(Expr::Var(o), Expr::Int(f)), Expr::Var(i));
    let vanished = err(k, P, "loop vanished");
    let l = loop_mut(k, &pos).ok_or(vanished)?;
    let mut body = std::mem::take(&mut l.body);
    for s in body.iter_mut() {
        s.substitute(v, &index);
    }
    if n % f != 0 {
        body = vec![Stmt::If {
            cond: Expr::bin(BinOp::Lt, index, Expr::Int(n)),
            then_: body,
            else_: vec![],
        }];
    }
    let inner = Stmt::For(Loop {
        var: i,
        extent: f,
        kind: inner_kind,
        body,
    });
    *l = Loop {
        var: o,
        extent: outer_n,
        kind: outer_kind,
        body: vec![inner],
    };
    Ok((o, i))
}

/// Permutes loops of one perfect nest into the order given (outermost first). The listed loops
/// must lie on a chain of loops each of which is the only statement of the previous one's body;
/// loops of the chain that are not listed keep their depth. Refused when the nest writes an element
/// (or updates a scalar accumulator) from different iterations whose relative order the
/// permutation could change. Listed loops must be serial or unrolled.
pub fn reorder(k: &mut Kernel, loops: &[&str]) -> Result<(), ScheduleError> {
    const P: &str = "reorder";
    atomically(k, |k| {
        if loops.is_empty() {
            return Err(err(k, P, "no loops given"));
        }
        let mut found = vec![];
        for n in loops {
            let (v, pos) = find_loop(k, P, n)?;
            if found.iter().any(|(w, _)| *w == v) {
                return Err(err(k, P, format!("loop `{n}` is listed twice")));
            }
            found.push((v, pos));
        }
        let listed: BTreeSet<VarId> = found.iter().map(|f| f.0).collect();
        let top_pos = found
            .iter()
            .min_by_key(|f| f.1.ancestors.len())
            .map(|f| f.1.clone())
            .unwrap_or_else(|| found[0].1.clone());
        let top = loop_ref(k, &top_pos)
            .ok_or_else(|| err(k, P, "loop vanished"))?
            .clone();
        // Walk the perfect chain from the outermost listed loop down to the last listed one.
        let mut chain: Vec<(VarId, i64, LoopKind)> = vec![];
        let mut cur = &top;
        let mut seen = 0;
        loop {
            chain.push((cur.var, cur.extent, cur.kind));
            if listed.contains(&cur.var) {
                seen += 1;
                if seen == listed.len() {
                    break;
                }
            }
            match cur.body.as_slice() {
                [Stmt::For(inner)] => cur = inner,
                body => {
                    let missing: Vec<String> = listed
                        .iter()
                        .filter(|v| !chain.iter().any(|c| c.0 == **v))
                        .map(|v| format!("`{}`", var_name(k, *v)))
                        .collect();
                    return Err(err(
                        k,
                        P,
                        format!(
                            "loops are not perfectly nested: the body of `{}` has {} statement(s) other than a single loop, so {} cannot be moved across it",
                            var_name(k, cur.var),
                            body.len(),
                            missing.join(", ")
                        ),
                    ));
                }
            }
        }
        let innermost_body = cur.body.clone();
        for (v, _, kind) in &chain {
            if listed.contains(v) && !matches!(kind, LoopKind::Serial | LoopKind::Unrolled) {
                return Err(err(
                    k,
                    P,
                    format!(
                        "loop `{}` is {kind:?}; reorder before annotating loops",
                        var_name(k, *v)
                    ),
                ));
            }
        }
        let old: Vec<VarId> = chain.iter().map(|c| c.0).collect();
        let mut new = old.clone();
        let slots: Vec<usize> = old
            .iter()
            .enumerate()
            .filter(|(_, v)| listed.contains(v))
            .map(|(i, _)| i)
            .collect();
        for (slot, (v, _)) in slots.iter().zip(&found) {
            new[*slot] = *v;
        }
        // Dependences: executions that may touch one element must keep their relative order.
        let region = Region::of(std::slice::from_ref(&Stmt::For(top.clone())));
        for (res, det) in sharing(k, &region, &top_pos.outer_ranges()) {
            let a: Vec<VarId> = old.iter().filter(|v| !det.contains(v)).copied().collect();
            let b: Vec<VarId> = new.iter().filter(|v| !det.contains(v)).copied().collect();
            if a != b {
                let names: Vec<String> =
                    a.iter().map(|v| format!("`{}`", var_name(k, *v))).collect();
                return Err(err(
                    k,
                    P,
                    format!(
                        "{} is updated across iterations of loops {} whose relative order the permutation changes",
                        res.describe(k),
                        names.join(", ")
                    ),
                ));
            }
        }
        let headers: HashMap<VarId, (i64, LoopKind)> =
            chain.iter().map(|&(v, n, kind)| (v, (n, kind))).collect();
        let mut body = innermost_body;
        for v in new.iter().rev() {
            let (extent, kind) = headers[v];
            body = vec![Stmt::For(Loop {
                var: *v,
                extent,
                kind,
                body,
            })];
        }
        let vanished = err(k, P, "loop vanished");
        let block = block_mut(&mut k.body, &top_pos.block).ok_or(vanished)?;
        if let (Some(s), Some(nest)) = (block.get_mut(top_pos.idx), body.pop()) {
            *s = nest;
        }
        Ok(())
    })
}

/// Fuses loop `outer` with the loop `inner` that is the only statement of its body into one loop
/// `outer_inner` of the product extent (`outer = f / n_inner`, `inner = f % n_inner`). The
/// iteration order is unchanged, so fusing is always legal; both loops must be serial.
pub fn fuse(k: &mut Kernel, outer: &str, inner: &str) -> Result<String, ScheduleError> {
    const P: &str = "fuse";
    atomically(k, |k| {
        let (vo, pos) = find_loop(k, P, outer)?;
        let (vi, _) = find_loop(k, P, inner)?;
        let lo = loop_ref(k, &pos).ok_or_else(|| err(k, P, "loop vanished"))?;
        let li = match lo.body.as_slice() {
            [Stmt::For(li)] if li.var == vi => li,
            _ => {
                return Err(err(
                    k,
                    P,
                    format!("loop `{inner}` is not the only statement in the body of `{outer}` (fuse needs a perfect nest)"),
                ))
            }
        };
        if lo.kind != LoopKind::Serial || li.kind != LoopKind::Serial {
            return Err(err(
                k,
                P,
                format!("`{outer}` and `{inner}` must both be serial loops"),
            ));
        }
        let (no, ni) = (lo.extent, li.extent);
        if no < 1 || ni < 1 {
            return Err(err(
                k,
                P,
                format!("cannot fuse loops of extents {no} and {ni}"),
            ));
        }
        let n = no
            .checked_mul(ni)
            .ok_or_else(|| err(k, P, "fused extent overflows"))?;
        let mut body = li.body.clone();
        let f = fresh_var(k, &format!("{outer}_{inner}"), Ty::Index, false);
        let (eo, ei) = (Expr::div(Expr::Var(f), ni), Expr::rem(Expr::Var(f), ni));
        for s in body.iter_mut() {
            s.substitute(vo, &eo);
            s.substitute(vi, &ei);
        }
        let vanished = err(k, P, "loop vanished");
        let l = loop_mut(k, &pos).ok_or(vanished)?;
        *l = Loop {
            var: f,
            extent: n,
            kind: LoopKind::Serial,
            body,
        };
        Ok(var_name(k, f))
    })
}

fn set_kind(k: &mut Kernel, prim: &str, name: &str, kind: LoopKind) -> Result<(), ScheduleError> {
    let (_, pos) = find_loop(k, prim, name)?;
    let cur = loop_ref(k, &pos)
        .map(|l| l.kind)
        .unwrap_or(LoopKind::Serial);
    if cur != LoopKind::Serial && cur != kind {
        return Err(err(k, prim, format!("loop `{name}` is already {cur:?}")));
    }
    if let Some(l) = loop_mut(k, &pos) {
        l.kind = kind;
    }
    Ok(())
}

/// Marks a loop unrolled (extent at most [`MAX_UNROLL`]; split first for longer loops).
pub fn unroll(k: &mut Kernel, name: &str) -> Result<(), ScheduleError> {
    const P: &str = "unroll";
    let (_, pos) = find_loop(k, P, name)?;
    let n = loop_ref(k, &pos).map(|l| l.extent).unwrap_or(0);
    if n > MAX_UNROLL {
        return Err(err(
            k,
            P,
            format!("loop `{name}` has extent {n}, more than {MAX_UNROLL}; split it first"),
        ));
    }
    set_kind(k, P, name, LoopKind::Unrolled)
}

/// Marks an innermost loop (no loop or gemm in its body) vectorized; its iterations must be
/// provably independent.
pub fn vectorize(k: &mut Kernel, name: &str) -> Result<(), ScheduleError> {
    const P: &str = "vectorize";
    let (_, pos) = find_loop(k, P, name)?;
    let l = loop_ref(k, &pos).ok_or_else(|| err(k, P, "loop vanished"))?;
    let inner = Region::of(&l.body);
    if inner.gemms > 0 || (inner.loops > 0 && !small_serial_nest(&l.body)) {
        return Err(err(
            k,
            P,
            format!(
                "loop `{name}` is not innermost (its body contains a gemm or loops of more than \
                 {MAX_INNER_TRIPS} iterations in all)"
            ),
        ));
    }
    iterations_independent(k, l, &pos.outer_ranges()).map_err(|r| err(k, P, r))?;
    set_kind(k, P, name, LoopKind::Vectorized)
}

/// The most iterations the loops inside a vectorized loop may run in all (a convolution or
/// pooling window): the C compiler unrolls them and vectorizes the loop around them.
pub const MAX_INNER_TRIPS: i64 = 64;

/// Whether the loops under `body` are serial (or unrolled) and run at most
/// [`MAX_INNER_TRIPS`] iterations in all.
pub(crate) fn small_serial_nest(body: &[Stmt]) -> bool {
    fn trips(stmts: &[Stmt]) -> Option<i64> {
        let mut total = 0i64;
        for s in stmts {
            match s {
                Stmt::For(l) => {
                    if !matches!(l.kind, LoopKind::Serial | LoopKind::Unrolled) {
                        return None;
                    }
                    let inner = trips(&l.body)?.max(1);
                    total = total.checked_add(l.extent.checked_mul(inner)?)?;
                }
                Stmt::If { then_, else_, .. } => {
                    total = total.checked_add(trips(then_)?.checked_add(trips(else_)?)?)?;
                }
                Stmt::Gemm(_) => return None,
                _ => {}
            }
        }
        Some(total)
    }
    trips(body).is_some_and(|t| t <= MAX_INNER_TRIPS)
}

/// Marks a loop parallel. Its iterations must be provably independent (no scalar accumulator
/// declared outside it is updated, written buffers are touched at disjoint elements), and it may
/// not be nested in, or contain, another parallel loop.
pub fn parallel(k: &mut Kernel, name: &str) -> Result<(), ScheduleError> {
    const P: &str = "parallel";
    let (_, pos) = find_loop(k, P, name)?;
    if let Some((v, _, _)) = pos.ancestors.iter().find(|a| a.2 == LoopKind::Parallel) {
        return Err(err(
            k,
            P,
            format!(
                "loop `{name}` is nested in parallel loop `{}`",
                var_name(k, *v)
            ),
        ));
    }
    let l = loop_ref(k, &pos).ok_or_else(|| err(k, P, "loop vanished"))?;
    let mut nested = None;
    for s in &l.body {
        s.visit(&mut |s| {
            if let Stmt::For(x) = s {
                if x.kind == LoopKind::Parallel && nested.is_none() {
                    nested = Some(x.var);
                }
            }
        });
    }
    if let Some(v) = nested {
        return Err(err(
            k,
            P,
            format!("loop `{name}` contains parallel loop `{}`", var_name(k, v)),
        ));
    }
    iterations_independent(k, l, &pos.outer_ranges()).map_err(|r| err(k, P, r))?;
    set_kind(k, P, name, LoopKind::Parallel)
}

/// Sets the blocking of the gemm whose row variable is named `gemm` (every gemm of the kernel
/// when `None`). All parameters must be positive, `mc` a multiple of `mr` and `nc` of `nr`.
pub fn gemm_blocking(
    k: &mut Kernel,
    gemm: Option<&str>,
    p: GemmParams,
) -> Result<(), ScheduleError> {
    const P: &str = "gemm_blocking";
    if p.mr < 1 || p.nr < 1 || p.kc < 1 || p.mc < 1 || p.nc < 1 {
        return Err(err(
            k,
            P,
            format!("blocking parameters must be positive, got {p:?}"),
        ));
    }
    if p.mc % p.mr != 0 || p.nc % p.nr != 0 {
        return Err(err(
            k,
            P,
            format!("mc must be a multiple of mr and nc of nr, got {p:?}"),
        ));
    }
    if p.mr.checked_mul(p.nr).is_none_or(|x| x > 4096) {
        return Err(err(
            k,
            P,
            format!("register tile {}x{} is too large", p.mr, p.nr),
        ));
    }
    fn go(stmts: &mut [Stmt], want: Option<VarId>, p: GemmParams, n: &mut usize) {
        for s in stmts {
            match s {
                Stmt::Gemm(g) if want.is_none() || want == Some(g.i_var) => {
                    g.params = p;
                    *n += 1;
                }
                Stmt::For(l) => go(&mut l.body, want, p, n),
                Stmt::If { then_, else_, .. } => {
                    go(then_, want, p, n);
                    go(else_, want, p, n);
                }
                _ => {}
            }
        }
    }
    let want = match gemm {
        Some(name) => Some(
            k.var_named(name)
                .ok_or_else(|| err(k, P, format!("no gemm with row variable `{name}`")))?,
        ),
        None => None,
    };
    let mut n = 0;
    let mut body = std::mem::take(&mut k.body);
    go(&mut body, want, p, &mut n);
    k.body = body;
    if n == 0 {
        return Err(err(
            k,
            P,
            match gemm {
                Some(name) => format!("no gemm with row variable `{name}`"),
                None => "the kernel has no gemm".to_string(),
            },
        ));
    }
    Ok(())
}

/// Exchanges the roles of the operands of the gemm whose row variable is named `gemm` (every
/// gemm when `None`): `C = A·B` is computed as `Cᵀ = Bᵀ·Aᵀ`, i.e. `m` and `n`, the row and
/// column variables and the operand expressions swap places. The epilogue still sees each output
/// element under the same variables, and every element is the same sum over `k` in the same
/// order (each product with its factors swapped, which is exact), so results are unchanged. The
/// register tile then runs along the other dimension: worth it when `n` wastes more of a
/// tile's width than `m` would. The gemm's row variable afterwards is the former column one.
pub fn gemm_transpose(k: &mut Kernel, gemm: Option<&str>) -> Result<(), ScheduleError> {
    each_gemm(k, gemm, "gemm_transpose", &mut |g| {
        std::mem::swap(&mut g.m, &mut g.n);
        std::mem::swap(&mut g.i_var, &mut g.j_var);
        std::mem::swap(&mut g.a, &mut g.b);
    })
}

/// Marks the gemm whose row variable is `gemm` (all gemms when absent) for the matrix-vector
/// template (`Gemm::vector`).
pub fn gemm_vector(k: &mut Kernel, gemm: Option<&str>) -> Result<(), ScheduleError> {
    each_gemm(k, gemm, "gemm_vector", &mut |g| g.vector = true)
}

/// Runs `f` on the gemm whose row variable is `gemm` (every gemm when absent); an error for
/// primitive `p` when there is none.
fn each_gemm(k: &mut Kernel, gemm: Option<&str>, p: &str, f: &mut dyn FnMut(&mut Gemm)) -> Result<(), ScheduleError> {
    fn go(stmts: &mut [Stmt], want: Option<VarId>, f: &mut dyn FnMut(&mut Gemm), n: &mut usize) {
        for s in stmts {
            match s {
                Stmt::Gemm(g) if want.is_none() || want == Some(g.i_var) => {
                    f(g);
                    *n += 1;
                }
                Stmt::For(l) => go(&mut l.body, want, f, n),
                Stmt::If { then_, else_, .. } => {
                    go(then_, want, f, n);
                    go(else_, want, f, n);
                }
                _ => {}
            }
        }
    }
    let want = match gemm {
        Some(name) => Some(
            k.var_named(name)
                .ok_or_else(|| err(k, p, format!("no gemm with row variable `{name}`")))?,
        ),
        None => None,
    };
    let mut n = 0;
    let mut body = std::mem::take(&mut k.body);
    go(&mut body, want, f, &mut n);
    k.body = body;
    if n == 0 {
        return Err(err(
            k,
            p,
            match gemm {
                Some(name) => format!("no gemm with row variable `{name}`"),
                None => "the kernel has no gemm".to_string(),
            },
        ));
    }
    Ok(())
}
