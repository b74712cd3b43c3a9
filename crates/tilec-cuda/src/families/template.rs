//! Template families: kernels rendered from a family's own CUDA C++ template for a problem and
//! parameters (not from the tile IR), keeping the ABI of the tile-IR kernel they replace: one
//! device pointer per parameter, in `Kernel::params` order. A [`FamilyPlan`] is what a template
//! family builds (no device needed); a [`FamilyKernel`] is the plan loaded on a device.
//!
//! Adding a template: a [`PlanKind`] variant with its parameters, its launch shape in
//! [`FamilyPlan::launch`], and its loaded form in [`FamilyKernel`].

use crate::driver::{Device, Function, LaunchConfig, Stream};
use crate::error::Result;
use crate::flash::{self, FlashArgs, FlashKernel, FlashProblem};
use crate::gemm::{self, Layout, Problem};
use crate::gemv::{self, GemvKernel};
use crate::mma::{self, MmaKernel, MmaProblem};
use crate::paged::{self, PagedKernel, PagedProblem};
use crate::simt::{self, SimtKernel};

use super::cublas_gemm::{CublasKernel, CublasParams};
use super::sm90_tc_gemm::Sm90Kernel;

/// Where an operand starts: a kernel parameter and an offset into it.
#[derive(Clone, Debug, PartialEq)]
pub struct OperandRef {
    /// Index into `Kernel::params`.
    pub param: usize,
    pub offset_bytes: u64,
}

/// Which template, with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanKind {
    /// The Hopper GEMM (`crate::gemm`): wgmma fed by TMA; with where C goes when the
    /// template's built-in epilogue stores a plain product (no epilogue function).
    Sm90(gemm::Params, Option<OperandRef>),
    /// The `mma.sync` GEMM (`crate::mma`), with a convolution's geometry when A is an implicit
    /// im2col.
    Mma(mma::Params, Option<mma::ConvGeom>),
    /// cuBLASLt (`cublas.gemm`): a library call, nothing to compile.
    Cublas(CublasParams),
    /// The exact-f32 SIMT GEMM (`crate::simt`).
    SimtF32(simt::Params),
    /// The decode-shaped GEMV (`crate::gemv`): at most 16 rows, weights streamed once (a
    /// row-major B repacked when the kernel is bound).
    Gemv(gemv::Params),
    /// FlashAttention (`crate::flash`): the problem (the plan's `problem` is only a GEMM-shaped
    /// summary: the second product per batch and head), parameters and operands.
    Flash(Box<FlashProblem>, flash::Params, FlashArgs),
    /// Paged decode attention (`crate::paged`): the problem and parameters (the plan's
    /// `problem` is a GEMM-shaped summary; the kernel takes `paged_attention`'s ten pointers).
    Paged(Box<PagedProblem>, paged::Params),
}

/// A template family's plan for one kernel: what to compile and how to launch it.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyPlan {
    pub family: &'static str,
    pub problem: Problem,
    pub kind: PlanKind,
    pub a: OperandRef,
    pub b: OperandRef,
    /// The function the source defines.
    pub entry: String,
    /// CUDA C++ (prelude included); empty for a library kernel (nothing to compile).
    pub source: String,
}

