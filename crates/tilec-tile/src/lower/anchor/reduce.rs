//! Reductions (reduce ops, arg-max/min) and cumulative scans.

use tilec_ir::op::{ReduceKind, ReduceOp, ScanKind};
use tilec_ir::{DType, NodeId, Op, ValueId};

use super::common::{acc_dtype, accumulate, int_bounds, neg_inf, outer_space, output_nest, val};
use super::super::{bin, compute_dtype, lit, lit_i, Lowerer, R};
use crate::ir::*;

pub(super) fn reduce(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Reduce(ReduceOp::Reduce { kind, axes, keepdims }) = op else {
        return l.unsupported(n, "not a reduction");
    };
    let (kind, keepdims) = (*kind, *keepdims);
    let node = l.node(n);
    let (x, out) = (node.inputs[0], node.outputs[0]);
    let xs = l.shape(x);
    let d = l.dtype(x);
    let ad = acc_dtype(d);
    let float = d.is_float();
    let count: i64 = axes.iter().map(|&a| xs[a]).product();
    let row: Vec<(usize, i64)> = axes.iter().map(|&a| (a, xs[a])).collect();
    let (loops, base) = outer_space(l, &xs, axes);
    let oidx: Vec<Expr> = if keepdims {
        base.clone()
    } else {
        base.iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, e)| e.clone())
            .collect()
    };
    let m = l.begin_block();
    let mut body = Vec::new();
    // Real-valued results of integer inputs are computed in f64 and truncated.
    let via_f64 = !float
        && matches!(
            kind,
            ReduceKind::L2 | ReduceKind::LogSum | ReduceKind::LogSumExp
        );
    let (cd, xin): (DType, Box<dyn Fn(&mut Lowerer, &[Expr]) -> R<Expr>>) = if via_f64 {
        (
            DType::F64,
            Box::new(move |l: &mut Lowerer, i: &[Expr]| {
                Ok(Expr::cast(DType::F64, l.value_at(x, i)?))
            }),
        )
    } else if float {
        (
            ad,
            Box::new(move |l: &mut Lowerer, i: &[Expr]| val(l, x, i)),
        )
    } else {
        (
            ad,
            Box::new(move |l: &mut Lowerer, i: &[Expr]| Ok(Expr::cast(ad, l.value_at(x, i)?))),
        )
    };
    let zero = lit(0.0, cd);
    let result: Expr = match kind {
        ReduceKind::Sum
        | ReduceKind::Mean
        | ReduceKind::L1
        | ReduceKind::L2
        | ReduceKind::SumSquare
        | ReduceKind::LogSum => {
            let (st, acc) =
                accumulate(l, &row, &base, vec![(cd, zero.clone())], &mut |l, i, a| {
                    let v = xin(l, i)?;
                    let t = match kind {
                        ReduceKind::L1 => Expr::un(UnOp::Abs, v),
                        ReduceKind::L2 | ReduceKind::SumSquare => {
                            let v = l.reuse(v, cd);
                            bin(BinOp::Mul, v.clone(), v)
                        }
                        _ => v,
                    };
                    Ok(vec![bin(BinOp::Add, a[0].clone(), t)])
                })?;
            body.extend(st);
            let s = acc[0].clone();
            match kind {
                ReduceKind::Mean if float => bin(BinOp::Div, s, lit(count as f64, cd)),
                ReduceKind::Mean => {
                    if count == 0 {
                        lit(0.0, cd)
                    } else {
                        bin(BinOp::Div, s, lit_i(count, cd))
                    }
                }
                ReduceKind::L2 => Expr::un(UnOp::Sqrt, s),
                ReduceKind::LogSum => Expr::un(UnOp::Log, s),
                _ => s,
            }
        }
        ReduceKind::Prod => {
            let (st, acc) =
                accumulate(l, &row, &base, vec![(cd, lit(1.0, cd))], &mut |l, i, a| {
                    let v = xin(l, i)?;
                    Ok(vec![bin(BinOp::Mul, a[0].clone(), v)])
                })?;
            body.extend(st);
            acc[0].clone()
        }
        ReduceKind::Max | ReduceKind::Min => {
            let max = kind == ReduceKind::Max;
            let init = if float {
                lit(
                    if max {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    },
                    cd,
                )
            } else {
                let (lo, hi) = int_bounds(d);
                lit_i(if max { lo } else { hi }, cd)
            };
            let op = if max { BinOp::Max } else { BinOp::Min };
            let (st, acc) = accumulate(l, &row, &base, vec![(cd, init)], &mut |l, i, a| {
                let v = xin(l, i)?;
                Ok(vec![bin(op, a[0].clone(), v)])
            })?;
            body.extend(st);
            acc[0].clone()
        }
        ReduceKind::LogSumExp => {
            let (st, acc) = accumulate(l, &row, &base, vec![(cd, neg_inf(cd))], &mut |l, i, a| {
                let v = xin(l, i)?;
                Ok(vec![bin(BinOp::Max, a[0].clone(), v)])
            })?;
            body.extend(st);
            let mx = acc[0].clone();
            let finite = bin(
                BinOp::And,
                Expr::un(UnOp::Not, Expr::un(UnOp::IsNan, mx.clone())),
                Expr::un(UnOp::Not, Expr::un(UnOp::IsInf, mx.clone())),
            );
            let mx2 = mx.clone();
            let (st, acc) =
                accumulate(l, &row, &base, vec![(cd, zero.clone())], &mut |l, i, a| {
                    let v = xin(l, i)?;
                    Ok(vec![bin(
                        BinOp::Add,
                        a[0].clone(),
                        Expr::un(UnOp::Exp, bin(BinOp::Sub, v, mx2.clone())),
                    )])
                })?;
            body.extend(st);
            Expr::select(
                finite,
                bin(BinOp::Add, Expr::un(UnOp::Log, acc[0].clone()), mx.clone()),
                mx,
            )
        }
    };
    let od = l.dtype(out);
    let result = if via_f64 {
        Expr::cast(
            od,
            Expr::select(
                Expr::un(UnOp::IsNan, result.clone()),
                lit(0.0, DType::F64),
                Expr::un(UnOp::Trunc, result),
            ),
        )
    } else if compute_dtype(od) != cd || od != cd {
        Expr::cast(od, result)
    } else {
        result
    };
    body.extend(l.take_lets());
    let epi = l.epilogue(out, &oidx, result)?;
    body.extend(epi);
    let lets = l.end_block(m);
    let mut inner = lets;
    inner.extend(body);
    Ok(Lowerer::nest(&loops, inner))
}

