//! The Hopper (sm_90a) variant of the FlashAttention forward kernel: both products on
//! `wgmma` (`Params::wgmma`).
//!
//! A block is one producer warpgroup and `block_m / 64` consumer warpgroups, each consumer
//! owning 64 query rows. The producer copies the Q tile once and then K and V blocks into a
//! ring of `stages` shared-memory slots with `cp.async` (16-byte chunks); each copy's
//! completion arrives on an mbarrier (`cp.async.mbarrier.arrive.noinc`: `full[s]`, and one
//! for Q), and a slot is refilled once every consumer warp has arrived on its `empty[s]`.
//! Tiles are stored as [`super::render`] describes (slices of 64 head dimensions, 128-byte
//! rows, chunk `c` of row `r` at `c ^ (r & 7)`), which, with every slice 1024-byte aligned, is
//! the 128-byte swizzle `wgmma` reads through its shared-memory descriptors:
//!
//! - `S = Q K^T`: `m64n{block_n}k16`, A (Q) and B (K) both K-major (the head dimension
//!   contiguous): 8-row groups 1024 bytes apart, K steps of 16 elements move the start by 32
//!   bytes within a slice;
//! - `O += P V`: `m64n{head_dim}k16` with P as the register A operand (the accumulator layout
//!   of S, packed in pairs, is the A fragment layout, as with `mma.sync`) and V as an MN-major
//!   B (keys are rows, the head dimension contiguous: the transpose bit): 64-element slices of
//!   the head dimension `block_n * 128` bytes apart (the leading offset), 8-key groups 1024
//!   apart, steps of 16 keys 2048 bytes.
//!
//! Copies written through the generic proxy are fenced into the async proxy
//! (`fence.proxy.async`) by each consumer after its wait and before its products read them.
//! Per block a consumer issues `S = Q K^T`, then the previous block's `P V` (FlashAttention-3's
//! overlap inside a warpgroup), waits for `S` only, applies the scale, masks and online
//! softmax of [`super::render`] in the same fragment layout while `P V` runs, then waits for
//! it, frees its slot, rescales O and packs this block's P for the next turn. With two
//! consumers the products are issued in turns (named barriers), so one consumer's softmax
//! overlaps the other's products. Accumulators are fenced to the compiler after each wait.
//!
//! Causal blocks end at the last key block the block's last row reaches; both consumers
//! walk all of them (the first one's last block is then masked whole for it).

use super::{FlashProblem, Mask, MaskKind, Params, MAX_SMEM};
use crate::gemm::render::wgmma_fn;

/// Bytes of the barriers after the ring: Q's, then `full` and `empty` per slot.
pub fn barrier_bytes(stages: usize) -> usize {
    8 * (1 + 2 * stages)
}

/// Consumer warpgroups of a parameter set.
pub fn consumers(q: &Params) -> usize {
    q.block_m / 64
}

/// Register limits after reallocation: producer and consumers.
fn regs(q: &Params) -> (u32, u32) {
    if consumers(q) == 1 {
        (56, 240)
    } else {
        (40, 232)
    }
}

pub fn validate(q: &Params, head_dim: usize) -> Result<(), String> {
    if ![64, 128].contains(&q.block_m) {
        return Err(format!("block_m {} (64 or 128: one consumer warpgroup per 64 rows)", q.block_m));
    }
    if q.warps != 4 * (1 + consumers(q)) {
        return Err(format!("{} warps with block_m {} (a producer warpgroup and one consumer per 64 rows: {})", q.warps, q.block_m, 4 * (1 + consumers(q))));
    }
    if ![64, 128].contains(&q.block_n) {
        return Err(format!("block_n {} (64 or 128)", q.block_n));
    }
    if !(2..=4).contains(&q.stages) {
        return Err(format!("{} stages (2 to 4)", q.stages));
    }
    if consumers(q) == 2 && head_dim == 128 && q.block_n == 128 {
        // Three warpgroups get 168 registers a thread: 64 score and 64 output accumulators
        // plus the previous block's P do not fit, and ptxas serializes the products.
        return Err("block_n 128 with head dim 128 and two consumers needs more than the 168 registers a thread of three warpgroups has".into());
    }
    if q.smem_bytes(head_dim) > MAX_SMEM {
        return Err(format!("{} bytes of shared memory (at most {MAX_SMEM})", q.smem_bytes(head_dim)));
    }
    Ok(())
}

