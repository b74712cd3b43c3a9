//! Anchors: the nodes that set a kernel's loop structure.
//!
//! * Row kernels (reductions, arg-reductions, softmax family, layer/RMS/instance/group/Lp/
//!   mean-variance norms, global pools): a loop nest over the dimensions outside the row,
//!   then passes over the row with accumulators; statistics feed the next pass, and the last
//!   pass (normalizations) or the accumulator itself (reductions) is the anchor's element.
//! * Direct kernels (pools, LRN, cumulative sums, einsum, integer matmul, small-K and
//!   transposed convolutions): a loop nest over the output with inner reduction loops.
//! * GEMM kernels (float matmul, convolution): one [`Stmt::Gemm`] whose operands are
//!   expressions (an implicit im2col for convolutions) and whose epilogue is the group's.
//! * Attention: per (batch, head, query row), a scores row in a local buffer, softmax, and
//!   the weighted sum of values into a local output row.

use tilec_ir::op::{
    window_geometry, LinalgOp, LossReduction, NnOp, NormOp, Padding, PoolKind, ReduceKind,
    ReduceOp, ScanKind, Window,
};
use tilec_ir::{DType, NodeId, Op, ValueId};

use super::{bin, compute_dtype, lit, lit_i, unravel, AttentionAlgo, ConvAlgo, Fail, Kind, Lowerer, R};
use crate::ir::*;

pub(crate) fn kind_of(op: &Op) -> Kind {
    match op {
        Op::Reduce(_) | Op::Linalg(_) => Kind::Anchor,
        Op::Norm(NormOp::BatchNorm { .. }) => Kind::Inline,
        Op::Norm(NormOp::NllLoss {
            reduction: LossReduction::None,
            ..
        }) => Kind::Inline,
        Op::Norm(_) => Kind::Anchor,
        Op::Nn(NnOp::Attention { .. }) => Kind::Anchor,
        _ => Kind::Inline,
    }
}

/// Outputs of an anchor that are computed inline (attention's present key/value).
pub(crate) fn inline_output(op: &Op, index: usize) -> bool {
    matches!(op, Op::Nn(NnOp::Attention { .. }) if index == 1 || index == 2)
}

/// Whether node `n` can be lowered (attributes included).
pub(crate) fn check(l: &Lowerer, n: NodeId) -> R<()> {
    let node = l.g.node(n);
    let bad = |why: String| Err(Fail::Unsupported(n, why));
    let name = node.op.name();
    match &node.op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Where
        | Op::Cast { .. }
        | Op::Quant(_)
        | Op::Layout(_)
        | Op::Source(_) => super::expr::check_inline(l, n),
        Op::Norm(NormOp::BatchNorm { .. }) => Ok(()),
        Op::Nn(NnOp::SwiGlu { .. }) => Ok(()),
        Op::Index(ix) => match ix {
            tilec_ir::op::IndexOp::Gather { .. }
            | tilec_ir::op::IndexOp::GatherElements { .. }
            | tilec_ir::op::IndexOp::GatherND { .. }
            | tilec_ir::op::IndexOp::OneHot { .. } => Ok(()),
            _ => bad(format!("{name} has data-dependent writes or shapes")),
        },
        Op::Reduce(r) => match r {
            ReduceOp::TopK { .. } => bad("top-k is not lowered".into()),
            _ => Ok(()),
        },
        Op::Norm(NormOp::NllLoss { .. }) => Ok(()),
        Op::Nn(NnOp::RotaryEmbedding { .. }) => Ok(()),
        Op::Norm(_) => {
            if !l.dtype(node.inputs[0]).is_float()
                && !matches!(node.op, Op::Norm(NormOp::Hardmax { .. }))
            {
                return bad("normalization of a non-float tensor".into());
            }
            Ok(())
        }
        Op::Linalg(lo) => match lo {
            LinalgOp::MatMul | LinalgOp::Einsum { .. } | LinalgOp::GlobalPool { .. } => Ok(()),
            LinalgOp::Conv { .. } | LinalgOp::ConvTranspose { .. } => {
                if l.dtype(node.inputs[0]).is_float() {
                    Ok(())
                } else {
                    bad("integer convolution".into())
                }
            }
            LinalgOp::Pool { kind, .. } => match kind {
                PoolKind::Lp { .. } | PoolKind::Avg { .. } | PoolKind::Max { .. } => Ok(()),
            },
            _ => bad(format!("{name} is not lowered")),
        },
        Op::Nn(NnOp::Attention { .. }) => {
            if !l.dtype(node.inputs[0]).is_float() {
                return bad("integer attention".into());
            }
            Ok(())
        }
        Op::Nn(_) => bad(format!("{name} is not lowered")),
        Op::Control(_) => bad("control flow is not lowered".into()),
    }
}

pub(crate) fn lower_anchor(l: &mut Lowerer, n: NodeId) -> R<Vec<Stmt>> {
    let op = l.g.node(n).op.clone();
    match &op {
        Op::Reduce(ReduceOp::Reduce {
            kind,
            axes,
            keepdims,
        }) => reduce(l, n, *kind, axes, *keepdims),
        Op::Reduce(ReduceOp::ArgMax {
            axis,
            keepdims,
            select_last_index,
        }) => arg_reduce(l, n, *axis, *keepdims, *select_last_index, true),
        Op::Reduce(ReduceOp::ArgMin {
            axis,
            keepdims,
            select_last_index,
        }) => arg_reduce(l, n, *axis, *keepdims, *select_last_index, false),
        Op::Reduce(ReduceOp::Scan {
            kind,
            axis,
            exclusive,
            reverse,
        }) => scan(l, n, *kind, *axis, *exclusive, *reverse),
        Op::Norm(no) => norm(l, n, no),
        Op::Linalg(LinalgOp::MatMul) => matmul(l, n),
        Op::Linalg(LinalgOp::Conv {
            window,
            group,
            channels_last,
        }) => conv(l, n, window, *group, *channels_last),
        Op::Linalg(LinalgOp::ConvTranspose {
            strides,
            dilations,
            pads,
            group,
            ..
        }) => conv_transpose(l, n, strides, dilations, pads, *group),
        Op::Linalg(LinalgOp::Pool {
            kind,
            window,
            ceil_mode,
            channels_last,
        }) => pool(l, n, kind, window, *ceil_mode, *channels_last),
        Op::Linalg(LinalgOp::GlobalPool {
            kind,
            channels_last,
        }) => global_pool(l, n, kind, *channels_last),
        Op::Linalg(LinalgOp::Einsum { inputs, output }) => einsum(l, n, inputs, output),
        Op::Nn(NnOp::Attention { .. }) => attention(l, n, &op),
        _ => l.unsupported(n, "not an anchor"),
    }
}

// ---------------------------------------------------------------- helpers

pub(crate) fn neg_inf(d: DType) -> Expr {
    lit(f64::NEG_INFINITY, d)
}

/// The accumulator dtype of a reduction over `d`.
fn acc_dtype(d: DType) -> DType {
    if d.is_float() {
        compute_dtype(d)
    } else if d == DType::U64 {
        DType::U64
    } else {
        DType::I64
    }
}

