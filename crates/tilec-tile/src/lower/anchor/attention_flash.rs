//! Flash-style attention (CPU): per (batch, query head, block of `bq` queries), a loop over
//! blocks of `bk` keys computing `S = Q·(K·scale)ᵀ` plus the mask into a `bq × bk` tile (a
//! [`Gemm`] whose epilogue adds the mask), an online softmax over the tile's rows (running
//! maximum and sum, the factor `exp(m_old - m_new)` that rescales the accumulator), and
//! `O = O·factor + P·V` (a second [`Gemm`] whose epilogue rescales); after the last key block
//! the output is `O / sum`, written through the group's epilogue. Memory grows with the
//! sequence (the tiles per thread and `Kᵀ`), not with its square as in `attention_gemm.rs`.
//!
//! The keys are first transposed and scaled into scratch (`[batch · kv heads, head dim,
//! keys]`, one pass), so that every tile's `B` operand packs with contiguous vector copies;
//! each block's queries are copied once into a local block that the micro-kernel reads in
//! place. The exponentials are `UnOp::ExpNeg` (their arguments are never positive). Causal
//! attention skips the key blocks wholly above the diagonal. Sequences that are not a
//! multiple of a block end with a smaller block (its own copy of the code: the gemms have
//! constant extents). The results are the two-product form's (a fully masked row gives
//! zeros, a NaN sum zeros with `zero_nan_rows`) up to rounding: the scale is applied to the
//! keys alone (not its square root to both operands) and the softmax is rescaled per block.

use tilec_ir::op::NnOp;
use tilec_ir::{DType, NodeId, Op};

use super::attention::{att_geom, head_idx, kv_at, logit_f32, Att};
use super::common::{neg_inf, round_to, val};
use super::matmul::gemm_vars;
use super::super::{bin, lit, Lowerer, R};
use crate::ir::*;

const F32: DType = DType::F32;

/// What every block of one (batch, head, query block) shares.
struct Ctx {
    a: Att,
    n: NodeId,
    op: Op,
    causal: bool,
    /// Softcapping (0: none) and the sliding window `(left, right)` (negative: unbounded).
    softcap: f64,
    window: (i64, i64),
    zero_nan_rows: bool,
    mask: Option<tilec_ir::ValueId>,
    y: tilec_ir::ValueId,
    bk: i64,
    b: Expr,
    h: Expr,
    kh: Expr,
    /// `(K·scale)ᵀ` in scratch, and its row `b·hkv + kh`.
    kt: BufId,
    kt_row: Expr,
    /// The block's queries `[bq, dh]`, the score tile `[bq, bk]`, the accumulator `[bq, dv]`,
    /// and per row the running maximum, the running sum and the last block's rescaling factor.
    qs: BufId,
    s: BufId,
    o: BufId,
    mx: BufId,
    sum: BufId,
    fac: BufId,
}

