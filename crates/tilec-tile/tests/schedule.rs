//! Schedule primitives are checked by differential execution: the tile-IR interpreter runs the
//! kernel before and after a transform on the same random inputs (outputs poisoned with NaN or a
//! sentinel), and the results must agree exactly (or within 1e-6 relative after `rfactor`, which
//! reassociates float reductions).

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tilec_ir::{DType, Tensor};
use tilec_tile::interp;
use tilec_tile::schedule::{self, CacheScope, CpuTarget, Primitive, Schedule};
use tilec_tile::*;

// ---------------------------------------------------------------------------------------------
// Kernel builders

/// A kernel and which of its parameters are outputs.
#[derive(Clone)]
struct Case {
    k: Kernel,
    outputs: Vec<usize>,
}

fn v(x: VarId) -> Expr {
    Expr::Var(x)
}
fn ld(b: BufId, idx: Vec<Expr>) -> Expr {
    Expr::load(b, idx)
}
fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::bin(op, a, b)
}
fn lit(x: f64, d: DType) -> Expr {
    Expr::float(x, d)
}
fn for_(x: VarId, n: i64, body: Vec<Stmt>) -> Stmt {
    Stmt::for_(x, n, body)
}

/// out[i, j] = max(a[i, j] * b[j], a[i, j] + 0.5)
fn ew2d(m: i64, n: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("ew2d");
    let a = k.param("a", d, vec![m, n]);
    let b = k.param("b", d, vec![n]);
    let out = k.param("out", d, vec![m, n]);
    let (i, j) = (k.index_var("i"), k.index_var("j"));
    let x = ld(a, vec![v(i), v(j)]);
    let val = bin(
        BinOp::Max,
        bin(BinOp::Mul, x.clone(), ld(b, vec![v(j)])),
        bin(BinOp::Add, x, lit(0.5, d)),
    );
    k.body.push(for_(
        i,
        m,
        vec![for_(j, n, vec![Stmt::store(out, vec![v(i), v(j)], val)])],
    ));
    Case {
        k,
        outputs: vec![2],
    }
}

/// out[i] = a[i] * b[i] + a[i]
fn ew1d(n: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("ew1d");
    let a = k.param("a", d, vec![n]);
    let b = k.param("b", d, vec![n]);
    let out = k.param("out", d, vec![n]);
    let i = k.index_var("i");
    let x = ld(a, vec![v(i)]);
    let val = bin(BinOp::Add, bin(BinOp::Mul, x.clone(), ld(b, vec![v(i)])), x);
    k.body
        .push(for_(i, n, vec![Stmt::store(out, vec![v(i)], val)]));
    Case {
        k,
        outputs: vec![2],
    }
}

fn init_of(op: BinOp, d: DType) -> Expr {
    if d.is_float() {
        lit(
            match op {
                BinOp::Add => 0.0,
                BinOp::Mul => 1.0,
                BinOp::Max => f64::NEG_INFINITY,
                _ => f64::INFINITY,
            },
            d,
        )
    } else {
        Expr::Lit(Lit::Int(
            match op {
                BinOp::Add => 0,
                BinOp::Mul => 1,
                BinOp::Max => i32::MIN as i64,
                _ => i32::MAX as i64,
            },
            d,
        ))
    }
}

/// out[i] = reduce_op over j of (x[i, j] + off) (accumulated in a mutable scalar); the offset
/// makes every max operand negative and every min operand positive, so a wrong identity shows.
fn rowred(m: i64, n: i64, op: BinOp, d: DType) -> Case {
    let mut k = Kernel::new("rowred");
    let x = k.param("x", d, vec![m, n]);
    let out = k.param("out", d, vec![m]);
    let (i, j) = (k.index_var("i"), k.index_var("j"));
    let acc = k.new_var("acc", Ty::Elem(d), true);
    let off = match op {
        BinOp::Max => -3000.0,
        BinOp::Min => 3000.0,
        _ => 0.0,
    };
    let off = if d.is_float() {
        lit(off, d)
    } else {
        Expr::Lit(Lit::Int(off as i64, d))
    };
    let val = bin(BinOp::Add, ld(x, vec![v(i), v(j)]), off);
    k.body.push(for_(
        i,
        m,
        vec![
            Stmt::Let {
                var: acc,
                value: init_of(op, d),
            },
            for_(
                j,
                n,
                vec![Stmt::Assign {
                    var: acc,
                    value: bin(op, v(acc), val),
                }],
            ),
            Stmt::store(out, vec![v(i)], v(acc)),
        ],
    ));
    Case {
        k,
        outputs: vec![1],
    }
}

/// out[4 * o + i] = x[o, i] + o for i < 5: neighbouring iterations of `o` overwrite one element.
fn overlap(n: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("overlap");
    let x = k.param("x", d, vec![n, 5]);
    let out = k.param("out", d, vec![4 * n + 1]);
    let (o, i) = (k.index_var("o"), k.index_var("i"));
    let idx = Expr::add(Expr::mul(v(o), Expr::Int(4)), v(i));
    let val = bin(BinOp::Add, ld(x, vec![v(o), v(i)]), Expr::cast(d, v(o)));
    k.body.push(for_(
        o,
        n,
        vec![for_(i, 5, vec![Stmt::store(out, vec![idx], val)])],
    ));
    Case {
        k,
        outputs: vec![1],
    }
}

/// out[0] = sum of x (one scalar accumulator over a 2-D nest).
fn total2d(m: i64, n: i64) -> Case {
    let d = DType::F64;
    let mut k = Kernel::new("total2d");
    let x = k.param("x", d, vec![m, n]);
    let out = k.param("out", d, vec![1]);
    let (i, j) = (k.index_var("i"), k.index_var("j"));
    let acc = k.new_var("acc", Ty::Elem(d), true);
    k.body.push(Stmt::Let {
        var: acc,
        value: lit(0.0, d),
    });
    k.body.push(for_(
        i,
        m,
        vec![for_(
            j,
            n,
            vec![Stmt::Assign {
                var: acc,
                value: bin(BinOp::Add, v(acc), ld(x, vec![v(i), v(j)])),
            }],
        )],
    ));
    k.body.push(Stmt::store(out, vec![Expr::Int(0)], v(acc)));
    Case {
        k,
        outputs: vec![1],
    }
}

/// Row softmax through local buffers: M[i] = max_j x, T[i, j] = exp(x - M[i]), out = T / sum_j T.
fn softmax(m: i64, n: i64) -> Case {
    let d = DType::F64;
    let mut k = Kernel::new("softmax");
    let x = k.param("x", d, vec![m, n]);
    let out = k.param("out", d, vec![m, n]);
    let mb = k.buffer("M", d, vec![m], Scope::Local);
    let t = k.buffer("T", d, vec![m, n], Scope::Local);
    let (i, j, i2, j2, i3, j3, j4) = (
        k.index_var("i"),
        k.index_var("j"),
        k.index_var("i2"),
        k.index_var("j2"),
        k.index_var("i3"),
        k.index_var("j3"),
        k.index_var("j4"),
    );
    let mx = k.new_var("mx", Ty::Elem(d), true);
    let s = k.new_var("s", Ty::Elem(d), true);
    k.body.push(Stmt::Alloc(mb));
    k.body.push(Stmt::Alloc(t));
    k.body.push(for_(
        i,
        m,
        vec![
            Stmt::Let {
                var: mx,
                value: lit(f64::NEG_INFINITY, d),
            },
            for_(
                j,
                n,
                vec![Stmt::Assign {
                    var: mx,
                    value: bin(BinOp::Max, v(mx), ld(x, vec![v(i), v(j)])),
                }],
            ),
            Stmt::store(mb, vec![v(i)], v(mx)),
        ],
    ));
    k.body.push(for_(
        i2,
        m,
        vec![for_(
            j2,
            n,
            vec![Stmt::store(
                t,
                vec![v(i2), v(j2)],
                Expr::un(
                    UnOp::Exp,
                    bin(BinOp::Sub, ld(x, vec![v(i2), v(j2)]), ld(mb, vec![v(i2)])),
                ),
            )],
        )],
    ));
    k.body.push(for_(
        i3,
        m,
        vec![
            Stmt::Let {
                var: s,
                value: lit(0.0, d),
            },
            for_(
                j3,
                n,
                vec![Stmt::Assign {
                    var: s,
                    value: bin(BinOp::Add, v(s), ld(t, vec![v(i3), v(j3)])),
                }],
            ),
            for_(
                j4,
                n,
                vec![Stmt::store(
                    out,
                    vec![v(i3), v(j4)],
                    bin(BinOp::Div, ld(t, vec![v(i3), v(j4)]), v(s)),
                )],
            ),
        ],
    ));
    Case {
        k,
        outputs: vec![1],
    }
}

