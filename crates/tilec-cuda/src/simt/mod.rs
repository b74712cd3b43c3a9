//! Exact-f32 GEMM on the CUDA cores (any device of compute capability 6.0 or later): a kernel
//! family rendered as CUDA C++ for one problem and parameter set, compiled with NVRTC and
//! launched through the driver. f32 models get this path unless the user allows tf32.
//!
//! `C = A · B` for f32 inputs with f32 accumulation, every product and sum one exact
//! fused multiply-add (`__fmaf_rn`: no tf32, no reassociation), the result handed element by
//! element to the kernel's epilogue (a device function rendered from the tile IR, as for the
//! tensor-core templates; [`crate::gemm::CustomEpilogue`]).
//!
//! The kernel (see `render.rs` for the index math):
//! - a block of 256 threads computes a `tile_m x tile_n` tile of C, each thread
//!   `tile_m / 16 x tile_n / 16` accumulators arranged as sub-tiles of at most 4x4 spaced 64
//!   rows (columns) apart, so that its fragments are float4 reads of shared memory that a
//!   quarter warp serves without bank conflicts;
//! - shared memory holds two buffers of A as `As[k][m]` (K-major) and B as `Bs[k][n]`, each
//!   row padded by 4 floats; while one K slice is multiplied, the next is read from global
//!   memory into registers and stored into the other buffer after the multiply (one barrier
//!   per slice);
//! - global reads are float4 when the operand's contiguous dimension, its leading dimension,
//!   offset and batch strides allow 16-byte alignment (decided when rendering), scalar
//!   otherwise; rows and depths past the edges read as zeros;
//! - optional split-K ([`Params::split_k`]): each block parks its partial tile in a
//!   workspace and the last block of a tile to arrive adds all of them in split order (the same
//!   sum whichever block is last) and runs the epilogue;
//! - the epilogue stages the accumulators through shared memory 16 rows at a time, so that
//!   consecutive threads call the epilogue function for consecutive columns of a row.
//!
//! Shapes, leading dimensions and strides are compiled in (constants), as in the `mma`
//! template: one kernel per problem, and equal layers still share one kernel.

mod launch;
pub mod render;

pub use launch::{launch_config, SimtKernel};
pub use render::{kernel_name, render};

use crate::gemm::{Layout, Problem};
use tilec_ir::DType;

/// Threads per block (a 16 x 16 grid of threads over the tile).
pub const THREADS: usize = 256;

/// Parameters of the family.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Rows and columns of C per block: 32, 64 or 128.
    pub tile_m: usize,
    pub tile_n: usize,
    /// K per shared-memory slice: 8 or 16.
    pub tile_k: usize,
    /// Blocks sharing one tile's K range (1: no split).
    pub split_k: usize,
    /// Blocks per SM the kernel is compiled for (`__launch_bounds__`): 2 caps a thread at 128
    /// registers (two blocks hide each other's barriers), 1 lets it take up to 255.
    pub min_blocks: usize,
}

impl Default for Params {
    fn default() -> Params {
        Params { tile_m: 128, tile_n: 128, tile_k: 8, split_k: 1, min_blocks: 2 }
    }
}

/// How a thread's accumulators along one side of the tile are laid out: `count` sub-tiles
/// of `width` consecutive rows (columns), `16 * width` apart.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Spread {
    pub width: usize,
    pub count: usize,
}

impl Spread {
    /// For a tile side of `tile` elements over 16 threads.
    pub fn of(tile: usize) -> Spread {
        let per = tile / 16;
        let width = per.min(4);
        Spread { width, count: per / width.max(1) }
    }
    /// Elements per thread along the side.
    pub fn per_thread(&self) -> usize {
        self.width * self.count
    }
    /// The tile offset of a thread's element `e` (`t`: the thread's index along the side).
    pub fn offset(&self, t: usize, e: usize) -> usize {
        (e / self.width) * 16 * self.width + t * self.width + e % self.width
    }
}

