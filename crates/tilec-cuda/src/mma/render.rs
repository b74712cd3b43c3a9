//! CUDA C++ source of the `mma.sync` GEMM for one problem and parameter set.
//!
//! Shared memory holds `stages` slots, each an A tile then a B tile of 16-bit elements. A tile
//! is stored as rows of 16-byte chunks: K-contiguous operands as `rows x 64` (8 chunks a
//! row: 128 bytes), M- or N-contiguous ones as `64 x cols`. Chunk `c` of row `r` sits at
//! chunk `c ^ (r & 7)` of its row, so the eight rows an `ldmatrix` reads at one chunk column
//! fall in eight different bank groups.
//!
//! Iteration `i` of a block's K loop waits for slot `i % stages`, then issues the copy of
//! K-block `i + stages - 1` into the slot computed in iteration `i - 1` (every thread is past
//! it: the barrier), then multiplies.

use std::fmt::Write;

use tilec_ir::DType;


use super::{park_dtype, shuffled, MmaProblem, Params};
use crate::families::OperandRef;
use crate::gemm::Layout;
use crate::render::{param_name, short16 as short, source_hash as fnv, EPILOGUE_VEC, PRELUDE};




/// The kernel's name: its shape class and parameters, then a hash of everything else the
/// source depends on.
pub fn kernel_name(p: &MmaProblem, q: &Params, a: &OperandRef, b: &OperandRef) -> String {
    let body = render_body(p, q, a, b, "tl_mma");
    let g = &p.gemm;
    let l = |l: Layout| if l == Layout::RowMajor { 'r' } else { 'c' };
    let kind = if p.conv.is_some() { "conv".to_string() } else { format!("{}{}", l(g.a_layout), l(g.b_layout)) };
    format!(
        "tl_mma_{}_{kind}_{}x{}_w{}x{}_s{}_k{}_{:012x}",
        short(g.in_dtype),
        q.tile_m,
        q.tile_n,
        q.warps_m,
        q.warps_n,
        q.stages,
        q.split_k,
        fnv(&body) & 0xffff_ffff_ffff
    )
}

/// The whole source: prelude, the epilogue function, the kernel (and for a convolution the
/// weight repacking kernel, `<name>_repack`).
pub fn render(p: &MmaProblem, q: &Params, a: &OperandRef, b: &OperandRef) -> String {
    let name = kernel_name(p, q, a, b);
    let mut s = String::from(PRELUDE);
    if let Some(c) = &p.gemm.custom {
        s.push_str(&c.source);
    }
    s.push_str(&render_body(p, q, a, b, &name));
    s
}

/// The device helpers the templates share: shared addresses, `cp.async` copies, `ldmatrix`.
pub(crate) const HELPERS: &str = r#"
__device__ __forceinline__ unsigned tl_mma_saddr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void tl_cp16(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global" TL_L2_HINT " [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tl_cp8(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tl_ldm4(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void tl_ldm4t(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
"#;

/// `tl_mma16816`: one `mma.sync.m16n8k16` with f32 accumulators for 16-bit inputs `dt`.
pub(crate) fn mma_fn(dt: &str) -> String {
    format!(
        r#"__device__ __forceinline__ void tl_mma16816(float* d, const unsigned* a, const unsigned* b) {{
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{dt}.{dt}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}
"#
    )
}

/// The copy of one K-block of A into a stage (`sa`: the stage's A tile, shared address).
fn load_a(p: &MmaProblem, q: &Params) -> String {
    let g = &p.gemm;
    let t = q.threads();
    let mut s = String::new();
    if let Some(c) = &p.conv {
        let chunks = q.tile_m * 8;
        let _ = write!(
            s,
            r#"#pragma unroll
    for (int it = 0; it < {iters}; ++it) {{
      const int idx = tid + it * {t};
      if ({full} || idx < {chunks}) {{
        const int r = idx >> 3, ch = idx & 7;
        const int gk = k0 + ch * 8;
        const unsigned dst = sa + r * 128 + ((ch ^ (r & 7)) << 4);
"#,
            iters = chunks.div_ceil(t),
            full = chunks % t == 0,
        );
        // Depth `kv` as a tap and channel: its input row and column, whether they are inside
        // the image, and the element's offset from the image base.
        let (sh, sw, sc) = c.input_strides();
        let tap = |kv: &str, pad: &str| {
            format!(
                "{pad}const int tap = {kv} / {cc}, cch = {kv} - tap * {cc};
{pad}const int th = tap / {kw}, tw = tap - th * {kw};
{pad}const int ih = a_ih[it] + th * {dh}, iw = a_iw[it] + tw * {dw};
{pad}const bool ok = {kv} < {k} && (unsigned)ih < {h}u && (unsigned)iw < {w}u;
{pad}const long long at = a_base[it] + (long long)ih * {sh} + (long long)iw * {sw} + (long long)cch * {sc};
",
                cc = c.c,
                kw = c.kw,
                dh = c.dil.0,
                dw = c.dil.1,
                k = g.k,
                h = c.h,
                w = c.w,
            )
        };
        if c.vector() {
            let _ = write!(
                s,
                r#"{tap}        tl_cp16(dst, ok ? (const void*)(A + at) : (const void*)A, ok ? 16u : 0u);
      }}
    }}
"#,
                tap = tap("gk", "        "),
            );
        } else if c.half_vector() {
            // Four channels a pixel: each 16-byte chunk is two taps, copied 8 bytes apiece.
            let _ = write!(
                s,
                r#"#pragma unroll
        for (int e = 0; e < 2; ++e) {{
          const int kv = gk + 4 * e;
{tap}          tl_cp8(dst + 8 * e, ok ? (const void*)(A + at) : (const void*)A, ok ? 8u : 0u);
        }}
      }}
    }}
"#,
                tap = tap("kv", "          "),
            );
        } else {
            let _ = write!(
                s,
                r#"        unsigned short v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {{
          const int kk = gk + e;
{tap}          v[e] = ok ? A[at] : (unsigned short)0;
        }}
        uint4 pk;
        pk.x = v[0] | ((unsigned)v[1] << 16); pk.y = v[2] | ((unsigned)v[3] << 16);
        pk.z = v[4] | ((unsigned)v[5] << 16); pk.w = v[6] | ((unsigned)v[7] << 16);
        asm volatile("st.shared.v4.u32 [%0], {{%1, %2, %3, %4}};" :: "r"(dst), "r"(pk.x), "r"(pk.y), "r"(pk.z), "r"(pk.w) : "memory");
      }}
    }}
