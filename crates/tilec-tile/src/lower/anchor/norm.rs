//! Row normalizations as data. Each op is a [`RowOp`]: the rows it normalizes, the
//! statistics of a row (each a fold over the row, or the position of its maximum) and the
//! map from an input element and the statistics to the output element. [`lower_rows`]
//! builds every one the same way: a nest over the rows, one pass over the row per
//! statistic, then a loop over the row storing each element through the epilogue.

use tilec_ir::op::NormOp;
use tilec_ir::{DType, NodeId, Op, ValueId};

use super::common::{acc_dtype, accumulate, outer_space, row_loop, val};
use super::reduce::arg_pass;
use super::super::{bin, lit, Lowerer, R};
use crate::ir::*;

/// A row normalization.
struct RowOp {
    node: NodeId,
    x: ValueId,
    y: ValueId,
    /// The index space: `x`'s shape, or a view of it (see `groups`).
    shape: Vec<i64>,
    /// The dimensions of `shape` a row spans, with their extents.
    row: Vec<(usize, i64)>,
    /// Group norm's view `[N, G, Cg, *S]` of `x: [N, C, *S]`: the channels per group `Cg`.
    /// A row spans `Cg` and `S` as loops of their own, so that `x` is read at
    /// `[n, g * Cg + c, *s]` with no division and the innermost loop runs along `x`'s
    /// contiguous spatial dimension.
    groups: Option<i64>,
    /// A channels-last group norm: the view is `[N, G, *S, Cg]` of `x: [N, *S, C]`, read at
    /// `[n, *s, g * Cg + c]` (the channels innermost), and per-channel parameters follow
    /// `x`'s last axis.
    channels_last: bool,
    stats: Vec<Stat>,
    /// The output element, in the compute dtype (rounded to `y`'s), or directly in `y`'s
    /// dtype when `exact`.
    map: Ex,
    exact: bool,
    scale: Option<(ValueId, Param)>,
    bias: Option<(ValueId, Param)>,
    /// Statistics that are outputs too, stored once per row: (output, statistic).
    stat_outputs: Vec<(ValueId, usize)>,
}

/// A statistic of a row.
enum Stat {
    /// The accumulator starts at `init` and becomes `step` at each element; the statistic is
    /// `finish` of it.
    Fold { init: f64, step: Ex, finish: Ex },
    /// The position of the row's first maximum.
    ArgMax,
}

/// Where a scale or bias is read for an element of `x`.
#[derive(Copy, Clone)]
enum Param {
    /// Broadcast to `x` (numpy rules).
    Broadcast,
    /// Per channel (dimension 1, or the last one of a channels-last op).
    Channel,
}

/// An expression of a description, evaluated at one element of a row.
enum Ex {
    /// The input element.
    X,
    /// The accumulator of the fold being built.
    Acc,
    /// An earlier statistic.
    Stat(usize),
    /// The number of elements of a row.
    Count,
    Lit(f64),
    Scale,
    Bias,
    /// The element's position along the row (one axis), as an `i64`.
    Pos,
    /// The square of the operand, computed once.
    Sq(Box<Ex>),
    Un(UnOp, Box<Ex>),
    Bin(BinOp, Box<Ex>, Box<Ex>),
    Select(Box<Ex>, Box<Ex>, Box<Ex>),
}

fn un(op: UnOp, a: Ex) -> Ex {
    Ex::Un(op, Box::new(a))
}
fn op2(op: BinOp, a: Ex, b: Ex) -> Ex {
    Ex::Bin(op, Box::new(a), Box::new(b))
}
fn add(a: Ex, b: Ex) -> Ex {
    op2(BinOp::Add, a, b)
}
fn sub(a: Ex, b: Ex) -> Ex {
    op2(BinOp::Sub, a, b)
}
fn mul(a: Ex, b: Ex) -> Ex {
    op2(BinOp::Mul, a, b)
}
fn div(a: Ex, b: Ex) -> Ex {
    op2(BinOp::Div, a, b)
}
fn sq(a: Ex) -> Ex {
    Ex::Sq(Box::new(a))
}
fn select(c: Ex, a: Ex, b: Ex) -> Ex {
    Ex::Select(Box::new(c), Box::new(a), Box::new(b))
}
fn fold(init: f64, step: Ex, finish: Ex) -> Stat {
    Stat::Fold { init, step, finish }
}

/// The mean of the row.
fn mean() -> Stat {
    fold(0.0, add(Ex::Acc, Ex::X), div(Ex::Acc, Ex::Count))
}

