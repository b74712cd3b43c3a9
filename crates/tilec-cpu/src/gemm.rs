//! The GEMM template for [`Stmt::Gemm`](tilec_tile::ir::Stmt::Gemm).
//!
//! Layout (BLIS style, vectors along the output columns):
//! - for each batch, `nc`-wide column blocks and `kc`-deep slices of K, the B block (`kc × nc`) is
//!   packed into `nr`-wide micro-panels by all threads together;
//! - for each `mc`-tall row block the A block (`mc × kc`) is packed into `mr`-tall micro-panels;
//! - the `mr × nr` tiles of the block are shared out among the threads; each runs a register-tiled
//!   micro-kernel (`mr × nr/lanes` FMA vector accumulators, B vectors loaded, A broadcast);
//! - after the last K slice the epilogue runs on the tile while it is hot; partial sums of earlier
//!   slices wait in a workspace.
//!
//! Packing evaluates the operand expressions, so transposed or implicit-im2col operands cost only
//! their packing. Edge tiles are zero-padded in the packed panels and the epilogue skips the
//! padding.

use tilec_ir::DType;
use tilec_tile::ir::*;

use crate::cpuinfo::CpuInfo;
use tilec_tile::indirect::{bound_atoms, indirect_form, split_offset, IndirectA};
use crate::render::{convert, value_type, Ctx, RenderError, Renderer};

/// Chooses the blocking of an `m × n × k` single-precision product for `cpu`.
pub fn gemm_params(m: i64, n: i64, k: i64, cpu: &CpuInfo) -> GemmParams {
    // Register tile: mr x nr/lanes accumulators (24 of the 32 zmm registers with AVX-512).
    let (mr, nr) = if cpu.avx512f {
        (8, 48)
    } else if cpu.avx2 {
        (6, 16)
    } else {
        (4, 8)
    };
    // K slice: the B micro-panel (kc x nr) about one and a half L1s (it streams from L2 well
    // on current cores; measured best on a 48 KiB L1 at kc = 384).
    let kc = (((cpu.l1d_bytes * 3 / 2) / (nr as usize * 4)) / 8 * 8).clamp(64, 512) as i64;
    // The A block (mc x kc) takes half of L2.
    let mc = (((cpu.l2_bytes / 2) / (kc as usize * 4)) as i64 / mr * mr).clamp(mr, 1024);
    let nc = 4096i64;
    let kc = kc.min(k.max(1));
    let mc = mc.min(round_up(m.max(1), mr));
    let nc = nc.min(round_up(n.max(1), nr));
    GemmParams { mr, nr, kc, mc, nc }
}

fn round_up(x: i64, m: i64) -> i64 {
    (x + m - 1) / m * m
}

/// Which operand of a gemm a prepacked buffer holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum PackOperand {
    /// `A[b, i, k]`, in `mr`-tall panels.
    A,
    /// `B[b, k, j]`, in `nr`-wide panels.
    B,
}

/// A gemm operand that depends only on kernel parameters (no other loop or local values), so
/// it can be packed once, ahead of the calls, when those parameters are constants.
///
/// The kernel's `NAME__pack(args, slot, dst)` writes the whole operand, in the layout the
/// micro-kernel reads, to `dst` (`bytes` long, 64-byte aligned); `NAME__packed(args, packed)`
/// then reads `packed[slot]` instead of packing that operand itself (a null entry: it packs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PackSlot {
    pub operand: PackOperand,
    /// Indices (into the kernel's parameters) of the buffers the operand reads.
    pub params: Vec<usize>,
    pub bytes: usize,
}

/// The parameters `e` loads from, if it reads nothing but parameters and the variables `vars`
/// (none at all for an operand computed from its indices alone, such as the Winograd
/// transform of a constant fill: packed once too; but not a bare literal, which packs from
/// registers faster than a packed copy streams from memory).
fn operand_params(r: &Renderer, e: &Expr, vars: &[VarId]) -> Option<Vec<usize>> {
    if matches!(e, Expr::Lit(_)) || matches!(e, Expr::Cast(_, x) if matches!(**x, Expr::Lit(_))) {
        return None;
    }
    let mut ok = true;
    let mut ps = vec![];
    e.visit(&mut |x| match x {
        Expr::Var(v) if !vars.contains(v) => ok = false,
        Expr::Load(b, _) => match r.k.params.iter().position(|p| p == b) {
            Some(i) => {
                if !ps.contains(&i) {
                    ps.push(i)
                }
            }
            None => ok = false,
        },
        _ => {}
    });
    ps.sort();
    ok.then_some(ps)
}

/// An implicit im2col operand `B[k, j] = cond ? x[idx] : 0` whose flat offset and every
/// bound of `cond` separate into a part of `k` (and the batch) and a part of `j`.
struct Im2col {
    buf: BufId,
    /// Flat offset: row part, column part.
    off: (Expr, Expr),
    /// Bounds `row + col OP 0`.
    atoms: Vec<(BinOp, Expr, Expr)>,
}

fn im2col_form(r: &Renderer, g: &Gemm) -> Option<Im2col> {
    im2col_of(r, g, &g.b, g.j_var)
}

/// [`im2col_form`] for an operand `e` whose vectors run along `vec` (the column variable for
/// `B`, the row variable for `A`).
fn im2col_of(r: &Renderer, g: &Gemm, e: &Expr, vec: VarId) -> Option<Im2col> {
    let (cond, load) = match e {
        Expr::Select(c, a, z) => match (&**a, &**z) {
            (Expr::Load(..), Expr::Lit(Lit::Float(x, _))) if *x == 0.0 => (Some(&**c), &**a),
            _ => return None,
        },
        l @ Expr::Load(..) => (None, l),
        _ => return None,
    };
    let Expr::Load(buf, idx) = load else { return None };
    let b = r.k.buf(*buf);
    if b.dtype != DType::F32 || !r.k.params.contains(buf) || b.numel() >= 1 << 30 {
        return None;
    }
    let terms: Vec<(Expr, i64)> = idx.iter().cloned().zip(b.strides()).collect();
    let off = split_offset(&terms, vec, g.k_var, None)?;
    let atoms = match cond {
        Some(c) => bound_atoms(c, vec, g.k_var, None)?,
        None => vec![],
    };
    Some(Im2col { buf: *buf, off, atoms })
}

