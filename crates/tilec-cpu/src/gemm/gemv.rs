//! The matrix-vector template for a [`Gemm`] marked `vector` (`cpu.gemv`): a product of a few
//! rows (f32; `batch × m` up to [`MAX_ROWS`], the batches sharing `B`, so that they are rows
//! too) whose `B` operand is streamed once per call.
//!
//! `B` is laid out in panels of `nr = v × lanes` columns, each `k × nr` with the `nr` columns
//! of one `k` contiguous (the last panel as narrow as whole vectors allow): panel `p` starts at
//! `p · k · nr`, so the whole operand is one contiguous stream of full-width vector loads.
//! When `B` reads only kernel parameters it gets a pack slot ([`PackOperand::B`]) and is laid
//! out once ahead of the calls; otherwise each panel is laid out into per-thread scratch
//! right before it is used. `A` (`m × k`, small) is evaluated into scratch by every chunk.
//!
//! Per panel, `m × v` vector accumulators (two sets, over even and odd `k`, when that still
//! fits the registers: at one row a single set of four would wait on FMA latency) take one
//! broadcast of `A` per row and one load of `B` per vector and step of `k`; the tile then goes
//! through the fused epilogue like the blocked template's. Panels are shared out among the
//! threads in contiguous chunks when the product is large enough.

use tilec_ir::DType;
use tilec_tile::ir::*;

use super::pack::{operand_params, uses_var};
use super::ukr::isa;
use super::{epilogue_code, operand_code, PackOperand, PackSlot};
use crate::render::{Ctx, RenderError, Renderer};

/// The most rows the template takes (its accumulators are `rows × vectors` registers).
pub const MAX_ROWS: i64 = 8;

/// Whether the template takes `g` (otherwise the blocked one renders it): few rows over all
/// batches, and one `B` for all of them (at one batch, `B` may name the batch variable: 0).
pub(crate) fn takes(g: &Gemm) -> bool {
    g.acc_dtype == DType::F32 && g.batch.saturating_mul(g.m) <= MAX_ROWS && (g.batch == 1 || !uses_var(&g.b, g.b_var))
}

/// Vector registers the accumulators may take.
fn acc_budget(vector_bytes: usize) -> i64 {
    match vector_bytes {
        64 => 24,
        32 => 12,
        _ => 6,
    }
}

/// Vectors per panel for `m` rows, and whether two accumulator sets fit.
pub(crate) fn panel_vectors(m: i64, vector_bytes: usize) -> (i64, bool) {
    let budget = acc_budget(vector_bytes);
    let v = (budget / m.max(1)).clamp(1, 4);
    (v, 2 * m * v <= budget)
}

