//! Memory primitives: cache_read, cache_write and compute_at.

use std::collections::BTreeSet;

use super::affine::{Affine, AffineCx, Ranges};
use super::deps::Region;
use super::{
    atomically, block_mut, block_ref, err, find_buffer, find_loop, fresh_buffer, fresh_var,
    loop_mut, loop_ref, var_name, CacheScope, LoopPos, ScheduleError,
};
use crate::ir::*;

/// Largest cache buffer in register scope, in elements.
pub const MAX_REGISTER_ELEMS: i64 = 256;
/// Largest cache buffer in local scope, in bytes (it lives on the stack of a thread).
pub const MAX_LOCAL_BYTES: i64 = 256 * 1024;

/// The box of one buffer dimension touched by a region: `base + 0 .. base + ext`, where `base`
/// depends only on variables fixed during the region.
#[derive(Clone, Debug)]
struct DimRegion {
    base: Affine,
    ext: i64,
    /// The whole dimension (the accesses could not be bounded more tightly).
    full: bool,
}

/// The bounding box of `accesses` to a buffer of `shape`, with the variables of `varying`
/// ranging over `ranges` and every other variable fixed.
fn regions(
    cx: &AffineCx,
    accesses: &[Vec<Expr>],
    shape: &[i64],
    varying: &BTreeSet<VarId>,
    ranges: &Ranges,
) -> Vec<DimRegion> {
    (0..shape.len())
        .map(|d| {
            let full = DimRegion {
                base: Affine::constant(0),
                ext: shape[d],
                full: true,
            };
            let mut fixed0: Option<Affine> = None;
            let (mut lo, mut hi) = (i64::MAX, i64::MIN);
            for ix in accesses {
                let Some(a) = ix.get(d).and_then(|e| cx.affine(e)) else {
                    return full;
                };
                let (fixed, moving) = a.split_by(varying);
                let Some((mlo, mhi)) = moving.bounds(ranges) else {
                    return full;
                };
                match &fixed0 {
                    None => fixed0 = Some(fixed),
                    Some(f) if *f == fixed => {}
                    Some(_) => return full,
                }
                lo = lo.min(a.c.saturating_add(mlo));
                hi = hi.max(a.c.saturating_add(mhi));
            }
            let Some(fixed) = fixed0 else { return full };
            let ext = hi.saturating_sub(lo).saturating_add(1);
            if ext <= 0 || ext >= shape[d] {
                return full;
            }
            match fixed.add(&Affine::constant(lo)) {
                Some(base) => DimRegion {
                    base,
                    ext,
                    full: false,
                },
                None => full,
            }
        })
        .collect()
}

/// Whether `base + 0..ext` provably stays at or above 0, and below `size`, for every value of
/// the outer variables.
fn in_bounds(r: &DimRegion, size: i64, outer: &Ranges) -> (bool, bool) {
    if r.full {
        return (true, true);
    }
    match r.base.bounds(outer) {
        Some((lo, hi)) => (lo >= 0, hi.checked_add(r.ext).is_some_and(|e| e <= size)),
        None => (false, false),
    }
}

/// The index of an access rewritten relative to the region's box.
fn relative(cx: &AffineCx, idx: &[Expr], dims: &[DimRegion]) -> Option<Vec<Expr>> {
    idx.iter()
        .zip(dims)
        .map(|(e, r)| {
            if r.full {
                Some(e.clone())
            } else {
                Some(cx.affine(e)?.sub(&r.base)?.to_expr())
            }
        })
        .collect()
}

