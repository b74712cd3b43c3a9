//! Winograd F(m×m, 3×3) lowering of channels-last 3×3 stride-1 convolutions, m = 2 or 4,
//! dilated ones as one such convolution per phase (below).
//!
//! Each m×m block of output pixels (a *tile*) is computed from the a×a input patch under it
//! (a = m + 2): `Y = Aᵀ [U ⊙ V] A` with `V = Bᵀ d B` (the input transform of patch `d`, per
//! input channel) and `U = G g Gᵀ` (the filter transform of `g`, per output and input
//! channel), where the products `U ⊙ V` summed over input channels are a² matrix products,
//! one per position of the transformed tile: `M[ab] = V[ab] · U[ab]` (`tiles × C` by `C × M`).
//! F(2×2) spends 16 multiply-adds per output and input channel on 4 outputs, F(4×4) 36 on 16,
//! against 9 per output directly: 2.25 and 4 times less arithmetic, at the price of the
//! transforms (linear in the channels) and of different rounding: the transforms reassociate
//! the sums and scale them (by up to 5 and 8 in F(4×4)), so results differ from the direct
//! sums by about 1e-5 of the outputs' magnitude in f32 (`CompileOptions::winograd` off, or
//! `tilec run --no-winograd`, computes them directly). F(4×4) is used where its tiles cover
//! the output with little padding, F(2×2) elsewhere (14×14 or 13×13 maps).
//!
//! The kernel: for blocks of tile rows (small enough that the transformed inputs and products
//! of a block stay in L2), the input transform writes `V[a², tiles, C]` (vectorized along the
//! channels), a batched [`Gemm`] writes `M[a², tiles, M]` (its `A` is read in place, its `B`,
//! the filter transform, is an expression of the weights that the CPU packs once), and the
//! output transform reads `M`, adds the bias and runs the group's epilogue per output pixel.
//! Blocks are independent; with one block, each step is parallel by itself.
//!
//! Used where the lowering is asked to ([`LowerOptions::winograd`], the CPU) and the conv has
//! enough channels for the products to be efficient; everything else stays a direct GEMM.

use tilec_ir::op::Window;
use tilec_ir::{DType, NodeId};

use super::common::val;
use super::matmul::gemm_vars;
use super::super::{bin, lit, Lowerer, R};
use crate::ir::*;

/// One variant F(m×m, 3×3): output tiles of `m × m` from input patches of `a × a`, `a = m + 2`,
/// with the transforms `Bᵀ` (`a × a`), `G` (`a × 3`) and `Aᵀ` (`m × a`).
struct Variant {
    m: usize,
    bt: &'static [&'static [f64]],
    g: &'static [[f64; 3]],
    at: &'static [&'static [f64]],
}

impl Variant {
    fn a(&self) -> usize {
        self.m + 2
    }
}

/// F(2×2, 3×3): 16 products for 4 outputs; the transforms are additions only.
const F2: Variant = Variant {
    m: 2,
    bt: &[&[1.0, 0.0, -1.0, 0.0], &[0.0, 1.0, 1.0, 0.0], &[0.0, -1.0, 1.0, 0.0], &[0.0, 1.0, 0.0, -1.0]],
    g: &[[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]],
    at: &[&[1.0, 1.0, 1.0, 0.0], &[0.0, 1.0, -1.0, -1.0]],
};