fn int_bounds(d: DType) -> (i64, i64) {
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
fn accumulate(
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
    let mut loops = Vec::new();
    let mut idx = base.to_vec();
    for &(dim, ext) in row {
        if ext == 1 {
            idx[dim] = Expr::Int(0);
        } else {
            let v = l.loop_var("r", ext);
            loops.push((v, ext));
            idx[dim] = Expr::Var(v);
        }
    }
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
            let d = match l.k.var_info(vars[k]).ty {
                Ty::Elem(d) => d,
                Ty::Index => DType::I64,
            };
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
fn row_loop(
    l: &mut Lowerer,
    row: &[(usize, i64)],
    base: &[Expr],
    f: &mut dyn FnMut(&mut Lowerer, &[Expr]) -> R<Vec<Stmt>>,
) -> R<Vec<Stmt>> {
    let mut loops = Vec::new();
    let mut idx = base.to_vec();
    for &(dim, ext) in row {
        if ext == 1 {
            idx[dim] = Expr::Int(0);
        } else {
            let v = l.loop_var("i", ext);
            loops.push((v, ext));
            idx[dim] = Expr::Var(v);
        }
    }
    let m = l.begin_block();
    let body = f(l, &idx);
    let mut inner = l.end_block(m);
    inner.extend(body?);
    Ok(Lowerer::nest(&loops, inner))
}

/// The outer loops of a row kernel over `shape`: every dimension not in `row_dims`. Returns
/// the loops and the index with the row dimensions set to 0 (placeholders).
fn outer_space(
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
fn output_nest(
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
pub(crate) fn val(l: &mut Lowerer, x: ValueId, idx: &[Expr]) -> R<Expr> {
    let e = l.value_at(x, idx)?;
    Ok(l.up(e, l.dtype(x)))
}

pub(crate) fn is_used(l: &Lowerer, v: ValueId) -> bool {
    l.outputs.contains(&v)
        || l.uses[v.index()]
            .by_node
            .iter()
            .any(|(c, _)| l.set.contains(c))
}

// ---------------------------------------------------------------- reductions

fn reduce(
    l: &mut Lowerer,
    n: NodeId,
    kind: ReduceKind,
    axes: &[usize],
    keepdims: bool,
) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
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

fn arg_reduce(
    l: &mut Lowerer,
    n: NodeId,
    axis: usize,
    keepdims: bool,
    last: bool,
    max: bool,
) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
    let (x, out) = (node.inputs[0], node.outputs[0]);
    let xs = l.shape(x);
    if xs[axis] == 0 {
        return l.unsupported(n, "arg-reduction over an empty axis");
    }
    let d = l.dtype(x);
    let cd = acc_dtype(d);
    let float = d.is_float();
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
    let first = {
        let e = l.value_at(x, &base)?;
        if float {
            l.up(e, d)
        } else {
            Expr::cast(cd, e)
        }
    };
    let (st, acc) = accumulate(
        l,
        &[(axis, xs[axis])],
        &base,
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
    )?;
    let mut body = st;
    body.extend(l.take_lets());
    body.extend(l.epilogue(out, &oidx, acc[1].clone())?);
    let mut inner = l.end_block(m);
    inner.extend(body);
    Ok(Lowerer::nest(&loops, inner))
}

fn scan(
    l: &mut Lowerer,
    n: NodeId,
    kind: ScanKind,
    axis: usize,
    exclusive: bool,
    reverse: bool,
) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
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

// ---------------------------------------------------------------- normalizations

/// Per-row statistics then an elementwise pass: the shape is `x`'s, `row` the reduced
/// dimensions (with extents), `map` takes a virtual index to `x`'s index.
struct RowNorm<'a> {
    shape: Vec<i64>,
    row: Vec<(usize, i64)>,
    map: &'a dyn Fn(&[Expr]) -> Vec<Expr>,
}

fn norm(l: &mut Lowerer, n: NodeId, no: &NormOp) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
    let x = node.inputs[0];
    let ins = node.inputs.clone();
    let outs = node.outputs.clone();
    let xs = l.shape(x);
    let r = xs.len();
    let d = l.dtype(x);
    let cd = compute_dtype(d);
    let y = outs[0];
    let ident = |i: &[Expr]| i.to_vec();
    match no {
        NormOp::Softmax { axis } | NormOp::LogSoftmax { axis } => {
            let log = matches!(no, NormOp::LogSoftmax { .. });
            let spec = RowNorm {
                shape: xs.clone(),
                row: vec![(*axis, xs[*axis])],
                map: &ident,
            };
            row_norm(
                l,
                &spec,
                &mut |l, base| {
                    let (s1, a1) = accumulate(
                        l,
                        &spec.row,
                        base,
                        vec![(cd, neg_inf(cd))],
                        &mut |l, i, a| {
                            let v = val(l, x, i)?;
                            Ok(vec![bin(BinOp::Max, a[0].clone(), v)])
                        },
                    )?;
                    let mx = a1[0].clone();
                    let m2 = mx.clone();
                    let (s2, a2) = accumulate(
                        l,
                        &spec.row,
                        base,
                        vec![(cd, lit(0.0, cd))],
                        &mut |l, i, a| {
                            let v = val(l, x, i)?;
                            Ok(vec![bin(
                                BinOp::Add,
                                a[0].clone(),
                                Expr::un(UnOp::Exp, bin(BinOp::Sub, v, m2.clone())),
                            )])
                        },
                    )?;
                    let mut st = s1;
                    st.extend(s2);
                    let s = a2[0].clone();
                    let stat = if log {
                        Expr::un(UnOp::Log, s)
                    } else {
                        Expr::un(UnOp::Recip, s)
                    };
                    let stat = l.hoist(stat, cd);
                    st.extend(l.take_lets());
                    Ok((st, vec![mx, stat]))
                },
                &mut |l, i, stats| {
                    let v = val(l, x, i)?;
                    let dlt = bin(BinOp::Sub, v, stats[0].clone());
                    let e = if log {
                        bin(BinOp::Sub, dlt, stats[1].clone())
                    } else {
                        bin(BinOp::Mul, Expr::un(UnOp::Exp, dlt), stats[1].clone())
                    };
                    Ok(vec![(y, i.to_vec(), l.down(e, d))])
                },
            )
        }
        NormOp::Hardmax { axis } => {
            let float = d.is_float();
            let ad = acc_dtype(d);
            let spec = RowNorm {
                shape: xs.clone(),
                row: vec![(*axis, xs[*axis])],
                map: &ident,
            };
            let a0 = *axis;
            row_norm(
                l,
                &spec,
                &mut |l, base| {
                    let first = {
                        let e = l.value_at(x, base)?;
                        if float {
                            l.up(e, d)
                        } else {
                            Expr::cast(ad, e)
                        }
                    };
                    let (st, acc) = accumulate(
                        l,
                        &spec.row,
                        base,
                        vec![(ad, first), (DType::I64, lit_i(0, DType::I64))],
                        &mut |l, i, a| {
                            let v = l.value_at(x, i)?;
                            let v = if float { l.up(v, d) } else { Expr::cast(ad, v) };
                            let v = l.reuse(v, ad);
                            let better = l.reuse(
                                arg_better(v.clone(), a[0].clone(), float, true, false),
                                DType::Bool,
                            );
                            Ok(vec![
                                Expr::select(better.clone(), v, a[0].clone()),
                                Expr::select(
                                    better,
                                    Expr::cast(DType::I64, i[a0].clone()),
                                    a[1].clone(),
                                ),
                            ])
                        },
                    )?;
                    Ok((st, vec![acc[1].clone()]))
                },
                &mut |_l, i, stats| {
                    let k = Expr::cast(DType::I64, i[a0].clone());
                    Ok(vec![(
                        y,
                        i.to_vec(),
                        Expr::select(
                            bin(BinOp::Eq, k, stats[0].clone()),
                            lit(1.0, d),
                            lit(0.0, d),
                        ),
                    )])
                },
            )
        }
        NormOp::LayerNorm {
            axis,
            epsilon,
            stash,
            has_bias,
        } => {
            let row: Vec<(usize, i64)> = (*axis..r).map(|a| (a, xs[a])).collect();
            let cnt: i64 = xs[*axis..].iter().product();
            let spec = RowNorm {
                shape: xs.clone(),
                row,
                map: &ident,
            };
            let (scale, bias) = (ins[1], if *has_bias { Some(ins[2]) } else { None });
            let (mean_out, inv_out) = (outs[1], outs[2]);
            let (want_mean, want_inv) = (is_used(l, mean_out), is_used(l, inv_out));
            let eps = *epsilon as f64;
            let stash = *stash;
            let axis = *axis;
            row_norm(
                l,
                &spec,
                &mut |l, base| {
                    let (mut st, mean) = mean_pass(l, &spec.row, base, x, cd, cnt)?;
                    let m2 = mean.clone();
                    let (s2, var) = accumulate(
                        l,
                        &spec.row,
                        base,
                        vec![(cd, lit(0.0, cd))],
                        &mut |l, i, a| {
                            let v = val(l, x, i)?;
                            let dd = l.reuse(bin(BinOp::Sub, v, m2.clone()), cd);
                            Ok(vec![bin(
                                BinOp::Add,
                                a[0].clone(),
                                bin(BinOp::Mul, dd.clone(), dd),
                            )])
                        },
                    )?;
                    st.extend(s2);
                    let inv = Expr::un(
                        UnOp::Rsqrt,
                        bin(
                            BinOp::Add,
                            bin(BinOp::Div, var[0].clone(), lit(cnt as f64, cd)),
                            lit(eps, cd),
                        ),
                    );
                    let inv = l.hoist(inv, cd);
                    st.extend(l.take_lets());
                    let mut sidx = base[..axis].to_vec();
                    sidx.resize(r, Expr::Int(0));
                    if want_mean {
                        st.extend(l.epilogue(mean_out, &sidx, Expr::cast(stash, mean.clone()))?);
                    }
                    if want_inv {
                        st.extend(l.epilogue(inv_out, &sidx, Expr::cast(stash, inv.clone()))?);
                    }
                    Ok((st, vec![mean, inv]))
                },
                &mut |l, i, stats| {
                    let v = val(l, x, i)?;
                    let sc = val(l, scale, &l.bcast_idx(scale, i))?;
                    let mut e = bin(
                        BinOp::Mul,
                        bin(
                            BinOp::Mul,
                            bin(BinOp::Sub, v, stats[0].clone()),
                            stats[1].clone(),
                        ),
                        sc,
                    );
                    if let Some(b) = bias {
                        e = bin(BinOp::Add, e, val(l, b, &l.bcast_idx(b, i))?);
                    }
                    Ok(vec![(y, i.to_vec(), l.down(e, d))])
                },
            )
        }
        NormOp::RmsNorm { axis, epsilon } => {
            let row: Vec<(usize, i64)> = (*axis..r).map(|a| (a, xs[a])).collect();
            let cnt: i64 = xs[*axis..].iter().product();
            let spec = RowNorm {
                shape: xs.clone(),
                row,
                map: &ident,
            };
            let scale = ins[1];
            let eps = *epsilon as f64;
            row_norm(
                l,
                &spec,
                &mut |l, base| {
                    let (mut st, ss) = accumulate(
                        l,
                        &spec.row,
                        base,
                        vec![(cd, lit(0.0, cd))],
                        &mut |l, i, a| {
                            let v = val(l, x, i)?;
                            let v = l.reuse(v, cd);
                            Ok(vec![bin(
                                BinOp::Add,
                                a[0].clone(),
                                bin(BinOp::Mul, v.clone(), v),
                            )])
                        },
                    )?;
                    let inv = Expr::un(
                        UnOp::Rsqrt,
                        bin(
                            BinOp::Add,
                            bin(BinOp::Div, ss[0].clone(), lit(cnt as f64, cd)),
                            lit(eps, cd),
                        ),
                    );
                    let inv = l.hoist(inv, cd);
                    st.extend(l.take_lets());
                    Ok((st, vec![inv]))
                },
                &mut |l, i, stats| {
                    let v = val(l, x, i)?;
                    let sc = val(l, scale, &l.bcast_idx(scale, i))?;
                    Ok(vec![(
                        y,
                        i.to_vec(),
                        l.down(bin(BinOp::Mul, bin(BinOp::Mul, v, stats[0].clone()), sc), d),
                    )])
                },
            )
        }
        NormOp::InstanceNorm { epsilon } | NormOp::GroupNorm { epsilon, .. } => {
            let groups = match no {
                NormOp::GroupNorm { num_groups, .. } => *num_groups as i64,
                _ => xs[1],
            };
            let c = xs[1];
            if groups == 0 || c % groups != 0 {
                return l.unsupported(n, "channels do not divide into groups");
            }
            let cpg = c / groups;
            let sp: Vec<i64> = xs[2..].to_vec();
            let spn: i64 = sp.iter().product();
            // Virtual shape [N, G, Cg * S].
            let vshape = vec![xs[0], groups, cpg * spn];
            let map = move |i: &[Expr]| -> Vec<Expr> {
                let ch = bin(
                    BinOp::Add,
                    bin(BinOp::Mul, i[1].clone(), Expr::Int(cpg)),
                    bin(BinOp::Div, i[2].clone(), Expr::Int(spn)),
                );
                let mut v = vec![i[0].clone(), ch];
                v.extend(unravel(bin(BinOp::Rem, i[2].clone(), Expr::Int(spn)), &sp));
                v
            };
            let cnt = cpg * spn;
            let spec = RowNorm {
                shape: vshape,
                row: vec![(2, cpg * spn)],
                map: &map,
            };
            let (scale, bias) = (ins[1], ins[2]);
            let eps = *epsilon as f64;
            row_norm(
                l,
                &spec,
                &mut |l, base| {
                    let (mut st, mean) = accumulate(
                        l,
                        &spec.row,
                        base,
                        vec![(cd, lit(0.0, cd))],
                        &mut |l, i, a| {
                            let v = val(l, x, &(spec.map)(i))?;
                            Ok(vec![bin(BinOp::Add, a[0].clone(), v)])
                        },
                    )?;
                    let mean = l.hoist(bin(BinOp::Div, mean[0].clone(), lit(cnt as f64, cd)), cd);
                    st.extend(l.take_lets());
                    let m2 = mean.clone();
                    let (s2, var) = accumulate(
                        l,
                        &spec.row,
                        base,
                        vec![(cd, lit(0.0, cd))],
                        &mut |l, i, a| {
                            let v = val(l, x, &(spec.map)(i))?;
                            let dd = l.reuse(bin(BinOp::Sub, v, m2.clone()), cd);
                            Ok(vec![bin(
                                BinOp::Add,
                                a[0].clone(),
                                bin(BinOp::Mul, dd.clone(), dd),
                            )])
                        },
                    )?;
                    st.extend(s2);
                    let inv = Expr::un(
                        UnOp::Rsqrt,
                        bin(
                            BinOp::Add,
                            bin(BinOp::Div, var[0].clone(), lit(cnt as f64, cd)),
                            lit(eps, cd),
                        ),
                    );
                    let inv = l.hoist(inv, cd);
                    st.extend(l.take_lets());
                    Ok((st, vec![mean, inv]))
                },
                &mut |l, vi, stats| {
                    let i = (spec.map)(vi);
                    let i: Vec<Expr> = i.into_iter().map(|e| l.simp(e)).collect();
                    let v = val(l, x, &i)?;
                    let ch = vec![i[1].clone()];
                    let sc = val(l, scale, &ch)?;
                    let b = val(l, bias, &ch)?;
                    let e = bin(
                        BinOp::Add,
                        bin(
                            BinOp::Mul,
                            bin(
                                BinOp::Mul,
                                bin(BinOp::Sub, v, stats[0].clone()),
                                stats[1].clone(),
                            ),
                            sc,
                        ),
                        b,
                    );
                    Ok(vec![(y, i, l.down(e, d))])
                },
            )
        }
        NormOp::LpNorm { axis, p } => {
            let spec = RowNorm {
                shape: xs.clone(),
                row: vec![(*axis, xs[*axis])],
                map: &ident,
            };
            let p = *p;
            row_norm(
                l,
                &spec,
                &mut |l, base| {
                    let (mut st, s) = accumulate(
                        l,
                        &spec.row,
                        base,
                        vec![(cd, lit(0.0, cd))],
                        &mut |l, i, a| {
                            let v = val(l, x, i)?;
                            let t = if p == 1 {
                                Expr::un(UnOp::Abs, v)
                            } else {
                                let v = l.reuse(v, cd);
                                bin(BinOp::Mul, v.clone(), v)
                            };
                            Ok(vec![bin(BinOp::Add, a[0].clone(), t)])
                        },
                    )?;
                    let nrm = if p == 1 {
                        s[0].clone()
                    } else {
                        Expr::un(UnOp::Sqrt, s[0].clone())
                    };
                    let nrm = l.hoist(nrm, cd);
                    st.extend(l.take_lets());
                    Ok((st, vec![nrm]))
                },
                &mut |l, i, stats| {
                    let v = val(l, x, i)?;
                    let z = lit(0.0, cd);
                    let e = Expr::select(
                        bin(BinOp::Eq, stats[0].clone(), z.clone()),
                        z,
                        bin(BinOp::Div, v, stats[0].clone()),
                    );
                    Ok(vec![(y, i.to_vec(), l.down(e, d))])
                },
            )
        }
        NormOp::MeanVarianceNorm { axes } => {
            let row: Vec<(usize, i64)> = axes.iter().map(|&a| (a, xs[a])).collect();
            let cnt: i64 = axes.iter().map(|&a| xs[a]).product();
            let spec = RowNorm {
                shape: xs.clone(),
                row,
                map: &ident,
            };
            row_norm(
                l,
                &spec,
                &mut |l, base| {
                    let (mut st, mean) = mean_pass(l, &spec.row, base, x, cd, cnt)?;
                    let m2 = mean.clone();
                    let (s2, var) = accumulate(
                        l,
                        &spec.row,
                        base,
                        vec![(cd, lit(0.0, cd))],
                        &mut |l, i, a| {
                            let v = val(l, x, i)?;
                            let dd = l.reuse(bin(BinOp::Sub, v, m2.clone()), cd);
                            Ok(vec![bin(
                                BinOp::Add,
                                a[0].clone(),
                                bin(BinOp::Mul, dd.clone(), dd),
                            )])
                        },
                    )?;
                    st.extend(s2);
                    let den = bin(
                        BinOp::Add,
                        Expr::un(
                            UnOp::Sqrt,
                            bin(BinOp::Div, var[0].clone(), lit(cnt as f64, cd)),
                        ),
                        lit(1e-9, cd),
                    );
                    let den = l.hoist(den, cd);
                    st.extend(l.take_lets());
                    Ok((st, vec![mean, den]))
                },
                &mut |l, i, stats| {
                    let v = val(l, x, i)?;
                    Ok(vec![(
                        y,
                        i.to_vec(),
                        l.down(
                            bin(
                                BinOp::Div,
                                bin(BinOp::Sub, v, stats[0].clone()),
                                stats[1].clone(),
                            ),
                            d,
                        ),
                    )])
                },
            )
        }
        NormOp::Lrn {
            size,
            alpha,
            beta,
            bias,
            channels_last,
        } => {
            // The channel axis: 1, or the last one when channels-last.
            let cax = if *channels_last { xs.len() - 1 } else { 1 };
            let c = xs[cax];
            let (lo, hi) = ((*size as i64 - 1) / 2, (*size as i64 - 1 + 1) / 2);
            let (alpha, beta, bias, size) =
                (*alpha as f64, *beta as f64, *bias as f64, *size as i64);
            output_nest(l, &xs, &mut |l, idx| {
                let ch = idx[cax].clone();
                let (mut st, acc) =
                    accumulate(l, &[], idx, vec![(cd, lit(0.0, cd))], &mut |_l, _i, a| {
                        Ok(vec![a[0].clone()])
                    })?;
                st.clear();
                let _ = acc;
                // Window over channels ch - lo ..= ch + hi, clipped to 0..C.
                let wv = l.loop_var("r", lo + hi + 1);
                let a = l.elem_var("acc", cd, true);
                st.push(Stmt::Let {
                    var: a,
                    value: lit(0.0, cd),
                });
                let k = bin(
                    BinOp::Add,
                    bin(BinOp::Sub, ch.clone(), Expr::Int(lo)),
                    Expr::Var(wv),
                );
                let inside = bin(
                    BinOp::And,
                    bin(BinOp::Ge, k.clone(), Expr::Int(0)),
                    bin(BinOp::Lt, k.clone(), Expr::Int(c)),
                );
                let mut xi = idx.to_vec();
                xi[cax] = k;
                let m = l.begin_block();
                l.guard += 1;
                let v = val(l, x, &xi);
                l.guard -= 1;
                let lets = l.end_block(m);
                let v = v?;
                let sq = bin(BinOp::Mul, v.clone(), v);
                let mut inner = lets;
                inner.push(Stmt::Assign {
                    var: a,
                    value: Expr::select(inside, bin(BinOp::Add, Expr::Var(a), sq), Expr::Var(a)),
                });
                st.push(Stmt::for_(wv, lo + hi + 1, inner));
                let xv = val(l, x, idx)?;
                let den = bin(
                    BinOp::Pow,
                    bin(
                        BinOp::Add,
                        lit(bias, cd),
                        bin(BinOp::Mul, lit(alpha / size as f64, cd), Expr::Var(a)),
                    ),
                    lit(beta, cd),
                );
                let e = l.down(bin(BinOp::Div, xv, den), d);
                st.extend(l.take_lets());
                st.extend(l.epilogue(y, idx, e)?);
                Ok(st)
            })
        }
        NormOp::NllLoss { reduction, .. } => {
            // Sum or weighted mean of the per-element losses over the whole target.
            let target = ins[1];
            let ts = l.shape(target);
            let row: Vec<(usize, i64)> = ts.iter().copied().enumerate().collect();
            let base = vec![Expr::Int(0); ts.len()];
            let mean = *reduction == LossReduction::Mean;
            let m = l.begin_block();
            let res = (|| -> R<Vec<Stmt>> {
                let (mut st, acc) = accumulate(
                    l,
                    &row,
                    &base,
                    vec![(cd, lit(0.0, cd)), (cd, lit(0.0, cd))],
                    &mut |l, i, a| {
                        let (loss, wt) = l.nll_element(n, i)?;
                        Ok(vec![
                            bin(BinOp::Add, a[0].clone(), loss),
                            bin(BinOp::Add, a[1].clone(), wt),
                        ])
                    },
                )?;
                let r = if mean {
                    bin(BinOp::Div, acc[0].clone(), acc[1].clone())
                } else {
                    acc[0].clone()
                };
                st.extend(l.take_lets());
                st.extend(l.epilogue(y, &[], l.down(r, d))?);
                Ok(st)
            })();
            let mut inner = l.end_block(m);
            inner.extend(res?);
            Ok(inner)
        }
        NormOp::BatchNorm { .. } => l.unsupported(n, "not a row normalization"),
    }
}

fn mean_pass(
    l: &mut Lowerer,
    row: &[(usize, i64)],
    base: &[Expr],
    x: ValueId,
    cd: DType,
    cnt: i64,
) -> R<(Vec<Stmt>, Expr)> {
    let (mut st, s) = accumulate(l, row, base, vec![(cd, lit(0.0, cd))], &mut |l, i, a| {
        let v = val(l, x, i)?;
        Ok(vec![bin(BinOp::Add, a[0].clone(), v)])
    })?;
    let mean = l.hoist(bin(BinOp::Div, s[0].clone(), lit(cnt as f64, cd)), cd);
    st.extend(l.take_lets());
    Ok((st, mean))
}

/// A normalization: outer loops over the non-row dimensions of the virtual shape, the
/// statistics passes, then a loop over the row storing each element through the epilogue.
/// `elem` returns (value, index, element) triples for the anchor outputs at one element.
fn row_norm(
    l: &mut Lowerer,
    spec: &RowNorm,
    stats: &mut dyn FnMut(&mut Lowerer, &[Expr]) -> R<(Vec<Stmt>, Vec<Expr>)>,
    elem: &mut dyn FnMut(&mut Lowerer, &[Expr], &[Expr]) -> R<Vec<(ValueId, Vec<Expr>, Expr)>>,
) -> R<Vec<Stmt>> {
    let row_dims: Vec<usize> = spec.row.iter().map(|r| r.0).collect();
    let (loops, base) = outer_space(l, &spec.shape, &row_dims);
    let m = l.begin_block();
    let res = (|| -> R<Vec<Stmt>> {
        let (mut body, st) = stats(l, &base)?;
        body.extend(l.take_lets());
        let final_loop = row_loop(l, &spec.row, &base, &mut |l, vi| {
            let items = elem(l, vi, &st)?;
            let mut out = l.take_lets();
            for (v, i, e) in items {
                out.extend(l.epilogue(v, &i, e)?);
            }
            Ok(out)
        })?;
        body.extend(final_loop);
        Ok(body)
    })();
    let mut inner = l.end_block(m);
    inner.extend(res?);
    Ok(Lowerer::nest(&loops, inner))
}

fn global_pool(l: &mut Lowerer, n: NodeId, kind: &PoolKind, cl: bool) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
    let (x, out) = (node.inputs[0], node.outputs[0]);
    let xs = l.shape(x);
    let r = xs.len();
    let d = l.dtype(x);
    let cd = compute_dtype(d);
    let sp: Vec<usize> = if cl {
        (1..r - 1).collect()
    } else {
        (2..r).collect()
    };
    let cnt: i64 = sp.iter().map(|&a| xs[a]).product();
    let row: Vec<(usize, i64)> = sp.iter().map(|&a| (a, xs[a])).collect();
    let (loops, base) = outer_space(l, &xs, &sp);
    let m = l.begin_block();
    let (init, op) = match kind {
        PoolKind::Max { .. } => (neg_inf(cd), BinOp::Max),
        _ => (lit(0.0, cd), BinOp::Add),
    };
    let kind2 = kind.clone();
    let (mut body, acc) = accumulate(l, &row, &base, vec![(cd, init)], &mut |l, i, a| {
        let v = val(l, x, i)?;
        let t = match kind2 {
            PoolKind::Lp { p } => bin(BinOp::Pow, Expr::un(UnOp::Abs, v), lit(p as f64, cd)),
            _ => v,
        };
        Ok(vec![bin(op, a[0].clone(), t)])
    })?;
    let res = match kind {
        PoolKind::Max { .. } => acc[0].clone(),
        PoolKind::Avg { .. } => bin(BinOp::Div, acc[0].clone(), lit(cnt as f64, cd)),
        PoolKind::Lp { p } => bin(BinOp::Pow, acc[0].clone(), lit(1.0 / *p as f64, cd)),
    };
    body.extend(l.take_lets());
    body.extend(l.epilogue(out, &base, l.down(res, d))?);
    let mut inner = l.end_block(m);
    inner.extend(body);
    Ok(Lowerer::nest(&loops, inner))
}