/// Points loads (and, with `stores`, stores) of `b` in `stmts` at `cache`, with indices mapped by
/// `f`. Returns false when some index could not be mapped.
fn retarget(
    stmts: &mut [Stmt],
    b: BufId,
    cache: BufId,
    stores: bool,
    f: &mut dyn FnMut(&[Expr]) -> Option<Vec<Expr>>,
) -> bool {
    let mut ok = true;
    let expr = |e: &mut Expr, f: &mut dyn FnMut(&[Expr]) -> Option<Vec<Expr>>, ok: &mut bool| {
        let old = std::mem::replace(e, Expr::Int(0));
        *e = old.rewrite(&mut |e| match e {
            Expr::Load(x, idx) if x == b => match f(&idx) {
                Some(n) => Expr::Load(cache, n),
                None => {
                    *ok = false;
                    Expr::Load(x, idx)
                }
            },
            e => e,
        });
    };
    for s in stmts {
        match s {
            Stmt::For(l) => ok &= retarget(&mut l.body, b, cache, stores, f),
            Stmt::Store { buf, index, value } => {
                for e in index.iter_mut() {
                    expr(e, f, &mut ok);
                }
                expr(value, f, &mut ok);
                if stores && *buf == b {
                    match f(index) {
                        Some(n) => {
                            *buf = cache;
                            *index = n;
                        }
                        None => ok = false,
                    }
                }
            }
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => expr(value, f, &mut ok),
            Stmt::If { cond, then_, else_ } => {
                expr(cond, f, &mut ok);
                ok &= retarget(then_, b, cache, stores, f);
                ok &= retarget(else_, b, cache, stores, f);
            }
            Stmt::Gemm(g) => {
                expr(&mut g.a, f, &mut ok);
                expr(&mut g.b, f, &mut ok);
                ok &= retarget(&mut g.epilogue, b, cache, stores, f);
            }
            Stmt::Alloc(_) | Stmt::Barrier | Stmt::BlockReduce { .. } => {}
        }
    }
    ok
}

fn and(a: Option<Expr>, b: Expr) -> Option<Expr> {
    Some(match a {
        None => b,
        Some(a) => Expr::bin(BinOp::And, a, b),
    })
}

/// `0 <= e < size` for each dimension that is not provably in bounds.
fn bounds_guard(dims: &[DimRegion], idx: &[Expr], shape: &[i64], outer: &Ranges) -> Option<Expr> {
    let mut cond = None;
    for ((r, e), &n) in dims.iter().zip(idx).zip(shape) {
        let (low_ok, high_ok) = in_bounds(r, n, outer);
        if !low_ok {
            cond = and(cond, Expr::bin(BinOp::Ge, e.clone(), Expr::Int(0)));
        }
        if !high_ok {
            cond = and(cond, Expr::bin(BinOp::Lt, e.clone(), Expr::Int(n)));
        }
    }
    cond
}

/// A loop nest over the box `dims` running `mk(cache index, buffer index)` where the buffer
/// index is in bounds.
fn copy_nest(
    k: &mut Kernel,
    prefix: &str,
    dims: &[DimRegion],
    shape: &[i64],
    outer: &Ranges,
    kind: LoopKind,
    mk: impl Fn(Vec<Expr>, Vec<Expr>) -> Stmt,
) -> Stmt {
    let vars: Vec<VarId> = (0..dims.len())
        .map(|d| fresh_var(k, &format!("{prefix}{d}"), Ty::Index, false))
        .collect();
    let cidx: Vec<Expr> = vars.iter().map(|v| Expr::Var(*v)).collect();
    let bidx: Vec<Expr> = dims
        .iter()
        .zip(&vars)
        .map(|(r, v)| Expr::add(r.base.to_expr(), Expr::Var(*v)))
        .collect();
    let guard = bounds_guard(dims, &bidx, shape, outer);
    let mut s = mk(cidx, bidx);
    if let Some(cond) = guard {
        s = Stmt::If {
            cond,
            then_: vec![s],
            else_: vec![],
        };
    }
    for (d, v) in vars.iter().enumerate().rev() {
        s = Stmt::For(Loop {
            var: *v,
            extent: dims[d].ext,
            kind,
            body: vec![s],
        });
    }
    s
}

