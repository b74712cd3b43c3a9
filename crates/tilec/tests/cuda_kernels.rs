//! Every kernel the CUDA path produces for the light models, the transformer exports and a
//! sample of the conformance cases gets a GPU schedule, renders, and (when NVRTC is present)
//! compiles; scheduled kernels small enough for the tile interpreter compute what the lowered
//! ones do on fresh random inputs with poisoned outputs. Without a GPU the executor fails with
//! a clear message; with one it matches the reference interpreter.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use tilec::compiled_cuda::{prepare, CudaOptions, Prepared};
use tilec::cuda::GpuTarget;
use tilec::{ImportOptions, Tensor};
use tilec_tile::{interp, Kernel, Stmt};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Statements the interpreter would execute, roughly.
fn cost(stmts: &[Stmt]) -> f64 {
    stmts
        .iter()
        .map(|s| match s {
            Stmt::For(l) => l.extent as f64 * (1.0 + cost(&l.body)),
            Stmt::If { then_, else_, .. } => 1.0 + cost(then_).max(cost(else_)),
            Stmt::Gemm(g) => (g.batch * g.m * g.n) as f64 * (g.k as f64 + cost(&g.epilogue)),
            _ => 1.0,
        })
        .sum()
}

fn stored(k: &Kernel) -> HashSet<tilec_tile::BufId> {
    let mut out = HashSet::new();
    for s in &k.body {
        s.visit(&mut |s| {
            if let Stmt::Store { buf, .. } = s {
                out.insert(*buf);
            }
        });
    }
    out
}

fn random_args(k: &Kernel, seed: u64) -> Vec<Tensor> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let outs = stored(k);
    k.params
        .iter()
        .map(|&b| {
            let buf = k.buf(b);
            let shape: Vec<usize> = buf.shape.iter().map(|&d| d as usize).collect();
            let n: usize = shape.iter().product();
            let vals: Vec<f64> = if outs.contains(&b) {
                vec![if buf.dtype.is_float() { f64::NAN } else { 91.0 }; n]
            } else if buf.dtype.is_float() {
                (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect()
            } else if buf.dtype.is_bool() {
                (0..n).map(|_| rng.gen_range(0..2) as f64).collect()
            } else {
                (0..n).map(|_| rng.gen_range(0..2) as f64).collect()
            };
            Tensor::from_f64s(buf.dtype, shape, &vals).unwrap()
        })
        .collect()
}

#[derive(Default, Debug)]
struct Tally {
    kernels: usize,
    interp_checked: usize,
    too_large: usize,
    bad_inputs: usize,
    host_nodes: usize,
    schedules: HashMap<String, usize>,
}

const MAX_COST: f64 = 4e6;

/// Checks every kernel of a prepared model; returns the failures.
fn check_prepared(what: &str, p: &Prepared, tally: &mut Tally, modules: &mut Vec<(String, String)>) -> Vec<String> {
    let mut fails = vec![];
    tally.host_nodes += p.report.fallbacks.len();
    for (ki, k) in p.kernels().iter().enumerate() {
        tally.kernels += 1;
        if std::env::var_os("TILEC_DUMP_SCHEDULE").is_some_and(|v| v.to_string_lossy() == k.schedule) {
            eprintln!("{what} {}:\n{}\n{}", k.name, k.lowered, k.scheduled);
        }
        *tally.schedules.entry(k.schedule.to_string()).or_default() += 1;
        // A library kernel (cuBLAS) has no source to compile.
        if !k.source.source.is_empty() {
            modules.push((format!("{what}_{}", k.name).replace(|c: char| !c.is_ascii_alphanumeric(), "_"), k.source.source.clone()));
        }
        if cost(&k.lowered.body) > MAX_COST || cost(&k.scheduled.body) > 2.0 * MAX_COST {
            tally.too_large += 1;
            continue;
        }
        let args = random_args(&k.lowered, 5 + ki as u64);
        let mut a = args.clone();
        // Random indices out of range for a gather: both kernels must report it (and clamp).
        let lowered = interp::run(&k.lowered, &mut a);
        if lowered.as_ref().is_err_and(|e| !matches!(e, interp::InterpError::Index { .. })) {
            tally.bad_inputs += 1;
            continue;
        }
        let mut b = args.clone();
        match interp::run(&k.scheduled, &mut b) {
            Err(interp::InterpError::Index { .. }) if lowered.is_err() => {}
            Ok(()) if lowered.is_ok() => {}
            Ok(()) => {
                fails.push(format!("{what} {} ({}): the scheduled kernel misses an index violation", k.name, k.schedule));
                continue;
            }
            Err(e) => {
                fails.push(format!("{what} {} ({}): scheduled kernel fails: {e}", k.name, k.schedule));
                continue;
            }
        }
        tally.interp_checked += 1;
        let outs = stored(&k.lowered);
        for (i, &pb) in k.lowered.params.iter().enumerate() {
            if !outs.contains(&pb) {
                continue;
            }
            let (x, y) = (a[i].to_f64_vec(), b[i].to_f64_vec());
            let tol = match k.lowered.buf(pb).dtype {
                tilec::DType::F16 | tilec::DType::BF16 => 2e-2,
                d if d.is_float() => 1e-4,
                _ => 0.0,
            };
            for (j, (p, q)) in x.iter().zip(&y).enumerate() {
                let ok = (p.is_nan() && q.is_nan()) || p == q || (p - q).abs() <= tol * (1.0 + p.abs());
                if !ok {
                    fails.push(format!(
                        "{what} {} ({}): output {i} element {j}: lowered {p}, scheduled {q}",
                        k.name, k.schedule
                    ));
                    break;
                }
            }
        }
    }
    fails
}

