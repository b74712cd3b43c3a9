//! Attention, one query row at a time: the scores row in a local buffer, a softmax over it,
//! and the weighted sum of values into a local output row. `attention_gemm.rs` has the form
//! as two matrix products.

use tilec_ir::op::NnOp;
use tilec_ir::{DType, NodeId, Op, ValueId};

use super::common::{neg_inf, round_to, val};
use super::super::{bin, compute_dtype, lit, AttentionAlgo, Fail, Lowerer, R};
use crate::ir::*;

pub(super) struct Att {
    pub rank3: bool,
    pub hq: i64,
    pub hkv: i64,
    pub sq: i64,
    pub skv: i64,
    pub past: i64,
    pub dh: i64,
    pub dv: i64,
}

pub(super) fn att_geom(l: &Lowerer, n: NodeId, op: &Op) -> R<Att> {
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
    let node = l.node(n);
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
pub(super) fn head_idx(rank3: bool, dsz: i64, b: Expr, h: Expr, s: Expr, d: Expr) -> Vec<Expr> {
    if rank3 {
        vec![b, s, bin(BinOp::Add, bin(BinOp::Mul, h, Expr::Int(dsz)), d)]
    } else {
        vec![b, h, s, d]
    }
}

/// K (which = 1) or V (which = 2) with the past prepended, at (b, kh, j, d).
pub(super) fn kv_at(
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
    let node = l.node(n);
    let cur = node.inputs[which];
    let dsz = if which == 1 { a.dh } else { a.dv };
    if a.past == 0 {
        return l.value_at(cur, &head_idx(a.rank3, dsz, b, kh, j, d));
    }
    let pv = node.inputs[3 + usize::from(*has_mask) + which - 1];
    let j = l.simp(j);
    if let Some((lo, hi)) = l.range_of(&j) {
        if hi < a.past {
            return l.value_at(pv, &[b, kh, j, d]);
        }
        if lo >= a.past {
            let jj = bin(BinOp::Sub, j, Expr::Int(a.past));
            return l.value_at(cur, &head_idx(a.rank3, dsz, b, kh, jj, d));
        }
    }
    let (p, c) = l.guarded(true, |l| {
        let p = l.value_at(pv, &[b.clone(), kh.clone(), j.clone(), d.clone()]);
        let jc = bin(BinOp::Sub, j.clone(), Expr::Int(a.past));
        (p, l.value_at(cur, &head_idx(a.rank3, dsz, b, kh, jc, d)))
    });
    Ok(Expr::select(bin(BinOp::Lt, j, Expr::Int(a.past)), p?, c?))
}

/// The additive mask of attention at `bhij` = [b, h, i, j] (broadcast from the mask's shape;
/// a boolean mask is 0 or -inf; keys past a mask shorter than the `t` keys are -inf).
pub(super) fn mask_bias(l: &mut Lowerer, mv: ValueId, bhij: [Expr; 4], t: i64, cd: DType) -> R<Expr> {
    let ms = l.shape(mv);
    let off = 4 - ms.len();
    let mi: Vec<Expr> = ms
        .iter()
        .enumerate()
        .map(|(k, &dsz)| if dsz == 1 { Expr::Int(0) } else { bhij[off + k].clone() })
        .collect();
    let last = ms[ms.len() - 1];
    let guarded = last < t;
    let m = l.guarded(guarded, |l| l.value_at(mv, &mi))?;
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

/// The logit of query `qi` and key `kj` (no past keys) from their scaled score `s` in f32:
/// softcapped (`cap * tanh(s / cap)`, `cap` 0: none), plus the mask `[b, h, i, j]` over `t`
/// keys, -inf where causality or the window `(left, right)` (negative: unbounded) blocks the
/// key, as the reference orders them.
pub(super) fn logit_f32(
    l: &mut Lowerer,
    s: Expr,
    cap: f64,
    mask: Option<(ValueId, [Expr; 4], i64)>,
    causal: bool,
    window: (i64, i64),
    qi: Expr,
    kj: Expr,
) -> R<Expr> {
    let f32 = DType::F32;
    let mut logit = s;
    if cap > 0.0 {
        let c = round_to(f32, cap);
        logit = bin(BinOp::Mul, lit(c, f32), Expr::un(UnOp::Tanh, bin(BinOp::Div, logit, lit(c, f32))));
    }
    if let Some((mv, bhij, t)) = mask {
        logit = bin(BinOp::Add, logit, mask_bias(l, mv, bhij, t, f32)?);
    }
    let mut blocked = vec![];
    if causal {
        blocked.push(bin(BinOp::Gt, kj.clone(), qi.clone()));
    }
    if window.0 >= 0 {
        // i - j > left
        blocked.push(bin(BinOp::Gt, qi.clone(), bin(BinOp::Add, kj.clone(), Expr::Int(window.0))));
    }
    if window.1 >= 0 {
        // j - i > right
        blocked.push(bin(BinOp::Gt, kj, bin(BinOp::Add, qi, Expr::Int(window.1))));
    }
    Ok(match blocked.into_iter().reduce(|a, b| bin(BinOp::Or, a, b)) {
        Some(c) => Expr::select(c, neg_inf(f32), logit),
        None => logit,
    })
}

/// present_key / present_value (outputs 1 and 2) at `idx` = [b, h, t, d].
pub(crate) fn attention_present(l: &mut Lowerer, n: NodeId, out: usize, idx: &[Expr]) -> R<Expr> {
    let op = l.node(n).op.clone();
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

pub(super) fn attention(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Vec<Stmt>> {
    const FORMS: &str = "f32 attention without past, per-batch lengths or a requested QK output";
    match l.opts().attention {
        AttentionAlgo::Gemm => {
            return super::attention_gemm::attention(l, n, op)?
                .ok_or_else(|| Fail::Unsupported(n, format!("attention as matrix products needs {FORMS}")));
        }
        AttentionAlgo::Flash { bq, bk } => {
            return super::attention_flash::attention(l, n, op, bq, bk)?
                .ok_or_else(|| Fail::Unsupported(n, format!("flash-style attention needs {FORMS}")));
        }
        AttentionAlgo::Rows => {}
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
        zero_nan_rows,
        ..
    }) = op
    else {
        return l.unsupported(n, "not attention");
    };
    let a = att_geom(l, n, op)?;
    let node = l.node(n);
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
    let qk_mode = if l.is_used(qk_out) {
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
    let sc = round_to(dt, sc);
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
    // A row whose sum is NaN has a NaN or +inf logit: with `zero_nan_rows` its
    // probabilities are zeros (every one of them is NaN otherwise).
    let nan_row = zero_nan_rows.then(|| {
        let z = l.elem_var("t", DType::Bool, false);
        body.push(Stmt::Let {
            var: z,
            value: Expr::un(UnOp::IsNan, sr.clone()),
        });
        z
    });
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
    let mut pv = rnd(bin(
        BinOp::Mul,
        Expr::Load(scores, vec![Expr::Var(jv3)]),
        Expr::Var(inv),
    ));
    if let Some(z) = nan_row {
        pv = Expr::select(Expr::Var(z), lit(0.0, cd), pv);
    }
    let mut pbody = vec![Stmt::Let { var: p, value: pv }];
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

