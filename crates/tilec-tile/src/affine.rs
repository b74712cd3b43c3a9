//! Quasi-affine index arithmetic, the one linearizer of the crate and of the back ends: index
//! expressions as integer combinations of atoms (variables, divisions and remainders of affine
//! forms by constants, and, for element offsets, any other sub-expression taken whole), with
//! interval bounds.
//!
//! The schedule primitives build their legality checks and regions on [`AffineCx`]. The back
//! ends take element offsets from [`linear_offset`]: an index into a row-major buffer is
//! `sum(index[d] * stride[d])`, and re-indexing through reshapes leaves pairs
//! `(x / a) * a*c + (x % a) * c` in that sum, which are `x * c` exactly (C's truncating division
//! and remainder satisfy `(x / a) * a + x % a == x` for every `x`). Folding them keeps divisions
//! out of every access, and GPU compilers away from index arithmetic they handle poorly.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::ir::*;

/// An indivisible integer quantity of an index expression.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Atom {
    Var(VarId),
    /// `a / c` with `c > 0`; `floor` selects floor division (else C truncation).
    Div(Box<Affine>, i64, bool),
    /// `a % c` with `c > 0`; `floor` selects the floor modulo (else C remainder).
    Mod(Box<Affine>, i64, bool),
    /// Any other integer expression, taken whole (only from [`linear_offset`]).
    Opaque(Opaque),
}

/// An expression used as an atom, compared by its printed form.
#[derive(Clone, Debug)]
pub struct Opaque {
    key: String,
    pub expr: Box<Expr>,
}

impl Opaque {
    fn new(e: &Expr) -> Opaque {
        Opaque { key: format!("{e:?}"), expr: Box::new(e.clone()) }
    }
}

impl PartialEq for Opaque {
    fn eq(&self, o: &Opaque) -> bool {
        self.key == o.key
    }
}
impl Eq for Opaque {}
impl PartialOrd for Opaque {
    fn partial_cmp(&self, o: &Opaque) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Opaque {
    fn cmp(&self, o: &Opaque) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}
impl std::hash::Hash for Opaque {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.key.hash(h)
    }
}

/// `sum(coef * atom) + c`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Affine {
    pub terms: BTreeMap<Atom, i64>,
    pub c: i64,
}