fn compile_all(modules: &[(String, String)]) -> Vec<String> {
    let nv = match tilec::cuda::Nvrtc::load() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("note: NVRTC compile skipped: {e} (set TILEC_NVRTC_LIB to a libnvrtc.so)");
            return vec![];
        }
    };
    let c = tilec::cuda::Compiler::new(nv, "sm_90a");
    let mut fails = vec![];
    for ((name, _), r) in modules.iter().zip(c.compile_many(modules)) {
        match r {
            Ok(r) if r.image.starts_with(b"\x7fELF") => {}
            Ok(_) => fails.push(format!("{name}: NVRTC output is not a cubin")),
            Err(e) => fails.push(format!("{name}: {}", e.to_string().chars().take(600).collect::<String>())),
        }
    }
    fails
}

fn model_graph(dir: &Path, dims: &[(&str, usize)]) -> tilec::Graph {
    let opts = ImportOptions {
        dim_values: dims.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        ..Default::default()
    };
    tilec::load(&dir.join("model.onnx"), &opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

fn run_models(dirs: Vec<(String, PathBuf, Vec<(&'static str, usize)>)>) {
    if dirs.is_empty() {
        eprintln!("note: no models found (run scripts/setup-venv.sh)");
        return;
    }
    // TILEC_CUDA_TEST_MODELS=a,b restricts the run to those models.
    let only: Option<Vec<String>> = std::env::var("TILEC_CUDA_TEST_MODELS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let dirs: Vec<_> = dirs
        .into_iter()
        .filter(|(n, _, _)| only.as_ref().is_none_or(|o| o.contains(n)))
        .collect();
    let target = GpuTarget::hopper();
    let mut fails = vec![];
    let mut modules = vec![];
    for (name, dir, dims) in dirs {
        let g = model_graph(&dir, &dims);
        let p = prepare(&g, &CudaOptions::default(), &target).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!p.interpreted(), "{name}: runs on the interpreter as a whole");
        let mut t = Tally::default();
        let mut m = vec![];
        fails.extend(check_prepared(&name, &p, &mut t, &mut m));
        let n = m.len();
        let cfails = compile_all(&m);
        eprintln!(
            "{name}: {} kernels {:?}, {} host nodes, interpreter-checked {} (too large {}, input-dependent {}), NVRTC {}/{n}",
            t.kernels,
            t.schedules,
            t.host_nodes,
            t.interp_checked,
            t.too_large,
            t.bad_inputs,
            n - cfails.len()
        );
        let mut why: Vec<String> = p.report.fallbacks.iter().map(|(op, e)| format!("{op}: {e}")).collect();
        why.sort();
        why.dedup();
        for w in why.iter().take(5) {
            eprintln!("  host fallback: {}", w.chars().take(200).collect::<String>());
        }
        fails.extend(cfails);
        modules.extend(m);
    }
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}

#[test]
fn light_model_kernels_schedule_render_compile_and_match() {
    let base = root().join("testdata/gen/light");
    let mut dirs = vec![];
    if let Ok(rd) = std::fs::read_dir(&base) {
        for e in rd.flatten() {
            if e.path().join("model.onnx").is_file() {
                dirs.push((e.file_name().to_string_lossy().into_owned(), e.path(), vec![]));
            }
        }
    }
    dirs.sort();
    run_models(dirs);
}

#[test]
fn export_kernels_schedule_render_compile_and_match() {
    let mut dirs = vec![];
    for m in ["gpt2", "bert", "llama"] {
        let d = root().join("models").join(m);
        if d.join("model.onnx").is_file() {
            dirs.push((m.to_string(), d, vec![("batch", 2), ("seq", 16)]));
        }
    }
    run_models(dirs);
}

#[test]
fn conformance_sample_kernels_schedule_and_match() {
    let base = root().join("testdata/gen/node");
    let Ok(rd) = std::fs::read_dir(&base) else {
        eprintln!("note: no conformance cases (run scripts/setup-venv.sh)");
        return;
    };
    let mut cases: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.join("model.onnx").is_file()).collect();
    cases.sort();
    let target = GpuTarget::hopper();
    let mut t = Tally::default();
    let mut fails = vec![];
    let mut modules = vec![];
    let mut models = 0;
    // Every seventh case: a spread over the op families.
    for dir in cases.iter().step_by(7) {
        let Ok(g) = tilec::load(&dir.join("model.onnx"), &ImportOptions::default()) else { continue };
        let Ok(p) = prepare(&g, &CudaOptions::default(), &target) else { continue };
        if p.interpreted() {
            continue;
        }
        models += 1;
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        fails.extend(check_prepared(&name, &p, &mut t, &mut modules));
    }
    let n = modules.len();
    fails.extend(compile_all(&modules));
    eprintln!(
        "conformance sample: {models} cases, {} kernels {:?}, {} host nodes, interpreter-checked {}, NVRTC checked {n}",
        t.kernels, t.schedules, t.host_nodes, t.interp_checked
    );
    assert!(models > 50, "only {models} cases prepared");
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}

#[test]
fn the_cuda_executor_fails_cleanly_without_a_gpu_and_matches_the_reference_with_one() {
    let dir = root().join("models/gpt2");
    if !dir.join("model.onnx").is_file() {
        eprintln!("note: models/gpt2 missing");
        return;
    }
    let g = model_graph(&dir, &[("batch", 1), ("seq", 8)]);
    let r = tilec::compiled_cuda::compile(&g, &CudaOptions::default());
    if !tilec::cuda::is_available() {
        let e = r.err().expect("compiling for CUDA without a GPU must fail").to_string();
        assert!(e.contains("no CUDA GPU") || e.contains("NVRTC"), "{e}");
        return;
    }
    let mut c = r.unwrap_or_else(|e| panic!("{e}"));
    c.check_plan().unwrap();
    let ids: Vec<i64> = (0..8).map(|i| (i * 37 % 1000) as i64).collect();
    let x = Tensor::from_vec(vec![1, 8], ids).unwrap();
    let want = tilec::reference::run(&g, vec![x.clone()]).unwrap();
    c.poison().unwrap();
    let got = c.run(&[x]).unwrap();
    for (w, gt) in want.iter().zip(&got) {
        let c = tilec::compare::compare(w, gt, 1e-3, 1e-4).unwrap();
        assert!(c.ok(), "max abs err {}, {} mismatches", c.max_abs, c.mismatches);
    }
}

/// A profiled run on the GPU times every kernel on the device's clock (a graph replayed with
/// an event between kernels): one span per kernel per run, in launch order without overlap,
/// each with its launch shape and registers, and a profiled run still computes the model.
#[test]
fn cuda_profiles_time_each_kernel_on_the_device() {
    let dir = root().join("models/gpt2");
    if !dir.join("model.onnx").is_file() || !tilec::cuda::is_available() {
        eprintln!("note: needs models/gpt2 and a CUDA GPU");
        return;
    }
    let g = model_graph(&dir, &[("batch", 2), ("seq", 16)]);
    let mut c = tilec::compiled_cuda::compile(&g, &CudaOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<i64> = (0..32).map(|i| (i * 53 % 1000) as i64).collect();
    let x = Tensor::from_vec(vec![2, 16], ids).unwrap();
    let want = tilec::reference::run(&g, vec![x.clone()]).unwrap();
    let mut p = tilec::runtime::Profile::default();
    c.poison().unwrap();
    let got = c.run_profiled(&[x.clone()], Some(&mut p)).unwrap();
    c.run_profiled(&[x.clone()], Some(&mut p)).unwrap();
    for (w, gt) in want.iter().zip(&got) {
        let d = tilec::compare::compare(w, gt, 1e-3, 1e-4).unwrap();
        assert!(d.ok(), "profiled run: max abs err {}, {} mismatches", d.max_abs, d.mismatches);
    }
    let kernels = c.report.kernels;
    assert_eq!(p.spans.len(), 2 * kernels, "{} spans for {kernels} kernels x 2 runs", p.spans.len());
    assert!(p.kernels.iter().all(|k| k.calls == 2 && k.total_ns > 0), "{:?}", p.kernels);
    assert!(p.kernels.iter().all(|k| k.detail.contains("grid ") && (k.detail.contains(" regs") || k.detail.contains("library"))), "{:?}", p.kernels);
    for run in p.spans.chunks(kernels) {
        for w in run.windows(2) {
            assert!(w[1].start_ns >= w[0].start_ns + w[0].dur_ns, "{w:?}");
        }
    }
    // Device time, not launches from the host: the kernels of a run take less than the run
    // does when launched kernel by kernel and waited for.
    let device: u64 = p.spans[..kernels].iter().map(|s| s.dur_ns).sum();
    c.set_use_graphs(false);
    let t = std::time::Instant::now();
    c.run(&[x]).unwrap();
    assert!((device as u128) < t.elapsed().as_nanos(), "{device} ns on the device");
}