fn check_size(
    k: &Kernel,
    prim: &str,
    buf: &str,
    dtype: tilec_ir::DType,
    shape: &[i64],
    scope: CacheScope,
) -> Result<(), ScheduleError> {
    let n: i64 = shape
        .iter()
        .try_fold(1i64, |a, &d| a.checked_mul(d))
        .unwrap_or(i64::MAX);
    match scope {
        CacheScope::Register if n > MAX_REGISTER_ELEMS => Err(err(
            k,
            prim,
            format!("the region of `{buf}` has {n} elements, more than {MAX_REGISTER_ELEMS} for a register cache"),
        )),
        CacheScope::Local if n.saturating_mul(dtype.size_bytes() as i64) > MAX_LOCAL_BYTES => Err(err(
            k,
            prim,
            format!("the region of `{buf}` ({shape:?}) exceeds {MAX_LOCAL_BYTES} bytes for a local cache"),
        )),
        _ => Ok(()),
    }
}

fn cache_name(k: &Kernel, b: BufId, scope: CacheScope) -> String {
    format!(
        "{}_{}",
        k.buf(b).name,
        match scope {
            CacheScope::Local => "local",
            CacheScope::Register => "reg",
        }
    )
}

struct Prepared {
    b: BufId,
    pos: LoopPos,
    region: Region,
    dims: Vec<DimRegion>,
    outer: Ranges,
}

fn prepare(
    k: &Kernel,
    prim: &str,
    buffer: &str,
    at: &str,
    with_stores: bool,
) -> Result<Prepared, ScheduleError> {
    let b = find_buffer(k, prim, buffer)?;
    let (_, pos) = find_loop(k, prim, at)?;
    let l = loop_ref(k, &pos).ok_or_else(|| err(k, prim, "loop vanished"))?;
    let region = Region::of(std::slice::from_ref(&Stmt::For(l.clone())));
    if region.allocs.contains(&b) {
        return Err(err(
            k,
            prim,
            format!("buffer `{buffer}` is allocated inside loop `{at}`"),
        ));
    }
    let outer = pos.outer_ranges();
    let mut ranges = outer.clone();
    ranges.extend(region.ranges.iter().map(|(k, v)| (*k, *v)));
    let mut accesses: Vec<Vec<Expr>> = region
        .loads
        .iter()
        .filter(|l| l.0 == b)
        .map(|l| l.1.clone())
        .collect();
    if with_stores {
        accesses.extend(
            region
                .stores
                .iter()
                .filter(|s| s.0 == b)
                .map(|s| s.1.clone()),
        );
    }
    let cx = AffineCx::new(k);
    let dims = regions(&cx, &accesses, &k.buf(b).shape, &region.defined, &ranges);
    Ok(Prepared {
        b,
        pos,
        region,
        dims,
        outer,
    })
}

/// Stages the part of `buffer` read inside loop `at` into a new buffer (`<buffer>_local` or
/// `<buffer>_reg`) filled by a copy nest placed just before the loop; the loop's loads of
/// `buffer` read the cache instead. The staged part is the bounding box of the loads (per
/// dimension; a dimension whose indices are not quasi-affine is staged whole). `buffer` must not
/// be written inside the loop. Returns the cache's name.
pub fn cache_read(
    k: &mut Kernel,
    buffer: &str,
    at: &str,
    scope: CacheScope,
) -> Result<String, ScheduleError> {
    const P: &str = "cache_read";
    atomically(k, |k| {
        let pr = prepare(k, P, buffer, at, false)?;
        if pr.region.writes(pr.b) {
            return Err(err(
                k,
                P,
                format!("buffer `{buffer}` is written inside loop `{at}` (use cache_write)"),
            ));
        }
        if !pr.region.reads(pr.b) {
            return Err(err(
                k,
                P,
                format!("buffer `{buffer}` is not read inside loop `{at}`"),
            ));
        }
        let src = k.buf(pr.b).clone();
        let shape: Vec<i64> = pr.dims.iter().map(|d| d.ext).collect();
        check_size(k, P, buffer, src.dtype, &shape, scope)?;
        let snapshot = k.clone();
        let cx = AffineCx::new(&snapshot);
        let name = cache_name(k, pr.b, scope);
        let cache = fresh_buffer(k, &name, src.dtype, shape, scope.scope());
        let cname = k.buf(cache).name.clone();
        let kind = if scope == CacheScope::Register {
            LoopKind::Unrolled
        } else {
            LoopKind::Serial
        };
        let b = pr.b;
        let copy = copy_nest(
            k,
            &format!("{cname}_c"),
            &pr.dims,
            &src.shape,
            &pr.outer,
            kind,
            |c, i| Stmt::store(cache, c, Expr::load(b, i)),
        );
        let dims = pr.dims.clone();
        let l = loop_mut(k, &pr.pos).ok_or_else(|| err(&snapshot, P, "loop vanished"))?;
        let ok = retarget(&mut l.body, b, cache, false, &mut |idx| {
            relative(&cx, idx, &dims)
        });
        if !ok {
            return Err(err(
                &snapshot,
                P,
                format!("could not rewrite the loads of `{buffer}`"),
            ));
        }
        let block = block_mut(&mut k.body, &pr.pos.block)
            .ok_or_else(|| err(&snapshot, P, "loop vanished"))?;
        block.splice(pr.pos.idx..pr.pos.idx, [Stmt::Alloc(cache), copy]);
        Ok(cname)
    })
}

