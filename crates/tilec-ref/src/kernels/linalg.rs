//! linalg kernels.

use crate::EvalCtx;
use tilec_ir::op::LinalgOp;
use tilec_ir::Tensor;

pub fn eval(op: &LinalgOp, _args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    Err(format!("{op:?} not implemented"))
}
