//! `sm90_tc_gemm`: the Hopper tensor-core GEMM template of [`crate::gemm`] (wgmma fed by TMA,
//! warp-specialized, persistent) for a kernel that is one `Gemm` over 16-bit or fp8 operands
//! (f32 ones as tf32 when the target allows it) read straight from buffers, with its epilogue
//! rendered from the tile IR as a device function.
//!
//! A template kernel keeps the ABI of the tile-IR kernel it replaces (one device pointer per
//! parameter, in `Kernel::params` order), so the executor launches it like any other; see
//! [`crate::GpuKernel::launch`]. Its build carries the SIMT GEMM as a fallback, run when the
//! template does not compile or load.

use std::sync::Mutex;

use tilec_ir::DType;
use tilec_tile::Kernel;

use crate::driver::{Device, Stream};
use crate::repack::Repacked;
use crate::error::{CudaError, Result};
use crate::gemm::{self, GemmArgs, GemmKernel, Params};
use crate::render::CudaSource;
use crate::schedule::GpuTarget;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params as FParams, Problem as FProblem};

use super::conv_view::conv_view;
use super::operands::{gemm_view, GemmView};
use super::template::{FamilyPlan, OperandRef, PlanKind};

/// The Hopper tensor-core GEMM family's name.
pub const HOPPER_GEMM: &str = "sm90_tc_gemm";

/// The depth up to which a convolution of at most [`NARROW_CONV_N`] output channels is left to
/// the mma.sync family (see [`hopper_gemm`]).
pub const SHALLOW_CONV_K: usize = 256;
/// Output channels up to which a shallow convolution is left to the mma.sync family.
pub const NARROW_CONV_N: usize = 64;

