//! The CUDA back end: tile-IR kernels rendered to CUDA C++, compiled at run time with NVRTC for
//! the device's own architecture (with a disk cache), loaded and launched through the driver
//! API, plus GPU schedules for memory-bound kernels.
//!
//! Everything CUDA is loaded at run time: the crate builds, and its non-GPU tests run, on
//! machines without CUDA. [`is_available`] says whether a driver and a device are present;
//! [`Nvrtc::load`] whether the compiler is.
//!
//! - [`driver`]: devices, memory (buffers and a planned arena), streams, events, modules,
//!   launches and CUDA graphs; every failing call is reported by name.
//! - [`nvrtc`]: CUDA C++ → cubin, cached on disk, several modules in parallel.
//! - [`render`]: tile IR → CUDA C++ (`render_cuda`) and launch configuration.
//! - [`schedule`]: GPU schedules (rows, elementwise, the block-tiled GEMM, direct nests) and
//!   [`schedule_gpu`], which tries them in the families' order on a lowered kernel.
//! - [`gemm`]: the Hopper tensor-core GEMM family (wgmma fed by TMA), rendered per parameters.
//! - [`mma`]: the `mma.sync` tensor-core GEMM (sm_80 and later), also as an implicit-GEMM
//!   convolution and with K split over blocks for skinny products.
//! - [`simt`]: the exact-f32 GEMM on the CUDA cores (f32 products without `--allow-tf32`).
//! - [`families`]: the kernel families and their registry: the Hopper GEMM template, the
//!   mma.sync template, the SIMT f32 template, cuBLASLt, then the tile-IR schedules.
//! - [`cublaslt`]: cuBLASLt loaded at run time (one described product per loaded kernel).
//! - [`tma`]: tensor maps for the bulk tensor copy engine.

pub mod cublaslt;
pub mod driver;
pub mod error;
pub mod families;
pub mod flash;
pub mod gemm;
pub mod gemv;
pub mod handbuilt;
pub mod mma;
pub mod nvrtc;
pub mod paged;
pub mod pdl;
pub mod render;
pub mod repack;
pub mod schedule;
pub mod simt;
pub mod tma;

pub use driver::{
    device_count, driver_version, is_available, Device, DeviceArena, DeviceBuffer, DeviceProps,
    Event, Function, Graph, LaunchConfig, Module, Stream,
};
pub use error::{CudaError, Result};
pub use nvrtc::{Compiled, Compiler, Nvrtc, Output};
pub use render::{launch_config, render, render_cuda, CudaSource, PRELUDE};
pub use families::{schedule_gpu, schedule_gpu_named};
pub use schedule::{fuse_sibling_nests, schedule_elementwise, schedule_elementwise_with, schedule_rows, GpuTarget, RowOptions};
pub use schedule::{schedule_direct, schedule_gemm};

use std::sync::Arc;

/// The format of the CUDA code generator's output as the tuning database keys measurements
/// (with tilec's version): a change that makes tuned parameters mean something else, or
/// measure differently, bumps it.
pub const FORMAT_VERSION: &str = "tilec-cuda-1";

/// A tile-IR kernel compiled and loaded on a device, with its launch configuration and the
/// element counts and dtypes of its parameters.
pub struct GpuKernel {
    pub name: String,
    pub launch: LaunchConfig,
    /// Every argument: the kernel's parameters, then its status words when it has checks.
    pub params: Vec<(tilec_ir::DType, usize)>,
    /// The kernel's index check sites: a violation recorded in its status names one of them.
    pub checks: Vec<tilec_tile::CheckSite>,
    pub cache_hit: bool,
    func: Option<Function>,
    /// Set when a kernel family runs this kernel (same parameters).
    family: Option<Box<families::FamilyKernel>>,
}

impl GpuKernel {
    /// The loaded function (for attributes such as registers and occupancy); `None` for a
    /// library kernel (cuBLAS), which has no function of ours.
    pub fn function(&self) -> Option<&Function> {
        match &self.family {
            Some(f) => f.function(),
            None => self.func.as_ref(),
        }
    }