/// Lowers attention node `n` in the flash form with `bq × bk` tiles if its form allows (f32,
/// no past, per-batch lengths or requested `QK` output); `None` leaves it
/// to another lowering.
pub(crate) fn attention(l: &mut Lowerer, n: NodeId, op: &Op, bq: i64, bk: i64) -> R<Option<Vec<Stmt>>> {
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
    if bq < 1 || bk < 1 {
        return l.unsupported(n, format!("flash attention blocks of {bq} x {bk}"));
    }
    let a = att_geom(l, n, op)?;
    let node = l.node(n);
    let (q, y) = (node.inputs[0], node.outputs[0]);
    let extra_outputs = node.outputs[1..].iter().any(|&v| l.is_used(v));
    if *has_past
        || *has_nonpad
        || extra_outputs
        || l.dtype(q) != F32
        || l.dtype(y) != F32
        || a.past != 0
        || a.sq < 1
        || a.skv < 1
    {
        return Ok(None);
    }
    let bsz = l.shape(q)[0];
    // The whole scale on the keys: Q is then read in place by the micro-kernel.
    let sc = round_to(F32, scale.map(|s| s as f64).unwrap_or(1.0 / (a.dh as f64).sqrt()));
    let (bq, bk) = (bq.min(a.sq), bk.min(a.skv));
    let reps = a.hq / a.hkv;

    // K·scale transposed, once per (batch, kv head): rows of keys contiguous. By blocks of 16
    // keys, whose rows stay in L1 while every dimension is gathered from them (a whole
    // sequence's rows would not), then the keys past the last whole block.
    let kt = l.scratch(F32, vec![bsz * a.hkv, a.dh, a.skv]);
    let r = l.loop_var("i", bsz * a.hkv);
    let rb = l.simp(bin(BinOp::Div, Expr::Var(r), Expr::Int(a.hkv)));
    let rh = l.simp(bin(BinOp::Rem, Expr::Var(r), Expr::Int(a.hkv)));
    const KB: i64 = 16;
    let mut rbody = vec![];
    let part = |l: &mut Lowerer, blocks: i64, width: i64, first: i64| -> R<Stmt> {
        let (jb, d, jl) = (l.loop_var("i", blocks), l.loop_var("i", a.dh), l.loop_var("i", width));
        let j = l.simp(bin(BinOp::Add, bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(jb), Expr::Int(width)), Expr::Int(first)), Expr::Var(jl)));
        let mark = l.begin_block();
        let kv = kv_at(l, n, op, &a, 1, rb.clone(), rh.clone(), j.clone(), Expr::Var(d)).map(|e| l.up(e, F32));
        let mut body = l.end_block(mark);
        body.push(Stmt::store(kt, vec![Expr::Var(r), Expr::Var(d), j], bin(BinOp::Mul, kv?, lit(sc, F32))));
        Ok(Stmt::for_(jb, blocks, vec![Stmt::for_(d, a.dh, vec![Stmt::for_(jl, width, body)])]))
    };
    if a.skv / KB > 0 {
        rbody.push(part(l, a.skv / KB, KB, 0)?);
    }
    if a.skv % KB > 0 {
        rbody.push(part(l, 1, a.skv % KB, a.skv / KB * KB)?);
    }
    let transpose = Stmt::for_(r, bsz * a.hkv, rbody);

    // One iteration per (batch, query head, query block).
    let nqb = (a.sq + bq - 1) / bq;
    let t = l.loop_var("i", bsz * a.hq * nqb);
    let b = l.simp(bin(BinOp::Div, Expr::Var(t), Expr::Int(a.hq * nqb)));
    let h = l.simp(bin(BinOp::Rem, bin(BinOp::Div, Expr::Var(t), Expr::Int(nqb)), Expr::Int(a.hq)));
    let qb = l.simp(bin(BinOp::Rem, Expr::Var(t), Expr::Int(nqb)));
    let kh = l.simp(bin(BinOp::Div, h.clone(), Expr::Int(reps)));
    let kt_row = l.simp(bin(BinOp::Add, bin(BinOp::Mul, b.clone(), Expr::Int(a.hkv)), kh.clone()));
    let dv = a.dv;
    let c = Ctx {
        n,
        op: op.clone(),
        causal: *is_causal,
        softcap: *softcap as f64,
        window: (*left_window, *right_window),
        zero_nan_rows: *zero_nan_rows,
        mask: has_mask.then(|| node.inputs[3]),
        y,
        bk,
        b,
        h,
        kh,
        kt,
        kt_row,
        qs: l.scratch(F32, vec![bq, a.dh]),
        s: l.scratch(F32, vec![bq, bk]),
        o: l.scratch(F32, vec![bq, dv]),
        mx: l.scratch(F32, vec![bq]),
        sum: l.scratch(F32, vec![bq]),
        fac: l.scratch(F32, vec![bq]),
        a,
    };
    let mut body: Vec<Stmt> = [c.qs, c.s, c.o, c.mx, c.sum, c.fac].into_iter().map(Stmt::Alloc).collect();
    let full = c.a.sq / bq;
    let tail = c.a.sq % bq;
    let q0 = l.simp(bin(BinOp::Mul, qb.clone(), Expr::Int(bq)));
    let Some(main) = query_block(l, &c, q, bq, q0.clone())? else {
        return Ok(None);
    };
    if tail == 0 {
        body.extend(main);
    } else {
        // The last block is shorter (its own code: the gemms' extents are constants).
        let Some(last) = query_block(l, &c, q, tail, q0.clone())? else {
            return Ok(None);
        };
        body.push(Stmt::If { cond: bin(BinOp::Lt, qb, Expr::Int(full)), then_: main, else_: last });
    }
    // Y = O / sum, through the group's epilogue (zeros for a fully masked row, and for a NaN
    // sum with `zero_nan_rows`); one loop for every block, so that the output's index is one
    // expression of the iteration.
    let a = &c.a;
    let r = l.loop_var("i", bq);
    let rs = Expr::Load(c.sum, vec![Expr::Var(r)]);
    let inv = l.elem_var("t", F32, false);
    let invv = Expr::select(bin(BinOp::Eq, rs.clone(), lit(0.0, F32)), lit(0.0, F32), Expr::un(UnOp::Recip, rs.clone()));
    let mut row = vec![Stmt::Let { var: inv, value: invv }];
    let d = l.loop_var("i", a.dv);
    let qi = l.simp(bin(BinOp::Add, q0, Expr::Var(r)));
    let yi = head_idx(a.rank3, a.dv, c.b.clone(), c.h.clone(), qi.clone(), Expr::Var(d));
    let mut yv = bin(BinOp::Mul, Expr::Load(c.o, vec![Expr::Var(r), Expr::Var(d)]), Expr::Var(inv));
    if c.zero_nan_rows {
        // A NaN sum means a NaN or +inf logit: the whole row is zeros (its accumulator is NaN).
        let z = l.elem_var("t", DType::Bool, false);
        row.push(Stmt::Let { var: z, value: Expr::un(UnOp::IsNan, rs) });
        yv = Expr::select(Expr::Var(z), lit(0.0, F32), yv);
    }
    let mark = l.begin_block();
    let st = l.epilogue(c.y, &yi, yv);
    let mut db = l.end_block(mark);
    db.extend(st?);
    row.push(Stmt::for_(d, a.dv, db));
    if tail != 0 {
        row = vec![Stmt::If { cond: bin(BinOp::Lt, qi, Expr::Int(a.sq)), then_: row, else_: vec![] }];
    }
    body.push(Stmt::for_(r, bq, row));
    Ok(Some(vec![Stmt::Alloc(kt), transpose, Stmt::for_(t, bsz * c.a.hq * nqb, body)]))
}

