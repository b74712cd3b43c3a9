//! Kernels by op family, plus the helpers they share (broadcast indexing, axis walks).

pub mod control;
pub mod elementwise;
pub mod index;
pub mod layout;
pub mod linalg;
pub mod nn;
pub mod norm;
pub mod paged;
pub mod reduce;
pub mod source;
pub mod util;
