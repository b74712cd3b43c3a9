//! Composite-op recognition: rewrites what exporters spell out in primitives into the
//! canonical composite ops (GELU, SiLU/Swish, SwiGLU, GroupNorm, LayerNorm, RMSNorm,
//! Softmax, scaled-dot-product attention), one pass per composite.
//!
//! Matching is conservative: constants must match within a small tolerance, reductions
//! must be over the trailing axes with `keepdims`, and every consumed intermediate must
//! have no reader outside the matched subgraph (see [`pattern`]).
//!
//! Linear (`MatMul` + bias `Add`) is deliberately not recognized: the IR has no canonical
//! Linear op, and the partitioner fuses the bias add into the matmul as an epilogue, so a
//! rewrite here would only add an op every later stage has to know about.

pub mod act;
pub mod attention;
pub mod mask;
pub mod norm;
pub mod pattern;

use pattern::RecognizePass;

/// The recognition passes, in the order they should run: Softmax before attention (which
/// matches on the canonical Softmax), SiLU before SwiGLU, LayerNorm before
/// RMSNorm (a layer norm's tail is an RMS norm of the centered input).
pub fn passes() -> Vec<Box<dyn crate::Pass>> {
    let p = |name, rec| Box::new(RecognizePass { name, rec }) as Box<dyn crate::Pass>;
    vec![
        p("recognize-gelu", act::gelu),
        p("recognize-silu", act::silu),
        p("recognize-swiglu", act::swiglu),
        p("recognize-groupnorm", norm::group_norm),
        p("recognize-layernorm", norm::layer_norm),
        p("recognize-rmsnorm", norm::rms_norm),
        p("recognize-softmax", norm::softmax),
        p("recognize-attention", attention::attention),
    ]
}

/// Runs every recognition pass once; returns whether anything changed.
pub fn run_all(g: &mut tilec_ir::Graph) -> Result<bool, crate::OptError> {
    let mut changed = false;
    for p in passes() {
        changed |= p.run(g)?;
    }
    Ok(changed)
}
