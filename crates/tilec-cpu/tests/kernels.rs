//! Loop nests: reductions with accumulators, local buffers, parallel/vector/unrolled loops.

mod common;
use common::*;
use tilec_ir::DType;
use tilec_tile::ir::*;

/// `out[i] = sum_j x[i, j]` and `mx[i] = max_j x[i, j]` with mutable accumulators; the inner
/// loop kind varies (a vectorized sum becomes an OpenMP reduction).
fn reduce_kernel(
    name: &str,
    d: DType,
    rows: i64,
    cols: i64,
    outer: LoopKind,
    inner: LoopKind,
) -> Kernel {
    let mut k = Kernel::new(name);
    let x = k.param("x", d, vec![rows, cols]);
    let out = k.param("sum", d, vec![rows]);
    let mx = k.param("max", d, vec![rows]);
    let (i, j) = (k.index_var("i"), k.index_var("j"));
    let acc = k.new_var("acc", Ty::Elem(d), true);
    let m = k.new_var("m", Ty::Elem(d), true);
    let xij = Expr::load(x, vec![v(i), v(j)]);
    let lowest = if d.is_float() {
        Expr::Lit(Lit::Float(f64::NEG_INFINITY, d))
    } else {
        Expr::Lit(Lit::Int(i64::MIN, d))
    };
    let zero = if d.is_float() {
        Expr::Lit(Lit::Float(0.0, d))
    } else {
        Expr::Lit(Lit::Int(0, d))
    };
    let sum_loop = Stmt::For(Loop {
        var: j,
        extent: cols,
        kind: inner,
        body: vec![Stmt::Assign {
            var: acc,
            value: Expr::bin(BinOp::Add, v(acc), xij.clone()),
        }],
    });
    let j2 = k.index_var("j2");
    let max_loop = Stmt::for_(
        j2,
        cols,
        vec![Stmt::Assign {
            var: m,
            value: Expr::bin(BinOp::Max, v(m), Expr::load(x, vec![v(i), v(j2)])),
        }],
    );
    k.body.push(Stmt::For(Loop {
        var: i,
        extent: rows,
        kind: outer,
        body: vec![
            Stmt::Let {
                var: acc,
                value: zero,
            },
            sum_loop,
            Stmt::store(out, vec![v(i)], v(acc)),
            Stmt::Let {
                var: m,
                value: lowest,
            },
            max_loop,
            Stmt::store(mx, vec![v(i)], v(m)),
        ],
    }));
    k
}

#[test]
fn reductions_with_accumulators() {
    let ks = vec![
        reduce_kernel(
            "red_f32",
            DType::F32,
            33,
            257,
            LoopKind::Parallel,
            LoopKind::Serial,
        ),
        reduce_kernel(
            "red_f32_simd",
            DType::F32,
            7,
            257,
            LoopKind::Serial,
            LoopKind::Vectorized,
        ),
        reduce_kernel(
            "red_f64_simd",
            DType::F64,
            7,
            33,
            LoopKind::Parallel,
            LoopKind::Vectorized,
        ),
        reduce_kernel(
            "red_f16",
            DType::F16,
            7,
            33,
            LoopKind::Parallel,
            LoopKind::Vectorized,
        ),
        reduce_kernel(
            "red_i32",
            DType::I32,
            33,
            7,
            LoopKind::Parallel,
            LoopKind::Vectorized,
        ),
        reduce_kernel(
            "red_u8",
            DType::U8,
            1,
            257,
            LoopKind::Serial,
            LoopKind::Serial,
        ),
        reduce_kernel(
            "red_one",
            DType::F32,
            1,
            1,
            LoopKind::Parallel,
            LoopKind::Vectorized,
        ),
    ];
    // Vectorized float sums are reassociated: compare with a summation tolerance.
    check_kernels(&ks, 10, false, |k, d| match (k.name.as_str(), d) {
        (_, DType::F32) => Tol {
            rel: 1e-5,
            abs: 1e-4,
        },
        (_, DType::F16) => Tol {
            rel: 1e-2,
            abs: 0.1,
        },
        (_, d) => tol_for(d),
    });
    // NaN inputs propagate through the max reduction.
    check_kernels(
        &[reduce_kernel(
            "red_nan",
            DType::F32,
            7,
            33,
            LoopKind::Parallel,
            LoopKind::Serial,
        )],
        11,
        true,
        |_, d| tol_for(d),
    );
}

