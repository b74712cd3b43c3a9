//! Row normalizations: per-row statistics, then each element from its input and them.

use tilec_ir::op::NormOp;
use tilec_ir::{DType, NodeId, Op, ValueId};

use super::common::{acc_dtype, accumulate, is_used, neg_inf, outer_space, row_loop, val};
use super::reduce::arg_better;
use super::super::{bin, compute_dtype, lit, lit_i, unravel, Lowerer, R};
use crate::ir::*;

pub(super) fn lower(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    match op {
        Op::Norm(no) => norm(l, n, no),
        _ => l.unsupported(n, "not a row normalization"),
    }
}

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
        _ => l.unsupported(n, "not a row normalization"),
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