/// The B packing loop for an [`Im2col`] operand with AVX-512 (f32, `nr` a multiple of 16):
/// per panel the column parts are tabulated once; per row, each 16-column vector is one masked
/// load where the columns are contiguous in memory, a masked gather elsewhere (the masks are
/// the bounds and the panel edge).
fn im2col_pack(r: &mut Renderer, g: &Gemm, f: &Im2col, nr: i64) -> Result<String, RenderError> {
    let (vb, vj, vk) = (r.var_name(g.b_var), r.var_name(g.j_var), r.var_name(g.k_var));
    r.open_scope();
    for v in [g.b_var, g.j_var, g.k_var] {
        r.declare(v);
    }
    let mut ex = |e: &Expr| -> Result<String, RenderError> { Ok(r.expr(e)?.0) };
    let off_row = ex(&f.off.0)?;
    let off_col = ex(&f.off.1)?;
    let mut atoms = vec![];
    for (op, row, col) in &f.atoms {
        atoms.push((*op, ex(row)?, ex(col)?));
    }
    r.close_scope();
    let _ = vb;
    let nv = nr / 16;
    let src = format!("buf{}", f.buf.0);
    let mut tab = String::new();
    let mut decl = format!("int32_t tc_cc[{nr}] __attribute__((aligned(64)));");
    for (a, (_, _, col)) in atoms.iter().enumerate() {
        decl.push_str(&format!(" int32_t tc_ca{a}[{nr}] __attribute__((aligned(64)));"));
        tab.push_str(&format!(" tc_ca{a}[jj] = (int32_t)({col});"));
    }
    let mut row = String::new();
    for (a, (_, rr, _)) in atoms.iter().enumerate() {
        row.push_str(&format!(
            " const __m512i tc_t{a} = _mm512_set1_epi32((int32_t)(-({rr})));"
        ));
    }
    let mut vecs = String::new();
    for v in 0..nv {
        let mut m = format!("tc_em[{v}]");
        for (a, (op, _, _)) in atoms.iter().enumerate() {
            let pred = match op {
                BinOp::Lt => "_MM_CMPINT_LT",
                BinOp::Le => "_MM_CMPINT_LE",
                BinOp::Gt => "_MM_CMPINT_NLE",
                _ => "_MM_CMPINT_NLT",
            };
            m = format!(
                "_mm512_mask_cmp_epi32_mask({m}, _mm512_load_si512((const void *)(tc_ca{a} + {o})), tc_t{a}, {pred})",
                o = v * 16
            );
        }
        vecs.push_str(&format!(
            r#"
                            {{ const __mmask16 m = {m};
                              const __m512 x = tc_ct[{v}] ? _mm512_maskz_loadu_ps(m, xr + tc_cc[{o}]) : _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, _mm512_load_si512((const void *)(tc_cc + {o})), xr, 4);
                              _mm512_storeu_ps(dst + kk * {nr} + {o}, x); }}"#,
            o = v * 16
        ));
    }
    Ok(format!(
        r#"for (int64_t jp = 0; jp < nc; jp += {nr}) {{
                    float *TC_RESTRICT dst = pb + jp * kc;
                    const int64_t nvalid = nc - jp < {nr} ? nc - jp : {nr};
                    {decl}
                    __mmask16 tc_em[{nv}]; int tc_ct[{nv}];
                    for (int64_t jj = 0; jj < {nr}; ++jj) {{
                        const int64_t {vj} = jc + jp + (jj < nvalid ? jj : 0);
                        tc_cc[jj] = (int32_t)({off_col});{tab}
                    }}
                    for (int64_t v = 0; v < {nv}; ++v) {{
                        const int64_t left = nvalid - v * 16;
                        tc_em[v] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
                        int c = 1;
                        for (int64_t l = 1; l < 16; ++l) c &= tc_cc[v * 16 + l] == tc_cc[v * 16] + l || v * 16 + l >= nvalid;
                        tc_ct[v] = c;
                    }}
                    for (int64_t kk = 0; kk < kc; ++kk) {{
                        const int64_t {vk} = pc + kk;
                        const float *xr = {src} + ({off_row});{row}{vecs}
                    }}
                }}"#
    ))
}

/// The A packing loop for an [`Im2col`] operand with AVX-512 (f32, `mr` at most 16): per
/// panel the row parts are tabulated once; per `k`, the panel's `mr` values are one masked load
/// where the rows are contiguous in memory, a masked gather elsewhere.
fn im2col_pack_a(r: &mut Renderer, g: &Gemm, f: &Im2col, mr: i64) -> Result<String, RenderError> {
    let (vi, vk) = (r.var_name(g.i_var), r.var_name(g.k_var));
    r.open_scope();
    for v in [g.b_var, g.i_var, g.k_var] {
        r.declare(v);
    }
    let mut ex = |e: &Expr| -> Result<String, RenderError> { Ok(r.expr(e)?.0) };
    let off_k = ex(&f.off.0)?;
    let off_i = ex(&f.off.1)?;
    let mut atoms = vec![];
    for (op, kp, ip) in &f.atoms {
        atoms.push((*op, ex(kp)?, ex(ip)?));
    }
    r.close_scope();
    let src = format!("buf{}", f.buf.0);
    let mut decl = String::from("int32_t tc_rc[16] __attribute__((aligned(64)));");
    let mut tab = String::new();
    let mut thr = String::new();
    let mut m = "tc_em".to_string();
    for (a, (op, kp, ip)) in atoms.iter().enumerate() {
        decl.push_str(&format!(" int32_t tc_ra{a}[16] __attribute__((aligned(64)));"));
        tab.push_str(&format!(" tc_ra{a}[ii] = (int32_t)({ip});"));
        thr.push_str(&format!(" const __m512i tc_t{a} = _mm512_set1_epi32((int32_t)(-({kp})));"));
        let pred = match op {
            BinOp::Lt => "_MM_CMPINT_LT",
            BinOp::Le => "_MM_CMPINT_LE",
            BinOp::Gt => "_MM_CMPINT_NLE",
            _ => "_MM_CMPINT_NLT",
        };
        m = format!("_mm512_mask_cmp_epi32_mask({m}, _mm512_load_si512((const void *)tc_ra{a}), tc_t{a}, {pred})");
    }
    Ok(format!(
        r#"if (!ppa) for (int64_t ip = 0; ip < mc; ip += {mr}) {{
                        float *TC_RESTRICT dst = pa + ip * kc;
                        const int64_t nvalid = mc - ip < {mr} ? mc - ip : {mr};
                        {decl}
                        for (int64_t ii = 0; ii < 16; ++ii) {{
                            const int64_t {vi} = ic + ip + (ii < nvalid ? ii : 0);
                            tc_rc[ii] = (int32_t)({off_i});{tab}
                        }}
                        const __mmask16 tc_em = (__mmask16)((1u << nvalid) - 1);
                        int tc_ct = 1;
                        for (int64_t l = 1; l < nvalid; ++l) tc_ct &= tc_rc[l] == tc_rc[0] + l;
                        const __m512i tc_ri = _mm512_load_si512((const void *)tc_rc);
                        for (int64_t kk = 0; kk < kc; ++kk) {{
                            const int64_t {vk} = pc + kk;
                            const float *xr = {src} + ({off_k});{thr}
                            const __mmask16 m = {m};
                            const __m512 x = tc_ct ? _mm512_maskz_loadu_ps(m, xr + tc_rc[0]) : _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, tc_ri, xr, 4);
                            _mm512_mask_storeu_ps(dst + kk * {mr}, (__mmask16)((1u << {mr}) - 1), x);
                        }}
                    }}"#
    ))
}

