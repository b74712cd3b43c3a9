//! Lowering checked by execution: graphs are optimized (-O3, cpu), partitioned for the cpu
//! target, every group is lowered to tile IR (a group that cannot be lowered runs node by
//! node on the reference interpreter), the kernels run on the tile-IR interpreter with
//! NaN-poisoned outputs, and the results are compared with the reference interpreter on
//! fresh random inputs: per group (each kernel's outputs against the reference values of
//! the same inputs) and for the graph outputs.
//!
//! Cases: every ONNX node test in `testdata/gen/node` whose shapes are fixed, and small
//! graphs built here for GEMM/convolution/pool/normalization/attention shapes the suite
//! does not cover. `TILEC_LOWER_FILTER=substr` selects node cases; `TILEC_LOWER_VERBOSE=1`
//! prints every fallback.

use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tilec_ir::op::*;
use tilec_ir::{DType, Dim, Graph, NodeId, Op, Tensor, TensorType, ValueDef, ValueId};
use tilec_onnx::{import_model, ImportError, ImportOptions};
use tilec_opt::manager::{Pipeline, PipelineOptions};
use tilec_opt::partition::{partition, Target, TargetKind};
use tilec_ref::EvalCtx;
use tilec_tile::lower::{lower_group, lower_group_with, lower_nodes, LowerError, LowerOptions, Lowered};
use tilec_tile::{interp, Expr, Scope, Stmt};

// ------------------------------------------------------------------ comparison

fn tolerance(d: DType) -> (f64, f64) {
    match d {
        DType::F64 => (1e-9, 1e-12),
        DType::F32 => (2e-4, 2e-5),
        DType::F16 => (4e-3, 2e-3),
        DType::BF16 => (1.0 / 32.0, 2e-2),
        _ => (0.25, 1e-2),
    }
}

/// The float dtype with the coarsest rounding among `vals` (the tolerance a computation
/// through them needs), `F64` when there is none.
fn coarsest(g: &Graph, vals: impl Iterator<Item = ValueId>) -> DType {
    let rank = |d: DType| match d {
        DType::F64 => 0,
        DType::F32 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
        _ => 4,
    };
    vals.map(|v| g.value(v).ty.dtype)
        .filter(|d| d.is_float())
        .max_by_key(|&d| rank(d))
        .unwrap_or(DType::F64)
}

fn compare(want: &Tensor, got: &Tensor) -> Option<String> {
    compare_at(want, got, want.dtype())
}

fn compare_at(want: &Tensor, got: &Tensor, tol: DType) -> Option<String> {
    if want.dtype() != got.dtype() || want.shape() != got.shape() {
        return Some(format!(
            "{}{:?} vs {}{:?}",
            want.dtype(),
            want.shape(),
            got.dtype(),
            got.shape()
        ));
    }
    if !want.dtype().is_float() {
        let (x, y) = (want.to_i64_vec(), got.to_i64_vec());
        return (0..x.len())
            .find(|&i| x[i] != y[i])
            .map(|i| format!("element {i}: want {} got {}", x[i], y[i]));
    }
    let tol = if tolerance(tol).0 > tolerance(want.dtype()).0 {
        tol
    } else {
        want.dtype()
    };
    let (rtol, atol) = tolerance(tol);
    let (x, y) = (want.to_f64_vec(), got.to_f64_vec());
    let mut bad = 0;
    let mut first = None;
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
            first.get_or_insert(i);
        }
    }
    first.map(|i| {
        format!(
            "{bad}/{} differ; element {i}: want {} got {}",
            x.len(),
            x[i],
            y[i]
        )
    })
}

fn random_like(d: DType, shape: &[usize], rng: &mut impl Rng) -> Tensor {
    let n: usize = shape.iter().product();
    if d.is_float() {
        let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..=1.0)).collect();
        Tensor::from_f64s(d, shape.to_vec(), &v).unwrap()
    } else if d == DType::Bool {
        let v: Vec<i64> = (0..n).map(|_| rng.gen_range(0..2)).collect();
        Tensor::from_i64s(d, shape.to_vec(), &v).unwrap()
    } else {
        let v: Vec<i64> = (0..n).map(|_| rng.gen_range(0..4)).collect();
        Tensor::from_i64s(d, shape.to_vec(), &v).unwrap()
    }
}

/// An output buffer full of a value no kernel computes by accident.
fn poisoned(d: DType, shape: &[i64]) -> Tensor {
    let shape: Vec<usize> = shape.iter().map(|&x| x as usize).collect();
    let n: usize = shape.iter().product();
    if d.is_float() {
        Tensor::from_f64s(d, shape, &vec![f64::NAN; n]).unwrap()
    } else if d == DType::Bool {
        Tensor::from_i64s(d, shape, &vec![1; n]).unwrap()
    } else {
        Tensor::from_i64s(
            d,
            shape,
            &vec![0x5a5a_5a5a_5a5a_5a5a_i64 >> (64 - 8 * d.size_bytes() as u32).min(63); n],
        )
        .unwrap()
    }
}

// ------------------------------------------------------------------ execution

#[derive(Default)]
struct Stats {
    cases: usize,
    groups: usize,
    lowered: usize,
    checked_outputs: usize,
    fallback_ops: BTreeMap<String, usize>,
    symbolic: usize,
    skipped: Vec<String>,
    mismatches: Vec<String>,
    /// Groups whose CPU lowering differs from the default one (also checked).
    cpu_variants: usize,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
        self.cpu_variants += o.cpu_variants;
        self.cases += o.cases;
        self.groups += o.groups;
        self.lowered += o.lowered;
        self.checked_outputs += o.checked_outputs;
        self.symbolic += o.symbolic;
        for (k, v) in o.fallback_ops {
            *self.fallback_ops.entry(k).or_default() += v;
        }
        self.skipped.extend(o.skipped);
        self.mismatches.extend(o.mismatches);
    }
}

