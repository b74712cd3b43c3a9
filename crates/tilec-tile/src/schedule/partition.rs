//! Loop partitioning: a loop whose body checks bounds that depend on its variable (a padded
//! pooling or convolution window, a guarded split) is cut into a border before, an interior, and
//! a border after, and in the interior the checks that hold for every iteration are dropped.

use std::collections::BTreeSet;

use super::affine::{AffineCx, Atom, Ranges};
use super::{atomically, block_mut, err, find_loop, fresh_var, loop_ref, var_name, ScheduleError};
use crate::ir::*;

/// The loops [`partition`] leaves where the loop was: the interior keeps the loop's name (and
/// the names of everything inside it); the border copies get fresh names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partitioned {
    /// The loop over the iterations before the interior (absent when there are none).
    pub before: Option<String>,
    /// The interior loop (the original name), which runs `interior_start..interior_end`.
    pub interior: String,
    pub after: Option<String>,
    pub interior_start: i64,
    pub interior_end: i64,
    /// Bounds checks dropped from the interior.
    pub dropped: usize,
}

/// Splits serial loop `name` by `factor`, which must divide its extent and lie strictly between
/// 1 and it, and simplifies the indices in its body with the loops' extents, so that `name /
/// factor` and `name % factor` become the new outer and inner variables (a flattened image
/// index whose row and column a rolled or padded window checks becomes two loops, each of
/// which [`partition`] can cut by its own check). Returns the outer and inner loops' names.
pub fn delinearize(k: &mut Kernel, name: &str, factor: i64) -> Result<(String, String), ScheduleError> {
    const P: &str = "delinearize";
    atomically(k, |k| {
        let (_, pos) = find_loop(k, P, name)?;
        let l = loop_ref(k, &pos).ok_or_else(|| err(k, P, "loop vanished"))?;
        let n = l.extent;
        if l.kind != LoopKind::Serial {
            return Err(err(k, P, format!("loop `{name}` is not serial")));
        }
        if factor < 2 || factor >= n || n % factor != 0 {
            return Err(err(k, P, format!("factor {factor} does not divide loop `{name}`'s extent {n} into two loops")));
        }
        let (o, i) = super::loops::split_vars(k, name, factor)?;
        let extents = loop_extents(k);
        let vanished = err(k, P, "loop vanished");
        let l = super::loop_mut(k, &pos).ok_or(vanished)?;
        crate::lower::simplify::simplify_accesses(&mut l.body, &extents);
        Ok((var_name(k, o), var_name(k, i)))
    })
}

/// The extent of every loop variable of `k` (the largest where a name is reused), for
/// simplifying indices after a loop changed.
fn loop_extents(k: &Kernel) -> crate::lower::simplify::Ranges {
    let mut extents = crate::lower::simplify::Ranges::new();
    for s in &k.body {
        s.visit(&mut |s| {
            if let Stmt::For(l) = s {
                let e = extents.entry(l.var).or_insert(0);
                *e = (*e).max(l.extent);
            }
        });
    }
    extents
}