/// The Hopper family: a kernel that is one `Gemm` over f16/bf16 or fp8 operands (unscaled: an
/// ONNX product has no per-tensor scales), or f32 ones multiplied as tf32 where
/// `GpuTarget::allow_tf32` says so, read by TMA from their buffers (see [`gemm_view`]), any
/// straight-line epilogue, on an sm_90 device. fp8 and tf32 need both operands K-major (A
/// row-major, B column-major); [`gemm::applies`] says so otherwise.
pub fn hopper_gemm(p: &FProblem, k: &Kernel, target: &GpuTarget) -> std::result::Result<FamilyPlan, String> {
    if target.compute_capability != (9, 0) {
        return Err(format!(
            "needs compute capability 9.0 (wgmma, TMA); the device has {}.{}",
            target.compute_capability.0, target.compute_capability.1
        ));
    }
    // A convolution through the im2col copy; one the copy cannot read may still be a plain
    // product of its buffers (a 1x1 convolution of stride 1).
    let conv_err = match conv_view(p, k).map(|v| v.and_then(|v| hopper_conv(v, target))) {
        // A shallow, narrow convolution (a 1x1 over at most 256 channels into at most 64) is
        // bound by its output, which the mma.sync family's several blocks per SM overlap best
        // (ResNet-50's at batch 64, H100: 64 to 64 channels 20.4 against 24.1 us, 256 to 64
        // even). Wider ones store from registers here, regrouped by warp shuffles, and are
        // faster here (64 to 256 channels 54.8 against 66.4 us, 256 to 128 59.9 against 63.3,
        // 128 to 512 33.3 against 41.4, 256 to 512 at stride 2 42.3 against 72.3).
        Some(Ok(plan)) if plan.problem.k <= SHALLOW_CONV_K && plan.problem.n <= NARROW_CONV_N => {
            return Err(format!(
                "a shallow convolution (K = {}, {} output channels): the {} family overlaps its output stores",
                plan.problem.k,
                plan.problem.n,
                super::MMA_GEMM
            ))
        }
        Some(Ok(plan)) => return Ok(plan),
        Some(Err(e)) => Some(e),
        None => None,
    };
    let GemmView { mut problem, a, b } = gemm_view(k).map_err(|e| match &conv_err {
        Some(c) => format!("{c}; as a plain product: {e}"),
        None => e,
    })?;
    match problem.in_dtype {
        DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => {}
        DType::F32 if target.allow_tf32 => problem.tf32 = true,
        DType::F32 => {
            return Err(
                "operands are f32, not f16, bf16 or fp8 (tf32 only with --allow-tf32: f32 stays exact \
                 by default)"
                    .into(),
            )
        }
        d => return Err(format!("operands are {}, not f16, bf16, fp8 or f32", d.name())),
    }
    // A plain 16-bit product whose rows are not whole 16-byte vectors (an odd vocabulary: GPT-2's
    // LM head over 50257 ids) has no vector epilogue function; the built-in epilogue stores it
    // straight into C, each row realigned into whole 16-byte stores (`Params::rowstore`).
    let mut c = None;
    if problem.custom.as_ref().is_some_and(|e| e.vector.is_none()) {
        if let Ok((at, out @ (DType::F16 | DType::BF16))) = super::plain_store(k) {
            problem.custom = None;
            problem.out_dtype = out;
            c = Some(at);
        }
    }
    let mut params = gemm::heuristic(&problem, target.sm_count as usize);
    // Skinny products (decode-shaped: a few rows against a large B) are bound by reading B;
    // with fewer tiles than SMs this persistent kernel leaves SMs idle, where the mma.sync
    // family splits K over blocks and streams B from all of them.
    // Likewise a short product whose tiles fill at most a quarter of the SMs while K is at
    // least 16 K-blocks deep: split over the idle SMs, its K-blocks run side by side. Measured
    // on GPT-2's products at 128 tokens (H200): 128x768x3072 (6 tiles, 48 K-blocks) takes
    // 18.5 us there against 24.4 here; 128x2304x768 and 128x3072x768 (36 and 48 tiles of 12
    // K-blocks) take 11.7 and 14.4 us there against 9.3 here, so they stay.
    let tiles = problem.m.div_ceil(params.tile_m) * problem.n.div_ceil(params.tile_n) * problem.batch;
    let sms = target.sm_count as usize;
    let kblocks = problem.k.div_ceil(problem.tile_k());
    let skinny = problem.m <= 64 && problem.k >= 1024 && tiles < sms;
    let sixteen_bit = matches!(problem.in_dtype, DType::F16 | DType::BF16);
    let few_tiles = sixteen_bit && problem.batch == 1 && kblocks >= 16 && 4 * tiles <= sms;
    if problem.a_split.is_none() && (skinny || few_tiles) {
        return Err(format!(
            "a skinny product ({} rows, {tiles} tiles for {sms} SMs, {kblocks} K-blocks): the split-K {} keeps more SMs busy",
            problem.m,
            super::MMA_GEMM
        ));
    }
    // A split A's row groups must hold whole tiles: 64-row tiles where 128 do not fit.
    if problem
        .a_split
        .is_some_and(|s| s.rows % params.tile_m != 0 && s.rows % 64 == 0)
    {
        let narrow = Params {
            tile_m: 64,
            consumers: 1,
            ..params
        };
        let fit = (2..=8).rev().find(|&s| {
            Params {
                stages: s,
                ..narrow
            }
            .smem_bytes()
                <= gemm::MAX_SMEM
        });
        params = Params {
            stages: fit.unwrap_or(2),
            ..narrow
        };
    }
    gemm::applies(&problem, &params, target.compute_capability)?;
    Ok(FamilyPlan {
        family: HOPPER_GEMM,
        entry: gemm::kernel_name(&problem, &params),
        source: gemm::render(&problem, &params),
        a,
        b,
        problem,
        kind: PlanKind::Sm90(params, c),
    })
}

/// A convolution as an implicit GEMM: the input through the copy engine's im2col mode (64
/// channels of one tap per K step), the weights repacked at bind.
fn hopper_conv(view: GemmView, target: &GpuTarget) -> std::result::Result<FamilyPlan, String> {
    let GemmView { problem, a, b } = view;
    let params = gemm::heuristic(&problem, target.sm_count as usize);
    gemm::applies(&problem, &params, target.compute_capability)?;
    Ok(FamilyPlan {
        family: HOPPER_GEMM,
        entry: gemm::kernel_name(&problem, &params),
        source: gemm::render(&problem, &params),
        a,
        b,
        problem,
        kind: PlanKind::Sm90(params, None),
    })
}

/// A family kernel loaded on a device, launched with the tile-IR kernel's pointers. The
/// launch arguments (tensor maps hold the operands' addresses) are encoded on the first launch
/// with a set of pointers and reused while the pointers stay the same (the arena and the
/// constants do not move, so in a compiled model: once).
pub struct Sm90Kernel {
    plan: FamilyPlan,
    gemm: GemmKernel,
    bound: Mutex<Option<(Vec<u64>, GemmArgs)>>,
    /// A convolution's repacked weights.
    packed: Option<Repacked>,
}

