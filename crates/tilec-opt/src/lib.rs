//! Graph optimization: the pass manager, graph passes (folding, DCE, CSE, algebraic
//! simplification, layout) and composite-op recognition.
//!
//! Invariants: passes edit graphs only through tilec-ir's editing API
//! (`replace_all_uses`, `cleanup`); every pass leaves a verifiable graph; every pass is
//! checked by differential execution on the reference interpreter (constant folding also
//! uses the interpreter to evaluate, so folded values are exactly what execution gives).

pub mod decoder;
pub mod manager;
pub mod partition;
pub mod passes;
pub mod recognize;
pub mod target;

pub use manager::{OptError, Pass};