/// Whether every load in `e` that depends on `k` walks memory with stride one along it (and
/// some does): then `e` can be evaluated as vectors along `k`.
fn k_contiguous(kern: &Kernel, e: &Expr, k: VarId) -> bool {
    let mut ok = true;
    let mut some = false;
    e.visit(&mut |x| {
        let Expr::Load(b, idx) = x else { return };
        if !idx.iter().any(|i| uses_var(i, k)) {
            return;
        }
        let terms: Vec<(Expr, i64)> = idx.iter().cloned().zip(kern.buf(*b).strides()).collect();
        match tilec_tile::affine::linear_offset(&terms) {
            Some((atoms, _)) => {
                for (c, a) in &atoms {
                    if *a == Expr::Var(k) {
                        ok &= *c == 1;
                        some = true;
                    } else if uses_var(a, k) {
                        ok = false;
                    }
                }
            }
            None => ok = false,
        }
    });
    ok && some
}

fn uses_var(e: &Expr, v: VarId) -> bool {
    let mut u = false;
    e.visit(&mut |x| {
        if let Expr::Var(w) = x {
            u |= *w == v;
        }
    });
    u
}

/// Blocking actually used for accumulator type `acc` (`nr` is in f32 units in the schedule's
/// parameters and is rescaled for wider types and rounded to whole vectors).
#[derive(Copy, Clone, Debug)]
struct Blocking {
    mr: i64,
    nr: i64,
    kc: i64,
    mc: i64,
    nc: i64,
    lanes: i64,
}

fn normalize(p: GemmParams, g: &Gemm, elem_bytes: i64, cpu: &CpuInfo) -> Blocking {
    let lanes = cpu.lanes(elem_bytes as usize) as i64;
    let mr = p.mr.clamp(1, 32);
    let nr_elems = (p.nr.max(1) * 4 / elem_bytes).max(1);
    let nv = ((nr_elems + lanes - 1) / lanes).clamp(1, 8);
    let nr = nv * lanes;
    let kc = p.kc.clamp(1, 1 << 16).min(g.k.max(1));
    let mc = round_up(p.mc.max(mr), mr).min(round_up(g.m.max(1), mr));
    let nc = round_up(p.nc.max(nr), nr).min(round_up(g.n.max(1), nr));
    Blocking {
        mr,
        nr,
        kc,
        mc,
        nc,
        lanes,
    }
}

/// Intrinsics for one vector type.
struct Isa {
    vty: &'static str,
    load: &'static str,
    loadu: &'static str,
    storeu: &'static str,
    set1: &'static str,
    fma: Option<&'static str>,
    add: &'static str,
    mul: &'static str,
    zero: &'static str,
    /// Preprocessor condition under which the intrinsics exist.
    cond: &'static str,
}

fn isa(double: bool, vector_bytes: usize, fma: bool) -> Isa {
    match (double, vector_bytes) {
        (false, 64) => Isa {
            vty: "__m512",
            load: "_mm512_load_ps",
            loadu: "_mm512_loadu_ps",
            storeu: "_mm512_storeu_ps",
            set1: "_mm512_set1_ps",
            fma: Some("_mm512_fmadd_ps"),
            add: "_mm512_add_ps",
            mul: "_mm512_mul_ps",
            zero: "_mm512_setzero_ps",
            cond: "defined(__AVX512F__)",
        },
        (true, 64) => Isa {
            vty: "__m512d",
            load: "_mm512_load_pd",
            loadu: "_mm512_loadu_pd",
            storeu: "_mm512_storeu_pd",
            set1: "_mm512_set1_pd",
            fma: Some("_mm512_fmadd_pd"),
            add: "_mm512_add_pd",
            mul: "_mm512_mul_pd",
            zero: "_mm512_setzero_pd",
            cond: "defined(__AVX512F__)",
        },
        (false, 32) => Isa {
            vty: "__m256",
            load: "_mm256_load_ps",
            loadu: "_mm256_loadu_ps",
            storeu: "_mm256_storeu_ps",
            set1: "_mm256_set1_ps",
            fma: if fma { Some("_mm256_fmadd_ps") } else { None },
            add: "_mm256_add_ps",
            mul: "_mm256_mul_ps",
            zero: "_mm256_setzero_ps",
            cond: if fma {
                "defined(__AVX2__) && defined(__FMA__)"
            } else {
                "defined(__AVX__)"
            },
        },
        (true, 32) => Isa {
            vty: "__m256d",
            load: "_mm256_load_pd",
            loadu: "_mm256_loadu_pd",
            storeu: "_mm256_storeu_pd",
            set1: "_mm256_set1_pd",
            fma: if fma { Some("_mm256_fmadd_pd") } else { None },
            add: "_mm256_add_pd",
            mul: "_mm256_mul_pd",
            zero: "_mm256_setzero_pd",
            cond: if fma {
                "defined(__AVX2__) && defined(__FMA__)"
            } else {
                "defined(__AVX__)"
            },
        },
        (false, _) => Isa {
            vty: "__m128",
            load: "_mm_load_ps",
            loadu: "_mm_loadu_ps",
            storeu: "_mm_storeu_ps",
            set1: "_mm_set1_ps",
            fma: None,
            add: "_mm_add_ps",
            mul: "_mm_mul_ps",
            zero: "_mm_setzero_ps",
            cond: "defined(__SSE2__)",
        },
        (true, _) => Isa {
            vty: "__m128d",
            load: "_mm_load_pd",
            loadu: "_mm_loadu_pd",
            storeu: "_mm_storeu_pd",
            set1: "_mm_set1_pd",
            fma: None,
            add: "_mm_add_pd",
            mul: "_mm_mul_pd",
            zero: "_mm_setzero_pd",
            cond: "defined(__SSE2__)",
        },
    }
}

/// The micro-kernel `cout[mr × nr] = (cin ? cin : 0) + a_panel · b_panel` (file-scope C code,
/// guarded so that it is defined once per translation unit) and its name.
fn micro_kernel(double: bool, b: &Blocking, cpu: &CpuInfo) -> (String, String) {
    ukr_source(double, false, b, cpu)
}

/// The indirect micro-kernel: like [`micro_kernel`], but `A` is read in place through one
/// pointer per row and piece (`ptrs[q * mr + i]`, `pl[q]` elements each, see
/// [`tilec_tile::indirect`]); the `B` panel runs through the pieces in order.
fn micro_kernel_indirect(b: &Blocking, cpu: &CpuInfo) -> (String, String) {
    ukr_source(false, true, b, cpu)
}