fn value_of(g: &Graph, env: &HashMap<ValueId, Tensor>, v: ValueId) -> Option<Tensor> {
    match &g.value(v).def {
        ValueDef::Const(t) => Some(t.clone()),
        _ => env.get(&v).cloned(),
    }
}

fn eval_node(g: &Graph, n: NodeId, env: &mut HashMap<ValueId, Tensor>) -> Result<(), String> {
    let node = g.node(n);
    let args: Vec<Tensor> = node
        .inputs
        .iter()
        .map(|&v| value_of(g, env, v).ok_or_else(|| format!("'{}' has no value", g.value(v).name)))
        .collect::<Result<_, _>>()?;
    let refs: Vec<&Tensor> = args.iter().collect();
    let bound = HashMap::new();
    let cx = EvalCtx {
        graph: g,
        bound: &bound,
    };
    let outs = tilec_ref::eval_op(&node.op, &refs, &cx)
        .map_err(|e| format!("node '{}' ({}): {e}", node.name, node.op.name()))?;
    for (&v, t) in node.outputs.iter().zip(outs) {
        env.insert(v, t);
    }
    Ok(())
}

/// Every value of the graph on the reference interpreter.
fn reference_env(g: &Graph, inputs: &[Tensor]) -> Result<HashMap<ValueId, Tensor>, String> {
    let mut env = HashMap::new();
    for (&v, t) in g.inputs().iter().zip(inputs) {
        env.insert(v, t.clone());
    }
    for i in 0..g.nodes().len() {
        eval_node(g, NodeId(i as u32), &mut env)?;
    }
    Ok(env)
}

/// Runs a lowered kernel on the values in `env`; returns its outputs.
fn run_lowered(
    g: &Graph,
    lw: &Lowered,
    env: &HashMap<ValueId, Tensor>,
) -> Result<Vec<Tensor>, String> {
    let mut args = Vec::new();
    for &v in &lw.inputs {
        args.push(
            value_of(g, env, v)
                .ok_or_else(|| format!("input '{}' has no value", g.value(v).name))?,
        );
    }
    for (k, &v) in lw.outputs.iter().enumerate() {
        let b = lw.kernel.buf(lw.kernel.params[lw.inputs.len() + k]);
        assert_eq!(b.dtype, g.value(v).ty.dtype);
        args.push(poisoned(b.dtype, &b.shape));
    }
    interp::run(&lw.kernel, &mut args).map_err(|e| e.to_string())?;
    Ok(args
        .split_off(lw.inputs.len())
        .into_iter()
        .zip(&lw.outputs)
        .map(|(t, &v)| {
            let shape = g.value(v).ty.fixed_shape().unwrap_or_default();
            t.reshaped(shape).unwrap()
        })
        .collect())
}

/// Structural checks every lowered kernel must pass.
fn check_kernel(g: &Graph, lw: &Lowered) -> Result<(), String> {
    let k = &lw.kernel;
    if k.params.len() != lw.inputs.len() + lw.outputs.len() {
        return Err("params are not inputs then outputs".into());
    }
    for (i, &v) in lw.inputs.iter().chain(&lw.outputs).enumerate() {
        let b = k.buf(k.params[i]);
        let want: Vec<i64> = g
            .value(v)
            .ty
            .fixed_shape()
            .unwrap_or_default()
            .iter()
            .map(|&d| d as i64)
            .collect();
        if b.dtype != g.value(v).ty.dtype || b.shape != want {
            return Err(format!(
                "param {i} is {}{:?}, value is {}{:?}",
                b.dtype,
                b.shape,
                g.value(v).ty.dtype,
                want
            ));
        }
    }
    let mut names = std::collections::HashSet::new();
    for v in &k.vars {
        if !names.insert(v.name.clone()) {
            return Err(format!("variable name {} is used twice", v.name));
        }
    }
    Ok(())
}

