//! CUDA C++ source of the Hopper GEMM kernel for one problem class and parameter set.
//!
//! Shared memory holds `stages` slots, each an A tile then a B tile, every tile made of
//! 1024-byte swizzle atoms as the bulk tensor copy writes them with the 128-byte swizzle:
//! - a K-major operand (K contiguous in memory) is one box of 128 bytes of K (64 16-bit, 128
//!   fp8 or 32 tf32 elements) by `rows` rows: row r at byte 128·r; a wgmma reads 8-row groups
//!   1024 bytes apart (the stride offset) and steps through K by moving its start 32 bytes (its
//!   K: 16, 32 or 8 elements);
//! - an MN-major operand (M or N contiguous) is `rows / 64` boxes of 64 MN-elements by 64 K
//!   rows, 8 KiB each: K row k of a box at byte 128·k; the wgmma reads 64-element MN chunks
//!   8192 bytes apart (the leading offset) and 8-row K groups 1024 bytes apart, and steps
//!   through K by moving its start 16 rows (2048 bytes). 16-bit operands only: the fp8 and
//!   tf32 wgmma have no transpose, so both their operands are K-major.
//!
//! Barriers: `full[s]` (one arrival, the producer's, plus the copy's transaction bytes) and
//! `empty[s]` (one arrival per consumer warp). Iteration `i` of the flattened (tile, k-block)
//! loop uses slot `i % stages` in phase `(i / stages) & 1`; the producer waits for the
//! opposite parity on `empty`, which a fresh barrier satisfies at once.

use std::fmt::Write;

use tilec_ir::DType;

use super::{Activation, Layout, Params, Problem};
use crate::render::{EPILOGUE_VEC, PRELUDE};

pub(super) fn short(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F32 => "f32",
        DType::F8E4M3 => "e4m3",
        DType::F8E5M2 => "e5m2",
        _ => "x",
    }
}

/// The wgmma type names of A and B (`tf32` for f32 operands).
fn mma_types(p: &Problem) -> (&'static str, &'static str) {
    let t = |d: DType| if d == DType::F32 && p.tf32 { "tf32" } else { short(d) };
    (t(p.in_dtype), t(p.b_dtype()))
}

pub(super) fn storage(d: DType) -> &'static str {
    match d {
        DType::BF16 => "tl_bf16",
        DType::F16 => "tl_f16",
        _ => "float",
    }
}

/// The kernel's name: everything its source depends on (shapes are run-time arguments).
pub fn kernel_name(p: &Problem, q: &Params) -> String {
    let l = |l: Layout| match l {
        Layout::RowMajor => 'r',
        Layout::ColMajor => 'c',
    };
    let act = match p.epilogue.activation {
        Activation::None => "",
        Activation::Relu => "_relu",
        Activation::Gelu => "_gelu",
    };
    let bias = p
        .epilogue
        .bias
        .map(|b| format!("_bias{}", short(b)))
        .unwrap_or_default();
    let bcast = match (
        p.batch > 1 && p.batch_stride_a == 0,
        p.batch > 1 && p.batch_stride_b == 0,
    ) {
        (false, false) => "",
        (true, false) => "_bca",
        (false, true) => "_bcb",
        (true, true) => "_bcab",
    };
    let split = if p.a_split.is_some() { "_as" } else { "" };
    // A convolution's geometry is compiled into the producer.
    let conv = p
        .conv
        .map(|c| {
            format!(
                "_cv{}x{}x{}x{}_o{}_k{}x{}_s{}x{}_p{}x{}_d{}x{}",
                c.n, c.h, c.w, c.c, p.n, c.kh, c.kw, c.stride.0, c.stride.1, c.pad.0, c.pad.1, c.dil.0, c.dil.1
            )
        })
        .unwrap_or_default();
    let custom = p
        .custom
        .as_ref()
        .map(|c| format!("_e{:016x}", c.key()))
        .unwrap_or_default();
    let scales = match (p.scale_a, p.scale_b) {
        (false, false) => "",
        (true, false) => "_sa",
        (false, true) => "_sb",
        (true, true) => "_sab",
    };
    let (ta, tb) = mma_types(p);
    let ab = if ta == tb { ta.to_string() } else { format!("{ta}{tb}") };
    // `_sth`: the staged epilogue parking in 16 bits.
    let st = if super::park_dtype(p, q).is_some() { "_sth" } else { "_st" };
    let staged = match (q.staged, q.pingpong) {
        (true, true) => format!("{st}_pp"),
        (true, false) => st.to_string(),
        (false, true) => "_pp".to_string(),
        (false, false) => String::new(),
    };
    let staged = if super::shuffled(p, q) { format!("{staged}_sx") } else { staged };
    let staged = if q.rowstore { format!("{staged}_rs") } else { staged };
    let staged = if q.stream_k { format!("{staged}_sk") } else { staged };
    let cluster = if q.cluster_m > 1 {
        format!("_k{}", q.cluster_m)
    } else {
        String::new()
    };
    format!(
        "tl_gemm_sm90_{}{}{}_{}_{}x{}x{}_s{}_c{}_g{}_r{}x{}{cluster}{scales}{bias}{act}{bcast}{split}{conv}{staged}{custom}",
        ab,
        l(p.a_layout),
        l(p.b_layout),
        short(p.out_dtype),
        q.tile_m,
        q.tile_n,
        q.tile_k,
        q.stages,
        q.consumers,
        q.group_m,
        q.regs.0,
        q.regs.1,
    )
}

/// The im2col copy (convolutions only: other sources stay as they were).
const IM2COL_HELPER: &str = r#"
// An im2col copy: pixels from (c, w, h, n) on, each shifted by the tap's offsets (ow, oh).
__device__ __forceinline__ void tl_tma_im2col4(unsigned dst, const tl_tmap* map, int c, int w, int h, int n,
                                               unsigned short ow, unsigned short oh, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};"
               :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar),
                  "h"(ow), "h"(oh)
               : "memory");
}
"#;

/// Device helpers: shared addresses, mbarriers, the bulk tensor copy and wgmma control.
pub(crate) const HELPERS: &str = r#"
struct __align__(128) tl_tmap { unsigned long long opaque[16]; };

