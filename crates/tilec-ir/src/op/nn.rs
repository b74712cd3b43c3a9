//! Higher-level neural-network ops: attention, rotary embeddings, recurrent cells,
//! sampling and signal processing.

use super::{InferCtx, OpInfo};
use crate::TensorType;

#[derive(Clone, Debug, PartialEq)]
pub enum NnOp {
    /// Placeholder variant so the family is never empty; never produced by the importer.
    Reserved,
}

impl OpInfo for NnOp {
    fn name(&self) -> &'static str {
        match self {
            NnOp::Reserved => "reserved",
        }
    }

    fn infer(&self, _inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        Err("reserved op".into())
    }
}
