//! Simplification of index expressions.
//!
//! Index expressions are normalized to affine sums `c + sum k_i * atom_i` over atoms (loop
//! variables, divisions, remainders, selects, ...), using the extents of loop variables to
//! prove ranges: `(x * 12 + y) / 12 = x` when `0 <= y < 12`, `(x * 12 + y) % 12 = y`,
//! `(z / 4) * 4 + z % 4 = z`. After a reshape round trip (ravel then unravel) this brings an
//! index back to the loop variables it came from, which is how the lowering recognizes that
//! an epilogue reads the element its anchor just produced. The normal form is deterministic,
//! so two equal indices compare equal structurally.
//!
//! Division and remainder by a positive constant follow floor semantics. `Div`/`Rem` (C
//! semantics) are emitted only when the dividend is provably non-negative, where both agree;
//! otherwise `FloorDiv`/`FloorMod`.

use std::collections::HashMap;

use crate::ir::{BinOp, Expr, Stmt, VarId};

/// Extents of loop variables (a variable `v` ranges over `0..ranges[v]`).
pub type Ranges = HashMap<VarId, i64>;

#[derive(Clone, Debug)]
struct Lin {
    terms: Vec<(Expr, i64)>,
    c: i64,
}

impl Lin {
    fn constant(c: i64) -> Lin {
        Lin { terms: vec![], c }
    }
    fn atom(e: Expr) -> Lin {
        Lin {
            terms: vec![(e, 1)],
            c: 0,
        }
    }
    fn add_term(&mut self, e: Expr, k: i64) {
        if k == 0 {
            return;
        }
        if let Some(t) = self.terms.iter_mut().find(|t| t.0 == e) {
            t.1 += k;
        } else {
            self.terms.push((e, k));
        }
        self.terms.retain(|t| t.1 != 0);
    }
    fn add(mut self, o: Lin, sign: i64) -> Lin {
        self.c += sign * o.c;
        for (e, k) in o.terms {
            self.add_term(e, sign * k);
        }
        self
    }
    fn scale(mut self, k: i64) -> Lin {
        if k == 0 {
            return Lin::constant(0);
        }
        self.c *= k;
        for t in &mut self.terms {
            t.1 *= k;
        }
        self
    }
    fn as_const(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.c)
    }
}

fn atom_range(e: &Expr, r: &Ranges) -> Option<(i64, i64)> {
    match e {
        Expr::Int(c) => Some((*c, *c)),
        Expr::Var(v) => r.get(v).map(|&n| (0, (n - 1).max(0))),
        Expr::Binary(op @ (BinOp::Div | BinOp::FloorDiv), x, d) => {
            let Expr::Int(d) = **d else { return None };
            if d <= 0 {
                return None;
            }
            let (lo, hi) = expr_range(x, r)?;
            if *op == BinOp::Div && lo < 0 {
                return None;
            }
            Some((lo.div_euclid(d), hi.div_euclid(d)))
        }
        Expr::Binary(BinOp::Rem | BinOp::FloorMod, x, d) => {
            let Expr::Int(d) = **d else { return None };
            if d <= 0 {
                return None;
            }
            match expr_range(x, r) {
                Some((lo, hi)) if lo >= 0 && hi < d => Some((lo, hi)),
                Some((lo, _)) if lo >= 0 => Some((0, d - 1)),
                _ => {
                    if matches!(e, Expr::Binary(BinOp::FloorMod, ..)) {
                        Some((0, d - 1))
                    } else {
                        None
                    }
                }
            }
        }
        Expr::Binary(BinOp::Min, a, b) => {
            let (a, b) = (expr_range(a, r)?, expr_range(b, r)?);
            Some((a.0.min(b.0), a.1.min(b.1)))
        }
        Expr::Binary(BinOp::Max, a, b) => {
            let (a, b) = (expr_range(a, r)?, expr_range(b, r)?);
            Some((a.0.max(b.0), a.1.max(b.1)))
        }
        Expr::Select(_, a, b) => {
            let (a, b) = (expr_range(a, r)?, expr_range(b, r)?);
            Some((a.0.min(b.0), a.1.max(b.1)))
        }
        _ => None,
    }
}

fn lin_range(l: &Lin, r: &Ranges) -> Option<(i64, i64)> {
    let (mut lo, mut hi) = (l.c, l.c);
    for (e, k) in &l.terms {
        let (a, b) = atom_range(e, r)?;
        let (x, y) = (a.checked_mul(*k)?, b.checked_mul(*k)?);
        lo = lo.checked_add(x.min(y))?;
        hi = hi.checked_add(x.max(y))?;
    }
    Some((lo, hi))
}