/// `1 / sqrt(variance + eps)` about the mean (statistic 0).
fn inv_std(eps: f64) -> Stat {
    let var = div(Ex::Acc, Ex::Count);
    fold(0.0, add(Ex::Acc, sq(sub(Ex::X, Ex::Stat(0)))), un(UnOp::Rsqrt, add(var, Ex::Lit(eps))))
}

/// The softmax statistics: the maximum, then `finish` of the sum of `exp(x - max)`.
fn softmax_stats(finish: UnOp) -> Vec<Stat> {
    vec![
        fold(f64::NEG_INFINITY, op2(BinOp::Max, Ex::Acc, Ex::X), Ex::Acc),
        fold(0.0, add(Ex::Acc, un(UnOp::Exp, sub(Ex::X, Ex::Stat(0)))), un(finish, Ex::Acc)),
    ]
}

/// The description of normalization `n`.
fn describe(l: &Lowerer, n: NodeId, no: &NormOp) -> R<RowOp> {
    let node = l.node(n);
    let (x, y) = (node.inputs[0], node.outputs[0]);
    let xs = l.shape(x);
    let axis_row = |a: usize| vec![(a, xs[a])];
    let tail_row = |a: usize| (a..xs.len()).map(|d| (d, xs[d])).collect::<Vec<_>>();
    let mut op = RowOp {
        node: n,
        x,
        y,
        shape: xs.clone(),
        row: Vec::new(),
        groups: None,
        channels_last: false,
        stats: Vec::new(),
        map: Ex::X,
        exact: false,
        scale: None,
        bias: None,
        stat_outputs: Vec::new(),
    };
    // (x - mean) * inv_std * scale
    let standardized = || mul(mul(sub(Ex::X, Ex::Stat(0)), Ex::Stat(1)), Ex::Scale);
    match no {
        NormOp::Softmax { axis } => {
            op.row = axis_row(*axis);
            op.stats = softmax_stats(UnOp::Recip);
            op.map = mul(un(UnOp::Exp, sub(Ex::X, Ex::Stat(0))), Ex::Stat(1));
        }
        NormOp::LogSoftmax { axis } => {
            op.row = axis_row(*axis);
            op.stats = softmax_stats(UnOp::Log);
            op.map = sub(sub(Ex::X, Ex::Stat(0)), Ex::Stat(1));
        }
        NormOp::Hardmax { axis } => {
            op.row = axis_row(*axis);
            op.stats = vec![Stat::ArgMax];
            op.map = select(op2(BinOp::Eq, Ex::Pos, Ex::Stat(0)), Ex::Lit(1.0), Ex::Lit(0.0));
            op.exact = true;
        }
        NormOp::LayerNorm { axis, epsilon, has_bias, .. } => {
            op.row = tail_row(*axis);
            op.stats = vec![mean(), inv_std(*epsilon as f64)];
            op.scale = Some((node.inputs[1], Param::Broadcast));
            op.map = standardized();
            if *has_bias {
                op.bias = Some((node.inputs[2], Param::Broadcast));
                op.map = add(op.map, Ex::Bias);
            }
            for k in 0..2 {
                if l.is_used(node.outputs[k + 1]) {
                    op.stat_outputs.push((node.outputs[k + 1], k));
                }
            }
        }
        NormOp::RmsNorm { axis, epsilon } => {
            op.row = tail_row(*axis);
            let inv_rms = un(UnOp::Rsqrt, add(div(Ex::Acc, Ex::Count), Ex::Lit(*epsilon as f64)));
            op.stats = vec![fold(0.0, add(Ex::Acc, sq(Ex::X)), inv_rms)];
            op.scale = Some((node.inputs[1], Param::Broadcast));
            op.map = mul(mul(Ex::X, Ex::Stat(0)), Ex::Scale);
        }
        NormOp::InstanceNorm { epsilon } | NormOp::GroupNorm { epsilon, .. } => {
            let groups = match no {
                NormOp::GroupNorm { num_groups, .. } => *num_groups as i64,
                _ => xs[1],
            };
            op.channels_last = no.is_channels_last();
            let c = if op.channels_last { xs[xs.len() - 1] } else { xs[1] };
            if groups == 0 || c % groups != 0 {
                return l.unsupported(n, "channels do not divide into groups");
            }
            let cpg = c / groups;
            if op.channels_last {
                op.shape = vec![xs[0], groups];
                op.shape.extend_from_slice(&xs[1..xs.len() - 1]);
                op.shape.push(cpg);
                op.row = (2..op.shape.len()).map(|d| (d, op.shape[d])).collect();
                op.groups = Some(cpg);
            } else if cpg == 1 && xs.len() > 2 {
                // One channel per group: rows over the spatial dimensions of `x` itself.
                op.row = tail_row(2);
            } else {
                op.shape = vec![xs[0], groups, cpg];
                op.shape.extend_from_slice(&xs[2..]);
                op.row = (2..op.shape.len()).map(|d| (d, op.shape[d])).collect();
                op.groups = Some(cpg);
            }
            op.stats = vec![mean(), inv_std(*epsilon as f64)];
            op.scale = Some((node.inputs[1], Param::Channel));
            op.bias = Some((node.inputs[2], Param::Channel));
            op.map = add(standardized(), Ex::Bias);
        }
        NormOp::LpNorm { axis, p } => {
            op.row = axis_row(*axis);
            op.stats = vec![if *p == 1 {
                fold(0.0, add(Ex::Acc, un(UnOp::Abs, Ex::X)), Ex::Acc)
            } else {
                fold(0.0, add(Ex::Acc, sq(Ex::X)), un(UnOp::Sqrt, Ex::Acc))
            }];
            // Zero norms give 0.
            let zero = op2(BinOp::Eq, Ex::Stat(0), Ex::Lit(0.0));
            op.map = select(zero, Ex::Lit(0.0), div(Ex::X, Ex::Stat(0)));
        }
        NormOp::MeanVarianceNorm { axes } => {
            op.row = axes.iter().map(|&a| (a, xs[a])).collect();
            let std = un(UnOp::Sqrt, div(Ex::Acc, Ex::Count));
            let var_sum = add(Ex::Acc, sq(sub(Ex::X, Ex::Stat(0))));
            op.stats = vec![mean(), fold(0.0, var_sum, add(std, Ex::Lit(1e-9)))];
            op.map = div(sub(Ex::X, Ex::Stat(0)), Ex::Stat(1));
        }
        NormOp::BatchNorm { .. } | NormOp::Lrn { .. } | NormOp::NllLoss { .. } => {
            return l.unsupported(n, "not a row normalization")
        }
    }
    Ok(op)
}

