//! `tilec run MODEL`: run a model on given or random inputs, summarize, save and check
//! the outputs.

use super::{
    check_dims, dim_params, graph_of, input_names, load_model, non_tensor_kind, parse_dim, parse_family,
    parse_named_file, parse_tolerance, prepare_out_dir, render_error, MAX_BENCH_RUNS, MAX_THREADS,
};
use crate::BackendArg;
use anyhow::{anyhow, bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;
use tilec::compare::compare;
use tilec::ir::{Dim, Graph, SymbolId, TensorType};
use tilec::tensor_io::{self, NpyStored};
use tilec::{DType, ImportOptions, Tensor};

/// Random inputs larger than this are refused (they would exhaust memory).
const MAX_RANDOM_ELEMENTS: usize = 1 << 30;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The ONNX model file.
    pub model: PathBuf,
    /// Give an input's value: a .npy file or a serialized ONNX TensorProto (.pb).
    #[arg(long = "input", short = 'i', value_name = "NAME=FILE", value_parser = parse_named_file)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Write each output to DIR/<output name>.npy (the directory is created; it is checked to
    /// be a writable directory before the model is compiled).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Where to run the model.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
    /// Time N more runs after the first and print their median, min and max latency
    /// (0 to 1,000,000; 0 times none).
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MAX_BENCH_RUNS as u64))]
    pub bench: Option<usize>,
    /// Print a per-kernel profile (time, share, bytes, FLOPs, achieved GB/s and GFLOP/s).
    #[arg(long)]
    pub profile: bool,
    /// With --profile: write the profiled calls as a Chrome trace (JSON; opens in Perfetto or
    /// chrome://tracing).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// With --profile: write a roofline plot (SVG) with each kernel as a point under the
    /// memory ceiling (measured here with a copy on the CPU) and the compute ceiling.
    #[arg(long, value_name = "FILE")]
    pub roofline: Option<PathBuf>,
    /// Profile (as --profile) and write everything into DIR: profile.txt (the tables),
    /// profile.json (per kernel: time, bytes, FLOPs, family, parameters, launch, registers,
    /// what binds it and its fraction of the roofline; time by kind; the ceilings), trace.json
    /// (Chrome trace) and roofline.svg. The ceilings are measured on the device that runs.
    #[arg(long, value_name = "DIR")]
    pub profile_dir: Option<PathBuf>,
    /// Print compilation and memory statistics (kernels, fallbacks, arena vs intermediates).
    #[arg(long)]
    pub stats: bool,
    /// Print one JSON object on the last line of stdout: the timings, statistics and checks,
    /// `"ok"`, and on failure `"error"` (for scripts).
    #[arg(long)]
    pub json: bool,
    /// Check every compiled kernel against the reference interpreter on the same inputs and
    /// report the steps that differ (for debugging the compiler).
    #[arg(long)]
    pub check_kernels: bool,
    /// Threads of the compiled code, 1 to 4096 (default: all cores).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_THREADS as u64))]
    pub threads: Option<usize>,
    /// Optimization level of the compiled path.
    #[arg(short = 'O', default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub opt_level: u8,
    /// Compute 3x3 convolutions directly instead of with Winograd transforms (CPU): slower,
    /// but rounded like the reference (Winograd's errors reach about 1e-5 of the outputs).
    #[arg(long)]
    pub no_winograd: bool,
    /// Force a kernel family for an op (`conv`, `matmul`, ...), a kernel name or `*`, e.g.
    /// --family conv=cpu.direct (repeatable; `tilec explain` lists the families).
    #[arg(long = "family", value_name = "OP=NAME", value_parser = parse_family)]
    pub families: Vec<(String, String)>,
    /// Ignore the tuning database (`tilec tune`): every kernel takes its family's heuristic
    /// parameters.
    #[arg(long)]
    pub no_tuning: bool,
    /// With --target cuda: let f32 matrix products run on the tensor cores as tf32 (10-bit
    /// mantissas, as torch.backends.cuda.matmul.allow_tf32). Off: f32 stays exact.
    #[arg(long = "allow-tf32")]
    pub allow_tf32: bool,
    /// Run an f32 model in 16 bits: matrix products, convolutions, attention, normalizations
    /// and elementwise work on f16 or bf16 tensors (their kernels accumulate in f32), while
    /// reductions, exp, log and pow stay f32. Inputs and outputs stay f32; with --compare-ref
    /// the outputs are compared with the f32 model's (raise --rtol/--atol to about 1e-2).
    #[arg(long, value_enum, value_name = "TYPE")]
    pub dtype: Option<HalfArg>,
    /// Fix a symbolic dimension (an ONNX dim_param) to a size, e.g. --dim batch=8.
    /// Symbolic dimensions not fixed here or by a given input default to 1.
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
    pub dims: Vec<(String, usize)>,
    /// Seed of the random input values.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compare an output with an expected value (.npy or .pb); exit non-zero on mismatch.
    #[arg(long = "expect", value_name = "NAME=FILE", value_parser = parse_named_file)]
    pub expects: Vec<(String, PathBuf)>,
    /// An ONNX test data directory: inputs not given with --input are read from
    /// DIR/input_<i>.pb, and output i is compared with DIR/output_<i>.pb.
    #[arg(long, value_name = "DIR")]
    pub expect_dir: Option<PathBuf>,
    /// Relative tolerance of --expect/--expect-dir comparisons, finite and non-negative (at
    /// least 1/64 for bfloat16).
    #[arg(long, default_value_t = 1e-3, value_parser = parse_tolerance, allow_hyphen_values = true)]
    pub rtol: f64,
    /// Absolute tolerance of --expect/--expect-dir comparisons, finite and non-negative.
    #[arg(long, default_value_t = 1e-5, value_parser = parse_tolerance, allow_hyphen_values = true)]
    pub atol: f64,
    /// Where compiled code runs: the host CPU or an NVIDIA GPU (CUDA driver and NVRTC are
    /// loaded at run time).
    #[arg(long, value_enum, default_value_t = TargetArg::Cpu)]
    pub target: TargetArg,
    /// The CUDA device ordinal (with --target cuda).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Also run the reference interpreter on the same inputs and compare every output with it
    /// (rtol/atol as for --expect); exit non-zero on mismatch.
    #[arg(long)]
    pub compare_ref: bool,
}

