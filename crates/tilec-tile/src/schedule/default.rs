//! Default CPU schedules from simple heuristics.

use tilec_ir::DType;

use super::deps::Region;
use super::{apply_primitive, locate, loop_ref, var_name, Primitive, Schedule};
use crate::ir::*;
use crate::indirect::indirect_form;

/// Below this many innermost iterations a kernel is not worth spreading over threads.
pub const PARALLEL_MIN_WORK: u128 = 1 << 16;

pub use tilec_opt::target::CpuTarget;

/// Innermost-iteration count of statements (a gemm counts `batch * m * n * k`).
fn work(stmts: &[Stmt]) -> u128 {
    stmts
        .iter()
        .map(|s| match s {
            Stmt::For(l) => (l.extent.max(0) as u128).saturating_mul(work(&l.body).max(1)),
            Stmt::If { then_, else_, .. } => work(then_).max(work(else_)).max(1),
            Stmt::Gemm(g) => [g.batch, g.m, g.n, g.k]
                .iter()
                .map(|&x| x.max(0) as u128)
                .product(),
            _ => 1,
        })
        .fold(0u128, |a, b| a.saturating_add(b))
}

/// Blocking for a gemm: an `mr × nr` register tile with `nr` two vectors wide (one or three
/// when `A` is read in place and `n` is one or three vectors: channels-last convolutions with
/// 16 or 48 output channels; `mr` then fitted to the rows; `mr` at most `m` otherwise), a `kc`
/// deep B micro-panel filling half of L1, an `mc × kc` A block filling half of L2.
pub fn gemm_params(g: &Gemm, t: &CpuTarget, a_in_place: bool) -> GemmParams {
    let elem = g.acc_dtype.size_bytes().clamp(4, 8) as i64;
    let lanes = (t.vector_bytes as i64 / elem).max(1);
    let wide = t.vector_bytes >= 64;
    let (mr, nr) = if a_in_place && g.n <= lanes {
        (if wide { 12 } else { 6 }, lanes)
    } else if a_in_place && wide && g.n == 3 * lanes {
        (8, 3 * lanes)
    } else if a_in_place && wide {
        // Rows are output pixels: 6 to 8 per tile, whichever pads the rows least (7 for the
        // 49 pixels of a 7×7 map and the 196 of a 14×14 one, 8 elsewhere).
        let waste = |r: i64| (g.m.max(1) + r - 1) / r * r - g.m.max(1);
        let mr = [8, 7, 6].into_iter().min_by_key(|&r| waste(r)).unwrap_or(8);
        (mr, 2 * lanes)
    } else {
        // Fewer rows than a tile (a classifier's matrix-vector product, batch 1): as many as
        // there are, since the micro-kernel computes every row of its tile (at m = 1 a tile
        // of 8 did 8x the multiply-adds).
        let mr = if wide { 8 } else if t.vector_bytes >= 32 { 6 } else { 4 };
        (mr.min(g.m.max(1)), 2 * lanes)
    };
    let round_up = |x: i64, m: i64| (x.max(1) + m - 1) / m * m;
    let kc = ((t.l1_bytes as i64 / 2 / (nr * elem)) / 8 * 8)
        .clamp(8, 512)
        .min(round_up(g.k, 8));
    let mc = ((t.l2_bytes as i64 / 2 / (kc * elem)) / mr * mr)
        .clamp(mr, 1024 / mr * mr)
        .min(round_up(g.m, mr));
    let nc = round_up(g.n.min(4096), nr);
    GemmParams { mr, nr, kc, mc, nc }
}

/// Whether computing the transposed product of `g` fills the register tiles markedly better
/// (padded `m × n` at least 10% smaller). Not when `B` selects (a padded implicit im2col): as
/// `A` it would lose the vectorized im2col packing, which costs more than the tiles gain.
fn transpose_pays(k: &Kernel, g: &Gemm, t: &CpuTarget) -> bool {
    let selects = |e: &Expr| {
        let mut s = false;
        e.visit(&mut |x| s |= matches!(x, Expr::Select(..)));
        s
    };
    if selects(&g.b) || indirect_form(k, g).is_some() {
        return false;
    }
    // An implicit im2col that cannot be read in place (a convolution over few channels: its
    // selects check bounds that depend on the row) is packed far more cheaply as `B` (16-wide
    // vectors, reused by every A panel). Selects on `k` alone (a concatenation) are not.
    let mut row_checks = false;
    g.a.visit(&mut |x| {
        if let Expr::Select(c, ..) = x {
            row_checks |= c.uses_var(g.i_var);
        }
    });
    if row_checks {
        return true;
    }
    let p = gemm_params(g, t, false);
    let pad = |x: i64, r: i64| (x.max(1) + r - 1) / r * r;
    let now = pad(g.m, p.mr) as i128 * pad(g.n, p.nr) as i128;
    let swapped = pad(g.n, p.mr) as i128 * pad(g.m, p.nr) as i128;
    swapped * 10 < now * 9
}

