//! Dependence reasoning on quasi-affine index forms ([`crate::affine`]): which loop variables
//! the equality of two accesses pins down.

use std::collections::BTreeSet;

pub(crate) use crate::affine::{Affine, AffineCx, Atom, Ranges};
use crate::ir::VarId;

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
                Atom::Mod(x, d, fl) => {
                    if let Some((lo, hi)) = x.bounds(ranges) {
                        if lo >= 0 && hi < *d {
                            new_eqs.push((**x).clone());
                        }
                    }
                    // A remainder of a quotient, `(y / a) % d`, and the quotient `y / (a·d)`
                    // determine `y / a` (`= d · (y / (a·d)) + (y / a) % d`; `(y / a) / d`
                    // simplifies to `y / (a·d)`, so the pair is not a plain div/mod pair).
                    if let (Some((Atom::Div(y, a, f2), 1)), 0, 1) =
                        (x.terms.iter().next().map(|(t, &c)| (t, c)), x.c, x.terms.len())
                    {
                        let whole = a.checked_mul(*d).map(|ad| Atom::Div(y.clone(), ad, *fl));
                        if f2 == fl && whole.is_some_and(|w| det.contains(&w)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `it / 36`, `it % 9` and `(it / 9) % 4` (an image, a row and a group of a loop over
    /// (image, group, row)) pin `it` down; without the quotient's remainder they do not.
    #[test]
    fn nested_quotient_and_remainder_determine_the_dividend() {
        let it = VarId(0);
        let x = Affine::var(it);
        let q9 = Atom::Div(Box::new(x.clone()), 9, false);
        let eqs = vec![
            (Affine::atom(Atom::Div(Box::new(x.clone()), 36, false)), 0),
            (Affine::atom(Atom::Mod(Box::new(x.clone()), 9, false)), 0),
            (Affine::atom(Atom::Mod(Box::new(Affine::atom(q9)), 4, false)), 0),
        ];
        let varying: BTreeSet<VarId> = [it].into();
        let ranges: Ranges = [(it, (0, 71))].into_iter().collect();
        assert!(determined_vars(&eqs, &varying, &ranges).contains(&it));
        assert!(!determined_vars(&eqs[..2], &varying, &ranges).contains(&it));
    }
}
