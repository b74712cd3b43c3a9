//! The GPU's kernel families (see `tilec_tile::family`), each in its own file and listed in
//! [`registry`] in the order they are tried: FlashAttention (`sm90_flash_attn` on `wgmma`, then `sm80_flash_attn` on
//! `mma.sync`; attention anchors only), paged decode attention (`sm80_paged_attn`, `paged_attention` nodes only), the decode-shaped GEMV (`sm80_gemv`, products of
//! at most 16 rows), the Hopper tensor-core GEMM template, the `mma.sync` template, the
//! exact-f32 SIMT template (`simt_f32_gemm`), then
//! cuBLASLt (`cublas.gemm`, a library call; unforced only for 16-bit products), then the
//! tile-IR schedules (SIMT GEMM, rows, elementwise, direct nests). A tile-IR family lowers
//! the group, applies its GPU schedule and renders CUDA C++; a template family renders its own
//! source and keeps the tile-IR kernel's parameters (same ABI).
//!
//! Adding a family: a new file here with a `static` implementing
//! `Family<Target = Target, Built = GpuBuilt>`, and one [`Entry`] in [`registry`].

mod conv_view;
mod cublas_gemm;
mod direct;
mod elementwise;
mod estimate;
mod operands;
mod rows;
mod simt_f32_gemm;
mod simt_gemm;
mod sm80_flash_attn;
mod sm80_gemv;
mod sm80_mma_gemm;
mod sm80_paged_attn;
mod sm90_tc_gemm;
mod template;

use std::sync::OnceLock;

use tilec_opt::target::Target;
use tilec_tile::family::{Entry, Family, FamilyRef, ParamSpace, Params, Problem, Registry};
use tilec_tile::lower::{LowerOptions, Lowered};
use tilec_tile::Kernel;

use crate::render::{render, CudaSource};
use crate::schedule::GpuTarget;

pub use cublas_gemm::{cublas_plan, lt_gemm, plain_store, CublasKernel, CublasParams, CUBLAS_GEMM};
pub use operands::{gemm_view, gemm_view_with, has_gemm, GemmView};
pub use simt_f32_gemm::{simt_f32_gemm, SIMT_F32_GEMM};
pub use sm80_flash_attn::{flash_parts, flash_plan, is_flash, reshape_view, FLASH_ATTN, FLASH_ATTN_SM90};
pub use sm80_gemv::{gemv_params, gemv_plan, GEMV};
pub use sm80_mma_gemm::{mma_gemm, MMA_GEMM};
pub use sm80_paged_attn::{paged_plan, paged_problem, PAGED_ATTN};
pub use sm90_tc_gemm::{hopper_gemm, Sm90Kernel, HOPPER_GEMM, NARROW_CONV_N, SHALLOW_CONV_K};
pub use template::{FamilyKernel, FamilyPlan, OperandRef, PlanKind};

/// What a GPU family builds.
#[derive(Clone, Debug)]
pub struct GpuBuilt {
    /// The lowered kernel with the graph values bound to its parameters.
    pub lowered: Lowered,
    /// The kernel after its GPU schedule (for a template family: its fallback's).
    pub scheduled: Kernel,
    /// The GPU schedule's name (`gemm`, `rows`, `elementwise`, `direct`, `block`, `serial`;
    /// a template family's name).
    pub schedule: &'static str,
    /// What to compile and how to launch it.
    pub source: CudaSource,
    /// A template family's plan (loaded through [`crate::GpuKernel::from_family`]).
    pub plan: Option<FamilyPlan>,
    /// For a template: the tile-IR family and source run if the template does not compile or
    /// load.
    pub fallback: Option<(&'static str, CudaSource)>,
}

/// The GPU families, in the order they are tried: the templates (Hopper, mma.sync, SIMT f32),
/// cuBLAS, then [`TILE_IR`].
pub fn registry() -> &'static Registry<Target, GpuBuilt> {
    static REG: OnceLock<Registry<Target, GpuBuilt>> = OnceLock::new();
    REG.get_or_init(|| {
        let mut entries = vec![
            // First: it takes only skinny products (at most 16 rows), which it streams faster
            // than the GEMM templates.
            // Only attention anchors (recognized on CUDA with TILEC_CUDA_ATTENTION=flash).
            // On Hopper the wgmma kernel first, the mma.sync one where it does not apply.
            Entry { family: &sm80_flash_attn::SM90_FLASH_ATTN as FamilyRef<Target, GpuBuilt>, kinds: &[] },
            Entry { family: &sm80_flash_attn::SM80_FLASH_ATTN as FamilyRef<Target, GpuBuilt>, kinds: &[] },
            // Only paged_attention nodes (no tile-IR lowering: refused, they run on the host).
            Entry { family: &sm80_paged_attn::SM80_PAGED_ATTN as FamilyRef<Target, GpuBuilt>, kinds: &[] },
            Entry { family: &sm80_gemv::SM80_GEMV as FamilyRef<Target, GpuBuilt>, kinds: &[] },
            Entry { family: &sm90_tc_gemm::SM90_TC_GEMM as FamilyRef<Target, GpuBuilt>, kinds: &[] },
            Entry { family: &sm80_mma_gemm::SM80_MMA_GEMM as FamilyRef<Target, GpuBuilt>, kinds: &[] },
            Entry { family: &simt_f32_gemm::SIMT_F32_GEMM_FAMILY as FamilyRef<Target, GpuBuilt>, kinds: &[] },
            Entry { family: &cublas_gemm::CUBLAS_GEMM_FAMILY, kinds: &[] },
        ];
        entries.extend(TILE_IR_FAMILIES.iter().map(|f| Entry { family: f as FamilyRef<Target, GpuBuilt>, kinds: &[] }));
        Registry { entries }
    })
}