fn ukr_source(double: bool, indirect: bool, b: &Blocking, cpu: &CpuInfo) -> (String, String) {
    let t = if double { "double" } else { "float" };
    let eb = if double { 8 } else { 4 };
    let vb = b.lanes as usize * eb;
    let is = isa(double, vb, cpu.fma);
    let nv = b.nr / b.lanes;
    let (mr, nr, lanes) = (b.mr, b.nr, b.lanes);
    let name = if indirect {
        format!("tc_ukri_{t}_{mr}x{nr}_w{vb}")
    } else {
        format!("tc_ukr_{t}_{mr}x{nr}_w{vb}")
    };
    let guard = name.to_uppercase();
    let mut s = String::new();
    s.push_str(&format!("#ifndef {guard}\n#define {guard}\n"));
    s.push_str(&format!("#if !({})\n#error \"the GEMM micro-kernel needs a {}-byte vector ISA: compile for the CPU it was generated for\"\n#endif\n", is.cond, vb));
    s.push_str("#include <immintrin.h>\n");
    let a_param = if indirect {
        format!("int64_t np, const int32_t *TC_RESTRICT pl, const {t} *const *TC_RESTRICT ptrs")
    } else {
        format!("int64_t kc, const {t} *TC_RESTRICT a")
    };
    s.push_str(&format!(
        "static __attribute__((noinline)) void {name}({a_param}, const {t} *TC_RESTRICT b, const {t} *TC_RESTRICT cin, int64_t ldi, {t} *TC_RESTRICT cout, int64_t ldo) {{\n"
    ));
    for i in 0..mr {
        for v in 0..nv {
            s.push_str(&format!("    {} c{i}_{v} = {}();\n", is.vty, is.zero));
        }
    }
    // The partial sums are needed only after the K loop: start fetching them now.
    s.push_str(&format!(
        "    if (cin) for (int64_t p = 0; p < {}; p += 64) __builtin_prefetch((const char *)cin + p, 0, 3);\n",
        mr * nr * eb as i64
    ));
    let pad = if indirect { "    " } else { "" };
    if indirect {
        s.push_str("    for (int64_t q = 0; q < np; ++q) {\n");
        for i in 0..mr {
            s.push_str(&format!("        const {t} *TC_RESTRICT a{i} = ptrs[q * {mr} + {i}];\n"));
        }
        s.push_str("        const int64_t kc = pl[q];\n");
    }
    s.push_str(&format!("{pad}    #pragma GCC unroll 4\n{pad}    for (int64_t k = 0; k < kc; ++k) {{\n"));
    for v in 0..nv {
        s.push_str(&format!(
            "{pad}        {} b{v} = {}(b + k * {nr} + {});\n",
            is.vty,
            is.load,
            v * lanes
        ));
    }
    for i in 0..mr {
        let a = if indirect { format!("a{i}[k]") } else { format!("a[k * {mr} + {i}]") };
        s.push_str(&format!("{pad}        {{ {} ai = {}({a});", is.vty, is.set1));
        for v in 0..nv {
            match is.fma {
                Some(f) => s.push_str(&format!(" c{i}_{v} = {f}(ai, b{v}, c{i}_{v});")),
                None => s.push_str(&format!(
                    " c{i}_{v} = {}(c{i}_{v}, {}(ai, b{v}));",
                    is.add, is.mul
                )),
            }
        }
        s.push_str(" }\n");
    }
    s.push_str(&format!("{pad}    }}\n"));
    if indirect {
        s.push_str(&format!("        b += kc * {nr};\n    }}\n"));
    }
    s.push_str("    if (cin) {\n");
    for i in 0..mr {
        for v in 0..nv {
            s.push_str(&format!(
                "        c{i}_{v} = {}(c{i}_{v}, {}(cin + {i} * ldi + {}));\n",
                is.add,
                is.loadu,
                v * lanes
            ));
        }
    }
    s.push_str("    }\n");
    for i in 0..mr {
        for v in 0..nv {
            s.push_str(&format!(
                "    {}(cout + {i} * ldo + {}, c{i}_{v});\n",
                is.storeu,
                v * lanes
            ));
        }
    }
    s.push_str("}\n#endif\n");
    (s, name)
}

/// C for an indirect `A`: the piece tables (function-scope statics, before the parallel
/// region) and the statement that fills the pointer table `tc_ptr` of row block `ic..ic+mc`
/// for slice `pc` (inside it).
fn indirect_code(r: &mut Renderer, g: &Gemm, ind: &IndirectA, mr: i64, kcb: i64) -> Result<(String, String), RenderError> {
    let ns = ind.slices[0].len();
    let mut pl = vec![];
    let mut pf = vec![];
    let mut po = vec![];
    let natoms = ind.leaves.iter().map(|l| l.atoms.len()).max().unwrap_or(0);
    let mut pa = vec![vec![]; natoms];
    let mut ps = vec![];
    for var in &ind.slices {
        for sl in var {
            ps.push(pl.len());
            for p in sl {
                pl.push(p.len);
                pf.push(p.leaf as i64);
                po.push(p.off);
                for (a, col) in pa.iter_mut().enumerate() {
                    col.push(p.atoms.get(a).copied().unwrap_or(0));
                }
            }
        }
        ps.push(pl.len());
    }
    let list = |v: &[i64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let mut tables = format!(
        "static const int32_t tc_pl[] = {{{}}};\n    static const int32_t tc_po[] = {{{}}};\n    static const int32_t tc_ps[] = {{{}}};\n    static const float tc_zero[{}] __attribute__((aligned(64))) = {{0}};\n",
        list(&pl),
        list(&po),
        list(&ps.iter().map(|&x| x as i64).collect::<Vec<_>>()),
        ind.max_len().max(1)
    );
    if ind.leaves.len() > 1 {
        tables.push_str(&format!("    static const int32_t tc_pf[] = {{{}}};\n", list(&pf)));
    }
    for (a, col) in pa.iter().enumerate() {
        tables.push_str(&format!("    static const int32_t tc_pa{a}[] = {{{}}};\n", list(col)));
    }
    // Row parts, rendered with the row (and batch) variables in scope.
    r.open_scope();
    r.declare(g.b_var);
    r.declare(g.i_var);
    let mut rows = String::new();
    let mut cases = String::new();
    for (q, lf) in ind.leaves.iter().enumerate() {
        let (rc, rt) = r.expr(&lf.row)?;
        rows.push_str(&format!(
            " const int64_t tc_r{q} = {};",
            convert(&rc, rt, Ty::Index)
        ));
        let mut checks = vec![];
        for (a, (op, _, ip)) in lf.atoms.iter().enumerate() {
            let (ic, it) = r.expr(ip)?;
            rows.push_str(&format!(
                " const int64_t tc_r{q}_{a} = {};",
                convert(&ic, it, Ty::Index)
            ));
            let o = match op {
                BinOp::Lt => "<",
                BinOp::Le => "<=",
                BinOp::Gt => ">",
                _ => ">=",
            };
            checks.push(format!("tc_r{q}_{a} + tc_pa{a}[q] {o} 0"));
        }
        let cond = if checks.is_empty() { "1".to_string() } else { checks.join(" && ") };
        let set = format!("if ({cond}) p = buf{} + tc_r{q} + tc_po[q];", lf.buf.0);
        if ind.leaves.len() > 1 {
            cases.push_str(&format!(" case {q}: {set} break;"));
        } else {
            cases = set;
        }
    }
    r.close_scope();
    if ind.leaves.len() > 1 {
        cases = format!("switch (tc_pf[q]) {{{cases} default: break; }}");
    }
    let (vb, vi) = (r.var_name(g.b_var), r.var_name(g.i_var));
    let variant = if ind.batched { vb.clone() } else { "0".into() };
    let fill = format!(
        r#"{{
                        const int64_t tc_q0 = tc_ps[{variant} * {nsp} + pc / {kcb}], tc_q1 = tc_ps[{variant} * {nsp} + pc / {kcb} + 1];
                        tc_np = tc_q1 - tc_q0; tc_plq = tc_pl + tc_q0;
                        for (int64_t ip = 0; ip < mc; ip += {mr}) for (int64_t ii = 0; ii < {mr}; ++ii) {{
                            const float **TC_RESTRICT dst = tc_ptr + ip * tc_np + ii;
                            if (ip + ii >= mc) {{ for (int64_t q = 0; q < tc_np; ++q) dst[q * {mr}] = tc_zero; continue; }}
                            const int64_t {vi} = ic + ip + ii; (void){vb};{rows}
                            for (int64_t q = tc_q0; q < tc_q1; ++q) {{
                                const float *p = tc_zero;
                                {cases}
                                dst[(q - tc_q0) * {mr}] = p;
                            }}
                        }}
                    }}"#,
        nsp = ns + 1,
    );
    Ok((tables, fill))
}

