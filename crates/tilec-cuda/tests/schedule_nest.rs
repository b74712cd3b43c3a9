//! The GEMM and direct-nest GPU schedules keep the serial semantics: run by the tile
//! interpreter (thread loops serially, barriers as no-ops) on fresh random inputs with
//! poisoned outputs, a scheduled kernel computes what the unscheduled one does. Every
//! scheduled kernel renders, and compiles with NVRTC when the library is present.

mod common;

use common::nvrtc_or_skip;
use rand::{Rng, SeedableRng};
use tilec_cuda::*;
use tilec_ir::{DType, Tensor};
use tilec_tile::*;

/// Random inputs; parameters the kernel stores to are poisoned (NaN, or a large integer).
fn args_for(k: &Kernel, seed: u64) -> Vec<Tensor> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let stored = k.stored_buffers();
    k.params
        .iter()
        .map(|&b| {
            let buf = k.buf(b);
            let shape: Vec<usize> = buf.shape.iter().map(|&d| d as usize).collect();
            let n: usize = shape.iter().product();
            let vals: Vec<f64> = if stored.contains(&b) {
                vec![if buf.dtype.is_float() { f64::NAN } else { 77.0 }; n]
            } else if buf.dtype.is_float() {
                (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect()
            } else {
                (0..n).map(|_| rng.gen_range(0..3) as f64).collect()
            };
            Tensor::from_f64s(buf.dtype, shape, &vals).unwrap()
        })
        .collect()
}

fn same(a: &[f64], b: &[f64], tol: f64) -> Option<(usize, f64, f64)> {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let ok = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * (1.0 + x.abs());
        if !ok {
            return Some((i, *x, *y));
        }
    }
    None
}

/// Runs `k` and its schedule `s` on the same inputs; every output must match and be written.
fn check(k: &Kernel, s: &Kernel, tol: f64, seed: u64) {
    let args = args_for(k, seed);
    let mut a = args.clone();
    interp::run(k, &mut a).unwrap_or_else(|e| panic!("{}: unscheduled: {e}", k.name));
    let mut b = args.clone();
    interp::run(s, &mut b).unwrap_or_else(|e| panic!("{}: scheduled: {e}\n{s}", k.name));
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
        if let Some((j, p, q)) = same(&x, &y, tol) {
            panic!("{}: parameter {i} element {j}: unscheduled {p}, scheduled {q}\n{s}", k.name);
        }
        assert!(!x.iter().any(|v| v.is_nan()), "{}: parameter {i} keeps poison", k.name);
    }
}

/// `out[b, i, j] = relu(sum_k A[b, i, k] * B[b, k, j] + bias[j])`, A transposed when `ta`.
fn gemm_kernel(batch: i64, m: i64, n: i64, kk: i64, d: DType, ta: bool) -> Kernel {
    let mut k = Kernel::new(format!("gemm_{batch}x{m}x{n}x{kk}_{}{}", d.name(), if ta { "_t" } else { "" }));
    let a = if ta { k.param("a", d, vec![batch, kk, m]) } else { k.param("a", d, vec![batch, m, kk]) };
    let b = k.param("b", d, vec![batch, kk, n]);
    let bias = k.param("bias", d, vec![n]);
    let out = k.param("out", d, vec![batch, m, n]);
    let (bv, iv, jv, kv) = (k.index_var("b"), k.index_var("i"), k.index_var("j"), k.index_var("k"));
    let ad = if d.is_float() { DType::F32 } else { DType::I64 };
    let acc = k.new_var("acc", Ty::Elem(ad), false);
    let up = |e: Expr| if ad == d { e } else { Expr::cast(ad, e) };
    let ae = if ta {
        Expr::load(a, vec![Expr::Var(bv), Expr::Var(kv), Expr::Var(iv)])
    } else {
        Expr::load(a, vec![Expr::Var(bv), Expr::Var(iv), Expr::Var(kv)])
    };
    let be = Expr::load(b, vec![Expr::Var(bv), Expr::Var(kv), Expr::Var(jv)]);
    let y = Expr::bin(BinOp::Add, Expr::Var(acc), up(Expr::load(bias, vec![Expr::Var(jv)])));
    let y = Expr::bin(BinOp::Max, y, if ad == DType::F32 { Expr::f32(0.0) } else { Expr::Lit(Lit::Int(0, ad)) });
    let y = if ad == d { y } else { Expr::cast(d, y) };
    let epi = vec![Stmt::store(out, vec![Expr::Var(bv), Expr::Var(iv), Expr::Var(jv)], y)];
    k.body.push(Stmt::Gemm(Box::new(Gemm {
        batch,
        m,
        n,
        k: kk,
        b_var: bv,
        i_var: iv,
        j_var: jv,
        k_var: kv,
        acc_var: acc,
        acc_dtype: ad,
        a: up(ae),
        b: up(be),
        epilogue: epi,
        params: GemmParams { mr: 4, nr: 8, kc: 16, mc: 16, nc: 32 },
        vector: false,
    })));
    k
}

