//! Layout passes: `sink-transposes` (move transposes through ops that commute with axis
//! permutations so they cancel, merge or shrink) and `choose-layout` (NCHW vs NHWC per
//! convolution region and target).

mod choose;
mod sink;

pub use crate::partition::TargetKind;
pub use choose::{apply_plan, plan_layout, ChooseLayout, Layout, LayoutPlan, LayoutRegion};
pub use sink::{count_transposes, inverse, reduced_perm, transpose_of, SinkTransposes};