/// Renders one gemm statement into `r` (the micro-kernel goes into `r.pre`).
pub(crate) fn render_gemm(r: &mut Renderer, g: &Gemm, ctx: Ctx) -> Result<(), RenderError> {
    if g.batch < 0 || g.m < 0 || g.n < 0 || g.k < 0 {
        return Err(r.err(format!(
            "gemm with negative extents {}x{}x{}x{}",
            g.batch, g.m, g.n, g.k
        )));
    }
    if g.batch == 0 || g.m == 0 || g.n == 0 {
        return Ok(());
    }
    for (v, what) in [
        (g.b_var, "batch"),
        (g.i_var, "row"),
        (g.j_var, "column"),
        (g.k_var, "reduction"),
        (g.acc_var, "accumulator"),
    ] {
        if v.0 as usize >= r.k.vars.len() {
            return Err(r.err(format!("gemm {what} variable {} does not exist", v.0)));
        }
    }
    match g.acc_dtype {
        DType::F32 | DType::F64 => render_blocked(r, g, ctx),
        _ => render_simple(r, g, ctx),
    }
}

fn parallel_clause(r: &Renderer, g: &Gemm, ctx: Ctx) -> String {
    let flops = g
        .batch
        .saturating_mul(g.m)
        .saturating_mul(g.n)
        .saturating_mul(g.k.max(1));
    let par = !ctx.in_parallel && !ctx.in_simd && flops >= r.opts.gemm_parallel_min_flops;
    format!("num_threads(tc_threads()) if({})", par as u8)
}

/// Whether the epilogue can run under `omp simd` (straight-line stores, lets and ifs).
fn simple_epilogue(stmts: &[Stmt]) -> bool {
    stmts.iter().all(|s| match s {
        Stmt::Store { .. } | Stmt::Let { .. } | Stmt::Barrier => true,
        Stmt::If { then_, else_, .. } => simple_epilogue(then_) && simple_epilogue(else_),
        _ => false,
    })
}