/// The default CPU schedule of a kernel:
/// - every gemm gets [`gemm_params`] blocking;
/// - the outermost loop of each loop nest is made parallel when the kernel does at least
///   [`PARALLEL_MIN_WORK`] innermost iterations, after fusing it with the loops below it (never
///   the innermost one) while its extent is below the thread count; a nest that is a single loop
///   is first split into chunks of whole vectors;
/// - innermost loops with stride-1 accesses are vectorized when their iterations are
///   independent, and reductions over such loops (long enough: at least two vectors, such as
///   a 32-wide attention head) are rfactored into one partial accumulator per vector lane and
///   the partial loop vectorized.
///
/// Every step is tried on a copy and kept only when it applies, so the result always applies to
/// `k`.
pub fn default_cpu(k: &Kernel, t: &CpuTarget) -> Schedule {
    let mut w = k.clone();
    let mut s = Schedule::new();
    let attempt = |w: &mut Kernel, s: &mut Schedule, p: Primitive| -> bool {
        let ok = apply_primitive(w, &p).is_ok();
        if ok {
            s.push(p);
        }
        ok
    };
    // Gemm orientation: the register tile (mr rows, nr columns, nr the wider) runs along the
    // dimensions that waste less of it (a convolution over few output positions computes the
    // transposed product).
    let mut swaps = vec![];
    for st in &w.body {
        st.visit(&mut |st| {
            if let Stmt::Gemm(g) = st {
                if transpose_pays(k, g, t) {
                    swaps.push(var_name(k, g.i_var));
                }
            }
        });
    }
    for name in swaps {
        attempt(
            &mut w,
            &mut s,
            Primitive::GemmTranspose { gemm: Some(name) },
        );
    }
    // Gemm blocking.
    let mut gemms = vec![];
    for st in &w.body {
        st.visit(&mut |st| {
            if let Stmt::Gemm(g) = st {
                gemms.push((var_name(&w, g.i_var), gemm_params(g, t, indirect_form(&w, g).is_some())));
            }
        });
    }
    for (name, p) in gemms {
        attempt(
            &mut w,
            &mut s,
            Primitive::GemmBlocking {
                gemm: Some(name),
                mr: p.mr,
                nr: p.nr,
                kc: p.kc,
                mc: p.mc,
                nc: p.nc,
            },
        );
    }
    // A flattened loop whose checks read its quotient or remainder (a rolled window's rows and
    // columns over a flattened image) becomes two loops first, which the cuts below then
    // partition by their own checks.
    let flat: Vec<(String, i64)> = w
        .body
        .iter()
        .filter_map(|st| match st {
            Stmt::For(l) if l.kind == LoopKind::Serial => delinearize_factor(l).map(|d| (var_name(&w, l.var), d)),
            _ => None,
        })
        .collect();
    for (name, factor) in flat {
        attempt(&mut w, &mut s, Primitive::Delinearize { loop_var: name, factor });
    }
    // Outer loops that select between inputs (a concatenation read as `i < n0 ? a : b`) or
    // check bounds: cut into pieces in which the checks are constant.
    let first_roots: Vec<String> = w
        .body
        .iter()
        .filter_map(|st| match st {
            Stmt::For(l) if l.kind == LoopKind::Serial => Some(var_name(&w, l.var)),
            _ => None,
        })
        .collect();
    for root in first_roots {
        let mut cur = root;
        for _ in 0..4 {
            let mut trial = w.clone();
            let Ok(p) = super::partition(&mut trial, &cur) else {
                break;
            };
            attempt(
                &mut w,
                &mut s,
                Primitive::Partition {
                    loop_var: cur.clone(),
                },
            );
            match p.after {
                Some(a) => cur = a,
                None => break,
            }
        }
    }
    let roots: Vec<String> = w
        .body
        .iter()
        .filter_map(|st| match st {
            Stmt::For(l) => Some(var_name(&w, l.var)),
            _ => None,
        })
        .collect();
    let parallel_ok = t.threads > 1 && work(&w.body) >= PARALLEL_MIN_WORK;
    let threads = t.threads as i64;
    for mut root in roots {
        if parallel_ok {
            let mut cur = root.clone();
            // Single-loop nest: chunks of whole vectors, the chunks in parallel.
            if let Some((l, _)) = loop_named(&w, &cur) {
                let r = Region::of(&l.body);
                if r.loops == 0 && r.gemms == 0 && l.extent >= 2 * threads {
                    let lanes = t.lanes(loop_dtype(&w, l));
                    let mut chunk = lanes;
                    while chunk < 4096
                        && (chunk * 2).saturating_mul(threads).saturating_mul(4) <= l.extent
                    {
                        chunk *= 2;
                    }
                    if chunk < l.extent && l.extent % lanes == 0 {
                        while l.extent % chunk != 0 {
                            chunk -= lanes;
                        }
                    }
                    let mut trial = w.clone();
                    if let Ok((o, _)) = super::split(&mut trial, &cur, chunk) {
                        if super::parallel(&mut trial, &o).is_ok() {
                            attempt(
                                &mut w,
                                &mut s,
                                Primitive::Split {
                                    loop_var: cur.clone(),
                                    factor: chunk,
                                },
                            );
                            attempt(
                                &mut w,
                                &mut s,
                                Primitive::Parallel {
                                    loop_var: o.clone(),
                                },
                            );
                            root = o;
                            cur.clear();
                        }
                    }
                }
            }
            // Fuse small outer loops, then parallelize.
            while !cur.is_empty() {
                let Some((l, _)) = loop_named(&w, &cur) else {
                    break;
                };
                if l.extent >= threads {
                    break;
                }
                let inner = match l.body.as_slice() {
                    [Stmt::For(inner)] if Region::of(&inner.body).loops > 0 => {
                        var_name(&w, inner.var)
                    }
                    _ => break,
                };
                let mut trial = w.clone();
                match super::fuse(&mut trial, &cur, &inner) {
                    Ok(f) if super::parallel(&mut trial.clone(), &f).is_ok() => {
                        attempt(
                            &mut w,
                            &mut s,
                            Primitive::Fuse {
                                outer: cur.clone(),
                                inner,
                            },
                        );
                        cur = f.clone();
                        root = f;
                    }
                    _ => break,
                }
            }
            if !cur.is_empty() {
                attempt(
                    &mut w,
                    &mut s,
                    Primitive::Parallel {
                        loop_var: cur.clone(),
                    },
                );
            }
        }
        // Innermost loops that continue one another in memory (a group's channels and
        // pixels) become one loop, so that vectorization runs over the whole span.
        let (fused, r) = super::contig::fuse_runs(&mut w, &root);
        s.steps.extend(fused);
        root = r;
        // Innermost loops of the nest.
        let mut inner_loops = vec![];
        if let Some((l, _)) = loop_named(&w, &root) {
            collect_innermost(
                &w,
                std::slice::from_ref(&Stmt::For(l.clone())),
                &mut inner_loops,
            );
        }
        for name in inner_loops {
            let Some((l, _)) = loop_named(&w, &name) else {
                continue;
            };
            if l.kind != LoopKind::Serial {
                continue;
            }
            let l = l.clone();
            let lanes = t.lanes(loop_dtype(&w, &l));
            if !super::contig::unit_stride(&w, &l) {
                continue;
            }
            let carried = !Region::of(&l.body).carried_scalars().is_empty();
            if carried {
                // Partials of at least 16 lanes where the loop reads single bytes (a boolean
                // mask selecting scores): gcc vectorizes no loop of 8 byte loads, and a
                // masked softmax over rows of 128 ran scalar (GPT-Neo's, 1.4 ms a layer).
                let lanes = if reads_bytes(&w, &l) { lanes.max(16) } else { lanes };
                if l.extent >= 2 * lanes && lanes > 1 {
                    // Long reductions (a group's whole span): four vectors of partials, four
                    // independent chains of additions instead of one.
                    let factor = if l.extent >= 64 * lanes { 4 * lanes } else { lanes };
                    let mut trial = w.clone();
                    if let Ok((o, i)) = super::rfactor(&mut trial, &name, factor) {
                        if super::vectorize(&mut trial, &i).is_ok() {
                            attempt(
                                &mut w,
                                &mut s,
                                Primitive::Rfactor {
                                    loop_var: name.clone(),
                                    factor,
                                },
                            );
                            attempt(&mut w, &mut s, Primitive::Vectorize { loop_var: i });
                            // A reduction over a concatenation (Swin's patch merging: four
                            // strided slices, then a LayerNorm) selects per element: its
                            // loop over vectors is cut where the selection changes.
                            cut_by_checks(&mut w, &mut s, &o, 1, MAX_PIECES);
                        }
                    }
                }
                continue;
            }
            // A concatenation along the vector axis (channels-last: `c < c0 ? a : c < c1 ? b :
            // ...` for every element) is cut into one loop per input first, each vectorized
            // on its own (DenseNet's concatenations of up to 48 layers' features).
            let pieces = cut_by_checks(&mut w, &mut s, &name, 2 * lanes.max(1), MAX_PIECES);
            let cut = pieces.len() > 1;
            for piece in pieces {
                if loop_named(&w, &piece).is_some_and(|(l, _)| l.extent >= 2) {
                    attempt(&mut w, &mut s, Primitive::Vectorize { loop_var: piece });
                }
            }
            // Where the selection depends on the loop around the vector loop too (a row split
            // into vectors), that loop is cut instead.
            if !cut {
                if let Some(parent) = serial_parent(&w, &name) {
                    cut_by_checks(&mut w, &mut s, &parent, 1, MAX_PIECES);
                }
            }
        }
        // Windowed nests (pooling, direct convolution): the loop just outside a small
        // reduction window is vectorized, the window unrolled inside it. Where the window is
        // bounds-checked (padding, ceil mode), the window loop and the serial loop directly
        // around it are first partitioned into an unchecked interior and checked borders.
        let mut window_loops = vec![];
        if let Some((l, _)) = loop_named(&w, &root) {
            collect_window_loops(
                &w,
                std::slice::from_ref(&Stmt::For(l.clone())),
                &mut window_loops,
            );
        }
        for name in &window_loops {
            if let Some(parent) = serial_parent(&w, name) {
                attempt(&mut w, &mut s, Primitive::Partition { loop_var: parent });
            }
        }
        let mut window_loops = vec![];
        if let Some((l, _)) = loop_named(&w, &root) {
            collect_window_loops(
                &w,
                std::slice::from_ref(&Stmt::For(l.clone())),
                &mut window_loops,
            );
        }
        for name in window_loops {
            let Some((l, _)) = loop_named(&w, &name) else {
                continue;
            };
            if l.kind != LoopKind::Serial || l.extent < 8 {
                continue;
            }
            for piece in cut_by_checks(&mut w, &mut s, &name, 8, 16) {
                let Some((l, _)) = loop_named(&w, &piece) else {
                    continue;
                };
                if l.extent < 8 {
                    continue;
                }
                attempt(&mut w, &mut s, Primitive::Vectorize { loop_var: piece });
            }
        }
    }
    s
}

