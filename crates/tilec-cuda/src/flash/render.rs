//! CUDA C++ source of the FlashAttention forward kernel for one problem and parameter set.
//!
//! Shared memory: the Q tile (`block_m` rows), then `stages` ring slots, each a K tile and a V
//! tile (`block_n` keys). Every tile is stored in slices of 64 head dimensions, a slice as
//! rows of 128 bytes (8 chunks of 16 bytes), chunk `c` of row `r` at chunk `c ^ (r & 7)`, so
//! the eight rows an `ldmatrix` reads at one chunk column fall in different bank groups (the
//! layout of [`crate::mma`]'s K-major tiles).
//!
//! Per thread (lane `l`, `g = l / 4`, `t = l % 4`), in the PTX fragment layouts of
//! `mma.m16n8k16`: the Q fragments of its warp's 16 rows (`head_dim / 16` x 4 registers), the
//! scores of one key block (`block_n / 8` tiles of 4 floats: rows `g` and `g + 8`, keys
//! `2t, 2t + 1` of the tile), the output accumulators (`head_dim / 8` tiles of 4 floats), and
//! the running maximum and partial sum of rows `g` and `g + 8` (the sum is over this lane's
//! keys; the four lanes of a row add theirs at the end).

use std::fmt::Write;

use tilec_ir::DType;

use super::{sm90, FlashProblem, MaskKind, Params};
use crate::families::OperandRef;
use crate::mma::render::{mma_fn, HELPERS};
use crate::render::{PRELUDE, source_hash as fnv, short16 as short};

/// Where the kernel's operands are among its pointer parameters (the tile-IR kernel's, when
/// the kernel replaces one; `tl_lse` comes after them).
#[derive(Clone, Debug, PartialEq)]
pub struct FlashArgs {
    /// Pointer parameters before `tl_lse`.
    pub params: usize,
    pub q: OperandRef,
    pub k: OperandRef,
    pub v: OperandRef,
    pub o: OperandRef,
    pub mask: Option<OperandRef>,
}

impl FlashArgs {
    /// Parameters `q, k, v, o`, or `q, k, v, mask, o` with a mask, all at offset 0.
    pub fn dense(with_mask: bool) -> FlashArgs {
        let at = |param| OperandRef { param, offset_bytes: 0 };
        let m = usize::from(with_mask);
        FlashArgs { params: 4 + m, q: at(0), k: at(1), v: at(2), o: at(3 + m), mask: with_mask.then(|| at(3)) }
    }
}

/// Everything before this line of the source is the prelude and device helpers (the CPU
/// emulation test replaces them with its own); the kernel follows it.
pub const KERNEL_MARK: &str = "// ---- tl_flash kernel ----\n";



/// The kernel's name: dtype, head dim and parameters, then a hash of everything else.
pub fn kernel_name(p: &FlashProblem, q: &Params, a: &FlashArgs) -> String {
    let body = render_kernel(p, q, a, "tl_flash");
    format!(
        "tl_flash_{}_d{}_{}m{}n{}w{}s{}{}_{:012x}",
        short(p.dtype),
        p.head_dim,
        if p.causal.is_some() { "causal_" } else { "" },
        q.block_m,
        q.block_n,
        q.warps,
        q.stages,
        if q.wgmma { "_wg" } else { "" },
        fnv(&body) & 0xffff_ffff_ffff
    )
}

/// The whole source: prelude, device helpers, [`KERNEL_MARK`], the kernel.
pub fn render(p: &FlashProblem, q: &Params, a: &FlashArgs) -> String {
    let name = kernel_name(p, q, a);
    let mut s = String::from(PRELUDE);
    s.push_str("#define TL_L2_HINT \"\"\n");
    s.push_str(HELPERS);
    if !q.wgmma {
        s.push_str(&mma_fn(short(p.dtype)));
    }
    s.push_str(&helpers(p.dtype));
    if q.wgmma {
        s.push_str(crate::gemm::render::HELPERS);
        s.push_str(&sm90::helpers(p, q, short(p.dtype)));
    }
    s.push_str(KERNEL_MARK);
    s.push_str(&render_kernel(p, q, a, &name));
    s
}