/// Inclusive bounds of index variables (loop variables: `0..=extent-1`).
pub type Ranges = HashMap<VarId, (i64, i64)>;

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

    /// Folds `c*a * (x / a) + c * (x % a)` into `c * x` (exact for truncating and for floor
    /// division alike) until no pair is left; `None` on overflow.
    pub fn fold_div_rem(mut self) -> Option<Affine> {
        loop {
            let pair = self.terms.iter().find_map(|(t, &ct)| {
                let Atom::Div(x, a, floor) = t else { return None };
                let m = Atom::Mod(x.clone(), *a, *floor);
                let cm = *self.terms.get(&m)?;
                (cm != 0 && cm.checked_mul(*a) == Some(ct)).then(|| (t.clone(), m, cm, (**x).clone()))
            });
            if let Some((div, m, c, x)) = pair {
                self.terms.remove(&div);
                self.terms.remove(&m);
                self = self.axpy(c, &x)?;
                continue;
            }
            // `(x / a) % b` next to `x / (a * b)`: the quotient `x / (a * b)` is
            // `(x / a) / b`, so the two make `x / a` (an unravel into `[.., b, a]` read back
            // through a coarser dimension), which then pairs with `x % a` above.
            let nested = self.terms.iter().find_map(|(t, &cm)| {
                let Atom::Mod(y, b, floor) = t else { return None };
                let (Atom::Div(x, a, f2), 1) = y.terms.iter().next().map(|(q, &k)| (q, k))? else {
                    return None;
                };
                if y.c != 0 || y.terms.len() != 1 || f2 != floor {
                    return None;
                }
                let big = Atom::Div(x.clone(), a.checked_mul(*b)?, *floor);
                let cb = *self.terms.get(&big)?;
                (cm != 0 && cm.checked_mul(*b) == Some(cb)).then(|| (t.clone(), big, cm, (**y).clone()))
            });
            let Some((m, big, c, y)) = nested else { return Some(self) };
            self.terms.remove(&m);
            self.terms.remove(&big);
            self = self.axpy(c, &y)?;
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
            Atom::Opaque(o) => o.expr.visit(&mut |e| {
                if let Expr::Var(v) = e {
                    out.insert(*v);
                }
            }),
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
            Atom::Opaque(_) => None,
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
            Atom::Opaque(o) => (*o.expr).clone(),
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
pub struct AffineCx<'a> {
    k: Option<&'a Kernel>,
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
        AffineCx { k: Some(k), lets }
    }

    /// The form of `e`, or `None` unless it is quasi-affine in immutable index variables.
    pub fn affine(&self, e: &Expr) -> Option<Affine> {
        self.go(e, 0, false)
    }

    fn go(&self, e: &Expr, depth: usize, opaque: bool) -> Option<Affine> {
        if depth > 64 {
            return None;
        }
        let whole = || opaque.then(|| Affine::atom(Atom::Opaque(Opaque::new(e))));
        match e {
            Expr::Int(c) => Some(Affine::constant(*c)),
            Expr::Var(v) => {
                if let Some(def) = self.lets.get(v) {
                    if let Some(a) = self.go(def, depth + 1, opaque) {
                        return Some(a);
                    }
                }
                match self.k.map(|k| k.vars.get(v.0 as usize)) {
                    None => Some(Affine::var(*v)),
                    Some(Some(info)) if info.ty == Ty::Index && !info.mutable => Some(Affine::var(*v)),
                    _ => whole(),
                }
            }
            Expr::Unary(UnOp::Neg, a) => self.go(a, depth + 1, opaque)?.scale(-1),
            Expr::Binary(op @ (BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::FloorDiv | BinOp::Rem | BinOp::FloorMod), a, b) => {
                let x = self.go(a, depth + 1, opaque)?;
                let y = self.go(b, depth + 1, opaque)?;
                match op {
                    BinOp::Add => x.add(&y),
                    BinOp::Sub => x.sub(&y),
                    _ if *op == BinOp::Mul => match (x.as_const(), y.as_const()) {
                        (Some(c), _) => y.scale(c),
                        (_, Some(c)) => x.scale(c),
                        _ => whole(),
                    },
                    _ => {
                        let Some(d) = y.as_const().filter(|&d| d > 0) else { return whole() };
                        let floor = matches!(op, BinOp::FloorDiv | BinOp::FloorMod);
                        let modulo = matches!(op, BinOp::Rem | BinOp::FloorMod);
                        Some(x.div_const(d, floor, modulo))
                    }
                }
            }
            _ => whole(),
        }
    }
}

