//! `simt_f32_gemm`: the exact-f32 SIMT GEMM template of [`crate::simt`] for a kernel that is
//! one `Gemm` over f32 operands read straight from buffers (any layout pair, leading
//! dimensions, batches with their strides or split in two, a split A; see [`gemm_view_with`]:
//! operands may start anywhere, a misaligned one is read element by element), f32
//! accumulation with exact fused multiply-adds, the kernel's epilogue as a device function.
//!
//! It comes after the tensor-core templates in the registry: with `--allow-tf32` the Hopper
//! template takes the f32 products it can (as tf32) and this family the rest, exactly. Its
//! build carries the tile-IR SIMT GEMM as a fallback, like the other templates'.

use tilec_ir::DType;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params as FParams, Problem as FProblem};
use tilec_tile::Kernel;

use super::operands::{gemm_view_with, GemmView};
use super::template::{FamilyPlan, OperandRef, PlanKind};
use crate::gemm::Problem;
use crate::render::CudaSource;
use crate::schedule::GpuTarget;
use crate::simt::{self, Params};

/// The family's name.
pub const SIMT_F32_GEMM: &str = "simt_f32_gemm";

/// The family's plan for a kernel: the f32 product with its heuristic parameters.
pub fn simt_f32_gemm(k: &Kernel, target: &GpuTarget) -> Result<FamilyPlan, String> {
    let cc = target.compute_capability;
    if cc.0 < 6 {
        return Err(format!("the SIMT f32 GEMM needs compute capability 6.0; the device has {}.{}", cc.0, cc.1));
    }
    let GemmView { problem, a, b } = gemm_view_with(k, false)?;
    if problem.in_dtype != DType::F32 {
        return Err(format!("operands are {}, not f32", problem.in_dtype.name()));
    }
    let params = simt::heuristic(&problem, target.sm_count as usize);
    simt::applies(&problem, &params, cc)?;
    Ok(plan(problem, params, a, b))
}

fn plan(problem: Problem, params: Params, a: OperandRef, b: OperandRef) -> FamilyPlan {
    FamilyPlan {
        family: SIMT_F32_GEMM,
        entry: simt::kernel_name(&problem, &params, &a, &b),
        source: simt::render(&problem, &params, &a, &b),
        problem,
        kind: PlanKind::SimtF32(params),
        a,
        b,
    }
}

/// The family as the registry holds it.
pub struct SimtF32Gemm;
pub static SIMT_F32_GEMM_FAMILY: SimtF32Gemm = SimtF32Gemm;

const NAMES: [&str; 4] = ["tile_m", "tile_n", "tile_k", "split_k"];

fn to_params(q: &Params) -> FParams {
    let v = [q.tile_m, q.tile_n, q.tile_k, q.split_k];
    FParams(NAMES.iter().copied().zip(v.map(|x| x as i64)).collect())
}

fn with_params(q: Params, p: &FParams) -> Params {
    let get = |n: &str, d: usize| p.get(n).map_or(d, |v| v.max(0) as usize);
    Params {
        tile_m: get("tile_m", q.tile_m),
        tile_n: get("tile_n", q.tile_n),
        tile_k: get("tile_k", q.tile_k),
        split_k: get("split_k", q.split_k),
        ..q
    }
}

/// The parameters of a SIMT f32 plan.
pub fn simt_params(plan: &FamilyPlan) -> Option<Params> {
    match &plan.kind {
        PlanKind::SimtF32(q) => Some(*q),
        _ => None,
    }
}

fn plan_of(p: &FProblem, t: &Target) -> Result<FamilyPlan, String> {
    p.memo("simt_f32_gemm.plan", || simt_f32_gemm(&super::lowered(p)?.kernel, &t.gpu))
}

impl Family for SimtF32Gemm {
    type Target = Target;
    type Built = super::GpuBuilt;

    fn name(&self) -> &'static str {
        SIMT_F32_GEMM
    }

    fn applies(&self, p: &FProblem, t: &Target) -> Result<(), String> {
        plan_of(p, t).map(drop)
    }

    fn space(&self, _p: &FProblem, _t: &Target) -> ParamSpace {
        ParamSpace {
            axes: vec![
                ("tile_m", vec![32, 64, 128]),
                ("tile_n", vec![32, 64, 128]),
                ("tile_k", vec![8, 16]),
                ("split_k", vec![1, 2, 4, 8, 16]),
            ],
        }
    }

    fn check(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<(), String> {
        let plan = plan_of(p, t)?;
        let q = simt_params(&plan).ok_or("not a SIMT f32 plan")?;
        simt::applies(&plan.problem, &with_params(q, params), t.gpu.compute_capability)
    }

    fn heuristic(&self, p: &FProblem, t: &Target) -> FParams {
        plan_of(p, t).ok().and_then(|plan| simt_params(&plan)).map(|q| to_params(&q)).unwrap_or_default()
    }

    fn build(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<super::GpuBuilt, String> {
        let mut built = plan_of(p, t)?;
        let q0 = simt_params(&built).ok_or("not a SIMT f32 plan")?;
        let q = with_params(q0, params);
        if q != q0 {
            simt::applies(&built.problem, &q, t.gpu.compute_capability)?;
            built = plan(built.problem.clone(), q, built.a.clone(), built.b.clone());
        }
        // The tile-IR SIMT GEMM, run if the template does not compile or load.
        let tile = super::TileIr(&super::simt_gemm::SimtGemm).build(p, t, &FParams::default())?;
        let source = CudaSource { name: built.entry.clone(), source: built.source.clone(), launch: built.launch(t.gpu.sm_count) };
        Ok(super::GpuBuilt {
            lowered: tile.lowered,
            scheduled: tile.scheduled,
            schedule: SIMT_F32_GEMM,
            source,
            plan: Some(built),
            fallback: Some((tile.schedule, tile.source)),
        })
    }
}
