//! FlashAttention forward (FlashAttention-2 style) on `mma.sync` tensor cores (sm_80 and
//! later): `O = softmax(scale * Q K^T + mask) V` per (batch, query head) without ever storing
//! the score matrix.
//!
//! A block owns `block_m` query rows of one (batch, head); each of its warps owns 16 of them.
//! The Q tile is copied once into shared memory (`cp.async`) and kept in registers as
//! `ldmatrix` A fragments. The block then walks the keys `block_n` at a time through a ring of
//! `stages` shared-memory slots (K and V tiles, `cp.async`, 16-byte chunks XOR-swizzled within
//! 128-byte rows as in [`crate::mma`]): `S = Q K^T` with `mma.sync.m16n8k16` (K read with
//! non-transposed `ldmatrix` as the B operand: K is `[keys][dim]`, K-major for S), scaled with
//! `log2(e)` folded in, masked (keys past `seq_k`, the causal diagonal, the mask tensor) only
//! in the blocks that need it, an online softmax in f32 registers (running maximum and sum per
//! row, `exp2`, the O accumulators rescaled), P packed to 16 bits in registers and used
//! directly as the A operand of `O += P V` (the m16n8 accumulator layout is the m16n8k16 A
//! layout once pairs are packed), V read with `ldmatrix.trans`. At the end `O / l` is stored
//! in 16 bits, and the log-sum-exp per row when the kernel is given somewhere to put it.
//!
//! Causal attention skips the key blocks entirely above the diagonal (per block, and per warp
//! inside the block); blocks are walked from the last query block so the longest ones start
//! first. Which diagonal: a key `j` is visible from query `i` when `j <= i + offset`, with the
//! offset 0 for [`Causal::TopLeft`] (ONNX Attention without a past, and PyTorch's
//! `is_causal`) and `seq_k - seq_q` for [`Causal::BottomRight`] (the last query sees every
//! key, as with a KV cache).
//!
//! Shapes, strides and the scale are compiled in (constants); Q, K, V and O are read and
//! written through `(batch, head, row)` strides with the head dimension contiguous, so
//! `[batch, seq, heads * dim]` and `[batch, heads, seq, dim]` tensors need no copies.
//!
//! Status: rendered and checked on the CPU only (`tests/flash_emulated.rs` runs the rendered
//! source under an emulation of the warp-level instructions); not yet validated on a GPU.

mod launch;
pub mod render;
pub mod sm90;

pub use launch::{config, FlashKernel};
pub use render::{kernel_name, render, FlashArgs, KERNEL_MARK};

use tilec_ir::DType;

/// Which diagonal a causal mask follows when `seq_q != seq_k` (identical when they are equal).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Causal {
    /// Key `j` visible from query `i` iff `j <= i` (ONNX Attention without past; PyTorch).
    TopLeft,
    /// Key `j` visible from query `i` iff `j <= i + seq_k - seq_q`.
    BottomRight,
}

/// What the mask tensor's elements are.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum MaskKind {
    /// One byte per element: nonzero keeps the score, zero masks it (`-inf`).
    Bool,
    /// Added to the scaled scores; the problem's dtype.
    Additive,
}

/// A mask tensor read through strides (0 along broadcast axes), in elements.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mask {
    pub kind: MaskKind,
    /// Strides along batch, query head, query row and key.
    pub strides: [usize; 4],
    /// Keys the mask covers: keys at or past it are masked (a mask shorter than the keys is
    /// padded with `-inf`, as the Attention op specifies).
    pub len: usize,
}

/// Strides of a `(batch, head, row, dim)` operand, in elements; the dimension is contiguous.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Strides {
    pub batch: usize,
    pub head: usize,
    pub row: usize,
}

impl Strides {
    /// `[batch, heads, seq, dim]`, dense.
    pub fn bhsd(heads: usize, seq: usize, dim: usize) -> Strides {
        Strides { batch: heads * seq * dim, head: seq * dim, row: dim }
    }
    /// `[batch, seq, heads * dim]`, dense.
    pub fn bshd(heads: usize, seq: usize, dim: usize) -> Strides {
        Strides { batch: seq * heads * dim, head: dim, row: heads * dim }
    }
    /// The element offset of `(b, h, r)`'s first element.
    pub fn at(&self, b: usize, h: usize, r: usize) -> usize {
        b * self.batch + h * self.head + r * self.row
    }
}