__device__ __forceinline__ unsigned tl_smem_addr(const void* p) {
  unsigned r;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void tl_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void tl_mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tl_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
// Waits for the phase of parity `parity` to complete. A wait that polls 2^26 times (seconds:
// every poll may suspend the thread) means a broken protocol: trap rather than hang.
__device__ __forceinline__ void tl_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done, polls = 0;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (++polls == (1u << 26)) asm volatile("trap;");
  } while (!done);
}
__device__ __forceinline__ void tl_tma_load3(unsigned dst, const tl_tmap* map, int c0, int c1, int c2, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
               :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void tl_tma_load4(unsigned dst, const tl_tmap* map, int c0, int c1, int c2, int c3, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
               :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
               : "memory");
}
// The same copy delivered to the same offset (and barrier offset) of every block in `mask`.
__device__ __forceinline__ void tl_tma_load3_mc(unsigned dst, const tl_tmap* map, int c0, int c1, int c2, unsigned bar,
                                                unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, %4}], [%5], %6;"
               :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
               : "memory");
}
__device__ __forceinline__ unsigned tl_cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// Arrives on the barrier at the same offset in block `cta` of the cluster. The arrival keeps
// the default release at CTA scope: what it orders is the consumer's reads of a slot, done by
// wgmma and completed by its wait, before the peer's next copy into it. A release at cluster
// scope compiles to a GPU-wide memory barrier (MEMBAR.ALL.GPU) before every arrival, which
// also waits out the epilogue's global stores: it held two-block clusters to 430-480 TFLOP/s
// at 8192^3 (H100; 755-762 without it, beside 743-751 for the same tiles unclustered).
__device__ __forceinline__ void tl_mbar_arrive_cta(unsigned bar, unsigned cta) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
__device__ __forceinline__ void tl_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void tl_tma_prefetch_map(const tl_tmap* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
// A wgmma shared-memory descriptor with the 128-byte swizzle: start address, leading and
// stride byte offsets (all in 16-byte units), mode 1 in bits 62-63.
__device__ __forceinline__ unsigned long long tl_wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4)
       | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16)
       | ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32)
       | (1ull << 62);
}
__device__ __forceinline__ void tl_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void tl_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void tl_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
"#;

