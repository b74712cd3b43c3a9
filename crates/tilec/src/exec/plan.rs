//! Loading a prepared model on a back end: compile and load the kernels, plan the arena over
//! the steps' lifetimes, store the constants kernels read, place the status slots and bind
//! every kernel to its argument addresses.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use tilec_ir::{Graph, ValueDef, ValueId};
use tilec_runtime::{BufferReq, MemoryPlan};

use super::steps::{Prepared, Step, StepKind};
use super::{Backend, Exec, Executor, Segment, Slot, XStep, STATUS_STRIDE};
use crate::Error;

/// The arena values of a step sequence (graph inputs and step outputs, by id) with the first and
/// last step that touches each; graph outputs live past the last step.
fn lifetimes(g: &Graph, steps: &[Step]) -> Vec<(ValueId, usize, usize)> {
    let mut first: HashMap<ValueId, usize> = HashMap::new();
    let mut last: HashMap<ValueId, usize> = HashMap::new();
    for &v in g.inputs() {
        first.insert(v, 0);
        last.insert(v, 0);
    }
    for (i, st) in steps.iter().enumerate() {
        for &v in &st.outputs {
            first.entry(v).or_insert(i);
            last.insert(v, i);
        }
        for &v in &st.args {
            if first.contains_key(&v) {
                last.insert(v, i);
            }
        }
    }
    for &v in g.outputs() {
        if first.contains_key(&v) {
            last.insert(v, steps.len());
        }
    }
    let mut order: Vec<ValueId> = first.keys().copied().collect();
    order.sort();
    order.into_iter().map(|v| (v, first[&v], last[&v])).collect()
}

/// Cuts the steps into runs of kernels and single host steps.
fn segments<K>(steps: &[XStep<K>]) -> Vec<Segment> {
    let mut out = vec![];
    let mut i = 0;
    while i < steps.len() {
        if matches!(steps[i].exec, Exec::Host(_)) {
            out.push(Segment::Host(i));
            i += 1;
            continue;
        }
        let s = i;
        while i < steps.len() && matches!(steps[i].exec, Exec::Kernel(_)) {
            i += 1;
        }
        out.push(Segment::Device(s..i));
    }
    out
}

/// The in-place hints of `paged_attention` kernels: each new cache on its old cache's storage
/// (the op allows it: nothing else reads the old cache; the planner honours the hint only when
/// the old cache's last reader is that kernel, else the kernel copies the cache first).
fn paged_in_place<K>(g: &Graph, steps: &[(Step, Option<K>)], lives: &[(ValueId, usize, usize)], mut reqs: Vec<BufferReq>) -> Vec<BufferReq> {
    let index: HashMap<ValueId, usize> = lives.iter().enumerate().map(|(i, &(v, _, _))| (v, i)).collect();
    for (st, k) in steps {
        let ([n], true) = (st.nodes.as_slice(), k.is_some()) else { continue };
        let node = g.node(*n);
        if !matches!(node.op, tilec_ir::Op::Nn(tilec_ir::op::NnOp::PagedAttention { .. })) || node.inputs.len() != 7 || node.outputs.len() != 3 {
            continue;
        }
        for (old, new) in [(node.inputs[3], node.outputs[1]), (node.inputs[4], node.outputs[2])] {
            if let (Some(&o), Some(&w)) = (index.get(&old), index.get(&new)) {
                reqs[w].inplace_of = Some(o);
            }
        }
    }
    reqs
}

