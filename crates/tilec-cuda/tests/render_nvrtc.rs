//! Rendering to CUDA C++ and NVRTC compilation (no GPU needed; NVRTC tests skip with a note
//! when the library is not found: set TILEC_NVRTC_LIB to its path).

mod common;

use common::*;
use tilec_cuda::*;
use tilec_ir::DType;
use tilec_tile::*;

fn tmp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("tilec-cuda-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn benchmark_kernels_render_with_vector_accesses_and_shuffles() {
    for d in [DType::F32, DType::BF16] {
        for (op, k, row) in kernels(32768, 8192, d) {
            let s = schedule(&k, row);
            let src = render(&s).unwrap_or_else(|e| panic!("{op}: {e}"));
            let body = &src.source[src.source.find("extern \"C\"").unwrap()..];
            assert!(
                body.contains("reinterpret_cast<uint4*>"),
                "{op} {d}: no 16-byte vector access\n{body}"
            );
            // Every access of the input is a vector access.
            assert_eq!(
                body.matches("b0_x[").count(),
                body.matches("&b0_x[").count(),
                "{op} {d}\n{body}"
            );
            if row {
                assert!(body.contains("tl_block_allreduce<"), "{op} {d}\n{body}");
                assert_eq!(src.launch.grid, (32768, 1, 1));
                // The row lives in registers: the input is read from global memory once.
                assert_eq!(body.matches("&b0_x[").count(), 1, "{op} {d}\n{body}");
            } else {
                // Four 16-byte vectors per thread, 256 threads per block, the grid covering all.
                let lanes = 16 / d.size_bytes() as u32;
                assert_eq!(src.launch.grid.0, 32768 * 8192 / (lanes * 4 * 256), "{op} {d}");
                assert!(body.contains("#pragma unroll"), "{op} {d}\n{body}");
                // 16-bit results take the branchless GELU; f32 keeps the accurate erff.
                assert_eq!(body.contains("tl_gelu_erf("), d == DType::BF16, "{op} {d}\n{body}");
                assert_eq!(body.contains("tl_gelu_erf_exact("), d == DType::F32, "{op} {d}\n{body}");
            }
            let st = if d == DType::BF16 {
                "tl_bf16*"
            } else {
                "float*"
            };
            assert!(
                body.contains(&format!(
                    "void __launch_bounds__({}) {}(const {st} __restrict__ b0_x",
                    src.launch.block.0, k.name
                )),
                "{body}"
            );
        }
    }
    assert!(PRELUDE.contains("__shfl_xor_sync"));
}

#[test]
fn benchmark_kernels_compile_with_nvrtc_for_sm_90a() {
    let Some(nv) = nvrtc_or_skip("benchmark_kernels_compile_with_nvrtc_for_sm_90a") else {
        return;
    };
    eprintln!("NVRTC {:?} from {}", nv.version(), nv.path());
    let c = Compiler::new(nv, "sm_90a").with_cache_dir(None);
    let mut modules = vec![];
    for d in [DType::F32, DType::BF16] {
        for (rows, cols) in [(32768, 8192), (3, 200), (5, 37), (64, 128)] {
            for (_, k, row) in kernels(rows, cols, d) {
                let s = schedule(&k, row);
                modules.push((
                    format!("{}_{rows}x{cols}", k.name),
                    render_cuda(&s).unwrap(),
                ));
            }
        }
    }
    // Unscheduled kernels (one thread) render and compile too.
    modules.push((
        "softmax_serial".into(),
        render_cuda(&tilec_cuda::handbuilt::softmax(2, 16, DType::F16)).unwrap(),
    ));
    let results = c.compile_many(&modules);
    for ((name, _), r) in modules.iter().zip(results) {
        let r = r.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(r.image.starts_with(b"\x7fELF"), "{name}: not a cubin");
        assert!(!r.cache_hit);
    }
}

