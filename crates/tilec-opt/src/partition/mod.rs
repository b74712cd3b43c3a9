//! Fusion partitioner: splits a graph into kernel groups, driven by a roofline cost
//! model of a [`Target`], and explains its decisions.
//!
//! Every node except sources (fill, dim values, range, eye: generated inline by their
//! readers) lands in exactly one [`KernelGroup`]. Groups start as single nodes and are
//! merged, to a fixpoint, by these rules (each checked for legality and priced by the
//! cost model; refusals are recorded in [`Partition::rejected`] with their numbers):
//!
//! 1. Re-indexing ops (reshape, transpose, slice, split, concat, expand, pad, tile) fold
//!    as index arithmetic into their only consumer group, else into their producer group;
//!    they form a group of their own only when neither is possible.
//! 2. Anchors (GEMM, conv, attention, reductions, normalizations, pools) absorb elementwise
//!    epilogues whose iteration space is no larger than the anchor's output, up to the
//!    target's epilogue budget (`max_epilogue_ops`).
//! 3. Anchors absorb elementwise prologues: reductions when the row still fits on-chip
//!    scratch, GEMM/conv/attention when the prologue's recomputation (once per output
//!    tile that re-reads the operand) costs less time than the bytes it saves.
//! 4. Elementwise groups fuse producer into consumer; a broadcast producer is recomputed
//!    per consumer element only when that is cheaper than materializing it.
//! 5. GEMMs reading the same activation with constant weights fuse horizontally
//!    (one kernel over the concatenated weights).
//!
//! No merge may create a cycle between groups (checked by reachability), and a producer
//! is never copied: a node belongs to one group, so a fused producer whose value is also
//! read elsewhere is written by the fused kernel (multi-output), which is only allowed
//! where the kernel visits each of its elements once.
//!
//! Nor may a merge exceed the expression budget (`MAX_INLINE_DEPTH` nested ops,
//! `MAX_INLINE_TREE` op instances once every value read twice is expanded twice): lowering
//! builds one expression per output element by walking producers back to the group's
//! inputs, so a long chain would be lowered, simplified and compiled as one huge
//! expression. Past the budget the chain is cut into kernels that materialize the value
//! between them, which keeps every later walk shallow and the C compiler's time linear.

pub mod cost;
mod explain;

pub use cost::{Class, SizeHints};
pub use explain::{explain, explain_group};
pub use crate::target::{intensity, Target, TargetKind};
/// The target description (kept here too: the cost model is its first reader).
pub use crate::target;

use cost::{classify, node_flops, reduction_row, Sizes};
use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use tilec_ir::op::{LayoutOp, LinalgOp, NormOp};
use tilec_ir::{Graph, NodeId, Op, Uses, ValueDef, ValueId};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    Elementwise,
    Reduction,
    Normalization,
    Gemm,
    Conv,
    Pool,
    Attention,
    /// Re-indexing that must materialize.
    Layout,
    Opaque,
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The kind of kernel a node of class `c` anchors (or, for non-anchors, joins).
pub fn kind_of(c: Class) -> GroupKind {
    match c {
        Class::Reduction => GroupKind::Reduction,
        Class::Normalization => GroupKind::Normalization,
        Class::Gemm => GroupKind::Gemm,
        Class::Conv => GroupKind::Conv,
        Class::Pool => GroupKind::Pool,
        Class::Attention => GroupKind::Attention,
        Class::Opaque => GroupKind::Opaque,
        Class::Layout => GroupKind::Layout,
        Class::Elementwise | Class::Source => GroupKind::Elementwise,
    }
}

/// One kernel.
#[derive(Clone, Debug)]
pub struct KernelGroup {
    pub id: usize,
    pub kind: GroupKind,
    /// Nodes in topological order.
    pub nodes: Vec<NodeId>,
    /// The node that sets the kernel's schedule (GEMM, reduction, ...); `None` for pure
    /// elementwise or layout groups.
    pub anchor: Option<NodeId>,
    /// Further anchors fused horizontally with `anchor` (GEMMs sharing an operand).
    pub siblings: Vec<NodeId>,
    /// Values read from outside the group (graph inputs, constants, other groups).
    pub inputs: Vec<ValueId>,
    /// Values written for readers outside the group or as graph outputs.
    pub outputs: Vec<ValueId>,
    /// Estimated bytes moved to and from main memory.
    pub bytes: f64,
    pub flops: f64,
    /// Peak FLOP/s the group runs at on the target.
    pub peak: f64,
    /// Roofline time estimate, seconds.
    pub time_s: f64,
    /// Why a layout group materializes.
    pub note: Option<String>,
}

/// Why a fusion was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectReason {
    /// Merging would make the group graph cyclic.
    Cycle,
    /// The producer is an anchor (heavy work) read by several groups, or two anchors.
    HeavyProducer,
    /// Recomputing the producer costs more than the bytes it saves.
    Recompute,
    /// The producer's value is also read elsewhere and the consumer cannot write it.
    Escapes,
    /// Epilogue/prologue chain longer than the register budget.
    RegisterBudget,
    /// A reduction row (with its prologue inputs) does not fit on-chip scratch.
    ScratchBudget,
    /// The consumer iterates over more elements than the anchor produces.
    IterationSpace,
    /// The fused group's inlined expressions would be too deep or too large.
    ExpressionBudget,
}

#[derive(Clone, Debug)]
pub struct RejectedFusion {
    pub producer: usize,
    pub consumer: usize,
    pub reason: RejectReason,
    /// The cost model's numbers, in words.
    pub detail: String,
}

#[derive(Clone, Debug)]
pub struct Partition {
    pub target: &'static str,
    pub groups: Vec<KernelGroup>,
    pub rejected: Vec<RejectedFusion>,
    /// Group of every node; `None` for sources.
    pub group_of: Vec<Option<usize>>,
}

impl Partition {
    pub fn total_time(&self) -> f64 {
        self.groups.iter().map(|g| g.time_s).sum()
    }