/// Executes the partitioned graph group by group; compares each lowered group's outputs
/// with the reference values and returns the graph outputs.
fn run_partitioned(
    name: &str,
    g: &Graph,
    inputs: &[Tensor],
    st: &mut Stats,
) -> Result<Vec<Tensor>, String> {
    let reference = reference_env(g, inputs)?;
    let part = partition(g, &Target::preset(TargetKind::Cpu));
    let mut env: HashMap<ValueId, Tensor> = HashMap::new();
    for (&v, t) in g.inputs().iter().zip(inputs) {
        env.insert(v, t.clone());
    }
    let verbose = std::env::var("TILEC_LOWER_VERBOSE").is_ok();
    // Groups run when their inputs are ready (the group graph is acyclic); a source node
    // outside every group runs as soon as its own inputs are.
    let sources: Vec<NodeId> = (0..g.nodes().len())
        .filter(|&i| part.group_of[i].is_none())
        .map(|i| NodeId(i as u32))
        .collect();
    let mut src_done = vec![false; sources.len()];
    let mut pending: Vec<usize> = (0..part.groups.len()).collect();
    while !pending.is_empty() {
        let mut progress = false;
        for (k, &n) in sources.iter().enumerate() {
            if !src_done[k]
                && g.node(n)
                    .inputs
                    .iter()
                    .all(|&v| value_of(g, &env, v).is_some())
            {
                eval_node(g, n, &mut env)?;
                src_done[k] = true;
                progress = true;
            }
        }
        let ready = pending.iter().position(|&gi| {
            part.groups[gi]
                .inputs
                .iter()
                .all(|&v| value_of(g, &env, v).is_some())
        });
        let Some(pos) = ready else {
            if progress {
                continue;
            }
            return Err("no group is ready: the group graph has a cycle".into());
        };
        let gi = pending.remove(pos);
        let grp = &part.groups[gi];
        st.groups += 1;
        match lower_group(g, grp, &format!("k{gi}")) {
            Ok(lw) => {
                st.lowered += 1;
                if let Err(e) = check_kernel(g, &lw) {
                    st.mismatches.push(format!("{name} group {gi}: {e}"));
                }
                let outs = run_lowered(g, &lw, &env)
                    .map_err(|e| format!("group {gi} ({:?}): {e}", grp.kind))?;
                let vals = grp
                    .nodes
                    .iter()
                    .flat_map(|&n| g.node(n).inputs.iter().chain(&g.node(n).outputs).copied());
                let tol = coarsest(g, vals);
                // The other algorithms kernel families choose (Winograd, direct and GEMM
                // convolutions, attention as matrix products or flash-style, channels-last global
                // pools by blocks of channels), where they change the kernel, against the same
                // reference.
                use tilec_tile::lower::{AttentionAlgo, ConvAlgo, PoolAlgo};
                let variants = [
                    LowerOptions { pool: PoolAlgo::ChannelBlocks, ..Default::default() },
                    LowerOptions { conv: ConvAlgo::Winograd, attention: AttentionAlgo::Gemm, ..Default::default() },
                    LowerOptions { conv: ConvAlgo::Direct, attention: AttentionAlgo::Rows, ..Default::default() },
                    LowerOptions { conv: ConvAlgo::Gemm, attention: AttentionAlgo::Rows, ..Default::default() },
                    // Blocks smaller than the sequences: shorter last blocks of both.
                    LowerOptions { attention: AttentionAlgo::Flash { bq: 2, bk: 4 }, ..Default::default() },
                ];
                for lc in variants.iter().filter_map(|&o| lower_group_with(g, grp, &format!("k{gi}c"), o).ok()) {
                    if lc.kernel.body != lw.kernel.body {
                        st.cpu_variants += 1;
                        let outs = run_lowered(g, &lc, &env)
                            .map_err(|e| format!("group {gi} ({:?}, cpu lowering): {e}", grp.kind))?;
                        for (&v, t) in lc.outputs.iter().zip(outs) {
                            if let Some(want) = reference.get(&v) {
                                if let Some(m) = compare_at(want, &t, tol) {
                                    st.mismatches.push(format!(
                                        "{name} group {gi} {:?} (cpu lowering) value '{}': {m}",
                                        grp.kind,
                                        g.value(v).name
                                    ));
                                }
                            }
                        }
                    }
                }
                for (&v, t) in lw.outputs.iter().zip(outs) {
                    st.checked_outputs += 1;
                    if let Some(want) = reference.get(&v) {
                        if let Some(m) = compare_at(want, &t, tol) {
                            let ops: Vec<&str> =
                                grp.nodes.iter().map(|&n| g.node(n).op.name()).collect();
                            st.mismatches.push(format!(
                                "{name} group {gi} {:?} {ops:?} value '{}': {m}",
                                grp.kind,
                                g.value(v).name
                            ));
                        }
                    }
                    env.insert(v, t);
                }
            }
            Err(e) => {
                let key = match &e {
                    LowerError::Unsupported { op, .. } => op.to_string(),
                    LowerError::Symbolic { .. } => "(symbolic)".to_string(),
                    LowerError::Invalid(_) => "(invalid)".to_string(),
                };
                if verbose {
                    println!("fallback {name} group {gi}: {e}");
                }
                *st.fallback_ops.entry(key).or_default() += 1;
                for &n in &grp.nodes {
                    eval_node(g, n, &mut env)?;
                }
            }
        }
    }
    for (k, &n) in sources.iter().enumerate() {
        if !src_done[k] {
            eval_node(g, n, &mut env)?;
        }
    }
    g.outputs()
        .iter()
        .map(|&v| {
            value_of(g, &env, v)
                .ok_or_else(|| format!("graph output '{}' not computed", g.value(v).name))
        })
        .collect()
}

/// Optimizes, runs partitioned and compares graph outputs with the reference interpreter.
fn check_graph(name: &str, g: &Graph, inputs: &[Tensor], st: &mut Stats) {
    let want = match tilec_ref::run(g, inputs.to_vec()) {
        Ok(w) => w,
        Err(e) => {
            st.skipped.push(format!("{name}: reference fails: {e}"));
            return;
        }
    };
    st.cases += 1;
    match run_partitioned(name, g, inputs, st) {
        Ok(got) => {
            let tol = coarsest(g, g.value_ids());
            for (k, (w, o)) in want.iter().zip(&got).enumerate() {
                if let Some(m) = compare_at(w, o, tol) {
                    st.mismatches.push(format!("{name} graph output {k}: {m}"));
                }
            }
        }
        Err(e) => st.mismatches.push(format!("{name}: {e}")),
    }
}

fn optimize(g: &mut Graph) -> Result<(), String> {
    let opts = PipelineOptions {
        verify: true,
        print_ir_after: None,
    };
    Pipeline::for_level_and_target(3, TargetKind::Cpu)
        .run(g, &opts)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn fixed(g: &Graph) -> bool {
    g.values().iter().all(|v| v.ty.fixed_shape().is_some())
}

// ------------------------------------------------------------------ conformance cases

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
            return None;
        }
        out.push(tilec_onnx::tensor::tensor_from_proto(&tp).ok()?);
    }
    Some(out)
}

/// Imports as the conformance suite does (binding shape operands); returns the graph and
/// its remaining inputs' test values.
fn import(dir: &Path) -> Option<(Graph, Vec<Tensor>)> {
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
        .map(|&v| by_name.get(&g.value(v).name).cloned())
        .collect::<Option<Vec<_>>>()?;
    Some((g, feeds))
}

fn run_node_case(name: &str, dir: &Path) -> Stats {
    let mut st = Stats::default();
    let Some((mut g, feeds)) = import(dir) else {
        return st;
    };
    if tilec_ref::run(&g, feeds.clone()).is_err() {
        return st;
    }
    if let Err(e) = optimize(&mut g) {
        st.skipped.push(format!("{name}: pipeline: {e}"));
        return st;
    }
    if !fixed(&g) {
        st.symbolic += 1;
        return st;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(
        name.bytes()
            .fold(11u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)),
    );
    let rnd: Vec<Tensor> = feeds
        .iter()
        .map(|t| random_like(t.dtype(), t.shape(), &mut rng))
        .collect();
    // Random values may be meaningless for an op (indices out of range): then the test's
    // own inputs.
    let inputs = if tilec_ref::run(&g, rnd.clone()).is_ok() {
        rnd
    } else {
        feeds
    };
    check_graph(name, &g, &inputs, &mut st);
    st
}