/// The range `[lo, hi]` of an index expression, when the variables' extents prove one.
pub fn expr_range(e: &Expr, r: &Ranges) -> Option<(i64, i64)> {
    lin_range(&to_lin(e.clone(), r), r)
}

thread_local! {
    /// Facts `form >= 0` that hold where the expression being simplified is evaluated: the
    /// conditions of the selects around it ([`simplify_expr`]).
    static FACTS: std::cell::RefCell<Vec<Lin>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with `facts` added to the facts in force.
fn with_facts<T>(facts: Vec<Lin>, f: impl FnOnce() -> T) -> T {
    let n = facts.len();
    FACTS.with(|x| x.borrow_mut().extend(facts));
    let out = f();
    FACTS.with(|x| {
        let mut v = x.borrow_mut();
        let keep = v.len() - n;
        v.truncate(keep);
    });
    out
}

/// The facts `form >= 0` that condition `c` gives where it holds (`taken`) or where it does
/// not: comparisons of index forms, and conjunctions of them where they hold.
fn facts_of(c: &Expr, taken: bool, r: &Ranges) -> Vec<Lin> {
    match c {
        Expr::Binary(BinOp::And, a, b) if taken => {
            let mut v = facts_of(a, true, r);
            v.extend(facts_of(b, true, r));
            v
        }
        Expr::Binary(op @ (BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge), x, y) if is_index_shaped(x) && is_index_shaped(y) => {
            let (x, y) = (to_lin((**x).clone(), r), to_lin((**y).clone(), r));
            // x < y  <=>  y - x - 1 >= 0, and its negation x - y >= 0; the others alike.
            let (ge, strict) = match (op, taken) {
                (BinOp::Lt, true) | (BinOp::Ge, false) => (false, true),
                (BinOp::Le, true) | (BinOp::Gt, false) => (false, false),
                (BinOp::Gt, true) | (BinOp::Le, false) => (true, true),
                _ => (true, false),
            };
            let mut f = if ge { x.add(y, -1) } else { y.add(x, -1) };
            if strict {
                f.c -= 1;
            }
            vec![f]
        }
        _ => vec![],
    }
}

/// Whether facts are in force (only inside [`simplify_expr`]'s selects): the rules that use
/// them cost nothing elsewhere.
fn has_facts() -> bool {
    FACTS.with(|x| !x.borrow().is_empty())
}

fn is_nonneg(l: &Lin, r: &Ranges) -> bool {
    if matches!(lin_range(l, r), Some((lo, _)) if lo >= 0) {
        return true;
    }
    if !has_facts() {
        return false;
    }
    // l = (l - m f) + m f with a fact f >= 0 and m > 0: non-negative if l - m f is, `m` the
    // ratio of a coefficient of `l` to that of the same atom in `f`. Facts are taken out one
    // at a time while each raises the lower bound (a roll along two axes needs both).
    FACTS.with(|facts| {
        let facts = facts.borrow();
        let lo = |x: &Lin| lin_range(x, r).map_or(i64::MIN, |b| b.0);
        let mut rest = l.clone();
        // A variable `v` of `l` whose quotient by `d` a fact bounds is `d * (v / d) + v % d`.
        for f in facts.iter() {
            for (e, _) in &f.terms {
                let Expr::Binary(op @ (BinOp::Div | BinOp::FloorDiv), x, d) = e else { continue };
                let (Expr::Var(_), Expr::Int(d)) = (&**x, &**d) else { continue };
                let Some(&(_, k)) = rest.terms.iter().find(|t| t.0 == **x) else { continue };
                let m = if *op == BinOp::Div { BinOp::Rem } else { BinOp::FloorMod };
                rest.add_term((**x).clone(), -k);
                rest.add_term(e.clone(), k * d);
                rest.add_term(Expr::bin(m, (**x).clone(), Expr::Int(*d)), k);
            }
        }
        for _ in 0..facts.len().min(4) {
            let mut best: Option<Lin> = None;
            for f in facts.iter() {
                for (e, kf) in &f.terms {
                    let Some((_, kl)) = rest.terms.iter().find(|t| t.0 == *e) else { continue };
                    if *kf == 0 || kl % kf != 0 || kl / kf <= 0 {
                        continue;
                    }
                    let cand = rest.clone().add(f.clone().scale(kl / kf), -1);
                    if lo(&cand) > best.as_ref().map_or(lo(&rest), lo) {
                        best = Some(cand);
                    }
                }
            }
            let Some(b) = best else { return false };
            if lo(&b) >= 0 {
                return true;
            }
            rest = b;
        }
        false
    })
}

/// Simplifies the indices of the loads in an element expression, each with what the selects
/// around it establish (a concatenation's `i - n0` under a reshape's remainders simplifies in
/// the branch where `i >= n0`): the form in which a matrix product's operand is analyzed.
pub fn simplify_expr(e: Expr, r: &Ranges) -> Expr {
    let go = |e: Box<Expr>| Box::new(simplify_expr(*e, r));
    match e {
        Expr::Load(b, idx) => Expr::Load(b, idx.into_iter().map(|x| simplify(x, r)).collect()),
        Expr::Select(c, a, b) => {
            let c = go(c);
            let (t, f) = (facts_of(&c, true, r), facts_of(&c, false, r));
            let a = with_facts(t, || go(a));
            let b = with_facts(f, || go(b));
            Expr::Select(c, a, b)
        }
        Expr::Unary(op, a) => Expr::Unary(op, go(a)),
        Expr::Cast(d, a) => Expr::Cast(d, go(a)),
        Expr::ToIndex(a) => Expr::ToIndex(go(a)),
        Expr::CheckIndex(a, c) => Expr::CheckIndex(go(a), c),
        Expr::Binary(op, a, b) => Expr::Binary(op, go(a), go(b)),
        e => e,
    }
}

fn div_lin(l: Lin, d: i64, r: &Ranges) -> Lin {
    if d == 1 {
        return l;
    }
    // Below `d` and, by the facts in force, not negative: no quotient.
    if has_facts() && matches!(lin_range(&l, r), Some((_, hi)) if hi < d) && is_nonneg(&l, r) {
        return Lin::constant(0);
    }
    let mut q = Lin::constant(l.c.div_euclid(d));
    let mut rest = Lin::constant(l.c.rem_euclid(d));
    for (e, k) in l.terms {
        if k % d == 0 {
            q.add_term(e, k / d);
        } else {
            rest.add_term(e, k);
        }
    }
    if let Some((lo, hi)) = lin_range(&rest, r) {
        if lo.div_euclid(d) == hi.div_euclid(d) {
            q.c += lo.div_euclid(d);
            return q;
        }
    }
    // (c*A + B) / (c*e) = A / e when 0 <= B < c (floor division): a flattened index divided
    // by a stride that a coarser term's coefficient divides, as reshapes leave behind.
    if let Some((big, e, _)) = split_multiple(&rest, d, r) {
        return q.add(div_lin(big, e, r), 1);
    }
    // (y / a) / d = y / (a * d) for positive a, d (floor division).
    if rest.c == 0 && rest.terms.len() == 1 && rest.terms[0].1 == 1 {
        if let Expr::Binary(op @ (BinOp::Div | BinOp::FloorDiv), y, a) = &rest.terms[0].0 {
            if let Expr::Int(a) = **a {
                if a > 0 {
                    let inner = to_lin((**y).clone(), r);
                    let _ = op;
                    return q.add(div_lin(inner, a * d, r), 1);
                }
            }
        }
    }
    let op = if is_nonneg(&rest, r) {
        BinOp::Div
    } else {
        BinOp::FloorDiv
    };
    q.add_term(Expr::bin(op, from_lin(rest), Expr::Int(d)), 1);
    q
}

fn rem_lin(l: Lin, d: i64, r: &Ranges) -> Lin {
    if d == 1 {
        return Lin::constant(0);
    }
    // Below `d` and, by the facts in force, not negative: the dividend itself.
    if has_facts() && matches!(lin_range(&l, r), Some((_, hi)) if hi < d) && is_nonneg(&l, r) {
        return l;
    }
    let mut rest = Lin::constant(l.c.rem_euclid(d));
    for (e, k) in l.terms {
        let k = k.rem_euclid(d);
        if k != 0 {
            rest.add_term(e, k);
        }
    }
    if let Some((lo, hi)) = lin_range(&rest, r) {
        if lo >= 0 && hi < d {
            return rest;
        }
        if lo.div_euclid(d) == hi.div_euclid(d) {
            rest.c -= lo.div_euclid(d) * d;
            return rest;
        }
    }
    // (c*A + B) % (c*e) = c * (A % e) + B when 0 <= B < c (floor modulo).
    if let Some((big, e, small)) = split_multiple(&rest, d, r) {
        let c = d / e;
        return rem_lin(big, e, r).scale(c).add(small, 1);
    }
    // (y % a) % d = y % d when d divides a.
    if rest.c == 0 && rest.terms.len() == 1 && rest.terms[0].1 == 1 {
        if let Expr::Binary(BinOp::Rem | BinOp::FloorMod, y, a) = &rest.terms[0].0 {
            if let Expr::Int(a) = **a {
                if a > 0 && a % d == 0 {
                    return rem_lin(to_lin((**y).clone(), r), d, r);
                }
            }
        }
    }
    let op = if is_nonneg(&rest, r) {
        BinOp::Rem
    } else {
        BinOp::FloorMod
    };
    Lin::atom(Expr::bin(op, from_lin(rest), Expr::Int(d)))
}

/// Splits `l` into `c * big + small` with `c > 1` dividing `d`, every coefficient of `big`'s
/// terms a multiple of `c` (before dividing) and `0 <= small < c` over the ranges; returns
/// `(big, d / c, small)`. The constant splits too (`big` takes its floor quotient by `c`: a
/// window's offset `(v * 96 + ch + 384) / 672` is `(v + 4) / 7` for `ch < 96`). Tries the
/// terms' coefficients as `c`, largest first.
fn split_multiple(l: &Lin, d: i64, r: &Ranges) -> Option<(Lin, i64, Lin)> {
    let mut cands: Vec<i64> = l
        .terms
        .iter()
        .map(|t| t.1.abs())
        .filter(|&k| k > 1 && k < d && d % k == 0)
        .collect();
    cands.sort_unstable_by(|a, b| b.cmp(a));
    cands.dedup();
    for c in cands {
        let mut big = Lin::constant(l.c.div_euclid(c));
        let mut small = Lin::constant(l.c.rem_euclid(c));
        for (e, k) in &l.terms {
            if k % c == 0 {
                big.add_term(e.clone(), k / c);
            } else {
                small.add_term(e.clone(), *k);
            }
        }
        if big.terms.is_empty() {
            continue;
        }
        if let Some((lo, hi)) = lin_range(&small, r) {
            if lo >= 0 && hi < c {
                return Some((big, d / c, small));
            }
        }
    }
    None
}

/// `(y / a) * (k * a) + (y % a) * k` → `y * k`, repeatedly.
fn recombine(mut l: Lin, r: &Ranges) -> Lin {
    loop {
        let mut hit = None;
        'outer: for (i, (e1, k1)) in l.terms.iter().enumerate() {
            let Expr::Binary(dop @ (BinOp::Div | BinOp::FloorDiv), y1, a1) = e1 else {
                continue;
            };
            let Expr::Int(a) = **a1 else { continue };
            for (j, (e2, k2)) in l.terms.iter().enumerate() {
                let Expr::Binary(mop @ (BinOp::Rem | BinOp::FloorMod), y2, a2) = e2 else {
                    continue;
                };
                let pair_ok = matches!(
                    (dop, mop),
                    (BinOp::Div, BinOp::Rem) | (BinOp::FloorDiv, BinOp::FloorMod)
                );
                if pair_ok && **a2 == Expr::Int(a) && y1 == y2 && *k1 == k2 * a {
                    hit = Some((i, j, (**y1).clone(), *k2));
                    break 'outer;
                }
            }
        }
        let Some((i, j, y, k)) = hit else { return l };
        let (hi, lo) = if i > j { (i, j) } else { (j, i) };
        l.terms.remove(hi);
        l.terms.remove(lo);
        l = l.add(to_lin(y, r).scale(k), 1);
    }
}