/// One attention problem.
#[derive(Clone, Debug, PartialEq)]
pub struct FlashProblem {
    pub batch: usize,
    pub heads_q: usize,
    /// Query head `h` reads KV head `h / (heads_q / heads_kv)` (GQA; MQA with one).
    pub heads_kv: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    /// Of Q, K and V alike (64 or 128).
    pub head_dim: usize,
    /// bf16 or f16 (Q, K, V, O and an additive mask).
    pub dtype: DType,
    /// Multiplies `Q K^T` before the mask.
    pub scale: f32,
    pub causal: Option<Causal>,
    pub mask: Option<Mask>,
    /// Rows with a NaN or `+inf` logit get zeros instead of NaN (the Attention op's
    /// `zero_nan_rows`). Rows with every key masked get zeros either way.
    pub zero_nan_rows: bool,
    pub q: Strides,
    pub k: Strides,
    pub v: Strides,
    pub o: Strides,
}

impl Eq for FlashProblem {}

impl std::hash::Hash for FlashProblem {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.batch, self.heads_q, self.heads_kv, self.seq_q, self.seq_k, self.head_dim).hash(h);
        (self.dtype.name(), self.scale.to_bits(), self.causal, self.mask, self.zero_nan_rows).hash(h);
        (self.q, self.k, self.v, self.o).hash(h);
    }
}

impl FlashProblem {
    /// Dense `[batch, heads, seq, dim]` operands, no mask, not causal.
    pub fn new(batch: usize, heads_q: usize, heads_kv: usize, seq_q: usize, seq_k: usize, head_dim: usize, dtype: DType) -> FlashProblem {
        FlashProblem {
            batch,
            heads_q,
            heads_kv,
            seq_q,
            seq_k,
            head_dim,
            dtype,
            scale: 1.0 / (head_dim as f32).sqrt(),
            causal: None,
            mask: None,
            zero_nan_rows: false,
            q: Strides::bhsd(heads_q, seq_q, head_dim),
            k: Strides::bhsd(heads_kv, seq_k, head_dim),
            v: Strides::bhsd(heads_kv, seq_k, head_dim),
            o: Strides::bhsd(heads_q, seq_q, head_dim),
        }
    }

    /// The causal offset: key `j` is visible from query `i` iff `j <= i + offset`.
    pub fn causal_offset(&self) -> i64 {
        match self.causal {
            Some(Causal::BottomRight) => self.seq_k as i64 - self.seq_q as i64,
            _ => 0,
        }
    }

    /// Floating-point operations of the two products (`4 * b * h * sq * sk * d`), halved when
    /// causal (the usual convention for attention benchmarks).
    pub fn flops(&self) -> f64 {
        let f = 4.0 * (self.batch * self.heads_q) as f64 * self.seq_q as f64 * self.seq_k as f64 * self.head_dim as f64;
        if self.causal.is_some() {
            f / 2.0
        } else {
            f
        }
    }
}

/// Parameters of the kernel.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Query rows per block: 16 per warp (64 or 128).
    pub block_m: usize,
    /// Keys per step of the loop (64 or 128).
    pub block_n: usize,
    /// Warps per block (4 or 8): `block_m / 16`.
    pub warps: usize,
    /// Shared-memory slots of K and V tiles in the ring (2 or 3; up to 4 with `wgmma`).
    pub stages: usize,
    /// The Hopper variant (sm_90a, [`sm90`]): both products on `wgmma`, a producer
    /// warpgroup filling the ring, one consumer warpgroup per 64 query rows; `warps` is then
    /// `4 x (1 + block_m / 64)`.
    pub wgmma: bool,
}

impl Default for Params {
    fn default() -> Params {
        Params { block_m: 128, block_n: 64, warps: 8, stages: 2, wgmma: false }
    }
}

/// Shared memory a block may take (sm_90; the device's own limit is checked at load).
pub const MAX_SMEM: usize = crate::mma::MAX_SMEM;

impl Params {
    pub fn threads(&self) -> usize {
        32 * self.warps
    }

    /// Bytes of the Q tile.
    pub fn q_bytes(&self, head_dim: usize) -> usize {
        self.block_m * head_dim * 2
    }

    /// Bytes of one ring slot (a K tile then a V tile).
    pub fn stage_bytes(&self, head_dim: usize) -> usize {
        2 * self.block_n * head_dim * 2
    }

    /// Dynamic shared memory: the Q tile and the ring (with `wgmma`, also the ring's barriers
    /// and the slack that aligns the tiles to 1024 bytes).
    pub fn smem_bytes(&self, head_dim: usize) -> usize {
        let tiles = self.q_bytes(head_dim) + self.stages * self.stage_bytes(head_dim);
        if self.wgmma {
            tiles + 1024 + sm90::barrier_bytes(self.stages)
        } else {
            tiles
        }
    }