// ---------------------------------------------------------------- windows

/// Per spatial axis: (output length, pad begin, pad end).
fn geometry(
    l: &Lowerer,
    n: NodeId,
    xs_sp: &[i64],
    w: &Window,
    ceil: bool,
) -> R<Vec<(i64, i64, i64)>> {
    let mut v = Vec::new();
    for (i, &s) in xs_sp.iter().enumerate() {
        match window_geometry(s as usize, w, i, ceil) {
            Ok((o, pb, pe)) => v.push((o as i64, pb as i64, pe as i64)),
            Err(e) => return l.unsupported(n, e),
        }
    }
    Ok(v)
}

fn pool(
    l: &mut Lowerer,
    n: NodeId,
    kind: &PoolKind,
    w: &Window,
    ceil: bool,
    cl: bool,
) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
    let x = node.inputs[0];
    let outs = node.outputs.clone();
    let xs = l.shape(x);
    let r = xs.len();
    let d = l.dtype(x);
    let cd = compute_dtype(d);
    let sp_axes: Vec<usize> = if cl {
        (1..r - 1).collect()
    } else {
        (2..r).collect()
    };
    let c_axis = if cl { r - 1 } else { 1 };
    let sp: Vec<i64> = sp_axes.iter().map(|&a| xs[a]).collect();
    let geo = geometry(l, n, &sp, w, ceil)?;
    let want_idx = matches!(kind, PoolKind::Max { indices: true, .. })
        && outs.len() > 1
        && is_used(l, outs[1]);
    let column_major = matches!(
        kind,
        PoolKind::Max {
            column_major: true,
            ..
        }
    );
    let oshape = l.shape(outs[0]);
    let kernel: Vec<i64> = w.kernel.iter().map(|&k| k as i64).collect();
    let kind = kind.clone();
    output_nest(l, &oshape, &mut |l, oidx| {
        // Accumulators: value (max or sum), count (avg) or best index (max with indices).
        let mut accs = vec![(
            cd,
            match kind {
                PoolKind::Max { .. } => neg_inf(cd),
                _ => lit(0.0, cd),
            },
        )];
        let count_acc = matches!(kind, PoolKind::Avg { .. });
        if count_acc || want_idx {
            accs.push((DType::I64, lit_i(if want_idx { -1 } else { 0 }, DType::I64)));
        }
        let mut rvars = Vec::new();
        let mut loops = Vec::new();
        for &k in &kernel {
            let v = l.loop_var("r", k);
            loops.push((v, k));
            rvars.push(Expr::Var(v));
        }
        let mut vars = Vec::new();
        let mut st = Vec::new();
        for (dt, init) in accs {
            let a = l.elem_var("acc", dt, true);
            st.push(Stmt::Let {
                var: a,
                value: init,
            });
            vars.push(a);
        }
        // Tap coordinates.
        let mut xi = oidx.to_vec();
        let mut inside: Option<Expr> = None;
        let mut in_pad: Option<Expr> = None;
        let mut coords = Vec::new();
        for (j, &a) in sp_axes.iter().enumerate() {
            let (_, pb, pe) = geo[j];
            let c = bin(
                BinOp::Sub,
                bin(
                    BinOp::Add,
                    bin(BinOp::Mul, oidx[a].clone(), Expr::Int(w.strides[j] as i64)),
                    bin(
                        BinOp::Mul,
                        rvars[j].clone(),
                        Expr::Int(w.dilations[j] as i64),
                    ),
                ),
                Expr::Int(pb),
            );
            let c = l.simp(c);
            let ok = bin(
                BinOp::And,
                bin(BinOp::Ge, c.clone(), Expr::Int(0)),
                bin(BinOp::Lt, c.clone(), Expr::Int(sp[j])),
            );
            inside = Some(match inside {
                None => ok,
                Some(p) => bin(BinOp::And, p, ok),
            });
            let okp = bin(BinOp::Lt, c.clone(), Expr::Int(sp[j] + pe));
            in_pad = Some(match in_pad {
                None => okp,
                Some(p) => bin(BinOp::And, p, okp),
            });
            xi[a] = c.clone();
            coords.push(c);
        }
        let inside = inside.unwrap_or(Expr::Lit(Lit::Bool(true)));
        let in_pad = in_pad.unwrap_or(Expr::Lit(Lit::Bool(true)));
        let m = l.begin_block();
        l.guard += 1;
        let v = val(l, x, &xi);
        l.guard -= 1;
        let mut inner = l.end_block(m);
        let v = v?;
        let a0 = Expr::Var(vars[0]);
        match kind {
            PoolKind::Max { .. } if want_idx => {
                let bi = Expr::Var(vars[1]);
                // A select, not `and`: the load must not be evaluated outside the input.
                let better = Expr::select(
                    inside.clone(),
                    bin(
                        BinOp::Or,
                        bin(BinOp::Lt, bi.clone(), lit_i(0, DType::I64)),
                        bin(BinOp::Gt, v.clone(), a0.clone()),
                    ),
                    Expr::Lit(Lit::Bool(false)),
                );
                let t = l.elem_var("t", DType::Bool, false);
                inner.push(Stmt::Let {
                    var: t,
                    value: better,
                });
                // Flat spatial index of the tap (row-major, or column-major spatial part).
                let mut flat = Expr::Int(0);
                if column_major {
                    let mut stride = 1;
                    for (j, c) in coords.iter().enumerate() {
                        flat = bin(
                            BinOp::Add,
                            flat,
                            bin(BinOp::Mul, c.clone(), Expr::Int(stride)),
                        );
                        stride *= sp[j];
                    }
                } else {
                    for (j, c) in coords.iter().enumerate() {
                        let stride: i64 = sp[j + 1..].iter().product();
                        flat = bin(
                            BinOp::Add,
                            flat,
                            bin(BinOp::Mul, c.clone(), Expr::Int(stride)),
                        );
                    }
                }
                let flat = l.simp(flat);
                inner.push(Stmt::Assign {
                    var: vars[0],
                    value: Expr::select(Expr::Var(t), v, a0.clone()),
                });
                inner.push(Stmt::Assign {
                    var: vars[1],
                    value: Expr::select(Expr::Var(t), Expr::cast(DType::I64, flat), bi),
                });
            }
            PoolKind::Max { .. } => {
                inner.push(Stmt::Assign {
                    var: vars[0],
                    value: Expr::select(inside, bin(BinOp::Max, a0.clone(), v), a0.clone()),
                });
            }
            PoolKind::Avg { count_include_pad } => {
                inner.push(Stmt::Assign {
                    var: vars[0],
                    value: Expr::select(inside.clone(), bin(BinOp::Add, a0.clone(), v), a0.clone()),
                });
                let cnt_if = if count_include_pad { in_pad } else { inside };
                let c1 = Expr::Var(vars[1]);
                inner.push(Stmt::Assign {
                    var: vars[1],
                    value: Expr::select(
                        cnt_if,
                        bin(BinOp::Add, c1.clone(), lit_i(1, DType::I64)),
                        c1,
                    ),
                });
            }
            PoolKind::Lp { p } => {
                let t = bin(BinOp::Pow, Expr::un(UnOp::Abs, v), lit(p as f64, cd));
                inner.push(Stmt::Assign {
                    var: vars[0],
                    value: Expr::select(inside, bin(BinOp::Add, a0.clone(), t), a0.clone()),
                });
            }
        }
        st.extend(Lowerer::nest(&loops, inner));
        let res = match kind {
            PoolKind::Max { .. } => a0.clone(),
            PoolKind::Avg { count_include_pad } => {
                let c = Expr::cast(cd, Expr::Var(vars[1]));
                let c = if count_include_pad {
                    bin(BinOp::Max, c, lit(1.0, cd))
                } else {
                    c
                };
                bin(BinOp::Div, a0.clone(), c)
            }
            PoolKind::Lp { p } => bin(BinOp::Pow, a0.clone(), lit(1.0 / p as f64, cd)),
        };
        st.extend(l.take_lets());
        st.extend(l.epilogue(outs[0], oidx, l.down(res, d))?);
        if want_idx {
            // Plane offset: (n * C + c) * prod(spatial).
            let spn: i64 = sp.iter().product();
            let plane = bin(
                BinOp::Add,
                bin(BinOp::Mul, oidx[0].clone(), Expr::Int(xs[c_axis])),
                oidx[c_axis].clone(),
            );
            let bi = bin(BinOp::Max, Expr::Var(vars[1]), lit_i(0, DType::I64));
            let e = bin(
                BinOp::Add,
                Expr::cast(DType::I64, bin(BinOp::Mul, plane, Expr::Int(spn))),
                bi,
            );
            st.extend(l.epilogue(outs[1], oidx, e)?);
        }
        Ok(st)
    })
}

