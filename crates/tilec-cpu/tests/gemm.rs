//! The GEMM template: edge sizes, blockings, epilogues, transposed, im2col and concatenated
//! operands, dtypes.

mod common;
use common::*;
use tilec_cpu::{gemm_params, CpuInfo};
use tilec_ir::DType;
use tilec_tile::ir::*;

struct Spec {
    batch: i64,
    m: i64,
    n: i64,
    k: i64,
    transposed_b: bool,
    in_dtype: DType,
    acc: DType,
    out_dtype: DType,
    params: Option<GemmParams>,
    /// Rendered by the matrix-vector template (`Gemm::vector`).
    vector: bool,
    /// One `B` (`[k, n]`, or `[n, k]` transposed) for every batch.
    shared_b: bool,
}

fn spec(batch: i64, m: i64, n: i64, k: i64) -> Spec {
    Spec {
        batch,
        m,
        n,
        k,
        transposed_b: false,
        in_dtype: DType::F32,
        acc: DType::F32,
        out_dtype: DType::F32,
        params: None,
        vector: false,
        shared_b: false,
    }
}

/// `out[b, i, j] = max(sum_k a[b, i, k] * B[b, k, j] + bias[j], 0) + res[b, i, j]`.
fn gemm_kernel(name: &str, s: &Spec) -> Kernel {
    let mut k = Kernel::new(name);
    let a = k.param("a", s.in_dtype, vec![s.batch, s.m, s.k]);
    let lead = if s.shared_b { vec![] } else { vec![s.batch] };
    let b = if s.transposed_b {
        k.param("bt", s.in_dtype, [lead.clone(), vec![s.n, s.k]].concat())
    } else {
        k.param("b", s.in_dtype, [lead.clone(), vec![s.k, s.n]].concat())
    };
    let bias = k.param("bias", s.out_dtype, vec![s.n]);
    let res = k.param("res", s.out_dtype, vec![s.batch, s.m, s.n]);
    let out = k.param("out", s.out_dtype, vec![s.batch, s.m, s.n]);
    let (vb, vi, vj, vk) = (
        k.index_var("b"),
        k.index_var("i"),
        k.index_var("j"),
        k.index_var("k"),
    );
    let acc = k.new_var("acc", Ty::Elem(s.acc), false);
    let od = s.out_dtype;
    let zero = if od.is_float() {
        Expr::Lit(Lit::Float(0.0, od))
    } else {
        Expr::Lit(Lit::Int(0, od))
    };
    let value = Expr::bin(
        BinOp::Add,
        Expr::bin(
            BinOp::Max,
            Expr::bin(
                BinOp::Add,
                Expr::cast(od, v(acc)),
                Expr::load(bias, vec![v(vj)]),
            ),
            zero,
        ),
        Expr::load(res, vec![v(vb), v(vi), v(vj)]),
    );
    let lead: Vec<Expr> = if s.shared_b { vec![] } else { vec![v(vb)] };
    let b_expr = if s.transposed_b {
        Expr::load(b, [lead, vec![v(vj), v(vk)]].concat())
    } else {
        Expr::load(b, [lead, vec![v(vk), v(vj)]].concat())
    };
    k.body.push(Stmt::Gemm(Box::new(Gemm {
        batch: s.batch,
        m: s.m,
        n: s.n,
        k: s.k,
        b_var: vb,
        i_var: vi,
        j_var: vj,
        k_var: vk,
        acc_var: acc,
        acc_dtype: s.acc,
        a: Expr::load(a, vec![v(vb), v(vi), v(vk)]),
        b: b_expr,
        epilogue: vec![Stmt::store(out, vec![v(vb), v(vi), v(vj)], value)],
        params: s
            .params
            .unwrap_or_else(|| gemm_params(s.m, s.n, s.k, &CpuInfo::host())),
        vector: s.vector,
    })));
    k
}

fn gemm_tol(k: &Kernel, d: DType) -> Tol {
    // FMA and blocked summation order differ from the interpreter's sequential sum.
    let kk = match &k.body[0] {
        Stmt::Gemm(g) => g.k,
        Stmt::For(l) => match &l.body[0] {
            Stmt::Gemm(g) => g.k,
            _ => 1,
        },
        _ => 1,
    } as f64;
    match d {
        DType::F32 => Tol {
            rel: 1e-5,
            abs: 2e-6 * kk * 16.0,
        },
        DType::F64 => Tol {
            rel: 1e-12,
            abs: 1e-13 * kk * 16.0,
        },
        d => tol_for(d),
    }
}

