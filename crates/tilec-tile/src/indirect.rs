//! Indirect `A` operands of a [`Gemm`]: reading the left operand where it lies instead of
//! packing it (the CPU GEMM template does; the CPU schedule keeps such gemms untransposed).
//!
//! A channels-last convolution computes `C[p, m] = sum_k A[p, k] * W[k, m]` with
//! `A[p, (tap, c)] = in_bounds(p, tap) ? x[pixel(p, tap), c] : 0` (an implicit im2col), and a
//! matrix product reads `A[i, k] = x[i, k]` directly. In both, `A` splits along `k` into
//! **segments**: runs of `k` over which, for every row `i`, the element is either always zero
//! or `x[row(i) + off + (k - k0)]`, contiguous in memory. The micro-kernel then takes one
//! pointer per row and segment (a zero buffer for rows out of bounds) and reads the row's
//! values as it goes: nothing is packed, nothing is checked per element.
//!
//! The analysis here is exact and done at render time: the operand expression must be a tree
//! of selects on `k` alone (a concatenation) over leaves `cond ? load : 0` or `load` from an
//! f32 kernel parameter or scratch buffer, whose flat offset and bound checks are sums of a part in `i` and a
//! part in `k` (and the batch); a leaf may also be a tree of selects on `i` alone over loads of
//! one buffer at one `k` part (a rolled image), whose row part then selects. The `k` parts are evaluated for every `k` (and batch) here and
//! emitted as tables; the `i` parts are rendered to C and evaluated per row at run time.

use std::collections::HashMap;

use tilec_ir::DType;
use crate::affine::linear_offset;
use crate::ir::*;

/// One kind of element: `atoms all hold ? buf[row + kpart] : 0`.
#[derive(Clone, Debug)]
pub struct Leaf {
    pub buf: BufId,
    /// The offset's part in the row variable (and the batch).
    pub row: Expr,
    /// Bound checks `kpart + ipart OP 0`: (op, k part, i part).
    pub atoms: Vec<(BinOp, Expr, Expr)>,
    /// The offset's part in `k` (and the batch, and constants).
    pub koff: Expr,
}

/// A run of `k` with one leaf, constant check parts and a contiguous offset.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    pub len: i64,
    pub leaf: usize,
    /// `k` part of the offset at the piece's first `k`.
    pub off: i64,
    /// `k` parts of the leaf's checks.
    pub atoms: Vec<i64>,
}

/// The analysis result: leaves and, per batch variant and `kc` slice, the pieces.
#[derive(Clone, Debug)]
pub struct IndirectA {
    pub leaves: Vec<Leaf>,
    /// Whether the pieces depend on the batch (then `slices` has one entry per batch).
    pub batched: bool,
    /// `[variant][slice]` -> pieces of that slice, in `k` order.
    pub slices: Vec<Vec<Vec<Piece>>>,
    pub kc: i64,
}

impl IndirectA {
    /// The largest number of pieces in one slice.
    pub fn max_pieces(&self) -> usize {
        self.slices.iter().flatten().map(|s| s.len()).max().unwrap_or(0)
    }
    /// The longest piece.
    pub fn max_len(&self) -> i64 {
        self.slices.iter().flatten().flatten().map(|p| p.len).max().unwrap_or(0)
    }
}

/// Splits `e` into selects on `k` over leaves; `None` if it has another shape.
fn leaves_of(
    k: &Kernel,
    g: &Gemm,
    e: &Expr,
    leaves: &mut Vec<Leaf>,
    conds: &mut Vec<Expr>,
) -> Option<Expr> {
    match e {
        Expr::Select(c, a, b) if !uses(c, g.i_var) => {
            let a = leaves_of(k, g, a, leaves, conds)?;
            let b = leaves_of(k, g, b, leaves, conds)?;
            conds.push((**c).clone());
            Some(Expr::select((**c).clone(), a, b))
        }
        // Rows that choose their source (a roll: a row near the image's edge wraps to the
        // other end): one leaf whose row part selects ([`row_leaf`]).
        Expr::Select(c, ..) if !uses(c, g.k_var) && !is_checked_leaf(e) => {
            leaves.push(row_leaf(k, g, e)?);
            Some(Expr::Int(leaves.len() as i64 - 1))
        }
        Expr::Select(c, a, z) => {
            let Expr::Lit(Lit::Float(zero, _)) = **z else { return None };
            if zero != 0.0 || zero.is_sign_negative() {
                return None;
            }
            let id = leaf(k, g, a, Some(c))?;
            leaves.push(id);
            Some(Expr::Int(leaves.len() as i64 - 1))
        }
        Expr::Load(..) => {
            let id = leaf(k, g, e, None)?;
            leaves.push(id);
            Some(Expr::Int(leaves.len() as i64 - 1))
        }
        _ => None,
    }
}