/// A 16-bit type for `--dtype`.
#[derive(clap::ValueEnum, Copy, Clone, Debug, PartialEq, Eq)]
pub enum HalfArg {
    F16,
    Bf16,
}

impl HalfArg {
    pub fn dtype(self) -> DType {
        match self {
            HalfArg::F16 => DType::F16,
            HalfArg::Bf16 => DType::BF16,
        }
    }
}

/// The graph in 16 bits for `--dtype` (unchanged without it).
fn in_precision(g: &tilec::Graph, d: Option<HalfArg>) -> Result<tilec::Graph> {
    let Some(d) = d else { return Ok(g.clone()) };
    let (h, n) = tilec_opt::passes::convert_precision(g, d.dtype()).context("--dtype")?;
    println!("note: --dtype {}: {n} of {} nodes run in {} (inputs and outputs stay f32)", d.dtype().name(), g.nodes().len(), d.dtype().name());
    Ok(h)
}

/// Where compiled code runs.
#[derive(clap::ValueEnum, Copy, Clone, Debug, PartialEq, Eq)]
pub enum TargetArg {
    /// The host CPU.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
    }
}

fn type_str(g: &Graph, ty: &TensorType) -> String {
    let d: Vec<String> = ty.shape.iter().map(|&d| g.syms.display(d)).collect();
    format!("{}[{}]", ty.dtype, d.join(", "))
}

fn tensor_type_str(t: &Tensor) -> String {
    let d: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", t.dtype(), d.join(", "))
}

fn is_free(g: &Graph, s: SymbolId) -> bool {
    g.syms.symbols.get(s.0 as usize).is_some_and(|x| x.expr.is_none())
}

/// Checks a given input against its type, binding the free symbols of the type.
fn check_input(
    g: &Graph,
    name: &str,
    ty: &TensorType,
    t: &Tensor,
    source: &str,
    syms: &mut HashMap<SymbolId, usize>,
) -> Result<()> {
    let mismatch = |why: String| {
        anyhow!("input '{name}' (from {source}): expected {}, got {}: {why}", type_str(g, ty), tensor_type_str(t))
    };
    if t.dtype() != ty.dtype {
        return Err(mismatch(format!("wrong dtype (expected {}, got {})", ty.dtype, t.dtype())));
    }
    if t.rank() != ty.rank() {
        return Err(mismatch(format!("wrong rank (expected {}, got {})", ty.rank(), t.rank())));
    }
    for (k, (&d, &n)) in ty.shape.iter().zip(t.shape()).enumerate() {
        match d {
            Dim::Fixed(m) if m != n => return Err(mismatch(format!("dimension {k} must be {m}, is {n}"))),
            Dim::Fixed(_) => {}
            Dim::Sym(s) => match syms.get(&s).copied().or_else(|| g.syms.eval(d, syms)) {
                Some(m) if m != n => {
                    return Err(mismatch(format!(
                        "dimension {k} ('{}') is {m} from another input, here {n}",
                        g.syms.display(d)
                    )))
                }
                Some(_) => {}
                None => {
                    syms.insert(s, n);
                }
            },
        }
    }
    Ok(())
}

/// A tensor of random values: floats uniform in [-1, 1), integers in [0, 4), bools.
fn random_tensor(dtype: DType, shape: Vec<usize>, rng: &mut StdRng) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = if dtype.is_float() {
        (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
    } else if dtype.is_bool() {
        (0..n).map(|_| if rng.gen_bool(0.5) { 1.0 } else { 0.0 }).collect()
    } else {
        (0..n).map(|_| rng.gen_range(0..4) as f64).collect()
    };
    Ok(Tensor::from_f64s(dtype, shape, &vals)?)
}

/// Compact number formatting for summaries.
fn num(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else if x == 0.0 || (1e-4..1e6).contains(&x.abs()) {
        let s = format!("{x:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s.is_empty() || s == "-" {
            "0".into()
        } else {
            s.to_string()
        }
    } else {
        format!("{x:.4e}")
    }
}