impl Params {
    pub fn threads(&self) -> usize {
        THREADS
    }
    /// Row length (floats) of a shared-memory A or B slice: the tile side plus 4 (padding that
    /// spreads a K-contiguous operand's transposing stores over the banks and keeps rows
    /// 16-byte aligned).
    pub fn a_row(&self) -> usize {
        self.tile_m + 4
    }
    pub fn b_row(&self) -> usize {
        self.tile_n + 4
    }
    /// Floats of shared memory: two buffers of A and B slices, or the epilogue's 16-row band of
    /// C if larger (the band reuses the slices' memory).
    pub fn smem_floats(&self) -> usize {
        let main = 2 * self.tile_k * (self.a_row() + self.b_row());
        main.max(16 * self.b_row())
    }
    pub fn smem_bytes(&self) -> usize {
        4 * self.smem_floats()
    }

    /// Checks the parameters on their own.
    pub fn validate(&self) -> Result<(), String> {
        for (name, t) in [("tile_m", self.tile_m), ("tile_n", self.tile_n)] {
            if ![32, 64, 128].contains(&t) {
                return Err(format!("{name} {t} (32, 64 or 128)"));
            }
        }
        if ![8, 16].contains(&self.tile_k) {
            return Err(format!("tile_k {} (8 or 16)", self.tile_k));
        }
        if !(1..=2).contains(&self.min_blocks) {
            return Err(format!("min_blocks {} (1 or 2)", self.min_blocks));
        }
        if !(1..=32).contains(&self.split_k) {
            return Err(format!("split_k {} (1 to 32)", self.split_k));
        }
        Ok(())
    }
}

/// Tiles of C (per batch).
pub fn tiles(p: &Problem, q: &Params) -> usize {
    p.m.div_ceil(q.tile_m) * p.n.div_ceil(q.tile_n)
}

/// Whether `q` can run `p` on a device of compute capability `cc`; `Err` says why.
pub fn applies(p: &Problem, q: &Params, cc: (u32, u32)) -> Result<(), String> {
    if cc.0 < 6 {
        return Err(format!("the SIMT f32 GEMM needs compute capability 6.0; the device has {}.{}", cc.0, cc.1));
    }
    q.validate()?;
    if p.in_dtype != DType::F32 || p.b_dtype() != DType::F32 {
        return Err(format!("operands are {} and {}, not f32", p.in_dtype.name(), p.b_dtype().name()));
    }
    if p.tf32 {
        return Err("the problem asks for tf32 (this family multiplies in exact f32)".into());
    }
    if p.scale_a || p.scale_b {
        return Err("per-tensor scales are not supported".into());
    }
    if p.custom.is_none() {
        return Err("no epilogue function (the template stores only through one)".into());
    }
    if p.m == 0 || p.n == 0 || p.k == 0 || p.batch == 0 {
        return Err(format!("empty problem {}x{}x{} x{}", p.m, p.n, p.k, p.batch));
    }
    // Indices run up to a tile past the edges in 32 bits.
    const LIMIT: usize = (1 << 31) - 256;
    if p.m >= LIMIT || p.n >= LIMIT || p.k >= LIMIT {
        return Err(format!("a dimension of {LIMIT} or more (32-bit indices)"));
    }
    let rule = |name: &str, ld: usize, inner: usize| {
        if ld < inner {
            Err(format!("{name}: leading dimension {ld} below its row of {inner}"))
        } else {
            Ok(())
        }
    };
    match p.a_layout {
        Layout::RowMajor if p.a_split.is_some() => rule("A (split)", p.lda(), p.k.min(64))?,
        Layout::RowMajor => rule("A (row-major)", p.lda(), p.k)?,
        Layout::ColMajor => rule("A (column-major)", p.lda(), p.m)?,
    }
    match p.b_layout {
        Layout::RowMajor => rule("B (row-major)", p.ldb(), p.n)?,
        Layout::ColMajor => rule("B (column-major)", p.ldb(), p.k)?,
    }
    if let Some(sp) = p.a_split {
        if p.a_layout != Layout::RowMajor || p.batch != 1 || sp.rows == 0 {
            return Err("a split A must be row-major and unbatched, with rows in groups".into());
        }
    }
    if p.batch_split.is_some_and(|s| s.div == 0) {
        return Err("batches split by 0".into());
    }
    if q.split_k > 1 && p.batch > 1 {
        return Err("split-K over a batched problem".into());
    }
    let kblocks = p.k.div_ceil(q.tile_k);
    if q.split_k > kblocks {
        return Err(format!("split_k {} exceeds the {kblocks} K-blocks", q.split_k));
    }
    if p.batch * q.split_k > 65_535 {
        return Err(format!("{} batches x {} splits exceed the grid's 65535 z-blocks", p.batch, q.split_k));
    }
    if tiles(p, q) >= 1 << 31 {
        return Err("2^31 tiles or more".into());
    }
    Ok(())
}

