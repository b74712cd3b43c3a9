//! Tuning on the CPU: the host's [`Context`] (what a measurement holds for), the CPU's
//! [`Measurer`] ([`CpuMeasurer`]: build a candidate through its family, compile it, time it on
//! rotating inputs) and [`tune_model`].

use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tilec_ir::{Graph, Tensor, ValueDef};
use tilec_opt::target::Target;
use tilec_tile::family::{FamilyRef, Params, Problem};
use tilec_tile::STATUS_WORDS;
use tilec_tune::{Context, Db, Measurer, Outcome, SearchOptions};

use super::{brief, random, Progress, Timing, TuneOptions, TuneReport};
use crate::compiled::CpuBuilt;
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

/// Tunes every kernel of `graph` (concrete shapes) whose family has parameters on this CPU,
/// writing the results to `db` for the machine `ctx` (see [`super`]).
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
        report.notes.push(super::NOT_CONCRETE.into());
        return Ok(report);
    }
    let target = Target::host_cpu();
    let specs = prep.problems().to_vec();
    let decisions = prep.report.decisions.clone();
    let g = prep.graph().clone();
    // Every kernel's time with the heuristics, from a profile of the model.
    let mut c = Executor::load(prep, Cpu::new(copts.cache_dir.clone(), copts.threads))?;
    let inputs = super::random_inputs(&g)?;
    let (per_kernel, total_ns) = super::profile_kernels(&mut |prof| c.run_profiled(&inputs, Some(prof)).map(drop), &mut report);
    let prof = super::Profiled { graph: g, specs, decisions, per_kernel, total_ns, started: t0 };
    let mut bench = CpuBench { threads: copts.threads, timing: opts.timing.clone() };
    super::tune_problems(&prof, tilec_cpu::families::registry(), &target, opts, db, ctx, progress, &mut report, &mut bench)?;
    report.elapsed = t0.elapsed();
    Ok(report)
}

/// The CPU's measurements of one problem's candidates.
struct CpuBench {
    threads: usize,
    timing: Timing,
}

impl super::Bench<CpuBuilt> for CpuBench {
    fn search(
        &mut self,
        p: &Problem,
        f: FamilyRef<Target, CpuBuilt>,
        target: &Target,
        cands: &tilec_tune::Candidates,
        so: &SearchOptions,
        progress: &mut dyn FnMut(usize),
    ) -> Result<tilec_tune::SearchResult, Error> {
        let mut m = CpuMeasurer::new(p, f, target, self.threads, self.timing.clone())?;
        Ok(tilec_tune::search(cands, &mut m, so, progress))
    }

    fn batch(&self) -> usize {
        4
    }
}
