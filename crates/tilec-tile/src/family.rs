//! Kernel families and their registry: the one place where an algorithm is chosen for a kernel.
//!
//! A *family* is one way of computing a kind of kernel — BLIS-style GEMM, Winograd convolution,
//! attention as matrix products, a direct loop nest, a row schedule on a GPU, a tensor-core
//! GEMM template — with parameters. Given a [`Problem`] (a kernel group of the graph: its anchor
//! with the fused prologue and epilogue, hence shapes, dtypes and layouts) and the target, a
//! family says whether it [`applies`](Family::applies) (with the reason when not), exposes its
//! parameter [`space`](Family::space) and constraints ([`check`](Family::check)) for the tuner,
//! gives a [`heuristic`](Family::heuristic) default and [`build`](Family::build)s the kernel.
//! What a build produces is the back end's business (a scheduled tile-IR kernel for the CPU; a
//! rendered CUDA source, tile-IR or template, for the GPU), so the trait is generic over it.
//!
//! Families live with their back end (`tilec_cpu::families`, `tilec_cuda::families`), each in
//! its own file, and are listed in the back end's [`Registry`] in the order they are tried.
//! [`dispatch`] walks that list for a problem: a family forced by the user for the problem's op
//! comes first; the parameters come from the tuning database when it knows the problem, else
//! from the heuristic; the first family that applies and builds wins, and every family that
//! did not is recorded with its reason ([`Decision`]), which `tilec explain` prints.

use std::any::Any;
use std::cell::RefCell;
use std::rc::Rc;
use std::fmt;

use tilec_ir::{Graph, NodeId, Op};
use tilec_opt::partition::{cost, kind_of, GroupKind, KernelGroup};

use crate::lower::{lower_nodes_with, LowerError, LowerOptions, Lowered};

/// One kernel to build: a set of nodes of a graph with concrete shapes (a partition group, or
/// one node of a group that did not lower whole).
pub struct Problem<'g> {
    pub graph: &'g Graph,
    /// The nodes, in topological order.
    pub nodes: Vec<NodeId>,
    /// The kernel's name (`k12_gemm`).
    pub name: String,
    /// What kind of kernel the partitioner made of the nodes.
    pub kind: GroupKind,
    /// The node that sets the schedule (GEMM, convolution, reduction, ...), if any.
    pub anchor: Option<NodeId>,
    /// Lowerings done so far, by options (families that lower alike share the work).
    lowered: RefCell<Vec<(LowerOptions, Result<Lowered, LowerError>)>>,
    /// What families derived from the problem, by key (see [`Problem::memo`]).
    derived: RefCell<Vec<(&'static str, Rc<dyn Any>)>>,
}