// ---------------------------------------------------------------- matmul, conv

pub(crate) fn gemm_params() -> GemmParams {
    GemmParams {
        mr: 6,
        nr: 16,
        kc: 256,
        mc: 96,
        nc: 2048,
    }
}

pub(crate) struct GemmVars {
    pub b: VarId,
    pub i: VarId,
    pub j: VarId,
    pub k: VarId,
    pub acc: VarId,
}

pub(crate) fn gemm_vars(l: &mut Lowerer, batch: i64, m: i64, nn: i64, k: i64, acc_d: DType) -> GemmVars {
    GemmVars {
        b: l.loop_var("gb", batch),
        i: l.loop_var("gi", m),
        j: l.loop_var("gj", nn),
        k: l.loop_var("gk", k),
        acc: l.elem_var("acc", acc_d, false),
    }
}

/// Builds an operand expression without temporaries (GEMM operands are pure expressions).
fn operand(l: &mut Lowerer, f: &mut dyn FnMut(&mut Lowerer) -> R<Expr>) -> R<Expr> {
    let saved = l.cse_on;
    l.cse_on = false;
    let r = f(l);
    l.cse_on = saved;
    r
}

fn matmul(l: &mut Lowerer, n: NodeId) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
    let (a, b, out) = (node.inputs[0], node.inputs[1], node.outputs[0]);
    let (sa, sb, so) = (l.shape(a), l.shape(b), l.shape(out));
    let (a1, b1) = (sa.len() == 1, sb.len() == 1);
    let m = if a1 { 1 } else { sa[sa.len() - 2] };
    let k = sa[sa.len() - 1];
    let nn = if b1 { 1 } else { sb[sb.len() - 1] };
    let batch_shape: Vec<i64> = so[..so.len() - usize::from(!a1) - usize::from(!b1)].to_vec();
    let batch: i64 = batch_shape.iter().product();
    let d = l.dtype(out);
    let float = d.is_float();
    if !float {
        // Integer matmul: a direct loop nest accumulating in i64.
        let ad = acc_dtype(d);
        return output_nest(l, &so, &mut |l, oidx| {
            let nb = batch_shape.len();
            let bi = &oidx[..nb];
            let (i, j) = (
                if a1 { Expr::Int(0) } else { oidx[nb].clone() },
                if b1 {
                    Expr::Int(0)
                } else {
                    oidx[oidx.len() - 1].clone()
                },
            );
            let kv = l.loop_var("r", k);
            let acc = l.elem_var("acc", ad, true);
            let ai = mm_index(&sa, bi, &i, &Expr::Var(kv), true);
            let bidx = mm_index(&sb, bi, &Expr::Var(kv), &j, false);
            let m2 = l.begin_block();
            let av = l.value_at(a, &ai);
            let bv = l.value_at(b, &bidx);
            let mut inner = l.end_block(m2);
            let (av, bv) = (av?, bv?);
            inner.push(Stmt::Assign {
                var: acc,
                value: bin(
                    BinOp::Add,
                    Expr::Var(acc),
                    bin(BinOp::Mul, Expr::cast(ad, av), Expr::cast(ad, bv)),
                ),
            });
            let mut st = vec![
                Stmt::Let {
                    var: acc,
                    value: lit(0.0, ad),
                },
                Stmt::for_(kv, k, inner),
            ];
            st.extend(l.epilogue(out, oidx, Expr::cast(d, Expr::Var(acc)))?);
            Ok(st)
        });
    }
    let acc_d = compute_dtype(d);
    let gv = gemm_vars(l, batch, m, nn, k, acc_d);
    let bidx = unravel(Expr::Var(gv.b), &batch_shape);
    let (vi, vj, vk) = (Expr::Var(gv.i), Expr::Var(gv.j), Expr::Var(gv.k));
    let ai = mm_index(&sa, &bidx, &vi, &vk, true);
    let bi = mm_index(&sb, &bidx, &vk, &vj, false);
    let ae = operand(l, &mut |l| l.value_at(a, &ai))?;
    let be = operand(l, &mut |l| l.value_at(b, &bi))?;
    let mut oidx = bidx.clone();
    if !a1 {
        oidx.push(vi.clone());
    }
    if !b1 {
        oidx.push(vj.clone());
    }
    let accv = if acc_d != d {
        Expr::cast(d, Expr::Var(gv.acc))
    } else {
        Expr::Var(gv.acc)
    };
    let m2 = l.begin_block();
    let epi = l.epilogue(out, &oidx, accv);
    let mut e = l.end_block(m2);
    e.extend(epi?);
    Ok(vec![Stmt::Gemm(Box::new(Gemm {
        batch,
        m,
        n: nn,
        k,
        b_var: gv.b,
        i_var: gv.i,
        j_var: gv.j,
        k_var: gv.k,
        acc_var: gv.acc,
        acc_dtype: acc_d,
        a: l.up(ae, d),
        b: l.up(be, d),
        epilogue: e,
        params: gemm_params(),
    }))])
}

