//! The compiled CUDA path: optimize for the GPU → partition → lower → GPU schedule → CUDA C++
//! → NVRTC (parallel, cached) → one planned device arena, run as CUDA graphs.
//!
//! [`prepare`] does everything that needs no GPU (optimization, lowering, scheduling and
//! rendering), so it runs and is tested anywhere; [`compile`] adds the device: it compiles the
//! sources with NVRTC for the device's architecture, loads them, plans the arena, uploads the
//! constants once and resolves every kernel's argument addresses.
//!
//! A node whose group does not lower (even node by node), whose kernel has no GPU schedule, or
//! whose kernel does not render or compile runs on the host reference interpreter (a *host
//! step*: its inputs are downloaded, its outputs uploaded). The device steps between two host
//! steps are captured into a CUDA graph on the first run and replayed afterwards. Everything
//! CUDA is loaded at run time: without a driver, a device or NVRTC, [`compile`] returns an
//! error saying which is missing.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tilec_cuda::{CudaError, Device, DeviceBuffer, GpuKernel, GpuTarget, Stream};
use tilec_ir::{Graph, NodeId, Tensor, ValueDef, ValueId};
use tilec_opt::manager::{Pipeline, PipelineOptions};
use tilec_opt::partition::{partition, Target, TargetKind};
use tilec_runtime::{BufferReq, MemoryPlan};
use tilec_cuda::families::GpuBuilt;
use tilec_tile::family::{describe_rejections, dispatch, Choices, Decision, Problem};
use tilec_tile::Kernel;

use crate::compiled::{fixed_shape, value_bytes};
use crate::Error;

/// Bytes of one checking step's status words in the arena: every kernel argument must be
/// 16-byte aligned.
const STATUS_STRIDE: usize = (tilec_tile::STATUS_WORDS * 8).next_multiple_of(16);

/// Options of [`prepare`] and [`compile`].
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Graph optimization level (0..=3).
    pub opt_level: u8,
    /// Device ordinal.
    pub device: usize,
    /// Where compiled kernels are cached (`None`: the back end's default directory).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Families forced per op or kernel name (`--family OP=NAME`).
    pub families: Vec<(String, String)>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions { opt_level: 3, device: 0, cache_dir: None, families: vec![] }
    }
}

/// One GPU kernel of a prepared model.
#[derive(Clone, Debug)]
pub struct GpuKernelSource {
    pub name: String,
    /// The kernel as lowered (serial loops).
    pub lowered: Kernel,
    /// After its GPU schedule.
    pub scheduled: Kernel,
    /// Which schedule (`gemm`, `rows`, `elementwise`, `direct`, `block`, `serial`), or the
    /// kernel family that runs it instead (`sm90_tc_gemm`).
    pub schedule: &'static str,
    pub source: tilec_cuda::CudaSource,
    /// The kernel-family decision (see `cuda_families`).
    pub family: crate::cuda_families::FamilyInfo,
}

#[derive(Clone, Debug)]
enum PKind {
    /// Index into the kernel list.
    Kernel(usize),
    Host(NodeId),
}

#[derive(Clone, Debug)]
struct PStep {
    name: String,
    kind: PKind,
    /// Arguments in ABI order (inputs then outputs) for kernels, node inputs for host steps.
    args: Vec<ValueId>,
    outputs: Vec<ValueId>,
    nodes: Vec<NodeId>,
}

/// What preparation and compilation did.
#[derive(Clone, Debug, Default)]
pub struct CudaReport {
    pub optimize: Duration,
    pub lower: Duration,
    pub codegen: Duration,
    pub total: Duration,
    /// Kernels running on the device.
    pub kernels: usize,
    /// Kernels per schedule name.
    pub schedules: Vec<(String, usize)>,
    /// Kernels NVRTC took from its cache.
    pub cache_hits: usize,
    /// Nodes run on the host interpreter, with the reason.
    pub fallbacks: Vec<(String, String)>,
    pub arena_bytes: usize,
    pub const_bytes: usize,
    /// CUDA graphs (runs of device steps between host steps).
    pub graphs: usize,
    /// Kernel groups lowered node by node because fused they would run on one thread.
    pub split_groups: usize,
    /// Per kernel holding a matrix product: its name and the family decision, described.
    pub families: Vec<(String, String)>,
}