impl Sm90Kernel {
    pub fn load(
        device: &Device,
        plan: &FamilyPlan,
        image: &[u8],
        cache_hit: bool,
    ) -> Result<Sm90Kernel> {
        let params = sm90_params(plan)?;
        let mut gemm = GemmKernel::from_image(device, &plan.problem, &params, image, cache_hit)?;
        // Raised now rather than at the first launch, which may be inside a graph capture.
        gemm.function()
            .reserve_dynamic_smem(params.smem_bytes() as u32)?;
        let packed = match (&plan.problem.conv, gemm.take_repack_function()) {
            (Some(c), Some(f)) => Some(Repacked::new(&plan.entry, f, device.alloc(plan.problem.n * c.k_padded() * 2)?)),
            _ => None,
        };
        Ok(Sm90Kernel {
            plan: plan.clone(),
            gemm,
            bound: Mutex::new(None),
            packed,
        })
    }

    pub fn plan(&self) -> &FamilyPlan {
        &self.plan
    }

    pub fn gemm(&self) -> &GemmKernel {
        &self.gemm
    }

    fn at(o: &OperandRef, ptrs: &[u64]) -> Result<u64> {
        ptrs.get(o.param)
            .map(|p| p + o.offset_bytes)
            .ok_or_else(|| CudaError::Usage(format!("operand parameter {} missing", o.param)))
    }

    fn encode(&self, ptrs: &[u64]) -> Result<GemmArgs> {
        let (a, mut b) = (Self::at(&self.plan.a, ptrs)?, Self::at(&self.plan.b, ptrs)?);
        if let Some(p) = &self.packed {
            b = p.ptr(b)?;
        }
        // A plain product goes straight to C; an epilogue function takes every pointer.
        match &self.plan.kind {
            PlanKind::Sm90(_, Some(c)) => self.gemm.args_with(&self.plan.problem, a, b, Self::at(c, ptrs)?, None, &[]),
            _ => self.gemm.args_with(&self.plan.problem, a, b, 0, None, ptrs),
        }
    }

    /// Prepares what depends on the pointers (a convolution's repacked weights) on `stream`,
    /// and waits for it: before the first launch, outside any graph capture. The weights must
    /// not change afterwards (they are a model's constants).
    pub fn bind(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        match &self.packed {
            Some(p) => p.bind(stream, Self::at(&self.plan.b, ptrs)?),
            None => Ok(()),
        }
    }

    /// Launches on `stream` with one device pointer per parameter of the tile-IR kernel.
    pub fn launch(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        let mut bound = self
            .bound
            .lock()
            .map_err(|_| CudaError::Usage("a family kernel's launch state is poisoned".into()))?;
        if bound.as_ref().is_none_or(|(p, _)| p.as_slice() != ptrs) {
            *bound = Some((ptrs.to_vec(), self.encode(ptrs)?));
        }
        match bound.as_ref() {
            Some((_, args)) => self.gemm.launch(stream, args),
            None => Err(CudaError::Usage("no launch arguments".into())),
        }
    }
}

/// The family as the registry holds it.
pub struct Sm90TcGemm;
pub static SM90_TC_GEMM: Sm90TcGemm = Sm90TcGemm;

const NAMES: [&str; 8] = ["tile_m", "tile_n", "tile_k", "stages", "consumers", "cluster_m", "group_m", "pingpong"];

fn to_params(q: &Params) -> FParams {
    let v = [q.tile_m, q.tile_n, q.tile_k, q.stages, q.consumers, q.cluster_m, q.group_m, q.pingpong as usize];
    FParams(NAMES.iter().copied().zip(v.map(|x| x as i64)).collect())
}

/// `q` with the values `p` sets.
fn with_params(q: Params, p: &FParams) -> Params {
    let get = |n: &str, d: usize| p.get(n).map_or(d, |v| v.max(0) as usize);
    Params {
        tile_m: get("tile_m", q.tile_m),
        tile_n: get("tile_n", q.tile_n),
        tile_k: get("tile_k", q.tile_k),
        stages: get("stages", q.stages),
        consumers: get("consumers", q.consumers),
        cluster_m: get("cluster_m", q.cluster_m),
        group_m: get("group_m", q.group_m),
        pingpong: get("pingpong", q.pingpong as usize) != 0,
        ..q
    }
}

