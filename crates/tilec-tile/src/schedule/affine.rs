//! Quasi-affine index analysis: index expressions as integer combinations of atoms (variables and
//! divisions/remainders of affine forms by constants), with interval bounds. Legality checks and
//! region computations of the schedule primitives are built on it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::ir::*;

/// An indivisible integer quantity of an index expression.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Atom {
    Var(VarId),
    /// `a / c` with `c > 0`; `floor` selects floor division (else C truncation).
    Div(Box<Affine>, i64, bool),
    /// `a % c` with `c > 0`; `floor` selects the floor modulo (else C remainder).
    Mod(Box<Affine>, i64, bool),
}

/// `sum(coef * atom) + c`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Affine {
    pub terms: BTreeMap<Atom, i64>,
    pub c: i64,
}

/// Inclusive bounds of index variables (loop variables: `0..=extent-1`).
pub(crate) type Ranges = HashMap<VarId, (i64, i64)>;

impl Affine {
    pub fn constant(c: i64) -> Affine {
        Affine {
            terms: BTreeMap::new(),
            c,
        }
    }
    pub fn atom(a: Atom) -> Affine {
        let mut terms = BTreeMap::new();
        terms.insert(a, 1);
        Affine { terms, c: 0 }
    }
    pub fn var(v: VarId) -> Affine {
        Affine::atom(Atom::Var(v))
    }
    pub fn as_const(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.c)
    }

    /// `self + k * other`, or `None` on overflow.
    pub fn axpy(&self, k: i64, other: &Affine) -> Option<Affine> {
        let mut out = self.clone();
        for (a, &c) in &other.terms {
            let e = out.terms.entry(a.clone()).or_insert(0);
            *e = e.checked_add(c.checked_mul(k)?)?;
            if *e == 0 {
                out.terms.remove(a);
            }
        }
        out.c = out.c.checked_add(other.c.checked_mul(k)?)?;
        Some(out)
    }
    pub fn add(&self, other: &Affine) -> Option<Affine> {
        self.axpy(1, other)
    }
    pub fn sub(&self, other: &Affine) -> Option<Affine> {
        self.axpy(-1, other)
    }
    pub fn scale(&self, k: i64) -> Option<Affine> {
        Affine::default().axpy(k, self)
    }

    /// Every variable the form reads (through atoms too).
    pub fn vars(&self) -> BTreeSet<VarId> {
        let mut out = BTreeSet::new();
        for a in self.terms.keys() {
            a.collect_vars(&mut out);
        }
        out
    }

    /// The part of the form whose atoms read none of `vars`, and the rest (constant included in
    /// neither).
    pub fn split_by(&self, vars: &BTreeSet<VarId>) -> (Affine, Affine) {
        let mut fixed = Affine::default();
        let mut moving = Affine::default();
        for (a, &c) in &self.terms {
            let mut vs = BTreeSet::new();
            a.collect_vars(&mut vs);
            if vs.is_disjoint(vars) {
                fixed.terms.insert(a.clone(), c);
            } else {
                moving.terms.insert(a.clone(), c);
            }
        }
        (fixed, moving)
    }

    /// Inclusive bounds given variable ranges; `None` when a variable has no known range.
    pub fn bounds(&self, ranges: &Ranges) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (self.c as i128, self.c as i128);
        for (a, &c) in &self.terms {
            let (alo, ahi) = a.bounds(ranges)?;
            let (x, y) = (alo as i128 * c as i128, ahi as i128 * c as i128);
            lo += x.min(y);
            hi += x.max(y);
        }
        Some((i64::try_from(lo).ok()?, i64::try_from(hi).ok()?))
    }

    /// An expression computing the form.
    pub fn to_expr(&self) -> Expr {
        let mut acc: Option<Expr> = None;
        for (a, &c) in &self.terms {
            let t = Expr::mul(a.to_expr(), Expr::Int(c.abs()));
            acc = Some(match (acc, c < 0) {
                (None, false) => t,
                (None, true) => Expr::bin(BinOp::Sub, Expr::Int(0), t),
                (Some(x), false) => Expr::add(x, t),
                (Some(x), true) => Expr::bin(BinOp::Sub, x, t),
            });
        }
        match acc {
            None => Expr::Int(self.c),
            Some(x) if self.c < 0 => Expr::bin(BinOp::Sub, x, Expr::Int(-self.c)),
            Some(x) => Expr::add(x, Expr::Int(self.c)),
        }
    }

    fn div_const(&self, d: i64, floor: bool, modulo: bool) -> Affine {
        if let Some(c) = self.as_const() {
            let v = match (modulo, floor) {
                (false, true) => c.div_euclid(d),
                (false, false) => c / d,
                (true, true) => c.rem_euclid(d),
                (true, false) => c % d,
            };
            return Affine::constant(v);
        }
        if d == 1 {
            return if modulo {
                Affine::constant(0)
            } else {
                self.clone()
            };
        }
        // Exact division of a form whose coefficients and constant are all multiples of `d`
        // (the sign of the dividend does not matter then).
        if self.c % d == 0 && self.terms.values().all(|c| c % d == 0) {
            if modulo {
                return Affine::constant(0);
            }
            let mut out = self.clone();
            out.c /= d;
            for c in out.terms.values_mut() {
                *c /= d;
            }
            return out;
        }
        let a = Box::new(self.clone());
        Affine::atom(if modulo {
            Atom::Mod(a, d, floor)
        } else {
            Atom::Div(a, d, floor)
        })
    }
}