#[test]
fn edge_sizes_with_epilogue() {
    let small = GemmParams {
        mr: 3,
        nr: 16,
        kc: 16,
        mc: 9,
        nc: 48,
    };
    let mut ks = vec![];
    for (idx, &(batch, m, n, kk)) in [
        (1, 1, 1, 1),
        (1, 7, 33, 257),
        (2, 33, 7, 5),
        (1, 257, 257, 33),
        (1, 1, 257, 7),
        (1, 3, 5, 0),
        (3, 17, 40, 50),
    ]
    .iter()
    .enumerate()
    {
        ks.push(gemm_kernel(&format!("mm{idx}"), &spec(batch, m, n, kk)));
        // Small blocks: several K slices (partial sums), row and column blocks, edge tiles.
        ks.push(gemm_kernel(
            &format!("mm{idx}_small"),
            &Spec {
                params: Some(small),
                ..spec(batch, m, n, kk)
            },
        ));
    }
    ks.push(gemm_kernel(
        "mm_t",
        &Spec {
            transposed_b: true,
            ..spec(2, 33, 65, 47)
        },
    ));
    ks.push(gemm_kernel(
        "mm_t_small",
        &Spec {
            transposed_b: true,
            params: Some(small),
            ..spec(1, 33, 65, 47)
        },
    ));
    // Degenerate parameters are normalized, not trusted.
    ks.push(gemm_kernel(
        "mm_odd_params",
        &Spec {
            params: Some(GemmParams {
                mr: 0,
                nr: 5,
                kc: 0,
                mc: 1,
                nc: 1,
            }),
            ..spec(1, 9, 21, 13)
        },
    ));
    check_kernels(&ks, 20, false, gemm_tol);
}

/// The matrix-vector template (`Gemm::vector`): 1 to 8 rows, K and N off the vector width
/// (a narrower last panel, a single column, a reduction of one), `B` transposed, batches
/// sharing `B` (their rows the template's), with and without `B` laid out ahead of the call,
/// one and two threads; batches with a `B` each, more than 8 rows over the batches and wider
/// accumulators fall back to the blocked template.
#[test]
fn matrix_vector_template() {
    let mut ks = vec![];
    for (i, &(m, n, kk, t)) in [
        (1, 1280, 960, false),
        (1, 1000, 1280, true),
        (1, 53, 37, false),
        (2, 77, 131, true),
        (3, 16, 17, false),
        (4, 129, 64, true),
        (5, 1, 40, false),
        (6, 70, 1, true),
        (7, 33, 250, false),
        (8, 200, 99, true),
    ]
    .iter()
    .enumerate()
    {
        let s = Spec { transposed_b: t, vector: true, ..spec(1, m, n, kk) };
        ks.push(gemm_kernel(&format!("gemv{i}"), &s));
    }
    // Batches sharing B: their rows are the template's rows.
    ks.push(gemm_kernel("gemv_shared2", &Spec { vector: true, shared_b: true, ..spec(2, 1, 140, 30) }));
    ks.push(gemm_kernel("gemv_shared3", &Spec { vector: true, shared_b: true, transposed_b: true, ..spec(3, 2, 33, 47) }));
    let rendered = ks.len();
    // Batches with a B each, and too many rows over the batches: the blocked template.
    ks.push(gemm_kernel("gemv_batched", &Spec { vector: true, ..spec(2, 1, 40, 30) }));
    ks.push(gemm_kernel("gemv_shared9", &Spec { vector: true, shared_b: true, ..spec(3, 3, 40, 30) }));
    ks.push(gemm_kernel("gemv_f64", &Spec { vector: true, acc: DType::F64, ..spec(1, 2, 40, 30) }));
    let m = check_kernels(&ks, 41, false, gemm_tol);
    let mut r = rng(41);
    for threads in [1, 2] {
        m.set_threads(threads);
        for k in &ks {
            let args = make_args(k, &mut r, false);
            let mut want = args.clone();
            tilec_tile::interp::run(k, &mut want).unwrap();
            let mut got = args.clone();
            m.run(&k.name, &mut got).unwrap();
            let out = k.params.len() - 1;
            assert_close(&format!("{} on {threads} threads", k.name), &got[out], &want[out], gemm_tol(k, DType::F32));
        }
    }
    // The template renders these (and not the others), with one pack slot for B.
    for (i, k) in ks.iter().enumerate() {
        let src = tilec_cpu::render_c(k).unwrap();
        assert_eq!(src.contains("/* matrix-vector product"), i < rendered, "{}", k.name);
        assert_eq!(m.packs(&k.name).iter().filter(|s| s.operand == tilec_cpu::PackOperand::B).count(), 1, "{}", k.name);
    }
}

