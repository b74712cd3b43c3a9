//! The row schedule: a row-wise kernel (outer loops over rows; in each row, loops over the
//! row that reduce into mutable accumulators, then loops that write the row — softmax,
//! LayerNorm, RMSNorm) becomes one thread block per row. Every row loop is spread over the
//! block's threads as 16-byte vectors (`tx` owns vectors `tx, tx + T, ...`), each reduction
//! ends with a [`Stmt::BlockReduce`], and a row read by several loops is kept in registers
//! (each thread holds its `C / T` elements) when that fits. Short rows share a block: each row
//! gets a power-of-two segment of a warp (`ThreadY` picks the row) and its reductions are
//! shuffles within the segment.

use std::collections::{HashMap, HashSet};

use tilec_tile::*;

use super::reduce::{identity, lit_value, loop_reductions, Reduction};
use super::*;
use crate::error::Result;

/// Options of the row schedule.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RowOptions {
    /// Threads per block (a multiple of 32, at most 1024); `None`: chosen from the row length
    /// (about 16 elements per thread).
    pub threads: Option<i64>,
    /// Largest number of elements one thread keeps in registers per cached row.
    pub max_register_elems: i64,
    /// Rows per block (each row on a power-of-two segment of a warp); `None`: several for rows
    /// short enough to need at most 32 threads, else one.
    pub rows_per_block: Option<i64>,
}

impl Default for RowOptions {
    fn default() -> Self {
        RowOptions {
            threads: None,
            max_register_elems: 64,
            rows_per_block: None,
        }
    }
}

/// A load that reads the row at the loop variable: `buf[rowpart..., r]` with the row part not
/// depending on `r`. Key: (buffer, index with `r` replaced by 0).
fn row_load_key(k: &Kernel, b: BufId, idx: &[Expr], r: VarId) -> Option<(BufId, Vec<Expr>)> {
    // Register buffers added by the schedule are not in `k`.
    let buf = k.buffers.get(b.0 as usize)?;
    if buf.scope != Scope::Global || idx.is_empty() {
        return None;
    }
    let last = idx.len() - 1;
    if idx[last] != Expr::Var(r) || idx[..last].iter().any(|e| e.uses_var(r)) {
        return None;
    }
    let mut key = idx.to_vec();
    key[last] = Expr::Int(0);
    Some((b, key))
}

/// Schedules a row-wise kernel: one thread block per row (see the module documentation)./// A row: its block shape.
#[derive(Copy, Clone)]
struct Block {
    /// Rows of the kernel.
    rows: i64,
    /// Elements per vector.
    lanes: i64,
    /// Threads per row.
    threads: i64,
    /// Short rows sharing a block: (threads per row, rows per block).
    multi: Option<(i64, i64)>,
}

/// A row cached in registers: the load's key, the register buffer, the row length.
type Cached = ((BufId, Vec<Expr>), BufId, i64);

