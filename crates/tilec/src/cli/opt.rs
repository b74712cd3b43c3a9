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
    let t = partition::Target::preset(args.target.kind());
    let p = partition::partition(&g, &t);
    let cpu = tilec_tile::schedule::CpuTarget::host();
    let lopts = match args.target.kind() {
        partition::TargetKind::Cpu => tilec_tile::lower::LowerOptions::default(),
        _ => tilec_tile::lower::LowerOptions::default(),
    };
    for grp in &p.groups {
        let name = format!("k{}_{}", grp.id, grp.kind.to_string().to_lowercase());
        match tilec_tile::lower::lower_group_with(&g, grp, &name, lopts) {
            Ok(l) => {
                if lower {
                    println!("// ----- tile IR after lower: {name} -----");
                    print!("{}", l.kernel);
                }
                if sched {
                    let s = tilec_tile::schedule::default_cpu(&l.kernel, &cpu);
                    let mut k = l.kernel.clone();
                    println!("// ----- tile IR after schedule: {name} -----");
                    for line in s.to_string().lines() {
                        println!("// schedule: {line}");
                    }
                    match tilec_tile::schedule::apply(&mut k, &s) {
                        Ok(()) => print!("{k}"),
                        Err(e) => println!("// schedule not applied: {e}"),
                    }
                }
            }
            Err(e) => println!("// ----- {name}: not lowered ({e}); its nodes run one by one -----"),
        }
    }
    Ok(())
}

/// `tilec explain`: kernel groups with their costs, and every rejected fusion with why.
pub fn explain(args: &OptArgs) -> Result<()> {
    let g = optimized(args)?;
    let t = partition::Target::preset(args.target.kind());
    let hints = SizeHints { named: args.dims.iter().cloned().collect(), ..Default::default() };
    let p = partition::partition_with(&g, &t, &hints);
    print!("{}", partition::explain(&g, &p, &t));
    if args.target.kind() == partition::TargetKind::Cpu {
        explain_cpu(&g, &p.groups);
    }
    if args.target.kind() == partition::TargetKind::Cuda {
        explain_cuda(&g);
    }
    Ok(())
}

/// The CPU kernel family of every group (or of each of its nodes when the group does not
/// build whole), its parameters and where they came from, and the families passed over.
fn explain_cpu(g: &tilec::Graph, groups: &[partition::KernelGroup]) {
    use tilec_tile::family::{describe_rejections, dispatch, Choices, Problem};
    let t = tilec_opt::target::Target::host_cpu();
    let reg = tilec_cpu::families::registry();
    let choices = Choices::default();
    println!();
    println!("CPU kernels (families for this CPU):");
    let show = |p: &Problem| match dispatch(reg, p, &t, &choices) {
        Ok((_, d)) if d.rejected.is_empty() => println!("  {}: {}", p.name, d.summary()),
        Ok((_, d)) => println!("  {}: {}; passed over: {}", p.name, d.summary(), d.rejections()),
        Err(why) => println!("  {}: no family: {}", p.name, describe_rejections(&why)),
    };
    for grp in groups {
        let name = format!("k{}_{}", grp.id, grp.kind.to_string().to_lowercase());
        let p = Problem::of_group(g, grp, &name);
        if grp.nodes.len() > 1 && dispatch(reg, &p, &t, &choices).is_err() {
            for (i, &n) in grp.nodes.iter().enumerate() {
                show(&Problem::of_node(g, n, &format!("{name}_{i}")));
            }
        } else {
            show(&p);
        }
    }
}

/// The GPU kernels of a graph with concrete shapes: each kernel's schedule, and for matrix
/// products the kernel family that runs them (with its parameters) or why none does. Planned
/// for an H100/H200 (sm_90, 132 SMs).
fn explain_cuda(g: &tilec::Graph) {
    use tilec::compiled_cuda::{prepare, CudaOptions};
    println!();
    println!("GPU kernels (planned for sm_90, 132 SMs):");
    // The graph is already optimized; level 0 keeps it as it is.
    let opts = CudaOptions { opt_level: 0, ..Default::default() };
    match prepare(g, &opts, &tilec_cuda::GpuTarget::hopper()) {
        Ok(p) if p.interpreted() => {
            println!("  none: shapes are not concrete (fix symbolic dimensions with --dim NAME=VALUE)")
        }
        Ok(p) => {
            for k in p.kernels() {
                println!("  {}: {}", k.name, k.family.describe());
            }
            for (op, why) in &p.report.fallbacks {
                println!("  host step {op}: {why}");
            }
        }
        Err(e) => println!("  not prepared: {e}"),
    }
}
