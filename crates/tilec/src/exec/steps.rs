//! Planning the steps of a model: optimize, partition, build each group through the back end's
//! families (in consecutive runs of its nodes that build when a group does not build whole; a
//! node that builds on no family runs on the reference interpreter), the producers no group covers, and an order in which every value is
//! produced before it is read.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use tilec_ir::{Graph, NodeId, ValueDef, ValueId};
use tilec_opt::manager::{Pipeline, PipelineOptions};
use tilec_opt::partition::{partition, GroupKind, Target};
use tilec_tile::family::{describe_rejections, Choices, Decision, Problem};
use tilec_tile::CheckSite;

use super::{fixed_shape, Build, Report};
use crate::Error;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum StepKind {
    /// Index into the prepared kernels.
    Kernel(usize),
    /// A node on the reference interpreter.
    Host(NodeId),
}

/// One step: a built kernel or a node on the interpreter.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    pub name: String,
    pub kind: StepKind,
    /// Arguments in ABI order (kernel: inputs then outputs; host step: the node's inputs).
    pub args: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// The graph nodes the step computes, in order.
    pub nodes: Vec<NodeId>,
    /// The kernel's index check sites.
    pub checks: Vec<CheckSite>,
    /// The family that built the kernel.
    pub family: Option<&'static str>,
    pub bytes: f64,
    pub flops: f64,
}

impl Step {
    pub(crate) fn host(g: &Graph, n: NodeId, prefix: &str) -> Step {
        let node = g.node(n);
        Step {
            name: format!("{prefix}_host_{}", node.op.name()),
            kind: StepKind::Host(n),
            args: node.inputs.clone(),
            outputs: node.outputs.clone(),
            nodes: vec![n],
            checks: vec![],
            family: None,
            bytes: 0.0,
            flops: 0.0,
        }
    }
}

/// What a kernel was built from: enough to rebuild its [`Problem`] on the prepared graph (the
/// tuner builds every candidate of a kernel from it).
#[derive(Clone, Debug)]
pub struct ProblemSpec {
    pub name: String,
    pub nodes: Vec<NodeId>,
    pub kind: GroupKind,
    pub anchor: Option<NodeId>,
}

/// A model optimized, partitioned and built for a target (no device needed).
pub struct Prepared<K: Build> {
    pub(crate) graph: Graph,
    pub(crate) steps: Vec<Step>,
    pub(crate) kernels: Vec<K::Built>,
    /// Per kernel (same order), its problem.
    pub(crate) problems: Vec<ProblemSpec>,
    pub(crate) interpreted: bool,
    pub report: Report,
}

impl<K: Build> Prepared<K> {
    /// The optimized, specialized graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// The kernels, as built.
    pub fn kernels(&self) -> &[K::Built] {
        &self.kernels
    }
    /// Number of steps (kernels and host nodes).
    pub fn steps(&self) -> usize {
        self.steps.len()
    }
    /// Per kernel (in the order of [`Prepared::kernels`]), what it was built from.
    pub fn problems(&self) -> &[ProblemSpec] {
        &self.problems
    }
    /// Kernel `i`'s problem on the prepared graph.
    pub fn problem(&self, i: usize) -> Option<Problem<'_>> {
        let s = self.problems.get(i)?;
        Some(Problem::new(&self.graph, s.nodes.clone(), &s.name, s.kind, s.anchor))
    }
    /// Whether the whole graph runs on the interpreter.
    pub fn interpreted(&self) -> bool {
        self.interpreted
    }
}

