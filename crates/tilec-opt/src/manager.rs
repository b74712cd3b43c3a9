//! The pass trait and the pass manager.

use tilec_ir::{Graph, IrError};

#[derive(Debug, thiserror::Error)]
pub enum OptError {
    #[error("pass '{pass}': {source}")]
    Ir { pass: &'static str, source: IrError },
    #[error("pass '{pass}': {msg}")]
    Pass { pass: &'static str, msg: String },
}

/// A graph-to-graph transformation.
pub trait Pass {
    /// A short kebab-case name, used by `--print-ir-after=NAME`.
    fn name(&self) -> &'static str;
    /// Rewrites the graph in place; returns whether anything changed.
    fn run(&self, g: &mut Graph) -> Result<bool, OptError>;
}
