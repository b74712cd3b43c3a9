//! `choose-layout`: picks NCHW or NHWC (channels-last) for each convolution region of a
//! graph, per [`TargetKind`].
//!
//! A *region* is a connected set of nodes that contains at least one convolution or pool:
//! the layout-sensitive ops (conv, pool, global pool, a mean or maximum over both spatial
//! axes kept as `[N, C, 1, 1]` — a squeeze-and-excitation's pool —, batch/instance norm,
//! LRN) plus the layout-agnostic ops between them (elementwise, cast, concat, softmax),
//! connected through rank-4 values, and the channel splits and merges of a channel shuffle
//! (below). Switching a region to NHWC costs one transpose per distinct
//! non-constant value entering it and one per value leaving it (sinking removes any in
//! between); constants (conv weights `OIHW → OHWI`, per-channel `[C,1,1]` operands) are
//! permuted at compile time for free, and so are values whose transpose is a reshape
//! (`[N, C, 1, 1]`), values entering from a transpose to NCHW (`[0, 3, 1, 2]`, as models that
//! run their MLPs channels-last write, e.g. ConvNeXt) and values leaving only into
//! transposes to NHWC: those transposes cancel.
//!
//! Decision:
//! - [`TargetKind::Cuda`]: NHWC when the region has convolutions and its boundary transposes
//!   are no more than its convolutions. Tensor-core convolutions (cuDNN, CUTLASS implicit
//!   GEMM) work channels-last: with NCHW tensors the library transposes in and out around
//!   every conv, so one boundary transpose per conv at most is always a win.
//! - [`TargetKind::Cpu`]: NHWC under the same transpose budget, when the register tiles of
//!   the region's convs, which run along output channels per group, would be at least 90%
//!   full (FLOP-weighted). Channels-last
//!   convolutions read their input in place (`tilec_tile::indirect`: one pointer per output
//!   pixel and tap, channels contiguous) and vectorize along output channels, so they need
//!   no im2col packing; with odd channel counts per group (ShuffleNet's 34, 68, ...) the
//!   vectors would be mostly padding, and NCHW (vectors along pixels) stays.
//!
//! Channel shuffles (`reshape [N,C,H,W] → [N,g,C/g,H,W]`, `transpose(0,2,1,3,4)`,
//! `reshape → [N,C,H,W]`, as in ShuffleNet) stay inside a region: a reshape that keeps N
//! and the two spatial dims and only splits or merges the channel dims, and a transpose
//! that only permutes those channel dims, have exact channels-last counterparts. A region
//! value of rank `r >= 4` is `[N, c.., H, W]`; its channels-last form is `[N, H, W, c..]`
//! (`transpose(0, r-2, r-1, 1, .., r-3)`).
//!
//! Rewrite ([`apply_plan`]): for each NHWC region, conv, pool, batch norm and LRN get
//! `channels_last` (weights stay OIHW, norm parameters stay `[C]`), a spatial mean or
//! maximum becomes a channels-last global pool, concat/softmax axes are
//! remapped, channel-split reshapes and channel transposes are rewritten on the
//! channels-last dims, elementwise ops read their operands channels-last (rank-4 operands
//! through `transpose(0,2,3,1)`, lower-rank broadcast operands such as `[C,1,1]` biases
//! through a reshape to rank 4 and the same transpose, all-ones shapes as they are), and
//! every region value read outside gets the inverse transpose. Ops that cannot run
//! channels-last (instance norm, max pool with indices) are wrapped: transposed back to
//! NCHW around them. Constant folding and `sink-transposes` then fold the transposed
//! constants and cancel pairs.

use crate::partition::TargetKind;
use crate::{OptError, Pass};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use tilec_ir::op::{LayoutOp, LinalgOp, NormOp, PoolKind, ReduceKind, ReduceOp};
use tilec_ir::{Dim, Graph, IrError, Op, ValueId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    Nchw,
    Nhwc,
}

/// One convolution region and the layout chosen for it.
#[derive(Clone, Debug)]
pub struct LayoutRegion {
    /// Node names, in graph order.
    pub nodes: Vec<String>,
    pub convs: usize,
    pub pools: usize,
    pub norms: usize,
    /// Layout-agnostic nodes (elementwise, concat, ...).
    pub agnostic: usize,
    /// Ops whose axis attribute would change (`concat(axis=1)` → `axis=3`, ...).
    pub axis_remaps: usize,
    /// Constants and weights that would be permuted once (conv weights, per-channel
    /// operands), not counted as boundary transposes.
    pub constants: usize,
    /// Transposes NHWC needs at the region's boundary.
    pub entry_transposes: usize,
    pub exit_transposes: usize,
    pub layout: Layout,
    pub reason: String,
    /// Spatial axes of the region's values: 2 (`[N, C, H, W]`) or 3 (`[N, C, D, H, W]`, video
    /// convolutions; CPU targets only).
    pub spatial: usize,
}