/// `min .. max .. mean ..` and the first values of a tensor.
fn summary(t: &Tensor) -> String {
    const SHOW: usize = 8;
    if t.numel() == 0 {
        return "(empty)".to_string();
    }
    let mut s = String::new();
    if t.dtype().is_float() {
        let v = t.to_f64_vec();
        let fin: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        let nan = v.iter().filter(|x| x.is_nan()).count();
        let inf = v.iter().filter(|x| x.is_infinite()).count();
        if !fin.is_empty() {
            let min = fin.iter().copied().fold(f64::INFINITY, f64::min);
            let max = fin.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mean = fin.iter().sum::<f64>() / fin.len() as f64;
            s += &format!("min {} max {} mean {}", num(min), num(max), num(mean));
        }
        if nan > 0 {
            s += &format!(" nan {nan}");
        }
        if inf > 0 {
            s += &format!(" inf {inf}");
        }
        let first: Vec<String> = v.iter().take(SHOW).map(|&x| num(x)).collect();
        s += &format!("  [{}{}]", first.join(", "), if v.len() > SHOW { ", ..." } else { "" });
    } else if t.dtype().is_bool() {
        let v = t.to_i64_vec();
        let trues = v.iter().filter(|&&x| x != 0).count();
        let first: Vec<&str> = v.iter().take(SHOW).map(|&x| if x != 0 { "true" } else { "false" }).collect();
        s += &format!(
            "true {trues} of {}  [{}{}]",
            v.len(),
            first.join(", "),
            if v.len() > SHOW { ", ..." } else { "" }
        );
    } else {
        // u64 beyond i64::MAX would wrap in to_i64_vec; show those through f64.
        let (first, min, max, mean) = if t.dtype() == DType::U64 {
            let v = t.to_f64_vec();
            let first: Vec<String> = v.iter().take(SHOW).map(|&x| format!("{x}")).collect();
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (first, format!("{min}"), format!("{max}"), v.iter().sum::<f64>() / v.len() as f64)
        } else {
            let v = t.to_i64_vec();
            let first: Vec<String> = v.iter().take(SHOW).map(|x| x.to_string()).collect();
            let min = v.iter().copied().min().unwrap_or(0);
            let max = v.iter().copied().max().unwrap_or(0);
            (first, min.to_string(), max.to_string(), v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64)
        };
        s += &format!(
            "min {min} max {max} mean {}  [{}{}]",
            num(mean),
            first.join(", "),
            if t.numel() > SHOW { ", ..." } else { "" }
        );
    }
    s
}

/// A file name for an output: its ONNX name with unusual characters replaced.
fn file_stem(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '_' })
        .collect();
    let s = s.trim_start_matches('.').to_string();
    if s.is_empty() {
        "output".to_string()
    } else {
        s
    }
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for k in (0..shape.len()).rev() {
        let d = shape[k].max(1);
        idx[k] = i % d;
        i /= d;
    }
    idx
}

/// What `--json` prints.
type Report = serde_json::Map<String, serde_json::Value>;

/// Adds the fields of a JSON object to the report.
fn add(report: &mut Report, fields: serde_json::Value) {
    if let serde_json::Value::Object(m) = fields {
        report.extend(m);
    }
}

/// Runs `tilec run`; with `--json`, the report (or the error) is printed as one JSON object
/// whatever the outcome.
pub fn run(a: &RunArgs) -> Result<()> {
    let mut report = serde_json::Map::new();
    let r = run_model(a, &mut report);
    if a.json {
        report.insert("ok".into(), r.is_ok().into());
        if let Err(e) = &r {
            report.insert("error".into(), render_error(e).into());
        }
        println!("{}", serde_json::Value::Object(report));
    }
    r
}

/// `tilec profile`: `run` with the profile written into a directory (by default the model's
/// path with the extension `.profile`).
pub fn profile_cmd(mut a: RunArgs) -> Result<()> {
    a.profile = true;
    if a.profile_dir.is_none() {
        a.profile_dir = Some(a.model.with_extension("profile"));
    }
    run(&a)
}