/// Packing two f32 values into one 32-bit word of 16-bit ones (rounded to nearest even, the
/// first in the low half: the lower address) and widening them back.
pub(crate) const PARK16_HELPERS: &str = r#"
__device__ __forceinline__ unsigned tl_pack_f16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned tl_pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float tl_lo_f16(unsigned w) { return tl_bits_f16((unsigned short)(w & 0xffffu)); }
__device__ __forceinline__ float tl_hi_f16(unsigned w) { return tl_bits_f16((unsigned short)(w >> 16)); }
__device__ __forceinline__ float tl_lo_bf16(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float tl_hi_bf16(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
"#;

/// One `wgmma.mma_async` of shape m64nNkK over accumulator array `acc` (n/2 registers per
/// thread), A of type `ta` and B of `tb`; `trans` gives the transpose bits (16-bit types only:
/// the fp8 and tf32 forms have none).
pub(crate) fn wgmma_fn(name: &str, n: usize, k: usize, ta: &str, tb: &str, trans: Option<(u32, u32)>) -> String {
    let regs = n / 2;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "__device__ __forceinline__ void {name}(float* d, unsigned long long da, unsigned long long db, int accumulate) {{"
    );
    let list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let _ = writeln!(
        s,
        "  asm volatile(\"{{ .reg .pred p; setp.ne.b32 p, %{}, 0;\\n\"",
        regs + 2
    );
    let trans = trans.map(|(a, b)| format!(", {a}, {b}")).unwrap_or_default();
    let _ = writeln!(
        s,
        "    \"wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ta}.{tb} {{{}}}, %{}, %{}, p, 1, 1{trans}; }}\"",
        list.join(", "),
        regs,
        regs + 1
    );
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    let _ = writeln!(s, "    : {}", outs.join(", "));
    let _ = writeln!(s, "    : \"l\"(da), \"l\"(db), \"r\"(accumulate));");
    let _ = writeln!(s, "}}");
    s
}

pub(super) fn load_out(d: DType, e: &str) -> String {
    match d {
        DType::BF16 => format!("tl_ld_bf16({e})"),
        DType::F16 => format!("tl_ld_f16({e})"),
        _ => e.to_string(),
    }
}

/// Renders the kernel (with the prelude) for `problem`'s class and `params`. Call
/// [`applies`](super::applies) first; this only asserts what the source itself relies on.
pub fn render(problem: &Problem, params: &Params) -> String {
    let p = problem;
    let q = params;
    let name = kernel_name(p, q);
    let (ta, tb) = mma_types(p);
    let (bm, bn, bk) = (q.tile_m, q.tile_n, q.tile_k);
    assert!(bk == p.tile_k() && bn % 64 == 0 && bm % 64 == 0, "{q:?}");
    let wm = q.warp_m();
    let mblocks = wm / 64;
    let a_kmajor = p.a_layout == Layout::RowMajor;
    let b_kmajor = p.b_layout == Layout::ColMajor;
    let wide = p.elem_bytes() == 2;
    assert!(wide || (a_kmajor && b_kmajor), "fp8 and tf32 operands are K-major");
    let a_bytes = bm * super::K_BYTES;
    let b_bytes = bn * super::K_BYTES;
    let stage = a_bytes + b_bytes;
    let threads = q.threads();
    let out_t = storage(p.out_dtype);

    let mut s = String::new();
    s.push_str(PRELUDE);
    s.push_str(HELPERS);
    let shuffled = super::shuffled(p, q);
    if super::park_dtype(p, q).is_some() || (shuffled && p.custom.is_none() && p.out_dtype != DType::F32) {
        s.push_str(PARK16_HELPERS);
    }
    if shuffled {
        s.push_str(super::shuffle::HELPERS);
    }
    if p.conv.is_some() {
        s.push_str(IM2COL_HELPER);
    }
    if q.stream_k {
        s.push_str(super::stream_k::HELPERS);
    }
    s.push_str(&wgmma_fn(
        "tl_wgmma",
        bn,
        p.mma_k(),
        ta,
        tb,
        wide.then_some((u32::from(!a_kmajor), u32::from(!b_kmajor))),
    ));

    let bias_param = match p.epilogue.bias {
        Some(d) => format!("const {}* __restrict__ bias", storage(d)),
        None => "const void* __restrict__ bias_unused".to_string(),
    };
    // Scales follow the fixed parameters; a custom epilogue's parameters come last (as
    // launches pass them).
    let mut extra_params = String::new();
    for (set, name) in [(p.scale_a, "scale_a"), (p.scale_b, "scale_b")] {
        if set {
            let _ = write!(extra_params, ",\n       const float* __restrict__ {name}");
        }
    }
    if let Some(c) = &p.custom {
        s.push_str(&c.source);
        for param in &c.params {
            extra_params.push_str(",\n       ");
            extra_params.push_str(param);
        }
    }
    let _ = write!(
        s,
        r#"
extern "C" __global__ void {cluster_attr}__launch_bounds__({threads}, 1)
{name}(const __grid_constant__ tl_tmap map_a, const __grid_constant__ tl_tmap map_b,
       {out_t}* __restrict__ c, {bias_param},
       int M, int N, int K, int batch, long long ldc, long long batch_stride_c{sk_param}{extra_params}) {{
  constexpr int BM = {bm}, BN = {bn}, BK = {bk}, STAGES = {stages}, GROUP_M = {group}, CL = {cl};
  constexpr unsigned A_BYTES = {a_bytes}u, STAGE_BYTES = {stage}u;
  extern __shared__ unsigned char tl_dyn_smem[];
  const unsigned base = (tl_smem_addr(tl_dyn_smem) + 1023u) & ~1023u;
  const unsigned bars = base + STAGES * STAGE_BYTES;{stage_ptr}
  // full[s] at bars + 8 s, empty[s] at bars + 8 (STAGES + s).
  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {{
    for (int s = 0; s < STAGES; ++s) {{
      tl_mbar_init(bars + 8 * s, 1);
      tl_mbar_init(bars + 8 * (STAGES + s), {empty_count});
    }}
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }}
  __syncthreads();
{cluster_sync}
  // With clusters of CL blocks along M, a cluster owns CL vertically adjacent tiles; block
  // `rank` takes the rank-th. Tiles past M compute on zeros and store nothing.
  const int rank = {rank};
  const int tiles_m = (M + BM * CL - 1) / (BM * CL), tiles_n = (N + BN - 1) / BN;
  const int tiles_per_batch = tiles_m * tiles_n;
  const int tiles = tiles_per_batch * batch;
  const int kblocks = (K + BK - 1) / BK;{sk_init}
  if (wg == 0) {{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 {preg};");
    if (tid == 0) {{
      tl_tma_prefetch_map(&map_a);
      tl_tma_prefetch_map(&map_b);
      unsigned it = 0;
{producer_loop}
        int b, tm, tn;
        tl_tile_coords(t, tiles_m, tiles_n, tiles_per_batch, GROUP_M, b, tm, tn);
        const int m0 = (tm * CL + rank) * BM, n0 = tn * BN;
        for (int kb = kb_lo; kb < kb_hi; ++kb, ++it) {{
          const unsigned s = it % STAGES, ph = (it / STAGES) & 1u;
          tl_mbar_wait(bars + 8 * (STAGES + s), ph ^ 1u);
          const unsigned full = bars + 8 * s;
          tl_mbar_expect_tx(full, STAGE_BYTES);
          const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
          const int k0 = kb * BK;
{loads}
        }}
      }}
    }}
  }} else {{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 {creg};");
{scale_load}    const int cw = wg - 1;
    const int warp = tid / 32, lane = tid % 32;
    float acc[{mblocks}][{accn}];
#pragma unroll
    for (int j = 0; j < {mblocks}; ++j)
#pragma unroll
      for (int i = 0; i < {accn}; ++i) acc[j][i] = 0.0f;
{consumer_loop}
      int b, tm, tn;
      tl_tile_coords(t, tiles_m, tiles_n, tiles_per_batch, GROUP_M, b, tm, tn);
      const int m0 = (tm * CL + rank) * BM, n0 = tn * BN;{pp_wait}
      for (int kb = kb_lo; kb < kb_hi; ++kb, ++it) {{
        const unsigned s = it % STAGES, ph = (it / STAGES) & 1u;
        tl_mbar_wait(bars + 8 * s, ph);
        const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
        tl_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / {mma_k}; ++kk) {{
          const unsigned long long db = tl_wgmma_desc(sb + {b_kstep}u * kk, {b_lbo}u, 1024u);
{mmas}
        }}
        tl_wgmma_commit();
        if (kb > kb_lo) {{
          tl_wgmma_wait<1>();
          // The previous slot's products are done: hand it back to the producer.
          if (lane == 0) {release}
        }}
      }}
      tl_wgmma_wait<0>();
      if (lane == 0) {release}{pp_signal}
#pragma unroll
      for (int j = 0; j < {mblocks}; ++j)
#pragma unroll
        for (int i = 0; i < {accn}; ++i) asm volatile("" : "+f"(acc[j][i]) :: "memory");
{fixup}{epilogue}{pp_skip}
    }}
  }}
{cluster_exit}}}
"#,
        stages = q.stages,
        stage_ptr = if q.staged || q.rowstore {
            // The staged epilogue's slices follow the barriers (16-byte aligned).
            "\n  float* tl_dyn_stage = (float*)(tl_dyn_smem + ((base - tl_smem_addr(tl_dyn_smem)) + STAGES * STAGE_BYTES + 16 * STAGES));"
        } else {
            ""
        },
        group = q.group_m,
        // Every consumer warp frees each slot, or in ping-pong only the owning warpgroup's.
        empty_count = 4 * if q.pingpong { 1 } else { q.consumers } * q.cluster_m,
        consumer_loop = if q.pingpong {
            // Ping-pong: warpgroup cw takes every other tile of the block's sequence; its ring
            // position skips the other's K-blocks.
            "    unsigned it = cw * kblocks;\n    for (int t = blockIdx.x + cw * gridDim.x; t < tiles; t += 2 * gridDim.x) {\n      const int kb_lo = 0, kb_hi = kblocks;"
                .to_string()
        } else {
            format!("    unsigned it = 0;\n{}", unit_loop(q))
        },
        producer_loop = unit_loop(q),
        sk_param = if q.stream_k { ", float* __restrict__ sk_ws" } else { "" },
        sk_init = if q.stream_k {
            "\n  const tl_sk sk = tl_sk_init(tiles, kblocks);\n  int* const sk_flags = reinterpret_cast<int*>(sk_ws);"
        } else {
            ""
        },
        fixup = if q.stream_k { super::stream_k::render_fixup(q) } else { String::new() },
        pp_skip = if q.pingpong { "\n      it += kblocks;" } else { "" },
        // The warpgroups take turns in the main loop (named barriers 1 and 2, both warpgroups'
        // 256 threads): a warpgroup's K-blocks start only once the other's previous tile has
        // all its slots, so no wait is ever a full ring ahead of the producer (a barrier's
        // parity would alias).
        pp_wait = if q.pingpong {
            "\n      if (cw == 1 || t != (int)blockIdx.x) asm volatile(\"bar.sync %0, 256;\" :: \"r\"(cw == 0 ? 2 : 1) : \"memory\");"
        } else {
            ""
        },
        pp_signal = if q.pingpong {
            "\n      if (t + (int)gridDim.x < tiles) asm volatile(\"bar.arrive %0, 256;\" :: \"r\"(cw == 0 ? 1 : 2) : \"memory\");"
        } else {
            ""
        },
        cl = q.cluster_m,
        cluster_attr = if q.cluster_m > 1 {
            format!("__cluster_dims__({}, 1, 1) ", q.cluster_m)
        } else {
            String::new()
        },
        cluster_sync = if q.cluster_m > 1 {
            "  // Every block's barriers are initialized before any peer copies or arrives.\n  tl_cluster_sync();"
        } else {
            ""
        },
        rank = if q.cluster_m > 1 {
            "(int)tl_cluster_rank()"
        } else {
            "0"
        },
        release = if q.cluster_m > 1 {
            // A slot is refilled by copies from every block of the cluster: free it in each.
            let arrivals = (0..q.cluster_m)
                .map(|r| {
                    format!("tl_mbar_arrive_cta(bars + 8 * (STAGES + (it - 1) % STAGES), {r}u);")
                })
                .collect::<Vec<_>>()
                .join(" ");
            format!("{{ {arrivals} }}")
        } else {
            "tl_mbar_arrive(bars + 8 * (STAGES + (it - 1) % STAGES));".to_string()
        },
        cluster_exit = if q.cluster_m > 1 {
            "  // No block leaves while a peer may still arrive on its barriers.\n  tl_cluster_sync();\n"
        } else {
            ""
        },
        preg = q.regs.0,
        creg = q.regs.1,
        accn = bn / 2,
        mma_k = p.mma_k(),
        scale_load = match (p.scale_a, p.scale_b) {
            (false, false) => String::new(),
            (a, b) => {
                let f = |set: bool, n: &str| if set { format!("__ldg({n})") } else { "1.0f".into() };
                format!(
                    "    const float ab_scale = {} * {};\n",
                    f(a, "scale_a"),
                    f(b, "scale_b")
                )
            }
        },
        loads = render_loads(p, q),
        b_kstep = if b_kmajor { 32 } else { 2048 },
        b_lbo = if b_kmajor { 16 } else { 8192 },
        mmas = render_mmas(q, a_kmajor),
        epilogue = render_epilogue(p, q),
    );
    // The tile order goes before the kernel.
    let tile_fn = r#"
