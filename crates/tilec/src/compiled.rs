//! The compiled CPU path: optimize → partition → lower → schedule → C → shared object, with a
//! planned arena, run by a small executor.
//!
//! A graph must have concrete shapes (specialize symbolic dimensions first, see
//! [`crate::specialize_dims`]). A kernel group that cannot be lowered is retried node by node;
//! a node that still cannot be lowered runs on the reference interpreter inside the same plan
//! (a *fallback step*), so every graph the interpreter runs also runs here.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use tilec_ir::{Dim, Graph, NodeId, Tensor, ValueDef, ValueId};
use tilec_opt::manager::{Pipeline, PipelineOptions};
use tilec_opt::partition::{partition, Target, TargetKind};
use tilec_runtime::{Arena, BufferReq, MemoryPlan, Profile};
use tilec_cpu::families::CpuBuilt;
use tilec_tile::family::{describe_rejections, dispatch, Choices, Decision, Problem};
use tilec_tile::lower::Lowered;
use tilec_tile::schedule::CpuTarget;
use tilec_tile::{CheckSite, IndexViolation, Kernel, STATUS_WORDS};

use crate::Error;

/// Options of [`compile`].
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Graph optimization level (0..=3).
    pub opt_level: u8,
    /// Threads of parallel loops (default: all cores).
    pub threads: usize,
    /// Apply the default schedules (off: plain loop nests, for debugging).
    pub schedule: bool,
    /// Where compiled objects are cached (`None`: the back end's default).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Keep the text of every kernel after lowering and after scheduling.
    pub keep_ir: bool,
    /// Let the Winograd family take eligible 3x3 convolutions.
    pub winograd: bool,
    /// Families forced per op or kernel name (`--family OP=NAME`).
    pub families: Vec<(String, String)>,
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
        }
    }
}

/// Where a value's bytes live at run time.
#[derive(Copy, Clone, Debug)]
enum Slot {
    /// Offset into the arena.
    Arena(usize),
    /// Index into the constant pool.
    Const(usize),
}

enum StepKind {
    /// `ptrs` are the argument addresses, resolved once when the arena exists (the arena and
    /// the constant pool never move).
    Kernel { func: tilec_cpu::KernelFn, ptrs: Vec<*mut std::ffi::c_void> },
    /// A kernel whose constant gemm operands were packed once at compile time: `packed[s]`
    /// addresses slot `s`'s packed operand (null: the kernel packs it on each call).
    Prepacked { func: tilec_cpu::PackedKernelFn, ptrs: Vec<*mut std::ffi::c_void>, packed: Vec<*mut std::ffi::c_void> },
    Fallback { node: NodeId },
}

/// One step of the executable: a compiled kernel or a node on the reference interpreter.
struct Step {
    name: String,
    kind: StepKind,
    /// Arguments in ABI order (kernel params: inputs then outputs).
    args: Vec<ValueId>,
    outputs: Vec<ValueId>,
    /// The graph nodes the step computes, in order.
    nodes: Vec<NodeId>,
    /// The kernel's index check sites (when any, its last argument is the status).
    checks: Vec<CheckSite>,
    bytes: f64,
    flops: f64,
}

/// What compilation did, for `--stats` and the benchmark.
#[derive(Clone, Debug, Default)]
pub struct CompileReport {
    pub optimize: Duration,
    pub lower: Duration,
    pub codegen: Duration,
    pub total: Duration,
    pub kernels: usize,
    pub unique_kernels: usize,
    pub cache_hit: bool,
    /// Nodes run on the reference interpreter, with the reason.
    pub fallbacks: Vec<(String, String)>,
    pub arena_bytes: usize,
    pub intermediate_bytes: usize,
    pub inplace: usize,
    /// Kernel text after lowering and after scheduling (when `keep_ir`).
    pub ir: Vec<(String, String, String)>,
    /// Per kernel: the family that built it, its parameters and the families passed over.
    pub families: Vec<(String, Decision)>,
}

