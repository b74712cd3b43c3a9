//! GPU schedules keep the serial semantics: the tile interpreter (thread loops serially, block
//! reductions as no-ops) computes the same as on the unscheduled kernel and as an f64
//! reference.

mod common;

use common::*;
use tilec_cuda::*;
use tilec_ir::DType;
use tilec_tile::*;

fn check_shapes(rows: i64, cols: i64, d: DType, opts: &RowOptions) {
    for (op, k, row) in kernels(rows, cols, d) {
        let s = if row {
            schedule_rows(&k, opts).unwrap()
        } else {
            schedule_elementwise(&k, &GpuTarget::hopper()).unwrap()
        };
        let args = random_args(&k, 7 + cols as u64);
        let mut a = args.clone();
        interp::run(&k, &mut a).unwrap();
        let mut b = args.clone();
        interp::run(&s, &mut b).unwrap_or_else(|e| panic!("{op}: {e}\n{s}"));
        let n = k.params.len() - 1;
        let want = reference(op, &args, rows as usize, cols as usize);
        let what = format!("{op} {d} {rows}x{cols}");
        assert_close(
            &format!("{what} unscheduled"),
            &a[n].to_f64_vec(),
            &want,
            tol(d),
        );
        assert_close(
            &format!("{what} scheduled"),
            &b[n].to_f64_vec(),
            &want,
            tol(d),
        );
        // Scheduled and unscheduled differ only by summation order.
        assert_close(
            &format!("{what} scheduled vs unscheduled"),
            &b[n].to_f64_vec(),
            &a[n].to_f64_vec(),
            tol(d),
        );
    }
}

#[test]
fn schedules_match_the_interpreter_f32_and_bf16() {
    for d in [DType::F32, DType::BF16] {
        check_shapes(3, 256, d, &RowOptions::default());
        // Rows that do not fill the last vector round (guards) and short rows.
        check_shapes(2, 200, d, &RowOptions::default());
        check_shapes(5, 8, d, &RowOptions::default());
        // Several vectors per thread (unrolled register loop).
        check_shapes(
            2,
            1024,
            d,
            &RowOptions {
                threads: Some(32),
                max_register_elems: 64,
                rows_per_block: Some(1),
            },
        );
        // Rows too long for registers.
        check_shapes(
            2,
            1024,
            d,
            &RowOptions {
                threads: Some(32),
                max_register_elems: 4,
                rows_per_block: Some(1),
            },
        );
    }
    // Odd lengths: scalar accesses.
    check_shapes(3, 37, DType::F32, &RowOptions::default());
}

#[test]
fn short_rows_share_blocks() {
    for d in [DType::F32, DType::BF16] {
        // Chosen by default: 16 rows of 64 (a few threads per row, several rows per block),
        // with guards (200 columns) and without.
        for (rows, cols) in [(16i64, 64i64), (32, 200), (8, 512)] {
            let k = tilec_cuda::handbuilt::softmax(rows, cols, d);
            let s = schedule_rows(&k, &RowOptions::default()).unwrap();
            let text = s.to_string();
            assert!(text.contains("bind(ThreadY)"), "{rows}x{cols} {d}\n{text}");
            let cfg = launch_config(&s).unwrap();
            assert!(cfg.block.1 > 1 && cfg.block.0 <= 32, "{cfg:?}");
            assert_eq!((cfg.block.0 * cfg.block.1) % 32, 0, "{cfg:?}");
            assert_eq!(cfg.grid.0 as i64 * cfg.block.1 as i64, rows);
            let src = render(&s).unwrap().source;
            assert!(src.contains("tl_warp_allreduce<"), "{src}");
            check_shapes(rows, cols, d, &RowOptions::default());
        }
        // Explicit rows per block and threads per row.
        for (t, r) in [(8i64, 4i64), (16, 2), (32, 2), (4, 8)] {
            let o = RowOptions {
                threads: Some(t),
                rows_per_block: Some(r),
                ..RowOptions::default()
            };
            check_shapes(8, 96, d, &o);
        }
    }
    // Rows that do not divide into the rows per block, threads that are not a power of two:
    // clean errors.
    let k = tilec_cuda::handbuilt::softmax(6, 64, DType::F32);
    for (t, r) in [(8i64, 4i64), (12, 8), (64, 2)] {
        let o = RowOptions {
            threads: Some(t),
            rows_per_block: Some(r),
            ..RowOptions::default()
        };
        let e = schedule_rows(&k, &o).unwrap_err().to_string();
        assert!(e.contains("rows per block"), "{e}");
    }
}