/// The per-region layout decisions for one graph and target.
#[derive(Clone, Debug)]
pub struct LayoutPlan {
    pub target: TargetKind,
    pub regions: Vec<LayoutRegion>,
}

impl LayoutPlan {
    /// Regions that would switch to NHWC.
    pub fn nhwc_regions(&self) -> usize {
        self.regions
            .iter()
            .filter(|r| r.layout == Layout::Nhwc)
            .count()
    }

    /// A human-readable summary, one line per region.
    pub fn report(&self) -> String {
        let mut s = format!(
            "choose-layout ({:?}): {} conv region(s), {} to NHWC\n",
            self.target,
            self.regions.len(),
            self.nhwc_regions()
        );
        for (i, r) in self.regions.iter().enumerate() {
            s += &format!(
                "  region {i}: {}-D, {} nodes ({} conv, {} pool, {} norm, {} agnostic), {} axis remaps, {} constants; boundary {} in + {} out -> {:?}: {}\n",
                r.spatial,
                r.nodes.len(),
                r.convs,
                r.pools,
                r.norms,
                r.agnostic,
                r.axis_remaps,
                r.constants,
                r.entry_transposes,
                r.exit_transposes,
                r.layout,
                r.reason
            );
        }
        s
    }
}

#[derive(PartialEq)]
enum Role {
    Conv,
    Pool,
    Norm,
    Agnostic { remaps_axis: bool },
}

fn role(op: &Op) -> Option<Role> {
    Some(match op {
        Op::Linalg(LinalgOp::Conv { .. }) => Role::Conv,
        Op::Linalg(LinalgOp::Pool { .. } | LinalgOp::GlobalPool { .. }) => Role::Pool,
        op if spatial_pool(op).is_some() => Role::Pool,
        Op::Norm(NormOp::BatchNorm { .. } | NormOp::InstanceNorm { .. } | NormOp::GroupNorm { .. } | NormOp::Lrn { .. }) => {
            Role::Norm
        }
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } => {
            Role::Agnostic { remaps_axis: false }
        }
        Op::Layout(LayoutOp::Concat { .. })
        | Op::Norm(NormOp::Softmax { .. } | NormOp::LogSoftmax { .. }) => {
            Role::Agnostic { remaps_axis: true }
        }
        Op::Layout(LayoutOp::Reshape { .. } | LayoutOp::Transpose { .. }) => {
            Role::Agnostic { remaps_axis: true }
        }
        _ => return None,
    })
}

/// The global pool a reduction over the spatial axes of `[N, C, H, W]` (or `[N, C, D, H, W]`),
/// dims kept, computes (a mean or a maximum); `None` for any other op.
fn spatial_pool(op: &Op) -> Option<PoolKind> {
    match op {
        Op::Reduce(ReduceOp::Reduce { kind, axes, keepdims: true }) if axes[..] == [2, 3] || axes[..] == [2, 3, 4] => match kind {
            ReduceKind::Mean => Some(PoolKind::Avg { count_include_pad: false }),
            ReduceKind::Max => Some(PoolKind::Max { indices: false, column_major: false }),
            _ => None,
        },
        _ => None,
    }
}

/// Whether a value can live in a region of `sp` spatial axes: in 2-D regions rank 4
/// activations `[N, C, H, W]` and their channel-split forms `[N, c.., H, W]`; in 3-D regions
/// rank 5 activations `[N, C, D, H, W]` (no channel splits).
fn region_rank(sp: usize, r: usize) -> bool {
    if sp == 2 {
        r >= 4
    } else {
        r == sp + 2
    }
}

/// The permutation taking a region value `[N, c.., *S]` of rank `r` with `sp` spatial axes
/// `S` to its channels-last form `[N, *S, c..]` (`[0, 2, 3, 1]` for rank 4).
fn to_nhwc_perm(sp: usize, r: usize) -> Vec<usize> {
    let mut p = vec![0];
    p.extend(r - sp..r);
    p.extend(1..r - sp);
    p
}

