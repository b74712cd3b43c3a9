//! A differential fuzzer of the compiled CPU path: random small graphs ([`gen`]) compiled and
//! run on fresh inputs, compared with the reference interpreter ([`check`]). Shared by the
//! seeded test (`tests/fuzz_compiled.rs`), the regression tests (`tests/fuzz_regressions.rs`)
//! and the long-running driver (`examples/fuzz_compiled.rs`).

#![allow(dead_code)]

pub mod check;
pub mod gen;
mod ops;