/// Index into a matmul operand of shape `s` (rank 1 operands are vectors) for output batch
/// index `bidx` and matrix coordinates (`r`, `c`); `lhs` says which operand.
fn mm_index(s: &[i64], bidx: &[Expr], r: &Expr, c: &Expr, lhs: bool) -> Vec<Expr> {
    if s.len() == 1 {
        return vec![if lhs { c.clone() } else { r.clone() }];
    }
    let nb = s.len() - 2;
    let off = bidx.len() - nb;
    let mut v: Vec<Expr> = (0..nb)
        .map(|i| {
            if s[i] == 1 {
                Expr::Int(0)
            } else {
                bidx[off + i].clone()
            }
        })
        .collect();
    v.push(r.clone());
    v.push(c.clone());
    v
}

fn conv(l: &mut Lowerer, n: NodeId, w: &Window, group: usize, cl: bool) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
    let (x, wt, bias, out) = (
        node.inputs[0],
        node.inputs[1],
        node.inputs[2],
        node.outputs[0],
    );
    let (xs, ws, os) = (l.shape(x), l.shape(wt), l.shape(out));
    let r = xs.len();
    let d = l.dtype(out);
    let cd = compute_dtype(d);
    let g = group as i64;
    let sp_axes: Vec<usize> = if cl {
        (1..r - 1).collect()
    } else {
        (2..r).collect()
    };
    let c_axis = if cl { r - 1 } else { 1 };
    let sp: Vec<i64> = sp_axes.iter().map(|&a| xs[a]).collect();
    let geo = geometry(l, n, &sp, w, false)?;
    let osp: Vec<i64> = geo.iter().map(|t| t.0).collect();
    let (c, m) = (xs[c_axis], ws[0]);
    let (cg, mg) = (c / g, m / g);
    let kern: Vec<i64> = ws[2..].to_vec();
    let taps: i64 = kern.iter().product();
    let kk = cg * taps;
    let p: i64 = osp.iter().product();
    let nb = xs[0];
    // Input coordinates (and the in-bounds condition) of a tap for output spatial index `o`.
    let tap = |l: &Lowerer, o: &[Expr], t: &[Expr]| -> (Vec<Expr>, Option<Expr>) {
        let mut coords = Vec::new();
        let mut cond: Option<Expr> = None;
        for j in 0..sp.len() {
            let (_, pb, pe) = geo[j];
            let e = bin(
                BinOp::Sub,
                bin(
                    BinOp::Add,
                    bin(BinOp::Mul, o[j].clone(), Expr::Int(w.strides[j] as i64)),
                    bin(BinOp::Mul, t[j].clone(), Expr::Int(w.dilations[j] as i64)),
                ),
                Expr::Int(pb),
            );
            let e = l.simp(e);
            if pb > 0 || pe > 0 {
                let ok = bin(
                    BinOp::And,
                    bin(BinOp::Ge, e.clone(), Expr::Int(0)),
                    bin(BinOp::Lt, e.clone(), Expr::Int(sp[j])),
                );
                cond = Some(match cond {
                    None => ok,
                    Some(p) => bin(BinOp::And, p, ok),
                });
            }
            coords.push(e);
        }
        (coords, cond)
    };
    let x_at = |n_: Expr, ch: Expr, coords: Vec<Expr>| -> Vec<Expr> {
        let mut v = vec![n_];
        if cl {
            v.extend(coords);
            v.push(ch);
        } else {
            v.push(ch);
            v.extend(coords);
        }
        v
    };
    let out_at = |n_: Expr, ch: Expr, o: Vec<Expr>| -> Vec<Expr> { x_at(n_, ch, o) };
    let use_gemm = match l.opts.conv {
        ConvAlgo::Auto => kk >= 16 && mg >= 4,
        ConvAlgo::Direct => false,
        ConvAlgo::Gemm => true,
        ConvAlgo::Winograd => {
            let st = if cl { super::winograd::conv(l, n, w, group, &geo)? } else { None };
            return st.ok_or_else(|| {
                Fail::Unsupported(n, "Winograd needs a 3x3 stride-1 f32 channels-last convolution over at least 32 input and 16 output channels and 32 tiles, reading a plain input".into())
            });
        }
    };
    if !use_gemm {
        // Direct loop nest: out[n, m, o] = bias[m] + sum_{c, taps} x * w.
        return output_nest(l, &os, &mut |l, oidx| {
            let (n_, mch) = (oidx[0].clone(), oidx[c_axis].clone());
            let o: Vec<Expr> = sp_axes.iter().map(|&a| oidx[a].clone()).collect();
            let grp = bin(BinOp::Div, mch.clone(), Expr::Int(mg));
            let cv = l.loop_var("r", cg);
            let mut loops = vec![(cv, cg)];
            let mut t = Vec::new();
            for &kx in &kern {
                let v = l.loop_var("r", kx);
                loops.push((v, kx));
                t.push(Expr::Var(v));
            }
            let (coords, cond) = tap(l, &o, &t);
            let ch = bin(
                BinOp::Add,
                bin(BinOp::Mul, grp, Expr::Int(cg)),
                Expr::Var(cv),
            );
            let acc = l.elem_var("acc", cd, true);
            let m2 = l.begin_block();
            if cond.is_some() {
                l.guard += 1;
            }
            let xv = val(l, x, &x_at(n_.clone(), ch, coords));
            if cond.is_some() {
                l.guard -= 1;
            }
            let mut wi = vec![mch.clone(), Expr::Var(cv)];
            wi.extend(t.iter().cloned());
            let wv = val(l, wt, &wi);
            let mut inner = l.end_block(m2);
            let prod = bin(BinOp::Mul, xv?, wv?);
            let upd = bin(BinOp::Add, Expr::Var(acc), prod);
            let upd = match cond {
                Some(c) => Expr::select(c, upd, Expr::Var(acc)),
                None => upd,
            };
            inner.push(Stmt::Assign {
                var: acc,
                value: upd,
            });
            let mut st = vec![Stmt::Let {
                var: acc,
                value: lit(0.0, cd),
            }];
            st.extend(Lowerer::nest(&loops, inner));
            let bv = val(l, bias, &[mch])?;
            st.extend(l.take_lets());
            st.extend(l.epilogue(out, oidx, l.down(bin(BinOp::Add, Expr::Var(acc), bv), d))?);
            Ok(st)
        });
    }
    // GEMM with an implicit im2col operand; batch over (n, group).
    let batch = nb * g;
    let (rows, cols) = if cl { (p, mg) } else { (mg, p) };
    let gv = gemm_vars(l, batch, rows, cols, kk, cd);
    let (vb, vi, vj, vk) = (
        Expr::Var(gv.b),
        Expr::Var(gv.i),
        Expr::Var(gv.j),
        Expr::Var(gv.k),
    );
    let n_ = bin(BinOp::Div, vb.clone(), Expr::Int(g));
    let grp = bin(BinOp::Rem, vb.clone(), Expr::Int(g));
    // k = (c, taps) channels-first; (taps, c) channels-last (contiguous channels in x).
    let (cidx, tflat) = if cl {
        (
            bin(BinOp::Rem, vk.clone(), Expr::Int(cg)),
            bin(BinOp::Div, vk.clone(), Expr::Int(cg)),
        )
    } else {
        (
            bin(BinOp::Div, vk.clone(), Expr::Int(taps)),
            bin(BinOp::Rem, vk.clone(), Expr::Int(taps)),
        )
    };
    let t = unravel(tflat, &kern);
    let (pos, mloc) = if cl {
        (vi.clone(), vj.clone())
    } else {
        (vj.clone(), vi.clone())
    };
    let o = unravel(pos, &osp);
    let (coords, cond) = tap(l, &o, &t);
    let ch = bin(
        BinOp::Add,
        bin(BinOp::Mul, grp.clone(), Expr::Int(cg)),
        cidx.clone(),
    );
    let mch = bin(BinOp::Add, bin(BinOp::Mul, grp, Expr::Int(mg)), mloc);
    let xi = x_at(n_.clone(), ch, coords);
    let xe = operand(l, &mut |l| {
        l.guard += 1;
        let v = l.value_at(x, &xi);
        l.guard -= 1;
        let v = v?;
        let v = l.up(v, l.dtype(x));
        Ok(match &cond {
            Some(c) => Expr::select(c.clone(), v, lit(0.0, cd)),
            None => v,
        })
    })?;
    let mut wi = vec![mch.clone(), cidx];
    wi.extend(t);
    let we = operand(l, &mut |l| val(l, wt, &wi))?;
    let (ae, be) = if cl { (xe, we) } else { (we, xe) };
    let oidx = out_at(n_, mch.clone(), o);
    let m2 = l.begin_block();
    let epi = (|| -> R<Vec<Stmt>> {
        let bv = val(l, bias, &[mch])?;
        let e = l.down(bin(BinOp::Add, Expr::Var(gv.acc), bv), d);
        l.epilogue(out, &oidx, e)
    })();
    let mut e = l.end_block(m2);
    e.extend(epi?);
    Ok(vec![Stmt::Gemm(Box::new(Gemm {
        batch,
        m: rows,
        n: cols,
        k: kk,
        b_var: gv.b,
        i_var: gv.i,
        j_var: gv.j,
        k_var: gv.k,
        acc_var: gv.acc,
        acc_dtype: cd,
        a: ae,
        b: be,
        epilogue: e,
        params: gemm_params(),
    }))])
}