#[test]
fn dtypes() {
    let ks = vec![
        gemm_kernel(
            "mm_f64",
            &Spec {
                in_dtype: DType::F64,
                acc: DType::F64,
                out_dtype: DType::F64,
                ..spec(1, 33, 40, 70)
            },
        ),
        gemm_kernel(
            "mm_f64_small",
            &Spec {
                in_dtype: DType::F64,
                acc: DType::F64,
                out_dtype: DType::F64,
                params: Some(GemmParams {
                    mr: 5,
                    nr: 8,
                    kc: 7,
                    mc: 10,
                    nc: 16,
                }),
                ..spec(2, 13, 29, 30)
            },
        ),
        gemm_kernel(
            "mm_f16_in",
            &Spec {
                in_dtype: DType::F16,
                acc: DType::F32,
                out_dtype: DType::F16,
                ..spec(1, 17, 33, 40)
            },
        ),
        gemm_kernel(
            "mm_bf16_in",
            &Spec {
                in_dtype: DType::BF16,
                acc: DType::F32,
                out_dtype: DType::F32,
                ..spec(1, 7, 9, 11)
            },
        ),
        gemm_kernel(
            "mm_i8",
            &Spec {
                in_dtype: DType::I8,
                acc: DType::I32,
                out_dtype: DType::I32,
                ..spec(1, 13, 17, 33)
            },
        ),
        gemm_kernel(
            "mm_f16_acc",
            &Spec {
                in_dtype: DType::F16,
                acc: DType::F16,
                out_dtype: DType::F16,
                ..spec(1, 5, 6, 9)
            },
        ),
    ];
    check_kernels(&ks, 21, false, gemm_tol);
}

/// A strided, padded 2-D convolution as a gemm over an implicit im2col operand:
/// `out[o, oh*OW + ow] = sum_{c,kh,kw} w[o, c*9 + kh*3 + kw] * x[c, 2oh+kh-1, 2ow+kw-1]`.
#[test]
fn im2col_operand() {
    let (c, h, w, o) = (3i64, 9i64, 9i64, 5i64);
    let (oh, ow) = ((h + 2 - 3) / 2 + 1, (w + 2 - 3) / 2 + 1);
    for (name, params) in [
        ("conv", None),
        (
            "conv_small",
            Some(GemmParams {
                mr: 2,
                nr: 16,
                kc: 5,
                mc: 4,
                nc: 16,
            }),
        ),
    ] {
        let mut k = Kernel::new(name);
        let x = k.param("x", DType::F32, vec![c, h, w]);
        let wt = k.param("w", DType::F32, vec![o, c * 9]);
        let out = k.param("out", DType::F32, vec![o, oh * ow]);
        let (vb, vi, vj, vk) = (
            k.index_var("b"),
            k.index_var("i"),
            k.index_var("j"),
            k.index_var("k"),
        );
        let acc = k.new_var("acc", Ty::Elem(DType::F32), false);
        let ci = Expr::div(v(vk), 9);
        let kh = Expr::div(Expr::rem(v(vk), 9), 3);
        let kw = Expr::rem(v(vk), 3);
        let ih = Expr::bin(
            BinOp::Sub,
            Expr::add(Expr::mul(Expr::div(v(vj), ow), Expr::Int(2)), kh),
            Expr::Int(1),
        );
        let iw = Expr::bin(
            BinOp::Sub,
            Expr::add(Expr::mul(Expr::rem(v(vj), ow), Expr::Int(2)), kw),
            Expr::Int(1),
        );
        let inb = |e: &Expr, lim: i64| {
            Expr::bin(
                BinOp::And,
                Expr::bin(BinOp::Ge, e.clone(), Expr::Int(0)),
                Expr::bin(BinOp::Lt, e.clone(), Expr::Int(lim)),
            )
        };
        let b_expr = Expr::select(
            Expr::bin(BinOp::And, inb(&ih, h), inb(&iw, w)),
            Expr::load(x, vec![ci, ih.clone(), iw.clone()]),
            Expr::f32(0.0),
        );
        k.body.push(Stmt::Gemm(Box::new(Gemm {
            batch: 1,
            m: o,
            n: oh * ow,
            k: c * 9,
            b_var: vb,
            i_var: vi,
            j_var: vj,
            k_var: vk,
            acc_var: acc,
            acc_dtype: DType::F32,
            a: Expr::load(wt, vec![v(vi), v(vk)]),
            b: b_expr,
            epilogue: vec![Stmt::store(out, vec![v(vi), v(vj)], v(acc))],
            params: params.unwrap_or_else(|| gemm_params(o, oh * ow, c * 9, &CpuInfo::host())),
            vector: false,
        })));
        check_kernels(&[k], 22, false, gemm_tol);
    }
}

