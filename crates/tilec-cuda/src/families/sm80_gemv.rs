//! `sm80_gemv`: the decode-shaped GEMV of [`crate::gemv`] for a kernel that is one `Gemm` over
//! 16-bit operands with at most 16 rows (per batch, or batches of rows flattened against one
//! weight): A row-major, B read K-contiguous, or a constant row-major B repacked once when the
//! kernel is bound. Any device of compute capability 8.0 or later; tried before the GEMM
//! templates, since it takes only such skinny products. Its build carries the SIMT GEMM as a
//! fallback, like the other templates'.

use tilec_ir::ValueDef;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params as FParams, Problem as FProblem};
use tilec_tile::lower::Lowered;

use super::operands::{gemm_view, GemmView};
use super::template::{FamilyPlan, OperandRef, PlanKind};
use crate::gemm::{Layout, Problem};
use crate::gemv::{self, Params};
use crate::render::CudaSource;
use crate::schedule::GpuTarget;

/// The family's name.
pub const GEMV: &str = "sm80_gemv";

/// The family's plan for a lowered kernel (with the graph, to tell a constant B): the
/// problem with its heuristic parameters, or why the family does not take it.
pub fn gemv_plan(p: &FProblem, lowered: &Lowered, target: &GpuTarget) -> Result<FamilyPlan, String> {
    let cc = target.compute_capability;
    if cc.0 < 8 {
        return Err(format!("mma.sync needs compute capability 8.0; the device has {}.{}", cc.0, cc.1));
    }
    let GemmView { problem, a, b } = gemm_view(&lowered.kernel)?;
    if problem.m > 16 {
        return Err(format!("{} rows: more than 16 (the GEMV family takes decode-shaped products)", problem.m));
    }
    let b_const = b_is_const(p, lowered, &b)?;
    if problem.b_layout == Layout::RowMajor && !b_const {
        return Err(
            "B is row-major and not a constant (the family reads K-contiguous weights; a row-major one is repacked once, when the kernel is bound)"
                .into(),
        );
    }
    let params = gemv::heuristic_for(&problem, target.sm_count as usize, b_const);
    gemv::applies(&problem, &params, cc)?;
    Ok(plan(problem, params, a, b))
}

/// Whether operand B is one of the graph's constants (which the family may repack at bind).
fn b_is_const(p: &FProblem, lowered: &Lowered, b: &OperandRef) -> Result<bool, String> {
    // Parameters are the lowered kernel's inputs, then its outputs.
    let v = lowered.inputs.get(b.param).ok_or("operand B is not one of the kernel's inputs")?;
    Ok(matches!(p.graph.value(*v).def, ValueDef::Const(_)))
}

/// Refuses tiled weights unless B is a constant.
fn check_tiled(p: &FProblem, q: &Params, b: &OperandRef) -> Result<(), String> {
    if q.tiled && !b_is_const(p, &super::lowered(p)?, b)? {
        return Err("tiled weights need a constant B (repacked once, when the kernel is bound)".into());
    }
    Ok(())
}

fn plan(problem: Problem, params: Params, a: OperandRef, b: OperandRef) -> FamilyPlan {
    FamilyPlan {
        family: GEMV,
        entry: gemv::kernel_name(&problem, &params, &a, &b),
        source: gemv::render(&problem, &params, &a, &b),
        problem,
        kind: PlanKind::Gemv(params),
        a,
        b,
    }
}

/// The family as the registry holds it.
pub struct Sm80Gemv;
pub static SM80_GEMV: Sm80Gemv = Sm80Gemv;

const NAMES: [&str; 11] = ["warps_n", "warps_k", "cols", "unroll", "split_k", "prefetch", "min_blocks", "stages", "tiled", "a_ahead", "early"];

fn to_params(q: &Params) -> FParams {
    let v = [q.warps_n, q.warps_k, q.cols, q.unroll, q.split_k, q.prefetch, q.min_blocks, q.stages, q.tiled as usize, q.a_ahead as usize, q.early];
    FParams(NAMES.iter().copied().zip(v.map(|x| x as i64)).collect())
}