fn to_lin(e: Expr, r: &Ranges) -> Lin {
    match e {
        Expr::Int(c) => Lin::constant(c),
        Expr::Binary(BinOp::Add, a, b) => recombine(to_lin(*a, r).add(to_lin(*b, r), 1), r),
        Expr::Binary(BinOp::Sub, a, b) => recombine(to_lin(*a, r).add(to_lin(*b, r), -1), r),
        Expr::Binary(BinOp::Mul, a, b) => {
            let (la, lb) = (to_lin(*a, r), to_lin(*b, r));
            match (la.as_const(), lb.as_const()) {
                (Some(x), _) => lb.scale(x),
                (_, Some(y)) => la.scale(y),
                _ => Lin::atom(Expr::bin(BinOp::Mul, from_lin(la), from_lin(lb))),
            }
        }
        Expr::Binary(op @ (BinOp::Div | BinOp::FloorDiv | BinOp::Rem | BinOp::FloorMod), a, b)
            if matches!(*b, Expr::Int(d) if d > 0) =>
        {
            let Expr::Int(d) = *b else { unreachable!() };
            let la = to_lin(*a, r);
            if let Some(c) = la.as_const() {
                let v = match op {
                    BinOp::Div | BinOp::FloorDiv => c.div_euclid(d),
                    _ => c.rem_euclid(d),
                };
                // Truncating forms of a negative constant differ; keep floor semantics only
                // where they were asked for or agree.
                if c >= 0 || matches!(op, BinOp::FloorDiv | BinOp::FloorMod) {
                    return Lin::constant(v);
                }
                return Lin::atom(Expr::bin(op, Expr::Int(c), Expr::Int(d)));
            }
            let trunc = matches!(op, BinOp::Div | BinOp::Rem);
            if trunc && !is_nonneg(&la, r) {
                // C semantics on a possibly negative dividend: leave as is.
                return Lin::atom(Expr::bin(op, from_lin(la), Expr::Int(d)));
            }
            match op {
                BinOp::Div | BinOp::FloorDiv => div_lin(la, d, r),
                _ => rem_lin(la, d, r),
            }
        }
        other => Lin::atom(simplify_children(other, r)),
    }
}