/// A gemm inside a parallel batch loop runs single-threaded inside each iteration.
#[test]
fn gemm_inside_parallel_loop() {
    let mut k = gemm_kernel("mm_in_loop", &spec(1, 40, 50, 60));
    let Stmt::Gemm(g) = k.body.pop().unwrap() else {
        unreachable!()
    };
    // Re-batch: the loop variable takes the place of the gemm's batch variable.
    let t = k.index_var("t");
    let mut g = *g;
    let reps = 3;
    for p in k.params.clone() {
        let b = &mut k.buffers[p.0 as usize];
        if b.shape.len() == 3 {
            b.shape[0] = reps;
        }
    }
    let bv = g.b_var;
    g.a = g.a.substitute(bv, &v(t));
    g.b = g.b.substitute(bv, &v(t));
    for s in &mut g.epilogue {
        s.substitute(bv, &v(t));
    }
    k.body.push(Stmt::For(Loop {
        var: t,
        extent: reps,
        kind: LoopKind::Parallel,
        body: vec![Stmt::Gemm(Box::new(g))],
    }));
    let m = check_kernels(&[k], 23, false, gemm_tol);
    // The operands depend on the loop variable: nothing can be packed ahead.
    assert!(m.packs("mm_in_loop").is_empty());
}

/// A parallel gemm is one region chunk per thread, each computing its block of C: one thread,
/// more threads than row or column tiles, and uneven splits over batches, rows and columns
/// compute the same products. Also a gemm inside a serial loop (a region per iteration, the
/// loop variable passed to the region).
#[test]
fn thread_counts() {
    let mut ks = vec![
        gemm_kernel("tc_rows", &spec(1, 257, 40, 64)),
        gemm_kernel("tc_cols", &spec(1, 6, 600, 128)),
        gemm_kernel("tc_batch", &spec(5, 40, 40, 40)),
    ];
    let mut k = gemm_kernel("tc_in_serial_loop", &spec(1, 64, 80, 60));
    let Stmt::Gemm(g) = k.body.pop().unwrap() else {
        unreachable!()
    };
    let t = k.index_var("t");
    let mut g = *g;
    for p in k.params.clone() {
        let b = &mut k.buffers[p.0 as usize];
        if b.shape.len() == 3 {
            b.shape[0] = 3;
        }
    }
    let bv = g.b_var;
    g.a = g.a.substitute(bv, &v(t));
    g.b = g.b.substitute(bv, &v(t));
    for s in &mut g.epilogue {
        s.substitute(bv, &v(t));
    }
    k.body.push(Stmt::For(Loop {
        var: t,
        extent: 3,
        kind: LoopKind::Serial,
        body: vec![Stmt::Gemm(Box::new(g))],
    }));
    ks.push(k);
    let m = check_kernels(&ks, 31, false, gemm_tol);
    let mut r = rng(31);
    for threads in [1, 3, 5] {
        m.set_threads(threads);
        for k in &ks {
            let args = make_args(k, &mut r, false);
            let mut want = args.clone();
            tilec_tile::interp::run(k, &mut want).unwrap();
            let mut got = args.clone();
            m.run(&k.name, &mut got).unwrap();
            let out = k.params.len() - 1;
            let what = format!("{} on {threads} threads", k.name);
            assert_close(&what, &got[out], &want[out], gemm_tol(k, DType::F32));
        }
    }
}

/// Operands that read only parameters get pack slots (checked against the interpreter with
/// every subset packed by `check_kernels`); operands that depend on an enclosing loop do not.
#[test]
fn prepack_slots() {
    use tilec_cpu::PackOperand;
    let mut s = spec(3, 37, 101, 70);
    s.params = Some(GemmParams {
        mr: 4,
        nr: 16,
        kc: 16,
        mc: 8,
        nc: 32,
    });
    let k = gemm_kernel("mm_packs", &s);
    let mut s2 = spec(1, 128, 96, 200);
    s2.transposed_b = true;
    let k2 = gemm_kernel("mm_packs_bt", &s2);
    let m = check_kernels(&[k, k2], 23, false, gemm_tol);
    for name in ["mm_packs", "mm_packs_bt"] {
        let p = m.packs(name);
        assert_eq!(p.len(), 2, "{name}: {p:?}");
        assert_eq!(
            (p[0].operand, p[0].params.as_slice()),
            (PackOperand::A, &[0usize][..])
        );
        assert_eq!(
            (p[1].operand, p[1].params.as_slice()),
            (PackOperand::B, &[1usize][..])
        );
        assert!(m.get_packed(name).is_some());
    }
    // Batched operands pack every batch: 3 x 40 rows (mr = 4) x 70.
    assert_eq!(m.packs("mm_packs")[0].bytes, 3 * 40 * 70 * 4);
}