"#,
                tap = tap("kk", "          "),
            );
        }
        return s;
    }
    // A split A: rows in groups of R, K in 64-wide slices, each with its own stride.
    let addr = g.a_split.map(|sp| {
        format!(
            "A + (long long)(gm / {r}) * {gs} + (long long)(gk >> 6) * {hs} + (long long)(gm % {r}) * {lda} + (gk & 63)",
            r = sp.rows,
            gs = sp.group_stride,
            hs = sp.head_stride,
            lda = g.lda()
        )
    });
    s.push_str(&load_tile("A", "sa", g.a_layout == Layout::RowMajor, q.tile_m, "m0", g.m, g.lda(), q, addr));
    s
}

/// The copy of a matrix operand's K-block: K-contiguous (`kmajor`: rows of the tile are M or
/// N, 8 chunks each) or MN-contiguous (64 K rows of `side / 8` chunks).
#[allow(clippy::too_many_arguments)]
fn load_tile(op: &str, smem: &str, kmajor: bool, side: usize, base: &str, extent: usize, ld: usize, q: &Params, addr: Option<String>) -> String {
    let t = q.threads();
    let (chunks, per_row) = if kmajor { (side * 8, 8) } else { (64 * side / 8, side / 8) };
    let shift = per_row.trailing_zeros();
    let k = "K_";
    let (row_of, bytes, src) = if kmajor {
        (
            format!("const int gm = {base} + r; const int gk = k0 + ch * 8;"),
            format!("gm < {extent} ? (unsigned)max(0, min(16, ({k} - gk) * 2)) : 0u"),
            addr.unwrap_or_else(|| format!("{op} + (long long)gm * {ld} + gk")),
        )
    } else {
        (
            format!("const int gk = k0 + r; const int gm = {base} + ch * 8;"),
            format!("gk < {k} ? (unsigned)max(0, min(16, ({extent} - gm) * 2)) : 0u"),
            format!("{op} + (long long)gk * {ld} + gm"),
        )
    };
    format!(
        r#"#pragma unroll
    for (int it = 0; it < {iters}; ++it) {{
      const int idx = tid + it * {t};
      if ({full} || idx < {chunks}) {{
        const int r = idx >> {shift}, ch = idx & {mask};
        {row_of}
        const unsigned bytes = {bytes};
        const unsigned dst = {smem} + r * {row_bytes} + ((ch ^ (r & 7)) << 4);
        tl_cp16(dst, bytes ? (const void*)({src}) : (const void*){op}, bytes);
      }}
    }}
"#,
        iters = chunks.div_ceil(t),
        full = chunks % t == 0,
        mask = per_row - 1,
        row_bytes = per_row * 16,
    )
}

/// The staged epilogue's read-back from the parked tile (rows `tile_n + 8` floats apart): with
/// a vector epilogue function, each thread takes [`EPILOGUE_VEC`] adjacent columns of a row at
/// a time (whole-vector loads and stores; element by element at the right edge of C), else
/// one element, adjacent threads on adjacent columns.
fn staged_readback(q: &Params, m: usize, n: usize, split_row: &str, epi: &str, vector: Option<&str>, args: &str) -> String {
    let ld = q.tile_n + 8;
    let (bn, threads) = (q.tile_n, q.threads());
    match vector {
        Some(vf) => format!(
            r#"#pragma unroll 2
  for (int tl_e = tid; tl_e < {groups}; tl_e += {threads}) {{
    const int tl_r = tl_e / {gpr}, tl_c = tl_e % {gpr} * {v};
    const int row = m0 + tl_r, col = n0 + tl_c;
    if (row < {m} && col < {n}) {{
      {split_row}
      const float* tl_src = tl_stage + tl_r * {ld} + tl_c;
      if (col + {v} <= {n}) {{
        {vf}({args}eb, er, col / {v}, tl_src);
      }} else {{
        for (int tl_x = 0; col + tl_x < {n}; ++tl_x) {epi}({args}eb, er, col + tl_x, tl_src[tl_x]);
      }}
    }}
  }}
"#,
            v = EPILOGUE_VEC,
            groups = q.tile_m * bn / EPILOGUE_VEC,
            gpr = bn / EPILOGUE_VEC,
        ),
        None => format!(
            r#"#pragma unroll 4
  for (int tl_e = tid; tl_e < {tile}; tl_e += {threads}) {{
    const int tl_r = tl_e / {bn}, tl_c = tl_e % {bn};
    const int row = m0 + tl_r, col = n0 + tl_c;
    if (row < {m} && col < {n}) {{
      {split_row}
      {epi}({args}eb, er, col, tl_stage[tl_r * {ld} + tl_c]);
    }}
  }}
"#,
            tile = q.tile_m * bn,
        ),
    }
}

