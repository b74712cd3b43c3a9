//! The GPU's kernel families (see `tilec_tile::family`), each in its own file and listed in
//! [`registry`] in the order they are tried: the Hopper tensor-core GEMM template first, then
//! the tile-IR schedules (SIMT GEMM, rows, elementwise, direct nests). A tile-IR family lowers
//! the group, applies its GPU schedule and renders CUDA C++; a template family renders its own
//! source and keeps the tile-IR kernel's parameters (same ABI).
//!
//! Adding a family: a new file here with a `static` implementing
//! `Family<Target = Target, Built = GpuBuilt>`, and one [`Entry`] in [`registry`].

mod direct;
mod elementwise;
mod rows;
mod simt_gemm;
mod sm90_tc_gemm;

use std::sync::OnceLock;

use tilec_opt::target::Target;
use tilec_tile::family::{Entry, Problem, Registry};
use tilec_tile::lower::{LowerOptions, Lowered};
use tilec_tile::Kernel;

use crate::render::{render, CudaSource};

pub use sm90_tc_gemm::{has_gemm, hopper_gemm, FamilyKernel, FamilyPlan, OperandRef, HOPPER_GEMM};

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

/// The GPU families, in the order they are tried.
pub fn registry() -> &'static Registry<Target, GpuBuilt> {
    static REG: OnceLock<Registry<Target, GpuBuilt>> = OnceLock::new();
    REG.get_or_init(|| Registry {
        entries: vec![
            Entry { family: &sm90_tc_gemm::SM90_TC_GEMM, kinds: &[] },
            Entry { family: &simt_gemm::SIMT_GEMM, kinds: &[] },
            Entry { family: &rows::ROWS, kinds: &[] },
            Entry { family: &elementwise::ELEMENTWISE, kinds: &[] },
            Entry { family: &direct::DIRECT, kinds: &[] },
        ],
    })
}

/// The problem lowered for the GPU (the direct forms: GPU schedules expect them).
pub(crate) fn lowered(p: &Problem) -> Result<Lowered, String> {
    p.lower(LowerOptions::default()).map_err(|e| e.to_string())
}

/// A tile-IR build: the lowered kernel under `schedule`, rendered.
pub(crate) fn tile_ir(
    p: &Problem,
    name: &'static str,
    schedule: impl FnOnce(&Kernel) -> crate::Result<Kernel>,
) -> Result<GpuBuilt, String> {
    let lowered = lowered(p)?;
    let scheduled = schedule(&lowered.kernel).map_err(|e| e.to_string())?;
    let source = render(&scheduled).map_err(|e| e.to_string())?;
    Ok(GpuBuilt { lowered, scheduled, schedule: name, source, plan: None, fallback: None })
}