/// Schedules a row-wise kernel: one thread block per row (see the module documentation).
pub fn schedule_rows(k: &Kernel, opts: &RowOptions) -> Result<Kernel> {
    // One row (a decode step's normalization: its loop over rows of one iteration folded
    // away): the same schedule over a row loop of extent 1, one block.
    if row_nest(&k.body).0.is_empty() && one_row_reduction(&k.body) {
        let mut one = k.clone();
        let v = fresh(&mut one, "row1", Ty::Index, false);
        let body = std::mem::take(&mut one.body);
        one.body = vec![Stmt::For(Loop { var: v, extent: 1, kind: LoopKind::Serial, body })];
        return schedule_rows(&one, opts);
    }
    let (outer, inner, row_body) = row_loops(k)?;
    let b = block_shape(k, &outer, &inner, row_body, opts)?;
    let mut out = k.clone();
    let row_var = fresh(&mut out, "row", Ty::Index, false);
    let outer_vars: Vec<(VarId, i64)> = outer.iter().map(|l| (l.var, l.extent)).collect();
    let subs = decompose(&outer_vars, Expr::Var(row_var));
    let (reductions, acc_op) = row_reductions(k, &inner)?;
    let (cached, stored) = cache_rows(k, &mut out, &inner, row_body, &b, opts.max_register_elems);
    let mut new_body: Vec<Stmt> = vec![];
    for (_, reg, _) in &cached {
        new_body.push(Stmt::Alloc(*reg));
    }
    let mut filled: HashSet<BufId> = HashSet::new();
    let mut fixups: Vec<Stmt> = vec![];
    for s in row_body {
        match s {
            Stmt::Let { var, value } if acc_op.contains_key(var) => {
                let op = acc_op[var];
                let ty = k.var_info(*var).ty;
                let id =
                    identity(op, ty).ok_or_else(|| bad(k, format!("no identity for {op:?}")))?;
                let is_id = match (lit_value(value), lit_value(&id)) {
                    (Some(a), Some(b)) => a == b || (a.is_nan() && b.is_nan()),
                    _ => false,
                };
                if is_id {
                    new_body.push(s.clone());
                } else {
                    // Start from the identity; combine with the initial value after the
                    // block reduction.
                    for b in &stored {
                        if value.reads(*b) {
                            return Err(bad(
                                k,
                                format!(
                                    "initial value of {} reads a buffer the row writes",
                                    k.var_info(*var).name
                                ),
                            ));
                        }
                    }
                    new_body.push(Stmt::Let {
                        var: *var,
                        value: id,
                    });
                    fixups.push(Stmt::Assign {
                        var: *var,
                        value: Expr::bin(op, value.clone(), Expr::Var(*var)),
                    });
                }
            }
            Stmt::For(l) => spread_loop(
                k,
                &mut out,
                l,
                &b,
                &cached,
                &mut filled,
                &reductions[&l.var],
                &mut fixups,
                &mut new_body,
            )?,
            other => new_body.push(other.clone()),
        }
    }
    subst_all(&mut new_body, &subs);
    out.body = match b.multi {
        None => vec![Stmt::For(Loop {
            var: row_var,
            extent: b.rows,
            kind: LoopKind::Bound(GpuAxis::BlockX),
            body: new_body,
        })],
        Some((_, r)) => {
            // Row = block * R + threadIdx.y.
            let rb = fresh(&mut out, "rowblk", Ty::Index, false);
            let ry = fresh(&mut out, "ry", Ty::Index, false);
            let mut body = vec![Stmt::Let {
                var: row_var,
                value: Expr::add(Expr::mul(Expr::Var(rb), Expr::Int(r)), Expr::Var(ry)),
            }];
            body.extend(new_body);
            vec![Stmt::For(Loop {
                var: rb,
                extent: b.rows / r,
                kind: LoopKind::Bound(GpuAxis::BlockX),
                body: vec![Stmt::For(Loop {
                    var: ry,
                    extent: r,
                    kind: LoopKind::Bound(GpuAxis::ThreadY),
                    body,
                })],
            })]
        }
    };
    Ok(out)
}

/// Whether a body with no loop over rows is one row's reduction and what follows it: some
/// accumulator declared at the top is updated in a loop, and no loop reads a buffer an earlier
/// loop stored to (the loops' iterations get spread over threads with no barrier between).
fn one_row_reduction(body: &[Stmt]) -> bool {
    let accs: HashSet<VarId> = body.iter().filter_map(|s| if let Stmt::Let { var, .. } = s { Some(*var) } else { None }).collect();
    let mut reduces = false;
    let mut stored: HashSet<BufId> = HashSet::new();
    for s in body {
        let Stmt::For(l) = s else { continue };
        let mut reads_stored = false;
        let mut stores = vec![];
        let mut reads = |e: &Expr| {
            e.visit(&mut |x| {
                if let Expr::Load(b, _) = x {
                    reads_stored |= stored.contains(b);
                }
            })
        };
        for b in &l.body {
            b.visit(&mut |x| match x {
                Stmt::Assign { var, value } => {
                    reduces |= accs.contains(var);
                    reads(value);
                }
                Stmt::Store { buf, index, value } => {
                    stores.push(*buf);
                    index.iter().for_each(&mut reads);
                    reads(value);
                }
                Stmt::Let { value, .. } => reads(value),
                Stmt::If { cond, .. } => reads(cond),
                Stmt::Gemm(g) => {
                    reads(&g.a);
                    reads(&g.b);
                }
                _ => {}
            });
        }
        if reads_stored {
            return false;
        }
        stored.extend(stores);
    }
    reduces
}

