//! The executor of compiled models, one for every back end.
//!
//! A back end contributes two things: a [`Build`] (its kernel families: given a [`Problem`] and
//! a target description, build the kernel and say which family did, no device needed) and a
//! [`Backend`] (compile the built kernels and load them, own the arena and the constants,
//! move bytes in and out, launch a kernel bound to its argument addresses, synchronize).
//! Everything else lives here, once:
//!
//! - [`prepare`] (`steps.rs`): optimize for the target, partition, build each group (a group that
//!   does not build whole is built in runs of its nodes that do; a node that does not alone becomes a *host step*
//!   on the reference interpreter), add the producers no group covers, order the steps. A graph
//!   whose shapes stay symbolic (data-dependent sizes) runs on the interpreter as a whole.
//! - [`Executor::load`] (`plan.rs`): compile and load the kernels (one that fails to load runs
//!   on the host), plan the arena over the steps' lifetimes, upload the constants kernels read,
//!   place one status slot per checking kernel after the arena, bind every kernel's arguments.
//! - running: input validation, runs of device steps between host steps (a back end may replay
//!   them as one unit, e.g. a CUDA graph), host steps, the index-check status read at every
//!   synchronization, profiling, poisoning, and `check_steps` (`check.rs`), which compares every
//!   step with the interpreter through [`crate::compare`].
//!
//! The CPU back end is `cpu.rs`, the CUDA one `cuda.rs`; another device is one more pair of
//! impls.

mod check;
pub mod cpu;
pub mod cuda;
pub mod paged;
mod plan;
mod raw;
mod state;
mod steps;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tilec_ir::{Graph, NodeId, Tensor, ValueDef, ValueId};
use tilec_opt::target::Target;
use tilec_runtime::{BufferReq, MemoryPlan, Profile};
use tilec_tile::family::{dispatch, Choices, Decision, Problem, Registry};
use tilec_tile::{CheckSite, IndexViolation, STATUS_WORDS};

use crate::Error;

pub use raw::{Memory, RawTensor};
pub use steps::{prepare, Prepared, ProblemSpec};

/// Bytes of one checking step's status words: every kernel argument stays 16-byte aligned.
pub const STATUS_STRIDE: usize = (STATUS_WORDS * 8).next_multiple_of(16);