fn simplify_children(e: Expr, r: &Ranges) -> Expr {
    match e {
        Expr::Load(b, idx) => Expr::Load(b, idx.into_iter().map(|x| simplify(x, r)).collect()),
        Expr::Unary(op, a) => Expr::Unary(op, Box::new(simplify_any(*a, r))),
        Expr::Cast(d, a) => Expr::Cast(d, Box::new(simplify_any(*a, r))),
        Expr::ToIndex(a) => Expr::ToIndex(Box::new(simplify_any(*a, r))),
        Expr::CheckIndex(a, c) => Expr::CheckIndex(Box::new(simplify_any(*a, r)), c),
        Expr::Binary(op, a, b) => Expr::Binary(
            op,
            Box::new(simplify_any(*a, r)),
            Box::new(simplify_any(*b, r)),
        ),
        Expr::Select(c, a, b) => Expr::Select(
            Box::new(simplify_any(*c, r)),
            Box::new(simplify_any(*a, r)),
            Box::new(simplify_any(*b, r)),
        ),
        e => e,
    }
}

/// Simplifies index sub-expressions inside any expression (element-typed parts are kept).
fn simplify_any(e: Expr, r: &Ranges) -> Expr {
    if is_index_shaped(&e) {
        simplify(e, r)
    } else {
        simplify_children(e, r)
    }
}