/// The statements of one block of `rows` queries from `q0`: the accumulator's reset and
/// every key block.
fn query_block(l: &mut Lowerer, c: &Ctx, q: tilec_ir::ValueId, rows: i64, q0: Expr) -> R<Option<Vec<Stmt>>> {
    let a = &c.a;
    // The queries, copied once (the micro-kernel then reads their rows in place).
    let (i, dd) = (l.loop_var("i", rows), l.loop_var("i", a.dh));
    let mark = l.begin_block();
    let qi = bin(BinOp::Add, q0.clone(), Expr::Var(i));
    let qv = val(l, q, &head_idx(a.rank3, a.dh, c.b.clone(), c.h.clone(), qi, Expr::Var(dd)));
    let mut qb = l.end_block(mark);
    qb.push(Stmt::store(c.qs, vec![Expr::Var(i), Expr::Var(dd)], qv?));
    let mut out = vec![Stmt::for_(i, rows, vec![Stmt::for_(dd, a.dh, qb)])];
    let (i, dd) = (l.loop_var("i", rows), l.loop_var("i", a.dv));
    out.push(Stmt::for_(
        i,
        rows,
        vec![
            Stmt::store(c.mx, vec![Expr::Var(i)], neg_inf(F32)),
            Stmt::store(c.sum, vec![Expr::Var(i)], lit(0.0, F32)),
            Stmt::for_(dd, a.dv, vec![Stmt::store(c.o, vec![Expr::Var(i), Expr::Var(dd)], lit(0.0, F32))]),
        ],
    ));
    let full = a.skv / c.bk;
    if full > 0 {
        let kb = l.loop_var("i", full);
        let k0 = bin(BinOp::Mul, Expr::Var(kb), Expr::Int(c.bk));
        let Some(blk) = key_block(l, c, rows, q0.clone(), c.bk, k0)? else {
            return Ok(None);
        };
        out.push(Stmt::for_(kb, full, blk));
    }
    let tail = a.skv % c.bk;
    if tail > 0 {
        let Some(blk) = key_block(l, c, rows, q0.clone(), tail, Expr::Int(full * c.bk))? else {
            return Ok(None);
        };
        out.extend(blk);
    }
    Ok(Some(out))
}

