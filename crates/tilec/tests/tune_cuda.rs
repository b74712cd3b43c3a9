//! Tuning on CUDA. Without a GPU: the GPU context's keying (entries of another GPU, compute
//! capability or NVRTC are ignored with a note), the tensor-core GEMM families' spaces pruned
//! by their constraints before anything is built and ordered by their cost models, and the
//! command line's argument errors. On a GPU (skipped with a note without one): a small 16-bit
//! GEMM model tuned within a few seconds, its entries stored, a second compile taking them
//! (origin `tuned`) and still matching the interpreter; the same through the binary (`tune
//! --target cuda`, `explain`, `run --compare-ref`, `--no-tuning`).

use std::sync::Arc;
use std::time::Duration;

use tilec::compiled_cuda::{family_target, CudaOptions};
use tilec::cuda::GpuTarget;
use tilec::tune::{cuda_context, tune_model_cuda, Timing, TuneOptions};
use tilec::tuner::{Candidates, Db, Measurer, Outcome, Record, SearchOptions, Tuning};
use tilec_ir::op::{BinaryOp, LinalgOp, UnaryOp};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType, ValueId};
use tilec_tile::family::{ParamOrigin, Params, Problem, Tuned};

mod common;
use common::*;

fn konst(g: &mut Graph, name: &str, d: DType, shape: &[usize]) -> ValueId {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n).map(|i| ((i * 7919) % 997) as f64 / 997.0 - 0.5).collect();
    g.add_const(name, Tensor::from_f64s(d, shape.to_vec(), &vals).unwrap())
}

/// `gelu(x @ w + b)` over `d`, x `[m, k]`, w `[k, n]`.
fn linear(d: DType, m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("linear");
    let x = g.add_input("x", TensorType::fixed(d, &[m, k]));
    let w = konst(&mut g, "w", d, &[k, n]);
    let b = konst(&mut g, "b", d, &[n]);
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
    let y = g.add(Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
    let y = g.add(Op::Unary(UnaryOp::Gelu { tanh_approx: false }), &[y]).unwrap();
    g.set_outputs(vec![y]);
    g
}

/// The H200's context as `tune --target cuda` writes it.
fn h200() -> tilec::tuner::Context {
    cuda_context("NVIDIA H200", (9, 0), 132, 13000, (13, 0))
}

#[test]
fn cuda_context_keys_entries_by_gpu_capability_and_compiler() {
    let dir = scratch("tune_cuda_context");
    let db = Db::open(&dir.join("tuning.sqlite")).unwrap();
    let g = linear(DType::BF16, 256, 768, 512);
    let p = Problem::of_node(&g, g.node_ids().next().unwrap(), "k0");
    let key = tilec::tuner::problem_key(&p);
    let ctx = h200();
    assert_eq!(ctx.capability, "sm_90, 132 SMs");
    assert_eq!(ctx.compiler, "CUDA driver 13.0, NVRTC 13.0");
    assert!(ctx.tilec_version.ends_with(tilec::cuda::FORMAT_VERSION), "{}", ctx.tilec_version);
    let mut rec = Record::new(&key, "sm90_tc_gemm", &ctx, vec![("tile_n".into(), 128)]);
    rec.default_ns = 20_000.0;
    rec.tuned_ns = 15_000.0;
    db.put(&rec).unwrap();
    // The same GPU and software: found.
    let same = Tuning { db, ctx: h200() };
    let hit = same.lookup("sm90_tc_gemm", &p).expect("the entry holds for this GPU");
    assert_eq!(hit.values, vec![("tile_n".to_string(), 128)]);
    assert!(hit.matched.contains("for this shape"), "{}", hit.matched);
    let db = same.db;
    // Another compute capability (an A100), another SM count, another NVRTC: not used.
    for (other, why) in [
        (cuda_context("NVIDIA A100-SXM4-80GB", (8, 0), 108, 13000, (13, 0)), "foreign"),
        (cuda_context("NVIDIA H200", (9, 0), 114, 13000, (13, 0)), "foreign"),
        (cuda_context("NVIDIA H200", (9, 0), 132, 13000, (12, 8)), "stale"),
    ] {
        let t = Tuning { db: Db::open(&dir.join("tuning.sqlite")).unwrap(), ctx: other };
        assert!(t.lookup("sm90_tc_gemm", &p).is_none());
        assert!(t.db.notes().iter().any(|n| n.contains(why)), "{:?}", t.db.notes());
    }
    drop(db);
}

/// Records every point it is handed and builds it; times come from a fixed order.
struct Recording<'a> {
    p: &'a Problem<'a>,
    f: tilec_tile::family::FamilyRef<tilec_opt::target::Target, tilec::cuda::families::GpuBuilt>,
    t: &'a tilec_opt::target::Target,
    built: Vec<Params>,
}