/// A compiled model.
pub struct Compiled {
    graph: Graph,
    steps: Vec<Step>,
    /// Never unloaded: OpenMP worker threads may still hold code of the library after a run.
    module: Option<std::mem::ManuallyDrop<tilec_cpu::Module>>,
    /// The whole graph runs on the reference interpreter (data-dependent shapes).
    interpreted: bool,
    slots: HashMap<ValueId, Slot>,
    consts: Vec<AlignedBytes>,
    /// Constant gemm operands in the layout of the kernels that read them.
    packed: Vec<AlignedBytes>,
    plan: MemoryPlan,
    reqs: Vec<BufferReq>,
    arena: Arena,
    /// The status the kernels that check indices record a violation in (boxed: the kernels'
    /// argument lists hold its address).
    status: Box<[AtomicI64; STATUS_WORDS]>,
    pub report: CompileReport,
}

/// Bytes with 64-byte alignment.
struct AlignedBytes {
    words: Vec<u64>,
}

impl AlignedBytes {
    fn zeroed(n: usize) -> AlignedBytes {
        AlignedBytes { words: vec![0u64; n.div_ceil(8).max(1) + 8] }
    }
    fn new(bytes: &[u8]) -> AlignedBytes {
        let mut words = vec![0u64; bytes.len().div_ceil(8).max(1) + 8];
        let base = words.as_ptr() as usize;
        let skip = (64 - base % 64) % 64 / 8;
        let dst: &mut [u8] = bytemuck_cast(&mut words[skip..]);
        dst[..bytes.len()].copy_from_slice(bytes);
        AlignedBytes { words }
    }
    fn ptr(&self) -> *mut u8 {
        let base = self.words.as_ptr() as usize;
        let skip = (64 - base % 64) % 64;
        (base + skip) as *mut u8
    }
}

fn bytemuck_cast(w: &mut [u64]) -> &mut [u8] {
    // SAFETY: u8 has no alignment or validity requirements; the length covers the same bytes.
    unsafe { std::slice::from_raw_parts_mut(w.as_mut_ptr() as *mut u8, w.len() * 8) }
}

pub(crate) fn fixed_shape(g: &Graph, v: ValueId) -> Option<Vec<usize>> {
    g.value(v).ty.shape.iter().map(|d| if let Dim::Fixed(n) = d { Some(*n) } else { None }).collect()
}

/// Bytes of a value with a fixed, addressable shape (the graph checks every shape it holds).
pub(crate) fn value_bytes(g: &Graph, v: ValueId) -> Option<usize> {
    g.value(v).ty.byte_size()
}