impl<'g> Problem<'g> {
    /// A problem from its parts (what [`Problem::of_group`] and [`Problem::of_node`] fill in;
    /// the tuner rebuilds the problems of a prepared model from them).
    pub fn new(
        graph: &'g Graph,
        nodes: Vec<NodeId>,
        name: &str,
        kind: GroupKind,
        anchor: Option<NodeId>,
    ) -> Problem<'g> {
        Problem {
            graph,
            nodes,
            name: name.to_string(),
            kind,
            anchor,
            lowered: RefCell::new(vec![]),
            derived: RefCell::new(vec![]),
        }
    }

    /// A whole kernel group.
    pub fn of_group(graph: &'g Graph, group: &KernelGroup, name: &str) -> Problem<'g> {
        Problem {
            graph,
            nodes: group.nodes.clone(),
            name: name.to_string(),
            kind: group.kind,
            anchor: group.anchor,
            lowered: RefCell::new(vec![]),
            derived: RefCell::new(vec![]),
        }
    }

    /// One node on its own (its kind and anchor as the partitioner would classify it).
    pub fn of_node(graph: &'g Graph, node: NodeId, name: &str) -> Problem<'g> {
        let class = cost::classify(&graph.node(node).op);
        let kind = kind_of(class);
        Problem {
            graph,
            nodes: vec![node],
            name: name.to_string(),
            kind,
            anchor: class.is_anchor().then_some(node),
            lowered: RefCell::new(vec![]),
            derived: RefCell::new(vec![]),
        }
    }

    /// Nodes of a group taken together (in topological order), classified as the partitioner
    /// would: the kind of their one anchor, else elementwise, else layout; `None` when they hold
    /// more than one anchor (no family takes several).
    pub fn of_nodes(graph: &'g Graph, nodes: Vec<NodeId>, name: &str) -> Option<Problem<'g>> {
        let classes: Vec<cost::Class> = nodes.iter().map(|&n| cost::classify(&graph.node(n).op)).collect();
        let mut anchors = nodes.iter().zip(&classes).filter(|(_, c)| c.is_anchor());
        let (kind, anchor) = match (anchors.next(), anchors.next()) {
            (Some(_), Some(_)) => return None,
            (Some((&n, &c)), None) => (kind_of(c), Some(n)),
            (None, _) if classes.iter().all(|&c| c == cost::Class::Layout) => (GroupKind::Layout, None),
            (None, _) => (GroupKind::Elementwise, None),
        };
        Some(Problem::new(graph, nodes, name, kind, anchor))
    }

    /// The anchor's op.
    pub fn anchor_op(&self) -> Option<&'g Op> {
        self.anchor.map(|n| &self.graph.node(n).op)
    }

    /// The op a family is chosen for, as `--family OP=NAME` names it: the anchor's op name
    /// (`matmul`, `conv`, `attention`, `softmax`, ...), else the kind of the group
    /// (`elementwise`, `layout`, ...).
    pub fn op(&self) -> String {
        match self.anchor_op() {
            Some(op) => op.name().to_string(),
            None => self.kind.to_string().to_lowercase(),
        }
    }

    /// The problem lowered with `opts` (computed once per options).
    pub fn lower(&self, opts: LowerOptions) -> Result<Lowered, LowerError> {
        if let Some((_, r)) = self.lowered.borrow().iter().find(|(o, _)| *o == opts) {
            return r.clone();
        }
        let r = lower_nodes_with(self.graph, &self.nodes, &self.name, opts);
        self.lowered.borrow_mut().push((opts, r.clone()));
        r
    }

    /// A value a family derives from the problem (a heuristic schedule, a template's plan),
    /// computed once per key: `applies`, `heuristic`, `check` and `build` of one family often
    /// need the same. Keys are the family's own (prefixed with its name).
    pub fn memo<T: Clone + 'static>(&self, key: &'static str, f: impl FnOnce() -> T) -> T {
        if let Some((_, v)) = self.derived.borrow().iter().find(|(k, _)| *k == key) {
            if let Some(t) = v.downcast_ref::<T>() {
                return t.clone();
            }
        }
        let t = f();
        self.derived.borrow_mut().push((key, Rc::new(t.clone())));
        t
    }

    /// A key that identifies the problem across models for the tuning database: the ops of its
    /// nodes with their input and output types, in order.
    pub fn key(&self) -> String {
        let g = self.graph;
        let ty = |v| {
            let t = &g.value(v).ty;
            let dims: Vec<String> = t.shape.iter().map(|&d| g.syms.display(d)).collect();
            format!("{}[{}]", t.dtype, dims.join(","))
        };
        self.nodes
            .iter()
            .map(|&n| {
                let node = g.node(n);
                let ins: Vec<String> = node.inputs.iter().map(|&v| ty(v)).collect();
                let outs: Vec<String> = node.outputs.iter().map(|&v| ty(v)).collect();
                format!("{}({})->{}", node.op.name(), ins.join(","), outs.join(","))
            })
            .collect::<Vec<_>>()
            .join(";")
    }
}

/// A family's parameter values, by name, in the family's order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Params(pub Vec<(&'static str, i64)>);

