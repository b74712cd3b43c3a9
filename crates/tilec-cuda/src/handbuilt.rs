//! Hand-built row-wise and elementwise kernels in the shape the lowering produces (outer loop
//! over rows, reductions into mutable accumulators, then a loop writing the row), with plain
//! Rust references. Used by the tests and the GPU benchmark.
//!
//! For 16-bit dtypes every load is converted to f32, accumulators are f32, and stores convert
//! back, as the lowering does for normalizations.

use tilec_ir::DType;
use tilec_tile::*;

fn ld(k: &Kernel, b: BufId, idx: Vec<Expr>) -> Expr {
    let e = Expr::load(b, idx);
    if k.buf(b).dtype == DType::F32 {
        e
    } else {
        Expr::cast(DType::F32, e)
    }
}

fn st(k: &Kernel, b: BufId, idx: Vec<Expr>, v: Expr) -> Stmt {
    let d = k.buf(b).dtype;
    Stmt::store(b, idx, if d == DType::F32 { v } else { Expr::cast(d, v) })
}

fn v(x: VarId) -> Expr {
    Expr::Var(x)
}

fn f32v(k: &mut Kernel, name: &str) -> VarId {
    k.new_var(name, Ty::Elem(DType::F32), true)
}

fn let_(k: &mut Kernel, name: &str, value: Expr) -> (VarId, Stmt) {
    let x = k.new_var(name, Ty::Elem(DType::F32), false);
    (x, Stmt::Let { var: x, value })
}

fn add(a: Expr, b: Expr) -> Expr {
    Expr::bin(BinOp::Add, a, b)
}
fn sub(a: Expr, b: Expr) -> Expr {
    Expr::bin(BinOp::Sub, a, b)
}
fn mul(a: Expr, b: Expr) -> Expr {
    Expr::bin(BinOp::Mul, a, b)
}

/// `y = softmax(x)` over the last axis of `[rows, cols]`.
pub fn softmax(rows: i64, cols: i64, d: DType) -> Kernel {
    let mut k = Kernel::new(format!("softmax_{}", d.name()));
    let x = k.param("x", d, vec![rows, cols]);
    let y = k.param("y", d, vec![rows, cols]);
    let (i0, r0, r1, i1) = (
        k.index_var("i0"),
        k.index_var("r0"),
        k.index_var("r1"),
        k.index_var("i1"),
    );
    let mx = f32v(&mut k, "mx");
    let s = f32v(&mut k, "s");
    let xr0 = ld(&k, x, vec![v(i0), v(r0)]);
    let xr1 = ld(&k, x, vec![v(i0), v(r1)]);
    let xi1 = ld(&k, x, vec![v(i0), v(i1)]);
    let out = st(
        &k,
        y,
        vec![v(i0), v(i1)],
        Expr::bin(BinOp::Div, Expr::un(UnOp::Exp, sub(xi1, v(mx))), v(s)),
    );
    k.body.push(Stmt::for_(
        i0,
        rows,
        vec![
            Stmt::Let {
                var: mx,
                value: Expr::f32(f32::NEG_INFINITY),
            },
            Stmt::for_(
                r0,
                cols,
                vec![Stmt::Assign {
                    var: mx,
                    value: Expr::bin(BinOp::Max, v(mx), xr0),
                }],
            ),
            Stmt::Let {
                var: s,
                value: Expr::f32(0.0),
            },
            Stmt::for_(
                r1,
                cols,
                vec![Stmt::Assign {
                    var: s,
                    value: add(v(s), Expr::un(UnOp::Exp, sub(xr1, v(mx)))),
                }],
            ),
            Stmt::for_(i1, cols, vec![out]),
        ],
    ));
    k
}

/// `y = (x - mean) / sqrt(var + eps) * gamma + beta` over the last axis (two-pass variance).
pub fn layernorm(rows: i64, cols: i64, d: DType, eps: f32) -> Kernel {
    let mut k = Kernel::new(format!("layernorm_{}", d.name()));
    let x = k.param("x", d, vec![rows, cols]);
    let g = k.param("gamma", d, vec![cols]);
    let b = k.param("beta", d, vec![cols]);
    let y = k.param("y", d, vec![rows, cols]);
    let (i0, r0, r1, i1) = (
        k.index_var("i0"),
        k.index_var("r0"),
        k.index_var("r1"),
        k.index_var("i1"),
    );
    let s = f32v(&mut k, "s");
    let q = f32v(&mut k, "q");
    let n = Expr::f32(cols as f32);
    let (mean, let_mean) = let_(&mut k, "mean", Expr::bin(BinOp::Div, v(s), n.clone()));
    let (rstd, let_rstd) = let_(
        &mut k,
        "rstd",
        Expr::un(
            UnOp::Rsqrt,
            add(Expr::bin(BinOp::Div, v(q), n), Expr::f32(eps)),
        ),
    );
    let xr0 = ld(&k, x, vec![v(i0), v(r0)]);
    let dev = sub(ld(&k, x, vec![v(i0), v(r1)]), v(mean));
    let norm = mul(sub(ld(&k, x, vec![v(i0), v(i1)]), v(mean)), v(rstd));
    let val = add(mul(norm, ld(&k, g, vec![v(i1)])), ld(&k, b, vec![v(i1)]));
    let out = st(&k, y, vec![v(i0), v(i1)], val);
    k.body.push(Stmt::for_(
        i0,
        rows,
        vec![
            Stmt::Let {
                var: s,
                value: Expr::f32(0.0),
            },
            Stmt::for_(
                r0,
                cols,
                vec![Stmt::Assign {
                    var: s,
                    value: add(v(s), xr0),
                }],
            ),
            let_mean,
            Stmt::Let {
                var: q,
                value: Expr::f32(0.0),
            },
            Stmt::for_(
                r1,
                cols,
                vec![Stmt::Assign {
                    var: q,
                    value: add(v(q), mul(dev.clone(), dev)),
                }],
            ),
            let_rstd,
            Stmt::for_(i1, cols, vec![out]),
        ],
    ));
    k
}