/// A model lowered, scheduled and rendered for the GPU (no device needed).
#[derive(Clone, Debug)]
pub struct Prepared {
    graph: Graph,
    steps: Vec<PStep>,
    kernels: Vec<GpuKernelSource>,
    /// The whole graph runs on the interpreter (data-dependent shapes).
    interpreted: bool,
    pub report: CudaReport,
}

fn host_steps(g: &Graph, nodes: &[NodeId], prefix: &str) -> Vec<PStep> {
    nodes
        .iter()
        .map(|&n| {
            let node = g.node(n);
            PStep {
                name: format!("{prefix}_host_{}", node.op.name()),
                kind: PKind::Host(n),
                args: node.inputs.clone(),
                outputs: node.outputs.clone(),
                nodes: vec![n],
            }
        })
        .collect()
}

/// Optimizes for CUDA, partitions, lowers, schedules and renders a graph with concrete shapes.
pub fn prepare(graph: &Graph, opts: &CudaOptions, target: &GpuTarget) -> Result<Prepared, Error> {
    let t0 = Instant::now();
    let mut g = graph.clone();
    let pipe = Pipeline::for_level_and_target(opts.opt_level, TargetKind::Cuda);
    pipe.run(&mut g, &PipelineOptions::default()).map_err(|e| Error::Compile(e.to_string()))?;
    let mut report = CudaReport { optimize: t0.elapsed(), ..Default::default() };
    if let Some(v) = g.value_ids().find(|&v| fixed_shape(&g, v).is_none()) {
        let val = g.value(v);
        let dims: Vec<String> = val.ty.shape.iter().map(|&d| g.syms.display(d)).collect();
        report.fallbacks.push((
            "graph".into(),
            format!("value '{}' has a data-dependent shape [{}]", val.name, dims.join(", ")),
        ));
        report.total = t0.elapsed();
        return Ok(Prepared { graph: g, steps: vec![], kernels: vec![], interpreted: true, report });
    }

    let t1 = Instant::now();
    let part = partition(&g, &Target::preset(TargetKind::Cuda));
    let mut kernels: Vec<GpuKernelSource> = vec![];
    let mut steps: Vec<PStep> = vec![];
    let ftarget = Target { gpu: *target, ..Target::preset(TargetKind::Cuda) };
    let disabled: Vec<&str> = if crate::cuda_families::enabled() { vec![] } else { vec![tilec_cuda::families::HOPPER_GEMM] };
    let choices = Choices { forced: &opts.families, disabled: &disabled, tuned: None };
    let registry = tilec_cuda::families::registry();
    for grp in &part.groups {
        let name = format!("k{}_{}", grp.id, grp.kind.to_string().to_lowercase());
        let build = |p: &Problem| dispatch(registry, p, &ftarget, &choices);
        let built: Vec<(Option<(GpuBuilt, Decision)>, Vec<NodeId>, String)> = match build(&Problem::of_group(&g, grp, &name)) {
            Ok(b) => vec![(Some(b), grp.nodes.clone(), name)],
            Err(why) if grp.nodes.len() > 1 => {
                // A fused group that only a single thread could run (several GEMMs, or scratch
                // larger than shared memory) is cheaper as separate kernels.
                if why.iter().any(|(f, _)| *f == "cuda.direct") {
                    report.split_groups += 1;
                }
                grp.nodes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| {
                        let nm = format!("{name}_{i}");
                        match build(&Problem::of_node(&g, n, &nm)) {
                            Ok(b) => (Some(b), vec![n], nm),
                            Err(e) => {
                                report.fallbacks.push((g.node(n).op.name().to_string(), describe_rejections(&e)));
                                (None, vec![n], nm)
                            }
                        }
                    })
                    .collect()
            }
            Err(e) => {
                for &n in &grp.nodes {
                    report.fallbacks.push((g.node(n).op.name().to_string(), describe_rejections(&e)));
                }
                vec![(None, grp.nodes.clone(), name)]
            }
        };
        for (b, nodes, nm) in built {
            let Some((b, decision)) = b else {
                steps.extend(host_steps(&g, &nodes, &nm));
                continue;
            };
            let mut args = b.lowered.inputs.clone();
            args.extend(&b.lowered.outputs);
            steps.push(PStep { name: nm.clone(), kind: PKind::Kernel(kernels.len()), args, outputs: b.lowered.outputs.clone(), nodes });
            let family = crate::cuda_families::FamilyInfo { decision, plan: b.plan, fallback: b.fallback };
            kernels.push(GpuKernelSource {
                name: nm,
                lowered: b.lowered.kernel,
                scheduled: b.scheduled,
                schedule: b.schedule,
                source: b.source,
                family,
            });
        }
    }
    // Nodes in no group whose values a step or the graph outputs need run on the host.
    let extra = crate::compiled::uncovered_producers(&g, &steps, |s| &s.args, |s| &s.outputs, |s| &s.nodes);
    for n in extra {
        steps.extend(host_steps(&g, &[n], &format!("ref_{}", n.index())));
    }
    let steps = order_steps(steps).map_err(Error::Compile)?;
    report.lower = t1.elapsed();
    report.kernels = kernels.len();
    let mut counts: Vec<(String, usize)> = vec![];
    for k in &kernels {
        match counts.iter_mut().find(|c| c.0 == k.schedule) {
            Some(c) => c.1 += 1,
            None => counts.push((k.schedule.to_string(), 1)),
        }
    }
    report.schedules = counts;
    report.families = crate::cuda_families::summary(&kernels);
    report.total = t0.elapsed();
    Ok(Prepared { graph: g, steps, kernels, interpreted: false, report })
}