/// Default parameters: 128 query rows (two consumers) unless 128-row blocks would not give
/// every SM two, 128 keys per block (64 with head dim 128: the registers of three
/// warpgroups), as many ring slots as fit (up to 4).
pub fn heuristic(p: &FlashProblem, sm_count: usize) -> Params {
    let blocks = p.batch * p.heads_q * p.seq_q.div_ceil(128);
    let block_m = if p.seq_q <= 64 || blocks < 2 * sm_count { 64 } else { 128 };
    let block_n = if block_m == 128 && p.head_dim > 64 { 64 } else { 128 };
    let mut q = Params { block_m, block_n, warps: 4 * (1 + block_m / 64), stages: 4, wgmma: true };
    while q.stages > 2 && q.smem_bytes(p.head_dim) > MAX_SMEM {
        q.stages -= 1;
    }
    q
}

/// The device helpers beyond the GEMM template's and the sm80 kernel's: the two wgmma forms
/// and the copy-completion arrival.
pub fn helpers(p: &FlashProblem, q: &Params, ty: &str) -> String {
    let mut s = wgmma_fn("tl_fa_qk", q.block_n, 16, ty, ty, Some((0, 0)));
    s.push_str(&wgmma_rs_fn("tl_fa_pv", p.head_dim, ty));
    s.push_str(
        r#"__device__ __forceinline__ void tl_fa_arrive_cp(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
}
// 2^x on the special function unit (denormal results flushed to zero).
__device__ __forceinline__ float tl_fa_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Named barriers over the two consumer warpgroups (256 threads).
__device__ __forceinline__ void tl_fa_bar_sync(int id) { asm volatile("bar.sync %0, 256;" :: "r"(id) : "memory"); }
__device__ __forceinline__ void tl_fa_bar_arrive(int id) { asm volatile("bar.arrive %0, 256;" :: "r"(id) : "memory"); }
"#,
    );
    s
}

/// `wgmma.mma_async` m64nNk16 with A from registers (four 32-bit pairs per thread), B an
/// MN-major descriptor (the transpose bit), always accumulating.
fn wgmma_rs_fn(name: &str, n: usize, ty: &str) -> String {
    let regs = n / 2;
    let list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    let r = |i: usize| format!("%{}", regs + i);
    format!(
        "__device__ __forceinline__ void {name}(float* d, const unsigned* a, unsigned long long db) {{\n  asm volatile(\"{{ .reg .pred p; setp.ne.b32 p, {}, 0;\\n\"\n    \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{}}}, {{{}, {}, {}, {}}}, {}, p, 1, 1, 1; }}\"\n    : {}\n    : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(db), \"r\"(1));\n}}\n",
        r(5),
        list.join(", "),
        r(0),
        r(1),
        r(2),
        r(3),
        r(4),
        outs.join(", ")
    )
}

/// Placeholders of [`KERNEL`] beyond the shared ones of [`super::render`].
pub fn vars(p: &FlashProblem, q: &Params) -> Vec<(&'static str, String)> {
    let (preg, creg) = regs(q);
    vec![
        ("@CW@", consumers(q).to_string()),
        ("@PREG@", preg.to_string()),
        ("@CREG@", creg.to_string()),
        ("@PQITERS@", (q.block_m * p.head_dim / 8 / 128).to_string()),
        ("@PKITERS@", (q.block_n * p.head_dim / 8 / 128).to_string()),
        ("@NT4@", (q.block_n / 2).to_string()),
        ("@DN4@", (p.head_dim / 2).to_string()),
        ("@RAW@", (p.scale > 0.0 && !matches!(p.mask, Some(Mask { kind: MaskKind::Additive, .. }))).to_string()),
    ]
}

pub const KERNEL: &str = r#"extern "C" __global__ void __launch_bounds__(@T@, 1) @NAME@(@PARAMS@) {
  extern __shared__ __align__(1024) unsigned char tl_smem[];
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  // Causal: the longest query blocks (most keys) first.
  const int mb = @CAUSAL@ ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / @REP@;
  const int m0 = mb * @BM@;
  const unsigned short* Qg = (const unsigned short*)@QPTR@ + (long long)b * @QSB@ + (long long)h * @QSH@;
  const unsigned short* Kg = (const unsigned short*)@KPTR@ + (long long)b * @KSB@ + (long long)hk * @KSH@;
  const unsigned short* Vg = (const unsigned short*)@VPTR@ + (long long)b * @VSB@ + (long long)hk * @VSH@;
  unsigned short* Og = (unsigned short*)@OPTR@ + (long long)b * @OSB@ + (long long)h * @OSH@;