impl Atom {
    fn collect_vars(&self, out: &mut BTreeSet<VarId>) {
        match self {
            Atom::Var(v) => {
                out.insert(*v);
            }
            Atom::Div(a, _, _) | Atom::Mod(a, _, _) => {
                for t in a.terms.keys() {
                    t.collect_vars(out);
                }
            }
        }
    }

    pub fn vars(&self) -> BTreeSet<VarId> {
        let mut out = BTreeSet::new();
        self.collect_vars(&mut out);
        out
    }

    pub fn bounds(&self, ranges: &Ranges) -> Option<(i64, i64)> {
        match self {
            Atom::Var(v) => ranges.get(v).copied(),
            Atom::Div(a, d, floor) => {
                let (lo, hi) = a.bounds(ranges)?;
                if *floor {
                    Some((lo.div_euclid(*d), hi.div_euclid(*d)))
                } else {
                    Some((lo / d, hi / d))
                }
            }
            Atom::Mod(a, d, floor) => {
                let (lo, hi) = a.bounds(ranges)?;
                if lo >= 0 {
                    if lo / d == hi / d {
                        Some((lo % d, hi % d))
                    } else {
                        Some((0, d - 1))
                    }
                } else if *floor {
                    Some((0, d - 1))
                } else if hi <= 0 {
                    Some((-(d - 1), 0))
                } else {
                    Some((-(d - 1), d - 1))
                }
            }
        }
    }

    pub fn to_expr(&self) -> Expr {
        match self {
            Atom::Var(v) => Expr::Var(*v),
            Atom::Div(a, d, floor) => Expr::bin(
                if *floor { BinOp::FloorDiv } else { BinOp::Div },
                a.to_expr(),
                Expr::Int(*d),
            ),
            Atom::Mod(a, d, floor) => Expr::bin(
                if *floor { BinOp::FloorMod } else { BinOp::Rem },
                a.to_expr(),
                Expr::Int(*d),
            ),
        }
    }
}

/// Converts index expressions of one kernel to affine forms, seeing through immutable index
/// `let`s.
pub(crate) struct AffineCx<'a> {
    k: &'a Kernel,
    lets: HashMap<VarId, Expr>,
}