/// out[a, b, c] = x[a, c, b] * 2 (a transposing 3-D nest).
fn transpose3(na: i64, nb: i64, nc: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("transpose3");
    let x = k.param("x", d, vec![na, nc, nb]);
    let out = k.param("out", d, vec![na, nb, nc]);
    let (a, b, c) = (k.index_var("a"), k.index_var("b"), k.index_var("c"));
    let val = bin(BinOp::Mul, ld(x, vec![v(a), v(c), v(b)]), lit(2.0, d));
    k.body.push(for_(
        a,
        na,
        vec![for_(
            b,
            nb,
            vec![for_(
                c,
                nc,
                vec![Stmt::store(out, vec![v(a), v(b), v(c)], val)],
            )],
        )],
    ));
    Case {
        k,
        outputs: vec![1],
    }
}

/// out[i] = x[i] + x[i + 1] * x[i + 2]
fn stencil(n: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("stencil");
    let x = k.param("x", d, vec![n + 2]);
    let out = k.param("out", d, vec![n]);
    let i = k.index_var("i");
    let at = |o: i64| ld(x, vec![Expr::add(v(i), Expr::Int(o))]);
    let val = bin(BinOp::Add, at(0), bin(BinOp::Mul, at(1), at(2)));
    k.body
        .push(for_(i, n, vec![Stmt::store(out, vec![v(i)], val)]));
    Case {
        k,
        outputs: vec![1],
    }
}

/// y[0] = x[0]; y[i + 1] = y[i] * 0.5 + x[i + 1] (a carried dependence through memory).
fn prefix(n: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("prefix");
    let x = k.param("x", d, vec![n]);
    let y = k.param("y", d, vec![n]);
    let i = k.index_var("i");
    k.body.push(Stmt::store(
        y,
        vec![Expr::Int(0)],
        ld(x, vec![Expr::Int(0)]),
    ));
    let val = bin(
        BinOp::Add,
        bin(BinOp::Mul, ld(y, vec![v(i)]), lit(0.5, d)),
        ld(x, vec![Expr::add(v(i), Expr::Int(1))]),
    );
    k.body.push(for_(
        i,
        n - 1,
        vec![Stmt::store(y, vec![Expr::add(v(i), Expr::Int(1))], val)],
    ));
    Case {
        k,
        outputs: vec![1],
    }
}

/// out[i] = 0, then out[i] = out[i] * 0.5 + x[i, j] over j (a reduction through memory whose
/// order matters).
fn accum_buf(m: i64, n: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("accum_buf");
    let x = k.param("x", d, vec![m, n]);
    let out = k.param("out", d, vec![m]);
    let (i0, i, j) = (k.index_var("i0"), k.index_var("i"), k.index_var("j"));
    k.body.push(for_(
        i0,
        m,
        vec![Stmt::store(out, vec![v(i0)], lit(0.0, d))],
    ));
    let val = bin(
        BinOp::Add,
        bin(BinOp::Mul, ld(out, vec![v(i)]), lit(0.5, d)),
        ld(x, vec![v(i), v(j)]),
    );
    k.body.push(for_(
        i,
        m,
        vec![for_(j, n, vec![Stmt::store(out, vec![v(i)], val)])],
    ));
    Case {
        k,
        outputs: vec![1],
    }
}

/// out[b, i, j] = relu(sum_k a[b, i, k] * w[k, j] + bias[j]) inside a batch loop, then an
/// elementwise loop on the result.
fn gemm_case(batch: i64, m: i64, n: i64, kk: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("gemm");
    let a = k.param("a", d, vec![batch, m, kk]);
    let w = k.param("w", d, vec![kk, n]);
    let bias = k.param("bias", d, vec![n]);
    let out = k.param("out", d, vec![batch, m, n]);
    let (bt, gb, gi, gj, gk) = (
        k.index_var("bt"),
        k.index_var("gb"),
        k.index_var("gi"),
        k.index_var("gj"),
        k.index_var("gk"),
    );
    let acc = k.new_var("gacc", Ty::Elem(d), false);
    let epi = bin(
        BinOp::Max,
        bin(BinOp::Add, v(acc), ld(bias, vec![v(gj)])),
        lit(0.0, d),
    );
    let g = Gemm {
        batch: 1,
        m,
        n,
        k: kk,
        b_var: gb,
        i_var: gi,
        j_var: gj,
        k_var: gk,
        acc_var: acc,
        acc_dtype: d,
        a: ld(a, vec![v(bt), v(gi), v(gk)]),
        b: ld(w, vec![v(gk), v(gj)]),
        epilogue: vec![Stmt::store(out, vec![v(bt), v(gi), v(gj)], epi)],
        params: GemmParams {
            mr: 1,
            nr: 1,
            kc: 1,
            mc: 1,
            nc: 1,
        },
        vector: false,
    };
    k.body.push(for_(bt, batch, vec![Stmt::Gemm(Box::new(g))]));
    Case {
        k,
        outputs: vec![3],
    }
}

/// Integer max over columns of a transposed view: out[j] = max_i x[i, j].
fn colmax_i32(m: i64, n: i64) -> Case {
    let d = DType::I32;
    let mut k = Kernel::new("colmax");
    let x = k.param("x", d, vec![m, n]);
    let out = k.param("out", d, vec![n]);
    let (j, i) = (k.index_var("j"), k.index_var("i"));
    let acc = k.new_var("acc", Ty::Elem(d), true);
    k.body.push(for_(
        j,
        n,
        vec![
            Stmt::Let {
                var: acc,
                value: init_of(BinOp::Max, d),
            },
            for_(
                i,
                m,
                vec![Stmt::Assign {
                    var: acc,
                    value: bin(BinOp::Max, v(acc), ld(x, vec![v(i), v(j)])),
                }],
            ),
            Stmt::store(out, vec![v(j)], v(acc)),
        ],
    ));
    Case {
        k,
        outputs: vec![1],
    }
}

