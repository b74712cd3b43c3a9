//! CUDA C++ source of the SIMT f32 GEMM for one problem and parameter set.
//!
//! Threads: `tid = 32 * warp + lane`; the thread's row index `ty = (warp / 2) * 4 + lane / 8`
//! and column index `tx = (warp % 2) * 8 + lane % 8` (both 0..16), so the 8 lanes of a
//! quarter warp share `ty` and hold 8 consecutive `tx`. A thread owns rows
//! `Spread::offset(ty, p)` and columns `Spread::offset(tx, q)` of the tile (sub-tiles of 4, 64
//! apart for a 128 side): a quarter warp reads one float4 of `As` (broadcast) and 8
//! consecutive float4 of `Bs` (128 bytes) per depth.
//!
//! Shared memory: `As[buf][k][m]` rows of `tile_m + 4` floats, then `Bs[buf][k][n]` rows of
//! `tile_n + 4`; the epilogue's band of 16 rows of C (`tile_n + 4` floats each) reuses it.
//!
//! Operand copies: an operand tile is a matrix of `rows x len` floats along its contiguous
//! dimension (K-major: `tile` rows of `tile_k` depths; M- or N-major: `tile_k` rows of `tile`
//! elements), cut into chunks of `V` floats (4 when 16-byte aligned, else 1); chunk `idx` is
//! row `idx / (len / V)`, elements `(idx % (len / V)) * V ..+V`.

use std::fmt::Write;

use super::{Params, Spread, THREADS};
use crate::families::OperandRef;
use crate::gemm::{Layout, Problem};
use crate::render::{PRELUDE, source_hash as fnv, param_name};



/// The kernel's name: layouts and parameters, then a hash of everything else the source
/// depends on.
pub fn kernel_name(p: &Problem, q: &Params, a: &OperandRef, b: &OperandRef) -> String {
    let body = render_body(p, q, a, b, "tl_simt");
    let l = |l: Layout| if l == Layout::RowMajor { 'r' } else { 'c' };
    format!(
        "tl_simt_f32_{}{}_{}x{}x{}_k{}_v{}{}_{:012x}",
        l(p.a_layout),
        l(p.b_layout),
        q.tile_m,
        q.tile_n,
        q.tile_k,
        q.split_k,
        vector_a(p, a),
        vector_b(p, b),
        fnv(&body) & 0xffff_ffff_ffff
    )
}

/// The whole source: prelude, the epilogue function, the kernel.
pub fn render(p: &Problem, q: &Params, a: &OperandRef, b: &OperandRef) -> String {
    let name = kernel_name(p, q, a, b);
    let mut s = String::from(PRELUDE);
    if let Some(c) = &p.custom {
        s.push_str(&c.source);
    }
    s.push_str(&render_body(p, q, a, b, &name));
    s
}

/// Floats per global read of A: 4 when every chunk's address is 16-byte aligned (offset,
/// leading dimension, batch strides and split strides all multiples of 4 floats), else 1.
pub fn vector_a(p: &Problem, a: &OperandRef) -> usize {
    let mut strides = vec![p.lda()];
    if p.batch > 1 {
        strides.push(p.batch_stride_a);
    }
    if let Some(s) = p.batch_split {
        strides.extend([s.a.0, s.a.1]);
    }
    if let Some(s) = p.a_split {
        strides.extend([s.head_stride, s.group_stride]);
    }
    vector(a.offset_bytes, &strides)
}

/// Floats per global read of B (see [`vector_a`]).
pub fn vector_b(p: &Problem, b: &OperandRef) -> usize {
    let mut strides = vec![p.ldb()];
    if p.batch > 1 {
        strides.push(p.batch_stride_b);
    }
    if let Some(s) = p.batch_split {
        strides.extend([s.b.0, s.b.1]);
    }
    vector(b.offset_bytes, &strides)
}

fn vector(offset_bytes: u64, strides: &[usize]) -> usize {
    if offset_bytes % 16 == 0 && strides.iter().all(|s| s % 4 == 0) {
        4
    } else {
        1
    }
}