fn with_params(q: Params, p: &FParams) -> Params {
    let get = |n: &str, d: usize| p.get(n).map_or(d, |v| v.max(0) as usize);
    Params {
        warps_n: get("warps_n", q.warps_n),
        warps_k: get("warps_k", q.warps_k),
        cols: get("cols", q.cols),
        unroll: get("unroll", q.unroll),
        split_k: get("split_k", q.split_k),
        prefetch: get("prefetch", q.prefetch),
        min_blocks: get("min_blocks", q.min_blocks),
        stages: get("stages", q.stages),
        tiled: get("tiled", q.tiled as usize) != 0,
        a_ahead: get("a_ahead", q.a_ahead as usize) != 0,
        early: get("early", q.early),
    }
}

/// The parameters of a GEMV plan.
pub fn gemv_params(plan: &FamilyPlan) -> Option<Params> {
    match &plan.kind {
        PlanKind::Gemv(q) => Some(*q),
        _ => None,
    }
}

fn plan_of(p: &FProblem, t: &Target) -> Result<FamilyPlan, String> {
    p.memo("sm80_gemv.plan", || gemv_plan(p, &super::lowered(p)?, &t.gpu))
}

impl Family for Sm80Gemv {
    type Target = Target;
    type Built = super::GpuBuilt;

    fn name(&self) -> &'static str {
        GEMV
    }

    fn applies(&self, p: &FProblem, t: &Target) -> Result<(), String> {
        plan_of(p, t).map(drop)
    }

    fn space(&self, _p: &FProblem, _t: &Target) -> ParamSpace {
        ParamSpace {
            axes: vec![
                ("warps_n", vec![1, 2, 4, 8]),
                ("warps_k", vec![1, 2, 4]),
                ("cols", vec![1, 2, 4]),
                ("unroll", vec![1, 2, 4]),
                ("split_k", vec![1, 2, 3, 4, 6, 8, 12, 16]),
                ("prefetch", vec![0, 128, 256]),
                ("min_blocks", vec![0, 2, 4]),
                ("stages", vec![0, 3, 4, 6]),
                ("tiled", vec![0, 1]),
                ("a_ahead", vec![0, 1]),
                ("early", vec![0, 1, 2, 4]),
            ],
        }
    }

    fn check(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<(), String> {
        let plan = plan_of(p, t)?;
        let q = gemv_params(&plan).ok_or("not a GEMV plan")?;
        let q = with_params(q, params);
        check_tiled(p, &q, &plan.b)?;
        gemv::applies(&plan.problem, &q, t.gpu.compute_capability)
    }

    fn heuristic(&self, p: &FProblem, t: &Target) -> FParams {
        plan_of(p, t).ok().and_then(|plan| gemv_params(&plan)).map(|q| to_params(&q)).unwrap_or_default()
    }

    fn build(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<super::GpuBuilt, String> {
        let mut built = plan_of(p, t)?;
        let q0 = gemv_params(&built).ok_or("not a GEMV plan")?;
        let q = with_params(q0, params);
        if q != q0 {
            check_tiled(p, &q, &built.b)?;
            gemv::applies(&built.problem, &q, t.gpu.compute_capability)?;
            built = plan(built.problem.clone(), q, built.a.clone(), built.b.clone());
        }
        let simt = super::TileIr(&super::simt_gemm::SimtGemm).build(p, t, &FParams::default())?;
        let source = CudaSource { name: built.entry.clone(), source: built.source.clone(), launch: built.launch(t.gpu.sm_count) };
        Ok(super::GpuBuilt {
            lowered: simt.lowered,
            scheduled: simt.scheduled,
            schedule: GEMV,
            source,
            plan: Some(built),
            fallback: Some((simt.schedule, simt.source)),
        })
    }
}