/// The factor by which to delinearize loop `l`: the largest `d` between 1 and its extent,
/// dividing it, such that a comparison in its body reads `l / d` or `l % d` (Swin's roll over
/// a flattened 56 x 56 image checks `p / 56 < 3` and `p % 56 < 3` for every element).
fn delinearize_factor(l: &Loop) -> Option<i64> {
    let (v, n) = (l.var, l.extent);
    // Only plain loop nests: the partitions it serves refuse allocations and gemms, and a
    // flash-attention nest over (head, query block) split this way computed wrong results.
    let mut plain = true;
    for st in &l.body {
        st.visit(&mut |st| plain &= !matches!(st, Stmt::Gemm(_) | Stmt::Alloc(_) | Stmt::Barrier | Stmt::BlockReduce { .. }));
    }
    if !plain {
        return None;
    }
    let mut best = None;
    for st in &l.body {
        st.visit_exprs(&mut |e| {
            e.visit(&mut |x| {
                let Expr::Binary(BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge, a, b) = x else { return };
                for side in [a, b] {
                    side.visit(&mut |y| {
                        if let Expr::Binary(BinOp::Div | BinOp::FloorDiv | BinOp::Rem | BinOp::FloorMod, p, q) = y {
                            if let (Expr::Var(u), Expr::Int(d)) = (&**p, &**q) {
                                if *u == v && *d > 1 && *d < n && n % d == 0 {
                                    best = best.max(Some(*d));
                                }
                            }
                        }
                    });
                }
            });
        });
    }
    best
}

