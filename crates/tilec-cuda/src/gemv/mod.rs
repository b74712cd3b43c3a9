//! Decode-shaped products on tensor cores (sm_80 and later): `C = A · B` with at most 16 rows
//! of A (per batch), bf16 or f16 in, f32 accumulation, the result handed element by element to
//! the kernel's epilogue function. Such a product reads each weight once and does little else:
//! its speed is the rate at which B streams from memory.
//!
//! B is read K-contiguous (column-major, as `nn.Linear` stores its weight `[N][K]`); a constant
//! row-major B (`[K][N]`, as GPT-2's Conv1D stores it) is repacked once, when the kernel is
//! bound, into K-contiguous rows `[N][Kp]` (Kp: K rounded up to 8, zero-padded).
//!
//! The kernel: a warp owns `8 * cols` output columns and a range of K in chunks of 32. Per
//! chunk each lane loads 16 bytes of each of its column groups' weights (column
//! `lane / 4`, k `chunk + (lane % 4) * 8 .. + 8`) with `ld.global.nc.L1::no_allocate`, and 16
//! bytes of A rows `lane / 4` and `lane / 4 + 8` at the same k's (through L1, which the warps
//! of a block sharing those k's hit). The sum over k does not care about order, so the lane's
//! eight consecutive k's fill its fragment slots of two `mma.sync.m16n8k16` (slots
//! `2t, 2t+1, 2t+8, 2t+9` of the first take k `0..4`, of the second `4..8`, for A and B
//! alike): no shuffles. Loads run one step of `unroll` chunks ahead of the multiplies (two
//! register buffers). A block holds `warps_n x warps_k` warps: along N distinct columns,
//! along K parts of the block's K range, added in shared memory in warp order. When the
//! column tiles do not fill the GPU, `split_k` blocks share a tile's K: each parks its
//! partial sums in a workspace and the last to arrive (a counter per tile) adds them in split
//! order, so the result does not depend on which block is last.
//!
//! Shapes are compiled in (constants): one kernel per problem.

mod launch;
mod render;
pub mod staged;

pub use launch::{config, GemvKernel};
pub use render::{kernel_name, render};

use crate::gemm::{Layout, Problem};
use tilec_ir::DType;

/// Parameters of the family.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Warps along N: each owns `8 * cols` distinct columns of the block's tile.
    pub warps_n: usize,
    /// Warps along K: each takes a part of the block's K range (summed in shared memory).
    pub warps_k: usize,
    /// Groups of 8 columns per warp (1, 2 or 4): 16-byte weight loads per lane per chunk.
    pub cols: usize,
    /// Chunks of 32 K per pipeline step (1, 2, 4 or 8): the loads of a step are issued
    /// together, one step ahead of the multiplies.
    pub unroll: usize,
    /// Blocks sharing one column tile's K range (1: no split).
    pub split_k: usize,
    /// Bytes the L2 fetches with each weight load (0, 64, 128 or 256: the prefetch hint).
    pub prefetch: usize,
    /// `__launch_bounds__`' minimum of resident blocks per SM (0: none), which caps registers.
    pub min_blocks: usize,
    /// 0: weights loaded straight into registers. 2 to 8: the block's threads copy the weights
    /// and A into a ring of this many shared-memory stages with `cp.async` (each warp's
    /// copies whole 512-byte runs of a weight row), and the warps multiply from there
    /// ([`staged`]).
    pub stages: usize,
    /// B repacked at bind (a constant) into fragment tiles: for each group of 8 columns and
    /// chunk of 32 K, the 512 bytes a warp loads with one instruction, in lane order, the
    /// chunks of a group one after another. A warp's weight loads then stream one contiguous
    /// region (the register loop only).
    pub tiled: bool,
    /// The register loop loads A's rows with the step's weights, one step ahead of the
    /// multiplies (else at the multiply, where a warp waits for them).
    pub a_ahead: bool,
    /// Steps of a warp's weights requested before the kernel waits for the previous kernel of
    /// the stream ([`crate::pdl`]): 0, none (the wait comes first, as in every kernel); 1, the
    /// first step into registers; `n > 1`, also steps 1 to `n - 1` into the L2. The weights are
    /// constants repacked at bind, which no kernel writes, so they may be read while the
    /// previous kernel still runs: its tail and the launch gap overlap this kernel's weight
    /// stream. A and everything else come after the wait.
    pub early: usize,
}

