//! Linear element offsets of multi-dimensional indices, for the back ends.
//!
//! An index into a row-major buffer is `sum(index[d] * stride[d])`. Re-indexing through
//! reshapes leaves pairs `(x / a) * a*c + (x % a) * c` in that sum, which are `x * c` exactly
//! (C's truncating division and remainder satisfy `(x / a) * a + x % a == x` for every `x`).
//! Folding them keeps divisions out of every access, and keeps GPU compilers away from index
//! arithmetic they handle poorly.

use crate::ir::{BinOp, Expr};

/// The offset `sum(e * c)` over `terms` as an affine sum of atoms plus a constant, with the
/// div/rem pairs folded; `None` when a coefficient overflows.
pub fn linear_offset(terms: &[(Expr, i64)]) -> Option<(Vec<(i64, Expr)>, i64)> {
    let mut atoms = vec![];
    let mut konst = 0i64;
    for (e, c) in terms {
        if !affine_terms(e, *c, &mut atoms, &mut konst) {
            return None;
        }
    }
    fold_div_rem(&mut atoms);
    atoms.retain(|(c, _)| *c != 0);
    Some((atoms, konst))
}

/// Adds `coef * e` to an affine sum of atoms; false on overflow.
fn affine_terms(e: &Expr, coef: i64, out: &mut Vec<(i64, Expr)>, konst: &mut i64) -> bool {
    match e {
        Expr::Int(c) => match c.checked_mul(coef).and_then(|v| konst.checked_add(v)) {
            Some(v) => {
                *konst = v;
                true
            }
            None => false,
        },
        Expr::Binary(BinOp::Add, a, b) => {
            affine_terms(a, coef, out, konst) && affine_terms(b, coef, out, konst)
        }
        Expr::Binary(BinOp::Sub, a, b) => match coef.checked_neg() {
            Some(n) => affine_terms(a, coef, out, konst) && affine_terms(b, n, out, konst),
            None => false,
        },
        Expr::Binary(BinOp::Mul, a, b) => match (&**a, &**b) {
            (x, Expr::Int(c)) | (Expr::Int(c), x) => match coef.checked_mul(*c) {
                Some(m) => affine_terms(x, m, out, konst),
                None => false,
            },
            _ => add_atom(out, coef, e.clone()),
        },
        _ => add_atom(out, coef, e.clone()),
    }
}

fn add_atom(out: &mut Vec<(i64, Expr)>, coef: i64, e: Expr) -> bool {
    if let Some(t) = out.iter_mut().find(|(_, x)| *x == e) {
        match t.0.checked_add(coef) {
            Some(v) => t.0 = v,
            None => return false,
        }
    } else {
        out.push((coef, e));
    }
    true
}

/// Folds `c*a * (x / a) + c * (x % a)` into `c * x` until nothing changes.
fn fold_div_rem(atoms: &mut Vec<(i64, Expr)>) {
    loop {
        let mut found = None;
        'search: for (i, (ci, ei)) in atoms.iter().enumerate() {
            if let Expr::Binary(BinOp::Div, x, a) = ei {
                if let Expr::Int(a) = **a {
                    if a <= 0 {
                        continue;
                    }
                    for (j, (cj, ej)) in atoms.iter().enumerate() {
                        if let Expr::Binary(BinOp::Rem, y, b) = ej {
                            if **b == Expr::Int(a)
                                && y == x
                                && cj.checked_mul(a) == Some(*ci)
                                && *cj != 0
                            {
                                found = Some((i, j, *cj, (**x).clone()));
                                break 'search;
                            }
                        }
                    }
                }
            }
        }
        let Some((i, j, c, x)) = found else { return };
        let (hi, lo) = if i > j { (i, j) } else { (j, i) };
        atoms.remove(hi);
        atoms.remove(lo);
        let mut k = 0i64;
        let mut extra = vec![];
        if !affine_terms(&x, c, &mut extra, &mut k) || k != 0 {
            // Keep x whole (a constant inside it is not split out).
            extra = vec![(c, x)];
        }
        for (c, e) in extra {
            if !add_atom(atoms, c, e.clone()) {
                atoms.push((c, e));
            }
        }
    }
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
        assert_eq!(atoms, vec![(1, j), (160, i)]);
    }

    #[test]
    fn unpaired_terms_and_overflow() {
        let i = var(0);
        let (atoms, k) = linear_offset(&[(Expr::add(Expr::div(i.clone(), 4), Expr::Int(3)), 5)]).unwrap();
        assert_eq!((atoms, k), (vec![(5, Expr::div(i.clone(), 4))], 15));
        assert!(linear_offset(&[(Expr::mul(i, Expr::Int(i64::MAX)), 2)]).is_none());
    }
}