/// Optimizes `graph` (concrete shapes) at `opt_level` for the target's kind, partitions it and
/// builds every kernel for the target.
pub fn prepare<K: Build>(
    graph: &Graph,
    opt_level: u8,
    builder: &K,
    target: &Target,
    choices: &Choices,
) -> Result<Prepared<K>, Error> {
    let t0 = Instant::now();
    builder.check_forced(choices.forced).map_err(Error::Compile)?;
    let kind = target.kind;
    let mut g = graph.clone();
    // On CUDA, attention is recognized only with the FlashAttention opt-in.
    let cuda_flash = kind == tilec_opt::target::TargetKind::Cuda && target.gpu.flash_attention;
    let pipe = Pipeline::for_level_target_with(opt_level, kind, cuda_flash);
    pipe.run(&mut g, &PipelineOptions::default()).map_err(|e| Error::Compile(e.to_string()))?;
    let mut report = Report { optimize: t0.elapsed(), ..Default::default() };

    // Shapes that stay symbolic after specialization are data-dependent (NonZero, ...): such a
    // graph runs on the reference interpreter as a whole.
    if let Some(v) = g.value_ids().find(|&v| fixed_shape(&g, v).is_none()) {
        let val = g.value(v);
        let dims: Vec<String> = val.ty.shape.iter().map(|&d| g.syms.display(d)).collect();
        report.fallbacks.push((
            "graph".into(),
            format!("value '{}' has a data-dependent shape [{}]", val.name, dims.join(", ")),
        ));
        report.total = t0.elapsed();
        return Ok(Prepared { graph: g, steps: vec![], kernels: vec![], problems: vec![], interpreted: true, report });
    }

    let t1 = Instant::now();
    // The partition's cost model plans for the kind's reference machine.
    let part = partition(&g, &Target::preset(kind));
    let mut kernels: Vec<K::Built> = vec![];
    let mut problems: Vec<ProblemSpec> = vec![];
    let mut steps: Vec<Step> = vec![];
    for grp in &part.groups {
        let name = format!("k{}_{}", grp.id, grp.kind.to_string().to_lowercase());
        let whole = Problem::of_group(&g, grp, &name);
        let why = match builder.build(&whole, target, choices) {
            Ok(built) => {
                steps.push(kernel_step::<K>(&whole, built, (grp.bytes, grp.flops), (&mut kernels, &mut problems), &mut report));
                continue;
            }
            Err(why) => why,
        };
        if grp.nodes.len() == 1 {
            report.fallbacks.push((g.node(grp.nodes[0]).op.name().to_string(), describe_rejections(&why)));
            steps.push(Step::host(&g, grp.nodes[0], &name));
            continue;
        }
        report.split_groups += 1;
        let pieces = split_group(&g, &grp.nodes, &name, builder, target, choices);
        report.notes.push((
            name.clone(),
            format!("the group did not build whole ({}); built as {} kernels", describe_rejections(&why), pieces.len()),
        ));
        let n_all = grp.nodes.len() as f64;
        for (p, built) in pieces {
            let share = p.nodes.len() as f64 / n_all;
            match built {
                Ok(built) => {
                    let cost = (grp.bytes * share, grp.flops * share);
                    steps.push(kernel_step::<K>(&p, built, cost, (&mut kernels, &mut problems), &mut report));
                }
                Err(why) => {
                    let n = p.nodes[0];
                    report.fallbacks.push((g.node(n).op.name().to_string(), describe_rejections(&why)));
                    steps.push(Step::host(&g, n, &p.name));
                }
            }
        }
    }
    // Nodes in no group (sources read only inline, or whose value is a graph output) run on
    // the interpreter when a step or the graph outputs need their values.
    for n in uncovered_producers(&g, &steps) {
        steps.push(Step::host(&g, n, &format!("ref_{}", n.index())));
    }
    let steps = order(steps)?;
    report.lower = t1.elapsed();
    report.kernels = kernels.len();
    report.total = t0.elapsed();
    Ok(Prepared { graph: g, steps, kernels, problems, interpreted: false, report })
}