@MASKDECL@  const unsigned sq = (tl_mma_saddr(tl_smem) + 1023u) & ~1023u;
  const unsigned skv = sq + @QBYTES@;
  // Barriers after the ring: Q's, full[s] at 8 + 8s, empty[s] at 8 + 8 (stages + s).
  const unsigned bars = skv + @ST@ * @STAGE@;
  if (tid == 0) {
    tl_mbar_init(bars, 128);
#pragma unroll
    for (int s = 0; s < @ST@; ++s) {
      tl_mbar_init(bars + 8 + 8 * s, 128);
      tl_mbar_init(bars + 8 + 8 * (@ST@ + s), 4 * @CW@);
    }
  }
  __syncthreads();
  // Key blocks the block sees: all, or (causal) up to the one holding its last row's diagonal.
  int nkb = @NKB@;
  if (@CAUSAL@) {
    const int last = m0 + @BM@ - 1 + @OFF@;
    nkb = last < 0 ? 0 : min(nkb, last / @BN@ + 1);
  }
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 @PREG@;");
    // The Q tile (zeros past the queries).
#pragma unroll 1
    for (int it = 0; it < @PQITERS@; ++it) {
      const int idx = tid + it * 128;
      const int r = idx / @CPR@, c = idx % @CPR@;
      const bool ok = m0 + r < @SQ@;
      const unsigned at = (c >> 3) * @QSLICE@ + r * 128 + (((c & 7) ^ (r & 7)) << 4);
      tl_cp16(sq + at, ok ? (const void*)(Qg + (long long)(m0 + r) * @QSR@ + c * 8) : (const void*)Qg, ok ? 16u : 0u);
    }
    tl_fa_arrive_cp(bars);
    for (int kb = 0; kb < nkb; ++kb) {
      const int s = kb % @ST@;
      tl_mbar_wait(bars + 8 + 8 * (@ST@ + s), ((kb / @ST@) & 1) ^ 1);
      const unsigned sk = skv + s * @STAGE@, sv = sk + @KVBYTES@;
#pragma unroll 2
      for (int it = 0; it < @PKITERS@; ++it) {
        const int idx = tid + it * 128;
        const int r = idx / @CPR@, c = idx % @CPR@;
        const int key = kb * @BN@ + r;
        const bool ok = key < @SK@;
        const unsigned at = (c >> 3) * @KSLICE@ + r * 128 + (((c & 7) ^ (r & 7)) << 4);
        tl_cp16(sk + at, ok ? (const void*)(Kg + (long long)key * @KSR@ + c * 8) : (const void*)Kg, ok ? 16u : 0u);
        tl_cp16(sv + at, ok ? (const void*)(Vg + (long long)key * @VSR@ + c * 8) : (const void*)Vg, ok ? 16u : 0u);
      }
      tl_fa_arrive_cp(bars + 8 + 8 * s);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 @CREG@;");
    const int cw = wg - 1, wq = (tid >> 5) & 3;
    const int wrow = m0 + cw * 64 + wq * 16;
    float o[@DN4@];
#pragma unroll
    for (int i = 0; i < @DN4@; ++i) o[i] = 0.f;
    // Running maximum (scaled by log2(e)) and this lane's partial sum of rows g and g + 8.
    float mrow[2] = {-TL_INF_F, -TL_INF_F}, lrow[2] = {0.f, 0.f};
    // Two consumers take turns issuing their products (named barriers 1 and 2: "consumer c
    // may issue"), so one's softmax overlaps the other's products. The second consumer opens
    // the first turn; the last turn hands over nothing. Both walk every key block of the
    // block (causal: the first consumer's last one is wholly masked for it, and adds
    // nothing): a trip count that differs between warpgroups makes ptxas serialize the
    // products.
    if (@CW@ == 2 && cw == 1 && nkb > 0) tl_fa_bar_arrive(1);
    tl_mbar_wait(bars, 0);
    // P of the previous block, packed: the A operand of its P V, issued in the next turn.
    unsigned pf[@NT2@][4];
    for (int kb = 0; kb < nkb; ++kb) {
      if (@CW@ == 2) tl_fa_bar_sync(1 + cw);
      const int s = kb % @ST@;
      tl_mbar_wait(bars + 8 + 8 * s, (kb / @ST@) & 1);
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      const unsigned sk = skv + s * @STAGE@;
      // S = Q K^T for this block, then P V for the previous one: the softmax below overlaps
      // the second product.
      float sc[@NT4@];
      tl_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < @DK@; ++kk) {
        const unsigned long long da = tl_wgmma_desc(sq + (kk >> 2) * @QSLICE@ + cw * 8192 + (kk & 3) * 32, 16, 1024);
        const unsigned long long db = tl_wgmma_desc(sk + (kk >> 2) * @KSLICE@ + (kk & 3) * 32, 16, 1024);
        tl_fa_qk(sc, da, db, kk > 0 ? 1 : 0);
      }
      tl_wgmma_commit();
      if (kb > 0) {
        const unsigned svp = skv + ((kb - 1) % @ST@) * @STAGE@ + @KVBYTES@;
#pragma unroll
        for (int kk = 0; kk < @NT2@; ++kk) tl_fa_pv(o, pf[kk], tl_wgmma_desc(svp + kk * 2048, @KSLICE@, 1024));
        tl_wgmma_commit();
      }
      if (kb > 0) {
        tl_wgmma_wait<1>();
      } else {
        tl_wgmma_wait<0>();
      }
      // The turn passes once S is in (a barrier between the issue and the wait would make
      // ptxas serialize the products).
      if (@CW@ == 2 && !(cw == 1 && kb == nkb - 1)) tl_fa_bar_arrive(2 - cw);
#pragma unroll
      for (int i = 0; i < @NT4@; ++i) asm volatile("" : "+f"(sc[i]) :: "memory");
      // Scale (log2(e) folded in), and mask where the block needs it: keys past the end, the
      // causal diagonal, the mask tensor.
      // Decided per warpgroup (its first row), not per warp: a branch that splits a warpgroup
      // makes ptxas serialize its products.
      const bool edge = @HASMASK@ || (kb + 1) * @BN@ > @SK@ || (@CAUSAL@ && (kb + 1) * @BN@ - 1 > m0 + cw * 64 + @OFF@);
      // With a positive scale and no additive mask the maximum is taken over the raw scores
      // and the scale applied inside the exponent's multiply-add (RAW): one fewer instruction
      // per score; otherwise the scores are scaled first.
#pragma unroll
      for (int j = 0; j < @NT@; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = @RAW@ ? sc[4 * j + e] : sc[4 * j + e] * @SCALE2@;
          if (edge) {
            const int qi = wrow + g + 8 * (e >> 1);
            const int key = kb * @BN@ + j * 8 + 2 * t4 + (e & 1);
            bool keep = key < @SK@;
            if (@CAUSAL@) keep = keep && key <= qi + @OFF@;
            @MASKCODE@
            x = keep ? x : -TL_INF_F;
          }
          sc[4 * j + e] = x;
        }
      // Online softmax: new maxima (over the row's four lanes, in scaled units), exponentials,
      // sums.
      float alpha[2];
      bool grew = false;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = -TL_INF_F;
#pragma unroll
        for (int j = 0; j < @NT@; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * hr], sc[4 * j + 2 * hr + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmaxf(mrow[hr], @RAW@ ? mx * @SCALE2@ : mx);
        // A row with nothing visible yet keeps -inf; exponentials are taken against 0 then.
        const float mu = mx == -TL_INF_F ? 0.f : mx;
        grew = grew || mx != mrow[hr];
        // Exactly 1 where the maximum stayed (O is then left as it is).
        alpha[hr] = mx == mrow[hr] ? 1.f : tl_fa_ex2(mrow[hr] - mu);
        mrow[hr] = mx;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < @NT@; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float v = sc[4 * j + 2 * hr + c];
            const float pr = tl_fa_ex2(@RAW@ ? fmaf(v, @SCALE2@, -mu) : v - mu);
            sc[4 * j + 2 * hr + c] = pr;
            sum += pr;
          }
        lrow[hr] = lrow[hr] * alpha[hr] + sum;
      }
      // The previous P V is done: its slot goes back to the producer, O is rescaled and this
      // block's P packed.
      tl_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < @DN4@; ++i) asm volatile("" : "+f"(o[i]) :: "memory");
      if (kb > 0 && lane == 0) tl_mbar_arrive(bars + 8 + 8 * (@ST@ + (kb - 1) % @ST@));
      // O is rescaled only where some row's maximum grew (a warp-wide choice: no products
      // inside).
      if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int dn = 0; dn < @DN@; ++dn) {
          o[4 * dn] *= alpha[0];
          o[4 * dn + 1] *= alpha[0];
          o[4 * dn + 2] *= alpha[1];
          o[4 * dn + 3] *= alpha[1];
        }
      }