/// The offset `sum(e * c)` over `terms` as an affine sum of atoms plus a constant, with the
/// div/rem pairs folded; `None` when a coefficient overflows. Every variable is an atom, and so
/// is every sub-expression that is not affine (taken whole).
pub fn linear_offset(terms: &[(Expr, i64)]) -> Option<(Vec<(i64, Expr)>, i64)> {
    let cx = AffineCx { k: None, lets: HashMap::new() };
    let mut sum = Affine::default();
    for (e, c) in terms {
        sum = sum.axpy(*c, &cx.go(e, 0, true)?)?;
    }
    let sum = sum.fold_div_rem()?;
    Some((sum.terms.iter().map(|(a, &c)| (c, a.to_expr())).collect(), sum.c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::VarId;

    fn var(i: u32) -> Expr {
        Expr::Var(VarId(i))
    }

    #[test]
    fn div_rem_pairs_fold_back() {
        // (i / 13) * 2080 + (i % 13) * 160 + j  ==  i * 160 + j
        let i = var(0);
        let j = var(1);
        let e = Expr::add(
            Expr::add(
                Expr::mul(Expr::div(i.clone(), 13), Expr::Int(2080)),
                Expr::mul(Expr::rem(i.clone(), 13), Expr::Int(160)),
            ),
            j.clone(),
        );
        let (atoms, k) = linear_offset(&[(e, 1)]).unwrap();
        assert_eq!(k, 0);
        assert_eq!(atoms, vec![(160, i), (1, j)]);
    }

    #[test]
    fn nested_unravel_folds_back() {
        // [8, 32, 32] unraveled from a flat i and raveled again:
        // (i / 1024) * 1024 + ((i / 32) % 32) * 32 + i % 32  ==  i, under a stride too.
        let i = var(0);
        let e = Expr::add(
            Expr::add(
                Expr::mul(Expr::div(i.clone(), 1024), Expr::Int(1024)),
                Expr::mul(Expr::rem(Expr::div(i.clone(), 32), 32), Expr::Int(32)),
            ),
            Expr::rem(i.clone(), 32),
        );
        let (atoms, k) = linear_offset(&[(e.clone(), 3)]).unwrap();
        assert_eq!((atoms, k), (vec![(3, i.clone())], 0));
        // Strides that do not nest stay as they are: (i / 96) * 96 + ((i / 32) % 4) * 32.
        let e = Expr::add(
            Expr::mul(Expr::div(i.clone(), 96), Expr::Int(96)),
            Expr::mul(Expr::rem(Expr::div(i.clone(), 32), 4), Expr::Int(32)),
        );
        assert_eq!(linear_offset(&[(e, 1)]).unwrap().0.len(), 2);
    }

    #[test]
    fn unpaired_terms_and_overflow() {
        let i = var(0);
        let (atoms, k) = linear_offset(&[(Expr::add(Expr::div(i.clone(), 4), Expr::Int(3)), 5)]).unwrap();
        assert_eq!((atoms, k), (vec![(5, Expr::div(i.clone(), 4))], 15));
        assert!(linear_offset(&[(Expr::mul(i, Expr::Int(i64::MAX)), 2)]).is_none());
    }

    #[test]
    fn non_affine_parts_are_atoms_for_offsets_only() {
        let mut k = Kernel::new("k");
        let i = Expr::Var(k.index_var("i"));
        let b = k.param("b", tilec_ir::DType::I64, vec![4]);
        let ld = Expr::ToIndex(Box::new(Expr::load(b, vec![i.clone()])));
        // (ld * 3 + i) floor-divided and floor-modded by 5, recombined: one atom per part.
        let x = Expr::add(Expr::mul(ld.clone(), Expr::Int(3)), i.clone());
        let e = Expr::add(
            Expr::mul(Expr::bin(BinOp::FloorDiv, x.clone(), Expr::Int(5)), Expr::Int(10)),
            Expr::mul(Expr::bin(BinOp::FloorMod, x.clone(), Expr::Int(5)), Expr::Int(2)),
        );
        let (atoms, c) = linear_offset(&[(e.clone(), 1)]).unwrap();
        assert_eq!(c, 0);
        assert_eq!(atoms.len(), 2);
        assert!(atoms.contains(&(2, i.clone())) && atoms.contains(&(6, ld.clone())));
        // A truncating quotient does not pair with a floor remainder.
        let mixed = Expr::add(
            Expr::mul(Expr::bin(BinOp::Div, i.clone(), Expr::Int(5)), Expr::Int(10)),
            Expr::mul(Expr::bin(BinOp::FloorMod, i.clone(), Expr::Int(5)), Expr::Int(2)),
        );
        assert_eq!(linear_offset(&[(mixed, 1)]).unwrap().0.len(), 2);
        // The schedule's forms take no opaque atoms: a load is not quasi-affine.
        let cx = AffineCx::new(&k);
        assert!(cx.affine(&e).is_none());
        assert_eq!(cx.affine(&Expr::add(i.clone(), Expr::Int(2))).unwrap().bounds(&Ranges::from([(VarId(0), (0, 3))])), Some((2, 5)));
    }
}