impl Default for Params {
    fn default() -> Params {
        Params { warps_n: 4, warps_k: 2, cols: 2, unroll: 2, split_k: 1, prefetch: 0, min_blocks: 0, stages: 0, tiled: false, a_ahead: false, early: 0 }
    }
}

/// Shared memory a block may take (sm_90; the device's own limit is checked at load).
pub const MAX_SMEM: usize = 232_448;

/// Elements of K in one chunk (per lane: 8 consecutive k's, 16 bytes).
pub const CHUNK: usize = 32;

impl Params {
    pub fn threads(&self) -> usize {
        32 * self.warps_n * self.warps_k
    }
    /// Columns of C per block.
    pub fn block_cols(&self) -> usize {
        8 * self.cols * self.warps_n
    }

    /// Checks the parameters on their own.
    pub fn validate(&self) -> Result<(), String> {
        let warps = self.warps_n * self.warps_k;
        if self.warps_n == 0 || self.warps_k == 0 || warps > 16 {
            return Err(format!("{} x {} warps (1 to 16 in all)", self.warps_n, self.warps_k));
        }
        if ![1, 2, 4].contains(&self.cols) {
            return Err(format!("cols {} (1, 2 or 4 groups of 8 columns per warp)", self.cols));
        }
        if ![1, 2, 4, 8].contains(&self.unroll) {
            return Err(format!("unroll {} (1, 2, 4 or 8 chunks per step)", self.unroll));
        }
        if self.stages == 0 && self.cols * self.unroll > 16 {
            return Err(format!(
                "cols {} x unroll {}: more than 16 weight loads per lane and step (two buffers of them live in registers)",
                self.cols, self.unroll
            ));
        }
        if !(1..=64).contains(&self.split_k) {
            return Err(format!("split_k {} (1 to 64)", self.split_k));
        }
        if ![0, 64, 128, 256].contains(&self.prefetch) {
            return Err(format!("prefetch {} (0, 64, 128 or 256 bytes)", self.prefetch));
        }
        if self.stages == 1 || self.stages > 8 {
            return Err(format!("stages {} (0: registers, or 2 to 8 shared-memory stages)", self.stages));
        }
        if self.a_ahead && self.stages >= 2 {
            return Err("A loaded ahead with shared-memory stages (that is for the register loop)".into());
        }
        if self.early > 16 || (self.early > 0 && self.stages >= 2) {
            return Err(format!("early {} (0 to 16 steps, with the register loop only)", self.early));
        }
        if self.tiled && self.stages >= 2 {
            return Err("tiled weights with shared-memory stages (the tiled layout is for the register loop)".into());
        }
        if self.min_blocks > 32 || self.min_blocks * self.threads() > 2048 {
            return Err(format!(
                "min_blocks {} of {} threads: more than an SM's 2048 threads",
                self.min_blocks,
                self.threads()
            ));
        }
        Ok(())
    }
}

/// Chunks of 32 K (the last one ragged when K is not a multiple of 32).
pub fn chunks(p: &Problem) -> usize {
    p.k.div_ceil(CHUNK)
}

/// Column tiles of C per batch.
pub fn tiles(p: &Problem, q: &Params) -> usize {
    p.n.div_ceil(q.block_cols().max(1))
}

/// Chunks each split (block) covers, and each warp along K within it.
pub fn chunks_per_block(p: &Problem, q: &Params) -> (usize, usize) {
    let cpb = chunks(p).div_ceil(q.split_k.max(1));
    (cpb, cpb.div_ceil(q.warps_k.max(1)))
}

/// Row stride (floats) of the shared-memory sums: the block's columns plus 8, so that the
/// rows a warp writes fall in distinct banks.
pub fn red_stride(q: &Params) -> usize {
    q.block_cols() + 8
}

/// Dynamic shared memory: every K warp's sums of the block's `m x block_cols` outputs, and
/// with `stages` the ring of stages (which the sums reuse once the last stage is consumed).
pub fn smem_bytes(p: &Problem, q: &Params) -> usize {
    let sums = q.warps_k * p.m * red_stride(q) * 4;
    if q.stages >= 2 {
        sums.max(q.stages * staged::slot_bytes(p, q))
    } else {
        sums
    }
}

/// Whether B is repacked at bind (a row-major B, or tiled weights: the caller guarantees it
/// is a constant).
pub fn repacked(p: &Problem, q: &Params) -> bool {
    p.b_layout == Layout::RowMajor || q.tiled
}