/// Default parameters for a problem on a device with `sm_count` multiprocessors.
///
/// 128x128 tiles (K slices of 8) when they fill the SMs; otherwise the sides shrink (the
/// longer first, down to 32; a side at most 64 or 32 long starts there) until the tiles do,
/// with K slices of 16. When the tiles still leave SMs idle and K is long, K is split over
/// blocks (each keeping at least 8 K slices) to about two blocks per SM.
pub fn heuristic(p: &Problem, sm_count: usize) -> Params {
    let side = |x: usize| if x > 64 { 128 } else if x > 32 { 64 } else { 32 };
    let mut q = Params { tile_m: side(p.m), tile_n: side(p.n), ..Params::default() };
    let batch = p.batch.max(1);
    while tiles(p, &q) * batch < sm_count && (q.tile_m > 32 || q.tile_n > 32) {
        if q.tile_n >= q.tile_m && q.tile_n > 32 {
            q.tile_n /= 2;
        } else {
            q.tile_m /= 2;
        }
    }
    // K slices of 8 on 128x128 tiles (8192^3, two runs: H200 41.8 and 43.9 TFLOP/s with A, B
    // row-major and B column-major against 41.8 and 40.6 with 16; H100 42.4 and 44.0 against
    // 41.6 and 40.3), 16 on smaller tiles (fewer barriers per multiply).
    q.tile_k = if q.tile_m == 128 && q.tile_n == 128 { 8 } else { 16 };
    let blocks = tiles(p, &q) * batch;
    let kblocks = p.k.div_ceil(q.tile_k);
    if batch == 1 && blocks < sm_count && kblocks >= 16 {
        q.split_k = (2 * sm_count / blocks.max(1)).min(kblocks / 8).clamp(1, 16);
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::CustomEpilogue;

    pub(crate) fn with_epi(mut p: Problem) -> Problem {
        p.custom = Some(CustomEpilogue { loads: false, name: "f".into(), source: "x".into(), params: vec![], rows: None, rounds_to: None, vector: None });
        p
    }

    #[test]
    fn params_are_checked() {
        let q = Params::default();
        assert_eq!(q.validate(), Ok(()));
        assert_eq!(q.threads(), 256);
        // Two buffers of 8 x (128 + 4) floats for each of A and B.
        assert_eq!(q.smem_floats(), 2 * 8 * 264);
        assert!(q.smem_bytes() <= 48 * 1024);
        let big = Params { tile_k: 16, ..q };
        assert!(big.smem_bytes() <= 48 * 1024, "static shared memory: {}", big.smem_bytes());
        assert!(Params { tile_m: 256, ..q }.validate().unwrap_err().contains("tile_m 256"));
        assert!(Params { tile_n: 48, ..q }.validate().unwrap_err().contains("tile_n 48"));
        assert!(Params { tile_k: 32, ..q }.validate().unwrap_err().contains("tile_k"));
        assert!(Params { split_k: 0, ..q }.validate().unwrap_err().contains("split_k"));
    }

    #[test]
    fn spreads_cover_the_tile_once() {
        for tile in [32, 64, 128] {
            let s = Spread::of(tile);
            assert_eq!(s.per_thread() * 16, tile);
            let mut seen = vec![0; tile];
            for t in 0..16 {
                for e in 0..s.per_thread() {
                    seen[s.offset(t, e)] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "tile {tile}: {seen:?}");
        }
        assert_eq!(Spread::of(128), Spread { width: 4, count: 2 });
        assert_eq!(Spread::of(128).offset(3, 5), 64 + 12 + 1);
        assert_eq!(Spread::of(32), Spread { width: 2, count: 1 });
    }

    #[test]
    fn problems_are_checked_with_reasons() {
        let q = Params::default();
        let p = with_epi(Problem::new(1000, 1000, 1000, DType::F32));
        assert_eq!(applies(&p, &q, (9, 0)), Ok(()));
        assert!(applies(&p, &q, (5, 2)).unwrap_err().contains("6.0"));
        let h = with_epi(Problem::new(64, 64, 64, DType::F16));
        assert!(applies(&h, &q, (9, 0)).unwrap_err().contains("not f32"));
        let mut t = p.clone();
        t.tf32 = true;
        assert!(applies(&t, &q, (9, 0)).unwrap_err().contains("tf32"));
        let mut plain = p.clone();
        plain.custom = None;
        assert!(applies(&plain, &q, (9, 0)).unwrap_err().contains("epilogue"));
        let mut short = p.clone();
        short.lda = Some(999);
        assert!(applies(&short, &q, (9, 0)).unwrap_err().contains("leading dimension 999"));
        let mut batched = p.clone();
        batched.batch = 3;
        assert!(applies(&batched, &Params { split_k: 2, ..q }, (9, 0)).unwrap_err().contains("batched"));
        assert!(applies(&p, &Params { split_k: 32, ..q }, (9, 0)).is_ok());
        let tiny = with_epi(Problem::new(10, 10, 20, DType::F32));
        assert!(applies(&tiny, &Params { split_k: 4, ..q }, (9, 0)).unwrap_err().contains("K-blocks"));
        let empty = with_epi(Problem::new(0, 10, 20, DType::F32));
        assert!(applies(&empty, &q, (9, 0)).unwrap_err().contains("empty"));
        // Odd leading dimensions are fine (scalar reads).
        let mut odd = with_epi(Problem::new(291, 203, 130, DType::F32).with_layouts(Layout::ColMajor, Layout::ColMajor));
        odd.lda = Some(293);
        odd.ldb = Some(131);
        assert_eq!(applies(&odd, &q, (8, 0)), Ok(()));
    }

    #[test]
    fn heuristic_params_apply() {
        let shapes = [
            (8192, 8192, 8192, 1),
            (4096, 4096, 4096, 1),
            (1, 4096, 4096, 1),
            (16, 8192, 8192, 1),
            (291, 203, 130, 1),
            (64, 64, 64, 12),
            (512, 768, 768, 1),
            (3, 5, 7, 1),
        ];
        for (m, n, k, batch) in shapes {
            for (a, b) in [(Layout::RowMajor, Layout::RowMajor), (Layout::ColMajor, Layout::ColMajor)] {
                let mut p = with_epi(Problem::new(m, n, k, DType::F32).with_layouts(a, b));
                p.batch = batch;
                let q = heuristic(&p, 132);
                assert_eq!(applies(&p, &q, (9, 0)), Ok(()), "{m}x{n}x{k} x{batch}: {q:?}");
            }
        }
        let big = with_epi(Problem::new(8192, 8192, 8192, DType::F32));
        assert_eq!(heuristic(&big, 132), Params { tile_k: 8, ..Params::default() });
        let skinny = with_epi(Problem::new(1, 4096, 4096, DType::F32));
        let q = heuristic(&skinny, 132);
        assert_eq!((q.tile_m, q.tile_k), (32, 16), "{q:?}");
        assert!(q.split_k >= 2, "{q:?}");
        let mid = with_epi(Problem::new(512, 768, 768, DType::F32));
        let q = heuristic(&mid, 132);
        assert!(tiles(&mid, &q) >= 132 || q.tile_m * q.tile_n == 32 * 32, "{q:?}");
    }
}
