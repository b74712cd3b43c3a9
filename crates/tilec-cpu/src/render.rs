//! Rendering of tile-IR kernels to C.
//!
//! A kernel becomes `void NAME(void *const *args)`; `args[i]` points at the first element of
//! `k.params[i]` (dense, row-major). Scalars follow the interpreter's semantics: floats compute in
//! their own precision (f16, bf16 and fp8 values are held in `float` and rounded after every
//! operation), integer arithmetic wraps, integer division by zero yields 0 and float-to-integer
//! conversions saturate instead of invoking undefined behaviour.
//!
//! Global arguments are declared `restrict`: distinct arguments must not overlap.
//!
//! A kernel with index checks (`Kernel::checks`) takes the run's status as one more argument,
//! `args[params.len()]` (`STATUS_WORDS` 64-bit words), which `tc_index` updates.

use std::collections::HashSet;
use std::fmt::Write;

use tilec_ir::DType;
use tilec_tile::cexpr::{self, CStyle, CTarget, IntFn};
use tilec_tile::ir::*;

use crate::cpuinfo::CpuInfo;
use crate::gemm;

/// The C helpers every translation unit starts with.
pub const PRELUDE: &str = include_str!("c/prelude.h");

/// Why a kernel cannot be rendered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("kernel {kernel}: {msg}")]
pub struct RenderError {
    pub kernel: String,
    pub msg: String,
}

/// Options of the renderer.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// The machine the code is compiled for (vector width of the GEMM template).
    pub cpu: CpuInfo,
    /// Gemms with fewer multiply-adds than this run on one thread.
    pub gemm_parallel_min_flops: i64,
    /// Parallel loops whose estimated work (`region::loop_work`) is below this run on one
    /// thread.
    pub loop_parallel_min_work: i64,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            cpu: CpuInfo::host(),
            gemm_parallel_min_flops: 1 << 18,
            loop_parallel_min_work: crate::region::LOOP_PARALLEL_MIN_WORK,
        }
    }
}

/// Renders `k` as a complete C translation unit (helpers plus the kernel function, named after
/// the kernel with characters outside `[A-Za-z0-9_]` replaced by `_`).
pub fn render_c(k: &Kernel) -> Result<String, RenderError> {
    render_c_with(k, &RenderOptions::default())
}

/// [`render_c`] with explicit options.
pub fn render_c_with(k: &Kernel, opts: &RenderOptions) -> Result<String, RenderError> {
    let body = render_function(k, &c_symbol(&k.name), opts)?;
    Ok(format!("{PRELUDE}\n{body}"))
}

/// A C identifier for a kernel name.
pub fn c_symbol(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.as_bytes()[0].is_ascii_digit() {
        s.insert_str(0, "k_");
    }
    s
}

/// Renders only the kernel function (no prelude), named `symbol`. Identifiers inside are derived
/// from buffer and variable ids only, so structurally identical kernels render identically.
pub fn render_function(
    k: &Kernel,
    symbol: &str,
    opts: &RenderOptions,
) -> Result<String, RenderError> {
    Ok(render_function_packs(k, symbol, opts)?.0)
}