/// A grouped, batched NCHW convolution as a gemm over an implicit im2col operand, built like
/// the lowering builds it: batch `b = n * groups + g`, `k = (c, kh, kw)`, `j = (oh, ow)`.
#[allow(clippy::too_many_arguments)]
fn conv_kernel(
    name: &str,
    (nb, c, h, w, o): (i64, i64, i64, i64, i64),
    (kh, kw): (i64, i64),
    stride: i64,
    pad: i64,
    dil: i64,
    groups: i64,
    params: Option<GemmParams>,
) -> Kernel {
    let (cg, og) = (c / groups, o / groups);
    let oh = (h + 2 * pad - dil * (kh - 1) - 1) / stride + 1;
    let ow = (w + 2 * pad - dil * (kw - 1) - 1) / stride + 1;
    let taps = kh * kw;
    let mut k = Kernel::new(name);
    let x = k.param("x", DType::F32, vec![nb, c, h, w]);
    let wt = k.param("w", DType::F32, vec![o, cg * taps]);
    let out = k.param("out", DType::F32, vec![nb, o, oh * ow]);
    let (vb, vi, vj, vk) = (
        k.index_var("b"),
        k.index_var("i"),
        k.index_var("j"),
        k.index_var("k"),
    );
    let acc = k.new_var("acc", Ty::Elem(DType::F32), false);
    let n_ = Expr::div(v(vb), groups);
    let grp = Expr::rem(v(vb), groups);
    let ci = Expr::add(
        Expr::mul(grp.clone(), Expr::Int(cg)),
        Expr::div(v(vk), taps),
    );
    let th = Expr::div(Expr::rem(v(vk), taps), kw);
    let tw = Expr::rem(v(vk), kw);
    let coord = |o: Expr, t: Expr| {
        Expr::bin(
            BinOp::Sub,
            Expr::add(
                Expr::mul(o, Expr::Int(stride)),
                Expr::mul(t, Expr::Int(dil)),
            ),
            Expr::Int(pad),
        )
    };
    let ih = coord(Expr::div(v(vj), ow), th);
    let iw = coord(Expr::rem(v(vj), ow), tw);
    let inb = |e: &Expr, lim: i64| {
        Expr::bin(
            BinOp::And,
            Expr::bin(BinOp::Ge, e.clone(), Expr::Int(0)),
            Expr::bin(BinOp::Lt, e.clone(), Expr::Int(lim)),
        )
    };
    let ld = Expr::load(x, vec![n_.clone(), ci, ih.clone(), iw.clone()]);
    let b_expr = if pad > 0 {
        Expr::select(
            Expr::bin(BinOp::And, inb(&ih, h), inb(&iw, w)),
            ld,
            Expr::f32(0.0),
        )
    } else {
        ld
    };
    let mch = Expr::add(Expr::mul(grp, Expr::Int(og)), v(vi));
    k.body.push(Stmt::Gemm(Box::new(Gemm {
        batch: nb * groups,
        m: og,
        n: oh * ow,
        k: cg * taps,
        b_var: vb,
        i_var: vi,
        j_var: vj,
        k_var: vk,
        acc_var: acc,
        acc_dtype: DType::F32,
        a: Expr::load(wt, vec![mch.clone(), v(vk)]),
        b: b_expr,
        epilogue: vec![Stmt::store(out, vec![n_, mch, v(vj)], v(acc))],
        params: params.unwrap_or_else(|| gemm_params(og, oh * ow, cg * taps, &CpuInfo::host())),
        vector: false,
    })));
    k
}

/// The vectorized im2col packing (contiguous runs as masked loads, every-other-element runs as
/// two masked loads and a permute, other columns gathered) against the interpreter: stride 1 and 2, padding, dilation, groups, batches, 1x1 without
/// bounds, column counts that leave partial vectors and panels.
#[test]
fn im2col_fast_paths() {
    let small = Some(GemmParams {
        mr: 4,
        nr: 32,
        kc: 7,
        mc: 8,
        nc: 64,
    });
    let ks = vec![
        conv_kernel("c3s1p1", (1, 5, 11, 13, 6), (3, 3), 1, 1, 1, 1, None),
        conv_kernel("c3s2p1", (2, 4, 12, 9, 5), (3, 3), 2, 1, 1, 1, None),
        conv_kernel("c3s1p2d2", (1, 3, 10, 21, 4), (3, 3), 1, 2, 2, 1, None),
        conv_kernel("c1x1", (2, 7, 6, 9, 5), (1, 1), 1, 0, 1, 1, None),
        conv_kernel("c1x1s2", (1, 7, 9, 9, 5), (1, 1), 2, 0, 1, 1, None),
        conv_kernel("c5g2", (2, 6, 9, 17, 4), (5, 3), 1, 2, 1, 2, None),
        conv_kernel("c3small", (1, 5, 11, 13, 6), (3, 3), 1, 1, 1, 1, small),
        conv_kernel("c7s2p3", (1, 3, 30, 30, 8), (7, 7), 2, 3, 1, 1, small),
        // Rows of 35 and 53 stride-2 columns (a 1-D conv along W): 16-column vectors of every
        // other element, the padding column masked at the left, partial vectors at the right.
        conv_kernel("c1x3s2", (1, 5, 3, 70, 6), (1, 3), 2, 1, 1, 1, None),
        conv_kernel("c1x3s2b", (2, 3, 2, 105, 4), (1, 3), 2, 1, 1, 1, small),
    ];
    check_kernels(&ks, 24, true, gemm_tol);
    if CpuInfo::host().avx512f {
        for k in &ks {
            let c = tilec_cpu::render_c(k).unwrap();
            assert!(
                c.contains("_mm512_maskz_loadu_ps(m, xr"),
                "{}: no fast im2col packing",
                k.name
            );
        }
        let c = tilec_cpu::render_c(&ks[8]).unwrap();
        assert!(c.contains("_mm512_permutex2var_ps(lo, tc_even, hi)"), "no stride-2 packing");
    }
}

