//! Shared helpers: random inputs, poisoned outputs, the interpreter as oracle.
#![allow(dead_code)]

use std::collections::HashSet;
use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilec_cpu::{CompileOptions, Compiler, Module};
use tilec_ir::{DType, Tensor};
use tilec_tile::ir::*;

pub fn cache_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("tilec-cpu-{name}"))
}

/// Every parallel loop of a test kernel, however small, runs as a region (the tests' kernels
/// are small, and their parallel code is what they check).
pub fn compiler() -> Compiler {
    Compiler::new(CompileOptions {
        cache_dir: Some(cache_dir("shared")),
        loop_parallel_min_work: 0,
        ..CompileOptions::default()
    })
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed ^ 0x5eed_cafe)
}

/// Random values for `d`; floats include special values when `specials` is set.
pub fn random_tensor(r: &mut StdRng, d: DType, shape: &[i64], specials: bool) -> Tensor {
    let n: usize = shape.iter().product::<i64>() as usize;
    let shape: Vec<usize> = shape.iter().map(|&x| x as usize).collect();
    if d.is_float() {
        let sp = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            0.5,
            -2.5,
            1.5,
            2.5,
            1.0,
            -1.0,
        ];
        let v: Vec<f64> = (0..n)
            .map(|i| {
                if specials && i % 7 == 3 {
                    sp[(i / 7) % sp.len()]
                } else {
                    r.gen_range(-4.0..4.0)
                }
            })
            .collect();
        Tensor::from_f64s(d, shape, &v).unwrap()
    } else if d == DType::Bool {
        let v: Vec<i64> = (0..n).map(|_| r.gen_range(0..2)).collect();
        Tensor::from_i64s(d, shape, &v).unwrap()
    } else if d == DType::U64 {
        let v: Vec<u64> = (0..n).map(|_| r.gen()).collect();
        Tensor::from_vec(shape, v).unwrap()
    } else {
        let v: Vec<i64> = (0..n)
            .map(|_| match d {
                DType::I8 => r.gen::<i8>() as i64,
                DType::I16 => r.gen::<i16>() as i64,
                DType::I32 => r.gen::<i32>() as i64,
                DType::I64 => r.gen_range(-(1i64 << 40)..(1i64 << 40)),
                DType::U8 => r.gen::<u8>() as i64,
                DType::U16 => r.gen::<u16>() as i64,
                DType::U32 => r.gen::<u32>() as i64,
                _ => unreachable!(),
            })
            .collect();
        Tensor::from_i64s(d, shape, &v).unwrap()
    }
}

/// A tensor of `d` filled with garbage: NaN for floats, a fixed odd pattern for integers.
pub fn poisoned(d: DType, shape: &[i64]) -> Tensor {
    let n: usize = shape.iter().product::<i64>() as usize;
    let shape: Vec<usize> = shape.iter().map(|&x| x as usize).collect();
    if d.is_float() {
        Tensor::from_f64s(d, shape, &vec![f64::NAN; n]).unwrap()
    } else if d == DType::Bool {
        Tensor::from_i64s(d, shape, &vec![1; n]).unwrap()
    } else {
        Tensor::from_i64s(d, shape, &vec![0x5a5a_5a5a_5a5a_5a5a; n]).unwrap()
    }
}

pub fn written(k: &Kernel) -> HashSet<BufId> {
    let mut w = HashSet::new();
    for s in &k.body {
        s.visit(&mut |s| {
            if let Stmt::Store { buf, .. } = s {
                w.insert(*buf);
            }
        });
    }
    w
}

/// Random inputs for every parameter (written ones poisoned).
pub fn make_args(k: &Kernel, r: &mut StdRng, specials: bool) -> Vec<Tensor> {
    let w = written(k);
    k.params
        .iter()
        .map(|&p| {
            let b = k.buf(p);
            if w.contains(&p) {
                poisoned(b.dtype, &b.shape)
            } else {
                random_tensor(r, b.dtype, &b.shape, specials)
            }
        })
        .collect()
}

/// Tolerances for comparing a dtype's values.
#[derive(Copy, Clone, Debug)]
pub struct Tol {
    pub rel: f64,
    pub abs: f64,
}

pub fn exact() -> Tol {
    Tol { rel: 0.0, abs: 0.0 }
}