/// [`render_function`], also returning the gemm operands that can be packed ahead of the calls.
///
/// When there are any, the code also defines `SYMBOL__packed(args, packed)`, which reads the
/// operand of slot `s` from `packed[s]` where that is not null, and `SYMBOL__pack(args, s, dst)`,
/// which writes slot `s`'s operand to `dst` ([`gemm::PackSlot`] describes both).
pub fn render_function_packs(
    k: &Kernel,
    symbol: &str,
    opts: &RenderOptions,
) -> Result<(String, Vec<gemm::PackSlot>), RenderError> {
    let written = written_buffers(k);
    let mut r = Renderer {
        k,
        opts,
        symbol: symbol.to_string(),
        out: String::new(),
        pre: String::new(),
        indent: 1,
        declared: vec![HashSet::new()],
        heap: vec![vec![]],
        locals: vec![vec![]],
        written: written.clone(),
        regions: 0,
        packs: vec![],
    };
    r.validate()?;
    let mut head = String::new();
    for (i, &p) in k.params.iter().enumerate() {
        let b = k.buf(p);
        if b.scope != Scope::Global {
            return Err(r.err(format!("parameter {} is not a global buffer", b.name)));
        }
        let cst = if written.contains(&p) { "" } else { "const " };
        let _ = writeln!(
            head,
            "    {cst}{} *TC_RESTRICT buf{} = ({cst}{} *)args[{i}];",
            storage_type(b.dtype),
            p.0,
            storage_type(b.dtype)
        );
    }
    if !k.checks.is_empty() {
        let _ = writeln!(
            head,
            "    int64_t *const tc_st = (int64_t *)args[{}]; (void)tc_st;",
            k.params.len()
        );
    }
    r.block_stmts(&k.body, Ctx::default())?;
    let mut s = r.pre.clone();
    if r.packs.is_empty() {
        let _ = writeln!(s, "void {symbol}(void *const *args) {{");
        s.push_str(&head);
        s.push_str(&r.out);
        s.push_str("}\n");
        return Ok((s, vec![]));
    }
    let _ = writeln!(
        s,
        "static void {symbol}__impl(void *const *args, void *const *tc_pk) {{"
    );
    s.push_str(&head);
    s.push_str(&r.out);
    s.push_str("}\n");
    let _ = writeln!(
        s,
        "void {symbol}(void *const *args) {{ {symbol}__impl(args, NULL); }}"
    );
    let _ = writeln!(
        s,
        "void {symbol}__packed(void *const *args, void *const *tc_pk) {{ {symbol}__impl(args, tc_pk); }}"
    );
    let _ = writeln!(
        s,
        "void {symbol}__pack(void *const *args, int64_t tc_slot, void *tc_dst) {{"
    );
    s.push_str(&head);
    for (i, (_, code)) in r.packs.iter().enumerate() {
        let _ = writeln!(s, "    if (tc_slot == {i}) {code}");
    }
    s.push_str("}\n");
    Ok((s, r.packs.into_iter().map(|(p, _)| p).collect()))
}

fn written_buffers(k: &Kernel) -> HashSet<BufId> {
    let mut w = HashSet::new();
    for s in &k.body {
        s.visit(&mut |s| {
            if let Stmt::Store { buf, .. } = s {
                w.insert(*buf);
            }
        });
    }
    w
}

/// The C type a buffer element is stored as.
pub fn storage_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 => "uint16_t",
        DType::F8E4M3 | DType::F8E5M2 | DType::Bool | DType::U8 => "uint8_t",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::U16 => "uint16_t",
        DType::U32 => "uint32_t",
        DType::U64 => "uint64_t",
    }
}

/// The C type a scalar of type `t` is computed in.
pub fn value_type(t: Ty) -> &'static str {
    cexpr::value_ty(&C, t)
}

fn is_lowp(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
}

/// Code converting the value `code` of type `from` to type `to` (the interpreter's
/// `Val::convert` semantics).
pub(crate) fn convert(code: &str, from: Ty, to: Ty) -> String {
    cexpr::convert(&C, code, from, to)
}

/// Loads an element of storage type into its value type.
fn load_conv(d: DType, code: String) -> String {
    match d {
        DType::F16 => format!("tc_h2f({code})"),
        DType::BF16 => format!("tc_bf2f({code})"),
        DType::F8E4M3 => format!("tc_e4m32f({code})"),
        DType::F8E5M2 => format!("tc_e5m22f({code})"),
        _ => code,
    }
}

/// Encodes a value (already rounded/converted to `d`) for storage.
fn store_conv(d: DType, code: String) -> String {
    match d {
        DType::F16 => format!("tc_f2h({code})"),
        DType::BF16 => format!("tc_f2bf({code})"),
        DType::F8E4M3 => format!("tc_f2e4m3({code})"),
        DType::F8E5M2 => format!("tc_f2e5m2({code})"),
        _ => code,
    }
}

fn int_lit(x: i64) -> String {
    if x == i64::MIN {
        "(-9223372036854775807LL - 1)".into()
    } else if x < 0 {
        format!("({x}LL)")
    } else {
        format!("{x}LL")
    }
}

/// How C spells expressions (see [`cexpr`]): indices are `int64_t`, booleans `uint8_t`, math
/// on `float` goes through the prelude's vectorizable functions.
pub(crate) struct C;

