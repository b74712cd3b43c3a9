//! Stream-K for the Hopper GEMM template ([`Params::stream_k`]): the persistent grid's work
//! split so that no SM idles through a partial last wave.
//!
//! The decomposition, for `tiles` output tiles of `kblocks` K-blocks each on a grid of `G`
//! blocks: when `tiles` is a multiple of `G` every tile runs whole, as without stream-K.
//! Otherwise the tiles of all waves but the last full one run whole (`dp_tiles`, block `b`
//! taking tiles `b, b + G, ...`), and the K-blocks of the remaining `G + tiles % G` tiles
//! (all of them when there are fewer tiles than blocks) are laid end to end, tile after tile,
//! and cut into `G` contiguous shares of equal size up to one K-block. A block runs its whole
//! tiles, then its share, as units of one tile's consecutive K-blocks.
//!
//! A tile whose K-blocks fall into several shares is finished by the block holding its first
//! K-blocks. Those come at the end of that block's share, while every later part of the tile
//! opens the share of a later block: so each block parks at most one partial sum (its first
//! unit's), and a block only ever waits for blocks after it, which run their parking unit first
//! (no cycle of waits; the grid is at most one block per SM, all resident).
//!
//! The workspace ([`workspace_bytes`]): [`FLAG_SLOTS`] counters, then one tile of f32 partial
//! sums per block, each consumer thread's accumulators in its own column (16-byte stores,
//! coalesced across the threads). A parking warp stores its sums, fences, and counts itself on
//! its block's counter; the finishing block's warps wait for all of them, add the sums in block
//! order (the same result on every run), and once all its warps have read them zero the
//! counters, so the workspace is ready for the next launch. Launches sharing a workspace must
//! therefore run one after another (one stream).

use std::fmt::Write;

use super::Params;

/// Counters at the start of the workspace: one per block of the grid (at most this many).
pub const FLAG_SLOTS: usize = 1024;

/// Bytes of workspace a stream-K kernel with `q` needs for a grid of `blocks`.
pub fn workspace_bytes(q: &Params, blocks: usize) -> usize {
    FLAG_SLOTS * 4 + blocks * q.tile_m * q.tile_n * 4
}

/// Blocks of the persistent grid for stream-K: every block needs at least one K-block of the
/// split tiles.
pub fn grid(resident: usize, tiles: usize, kblocks: usize) -> usize {
    resident.min(tiles * kblocks).clamp(1, FLAG_SLOTS)
}

/// Device helpers: the decomposition and the acquire load the finishing block polls with.
pub const HELPERS: &str = r#"
// Stream-K: a block's whole tiles (blockIdx.x, + G, ... below dp_tiles), then its share
// [lo, hi) of the remaining tiles' K-blocks laid end to end.
struct tl_sk {
  int G, dp_tiles, kblocks;
  long long iters, lo, hi;
};
__device__ __forceinline__ tl_sk tl_sk_init(int tiles, int kblocks) {
  tl_sk s;
  s.G = (int)gridDim.x;
  s.kblocks = kblocks;
  const int waves = tiles / s.G;
  s.dp_tiles = tiles % s.G == 0 ? tiles : (waves > 0 ? (waves - 1) * s.G : 0);
  s.iters = (long long)(tiles - s.dp_tiles) * kblocks;
  s.lo = s.iters * blockIdx.x / s.G;
  s.hi = s.iters * (blockIdx.x + 1) / s.G;
  return s;
}
// The unit after (u_t, u_pos): tile t, K-blocks [kb_lo, kb_hi); false when none is left.
__device__ __forceinline__ bool tl_sk_next(const tl_sk& s, int& u_t, long long& u_pos, int& t, int& kb_lo, int& kb_hi) {
  if (u_t < s.dp_tiles) {
    t = u_t;
    kb_lo = 0;
    kb_hi = s.kblocks;
    u_t += s.G;
    return true;
  }
  if (u_pos >= s.hi) return false;
  const long long tt = u_pos / s.kblocks;
  const long long end = (tt + 1) * s.kblocks < s.hi ? (tt + 1) * s.kblocks : s.hi;
  t = s.dp_tiles + (int)tt;
  kb_lo = (int)(u_pos - tt * s.kblocks);
  kb_hi = (int)(end - tt * s.kblocks);
  u_pos = end;
  return true;
}
// The block whose share holds split iteration p.
__device__ __forceinline__ int tl_sk_owner(const tl_sk& s, long long p) {
  return (int)(((p + 1) * s.G + s.iters - 1) / s.iters) - 1;
}
__device__ __forceinline__ int tl_ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
"#;

