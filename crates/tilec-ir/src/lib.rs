//! tilec's graph IR: element types, (symbolic) shapes, host tensors, the typed op set and
//! the SSA [`Graph`] with its verifier and printer.
//!
//! Invariants: this crate does no I/O and knows nothing of ONNX. Attributes are typed;
//! graphs are plain data (arenas + `u32` ids), cheap to clone and compare.

pub mod dtype;
pub mod edit;
pub mod fp8;
pub mod graph;
pub mod op;
pub mod print;
pub mod shape;
pub mod size;
pub mod tensor;
pub mod verify;

pub use dtype::DType;
pub use edit::Uses;
pub use fp8::{F8E4M3, F8E5M2};
pub use graph::{Graph, IrError, Node, NodeId, Value, ValueDef, ValueId};
pub use op::Op;
pub use print::print_graph;
pub use size::SizeError;
pub use shape::{Dim, ShapeFmt, SymExpr, Symbol, SymbolId, SymbolTable, TensorType};
pub use tensor::{strides, with_dtype_fn, DTypeFn, Element, Tensor, TensorData, TensorSizeError};
pub use verify::verify;
