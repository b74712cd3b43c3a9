//! Run-time support shared by the back ends: the memory planner (value lifetimes over the
//! kernel order become offsets in one arena), the arena itself, and profiling records.
//!
//! - [`plan`] assigns every buffer an offset in one arena so that buffers alive at the same
//!   step never overlap, reusing the memory of dead buffers and honouring in-place hints;
//!   [`check`] verifies a plan independently.
//! - [`Arena`] is the owned, 64-byte aligned, zeroed allocation a plan is laid out in.
//! - [`Profile`] collects per-kernel timings and renders them as a table or JSON.
//! - [`trace`] turns a profile into a Chrome trace, a time-by-kind summary and a roofline.
//! - [`cache`] is the verified on-disk cache of compiled kernels both back ends use.

mod arena;
pub mod cache;
mod plan;
mod profile;
pub mod trace;

pub use arena::{Arena, ArenaError, ARENA_ALIGN};
pub use plan::{check, plan, BufferReq, MemoryPlan};
pub use profile::{KernelProfile, Profile, ProfileRow};
