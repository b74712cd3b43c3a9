//! Decode attention over a paged KV cache (`paged_attention`, layout in
//! `tilec_ir::op::paged`) on 16-bit caches with f32 accumulation: split-KV in the style of
//! FlashDecoding, plain SIMT code (decode attention is bound by the bandwidth of the cache
//! read, not by arithmetic).
//!
//! One step launches, in stream order:
//! 1. `_copy` (only when the new caches are not the old ones' storage): the old caches copied
//!    whole into the new ones, 16 bytes per thread;
//! 2. `_attn`: one block per (KV chunk, KV head and group of query rows, sequence). A block
//!    takes all query rows of its KV head's group (the `Hq / Hkv` query heads times the `T`
//!    new tokens, at most [`Params::rows`] of them; more groups of rows when there are more),
//!    copies its chunk's entries of the block table to shared memory (checking them), then
//!    reads the chunk's keys once — a key row is `D / 8` lanes of 16-byte loads, so a warp
//!    reads `256 / D` whole rows per load, coalesced — and writes the scaled scores (base-2,
//!    causal within the new tokens) to shared memory; one warp per row takes the row's maximum
//!    and exponentials; then the values are read once the same way and accumulated per lane,
//!    reduced across the lanes holding the same dims and across warps. The chunk's maximum,
//!    sum of exponentials and unnormalized output go to a workspace (f32). The new tokens'
//!    keys and values are read from the step's inputs, not the cache, and the blocks of the
//!    first row group write them into their cache slots as they read them (the append costs
//!    no kernel of its own, and no block reads a slot another block writes). With one chunk
//!    per sequence ([`merge_in_attn`]) the block stores its rows in 16 bits itself;
//! 3. `_merge` otherwise: one block per query row merging its chunks through their
//!    log-sum-exps and storing the row in 16 bits.
//!
//! The chunk length (a whole number of cache blocks) is chosen so that the grid fills the SMs
//! several times over ([`heuristic`]). Past lengths and the block table are read on the
//! device: a sequence whose table names a block outside the pool, whose past length is
//! negative or whose positions do not fit its table gets NaN outputs and no append (the host
//! kernel and the interpreter report these as errors).
//!
//! Shapes and the scale are compiled in. Status: rendered and run on the CPU under an
//! emulation (`tests/paged_emulated.rs`); GPU tests in `tilec`'s `tests/cuda_families.rs`.

mod launch;
pub mod render;

pub use launch::PagedKernel;
pub use render::{kernel_name, render, KERNEL_MARK};

use tilec_ir::DType;

use crate::driver::LaunchConfig;

/// Largest static shared memory a block may use (the limit without opting in).
const SMEM_LIMIT: usize = 48 * 1024;

/// One `paged_attention` call's geometry (`tilec_ir::op::paged`'s names).
#[derive(Clone, Debug, PartialEq)]
pub struct PagedProblem {
    /// Sequences `B`.
    pub batch: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// New tokens per sequence `T` (1 for decode).
    pub new_tokens: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
    /// Blocks in the pool `N`.
    pub blocks: usize,
    /// Tokens per block `bs`.
    pub block_size: usize,
    /// Logical blocks per sequence `M` (the block table's second dim).
    pub max_blocks: usize,
    /// bf16 or f16 (every float input and output).
    pub dtype: DType,
    pub scale: f32,
}

impl PagedProblem {
    /// Query heads per KV head.
    pub fn rep(&self) -> usize {
        self.heads_q / self.heads_kv.max(1)
    }
    /// Query rows per KV head: its query heads times the new tokens.
    pub fn group(&self) -> usize {
        self.rep() * self.new_tokens
    }
    /// Positions a sequence's table can hold.
    pub fn context(&self) -> usize {
        self.max_blocks * self.block_size
    }
    /// Elements of one cache (`N * bs * Hkv * D`) and of the value cache.
    pub fn k_cache_elems(&self) -> usize {
        self.blocks * self.block_size * self.heads_kv * self.head_dim
    }
    pub fn v_cache_elems(&self) -> usize {
        self.blocks * self.block_size * self.heads_kv * self.v_head_dim
    }
}

/// Launch parameters.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Tokens per KV chunk (a multiple of the block size).
    pub chunk: usize,
    /// Warps per attention block.
    pub warps: usize,
    /// Query rows per attention block at most.
    pub rows: usize,
    /// Key rows each lane loads before using them.
    pub unroll: usize,
}

