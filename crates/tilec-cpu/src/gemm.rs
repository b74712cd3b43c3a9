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
use crate::render::{convert, value_type, Ctx, RenderError, Renderer};

/// Chooses the blocking of an `m × n × k` single-precision product for `cpu`.
pub fn gemm_params(m: i64, n: i64, k: i64, cpu: &CpuInfo) -> GemmParams {
    let (mr, nr) = if cpu.avx512f {
        (12, 32)
    } else if cpu.avx2 {
        (6, 16)
    } else {
        (4, 8)
    };
    // A B micro-panel (kc × nr) stays in L1 while the A panels stream past it.
    let kc = ((cpu.l1d_bytes / 2) / (nr as usize * 4)).clamp(64, 512) as i64;
    // The A block (mc × kc) stays in L2.
    let mc_raw = ((cpu.l2_bytes / 2) / (kc as usize * 4)).clamp(mr as usize, 4096) as i64;
    let mut mc = (mc_raw / mr).max(1) * mr;
    let nc = 4096i64;
    let kc = kc.min(k.max(1));
    mc = mc.min(round_up(m.max(1), mr));
    let nc = nc.min(round_up(n.max(1), nr));
    GemmParams { mr, nr, kc, mc, nc }
}

fn round_up(x: i64, m: i64) -> i64 {
    (x + m - 1) / m * m
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
    let t = if double { "double" } else { "float" };
    let vb = b.lanes as usize * if double { 8 } else { 4 };
    let is = isa(double, vb, cpu.fma);
    let nv = b.nr / b.lanes;
    let (mr, nr, lanes) = (b.mr, b.nr, b.lanes);
    let name = format!("tc_ukr_{t}_{mr}x{nr}_w{vb}");
    let guard = name.to_uppercase();
    let mut s = String::new();
    s.push_str(&format!("#ifndef {guard}\n#define {guard}\n"));
    s.push_str(&format!("#if !({})\n#error \"the GEMM micro-kernel needs a {}-byte vector ISA: compile for the CPU it was generated for\"\n#endif\n", is.cond, vb));
    s.push_str("#include <immintrin.h>\n");
    s.push_str(&format!(
        "static __attribute__((noinline)) void {name}(int64_t kc, const {t} *TC_RESTRICT a, const {t} *TC_RESTRICT b, const {t} *TC_RESTRICT cin, int64_t ldi, {t} *TC_RESTRICT cout, int64_t ldo) {{\n"
    ));
    for i in 0..mr {
        for v in 0..nv {
            s.push_str(&format!("    {} c{i}_{v} = {}();\n", is.vty, is.zero));
        }
    }
    s.push_str("    #pragma GCC unroll 4\n    for (int64_t k = 0; k < kc; ++k) {\n");
    for v in 0..nv {
        s.push_str(&format!(
            "        {} b{v} = {}(b + k * {nr} + {});\n",
            is.vty,
            is.load,
            v * lanes
        ));
    }
    for i in 0..mr {
        s.push_str(&format!(
            "        {{ {} ai = {}(a[k * {mr} + {i}]);",
            is.vty, is.set1
        ));
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
    s.push_str("    }\n    if (cin) {\n");
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
    let (ukr_src, ukr) = micro_kernel(double, &bl, &cpu);
    if !r.pre.contains(&ukr_src) {
        r.pre.push_str(&ukr_src);
    }
    let Blocking {
        mr,
        nr,
        kc: kcb,
        mc: mcb,
        nc: ncb,
        ..
    } = bl;
    let (m, n, k, batch) = (g.m, g.n, g.k, g.batch);
    let (vb, vi, vj, vk, vacc) = (
        r.var_name(g.b_var),
        r.var_name(g.i_var),
        r.var_name(g.j_var),
        r.var_name(g.k_var),
        r.var_name(g.acc_var),
    );
    let id = r.fresh("g");
    let par = parallel_clause(r, g, ctx);
    let need_ws = k > kcb;
    r.line(&format!("{{ /* gemm {batch} x {m} x {n} x {k}, blocks mr={mr} nr={nr} kc={kcb} mc={mcb} nc={ncb} */"));
    r.open_scope();
    r.line(&format!(
        "{t} *TC_RESTRICT {id}_pa = ({t} *)tc_alloc(sizeof({t}) * {});",
        mcb * kcb
    ));
    r.line(&format!(
        "{t} *TC_RESTRICT {id}_pb = ({t} *)tc_alloc(sizeof({t}) * {});",
        kcb * ncb
    ));
    if need_ws {
        r.line(&format!(
            "{t} *TC_RESTRICT {id}_cw = ({t} *)tc_alloc(sizeof({t}) * {});",
            round_up(m, mr) * ncb
        ));
    } else {
        r.line(&format!("{t} *TC_RESTRICT {id}_cw = NULL;"));
    }
    r.line(&format!("#pragma omp parallel {par}"));
    r.line("{");
    r.open_scope();
    r.line(&format!(
        "for (int64_t {vb} = 0; {vb} < {batch}; ++{vb}) {{"
    ));
    r.open_scope();
    r.declare(g.b_var);
    r.line(&format!("for (int64_t jc = 0; jc < {n}; jc += {ncb}) {{"));
    r.open_scope();
    r.line(&format!(
        "const int64_t nc = {n} - jc < {ncb} ? {n} - jc : {ncb};"
    ));
    r.line(&format!(
        "for (int64_t pc = 0; pc < {}; pc += {kcb}) {{",
        k.max(1)
    ));
    r.open_scope();
    r.line(&format!(
        "const int64_t kc = {k} - pc < {kcb} ? {k} - pc : {kcb};"
    ));
    r.line(&format!("const int last = pc + {kcb} >= {k};"));

    // Pack B: panel p (columns jp .. jp+nr) at pb + jp * kc, row kk at + kk * nr.
    r.line("#pragma omp for schedule(static)");
    r.line(&format!("for (int64_t jp = 0; jp < nc; jp += {nr}) {{"));
    r.open_scope();
    r.line(&format!("{t} *TC_RESTRICT dst = {id}_pb + jp * kc;"));
    r.line("for (int64_t kk = 0; kk < kc; ++kk) {");
    r.open_scope();
    r.line(&format!("const int64_t {vk} = pc + kk;"));
    r.declare(g.k_var);
    for full in [true, false] {
        let head = if full {
            format!("if (jp + {nr} <= nc) {{")
        } else {
            "} else {".to_string()
        };
        r.line(&head);
        r.open_scope();
        r.line("#pragma omp simd");
        r.line(&format!("for (int64_t jj = 0; jj < {nr}; ++jj) {{"));
        r.open_scope();
        r.line(&format!("const int64_t {vj} = jc + jp + jj;"));
        r.declare(g.j_var);
        let (bc, bt) = r.expr(&g.b)?;
        let bc = convert(&bc, bt, acc_ty);
        if full {
            r.line(&format!("dst[kk * {nr} + jj] = {bc};"));
        } else {
            r.line(&format!(
                "dst[kk * {nr} + jj] = jp + jj < nc ? {bc} : ({t})0;"
            ));
        }
        r.close_scope();
        r.line("}");
        r.close_scope();
    }
    r.line("}");
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("}");

    r.line(&format!("for (int64_t ic = 0; ic < {m}; ic += {mcb}) {{"));
    r.open_scope();
    r.line(&format!(
        "const int64_t mc = {m} - ic < {mcb} ? {m} - ic : {mcb};"
    ));
    // Pack A: panel (rows ip .. ip+mr) at pa + ip * kc, element (kk, ii) at + kk * mr + ii.
    r.line("#pragma omp for schedule(static)");
    r.line(&format!("for (int64_t ip = 0; ip < mc; ip += {mr}) {{"));
    r.open_scope();
    r.line(&format!("{t} *TC_RESTRICT dst = {id}_pa + ip * kc;"));
    r.line(&format!("for (int64_t ii = 0; ii < {mr}; ++ii) {{"));
    r.open_scope();
    r.line(&format!("const int64_t {vi} = ic + ip + ii;"));
    r.declare(g.i_var);
    r.line("if (ip + ii < mc) {");
    r.open_scope();
    r.line("for (int64_t kk = 0; kk < kc; ++kk) {");
    r.open_scope();
    r.line(&format!("const int64_t {vk} = pc + kk;"));
    r.declare(g.k_var);
    let (ac, at) = r.expr(&g.a)?;
    let ac = convert(&ac, at, acc_ty);
    r.line(&format!("dst[kk * {mr} + ii] = {ac};"));
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("} else {");
    r.line(&format!(
        "    for (int64_t kk = 0; kk < kc; ++kk) dst[kk * {mr} + ii] = ({t})0;"
    ));
    r.line("}");
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("}");

    // Tiles of the block, column panels outermost so a B panel is reused from L1.
    r.line(&format!(
        "const int64_t nir = (mc + {mr} - 1) / {mr}, njr = (nc + {nr} - 1) / {nr};"
    ));
    r.line("#pragma omp for schedule(static)");
    r.line("for (int64_t tile = 0; tile < nir * njr; ++tile) {");
    r.open_scope();
    r.line(&format!(
        "const int64_t ir = (tile % nir) * {mr}, jr = (tile / nir) * {nr};"
    ));
    r.line(&format!(
        "{t} ct[{}] __attribute__((aligned(64)));",
        mr * nr
    ));
    r.line(&format!(
        "const {t} *cin = pc > 0 ? {id}_cw + (ic + ir) * {ncb} + jr : NULL;"
    ));
    r.line(&format!(
        "{t} *cout = last ? ct : {id}_cw + (ic + ir) * {ncb} + jr;"
    ));
    r.line(&format!(
        "{ukr}(kc, {id}_pa + ir * kc, {id}_pb + jr * kc, cin, {ncb}, cout, last ? {nr} : {ncb});"
    ));
    r.line("if (last) {");
    r.open_scope();
    r.line(&format!("const int64_t mre = mc - ir < {mr} ? mc - ir : {mr}, nre = nc - jr < {nr} ? nc - jr : {nr};"));
    r.line("for (int64_t ii = 0; ii < mre; ++ii) {");
    r.open_scope();
    r.line(&format!("const int64_t {vi} = ic + ir + ii;"));
    r.declare(g.i_var);
    let simd = simple_epilogue(&g.epilogue);
    if simd {
        r.line("#pragma omp simd");
    }
    r.line("for (int64_t jj = 0; jj < nre; ++jj) {");
    r.open_scope();
    r.line(&format!("const int64_t {vj} = jc + jr + jj;"));
    r.declare(g.j_var);
    let acc_var_ty = r.k.var_info(g.acc_var).ty;
    r.line(&format!(
        "const {} {vacc} = {};",
        value_type(acc_var_ty),
        convert(&format!("ct[ii * {nr} + jj]"), acc_ty, acc_var_ty)
    ));
    r.declare(g.acc_var);
    let ectx = Ctx {
        in_parallel: true,
        in_simd: simd,
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
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("}");
    r.close_scope();
    r.line("}");
    r.line(&format!("free({id}_pa); free({id}_pb); free({id}_cw);"));
    r.close_scope();
    r.line("}");
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
