//! Indexing ops: gathers, scatters and data-dependent selections.

use super::{expect_arity, norm_axis, InferCtx, OpInfo};
use crate::TensorType;

#[derive(Clone, Debug, PartialEq)]
pub enum IndexOp {
    /// `numpy.take(data, indices, axis)`; negative indices count from the end.
    Gather { axis: usize },
}

impl OpInfo for IndexOp {
    fn name(&self) -> &'static str {
        match self {
            IndexOp::Gather { .. } => "gather",
        }
    }

    fn infer(&self, inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            IndexOp::Gather { axis } => {
                expect_arity(inputs, 2)?;
                let (d, i) = (inputs[0], inputs[1]);
                let axis = norm_axis(*axis as i64, d.rank())?;
                if !i.dtype.is_int() {
                    return Err(format!("indices must be integers, got {}", i.dtype));
                }
                let mut shape = d.shape[..axis].to_vec();
                shape.extend_from_slice(&i.shape);
                shape.extend_from_slice(&d.shape[axis + 1..]);
                Ok(vec![TensorType::new(d.dtype, shape)])
            }
        }
    }
}