/// Max pool 3x3 stride 2 pad 1 over [n, c, h, w]: a direct nest with a window reduction.
fn pool_kernel(n: i64, c: i64, h: i64, w: i64) -> Kernel {
    let (oh, ow) = ((h - 1) / 2 + 1, (w - 1) / 2 + 1);
    let mut k = Kernel::new(format!("maxpool_{n}x{c}x{h}x{w}"));
    let x = k.param("x", DType::F32, vec![n, c, h, w]);
    let y = k.param("y", DType::F32, vec![n, c, oh, ow]);
    let vs: Vec<VarId> = ["n", "c", "oh", "ow", "kh", "kw"].iter().map(|s| k.index_var(*s)).collect();
    let acc = k.new_var("acc", Ty::Elem(DType::F32), true);
    let ih = Expr::add(Expr::mul(Expr::Var(vs[2]), Expr::Int(2)), Expr::add(Expr::Var(vs[4]), Expr::Int(-1)));
    let iw = Expr::add(Expr::mul(Expr::Var(vs[3]), Expr::Int(2)), Expr::add(Expr::Var(vs[5]), Expr::Int(-1)));
    let inside = Expr::bin(
        BinOp::And,
        Expr::bin(BinOp::And, Expr::bin(BinOp::Ge, ih.clone(), Expr::Int(0)), Expr::bin(BinOp::Lt, ih.clone(), Expr::Int(h))),
        Expr::bin(BinOp::And, Expr::bin(BinOp::Ge, iw.clone(), Expr::Int(0)), Expr::bin(BinOp::Lt, iw.clone(), Expr::Int(w))),
    );
    let upd = Stmt::If {
        cond: inside,
        then_: vec![Stmt::Assign {
            var: acc,
            value: Expr::bin(BinOp::Max, Expr::Var(acc), Expr::load(x, vec![Expr::Var(vs[0]), Expr::Var(vs[1]), ih, iw])),
        }],
        else_: vec![],
    };
    let row = vec![
        Stmt::Let { var: acc, value: Expr::f32(f32::NEG_INFINITY) },
        Stmt::for_(vs[4], 3, vec![Stmt::for_(vs[5], 3, vec![upd])]),
        Stmt::store(y, vec![Expr::Var(vs[0]), Expr::Var(vs[1]), Expr::Var(vs[2]), Expr::Var(vs[3])], Expr::Var(acc)),
    ];
    k.body = vec![Stmt::for_(
        vs[0],
        n,
        vec![Stmt::for_(vs[1], c, vec![Stmt::for_(vs[2], oh, vec![Stmt::for_(vs[3], ow, row)])])],
    )];
    k
}

/// Two nests in one kernel (the second reads what the first wrote), then a scalar reduction:
/// the one-block and one-thread variants.
fn two_nests(n: i64) -> (Kernel, Kernel) {
    let mut k = Kernel::new(format!("two_nests_{n}"));
    let x = k.param("x", DType::F32, vec![n]);
    let t = k.param("t", DType::F32, vec![n]);
    let y = k.param("y", DType::F32, vec![n]);
    let (i, j) = (k.index_var("i"), k.index_var("j"));
    let l1 = Stmt::for_(i, n, vec![Stmt::store(t, vec![Expr::Var(i)], Expr::bin(BinOp::Mul, Expr::load(x, vec![Expr::Var(i)]), Expr::f32(3.0)))]);
    let rev = Expr::add(Expr::Int(n - 1), Expr::mul(Expr::Var(j), Expr::Int(-1)));
    let l2 = Stmt::for_(j, n, vec![Stmt::store(y, vec![Expr::Var(j)], Expr::bin(BinOp::Add, Expr::load(t, vec![rev]), Expr::f32(1.0)))]);
    k.body = vec![l1, l2];

    let mut s = Kernel::new(format!("sum_{n}"));
    let x = s.param("x", DType::F32, vec![n]);
    let y = s.param("y", DType::F32, vec![1]);
    let i = s.index_var("i");
    let acc = s.new_var("acc", Ty::Elem(DType::F32), true);
    s.body = vec![
        Stmt::Let { var: acc, value: Expr::f32(0.0) },
        Stmt::for_(i, n, vec![Stmt::Assign { var: acc, value: Expr::bin(BinOp::Add, Expr::Var(acc), Expr::load(x, vec![Expr::Var(i)])) }]),
        Stmt::store(y, vec![Expr::Int(0)], Expr::Var(acc)),
    ];
    (k, s)
}

