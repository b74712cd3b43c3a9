//! Tuning: a device's [`Context`] (what its measurements hold for) and [`Measurer`] (build a
//! candidate through its family, compile it, time it), and the driver shared by the targets:
//! [`tune_model`] (`cpu.rs`) and [`tune_model_cuda`] (`cuda.rs`) tune every kernel of a model
//! whose family has parameters and store the results in the tuning database (`tilec_tune::db`).
//!
//! A model is first compiled with the heuristics and profiled, so that every kernel's share of
//! the model's time is known; kernels that are the same problem (a repeated block) are tuned
//! once; the most expensive go first and the budget is split in proportion to the shares
//! ([`tune_problems`]).

mod cpu;
pub mod cuda;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilec_ir::{DType, Graph, Tensor};
use tilec_opt::target::Target;
use tilec_tile::family::{Decision, FamilyRef, Params, Problem, Registry};
use tilec_tune::{Candidates, Context, Db, Outcome, Record, SearchOptions, SearchResult};

use crate::compiled::CompileOptions;
use crate::compiled_cuda::CudaOptions;
use crate::exec::ProblemSpec;
use crate::Error;

pub use cpu::{host_context, open_tuning, tune_model, CpuMeasurer};
pub use cuda::{cuda_context, device_context, gpu_context, open_cuda_tuning, tune_model_cuda, CudaMeasurer};

/// Said when a model's shapes stay symbolic.
pub(crate) const NOT_CONCRETE: &str = "the model's shapes are not concrete: nothing to tune (fix them with --dim or --input)";

/// How candidates are timed.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Timed runs at least and at most (after one warm-up run, which also checks the results).
    pub min_runs: usize,
    pub max_runs: usize,
    /// Timed runs continue until they add up to this much (within `max_runs`).
    pub min_time: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing { min_runs: 5, max_runs: 60, min_time: Duration::from_millis(40) }
    }
}

impl Timing {
    /// For GPU kernels: each timed run is a CUDA graph of many launches (see
    /// [`cuda::CudaMeasurer`]), so fewer milliseconds give a stable median.
    pub fn gpu() -> Timing {
        Timing { min_runs: 10, max_runs: 200, min_time: Duration::from_millis(15) }
    }
}


/// Random values: floats uniform in [-1, 1), integers and bools zero (indices stay in range).
pub(crate) fn random(dtype: DType, shape: Vec<usize>, rng: &mut StdRng) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = if dtype.is_float() { (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect() } else { vec![0.0; n] };
    Tensor::from_f64s(dtype, shape, &vals).map_err(|e| e.to_string())
}

/// The first line of an error, shortened.
pub(crate) fn brief(s: &str) -> String {
    let l = s.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    if l.len() > 160 {
        let mut cut = 160;
        while !l.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}...", &l[..cut])
    } else {
        l.to_string()
    }
}


/// Options of [`tune_model`] and [`tune_model_cuda`].
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// How the model is compiled for the CPU (threads, families forced, ...; its `tuning` is
    /// ignored).
    pub compile: CompileOptions,
    /// How it is compiled for CUDA (device, families forced, tf32; its `tuning` is ignored).
    pub cuda: CudaOptions,
    /// Wall-clock budget of the whole tuning, all kernels together: compiling and profiling
    /// the model first, then the measurements (a batch under way is finished).
    pub budget: Duration,
    /// Candidates measured per problem at most.
    pub max_candidates: usize,
    /// Re-measure problems the database already knows for this machine.
    pub retune: bool,
    pub timing: Timing,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            compile: CompileOptions::default(),
            cuda: CudaOptions::default(),
            budget: Duration::from_secs(60),
            max_candidates: 24,
            retune: false,
            timing: Timing::default(),
        }
    }
}

/// What tuning did for one problem (one or more kernels of the model).
#[derive(Clone, Debug)]
pub struct KernelTune {
    /// The model's kernels that are this problem.
    pub kernels: Vec<String>,
    pub family: &'static str,
    /// The problem as people read it.
    pub desc: String,
    /// Share of the model's time (with the heuristics) these kernels take, 0..1.
    pub share: f64,
    /// The heuristic's parameters and median, and the best found (nanoseconds).
    pub default_params: Params,
    pub default_ns: Option<f64>,
    pub best: Option<(Vec<(String, i64)>, f64)>,
    pub space: usize,
    pub pruned: usize,
    pub measured: usize,
    pub failed: usize,
    pub rank_corr: Option<f64>,
    pub modeled: bool,
    pub out_of_time: bool,
    /// Why it was not measured now (already in the database, ...).
    pub skipped: Option<String>,
    /// The first failures, for the report.
    pub failures: Vec<String>,
}

impl KernelTune {
    /// Default over tuned time.
    pub fn speedup(&self) -> Option<f64> {
        Some(self.default_ns? / self.best.as_ref()?.1)
    }
}