impl Measurer for Recording<'_> {
    fn measure(&mut self, batch: &[Params]) -> Vec<Outcome> {
        batch
            .iter()
            .map(|q| {
                self.built.push(q.clone());
                match self.f.build(self.p, self.t, q) {
                    Ok(_) => Outcome::Time { median_ns: 1000.0 + self.built.len() as f64, runs: 1 },
                    Err(e) => Outcome::Failed(e),
                }
            })
            .collect()
    }
}

fn check_pruned(family: &str, g: &Graph, at_least_pruned: usize) -> Candidates {
    let p = Problem::of_node(g, g.node_ids().next().unwrap(), "k0");
    let t = family_target(&CudaOptions::default(), &GpuTarget::hopper());
    let f = tilec::cuda::families::registry().get(family).unwrap();
    f.applies(&p, &t).unwrap_or_else(|e| panic!("{family}: {e}"));
    let cands = tilec::tuner::candidates(f, &p, &t);
    assert!(cands.pruned.len() >= at_least_pruned, "{family}: {} pruned of {}", cands.pruned.len(), cands.space);
    assert!(!cands.list.is_empty());
    eprintln!(
        "{family}: {} points, {} pruned, {} candidates; heuristic {}, next {}",
        cands.space,
        cands.pruned.len(),
        cands.list.len(),
        cands.list[0].params,
        cands.list.get(1).map_or(String::new(), |c| c.params.to_string())
    );
    assert!(cands.list[0].heuristic, "{family}: the heuristic goes first");
    assert!(cands.modeled && cands.list.iter().all(|c| c.estimate.is_some()), "{family}: ordered by its cost model");
    for (q, _) in &cands.pruned {
        assert!(f.check(&p, &t, q).is_err(), "{family}: {q} pruned but valid");
    }
    // The search hands the measurer only points that pass the constraints, best-first.
    let mut m = Recording { p: &p, f, t: &t, built: vec![] };
    let so = SearchOptions { max_candidates: 12, budget: Duration::from_secs(60), batch: 4, confirm_rounds: 1 };
    let r = tilec::tuner::search(&cands, &mut m, &so, &mut |_| {});
    assert!(m.built.len() >= 12, "{family}: {} built", m.built.len());
    for q in &m.built {
        f.check(&p, &t, q).unwrap_or_else(|e| panic!("{family}: {q} built but refused: {e}"));
    }
    assert_eq!(r.failed(), 0, "{family}: {:?}", r.measured);
    let est: Vec<f64> = cands.list[1..].iter().map(|c| c.estimate.unwrap()).collect();
    assert!(est.windows(2).all(|w| w[0] <= w[1]), "{family}: not ordered by estimate");
    cands
}

#[test]
fn tensor_core_gemm_spaces_are_pruned_before_anything_is_built() {
    // GPT-2 small's MLP product at 512 tokens.
    let g = linear(DType::BF16, 512, 768, 3072);
    let c = check_pruned("sm90_tc_gemm", &g, 1);
    // Every stage count that overflows shared memory on 128x256 tiles is pruned.
    assert!(c.pruned.iter().any(|(q, _)| q.get("tile_n") == Some(256) && q.get("stages") == Some(8)));
    // The mma.sync family on a skinny product with long K (split-K in its space).
    let g = linear(DType::F16, 64, 4096, 1024);
    let c = check_pruned("sm80_mma_gemm", &g, 1000);
    assert!(c.list.iter().take(12).any(|x| x.params.get("split_k").unwrap_or(1) > 1), "split-K ranks early on a skinny product");
}

#[test]
fn tune_cuda_argument_errors_are_clear() {
    let dir = scratch("tune_cuda_args");
    let m = save(&dir, "id.onnx", &identity_model());
    let m = m.to_str().unwrap();
    let db = dir.join("db.sqlite");
    let t = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tilec"))
            .args(args)
            .env("TILEC_TUNING_DB", &db)
            .output()
            .expect("the tilec binary runs");
        let o = Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
        o
    };
    t(&["tune", m, "--target", "cuda", "--threads", "2"]).fails_with(&["--threads", "--target cuda"]);
    t(&["tune", m, "--device", "1"]).fails_with(&["--device", "needs --target cuda"]);
    t(&["tune", m, "--allow-tf32"]).fails_with(&["--allow-tf32", "needs --target cuda"]);
    t(&["tune", m, "--target", "gpu"]).fails_with(&["gpu"]);
    if !tilec::cuda::is_available() {
        // No GPU: a clear error, nothing written.
        t(&["tune", m, "--target", "cuda", "--budget", "1"]).fails_with(&["no CUDA GPU"]);
    }
}