/// A padded 2-D window over `x[c, h, w]` as the lowering spells it: every tap checked
/// against the input bounds (`select(inside, .., ..)`), `out[c, oy, ox]` the max (or, with
/// `avg`, the sum of the taps inside divided by the number of taps inside the padded extent).
#[allow(clippy::too_many_arguments)]
fn pool2d(
    c: i64,
    (h, w): (i64, i64),
    (kh, kw): (i64, i64),
    (sh, sw): (i64, i64),
    (dh, dw): (i64, i64),
    (pt, pl, pb, pr): (i64, i64, i64, i64),
    avg: bool,
) -> Case {
    let d = DType::F32;
    let oh = ((h + pt + pb - dh * (kh - 1) - 1) / sh + 1).max(1);
    let ow = ((w + pl + pr - dw * (kw - 1) - 1) / sw + 1).max(1);
    let mut k = Kernel::new(if avg { "avgpool" } else { "maxpool" });
    let x = k.param("x", d, vec![c, h, w]);
    let out = k.param("out", d, vec![c, oh, ow]);
    let (ci, oy, ox, ky, kx) = (
        k.index_var("c"),
        k.index_var("oy"),
        k.index_var("ox"),
        k.index_var("ky"),
        k.index_var("kx"),
    );
    let acc = k.new_var("acc", Ty::Elem(d), true);
    let cnt = k.new_var("cnt", Ty::Elem(DType::I64), true);
    let iy = Expr::add(
        Expr::add(
            Expr::mul(v(oy), Expr::Int(sh)),
            Expr::mul(v(ky), Expr::Int(dh)),
        ),
        Expr::Int(-pt),
    );
    let ix = Expr::add(
        Expr::add(
            Expr::mul(v(ox), Expr::Int(sw)),
            Expr::mul(v(kx), Expr::Int(dw)),
        ),
        Expr::Int(-pl),
    );
    let within = |e: &Expr, lo: i64, hi: i64| {
        bin(
            BinOp::And,
            bin(BinOp::Ge, e.clone(), Expr::Int(lo)),
            bin(BinOp::Lt, e.clone(), Expr::Int(hi)),
        )
    };
    let inside = bin(BinOp::And, within(&iy, 0, h), within(&ix, 0, w));
    let in_pad = bin(
        BinOp::And,
        bin(BinOp::Lt, iy.clone(), Expr::Int(h + pb)),
        bin(BinOp::Lt, ix.clone(), Expr::Int(w + pr)),
    );
    let xv = ld(x, vec![v(ci), iy, ix]);
    let a = Expr::Var(acc);
    let mut tap = vec![Stmt::Assign {
        var: acc,
        value: Expr::select(
            inside,
            bin(if avg { BinOp::Add } else { BinOp::Max }, a.clone(), xv),
            a.clone(),
        ),
    }];
    if avg {
        tap.push(Stmt::Assign {
            var: cnt,
            value: Expr::select(
                in_pad,
                bin(
                    BinOp::Add,
                    Expr::Var(cnt),
                    Expr::Lit(Lit::Int(1, DType::I64)),
                ),
                Expr::Var(cnt),
            ),
        });
    }
    let res = if avg {
        bin(BinOp::Div, a.clone(), Expr::cast(d, Expr::Var(cnt)))
    } else {
        a.clone()
    };
    let init = if avg {
        lit(0.0, d)
    } else {
        lit(f64::NEG_INFINITY, d)
    };
    k.body.push(for_(
        ci,
        c,
        vec![for_(
            oy,
            oh,
            vec![for_(
                ox,
                ow,
                vec![
                    Stmt::Let {
                        var: acc,
                        value: init,
                    },
                    Stmt::Let {
                        var: cnt,
                        value: Expr::Lit(Lit::Int(0, DType::I64)),
                    },
                    for_(ky, kh, vec![for_(kx, kw, tap)]),
                    Stmt::store(out, vec![v(ci), v(oy), v(ox)], res),
                ],
            )],
        )],
    ));
    Case {
        k,
        outputs: vec![1],
    }
}

/// `out[i] = i < n0 ? a[i] : (i < n0 + n1 ? b[i - n0] : c[i - n0 - n1])`: a concatenation.
fn concat3(n0: i64, n1: i64, n2: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("concat3");
    let a = k.param("a", d, vec![n0]);
    let b = k.param("b", d, vec![n1]);
    let c = k.param("c", d, vec![n2]);
    let out = k.param("out", d, vec![n0 + n1 + n2]);
    let i = k.index_var("i");
    let val = Expr::select(
        bin(BinOp::Lt, v(i), Expr::Int(n0)),
        ld(a, vec![v(i)]),
        Expr::select(
            bin(BinOp::Lt, v(i), Expr::Int(n0 + n1)),
            ld(b, vec![Expr::add(v(i), Expr::Int(-n0))]),
            ld(c, vec![Expr::add(v(i), Expr::Int(-n0 - n1))]),
        ),
    );
    k.body.push(for_(
        i,
        n0 + n1 + n2,
        vec![Stmt::store(out, vec![v(i)], val)],
    ));
    Case {
        k,
        outputs: vec![3],
    }
}

/// A channels-last image of `h x w` pixels flattened to one axis, rolled by `s` along both
/// spatial axes (Swin's shifted windows): `out[p][c] = x[((p / w - s) mod h) * w + (p % w - s)
/// mod w][c]`, written as the selects of two concatenations.
fn roll2d(h: i64, w: i64, s: i64, ch: i64) -> Case {
    let d = DType::F32;
    let mut k = Kernel::new("roll2d");
    let x = k.param("x", d, vec![h * w, ch]);
    let out = k.param("out", d, vec![h * w, ch]);
    let p = k.index_var("p");
    let c = k.index_var("c");
    let (row, col) = (Expr::div(v(p), w), Expr::rem(v(p), w));
    let src = |dr: i64, dc: i64| {
        let r = Expr::add(row.clone(), Expr::Int(dr));
        let q = Expr::add(col.clone(), Expr::Int(dc));
        ld(x, vec![Expr::add(Expr::mul(r, Expr::Int(w)), q), v(c)])
    };
    let by_col = |dr: i64| Expr::select(bin(BinOp::Lt, col.clone(), Expr::Int(s)), src(dr, w - s), src(dr, -s));
    let val = Expr::select(bin(BinOp::Lt, row.clone(), Expr::Int(s)), by_col(h - s), by_col(-s));
    k.body.push(for_(p, h * w, vec![for_(c, ch, vec![Stmt::store(out, vec![v(p), v(c)], val)])]));
    Case { k, outputs: vec![1] }
}

fn random_pool(rng: &mut StdRng, avg: bool) -> Case {
    let (kh, kw) = (rng.gen_range(1..4), rng.gen_range(1..4));
    let (dh, dw) = (rng.gen_range(1..3), rng.gen_range(1..3));
    let pad = |rng: &mut StdRng, k: i64| rng.gen_range(0..k.max(1));
    let pads = (pad(rng, kh), pad(rng, kw), pad(rng, kh), pad(rng, kw));
    let h = rng.gen_range(dh * (kh - 1) + 1..dh * (kh - 1) + 12);
    let w = rng.gen_range(dw * (kw - 1) + 1..dw * (kw - 1) + 12);
    pool2d(
        rng.gen_range(1..3),
        (h, w),
        (kh, kw),
        (rng.gen_range(1..4), rng.gen_range(1..4)),
        (dh, dw),
        pads,
        avg,
    )
}

