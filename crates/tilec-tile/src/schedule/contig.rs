//! Contiguity of loops in memory, judged on linearized element offsets.
//!
//! An access `buf[i0, .., ir]` touches element `sum(i_d * stride_d)` of a row-major buffer. A
//! loop walks memory with stride one when that offset has the loop variable as a plain term
//! with coefficient one, whichever dimensions the variable appears in: a group's channels and
//! pixels `x[n, g * C/G + c, h, w]` are one run of `C/G * H * W` elements, although no single
//! index dimension says so.
//!
//! Two perfectly nested loops `a` (outer) and `b` (inner, extent `B`) are one *contiguous run*
//! when every access of the body has stride `B * s` along `a` where it has stride `s` along `b`
//! (`s` = 0: an operand invariant in both), some access has `s` = 1, and neither variable is
//! used except in access indices. Fusing them (`fuse`, which keeps the iteration order, so it
//! is always legal) then leaves every offset affine in the fused variable, since the back ends'
//! linearizer folds `(f / B) * B*s + (f % B) * s` back to `f * s`: the vectorized loop runs over
//! the whole span instead of rows of `B`. A broadcast operand read along `a` only (a
//! per-channel scale), a padded or strided row, or an accumulator indexed by `a` breaks the run.

use super::affine::{Affine, AffineCx, Atom};
use super::deps::Region;
use super::{locate, loop_ref, var_name, Primitive};
use crate::ir::*;

/// The linearized offset of `buf[idx]` as an affine form with div/rem pairs folded; `None`
/// when some index is not quasi-affine or a coefficient overflows.
fn linear_form(cx: &AffineCx, k: &Kernel, buf: BufId, idx: &[Expr]) -> Option<Affine> {
    let strides = k.buf(buf).strides();
    if strides.len() != idx.len() {
        return None;
    }
    let mut sum = Affine::default();
    for (e, s) in idx.iter().zip(strides) {
        sum = sum.axpy(s, &cx.affine(e)?)?;
    }
    sum.fold_div_rem()
}

/// The stride of `v` in the linear form `a`: `Some(0)` when `a` does not use it, `None` when it
/// appears inside a division, a remainder or an opaque term.
fn stride_of(a: &Affine, v: VarId) -> Option<i64> {
    let mut s = 0;
    for (atom, &c) in &a.terms {
        match atom {
            Atom::Var(x) if *x == v => s = c,
            Atom::Var(_) => {}
            other if other.vars().contains(&v) => return None,
            _ => {}
        }
    }
    Some(s)
}

/// Strides along `vars` of one access: `Ok(Some(..))` when affine, `Ok(None)` when the access
/// does not depend on them at all (whatever its form), `Err(())` otherwise.
fn strides(
    cx: &AffineCx,
    k: &Kernel,
    buf: BufId,
    idx: &[Expr],
    vars: &[VarId],
) -> Result<Option<Vec<i64>>, ()> {
    match linear_form(cx, k, buf, idx) {
        Some(a) => vars
            .iter()
            .map(|&v| stride_of(&a, v))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or(()),
        None if vars.iter().all(|&v| !idx.iter().any(|e| e.uses_var(v))) => Ok(None),
        None => Err(()),
    }
}

/// Whether loop `l` walks memory with stride one: some access has stride one along it, and
/// every store has stride zero or one (judged on linearized offsets).
pub(crate) fn unit_stride(k: &Kernel, l: &Loop) -> bool {
    let cx = AffineCx::new(k);
    let r = Region::of(&l.body);
    let mut any_unit = false;
    for (b, idx, _) in &r.stores {
        match linear_form(&cx, k, *b, idx).map(|a| stride_of(&a, l.var)) {
            Some(Some(0)) => {}
            Some(Some(1)) => any_unit = true,
            _ => return false,
        }
    }
    for (b, idx) in &r.loads {
        if matches!(strides(&cx, k, *b, idx, &[l.var]), Ok(Some(s)) if s[0] == 1) {
            any_unit = true;
        }
    }
    any_unit
}

/// Whether `e` reads `v` outside the indices of its loads.
fn value_uses(e: &Expr, v: VarId) -> bool {
    match e {
        Expr::Var(x) => *x == v,
        Expr::Int(_) | Expr::Lit(_) | Expr::Load(..) => false,
        Expr::Unary(_, a) | Expr::Cast(_, a) | Expr::ToIndex(a) | Expr::CheckIndex(a, _) => {
            value_uses(a, v)
        }
        Expr::Binary(_, a, b) => value_uses(a, v) || value_uses(b, v),
        Expr::Select(c, a, b) => value_uses(c, v) || value_uses(a, v) || value_uses(b, v),
    }
}