fn render_blocked(r: &mut Renderer, g: &Gemm, ctx: Ctx) -> Result<(), RenderError> {
    let double = g.acc_dtype == DType::F64;
    let t = if double { "double" } else { "float" };
    let eb = if double { 8 } else { 4 };
    let acc_ty = Ty::Elem(g.acc_dtype);
    let cpu = r.opts.cpu.clone();
    let bl = normalize(g.params, g, eb, &cpu);
    // A read in place (see `crate::indirect`) unless it is packed ahead of the calls; the K
    // slices then follow its segments.
    let ind = if double { None } else { indirect_form(r.k, g) };
    // A plain matrix (one leaf, no bounds checks) whose tiles meet many B panels is packed
    // anyway: the packed panels stream contiguously where in place its rows are a row stride
    // apart (4 KiB strides alias in L1). Square SGEMM at n = 2048: 318-328 GFLOP/s in place,
    // 358-361 packed; at n = 256 in place wins (316-323 against 298-301).
    let ind = ind.filter(|x| !(x.leaves.len() == 1 && x.leaves[0].atoms.is_empty() && g.n >= 512 && g.m >= 64));
    let bl = match &ind {
        Some(x) => Blocking { kc: x.kc, ..bl },
        None => bl,
    };
    let (ukr_src, ukr) = micro_kernel(double, &bl, &cpu);
    if !r.pre.contains(&ukr_src) {
        r.pre.push_str(&ukr_src);
    }
    // An A that must be computed (a normalization and activation fused ahead of a
    // channels-last convolution) but runs contiguously along k: packed row by row with vector
    // code, and read through row pointers by the indirect micro-kernel.
    let a_rows = ind.is_none()
        && !double
        && im2col_of(r, g, &g.a, g.i_var).is_none()
        && k_contiguous(r.k, &g.a, g.k_var);
    let ukri = match &ind {
        _ if a_rows => {
            let (src, name) = micro_kernel_indirect(&bl, &cpu);
            if !r.pre.contains(&src) {
                r.pre.push_str(&src);
            }
            name
        }
        Some(_) => {
            let (src, name) = micro_kernel_indirect(&bl, &cpu);
            if !r.pre.contains(&src) {
                r.pre.push_str(&src);
            }
            name
        }
        None => String::new(),
    };
    let Blocking {
        mr,
        nr,
        kc: kcb,
        mc: mcb,
        nc: ncb,
        ..
    } = bl;
    let (vb, vi, vj, vk, vacc) = (
        r.var_name(g.b_var),
        r.var_name(g.i_var),
        r.var_name(g.j_var),
        r.var_name(g.k_var),
        r.var_name(g.acc_var),
    );
    let par = parallel_clause(r, g, ctx);

    // Operand expressions and the epilogue, rendered with the template's variables in scope.
    r.open_scope();
    for v in [g.b_var, g.i_var, g.j_var, g.k_var] {
        r.declare(v);
    }
    let (ac, at) = r.expr(&g.a)?;
    let a_code = convert(&ac, at, acc_ty);
    let (bc, bt) = r.expr(&g.b)?;
    let b_code = convert(&bc, bt, acc_ty);
    r.close_scope();
    let (m, n, k, batch) = (g.m, g.n, g.k, g.batch);
    let kk = k.max(1);
    // Operands that can be packed ahead of the calls (see `PackSlot`).
    let (mpad, npad) = (round_up(m, mr), round_up(n, nr));
    let a_batched = uses_var(&g.a, g.b_var);
    let b_batched = uses_var(&g.b, g.b_var);
    let slot = |r: &mut Renderer, op: PackOperand, ps: Vec<usize>, code: String| -> String {
        let s = r.packs.len();
        let (rows, batched) = match op {
            PackOperand::A => (mpad, a_batched),
            PackOperand::B => (npad, b_batched),
        };
        let nb = if batched { batch } else { 1 };
        let bytes = (nb * rows * k * eb) as usize;
        r.packs.push((
            PackSlot {
                operand: op,
                params: ps,
                bytes: bytes.max(64),
            },
            code,
        ));
        format!("(tc_pk ? (const {t} *)tc_pk[{s}] : NULL)")
    };
    let pa_init = match operand_params(r, &g.a, &[g.b_var, g.i_var, g.k_var]) {
        Some(ps) => {
            let code = format!(
                r#"{{ /* A of gemm {batch} x {m} x {n} x {k} in mr={mr} panels, kc={kcb} slices */
    {t} *TC_RESTRICT pdst = ({t} *)tc_dst;
    for (int64_t bb = 0; bb < {nb}; ++bb) {{
        const int64_t {vb} = bb; (void){vb};
        for (int64_t pc = 0; pc < {kk}; pc += {kcb}) {{
            const int64_t kc = {k} - pc < {kcb} ? {k} - pc : {kcb};
            for (int64_t ip = 0; ip < {mpad}; ip += {mr}) {{
                {t} *TC_RESTRICT dst = pdst + bb * {mpad} * {k} + pc * {mpad} + ip * kc;
                for (int64_t ii = 0; ii < {mr}; ++ii) {{
                    const int64_t {vi} = ip + ii;
                    if ({vi} < {m}) {{
                        for (int64_t kk = 0; kk < kc; ++kk) {{
                            const int64_t {vk} = pc + kk;
                            dst[kk * {mr} + ii] = {a_code};
                        }}
                    }} else {{
                        for (int64_t kk = 0; kk < kc; ++kk) dst[kk * {mr} + ii] = ({t})0;
                    }}
                }}
            }}
        }}
    }}
}}"#,
                nb = if a_batched { batch } else { 1 },
            );
            slot(r, PackOperand::A, ps, code)
        }
        None => "NULL".into(),
    };
    let pb_init = match operand_params(r, &g.b, &[g.b_var, g.j_var, g.k_var]) {
        Some(ps) => {
            let code = format!(
                r#"{{ /* B of gemm {batch} x {m} x {n} x {k} in nr={nr} panels, kc={kcb} slices */
    {t} *TC_RESTRICT pdst = ({t} *)tc_dst;
    for (int64_t bb = 0; bb < {nb}; ++bb) {{
        const int64_t {vb} = bb; (void){vb};
        for (int64_t pc = 0; pc < {kk}; pc += {kcb}) {{
            const int64_t kc = {k} - pc < {kcb} ? {k} - pc : {kcb};
            for (int64_t jp = 0; jp < {npad}; jp += {nr}) {{
                {t} *TC_RESTRICT dst = pdst + bb * {npad} * {k} + pc * {npad} + jp * kc;
                for (int64_t kk = 0; kk < kc; ++kk) {{
                    const int64_t {vk} = pc + kk;
                    for (int64_t jj = 0; jj < {nr}; ++jj) {{
                        const int64_t {vj} = jp + jj;
                        dst[kk * {nr} + jj] = {vj} < {n} ? {b_code} : ({t})0;
                    }}
                }}
            }}
        }}
    }}
}}"#,
                nb = if b_batched { batch } else { 1 },
            );
            slot(r, PackOperand::B, ps, code)
        }
        None => "NULL".into(),
    };
    // Implicit im2col operands: a vectorized packing loop (AVX-512, f32).
    let b_fast = match im2col_form(r, g) {
        Some(f) if !double && cpu.avx512f && bl.lanes == 16 && nr % 16 == 0 => {
            Some(im2col_pack(r, g, &f, nr)?)
        }
        _ => None,
    };
    let b_pack = match b_fast {
        Some(f) => f,
        None => format!(
            r#"for (int64_t jp = 0; jp < nc; jp += {nr}) {{
                    {t} *TC_RESTRICT dst = pb + jp * kc;
                    if (jp + {nr} <= nc) {{
                        for (int64_t kk = 0; kk < kc; ++kk) {{
                            const int64_t {vk} = pc + kk;
                            #pragma omp simd
                            for (int64_t jj = 0; jj < {nr}; ++jj) {{
                                const int64_t {vj} = jc + jp + jj;
                                dst[kk * {nr} + jj] = {b_code};
                            }}
                        }}
                    }} else {{
                        for (int64_t kk = 0; kk < kc; ++kk) {{
                            const int64_t {vk} = pc + kk;
                            for (int64_t jj = 0; jj < {nr}; ++jj) {{
                                const int64_t {vj} = jc + jp + jj;
                                dst[kk * {nr} + jj] = jp + jj < nc ? {b_code} : ({t})0;
                            }}
                        }}
                    }}
                }}"#
        ),
    };
    let pa_off = if a_batched { format!("{vb} * {mpad} * {k} + ") } else { String::new() };
    let pb_off = if b_batched { format!("{vb} * {npad} * {k} + ") } else { String::new() };
    let simd = simple_epilogue(&g.epilogue);
    let saved_out = std::mem::take(&mut r.out);
    let saved_indent = r.indent;
    r.indent = 8;
    r.open_scope();
    for v in [g.b_var, g.i_var, g.j_var, g.acc_var] {
        r.declare(v);
    }
    let ectx = Ctx {
        in_parallel: true,
        in_simd: simd,
    };
    let mut res = Ok(());
    for s in &g.epilogue {
        res = r.stmt(s, ectx);
        if res.is_err() {
            break;
        }
    }
    r.close_scope();
    r.indent = saved_indent;
    let epilogue = std::mem::replace(&mut r.out, saved_out);
    res?;
    let acc_var_ty = r.k.var_info(g.acc_var).ty;
    let acc_decl = format!(
        "const {} {vacc} = {};",
        value_type(acc_var_ty),
        convert(&format!("ct[ii * {nr} + jj]"), acc_ty, acc_var_ty)
    );
    let simd_pragma = if simd { "#pragma omp simd" } else { "" };
    // Implicit im2col A operands (a convolution over few channels): a vectorized packing loop.
    let a_fast = match (&ind, im2col_of(r, g, &g.a, g.i_var)) {
        (None, Some(f)) if !double && cpu.avx512f && bl.lanes == 16 && mr <= 16 => {
            Some(im2col_pack_a(r, g, &f, mr)?)
        }
        _ => None,
    };
    let (ind_tables, ind_decl, a_fill, tile_call) = match &ind {
        Some(x) => {
            let (tables, fill) = indirect_code(r, g, x, mr, kcb)?;
            let decl = format!(
                "const float **TC_RESTRICT tc_ptr = (const float **)tc_scratch(3, sizeof(const float *) * {mcb} * {np});\n        int64_t tc_np = 0; const int32_t *tc_plq = tc_pl;",
                np = x.max_pieces().max(1)
            );
            let call = format!(
                "if (ppa) {ukr}(kc, pak + ir * kc, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});\n                        else {ukri}(tc_np, tc_plq, tc_ptr + ir * tc_np, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});"
            );
            (tables, decl, format!("if (!ppa) {fill}"), call)
        }
        None if a_rows => (
            format!("static const float tc_zero[{kcb}] __attribute__((aligned(64))) = {{0}};\n    "),
            format!(
                "const float **TC_RESTRICT tc_ptr = (const float **)tc_scratch(3, sizeof(const float *) * ({mcb} + {mr}));\n        const int64_t tc_np = 1; int32_t tc_kc32 = 0; const int32_t *tc_plq = &tc_kc32;"
            ),
            format!(
                r#"if (!ppa) {{
                        tc_kc32 = (int32_t)kc;
                        for (int64_t ip = 0; ip < mc; ++ip) {{
                            {t} *TC_RESTRICT dst = pa + ip * kc;
                            const int64_t {vi} = ic + ip;
                            #pragma omp simd
                            for (int64_t kk = 0; kk < kc; ++kk) {{
                                const int64_t {vk} = pc + kk;
                                dst[kk] = {a_code};
                            }}
                        }}
                        for (int64_t ip = 0; ip < mc + {mr} - 1; ++ip) tc_ptr[ip] = ip < mc ? pa + ip * kc : tc_zero;
                    }}"#
            ),
            format!(
                "if (ppa) {ukr}(kc, pak + ir * kc, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});\n                        else {ukri}(tc_np, tc_plq, tc_ptr + ir * tc_np, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});"
            ),
        ),
        None if a_fast.is_some() => (
            String::new(),
            String::new(),
            a_fast.clone().unwrap_or_default(),
            format!("{ukr}(kc, pak + ir * kc, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});"),
        ),
        None => (
            String::new(),
            String::new(),
            format!(
                r#"if (!ppa) for (int64_t ip = 0; ip < mc; ip += {mr}) {{
                        {t} *TC_RESTRICT dst = pa + ip * kc;
                        for (int64_t ii = 0; ii < {mr}; ++ii) {{
                            const int64_t {vi} = ic + ip + ii;
                            if (ip + ii < mc) {{
                                for (int64_t kk = 0; kk < kc; ++kk) {{
                                    const int64_t {vk} = pc + kk;
                                    dst[kk * {mr} + ii] = {a_code};
                                }}
                            }} else {{
                                for (int64_t kk = 0; kk < kc; ++kk) dst[kk * {mr} + ii] = ({t})0;
                            }}
                        }}
                    }}"#
            ),
            format!("{ukr}(kc, pak + ir * kc, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});"),
        ),
    };
    // Tile order: normally a B panel stays in L1 while the A panels stream past it (B is read
    // once per slice, A once per panel, from L2). When A is read in place and its slice does
    // not fit in L2 while the whole B slice fits in a quarter of it, each A tile is read once
    // instead, against all B panels: the large operand streams from memory once. (With B the
    // larger, as the weights of a convolution over 7×7 pixels, the panel order also paces the
    // weights' stream from memory to the arithmetic instead of fetching a slice at once.)
    let l2 = cpu.l2_bytes as i64;
    let a_once = ind.is_some() && kcb * ncb * eb <= l2 / 4 && m * kcb * eb > l2 / 2;
    let tile_loops = if a_once {
        format!(
            "/* Tiles: an A tile meets every B panel of the slice (B stays in L2). */\n                    for (int64_t ir = 0; ir < mc; ir += {mr}) {{\n                    for (int64_t jr = 0; jr < nc; jr += {nr}) {{"
        )
    } else {
        format!(
            "/* Tiles: a B panel stays in L1 while the A panels stream past it. */\n                    for (int64_t jr = 0; jr < nc; jr += {nr}) {{\n                    for (int64_t ir = 0; ir < mc; ir += {mr}) {{"
        )
    };
    // Panel order: while the row tiles pass one B panel, each fetches its share of the panel
    // after next towards L2, so that panels streaming from memory (the weights of a
    // convolution over few pixels) overlap the arithmetic instead of stalling the first tile.
    // (ResNet-50: 24.8-24.9 ms without, 23.4-23.8 with; one panel ahead 24.0-24.1.)
    let prefetch_next = if a_once {
        String::new()
    } else {
        format!(
            "if (jr + 2 * {nr} < nc && mc > {mr}) {{ const char *tc_nx = (const char *)(pbk + (jr + 2 * {nr}) * kc); const int64_t tc_nt = (mc + {mr} - 1) / {mr}, tc_per = (kc * {nr} * (int64_t)sizeof({t}) + tc_nt - 1) / tc_nt; for (int64_t o = (ir / {mr}) * tc_per; o < (ir / {mr} + 1) * tc_per && o < kc * {nr} * (int64_t)sizeof({t}); o += 64) __builtin_prefetch(tc_nx + o, 0, 2); }}"
        )
    };
    let pa_alloc = if ind.is_some() && !a_rows {
        "NULL".to_string()
    } else {
        format!("({t} *)tc_scratch(0, sizeof({t}) * {mcb} * {kcb})")
    };
    let code = format!(
        r#"{{ /* gemm {batch} x {m} x {n} x {k}: mr={mr} nr={nr} kc={kcb} mc={mcb} nc={ncb}{ind_note} */
    {ind_tables}#pragma omp parallel {par}
{{
    /* Each thread computes its own block of C (no barriers): batches, else rows or columns,
       whichever costs less: its padded multiply-adds plus two per operand byte it reads
       (splitting columns makes every thread read all of A, splitting rows all of B). */
    const int64_t nt = tc_team_size(), tid = tc_team_id();
    const int64_t mt = ({m} + {mr} - 1) / {mr}, ntl = ({n} + {nr} - 1) / {nr};
    const int64_t cm = (mt + nt - 1) / nt, cn = (ntl + nt - 1) / nt;
    const int split_b = nt > 1 && {batch} >= nt && ({batch} % nt == 0 || {batch} >= 4 * nt);
    const int split_n = !split_b && cn * {nr} * {m} * {kk} + 8 * ({m} * {kk} + cn * {nr} * {kk}) <= cm * {mr} * {n} * {kk} + 8 * (cm * {mr} * {kk} + {n} * {kk});
    int64_t bb0 = 0, bb1 = {batch}, m0 = 0, m1 = {m}, n0 = 0, n1 = {n};
    if (split_b) {{ const int64_t cb = ({batch} + nt - 1) / nt; bb0 = tid * cb; bb1 = bb0 + cb < {batch} ? bb0 + cb : {batch}; }}
    else if (split_n) {{ n0 = tid * cn * {nr}; n1 = n0 + cn * {nr} < {n} ? n0 + cn * {nr} : {n}; }}
    else {{ m0 = tid * cm * {mr}; m1 = m0 + cm * {mr} < {m} ? m0 + cm * {mr} : {m}; }}
    if (bb0 < bb1 && m0 < m1 && n0 < n1) {{
        const int64_t mw = m1 - m0, nw = n1 - n0;
        const int64_t ncb = ((nw + {nr} - 1) / {nr}) * {nr} < {ncb} ? ((nw + {nr} - 1) / {nr}) * {nr} : {ncb};
        {t} *TC_RESTRICT pa = {pa_alloc}; (void)pa;
        {ind_decl}
        {t} *TC_RESTRICT pb = ({t} *)tc_scratch(1, sizeof({t}) * {kcb} * ncb);
        {t} *TC_RESTRICT cw = {k} > {kcb} ? ({t} *)tc_scratch(2, sizeof({t}) * ((mw + {mr} - 1) / {mr}) * {mr} * ncb) : NULL;
        /* Operands packed ahead of the call (constants), else NULL. */
        const {t} *ppa = {pa_init}, *ppb = {pb_init};
        for (int64_t {vb} = bb0; {vb} < bb1; ++{vb}) {{
        for (int64_t jc = n0; jc < n1; jc += ncb) {{
            const int64_t nc = n1 - jc < ncb ? n1 - jc : ncb;
            for (int64_t pc = 0; pc < {kk}; pc += {kcb}) {{
                const int64_t kc = {k} - pc < {kcb} ? {k} - pc : {kcb};
                const int last = pc + {kcb} >= {k};
                /* Pack B: nr-wide panels, row kk of panel jp at pb + jp * kc + kk * nr. */
                const {t} *TC_RESTRICT pbk = ppb ? ppb + {pb_off}pc * {npad} + jc * kc : pb;
                if (!ppb) {b_pack}
                for (int64_t ic = m0; ic < m1; ic += {mcb}) {{
                    const int64_t mc = m1 - ic < {mcb} ? m1 - ic : {mcb};
                    /* Pack A: mr-tall panels, element (kk, ii) of panel ip at pa + ip * kc + kk * mr + ii. */
                    const {t} *TC_RESTRICT pak = ppa ? ppa + {pa_off}pc * {mpad} + ic * kc : pa;
                    {a_fill}
                    {tile_loops}
                        {t} ct[{ctn}] __attribute__((aligned(64)));
                        /* Partial sums of earlier K slices: one contiguous mr x nr tile each. */
                        {t} *ws = cw ? cw + (((ic - m0 + ir) / {mr}) * (ncb / {nr}) + jr / {nr}) * {ctn} : NULL;
                        {prefetch_next}
                        {tile_call}
                        if (last) {{
                            const int64_t mre = mc - ir < {mr} ? mc - ir : {mr}, nre = nc - jr < {nr} ? nc - jr : {nr};
                            for (int64_t ii = 0; ii < mre; ++ii) {{
                                const int64_t {vi} = ic + ir + ii;
                                {simd_pragma}
                                for (int64_t jj = 0; jj < nre; ++jj) {{
                                    const int64_t {vj} = jc + jr + jj;
                                    {acc_decl}
{epilogue}                                }}
                            }}
                        }}
                    }}
                    }}
                }}
            }}
        }}
        }}
    }}
}}
}}"#,
        ctn = mr * nr,
        ind_note = if ind.is_some() { ", A in place" } else { "" },
    );
    for l in code.lines() {
        r.line(l);
    }
    Ok(())
}

