//! Differential execution: every ONNX node-test model and light model in `testdata/gen`
//! is imported (as the conformance suite does, binding shape operands), optimized with
//! the O3 pipeline (verification after every pass) and run on the reference interpreter
//! before and after, on the test's own inputs and on fresh random inputs of the same
//! dtypes and shapes; the light models also through the cuda pipeline (NHWC regions). Outputs must agree within the dtype's tolerance (bit-exact for
//! integers and bool).
//!
//! Light models run on their test inputs only unless `TILEC_DIFF_LIGHT_RANDOM=1` (each
//! reference run of a CNN takes seconds). `TILEC_DIFF_FILTER=substr` selects cases.

use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tilec_ir::op::LinalgOp;
use tilec_ir::{DType, Graph, Op, Tensor};
use tilec_onnx::{import_model, ImportError, ImportOptions};
use tilec_opt::manager::{PassReport, Pipeline, PipelineOptions};
use tilec_opt::passes::layout::{count_transposes, TargetKind};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn load_pbs(dir: &Path, prefix: &str) -> Option<Vec<Tensor>> {
    let mut out = Vec::new();
    for i in 0.. {
        let p = dir.join(format!("{prefix}_{i}.pb"));
        if !p.exists() {
            break;
        }
        let tp = tilec_onnx::load::load_tensor_pb(&p).ok()?;
        if tp.data_type == 0 {
            return None; // sequence / optional
        }
        out.push(tilec_onnx::tensor::tensor_from_proto(&tp).ok()?);
    }
    Some(out)
}

/// Imports the model as the conformance suite does; returns the graph and the feeds that
/// remain graph inputs (in the graph's input order, with their names).
fn import(dir: &Path) -> Option<(Graph, Vec<(String, Tensor)>)> {
    let model = tilec_onnx::load_model(&dir.join("model.onnx")).ok()?;
    let inputs = load_pbs(&dir.join("test_data_set_0"), "input")?;
    let gp = model.graph.as_ref()?;
    let init: std::collections::HashSet<&str> =
        gp.initializer.iter().map(|t| t.name.as_str()).collect();
    let names: Vec<String> = gp
        .input
        .iter()
        .filter(|i| !init.contains(i.name.as_str()))
        .map(|i| i.name.clone())
        .collect();
    if names.len() != inputs.len() {
        return None;
    }
    let by_name: HashMap<String, Tensor> = names.iter().cloned().zip(inputs).collect();
    let mut opts = ImportOptions::default();
    let g = loop {
        match import_model(&model, &opts) {
            Ok(g) => break g,
            Err(ImportError::NonConstant { input, .. })
                if by_name.contains_key(&input) && !opts.bind_inputs.contains_key(&input) =>
            {
                opts.bind_inputs
                    .insert(input.clone(), by_name[&input].clone());
            }
            Err(ImportError::NonConstant { .. }) => {
                let before = opts.bind_inputs.len();
                for (k, t) in &by_name {
                    if t.dtype().is_int() && t.numel() <= 64 {
                        opts.bind_inputs
                            .entry(k.clone())
                            .or_insert_with(|| t.clone());
                    }
                }
                if opts.bind_inputs.len() == before {
                    return None;
                }
            }
            Err(_) => return None,
        }
    };
    let feeds = g
        .inputs()
        .iter()
        .map(|&v| {
            let n = g.value(v).name.clone();
            by_name.get(&n).map(|t| (n, t.clone()))
        })
        .collect::<Option<Vec<_>>>()?;
    Some((g, feeds))
}

fn tolerance(d: DType) -> (f64, f64) {
    match d {
        DType::F64 => (1e-9, 1e-12),
        DType::F32 => (1e-4, 1e-5),
        DType::F16 => (1e-3, 1e-3),
        DType::BF16 => (1.0 / 64.0, 1e-2),
        _ => (0.25, 1e-2), // fp8
    }
}