/// Elements of the repacked B: K-contiguous rows `[N][packed_ld]`, or with `tiled` the
/// fragment tiles of N rounded up to 8 by K rounded up to 32 (zeros past N and K).
pub fn packed_len(p: &Problem, q: &Params) -> usize {
    if q.tiled {
        p.n.next_multiple_of(8) * chunks(p) * CHUNK
    } else {
        p.n * packed_ld(p)
    }
}

/// The row length of the repacked B: K rounded up to 8 elements (16 bytes).
pub fn packed_ld(p: &Problem) -> usize {
    p.k.next_multiple_of(8)
}

/// Floats of the split-K workspace (0 without a split) and counters (one per tile and batch).
pub fn workspace(p: &Problem, q: &Params) -> (usize, usize) {
    if q.split_k <= 1 {
        return (0, 0);
    }
    let t = tiles(p, q) * p.batch;
    (t * q.split_k * p.m * q.block_cols(), t)
}

/// Whether `q` can run `p` on a device of compute capability `cc`; `Err` says why.
pub fn applies(p: &Problem, q: &Params, cc: (u32, u32)) -> Result<(), String> {
    if cc.0 < 8 {
        return Err(format!("mma.sync with bf16 needs compute capability 8.0; the device has {}.{}", cc.0, cc.1));
    }
    q.validate()?;
    if !matches!(p.in_dtype, DType::BF16 | DType::F16) || p.b_dtype() != p.in_dtype || p.tf32 {
        return Err(format!("operands are {} and {}, not both bf16 or both f16", p.in_dtype.name(), p.b_dtype().name()));
    }
    if p.scale_a || p.scale_b {
        return Err("per-tensor scales (the GEMV family has none)".into());
    }
    if p.custom.is_none() {
        return Err("no epilogue function (the family stores only through one)".into());
    }
    if p.m == 0 || p.n == 0 || p.k == 0 || p.batch == 0 {
        return Err(format!("empty problem {}x{}x{} x{}", p.m, p.n, p.k, p.batch));
    }
    if p.m > 16 {
        return Err(format!("{} rows: more than the 16 of one mma.sync (the GEMV family takes decode-shaped products)", p.m));
    }
    if p.n >= 1 << 31 || p.k >= 1 << 31 || p.batch > 65_535 {
        return Err("a dimension of 2^31 or more, or more than 65535 batches".into());
    }
    if p.a_split.is_some() {
        return Err("A split across heads (the GEMV family reads plain rows)".into());
    }
    if p.batch_split.is_some() {
        return Err("batches split in two (the GEMV family takes one batch stride per operand)".into());
    }
    if p.a_layout != Layout::RowMajor {
        return Err("A is column-major (the GEMV family reads 16 bytes of a row of A at a time)".into());
    }
    if p.lda() < p.k || p.lda() % 8 != 0 {
        return Err(format!("A: leading dimension {} is below K {} or not a multiple of 8 elements (16-byte loads)", p.lda(), p.k));
    }
    match p.b_layout {
        Layout::ColMajor => {
            if p.ldb() < p.k || p.ldb() % 8 != 0 {
                return Err(format!(
                    "B: leading dimension {} is below K {} or not a multiple of 8 elements (16-byte loads)",
                    p.ldb(),
                    p.k
                ));
            }
        }
        Layout::RowMajor => {
            if p.ldb() < p.n {
                return Err(format!("B (row-major): leading dimension {} below N {}", p.ldb(), p.n));
            }
            if p.batch > 1 && p.batch_stride_b != 0 {
                return Err("a row-major B is repacked once: it must be one matrix shared by every batch".into());
            }
        }
    }
    if q.tiled && p.batch > 1 && p.batch_stride_b != 0 {
        return Err("tiled weights are repacked once: B must be one matrix shared by every batch".into());
    }
    if p.batch > 1 {
        for (name, s) in [("A", p.batch_stride_a), ("B", p.batch_stride_b)] {
            if s % 8 != 0 {
                return Err(format!("{name}: batch stride {s} is not a multiple of 8 elements"));
            }
        }
    }
    if q.early > 0 && !repacked(p, q) {
        return Err("weights read before the previous kernel ends must be repacked at bind (a constant no kernel writes)".into());
    }
    if q.split_k > chunks(p) {
        return Err(format!("split_k {} exceeds the {} chunks of 32 K", q.split_k, chunks(p)));
    }
    if q.stages >= 2 && q.split_k > staged::stages_of(p, q) {
        return Err(format!("split_k {} exceeds the {} stages of {} K", q.split_k, staged::stages_of(p, q), staged::stage_k(q)));
    }
    if smem_bytes(p, q) > MAX_SMEM {
        return Err(format!("{} bytes of shared memory for the stages and partial sums (at most {MAX_SMEM})", smem_bytes(p, q)));
    }
    Ok(())
}

