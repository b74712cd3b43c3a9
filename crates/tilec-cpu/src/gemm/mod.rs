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
//! padding. An `A` with an in-place form is not packed but read through row pointers.
//!
//! `ukr.rs` generates the micro-kernels, `pack.rs` the operand code (pack slots, im2col
//! packing loops, in-place piece tables); this file the blocking and the loop nest.

use tilec_ir::DType;
use tilec_tile::ir::*;

mod gemv;
mod pack;
mod ukr;

pub use gemv::MAX_ROWS as GEMV_MAX_ROWS;

use crate::cpuinfo::CpuInfo;
use crate::render::{convert, value_type, Ctx, RenderError, Renderer};
use pack::{im2col_form, im2col_of, im2col_pack, im2col_pack_a, im2col_pack_avx2, unit_columns, indirect_code, k_contiguous, operand_params, uses_var};
use tilec_tile::indirect::indirect_form;
use ukr::{micro_kernel, micro_kernel_indirect};

/// Shortest piece (elements of `k`) for which the indirect micro-kernel tests whether a row
/// tile reads only the zero buffer.
const SKIP_MIN_PIECE: i64 = 64;

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
    let kc = (((cpu.l1_bytes * 3 / 2) / (nr as usize * 4)) / 8 * 8).clamp(64, 512) as i64;
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
    /// Not a gemm operand: a local buffer that a loop nest fills from parameters alone (the
    /// transposed weights of `cpu.depthwise`), written exactly as that nest writes it.
    Buffer,
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
    let lanes = cpu.lanes_of(elem_bytes as usize) as i64;
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
        DType::F32 if g.vector && gemv::takes(g) => gemv::render_gemv(r, g, ctx),
        DType::F32 | DType::F64 => render_blocked(r, g, ctx),
        _ => render_simple(r, g, ctx),
    }
}

/// Whether the gemm is a parallel region of its own: large enough, and not inside one.
fn is_parallel(r: &Renderer, g: &Gemm, ctx: Ctx) -> bool {
    let flops = g
        .batch
        .saturating_mul(g.m)
        .saturating_mul(g.n)
        .saturating_mul(g.k.max(1));
    !ctx.in_parallel && !ctx.in_simd && flops >= r.opts.gemm_parallel_min_flops
}

/// Whether the epilogue can run under `omp simd` (straight-line stores, lets and ifs).
fn simple_epilogue(stmts: &[Stmt]) -> bool {
    stmts.iter().all(|s| match s {
        Stmt::Store { .. } | Stmt::Let { .. } | Stmt::Barrier => true,
        Stmt::If { then_, else_, .. } => simple_epilogue(then_) && simple_epilogue(else_),
        _ => false,
    })
}

/// The gemm's epilogue rendered for the templates' tile loops (indented for them, with the
/// batch, row, column and accumulator variables in scope), the declaration of the
/// accumulator variable from the tile element `elem` (of type `acc_ty`), and whether the
/// epilogue can run under `omp simd`.
/// The C expressions of A's and B's element (converted to the accumulator type), with the
/// product's batch, row, column and K variables in scope.
pub(crate) fn operand_code(r: &mut Renderer, g: &Gemm, acc_ty: Ty) -> Result<(String, String), RenderError> {
    r.open_scope();
    for v in [g.b_var, g.i_var, g.j_var, g.k_var] {
        r.declare(v);
    }
    let a = r.expr(&g.a).map(|(c, t)| convert(&c, t, acc_ty));
    let b = r.expr(&g.b).map(|(c, t)| convert(&c, t, acc_ty));
    r.close_scope();
    Ok((a?, b?))
}

