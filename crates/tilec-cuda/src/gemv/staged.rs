//! The shared-memory main loop of the GEMV kernel (`Params::stages` >= 2).
//!
//! A stage is the block's `block_cols` weight rows and A's `m` rows over `stage_k` = 32 x
//! `unroll` x `warps_k` consecutive k's. Every thread of the block copies 16-byte pieces of it
//! with `cp.async.cg` (zero-filled past K, so a ragged last stage needs no guard), consecutive
//! threads on consecutive pieces of one row: a warp copies 512 contiguous bytes of a weight row
//! per instruction (the register loop's loads touch 64 bytes of each of 8 rows). The block
//! keeps `stages - 1` stages in flight; before consuming a stage it waits for its group and
//! synchronizes once, then refills the slot consumed the step before.
//!
//! From a stage, warp (`wn`, `wk`) takes chunks `wk * unroll ..` of it for its `8 * cols`
//! columns, with the register loop's fragment scheme: lane (g, t) reads 16 bytes of row g at k
//! `8t .. 8t+8` of the chunk, for A and B alike. A stage row's stride is its bytes plus 64, so
//! that the two rows a quarter warp reads fall in different halves of the banks.

use super::{Params, CHUNK};
use crate::gemm::Problem;

/// Elements of K in one stage.
pub fn stage_k(q: &Params) -> usize {
    CHUNK * q.unroll * q.warps_k
}

/// Bytes between rows of a stage in shared memory.
pub fn row_stride(q: &Params) -> usize {
    stage_k(q) * 2 + 64
}

/// Bytes of one stage: the block's weight rows, then A's rows.
pub fn slot_bytes(p: &Problem, q: &Params) -> usize {
    (q.block_cols() + p.m) * row_stride(q)
}

/// Stages covering K.
pub fn stages_of(p: &Problem, q: &Params) -> usize {
    p.k.div_ceil(stage_k(q))
}

/// Stages each split (block) takes.
pub fn stages_per_block(p: &Problem, q: &Params) -> usize {
    stages_of(p, q).div_ceil(q.split_k.max(1))
}

/// Copies of stage `s` into slot `slot` (C expressions): weight rows (clamped to N - 1: their
/// products land in columns never stored), then A's rows, 16 bytes a piece, zeros past K.
fn load_stage(p: &Problem, q: &Params, ldb: usize, s: &str, slot: &str, pad: &str) -> String {
    let pieces = stage_k(q) / 8;
    let t = q.threads();
    let mut out = format!("{pad}{{\n{pad}  const unsigned dst0 = tl_smem + ({slot}) * {};\n{pad}  const int kbase = ({s}) * {};\n", slot_bytes(p, q), stage_k(q));
    for (what, rows, row0, ptr, ld, clamp) in [
        ("B", q.block_cols(), 0, "B", ldb, Some(p.n)),
        ("A", p.m, q.block_cols(), "A", p.lda(), None),
    ] {
        let total = rows * pieces;
        let iters = total.div_ceil(t);
        let guard = if total % t != 0 { format!("if (i >= {total}) break; ") } else { String::new() };
        let row = match clamp {
            Some(n) => format!("min(n0 + r, {n} - 1)"),
            None => "r".to_string(),
        };
        out += &format!(
            r#"{pad}  // {what}: {rows} rows of {pieces} pieces.
{pad}#pragma unroll
{pad}  for (int j = 0; j < {iters}; ++j) {{
{pad}    const int i = tid + j * {t}; {guard}
{pad}    const int r = i / {pieces}, pc = i - r * {pieces};
{pad}    const int kk = kbase + pc * 8;
{pad}    const int bytes = kk < {k} ? min(16, 2 * ({k} - kk)) : 0;
{pad}    tl_gv_cp16(dst0 + ({row0} + r) * {rs} + pc * 16, {ptr} + (long long){row} * {ld} + (bytes ? kk : 0), bytes);
{pad}  }}
"#,
            k = p.k,
            rs = row_stride(q),
        );
    }
    out + &format!("{pad}}}\n")
}