#[test]
fn conformance_node_cases_lower_and_match() {
    let dir = repo_root().join("testdata/gen/node");
    assert!(
        dir.is_dir(),
        "testdata/gen missing: run scripts/setup-venv.sh"
    );
    let filter = std::env::var("TILEC_LOWER_FILTER").ok();
    let mut cases: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().to_string(), e.path()))
        .filter(|(_, p)| p.join("model.onnx").exists())
        .collect();
    cases.sort();
    if let Some(f) = &filter {
        cases.retain(|(n, _)| n.contains(f.as_str()));
    }
    let total = Mutex::new(Stats::default());
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
                let st = match std::panic::catch_unwind(|| run_node_case(name, dir)) {
                    Ok(st) => st,
                    Err(_) => Stats {
                        mismatches: vec![format!("{name}: PANIC")],
                        ..Default::default()
                    },
                };
                total.lock().unwrap().merge(st);
            });
        }
    });
    let st = total.into_inner().unwrap();
    report("conformance", &st);
    assert!(
        st.mismatches.is_empty(),
        "{} mismatches",
        st.mismatches.len()
    );
    assert!(st.lowered > 0 || filter.is_some());
}

fn report(what: &str, st: &Stats) {
    let fb: usize = st.fallback_ops.values().sum();
    println!(
        "{what}: {} graphs ({} skipped with symbolic shapes); {} groups: {} lowered ({} also with the cpu's algorithms), {} fell back; {} kernel outputs checked",
        st.cases, st.symbolic, st.groups, st.lowered, st.cpu_variants, fb, st.checked_outputs
    );
    let mut top: Vec<(&String, &usize)> = st.fallback_ops.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let parts: Vec<String> = top.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    println!("fallbacks by op: {}", parts.join(", "));
    for s in &st.skipped {
        println!("skipped {s}");
    }
    for m in &st.mismatches {
        println!("MISMATCH {m}");
    }
}

// ------------------------------------------------------------------ built graphs

fn f32t(shape: &[usize]) -> TensorType {
    TensorType::fixed(DType::F32, shape)
}

fn rand_const(g: &mut Graph, name: &str, shape: &[usize], rng: &mut impl Rng) -> ValueId {
    g.add_const(name, random_like(DType::F32, shape, rng))
}

fn window(kernel: &[usize], strides: &[usize], dil: &[usize], pads: Padding) -> Window {
    Window {
        kernel: kernel.to_vec(),
        strides: strides.to_vec(),
        dilations: dil.to_vec(),
        pads,
    }
}

fn gelu() -> Op {
    Op::Unary(UnaryOp::Gelu { tanh_approx: false })
}