/// Two nests over disjoint outputs of different sizes reading one input (as a rotary
/// embedding's rotated queries and keys): `q[i] = x[i] * 2` for `i < n`, `k[j] = x[j] + x[m - 1 - j]`.
fn sibling_nests(n: i64, m: i64) -> Kernel {
    let mut k = Kernel::new(format!("siblings_{n}_{m}"));
    let x = k.param("x", DType::F32, vec![n.max(m)]);
    let q = k.param("q", DType::F32, vec![n]);
    let kk = k.param("k", DType::F32, vec![m]);
    let (i, j) = (k.index_var("i"), k.index_var("j"));
    let l1 = Stmt::for_(i, n, vec![Stmt::store(q, vec![Expr::Var(i)], Expr::bin(BinOp::Mul, Expr::load(x, vec![Expr::Var(i)]), Expr::f32(2.0)))]);
    let rev = Expr::add(Expr::Int(m - 1), Expr::mul(Expr::Var(j), Expr::Int(-1)));
    let l2 = Stmt::for_(j, m, vec![Stmt::store(kk, vec![Expr::Var(j)], Expr::bin(BinOp::Add, Expr::load(x, vec![Expr::Var(j)]), Expr::load(x, vec![rev])))]);
    k.body = vec![l1, l2];
    k
}

/// `y[i, j] = 2 * x[i, w - 1 - j]` through a per-row scratch buffer (as attention lowers its
/// score rows), stored at a re-indexed offset `(i / 13) * 13w + (i % 13) * w + j`.
fn scratch_rows(rows: i64, w: i64) -> Kernel {
    let mut k = Kernel::new(format!("scratch_{rows}x{w}"));
    let x = k.param("x", DType::F32, vec![rows, w]);
    let y = k.param("y", DType::F32, vec![rows * w]);
    let tmp = k.buffer("tmp", DType::F32, vec![w], Scope::Local);
    let (i, j, j2) = (k.index_var("i"), k.index_var("j"), k.index_var("j2"));
    let rev = Expr::add(Expr::Int(w - 1), Expr::mul(Expr::Var(j), Expr::Int(-1)));
    let fill = Stmt::for_(j, w, vec![Stmt::store(tmp, vec![Expr::Var(j)], Expr::bin(BinOp::Mul, Expr::load(x, vec![Expr::Var(i), rev]), Expr::f32(2.0)))]);
    let off = Expr::add(
        Expr::add(
            Expr::mul(Expr::div(Expr::Var(i), 13), Expr::Int(13 * w)),
            Expr::mul(Expr::rem(Expr::Var(i), 13), Expr::Int(w)),
        ),
        Expr::Var(j2),
    );
    let out = Stmt::for_(j2, w, vec![Stmt::store(y, vec![off], Expr::load(tmp, vec![Expr::Var(j2)]))]);
    k.body = vec![Stmt::for_(i, rows, vec![Stmt::Alloc(tmp), fill, out])];
    k
}

