//! rfactor: partial accumulators for a reduction loop.

use tilec_ir::DType;

use super::deps::Region;
use super::loops::split_vars;
use super::{
    atomically, block_mut, err, find_loop, fresh_buffer, fresh_var, locate, loop_ref, var_name,
    ScheduleError,
};
use crate::ir::*;

/// How an accumulator is updated: `acc = op(acc, x)` (`acc_left`) or `acc = op(x, acc)`.
#[derive(Clone, Copy, Debug)]
struct Update {
    acc: VarId,
    op: BinOp,
    acc_left: bool,
    dtype: DType,
}

/// The identity element of a combine op, or `None` for bool accumulators.
fn identity(op: BinOp, d: DType) -> Option<Lit> {
    if d == DType::Bool {
        return None;
    }
    if d.is_float() {
        // e4m3 has no infinities: its largest finite magnitude is 448.
        let big = if d == DType::F8E4M3 {
            448.0
        } else {
            f64::INFINITY
        };
        let x = match op {
            BinOp::Add => -0.0,
            BinOp::Mul => 1.0,
            BinOp::Max => -big,
            _ => big,
        };
        return Some(Lit::Float(x, d));
    }
    let bits = d.size_bytes() as u32 * 8;
    let signed = matches!(d, DType::I8 | DType::I16 | DType::I32 | DType::I64);
    Some(if signed {
        let (min, max) = if bits == 64 {
            (i64::MIN, i64::MAX)
        } else {
            (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1)
        };
        Lit::Int(
            match op {
                BinOp::Add => 0,
                BinOp::Mul => 1,
                BinOp::Max => min,
                _ => max,
            },
            d,
        )
    } else {
        let max = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        Lit::UInt(
            match op {
                BinOp::Add => 0,
                BinOp::Mul => 1,
                BinOp::Max => 0,
                _ => max,
            },
            d,
        )
    })
}

fn count_var_reads(stmts: &[Stmt], v: VarId) -> usize {
    let mut n = 0;
    let mut e = |x: &Expr| {
        x.visit(&mut |x| {
            if *x == Expr::Var(v) {
                n += 1
            }
        })
    };
    for s in stmts {
        s.visit(&mut |s| match s {
            Stmt::Store { index, value, .. } => {
                index.iter().for_each(&mut e);
                e(value);
            }
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => e(value),
            Stmt::If { cond, .. } => e(cond),
            Stmt::Gemm(g) => {
                e(&g.a);
                e(&g.b);
            }
            _ => {}
        });
    }
    n
}

/// Collects the assignments to `acc` in `stmts`.
fn assigns(stmts: &[Stmt], acc: VarId, out: &mut Vec<Expr>) {
    for s in stmts {
        s.visit(&mut |s| {
            if let Stmt::Assign { var, value } = s {
                if *var == acc {
                    out.push(value.clone());
                }
            }
        });
    }
}

/// Replaces `acc = op(acc, x)` by `rf[i] = op(rf[i], x)`.
fn rewrite(stmts: &mut [Stmt], u: &Update, rf: BufId, i: VarId) {
    for s in stmts {
        match s {
            Stmt::Assign { var, value } if *var == u.acc => {
                let x = match std::mem::replace(value, Expr::Int(0)) {
                    Expr::Binary(_, a, b) => {
                        if u.acc_left {
                            *b
                        } else {
                            *a
                        }
                    }
                    other => other,
                };
                let cur = Expr::load(rf, vec![Expr::Var(i)]);
                let v = if u.acc_left {
                    Expr::bin(u.op, cur, x)
                } else {
                    Expr::bin(u.op, x, cur)
                };
                *s = Stmt::store(rf, vec![Expr::Var(i)], v);
            }
            Stmt::For(l) => rewrite(&mut l.body, u, rf, i),
            Stmt::If { then_, else_, .. } => {
                rewrite(then_, u, rf, i);
                rewrite(else_, u, rf, i);
            }
            _ => {}
        }
    }
}