/// A tile-IR family's GPU schedule of a lowered kernel, with its parameters.
pub trait TileSchedule: Sync {
    fn name(&self) -> &'static str;
    /// Whether the schedule takes the kernel, or why not.
    fn fits(&self, k: &Kernel) -> crate::Result<()>;
    fn space(&self) -> ParamSpace {
        ParamSpace::default()
    }
    fn heuristic(&self) -> Params {
        Params::default()
    }
    /// The scheduled kernel and the schedule's name.
    fn schedule(&self, k: &Kernel, t: &GpuTarget, params: &Params) -> crate::Result<(Kernel, &'static str)>;
}

/// The tile-IR schedules in the order they are tried (after the templates).
pub static TILE_IR: [&dyn TileSchedule; 4] =
    [&simt_gemm::SimtGemm, &rows::Rows, &elementwise::Elementwise, &direct::Direct];

/// A tile-IR schedule as a family: lower, schedule, render.
pub struct TileIr(pub &'static dyn TileSchedule);

static TILE_IR_FAMILIES: [TileIr; 4] = [TileIr(TILE_IR[0]), TileIr(TILE_IR[1]), TileIr(TILE_IR[2]), TileIr(TILE_IR[3])];

impl Family for TileIr {
    type Target = Target;
    type Built = GpuBuilt;

    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        self.0.fits(&lowered(p)?.kernel).map_err(reason)
    }

    fn space(&self, _p: &Problem, _t: &Target) -> ParamSpace {
        self.0.space()
    }

    fn heuristic(&self, _p: &Problem, _t: &Target) -> Params {
        self.0.heuristic()
    }

    /// A group of several nodes that would run on one thread is refused, so that its nodes
    /// become kernels of their own with parallel schedules.
    fn build(&self, p: &Problem, t: &Target, params: &Params) -> Result<GpuBuilt, String> {
        let lowered = lowered(p)?;
        let (scheduled, schedule) = self.0.schedule(&lowered.kernel, &t.gpu, params).map_err(reason)?;
        if schedule == "serial" && p.nodes.len() > 1 {
            return Err("fused, the nodes would run on one GPU thread".into());
        }
        let source = render(&scheduled).map_err(reason)?;
        Ok(GpuBuilt { lowered, scheduled, schedule, source, plan: None, fallback: None })
    }
}

/// A schedule or render error's message, without the kernel's name (the report names it).
fn reason(e: crate::CudaError) -> String {
    match e {
        crate::CudaError::Schedule { msg, .. } => msg,
        e => e.to_string(),
    }
}

/// The problem lowered for the GPU (the direct forms: GPU schedules expect them).
pub(crate) fn lowered(p: &Problem) -> Result<Lowered, String> {
    p.lower(LowerOptions::default()).map_err(|e| e.to_string())
}

/// Picks a schedule for any lowered kernel: the tile-IR GPU families' transforms in their
/// order (see `TILE_IR`), the first that applies.
pub fn schedule_gpu(k: &Kernel, target: &GpuTarget) -> crate::Result<Kernel> {
    schedule_gpu_named(k, target).map(|(k, _)| k)
}

/// [`schedule_gpu`], also naming the schedule it chose: `gemm`, `rows`, `elementwise`,
/// `direct` (grid-stride over independent outer loops), `block` (one block, nest after nest)
/// or `serial` (one thread).
pub fn schedule_gpu_named(k: &Kernel, target: &GpuTarget) -> crate::Result<(Kernel, &'static str)> {
    let mut why = vec![];
    for s in TILE_IR {
        match s.fits(k).and_then(|()| s.schedule(k, target, &s.heuristic())) {
            Ok(r) => return Ok(r),
            Err(e) => why.push(format!("{}: {e}", s.name())),
        }
    }
    Err(crate::schedule::bad(k, why.join("; ")))
}
