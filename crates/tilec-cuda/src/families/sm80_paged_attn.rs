//! `sm80_paged_attn`: the paged decode kernels of [`crate::paged`] for a kernel that is one
//! `paged_attention` node over 16-bit caches. The op has no tile-IR lowering, so the family
//! builds its own parameter list (the node's seven inputs then its three outputs, the order
//! the kernels take) and has no fallback: a node it refuses runs on the host. Plain SIMT code
//! with 16-byte loads: f16 on any device, bf16 from compute capability 8.0.

use tilec_ir::op::NnOp;
use tilec_ir::{DType, Op};
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params as FParams, Problem as FProblem};
use tilec_tile::lower::Lowered;
use tilec_tile::Kernel;

use super::template::{FamilyPlan, OperandRef, PlanKind};
use crate::gemm::Problem;
use crate::paged::{self, PagedProblem, Params};
use crate::render::CudaSource;

/// The family's name.
pub const PAGED_ATTN: &str = "sm80_paged_attn";

/// The problem of a one-node `paged_attention` kernel, or why the family does not take it.
pub fn paged_problem(p: &FProblem) -> Result<PagedProblem, String> {
    let g = p.graph;
    let [n] = p.nodes.as_slice() else {
        return Err(format!("{} nodes (the family takes one paged_attention node alone)", p.nodes.len()));
    };
    let node = g.node(*n);
    let Op::Nn(NnOp::PagedAttention { scale }) = node.op else {
        return Err("not a paged_attention kernel".into());
    };
    if node.inputs.len() != 7 || node.outputs.len() != 3 {
        return Err(format!("{} inputs and {} outputs (expected 7 and 3)", node.inputs.len(), node.outputs.len()));
    }
    let shape = |i: usize| {
        let v = node.inputs[i];
        g.value(v).ty.fixed_shape().ok_or_else(|| format!("input '{}' has a symbolic shape", g.value(v).name))
    };
    let (q, v, kc, bt) = (shape(0)?, shape(2)?, shape(3)?, shape(5)?);
    if q.len() != 4 || v.len() != 4 || kc.len() != 4 || bt.len() != 2 {
        return Err("q, v and k_cache must be 4-D and block_table 2-D".into());
    }
    let dtype = g.value(node.inputs[0]).ty.dtype;
    for &i in &[5, 6] {
        if g.value(node.inputs[i]).ty.dtype != DType::I32 {
            return Err(format!("input {i} must be i32"));
        }
    }
    Ok(PagedProblem {
        batch: q[0],
        heads_q: q[1],
        heads_kv: kc[2],
        new_tokens: q[2],
        head_dim: q[3],
        v_head_dim: v[3],
        blocks: kc[0],
        block_size: kc[1],
        max_blocks: bt[1],
        dtype,
        scale,
    })
}

/// The plan of a problem with parameters.
pub fn paged_plan(problem: PagedProblem, params: Params) -> FamilyPlan {
    // The GEMM-shaped summary reports read: per (sequence, query head), new tokens x value
    // dims over the longest context.
    let mut summary = Problem::new(problem.new_tokens, problem.v_head_dim, problem.context(), problem.dtype);
    summary.batch = problem.batch * problem.heads_q;
    let at = |param| OperandRef { param, offset_bytes: 0 };
    FamilyPlan {
        family: PAGED_ATTN,
        entry: format!("{}_attn", paged::kernel_name(&problem, &params)),
        source: paged::render(&problem, &params),
        problem: summary,
        kind: PlanKind::Paged(Box::new(problem), params),
        a: at(0),
        b: at(3),
    }
}

/// The one-node kernel's parameters: the node's inputs then its outputs.
fn lowered(p: &FProblem) -> Lowered {
    let g = p.graph;
    let node = g.node(p.nodes[0]);
    let mut k = Kernel::new(p.name.clone());
    for &v in node.inputs.iter().chain(&node.outputs) {
        let val = g.value(v);
        let shape = val.ty.fixed_shape().unwrap_or_default().iter().map(|&d| d as i64).collect();
        k.param(val.name.clone(), val.ty.dtype, shape);
    }
    Lowered { kernel: k, inputs: node.inputs.clone(), outputs: node.outputs.clone() }
}

/// The family as the registry holds it.
pub struct Sm80PagedAttn;
pub static SM80_PAGED_ATTN: Sm80PagedAttn = Sm80PagedAttn;

const NAMES: [&str; 4] = ["chunk", "warps", "rows", "unroll"];

fn with_params(q: Params, p: &FParams) -> Params {
    let get = |n: &str, d: usize| p.get(n).map_or(d, |v| v.max(0) as usize);
    Params { chunk: get("chunk", q.chunk), warps: get("warps", q.warps), rows: get("rows", q.rows), unroll: get("unroll", q.unroll) }
}

fn checked(p: &FProblem, t: &Target) -> Result<(PagedProblem, Params), String> {
    let pp = paged_problem(p)?;
    let cc = t.gpu.compute_capability;
    if pp.dtype == DType::BF16 && cc.0 < 8 {
        return Err(format!("bf16 conversions need compute capability 8.0; the device has {}.{}", cc.0, cc.1));
    }
    let q = paged::heuristic(&pp, t.gpu.sm_count as usize);
    paged::applies(&pp, &q)?;
    Ok((pp, q))
}

impl Family for Sm80PagedAttn {
    type Target = Target;
    type Built = super::GpuBuilt;

    fn name(&self) -> &'static str {
        PAGED_ATTN
    }

    fn applies(&self, p: &FProblem, t: &Target) -> Result<(), String> {
        checked(p, t).map(drop)
    }

    fn space(&self, p: &FProblem, _t: &Target) -> ParamSpace {
        let bs = paged_problem(p).map_or(16, |pp| pp.block_size as i64);
        let chunk: Vec<i64> = [256i64, 512, 1024].iter().map(|c| (c + bs - 1) / bs * bs).collect();
        ParamSpace { axes: vec![("chunk", chunk), ("warps", vec![4, 8]), ("unroll", vec![2, 4, 8])] }
    }

    fn check(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<(), String> {
        let (pp, q) = checked(p, t)?;
        paged::applies(&pp, &with_params(q, params))
    }

    fn heuristic(&self, p: &FProblem, t: &Target) -> FParams {
        checked(p, t)
            .map(|(_, q)| FParams(NAMES.iter().copied().zip([q.chunk, q.warps, q.rows, q.unroll].map(|x| x as i64)).collect()))
            .unwrap_or_default()
    }

    fn build(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<super::GpuBuilt, String> {
        let (pp, q0) = checked(p, t)?;
        let q = with_params(q0, params);
        paged::applies(&pp, &q)?;
        let lowered = lowered(p);
        let plan = paged_plan(pp, q);
        let source = CudaSource { name: plan.entry.clone(), source: plan.source.clone(), launch: plan.launch(t.gpu.sm_count) };
        Ok(super::GpuBuilt {
            scheduled: lowered.kernel.clone(),
            lowered,
            schedule: PAGED_ATTN,
            source,
            plan: Some(plan),
            fallback: None,
        })
    }
}