    /// Checks the parameters for a head dimension.
    pub fn validate(&self, head_dim: usize) -> Result<(), String> {
        if self.wgmma {
            return sm90::validate(self, head_dim);
        }
        if ![4, 8].contains(&self.warps) {
            return Err(format!("{} warps (4 or 8)", self.warps));
        }
        if self.block_m != 16 * self.warps {
            return Err(format!("block_m {} with {} warps (each warp owns 16 query rows: block_m = 16 x warps)", self.block_m, self.warps));
        }
        if ![64, 128].contains(&self.block_n) {
            return Err(format!("block_n {} (64 or 128)", self.block_n));
        }
        if ![2, 3].contains(&self.stages) {
            return Err(format!("{} stages (2 or 3)", self.stages));
        }
        if head_dim == 128 && self.block_n == 128 {
            // Per thread: 64 score and 64 output accumulators, 32 Q and 32 P registers.
            return Err("block_n 128 with head dim 128 needs more registers than a thread has (scores, output and Q fragments)".into());
        }
        if self.smem_bytes(head_dim) > MAX_SMEM {
            return Err(format!("{} bytes of shared memory (at most {MAX_SMEM})", self.smem_bytes(head_dim)));
        }
        Ok(())
    }
}

/// Whether `q` can run `p` on a device of compute capability `cc`; `Err` says why.
pub fn applies(p: &FlashProblem, q: &Params, cc: (u32, u32)) -> Result<(), String> {
    if cc.0 < 8 {
        return Err(format!("mma.sync with bf16 and cp.async need compute capability 8.0; the device has {}.{}", cc.0, cc.1));
    }
    if q.wgmma && cc != (9, 0) {
        return Err(format!("wgmma needs compute capability 9.0 (sm_90a); the device has {}.{}", cc.0, cc.1));
    }
    if !matches!(p.dtype, DType::BF16 | DType::F16) {
        return Err(format!("attention in {}, not bf16 or f16", p.dtype.name()));
    }
    if ![64, 128].contains(&p.head_dim) {
        return Err(format!("head dim {} (64 or 128; others are not rendered yet)", p.head_dim));
    }
    q.validate(p.head_dim)?;
    if [p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k].contains(&0) {
        return Err(format!(
            "an empty problem: batch {}, heads {}/{}, seq {}x{}",
            p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k
        ));
    }
    if p.heads_q % p.heads_kv != 0 {
        return Err(format!("{} query heads are not a multiple of {} KV heads", p.heads_q, p.heads_kv));
    }
    if p.seq_q >= 1 << 30 || p.seq_k >= 1 << 30 || p.batch > 65_535 || p.heads_q > 65_535 {
        return Err("sequences of 2^30 or more, or more than 65535 batches or heads (grid limits)".into());
    }
    if !p.scale.is_finite() {
        return Err(format!("scale {} is not finite", p.scale));
    }
    for (name, s) in [("Q", p.q), ("K", p.k), ("V", p.v), ("O", p.o)] {
        if [s.batch, s.head, s.row].iter().any(|x| x % 8 != 0) {
            return Err(format!(
                "{name}: strides ({}, {}, {}) are not multiples of 8 elements (16-byte copies)",
                s.batch, s.head, s.row
            ));
        }
        if s.row < p.head_dim && p.seq_q.max(p.seq_k) > 1 {
            return Err(format!("{name}: row stride {} below the head dim {}", s.row, p.head_dim));
        }
    }
    if let Some(m) = &p.mask {
        if m.len == 0 {
            return Err("a mask over no keys".into());
        }
    }
    Ok(())
}

/// Default parameters on a device with `sm_count` multiprocessors: 128 query rows per block
/// (8 warps) and 64 keys per step, two ring slots; 64 rows (4 warps) when that leaves fewer
/// blocks than two per SM or the queries are few. Head dim 64: 128 keys per step, and 64 rows
/// up to 1024 queries (GPT-2's causal 8 x 12 x 512 ran 1.42x faster so when tuned on an H200).
pub fn heuristic(p: &FlashProblem, sm_count: usize) -> Params {
    let mut q = Params::default();
    let blocks = p.batch * p.heads_q * p.seq_q.div_ceil(128);
    if p.seq_q <= 64 || blocks < 2 * sm_count || (p.head_dim == 64 && p.seq_q <= 1024) {
        q = Params { block_m: 64, warps: 4, ..q };
    }
    if p.head_dim == 64 && (p.seq_k >= 1024 || q.block_m == 64) {
        q.block_n = 128;
    }
    q
}