/// `relu(x @ w + b)` in f16 as an ONNX file, x `[256, 512]`, w `[512, 384]`.
fn f16_gemm_model(dir: &std::path::Path) -> std::path::PathBuf {
    let konst = |name: &str, shape: &[usize]| {
        let n: usize = shape.iter().product();
        let vals: Vec<f64> = (0..n).map(|i| ((i * 7919) % 997) as f64 / 997.0 - 0.5).collect();
        tilec_onnx::tensor::tensor_to_proto(name, &Tensor::from_f64s(DType::F16, shape.to_vec(), &vals).unwrap())
    };
    let mut m = model(
        vec![
            node("mm", "MatMul", &["x", "w"], &["p"]),
            node("bias", "Add", &["p", "b"], &["q"]),
            node("relu", "Relu", &["q"], &["y"]),
        ],
        vec![vi("x", F16, &[D::N(256), D::N(512)])],
        vec![vi("y", F16, &[D::N(256), D::N(384)])],
    );
    let g = m.graph.as_mut().unwrap();
    g.initializer = vec![konst("w", &[512, 384]), konst("b", &[384])];
    save(dir, "gemm_f16.onnx", &m)
}

#[test]
fn tuning_on_the_gpu_stores_entries_that_the_next_compile_takes() {
    if !tilec::cuda::is_available() {
        eprintln!("note: no CUDA GPU; tuning on the GPU was not run");
        return;
    }
    let dir = scratch("tune_cuda_gpu");
    let db = Db::open(&dir.join("tuning.sqlite")).unwrap();
    let g = linear(DType::BF16, 512, 768, 2304);
    let opts = TuneOptions {
        budget: Duration::from_secs(5),
        max_candidates: 6,
        timing: Timing::gpu(),
        cuda: CudaOptions { cache_dir: Some(dir.join("kernels")), ..Default::default() },
        ..Default::default()
    };
    let (ctx, r) = tune_model_cuda(&g, &opts, &db, &mut |_| {}).unwrap();
    let gemm = r.problems.iter().find(|k| k.family == "sm90_tc_gemm" || k.family == "sm80_mma_gemm");
    let gemm = gemm.unwrap_or_else(|| panic!("no GEMM tuned: {:?}", r.problems));
    assert!(gemm.measured >= 2 && gemm.default_ns.is_some() && gemm.best.is_some(), "{gemm:?}");
    assert!(r.model_ms > 0.0);
    // Stored for this GPU; the next compile takes it.
    let tuning = Arc::new(Tuning { db, ctx });
    let copts = CudaOptions { cache_dir: Some(dir.join("kernels")), tuning: Some(tuning.clone()), ..Default::default() };
    let mut c = tilec::compiled_cuda::compile(&g, &copts).unwrap();
    let (_, d) = c.report.decisions.iter().find(|(_, d)| d.family == gemm.family).expect("the GEMM kernel");
    assert_eq!(d.origin, ParamOrigin::Tuned, "{}", d.summary());
    let x = Tensor::from_f64s(DType::BF16, vec![512, 768], &(0..512 * 768).map(|i| ((i % 61) as f64 - 30.0) / 40.0).collect::<Vec<_>>()).unwrap();
    let got = c.run(std::slice::from_ref(&x)).unwrap();
    let want = tilec::reference::run(&g, vec![x]).unwrap();
    let cmp = tilec::compare::compare(&want[0], &got[0], 3e-2, 3e-2).unwrap();
    assert!(cmp.ok(), "tuned kernel differs from the interpreter: {cmp:?}");
}

#[test]
fn tune_explain_and_run_on_the_gpu_through_the_binary() {
    if !tilec::cuda::is_available() {
        eprintln!("note: no CUDA GPU; `tilec tune --target cuda` was not run");
        return;
    }
    let dir = scratch("tune_cuda_cli");
    let m = f16_gemm_model(&dir);
    let m = m.to_str().unwrap();
    let db = dir.join("tuning.sqlite");
    let t = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tilec"))
            .args(args)
            .env("TILEC_TUNING_DB", &db)
            .env("TILEC_CACHE_DIR", dir.join("kernels"))
            .output()
            .expect("the tilec binary runs");
        let o = Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
        o
    };
    let o = t(&["tune", m, "--target", "cuda", "--budget", "5", "--max-candidates", "4"]);
    o.ok();
    assert!(o.stdout.contains("speedup") && o.stdout.contains("_gemm"), "{}", o.stdout);
    let o = t(&["explain", m, "--target", "cuda"]);
    o.ok();
    assert!(o.stdout.contains("(tuned: "), "{}", o.stdout);
    let o = t(&["run", m, "--target", "cuda", "--compare-ref", "--rtol", "3e-2", "--atol", "3e-2"]);
    o.ok();
    assert!(o.stdout.contains("kernels with tuned parameters"), "{}", o.stdout);
    let o = t(&["explain", m, "--target", "cuda", "--no-tuning"]);
    o.ok();
    assert!(!o.stdout.contains("(tuned: "), "{}", o.stdout);
}