/// Redirects the loads and stores of `buffer` inside loop `at` to a new buffer covering their
/// bounding box, copied back to `buffer` just after the loop. The cache is first filled from
/// `buffer` unless the loop provably overwrites the whole box before reading it (a single,
/// unconditional store whose index runs over every element of the box, and no loads). Returns
/// the cache's name.
pub fn cache_write(
    k: &mut Kernel,
    buffer: &str,
    at: &str,
    scope: CacheScope,
) -> Result<String, ScheduleError> {
    const P: &str = "cache_write";
    atomically(k, |k| {
        let pr = prepare(k, P, buffer, at, true)?;
        if !pr.region.writes(pr.b) {
            return Err(err(
                k,
                P,
                format!("buffer `{buffer}` is not written inside loop `{at}`"),
            ));
        }
        let src = k.buf(pr.b).clone();
        let shape: Vec<i64> = pr.dims.iter().map(|d| d.ext).collect();
        check_size(k, P, buffer, src.dtype, &shape, scope)?;
        let snapshot = k.clone();
        let cx = AffineCx::new(&snapshot);
        let covered = overwrites_box(&cx, &pr);
        let name = cache_name(k, pr.b, scope);
        let cache = fresh_buffer(k, &name, src.dtype, shape, scope.scope());
        let cname = k.buf(cache).name.clone();
        let kind = if scope == CacheScope::Register {
            LoopKind::Unrolled
        } else {
            LoopKind::Serial
        };
        let b = pr.b;
        let copy_in = (!covered).then(|| {
            copy_nest(
                k,
                &format!("{cname}_c"),
                &pr.dims,
                &src.shape,
                &pr.outer,
                kind,
                |c, i| Stmt::store(cache, c, Expr::load(b, i)),
            )
        });
        let copy_out = copy_nest(
            k,
            &format!("{cname}_w"),
            &pr.dims,
            &src.shape,
            &pr.outer,
            kind,
            |c, i| Stmt::store(b, i, Expr::load(cache, c)),
        );
        let dims = pr.dims.clone();
        let l = loop_mut(k, &pr.pos).ok_or_else(|| err(&snapshot, P, "loop vanished"))?;
        let ok = retarget(&mut l.body, b, cache, true, &mut |idx| {
            relative(&cx, idx, &dims)
        });
        if !ok {
            return Err(err(
                &snapshot,
                P,
                format!("could not rewrite the accesses of `{buffer}`"),
            ));
        }
        let block = block_mut(&mut k.body, &pr.pos.block)
            .ok_or_else(|| err(&snapshot, P, "loop vanished"))?;
        let i = pr.pos.idx;
        block.insert(i + 1, copy_out);
        let mut before = vec![Stmt::Alloc(cache)];
        before.extend(copy_in);
        block.splice(i..i, before);
        Ok(cname)
    })
}