/// The families that did not build a problem, with their reasons.
pub type Rejections = Vec<(&'static str, String)>;

/// How a back end builds kernels for its target (no device needed): through its family
/// registry, each kernel by the family [`dispatch`] chooses.
pub trait Build {
    /// What the back end's families build.
    type Family: 'static;
    /// A kernel as the executor keeps it (the family's build, completed).
    type Built;

    /// The back end's families, in the order they are tried.
    fn registry() -> &'static Registry<Target, Self::Family>;

    /// Completes a family's build of `p` (options of the back end applied).
    fn finish(&self, p: &Problem, built: Self::Family, d: &Decision) -> Self::Built;

    /// The kernel's parameters as graph values: inputs, then outputs (the ABI order).
    fn params(b: &Self::Built) -> (&[ValueId], &[ValueId]);

    /// The kernel's index check sites (when any, its last argument is a status slot).
    fn checks(b: &Self::Built) -> &[CheckSite];

    /// Checks `--family OP=NAME` choices: every family must exist on this target.
    fn check_forced(&self, forced: &[(String, String)]) -> Result<(), String> {
        Self::registry().check_forced(forced)
    }

    /// Builds the kernel of a problem for a target with the family the choices and the registry
    /// give.
    fn build(&self, p: &Problem, target: &Target, choices: &Choices) -> Result<(Self::Built, Decision), Rejections> {
        let (b, d) = dispatch(Self::registry(), p, target, choices)?;
        Ok((self.finish(p, b, &d), d))
    }
}

/// A device that runs built kernels from one planned arena.
pub trait Backend {
    type Build: Build;
    /// A kernel compiled and loaded, not yet bound to addresses.
    type Loaded;
    /// A kernel bound to its argument addresses: what a step launches.
    type Bound;

    /// Alignment of every value in the arena, bytes.
    const ALIGN: usize;

    /// Compiles and loads every kernel. A kernel that fails alone is an `Err` entry (its nodes
    /// then run on the host); an error fails the whole model.
    fn load(
        &mut self,
        kernels: &[<Self::Build as Build>::Built],
        report: &mut Report,
    ) -> Result<Vec<Result<Self::Loaded, String>>, Error>;

    /// Allocates the arena (`bytes`, at least one alignment unit).
    fn alloc(&mut self, bytes: usize) -> Result<(), Error>;

    /// Stores a constant for the lifetime of the model; returns its address.
    fn constant(&mut self, name: &str, t: &Tensor) -> Result<u64, Error>;

    /// The arena's base address.
    fn base(&self) -> u64;

    /// Binds a loaded kernel to its argument addresses (`constant[i]`: argument `i` is a
    /// constant, which a back end may pre-process once).
    fn bind(&mut self, k: Self::Loaded, name: &str, ptrs: Vec<u64>, constant: &[bool]) -> Result<Self::Bound, Error>;

    /// Copies a tensor into the arena at `offset` (its bytes are planned there).
    fn write(&self, offset: usize, t: &Tensor) -> Result<(), Error>;

    /// Reads a tensor of `dtype` and `shape` from the arena at `offset`.
    fn read(&self, offset: usize, dtype: tilec_ir::DType, shape: &[usize]) -> Result<Tensor, Error>;

    /// Copies `len` bytes of caller memory at address `src` (in `mem`) into the arena at
    /// `offset` (ordered before the work launched after it).
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes in `mem` until the next [`Backend::sync`].
    unsafe fn write_raw(&self, offset: usize, src: u64, len: usize, mem: Memory) -> Result<(), Error>;

    /// Copies `len` bytes of the arena at `offset` to caller memory at address `dst` (in `mem`);
    /// done at the next [`Backend::sync`].
    ///
    /// # Safety
    /// `dst` must be writable for `len` bytes in `mem` until the next [`Backend::sync`].
    unsafe fn read_raw(&self, offset: usize, dst: u64, len: usize, mem: Memory) -> Result<(), Error>;

    /// Fills `len` bytes of the arena at `offset` (queued after the launched work).
    fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), Error>;

    /// Copies `len` bytes of the arena from `src` to `dst` (spans that do not overlap), ordered
    /// after the launched work. By default through the host; a device back end copies in place.
    fn copy_within(&self, src: usize, dst: usize, len: usize) -> Result<(), Error> {
        self.sync()?;
        let t = self.read(src, tilec_ir::DType::U8, &[len])?;
        self.write(dst, &t)
    }

    /// Launches one bound kernel.
    fn launch(&self, k: &Self::Bound, name: &str) -> Result<(), Error>;

    /// Launches run `run` (the device steps between two host steps, the same ones on every
    /// call). A back end may capture them once and replay them.
    fn launch_run<'a>(
        &mut self,
        _run: usize,
        steps: impl Iterator<Item = (&'a Self::Bound, &'a str)> + Clone,
    ) -> Result<(), Error>
    where
        Self::Bound: 'a,
    {
        for (k, name) in steps {
            self.launch(k, name)?;
        }
        Ok(())
    }

    /// Runs `steps` back to back, as [`Backend::launch_run`] would, and times each on the
    /// device's own clock: (start, duration) in nanoseconds from the first one's start, in
    /// launch order, the device idle afterwards. `None` where the back end keeps no device
    /// clock: the caller then times the steps one by one on the host.
    fn time_run<'a>(
        &mut self,
        _steps: impl Iterator<Item = (&'a Self::Bound, &'a str)> + Clone,
    ) -> Result<Option<Vec<(u64, u64)>>, Error>
    where
        Self::Bound: 'a,
    {
        Ok(None)
    }

    /// What a profile should say of a bound kernel beyond its figures (launch shape,
    /// registers, shared memory, spills); empty by default.
    fn describe(&self, _k: &Self::Bound) -> String {
        String::new()
    }

    /// Orders the work queued after this call after everything queued so far on `foreign`,
    /// another library's stream handle on this back end's device (a no-op where there is no
    /// device queue).
    ///
    /// # Safety
    /// `foreign` must be a live stream handle of the back end's device and context.
    unsafe fn order_after(&self, _foreign: u64) -> Result<(), Error> {
        Ok(())
    }

    /// Waits for the launched work.
    fn sync(&self) -> Result<(), Error>;
}