/// Orders steps so that every value is produced before it is read (stable where dependencies
/// allow).
fn order_steps(steps: Vec<PStep>) -> Result<Vec<PStep>, String> {
    crate::compiled::order_by_deps(steps, |s| &s.args, |s| &s.outputs)
}

impl Prepared {
    /// The optimized, specialized graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// The GPU kernels, lowered, scheduled and rendered.
    pub fn kernels(&self) -> &[GpuKernelSource] {
        &self.kernels
    }
    /// Number of steps (device kernels and host nodes).
    pub fn steps(&self) -> usize {
        self.steps.len()
    }
    /// Whether the whole graph runs on the interpreter.
    pub fn interpreted(&self) -> bool {
        self.interpreted
    }
}

fn cuda_err(what: &str) -> impl Fn(CudaError) -> Error + '_ {
    move |e| Error::Compile(format!("{what}: {e}"))
}

/// Opens the device, or says why there is none.
pub fn open_device(ordinal: usize) -> Result<Device, Error> {
    if !tilec_cuda::is_available() {
        let why = match tilec_cuda::device_count() {
            Err(e) => e.to_string(),
            Ok(0) => "the CUDA driver reports no device".to_string(),
            Ok(_) => "no usable CUDA device".to_string(),
        };
        return Err(Error::Compile(format!("no CUDA GPU: {why} (the cuda target needs an NVIDIA driver and device)")));
    }
    Device::open(ordinal).map_err(cuda_err("opening the CUDA device"))
}

/// Where a value lives on the device.
#[derive(Copy, Clone, Debug)]
enum Slot {
    Arena(usize),
    Const(usize),
}

enum XKind {
    Kernel { kernel: usize, ptrs: Vec<u64> },
    Host(NodeId),
}