    /// The family running this kernel, if any.
    pub fn family(&self) -> Option<&families::FamilyKernel> {
        self.family.as_deref()
    }

    /// Prepares what a family kernel derives from its pointers (a convolution's repacked
    /// weights): call once with the launch pointers, before launching or capturing.
    pub fn bind(&self, stream: &Stream, args: &[u64]) -> Result<()> {
        match &self.family {
            Some(f) => f.bind(stream, args),
            None => Ok(()),
        }
    }

    /// Launches with one device pointer per parameter (16-byte aligned).
    pub fn launch(&self, stream: &Stream, args: &[u64]) -> Result<()> {
        if args.len() != self.params.len() {
            return Err(CudaError::Usage(format!(
                "kernel {}: {} arguments given, {} expected",
                self.name,
                args.len(),
                self.params.len()
            )));
        }
        if let Some(i) = args.iter().position(|a| a % 16 != 0) {
            return Err(CudaError::Usage(format!(
                "kernel {}: argument {i} is not 16-byte aligned",
                self.name
            )));
        }
        if let Some(f) = &self.family {
            return f.launch(stream, args);
        }
        match &self.func {
            Some(f) => f.launch(stream, &self.launch, args),
            None => Err(CudaError::Usage(format!("kernel {}: nothing loaded to launch", self.name))),
        }
    }
}

impl GpuKernel {
    /// Loads a compiled image of kernel `k` on `device`.
    pub fn from_image(
        device: &Device,
        k: &tilec_tile::Kernel,
        launch: LaunchConfig,
        image: &[u8],
        cache_hit: bool,
    ) -> Result<GpuKernel> {
        let module = Arc::new(device.load_module(image)?);
        let func = module.function(&k.name)?;
        let params = k
            .params
            .iter()
            .map(|&b| (k.buf(b).dtype, k.buf(b).numel() as usize))
            .chain((!k.checks.is_empty()).then_some((tilec_ir::DType::I64, tilec_tile::STATUS_WORDS)))
            .collect();
        Ok(GpuKernel {
            name: k.name.clone(),
            launch,
            params,
            checks: k.checks.clone(),
            cache_hit,
            func: Some(func),
            family: None,
        })
    }

    /// Loads the image of a family plan made for kernel `k` (same parameters as `k`).
    pub fn from_family(
        device: &Device,
        k: &tilec_tile::Kernel,
        plan: &families::FamilyPlan,
        image: &[u8],
        cache_hit: bool,
    ) -> Result<GpuKernel> {
        let fk = families::FamilyKernel::load(device, plan, image, cache_hit)?;
        let params = k
            .params
            .iter()
            .map(|&b| (k.buf(b).dtype, k.buf(b).numel() as usize))
            .collect();
        Ok(GpuKernel {
            name: k.name.clone(),
            launch: fk.launch_config(),
            params,
            // The family refuses kernels that check indices.
            checks: vec![],
            cache_hit,
            func: None,
            family: Some(Box::new(fk)),
        })
    }
}

/// Renders, compiles (in parallel, through the cache) and loads kernels on `device`.
pub fn load_kernels(
    device: &Device,
    compiler: &Compiler,
    kernels: &[tilec_tile::Kernel],
) -> Result<Vec<GpuKernel>> {
    let mut rendered = vec![];
    for k in kernels {
        rendered.push(render(k)?);
    }
    let modules: Vec<(String, String)> = rendered
        .iter()
        .map(|r| (r.name.clone(), r.source.clone()))
        .collect();
    let compiled = compiler.compile_many(&modules);
    let mut out = vec![];
    for ((k, r), c) in kernels.iter().zip(rendered).zip(compiled) {
        let c = c?;
        out.push(GpuKernel::from_image(device, k, r.launch, &c.image, c.cache_hit)?);
    }
    Ok(out)
}