pub(super) fn lower(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    let Op::Norm(no) = op else {
        return l.unsupported(n, "not a row normalization");
    };
    let desc = describe(l, n, no)?;
    lower_rows(l, &desc)
}

/// Where a description is evaluated: the index of `x` (and of the index space), the
/// accumulator, the statistics so far, the dtype of literals.
struct At<'a> {
    xi: &'a [Expr],
    vi: &'a [Expr],
    acc: Option<&'a Expr>,
    stats: &'a [Expr],
    dt: DType,
    /// The input element once read.
    x: Option<Expr>,
}

impl RowOp {
    /// The index of `x` at index `vi` of the index space.
    fn x_index(&self, vi: &[Expr]) -> Vec<Expr> {
        let Some(cpg) = self.groups else {
            return vi.to_vec();
        };
        if self.channels_last {
            let last = vi.len() - 1;
            let ch = bin(BinOp::Add, bin(BinOp::Mul, vi[1].clone(), Expr::Int(cpg)), vi[last].clone());
            let mut v = vec![vi[0].clone()];
            v.extend_from_slice(&vi[2..last]);
            v.push(ch);
            return v;
        }
        let ch = bin(BinOp::Add, bin(BinOp::Mul, vi[1].clone(), Expr::Int(cpg)), vi[2].clone());
        let mut v = vec![vi[0].clone(), ch];
        v.extend_from_slice(&vi[3..]);
        v
    }

    /// The axis of a row along one axis.
    fn axis(&self, l: &Lowerer) -> R<usize> {
        match self.row[..] {
            [(axis, _)] => Ok(axis),
            _ => l.unsupported(self.node, "a row position along several axes"),
        }
    }

    fn count(&self) -> i64 {
        self.row.iter().map(|r| r.1).product()
    }

    fn param(&self, l: &mut Lowerer, p: Option<(ValueId, Param)>, xi: &[Expr]) -> R<Expr> {
        let Some((v, how)) = p else {
            return l.unsupported(self.node, "a row map reads a parameter the op lacks");
        };
        let idx = match how {
            Param::Broadcast => l.bcast_idx(v, xi),
            Param::Channel if self.channels_last => vec![xi[xi.len() - 1].clone()],
            Param::Channel => vec![xi[1].clone()],
        };
        val(l, v, &idx)
    }