// Tile t of the persistent loop: batch b, then groups of GROUP_M tile rows, each group visited
// column by column (down its rows first), so that neighbouring blocks share A and B in L2.
__device__ __forceinline__ void tl_tile_coords(int t, int tiles_m, int tiles_n, int per_batch, int group_m,
                                               int& b, int& tm, int& tn) {
  b = t / per_batch;
  t -= b * per_batch;
  const int span = group_m * tiles_n;
  const int g = t / span;
  const int first = g * group_m;
  const int rows = tiles_m - first < group_m ? tiles_m - first : group_m;
  const int r = t - g * span;
  tm = first + r % rows;
  tn = r / rows;
}
"#;
    let at = s.find("\nextern \"C\"").expect("kernel present");
    s.insert_str(at, tile_fn);
    if let Some(c) = &p.conv {
        s.push_str(&super::render_repack(&name, c, p.n));
    }
    s
}

/// The head of a warpgroup's loop over its units of work, setting the tile `t` and its K-blocks
/// `[kb_lo, kb_hi)`: whole tiles in turn, or with stream-K the block's share of the
/// decomposition (see [`super::stream_k`]).
fn unit_loop(q: &Params) -> String {
    if q.stream_k {
        "    long long u_pos = sk.lo;\n    for (int u_t = blockIdx.x, t, kb_lo, kb_hi; tl_sk_next(sk, u_t, u_pos, t, kb_lo, kb_hi);) {".into()
    } else {
        "    for (int t = blockIdx.x / CL; t < tiles; t += gridDim.x / CL) {\n      const int kb_lo = 0, kb_hi = kblocks;".into()
    }
}