/// The plan for a problem's kernel (the fused GEMM kernel, its heuristic parameters).
/// The Hopper parameters of a plan (a plan of another template is a usage error).
fn sm90_params(plan: &FamilyPlan) -> Result<Params> {
    match &plan.kind {
        PlanKind::Sm90(q, _) => Ok(*q),
        #[allow(unreachable_patterns)]
        _ => Err(CudaError::Usage(format!("{} is not a Hopper GEMM plan", plan.entry))),
    }
}

fn params_of(plan: &FamilyPlan) -> Params {
    sm90_params(plan).unwrap_or_default()
}

fn plan_of(p: &FProblem, t: &Target) -> std::result::Result<FamilyPlan, String> {
    p.memo("sm90_tc_gemm.plan", || hopper_gemm(p, &super::lowered(p)?.kernel, &t.gpu))
}

impl Family for Sm90TcGemm {
    type Target = Target;
    type Built = super::GpuBuilt;

    fn name(&self) -> &'static str {
        HOPPER_GEMM
    }

    fn applies(&self, p: &FProblem, t: &Target) -> std::result::Result<(), String> {
        plan_of(p, t).map(drop)
    }

    fn space(&self, p: &FProblem, t: &Target) -> ParamSpace {
        // One 128-byte row of K per stage: 64 16-bit, 128 fp8 or 32 tf32 elements.
        let tile_k = plan_of(p, t).map_or(64, |plan| plan.problem.tile_k() as i64);
        ParamSpace {
            axes: vec![
                ("tile_m", vec![64, 128]),
                ("tile_n", vec![64, 128, 192, 256]),
                ("tile_k", vec![tile_k]),
                ("stages", vec![2, 3, 4, 5, 6, 8]),
                ("consumers", vec![1, 2]),
                ("cluster_m", vec![1, 2]),
                ("group_m", vec![1, 4, 8, 16]),
                // Each consumer warpgroup owning whole tiles, one's epilogue under the other's
                // products (two consumers, no cluster).
                ("pingpong", vec![0, 1]),
            ],
        }
    }

    /// Whatever the template accepts for the problem ([`gemm::applies`]).
    fn check(&self, p: &FProblem, t: &Target, params: &FParams) -> std::result::Result<(), String> {
        let plan = plan_of(p, t)?;
        gemm::applies(&plan.problem, &with_params(params_of(&plan), params), t.gpu.compute_capability)
    }

    fn heuristic(&self, p: &FProblem, t: &Target) -> FParams {
        plan_of(p, t).map(|plan| to_params(&params_of(&plan))).unwrap_or_default()
    }

    /// A roofline over the tiles with wave quantization over the SMs (one persistent block per
    /// SM); one consumer warpgroup on 128-row tiles overlaps less.
    fn estimate(&self, p: &FProblem, t: &Target, params: &FParams) -> Option<f64> {
        let plan = plan_of(p, t).ok()?;
        let q = with_params(params_of(&plan), params);
        let pr = &plan.problem;
        let g = super::estimate::TiledGemm {
            m: pr.m,
            n: pr.n,
            k: pr.k,
            batch: pr.batch,
            tile_m: q.tile_m,
            tile_n: q.tile_n,
            tile_k: q.tile_k,
            stages: q.stages,
            split_k: 1,
            in_bytes: pr.elem_bytes(),
            out_bytes: pr.out_dtype.size_bytes(),
            efficiency: if q.consumers == 1 && q.tile_m > 64 { 0.85 } else { 1.0 },
        };
        Some(super::estimate::roofline(&g, t))
    }

    fn build(&self, p: &FProblem, t: &Target, params: &FParams) -> std::result::Result<super::GpuBuilt, String> {
        let mut plan = plan_of(p, t)?;
        let q = with_params(params_of(&plan), params);
        if q != params_of(&plan) {
            if let PlanKind::Sm90(p, _) = &mut plan.kind {
                *p = q;
            }
            plan.entry = gemm::kernel_name(&plan.problem, &q);
            plan.source = gemm::render(&plan.problem, &q);
        }
        // The SIMT GEMM, run if the template does not compile or load.
        let simt = super::TileIr(&super::simt_gemm::SimtGemm).build(p, t, &FParams::default())?;
        let source = CudaSource {
            name: plan.entry.clone(),
            source: plan.source.clone(),
            launch: plan.launch(t.gpu.sm_count),
        };
        Ok(super::GpuBuilt {
            lowered: simt.lowered,
            scheduled: simt.scheduled,
            schedule: HOPPER_GEMM,
            source,
            plan: Some(plan),
            fallback: Some((simt.schedule, simt.source)),
        })
    }
}