/// Built graphs: (name, graph, whether to optimize first).
fn built_graphs() -> Vec<(String, Graph)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut out = Vec::new();

    // MatMul + bias + GELU + residual, then a reshape/transpose of the result.
    {
        let mut g = Graph::new("mlp");
        let x = g.add_input("x", f32t(&[2, 5, 24]));
        let w = rand_const(&mut g, "w", &[24, 20], &mut rng);
        let b = rand_const(&mut g, "b", &[20], &mut rng);
        let w2 = rand_const(&mut g, "w2", &[20, 24], &mut rng);
        let h = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
        let h = g.add(Op::Binary(BinaryOp::Add), &[h, b]).unwrap();
        let h = g.add(gelu(), &[h]).unwrap();
        let y = g.add(Op::Linalg(LinalgOp::MatMul), &[h, w2]).unwrap();
        let y = g.add(Op::Binary(BinaryOp::Add), &[y, x]).unwrap();
        let r = g
            .add(
                Op::Layout(LayoutOp::Reshape {
                    shape: vec![Dim::Fixed(2), Dim::Fixed(5), Dim::Fixed(4), Dim::Fixed(6)],
                }),
                &[y],
            )
            .unwrap();
        let t = g
            .add(
                Op::Layout(LayoutOp::Transpose {
                    perm: vec![0, 2, 1, 3],
                }),
                &[r],
            )
            .unwrap();
        g.set_outputs(vec![t]);
        out.push(("mlp".to_string(), g));
    }
    // Batched matmul with broadcast batch dims and vector operands.
    {
        let mut g = Graph::new("bmm");
        let a = g.add_input("a", f32t(&[3, 1, 4, 7]));
        let b = g.add_input("b", f32t(&[2, 7, 5]));
        let v = g.add_input("v", f32t(&[7]));
        let c = g.add(Op::Linalg(LinalgOp::MatMul), &[a, b]).unwrap();
        let d = g.add(Op::Linalg(LinalgOp::MatMul), &[a, v]).unwrap();
        let e = g.add(Op::Linalg(LinalgOp::MatMul), &[v, b]).unwrap();
        g.set_outputs(vec![c, d, e]);
        out.push(("bmm".to_string(), g));
    }
    // Convolutions: GEMM path (padding, stride, dilation, groups), direct path (depthwise),
    // 1-D and 3-D, channels-last, transposed.
    let convs: Vec<(&str, Vec<usize>, Vec<usize>, Window, usize, bool)> = vec![
        (
            "conv2d",
            vec![2, 6, 9, 8],
            vec![8, 6, 3, 3],
            window(
                &[3, 3],
                &[1, 1],
                &[1, 1],
                Padding::Explicit(vec![1, 1, 1, 1]),
            ),
            1,
            false,
        ),
        (
            "conv2d_s2_d2",
            vec![1, 4, 11, 10],
            vec![8, 4, 3, 2],
            window(
                &[3, 2],
                &[2, 1],
                &[2, 1],
                Padding::Explicit(vec![2, 0, 1, 1]),
            ),
            1,
            false,
        ),
        (
            "conv2d_groups",
            vec![1, 8, 7, 7],
            vec![8, 4, 3, 3],
            window(&[3, 3], &[1, 1], &[1, 1], Padding::SameUpper),
            2,
            false,
        ),
        (
            "conv2d_depthwise",
            vec![1, 6, 7, 6],
            vec![6, 1, 3, 3],
            window(
                &[3, 3],
                &[2, 2],
                &[1, 1],
                Padding::Explicit(vec![1, 1, 1, 1]),
            ),
            6,
            false,
        ),
        (
            "conv1d",
            vec![2, 5, 12],
            vec![7, 5, 4],
            window(&[4], &[2], &[1], Padding::Explicit(vec![1, 2])),
            1,
            false,
        ),
        (
            "conv3d",
            vec![1, 3, 4, 5, 5],
            vec![4, 3, 2, 2, 2],
            window(
                &[2, 2, 2],
                &[1, 1, 1],
                &[1, 1, 1],
                Padding::Explicit(vec![0, 1, 0, 0, 1, 0]),
            ),
            1,
            false,
        ),
        (
            "conv2d_nhwc",
            vec![2, 7, 6, 6],
            vec![8, 6, 3, 3],
            window(
                &[3, 3],
                &[1, 1],
                &[1, 1],
                Padding::Explicit(vec![1, 1, 1, 1]),
            ),
            1,
            true,
        ),
        (
            "conv2d_nhwc_small",
            vec![1, 5, 5, 2],
            vec![3, 2, 1, 1],
            window(
                &[1, 1],
                &[1, 1],
                &[1, 1],
                Padding::Explicit(vec![0, 0, 0, 0]),
            ),
            1,
            true,
        ),
    ];
    for (name, xs, ws, w, group, cl) in convs {
        let mut g = Graph::new(name);
        let x = g.add_input("x", f32t(&xs));
        let wt = rand_const(&mut g, "w", &ws, &mut rng);
        let b = rand_const(&mut g, "b", &[ws[0]], &mut rng);
        let c = g
            .add(
                Op::Linalg(LinalgOp::Conv {
                    window: w,
                    group,
                    channels_last: cl,
                }),
                &[x, wt, b],
            )
            .unwrap();
        let r = g.add(Op::Unary(UnaryOp::Relu), &[c]).unwrap();
        g.set_outputs(vec![r]);
        out.push((name.to_string(), g));
    }
    {
        let mut g = Graph::new("conv_transpose");
        let x = g.add_input("x", f32t(&[1, 4, 4, 5]));
        let wt = rand_const(&mut g, "w", &[4, 3, 3, 3], &mut rng);
        let b = rand_const(&mut g, "b", &[6], &mut rng);
        let op = LinalgOp::ConvTranspose {
            kernel: vec![3, 3],
            strides: vec![2, 2],
            dilations: vec![1, 1],
            pads: vec![1, 0, 1, 1],
            output_padding: vec![1, 0],
            group: 2,
        };
        let c = g.add(Op::Linalg(op), &[x, wt, b]).unwrap();
        g.set_outputs(vec![c]);
        out.push(("conv_transpose".to_string(), g));
    }
    // Pools.
    let pools: Vec<(&str, PoolKind, Window, bool, bool)> = vec![
        (
            "maxpool_ceil",
            PoolKind::Max {
                indices: true,
                column_major: false,
            },
            window(
                &[3, 3],
                &[2, 2],
                &[1, 1],
                Padding::Explicit(vec![1, 1, 0, 0]),
            ),
            true,
            false,
        ),
        (
            "avgpool_incl",
            PoolKind::Avg {
                count_include_pad: true,
            },
            window(
                &[3, 2],
                &[2, 2],
                &[1, 1],
                Padding::Explicit(vec![1, 1, 1, 0]),
            ),
            true,
            false,
        ),
        (
            "avgpool_excl",
            PoolKind::Avg {
                count_include_pad: false,
            },
            window(&[3, 3], &[1, 2], &[2, 1], Padding::SameLower),
            false,
            false,
        ),
        (
            "lppool",
            PoolKind::Lp { p: 2 },
            window(
                &[2, 2],
                &[1, 1],
                &[1, 1],
                Padding::Explicit(vec![0, 0, 0, 0]),
            ),
            false,
            false,
        ),
        (
            "maxpool_nhwc",
            PoolKind::Max {
                indices: false,
                column_major: false,
            },
            window(
                &[2, 2],
                &[2, 2],
                &[1, 1],
                Padding::Explicit(vec![0, 0, 1, 1]),
            ),
            false,
            true,
        ),
    ];
    for (name, kind, w, ceil, cl) in pools {
        let mut g = Graph::new(name);
        let xs = if cl {
            vec![2, 7, 6, 3]
        } else {
            vec![2, 3, 7, 6]
        };
        let x = g.add_input("x", f32t(&xs));
        let outs = g
            .add_node(
                name,
                Op::Linalg(LinalgOp::Pool {
                    kind,
                    window: w,
                    ceil_mode: ceil,
                    channels_last: cl,
                }),
                &[x],
            )
            .unwrap();
        g.set_outputs(outs);
        out.push((name.to_string(), g));
    }
    // Normalizations with prologue and epilogue, reductions with epilogues.
    {
        let mut g = Graph::new("norms");
        let x = g.add_input("x", f32t(&[3, 4, 10]));
        let r = g.add_input("r", f32t(&[3, 4, 10]));
        let s = rand_const(&mut g, "s", &[10], &mut rng);
        let b = rand_const(&mut g, "b", &[10], &mut rng);
        let h = g.add(Op::Binary(BinaryOp::Add), &[x, r]).unwrap();
        let ln = g
            .add_node(
                "ln",
                Op::Norm(NormOp::LayerNorm {
                    axis: 2,
                    epsilon: 1e-5,
                    stash: DType::F32,
                    has_bias: true,
                }),
                &[h, s, b],
            )
            .unwrap();
        let y = g.add(Op::Binary(BinaryOp::Mul), &[ln[0], ln[0]]).unwrap();
        let sm = g.add(Op::Norm(NormOp::Softmax { axis: 1 }), &[x]).unwrap();
        let lsm = g
            .add(Op::Norm(NormOp::LogSoftmax { axis: 2 }), &[x])
            .unwrap();
        let rms = g
            .add(
                Op::Norm(NormOp::RmsNorm {
                    axis: 1,
                    epsilon: 1e-6,
                }),
                &[x, s],
            )
            .unwrap();
        let red = g
            .add(
                Op::Reduce(ReduceOp::Reduce {
                    kind: ReduceKind::Mean,
                    axes: vec![0, 2],
                    keepdims: false,
                }),
                &[x],
            )
            .unwrap();
        let red = g.add(Op::Unary(UnaryOp::Exp), &[red]).unwrap();
        let lse = g
            .add(
                Op::Reduce(ReduceOp::Reduce {
                    kind: ReduceKind::LogSumExp,
                    axes: vec![1],
                    keepdims: true,
                }),
                &[x],
            )
            .unwrap();
        let am = g
            .add(
                Op::Reduce(ReduceOp::ArgMax {
                    axis: 2,
                    keepdims: false,
                    select_last_index: false,
                }),
                &[x],
            )
            .unwrap();
        let x4 = g
            .add(
                Op::Layout(LayoutOp::Reshape {
                    shape: vec![Dim::Fixed(3), Dim::Fixed(4), Dim::Fixed(5), Dim::Fixed(2)],
                }),
                &[x],
            )
            .unwrap();
        let gs = rand_const(&mut g, "gs", &[4], &mut rng);
        let gb = rand_const(&mut g, "gb", &[4], &mut rng);
        let gn = g
            .add(
                Op::Norm(NormOp::GroupNorm {
                    num_groups: 2,
                    epsilon: 1e-5,
                    channels_last: false,
                }),
                &[x4, gs, gb],
            )
            .unwrap();
        let inorm = g
            .add(
                Op::Norm(NormOp::InstanceNorm { epsilon: 1e-5 }),
                &[x4, gs, gb],
            )
            .unwrap();
        let lrn = g
            .add(
                Op::Norm(NormOp::Lrn {
                    size: 3,
                    alpha: 1e-2,
                    beta: 0.75,
                    bias: 1.0,
                    channels_last: false,
                }),
                &[x4],
            )
            .unwrap();
        g.set_outputs(vec![
            y, ln[1], ln[2], sm, lsm, rms, red, lse, am, gn, inorm, lrn,
        ]);
        out.push(("norms".to_string(), g));
    }
    // Channels-last batch norm, LRN and group norm (as the layout choice leaves them), [N, H, W, C].
    {
        let mut g = Graph::new("norms_nhwc");
        let x = g.add_input("x", f32t(&[2, 3, 4, 6]));
        let mut p = vec![];
        for (i, name) in ["scale", "bias", "mean"].iter().enumerate() {
            p.push(rand_const(&mut g, &format!("{name}{i}"), &[6], &mut rng));
        }
        let var = g.add_const("var", Tensor::from_vec(vec![6], (0..6).map(|i| 0.5 + i as f32 * 0.25).collect::<Vec<f32>>()).unwrap());
        let bn = g
            .add(
                Op::Norm(NormOp::BatchNorm { epsilon: 1e-5, channels_last: true }),
                &[x, p[0], p[1], p[2], var],
            )
            .unwrap();
        let lrn = g
            .add(
                Op::Norm(NormOp::Lrn { size: 3, alpha: 1e-2, beta: 0.75, bias: 1.0, channels_last: true }),
                &[x],
            )
            .unwrap();
        let lrn4 = g
            .add(
                Op::Norm(NormOp::Lrn { size: 4, alpha: 2e-2, beta: 0.5, bias: 2.0, channels_last: true }),
                &[bn],
            )
            .unwrap();
        // Group norms over [N, H, W, C]: two groups of three channels, one of six, six of one.
        let mut gns = vec![];
        for groups in [2, 1, 6] {
            gns.push(
                g.add(Op::Norm(NormOp::GroupNorm { num_groups: groups, epsilon: 1e-5, channels_last: true }), &[x, p[0], p[1]])
                    .unwrap(),
            );
        }
        g.set_outputs([vec![bn, lrn, lrn4], gns].concat());
        out.push(("norms_nhwc".to_string(), g));
    }
    // A batch of thin products sharing a 2-D B (`[S, B, E] @ W`, as a sequence-first
    // in-projection), lowered as one product over the batch's rows, with an epilogue.
    {
        let mut g = Graph::new("matmul_shared_b");
        let x = g.add_input("x", f32t(&[2, 5, 8]));
        let w = g.add_input("w", f32t(&[8, 7]));
        let xt = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![1, 0, 2] }), &[x]).unwrap();
        let y = g.add(Op::Linalg(LinalgOp::MatMul), &[xt, w]).unwrap();
        let b = g.add_input("b", f32t(&[7]));
        let z = g.add(Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
        let x3 = g.add_input("x3", f32t(&[3, 2, 3, 8]));
        let y3 = g.add(Op::Linalg(LinalgOp::MatMul), &[x3, w]).unwrap();
        g.set_outputs(vec![z, y3]);
        out.push(("matmul_shared_b".to_string(), g));
    }
    // Attention: 4-D with a float mask and GQA, 3-D causal with a bool mask and a past.
    {
        let mut g = Graph::new("attention4d");
        let q = g.add_input("q", f32t(&[2, 4, 5, 8]));
        let k = g.add_input("k", f32t(&[2, 2, 6, 8]));
        let v = g.add_input("v", f32t(&[2, 2, 6, 3]));
        let m = g.add_input("m", f32t(&[5, 6]));
        let op = NnOp::Attention {
            q_num_heads: 0,
            kv_num_heads: 0,
            scale: None,
            is_causal: false,
            softcap: 0.0,
            qk_matmul_output_mode: 0,
            softmax_precision: None,
            left_window: -1,
            right_window: -1,
            has_mask: true,
            has_past: false,
            has_nonpad: false,
            zero_nan_rows: false,
        };
        let outs = g.add_node("att", Op::Nn(op), &[q, k, v, m]).unwrap();
        let y = g
            .add(Op::Binary(BinaryOp::Add), &[outs[0], q])
            .unwrap_or(outs[0]);
        g.set_outputs(vec![y, outs[1]]);
        out.push(("attention4d".to_string(), g));
    }
    {
        let mut g = Graph::new("attention3d");
        let q = g.add_input("q", f32t(&[1, 4, 12]));
        let k = g.add_input("k", f32t(&[1, 4, 6]));
        let v = g.add_input("v", f32t(&[1, 4, 6]));
        let m = g.add_input("m", TensorType::fixed(DType::Bool, &[4, 7]));
        let pk = g.add_input("pk", f32t(&[1, 2, 3, 3]));
        let pv = g.add_input("pv", f32t(&[1, 2, 3, 3]));
        let op = NnOp::Attention {
            q_num_heads: 4,
            kv_num_heads: 2,
            scale: Some(0.3),
            is_causal: true,
            softcap: 2.0,
            qk_matmul_output_mode: 0,
            softmax_precision: None,
            left_window: -1,
            right_window: -1,
            has_mask: true,
            has_past: true,
            has_nonpad: false,
            zero_nan_rows: false,
        };
        let outs = g
            .add_node("att", Op::Nn(op), &[q, k, v, m, pk, pv])
            .unwrap();
        g.set_outputs(vec![outs[0], outs[1], outs[2]]);
        out.push(("attention3d".to_string(), g));
    }
    // Re-indexing chains into an elementwise output: concat, pad, slice, gather, expand.
    {
        let mut g = Graph::new("reindex");
        let x = g.add_input("x", f32t(&[3, 4]));
        let y = g.add_input("y", f32t(&[3, 2]));
        let i = g.add_const(
            "i",
            Tensor::from_vec(vec![2, 2], vec![2i64, -1, 0, 1]).unwrap(),
        );
        let c = g
            .add(Op::Layout(LayoutOp::Concat { axis: 1 }), &[x, y])
            .unwrap();
        let fill = g.add_const("f", Tensor::scalar(0.5f32));
        let p = g
            .add(
                Op::Layout(LayoutOp::Pad {
                    pads: vec![1, 0, 0, 2],
                    mode: PadMode::Constant,
                }),
                &[c, fill],
            )
            .unwrap();
        let pr = g
            .add(
                Op::Layout(LayoutOp::Pad {
                    pads: vec![2, 1, 1, 3],
                    mode: PadMode::Reflect,
                }),
                &[x, fill],
            )
            .unwrap();
        let s = g
            .add(
                Op::Layout(LayoutOp::Slice {
                    axes: vec![0, 1],
                    starts: vec![SliceBound::Index(-1), SliceBound::Index(1)],
                    ends: vec![SliceBound::Index(0), SliceBound::Index(100)],
                    steps: vec![-1, 2],
                }),
                &[p],
            )
            .unwrap();
        let gt = g
            .add(Op::Index(IndexOp::Gather { axis: 1 }), &[x, i])
            .unwrap();
        let e = g
            .add(
                Op::Layout(LayoutOp::Expand {
                    shape: vec![Dim::Fixed(2), Dim::Fixed(3), Dim::Fixed(2), Dim::Fixed(2)],
                }),
                &[gt],
            )
            .unwrap();
        let t = g
            .add(
                Op::Layout(LayoutOp::Tile {
                    repeats: vec![2, 1],
                }),
                &[y],
            )
            .unwrap();
        g.set_outputs(vec![s, pr, e, t]);
        out.push(("reindex".to_string(), g));
    }
    out
}

