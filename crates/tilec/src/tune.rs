//! Tuning on the CPU: the host's [`Context`] (what a measurement holds for), the CPU's
//! [`Measurer`] ([`CpuMeasurer`]: build a candidate through its family, compile it, time it on
//! rotating inputs) and [`tune_model`], which tunes every kernel of a model whose family has
//! parameters and stores the results in the tuning database (`tilec_tune::db`).
//!
//! A model is first compiled with the heuristics and profiled, so that every kernel's share of
//! the model's time is known; kernels that are the same problem (a repeated block) are tuned
//! once; the most expensive go first and the budget is split in proportion to the shares.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilec_ir::{DType, Graph, Tensor, ValueDef};
use tilec_opt::target::Target;
use tilec_tile::family::{FamilyRef, Params, Problem};
use tilec_tile::STATUS_WORDS;
use tilec_tune::{Context, Db, Measurer, Outcome, Record, SearchOptions};

use crate::compiled::{CompileOptions, CpuBuilt};
use crate::exec::cpu::Cpu;
use crate::exec::Executor;
use crate::Error;

/// The host CPU as the tuning database keys it: model name, ISA and threads, tilec's version
/// and code-generator format, the C compiler's version.
pub fn host_context(threads: usize) -> Context {
    let id = tilec_cpu::compiler::host_cpu_id();
    let model = id
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("unknown {} CPU", std::env::consts::ARCH));
    let cpu = Target::host_cpu().cpu;
    let mut isa: Vec<&str> = vec![];
    for (on, name) in [(cpu.avx512f, "avx512f"), (cpu.avx2, "avx2"), (cpu.fma, "fma")] {
        if on {
            isa.push(name);
        }
    }
    if isa.is_empty() {
        isa.push("scalar");
    }
    let compiler = tilec_cpu::Compiler::new(tilec_cpu::CompileOptions::default())
        .cc_version()
        .map(|v| v.lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|_| "no C compiler".to_string());
    Context {
        device: model,
        capability: format!("{}; {threads} threads", isa.join(",")),
        tilec_version: format!("{}+{}", env!("CARGO_PKG_VERSION"), tilec_cpu::compiler::FORMAT_VERSION),
        compiler,
    }
}

