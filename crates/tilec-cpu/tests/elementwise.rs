//! Elementwise kernels over every dtype, compiled and compared with the interpreter.

mod common;
use common::*;
use tilec_ir::DType;
use tilec_tile::ir::*;

const N: i64 = 257;

fn binary_ops(d: DType) -> Vec<BinOp> {
    use BinOp::*;
    if d.is_float() {
        vec![
            Add, Sub, Mul, Div, Rem, FloorDiv, FloorMod, Min, Max, Pow, Atan2,
        ]
    } else if d == DType::Bool {
        vec![]
    } else {
        vec![
            Add, Sub, Mul, Div, Rem, FloorDiv, FloorMod, Min, Max, Pow, BitAnd, BitOr, BitXor, Shl,
            Shr,
        ]
    }
}

fn compare_ops() -> Vec<BinOp> {
    use BinOp::*;
    vec![Lt, Le, Gt, Ge, Eq, Ne, And, Or, Xor]
}

/// `out[o, i] = op_o(x[i], y[i])` for every arithmetic op and `cmp[o, i]` for comparisons, in
/// a loop of the given kind. Integer divisors avoid zero (the interpreter rejects it).
fn binary_kernel(d: DType, kind: LoopKind) -> Kernel {
    let ops = binary_ops(d);
    let cmps = compare_ops();
    let mut k = Kernel::new(format!("bin_{d}_{kind:?}").to_lowercase());
    let x = k.param("x", d, vec![N]);
    let y = k.param("y", d, vec![N]);
    let out = k.param("out", d, vec![ops.len().max(1) as i64, N]);
    let cmp = k.param("cmp", DType::Bool, vec![cmps.len() as i64, N]);
    let i = k.index_var("i");
    let yv = k.new_var("yv", Ty::Elem(d), false);
    let mut body = vec![];
    let ld = |b| Expr::load(b, vec![v(i)]);
    // A nonzero, small divisor / shift / exponent for integers.
    let y_safe = if d.is_float() || d == DType::Bool {
        ld(y)
    } else {
        let one = Expr::Lit(
            if matches!(d, DType::U8 | DType::U16 | DType::U32 | DType::U64) {
                Lit::UInt(1, d)
            } else {
                Lit::Int(1, d)
            },
        );
        let seven = Expr::Lit(
            if matches!(d, DType::U8 | DType::U16 | DType::U32 | DType::U64) {
                Lit::UInt(7, d)
            } else {
                Lit::Int(7, d)
            },
        );
        let m = Expr::bin(BinOp::BitAnd, ld(y), seven);
        Expr::select(
            Expr::bin(BinOp::Eq, m.clone(), Expr::Lit(Lit::Int(0, d))),
            one,
            m,
        )
    };
    body.push(Stmt::Let {
        var: yv,
        value: y_safe,
    });
    for (o, op) in ops.iter().enumerate() {
        // Division-like ops and shifts/pow take the small operand; others the raw one.
        let rhs = match op {
            BinOp::Div
            | BinOp::Rem
            | BinOp::FloorDiv
            | BinOp::FloorMod
            | BinOp::Pow
            | BinOp::Shl
            | BinOp::Shr
                if !d.is_float() =>
            {
                v(yv)
            }
            _ => ld(y),
        };
        // Signed division by a negative divisor is covered by negating x's sign half the time.
        body.push(Stmt::store(
            out,
            vec![Expr::Int(o as i64), v(i)],
            Expr::bin(*op, ld(x), rhs),
        ));
    }
    if ops.is_empty() {
        body.push(Stmt::store(
            out,
            vec![Expr::Int(0), v(i)],
            Expr::un(UnOp::Not, ld(x)),
        ));
    }
    for (o, op) in cmps.iter().enumerate() {
        body.push(Stmt::store(
            cmp,
            vec![Expr::Int(o as i64), v(i)],
            Expr::bin(*op, ld(x), ld(y)),
        ));
    }
    k.body.push(Stmt::For(Loop {
        var: i,
        extent: N,
        kind,
        body,
    }));
    k
}

fn unary_ops(d: DType) -> Vec<UnOp> {
    use UnOp::*;
    if d.is_float() {
        vec![
            Neg, Abs, Sqrt, Rsqrt, Recip, Exp, Log, Sin, Cos, Tan, Asin, Acos, Atan, Sinh, Cosh,
            Tanh, Asinh, Acosh, Atanh, Erf, Floor, Ceil, Round, Trunc, Sign, Sigmoid, Not,
        ]
    } else {
        vec![Neg, Abs, BitNot, Sign, Not]
    }
}