struct XStep {
    name: String,
    kind: XKind,
    outputs: Vec<ValueId>,
    nodes: Vec<NodeId>,
}

/// A run of device steps or one host step.
enum Segment {
    Device { steps: std::ops::Range<usize>, graph: Option<tilec_cuda::Graph> },
    Host(usize),
}

/// A model compiled for and loaded on a GPU.
pub struct CompiledCuda {
    graph: Graph,
    steps: Vec<XStep>,
    kernels: Vec<GpuKernel>,
    segments: Vec<Segment>,
    slots: HashMap<ValueId, Slot>,
    /// Constants read by kernels (kept alive: kernel arguments point into them).
    #[allow(dead_code)]
    consts: Vec<DeviceBuffer>,
    reqs: Vec<BufferReq>,
    plan: MemoryPlan,
    /// The status words of the steps whose kernels check indices live after the planned
    /// arena, `STATUS_WORDS` per step in step order: (offset of the first, those steps).
    status: (usize, Vec<usize>),
    interpreted: bool,
    /// Use CUDA graphs (off: launch step by step, for debugging).
    pub use_graphs: bool,
    // Dropped before the device context: the stream and the arena.
    stream: Stream,
    arena: DeviceBuffer,
    device: Device,
    pub report: CudaReport,
}

/// Compiles a graph with concrete shapes for the GPU `opts.device` and loads it.
pub fn compile(graph: &Graph, opts: &CudaOptions) -> Result<CompiledCuda, Error> {
    let t0 = Instant::now();
    let device = open_device(opts.device)?;
    let nvrtc = tilec_cuda::Nvrtc::load().map_err(|e| {
        Error::Compile(format!("{e} (put CUDA's lib directory on LD_LIBRARY_PATH or set TILEC_NVRTC_LIB)"))
    })?;
    let target = device.props().gpu_target();
    let cache = opts.cache_dir.clone().or_else(tilec_cuda::nvrtc::default_cache_dir);
    let compiler = tilec_cuda::Compiler::new(nvrtc, &device.props().arch()).with_cache_dir(cache);
    let prep = prepare(graph, opts, &target)?;
    compile_prepared(prep, device, &compiler, t0)
}

