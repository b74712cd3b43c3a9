//! The reference interpreter: executes a canonical [`Graph`] with simple, obviously
//! correct loops on every dtype. It is the oracle every later stage is tested against,
//! so clarity wins over speed everywhere except where a conformance model would take
//! minutes (convolution and matmul keep a cache-friendly loop order).
//!
//! Invariants: no I/O; no unsafe; every op checks its inputs and returns an error that
//! says what was expected instead of panicking.

mod eval;
pub mod kernels;

pub use eval::{eval_op, run, run_named, EvalCtx, RefError};