impl FamilyPlan {
    /// The launch shape before the device is known (grid: one block per SM for persistent
    /// kernels; the loaded kernel's [`FamilyKernel::launch_config`] is exact).
    pub fn launch(&self, sm_count: u32) -> LaunchConfig {
        match &self.kind {
            PlanKind::Sm90(q, _) => LaunchConfig {
                grid: (sm_count, 1, 1),
                block: (q.threads() as u32, 1, 1),
                shared_mem_bytes: q.smem_bytes() as u32,
            },
            PlanKind::Mma(q, _) => LaunchConfig {
                grid: (mma::tiles(&self.problem, q) as u32, 1, (self.problem.batch * q.split_k) as u32),
                block: (q.threads() as u32, 1, 1),
                shared_mem_bytes: q.smem_bytes() as u32,
            },
            PlanKind::SimtF32(q) => simt::launch_config(&self.problem, q),
            PlanKind::Gemv(q) => gemv::config(&self.problem, q),
            PlanKind::Flash(p, q, _) => flash::config(p, q),
            PlanKind::Paged(p, q) => paged::configs(p, q)[0],
            // A library call: the library chooses its launches.
            PlanKind::Cublas(_) => LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 },
        }
    }

    /// Whether the plan has CUDA C++ to compile (a library kernel has none).
    pub fn compiles(&self) -> bool {
        !self.source.is_empty()
    }

    /// One line for reports: shape, layouts and parameters.
    pub fn describe(&self) -> String {
        if let PlanKind::Paged(p, q) = &self.kind {
            return format!(
                "{} paged attention batch {} heads {}/{} new tokens {} head dim {}/{} {}, {} blocks of {} tokens, {} per sequence; chunks of {} tokens ({} per sequence), {} warps, {} rows per block, unroll {}",
                self.family,
                p.batch,
                p.heads_q,
                p.heads_kv,
                p.new_tokens,
                p.head_dim,
                p.v_head_dim,
                p.dtype.name(),
                p.blocks,
                p.block_size,
                p.max_blocks,
                q.chunk,
                paged::chunks(p, q),
                q.warps,
                q.rows,
                q.unroll
            );
        }
        if let PlanKind::Flash(f, q, _) = &self.kind {
            return format!(
                "{} attention batch {} heads {}/{} seq {}x{} head dim {} {}{}{}{}; block {}x{}, {} warps, {} stages",
                self.family,
                f.batch,
                f.heads_q,
                f.heads_kv,
                f.seq_q,
                f.seq_k,
                f.head_dim,
                f.dtype.name(),
                match f.causal {
                    Some(c) => format!(", causal {c:?}"),
                    None => String::new(),
                },
                match &f.mask {
                    Some(m) => format!(", {:?} mask strides {:?} over {} keys", m.kind, m.strides, m.len),
                    None => String::new(),
                },
                if f.zero_nan_rows { ", NaN rows zeroed" } else { "" },
                q.block_m,
                q.block_n,
                q.warps,
                q.stages
            );
        }
        let p = &self.problem;
        let l = |l: Layout| if l == Layout::RowMajor { "row" } else { "col" };
        let mut rows = match p.custom.as_ref().and_then(|c| c.rows) {
            Some(r) => format!(" ({} batches of {r} rows flattened)", p.m / r.max(1)),
            None => String::new(),
        };
        if let Some(s) = p.batch_split {
            rows.push_str(&format!(" (batches split by {} into two strides)", s.div));
        }
        if let Some(s) = p.a_split {
            rows.push_str(&format!(
                " (A read as {} groups of {} rows x {} slices of 64)",
                p.m / s.rows.max(1),
                s.rows,
                p.k / 64
            ));
        }
        let im2col = p.conv.map_or(String::new(), |c| {
            format!(
                "A an implicit im2col of {}x{}x{}x{} (kernel {}x{}, stride {}x{}), weights repacked; ",
                c.n, c.h, c.w, c.c, c.kh, c.kw, c.stride.0, c.stride.1
            )
        });
        let params = match &self.kind {
            PlanKind::Sm90(q, _) => format!(
                "{im2col}tile {}x{}x{}, {} stages, {} consumer warpgroups, cluster {}, group {}",
                q.tile_m, q.tile_n, q.tile_k, q.stages, q.consumers, q.cluster_m, q.group_m
            ),
            PlanKind::Mma(q, _) => format!(
                "{im2col}tile {}x{}x{}, {}x{} warps, {} stages, split-K {}",
                q.tile_m, q.tile_n, q.tile_k, q.warps_m, q.warps_n, q.stages, q.split_k
            ),
            PlanKind::SimtF32(q) => format!(
                "tile {}x{}x{}, split-K {}, exact f32 FMA, {} and {} floats per read of A and B",
                q.tile_m,
                q.tile_n,
                q.tile_k,
                q.split_k,
                simt::render::vector_a(p, &self.a),
                simt::render::vector_b(p, &self.b)
            ),
            PlanKind::Gemv(q) => format!(
                "{}{}x{} warps (columns x K), {} column groups of 8 per warp, unroll {}, split-K {}, prefetch {}{}{}",
                if q.tiled { "B repacked to fragment tiles at bind; " } else if gemv::repacked(p, q) { "B repacked to K-contiguous rows at bind; " } else { "" },
                q.warps_n,
                q.warps_k,
                q.cols,
                q.unroll,
                q.split_k,
                q.prefetch,
                if q.a_ahead { ", A loaded a step ahead" } else { "" },
                if q.stages >= 2 { format!(", {} shared-memory stages", q.stages) } else { String::new() }
            ),
            PlanKind::Flash(..) | PlanKind::Paged(..) => String::new(),
            PlanKind::Cublas(q) => format!(
                "cuBLASLt, {} out, compute {}",
                q.out_dtype.name(),
                if q.lt.tf32 && p.in_dtype == tilec_ir::DType::F32 { "32F_FAST_TF32" } else { "32F" }
            ),
        };
        format!(
            "{} {}x{}x{} batch {}{rows}, {} A {}-major, B {}-major, f32 accumulation; {params}",
            self.family,
            p.m,
            p.n,
            p.k,
            p.batch,
            if p.tf32 { "f32 (as tf32)" } else { p.in_dtype.name() },
            l(p.a_layout),
            l(p.b_layout),
        )
    }
}

/// A template family's kernel loaded on a device, launched with the tile-IR kernel's pointers.
pub enum FamilyKernel {
    Sm90(Sm90Kernel),
    Mma(MmaKernel, FamilyPlan),
    Cublas(CublasKernel),
    SimtF32(SimtKernel, FamilyPlan),
    Gemv(GemvKernel, FamilyPlan),
    Flash(FlashKernel, FamilyPlan),
    Paged(PagedKernel, FamilyPlan),
}