/// The producer's copies for one stage.
fn render_loads(p: &Problem, q: &Params) -> String {
    let mut s = String::new();
    let ba = if p.batch > 1 && p.batch_stride_a == 0 {
        "0"
    } else {
        "b"
    };
    let bb = if p.batch > 1 && p.batch_stride_b == 0 {
        "0"
    } else {
        "b"
    };
    let ind = "          ";
    match p.a_layout {
        // A convolution: one im2col box of 64 channels of one tap by BM output pixels, from
        // the tile's first pixel (a tile past M reads the last one: it stores nothing).
        Layout::RowMajor if p.conv.is_some() => {
            let c = p.conv.unwrap_or_default();
            let _ = writeln!(
                s,
                "{ind}{{\n{ind}  const int pix = min(m0, M - 1), img = pix / {opix}, rem = pix - img * {opix};\n\
                 {ind}  const int oh = rem / {ow}, ow = rem - oh * {ow};\n\
                 {ind}  const int tap = kb / {cb}, c0 = (kb - tap * {cb}) * 64, r = tap / {kw}, t = tap - r * {kw};\n\
                 {ind}  tl_tma_im2col4(sa, &map_a, c0, ow * {sw} - {pw}, oh * {sh} - {ph}, img, (unsigned short)(t * {dw}), (unsigned short)(r * {dh}), full);\n\
                 {ind}}}",
                opix = (c.oh * c.ow).max(1),
                ow = c.ow.max(1),
                cb = (c.c / 64).max(1),
                kw = c.kw.max(1),
                sw = c.stride.1,
                sh = c.stride.0,
                pw = c.pad.1,
                ph = c.pad.0,
                dw = c.dil.1,
                dh = c.dil.0,
            );
        }
        // Row-major A is K-major: one box of 64 K by BM rows.
        // A split A: one box of 64 K (one head) by BM rows of one group.
        Layout::RowMajor if p.a_split.is_some() => {
            let rows = p.a_split.map_or(1, |s| s.rows);
            let _ = writeln!(
                s,
                "{ind}tl_tma_load4(sa, &map_a, 0, m0 % {rows}, k0 >> 6, m0 / {rows}, full);"
            );
        }
        Layout::RowMajor => {
            let _ = writeln!(s, "{ind}tl_tma_load3(sa, &map_a, k0, m0, {ba}, full);");
        }
        // Column-major A is M-major: BM/64 boxes of 64 M by 64 K.
        Layout::ColMajor => {
            for i in 0..q.tile_m / 64 {
                let _ = writeln!(
                    s,
                    "{ind}tl_tma_load3(sa + {}u, &map_a, m0 + {}, k0, {ba}, full);",
                    i * 8192,
                    i * 64
                );
            }
        }
    }
    let cl = q.cluster_m;
    if cl > 1 {
        // The blocks of a cluster share B: each copies 1/CL of it to all of them.
        let mask = (1u32 << cl) - 1;
        match p.b_layout {
            Layout::ColMajor => {
                let rows = q.tile_n / cl;
                let _ = writeln!(
                    s,
                    "{ind}tl_tma_load3_mc(sb + rank * {}u, &map_b, k0, n0 + rank * {rows}, {bb}, full, {mask});",
                    rows * 128
                );
            }
            Layout::RowMajor => {
                for i in 0..q.tile_n / 64 / cl {
                    let _ = writeln!(
                        s,
                        "{ind}tl_tma_load3_mc(sb + (rank * {per} + {i}) * 8192u, &map_b, n0 + (rank * {per} + {i}) * 64, k0, {bb}, full, {mask});",
                        per = q.tile_n / 64 / cl
                    );
                }
            }
        }
        return s;
    }
    match p.b_layout {
        // Column-major B (K x N) is K-major: one box of 64 K by BN rows (columns of B).
        Layout::ColMajor => {
            let _ = writeln!(s, "{ind}tl_tma_load3(sb, &map_b, k0, n0, {bb}, full);");
        }
        // Row-major B is N-major: BN/64 boxes of 64 N by 64 K.
        Layout::RowMajor => {
            for i in 0..q.tile_n / 64 {
                let _ = writeln!(
                    s,
                    "{ind}tl_tma_load3(sb + {}u, &map_b, n0 + {}, k0, {bb}, full);",
                    i * 8192,
                    i * 64
                );
            }
        }
    }
    s
}

/// The consumer's wgmmas for one 16-deep K step `kk`: one per 64-row block it owns.
fn render_mmas(q: &Params, a_kmajor: bool) -> String {
    let mut s = String::new();
    let mblocks = q.warp_m() / 64;
    // The warpgroup's first 64-row block of the tile (in ping-pong each owns a whole tile).
    let wg = if q.pingpong { "0".to_string() } else { format!("cw * {mblocks}") };
    let ind = "          ";
    for j in 0..mblocks {
        // Block (cw * mblocks + j) of 64 rows starts 8192 bytes after the previous one in both
        // layouts (64 rows of 128 bytes, or one 64x64 box).
        let (kstep, lbo) = if a_kmajor { (32, 16) } else { (2048, 8192) };
        let _ = writeln!(
            s,
            "{ind}tl_wgmma(acc[{j}], tl_wgmma_desc(sa + ({wg} + {j}) * 8192u + {kstep}u * kk, {lbo}u, 1024u), db, (kb > kb_lo || kk > 0) ? 1 : 0);"
        );
    }
    s
}

/// The factor applied to an accumulator before the epilogue (the per-tensor scales).
fn scale_factor(p: &Problem) -> &'static str {
    if p.scale_a || p.scale_b {
        " * ab_scale"
    } else {
        ""
    }
}

/// Registers to global memory: bias, activation and cast, stores guarded at the edges.
///
/// Accumulator register `4 q + 2 h + e` of a 64-row block holds row `16 warp + lane / 4 + 8 h`,
/// column `8 q + 2 (lane % 4) + e` of the block.
fn render_epilogue(p: &Problem, q: &Params) -> String {
    if super::shuffled(p, q) {
        return super::shuffle::render(p, q, scale_factor(p));
    }
    if let Some(c) = &p.custom {
        return render_custom_epilogue(p, c, q);
    }
    let mblocks = q.warp_m() / 64;
    // The warpgroup's first 64-row block of the tile (in ping-pong each owns a whole tile).
    let wg = if q.pingpong { "0".to_string() } else { format!("cw * {mblocks}") };
    let bn = q.tile_n;
    let od = p.out_dtype;
    let act = |v: &str| activation(p, v);
    let (bias0, bias1) = match p.epilogue.bias {
        Some(d) => (
            format!("(col < N ? {} : 0.0f)", load_out(d, "bias[col]")),
            format!("(col + 1 < N ? {} : 0.0f)", load_out(d, "bias[col + 1]")),
        ),
        None => ("0.0f".to_string(), "0.0f".to_string()),
    };
    let (pair_store, one_store) = match od {
        DType::BF16 => (
            "*reinterpret_cast<unsigned*>(dst) = (unsigned)tl_st_bf16(v0).bits | ((unsigned)tl_st_bf16(v1).bits << 16);",
            ["dst[0] = tl_st_bf16(v0);", "dst[1] = tl_st_bf16(v1);"],
        ),
        DType::F16 => (
            "*reinterpret_cast<unsigned*>(dst) = (unsigned)tl_st_f16(v0).bits | ((unsigned)tl_st_f16(v1).bits << 16);",
            ["dst[0] = tl_st_f16(v0);", "dst[1] = tl_st_f16(v1);"],
        ),
        _ => (
            "float2 w; w.x = v0; w.y = v1; *reinterpret_cast<float2*>(dst) = w;",
            ["dst[0] = v0;", "dst[1] = v1;"],
        ),
    };
    if q.staged {
        let bias = match p.epilogue.bias {
            Some(d) => format!(" + {}", load_out(d, "bias[col]")),
            None => String::new(),
        };
        let store = match od {
            DType::BF16 => "tl_st_bf16(y)",
            DType::F16 => "tl_st_f16(y)",
            _ => "y",
        };
        let sink = format!(
            "const float x = v{bias};\n                const float y = {};\n                c[(long long)b * batch_stride_c + (long long)row * ldc + col] = {store};",
            act("x")
        );
        return render_staged_epilogue(p, q, &sink, scale_factor(p));
    }
    let v0 = act("x0");
    let v1 = act("x1");
    let mut s = String::new();
    let _ = write!(
        s,
        r#"      {{
        const bool pairs = ((ldc | batch_stride_c) & 1) == 0;
        {out_t}* cb = c + (long long)b * batch_stride_c;
"#,
        out_t = storage(od)
    );
    for j in 0..mblocks {
        let _ = write!(
            s,
            r#"        {{
          const int row0 = m0 + ({wg} + {j}) * 64 + warp * 16 + (lane >> 2);
#pragma unroll
          for (int q = 0; q < {nt}; ++q) {{
            const int col = n0 + 8 * q + 2 * (lane & 3);
            const float bias0 = {bias0}, bias1 = {bias1};
#pragma unroll
            for (int h = 0; h < 2; ++h) {{
              const int row = row0 + 8 * h;
              if (row < M && col < N) {{
                const float x0 = acc[{j}][4 * q + 2 * h]{scale} + bias0, x1 = acc[{j}][4 * q + 2 * h + 1]{scale} + bias1;
                const float v0 = {v0}, v1 = {v1};
                {out_t}* dst = cb + (long long)row * ldc + col;
                if (pairs && col + 1 < N) {{
                  {pair_store}
                }} else {{
                  {one0}
                  if (col + 1 < N) {one1}
                }}
              }}
            }}
          }}
        }}
"#,
            nt = bn / 8,
            out_t = storage(od),
            scale = scale_factor(p),
            one0 = one_store[0],
            one1 = one_store[1],
        );
    }
    s.push_str("      }\n");
    s
}