pub(crate) fn epilogue_code(r: &mut Renderer, g: &Gemm, elem: &str, acc_ty: Ty) -> Result<(String, String, bool), RenderError> {
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
    let vacc = r.var_name(g.acc_var);
    let acc_decl = format!("const {} {vacc} = {};", value_type(acc_var_ty), convert(elem, acc_ty, acc_var_ty));
    Ok((epilogue, acc_decl, simd))
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
            let (src, name) = micro_kernel_indirect(false, &bl, &cpu);
            if !r.pre.contains(&src) {
                r.pre.push_str(&src);
            }
            name
        }
        Some(x) => {
            // Only an operand with bounds checks has rows that read the zero buffer; the test
            // (a compare per row and piece) is paid back by the pieces skipped only where each
            // piece is long (a dilated convolution over many channels, not a grouped one's
            // pieces of 16 channels).
            let checked = x.leaves.iter().any(|l| !l.atoms.is_empty());
            let shortest = x.slices.iter().flatten().flatten().map(|p| p.len).min().unwrap_or(0);
            let (src, name) = micro_kernel_indirect(checked && shortest >= SKIP_MIN_PIECE, &bl, &cpu);
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
    let (vb, vi, vj, vk) = (
        r.var_name(g.b_var),
        r.var_name(g.i_var),
        r.var_name(g.j_var),
        r.var_name(g.k_var),
    );
    let par = is_parallel(r, g, ctx);

    // Operand expressions and the epilogue, rendered with the template's variables in scope.
    let (a_code, b_code) = operand_code(r, g, acc_ty)?;
    let (m, n, k, batch) = (g.m, g.n, g.k, g.batch);
    let kk = k.max(1);
    // Operands that can be packed ahead of the calls (see `PackSlot`).
    let (mpad, npad) = (round_up(m, mr), round_up(n, nr));
    let a_batched = uses_var(&g.a, g.b_var);
    let b_batched = uses_var(&g.b, g.b_var);
    let slot = |r: &mut Renderer, op: PackOperand, ps: Vec<usize>, code: String| -> String {
        let s = r.packs.len();
        let (rows, batched) = if op == PackOperand::B { (npad, b_batched) } else { (mpad, a_batched) };
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
        Some(f) if !double && !cpu.avx512f && cpu.avx2 && bl.lanes == 8 && nr % 8 == 0 && unit_columns(&f, g.j_var) => {
            Some(im2col_pack_avx2(r, g, &f, nr)?)
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
    let (epilogue, acc_decl, simd) = epilogue_code(r, g, &format!("ct[ii * {nr} + jj]"), acc_ty)?;
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
                "if (ppa) {ukr}(kc, pak + ir * kc, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});\n                        else {ukri}(tc_np, tc_plq, tc_ptr + ir * tc_np, tc_zero, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});"
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
                "if (ppa) {ukr}(kc, pak + ir * kc, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});\n                        else {ukri}(tc_np, tc_plq, tc_ptr + ir * tc_np, tc_zero, pbk + jr * kc, pc > 0 ? ws : NULL, {nr}, last ? ct : ws, {nr});"
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
        r#"{ind_tables}{{
    /* Each chunk computes its own block of C (no barriers): batches, else rows or columns,
       whichever costs less: its padded multiply-adds plus two per operand byte it reads
       (splitting columns makes every chunk read all of A, splitting rows all of B). */
    const int64_t nt = tc_n, tid = tc_c;
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
}}"#,
        ctn = mr * nr,
    );
    let ind_note = if ind.is_some() { ", A in place" } else { "" };
    r.line(&format!(
        "/* gemm {batch} x {m} x {n} x {k}: mr={mr} nr={nr} kc={kcb} mc={mcb} nc={ncb}{ind_note} */"
    ));
    let emit = |r: &mut Renderer| {
        for l in code.lines() {
            r.line(l);
        }
    };
    if par {
        // One chunk per thread: the blocks above are the threads' shares.
        r.parallel_region("tc_threads()", |r| {
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
    r.line(&format!(
        "/* gemm {} x {} x {} x {} ({d}) */",
        g.batch, g.m, g.n, g.k
    ));
    // The (batch, row) pairs, in contiguous chunks when the gemm is a parallel region.
    let rows = g.batch.saturating_mul(g.m);
    let body = |r: &mut Renderer, lo: &str, hi: &str| -> Result<(), RenderError> {
        r.line(&format!("for (int64_t tc_bi = {lo}; tc_bi < {hi}; ++tc_bi) {{"));
        r.open_scope();
        r.line(&format!("const int64_t {vb} = tc_bi / {m}, {vi} = tc_bi % {m};", m = g.m.max(1)));
        r.declare(g.b_var);
        r.declare(g.i_var);
        simple_row(r, g, ct, acc_ty, [&vj, &vk, &vacc])?;
        r.close_scope();
        r.line("}");
        Ok(())
    };
    if is_parallel(r, g, ctx) {
        r.parallel_region(&format!("tc_loop_chunks({rows}LL)"), |r| {
            r.line("int64_t tc_lo, tc_hi;");
            r.line(&format!("tc_chunk_range({rows}LL, tc_c, tc_n, &tc_lo, &tc_hi);"));
            body(r, "tc_lo", "tc_hi")
        })
    } else {
        body(r, "0", &format!("{rows}LL"))
    }
}

/// One row of [`render_simple`]: the columns, each a sum over `k` and the epilogue.
fn simple_row(
    r: &mut Renderer,
    g: &Gemm,
    ct: &str,
    acc_ty: Ty,
    [vj, vk, vacc]: [&str; 3],
) -> Result<(), RenderError> {
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
    Ok(())
}