/// Whether node `n` is eligible for a region of `sp` spatial axes.
fn eligible_node(g: &Graph, n: &tilec_ir::Node, sp: usize) -> bool {
    let (Some(&x), Some(&y)) = (n.inputs.first(), n.outputs.first()) else {
        return false;
    };
    let (xs, ys) = (&g.value(x).ty.shape, &g.value(y).ty.shape);
    let full = sp + 2;
    match &n.op {
        // Channel splits exist in 2-D regions only (a rank-5 value there is one).
        Op::Layout(LayoutOp::Reshape { .. } | LayoutOp::Transpose { .. }) if sp != 2 => false,
        // A channel split or merge: N and the spatial dims kept, the fixed channel dims
        // between them regrouped (row-major, so it is a pure split of the channel index).
        Op::Layout(LayoutOp::Reshape { .. }) => {
            let (ri, ro) = (xs.len(), ys.len());
            let mid = |s: &[Dim]| -> Option<usize> {
                s[1..s.len() - 2].iter().map(|d| d.fixed()).product()
            };
            region_rank(sp, ri)
                && region_rank(sp, ro)
                && xs[0] == ys[0]
                && xs[ri - 2..] == ys[ro - 2..]
                && mid(xs).is_some()
                && mid(xs) == mid(ys)
        }
        // A permutation of the channel dims only.
        Op::Layout(LayoutOp::Transpose { perm }) => {
            let r = perm.len();
            region_rank(sp, r) && perm[0] == 0 && perm[r - 2] == r - 2 && perm[r - 1] == r - 1
        }
        // Elementwise ops with broadcasting: an operand of lower rank (a per-channel scale
        // `[C, 1, 1]` first, as PoolFormer's layer scale multiplies) is brought to the
        // region's layout like any other.
        Op::Binary(_) | Op::Where => {
            ys.len() == full
                && n.inputs.iter().all(|&i| g.value(i).ty.rank() <= full)
                && n.inputs.iter().any(|&i| g.value(i).ty.shape == *ys)
        }
        // Global pools work on floats only.
        Op::Reduce(ReduceOp::Reduce { axes, .. }) if spatial_pool(&n.op).is_some() => {
            axes.len() == sp && xs.len() == full && ys.len() == full && g.value(x).ty.dtype.is_float()
        }
        op => role(op).is_some() && xs.len() == full && ys.len() == full,
    }
}

/// Whether `x`'s channels-last form costs no transpose at run time: a transpose that only
/// moves size-1 axes is a reshape (`[N, C, 1, 1]`).
fn free_transpose(g: &Graph, x: ValueId, sp: usize) -> bool {
    let s = &g.value(x).ty.shape;
    s.len() == sp + 2 && s[2..].iter().all(|d| *d == Dim::Fixed(1))
}

/// Whether `v` is the output of a transpose that its NHWC transpose cancels (a value
/// permuted to NCHW from channels-last: `[0, 3, 1, 2]`).
fn from_channels_last(g: &Graph, v: ValueId, sp: usize) -> bool {
    g.producer(v).is_some_and(|p| {
        matches!(&g.node(p).op, Op::Layout(LayoutOp::Transpose { perm }) if *perm == to_nchw_perm(sp, sp + 2))
    })
}

fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// Computes the layout plan of `g` for `target` (the graph is not changed): the regions of
/// 2-D convolutions, then on CPU targets those of 3-D ones (their channels-last form is
/// measured on the CPU only).
pub fn plan_layout(g: &Graph, target: TargetKind) -> LayoutPlan {
    let mut regions = plan_regions(g, target, 2);
    if target == TargetKind::Cpu {
        regions.extend(plan_regions(g, target, 3));
    }
    LayoutPlan { target, regions }
}

