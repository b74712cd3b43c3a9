//! tilec: an AI compiler for ONNX models. This crate is the facade over the compiler's
//! crates and the home of the `tilec` command-line tool.
//!
//! ```no_run
//! use std::collections::HashMap;
//! let graph = tilec::load("model.onnx".as_ref(), &tilec::ImportOptions::default())?;
//! let inputs: HashMap<String, tilec::Tensor> = HashMap::new(); // name -> tensor
//! let outputs = tilec::run(&graph, inputs, tilec::Backend::Ref)?;
//! # Ok::<(), tilec::Error>(())
//! ```
//!
//! - [`load`] reads an ONNX file, imports it into the canonical graph IR and verifies it.
//! - [`run`] executes a graph on a [`Backend`] (today: the reference interpreter).
//! - [`tensor_io`] reads and writes tensors as NumPy `.npy` and ONNX `TensorProto` files;
//!   [`compare`] checks outputs against expected values with tolerances.
//!
//! Invariants: nothing here panics on user data; every failure is an [`Error`] that
//! names the node, op, input or file it concerns.

pub mod compare;
pub mod compiled;
pub mod compiled_cuda;
pub mod exec;
pub mod generate;
pub mod cuda_families;
pub mod session;
pub mod tensor_io;
pub mod tune;

use std::collections::HashMap;
use std::path::Path;

pub use tilec_ir as ir;
pub use tilec_onnx as onnx;
pub use tilec_ref as reference;
pub use tilec_runtime as runtime;
pub use tilec_cuda as cuda;
pub use tilec_tune as tuner;

pub use tilec_ir::{DType, Graph, Tensor};
pub use tilec_onnx::{ImportError, ImportOptions};

/// Everything that can go wrong between a model file and its outputs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model could not be read, decoded or imported.
    #[error(transparent)]
    Import(#[from] ImportError),
    /// The imported graph broke an IR invariant (an importer bug, reported as an error).
    #[error("the imported graph is invalid: {0}")]
    Verify(#[from] tilec_ir::IrError),
    /// The reference interpreter failed.
    #[error(transparent)]
    Ref(#[from] tilec_ref::RefError),
    /// A tensor file could not be read or written.
    #[error(transparent)]
    TensorFile(#[from] tensor_io::TensorFileError),
    /// Compilation or execution on a compiled back end failed.
    #[error("compiled backend: {0}")]
    Compile(String),
    /// `generate` could not run the model as a decoder (what was expected and not found).
    #[error("{0}")]
    Generate(String),
}

/// Where a graph runs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Compiled to native code for the host CPU (`tilec-cpu`): the default.
    #[default]
    Cpu,
    /// The reference interpreter (`tilec-ref`): slow, simple, the correctness oracle.
    Ref,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Cpu, Backend::Ref];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Ref => "ref",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Loads an ONNX model file, imports it and verifies the resulting graph.
pub fn load(path: &Path, opts: &ImportOptions) -> Result<Graph, Error> {
    let graph = tilec_onnx::import_file(path, opts)?;
    tilec_ir::verify(&graph)?;
    Ok(graph)
}

/// Imports an already decoded model and verifies the resulting graph.
pub fn import(model: &tilec_onnx::proto::ModelProto, opts: &ImportOptions) -> Result<Graph, Error> {
    let graph = tilec_onnx::import_model(model, opts)?;
    tilec_ir::verify(&graph)?;
    Ok(graph)
}

/// Runs `graph` on inputs given by name; returns the graph outputs in order.
pub fn run(graph: &Graph, inputs: HashMap<String, Tensor>, backend: Backend) -> Result<Vec<Tensor>, Error> {
    match backend {
        Backend::Ref => Ok(tilec_ref::run_named(graph, inputs)?),
        Backend::Cpu => {
            let mut ordered = Vec::with_capacity(graph.inputs().len());
            let mut inputs = inputs;
            for &v in graph.inputs() {
                let name = &graph.value(v).name;
                let t = inputs
                    .remove(name)
                    .ok_or_else(|| Error::Compile(format!("input '{name}' is missing")))?;
                ordered.push(t);
            }
            let mut c = compiled::compile(graph, &compiled::CompileOptions::default())?;
            c.run(&ordered)
        }
    }
}