/// The helpers of this kernel beyond the GEMM template's: `cp.async` groups, packing two
/// floats into a 16-bit pair (the lower column in the low half, as the fragments hold them)
/// and reading one 16-bit element as a float.
fn helpers(d: DType) -> String {
    let (cvt2, h2f) = match d {
        DType::BF16 => ("cvt.rn.bf16x2.f32", "return __uint_as_float(((unsigned)h) << 16);"),
        _ => ("cvt.rn.f16x2.f32", "float f;\n  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n  return f;"),
    };
    format!(
        r#"__device__ __forceinline__ void tl_fa_commit() {{ asm volatile("cp.async.commit_group;" ::: "memory"); }}
template <int N> __device__ __forceinline__ void tl_fa_wait() {{ asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }}
__device__ __forceinline__ unsigned tl_fa_pack(float lo, float hi) {{
  unsigned r;
  asm("{cvt2} %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}}
__device__ __forceinline__ float tl_fa_h2f(unsigned short h) {{
  {h2f}
}}
"#
    )
}

/// A C literal of an f32 value.
fn flit(x: f32) -> String {
    if x.is_finite() {
        format!("{x:?}f")
    } else {
        "0.0f".into()
    }
}

fn render_kernel(p: &FlashProblem, q: &Params, a: &FlashArgs, name: &str) -> String {
    let d = p.head_dim;
    let ptr = |o: &OperandRef| format!("((const char*)tl_p{} + {})", o.param, o.offset_bytes);
    let mut params: Vec<String> = (0..a.params).map(|i| format!("void* tl_p{i}")).collect();
    params.push("float* tl_lse".into());
    let causal = p.causal.is_some();
    let off = p.causal_offset();
    let (mask_decl, mask_code) = match (&p.mask, &a.mask) {
        (Some(m), Some(r)) => {
            let ty = if m.kind == MaskKind::Bool { "unsigned char" } else { "unsigned short" };
            let decl = format!(
                "  const {ty}* Mg = (const {ty}*){} + (long long)b * {} + (long long)h * {};\n",
                ptr(r),
                m.strides[0],
                m.strides[1]
            );
            let at = format!(
                "Mg[(long long)min(qi, {last}) * {si} + (long long)key * {sj}]",
                last = p.seq_q - 1,
                si = m.strides[2],
                sj = m.strides[3]
            );
            let code = match m.kind {
                MaskKind::Bool => format!("if (keep) keep = key < {len} && {at} != 0;", len = m.len),
                MaskKind::Additive => format!(
                    "if (keep) {{ keep = key < {len}; if (keep) x += tl_fa_h2f({at}) * 1.4426950408889634f; }}",
                    len = m.len
                ),
            };
            (decl, code)
        }
        _ => (String::new(), String::new()),
    };
    let reps = p.heads_q / p.heads_kv.max(1);
    let vars: Vec<(&str, String)> = vec![
        ("@NAME@", name.to_string()),
        ("@PARAMS@", params.join(", ")),
        ("@T@", q.threads().to_string()),
        ("@BM@", q.block_m.to_string()),
        ("@BN@", q.block_n.to_string()),
        ("@ST@", q.stages.to_string()),
        ("@D@", d.to_string()),
        ("@CPR@", (d / 8).to_string()),
        ("@DK@", (d / 16).to_string()),
        ("@DN@", (d / 8).to_string()),
        ("@NT@", (q.block_n / 8).to_string()),
        ("@NT2@", (q.block_n / 16).to_string()),
        ("@QITERS@", (q.block_m * d / 8 / q.threads()).to_string()),
        ("@KITERS@", (q.block_n * d / 8 / q.threads()).to_string()),
        ("@QSLICE@", (q.block_m * 128).to_string()),
        ("@KSLICE@", (q.block_n * 128).to_string()),
        ("@QBYTES@", q.q_bytes(d).to_string()),
        ("@KVBYTES@", (q.block_n * d * 2).to_string()),
        ("@STAGE@", q.stage_bytes(d).to_string()),
        ("@SQ@", p.seq_q.to_string()),
        ("@SK@", p.seq_k.to_string()),
        ("@HQ@", p.heads_q.to_string()),
        ("@REP@", reps.to_string()),
        ("@NKB@", p.seq_k.div_ceil(q.block_n).to_string()),
        ("@CAUSAL@", causal.to_string()),
        ("@OFF@", format!("({off})")),
        ("@HASMASK@", p.mask.is_some().to_string()),
        ("@ZN@", p.zero_nan_rows.to_string()),
        ("@SCALE2@", flit(p.scale * std::f32::consts::LOG2_E)),
        ("@QPTR@", ptr(&a.q)),
        ("@KPTR@", ptr(&a.k)),
        ("@VPTR@", ptr(&a.v)),
        ("@OPTR@", ptr(&a.o)),
        ("@QSB@", p.q.batch.to_string()),
        ("@QSH@", p.q.head.to_string()),
        ("@QSR@", p.q.row.to_string()),
        ("@KSB@", p.k.batch.to_string()),
        ("@KSH@", p.k.head.to_string()),
        ("@KSR@", p.k.row.to_string()),
        ("@VSB@", p.v.batch.to_string()),
        ("@VSH@", p.v.head.to_string()),
        ("@VSR@", p.v.row.to_string()),
        ("@OSB@", p.o.batch.to_string()),
        ("@OSH@", p.o.head.to_string()),
        ("@OSR@", p.o.row.to_string()),
        ("@MASKDECL@", mask_decl),
        ("@MASKCODE@", mask_code),
    ];
    let mut vars = vars;
    if q.wgmma {
        vars.extend(sm90::vars(p, q));
    }
    let mut s = if q.wgmma { sm90::KERNEL } else { KERNEL }.to_string();
    for (k, v) in &vars {
        s = s.replace(k, v);
    }
    debug_assert!(!s.contains('@'), "unreplaced placeholder in {s}");
    let mut out = String::new();
    let _ = write!(out, "{s}");
    out
}

const KERNEL: &str = r#"extern "C" __global__ void __launch_bounds__(@T@) @NAME@(@PARAMS@) {
  extern __shared__ __align__(128) unsigned char tl_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q8 = lane >> 3, r8 = lane & 7, g = lane >> 2, t4 = lane & 3;
  // Causal: the longest query blocks (most keys) first.
  const int mb = @CAUSAL@ ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / @REP@;
  const int m0 = mb * @BM@;
  const unsigned short* Qg = (const unsigned short*)@QPTR@ + (long long)b * @QSB@ + (long long)h * @QSH@;
  const unsigned short* Kg = (const unsigned short*)@KPTR@ + (long long)b * @KSB@ + (long long)hk * @KSH@;
  const unsigned short* Vg = (const unsigned short*)@VPTR@ + (long long)b * @VSB@ + (long long)hk * @VSH@;
  unsigned short* Og = (unsigned short*)@OPTR@ + (long long)b * @OSB@ + (long long)h * @OSH@;
@MASKDECL@  const unsigned sq = tl_mma_saddr(tl_smem);
  const unsigned skv = sq + @QBYTES@;
  // Key blocks this query block sees: all, or (causal) up to the one holding the diagonal
  // of its last row.
  int nkb = @NKB@;
  if (@CAUSAL@) {
    const int last = m0 + @BM@ - 1 + @OFF@;
    nkb = last < 0 ? 0 : min(nkb, last / @BN@ + 1);
  }
  // One K/V block into a ring slot: 16-byte chunks, zeros past the keys.
  auto load_kv = [&](int slot, int kb) {
    const unsigned sk = skv + slot * @STAGE@, sv = sk + @KVBYTES@;
#pragma unroll
    for (int it = 0; it < @KITERS@; ++it) {
      const int idx = tid + it * @T@;
      const int r = idx / @CPR@, c = idx % @CPR@;
      const int key = kb * @BN@ + r;
      const bool ok = key < @SK@;
      const unsigned at = (c >> 3) * @KSLICE@ + r * 128 + (((c & 7) ^ (r & 7)) << 4);
      tl_cp16(sk + at, ok ? (const void*)(Kg + (long long)key * @KSR@ + c * 8) : (const void*)Kg, ok ? 16u : 0u);
      tl_cp16(sv + at, ok ? (const void*)(Vg + (long long)key * @VSR@ + c * 8) : (const void*)Vg, ok ? 16u : 0u);
    }
  };
  // The Q tile (zeros past the queries), in the first group with the first K/V block.
#pragma unroll
  for (int it = 0; it < @QITERS@; ++it) {
    const int idx = tid + it * @T@;
    const int r = idx / @CPR@, c = idx % @CPR@;
    const bool ok = m0 + r < @SQ@;
    const unsigned at = (c >> 3) * @QSLICE@ + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    tl_cp16(sq + at, ok ? (const void*)(Qg + (long long)(m0 + r) * @QSR@ + c * 8) : (const void*)Qg, ok ? 16u : 0u);
  }
  if (0 < nkb) load_kv(0, 0);
  tl_fa_commit();
#pragma unroll
  for (int st = 1; st < @ST@ - 1; ++st) {
    if (st < nkb) load_kv(st, st);
    tl_fa_commit();
  }
  unsigned qf[@DK@][4];
  float o[@DN@][4];
#pragma unroll
  for (int i = 0; i < @DN@; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[i][e] = 0.f;
  // Running maximum (scaled by log2(e)) and this lane's partial sum of rows g and g + 8.
  float mrow[2] = {-TL_INF_F, -TL_INF_F}, lrow[2] = {0.f, 0.f};
  const int wrow = m0 + warp * 16;
  for (int kb = 0; kb < nkb; ++kb) {
    tl_fa_wait<@ST@ - 2>();
    __syncthreads();
    if (kb == 0) {
#pragma unroll
      for (int kk = 0; kk < @DK@; ++kk) {
        const int row = warp * 16 + (q8 & 1) * 8 + r8, ch = (kk & 3) * 2 + (q8 >> 1);
        tl_ldm4(sq + (kk >> 2) * @QSLICE@ + row * 128 + ((ch ^ (row & 7)) << 4), qf[kk]);
      }
    }
    // The slot read in the previous iteration is free: every warp is past the barrier.
    if (kb + @ST@ - 1 < nkb) load_kv((kb + @ST@ - 1) % @ST@, kb + @ST@ - 1);
    tl_fa_commit();
    // Causal: a block wholly above this warp's diagonal adds nothing.
    if (@CAUSAL@ && kb * @BN@ > wrow + 15 + @OFF@) continue;
    const unsigned sk = skv + (kb % @ST@) * @STAGE@, sv = sk + @KVBYTES@;
    // S = Q K^T (K-major B fragments: non-transposed ldmatrix of K's rows).
    float s[@NT@][4];
#pragma unroll
    for (int j = 0; j < @NT@; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < @DK@; ++kk) {
#pragma unroll
      for (int y = 0; y < @NT2@; ++y) {
        const int row = y * 16 + (q8 >> 1) * 8 + r8, ch = (kk & 3) * 2 + (q8 & 1);
        unsigned r4[4];
        tl_ldm4(sk + (kk >> 2) * @KSLICE@ + row * 128 + ((ch ^ (row & 7)) << 4), r4);
        const unsigned b0[2] = {r4[0], r4[1]}, b1[2] = {r4[2], r4[3]};
        tl_mma16816(s[2 * y], qf[kk], b0);
        tl_mma16816(s[2 * y + 1], qf[kk], b1);
      }
    }
    // Scale (log2(e) folded in), and mask where the block needs it: keys past the end, the
    // causal diagonal, the mask tensor.
    const bool edge = @HASMASK@ || (kb + 1) * @BN@ > @SK@ || (@CAUSAL@ && (kb + 1) * @BN@ - 1 > wrow + @OFF@);
#pragma unroll
    for (int j = 0; j < @NT@; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[j][e] * @SCALE2@;
        if (edge) {
          const int qi = wrow + g + 8 * (e >> 1);
          const int key = kb * @BN@ + j * 8 + 2 * t4 + (e & 1);
          bool keep = key < @SK@;
          if (@CAUSAL@) keep = keep && key <= qi + @OFF@;
          @MASKCODE@
          x = keep ? x : -TL_INF_F;
        }
        s[j][e] = x;
      }
    // Online softmax: new maxima (over the row's four lanes), rescale, exponentials.
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float mx = mrow[hr];
#pragma unroll
      for (int j = 0; j < @NT@; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * hr], s[j][2 * hr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with nothing visible yet keeps -inf; exponentials are taken against 0 then.
      const float mu = mx == -TL_INF_F ? 0.f : mx;
      const float alpha = exp2f(mrow[hr] - mu);
      mrow[hr] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < @NT@; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float pr = exp2f(s[j][2 * hr + c] - mu);
          s[j][2 * hr + c] = pr;
          sum += pr;
        }
      lrow[hr] = lrow[hr] * alpha + sum;
#pragma unroll
      for (int dn = 0; dn < @DN@; ++dn) {
        o[dn][2 * hr] *= alpha;
        o[dn][2 * hr + 1] *= alpha;
      }
    }
    // O += P V: P's accumulators packed in pairs are the A fragments; V through ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < @NT2@; ++kk) {
      unsigned pf[4];
      pf[0] = tl_fa_pack(s[2 * kk][0], s[2 * kk][1]);
      pf[1] = tl_fa_pack(s[2 * kk][2], s[2 * kk][3]);
      pf[2] = tl_fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[3] = tl_fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int y = 0; y < @DK@; ++y) {
        const int row = kk * 16 + (q8 & 1) * 8 + r8, ch = y * 2 + (q8 >> 1);
        unsigned r4[4];
        tl_ldm4t(sv + (ch >> 3) * @KSLICE@ + row * 128 + (((ch & 7) ^ (row & 7)) << 4), r4);
        const unsigned b0[2] = {r4[0], r4[1]}, b1[2] = {r4[2], r4[3]};
        tl_mma16816(o[2 * y], pf, b0);
        tl_mma16816(o[2 * y + 1], pf, b1);
      }
    }
  }
  tl_fa_wait<0>();
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
        const float x0 = zero ? 0.f : o[dn][2 * hr] * inv, x1 = zero ? 0.f : o[dn][2 * hr + 1] * inv;
        *(unsigned*)(orow + dn * 8 + 2 * t4) = tl_fa_pack(x0, x1);
      }
      if (tl_lse != 0 && t4 == 0)
        tl_lse[((long long)b * @HQ@ + h) * @SQ@ + qi] = zero ? -TL_INF_F : (mrow[hr] + log2f(l)) * 0.6931471805599453f;
    }
  }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flash::{Causal, Mask, Strides};

    #[test]
    fn the_source_holds_the_kernel_pieces() {
        let mut p = FlashProblem::new(2, 8, 2, 77, 131, 128, DType::BF16);
        let q = Params::default();
        let a = FlashArgs::dense(false);
        let src = render(&p, &q, &a);
        let name = kernel_name(&p, &q, &a);
        assert!(src.starts_with(PRELUDE));
        assert!(src.contains(&format!("void __launch_bounds__(256) {name}(void* tl_p0, void* tl_p1, void* tl_p2, void* tl_p3, float* tl_lse)")));
        assert!(src.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
        assert!(src.contains("cvt.rn.bf16x2.f32"));
        assert!(src.contains("tl_ldm4t(sv +") && src.contains("tl_ldm4(sk +") && src.contains("tl_ldm4(sq +"));
        assert!(src.contains("hk = h / 4"), "GQA: 8 query heads over 2 KV heads");
        assert!(src.contains("exp2f("));
        assert!(!src.contains('@'));
        let body = src.split(KERNEL_MARK).nth(1).unwrap();
        assert!(body.contains("extern __shared__ __align__(128) unsigned char tl_smem[];"));
        // Causal and masked problems differ; f16 uses f16 conversions.
        p.causal = Some(Causal::BottomRight);
        p.mask = Some(Mask { kind: MaskKind::Bool, strides: [0, 0, 131, 1], len: 131 });
        p.dtype = DType::F16;
        let src2 = render(&p, &q, &FlashArgs::dense(true));
        assert!(src2.contains("cvt.rn.f16x2.f32") && src2.contains("f16.f16.f32"));
        assert!(src2.contains("key <= qi + (54)"), "bottom-right offset 131 - 77");
        assert!(src2.contains("const unsigned char* Mg"));
        assert_ne!(kernel_name(&p, &q, &FlashArgs::dense(true)), name);
        assert!(kernel_name(&p, &q, &FlashArgs::dense(true)).contains("causal"));
        // Layout strides are compiled in.
        let bshd = FlashProblem { q: Strides::bshd(8, 77, 128), ..p.clone() };
        assert!(render(&bshd, &q, &FlashArgs::dense(true)).contains("(long long)(m0 + r) * 1024"));
    }
}