fn inputs_for(g: &Graph, rng: &mut impl Rng) -> Vec<Tensor> {
    g.inputs()
        .iter()
        .map(|&v| {
            let ty = &g.value(v).ty;
            random_like(ty.dtype, &ty.fixed_shape().unwrap(), rng)
        })
        .collect()
}

#[test]
fn built_graphs_lower_and_match() {
    let mut st = Stats::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for (name, g) in built_graphs() {
        let inputs = inputs_for(&g, &mut rng);
        // As built, and after the -O3 pipeline (fusion decisions change the groups).
        check_graph(&name, &g, &inputs, &mut st);
        let mut o = g.clone();
        optimize(&mut o).unwrap();
        check_graph(&format!("{name} (O3)"), &o, &inputs, &mut st);
    }
    report("built graphs", &st);
    assert!(
        st.mismatches.is_empty(),
        "{} mismatches",
        st.mismatches.len()
    );
    let fb: usize = st.fallback_ops.values().sum();
    assert_eq!(
        fb, 0,
        "every group of the built graphs lowers: {:?}",
        st.fallback_ops
    );
}

/// Each node of the built graphs lowered alone, and the whole graph as one kernel.
#[test]
fn single_nodes_and_whole_graphs_lower() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mut bad = Vec::new();
    for (name, g) in built_graphs() {
        let inputs = inputs_for(&g, &mut rng);
        let env = reference_env(&g, &inputs).unwrap();
        let mut sets: Vec<Vec<NodeId>> = (0..g.nodes().len())
            .map(|i| vec![NodeId(i as u32)])
            .collect();
        sets.push((0..g.nodes().len()).map(|i| NodeId(i as u32)).collect());
        for (si, set) in sets.iter().enumerate() {
            let lw = match lower_nodes(&g, set, &format!("{name}_{si}")) {
                Ok(lw) => lw,
                Err(e) => {
                    bad.push(format!("{name} set {si}: {e}"));
                    continue;
                }
            };
            if let Err(e) = check_kernel(&g, &lw) {
                bad.push(format!("{name} set {si}: {e}"));
            }
            match run_lowered(&g, &lw, &env) {
                Ok(outs) => {
                    for (&v, t) in lw.outputs.iter().zip(&outs) {
                        if let Some(m) = compare(&env[&v], t) {
                            bad.push(format!("{name} set {si} value '{}': {m}", g.value(v).name));
                        }
                    }
                }
                Err(e) => bad.push(format!("{name} set {si}: {e}")),
            }
        }
    }
    for b in &bad {
        println!("FAIL {b}");
    }
    assert!(bad.is_empty(), "{} failures", bad.len());
}