/// A local staging buffer (stack) and a large one (heap), written then read reversed; a
/// register-scope array in an unrolled loop.
#[test]
fn local_buffers_and_unrolled_loops() {
    let n = 257i64;
    let big = 20_000i64;
    let mut k = Kernel::new("locals");
    let x = k.param("x", DType::F32, vec![7, n]);
    let out = k.param("out", DType::F32, vec![7, n]);
    let out2 = k.param("out2", DType::F32, vec![7]);
    let tmp = k.buffer("tmp", DType::F32, vec![n], Scope::Local);
    let heap = k.buffer("heap", DType::F32, vec![big], Scope::Local);
    let reg = k.buffer("reg", DType::F32, vec![4], Scope::Register);
    let (r, i, j, u, w) = (
        k.index_var("r"),
        k.index_var("i"),
        k.index_var("j"),
        k.index_var("u"),
        k.index_var("w"),
    );
    let s = k.new_var("s", Ty::Elem(DType::F32), true);
    let body = vec![
        Stmt::Alloc(tmp),
        Stmt::Alloc(heap),
        Stmt::Alloc(reg),
        Stmt::For(Loop {
            var: i,
            extent: n,
            kind: LoopKind::Vectorized,
            body: vec![Stmt::store(
                tmp,
                vec![v(i)],
                Expr::bin(BinOp::Mul, Expr::load(x, vec![v(r), v(i)]), Expr::f32(2.0)),
            )],
        }),
        Stmt::for_(
            w,
            big,
            vec![Stmt::store(heap, vec![v(w)], Expr::cast(DType::F32, v(w)))],
        ),
        Stmt::for_(
            j,
            n,
            vec![Stmt::store(
                out,
                vec![v(r), v(j)],
                Expr::bin(
                    BinOp::Add,
                    Expr::load(tmp, vec![Expr::bin(BinOp::Sub, Expr::Int(n - 1), v(j))]),
                    Expr::load(heap, vec![Expr::bin(BinOp::Mul, v(j), Expr::Int(big / n))]),
                ),
            )],
        ),
        Stmt::For(Loop {
            var: u,
            extent: 4,
            kind: LoopKind::Unrolled,
            body: vec![Stmt::store(reg, vec![v(u)], Expr::load(tmp, vec![v(u)]))],
        }),
        Stmt::Let {
            var: s,
            value: Expr::f32(0.0),
        },
        Stmt::For(Loop {
            var: k.index_var("u2"),
            extent: 4,
            kind: LoopKind::Unrolled,
            body: vec![],
        }),
    ];
    // The second unrolled loop sums the register array.
    let mut body = body;
    let u2 = k.var_named("u2").unwrap();
    body[8] = Stmt::For(Loop {
        var: u2,
        extent: 4,
        kind: LoopKind::Unrolled,
        body: vec![Stmt::Assign {
            var: s,
            value: Expr::bin(BinOp::Add, v(s), Expr::load(reg, vec![v(u2)])),
        }],
    });
    body.push(Stmt::store(out2, vec![v(r)], v(s)));
    k.body.push(Stmt::For(Loop {
        var: r,
        extent: 7,
        kind: LoopKind::Parallel,
        body,
    }));
    check_kernels(&[k], 12, true, |_, d| tol_for(d));
}

/// Nested parallel loops render the inner one serially; ifs and selects with out-of-range
/// guarded loads (padding) never read outside the buffer.
#[test]
fn nested_parallel_and_guarded_loads() {
    let (h, w) = (7i64, 33i64);
    let mut k = Kernel::new("pad_blur");
    let x = k.param("x", DType::F32, vec![h, w]);
    let out = k.param("out", DType::F32, vec![h, w]);
    let flag = k.param("flag", DType::I8, vec![h, w]);
    let (i, j, d) = (k.index_var("i"), k.index_var("j"), k.index_var("d"));
    let acc = k.new_var("acc", Ty::Elem(DType::F32), true);
    let jj = Expr::bin(BinOp::Add, v(j), Expr::bin(BinOp::Sub, v(d), Expr::Int(1)));
    let inb = Expr::bin(
        BinOp::And,
        Expr::bin(BinOp::Ge, jj.clone(), Expr::Int(0)),
        Expr::bin(BinOp::Lt, jj.clone(), Expr::Int(w)),
    );
    let tap = Expr::select(inb, Expr::load(x, vec![v(i), jj]), Expr::f32(0.0));
    let inner = Stmt::For(Loop {
        var: j,
        extent: w,
        kind: LoopKind::Parallel,
        body: vec![
            Stmt::Let {
                var: acc,
                value: Expr::f32(0.0),
            },
            Stmt::for_(
                d,
                3,
                vec![Stmt::Assign {
                    var: acc,
                    value: Expr::bin(BinOp::Add, v(acc), tap),
                }],
            ),
            Stmt::store(out, vec![v(i), v(j)], v(acc)),
            Stmt::If {
                cond: Expr::bin(BinOp::Gt, v(acc), Expr::f32(0.0)),
                then_: vec![Stmt::store(
                    flag,
                    vec![v(i), v(j)],
                    Expr::Lit(Lit::Int(1, DType::I8)),
                )],
                else_: vec![Stmt::store(
                    flag,
                    vec![v(i), v(j)],
                    Expr::Lit(Lit::Int(-1, DType::I8)),
                )],
            },
        ],
    });
    k.body.push(Stmt::For(Loop {
        var: i,
        extent: h,
        kind: LoopKind::Parallel,
        body: vec![inner],
    }));
    // One parallel region: the inner parallel loop runs serially inside it.
    let opts = tilec_cpu::RenderOptions { loop_parallel_min_work: 0, ..Default::default() };
    let src = tilec_cpu::render_function(&k, "k", &opts).unwrap();
    assert_eq!(src.matches("tc_parallel(").count(), 1, "{src}");
    check_kernels(&[k], 13, true, |_, d| tol_for(d));
}