fn all_cases(rng: &mut StdRng) -> Vec<Case> {
    let mut out = vec![];
    for _ in 0..2 {
        let (m, n) = (rng.gen_range(1..9), rng.gen_range(1..13));
        out.push(ew2d(m, n));
        out.push(ew1d(rng.gen_range(1..40)));
        out.push(rowred(
            m,
            n,
            *[BinOp::Add, BinOp::Max, BinOp::Min, BinOp::Mul]
                .choose(rng)
                .unwrap(),
            DType::F64,
        ));
        out.push(rowred(m, n, BinOp::Max, DType::F32));
        out.push(total2d(m, n));
        out.push(softmax(m, n));
        out.push(transpose3(
            rng.gen_range(1..4),
            rng.gen_range(1..5),
            rng.gen_range(1..6),
        ));
        out.push(stencil(rng.gen_range(1..30)));
        out.push(prefix(rng.gen_range(2..20)));
        out.push(accum_buf(m, n));
        out.push(gemm_case(rng.gen_range(1..3), m, n, rng.gen_range(1..7)));
        out.push(colmax_i32(m, n));
        out.push(rowred(m, n, BinOp::Min, DType::I32));
        out.push(overlap(rng.gen_range(1..6)));
        out.push(random_pool(rng, false));
        out.push(random_pool(rng, true));
        out.push(concat3(
            rng.gen_range(1..9),
            rng.gen_range(1..9),
            rng.gen_range(1..9),
        ));
        out.push(roll2d(rng.gen_range(2..6), rng.gen_range(2..7), 1, rng.gen_range(1..4)));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Differential execution

const INT_POISON: i64 = 0x5eadbee;

fn random_args(c: &Case, rng: &mut StdRng) -> Vec<Tensor> {
    c.k.params
        .iter()
        .enumerate()
        .map(|(p, &b)| {
            let buf = c.k.buf(b);
            let shape: Vec<usize> = buf.shape.iter().map(|&d| d as usize).collect();
            let n = buf.numel() as usize;
            let out = c.outputs.contains(&p);
            if buf.dtype.is_float() {
                let xs: Vec<f64> = (0..n)
                    .map(|_| {
                        if out {
                            f64::NAN
                        } else {
                            rng.gen_range(-1.0..1.0)
                        }
                    })
                    .collect();
                Tensor::from_f64s(buf.dtype, shape, &xs).unwrap()
            } else {
                let xs: Vec<i64> = (0..n)
                    .map(|_| {
                        if out {
                            INT_POISON
                        } else {
                            rng.gen_range(-1000..1000)
                        }
                    })
                    .collect();
                Tensor::from_i64s(buf.dtype, shape, &xs).unwrap()
            }
        })
        .collect()
}

/// Runs `reference` and `scheduled` on the same fresh inputs and compares the outputs.
fn check_same(reference: &Case, scheduled: &Kernel, tol: f64, rng: &mut StdRng, what: &str) {
    let args = random_args(reference, rng);
    let mut want = args.clone();
    interp::run(&reference.k, &mut want).unwrap_or_else(|e| panic!("reference {what}: {e}"));
    let mut got = args;
    interp::run(scheduled, &mut got).unwrap_or_else(|e| panic!("{what}: {e}\n{scheduled}"));
    for &o in &reference.outputs {
        let (w, g) = (want[o].to_f64_vec(), got[o].to_f64_vec());
        for (idx, (a, b)) in w.iter().zip(&g).enumerate() {
            assert!(
                !a.is_nan() && *a != INT_POISON as f64,
                "{what}: reference output {o}[{idx}] left unwritten"
            );
            let ok = if tol == 0.0 {
                a == b
            } else {
                (a - b).abs() <= tol * a.abs().max(1.0)
            };
            assert!(ok, "{what}: output {o}[{idx}]: {b} instead of {a}\nreference:\n{}\nscheduled:\n{scheduled}", reference.k);
        }
    }
}

fn names(k: &Kernel) -> Vec<String> {
    k.loops()
        .iter()
        .map(|l| k.var_info(l.var).name.clone())
        .collect()
}

fn loop_by_name<'a>(k: &'a Kernel, name: &str) -> &'a Loop {
    let v = k.var_named(name).unwrap();
    k.loops().into_iter().find(|l| l.var == v).unwrap()
}

/// Loops of the perfect chain starting at `name`.
fn chain(k: &Kernel, name: &str) -> Vec<String> {
    let mut out = vec![name.to_string()];
    let mut l = loop_by_name(k, name);
    while let [Stmt::For(inner)] = l.body.as_slice() {
        out.push(k.var_info(inner.var).name.clone());
        l = inner;
    }
    out
}

fn candidates(k: &Kernel, rng: &mut StdRng) -> Vec<Primitive> {
    let loops = names(k);
    let bufs: Vec<String> = k.buffers.iter().map(|b| b.name.clone()).collect();
    let mut out = vec![];
    let scope = |rng: &mut StdRng| {
        if rng.gen_bool(0.5) {
            CacheScope::Local
        } else {
            CacheScope::Register
        }
    };
    for l in &loops {
        let n = loop_by_name(k, l).extent;
        out.push(Primitive::Split {
            loop_var: l.clone(),
            factor: rng.gen_range(1..=n + 2),
        });
        out.push(Primitive::Unroll {
            loop_var: l.clone(),
        });
        out.push(Primitive::Vectorize {
            loop_var: l.clone(),
        });
        out.push(Primitive::Parallel {
            loop_var: l.clone(),
        });
        out.push(Primitive::Rfactor {
            loop_var: l.clone(),
            factor: rng.gen_range(1..=n.max(1) + 1),
        });
        out.push(Primitive::Partition {
            loop_var: l.clone(),
        });
        // A divisor of the extent when there is one.
        if let Some(f) = (2..n).find(|f| n % f == 0) {
            out.push(Primitive::Delinearize { loop_var: l.clone(), factor: f });
        }
        let ch = chain(k, l);
        if ch.len() >= 2 {
            out.push(Primitive::Fuse {
                outer: ch[0].clone(),
                inner: ch[1].clone(),
            });
            let cnt = rng.gen_range(2..=ch.len());
            let mut sub: Vec<String> = ch.choose_multiple(rng, cnt).cloned().collect();
            sub.shuffle(rng);
            out.push(Primitive::Reorder { loops: sub });
        }
        for b in &bufs {
            out.push(Primitive::CacheRead {
                buffer: b.clone(),
                at: l.clone(),
                scope: scope(rng),
            });
            out.push(Primitive::CacheWrite {
                buffer: b.clone(),
                at: l.clone(),
                scope: scope(rng),
            });
        }
        for l2 in &loops {
            out.push(Primitive::ComputeAt {
                producer: l.clone(),
                at: l2.clone(),
            });
        }
    }
    out.push(Primitive::GemmBlocking {
        gemm: None,
        mr: 4,
        nr: 16,
        kc: 32,
        mc: 64,
        nc: 256,
    });
    out.push(Primitive::GemmTranspose { gemm: None });
    out.push(Primitive::GemmVector { gemm: None });
    out
}

// ---------------------------------------------------------------------------------------------
// Tests

/// Every primitive alone, at every place it can be tried, on several kernels and shapes.
#[test]
fn each_primitive_alone_preserves_results() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut applied = std::collections::BTreeMap::<&str, usize>::new();
    for case in all_cases(&mut rng) {
        for p in candidates(&case.k, &mut rng) {
            let mut k = case.k.clone();
            match schedule::apply_primitive(&mut k, &p) {
                Ok(()) => {
                    *applied.entry(p.name()).or_default() += 1;
                    let tol = if matches!(p, Primitive::Rfactor { .. }) {
                        1e-6
                    } else {
                        0.0
                    };
                    check_same(
                        &case,
                        &k,
                        tol,
                        &mut rng,
                        &format!("{} after `{p}`", case.k.name),
                    );
                }
                Err(e) => {
                    assert_eq!(k, case.k, "a failed primitive changed the kernel: {e}");
                    assert!(e.kernel == case.k.name && e.primitive == p.name(), "{e:?}");
                }
            }
        }
    }
    eprintln!("applied alone: {applied:?}");
    for p in [
        "split",
        "reorder",
        "fuse",
        "unroll",
        "vectorize",
        "parallel",
        "cache_read",
        "cache_write",
        "compute_at",
        "rfactor",
        "partition",
        "delinearize",
        "gemm_transpose",
        "gemm_blocking",
    ] {
        assert!(
            applied.get(p).copied().unwrap_or(0) >= 2,
            "{p} applied only {:?} times: {applied:?}",
            applied.get(p)
        );
    }
}