/// One block of `cols` keys from `k0` against the `rows` queries from `q0`: the score tile,
/// the online softmax over its rows, the accumulator's update. Causal: skipped when every key
/// lies after every query.
fn key_block(l: &mut Lowerer, c: &Ctx, rows: i64, q0: Expr, cols: i64, k0: Expr) -> R<Option<Vec<Stmt>>> {
    let a = &c.a;
    let mut out = vec![];

    // S = Q (K scale)ᵀ + mask, blocked entries -inf.
    let g1 = gemm_vars(l, 1, rows, cols, a.dh, F32);
    let (i1, j1, k1) = (Expr::Var(g1.i), Expr::Var(g1.j), Expr::Var(g1.k));
    let (qi, kj) = (bin(BinOp::Add, q0.clone(), i1.clone()), bin(BinOp::Add, k0.clone(), j1.clone()));
    let qa = Expr::Load(c.qs, vec![i1.clone(), k1.clone()]);
    let kb = Expr::Load(c.kt, vec![c.kt_row.clone(), k1, l.simp(kj.clone())]);
    let mark = l.begin_block();
    let mask = c.mask.map(|mv| (mv, [c.b.clone(), c.h.clone(), qi.clone(), kj.clone()], a.skv));
    let logit = logit_f32(l, Expr::Var(g1.acc), c.softcap, mask, c.causal, c.window, qi, kj)?;
    let mut epi1 = l.end_block(mark);
    epi1.push(Stmt::store(c.s, vec![i1, j1], logit));
    out.push(g1.gemm(qa, kb, epi1));

    // Online softmax per row: the new maximum, P = exp(S - max) in place, the running sum
    // rescaled by exp(old max - new max), which the accumulator's update applies too.
    let r = l.loop_var("i", rows);
    let ri = Expr::Var(r);
    let at = |j: VarId| Expr::Load(c.s, vec![ri.clone(), Expr::Var(j)]);
    let old = l.elem_var("t", F32, false);
    let mx = l.elem_var("acc", F32, true);
    let mut row = vec![Stmt::Let { var: old, value: Expr::Load(c.mx, vec![ri.clone()]) }];
    row.extend(row_max(l, c.s, &ri, cols, mx));
    let m1 = l.elem_var("t", F32, false);
    row.push(Stmt::Let { var: m1, value: bin(BinOp::Max, Expr::Var(mx), Expr::Var(old)) });
    let m0 = l.elem_var("t", F32, false);
    row.push(Stmt::Let {
        var: m0,
        value: Expr::select(bin(BinOp::Eq, Expr::Var(m1), neg_inf(F32)), lit(0.0, F32), Expr::Var(m1)),
    });
    let sum = l.elem_var("acc", F32, true);
    let j3 = l.loop_var("r", cols);
    let e = l.elem_var("t", F32, false);
    row.push(Stmt::Let { var: sum, value: lit(0.0, F32) });
    row.push(Stmt::for_(
        j3,
        cols,
        vec![
            Stmt::Let { var: e, value: Expr::un(UnOp::ExpNeg, bin(BinOp::Sub, at(j3), Expr::Var(m0))) },
            Stmt::store(c.s, vec![ri.clone(), Expr::Var(j3)], Expr::Var(e)),
            Stmt::Assign { var: sum, value: bin(BinOp::Add, Expr::Var(sum), Expr::Var(e)) },
        ],
    ));
    let f = l.elem_var("t", F32, false);
    row.push(Stmt::Let { var: f, value: Expr::un(UnOp::ExpNeg, bin(BinOp::Sub, Expr::Var(old), Expr::Var(m0))) });
    let run = bin(BinOp::Mul, Expr::Load(c.sum, vec![ri.clone()]), Expr::Var(f));
    row.push(Stmt::store(c.sum, vec![ri.clone()], bin(BinOp::Add, run, Expr::Var(sum))));
    row.push(Stmt::store(c.mx, vec![ri.clone()], Expr::Var(m1)));
    row.push(Stmt::store(c.fac, vec![ri.clone()], Expr::Var(f)));
    out.push(Stmt::for_(r, rows, row));

    // O = O · factor + P V.
    let g2 = gemm_vars(l, 1, rows, a.dv, cols, F32);
    let (i2, j2, k2) = (Expr::Var(g2.i), Expr::Var(g2.j), Expr::Var(g2.k));
    let kk = bin(BinOp::Add, k0.clone(), k2.clone());
    let vb = l.without_cse(|l| kv_at(l, c.n, &c.op, a, 2, c.b.clone(), c.kh.clone(), kk, j2.clone()).map(|e| l.up(e, F32)))?;
    if !l.take_lets().is_empty() {
        return Ok(None);
    }
    let oij = vec![i2.clone(), j2.clone()];
    let upd = bin(
        BinOp::Add,
        bin(BinOp::Mul, Expr::Load(c.o, oij.clone()), Expr::Load(c.fac, vec![i2.clone()])),
        Expr::Var(g2.acc),
    );
    out.push(g2.gemm(Expr::Load(c.s, vec![i2, k2]), vb, vec![Stmt::store(c.o, oij, upd)]));
    if c.causal {
        // Some key of the block is at or before the block's last query.
        let live = bin(BinOp::Le, k0, l.simp(bin(BinOp::Add, q0, Expr::Int(rows - 1))));
        return Ok(Some(vec![Stmt::If { cond: live, then_: out, else_: vec![] }]));
    }
    Ok(Some(out))
}