/// Whether an expression is built only from index arithmetic at its root.
fn is_index_shaped(e: &Expr) -> bool {
    match e {
        Expr::Int(_) | Expr::Var(_) | Expr::ToIndex(_) => true,
        Expr::Binary(op, a, b) => {
            matches!(
                op,
                BinOp::Add
                    | BinOp::Sub
                    | BinOp::Mul
                    | BinOp::Div
                    | BinOp::Rem
                    | BinOp::FloorDiv
                    | BinOp::FloorMod
            ) && is_index_shaped(a)
                && is_index_shaped(b)
        }
        _ => false,
    }
}

fn term_key(e: &Expr) -> (u8, u32, String) {
    match e {
        Expr::Var(v) => (0, v.0, String::new()),
        e => (1, 0, format!("{e:?}")),
    }
}

fn from_lin(mut l: Lin) -> Expr {
    l.terms.sort_by_key(|a| term_key(&a.0));
    let mut out: Option<Expr> = None;
    for (e, k) in l.terms {
        let (neg, mag) = if k < 0 { (true, -k) } else { (false, k) };
        let t = if mag == 1 {
            e
        } else {
            Expr::bin(BinOp::Mul, e, Expr::Int(mag))
        };
        out = Some(match (out, neg) {
            (None, false) => t,
            (None, true) => Expr::bin(BinOp::Sub, Expr::Int(0), t),
            (Some(o), false) => Expr::bin(BinOp::Add, o, t),
            (Some(o), true) => Expr::bin(BinOp::Sub, o, t),
        });
    }
    match out {
        None => Expr::Int(l.c),
        Some(o) if l.c == 0 => o,
        Some(o) if l.c > 0 => Expr::bin(BinOp::Add, o, Expr::Int(l.c)),
        Some(o) => Expr::bin(BinOp::Sub, o, Expr::Int(-l.c)),
    }
}