/// Whether `e` has the shape of a checked leaf `cond ? x : 0.0` (a literal in its else
/// branch; the arm below takes it, or refuses a literal other than zero).
fn is_checked_leaf(e: &Expr) -> bool {
    matches!(e, Expr::Select(_, _, z) if matches!(**z, Expr::Lit(Lit::Float(_, _))))
}

/// A tree of selects on the row (and batch) alone over plain loads of one buffer at one `k`
/// part, as one leaf whose row part is the same tree of selects over the loads' row parts.
fn row_leaf(k: &Kernel, g: &Gemm, e: &Expr) -> Option<Leaf> {
    match e {
        Expr::Load(..) => {
            // The offset's terms without `k` (its constant, the batch's) go with the row part,
            // so that loads differing only in those share the `k` part.
            let lf = leaf(k, g, e, None)?;
            let (koff, moved) = split_terms(lf.koff, g.k_var);
            Some(Leaf { row: Expr::bin(BinOp::Add, lf.row, moved), koff, ..lf })
        }
        Expr::Select(c, a, b) if !uses(c, g.k_var) => {
            let mut other = false;
            c.visit(&mut |x| other |= matches!(x, Expr::Var(v) if *v != g.i_var && *v != g.b_var));
            let (la, lb) = (row_leaf(k, g, a)?, row_leaf(k, g, b)?);
            if other || la.buf != lb.buf || la.koff != lb.koff || !la.atoms.is_empty() || !lb.atoms.is_empty() {
                return None;
            }
            Some(Leaf { row: Expr::select((**c).clone(), la.row, lb.row), ..la })
        }
        _ => None,
    }
}

/// The terms of a [`split_offset`] sum (`((c + t1) + t2) + ...`) as (those that read `v`,
/// the others), each rebuilt as a sum without zero terms: equal sets of terms in the same
/// order compare equal, whatever was taken out.
fn split_terms(e: Expr, v: VarId) -> (Expr, Expr) {
    fn flatten(e: Expr, out: &mut Vec<Expr>) {
        match e {
            Expr::Binary(BinOp::Add, a, b) => {
                flatten(*a, out);
                flatten(*b, out);
            }
            Expr::Int(0) => {}
            e => out.push(e),
        }
    }
    let mut terms = vec![];
    flatten(e, &mut terms);
    let (with, without): (Vec<Expr>, Vec<Expr>) = terms.into_iter().partition(|t| uses(t, v));
    let sum = |ts: Vec<Expr>| ts.into_iter().reduce(|a, b| Expr::bin(BinOp::Add, a, b)).unwrap_or(Expr::Int(0));
    (sum(with), sum(without))
}

fn leaf(k: &Kernel, g: &Gemm, load: &Expr, cond: Option<&Expr>) -> Option<Leaf> {
    let Expr::Load(buf, idx) = load else { return None };
    let b = k.buf(*buf);
    // A parameter, or a scratch buffer the kernel allocated (in scope wherever a gemm of the
    // kernel reads it).
    let addressable = k.params.contains(buf) || b.scope == Scope::Local;
    if b.dtype != DType::F32 || !addressable || b.numel() >= 1 << 31 {
        return None;
    }
    let terms: Vec<(Expr, i64)> = idx.iter().cloned().zip(b.strides()).collect();
    let vars = [g.b_var, g.i_var, g.k_var];
    let (koff, row) = split_offset(&terms, g.i_var, g.k_var, Some(&vars))?;
    let atoms = match cond {
        Some(c) => bound_atoms(c, g.i_var, g.k_var, Some(&vars))?,
        None => vec![],
    };
    Some(Leaf {
        buf: *buf,
        row,
        atoms,
        koff,
    })
}

fn and_atoms(e: &Expr, out: &mut Vec<Expr>) {
    match e {
        Expr::Binary(BinOp::And, a, b) => {
            and_atoms(a, out);
            and_atoms(b, out);
        }
        _ => out.push(e.clone()),
    }
}

/// A conjunction of bounds `x OP y` (`<`, `<=`, `>`, `>=`) as `(OP, part of x - y without
/// `row`, part with it)` per bound, split as [`split_offset`] splits; `None` for any other
/// condition.
pub fn bound_atoms(cond: &Expr, row: VarId, col: VarId, allowed: Option<&[VarId]>) -> Option<Vec<(BinOp, Expr, Expr)>> {
    let mut list = vec![];
    and_atoms(cond, &mut list);
    list.into_iter()
        .map(|a| {
            let Expr::Binary(op @ (BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge), x, y) = a else {
                return None;
            };
            let (rest, r) = split_offset(&[(*x, 1), (*y, -1)], row, col, allowed)?;
            Some((op, rest, r))
        })
        .collect()
}