/// Compiles a graph with concrete shapes for the host CPU.
pub fn compile(graph: &Graph, opts: &CompileOptions) -> Result<Compiled, Error> {
    let t0 = Instant::now();
    let mut g = graph.clone();
    let pipe = Pipeline::for_level_and_target(opts.opt_level, TargetKind::Cpu);
    pipe.run(&mut g, &PipelineOptions::default()).map_err(|e| Error::Compile(e.to_string()))?;
    let mut report = CompileReport { optimize: t0.elapsed(), ..Default::default() };

    // Shapes that stay symbolic after specialization are data-dependent (NonZero, ...): such a
    // graph runs on the reference interpreter as a whole.
    if let Some(v) = g.value_ids().find(|&v| fixed_shape(&g, v).is_none()) {
        let val = g.value(v);
        let dims: Vec<String> = val.ty.shape.iter().map(|&d| g.syms.display(d)).collect();
        report.fallbacks.push((
            "graph".into(),
            format!("value '{}' has a data-dependent shape [{}]", val.name, dims.join(", ")),
        ));
        report.total = t0.elapsed();
        return Ok(Compiled {
            graph: g,
            steps: vec![],
            module: None,
            slots: HashMap::new(),
            consts: vec![],
            packed: vec![],
            plan: MemoryPlan::default(),
            reqs: vec![],
            arena: Arena::new(64).map_err(|e| Error::Compile(e.to_string()))?,
            status: Box::default(),
            interpreted: true,
            report,
        });
    }

    // Lower.
    let t1 = Instant::now();
    let target = Target::preset(TargetKind::Cpu);
    let part = partition(&g, &target);
    let cpu = CpuTarget::host();
    let mut kernels: Vec<Kernel> = vec![];
    let mut steps: Vec<Step> = vec![];
    let ftarget = Target { cpu: cpu.clone(), ..Target::host_cpu() };
    let disabled: Vec<&str> = if opts.winograd { vec![] } else { vec!["cpu.winograd"] };
    let choices = Choices { forced: &opts.families, disabled: &disabled, tuned: None };
    let registry = tilec_cpu::families::registry();
    for grp in &part.groups {
        let name = format!("k{}_{}", grp.id, grp.kind.to_string().to_lowercase());
        let build = |p: &Problem| dispatch(registry, p, &ftarget, &choices);
        let lowered: Vec<(Option<(CpuBuilt, Decision)>, Vec<NodeId>, String)> = match build(&Problem::of_group(&g, grp, &name)) {
            Ok(l) => vec![(Some(l), grp.nodes.clone(), name)],
            Err(_) if grp.nodes.len() > 1 => grp
                .nodes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let nm = format!("{name}_{i}");
                    match build(&Problem::of_node(&g, n, &nm)) {
                        Ok(l) => (Some(l), vec![n], nm),
                        Err(e) => {
                            report.fallbacks.push((g.node(n).op.name().to_string(), describe_rejections(&e)));
                            (None, vec![n], nm)
                        }
                    }
                })
                .collect(),
            Err(e) => {
                report.fallbacks.push((g.node(grp.nodes[0]).op.name().to_string(), describe_rejections(&e)));
                vec![(None, grp.nodes.clone(), name)]
            }
        };
        let share = 1.0 / lowered.len() as f64;
        for (l, nodes, nm) in lowered {
            match l {
                Some((built, decision)) => {
                    let l = Lowered { kernel: if opts.schedule { built.kernel } else { built.lowered.kernel.clone() }, ..built.lowered.clone() };
                    if opts.keep_ir {
                        report.ir.push((nm.clone(), built.lowered.kernel.to_string(), l.kernel.to_string()));
                    }
                    report.families.push((nm.clone(), decision));
                    let mut args = l.inputs.clone();
                    args.extend(&l.outputs);
                    steps.push(Step {
                        name: nm,
                        kind: StepKind::Kernel { func: dummy_kernel, ptrs: vec![] },
                        args,
                        outputs: l.outputs.clone(),
                        nodes: nodes.clone(),
                        checks: l.kernel.checks.clone(),
                        bytes: grp.bytes * share,
                        flops: grp.flops * share,
                    });
                    kernels.push(l.kernel);
                }
                None => {
                    for n in nodes {
                        let node = g.node(n);
                        steps.push(Step {
                            name: format!("{nm}_ref_{}", node.op.name()),
                            kind: StepKind::Fallback { node: n },
                            args: node.inputs.clone(),
                            outputs: node.outputs.clone(),
                            nodes: vec![n],
                            checks: vec![],
                            bytes: 0.0,
                            flops: 0.0,
                        });
                    }
                }
            }
        }
    }
    // Nodes in no group (sources read only inline, or whose value is a graph output) run on
    // the interpreter when a step or the graph outputs need their values.
    let extra = uncovered_producers(&g, &steps, |s| &s.args, |s| &s.outputs, |s| &s.nodes);
    for n in extra {
        let node = g.node(n);
        steps.push(Step {
            name: format!("ref_{}_{}", n.index(), node.op.name()),
            kind: StepKind::Fallback { node: n },
            args: node.inputs.clone(),
            outputs: node.outputs.clone(),
            nodes: vec![n],
            checks: vec![],
            bytes: 0.0,
            flops: 0.0,
        });
    }
    let mut steps = order_steps(steps).map_err(Error::Compile)?;
    report.lower = t1.elapsed();
    report.kernels = kernels.len();

    // Compile.
    let t2 = Instant::now();
    let mut cc = tilec_cpu::CompileOptions::default();
    if let Some(d) = &opts.cache_dir {
        cc.cache_dir = Some(d.clone());
    }
    let compiler = tilec_cpu::Compiler::new(cc);
    let module = compiler.compile(&kernels).map_err(|e| Error::Compile(e.to_string()))?;
    module.set_threads(opts.threads);
    let stats = module.stats().clone();
    report.unique_kernels = stats.unique;
    report.cache_hit = stats.cache_hit;
    for st in &mut steps {
        if let StepKind::Kernel { func, .. } = &mut st.kind {
            *func = module
                .get(&st.name)
                .ok_or_else(|| Error::Compile(format!("kernel {} is missing from the compiled module", st.name)))?;
        }
    }
    report.codegen = t2.elapsed();

    // Plan memory: graph inputs and every step output live in the arena; constants in a pool.
    let mut slots: HashMap<ValueId, Slot> = HashMap::new();
    let mut consts: Vec<AlignedBytes> = vec![];
    for v in g.value_ids() {
        if let ValueDef::Const(t) = &g.value(v).def {
            slots.insert(v, Slot::Const(consts.len()));
            consts.push(AlignedBytes::new(&t.to_le_bytes()));
        }
    }
    let lives = lifetimes(&g, &steps, |s| &s.args, |s| &s.outputs);
    let order: Vec<ValueId> = lives.iter().map(|l| l.0).collect();
    let reqs: Vec<BufferReq> = lives
        .iter()
        .map(|&(v, first, last)| BufferReq {
            size: value_bytes(&g, v).unwrap_or(0).max(1),
            align: 64,
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
    report.intermediate_bytes = plan.total_bytes;
    report.inplace = plan.inplace;
    let arena = Arena::new(plan.arena_bytes.max(64)).map_err(|e| Error::Compile(e.to_string()))?;
    report.total = t0.elapsed();
    let mut c = Compiled {
        graph: g,
        steps,
        module: Some(std::mem::ManuallyDrop::new(module)),
        slots,
        consts,
        packed: vec![],
        plan,
        reqs,
        arena,
        status: Box::default(),
        interpreted: false,
        report,
    };
    for si in 0..c.steps.len() {
        let mut resolved: Vec<*mut std::ffi::c_void> =
            c.steps[si].args.iter().map(|&a| c.ptr(a).map(|p| p as *mut std::ffi::c_void)).collect::<Result<_, _>>()?;
        if !c.steps[si].checks.is_empty() {
            resolved.push(c.status.as_ptr() as *mut std::ffi::c_void);
        }
        if let StepKind::Kernel { ptrs, .. } = &mut c.steps[si].kind {
            *ptrs = resolved;
        }
        c.prepack(si);
    }
    Ok(c)
}

/// Orders steps so that every value is produced before it is read (stable: the partition's
/// order is kept where dependencies allow).
fn order_steps(steps: Vec<Step>) -> Result<Vec<Step>, String> {
    order_by_deps(steps, |s| &s.args, |s| &s.outputs)
}

/// The nodes in no step whose values a step or the graph outputs need, with the uncovered
/// producers of their own inputs, in discovery order.
pub(crate) fn uncovered_producers<T>(
    g: &Graph,
    steps: &[T],
    args: impl Fn(&T) -> &[ValueId],
    outputs: impl Fn(&T) -> &[ValueId],
    nodes: impl Fn(&T) -> &[NodeId],
) -> Vec<NodeId> {
    let produced: HashSet<ValueId> = steps.iter().flat_map(|s| outputs(s).iter().copied()).collect();
    let mut needed: HashSet<ValueId> = steps.iter().flat_map(|s| args(s).iter().copied()).collect();
    needed.extend(g.outputs().iter().copied());
    let covered: HashSet<NodeId> = steps.iter().flat_map(|s| nodes(s).iter().copied()).collect();
    let mut extra: Vec<NodeId> = g
        .node_ids()
        .filter(|n| !covered.contains(n))
        .filter(|&n| g.node(n).outputs.iter().any(|v| needed.contains(v) && !produced.contains(v)))
        .collect();
    let mut i = 0;
    while i < extra.len() {
        let n = extra[i];
        for &v in &g.node(n).inputs {
            if let ValueDef::Node { node: p, .. } = g.value(v).def {
                if !covered.contains(&p) && !extra.contains(&p) && !produced.contains(&v) {
                    extra.push(p);
                }
            }
        }
        i += 1;
    }
    extra
}

/// The arena values of a step sequence (graph inputs and step outputs, by id) with the first and
/// last step that touches each; graph outputs live past the last step.
pub(crate) fn lifetimes<T>(
    g: &Graph,
    steps: &[T],
    args: impl Fn(&T) -> &[ValueId],
    outputs: impl Fn(&T) -> &[ValueId],
) -> Vec<(ValueId, usize, usize)> {
    let mut first: HashMap<ValueId, usize> = HashMap::new();
    let mut last: HashMap<ValueId, usize> = HashMap::new();
    for &v in g.inputs() {
        first.insert(v, 0);
        last.insert(v, 0);
    }
    for (i, st) in steps.iter().enumerate() {
        for &v in outputs(st) {
            first.entry(v).or_insert(i);
            last.insert(v, i);
        }
        for &v in args(st) {
            if first.contains_key(&v) {
                last.insert(v, i);
            }
        }
    }
    for &v in g.outputs() {
        if first.contains_key(&v) {
            last.insert(v, steps.len());
        }
    }
    let mut order: Vec<ValueId> = first.keys().copied().collect();
    order.sort();
    order.into_iter().map(|v| (v, first[&v], last[&v])).collect()
}

/// Orders items that read (`args`) and produce (`outputs`) values so that every value is
/// produced before it is read, keeping the given order where dependencies allow.
pub(crate) fn order_by_deps<T>(
    steps: Vec<T>,
    args: impl Fn(&T) -> &[ValueId],
    outputs: impl Fn(&T) -> &[ValueId],
) -> Result<Vec<T>, String> {
    let mut producer: HashMap<ValueId, usize> = HashMap::new();
    for (i, s) in steps.iter().enumerate() {
        for &v in outputs(s) {
            producer.insert(v, i);
        }
    }
    let n = steps.len();
    let mut indeg = vec![0usize; n];
    let mut users: Vec<Vec<usize>> = vec![vec![]; n];
    for (i, s) in steps.iter().enumerate() {
        let mut deps: Vec<usize> = args(s).iter().filter_map(|v| producer.get(v).copied()).filter(|&p| p != i).collect();
        deps.sort();
        deps.dedup();
        indeg[i] = deps.len();
        for p in deps {
            users[p].push(i);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            indeg[u] -= 1;
            if indeg[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() != n {
        return Err("the kernel steps depend on each other in a cycle".into());
    }
    let mut slots: Vec<Option<T>> = steps.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}

unsafe extern "C" fn dummy_kernel(_: *const *mut std::ffi::c_void) {}

impl Compiled {
    /// The optimized, specialized graph that was compiled.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Checks the memory plan (no two live buffers overlap).
    pub fn check_plan(&self) -> Result<(), String> {
        tilec_runtime::check(&self.reqs, &self.plan)
    }

    /// Packs the gemm operands of step `si` that read only constants, once, and switches the
    /// step to the kernel entry that reads them packed.
    fn prepack(&mut self, si: usize) {
        let Some(module) = self.module.as_deref() else { return };
        let st = &self.steps[si];
        let StepKind::Kernel { ptrs, .. } = &st.kind else { return };
        let Some((func, pack)) = module.get_packed(&st.name) else { return };
        let mut packed = vec![];
        let mut any = false;
        for (i, slot) in module.packs(&st.name).iter().enumerate() {
            let constant = slot
                .params
                .iter()
                .all(|&p| st.args.get(p).is_some_and(|v| matches!(self.slots.get(v), Some(Slot::Const(_)))));
            if !constant {
                packed.push(std::ptr::null_mut());
                continue;
            }
            let buf = AlignedBytes::zeroed(slot.bytes);
            // SAFETY: the pack function reads only the slot's (constant, live) parameters and
            // writes `slot.bytes` bytes at the 64-byte-aligned buffer.
            unsafe { pack(ptrs.as_ptr(), i as i64, buf.ptr() as *mut std::ffi::c_void) };
            packed.push(buf.ptr() as *mut std::ffi::c_void);
            self.packed.push(buf);
            any = true;
        }
        if any {
            let ptrs = ptrs.clone();
            self.steps[si].kind = StepKind::Prepacked { func, ptrs, packed };
        }
    }

    fn ptr(&self, v: ValueId) -> Result<*mut u8, Error> {
        match self.slots.get(&v) {
            Some(Slot::Arena(o)) => Ok(self.arena.ptr(*o)),
            Some(Slot::Const(i)) => Ok(self.consts[*i].ptr()),
            None => Err(Error::Compile(format!("value '{}' has no storage", self.graph.value(v).name))),
        }
    }

    fn read(&self, v: ValueId) -> Result<Tensor, Error> {
        let val = self.graph.value(v);
        if let ValueDef::Const(t) = &val.def {
            return Ok(t.clone());
        }
        let shape = fixed_shape(&self.graph, v).unwrap_or_default();
        let n = value_bytes(&self.graph, v).unwrap_or(0);
        let p = self.ptr(v)?;
        // SAFETY: the slot holds `n` bytes of this value (planned with its size).
        let bytes = unsafe { std::slice::from_raw_parts(p, n) };
        Tensor::from_le_bytes(val.ty.dtype, shape, bytes).map_err(|e| Error::Compile(e.to_string()))
    }

    fn write(&self, v: ValueId, t: &Tensor) -> Result<(), Error> {
        let n = value_bytes(&self.graph, v).unwrap_or(0);
        let have = t.numel() * t.dtype().size_bytes();
        if have != n {
            return Err(Error::Compile(format!(
                "value '{}': {} bytes produced, {} expected",
                self.graph.value(v).name,
                have,
                n
            )));
        }
        let p = self.ptr(v)?;
        // SAFETY: the slot has room for `n` bytes and nothing else refers to it during the copy.
        let dst = unsafe { std::slice::from_raw_parts_mut(p, n) };
        t.write_le_bytes(dst);
        Ok(())
    }

    /// Runs the model on inputs given in graph-input order.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        self.run_profiled(inputs, None)
    }

    /// Runs the model, adding each step's time to `profile` when given.
    pub fn run_profiled(&mut self, inputs: &[Tensor], mut profile: Option<&mut Profile>) -> Result<Vec<Tensor>, Error> {
        let g = &self.graph;
        if self.interpreted {
            return Ok(tilec_ref::run(g, inputs.to_vec())?);
        }
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
            self.write(v, t)?;
        }
        let bound = HashMap::new();
        for si in 0..self.steps.len() {
            let start = Instant::now();
            self.run_step(si, &bound)?;
            if let Some(p) = profile.as_deref_mut() {
                let st = &self.steps[si];
                p.record(&st.name, start.elapsed().as_nanos() as u64, st.bytes as u64, st.flops as u64);
            }
        }
        g.outputs().iter().map(|&v| self.read(v)).collect()
    }

    /// Runs the model step by step and checks every step's outputs against the reference
    /// interpreter evaluating the same nodes on the same (compiled) inputs. Returns one line per
    /// step whose outputs differ beyond `rtol`/`atol`.
    pub fn check_steps(&mut self, inputs: &[Tensor], rtol: f64, atol: f64) -> Result<Vec<String>, Error> {
        if self.interpreted {
            return Ok(vec![]);
        }
        self.poison();
        let g = &self.graph;
        for (&v, t) in g.inputs().iter().zip(inputs) {
            self.write(v, t)?;
        }
        let bound = HashMap::new();
        let mut bad = vec![];
        for si in 0..self.steps.len() {
            // Reference values of this step's nodes, from the current contents of its inputs.
            let mut env: HashMap<ValueId, Tensor> = HashMap::new();
            let st = &self.steps[si];
            for &n in &st.nodes {
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
            self.run_step(si, &bound)?;
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
                        "step {} ({}): value '{}' element {i}: expected {}, got {} (abs err {err})",
                        si,
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

    /// The index violation step `si` recorded, as an error naming the node (the status is
    /// cleared for the next run).
    fn check_status(&self, si: usize) -> Result<(), Error> {
        let st = &self.steps[si];
        if st.checks.is_empty() || self.status[0].load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let words: Vec<i64> = self.status.iter().map(|w| w.swap(0, Ordering::Relaxed)).collect();
        match IndexViolation::from_status(&words) {
            Some(v) => Err(Error::Compile(v.message(&st.checks, &st.name))),
            None => Ok(()),
        }
    }

    fn run_step(&self, si: usize, bound: &HashMap<tilec_ir::SymbolId, usize>) -> Result<(), Error> {
        let st = &self.steps[si];
        match &st.kind {
            StepKind::Kernel { func, ptrs } => {
                // SAFETY: the kernel was generated for exactly these buffers (dtypes and
                // shapes checked at compile time), each pointer addresses a live slot.
                unsafe { func(ptrs.as_ptr()) };
            }
            StepKind::Prepacked { func, ptrs, packed } => {
                // SAFETY: as above; each non-null packed entry holds its slot's operand, packed
                // from the same constants at compile time.
                unsafe { func(ptrs.as_ptr(), packed.as_ptr()) };
            }
            StepKind::Fallback { node } => {
                let node = self.graph.node(*node);
                let args: Vec<Tensor> = node.inputs.iter().map(|&v| self.read(v)).collect::<Result<_, _>>()?;
                let refs: Vec<&Tensor> = args.iter().collect();
                let cx = tilec_ref::EvalCtx { graph: &self.graph, bound };
                let outs = tilec_ref::eval_op(&node.op, &refs, &cx)
                    .map_err(|e| Error::Compile(format!("node '{}' ({}): {e}", node.name, node.op.name())))?;
                for (&v, t) in node.outputs.iter().zip(&outs) {
                    self.write(v, t)?;
                }
            }
        }
        self.check_status(si)
    }

    /// Names of fallback nodes (op names), for reports.
    pub fn fallback_ops(&self) -> Vec<String> {
        let mut s: Vec<String> = self
            .steps
            .iter()
            .filter_map(|st| match st.kind {
                StepKind::Fallback { node } => Some(self.graph.node(node).op.name().to_string()),
                _ => None,
            })
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        s.sort();
        s
    }

    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// Fills the arena with 0xFF bytes (NaN for floats, all ones for integers), so a value no
    /// kernel writes is caught by a comparison.
    pub fn poison(&mut self) {
        self.arena.fill(0xFF);
    }

    /// Whether the whole graph runs on the reference interpreter.
    pub fn interpreted(&self) -> bool {
        self.interpreted
    }

    /// The compiled module (absent when the graph is interpreted).
    pub fn module(&self) -> Option<&tilec_cpu::Module> {
        self.module.as_deref()
    }
}