/// What preparing, compiling and loading a model did, for `--stats`, `--json` and tests.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub optimize: Duration,
    /// Partitioning and building the kernels (lowering, scheduling, rendering).
    pub lower: Duration,
    /// Compiling and loading them.
    pub codegen: Duration,
    pub total: Duration,
    /// The rest of `total`, by phase in order (CUDA: `device` open, the part that optimizing
    /// and lowering, done meanwhile, did not hide; `nvrtc` (kernel cache
    /// lookups and NVRTC), `modules` loaded, `constants` uploaded, `arena` planned and
    /// allocated, kernels bound (`bind`)).
    pub phases: Vec<(&'static str, Duration)>,
    /// Kernels the model runs.
    pub kernels: usize,
    /// Distinct kernels compiled (CPU: after deduplication by body).
    pub unique_kernels: usize,
    /// Kernels taken from the compiled-kernel cache.
    pub cache_hits: usize,
    /// Nodes run on the reference interpreter, with the reason.
    pub fallbacks: Vec<(String, String)>,
    /// Kernel groups that did not build whole and were split (see `steps::split_group`).
    pub split_groups: usize,
    /// Per kernel: the family that builds it, its parameters, and the families rejected.
    pub decisions: Vec<(String, Decision)>,
    /// Kernels per schedule (CUDA: the tile-IR schedule's name or the family's).
    pub schedules: Vec<(String, usize)>,
    /// Per kernel, what happened after the decision (a family kernel that did not load, ...).
    pub notes: Vec<(String, String)>,
    pub arena_bytes: usize,
    /// Sum of the planned values' sizes (what the arena would hold without reuse).
    pub intermediate_bytes: usize,
    pub inplace: usize,
    pub const_bytes: usize,
    /// Runs of device steps between host steps (replayed as CUDA graphs on CUDA).
    pub graphs: usize,
    /// Kernel text after lowering and after scheduling (CPU, with `keep_ir`).
    pub ir: Vec<(String, String, String)>,
}

impl Report {
    /// The family of a kernel.
    pub fn family(&self, kernel: &str) -> Option<&'static str> {
        self.decisions.iter().find(|(k, _)| k == kernel).map(|(_, d)| d.family)
    }
}

/// Where a value lives at run time.
#[derive(Copy, Clone, Debug)]
enum Slot {
    /// Offset into the arena.
    Arena(usize),
    /// Address of a constant.
    Const(u64),
}

enum Exec<K> {
    Kernel(K),
    Host(NodeId),
}

/// One step of a loaded model.
struct XStep<K> {
    info: steps::Step,
    exec: Exec<K>,
    /// The name profiles show: the step's name and its family.
    label: String,
    /// What profiles add: the family's parameters and the back end's description.
    detail: String,
}

/// A run of device steps, or one host step.
enum Segment {
    Device(std::ops::Range<usize>),
    Host(usize),
}

/// A model loaded on a back end.
pub struct Executor<B: Backend> {
    graph: Graph,
    steps: Vec<XStep<B::Bound>>,
    segments: Vec<Segment>,
    slots: HashMap<ValueId, Slot>,
    reqs: Vec<BufferReq>,
    plan: MemoryPlan,
    /// Offset of the first status slot (they follow the planned values).
    status_offset: usize,
    /// The steps with a status slot, in slot order.
    checked: Vec<usize>,
    /// The whole graph runs on the reference interpreter (data-dependent shapes).
    interpreted: bool,
    /// Per graph input: its storage holds state a run left there ([`Executor::run_state`]),
    /// so the next run may leave it out.
    resident: Vec<bool>,
    pub report: Report,
    /// Dropped last: the steps' kernels and addresses refer to it.
    backend: B,
}

/// The shape of a value with fixed dimensions.
pub(crate) fn fixed_shape(g: &Graph, v: ValueId) -> Option<Vec<usize>> {
    g.value(v).ty.shape.iter().map(|d| if let tilec_ir::Dim::Fixed(n) = d { Some(*n) } else { None }).collect()
}

/// Evaluates one node on the host: `paged_attention` over f32 caches by its host kernel
/// (`paged.rs`), everything else on the interpreter.
fn eval_node(g: &Graph, n: NodeId, args: &[Tensor]) -> Result<Vec<Tensor>, Error> {
    let node = g.node(n);
    let refs: Vec<&Tensor> = args.iter().collect();
    if let tilec_ir::Op::Nn(tilec_ir::op::NnOp::PagedAttention { scale }) = node.op {
        if let Some(r) = paged::paged_attention(&refs, scale, paged::DEFAULT_SPLIT_TOKENS) {
            return r.map_err(|e| Error::Compile(format!("node '{}' ({}): {e}", node.name, node.op.name())));
        }
    }
    let bound = HashMap::new();
    let cx = tilec_ref::EvalCtx { graph: g, bound: &bound };
    tilec_ref::eval_op(&node.op, &refs, &cx)
        .map_err(|e| Error::Compile(format!("node '{}' ({}): {e}", node.name, node.op.name())))
}

