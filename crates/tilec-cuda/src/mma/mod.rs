//! Tensor-core GEMM with `mma.sync` (sm_80 and later): a kernel family rendered as CUDA C++
//! for one problem and parameter set, compiled with NVRTC and launched through the driver.
//!
//! `C = A · B` for 16-bit inputs (bf16 or f16) with f32 accumulation, the result handed
//! element by element to the kernel's epilogue (a device function rendered from the tile IR).
//! Every thread of a block copies slices of A and B into a ring of shared-memory stages with
//! `cp.async` (16 bytes at a time, zero-filled past the edges, XOR-swizzled so that `ldmatrix`
//! reads without bank conflicts); warps multiply their part of the tile with
//! `mma.sync.m16n8k16` from fragments loaded by `ldmatrix` (transposed for operands that are
//! not K-contiguous).
//!
//! Two kinds of A:
//! - a matrix (row- or column-major, batched or not), as in [`crate::gemm::Problem`];
//! - an implicit im2col of a channels-last 2-D convolution ([`ConvGeom`]): row `r` of A is
//!   output pixel `r` (image-major), column `k` is tap `k / C`, channel `k % C`; the copy
//!   computes each 16-byte slice's address (and zero-fills the padding). The weights are
//!   repacked once, when the kernel is bound, from `[O][C][KH][KW]` to K-contiguous rows
//!   `[O][KH][KW][C]` (padded to a multiple of 8), so B is a plain column-major matrix.
//!
//! Skinny problems (few tiles for the SMs) split K over blocks ([`Params::split_k`]): each
//! block stores its partial tile to a workspace, and the last block of a tile to arrive (a
//! counter per tile) adds them up and runs the epilogue.
//!
//! Shapes are compiled in (constants), unlike the Hopper template: the divisions of the
//! implicit im2col become multiplications, and equal layers still share one kernel.

mod launch;
pub(crate) mod render;

pub use launch::MmaKernel;
pub use render::{kernel_name, render};

pub use crate::gemm::ConvGeom;
use crate::gemm::{Layout, Problem};
use tilec_ir::DType;

/// The problem: a GEMM (with the kernel's custom epilogue) and, for a convolution, its
/// geometry (then `gemm.m` is `n * oh * ow`, `gemm.k` the taps times channels, and B the
/// repacked weights).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmaProblem {
    pub gemm: Problem,
    pub conv: Option<ConvGeom>,
}

/// Parameters of the family.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Rows and columns of C per block.
    pub tile_m: usize,
    pub tile_n: usize,
    /// K per stage: 64, 128 or 256 (slices of 64: a 128-byte row of 16-bit elements each).
    pub tile_k: usize,
    /// Warps along M and N (each owns `tile_m / warps_m` x `tile_n / warps_n`).
    pub warps_m: usize,
    pub warps_n: usize,
    /// Shared-memory stages in the ring.
    pub stages: usize,
    /// Blocks sharing one tile's K range (1: no split).
    pub split_k: usize,
    /// Bytes the L2 fetches past each copy (0, 128 or 256: the `cp.async` prefetch hint).
    pub prefetch: usize,
    /// The epilogue reads the tile back from shared memory so that a warp's lanes take
    /// adjacent columns of a row (whole-sector stores); otherwise each thread hands its
    /// fragments to the epilogue straight from registers.
    pub staged: bool,
    /// The staged epilogue parks the tile in 16 bits where that changes no result
    /// ([`park_dtype`]); `false` keeps it f32 (for comparisons).
    pub park16: bool,
    /// The epilogue regroups each quad's accumulators with warp shuffles so that a lane hands
    /// 8 adjacent columns of a row to the vector epilogue function, straight from registers
    /// (as the Hopper template's, [`crate::gemm::Params::shuffle`]); where it applies
    /// ([`shuffled`]) it takes the place of `staged`.
    pub shuffle: bool,
}

/// Whether the kernel for `p` and `q` uses the shuffled epilogue: asked for, with a vector
/// epilogue function, and each warp's columns whole groups of 32 (four 8-column fragments).
pub fn shuffled(p: &MmaProblem, q: &Params) -> bool {
    q.shuffle && p.gemm.custom.as_ref().is_some_and(|c| c.vector.is_some()) && q.warp_n() % 32 == 0
}

