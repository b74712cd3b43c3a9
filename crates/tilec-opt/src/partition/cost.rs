//! Op classification and per-node cost estimates (element counts, bytes, FLOPs).

use std::collections::HashMap;
use tilec_ir::op::{
    IndexOp, LayoutOp, LinalgOp, NnOp, NormOp, QuantOp, ReduceOp, SourceOp, UnaryOp,
};
use tilec_ir::{Dim, Graph, Node, Op, SymbolId, ValueId};

/// How the partitioner treats an op.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// Generated inline by whoever reads it (fill, dim values, range, eye): never a group.
    Source,
    /// Pure re-indexing (reshape, transpose, slice, split, concat, expand, tile, pad).
    Layout,
    /// Elementwise math, including indirect loads (gather) and casts.
    Elementwise,
    Reduction,
    Normalization,
    Gemm,
    Conv,
    Pool,
    Attention,
    /// Ops with data-dependent shapes, subgraphs or irregular access: never fused.
    Opaque,
}

impl Class {
    /// Whether a node of this class anchors a kernel (elementwise work fuses around it).
    pub fn is_anchor(self) -> bool {
        matches!(
            self,
            Class::Reduction
                | Class::Normalization
                | Class::Gemm
                | Class::Conv
                | Class::Pool
                | Class::Attention
                | Class::Opaque
        )
    }
}

pub fn classify(op: &Op) -> Class {
    match op {
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } => Class::Elementwise,
        Op::Quant(QuantOp::DynamicQuantizeLinear) => Class::Reduction,
        Op::Quant(_) => Class::Elementwise,
        Op::Reduce(ReduceOp::TopK { .. }) => Class::Opaque,
        Op::Reduce(_) => Class::Reduction,
        Op::Norm(NormOp::BatchNorm { .. }) => Class::Elementwise,
        Op::Norm(NormOp::NllLoss { .. }) => Class::Reduction,
        Op::Norm(_) => Class::Normalization,
        Op::Linalg(l) => match l {
            LinalgOp::MatMul
            | LinalgOp::MatMulInteger
            | LinalgOp::QLinearMatMul
            | LinalgOp::Einsum { .. } => Class::Gemm,
            LinalgOp::Conv { .. }
            | LinalgOp::ConvInteger { .. }
            | LinalgOp::QLinearConv { .. }
            | LinalgOp::ConvTranspose { .. }
            | LinalgOp::DeformConv { .. } => Class::Conv,
            LinalgOp::Pool { .. } | LinalgOp::GlobalPool { .. } => Class::Pool,
            // A gather of column blocks back into the image (a sum over the block's taps).
            LinalgOp::Col2Im { .. } => Class::Elementwise,
            _ => Class::Opaque,
        },
        Op::Nn(n) => match n {
            NnOp::Attention { .. } | NnOp::LinearAttention { .. } => Class::Attention,
            NnOp::RotaryEmbedding { .. } | NnOp::SwiGlu { .. } => Class::Elementwise,
            NnOp::CausalConvWithState { .. } => Class::Conv,
            _ => Class::Opaque,
        },
        Op::Layout(l) => match l {
            LayoutOp::Trilu { .. } | LayoutOp::Resize(_) => Class::Elementwise,
            _ => Class::Layout,
        },
        Op::Index(i) => match i {
            IndexOp::Gather { .. }
            | IndexOp::GatherElements { .. }
            | IndexOp::GatherND { .. }
            | IndexOp::OneHot { .. } => Class::Elementwise,
            _ => Class::Opaque,
        },
        Op::Source(
            SourceOp::Fill { .. }
            | SourceOp::DimValues { .. }
            | SourceOp::Range { .. }
            | SourceOp::Eye { .. },
        ) => Class::Source,
        Op::Control(_) => Class::Opaque,
    }
}

/// Sizes of symbolic dimensions for costing: named free symbols take the given sizes,
/// the others `default`.
#[derive(Clone, Debug)]
pub struct SizeHints {
    pub named: HashMap<String, usize>,
    pub default: usize,
}

impl Default for SizeHints {
    fn default() -> Self {
        SizeHints {
            named: HashMap::new(),
            default: 64,
        }
    }
}