/// Gemms computed transposed (operands swapped, the register tile along the other dimension):
/// products with epilogues, transposed operands and implicit im2col convolutions, with small
/// blocks (edge tiles, several K slices), against the interpreter of the original kernels.
#[test]
fn transposed_gemms() {
    let small = GemmParams {
        mr: 3,
        nr: 16,
        kc: 16,
        mc: 9,
        nc: 48,
    };
    let mut ks = vec![];
    for (idx, &(batch, m, n, kk)) in [
        (1, 7, 33, 57),
        (2, 33, 7, 5),
        (1, 1, 49, 20),
        (3, 17, 40, 50),
    ]
    .iter()
    .enumerate()
    {
        ks.push(gemm_kernel(&format!("tmm{idx}"), &spec(batch, m, n, kk)));
        ks.push(gemm_kernel(
            &format!("tmm{idx}_small"),
            &Spec {
                params: Some(small),
                ..spec(batch, m, n, kk)
            },
        ));
    }
    ks.push(gemm_kernel(
        "tmm_t",
        &Spec {
            transposed_b: true,
            ..spec(2, 33, 65, 47)
        },
    ));
    ks.push(conv_kernel(
        "tc1x1",
        (2, 7, 6, 9, 5),
        (1, 1),
        1,
        0,
        1,
        1,
        None,
    ));
    ks.push(conv_kernel(
        "tc3s2p1",
        (2, 4, 12, 9, 5),
        (3, 3),
        2,
        1,
        1,
        1,
        None,
    ));
    ks.push(conv_kernel(
        "tc5g2",
        (2, 6, 9, 17, 4),
        (5, 3),
        1,
        2,
        1,
        2,
        Some(small),
    ));
    let originals = ks.clone();
    for k in ks.iter_mut() {
        let before = format!("{k}");
        tilec_tile::schedule::gemm_transpose(k, None).unwrap();
        assert_ne!(before, format!("{k}"));
    }
    // The transposed kernels run on the same inputs as the originals: compare outputs.
    let m = compiler().compile(&ks).unwrap_or_else(|e| panic!("{e}"));
    let mut r = rng(25);
    for (k, orig) in ks.iter().zip(&originals) {
        let args = make_args(orig, &mut r, false);
        let mut want = args.clone();
        tilec_tile::interp::run(orig, &mut want).unwrap_or_else(|e| panic!("interpreter: {e}"));
        let mut got = args.clone();
        m.run(&k.name, &mut got).unwrap_or_else(|e| panic!("{e}"));
        for &p in &written(orig) {
            let i = orig.params.iter().position(|&q| q == p).unwrap();
            let d = orig.buf(p).dtype;
            assert_close(
                &format!("{} transposed, output {}", k.name, orig.buf(p).name),
                &got[i],
                &want[i],
                gemm_tol(orig, d),
            );
        }
    }
    check_kernels(&ks, 26, false, gemm_tol);
}

