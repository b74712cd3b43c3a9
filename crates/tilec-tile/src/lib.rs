//! The loop/tile IR: a kernel is a loop nest over an index space with explicit buffers in memory
//! scopes, index expressions, loads, stores, scalar accumulators and barriers. Kernel groups from
//! the partitioner are lowered into it (`lower`), schedule primitives rewrite it (`schedule`), and
//! back ends render it (`tilec-cpu` to C).
//!
//! Shapes here are concrete: a model is specialized to the sizes of its symbolic dimensions
//! before lowering, so every extent and stride is a constant the C compiler can see.

pub mod ir;
pub mod affine;
pub mod cexpr;
pub mod family;
pub mod indirect;
pub mod interp;
pub mod lower;
pub mod print;
pub mod schedule;

pub use ir::*;