impl<B: Backend> Executor<B> {
    /// The optimized, specialized graph that was compiled.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Checks the memory plan (no two live buffers overlap).
    pub fn check_plan(&self) -> Result<(), String> {
        tilec_runtime::check(&self.reqs, &self.plan)
    }

    /// Number of steps (kernels and host nodes).
    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// Whether the whole graph runs on the reference interpreter.
    pub fn interpreted(&self) -> bool {
        self.interpreted
    }

    /// The back end.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Op names of the nodes that run on the reference interpreter, sorted, once each.
    pub fn fallback_ops(&self) -> Vec<String> {
        let mut s: Vec<String> = self
            .steps
            .iter()
            .filter_map(|st| match st.exec {
                Exec::Host(n) => Some(self.graph.node(n).op.name().to_string()),
                Exec::Kernel(_) => None,
            })
            .collect();
        s.sort();
        s.dedup();
        s
    }

    /// Fills the arena with 0xFF bytes (NaN for floats, all ones for integers), so that a value
    /// no step writes is caught by a comparison.
    pub fn poison(&mut self) -> Result<(), Error> {
        if self.interpreted {
            return Ok(());
        }
        self.backend.sync()?;
        self.backend.fill(0, self.plan.arena_bytes, 0xFF)?;
        self.backend.sync()
    }

    fn read(&self, v: ValueId) -> Result<Tensor, Error> {
        let val = self.graph.value(v);
        if let ValueDef::Const(t) = &val.def {
            return Ok(t.clone());
        }
        match self.slots.get(&v) {
            Some(&Slot::Arena(o)) => {
                let shape = fixed_shape(&self.graph, v).unwrap_or_default();
                self.backend.read(o, val.ty.dtype, &shape)
            }
            _ => Err(Error::Compile(format!("value '{}' has no storage", val.name))),
        }
    }

    fn write(&self, v: ValueId, t: &Tensor) -> Result<(), Error> {
        let val = self.graph.value(v);
        let want = val.ty.byte_size().unwrap_or(0);
        let have = t.numel() * t.dtype().size_bytes();
        if have != want || t.dtype() != val.ty.dtype {
            return Err(Error::Compile(format!(
                "value '{}': {} bytes of {} produced, {want} bytes of {} expected",
                val.name,
                have,
                t.dtype(),
                val.ty.dtype
            )));
        }
        match self.slots.get(&v) {
            Some(&Slot::Arena(o)) => self.backend.write(o, t),
            _ => Err(Error::Compile(format!("value '{}' has no storage", val.name))),
        }
    }

    /// Checks the inputs against the compiled shapes and writes them into the arena.
    fn write_inputs(&self, inputs: &[Tensor]) -> Result<(), Error> {
        let g = &self.graph;
        if inputs.len() != g.inputs().len() {
            return Err(Error::Compile(format!("the model has {} inputs, {} were given", g.inputs().len(), inputs.len())));
        }
        for (&v, t) in g.inputs().iter().zip(inputs) {
            let val = g.value(v);
            let want = fixed_shape(g, v).unwrap_or_default();
            if t.dtype() != val.ty.dtype || t.shape() != want.as_slice() {
                return Err(Error::Compile(format!(
                    "input '{}': expected {}{:?}, got {}{:?} (the model was compiled for these shapes)",
                    val.name,
                    val.ty.dtype,
                    want,
                    t.dtype(),
                    t.shape()
                )));
            }
        }
        self.backend.sync()?;
        for (&v, t) in g.inputs().iter().zip(inputs) {
            self.write(v, t)?;
        }
        Ok(())
    }

    /// Clears the status slots (queued on the device).
    fn reset_status(&self) -> Result<(), Error> {
        match self.checked.len() {
            0 => Ok(()),
            n => self.backend.fill(self.status_offset, n * STATUS_STRIDE, 0),
        }
    }

    /// After a synchronization: the first step (in step order) whose kernel recorded an index
    /// out of range, as an error naming the node.
    fn check_status(&self) -> Result<(), Error> {
        if self.checked.is_empty() {
            return Ok(());
        }
        let stride = STATUS_STRIDE / 8;
        let words = self
            .backend
            .read(self.status_offset, tilec_ir::DType::I64, &[self.checked.len() * stride])?
            .to_i64_vec();
        for (j, &si) in self.checked.iter().enumerate() {
            if let Some(v) = IndexViolation::from_status(&words[j * stride..j * stride + STATUS_WORDS]) {
                let st = &self.steps[si].info;
                return Err(Error::Compile(v.message(&st.checks, &st.name)));
            }
        }
        Ok(())
    }

