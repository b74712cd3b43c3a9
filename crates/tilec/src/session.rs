//! Sessions: a model imported once and compiled once per set of input shapes, for callers that
//! run it many times from memory they own (the Python package, through `tilec-py`).
//!
//! A [`Session`] keeps the imported graph with its symbolic dimensions. A call binds the free
//! symbols from the inputs' shapes ([`Session::bind`] checks names, dtypes, ranks and fixed
//! sizes and says what was expected), and the first call with a new binding specializes the
//! model to it and compiles it for the target ([`Session::prepare`]); later calls with the
//! same binding reuse that build. Runs go through [`Executor::run_raw`]: caller buffers are
//! copied straight into and out of the planned arena.
//!
//! Invariants: nothing here panics on user data; every failure is an [`Error`] naming the
//! input, dimension or node concerned.

use std::collections::HashMap;
use std::fmt::Write as _;

use tilec_ir::{DType, Dim, Graph, SymbolId, Tensor};
use tilec_onnx::proto::ModelProto;

use crate::compiled::{self, CompileOptions, Compiled};
use crate::compiled_cuda::{self, CompiledCuda, CudaOptions};
use crate::exec::RawTensor;
use crate::{Error, ImportError, ImportOptions};

/// Where a session's model runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Cpu,
    /// GPU `device` (its ordinal).
    Cuda { device: usize },
}

/// Options of a [`Session`].
#[derive(Clone, Debug)]
pub struct SessionOptions {
    pub target: Target,
    /// Fixed sizes of named symbolic dimensions (applied at import).
    pub dims: HashMap<String, usize>,
    /// Run the model in 16 bits (`F16` or `BF16`; inputs and outputs stay f32).
    pub dtype: Option<DType>,
    /// Graph optimization level (0..=3).
    pub opt_level: u8,
    /// CPU threads (`None`: all cores).
    pub threads: Option<usize>,
    /// Let the CPU's Winograd family take 3x3 convolutions.
    pub winograd: bool,
    /// Read tuned parameters from the user's tuning database.
    pub tuning: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            target: Target::Cpu,
            dims: HashMap::new(),
            dtype: None,
            opt_level: 3,
            threads: None,
            winograd: true,
            tuning: true,
        }
    }
}

/// A dimension of an input or output as the model declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Extent {
    Fixed(usize),
    /// A symbolic dimension, by its name (`batch`, `seq*2`, ...).
    Sym(String),
}

/// An input or output of a session's model.
#[derive(Clone, Debug)]
pub struct IoInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<Extent>,
}

/// A build of the model for one binding of its free dimensions.
pub enum Loaded {
    Cpu(Compiled),
    Cuda(CompiledCuda),
}

/// The values of the free symbols, in symbol order: what a build is cached by.
pub type Binding = Vec<usize>;

/// A model imported once, compiled per input shapes.
pub struct Session {
    model: ModelProto,
    opts: SessionOptions,
    graph: Graph,
    inputs: Vec<IoInfo>,
    outputs: Vec<IoInfo>,
    /// The free symbols of the imported graph.
    free: Vec<SymbolId>,
    builds: HashMap<Binding, Loaded>,
}

fn io_info(g: &Graph, vals: &[tilec_ir::ValueId]) -> Vec<IoInfo> {
    vals.iter()
        .map(|&v| {
            let val = g.value(v);
            let shape = val
                .ty
                .shape
                .iter()
                .map(|&d| match d {
                    Dim::Fixed(n) => Extent::Fixed(n),
                    Dim::Sym(_) => Extent::Sym(g.syms.display(d).to_string()),
                })
                .collect();
            IoInfo { name: val.name.clone(), dtype: val.ty.dtype, shape }
        })
        .collect()
}

fn import(model: &ModelProto, dims: HashMap<String, usize>) -> Result<Graph, Error> {
    match crate::import(model, &ImportOptions { dim_values: dims, ..Default::default() }) {
        Err(Error::Import(e @ ImportError::NonConstant { .. })) => Err(Error::Compile(format!(
            "cannot import the model: {e} (a session compiles shape operands in; export the model with them constant)"
        ))),
        r => r,
    }
}

impl Session {
    /// Imports a decoded model.
    pub fn new(model: ModelProto, opts: SessionOptions) -> Result<Session, Error> {
        if model.graph.is_none() {
            return Err(Error::Compile("the model has no graph".into()));
        }
        if let Some(d) = opts.dtype {
            if d != DType::F16 && d != DType::BF16 {
                return Err(Error::Compile(format!("dtype {d}: expected f16 or bf16 (or none for the model's own)")));
            }
        }
        let graph = import(&model, opts.dims.clone())?;
        let free = (0..graph.syms.symbols.len())
            .map(|i| SymbolId(i as u32))
            .filter(|&s| graph.syms.symbols[s.0 as usize].expr.is_none())
            .collect();
        let inputs = io_info(&graph, graph.inputs());
        let outputs = io_info(&graph, graph.outputs());
        Ok(Session { model, opts, graph, inputs, outputs, free, builds: HashMap::new() })
    }