pub fn tol_for(d: DType) -> Tol {
    match d {
        DType::F64 => Tol {
            rel: 1e-12,
            abs: 1e-12,
        },
        DType::F32 => Tol {
            rel: 2e-6,
            abs: 1e-6,
        },
        DType::F16 => Tol {
            rel: 2e-3,
            abs: 1e-4,
        },
        DType::BF16 => Tol {
            rel: 1.6e-2,
            abs: 1e-3,
        },
        DType::F8E4M3 => Tol {
            rel: 0.13,
            abs: 0.02,
        },
        DType::F8E5M2 => Tol {
            rel: 0.26,
            abs: 0.002,
        },
        _ => exact(),
    }
}

/// Compares `got` with `want` element by element.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: Tol) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.numel(), want.numel(), "{what}: size");
    let d = got.dtype();
    if d.is_float() {
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        let mut bad = vec![];
        for i in 0..g.len() {
            let ok = if w[i].is_nan() {
                g[i].is_nan()
            } else if w[i].is_infinite() || g[i].is_infinite() {
                g[i] == w[i]
            } else {
                (g[i] - w[i]).abs() <= tol.abs + tol.rel * w[i].abs()
            };
            if !ok {
                bad.push(format!("[{i}] got {} want {}", g[i], w[i]));
            }
        }
        assert!(
            bad.is_empty(),
            "{what}: {} of {} differ: {}",
            bad.len(),
            g.len(),
            bad.iter().take(8).cloned().collect::<Vec<_>>().join(", ")
        );
    } else if d == DType::U64 {
        let (g, w) = (
            got.as_slice::<u64>().unwrap(),
            want.as_slice::<u64>().unwrap(),
        );
        let bad: Vec<String> = (0..g.len())
            .filter(|&i| g[i] != w[i])
            .take(8)
            .map(|i| format!("[{i}] got {} want {}", g[i], w[i]))
            .collect();
        assert!(bad.is_empty(), "{what}: {}", bad.join(", "));
    } else {
        let (g, w) = (got.to_i64_vec(), want.to_i64_vec());
        let bad: Vec<String> = (0..g.len())
            .filter(|&i| g[i] != w[i])
            .take(8)
            .map(|i| format!("[{i}] got {} want {}", g[i], w[i]))
            .collect();
        assert!(bad.is_empty(), "{what}: {}", bad.join(", "));
    }
}

/// Runs every kernel compiled and interpreted on the same random inputs and compares all
/// written parameters with `tol(dtype)`.
pub fn check_kernels(
    kernels: &[Kernel],
    seed: u64,
    specials: bool,
    tol: impl Fn(&Kernel, DType) -> Tol,
) -> Module {
    let m = compiler()
        .compile(kernels)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut r = rng(seed);
    for k in kernels {
        let args = make_args(k, &mut r, specials);
        let mut want = args.clone();
        tilec_tile::interp::run(k, &mut want).unwrap_or_else(|e| panic!("interpreter: {e}"));
        let mut got = args.clone();
        m.run(&k.name, &mut got).unwrap_or_else(|e| panic!("{e}"));
        let w = written(k);
        // Gemm operands packed ahead of the call: every subset of the slots.
        let slots = m.packs(&k.name).len().min(4);
        for mask in 1u32..(1 << slots) {
            let mut gotp = args.clone();
            m.run_prepacked(&k.name, &mut gotp, |i, _| mask >> i & 1 == 1)
                .unwrap_or_else(|e| panic!("{e}"));
            for (i, &p) in k.params.iter().enumerate() {
                let b = k.buf(p);
                let t = if w.contains(&p) { tol(k, b.dtype) } else { exact() };
                let exp = if w.contains(&p) { &want[i] } else { &args[i] };
                assert_close(
                    &format!("{} prepacked (slots {mask:b}) {}", k.name, b.name),
                    &gotp[i],
                    exp,
                    t,
                );
            }
        }
        for (i, &p) in k.params.iter().enumerate() {
            if w.contains(&p) {
                let b = k.buf(p);
                assert_close(
                    &format!("{} output {}", k.name, b.name),
                    &got[i],
                    &want[i],
                    tol(k, b.dtype),
                );
            } else {
                assert_close(
                    &format!("{} input {} untouched", k.name, k.buf(p).name),
                    &got[i],
                    &args[i],
                    exact(),
                );
            }
        }
    }
    m
}

pub fn v(x: VarId) -> Expr {
    Expr::Var(x)
}
