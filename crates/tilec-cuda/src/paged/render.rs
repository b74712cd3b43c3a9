//! CUDA C++ source of the paged decode kernels (see the module documentation) for one problem
//! and parameter set. Every kernel takes the same arguments: the ten pointers of
//! `paged_attention` (`q, k, v, k_cache, v_cache, block_table, past_lens`, then `y` and the new
//! caches) and the f32 workspace.

use tilec_ir::DType;

use super::{chunks, row_groups, PagedProblem, Params};
use crate::render::{short16 as short, source_hash as fnv, PRELUDE};

/// Everything before this line of the source is the prelude and device helpers (the CPU
/// emulation test replaces them with its own); the kernels follow it.
pub const KERNEL_MARK: &str = "// ---- tl_paged kernels ----\n";

/// The kernels' common prefix: dtype, head dims, parameters, then a hash of everything else;
/// the functions are this name followed by `_copy`, `_append`, `_attn` and `_merge`.
pub fn kernel_name(p: &PagedProblem, q: &Params) -> String {
    let body = render_kernels(p, q, "tl_paged");
    format!(
        "tl_paged_{}_d{}_c{}w{}r{}u{}_{:012x}",
        short(p.dtype),
        p.head_dim,
        q.chunk,
        q.warps,
        q.rows,
        q.unroll,
        fnv(&body) & 0xffff_ffff_ffff
    )
}

/// The whole source: prelude, helpers, [`KERNEL_MARK`], the kernels.
pub fn render(p: &PagedProblem, q: &Params) -> String {
    let mut s = String::from(PRELUDE);
    s.push_str(&helpers(p.dtype));
    s.push_str(KERNEL_MARK);
    s.push_str(&render_kernels(p, q, &kernel_name(p, q)));
    s
}