/// What [`tune_model`] did.
#[derive(Clone, Debug, Default)]
pub struct TuneReport {
    /// The model's median time with the heuristics, as profiled step by step (ms).
    pub model_ms: f64,
    pub problems: Vec<KernelTune>,
    /// Kernels whose family has no parameters (nothing to tune).
    pub untunable: usize,
    pub notes: Vec<String>,
    pub elapsed: Duration,
}

impl TuneReport {
    /// The model's time estimated with every problem at its tuned time (ms).
    pub fn estimated_tuned_ms(&self) -> f64 {
        let saved: f64 = self
            .problems
            .iter()
            .filter_map(|k| Some(k.share * (1.0 - 1.0 / k.speedup()?)))
            .sum();
        self.model_ms * (1.0 - saved)
    }
}

/// Progress of [`tune_model`], for a progress bar.
pub enum Progress<'a> {
    /// Candidates planned in all (an upper bound).
    Planned(usize),
    /// A problem starts.
    Problem(&'a str),
    /// One more candidate measured.
    Measured,
}


/// A model compiled with the heuristics and profiled: its problems, the family of each, and
/// each kernel's time.
pub(crate) struct Profiled {
    pub graph: Graph,
    pub specs: Vec<ProblemSpec>,
    pub decisions: Vec<(String, Decision)>,
    /// Nanoseconds per run, by kernel name.
    pub per_kernel: HashMap<String, f64>,
    pub total_ns: f64,
    /// When tuning began (the budget counts from it).
    pub started: Instant,
}

/// Random inputs for every graph input (see [`random`]).
pub(crate) fn random_inputs(g: &Graph) -> Result<Vec<Tensor>, Error> {
    let mut rng = StdRng::seed_from_u64(0);
    g.inputs()
        .iter()
        .map(|&v| {
            let ty = &g.value(v).ty;
            let shape = crate::exec::fixed_shape(g, v).unwrap_or_default();
            random(ty.dtype, shape, &mut rng).map_err(Error::Compile)
        })
        .collect()
}

/// Each kernel's time per run (ns) and the total, from three profiled runs after a warm-up;
/// a model that does not run leaves a note (shares unknown).
pub(crate) fn profile_kernels(
    run: &mut dyn FnMut(&mut tilec_runtime::Profile) -> Result<(), Error>,
    report: &mut TuneReport,
) -> (HashMap<String, f64>, f64) {
    let mut per_kernel: HashMap<String, f64> = HashMap::new();
    let mut total_ns = 0.0;
    let mut warm = tilec_runtime::Profile::default();
    let mut prof = tilec_runtime::Profile::default();
    let profiled = run(&mut warm).and_then(|()| (0..3).try_for_each(|_| run(&mut prof)));
    match profiled {
        Ok(()) => {
            for k in &prof.kernels {
                let name = k.name.split(" [").next().unwrap_or(&k.name).to_string();
                let ns = k.total_ns as f64 / 3.0;
                total_ns += ns;
                *per_kernel.entry(name).or_default() += ns;
            }
        }
        Err(e) => report.notes.push(format!("the model did not run on random inputs ({e}); shares unknown")),
    }
    report.model_ms = total_ns / 1e6;
    (per_kernel, total_ns)
}

/// A back end's measurements of one problem's candidates: makes its [`Measurer`] and runs the
/// search with it.
pub(crate) trait Bench<B: 'static> {
    fn search(
        &mut self,
        p: &Problem,
        f: FamilyRef<Target, B>,
        target: &Target,
        cands: &Candidates,
        so: &SearchOptions,
        progress: &mut dyn FnMut(usize),
    ) -> Result<SearchResult, Error>;

    /// Candidates handed to the measurer at once (compiled together).
    fn batch(&self) -> usize;
}