/// The regions of `sp` spatial axes and their layouts.
fn plan_regions(g: &Graph, target: TargetKind, sp: usize) -> Vec<LayoutRegion> {
    let nn = g.nodes().len();
    let rank4 = |v: ValueId| region_rank(sp, g.value(v).ty.rank());
    // A node is eligible when it has a role and its first input and output are rank 4, or
    // it is a channel split/merge/permutation.
    // A group norm joins a region on the CPU only (its channels-last form is not yet
    // measured on a GPU, where it stays channels-first at the region's boundary).
    let gpu_group_norm = |n: &tilec_ir::Node| target == TargetKind::Cuda && matches!(n.op, Op::Norm(NormOp::GroupNorm { .. }));
    let eligible: Vec<bool> = g.nodes().iter().map(|n| eligible_node(g, n, sp) && !gpu_group_norm(n)).collect();
    let mut parent: Vec<usize> = (0..nn).collect();
    for (ni, n) in g.nodes().iter().enumerate() {
        if !eligible[ni] {
            continue;
        }
        for &x in &n.inputs {
            if let Some(p) = g.producer(x) {
                if eligible[p.index()] && rank4(x) {
                    let (a, b) = (find(&mut parent, ni), find(&mut parent, p.index()));
                    parent[a] = b;
                }
            }
        }
    }
    let mut comps: HashMap<usize, Vec<usize>> = HashMap::new();
    for ni in (0..nn).filter(|&i| eligible[i]) {
        let r = find(&mut parent, ni);
        comps.entry(r).or_default().push(ni);
    }
    let uses = g.uses();
    let mut regions = Vec::new();
    let mut roots: Vec<usize> = comps.keys().copied().collect();
    roots.sort_unstable_by_key(|r| comps[r][0]);
    for root in roots {
        let members = &comps[&root];
        let inside: BTreeSet<usize> = members.iter().copied().collect();
        let (mut convs, mut pools, mut norms, mut agnostic, mut remaps) = (0, 0, 0, 0, 0);
        let mut entries: BTreeSet<ValueId> = BTreeSet::new();
        let mut consts: BTreeSet<ValueId> = BTreeSet::new();
        let mut exits: BTreeSet<ValueId> = BTreeSet::new();
        for &ni in members {
            let n = &g.nodes()[ni];
            match role(&n.op) {
                Some(Role::Conv) => convs += 1,
                Some(Role::Pool) => pools += 1,
                Some(Role::Norm) => norms += 1,
                Some(Role::Agnostic { remaps_axis }) => {
                    agnostic += 1;
                    remaps += usize::from(remaps_axis);
                }
                None => {}
            }
            let layout_op = !matches!(role(&n.op), Some(Role::Agnostic { .. }));
            for (k, &x) in n.inputs.iter().enumerate() {
                if layout_op && k > 0 {
                    // Weights / statistics: permuted once, at compile time for constants or
                    // at load time for parameters passed as graph inputs.
                    if rank4(x) {
                        consts.insert(x);
                    }
                } else if g.const_value(x).is_some() {
                    if g.value(x).ty.rank() > 1
                        || matches!(role(&n.op), Some(Role::Agnostic { .. }))
                    {
                        consts.insert(x);
                    }
                } else if rank4(x)
                    && !g.producer(x).is_some_and(|p| inside.contains(&p.index()))
                    && !free_transpose(g, x, sp)
                    && !from_channels_last(g, x, sp)
                {
                    entries.insert(x);
                }
            }
            for &o in &n.outputs {
                let u = &uses[o.index()];
                // Readers outside that transpose it to NHWC cancel the exit transpose.
                let to_nhwc = |m: &tilec_ir::NodeId| {
                    matches!(&g.node(*m).op, Op::Layout(LayoutOp::Transpose { perm }) if *perm == to_nhwc_perm(sp, sp + 2))
                };
                if rank4(o)
                    && !free_transpose(g, o, sp)
                    && (!u.by_output.is_empty()
                        || u.by_node.iter().any(|(m, _)| !inside.contains(&m.index()) && !to_nhwc(m)))
                {
                    exits.insert(o);
                }
            }
        }
        if convs + pools == 0 {
            continue;
        }
        let boundary = entries.len() + exits.len();
        let (layout, reason) = match target {
            TargetKind::Cpu if convs == 0 => (Layout::Nchw, "no convolution to gain from channels-last".to_string()),
            TargetKind::Cpu => {
                let (aligned, total) = lane_aligned_conv_flops(g, members, host_f32_lanes());
                if boundary > convs {
                    (Layout::Nchw, format!("{boundary} boundary transposes outweigh {convs} conv(s)"))
                } else if aligned * 10.0 < total * 9.0 {
                    (
                        Layout::Nchw,
                        format!(
                            "channels-last register tiles would be {:.0}% padding (output channels per group)",
                            100.0 * (1.0 - aligned / total.max(1.0))
                        ),
                    )
                } else {
                    (
                        Layout::Nhwc,
                        format!("{convs} conv(s) read their input in place channels-last for {boundary} boundary transpose(s)"),
                    )
                }
            }
            TargetKind::Cuda if convs == 0 => (Layout::Nchw, "no convolution to gain from channels-last".to_string()),
            TargetKind::Cuda if boundary <= convs => (
                Layout::Nhwc,
                format!("{convs} tensor-core conv(s) run channels-last for {boundary} boundary transpose(s)"),
            ),
            TargetKind::Cuda => (
                Layout::Nchw,
                format!("{boundary} boundary transposes outweigh {convs} conv(s)"),
            ),
        };
        regions.push(LayoutRegion {
            nodes: members.iter().map(|&i| g.nodes()[i].name.clone()).collect(),
            convs,
            pools,
            norms,
            agnostic,
            axis_remaps: remaps,
            constants: consts.len(),
            entry_transposes: entries.len(),
            exit_transposes: exits.len(),
            layout,
            reason,
            spatial: sp,
        });
    }
    regions
}