fn conv_transpose(
    l: &mut Lowerer,
    n: NodeId,
    strides: &[usize],
    dil: &[usize],
    pads: &[i64],
    group: usize,
) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
    let (x, wt, bias, out) = (
        node.inputs[0],
        node.inputs[1],
        node.inputs[2],
        node.outputs[0],
    );
    let (xs, ws, os) = (l.shape(x), l.shape(wt), l.shape(out));
    let d = l.dtype(out);
    let cd = compute_dtype(d);
    let g = group as i64;
    let (c, mg) = (xs[1], ws[1]);
    let cg = c / g;
    let sp: Vec<i64> = xs[2..].to_vec();
    let kern: Vec<i64> = ws[2..].to_vec();
    output_nest(l, &os, &mut |l, oidx| {
        let (n_, mch) = (oidx[0].clone(), oidx[1].clone());
        let grp = bin(BinOp::Div, mch.clone(), Expr::Int(mg));
        let mloc = bin(BinOp::Rem, mch.clone(), Expr::Int(mg));
        let cv = l.loop_var("r", cg);
        let mut loops = vec![(cv, cg)];
        let mut t = Vec::new();
        for &kx in &kern {
            let v = l.loop_var("r", kx);
            loops.push((v, kx));
            t.push(Expr::Var(v));
        }
        let mut cond: Option<Expr> = None;
        let mut coords = Vec::new();
        for j in 0..sp.len() {
            // i * s + t * dil - pb = o  →  i = (o + pb - t * dil) / s when exact.
            let num = bin(
                BinOp::Sub,
                bin(BinOp::Add, oidx[2 + j].clone(), Expr::Int(pads[j])),
                bin(BinOp::Mul, t[j].clone(), Expr::Int(dil[j] as i64)),
            );
            let num = l.simp(num);
            let s = strides[j] as i64;
            let i = l.simp(bin(BinOp::FloorDiv, num.clone(), Expr::Int(s)));
            let ok = bin(
                BinOp::And,
                bin(
                    BinOp::Eq,
                    l.simp(bin(BinOp::FloorMod, num, Expr::Int(s))),
                    Expr::Int(0),
                ),
                bin(
                    BinOp::And,
                    bin(BinOp::Ge, i.clone(), Expr::Int(0)),
                    bin(BinOp::Lt, i.clone(), Expr::Int(sp[j])),
                ),
            );
            cond = Some(match cond {
                None => ok,
                Some(p) => bin(BinOp::And, p, ok),
            });
            coords.push(i);
        }
        let ch = bin(
            BinOp::Add,
            bin(BinOp::Mul, grp, Expr::Int(cg)),
            Expr::Var(cv),
        );
        let acc = l.elem_var("acc", cd, true);
        let mut xi = vec![n_.clone(), ch.clone()];
        xi.extend(coords);
        let mut wi = vec![ch, mloc];
        wi.extend(t.iter().cloned());
        let m2 = l.begin_block();
        l.guard += 1;
        let xv = val(l, x, &xi);
        l.guard -= 1;
        let wv = val(l, wt, &wi);
        let mut inner = l.end_block(m2);
        let upd = bin(BinOp::Add, Expr::Var(acc), bin(BinOp::Mul, xv?, wv?));
        let upd = match cond {
            Some(c) => Expr::select(c, upd, Expr::Var(acc)),
            None => upd,
        };
        inner.push(Stmt::Assign {
            var: acc,
            value: upd,
        });
        let mut st = vec![Stmt::Let {
            var: acc,
            value: lit(0.0, cd),
        }];
        st.extend(Lowerer::nest(&loops, inner));
        let bv = val(l, bias, &[mch])?;
        st.extend(l.take_lets());
        st.extend(l.epilogue(out, oidx, l.down(bin(BinOp::Add, Expr::Var(acc), bv), d))?);
        Ok(st)
    })
}