    /// Decodes and imports an ONNX model from its bytes (external data is not supported here).
    pub fn from_bytes(bytes: &[u8], opts: SessionOptions) -> Result<Session, Error> {
        use prost::Message;
        let model = ModelProto::decode(bytes)
            .map_err(|e| Error::Compile(format!("the bytes are not an ONNX model: {e}")))?;
        Session::new(model, opts)
    }

    /// Reads, decodes and imports an ONNX model file (external data inlined).
    pub fn from_path(path: &std::path::Path, opts: SessionOptions) -> Result<Session, Error> {
        let model = tilec_onnx::load_model(path).map_err(|e| Error::Compile(format!("{}: {e}", path.display())))?;
        Session::new(model, opts)
    }

    pub fn inputs(&self) -> &[IoInfo] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[IoInfo] {
        &self.outputs
    }

    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    /// Checks inputs' dtypes and shapes (in input order) against the model and binds its free
    /// dimensions from them. The error says what was expected.
    pub fn bind(&self, inputs: &[(DType, &[usize])]) -> Result<Binding, String> {
        let g = &self.graph;
        if inputs.len() != self.inputs.len() {
            let names: Vec<&str> = self.inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(format!(
                "the model has {} inputs ({}), {} were given",
                names.len(),
                names.join(", "),
                inputs.len()
            ));
        }
        let mut syms: HashMap<SymbolId, usize> = HashMap::new();
        for (&v, &(dtype, shape)) in g.inputs().iter().zip(inputs) {
            let val = g.value(v);
            let ty = &val.ty;
            let want = || {
                let s: Vec<String> = ty.shape.iter().map(|&d| g.syms.display(d).to_string()).collect();
                format!("{}[{}]", ty.dtype, s.join(", "))
            };
            let bad = |why: String| format!("input '{}': expected {}, got {dtype}{shape:?}: {why}", val.name, want());
            if dtype != ty.dtype {
                return Err(bad(format!("wrong dtype (expected {}, got {dtype})", ty.dtype)));
            }
            if shape.len() != ty.rank() {
                return Err(bad(format!("wrong rank (expected {}, got {})", ty.rank(), shape.len())));
            }
            for (k, (&d, &n)) in ty.shape.iter().zip(shape).enumerate() {
                match d {
                    Dim::Fixed(m) if m != n => return Err(bad(format!("dimension {k} must be {m}, is {n}"))),
                    Dim::Fixed(_) => {}
                    Dim::Sym(s) => match syms.get(&s).copied().or_else(|| g.syms.eval(d, &syms)) {
                        Some(m) if m != n => {
                            return Err(bad(format!(
                                "dimension {k} ('{}') is {m} from another input, here {n}",
                                g.syms.display(d)
                            )))
                        }
                        Some(_) => {}
                        None if g.syms.symbols.get(s.0 as usize).is_some_and(|x| x.expr.is_none()) => {
                            syms.insert(s, n);
                        }
                        None => {
                            return Err(bad(format!(
                                "dimension {k} ('{}') cannot be bound from this input alone",
                                g.syms.display(d)
                            )))
                        }
                    },
                }
            }
        }
        self.free
            .iter()
            .map(|s| {
                syms.get(s).copied().ok_or_else(|| format!("dimension '{}' is not bound by any input", g.syms.name(*s)))
            })
            .collect()
    }

    /// The build for `binding`, compiled on first use.
    pub fn prepare(&mut self, binding: &Binding) -> Result<&mut Loaded, Error> {
        if !self.builds.contains_key(binding) {
            let loaded = self.compile(binding)?;
            self.builds.insert(binding.clone(), loaded);
        }
        self.builds.get_mut(binding).ok_or_else(|| Error::Compile("the build disappeared".into()))
    }

    /// Number of builds (distinct bindings compiled).
    pub fn builds(&self) -> usize {
        self.builds.len()
    }

    fn compile(&self, binding: &Binding) -> Result<Loaded, Error> {
        let graph = if self.free.is_empty() {
            self.graph.clone()
        } else {
            let mut dims = self.opts.dims.clone();
            for (s, &n) in self.free.iter().zip(binding) {
                dims.insert(self.graph.syms.name(*s).to_string(), n);
            }
            import(&self.model, dims)?
        };
        let graph = match self.opts.dtype {
            Some(d) => {
                tilec_opt::passes::convert_precision(&graph, d).map_err(|e| Error::Compile(format!("dtype {d}: {e}")))?.0
            }
            None => graph,
        };
        match self.opts.target {
            Target::Cpu => {
                let mut o = CompileOptions { opt_level: self.opts.opt_level, winograd: self.opts.winograd, ..Default::default() };
                if let Some(t) = self.opts.threads {
                    o.threads = t.max(1);
                }
                if self.opts.tuning {
                    // A database that cannot be opened is ignored, as `tilec run` does.
                    o.tuning = crate::tune::open_tuning(None, o.threads).ok().flatten();
                }
                Ok(Loaded::Cpu(compiled::compile(&graph, &o)?))
            }
            Target::Cuda { device } => {
                let mut o = CudaOptions { opt_level: self.opts.opt_level, device, ..Default::default() };
                if self.opts.tuning {
                    // A database or device that cannot be used is ignored, as `tilec run` does.
                    o.tuning = crate::tune::open_cuda_tuning(None, device).ok().flatten();
                }
                Ok(Loaded::Cuda(compiled_cuda::compile(&graph, &o)?))
            }
        }
    }