impl CStyle for C {
    fn index_ty(&self) -> &'static str {
        "int64_t"
    }
    fn i64_ty(&self) -> &'static str {
        "int64_t"
    }
    fn u64_ty(&self) -> &'static str {
        "uint64_t"
    }
    fn storage_ty(&self, d: DType) -> &'static str {
        storage_type(d)
    }
    fn value_ty(&self, d: DType) -> &'static str {
        match d {
            DType::F64 => "double",
            DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => "float",
            d => storage_type(d),
        }
    }
    fn prefix(&self) -> &'static str {
        "tc_"
    }
    fn truth(&self, c: String) -> String {
        format!("((uint8_t)({c}))")
    }
    fn bool_lit(&self, b: bool) -> String {
        format!("((uint8_t){})", b as u8)
    }
    fn index_lit(&self, x: i64) -> String {
        int_lit(x)
    }
    fn nonfinite(&self, x: f64, dbl: bool) -> String {
        let t = if dbl { "(double)" } else { "" };
        if x.is_nan() {
            format!("({t}NAN)")
        } else if x > 0.0 {
            format!("({t}INFINITY)")
        } else {
            format!("(-{t}INFINITY)")
        }
    }
    fn round(&self, d: DType, code: String) -> String {
        match d {
            DType::F16 => format!("tc_rnd_f16({code})"),
            DType::BF16 => format!("tc_rnd_bf16({code})"),
            DType::F8E4M3 => format!("tc_rnd_e4m3({code})"),
            DType::F8E5M2 => format!("tc_rnd_e5m2({code})"),
            _ => code,
        }
    }
    fn short_circuit(&self) -> bool {
        false
    }
    fn int_fn(&self, f: IntFn, ct: &str, a: &str, b: &str) -> String {
        match f {
            IntFn::Min => format!("({{ {ct} _a = ({a}), _b = ({b}); _a < _b ? _a : _b; }})"),
            IntFn::Max => format!("({{ {ct} _a = ({a}), _b = ({b}); _a > _b ? _a : _b; }})"),
            IntFn::Abs => format!(
                "({{ {ct} _a = ({a}); ({ct})(_a < 0 ? 0 - (uint64_t)_a : (uint64_t)_a); }})"
            ),
            IntFn::Sign => format!("({{ {ct} _a = ({a}); ({ct})((_a > 0) - (_a < 0)); }})"),
            IntFn::FloorDiv => format!("tc_ifloordiv({a}, {b})"),
            IntFn::FloorMod => format!("tc_ifloormod({a}, {b})"),
        }
    }
    fn math(&self, op: UnOp, d: DType, a: &str) -> Option<String> {
        let dbl = d == DType::F64;
        let (one, ft) = if dbl { ("1.0", "double") } else { ("1.0f", "float") };
        Some(match op {
            UnOp::Exp if !dbl => format!("tc_expf({a})"),
            UnOp::ExpNeg if !dbl => format!("tc_expnegf({a})"),
            UnOp::Tanh if !dbl => format!("tc_tanhf({a})"),
            UnOp::Erf if !dbl => format!("tc_erff({a})"),
            UnOp::Round if dbl => format!("__builtin_rint({a})"),
            UnOp::Round => format!("__builtin_rintf({a})"),
            UnOp::Sign => format!("({{ {ft} _a = ({a}); _a > 0 ? {one} : (_a < 0 ? -{one} : _a); }})"),
            UnOp::Sigmoid if dbl => format!("tc_sigmoid({a})"),
            UnOp::Sigmoid => format!("tc_sigmoidf({a})"),
            UnOp::GeluErf if dbl => format!("tc_gelu_erf({a})"),
            UnOp::GeluErf => format!("tc_gelu_erff({a})"),
            UnOp::GeluTanh if dbl => format!("tc_gelu_tanh({a})"),
            UnOp::GeluTanh => format!("tc_gelu_tanhf({a})"),
            UnOp::Silu if dbl => format!("tc_silu({a})"),
            UnOp::Silu => format!("tc_siluf({a})"),
            UnOp::IsNan => format!("__builtin_isnan({a})"),
            UnOp::IsInf => format!("__builtin_isinf({a})"),
            _ => return None,
        })
    }
}

#[derive(Copy, Clone, Default)]
pub(crate) struct Ctx {
    /// Inside a parallel loop: nested parallel loops render serial.
    pub in_parallel: bool,
    /// Inside an `omp simd` loop: no parallel regions allowed.
    pub in_simd: bool,
}