/// Most input channels per group of a grouped convolution the CPU computes directly, vectorized
/// within each group (`cpu.group_direct`, which takes 2-32).
const GROUP_DIRECT_MAX_IN: usize = 32;

/// The f32 lanes of this machine's vectors (8 with AVX2, 16 with AVX-512): a CPU model is
/// compiled for the CPU it runs on.
fn host_f32_lanes() -> usize {
    static LANES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LANES.get_or_init(|| crate::target::CpuTarget::host().lanes_of(4))
}

/// Multiply-adds of the region's convolutions channels-last on the CPU, weighted by how much
/// of the register tiles they fill (output channels per group padded as the CPU gemm tile
/// pads them: one vector up to 16, three at exactly 48, else whole pairs of vectors; depthwise
/// convs, with any channel multiplier, are direct loops over the input channels and fill
/// them; so do grouped ones of up to [`GROUP_DIRECT_MAX_IN`] input channels per group whose
/// output channels per group are whole vectors of `lanes`, computed within each group), and
/// unweighted.
fn lane_aligned_conv_flops(g: &Graph, members: &[usize], lanes: usize) -> (f64, f64) {
    let (mut aligned, mut total) = (0.0, 0.0);
    for &ni in members {
        let n = &g.nodes()[ni];
        let Op::Linalg(LinalgOp::Conv { group, .. }) = &n.op else { continue };
        let w = g.value(n.inputs[1]).ty.fixed_shape();
        let o = g.value(n.outputs[0]).ty.fixed_shape();
        let (Some(w), Some(o)) = (w, o) else { continue };
        let work = (o.iter().product::<usize>() * w[1..].iter().product::<usize>()) as f64;
        let mg = (w[0] / (*group).max(1)).max(1);
        let direct = *group > 1 && w[1] <= GROUP_DIRECT_MAX_IN && mg % lanes.max(1) == 0;
        let padded = if (w[1] == 1 && *group > 1 && mg <= 8) || direct {
            mg
        } else if mg <= 16 || mg == 48 {
            mg.div_ceil(16) * 16
        } else {
            mg.div_ceil(32) * 32
        };
        total += work;
        aligned += work * mg as f64 / padded as f64;
    }
    (aligned, total)
}

/// Where axis `a` of an NCHW (or NCDHW) tensor lands channels-last.
fn nhwc_axis(sp: usize, a: usize) -> usize {
    to_nhwc_perm(sp, sp + 2).iter().position(|&p| p == a).unwrap_or(a)
}

/// The transpose of a channels-last region value of rank `r` back to `[N, c.., *S]`.
fn to_nchw_perm(sp: usize, r: usize) -> Vec<usize> {
    super::inverse(&to_nhwc_perm(sp, r))
}

struct Rewriter {
    /// The region's spatial axes.
    sp: usize,
    /// Region value (NCHW) → its NHWC counterpart.
    nhwc: HashMap<ValueId, ValueId>,
    /// Outside value → its NHWC transpose (one per distinct entry).
    entries: HashMap<ValueId, ValueId>,
}