impl Params {
    pub fn new(values: &[(&'static str, i64)]) -> Params {
        Params(values.to_vec())
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.0.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Params {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(n, v)| format!("{n}={v}")).collect();
        f.write_str(&parts.join(" "))
    }
}

/// The values a family's parameters may take (before its constraints, see [`Family::check`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamSpace {
    pub axes: Vec<(&'static str, Vec<i64>)>,
}

impl ParamSpace {
    /// Every combination of the axes' values (the empty space has one point: no parameters).
    pub fn points(&self) -> Vec<Params> {
        let mut out = vec![Params::default()];
        for (name, values) in &self.axes {
            out = out
                .into_iter()
                .flat_map(|p| {
                    values.iter().map(move |&v| {
                        let mut q = p.clone();
                        q.0.push((name, v));
                        q
                    })
                })
                .collect();
        }
        out
    }

    /// Whether every parameter the space has an axis for takes one of its values.
    pub fn contains(&self, params: &Params) -> Result<(), String> {
        for (name, value) in &params.0 {
            match self.axes.iter().find(|(n, _)| n == name) {
                Some((_, values)) if !values.contains(value) => {
                    return Err(format!("{name}={value} is not one of {values:?}"))
                }
                None => return Err(format!("the family has no parameter '{name}'")),
                _ => {}
            }
        }
        Ok(())
    }
}

/// One way of building a kind of kernel (see the module documentation).
pub trait Family: Sync {
    /// The target description the family reads.
    type Target: ?Sized;
    /// What a build produces.
    type Built;

    /// The family's name (`cpu.blis_gemm`, `cuda.rows`, `sm90_tc_gemm`).
    fn name(&self) -> &'static str;

    /// Whether the family can build the problem on the target, or why not. A family that can
    /// only tell by building may answer `Ok` and fail in [`Family::build`] instead.
    fn applies(&self, p: &Problem, t: &Self::Target) -> Result<(), String>;

    /// Whether the registry may pick the family for the problem when it is not forced (a
    /// library kept off problems the compiler's own kernels should run), or why not. Checked
    /// after [`Family::applies`] holds; a forced family skips it.
    fn by_default(&self, _p: &Problem, _t: &Self::Target) -> Result<(), String> {
        Ok(())
    }

    /// The parameters the tuner may search (empty: none).
    fn space(&self, _p: &Problem, _t: &Self::Target) -> ParamSpace {
        ParamSpace::default()
    }

    /// Whether a point of the space is valid for the problem (beyond lying in the space).
    fn check(&self, p: &Problem, t: &Self::Target, params: &Params) -> Result<(), String> {
        self.space(p, t).contains(params)
    }

    /// The parameters used when nothing better is known.
    fn heuristic(&self, _p: &Problem, _t: &Self::Target) -> Params {
        Params::default()
    }

    /// An analytic estimate of the kernel's time in seconds with these parameters (a roofline
    /// with the family's own losses: tile waste, cache overflow, idle cores), for the tuner's
    /// ordering of candidates; `None` when the family has no model. Only the order of the
    /// estimates matters.
    fn estimate(&self, _p: &Problem, _t: &Self::Target, _params: &Params) -> Option<f64> {
        None
    }

    /// Builds the kernel with the given parameters.
    fn build(&self, p: &Problem, t: &Self::Target, params: &Params) -> Result<Self::Built, String>;
}

/// A family as the registry holds it.
pub type FamilyRef<T, B> = &'static dyn Family<Target = T, Built = B>;

/// One registry entry: a family and the kinds of kernel it is tried for (empty: every kind).
pub struct Entry<T: ?Sized + 'static, B: 'static> {
    pub family: FamilyRef<T, B>,
    pub kinds: &'static [GroupKind],
}

/// A back end's families, in the order they are tried.
pub struct Registry<T: ?Sized + 'static, B: 'static> {
    pub entries: Vec<Entry<T, B>>,
}

impl<T: ?Sized + 'static, B: 'static> Registry<T, B> {
    /// The families tried for a kind of kernel, in order.
    pub fn for_kind(&self, kind: GroupKind) -> impl Iterator<Item = FamilyRef<T, B>> + '_ {
        self.entries.iter().filter(move |e| e.kinds.is_empty() || e.kinds.contains(&kind)).map(|e| e.family)
    }

    /// A family by name.
    pub fn get(&self, name: &str) -> Option<FamilyRef<T, B>> {
        self.entries.iter().map(|e| e.family).find(|f| f.name() == name)
    }

    /// Every family's name, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.family.name()).collect()
    }

    /// Checks `--family` choices against the registry: every family must exist.
    pub fn check_forced(&self, forced: &[(String, String)]) -> Result<(), String> {
        for (op, fam) in forced {
            if self.get(fam).is_none() {
                return Err(format!(
                    "--family {op}={fam}: no family '{fam}' on this target (families: {})",
                    self.names().join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// Parameters found by tuning for a family and a problem (the tuning database, `tilec-tune`).
pub trait Tuned {
    /// The parameters measured best for `family` on a problem like `p` on this machine, if
    /// known.
    fn lookup(&self, family: &str, p: &Problem) -> Option<TunedParams>;
}

/// What the tuning database knows of a problem: parameter values by name (checked against the
/// family's space before use) and how the entry matched (`exact shape`, `shape bucket ...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunedParams {
    pub values: Vec<(String, i64)>,
    pub matched: String,
}

/// What the user asked for: families forced per op, and the tuning database.
#[derive(Clone, Copy, Default)]
pub struct Choices<'a> {
    /// `(op or kernel name, family)`: `--family OP=NAME`; `*` matches every kernel.
    pub forced: &'a [(String, String)],
    /// Families never to use (`--no-winograd` is `cpu.winograd` here).
    pub disabled: &'a [&'a str],
    pub tuned: Option<&'a dyn Tuned>,
}

/// Where a kernel's parameters came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamOrigin {
    /// The family's heuristic.
    Heuristic,
    /// The tuning database.
    Tuned,
    /// The family was forced with `--family` (its heuristic parameters).
    Forced,
}

impl fmt::Display for ParamOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParamOrigin::Heuristic => "heuristic",
            ParamOrigin::Tuned => "tuned",
            ParamOrigin::Forced => "forced",
        })
    }
}

/// The family chosen for a kernel, its parameters and where they came from, and every family
/// tried before it with the reason it was not taken.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub family: &'static str,
    pub params: Params,
    pub origin: ParamOrigin,
    pub rejected: Vec<(&'static str, String)>,
    /// About the origin: how a tuned entry matched, or why tuned parameters were not used.
    pub note: Option<String>,
}