/// The built-in epilogue's activation of `v` (an f32 expression).
pub(super) fn activation(p: &Problem, v: &str) -> String {
    match p.epilogue.activation {
        Activation::None => v.to_string(),
        Activation::Relu => format!("fmaxf({v}, 0.0f)"),
        Activation::Gelu if p.out_dtype == DType::F32 => {
            format!("(0.5f * {v} * (1.0f + erff({v} * 0.70710678118654752f)))")
        }
        Activation::Gelu => format!("tl_gelu_erf({v})"),
    }
}

/// A custom epilogue's parameter names as call arguments (each followed by `, `), and the
/// expressions of the batch and row it is called with (`row` and `b` in scope).
pub(super) fn custom_args(c: &super::CustomEpilogue) -> (String, String, String) {
    let args: String = c
        .params
        .iter()
        .map(|p| {
            let name = p.rsplit([' ', '*']).next().unwrap_or("");
            format!("{name}, ")
        })
        .collect();
    let (bexpr, rexpr) = match c.rows {
        Some(r) => (format!("(long long)row / {r}"), format!("(long long)row % {r}")),
        None => ("(long long)b".to_string(), "(long long)row".to_string()),
    };
    (args, bexpr, rexpr)
}

/// The per-element calls of a custom epilogue (guarded at the edges).
fn render_custom_epilogue(p: &Problem, c: &super::CustomEpilogue, q: &Params) -> String {
    let mblocks = q.warp_m() / 64;
    // The warpgroup's first 64-row block of the tile (in ping-pong each owns a whole tile).
    let wg = if q.pingpong { "0".to_string() } else { format!("cw * {mblocks}") };
    let (args, bexpr, rexpr) = custom_args(c);
    if q.staged {
        if let Some(vf) = &c.vector {
            return render_staged_vector_epilogue(p, q, scale_factor(p), &format!("const long long eb = {bexpr}, er = {rexpr};"), &c.name, vf, &args);
        }
        let sink = format!("const long long eb = {bexpr}, er = {rexpr};\n                {}({args}eb, er, col, v);", c.name);
        return render_staged_epilogue(p, q, &sink, scale_factor(p));
    }
    let mut s = String::from("      {\n");
    for j in 0..mblocks {
        let _ = write!(
            s,
            r#"        {{
          const int row0 = m0 + ({wg} + {j}) * 64 + warp * 16 + (lane >> 2);
#pragma unroll
          for (int q = 0; q < {nt}; ++q) {{
            const int col = n0 + 8 * q + 2 * (lane & 3);
#pragma unroll
            for (int h = 0; h < 2; ++h) {{
              const int row = row0 + 8 * h;
              if (row < M && col < N) {{
                const long long eb = {bexpr}, er = {rexpr};
                {f}({args}eb, er, col, acc[{j}][4 * q + 2 * h]{scale});
                if (col + 1 < N) {f}({args}eb, er, col + 1, acc[{j}][4 * q + 2 * h + 1]{scale});
              }}
            }}
          }}
        }}
"#,
            nt = q.tile_n / 8,
            f = c.name,
            scale = scale_factor(p),
        );
    }
    s.push_str("      }\n");
    s
}

/// The staged epilogue, one element per call: each warp parks its accumulators 16 rows by 32
/// columns at a time in its own shared memory ([`render_parked`] in f32, [`render_parked16`]
/// in 16 bits), then reads them back a row at a time, lane `l` on column `l` (a warp's loads
/// and stores cover whole row segments), and runs `sink` on each value `v` inside C; warps
/// need no block-wide barrier.
fn render_staged_epilogue(p: &Problem, q: &Params, sink: &str, scale: &str) -> String {
    let value = match super::park_dtype(p, q) {
        // Row r of a slice: 16 words (32 columns), its four 16-byte groups swizzled by
        // (r / 2) % 4 (see render_parked16): column l in half-word 8 ((l / 8) ^ swizzle) + l % 8.
        // A warp reads one row: 64 bytes, 16 banks, two lanes per word (a broadcast).
        Some(d) => format!(
            "tl_bits_{}(((const unsigned short*)tl_s)[r * 32 + 8 * ((lane >> 3) ^ ((r >> 1) & 3)) + (lane & 7)])",
            short(d)
        ),
        None => "tl_st[r * 40 + lane]".to_string(),
    };
    let readback = format!(
        r#"#pragma unroll 4
            for (int r = 0; r < 16; ++r) {{
              const int row = row0 + r, col = n0 + ch * 32 + lane;
              if (row < M && col < N) {{
                const float v = {value};
                {sink}
              }}
            }}"#
    );
    match super::park_dtype(p, q) {
        Some(d) => render_parked16(q, d, scale, &readback),
        None => render_parked(q, scale, &readback),
    }
}

