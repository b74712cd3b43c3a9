//! `tilec print-ir` with optimization, and `tilec explain`: the optimizer's pipeline and
//! the fusion partitioner's decisions, shown.

use super::{check_dims, graph_of, import, load_model};
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::collections::HashMap;
use std::path::PathBuf;
use tilec::ImportOptions;
use tilec_opt::manager::{Pipeline, PipelineOptions};
use tilec_opt::partition::{self, SizeHints, TargetKind};

/// The targets the optimizer and partitioner know.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum TargetArg {
    /// The CPU this runs on (2-core AVX-512 class defaults).
    Cpu,
    /// An NVIDIA Hopper GPU (H200).
    Cuda,
}

impl TargetArg {
    fn kind(self) -> TargetKind {
        match self {
            TargetArg::Cpu => TargetKind::Cpu,
            TargetArg::Cuda => TargetKind::Cuda,
        }
    }
}

#[derive(Args, Debug)]
pub struct OptArgs {
    /// The ONNX model file.
    pub model: PathBuf,
    /// Optimization level: 0 (import only) to 3 (with composite-op recognition).
    #[arg(short = 'O', long = "opt-level", default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub level: u8,
    /// The target the pipeline and the cost model plan for.
    #[arg(long, value_enum, default_value_t = TargetArg::Cpu)]
    pub target: TargetArg,
    /// Fix a symbolic dimension (an ONNX dim_param) to a size, e.g. --dim batch=1.
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = super::parse_dim)]
    pub dims: Vec<(String, usize)>,
    /// Print the IR after the named pass (every run of it).
    #[arg(long = "print-ir-after", value_name = "PASS")]
    pub print_ir_after: Option<String>,
    /// Print the IR after every pass.
    #[arg(long = "print-ir-after-all")]
    pub print_ir_after_all: bool,
    /// Print each pass run with its time and node counts.
    #[arg(long = "time-passes")]
    pub time_passes: bool,
    /// Force a kernel family for an op (`conv`, `matmul`, ...), a kernel name or `*`, e.g.
    /// --family conv=cpu.direct (repeatable).
    #[arg(long = "family", value_name = "OP=NAME", value_parser = super::parse_family)]
    pub families: Vec<(String, String)>,
    /// With --target cuda: let f32 matrix products run on the tensor cores as tf32 (10-bit
    /// mantissas, as torch.backends.cuda.matmul.allow_tf32). Off: f32 stays exact.
    #[arg(long = "allow-tf32")]
    pub allow_tf32: bool,
    /// Ignore the tuning database: show the families' heuristic parameters.
    #[arg(long)]
    pub no_tuning: bool,
}

fn optimized(args: &OptArgs) -> Result<tilec::Graph> {
    let model = load_model(&args.model)?;
    let dim_values = check_dims(graph_of(&model)?, &args.dims)?;
    let opts = ImportOptions { dim_values, ..Default::default() };
    let (mut g, _) = import(&model, opts, &HashMap::new())?;
    let pipeline = Pipeline::for_level_and_target(args.level, args.target.kind());
    if let Some(p) = args.print_ir_after.as_ref().filter(|p| !TILE_STAGES.contains(&p.as_str())) {
        let known = pipeline.describe().join(" ");
        if !known.split(|c: char| !(c.is_alphanumeric() || c == '-')).any(|w| w == p) {
            anyhow::bail!(
                "--print-ir-after: no pass '{p}' at -O{} (passes: {known}; after the graph passes: {})",
                args.level,
                TILE_STAGES.join(", ")
            );
        }
    }
    let print_ir_after = if args.print_ir_after_all { Some("all".to_string()) } else { args.print_ir_after.clone() };
    let popts = PipelineOptions { print_ir_after, ..Default::default() };
    let reports = pipeline.run(&mut g, &popts).context("optimizing")?;
    for r in &reports {
        if let Some(ir) = &r.ir_after {
            println!("// ----- IR after {} (round {}) -----", r.pass, r.iteration);
            print!("{ir}");
        }
    }
    if args.time_passes {
        let total: f64 = reports.iter().map(|r| r.time.as_secs_f64()).sum();
        println!("// pass                      round  changed  nodes       time");
        for r in &reports {
            println!(
                "// {:<25} {:>5}  {:>7}  {:>4}->{:<4}  {:>8.3} ms",
                r.pass,
                r.iteration,
                r.changed,
                r.nodes_before,
                r.nodes_after,
                r.time.as_secs_f64() * 1e3
            );
        }
        println!("// total {:.3} ms", total * 1e3);
    }
    Ok(g)
}

/// Stages after the graph passes that `--print-ir-after` can name: the tile IR of every kernel
/// as lowered, and after its default schedule.
const TILE_STAGES: [&str; 2] = ["lower", "schedule"];

