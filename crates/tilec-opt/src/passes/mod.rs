//! Graph passes. Each pass edits the graph only through tilec-ir's editing API (new nodes
//! and constants, `replace_all_uses`) and ends with `cleanup`, so it leaves a verified,
//! topologically ordered, densely numbered graph behind.

mod cse;
mod dce;
mod einsum_matmul;
mod fold_batchnorm;
mod fold_constants;
pub mod layout;
mod merge_products;
mod precision;
mod simplify;
mod slice_updates;
mod split_resizes;
mod unit_views;
mod unshare_views;

pub use cse::Cse;
pub use dce::Dce;
pub use einsum_matmul::EinsumToMatmul;
pub use fold_batchnorm::FoldBatchNorm;
pub use fold_constants::FoldConstants;
pub use merge_products::MergeProducts;
pub use layout::{ChooseLayout, PadThinChannels, PadThinConvs, SinkTransposes, TargetKind};
pub use precision::convert_precision;
pub use simplify::Simplify;
pub use split_resizes::SplitResizes;
pub use unshare_views::UnshareConstantViews;

use crate::OptError;
use tilec_ir::{Graph, IrError};

/// Wraps an IR error with the pass name.
pub(crate) fn ir(pass: &'static str) -> impl Fn(IrError) -> OptError {
    move |source| OptError::Ir { pass, source }
}

/// Ends a pass: runs `cleanup` when something changed.
pub(crate) fn finish(g: &mut Graph, pass: &'static str, changed: bool) -> Result<bool, OptError> {
    if changed {
        g.cleanup().map_err(ir(pass))?;
    }
    Ok(changed)
}