/// Blocks of the grid: query blocks, query heads, batches.
pub fn grid(p: &FlashProblem, q: &Params) -> (u32, u32, u32) {
    (p.seq_q.div_ceil(q.block_m) as u32, p.heads_q as u32, p.batch as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_validated() {
        assert_eq!(Params::default().validate(128), Ok(()));
        assert!(Params { block_m: 64, ..Params::default() }.validate(64).unwrap_err().contains("16 x warps"));
        assert!(Params { warps: 2, block_m: 32, ..Params::default() }.validate(64).unwrap_err().contains("4 or 8"));
        assert!(Params { block_n: 32, ..Params::default() }.validate(64).unwrap_err().contains("block_n"));
        assert!(Params { stages: 4, ..Params::default() }.validate(64).unwrap_err().contains("stages"));
        assert!(Params { block_n: 128, ..Params::default() }.validate(128).unwrap_err().contains("registers"));
        assert_eq!(Params { block_n: 128, stages: 3, ..Params::default() }.validate(64), Ok(()));
        assert_eq!(Params::default().smem_bytes(128), 128 * 128 * 2 + 2 * 2 * 64 * 128 * 2);
    }

    #[test]
    fn problems_are_checked_with_reasons() {
        let q = Params::default();
        let p = FlashProblem::new(2, 8, 2, 77, 131, 64, DType::BF16);
        assert_eq!(applies(&p, &q, (8, 0)), Ok(()));
        assert!(applies(&p, &q, (7, 5)).unwrap_err().contains("8.0"));
        let f32 = FlashProblem { dtype: DType::F32, ..p.clone() };
        assert!(applies(&f32, &q, (9, 0)).unwrap_err().contains("f32"));
        let d96 = FlashProblem::new(1, 1, 1, 16, 16, 96, DType::F16);
        assert!(applies(&d96, &q, (9, 0)).unwrap_err().contains("head dim 96"));
        let gqa = FlashProblem { heads_kv: 3, ..p.clone() };
        assert!(applies(&gqa, &q, (9, 0)).unwrap_err().contains("multiple"));
        let odd = FlashProblem { q: Strides { batch: 4, head: 64, row: 64 }, ..p.clone() };
        assert!(applies(&odd, &q, (9, 0)).unwrap_err().contains("multiples of 8"));
        let empty = FlashProblem { seq_k: 0, ..p.clone() };
        assert!(applies(&empty, &q, (9, 0)).unwrap_err().contains("empty"));
        let bshd = FlashProblem { q: Strides::bshd(8, 77, 64), o: Strides::bshd(8, 77, 64), ..p };
        assert_eq!(applies(&bshd, &q, (9, 0)), Ok(()));
        assert_eq!(bshd.q.at(1, 2, 3), 77 * 512 + 2 * 64 + 3 * 512);
    }

    #[test]
    fn heuristic_parameters_apply() {
        for (b, h, s, d, causal) in [(4, 32, 4096, 128, false), (4, 32, 4096, 128, true), (8, 12, 512, 64, false), (1, 1, 17, 64, true), (1, 2, 5000, 64, false)] {
            let mut p = FlashProblem::new(b, h, h, s, s, d, DType::BF16);
            p.causal = causal.then_some(Causal::TopLeft);
            let q = heuristic(&p, 132);
            assert_eq!(applies(&p, &q, (9, 0)), Ok(()), "{p:?} {q:?}");
        }
        let small = FlashProblem::new(1, 1, 1, 40, 40, 64, DType::F16);
        assert_eq!(heuristic(&small, 132).block_m, 64);
        let big = FlashProblem::new(4, 32, 32, 4096, 4096, 128, DType::BF16);
        assert_eq!(heuristic(&big, 132), Params::default());
        let mut bottom = FlashProblem::new(1, 1, 1, 10, 30, 64, DType::F16);
        bottom.causal = Some(Causal::BottomRight);
        assert_eq!(bottom.causal_offset(), 20);
        assert_eq!(FlashProblem { causal: Some(Causal::TopLeft), ..bottom.clone() }.causal_offset(), 0);
        assert_eq!(FlashProblem::new(4, 32, 32, 4096, 4096, 128, DType::BF16).flops(), 4.0 * 128.0 * 4096.0 * 4096.0 * 128.0);
    }
}
