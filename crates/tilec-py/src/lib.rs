//! `tilec._tilec`: the native half of the `tilec` Python package (the Python half, under
//! `python/tilec`, gives the documented API). It wraps [`tilec::session::Session`]:
//!
//! - `Session(model, target, dims, dtype, opt_level, threads, winograd, tuning)` imports a
//!   model from a path or ONNX bytes;
//! - `run(inputs, alloc)` borrows every input through DLPack ([`dlpack`]), binds the model's
//!   free dimensions, compiles the build for them on first use, asks `alloc` for the output
//!   arrays once, borrows those, and runs from and into them.
//!
//! Invariants: the GIL is released while compiling and running, and the session's lock is
//! taken only without the GIL (so a thread waiting for it never blocks one that needs the
//! GIL); every failure is a `TilecError` (`InvalidInputError` for inputs that do not fit),
//! a panic included.

mod dlpack;
mod error;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tilec::exec::RawTensor;
use tilec::session::{Binding, Extent, IoInfo, SessionOptions, Target};
use tilec::{DType, Tensor};

use error::{guard, invalid, tilec_err, InvalidInputError, TilecError};

/// The session, movable between threads: its compiled code and arena are used only under the
/// lock, and nothing in them is tied to the thread that built them.
struct Shared(tilec::session::Session);
// SAFETY: see above; the raw pointers inside a build point into memory the build owns.
unsafe impl Send for Shared {}

/// A model imported once and compiled per input shapes.
#[pyclass(frozen, module = "tilec._tilec")]
struct Session {
    inner: Mutex<Shared>,
    inputs: Vec<IoInfo>,
    outputs: Vec<IoInfo>,
    /// The binding of the last run (what `explain()` describes without inputs).
    last: Mutex<Option<Binding>>,
}

fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic while the lock was held was already reported; the session is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn parse_target(s: &str) -> PyResult<Target> {
    match s {
        "cpu" => Ok(Target::Cpu),
        "cuda" => Ok(Target::Cuda { device: 0 }),
        _ => match s.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(device) => Ok(Target::Cuda { device }),
            None => Err(invalid(format!("target '{s}': expected \"cpu\", \"cuda\" or \"cuda:N\""))),
        },
    }
}

fn parse_dtype(s: &str) -> PyResult<DType> {
    match s {
        "f16" | "float16" | "half" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        _ => Err(invalid(format!("dtype '{s}': expected \"float16\" or \"bfloat16\" (or None for the model's own)"))),
    }
}

fn shape_tuple<'py>(py: Python<'py>, io: &IoInfo) -> PyResult<Bound<'py, PyTuple>> {
    let dims: Vec<Bound<'py, PyAny>> = io
        .shape
        .iter()
        .map(|e| match e {
            Extent::Fixed(n) => Ok(n.into_pyobject(py)?.into_any()),
            Extent::Sym(s) => Ok(s.into_pyobject(py)?.into_any()),
        })
        .collect::<PyResult<_>>()?;
    PyTuple::new(py, dims)
}

impl Session {
    /// Borrows the inputs (a list in input order) through DLPack.
    fn borrow_inputs(&self, inputs: &Bound<'_, PyList>) -> PyResult<Vec<dlpack::Borrowed>> {
        if inputs.len() != self.inputs.len() {
            let names: Vec<&str> = self.inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(invalid(format!(
                "the model has {} inputs ({}), {} were given",
                names.len(),
                names.join(", "),
                inputs.len()
            )));
        }
        inputs
            .iter()
            .zip(&self.inputs)
            .map(|(x, io)| dlpack::borrow(&x, &format!("input '{}'", io.name)))
            .collect()
    }

    /// Binds and compiles (without the GIL); returns the binding and the output types.
    fn prepare(&self, py: Python<'_>, raws: &[RawTensor]) -> PyResult<(Binding, Vec<(DType, Vec<usize>)>)> {
        py.detach(|| {
            let mut s = lock(&self.inner);
            let shapes: Vec<(DType, &[usize])> = raws.iter().map(|r| (r.dtype, r.shape.as_slice())).collect();
            let b = s.0.bind(&shapes).map_err(invalid)?;
            let types = s.0.output_types(&b).map_err(tilec_err)?;
            Ok((b, types))
        })
    }

