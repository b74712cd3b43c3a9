//! The compiled CUDA path: optimize for the GPU → partition → build each kernel (lower, GPU
//! schedule or kernel family, CUDA C++) → NVRTC (parallel, cached) → one planned device arena,
//! run by the executor ([`crate::exec`]) as CUDA graphs.
//!
//! [`prepare`] does everything that needs no GPU, so it runs and is tested anywhere;
//! [`compile`] adds the device. A node whose group does not build (even split into runs of nodes) or whose
//! kernel does not compile runs on the host reference interpreter (a *host step*). Everything
//! CUDA is loaded at run time: without a driver, a device or NVRTC, [`compile`] returns an
//! error saying which is missing.

use std::time::Instant;

use std::sync::Arc;

use tilec_cuda::GpuTarget;
use tilec_ir::Graph;
use tilec_opt::target::Target;
use tilec_tile::family::{Choices, Tuned};

use crate::exec::cuda::{gpu_target, Cuda, CudaBuild};
use crate::exec::Executor;
use crate::Error;

pub use crate::exec::cuda::{open_device, GpuKernelSource};

/// What preparation and compilation did.
pub type CudaReport = crate::exec::Report;

/// A model lowered, scheduled and rendered for the GPU (no device needed).
pub type Prepared = crate::exec::Prepared<CudaBuild>;

/// A model compiled for and loaded on a GPU.
pub type CompiledCuda = Executor<Cuda>;

/// Options of [`prepare`] and [`compile`].
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Graph optimization level (0..=3).
    pub opt_level: u8,
    /// Device ordinal.
    pub device: usize,
    /// Where compiled kernels are cached (`None`: the back end's default directory).
    pub cache_dir: Option<std::path::PathBuf>,
    /// Families forced per op or kernel name (`--family OP=NAME`).
    pub families: Vec<(String, String)>,
    /// Let f32 matrix products run on the tensor cores as tf32 (`--allow-tf32`).
    pub allow_tf32: bool,
    /// Recognize attention and run it on a FlashAttention family (`sm90_flash_attn`, `sm80_flash_attn`); on by
    /// default, off with `TILEC_CUDA_ATTENTION=off`. When the family does not take some
    /// recognized attention, the whole graph is prepared again without it (with a note).
    pub flash_attention: bool,
    /// The tuning database to take parameters from, keyed for this GPU (`None`: the families'
    /// heuristics). The CLI opens the user's (`tune::open_cuda_tuning`) unless `--no-tuning`.
    pub tuning: Option<Arc<tilec_tune::Tuning>>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            opt_level: 3,
            device: 0,
            cache_dir: None,
            families: vec![],
            allow_tf32: false,
            flash_attention: true,
            tuning: None,
        }
    }
}

/// The GPU as [`prepare`] shows it to the families: `gpu` with the options' tf32 consent and
/// FlashAttention applied.
pub fn gpu_options(opts: &CudaOptions, gpu: &GpuTarget) -> GpuTarget {
    GpuTarget {
        allow_tf32: gpu.allow_tf32 || opts.allow_tf32,
        flash_attention: (gpu.flash_attention || opts.flash_attention) && tilec_opt::manager::cuda_flash_attention_env(),
        ..*gpu
    }
}

/// The target the families see for `gpu` under `opts` (what the tuner builds candidates for).
pub fn family_target(opts: &CudaOptions, gpu: &GpuTarget) -> Target {
    gpu_target(&gpu_options(opts, gpu))
}

/// Optimizes for CUDA, partitions, lowers, schedules and renders a graph with concrete shapes.
pub fn prepare(graph: &Graph, opts: &CudaOptions, target: &GpuTarget) -> Result<Prepared, Error> {
    // `TILEC_CUDA_FAMILIES=off` keeps every kernel on the tile-IR schedules (for comparisons);
    // `TILEC_CUBLAS=off` keeps cuBLAS from being picked unforced.
    let disabled = crate::cuda_families::disabled();
    let tuned = opts.tuning.as_deref().map(|t| t as &dyn Tuned);
    let choices = Choices { forced: &opts.families, disabled: &disabled, tuned };
    let target = gpu_options(opts, target);
    let mut p = crate::exec::prepare(graph, opts.opt_level, &CudaBuild, &gpu_target(&target), &choices)?;
    // Recognized attention the FlashAttention family does not take would run on a direct nest
    // (one thread per query row): keep the whole graph's attention as products and a softmax.
    if target.flash_attention {
        let missed: Vec<String> = p
            .kernels()
            .iter()
            .filter(|k| k.name.ends_with("_attention") && !tilec_cuda::families::is_flash(k.schedule))
            .map(|k| k.name.clone())
            .collect();
        if let Some(first) = missed.first() {
            let why = p
                .report
                .decisions
                .iter()
                .find(|(n, _)| n == first)
                .and_then(|(_, d)| d.rejected.iter().find(|(f, _)| *f == tilec_cuda::families::FLASH_ATTN).map(|(_, w)| w.clone()))
                .unwrap_or_default();
            let unfused = GpuTarget { flash_attention: false, ..target };
            p = crate::exec::prepare(graph, opts.opt_level, &CudaBuild, &gpu_target(&unfused), &choices)?;
            p.report.notes.push((
                first.clone(),
                format!("attention kept as products and a softmax: the FlashAttention family does not take {} of its kernels ({why})", missed.len()),
            ));
        }
    }
    let mut counts: Vec<(String, usize)> = vec![];
    for k in p.kernels() {
        match counts.iter_mut().find(|c| c.0 == k.schedule) {
            Some(c) => c.1 += 1,
            None => counts.push((k.schedule.to_string(), 1)),
        }
    }
    p.report.schedules = counts;
    Ok(p)
}

/// Compiles a graph with concrete shapes for the GPU `opts.device` and loads it.
///
/// The device's context is created (a few hundred milliseconds on a large GPU) on another
/// thread while this one prepares the kernels, which need only the device's properties. The
/// report's `device` phase is the part of the open that preparing did not hide.
pub fn compile(graph: &Graph, opts: &CudaOptions) -> Result<CompiledCuda, Error> {
    let t0 = Instant::now();
    let target = crate::exec::cuda::device_props(opts.device)?.gpu_target();
    let queried = t0.elapsed();
    let (cuda, prep, waited) = std::thread::scope(|s| {
        let (ordinal, cache) = (opts.device, opts.cache_dir.clone());
        let opening = s.spawn(move || Cuda::open(ordinal, cache));
        let prep = prepare(graph, opts, &target);
        let t = Instant::now();
        let cuda = opening.join().map_err(|_| Error::Compile("opening the CUDA device panicked".into()));
        (cuda, prep, t.elapsed())
    });
    let (cuda, prep) = (cuda??, prep?);
    let mut c = Executor::load(prep, cuda)?;
    c.report.phases.insert(0, ("device", queried + waited));
    c.report.total = t0.elapsed();
    Ok(c)
}
