//! index kernels.

use crate::EvalCtx;
use tilec_ir::op::IndexOp;
use tilec_ir::Tensor;

pub fn eval(op: &IndexOp, _args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    Err(format!("{op:?} not implemented"))
}
