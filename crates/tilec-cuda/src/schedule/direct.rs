//! The direct-nest schedule, for any other nest (pools, depthwise convs, attention, gathers,
//! scans of rows too short for a block): the outer loops whose iterations are provably
//! independent are flattened onto a grid-stride loop over grid × block threads; everything
//! inside runs serially per thread. A body of several nests that touch disjoint buffers (no
//! nest reads or writes what another writes: sibling outputs of one group, such as a rotary
//! embedding's rotated queries and keys) spreads each nest over the whole grid in turn, with no
//! barrier (`grid`); dependent nests run in one block, nest after nest, with a barrier between
//! them (`block`); a body with no independent loop runs on one thread.

use tilec_tile::schedule as prim;
use tilec_tile::*;

use super::*;
use crate::error::Result;

/// How many loops of the chain starting at `s` (outermost first) have provably independent
/// iterations, counting from the top.
fn parallel_prefix(k: &Kernel, s: &Stmt) -> usize {
    let (loops, _) = row_nest(std::slice::from_ref(s));
    let mut n = 0;
    for l in loops {
        if l.kind != LoopKind::Serial || l.extent < 1 {
            break;
        }
        let name = k.var_info(l.var).name.clone();
        let mut probe = k.clone();
        if prim::parallel(&mut probe, &name).is_err() {
            break;
        }
        n += 1;
    }
    n
}

/// Rewrites the first `p` loops of the chain `s` into `for it { let f = it*stride + base; if
/// f < n { body } }` where `base` is the thread's flat index; returns the statements.
fn flatten(out: &mut Kernel, s: &Stmt, p: usize, base: Expr, stride: i64) -> Vec<Stmt> {
    let (loops, _) = row_nest(std::slice::from_ref(s));
    let loops = &loops[..p];
    let n: i64 = loops.iter().map(|l| l.extent).product();
    let inner = loops[p - 1].body.clone();
    let f = fresh(out, "flat", Ty::Index, false);
    let it = fresh(out, "it", Ty::Index, false);
    let mut body = inner;
    let mut rest = Expr::Var(f);
    let mut subs = vec![];
    for (d, l) in loops.iter().enumerate().rev() {
        let e = if d == 0 { rest.clone() } else { Expr::rem(rest.clone(), l.extent) };
        subs.push((l.var, e));
        rest = Expr::div(rest, l.extent);
    }
    for st in body.iter_mut() {
        for (var, e) in &subs {
            st.substitute(*var, e);
        }
    }
    let iters = (n + stride - 1) / stride;
    let fval = Expr::add(Expr::mul(v(it), Expr::Int(stride)), base);
    let mut per = vec![Stmt::Let { var: f, value: fval }];
    per.extend(guard((n % stride != 0).then(|| lt(v(f), n)), body, vec![]));
    if iters == 1 {
        for st in per.iter_mut() {
            st.substitute(it, &Expr::Int(0));
        }
        per
    } else {
        vec![Stmt::for_(it, iters, per)]
    }
}

/// The buffers a statement reads and writes, or None when it holds a product (whose accesses
/// are not plain loads and stores).
fn accesses(s: &Stmt) -> Option<(Vec<BufId>, Vec<BufId>)> {
    let (mut reads, mut writes) = (vec![], vec![]);
    let mut plain = true;
    let loads = |e: &Expr, reads: &mut Vec<BufId>| {
        e.visit(&mut |x| {
            if let Expr::Load(b, _) = x {
                reads.push(*b)
            }
        })
    };
    s.visit(&mut |x| match x {
        Stmt::Store { buf, index, value } => {
            writes.push(*buf);
            index.iter().for_each(|e| loads(e, &mut reads));
            loads(value, &mut reads);
        }
        Stmt::Let { value, .. } | Stmt::Assign { value, .. } => loads(value, &mut reads),
        Stmt::If { cond, .. } => loads(cond, &mut reads),
        Stmt::Alloc(b) => writes.push(*b),
        Stmt::Gemm(_) | Stmt::Barrier | Stmt::BlockReduce { .. } => plain = false,
        Stmt::For(_) => {}
    });
    plain.then_some((reads, writes))
}

/// A body of two or more nests, each with independent outer loops, none reading or writing
/// a buffer another writes: every nest spread over one grid in turn (grid-stride, no barrier:
/// a thread's share of one nest never waits for another's). None when that does not hold.
fn grid_nests(k: &Kernel, out: &mut Kernel, target: &GpuTarget) -> Option<Kernel> {
    if k.body.len() < 2 {
        return None;
    }
    let mut nests = vec![];
    for s in &k.body {
        if !matches!(s, Stmt::For(_)) {
            return None;
        }
        let p = parallel_prefix(k, s);
        if p == 0 {
            return None;
        }
        let (r, w) = accesses(s)?;
        nests.push((s, p, r, w));
    }
    for (i, a) in nests.iter().enumerate() {
        for b in &nests[i + 1..] {
            let clash = |w: &[BufId], other_r: &[BufId], other_w: &[BufId]| w.iter().any(|x| other_r.contains(x) || other_w.contains(x));
            if clash(&a.3, &b.2, &b.3) || clash(&b.3, &a.2, &a.3) {
                return None;
            }
        }
    }
    let sizes: Vec<i64> = nests
        .iter()
        .map(|(s, p, ..)| row_nest(std::slice::from_ref(*s)).0[..*p].iter().map(|l| l.extent).product())
        .collect();
    let n = sizes.iter().copied().max()?;
    let threads = if n >= 256 { 256 } else { ((n + 31) / 32 * 32).max(32) };
    let max_blocks = (target.sm_count as i64 * target.blocks_per_sm as i64).max(1);
    let blocks = ((n + threads - 1) / threads).clamp(1, max_blocks);
    let b = fresh(out, "blk", Ty::Index, false);
    let t = fresh(out, "thr", Ty::Index, false);
    let base = Expr::add(Expr::mul(v(b), Expr::Int(threads)), v(t));
    let mut body = vec![];
    for (s, p, ..) in &nests {
        body.extend(flatten(out, s, *p, base.clone(), blocks * threads));
    }
    let mut g = out.clone();
    g.body = vec![bound(b, blocks, GpuAxis::BlockX, vec![bound(t, threads, GpuAxis::ThreadX, body)])];
    Some(g)
}