    pub fn count(&self, kind: GroupKind) -> usize {
        self.groups.iter().filter(|g| g.kind == kind).count()
    }
}

/// Partitions with default size hints (free symbols = 64).
pub fn partition(g: &Graph, t: &Target) -> Partition {
    partition_with(g, t, &SizeHints::default())
}

pub fn partition_with(g: &Graph, t: &Target, hints: &SizeHints) -> Partition {
    let mut st = St::new(g, t, hints);
    st.run();
    st.finish()
}

const NONE: usize = usize::MAX;

/// Longest chain of nodes in one group: bounds the nesting of the expressions lowering
/// builds (and the recursion depth of every walk over them).
pub const MAX_INLINE_DEPTH: u32 = 64;
/// Most node instances in one group's expressions when every value read more than once is
/// expanded at each read (as it is inside a bounds-checked branch).
pub const MAX_INLINE_TREE: u64 = 1 << 14;
/// Most inputs of a concatenation that a convolution reading it folds in on CPU targets (see
/// `reindexes_into_window`): each element of the folded input selects among them.
pub const MAX_FOLDED_CONCAT: usize = 4;

struct Grp {
    nodes: Vec<NodeId>,
    anchors: Vec<NodeId>,
    alive: bool,
    note: Option<String>,
}

struct St<'a> {
    g: &'a Graph,
    t: &'a Target,
    s: Sizes,
    uses: Vec<Uses>,
    class: Vec<Class>,
    flops: Vec<f64>,
    gid: Vec<usize>,
    groups: Vec<Grp>,
    /// Consumer groups of every group, kept up to date by `merge` (the cycle check walks
    /// them for every candidate fusion).
    cons: Vec<BTreeSet<usize>>,
    /// (producer node, consumer node, reason, detail), mapped to final groups at the end.
    rejected: Vec<(NodeId, NodeId, RejectReason, String)>,
}

fn mb(b: f64) -> String {
    if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else {
        format!("{:.1} KB", b / 1e3)
    }
}

fn us(s: f64) -> String {
    format!("{:.2} us", s * 1e6)
}