/// Default parameters for a problem on a device with `sm_count` multiprocessors, B not known
/// to be a constant ([`heuristic_for`]).
pub fn heuristic(p: &Problem, sm_count: usize) -> Params {
    heuristic_for(p, sm_count, false)
}

/// Default parameters; `b_const`: B is a constant, which may be repacked at bind.
///
/// Constant weights (and a row-major B, repacked anyway) are tiled, with blocks of 2 x 4
/// warps, one column group and 4 chunks a step; other weights take the register loop with
/// blocks of 4 x 2 warps, 2 column groups and 2 chunks a step; both load A a step ahead of
/// the multiplies. Measured on an H100 with `gemv_bench bench --stream` (long runs of
/// launches over weight copies larger than the L2, as a decode step streams its weights:
/// `bench/results/gemv-sweep-2026-12-07`), against the earlier choice (tiling only from K of
/// 8192 or N of 16384, 2 column groups and 2 chunks a step): at one row 1 x 11264 x 2048
/// 21.9 to 16.7 us, 1 x 2048 x 2048 7.0 to 6.2, 1 x 4096 x 4096 16.9 to 12.8, 1 x 14336 x
/// 4096 47.5 to 42.4; at 16 rows 16 x 4096 x 4096 16.4 to 13.0, 16 x 14336 x 4096 55.6 to
/// 41.6. Narrower blocks for few columns. K is split over blocks so that they fill whole
/// waves ([`split_for`]).
pub fn heuristic_for(p: &Problem, sm_count: usize, b_const: bool) -> Params {
    let mut q = Params { a_ahead: true, ..Params::default() };
    let tiled = (b_const || p.b_layout == Layout::RowMajor) && (p.batch <= 1 || p.batch_stride_b == 0);
    if tiled {
        q = Params { warps_n: 2, warps_k: 4, cols: 1, unroll: 4, tiled: true, ..q };
    }
    let n8 = p.n.next_multiple_of(8);
    while q.block_cols() > n8 && q.warps_n > 1 {
        q.warps_n /= 2;
        q.warps_k *= 2;
    }
    while q.block_cols() > n8 && q.cols > 1 {
        q.cols /= 2;
    }
    q.split_k = split_for(p, &q, sm_count);
    q
}

/// Resident blocks per SM the parameters allow (threads, an estimate of registers, shared
/// memory).
pub fn blocks_per_sm(p: &Problem, q: &Params) -> usize {
    let t = q.threads();
    let regs = if q.stages >= 2 {
        40 + 4 * q.cols
    } else {
        40 + 8 * q.unroll * q.cols + if q.a_ahead { 8 * q.unroll * if p.m > 8 { 2 } else { 1 } } else { 0 }
    };
    let by_regs = 65_536 / (t * regs.next_multiple_of(8));
    let by_smem = MAX_SMEM / smem_bytes(p, q).max(1);
    (2048 / t).min(by_regs).min(by_smem).max(1)
}

/// The split of K for `q` (its own `split_k` ignored): blocks fill whole waves of the
/// resident blocks as far as possible, as long as each warp keeps two steps (or each block two
/// stages) and the partial sums stay small next to B.
pub fn split_for(p: &Problem, q: &Params, sm_count: usize) -> usize {
    let slots = (sm_count * blocks_per_sm(p, &Params { split_k: 1, ..*q })).max(1) as f64;
    let base = tiles(p, q) * p.batch.max(1);
    let nch = chunks(p);
    let mut best = (f64::INFINITY, 1);
    for s in 1..=32usize {
        let short = if q.stages >= 2 {
            staged::stages_of(p, q) < 2 * s
        } else {
            nch / (s * q.warps_k) < 2 * q.unroll
        };
        if s > 1 && short {
            break;
        }
        let blocks = (base * s) as f64;
        let eff = blocks / ((blocks / slots).ceil() * slots);
        // Partial sums written and read (through L2) next to the weights streamed.
        let partial = if s > 1 { 0.25 * 4.0 * s as f64 * p.m as f64 / p.k as f64 + 0.01 } else { 0.0 };
        let cost = (1.0 + partial) / eff;
        if cost < best.0 - 1e-9 {
            best = (cost, s);
        }
    }
    best.1
}

#[cfg(test)]
mod tests;