impl<'a> AffineCx<'a> {
    pub fn new(k: &'a Kernel) -> AffineCx<'a> {
        let mut lets: HashMap<VarId, Expr> = HashMap::new();
        let mut seen: HashMap<VarId, usize> = HashMap::new();
        for s in &k.body {
            s.visit(&mut |s| {
                if let Stmt::Let { var, value } = s {
                    *seen.entry(*var).or_insert(0) += 1;
                    if let Some(info) = k.vars.get(var.0 as usize) {
                        if info.ty == Ty::Index && !info.mutable {
                            lets.insert(*var, value.clone());
                        }
                    }
                }
            });
        }
        // A variable defined more than once is not a single value: leave it opaque.
        lets.retain(|v, _| seen.get(v) == Some(&1));
        AffineCx { k, lets }
    }

    pub fn affine(&self, e: &Expr) -> Option<Affine> {
        self.go(e, 0)
    }

    fn go(&self, e: &Expr, depth: usize) -> Option<Affine> {
        if depth > 64 {
            return None;
        }
        match e {
            Expr::Int(c) => Some(Affine::constant(*c)),
            Expr::Var(v) => {
                if let Some(def) = self.lets.get(v) {
                    if let Some(a) = self.go(def, depth + 1) {
                        return Some(a);
                    }
                }
                match self.k.vars.get(v.0 as usize) {
                    Some(info) if info.ty == Ty::Index && !info.mutable => Some(Affine::var(*v)),
                    _ => None,
                }
            }
            Expr::Unary(UnOp::Neg, a) => self.go(a, depth + 1)?.scale(-1),
            Expr::Binary(op, a, b) => {
                let x = self.go(a, depth + 1)?;
                let y = self.go(b, depth + 1)?;
                match op {
                    BinOp::Add => x.add(&y),
                    BinOp::Sub => x.sub(&y),
                    BinOp::Mul => match (x.as_const(), y.as_const()) {
                        (Some(c), _) => y.scale(c),
                        (_, Some(c)) => x.scale(c),
                        _ => None,
                    },
                    BinOp::Div | BinOp::FloorDiv | BinOp::Rem | BinOp::FloorMod => {
                        let d = y.as_const().filter(|&d| d > 0)?;
                        let floor = matches!(op, BinOp::FloorDiv | BinOp::FloorMod);
                        let modulo = matches!(op, BinOp::Rem | BinOp::FloorMod);
                        Some(x.div_const(d, floor, modulo))
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// Which of the variables in `varying` are pinned down by the equality of two accesses.
///
/// Two executions of the accesses (with the variables outside `varying` equal, those inside free
/// within `ranges`) touch the same element only if every `equation` (index forms equal on both
/// sides) holds. A variable is determined when those equations force it to take the same value in
/// both executions. The test is conservative: "not determined" may be a false alarm, "determined"
/// is a proof. Dominance: in an equation, an atom whose coefficient exceeds the largest possible
/// difference of all other undetermined terms (plus the equation's slack: the two sides may
/// differ by up to that much, for accesses at constant offsets of one another) must be equal
/// on both sides.
pub(crate) fn determined_vars(
    equations: &[(Affine, i128)],
    varying: &BTreeSet<VarId>,
    ranges: &Ranges,
) -> BTreeSet<VarId> {
    let moving_part = |a: &Affine| a.split_by(varying).1;
    let mut eqs: Vec<(Affine, i128)> = vec![];
    for (e, slack) in equations {
        let m = moving_part(e);
        if !m.terms.is_empty() && !eqs.iter().any(|(x, s)| *x == m && s <= slack) {
            eqs.push((m, (*slack).max(0)));
        }
    }
    let width = |a: &Atom| -> i128 {
        match a.bounds(ranges) {
            Some((lo, hi)) => (hi as i128 - lo as i128).max(0),
            None => i128::MAX / 4,
        }
    };
    let mut det: BTreeSet<Atom> = BTreeSet::new();
    loop {
        let mut changed = false;
        for (eq, slack) in &eqs {
            let open: Vec<(&Atom, i128)> = eq
                .terms
                .iter()
                .filter(|(a, _)| !det.contains(*a))
                .map(|(a, &c)| (a, (c as i128).abs()))
                .collect();
            let total: i128 = open
                .iter()
                .map(|(a, c)| c.saturating_mul(width(a)))
                .fold(*slack, |s, x| s.saturating_add(x));
            for (a, c) in &open {
                let others = total.saturating_sub(c.saturating_mul(width(a)));
                if *c > others && det.insert((*a).clone()) {
                    changed = true;
                }
            }
        }
        // Determined quotient and remainder (or a remainder of a small dividend) determine the
        // dividend itself: a new equation.
        let mut new_eqs = vec![];
        for a in &det {
            match a {
                Atom::Div(x, d, fl) if det.contains(&Atom::Mod(x.clone(), *d, *fl)) => {
                    new_eqs.push((**x).clone())
                }
                Atom::Mod(x, d, _) => {
                    if let Some((lo, hi)) = x.bounds(ranges) {
                        if lo >= 0 && hi < *d {
                            new_eqs.push((**x).clone());
                        }
                    }
                }
                _ => {}
            }
        }
        for e in new_eqs {
            let m = moving_part(&e);
            if !m.terms.is_empty() && !eqs.iter().any(|(x, s)| *x == m && *s == 0) {
                eqs.push((m, 0));
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    det.into_iter()
        .filter_map(|a| match a {
            Atom::Var(v) => Some(v),
            _ => None,
        })
        .collect()
}