/// Statements setting mutable `mx` to the maximum of row `ri` of the `cols` first columns of
/// `s`. Over whole blocks of 64 columns, four 16-wide partial maxima (independent chains, each
/// one vector instruction a step) reduced at the end, and a plain maximum: a NaN logit reaches
/// the row's sum through its exponential all the same, and a NaN sum gives NaN outputs (zeros
/// with `zero_nan_rows`). Otherwise the NaN-propagating maximum, which the schedule splits
/// into vector partials itself.
fn row_max(l: &mut Lowerer, s: BufId, ri: &Expr, cols: i64, mx: VarId) -> Vec<Stmt> {
    const W: i64 = 16;
    const U: i64 = 4;
    let at = |j: Expr| Expr::Load(s, vec![ri.clone(), j]);
    let max = |a: Expr, b: Expr| Expr::select(bin(BinOp::Gt, a.clone(), b.clone()), a, b);
    if cols % (W * U) != 0 {
        let j = l.loop_var("r", cols);
        return vec![
            Stmt::Let { var: mx, value: neg_inf(F32) },
            Stmt::for_(j, cols, vec![Stmt::Assign { var: mx, value: bin(BinOp::Max, Expr::Var(mx), at(Expr::Var(j))) }]),
        ];
    }
    let part = l.scratch(F32, vec![W * U]);
    let (i0, jo, u, jl, i2, u2, j3) = (
        l.loop_var("r", W * U),
        l.loop_var("r", cols / (W * U)),
        l.loop_var("r", U),
        l.loop_var("r", W),
        l.loop_var("r", W),
        l.loop_var("r", U - 1),
        l.loop_var("r", W),
    );
    let pi = l.simp(bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(u), Expr::Int(W)), Expr::Var(jl)));
    let col = l.simp(bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(jo), Expr::Int(W * U)), pi.clone()));
    let p = |e: Expr| Expr::Load(part, vec![e]);
    let upper = l.simp(bin(BinOp::Add, bin(BinOp::Mul, bin(BinOp::Add, Expr::Var(u2), Expr::Int(1)), Expr::Int(W)), Expr::Var(i2)));
    vec![
        Stmt::Alloc(part),
        Stmt::for_(i0, W * U, vec![Stmt::store(part, vec![Expr::Var(i0)], neg_inf(F32))]),
        Stmt::for_(
            jo,
            cols / (W * U),
            vec![Stmt::for_(u, U, vec![Stmt::for_(jl, W, vec![Stmt::store(part, vec![pi.clone()], max(at(col), p(pi.clone())))])])],
        ),
        Stmt::for_(u2, U - 1, vec![Stmt::for_(i2, W, vec![Stmt::store(part, vec![Expr::Var(i2)], max(p(upper.clone()), p(Expr::Var(i2))))])]),
        Stmt::Let { var: mx, value: neg_inf(F32) },
        Stmt::for_(j3, W, vec![Stmt::Assign { var: mx, value: max(p(Expr::Var(j3)), Expr::Var(mx)) }]),
    ]
}