/// Most pieces [`cut_by_checks`] cuts an innermost loop into.
const MAX_PIECES: usize = 64;

/// Loop `name` partitioned by the checks in its body ([`super::partition`]) when its interior
/// holds at least `min_interior` iterations, then each piece after it cut again while it still
/// checks (a concatenation's inputs along the loop: one piece per input), up to `max_pieces`
/// pieces in all. The pieces in order (the loop alone when it is not cut).
fn cut_by_checks(w: &mut Kernel, s: &mut Schedule, name: &str, min_interior: i64, max_pieces: usize) -> Vec<String> {
    let mut pieces = vec![name.to_string()];
    // The first cut on a copy, kept only with a long enough interior; `partition` leaves the
    // kernel unchanged when it refuses, so the later cuts run in place.
    let mut trial = w.clone();
    match super::partition(&mut trial, name) {
        Ok(p) if p.interior_end - p.interior_start >= min_interior => {
            *w = trial;
            s.push(Primitive::Partition { loop_var: name.to_string() });
            pieces.splice(0..0, p.before);
            let mut next = p.after;
            while pieces.len() + 1 < max_pieces {
                let Some(a) = next.take() else { break };
                match super::partition(w, &a) {
                    Ok(q) => {
                        s.push(Primitive::Partition { loop_var: a.clone() });
                        pieces.extend(q.before);
                        pieces.push(a);
                        next = q.after;
                    }
                    Err(_) => pieces.push(a),
                }
            }
            pieces.extend(next);
        }
        _ => {}
    }
    pieces
}