/// Random sequences of primitives (illegal ones are refused and skipped).
#[test]
fn random_sequences_preserve_results() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut total = 0;
    for round in 0..6 {
        for case in all_cases(&mut rng) {
            let mut k = case.k.clone();
            let mut sched = Schedule::new();
            for _ in 0..12 {
                let cands = candidates(&k, &mut rng);
                let Some(p) = cands.choose(&mut rng).cloned() else {
                    break;
                };
                let before = k.clone();
                match schedule::apply_primitive(&mut k, &p) {
                    Ok(()) => sched.push(p),
                    Err(_) => assert_eq!(k, before),
                }
            }
            total += sched.steps.len();
            let tol = if sched
                .steps
                .iter()
                .any(|p| matches!(p, Primitive::Rfactor { .. }))
            {
                1e-6
            } else {
                0.0
            };
            let what = format!("{} round {round} after\n{sched}", case.k.name);
            check_same(&case, &k, tol, &mut rng, &what);
            // The recorded schedule replays to the same kernel, also through JSON.
            let mut again = case.k.clone();
            let replay = Schedule::from_json(&sched.to_json()).unwrap();
            schedule::apply(&mut again, &replay).unwrap_or_else(|e| panic!("{what}: replay: {e}"));
            assert_eq!(again, k, "{what}");
        }
    }
    eprintln!("random sequences applied {total} primitives");
    assert!(total > 200, "only {total} primitives applied");
}

/// Partitioning a padded window loop: the border pieces keep the checks, the interior has none,
/// and results are unchanged for padding on all sides, strides above the window and dilation.
#[test]
fn partition_drops_checks_in_the_interior() {
    let mut rng = StdRng::seed_from_u64(5);
    let shapes = [
        // (h, w), (kh, kw), (sh, sw), (dh, dw), pads (t, l, b, r)
        ((9, 11), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
        ((9, 11), (3, 3), (2, 2), (1, 1), (1, 0, 2, 1)),
        ((10, 7), (2, 2), (3, 3), (1, 1), (0, 1, 1, 0)),
        ((12, 12), (3, 2), (1, 2), (2, 3), (2, 1, 0, 2)),
        ((5, 5), (3, 3), (1, 1), (1, 1), (2, 2, 2, 2)),
        ((4, 4), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0)),
    ];
    for (hw, kk, st, dil, pads) in shapes {
        for avg in [false, true] {
            let case = pool2d(2, hw, kk, st, dil, pads, avg);
            for name in ["oy", "ox"] {
                let mut k = case.k.clone();
                let p = schedule::partition(&mut k, name).unwrap();
                assert_eq!(p.interior, name);
                assert!(p.dropped > 0, "{p:?}");
                let n = loop_by_name(&case.k, name).extent;
                assert!(0 <= p.interior_start && p.interior_start < p.interior_end);
                assert!(p.interior_end <= n);
                assert_eq!(p.before.is_some(), p.interior_start > 0, "{p:?}");
                assert_eq!(p.after.is_some(), p.interior_end < n, "{p:?}");
                assert_eq!(
                    loop_by_name(&k, name).extent,
                    p.interior_end - p.interior_start
                );
                check_same(
                    &case,
                    &k,
                    0.0,
                    &mut rng,
                    &format!("{} partition {name}", case.k.name),
                );
            }
            // Both loops, then the default schedule on top.
            let mut k = case.k.clone();
            schedule::partition(&mut k, "oy").unwrap();
            schedule::partition(&mut k, "ox").unwrap();
            check_same(&case, &k, 0.0, &mut rng, "both");
            let t = CpuTarget {
                threads: 2,
                vector_bytes: 64,
                l1_bytes: 32 << 10,
                l2_bytes: 1 << 20,
                ..CpuTarget::default()
            };
            let s = schedule::default_cpu(&case.k, &t);
            let mut k = case.k.clone();
            schedule::apply(&mut k, &s).unwrap();
            check_same(&case, &k, 0.0, &mut rng, &format!("default schedule\n{s}"));
        }
    }
    // Without padding the checks hold everywhere: one piece, no check left in it.
    let case = pool2d(1, (9, 9), (3, 3), (2, 2), (1, 1), (0, 0, 0, 0), false);
    let mut k = case.k.clone();
    let p = schedule::partition(&mut k, "oy").unwrap();
    assert_eq!((p.before, p.after), (None, None));
    let p = schedule::partition(&mut k, "ox").unwrap();
    assert_eq!((p.before, p.after), (None, None));
    assert!(!format!("{k}").contains(">="), "{k}");
    check_same(&case, &k, 0.0, &mut rng, "unpadded");
    // A concatenation splits into one loop per input, each without a select.
    let case = concat3(5, 3, 4);
    let mut k = case.k.clone();
    let p = schedule::partition(&mut k, "i").unwrap();
    assert_eq!((p.interior_start, p.interior_end), (0, 5));
    let after = p.after.unwrap();
    let p2 = schedule::partition(&mut k, &after).unwrap();
    assert_eq!((p2.interior_start, p2.interior_end), (0, 3));
    assert_eq!(k.body.len(), 3, "{k}");
    assert!(
        !format!("{k}").contains('?') && !format!("{k}").contains("select"),
        "{k}"
    );
    check_same(&case, &k, 0.0, &mut rng, "concat");
    // A rolled, flattened image: the default schedule delinearizes the pixel loop into rows
    // and columns, each cut where the roll wraps, leaving no select and no division.
    let case = roll2d(6, 10, 2, 8);
    let t = CpuTarget { threads: 1, vector_bytes: 32, ..CpuTarget::default() };
    let s = schedule::default_cpu(&case.k, &t);
    assert!(s.steps.iter().any(|p| matches!(p, Primitive::Delinearize { factor: 10, .. })), "{s}");
    let mut k = case.k.clone();
    schedule::apply(&mut k, &s).unwrap();
    let text = format!("{k}");
    assert!(!text.contains('?') && !text.contains("select") && !text.contains(" / ") && !text.contains(" % "), "{s}\n{k}");
    check_same(&case, &k, 0.0, &mut rng, "rolled image");
    // A factor that does not divide the loop is refused, the kernel unchanged.
    let mut k = case.k.clone();
    assert!(schedule::delinearize(&mut k, "p", 7).is_err());
    assert_eq!(k, case.k);
    // Nothing to partition.
    let case = ew1d(10);
    let mut k = case.k.clone();
    assert!(schedule::partition(&mut k, "i").is_err());
    assert_eq!(k, case.k);
}

#[test]
fn split_guards_uneven_factors() {
    let mut rng = StdRng::seed_from_u64(1);
    for n in [1, 5, 16, 17] {
        for f in [1, 3, 4, 16, 40] {
            let case = ew1d(n);
            let mut k = case.k.clone();
            let (o, i) = schedule::split(&mut k, "i", f).unwrap();
            assert_eq!((o.as_str(), i.as_str()), ("i_o", "i_i"));
            let fe = f.min(n);
            assert_eq!(loop_by_name(&k, &o).extent, (n + fe - 1) / fe);
            assert_eq!(loop_by_name(&k, &i).extent, fe);
            check_same(&case, &k, 0.0, &mut rng, &format!("split {n} by {f}"));
        }
    }
    let mut k = ew1d(8).k;
    let e = schedule::split(&mut k, "i", 0).unwrap_err();
    assert!(e.to_string().contains("at least 1"), "{e}");
}