fn unary_kernel(d: DType, kind: LoopKind) -> Kernel {
    let ops = unary_ops(d);
    let mut k = Kernel::new(format!("un_{d}_{kind:?}").to_lowercase());
    let x = k.param("x", d, vec![N]);
    let out = k.param("out", d, vec![ops.len() as i64, N]);
    let i = k.index_var("i");
    let mut body = vec![];
    for (o, op) in ops.iter().enumerate() {
        let mut arg = Expr::load(x, vec![v(i)]);
        if *op == UnOp::Erf {
            // The interpreter's erf series does not terminate at exactly 0: keep zeros away.
            let zero = Expr::Lit(Lit::Float(0.0, d));
            arg = Expr::select(
                Expr::bin(BinOp::Eq, arg.clone(), zero),
                Expr::Lit(Lit::Float(0.25, d)),
                arg,
            );
        }
        let e = Expr::un(*op, arg);
        // Boolean results are stored through a cast to the dtype.
        let e = if *op == UnOp::Not {
            Expr::cast(d, e)
        } else {
            e
        };
        body.push(Stmt::store(out, vec![Expr::Int(o as i64), v(i)], e));
    }
    k.body.push(Stmt::For(Loop {
        var: i,
        extent: N,
        kind,
        body,
    }));
    k
}

fn transcendental_tol(k: &Kernel, d: DType) -> Tol {
    let t = tol_for(d);
    if k.name.starts_with("un_") && d == DType::F32 {
        // Vectorized exp/tanh/erf are within a few ulp.
        Tol {
            rel: 1e-5,
            abs: 1e-6,
        }
    } else {
        t
    }
}

#[test]
fn binary_ops_every_dtype() {
    let mut ks = vec![];
    for d in DType::ALL {
        ks.push(binary_kernel(d, LoopKind::Serial));
    }
    ks.push(binary_kernel(DType::F32, LoopKind::Vectorized));
    ks.push(binary_kernel(DType::I32, LoopKind::Parallel));
    ks.push(binary_kernel(DType::F16, LoopKind::Vectorized));
    check_kernels(&ks, 1, true, |_, d| tol_for(d));
}

#[test]
fn unary_ops_every_dtype() {
    let mut ks = vec![];
    for d in DType::ALL {
        if d != DType::Bool {
            ks.push(unary_kernel(d, LoopKind::Serial));
        }
    }
    ks.push(unary_kernel(DType::F32, LoopKind::Vectorized));
    ks.push(unary_kernel(DType::F32, LoopKind::Parallel));
    ks.push(unary_kernel(DType::BF16, LoopKind::Vectorized));
    check_kernels(&ks, 2, true, transcendental_tol);
}

/// `out[i] = cast<to>(x[i] * scale)` for every pair of dtypes; scaled values leave the target's
/// range to exercise wrapping and saturation.
#[test]
fn casts_between_every_pair() {
    let mut ks = vec![];
    for from in DType::ALL {
        for to in DType::ALL {
            let mut k = Kernel::new(format!("cast_{from}_{to}"));
            let x = k.param("x", from, vec![N]);
            let out = k.param("out", to, vec![N]);
            let i = k.index_var("i");
            let xv = Expr::load(x, vec![v(i)]);
            let src = if from.is_float() {
                Expr::bin(
                    BinOp::Mul,
                    xv,
                    Expr::float(if from == DType::F8E4M3 { 64.0 } else { 1000.0 }, from),
                )
            } else {
                xv
            };
            k.body.push(Stmt::For(Loop {
                var: i,
                extent: N,
                kind: LoopKind::Vectorized,
                body: vec![Stmt::store(out, vec![v(i)], Expr::cast(to, src))],
            }));
            ks.push(k);
        }
    }
    check_kernels(&ks, 3, true, |_, d| tol_for(d));
}

/// Float-to-index conversion and index arithmetic with floor division of negative values.
#[test]
fn index_conversions_and_floor_division() {
    let mut k = Kernel::new("index_math");
    let x = k.param("x", DType::F32, vec![N]);
    let out = k.param("out", DType::I64, vec![4, N]);
    let i = k.index_var("i");
    let t = k.index_var("t");
    let xi = Expr::ToIndex(Box::new(Expr::bin(
        BinOp::Mul,
        Expr::load(x, vec![v(i)]),
        Expr::f32(3.0),
    )));
    let body = vec![
        Stmt::Let {
            var: t,
            value: Expr::bin(BinOp::Sub, v(i), Expr::Int(100)),
        },
        Stmt::store(out, vec![Expr::Int(0), v(i)], Expr::cast(DType::I64, xi)),
        Stmt::store(
            out,
            vec![Expr::Int(1), v(i)],
            Expr::cast(DType::I64, Expr::bin(BinOp::FloorDiv, v(t), Expr::Int(7))),
        ),
        Stmt::store(
            out,
            vec![Expr::Int(2), v(i)],
            Expr::cast(DType::I64, Expr::bin(BinOp::FloorMod, v(t), Expr::Int(7))),
        ),
        Stmt::store(
            out,
            vec![Expr::Int(3), v(i)],
            Expr::cast(DType::I64, Expr::bin(BinOp::FloorDiv, v(t), Expr::Int(-3))),
        ),
    ];
    k.body.push(Stmt::For(Loop {
        var: i,
        extent: N,
        kind: LoopKind::Serial,
        body,
    }));
    check_kernels(&[k], 4, true, |_, d| tol_for(d));
}