    fn eval(&self, l: &mut Lowerer, e: &Ex, at: &mut At) -> R<Expr> {
        Ok(match e {
            Ex::X => match &at.x {
                Some(x) => x.clone(),
                None => {
                    let x = val(l, self.x, at.xi)?;
                    at.x = Some(x.clone());
                    x
                }
            },
            Ex::Acc => match at.acc {
                Some(a) => a.clone(),
                None => return l.unsupported(self.node, "a row map reads an accumulator"),
            },
            Ex::Stat(k) => match at.stats.get(*k) {
                Some(s) => s.clone(),
                None => return l.unsupported(self.node, "a row statistic read before it is computed"),
            },
            Ex::Count => lit(self.count() as f64, at.dt),
            Ex::Lit(v) => lit(*v, at.dt),
            Ex::Scale => self.param(l, self.scale, at.xi)?,
            Ex::Bias => self.param(l, self.bias, at.xi)?,
            Ex::Pos => Expr::cast(DType::I64, at.vi[self.axis(l)?].clone()),
            Ex::Sq(a) => {
                let v = self.eval(l, a, at)?;
                let v = l.reuse(v, at.dt);
                bin(BinOp::Mul, v.clone(), v)
            }
            Ex::Un(op, a) => Expr::un(*op, self.eval(l, a, at)?),
            Ex::Bin(op, a, b) => {
                let a = self.eval(l, a, at)?;
                bin(*op, a, self.eval(l, b, at)?)
            }
            Ex::Select(c, a, b) => {
                let c = self.eval(l, c, at)?;
                let a = self.eval(l, a, at)?;
                Expr::select(c, a, self.eval(l, b, at)?)
            }
        })
    }

    /// The passes over the row at `base` (row dimensions 0): their statements and the
    /// statistics. Statistic outputs are stored here.
    fn passes(&self, l: &mut Lowerer, base: &[Expr]) -> R<(Vec<Stmt>, Vec<Expr>)> {
        let ad = acc_dtype(l.dtype(self.x));
        let mut st = Vec::new();
        let mut stats: Vec<Expr> = Vec::new();
        for s in &self.stats {
            match s {
                Stat::Fold { init, step, finish } => {
                    let init = vec![(ad, lit(*init, ad))];
                    let (s1, acc) = accumulate(l, &self.row, base, init, &mut |l, vi, a| {
                        let xi = self.x_index(vi);
                        let mut at = At { xi: &xi, vi, acc: Some(&a[0]), stats: &stats, dt: ad, x: None };
                        Ok(vec![self.eval(l, step, &mut at)?])
                    })?;
                    st.extend(s1);
                    let acc = Some(&acc[0]);
                    let mut at = At { xi: base, vi: base, acc, stats: &stats, dt: ad, x: None };
                    let f = self.eval(l, finish, &mut at)?;
                    let f = l.hoist(f, ad);
                    st.extend(l.take_lets());
                    stats.push(f);
                }
                Stat::ArgMax => {
                    let axis = self.axis(l)?;
                    let ext = self.shape[axis];
                    let (s1, acc) = arg_pass(l, self.x, axis, ext, base, true, false)?;
                    st.extend(s1);
                    stats.push(acc[1].clone());
                }
            }
        }
        for &(v, k) in &self.stat_outputs {
            let e = Expr::cast(l.dtype(v), stats[k].clone());
            st.extend(l.epilogue(v, base, e)?);
        }
        Ok((st, stats))
    }
}

/// The loop nest of a row normalization.
fn lower_rows(l: &mut Lowerer, op: &RowOp) -> R<Vec<Stmt>> {
    let row_dims: Vec<usize> = op.row.iter().map(|r| r.0).collect();
    let (loops, base) = outer_space(l, &op.shape, &row_dims);
    let d = l.dtype(op.x);
    let cd = acc_dtype(d);
    let m = l.begin_block();
    let res = (|| -> R<Vec<Stmt>> {
        let (mut body, stats) = op.passes(l, &base)?;
        body.extend(l.take_lets());
        let elems = row_loop(l, &op.row, &base, &mut |l, vi| {
            let xi = match op.groups {
                Some(_) => op.x_index(vi).into_iter().map(|e| l.simp(e)).collect(),
                None => vi.to_vec(),
            };
            let dt = if op.exact { d } else { cd };
            let mut at = At { xi: &xi, vi, acc: None, stats: &stats, dt, x: None };
            let e = op.eval(l, &op.map, &mut at)?;
            let e = if op.exact { e } else { l.down(e, d) };
            let mut out = l.take_lets();
            out.extend(l.epilogue(op.y, &xi, e)?);
            Ok(out)
        })?;
        body.extend(elems);
        Ok(body)
    })();
    let mut inner = l.end_block(m);
    inner.extend(res?);
    Ok(Lowerer::nest(&loops, inner))
}
