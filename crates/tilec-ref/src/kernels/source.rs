//! source kernels.

use crate::EvalCtx;
use tilec_ir::op::SourceOp;
use tilec_ir::Tensor;

pub fn eval(op: &SourceOp, _args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    Err(format!("{op:?} not implemented"))
}
