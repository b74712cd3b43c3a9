//! ONNX import: protobuf decoding (with external data), element-type and tensor
//! conversion, and the mapping of ONNX operators onto tilec's canonical op set.
//!
//! Invariants: the only I/O is reading the model file and its external data files
//! (never outside the model's directory); everything a user controls yields an
//! [`ImportError`] naming the node, op type and opset, never a panic.

pub mod import;
pub mod load;
pub mod proto;
pub mod tensor;

pub use import::{import_model, ImportError, ImportOptions};
pub use load::{decode_model, load_model, LoadError};

/// Loads and imports a model file.
pub fn import_file(path: &std::path::Path, opts: &ImportOptions) -> Result<tilec_ir::Graph, ImportError> {
    let model = load_model(path)?;
    import_model(&model, opts)
}