/// A plain loop nest for accumulator types without a vector template (integers, f16, ...),
/// rounding like the interpreter.
fn render_simple(r: &mut Renderer, g: &Gemm, ctx: Ctx) -> Result<(), RenderError> {
    let d = g.acc_dtype;
    // The interpreter accumulates in f64 and rounds to float accumulator types after each step;
    // integer accumulators are not rounded.
    let (ct, acc_ty) = if d.is_float() {
        (value_type(Ty::Elem(d)), Ty::Elem(d))
    } else {
        ("double", Ty::Elem(DType::F64))
    };
    let (vb, vi, vj, vk, vacc) = (
        r.var_name(g.b_var),
        r.var_name(g.i_var),
        r.var_name(g.j_var),
        r.var_name(g.k_var),
        r.var_name(g.acc_var),
    );
    let par = parallel_clause(r, g, ctx);
    r.line(&format!(
        "/* gemm {} x {} x {} x {} ({d}) */",
        g.batch, g.m, g.n, g.k
    ));
    r.line(&format!(
        "#pragma omp parallel for collapse(2) schedule(static) {par}"
    ));
    r.line(&format!(
        "for (int64_t {vb} = 0; {vb} < {}; ++{vb}) {{",
        g.batch
    ));
    r.open_scope();
    r.declare(g.b_var);
    r.line(&format!(
        "for (int64_t {vi} = 0; {vi} < {}; ++{vi}) {{",
        g.m
    ));
    r.open_scope();
    r.declare(g.i_var);
    r.line(&format!(
        "for (int64_t {vj} = 0; {vj} < {}; ++{vj}) {{",
        g.n
    ));
    r.open_scope();
    r.declare(g.j_var);
    r.line(&format!("{ct} s = 0;"));
    r.line(&format!(
        "for (int64_t {vk} = 0; {vk} < {}; ++{vk}) {{",
        g.k
    ));
    r.open_scope();
    r.declare(g.k_var);
    let (ac, at) = r.expr(&g.a)?;
    let (bc, bt) = r.expr(&g.b)?;
    let ac = convert(&ac, at, acc_ty);
    let bc = convert(&bc, bt, acc_ty);
    let prod = convert(
        &format!("(double)({ac}) * (double)({bc})"),
        Ty::Elem(DType::F64),
        acc_ty,
    );
    let sum = convert(
        &format!("(double)s + (double)({prod})"),
        Ty::Elem(DType::F64),
        acc_ty,
    );
    r.line(&format!("s = {sum};"));
    r.close_scope();
    r.line("}");
    let acc_var_ty = r.k.var_info(g.acc_var).ty;
    r.line(&format!(
        "const {} {vacc} = {};",
        value_type(acc_var_ty),
        convert("s", acc_ty, acc_var_ty)
    ));
    r.declare(g.acc_var);
    let ectx = Ctx {
        in_parallel: true,
        in_simd: false,
    };
    for s in &g.epilogue {
        r.stmt(s, ectx)?;
    }
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("}");
    Ok(())
}