fn compile_prepared(
    prep: Prepared,
    device: Device,
    compiler: &tilec_cuda::Compiler,
    t0: Instant,
) -> Result<CompiledCuda, Error> {
    let Prepared { graph: g, steps: psteps, kernels: ksrc, interpreted, mut report } = prep;
    let stream = device.stream().map_err(cuda_err("creating a CUDA stream"))?;
    if interpreted {
        let arena = device.alloc(64).map_err(cuda_err("allocating the device arena"))?;
        return Ok(CompiledCuda {
            graph: g,
            steps: vec![],
            kernels: vec![],
            segments: vec![],
            slots: HashMap::new(),
            consts: vec![],
            reqs: vec![],
            plan: MemoryPlan::default(),
            status: (0, vec![]),
            interpreted: true,
            use_graphs: true,
            stream,
            arena,
            device,
            report,
        });
    }

    // Compile every kernel; one that fails to compile or load runs on the host instead.
    let t2 = Instant::now();
    let modules: Vec<(String, String)> = ksrc.iter().map(|k| (k.name.clone(), k.source.source.clone())).collect();
    let compiled = compiler.compile_many(&modules);
    let mut kernels: Vec<GpuKernel> = vec![];
    let mut kmap: Vec<Option<usize>> = vec![];
    for (k, c) in ksrc.iter().zip(compiled) {
        let loaded = crate::cuda_families::load_or_fallback(&device, compiler, k, c, &mut report.families);
        match loaded {
            Ok(gk) => {
                if gk.cache_hit {
                    report.cache_hits += 1;
                }
                kmap.push(Some(kernels.len()));
                kernels.push(gk);
            }
            Err(e) => {
                report.fallbacks.push((k.name.clone(), e.to_string()));
                kmap.push(None);
            }
        }
    }
    report.codegen = t2.elapsed();
    let mut steps: Vec<PStep> = vec![];
    for st in psteps {
        match st.kind {
            PKind::Kernel(i) if kmap[i].is_none() => steps.extend(host_steps(&g, &st.nodes, &st.name)),
            PKind::Kernel(i) => steps.push(PStep { kind: PKind::Kernel(kmap[i].unwrap_or(0)), ..st }),
            PKind::Host(_) => steps.push(st),
        }
    }
    report.kernels = kernels.len();

    // Plan: graph inputs and step outputs in the arena; constants read by kernels uploaded once.
    let mut slots: HashMap<ValueId, Slot> = HashMap::new();
    let mut consts = vec![];
    let kernel_args: HashSet<ValueId> =
        steps.iter().filter(|s| matches!(s.kind, PKind::Kernel(_))).flat_map(|s| s.args.iter().copied()).collect();
    for v in g.value_ids() {
        if let ValueDef::Const(t) = &g.value(v).def {
            if kernel_args.contains(&v) {
                slots.insert(v, Slot::Const(consts.len()));
                report.const_bytes += t.numel() * t.dtype().size_bytes();
                consts.push(device.upload(t).map_err(cuda_err(&format!("uploading constant '{}'", g.value(v).name)))?);
            }
        }
    }
    let lives = crate::compiled::lifetimes(&g, &steps, |s| &s.args, |s| &s.outputs);
    let order: Vec<ValueId> = lives.iter().map(|l| l.0).collect();
    let reqs: Vec<BufferReq> = lives
        .iter()
        .map(|&(v, first, last)| BufferReq {
            size: value_bytes(&g, v).unwrap_or(0).max(1),
            align: 256,
            first,
            last,
            inplace_of: None,
        })
        .collect();
    let plan = tilec_runtime::plan(&reqs);
    for (i, &v) in order.iter().enumerate() {
        slots.insert(v, Slot::Arena(plan.offsets[i]));
    }
    report.arena_bytes = plan.arena_bytes;
    let status_words = STATUS_STRIDE;
    let checked: Vec<usize> = (0..steps.len())
        .filter(|&i| matches!(steps[i].kind, PKind::Kernel(k) if !kernels[k].checks.is_empty()))
        .collect();
    let status_off = plan.arena_bytes.div_ceil(256) * 256;
    let arena_len = status_off + checked.len() * status_words;
    let arena = device.alloc(arena_len.max(256)).map_err(cuda_err("allocating the device arena"))?;

    // Resolve argument addresses and cut the steps into segments.
    let addr = |v: ValueId| -> Result<u64, Error> {
        match slots.get(&v) {
            Some(Slot::Arena(o)) => Ok(arena.ptr() + *o as u64),
            Some(Slot::Const(i)) => Ok(consts[*i].ptr()),
            None => Err(Error::Compile(format!("value '{}' has no device storage", g.value(v).name))),
        }
    };
    let mut xsteps = vec![];
    for (si, st) in steps.iter().enumerate() {
        let kind = match st.kind {
            PKind::Kernel(k) => {
                let mut ptrs = st.args.iter().map(|&v| addr(v)).collect::<Result<Vec<_>, _>>()?;
                if let Some(j) = checked.iter().position(|&c| c == si) {
                    ptrs.push(arena.ptr() + (status_off + j * status_words) as u64);
                }
                if ptrs.len() != kernels[k].params.len() {
                    return Err(Error::Compile(format!(
                        "kernel {}: {} arguments planned, {} parameters",
                        st.name,
                        ptrs.len(),
                        kernels[k].params.len()
                    )));
                }
                XKind::Kernel { kernel: k, ptrs }
            }
            PKind::Host(n) => XKind::Host(n),
        };
        xsteps.push(XStep { name: st.name.clone(), kind, outputs: st.outputs.clone(), nodes: st.nodes.clone() });
    }
    let mut segments = vec![];
    let mut i = 0;
    while i < xsteps.len() {
        if matches!(xsteps[i].kind, XKind::Host(_)) {
            segments.push(Segment::Host(i));
            i += 1;
        } else {
            let s = i;
            while i < xsteps.len() && matches!(xsteps[i].kind, XKind::Kernel { .. }) {
                i += 1;
            }
            segments.push(Segment::Device { steps: s..i, graph: None });
        }
    }
    report.graphs = segments.iter().filter(|s| matches!(s, Segment::Device { .. })).count();
    report.total = t0.elapsed();
    Ok(CompiledCuda {
        graph: g,
        steps: xsteps,
        kernels,
        segments,
        slots,
        consts,
        reqs,
        plan,
        status: (status_off, checked),
        interpreted: false,
        use_graphs: true,
        stream,
        arena,
        device,
        report,
    })
}