/// `None` when equal within tolerance, else a description and the worst relative error.
fn compare(a: &Tensor, b: &Tensor) -> Option<String> {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return Some(format!(
            "{}{:?} vs {}{:?}",
            a.dtype(),
            a.shape(),
            b.dtype(),
            b.shape()
        ));
    }
    if !a.dtype().is_float() {
        let (x, y) = (a.to_i64_vec(), b.to_i64_vec());
        return (0..x.len())
            .find(|&i| x[i] != y[i])
            .map(|i| format!("element {i}: {} vs {}", x[i], y[i]));
    }
    let (rtol, atol) = tolerance(a.dtype());
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    let mut bad = 0;
    let mut worst = (0usize, 0.0f64);
    for i in 0..x.len() {
        let ok = if x[i].is_nan() {
            y[i].is_nan()
        } else if x[i].is_infinite() {
            x[i] == y[i]
        } else {
            (x[i] - y[i]).abs() <= atol + rtol * x[i].abs()
        };
        if !ok {
            bad += 1;
            let e = (x[i] - y[i]).abs();
            if !(e <= worst.1) {
                worst = (i, e);
            }
        }
    }
    (bad > 0).then(|| {
        format!(
            "{bad}/{} differ; element {}: {} vs {}",
            x.len(),
            worst.0,
            x[worst.0],
            y[worst.0]
        )
    })
}

fn random_like(t: &Tensor, rng: &mut impl Rng) -> Tensor {
    let n = t.numel();
    let shape = t.shape().to_vec();
    let d = t.dtype();
    if d.is_float() {
        let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..=1.0)).collect();
        Tensor::from_f64s(d, shape, &v).unwrap()
    } else if d == DType::Bool {
        let v: Vec<i64> = (0..n).map(|_| rng.gen_range(0..2)).collect();
        Tensor::from_i64s(d, shape, &v).unwrap()
    } else {
        let v: Vec<i64> = (0..n).map(|_| rng.gen_range(0..4)).collect();
        Tensor::from_i64s(d, shape, &v).unwrap()
    }
}

#[derive(Default)]
struct Stats {
    cases: usize,
    test_checks: usize,
    random_checks: usize,
    random_skipped: usize,
    nodes_before: usize,
    nodes_after: usize,
    mismatches: Vec<String>,
    /// Light models: per pass, nodes removed.
    light: BTreeMap<String, BTreeMap<&'static str, i64>>,
}

fn check_outputs(name: &str, what: &str, a: &[Tensor], b: &[Tensor], st: &mut Stats) {
    if a.len() != b.len() {
        st.mismatches.push(format!(
            "{name} [{what}]: {} vs {} outputs",
            a.len(),
            b.len()
        ));
        return;
    }
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        if let Some(m) = compare(x, y) {
            st.mismatches
                .push(format!("{name} [{what}] output {k}: {m}"));
        }
    }
}

fn run_case(name: &str, dir: &Path, random: bool, target: TargetKind, st: &Mutex<Stats>) {
    let Some((g, feeds)) = import(dir) else {
        return;
    };
    let tensors: Vec<Tensor> = feeds.iter().map(|(_, t)| t.clone()).collect();
    let Ok(before) = tilec_ref::run(&g, tensors.clone()) else {
        return;
    };
    let mut opt = g.clone();
    let opts = PipelineOptions {
        verify: true,
        print_ir_after: None,
    };
    let reports: Vec<PassReport> =
        match Pipeline::for_level_and_target(3, target).run(&mut opt, &opts) {
            Ok(r) => r,
            Err(e) => {
                st.lock()
                    .unwrap()
                    .mismatches
                    .push(format!("{name}: pipeline error: {e}"));
                return;
            }
        };
    let mut local = Stats::default();
    local.cases = 1;
    local.nodes_before = g.nodes().len();
    local.nodes_after = opt.nodes().len();
    match tilec_ref::run(&opt, tensors.clone()) {
        Ok(after) => {
            local.test_checks += 1;
            check_outputs(name, "test inputs", &before, &after, &mut local);
        }
        Err(e) => local
            .mismatches
            .push(format!("{name}: optimized graph fails: {e}")),
    }
    if random {
        let mut rng = rand::rngs::StdRng::seed_from_u64(
            name.bytes()
                .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)),
        );
        let rnd: Vec<Tensor> = tensors.iter().map(|t| random_like(t, &mut rng)).collect();
        match tilec_ref::run(&g, rnd.clone()) {
            // Random values are not meaningful here (e.g. out-of-range indices).
            Err(_) => local.random_skipped += 1,
            Ok(b) => match tilec_ref::run(&opt, rnd) {
                Ok(a) => {
                    local.random_checks += 1;
                    check_outputs(name, "random inputs", &b, &a, &mut local);
                }
                Err(e) => local.mismatches.push(format!(
                    "{name}: optimized graph fails on random inputs: {e}"
                )),
            },
        }
    }
    if std::env::var("TILEC_DIFF_VERBOSE").is_ok() {
        let hist = |g: &Graph| {
            let mut h: BTreeMap<&'static str, usize> = BTreeMap::new();
            for n in g.nodes() {
                *h.entry(n.op.name()).or_default() += 1;
            }
            h
        };
        println!(
            "{name}: ops before {:?}\n{name}: ops after  {:?}",
            hist(&g),
            hist(&opt)
        );
    }
    if target == TargetKind::Cuda {
        let nhwc_convs = opt
            .nodes()
            .iter()
            .filter(
                |n| matches!(&n.op, Op::Linalg(l @ LinalgOp::Conv { .. }) if l.is_channels_last()),
            )
            .count();
        let convs = opt
            .nodes()
            .iter()
            .filter(|n| matches!(&n.op, Op::Linalg(LinalgOp::Conv { .. })))
            .count();
        println!(
            "cuda {name}: {nhwc_convs}/{convs} convs NHWC; transposes {} imported -> {} after O3",
            count_transposes(&g),
            count_transposes(&opt)
        );
    }
    if name.starts_with("light/") {
        let mut per: BTreeMap<&'static str, i64> = BTreeMap::new();
        for r in &reports {
            *per.entry(r.pass).or_default() += r.nodes_before as i64 - r.nodes_after as i64;
        }
        local.light.insert(
            format!(
                "{name} ({} -> {} nodes)",
                g.nodes().len(),
                opt.nodes().len()
            ),
            per,
        );
    }
    let mut s = st.lock().unwrap();
    s.cases += local.cases;
    s.test_checks += local.test_checks;
    s.random_checks += local.random_checks;
    s.random_skipped += local.random_skipped;
    s.nodes_before += local.nodes_before;
    s.nodes_after += local.nodes_after;
    s.mismatches.extend(local.mismatches);
    s.light.extend(local.light);
}