#[test]
fn all_dtypes_and_ops_render_and_compile() {
    // One kernel per dtype exercising unary/binary ops, casts and selects.
    let mut srcs = vec![];
    for d in DType::ALL {
        let mut k = Kernel::new(format!("ops_{}", d.name()));
        let x = k.param("x", d, vec![4, 8]);
        let z = k.param("z", d, vec![4, 8]);
        let y = k.param("y", d, vec![4, 8]);
        let (i, j) = (k.index_var("i"), k.index_var("j"));
        let a = Expr::load(x, vec![Expr::Var(i), Expr::Var(j)]);
        let b = Expr::load(z, vec![Expr::Var(i), Expr::Var(j)]);
        let mut vals = vec![];
        let bins: Vec<BinOp> = if d.is_float() {
            vec![
                BinOp::Add,
                BinOp::Sub,
                BinOp::Mul,
                BinOp::Div,
                BinOp::Rem,
                BinOp::FloorDiv,
                BinOp::FloorMod,
                BinOp::Min,
                BinOp::Max,
                BinOp::Pow,
                BinOp::Atan2,
            ]
        } else if d == DType::Bool {
            vec![BinOp::And, BinOp::Or, BinOp::Xor]
        } else {
            vec![
                BinOp::Add,
                BinOp::Sub,
                BinOp::Mul,
                BinOp::Div,
                BinOp::Rem,
                BinOp::FloorDiv,
                BinOp::FloorMod,
                BinOp::Min,
                BinOp::Max,
                BinOp::Pow,
                BinOp::BitAnd,
                BinOp::BitOr,
                BinOp::BitXor,
                BinOp::Shl,
                BinOp::Shr,
            ]
        };
        for op in bins {
            vals.push(Expr::bin(op, a.clone(), b.clone()));
        }
        let uns: Vec<UnOp> = if d.is_float() {
            vec![
                UnOp::Neg,
                UnOp::Abs,
                UnOp::Sqrt,
                UnOp::Rsqrt,
                UnOp::Recip,
                UnOp::Exp,
                UnOp::Log,
                UnOp::Sin,
                UnOp::Cos,
                UnOp::Tan,
                UnOp::Asin,
                UnOp::Acos,
                UnOp::Atan,
                UnOp::Sinh,
                UnOp::Cosh,
                UnOp::Tanh,
                UnOp::Asinh,
                UnOp::Acosh,
                UnOp::Atanh,
                UnOp::Erf,
                UnOp::Floor,
                UnOp::Ceil,
                UnOp::Round,
                UnOp::Trunc,
                UnOp::Sign,
                UnOp::Sigmoid,
            ]
        } else if d == DType::Bool {
            vec![UnOp::Not]
        } else {
            vec![UnOp::Neg, UnOp::BitNot, UnOp::Abs, UnOp::Sign]
        };
        for op in uns {
            vals.push(Expr::un(op, a.clone()));
        }
        for c in [
            DType::F32,
            DType::I64,
            DType::U8,
            DType::Bool,
            DType::BF16,
            DType::F8E4M3,
        ] {
            vals.push(Expr::cast(d, Expr::cast(c, a.clone())));
        }
        vals.push(Expr::select(
            Expr::bin(BinOp::Lt, a.clone(), b.clone()),
            a.clone(),
            b.clone(),
        ));
        if d.is_float() {
            vals.push(Expr::select(
                Expr::un(UnOp::IsNan, a.clone()),
                b.clone(),
                a.clone(),
            ));
            vals.push(Expr::select(
                Expr::un(UnOp::IsInf, a.clone()),
                b.clone(),
                Expr::float(f64::NEG_INFINITY, d),
            ));
        }
        let mut body = vec![];
        for v in vals {
            body.push(Stmt::store(y, vec![Expr::Var(i), Expr::Var(j)], v));
        }
        k.body.push(Stmt::for_(i, 4, vec![Stmt::for_(j, 8, body)]));
        let (f, _) = render::render_function(&k).unwrap_or_else(|e| panic!("{d}: {e}"));
        srcs.push(f);
    }
    // One module holding every kernel after one prelude.
    let module = format!("{PRELUDE}\n{}", srcs.join("\n"));
    let Some(nv) = nvrtc_or_skip("all_dtypes_and_ops_render_and_compile") else {
        return;
    };
    let c = Compiler::new(nv, "sm_90a").with_cache_dir(None);
    c.compile("all_dtypes", &module)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn shared_memory_barriers_and_register_arrays_render() {
    // A block transposes a tile through shared memory.
    let mut k = Kernel::new("smem_tile");
    let x = k.param("x", DType::F32, vec![64, 32]);
    let y = k.param("y", DType::F32, vec![64, 32]);
    let t = k.buffer("tile", DType::F32, vec![32], Scope::Local);
    let (b, tx, tx2) = (k.index_var("b"), k.index_var("tx"), k.index_var("tx2"));
    k.body.push(Stmt::For(Loop {
        var: b,
        extent: 64,
        kind: LoopKind::Bound(GpuAxis::BlockX),
        body: vec![
            Stmt::Alloc(t),
            Stmt::For(Loop {
                var: tx,
                extent: 32,
                kind: LoopKind::Bound(GpuAxis::ThreadX),
                body: vec![Stmt::store(
                    t,
                    vec![Expr::Var(tx)],
                    Expr::load(x, vec![Expr::Var(b), Expr::Var(tx)]),
                )],
            }),
            Stmt::Barrier,
            Stmt::For(Loop {
                var: tx2,
                extent: 32,
                kind: LoopKind::Bound(GpuAxis::ThreadX),
                body: vec![Stmt::store(
                    y,
                    vec![Expr::Var(b), Expr::Var(tx2)],
                    Expr::load(
                        t,
                        vec![Expr::bin(BinOp::Sub, Expr::Int(31), Expr::Var(tx2))],
                    ),
                )],
            }),
        ],
    }));
    let src = render_cuda(&k).unwrap();
    assert!(
        src.contains("__shared__ __align__(16) float b2_tile[32];"),
        "{src}"
    );
    assert!(src.contains("__syncthreads();"), "{src}");
    // The interpreter agrees with the intent (reversal per row).
    let mut args = random_args(&k, 1);
    let xin = args[0].to_f64_vec();
    interp::run(&k, &mut args).unwrap();
    let out = args[1].to_f64_vec();
    for r in 0..64 {
        for c in 0..32 {
            assert_eq!(out[r * 32 + c], xin[r * 32 + 31 - c]);
        }
    }
    // A barrier inside a thread loop is refused.
    let mut bad = k.clone();
    if let Stmt::For(l) = &mut bad.body[0] {
        if let Stmt::For(inner) = &mut l.body[1] {
            inner.body.push(Stmt::Barrier);
        }
    }
    let e = render_cuda(&bad).unwrap_err().to_string();
    assert!(
        e.contains("smem_tile") && e.contains("barrier inside a thread-bound loop"),
        "{e}"
    );
    if let Some(nv) = nvrtc_or_skip("shared_memory_barriers_and_register_arrays_render") {
        Compiler::new(nv, "sm_90a")
            .with_cache_dir(None)
            .compile("smem_tile", &src)
            .unwrap();
    }
}

#[test]
fn render_errors_are_clean() {
    let mut k = tilec_cuda::handbuilt::softmax(2, 16, DType::F32);
    k.name = "bad name".into();
    let e = render_cuda(&k).unwrap_err().to_string();
    assert!(e.contains("bad name") && e.contains("C identifier"), "{e}");
    // Too many threads.
    let mut k = Kernel::new("big_block");
    let x = k.param("x", DType::F32, vec![2048]);
    let t = k.index_var("t");
    k.body.push(Stmt::For(Loop {
        var: t,
        extent: 2048,
        kind: LoopKind::Bound(GpuAxis::ThreadX),
        body: vec![Stmt::store(x, vec![Expr::Var(t)], Expr::f32(0.0))],
    }));
    let e = render_cuda(&k).unwrap_err().to_string();
    assert!(e.contains("big_block") && e.contains("exceeds 1024"), "{e}");
    // Wrong rank.
    let mut k = Kernel::new("rank");
    let x = k.param("x", DType::F32, vec![4, 4]);
    k.body
        .push(Stmt::store(x, vec![Expr::Int(0)], Expr::f32(0.0)));
    let e = render_cuda(&k).unwrap_err().to_string();
    assert!(e.contains("rank") && e.contains("indexed with 1"), "{e}");
}

#[test]
fn compile_cache_hits_on_the_second_compile() {
    let Some(nv) = nvrtc_or_skip("compile_cache_hits_on_the_second_compile") else {
        return;
    };
    let dir = tmp_dir("cache");
    let c = Compiler::new(nv.clone(), "sm_90a").with_cache_dir(Some(dir.clone()));
    let k = schedule(
        &tilec_cuda::handbuilt::rmsnorm(8, 512, DType::BF16, EPS),
        true,
    );
    let src = render_cuda(&k).unwrap();
    let t0 = std::time::Instant::now();
    let a = c.compile(&k.name, &src).unwrap();
    let cold = t0.elapsed();
    assert!(!a.cache_hit);
    let t1 = std::time::Instant::now();
    let b = c.compile(&k.name, &src).unwrap();
    let warm = t1.elapsed();
    assert!(b.cache_hit, "second compile missed the cache");
    assert_eq!(a.image, b.image);
    eprintln!("compile {cold:?}, cache hit {warm:?}");
    // One verified entry; a different option or architecture misses.
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".cubin.tilec"))
        .collect();
    assert_eq!(entries.len(), 1);
    let c2 = Compiler::new(nv.clone(), "sm_90a")
        .with_cache_dir(Some(dir.clone()))
        .with_option("-lineinfo");
    assert!(!c2.compile(&k.name, &src).unwrap().cache_hit);
    let c3 = Compiler::new(nv, "sm_80").with_cache_dir(Some(dir.clone()));
    assert!(!c3.compile(&k.name, &src).unwrap().cache_hit);
    // A truncated or overwritten entry is rebuilt, not trusted.
    let e = entries[0].path();
    for damage in [0, 1] {
        let bytes = std::fs::read(&e).unwrap();
        let bad = if damage == 0 {
            bytes[..bytes.len() / 2].to_vec()
        } else {
            b"garbage".to_vec()
        };
        std::fs::write(&e, bad).unwrap();
        let r = c.compile(&k.name, &src).unwrap();
        assert!(!r.cache_hit);
        assert!(!r.image.is_empty());
        assert!(c.compile(&k.name, &src).unwrap().cache_hit);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compile_errors_carry_the_log_and_ptx_output_works() {
    let Some(nv) = nvrtc_or_skip("compile_errors_carry_the_log") else {
        return;
    };
    let c = Compiler::new(nv.clone(), "sm_90a").with_cache_dir(None);
    let e = c
        .compile(
            "broken",
            "extern \"C\" __global__ void broken(float* x) { x[0] = undefined_name; }",
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nvrtcCompileProgram") && e.contains("broken") && e.contains("undefined_name"),
        "{e}"
    );
    let e = c.compile("nul", "a\0b").unwrap_err().to_string();
    assert!(e.contains("NUL"), "{e}");
    let ptx = Compiler::new(nv, "sm_90a")
        .with_cache_dir(None)
        .with_output(Output::Ptx);
    let k = schedule(&tilec_cuda::handbuilt::softmax(4, 256, DType::F32), true);
    let p = ptx.compile(&k.name, &render_cuda(&k).unwrap()).unwrap();
    let text = String::from_utf8(p.image).unwrap();
    assert!(
        text.contains(".target sm_90a") && text.contains("shfl.sync.bfly"),
        "{}",
        &text[..text.len().min(2000)]
    );
    assert!(
        text.contains("ld.global.nc.v4") || text.contains("ld.global.v4"),
        "no 128-bit loads in the PTX"
    );
}

#[test]
fn cache_dir_follows_the_environment_variables() {
    // Only reads the variables (set by the caller's environment), checks the precedence.
    let d = nvrtc::default_cache_dir();
    if let Some(v) = std::env::var_os("TILEC_CACHE_DIR").filter(|v| !v.is_empty()) {
        assert_eq!(d, Some(std::path::PathBuf::from(v).join("cuda")));
    } else if let Some(v) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        assert_eq!(
            d,
            Some(std::path::PathBuf::from(v).join("tilec").join("cuda"))
        );
    } else if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        assert_eq!(
            d,
            Some(std::path::PathBuf::from(h).join(".cache/tilec/cuda"))
        );
    } else {
        let own = format!("tilec-{}", tilec_runtime::cache::euid());
        assert_eq!(d, Some(std::env::temp_dir().join(own).join("cuda")));
    }
}