#pragma unroll
      for (int kk = 0; kk < @NT2@; ++kk) {
        pf[kk][0] = tl_fa_pack(sc[8 * kk], sc[8 * kk + 1]);
        pf[kk][1] = tl_fa_pack(sc[8 * kk + 2], sc[8 * kk + 3]);
        pf[kk][2] = tl_fa_pack(sc[8 * kk + 4], sc[8 * kk + 5]);
        pf[kk][3] = tl_fa_pack(sc[8 * kk + 6], sc[8 * kk + 7]);
      }
    }
    // The last block's P V.
    if (nkb > 0) {
      const unsigned svp = skv + ((nkb - 1) % @ST@) * @STAGE@ + @KVBYTES@;
      tl_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < @NT2@; ++kk) tl_fa_pv(o, pf[kk], tl_wgmma_desc(svp + kk * 2048, @KSLICE@, 1024));
      tl_wgmma_commit();
      tl_wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < @DN4@; ++i) asm volatile("" : "+f"(o[i]) :: "memory");
      if (lane == 0) tl_mbar_arrive(bars + 8 + 8 * (@ST@ + (nkb - 1) % @ST@));
    }
    // O / l in 16 bits; a row with every key masked (l = 0) is zeros, and with zero_nan_rows a
    // row whose sum is NaN (a NaN or +inf logit) too.
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float l = lrow[hr];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const bool zero = @ZN@ ? !(l > 0.f) : l == 0.f;
      const float inv = 1.f / l;
      const int qi = wrow + g + 8 * hr;
      if (qi < @SQ@) {
        unsigned short* orow = Og + (long long)qi * @OSR@;
#pragma unroll
        for (int dn = 0; dn < @DN@; ++dn) {
          const float x0 = zero ? 0.f : o[4 * dn + 2 * hr] * inv, x1 = zero ? 0.f : o[4 * dn + 2 * hr + 1] * inv;
          *(unsigned*)(orow + dn * 8 + 2 * t4) = tl_fa_pack(x0, x1);
        }
        if (tl_lse != 0 && t4 == 0)
          tl_lse[((long long)b * @HQ@ + h) * @SQ@ + qi] = zero ? -TL_INF_F : (mrow[hr] + log2f(l)) * 0.6931471805599453f;
      }
    }
  }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use tilec_ir::DType;

    #[test]
    fn parameters_are_checked() {
        let q = Params { block_m: 128, block_n: 128, warps: 12, stages: 3, wgmma: true };
        assert_eq!(validate(&q, 64), Ok(()));
        assert!(validate(&q, 128).unwrap_err().contains("registers"));
        assert_eq!(q.threads(), 384);
        // Q 32 KiB, three slots of 64 KiB, alignment and barriers.
        assert_eq!(q.smem_bytes(128), 32768 + 3 * 65536 + 1024 + 56);
        let one = Params { block_m: 64, warps: 8, ..q };
        assert_eq!(validate(&one, 128), Ok(()));
        assert!(validate(&Params { stages: 4, ..one }, 128).unwrap_err().contains("shared memory"));
        assert!(validate(&Params { warps: 8, ..q }, 128).unwrap_err().contains("12"));
        assert!(validate(&Params { block_m: 192, warps: 16, ..q }, 64).unwrap_err().contains("block_m"));
        assert!(validate(&Params { block_n: 96, ..q }, 64).unwrap_err().contains("block_n"));
        assert_eq!(validate(&Params { block_m: 64, warps: 8, stages: 4, ..q }, 64), Ok(()));
    }

    #[test]
    fn heuristic_fits() {
        let big = FlashProblem::new(4, 32, 32, 4096, 4096, 128, DType::BF16);
        let q = heuristic(&big, 132);
        assert_eq!((q.block_m, q.block_n, q.warps, q.stages, q.wgmma), (128, 64, 12, 4, true));
        assert_eq!(validate(&q, 128), Ok(()));
        let gpt2 = FlashProblem::new(8, 12, 12, 512, 512, 64, DType::F16);
        let q = heuristic(&gpt2, 132);
        assert_eq!((q.block_m, q.block_n, q.stages), (128, 128, 4));
        assert_eq!(validate(&q, 64), Ok(()));
        let small = FlashProblem::new(1, 2, 2, 77, 131, 64, DType::F16);
        let q = heuristic(&small, 132);
        assert_eq!((q.block_m, q.warps), (64, 8));
        assert_eq!(validate(&q, 64), Ok(()));
    }

    #[test]
    fn register_a_wrapper_lists_its_operands() {
        let f = wgmma_rs_fn("w", 128, "bf16");
        assert!(f.contains("m64n128k16.f32.bf16.bf16 {%0,"));
        assert!(f.contains("%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1; }"));
        assert!(f.contains("setp.ne.b32 p, %69, 0;"));
        assert_eq!(f.matches("\"+f\"").count(), 64);
    }
}