#[test]
fn row_schedule_structure() {
    let k = tilec_cuda::handbuilt::softmax(16, 8192, DType::BF16);
    let s = schedule_rows(&k, &RowOptions::default()).unwrap();
    let text = s.to_string();
    assert!(
        text.contains("bind(BlockX)") && text.contains("bind(ThreadX)"),
        "{text}"
    );
    assert!(
        text.contains("block_reduce_max") && text.contains("block_reduce_add"),
        "{text}"
    );
    // Four 16-byte vectors per thread: 256 threads for a bf16 row of 8192.
    assert!(text.contains("alloc reg x_row: bf16[256, 4, 8]"), "{text}");
    let cfg = launch_config(&s).unwrap();
    assert_eq!(cfg.grid, (16, 1, 1));
    assert_eq!(cfg.block, (256, 1, 1));
}

#[test]
fn non_identity_initial_values_are_combined_after_the_reduction() {
    // s starts at 10, not 0: every thread must not add it.
    let mut k = Kernel::new("sum10");
    let x = k.param("x", DType::F32, vec![3, 64]);
    let y = k.param("y", DType::F32, vec![3, 64]);
    let (i0, r, i1) = (k.index_var("i0"), k.index_var("r"), k.index_var("i1"));
    let s = k.new_var("s", Ty::Elem(DType::F32), true);
    k.body.push(Stmt::for_(
        i0,
        3,
        vec![
            Stmt::Let {
                var: s,
                value: Expr::f32(10.0),
            },
            Stmt::for_(
                r,
                64,
                vec![Stmt::Assign {
                    var: s,
                    value: Expr::bin(
                        BinOp::Add,
                        Expr::Var(s),
                        Expr::load(x, vec![Expr::Var(i0), Expr::Var(r)]),
                    ),
                }],
            ),
            Stmt::for_(
                i1,
                64,
                vec![Stmt::store(
                    y,
                    vec![Expr::Var(i0), Expr::Var(i1)],
                    Expr::bin(
                        BinOp::Sub,
                        Expr::load(x, vec![Expr::Var(i0), Expr::Var(i1)]),
                        Expr::Var(s),
                    ),
                )],
            ),
        ],
    ));
    let sch = schedule_rows(&k, &RowOptions::default()).unwrap();
    let text = sch.to_string();
    assert!(text.contains("var s: f32 = 0.0:f32"), "{text}");
    let args = random_args(&k, 3);
    let (mut a, mut b) = (args.clone(), args.clone());
    interp::run(&k, &mut a).unwrap();
    interp::run(&sch, &mut b).unwrap();
    assert_close("sum10", &b[1].to_f64_vec(), &a[1].to_f64_vec(), 1e-5);
}