/// The loop directly around loop `name` when it is serial and `name` is its whole body.
fn serial_parent(k: &Kernel, name: &str) -> Option<String> {
    let (_, pos) = loop_named(k, name)?;
    let &(pv, _, kind) = pos.ancestors.last()?;
    if kind != LoopKind::Serial {
        return None;
    }
    let (pl, _) = loop_named(k, &var_name(k, pv))?;
    (pl.body.len() == 1).then(|| var_name(k, pv))
}

/// Loops whose body holds only a small serial nest (a window) besides straight-line code.
fn collect_window_loops(k: &Kernel, stmts: &[Stmt], out: &mut Vec<String>) {
    for s in stmts {
        match s {
            Stmt::For(l) => {
                let r = Region::of(&l.body);
                if r.loops > 0 && r.gemms == 0 && super::loops::small_serial_nest(&l.body) {
                    out.push(var_name(k, l.var));
                } else {
                    collect_window_loops(k, &l.body, out);
                }
            }
            Stmt::If { then_, else_, .. } => {
                collect_window_loops(k, then_, out);
                collect_window_loops(k, else_, out);
            }
            _ => {}
        }
    }
}

fn loop_named<'a>(k: &'a Kernel, name: &str) -> Option<(&'a Loop, super::LoopPos)> {
    let v = k.var_named(name)?;
    let pos = locate(&k.body, v)?;
    Some((loop_ref(k, &pos)?, pos))
}

/// Names of the loops without loops inside, under `stmts`.
fn collect_innermost(k: &Kernel, stmts: &[Stmt], out: &mut Vec<String>) {
    for s in stmts {
        match s {
            Stmt::For(l) => {
                let r = Region::of(&l.body);
                if r.loops == 0 && r.gemms == 0 {
                    out.push(var_name(k, l.var));
                } else {
                    collect_innermost(k, &l.body, out);
                }
            }
            Stmt::If { then_, else_, .. } => {
                collect_innermost(k, then_, out);
                collect_innermost(k, else_, out);
            }
            _ => {}
        }
    }
}

/// Whether loop `l`'s body loads elements of one byte (booleans, 8-bit integers).
fn reads_bytes(k: &Kernel, l: &Loop) -> bool {
    Region::of(&l.body).loads.iter().any(|(b, _)| k.buf(*b).dtype.size_bytes() == 1)
}

/// The element type a loop mostly works on: its first store's buffer, else its accumulator's,
/// else its first load's, else f32.
fn loop_dtype(k: &Kernel, l: &Loop) -> DType {
    let r = Region::of(&l.body);
    if let Some((b, _, _)) = r.stores.first() {
        return k.buf(*b).dtype;
    }
    for v in r.carried_scalars() {
        if let Ty::Elem(d) = k.var_info(v).ty {
            return d;
        }
    }
    r.loads
        .first()
        .map(|(b, _)| k.buf(*b).dtype)
        .unwrap_or(DType::F32)
}