impl<'a> St<'a> {
    fn new(g: &'a Graph, t: &'a Target, hints: &SizeHints) -> St<'a> {
        let s = Sizes::new(g, hints);
        let class: Vec<Class> = g.nodes().iter().map(|n| classify(&n.op)).collect();
        let flops = g.nodes().iter().map(|n| node_flops(g, n, &s)).collect();
        let mut gid = vec![NONE; g.nodes().len()];
        let mut groups = Vec::new();
        for (i, c) in class.iter().enumerate() {
            if *c == Class::Source {
                continue;
            }
            gid[i] = groups.len();
            let anchors = if c.is_anchor() {
                vec![NodeId(i as u32)]
            } else {
                vec![]
            };
            groups.push(Grp {
                nodes: vec![NodeId(i as u32)],
                anchors,
                alive: true,
                note: None,
            });
        }
        let mut st = St {
            g,
            t,
            s,
            uses: g.uses(),
            class,
            flops,
            gid,
            groups,
            cons: Vec::new(),
            rejected: Vec::new(),
        };
        st.cons = (0..st.groups.len()).map(|gi| st.find_consumer_groups(gi)).collect();
        st
    }

    // ---- group queries ----

    fn kind(&self, gi: usize) -> GroupKind {
        let gr = &self.groups[gi];
        if let Some(a) = gr.anchors.first() {
            return kind_of(self.class[a.index()]);
        }
        if gr
            .nodes
            .iter()
            .all(|n| self.class[n.index()] == Class::Layout)
        {
            GroupKind::Layout
        } else {
            GroupKind::Elementwise
        }
    }

    fn has_anchor(&self, gi: usize) -> bool {
        !self.groups[gi].anchors.is_empty()
    }

    fn producer_group(&self, v: ValueId) -> Option<usize> {
        match self.g.value(v).def {
            ValueDef::Node { node, .. } if self.gid[node.index()] != NONE => {
                Some(self.gid[node.index()])
            }
            _ => None,
        }
    }

    /// Values defined outside the group that its nodes read, in first-use order.
    fn ext_inputs(&self, gi: usize) -> Vec<ValueId> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for n in &self.groups[gi].nodes {
            for &v in &self.g.node(*n).inputs {
                if self.producer_group(v) != Some(gi) && seen.insert(v) {
                    out.push(v);
                }
            }
        }
        out
    }

    /// Values the group writes for outside readers or graph outputs.
    fn ext_outputs(&self, gi: usize) -> Vec<ValueId> {
        let mut out = Vec::new();
        for n in &self.groups[gi].nodes {
            for &v in &self.g.node(*n).outputs {
                let u = &self.uses[v.index()];
                if !u.by_output.is_empty()
                    || u.by_node.iter().any(|(c, _)| self.gid[c.index()] != gi)
                {
                    out.push(v);
                }
            }
        }
        out
    }

    fn consumer_groups(&self, gi: usize) -> BTreeSet<usize> {
        self.cons[gi].clone()
    }

    fn find_consumer_groups(&self, gi: usize) -> BTreeSet<usize> {
        let mut out = BTreeSet::new();
        for n in &self.groups[gi].nodes {
            for &v in &self.g.node(*n).outputs {
                for (c, _) in &self.uses[v.index()].by_node {
                    let cg = self.gid[c.index()];
                    if cg != gi && cg != NONE {
                        out.insert(cg);
                    }
                }
            }
        }
        out
    }

    /// Whether layout group `gi` computes the input of a channels-last convolution over at
    /// most `pad-thin-convs`' channel count per group, or on GPUs at most 8 (`pad-thin-channels`
    /// pads to 4 or 8): its padded, channels-last copy of an image, read in place by the conv
    /// (in whole pixels on GPUs) only when materialized.
    fn pads_thin_conv(&self, gi: usize) -> bool {
        let thin = if self.t.is_gpu() { 8 } else { crate::passes::layout::THIN_CONV_CHANNELS };
        self.kind(gi) == GroupKind::Layout && self.groups[gi].nodes.iter().any(|&n| {
            let node = self.g.node(n);
            self.uses[node.outputs[0].index()].by_node.iter().any(|&(c, slot)| {
                    let cn = self.g.node(c);
                    slot == 0
                        && matches!(cn.op, Op::Linalg(LinalgOp::Conv { channels_last: true, .. }))
                        && self.g.value(cn.inputs[1]).ty.fixed_shape().is_some_and(|w| {
                            w.len() > 1 && w[1] <= thin
                        })
                })
        })
    }

    /// Whether `c` is anchored on a convolution of more than one tap that `p` transposes or
    /// concatenates the input of (any convolution, when the concatenation has more than
    /// [`MAX_FOLDED_CONCAT`] inputs), or on a windowed pool that `p` transposes the input of. Such
    /// an anchor reads each input element once per tap: folded in, a transpose gathers across
    /// the transposed axes and a concatenation selects between its inputs every time, and the
    /// convolution can read neither in place nor run as Winograd (UNet's decoder: a 3×3
    /// convolution over the concatenation of an upsampled map and the encoder's features).
    ///
    /// CPU targets only: the GPU templates read a channels-first input through their own
    /// fused transpose (the mma.sync template's gathered im2col at a model's first layer).
    fn reindexes_into_window(&self, p: usize, c: usize) -> bool {
        if self.t.is_gpu() {
            return false;
        }
        let has = |f: &dyn Fn(&LayoutOp) -> bool| {
            self.groups[p].nodes.iter().any(|&n| matches!(&self.g.node(n).op, Op::Layout(l) if f(l)))
        };
        let transposes = has(&|l| matches!(l, LayoutOp::Transpose { .. }));
        let concats = has(&|l| matches!(l, LayoutOp::Concat { .. }));
        // A concatenation of many inputs selects among all of them for every element: even a
        // one-tap convolution then packs its input far slower than it multiplies (DenseNet's
        // 1x1 convolutions over the concatenated features of up to 24 earlier layers ran at
        // 24-80 GFLOP/s), where the copy once is cheap.
        let many = self.groups[p].nodes.iter().any(|&n| {
            let node = self.g.node(n);
            matches!(node.op, Op::Layout(LayoutOp::Concat { .. })) && node.inputs.len() > MAX_FOLDED_CONCAT
        });
        (transposes || concats)
            && self.groups[c].anchors.iter().any(|&a| {
                let node = self.g.node(a);
                match &node.op {
                    Op::Linalg(LinalgOp::Conv { .. }) => many || self
                        .g
                        .value(node.inputs[1])
                        .ty
                        .fixed_shape()
                        .is_some_and(|w| w.iter().skip(2).product::<usize>() > 1),
                    Op::Linalg(LinalgOp::Pool { .. }) => transposes,
                    _ => false,
                }
            })
    }

    /// Whether `p` holds a linear or cubic resize and `c` is a GEMM or convolution (CPU
    /// targets only). Folded into the product's operand, the interpolation runs per element
    /// in the packing loop, scalar, with its coordinate arithmetic (SegFormer's head: a 1x1
    /// convolution over four feature maps upsampled to 56x56 and concatenated, 1.7 GFLOP at
    /// 68 GFLOP/s); a resize kernel computes it once over rows (`split-resizes`) and the
    /// product then reads a plain operand. (The GPU templates gather their operands per tile.)
    fn interpolates_into_product(&self, p: usize, c: usize) -> bool {
        !self.t.is_gpu()
            && matches!(self.kind(c), GroupKind::Gemm | GroupKind::Conv)
            && self.groups[p].nodes.iter().any(|&n| {
                matches!(&self.g.node(n).op, Op::Layout(LayoutOp::Resize(r)) if r.mode != tilec_ir::op::ResizeMode::Nearest)
            })
    }

    /// Whether `p` transposes the rows that a normalization in `c` reduces (a layer, RMS or
    /// softmax normalization over its last axis, whose input `p` makes with a transpose that
    /// brings another axis last; CPU targets only). Folded, each row's reductions stride
    /// across the source (scalar loads, one per element per pass: SqueezeBERT's LayerNorms
    /// between its channels-first 1-D convolutions ran at 1.7 GB/s); materialized once, the
    /// rows are contiguous and the passes vectorize.
    fn transposes_normalized_rows(&self, p: usize, c: usize) -> bool {
        if self.t.is_gpu() || self.kind(c) != GroupKind::Normalization {
            return false;
        }
        let moves_last = |v: ValueId| match self.g.value(v).def {
            ValueDef::Node { node, .. } if self.gid[node.index()] == p => {
                matches!(&self.g.node(node).op, Op::Layout(LayoutOp::Transpose { perm }) if perm.last().is_some_and(|&l| l + 1 != perm.len()))
            }
            _ => false,
        };
        self.groups[c].anchors.iter().any(|&a| {
            let n = self.g.node(a);
            let Some(&x) = n.inputs.first() else { return false };
            let last = self.s.rank(x).saturating_sub(1);
            let over_last = match &n.op {
                Op::Norm(NormOp::LayerNorm { axis, .. } | NormOp::RmsNorm { axis, .. }) => *axis <= last,
                Op::Norm(NormOp::Softmax { axis } | NormOp::LogSoftmax { axis }) => *axis == last,
                _ => false,
            };
            over_last && self.s.dim(x, last) > 1.0 && moves_last(x)
        })
    }

    /// Whether a resize in `c` reads a value that a resize in `p` computes (`split-resizes`
    /// separates an interpolation over several axes into such a chain).
    fn resize_reads_resize(&self, p: usize, c: usize) -> bool {
        let is_resize = |n: NodeId| matches!(self.g.node(n).op, Op::Layout(LayoutOp::Resize(_)));
        self.groups[c].nodes.iter().any(|&n| {
            is_resize(n)
                && self.g.node(n).inputs.iter().any(|&v| match self.g.value(v).def {
                    ValueDef::Node { node, .. } => self.gid[node.index()] == p && is_resize(node),
                    _ => false,
                })
        })
    }

    /// Whether layout group `gi` transposes the result of an anchor group (its one producer)
    /// and layout group `c` concatenates.
    fn transposes_anchor_into_concat(&self, gi: usize, c: usize) -> bool {
        let has = |g: usize, f: &dyn Fn(&Op) -> bool| self.groups[g].nodes.iter().any(|&n| f(&self.g.node(n).op));
        let prods = self.producer_groups(gi);
        self.kind(c) == GroupKind::Layout
            && prods.len() == 1
            && prods.iter().all(|&p| self.has_anchor(p) && self.kind(p) != GroupKind::Opaque)
            && has(gi, &|op| matches!(op, Op::Layout(LayoutOp::Transpose { .. })))
            && has(c, &|op| matches!(op, Op::Layout(LayoutOp::Concat { .. })))
    }

    fn producer_groups(&self, gi: usize) -> BTreeSet<usize> {
        self.ext_inputs(gi)
            .into_iter()
            .filter_map(|v| self.producer_group(v))
            .collect()
    }

    fn group_flops(&self, gi: usize) -> f64 {
        self.groups[gi]
            .nodes
            .iter()
            .map(|n| self.flops[n.index()])
            .sum()
    }

    /// Bytes a value costs to read as a group input: sources are generated inline, a
    /// gather reads only the rows it selects.
    fn input_bytes(&self, gi: usize, v: ValueId) -> f64 {
        if let ValueDef::Node { node, .. } = self.g.value(v).def {
            if self.class[node.index()] == Class::Source {
                return 0.0;
            }
        }
        let full = self.s.bytes(v);
        let mut gathered = 0.0;
        let mut other = false;
        for (c, k) in &self.uses[v.index()].by_node {
            if self.gid[c.index()] != gi {
                continue;
            }
            let n = self.g.node(*c);
            if *k == 0
                && matches!(
                    n.op,
                    tilec_ir::Op::Index(tilec_ir::op::IndexOp::Gather { .. })
                )
            {
                gathered += n.outputs.first().map(|&o| self.s.bytes(o)).unwrap_or(0.0);
            } else {
                other = true;
            }
        }
        if other {
            full
        } else {
            full.min(gathered)
        }
    }

    fn group_bytes(&self, gi: usize) -> f64 {
        let i: f64 = self
            .ext_inputs(gi)
            .iter()
            .map(|&v| self.input_bytes(gi, v))
            .sum();
        let o: f64 = self.ext_outputs(gi).iter().map(|&v| self.s.bytes(v)).sum();
        i + o
    }

    fn group_peak(&self, gi: usize) -> f64 {
        let gr = &self.groups[gi];
        match gr.anchors.first() {
            Some(a)
                if matches!(
                    self.class[a.index()],
                    Class::Gemm | Class::Conv | Class::Attention
                ) =>
            {
                let eb = self
                    .g
                    .node(*a)
                    .inputs
                    .first()
                    .map(|v| self.s.elem_bytes[v.index()])
                    .unwrap_or(4);
                let float = self
                    .g
                    .node(*a)
                    .inputs
                    .first()
                    .map(|v| self.g.value(*v).ty.dtype.is_float())
                    .unwrap_or(true);
                self.t.peak(true, if float { eb } else { 1 })
            }
            _ => self.t.peak(false, 4),
        }
    }

    /// Elements of the anchor's main output (the epilogue's iteration space).
    fn anchor_elems(&self, gi: usize) -> f64 {
        self.groups[gi]
            .anchors
            .iter()
            .filter_map(|a| self.g.node(*a).outputs.first())
            .map(|&o| self.s.elems(o))
            .fold(0.0, f64::max)
    }

    fn iter_elems(&self, gi: usize) -> f64 {
        self.groups[gi]
            .nodes
            .iter()
            .flat_map(|n| self.g.node(*n).outputs.iter())
            .map(|&o| self.s.elems(o))
            .fold(0.0, f64::max)
    }

    fn ew_ops(&self, gi: usize) -> usize {
        self.groups[gi]
            .nodes
            .iter()
            .filter(|n| self.class[n.index()] == Class::Elementwise)
            .count()
    }

    /// Bytes saved by fusing `p` into `c`: each value `p` writes that `c` reads is no
    /// longer read back, and no longer written at all if nobody else reads it.
    fn saved_bytes(&self, p: usize, c: usize) -> (f64, bool) {
        let mut saved = 0.0;
        let mut escapes = false;
        for v in self.ext_outputs(p) {
            let u = &self.uses[v.index()];
            let in_c = u.by_node.iter().any(|(n, _)| self.gid[n.index()] == c);
            if !in_c {
                continue;
            }
            let only_c =
                u.by_output.is_empty() && u.by_node.iter().all(|(n, _)| self.gid[n.index()] == c);
            if only_c {
                saved += 2.0 * self.s.bytes(v);
            } else {
                saved += self.s.bytes(v);
                escapes = true;
            }
        }
        (saved, escapes)
    }

    /// Whether merging `a` and `b` would create a cycle: a path between them through a
    /// third group. Returns that group.
    fn cycle_via(&self, a: usize, b: usize) -> Option<usize> {
        let cons = [&self.cons[a], &self.cons[b]];
        let mut seen = vec![false; self.groups.len()];
        for (f, t) in [(0, 1), (1, 0)] {
            let (from, to) = ([a, b][f], [a, b][t]);
            // Where `to` feeds `from` directly, a path back from `from` to `to` would already
            // be a cycle: the group graph is acyclic, so only the other direction needs a
            // search (which keeps fusing along a long chain from searching all of it).
            if cons[t].contains(&from) {
                continue;
            }
            seen.iter_mut().for_each(|x| *x = false);
            let mut q: VecDeque<(usize, usize)> = VecDeque::new();
            for &s in cons[f] {
                if s != to && !seen[s] {
                    seen[s] = true;
                    q.push_back((s, s));
                }
            }
            while let Some((x, first)) = q.pop_front() {
                for &s in &self.cons[x] {
                    if s == to {
                        return Some(first);
                    }
                    if s != from && !seen[s] {
                        seen[s] = true;
                        q.push_back((s, first));
                    }
                }
            }
        }
        None
    }

    fn first_node(&self, gi: usize) -> NodeId {
        self.groups[gi]
            .anchors
            .first()
            .copied()
            .unwrap_or(self.groups[gi].nodes[0])
    }

    fn reject(&mut self, p: usize, c: usize, reason: RejectReason, detail: String) {
        let (pn, cn) = (self.first_node(p), self.first_node(c));
        self.rejected.push((pn, cn, reason, detail));
    }

    fn check_cycle(&mut self, p: usize, c: usize) -> bool {
        if let Some(via) = self.cycle_via(p, c) {
            let vn = self.first_node(via);
            let d = format!(
                "a path leaves one group and re-enters the other through '{}' ({})",
                self.g.node(vn).name,
                self.kind(via)
            );
            self.reject(p, c, RejectReason::Cycle, d);
            return false;
        }
        true
    }

    /// The longest chain of nodes and the number of expanded node instances in the union of
    /// groups `a` and `b` (a value read twice counts twice: nothing is shared).
    fn inline_extent(&self, a: usize, b: usize) -> (u32, u64) {
        let mut nodes: Vec<NodeId> = self.groups[a].nodes.iter().chain(&self.groups[b].nodes).copied().collect();
        nodes.sort();
        // Nodes are in topological order, so every producer is seen before its readers.
        let mut at: std::collections::HashMap<NodeId, (u32, u64)> = std::collections::HashMap::with_capacity(nodes.len());
        let (mut depth, mut tree) = (0u32, 0u64);
        for n in nodes {
            let (mut d, mut t) = (0u32, 0u64);
            if !self.class[n.index()].is_anchor() {
                for &v in &self.g.node(n).inputs {
                    if let ValueDef::Node { node, .. } = self.g.value(v).def {
                        if let Some(&(pd, pt)) = at.get(&node) {
                            d = d.max(pd);
                            t = t.saturating_add(pt);
                        }
                    }
                }
            }
            // An anchor's value reaches its readers as one scalar: the chain restarts there.
            let e = (d + 1, t.saturating_add(1));
            depth = depth.max(e.0);
            tree = tree.max(e.1);
            at.insert(n, e);
        }
        (depth, tree)
    }

    /// Whether `p` and `c` may fuse within the expression budget; records a refusal if not.
    fn check_expression_budget(&mut self, p: usize, c: usize) -> bool {
        let (depth, tree) = self.inline_extent(p, c);
        if depth <= MAX_INLINE_DEPTH && tree <= MAX_INLINE_TREE {
            return true;
        }
        let d = format!(
            "fused expressions would nest {depth} ops (budget {MAX_INLINE_DEPTH}) and expand to {tree} op instances (budget {MAX_INLINE_TREE}): materialized"
        );
        self.reject(p, c, RejectReason::ExpressionBudget, d);
        false
    }

    fn merge(&mut self, keep: usize, gone: usize) {
        let feeds_gone = self.producer_groups(gone);
        let nodes = std::mem::take(&mut self.groups[gone].nodes);
        let anchors = std::mem::take(&mut self.groups[gone].anchors);
        self.groups[gone].alive = false;
        for n in &nodes {
            self.gid[n.index()] = keep;
        }
        let gr = &mut self.groups[keep];
        gr.nodes.extend(nodes);
        gr.nodes.sort();
        gr.anchors.extend(anchors);
        gr.anchors.sort();
        let gone_cons = std::mem::take(&mut self.cons[gone]);
        self.cons[keep].extend(gone_cons);
        self.cons[keep].remove(&keep);
        self.cons[keep].remove(&gone);
        for x in feeds_gone {
            if x != keep {
                self.cons[x].remove(&gone);
                self.cons[x].insert(keep);
            }
        }
        debug_assert!(self.cons[keep] == self.find_consumer_groups(keep));
    }

    fn alive(&self) -> Vec<usize> {
        (0..self.groups.len())
            .filter(|&i| self.groups[i].alive)
            .collect()
    }

    // ---- rules ----

    /// Rule 1a: a layout-only group whose readers are all in one group folds into it.
    fn fold_layout_into_consumer(&mut self) -> bool {
        let mut changed = false;
        for gi in self.alive().into_iter().rev() {
            if !self.groups[gi].alive || self.kind(gi) != GroupKind::Layout {
                continue;
            }
            let is_graph_out = self
                .ext_outputs(gi)
                .iter()
                .any(|v| !self.uses[v.index()].by_output.is_empty());
            let cons = self.consumer_groups(gi);
            if is_graph_out || cons.len() != 1 {
                continue;
            }
            let c = *cons.iter().next().unwrap_or(&gi);
            if self.kind(c) == GroupKind::Opaque || self.cycle_via(gi, c).is_some() || !self.check_expression_budget(gi, c) {
                continue;
            }
            // A windowed consumer reads each input element many times (k×k taps): the
            // re-indexing would be recomputed per tap. Rule 1b writes it in its producer
            // instead, once per element.
            if matches!(self.kind(c), GroupKind::Conv | GroupKind::Pool) && !self.producer_groups(gi).is_empty() {
                continue;
            }
            // The (padded, channels-last) copy in front of a convolution over few channels
            // (`pad-thin-convs`) stays a kernel of its own: folded back, every tap would
            // re-index and check bounds again, and the conv could not read it in place.
            if self.pads_thin_conv(gi) {
                self.groups[gi].note =
                    Some("pads the input of a convolution over few channels: materialized once".into());
                continue;
            }
            if self.reindexes_into_window(gi, c) {
                self.groups[gi].note =
                    Some("re-indexes the input of a windowed anchor: materialized once".into());
                continue;
            }
            // Rows transposed into a normalization: rule 1b writes them in its producer
            // (or they are materialized once), so the normalization reads contiguous rows.
            if self.transposes_normalized_rows(gi, c) {
                self.groups[gi].note = Some("transposes the rows a normalization reduces: written by its producer or materialized, so the rows are contiguous".into());
                continue;
            }
            // A transpose of an anchor's result into a concatenation: the anchor writes it in
            // the new layout (rule 2) instead of the concatenation gathering across the
            // transposed axes (UNet's transposed convolutions, NCHW, concatenated
            // channels-last with the encoder's features).
            if self.transposes_anchor_into_concat(gi, c) {
                continue;
            }
            self.merge(c, gi);
            changed = true;
        }
        changed
    }

    /// Rule 1b: a layout group left over folds into its producer (written in the new layout).
    fn fold_layout_into_producer(&mut self) -> bool {
        let mut changed = false;
        for gi in self.alive() {
            if !self.groups[gi].alive || self.kind(gi) != GroupKind::Layout {
                continue;
            }
            let prods = self.producer_groups(gi);
            let ncons = self.consumer_groups(gi).len();
            if prods.len() == 1 {
                let p = *prods.iter().next().unwrap_or(&gi);
                if self.kind(p) != GroupKind::Opaque
                    && self.cycle_via(p, gi).is_none()
                    && self.check_expression_budget(p, gi)
                {
                    self.merge(p, gi);
                    changed = true;
                    continue;
                }
            }
            let why = if prods.is_empty() {
                format!("reads only graph inputs/constants and has {ncons} consumer groups: materialized once")
            } else if prods.len() > 1 {
                format!(
                    "gathers from {} producer groups into {} consumer groups: materialized",
                    prods.len(),
                    ncons
                )
            } else if self.kind(*prods.iter().next().unwrap_or(&gi)) == GroupKind::Opaque {
                format!("producer is opaque and it has {ncons} consumer groups: materialized")
            } else {
                "folding it into its producer would close a cycle or exceed the expression budget: materialized".to_string()
            };
            self.groups[gi].note = Some(why);
        }
        changed
    }

    /// Rule 2: anchors absorb elementwise/layout consumer groups.
    fn epilogues(&mut self) -> bool {
        let mut changed = false;
        for p in self.alive() {
            if !self.groups[p].alive || !self.has_anchor(p) || self.kind(p) == GroupKind::Opaque {
                continue;
            }
            loop {
                let mut merged = false;
                for c in self.consumer_groups(p) {
                    if self.has_anchor(c) {
                        continue;
                    }
                    if self.try_epilogue(p, c) {
                        merged = true;
                        changed = true;
                        break;
                    }
                }
                if !merged {
                    break;
                }
            }
        }
        changed
    }

    fn try_epilogue(&mut self, p: usize, c: usize) -> bool {
        let (ae, ce) = (self.anchor_elems(p), self.iter_elems(c));
        if ce > ae {
            let d = format!("epilogue iterates {ce:.0} elements > {ae:.0} the anchor produces");
            self.reject(p, c, RejectReason::IterationSpace, d);
            return false;
        }
        let ops = self.ew_ops(p) + self.ew_ops(c);
        if ops > self.t.max_epilogue_ops {
            let d = format!(
                "epilogue chain of {ops} ops > budget {} (registers)",
                self.t.max_epilogue_ops
            );
            self.reject(p, c, RejectReason::RegisterBudget, d);
            return false;
        }
        if !self.check_expression_budget(p, c) || !self.check_cycle(p, c) {
            return false;
        }
        self.merge(p, c);
        true
    }

    /// Rule 3: anchors absorb elementwise/layout producer groups.
    fn prologues(&mut self) -> bool {
        let mut changed = false;
        for c in self.alive() {
            if !self.groups[c].alive || !self.has_anchor(c) || self.kind(c) == GroupKind::Opaque {
                continue;
            }
            loop {
                let mut merged = false;
                for p in self.producer_groups(c) {
                    if self.has_anchor(p) {
                        self.note_anchor_pair(p, c);
                        continue;
                    }
                    if self.try_prologue(p, c) {
                        merged = true;
                        changed = true;
                        break;
                    }
                }
                if !merged {
                    break;
                }
            }
        }
        changed
    }

    /// Records why two anchor groups stay apart.
    fn note_anchor_pair(&mut self, p: usize, c: usize) {
        if self.kind(p) == GroupKind::Opaque || self.kind(c) == GroupKind::Opaque {
            return;
        }
        let (saved, escapes) = self.saved_bytes(p, c);
        let pf = self.group_flops(p);
        let ncons = self.consumer_groups(p).len();
        let d = if escapes || ncons > 1 {
            format!(
                "producer {} does {:.3} MFLOP and feeds {ncons} groups: fusing it into {} would recompute it per consumer (saves only {})",
                self.kind(p),
                pf / 1e6,
                self.kind(c),
                mb(saved)
            )
        } else {
            format!(
                "{} -> {}: two anchors need different schedules; would save {} ({})",
                self.kind(p),
                self.kind(c),
                mb(saved),
                us(self.t.mem_time(saved) + self.t.launch_s)
            )
        };
        self.reject(p, c, RejectReason::HeavyProducer, d);
    }

    /// How often a prologue feeding anchor `c` through value `v` is recomputed.
    fn prologue_factor(&self, c: usize, v: ValueId) -> f64 {
        let tile = self.t.gemm_tile as f64;
        let mut f: f64 = 1.0;
        for a in self.groups[c].anchors.clone() {
            let n = self.g.node(a);
            let out = match n.outputs.first() {
                Some(&o) => o,
                None => continue,
            };
            for (k, &x) in n.inputs.iter().enumerate() {
                if x != v {
                    continue;
                }
                let r = self.s.rank(out);
                let fk = match self.class[a.index()] {
                    Class::Gemm => {
                        // A [M, K] is re-read per N tile; B [K, N] per M tile.
                        let (m, nn) = (
                            self.s.dim(out, r.saturating_sub(2)),
                            self.s.dim(out, r.saturating_sub(1)),
                        );
                        if k == 0 {
                            (nn / tile).ceil()
                        } else {
                            (m / tile).ceil()
                        }
                    }
                    Class::Conv => {
                        if k == 0 {
                            (self.s.dim(out, 1) / tile).ceil()
                        } else {
                            ((self.s.elems(out) / self.s.dim(out, 1).max(1.0)) / tile).ceil()
                        }
                    }
                    Class::Attention => {
                        let sq = self
                            .s
                            .dim(n.inputs[0], self.s.rank(n.inputs[0]).saturating_sub(2));
                        match k {
                            0 => 1.0,
                            1 | 2 => (sq / tile).ceil(),
                            _ => {
                                let q = n.inputs[0];
                                let rq = self.s.rank(q);
                                let skv = self.s.dim(n.inputs[1], rq.saturating_sub(2));
                                let scores = self.s.elems(q) / self.s.dim(q, rq - 1).max(1.0) * skv;
                                (scores / self.s.elems(x).max(1.0)).max(1.0)
                            }
                        }
                    }
                    _ => (self.s.elems(n.inputs[0]) / self.s.elems(x).max(1.0)).max(1.0),
                };
                f = f.max(fk.max(1.0));
            }
        }
        f
    }

    fn try_prologue(&mut self, p: usize, c: usize) -> bool {
        if self.pads_thin_conv(p) {
            let d = "the channels-last input of a convolution over few channels: folded, every tap would re-index and check bounds; materialized once".to_string();
            self.reject(p, c, RejectReason::Recompute, d);
            return false;
        }
        if self.reindexes_into_window(p, c) {
            let d = "transposes or concatenates the input of a windowed anchor: folded, every tap would re-index (gather across transposed axes, select between inputs) and the anchor could not read its input in place; materialized once".to_string();
            self.reject(p, c, RejectReason::Recompute, d);
            return false;
        }
        let ck = self.kind(c);
        if self.transposes_normalized_rows(p, c) {
            let d = "transposes the rows a normalization reduces: folded, every pass over a row strides across the source with scalar loads; materialized once, the rows are contiguous".to_string();
            self.reject(p, c, RejectReason::Recompute, d);
            return false;
        }
        if self.interpolates_into_product(p, c) {
            let d = "interpolates (linear or cubic resize) the operand of a matrix product: folded, the packing computes coordinates, taps and weights per element; materialized once, row by row".to_string();
            self.reject(p, c, RejectReason::Recompute, d);
            return false;
        }
        let (saved, escapes) = self.saved_bytes(p, c);
        let pf = self.group_flops(p);
        // The producer's values that the anchor reads, and how often each is recomputed.
        let feeds: Vec<ValueId> = self
            .ext_outputs(p)
            .into_iter()
            .filter(|v| {
                self.uses[v.index()]
                    .by_node
                    .iter()
                    .any(|(n, _)| self.gid[n.index()] == c)
            })
            .collect();
        let factor = feeds
            .iter()
            .map(|&v| self.prologue_factor(c, v))
            .fold(1.0, f64::max);
        let recompute = pf * (factor - 1.0);
        let matrix = matches!(ck, GroupKind::Gemm | GroupKind::Conv | GroupKind::Attention);
        if escapes && (matrix || factor > 1.0) && pf > 0.0 {
            let d = format!(
                "producer ({:.3} MFLOP) is also read by other groups; {} visits it {factor:.0}x, so it cannot write it once (saves only {})",
                pf / 1e6,
                ck,
                mb(saved)
            );
            self.reject(p, c, RejectReason::Escapes, d);
            return false;
        }
        if matches!(
            ck,
            GroupKind::Reduction | GroupKind::Normalization | GroupKind::Pool
        ) {
            let row: f64 = self.groups[c]
                .anchors
                .iter()
                .map(|a| reduction_row(self.g.node(*a), &self.s))
                .fold(0.0, f64::max);
            let live = 1 + self.ext_inputs(p).len();
            let row_bytes = row * 4.0 * live as f64;
            let budget = self.t.scratch_per_unit as f64;
            if row_bytes > budget {
                let d = format!(
                    "row of {row:.0} elements x {live} live tensors x 4 B = {} > on-chip {} per unit",
                    mb(row_bytes),
                    mb(budget)
                );
                self.reject(p, c, RejectReason::ScratchBudget, d);
                return false;
            }
        }
        let ops = self.ew_ops(p) + self.ew_ops(c);
        if ops > self.t.max_epilogue_ops {
            let d = format!(
                "fused prologue+epilogue chain of {ops} ops > budget {} (registers)",
                self.t.max_epilogue_ops
            );
            self.reject(p, c, RejectReason::RegisterBudget, d);
            return false;
        }
        if recompute > 0.0 && !self.recompute_pays(p, c, format!("prologue recomputed {factor:.0}x"), recompute, saved) {
            return false;
        }
        if !self.check_expression_budget(p, c) || !self.check_cycle(p, c) {
            return false;
        }
        self.merge(c, p);
        true
    }

    /// Whether recomputing `recompute` FLOPs costs less time than the traffic (and launch)
    /// that fusing saves; records a rejection with the numbers when it does not.
    fn recompute_pays(&mut self, p: usize, c: usize, what: String, recompute: f64, saved: f64) -> bool {
        let (rt, st) = (self.t.flop_time(recompute), self.t.mem_time(saved) + self.t.launch_s);
        if rt > st {
            let d = format!("{what}: +{:.3} MFLOP ({}) > saves {} ({})", recompute / 1e6, us(rt), mb(saved), us(st));
            self.reject(p, c, RejectReason::Recompute, d);
            return false;
        }
        true
    }

    /// Rule 4: elementwise producer into elementwise consumer.
    fn elementwise_chains(&mut self) -> bool {
        let mut changed = false;
        for c in self.alive() {
            if !self.groups[c].alive || self.has_anchor(c) {
                continue;
            }
            loop {
                let mut merged = false;
                for p in self.producer_groups(c) {
                    if self.has_anchor(p) {
                        continue;
                    }
                    if self.try_chain(p, c) {
                        merged = true;
                        changed = true;
                        break;
                    }
                }
                if !merged {
                    break;
                }
            }
        }
        changed
    }

    fn try_chain(&mut self, p: usize, c: usize) -> bool {
        if self.resize_reads_resize(p, c) {
            let d = "a resize read by a resize: inlined, each output would interpolate the producer's taps again (a resize over several axes, split one axis at a time, fused back); materialized".to_string();
            self.reject(p, c, RejectReason::Recompute, d);
            return false;
        }
        let (saved, escapes) = self.saved_bytes(p, c);
        let (pe, ce) = (self.iter_elems(p), self.iter_elems(c));
        if ce > pe && pe > 0.0 {
            let factor = ce / pe;
            let recompute = self.group_flops(p) * (factor - 1.0);
            if escapes {
                let d = format!(
                    "broadcast producer ({pe:.0} elements, read {factor:.1}x in a {ce:.0}-element consumer) is also read by other groups; it would be computed twice"
                );
                self.reject(p, c, RejectReason::Escapes, d);
                return false;
            }
            if !self.recompute_pays(p, c, format!("broadcast recompute {factor:.1}x"), recompute, saved) {
                return false;
            }
        }
        if !self.check_expression_budget(p, c) || !self.check_cycle(p, c) {
            return false;
        }
        self.merge(c, p);
        true
    }

    /// Rule 5: GEMMs sharing the activation operand with constant weights of the same K.
    fn horizontal(&mut self) -> bool {
        let mut changed = false;
        let gemms: Vec<usize> = self
            .alive()
            .into_iter()
            .filter(|&gi| self.kind(gi) == GroupKind::Gemm)
            .collect();
        for (i, &a) in gemms.iter().enumerate() {
            for &b in &gemms[i + 1..] {
                if !self.groups[a].alive || !self.groups[b].alive || a == b {
                    continue;
                }
                let key = |st: &St, gi: usize| -> Option<(ValueId, usize)> {
                    let an = st.g.node(*st.groups[gi].anchors.first()?);
                    if !matches!(an.op, tilec_ir::Op::Linalg(tilec_ir::op::LinalgOp::MatMul)) {
                        return None;
                    }
                    let w = *an.inputs.get(1)?;
                    st.g.const_value(w)?;
                    let wt = &st.g.value(w).ty;
                    if wt.rank() != 2 {
                        return None;
                    }
                    Some((an.inputs[0], wt.shape[0].fixed()?))
                };
                let (ka, kb) = (key(self, a), key(self, b));
                if ka.is_none() || ka != kb {
                    continue;
                }
                if let Some(via) = self.cycle_via(a, b) {
                    let vn = self.first_node(via);
                    let d = format!(
                        "sibling GEMMs are connected through '{}'",
                        self.g.node(vn).name
                    );
                    self.reject(a, b, RejectReason::Cycle, d);
                    continue;
                }
                self.merge(a, b);
                changed = true;
            }
        }
        changed
    }

    fn run(&mut self) {
        for _ in 0..16 {
            let mut changed = self.fold_layout_into_consumer();
            changed |= self.epilogues();
            changed |= self.prologues();
            changed |= self.elementwise_chains();
            changed |= self.horizontal();
            if !changed {
                changed = self.fold_layout_into_producer();
            }
            if !changed {
                break;
            }
        }
    }

    fn finish(self) -> Partition {
        let mut order: Vec<usize> = self
            .alive()
            .into_iter()
            .filter(|&gi| !self.groups[gi].nodes.is_empty())
            .collect();
        order.sort_by_key(|&gi| self.groups[gi].nodes[0]);
        let mut newid = vec![NONE; self.groups.len()];
        for (i, &gi) in order.iter().enumerate() {
            newid[gi] = i;
        }
        let mut groups = Vec::new();
        for (i, &gi) in order.iter().enumerate() {
            let gr = &self.groups[gi];
            let bytes = self.group_bytes(gi);
            let flops = self.group_flops(gi);
            let peak = self.group_peak(gi);
            groups.push(KernelGroup {
                id: i,
                kind: self.kind(gi),
                nodes: gr.nodes.clone(),
                anchor: gr.anchors.first().copied(),
                siblings: gr.anchors.iter().skip(1).copied().collect(),
                inputs: self.ext_inputs(gi),
                outputs: self.ext_outputs(gi),
                bytes,
                flops,
                peak,
                time_s: self.t.time(bytes, flops, peak),
                note: gr.note.clone(),
            });
        }
        let group_of: Vec<Option<usize>> = self
            .gid
            .iter()
            .map(|&g| if g == NONE { None } else { Some(newid[g]) })
            .collect();
        let mut rejected: Vec<RejectedFusion> = Vec::new();
        // Refusals from every round, mapped to final groups; a pair later fused anyway
        // drops out, and the first reason recorded for a pair and reason is kept.
        let mut seen = BTreeSet::new();
        for (pn, cn, reason, detail) in &self.rejected {
            let (p, c) = match (group_of[pn.index()], group_of[cn.index()]) {
                (Some(p), Some(c)) if p != c => (p, c),
                _ => continue,
            };
            if seen.insert((p, c, *reason)) {
                rejected.push(RejectedFusion {
                    producer: p,
                    consumer: c,
                    reason: *reason,
                    detail: detail.clone(),
                });
            }
        }
        rejected.sort_by_key(|r| (r.consumer, r.producer, r.reason));
        Partition {
            target: self.t.name,
            groups,
            rejected,
            group_of,
        }
    }
}
