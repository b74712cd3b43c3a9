//! Normalizations: softmax family, layer/RMS/batch/instance/group norms.

use super::{expect_arity, InferCtx, OpInfo};
use crate::TensorType;

#[derive(Clone, Debug, PartialEq)]
pub enum NormOp {
    /// Softmax over one axis (opset-13 semantics; older coerced-2D forms are rewritten by
    /// the importer).
    Softmax { axis: usize },
}

impl OpInfo for NormOp {
    fn name(&self) -> &'static str {
        match self {
            NormOp::Softmax { .. } => "softmax",
        }
    }

    fn infer(&self, inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            NormOp::Softmax { axis } => {
                expect_arity(inputs, 1)?;
                if *axis >= inputs[0].rank() {
                    return Err(format!("axis {axis} out of range for rank {}", inputs[0].rank()));
                }
                Ok(vec![inputs[0].clone()])
            }
        }
    }
}