#[test]
fn illegal_applications_are_refused() {
    let expect_err = |case: &Case, p: Primitive, needle: &str| {
        let mut k = case.k.clone();
        let e = schedule::apply_primitive(&mut k, &p).expect_err(&format!("{p} should be refused"));
        let text = e.to_string();
        assert!(
            text.contains(&case.k.name) && text.contains(p.name()) && text.contains(needle),
            "`{p}`: {text}"
        );
        assert_eq!(k, case.k);
    };
    let r = rowred(4, 6, BinOp::Add, DType::F64);
    // Reorder across a non-perfect nest (the row loop also holds a let and a store).
    expect_err(
        &r,
        Primitive::Reorder {
            loops: vec!["j".into(), "i".into()],
        },
        "not perfectly nested",
    );
    // A reduction loop carries its accumulator.
    expect_err(
        &r,
        Primitive::Parallel {
            loop_var: "j".into(),
        },
        "accumulator `acc`",
    );
    expect_err(
        &r,
        Primitive::Vectorize {
            loop_var: "j".into(),
        },
        "accumulator `acc`",
    );
    // A loop around a long inner loop is not vectorized (a short one, a window, may be).
    let long = rowred(4, 100, BinOp::Add, DType::F64);
    expect_err(
        &long,
        Primitive::Vectorize {
            loop_var: "i".into(),
        },
        "not innermost",
    );
    {
        let mut k = r.k.clone();
        schedule::apply_primitive(
            &mut k,
            &Primitive::Vectorize {
                loop_var: "i".into(),
            },
        )
        .expect("rows over a 6-wide window vectorize");
    }
    expect_err(
        &r,
        Primitive::Parallel {
            loop_var: "nope".into(),
        },
        "no loop named `nope`",
    );
    expect_err(
        &r,
        Primitive::Split {
            loop_var: "acc".into(),
            factor: 2,
        },
        "not the variable of a loop",
    );
    expect_err(
        &r,
        Primitive::Rfactor {
            loop_var: "i".into(),
            factor: 2,
        },
        "no accumulator",
    );
    expect_err(
        &r,
        Primitive::CacheRead {
            buffer: "nobuf".into(),
            at: "i".into(),
            scope: CacheScope::Local,
        },
        "no buffer",
    );
    expect_err(
        &r,
        Primitive::CacheRead {
            buffer: "out".into(),
            at: "i".into(),
            scope: CacheScope::Local,
        },
        "written inside",
    );
    expect_err(
        &r,
        Primitive::GemmBlocking {
            gemm: None,
            mr: 4,
            nr: 8,
            kc: 8,
            mc: 8,
            nc: 8,
        },
        "no gemm",
    );
    let t = total2d(4, 5);
    expect_err(
        &t,
        Primitive::Parallel {
            loop_var: "i".into(),
        },
        "accumulator `acc`",
    );
    expect_err(
        &t,
        Primitive::Reorder {
            loops: vec!["j".into(), "i".into()],
        },
        "accumulator `acc`",
    );
    let p = prefix(9);
    expect_err(
        &p,
        Primitive::Parallel {
            loop_var: "i".into(),
        },
        "buffer `y`",
    );
    expect_err(
        &p,
        Primitive::Vectorize {
            loop_var: "i".into(),
        },
        "buffer `y`",
    );
    let o = overlap(4);
    expect_err(
        &o,
        Primitive::Parallel {
            loop_var: "o".into(),
        },
        "buffer `out`",
    );
    expect_err(
        &o,
        Primitive::Reorder {
            loops: vec!["i".into(), "o".into()],
        },
        "buffer `out`",
    );
    let a = accum_buf(3, 4);
    expect_err(
        &a,
        Primitive::Parallel {
            loop_var: "j".into(),
        },
        "buffer `out`",
    );
    let e = ew2d(3, 4);
    expect_err(
        &e,
        Primitive::Fuse {
            outer: "j".into(),
            inner: "i".into(),
        },
        "not the only statement",
    );
    expect_err(
        &e,
        Primitive::Reorder {
            loops: vec!["i".into(), "i".into()],
        },
        "twice",
    );
    let big = ew1d(1000);
    expect_err(
        &big,
        Primitive::Unroll {
            loop_var: "i".into(),
        },
        "split it first",
    );
    let s = softmax(3, 4);
    expect_err(
        &s,
        Primitive::ComputeAt {
            producer: "i3".into(),
            at: "i2".into(),
        },
        "does not come after",
    );
    expect_err(
        &s,
        Primitive::ComputeAt {
            producer: "i".into(),
            at: "i3".into(),
        },
        "used between",
    );
    let g = gemm_case(1, 4, 4, 4);
    expect_err(
        &g,
        Primitive::GemmBlocking {
            gemm: None,
            mr: 4,
            nr: 8,
            kc: 8,
            mc: 6,
            nc: 8,
        },
        "multiple",
    );
    expect_err(
        &g,
        Primitive::GemmBlocking {
            gemm: Some("gj".into()),
            mr: 4,
            nr: 8,
            kc: 8,
            mc: 8,
            nc: 8,
        },
        "no gemm",
    );
}

#[test]
fn parallel_inside_parallel_is_refused() {
    let mut k = ew2d(4, 4).k;
    schedule::parallel(&mut k, "i").unwrap();
    let e = schedule::parallel(&mut k, "j").unwrap_err();
    assert!(e.reason.contains("nested in parallel loop `i`"), "{e}");
}

/// Dependence tests that must succeed: fused and split index arithmetic, buffers updated in
/// place by their own iteration, reorder of a reduction through memory keeping its order.
#[test]
fn legal_applications_are_accepted() {
    let mut rng = StdRng::seed_from_u64(3);
    let c = transpose3(3, 4, 5);
    let mut k = c.k.clone();
    let f = schedule::fuse(&mut k, "a", "b").unwrap();
    assert_eq!(f, "a_b");
    schedule::parallel(&mut k, &f).unwrap();
    schedule::split(&mut k, "c", 2).unwrap();
    schedule::vectorize(&mut k, "c_i").unwrap();
    check_same(&c, &k, 0.0, &mut rng, "transpose3 fused");
    // reorder a, c, b of the transpose.
    let mut k = c.k.clone();
    schedule::reorder(&mut k, &["c", "a"]).unwrap();
    assert_eq!(chain(&k, "c"), ["c", "b", "a"]);
    check_same(&c, &k, 0.0, &mut rng, "transpose3 reordered");
    // out[i] updated over j by its own i: i is parallel, j can move outside i.
    let c = accum_buf(5, 7);
    let mut k = c.k.clone();
    schedule::reorder(&mut k, &["j", "i"]).unwrap();
    schedule::parallel(&mut k, "i").unwrap();
    check_same(&c, &k, 0.0, &mut rng, "accum_buf reorder");
    // A split loop, then fused back, is still parallel and vectorizable.
    let c = ew1d(64);
    let mut k = c.k.clone();
    let (o, i) = schedule::split(&mut k, "i", 8).unwrap();
    let (oo, oi) = schedule::split(&mut k, &o, 2).unwrap();
    schedule::reorder(&mut k, &[&oi, &oo]).unwrap();
    let f = schedule::fuse(&mut k, &oi, &oo).unwrap();
    schedule::parallel(&mut k, &f).unwrap();
    schedule::vectorize(&mut k, &i).unwrap();
    check_same(&c, &k, 0.0, &mut rng, "ew1d split/reorder/fuse");
    // The stencil's reads are staged per chunk of 8 outputs: 10 elements.
    let c = stencil(20);
    let mut k = c.k.clone();
    schedule::split(&mut k, "i", 8).unwrap();
    let name = schedule::cache_read(&mut k, "x", "i_i", CacheScope::Register).unwrap();
    let cache = k.buffers.iter().find(|b| b.name == name).unwrap();
    assert_eq!(cache.shape, vec![10]);
    check_same(&c, &k, 0.0, &mut rng, "stencil cache_read");
}