/// The loop structure schedules rely on: GEMM anchors become `Stmt::Gemm` with the bias and
/// activation in the epilogue; an elementwise kernel is one nest whose innermost loop runs
/// along the contiguous output dimension; reductions keep their accumulators in variables.
#[test]
fn kernel_structure_is_predictable() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut g = Graph::new("s");
    let x = g.add_input("x", f32t(&[4, 6, 16]));
    let w = rand_const(&mut g, "w", &[16, 8], &mut rng);
    let b = rand_const(&mut g, "b", &[8], &mut rng);
    let h = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
    let h = g.add(Op::Binary(BinaryOp::Add), &[h, b]).unwrap();
    let h = g.add(Op::Unary(UnaryOp::Relu), &[h]).unwrap();
    let e = g.add(Op::Unary(UnaryOp::Tanh), &[x]).unwrap();
    g.set_outputs(vec![h, e]);
    let mm = lower_nodes(&g, &[NodeId(0), NodeId(1), NodeId(2)], "mm").unwrap();
    assert_eq!(
        mm.inputs,
        vec![x, w, b]
            .into_iter()
            .filter(|v| g.const_value(*v).is_none() || true)
            .collect::<Vec<_>>()
    );
    assert_eq!(mm.outputs, vec![h]);
    let gemm = mm
        .kernel
        .body
        .iter()
        .find_map(|s| {
            if let Stmt::Gemm(gm) = s {
                Some(gm)
            } else {
                None
            }
        })
        .expect("a gemm stmt");
    // 4 products of 6 rows sharing W: one product over the 24 rows.
    assert_eq!((gemm.batch, gemm.m, gemm.n, gemm.k), (1, 24, 8, 16));
    assert_eq!(
        gemm.epilogue
            .iter()
            .filter(|s| matches!(s, Stmt::Store { .. }))
            .count(),
        1
    );
    let ew = lower_nodes(&g, &[NodeId(3)], "ew").unwrap();
    let loops = ew.kernel.loops();
    assert_eq!(
        loops.iter().map(|l| l.extent).collect::<Vec<_>>(),
        vec![4, 6, 16]
    );
    assert_eq!(
        loops
            .iter()
            .map(|l| ew.kernel.var_info(l.var).name.clone())
            .collect::<Vec<_>>(),
        vec!["i0", "i1", "i2"]
    );
    let inner = loops[2];
    match &inner.body[..] {
        [Stmt::Store { index, .. }] => assert_eq!(index.last(), Some(&Expr::Var(inner.var))),
        other => panic!("unexpected innermost body {other:?}"),
    }
}