impl Params {
    pub fn threads(&self) -> usize {
        self.warps * 32
    }
    /// Floats of the shared buffer: the scores, later the per-warp partial outputs.
    pub fn buf_floats(&self, p: &PagedProblem) -> usize {
        (self.rows * self.chunk).max(self.warps * self.rows * p.v_head_dim)
    }
    /// Static shared memory of the attention kernel.
    pub fn smem_bytes(&self, p: &PagedProblem) -> usize {
        4 * self.buf_floats(p) + 4 * (self.chunk / p.block_size.max(1) + 1) + 8 * self.rows + 16
    }
}

/// Chunks per sequence (of the longest context the table allows).
pub fn chunks(p: &PagedProblem, q: &Params) -> usize {
    p.context().div_ceil(q.chunk.max(1)).max(1)
}

/// Groups of query rows per KV head.
pub fn row_groups(p: &PagedProblem, q: &Params) -> usize {
    p.group().div_ceil(q.rows.max(1)).max(1)
}

/// Whether the attention kernel stores the rows itself: with one chunk per sequence there is
/// nothing to merge and the `_merge` kernel is not launched. (Merging several chunks in the
/// attention kernel, its last block per row group through an arrival counter, measured no
/// faster on an H200: for LLaMA-1.1B at batch 1, 5 chunks of 64, it made the attention kernel
/// 6 µs longer under `ncu`, where the `_merge` kernel took 3 µs.)
pub fn merge_in_attn(p: &PagedProblem, q: &Params) -> bool {
    chunks(p, q) == 1
}

/// Bytes of the f32 workspace: per query row and chunk, the unnormalized output, then per
/// query row and chunk the maximum and the sum.
pub fn workspace_bytes(p: &PagedProblem, q: &Params) -> usize {
    let parts = p.batch * p.heads_q * p.new_tokens * chunks(p, q);
    4 * parts * (p.v_head_dim + 2)
}

/// Whether the kernels take the problem with these parameters, or why not.
pub fn applies(p: &PagedProblem, q: &Params) -> Result<(), String> {
    if !matches!(p.dtype, DType::BF16 | DType::F16) {
        return Err(format!("caches in {}, not bf16 or f16", p.dtype.name()));
    }
    if p.batch == 0 || p.heads_kv == 0 || p.new_tokens == 0 || p.blocks == 0 || p.block_size == 0 || p.max_blocks == 0 {
        return Err("an empty batch, head count, token count, pool or table".into());
    }
    if !p.heads_q.is_multiple_of(p.heads_kv) {
        return Err(format!("{} query heads are not a multiple of {} KV heads", p.heads_q, p.heads_kv));
    }
    for (what, d) in [("head dim", p.head_dim), ("value head dim", p.v_head_dim)] {
        if !(8..=256).contains(&d) || !(d / 8).is_power_of_two() || !d.is_multiple_of(8) {
            return Err(format!("{what} {d} (8, 16, 32, 64, 128 or 256: rows of whole 16-byte vectors spread over lanes)"));
        }
    }
    if q.chunk == 0 || !q.chunk.is_multiple_of(p.block_size) {
        return Err(format!("a chunk of {} tokens is not a whole number of {}-token blocks", q.chunk, p.block_size));
    }
    if !(1..=8).contains(&q.warps) || !(1..=8).contains(&q.rows) || !(1..=8).contains(&q.unroll) {
        return Err(format!("{} warps, {} rows, unroll {} (each 1 to 8)", q.warps, q.rows, q.unroll));
    }
    if q.smem_bytes(p) > SMEM_LIMIT {
        return Err(format!("{} bytes of shared memory (at most {SMEM_LIMIT})", q.smem_bytes(p)));
    }
    let grid_x = chunks(p, q);
    let grid_y = p.heads_kv * row_groups(p, q);
    if grid_x > i32::MAX as usize || grid_y > 65535 || p.batch > 65535 {
        return Err(format!("a grid of {grid_x} x {grid_y} x {} blocks", p.batch));
    }
    let elems = p.k_cache_elems().max(p.v_cache_elems());
    if elems.checked_mul(2).is_none_or(|b| b > (1usize << 62)) {
        return Err("caches too large to index".into());
    }
    Ok(())
}