fn einsum(l: &mut Lowerer, n: NodeId, subs: &[Vec<u8>], output: &[u8]) -> R<Vec<Stmt>> {
    let node = l.g.node(n);
    let ins = node.inputs.clone();
    let out = node.outputs[0];
    let os = l.shape(out);
    let d = l.dtype(out);
    let cd = acc_dtype(d);
    // Extent of every label (the largest over its occurrences: size-1 dims broadcast).
    let mut ext: Vec<(u8, i64)> = Vec::new();
    for (t, s) in subs.iter().enumerate() {
        let sh = l.shape(ins[t]);
        for (i, &lb) in s.iter().enumerate() {
            match ext.iter_mut().find(|e| e.0 == lb) {
                Some(e) => e.1 = e.1.max(sh[i]),
                None => ext.push((lb, sh[i])),
            }
        }
    }
    let summed: Vec<(u8, i64)> = ext
        .iter()
        .copied()
        .filter(|(lb, _)| !output.contains(lb))
        .collect();
    let subs = subs.to_vec();
    let output = output.to_vec();
    output_nest(l, &os, &mut |l, oidx| {
        let mut at: Vec<(u8, Expr)> = output
            .iter()
            .zip(oidx)
            .map(|(&lb, e)| (lb, e.clone()))
            .collect();
        let mut loops = Vec::new();
        for &(lb, e) in &summed {
            if e == 1 {
                at.push((lb, Expr::Int(0)));
            } else {
                let v = l.loop_var("r", e);
                loops.push((v, e));
                at.push((lb, Expr::Var(v)));
            }
        }
        let acc = l.elem_var("acc", cd, true);
        let m2 = l.begin_block();
        let mut prod: Option<Expr> = None;
        for (t, s) in subs.iter().enumerate() {
            let sh = l.shape(ins[t]);
            let idx: Vec<Expr> = s
                .iter()
                .enumerate()
                .map(|(i, lb)| {
                    if sh[i] == 1 {
                        Expr::Int(0)
                    } else {
                        at.iter()
                            .find(|a| a.0 == *lb)
                            .map(|a| a.1.clone())
                            .unwrap_or(Expr::Int(0))
                    }
                })
                .collect();
            let v = l.value_at(ins[t], &idx);
            let v = match v {
                Ok(v) => v,
                Err(e) => {
                    l.end_block(m2);
                    return Err(e);
                }
            };
            let v = if d.is_float() {
                l.up(v, l.dtype(ins[t]))
            } else {
                Expr::cast(cd, v)
            };
            prod = Some(match prod {
                None => v,
                Some(p) => bin(BinOp::Mul, p, v),
            });
        }
        let mut inner = l.end_block(m2);
        inner.push(Stmt::Assign {
            var: acc,
            value: bin(BinOp::Add, Expr::Var(acc), prod.unwrap_or(lit(1.0, cd))),
        });
        let mut st = vec![Stmt::Let {
            var: acc,
            value: lit(0.0, cd),
        }];
        st.extend(Lowerer::nest(&loops, inner));
        let r = if cd != d {
            Expr::cast(d, Expr::Var(acc))
        } else {
            Expr::Var(acc)
        };
        st.extend(l.epilogue(out, oidx, r)?);
        Ok(st)
    })
}

// ---------------------------------------------------------------- attention

pub(crate) struct Att {
    pub rank3: bool,
    pub hq: i64,
    pub hkv: i64,
    pub sq: i64,
    pub skv: i64,
    pub past: i64,
    pub dh: i64,
    pub dv: i64,
}

pub(crate) fn att_geom(l: &Lowerer, n: NodeId, op: &Op) -> R<Att> {
    let Op::Nn(NnOp::Attention {
        q_num_heads,
        kv_num_heads,
        has_past,
        has_mask,
        ..
    }) = op
    else {
        return l.unsupported(n, "not attention");
    };
    let node = l.g.node(n);
    let (qs, ks, vs) = (
        l.shape(node.inputs[0]),
        l.shape(node.inputs[1]),
        l.shape(node.inputs[2]),
    );
    let rank3 = qs.len() == 3;
    let (hq, sq, dh, hkv, skv, dv) = if rank3 {
        let (hq, hkv) = (*q_num_heads as i64, *kv_num_heads as i64);
        if hq == 0 || hkv == 0 {
            return l.unsupported(n, "3-D attention without head counts");
        }
        (hq, qs[1], qs[2] / hq, hkv, ks[1], vs[2] / hkv)
    } else {
        (qs[1], qs[2], qs[3], ks[1], ks[2], vs[3])
    };
    if hkv == 0 || hq % hkv != 0 {
        return l.unsupported(n, "q heads not a multiple of kv heads");
    }
    let past = if *has_past {
        let pi = 3 + usize::from(*has_mask);
        l.shape(node.inputs[pi])[2]
    } else {
        0
    };
    Ok(Att {
        rank3,
        hq,
        hkv,
        sq,
        skv,
        past,
        dh,
        dv,
    })
}

/// Element (b, h, s, d) of a 3-D `[B, S, H*D]` or 4-D `[B, H, S, D]` tensor.
pub(crate) fn head_idx(rank3: bool, dsz: i64, b: Expr, h: Expr, s: Expr, d: Expr) -> Vec<Expr> {
    if rank3 {
        vec![b, s, bin(BinOp::Add, bin(BinOp::Mul, h, Expr::Int(dsz)), d)]
    } else {
        vec![b, h, s, d]
    }
}

/// K (which = 1) or V (which = 2) with the past prepended, at (b, kh, j, d).
pub(crate) fn kv_at(
    l: &mut Lowerer,
    n: NodeId,
    op: &Op,
    a: &Att,
    which: usize,
    b: Expr,
    kh: Expr,
    j: Expr,
    d: Expr,
) -> R<Expr> {
    let Op::Nn(NnOp::Attention { has_mask, .. }) = op else {
        return l.unsupported(n, "not attention");
    };
    let node = l.g.node(n);
    let cur = node.inputs[which];
    let dsz = if which == 1 { a.dh } else { a.dv };
    if a.past == 0 {
        return l.value_at(cur, &head_idx(a.rank3, dsz, b, kh, j, d));
    }
    let pv = node.inputs[3 + usize::from(*has_mask) + which - 1];
    let j = l.simp(j);
    if let Some((lo, hi)) = super::simplify::expr_range(&j, &l.ranges) {
        if hi < a.past {
            return l.value_at(pv, &[b, kh, j, d]);
        }
        if lo >= a.past {
            let jj = bin(BinOp::Sub, j, Expr::Int(a.past));
            return l.value_at(cur, &head_idx(a.rank3, dsz, b, kh, jj, d));
        }
    }
    l.guard += 1;
    let p = l.value_at(pv, &[b.clone(), kh.clone(), j.clone(), d.clone()]);
    let c = l.value_at(
        cur,
        &head_idx(
            a.rank3,
            dsz,
            b,
            kh,
            bin(BinOp::Sub, j.clone(), Expr::Int(a.past)),
            d,
        ),
    );
    l.guard -= 1;
    Ok(Expr::select(bin(BinOp::Lt, j, Expr::Int(a.past)), p?, c?))
}

/// The additive mask of attention at `bhij` = [b, h, i, j] (broadcast from the mask's shape;
/// a boolean mask is 0 or -inf; keys past a mask shorter than the `t` keys are -inf).
pub(crate) fn mask_bias(l: &mut Lowerer, mv: ValueId, bhij: [Expr; 4], t: i64, cd: DType) -> R<Expr> {
    let ms = l.shape(mv);
    let off = 4 - ms.len();
    let mi: Vec<Expr> = ms
        .iter()
        .enumerate()
        .map(|(k, &dsz)| if dsz == 1 { Expr::Int(0) } else { bhij[off + k].clone() })
        .collect();
    let last = ms[ms.len() - 1];
    let guarded = last < t;
    if guarded {
        l.guard += 1;
    }
    let m = l.value_at(mv, &mi);
    if guarded {
        l.guard -= 1;
    }
    let m = m?;
    let mval = if l.dtype(mv) == DType::Bool {
        Expr::select(m, lit(0.0, cd), neg_inf(cd))
    } else {
        l.up(m, l.dtype(mv))
    };
    Ok(if guarded {
        Expr::select(bin(BinOp::Lt, bhij[3].clone(), Expr::Int(last)), mval, neg_inf(cd))
    } else {
        mval
    })
}

/// present_key / present_value (outputs 1 and 2) at `idx` = [b, h, t, d].
pub(crate) fn attention_present(l: &mut Lowerer, n: NodeId, out: usize, idx: &[Expr]) -> R<Expr> {
    let op = l.g.node(n).op.clone();
    let a = att_geom(l, n, &op)?;
    kv_at(
        l,
        n,
        &op,
        &a,
        out,
        idx[0].clone(),
        idx[1].clone(),
        idx[2].clone(),
        idx[3].clone(),
    )
}