impl<B: Backend> Executor<B> {
    /// Loads a prepared model on `backend` (see the module documentation).
    pub fn load(prep: Prepared<B::Build>, mut backend: B) -> Result<Executor<B>, Error> {
        let Prepared { graph: g, steps: planned, kernels, interpreted, mut report, .. } = prep;
        let t0 = Instant::now();
        if interpreted {
            return Ok(Executor {
                graph: g,
                steps: vec![],
                segments: vec![],
                slots: HashMap::new(),
                reqs: vec![],
                plan: MemoryPlan::default(),
                status_offset: 0,
                checked: vec![],
                interpreted,
                resident: vec![],
                report,
                backend,
            });
        }

        // Compile and load; the nodes of a kernel that does not load run on the host.
        let mut loaded: Vec<Option<Result<B::Loaded, String>>> =
            backend.load(&kernels, &mut report)?.into_iter().map(Some).collect();
        if loaded.len() != kernels.len() {
            return Err(Error::Compile(format!("{} kernels built, {} loaded", kernels.len(), loaded.len())));
        }
        report.codegen = t0.elapsed();
        let mut steps: Vec<(Step, Option<B::Loaded>)> = vec![];
        for st in planned {
            let StepKind::Kernel(i) = st.kind else {
                steps.push((st, None));
                continue;
            };
            match loaded.get_mut(i).and_then(Option::take) {
                Some(Ok(k)) => steps.push((st, Some(k))),
                Some(Err(e)) => {
                    for &n in &st.nodes {
                        report.fallbacks.push((g.node(n).op.name().to_string(), format!("kernel {}: {e}", st.name)));
                        steps.push((Step::host(&g, n, &st.name), None));
                    }
                }
                None => return Err(Error::Compile(format!("kernel {} is missing or used twice", st.name))),
            }
        }
        report.kernels = steps.iter().filter(|s| s.1.is_some()).count();

        // Constants kernels read live for the model's lifetime; graph inputs and step outputs
        // in the arena; then one status slot per kernel that checks indices.
        let t_const = Instant::now();
        let mut slots: HashMap<ValueId, Slot> = HashMap::new();
        let kernel_args: HashSet<ValueId> =
            steps.iter().filter(|s| s.1.is_some()).flat_map(|s| s.0.args.iter().copied()).collect();
        for v in g.value_ids() {
            if let ValueDef::Const(t) = &g.value(v).def {
                if kernel_args.contains(&v) {
                    let addr = backend.constant(&g.value(v).name, t)?;
                    report.const_bytes += t.numel() * t.dtype().size_bytes();
                    slots.insert(v, Slot::Const(addr));
                }
            }
        }
        report.phases.push(("constants", t_const.elapsed()));
        let t_arena = Instant::now();
        let plain: Vec<Step> = steps.iter().map(|s| s.0.clone()).collect();
        let lives = lifetimes(&g, &plain);
        let reqs: Vec<BufferReq> = lives
            .iter()
            .map(|&(v, first, last)| BufferReq {
                size: g.value(v).ty.byte_size().unwrap_or(0).max(1),
                align: B::ALIGN,
                first,
                last,
                inplace_of: None,
            })
            .collect();
        let reqs = paged_in_place(&g, &steps, &lives, reqs);
        let plan = tilec_runtime::plan(&reqs);
        for (i, &(v, _, _)) in lives.iter().enumerate() {
            slots.insert(v, Slot::Arena(plan.offsets[i]));
        }
        report.arena_bytes = plan.arena_bytes;
        report.intermediate_bytes = plan.total_bytes;
        report.inplace = plan.inplace;
        let checked: Vec<usize> = (0..steps.len()).filter(|&i| steps[i].1.is_some() && !steps[i].0.checks.is_empty()).collect();
        let status_offset = plan.arena_bytes.next_multiple_of(B::ALIGN);
        backend.alloc(status_offset + checked.len() * STATUS_STRIDE)?;
        report.phases.push(("arena", t_arena.elapsed()));
        let t_bind = Instant::now();

        // Bind every kernel to its addresses (the arena and the constants never move).
        let base = backend.base();
        let mut xsteps = vec![];
        for (si, (info, k)) in steps.into_iter().enumerate() {
            let status = checked.iter().position(|&c| c == si);
            let exec = match k {
                None => match info.kind {
                    StepKind::Host(n) => Exec::Host(n),
                    StepKind::Kernel(_) => {
                        return Err(Error::Compile(format!("kernel {} was not loaded", info.name)))
                    }
                },
                Some(k) => {
                    let mut ptrs = vec![];
                    let mut constant = vec![];
                    for &v in &info.args {
                        match slots.get(&v) {
                            Some(&Slot::Arena(o)) => ptrs.push(base + o as u64),
                            Some(&Slot::Const(a)) => ptrs.push(a),
                            None => {
                                return Err(Error::Compile(format!("value '{}' has no storage", g.value(v).name)))
                            }
                        }
                        constant.push(matches!(slots.get(&v), Some(Slot::Const(_))));
                    }
                    if let Some(j) = status {
                        ptrs.push(base + (status_offset + j * STATUS_STRIDE) as u64);
                    }
                    Exec::Kernel(backend.bind(k, &info.name, ptrs, &constant)?)
                }
            };
            let params = report.decisions.iter().find(|(n, _)| *n == info.name).map(|(_, d)| d.params.to_string()).unwrap_or_default();
            let described = match &exec {
                Exec::Kernel(k) => backend.describe(k),
                Exec::Host(_) => String::new(),
            };
            let detail = [params, described].into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>().join("; ");
            let label = match info.family {
                Some(f) => format!("{} [{f}]", info.name),
                None => format!("{} [interpreter]", info.name),
            };
            xsteps.push(XStep { info, exec, label, detail });
        }
        report.phases.push(("bind", t_bind.elapsed()));
        let segments = segments(&xsteps);
        let inputs = g.inputs().len();
        report.graphs = segments.iter().filter(|s| matches!(s, Segment::Device(_))).count();
        report.total += t0.elapsed();
        Ok(Executor {
            graph: g,
            steps: xsteps,
            segments,
            slots,
            reqs,
            plan,
            status_offset,
            checked,
            interpreted,
            resident: vec![false; inputs],
            report,
            backend,
        })
    }
}
