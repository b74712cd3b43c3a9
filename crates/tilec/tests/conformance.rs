//! ONNX conformance: the backend node tests generated from the pinned `onnx` package
//! (scripts/gen-testdata.py) and the package's `light` models, run on the reference
//! interpreter against their expected outputs.
//!
//! `tests/conformance/expected-pass.txt` is a ratchet: every case listed there must pass.
//! Set `TILEC_UPDATE_EXPECTED=1` to rewrite it from the current results,
//! `TILEC_CONFORMANCE_FILTER=substr` to run a subset, `TILEC_CONFORMANCE_VERBOSE=1` to print
//! every failure and unsupported reason.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tilec_ir::{Tensor, TensorData};
use tilec_onnx::{import_model, ImportError, ImportOptions};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Pass,
    Fail(String),
    Unsupported(String),
}

struct Case {
    name: String,
    dir: PathBuf,
}

fn read_meta(dir: &Path) -> (f64, f64) {
    let mut rtol = 1e-3;
    let mut atol = 1e-7;
    if let Ok(s) = std::fs::read_to_string(dir.join("meta.json")) {
        // Tiny parser for {"rtol": x, "atol": y}; the file is written by our script.
        for part in s.trim_matches(|c| c == '{' || c == '}' || c == '\n').split(',') {
            let mut kv = part.splitn(2, ':');
            let k = kv.next().unwrap_or("").trim().trim_matches('"');
            let v: f64 = kv.next().unwrap_or("").trim().parse().unwrap_or(f64::NAN);
            if v.is_finite() {
                if k == "rtol" {
                    rtol = v;
                } else if k == "atol" {
                    atol = v;
                }
            }
        }
    }
    (rtol, atol)
}

fn load_pbs(dir: &Path, prefix: &str) -> Result<Vec<Tensor>, String> {
    let mut out = Vec::new();
    for i in 0.. {
        let p = dir.join(format!("{prefix}_{i}.pb"));
        if !p.exists() {
            break;
        }
        let tp = tilec_onnx::load::load_tensor_pb(&p).map_err(|e| e.to_string())?;
        // Sequence/optional files decode as a TensorProto with no type; reject them.
        if tp.data_type == 0 {
            return Err(format!("{prefix}_{i} is not a tensor (sequence or optional)"));
        }
        out.push(tilec_onnx::tensor::tensor_from_proto(&tp)?);
    }
    Ok(out)
}

fn close(expected: &Tensor, actual: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if expected.dtype() != actual.dtype() {
        return Err(format!("dtype {} expected, got {}", expected.dtype(), actual.dtype()));
    }
    if expected.shape() != actual.shape() {
        return Err(format!("shape {:?} expected, got {:?}", expected.shape(), actual.shape()));
    }
    if !expected.dtype().is_float() {
        let (e, a) = (expected.to_i64_vec(), actual.to_i64_vec());
        if let Some(i) = (0..e.len()).find(|&i| e[i] != a[i]) {
            return Err(format!("element {i}: expected {}, got {}", e[i], a[i]));
        }
        return Ok(());
    }
    let (e, a) = (expected.to_f64_vec(), actual.to_f64_vec());
    let mut worst: Option<(usize, f64)> = None;
    let mut bad = 0;
    for i in 0..e.len() {
        let (x, y) = (e[i], a[i]);
        let ok = if x.is_nan() {
            y.is_nan()
        } else if x.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= atol + rtol * x.abs()
        };
        if !ok {
            bad += 1;
            let err = (x - y).abs();
            if worst.map(|(_, w)| !(err <= w)).unwrap_or(true) {
                worst = Some((i, err));
            }
        }
    }
    match worst {
        None => Ok(()),
        Some((i, _)) => Err(format!("{bad}/{} elements differ; element {i}: expected {}, got {}", e.len(), e[i], a[i])),
    }
}

#[derive(Copy, Clone, PartialEq)]
enum Mode {
    Reference,
    Compiled,
}