/// Whether candidate `c` replaces the best `b` (NaN counts as the extreme, as numpy).
fn arg_better(c: Expr, b: Expr, float: bool, max: bool, last: bool) -> Expr {
    let cmp = match (max, last) {
        (true, false) => BinOp::Gt,
        (true, true) => BinOp::Ge,
        (false, false) => BinOp::Lt,
        (false, true) => BinOp::Le,
    };
    let plain = bin(cmp, c.clone(), b.clone());
    if !float {
        return plain;
    }
    let (cn, bn) = (Expr::un(UnOp::IsNan, c), Expr::un(UnOp::IsNan, b));
    let not = |e: Expr| Expr::un(UnOp::Not, e);
    let nan_case = if last {
        cn.clone()
    } else {
        bin(BinOp::And, cn.clone(), not(bn.clone()))
    };
    bin(
        BinOp::Or,
        nan_case,
        bin(BinOp::And, bin(BinOp::And, not(cn), not(bn)), plain),
    )
}

/// The pass of an arg-reduction of `x` along `axis` (extent `ext`) from index `base`: the
/// best value so far (starting at the first element) and its position.
pub(super) fn arg_pass(
    l: &mut Lowerer,
    x: ValueId,
    axis: usize,
    ext: i64,
    base: &[Expr],
    max: bool,
    last: bool,
) -> R<(Vec<Stmt>, Vec<Expr>)> {
    let d = l.dtype(x);
    let cd = acc_dtype(d);
    let float = d.is_float();
    let first = {
        let e = l.value_at(x, base)?;
        if float {
            l.up(e, d)
        } else {
            Expr::cast(cd, e)
        }
    };
    accumulate(
        l,
        &[(axis, ext)],
        base,
        vec![(cd, first), (DType::I64, lit_i(0, DType::I64))],
        &mut |l, i, a| {
            let v = l.value_at(x, i)?;
            let v = if float { l.up(v, d) } else { Expr::cast(cd, v) };
            let v = l.reuse(v, cd);
            let better = arg_better(v.clone(), a[0].clone(), float, max, last);
            let better = l.reuse(better, DType::Bool);
            let k = Expr::cast(DType::I64, i[axis].clone());
            Ok(vec![
                Expr::select(better.clone(), v, a[0].clone()),
                Expr::select(better, k, a[1].clone()),
            ])
        },
    )
}