/// The loops over rows (outermost first), the loops over a row, and the row's body; an error
/// when the body is not a sequence of simple loops, lets, assignments and stores.
fn row_loops(k: &Kernel) -> Result<(Vec<&Loop>, Vec<&Loop>, &[Stmt])> {
    let (outer, row_body) = row_nest(&k.body);
    if outer.is_empty() {
        return Err(bad(k, "no loop over rows"));
    }
    if outer.iter().any(|l| matches!(l.kind, LoopKind::Bound(_))) {
        return Err(bad(k, "already bound to GPU axes"));
    }
    let inner: Vec<&Loop> = row_body
        .iter()
        .filter_map(|s| match s {
            Stmt::For(l) => Some(l),
            _ => None,
        })
        .collect();
    if inner.is_empty() || row_body.len() < 2 {
        return Err(bad(
            k,
            "the row body is not a sequence of loops over the row",
        ));
    }
    for s in row_body {
        match s {
            Stmt::For(l) => {
                if matches!(l.kind, LoopKind::Bound(_)) {
                    return Err(bad(k, "a row loop is already bound to a GPU axis"));
                }
                let mut nested = false;
                for b in &l.body {
                    b.visit(&mut |x| {
                        if matches!(
                            x,
                            Stmt::For(_)
                                | Stmt::Gemm(_)
                                | Stmt::Barrier
                                | Stmt::BlockReduce { .. }
                                | Stmt::Alloc(_)
                        ) {
                            nested = true
                        }
                    });
                }
                if nested {
                    return Err(bad(
                        k,
                        format!(
                            "row loop {} has nested loops or allocations",
                            k.var_info(l.var).name
                        ),
                    ));
                }
            }
            Stmt::Let { .. } | Stmt::Assign { .. } | Stmt::Store { .. } => {}
            _ => {
                return Err(bad(
                    k,
                    "the row body holds a statement other than loops, lets, assignments and stores",
                ))
            }
        }
    }
    Ok((outer, inner, row_body))
}

/// The block shape for the rows: vector width, threads per row, rows per block.
fn block_shape(k: &Kernel, outer: &[&Loop], inner: &[&Loop], row_body: &[Stmt], opts: &RowOptions) -> Result<Block> {
    let rows: i64 = outer.iter().map(|l| l.extent).product();
    if rows > i32::MAX as i64 {
        return Err(bad(k, format!("{rows} rows exceed the grid limit")));
    }
    let cmax = inner.iter().map(|l| l.extent).max().unwrap_or(1);
    let lanes = vector_lanes(cmax, &global_dtypes(k, row_body));
    let lanes = if inner.iter().all(|l| l.extent % lanes == 0) {
        lanes
    } else {
        1
    };
    // Threads a row wants: about four 16-byte vectors per thread (16 f32 or 32 bf16 elements),
    // at least one each: enough bytes in flight per block to cover memory latency, few
    // registers per thread. Measured on an H200 at 8192 columns: bf16 rows reach 0.96x copy
    // with 256 threads against 0.85x with 512 (16 elements each); f32 rows 0.97-0.99x with 512.
    let want = {
        let vecs = (cmax + lanes - 1) / lanes;
        let per_thread = if lanes > 1 { 4 * lanes } else { 16 };
        ((cmax + per_thread - 1) / per_thread).min(vecs).max(1)
    };
    let rows_total: i64 = outer.iter().map(|l| l.extent).product();
    // Short rows share a block: a power-of-two segment of a warp per row (reduced with shuffles
    // alone), about 256 threads per block.
    let multi = match opts.rows_per_block {
        Some(r) if r < 1 => return Err(bad(k, format!("{r} rows per block"))),
        Some(1) => None,
        Some(r) => {
            let t = opts.threads.unwrap_or_else(|| (want as u64).next_power_of_two() as i64);
            if t > 32 || t & (t - 1) != 0 || (t * r) % 32 != 0 || t * r > 1024 || rows_total % r != 0 {
                return Err(bad(
                    k,
                    format!(
                        "{r} rows per block of {t} threads each (want a power of two up to 32 \
                         threads, whole warps, at most 1024 threads, rows ({rows_total}) a \
                         multiple of the rows per block)"
                    ),
                ));
            }
            Some((t, r))
        }
        None if opts.threads.is_none() && want <= 32 => {
            let t = (want as u64).next_power_of_two() as i64;
            let mut r = 256 / t;
            while r > 1 && rows_total % r != 0 {
                r /= 2;
            }
            (r > 1 && (t * r) % 32 == 0).then_some((t, r))
        }
        None => None,
    };
    let threads = match (multi, opts.threads) {
        (Some((t, _)), _) => t,
        (None, Some(t)) => {
            if !(32..=1024).contains(&t) || t % 32 != 0 {
                return Err(bad(
                    k,
                    format!(
                        "row schedule: {t} threads per block (want a multiple of 32 up to 1024)"
                    ),
                ));
            }
            t
        }
        (None, None) => ((want + 31) / 32 * 32).clamp(32, 1024),
    };

    Ok(Block { rows, lanes, threads, multi })
}