/// The work of [`run`]; statistics for `--json` go into `report`.
fn run_model(a: &RunArgs, report: &mut Report) -> Result<()> {
    let model = load_model(&a.model)?;
    let g = graph_of(&model)?;
    let in_names = input_names(g);
    let out_names: Vec<String> = g.output.iter().map(|o| o.name.clone()).collect();
    let dim_values = check_dims(g, &a.dims)?;

    // Only tensors can be read from files (a sequence's .pb would decode as nonsense).
    let tensor_only = |what: &str, name: &str, vi: Option<&tilec::onnx::proto::ValueInfoProto>| -> Result<()> {
        match vi.and_then(non_tensor_kind) {
            Some(kind) => bail!("{what} '{name}' is {kind}, not a tensor; tilec supports only tensor values"),
            None => Ok(()),
        }
    };
    let input_info = |name: &str| g.input.iter().find(|v| v.name == name);
    let output_info = |i: usize| g.output.get(i);

    // Given inputs.
    let mut provided: HashMap<String, Tensor> = HashMap::new();
    let mut sources: HashMap<String, String> = HashMap::new();
    for (name, file) in &a.inputs {
        if !in_names.contains(name) {
            bail!(
                "--input {name}={}: the model has no input '{name}' (its inputs: {})",
                file.display(),
                list(&in_names)
            );
        }
        if provided.contains_key(name) {
            bail!("--input {name} is given more than once");
        }
        tensor_only("input", name, input_info(name))?;
        let t = tensor_io::read_tensor(file).with_context(|| format!("input '{name}'"))?;
        provided.insert(name.clone(), t);
        sources.insert(name.clone(), file.display().to_string());
    }

    // Expected outputs.
    let mut expected: Vec<Option<(Tensor, String)>> = vec![None; out_names.len()];
    if let Some(dir) = &a.expect_dir {
        if !dir.is_dir() {
            bail!("--expect-dir {}: not a directory", dir.display());
        }
        for (i, name) in in_names.iter().enumerate() {
            let p = dir.join(format!("input_{i}.pb"));
            if !provided.contains_key(name) && p.is_file() {
                tensor_only("input", name, input_info(name))?;
                let t = tensor_io::read_tensor(&p).with_context(|| format!("input '{name}'"))?;
                provided.insert(name.clone(), t);
                sources.insert(name.clone(), p.display().to_string());
            }
        }
        let mut found = 0;
        for (i, name) in out_names.iter().enumerate() {
            let p = dir.join(format!("output_{i}.pb"));
            if p.is_file() {
                tensor_only("output", name, output_info(i))?;
                let t = tensor_io::read_tensor(&p).with_context(|| format!("expected value of output '{name}'"))?;
                expected[i] = Some((t, p.display().to_string()));
                found += 1;
            }
        }
        if found == 0 {
            bail!("--expect-dir {}: no output_<i>.pb files in it", dir.display());
        }
    }
    for (name, file) in &a.expects {
        let i = out_names.iter().position(|o| o == name).ok_or_else(|| {
            anyhow!(
                "--expect {name}={}: the model has no output '{name}' (its outputs: {})",
                file.display(),
                list(&out_names)
            )
        })?;
        tensor_only("output", name, output_info(i))?;
        let t = tensor_io::read_tensor(file).with_context(|| format!("expected value of output '{name}'"))?;
        expected[i] = Some((t, file.display().to_string()));
    }

    // Import (binding given inputs the importer needs as constants).
    let opts = ImportOptions { dim_values: dim_values.clone(), ..Default::default() };
    let all_provided = provided.clone();
    let (graph, bound) = super::import(&model, opts, &provided)?;
    for b in &bound {
        println!("note: input '{b}' is compiled in as a constant (the importer needs its value)");
    }

    // Feeds: given inputs first (they bind symbolic dimensions), then random ones.
    let mut syms: HashMap<SymbolId, usize> = HashMap::new();
    let mut feeds: HashMap<String, Tensor> = HashMap::new();
    for &v in graph.inputs() {
        let val = graph.value(v);
        if let Some(t) = provided.remove(&val.name) {
            let src = sources.get(&val.name).map(String::as_str).unwrap_or("?");
            check_input(&graph, &val.name, &val.ty, &t, src, &mut syms)?;
            println!("input '{}': {} from {src}", val.name, tensor_type_str(&t));
            feeds.insert(val.name.clone(), t);
        }
    }
    let named_dims = dim_params(g);
    let mut rng = StdRng::seed_from_u64(a.seed);
    for &v in graph.inputs() {
        let val = graph.value(v);
        if feeds.contains_key(&val.name) {
            continue;
        }
        let mut shape = Vec::with_capacity(val.ty.rank());
        for &d in &val.ty.shape {
            shape.push(match d {
                Dim::Fixed(n) => n,
                Dim::Sym(s) => match syms.get(&s).copied().or_else(|| graph.syms.eval(d, &syms)) {
                    Some(n) => n,
                    None if is_free(&graph, s) => {
                        let name = graph.syms.name(s).to_string();
                        let how = if named_dims.contains(&name) {
                            format!("choose with --dim {name}=N")
                        } else {
                            "an unnamed dimension: give the input with --input to choose".to_string()
                        };
                        println!("note: dimension '{name}' of input '{}' = 1 (default; {how})", val.name);
                        syms.insert(s, 1);
                        1
                    }
                    None => {
                        bail!("input '{}': cannot choose a size for dimension '{}'", val.name, graph.syms.display(d))
                    }
                },
            });
        }
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        match n {
            Some(n) if n <= MAX_RANDOM_ELEMENTS => {}
            _ => bail!(
                "input '{}': a random {}{shape:?} is too large; give it with --input or pick smaller sizes with --dim",
                val.name,
                val.ty.dtype
            ),
        }
        let t = random_tensor(val.ty.dtype, shape, &mut rng)?;
        println!("input '{}': {} random (seed {})", val.name, tensor_type_str(&t), a.seed);
        feeds.insert(val.name.clone(), t);
    }

    // Run.
    let backend: tilec::Backend = a.backend.into();
    if a.target == TargetArg::Cuda && backend == tilec::Backend::Ref {
        bail!("--target cuda runs compiled code; it cannot be combined with --backend ref");
    }
    if let Some(dir) = &a.out {
        prepare_out_dir(dir)?;
    }
    let ref_feeds = if a.compare_ref { Some(feeds.clone()) } else { None };
    let outs = match backend {
        tilec::Backend::Ref => {
            let start = Instant::now();
            let outs = tilec::run(&in_precision(&graph, a.dtype)?, feeds, backend)
                .with_context(|| format!("running the model on the {backend} backend"))?;
            println!("ran on the {backend} backend in {:.3} s", start.elapsed().as_secs_f64());
            outs
        }
        tilec::Backend::Cpu => {
            // Specialize: every free symbol bound by the inputs becomes a fixed size.
            let mut dims = dim_values.clone();
            for (s, n) in &syms {
                if is_free(&graph, *s) {
                    dims.insert(graph.syms.name(*s).to_string(), *n);
                }
            }
            let (spec, _) = if dims.len() > dim_values.len() || graph.syms.symbols.iter().any(|s| s.expr.is_none()) {
                super::import(&model, ImportOptions { dim_values: dims, ..Default::default() }, &all_provided)?
            } else {
                (graph.clone(), vec![])
            };
            let spec = in_precision(&spec, a.dtype)?;
            let ordered: Vec<Tensor> = spec
                .inputs()
                .iter()
                .map(|&v| {
                    let name = &spec.value(v).name;
                    feeds.get(name).cloned().ok_or_else(|| anyhow!("input '{name}' is missing"))
                })
                .collect::<Result<_>>()?;
            if a.target == TargetArg::Cuda {
                run_cuda(a, &spec, &ordered, report)?
            } else {
                run_compiled(a, &spec, &ordered, report)?
            }
        }
    };
    if outs.len() != out_names.len() {
        bail!("the graph produced {} outputs, the model declares {}", outs.len(), out_names.len());
    }

    for (name, t) in out_names.iter().zip(&outs) {
        println!("output '{name}': {}  {}", tensor_type_str(t), summary(t));
    }
    if a.dtype == Some(HalfArg::F16) && outs.iter().any(|t| t.dtype().is_float() && t.to_f64_vec().iter().any(|x| !x.is_finite())) {
        println!("note: --dtype f16: an output is not finite; the model's values may exceed f16's range (65504): --dtype bf16 keeps f32's range");
    }

    if let Some(dir) = &a.out {
        let mut used = HashSet::new();
        for (i, (name, t)) in out_names.iter().zip(&outs).enumerate() {
            let mut stem = file_stem(name);
            if !used.insert(stem.clone()) {
                stem = format!("{stem}_{i}");
                used.insert(stem.clone());
            }
            let p = dir.join(format!("{stem}.npy"));
            let how = tensor_io::write_npy(&p, t).with_context(|| format!("output '{name}'"))?;
            match how {
                NpyStored::Exact => println!("wrote {}", p.display()),
                NpyStored::AsF32 => println!("wrote {} (as float32: NumPy has no {})", p.display(), t.dtype()),
            }
        }
    }

    let mut expected = expected;
    if let Some(feeds) = ref_feeds {
        let start = Instant::now();
        let want = tilec::run(&graph, feeds, tilec::Backend::Ref).context("running the reference interpreter for --compare-ref")?;
        let of = if a.dtype.is_some() { " on the f32 model" } else { "" };
        println!("ran the reference interpreter{of} in {:.3} s (--compare-ref)", start.elapsed().as_secs_f64());
        for (i, t) in want.into_iter().enumerate() {
            if i < expected.len() && expected[i].is_none() {
                expected[i] = Some((t, "the reference interpreter".to_string()));
            } else if i < expected.len() {
                // Both given: the reference interpreter is checked as an extra output line.
                if let Some((e, src)) = &expected[i] {
                    if let Err(m) = compare(e, &t, a.rtol, a.atol) {
                        println!("note: the reference interpreter differs from {src}: {m}");
                    }
                }
            }
        }
    }
    let mut checked = 0;
    let mut bad = 0;
    // Outputs against the shapes the model declares (a warning, as onnxruntime gives), and a
    // mismatch of a checked output, so that a shape wrong in the same way on both sides of a
    // comparison is still caught.
    let mut known_dims = dim_values.clone();
    for (s, n) in &syms {
        known_dims.insert(graph.syms.name(*s).to_string(), *n);
    }
    for (i, (name, t)) in out_names.iter().zip(&outs).enumerate() {
        let Some(want) = output_info(i).and_then(|vi| super::declared_shape(vi, &known_dims)) else { continue };
        let fits = want.len() == t.rank() && want.iter().zip(t.shape()).all(|(w, &d)| w.map_or(true, |w| w == d));
        if !fits {
            let w: Vec<String> = want.iter().map(|d| d.map_or("?".to_string(), |n| n.to_string())).collect();
            let msg = format!("the model declares shape [{}], got {:?}", w.join(", "), t.shape());
            if expected[i].is_some() {
                bad += 1;
                println!("check '{name}': MISMATCH: {msg}");
            } else {
                println!("warning: output '{name}': {msg}");
            }
        }
    }
    let mut max_abs = 0.0f64;
    let mut max_rel = 0.0f64;
    let mut nonfinite = 0;
    for ((name, t), exp) in out_names.iter().zip(&outs).zip(&expected) {
        let Some((e, src)) = exp else { continue };
        checked += 1;
        // bfloat16 carries 8 significant bits: as ONNX's own test runner does, compare it
        // with a relative tolerance of at least 1/64.
        let rtol = if e.dtype() == DType::BF16 { a.rtol.max(1.0 / 64.0) } else { a.rtol };
        match compare(e, t, rtol, a.atol) {
            Err(m) => {
                bad += 1;
                println!("check '{name}' against {src}: MISMATCH: {m}");
            }
            Ok(c) => {
                max_abs = max_abs.max(c.max_abs);
                max_rel = max_rel.max(c.max_rel);
                nonfinite += c.nonfinite_mismatches;
                let mut errs = format!("max abs err {}, max rel err {}", num(c.max_abs), num(c.max_rel));
                if c.nonfinite_mismatches > 0 {
                    // The error statistics only measure finite pairs: say what they miss.
                    errs = format!(
                        "{} where a NaN or infinity faces another value; {errs} over the finite ones",
                        c.nonfinite_mismatches
                    );
                }
                if c.ok() {
                    println!("check '{name}' against {src}: ok ({errs}; rtol {rtol}, atol {})", a.atol);
                } else {
                    bad += 1;
                    let first = match c.first_mismatch {
                        Some((i, x, y)) => {
                            format!("; first at {:?}: expected {}, got {}", unravel(i, t.shape()), num(x), num(y))
                        }
                        None => String::new(),
                    };
                    println!(
                        "check '{name}' against {src}: MISMATCH: {}/{} elements differ ({errs}; rtol {}, atol {}){first}",
                        c.mismatches, c.count, rtol, a.atol
                    );
                }
            }
        }
    }
    report.insert("checked".into(), checked.into());
    report.insert("mismatched".into(), bad.into());
    report.insert("max_abs_err".into(), max_abs.into());
    report.insert("max_rel_err".into(), max_rel.into());
    report.insert("nonfinite_mismatches".into(), nonfinite.into());
    if bad > 0 {
        bail!("{bad} of {checked} checked outputs differ from their expected values");
    }
    if checked > 0 {
        println!("all {checked} checked outputs match");
    }
    Ok(())
}

