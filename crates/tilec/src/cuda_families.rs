//! The CUDA path's hook into the kernel families of `tilec_cuda::families`: which family (if
//! any) runs each lowered kernel instead of its tile-IR schedule, and loading the result.
//!
//! Families are on by default; `TILEC_CUDA_FAMILIES=off` keeps every kernel on its tile-IR
//! schedule (for comparisons), `TILEC_CUBLAS=off` keeps cuBLAS off unless it is forced with
//! `--family`. A cuBLAS kernel has no source and loads without an image: when cuBLASLt is
//! missing on the machine, its load fails and the SIMT GEMM fallback runs, with a note.

use tilec_cuda::families::FamilyPlan;
use tilec_cuda::{CudaSource, Device, GpuKernel};
use tilec_tile::family::Decision;
use tilec_tile::Kernel;

/// What the family dispatch decided for one kernel (kept with the prepared kernel).
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyInfo {
    /// The family, its parameters and the families passed over.
    pub decision: Decision,
    /// A template family's plan.
    pub plan: Option<FamilyPlan>,
    /// With a plan: the tile-IR schedule's name and source, run if the template does not
    /// compile or load.
    pub fallback: Option<(&'static str, CudaSource)>,
}

impl FamilyInfo {
    /// One line: the family with its parameters (a template's plan described), then the
    /// families passed over and why.
    pub fn describe(&self) -> String {
        let mut s = match &self.plan {
            Some(p) => format!("{} ({}; {})", self.decision.family, self.decision.origin, p.describe()),
            None => self.decision.summary(),
        };
        if !self.decision.rejected.is_empty() {
            s.push_str(&format!("; passed over: {}", self.decision.rejections()));
        }
        s
    }
}

/// Whether the template families are enabled (`TILEC_CUDA_FAMILIES=off` or `0` disables them).
pub fn enabled() -> bool {
    !matches!(std::env::var("TILEC_CUDA_FAMILIES").as_deref(), Ok("off" | "0"))
}

/// Whether cuBLAS may be picked unforced (`TILEC_CUBLAS=off` or `0` says no).
pub fn cublas_enabled() -> bool {
    !matches!(std::env::var("TILEC_CUBLAS").as_deref(), Ok("off" | "0"))
}

/// The families the environment disables for unforced picks.
pub fn disabled() -> Vec<&'static str> {
    let mut d = vec![];
    if !enabled() {
        d.extend([
            tilec_cuda::families::GEMV,
            tilec_cuda::families::HOPPER_GEMM,
            tilec_cuda::families::MMA_GEMM,
            tilec_cuda::families::SIMT_F32_GEMM,
            tilec_cuda::families::CUBLAS_GEMM,
        ]);
    } else if !cublas_enabled() {
        d.push(tilec_cuda::families::CUBLAS_GEMM);
    }
    d
}

/// Loads a compiled kernel: through its family when it has one.
pub fn load(
    device: &Device,
    scheduled: &Kernel,
    lowered: &Kernel,
    source: &CudaSource,
    info: &FamilyInfo,
    image: &[u8],
    cache_hit: bool,
) -> tilec_cuda::Result<GpuKernel> {
    match &info.plan {
        Some(plan) => GpuKernel::from_family(device, lowered, plan, image, cache_hit),
        None => GpuKernel::from_image(device, scheduled, source.launch, image, cache_hit),
    }
}

/// Loads a compiled kernel (see [`load`]); a family kernel that failed to compile or load is
/// replaced by its tile-IR schedule, compiled now, and a note naming the failure is added to
/// `notes` (the report's per-kernel family lines).
pub fn load_or_fallback(
    device: &Device,
    compiler: &tilec_cuda::Compiler,
    k: &crate::compiled_cuda::GpuKernelSource,
    compiled: tilec_cuda::Result<tilec_cuda::Compiled>,
    notes: &mut Vec<(String, String)>,
) -> tilec_cuda::Result<GpuKernel> {
    let first = compiled.and_then(|c| {
        load(device, &k.scheduled, &k.lowered, &k.source, &k.family, &c.image, c.cache_hit)
    });
    match (first, &k.family.fallback) {
        (Err(e), Some((schedule, src))) => {
            notes.push((
                k.name.clone(),
                format!("{} failed ({e}); running the {schedule} schedule instead", k.schedule),
            ));
            let c = compiler.compile(&k.name, &src.source)?;
            GpuKernel::from_image(device, &k.scheduled, src.launch, &c.image, c.cache_hit)
        }
        (r, _) => r,
    }
}