/// Concrete sizes of every value under the hints.
pub struct Sizes {
    bound: HashMap<SymbolId, usize>,
    pub dims: Vec<Vec<f64>>,
    pub elem_bytes: Vec<usize>,
}

impl Sizes {
    pub fn new(g: &Graph, hints: &SizeHints) -> Sizes {
        let mut bound = HashMap::new();
        for (i, s) in g.syms.symbols.iter().enumerate() {
            if s.expr.is_none() {
                bound.insert(
                    SymbolId(i as u32),
                    *hints.named.get(&s.name).unwrap_or(&hints.default),
                );
            }
        }
        let dim = |d: Dim| -> f64 { g.syms.eval(d, &bound).unwrap_or(hints.default) as f64 };
        let dims = g
            .values()
            .iter()
            .map(|v| v.ty.shape.iter().map(|&d| dim(d)).collect())
            .collect();
        let elem_bytes = g.values().iter().map(|v| v.ty.dtype.size_bytes()).collect();
        Sizes {
            bound,
            dims,
            elem_bytes,
        }
    }

    pub fn elems(&self, v: ValueId) -> f64 {
        self.dims[v.index()].iter().product()
    }

    pub fn bytes(&self, v: ValueId) -> f64 {
        self.elems(v) * self.elem_bytes[v.index()] as f64
    }

    pub fn dim(&self, v: ValueId, i: usize) -> f64 {
        self.dims[v.index()].get(i).copied().unwrap_or(1.0)
    }

    pub fn rank(&self, v: ValueId) -> usize {
        self.dims[v.index()].len()
    }

    pub fn bound(&self) -> &HashMap<SymbolId, usize> {
        &self.bound
    }
}

/// FLOPs per output element of an elementwise op (transcendentals count as several).
fn ew_cost(op: &Op) -> f64 {
    use UnaryOp as U;
    match op {
        Op::Unary(u) => match u {
            U::Abs
            | U::Neg
            | U::Relu
            | U::Not
            | U::BitwiseNot
            | U::Sign
            | U::Floor
            | U::Ceil
            | U::Round => 1.0,
            U::IsNaN
            | U::IsInf { .. }
            | U::BitCast { .. }
            | U::LeakyRelu { .. }
            | U::ThresholdedRelu { .. } => 1.0,
            U::HardSigmoid { .. } | U::HardSwish | U::Shrink { .. } | U::Reciprocal => 2.0,
            U::Gelu { .. } | U::Mish => 14.0,
            _ => 8.0,
        },
        Op::Binary(b) => match b {
            tilec_ir::op::BinaryOp::Div | tilec_ir::op::BinaryOp::Mod { .. } => 4.0,
            tilec_ir::op::BinaryOp::Pow => 10.0,
            _ => 1.0,
        },
        Op::Nn(NnOp::SwiGlu { .. }) => 10.0,
        Op::Nn(NnOp::RotaryEmbedding { .. }) => 3.0,
        Op::Norm(NormOp::BatchNorm { .. }) => 2.0,
        Op::Quant(_) => 3.0,
        Op::Layout(LayoutOp::Resize(_)) => 8.0,
        Op::Where | Op::Cast { .. } => 1.0,
        _ => 0.0,
    }
}

