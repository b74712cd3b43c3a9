//! `paged_attention`: attention of a few new tokens per sequence over a paged KV cache, with
//! the new tokens' keys and values appended to the cache (`NnOp::PagedAttention`).
//!
//! The cache is a pool of fixed-size blocks shared by every sequence of a batch; a sequence
//! owns the blocks its row of the block table names, in order. Layout (the one a decode kernel
//! on a GPU reads: a block's tokens contiguous, each token's heads contiguous):
//!
//! | input | shape | |
//! | --- | --- | --- |
//! | 0 `q` | `[B, Hq, T, D]` | queries of the `T` new tokens of each sequence |
//! | 1 `k` | `[B, Hkv, T, D]` | their keys (`Hq` a multiple of `Hkv`: grouped queries) |
//! | 2 `v` | `[B, Hkv, T, Dv]` | their values |
//! | 3 `k_cache` | `[N, bs, Hkv, D]` | `N` blocks of `bs` tokens |
//! | 4 `v_cache` | `[N, bs, Hkv, Dv]` | |
//! | 5 `block_table` | i32 `[B, M]` | block of each sequence's `M` logical blocks |
//! | 6 `past_lens` | i32 `[B]` | tokens already in the cache per sequence |
//!
//! Token `t` of sequence `b` lands at position `p = past_lens[b] + t`, in block
//! `block_table[b, p / bs]`, slot `p % bs`. Query `t` attends to positions `0..=p` (causal) of
//! its sequence after the append, query head `h` to KV head `h / (Hq / Hkv)`, scores scaled by
//! `scale`. Outputs: `y [B, Hq, T, Dv]`, then both caches with the new tokens written (a back end
//! may update them in place: nothing else reads the old cache). Every position a sequence reaches
//! must lie in its table (`past_lens[b] + T <= M * bs`) and every block it names in the pool.

use super::fmt_dims;
use crate::{DType, Dim, SymbolTable, TensorType};

/// Positions of the inputs of `paged_attention`.
pub mod paged_input {
    pub const Q: usize = 0;
    pub const K: usize = 1;
    pub const V: usize = 2;
    pub const K_CACHE: usize = 3;
    pub const V_CACHE: usize = 4;
    pub const BLOCK_TABLE: usize = 5;
    pub const PAST_LENS: usize = 6;
}

/// Shape inference for `NnOp::PagedAttention`.
pub(super) fn infer(inputs: &[&TensorType], syms: &SymbolTable) -> Result<Vec<TensorType>, String> {
    if inputs.len() != 7 {
        return Err(format!(
            "expected 7 inputs (q, k, v, k_cache, v_cache, block_table, past_lens), got {}",
            inputs.len()
        ));
    }
    let (q, k, v, kc, vc, bt, pl) = (inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5], inputs[6]);
    if !q.dtype.is_float() {
        return Err(format!("q must be a float type, got {}", q.dtype));
    }
    for (t, what) in [(k, "k"), (v, "v"), (kc, "k_cache"), (vc, "v_cache")] {
        if t.dtype != q.dtype {
            return Err(format!("{what} must be {} as q, got {}", q.dtype, t.dtype));
        }
    }
    for (t, what, want) in [
        (q, "q", "[batch, q_heads, new_tokens, head_dim]"),
        (k, "k", "[batch, kv_heads, new_tokens, head_dim]"),
        (v, "v", "[batch, kv_heads, new_tokens, v_head_dim]"),
        (kc, "k_cache", "[blocks, block_size, kv_heads, head_dim]"),
        (vc, "v_cache", "[blocks, block_size, kv_heads, v_head_dim]"),
    ] {
        if t.rank() != 4 {
            return Err(format!("{what} must be {want}, got {}", fmt_dims(&t.shape, syms)));
        }
    }
    let same = |a: Dim, b: Dim, what: &str| -> Result<(), String> {
        match (a, b) {
            (Dim::Fixed(x), Dim::Fixed(y)) if x != y => Err(format!("{what} differ: {x} vs {y}")),
            _ => Ok(()),
        }
    };
    let (batch, hq, t, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hkv, dv) = (k.shape[1], v.shape[3]);
    same(batch, k.shape[0], "batch of q and k")?;
    same(batch, v.shape[0], "batch of q and v")?;
    same(hkv, v.shape[1], "kv heads of k and v")?;
    same(t, k.shape[2], "new tokens of q and k")?;
    same(t, v.shape[2], "new tokens of q and v")?;
    same(d, k.shape[3], "head dims of q and k")?;
    same(kc.shape[0], vc.shape[0], "blocks of k_cache and v_cache")?;
    same(kc.shape[1], vc.shape[1], "block sizes of k_cache and v_cache")?;
    same(hkv, kc.shape[2], "kv heads of k and k_cache")?;
    same(hkv, vc.shape[2], "kv heads of v and v_cache")?;
    same(d, kc.shape[3], "head dims of k and k_cache")?;
    same(dv, vc.shape[3], "head dims of v and v_cache")?;
    if let (Dim::Fixed(a), Dim::Fixed(b)) = (hq, hkv) {
        if b == 0 || a % b != 0 {
            return Err(format!("q heads ({a}) must be a multiple of kv heads ({b})"));
        }
    }
    if kc.shape[1] == Dim::Fixed(0) {
        return Err("block size must be positive".into());
    }
    if bt.dtype != DType::I32 || bt.rank() != 2 {
        return Err(format!("block_table must be i32 [batch, max_blocks], got {} {}", bt.dtype, fmt_dims(&bt.shape, syms)));
    }
    if pl.dtype != DType::I32 || pl.rank() != 1 {
        return Err(format!("past_lens must be i32 [batch], got {} {}", pl.dtype, fmt_dims(&pl.shape, syms)));
    }
    same(batch, bt.shape[0], "batch of q and block_table")?;
    same(batch, pl.shape[0], "batch of q and past_lens")?;
    Ok(vec![TensorType::new(q.dtype, vec![batch, hq, t, dv]), kc.clone(), vc.clone()])
}
