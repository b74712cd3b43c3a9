//! The operands of the GEMM template: which can be packed ahead of the calls, implicit im2col
//! forms and their vectorized packing loops (along the columns for `B`, the rows for `A`), `A`
//! read in place (the piece tables and row pointers), and `A` computed contiguously along `k`.

use tilec_ir::DType;
use tilec_tile::indirect::{bound_atoms, split_offset, IndirectA};
use tilec_tile::ir::*;

use crate::render::{convert, RenderError, Renderer};

/// The parameters `e` loads from, if it reads nothing but parameters and the variables `vars`
/// (none at all for an operand computed from its indices alone, such as the Winograd
/// transform of a constant fill: packed once too; but not a bare literal, which packs from
/// registers faster than a packed copy streams from memory).
pub(super) fn operand_params(r: &Renderer, e: &Expr, vars: &[VarId]) -> Option<Vec<usize>> {
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
pub(super) struct Im2col {
    buf: BufId,
    /// Flat offset: row part, column part.
    off: (Expr, Expr),
    /// Bounds `row + col OP 0`.
    atoms: Vec<(BinOp, Expr, Expr)>,
}

pub(super) fn im2col_form(r: &Renderer, g: &Gemm) -> Option<Im2col> {
    im2col_of(r, g, &g.b, g.j_var)
}

/// [`im2col_form`] for an operand `e` whose vectors run along `vec` (the column variable for
/// `B`, the row variable for `A`).
pub(super) fn im2col_of(r: &Renderer, g: &Gemm, e: &Expr, vec: VarId) -> Option<Im2col> {
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
/// load where the columns are contiguous in memory, two masked loads and an even-element
/// permute where they are every other element (a stride-2 convolution along its last axis,
/// Whisper's second 1-D conv), a masked gather elsewhere (the masks are the bounds and the
/// panel edge; a stride-2 vector's loads are masked by the same bounds, spread to the even
/// elements, so no masked-off element is read).
pub(super) fn im2col_pack(r: &mut Renderer, g: &Gemm, f: &Im2col, nr: i64) -> Result<String, RenderError> {
    let (vj, vk, off_row, off_col, atoms) = im2col_parts(r, g, f, g.j_var)?;
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
                              __m512 x;
                              if (tc_ct[{v}] == 1) x = _mm512_maskz_loadu_ps(m, xr + tc_cc[{o}]);
                              else if (tc_ct[{v}] == 2) {{
                                  uint32_t m2 = (uint32_t)m;
                                  m2 = (m2 | (m2 << 8)) & 0x00FF00FFu; m2 = (m2 | (m2 << 4)) & 0x0F0F0F0Fu;
                                  m2 = (m2 | (m2 << 2)) & 0x33333333u; m2 = (m2 | (m2 << 1)) & 0x55555555u;
                                  const __m512 lo = _mm512_maskz_loadu_ps((__mmask16)m2, xr + tc_cc[{o}]);
                                  const __m512 hi = _mm512_maskz_loadu_ps((__mmask16)(m2 >> 16), xr + tc_cc[{o}] + 16);
                                  x = _mm512_permutex2var_ps(lo, tc_even, hi);
                              }} else x = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, _mm512_load_si512((const void *)(tc_cc + {o})), xr, 4);
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
                        int c = 1, c2 = 1;
                        for (int64_t l = 1; l < 16; ++l) {{
                            c &= tc_cc[v * 16 + l] == tc_cc[v * 16] + l || v * 16 + l >= nvalid;
                            c2 &= tc_cc[v * 16 + l] == tc_cc[v * 16] + 2 * l || v * 16 + l >= nvalid;
                        }}
                        tc_ct[v] = c ? 1 : c2 ? 2 : 0;
                    }}
                    const __m512i tc_even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
                    for (int64_t kk = 0; kk < kc; ++kk) {{
                        const int64_t {vk} = pc + kk;
                        const float *xr = {src} + ({off_row});{row}{vecs}
                    }}
                }}"#
    ))
}

/// Whether an [`Im2col`] operand's columns are consecutive elements: its column offset is `j`
/// plus terms free of `j` (so a panel's vectors are contiguous but at the bounds).
pub(super) fn unit_columns(f: &Im2col, j: VarId) -> bool {
    fn coef(e: &Expr, j: VarId) -> Option<i64> {
        let mut uses = false;
        e.visit(&mut |x| uses |= matches!(x, Expr::Var(v) if *v == j));
        if !uses {
            return Some(0);
        }
        match e {
            Expr::Var(_) => Some(1),
            Expr::Binary(BinOp::Add, a, b) => Some(coef(a, j)? + coef(b, j)?),
            Expr::Binary(BinOp::Sub, a, b) => Some(coef(a, j)? - coef(b, j)?),
            Expr::Binary(BinOp::Mul, a, b) => match (&**a, &**b) {
                (x, Expr::Int(k)) | (Expr::Int(k), x) => Some(coef(x, j)? * k),
                _ => None,
            },
            _ => None,
        }
    }
    coef(&f.off.1, j) == Some(1)
}