pub(super) fn arg_reduce(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let (axis, keepdims, last, max) = match *op {
        Op::Reduce(ReduceOp::ArgMax { axis, keepdims, select_last_index }) => (axis, keepdims, select_last_index, true),
        Op::Reduce(ReduceOp::ArgMin { axis, keepdims, select_last_index }) => (axis, keepdims, select_last_index, false),
        _ => return l.unsupported(n, "not an arg-reduction"),
    };
    let node = l.node(n);
    let (x, out) = (node.inputs[0], node.outputs[0]);
    let xs = l.shape(x);
    if xs[axis] == 0 {
        return l.unsupported(n, "arg-reduction over an empty axis");
    }
    let (loops, base) = outer_space(l, &xs, &[axis]);
    let oidx: Vec<Expr> = if keepdims {
        base.clone()
    } else {
        base.iter()
            .enumerate()
            .filter(|(i, _)| *i != axis)
            .map(|(_, e)| e.clone())
            .collect()
    };
    let m = l.begin_block();
    let (st, acc) = arg_pass(l, x, axis, xs[axis], &base, max, last)?;
    let mut body = st;
    body.extend(l.take_lets());
    body.extend(l.epilogue(out, &oidx, acc[1].clone())?);
    let mut inner = l.end_block(m);
    inner.extend(body);
    Ok(Lowerer::nest(&loops, inner))
}

pub(super) fn scan(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Reduce(ReduceOp::Scan { kind, axis, exclusive, reverse }) = *op else {
        return l.unsupported(n, "not a scan");
    };
    let node = l.node(n);
    let (x, out) = (node.inputs[0], node.outputs[0]);
    let xs = l.shape(x);
    let d = l.dtype(x);
    let cd = acc_dtype(d);
    output_nest(l, &xs, &mut |l, idx| {
        let neutral = if kind == ScanKind::Sum {
            lit(0.0, cd)
        } else {
            lit(1.0, cd)
        };
        let i = idx[axis].clone();
        let (st, acc) = accumulate(
            l,
            &[(axis, xs[axis])],
            idx,
            vec![(cd, neutral.clone())],
            &mut |l, ri, a| {
                let k = ri[axis].clone();
                let inc = match (exclusive, reverse) {
                    (false, false) => bin(BinOp::Le, k, i.clone()),
                    (true, false) => bin(BinOp::Lt, k, i.clone()),
                    (false, true) => bin(BinOp::Ge, k, i.clone()),
                    (true, true) => bin(BinOp::Gt, k, i.clone()),
                };
                let v = l.value_at(x, ri)?;
                let v = if d.is_float() {
                    l.up(v, d)
                } else {
                    Expr::cast(cd, v)
                };
                let op = if kind == ScanKind::Sum {
                    BinOp::Add
                } else {
                    BinOp::Mul
                };
                Ok(vec![Expr::select(
                    inc,
                    bin(op, a[0].clone(), v),
                    a[0].clone(),
                )])
            },
        )?;
        let mut body = st;
        body.extend(l.take_lets());
        let r = if cd != d {
            Expr::cast(d, acc[0].clone())
        } else {
            acc[0].clone()
        };
        body.extend(l.epilogue(out, idx, r)?);
        Ok(body)
    })
}