impl Default for Params {
    fn default() -> Params {
        Params { tile_m: 128, tile_n: 128, tile_k: 64, warps_m: 2, warps_n: 4, stages: 4, split_k: 1, prefetch: 0, staged: true, park16: true, shuffle: false }
    }
}

/// The 16-bit dtype the staged epilogue parks the tile in, or `None` for f32: where the epilogue
/// function rounds the product to that dtype first anyway
/// ([`CustomEpilogue::rounds_to`](crate::gemm::CustomEpilogue::rounds_to), as after a 16-bit
/// MatMul), so rounding it before parking is exact; tiles at least 64 columns wide (eight
/// 16-byte groups a row, the swizzle's span).
pub fn park_dtype(p: &MmaProblem, q: &Params) -> Option<DType> {
    if !q.staged || !q.park16 || q.tile_n < 64 || shuffled(p, q) {
        return None;
    }
    // As the Hopper template (`gemm::park_dtype`): only with a vector epilogue function.
    let c = p.gemm.custom.as_ref().filter(|c| c.vector.is_some())?;
    c.rounds_to.filter(|d| matches!(d, DType::F16 | DType::BF16))
}

/// Shared memory a block may take (sm_90; the device's own limit is checked at load).
pub const MAX_SMEM: usize = 232_448;

impl Params {
    pub fn threads(&self) -> usize {
        32 * self.warps_m * self.warps_n
    }
    pub fn warp_m(&self) -> usize {
        self.tile_m / self.warps_m.max(1)
    }
    pub fn warp_n(&self) -> usize {
        self.tile_n / self.warps_n.max(1)
    }
    /// Bytes of one stage (A and B tiles, 16-bit elements).
    pub fn stage_bytes(&self) -> usize {
        (self.tile_m + self.tile_n) * self.tile_k * 2
    }
    /// Bytes of the staged epilogue's tile: f32, rows padded by 8 (parked in 16 bits it takes
    /// half of that or less; the f32 size is reserved either way).
    pub fn staging_bytes(&self) -> usize {
        if self.staged {
            self.tile_m * (self.tile_n + 8) * 4
        } else {
            0
        }
    }
    /// Dynamic shared memory: the stage ring, or the staged epilogue's tile if larger (it
    /// reuses the ring once the main loop is done).
    pub fn smem_bytes(&self) -> usize {
        (self.stages * self.stage_bytes()).max(self.staging_bytes())
    }

    /// Blocks that fit on one SM at once, by shared memory (228 KiB, 1 KiB reserved per block)
    /// and threads (2048).
    pub fn blocks_per_sm(&self) -> usize {
        let by_smem = (233_472 / (self.smem_bytes() + 1024)).max(1);
        by_smem.min(2048 / self.threads()).max(1)
    }

    /// Checks the parameters on their own.
    pub fn validate(&self) -> Result<(), String> {
        if ![64, 128, 256].contains(&self.tile_k) {
            return Err(format!("tile_k {} (64, 128 or 256: slices of one 128-byte row)", self.tile_k));
        }
        if !(1..=8).contains(&(self.warps_m * self.warps_n)) {
            return Err(format!("{} x {} warps (1 to 8)", self.warps_m, self.warps_n));
        }
        if self.warps_m == 0 || self.tile_m % self.warps_m != 0 || self.warp_m() % 16 != 0 {
            return Err(format!("tile_m {} over {} warps: not whole 16-row fragments", self.tile_m, self.warps_m));
        }
        if self.warps_n == 0 || self.tile_n % self.warps_n != 0 || self.warp_n() % 16 != 0 {
            return Err(format!("tile_n {} over {} warps: not whole 16-column pairs", self.tile_n, self.warps_n));
        }
        if !self.tile_m.is_power_of_two() || !self.tile_n.is_power_of_two() {
            return Err(format!("tile {}x{} (powers of two)", self.tile_m, self.tile_n));
        }
        if self.tile_m > 256 || self.tile_n > 256 {
            return Err(format!("tile {}x{} (at most 256 a side)", self.tile_m, self.tile_n));
        }
        // Accumulators per thread.
        if self.warp_m() * self.warp_n() / 32 > 128 {
            return Err(format!(
                "a {}x{} warp tile needs more than 128 accumulator registers per thread",
                self.warp_m(),
                self.warp_n()
            ));
        }
        if self.stages < 2 || self.stages > 8 {
            return Err(format!("{} stages (2 to 8)", self.stages));
        }
        if self.smem_bytes() > MAX_SMEM {
            return Err(format!(
                "{} stages of {} bytes (or the staged epilogue's {} bytes) exceed {MAX_SMEM} bytes of shared memory",
                self.stages,
                self.stage_bytes(),
                self.staging_bytes()
            ));
        }
        if ![0, 128, 256].contains(&self.prefetch) {
            return Err(format!("prefetch {} (0, 128 or 256 bytes)", self.prefetch));
        }
        if !(1..=32).contains(&self.split_k) {
            return Err(format!("split_k {} (1 to 32)", self.split_k));
        }
        Ok(())
    }
}

