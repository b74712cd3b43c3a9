//! The compiler: cache hits, deduplication, parallel units, error reporting.

mod common;
use common::*;
use tilec_cpu::{CompileError, CompileOptions, Compiler};
use tilec_ir::DType;
use tilec_tile::ir::*;

fn scale_kernel(name: &str, n: i64, factor: f32) -> Kernel {
    let mut k = Kernel::new(name);
    let x = k.param("x", DType::F32, vec![n]);
    let y = k.param("y", DType::F32, vec![n]);
    let i = k.index_var("i");
    k.body.push(Stmt::For(Loop {
        var: i,
        extent: n,
        kind: LoopKind::Vectorized,
        body: vec![Stmt::store(
            y,
            vec![v(i)],
            Expr::bin(BinOp::Mul, Expr::load(x, vec![v(i)]), Expr::f32(factor)),
        )],
    }));
    k
}

fn fresh_dir(name: &str) -> std::path::PathBuf {
    let d = cache_dir(&format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn second_compile_is_a_cache_hit() {
    let dir = fresh_dir("cache");
    let c = Compiler::new(CompileOptions {
        cache_dir: Some(dir.clone()),
        jobs: 3,
        ..CompileOptions::default()
    });
    let ks: Vec<Kernel> = (0..5)
        .map(|i| scale_kernel(&format!("scale{i}"), 33 + i, i as f32 + 0.5))
        .collect();
    let m1 = c.compile(&ks).unwrap();
    assert!(!m1.stats().cache_hit);
    assert_eq!(m1.stats().units, 3);
    assert_eq!(m1.stats().unique, 5);
    assert!(m1.stats().library.starts_with(&dir));
    let m2 = c.compile(&ks).unwrap();
    assert!(m2.stats().cache_hit);
    assert_eq!(m2.stats().units, 0);
    assert_eq!(c.cache_counts(), (1, 1));
    // A fresh compiler (another process, say) finds the same library.
    let c2 = Compiler::new(CompileOptions {
        cache_dir: Some(dir.clone()),
        ..CompileOptions::default()
    });
    assert!(c2.compile(&ks).unwrap().stats().cache_hit);
    // Different flags are a different library.
    let mut flags = tilec_cpu::default_flags();
    flags.push("-DTILEC_TEST_VARIANT=1".into());
    let c3 = Compiler::new(CompileOptions {
        cache_dir: Some(dir.clone()),
        flags,
        ..CompileOptions::default()
    });
    assert!(!c3.compile(&ks).unwrap().stats().cache_hit);
    // Both modules compute correctly.
    let mut r = rng(30);
    for m in [&m1, &m2] {
        for k in &ks {
            let args = make_args(k, &mut r, true);
            let mut want = args.clone();
            tilec_tile::interp::run(k, &mut want).unwrap();
            let mut got = args;
            m.run(&k.name, &mut got).unwrap();
            assert_close(&k.name, &got[1], &want[1], tol_for(DType::F32));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn identical_kernels_share_code() {
    let dir = fresh_dir("dedup");
    let c = Compiler::new(CompileOptions {
        cache_dir: Some(dir.clone()),
        ..CompileOptions::default()
    });
    // Same structure, different kernel and buffer names.
    let a = scale_kernel("layer1.scale", 64, 2.0);
    let mut b = scale_kernel("layer2/scale", 64, 2.0);
    b.buffers[0].name = "other_input".into();
    let other = scale_kernel("layer3", 64, 3.0);
    let m = c.compile(&[a.clone(), b.clone(), other.clone()]).unwrap();
    assert_eq!(m.stats().kernels, 3);
    assert_eq!(m.stats().unique, 2);
    assert_eq!(
        m.get("layer1.scale").map(|f| f as usize),
        m.get("layer2/scale").map(|f| f as usize)
    );
    assert!(m.get("layer3").is_some());
    assert!(m.get("missing").is_none());
    let mut r = rng(31);
    for k in [&a, &b, &other] {
        let args = make_args(k, &mut r, false);
        let mut want = args.clone();
        tilec_tile::interp::run(k, &mut want).unwrap();
        let mut got = args;
        m.run(&k.name, &mut got).unwrap();
        assert_close(&k.name, &got[1], &want[1], tol_for(DType::F32));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn errors_name_the_kernel() {
    let dir = fresh_dir("errors");
    // A compiler that rejects its flags: the error carries stderr and kernel names.
    let mut flags = tilec_cpu::default_flags();
    flags.push("-fno-such-flag-for-tilec".into());
    let c = Compiler::new(CompileOptions {
        cache_dir: Some(dir.clone()),
        flags,
        jobs: 1,
        ..CompileOptions::default()
    });
    match c.compile(&[scale_kernel("badflags", 8, 1.0)]) {
        Err(CompileError::Cc {
            kernels, stderr, ..
        }) => {
            assert_eq!(kernels, vec!["badflags".to_string()]);
            assert!(stderr.contains("no-such-flag"), "{stderr}");
        }
        other => panic!("expected a compiler error, got {other:?}"),
    }
    // No compiler at all.
    let c = Compiler::new(CompileOptions {
        cache_dir: Some(dir.clone()),
        cc: "/nonexistent/cc".into(),
        ..CompileOptions::default()
    });
    assert!(matches!(
        c.compile(&[scale_kernel("nocc", 8, 1.0)]),
        Err(CompileError::NoCompiler { .. })
    ));
    // Malformed kernels are render errors naming the kernel.
    let mut k = scale_kernel("badrank", 8, 1.0);
    if let Stmt::For(l) = &mut k.body[0] {
        if let Stmt::Store { index, .. } = &mut l.body[0] {
            index.push(Expr::Int(0));
        }
    }
    let c = compiler();
    let e = c.compile(&[k]).unwrap_err().to_string();
    assert!(e.contains("badrank") && e.contains("rank"), "{e}");
    let mut k = scale_kernel("unbound", 8, 1.0);
    let ghost = k.new_var("ghost", Ty::Elem(DType::F32), false);
    k.body
        .push(Stmt::store(BufId(1), vec![Expr::Int(0)], v(ghost)));
    let e = c.compile(&[k]).unwrap_err().to_string();
    assert!(e.contains("unbound") && e.contains("ghost"), "{e}");
    // Duplicate names and wrong arguments are errors too.
    assert!(matches!(
        c.compile(&[scale_kernel("dup", 8, 1.0), scale_kernel("dup", 9, 1.0)]),
        Err(CompileError::DuplicateName(_))
    ));
    let m = c.compile(&[scale_kernel("ok", 8, 1.0)]).unwrap();
    let mut wrong = vec![
        tilec_ir::Tensor::zeros(DType::F32, vec![8]),
        tilec_ir::Tensor::zeros(DType::F64, vec![8]),
    ];
    assert!(m
        .run("ok", &mut wrong)
        .unwrap_err()
        .to_string()
        .contains("argument 1"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn render_c_is_a_complete_unit() {
    let k = scale_kernel("my.kernel", 16, 2.0);
    let src = tilec_cpu::render_c(&k).unwrap();
    assert!(src.contains("void my_kernel(void *const *args)"), "{src}");
    assert!(src.contains("#pragma omp simd"));
    assert!(src.contains("tilec_set_threads"));
}

#[test]
fn thread_count_is_settable() {
    let mut k = Kernel::new("tid");
    let out = k.param("out", DType::I32, vec![64]);
    let i = k.index_var("i");
    k.body.push(Stmt::For(Loop {
        var: i,
        extent: 64,
        kind: LoopKind::Parallel,
        body: vec![Stmt::store(out, vec![v(i)], Expr::cast(DType::I32, v(i)))],
    }));
    let m = compiler().compile(&[k.clone()]).unwrap();
    for n in [1, 2, 3] {
        m.set_threads(n);
        let mut args = vec![poisoned(DType::I32, &[64])];
        m.run("tid", &mut args).unwrap();
        assert_eq!(args[0].to_i64_vec(), (0..64).collect::<Vec<i64>>());
    }
}