#[test]
fn compute_at_shrinks_row_wise_producers() {
    let mut rng = StdRng::seed_from_u64(5);
    for (m, n) in [(1, 1), (3, 4), (5, 9)] {
        let c = softmax(m, n);
        let mut k = c.k.clone();
        schedule::compute_at(&mut k, "i2", "i3").unwrap();
        assert_eq!(
            k.buffers.iter().find(|b| b.name == "T").unwrap().shape,
            vec![1, n]
        );
        check_same(&c, &k, 0.0, &mut rng, "softmax compute_at T");
        // Now M is only read inside i3 (by the moved producer): move its producer too.
        schedule::compute_at(&mut k, "i", "i3").unwrap();
        assert_eq!(
            k.buffers.iter().find(|b| b.name == "M").unwrap().shape,
            vec![1]
        );
        check_same(&c, &k, 0.0, &mut rng, "softmax compute_at M");
        // The whole kernel is one parallel row loop, the inner loops vectorized where independent.
        schedule::parallel(&mut k, "i3").unwrap();
        schedule::vectorize(&mut k, "j2").unwrap();
        schedule::vectorize(&mut k, "j4").unwrap();
        schedule::rfactor(&mut k, "j3", 4).unwrap();
        schedule::vectorize(&mut k, "j3_i").unwrap();
        check_same(&c, &k, 1e-6, &mut rng, "softmax scheduled");
    }
}

#[test]
fn cache_write_stages_and_writes_back() {
    let mut rng = StdRng::seed_from_u64(9);
    let c = ew2d(4, 6);
    let mut k = c.k.clone();
    let name = schedule::cache_write(&mut k, "out", "j", CacheScope::Register).unwrap();
    assert_eq!(
        k.buffers.iter().find(|b| b.name == name).unwrap().shape,
        vec![1, 6]
    );
    check_same(&c, &k, 0.0, &mut rng, "ew2d cache_write");
    // Read-modify-write: the cache is filled from the buffer first.
    let c = accum_buf(3, 5);
    let mut k = c.k.clone();
    schedule::cache_write(&mut k, "out", "i", CacheScope::Local).unwrap();
    check_same(&c, &k, 0.0, &mut rng, "accum_buf cache_write");
}

#[test]
fn rfactor_splits_reductions() {
    let mut rng = StdRng::seed_from_u64(13);
    for op in [BinOp::Add, BinOp::Max, BinOp::Min, BinOp::Mul] {
        for (n, f) in [
            (16, 4),
            (17, 4),
            (5, 8),
            (9, 1),
            (40, 16),
            (23, 6),
            (64, 32),
        ] {
            let c = rowred(3, n, op, DType::F64);
            let mut k = c.k.clone();
            let (_, i) = schedule::rfactor(&mut k, "j", f).unwrap();
            // Power-of-two factors (at least 4) combine their partials pairwise.
            let f_eff = f.min(n);
            let trees = names(&k).iter().filter(|l| l.starts_with("j_tree")).count();
            let want = if f_eff >= 4 && f_eff.count_ones() == 1 {
                f_eff.trailing_zeros() as usize
            } else {
                0
            };
            assert_eq!(trees, want, "rfactor {op:?} {n} by {f}:\n{k}");
            schedule::vectorize(&mut k, &i).unwrap();
            schedule::parallel(&mut k, "i").unwrap();
            let tol = if op == BinOp::Max || op == BinOp::Min {
                0.0
            } else {
                1e-6
            };
            check_same(&c, &k, tol, &mut rng, &format!("rfactor {op:?} {n} by {f}"));
        }
    }
    let c = colmax_i32(7, 3);
    let mut k = c.k.clone();
    schedule::rfactor(&mut k, "i", 3).unwrap();
    check_same(&c, &k, 0.0, &mut rng, "int rfactor");
    // A reduction over a whole nest, rfactored at its outer loop.
    let c = total2d(6, 5);
    let mut k = c.k.clone();
    schedule::rfactor(&mut k, "i", 4).unwrap();
    check_same(&c, &k, 1e-6, &mut rng, "total2d rfactor");
}