/// Whether `params` can run `problem` on a device of compute capability `cc`; `Err` says why.
pub fn applies(problem: &MmaProblem, q: &Params, cc: (u32, u32)) -> Result<(), String> {
    if cc.0 < 8 {
        return Err(format!("mma.sync with bf16 and cp.async need compute capability 8.0; the device has {}.{}", cc.0, cc.1));
    }
    q.validate()?;
    let p = &problem.gemm;
    if !matches!(p.in_dtype, DType::BF16 | DType::F16) {
        return Err(format!("operands are {}, not bf16 or f16", p.in_dtype.name()));
    }
    if p.custom.is_none() {
        return Err("no epilogue function (the template stores only through one)".into());
    }
    if let Some(sp) = p.a_split {
        if p.a_layout != Layout::RowMajor || p.batch != 1 || p.k % 64 != 0 {
            return Err("a split A must be row-major, unbatched, with K a multiple of 64".into());
        }
        if sp.rows == 0 || sp.head_stride % 8 != 0 || sp.group_stride % 8 != 0 || p.lda() % 8 != 0 {
            return Err("split A: strides are not multiples of 8 elements".into());
        }
    }
    if p.m == 0 || p.n == 0 || p.k == 0 || p.batch == 0 {
        return Err(format!("empty problem {}x{}x{} x{}", p.m, p.n, p.k, p.batch));
    }
    if p.m >= 1 << 31 || p.n >= 1 << 31 || p.k >= 1 << 31 {
        return Err("a dimension of 2^31 or more".into());
    }
    // Tiles whose rows are M or N (not K) are read 8 elements at a time along that side.
    if p.a_layout == Layout::ColMajor && q.tile_m < 64 {
        return Err(format!("a column-major A needs tile_m of 64 or more (got {})", q.tile_m));
    }
    if p.b_layout == Layout::RowMajor && q.tile_n < 64 {
        return Err(format!("a row-major B needs tile_n of 64 or more (got {})", q.tile_n));
    }
    let rule = |name: &str, ld: usize, inner: usize| {
        if ld < inner {
            Err(format!("{name}: leading dimension {ld} below its row of {inner}"))
        } else if ld % 8 != 0 {
            Err(format!("{name}: leading dimension {ld} is not a multiple of 8 elements (16-byte copies)"))
        } else {
            Ok(())
        }
    };
    match &problem.conv {
        Some(c) => {
            if p.batch != 1 || p.m != c.n * c.oh * c.ow || p.k != c.k() || p.b_layout != Layout::ColMajor {
                return Err("a convolution's GEMM must be one matrix of N*OH*OW rows and KH*KW*C depth over the repacked weights".into());
            }
            if p.ldb() != c.k_padded() {
                return Err(format!("repacked weights' rows are {} long, not {}", p.ldb(), c.k_padded()));
            }
            if [c.n, c.h, c.w, c.c, c.kh, c.kw, c.oh, c.ow, c.stride.0, c.stride.1, c.dil.0, c.dil.1].contains(&0) {
                return Err("a convolution with an empty or zero-strided axis".into());
            }
            if (c.n * c.h * c.w * c.c) >= 1 << 31 {
                return Err("a convolution input of 2^31 elements or more".into());
            }
        }
        None => {
            match p.a_layout {
                Layout::RowMajor if p.a_split.is_some() => rule("A (split)", p.lda(), 64)?,
                Layout::RowMajor => rule("A (row-major)", p.lda(), p.k)?,
                Layout::ColMajor => rule("A (column-major)", p.lda(), p.m)?,
            }
            match p.b_layout {
                Layout::RowMajor => rule("B (row-major)", p.ldb(), p.n)?,
                Layout::ColMajor => rule("B (column-major)", p.ldb(), p.k)?,
            }
            if let Some(bs) = p.batch_split {
                let all = [bs.a.0, bs.a.1, bs.b.0, bs.b.1];
                if bs.div == 0 || all.iter().any(|s| s % 8 != 0) {
                    return Err(format!("batch split by {} with strides {all:?}: not multiples of 8 elements", bs.div));
                }
            }
            if p.batch > 1 {
                for (name, s) in [("A", p.batch_stride_a), ("B", p.batch_stride_b)] {
                    if s % 8 != 0 {
                        return Err(format!("{name}: batch stride {s} is not a multiple of 8 elements"));
                    }
                }
            }
        }
    }
    if q.split_k > 1 && p.batch > 1 {
        return Err("split-K over a batched problem".into());
    }
    if q.split_k > p.k.div_ceil(q.tile_k) {
        return Err(format!("split_k {} exceeds the {} K-blocks", q.split_k, p.k.div_ceil(q.tile_k)));
    }
    Ok(())
}