#[test]
fn schedules_reject_what_they_cannot_handle() {
    // A loop-carried non-reduction (prefix sum) cannot be spread over threads.
    let mut k = Kernel::new("cumsum");
    let x = k.param("x", DType::F32, vec![2, 16]);
    let y = k.param("y", DType::F32, vec![2, 16]);
    let (i0, r) = (k.index_var("i0"), k.index_var("r"));
    let s = k.new_var("s", Ty::Elem(DType::F32), true);
    k.body.push(Stmt::for_(
        i0,
        2,
        vec![
            Stmt::Let {
                var: s,
                value: Expr::f32(0.0),
            },
            Stmt::for_(
                r,
                16,
                vec![
                    Stmt::Assign {
                        var: s,
                        value: Expr::bin(
                            BinOp::Add,
                            Expr::Var(s),
                            Expr::load(x, vec![Expr::Var(i0), Expr::Var(r)]),
                        ),
                    },
                    Stmt::store(y, vec![Expr::Var(i0), Expr::Var(r)], Expr::Var(s)),
                ],
            ),
        ],
    ));
    let e = schedule_rows(&k, &RowOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cumsum") && e.contains("read inside its reduction loop"),
        "{e}"
    );
    let e = schedule_elementwise(&k, &GpuTarget::hopper())
        .unwrap_err()
        .to_string();
    assert!(e.contains("cumsum") && e.contains("not elementwise"), "{e}");
    let e = schedule_rows(
        &tilec_cuda::handbuilt::softmax(2, 64, DType::F32),
        &RowOptions {
            threads: Some(48),
            max_register_elems: 8,
            rows_per_block: None,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("48 threads"), "{e}");
    let e = schedule_rows(
        &tilec_cuda::handbuilt::gelu_bias(2, 64, DType::F32),
        &RowOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("gelu_bias"), "{e}");
}

#[test]
fn elementwise_vectors_per_thread_keep_the_semantics() {
    // Grid-stride (0) and blocked (1..8 vectors per thread), with and without a partial last
    // block (guards).
    for d in [DType::F32, DType::BF16] {
        for (rows, cols) in [(3i64, 256i64), (5, 200), (9, 1024)] {
            for (op, k, row) in kernels(rows, cols, d) {
                if row {
                    continue;
                }
                let args = random_args(&k, 11 + cols as u64);
                let want = reference(op, &args, rows as usize, cols as usize);
                for u in [0i64, 1, 2, 3, 4, 8] {
                    let s = schedule_elementwise_with(&k, &GpuTarget::hopper(), Some(u))
                        .unwrap_or_else(|e| panic!("{op} {u}: {e}"));
                    let mut b = args.clone();
                    let n = k.params.len() - 1;
                    interp::run(&s, &mut b).unwrap_or_else(|e| panic!("{op} {u}: {e}\n{s}"));
                    assert_close(
                        &format!("{op} {d} {rows}x{cols}, {u} vectors per thread"),
                        &b[n].to_f64_vec(),
                        &want,
                        tol(d),
                    );
                }
            }
        }
    }
}

/// A row nest beside a second, independent nest over the same rows (a normalization and the
/// residual its group also writes): merged into one row nest, scheduled over the rows, the
/// same outputs; a second nest reading the first's output is left alone.
#[test]
fn sibling_nests_merge_into_one_row_nest() {
    let build = |dependent: bool| {
        let mut k = Kernel::new("norm_and_residual");
        let x = k.param("x", DType::F32, vec![2, 40, 96]);
        let y1 = k.param("y1", DType::F32, vec![2, 40, 96]);
        let y2 = k.param("y2", DType::F32, vec![2, 40, 96]);
        let (a, b, r, c) = (k.index_var("a"), k.index_var("b"), k.index_var("r"), k.index_var("c"));
        let (a2, b2, c2) = (k.index_var("a2"), k.index_var("b2"), k.index_var("c2"));
        let s = k.new_var("s", Ty::Elem(DType::F32), true);
        let at = |i: VarId, j: VarId, l: VarId| vec![Expr::Var(i), Expr::Var(j), Expr::Var(l)];
        let row = vec![
            Stmt::Let { var: s, value: Expr::f32(0.0) },
            Stmt::for_(r, 96, vec![Stmt::Assign { var: s, value: Expr::bin(BinOp::Add, Expr::Var(s), Expr::load(x, at(a, b, r))) }]),
            Stmt::for_(c, 96, vec![Stmt::store(y1, at(a, b, c), Expr::bin(BinOp::Sub, Expr::load(x, at(a, b, c)), Expr::Var(s)))]),
        ];
        k.body.push(Stmt::for_(a, 2, vec![Stmt::for_(b, 40, row)]));
        let src = if dependent { y1 } else { x };
        let second = Stmt::store(y2, at(a2, b2, c2), Expr::bin(BinOp::Mul, Expr::load(src, at(a2, b2, c2)), Expr::f32(2.0)));
        k.body.push(Stmt::for_(a2, 2, vec![Stmt::for_(b2, 40, vec![Stmt::for_(c2, 96, vec![second])])]));
        k
    };
    let k = build(false);
    let fused = fuse_sibling_nests(&k).expect("independent nests over the same rows merge");
    assert_eq!(fused.body.len(), 1);
    let sch = schedule_rows(&fused, &RowOptions::default()).unwrap();
    assert!(sch.to_string().contains("bind(BlockX)"), "{sch}");
    let args = random_args(&k, 11);
    let (mut a, mut b) = (args.clone(), args.clone());
    interp::run(&k, &mut a).unwrap();
    interp::run(&sch, &mut b).unwrap();
    for i in [1, 2] {
        // Sums of 96 values in [-3, 3) in another order.
        assert_close("sibling nests", &b[i].to_f64_vec(), &a[i].to_f64_vec(), 2e-3);
    }
    assert!(fuse_sibling_nests(&build(true)).is_none(), "a nest reading another's output must stay apart");
}