/// A padded 2-D max or average window over `x[c, h, w]` with every tap bounds-checked (as the
/// lowering writes pools); the average divides by the taps inside the padded extent.
#[allow(clippy::too_many_arguments)]
fn window_kernel(
    name: &str,
    c: i64,
    (h, w): (i64, i64),
    (kh, kw): (i64, i64),
    (sh, sw): (i64, i64),
    (dh, dw): (i64, i64),
    (pt, pl, pb, pr): (i64, i64, i64, i64),
    avg: bool,
) -> Kernel {
    let d = DType::F32;
    let oh = (h + pt + pb - dh * (kh - 1) - 1) / sh + 1;
    let ow = (w + pl + pr - dw * (kw - 1) - 1) / sw + 1;
    let mut k = Kernel::new(name);
    let x = k.param("x", d, vec![c, h, w]);
    let out = k.param("out", d, vec![c, oh, ow]);
    let [ci, oy, ox, ky, kx] = ["c", "oy", "ox", "ky", "kx"].map(|n| k.index_var(n));
    let acc = k.new_var("acc", Ty::Elem(d), true);
    let cnt = k.new_var("cnt", Ty::Elem(DType::I64), true);
    let coord = |o: VarId, s: i64, t: VarId, dl: i64, p: i64| {
        Expr::add(
            Expr::add(
                Expr::mul(v(o), Expr::Int(s)),
                Expr::mul(v(t), Expr::Int(dl)),
            ),
            Expr::Int(-p),
        )
    };
    let (iy, ix) = (coord(oy, sh, ky, dh, pt), coord(ox, sw, kx, dw, pl));
    let within = |e: &Expr, hi: i64| {
        Expr::bin(
            BinOp::And,
            Expr::bin(BinOp::Ge, e.clone(), Expr::Int(0)),
            Expr::bin(BinOp::Lt, e.clone(), Expr::Int(hi)),
        )
    };
    let inside = Expr::bin(BinOp::And, within(&iy, h), within(&ix, w));
    let in_pad = Expr::bin(
        BinOp::And,
        Expr::bin(BinOp::Lt, iy.clone(), Expr::Int(h + pb)),
        Expr::bin(BinOp::Lt, ix.clone(), Expr::Int(w + pr)),
    );
    let op = if avg { BinOp::Add } else { BinOp::Max };
    let xv = Expr::load(x, vec![v(ci), iy, ix]);
    let mut tap = vec![Stmt::Assign {
        var: acc,
        value: Expr::select(inside, Expr::bin(op, v(acc), xv), v(acc)),
    }];
    if avg {
        tap.push(Stmt::Assign {
            var: cnt,
            value: Expr::select(
                in_pad,
                Expr::bin(BinOp::Add, v(cnt), Expr::Lit(Lit::Int(1, DType::I64))),
                v(cnt),
            ),
        });
    }
    let res = if avg {
        Expr::bin(BinOp::Div, v(acc), Expr::cast(d, v(cnt)))
    } else {
        v(acc)
    };
    let init = Expr::Lit(Lit::Float(if avg { 0.0 } else { f64::NEG_INFINITY }, d));
    let body = vec![
        Stmt::Let {
            var: acc,
            value: init,
        },
        Stmt::Let {
            var: cnt,
            value: Expr::Lit(Lit::Int(0, DType::I64)),
        },
        Stmt::for_(ky, kh, vec![Stmt::for_(kx, kw, tap)]),
        Stmt::store(out, vec![v(ci), v(oy), v(ox)], res),
    ];
    k.body.push(Stmt::for_(
        ci,
        c,
        vec![Stmt::for_(oy, oh, vec![Stmt::for_(ox, ow, body)])],
    ));
    k
}