/// [`staged_readback`] from the tile parked in 16 bits (`d`; see `render_body`): 16-byte loads
/// of 8 columns widened to f32 for the vector function `vf` ([`super::park_dtype`] parks in 16
/// bits only where there is one).
#[allow(clippy::too_many_arguments)]
fn staged_readback16(q: &Params, d: DType, m: usize, n: usize, split_row: &str, epi: &str, vf: &str, args: &str) -> String {
    let (bn, threads, t) = (q.tile_n, q.threads(), short(d));
    {
            assert_eq!(EPILOGUE_VEC, 8, "a 16-byte load holds 8 16-bit columns");
            let unpack: Vec<String> = ["x", "y", "z", "w"]
                .iter()
                .flat_map(|c| [format!("tl_lo_{t}(tl_w.{c})"), format!("tl_hi_{t}(tl_w.{c})")])
                .collect();
            format!(
                r#"#pragma unroll 2
  for (int tl_e = tid; tl_e < {groups}; tl_e += {threads}) {{
    const int tl_r = tl_e / {gpr}, tl_g = tl_e % {gpr};
    const int row = m0 + tl_r, col = n0 + tl_g * 8;
    if (row < {m} && col < {n}) {{
      {split_row}
      const uint4 tl_w = *reinterpret_cast<const uint4*>(tl_stage + tl_r * {rw} + 4 * (tl_g ^ (tl_r & 7)));
      __align__(16) float tl_v[8] = {{{unpack}}};
{call}
    }}
  }}
"#,
                groups = q.tile_m * bn / 8,
                gpr = bn / 8,
                rw = bn / 2,
                unpack = unpack.join(", "),
                call = crate::gemm::shuffle::vector_call(vf, epi, args, &n.to_string(), "      "),
            )
    }
}