/// Compiles and runs on the CPU backend, with `--bench`, `--profile` and `--stats`; adds the
/// timings and statistics to `report`.
fn run_compiled(
    a: &RunArgs,
    graph: &Graph,
    inputs: &[Tensor],
    report: &mut Report,
) -> Result<Vec<Tensor>> {
    let mut opts = tilec::compiled::CompileOptions {
        opt_level: a.opt_level,
        winograd: !a.no_winograd,
        families: a.families.clone(),
        ..Default::default()
    };
    if let Some(t) = a.threads {
        opts.threads = t;
    }
    opts.tuning = super::tuning(a.no_tuning, opts.threads);
    let mut c = tilec::compiled::compile(graph, &opts).context("compiling the model for the CPU")?;
    super::tuning_notes(&opts.tuning);
    let r = c.report.clone();
    let tuned = r.decisions.iter().filter(|(_, d)| d.origin == tilec_tile::family::ParamOrigin::Tuned).count();
    if tuned > 0 {
        println!("tuning: {tuned} kernels with tuned parameters (--no-tuning ignores them)");
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "compiled {} kernels ({} unique{}) in {:.1} ms (optimize {:.1}, lower {:.1}, C compile {:.1})",
        r.kernels,
        r.unique_kernels,
        if r.cache_hits > 0 { ", from the cache" } else { "" },
        ms(r.total),
        ms(r.optimize),
        ms(r.lower),
        ms(r.codegen)
    );
    if !r.fallbacks.is_empty() {
        let mut ops: Vec<&str> = r.fallbacks.iter().map(|(op, _)| op.as_str()).collect();
        ops.sort();
        ops.dedup();
        println!("note: {} nodes run on the reference interpreter ({})", r.fallbacks.len(), ops.join(", "));
    }
    if a.check_kernels {
        let bad = c.check_steps(inputs, a.rtol, a.atol).context("checking the compiled kernels")?;
        for b in &bad {
            println!("kernel check: {b}");
        }
        println!("kernel check: {} of {} steps differ from the reference interpreter", bad.len(), c.steps());
    }
    let start = Instant::now();
    let outs = c.run(inputs).context("running the compiled model")?;
    let first = start.elapsed();
    println!("ran on the cpu backend in {:.3} ms (first run)", first.as_secs_f64() * 1e3);
    let mut median_ms = first.as_secs_f64() * 1e3;
    if let Some(n) = a.bench.filter(|&n| n > 0) {
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let s = Instant::now();
            c.run(inputs).context("running the compiled model")?;
            times.push(s.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(|x, y| x.total_cmp(y));
        median_ms = times[times.len() / 2];
        println!(
            "bench: {} runs, median {:.3} ms, min {:.3} ms, max {:.3} ms",
            times.len(),
            median_ms,
            times[0],
            times[times.len() - 1]
        );
    }
    if a.profile || a.trace.is_some() || a.roofline.is_some() || a.profile_dir.is_some() {
        profile(a, &mut c, inputs)?;
    }
    if a.stats {
        println!(
            "memory: arena {} bytes for {} bytes of intermediates ({:.1}%), {} in-place",
            r.arena_bytes,
            r.intermediate_bytes,
            100.0 * r.arena_bytes as f64 / r.intermediate_bytes.max(1) as f64,
            r.inplace
        );
        println!("steps: {} ({} kernels, {} reference-interpreter nodes)", c.steps(), r.kernels, r.fallbacks.len());
        for (op, why) in &r.fallbacks {
            println!("  fallback {op}: {why}");
        }
        print_families(&r);
    }
    add(
        report,
        serde_json::json!({
            "median_ms": median_ms,
            "first_run_ms": first.as_secs_f64() * 1e3,
            "compile_ms": ms(r.total),
            "cache_hit": r.cache_hits > 0,
            "families": families_json(&r),
            "tuned_kernels": tuned,
            "kernels": r.kernels,
            "unique_kernels": r.unique_kernels,
            "fallback_nodes": r.fallbacks.len(),
            "arena_bytes": r.arena_bytes,
            "intermediate_bytes": r.intermediate_bytes,
        }),
    );
    Ok(outs)
}

/// Compiles and runs on a CUDA GPU, with `--bench`, `--stats` and `--check-kernels`; adds the
/// timings and statistics to `report`.
fn run_cuda(
    a: &RunArgs,
    graph: &Graph,
    inputs: &[Tensor],
    report: &mut Report,
) -> Result<Vec<Tensor>> {
    use tilec::compiled_cuda::{compile, CudaOptions};
    let opts = CudaOptions {
        opt_level: a.opt_level,
        device: a.device,
        families: a.families.clone(),
        allow_tf32: a.allow_tf32,
        tuning: super::cuda_tuning(a.no_tuning, a.device),
        ..Default::default()
    };
    let mut c = compile(graph, &opts).context("compiling the model for CUDA")?;
    super::tuning_notes(&opts.tuning);
    let r = c.report.clone();
    let tuned = r.decisions.iter().filter(|(_, d)| d.origin == tilec_tile::family::ParamOrigin::Tuned).count();
    if tuned > 0 {
        println!("tuning: {tuned} kernels with tuned parameters (--no-tuning ignores them)");
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let scheds: Vec<String> = r.schedules.iter().map(|(s, n)| format!("{s} {n}")).collect();
    let phases = compile_phases(&r);
    let shown: Vec<String> = phases.iter().map(|(p, t)| format!("{p} {:.1}", ms(*t))).collect();
    println!(
        "compiled {} GPU kernels ({}; {} from the cache) for {} in {:.1} ms ({}); {} CUDA graphs",
        r.kernels,
        scheds.join(", "),
        r.cache_hits,
        c.device_name(),
        ms(r.total),
        shown.join(", "),
        r.graphs
    );
    if !r.fallbacks.is_empty() {
        let mut ops: Vec<&str> = r.fallbacks.iter().map(|(op, _)| op.as_str()).collect();
        ops.sort();
        ops.dedup();
        println!("note: {} nodes run on the host reference interpreter ({})", r.fallbacks.len(), ops.join(", "));
    }
    if a.stats {
        println!("memory: device arena {} bytes, constants {} bytes", r.arena_bytes, r.const_bytes);
        for (op, why) in &r.fallbacks {
            println!("  host fallback {op}: {why}");
        }
        print_families(&r);
    }
    let mut kernel_mismatches = None;
    if a.check_kernels {
        let bad = c.check_steps(inputs, a.rtol, a.atol).context("checking the GPU kernels")?;
        for b in &bad {
            println!("kernel check: {b}");
        }
        println!("kernel check: {} of {} steps differ from the reference interpreter", bad.len(), c.steps());
        kernel_mismatches = Some(bad.len());
    }
    let start = Instant::now();
    let outs = c.run(inputs).context("running the model on the GPU")?;
    let first = start.elapsed();
    println!("ran on the cuda target in {:.3} ms (first run: graph capture, transfers included)", ms(first));
    if a.profile || a.trace.is_some() || a.roofline.is_some() || a.profile_dir.is_some() {
        profile(a, &mut c, inputs)?;
    }
    let mut median_ms = None;
    if let Some(n) = a.bench.filter(|&n| n > 0) {
        let mut times = c.bench(inputs, n).context("benchmarking the model on the GPU")?;
        times.sort_by(|x, y| x.total_cmp(y));
        let med = times[times.len() / 2];
        median_ms = Some(med);
        println!(
            "bench: {} runs, median {:.3} ms, min {:.3} ms, max {:.3} ms (CUDA events, input upload not timed)",
            times.len(),
            med,
            times[0],
            times[times.len() - 1]
        );
    }
    let j = serde_json::json!({
        "target": "cuda",
        "device": c.device_name(),
        "median_ms": median_ms,
        "first_run_ms": ms(first),
        "compile_ms": ms(r.total),
        "compile_phases_ms": phases.iter().map(|(p, t)| (p.to_string(), serde_json::json!((ms(*t) * 1e3).round() / 1e3))).collect::<serde_json::Map<_, _>>(),
        "kernels": r.kernels,
        "schedules": r.schedules.iter().map(|(s, n)| (s.clone(), serde_json::json!(n))).collect::<serde_json::Map<_, _>>(),
        "cache_hits": r.cache_hits,
        "host_nodes": r.fallbacks.len(),
        "graphs": r.graphs,
        "arena_bytes": r.arena_bytes,
        "kernel_mismatches": kernel_mismatches,
        "families": families_json(&r),
        "tuned_kernels": tuned,
    });
    add(report, j);
    Ok(outs)
}

/// Where a CUDA compile's time went, in order: `optimize`, `lower+schedule`, then the
/// report's phases (`device` open, the part not hidden behind optimize and lower, `nvrtc`
/// (kernel cache lookups and NVRTC), `modules` loaded,
/// `constants` uploaded, `arena`, `bind`), and `other` for the rest of `total`.
fn compile_phases(r: &tilec::exec::Report) -> Vec<(&'static str, std::time::Duration)> {
    let mut v = vec![("optimize", r.optimize), ("lower+schedule", r.lower)];
    v.extend(r.phases.iter().copied());
    let known: std::time::Duration = v.iter().map(|p| p.1).sum();
    v.push(("other", r.total.saturating_sub(known)));
    v
}

/// Prints the per-kernel profile of `--profile` (rows named `kernel [family]`), and writes what
/// `--trace`, `--roofline` and `--profile-dir` ask for.
fn profile<B: tilec::exec::Backend>(a: &RunArgs, c: &mut tilec::exec::Executor<B>, inputs: &[Tensor]) -> Result<()> {
    use tilec::runtime::trace;
    let mut p = tilec::runtime::Profile::default();
    // As many profiled runs as timed ones (at least 5): single kernels vary more than runs.
    let reps = a.bench.unwrap_or(0).max(5);
    for _ in 0..reps {
        c.run_profiled(inputs, Some(&mut p)).context("running the compiled model")?;
    }
    let mut text = p.render_table();
    text.push_str("\ntime by kind (gaps: between the calls of a run):\n");
    let kinds = trace::time_by_kind(&p);
    for (kind, ns, pct) in &kinds {
        text.push_str(&format!("  {kind:<16} {:>10.3} ms  {pct:>5.1}%\n", *ns as f64 / 1e6));
    }
    let ceilings = (a.roofline.is_some() || a.profile_dir.is_some()).then(|| {
        if a.target == TargetArg::Cuda {
            super::ceilings::cuda(a.device)
        } else {
            super::ceilings::cpu()
        }
    });
    if let Some(c) = &ceilings {
        text.push('\n');
        text.push_str(&trace::bounds_table(&p, c, reps));
        if trace::roofline_points(&p, c).iter().any(|x| x.3 > 1.05) {
            text.push_str("note: kernels above the roof: the ceilings were measured slower than they ran (a busy machine), or their FLOPs are counted as the direct form's (Winograd)\n");
        }
    }
    println!("{text}");
    let target = if a.target == TargetArg::Cuda { "cuda" } else { "cpu" };
    let title = format!("{} on {target}", a.model.display());
    let write = |f: &std::path::Path, body: &str| std::fs::write(f, body).with_context(|| format!("writing {}", f.display()));
    if let Some(f) = &a.trace {
        write(f, &trace::chrome_trace(&p))?;
        println!("wrote {} ({} calls; open it in Perfetto)", f.display(), p.spans.len());
    }
    if let (Some(f), Some(c)) = (&a.roofline, &ceilings) {
        write(f, &trace::roofline_svg(&p, c, &title))?;
        println!("wrote {} (ceilings: {:.1} GB/s {}, {:.0} GFLOP/s {})", f.display(), c.gbps, c.gbps_from, c.gflops, c.gflops_from);
    }
    if let (Some(dir), Some(c)) = (&a.profile_dir, &ceilings) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write(&dir.join("profile.txt"), &text)?;
        write(&dir.join("trace.json"), &trace::chrome_trace(&p))?;
        write(&dir.join("roofline.svg"), &trace::roofline_svg(&p, c, &title))?;
        let j = serde_json::json!({
            "model": a.model.display().to_string(),
            "target": target,
            "runs": reps,
            "ceilings": {"gbps": c.gbps, "gbps_from": c.gbps_from, "gflops": c.gflops, "gflops_from": c.gflops_from},
            "kernels": trace::bounds(&p, c),
            "by_kind": kinds.iter().map(|(k, ns, pct)| serde_json::json!({"kind": k, "ms": *ns as f64 / 1e6, "pct": pct})).collect::<Vec<_>>(),
        });
        write(&dir.join("profile.json"), &serde_json::to_string_pretty(&j)?)?;
        println!("wrote {}/{{profile.txt,profile.json,trace.json,roofline.svg}}", dir.display());
    }
    Ok(())
}

/// `--stats`: the family of every kernel, and what happened to it after the choice.
fn print_families(r: &tilec::exec::Report) {
    for (k, d) in &r.decisions {
        println!("  kernel {k}: {}", d.summary());
    }
    for (k, note) in &r.notes {
        println!("  note {k}: {note}");
    }
}

/// `--json`: kernel name → family, parameters and where they came from.
fn families_json(r: &tilec::exec::Report) -> serde_json::Value {
    let m: serde_json::Map<String, serde_json::Value> = r
        .decisions
        .iter()
        .map(|(k, d)| {
            let v = serde_json::json!({
                "family": d.family,
                "params": d.params.to_string(),
                "origin": d.origin.to_string(),
                "note": d.note,
                "rejected": tilec_tile::family::describe_rejections(&d.rejected),
            });
            (k.clone(), v)
        })
        .collect();
    serde_json::Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(num(0.5), "0.5");
        assert_eq!(num(-2.0), "-2");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(1e-9), "1.0000e-9");
        assert_eq!(file_stem("gpu_0/softmax_1"), "gpu_0_softmax_1");
        assert_eq!(file_stem("../x"), "_x");
        assert_eq!(file_stem(""), "output");
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
    }

    #[test]
    fn random_values_in_range() {
        let mut rng = StdRng::seed_from_u64(1);
        let t = random_tensor(DType::F32, vec![100], &mut rng).unwrap();
        assert!(t.to_f64_vec().iter().all(|x| (-1.0..1.0).contains(x)));
        let t = random_tensor(DType::I64, vec![100], &mut rng).unwrap();
        assert!(t.to_i64_vec().iter().all(|x| (0..4).contains(x)));
        assert_eq!(random_tensor(DType::Bool, vec![2, 0], &mut rng).unwrap().shape(), &[2, 0]);
    }

    #[test]
    fn summaries() {
        let t = Tensor::from_vec(vec![3], vec![1.0f32, f32::NAN, -3.0]).unwrap();
        let s = summary(&t);
        assert!(s.contains("min -3 max 1 mean -1") && s.contains("nan 1"), "{s}");
        let t = Tensor::from_vec(vec![2], vec![u64::MAX, 1]).unwrap();
        assert!(summary(&t).contains("max 18446744073709552000"), "{}", summary(&t));
    }
}