/// Opens the tuning database for reading at `path` (the default one when `None`), as `tilec
/// run` does: `Ok(None)` when there is no file, an error saying why when it cannot be used.
pub fn open_tuning(path: Option<&std::path::Path>, threads: usize) -> Result<Option<Arc<tilec_tune::Tuning>>, String> {
    let path = path.map(PathBuf::from).unwrap_or_else(tilec_tune::default_path);
    match Db::open_existing(&path) {
        Ok(Some(db)) => Ok(Some(Arc::new(tilec_tune::Tuning { db, ctx: host_context(threads) }))),
        Ok(None) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// A folder of the temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let d = std::env::temp_dir().join(format!("tilec-tune-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&d)?;
        Ok(TempDir(d))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Bytes with 64-byte alignment (packed operands).
struct Aligned(Vec<u64>);

impl Aligned {
    fn new(n: usize) -> Aligned {
        Aligned(vec![0u64; n.div_ceil(8) + 8])
    }
    fn ptr(&mut self) -> *mut c_void {
        let base = self.0.as_mut_ptr() as usize;
        (base + (64 - base % 64) % 64) as *mut c_void
    }
}

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

/// The CPU's [`Measurer`]: builds each candidate with its family, compiles a batch into one
/// library (one by one when the batch does not compile, so a failing candidate fails alone),
/// checks its results against the first candidate that ran (the heuristic), and times it: a
/// warm-up, then runs on rotating sets of inputs (so that the operands are not all in cache),
/// the median. Constant operands are the graph's and are packed once, as the executor does.
pub struct CpuMeasurer<'a> {
    p: &'a Problem<'a>,
    family: FamilyRef<Target, CpuBuilt>,
    target: &'a Target,
    compiler: tilec_cpu::Compiler,
    threads: usize,
    timing: Timing,
    /// Per set, one tensor per kernel parameter (constants shared by value).
    sets: Vec<Vec<Tensor>>,
    /// Which parameters are graph constants; which are outputs.
    constant: Vec<bool>,
    output: Vec<bool>,
    /// The first results (the heuristic's), per output parameter.
    reference: Option<Vec<Tensor>>,
    /// Builds done (the pruning test counts them).
    pub builds: usize,
    counter: usize,
    seed: u64,
    _dir: TempDir,
}

impl<'a> CpuMeasurer<'a> {
    /// A measurer of `family` on `p`; compiled candidates go to a temporary folder.
    pub fn new(
        p: &'a Problem<'a>,
        family: FamilyRef<Target, CpuBuilt>,
        target: &'a Target,
        threads: usize,
        timing: Timing,
    ) -> Result<CpuMeasurer<'a>, Error> {
        let dir = TempDir::new().map_err(|e| Error::Compile(format!("creating a folder for the candidates: {e}")))?;
        let cc = tilec_cpu::CompileOptions { cache_dir: Some(dir.0.clone()), ..Default::default() };
        Ok(CpuMeasurer {
            p,
            family,
            target,
            compiler: tilec_cpu::Compiler::new(cc),
            threads,
            timing,
            sets: vec![],
            constant: vec![],
            output: vec![],
            reference: None,
            builds: 0,
            counter: 0,
            seed: 1,
            _dir: dir,
        })
    }

    /// The argument sets, made from the first built kernel (every candidate of a problem has
    /// the same parameters).
    fn ensure_args(&mut self, b: &CpuBuilt) -> Result<(), String> {
        if !self.sets.is_empty() {
            return Ok(());
        }
        let g = self.p.graph;
        let k = &b.kernel;
        let n_in = b.lowered.inputs.len();
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut first = vec![];
        for (i, &bid) in k.params.iter().enumerate() {
            let buf = k.buf(bid);
            let shape: Vec<usize> = buf.shape.iter().map(|&d| d.max(0) as usize).collect();
            let numel: usize = shape.iter().product();
            let value = if i < n_in { Some(b.lowered.inputs[i]) } else { None };
            let konst = value.and_then(|v| match &g.value(v).def {
                ValueDef::Const(t) if t.dtype() == buf.dtype && t.numel() == numel => Some(t.clone()),
                _ => None,
            });
            self.constant.push(konst.is_some());
            self.output.push(i >= n_in);
            first.push(match konst {
                Some(t) => t.reshaped(shape).map_err(|e| e.to_string())?,
                None => random(buf.dtype, shape, &mut rng)?,
            });
        }
        // More sets while they stay small: rotating them keeps operands out of cache between
        // runs, as in a model, where other kernels run in between.
        let bytes: usize =
            first.iter().zip(&self.constant).filter(|(_, c)| !**c).map(|(t, _)| t.numel() * t.dtype().size_bytes()).sum();
        let n_sets = (64usize << 20).checked_div(bytes.max(1)).unwrap_or(1).clamp(1, 3);
        for _ in 1..n_sets {
            let mut s = vec![];
            for (t, &c) in first.iter().zip(&self.constant) {
                s.push(if c { t.clone() } else { random(t.dtype(), t.shape().to_vec(), &mut rng)? });
            }
            self.sets.push(s);
        }
        self.sets.insert(0, first);
        Ok(())
    }

    /// Times one compiled candidate; checks its results first.
    fn time(&mut self, module: &tilec_cpu::Module, name: &str, checks: bool) -> Outcome {
        let Some(func) = module.get(name) else { return Outcome::Failed("missing from the compiled library".into()) };
        // Outputs poisoned (NaN) for the checked run: an element the kernel does not write
        // cannot match.
        for (t, &o) in self.sets[0].iter_mut().zip(&self.output) {
            if o && t.dtype().is_float() {
                *t = Tensor::from_f64s(t.dtype(), t.shape().to_vec(), &vec![f64::NAN; t.numel()]).unwrap_or_else(|_| t.clone());
            }
        }
        let mut status: Vec<Vec<i64>> = self.sets.iter().map(|_| vec![0i64; STATUS_WORDS]).collect();
        let mut ptrs: Vec<Vec<*mut c_void>> = vec![];
        for (s, st) in self.sets.iter_mut().zip(status.iter_mut()) {
            let mut v: Vec<*mut c_void> = s.iter_mut().map(tilec_cpu::tensor_ptr).collect();
            if checks {
                v.push(st.as_mut_ptr() as *mut c_void);
            }
            ptrs.push(v);
        }
        // Constant operands packed once (from set 0: constants are the same in every set).
        let mut packs: Vec<Aligned> = vec![];
        let mut packed: Vec<*mut c_void> = vec![];
        let entry = module.get_packed(name);
        if let Some((_, pack)) = entry {
            for (i, slot) in module.packs(name).iter().enumerate() {
                if slot.params.iter().all(|&q| self.constant.get(q) == Some(&true)) {
                    let mut a = Aligned::new(slot.bytes);
                    // SAFETY: the pack function reads only the slot's (constant, live)
                    // parameters and writes `slot.bytes` bytes at the aligned buffer.
                    unsafe { pack(ptrs[0].as_ptr(), i as i64, a.ptr()) };
                    packed.push(a.ptr());
                    packs.push(a);
                } else {
                    packed.push(std::ptr::null_mut());
                }
            }
        }
        let prepacked = entry.filter(|_| packed.iter().any(|p| !p.is_null())).map(|(f, _)| f);
        let call = |set: usize| match prepacked {
            // SAFETY: every pointer addresses a live tensor of the dtype and element count the
            // kernel was compiled for (made from its parameters), the status words follow when
            // it checks indices; packed entries hold their slots' operands.
            Some(f) => unsafe { f(ptrs[set].as_ptr(), packed.as_ptr()) },
            // SAFETY: as above.
            None => unsafe { func(ptrs[set].as_ptr()) },
        };
        call(0);
        let outs: Vec<Tensor> =
            self.sets[0].iter().zip(&self.output).filter(|(_, o)| **o).map(|(t, _)| t.clone()).collect();
        match &self.reference {
            None => self.reference = Some(outs),
            Some(want) => {
                for (w, got) in want.iter().zip(&outs) {
                    match crate::compare::compare(w, got, 1e-3, 1e-3) {
                        Ok(c) if c.ok() => {}
                        Ok(c) => {
                            return Outcome::Failed(format!(
                                "wrong results: {} of {} elements differ from the heuristic's (max abs err {:.3e})",
                                c.mismatches, c.count, c.max_abs
                            ))
                        }
                        Err(e) => return Outcome::Failed(format!("wrong results: {e}")),
                    }
                }
            }
        }
        let mut times = vec![];
        let start = Instant::now();
        while times.len() < self.timing.min_runs
            || (start.elapsed() < self.timing.min_time && times.len() < self.timing.max_runs)
        {
            let set = times.len() % self.sets.len();
            let t = Instant::now();
            call(set);
            times.push(t.elapsed().as_nanos() as f64);
        }
        drop(packs);
        times.sort_by(f64::total_cmp);
        Outcome::Time { median_ns: times[times.len() / 2], runs: times.len() }
    }
}