impl Rewriter {
    /// `transpose(x, perm)`, or a reshape when the permutation only moves size-1 axes
    /// (e.g. `[N, C, 1, 1]` ⇄ `[N, 1, 1, C]` after a global pool): the data order is then
    /// unchanged.
    fn transpose(g: &mut Graph, x: ValueId, perm: &[usize]) -> Result<ValueId, IrError> {
        let shape = &g.value(x).ty.shape;
        let big: Vec<usize> = perm
            .iter()
            .copied()
            .filter(|&a| shape.get(a) != Some(&Dim::Fixed(1)))
            .collect();
        if perm.len() == shape.len() && big.windows(2).all(|w| w[0] < w[1]) {
            let shape = perm.iter().map(|&a| shape[a]).collect();
            return g.add(Op::Layout(LayoutOp::Reshape { shape }), &[x]);
        }
        g.add(
            Op::Layout(LayoutOp::Transpose {
                perm: perm.to_vec(),
            }),
            &[x],
        )
    }

    /// The channels-last form of a region value (rank >= 4).
    fn nhwc_of(&mut self, g: &mut Graph, x: ValueId) -> Result<ValueId, IrError> {
        if let Some(&v) = self.nhwc.get(&x).or_else(|| self.entries.get(&x)) {
            return Ok(v);
        }
        let r = g.value(x).ty.rank();
        if !region_rank(self.sp, r) {
            return Err(IrError::Graph(format!(
                "rank-{r} value read as a channels-last region value"
            )));
        }
        let v = Self::transpose(g, x, &to_nhwc_perm(self.sp, r))?;
        self.entries.insert(x, v);
        Ok(v)
    }

    /// An elementwise operand in channels-last form: of the region's rank transposed,
    /// all-ones shapes unchanged, lower ranks reshaped to the region's rank (leading ones, as
    /// broadcasting aligns them) and transposed.
    fn operand(&mut self, g: &mut Graph, x: ValueId) -> Result<ValueId, IrError> {
        let shape = g.value(x).ty.shape.clone();
        let rank = self.sp + 2;
        if shape.len() == rank {
            return self.nhwc_of(g, x);
        }
        if shape.iter().all(|d| *d == Dim::Fixed(1)) {
            return Ok(x);
        }
        if shape.len() > rank {
            return Err(IrError::Graph(format!(
                "operand of rank > {rank} in a rank-{rank} region"
            )));
        }
        let mut full = vec![Dim::Fixed(1); rank - shape.len()];
        full.extend(shape);
        let r = g.add(Op::Layout(LayoutOp::Reshape { shape: full }), &[x])?;
        Self::transpose(g, r, &to_nhwc_perm(self.sp, rank))
    }

