//! Masks computed elementwise, inspected row by row without materializing them.
//!
//! Exports build attention masks from position iotas: small operands (`[B, 1, S, 1]`,
//! `[B, 1, 1, T]`) compared and combined with broadcasting into `[B, 1, S, T]`. Evaluating
//! such a mask whole with the reference kernels costs time and memory in proportion to
//! `B * S * T` at every compile (a quarter of a second for `[8, 1, 512, 512]`). A [`RowMask`]
//! keeps the elementwise top of the mask as an expression over its operands (the *leaves*,
//! evaluated once at their own size) and yields its values one row of the last axis at a
//! time; a leading axis along which every leaf is the same is visited once, so a batch of
//! identical masks costs one.
//!
//! Only operations whose value `f64` reproduces exactly are taken: comparisons, `and`, `or`,
//! `xor`, `not` and `where`, over leaves of any element type whose values `f64` holds
//! exactly (integers up to 2^53). Anything else makes [`RowMask::of`] decline, and the
//! caller evaluates the mask as before.

use super::pattern::Matcher;
use std::rc::Rc;
use tilec_ir::op::{BinaryOp, UnaryOp};
use tilec_ir::{Op, ValueId};

/// Largest integer `f64` holds exactly.
const EXACT_INT: f64 = 9_007_199_254_740_992.0;

/// Deepest elementwise tree taken (deeper masks are evaluated whole).
const MAX_DEPTH: usize = 64;

enum Expr {
    /// An operand's values (row-major in its own shape) and, per axis of the mask, its
    /// stride (0 where it broadcasts).
    Leaf { vals: Rc<Vec<f64>>, strides: Vec<usize> },
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Where(Box<Expr>, Box<Expr>, Box<Expr>),
}

/// An elementwise mask of fixed shape, yielded row by row (see the module documentation).
pub struct RowMask {
    shape: Vec<usize>,
    root: Expr,
}