/// `tilec print-ir`: the graph after import and the selected optimization level; with
/// `--print-ir-after lower|schedule` (or `-all`), also the kernels in tile IR.
pub fn print_ir(args: &OptArgs) -> Result<()> {
    let g = optimized(args)?;
    print!("{}", tilec::ir::print_graph(&g));
    let stage = if args.print_ir_after_all { Some("all") } else { args.print_ir_after.as_deref() };
    let (lower, sched) = match stage {
        Some("all") => (true, true),
        Some("lower") => (true, false),
        Some("schedule") => (false, true),
        _ => return Ok(()),
    };
    // The kernels as the target's executor builds them (the graph is optimized already: level
    // 0 keeps it as it is), each with its family and the schedule that family applied.
    let family_line = |name: &str, decisions: &[(String, tilec_tile::family::Decision)]| {
        if let Some((_, d)) = decisions.iter().find(|(k, _)| k == name) {
            println!("// family: {}", d.summary());
        }
    };
    let print = |name: &str, lowered: &tilec_tile::Kernel, schedule: &[String], scheduled: &tilec_tile::Kernel| {
        if lower {
            println!("// ----- tile IR after lower: {name} -----");
            print!("{lowered}");
        }
        if sched {
            println!("// ----- tile IR after schedule: {name} -----");
            for line in schedule {
                println!("// schedule: {line}");
            }
            print!("{scheduled}");
        }
    };
    match args.target.kind() {
        partition::TargetKind::Cpu => {
            let mut opts = tilec::compiled::CompileOptions { opt_level: 0, families: args.families.clone(), ..Default::default() };
            opts.tuning = super::tuning(args.no_tuning, opts.threads);
            let prep = tilec::compiled::prepare(&g, &opts)?;
            super::tuning_notes(&opts.tuning);
            for k in prep.kernels() {
                let name = &k.kernel.name;
                let steps: Vec<String> = k.schedule.to_string().lines().map(str::to_string).collect();
                family_line(name, &prep.report.decisions);
                print(name, &k.lowered.kernel, &steps, &k.kernel);
            }
        }
        partition::TargetKind::Cuda => {
            let (gpu, _, tuning) = super::cuda_for_explain(args.no_tuning, 0);
            let opts = tilec::compiled_cuda::CudaOptions {
                opt_level: 0,
                families: args.families.clone(),
                allow_tf32: args.allow_tf32,
                tuning,
                ..Default::default()
            };
            let prep = tilec::compiled_cuda::prepare(&g, &opts, &gpu)?;
            super::tuning_notes(&opts.tuning);
            for k in prep.kernels() {
                let mut steps = vec![format!("{} ({})", k.schedule, k.family.decision.summary())];
                if let Some(p) = &k.family.plan {
                    let what = if p.compiles() { "template" } else { "library call" };
                    steps.push(format!("{what}: {}; the tile-IR fallback below", p.describe()));
                }
                family_line(&k.name, &prep.report.decisions);
                print(&k.name, &k.lowered, &steps, &k.scheduled);
            }
        }
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub opt: OptArgs,
}

/// `tilec explain`: kernel groups with their costs, every rejected fusion with why, and the
/// family each kernel is built with on the target, with the families rejected and why.
pub fn explain(args: &ExplainArgs) -> Result<()> {
    let a = &args.opt;
    let g = optimized(a)?;
    let hints = SizeHints { named: a.dims.iter().cloned().collect(), ..Default::default() };
    explain_optimized(&g, a.target, &hints, &a.families, a.no_tuning, a.allow_tf32)
}

/// The optimized pipeline's graph for a target at the default level.
pub fn optimize_for(g: &mut tilec::Graph, target: TargetArg) -> Result<()> {
    Pipeline::for_level_and_target(3, target.kind()).run(g, &PipelineOptions::default()).context("optimizing")?;
    Ok(())
}

/// The partition of an optimized graph on `target` and the family chosen for each kernel,
/// printed (`tilec explain`, `tilec generate --explain`).
pub fn explain_optimized(
    g: &tilec::Graph,
    target: TargetArg,
    hints: &SizeHints,
    families: &[(String, String)],
    no_tuning: bool,
    allow_tf32: bool,
) -> Result<()> {
    let t = partition::Target::preset(target.kind());
    let p = partition::partition_with(g, &t, hints);
    print!("{}", partition::explain(g, &p, &t));
    println!();
    // The graph is already optimized; level 0 keeps it as it is.
    let title: String;
    let (title, prepared) = match target.kind() {
        TargetKind::Cpu => {
            let mut opts = tilec::compiled::CompileOptions { opt_level: 0, families: families.to_vec(), ..Default::default() };
            opts.tuning = super::tuning(no_tuning, opts.threads);
            let p = tilec::compiled::prepare(&g, &opts).context("building the kernels")?;
            super::tuning_notes(&opts.tuning);
            ("kernels (families for this CPU; parameters: heuristic, forced with --family, or tuned by `tilec tune`):", (p.interpreted(), p.report))
        }
        TargetKind::Cuda => {
            let (gpu, name, tuning) = super::cuda_for_explain(no_tuning, 0);
            let opts = tilec::compiled_cuda::CudaOptions {
                opt_level: 0,
                families: families.to_vec(),
                allow_tf32,
                tuning,
                ..Default::default()
            };
            let p = tilec::compiled_cuda::prepare(&g, &opts, &gpu).context("building the kernels")?;
            super::tuning_notes(&opts.tuning);
            title = format!("kernels (families for {name}; parameters: heuristic, forced with --family, or tuned by `tilec tune --target cuda`):");
            (title.as_str(), (p.interpreted(), p.report))
        }
    };
    println!("{title}");
    let (interpreted, r) = prepared;
    if interpreted {
        println!("  none: shapes are not concrete (fix symbolic dimensions with --dim NAME=VALUE)");
        return Ok(());
    }
    for (k, d) in &r.decisions {
        println!("  {k}: {}", d.summary());
        for (f, why) in &d.rejected {
            println!("    not {f}: {why}");
        }
    }
    for (op, why) in &r.fallbacks {
        println!("  host step {op}: {why}");
    }
    for (k, note) in &r.notes {
        println!("  note {k}: {note}");
    }
    Ok(())
}