/// Tiles of C (per batch).
pub fn tiles(p: &Problem, q: &Params) -> usize {
    p.m.div_ceil(q.tile_m) * p.n.div_ceil(q.tile_n)
}

/// Default parameters for a problem on a device with `sm_count` multiprocessors.
///
/// Large products take 128x128 tiles (8 warps of 64x32, 3 stages: two blocks per SM),
/// convolutions 128x64 (8 warps of 32x32, 4 stages). Fewer rows take 64- or
/// 16-row tiles; when the tiles still leave SMs idle, K is split over blocks (each keeping at
/// least four K-blocks) until about two blocks per SM run.
pub fn heuristic(problem: &MmaProblem, sm_count: usize) -> Params {
    let p = &problem.gemm;
    // Three stages: two blocks of 128x128 share an SM, each hiding the other's latency.
    // The staged epilogue: on ResNet-50's 1x1 convolutions (H200, batch 64) the shuffled one
    // lost to it on most shapes (30.0 against 36.4 µs at K = 256; it won 55 against 59 µs only
    // at K = 64), the staged read-back writing 256-byte runs of a row where the shuffled one
    // writes 64. The tuner may still pick it (`shuffle`).
    let mut q = Params { stages: 3, ..Params::default() };
    if problem.conv.is_some() && p.m > 64 {
        // Measured on ResNet-50's convolutions (H200): 128x64 tiles with 4x2 warps of 32x32 and
        // four stages beat 128x128 and 64x128 on every shape tried (1.1-1.8x).
        q = Params { tile_m: 128, tile_n: 64, warps_m: 4, warps_n: 2, stages: 4, ..q };
    } else if p.m <= 16 && p.a_layout == Layout::RowMajor {
        q = Params { tile_m: 16, tile_n: 128, warps_m: 1, warps_n: 4, stages: 6, ..q };
    } else if p.m <= 64 || tiles(p, &q) * p.batch < sm_count {
        q = Params { tile_m: 64, tile_n: 128, warps_m: 2, warps_n: 2, stages: 4, ..q };
    }
    if p.n <= 64 && q.tile_n > 64 && q.tile_m == 128 {
        // Narrow products (attention's P·V over a 64-wide head): no half-empty tiles.
        q = Params { tile_n: 64, warps_m: 4, warps_n: 2, ..q };
    }
    if p.b_layout == Layout::RowMajor && q.tile_n < 64 {
        q.tile_n = 64;
    }
    let blocks = tiles(p, &q) * p.batch;
    let kblocks = p.k.div_ceil(q.tile_k);
    // No more stages than K-blocks to fill them (the rest would only cost occupancy).
    q.stages = q.stages.min(kblocks.max(2));
    if p.batch == 1 && blocks < sm_count && kblocks >= 8 {
        // As many splits as fill the resident blocks in one wave (a second, partial wave would
        // cost as much as the first).
        let slots = sm_count * q.blocks_per_sm();
        q.split_k = (slots / blocks.max(1)).min(kblocks / 4).clamp(1, 16);
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::CustomEpilogue;

    fn with_epi(mut p: Problem) -> MmaProblem {
        p.custom = Some(CustomEpilogue { loads: false, name: "f".into(), source: "x".into(), params: vec![], rows: None, rounds_to: None, vector: None });
        MmaProblem { gemm: p, conv: None }
    }

    #[test]
    fn params_and_problems_are_checked() {
        let q = Params::default();
        assert_eq!(q.validate(), Ok(()));
        assert_eq!(q.threads(), 256);
        let p = with_epi(Problem::new(1000, 1000, 1000, DType::BF16));
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        assert!(applies(&p, &q, (7, 5)).unwrap_err().contains("8.0"));
        let odd = with_epi(Problem::new(100, 100, 99, DType::F16));
        assert!(applies(&odd, &q, (8, 0)).unwrap_err().contains("multiple of 8"));
        let f32 = with_epi(Problem::new(64, 64, 64, DType::F32));
        assert!(applies(&f32, &q, (8, 0)).is_err());
        let bad = Params { warps_m: 3, ..q };
        assert!(bad.validate().is_err());
        let deep = Params { stages: 8, tile_n: 256, ..q };
        assert!(deep.validate().unwrap_err().contains("shared memory"));
        let mut plain = with_epi(Problem::new(64, 64, 64, DType::F16));
        plain.gemm.custom = None;
        assert!(applies(&plain, &q, (8, 0)).is_err());
    }

    #[test]
    fn heuristic_params_apply_and_split_skinny_problems() {
        for (m, n, k) in [(8192, 8192, 8192), (16, 8192, 8192), (1, 4096, 4096), (512, 768, 768), (3136, 64, 576)] {
            let p = with_epi(Problem::new(m, n, k, DType::BF16).with_layouts(Layout::RowMajor, Layout::ColMajor));
            let q = heuristic(&p, 132);
            assert_eq!(applies(&p, &q, (9, 0)), Ok(()), "{m}x{n}x{k}: {q:?}");
        }
        let p = with_epi(Problem::new(16, 8192, 8192, DType::BF16).with_layouts(Layout::RowMajor, Layout::ColMajor));
        let q = heuristic(&p, 132);
        assert_eq!(q.tile_m, 16);
        assert!(q.split_k >= 4, "{q:?}");
        let big = with_epi(Problem::new(8192, 8192, 8192, DType::BF16));
        assert_eq!(heuristic(&big, 132).split_k, 1);
    }

    #[test]
    fn conv_geometry_is_checked() {
        let g = ConvGeom { n: 2, h: 14, w: 14, c: 64, kh: 3, kw: 3, oh: 14, ow: 14, stride: (1, 1), pad: (1, 1), dil: (1, 1), nchw_input: false };
        let mut gemm = Problem::new(2 * 196, 128, g.k(), DType::F16).with_layouts(Layout::RowMajor, Layout::ColMajor);
        gemm.ldb = Some(g.k_padded());
        let mut p = with_epi(gemm);
        p.conv = Some(g);
        assert_eq!(applies(&p, &Params::default(), (8, 6)), Ok(()));
        p.gemm.m += 1;
        assert!(applies(&p, &Params::default(), (8, 6)).is_err());
        let stem = ConvGeom { c: 3, kh: 7, kw: 7, ..g };
        assert_eq!(stem.k(), 147);
        assert_eq!(stem.k_padded(), 152);
        assert!(!stem.vector() && !stem.half_vector());
        let padded = ConvGeom { c: 4, ..stem };
        assert!(padded.half_vector() && !padded.vector() && ConvGeom { c: 8, ..stem }.vector());
        assert!(!ConvGeom { nchw_input: true, ..padded }.half_vector());
    }
}