/// A convolution (no groups) over the channel concatenation of `chans.len()` inputs, as a gemm
/// whose B operand picks the input by the row: `k < c0 ? x0[.., k, ..] : (k < c0 + c1 ? ...)`,
/// each branch with its own padding bounds.
fn concat_conv_kernel(
    name: &str,
    (nb, h, w, o): (i64, i64, i64, i64),
    chans: &[i64],
    kside: i64,
    pad: i64,
    params: Option<GemmParams>,
) -> Kernel {
    let c: i64 = chans.iter().sum();
    let oh = h + 2 * pad - kside + 1;
    let ow = w + 2 * pad - kside + 1;
    let taps = kside * kside;
    let mut k = Kernel::new(name);
    let xs: Vec<BufId> = chans
        .iter()
        .enumerate()
        .map(|(i, &ci)| k.param(&format!("x{i}"), DType::F32, vec![nb, ci, h, w]))
        .collect();
    let wt = k.param("w", DType::F32, vec![o, c * taps]);
    let out = k.param("out", DType::F32, vec![nb, o, oh * ow]);
    let (vb, vi, vj, vk) = (
        k.index_var("b"),
        k.index_var("i"),
        k.index_var("j"),
        k.index_var("k"),
    );
    let acc = k.new_var("acc", Ty::Elem(DType::F32), false);
    let ci = Expr::div(v(vk), taps);
    let th = Expr::div(Expr::rem(v(vk), taps), kside);
    let tw = Expr::rem(v(vk), kside);
    let ih = Expr::bin(
        BinOp::Sub,
        Expr::add(Expr::div(v(vj), ow), th),
        Expr::Int(pad),
    );
    let iw = Expr::bin(
        BinOp::Sub,
        Expr::add(Expr::rem(v(vj), ow), tw),
        Expr::Int(pad),
    );
    let inb = |e: &Expr, lim: i64| {
        Expr::bin(
            BinOp::And,
            Expr::bin(BinOp::Ge, e.clone(), Expr::Int(0)),
            Expr::bin(BinOp::Lt, e.clone(), Expr::Int(lim)),
        )
    };
    // Branches from the last input outwards.
    let mut starts = vec![0i64];
    for &ci in chans {
        starts.push(starts.last().unwrap() + ci);
    }
    let branch = |i: usize| {
        let ch = Expr::bin(BinOp::Sub, ci.clone(), Expr::Int(starts[i]));
        let ld = Expr::load(xs[i], vec![v(vb), ch, ih.clone(), iw.clone()]);
        if pad > 0 {
            Expr::select(
                Expr::bin(BinOp::And, inb(&ih, h), inb(&iw, w)),
                ld,
                Expr::f32(0.0),
            )
        } else {
            ld
        }
    };
    let mut b_expr = branch(chans.len() - 1);
    for i in (0..chans.len() - 1).rev() {
        b_expr = Expr::select(
            Expr::bin(BinOp::Lt, ci.clone(), Expr::Int(starts[i + 1])),
            branch(i),
            b_expr,
        );
    }
    k.body.push(Stmt::Gemm(Box::new(Gemm {
        batch: nb,
        m: o,
        n: oh * ow,
        k: c * taps,
        b_var: vb,
        i_var: vi,
        j_var: vj,
        k_var: vk,
        acc_var: acc,
        acc_dtype: DType::F32,
        a: Expr::load(wt, vec![v(vi), v(vk)]),
        b: b_expr,
        epilogue: vec![Stmt::store(out, vec![v(vb), v(vi), v(vj)], v(acc))],
        params: params.unwrap_or_else(|| gemm_params(o, oh * ow, c * taps, &CpuInfo::host())),
        vector: false,
    })));
    k
}

/// Convolutions over 2- and 3-way channel concatenations (1x1 with and without padding, 3x3
/// padded; K slices that start inside an input; with every subset of the operands prepacked),
/// against the interpreter.
#[test]
fn concat_operands() {
    let small = Some(GemmParams {
        mr: 4,
        nr: 32,
        kc: 5,
        mc: 8,
        nc: 64,
    });
    let ks = vec![
        concat_conv_kernel("cat2_1x1", (2, 7, 9, 6), &[5, 8], 1, 0, None),
        concat_conv_kernel("cat2_1x1p1", (1, 6, 7, 5), &[3, 4], 1, 1, None),
        concat_conv_kernel("cat3_1x1", (2, 5, 11, 7), &[4, 3, 6], 1, 0, None),
        concat_conv_kernel("cat3_1x1p1", (1, 9, 5, 4), &[2, 5, 3], 1, 1, small),
        concat_conv_kernel("cat3_1x1_small", (2, 8, 9, 9), &[6, 7, 5], 1, 0, small),
        concat_conv_kernel("cat2_3x3p1", (1, 8, 10, 6), &[3, 2], 3, 1, small),
    ];
    check_kernels(&ks, 25, true, gemm_tol);
}