#[test]
fn optimized_graphs_match_the_original() {
    differential(TargetKind::Cpu, &["light", "node"]);
}

/// The cuda pipeline (channels-last conv regions) on the light models.
#[test]
fn cuda_pipeline_matches_on_light_models() {
    differential(TargetKind::Cuda, &["light"]);
}

fn differential(target: TargetKind, kinds: &[&str]) {
    let gen = repo_root().join("testdata/gen");
    assert!(
        gen.join("node").is_dir(),
        "testdata/gen missing: run scripts/setup-venv.sh"
    );
    let filter = std::env::var("TILEC_DIFF_FILTER").ok();
    let light_random = std::env::var("TILEC_DIFF_LIGHT_RANDOM").is_ok();
    let mut cases: Vec<(String, PathBuf)> = Vec::new();
    for &kind in kinds {
        let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(gen.join(kind))
            .map(|rd| {
                rd.flatten()
                    .map(|e| {
                        (
                            format!("{kind}/{}", e.file_name().to_string_lossy()),
                            e.path(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        cases.extend(v.into_iter().filter(|(_, p)| p.join("model.onnx").exists()));
    }
    if let Some(f) = &filter {
        cases.retain(|(n, _)| n.contains(f.as_str()));
    }
    let st = Mutex::new(Stats::default());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((name, dir)) = cases.get(i) else {
                    break;
                };
                let random = !name.starts_with("light/") || light_random;
                if std::panic::catch_unwind(|| run_case(name, dir, random, target, &st)).is_err() {
                    st.lock().unwrap().mismatches.push(format!("{name}: PANIC"));
                }
            });
        }
    });
    let st = st.into_inner().unwrap();
    println!(
        "differential: {} models optimized; {} checks on test inputs, {} on random inputs ({} random skipped: the original rejects them); nodes {} -> {} ({} removed)",
        st.cases,
        st.test_checks,
        st.random_checks,
        st.random_skipped,
        st.nodes_before,
        st.nodes_after,
        st.nodes_before as i64 - st.nodes_after as i64
    );
    for (m, per) in &st.light {
        let parts: Vec<String> = per
            .iter()
            .filter(|(_, &d)| d != 0)
            .map(|(p, d)| format!("{p}: {d}"))
            .collect();
        println!("  {m}: {}", parts.join(", "));
    }
    for m in &st.mismatches {
        println!("MISMATCH {m}");
    }
    assert!(
        st.mismatches.is_empty(),
        "{} mismatches",
        st.mismatches.len()
    );
    assert!(st.test_checks > 0 || filter.is_some());
}