    /// Dtypes and shapes of the outputs of `binding`'s build.
    pub fn output_types(&mut self, binding: &Binding) -> Result<Vec<(DType, Vec<usize>)>, Error> {
        self.io_types(binding, false)
    }

    /// Dtypes and shapes of the inputs (`inputs`) or outputs of `binding`'s build.
    pub fn io_types(&mut self, binding: &Binding, inputs: bool) -> Result<Vec<(DType, Vec<usize>)>, Error> {
        let io = match self.prepare(binding)? {
            Loaded::Cpu(c) => c.io_types(inputs),
            Loaded::Cuda(c) => c.io_types(inputs),
        };
        Ok(io.into_iter().map(|(_, d, s)| (d, s)).collect())
    }

    /// Runs `binding`'s build on caller buffers (see [`crate::exec::Executor::run_raw`]).
    ///
    /// # Safety
    /// As [`crate::exec::Executor::run_raw`]: every buffer valid for its dtype and shape.
    pub unsafe fn run_raw(&mut self, binding: &Binding, inputs: &[RawTensor], outputs: &[RawTensor]) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.run_raw_after(binding, inputs, outputs, None) }
    }

    /// [`Session::run_raw`] ordered after the work queued on another library's stream `after`
    /// (see [`crate::exec::Executor::run_raw_after`]).
    ///
    /// # Safety
    /// As [`Session::run_raw`]; `after`, if given, must be a live stream handle of the
    /// session's device and context.
    pub unsafe fn run_raw_after(&mut self, binding: &Binding, inputs: &[RawTensor], outputs: &[RawTensor], after: Option<u64>) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        match self.prepare(binding)? {
            Loaded::Cpu(c) => unsafe { c.run_raw_after(inputs, outputs, after) },
            Loaded::Cuda(c) => unsafe { c.run_raw_after(inputs, outputs, after) },
        }
    }

    /// Runs on host tensors in input order (for Rust callers and tests).
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        let b = self.bind(&inputs.iter().map(|t| (t.dtype(), t.shape())).collect::<Vec<_>>()).map_err(Error::Compile)?;
        match self.prepare(&b)? {
            Loaded::Cpu(c) => c.run(inputs),
            Loaded::Cuda(c) => c.run(inputs),
        }
    }

    /// The kernel partition and every kernel's family of `binding`'s build, as text.
    pub fn explain(&mut self, binding: &Binding) -> Result<String, Error> {
        let kind = match self.opts.target {
            Target::Cpu => tilec_opt::partition::TargetKind::Cpu,
            Target::Cuda { .. } => tilec_opt::partition::TargetKind::Cuda,
        };
        let (graph, r) = match self.prepare(binding)? {
            Loaded::Cpu(c) => (c.graph().clone(), c.report.clone()),
            Loaded::Cuda(c) => (c.graph().clone(), c.report.clone()),
        };
        let t = tilec_opt::partition::Target::preset(kind);
        let p = tilec_opt::partition::partition_with(&graph, &t, &Default::default());
        let mut s = tilec_opt::partition::explain(&graph, &p, &t);
        let _ = writeln!(s, "\nkernels ({} compiled, {} unique):", r.kernels, r.unique_kernels);
        for (k, d) in &r.decisions {
            let _ = writeln!(s, "  {k}: {}", d.summary());
        }
        for (op, why) in &r.fallbacks {
            let _ = writeln!(s, "  host step {op}: {why}");
        }
        for (k, note) in &r.notes {
            let _ = writeln!(s, "  note {k}: {note}");
        }
        Ok(s)
    }

    /// Runs `inputs` `reps` times step by step and returns the per-kernel profile table.
    pub fn profile(&mut self, inputs: &[Tensor], reps: usize) -> Result<String, Error> {
        let b = self.bind(&inputs.iter().map(|t| (t.dtype(), t.shape())).collect::<Vec<_>>()).map_err(Error::Compile)?;
        let mut p = tilec_runtime::Profile::default();
        for _ in 0..reps.max(1) {
            match self.prepare(&b)? {
                Loaded::Cpu(c) => c.run_profiled(inputs, Some(&mut p))?,
                Loaded::Cuda(c) => c.run_profiled(inputs, Some(&mut p))?,
            };
        }
        Ok(p.render_table())
    }

    /// Op names of the nodes that run on the reference interpreter in `binding`'s build.
    pub fn fallback_ops(&mut self, binding: &Binding) -> Result<Vec<String>, Error> {
        Ok(match self.prepare(binding)? {
            Loaded::Cpu(c) => c.fallback_ops(),
            Loaded::Cuda(c) => c.fallback_ops(),
        })
    }
}
