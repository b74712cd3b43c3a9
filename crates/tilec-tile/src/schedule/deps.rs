//! What a piece of a kernel reads, writes and defines, and the conservative dependence tests the
//! primitives use (iteration independence for `parallel`/`vectorize`, order preservation for
//! `reorder`).

use std::collections::{BTreeMap, BTreeSet};

use super::affine::{determined_vars, AffineCx, Ranges};
use crate::ir::*;

/// Accesses and definitions of a list of statements.
#[derive(Default, Debug)]
pub(crate) struct Region {
    pub loads: Vec<(BufId, Vec<Expr>)>,
    /// Stores with whether they sit under an `If` (inside the region).
    pub stores: Vec<(BufId, Vec<Expr>, bool)>,
    /// Variables updated with `Assign`.
    pub assigned: BTreeSet<VarId>,
    /// Variables read anywhere.
    pub read_vars: BTreeSet<VarId>,
    /// Variables defined inside: loop variables, `let`s, gemm variables.
    pub defined: BTreeSet<VarId>,
    /// Bounds of the loop (and gemm) variables defined inside.
    pub ranges: Ranges,
    pub allocs: BTreeSet<BufId>,
    pub loops: usize,
    pub gemms: usize,
}

impl Region {
    pub fn of(stmts: &[Stmt]) -> Region {
        let mut r = Region::default();
        for s in stmts {
            r.stmt(s, false);
        }
        r
    }

    fn expr(&mut self, e: &Expr) {
        e.visit(&mut |e| match e {
            Expr::Load(b, idx) => self.loads.push((*b, idx.clone())),
            Expr::Var(v) => {
                self.read_vars.insert(*v);
            }
            _ => {}
        });
    }

    fn stmt(&mut self, s: &Stmt, cond: bool) {
        match s {
            Stmt::For(l) => {
                self.loops += 1;
                self.defined.insert(l.var);
                self.ranges
                    .insert(l.var, (0, l.extent.saturating_sub(1).max(0)));
                for s in &l.body {
                    self.stmt(s, cond);
                }
            }
            Stmt::Store { buf, index, value } => {
                index.iter().for_each(|e| self.expr(e));
                self.expr(value);
                self.stores.push((*buf, index.clone(), cond));
            }
            Stmt::Let { var, value } => {
                self.expr(value);
                self.defined.insert(*var);
            }
            Stmt::Assign { var, value } => {
                self.expr(value);
                self.assigned.insert(*var);
            }
            Stmt::Alloc(b) => {
                self.allocs.insert(*b);
            }
            Stmt::If {
                cond: c,
                then_,
                else_,
            } => {
                self.expr(c);
                for s in then_.iter().chain(else_) {
                    self.stmt(s, true);
                }
            }
            Stmt::Barrier => {}
            // A cross-thread combine updates its variable like an assignment.
            Stmt::BlockReduce { var, .. } => {
                self.assigned.insert(*var);
            }
            Stmt::Gemm(g) => {
                self.gemms += 1;
                for (v, n) in [
                    (g.b_var, g.batch),
                    (g.i_var, g.m),
                    (g.j_var, g.n),
                    (g.k_var, g.k),
                ] {
                    self.defined.insert(v);
                    self.ranges.insert(v, (0, n.saturating_sub(1).max(0)));
                }
                self.defined.insert(g.acc_var);
                self.expr(&g.a);
                self.expr(&g.b);
                for s in &g.epilogue {
                    self.stmt(s, cond);
                }
            }
        }
    }

    pub fn written_bufs(&self) -> BTreeSet<BufId> {
        self.stores.iter().map(|s| s.0).collect()
    }
    pub fn read_bufs(&self) -> BTreeSet<BufId> {
        self.loads.iter().map(|s| s.0).collect()
    }
    pub fn writes(&self, b: BufId) -> bool {
        self.stores.iter().any(|s| s.0 == b)
    }
    pub fn reads(&self, b: BufId) -> bool {
        self.loads.iter().any(|s| s.0 == b)
    }
    /// Every index tuple `b` is loaded or stored with.
    pub fn accesses(&self, b: BufId) -> Vec<Vec<Expr>> {
        let mut out: Vec<Vec<Expr>> = self
            .loads
            .iter()
            .filter(|l| l.0 == b)
            .map(|l| l.1.clone())
            .collect();
        out.extend(self.stores.iter().filter(|s| s.0 == b).map(|s| s.1.clone()));
        out
    }
    /// Variables updated inside but defined outside (carried scalars).
    pub fn carried_scalars(&self) -> BTreeSet<VarId> {
        self.assigned.difference(&self.defined).copied().collect()
    }
}

/// Something written by a region that iterations may share.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Resource {
    Buf(BufId),
    Scalar(VarId),
}