/// Splits reduction loop `name` by `factor` (see [`split`](super::split): `name_o` around
/// `name_i`) and gives each scalar accumulator updated in it `factor` partial accumulators in a
/// local buffer `<acc>_rf`: initialized to the identity of the update, updated as
/// `<acc>_rf[name_i] = op(<acc>_rf[name_i], x)`, and combined into the accumulator after the
/// loop (pairwise, in `log2(factor)` loops `name_tree*`, when the factor is a power of two of at
/// least 4; else in order). `name_i` then has independent iterations (it can be vectorized).
///
/// Every accumulator (a mutable scalar declared outside the loop and assigned inside it) must be
/// updated only as `acc = op(acc, x)` or `acc = op(x, acc)` with `op` one of add, mul, max, min
/// and `x` not reading any accumulator, and must not be read otherwise inside the loop. The
/// result differs from the serial loop only by reassociation of `op` (exact for integers,
/// max and min). Returns the names of the new outer and inner loops.
pub fn rfactor(k: &mut Kernel, name: &str, factor: i64) -> Result<(String, String), ScheduleError> {
    const P: &str = "rfactor";
    atomically(k, |k| {
        let (_, pos) = find_loop(k, P, name)?;
        if factor < 1 {
            return Err(err(
                k,
                P,
                format!("factor {factor} of loop `{name}` must be at least 1"),
            ));
        }
        let l = loop_ref(k, &pos)
            .ok_or_else(|| err(k, P, "loop vanished"))?
            .clone();
        if l.kind != LoopKind::Serial {
            return Err(err(
                k,
                P,
                format!("loop `{name}` is {:?}, not serial", l.kind),
            ));
        }
        let region = Region::of(&l.body);
        if region.gemms > 0 {
            return Err(err(k, P, format!("loop `{name}` contains a gemm")));
        }
        let accs = region.carried_scalars();
        if accs.is_empty() {
            return Err(err(
                k,
                P,
                format!("loop `{name}` updates no accumulator declared outside it"),
            ));
        }
        let mut updates = vec![];
        for &acc in &accs {
            let an = var_name(k, acc);
            let dtype = match k.var_info(acc).ty {
                Ty::Elem(d) if d != DType::Bool => d,
                _ => {
                    return Err(err(
                        k,
                        P,
                        format!("accumulator `{an}` is not a numeric element"),
                    ))
                }
            };
            let mut vals = vec![];
            assigns(&l.body, acc, &mut vals);
            let mut update: Option<Update> = None;
            for v in &vals {
                let (op, a, b) = match v {
                    Expr::Binary(op @ (BinOp::Add | BinOp::Mul | BinOp::Max | BinOp::Min), a, b) => (*op, a, b),
                    _ => {
                        return Err(err(k, P, format!("accumulator `{an}` is not updated as `{an} = op({an}, x)` with op add, mul, max or min")))
                    }
                };
                let acc_left = match (&**a, &**b) {
                    (Expr::Var(x), _) if *x == acc => true,
                    (_, Expr::Var(x)) if *x == acc => false,
                    _ => {
                        return Err(err(
                            k,
                            P,
                            format!("an update of `{an}` does not combine `{an}` with a value"),
                        ))
                    }
                };
                let x = if acc_left { b } else { a };
                if let Some(o) = accs.iter().find(|o| x.uses_var(**o)) {
                    return Err(err(
                        k,
                        P,
                        format!(
                            "the update of `{an}` reads accumulator `{}`",
                            var_name(k, *o)
                        ),
                    ));
                }
                match update {
                    None => {
                        update = Some(Update {
                            acc,
                            op,
                            acc_left,
                            dtype,
                        })
                    }
                    Some(u) if u.op == op => {}
                    Some(u) => {
                        return Err(err(
                            k,
                            P,
                            format!(
                                "accumulator `{an}` is updated with both {:?} and {op:?}",
                                u.op
                            ),
                        ))
                    }
                }
            }
            let Some(u) = update else {
                return Err(err(k, P, format!("accumulator `{an}` is not updated")));
            };
            if count_var_reads(&l.body, acc) != vals.len() {
                return Err(err(
                    k,
                    P,
                    format!("accumulator `{an}` is read inside loop `{name}` outside its updates"),
                ));
            }
            updates.push(u);
        }
        let (o, i) = split_vars(k, name, factor)?;
        let opos = locate(&k.body, o).ok_or_else(|| err(k, P, "loop vanished"))?;
        let f = loop_ref(k, &opos)
            .and_then(|l| match l.body.first() {
                Some(Stmt::For(inner)) => Some(inner.extent),
                _ => None,
            })
            .ok_or_else(|| err(k, P, "split produced an unexpected nest"))?;
        // A ragged split guards every iteration (`if o * f + i < n`), which keeps the C
        // compiler from vectorizing the inner loop; the last, partial block becomes a loop of
        // its own instead (`n % f` iterations at `o = n / f`), and the full blocks lose the
        // guard.
        let n = l.extent;
        let tail_v = (n % f != 0).then(|| fresh_var(k, &format!("{name}_tail"), Ty::Index, false));
        let init_v = fresh_var(k, &format!("{name}_init"), Ty::Index, false);
        let comb_v = fresh_var(k, &format!("{name}_comb"), Ty::Index, false);
        let tree_vars: Vec<VarId> = if f >= 4 && f.count_ones() == 1 {
            halves(f)
                .map(|_| fresh_var(k, &format!("{name}_tree"), Ty::Index, false))
                .collect()
        } else {
            vec![]
        };
        let mut allocs = vec![];
        let mut init = vec![];
        let mut comb = vec![];
        let mut rfs = vec![];
        for u in &updates {
            let an = var_name(k, u.acc);
            let id = identity(u.op, u.dtype)
                .ok_or_else(|| err(k, P, format!("no identity for `{an}`")))?;
            let rf = fresh_buffer(k, &format!("{an}_rf"), u.dtype, vec![f], Scope::Local);
            allocs.push(Stmt::Alloc(rf));
            init.push(Stmt::store(rf, vec![Expr::Var(init_v)], Expr::Lit(id)));
            let part = Expr::load(rf, vec![Expr::Var(comb_v)]);
            let value = if u.acc_left {
                Expr::bin(u.op, Expr::Var(u.acc), part)
            } else {
                Expr::bin(u.op, part, Expr::Var(u.acc))
            };
            comb.push(Stmt::Assign { var: u.acc, value });
            rfs.push(rf);
        }
        let kname = k.name.clone();
        let block = block_mut(&mut k.body, &opos.block).ok_or_else(|| ScheduleError {
            kernel: kname,
            primitive: P.into(),
            reason: "loop vanished".into(),
        })?;
        let mut tail = None;
        if let Some(Stmt::For(lo)) = block.get_mut(opos.idx) {
            for (u, rf) in updates.iter().zip(&rfs) {
                rewrite(&mut lo.body, u, *rf, i);
            }
            if let Some(tv) = tail_v {
                tail = peel_partial_block(lo, n, f, i, tv);
            }
        }
        let mut at = opos.idx;
        if let Some(t) = tail {
            block.insert(at + 1, t);
            at += 1;
        }
        // Partials combined pairwise (f/2, f/4, ..., 1 apart) when f is a power of two, so the
        // combine is log2(f) vector steps instead of a chain of f dependent operations; then
        // the accumulator takes partial 0.
        let mut combine = vec![];
        let mut comb_n = f;
        if f >= 4 && f.count_ones() == 1 {
            for (t, half) in tree_vars.iter().zip(halves(f)) {
                let mut body = vec![];
                for (u, rf) in updates.iter().zip(&rfs) {
                    let a = Expr::load(*rf, vec![Expr::Var(*t)]);
                    let b = Expr::load(*rf, vec![Expr::add(Expr::Var(*t), Expr::Int(half))]);
                    body.push(Stmt::store(*rf, vec![Expr::Var(*t)], Expr::bin(u.op, a, b)));
                }
                combine.push(Stmt::for_(*t, half, body));
            }
            comb_n = 1;
        }
        combine.push(Stmt::for_(comb_v, comb_n, comb));
        block.splice(at + 1..at + 1, combine);
        allocs.push(Stmt::for_(init_v, f, init));
        block.splice(opos.idx..opos.idx, allocs);
        Ok((var_name(k, o), var_name(k, i)))
    })
}