/// Random values: floats uniform in [-1, 1), integers and bools zero (indices stay in range).
fn random(dtype: DType, shape: Vec<usize>, rng: &mut StdRng) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = if dtype.is_float() { (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect() } else { vec![0.0; n] };
    Tensor::from_f64s(dtype, shape, &vals).map_err(|e| e.to_string())
}

/// The first line of an error, shortened.
fn brief(s: &str) -> String {
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

impl Measurer for CpuMeasurer<'_> {
    fn measure(&mut self, batch: &[Params]) -> Vec<Outcome> {
        let mut outs: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut built: Vec<(usize, tilec_tile::Kernel)> = vec![];
        for (i, q) in batch.iter().enumerate() {
            self.builds += 1;
            match self.family.build(self.p, self.target, q) {
                Ok(b) => {
                    if let Err(e) = self.ensure_args(&b) {
                        outs[i] = Some(Outcome::Failed(format!("its arguments: {e}")));
                        continue;
                    }
                    let mut k = b.kernel;
                    self.counter += 1;
                    k.name = format!("{}_cand{}", self.p.name, self.counter);
                    built.push((i, k));
                }
                Err(e) => outs[i] = Some(Outcome::Failed(format!("build: {}", brief(&e)))),
            }
        }
        let kernels: Vec<tilec_tile::Kernel> = built.iter().map(|(_, k)| k.clone()).collect();
        let mut modules: Vec<(Vec<usize>, Result<tilec_cpu::Module, String>)> = vec![];
        match self.compiler.compile(&kernels) {
            Ok(m) => modules.push(((0..built.len()).collect(), Ok(m))),
            Err(_) => {
                for (j, k) in kernels.iter().enumerate() {
                    let r = self.compiler.compile(std::slice::from_ref(k)).map_err(|e| brief(&e.to_string()));
                    modules.push((vec![j], r));
                }
            }
        }
        for (idx, m) in modules {
            match m {
                Ok(module) => {
                    module.set_threads(self.threads);
                    for j in idx {
                        let (i, k) = &built[j];
                        outs[*i] = Some(self.time(&module, &k.name, !k.checks.is_empty()));
                    }
                    // Never unloaded: threads keep its per-thread scratch (see `exec::cpu`).
                    std::mem::forget(module);
                }
                Err(e) => {
                    for j in idx {
                        outs[built[j].0] = Some(Outcome::Failed(format!("compile: {e}")));
                    }
                }
            }
        }
        outs.into_iter().map(|o| o.unwrap_or_else(|| Outcome::Failed("not measured".into()))).collect()
    }
}

