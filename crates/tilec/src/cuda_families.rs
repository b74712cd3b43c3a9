//! The CUDA path's hook into the kernel families of `tilec_cuda::families`: which family (if
//! any) runs each lowered kernel instead of its tile-IR schedule, and loading the result.
//!
//! Families are on by default; `TILEC_CUDA_FAMILIES=off` keeps every kernel on its tile-IR
//! schedule (for comparisons).

use tilec_cuda::families::{self, FamilyPlan};
use tilec_cuda::{CudaSource, Device, GpuKernel, GpuTarget, LaunchConfig};
use tilec_tile::Kernel;

/// What the family dispatch decided for one kernel (kept with the prepared kernel).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FamilyInfo {
    /// The plan of the family that runs the kernel.
    pub plan: Option<FamilyPlan>,
    /// For kernels holding a matrix product: the families that did not take it, and why.
    pub rejected: Vec<(&'static str, String)>,
    /// With a plan: the tile-IR schedule's name and source, run if the family kernel does not
    /// compile or load.
    pub fallback: Option<(&'static str, CudaSource)>,
}

impl FamilyInfo {
    /// One line: the chosen family and its parameters, or why none applies.
    pub fn describe(&self) -> Option<String> {
        match (&self.plan, self.rejected.is_empty()) {
            (Some(p), _) => Some(p.describe()),
            (None, false) => Some(
                self.rejected
                    .iter()
                    .map(|(f, why)| format!("{f}: {why}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            (None, true) => None,
        }
    }
}

/// Whether families are enabled (`TILEC_CUDA_FAMILIES=off` or `0` disables them).
pub fn enabled() -> bool {
    !matches!(
        std::env::var("TILEC_CUDA_FAMILIES").as_deref(),
        Ok("off" | "0")
    )
}

/// Asks the families about a lowered kernel. When one applies, its source replaces the tile-IR
/// rendering and its name the schedule's.
pub fn dispatch(
    lowered: &Kernel,
    target: &GpuTarget,
    schedule: &'static str,
    source: CudaSource,
) -> (&'static str, CudaSource, FamilyInfo) {
    if !enabled() || !families::has_gemm(lowered) {
        return (schedule, source, FamilyInfo::default());
    }
    let d = families::choose(lowered, target);
    match d.chosen {
        Some(plan) => {
            let src = CudaSource {
                name: plan.entry.clone(),
                source: plan.source.clone(),
                launch: LaunchConfig {
                    grid: (target.sm_count, 1, 1),
                    block: (plan.params.threads() as u32, 1, 1),
                    shared_mem_bytes: plan.params.smem_bytes() as u32,
                },
            };
            (
                plan.family,
                src,
                FamilyInfo {
                    plan: Some(plan),
                    rejected: d.rejected,
                    fallback: Some((schedule, source)),
                },
            )
        }
        None => (
            schedule,
            source,
            FamilyInfo {
                plan: None,
                rejected: d.rejected,
                fallback: None,
            },
        ),
    }
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

/// `(kernel, decision)` for every kernel with a family decision worth reporting.
pub fn summary(kernels: &[crate::compiled_cuda::GpuKernelSource]) -> Vec<(String, String)> {
    kernels
        .iter()
        .filter_map(|k| k.family.describe().map(|d| (k.name.clone(), d)))
        .collect()
}