#[test]
fn schedule_json_round_trip_and_display() {
    let s = Schedule {
        steps: vec![
            Primitive::Split {
                loop_var: "i".into(),
                factor: 16,
            },
            Primitive::Reorder {
                loops: vec!["j".into(), "i_o".into()],
            },
            Primitive::Fuse {
                outer: "a".into(),
                inner: "b".into(),
            },
            Primitive::Unroll {
                loop_var: "k".into(),
            },
            Primitive::Vectorize {
                loop_var: "i_i".into(),
            },
            Primitive::Parallel {
                loop_var: "a_b".into(),
            },
            Primitive::CacheRead {
                buffer: "x".into(),
                at: "i".into(),
                scope: CacheScope::Local,
            },
            Primitive::CacheWrite {
                buffer: "y".into(),
                at: "j".into(),
                scope: CacheScope::Register,
            },
            Primitive::ComputeAt {
                producer: "i2".into(),
                at: "i3".into(),
            },
            Primitive::Rfactor {
                loop_var: "j".into(),
                factor: 16,
            },
            Primitive::GemmBlocking {
                gemm: Some("gi".into()),
                mr: 6,
                nr: 32,
                kc: 256,
                mc: 96,
                nc: 4096,
            },
            Primitive::GemmBlocking {
                gemm: None,
                mr: 4,
                nr: 8,
                kc: 64,
                mc: 64,
                nc: 64,
            },
        ],
    };
    let json = s.to_json();
    assert_eq!(Schedule::from_json(&json).unwrap(), s);
    let text = s.to_string();
    assert_eq!(text.lines().count(), s.steps.len());
    assert!(
        text.starts_with("split i by 16\nreorder j, i_o\n"),
        "{text}"
    );
    let parsed = Schedule::from_json(
        r#"{"steps":[{"op":"split","loop":"i","factor":4},{"op":"parallel","loop":"i_o"}]}"#,
    )
    .unwrap();
    assert_eq!(
        parsed.steps[0],
        Primitive::Split {
            loop_var: "i".into(),
            factor: 4
        }
    );
    let mut rng = StdRng::seed_from_u64(2);
    let c = ew1d(10);
    let mut k = c.k.clone();
    schedule::apply(&mut k, &parsed).unwrap();
    check_same(&c, &k, 0.0, &mut rng, "json schedule");
    assert!(Schedule::from_json(r#"{"steps":[{"op":"explode"}]}"#).is_err());
    // A failing step leaves the kernel as it was.
    let bad = Schedule {
        steps: vec![
            parsed.steps[0].clone(),
            Primitive::Parallel {
                loop_var: "zz".into(),
            },
        ],
    };
    let mut k = c.k.clone();
    assert!(schedule::apply(&mut k, &bad).is_err());
    assert_eq!(k, c.k);
}

fn kinds(k: &Kernel) -> Vec<LoopKind> {
    k.loops().iter().map(|l| l.kind).collect()
}

#[test]
fn default_cpu_schedules_apply_and_preserve_results() {
    let mut rng = StdRng::seed_from_u64(17);
    let targets = [
        CpuTarget {
            threads: 8,
            vector_bytes: 64,
            l1_bytes: 48 << 10,
            l2_bytes: 2 << 20,
            ..CpuTarget::default()
        },
        CpuTarget {
            threads: 2,
            vector_bytes: 32,
            l1_bytes: 32 << 10,
            l2_bytes: 1 << 20,
            ..CpuTarget::default()
        },
        CpuTarget {
            threads: 1,
            vector_bytes: 16,
            l1_bytes: 32 << 10,
            l2_bytes: 256 << 10,
            ..CpuTarget::default()
        },
        CpuTarget::host(),
    ];
    let mut cases = all_cases(&mut rng);
    cases.extend([
        ew2d(256, 300),
        ew1d(70_000),
        rowred(64, 1100, BinOp::Add, DType::F64),
        transpose3(2, 200, 200),
        softmax(300, 260),
    ]);
    for t in &targets {
        for c in &cases {
            let s = schedule::default_cpu(&c.k, t);
            let mut k = c.k.clone();
            schedule::apply(&mut k, &s).unwrap_or_else(|e| panic!("{}: {e}\n{s}", c.k.name));
            let tol = if s
                .steps
                .iter()
                .any(|p| matches!(p, Primitive::Rfactor { .. }))
            {
                1e-6
            } else {
                0.0
            };
            check_same(
                c,
                &k,
                tol,
                &mut rng,
                &format!("{} default schedule\n{s}", c.k.name),
            );
            let work: i64 = c.k.params.iter().map(|&b| c.k.buf(b).numel()).sum();
            if work < 10_000 || t.threads == 1 {
                assert!(
                    !kinds(&k).contains(&LoopKind::Parallel),
                    "tiny kernel {} parallelized:\n{s}",
                    c.k.name
                );
            }
        }
    }
    let t = &targets[0];
    // Big elementwise 2-D: parallel rows, vectorized columns.
    let s = schedule::default_cpu(&ew2d(256, 300).k, t);
    assert_eq!(s.to_string(), "parallel i\nvectorize j\n");
    // Big 1-D: chunks of whole vectors in parallel.
    let s = schedule::default_cpu(&ew1d(70_000).k, t);
    let text = s.to_string();
    assert!(
        text.starts_with("split i by ")
            && text.contains("parallel i_o")
            && text.contains("vectorize i_i"),
        "{text}"
    );
    // Few outer iterations: fuse the outer loops first.
    let s = schedule::default_cpu(&transpose3(2, 200, 200).k, t);
    assert!(
        s.to_string().starts_with("fuse a, b\nparallel a_b\n"),
        "{s}"
    );
    // Contiguous reductions: rfactor by the vector width (8 f64 lanes), then vectorize; by
    // four vectors (four chains of additions) from 64 vectors on.
    let s = schedule::default_cpu(&rowred(256, 300, BinOp::Add, DType::F64).k, t);
    assert_eq!(s.to_string(), "parallel i\nrfactor j by 8\nvectorize j_i\n");
    let s = schedule::default_cpu(&rowred(64, 1100, BinOp::Add, DType::F64).k, t);
    assert_eq!(s.to_string(), "parallel i\nrfactor j by 32\nvectorize j_i\n");
    let s = schedule::default_cpu(&rowred(4, 256, BinOp::Max, DType::F32).k, t);
    assert_eq!(s.to_string(), "rfactor j by 16\nvectorize j_i\n");
    // Gemm blocking from the vector width: 16 f32 lanes, nr two vectors, mr 8 (16
    // accumulators of the 32 AVX-512 registers).
    let s = schedule::default_cpu(&gemm_case(2, 64, 64, 64).k, t);
    match &s.steps[0] {
        Primitive::GemmBlocking {
            mr, nr, kc, mc, nc, ..
        } => {
            assert_eq!((*mr, *nr), (8, 32));
            assert!(*kc >= 8 && *kc <= 64 && mc % mr == 0 && nc % nr == 0, "{s}");
        }
        p => panic!("{p}"),
    }
    // Fewer rows than a tile (a matrix-vector product): mr is the row count, not 8.
    for m in [1, 3] {
        let s = schedule::default_cpu(&gemm_case(1, m, 200, 64).k, t);
        let mr = s.steps.iter().find_map(|p| match p {
            Primitive::GemmBlocking { mr, nr, .. } => Some((*mr, *nr)),
            _ => None,
        });
        assert_eq!(mr, Some((m, 32)), "{s}");
    }
    // A column reduction over a short window: the column loop is vectorized around it.
    let s = schedule::default_cpu(&colmax_i32(8, 8).k, t);
    assert_eq!(s.to_string(), "vectorize j\n");
    // Over a long one: nothing to vectorize (strided and carried).
    let s = schedule::default_cpu(&colmax_i32(100, 8).k, t);
    assert!(s.steps.is_empty(), "{s}");
}

/// Extreme or malformed parameters are refused with errors, never panics.
#[test]
fn extreme_parameters_are_refused_or_harmless() {
    let mut rng = StdRng::seed_from_u64(23);
    let weird = [i64::MIN, -1, 0, 1, i64::MAX];
    for case in all_cases(&mut rng) {
        let mut ps = vec![
            Primitive::Reorder { loops: vec![] },
            Primitive::Split {
                loop_var: String::new(),
                factor: 2,
            },
            Primitive::CacheRead {
                buffer: String::new(),
                at: String::new(),
                scope: CacheScope::Local,
            },
        ];
        for l in names(&case.k) {
            for &f in &weird {
                ps.push(Primitive::Split {
                    loop_var: l.clone(),
                    factor: f,
                });
                ps.push(Primitive::Rfactor {
                    loop_var: l.clone(),
                    factor: f,
                });
            }
            ps.push(Primitive::ComputeAt {
                producer: l.clone(),
                at: l.clone(),
            });
            ps.push(Primitive::Fuse {
                outer: l.clone(),
                inner: l.clone(),
            });
        }
        for &x in &weird {
            ps.push(Primitive::GemmBlocking {
                gemm: None,
                mr: x,
                nr: x,
                kc: x,
                mc: x,
                nc: x,
            });
        }
        for p in ps {
            let mut k = case.k.clone();
            match schedule::apply_primitive(&mut k, &p) {
                Ok(()) => {
                    let tol = if matches!(p, Primitive::Rfactor { .. }) {
                        1e-6
                    } else {
                        0.0
                    };
                    check_same(
                        &case,
                        &k,
                        tol,
                        &mut rng,
                        &format!("{} after `{p}`", case.k.name),
                    );
                }
                Err(e) => {
                    assert_eq!(k, case.k);
                    assert!(!e.reason.is_empty());
                }
            }
        }
    }
}

/// Rows of a flattened image written as register blocks (`h * w + b * 8 + j`) and a tail of
/// single pixels (`h * w + c`): the rows are independent when every block and the tail stay
/// within a row (the forms share `h * w`, the rest spreads less than `w`), and not when
/// the blocks run past the row.
#[test]
fn parallel_rows_of_flattened_blocks() {
    let build = |w: i64, blocks: i64, tail: i64| {
        let d = DType::F32;
        let mut k = Kernel::new("flat_rows");
        let x = k.param("x", d, vec![4]);
        let out = k.param("out", d, vec![4 * w + 64]);
        let (h, b) = (k.index_var("h"), k.index_var("b"));
        let row = Expr::mul(v(h), Expr::Int(w));
        let mut block = vec![];
        for j in 0..8 {
            let idx = Expr::add(Expr::add(row.clone(), Expr::mul(v(b), Expr::Int(8))), Expr::Int(j));
            block.push(Stmt::store(out, vec![idx], ld(x, vec![v(h)])));
        }
        let mut body = vec![for_(b, blocks, block)];
        for t in 0..tail {
            let idx = Expr::add(row.clone(), Expr::Int(blocks * 8 + t));
            body.push(Stmt::store(out, vec![idx], ld(x, vec![v(h)])));
        }
        k.body.push(for_(h, 4, body));
        k
    };
    let par = Primitive::Parallel { loop_var: "h".into() };
    let mut ok = build(20, 2, 4);
    schedule::apply_primitive(&mut ok, &par).expect("blocks and tail within a row of 20");
    let mut bad = build(20, 3, 0);
    let e = schedule::apply_primitive(&mut bad, &par).expect_err("blocks of 24 pixels over rows of 20 overlap");
    assert!(e.to_string().contains("cannot prove"), "{e}");
}