/// `y = x / sqrt(mean(x^2) + eps) * w` over the last axis.
pub fn rmsnorm(rows: i64, cols: i64, d: DType, eps: f32) -> Kernel {
    let mut k = Kernel::new(format!("rmsnorm_{}", d.name()));
    let x = k.param("x", d, vec![rows, cols]);
    let w = k.param("w", d, vec![cols]);
    let y = k.param("y", d, vec![rows, cols]);
    let (i0, r0, i1) = (k.index_var("i0"), k.index_var("r0"), k.index_var("i1"));
    let q = f32v(&mut k, "q");
    let (rstd, let_rstd) = let_(
        &mut k,
        "rstd",
        Expr::un(
            UnOp::Rsqrt,
            add(
                Expr::bin(BinOp::Div, v(q), Expr::f32(cols as f32)),
                Expr::f32(eps),
            ),
        ),
    );
    let xr0 = ld(&k, x, vec![v(i0), v(r0)]);
    let val = mul(
        mul(ld(&k, x, vec![v(i0), v(i1)]), v(rstd)),
        ld(&k, w, vec![v(i1)]),
    );
    let out = st(&k, y, vec![v(i0), v(i1)], val);
    k.body.push(Stmt::for_(
        i0,
        rows,
        vec![
            Stmt::Let {
                var: q,
                value: Expr::f32(0.0),
            },
            Stmt::for_(
                r0,
                cols,
                vec![Stmt::Assign {
                    var: q,
                    value: add(v(q), mul(xr0.clone(), xr0)),
                }],
            ),
            let_rstd,
            Stmt::for_(i1, cols, vec![out]),
        ],
    ));
    k
}

/// `y = gelu(x * w + b)` (erf form) with `w`, `b` vectors over the last axis.
pub fn gelu_bias(rows: i64, cols: i64, d: DType) -> Kernel {
    let mut k = Kernel::new(format!("gelu_bias_{}", d.name()));
    let x = k.param("x", d, vec![rows, cols]);
    let w = k.param("w", d, vec![cols]);
    let b = k.param("b", d, vec![cols]);
    let y = k.param("y", d, vec![rows, cols]);
    let (i0, i1) = (k.index_var("i0"), k.index_var("i1"));
    let t_val = add(
        mul(ld(&k, x, vec![v(i0), v(i1)]), ld(&k, w, vec![v(i1)])),
        ld(&k, b, vec![v(i1)]),
    );
    let (t, let_t) = let_(&mut k, "t", t_val);
    let gelu = Expr::un(UnOp::GeluErf, v(t));
    let out = st(&k, y, vec![v(i0), v(i1)], gelu);
    k.body.push(Stmt::for_(
        i0,
        rows,
        vec![Stmt::for_(i1, cols, vec![let_t, out])],
    ));
    k
}

/// Plain f64 references on one row (inputs already converted to f64).
pub mod reference {
    pub fn softmax(x: &[f64]) -> Vec<f64> {
        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }
    pub fn layernorm(x: &[f64], g: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let r = 1.0 / (var + eps).sqrt();
        x.iter()
            .zip(g)
            .zip(b)
            .map(|((v, g), b)| (v - mean) * r * g + b)
            .collect()
    }
    pub fn rmsnorm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
        let n = x.len() as f64;
        let ms = x.iter().map(|v| v * v).sum::<f64>() / n;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter().zip(w).map(|(v, w)| v * r * w).collect()
    }
    pub fn gelu_bias(x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
        x.iter()
            .zip(w)
            .zip(b)
            .map(|((v, w), b)| {
                let t = v * w + b;
                0.5 * t * (1.0 + tilec_ref::kernels::elementwise::erf(t / std::f64::consts::SQRT_2))
            })
            .collect()
    }
}
