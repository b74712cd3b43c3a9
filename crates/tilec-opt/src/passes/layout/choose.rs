//! `choose-layout`: picks NCHW or NHWC (channels-last) for each convolution region of a
//! graph, per [`TargetKind`].
//!
//! A *region* is a connected set of rank-4 nodes that contains at least one convolution or
//! pool: the layout-sensitive ops (conv, pool, global pool, batch/instance norm, LRN) plus
//! the layout-agnostic ops between them (elementwise, cast, concat, softmax), connected
//! through rank-4 values. Switching a region to NHWC costs one transpose per distinct
//! non-constant value entering it and one per value leaving it (sinking removes any in
//! between); constants (conv weights `OIHW → OHWI`, per-channel `[C,1,1]` operands) are
//! permuted at compile time for free.
//!
//! Decision:
//! - [`TargetKind::Cuda`]: NHWC when the region has convolutions and its boundary transposes
//!   are no more than its convolutions. Tensor-core convolutions (cuDNN, CUTLASS implicit
//!   GEMM) work channels-last: with NCHW tensors the library transposes in and out around
//!   every conv, so one boundary transpose per conv at most is always a win.
//! - [`TargetKind::Cpu`]: NCHW, always. The CPU path lowers convs to im2col + GEMM or direct
//!   loops, for which NCHW and NHWC cost about the same, so boundary transposes would be
//!   pure overhead; the layout that does pay on CPUs is a blocked one (`NCHW[x]c`,
//!   oneDNN-style, vector-width channel blocks), which is future work.
//!
//! Status: the IR's conv/pool/norm ops are NCHW only, so this pass does not rewrite the
//! graph yet: it computes the [`LayoutPlan`] (which regions would switch, how many
//! transposes that takes, which axis attributes would be remapped) and exposes it through
//! [`plan_layout`] / [`ChooseLayout::last_plan`]. Once the IR grows an NHWC attribute on
//! conv/pool/batch-norm, the rewrite is: permute constants, remap axes of the region's
//! agnostic ops, put `transpose(0,2,3,1)` on each entry and `transpose(0,3,1,2)` on each
//! exit, and let `sink-transposes` clean up.

use crate::partition::TargetKind;
use crate::{OptError, Pass};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use tilec_ir::op::{LayoutOp, LinalgOp, NormOp};
use tilec_ir::{Graph, Op, ValueId};

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
                "  region {i}: {} nodes ({} conv, {} pool, {} norm, {} agnostic), {} axis remaps, {} constants; boundary {} in + {} out -> {:?}: {}\n",
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
        Op::Norm(NormOp::BatchNorm { .. } | NormOp::InstanceNorm { .. } | NormOp::Lrn { .. }) => {
            Role::Norm
        }
        Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } => {
            Role::Agnostic { remaps_axis: false }
        }
        Op::Layout(LayoutOp::Concat { .. })
        | Op::Norm(NormOp::Softmax { .. } | NormOp::LogSoftmax { .. }) => {
            Role::Agnostic { remaps_axis: true }
        }
        _ => return None,
    })
}

fn find(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// Computes the layout plan of `g` for `target` (the graph is not changed).
pub fn plan_layout(g: &Graph, target: TargetKind) -> LayoutPlan {
    let nn = g.nodes().len();
    let rank4 = |v: ValueId| g.value(v).ty.rank() == 4;
    // A node is eligible when it has a role and its first input and output are rank 4.
    let eligible: Vec<bool> = g
        .nodes()
        .iter()
        .map(|n| {
            role(&n.op).is_some()
                && n.outputs.first().is_some_and(|&o| rank4(o))
                && n.inputs.first().is_some_and(|&x| rank4(x))
        })
        .collect();
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
                } else if rank4(x) && !g.producer(x).is_some_and(|p| inside.contains(&p.index())) {
                    entries.insert(x);
                }
            }
            for &o in &n.outputs {
                let u = &uses[o.index()];
                if rank4(o)
                    && (!u.by_output.is_empty()
                        || u.by_node.iter().any(|(m, _)| !inside.contains(&m.index())))
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
            TargetKind::Cpu => (Layout::Nchw, "cpu keeps NCHW (im2col/direct conv is layout-neutral; blocked NCHWc is future work)".to_string()),
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
        });
    }
    LayoutPlan { target, regions }
}

/// The `choose-layout` pass: computes the plan (see the module doc: no rewrite yet, the
/// IR's convolutions are NCHW only) and keeps it for [`ChooseLayout::last_plan`].
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
        let plan = plan_layout(g, self.target);
        if let Ok(mut l) = self.last.lock() {
            *l = Some(plan);
        }
        Ok(false)
    }
}
