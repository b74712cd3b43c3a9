//! Anchors: the nodes that set a kernel's loop structure.
//!
//! * Row kernels (`reduce.rs`, `norm.rs`, global pools in `pool.rs`, `loss.rs`): a loop nest
//!   over the dimensions outside the row, then passes over the row with accumulators;
//!   statistics feed the next pass, and the last pass (normalizations) or the accumulator
//!   itself (reductions) is the anchor's element. Row normalizations are data
//!   ([`norm::RowOp`]): their statistics and the map of an element, lowered by one function.
//! * Direct kernels (pools and LRN, cumulative sums, einsum, integer matmul, small-K and
//!   transposed convolutions): a loop nest over the output with inner reduction loops.
//! * GEMM kernels (`matmul.rs`, `conv.rs`, `winograd.rs`): one [`Stmt::Gemm`] whose
//!   operands are expressions (an implicit im2col for convolutions) and whose epilogue is the
//!   group's.
//! * Attention (`attention.rs`, `attention_gemm.rs`): per (batch, head, query row), a scores
//!   row in a local buffer, softmax, and the weighted sum of values into a local output row;
//!   or two products around a row softmax; or (`attention_flash.rs`) per block of queries a
//!   loop over blocks of keys with an online softmax.
//!
//! [`entry`] is the one table of anchor ops: adding one is an entry there and its lowering in
//! the module of its family.

mod attention;
mod attention_flash;
mod attention_gemm;
mod common;
mod conv;
pub mod conv_transpose;
pub mod depthwise;
pub mod group_direct;
mod loss;
mod matmul;
mod norm;
mod pool;
mod reduce;
mod winograd;

pub(crate) use attention::attention_present;

use tilec_ir::op::{IndexOp, LinalgOp, LossReduction, NnOp, NormOp, ReduceOp};
use tilec_ir::{NodeId, Op};

use super::{Fail, Kind, Lowerer, R};
use crate::ir::Stmt;

/// The loop nest of anchor `n` (whose op is the entry's), its epilogues included.
type LowerFn = fn(&mut Lowerer, NodeId, &Op) -> R<Vec<Stmt>>;

/// How an anchor op is lowered.
pub(crate) struct Anchor {
    lower: LowerFn,
    /// Why a node whose first input is not a float cannot be lowered (`None`: any dtype).
    float_only: Option<&'static str>,
    /// Outputs computed inline, element by element, rather than by the nest (attention's
    /// present key and value, which `expr.rs` builds through [`attention_present`]).
    inline_outputs: &'static [usize],
}

/// What the table says of an op.
pub(crate) enum Entry {
    /// An expression per element (`expr.rs`).
    Inline,
    Anchor(Anchor),
    /// Not lowered, for this reason (`None`: "`op` is not lowered").
    No(Option<&'static str>),
}

const fn anchor(lower: LowerFn) -> Entry {
    Entry::Anchor(Anchor { lower, float_only: None, inline_outputs: &[] })
}

const fn float_anchor(lower: LowerFn, why: &'static str) -> Entry {
    Entry::Anchor(Anchor { lower, float_only: Some(why), inline_outputs: &[] })
}

/// The anchor ops and their lowerings; every other op is inline (or not lowered).
pub(crate) fn entry(op: &Op) -> Entry {
    const NON_FLOAT_NORM: &str = "normalization of a non-float tensor";
    const INT_CONV: &str = "integer convolution";
    match op {
        Op::Reduce(ReduceOp::Reduce { .. }) => anchor(reduce::reduce),
        Op::Reduce(ReduceOp::ArgMax { .. } | ReduceOp::ArgMin { .. }) => anchor(reduce::arg_reduce),
        Op::Reduce(ReduceOp::Scan { .. }) => anchor(reduce::scan),
        Op::Reduce(ReduceOp::TopK { .. }) => Entry::No(Some("top-k is not lowered")),
        Op::Norm(NormOp::BatchNorm { .. }) => Entry::Inline,
        Op::Norm(NormOp::NllLoss { reduction: LossReduction::None, .. }) => Entry::Inline,
        Op::Norm(NormOp::NllLoss { .. }) => anchor(loss::nll_loss),
        Op::Norm(NormOp::Hardmax { .. }) => anchor(norm::lower),
        Op::Norm(NormOp::Lrn { .. }) => float_anchor(pool::lrn, NON_FLOAT_NORM),
        Op::Norm(_) => float_anchor(norm::lower, NON_FLOAT_NORM),
        Op::Linalg(LinalgOp::MatMul) => anchor(matmul::matmul),
        Op::Linalg(LinalgOp::Einsum { .. }) => anchor(matmul::einsum),
        Op::Linalg(LinalgOp::Conv { .. }) => float_anchor(conv::conv, INT_CONV),
        Op::Linalg(LinalgOp::ConvTranspose { .. }) => float_anchor(conv::conv_transpose, INT_CONV),
        Op::Linalg(LinalgOp::Pool { .. }) => anchor(pool::pool),
        Op::Linalg(LinalgOp::GlobalPool { .. }) => anchor(pool::global_pool),
        Op::Linalg(LinalgOp::Col2Im { .. }) => Entry::Inline,
        Op::Linalg(_) => Entry::No(None),
        Op::Nn(NnOp::Attention { .. }) => Entry::Anchor(Anchor {
            lower: attention::attention,
            float_only: Some("integer attention"),
            inline_outputs: &[1, 2],
        }),
        Op::Nn(NnOp::RotaryEmbedding { .. } | NnOp::SwiGlu { .. }) => Entry::Inline,
        Op::Nn(_) => Entry::No(None),
        Op::Control(_) => Entry::No(Some("control flow is not lowered")),
        _ => Entry::Inline,
    }
}

pub(crate) fn kind_of(op: &Op) -> Kind {
    match entry(op) {
        Entry::Inline => Kind::Inline,
        // Ops that are not lowered never get past `check`.
        Entry::Anchor(_) | Entry::No(_) => Kind::Anchor,
    }
}

/// Whether output `index` of an anchor is computed inline.
pub(crate) fn inline_output(op: &Op, index: usize) -> bool {
    matches!(entry(op), Entry::Anchor(a) if a.inline_outputs.contains(&index))
}

/// Whether node `n` can be lowered (attributes included).
pub(crate) fn check(l: &Lowerer, n: NodeId) -> R<()> {
    let node = l.node(n);
    let bad = |why: String| Err(Fail::Unsupported(n, why));
    match entry(&node.op) {
        Entry::Anchor(a) => match a.float_only {
            Some(why) if !l.dtype(node.inputs[0]).is_float() => bad(why.into()),
            _ => Ok(()),
        },
        Entry::No(why) => bad(why.map_or_else(|| format!("{} is not lowered", node.op.name()), String::from)),
        Entry::Inline => match &node.op {
            Op::Index(
                IndexOp::Gather { .. }
                | IndexOp::GatherElements { .. }
                | IndexOp::GatherND { .. }
                | IndexOp::OneHot { .. },
            ) => Ok(()),
            Op::Index(_) => bad(format!("{} has data-dependent writes or shapes", node.op.name())),
            Op::Norm(_) | Op::Nn(_) => Ok(()),
            _ => super::expr::check_inline(l, n),
        },
    }
}

/// The loop nest of anchor `n`.
pub(crate) fn lower(l: &mut Lowerer, n: NodeId) -> R<Vec<Stmt>> {
    let op = l.node(n).op.clone();
    match entry(&op) {
        Entry::Anchor(a) => (a.lower)(l, n, &op),
        _ => l.unsupported(n, "not an anchor"),
    }
}
