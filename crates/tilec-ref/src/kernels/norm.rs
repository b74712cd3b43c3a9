//! norm kernels.

use crate::EvalCtx;
use tilec_ir::op::NormOp;
use tilec_ir::Tensor;

pub fn eval(op: &NormOp, _args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    Err(format!("{op:?} not implemented"))
}