impl Decision {
    /// `family (origin: params)`, then the note in brackets.
    pub fn summary(&self) -> String {
        let s = if self.params.is_empty() {
            format!("{} ({})", self.family, self.origin)
        } else {
            format!("{} ({}: {})", self.family, self.origin, self.params)
        };
        match &self.note {
            Some(n) => format!("{s} [{n}]"),
            None => s,
        }
    }

    /// The rejected families, `name: why; ...`.
    pub fn rejections(&self) -> String {
        describe_rejections(&self.rejected)
    }
}

/// `name: why; name: why`.
pub fn describe_rejections(rejected: &[(&'static str, String)]) -> String {
    rejected.iter().map(|(f, why)| format!("{f}: {why}")).collect::<Vec<_>>().join("; ")
}

/// Tuned values by name as the family's parameters (their names are the space's).
fn resolve(space: ParamSpace, values: &[(String, i64)]) -> Result<Params, String> {
    let mut out = vec![];
    for (name, v) in values {
        match space.axes.iter().find(|(n, _)| n == name) {
            Some((n, _)) => out.push((*n, *v)),
            None => return Err(format!("the family has no parameter '{name}'")),
        }
    }
    Ok(Params(out))
}

/// Whether a `--family` choice names this problem (its op in any case, as ONNX spells it
/// (`MatMul`) or as tilec does (`matmul`); its kernel name; or `*`).
fn forced_for<'a>(p: &Problem, choices: &Choices<'a>) -> Option<&'a str> {
    let op = p.op();
    choices.forced.iter().find(|(o, _)| o == "*" || o.eq_ignore_ascii_case(&op) || *o == p.name).map(|(_, f)| f.as_str())
}

fn attempt<T: ?Sized, B>(
    f: FamilyRef<T, B>,
    p: &Problem,
    t: &T,
    params: &Params,
    by_default: bool,
) -> Result<B, String> {
    f.applies(p, t)?;
    if by_default {
        f.by_default(p, t)?;
    }
    f.check(p, t, params)?;
    f.build(p, t, params)
}

/// Chooses and builds the kernel of a problem: a forced family first, then the registry's
/// families for its kind in order; parameters from the tuning database, else the heuristic.
/// Returns the build and the decision, or every family's reason when none builds.
pub fn dispatch<T: ?Sized, B>(
    reg: &Registry<T, B>,
    p: &Problem,
    t: &T,
    choices: &Choices,
) -> Result<(B, Decision), Vec<(&'static str, String)>> {
    let mut rejected: Vec<(&'static str, String)> = vec![];
    if let Some(name) = forced_for(p, choices) {
        match reg.get(name) {
            Some(f) => {
                let params = f.heuristic(p, t);
                match attempt(f, p, t, &params, false) {
                    Ok(b) => {
                        return Ok((
                            b,
                            Decision { family: f.name(), params, origin: ParamOrigin::Forced, rejected, note: None },
                        ))
                    }
                    Err(why) => rejected.push((f.name(), format!("forced, but {why}"))),
                }
            }
            None => rejected.push(("forced", format!("no family '{name}'"))),
        }
    }
    for f in reg.for_kind(p.kind) {
        if rejected.iter().any(|(n, _)| *n == f.name()) {
            continue;
        }
        if choices.disabled.contains(&f.name()) {
            rejected.push((f.name(), "disabled".into()));
            continue;
        }
        let tuned = choices.tuned.and_then(|db| db.lookup(f.name(), p));
        let mut note = None;
        if let Some(tp) = tuned {
            // Tuned parameters must still name the family's parameters and pass its check
            // (another version of tilec may have stored them); otherwise the heuristic's.
            match resolve(f.space(p, t), &tp.values).and_then(|params| {
                f.applies(p, t)?;
                f.by_default(p, t)?;
                f.check(p, t, &params).map(|()| params)
            }) {
                Ok(params) => match f.build(p, t, &params) {
                    Ok(b) => {
                        let d = Decision {
                            family: f.name(),
                            params,
                            origin: ParamOrigin::Tuned,
                            rejected,
                            note: Some(tp.matched),
                        };
                        return Ok((b, d));
                    }
                    Err(why) => note = Some(format!("tuned parameters did not build ({why}); heuristic used")),
                },
                Err(why) => note = Some(format!("tuned parameters not usable ({why}); heuristic used")),
            }
        }
        let params = f.heuristic(p, t);
        match attempt(f, p, t, &params, true) {
            Ok(b) => {
                return Ok((b, Decision { family: f.name(), params, origin: ParamOrigin::Heuristic, rejected, note }))
            }
            Err(why) => rejected.push((f.name(), why)),
        }
    }
    Err(rejected)
}