/// The staged custom epilogue with a vector epilogue function: the warp's slice is parked as
/// in [`render_staged_epilogue`], then each lane reads [`EPILOGUE_VEC`] adjacent columns of a
/// row (four lanes per 32-column row, eight rows per pass) and hands them to the vector
/// function (whole-vector loads and stores), or element by element at the right edge of C.
fn render_staged_vector_epilogue(p: &Problem, q: &Params, scale: &str, split: &str, f: &str, vf: &str, args: &str) -> String {
    let v = EPILOGUE_VEC;
    if let Some(d) = super::park_dtype(p, q) {
        assert_eq!(v, 8, "a 16-byte load holds 8 16-bit columns");
        // Lane l reads 16 bytes: row 8 pass + l / 4, 16-byte group l % 4 (swizzled as parked),
        // then widens the 8 values to f32 for the function.
        let t = short(d);
        let unpack: Vec<String> = ["x", "y", "z", "w"]
            .iter()
            .flat_map(|c| [format!("tl_lo_{t}(tl_w.{c})"), format!("tl_hi_{t}(tl_w.{c})")])
            .collect();
        let readback = format!(
            r#"#pragma unroll
            for (int pass = 0; pass < 2; ++pass) {{
              const int r = pass * 8 + (lane >> 2);
              const int row = row0 + r, col = n0 + ch * 32 + (lane & 3) * {v};
              if (row < M && col < N) {{
                {split}
                const uint4 tl_w = *reinterpret_cast<const uint4*>(tl_s + r * 16 + 4 * ((lane & 3) ^ ((r >> 1) & 3)));
                __align__(16) float tl_v[{v}] = {{{unpack}}};
{call}
              }}
            }}"#,
            unpack = unpack.join(", "),
            call = super::shuffle::vector_call(vf, f, args, "N", "                "),
        );
        return render_parked16(q, d, scale, &readback);
    }
    let readback = format!(
        r#"#pragma unroll
            for (int pass = 0; pass < 2; ++pass) {{
              const int r = pass * 8 + (lane >> 2);
              const int row = row0 + r, col = n0 + ch * 32 + (lane & 3) * {v};
              if (row < M && col < N) {{
                {split}
                const float* tl_src = tl_st + r * 40 + (lane & 3) * {v};
                if (col + {v} <= N) {{
                  {vf}({args}eb, er, col / {v}, tl_src);
                }} else {{
                  for (int x = 0; col + x < N; ++x) {f}({args}eb, er, col + x, tl_src[x]);
                }}
              }}
            }}"#
    );
    render_parked(q, scale, &readback)
}

/// Each warp's accumulators parked as f32, 16 rows by 32 columns at a time, in its slice
/// `tl_st` (rows padded to 40 floats: the pair writes of a half-warp hit distinct banks), then
/// `readback` (which sees `row0`, the chunk `ch` and the slice) between two `__syncwarp`s.
fn render_parked(q: &Params, scale: &str, readback: &str) -> String {
    let mblocks = q.warp_m() / 64;
    // The warpgroup's first 64-row block of the tile (in ping-pong each owns a whole tile).
    let wg = if q.pingpong { "0".to_string() } else { format!("cw * {mblocks}") };
    let mut s = String::from(
        "      {\n        float* tl_st = (float*)tl_dyn_stage + (cw * 4 + warp) * 640;\n",
    );
    for j in 0..mblocks {
        let _ = write!(
            s,
            r#"        {{
          const int row0 = m0 + ({wg} + {j}) * 64 + warp * 16;
#pragma unroll
          for (int ch = 0; ch < {chunks}; ++ch) {{
#pragma unroll
            for (int qq = 0; qq < 4; ++qq)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                *(float2*)(tl_st + ((lane >> 2) + 8 * h) * 40 + qq * 8 + 2 * (lane & 3)) =
                    make_float2(acc[{j}][4 * (ch * 4 + qq) + 2 * h]{scale}, acc[{j}][4 * (ch * 4 + qq) + 2 * h + 1]{scale});
            __syncwarp();
{readback}
            __syncwarp();
          }}
        }}
"#,
            chunks = q.tile_n / 32,
        );
    }
    s.push_str("      }\n");
    s
}

