//! `sm80_mma_gemm`: the `mma.sync` tensor-core template of [`crate::mma`] for a kernel that
//! is one `Gemm` over 16-bit operands: a matrix product read straight from buffers (as for the
//! Hopper template, see [`gemm_view`]), or a channels-last 2-D convolution read through an
//! implicit im2col with its constant weights repacked at bind time ([`conv_view`]). Any device of compute
//! capability 8.0 or later; on sm_90 it takes what the Hopper template does not (convolutions,
//! and skinny products that want K split over blocks). Its build carries the SIMT GEMM as a
//! fallback, like the Hopper family's.

use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params as FParams, Problem as FProblem};
use tilec_tile::Kernel;

use super::conv_view::conv_view;
use super::operands::{gemm_view, GemmView};
use super::template::{FamilyPlan, OperandRef, PlanKind};
use crate::mma::{self, ConvGeom, MmaProblem, Params};
use crate::render::CudaSource;
use crate::schedule::GpuTarget;

/// The family's name.
pub const MMA_GEMM: &str = "sm80_mma_gemm";

/// The family's plan for a kernel: the problem (a matrix product or a convolution) with its
/// heuristic parameters.
pub fn mma_gemm(p: &FProblem, k: &Kernel, target: &GpuTarget) -> Result<FamilyPlan, String> {
    let cc = target.compute_capability;
    if cc.0 < 8 {
        return Err(format!("mma.sync and cp.async need compute capability 8.0; the device has {}.{}", cc.0, cc.1));
    }
    let GemmView { problem, a, b } = match conv_view(p, k) {
        Some(conv) => conv?,
        None => gemm_view(k)?,
    };
    let problem = MmaProblem { conv: problem.conv, gemm: problem };
    let params = mma::heuristic(&problem, target.sm_count as usize);
    mma::applies(&problem, &params, cc)?;
    Ok(plan(problem, params, a, b))
}

fn plan(problem: MmaProblem, params: Params, a: OperandRef, b: OperandRef) -> FamilyPlan {
    FamilyPlan {
        family: MMA_GEMM,
        entry: mma::kernel_name(&problem, &params, &a, &b),
        source: mma::render(&problem, &params, &a, &b),
        problem: problem.gemm,
        kind: PlanKind::Mma(params, problem.conv),
        a,
        b,
    }
}

/// The family as the registry holds it.
pub struct Sm80MmaGemm;
pub static SM80_MMA_GEMM: Sm80MmaGemm = Sm80MmaGemm;

const NAMES: [&str; 10] = ["tile_m", "tile_n", "tile_k", "warps_m", "warps_n", "stages", "split_k", "prefetch", "staged", "shuffle"];

fn to_params(q: &Params) -> FParams {
    let v = [q.tile_m, q.tile_n, q.tile_k, q.warps_m, q.warps_n, q.stages, q.split_k, q.prefetch, q.staged as usize, q.shuffle as usize];
    FParams(NAMES.iter().copied().zip(v.map(|x| x as i64)).collect())
}

fn with_params(q: Params, p: &FParams) -> Params {
    let get = |n: &str, d: usize| p.get(n).map_or(d, |v| v.max(0) as usize);
    Params {
        tile_m: get("tile_m", q.tile_m),
        tile_n: get("tile_n", q.tile_n),
        tile_k: get("tile_k", q.tile_k),
        warps_m: get("warps_m", q.warps_m),
        warps_n: get("warps_n", q.warps_n),
        stages: get("stages", q.stages),
        split_k: get("split_k", q.split_k),
        prefetch: get("prefetch", q.prefetch),
        staged: get("staged", q.staged as usize) != 0,
        shuffle: get("shuffle", q.shuffle as usize) != 0,
        ..q
    }
}

