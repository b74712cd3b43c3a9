//! Tuning on a CUDA GPU: the device's [`Context`] ([`cuda_context`]: its name, compute
//! capability and SMs, the driver's and NVRTC's versions, tilec's version and the CUDA code
//! generator's format), the GPU's [`Measurer`] ([`CudaMeasurer`]) and [`tune_model_cuda`].
//!
//! A candidate is built through its family, compiled by NVRTC with the other candidates of its
//! batch on parallel threads (through the kernel cache), loaded as the executor loads it,
//! checked against the heuristic's results (outputs poisoned with NaN first) and timed: its
//! launches over rotating sets of inputs and outputs are captured into a CUDA graph (as a
//! compiled model runs) and the graph is timed with events, the median per launch. Constants
//! (weights) have one copy, as in a model; a template that repacks them binds to its address.

use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tilec_cuda::families::GpuBuilt;
use tilec_cuda::{Device, DeviceBuffer, GpuKernel, Stream};
use tilec_ir::{DType, Graph, Tensor, ValueDef};
use tilec_opt::target::Target;
use tilec_tile::family::{FamilyRef, Params, Problem};
use tilec_tile::STATUS_WORDS;
use tilec_tune::{Context, Db, Measurer, Outcome, SearchOptions};

use super::{brief, random, Progress, Timing, TuneOptions, TuneReport};
use crate::compiled_cuda::{family_target, CudaOptions};
use crate::exec::cuda::{open_device, Cuda};
use crate::exec::Executor;
use crate::Error;

/// A GPU as the tuning database keys it: `device` its name, `capability` the compute
/// capability and SM count, `tilec_version` tilec's and the CUDA code generator's format,
/// `compiler` the driver's CUDA version (`major * 1000 + minor * 10`) and NVRTC's.
pub fn cuda_context(name: &str, cc: (u32, u32), sm_count: u32, driver: i32, nvrtc: (i32, i32)) -> Context {
    Context {
        device: name.to_string(),
        capability: format!("sm_{}{}, {sm_count} SMs", cc.0, cc.1),
        tilec_version: format!("{}+{}", env!("CARGO_PKG_VERSION"), tilec_cuda::FORMAT_VERSION),
        compiler: format!("CUDA driver {}.{}, NVRTC {}.{}", driver / 1000, (driver % 1000) / 10, nvrtc.0, nvrtc.1),
    }
}

/// The context of an open device with the NVRTC that compiles for it.
pub fn device_context(device: &Device, nvrtc: &tilec_cuda::Nvrtc) -> Context {
    let p = device.props();
    let driver = tilec_cuda::driver_version().unwrap_or(0);
    cuda_context(&p.name, p.compute_capability, p.sm_count, driver, nvrtc.version())
}

/// NVRTC, or an error saying how to find it.
fn load_nvrtc() -> Result<tilec_cuda::Nvrtc, Error> {
    tilec_cuda::Nvrtc::load()
        .map_err(|e| Error::Compile(format!("{e} (put CUDA's lib directory on LD_LIBRARY_PATH or set TILEC_NVRTC_LIB)")))
}

/// The context of GPU `ordinal` (opens it), or why there is none.
pub fn gpu_context(ordinal: usize) -> Result<Context, Error> {
    let device = open_device(ordinal)?;
    Ok(device_context(&device, &load_nvrtc()?))
}