fn attention(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    if l.opts.attention == AttentionAlgo::Gemm {
        return super::attention_gemm::attention(l, n, op)?.ok_or_else(|| {
            Fail::Unsupported(n, "attention as matrix products needs f32 attention without past, softcap, windows or a requested QK output".into())
        });
    }
    let Op::Nn(NnOp::Attention {
        scale,
        is_causal,
        softcap,
        left_window,
        right_window,
        has_mask,
        has_past,
        has_nonpad,
        qk_matmul_output_mode,
        ..
    }) = op
    else {
        return l.unsupported(n, "not attention");
    };
    let a = att_geom(l, n, op)?;
    let node = l.g.node(n);
    let (q, y) = (node.inputs[0], node.outputs[0]);
    let mask = if *has_mask {
        Some(node.inputs[3])
    } else {
        None
    };
    let nonpad = if *has_nonpad {
        Some(node.inputs[3 + usize::from(*has_mask) + 2 * usize::from(*has_past)])
    } else {
        None
    };
    let qk_out = node.outputs[3];
    let qk_mode = if is_used(l, qk_out) {
        Some(*qk_matmul_output_mode)
    } else {
        None
    };
    let dt = l.dtype(q);
    let cd = compute_dtype(dt);
    let t = a.past + a.skv;
    let reps = a.hq / a.hkv;
    let bsz = l.shape(q)[0];
    let sc = (scale
        .map(|s| s as f64)
        .unwrap_or(1.0 / (a.dh as f64).sqrt()))
    .sqrt();
    let sc = Tensor1::round(dt, sc);
    let cap = *softcap as f64;
    let rnd = |e: Expr| {
        if cd != dt {
            Expr::cast(cd, Expr::cast(dt, e))
        } else {
            e
        }
    };
    let (lw, rw) = (*left_window, *right_window);
    let windowed = lw >= 0 || rw >= 0;
    let causal = *is_causal;
    let (loops, idx) = l.index_space(&[bsz, a.hq, a.sq], "i");
    let (b, h, i) = (idx[0].clone(), idx[1].clone(), idx[2].clone());
    let kh = l.simp(bin(BinOp::Div, h.clone(), Expr::Int(reps)));
    let scores = l.scratch(cd, vec![t]);
    let yrow = l.scratch(cd, vec![a.dv]);
    let mut body = vec![Stmt::Alloc(scores), Stmt::Alloc(yrow)];
    let m_outer = l.begin_block();
    // Pass 1: logits and their maximum.
    let mx = l.elem_var("acc", cd, true);
    body.push(Stmt::Let {
        var: mx,
        value: neg_inf(cd),
    });
    let jv = l.loop_var("r", t);
    let j = Expr::Var(jv);
    let dv_ = l.loop_var("r", a.dh);
    let dd = Expr::Var(dv_);
    let s = l.elem_var("acc", cd, true);
    let mut jbody = vec![Stmt::Let {
        var: s,
        value: lit(0.0, cd),
    }];
    let mb = l.begin_block();
    let qv = val(
        l,
        q,
        &head_idx(a.rank3, a.dh, b.clone(), h.clone(), i.clone(), dd.clone()),
    );
    let kv = kv_at(
        l,
        n,
        op,
        &a,
        1,
        b.clone(),
        kh.clone(),
        j.clone(),
        dd.clone(),
    )
    .map(|e| l.up(e, dt));
    let mut dbody = l.end_block(mb);
    let (qv, kv) = (qv?, kv?);
    let prod = bin(
        BinOp::Mul,
        rnd(bin(BinOp::Mul, qv, lit(sc, cd))),
        rnd(bin(BinOp::Mul, kv, lit(sc, cd))),
    );
    dbody.push(Stmt::Assign {
        var: s,
        value: bin(BinOp::Add, Expr::Var(s), prod),
    });
    jbody.push(Stmt::for_(dv_, a.dh, dbody));
    let mut logit = rnd(Expr::Var(s));
    if cap > 0.0 {
        logit = rnd(bin(
            BinOp::Mul,
            lit(cap, cd),
            rnd(Expr::un(
                UnOp::Tanh,
                rnd(bin(BinOp::Div, logit, lit(cap, cd))),
            )),
        ));
    }
    // Additive bias: mask, causal and window terms.
    let mb = l.begin_block();
    let mut bias: Option<Expr> = None;
    if let Some(mv) = mask {
        let mval = mask_bias(l, mv, [b.clone(), h.clone(), i.clone(), j.clone()], t, cd)?;
        bias = Some(rnd(mval));
    }
    let mut blocked: Option<Expr> = None;
    let offset = match nonpad {
        Some(np) if !*has_past => {
            let v = l.value_at(np, &[b.clone()])?;
            let npi = Expr::ToIndex(Box::new(v));
            blocked = Some(bin(BinOp::Ge, j.clone(), npi.clone()));
            bin(BinOp::Sub, npi, Expr::Int(a.sq))
        }
        Some(np) => {
            let v = l.value_at(np, &[b.clone()])?;
            blocked = Some(bin(BinOp::Ge, j.clone(), Expr::ToIndex(Box::new(v))));
            Expr::Int(a.past)
        }
        None => Expr::Int(a.past),
    };
    let diff = bin(BinOp::Sub, bin(BinOp::Add, i.clone(), offset), j.clone());
    if causal {
        let c = bin(BinOp::Lt, diff.clone(), Expr::Int(0));
        blocked = Some(match blocked {
            None => c,
            Some(p) => bin(BinOp::Or, p, c),
        });
    }
    if windowed {
        let mut ok = Expr::Lit(Lit::Bool(true));
        if lw >= 0 {
            ok = bin(BinOp::And, ok, bin(BinOp::Le, diff.clone(), Expr::Int(lw)));
        }
        if rw >= 0 {
            ok = bin(
                BinOp::And,
                ok,
                bin(
                    BinOp::Le,
                    bin(BinOp::Sub, Expr::Int(0), diff.clone()),
                    Expr::Int(rw),
                ),
            );
        }
        let nb = Expr::un(UnOp::Not, ok);
        blocked = Some(match blocked {
            None => nb,
            Some(p) => bin(BinOp::Or, p, nb),
        });
    }
    let raw = l.elem_var("t", cd, false);
    let lets = l.end_block(mb);
    jbody.extend(lets);
    jbody.push(Stmt::Let {
        var: raw,
        value: logit,
    });
    let logit = Expr::Var(raw);
    let mb = l.begin_block();
    let qk_at = vec![b.clone(), h.clone(), i.clone(), j.clone()];
    if matches!(qk_mode, Some(0 | 1)) {
        let e = l.down(logit.clone(), dt);
        let st = l.epilogue(qk_out, &qk_at, e)?;
        jbody.extend(st);
    }
    let mut lg = match bias {
        Some(bv) => rnd(bin(BinOp::Add, logit, bv)),
        None => logit,
    };
    if let Some(c) = blocked {
        lg = Expr::select(c, neg_inf(cd), lg);
    }
    let lets = l.end_block(mb);
    jbody.extend(lets);
    let lt = l.elem_var("t", cd, false);
    jbody.push(Stmt::Let { var: lt, value: lg });
    if qk_mode == Some(2) {
        let e = l.down(Expr::Var(lt), dt);
        let st = l.epilogue(qk_out, &qk_at, e)?;
        jbody.extend(st);
    }
    jbody.push(Stmt::store(scores, vec![j.clone()], Expr::Var(lt)));
    jbody.push(Stmt::Assign {
        var: mx,
        value: bin(BinOp::Max, Expr::Var(mx), Expr::Var(lt)),
    });
    body.push(Stmt::for_(jv, t, jbody));
    // Pass 2: exponentials and their sum.
    let m0 = l.elem_var("t", cd, false);
    body.push(Stmt::Let {
        var: m0,
        value: Expr::select(
            bin(BinOp::Eq, Expr::Var(mx), neg_inf(cd)),
            lit(0.0, cd),
            Expr::Var(mx),
        ),
    });
    let sum = l.elem_var("acc", cd, true);
    body.push(Stmt::Let {
        var: sum,
        value: lit(0.0, cd),
    });
    let jv2 = l.loop_var("r", t);
    let e = l.elem_var("t", cd, false);
    body.push(Stmt::for_(
        jv2,
        t,
        vec![
            Stmt::Let {
                var: e,
                value: rnd(Expr::un(
                    UnOp::Exp,
                    rnd(bin(
                        BinOp::Sub,
                        Expr::Load(scores, vec![Expr::Var(jv2)]),
                        Expr::Var(m0),
                    )),
                )),
            },
            Stmt::store(scores, vec![Expr::Var(jv2)], Expr::Var(e)),
            Stmt::Assign {
                var: sum,
                value: bin(BinOp::Add, Expr::Var(sum), Expr::Var(e)),
            },
        ],
    ));
    let inv = l.elem_var("t", cd, false);
    let sr = rnd(Expr::Var(sum));
    body.push(Stmt::Let {
        var: inv,
        value: Expr::select(
            bin(BinOp::Eq, sr.clone(), lit(0.0, cd)),
            lit(0.0, cd),
            Expr::un(UnOp::Recip, sr),
        ),
    });
    // Pass 3: y = sum_j p_j v_j into the local row.
    let dz = l.loop_var("r", a.dv);
    body.push(Stmt::for_(
        dz,
        a.dv,
        vec![Stmt::store(yrow, vec![Expr::Var(dz)], lit(0.0, cd))],
    ));
    let jv3 = l.loop_var("r", t);
    let p = l.elem_var("t", cd, false);
    let dv3 = l.loop_var("r", a.dv);
    let mb = l.begin_block();
    let vv = kv_at(
        l,
        n,
        op,
        &a,
        2,
        b.clone(),
        kh.clone(),
        Expr::Var(jv3),
        Expr::Var(dv3),
    )
    .map(|e| l.up(e, dt));
    let mut vbody = l.end_block(mb);
    let vv = vv?;
    vbody.push(Stmt::store(
        yrow,
        vec![Expr::Var(dv3)],
        bin(
            BinOp::Add,
            Expr::Load(yrow, vec![Expr::Var(dv3)]),
            bin(BinOp::Mul, Expr::Var(p), vv),
        ),
    ));
    let mut pbody = vec![Stmt::Let {
        var: p,
        value: rnd(bin(
            BinOp::Mul,
            Expr::Load(scores, vec![Expr::Var(jv3)]),
            Expr::Var(inv),
        )),
    }];
    if qk_mode == Some(3) {
        let at = vec![b.clone(), h.clone(), i.clone(), Expr::Var(jv3)];
        let e = l.down(Expr::Var(p), dt);
        pbody.extend(l.epilogue(qk_out, &at, e)?);
    }
    pbody.push(Stmt::for_(dv3, a.dv, vbody));
    body.push(Stmt::for_(jv3, t, pbody));
    // Output row through the epilogue.
    let dout = l.loop_var("i", a.dv);
    let yi = head_idx(a.rank3, a.dv, b, h, i, Expr::Var(dout));
    let yv = l.down(Expr::Load(yrow, vec![Expr::Var(dout)]), dt);
    let mb = l.begin_block();
    let epi = l.epilogue(y, &yi, yv);
    let mut ob = l.end_block(mb);
    ob.extend(epi?);
    body.push(Stmt::for_(dout, a.dv, ob));
    let lets = l.end_block(m_outer);
    let mut inner = lets;
    inner.extend(body);
    Ok(Lowerer::nest(&loops, inner))
}

/// Rounding of a constant to a dtype's precision.
pub(crate) struct Tensor1;

impl Tensor1 {
    pub(crate) fn round(d: DType, x: f64) -> f64 {
        match tilec_ir::Tensor::from_f64s(d, vec![1], &[x]) {
            Ok(t) => t.to_f64_vec()[0],
            Err(_) => x,
        }
    }
}

#[allow(dead_code)]
fn _unused(_: Padding) {}
