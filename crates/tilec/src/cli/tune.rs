//! `tilec tune MODEL [--target cpu|cuda]`: measure the best parameters of every kernel of a
//! model whose family has some, on this machine's CPU or GPU, and remember them in the tuning database (which `tilec run` and
//! `tilec explain` read); `--export`/`--import` carry the database to other machines.

use super::{check_dims, graph_of, input_names, load_model, parse_dim, parse_named_file, MAX_THREADS};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tilec::ir::Dim;
use tilec::tensor_io;
use tilec::tune::{tune_model, tune_model_cuda, Progress, TuneOptions};
use tilec::{ImportOptions, Tensor};

/// The most seconds `--budget` accepts (a day).
const MAX_BUDGET_S: u64 = 86_400;

#[derive(clap::Args, Debug)]
pub struct TuneArgs {
    /// The ONNX model file (may be left out with --import or --export alone).
    pub model: Option<PathBuf>,
    /// Where the kernels run: this CPU, or an NVIDIA GPU (CUDA driver and NVRTC loaded at run
    /// time).
    #[arg(long, value_enum, default_value_t = super::run::TargetArg::Cpu)]
    pub target: super::run::TargetArg,
    /// The CUDA device ordinal (with --target cuda).
    #[arg(long)]
    pub device: Option<usize>,
    /// With --target cuda: let f32 matrix products run on the tensor cores as tf32 (as `run
    /// --allow-tf32`; tune with the flag the model will run with).
    #[arg(long = "allow-tf32")]
    pub allow_tf32: bool,
    /// Give an input (a .npy or .pb file): its shape fixes the model's symbolic dimensions,
    /// and an input the importer needs as a constant is compiled in.
    #[arg(long = "input", short = 'i', value_name = "NAME=FILE", value_parser = parse_named_file)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Fix a symbolic dimension, e.g. --dim batch=8 (others not fixed by an input are 1).
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
    pub dims: Vec<(String, usize)>,
    /// Seconds of tuning in all, compiling and profiling the model included; the measurements
    /// are split over the kernels by their share of the model (1 to 86,400).
    #[arg(long, default_value_t = 60, value_name = "SECONDS",
          value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(1..=MAX_BUDGET_S))]
    pub budget: u64,
    /// Candidates measured per kernel at most, the heuristic's included (1 to 1000).
    #[arg(long, default_value_t = 16, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub max_candidates: usize,
    /// Measure again kernels the database already knows for this machine.
    #[arg(long)]
    pub retune: bool,
    /// Threads of the compiled code, 1 to 4096 (default: all cores); the database keys
    /// measurements by it (CPU only).
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_THREADS as u64))]
    pub threads: Option<usize>,
    /// Before tuning: read entries from FILE (JSON lines, or a tuning database file).
    #[arg(long, value_name = "FILE")]
    pub import: Option<PathBuf>,
    /// After tuning: write the database to FILE (a copy for a .sqlite/.db name, else JSON lines).
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,
}

/// Imports the model with its symbolic dimensions fixed: by --dim, by the given inputs'
/// shapes, else 1.
fn specialized(a: &TuneArgs, path: &std::path::Path) -> Result<tilec::Graph> {
    let model = load_model(path)?;
    let g = graph_of(&model)?;
    let mut dims = check_dims(g, &a.dims)?;
    let names = input_names(g);
    let mut provided: HashMap<String, Tensor> = HashMap::new();
    for (name, file) in &a.inputs {
        if !names.contains(name) {
            bail!("--input {name}={}: the model has no input '{name}' (its inputs: {})", file.display(), names.join(", "));
        }
        let t = tensor_io::read_tensor(file).with_context(|| format!("input '{name}'"))?;
        provided.insert(name.clone(), t);
    }
    let (graph, _) = super::import(&model, ImportOptions { dim_values: dims.clone(), ..Default::default() }, &provided)?;
    let free = |s: tilec::ir::SymbolId| graph.syms.symbols.get(s.0 as usize).is_some_and(|x| x.expr.is_none());
    for &v in graph.inputs() {
        let val = graph.value(v);
        let Some(t) = provided.get(&val.name) else { continue };
        if t.rank() != val.ty.rank() {
            bail!("input '{}': rank {} given, the model's is {}", val.name, t.rank(), val.ty.rank());
        }
        for (&d, &n) in val.ty.shape.iter().zip(t.shape()) {
            if let Dim::Sym(s) = d {
                if free(s) {
                    dims.entry(graph.syms.name(s).to_string()).or_insert(n);
                }
            }
        }
    }
    let mut any_free = false;
    for (i, s) in graph.syms.symbols.iter().enumerate() {
        if s.expr.is_none() {
            any_free = true;
            let name = graph.syms.name(tilec::ir::SymbolId(i as u32)).to_string();
            if !dims.contains_key(&name) {
                println!("note: dimension '{name}' = 1 (default; choose with --dim {name}=N)");
                dims.insert(name, 1);
            }
        }
    }
    if !any_free {
        return Ok(graph);
    }
    Ok(super::import(&model, ImportOptions { dim_values: dims, ..Default::default() }, &provided)?.0)
}