#[test]
fn unsupported_and_symbolic_nodes_are_reported() {
    let mut g = Graph::new("u");
    let x = g.add_input("x", f32t(&[4, 5]));
    let t = g
        .add_node(
            "topk",
            Op::Reduce(ReduceOp::TopK {
                axis: 1,
                k: 2,
                largest: true,
                sorted: true,
            }),
            &[x],
        )
        .unwrap();
    g.set_outputs(t);
    match lower_nodes(&g, &[NodeId(0)], "k") {
        Err(LowerError::Unsupported { node, op, .. }) => {
            assert_eq!(node, "topk");
            assert_eq!(op, "topk");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let mut g = Graph::new("s");
    let b = g.syms.free("batch");
    let x = g.add_input(
        "x",
        TensorType::new(DType::F32, vec![Dim::Sym(b), Dim::Fixed(3)]),
    );
    let y = g.add(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    g.set_outputs(vec![y]);
    assert!(matches!(
        lower_nodes(&g, &[NodeId(0)], "k"),
        Err(LowerError::Symbolic { .. })
    ));
    assert!(matches!(
        lower_nodes(&g, &[], "k"),
        Err(LowerError::Invalid(_))
    ));
}

/// A conv (or matmul) followed by an activation is one GEMM whose epilogue writes the
/// activation's output: no scratch copy of the anchor's result.
#[test]
fn activation_fuses_into_gemm_epilogue() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for (xs, ws) in [([1usize, 3, 16, 16], [8usize, 3, 3, 3]), ([2, 4, 8, 8], [8, 4, 3, 3])] {
        let mut g = Graph::new("conv_relu");
        let x = g.add_input("x", f32t(&xs));
        let wt = rand_const(&mut g, "w", &ws, &mut rng);
        let b = rand_const(&mut g, "b", &[ws[0]], &mut rng);
        let w = window(&[3, 3], &[1, 1], &[1, 1], Padding::Explicit(vec![1, 1, 1, 1]));
        let c = g.add(Op::Linalg(LinalgOp::Conv { window: w, group: 1, channels_last: false }), &[x, wt, b]).unwrap();
        let r = g.add(Op::Unary(UnaryOp::Relu), &[c]).unwrap();
        g.set_outputs(vec![r]);
        let nodes: Vec<NodeId> = g.node_ids().collect();
        let lw = lower_nodes(&g, &nodes, "conv_relu").unwrap();
        let text = lw.kernel.to_string();
        assert!(!lw.kernel.buffers.iter().any(|b| b.scope == Scope::Local), "scratch buffer in:\n{text}");
        assert_eq!(lw.kernel.body.len(), 1, "one gemm statement:\n{text}");
        check_kernel(&g, &lw).unwrap();
    }
}