/// Options of [`tune_model`].
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// How the model is compiled (threads, families forced, ...; its `tuning` is ignored).
    pub compile: CompileOptions,
    /// Wall-clock budget of the measurements, all kernels together.
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

/// Tunes every kernel of `graph` (concrete shapes) whose family has parameters, writing the
/// results to `db` for the machine `ctx` (see the module documentation).
pub fn tune_model(
    graph: &Graph,
    opts: &TuneOptions,
    db: &Db,
    ctx: &Context,
    progress: &mut dyn FnMut(Progress),
) -> Result<TuneReport, Error> {
    let t0 = Instant::now();
    let mut copts = opts.compile.clone();
    copts.tuning = None;
    let prep = crate::compiled::prepare(graph, &copts)?;
    let mut report = TuneReport::default();
    if prep.interpreted() {
        report.notes.push("the model's shapes are not concrete: nothing to tune (fix them with --dim or --input)".into());
        return Ok(report);
    }
    let target = Target::host_cpu();
    let reg = tilec_cpu::families::registry();
    let specs = prep.problems().to_vec();
    let decisions = prep.report.decisions.clone();
    let g = prep.graph().clone();

    // Every kernel's time with the heuristics, from a profile of the model.
    let mut c = Executor::load(prep, Cpu::new(copts.cache_dir.clone(), copts.threads))?;
    let mut rng = StdRng::seed_from_u64(0);
    let inputs: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&v| {
            let ty = &g.value(v).ty;
            let shape = crate::exec::fixed_shape(&g, v).unwrap_or_default();
            random(ty.dtype, shape, &mut rng).map_err(Error::Compile)
        })
        .collect::<Result<_, _>>()?;
    let mut per_kernel: HashMap<String, f64> = HashMap::new();
    let mut total_ns = 0.0;
    let mut prof = tilec_runtime::Profile::default();
    let profiled = (0..3).try_for_each(|_| c.run_profiled(&inputs, Some(&mut prof)).map(|_| ()));
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

    // Problems to tune, grouped by key and family, most expensive first.
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
        let p = Problem::new(&g, spec.nodes.clone(), &spec.name, spec.kind, spec.anchor);
        if f.space(&p, &target).axes.is_empty() {
            report.untunable += 1;
            continue;
        }
        let key = tilec_tune::problem_key(&p);
        let ns = per_kernel.get(&spec.name).copied().unwrap_or(0.0);
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
    let start = Instant::now();
    for gr in &groups {
        let spec = &specs[gr.spec];
        let p = Problem::new(&g, spec.nodes.clone(), &spec.name, spec.kind, spec.anchor);
        let f = reg.get(gr.family).ok_or_else(|| Error::Compile(format!("no family {}", gr.family)))?;
        let mut kt = KernelTune {
            kernels: gr.kernels.clone(),
            family: gr.family,
            desc: gr.key.desc.clone(),
            share: share_of(gr.ns),
            default_params: f.heuristic(&p, &target),
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
        let cands = tilec_tune::candidates(f, &p, &target);
        let mut m = CpuMeasurer::new(&p, f, &target, copts.threads, opts.timing.clone())?;
        let so = SearchOptions { max_candidates: opts.max_candidates, budget, batch: 4, confirm_rounds: 3 };
        let mut done = 0;
        let r = tilec_tune::search(&cands, &mut m, &so, &mut |n| {
            for _ in done..n {
                progress(Progress::Measured);
            }
            done = n;
        });
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
    report.elapsed = t0.elapsed();
    Ok(report)
}