/// Whether straight-line statements use `v` only in access indices (no loops, gemms or
/// allocations among them).
fn only_in_indices(stmts: &[Stmt], v: VarId) -> bool {
    stmts.iter().all(|s| match s {
        Stmt::Store { value, .. } | Stmt::Let { value, .. } | Stmt::Assign { value, .. } => {
            !value_uses(value, v)
        }
        Stmt::If { cond, then_, else_ } => {
            !value_uses(cond, v) && only_in_indices(then_, v) && only_in_indices(else_, v)
        }
        _ => false,
    })
}

/// Whether serial loop `outer`, whose whole body is the innermost serial loop `inner`, forms one
/// contiguous run with it (see the module documentation), so that fusing the two lets the fused
/// loop be vectorized over the whole span.
pub(crate) fn contiguous_pair(k: &Kernel, outer: &Loop, inner: &Loop) -> bool {
    let perfect = matches!(outer.body.as_slice(), [Stmt::For(l)] if l.var == inner.var);
    if !perfect || outer.kind != LoopKind::Serial || inner.kind != LoopKind::Serial {
        return false;
    }
    if outer.extent < 2 || inner.extent < 1 {
        return false;
    }
    let r = Region::of(&inner.body);
    if r.loops > 0 || r.gemms > 0 || !r.allocs.is_empty() {
        return false;
    }
    let (a, b) = (outer.var, inner.var);
    if !only_in_indices(&inner.body, a) || !only_in_indices(&inner.body, b) {
        return false;
    }
    let cx = AffineCx::new(k);
    let mut any_unit = false;
    let accesses = r
        .stores
        .iter()
        .map(|(b, i, _)| (b, i))
        .chain(r.loads.iter().map(|(b, i)| (b, i)));
    for (buf, idx) in accesses {
        match strides(&cx, k, *buf, idx, &[a, b]) {
            Ok(None) => {}
            Ok(Some(s)) => {
                if inner.extent.checked_mul(s[1]) != Some(s[0]) {
                    return false;
                }
                any_unit |= s[1] == 1;
            }
            Err(()) => return false,
        }
    }
    any_unit
}

/// Fuses the contiguous runs of innermost loops in the nest of loop `root` (see
/// [`contiguous_pair`]), innermost pairs first and again on the fused loops, until none is
/// left. Returns the steps applied and the root's name afterwards (the root itself is fused
/// when the whole nest is one run).
pub(crate) fn fuse_runs(k: &mut Kernel, root: &str) -> (Vec<Primitive>, String) {
    let mut steps = vec![];
    let mut root = root.to_string();
    while let Some(l) = k
        .var_named(&root)
        .and_then(|v| locate(&k.body, v))
        .and_then(|p| loop_ref(k, &p))
    {
        let Some((outer, inner)) = find_pair(k, l) else {
            break;
        };
        let Ok(fused) = super::fuse(k, &outer, &inner) else {
            break;
        };
        if outer == root {
            root = fused;
        }
        steps.push(Primitive::Fuse { outer, inner });
    }
    (steps, root)
}

