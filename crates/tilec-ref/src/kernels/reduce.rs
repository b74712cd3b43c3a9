//! reduce kernels.

use crate::EvalCtx;
use tilec_ir::op::ReduceOp;
use tilec_ir::Tensor;

pub fn eval(op: &ReduceOp, _args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    Err(format!("{op:?} not implemented"))
}