/// A kernel and its product `out[b, i, :] = A[b, i, :] · w` over a channels-last image `x` of
/// `pixels` rows and `c` channels: `batch` products of `m` rows, `A` built by `a` from `x`
/// and the variables (batch, row, k). The product is returned apart, for its indirect form.
fn image_product(
    name: &str,
    pixels: i64,
    (c, o, batch, m): (i64, i64, i64, i64),
    a: impl FnOnce(BufId, VarId, VarId, VarId) -> Expr,
) -> (Kernel, Gemm) {
    let mut k = Kernel::new(name);
    let x = k.param("x", DType::F32, vec![pixels, c]);
    let wt = k.param("w", DType::F32, vec![c, o]);
    let out = k.param("out", DType::F32, vec![batch, m, o]);
    let (vb, vi, vj, vk) = (k.index_var("b"), k.index_var("i"), k.index_var("j"), k.index_var("k"));
    let acc = k.new_var("acc", Ty::Elem(DType::F32), false);
    let g = Gemm {
        batch,
        m,
        n: o,
        k: c,
        b_var: vb,
        i_var: vi,
        j_var: vj,
        k_var: vk,
        acc_var: acc,
        acc_dtype: DType::F32,
        a: a(x, vb, vi, vk),
        b: Expr::load(wt, vec![v(vk), v(vj)]),
        epilogue: vec![Stmt::store(out, vec![v(vb), v(vi), v(vj)], v(acc))],
        params: gemm_params(m, o, c, &CpuInfo::host()),
        vector: false,
    };
    (k, g)
}

/// `x[(row + dr) * w + col + dc, k]`.
fn pixel(x: BufId, (row, col): (&Expr, &Expr), (dr, dc): (i64, i64), w: i64, vk: VarId) -> Expr {
    let r = Expr::add(row.clone(), Expr::Int(dr));
    let q = Expr::add(col.clone(), Expr::Int(dc));
    Expr::load(x, vec![Expr::add(Expr::mul(r, Expr::Int(w)), q), v(vk)])
}

/// A product over the rows of an image rolled along both axes (Swin's shifted windows): `A`'s
/// row `i` reads pixel `((i / w - s) mod h, (i % w - s) mod w)` of a channels-last image,
/// written as two concatenations' selects on the row. `A` is read in place (one pointer per
/// row, chosen by the selects), against the interpreter; then over windows of such an image.
#[test]
fn rolled_rows_in_place() {
    let mut ks = vec![];
    for (h, w, s, c, o) in [(6, 10, 2, 9, 7), (7, 7, 3, 32, 20)] {
        let (mut k, g) = image_product(&format!("rolled_{h}x{w}"), h * w, (c, o, 1, h * w), |x, _, vi, vk| {
            let (row, col) = (Expr::div(v(vi), w), Expr::rem(v(vi), w));
            let src = |dr, dc| pixel(x, (&row, &col), (dr, dc), w, vk);
            let by_col = |dr| Expr::select(Expr::bin(BinOp::Lt, col.clone(), Expr::Int(s)), src(dr, w - s), src(dr, -s));
            Expr::select(Expr::bin(BinOp::Lt, row.clone(), Expr::Int(s)), by_col(h - s), by_col(-s))
        });
        let ind = tilec_tile::indirect::indirect_form(&k, &g).expect("a rolled A is read in place");
        assert_eq!(ind.leaves.len(), 1);
        assert!(format!("{:?}", ind.leaves[0].row).contains("Select"), "{:?}", ind.leaves[0].row);
        k.body.push(Stmt::Gemm(Box::new(g)));
        ks.push(k);
    }
    // The same over windows (Swin's shifted-window attention input): the batch is the window,
    // the row a pixel in it, and each branch's offset carries the window's terms, so the
    // branches differ in more than a constant outside `k`.
    for (h, w, s, ws, c, o) in [(14, 14, 3, 7, 24, 10), (12, 8, 2, 4, 9, 5)] {
        let nw = w / ws;
        let batch = (h / ws) * nw;
        let (mut k, g) = image_product(&format!("rolled_windows_{h}x{w}"), h * w, (c, o, batch, ws * ws), |x, vb, vi, vk| {
            let row = Expr::add(Expr::mul(Expr::div(v(vb), nw), Expr::Int(ws)), Expr::div(v(vi), ws));
            let col = Expr::add(Expr::mul(Expr::rem(v(vb), nw), Expr::Int(ws)), Expr::rem(v(vi), ws));
            let src = |dr, dc| pixel(x, (&row, &col), (dr, dc), w, vk);
            let by_col = |dr| Expr::select(Expr::bin(BinOp::Lt, col.clone(), Expr::Int(w - s)), src(dr, s), src(dr, s - w));
            Expr::select(Expr::bin(BinOp::Lt, row.clone(), Expr::Int(h - s)), by_col(s), by_col(s - h))
        });
        let ind = tilec_tile::indirect::indirect_form(&k, &g).expect("rolled windows are read in place");
        assert_eq!(ind.leaves.len(), 1);
        assert!(!ind.batched, "the window's terms belong to the row part");
        k.body.push(Stmt::Gemm(Box::new(g)));
        ks.push(k);
    }
    check_kernels(&ks, 31, true, gemm_tol);
}