/// `sum(e * c)` as (the part without `row`, the part with it); `None` if a term uses both
/// `row` and `col`, or (with `allowed`) a variable not in `allowed`.
pub fn split_offset(terms: &[(Expr, i64)], row: VarId, col: VarId, allowed: Option<&[VarId]>) -> Option<(Expr, Expr)> {
    let (atoms, konst) = linear_offset(terms)?;
    let (mut rest, mut rp) = (Expr::Int(konst), Expr::Int(0));
    for (c, e) in atoms {
        let (hr, hc) = (uses(&e, row), uses(&e, col));
        let mut other = false;
        if let Some(vars) = allowed {
            e.visit(&mut |x| {
                if let Expr::Var(v) = x {
                    other |= !vars.contains(v);
                }
            });
        }
        if other || (hr && hc) || c.unsigned_abs() >= 1 << 31 {
            return None;
        }
        let t = Expr::bin(BinOp::Mul, e, Expr::Int(c));
        if hr {
            rp = Expr::bin(BinOp::Add, rp, t);
        } else {
            rest = Expr::bin(BinOp::Add, rest, t);
        }
    }
    Some((rest, rp))
}

fn uses(e: &Expr, v: VarId) -> bool {
    let mut u = false;
    e.visit(&mut |x| u |= matches!(x, Expr::Var(w) if *w == v));
    u
}

/// Evaluates an integer/boolean index expression; `None` for anything else.
fn eval(e: &Expr, env: &HashMap<VarId, i64>) -> Option<i64> {
    Some(match e {
        Expr::Int(x) => *x,
        Expr::Lit(Lit::Bool(b)) => *b as i64,
        Expr::Lit(Lit::Int(x, _)) => *x,
        Expr::Var(v) => *env.get(v)?,
        Expr::Select(c, a, b) => {
            if eval(c, env)? != 0 {
                eval(a, env)?
            } else {
                eval(b, env)?
            }
        }
        Expr::Unary(UnOp::Not, a) => (eval(a, env)? == 0) as i64,
        Expr::Unary(UnOp::Neg, a) => eval(a, env)?.checked_neg()?,
        Expr::Binary(op, a, b) => {
            let (x, y) = (eval(a, env)?, eval(b, env)?);
            match op {
                BinOp::Add => x.checked_add(y)?,
                BinOp::Sub => x.checked_sub(y)?,
                BinOp::Mul => x.checked_mul(y)?,
                BinOp::Div if y != 0 => x.checked_div(y)?,
                BinOp::Rem if y != 0 => x.checked_rem(y)?,
                BinOp::FloorDiv if y != 0 => {
                    let q = x.checked_div(y)?;
                    if x % y != 0 && ((x < 0) != (y < 0)) { q - 1 } else { q }
                }
                BinOp::FloorMod if y != 0 => {
                    let r = x.checked_rem(y)?;
                    if r != 0 && ((r < 0) != (y < 0)) { r + y } else { r }
                }
                BinOp::Min => x.min(y),
                BinOp::Max => x.max(y),
                BinOp::Lt => (x < y) as i64,
                BinOp::Le => (x <= y) as i64,
                BinOp::Gt => (x > y) as i64,
                BinOp::Ge => (x >= y) as i64,
                BinOp::Eq => (x == y) as i64,
                BinOp::Ne => (x != y) as i64,
                BinOp::And => ((x != 0) && (y != 0)) as i64,
                BinOp::Or => ((x != 0) || (y != 0)) as i64,
                _ => return None,
            }
        }
        _ => return None,
    })
}

/// Segments of `k` (for batch `b`): maximal runs with one leaf, constant check parts and a
/// contiguous offset.
fn segments(g: &Gemm, tree: &Expr, leaves: &[Leaf], b: i64) -> Option<Vec<Piece>> {
    let mut env = HashMap::new();
    env.insert(g.b_var, b);
    let mut out: Vec<Piece> = vec![];
    let mut last_off = 0i64;
    for k in 0..g.k {
        env.insert(g.k_var, k);
        let li = eval(tree, &env)? as usize;
        let lf = leaves.get(li)?;
        let off = eval(&lf.koff, &env)?;
        let atoms = lf.atoms.iter().map(|(_, kp, _)| eval(kp, &env)).collect::<Option<Vec<_>>>()?;
        if off.unsigned_abs() >= 1 << 31 || atoms.iter().any(|a| a.unsigned_abs() >= 1 << 31) {
            return None;
        }
        match out.last_mut() {
            Some(p) if p.leaf == li && p.atoms == atoms && off == last_off + 1 => p.len += 1,
            _ => out.push(Piece { len: 1, leaf: li, off, atoms }),
        }
        last_off = off;
    }
    Some(out)
}