/// Parameters for a problem on `sm_count` SMs: at most 8 query rows per block, and the
/// longest chunk (of 64 to 1024 tokens, whole blocks, within the shared memory) with at least
/// four blocks per SM.
pub fn heuristic(p: &PagedProblem, sm_count: usize) -> Params {
    let rows = p.group().clamp(1, 8);
    let mut q = Params { chunk: 0, warps: 4, rows, unroll: 4 };
    let bs = p.block_size.max(1);
    let fits = |ch: usize| Params { chunk: ch, ..q }.smem_bytes(p) <= SMEM_LIMIT;
    let mut ch = 1024usize.div_ceil(bs) * bs;
    while ch > bs && !fits(ch) {
        ch -= bs;
    }
    let want = 4 * sm_count.max(1);
    let blocks = |ch: usize| p.batch * p.heads_kv * row_groups(p, &q) * p.context().div_ceil(ch);
    while ch >= 2 * bs && ch / 2 >= 64 && blocks(ch) < want {
        ch = (ch / 2).div_ceil(bs) * bs;
    }
    q.chunk = ch.max(bs);
    q
}

/// The launch shapes of `_attn` and `_merge` (static shared memory only; `_merge` runs only
/// when not [`merge_in_attn`]).
pub fn configs(p: &PagedProblem, q: &Params) -> [LaunchConfig; 2] {
    [
        LaunchConfig {
            grid: (chunks(p, q) as u32, (p.heads_kv * row_groups(p, q)) as u32, p.batch as u32),
            block: (q.threads() as u32, 1, 1),
            shared_mem_bytes: 0,
        },
        LaunchConfig { grid: ((p.batch * p.heads_q * p.new_tokens) as u32, 1, 1), block: (128, 1, 1), shared_mem_bytes: 0 },
    ]
}

/// The launch shape of `_copy` for `elems` 16-bit elements (16 bytes per thread).
pub fn copy_config(elems: usize) -> LaunchConfig {
    let vecs = (elems / 8).max(1);
    LaunchConfig { grid: (vecs.div_ceil(256).min(65535 * 32) as u32, 1, 1), block: (256, 1, 1), shared_mem_bytes: 0 }
}

/// Bytes of keys and values one step reads from the caches: every position of every sequence
/// (after the append) in every KV head.
pub fn kv_bytes_read(p: &PagedProblem, lens: &[usize]) -> f64 {
    let per_token = (p.heads_kv * (p.head_dim + p.v_head_dim) * p.dtype.size_bytes()) as f64;
    lens.iter().map(|&l| l as f64 * per_token).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(batch: usize, ctx: usize) -> PagedProblem {
        PagedProblem {
            batch,
            heads_q: 32,
            heads_kv: 8,
            new_tokens: 1,
            head_dim: 128,
            v_head_dim: 128,
            blocks: batch * ctx / 16,
            block_size: 16,
            max_blocks: ctx / 16,
            dtype: DType::BF16,
            scale: 0.088,
        }
    }

    #[test]
    fn heuristic_fills_the_gpu_and_fits() {
        for (b, ctx) in [(32, 8192), (1, 8192), (4, 512), (1, 16)] {
            let p = problem(b, ctx);
            let q = heuristic(&p, 132);
            applies(&p, &q).unwrap();
            let blocks = b * 8 * row_groups(&p, &q) * chunks(&p, &q);
            assert!(blocks >= 4 * 132 || q.chunk <= 64, "{b} x {ctx}: {q:?} gives {blocks} blocks");
        }
        // Batch 32 x 8192 keeps long chunks.
        assert_eq!(heuristic(&problem(32, 8192), 132).chunk, 1024);
    }

    #[test]
    fn refusals_name_the_reason() {
        let mut p = problem(1, 64);
        p.head_dim = 96;
        assert!(applies(&p, &heuristic(&p, 132)).unwrap_err().contains("head dim 96"));
        let mut p = problem(1, 64);
        p.dtype = DType::F32;
        assert!(applies(&p, &heuristic(&p, 132)).unwrap_err().contains("f32"));
        let p = problem(1, 64);
        let q = Params { chunk: 24, ..heuristic(&p, 132) };
        assert!(applies(&p, &q).unwrap_err().contains("16-token blocks"));
    }
}