/// The kernel for one panel of `nv` vectors: `c[m × nv·lanes] = a[m × k] · b[k × nv·lanes]`
/// (rows of `c` `ldc` apart).
fn panel_kernel(m: i64, nv: i64, dual: bool, vector_bytes: usize, fma: bool) -> (String, String) {
    let is = isa(false, vector_bytes, fma);
    let lanes = (vector_bytes / 4) as i64;
    let w = nv * lanes;
    let name = format!("tc_gemv_{m}x{nv}_w{vector_bytes}{}", if dual { "d" } else { "" });
    let guard = name.to_uppercase();
    let mut s = format!("#ifndef {guard}\n#define {guard}\n");
    s.push_str(&format!(
        "#if !({})\n#error \"the matrix-vector kernel needs a {vector_bytes}-byte vector ISA: compile for the CPU it was generated for\"\n#endif\n#include <immintrin.h>\n",
        is.cond
    ));
    s.push_str(&format!(
        "static void {name}(int64_t K, const float *TC_RESTRICT a, const float *TC_RESTRICT b, float *TC_RESTRICT c, int64_t ldc) {{\n"
    ));
    let sets: &[&str] = if dual { &["c", "d"] } else { &["c"] };
    for set in sets {
        for i in 0..m {
            for v in 0..nv {
                s.push_str(&format!("    {} {set}{i}_{v} = {}();\n", is.vty, is.zero));
            }
        }
    }
    let step = |s: &mut String, set: &str, koff: &str| {
        s.push_str("        {\n");
        for v in 0..nv {
            s.push_str(&format!("        const {} b{v} = {}(b + (k{koff}) * {w} + {});\n", is.vty, is.load, v * lanes));
        }
        for i in 0..m {
            s.push_str(&format!("        {{ const {} ai = {}(a[{i} * K + k{koff}]);", is.vty, is.set1));
            for v in 0..nv {
                let acc = format!("{set}{i}_{v}");
                match is.fma {
                    Some(f) => s.push_str(&format!(" {acc} = {f}(ai, b{v}, {acc});")),
                    None => s.push_str(&format!(" {acc} = {}({acc}, {}(ai, b{v}));", is.add, is.mul)),
                }
            }
            s.push_str(" }\n");
        }
        s.push_str("        }\n");
    };
    s.push_str("    int64_t k = 0;\n");
    if dual {
        s.push_str("    for (; k + 2 <= K; k += 2) {\n");
        step(&mut s, "c", "");
        step(&mut s, "d", " + 1");
        s.push_str("    }\n");
    }
    s.push_str("    #pragma GCC unroll 2\n    for (; k < K; ++k) {\n");
    step(&mut s, "c", "");
    s.push_str("    }\n");
    for i in 0..m {
        for v in 0..nv {
            let acc = if dual { format!("{}(c{i}_{v}, d{i}_{v})", is.add) } else { format!("c{i}_{v}") };
            s.push_str(&format!("    {}(c + {i} * ldc + {}, {acc});\n", is.storeu, v * lanes));
        }
    }
    s.push_str("}\n#endif\n");
    (s, name)
}