/// The consumer's code between its last products of a unit and the epilogue: a unit that is a
/// later part of a split tile parks its sums and skips the epilogue; the one with the tile's
/// first K-blocks adds the parked sums of the blocks after it.
pub(super) fn render_fixup(q: &Params) -> String {
    let mblocks = q.warp_m() / 64;
    let accn = q.tile_n / 2;
    let threads = q.consumers * 128;
    let warps = q.consumers * 4;
    // float4 columns of one block's partial tile.
    let cols = mblocks * accn / 4;
    let mut park = String::new();
    let mut add = String::new();
    for j in 0..mblocks {
        for i in (0..accn).step_by(4) {
            let c = (j * accn + i) / 4;
            let _ = writeln!(
                park,
                "        __stcg(part + {c} * {threads}, make_float4(acc[{j}][{i}], acc[{j}][{}], acc[{j}][{}], acc[{j}][{}]));",
                i + 1,
                i + 2,
                i + 3
            );
            let _ = writeln!(
                add,
                "          {{ const float4 v = __ldcg(part + {c} * {threads}); acc[{j}][{i}] += v.x; acc[{j}][{}] += v.y; acc[{j}][{}] += v.z; acc[{j}][{}] += v.w; }}",
                i + 1,
                i + 2,
                i + 3
            );
        }
    }
    format!(
        r#"      if (kb_lo > 0) {{
        // A later part of a split tile: park the sums for the block with its first part.
        float4* const part = reinterpret_cast<float4*>(sk_ws + {flags}) + (long long)blockIdx.x * {cols} * {threads} + (cw * 128 + tid);
{park}        __threadfence();
        __syncwarp();
        if (lane == 0) atomicAdd(sk_flags + blockIdx.x, 1);
        continue;
      }}
      if (kb_hi < kblocks) {{
        // The first part of a split tile: add the later parts' sums, block by block.
        const int last = tl_sk_owner(sk, (long long)(t - sk.dp_tiles + 1) * kblocks - 1);
        for (int o = blockIdx.x + 1; o <= last; ++o) {{
          while (tl_ld_acquire(sk_flags + o) < {warps}) {{}}
          const float4* const part = reinterpret_cast<const float4*>(sk_ws + {flags}) + (long long)o * {cols} * {threads} + (cw * 128 + tid);
{add}        }}
        // Every consumer warp has read them: the counters are free for the next launch.
        asm volatile("bar.sync 3, {threads};" ::: "memory");
        if (cw == 0 && tid == 0)
          for (int o = blockIdx.x + 1; o <= last; ++o) sk_flags[o] = 0;
      }}
"#,
        flags = FLAG_SLOTS,
    )
}

/// The tiles that run whole on a grid of `grid` blocks (`dp_tiles`): all, when they fill whole
/// waves; else those of the waves before the last full one.
#[cfg(test)]
fn whole_tiles(tiles: usize, grid: usize) -> usize {
    let waves = tiles / grid;
    if tiles % grid == 0 {
        tiles
    } else {
        waves.saturating_sub(1) * grid
    }
}

/// The decomposition as the device computes it (`tl_sk_init`, `tl_sk_next`), for the tests:
/// each block's units `(tile, kb_lo, kb_hi)` in order.
#[cfg(test)]
fn units(tiles: usize, kblocks: usize, grid: usize) -> Vec<Vec<(usize, usize, usize)>> {
    let g = grid;
    let dp = whole_tiles(tiles, g);
    let iters = (tiles - dp) * kblocks;
    (0..g)
        .map(|b| {
            let mut v: Vec<_> = (b..dp).step_by(g).map(|t| (t, 0, kblocks)).collect();
            let (lo, hi) = (iters * b / g, iters * (b + 1) / g);
            let mut pos = lo;
            while pos < hi {
                let tt = pos / kblocks;
                let end = ((tt + 1) * kblocks).min(hi);
                v.push((dp + tt, pos - tt * kblocks, end - tt * kblocks));
                pos = end;
            }
            v
        })
        .collect()
}

/// The block whose share holds split iteration `p` (`tl_sk_owner`).
#[cfg(test)]
fn owner(p: usize, iters: usize, grid: usize) -> usize {
    ((p + 1) * grid).div_ceil(iters) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every K-block of every tile is computed once; each block parks at most one partial sum,
    /// in its first unit; the finishing block of a split tile names exactly the blocks holding
    /// its other parts, all after it.
    #[test]
    fn decomposition_covers_each_k_block_once() {
        for &(tiles, kblocks, g) in &[
            (98, 16, 132),
            (196, 36, 132),
            (400, 8, 132),
            (100, 32, 132),
            (2, 16, 32),
            (7, 3, 21),
            (264, 12, 132),
            (1, 1, 1),
            (5, 1, 4),
            (133, 40, 132),
        ] {
            let g = grid(g, tiles, kblocks);
            let u = units(tiles, kblocks, g);
            let mut seen = vec![vec![0u32; kblocks]; tiles];
            assert!(u.iter().all(|l| l.iter().filter(|&&(_, lo, _)| lo > 0).count() <= 1));
            for (b, list) in u.iter().enumerate() {
                assert!(!list.is_empty(), "block {b} idle: {tiles} tiles, {kblocks}, grid {g}");
                for (i, &(t, lo, hi)) in list.iter().enumerate() {
                    assert!(lo < hi && hi <= kblocks);
                    if lo > 0 {
                        // A parked part is the block's first split unit.
                        assert!(list[..i].iter().all(|&(_, l, h)| l == 0 && h == kblocks), "block {b}: {list:?}");
                    }
                    for s in &mut seen[t][lo..hi] {
                        *s += 1;
                    }
                }
            }
            assert!(seen.iter().flatten().all(|&c| c == 1), "{tiles} {kblocks} {g}");
            // Finishers: a unit (t, 0, hi < kblocks) waits for blocks b+1..=owner(last).
            let split0 = whole_tiles(tiles, g);
            let iters = (tiles - split0) * kblocks;
            for (b, list) in u.iter().enumerate() {
                for &(t, lo, hi) in list {
                    if lo == 0 && hi < kblocks {
                        let last = owner((t - split0 + 1) * kblocks - 1, iters, g);
                        let holders: Vec<usize> = (0..g)
                            .filter(|&o| o != b && u[o].iter().any(|&(tt, l, _)| tt == t && l > 0))
                            .collect();
                        assert_eq!(holders, (b + 1..=last).collect::<Vec<_>>(), "tile {t}");
                    }
                }
            }
        }
    }
}