/// One operand's copy: global memory → registers (`load`), registers → shared memory
/// (`store`, into the buffer at `dst`).
struct Copy {
    load: String,
    store: String,
    /// Floats of registers it stages per thread.
    regs: usize,
}

/// The copy of an operand tile. `kmajor`: contiguous along K (tile rows are M or N);
/// `side`: the tile's M or N extent; `o0`: the tile's first row (column) of C; `ext`: M or
/// N; `row`: the shared-memory row length; `addr(go, gk)`: the element's address.
#[allow(clippy::too_many_arguments)]
fn copy(reg: &str, kmajor: bool, side: usize, tk: usize, o0: &str, ext: usize, k: usize, row: usize, v: usize, addr: &dyn Fn(&str, &str) -> String) -> Copy {
    // Tiles that divide the extents never reach past them: no checks (shapes are compiled in).
    let (ext_full, k_full) = (ext % side == 0, k % tk == 0);
    let len = if kmajor { tk } else { side };
    let per_row = len / v;
    let chunks = side * tk / v;
    let iters = chunks.div_ceil(THREADS);
    let full = chunks % THREADS == 0;
    let head = format!(
        "#pragma unroll\n    for (int it = 0; it < {iters}; ++it) {{\n      const int idx = tid + it * {THREADS};\n      if ({full} || idx < {chunks}) {{\n        const int r = idx / {per_row}, c = (idx % {per_row}) * {v};\n"
    );
    let coords = if kmajor {
        format!("        const int go = {o0} + r, gk = k0 + c;\n")
    } else {
        format!("        const int gk = k0 + r, go = {o0} + c;\n")
    };
    // Whether the chunk's row exists, and element `e` of it.
    let row_ok = match (kmajor, ext_full, k_full) {
        (true, true, _) | (false, _, true) => "true".to_string(),
        (true, false, _) => format!("go < {ext}"),
        (false, _, false) => format!("gk < {k}"),
    };
    let elem_ok = |e: &str| match (kmajor, ext_full, k_full) {
        (true, _, true) | (false, true, _) => "true".to_string(),
        (true, _, false) => format!("gk + {e} < {k}"),
        (false, false, _) => format!("go + {e} < {ext}"),
    };
    let at = |e: &str| if kmajor { addr("go", &format!("gk + {e}")) } else { addr(&format!("go + {e}"), "gk") };
    let mut load = head.clone();
    load.push_str(&coords);
    if v == 4 {
        let _ = write!(
            load,
            r#"        if ({row_ok} && {last}) {{
          const float4 x = __ldg((const float4*)({first}));
          {reg}[it][0] = x.x; {reg}[it][1] = x.y; {reg}[it][2] = x.z; {reg}[it][3] = x.w;
        }} else {{
#pragma unroll
          for (int e = 0; e < 4; ++e) {{
            float x = 0.f;
            if ({row_ok} && {elem}) x = __ldg({each});
            {reg}[it][e] = x;
          }}
        }}
      }}
    }}
"#,
            last = elem_ok("3"),
            first = addr("go", "gk"),
            elem = elem_ok("e"),
            each = at("e"),
        );
    } else {
        let _ = write!(
            load,
            r#"        float x = 0.f;
        if ({row_ok} && {elem}) x = __ldg({first});
        {reg}[it][0] = x;
      }}
    }}
"#,
            elem = elem_ok("0"),
            first = addr("go", "gk"),
        );
    }
    let mut store = head;
    if kmajor {
        // Transposed: element e of the chunk is depth c + e of tile row r.
        let _ = write!(
            store,
            "#pragma unroll\n        for (int e = 0; e < {v}; ++e) dst[(c + e) * {row} + r] = {reg}[it][e];\n      }}\n    }}\n"
        );
    } else if v == 4 {
        let _ = write!(
            store,
            "        *(float4*)(dst + r * {row} + c) = make_float4({reg}[it][0], {reg}[it][1], {reg}[it][2], {reg}[it][3]);\n      }}\n    }}\n"
        );
    } else {
        let _ = write!(store, "        dst[r * {row} + c] = {reg}[it][0];\n      }}\n    }}\n");
    }
    Copy { load, store, regs: iters * v }
}