impl CompiledCuda {
    /// The optimized, specialized graph that was compiled.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The device's name and compute capability.
    pub fn device_name(&self) -> String {
        let p = self.device.props();
        format!("{} (sm_{}{})", p.name, p.compute_capability.0, p.compute_capability.1)
    }

    /// Checks the memory plan (no two live buffers overlap).
    pub fn check_plan(&self) -> Result<(), String> {
        tilec_runtime::check(&self.reqs, &self.plan)
    }

    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// Whether the whole graph runs on the host interpreter.
    pub fn interpreted(&self) -> bool {
        self.interpreted
    }

    fn read(&self, v: ValueId) -> Result<Tensor, Error> {
        let val = self.graph.value(v);
        if let ValueDef::Const(t) = &val.def {
            return Ok(t.clone());
        }
        let shape = fixed_shape(&self.graph, v).unwrap_or_default();
        match self.slots.get(&v) {
            Some(Slot::Arena(o)) => self
                .arena
                .download(*o, val.ty.dtype, &shape)
                .map_err(cuda_err(&format!("downloading value '{}'", val.name))),
            _ => Err(Error::Compile(format!("value '{}' has no device storage", val.name))),
        }
    }

    fn write(&self, v: ValueId, t: &Tensor) -> Result<(), Error> {
        let val = self.graph.value(v);
        let n = value_bytes(&self.graph, v).unwrap_or(0);
        let bytes = t.to_le_bytes();
        if bytes.len() != n {
            return Err(Error::Compile(format!("value '{}': {} bytes produced, {n} expected", val.name, bytes.len())));
        }
        match self.slots.get(&v) {
            Some(Slot::Arena(o)) => {
                self.arena.write(*o, &bytes).map_err(cuda_err(&format!("uploading value '{}'", val.name)))
            }
            _ => Err(Error::Compile(format!("value '{}' has no device storage", val.name))),
        }
    }