    /// Runs host step `si` on the interpreter: inputs read back, outputs written.
    fn host_step(&self, si: usize) -> Result<(), Error> {
        let Exec::Host(n) = self.steps[si].exec else { return Ok(()) };
        let node = self.graph.node(n);
        let args: Vec<Tensor> = node.inputs.iter().map(|&v| self.read(v)).collect::<Result<_, _>>()?;
        let outs = eval_node(&self.graph, n, &args)?;
        for (&v, t) in node.outputs.iter().zip(&outs) {
            self.write(v, t)?;
        }
        Ok(())
    }

    /// Runs step `si` alone (a kernel launched, or a host step after the device is idle).
    fn step(&self, si: usize) -> Result<(), Error> {
        match &self.steps[si].exec {
            Exec::Kernel(k) => self.backend.launch(k, &self.steps[si].info.name),
            Exec::Host(_) => {
                self.backend.sync()?;
                self.check_status()?;
                self.host_step(si)
            }
        }
    }

    /// Runs every step on the inputs in the arena; device work may still be queued.
    fn exec(&mut self) -> Result<(), Error> {
        self.reset_status()?;
        for seg in 0..self.segments.len() {
            match &self.segments[seg] {
                Segment::Host(i) => self.step(*i)?,
                Segment::Device(r) => {
                    let run = self.steps[r.clone()].iter().filter_map(|s| match &s.exec {
                        Exec::Kernel(k) => Some((k, s.info.name.as_str())),
                        Exec::Host(_) => None,
                    });
                    self.backend.launch_run(seg, run)?;
                }
            }
        }
        Ok(())
    }

    /// Runs the model on inputs given in graph-input order.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        self.run_profiled(inputs, None)
    }

    /// Runs the model; with `profile`, each step's time recorded under its name and family:
    /// on the device's clock where the back end keeps one ([`Backend::time_run`]: CUDA, the
    /// kernels of a run replayed back to back), else step by step until the device is idle.
    pub fn run_profiled(&mut self, inputs: &[Tensor], profile: Option<&mut Profile>) -> Result<Vec<Tensor>, Error> {
        if self.interpreted {
            return Ok(tilec_ref::run(&self.graph, inputs.to_vec())?);
        }
        self.write_inputs(inputs)?;
        // In-place updates may change any input's storage: none holds state now.
        self.resident.iter_mut().for_each(|r| *r = false);
        match profile {
            None => self.exec()?,
            Some(p) => {
                self.reset_status()?;
                self.backend.sync()?;
                // One epoch per process, so that the calls of several runs share a timeline.
                static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
                let epoch = *EPOCH.get_or_init(Instant::now);
                p.begin_run();
                for seg in 0..self.segments.len() {
                    let steps = match &self.segments[seg] {
                        Segment::Host(i) => *i..*i + 1,
                        Segment::Device(r) => r.clone(),
                    };
                    let kernels = steps.clone().all(|si| matches!(self.steps[si].exec, Exec::Kernel(_)));
                    let begun = Instant::now();
                    let timed = if kernels {
                        let run = self.steps[steps.clone()].iter().filter_map(|s| match &s.exec {
                            Exec::Kernel(k) => Some((k, s.info.name.as_str())),
                            Exec::Host(_) => None,
                        });
                        self.backend.time_run(run)?
                    } else {
                        None
                    };
                    let at = begun.duration_since(epoch).as_nanos() as u64;
                    match timed {
                        // On the device's clock: the kernels ran back to back from a graph.
                        Some(times) => {
                            for (si, (start, ns)) in steps.zip(times) {
                                let st = &self.steps[si];
                                p.record_span(&st.label, at + start, ns, st.info.bytes as u64, st.info.flops as u64);
                                p.describe(&st.label, &st.detail);
                            }
                        }
                        // On the host's: each step until the device is idle.
                        None => {
                            for si in steps {
                                let start = Instant::now();
                                self.step(si)?;
                                self.backend.sync()?;
                                let st = &self.steps[si];
                                let at = start.duration_since(epoch).as_nanos() as u64;
                                p.record_span(&st.label, at, start.elapsed().as_nanos() as u64, st.info.bytes as u64, st.info.flops as u64);
                                p.describe(&st.label, &st.detail);
                            }
                        }
                    }
                }
            }
        }
        self.backend.sync()?;
        self.check_status()?;
        self.graph.outputs().iter().map(|&v| self.read(v)).collect()
    }
}