/// Partitions serial loop `name` (extent `n`) by the bounds checks in its body: every comparison
/// `a < b`, `a <= b`, `a > b`, `a >= b` of affine index forms in which the loop variable appears
/// (with a constant coefficient, outside divisions) and whose other variables are loops inside the
/// body defines, for each iteration, whether the check holds for all values of the inner loops.
/// The iterations where every such check holds form an interval `[lo, hi)`; the loop becomes a
/// loop over `[0, lo)` and one over `[hi, n)` running the body unchanged (with fresh variable
/// names), around the interior loop over `[lo, hi)` (variable `name` counting from zero, the
/// body seeing `name + lo`) in which the checks are replaced by `true` and folded away.
///
/// Iterations still run in their original order, so the transform is always legal. Refused when
/// the body holds no such check, when no iteration satisfies all of them, or when it allocates
/// buffers or contains a gemm.
pub fn partition(k: &mut Kernel, name: &str) -> Result<Partitioned, ScheduleError> {
    const P: &str = "partition";
    atomically(k, |k| {
        let (v, pos) = find_loop(k, P, name)?;
        let l = loop_ref(k, &pos)
            .ok_or_else(|| err(k, P, "loop vanished"))?
            .clone();
        if l.kind != LoopKind::Serial {
            return Err(err(k, P, format!("loop `{name}` is not serial")));
        }
        let n = l.extent;
        if n < 1 {
            return Err(err(k, P, format!("loop `{name}` has no iterations")));
        }
        let mut bad = false;
        let mut inner: Ranges = Ranges::new();
        for s in &l.body {
            s.visit(&mut |s| match s {
                Stmt::For(il) => {
                    inner.insert(il.var, (0, il.extent.saturating_sub(1).max(0)));
                }
                Stmt::Alloc(_) | Stmt::Gemm(_) | Stmt::Barrier | Stmt::BlockReduce { .. } => {
                    bad = true
                }
                _ => {}
            });
        }
        if bad {
            return Err(err(
                k,
                P,
                format!("the body of loop `{name}` allocates, synchronizes or holds a gemm"),
            ));
        }
        // Candidate checks and the interval of iterations where each holds.
        let cx = AffineCx::new(k);
        let mut checks: Vec<Expr> = vec![];
        // Per check, the iterations (inclusive) from which on (c < 0) or up to which (c > 0)
        // it fails for every inner value.
        let mut fails: Vec<(bool, i64)> = vec![];
        let (mut lo, mut hi) = (0i64, n - 1);
        let mut exprs = vec![];
        for s in &l.body {
            s.visit_exprs(&mut |e| exprs.push(e.clone()));
        }
        let allowed: BTreeSet<VarId> = inner.keys().copied().chain([v]).collect();
        for e in &exprs {
            e.visit(&mut |e| {
                let Expr::Binary(op, a, b) = e else { return };
                if checks.contains(e) {
                    return;
                }
                // Normal form f >= 0.
                let (Some(x), Some(y)) = (cx.affine(a), cx.affine(b)) else {
                    return;
                };
                let f = match op {
                    BinOp::Ge => x.sub(&y),
                    BinOp::Gt => x
                        .sub(&y)
                        .and_then(|d| d.add(&super::affine::Affine::constant(-1))),
                    BinOp::Le => y.sub(&x),
                    BinOp::Lt => y
                        .sub(&x)
                        .and_then(|d| d.add(&super::affine::Affine::constant(-1))),
                    _ => return,
                };
                let Some(f) = f else { return };
                let Some(&c) = f.terms.get(&Atom::Var(v)) else {
                    return;
                };
                if c == 0 || !f.vars().is_subset(&allowed) {
                    return;
                }
                let mut rest = f.clone();
                rest.terms.remove(&Atom::Var(v));
                if rest.vars().contains(&v) {
                    return;
                }
                let Some((rlo, rhi)) = rest.bounds(&inner) else {
                    return;
                };
                // Holds for every inner value where c * v + rlo >= 0; fails for every inner
                // value where c * v + rhi < 0.
                let (rlo, rhi, c) = (rlo as i128, rhi as i128, c as i128);
                let ceil_div =
                    |a: i128, b: i128| a.div_euclid(b) + i128::from(a.rem_euclid(b) != 0);
                let clamp = |x: i128| x.clamp(-1, n as i128) as i64;
                if c > 0 {
                    lo = lo.max(clamp(ceil_div(-rlo, c)).max(0));
                    fails.push((false, clamp(ceil_div(-rhi, c) - 1)));
                } else {
                    hi = hi.min(clamp(rlo.div_euclid(-c)));
                    fails.push((true, clamp(rhi.div_euclid(-c) + 1)));
                }
                checks.push(e.clone());
            });
        }
        if checks.is_empty() {
            return Err(err(
                k,
                P,
                format!("the body of loop `{name}` checks no bound of it"),
            ));
        }
        if lo > hi {
            return Err(err(
                k,
                P,
                format!("no iteration of loop `{name}` passes all its bounds checks"),
            ));
        }
        let end = hi + 1;
        // The border copies.
        let border = |k: &mut Kernel, start: i64, extent: i64, tag: &str| -> Stmt {
            let mut b = l.body.clone();
            // Checks that fail on every iteration of the piece become `false`.
            let last = start + extent - 1;
            let falses: Vec<&Expr> = checks
                .iter()
                .zip(&fails)
                .filter(|(_, &(from, at))| if from { start >= at } else { last <= at })
                .map(|(e, _)| e)
                .collect();
            if !falses.is_empty() {
                for s in b.iter_mut() {
                    s.map_exprs(&mut |e| {
                        e.rewrite(&mut |e| {
                            if falses.contains(&&e) {
                                Expr::Lit(Lit::Bool(false))
                            } else {
                                fold_const(e)
                            }
                        })
                    });
                }
                b = fold_ifs(b);
            }
            rename_defs(k, &mut b);
            let nv = fresh_var(k, &format!("{name}_{tag}"), Ty::Index, false);
            let at = Expr::add(Expr::Var(nv), Expr::Int(start));
            for s in b.iter_mut() {
                s.substitute(v, &at);
            }
            Stmt::For(Loop {
                var: nv,
                extent,
                kind: LoopKind::Serial,
                body: b,
            })
        };
        let mut out = vec![];
        let mut before = None;
        if lo > 0 {
            let s = border(k, 0, lo, "lo");
            if let Stmt::For(b) = &s {
                before = Some(var_name(k, b.var));
            }
            out.push(s);
        }
        let mut ib = l.body.clone();
        for s in ib.iter_mut() {
            s.map_exprs(&mut |e| {
                e.rewrite(&mut |e| {
                    if checks.contains(&e) {
                        Expr::Lit(Lit::Bool(true))
                    } else {
                        fold_const(e)
                    }
                })
            });
            if lo != 0 {
                s.substitute(v, &Expr::add(Expr::Var(v), Expr::Int(lo)));
            }
        }
        let ib = fold_ifs(ib);
        out.push(Stmt::For(Loop {
            var: v,
            extent: end - lo,
            kind: LoopKind::Serial,
            body: ib,
        }));
        let mut after = None;
        if end < n {
            let s = border(k, end, n - end, "hi");
            if let Stmt::For(b) = &s {
                after = Some(var_name(k, b.var));
            }
            out.push(s);
        }
        // Each piece starts at a known iteration: indices that stayed unsimplified for want of
        // a sign (a concatenation's `i - n0` under a remainder) may now simplify.
        crate::lower::simplify::simplify_accesses(&mut out, &loop_extents(k));
        let vanished = err(k, P, "loop vanished");
        let block = block_mut(&mut k.body, &pos.block).ok_or(vanished)?;
        block.splice(pos.idx..pos.idx + 1, out);
        Ok(Partitioned {
            before,
            interior: name.to_string(),
            after,
            interior_start: lo,
            interior_end: end,
            dropped: checks.len(),
        })
    })
}