/// Opens the tuning database for reading at `path` (the default one when `None`) for GPU
/// `ordinal`, as `tilec run --target cuda` does: `Ok(None)` when there is no file, an error
/// saying why when it or the device cannot be used.
pub fn open_cuda_tuning(path: Option<&std::path::Path>, ordinal: usize) -> Result<Option<Arc<tilec_tune::Tuning>>, String> {
    let path = path.map(std::path::PathBuf::from).unwrap_or_else(tilec_tune::default_path);
    match Db::open_existing(&path) {
        Ok(Some(db)) => {
            let ctx = gpu_context(ordinal).map_err(|e| e.to_string())?;
            Ok(Some(Arc::new(tilec_tune::Tuning { db, ctx })))
        }
        Ok(None) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Per launch, the graph of timed launches takes at least this long (event resolution).
const SAMPLE_NS: f64 = 200_000.0;
/// Sets of arguments: enough to pass twice the L2, at most this many and this many bytes.
const MAX_SETS: usize = 16;
const MAX_SET_BYTES: usize = 1 << 30;

/// The arguments of a problem's kernels: every candidate has the same parameters.
struct Args {
    /// Owned device memory (constants once, the other parameters per set, status words).
    _bufs: Vec<DeviceBuffer>,
    /// Per set, one address per parameter, then the status words' (used when a kernel
    /// checks indices).
    sets: Vec<Vec<u64>>,
    /// Set 0's output parameters: (address, dtype, shape, bytes).
    outputs: Vec<(u64, DType, Vec<usize>, usize)>,
    /// Set 0's output buffers, to poison and read back (indices into `_bufs`).
    out_bufs: Vec<usize>,
}

/// The GPU's [`Measurer`] (see the module documentation). The first candidate that runs (the
/// heuristic: [`tilec_tune::search`] measures it first) gives the reference results.
pub struct CudaMeasurer<'a> {
    p: &'a Problem<'a>,
    family: FamilyRef<Target, GpuBuilt>,
    target: &'a Target,
    device: &'a Device,
    compiler: &'a tilec_cuda::Compiler,
    stream: Stream,
    timing: Timing,
    args: Option<Args>,
    reference: Option<Vec<Tensor>>,
    /// Builds done.
    pub builds: usize,
}

impl<'a> CudaMeasurer<'a> {
    pub fn new(
        p: &'a Problem<'a>,
        family: FamilyRef<Target, GpuBuilt>,
        target: &'a Target,
        device: &'a Device,
        compiler: &'a tilec_cuda::Compiler,
        timing: Timing,
    ) -> Result<CudaMeasurer<'a>, Error> {
        let stream = device.stream().map_err(|e| Error::Compile(format!("creating a CUDA stream: {e}")))?;
        Ok(CudaMeasurer { p, family, target, device, compiler, stream, timing, args: None, reference: None, builds: 0 })
    }

    /// The argument sets, made from the first built kernel: constants uploaded once, set 0's
    /// inputs random, the other sets copies of it on the device.
    fn ensure_args(&mut self, b: &GpuBuilt) -> Result<(), String> {
        if self.args.is_some() {
            return Ok(());
        }
        let g = self.p.graph;
        let k = &b.lowered.kernel;
        let n_in = b.lowered.inputs.len();
        let mut rng = StdRng::seed_from_u64(1);
        let dev = |e: tilec_cuda::CudaError| e.to_string();
        let mut bufs: Vec<DeviceBuffer> = vec![];
        // Per parameter: Some(buffer index) when shared by every set (a constant).
        let mut shared: Vec<Option<usize>> = vec![];
        let mut first: Vec<u64> = vec![];
        let mut per_set = 0usize;
        let mut outputs = vec![];
        let mut out_bufs = vec![];
        for (i, &bid) in k.params.iter().enumerate() {
            let buf = k.buf(bid);
            let shape: Vec<usize> = buf.shape.iter().map(|&d| d.max(0) as usize).collect();
            let numel: usize = shape.iter().product();
            let bytes = numel * buf.dtype.size_bytes();
            let value = (i < n_in).then(|| b.lowered.inputs[i]);
            let konst = value.and_then(|v| match &g.value(v).def {
                ValueDef::Const(t) if t.dtype() == buf.dtype && t.numel() == numel => Some(t.clone()),
                _ => None,
            });
            let d = match konst {
                Some(t) => self.device.upload(&t).map_err(dev)?,
                None if i < n_in => self.device.upload(&random(buf.dtype, shape.clone(), &mut rng)?).map_err(dev)?,
                None => self.device.alloc(bytes.max(16)).map_err(dev)?,
            };
            first.push(d.ptr());
            if i >= n_in {
                outputs.push((d.ptr(), buf.dtype, shape, bytes));
                out_bufs.push(bufs.len());
            }
            let is_const = value.is_some_and(|v| matches!(g.value(v).def, ValueDef::Const(_)));
            shared.push(is_const.then_some(bufs.len()));
            if !is_const {
                per_set += bytes.max(16);
            }
            bufs.push(d);
        }
        let status = self.device.alloc(STATUS_WORDS * 8).map_err(dev)?;
        status.fill(&self.stream, 0, STATUS_WORDS * 8, 0).map_err(dev)?;
        first.push(status.ptr());
        bufs.push(status);
        // More sets while they stay small, so that the operands come from DRAM as in a model
        // (where other kernels run in between), not from the L2 the last launch filled.
        let l2 = self.target.gpu.l2_bytes.max(1 << 20);
        let n_sets = (2 * l2).div_ceil(per_set.max(1)).clamp(1, MAX_SETS).min((MAX_SET_BYTES / per_set.max(1)).max(1));
        let mut sets = vec![first.clone()];
        for _ in 1..n_sets {
            let mut s = vec![];
            for (j, src) in first.iter().enumerate().take(k.params.len()) {
                match shared[j] {
                    Some(_) => s.push(*src),
                    None => {
                        let len = bufs[j].len();
                        let d = self.device.alloc(len).map_err(dev)?;
                        tilec_cuda::driver::copy_dtod(&self.stream, d.ptr(), *src, len).map_err(dev)?;
                        s.push(d.ptr());
                        bufs.push(d);
                    }
                }
            }
            let st = self.device.alloc(STATUS_WORDS * 8).map_err(dev)?;
            st.fill(&self.stream, 0, STATUS_WORDS * 8, 0).map_err(dev)?;
            s.push(st.ptr());
            bufs.push(st);
            sets.push(s);
        }
        self.stream.synchronize().map_err(dev)?;
        self.args = Some(Args { _bufs: bufs, sets, outputs, out_bufs });
        Ok(())
    }

    /// The results' tolerance for the output dtype (other tile shapes and K splits sum in
    /// another order).
    fn tolerance(&self, d: DType) -> f64 {
        match d {
            DType::F32 if self.target.gpu.allow_tf32 => 1e-2,
            DType::F32 | DType::F64 => 1e-3,
            DType::F16 | DType::BF16 => 2e-2,
            d if d.is_float() => 0.125,
            _ => 0.0,
        }
    }

    /// Checks a loaded candidate's results, then times it.
    fn time(&mut self, gk: &GpuKernel) -> Result<Outcome, String> {
        let args = self.args.take().ok_or("no arguments")?;
        let r = self.time_with(&args, gk);
        self.args = Some(args);
        r
    }

    fn time_with(&mut self, args: &Args, gk: &GpuKernel) -> Result<Outcome, String> {
        let dev = |e: tilec_cuda::CudaError| e.to_string();
        let n = gk.params.len();
        let sets: Vec<&[u64]> = args.sets.iter().map(|s| &s[..n.min(s.len())]).collect();
        if sets.iter().any(|s| s.len() != n) {
            return Err(format!("{n} arguments expected, {} planned", sets[0].len()));
        }
        for s in &sets {
            gk.bind(&self.stream, s).map_err(|e| format!("bind: {e}"))?;
        }
        // Outputs poisoned (NaN for floats): an element the kernel does not write cannot match.
        for &j in &args.out_bufs {
            let b = &args._bufs[j];
            b.fill(&self.stream, 0, b.len(), 0xFF).map_err(dev)?;
        }
        gk.launch(&self.stream, sets[0]).map_err(|e| format!("launch: {e}"))?;
        self.stream.synchronize().map_err(|e| format!("run: {e}"))?;
        let mut outs = vec![];
        for (j, (_, dtype, shape, _)) in args.outputs.iter().enumerate() {
            outs.push(args._bufs[args.out_bufs[j]].download(0, *dtype, shape).map_err(dev)?);
        }
        match &self.reference {
            None => self.reference = Some(outs),
            Some(want) => {
                for (w, got) in want.iter().zip(&outs) {
                    let tol = self.tolerance(w.dtype());
                    match crate::compare::compare(w, got, tol, tol) {
                        Ok(c) if c.ok() => {}
                        Ok(c) => {
                            return Ok(Outcome::Failed(format!(
                                "wrong results: {} of {} elements differ from the heuristic's (max abs err {:.3e})",
                                c.mismatches, c.count, c.max_abs
                            )))
                        }
                        Err(e) => return Ok(Outcome::Failed(format!("wrong results: {e}"))),
                    }
                }
            }
        }
        // One launch per set, captured as a compiled model's runs are; timed once to size the
        // graph that is timed.
        let capture = |reps: usize| {
            self.stream.capture(|s| {
                for _ in 0..reps {
                    for a in &sets {
                        gk.launch(s, a)?;
                    }
                }
                Ok(())
            })
        };
        let start = self.device.event().map_err(dev)?;
        let end = self.device.event().map_err(dev)?;
        let time_graph = |g: &tilec_cuda::Graph| -> Result<f64, String> {
            start.record(&self.stream).map_err(dev)?;
            g.launch(&self.stream).map_err(|e| format!("launch: {e}"))?;
            end.record(&self.stream).map_err(dev)?;
            self.stream.synchronize().map_err(|e| format!("run: {e}"))?;
            Ok(end.elapsed_ms_since(&start).map_err(dev)? as f64 * 1e6)
        };
        let once = capture(1).map_err(|e| format!("capture: {e}"))?;
        time_graph(&once)?;
        let per = time_graph(&once)? / sets.len() as f64;
        let reps = (SAMPLE_NS / (per.max(1.0) * sets.len() as f64)).ceil().clamp(1.0, 64.0) as usize;
        let graph = capture(reps).map_err(|e| format!("capture: {e}"))?;
        let launches = (reps * sets.len()) as f64;
        let mut times = vec![];
        let t0 = Instant::now();
        while times.len() < self.timing.min_runs || (t0.elapsed() < self.timing.min_time && times.len() < self.timing.max_runs) {
            times.push(time_graph(&graph)? / launches);
        }
        times.sort_by(f64::total_cmp);
        Ok(Outcome::Time { median_ns: times[times.len() / 2], runs: times.len() })
    }
}