/// The first contiguous pair of loops at or under `l`, by name.
fn find_pair(k: &Kernel, l: &Loop) -> Option<(String, String)> {
    if let [Stmt::For(inner)] = l.body.as_slice() {
        if contiguous_pair(k, l, inner) {
            return Some((var_name(k, l.var), var_name(k, inner.var)));
        }
    }
    fn under(k: &Kernel, stmts: &[Stmt]) -> Option<(String, String)> {
        stmts.iter().find_map(|s| match s {
            Stmt::For(l) => find_pair(k, l),
            Stmt::If { then_, else_, .. } => under(k, then_).or_else(|| under(k, else_)),
            _ => None,
        })
    }
    under(k, &l.body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilec_ir::DType;

    const F: DType = DType::F32;

    fn v(x: VarId) -> Expr {
        Expr::Var(x)
    }

    /// `for a in 0..na { for b in 0..nb { body(a, b) } }`: the kernel and both loops.
    fn nest(
        k: &mut Kernel,
        na: i64,
        nb: i64,
        body: impl FnOnce(&mut Kernel, VarId, VarId) -> Vec<Stmt>,
    ) -> (Loop, Loop) {
        let (a, b) = (k.index_var("a"), k.index_var("b"));
        let inner = Loop {
            var: b,
            extent: nb,
            kind: LoopKind::Serial,
            body: body(k, a, b),
        };
        let outer = Loop {
            var: a,
            extent: na,
            kind: LoopKind::Serial,
            body: vec![Stmt::For(inner.clone())],
        };
        k.body.push(Stmt::For(outer.clone()));
        (outer, inner)
    }

    fn pair(na: i64, nb: i64, body: impl FnOnce(&mut Kernel, VarId, VarId) -> Vec<Stmt>) -> bool {
        let mut k = Kernel::new("t");
        let (o, i) = nest(&mut k, na, nb, body);
        contiguous_pair(&k, &o, &i)
    }

    #[test]
    fn copies_and_group_rows_fuse() {
        // out[a, b] = x[a, b] * 2 over [4, 16].
        assert!(pair(4, 16, |k, a, b| {
            let (x, out) = (k.param("x", F, vec![4, 16]), k.param("out", F, vec![4, 16]));
            let val = Expr::bin(
                BinOp::Mul,
                Expr::load(x, vec![v(a), v(b)]),
                Expr::float(2.0, F),
            );
            vec![Stmt::store(out, vec![v(a), v(b)], val)]
        }));
        // A group's channels and pixels: x[0, 3 * 4 + a, b / 5, b % 5] summed (a reduction into
        // one scalar: the order of the fused loop is the nest's).
        assert!(pair(4, 35, |k, a, b| {
            let x = k.param("x", F, vec![1, 16, 7, 5]);
            let acc = k.new_var("acc", Ty::Elem(F), true);
            let ch = Expr::add(Expr::Int(12), v(a));
            let idx = vec![Expr::Int(0), ch, Expr::div(v(b), 5), Expr::rem(v(b), 5)];
            vec![Stmt::Assign {
                var: acc,
                value: Expr::add(v(acc), Expr::load(x, idx)),
            }]
        }));
        // Every other column of rows of 16 is one stride-2 run beside the stride-1 store.
        assert!(pair(4, 8, |k, a, b| {
            let (x, out) = (k.param("x", F, vec![4, 16]), k.param("out", F, vec![4, 8]));
            let val = Expr::load(x, vec![v(a), Expr::mul(v(b), Expr::Int(2))]);
            vec![Stmt::store(out, vec![v(a), v(b)], val)]
        }));
        // An operand invariant in both loops is fine.
        assert!(pair(3, 8, |k, a, b| {
            let (x, s, out) = (
                k.param("x", F, vec![24]),
                k.param("s", F, vec![1]),
                k.param("out", F, vec![24]),
            );
            let i = Expr::add(Expr::mul(v(a), Expr::Int(8)), v(b));
            let val = Expr::bin(
                BinOp::Mul,
                Expr::load(x, vec![i.clone()]),
                Expr::load(s, vec![Expr::Int(0)]),
            );
            vec![Stmt::store(out, vec![i], val)]
        }));
    }

    #[test]
    fn broken_runs_do_not_fuse() {
        // Padded rows: x is [4, 18], read at [a, b + 1] for b < 16.
        assert!(!pair(4, 16, |k, a, b| {
            let (x, out) = (k.param("x", F, vec![4, 18]), k.param("out", F, vec![4, 16]));
            let val = Expr::load(x, vec![v(a), Expr::add(v(b), Expr::Int(1))]);
            vec![Stmt::store(out, vec![v(a), v(b)], val)]
        }));
        // Strided: every other column of the first 16 of rows of 20.
        assert!(!pair(4, 8, |k, a, b| {
            let (x, out) = (k.param("x", F, vec![4, 20]), k.param("out", F, vec![4, 8]));
            let val = Expr::load(x, vec![v(a), Expr::mul(v(b), Expr::Int(2))]);
            vec![Stmt::store(out, vec![v(a), v(b)], val)]
        }));
        // A per-row scale (stride 1 along a, 0 along b): a broadcast on one loop only.
        assert!(!pair(4, 16, |k, a, b| {
            let (x, g, out) = (
                k.param("x", F, vec![4, 16]),
                k.param("g", F, vec![4]),
                k.param("out", F, vec![4, 16]),
            );
            let val = Expr::bin(
                BinOp::Mul,
                Expr::load(x, vec![v(a), v(b)]),
                Expr::load(g, vec![v(a)]),
            );
            vec![Stmt::store(out, vec![v(a), v(b)], val)]
        }));
        // A reduction into a per-row accumulator: fusing would not change the order, but the
        // accumulator is not a run along b.
        assert!(!pair(4, 16, |k, a, b| {
            let (x, out) = (k.param("x", F, vec![4, 16]), k.param("out", F, vec![4]));
            let val = Expr::add(Expr::load(out, vec![v(a)]), Expr::load(x, vec![v(a), v(b)]));
            vec![Stmt::store(out, vec![v(a)], val)]
        }));
        // A loop variable used as a value (a position) would turn into a division.
        assert!(!pair(4, 16, |k, a, b| {
            let out = k.param("out", F, vec![4, 16]);
            vec![Stmt::store(out, vec![v(a), v(b)], Expr::cast(F, v(b)))]
        }));
    }

    #[test]
    fn reductions_with_a_shared_accumulator_are_not_perfect_nests() {
        // for a { acc = 0; for b { acc += x[a, b] }; out[a] = acc }: the accumulator is reset
        // per row, so the loops are not a perfect nest.
        let mut k = Kernel::new("t");
        let (x, out) = (k.param("x", F, vec![4, 16]), k.param("out", F, vec![4]));
        let (a, b) = (k.index_var("a"), k.index_var("b"));
        let acc = k.new_var("acc", Ty::Elem(F), true);
        let inner = Loop {
            var: b,
            extent: 16,
            kind: LoopKind::Serial,
            body: vec![Stmt::Assign {
                var: acc,
                value: Expr::add(v(acc), Expr::load(x, vec![v(a), v(b)])),
            }],
        };
        let outer = Loop {
            var: a,
            extent: 4,
            kind: LoopKind::Serial,
            body: vec![
                Stmt::Let {
                    var: acc,
                    value: Expr::float(0.0, F),
                },
                Stmt::For(inner.clone()),
                Stmt::store(out, vec![v(a)], v(acc)),
            ],
        };
        k.body.push(Stmt::For(outer.clone()));
        assert!(!contiguous_pair(&k, &outer, &inner));
    }

    #[test]
    fn unit_stride_reads_linearized_offsets() {
        // After fusing a [4, 6] nest: out[f / 6, f % 6] is stride one along f.
        let mut k = Kernel::new("t");
        let (x, out) = (k.param("x", F, vec![4, 6]), k.param("out", F, vec![4, 6]));
        let f = k.index_var("f");
        let idx = vec![Expr::div(v(f), 6), Expr::rem(v(f), 6)];
        let body = vec![Stmt::store(out, idx.clone(), Expr::load(x, idx))];
        let l = Loop {
            var: f,
            extent: 24,
            kind: LoopKind::Serial,
            body,
        };
        assert!(unit_stride(&k, &l));
        // A transposed store is not.
        let body = vec![Stmt::store(
            out,
            vec![Expr::rem(v(f), 4), Expr::div(v(f), 4)],
            Expr::load(x, vec![Expr::Int(0), Expr::Int(0)]),
        )];
        let l = Loop {
            var: f,
            extent: 24,
            kind: LoopKind::Serial,
            body,
        };
        assert!(!unit_stride(&k, &l));
    }

    /// A group norm's shape of loops over `x: [1, 8, 4, 8]` in 2 groups: the statistics over a
    /// group's 4 channels and 32 pixels become one loop of 128, rfactored and vectorized; the
    /// epilogue, scaled per channel, keeps its channel loop and fuses the pixels.
    #[test]
    fn default_schedule_fuses_group_spans() {
        let mut k = Kernel::new("gn");
        let (x, gamma, out) = (
            k.param("x", F, vec![1, 8, 4, 8]),
            k.param("g", F, vec![8]),
            k.param("out", F, vec![1, 8, 4, 8]),
        );
        let g = k.index_var("g");
        let [c0, h0, w0, c1, h1, w1] = ["c0", "h0", "w0", "c1", "h1", "w1"].map(|n| k.index_var(n));
        let acc = k.new_var("acc", Ty::Elem(F), true);
        let ch = |c: VarId| Expr::add(Expr::mul(v(g), Expr::Int(4)), v(c));
        let xi = |c, h, w| vec![Expr::Int(0), ch(c), v(h), v(w)];
        let sum = Stmt::Assign {
            var: acc,
            value: Expr::add(v(acc), Expr::load(x, xi(c0, h0, w0))),
        };
        let scaled = Expr::bin(
            BinOp::Mul,
            Expr::load(x, xi(c1, h1, w1)),
            Expr::load(gamma, vec![ch(c1)]),
        );
        let val = Expr::bin(BinOp::Mul, scaled, v(acc));
        let nest3 =
            |c, h, w, body| Stmt::for_(c, 4, vec![Stmt::for_(h, 4, vec![Stmt::for_(w, 8, body)])]);
        k.body.push(Stmt::for_(
            g,
            2,
            vec![
                Stmt::Let {
                    var: acc,
                    value: Expr::float(0.0, F),
                },
                nest3(c0, h0, w0, vec![sum]),
                nest3(c1, h1, w1, vec![Stmt::store(out, xi(c1, h1, w1), val)]),
            ],
        ));
        let t = super::super::CpuTarget {
            threads: 1,
            vector_bytes: 64,
            ..Default::default()
        };
        let s = super::super::default_cpu(&k, &t).to_string();
        let want = "fuse h0, w0\nfuse c0, h0_w0\nfuse h1, w1\nrfactor c0_h0_w0 by 16\nvectorize c0_h0_w0_i\nvectorize h1_w1\n";
        assert_eq!(s, want);
    }
}