    /// The channels-last counterpart of node `ni`, added to the graph; records the NHWC
    /// form of its rank-4 outputs.
    fn node(&mut self, g: &mut Graph, ni: usize) -> Result<(), IrError> {
        let n = g.nodes()[ni].clone();
        let name = format!("{}.nhwc", n.name);
        let first = |g: &mut Graph, s: &mut Self| -> Result<Vec<ValueId>, IrError> {
            let mut ins = n.inputs.clone();
            if let Some(x) = ins.first_mut() {
                *x = s.nhwc_of(g, *x)?;
            }
            Ok(ins)
        };
        let adapted: Option<(Op, Vec<ValueId>)> = match &n.op {
            Op::Linalg(
                l @ (LinalgOp::Conv { .. }
                | LinalgOp::Pool {
                    kind: PoolKind::Avg { .. } | PoolKind::Lp { .. },
                    ..
                }
                | LinalgOp::Pool {
                    kind: PoolKind::Max { indices: false, .. },
                    ..
                }
                | LinalgOp::GlobalPool { .. }),
            ) => Some((Op::Linalg(l.with_channels_last(true)), first(g, self)?)),
            op if spatial_pool(op).is_some() => {
                let kind = spatial_pool(op).unwrap_or(PoolKind::Avg { count_include_pad: false });
                Some((Op::Linalg(LinalgOp::GlobalPool { kind, channels_last: true }), first(g, self)?))
            }
            Op::Norm(nm @ (NormOp::BatchNorm { .. } | NormOp::GroupNorm { .. } | NormOp::Lrn { .. })) => {
                match nm.with_channels_last(true) {
                    Some(cl) => Some((Op::Norm(cl), first(g, self)?)),
                    None => None,
                }
            }
            Op::Layout(LayoutOp::Reshape { .. }) => {
                // `[N, H, W, c..]` → `[N, H, W, c'..]`: the output shape, channels last.
                let out = &g.value(n.outputs[0]).ty.shape;
                let shape = to_nhwc_perm(self.sp, out.len()).iter().map(|&i| out[i]).collect();
                Some((Op::Layout(LayoutOp::Reshape { shape }), first(g, self)?))
            }
            Op::Layout(LayoutOp::Transpose { perm }) => {
                // y = x.permute(p) and x_l = x.permute(L): y.permute(L) = x_l.permute(q)
                // with q[i] = L⁻¹[p[L[i]]].
                let l = to_nhwc_perm(self.sp, perm.len());
                let linv = super::inverse(&l);
                let perm = l.iter().map(|&li| linv[perm[li]]).collect();
                Some((Op::Layout(LayoutOp::Transpose { perm }), first(g, self)?))
            }
            Op::Unary(_) | Op::Cast { .. } => Some((n.op.clone(), first(g, self)?)),
            Op::Binary(_) | Op::Where => {
                let mut ins = Vec::with_capacity(n.inputs.len());
                for &x in &n.inputs {
                    ins.push(self.operand(g, x)?);
                }
                Some((n.op.clone(), ins))
            }
            Op::Layout(LayoutOp::Concat { axis }) => {
                let mut ins = Vec::with_capacity(n.inputs.len());
                for &x in &n.inputs {
                    if g.value(x).ty.rank() != self.sp + 2 {
                        return Err(IrError::Graph(format!("concat operand not rank {}", self.sp + 2)));
                    }
                    ins.push(self.nhwc_of(g, x)?);
                }
                let axis = nhwc_axis(self.sp, *axis);
                Some((Op::Layout(LayoutOp::Concat { axis }), ins))
            }
            Op::Norm(NormOp::Softmax { axis }) => Some((
                Op::Norm(NormOp::Softmax {
                    axis: nhwc_axis(self.sp, *axis),
                }),
                first(g, self)?,
            )),
            Op::Norm(NormOp::LogSoftmax { axis }) => Some((
                Op::Norm(NormOp::LogSoftmax {
                    axis: nhwc_axis(self.sp, *axis),
                }),
                first(g, self)?,
            )),
            _ => None,
        };
        match adapted {
            Some((op, ins)) => {
                let outs = g.add_node(&name, op, &ins)?;
                for (&o, &v) in n.outputs.iter().zip(&outs) {
                    if region_rank(self.sp, g.value(o).ty.rank()) {
                        self.nhwc.insert(o, v);
                    }
                }
            }
            None => {
                // Wrapped: runs NCHW on transposed-back region values.
                let mut ins = Vec::with_capacity(n.inputs.len());
                for &x in &n.inputs {
                    ins.push(match self.nhwc.get(&x) {
                        Some(&v) => {
                            let r = g.value(v).ty.rank();
                            Self::transpose(g, v, &to_nchw_perm(self.sp, r))?
                        }
                        None => x,
                    });
                }
                let outs = g.add_node(&name, n.op.clone(), &ins)?;
                for (&o, &v) in n.outputs.iter().zip(&outs) {
                    g.replace_all_uses(o, v)?;
                    let r = g.value(v).ty.rank();
                    if region_rank(self.sp, r) {
                        let t = Self::transpose(g, v, &to_nhwc_perm(self.sp, r))?;
                        self.nhwc.insert(o, t);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Rewrites the NHWC regions of `plan` (computed on `g`) to channels-last. Returns the
/// number of regions rewritten. On error the graph may be partly edited: callers work on
/// a copy.
pub fn apply_plan(g: &mut Graph, plan: &LayoutPlan) -> Result<usize, IrError> {
    let mut by_name: HashMap<&str, Option<usize>> = HashMap::new();
    for (i, n) in g.nodes().iter().enumerate() {
        by_name
            .entry(n.name.as_str())
            .and_modify(|e| *e = None)
            .or_insert(Some(i));
    }
    let mut todo: Vec<(usize, Vec<usize>)> = Vec::new();
    for r in plan.regions.iter().filter(|r| r.layout == Layout::Nhwc) {
        let idx: Option<Vec<usize>> = r
            .nodes
            .iter()
            .map(|nm| by_name.get(nm.as_str()).copied().flatten())
            .collect();
        if let Some(idx) = idx {
            todo.push((r.spatial, idx));
        }
    }
    if todo.is_empty() {
        return Ok(0);
    }
    for (sp, members) in &todo {
        let mut rw = Rewriter {
            sp: *sp,
            nhwc: HashMap::new(),
            entries: HashMap::new(),
        };
        for &ni in members {
            rw.node(g, ni)?;
        }
        // Every region value gets its NCHW form back for readers outside the region;
        // `cleanup` drops the unread ones along with the old nodes.
        let mut outs: Vec<(ValueId, ValueId)> = rw.nhwc.iter().map(|(&o, &v)| (o, v)).collect();
        outs.sort_unstable();
        for (o, v) in outs {
            let back = Rewriter::transpose(g, v, &to_nchw_perm(*sp, g.value(v).ty.rank()))?;
            g.replace_all_uses(o, back)?;
        }
    }
    g.cleanup()?;
    Ok(todo.len())
}

/// The number of transposes whose input is not known at compile time (constant folding
/// turns the others into permuted constants), not counting those that cancel: a transpose
/// of a transpose that composes to the identity, and a transpose read only by such
/// transposes (simplification removes both).
fn runtime_transposes(g: &Graph) -> usize {
    let perm_of = |v: ValueId| {
        g.producer(v).and_then(|p| match &g.node(p).op {
            Op::Layout(LayoutOp::Transpose { perm }) => Some(perm.clone()),
            _ => None,
        })
    };
    let cancels = |inner: &[usize], outer: &[usize]| {
        inner.len() == outer.len() && outer.iter().enumerate().all(|(i, &q)| inner.get(q) == Some(&i))
    };
    let uses = g.uses();
    let mut known = vec![false; g.values().len()];
    let mut count = 0;
    for n in g.nodes() {
        let is_known = |v: &ValueId| g.const_value(*v).is_some() || known[v.index()];
        let all_known = n.inputs.iter().all(is_known);
        if let (Op::Layout(LayoutOp::Transpose { perm }), false) = (&n.op, all_known) {
            let undone = perm_of(n.inputs[0]).is_some_and(|inner| cancels(&inner, perm));
            let u = &uses[n.outputs[0].index()];
            let only_undone = u.by_output.is_empty()
                && !u.by_node.is_empty()
                && u.by_node.iter().all(|(m, _)| {
                    matches!(&g.node(*m).op, Op::Layout(LayoutOp::Transpose { perm: q }) if cancels(perm, q))
                });
            if !undone && !only_undone {
                count += 1;
            }
        }
        if all_known {
            for &o in &n.outputs {
                known[o.index()] = true;
            }
        }
    }
    count
}

/// The `choose-layout` pass: computes the plan, keeps it for
/// [`ChooseLayout::last_plan`], and applies its NHWC regions ([`apply_plan`]).
pub struct ChooseLayout {
    pub target: TargetKind,
    last: Mutex<Option<LayoutPlan>>,
}

impl ChooseLayout {
    pub fn new(target: TargetKind) -> ChooseLayout {
        ChooseLayout {
            target,
            last: Mutex::new(None),
        }
    }

    /// The plan of the last run.
    pub fn last_plan(&self) -> Option<LayoutPlan> {
        self.last.lock().ok().and_then(|p| p.clone())
    }
}

impl Pass for ChooseLayout {
    fn name(&self) -> &'static str {
        "choose-layout"
    }

    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        // Sequence-to-image views around convolutions, rewritten to enter and leave from
        // channels-last (`seq.rs`); kept only with an NHWC rewrite that uses them.
        let mut seq = g.clone();
        let normalized = matches!(super::seq::normalize(&mut seq), Ok(n) if n > 0) && seq.cleanup().is_ok();
        let base: &Graph = if normalized { &seq } else { g };
        let plan = plan_layout(base, self.target);
        let mut changed = false;
        if plan.nhwc_regions() > 0 {
            let mut h = base.clone();
            // Keep the rewrite only when it stays within the plan's budget: the boundary
            // transposes it priced for each NHWC region, and at least one in and one out (a
            // region entered by a second input or left twice, as a segmentation head's
            // upsampled pooling branch, pays for them). Ops that must stay NCHW inside a
            // region (e.g. an instance norm) cost two more each, which the plan does not
            // price. Transposes of constants (permuted weights and per-channel operands)
            // fold away and are not counted.
            let priced: usize = plan
                .regions
                .iter()
                .filter(|r| r.layout == Layout::Nhwc)
                .map(|r| (r.entry_transposes + r.exit_transposes).max(2))
                .sum();
            let budget = runtime_transposes(base) + priced;
            if let Ok(n) = apply_plan(&mut h, &plan) {
                if n > 0 && runtime_transposes(&h) <= budget {
                    *g = h;
                    changed = true;
                }
            }
        }
        if let Ok(mut l) = self.last.lock() {
            *l = Some(plan);
        }
        Ok(changed)
    }
}