impl Measurer for CudaMeasurer<'_> {
    fn measure(&mut self, batch: &[Params]) -> Vec<Outcome> {
        let mut outs: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut built: Vec<(usize, GpuBuilt)> = vec![];
        for (i, q) in batch.iter().enumerate() {
            self.builds += 1;
            match self.family.build(self.p, self.target, q) {
                Ok(b) => match self.ensure_args(&b) {
                    Ok(()) => built.push((i, b)),
                    Err(e) => outs[i] = Some(Outcome::Failed(format!("its arguments: {}", brief(&e)))),
                },
                Err(e) => outs[i] = Some(Outcome::Failed(format!("build: {}", brief(&e)))),
            }
        }
        // NVRTC on parallel threads (identical sources once, the kernel cache first); a
        // library kernel has nothing to compile.
        let modules: Vec<(String, String)> = built
            .iter()
            .filter(|(_, b)| !b.source.source.is_empty())
            .map(|(_, b)| (b.source.name.clone(), b.source.source.clone()))
            .collect();
        let mut compiled = self.compiler.compile_many(&modules).into_iter();
        for (i, b) in &built {
            let c = if b.source.source.is_empty() {
                Ok(tilec_cuda::Compiled { name: b.source.name.clone(), image: vec![], cache_hit: false })
            } else {
                compiled.next().unwrap_or_else(|| Err(tilec_cuda::CudaError::Usage("not compiled".into())))
            };
            let loaded = c.map_err(|e| format!("compile: {}", brief(&e.to_string()))).and_then(|c| {
                match &b.plan {
                    Some(plan) => GpuKernel::from_family(self.device, &b.lowered.kernel, plan, &c.image, c.cache_hit),
                    None => GpuKernel::from_image(self.device, &b.scheduled, b.source.launch, &c.image, c.cache_hit),
                }
                .map_err(|e| format!("load: {}", brief(&e.to_string())))
            });
            outs[*i] = Some(match loaded.and_then(|gk| self.time(&gk)) {
                Ok(o) => o,
                Err(e) => Outcome::Failed(brief(&e)),
            });
        }
        outs.into_iter().map(|o| o.unwrap_or_else(|| Outcome::Failed("not measured".into()))).collect()
    }
}