impl RowMask {
    /// The mask `v` when it is computed elementwise (see the module documentation) from
    /// leaves that are constants or computed from constants, with at most `max_elems`
    /// elements in the mask and in every value evaluated on the way.
    pub fn of(m: &Matcher, v: ValueId, max_elems: usize) -> Option<RowMask> {
        let shape = m.g.value(v).ty.fixed_shape()?;
        if shape.is_empty() || shape.iter().product::<usize>() > max_elems || !elementwise(m, v) {
            return None;
        }
        let root = build(m, v, &shape, max_elems, 0)?;
        Some(RowMask { shape, root })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether `f(row, values)` holds for every row of the last axis, with `row` the row's
    /// index among all rows (row-major over the leading axes); stops at the first that does
    /// not. A leading axis (before the last two) along which every leaf is the same is
    /// visited at index 0 only: its other rows repeat those.
    pub fn all_rows(&self, mut f: impl FnMut(usize, &[f64]) -> bool) -> bool {
        let r = self.shape.len();
        let width = self.shape[r - 1];
        // Per axis before the last: how many indices to visit.
        let visit: Vec<usize> =
            (0..r - 1).map(|d| if d + 2 < r && uniform(&self.root, d, &self.shape) { 1 } else { self.shape[d] }).collect();
        if visit.contains(&0) || width == 0 {
            return true;
        }
        let mut idx = vec![0usize; r - 1];
        let mut out = vec![0.0; width];
        loop {
            eval(&self.root, &idx, &mut out);
            let row = idx.iter().zip(&self.shape).fold(0, |acc, (&i, &n)| acc * n + i);
            if !f(row, &out) {
                return false;
            }
            // Next index, last axis fastest.
            let mut d = r - 1;
            loop {
                if d == 0 {
                    return true;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < visit[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
    }
}

/// Whether `v`'s node is one [`RowMask`] evaluates itself.
fn elementwise(m: &Matcher, v: ValueId) -> bool {
    m.node(v).is_some_and(|n| {
        n.outputs.len() == 1
            && match &n.op {
                Op::Binary(b) => b.is_comparison() || b.is_logical(),
                Op::Unary(UnaryOp::Not) => true,
                Op::Where => true,
                _ => false,
            }
    })
}

fn build(m: &Matcher, v: ValueId, shape: &[usize], max_elems: usize, depth: usize) -> Option<Expr> {
    if depth > MAX_DEPTH {
        return None;
    }
    if !elementwise(m, v) {
        return leaf(m, v, shape, max_elems, depth);
    }
    let n = m.node(v)?;
    let arg = |i: usize| -> Option<Box<Expr>> { Some(Box::new(build(m, *n.inputs.get(i)?, shape, max_elems, depth + 1)?)) };
    Some(match &n.op {
        Op::Binary(b) if n.inputs.len() == 2 => Expr::Binary(b.clone(), arg(0)?, arg(1)?),
        Op::Unary(UnaryOp::Not) if n.inputs.len() == 1 => Expr::Not(arg(0)?),
        Op::Where if n.inputs.len() == 3 => Expr::Where(arg(0)?, arg(1)?, arg(2)?),
        _ => return None,
    })
}

/// An operand evaluated at its own size, with its strides against the mask's axes.
fn leaf(m: &Matcher, v: ValueId, shape: &[usize], max_elems: usize, depth: usize) -> Option<Expr> {
    let t = m.const_big(v, max_elems, depth)?;
    let own = t.shape();
    if own.len() > shape.len() {
        return None;
    }
    let vals: Vec<f64> = if t.dtype().is_float() || t.dtype().is_bool() {
        t.to_f64_vec()
    } else {
        let ints = t.to_i64_vec();
        if ints.iter().any(|&x| (x as f64).abs() > EXACT_INT) || (t.dtype() == tilec_ir::DType::U64 && ints.iter().any(|&x| x < 0)) {
            return None;
        }
        ints.into_iter().map(|x| x as f64).collect()
    };
    let own_strides = tilec_ir::tensor::strides(own);
    let lead = shape.len() - own.len();
    let mut strides = vec![0; shape.len()];
    for (i, (&d, &s)) in own.iter().zip(&own_strides).enumerate() {
        match d {
            1 => {}
            _ if d == shape[lead + i] => strides[lead + i] = s,
            _ => return None,
        }
    }
    Some(Expr::Leaf { vals: Rc::new(vals), strides })
}

/// Whether every leaf is the same at every index of axis `d`.
fn uniform(e: &Expr, d: usize, shape: &[usize]) -> bool {
    match e {
        Expr::Leaf { vals, strides } => {
            let s = strides[d];
            s == 0
                || (0..vals.len()).all(|p| {
                    let i = (p / s) % shape[d];
                    vals[p].to_bits() == vals[p - i * s].to_bits()
                })
        }
        Expr::Binary(_, a, b) => uniform(a, d, shape) && uniform(b, d, shape),
        Expr::Not(a) => uniform(a, d, shape),
        Expr::Where(c, a, b) => uniform(c, d, shape) && uniform(a, d, shape) && uniform(b, d, shape),
    }
}

/// Writes row `idx` (indices of every axis but the last) of `e` into `out`.
fn eval(e: &Expr, idx: &[usize], out: &mut [f64]) {
    let truth = |b: bool| if b { 1.0 } else { 0.0 };
    match e {
        Expr::Leaf { vals, strides } => {
            let base: usize = idx.iter().zip(strides).map(|(i, s)| i * s).sum();
            let step = strides[strides.len() - 1];
            for (j, o) in out.iter_mut().enumerate() {
                *o = vals[base + j * step];
            }
        }
        Expr::Binary(op, a, b) => {
            let mut rhs = vec![0.0; out.len()];
            eval(a, idx, out);
            eval(b, idx, &mut rhs);
            for (x, &y) in out.iter_mut().zip(&rhs) {
                *x = match op {
                    BinaryOp::Equal => truth(*x == y),
                    BinaryOp::Less => truth(*x < y),
                    BinaryOp::LessOrEqual => truth(*x <= y),
                    BinaryOp::Greater => truth(*x > y),
                    BinaryOp::GreaterOrEqual => truth(*x >= y),
                    BinaryOp::And => truth(*x != 0.0 && y != 0.0),
                    BinaryOp::Or => truth(*x != 0.0 || y != 0.0),
                    BinaryOp::Xor => truth((*x != 0.0) != (y != 0.0)),
                    // `elementwise` takes comparisons and logic only.
                    _ => f64::NAN,
                };
            }
        }
        Expr::Not(a) => {
            eval(a, idx, out);
            for x in out.iter_mut() {
                *x = truth(*x == 0.0);
            }
        }
        Expr::Where(c, a, b) => {
            let mut yes = vec![0.0; out.len()];
            let mut no = vec![0.0; out.len()];
            eval(c, idx, out);
            eval(a, idx, &mut yes);
            eval(b, idx, &mut no);
            for ((x, y), n) in out.iter_mut().zip(yes).zip(no) {
                *x = if *x != 0.0 { y } else { n };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recognize::pattern::with_matcher;
    use tilec_ir::op::LayoutOp;
    use tilec_ir::{DType, Dim, Graph, Tensor};

    fn reshape(g: &mut Graph, x: ValueId, s: &[usize]) -> ValueId {
        g.add(Op::Layout(LayoutOp::Reshape { shape: s.iter().map(|&d| Dim::Fixed(d)).collect() }), &[x]).unwrap()
    }

    /// Every row a [`RowMask`] visits equals the reference interpreter's whole mask there;
    /// returns the rows visited.
    fn rows_match(g: &mut Graph, mask: ValueId) -> usize {
        g.set_outputs(vec![mask]);
        let whole = tilec_ref::run(g, vec![]).unwrap()[0].to_f64_vec();
        with_matcher(g, |m| {
            let rows = RowMask::of(m, mask, 1 << 20).expect("an elementwise mask");
            let width = *rows.shape().last().unwrap();
            let mut seen = 0;
            assert!(rows.all_rows(|r, xs| {
                seen += 1;
                let want = &whole[r * width..(r + 1) * width];
                assert_eq!(xs, want, "row {r}");
                true
            }));
            seen
        })
    }

    #[test]
    fn rows_equal_the_interpreter() {
        let (b, s) = (3, 5);
        for same_batches in [true, false] {
            let mut g = Graph::new("mask");
            // Position ids per batch; the last batch's reversed unless `same_batches`.
            let mut pos: Vec<i64> = (0..b * s).map(|x| (x % s) as i64 + 100).collect();
            if !same_batches {
                pos[(b - 1) * s..].reverse();
            }
            let p = g.add_const("pos", Tensor::from_i64s(DType::I64, vec![b, s], &pos).unwrap());
            let pi = reshape(&mut g, p, &[b, 1, s, 1]);
            let pj = reshape(&mut g, p, &[b, 1, 1, s]);
            let le = g.add(Op::Binary(BinaryOp::LessOrEqual), &[pj, pi]).unwrap();
            let ne = g.add(Op::Binary(BinaryOp::Equal), &[pj, pi]).unwrap();
            let not = g.add(Op::Unary(UnaryOp::Not), &[ne]).unwrap();
            let x = g.add(Op::Binary(BinaryOp::Xor), &[le, not]).unwrap();
            let gt = g.add(Op::Binary(BinaryOp::Greater), &[pj, pi]).unwrap();
            let keep = g.add(Op::Binary(BinaryOp::Or), &[x, gt]).unwrap();
            let zero = g.add_const("z", Tensor::scalar(0.5f32));
            let fill = g.add_const("f", Tensor::from_vec(vec![s], (0..s).map(|j| -(j as f32)).collect()).unwrap());
            let m = g.add(Op::Where, &[keep, zero, fill]).unwrap();
            let visited = rows_match(&mut g, m);
            // Identical batches are visited once.
            assert_eq!(visited, if same_batches { s } else { b * s });
        }
    }

    #[test]
    fn declines_what_it_does_not_evaluate() {
        let mut g = Graph::new("mask");
        let p = g.add_const("p", Tensor::from_vec(vec![2, 3], vec![1i64, 2, 3, 4, 5, 6]).unwrap());
        let q = g.add_const("q", Tensor::from_vec(vec![3], vec![1i64, 1 << 60, 3]).unwrap());
        let sum = g.add(Op::Binary(BinaryOp::Add), &[p, q]).unwrap();
        let big = g.add(Op::Binary(BinaryOp::Less), &[p, q]).unwrap();
        let small = g.add(Op::Binary(BinaryOp::Less), &[p, p]).unwrap();
        g.set_outputs(vec![sum, big, small]);
        with_matcher(&g, |m| {
            assert!(RowMask::of(m, sum, 1 << 20).is_none(), "arithmetic");
            assert!(RowMask::of(m, big, 1 << 20).is_none(), "an integer f64 does not hold");
            assert!(RowMask::of(m, small, 5).is_none(), "more elements than allowed");
            assert!(RowMask::of(m, small, 6).is_some());
        });
    }
}
