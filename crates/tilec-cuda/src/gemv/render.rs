//! CUDA C++ source of the GEMV kernel for one problem and parameter set (see the module's
//! documentation for the scheme).
//!
//! Fragment slots: in `mma.sync.m16n8k16` lane `l` (group `g = l / 4`, thread `t = l % 4`)
//! holds A at rows `g`, `g + 8` and B at column `g`, both at k slots `2t, 2t+1` (registers
//! a0/a1, b0) and `2t+8, 2t+9` (a2/a3, b1); C at rows `g`, `g + 8`, columns `2t, 2t+1`. The
//! lane loads k `8t .. 8t+8` of its chunk as one 16-byte vector `x` (A) or `w` (B), whose
//! 32-bit words hold k pairs `8t + {0,1}`, `{2,3}`, `{4,5}`, `{6,7}`; the first mma takes words
//! `.x, .y`, the second `.z, .w`. Every k of the chunk meets the same slot in A and in B, so
//! the two mmas add exactly the chunk's 32 products per output.

use std::fmt::Write;


use super::{chunks, chunks_per_block, packed_ld, red_stride, repacked, tiles, Params, CHUNK};
use crate::families::OperandRef;
use crate::gemm::Problem;
use crate::render::{PRELUDE, source_hash as fnv, short16 as short, param_name};




/// The kernel's name: its class and parameters, then a hash of everything the source depends
/// on (shapes are compiled in).
pub fn kernel_name(p: &Problem, q: &Params, a: &OperandRef, b: &OperandRef) -> String {
    let body = render_body(p, q, a, b, "tl_gemv");
    format!(
        "tl_gemv_{}_{}_w{}x{}_c{}_u{}_s{}{}{}_{:012x}",
        short(p.in_dtype),
        if q.tiled { "rt" } else if repacked(p, q) { "rr" } else { "rc" },
        q.warps_n,
        q.warps_k,
        q.cols,
        q.unroll,
        q.split_k,
        if q.stages >= 2 { format!("_st{}", q.stages) } else { String::new() },
        if q.early > 0 { format!("_e{}", q.early) } else { String::new() },
        fnv(&body) & 0xffff_ffff_ffff
    )
}

/// The whole source: prelude, the epilogue function, the kernel and, for a row-major B, the
/// repacking kernel `<name>_repack`.
pub fn render(p: &Problem, q: &Params, a: &OperandRef, b: &OperandRef) -> String {
    let name = kernel_name(p, q, a, b);
    let mut s = String::from(PRELUDE);
    if let Some(c) = &p.custom {
        s.push_str(&c.source);
    }
    s.push_str(&render_body(p, q, a, b, &name));
    s
}

