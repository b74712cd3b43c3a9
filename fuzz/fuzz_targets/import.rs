//! Arbitrary bytes as an ONNX model: decode, import, and for models that import, verify
//! the graph (a failure there is an importer bug) and run the reference interpreter on
//! zero inputs with every free symbolic dimension set to 1. Errors are expected; panics,
//! aborts, timeouts and runaway memory are the findings.
//!
//! Models with a tensor (initializer, Constant, input or any statically sized value) of
//! more than `MAX_ELEMENTS` elements are skipped to keep memory bounded.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use tilec_ir::{Graph, Tensor, TensorType};
use tilec_onnx::proto::{GraphProto, TensorProto};
use tilec_onnx::ImportOptions;

const MAX_ELEMENTS: u128 = 1_000_000;

fn proto_elements(t: &TensorProto) -> u128 {
    t.dims.iter().fold(1u128, |a, &d| a.saturating_mul(d.unsigned_abs() as u128))
}

/// Whether any tensor literally stored in the graph is too large.
fn proto_too_big(g: &GraphProto) -> bool {
    g.initializer.iter().any(|t| proto_elements(t) > MAX_ELEMENTS)
        || g.node.iter().any(|n| {
            n.attribute.iter().any(|a| {
                a.t.as_ref().is_some_and(|t| proto_elements(t) > MAX_ELEMENTS)
                    || a.tensors.iter().any(|t| proto_elements(t) > MAX_ELEMENTS)
                    || a.g.as_ref().is_some_and(proto_too_big)
                    || a.graphs.iter().any(proto_too_big)
            })
        })
}

/// The shape of a type with free symbols bound as in `bound`, if it evaluates.
fn concrete(g: &Graph, ty: &TensorType, bound: &HashMap<tilec_ir::SymbolId, usize>) -> Option<Vec<usize>> {
    ty.shape.iter().map(|&d| g.syms.eval(d, bound)).collect()
}

fn elements(shape: &[usize]) -> u128 {
    shape.iter().fold(1u128, |a, &d| a.saturating_mul(d as u128))
}

fuzz_target!(|data: &[u8]| {
    let Ok(model) = tilec_onnx::decode_model(data) else { return };
    let Some(gp) = model.graph.as_ref() else { return };
    if proto_too_big(gp) {
        return;
    }
    let Ok(g) = tilec_onnx::import_model(&model, &ImportOptions::default()) else { return };
    if let Err(e) = tilec_ir::verify(&g) {
        panic!("an imported graph does not verify: {e}");
    }

    // Every free symbol is 1.
    let mut bound = HashMap::new();
    for (i, s) in g.syms.symbols.iter().enumerate() {
        if s.expr.is_none() {
            bound.insert(tilec_ir::SymbolId(i as u32), 1usize);
        }
    }
    for v in g.values() {
        if let Some(shape) = concrete(&g, &v.ty, &bound) {
            if elements(&shape) > MAX_ELEMENTS {
                return;
            }
        }
    }
    let mut inputs = Vec::new();
    for &v in g.inputs() {
        let ty = &g.value(v).ty;
        let Some(shape) = concrete(&g, ty, &bound) else { return };
        inputs.push(Tensor::zeros(ty.dtype, shape));
    }
    let _ = tilec_ref::run(&g, inputs);
    // The printer must cope with whatever the importer built.
    let _ = tilec_ir::print_graph(&g);
});