/// Splits the guarded nest `for o < ceil(n / f) { for i < f { if o * f + i < n { B } } }` into
/// the full blocks `for o < n / f { for i < f { B } }` (in place) and the partial one, returned:
/// `for t < n % f { B[o := n / f, i := t] }`. `None` (and `lo` untouched) when the nest is not
/// of that form.
fn peel_partial_block(lo: &mut Loop, n: i64, f: i64, i: VarId, t: VarId) -> Option<Stmt> {
    let [Stmt::For(inner)] = &lo.body[..] else {
        return None;
    };
    let [Stmt::If { then_, else_, .. }] = &inner.body[..] else {
        return None;
    };
    if inner.var != i || inner.extent != f || !else_.is_empty() || n / f < 1 {
        return None;
    }
    let body = then_.clone();
    let mut tail = body.clone();
    for s in &mut tail {
        s.substitute(lo.var, &Expr::Int(n / f));
        s.substitute(i, &Expr::Var(t));
    }
    if let Some(Stmt::For(inner)) = lo.body.first_mut() {
        inner.body = body;
    }
    lo.extent = n / f;
    Some(Stmt::for_(t, n % f, tail))
}

/// `f/2, f/4, ..., 1` for a power of two `f`.
fn halves(f: i64) -> impl Iterator<Item = i64> {
    std::iter::successors(Some(f / 2), |&h| (h > 1).then_some(h / 2))
}