impl Resource {
    pub fn describe(&self, k: &Kernel) -> String {
        match self {
            Resource::Buf(b) => format!("buffer `{}`", k.buf(*b).name),
            Resource::Scalar(v) => format!("accumulator `{}`", k.var_info(*v).name),
        }
    }
}

/// For each resource written by `region` (buffers not allocated inside it, scalars defined
/// outside it), the variables defined inside the region that two executions touching the same
/// element must agree on. `outer` bounds the variables of enclosing loops.
pub(crate) fn sharing(
    k: &Kernel,
    region: &Region,
    outer: &Ranges,
) -> BTreeMap<Resource, BTreeSet<VarId>> {
    let cx = AffineCx::new(k);
    let mut ranges = outer.clone();
    ranges.extend(region.ranges.iter().map(|(k, v)| (*k, *v)));
    let mut out = BTreeMap::new();
    for b in region.written_bufs() {
        if region.allocs.contains(&b) {
            continue;
        }
        let acc = region.accesses(b);
        let rank = k.buf(b).shape.len();
        // One equation per dimension whose index forms agree up to their constants (accesses
        // at fixed offsets of one another, as the pixels of a Winograd tile); the constants'
        // spread is the slack two accesses may differ by.
        let mut eqs = vec![];
        for d in 0..rank {
            let forms: Option<Vec<_>> = acc
                .iter()
                .map(|ix| ix.get(d).and_then(|e| cx.affine(e)))
                .collect();
            if let Some(forms) = forms {
                if let Some(first) = forms.first() {
                    if forms.iter().all(|f| f.terms == first.terms) {
                        let lo = forms.iter().map(|f| f.c).min().unwrap_or(0);
                        let hi = forms.iter().map(|f| f.c).max().unwrap_or(0);
                        eqs.push((first.clone(), (hi as i128) - (lo as i128)));
                    } else if let Some(eq) = common_part(&forms, &ranges) {
                        eqs.push(eq);
                    }
                }
            }
        }
        out.insert(
            Resource::Buf(b),
            determined_vars(&eqs, &region.defined, &ranges),
        );
    }
    for v in region.carried_scalars() {
        out.insert(Resource::Scalar(v), BTreeSet::new());
    }
    out
}

/// For index forms that differ in more than their constants (a flattened pixel index whose
/// register blocks add `block * 8 + j` where the row's last pixels add constants): the terms
/// all forms share with equal coefficients, and as slack the spread of the rest over the
/// variables' ranges. Two accesses to one element have equal forms, so their common parts
/// differ by at most that spread. `None` without a common term or with an unbounded rest.
fn common_part(forms: &[crate::affine::Affine], ranges: &Ranges) -> Option<(crate::affine::Affine, i128)> {
    let first = forms.first()?;
    let mut common = crate::affine::Affine::constant(0);
    for (a, c) in &first.terms {
        if forms.iter().all(|f| f.terms.get(a) == Some(c)) {
            common.terms.insert(a.clone(), *c);
        }
    }
    if common.terms.is_empty() {
        return None;
    }
    let (mut lo, mut hi) = (i128::MAX, i128::MIN);
    for f in forms {
        let (mut flo, mut fhi) = (f.c as i128, f.c as i128);
        for (a, &c) in &f.terms {
            if common.terms.contains_key(a) {
                continue;
            }
            let (alo, ahi) = a.bounds(ranges)?;
            let (x, y) = (c as i128 * alo as i128, c as i128 * ahi as i128);
            flo += x.min(y);
            fhi += x.max(y);
        }
        lo = lo.min(flo);
        hi = hi.max(fhi);
    }
    Some((common, hi - lo))
}

/// Whether different iterations of loop `l` (at a position where the enclosing loops are
/// `outer`) are independent: no element written by one iteration is read or written by another,
/// and no scalar defined outside is updated.
pub(crate) fn iterations_independent(k: &Kernel, l: &Loop, outer: &Ranges) -> Result<(), String> {
    let region = Region::of(std::slice::from_ref(&Stmt::For(l.clone())));
    for (res, det) in sharing(k, &region, outer) {
        if !det.contains(&l.var) {
            let what = match res {
                Resource::Scalar(_) => "carries a dependence through".to_string(),
                Resource::Buf(_) => {
                    "may touch the same element in different iterations of".to_string()
                }
            };
            return Err(match res {
                Resource::Scalar(_) => format!(
                    "loop `{}` {what} {} (updated in the loop, declared outside it)",
                    k.var_info(l.var).name,
                    res.describe(k)
                ),
                Resource::Buf(_) => format!(
                    "{} {what} loop `{}` (cannot prove the accesses disjoint)",
                    res.describe(k),
                    k.var_info(l.var).name
                ),
            });
        }
    }
    Ok(())
}