/// The variable names of an [`Im2col`] operand's vector axis `vec` (`B`'s column, `A`'s row)
/// and of `k`, and the C text of its offsets (`k` part, `vec` part) and bounds (`OP`, `k` part,
/// `vec` part).
#[allow(clippy::type_complexity)]
fn im2col_parts(r: &mut Renderer, g: &Gemm, f: &Im2col, vec: VarId) -> Result<(String, String, String, String, Vec<(BinOp, String, String)>), RenderError> {
    let (vj, vk) = (r.var_name(vec), r.var_name(g.k_var));
    r.open_scope();
    for v in [g.b_var, vec, g.k_var] {
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
    Ok((vj, vk, off_row, off_col, atoms))
}

/// The B packing loop for an [`Im2col`] operand with AVX2 (f32, `nr` a multiple of 8), as
/// [`im2col_pack`] with 8-column vectors: per panel the column parts are tabulated once; per
/// row, each vector is one masked load (`vmaskmovps`, which reads no masked-off element)
/// where the columns are contiguous in memory, else element by element under the same mask.
/// For operands whose columns are consecutive ([`unit_columns`]: a transposed convolution's
/// phase, a stride-1 convolution in NCHW); strided ones keep the plain loop (Wav2Vec2's 1-D
/// convolutions were 7% slower through this one).
pub(super) fn im2col_pack_avx2(r: &mut Renderer, g: &Gemm, f: &Im2col, nr: i64) -> Result<String, RenderError> {
    let (vj, vk, off_row, off_col, atoms) = im2col_parts(r, g, f, g.j_var)?;
    let nv = nr / 8;
    let src = format!("buf{}", f.buf.0);
    let mut tab = String::new();
    let mut decl = format!("int32_t tc_cc[{nr}] __attribute__((aligned(32)));");
    for (a, (_, _, col)) in atoms.iter().enumerate() {
        decl.push_str(&format!(" int32_t tc_ca{a}[{nr}] __attribute__((aligned(32)));"));
        tab.push_str(&format!(" tc_ca{a}[jj] = (int32_t)({col});"));
    }
    let mut row = String::new();
    for (a, (_, rr, _)) in atoms.iter().enumerate() {
        row.push_str(&format!(" const __m256i tc_t{a} = _mm256_set1_epi32((int32_t)(-({rr})));"));
    }
    let mut vecs = String::new();
    for v in 0..nv {
        let o = v * 8;
        // Each bound `col OP -row` on the column parts `c` against `t = -row`.
        let mut m = format!("tc_em[{v}]");
        for (a, (op, _, _)) in atoms.iter().enumerate() {
            let c = format!("_mm256_load_si256((const __m256i *)(tc_ca{a} + {o}))");
            let t = format!("tc_t{a}");
            let test = match op {
                BinOp::Lt => format!("_mm256_cmpgt_epi32({t}, {c})"),
                BinOp::Gt => format!("_mm256_cmpgt_epi32({c}, {t})"),
                BinOp::Le => format!("_mm256_xor_si256(_mm256_cmpgt_epi32({c}, {t}), tc_ones)"),
                _ => format!("_mm256_xor_si256(_mm256_cmpgt_epi32({t}, {c}), tc_ones)"),
            };
            m = format!("_mm256_and_si256({m}, {test})");
        }
        vecs.push_str(&format!(
            r#"
                            {{ const __m256i m = {m};
                              if (tc_ct[{v}]) _mm256_storeu_ps(dst + kk * {nr} + {o}, _mm256_maskload_ps(xr + tc_cc[{o}], m));
                              else {{ int32_t mm[8] __attribute__((aligned(32))); _mm256_store_si256((__m256i *)mm, m);
                                     for (int l = 0; l < 8; ++l) dst[kk * {nr} + {o} + l] = mm[l] ? xr[tc_cc[{o} + l]] : 0.0f; }} }}"#
        ));
    }
    Ok(format!(
        r#"for (int64_t jp = 0; jp < nc; jp += {nr}) {{
                    float *TC_RESTRICT dst = pb + jp * kc;
                    const int64_t nvalid = nc - jp < {nr} ? nc - jp : {nr};
                    {decl}
                    __m256i tc_em[{nv}]; int tc_ct[{nv}];
                    const __m256i tc_ones = _mm256_set1_epi32(-1), tc_lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                    for (int64_t jj = 0; jj < {nr}; ++jj) {{
                        const int64_t {vj} = jc + jp + (jj < nvalid ? jj : 0);
                        tc_cc[jj] = (int32_t)({off_col});{tab}
                    }}
                    for (int64_t v = 0; v < {nv}; ++v) {{
                        const int64_t left = nvalid - v * 8;
                        tc_em[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(left < 0 ? 0 : left > 8 ? 8 : left)), tc_lane);
                        int c = 1;
                        for (int64_t l = 1; l < 8; ++l) c &= tc_cc[v * 8 + l] == tc_cc[v * 8] + l || v * 8 + l >= nvalid;
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
pub(super) fn im2col_pack_a(r: &mut Renderer, g: &Gemm, f: &Im2col, mr: i64) -> Result<String, RenderError> {
    let (vi, vk, off_k, off_i, atoms) = im2col_parts(r, g, f, g.i_var)?;
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
pub(super) fn k_contiguous(kern: &Kernel, e: &Expr, k: VarId) -> bool {
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

pub(super) fn uses_var(e: &Expr, v: VarId) -> bool {
    let mut u = false;
    e.visit(&mut |x| {
        if let Expr::Var(w) = x {
            u |= *w == v;
        }
    });
    u
}

/// C for an indirect `A`: the piece tables (function-scope statics, before the parallel
/// region) and the statement that fills the pointer table `tc_ptr` of row block `ic..ic+mc`
/// for slice `pc` (inside it).
pub(super) fn indirect_code(r: &mut Renderer, g: &Gemm, ind: &IndirectA, mr: i64, kcb: i64) -> Result<(String, String), RenderError> {
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