/// F(4×4, 3×3) (interpolation points 0, ±1, ±2, ∞): 36 products for 16 outputs, 1.78 times
/// fewer than F(2×2, 3×3), with heavier transforms and slightly larger rounding errors.
const F4: Variant = Variant {
    m: 4,
    bt: &[
        &[4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
        &[0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
        &[0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
        &[0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
        &[0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
        &[0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
    ],
    g: &[
        [0.25, 0.0, 0.0],
        [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
        [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
        [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
        [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
        [0.0, 0.0, 1.0],
    ],
    at: &[
        &[1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
        &[0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
        &[0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
        &[0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
    ],
};

/// Fewest output channels for which the 16 products pay for the transforms.
const MIN_CHANNELS: i64 = 16;
/// Fewest input channels: the products' depth. At 16 (SqueezeNet's first expand convs) each
/// micro-kernel call is too short, and the direct GEMM over 144 is faster.
const MIN_IN_CHANNELS: i64 = 32;
/// Fewest tiles: below, the transformed filters (16 per channel pair against 9 weights) are
/// read for too little work, and the tiles of an odd 7×7 output are a third padding.
const MIN_TILES: i64 = 32;

/// Rows of tiles per block: the transformed inputs and products of a block (`a² × tiles ×
/// (C + M)` floats) within about 1 MiB, and at least eight blocks when there are many tiles;
/// all rows in one block when there are few tiles.
fn block_rows(rows: i64, row_tiles: i64, c: i64, m: i64, a2: i64) -> i64 {
    let tiles = rows * row_tiles;
    if tiles <= 64 {
        return rows;
    }
    let cap = (262144 / (a2 * (c + m))).max(8);
    let want = (tiles + 7) / 8;
    (cap.min(want) / row_tiles).clamp(1, rows)
}

/// `sum(coef * term)`: ±1 as additions and subtractions, other coefficients as products.
fn lin(terms: &[(f64, Expr)]) -> Expr {
    let mut acc: Option<Expr> = None;
    for (c, t) in terms {
        if *c == 0.0 {
            continue;
        }
        let mag = c.abs();
        let term = if mag == 1.0 { t.clone() } else { bin(BinOp::Mul, t.clone(), lit(mag, DType::F32)) };
        acc = Some(match acc {
            None if *c > 0.0 => term,
            None => Expr::un(UnOp::Neg, term),
            Some(a) if *c > 0.0 => bin(BinOp::Add, a, term),
            Some(a) => bin(BinOp::Sub, a, term),
        });
    }
    acc.unwrap_or_else(|| lit(0.0, DType::F32))
}

/// `G[r][i]` as an expression of the transform row `r` (an index expression in `0..a`).
fn g_coef(v: &Variant, r: &Expr, i: usize) -> Expr {
    let last = v.a() - 1;
    let mut e = lit(v.g[last][i], DType::F32);
    for row in (0..last).rev() {
        let eq = bin(BinOp::Eq, r.clone(), Expr::Int(row as i64));
        e = Expr::select(eq, lit(v.g[row][i], DType::F32), e);
    }
    e
}

/// The variant for an output of `oh × ow` pixels: F(4×4) where its tiles fit the output
/// (at most 1/8 of them padding) and there are enough of them, else F(2×2).
fn variant(nb: i64, oh: i64, ow: i64) -> &'static Variant {
    let padded = |m: i64| nb * ((oh + m - 1) / m * m) * ((ow + m - 1) / m * m);
    let tiles4 = nb * ((oh + 3) / 4) * ((ow + 3) / 4);
    if padded(4) * 8 <= nb * oh * ow * 9 && tiles4 >= MIN_TILES {
        &F4
    } else {
        &F2
    }
}

/// The longest phase along spatial axis `j`: `ceil(out / dilation)` outputs.
fn phase_len(geo: &[(i64, i64, i64)], dil: &[usize], j: usize) -> i64 {
    let d = dil[j].max(1) as i64;
    (geo[j].0 + d - 1) / d
}

/// Phases of a dilated convolution (one per dilation step along each axis).
fn phase_count(dil: &[usize]) -> i64 {
    dil.iter().map(|&d| d.max(1) as i64).product()
}

/// Fewest outputs per phase of a dilated convolution: shorter phases are mostly tile padding
/// (an ASPP head's dilation 12 over a 14×14 map leaves 1 or 2), which the GEMM, skipping the
/// taps that read only padding, does better.
const MIN_PHASE: i64 = 6;

/// Whether every dilated axis has phases of at least [`MIN_PHASE`] outputs whose F(2×2)
/// tiles are at most 1/8 padding (as [`variant`] asks of F(4×4)): dilation 4 over 28 outputs,
/// phases of 7 in tiles of 8, ran slower than the GEMM (`bench/results/grouped-2026-12-02`).
fn phases_fit(geo: &[(i64, i64, i64)], dil: &[usize]) -> bool {
    (0..2).all(|j| {
        let (o, d) = (geo[j].0, dil[j] as i64);
        let padded = d * (((o + d - 1) / d + 1) / 2 * 2);
        d == 1 || (o / d >= MIN_PHASE && padded * 8 <= o * 9)
    })
}

/// Whether position `p` of a tile may lie past an axis of `out` outputs in `d` phases.
fn partial(out: i64, d: i64, tm: i64, p: i64) -> bool {
    if d == 1 {
        out % tm != 0 && p >= out % tm
    } else {
        !(out % d == 0 && (out / d) % tm == 0)
    }
}

/// A tile row index `r` as (image, row phase, tile row).
fn split_row(l: &Lowerer, r: &Expr, th: i64, d: i64) -> (Expr, Expr, Expr) {
    let n = l.simp(bin(BinOp::Div, r.clone(), Expr::Int(th * d)));
    let phase = if d == 1 { Expr::Int(0) } else { l.simp(bin(BinOp::Rem, bin(BinOp::Div, r.clone(), Expr::Int(th)), Expr::Int(d))) };
    (n, phase, l.simp(bin(BinOp::Rem, r.clone(), Expr::Int(th))))
}

/// A tile column index `x` as (column phase, tile column).
fn split_col(l: &Lowerer, x: &Expr, tw: i64, d: i64) -> (Expr, Expr) {
    if d == 1 {
        return (Expr::Int(0), x.clone());
    }
    (l.simp(bin(BinOp::Div, x.clone(), Expr::Int(tw))), l.simp(bin(BinOp::Rem, x.clone(), Expr::Int(tw))))
}

/// Lowers the conv `n` (channels-last, `geo` its spatial geometry) with Winograd if it is
/// eligible; `None` leaves it to the direct lowering.
pub(crate) fn conv(
    l: &mut Lowerer,
    n: NodeId,
    w: &Window,
    group: usize,
    geo: &[(i64, i64, i64)],
) -> R<Option<Vec<Stmt>>> {
    let node = l.node(n);
    let (x, wt, bias, out) = (node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0]);
    let (xs, ws) = (l.shape(x), l.shape(wt));
    let eligible = group == 1
        && xs.len() == 4
        && ws[2..] == [3, 3]
        && w.strides.iter().all(|&s| s == 1)
        && l.dtype(x) == DType::F32
        && l.dtype(out) == DType::F32
        && l.dtype(wt) == DType::F32
        && phases_fit(geo, &w.dilations)
        && xs[0] * phase_count(&w.dilations) * ((phase_len(geo, &w.dilations, 0) + 1) / 2) * ((phase_len(geo, &w.dilations, 1) + 1) / 2) >= MIN_TILES
        && xs[3] >= MIN_IN_CHANNELS
        && ws[0] >= MIN_CHANNELS
        // The input is read at clamped coordinates: it must be a plain buffer, not an
        // expression of fused producers.
        && !l.node_of(x).is_some_and(|(p, _)| l.in_group(p));
    if !eligible {
        return Ok(None);
    }
    let (nb, h, wd, c) = (xs[0], xs[1], xs[2], xs[3]);
    let m = ws[0];
    let ((oh, pt, _), (ow, pl, _)) = (geo[0], geo[1]);
    // A dilation `d` splits each axis into `d` phases (outputs `φ + d·u`), each a convolution
    // of dilation 1 over the inputs `φ + d·(u + k) - pad`: tiles run along `u` in every phase.
    let (dy, dx) = (w.dilations[0] as i64, w.dilations[1] as i64);
    let (ph, pw) = (phase_len(geo, &w.dilations, 0), phase_len(geo, &w.dilations, 1));
    let v = variant(nb * dy * dx, ph, pw);
    let (tm, ta) = (v.m as i64, v.a());
    let a2 = (ta * ta) as i64;
    let (th, tw1) = ((ph + tm - 1) / tm, (pw + tm - 1) / tm);
    let tw = dx * tw1;
    // Tiles are numbered by rows (`R` over `nb * dy * th`: image `R / (dy·th)`, row phase
    // `R / th % dy`, tile row `R % th`) and columns (`tx` over `dx * tw1`: column phase
    // `tx / tw1`, tile column `tx % tw1`); a block is `rb` rows.
    let rows = nb * dy * th;
    let rb = block_rows(rows, tw, c, m, a2);
    let blocks = (rows + rb - 1) / rb;
    let tb = rb * tw;
    let f32 = DType::F32;

    // The block loop (only when there are several blocks).
    let blk = (blocks > 1).then(|| l.loop_var("i", blocks));
    let row_of = |r: VarId| -> Expr {
        match blk {
            Some(b) => bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(b), Expr::Int(rb)), Expr::Var(r)),
            None => Expr::Var(r),
        }
    };
    let vbuf = l.scratch(f32, vec![a2, tb, c]);
    let mbuf = l.scratch(f32, vec![a2, tb, m]);

    // Input transform: V[ab, t, c] = (Bᵀ d B)[a][b] for the patch d under tile t.
    let r1 = l.loop_var("i", rb);
    let x1 = l.loop_var("i", tw);
    let c1 = l.loop_var("i", c);
    let row1 = l.simp(row_of(r1));
    // Rows past the end of the last block read the last row and are zeroed.
    let live = bin(BinOp::Lt, row1.clone(), Expr::Int(rows));
    let rowc = bin(BinOp::Min, row1, Expr::Int(rows - 1));
    let (n1, py1, ty1) = split_row(l, &rowc, th, dy);
    let (px1, tx1) = split_col(l, &Expr::Var(x1), tw1, dx);
    let t1 = l.simp(bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(r1), Expr::Int(tw)), Expr::Var(x1)));
    // Per tile (outside the channel loop, so that it vectorizes): the clamped coordinates of
    // the patch's rows and columns and whether each lies inside the image.
    let mut tile_lets = vec![];
    let mut coord = |l: &mut Lowerer, (phase, d): (&Expr, i64), base: &Expr, k: i64, pad: i64, size: i64, extra: Option<&Expr>| {
        let u = bin(BinOp::Add, bin(BinOp::Mul, base.clone(), Expr::Int(tm)), Expr::Int(k));
        let raw = l.simp(bin(BinOp::Sub, bin(BinOp::Add, phase.clone(), bin(BinOp::Mul, u, Expr::Int(d))), Expr::Int(pad)));
        let clamped = l.simp(bin(BinOp::Max, bin(BinOp::Min, raw.clone(), Expr::Int(size - 1)), Expr::Int(0)));
        let cv = l.index_temp("t");
        tile_lets.push(Stmt::Let { var: cv, value: clamped });
        let mut ok = bin(BinOp::And, bin(BinOp::Ge, raw.clone(), Expr::Int(0)), bin(BinOp::Lt, raw, Expr::Int(size)));
        if let Some(e) = extra {
            ok = bin(BinOp::And, e.clone(), ok);
        }
        let ov = l.elem_var("t", DType::Bool, false);
        tile_lets.push(Stmt::Let { var: ov, value: l.simp(ok) });
        (Expr::Var(cv), Expr::Var(ov))
    };
    let ys: Vec<(Expr, Expr)> = (0..ta as i64).map(|i| coord(l, (&py1, dy), &ty1, i, pt, h, Some(&live))).collect();
    let xs_: Vec<(Expr, Expr)> = (0..ta as i64).map(|j| coord(l, (&px1, dx), &tx1, j, pl, wd, None)).collect();
    let mut body = vec![];
    let mut d = vec![vec![Expr::Int(0); ta]; ta];
    for (i, row) in d.iter_mut().enumerate() {
        for (j, dij) in row.iter_mut().enumerate() {
            let idx = vec![n1.clone(), ys[i].0.clone(), xs_[j].0.clone(), Expr::Var(c1)];
            // The load is unconditional (clamped in bounds) so that the channel loop
            // vectorizes; the select zeroes the padding.
            let raw = l.value_at(x, &idx)?;
            let v = l.elem_var("t", f32, false);
            body.push(Stmt::Let { var: v, value: raw });
            // Padding is zeroed by a factor of 1 or 0 per patch element, invariant in the
            // channel loop: gcc does not vectorize that loop with selects in it. (The factor
            // turns an infinite or NaN neighbour under a padded position into NaN; Winograd's
            // transforms mix such values anyway, so non-finite inputs are not kept exact.)
            let okf = l.elem_var("t", f32, false);
            tile_lets.push(Stmt::Let {
                var: okf,
                value: Expr::select(bin(BinOp::And, ys[i].1.clone(), xs_[j].1.clone()), lit(1.0, f32), lit(0.0, f32)),
            });
            let z = l.elem_var("t", f32, false);
            body.push(Stmt::Let { var: z, value: bin(BinOp::Mul, Expr::Var(v), Expr::Var(okf)) });
            *dij = Expr::Var(z);
        }
    }
    body.extend(l.take_lets());
    // Rows first: r[a][j] = sum_i Bᵀ[a][i] d[i][j]; then V[a][b] = sum_j Bᵀ[b][j] r[a][j].
    let mut r = vec![vec![Expr::Int(0); ta]; ta];
    for a in 0..ta {
        for j in 0..ta {
            let e = lin(&(0..ta).map(|i| (v.bt[a][i], d[i][j].clone())).collect::<Vec<_>>());
            let t = l.elem_var("t", f32, false);
            body.push(Stmt::Let { var: t, value: e });
            r[a][j] = Expr::Var(t);
        }
    }
    for a in 0..ta {
        for b in 0..ta {
            let e = lin(&(0..ta).map(|j| (v.bt[b][j], r[a][j].clone())).collect::<Vec<_>>());
            body.push(Stmt::store(vbuf, vec![Expr::Int((a * ta + b) as i64), t1.clone(), Expr::Var(c1)], e));
        }
    }
    tile_lets.push(Stmt::for_(c1, c, body));
    let input_nest = Lowerer::nest(&[(r1, rb), (x1, tw)], tile_lets);

    // The a² products: M[ab, t, m] = sum_c V[ab, t, c] * U[ab, c, m].
    let gv = gemm_vars(l, a2, tb, m, c, f32);
    let (vb, vi, vj, vk) = (Expr::Var(gv.b), Expr::Var(gv.i), Expr::Var(gv.j), Expr::Var(gv.k));
    let a_row = l.simp(bin(BinOp::Div, vb.clone(), Expr::Int(ta as i64)));
    let b_col = l.simp(bin(BinOp::Rem, vb.clone(), Expr::Int(ta as i64)));
    let mut uterms = vec![];
    for i in 0..3 {
        for j in 0..3 {
            let wv = l.value_at(wt, &[vj.clone(), vk.clone(), Expr::Int(i as i64), Expr::Int(j as i64)])?;
            let coef = bin(BinOp::Mul, g_coef(v, &a_row, i), g_coef(v, &b_col, j));
            uterms.push(bin(BinOp::Mul, coef, wv));
        }
    }
    let u = uterms
        .into_iter()
        .reduce(|acc, t| bin(BinOp::Add, acc, t))
        .unwrap_or_else(|| lit(0.0, f32));
    let lets = l.take_lets();
    if !lets.is_empty() {
        // The weights must read as plain loads inside the operand.
        return Ok(None);
    }
    let gemm = gv.gemm(Expr::Load(vbuf, vec![vb.clone(), vi.clone(), vk]), u, vec![Stmt::store(mbuf, vec![vb, vi, vj], Expr::Var(gv.acc))]);

    // Output transform: Y = Aᵀ M A per tile and output channel, plus bias and epilogue.
    let r2 = l.loop_var("i", rb);
    let x2 = l.loop_var("i", tw);
    let m2 = l.loop_var("i", m);
    let row2 = l.simp(row_of(r2));
    let (n2, py2, ty2) = split_row(l, &row2, th, dy);
    let (px2, tx2) = split_col(l, &Expr::Var(x2), tw1, dx);
    let t2 = l.simp(bin(BinOp::Add, bin(BinOp::Mul, Expr::Var(r2), Expr::Int(tw)), Expr::Var(x2)));
    let mark = l.begin_block();
    let mut ob = vec![];
    let mut mv = vec![vec![Expr::Int(0); ta]; ta];
    for a in 0..ta {
        for b in 0..ta {
            let t = l.elem_var("t", f32, false);
            ob.push(Stmt::Let {
                var: t,
                value: Expr::Load(mbuf, vec![Expr::Int((a * ta + b) as i64), t2.clone(), Expr::Var(m2)]),
            });
            mv[a][b] = Expr::Var(t);
        }
    }
    // s[a][q] = sum_b Aᵀ[q][b] M[a][b]; y[p][q] = sum_a Aᵀ[p][a] s[a][q].
    let mut s = vec![vec![Expr::Int(0); v.m]; ta];
    for a in 0..ta {
        for q in 0..v.m {
            let e = lin(&(0..ta).map(|b| (v.at[q][b], mv[a][b].clone())).collect::<Vec<_>>());
            let t = l.elem_var("t", f32, false);
            ob.push(Stmt::Let { var: t, value: e });
            s[a][q] = Expr::Var(t);
        }
    }
    let bv = val(l, bias, &[Expr::Var(m2)])?;
    ob.extend(l.take_lets());
    // Each pixel of the tile runs the epilogue, which marks the outputs it writes as done:
    // every pixel starts from the same state.
    let stored = l.stored();
    for p in 0..v.m {
        for q in 0..v.m {
            l.restore_stored(stored.clone());
            let y = lin(&(0..ta).map(|a| (v.at[p][a], s[a][q].clone())).collect::<Vec<_>>());
            let uy = bin(BinOp::Add, bin(BinOp::Mul, ty2.clone(), Expr::Int(tm)), Expr::Int(p as i64));
            let ux = bin(BinOp::Add, bin(BinOp::Mul, tx2.clone(), Expr::Int(tm)), Expr::Int(q as i64));
            let oy = l.simp(bin(BinOp::Add, py2.clone(), bin(BinOp::Mul, uy, Expr::Int(dy))));
            let ox = l.simp(bin(BinOp::Add, px2.clone(), bin(BinOp::Mul, ux, Expr::Int(dx))));
            let oidx = vec![n2.clone(), oy.clone(), ox.clone(), Expr::Var(m2)];
            let e = bin(BinOp::Add, y, bv.clone());
            let st = l.epilogue(out, &oidx, e)?;
            // Sizes that are not multiples of the tile: the last row or column of tiles is
            // partly outside the output.
            let mut conds = vec![];
            if partial(oh, dy, tm, p as i64) {
                conds.push(bin(BinOp::Lt, oy, Expr::Int(oh)));
            }
            if partial(ow, dx, tm, q as i64) {
                conds.push(bin(BinOp::Lt, ox, Expr::Int(ow)));
            }
            match conds.into_iter().reduce(|a, b| bin(BinOp::And, a, b)) {
                Some(cond) => ob.push(Stmt::If { cond: l.simp(cond), then_: st, else_: vec![] }),
                None => ob.extend(st),
            }
        }
    }
    l.end_block(mark);
    let inner = Lowerer::nest(&[(x2, tw), (m2, m)], ob);
    let out_rows = if blk.is_some() && rows % rb != 0 {
        vec![Stmt::If {
            cond: bin(BinOp::Lt, row2, Expr::Int(rows)),
            then_: inner,
            else_: vec![],
        }]
    } else {
        inner
    };
    let output_nest = Lowerer::nest(&[(r2, rb)], out_rows);

    let mut block = vec![Stmt::Alloc(vbuf), Stmt::Alloc(mbuf)];
    block.extend(input_nest);
    block.push(gemm);
    block.extend(output_nest);
    Ok(Some(match blk {
        Some(b) => vec![Stmt::for_(b, blocks, block)],
        None => block,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each variant's transforms reproduce a 1-D correlation of `a` inputs with 3 taps
    /// (F(m, 3)), so their tensor product reproduces the 2-D one.
    #[test]
    fn transforms_compute_a_correlation() {
        for v in [&F2, &F4] {
            let d: Vec<f64> = (0..v.a()).map(|i| (i as f64 * 0.7).sin() + 0.3).collect();
            let g = [0.9, -0.4, 1.1];
            let u: Vec<f64> = (0..v.a()).map(|a| (0..3).map(|i| v.g[a][i] * g[i]).sum()).collect();
            let t: Vec<f64> = (0..v.a()).map(|a| (0..v.a()).map(|i| v.bt[a][i] * d[i]).sum()).collect();
            for p in 0..v.m {
                let y: f64 = (0..v.a()).map(|a| v.at[p][a] * u[a] * t[a]).sum();
                let want: f64 = (0..3).map(|k| d[p + k] * g[k]).sum();
                assert!((y - want).abs() < 1e-12, "F({}, 3) output {p}: {y} vs {want}", v.m);
            }
        }
    }

    #[test]
    fn variants_follow_the_output_size() {
        assert_eq!(variant(1, 56, 56).m, 4);
        assert_eq!(variant(1, 28, 28).m, 4);
        assert_eq!(variant(1, 14, 14).m, 2);
        assert_eq!(variant(1, 27, 27).m, 4);
        assert_eq!(variant(1, 13, 13).m, 2);
        assert_eq!(variant(1, 112, 111).m, 4);
    }

    #[test]
    fn blocks_of_tile_rows() {
        assert_eq!(block_rows(7, 7, 256, 256, 16), 7);
        assert_eq!(block_rows(28, 28, 64, 64, 16), 3);
        assert_eq!(block_rows(14, 14, 128, 128, 16), 1);
        assert_eq!(block_rows(14, 14, 64, 64, 36), 1);
        assert_eq!(block_rows(112, 112, 64, 64, 16), 1);
    }
}