/// The GPU's measurements of one problem's candidates.
struct CudaBench {
    device: Device,
    compiler: tilec_cuda::Compiler,
    timing: Timing,
    batch: usize,
}

impl super::Bench<GpuBuilt> for CudaBench {
    fn search(
        &mut self,
        p: &Problem,
        f: FamilyRef<Target, GpuBuilt>,
        target: &Target,
        cands: &tilec_tune::Candidates,
        so: &SearchOptions,
        progress: &mut dyn FnMut(usize),
    ) -> Result<tilec_tune::SearchResult, Error> {
        let mut m = CudaMeasurer::new(p, f, target, &self.device, &self.compiler, self.timing.clone())?;
        Ok(tilec_tune::search(cands, &mut m, so, progress))
    }

    fn batch(&self) -> usize {
        self.batch
    }
}

/// Tunes every kernel of `graph` (concrete shapes) whose GPU family has parameters on GPU
/// `opts.cuda.device`, writing the results to `db` for its context (returned with the report).
pub fn tune_model_cuda(
    graph: &Graph,
    opts: &TuneOptions,
    db: &Db,
    progress: &mut dyn FnMut(Progress),
) -> Result<(Context, TuneReport), Error> {
    let t0 = Instant::now();
    let copts = CudaOptions { tuning: None, ..opts.cuda.clone() };
    let cuda = Cuda::open(copts.device, copts.cache_dir.clone())?;
    let gpu = cuda.device().props().gpu_target();
    let device = open_device(copts.device)?;
    let nvrtc = load_nvrtc()?;
    let ctx = device_context(&device, &nvrtc);
    let cache = copts.cache_dir.clone().or_else(tilec_cuda::nvrtc::default_cache_dir);
    let compiler = tilec_cuda::Compiler::new(nvrtc, &device.props().arch()).with_cache_dir(cache);
    let prep = crate::compiled_cuda::prepare(graph, &copts, &gpu)?;
    let mut report = TuneReport::default();
    if prep.interpreted() {
        report.notes.push(super::NOT_CONCRETE.into());
        return Ok((ctx, report));
    }
    let target = family_target(&copts, &gpu);
    let specs = prep.problems().to_vec();
    let decisions = prep.report.decisions.clone();
    let g = prep.graph().clone();
    let mut c = Executor::load(prep, cuda)?;
    let inputs = super::random_inputs(&g)?;
    let (per_kernel, total_ns) = super::profile_kernels(&mut |prof| c.run_profiled(&inputs, Some(prof)).map(drop), &mut report);
    drop(c);
    let prof = super::Profiled { graph: g, specs, decisions, per_kernel, total_ns, started: t0 };
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let mut bench = CudaBench { device, compiler, timing: opts.timing.clone(), batch: threads.clamp(2, 8) };
    super::tune_problems(&prof, tilec_cuda::families::registry(), &target, opts, db, &ctx, progress, &mut report, &mut bench)?;
    drop(bench);
    warm_kernel_cache(graph, opts, db, &ctx, &mut report);
    report.elapsed = t0.elapsed();
    Ok((ctx, report))
}

/// Compiles the model once as `run` will, with the parameters just stored, so that the next
/// compile finds every kernel in the kernel cache: the tuner measured one kernel of each group
/// of equal problems, and the others are sources of their own (kernel and buffer names).
fn warm_kernel_cache(graph: &Graph, opts: &TuneOptions, db: &Db, ctx: &Context, report: &mut TuneReport) {
    let note = match Db::open_existing(db.path()) {
        Ok(Some(db)) => {
            let tuning = Some(Arc::new(tilec_tune::Tuning { db, ctx: ctx.clone() }));
            let copts = CudaOptions { tuning, ..opts.cuda.clone() };
            match crate::compiled_cuda::compile(graph, &copts) {
                Ok(c) => format!(
                    "kernel cache warmed for the next compile: {} kernels, {} newly compiled",
                    c.report.kernels,
                    c.report.kernels.saturating_sub(c.report.cache_hits)
                ),
                Err(e) => format!("the kernel cache was not warmed: {e}"),
            }
        }
        Ok(None) => "the kernel cache was not warmed: the tuning database is gone".into(),
        Err(e) => format!("the kernel cache was not warmed: {e}"),
    };
    report.notes.push(note);
}