/// Estimated FLOPs of one node.
pub fn node_flops(g: &Graph, n: &Node, s: &Sizes) -> f64 {
    let out = match n.outputs.first() {
        Some(&o) => s.elems(o),
        None => return 0.0,
    };
    let inp = |i: usize| n.inputs.get(i).map(|&v| s.elems(v)).unwrap_or(0.0);
    match &n.op {
        Op::Linalg(LinalgOp::MatMul | LinalgOp::MatMulInteger | LinalgOp::QLinearMatMul) => {
            // [.., M, K] x [.., K, N]: 2*K per output element.
            let a = n.inputs[0];
            let k = if s.rank(a) == 0 {
                1.0
            } else {
                s.dim(a, s.rank(a) - 1)
            };
            2.0 * k * out
        }
        Op::Linalg(LinalgOp::Einsum { .. }) => 2.0 * inp(0).max(inp(1)).max(out),
        Op::Linalg(
            LinalgOp::Conv { group, .. }
            | LinalgOp::ConvInteger { group, .. }
            | LinalgOp::QLinearConv { group, .. },
        ) => {
            // Weight [Cout, Cin/group, k...]: each output does Cin/group * prod(k) MACs.
            let wi = if matches!(n.op, Op::Linalg(LinalgOp::QLinearConv { .. })) {
                3
            } else {
                1
            };
            let w = n.inputs.get(wi).copied();
            let per = w.map(|w| s.elems(w) / s.dim(w, 0).max(1.0)).unwrap_or(1.0);
            let _ = group;
            2.0 * per * out
        }
        Op::Linalg(LinalgOp::ConvTranspose { .. } | LinalgOp::DeformConv { .. }) => {
            let w = n.inputs.get(1).map(|&w| s.elems(w)).unwrap_or(1.0);
            2.0 * w * inp(0) / s.dim(n.inputs[0], 1).max(1.0)
        }
        Op::Linalg(LinalgOp::Pool { window, .. }) => {
            out * window.kernel.iter().product::<usize>() as f64
        }
        Op::Linalg(LinalgOp::GlobalPool { .. }) => inp(0),
        Op::Nn(NnOp::Attention { .. } | NnOp::LinearAttention { .. }) => {
            // q [B, Hq, Sq, D], k [B, Hkv, Skv, D] (or rank 3 with heads folded).
            let (q, k) = (n.inputs[0], n.inputs[1]);
            let r = s.rank(q);
            let skv = s.dim(k, r - 2);
            let scores = s.elems(q) / s.dim(q, r - 1).max(1.0) * skv;
            let d = s.dim(q, r - 1);
            4.0 * scores * d + 5.0 * scores
        }
        Op::Nn(NnOp::CausalConvWithState { .. }) => {
            2.0 * inp(0) * s.dim(n.inputs[1], s.rank(n.inputs[1]).saturating_sub(1))
        }
        Op::Reduce(_) => inp(0).max(out),
        Op::Norm(NormOp::Softmax { .. } | NormOp::LogSoftmax { .. }) => 5.0 * out,
        Op::Norm(
            NormOp::LayerNorm { .. } | NormOp::GroupNorm { .. } | NormOp::InstanceNorm { .. },
        ) => 8.0 * out,
        Op::Norm(NormOp::RmsNorm { .. }) => 5.0 * out,
        Op::Norm(NormOp::Lrn { size, .. }) => (*size as f64 + 10.0) * out,
        Op::Norm(_) => 5.0 * inp(0).max(out),
        _ => {
            let _ = g;
            ew_cost(&n.op) * out
        }
    }
}

/// Elements of the row a reduction/normalization holds at once (for the scratch budget).
pub fn reduction_row(n: &Node, s: &Sizes) -> f64 {
    let x = match n.inputs.first() {
        Some(&x) => x,
        None => return 0.0,
    };
    let r = s.rank(x);
    let prod = |from: usize, to: usize| (from..to).map(|i| s.dim(x, i)).product::<f64>();
    match &n.op {
        Op::Norm(NormOp::LayerNorm { axis, .. } | NormOp::RmsNorm { axis, .. }) => prod(*axis, r),
        Op::Norm(
            NormOp::Softmax { axis } | NormOp::LogSoftmax { axis } | NormOp::Hardmax { axis },
        ) => s.dim(x, *axis),
        Op::Norm(NormOp::InstanceNorm { .. } | NormOp::GroupNorm { .. }) => prod(2.min(r), r),
        Op::Reduce(ReduceOp::Reduce { axes, .. }) => {
            if axes.is_empty() {
                s.elems(x)
            } else {
                axes.iter().map(|&a| s.dim(x, a)).product()
            }
        }
        Op::Reduce(
            ReduceOp::ArgMax { axis, .. }
            | ReduceOp::ArgMin { axis, .. }
            | ReduceOp::Scan { axis, .. },
        ) => s.dim(x, *axis),
        Op::Linalg(LinalgOp::GlobalPool { .. }) => prod(2.min(r), r),
        Op::Linalg(LinalgOp::Pool { window, .. }) => window.kernel.iter().product::<usize>() as f64,
        _ => 0.0,
    }
}