/// Padded windows under the default CPU schedule (borders partitioned off, the interior
/// unchecked and vectorized), compiled, against the interpreter on inputs with NaNs and
/// infinities: padding on all sides, strides above the window, dilation.
#[test]
fn partitioned_windows_match_the_interpreter() {
    use tilec_tile::schedule::{self, CpuTarget, Primitive};
    let shapes = [
        ((56, 56), (3, 3), (2, 2), (1, 1), (0, 0, 1, 1)),
        ((28, 30), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
        ((33, 40), (2, 2), (3, 3), (1, 1), (1, 0, 0, 1)),
        ((30, 41), (3, 2), (1, 2), (2, 3), (2, 1, 2, 1)),
        ((20, 20), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    ];
    let t = CpuTarget {
        threads: 2,
        vector_bytes: 64,
        l1_bytes: 32 << 10,
        l2_bytes: 1 << 20,
        ..CpuTarget::default()
    };
    let mut kernels = vec![];
    for (i, (hw, kk, st, dil, pads)) in shapes.into_iter().enumerate() {
        for avg in [false, true] {
            let name = format!("{}pool{i}", if avg { "avg" } else { "max" });
            let mut k = window_kernel(&name, 24, hw, kk, st, dil, pads, avg);
            let s = schedule::default_cpu(&k, &t);
            assert!(
                s.steps
                    .iter()
                    .any(|p| matches!(p, Primitive::Partition { .. })),
                "{name}: {s}"
            );
            assert!(
                s.steps
                    .iter()
                    .any(|p| matches!(p, Primitive::Vectorize { .. })),
                "{name}: {s}"
            );
            schedule::apply(&mut k, &s).unwrap();
            kernels.push(k);
        }
    }
    check_kernels(&kernels, 41, true, |_, d| tol_for(d));
}

/// A parallel loop with less estimated work than `loop_parallel_min_work` renders without a
/// region (it runs on its caller) and still computes what the interpreter does; the same loop
/// with more iterations, or with the threshold at 0, is a region.
#[test]
fn small_parallel_loops_run_on_their_caller() {
    let scale = |rows: i64| {
        let mut k = Kernel::new(&format!("scale_{rows}"));
        let x = k.param("x", DType::F32, vec![rows, 64]);
        let out = k.param("out", DType::F32, vec![rows, 64]);
        let (i, j) = (k.index_var("i"), k.index_var("j"));
        let body = Stmt::store(
            out,
            vec![v(i), v(j)],
            Expr::bin(BinOp::Mul, Expr::load(x, vec![v(i), v(j)]), Expr::f32(3.0)),
        );
        k.body.push(Stmt::For(Loop {
            var: i,
            extent: rows,
            kind: LoopKind::Parallel,
            body: vec![Stmt::for_(j, 64, vec![body])],
        }));
        k
    };
    let regions = |k: &Kernel, min_work: i64| {
        let opts = tilec_cpu::RenderOptions { loop_parallel_min_work: min_work, ..Default::default() };
        tilec_cpu::render_function(k, "k", &opts).unwrap().matches("tc_parallel(").count()
    };
    // 3 rows of 64: 3 operations each (a load, a multiply, a store).
    let (small, large) = (scale(3), scale(4096));
    assert_eq!(regions(&small, 3 * 64 * 3 + 1), 0);
    assert_eq!(regions(&small, 3 * 64 * 3), 1);
    assert_eq!(regions(&small, 0), 1);
    assert_eq!(regions(&large, 1 << 19), 1);
    // Compiled with the default threshold (the small loop on its caller), on 2 threads.
    let m = tilec_cpu::Compiler::new(tilec_cpu::CompileOptions {
        cache_dir: Some(common::cache_dir("shared")),
        ..Default::default()
    })
    .compile(std::slice::from_ref(&small))
    .unwrap_or_else(|e| panic!("{e}"));
    m.set_threads(2);
    let mut r = common::rng(29);
    let args = common::make_args(&small, &mut r, true);
    let mut want = args.clone();
    tilec_tile::interp::run(&small, &mut want).unwrap_or_else(|e| panic!("interpreter: {e}"));
    let mut got = args.clone();
    m.run(&small.name, &mut got).unwrap_or_else(|e| panic!("{e}"));
    common::assert_close("scale_3 out", &got[1], &want[1], common::exact());
}