/// Tunes the problems of a profiled model whose family (from `reg`) has parameters: grouped by
/// key and family, most expensive first, the budget split by share, problems the database
/// knows skipped unless `retune`; each result stored in `db` for `ctx`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tune_problems<B: 'static>(
    prof: &Profiled,
    reg: &Registry<Target, B>,
    target: &Target,
    opts: &TuneOptions,
    db: &Db,
    ctx: &Context,
    progress: &mut dyn FnMut(Progress),
    report: &mut TuneReport,
    bench: &mut dyn Bench<B>,
) -> Result<(), Error> {
    let (g, specs, decisions, total_ns) = (&prof.graph, &prof.specs, &prof.decisions, prof.total_ns);
    struct Group {
        spec: usize,
        kernels: Vec<String>,
        ns: f64,
        family: &'static str,
        key: tilec_tune::ProblemKey,
    }
    let mut groups: Vec<Group> = vec![];
    for (i, spec) in specs.iter().enumerate() {
        let Some((_, d)) = decisions.iter().find(|(k, _)| *k == spec.name) else { continue };
        let Some(f) = reg.get(d.family) else { continue };
        let p = Problem::new(g, spec.nodes.clone(), &spec.name, spec.kind, spec.anchor);
        if f.space(&p, target).axes.is_empty() {
            report.untunable += 1;
            continue;
        }
        let key = tilec_tune::problem_key(&p);
        let ns = prof.per_kernel.get(&spec.name).copied().unwrap_or(0.0);
        match groups.iter_mut().find(|gr| gr.family == d.family && gr.key.fingerprint == key.fingerprint && gr.key.shape == key.shape) {
            Some(gr) => {
                gr.kernels.push(spec.name.clone());
                gr.ns += ns;
            }
            None => groups.push(Group { spec: i, kernels: vec![spec.name.clone()], ns, family: d.family, key }),
        }
    }
    groups.sort_by(|a, b| b.ns.total_cmp(&a.ns));
    progress(Progress::Planned(groups.len() * opts.max_candidates));
    let share_of = |ns: f64| if total_ns > 0.0 { ns / total_ns } else { 0.0 };
    let mut left_share: f64 = groups.iter().map(|gr| share_of(gr.ns).max(1e-3)).sum();
    let start = prof.started;
    for gr in &groups {
        let spec = &specs[gr.spec];
        let p = Problem::new(g, spec.nodes.clone(), &spec.name, spec.kind, spec.anchor);
        let f = reg.get(gr.family).ok_or_else(|| Error::Compile(format!("no family {}", gr.family)))?;
        let mut kt = KernelTune {
            kernels: gr.kernels.clone(),
            family: gr.family,
            desc: gr.key.desc.clone(),
            share: share_of(gr.ns),
            default_params: f.heuristic(&p, target),
            default_ns: None,
            best: None,
            space: 0,
            pruned: 0,
            measured: 0,
            failed: 0,
            rank_corr: None,
            modeled: false,
            out_of_time: false,
            skipped: None,
            failures: vec![],
        };
        let my_share = share_of(gr.ns).max(1e-3);
        if !opts.retune {
            if let Some((r, tilec_tune::Match::Exact)) = db.lookup(&gr.key, gr.family, ctx) {
                kt.skipped = Some(format!("tuned on {} (--retune measures again)", r.date()));
                kt.default_ns = Some(r.default_ns);
                kt.best = Some((r.params.clone(), r.tuned_ns));
                kt.measured = r.measured as usize;
                kt.rank_corr = r.rank_corr;
                left_share -= my_share;
                for _ in 0..opts.max_candidates {
                    progress(Progress::Measured);
                }
                report.problems.push(kt);
                continue;
            }
        }
        progress(Progress::Problem(&spec.name));
        let remaining = opts.budget.saturating_sub(start.elapsed());
        let budget = remaining.mul_f64((my_share / left_share.max(1e-9)).clamp(0.0, 1.0));
        left_share -= my_share;
        let cands = tilec_tune::candidates(f, &p, target);
        let so = SearchOptions { max_candidates: opts.max_candidates, budget, batch: bench.batch(), confirm_rounds: 3 };
        let mut done = 0;
        let r = bench.search(&p, f, target, &cands, &so, &mut |n| {
            for _ in done..n {
                progress(Progress::Measured);
            }
            done = n;
        })?;
        for _ in done..opts.max_candidates {
            progress(Progress::Measured);
        }
        kt.space = r.space;
        kt.pruned = r.pruned;
        kt.measured = r.measured.len();
        kt.failed = r.failed();
        kt.rank_corr = r.rank_corr;
        kt.modeled = cands.modeled;
        kt.out_of_time = r.out_of_time;
        kt.default_ns = r.default_ns;
        kt.failures = r
            .measured
            .iter()
            .filter_map(|x| match &x.outcome {
                Outcome::Failed(why) => Some(format!("{}: {why}", x.candidate.params)),
                Outcome::Time { .. } => None,
            })
            .take(3)
            .collect();
        if let (Some((best, ns)), Some(def)) = (&r.best, r.default_ns) {
            let values: Vec<(String, i64)> = best.0.iter().map(|(n, v)| (n.to_string(), *v)).collect();
            kt.best = Some((values.clone(), *ns));
            let mut rec = Record::new(&gr.key, gr.family, ctx, values);
            rec.default_ns = def;
            rec.tuned_ns = *ns;
            rec.measured = r.measured.len() as u32;
            rec.failed = r.failed() as u32;
            rec.space = r.space as u32;
            rec.pruned = r.pruned as u32;
            rec.rank_corr = r.rank_corr;
            db.put(&rec).map_err(|e| Error::Compile(e.to_string()))?;
        } else {
            report.notes.push(format!("{}: the heuristic's parameters did not run; nothing stored", spec.name));
        }
        report.problems.push(kt);
    }
    Ok(())
}