const HELPERS: &str = r#"
// 16 bytes of weights, read once: not kept in L1.
__device__ __forceinline__ uint4 tl_gv_ldb(const unsigned short* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate" TL_GV_L2 ".v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// 16 bytes of A, which the block's other warps read too: kept in L1.
__device__ __forceinline__ uint4 tl_gv_lda(const unsigned short* p) {
  uint4 v;
  asm("ld.global.nc.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// 8 elements from p, those at index n and past it zero (a ragged K's last chunk).
__device__ __forceinline__ uint4 tl_gv_ld8(const unsigned short* p, int n) {
  unsigned e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = i < n ? (unsigned)p[i] : 0u;
  uint4 v;
  v.x = e[0] | (e[1] << 16); v.y = e[2] | (e[3] << 16);
  v.z = e[4] | (e[5] << 16); v.w = e[6] | (e[7] << 16);
  return v;
}
"#;

fn mma_fn(dt: &str) -> String {
    format!(
        r#"__device__ __forceinline__ void tl_gv_mma(float* d, const unsigned* a, const unsigned* b) {{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{dt}.{dt}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}
"#
    )
}

/// Elements between a lane's weights of consecutive chunks: a row's 32, or a tile's 256.
fn b_chunk_stride(q: &Params) -> usize {
    if q.tiled {
        8 * CHUNK
    } else {
        CHUNK
    }
}

/// Which of a step's loads [`load_step`] issues.
#[derive(Copy, Clone, PartialEq)]
enum Loads {
    /// Weights, and A's rows with `a_ahead`.
    All,
    /// Weights only (before the wait for the previous kernel, [`Params::early`]).
    Weights,
    /// A's rows only (after that wait).
    A,
}

/// The loads of one step's weights into `buf` (`[unroll][cols]` vectors) from chunk `c0` on,
/// and with `a_ahead` A's rows into `abuf` (`[unroll][1 or 2]`); `what` picks the part.
fn load_step(p: &Problem, q: &Params, buf: &str, abuf: &str, c0: &str, pad: &str, what: Loads) -> String {
    let mut s = format!("{pad}#pragma unroll\n{pad}for (int u = 0; u < {u}; ++u) {{\n", u = q.unroll);
    if what != Loads::A {
        let _ = writeln!(s, "{pad}#pragma unroll\n{pad}  for (int j = 0; j < {g}; ++j) {buf}[u][j] = tl_gv_ldb(bc[j] + ({c0} + u) * {bs});", bs = b_chunk_stride(q), g = q.cols);
    }
    if q.a_ahead && what != Loads::Weights {
        let _ = writeln!(s, "{pad}  {abuf}[u][0] = tl_gv_lda(a0 + ({c0} + u) * {CHUNK});");
        if p.m > 8 {
            let _ = writeln!(s, "{pad}  {abuf}[u][1] = tl_gv_lda(a1 + ({c0} + u) * {CHUNK});");
        }
    }
    s + &format!("{pad}}}\n")
}

/// The start of the register loop's pipeline: the first step's loads (`load0`), and with
/// [`Params::early`] its weights and the L2 requests of the next `early - 1` steps before the
/// wait for the previous kernel, A after it.
fn first_step(p: &Problem, q: &Params) -> String {
    let load = |what| load_step(p, q, "cur", "acur", "c_lo", "    ", what);
    if q.early == 0 {
        return format!("  if (steps > 0) {{\n{}  }}\n", load(Loads::All));
    }
    // One request per 128-byte line: a tiled group's chunk is 512 contiguous bytes over the
    // warp's lanes (lanes 0, 8, 16, 24 start lines); a repacked row's 64 bytes start at t = 0.
    let (who, stride) = if q.tiled { ("(lane & 7) == 0", 8 * CHUNK) } else { ("t == 0", CHUNK) };
    let mut s = format!("  if (steps > 0) {{\n{}  }}\n", load(Loads::Weights));
    if q.early > 1 {
        let _ = write!(
            s,
            "  // Steps 1 to {e1} of this warp's weights requested into the L2.\n  if ({who}) {{\n    const int c_end = c_lo + min(steps, {early}) * {u};\n    for (int c = c_lo + {u}; c < c_end; ++c)\n#pragma unroll\n      for (int j = 0; j < {g}; ++j) asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"(bc[j] + c * {stride}));\n  }}\n",
            e1 = q.early - 1,
            early = q.early,
            u = q.unroll,
            g = q.cols,
        );
    }
    s.push_str("  // What earlier kernels wrote is read from here on.\n  tl_pdl_enter();\n");
    if q.a_ahead {
        let _ = write!(s, "  if (steps > 0) {{\n{}  }}\n", load(Loads::A));
    }
    s
}

