//! nn kernels.

use crate::EvalCtx;
use tilec_ir::op::NnOp;
use tilec_ir::Tensor;

pub fn eval(op: &NnOp, _args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    Err(format!("{op:?} not implemented"))
}