/// Whether the loop's single unconditional store writes every element of the box and nothing
/// reads the buffer inside the loop.
fn overwrites_box(cx: &AffineCx, pr: &Prepared) -> bool {
    if pr.region.reads(pr.b) {
        return false;
    }
    let stores: Vec<_> = pr.region.stores.iter().filter(|s| s.0 == pr.b).collect();
    let [(_, idx, false)] = stores.as_slice() else {
        return false;
    };
    let mut used = BTreeSet::new();
    for (e, r) in idx.iter().zip(&pr.dims) {
        let Some(a) = cx.affine(e) else { return false };
        let Some(rel) = a.sub(&r.base) else {
            return false;
        };
        let var = match rel.terms.iter().next() {
            Some((super::affine::Atom::Var(v), 1)) if rel.terms.len() == 1 && rel.c == 0 => *v,
            _ => return false,
        };
        if !pr.region.defined.contains(&var)
            || pr.region.ranges.get(&var) != Some(&(0, r.ext.saturating_sub(1)))
            || !used.insert(var)
        {
            return false;
        }
    }
    true
}

/// Moves the loop nest `producer`, which fills a local buffer, to the start of the body of loop
/// `at` (which must come after it in the same block, possibly nested) and shrinks both the nest
/// and the buffer to the part one iteration of `at` reads.
///
/// Supported producers: a perfect chain of loops whose (single) store index is the list of the
/// chain's variables (each loop running over its whole buffer dimension), writing only that
/// buffer, reading neither it nor anything the statements up to `at` write, and updating no outer
/// scalar; the body below the chain is arbitrary (inner reductions, lets). The buffer must be
/// allocated before the producer in the same block and used only by the producer and inside `at`.
/// Row-wise producer/consumer pairs (`T[i, :]` computed, then read by iteration `i` of the
/// consumer) are the typical case.
pub fn compute_at(k: &mut Kernel, producer: &str, at: &str) -> Result<(), ScheduleError> {
    const P: &str = "compute_at";
    atomically(k, |k| {
        let (_, ppos) = find_loop(k, P, producer)?;
        let (cv, cpos) = find_loop(k, P, at)?;
        let depth = ppos.block.len();
        let j = if cpos.block.len() >= depth && cpos.block[..depth] == ppos.block[..] {
            if cpos.block.len() == depth {
                cpos.idx
            } else {
                cpos.block[depth].0
            }
        } else {
            return Err(err(
                k,
                P,
                format!("loop `{at}` is not in the block of producer `{producer}`"),
            ));
        };
        if j <= ppos.idx {
            return Err(err(
                k,
                P,
                format!("loop `{at}` does not come after producer `{producer}`"),
            ));
        }
        let block = block_ref(&k.body, &ppos.block)
            .ok_or_else(|| err(k, P, "loop vanished"))?
            .clone();
        let Some(Stmt::For(p)) = block.get(ppos.idx).cloned() else {
            return Err(err(k, P, "loop vanished"));
        };
        let preg = Region::of(std::slice::from_ref(&Stmt::For(p.clone())));
        let written = preg.written_bufs();
        let t = match written.iter().collect::<Vec<_>>().as_slice() {
            [t] => **t,
            [] => return Err(err(k, P, format!("producer `{producer}` writes no buffer"))),
            _ => {
                return Err(err(
                    k,
                    P,
                    format!("producer `{producer}` writes more than one buffer"),
                ))
            }
        };
        let tbuf = k.buf(t).clone();
        if tbuf.scope == Scope::Global {
            return Err(err(k, P, format!("producer `{producer}` writes global buffer `{}`; only local buffers can be moved", tbuf.name)));
        }
        if let Some(v) = preg.carried_scalars().into_iter().next() {
            return Err(err(
                k,
                P,
                format!(
                    "producer `{producer}` updates `{}`, declared outside it",
                    var_name(k, v)
                ),
            ));
        }
        if preg.reads(t) {
            return Err(err(
                k,
                P,
                format!(
                    "producer `{producer}` reads the buffer `{}` it writes",
                    tbuf.name
                ),
            ));
        }
        if preg.gemms > 0 {
            return Err(err(k, P, format!("producer `{producer}` contains a gemm")));
        }
        let alloc_idx = block
            .iter()
            .position(|s| matches!(s, Stmt::Alloc(x) if *x == t))
            .filter(|&i| i < ppos.idx)
            .ok_or_else(|| {
                err(
                    k,
                    P,
                    format!(
                        "buffer `{}` is not allocated before producer `{producer}` in its block",
                        tbuf.name
                    ),
                )
            })?;
        // The store index must be the chain's variables.
        let idx0 = preg.stores[0].1.clone();
        if idx0.len() != tbuf.shape.len() {
            return Err(err(
                k,
                P,
                format!(
                    "buffer `{}` of rank {} is stored with {} indices",
                    tbuf.name,
                    tbuf.shape.len(),
                    idx0.len()
                ),
            ));
        }
        if preg.stores.iter().any(|s| s.1 != idx0) {
            return Err(err(
                k,
                P,
                format!(
                    "producer `{producer}` stores `{}` at more than one index",
                    tbuf.name
                ),
            ));
        }
        let mut dim_vars = vec![];
        for e in &idx0 {
            match e {
                Expr::Var(v) if !dim_vars.contains(v) => dim_vars.push(*v),
                _ => {
                    return Err(err(
                        k,
                        P,
                        format!("producer `{producer}` must store `{}` at an index made of its loop variables", tbuf.name),
                    ))
                }
            }
        }
        let mut chain: Vec<(VarId, i64, LoopKind)> = vec![];
        let mut cur = &p;
        loop {
            chain.push((cur.var, cur.extent, cur.kind));
            if dim_vars.iter().all(|v| chain.iter().any(|c| c.0 == *v)) {
                break;
            }
            match cur.body.as_slice() {
                [Stmt::For(inner)] => cur = inner,
                _ => {
                    return Err(err(
                        k,
                        P,
                        format!(
                        "the loops of producer `{producer}` indexing `{}` are not perfectly nested",
                        tbuf.name
                    ),
                    ))
                }
            }
        }
        for &(v, n, kind) in &chain {
            let Some(d) = dim_vars.iter().position(|x| *x == v) else {
                return Err(err(
                    k,
                    P,
                    format!(
                        "producer loop `{}` does not index `{}`",
                        var_name(k, v),
                        tbuf.name
                    ),
                ));
            };
            if n != tbuf.shape[d] {
                return Err(err(
                    k,
                    P,
                    format!(
                        "producer loop `{}` runs over {n} of the {} rows of dimension {d} of `{}`",
                        var_name(k, v),
                        tbuf.shape[d],
                        tbuf.name
                    ),
                ));
            }
            if kind == LoopKind::Parallel {
                return Err(err(
                    k,
                    P,
                    format!("producer loop `{}` is parallel", var_name(k, v)),
                ));
            }
        }
        // Nothing between the producer and the consumer may disturb it.
        let preads = preg.read_bufs();
        for (i, s) in block.iter().enumerate().skip(ppos.idx + 1) {
            let r = Region::of(std::slice::from_ref(s));
            if i > j {
                if r.reads(t) || r.writes(t) {
                    return Err(err(
                        k,
                        P,
                        format!("buffer `{}` is used after loop `{at}`", tbuf.name),
                    ));
                }
                continue;
            }
            if let Some(b) = r.written_bufs().intersection(&preads).next() {
                return Err(err(k, P, format!("buffer `{}`, read by producer `{producer}`, is written before or by loop `{at}`", k.buf(*b).name)));
            }
            if let Some(v) = r.assigned.intersection(&preg.read_vars).next() {
                return Err(err(k, P, format!("variable `{}`, read by producer `{producer}`, is updated before or by loop `{at}`", var_name(k, *v))));
            }
            if i < j && (r.reads(t) || r.writes(t)) {
                return Err(err(
                    k,
                    P,
                    format!(
                        "buffer `{}` is used between producer `{producer}` and loop `{at}`",
                        tbuf.name
                    ),
                ));
            }
            if i == j {
                let c = loop_ref(k, &cpos).ok_or_else(|| err(k, P, "loop vanished"))?;
                let creg = Region::of(&c.body);
                if creg.writes(t) {
                    return Err(err(k, P, format!("loop `{at}` writes `{}`", tbuf.name)));
                }
                if !creg.reads(t) {
                    return Err(err(
                        k,
                        P,
                        format!("loop `{at}` does not read `{}`", tbuf.name),
                    ));
                }
                if r.accesses(t).len() != creg.accesses(t).len() {
                    return Err(err(
                        k,
                        P,
                        format!("buffer `{}` is used outside loop `{at}`", tbuf.name),
                    ));
                }
            }
        }
        // The part of T one iteration of `at` reads.
        let c = loop_ref(k, &cpos).ok_or_else(|| err(k, P, "loop vanished"))?;
        let creg = Region::of(&c.body);
        let mut outer = cpos.outer_ranges();
        outer.insert(cv, (0, c.extent.saturating_sub(1).max(0)));
        let mut ranges = outer.clone();
        ranges.extend(creg.ranges.iter().map(|(k, v)| (*k, *v)));
        let snapshot = k.clone();
        let cx = AffineCx::new(&snapshot);
        let dims = regions(&cx, &creg.accesses(t), &tbuf.shape, &creg.defined, &ranges);
        // Shrink the producer: loop over the box, offset by its base.
        let mut newp = p.clone();
        {
            let mut guard_idx = vec![];
            let mut l = &mut newp;
            loop {
                let d = dim_vars.iter().position(|x| *x == l.var).unwrap_or(0);
                let r = &dims[d];
                l.extent = r.ext;
                let shifted = Expr::add(r.base.to_expr(), Expr::Var(l.var));
                guard_idx.push((d, shifted.clone()));
                if !r.full {
                    for s in l.body.iter_mut() {
                        s.substitute(l.var, &shifted);
                    }
                }
                let last = guard_idx.len() == chain.len();
                if last {
                    // Store at the box-relative index; guard rows outside the buffer.
                    let rel: Vec<Expr> = dim_vars.iter().map(|v| Expr::Var(*v)).collect();
                    set_store_index(&mut l.body, t, &rel);
                    guard_idx.sort_by_key(|g| g.0);
                    let full_idx: Vec<Expr> = guard_idx.iter().map(|g| g.1.clone()).collect();
                    if let Some(cond) = bounds_guard(&dims, &full_idx, &tbuf.shape, &outer) {
                        let body = std::mem::take(&mut l.body);
                        l.body = vec![Stmt::If {
                            cond,
                            then_: body,
                            else_: vec![],
                        }];
                    }
                    break;
                }
                match l.body.as_mut_slice() {
                    [Stmt::For(inner)] => l = inner,
                    _ => return Err(err(&snapshot, P, "producer chain changed")),
                }
            }
        }
        k.buffers[t.0 as usize].shape = dims.iter().map(|d| d.ext).collect();
        let c = loop_mut(k, &cpos).ok_or_else(|| err(&snapshot, P, "loop vanished"))?;
        let ok = retarget(&mut c.body, t, t, false, &mut |idx| {
            relative(&cx, idx, &dims)
        });
        if !ok {
            return Err(err(
                &snapshot,
                P,
                format!("could not rewrite the loads of `{}`", tbuf.name),
            ));
        }
        c.body.splice(0..0, [Stmt::Alloc(t), Stmt::For(newp)]);
        let block = block_mut(&mut k.body, &ppos.block)
            .ok_or_else(|| err(&snapshot, P, "loop vanished"))?;
        block.remove(ppos.idx);
        block.remove(alloc_idx);
        Ok(())
    })
}

/// Sets the index of every store to `t` in `stmts`.
fn set_store_index(stmts: &mut [Stmt], t: BufId, index: &[Expr]) {
    for s in stmts {
        match s {
            Stmt::Store { buf, index: ix, .. } if *buf == t => *ix = index.to_vec(),
            Stmt::For(l) => set_store_index(&mut l.body, t, index),
            Stmt::If { then_, else_, .. } => {
                set_store_index(then_, t, index);
                set_store_index(else_, t, index);
            }
            _ => {}
        }
    }
}