#[test]
fn arch_names_follow_the_compute_capability() {
    assert_eq!(driver::arch_for((9, 0)), "sm_90a");
    assert_eq!(driver::arch_for((8, 0)), "sm_80");
    assert_eq!(driver::arch_for((8, 9)), "sm_89");
    assert_eq!(driver::arch_for((10, 0)), "sm_100a");
}

#[test]
fn sixteen_bit_arithmetic_chains_run_natively() {
    // y = f16(f16(a * b) - c) + d: each op's result rounded to the 16-bit type, as the graph
    // spells it. The chain renders as native 16-bit operations on raw bits, for sm_90a and
    // (through float for bf16) for sm_75, and both compile.
    let mut srcs = vec![];
    for d in [DType::BF16, DType::F16] {
        let mut k = Kernel::new(&format!("chain_{}", d.name()));
        let a = k.param("a", d, vec![64]);
        let b = k.param("b", d, vec![64]);
        let c = k.param("c", d, vec![64]);
        let y = k.param("y", d, vec![64]);
        let i = k.index_var("i");
        let ld = |x| Expr::Cast(DType::F32, Box::new(Expr::load(x, vec![Expr::Var(i)])));
        let r16 = |e: Expr| Expr::Cast(d, Box::new(e));
        let f32_ = |e: Expr| Expr::Cast(DType::F32, Box::new(e));
        let ab = r16(Expr::bin(BinOp::Mul, ld(a), ld(b)));
        let abc = r16(Expr::bin(BinOp::Sub, f32_(ab), ld(c)));
        let out = r16(Expr::bin(BinOp::Add, f32_(abc), ld(a)));
        k.body.push(Stmt::for_(i, 64, vec![Stmt::store(y, vec![Expr::Var(i)], out)]));
        let src = render_cuda(&k).unwrap();
        let t = if d == DType::BF16 { "bf16" } else { "f16" };
        assert!(
            src.contains(&format!("tl_add_{t}(tl_sub_{t}(tl_mul_{t}(")),
            "{d}: {}",
            &src[src.find("extern \"C\"").unwrap()..]
        );
        srcs.push((k.name.clone(), src));
    }
    let Some(nv) = nvrtc_or_skip("sixteen_bit_arithmetic_chains_run_natively") else {
        return;
    };
    for arch in ["sm_90a", "sm_75"] {
        let c = Compiler::new(nv.clone(), arch).with_cache_dir(None);
        for ((name, _), r) in srcs.iter().zip(c.compile_many(&srcs)) {
            r.unwrap_or_else(|e| panic!("{name} for {arch}: {e}"));
        }
    }
}