/// About how deep a K slice of an in-place `A` is: a 256-deep, 32-wide B panel is 32 KiB and
/// stays in L1 while the row tiles pass it. (Deeper slices make fewer round trips of the
/// partial sums and measured up to 12% faster on single convolutions with warm caches, but
/// 3-8% slower over the whole of ResNet-50: 23.5-23.7 ms at 256 against 24.3-25.3 at 512.)
const SLICE_TARGET: i64 = 256;

/// The slice depth for segments of (at most) length `len`: as many whole segments as fit in
/// [`SLICE_TARGET`] when they are short, else the segment split evenly into parts of at most
/// that.
fn slice_depth(len: i64, k: i64) -> i64 {
    let len = len.max(1);
    let t = SLICE_TARGET;
    let kc = if len <= t {
        len * (t / len)
    } else {
        let parts = (len + t - 1) / t;
        (len + parts - 1) / parts
    };
    kc.clamp(1, k.max(1))
}

/// Cuts segments into `kc`-deep slices (the last may be shorter).
fn slice(segs: &[Piece], kc: i64) -> Vec<Vec<Piece>> {
    let mut slices = vec![];
    let mut cur = vec![];
    let mut room = kc;
    for s in segs {
        let mut p = s.clone();
        while p.len > 0 {
            let take = p.len.min(room);
            cur.push(Piece { len: take, ..p.clone() });
            p.off += take;
            p.len -= take;
            room -= take;
            if room == 0 {
                slices.push(std::mem::take(&mut cur));
                room = kc;
            }
        }
    }
    if !cur.is_empty() {
        slices.push(cur);
    }
    slices
}

/// The indirect form of `g.a`, if it has one and reading it in place pays: pieces long enough
/// (on average at least 8 elements) that the per-piece setup does not dominate.
pub fn indirect_form(k: &Kernel, g: &Gemm) -> Option<IndirectA> {
    if g.k < 1 || g.batch < 1 || g.acc_dtype != DType::F32 {
        return None;
    }
    let mut leaves = vec![];
    let mut conds = vec![];
    // The operand's indices simplified under the selects around them: a rolled image's
    // wrapped rows read plain offsets in the branches where they are taken.
    let ranges: crate::lower::simplify::Ranges = [(g.b_var, g.batch), (g.i_var, g.m), (g.k_var, g.k)].into_iter().collect();
    let a = crate::lower::simplify::simplify_expr(g.a.clone(), &ranges);
    let tree = leaves_of(k, g, &a, &mut leaves, &mut conds)?;
    let batched = uses(&tree, g.b_var)
        || leaves.iter().any(|l| {
            uses(&l.koff, g.b_var) || l.atoms.iter().any(|(_, kp, _)| uses(kp, g.b_var))
        });
    let variants = if batched { g.batch } else { 1 };
    if variants > 256 || variants.saturating_mul(g.k) > 1 << 20 {
        return None;
    }
    let segs: Vec<Vec<Piece>> = (0..variants)
        .map(|b| segments(g, &tree, &leaves, b))
        .collect::<Option<_>>()?;
    let count: usize = segs.iter().map(|s| s.len()).sum();
    let total = variants * g.k;
    if (count as i64) * 8 > total {
        return None;
    }
    let typical = segs.iter().flatten().map(|p| p.len).max().unwrap_or(1);
    let kc = slice_depth(typical, g.k);
    let slices = segs.iter().map(|s| slice(s, kc)).collect();
    Some(IndirectA {
        leaves,
        batched,
        slices,
        kc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slicing_keeps_order_and_lengths() {
        let segs = vec![
            Piece { len: 100, leaf: 0, off: 0, atoms: vec![] },
            Piece { len: 30, leaf: 1, off: 500, atoms: vec![3] },
        ];
        let s = slice(&segs, 64);
        let lens: Vec<Vec<i64>> = s.iter().map(|x| x.iter().map(|p| p.len).collect()).collect();
        assert_eq!(lens, vec![vec![64], vec![36, 28], vec![2]]);
        assert_eq!(s[1][0].off, 64);
        assert_eq!(s[2][0].off, 528);
    }

    #[test]
    fn slice_depths() {
        assert_eq!(slice_depth(64, 576), 256);
        assert_eq!(slice_depth(3, 147), 147);
        assert_eq!(slice_depth(256, 2304), 256);
        assert_eq!(slice_depth(512, 4608), 256);
        assert_eq!(slice_depth(768, 768), 256);
        assert_eq!(slice_depth(640, 1280), 214);
        assert_eq!(slice_depth(192, 1728), 192);
    }
}