/// Simplifies an index expression to its normal form.
pub fn simplify(e: Expr, r: &Ranges) -> Expr {
    from_lin(to_lin(e, r))
}

/// Whether `e` is integer arithmetic on constants and the loop variables of `r` alone (a
/// comparison of such is a check on the iteration, whose sides may be simplified like indices).
fn loop_arith(e: &Expr, r: &Ranges) -> bool {
    match e {
        Expr::Int(_) => true,
        Expr::Var(v) => r.contains_key(v),
        Expr::Binary(BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem | BinOp::FloorDiv | BinOp::FloorMod, a, b) => {
            loop_arith(a, r) && loop_arith(b, r)
        }
        _ => false,
    }
}

/// Simplifies the index of every load and store in `stmts`, and both sides of the comparisons
/// that check only loop variables, with the extents of the loops around them (`r`) and of the
/// loops inside. For a schedule that substituted `v + c` for a
/// loop variable (a partitioned loop): a divisor or remainder that could not be simplified
/// while its dividend might be negative (a concatenation's `i - n0`) can be once the loop
/// starts past the branch point. Only indices are touched: element arithmetic keeps its
/// order of operations.
pub fn simplify_accesses(stmts: &mut [Stmt], r: &Ranges) {
    let loads = |e: Expr, r: &Ranges| {
        e.rewrite(&mut |e| match e {
            Expr::Load(b, idx) => Expr::Load(b, idx.into_iter().map(|x| simplify(x, r)).collect()),
            Expr::Binary(op @ (BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge), a, b) if loop_arith(&a, r) && loop_arith(&b, r) => {
                Expr::Binary(op, Box::new(simplify(*a, r)), Box::new(simplify(*b, r)))
            }
            e => e,
        })
    };
    for s in stmts {
        match s {
            Stmt::For(l) => {
                let mut inner = r.clone();
                inner.insert(l.var, l.extent);
                simplify_accesses(&mut l.body, &inner);
            }
            Stmt::Store { index, value, .. } => {
                for e in index.iter_mut() {
                    *e = simplify(std::mem::replace(e, Expr::Int(0)), r);
                }
                *value = loads(std::mem::replace(value, Expr::Int(0)), r);
            }
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => {
                *value = loads(std::mem::replace(value, Expr::Int(0)), r);
            }
            Stmt::If { cond, then_, else_ } => {
                *cond = loads(std::mem::replace(cond, Expr::Int(0)), r);
                simplify_accesses(then_, r);
                simplify_accesses(else_, r);
            }
            Stmt::Gemm(g) => simplify_accesses(&mut g.epilogue, r),
            Stmt::Alloc(_) | Stmt::Barrier | Stmt::BlockReduce { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(i: u32) -> Expr {
        Expr::Var(VarId(i))
    }
    fn add(a: Expr, b: Expr) -> Expr {
        Expr::bin(BinOp::Add, a, b)
    }
    fn mul(a: Expr, k: i64) -> Expr {
        Expr::bin(BinOp::Mul, a, Expr::Int(k))
    }
    fn div(a: Expr, k: i64) -> Expr {
        Expr::bin(BinOp::Div, a, Expr::Int(k))
    }
    fn rem(a: Expr, k: i64) -> Expr {
        Expr::bin(BinOp::Rem, a, Expr::Int(k))
    }

    fn eval(e: &Expr, var: &dyn Fn(VarId) -> i64) -> i64 {
        match e {
            Expr::Int(c) => *c,
            Expr::Var(v) => var(*v),
            Expr::Binary(op, a, b) => {
                let (a, b) = (eval(a, var), eval(b, var));
                match op {
                    BinOp::Add => a + b,
                    BinOp::Sub => a - b,
                    BinOp::Mul => a * b,
                    BinOp::Div => a / b,
                    BinOp::Rem => a % b,
                    BinOp::FloorDiv => a.div_euclid(b),
                    BinOp::FloorMod => a.rem_euclid(b),
                    _ => unreachable!(),
                }
            }
            _ => unreachable!(),
        }
    }

    /// A transposed patch grid read past a concatenation's first row: `(c * 196 + (t - 1))`
    /// unravelled into `[256, 14, 14]` cannot simplify while `t` may be 0; once the loop over
    /// `t` starts at 1 (`t = u + 1`, a partitioned loop), the accesses come back to
    /// `c * 196 + u`.
    #[test]
    fn accesses_simplify_once_a_loop_starts_later() {
        let (c, u) = (VarId(0), VarId(1));
        let flat = add(mul(Expr::Var(c), 196), Expr::bin(BinOp::Sub, add(v(1), Expr::Int(1)), Expr::Int(1)));
        let wide = Expr::bin(BinOp::Sub, add(mul(Expr::Var(c), 196), v(1)), Expr::Int(1));
        let unravel = |f: Expr| add(add(mul(rem(div(f.clone(), 196), 256), 196), mul(rem(div(f.clone(), 14), 14), 14)), rem(f, 14));
        let load = Expr::Load(crate::ir::BufId(0), vec![unravel(flat)]);
        let mut body = vec![Stmt::For(crate::ir::Loop {
            var: u,
            extent: 196,
            kind: crate::ir::LoopKind::Serial,
            body: vec![Stmt::Store { buf: crate::ir::BufId(1), index: vec![unravel(wide.clone())], value: load }],
        })];
        let outer: Ranges = [(c, 256)].into_iter().collect();
        simplify_accesses(&mut body, &outer);
        let Stmt::For(l) = &body[0] else { unreachable!() };
        let Stmt::Store { index, value, .. } = &l.body[0] else { unreachable!() };
        assert_eq!(*value, Expr::Load(crate::ir::BufId(0), vec![add(mul(Expr::Var(c), 196), v(1))]));
        // `c * 196 + u - 1` may be -1 (c = u = 0): its truncating remainders stay as they were,
        // and the value is unchanged wherever it is defined.
        let both = |cv: i64, uv: i64| move |x: VarId| if x == c { cv } else { uv };
        for (cv, uv) in [(0, 1), (3, 0), (255, 195), (17, 100)] {
            assert_eq!(eval(&index[0], &both(cv, uv)), eval(&unravel(wide.clone()), &both(cv, uv)));
        }
    }

    #[test]
    fn reshape_round_trip_returns_the_variables() {
        let r: Ranges = [(VarId(0), 2), (VarId(1), 3), (VarId(2), 4)]
            .into_iter()
            .collect();
        // flat = v0*12 + v1*4 + v2; unravel into [6, 4] then ravel into [2, 3, 4] again.
        let flat = add(add(mul(v(0), 12), mul(v(1), 4)), v(2));
        let a = div(flat.clone(), 4);
        let b = rem(flat, 4);
        let flat2 = add(mul(a, 4), b);
        assert_eq!(simplify(div(flat2.clone(), 12), &r), v(0));
        assert_eq!(simplify(rem(div(flat2.clone(), 4), 3), &r), v(1));
        assert_eq!(simplify(rem(flat2, 4), &r), v(2));
    }

    #[test]
    fn recombines_div_and_rem() {
        let r: Ranges = [(VarId(0), 100)].into_iter().collect();
        let e = add(mul(div(v(0), 8), 8), rem(v(0), 8));
        assert_eq!(simplify(e, &r), v(0));
        // A possibly negative dividend: the result must keep floor semantics for floor
        // division and C semantics for C division, checked by evaluation.
        for op in [BinOp::FloorDiv, BinOp::FloorMod, BinOp::Div, BinOp::Rem] {
            let e = Expr::bin(op, add(v(0), Expr::Int(-3)), Expr::Int(2));
            let s = simplify(e.clone(), &r);
            for x in 0..100 {
                assert_eq!(eval(&e, &|_| x), eval(&s, &|_| x), "{op:?} at {x}: {s:?}");
            }
        }
    }

    #[test]
    fn flattened_index_divided_by_a_coarser_stride() {
        // (i * 1024 + k) / 65536 = i / 64 and (i * 1024 + k) % 65536 = (i % 64) * 1024 + k
        // for 0 <= k < 1024: a reshape of [2, 64, 1024] to [128, 1024] read back.
        let r: Ranges = [(VarId(0), 128), (VarId(1), 1024)].into_iter().collect();
        let flat = add(mul(v(0), 1024), v(1));
        assert_eq!(simplify(div(flat.clone(), 65536), &r), div(v(0), 64));
        let m = simplify(rem(flat.clone(), 65536), &r);
        for i in (0..128).step_by(7) {
            for k in (0..1024).step_by(61) {
                let at = |v: VarId| if v == VarId(0) { i } else { k };
                assert_eq!(eval(&m, &at), (i * 1024 + k) % 65536, "{m:?}");
            }
        }
        // Not when the small part can reach the coarser stride.
        let r2: Ranges = [(VarId(0), 128), (VarId(1), 2048)].into_iter().collect();
        assert_ne!(simplify(div(flat, 65536), &r2), div(v(0), 64));
    }

    #[test]
    fn a_window_offset_splits_its_constant() {
        // Swin's rolled windows: (v * 96 + ch + 384) / 672 = (v + 4) / 7 and
        // (v * 96 + ch + 384) % 672 = ((v + 4) % 7) * 96 + ch for 0 <= ch < 96, checked by
        // evaluation; a negative offset under floor semantics too.
        let r: Ranges = [(VarId(0), 3136), (VarId(1), 96)].into_iter().collect();
        let flat = add(add(mul(v(0), 96), v(1)), Expr::Int(384));
        assert_eq!(simplify(div(flat.clone(), 672), &r), div(add(v(0), Expr::Int(4)), 7));
        let neg = add(add(mul(v(0), 96), v(1)), Expr::Int(-11040));
        for (e, d) in [(flat, 672), (neg, 5376)] {
            for op in [BinOp::Div, BinOp::Rem, BinOp::FloorDiv, BinOp::FloorMod] {
                let x = Expr::bin(op, e.clone(), Expr::Int(d));
                let sx = simplify(x.clone(), &r);
                for (a, b) in [(0, 0), (1, 95), (114, 3), (115, 0), (3135, 95), (500, 17)] {
                    let at = |w: VarId| if w == VarId(0) { a } else { b };
                    assert_eq!(eval(&x, &at), eval(&sx, &at), "{op:?} {d} at ({a}, {b}): {sx:?}");
                }
            }
        }
        let floor = Expr::bin(BinOp::FloorDiv, add(add(mul(v(0), 96), v(1)), Expr::Int(-11040)), Expr::Int(96));
        assert_eq!(simplify(floor, &r), Expr::bin(BinOp::Sub, v(0), Expr::Int(115)));
    }

    #[test]
    fn loads_simplify_under_the_selects_around_them() {
        // A roll by 3 rows of 56 pixels: where `p / 56 >= 3` the flat offset `p * 96 + c -
        // 16128` is not negative, and unravelled into [3136, 96] it is `(p - 168, c)`; the
        // same load outside any select keeps its truncating forms.
        let r: Ranges = [(VarId(0), 3136), (VarId(1), 96)].into_iter().collect();
        let flat = Expr::bin(BinOp::Sub, add(mul(v(0), 96), v(1)), Expr::Int(16128));
        let load = Expr::Load(crate::ir::BufId(0), vec![rem(div(flat.clone(), 96), 3136), rem(flat, 96)]);
        let cond = Expr::bin(BinOp::Lt, div(v(0), 56), Expr::Int(3));
        let other = Expr::Load(crate::ir::BufId(1), vec![v(0)]);
        let e = simplify_expr(Expr::select(cond.clone(), other.clone(), load.clone()), &r);
        let want = Expr::Load(crate::ir::BufId(0), vec![Expr::bin(BinOp::Sub, v(0), Expr::Int(168)), v(1)]);
        assert_eq!(e, Expr::select(cond, other.clone(), want));
        assert_ne!(simplify_expr(load.clone(), &r), Expr::Load(crate::ir::BufId(0), vec![Expr::bin(BinOp::Sub, v(0), Expr::Int(168)), v(1)]));
        // A roll along both axes needs both facts: `p / 56 >= 3` and `p % 56 >= 3`.
        let flat2 = Expr::bin(BinOp::Sub, add(mul(v(0), 96), v(1)), Expr::Int(16416));
        let load2 = Expr::Load(crate::ir::BufId(0), vec![rem(div(flat2.clone(), 96), 3136), rem(flat2, 96)]);
        let both = Expr::bin(
            BinOp::And,
            Expr::bin(BinOp::Ge, div(v(0), 56), Expr::Int(3)),
            Expr::bin(BinOp::Ge, rem(v(0), 56), Expr::Int(3)),
        );
        let e = simplify_expr(Expr::select(both.clone(), load2, other.clone()), &r);
        let want2 = Expr::Load(crate::ir::BufId(0), vec![Expr::bin(BinOp::Sub, v(0), Expr::Int(171)), v(1)]);
        assert_eq!(e, Expr::select(both, want2, other));
    }

    #[test]
    fn normal_form_is_order_independent() {
        let r = Ranges::new();
        let a = add(add(v(1), mul(v(0), 3)), Expr::Int(2));
        let b = add(Expr::Int(2), add(mul(v(0), 3), v(1)));
        assert_eq!(simplify(a, &r), simplify(b, &r));
    }
}