/// `1.234 ms` / `56.7 us`.
fn time(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else {
        format!("{:.1} us", ns / 1e3)
    }
}

/// `k3_gemm` or `k3_gemm +4`.
fn kernels(ks: &[String]) -> String {
    match ks.len() {
        0 | 1 => ks.first().cloned().unwrap_or_default(),
        n => format!("{} +{}", ks[0], n - 1),
    }
}

pub fn tune(a: &TuneArgs) -> Result<()> {
    let cuda = a.target == super::run::TargetArg::Cuda;
    if cuda && a.threads.is_some() {
        bail!("--threads sets the CPU's threads; it does not apply to --target cuda");
    }
    if !cuda && a.device.is_some() {
        bail!("--device chooses a CUDA GPU; it needs --target cuda");
    }
    if !cuda && a.allow_tf32 {
        bail!("--allow-tf32 is about the GPU's tensor cores; it needs --target cuda");
    }
    if a.model.is_none() && a.import.is_none() && a.export.is_none() {
        bail!("nothing to do: give a MODEL to tune, or --import/--export FILE");
    }
    let path = tilec::tuner::default_path();
    let db = tilec::tuner::Db::open(&path).with_context(|| {
        "the tuning database cannot be used (set TILEC_TUNING_DB to another file, or remove this one)".to_string()
    })?;
    if let Some(f) = &a.import {
        let s = db.import(f)?;
        println!("imported {} entries from {} into {}{}", s.imported, f.display(), path.display(), if s.skipped > 0 { format!(" ({} skipped)", s.skipped) } else { String::new() });
        for n in &s.notes {
            println!("note: {n}");
        }
    }
    if let Some(model) = &a.model {
        let graph = specialized(a, model)?;
        let mut opts = TuneOptions {
            budget: Duration::from_secs(a.budget),
            max_candidates: a.max_candidates,
            retune: a.retune,
            ..Default::default()
        };
        if let Some(t) = a.threads {
            opts.compile.threads = t;
        }
        if cuda {
            opts.cuda.device = a.device.unwrap_or(0);
            opts.cuda.allow_tf32 = a.allow_tf32;
            opts.timing = tilec::tune::Timing::gpu();
        }
        let ctx = if cuda {
            tilec::tune::gpu_context(opts.cuda.device).context("--target cuda")?
        } else {
            tilec::tune::host_context(opts.compile.threads)
        };
        println!("tuning {} on {} ({}), budget {} s; database {}", model.display(), ctx.device, ctx.capability, a.budget, path.display());
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} candidates  {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let mut on_progress = |p: Progress| match p {
            Progress::Planned(n) => bar.set_length(n as u64),
            Progress::Problem(name) => bar.set_message(name.to_string()),
            Progress::Measured => bar.inc(1),
        };
        let r = if cuda {
            tune_model_cuda(&graph, &opts, &db, &mut on_progress).map(|(_, r)| r)
        } else {
            tune_model(&graph, &opts, &db, &ctx, &mut on_progress)
        };
        bar.finish_and_clear();
        let r = r.context("tuning the model")?;
        println!(
            "{:<20} {:<14} {:>11} {:>11} {:>8} {:>6} {:>13} {:>6}  parameters",
            "kernel", "family", "default", "tuned", "speedup", "share", "meas/fail/prn", "rho"
        );
        for k in &r.problems {
            let (tuned, params) = match &k.best {
                Some((p, ns)) => (time(*ns), p.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" ")),
                None => ("-".into(), "-".into()),
            };
            println!(
                "{:<20} {:<14} {:>11} {:>11} {:>8} {:>5.1}% {:>13} {:>6}  {params}{}",
                kernels(&k.kernels),
                k.family,
                k.default_ns.map_or("-".into(), time),
                tuned,
                k.speedup().map_or("-".into(), |s| format!("{s:.2}x")),
                100.0 * k.share,
                format!("{}/{}/{}", k.measured, k.failed, k.pruned),
                k.rank_corr.map_or("-".into(), |x| format!("{x:+.2}")),
                match (&k.skipped, k.out_of_time) {
                    (Some(why), _) => format!("  ({why})"),
                    (None, true) => "  (budget)".to_string(),
                    _ => String::new(),
                }
            );
            for f in &k.failures {
                println!("    failed: {f}");
            }
        }
        if r.model_ms > 0.0 {
            let est = r.estimated_tuned_ms();
            println!(
                "model: {:.3} ms with the heuristics (profiled), about {:.3} ms tuned ({:.2}x, estimated from the kernels); {} kernels have nothing to tune",
                r.model_ms,
                est,
                r.model_ms / est.max(1e-9),
                r.untunable
            );
        }
        for n in &r.notes {
            println!("note: {n}");
        }
        println!(
            "tuned in {:.1} s; `tilec run{}` now uses these parameters (--no-tuning ignores them)",
            r.elapsed.as_secs_f64(),
            if cuda { " --target cuda" } else { "" }
        );
    }
    if let Some(f) = &a.export {
        let n = db.export(f)?;
        println!("exported {n} entries to {}", f.display());
    }
    for n in db.notes() {
        println!("note: {n}");
    }
    Ok(())
}