/// The main loop's source (inside the kernel, after `A` and `B` are set). Leaves
/// `acc[cols][4]`, as the register loop does.
pub fn mainloop(p: &Problem, q: &Params, ldb: usize) -> String {
    let ks = stage_k(q);
    let rs = row_stride(q);
    let nb = q.block_cols();
    let slot = slot_bytes(p, q);
    let st = q.stages;
    let spb = stages_per_block(p, q);
    let (m, cols, u) = (p.m, q.cols, q.unroll);
    let ns = stages_of(p, q);
    let a_rows = if m > 8 {
        format!(
            "      const uint4 x1 = *(const uint4*)(sa + min(g + 8, {m} - 1) * {rs} + cb);\n      const unsigned f0[4] = {{x0.x, x1.x, x0.y, x1.y}};\n      const unsigned f1[4] = {{x0.z, x1.z, x0.w, x1.w}};\n"
        )
    } else {
        "      const unsigned f0[4] = {x0.x, 0u, x0.y, 0u};\n      const unsigned f1[4] = {x0.z, 0u, x0.w, 0u};\n".to_string()
    };
    format!(
        r#"  // Stages [s_lo, s_hi) of {ks} K each, in {st} slots of {slot} bytes.
  const int s_lo = split * {spb};
  const int s_hi = min({ns}, s_lo + {spb});
  const unsigned tl_smem = (unsigned)__cvta_generic_to_shared(tl_red);
  const char* tl_sm = (const char*)tl_red;
  float acc[{cols}][4];
#pragma unroll
  for (int j = 0; j < {cols}; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
  for (int i = 0; i < {stm1}; ++i) {{
    if (s_lo + i < s_hi)
{load_pro}    tl_gv_commit();
  }}
  for (int s = s_lo; s < s_hi; ++s) {{
    const int it = s - s_lo;
    tl_gv_wait_{stm2}();
    __syncthreads();
    // Refill the slot consumed in the previous step (every warp is past it).
    if (s + {stm1} < s_hi)
{load_loop}    tl_gv_commit();
    const char* base = tl_sm + (it % {st}) * {slot};
    const char* sa = base + {nb} * {rs};
#pragma unroll
    for (int u = 0; u < {u}; ++u) {{
      const int cb = (wk * {u} + u) * {chunk_bytes} + t * 16;
      const uint4 x0 = *(const uint4*)(sa + min(g, {m} - 1) * {rs} + cb);
{a_rows}#pragma unroll
      for (int j = 0; j < {cols}; ++j) {{
        const uint4 w = *(const uint4*)(base + (wn * {cw} + j * 8 + g) * {rs} + cb);
        const unsigned b0[2] = {{w.x, w.y}};
        const unsigned b1[2] = {{w.z, w.w}};
        tl_gv_mma(acc[j], f0, b0);
        tl_gv_mma(acc[j], f1, b1);
      }}
    }}
  }}
  tl_gv_wait_0();
  __syncthreads();
"#,
        stm1 = st - 1,
        stm2 = st - 2,
        load_pro = load_stage(p, q, ldb, "s_lo + i", "i", "    "),
        load_loop = load_stage(p, q, ldb, &format!("s + {}", st - 1), &format!("(it + {}) % {st}", st - 1), "    "),
        cw = 8 * cols,
        chunk_bytes = CHUNK * 2,
    )
}

/// Device helpers of the staged loop (in every GEMV source; unused by the register loop).
pub const HELPERS: &str = r#"
__device__ __forceinline__ void tl_gv_cp16(unsigned dst, const unsigned short* src, int bytes) {
  asm volatile("cp.async.cg.shared.global" TL_GV_L2 " [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tl_gv_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
#define TL_GV_WAIT(n) __device__ __forceinline__ void tl_gv_wait_##n() { asm volatile("cp.async.wait_group " #n ";" ::: "memory"); }
TL_GV_WAIT(0) TL_GV_WAIT(1) TL_GV_WAIT(2) TL_GV_WAIT(3) TL_GV_WAIT(4) TL_GV_WAIT(5) TL_GV_WAIT(6)
"#;