/// Integer division by zero yields 0 instead of trapping; NaN tests see real NaNs.
#[test]
fn division_by_zero_and_nan_tests_do_not_trap() {
    let mut k = Kernel::new("div0");
    let x = k.param("x", DType::I32, vec![N]);
    let f = k.param("f", DType::F32, vec![N]);
    let out = k.param("out", DType::I32, vec![3, N]);
    let flags = k.param("flags", DType::Bool, vec![2, N]);
    let i = k.index_var("i");
    let zero = Expr::Lit(Lit::Int(0, DType::I32));
    let minus1 = Expr::Lit(Lit::Int(-1, DType::I32));
    let fx = Expr::load(f, vec![v(i)]);
    let body = vec![
        Stmt::store(
            out,
            vec![Expr::Int(0), v(i)],
            Expr::bin(BinOp::Div, Expr::load(x, vec![v(i)]), zero.clone()),
        ),
        Stmt::store(
            out,
            vec![Expr::Int(1), v(i)],
            Expr::bin(BinOp::Rem, Expr::load(x, vec![v(i)]), zero),
        ),
        Stmt::store(
            out,
            vec![Expr::Int(2), v(i)],
            Expr::bin(
                BinOp::Div,
                Expr::Lit(Lit::Int(i32::MIN as i64, DType::I32)),
                minus1,
            ),
        ),
        Stmt::store(
            flags,
            vec![Expr::Int(0), v(i)],
            Expr::un(UnOp::IsNan, fx.clone()),
        ),
        Stmt::store(flags, vec![Expr::Int(1), v(i)], Expr::un(UnOp::IsInf, fx)),
    ];
    k.body.push(Stmt::For(Loop {
        var: i,
        extent: N,
        kind: LoopKind::Serial,
        body,
    }));
    let m = compiler().compile(&[k.clone()]).unwrap();
    let mut r = rng(5);
    let mut args = make_args(&k, &mut r, true);
    let fin = args[1].to_f64_vec();
    m.run("div0", &mut args).unwrap();
    let o = args[2].to_i64_vec();
    let fl = args[3].to_i64_vec();
    for j in 0..N as usize {
        assert_eq!(o[j], 0, "x / 0");
        assert_eq!(o[N as usize + j], 0, "x % 0");
        assert_eq!(o[2 * N as usize + j], i32::MIN as i64, "MIN / -1 wraps");
        assert_eq!(fl[j] != 0, fin[j].is_nan(), "isnan({})", fin[j]);
        assert_eq!(
            fl[N as usize + j] != 0,
            fin[j].is_infinite(),
            "isinf({})",
            fin[j]
        );
    }
}

/// Sigmoid, SiLU and tanh over a ramp of 4001 points across [-125, 125] (exact in f32; results
/// from 1 down to below 2^-126 and every regime of the exponential between), vectorized and
/// serial, against the interpreter: within 3 ulp wherever the sigmoid is a normal number (tanh
/// exactly 1 from 10 on); below 2^-126 the sigmoid is
/// 0, and SiLU's product by x then -0 (as PyTorch's `x / (1 + exp(-x))` gives it), so the
/// absolute tolerance is 125 * 2^-126.
#[test]
fn sigmoid_silu_and_tanh_across_their_range() {
    const M: i64 = 4001;
    let mut ks = vec![];
    for kind in [LoopKind::Vectorized, LoopKind::Serial] {
        let mut k = Kernel::new(format!("sigmoid_{kind:?}").to_lowercase());
        let out = k.param("out", DType::F32, vec![3, M]);
        let i = k.index_var("i");
        let x = Expr::bin(
            BinOp::Mul,
            Expr::cast(DType::F32, Expr::bin(BinOp::Sub, v(i), Expr::Int(M / 2))),
            Expr::float(0.0625, DType::F32),
        );
        k.body.push(Stmt::For(Loop {
            var: i,
            extent: M,
            kind,
            body: vec![
                Stmt::store(out, vec![Expr::Int(0), v(i)], Expr::un(UnOp::Sigmoid, x.clone())),
                Stmt::store(out, vec![Expr::Int(1), v(i)], Expr::un(UnOp::Silu, x.clone())),
                Stmt::store(out, vec![Expr::Int(2), v(i)], Expr::un(UnOp::Tanh, x)),
            ],
        }));
        ks.push(k);
    }
    check_kernels(&ks, 3, false, |_, _| Tol { rel: 3.6e-7, abs: 1.5e-36 });
}