/// The multiplies of chunk `c` with weights `w` (`cols` vectors) and A's rows: loaded there,
/// or from `ahead` (the step's A buffer at this chunk, `[1 or 2]`); `guarded`: the chunk may be
/// the ragged last one (loads stop at K).
fn chunk_mma(p: &Problem, q: &Params, w: &str, ahead: Option<&str>, c: &str, guarded: bool, pad: &str) -> String {
    let ld = |row: &str| {
        if let Some(a) = ahead {
            format!("{a}[{}]", if row == "a0" { 0 } else { 1 })
        } else if guarded {
            format!(
                "({c}) < {nfull} ? tl_gv_lda({row} + ({c}) * {CHUNK}) : tl_gv_ld8({row} + ({c}) * {CHUNK}, {k} - ({c}) * {CHUNK} - t * 8)",
                nfull = p.k / CHUNK,
                k = p.k
            )
        } else {
            format!("tl_gv_lda({row} + ({c}) * {CHUNK})")
        }
    };
    let mut s = format!("{pad}{{\n{pad}  const uint4 x0 = {};\n", ld("a0"));
    if p.m > 8 {
        let _ = write!(
            s,
            "{pad}  const uint4 x1 = {};\n{pad}  const unsigned f0[4] = {{x0.x, x1.x, x0.y, x1.y}};\n{pad}  const unsigned f1[4] = {{x0.z, x1.z, x0.w, x1.w}};\n",
            ld("a1")
        );
    } else {
        // Rows 8..15 of the fragment are past M: zeros.
        let _ = write!(
            s,
            "{pad}  const unsigned f0[4] = {{x0.x, 0u, x0.y, 0u}};\n{pad}  const unsigned f1[4] = {{x0.z, 0u, x0.w, 0u}};\n"
        );
    }
    let _ = write!(
        s,
        r#"{pad}#pragma unroll
{pad}  for (int j = 0; j < {g}; ++j) {{
{pad}    const unsigned b0[2] = {{{w}[j].x, {w}[j].y}};
{pad}    const unsigned b1[2] = {{{w}[j].z, {w}[j].w}};
{pad}    tl_gv_mma(acc[j], f0, b0);
{pad}    tl_gv_mma(acc[j], f1, b1);
{pad}  }}
{pad}}}
"#,
        g = q.cols
    );
    s
}

/// The module's `<name>_repack` kernel: one thread per element `i` of the repacked B (`total`
/// of them), `body` computing `out[i]` from the weights `w`.
fn repack_kernel(name: &str, comment: &str, total: usize, body: &str) -> String {
    format!(
        "\n// {comment}\nextern \"C\" __global__ void {name}_repack(const unsigned short* __restrict__ w, unsigned short* __restrict__ out) {{\n  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n  if (i >= {total}LL) return;\n{body}}}\n"
    )
}