impl FamilyKernel {
    /// Loads a plan's compiled image (a library plan has none: `image` is unused).
    pub fn load(device: &Device, plan: &FamilyPlan, image: &[u8], cache_hit: bool) -> Result<FamilyKernel> {
        match &plan.kind {
            PlanKind::Sm90(..) => Sm90Kernel::load(device, plan, image, cache_hit).map(FamilyKernel::Sm90),
            PlanKind::Mma(q, conv) => {
                let problem = MmaProblem { gemm: plan.problem.clone(), conv: *conv };
                let k = MmaKernel::from_image(device, &problem, q, &plan.a, &plan.b, image, cache_hit)?;
                Ok(FamilyKernel::Mma(k, plan.clone()))
            }
            PlanKind::Cublas(_) => CublasKernel::load(device, plan).map(FamilyKernel::Cublas),
            PlanKind::SimtF32(q) => {
                let k = SimtKernel::from_image(device, &plan.problem, q, &plan.a, &plan.b, image, cache_hit)?;
                Ok(FamilyKernel::SimtF32(k, plan.clone()))
            }
            PlanKind::Gemv(q) => {
                let k = GemvKernel::from_image(device, &plan.problem, q, &plan.a, &plan.b, image, cache_hit)?;
                Ok(FamilyKernel::Gemv(k, plan.clone()))
            }
            PlanKind::Flash(p, q, a) => {
                let k = FlashKernel::from_image(device, p, q, a, image, cache_hit)?;
                Ok(FamilyKernel::Flash(k, plan.clone()))
            }
            PlanKind::Paged(p, q) => {
                let k = PagedKernel::from_image(device, p, q, image, cache_hit)?;
                Ok(FamilyKernel::Paged(k, plan.clone()))
            }
        }
    }

    pub fn plan(&self) -> &FamilyPlan {
        match self {
            FamilyKernel::Sm90(k) => k.plan(),
            FamilyKernel::Mma(_, plan) | FamilyKernel::SimtF32(_, plan) | FamilyKernel::Gemv(_, plan) | FamilyKernel::Flash(_, plan) | FamilyKernel::Paged(_, plan) => plan,
            FamilyKernel::Cublas(k) => k.plan(),
        }
    }

    /// The kernel function (for attributes such as registers); a library kernel has none.
    pub fn function(&self) -> Option<&Function> {
        match self {
            FamilyKernel::Sm90(k) => Some(k.gemm().function()),
            FamilyKernel::Mma(k, _) => Some(k.function()),
            FamilyKernel::SimtF32(k, _) => Some(k.function()),
            FamilyKernel::Gemv(k, _) => Some(k.function()),
            FamilyKernel::Flash(k, _) => Some(k.function()),
            FamilyKernel::Paged(k, _) => Some(k.function()),
            FamilyKernel::Cublas(_) => None,
        }
    }

    /// The launch shape on this device.
    pub fn launch_config(&self) -> LaunchConfig {
        match self {
            FamilyKernel::Sm90(k) => {
                let q = match &k.plan().kind {
                    PlanKind::Sm90(q, _) => *q,
                    _ => gemm::Params::default(),
                };
                LaunchConfig {
                    grid: (k.gemm().resident_blocks(), 1, 1),
                    block: (q.threads() as u32, 1, 1),
                    shared_mem_bytes: q.smem_bytes() as u32,
                }
            }
            FamilyKernel::Mma(k, _) => k.launch_config(),
            FamilyKernel::SimtF32(k, _) => k.launch_config(),
            FamilyKernel::Gemv(k, _) => k.launch_config(),
            FamilyKernel::Flash(k, _) => k.launch_config(),
            FamilyKernel::Paged(k, _) => k.launch_config(),
            FamilyKernel::Cublas(k) => k.plan().launch(0),
        }
    }

    /// Prepares what depends on the pointers (a convolution's or a GEMV's repacked weights): once, before
    /// the first launch and outside graph capture. A library call is run once here, so that
    /// whatever the library loads on its first call is not loaded inside a graph capture (it
    /// writes the output, which the model's run overwrites).
    pub fn bind(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        match self {
            FamilyKernel::Sm90(k) => k.bind(stream, ptrs),
            FamilyKernel::SimtF32(..) | FamilyKernel::Flash(..) | FamilyKernel::Paged(..) => Ok(()),
            FamilyKernel::Cublas(k) => {
                k.launch(stream, ptrs)?;
                stream.synchronize()
            }
            FamilyKernel::Mma(k, _) => k.bind(stream, ptrs),
            FamilyKernel::Gemv(k, _) => k.bind(stream, ptrs),
        }
    }

    /// Launches on `stream` with one device pointer per parameter of the tile-IR kernel.
    pub fn launch(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        match self {
            FamilyKernel::Sm90(k) => k.launch(stream, ptrs),
            FamilyKernel::Mma(k, _) => k.launch(stream, ptrs),
            FamilyKernel::SimtF32(k, _) => k.launch(stream, ptrs),
            FamilyKernel::Gemv(k, _) => k.launch(stream, ptrs),
            FamilyKernel::Flash(k, _) => k.launch(stream, ptrs),
            FamilyKernel::Paged(k, _) => k.launch(stream, ptrs),
            FamilyKernel::Cublas(k) => k.launch(stream, ptrs),
        }
    }
}