/// The reductions of every row loop, and each accumulator's operator (one per accumulator).
#[allow(clippy::type_complexity)]
fn row_reductions(k: &Kernel, inner: &[&Loop]) -> Result<(HashMap<VarId, Vec<Reduction>>, HashMap<VarId, BinOp>)> {
    // Reductions per loop, and which accumulators need an identity start.
    let mut reductions: HashMap<VarId, Vec<Reduction>> = HashMap::new();
    for l in inner {
        reductions.insert(l.var, loop_reductions(k, l)?);
    }
    let mut acc_op: HashMap<VarId, BinOp> = HashMap::new();
    for rs in reductions.values() {
        for r in rs {
            if let Some(prev) = acc_op.insert(r.var, r.op) {
                if prev != r.op {
                    return Err(bad(
                        k,
                        format!("{} is reduced with two operators", k.var_info(r.var).name),
                    ));
                }
            }
        }
    }

    Ok((reductions, acc_op))
}

/// Rows read by several loops of the same length, kept in registers within `budget` elements
/// per thread; also the buffers the row writes.
fn cache_rows(
    k: &Kernel,
    out: &mut Kernel,
    inner: &[&Loop],
    row_body: &[Stmt],
    b: &Block,
    budget: i64,
) -> (Vec<Cached>, HashSet<BufId>) {
    let (threads, lanes) = (b.threads, b.lanes);
    // Rows read by several loops of the same length are kept in registers.
    // (Expr holds floats, so keys live in association lists.)
    let mut readers: Vec<((BufId, Vec<Expr>), Vec<VarId>)> = vec![];
    for l in inner {
        let mut seen: Vec<(BufId, Vec<Expr>)> = vec![];
        for s in &l.body {
            each_expr(s, &mut |e| {
                if let Expr::Load(b, idx) = e {
                    if let Some(key) = row_load_key(k, *b, idx, l.var) {
                        if !seen.contains(&key) {
                            seen.push(key.clone());
                            match readers.iter_mut().find(|r| r.0 == key) {
                                Some(r) => r.1.push(l.var),
                                None => readers.push((key, vec![l.var])),
                            }
                        }
                    }
                }
            });
        }
    }
    let stored: HashSet<BufId> = {
        let mut s = HashSet::new();
        for st in row_body {
            st.visit(&mut |x| {
                if let Stmt::Store { buf, .. } = x {
                    s.insert(*buf);
                }
            });
        }
        s
    };
    let mut cached: Vec<((BufId, Vec<Expr>), BufId, i64)> = vec![];
    let mut budget = budget;
    let keys: Vec<_> = readers
        .into_iter()
        .filter(|(_, ls)| ls.len() >= 2)
        .collect();
    for (key, ls) in keys {
        let exts: HashSet<i64> = inner
            .iter()
            .filter(|l| ls.contains(&l.var))
            .map(|l| l.extent)
            .collect();
        if exts.len() != 1 || stored.contains(&key.0) {
            continue;
        }
        let c = *exts.iter().next().unwrap_or(&0);
        let j = (c + threads * lanes - 1) / (threads * lanes);
        if j * lanes > budget {
            continue;
        }
        budget -= j * lanes;
        let dtype = k.buf(key.0).dtype;
        let name = format!("{}_row", k.buf(key.0).name);
        let reg = fresh_buf(
            out,
            &name,
            dtype,
            vec![threads, j, lanes],
            Scope::Register,
        );
        cached.push((key, reg, c));
    }

    (cached, stored)
}