/// A 16-byte read-only load, the eight 16-bit elements of a vector as floats, and a float
/// stored as one 16-bit element.
fn helpers(d: DType) -> String {
    let (lo, hi, f2h) = match d {
        DType::BF16 => (
            "__uint_as_float(w << 16)",
            "__uint_as_float(w & 0xffff0000u)",
            "unsigned short h;\n  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n  return h;",
        ),
        _ => (
            "tl_pg_f16(w & 0xffffu)",
            "tl_pg_f16(w >> 16)",
            "unsigned short h;\n  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n  return h;",
        ),
    };
    format!(
        r#"__device__ __forceinline__ float tl_pg_f16(unsigned w) {{
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)w));
  return f;
}}
__device__ __forceinline__ uint4 tl_pg_ld16(const void* p) {{ return __ldg((const uint4*)p); }}
__device__ __forceinline__ void tl_pg_unpack(uint4 v, float* f) {{
  const unsigned ws[4] = {{v.x, v.y, v.z, v.w}};
#pragma unroll
  for (int i = 0; i < 4; ++i) {{
    const unsigned w = ws[i];
    f[2 * i] = {lo};
    f[2 * i + 1] = {hi};
  }}
}}
__device__ __forceinline__ unsigned short tl_pg_f2h(float f) {{
  {f2h}
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

const KERNELS: &str = r#"
#define TL_PG_ARGS const void* tl_q, const void* tl_k, const void* tl_v, const void* tl_kc, const void* tl_vc, const int* tl_table, const int* tl_past, void* tl_y, void* tl_kco, void* tl_vco, float* tl_ws
// The old caches copied whole into the new ones (launched only when they are not the same
// storage).
extern "C" __global__ void __launch_bounds__(256) @NAME@_copy(TL_PG_ARGS) {
  const long long nk = @KVECS@LL, nv = @VVECS@LL;
  const long long stride = (long long)gridDim.x * 256;
  for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < nk || i < nv; i += stride) {
    if (i < nk) ((uint4*)tl_kco)[i] = ((const uint4*)tl_kc)[i];
    if (i < nv) ((uint4*)tl_vco)[i] = ((const uint4*)tl_vc)[i];
  }
}

// One chunk of one sequence's context for one KV head's query rows.
extern "C" __global__ void __launch_bounds__(@THREADS@) @NAME@_attn(TL_PG_ARGS) {
  __shared__ __align__(16) float s_buf[@BUF@];
  __shared__ int s_tbl[@CB@];
  __shared__ float s_max[@ROWS@], s_sum[@ROWS@];
  const int c = blockIdx.x, hk = blockIdx.y / @RG@, rg = blockIdx.y % @RG@, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r0 = rg * @ROWS@;
  const int nr = min(@G@ - r0, @ROWS@);
  float* ws_o = tl_ws;
  float* ws_ml = tl_ws + @PARTS@LL * @DV@;
  // Row i of this block: query head hk * REP + (r0 + i) / T, new token (r0 + i) % T.
#define TL_PG_PART(i) ((((long long)b * @HQ@ + hk * @REP@ + (r0 + (i)) / @T@) * @T@ + (r0 + (i)) % @T@) * @C@ + c)
  const int past = tl_past[b];
  const int p0 = c * @CH@;
  const bool bad_len = past < 0 || past > @CTX@ - @T@;
  const int n = bad_len ? 0 : min(past + @T@ - p0, @CH@);
  int bad = bad_len;
  for (int i = threadIdx.x; i * @BS@ < n; i += @THREADS@) {
    const int blk = tl_table[(long long)b * @M@ + p0 / @BS@ + i];
    bad |= blk < 0 || blk >= @NBLK@;
    s_tbl[i] = blk < 0 || blk >= @NBLK@ ? 0 : blk;
  }
  bad = __syncthreads_or(bad);
  if (bad || n <= 0) {
    if (@ONE@) {
      // One chunk a sequence: the rows are this block's to store, NaN for a bad table (or
      // a bad length, which leaves nothing to attend to).
      for (int x = threadIdx.x; x < nr * @DV@; x += @THREADS@)
        ((unsigned short*)tl_y)[TL_PG_PART(x / @DV@) * @DV@ + x % @DV@] = tl_pg_f2h(TL_NAN_F);
      return;
    }
    // Nothing to read: a chunk past the sequence's end weighs nothing; a bad table poisons.
    for (int i = threadIdx.x; i < nr; i += @THREADS@) {
      ws_ml[2 * TL_PG_PART(i)] = bad ? TL_NAN_F : -TL_INF_F;
      ws_ml[2 * TL_PG_PART(i) + 1] = 0.f;
    }
    return;
  }
  // Queries: lane l holds dims 8 (l % KL) .. +8 of every row, scaled by scale * log2(e).
  const int kl = lane % @KL@, kr = lane / @KL@;
  float qf[@ROWS@][8];
#pragma unroll
  for (int i = 0; i < @ROWS@; ++i) {
    const int r = min(r0 + i, @G@ - 1);
    const long long row = ((long long)b * @HQ@ + hk * @REP@ + r / @T@) * @T@ + r % @T@;
    tl_pg_unpack(tl_pg_ld16((const char*)tl_q + (row * @KL@ + kl) * 16), qf[i]);
#pragma unroll
    for (int e = 0; e < 8; ++e) qf[i][e] *= @SCALE2@;
  }
  // Scores: a warp reads KPW whole key rows per load, UNROLL loads in flight per lane.
  for (int j0 = warp * @KPW@ * @U@; j0 < n; j0 += @WARPS@ * @KPW@ * @U@) {
    uint4 kv[@U@];
#pragma unroll
    for (int u = 0; u < @U@; ++u) {
      const int j = j0 + u * @KPW@ + kr;
      if (j < n) {
        const long long slot = ((long long)s_tbl[j / @BS@] * @BS@ + j % @BS@) * @HKV@ + hk;
        if (p0 + j >= past) {
          // A new token: its key comes from the input; row group 0 appends it to the cache.
          const long long src = ((long long)b * @HKV@ + hk) * @T@ + (p0 + j - past);
          kv[u] = tl_pg_ld16((const char*)tl_k + (src * @KL@ + kl) * 16);
          if (rg == 0) ((uint4*)tl_kco)[slot * @KL@ + kl] = kv[u];
        } else {
          kv[u] = tl_pg_ld16((const char*)tl_kco + (slot * @KL@ + kl) * 16);
        }
      } else {
        kv[u] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < @U@; ++u) {
      const int j = j0 + u * @KPW@ + kr;
      float kf[8];
      tl_pg_unpack(kv[u], kf);
#pragma unroll
      for (int i = 0; i < @ROWS@; ++i) {
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s += qf[i][e] * kf[e];
#pragma unroll
        for (int o = @KL@ / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        // Causal within the new tokens: token t sees positions up to past + t.
        if (kl == 0 && j < n && i < nr) s_buf[i * @CH@ + j] = p0 + j <= past + (r0 + i) % @T@ ? s : -TL_INF_F;
      }
    }
  }
  __syncthreads();
  // Softmax per row, one warp per row: maximum, then exponentials in place and their sum.
  for (int i = warp; i < nr; i += @WARPS@) {
    float mx = -TL_INF_F;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s_buf[i * @CH@ + j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float mu = mx == -TL_INF_F ? 0.f : mx;
    float sum = 0.f;
    for (int j = lane; j < n; j += 32) {
      const float e = exp2f(s_buf[i * @CH@ + j] - mu);
      s_buf[i * @CH@ + j] = e;
      sum += e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      s_max[i] = mx;
      s_sum[i] = sum;
    }
  }
  __syncthreads();
  // Values: lane l accumulates dims 8 (l % VL) .. +8 of every row over its keys.
  const int vl = lane % @VL@, vr = lane / @VL@;
  float acc[@ROWS@][8];
#pragma unroll
  for (int i = 0; i < @ROWS@; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0.f;
  for (int j0 = warp * @VPW@ * @U@; j0 < n; j0 += @WARPS@ * @VPW@ * @U@) {
    uint4 vv[@U@];
#pragma unroll
    for (int u = 0; u < @U@; ++u) {
      const int j = j0 + u * @VPW@ + vr;
      if (j < n) {
        const long long slot = ((long long)s_tbl[j / @BS@] * @BS@ + j % @BS@) * @HKV@ + hk;
        if (p0 + j >= past) {
          const long long src = ((long long)b * @HKV@ + hk) * @T@ + (p0 + j - past);
          vv[u] = tl_pg_ld16((const char*)tl_v + (src * @VL@ + vl) * 16);
          if (rg == 0) ((uint4*)tl_vco)[slot * @VL@ + vl] = vv[u];
        } else {
          vv[u] = tl_pg_ld16((const char*)tl_vco + (slot * @VL@ + vl) * 16);
        }
      } else {
        vv[u] = make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < @U@; ++u) {
      const int j = j0 + u * @VPW@ + vr;
      if (j < n) {
        float vf[8];
        tl_pg_unpack(vv[u], vf);
#pragma unroll
        for (int i = 0; i < @ROWS@; ++i) {
          const float w = i < nr ? s_buf[i * @CH@ + j] : 0.f;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[i][e] += w * vf[e];
        }
      }
    }
  }
  // Lanes holding the same dims, then warps (through the score buffer, now free).
#pragma unroll
  for (int i = 0; i < @ROWS@; ++i)
#pragma unroll
    for (int e = 0; e < 8; ++e)
#pragma unroll
      for (int o = 16; o >= @VL@; o >>= 1) acc[i][e] += __shfl_xor_sync(0xffffffffu, acc[i][e], o);
  __syncthreads();
  if (vr == 0) {
#pragma unroll
    for (int i = 0; i < @ROWS@; ++i)
#pragma unroll
      for (int e = 0; e < 8; ++e) s_buf[(warp * @ROWS@ + i) * @DV@ + vl * 8 + e] = acc[i][e];
  }
  __syncthreads();
  for (int x = threadIdx.x; x < nr * @DV@; x += @THREADS@) {
    const int i = x / @DV@, d = x % @DV@;
    float o = 0.f;
    for (int w = 0; w < @WARPS@; ++w) o += s_buf[(w * @ROWS@ + i) * @DV@ + d];
    if (@ONE@)  // One chunk a sequence: nothing to merge, the row is final.
      ((unsigned short*)tl_y)[TL_PG_PART(i) * @DV@ + d] = tl_pg_f2h(s_max[i] == -TL_INF_F ? TL_NAN_F : o / s_sum[i]);
    else
      ws_o[TL_PG_PART(i) * @DV@ + d] = o;
  }
  for (int i = threadIdx.x; i < nr && !@ONE@; i += @THREADS@) {
    ws_ml[2 * TL_PG_PART(i)] = s_max[i];
    ws_ml[2 * TL_PG_PART(i) + 1] = s_sum[i];
  }
#undef TL_PG_PART
}

// One query row: its chunks merged through their log-sum-exps (base 2), stored in 16 bits.
extern "C" __global__ void __launch_bounds__(128) @NAME@_merge(TL_PG_ARGS) {
  const long long row = blockIdx.x;
  const float* ml = tl_ws + @PARTS@LL * @DV@ + row * @C@ * 2;
  const float* po = tl_ws + row * @C@ * @DV@;
  float m = -TL_INF_F;
  bool nan = false;
  for (int c = 0; c < @C@; ++c) {
    nan |= ml[2 * c] != ml[2 * c];
    m = fmaxf(m, ml[2 * c]);
  }
  float l = 0.f;
  for (int c = 0; c < @C@; ++c)
    if (ml[2 * c] != -TL_INF_F) l += ml[2 * c + 1] * exp2f(ml[2 * c] - m);
  unsigned short* y = (unsigned short*)tl_y + row * @DV@;
  for (int d = threadIdx.x; d < @DV@; d += 128) {
    float o = 0.f;
    for (int c = 0; c < @C@; ++c)
      if (ml[2 * c] != -TL_INF_F) o += po[(long long)c * @DV@ + d] * exp2f(ml[2 * c] - m);
    y[d] = tl_pg_f2h(nan || m == -TL_INF_F ? TL_NAN_F : o / l);
  }
}
"#;

fn render_kernels(p: &PagedProblem, q: &Params, name: &str) -> String {
    let (kl, vl) = (p.head_dim / 8, p.v_head_dim / 8);
    let c = chunks(p, q);
    let parts = p.batch * p.heads_q * p.new_tokens * c;
    let vars: Vec<(&str, String)> = vec![
        ("@NAME@", name.to_string()),
        ("@THREADS@", q.threads().to_string()),
        ("@WARPS@", q.warps.to_string()),
        ("@ROWS@", q.rows.to_string()),
        ("@U@", q.unroll.to_string()),
        ("@CH@", q.chunk.to_string()),
        ("@CB@", (q.chunk / p.block_size).to_string()),
        ("@BUF@", q.buf_floats(p).to_string()),
        ("@RG@", row_groups(p, q).to_string()),
        ("@G@", p.group().to_string()),
        ("@C@", c.to_string()),
        ("@PARTS@", parts.to_string()),
        ("@HQ@", p.heads_q.to_string()),
        ("@HKV@", p.heads_kv.to_string()),
        ("@REP@", p.rep().to_string()),
        ("@T@", p.new_tokens.to_string()),
        ("@DV@", p.v_head_dim.to_string()),
        ("@KL@", kl.to_string()),
        ("@VL@", vl.to_string()),
        ("@KPW@", (32 / kl).to_string()),
        ("@VPW@", (32 / vl).to_string()),
        ("@BS@", p.block_size.to_string()),
        ("@M@", p.max_blocks.to_string()),
        ("@CTX@", p.context().to_string()),
        ("@NBLK@", p.blocks.to_string()),
        ("@KVECS@", (p.k_cache_elems() / 8).to_string()),
        ("@VVECS@", (p.v_cache_elems() / 8).to_string()),
        ("@SCALE2@", flit(p.scale * std::f32::consts::LOG2_E)),
        ("@ONE@", if c == 1 { "true" } else { "false" }.to_string()),
    ];
    let mut s = KERNELS.to_string();
    for (k, v) in &vars {
        s = s.replace(k, v);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled_and_names_differ() {
        let p = PagedProblem {
            batch: 2,
            heads_q: 8,
            heads_kv: 2,
            new_tokens: 1,
            head_dim: 64,
            v_head_dim: 64,
            blocks: 16,
            block_size: 16,
            max_blocks: 8,
            dtype: DType::BF16,
            scale: 0.125,
        };
        let q = super::super::heuristic(&p, 132);
        let src = render(&p, &q);
        let body = src.split(KERNEL_MARK).nth(1).unwrap();
        assert!(!body.contains('@'), "unfilled placeholder in:\n{body}");
        let q2 = Params { chunk: q.chunk / 2, ..q };
        assert_ne!(kernel_name(&p, &q), kernel_name(&p, &q2));
        let p2 = PagedProblem { scale: 0.5, ..p.clone() };
        assert_ne!(kernel_name(&p, &q), kernel_name(&p2, &q));
    }
}
