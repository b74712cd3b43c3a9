//! Source ops: values produced from attributes and shapes rather than data.

use super::{InferCtx, OpInfo};
use crate::{Dim, Tensor, TensorType};

#[derive(Clone, Debug, PartialEq)]
pub enum SourceOp {
    /// A tensor of `shape` filled with `value` (a one-element tensor whose dtype is the
    /// output dtype). Kept as an op so that large splats are not materialized as constants.
    Fill { shape: Vec<Dim>, value: Tensor },
}

impl OpInfo for SourceOp {
    fn name(&self) -> &'static str {
        match self {
            SourceOp::Fill { .. } => "fill",
        }
    }

    fn infer(&self, inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            SourceOp::Fill { shape, value } => {
                if value.numel() != 1 {
                    return Err(format!("fill value must have one element, has {}", value.numel()));
                }
                if !inputs.is_empty() {
                    return Err(format!("expected no inputs, got {}", inputs.len()));
                }
                Ok(vec![TensorType::new(value.dtype(), shape.clone())])
            }
        }
    }
}
