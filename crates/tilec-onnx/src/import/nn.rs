//! ONNX mappings for this op family.

use super::{ImportError, MapFn, NodeCx};
use tilec_ir::ValueId;

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    let _ = op_type;
    None
}

#[allow(dead_code)]
fn _unused(_: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    Ok(vec![])
}