/// One row loop spread over the block's threads as vectors (`r = (j * T + tx) * V + v`), the
/// cached rows filled on first use and read from registers after, then a block reduction per
/// accumulator it reduces (with the fix-up of a non-identity start).
#[allow(clippy::too_many_arguments)]
fn spread_loop(
    k: &Kernel,
    out: &mut Kernel,
    l: &Loop,
    b: &Block,
    cached: &[Cached],
    filled: &mut HashSet<BufId>,
    reductions: &[Reduction],
    fixups: &mut Vec<Stmt>,
    new_body: &mut Vec<Stmt>,
) -> Result<()> {
    let (threads, lanes) = (b.threads, b.lanes);
    let c = l.extent;
    let tx = fresh(
        out,
        &format!("{}_tx", k.var_info(l.var).name),
        Ty::Index,
        false,
    );
    let j = fresh(
        out,
        &format!("{}_j", k.var_info(l.var).name),
        Ty::Index,
        false,
    );
    let v = fresh(
        out,
        &format!("{}_v", k.var_info(l.var).name),
        Ty::Index,
        false,
    );
    let jn = (c + threads * lanes - 1) / (threads * lanes);
    // r = (j * T + tx) * V + v
    let vec_idx = Expr::add(Expr::mul(Expr::Var(j), Expr::Int(threads)), Expr::Var(tx));
    let r = Expr::add(Expr::mul(vec_idx.clone(), Expr::Int(lanes)), Expr::Var(v));
    let mut body = l.body.clone();
    // Cached rows: fill on first use, read from registers afterwards.
    let mut pre = vec![];
    for (key, reg, cc) in cached {
        if *cc != c {
            continue;
        }
        let mut uses = false;
        for st in &body {
            each_expr(st, &mut |e| {
                if let Expr::Load(b, idx) = e {
                    if row_load_key(k, *b, idx, l.var).as_ref() == Some(key) {
                        uses = true;
                    }
                }
            });
        }
        if !uses {
            continue;
        }
        let reg_idx = vec![Expr::Var(tx), Expr::Var(j), Expr::Var(v)];
        let key = key.clone();
        let lv = l.var;
        for st in body.iter_mut() {
            st.map_exprs(&mut |e| {
                e.rewrite(&mut |x| match x {
                    Expr::Load(b, idx)
                        if row_load_key(k, b, &idx, lv).as_ref() == Some(&key) =>
                    {
                        Expr::Load(*reg, reg_idx.clone())
                    }
                    x => x,
                })
            });
        }
        if filled.insert(*reg) {
            let mut src = key.1.clone();
            if let Some(last) = src.last_mut() {
                *last = Expr::Var(l.var);
            }
            pre.push(Stmt::store(*reg, reg_idx, Expr::Load(key.0, src)));
        }
    }
    pre.extend(body);
    let mut body = pre;
    for st in body.iter_mut() {
        st.substitute(l.var, &r);
    }
    let vloop = if lanes > 1 {
        vec![Stmt::For(Loop {
            var: v,
            extent: lanes,
            kind: LoopKind::Vectorized,
            body,
        })]
    } else {
        for st in body.iter_mut() {
            st.substitute(v, &Expr::Int(0));
        }
        body
    };
    let guarded = if c % (threads * lanes) != 0 {
        vec![Stmt::If {
            cond: Expr::bin(
                BinOp::Lt,
                Expr::mul(vec_idx, Expr::Int(lanes)),
                Expr::Int(c),
            ),
            then_: vloop,
            else_: vec![],
        }]
    } else {
        vloop
    };
    let jloop = if jn == 1 {
        let mut g = guarded;
        for st in g.iter_mut() {
            st.substitute(j, &Expr::Int(0));
        }
        g
    } else {
        let kind = if jn <= 16 {
            LoopKind::Unrolled
        } else {
            LoopKind::Serial
        };
        vec![Stmt::For(Loop {
            var: j,
            extent: jn,
            kind,
            body: guarded,
        })]
    };
    new_body.push(Stmt::For(Loop {
        var: tx,
        extent: threads,
        kind: LoopKind::Bound(GpuAxis::ThreadX),
        body: jloop,
    }));
    for red in reductions {
        new_body.push(Stmt::BlockReduce {
            var: red.var,
            op: red.op,
            axis: GpuAxis::ThreadX,
        });
        let mut rest = vec![];
        for f in fixups.drain(..) {
            if matches!(&f, Stmt::Assign { var, .. } if *var == red.var) {
                new_body.push(f);
            } else {
                rest.push(f);
            }
        }
        *fixups = rest;
    }
    Ok(())
}