/// A group that did not build whole, as consecutive runs of its nodes (in topological order)
/// that do: each run grows while the nodes so far and the next build together, so a chain of
/// elementwise nodes stays one kernel and a matrix product keeps what fuses with it. A node
/// that builds on no family alone comes back with its rejections (for the interpreter).
#[allow(clippy::type_complexity)]
fn split_group<'g, K: Build>(
    g: &'g Graph,
    nodes: &[NodeId],
    name: &str,
    builder: &K,
    target: &Target,
    choices: &Choices,
) -> Vec<(Problem<'g>, Result<(K::Built, Decision), super::Rejections>)> {
    let mut out = vec![];
    let mut cur: Option<(Problem<'g>, (K::Built, Decision))> = None;
    let mut pieces = 0;
    for &n in nodes {
        if let Some((p, _)) = &cur {
            let mut grown = p.nodes.clone();
            grown.push(n);
            if let Some(q) = Problem::of_nodes(g, grown, &p.name) {
                if let Ok(b) = builder.build(&q, target, choices) {
                    cur = Some((q, b));
                    continue;
                }
            }
        }
        if let Some((p, b)) = cur.take() {
            out.push((p, Ok(b)));
        }
        let p = Problem::of_node(g, n, &format!("{name}_{pieces}"));
        pieces += 1;
        match builder.build(&p, target, choices) {
            Ok(b) => cur = Some((p, b)),
            Err(why) => out.push((p, Err(why))),
        }
    }
    out.extend(cur.map(|(p, b)| (p, Ok(b))));
    out
}

/// The step of a built kernel (its decision goes to the report, the kernel to `kernels`).
fn kernel_step<K: Build>(
    p: &Problem,
    (built, decision): (K::Built, Decision),
    (bytes, flops): (f64, f64),
    (kernels, problems): (&mut Vec<K::Built>, &mut Vec<ProblemSpec>),
    report: &mut Report,
) -> Step {
    let (ins, outs) = K::params(&built);
    let mut args = ins.to_vec();
    args.extend(outs);
    let step = Step {
        name: p.name.clone(),
        kind: StepKind::Kernel(kernels.len()),
        args,
        outputs: outs.to_vec(),
        nodes: p.nodes.clone(),
        checks: K::checks(&built).to_vec(),
        family: Some(decision.family),
        bytes,
        flops,
    };
    report.decisions.push((p.name.clone(), decision));
    kernels.push(built);
    problems.push(ProblemSpec { name: p.name.clone(), nodes: p.nodes.clone(), kind: p.kind, anchor: p.anchor });
    step
}

/// The nodes in no step whose values a step or the graph outputs need, with the uncovered
/// producers of their own inputs, in discovery order.
fn uncovered_producers(g: &Graph, steps: &[Step]) -> Vec<NodeId> {
    let produced: HashSet<ValueId> = steps.iter().flat_map(|s| s.outputs.iter().copied()).collect();
    let mut needed: HashSet<ValueId> = steps.iter().flat_map(|s| s.args.iter().copied()).collect();
    needed.extend(g.outputs().iter().copied());
    let covered: HashSet<NodeId> = steps.iter().flat_map(|s| s.nodes.iter().copied()).collect();
    let mut extra: Vec<NodeId> = g
        .node_ids()
        .filter(|n| !covered.contains(n))
        .filter(|&n| g.node(n).outputs.iter().any(|v| needed.contains(v) && !produced.contains(v)))
        .collect();
    let mut i = 0;
    while i < extra.len() {
        for &v in &g.node(extra[i]).inputs {
            if let ValueDef::Node { node: p, .. } = g.value(v).def {
                if !covered.contains(&p) && !extra.contains(&p) && !produced.contains(&v) {
                    extra.push(p);
                }
            }
        }
        i += 1;
    }
    extra
}

/// Orders the steps so that every value is produced before it is read, keeping the given
/// order (the partition's) where dependencies allow.
pub(crate) fn order(steps: Vec<Step>) -> Result<Vec<Step>, Error> {
    let mut producer: HashMap<ValueId, usize> = HashMap::new();
    for (i, s) in steps.iter().enumerate() {
        for &v in &s.outputs {
            producer.insert(v, i);
        }
    }
    let n = steps.len();
    let mut indeg = vec![0usize; n];
    let mut users: Vec<Vec<usize>> = vec![vec![]; n];
    for (i, s) in steps.iter().enumerate() {
        let mut deps: Vec<usize> = s.args.iter().filter_map(|v| producer.get(v).copied()).filter(|&p| p != i).collect();
        deps.sort();
        deps.dedup();
        indeg[i] = deps.len();
        for p in deps {
            users[p].push(i);
        }
    }
    let mut ready: BTreeSet<usize> = (0..n).filter(|&i| indeg[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            indeg[u] -= 1;
            if indeg[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() != n {
        return Err(Error::Compile("the kernel steps depend on each other in a cycle".into()));
    }
    let mut slots: Vec<Option<Step>> = steps.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}