fn render_body(p: &MmaProblem, q: &Params, a: &OperandRef, b: &OperandRef, name: &str) -> String {
    let g = &p.gemm;
    let c = g.custom.as_ref();
    let decls: Vec<String> = c.map(|c| c.params.clone()).unwrap_or_default();
    let names: Vec<&str> = decls.iter().map(|d| param_name(d)).collect();
    let pname = |o: &OperandRef| names.get(o.param).copied().unwrap_or("tl_missing");
    let args: String = names.iter().map(|n| format!("{n}, ")).collect();
    let epi = c.map(|c| c.name.clone()).unwrap_or_else(|| "tl_missing".into());
    // Flattened rows split back into (batch, row) in 32 bits (rows are below 2^31).
    let split_row = match c.and_then(|c| c.rows) {
        Some(r) => format!("const int eb = row / {r}, er = row - eb * {r};"),
        None => "const int eb = bz, er = row;".to_string(),
    };
    let (mi, ni) = (q.warp_m() / 16, q.warp_n() / 8);
    let kblocks = g.k.div_ceil(q.tile_k);
    let per_split = kblocks.div_ceil(q.split_k);
    let a_kmajor = p.conv.is_some() || g.a_layout == Layout::RowMajor;
    let b_kmajor = g.b_layout == Layout::ColMajor;
    let a_bytes = q.tile_m * 128;
    let hint = match q.prefetch {
        128 => ".L2::128B",
        256 => ".L2::256B",
        _ => "",
    };
    let mut s = format!("#define TL_L2_HINT \"{hint}\"\n");
    s.push_str(HELPERS);
    if park_dtype(p, q).is_some() {
        s.push_str(crate::gemm::render::PARK16_HELPERS);
    }
    if shuffled(p, q) {
        s.push_str(crate::gemm::shuffle::HELPERS);
    }
    s.push_str(&mma_fn(short(g.in_dtype)));
    let mut params = decls.clone();
    params.extend(["const unsigned short* __restrict__ tl_bpk", "float* __restrict__ tl_ws", "int* __restrict__ tl_cnt"].map(String::from));
    let b_src = if p.conv.is_some() {
        "tl_bpk".to_string()
    } else {
        format!("(const unsigned short*)((const char*){} + {})", pname(b), b.offset_bytes)
    };
    let _ = write!(
        s,
        r#"
extern "C" __global__ void __launch_bounds__({threads}) {name}({params}) {{
  extern __shared__ __align__(128) unsigned char tl_smem[];
  const int K_ = {k};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / {warps_n}, wn = warp % {warps_n};
  // Tile order: groups of 8 tile rows, down a group's rows first (L2 reuse of B).
  const int TM = {tm}, TN = {tn};
  const int pid = blockIdx.x;
  const int gsz = 8 * TN, grp = pid / gsz, first = grp * 8;
  const int rows_in = min(TM - first, 8);
  const int tm = first + (pid % gsz) % rows_in, tn = (pid % gsz) / rows_in;
  const int m0 = tm * {bm}, n0 = tn * {bn};
  const int bz = blockIdx.z / {split}, split = blockIdx.z % {split};
  const unsigned short* A = (const unsigned short*)((const char*){a_name} + {a_off}) + (long long)bz * {sa}{a_split};
  const unsigned short* B = {b_src} + (long long)bz * {sb}{b_split};
  const unsigned smem0 = tl_mma_saddr(tl_smem);
  const int kb0 = split * {per_split};
  const int nk = max(0, min({kblocks}, kb0 + {per_split}) - kb0);
"#,
        threads = q.threads(),
        params = params.join(",\n    "),
        k = g.k,
        warps_n = q.warps_n,
        tm = g.m.div_ceil(q.tile_m),
        tn = g.n.div_ceil(q.tile_n),
        bm = q.tile_m,
        bn = q.tile_n,
        split = q.split_k,
        a_name = pname(a),
        a_off = a.offset_bytes,
        sa = if p.conv.is_some() { 0 } else { g.batch_stride_a },
        sb = if p.conv.is_some() { 0 } else { g.batch_stride_b },
        a_split = g.batch_split.map_or(String::new(), |s| format!(" + (long long)(bz / {d}) * {} + (long long)(bz % {d}) * {}", s.a.0, s.a.1, d = s.div)),
        b_split = g.batch_split.map_or(String::new(), |s| format!(" + (long long)(bz / {d}) * {} + (long long)(bz % {d}) * {}", s.b.0, s.b.1, d = s.div)),
    );
    if let Some(cv) = &p.conv {
        let chunks = q.tile_m * 8;
        let _ = write!(
            s,
            r#"  // The output pixels of this thread's A rows: image base and the first input row/column.
  int a_base[{iters}], a_ih[{iters}], a_iw[{iters}];
#pragma unroll
  for (int it = 0; it < {iters}; ++it) {{
    const int r = m0 + ((tid + it * {t}) >> 3);
    const int img = r / {opix}, pix = r - img * {opix};
    const int oh = pix / {ow}, ow_ = pix - oh * {ow};
    const bool live = r < {m};
    a_base[it] = live ? img * {img_elems} : 0;
    a_ih[it] = live ? oh * {sh} - {ph} : -(1 << 28);
    a_iw[it] = live ? ow_ * {sw} - {pw} : -(1 << 28);
  }}
"#,
            iters = chunks.div_ceil(q.threads()),
            t = q.threads(),
            opix = cv.oh * cv.ow,
            ow = cv.ow,
            m = g.m,
            img_elems = cv.h * cv.w * cv.c,
            sh = cv.stride.0,
            sw = cv.stride.1,
            ph = cv.pad.0,
            pw = cv.pad.1,
        );
    }
    let b_tile = load_tile("B", "sb", b_kmajor, q.tile_n, "n0", g.n, g.ldb(), q, None);
    let _ = write!(
        s,
        r#"  // A stage is {slices} slice(s) of 64 K, each an A tile then a B tile.
  auto load_stage = [&](int slot, int kb) {{
#pragma unroll
    for (int sl = 0; sl < {slices}; ++sl) {{
    const int k0 = kb * {tile_k} + sl * 64;
    const unsigned sa = smem0 + slot * {stage_bytes} + sl * {slice_bytes};
    const unsigned sb = sa + {a_bytes};
    (void)sb; (void)sa;
    {load_a}    {load_b}    }}
  }};
  float acc[{mi}][{ni}][4];
#pragma unroll
  for (int i = 0; i < {mi}; ++i)
#pragma unroll
    for (int j = 0; j < {ni}; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
#pragma unroll
  for (int st = 0; st < {pre}; ++st) {{
    if (st < nk) load_stage(st, kb0 + st);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }}
  const int q8 = lane >> 3, r8 = lane & 7;
  for (int i = 0; i < nk; ++i) {{
    asm volatile("cp.async.wait_group {pre_wait};" ::: "memory");
    __syncthreads();
    if (i + {pre} < nk) load_stage((i + {pre}) % {stages}, kb0 + i + {pre});
    asm volatile("cp.async.commit_group;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < {ksteps}; ++kk) {{
      const unsigned sa = smem0 + (i % {stages}) * {stage_bytes} + (kk >> 2) * {slice_bytes};
      const unsigned sb = sa + {a_bytes};
      unsigned af[{mi}][4], bf[{ni}][2];
#pragma unroll
      for (int x = 0; x < {mi}; ++x) {{
{a_frag}      }}
#pragma unroll
      for (int y = 0; y < {ni2}; ++y) {{
        unsigned r4[4];
{b_frag}        bf[2 * y][0] = r4[0]; bf[2 * y][1] = r4[1]; bf[2 * y + 1][0] = r4[2]; bf[2 * y + 1][1] = r4[3];
      }}
#pragma unroll
      for (int x = 0; x < {mi}; ++x)
#pragma unroll
        for (int y = 0; y < {ni}; ++y) tl_mma16816(acc[x][y], af[x], bf[y]);
    }}
  }}
  asm volatile("cp.async.wait_group 0;" ::: "memory");
"#,
        stage_bytes = q.stage_bytes(),
        slices = q.tile_k / 64,
        slice_bytes = (q.tile_m + q.tile_n) * 128,
        tile_k = q.tile_k,
        ksteps = q.tile_k / 16,
        load_a = load_a(p, q),
        load_b = b_tile,
        pre = q.stages - 1,
        pre_wait = q.stages - 2,
        stages = q.stages,
        ni2 = ni / 2,
        a_frag = if a_kmajor {
            format!(
                "        const int row = wm * {wm} + x * 16 + (q8 & 1) * 8 + r8, ch = (kk & 3) * 2 + (q8 >> 1);\n        tl_ldm4(sa + row * 128 + ((ch ^ (row & 7)) << 4), af[x]);\n",
                wm = q.warp_m()
            )
        } else {
            format!(
                "        const int row = (kk & 3) * 16 + (q8 >> 1) * 8 + r8, ch = (wm * {wm} + x * 16) / 8 + (q8 & 1);\n        tl_ldm4t(sa + row * {rb} + ((ch ^ (row & 7)) << 4), af[x]);\n",
                wm = q.warp_m(),
                rb = q.tile_m * 2
            )
        },
        b_frag = if b_kmajor {
            format!(
                "        const int row = wn * {wn} + y * 16 + (q8 >> 1) * 8 + r8, ch = (kk & 3) * 2 + (q8 & 1);\n        tl_ldm4(sb + row * 128 + ((ch ^ (row & 7)) << 4), r4);\n",
                wn = q.warp_n()
            )
        } else {
            format!(
                "        const int row = (kk & 3) * 16 + (q8 & 1) * 8 + r8, ch = (wn * {wn} + y * 16) / 8 + (q8 >> 1);\n        tl_ldm4t(sb + row * {rb} + ((ch ^ (row & 7)) << 4), r4);\n",
                wn = q.warp_n(),
                rb = q.tile_n * 2
            )
        },
    );
    if q.split_k > 1 {
        let per = mi * ni * 4;
        let _ = write!(
            s,
            r#"  // Split K: park the partial tile; the last block of the tile adds all of them up, in
  // split order (the same sum whichever block arrives last), then runs the epilogue.
  {{
    float* mine = tl_ws + ((long long)pid * {split} + split) * {per} * {threads};
#pragma unroll
    for (int x = 0; x < {mi}; ++x)
#pragma unroll
      for (int y = 0; y < {ni}; ++y)
#pragma unroll
        for (int e = 0; e < 4; ++e) __stcg(mine + ((x * {ni} + y) * 4 + e) * {threads} + tid, acc[x][y][e]);
    __threadfence();
    __syncthreads();
    __shared__ int tl_last;
    if (tid == 0) tl_last = atomicAdd(tl_cnt + pid, 1) == {split} - 1;
    __syncthreads();
    if (!tl_last) return;
    __threadfence();
#pragma unroll
    for (int x = 0; x < {mi}; ++x)
#pragma unroll
      for (int y = 0; y < {ni}; ++y)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[x][y][e] = 0.f;
    for (int sp = 0; sp < {split}; ++sp) {{
      const float* part = tl_ws + ((long long)pid * {split} + sp) * {per} * {threads};
#pragma unroll
      for (int x = 0; x < {mi}; ++x)
#pragma unroll
        for (int y = 0; y < {ni}; ++y)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[x][y][e] += __ldcg(part + ((x * {ni} + y) * 4 + e) * {threads} + tid);
    }}
    if (tid == 0) tl_cnt[pid] = 0;
  }}
"#,
            split = q.split_k,
            threads = q.threads(),
        );
    }
    if shuffled(p, q) {
        // Each quad's four 8-column fragments of a row regrouped by warp shuffles
        // (`gemm::shuffle`): a lane then holds 8 adjacent columns and hands them to the vector
        // function from registers (no barrier, no shared memory).
        let _ = write!(
            s,
            r#"  {{
    const bool tl_h1 = (lane & 1) != 0, tl_h2 = (lane & 2) != 0;
#pragma unroll
    for (int x = 0; x < {mi}; ++x)
#pragma unroll
      for (int g = 0; g < {groups}; ++g)
#pragma unroll
        for (int h = 0; h < 2; ++h) {{
{regroup}          const int row = m0 + wm * {wm} + x * 16 + (lane >> 2) + 8 * h;
          const int col = n0 + wn * {wn} + 32 * g + 8 * (lane & 3);
          if (row < {m} && col < {n}) {{
            {split_row}
{call}
          }}
        }}
  }}
}}
"#,
            groups = ni / 4,
            wm = q.warp_m(),
            wn = q.warp_n(),
            m = g.m,
            n = g.n,
            regroup = crate::gemm::shuffle::regroup(&|i, e| format!("acc[x][4 * g + {i}][2 * h + {e}]"), "          "),
            call = crate::gemm::shuffle::vector_call(c.and_then(|c| c.vector.as_deref()).unwrap_or("tl_missing"), &epi, &args, &g.n.to_string(), "            "),
        );
    } else if let Some(d) = park_dtype(p, q) {
        // As below, parked in 16 bits: exact, as the epilogue function rounds the product to
        // `d` first anyway (a 16-bit MatMul's output in the graph). Row r holds tile_n / 8
        // 16-byte groups (64 columns or more: a multiple of 8 groups, rows a multiple of 128
        // bytes apart), group g at g ^ (r % 8). Banks: a warp's pair stores cover rows
        // 8i .. 8i + 7 at one group, hence 8 distinct groups of 4 words; a quarter-warp's
        // 16-byte loads cover 8 adjacent groups of one row, permuted within their aligned
        // block of 8; a warp's element loads cover 64 bytes of one row.
        let _ = write!(
            s,
            r#"  __syncthreads();
  unsigned* tl_stage = (unsigned*)tl_smem;
#pragma unroll
  for (int x = 0; x < {mi}; ++x)
#pragma unroll
    for (int y = 0; y < {ni}; ++y)
#pragma unroll
      for (int h = 0; h < 2; ++h) {{
        const int tl_r = wm * {wm} + x * 16 + (lane >> 2) + 8 * h;
        const int tl_g = (wn * {wn} + y * 8) >> 3;
        tl_stage[tl_r * {rw} + 4 * (tl_g ^ (tl_r & 7)) + (lane & 3)] = tl_pack_{t}x2(acc[x][y][2 * h], acc[x][y][2 * h + 1]);
      }}
  __syncthreads();
{readback}}}
"#,
            wm = q.warp_m(),
            wn = q.warp_n(),
            rw = q.tile_n / 2,
            t = short(d),
            readback = staged_readback16(q, d, g.m, g.n, &split_row, &epi, c.and_then(|c| c.vector.as_deref()).expect("16-bit parking comes with a vector function"), &args),
        );
    } else if q.staged {
        // The epilogue through shared memory: the tile's accumulators are parked in the (now
        // idle) stage ring, rows padded by 8 floats so that the fragment writes do not collide,
        // then read back so that a warp's lanes hand adjacent columns of one row to the
        // epilogue function: its loads and stores of C (and of a residual) are whole sectors.
        let _ = write!(
            s,
            r#"  __syncthreads();
  float* tl_stage = (float*)tl_smem;
#pragma unroll
  for (int x = 0; x < {mi}; ++x)
#pragma unroll
    for (int y = 0; y < {ni}; ++y)
#pragma unroll
      for (int h = 0; h < 2; ++h) {{
        const int tl_r = wm * {wm} + x * 16 + (lane >> 2) + 8 * h;
        const int tl_c = wn * {wn} + y * 8 + 2 * (lane & 3);
        *(float2*)(tl_stage + tl_r * {ld} + tl_c) = make_float2(acc[x][y][2 * h], acc[x][y][2 * h + 1]);
      }}
  __syncthreads();
{readback}}}
"#,
            wm = q.warp_m(),
            wn = q.warp_n(),
            ld = q.tile_n + 8,
            readback = staged_readback(q, g.m, g.n, &split_row, &epi, c.and_then(|c| c.vector.as_deref()), &args),
        );
    } else {
        // The epilogue from registers: each thread hands its accumulators to the epilogue
        // function, two adjacent columns at a time.
        let _ = write!(
            s,
            r#"#pragma unroll
  for (int x = 0; x < {mi}; ++x)
#pragma unroll
    for (int y = 0; y < {ni}; ++y)
#pragma unroll
      for (int h = 0; h < 2; ++h) {{
        const int row = m0 + wm * {wm} + x * 16 + (lane >> 2) + 8 * h;
        const int col = n0 + wn * {wn} + y * 8 + 2 * (lane & 3);
        if (row < {m}) {{
          {split_row}
          if (col < {n}) {epi}({args}eb, er, col, acc[x][y][2 * h]);
          if (col + 1 < {n}) {epi}({args}eb, er, col + 1, acc[x][y][2 * h + 1]);
        }}
      }}
}}
"#,
            wm = q.warp_m(),
            wn = q.warp_n(),
            m = g.m,
            n = g.n,
            split_row = split_row,
        );
    }
    if let Some(cv) = &p.conv {
        s.push_str(&crate::gemm::render_repack(name, cv, g.n));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilec_ir::DType;
    use crate::gemm::{CustomEpilogue, Problem};

    fn problem(a: Layout, b: Layout) -> MmaProblem {
        let mut g = Problem::new(300, 200, 136, DType::BF16).with_layouts(a, b);
        g.custom = Some(CustomEpilogue {
            loads: false,
            name: "tl_epi".into(),
            source: String::new(),
            params: vec!["const tl_bf16* __restrict__ a".into(), "const tl_bf16* __restrict__ b".into(), "float* __restrict__ c".into()],
            rows: None,
            rounds_to: None,
            vector: None,
        });
        MmaProblem { gemm: g, conv: None }
    }

    /// A problem whose epilogue stores C as bf16, rounding first (as after a bf16 MatMul).
    fn rounding(n: usize, vector: bool) -> MmaProblem {
        let mut p = problem(Layout::RowMajor, Layout::ColMajor);
        p.gemm.n = n;
        let mut source = format!("__device__ __forceinline__ void tl_epi(const tl_bf16* a, const tl_bf16* b, tl_bf16* c, long long tl_b, long long tl_i, long long tl_j, float v) {{ c[tl_i * {n} + tl_j] = tl_st_bf16(v); }}\n");
        if vector {
            source.push_str(&format!("__device__ __forceinline__ void tl_epi_v(const tl_bf16* a, const tl_bf16* b, tl_bf16* c, long long tl_b, long long tl_i, long long tl_jv, const float* v) {{ for (int l = 0; l < 8; ++l) c[tl_i * {n} + tl_jv * 8 + l] = tl_st_bf16(v[l]); }}\n"));
        }
        let e = p.gemm.custom.as_mut().expect("custom");
        e.source = source;
        e.params[2] = "tl_bf16* __restrict__ c".into();
        e.rounds_to = Some(DType::BF16);
        e.vector = vector.then(|| "tl_epi_v".into());
        p
    }

    /// The 16-bit tile layout as rendered: parked columns come back where the read-backs look,
    /// without bank conflicts (pair stores a warp at a time; 16-byte loads a quarter-warp at a
    /// time, eight adjacent groups of one row).
    #[test]
    fn sixteen_bit_tiles_round_trip_without_bank_conflicts() {
        let (ra, rb) = (OperandRef { param: 0, offset_bytes: 0 }, OperandRef { param: 1, offset_bytes: 0 });
        let q = Params::default();
        let src = render(&rounding(200, true), &q, &ra, &rb);
        assert!(src.contains("tl_stage[tl_r * 64 + 4 * (tl_g ^ (tl_r & 7)) + (lane & 3)] = tl_pack_bf16x2("), "{src}");
        assert!(src.contains("tl_stage + tl_r * 64 + 4 * (tl_g ^ (tl_r & 7))"), "{src}");
        // f32 where asked, where the function does not round first, without a vector function,
        // and on narrow tiles.
        for (p, q) in [
            (rounding(200, false), q),
            (rounding(200, true), Params { park16: false, ..q }),
            (problem(Layout::RowMajor, Layout::ColMajor), q),
            (rounding(200, true), Params { tile_n: 32, warps_n: 2, ..q }),
        ] {
            assert!(park_dtype(&p, &q).is_none() && !render(&p, &q, &ra, &rb).contains("tl_pack_"));
        }
        for bn in [64usize, 128, 256] {
            let rw = bn / 2;
            let mut slot = vec![None; 16 * bn];
            for r0 in (0..16).step_by(8) {
                for g in 0..bn / 8 {
                    let mut banks = [false; 32];
                    for lane in 0..32usize {
                        let r = r0 + (lane >> 2);
                        let w = r * rw + 4 * (g ^ (r & 7)) + (lane & 3);
                        assert!(!std::mem::replace(&mut banks[w % 32], true), "park {bn}");
                        for e in 0..2 {
                            assert!(slot[2 * w + e].replace((r, 8 * g + 2 * (lane & 3) + e)).is_none());
                        }
                    }
                }
            }
            for e0 in (0..16 * bn / 8).step_by(8) {
                let mut banks = [false; 32];
                for e in e0..e0 + 8 {
                    let (r, g) = (e / (bn / 8), e % (bn / 8));
                    let w = r * rw + 4 * (g ^ (r & 7));
                    for x in 0..8 {
                        assert_eq!(slot[2 * w + x], Some((r, 8 * g + x)));
                    }
                    for b in w..w + 4 {
                        assert!(!std::mem::replace(&mut banks[b % 32], true), "read-back {bn}");
                    }
                }
            }
            for e in 0..16 * bn {
                let (r, c) = (e / bn, e % bn);
                assert_eq!(slot[r * bn + 8 * ((c >> 3) ^ (r & 7)) + (c & 7)], Some((r, c)));
            }
        }
    }

    #[test]
    fn sixteen_bit_tiles_compile_with_nvrtc() {
        let Ok(nv) = crate::Nvrtc::load() else {
            eprintln!("note: sixteen_bit_tiles_compile_with_nvrtc skipped: no NVRTC (set TILEC_NVRTC_LIB)");
            return;
        };
        let (ra, rb) = (OperandRef { param: 0, offset_bytes: 0 }, OperandRef { param: 1, offset_bytes: 0 });
        let d = Params::default();
        let shapes = [
            d,
            Params { tile_m: 64, tile_n: 64, warps_m: 2, warps_n: 2, ..d },
            Params { tile_m: 16, tile_n: 128, warps_m: 1, warps_n: 4, split_k: 3, ..d },
            Params { tile_m: 256, tile_n: 64, warps_m: 4, warps_n: 2, stages: 3, ..d },
            Params { tile_n: 256, stages: 3, ..d },
        ];
        let mut modules = vec![];
        for (i, q) in shapes.into_iter().enumerate() {
            for vector in [true, false] {
                let p = rounding(if vector { 200 } else { 203 }, vector);
                assert_eq!(park_dtype(&p, &q).is_some(), vector, "{q:?}");
                let name = kernel_name(&p, &q, &ra, &rb);
                modules.push((format!("{name}_{i}"), render(&p, &q, &ra, &rb)));
            }
        }
        let c = crate::Compiler::new(nv, "sm_90a").with_cache_dir(None);
        for (r, (name, _)) in c.compile_many(&modules).into_iter().zip(&modules) {
            assert!(r.unwrap_or_else(|e| panic!("{name}: {e}")).image.starts_with(b"\x7fELF"), "{name}");
        }
    }

    /// The shuffled epilogue on the tile shapes the heuristic picks (and split K): four
    /// exchanges a fragment row, no barrier after the main loop; it needs the vector function
    /// and warps 32 columns wide, else the staged one stays. Compiled where NVRTC is found.
    #[test]
    fn shuffled_epilogues_render_and_compile() {
        let (ra, rb) = (OperandRef { param: 0, offset_bytes: 0 }, OperandRef { param: 1, offset_bytes: 0 });
        let d = Params { shuffle: true, ..Params::default() };
        let shapes = [
            d,
            Params { tile_m: 128, tile_n: 64, warps_m: 4, warps_n: 2, stages: 4, ..d },
            Params { tile_m: 16, tile_n: 128, warps_m: 1, warps_n: 4, split_k: 3, ..d },
            Params { tile_m: 64, tile_n: 128, warps_m: 2, warps_n: 2, ..d },
        ];
        let mut modules = vec![];
        for (i, q) in shapes.into_iter().enumerate() {
            let p = rounding(if i % 2 == 0 { 200 } else { 203 }, true);
            assert!(shuffled(&p, &q) && park_dtype(&p, &q).is_none(), "{q:?}");
            let src = render(&p, &q, &ra, &rb);
            assert_eq!(src.matches("tl_quad_swap(tl_x").count(), 4, "{q:?}");
            assert!(src.contains("tl_epi_v(a, b, c, eb, er, col / 8, tl_v);"), "{src}");
            // The main loop's barriers only: none between it and the stores.
            let tail = &src[src.find("cp.async.wait_group 0;").unwrap_or(0)..];
            assert!(!tail.contains("__syncthreads();") || q.split_k > 1, "{q:?}");
            let name = kernel_name(&p, &q, &ra, &rb);
            assert_ne!(name, kernel_name(&p, &Params { shuffle: false, ..q }, &ra, &rb));
            modules.push((format!("{name}_{i}"), src));
        }
        // Without the vector function, or on warps 16 columns wide: staged.
        assert!(!shuffled(&rounding(200, false), &d));
        assert!(!shuffled(&rounding(200, true), &Params { tile_n: 64, warps_n: 4, ..d }));
        let Ok(nv) = crate::Nvrtc::load() else {
            eprintln!("note: shuffled_epilogues_render_and_compile: compile skipped (no NVRTC; set TILEC_NVRTC_LIB)");
            return;
        };
        let c = crate::Compiler::new(nv, "sm_90a").with_cache_dir(None);
        for (r, (name, _)) in c.compile_many(&modules).into_iter().zip(&modules) {
            assert!(r.unwrap_or_else(|e| panic!("{name}: {e}")).image.starts_with(b"\x7fELF"), "{name}");
        }
    }

    #[test]
    fn sources_differ_by_layout_and_name_every_input() {
        let ra = OperandRef { param: 0, offset_bytes: 0 };
        let rb = OperandRef { param: 1, offset_bytes: 0 };
        let q = Params::default();
        let rc = render(&problem(Layout::RowMajor, Layout::ColMajor), &q, &ra, &rb);
        let cr = render(&problem(Layout::ColMajor, Layout::RowMajor), &q, &ra, &rb);
        assert!(rc.contains("tl_ldm4(sa +") && rc.contains("tl_ldm4(sb +"));
        assert!(cr.contains("tl_ldm4t(sa +") && cr.contains("tl_ldm4t(sb +"));
        assert!(rc.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
        // Staged (the default): the tile read back from shared memory, adjacent columns per lane.
        assert!(rc.contains("tl_epi(a, b, c, eb, er, col, tl_stage[tl_r * 136 + tl_c]);"), "{rc}");
        let unstaged = render(&problem(Layout::RowMajor, Layout::ColMajor), &Params { staged: false, ..q }, &ra, &rb);
        assert!(unstaged.contains("tl_epi(a, b, c, eb, er, col, acc[x][y][2 * h]);"), "{unstaged}");
        assert!(!unstaged.contains("tl_stage"));
        let n1 = kernel_name(&problem(Layout::RowMajor, Layout::ColMajor), &q, &ra, &rb);
        let moved = OperandRef { param: 0, offset_bytes: 32 };
        assert_ne!(n1, kernel_name(&problem(Layout::RowMajor, Layout::ColMajor), &q, &moved, &rb));
        assert!(rc.contains(&format!("void __launch_bounds__(256) {n1}(")));
        let split = Params { split_k: 2, ..q };
        assert!(render(&problem(Layout::RowMajor, Layout::ColMajor), &split, &ra, &rb).contains("atomicAdd(tl_cnt + pid, 1) == 2 - 1"));
    }
}