pub(crate) struct Renderer<'a> {
    pub k: &'a Kernel,
    pub opts: &'a RenderOptions,
    /// The kernel function's C name (its parallel regions are named after it).
    pub symbol: String,
    pub out: String,
    /// File-scope code the function needs (micro-kernels), emitted before it.
    pub pre: String,
    pub indent: usize,
    /// Variables declared in each open C scope.
    pub declared: Vec<HashSet<VarId>>,
    /// Heap-allocated local buffers of each open scope (freed at its end).
    pub heap: Vec<Vec<BufId>>,
    /// Local buffers allocated in each open scope.
    pub locals: Vec<Vec<BufId>>,
    /// Parameters the kernel writes (the others are `const`).
    pub written: HashSet<BufId>,
    /// Parallel regions outlined so far.
    pub regions: usize,
    /// Gemm operands packable ahead of the calls, with the C code that packs each into `tc_dst`.
    pub packs: Vec<(gemm::PackSlot, String)>,
}

/// Local buffers larger than this go on the heap.
pub(crate) const STACK_LIMIT_BYTES: i64 = 64 * 1024;

impl<'a> Renderer<'a> {
    pub fn err(&self, msg: impl Into<String>) -> RenderError {
        RenderError {
            kernel: self.k.name.clone(),
            msg: msg.into(),
        }
    }