/// Renders `g` (marked `vector`, and [`takes`] holds) into `r`: row `r` of the template is
/// row `r % m` of batch `r / m`.
pub(crate) fn render_gemv(r: &mut Renderer, g: &Gemm, ctx: Ctx) -> Result<(), RenderError> {
    let cpu = r.opts.cpu.clone();
    let vb = cpu.vector_bytes;
    let lanes = (vb / 4) as i64;
    let (m, n, k) = (g.batch * g.m, g.n, g.k);
    let per = g.m.max(1);
    let (v, dual) = panel_vectors(m, vb);
    let nr = v * lanes;
    // The kernels: full panels, and the narrower last one.
    let panels = (n + nr - 1) / nr;
    let tail_nv = ((n - (panels - 1) * nr) + lanes - 1) / lanes;
    let (src, full) = panel_kernel(m, v, dual, vb, cpu.fma);
    if !r.pre.contains(&src) {
        r.pre.push_str(&src);
    }
    let (src, tail) = panel_kernel(m, tail_nv, dual, vb, cpu.fma);
    if !r.pre.contains(&src) {
        r.pre.push_str(&src);
    }
    let acc_ty = Ty::Elem(DType::F32);
    let (vb_, vi, vj, vk) = (r.var_name(g.b_var), r.var_name(g.i_var), r.var_name(g.j_var), r.var_name(g.k_var));
    let (a_code, b_code) = operand_code(r, g, acc_ty)?;
    // One panel of B (columns j0.. of width w, zero past n) into `dst`.
    let pack_panel = |dst: &str, j0: &str, w: &str| {
        format!(
            r#"for (int64_t kk = 0; kk < {k}; ++kk) {{
                const int64_t {vk} = kk; (void){vk};
                for (int64_t jj = 0; jj < {w}; ++jj) {{
                    const int64_t {vj} = {j0} + jj;
                    {dst}[kk * {w} + jj] = {vj} < {n} ? {b_code} : 0.0f;
                }}
            }}"#
        )
    };
    let npad = (n + lanes - 1) / lanes * lanes;
    let ppb = match operand_params(r, &g.b, &[g.b_var, g.j_var, g.k_var]) {
        Some(ps) => {
            let code = format!(
                r#"{{ /* B of matrix-vector product {m} x {n} x {k} in panels of {nr} columns */
    float *TC_RESTRICT pdst = (float *)tc_dst;
    const int64_t {vb_} = 0; (void){vb_}; /* B is one for every batch */
    for (int64_t p = 0; p < {panels}; ++p) {{
        const int64_t j0 = p * {nr}, w = p + 1 < {panels} ? {nr} : {tail_w};
        float *TC_RESTRICT dst = pdst + p * {k} * {nr};
        {fill}
    }}
}}"#,
                tail_w = tail_nv * lanes,
                fill = pack_panel("dst", "j0", "w"),
            );
            let s = r.packs.len();
            r.packs.push((PackSlot { operand: PackOperand::B, params: ps, bytes: (k.saturating_mul(npad).saturating_mul(4) as usize).max(64) }, code));
            format!("(tc_pk ? (const float *)tc_pk[{s}] : NULL)")
        }
        None => "NULL".into(),
    };
    let (epilogue, acc_decl, simd) = epilogue_code(r, g, &format!("ct[ii * {nr} + jj]"), acc_ty)?;
    let simd_pragma = if simd { "#pragma omp simd" } else { "" };
    let code = format!(
        r#"{{
    /* Chunk tc_c of tc_n: a contiguous run of panels. */
    int64_t p0, p1;
    tc_chunk_range({panels}, tc_c, tc_n, &p0, &p1);
    if (p0 < p1) {{
        float *TC_RESTRICT pa = (float *)tc_scratch(0, sizeof(float) * {m} * {kst});
        for (int64_t ii = 0; ii < {m}; ++ii) {{
            const int64_t {vb_} = ii / {per}, {vi} = ii % {per}; (void){vb_}; (void){vi};
            for (int64_t kk = 0; kk < {k}; ++kk) {{
                const int64_t {vk} = kk; (void){vk};
                pa[ii * {kst} + kk] = {a_code};
            }}
        }}
        const float *ppb = {ppb};
        float *TC_RESTRICT pb = ppb ? NULL : (float *)tc_scratch(1, sizeof(float) * {nr} * {kst});
        for (int64_t p = p0; p < p1; ++p) {{
            const int64_t j0 = p * {nr}, w = p + 1 < {panels} ? {nr} : {tail_w};
            const float *TC_RESTRICT bp = ppb ? ppb + p * {k} * {nr} : pb;
            if (!ppb) {{
                const int64_t {vb_} = 0; (void){vb_};
                {fill}
            }}
            float ct[{ctn}] __attribute__((aligned(64)));
            if (w == {nr}) {full}({k}, pa, bp, ct, {nr}); else {tail}({k}, pa, bp, ct, {nr});
            const int64_t nre = {n} - j0 < w ? {n} - j0 : w;
            for (int64_t ii = 0; ii < {m}; ++ii) {{
                const int64_t {vb_} = ii / {per}, {vi} = ii % {per}; (void){vb_};
                {simd_pragma}
                for (int64_t jj = 0; jj < nre; ++jj) {{
                    const int64_t {vj} = j0 + jj;
                    {acc_decl}
{epilogue}                }}
            }}
        }}
    }}
}}"#,
        kst = k.max(1),
        tail_w = tail_nv * lanes,
        ctn = m * nr,
        fill = pack_panel("pb", "j0", "w"),
    );
    r.line(&format!("/* matrix-vector product {m} x {n} x {k}: panels of {nr} columns{} */", if dual { ", two accumulator sets" } else { "" }));
    let emit = |r: &mut Renderer| {
        for l in code.lines() {
            r.line(l);
        }
    };
    // Parallel when its weights alone (a load and a multiply-add each) are enough work.
    let work = k.saturating_mul(n).saturating_mul(2);
    if !ctx.in_parallel && !ctx.in_simd && panels > 1 && work >= r.opts.loop_parallel_min_work {
        r.parallel_region(&format!("tc_loop_chunks({panels}LL)"), |r| {
            emit(r);
            Ok(())
        })
    } else {
        r.line("{");
        r.line("const int64_t tc_n = 1, tc_c = 0;");
        emit(r);
        r.line("}");
        Ok(())
    }
}