/// Statements reading a thread's fragment of one side at depth `k` into `frag[]` from the
/// shared slice row `src + k * row`.
fn fragment(frag: &str, src: &str, row: usize, s: Spread, t: &str) -> String {
    let mut out = String::new();
    for sub in 0..s.count {
        let at = format!("{src} + k * {row} + {} + {t} * {}", sub * 16 * s.width, s.width);
        let e0 = sub * s.width;
        let _ = match s.width {
            4 => writeln!(
                out,
                "        {{ const float4 v = *(const float4*)({at}); {frag}[{}] = v.x; {frag}[{}] = v.y; {frag}[{}] = v.z; {frag}[{}] = v.w; }}",
                e0,
                e0 + 1,
                e0 + 2,
                e0 + 3
            ),
            2 => writeln!(out, "        {{ const float2 v = *(const float2*)({at}); {frag}[{}] = v.x; {frag}[{}] = v.y; }}", e0, e0 + 1),
            _ => writeln!(out, "        {frag}[{e0}] = *({at});"),
        };
    }
    out
}

fn render_body(p: &Problem, q: &Params, a: &OperandRef, b: &OperandRef, name: &str) -> String {
    let c = p.custom.as_ref();
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
    let (sm, sn) = (Spread::of(q.tile_m), Spread::of(q.tile_n));
    let (rm, rn) = (sm.per_thread(), sn.per_thread());
    let (ar, br) = (q.a_row(), q.b_row());
    let kblocks = p.k.div_ceil(q.tile_k);
    let per_split = kblocks.div_ceil(q.split_k);
    let (va, vb) = (vector_a(p, a), vector_b(p, b));
    let (lda, ldb) = (p.lda(), p.ldb());
    let a_addr = |go: &str, gk: &str| match (p.a_layout, p.a_split) {
        (Layout::RowMajor, Some(sp)) => format!(
            "A + (long long)(({go}) / {r}) * {gs} + (long long)(({gk}) >> 6) * {hs} + (long long)(({go}) % {r}) * {lda} + (({gk}) & 63)",
            r = sp.rows,
            gs = sp.group_stride,
            hs = sp.head_stride
        ),
        (Layout::RowMajor, None) => format!("A + (long long)({go}) * {lda} + ({gk})"),
        (Layout::ColMajor, _) => format!("A + (long long)({gk}) * {lda} + ({go})"),
    };
    let b_addr = |go: &str, gk: &str| match p.b_layout {
        Layout::ColMajor => format!("B + (long long)({go}) * {ldb} + ({gk})"),
        Layout::RowMajor => format!("B + (long long)({gk}) * {ldb} + ({go})"),
    };
    let ca = copy("ra", p.a_layout == Layout::RowMajor, q.tile_m, q.tile_k, "m0", p.m, p.k, ar, va, &a_addr);
    let cb = copy("rb", p.b_layout == Layout::ColMajor, q.tile_n, q.tile_k, "n0", p.n, p.k, br, vb, &b_addr);
    let split_of = |s: (usize, usize), d: usize| format!(" + (long long)(bz / {d}) * {} + (long long)(bz % {d}) * {}", s.0, s.1);
    let (a_split, b_split) = match p.batch_split {
        Some(s) => (split_of(s.a, s.div), split_of(s.b, s.div)),
        None => (String::new(), String::new()),
    };
    let mut params = decls.clone();
    params.extend(["float* __restrict__ tl_ws", "int* __restrict__ tl_cnt"].map(String::from));
    let mut s = String::new();
    let _ = write!(
        s,
        r#"
extern "C" __global__ void __launch_bounds__({THREADS}, {min_blocks}) {name}({params}) {{
  __shared__ __align__(16) float tl_sm[{smem}];
  float* const As = tl_sm;
  float* const Bs = tl_sm + {a_buf2};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ty = (warp >> 1) * 4 + (lane >> 3), tx = (warp & 1) * 8 + (lane & 7);
  // Tile order: groups of 8 tile rows, down a group's rows first (L2 reuse of B).
  const int TM = {tiles_m}, TN = {tiles_n};
  const int pid = blockIdx.x;
  const int gsz = 8 * TN, grp = pid / gsz, first = grp * 8;
  const int rows_in = min(TM - first, 8);
  const int m0 = (first + (pid % gsz) % rows_in) * {tile_m}, n0 = ((pid % gsz) / rows_in) * {tile_n};
  const int bz = blockIdx.z / {split}, split = blockIdx.z % {split};
  const float* A = (const float*)((const char*){a_name} + {a_off}) + (long long)bz * {sa}{a_split};
  const float* B = (const float*)((const char*){b_name} + {b_off}) + (long long)bz * {sb}{b_split};
  const int kb0 = split * {per_split};
  const int nk = max(0, min({kblocks}, kb0 + {per_split}) - kb0);
  float ra[{ra_n}][{va}], rb[{rb_n}][{vb}];
  float acc[{rm}][{rn}];
#pragma unroll
  for (int i = 0; i < {rm}; ++i)
#pragma unroll
    for (int j = 0; j < {rn}; ++j) acc[i][j] = 0.f;
  if (nk > 0) {{
    {{
    const int k0 = kb0 * {tile_k};
    {load_a}    {load_b}    }}
    {{
    float* dst = As;
    {store_a}    dst = Bs;
    {store_b}    }}
    __syncthreads();
  }}
  for (int i = 0; i < nk; ++i) {{
    // The next slice into registers while this one is multiplied.
    if (i + 1 < nk) {{
    const int k0 = (kb0 + i + 1) * {tile_k};
    {load_a}    {load_b}    }}
    const float* const as = As + (i & 1) * {a_buf};
    const float* const bs = Bs + (i & 1) * {b_buf};
#pragma unroll
    for (int k = 0; k < {tile_k}; ++k) {{
      float fa[{rm}], fb[{rn}];
{frag_a}{frag_b}#pragma unroll
      for (int x = 0; x < {rm}; ++x)
#pragma unroll
        for (int y = 0; y < {rn}; ++y) acc[x][y] = __fmaf_rn(fa[x], fb[y], acc[x][y]);
    }}
    // The other buffer was last read in iteration i - 1, before the barrier that ended it.
    if (i + 1 < nk) {{
    float* dst = As + ((i + 1) & 1) * {a_buf};
    {store_a}    dst = Bs + ((i + 1) & 1) * {b_buf};
    {store_b}    }}
    __syncthreads();
  }}
"#,
        params = params.join(",\n    "),
        min_blocks = q.min_blocks,
        smem = q.smem_floats(),
        a_buf = q.tile_k * ar,
        a_buf2 = 2 * q.tile_k * ar,
        b_buf = q.tile_k * br,
        tiles_m = p.m.div_ceil(q.tile_m),
        tiles_n = p.n.div_ceil(q.tile_n),
        tile_m = q.tile_m,
        tile_n = q.tile_n,
        tile_k = q.tile_k,
        split = q.split_k,
        a_name = pname(a),
        a_off = a.offset_bytes,
        b_name = pname(b),
        b_off = b.offset_bytes,
        sa = p.batch_stride_a,
        sb = p.batch_stride_b,
        ra_n = ca.regs / va,
        rb_n = cb.regs / vb,
        load_a = ca.load,
        load_b = cb.load,
        store_a = ca.store,
        store_b = cb.store,
        frag_a = fragment("fa", "as", ar, sm, "ty"),
        frag_b = fragment("fb", "bs", br, sn, "tx"),
    );
    if q.split_k > 1 {
        let per = rm * rn;
        let _ = write!(
            s,
            r#"  // Split K: park the partial tile; the last block of the tile adds all of them up, in
  // split order (the same sum whichever block arrives last), then runs the epilogue.
  {{
    float* const mine = tl_ws + ((long long)pid * {split} + split) * {tile};
#pragma unroll
    for (int x = 0; x < {rm}; ++x)
#pragma unroll
      for (int y = 0; y < {rn}; ++y) __stcg(mine + (x * {rn} + y) * {THREADS} + tid, acc[x][y]);
    __threadfence();
    __syncthreads();
    __shared__ int tl_last;
    if (tid == 0) tl_last = atomicAdd(tl_cnt + pid, 1) == {split} - 1;
    __syncthreads();
    if (!tl_last) return;
    __threadfence();
#pragma unroll
    for (int x = 0; x < {rm}; ++x)
#pragma unroll
      for (int y = 0; y < {rn}; ++y) acc[x][y] = 0.f;
    for (int sp = 0; sp < {split}; ++sp) {{
      const float* const part = tl_ws + ((long long)pid * {split} + sp) * {tile};
#pragma unroll
      for (int x = 0; x < {rm}; ++x)
#pragma unroll
        for (int y = 0; y < {rn}; ++y) acc[x][y] += __ldcg(part + (x * {rn} + y) * {THREADS} + tid);
    }}
    if (tid == 0) tl_cnt[pid] = 0;
  }}
"#,
            split = q.split_k,
            tile = per * THREADS,
        );
    }
    // The band: the thread's row element x of every ty (16 rows, `wm` apart in the tile),
    // written at band row ty, then read back a row at a time by consecutive threads.
    let mut band_write = String::new();
    for sub in 0..sn.count {
        let at = format!("tl_sm + ty * {br} + {} + tx * {}", sub * 16 * sn.width, sn.width);
        let y0 = sub * sn.width;
        let _ = match sn.width {
            4 => writeln!(band_write, "    *(float4*)({at}) = make_float4(acc[x][{y0}], acc[x][{}], acc[x][{}], acc[x][{}]);", y0 + 1, y0 + 2, y0 + 3),
            _ => writeln!(band_write, "    *(float2*)({at}) = make_float2(acc[x][{y0}], acc[x][{}]);", y0 + 1),
        };
    }
    let _ = write!(
        s,
        r#"  // Epilogue: 16 rows of C at a time through shared memory (the slices' last readers are
  // past the loop's final barrier), consecutive threads on consecutive columns.
#pragma unroll
  for (int x = 0; x < {rm}; ++x) {{
{band_write}    __syncthreads();
    const int trow = (x / {wm}) * {sub_m} + (x % {wm});
#pragma unroll
    for (int it = 0; it < {band_iters}; ++it) {{
      const int e = tid + it * {THREADS};
      const int r = e / {tile_n}, cc = e % {tile_n};
      const int row = m0 + trow + r * {wm}, col = n0 + cc;
      if (row < {m} && col < {n}) {{
        {split_row}
        {epi}({args}eb, er, col, tl_sm[r * {br} + cc]);
      }}
    }}
    __syncthreads();
  }}
}}
"#,
        wm = sm.width,
        sub_m = 16 * sm.width,
        band_iters = 16 * q.tile_n / THREADS,
        tile_n = q.tile_n,
        m = p.m,
        n = p.n,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::CustomEpilogue;
    use tilec_ir::DType;

    fn problem(a: Layout, b: Layout) -> Problem {
        let mut g = Problem::new(291, 203, 130, DType::F32).with_layouts(a, b);
        g.custom = Some(CustomEpilogue {
            loads: false,
            name: "tl_epi".into(),
            source: String::new(),
            params: vec!["const float* __restrict__ a".into(), "const float* __restrict__ b".into(), "float* __restrict__ c".into()],
            rows: None,
            rounds_to: None,
            vector: None,
        });
        g
    }

    const RA: OperandRef = OperandRef { param: 0, offset_bytes: 0 };
    const RB: OperandRef = OperandRef { param: 1, offset_bytes: 0 };

    #[test]
    fn sources_name_every_input_and_call_the_epilogue() {
        let q = Params::default();
        let mut p = problem(Layout::RowMajor, Layout::RowMajor);
        p.lda = Some(132);
        p.ldb = Some(204);
        let src = render(&p, &q, &RA, &RB);
        let name = kernel_name(&p, &q, &RA, &RB);
        assert!(name.starts_with("tl_simt_f32_rr_128x128x8_k1_v44_"), "{name}");
        assert!(src.contains(&format!("void __launch_bounds__(256, 2) {name}(")));
        assert!(src.contains("tl_epi(a, b, c, eb, er, col, tl_sm[r * 132 + cc]);"), "{src}");
        assert!(src.contains("__fmaf_rn(fa[x], fb[y], acc[x][y])"));
        // Row-major A is K-major: float4 reads along K, stored transposed.
        assert!(src.contains("__ldg((const float4*)(A + (long long)(go) * 132 + (gk)))"), "{src}");
        assert!(src.contains("dst[(c + e) * 132 + r]"));
        // Row-major B is N-major: float4 reads and stores along N.
        assert!(src.contains("__ldg((const float4*)(B + (long long)(gk) * 204 + (go)))"), "{src}");
        assert!(src.contains("*(float4*)(dst + r * 132 + c)"));
        // Two float4 fragments 64 apart per side.
        assert!(src.contains("*(const float4*)(as + k * 132 + 64 + ty * 4)"), "{src}");
        assert!(src.contains("*(const float4*)(bs + k * 132 + 64 + tx * 4)"), "{src}");
        assert!(!src.contains("atomicAdd"));
        // Ragged edges: guarded.
        assert!(src.contains("gk + 3 < 130") && src.contains("go < 291") && src.contains("go + 3 < 203"), "{src}");
    }

    #[test]
    fn misaligned_operands_read_scalars() {
        let q = Params::default();
        let p = problem(Layout::ColMajor, Layout::ColMajor);
        // Dense leading dimensions 291 and 130: A scalar, B (ld 130) too.
        assert_eq!((vector_a(&p, &RA), vector_b(&p, &RB)), (1, 1));
        let src = render(&p, &q, &RA, &RB);
        assert!(!src.contains("float4*)(A") && !src.contains("float4*)(B"), "{src}");
        assert!(src.contains("x = __ldg(A + (long long)(gk) * 291 + (go))"), "{src}");
        let mut al = p.clone();
        al.lda = Some(292);
        al.ldb = Some(132);
        assert_eq!((vector_a(&al, &RA), vector_b(&al, &RB)), (4, 4));
        let off = OperandRef { param: 0, offset_bytes: 8 };
        assert_eq!(vector_a(&al, &off), 1);
        assert_ne!(kernel_name(&al, &q, &RA, &RB), kernel_name(&al, &q, &off, &RB));
        let mut batched = al.clone();
        batched.batch = 2;
        batched.batch_stride_a = 6;
        assert_eq!(vector_a(&batched, &RA), 1);
    }

    #[test]
    fn split_k_flattened_rows_and_small_tiles() {
        let mut p = problem(Layout::RowMajor, Layout::ColMajor);
        p.custom.as_mut().map(|c| c.rows = Some(97));
        let q = Params { tile_m: 32, tile_n: 64, tile_k: 16, split_k: 3, min_blocks: 2 };
        let src = render(&p, &q, &RA, &RB);
        assert!(src.contains("atomicAdd(tl_cnt + pid, 1) == 3 - 1"), "{src}");
        assert!(src.contains("const int eb = row / 97, er = row - eb * 97;"));
        // 32 rows: two per thread, one float2.
        assert!(src.contains("*(const float2*)(as + k * 36 + 0 + ty * 2)"), "{src}");
        assert!(src.contains("*(float4*)(tl_sm + ty * 68 + 0 + tx * 4)"), "{src}");
        assert!(src.contains("const int trow = (x / 2) * 32 + (x % 2);"), "{src}");
    }
}