    pub fn line(&mut self, s: &str) {
        for _ in 0..self.indent {
            self.out.push_str("    ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn validate(&self) -> Result<(), RenderError> {
        if self.k.params.is_empty() && self.k.body.is_empty() {
            return Ok(());
        }
        for b in &self.k.buffers {
            if b.shape.iter().any(|&d| d < 0) {
                return Err(self.err(format!(
                    "buffer {} has a negative dimension {:?}",
                    b.name, b.shape
                )));
            }
        }
        Ok(())
    }

    pub fn var_name(&self, v: VarId) -> String {
        format!("v{}", v.0)
    }

    fn is_declared(&self, v: VarId) -> bool {
        self.declared.iter().any(|s| s.contains(&v))
    }

    pub fn declare(&mut self, v: VarId) {
        if let Some(s) = self.declared.last_mut() {
            s.insert(v);
        }
    }

    pub fn open_scope(&mut self) {
        self.declared.push(HashSet::new());
        self.heap.push(vec![]);
        self.locals.push(vec![]);
        self.indent += 1;
    }

    pub fn close_scope(&mut self) {
        if let Some(bufs) = self.heap.pop() {
            for b in bufs {
                self.line(&format!("free(buf{});", b.0));
            }
        }
        self.declared.pop();
        self.locals.pop();
        self.indent -= 1;
    }

    /// Renders statements in a fresh C block scope (the caller emits the braces).
    /// At the top of the function body, a local buffer prepared from parameters alone gets a
    /// pack slot (`crate::prepare`).
    pub fn block_stmts(&mut self, stmts: &[Stmt], ctx: Ctx) -> Result<(), RenderError> {
        let top = self.declared.len() == 1;
        let mut frees = vec![];
        let mut i = 0;
        while i < stmts.len() {
            if let Some((b, params)) = top.then(|| crate::prepare::prepared(self, stmts, i)).flatten() {
                frees.extend(crate::prepare::render(self, b, params, &stmts[i + 1], ctx)?);
                i += 2;
                continue;
            }
            self.stmt(&stmts[i], ctx)?;
            i += 1;
        }
        for f in frees {
            self.line(&f);
        }
        // Free heap buffers of the outermost scope (function body).
        if self.declared.len() == 1 {
            if let Some(bufs) = self.heap.last_mut() {
                let bufs = std::mem::take(bufs);
                for b in bufs {
                    self.line(&format!("free(buf{});", b.0));
                }
            }
        }
        Ok(())
    }

    fn nested_block(&mut self, stmts: &[Stmt], ctx: Ctx) -> Result<(), RenderError> {
        self.open_scope();
        for s in stmts {
            self.stmt(s, ctx)?;
        }
        self.close_scope();
        Ok(())
    }

    pub fn stmt(&mut self, s: &Stmt, ctx: Ctx) -> Result<(), RenderError> {
        match s {
            Stmt::For(l) => self.for_loop(l, ctx),
            Stmt::Store { buf, index, value } => {
                let b = self.k.buf(*buf);
                let off = self.offset(*buf, index)?;
                let (v, t) = self.expr(value)?;
                let v = convert(&v, t, Ty::Elem(b.dtype));
                let v = store_conv(b.dtype, v);
                self.line(&format!("buf{}[{off}] = {v};", buf.0));
                Ok(())
            }
            Stmt::Let { var, value } => {
                let info = self.k.var_info(*var);
                let (v, t) = self.expr(value)?;
                let v = convert(&v, t, info.ty);
                let name = self.var_name(*var);
                if self.declared.last().is_some_and(|s| s.contains(var)) {
                    self.line(&format!("{name} = {v};"));
                } else {
                    self.line(&format!("{} {name} = {v};", value_type(info.ty)));
                    self.declare(*var);
                }
                Ok(())
            }
            Stmt::Assign { var, value } => {
                let info = self.k.var_info(*var);
                if !self.is_declared(*var) {
                    return Err(self.err(format!(
                        "assignment to variable {} before its definition",
                        info.name
                    )));
                }
                let (v, t) = self.expr(value)?;
                let v = convert(&v, t, info.ty);
                self.line(&format!("{} = {v};", self.var_name(*var)));
                Ok(())
            }
            Stmt::Alloc(b) => {
                let buf = self.k.buf(*b);
                if buf.scope == Scope::Global {
                    return Err(self.err(format!("Alloc of global buffer {}", buf.name)));
                }
                let n = buf.numel().max(1);
                let t = storage_type(buf.dtype);
                if let Some(l) = self.locals.last_mut() {
                    l.push(*b);
                }
                let bytes = n.saturating_mul(buf.dtype.size_bytes() as i64);
                if bytes > STACK_LIMIT_BYTES && buf.scope != Scope::Register {
                    self.line(&format!(
                        "{t} *TC_RESTRICT buf{} = ({t} *)tc_alloc({bytes});",
                        b.0
                    ));
                    if let Some(h) = self.heap.last_mut() {
                        h.push(*b);
                    }
                } else {
                    self.line(&format!(
                        "{t} buf{}[{n}] __attribute__((aligned(64)));",
                        b.0
                    ));
                }
                Ok(())
            }
            Stmt::If { cond, then_, else_ } => {
                let (c, _) = self.expr(cond)?;
                self.line(&format!("if ({c}) {{"));
                self.nested_block(then_, ctx)?;
                if !else_.is_empty() {
                    self.line("} else {");
                    self.nested_block(else_, ctx)?;
                }
                self.line("}");
                Ok(())
            }
            // A CPU "block" is one thread: barriers and cross-thread combines are no-ops.
            Stmt::Barrier | Stmt::BlockReduce { .. } => Ok(()),
            Stmt::Gemm(g) => gemm::render_gemm(self, g, ctx),
        }
    }

    fn for_loop(&mut self, l: &Loop, ctx: Ctx) -> Result<(), RenderError> {
        let v = self.var_name(l.var);
        let mut inner = ctx;
        match l.kind {
            LoopKind::Parallel if !ctx.in_parallel && !ctx.in_simd => {
                if l.extent > 1
                    && crate::region::loop_work(l) >= self.opts.loop_parallel_min_work
                {
                    return self.parallel_loop(l, ctx);
                }
                inner.in_parallel = true;
            }
            LoopKind::Vectorized if !ctx.in_simd => match self.simd_clause(l) {
                Some(clause) => {
                    self.line(&format!("#pragma omp simd{clause}"));
                    inner.in_simd = true;
                }
                None => self.line("#pragma GCC ivdep"),
            },
            LoopKind::Unrolled => {
                let n = l.extent.clamp(1, 1024);
                self.line(&format!("#pragma GCC unroll {n}"));
            }
            _ => {}
        }
        self.line(&format!(
            "for (int64_t {v} = 0; {v} < {}; ++{v}) {{",
            l.extent
        ));
        self.open_scope();
        self.declare(l.var);
        for s in &l.body {
            self.stmt(s, inner)?;
        }
        self.close_scope();
        self.line("}");
        Ok(())
    }

    /// The clause of an `omp simd` pragma for a vectorized loop, or `None` when the body updates
    /// variables defined outside it in a way that is not a plain sum (then the loop is left to
    /// the compiler's own vectorizer).
    fn simd_clause(&self, l: &Loop) -> Option<String> {
        let mut local = HashSet::new();
        let mut outer_assigned: Vec<(VarId, bool)> = vec![];
        let mut has_gemm = false;
        for s in &l.body {
            s.visit(&mut |s| match s {
                Stmt::Let { var, .. } => {
                    local.insert(*var);
                }
                Stmt::For(inner) => {
                    local.insert(inner.var);
                }
                Stmt::Gemm(_) => has_gemm = true,
                _ => {}
            });
        }
        if has_gemm {
            return None;
        }
        for s in &l.body {
            s.visit(&mut |s| {
                if let Stmt::Assign { var, value } = s {
                    if !local.contains(var) {
                        let is_sum = matches!(value, Expr::Binary(BinOp::Add, a, b)
                            if **a == Expr::Var(*var) && !b.uses_var(*var) || **b == Expr::Var(*var) && !a.uses_var(*var));
                        outer_assigned.push((*var, is_sum));
                    }
                }
            });
        }
        if outer_assigned.is_empty() {
            return Some(String::new());
        }
        if outer_assigned.iter().all(|(_, s)| *s) {
            let mut vars: Vec<VarId> = outer_assigned.iter().map(|(v, _)| *v).collect();
            vars.sort();
            vars.dedup();
            // Reductions only on types C can reduce with `+` directly.
            if vars.iter().any(
                |v| matches!(self.k.var_info(*v).ty, Ty::Elem(d) if is_lowp(d) || d == DType::Bool),
            ) {
                return None;
            }
            let names: Vec<String> = vars.iter().map(|v| self.var_name(*v)).collect();
            return Some(format!(" reduction(+:{})", names.join(",")));
        }
        None
    }

    /// The linear element offset of a multi-dimensional index.
    pub fn offset(&mut self, b: BufId, index: &[Expr]) -> Result<String, RenderError> {
        let buf = self.k.buf(b);
        if index.len() != buf.shape.len() {
            return Err(self.err(format!(
                "{} has rank {}, indexed with {} indices",
                buf.name,
                buf.shape.len(),
                index.len()
            )));
        }
        let strides = buf.strides();
        // The offset as an affine sum over atoms, with `(x / a) * a*c + (x % a) * c` folded
        // back to `x * c` (exact for C's truncating division): re-indexing through reshapes
        // leaves such pairs, and without the fold every access pays for divisions.
        let terms: Vec<(Expr, i64)> = index.iter().cloned().zip(strides.iter().copied()).collect();
        let (atoms, konst) = tilec_tile::affine::linear_offset(&terms)
            .unwrap_or_else(|| (terms.iter().map(|(e, s)| (*s, e.clone())).collect(), 0));
        let mut terms = vec![];
        for (c, e) in &atoms {
            if *c == 0 {
                continue;
            }
            let (code, t) = self.expr(e)?;
            let code = convert(&code, t, Ty::Index);
            terms.push(if *c == 1 { code } else { format!("({code}) * {c}") });
        }
        if konst != 0 || terms.is_empty() {
            terms.push(int_lit(konst));
        }
        Ok(terms.join(" + "))
    }

    /// Renders an expression: its C code and its type.
    pub fn expr(&mut self, e: &Expr) -> Result<(String, Ty), RenderError> {
        cexpr::expr(self, e)
    }
}

impl CTarget for Renderer<'_> {
    type Style = C;
    type Error = RenderError;
    fn style(&self) -> &C {
        &C
    }
    fn error(&self, msg: String) -> RenderError {
        self.err(msg)
    }
    fn kernel(&self) -> &Kernel {
        self.k
    }
    fn var(&mut self, v: VarId) -> Result<String, RenderError> {
        if !self.is_declared(v) {
            return Err(self.err(format!(
                "variable {} read before it is set",
                self.k.var_info(v).name
            )));
        }
        Ok(self.var_name(v))
    }
    fn load(&mut self, b: BufId, idx: &[Expr]) -> Result<String, RenderError> {
        let off = self.offset(b, idx)?;
        Ok(load_conv(self.k.buf(b).dtype, format!("buf{}[{off}]", b.0)))
    }
    fn check_index(&mut self, c: IndexCheck, i: String) -> String {
        format!("tc_index(tc_st, {}, {i}, {}, {})", c.site, int_lit(c.len), c.wrap as i32)
    }
}