fn run_case(case: &Case, mode: Mode) -> Outcome {
    let model = match tilec_onnx::load_model(&case.dir.join("model.onnx")) {
        Ok(m) => m,
        Err(e) => return Outcome::Unsupported(format!("load: {e}")),
    };
    let (rtol, atol) = read_meta(&case.dir);
    let set = case.dir.join("test_data_set_0");
    let inputs = match load_pbs(&set, "input") {
        Ok(v) => v,
        Err(e) => return Outcome::Unsupported(format!("inputs: {e}")),
    };
    let expected = match load_pbs(&set, "output") {
        Ok(v) => v,
        Err(e) => return Outcome::Unsupported(format!("outputs: {e}")),
    };
    let graph_proto = model.graph.as_ref().unwrap();
    let init: std::collections::HashSet<&str> = graph_proto.initializer.iter().map(|t| t.name.as_str()).collect();
    let input_names: Vec<String> =
        graph_proto.input.iter().filter(|i| !init.contains(i.name.as_str())).map(|i| i.name.clone()).collect();
    if input_names.len() != inputs.len() {
        return Outcome::Unsupported(format!("{} graph inputs, {} input files", input_names.len(), inputs.len()));
    }
    let by_name: HashMap<String, Tensor> = input_names.iter().cloned().zip(inputs.iter().cloned()).collect();
    // Shape operands that arrive as graph inputs are bound at import (specialization).
    let mut opts = ImportOptions::default();
    let graph = loop {
        match import_model(&model, &opts) {
            Ok(g) => break g,
            Err(ImportError::NonConstant { input, .. }) if by_name.contains_key(&input) && !opts.bind_inputs.contains_key(&input) => {
                opts.bind_inputs.insert(input.clone(), by_name[&input].clone());
            }
            // A shape operand computed from graph inputs: bind the integer inputs it may
            // derive from (once), as a user specializing on shape arguments would.
            Err(e @ ImportError::NonConstant { .. }) => {
                let before = opts.bind_inputs.len();
                for (k, t) in &by_name {
                    if t.dtype().is_int() && t.numel() <= 64 {
                        opts.bind_inputs.entry(k.clone()).or_insert_with(|| t.clone());
                    }
                }
                if opts.bind_inputs.len() == before {
                    return Outcome::Fail(format!("import: {e}"));
                }
            }
            Err(e @ ImportError::Unsupported { .. }) => return Outcome::Unsupported(e.to_string()),
            Err(e) => return Outcome::Fail(format!("import: {e}")),
        }
    };
    if let Err(e) = tilec_ir::verify(&graph) {
        return Outcome::Fail(format!("verify: {e}"));
    }
    let feeds: HashMap<String, Tensor> =
        by_name.into_iter().filter(|(k, _)| !opts.bind_inputs.contains_key(k)).collect();
    let outs = match mode {
        Mode::Reference => match tilec_ref::run_named(&graph, feeds) {
            Ok(o) => o,
            Err(e) => {
                let s = e.to_string();
                return if s.contains("not implemented") { Outcome::Unsupported(s) } else { Outcome::Fail(format!("run: {s}")) };
            }
        },
        Mode::Compiled => {
            let mut ordered = Vec::new();
            let mut feeds = feeds;
            for &v in graph.inputs() {
                match feeds.remove(&graph.value(v).name) {
                    Some(t) => ordered.push(t),
                    None => return Outcome::Fail(format!("input '{}' missing", graph.value(v).name)),
                }
            }
            let opts = tilec::compiled::CompileOptions { threads: 1, ..Default::default() };
            let mut c = match tilec::compiled::compile(&graph, &opts) {
                Ok(c) => c,
                Err(e) => return Outcome::Fail(format!("compile: {e}")),
            };
            if let Err(e) = c.check_plan() {
                return Outcome::Fail(format!("memory plan: {e}"));
            }
            // Poison the arena: every value a kernel fails to write reads back as NaN / all ones.
            if let Err(e) = c.poison() {
                return Outcome::Fail(format!("poisoning the arena: {e}"));
            }
            match c.run(&ordered) {
                Ok(o) => {
                    let mut st = STATS.lock().unwrap();
                    st.0 += c.report.kernels;
                    st.1 += c.report.fallbacks.len();
                    for (op, _) in &c.report.fallbacks {
                        *st.2.entry(op.clone()).or_default() += 1;
                    }
                    o
                }
                Err(e) => return Outcome::Fail(format!("run: {e}")),
            }
        }
    };
    if outs.len() != expected.len() {
        return Outcome::Fail(format!("{} outputs, expected {}", outs.len(), expected.len()));
    }
    for (k, (e, a)) in expected.iter().zip(&outs).enumerate() {
        // As onnx's own runner: bfloat16 results get a looser relative tolerance.
        let rtol = if e.dtype() == tilec_ir::DType::BF16 { rtol.max(1.0 / 64.0) } else { rtol };
        if let Err(m) = close(e, a, rtol, atol) {
            return Outcome::Fail(format!("output {k}: {m}"));
        }
    }
    Outcome::Pass
}

fn collect(root: &Path, kind: &str) -> Vec<Case> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(root.join(kind)) {
        for e in rd.flatten() {
            if e.path().join("model.onnx").exists() {
                v.push(Case { name: format!("{kind}/{}", e.file_name().to_string_lossy()), dir: e.path() });
            }
        }
    }
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// Kernels compiled, nodes that fell back to the interpreter, and fallbacks per op.
static STATS: Mutex<(usize, usize, BTreeMap<String, usize>)> = Mutex::new((0, 0, BTreeMap::new()));