fn all_cases() -> Vec<(Kernel, Kernel, &'static str, f64)> {
    let t = GpuTarget::hopper();
    let mut out = vec![];
    for (batch, m, n, kk) in [(1, 64, 64, 32), (2, 37, 50, 19), (1, 1, 10, 70), (3, 5, 3, 1), (1, 130, 17, 33)] {
        for (d, tol) in [(DType::F32, 0.0), (DType::F16, 1e-3), (DType::BF16, 1e-2), (DType::I32, 0.0)] {
            for ta in [false, true] {
                let k = gemm_kernel(batch, m, n, kk, d, ta);
                let (s, how) = schedule_gpu_named(&k, &t).unwrap();
                out.push((k, s, how, tol));
            }
        }
    }
    for (n, c, h, w) in [(1, 3, 7, 9), (2, 4, 16, 16)] {
        let k = pool_kernel(n, c, h, w);
        let (s, how) = schedule_gpu_named(&k, &t).unwrap();
        out.push((k, s, how, 0.0));
    }
    for (rows, w) in [(169, 16), (3, 5)] {
        let k = scratch_rows(rows, w);
        let (s, how) = schedule_gpu_named(&k, &t).unwrap();
        out.push((k, s, how, 0.0));
    }
    for n in [5, 300, 600] {
        let (a, b) = two_nests(n);
        let (s, how) = schedule_gpu_named(&a, &t).unwrap();
        out.push((a, s, how, 0.0));
        // A sum over threads adds in another order.
        let (s, how) = schedule_gpu_named(&b, &t).unwrap();
        out.push((b, s, how, 1e-6));
    }
    for (n, m) in [(600, 75), (40, 3000), (7, 5)] {
        let k = sibling_nests(n, m);
        let (s, how) = schedule_gpu_named(&k, &t).unwrap();
        assert_eq!(how, "grid", "{s}");
        out.push((k, s, how, 0.0));
    }
    out
}

#[test]
fn gemm_and_direct_schedules_match_the_interpreter() {
    let mut seen = std::collections::BTreeMap::new();
    for (i, (k, s, how, tol)) in all_cases().into_iter().enumerate() {
        *seen.entry(how).or_insert(0) += 1;
        check(&k, &s, tol, 11 + i as u64);
    }
    // Each schedule variant was exercised.
    for how in ["gemm", "direct", "grid", "block", "serial"] {
        assert!(seen.get(how).copied().unwrap_or(0) > 0, "no {how} kernel among {seen:?}");
    }
}

#[test]
fn the_gemm_schedule_stages_tiles_in_shared_memory() {
    let k = gemm_kernel(2, 100, 70, 40, DType::F32, false);
    let s = schedule_gemm(&k).unwrap();
    let src = render(&s).unwrap();
    let body = &src.source[src.source.find("extern \"C\"").unwrap()..];
    assert!(body.contains("__shared__"), "{body}");
    assert_eq!(body.matches("__syncthreads();").count(), 2, "{body}");
    assert_eq!(src.launch.block, (256, 1, 1));
    // 2 batches x 2 row tiles x 2 column tiles of 64.
    assert_eq!(src.launch.grid, (8, 1, 1));
    // The accumulator is a per-thread register array (the thread dimension dropped).
    assert!(body.contains("gemm_acc[16]"), "{body}");
}

#[test]
fn scheduled_kernels_render_and_compile_with_nvrtc() {
    let cases = all_cases();
    let mut modules = vec![];
    for (_, s, how, _) in &cases {
        let src = render(s).unwrap_or_else(|e| panic!("{how}: {e}\n{s}"));
        modules.push((s.name.clone(), src.source));
    }
    let Some(nv) = nvrtc_or_skip("scheduled_kernels_render_and_compile_with_nvrtc") else { return };
    let c = Compiler::new(nv, "sm_90a").with_cache_dir(None);
    for ((name, _), r) in modules.iter().zip(c.compile_many(&modules)) {
        let r = r.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(r.image.starts_with(b"\x7fELF"), "{name}: not a cubin");
    }
}

#[test]
fn scratch_inside_a_spread_nest_is_private_and_offsets_fold() {
    // Each thread runs its own rows: their scratch must not be one shared-memory array.
    let k = scratch_rows(169, 16);
    let s = schedule_gpu(&k, &GpuTarget::hopper()).unwrap();
    let tmp = s.buffers.iter().find(|b| b.name == "tmp").unwrap();
    assert_eq!(tmp.scope, Scope::Register, "{s}");
    let src = render(&s).unwrap().source;
    let body = &src[src.find("extern \"C\"").unwrap()..];
    assert!(!body.contains("__shared__"), "{body}");
    // The re-indexed store offset folds back to i * 16 + j: no division by 13 left.
    assert!(!body.contains("(13)"), "{body}");
}

/// One row's reduction (a decode step's normalization: no loop over rows) takes the row
/// schedule, one block; two loops where the second reads what the first stored do not (a
/// row's loops have no barrier between them).
#[test]
fn one_row_reductions_take_the_row_schedule() {
    let t = GpuTarget::hopper();
    for n in [300, 600] {
        let (a, b) = two_nests(n);
        assert_ne!(schedule_gpu_named(&a, &t).unwrap().1, "rows", "{}", a.name);
        assert_eq!(schedule_gpu_named(&b, &t).unwrap().1, "rows", "{}", b.name);
    }
}
