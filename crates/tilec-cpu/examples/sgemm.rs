//! Square SGEMM throughput of the generated GEMM template.
//!
//! ```text
//! cargo run --release -p tilec-cpu --example sgemm -- [--threads N] [--sizes 256,512,...]
//!     [--json] [--numpy PYTHON]   # also time numpy.matmul with that interpreter
//!     [--params mr,nr,kc,mc,nc]   # fixed blocking instead of `gemm_params`
//!     [--rounds R]                # rounds alternating numpy and tilec (default 3)
//! ```

use std::ffi::c_void;
use std::time::Instant;

use tilec_cpu::{gemm_params, CompileOptions, Compiler, CpuInfo};
use tilec_ir::DType;
use tilec_tile::ir::*;

fn sgemm_kernel(n: i64, cpu: &CpuInfo, fixed: Option<GemmParams>) -> Kernel {
    let mut k = Kernel::new(format!("sgemm{n}"));
    let a = k.param("a", DType::F32, vec![n, n]);
    let b = k.param("b", DType::F32, vec![n, n]);
    let c = k.param("c", DType::F32, vec![n, n]);
    let (vb, vi, vj, vk) = (
        k.index_var("b"),
        k.index_var("i"),
        k.index_var("j"),
        k.index_var("k"),
    );
    let acc = k.new_var("acc", Ty::Elem(DType::F32), false);
    k.body.push(Stmt::Gemm(Box::new(Gemm {
        batch: 1,
        m: n,
        n,
        k: n,
        b_var: vb,
        i_var: vi,
        j_var: vj,
        k_var: vk,
        acc_var: acc,
        acc_dtype: DType::F32,
        a: Expr::load(a, vec![Expr::Var(vi), Expr::Var(vk)]),
        b: Expr::load(b, vec![Expr::Var(vk), Expr::Var(vj)]),
        epilogue: vec![Stmt::store(
            c,
            vec![Expr::Var(vi), Expr::Var(vj)],
            Expr::Var(acc),
        )],
        params: fixed.unwrap_or_else(|| gemm_params(n, n, n, cpu)),
        vector: false,
    })));
    k
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

const NUMPY_SCRIPT: &str = r#"
import sys, time, json
import numpy as np
res = {}
for n in [int(x) for x in sys.argv[1].split(",")]:
    a = np.random.rand(n, n).astype(np.float32); b = np.random.rand(n, n).astype(np.float32)
    c = np.matmul(a, b)
    reps = max(5, min(50, int(4e10 / (2 * n**3))))
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); np.matmul(a, b, out=c); ts.append(time.perf_counter() - t)
    ts.sort()
    res[str(n)] = 2 * n**3 / ts[len(ts) // 2] / 1e9
print(json.dumps(res))
"#;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut threads = 2usize;
    let mut sizes: Vec<i64> = vec![256, 512, 1024, 2048, 4096];
    let mut json = false;
    let mut python: Option<String> = None;
    let mut fixed: Option<GemmParams> = None;
    let mut rounds = 3usize;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--threads" => {
                i += 1;
                threads = args.get(i).and_then(|s| s.parse().ok()).unwrap_or(2);
            }
            "--sizes" => {
                i += 1;
                sizes = args
                    .get(i)
                    .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
                    .unwrap_or_default();
            }
            "--json" => json = true,
            "--rounds" => {
                i += 1;
                rounds = args.get(i).and_then(|s| s.parse().ok()).unwrap_or(3).max(1);
            }
            "--params" => {
                i += 1;
                let v: Vec<i64> = args
                    .get(i)
                    .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
                    .unwrap_or_default();
                if v.len() != 5 {
                    eprintln!("--params takes mr,nr,kc,mc,nc");
                    std::process::exit(2);
                }
                fixed = Some(GemmParams {
                    mr: v[0],
                    nr: v[1],
                    kc: v[2],
                    mc: v[3],
                    nc: v[4],
                });
            }
            "--numpy" => {
                i += 1;
                python = args.get(i).cloned();
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let opts = CompileOptions::default();
    let cpu = opts.cpu.clone();
    let compiler = Compiler::new(opts);
    let kernels: Vec<Kernel> = sizes
        .iter()
        .map(|&n| sgemm_kernel(n, &cpu, fixed))
        .collect();
    let module = match compiler.compile(&kernels) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    module.set_threads(threads);
    let run_numpy = || -> Option<serde_like::Map> {
        let py = python.as_ref()?;
        let list = sizes
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let out = std::process::Command::new(py)
            .arg("-c")
            .arg(NUMPY_SCRIPT)
            .arg(&list)
            .env("OPENBLAS_NUM_THREADS", threads.to_string())
            .env("OMP_NUM_THREADS", threads.to_string())
            .output()
            .ok()?;
        serde_like::parse(&String::from_utf8_lossy(&out.stdout))
    };
    // Buffers per size.
    let mut bufs: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = sizes
        .iter()
        .map(|&n| {
            let nn = (n * n) as usize;
            let a = (0..nn)
                .map(|x| ((x * 7919 % 1000) as f32) / 1000.0 - 0.5)
                .collect();
            let b = (0..nn)
                .map(|x| ((x * 104729 % 1000) as f32) / 1000.0 - 0.5)
                .collect();
            (a, b, vec![0f32; nn])
        })
        .collect();
    // Rounds alternate numpy and tilec so both see the same machine load; each figure is the
    // median over rounds of per-round medians.
    let mut ours: Vec<Vec<f64>> = vec![vec![]; sizes.len()];
    let mut theirs: Vec<Vec<f64>> = vec![vec![]; sizes.len()];
    for _round in 0..rounds {
        if let Some(m) = run_numpy() {
            for (idx, n) in sizes.iter().enumerate() {
                if let Some(x) = m.get(&n.to_string()) {
                    theirs[idx].push(*x);
                }
            }
        }
        for (idx, (k, &n)) in kernels.iter().zip(&sizes).enumerate() {
            let f = module.get(&k.name).expect("compiled kernel");
            let (a, b, c) = &mut bufs[idx];
            let ptrs = [
                a.as_mut_ptr() as *mut c_void,
                b.as_mut_ptr() as *mut c_void,
                c.as_mut_ptr() as *mut c_void,
            ];
            let flops = 2.0 * (n as f64).powi(3);
            let reps = ((4e10 / flops) as usize).clamp(5, 50);
            // SAFETY: the three buffers hold n*n f32 each, as the kernel expects.
            unsafe { f(ptrs.as_ptr()) };
            let times: Vec<f64> = (0..reps)
                .map(|_| {
                    let t = Instant::now();
                    unsafe { f(ptrs.as_ptr()) };
                    t.elapsed().as_secs_f64()
                })
                .collect();
            ours[idx].push(flops / median(times) / 1e9);
        }
    }
    let rows: Vec<(i64, f64, Option<f64>)> = sizes
        .iter()
        .enumerate()
        .map(|(idx, &n)| {
            (
                n,
                median(ours[idx].clone()),
                if theirs[idx].is_empty() {
                    None
                } else {
                    Some(median(theirs[idx].clone()))
                },
            )
        })
        .collect();
    if json {
        let items: Vec<String> = rows
            .iter()
            .map(|(n, g, np)| match np {
                Some(x) => format!("{{\"n\": {n}, \"tilec_gflops\": {g:.2}, \"numpy_gflops\": {x:.2}, \"ratio\": {:.3}}}", g / x),
                None => format!("{{\"n\": {n}, \"tilec_gflops\": {g:.2}}}"),
            })
            .collect();
        println!(
            "{{\"threads\": {threads}, \"results\": [{}]}}",
            items.join(", ")
        );
    } else {
        println!("SGEMM, {threads} threads (median GFLOP/s)");
        for (n, g, np) in rows {
            match np {
                Some(x) => println!("{n:>6}  tilec {g:8.1}   numpy {x:8.1}   ratio {:.2}", g / x),
                None => println!("{n:>6}  tilec {g:8.1}"),
            }
        }
    }
}

/// A tiny parser for the flat `{"n": x, ...}` object the numpy script prints.
mod serde_like {
    pub type Map = std::collections::HashMap<String, f64>;
    pub fn parse(s: &str) -> Option<Map> {
        let s = s.trim().strip_prefix('{')?.strip_suffix('}')?;
        let mut m = Map::new();
        for item in s.split(',') {
            let (k, v) = item.split_once(':')?;
            m.insert(
                k.trim().trim_matches('"').to_string(),
                v.trim().parse().ok()?,
            );
        }
        Some(m)
    }
}
