//! layout kernels.

use crate::EvalCtx;
use tilec_ir::op::LayoutOp;
use tilec_ir::Tensor;

pub fn eval(op: &LayoutOp, _args: &[&Tensor], _cx: &EvalCtx) -> Result<Vec<Tensor>, String> {
    Err(format!("{op:?} not implemented"))
}