/// The register-pipelined main loop (`stages` 0): each lane loads its weights straight into
/// registers, one step of `unroll` chunks ahead of the multiplies. Leaves `acc[cols][4]`.
fn register_mainloop(p: &Problem, q: &Params, ldb: usize) -> String {
    let (cpb, cpw) = chunks_per_block(p, q);
    let u = q.unroll;
    format!(
        r#"  // This warp's chunks of {CHUNK} K: [c_lo, c_hi) (empty past the end of K).
  const int c_lo = split * {cpb} + wk * {cpw};
  const int c_hi = min(min({nch}, split * {cpb} + {cpb}), c_lo + {cpw});
  // Rows of A past M read row M - 1, columns of B past N column N - 1: valid memory whose
  // products land in rows and columns of C that are never stored.
  const unsigned short* a0 = A + (long long)min(g, {m} - 1) * {lda} + t * 8;
  const unsigned short* a1 = A + (long long)min(g + 8, {m} - 1) * {lda} + t * 8;
  (void)a1;
  const unsigned short* bc[{cols}];
#pragma unroll
  for (int j = 0; j < {cols}; ++j) {bc_init}
  float acc[{cols}][4];
#pragma unroll
  for (int j = 0; j < {cols}; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  // Whole chunks in steps of {u}: the loads of step s + 1 go out before the multiplies of
  // step s (two buffers, their roles alternating).
  const int nfull = max(0, min(c_hi, {nfull}) - c_lo);
  const int steps = nfull / {u};
  uint4 cur[{u}][{cols}], nxt[{u}][{cols}];
{a_bufs}{first}  for (int s = 0; s < steps; s += 2) {{
    const int kc = c_lo + s * {u};
    if (s + 1 < steps) {{
{load1}    }}
#pragma unroll
    for (int u = 0; u < {u}; ++u)
{mma_cur}    if (s + 1 >= steps) break;
    if (s + 2 < steps) {{
{load2}    }}
#pragma unroll
    for (int u = 0; u < {u}; ++u)
{mma_nxt}  }}
  // The rest: fewer than {u} whole chunks, then a ragged last chunk (zeros past K).
  for (int kc = c_lo + steps * {u}; kc < c_hi; ++kc) {{
    const bool whole = kc < {nfull};
    uint4 w[{cols}];
#pragma unroll
    for (int j = 0; j < {cols}; ++j)
      w[j] = {tail_load};
{mma_tail}  }}
"#,
        m = p.m,
        nch = chunks(p),
        nfull = p.k / CHUNK,
        lda = p.lda(),
        cols = q.cols,
        first = first_step(p, q),
        load1 = load_step(p, q, "nxt", "anxt", &format!("kc + {u}"), "      ", Loads::All),
        load2 = load_step(p, q, "cur", "acur", &format!("kc + {}", 2 * u), "      ", Loads::All),
        mma_cur = chunk_mma(p, q, "cur[u]", q.a_ahead.then_some("acur[u]"), "kc + u", false, "    "),
        mma_nxt = chunk_mma(p, q, "nxt[u]", q.a_ahead.then_some("anxt[u]"), &format!("kc + {u} + u"), false, "    "),
        mma_tail = chunk_mma(p, q, "w", None, "kc", true, "    "),
        a_bufs = if q.a_ahead { format!("  uint4 acur[{u}][{r}], anxt[{u}][{r}];\n", r = if p.m > 8 { 2 } else { 1 }) } else { String::new() },
        bc_init = if q.tiled {
            // Tiles past N read the last one (valid memory; their columns are never stored).
            format!("bc[j] = B + (long long)min((n0 + wn * {cw} + j * 8) / 8, {last}) * {tile} + lane * 8;", cw = 8 * q.cols, last = p.n.div_ceil(8) - 1, tile = chunks(p) * 8 * CHUNK)
        } else {
            format!("bc[j] = B + (long long)min(n0 + wn * {cw} + j * 8 + g, {n} - 1) * {ldb} + t * 8;", cw = 8 * q.cols, n = p.n)
        },
        tail_load = if q.tiled {
            // Tiles are zero past K: no guard.
            format!("tl_gv_ldb(bc[j] + kc * {})", 8 * CHUNK)
        } else {
            format!("whole ? tl_gv_ldb(bc[j] + kc * {CHUNK}) : tl_gv_ld8(bc[j] + kc * {CHUNK}, {k} - kc * {CHUNK} - t * 8)", k = p.k)
        },
    )
}

fn render_body(p: &Problem, q: &Params, a: &OperandRef, b: &OperandRef, name: &str) -> String {
    let c = p.custom.as_ref();
    let decls: Vec<String> = c.map(|c| c.params.clone()).unwrap_or_default();
    let names: Vec<&str> = decls.iter().map(|d| param_name(d)).collect();
    let pname = |o: &OperandRef| names.get(o.param).copied().unwrap_or("tl_missing");
    let args: String = names.iter().map(|n| format!("{n}, ")).collect();
    let epi = c.map(|c| c.name.clone()).unwrap_or_else(|| "tl_missing".into());
    // Flattened rows split back into (batch, row).
    let split_row = match c.and_then(|c| c.rows) {
        Some(r) => format!("const int eb = r / {r}, er = r - eb * {r};"),
        None => "const int eb = bz, er = r;".to_string(),
    };
    let (m, n, k) = (p.m, p.n, p.k);
    let (nb, out, t) = (q.block_cols(), p.m * q.block_cols(), q.threads());
    let hint = match q.prefetch {
        64 => ".L2::64B",
        128 => ".L2::128B",
        256 => ".L2::256B",
        _ => "",
    };
    let mut s = format!("#define TL_GV_L2 \"{hint}\"\n");
    s.push_str(HELPERS);
    if q.stages >= 2 {
        s.push_str(super::staged::HELPERS);
    }
    s.push_str(&mma_fn(short(p.in_dtype)));
    let mut params = decls.clone();
    params.extend(["const unsigned short* __restrict__ tl_bpk", "float* __restrict__ tl_ws", "int* __restrict__ tl_cnt"].map(String::from));
    let (b_src, ldb, sb) = if repacked(p, q) {
        ("tl_bpk".to_string(), packed_ld(p), 0)
    } else {
        (
            format!("(const unsigned short*)((const char*){} + {})", pname(b), b.offset_bytes),
            p.ldb(),
            if p.batch > 1 { p.batch_stride_b } else { 0 },
        )
    };
    let sa = if p.batch > 1 { p.batch_stride_a } else { 0 };
    let minb = if q.min_blocks > 0 { format!(", {}", q.min_blocks) } else { String::new() };
    let _ = write!(
        s,
        r#"
extern "C" __global__ void __launch_bounds__({t}{minb}) {name}({params}) {{{own}
  extern __shared__ __align__(16) float tl_red[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp % {wn}, wk = warp / {wn};
  const int g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x, split = blockIdx.y, bz = blockIdx.z;
  const int n0 = tile * {nb};
  const unsigned short* A = (const unsigned short*)((const char*){a_name} + {a_off}) + (long long)bz * {sa};
  const unsigned short* B = {b_src} + (long long)bz * {sb};
{mainloop}  // The sums to shared memory, rows below M: row r, block column cl at
  // tl_red[(wk * M + r) * {nbp} + cl].
#pragma unroll
  for (int j = 0; j < {cols}; ++j) {{
    const int cl = wn * {cw} + j * 8 + 2 * t;
    if (g < {m}) {{
      float2 v; v.x = acc[j][0]; v.y = acc[j][1];
      *(float2*)(tl_red + (wk * {m} + g) * {nbp} + cl) = v;
    }}
    if (g + 8 < {m}) {{
      float2 v; v.x = acc[j][2]; v.y = acc[j][3];
      *(float2*)(tl_red + (wk * {m} + g + 8) * {nbp} + cl) = v;
    }}
  }}
  __syncthreads();
"#,
        params = params.join(",\n    "),
        own = if q.early > 0 { format!("\n  {}", crate::pdl::OWN) } else { String::new() },
        wn = q.warps_n,
        a_name = pname(a),
        a_off = a.offset_bytes,
        cols = q.cols,
        cw = 8 * q.cols,
        nbp = red_stride(q),
        mainloop = if q.stages >= 2 { super::staged::mainloop(p, q, ldb) } else { register_mainloop(p, q, ldb) },
    );
    // Each thread sums outputs over the K warps (in warp order), consecutive threads on
    // consecutive columns of a row.
    let sum_warps = format!(
        "    const int r = v / {nb}, cl = v - r * {nb};\n    float sum = 0.f;\n#pragma unroll\n    for (int w = 0; w < {wk}; ++w) sum += tl_red[(w * {m} + r) * {nbp} + cl];\n",
        wk = q.warps_k,
        nbp = red_stride(q),
    );
    let store = format!("    const int col = n0 + cl;\n    if (col < {n}) {{\n      {split_row}\n      {epi}({args}eb, er, col, sum);\n    }}\n");
    if q.split_k <= 1 {
        let _ = write!(s, "  for (int v = tid; v < {out}; v += {t}) {{\n{sum_warps}{store}  }}\n}}\n");
    } else {
        let sp = q.split_k;
        let _ = write!(
            s,
            r#"  // Split K: park the block's sums; the last block of the tile to arrive adds every
  // split's, in split order (the same sum whichever block is last), and stores them.
  const long long tl_tile = (long long)bz * {nt} + tile;
  float* tl_mine = tl_ws + (tl_tile * {sp} + split) * {out};
  for (int v = tid; v < {out}; v += {t}) {{
{sum_warps}    __stcg(tl_mine + v, sum);
  }}
  __threadfence();
  __syncthreads();
  __shared__ int tl_last;
  if (tid == 0) tl_last = atomicAdd(tl_cnt + tl_tile, 1) == {sp} - 1;
  __syncthreads();
  if (!tl_last) return;
  __threadfence();
  const float* tl_all = tl_ws + tl_tile * {sp} * {out};
  for (int v = tid; v < {out}; v += {t}) {{
    const int r = v / {nb}, cl = v - r * {nb};
    float sum = 0.f;
    for (int x = 0; x < {sp}; ++x) sum += __ldcg(tl_all + (long long)x * {out} + v);
{store}  }}
  if (tid == 0) tl_cnt[tl_tile] = 0;
}}
"#,
            nt = tiles(p, q),
        );
    }
    if q.tiled {
        let src = if p.b_layout == crate::gemm::Layout::RowMajor { format!("(long long)kk * {} + n", p.ldb()) } else { format!("(long long)n * {} + kk", p.ldb()) };
        let tile = chunks(p) * 8 * CHUNK;
        s.push_str(&repack_kernel(
            &name,
            &format!("B to fragment tiles: element e of lane (g, t)'s 16 bytes of chunk c of column group ng at\n// ((ng * {nch} + c) * 32 + g * 4 + t) * 8 + e, holding B[n = ng * 8 + g][k = c * 32 + t * 8 + e]\n// (zero past N and K).", nch = chunks(p)),
            super::packed_len(p, q),
            &format!(
                "  const long long ng = i / {tile};\n  const int rem = (int)(i - ng * {tile});\n  const int c = rem >> 8, ln = (rem >> 3) & 31, e = rem & 7;\n  const long long n = ng * 8 + (ln >> 2);\n  const int kk = c * 32 + (ln & 3) * 8 + e;\n  out[i] = (n < {n} && kk < {k}) ? w[{src}] : (unsigned short)0;\n"
            ),
        ));
    } else if repacked(p, q) {
        let kp = packed_ld(p);
        s.push_str(&repack_kernel(
            &name,
            &format!("B [K][N] (row stride {}) to K-contiguous rows [N][{kp}], zeros past K.", p.ldb()),
            n * kp,
            &format!("  const long long col = i / {kp};\n  const int kk = (int)(i - col * {kp});\n  out[i] = kk < {k} ? w[(long long)kk * {} + col] : (unsigned short)0;\n", p.ldb()),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilec_ir::DType;
    use crate::gemm::{CustomEpilogue, Layout};

    pub(crate) fn problem(m: usize, n: usize, k: usize, b: Layout) -> Problem {
        let mut g = Problem::new(m, n, k, DType::BF16).with_layouts(Layout::RowMajor, b);
        g.custom = Some(CustomEpilogue {
            loads: false,
            name: "tl_epi".into(),
            source: String::new(),
            params: vec!["const tl_bf16* __restrict__ a".into(), "const tl_bf16* __restrict__ b".into(), "float* __restrict__ c".into()],
            rows: None,
            rounds_to: None,
            vector: None,
        });
        g
    }

    const RA: OperandRef = OperandRef { param: 0, offset_bytes: 0 };
    const RB: OperandRef = OperandRef { param: 1, offset_bytes: 0 };

    #[test]
    fn the_source_names_every_part() {
        let q = Params::default();
        let p = problem(16, 8192, 8192, Layout::ColMajor);
        let src = render(&p, &q, &RA, &RB);
        let name = kernel_name(&p, &q, &RA, &RB);
        assert!(src.contains(&format!("void __launch_bounds__(256) {name}(")), "{src}");
        assert!(src.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
        assert!(src.contains("ld.global.nc.L1::no_allocate\" TL_GV_L2 \".v4.u32"));
        assert!(src.contains("tl_epi(a, b, c, eb, er, col, sum);"), "{src}");
        // 16 rows: the second row of fragments is loaded; B read from its parameter.
        assert!(src.contains("const uint4 x1 = tl_gv_lda(a1 + (kc + u) * 32);"), "{src}");
        assert!(src.contains("B = (const unsigned short*)((const char*)b + 0)"), "{src}");
        assert!(!src.contains("_repack("));
        assert!(!src.contains("atomicAdd"));
        // A ragged K guards the last chunk; 8 rows or fewer skip the upper fragment rows.
        let small = problem(5, 203, 1000, Layout::RowMajor);
        let src = render(&small, &Params { split_k: 3, prefetch: 256, ..q }, &RA, &RB);
        assert!(src.contains("tl_gv_ld8(a0 + (kc) * 32, 1000 - (kc) * 32 - t * 8)"), "{src}");
        assert!(src.contains("const unsigned f0[4] = {x0.x, 0u, x0.y, 0u};"));
        assert!(src.contains("_repack(") && src.contains("B = tl_bpk"), "{src}");
        assert!(src.contains("atomicAdd(tl_cnt + tl_tile, 1) == 3 - 1"));
        assert!(src.contains("#define TL_GV_L2 \".L2::256B\""));
        // Names differ by everything the source depends on.
        let moved = OperandRef { param: 0, offset_bytes: 32 };
        assert_ne!(name, kernel_name(&p, &q, &moved, &RB));
        assert_ne!(name, kernel_name(&p, &Params { unroll: 4, ..q }, &RA, &RB));
        assert!(name.starts_with("tl_gemv_bf16_rc_w4x2_c2_u2_s1_"), "{name}");
    }

    #[test]
    fn early_weights_come_before_the_wait() {
        let p = problem(5, 2560, 2048, Layout::ColMajor);
        let q = Params { warps_n: 2, warps_k: 4, cols: 1, unroll: 4, tiled: true, a_ahead: true, early: 3, ..Params::default() };
        let src = render(&p, &q, &RA, &RB);
        let body = &src[src.find("extern \"C\" __global__").unwrap()..];
        let at = |x: &str| body.find(x).unwrap_or_else(|| panic!("{x} missing:\n{body}"));
        // The kernel waits itself (the compiler adds no wait at its top), after the first
        // step's weights and the L2 requests of steps 1 and 2, before any A load.
        assert!(body.contains(crate::pdl::OWN));
        assert_eq!(body.matches("tl_pdl_enter();").count(), 1);
        let wait = at("tl_pdl_enter();");
        assert!(at("cur[u][j] = tl_gv_ldb(bc[j] + (c_lo + u) * 256);") < wait);
        assert!(at("prefetch.global.L2") < wait);
        assert!(body.contains("min(steps, 3) * 4"), "{body}");
        assert!(at("acur[u][0] = tl_gv_lda(") > wait);
        assert!(body.find("tl_gv_lda(").unwrap() > wait);
        // The compiler adds its wait to the repacking kernel only.
        let injected = crate::pdl::inject(&src);
        let main = &injected[injected.find(crate::pdl::OWN).unwrap()..injected.find("_repack(").unwrap()];
        assert_eq!(main.matches("tl_pdl_enter();").count(), 1);
        assert_eq!(injected.matches("tl_pdl_enter();").count(), 2);
        assert!(kernel_name(&p, &q, &RA, &RB).contains("_e3_"));
        // Without it the compiler's wait opens the kernel and nothing is requested early.
        let plain = render(&p, &Params { early: 0, ..q }, &RA, &RB);
        assert!(!plain.contains(crate::pdl::OWN) && !plain.contains("prefetch.global.L2") && !plain.contains("tl_pdl_enter"));
        // Weights that are not repacked at bind may be written by an earlier kernel.
        assert!(crate::gemv::applies(&p, &Params { tiled: false, ..q }, (9, 0)).is_err());
        assert!(crate::gemv::applies(&p, &q, (9, 0)).is_ok());
    }

    #[test]
    fn min_blocks_bounds_the_launch() {
        let p = problem(1, 4096, 4096, Layout::ColMajor);
        let q = Params { min_blocks: 4, ..Params::default() };
        assert!(render(&p, &q, &RA, &RB).contains("__launch_bounds__(256, 4)"));
    }
}