    /// Copies host inputs (a list as for `run`, checked against the model) into tensors.
    fn host_tensors(&self, py: Python<'_>, inputs: &Bound<'_, PyList>) -> PyResult<Vec<Tensor>> {
        let ins = self.borrow_inputs(inputs)?;
        let raws: Vec<RawTensor> = ins.iter().map(|b| b.raw.clone()).collect();
        self.prepare(py, &raws)?;
        let mut ts = Vec::with_capacity(ins.len());
        for (b, io) in ins.iter().zip(&self.inputs) {
            let r = &b.raw;
            if r.memory != tilec::exec::Memory::Host {
                return Err(invalid(format!("input '{}': profile() takes host tensors", io.name)));
            }
            // The shape matched the compiled one (prepare), so the size cannot overflow.
            let n = r.shape.iter().product::<usize>() * r.dtype.size_bytes();
            // SAFETY: the capsule in `b` keeps `n` bytes alive at `addr` (a dense tensor).
            let bytes = unsafe { std::slice::from_raw_parts(r.addr as *const u8, n) };
            ts.push(Tensor::from_le_bytes(r.dtype, r.shape.clone(), bytes).map_err(tilec_err)?);
        }
        Ok(ts)
    }
}

#[pymethods]
impl Session {
    #[new]
    #[pyo3(signature = (model, target="cpu", dims=None, dtype=None, opt_level=3, threads=None, winograd=true, tuning=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyAny>,
        target: &str,
        dims: Option<HashMap<String, usize>>,
        dtype: Option<&str>,
        opt_level: u8,
        threads: Option<usize>,
        winograd: bool,
        tuning: bool,
    ) -> PyResult<Session> {
        guard(|| {
            if opt_level > 3 {
                return Err(invalid(format!("opt_level {opt_level}: expected 0 to 3")));
            }
            if threads == Some(0) {
                return Err(invalid("threads 0: expected at least 1".into()));
            }
            let opts = SessionOptions {
                target: parse_target(target)?,
                dims: dims.unwrap_or_default(),
                dtype: dtype.map(parse_dtype).transpose()?,
                opt_level,
                threads,
                winograd,
                tuning,
            };
            let s = if let Ok(b) = model.cast::<PyBytes>() {
                let bytes = b.as_bytes().to_vec();
                py.detach(|| tilec::session::Session::from_bytes(&bytes, opts).map(Shared))
            } else {
                let path: std::path::PathBuf = model.extract().map_err(|_| {
                    invalid("model: expected a path, ONNX bytes or an onnx.ModelProto".into())
                })?;
                py.detach(|| tilec::session::Session::from_path(&path, opts).map(Shared))
            }
            .map_err(tilec_err)?;
            Ok(Session {
                inputs: s.0.inputs().to_vec(),
                outputs: s.0.outputs().to_vec(),
                inner: Mutex::new(s),
                last: Mutex::new(None),
            })
        })
    }

    /// Input names, in order.
    #[getter]
    fn input_names(&self) -> Vec<String> {
        self.inputs.iter().map(|i| i.name.clone()).collect()
    }

    /// Output names, in order.
    #[getter]
    fn output_names(&self) -> Vec<String> {
        self.outputs.iter().map(|i| i.name.clone()).collect()
    }

    /// `[(name, dtype, shape)]` of the inputs; symbolic dimensions are strings.
    #[getter]
    fn input_types<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, &'static str, Bound<'py, PyTuple>)>> {
        self.inputs.iter().map(|i| Ok((i.name.clone(), dlpack::dtype_name(i.dtype), shape_tuple(py, i)?))).collect()
    }

    /// `[(name, dtype, shape)]` of the outputs.
    #[getter]
    fn output_types<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, &'static str, Bound<'py, PyTuple>)>> {
        self.outputs.iter().map(|i| Ok((i.name.clone(), dlpack::dtype_name(i.dtype), shape_tuple(py, i)?))).collect()
    }

    /// Number of builds compiled so far (one per binding of the symbolic dimensions).
    #[getter]
    fn builds(&self, py: Python<'_>) -> usize {
        py.detach(|| lock(&self.inner).0.builds())
    }

    /// Runs on `inputs` (a list of DLPack tensors in input order); `alloc([(shape, dtype)])`
    /// returns the output tensors to fill. `stream`: the caller's CUDA stream handle (PyTorch's
    /// current stream) whose queued work the run waits for before it reads device inputs or
    /// writes device outputs.
    #[pyo3(signature = (inputs, alloc, stream=None))]
    fn run<'py>(&self, py: Python<'py>, inputs: &Bound<'py, PyList>, alloc: &Bound<'py, PyAny>, stream: Option<u64>) -> PyResult<Bound<'py, PyAny>> {
        guard(|| {
            let ins = self.borrow_inputs(inputs)?;
            let raws: Vec<RawTensor> = ins.iter().map(|b| b.raw.clone()).collect();
            let (binding, types) = self.prepare(py, &raws)?;
            let spec: Vec<(Vec<usize>, &'static str)> =
                types.iter().map(|(d, s)| (s.clone(), dlpack::dtype_name(*d))).collect();
            let outs = alloc.call1((spec,))?;
            let outs_list = outs.cast::<PyList>().map_err(|_| tilec_err("alloc did not return a list"))?;
            let outb: Vec<dlpack::Borrowed> = outs_list
                .iter()
                .zip(&self.outputs)
                .map(|(x, io)| dlpack::borrow(&x, &format!("output '{}'", io.name)))
                .collect::<PyResult<_>>()?;
            let out_raws: Vec<RawTensor> = outb.iter().map(|b| b.raw.clone()).collect();
            py.detach(|| {
                let mut s = lock(&self.inner);
                // SAFETY: the capsules in `ins` and `outb` keep every buffer alive and are
                // held until after the call; their dtypes and shapes are checked by run_raw;
                // the outputs were freshly allocated, so they overlap nothing; `stream` is
                // the caller's current stream, on the device the tensors are on.
                unsafe { s.0.run_raw_after(&binding, &raws, &out_raws, stream) }.map_err(tilec_err)
            })?;
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(binding);
            drop((ins, outb));
            Ok(outs)
        })
    }

    /// The kernel partition and each kernel's family, for the inputs' shapes (a list as for
    /// `run`), else the last run's, else the model's when it has no symbolic dimensions.
    #[pyo3(signature = (inputs=None))]
    fn explain(&self, py: Python<'_>, inputs: Option<&Bound<'_, PyList>>) -> PyResult<String> {
        guard(|| {
            let binding = match inputs {
                Some(l) => {
                    let ins = self.borrow_inputs(l)?;
                    let raws: Vec<RawTensor> = ins.iter().map(|b| b.raw.clone()).collect();
                    self.prepare(py, &raws)?.0
                }
                None => match self.last.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                    Some(b) => b,
                    None => {
                        if self.inputs.iter().any(|i| i.shape.iter().any(|e| matches!(e, Extent::Sym(_)))) {
                            return Err(invalid(
                                "the model has symbolic dimensions: give inputs to explain(), run it first, or fix them with dims=".into(),
                            ));
                        }
                        vec![]
                    }
                },
            };
            py.detach(|| lock(&self.inner).0.explain(&binding)).map_err(tilec_err)
        })
    }

    /// Runs `inputs` (else zeros shaped as the last run's inputs) `reps` times kernel by
    /// kernel; returns the per-kernel time table.
    #[pyo3(signature = (inputs=None, reps=5))]
    fn profile(&self, py: Python<'_>, inputs: Option<&Bound<'_, PyList>>, reps: usize) -> PyResult<String> {
        guard(|| {
            let ts = match inputs {
                Some(l) => self.host_tensors(py, l)?,
                None => {
                    let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let b = last.ok_or_else(|| invalid("profile(): give inputs, or run the model first".into()))?;
                    let types = py.detach(|| lock(&self.inner).0.io_types(&b, true)).map_err(tilec_err)?;
                    types.into_iter().map(|(d, s)| Tensor::zeros(d, s)).collect()
                }
            };
            py.detach(|| lock(&self.inner).0.profile(&ts, reps)).map_err(tilec_err)
        })
    }
}

#[pymodule]
fn _tilec(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Session>()?;
    m.add("TilecError", m.py().get_type::<TilecError>())?;
    m.add("InvalidInputError", m.py().get_type::<InvalidInputError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
