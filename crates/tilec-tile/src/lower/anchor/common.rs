//! Helpers shared by the anchor lowerings: accumulator loops, row and output nests.

use tilec_ir::{DType, ValueId};

use super::super::{compute_dtype, lit, Lowerer, R};
use crate::ir::*;

pub(super) fn neg_inf(d: DType) -> Expr {
    lit(f64::NEG_INFINITY, d)
}

/// The accumulator dtype of a reduction over `d`.
pub(super) fn acc_dtype(d: DType) -> DType {
    if d.is_float() {
        compute_dtype(d)
    } else if d == DType::U64 {
        DType::U64
    } else {
        DType::I64
    }
}

pub(super) fn int_bounds(d: DType) -> (i64, i64) {
    match d {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::I64 => (i64::MIN, i64::MAX),
        DType::U8 => (0, u8::MAX as i64),
        DType::U16 => (0, u16::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        DType::U64 => (0, i64::MAX),
        _ => (0, 1),
    }
}

/// A reduction over a row: accumulators (dtype, initial value) and an update computing the
/// new values from the element index and the accumulators. Returns the statements (lets of
/// the accumulators, then the loop nest) and the accumulator variables.
pub(super) fn accumulate(
    l: &mut Lowerer,
    row: &[(usize, i64)],
    base: &[Expr],
    accs: Vec<(DType, Expr)>,
    update: &mut dyn FnMut(&mut Lowerer, &[Expr], &[Expr]) -> R<Vec<Expr>>,
) -> R<(Vec<Stmt>, Vec<Expr>)> {
    // The initial values may read temporaries defined just before (the row's first element,
    // shared with other uses): those come first.
    let mut stmts = l.take_lets();
    let mut vars = Vec::new();
    for (d, init) in accs {
        let a = l.elem_var("acc", d, true);
        stmts.push(Stmt::Let {
            var: a,
            value: init,
        });
        vars.push(a);
    }
    let acc_exprs: Vec<Expr> = vars.iter().map(|&v| Expr::Var(v)).collect();
    let (loops, idx) = row_index(l, row, base, "r");
    let m = l.begin_block();
    let new = update(l, &idx, &acc_exprs);
    let mut inner = l.end_block(m);
    let new = new?;
    if new.len() == 1 {
        inner.push(Stmt::Assign {
            var: vars[0],
            value: new.into_iter().next().unwrap_or(Expr::Int(0)),
        });
    } else {
        let mut temps = Vec::new();
        for (k, e) in new.into_iter().enumerate() {
            let d = l.var_dtype(vars[k]);
            let t = l.elem_var("t", d, false);
            inner.push(Stmt::Let { var: t, value: e });
            temps.push(t);
        }
        for (k, t) in temps.into_iter().enumerate() {
            inner.push(Stmt::Assign {
                var: vars[k],
                value: Expr::Var(t),
            });
        }
    }
    stmts.extend(Lowerer::nest(&loops, inner));
    Ok((stmts, acc_exprs))
}

/// A loop over the row elements, calling `f` with the full index; `f` returns the statements
/// of one element.
pub(super) fn row_loop(
    l: &mut Lowerer,
    row: &[(usize, i64)],
    base: &[Expr],
    f: &mut dyn FnMut(&mut Lowerer, &[Expr]) -> R<Vec<Stmt>>,
) -> R<Vec<Stmt>> {
    let (loops, idx) = row_index(l, row, base, "i");
    let m = l.begin_block();
    let body = f(l, &idx);
    let mut inner = l.end_block(m);
    inner.extend(body?);
    Ok(Lowerer::nest(&loops, inner))
}

/// The outer loops of a row kernel over `shape`: every dimension not in `row_dims`. Returns
/// the loops and the index with the row dimensions set to 0 (placeholders).
pub(super) fn outer_space(
    l: &mut Lowerer,
    shape: &[i64],
    row_dims: &[usize],
) -> (Vec<(VarId, i64)>, Vec<Expr>) {
    let mut loops = Vec::new();
    let mut idx = Vec::new();
    for (d, &n) in shape.iter().enumerate() {
        if row_dims.contains(&d) || n == 1 {
            idx.push(Expr::Int(0));
        } else {
            let v = l.loop_var("i", n);
            loops.push((v, n));
            idx.push(Expr::Var(v));
        }
    }
    (loops, idx)
}

/// Output loops plus a body built for each output index.
pub(super) fn output_nest(
    l: &mut Lowerer,
    shape: &[i64],
    f: &mut dyn FnMut(&mut Lowerer, &[Expr]) -> R<Vec<Stmt>>,
) -> R<Vec<Stmt>> {
    let (loops, idx) = l.index_space(shape, "i");
    let m = l.begin_block();
    let body = f(l, &idx);
    let mut inner = l.end_block(m);
    inner.extend(body?);
    Ok(Lowerer::nest(&loops, inner))
}

/// `x` (dtype `d`) up-converted, at index `idx`.
pub(super) fn val(l: &mut Lowerer, x: ValueId, idx: &[Expr]) -> R<Expr> {
    let e = l.value_at(x, idx)?;
    Ok(l.up(e, l.dtype(x)))
}

/// `x` rounded to the precision of dtype `d`.
pub(super) fn round_to(d: DType, x: f64) -> f64 {
    match tilec_ir::Tensor::from_f64s(d, vec![1], &[x]) {
        Ok(t) => t.to_f64_vec()[0],
        Err(_) => x,
    }
}

/// Loops over the row's dimensions (named `name`; a dimension of extent 1 gets none) and the
/// element index they give, `base` elsewhere.
fn row_index(l: &mut Lowerer, row: &[(usize, i64)], base: &[Expr], name: &'static str) -> (Vec<(VarId, i64)>, Vec<Expr>) {
    let mut loops = Vec::new();
    let mut idx = base.to_vec();
    for &(dim, ext) in row {
        if ext == 1 {
            idx[dim] = Expr::Int(0);
        } else {
            let v = l.loop_var(name, ext);
            loops.push((v, ext));
            idx[dim] = Expr::Var(v);
        }
    }
    (loops, idx)
}
