//! The compiled CPU path: optimize → partition → build each kernel through the CPU families
//! (lower, schedule) → C → shared object, run by the executor ([`crate::exec`]) from one
//! planned arena.
//!
//! A graph must have concrete shapes (specialize symbolic dimensions first, see
//! [`crate::specialize_dims`]). A kernel group that does not build whole is split into runs of nodes that do; a
//! node that still does not runs on the reference interpreter inside the same plan (a
//! *fallback step*), so every graph the interpreter runs also runs here.

use std::sync::Arc;
use std::time::Instant;

use tilec_ir::Graph;
use tilec_opt::target::Target;
use tilec_tile::family::{Choices, Tuned};

use crate::exec::cpu::{Cpu, CpuBuild};
use crate::exec::Executor;
use crate::Error;

pub use tilec_cpu::families::CpuBuilt;

/// What compilation did, for `--stats` and the benchmark.
pub type CompileReport = crate::exec::Report;

/// A compiled model.
pub type Compiled = Executor<Cpu>;

/// A model built for the CPU, not compiled yet.
pub type Prepared = crate::exec::Prepared<CpuBuild>;

/// Options of [`compile`].
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Graph optimization level (0..=3).
    pub opt_level: u8,
    /// Threads of parallel loops (default: all cores).
    pub threads: usize,
    /// Apply the families' schedules (off: plain loop nests, for debugging).
    pub schedule: bool,
    /// Where compiled objects are cached (`None`: the back end's default).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Keep the text of every kernel after lowering and after scheduling.
    pub keep_ir: bool,
    /// Let the Winograd family take eligible 3x3 convolutions.
    pub winograd: bool,
    /// Families forced per op or kernel name (`--family OP=NAME`).
    pub families: Vec<(String, String)>,
    /// The tuning database to take parameters from (`None`: the families' heuristics). The
    /// CLI opens the user's (`tilec_tune::default_path`) unless `--no-tuning`.
    pub tuning: Option<Arc<tilec_tune::Tuning>>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            opt_level: 3,
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            schedule: true,
            cache_dir: None,
            keep_ir: false,
            winograd: true,
            families: vec![],
            tuning: None,
        }
    }
}

/// Optimizes, partitions and builds every kernel for the host CPU (no C compiler needed).
pub fn prepare(graph: &Graph, opts: &CompileOptions) -> Result<Prepared, Error> {
    let disabled: &[&str] = if opts.winograd { &[] } else { &["cpu.winograd"] };
    let tuned = opts.tuning.as_deref().map(|t| t as &dyn Tuned);
    let choices = Choices { forced: &opts.families, disabled, tuned };
    let builder = CpuBuild { schedule: opts.schedule };
    crate::exec::prepare(graph, opts.opt_level, &builder, &Target::host_cpu(), &choices)
}

/// Compiles a graph with concrete shapes for the host CPU.
pub fn compile(graph: &Graph, opts: &CompileOptions) -> Result<Compiled, Error> {
    let t0 = Instant::now();
    let mut prep = prepare(graph, opts)?;
    if opts.keep_ir {
        prep.report.ir =
            prep.kernels().iter().map(|k| (k.kernel.name.clone(), k.lowered.kernel.to_string(), k.kernel.to_string())).collect();
    }
    let mut c = Executor::load(prep, Cpu::new(opts.cache_dir.clone(), opts.threads))?;
    c.report.total = t0.elapsed();
    Ok(c)
}
