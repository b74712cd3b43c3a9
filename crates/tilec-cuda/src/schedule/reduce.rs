//! Reductions in row loops: which accumulators a loop reduces, with which operator, and each
//! operator's identity (the start of a thread's partial before the block reduction).

use std::collections::HashSet;

use tilec_ir::DType;
use tilec_tile::*;

use super::*;
use crate::error::Result;

/// The identity of a reduction operator for a value type, as a literal.
pub(super) fn identity(op: BinOp, ty: Ty) -> Option<Expr> {
    let d = match ty {
        Ty::Elem(d) => d,
        Ty::Index => DType::I64,
    };
    let lit = |x: f64| {
        if d.is_float() {
            Some(Expr::Lit(Lit::Float(x, d)))
        } else if d == DType::Bool {
            Some(Expr::Lit(Lit::Bool(x != 0.0)))
        } else if ty == Ty::Index {
            Some(Expr::Int(x as i64))
        } else if d.is_signed_int() {
            Some(Expr::Lit(Lit::Int(x as i64, d)))
        } else {
            Some(Expr::Lit(Lit::UInt(x as u64, d)))
        }
    };
    let int_bounds = |max: bool| -> Option<Expr> {
        let bits = d.size_bytes() as u32 * 8;
        if d.is_signed_int() || ty == Ty::Index {
            let v = if max {
                (i64::MAX) >> (64 - bits)
            } else {
                (i64::MIN) >> (64 - bits)
            };
            if ty == Ty::Index {
                Some(Expr::Int(v))
            } else {
                Some(Expr::Lit(Lit::Int(v, d)))
            }
        } else {
            let v = if max { u64::MAX >> (64 - bits) } else { 0 };
            Some(Expr::Lit(Lit::UInt(v, d)))
        }
    };
    match op {
        BinOp::Add | BinOp::BitOr | BinOp::BitXor | BinOp::Or => lit(0.0),
        BinOp::Mul | BinOp::And => lit(1.0),
        BinOp::Max => {
            if d.is_float() {
                lit(f64::NEG_INFINITY)
            } else {
                int_bounds(false)
            }
        }
        BinOp::Min => {
            if d.is_float() {
                lit(f64::INFINITY)
            } else {
                int_bounds(true)
            }
        }
        BinOp::BitAnd => {
            if d.is_signed_int() || ty == Ty::Index {
                lit(-1.0)
            } else {
                int_bounds(true)
            }
        }
        _ => None,
    }
}

pub(super) fn lit_value(e: &Expr) -> Option<f64> {
    match e {
        Expr::Int(x) => Some(*x as f64),
        Expr::Lit(Lit::Float(x, _)) => Some(*x),
        Expr::Lit(Lit::Int(x, _)) => Some(*x as f64),
        Expr::Lit(Lit::UInt(x, _)) => Some(*x as f64),
        Expr::Lit(Lit::Bool(b)) => Some(*b as u8 as f64),
        Expr::Cast(_, a) => lit_value(a),
        _ => None,
    }
}

/// `acc = op(acc, e)` or `acc = op(e, acc)` with `e` not reading `acc`: returns `op`.
pub(super) fn reduction_op(acc: VarId, value: &Expr) -> Option<BinOp> {
    if let Expr::Binary(op, a, b) = value {
        let ok_op = matches!(
            op,
            BinOp::Add
                | BinOp::Mul
                | BinOp::Min
                | BinOp::Max
                | BinOp::And
                | BinOp::Or
                | BinOp::BitAnd
                | BinOp::BitOr
                | BinOp::BitXor
        );
        if !ok_op {
            return None;
        }
        let is_acc = |e: &Expr| *e == Expr::Var(acc);
        if (is_acc(a) && !b.uses_var(acc)) || (is_acc(b) && !a.uses_var(acc)) {
            return Some(*op);
        }
    }
    None
}

/// One reduction of a row loop.
pub(super) struct Reduction {
    pub(super) var: VarId,
    pub(super) op: BinOp,
}

/// Finds the reductions of an inner loop: every `Assign` in it must update a variable
/// declared outside with a reduction operator, and the accumulator must not be read otherwise.
pub(super) fn loop_reductions(k: &Kernel, l: &Loop) -> Result<Vec<Reduction>> {
    let mut declared_inside = HashSet::new();
    let mut assigns: Vec<(VarId, Expr)> = vec![];
    for s in &l.body {
        s.visit(&mut |s| match s {
            Stmt::Let { var, .. } => {
                declared_inside.insert(*var);
            }
            Stmt::For(x) => {
                declared_inside.insert(x.var);
            }
            Stmt::Assign { var, value } => assigns.push((*var, value.clone())),
            _ => {}
        });
    }
    let mut out: Vec<Reduction> = vec![];
    for (var, value) in &assigns {
        if declared_inside.contains(var) {
            continue;
        }
        let name = &k.var_info(*var).name;
        let op = reduction_op(*var, value).ok_or_else(|| {
            bad(
                k,
                format!(
                    "loop {}: {name} is updated in a way that is not a reduction",
                    k.var_info(l.var).name
                ),
            )
        })?;
        if let Some(r) = out.iter().find(|r| r.var == *var) {
            if r.op != op {
                return Err(bad(k, format!("{name} is reduced with two operators")));
            }
        } else {
            out.push(Reduction { var: *var, op });
        }
    }
    // An accumulator may be read only by its own update.
    for r in &out {
        let mut other_reads = 0;
        for s in &l.body {
            s.visit(&mut |s| {
                let mut count = |e: &Expr| {
                    if e.uses_var(r.var) {
                        other_reads += 1;
                    }
                };
                match s {
                    Stmt::Store { index, value, .. } => {
                        index.iter().for_each(&mut count);
                        count(value);
                    }
                    Stmt::Let { value, .. } => count(value),
                    Stmt::Assign { var, value } => {
                        if *var != r.var {
                            count(value)
                        }
                    }
                    Stmt::If { cond, .. } => count(cond),
                    _ => {}
                }
            });
        }
        if other_reads > 0 {
            return Err(bad(
                k,
                format!(
                    "accumulator {} is read inside its reduction loop",
                    k.var_info(r.var).name
                ),
            ));
        }
    }
    Ok(out)
}
