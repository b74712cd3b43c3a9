//! Layout passes: `sink-transposes` (move transposes through ops that commute with axis
//! permutations so they cancel, merge or shrink) and `choose-layout` (NCHW vs NHWC per
//! convolution region and target), `pad-thin-convs` (explicit padding in front of
//! channels-last convolutions over few channels, for the CPU) and `pad-thin-channels` (such
//! convolutions' channels padded to whole 8- or 16-byte pixels, for CUDA).

mod channels;
mod choose;
mod pad;
mod seq;
mod sink;

pub use crate::partition::TargetKind;
pub use choose::{apply_plan, plan_layout, ChooseLayout, Layout, LayoutPlan, LayoutRegion};
pub use channels::{padded_channels, PadThinChannels};
pub use pad::{PadThinConvs, MAX_CHANNELS as THIN_CONV_CHANNELS};
pub use sink::{count_transposes, inverse, reduced_perm, transpose_of, SinkTransposes};
