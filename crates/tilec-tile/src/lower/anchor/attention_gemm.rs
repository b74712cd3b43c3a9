//! Attention as matrix products (CPU): per (batch, query head), `S = (Q·s)(K·s)ᵀ` plus the
//! mask as a [`Gemm`] into scratch, a softmax along each row of `S` in place, and `Y = P·V`
//! as a second [`Gemm`] whose epilogue writes the output (and whatever the group fuses after
//! it). The direct lowering (`attention.rs`) walks one query row at a time with a dot product per
//! key, which vectorizes only along the head dimension; here both products run on the GEMM
//! template's register tiles.
//!
//! The same arithmetic as the direct form, in another order: `s = sqrt(scale)` is applied to
//! both operands, softcapping and the mask and windows follow, a fully masked row gives
//! zeros, `P = exp(S - max) / sum`. Used for f32 attention without past keys, per-batch
//! lengths or a requested `QK` output; anything else keeps the direct form.

use tilec_ir::op::NnOp;
use tilec_ir::{DType, NodeId, Op};

use super::attention::{att_geom, head_idx, kv_at, logit_f32};
use super::common::{neg_inf, round_to, val};
use super::matmul::gemm_vars;
use super::super::{bin, lit, Lowerer, R};
use crate::ir::*;

/// Lowers attention node `n` as two gemms if its form allows; `None` leaves it to the direct
/// lowering.
pub(crate) fn attention(l: &mut Lowerer, n: NodeId, op: &Op) -> R<Option<Vec<Stmt>>> {
    let Op::Nn(NnOp::Attention {
        scale,
        is_causal,
        softcap,
        left_window,
        right_window,
        has_mask,
        has_past,
        has_nonpad,
        zero_nan_rows,
        ..
    }) = op
    else {
        return Ok(None);
    };
    let a = att_geom(l, n, op)?;
    let node = l.node(n);
    let (q, y) = (node.inputs[0], node.outputs[0]);
    let extra_outputs = node.outputs[1..].iter().any(|&v| l.is_used(v));
    if *has_past
        || *has_nonpad
        || extra_outputs
        || l.dtype(q) != DType::F32
        || l.dtype(y) != DType::F32
        || a.past != 0
    {
        return Ok(None);
    }
    let mask = has_mask.then(|| node.inputs[3]);
    let f32 = DType::F32;
    let t = a.skv;
    let reps = a.hq / a.hkv;
    let bsz = l.shape(q)[0];
    let sc = round_to(f32, scale.map(|s| s as f64).unwrap_or(1.0 / (a.dh as f64).sqrt()).sqrt());

    // One iteration per (batch, query head).
    let bh = l.loop_var("i", bsz * a.hq);
    let b = l.simp(bin(BinOp::Div, Expr::Var(bh), Expr::Int(a.hq)));
    let h = l.simp(bin(BinOp::Rem, Expr::Var(bh), Expr::Int(a.hq)));
    let kh = l.simp(bin(BinOp::Div, h.clone(), Expr::Int(reps)));
    let sbuf = l.scratch(f32, vec![a.sq, t]);
    let mut body = vec![Stmt::Alloc(sbuf)];

    // S = (Q s)(K s)ᵀ + mask, blocked entries -inf.
    let g1 = gemm_vars(l, 1, a.sq, t, a.dh, f32);
    let (i1, j1, k1) = (Expr::Var(g1.i), Expr::Var(g1.j), Expr::Var(g1.k));
    let (qa, kb) = l.without_cse(|l| {
        let qa = val(l, q, &head_idx(a.rank3, a.dh, b.clone(), h.clone(), i1.clone(), k1.clone()));
        (qa, kv_at(l, n, op, &a, 1, b.clone(), kh.clone(), j1.clone(), k1.clone()).map(|e| l.up(e, f32)))
    });
    let (qa, kb) = (qa?, kb?);
    if !l.take_lets().is_empty() {
        return Ok(None);
    }
    let mark = l.begin_block();
    let bhij = [b.clone(), h.clone(), i1.clone(), j1.clone()];
    let logit = logit_f32(l, Expr::Var(g1.acc), *softcap as f64, mask.map(|mv| (mv, bhij, t)), *is_causal, (*left_window, *right_window), i1.clone(), j1.clone())?;
    let mut epi1 = l.end_block(mark);
    epi1.push(Stmt::store(sbuf, vec![i1.clone(), j1.clone()], logit));
    body.push(g1.gemm(bin(BinOp::Mul, qa, lit(sc, f32)), bin(BinOp::Mul, kb, lit(sc, f32)), epi1));

    // Row softmax in place: P = exp(S - max) / sum (zeros where the whole row is masked).
    let r = l.loop_var("i", a.sq);
    let ri = Expr::Var(r);
    let mx = l.elem_var("acc", f32, true);
    let j2 = l.loop_var("r", t);
    let mut row = vec![
        Stmt::Let { var: mx, value: neg_inf(f32) },
        Stmt::for_(
            j2,
            t,
            vec![Stmt::Assign {
                var: mx,
                value: bin(BinOp::Max, Expr::Var(mx), Expr::Load(sbuf, vec![ri.clone(), Expr::Var(j2)])),
            }],
        ),
    ];
    let m0 = l.elem_var("t", f32, false);
    row.push(Stmt::Let {
        var: m0,
        value: Expr::select(bin(BinOp::Eq, Expr::Var(mx), neg_inf(f32)), lit(0.0, f32), Expr::Var(mx)),
    });
    let sum = l.elem_var("acc", f32, true);
    let j3 = l.loop_var("r", t);
    let e = l.elem_var("t", f32, false);
    row.push(Stmt::Let { var: sum, value: lit(0.0, f32) });
    row.push(Stmt::for_(
        j3,
        t,
        vec![
            Stmt::Let {
                var: e,
                value: Expr::un(UnOp::Exp, bin(BinOp::Sub, Expr::Load(sbuf, vec![ri.clone(), Expr::Var(j3)]), Expr::Var(m0))),
            },
            Stmt::store(sbuf, vec![ri.clone(), Expr::Var(j3)], Expr::Var(e)),
            Stmt::Assign { var: sum, value: bin(BinOp::Add, Expr::Var(sum), Expr::Var(e)) },
        ],
    ));
    let inv = l.elem_var("t", f32, false);
    row.push(Stmt::Let {
        var: inv,
        value: Expr::select(bin(BinOp::Eq, Expr::Var(sum), lit(0.0, f32)), lit(0.0, f32), Expr::un(UnOp::Recip, Expr::Var(sum))),
    });
    let j4 = l.loop_var("i", t);
    let mut pv = bin(BinOp::Mul, Expr::Load(sbuf, vec![ri.clone(), Expr::Var(j4)]), Expr::Var(inv));
    if *zero_nan_rows {
        // A NaN sum means a NaN or +inf logit: the whole row becomes zeros.
        let z = l.elem_var("t", DType::Bool, false);
        row.push(Stmt::Let { var: z, value: Expr::un(UnOp::IsNan, Expr::Var(sum)) });
        pv = Expr::select(Expr::Var(z), lit(0.0, f32), pv);
    }
    row.push(Stmt::for_(j4, t, vec![Stmt::store(sbuf, vec![ri.clone(), Expr::Var(j4)], pv)]));
    body.push(Stmt::for_(r, a.sq, row));

    // Y = P V, written through the group's epilogue.
    let g2 = gemm_vars(l, 1, a.sq, a.dv, t, f32);
    let (i2, j2, k2) = (Expr::Var(g2.i), Expr::Var(g2.j), Expr::Var(g2.k));
    let vb = l.without_cse(|l| kv_at(l, n, op, &a, 2, b.clone(), kh, k2.clone(), j2.clone()).map(|e| l.up(e, f32)));
    let vb = vb?;
    if !l.take_lets().is_empty() {
        return Ok(None);
    }
    let mark = l.begin_block();
    let yi = head_idx(a.rank3, a.dv, b, h, i2.clone(), j2);
    let st = l.epilogue(y, &yi, Expr::Var(g2.acc));
    let mut epi2 = l.end_block(mark);
    epi2.extend(st?);
    body.push(g2.gemm(Expr::Load(sbuf, vec![i2, k2]), vb, epi2));
    Ok(Some(vec![Stmt::for_(bh, bsz * a.hq, body)]))
}