#[test]
fn onnx_conformance() {
    conformance(Mode::Reference);
}

/// The same cases through the compiled CPU path: every case of the ratchet must pass there too.
#[test]
fn onnx_conformance_compiled() {
    if std::env::var_os("TILEC_CACHE_DIR").is_none() {
        std::env::set_var("TILEC_CACHE_DIR", repo_root().join("target/tilec-cache"));
    }
    conformance(Mode::Compiled);
    let st = STATS.lock().unwrap();
    println!("compiled path: {} kernels, {} nodes on the reference interpreter", st.0, st.1);
    let mut by: Vec<(&String, &usize)> = st.2.iter().collect();
    by.sort_by(|a, b| b.1.cmp(a.1));
    let top: Vec<String> = by.iter().take(15).map(|(k, v)| format!("{k} {v}")).collect();
    println!("fallback ops: {}", top.join(", "));
}

fn conformance(mode: Mode) {
    let root = repo_root();
    let gen = root.join("testdata/gen");
    assert!(
        gen.join("node").is_dir() && gen.join("light").is_dir(),
        "conformance data missing: run scripts/setup-venv.sh (it generates testdata/gen from the pinned onnx package)"
    );
    let filter = std::env::var("TILEC_CONFORMANCE_FILTER").ok();
    let verbose = std::env::var("TILEC_CONFORMANCE_VERBOSE").is_ok();
    let mut cases = collect(&gen, "node");
    cases.extend(collect(&gen, "light"));
    if let Some(f) = &filter {
        cases.retain(|c| c.name.contains(f.as_str()));
    }
    let results: Mutex<BTreeMap<String, Outcome>> = Mutex::new(BTreeMap::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(c) = cases.get(i) else { break };
                let r = std::panic::catch_unwind(|| run_case(c, mode))
                    .unwrap_or_else(|_| Outcome::Fail("PANIC".into()));
                results.lock().unwrap().insert(c.name.clone(), r);
            });
        }
    });
    let results = results.into_inner().unwrap();
    let (mut pass, mut fail, mut unsup) = (0, 0, 0);
    let (mut lpass, mut ltotal) = (0, 0);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for (name, r) in &results {
        if name.starts_with("light/") {
            ltotal += 1;
        }
        match r {
            Outcome::Pass => {
                pass += 1;
                if name.starts_with("light/") {
                    lpass += 1;
                }
            }
            Outcome::Fail(m) => {
                fail += 1;
                if verbose {
                    println!("FAIL {name}: {m}");
                }
                if m.contains("PANIC") {
                    println!("PANIC {name}");
                }
            }
            Outcome::Unsupported(m) => {
                unsup += 1;
                if verbose {
                    println!("UNSUPPORTED {name}: {m}");
                }
                let key = m.split(": unsupported:").next().unwrap_or(m).to_string();
                let key = key.rsplit('(').next().unwrap_or(&key).split(',').next().unwrap_or("").to_string();
                *reasons.entry(key).or_default() += 1;
            }
        }
    }
    let ops = tilec_onnx::import::supported_op_types();
    println!("ONNX op types supported by the importer: {}", ops.len());
    println!("light models: {lpass}/{ltotal} match their expected outputs");
    let label = if mode == Mode::Compiled { "conformance (compiled cpu)" } else { "conformance" };
    println!("{label}: {pass} passed, {fail} failed, {unsup} unsupported ({} cases)", results.len());

    let list_path = root.join("tests/conformance/expected-pass.txt");
    if std::env::var("TILEC_UPDATE_EXPECTED").is_ok() && filter.is_none() && mode == Mode::Reference {
        let mut s = String::from("# Conformance cases that must pass (a ratchet; regenerate with TILEC_UPDATE_EXPECTED=1).\n");
        for (n, r) in &results {
            if *r == Outcome::Pass {
                s.push_str(n);
                s.push('\n');
            }
        }
        std::fs::write(&list_path, s).unwrap();
        println!("wrote {}", list_path.display());
    }
    let expected = std::fs::read_to_string(&list_path).unwrap_or_default();
    let mut regressions = Vec::new();
    for line in expected.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        match results.get(line) {
            Some(Outcome::Pass) => {}
            Some(other) => regressions.push(format!("{line}: {other:?}")),
            None if filter.is_none() => regressions.push(format!("{line}: case missing")),
            None => {}
        }
    }
    assert!(regressions.is_empty(), "{} expected-pass cases regressed:\n{}", regressions.len(), regressions.join("\n"));
}

#[allow(dead_code)]
fn _uses(_: TensorData) {}
