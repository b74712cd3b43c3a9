//! Running a loaded model on memory the caller owns: the inputs are copied from the caller's
//! buffers straight into the arena and the outputs straight out of it, with no host
//! [`Tensor`] in between. This is how bindings hand over NumPy arrays or PyTorch tensors
//! (through DLPack) without converting them; on a GPU back end, buffers already on the device
//! are copied device to device and never visit the host.
//!
//! The caller vouches for its addresses (the entry point is `unsafe`); everything else — the
//! number of tensors, their dtypes and shapes against the compiled ones, the memory they lie
//! in against the back end's — is checked here and reported as an [`Error`].

use tilec_ir::{DType, Tensor, ValueDef};

use super::{fixed_shape, Backend, Executor, Slot};
use crate::Error;

/// Where a caller's buffer lies.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Host memory.
    Host,
    /// Memory of GPU `ordinal` (a device address).
    Device(usize),
}

/// A dense row-major tensor in caller memory.
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Address of the first element.
    pub addr: u64,
    pub memory: Memory,
}

impl RawTensor {
    /// Size in bytes (the shape was checked against a compiled one, so it cannot overflow).
    fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_bytes()
    }
}

/// Checks caller tensors against the compiled values `vals` (`what`: "input" or "output").
fn check<B: Backend>(x: &Executor<B>, vals: &[tilec_ir::ValueId], ts: &[RawTensor], what: &str) -> Result<(), Error> {
    let g = &x.graph;
    if ts.len() != vals.len() {
        return Err(Error::Compile(format!("the model has {} {what}s, {} were given", vals.len(), ts.len())));
    }
    for (&v, t) in vals.iter().zip(ts) {
        let val = g.value(v);
        let want = fixed_shape(g, v).unwrap_or_default();
        if t.dtype != val.ty.dtype || t.shape != want {
            return Err(Error::Compile(format!(
                "{what} '{}': expected {}{:?}, got {}{:?}",
                val.name, val.ty.dtype, want, t.dtype, t.shape
            )));
        }
        if t.addr == 0 && t.bytes() > 0 {
            return Err(Error::Compile(format!("{what} '{}': a null buffer", val.name)));
        }
    }
    Ok(())
}

/// Copies a host tensor (a constant output, or one the interpreter computed) to caller memory.
fn store(t: &Tensor, dst: &RawTensor) -> Result<(), Error> {
    if dst.memory != Memory::Host {
        return Err(Error::Compile("an output computed on the host cannot be stored in device memory".into()));
    }
    let n = dst.bytes();
    // SAFETY: the caller vouches that `dst` is writable for its size (`run_raw`).
    let out = unsafe { std::slice::from_raw_parts_mut(dst.addr as *mut u8, n) };
    t.write_le_bytes(out);
    Ok(())
}

impl<B: Backend> Executor<B> {
    /// Runs the model on caller buffers: `inputs` in graph-input order, results written into
    /// `outputs` in graph-output order. Dtypes and shapes must be the compiled ones.
    ///
    /// # Safety
    /// Every input must be readable and every output writable for its size (dtype and shape)
    /// at its address, in its memory, for the duration of the call; outputs must not overlap
    /// each other or the inputs.
    pub unsafe fn run_raw(&mut self, inputs: &[RawTensor], outputs: &[RawTensor]) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.run_raw_after(inputs, outputs, None) }
    }

    /// [`Executor::run_raw`] with device inputs and outputs that another library's stream
    /// `after` (a handle on the same device and context, such as PyTorch's current stream)
    /// may still be writing or reusing: everything queued on it so far completes before the
    /// model reads or writes them. The call returns once the outputs are written.
    ///
    /// # Safety
    /// As [`Executor::run_raw`]; `after`, if given, must be a live stream handle of the
    /// back end's device and context.
    pub unsafe fn run_raw_after(&mut self, inputs: &[RawTensor], outputs: &[RawTensor], after: Option<u64>) -> Result<(), Error> {
        check(self, self.graph.inputs(), inputs, "input")?;
        check(self, self.graph.outputs(), outputs, "output")?;
        if self.interpreted {
            let ts: Vec<Tensor> = inputs
                .iter()
                .map(|t| {
                    if t.memory != Memory::Host {
                        return Err(Error::Compile("this model runs on the host interpreter: give host inputs".into()));
                    }
                    // SAFETY: the caller vouches for the input's size.
                    let b = unsafe { std::slice::from_raw_parts(t.addr as *const u8, t.bytes()) };
                    Tensor::from_le_bytes(t.dtype, t.shape.clone(), b).map_err(|e| Error::Compile(e.to_string()))
                })
                .collect::<Result<_, _>>()?;
            let outs = tilec_ref::run(&self.graph, ts)?;
            for (t, d) in outs.iter().zip(outputs) {
                store(t, d)?;
            }
            return Ok(());
        }
        self.backend.sync()?;
        if let Some(s) = after {
            // SAFETY: the caller vouches for the handle.
            unsafe { self.backend.order_after(s)? };
        }
        for (&v, t) in self.graph.inputs().iter().zip(inputs) {
            if let Some(&Slot::Arena(o)) = self.slots.get(&v) {
                // SAFETY: as the caller vouches; the span was checked against the plan.
                unsafe { self.backend.write_raw(o, t.addr, t.bytes(), t.memory)? };
            }
        }
        self.resident.iter_mut().for_each(|r| *r = false);
        self.exec()?;
        self.backend.sync()?;
        self.check_status()?;
        for (&v, d) in self.graph.outputs().iter().zip(outputs) {
            match (&self.graph.value(v).def, self.slots.get(&v)) {
                (ValueDef::Const(t), _) => store(t, d)?,
                (_, Some(&Slot::Arena(o))) => unsafe { self.backend.read_raw(o, d.addr, d.bytes(), d.memory)? },
                _ => store(&self.read(v)?, d)?,
            }
        }
        self.backend.sync()
    }

    /// Names, dtypes and shapes of the compiled inputs (`inputs`) or outputs.
    pub fn io_types(&self, inputs: bool) -> Vec<(String, DType, Vec<usize>)> {
        let g = &self.graph;
        let vals = if inputs { g.inputs() } else { g.outputs() };
        vals.iter()
            .map(|&v| (g.value(v).name.clone(), g.value(v).ty.dtype, fixed_shape(g, v).unwrap_or_default()))
            .collect()
    }
}