/// Each warp's accumulators parked in 16 bits (`d`), 16 rows by 32 columns at a time, in two
/// slices `tl_s` used in turn, then `readback` after one `__syncwarp`.
///
/// Exact: [`park_dtype`](super::park_dtype) picks `d` only where the epilogue rounds the
/// product to `d` first anyway (a MatMul over f16 or bf16 has an f16 or bf16 output in the
/// graph, which its Add, activation or store then read), and rounding twice to nearest even
/// is rounding once.
///
/// A slice is 16 rows of 16 words (32 columns of 16 bits, 1 KiB); column pair `w` of row `r`
/// (16-byte group `g = w / 4`, word `w % 4` in it) sits at word `16 r + 4 (g ^ s(r)) + w % 4`,
/// with the swizzle `s(r) = (r / 2) % 4`. Banks (32 of 4 bytes; a row is half of them, rows
/// of one parity the same half):
/// - park: one store per accumulator pair, lane `l` on row `l / 4 + 8 h`, pair `4 qq + l % 4`:
///   bank `16 ((l / 4) % 2) + 4 (qq ^ (l / 8) % 4) + l % 4`, a bijection of the 32 lanes;
/// - vector readback: 16-byte loads, served a quarter-warp (8 lanes, 128 bytes) at a time;
///   lanes `8 i .. 8 i + 7` read rows `2 i` and `2 i + 1` (plus 8 per pass), one in each half,
///   all four groups of each: 32 distinct banks;
/// - row readback: one row of 64 bytes, 16 banks.
///
/// Two slices per warp: chunk `c` parks in slice `c % 2` and is read back after a
/// `__syncwarp`; the next one parks in the other slice, so no second barrier waits for the
/// read-back. Chunk `c + 2` overwrites slice `c % 2` only after the `__syncwarp` that follows
/// every lane's read-back of chunk `c` (chunks run on across the 64-row blocks and tiles: an
/// even count per block, as `tile_n` is a multiple of 64).
fn render_parked16(q: &Params, d: DType, scale: &str, readback: &str) -> String {
    let mblocks = q.warp_m() / 64;
    // The warpgroup's first 64-row block of the tile (in ping-pong each owns a whole tile).
    let wg = if q.pingpong { "0".to_string() } else { format!("cw * {mblocks}") };
    let pack = format!("tl_pack_{}x2", short(d));
    // Two 1 KiB slices per warp (within STAGING_BYTES); the lane's park swizzle s(l / 4 + 8 h)
    // is (l / 8) % 4.
    let mut s = String::from(
        "      {\n        unsigned* tl_sh = (unsigned*)tl_dyn_stage + (cw * 4 + warp) * 512;\n        const int tl_swz = (lane >> 3) & 3;\n",
    );
    for j in 0..mblocks {
        let _ = write!(
            s,
            r#"        {{
          const int row0 = m0 + ({wg} + {j}) * 64 + warp * 16;
#pragma unroll
          for (int ch = 0; ch < {chunks}; ++ch) {{
            unsigned* tl_s = tl_sh + (ch & 1) * 256;
#pragma unroll
            for (int qq = 0; qq < 4; ++qq)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                tl_s[((lane >> 2) + 8 * h) * 16 + 4 * (qq ^ tl_swz) + (lane & 3)] =
                    {pack}(acc[{j}][4 * (ch * 4 + qq) + 2 * h]{scale}, acc[{j}][4 * (ch * 4 + qq) + 2 * h + 1]{scale});
            __syncwarp();
{readback}
          }}
        }}
"#,
            chunks = q.tile_n / 32,
        );
    }
    s.push_str("      }\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16-bit slice layout as rendered: every parked column comes back where the read-backs
    /// look for it, and no access conflicts on banks (32 banks of 4 bytes; 4-byte stores a warp
    /// at a time, 16-byte loads a quarter-warp at a time).
    #[test]
    fn sixteen_bit_parking_round_trips_without_bank_conflicts() {
        let mut p = Problem::new(300, 200, 64, DType::F16);
        p.custom = Some(super::super::CustomEpilogue {
            loads: false,
            name: "f".into(),
            source: String::new(),
            params: vec![],
            rows: None,
            rounds_to: Some(DType::F16),
            vector: Some("fv".into()),
        });
        let q = Params { staged: true, tile_m: 64, tile_n: 64, consumers: 1, ..Params::default() };
        let src = render(&p, &q);
        // The index expressions mirrored below.
        assert!(src.contains("const int tl_swz = (lane >> 3) & 3;"));
        assert!(src.contains("tl_s[((lane >> 2) + 8 * h) * 16 + 4 * (qq ^ tl_swz) + (lane & 3)] ="));
        assert!(src.contains("tl_s + r * 16 + 4 * ((lane & 3) ^ ((r >> 1) & 3))"));
        let scalar = render(&Problem { custom: None, ..p.clone() }, &q);
        assert!(scalar.contains("[r * 32 + 8 * ((lane >> 3) ^ ((r >> 1) & 3)) + (lane & 7)]"));
        // Half-word h of the slice holds (row, column) of the chunk.
        let mut slot = [None; 512];
        for qq in 0..4 {
            for h in 0..2 {
                let mut banks = [false; 32];
                for lane in 0..32usize {
                    let r = (lane >> 2) + 8 * h;
                    let w = r * 16 + 4 * (qq ^ ((lane >> 3) & 3)) + (lane & 3);
                    assert!(!std::mem::replace(&mut banks[w % 32], true), "park qq {qq} h {h}: bank {}", w % 32);
                    for e in 0..2 {
                        assert!(slot[2 * w + e].replace((r, 8 * qq + 2 * (lane & 3) + e)).is_none());
                    }
                }
            }
        }
        for pass in 0..2 {
            for quarter in 0..4 {
                let mut banks = [false; 32];
                for lane in 8 * quarter..8 * quarter + 8 {
                    let r = pass * 8 + (lane >> 2);
                    let w = r * 16 + 4 * ((lane & 3) ^ ((r >> 1) & 3));
                    for x in 0..8 {
                        assert_eq!(slot[2 * w + x], Some((r, (lane & 3) * 8 + x)), "vector read-back");
                    }
                    for b in w..w + 4 {
                        assert!(!std::mem::replace(&mut banks[b % 32], true), "read-back pass {pass} quarter {quarter}");
                    }
                }
            }
        }
        for r in 0..16 {
            let mut words = std::collections::BTreeSet::new();
            for lane in 0..32 {
                let hw = r * 32 + 8 * ((lane >> 3) ^ ((r >> 1) & 3)) + (lane & 7);
                assert_eq!(slot[hw], Some((r, lane)), "row read-back");
                words.insert(hw / 2);
            }
            // 16 words in 16 distinct banks (two lanes per word).
            let banks: std::collections::BTreeSet<usize> = words.iter().map(|w| w % 32).collect();
            assert_eq!((words.len(), banks.len()), (16, 16));
        }
    }

    #[test]
    fn wgmma_wrapper_lists_every_accumulator() {
        let f = wgmma_fn("w", 256, 16, "bf16", "bf16", Some((0, 1)));
        assert!(f.contains("m64n256k16.f32.bf16.bf16"));
        assert!(f.contains("%127}, %128, %129, p, 1, 1, 0, 1;"));
        assert!(f.contains("setp.ne.b32 p, %130, 0;"));
        assert_eq!(f.matches("\"+f\"").count(), 128);
        // fp8 and tf32: no transpose operands.
        let f = wgmma_fn("w", 128, 32, "e4m3", "e5m2", None);
        assert!(f.contains("m64n128k32.f32.e4m3.e5m2 {%0,"));
        assert!(f.contains("%63}, %64, %65, p, 1, 1; }"));
        let f = wgmma_fn("w", 64, 8, "tf32", "tf32", None);
        assert!(f.contains("m64n64k8.f32.tf32.tf32"));
    }
}