/// The parameters and convolution geometry of an `mma` plan.
pub fn mma_parts(plan: &FamilyPlan) -> Option<(Params, Option<ConvGeom>)> {
    match &plan.kind {
        PlanKind::Mma(q, c) => Some((*q, *c)),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

fn plan_of(p: &FProblem, t: &Target) -> Result<FamilyPlan, String> {
    p.memo("sm80_mma_gemm.plan", || mma_gemm(p, &super::lowered(p)?.kernel, &t.gpu))
}

impl Family for Sm80MmaGemm {
    type Target = Target;
    type Built = super::GpuBuilt;

    fn name(&self) -> &'static str {
        MMA_GEMM
    }

    fn applies(&self, p: &FProblem, t: &Target) -> Result<(), String> {
        plan_of(p, t).map(drop)
    }

    fn space(&self, _p: &FProblem, _t: &Target) -> ParamSpace {
        ParamSpace {
            axes: vec![
                ("tile_m", vec![16, 32, 64, 128, 256]),
                ("tile_n", vec![64, 128, 256]),
                ("tile_k", vec![64, 128, 256]),
                ("warps_m", vec![1, 2, 4]),
                ("warps_n", vec![1, 2, 4]),
                ("stages", vec![2, 3, 4, 5, 6]),
                ("split_k", vec![1, 2, 4, 8, 16]),
                ("prefetch", vec![0, 128, 256]),
                ("staged", vec![0, 1]),
                // The epilogue regrouped by warp shuffles (where there is a vector function).
                ("shuffle", vec![0, 1]),
            ],
        }
    }

    fn check(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<(), String> {
        let plan = plan_of(p, t)?;
        let (q, conv) = mma_parts(&plan).ok_or("not an mma plan")?;
        let problem = MmaProblem { gemm: plan.problem.clone(), conv };
        mma::applies(&problem, &with_params(q, params), t.gpu.compute_capability)
    }

    fn heuristic(&self, p: &FProblem, t: &Target) -> FParams {
        plan_of(p, t).ok().and_then(|plan| mma_parts(&plan)).map(|(q, _)| to_params(&q)).unwrap_or_default()
    }

    /// A roofline over the blocks (split-K included) with wave quantization over the SMs;
    /// mma.sync reaches about 60% of the tensor peak with at least 8 warps per SM.
    fn estimate(&self, p: &FProblem, t: &Target, params: &FParams) -> Option<f64> {
        let plan = plan_of(p, t).ok()?;
        let (q0, _) = mma_parts(&plan)?;
        let q = with_params(q0, params);
        let pr = &plan.problem;
        let warps = (q.warps_m * q.warps_n * q.blocks_per_sm()) as f64;
        let g = super::estimate::TiledGemm {
            m: pr.m,
            n: pr.n,
            k: pr.k,
            batch: pr.batch,
            tile_m: q.tile_m,
            tile_n: q.tile_n,
            tile_k: q.tile_k,
            stages: q.stages,
            split_k: q.split_k,
            in_bytes: 2,
            out_bytes: pr.out_dtype.size_bytes(),
            efficiency: 0.6 * (warps / 8.0).min(1.0),
        };
        Some(super::estimate::roofline(&g, t))
    }

    fn build(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<super::GpuBuilt, String> {
        let mut built = plan_of(p, t)?;
        let (q0, conv) = mma_parts(&built).ok_or("not an mma plan")?;
        let q = with_params(q0, params);
        if q != q0 {
            let problem = MmaProblem { gemm: built.problem.clone(), conv };
            mma::applies(&problem, &q, t.gpu.compute_capability)?;
            built = plan(problem, q, built.a.clone(), built.b.clone());
        }
        let simt = super::TileIr(&super::simt_gemm::SimtGemm).build(p, t, &FParams::default())?;
        let source = CudaSource { name: built.entry.clone(), source: built.source.clone(), launch: built.launch(t.gpu.sm_count) };
        Ok(super::GpuBuilt {
            lowered: simt.lowered,
            scheduled: simt.scheduled,
            schedule: MMA_GEMM,
            source,
            plan: Some(built),
            fallback: Some((simt.schedule, simt.source)),
        })
    }
}