/// Gives every variable defined in `stmts` (loop variables, `let`s) a fresh name.
fn rename_defs(k: &mut Kernel, stmts: &mut [Stmt]) {
    let mut defs = vec![];
    for s in stmts.iter() {
        s.visit(&mut |s| match s {
            Stmt::For(l) => defs.push(l.var),
            Stmt::Let { var, .. } => defs.push(*var),
            _ => {}
        });
    }
    defs.sort();
    defs.dedup();
    for old in defs {
        let info = k.var_info(old).clone();
        let new = fresh_var(k, &info.name, info.ty, info.mutable);
        for s in stmts.iter_mut() {
            rename_stmt(s, old, new);
        }
    }
}

fn rename_stmt(s: &mut Stmt, old: VarId, new: VarId) {
    let with = Expr::Var(new);
    let re = |v: &mut VarId| {
        if *v == old {
            *v = new;
        }
    };
    match s {
        Stmt::For(l) => {
            re(&mut l.var);
            for s in l.body.iter_mut() {
                rename_stmt(s, old, new);
            }
        }
        Stmt::Store { index, value, .. } => {
            for e in index.iter_mut() {
                *e = std::mem::replace(e, Expr::Int(0)).substitute(old, &with);
            }
            *value = std::mem::replace(value, Expr::Int(0)).substitute(old, &with);
        }
        Stmt::Let { var, value } | Stmt::Assign { var, value } => {
            re(var);
            *value = std::mem::replace(value, Expr::Int(0)).substitute(old, &with);
        }
        Stmt::If { cond, then_, else_ } => {
            *cond = std::mem::replace(cond, Expr::Int(0)).substitute(old, &with);
            for s in then_.iter_mut().chain(else_.iter_mut()) {
                rename_stmt(s, old, new);
            }
        }
        Stmt::BlockReduce { var, .. } => re(var),
        Stmt::Alloc(_) | Stmt::Barrier | Stmt::Gemm(_) => {}
    }
}

fn is_true(e: &Expr) -> bool {
    matches!(e, Expr::Lit(Lit::Bool(true)))
}

fn is_false(e: &Expr) -> bool {
    matches!(e, Expr::Lit(Lit::Bool(false)))
}

/// One folding step for a node whose children are already folded: `true && x`, `false && x`,
/// `true || x`, `false || x` (either side), `true ? a : b`, `false ? a : b`. Expressions have
/// no side effects, so dropping an operand is exact.
fn fold_const(e: Expr) -> Expr {
    match e {
        Expr::Binary(BinOp::And, a, b) if is_true(&a) => *b,
        Expr::Binary(BinOp::And, a, b) if is_true(&b) => *a,
        Expr::Binary(BinOp::And, a, b) if is_false(&a) || is_false(&b) => {
            Expr::Lit(Lit::Bool(false))
        }
        Expr::Binary(BinOp::Or, a, b) if is_false(&a) => *b,
        Expr::Binary(BinOp::Or, a, b) if is_false(&b) => *a,
        Expr::Binary(BinOp::Or, a, b) if is_true(&a) || is_true(&b) => Expr::Lit(Lit::Bool(true)),
        Expr::Select(c, a, _) if is_true(&c) => *a,
        Expr::Select(c, _, b) if is_false(&c) => *b,
        e => e,
    }
}

/// Replaces `if true { A } else { B }` by `A` and `if false { A } else { B }` by `B`.
fn fold_ifs(stmts: Vec<Stmt>) -> Vec<Stmt> {
    let mut out = vec![];
    for s in stmts {
        match s {
            Stmt::If { cond, then_, .. } if is_true(&cond) => out.extend(fold_ifs(then_)),
            Stmt::If { cond, else_, .. } if is_false(&cond) => out.extend(fold_ifs(else_)),
            Stmt::If { cond, then_, else_ } => out.push(Stmt::If {
                cond,
                then_: fold_ifs(then_),
                else_: fold_ifs(else_),
            }),
            Stmt::For(mut l) => {
                l.body = fold_ifs(l.body);
                out.push(Stmt::For(l));
            }
            s => out.push(s),
        }
    }
    out
}