/// Schedules any kernel as a direct nest (see the module documentation).
pub fn schedule_direct(k: &Kernel, target: &GpuTarget) -> Result<Kernel> {
    schedule_direct_named(k, target).map(|(k, _)| k)
}

/// [`schedule_direct`], also naming the variant: `direct`, `block` or `serial`.
pub fn schedule_direct_named(k: &Kernel, target: &GpuTarget) -> Result<(Kernel, &'static str)> {
    let mut has_bound = false;
    for l in k.loops() {
        if matches!(l.kind, LoopKind::Bound(_)) {
            has_bound = true;
        }
    }
    let mut has_gpu_stmt = false;
    for s in &k.body {
        s.visit(&mut |x| {
            if matches!(x, Stmt::Barrier | Stmt::BlockReduce { .. }) {
                has_gpu_stmt = true
            }
        });
    }
    if has_bound || has_gpu_stmt {
        return Err(bad(k, "already bound to GPU axes"));
    }
    let mut out = k.clone();
    // Scratch allocated inside a nest belongs to one iteration, hence to one thread once the
    // nest is spread over threads: thread-private (`Register`) arrays, not shared memory.
    for s in &k.body {
        if let Stmt::For(l) = s {
            for b in &l.body {
                b.visit(&mut |x| {
                    if let Stmt::Alloc(b) = x {
                        if out.buf(*b).scope == Scope::Local {
                            out.buffers[b.0 as usize].scope = Scope::Register;
                        }
                    }
                });
            }
        }
    }
    let k = &out.clone();
    // One nest: grid-stride over the independent outer loops.
    if let [s @ Stmt::For(_)] = k.body.as_slice() {
        let p = parallel_prefix(k, s);
        if p > 0 {
            let (loops, _) = row_nest(std::slice::from_ref(s));
            let n: i64 = loops[..p].iter().map(|l| l.extent).product();
            let threads = if n >= 256 { 256 } else { ((n + 31) / 32 * 32).max(32) };
            let max_blocks = (target.sm_count as i64 * target.blocks_per_sm as i64).max(1);
            let blocks = ((n + threads - 1) / threads).clamp(1, max_blocks);
            let b = fresh(&mut out, "blk", Ty::Index, false);
            let t = fresh(&mut out, "thr", Ty::Index, false);
            let base = Expr::add(Expr::mul(v(b), Expr::Int(threads)), v(t));
            let body = flatten(&mut out, s, p, base, blocks * threads);
            out.body = vec![bound(b, blocks, GpuAxis::BlockX, vec![bound(t, threads, GpuAxis::ThreadX, body)])];
            return Ok((out, "direct"));
        }
    }
    // Several independent nests: each over the whole grid in turn.
    if let Some(g) = grid_nests(k, &mut out, target) {
        return Ok((g, "grid"));
    }
    let mut out = k.clone();
    // Several statements: one block; nests spread over its threads in turn.
    let threads = 256i64.min(target.max_threads_per_block as i64);
    let mut body = vec![];
    let mut parallel_any = false;
    let mut serial_ok = true;
    for s in &k.body {
        match s {
            Stmt::For(_) => {
                let p = parallel_prefix(k, s);
                if p == 0 {
                    serial_ok = false;
                    break;
                }
                parallel_any = true;
                let t = fresh(&mut out, "thr", Ty::Index, false);
                let inner = flatten(&mut out, s, p, v(t), threads);
                body.push(bound(t, threads, GpuAxis::ThreadX, inner));
                body.push(Stmt::Barrier);
            }
            // Values every thread computes alike.
            Stmt::Let { var, .. } if !k.var_info(*var).mutable => body.push(s.clone()),
            Stmt::Alloc(b) if k.buf(*b).scope == Scope::Local => body.push(s.clone()),
            _ => {
                serial_ok = false;
                break;
            }
        }
    }
    if serial_ok && parallel_any {
        let b = fresh(&mut out, "blk", Ty::Index, false);
        out.body = vec![bound(b, 1, GpuAxis::BlockX, body)];
        return Ok((out, "block"));
    }
    // Nothing provably parallel: one thread runs the kernel as it is, its scratch private
    // (shared memory is too small for the scratch of whole-tensor nests).
    let mut out = k.clone();
    for b in out.buffers.iter_mut() {
        if b.scope == Scope::Local {
            b.scope = Scope::Register;
        }
    }
    let t = fresh(&mut out, "thr", Ty::Index, false);
    out.body = vec![bound(t, 1, GpuAxis::ThreadX, k.body.clone())];
    Ok((out, "serial"))
}