    fn sync(&self) -> Result<(), Error> {
        self.stream.synchronize().map_err(cuda_err("waiting for the GPU"))
    }

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
        self.sync()?;
        for (&v, t) in g.inputs().iter().zip(inputs) {
            self.write(v, t)?;
        }
        Ok(())
    }

    /// Clears the status words of the steps that check indices (queued on the stream).
    fn reset_status(&self) -> Result<(), Error> {
        let (off, steps) = &self.status;
        if steps.is_empty() {
            return Ok(());
        }
        let len = steps.len() * STATUS_STRIDE;
        self.arena.fill(&self.stream, *off, len, 0).map_err(cuda_err("clearing the index-check status"))
    }

    /// After a synchronization: the first step (in step order) whose kernel recorded an
    /// out-of-range index, as an error naming the node.
    fn check_status(&self) -> Result<(), Error> {
        let (off, steps) = &self.status;
        if steps.is_empty() {
            return Ok(());
        }
        let (w, stride) = (tilec_tile::STATUS_WORDS, STATUS_STRIDE / 8);
        let words = self
            .arena
            .download(*off, tilec_ir::DType::I64, &[steps.len() * stride])
            .map_err(cuda_err("reading the index-check status"))?
            .to_i64_vec();
        for (j, &si) in steps.iter().enumerate() {
            let Some(v) = tilec_tile::IndexViolation::from_status(&words[j * stride..j * stride + w]) else { continue };
            let XKind::Kernel { kernel, .. } = &self.steps[si].kind else { continue };
            let k = &self.kernels[*kernel];
            return Err(Error::Compile(v.message(&k.checks, &k.name)));
        }
        Ok(())
    }

    fn launch(&self, si: usize) -> Result<(), Error> {
        if let XKind::Kernel { kernel, ptrs } = &self.steps[si].kind {
            self.kernels[*kernel].launch(&self.stream, ptrs).map_err(cuda_err(&format!("kernel {}", self.steps[si].name)))?;
        }
        Ok(())
    }

    fn host_step(&self, si: usize) -> Result<(), Error> {
        let XKind::Host(n) = self.steps[si].kind else { return Ok(()) };
        let node = self.graph.node(n);
        let args: Vec<Tensor> = node.inputs.iter().map(|&v| self.read(v)).collect::<Result<_, _>>()?;
        let refs: Vec<&Tensor> = args.iter().collect();
        let bound = HashMap::new();
        let cx = tilec_ref::EvalCtx { graph: &self.graph, bound: &bound };
        let outs = tilec_ref::eval_op(&node.op, &refs, &cx)
            .map_err(|e| Error::Compile(format!("node '{}' ({}) on the host: {e}", node.name, node.op.name())))?;
        for (&v, t) in node.outputs.iter().zip(&outs) {
            self.write(v, t)?;
        }
        Ok(())
    }

    /// Runs every step on the inputs already in the arena (device work is left queued; the
    /// caller checks the status after synchronizing).
    fn exec(&mut self) -> Result<(), Error> {
        self.reset_status()?;
        for si in 0..self.segments.len() {
            match &self.segments[si] {
                Segment::Host(i) => {
                    let i = *i;
                    self.sync()?;
                    self.check_status()?;
                    self.host_step(i)?;
                }
                Segment::Device { steps, graph } => {
                    let steps = steps.clone();
                    if !self.use_graphs {
                        for i in steps {
                            self.launch(i)?;
                        }
                        continue;
                    }
                    if graph.is_none() {
                        let this = &*self;
                        let g = this
                            .stream
                            .capture(|_| {
                                for i in steps.clone() {
                                    if let XKind::Kernel { kernel, ptrs } = &this.steps[i].kind {
                                        this.kernels[*kernel].launch(&this.stream, ptrs)?;
                                    }
                                }
                                Ok(())
                            })
                            .map_err(cuda_err(&format!(
                                "capturing kernels {}..{} into a CUDA graph",
                                this.steps[steps.start].name,
                                this.steps[steps.end - 1].name
                            )))?;
                        if let Segment::Device { graph, .. } = &mut self.segments[si] {
                            *graph = Some(g);
                        }
                    }
                    if let Segment::Device { graph: Some(g), .. } = &self.segments[si] {
                        g.launch(&self.stream).map_err(cuda_err("launching a CUDA graph"))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs the model on inputs given in graph-input order.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        if self.interpreted {
            return Ok(tilec_ref::run(&self.graph, inputs.to_vec())?);
        }
        self.write_inputs(inputs)?;
        self.exec()?;
        self.sync()?;
        self.check_status()?;
        self.graph.outputs().iter().map(|&v| self.read(v)).collect()
    }

    /// Runs the model `n` times and returns each run's device time in milliseconds, measured
    /// with events around the device work (host steps included, the input upload before each
    /// run not).
    pub fn bench(&mut self, inputs: &[Tensor], n: usize) -> Result<Vec<f64>, Error> {
        if self.interpreted {
            let mut out = vec![];
            for _ in 0..n {
                let s = Instant::now();
                tilec_ref::run(&self.graph, inputs.to_vec())?;
                out.push(s.elapsed().as_secs_f64() * 1e3);
            }
            return Ok(out);
        }
        let start = self.device.event().map_err(cuda_err("creating an event"))?;
        let end = self.device.event().map_err(cuda_err("creating an event"))?;
        let mut out = vec![];
        for _ in 0..n {
            // The memory plan may reuse an input's storage once it is read, so every run gets
            // its inputs again (uploaded before the first event, outside the timed region).
            self.write_inputs(inputs)?;
            start.record(&self.stream).map_err(cuda_err("recording an event"))?;
            self.exec()?;
            end.record(&self.stream).map_err(cuda_err("recording an event"))?;
            self.sync()?;
            self.check_status()?;
            out.push(end.elapsed_ms_since(&start).map_err(cuda_err("reading an event"))? as f64);
        }
        Ok(out)
    }

    /// Fills the arena with 0xFF bytes (NaN for floats), so a value no step writes is caught.
    pub fn poison(&mut self) -> Result<(), Error> {
        self.sync()?;
        self.arena.fill(&self.stream, 0, self.arena.len(), 0xFF).map_err(cuda_err("poisoning the arena"))?;
        self.sync()
    }

    /// Runs step by step on a poisoned arena and compares every step's outputs with the
    /// reference interpreter evaluating the same nodes on the same (device) inputs. Returns one
    /// line per step whose outputs differ beyond `rtol`/`atol`.
    pub fn check_steps(&mut self, inputs: &[Tensor], rtol: f64, atol: f64) -> Result<Vec<String>, Error> {
        if self.interpreted {
            return Ok(vec![]);
        }
        self.poison()?;
        self.write_inputs(inputs)?;
        self.reset_status()?;
        let bound = HashMap::new();
        let mut bad = vec![];
        for si in 0..self.steps.len() {
            let mut env: HashMap<ValueId, Tensor> = HashMap::new();
            for &n in &self.steps[si].nodes {
                let node = self.graph.node(n);
                let mut args = vec![];
                for &v in &node.inputs {
                    match env.get(&v) {
                        Some(t) => args.push(t.clone()),
                        None => args.push(self.read(v)?),
                    }
                }
                let refs: Vec<&Tensor> = args.iter().collect();
                let cx = tilec_ref::EvalCtx { graph: &self.graph, bound: &bound };
                let outs = tilec_ref::eval_op(&node.op, &refs, &cx)
                    .map_err(|e| Error::Compile(format!("node '{}' ({}): {e}", node.name, node.op.name())))?;
                for (&v, t) in node.outputs.iter().zip(outs) {
                    env.insert(v, t);
                }
            }
            self.launch(si)?;
            self.host_step(si)?;
            self.sync()?;
            self.check_status()?;
            let st = &self.steps[si];
            for &v in &st.outputs {
                let got = self.read(v)?;
                let Some(want) = env.get(&v) else { continue };
                let (a, b) = (want.to_f64_vec(), got.to_f64_vec());
                let mut worst: Option<(usize, f64)> = None;
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    let same = (x.is_nan() && y.is_nan()) || x == y;
                    let err = (x - y).abs();
                    if !same && !(err <= atol + rtol * x.abs()) && worst.is_none_or(|(_, w)| err > w || err.is_nan()) {
                        worst = Some((i, err));
                    }
                }
                if let Some((i, err)) = worst {
                    bad.push(format!(
                        "step {si} ({}): value '{}' element {i}: expected {}, got {} (abs err {err})",
                        st.name,
                        self.graph.value(v).name,
                        a[i],
                        b[i]
                    ));
                }
            }
        }
        Ok(bad)
    }
}
