//! CUDA C++ rendering of tile-IR kernels.
//!
//! Kernel ABI: `extern "C" __global__ void NAME(T0* p0, T1* p1, ...)`, one typed pointer per
//! kernel parameter in `Kernel::params` order, each pointing at the first element of a dense,
//! row-major buffer and aligned to 16 bytes (the vectorized accesses rely on it; device
//! allocations and planned arena offsets with 16-byte alignment satisfy it). A kernel with index
//! checks (`Kernel::checks`) takes one more pointer, `long long* tl_st`: its status words
//! (`STATUS_WORDS`, zero before the run), which `tl_index` updates.
//!
//! Mapping of the IR:
//! - a loop bound to `BlockX/Y/Z` or `ThreadX/Y/Z` becomes `blockIdx`/`threadIdx`; the launch
//!   configuration takes the largest extent per axis and loops with a smaller one are guarded;
//! - other loops are plain `for` loops (`#pragma unroll` for unrolled and vectorized ones);
//!   a vectorized loop whose global loads or stores are contiguous and provably aligned moves
//!   them as 4/8/16-byte vectors;
//! - `Scope::Local` buffers are `__shared__` arrays, `Scope::Register` buffers thread-local
//!   arrays (a dimension indexed only by a thread index of its own extent is dropped: each
//!   thread holds its slice);
//! - `Barrier` is `__syncthreads()`, `BlockReduce` a warp-shuffle + shared-memory all-reduce;
//! - stores to global or shared memory outside thread loops run on thread 0 only (all threads
//!   execute the code outside thread loops redundantly);
//! - values of f16/bf16/fp8 type are computed in float and rounded to their type after every
//!   operation, as the interpreter does; min/max propagate NaN.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

use tilec_ir::DType;
use tilec_tile::affine::linear_offset;
use tilec_tile::cexpr::{self, CStyle, CTarget, IntFn};
use tilec_tile::*;

use crate::driver::LaunchConfig;
use crate::error::{CudaError, Result};

/// The helpers every generated module starts with.
pub const PRELUDE: &str = include_str!("prelude.cuh");

/// A rendered kernel: CUDA C++ source (prelude included) and how to launch it.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaSource {
    pub name: String,
    pub source: String,
    pub launch: LaunchConfig,
}

/// Renders a kernel as a complete CUDA C++ translation unit (prelude + kernel).
pub fn render_cuda(k: &Kernel) -> Result<String> {
    Ok(render(k)?.source)
}

/// Renders a kernel and derives its launch configuration.
pub fn render(k: &Kernel) -> Result<CudaSource> {
    let (body, launch) = render_function(k)?;
    Ok(CudaSource {
        name: k.name.clone(),
        source: format!("{PRELUDE}\n{body}"),
        launch,
    })
}

/// The launch configuration of a kernel: grid and block dimensions from its bound loops.
pub fn launch_config(k: &Kernel) -> Result<LaunchConfig> {
    Ok(Dims::of(k)?.config())
}

/// Renders only the `__global__` function (for modules holding several kernels after one
/// [`PRELUDE`]).
pub fn render_function(k: &Kernel) -> Result<(String, LaunchConfig)> {
    if !valid_ident(&k.name) {
        return Err(err(
            k,
            format!("kernel name {:?} is not a C identifier", k.name),
        ));
    }
    let dims = Dims::of(k)?;
    let launch = dims.config();
    let reg_drop = register_dims_to_drop(k);
    let wide = needs_64bit_index(k);
    let mut r = R {
        k,
        dims: &dims,
        reg_drop,
        out: String::new(),
        indent: 1,
        thread_depth: 0,
        vec_subst: vec![],
        style: Cuda { narrow: narrow_outputs(k) },
        bound: HashMap::new(),
        red_types: HashSet::new(),
        vec_count: 0,
        whole_vector_stores: false,
    };
    let mut body = String::new();
    std::mem::swap(&mut r.out, &mut body);
    r.block(&k.body)?;
    std::mem::swap(&mut r.out, &mut body);

    let mut out = String::new();
    // Parameters never stored to are `const __restrict__` (read through the non-coherent
    // cache).
    let params = param_list(k);
    let _ = writeln!(
        out,
        "extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{",
        launch.block.0 * launch.block.1 * launch.block.2,
        k.name,
        params.join(", ")
    );
    let _ = writeln!(
        out,
        "  typedef {} idx_t;",
        if wide { "long long" } else { "int" }
    );
    // Shared memory: every local buffer at function scope.
    for (i, buf) in k.buffers.iter().enumerate() {
        if buf.scope == Scope::Local {
            let _ = writeln!(
                out,
                "  __shared__ __align__(16) {} {}[{}];",
                storage_ty(buf.dtype),
                buf_name(k, BufId(i as u32)),
                buf.numel().max(1)
            );
        }
    }
    let mut reds: Vec<&String> = r.red_types.iter().collect();
    reds.sort();
    for t in reds {
        let _ = writeln!(out, "  __shared__ {t} tl_red_{}[32];", t.replace(' ', "_"));
    }
    out.push_str(&body);
    out.push_str("}\n");
    Ok((out, launch))
}

/// The parameter list of kernel `k` as rendered (typed pointers; never-stored ones `const`;
/// the status words last when the kernel checks indices).
pub fn param_list(k: &Kernel) -> Vec<String> {
    let stored = k.stored_buffers();
    k.params
        .iter()
        .map(|&b| {
            let buf = k.buf(b);
            let c = if stored.contains(&b) { "" } else { "const " };
            format!(
                "{c}{}* __restrict__ {}",
                storage_ty(buf.dtype),
                buf_name(k, b)
            )
        })
        .chain((!k.checks.is_empty()).then(|| "long long* __restrict__ tl_st".to_string()))
        .collect()
}

/// Renders the epilogue of a `Gemm` of kernel `k` as a `__device__` function that another
/// kernel (a GEMM family) calls once per output element:
///
/// `void NAME(<k's parameters>, long long b, long long i, long long j, float acc)`
///
/// with the gemm's batch, row and column variables and its f32 accumulator bound to the
/// arguments. Statements are rendered exactly as in [`render`] (same loads, stores, rounding).
/// Only straight-line code (stores, lets, ifs) is accepted: no loops, barriers or reductions.
pub fn render_gemm_epilogue_fn(k: &Kernel, g: &Gemm, fn_name: &str) -> Result<String> {
    check_epilogue(k, g, fn_name)?;
    let dims = Dims { grid: [1; 3], block: [1; 3] };
    let mut r = R::for_function(k, &dims);
    r.line("typedef long long idx_t;");
    for (v, arg) in [(g.b_var, "tl_b"), (g.i_var, "tl_i"), (g.j_var, "tl_j")] {
        let t = format!("const idx_t {} = {arg};", r.var(v)?);
        r.line(&t);
    }
    let t = format!("const float {} = tl_acc;", r.var(g.acc_var)?);
    r.line(&t);
    r.block(&g.epilogue)?;
    let mut params = param_list(k);
    params.extend(
        ["long long tl_b", "long long tl_i", "long long tl_j", "float tl_acc"].map(String::from),
    );
    Ok(format!(
        "static __device__ __forceinline__ void {fn_name}({}) {{\n{}}}\n",
        params.join(", "),
        r.out
    ))
}

/// Columns per call of a vector epilogue function ([`render_gemm_epilogue_vec_fn`]).
pub const EPILOGUE_VEC: usize = 8;

/// The epilogue of `g` over [`EPILOGUE_VEC`] adjacent columns at once:
///
/// `void NAME(<k's parameters>, long long b, long long i, long long jv, const float* acc)`
///
/// runs the epilogue for columns `jv * EPILOGUE_VEC + l` with accumulators `acc[l]`, as a
/// vectorized loop: a load or store whose address is contiguous along the columns and aligned
/// for every `jv` (row strides multiples of the vector) moves as whole 16-byte vectors, others
/// element by element. The caller passes only whole groups of columns inside N, and `acc`
/// 16-byte aligned.
pub fn render_gemm_epilogue_vec_fn(k: &Kernel, g: &Gemm, fn_name: &str) -> Result<String> {
    check_epilogue(k, g, fn_name)?;
    let mut assigned = false;
    for s in &g.epilogue {
        s.visit(&mut |s| {
            if let Stmt::Assign { var, .. } = s {
                assigned |= *var == g.j_var || *var == g.acc_var;
            }
        });
    }
    if assigned {
        return Err(err(k, "the epilogue assigns its column or accumulator".into()));
    }
    let mut kv = k.clone();
    let ty = kv.var_info(g.j_var).ty;
    let lane = kv.new_var("tl_l", ty, false);
    let jv = kv.new_var("tl_jv", ty, false);
    let acc = kv.buffer("tl_accv", DType::F32, vec![EPILOGUE_VEC as i64], Scope::Local);
    let col = Expr::add(Expr::mul(Expr::Var(jv), Expr::Int(EPILOGUE_VEC as i64)), Expr::Var(lane));
    let mut body = g.epilogue.clone();
    for st in &mut body {
        st.substitute(g.j_var, &col);
        st.substitute(g.acc_var, &Expr::Load(acc, vec![Expr::Var(lane)]));
    }
    let vloop = Stmt::For(Loop { var: lane, extent: EPILOGUE_VEC as i64, kind: LoopKind::Vectorized, body });
    let dims = Dims { grid: [1; 3], block: [1; 3] };
    let mut r = R::for_function(&kv, &dims);
    r.whole_vector_stores = true;
    r.line("typedef long long idx_t;");
    for (v, arg) in [(g.b_var, "tl_b"), (g.i_var, "tl_i"), (jv, "tl_jv")] {
        let t = format!("const idx_t {} = {arg};", r.var(v)?);
        r.line(&t);
    }
    r.block(&[vloop])?;
    let mut params = param_list(k);
    params.extend(["long long tl_b", "long long tl_i", "long long tl_jv"].map(String::from));
    params.push(format!("const float* __restrict__ {}", buf_name(&kv, acc)));
    Ok(format!(
        "static __device__ __forceinline__ void {fn_name}({}) {{\n{}}}\n",
        params.join(", "),
        r.out
    ))
}

/// What both epilogue functions accept: a C name, an f32 accumulator, straight-line code.
fn check_epilogue(k: &Kernel, g: &Gemm, fn_name: &str) -> Result<()> {
    if !valid_ident(fn_name) {
        return Err(err(k, format!("function name {fn_name:?} is not a C identifier")));
    }
    if g.acc_dtype != DType::F32 {
        return Err(err(
            k,
            format!("accumulator {} (an epilogue function takes f32)", g.acc_dtype.name()),
        ));
    }
    let mut bad = None;
    for s in &g.epilogue {
        s.visit(&mut |s| {
            if matches!(
                s,
                Stmt::For(_) | Stmt::Barrier | Stmt::BlockReduce { .. } | Stmt::Gemm(_) | Stmt::Alloc(_)
            ) {
                bad.get_or_insert("a loop, barrier, reduction or allocation");
            }
        });
    }
    if let Some(what) = bad {
        return Err(err(k, format!("the epilogue holds {what}")));
    }
    Ok(())
}

fn err(k: &Kernel, msg: String) -> CudaError {
    CudaError::Render {
        kernel: k.name.clone(),
        msg,
    }
}

fn valid_ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn buf_name(k: &Kernel, b: BufId) -> String {
    format!("b{}_{}", b.0, sanitize(&k.buf(b).name))
}

fn var_name(k: &Kernel, v: VarId) -> String {
    match k.vars.get(v.0 as usize) {
        Some(info) => format!("v{}_{}", v.0, sanitize(&info.name)),
        None => format!("v{}", v.0),
    }
}

/// The C type a buffer element is stored as.
pub fn storage_ty(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "tl_f16",
        DType::BF16 => "tl_bf16",
        DType::I8 => "signed char",
        DType::I16 => "short",
        DType::I32 => "int",
        DType::I64 => "long long",
        DType::U8 | DType::Bool | DType::F8E4M3 | DType::F8E5M2 => "unsigned char",
        DType::U16 => "unsigned short",
        DType::U32 => "unsigned int",
        DType::U64 => "unsigned long long",
    }
}

/// The C type values of an element type are computed in.
fn compute_ty(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => "float",
        DType::Bool => "bool",
        d => storage_ty(d),
    }
}

fn ty_c(t: Ty) -> &'static str {
    match t {
        Ty::Index => "idx_t",
        Ty::Elem(d) => compute_ty(d),
    }
}

/// Stored value → computed value.
fn load_conv(d: DType, s: String) -> String {
    match d {
        DType::F16 => format!("tl_ld_f16({s})"),
        DType::BF16 => format!("tl_ld_bf16({s})"),
        DType::F8E4M3 => format!("tl_ld_f8e4m3({s})"),
        DType::F8E5M2 => format!("tl_ld_f8e5m2({s})"),
        DType::Bool => format!("({s} != 0)"),
        _ => s,
    }
}

/// Computed value → stored value.
fn store_conv(d: DType, s: String) -> String {
    match d {
        DType::F16 => format!("tl_st_f16({s})"),
        DType::BF16 => format!("tl_st_bf16({s})"),
        DType::F8E4M3 => format!("tl_st_f8e4m3({s})"),
        DType::F8E5M2 => format!("tl_st_f8e5m2({s})"),
        DType::Bool => format!("(unsigned char)(({s}) ? 1 : 0)"),
        d => format!("({})({s})", storage_ty(d)),
    }
}

/// Rounds a float-computed value to the precision of `d` (identity for types computed
/// natively).
fn round_to(d: DType, s: String) -> String {
    match d {
        DType::F16 => format!("tl_r_f16({s})"),
        DType::BF16 => format!("tl_r_bf16({s})"),
        DType::F8E4M3 => format!("tl_r_f8e4m3({s})"),
        DType::F8E5M2 => format!("tl_r_f8e5m2({s})"),
        DType::I8 | DType::I16 | DType::U8 | DType::U16 => format!("({})({s})", storage_ty(d)),
        _ => s,
    }
}

/// Whether indices need 64 bits (some buffer or loop beyond 2^30 elements).
fn needs_64bit_index(k: &Kernel) -> bool {
    let lim = 1i64 << 30;
    if k.buffers.iter().any(|b| b.numel() > lim) {
        return true;
    }
    k.loops().iter().any(|l| l.extent > lim)
}

fn axis_of(a: GpuAxis) -> (bool, usize) {
    match a {
        GpuAxis::BlockX => (false, 0),
        GpuAxis::BlockY => (false, 1),
        GpuAxis::BlockZ => (false, 2),
        GpuAxis::ThreadX => (true, 0),
        GpuAxis::ThreadY => (true, 1),
        GpuAxis::ThreadZ => (true, 2),
    }
}

fn axis_builtin(a: GpuAxis) -> &'static str {
    match a {
        GpuAxis::BlockX => "blockIdx.x",
        GpuAxis::BlockY => "blockIdx.y",
        GpuAxis::BlockZ => "blockIdx.z",
        GpuAxis::ThreadX => "threadIdx.x",
        GpuAxis::ThreadY => "threadIdx.y",
        GpuAxis::ThreadZ => "threadIdx.z",
    }
}

/// Grid and block extents of a kernel.
struct Dims {
    grid: [i64; 3],
    block: [i64; 3],
}

impl Dims {
    fn of(k: &Kernel) -> Result<Dims> {
        let mut d = Dims {
            grid: [1; 3],
            block: [1; 3],
        };
        let mut has_reduce = false;
        fn walk(
            k: &Kernel,
            stmts: &[Stmt],
            d: &mut Dims,
            active: &mut Vec<GpuAxis>,
            has_reduce: &mut bool,
        ) -> Result<()> {
            for s in stmts {
                match s {
                    Stmt::For(l) => {
                        if let LoopKind::Bound(a) = l.kind {
                            if active.contains(&a) {
                                return Err(err(
                                    k,
                                    format!(
                                        "loop {} is bound to {a:?} inside another loop bound to it",
                                        var_name(k, l.var)
                                    ),
                                ));
                            }
                            if l.extent < 1 {
                                return Err(err(
                                    k,
                                    format!(
                                        "loop {} bound to {a:?} has extent {}",
                                        var_name(k, l.var),
                                        l.extent
                                    ),
                                ));
                            }
                            let (thread, i) = axis_of(a);
                            let slot = if thread {
                                &mut d.block[i]
                            } else {
                                &mut d.grid[i]
                            };
                            *slot = (*slot).max(l.extent);
                            active.push(a);
                            walk(k, &l.body, d, active, has_reduce)?;
                            active.pop();
                        } else {
                            walk(k, &l.body, d, active, has_reduce)?;
                        }
                    }
                    Stmt::If { then_, else_, .. } => {
                        walk(k, then_, d, active, has_reduce)?;
                        walk(k, else_, d, active, has_reduce)?;
                    }
                    Stmt::Gemm(g) => walk(k, &g.epilogue, d, active, has_reduce)?,
                    Stmt::BlockReduce { axis, .. } => {
                        *has_reduce = true;
                        if !axis_of(*axis).0 {
                            return Err(err(
                                k,
                                format!("block reduction over the grid axis {axis:?}"),
                            ));
                        }
                    }
                    _ => {}
                }
            }
            Ok(())
        }
        walk(k, &k.body, &mut d, &mut vec![], &mut has_reduce)?;
        if has_reduce {
            if d.block[1] > 1 || d.block[2] > 1 {
                // Several rows per block: each row's ThreadX threads are an aligned segment of
                // a warp, reduced with shuffles alone.
                let x = d.block[0];
                if d.block[2] > 1 || x > 32 || x & (x - 1) != 0 || (x * d.block[1]) % 32 != 0 {
                    return Err(err(
                        k,
                        format!(
                            "block reductions need a one-dimensional thread block, or ThreadX a \
                             power of two up to 32 with whole warps (block {:?})",
                            d.block
                        ),
                    ));
                }
            } else {
                d.block[0] = (d.block[0] + 31) / 32 * 32;
            }
        }
        let threads: i64 = d.block.iter().product();
        if threads > 1024 {
            return Err(err(
                k,
                format!(
                    "thread block of {:?} = {threads} threads exceeds 1024",
                    d.block
                ),
            ));
        }
        if d.block[2] > 64 {
            return Err(err(k, format!("ThreadZ extent {} exceeds 64", d.block[2])));
        }
        if d.grid[0] > i32::MAX as i64 || d.grid[1] > 65535 || d.grid[2] > 65535 {
            return Err(err(
                k,
                format!(
                    "grid {:?} exceeds the device limits (2^31-1, 65535, 65535)",
                    d.grid
                ),
            ));
        }
        Ok(d)
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid: (
                self.grid[0] as u32,
                self.grid[1] as u32,
                self.grid[2] as u32,
            ),
            block: (
                self.block[0] as u32,
                self.block[1] as u32,
                self.block[2] as u32,
            ),
            shared_mem_bytes: 0,
        }
    }

    fn extent(&self, a: GpuAxis) -> i64 {
        let (thread, i) = axis_of(a);
        if thread {
            self.block[i]
        } else {
            self.grid[i]
        }
    }
}

/// For each register buffer, the dimensions indexed only by thread-bound variables whose loop
/// extent equals the dimension: each thread keeps its own slice, so they are dropped.
fn register_dims_to_drop(k: &Kernel) -> HashMap<BufId, Vec<bool>> {
    let mut bound: HashMap<VarId, (GpuAxis, i64)> = HashMap::new();
    for l in k.loops() {
        if let LoopKind::Bound(a) = l.kind {
            if axis_of(a).0 {
                bound.insert(l.var, (a, l.extent));
            }
        }
    }
    let mut state: HashMap<BufId, Vec<Option<Option<GpuAxis>>>> = HashMap::new();
    let mut note = |b: BufId, idx: &[Expr]| {
        let buf = k.buf(b);
        if buf.scope != Scope::Register {
            return;
        }
        let st = state
            .entry(b)
            .or_insert_with(|| vec![None; buf.shape.len()]);
        for (d, e) in idx.iter().enumerate().take(st.len()) {
            let this = match e {
                Expr::Var(v) => match bound.get(v) {
                    Some(&(a, ext)) if ext == buf.shape[d] => Some(a),
                    _ => None,
                },
                _ => None,
            };
            st[d] = match st[d] {
                None => Some(this),
                Some(prev) if prev == this => Some(prev),
                Some(_) => Some(None),
            };
        }
    };
    for s in &k.body {
        s.visit(&mut |s| {
            if let Stmt::Store { buf, index, .. } = s {
                note(*buf, index);
            }
        });
        crate::schedule::each_expr(s, &mut |e| {
            if let Expr::Load(b, idx) = e {
                note(*b, idx);
            }
        });
    }
    state
        .into_iter()
        .map(|(b, st)| {
            (
                b,
                st.into_iter().map(|x| matches!(x, Some(Some(_)))).collect(),
            )
        })
        .collect()
}

/// A vectorized access found in a vectorized loop.
#[derive(Clone, Debug)]
struct VecAccess {
    buf: BufId,
    /// Flat element offset with the lane variable set to 0.
    base: Expr,
    /// Local array holding the lanes.
    name: String,
}

struct R<'a> {
    k: &'a Kernel,
    dims: &'a Dims,
    reg_drop: HashMap<BufId, Vec<bool>>,
    out: String,
    indent: usize,
    /// Number of enclosing thread-bound loops.
    thread_depth: usize,
    /// Inside a vectorized loop: (buffer, flat index) → the lane of the loop's array.
    vec_subst: Vec<((BufId, Expr), String)>,
    /// How expressions are spelled.
    style: Cuda,
    /// Bound loop variables in scope.
    bound: HashMap<VarId, GpuAxis>,
    /// Compute types used by block reductions (each gets a shared scratch array).
    red_types: HashSet<String>,
    vec_count: usize,
    /// A vectorized loop whose global stores cannot all move as whole vectors is an error
    /// (instead of lane-by-lane stores).
    whole_vector_stores: bool,
}

impl<'a> R<'a> {
    /// A renderer for a `__device__` function's body (no launch dimensions, nothing bound).
    fn for_function(k: &'a Kernel, dims: &'a Dims) -> R<'a> {
        R {
            k,
            dims,
            reg_drop: HashMap::new(),
            out: String::new(),
            indent: 1,
            thread_depth: 1,
            vec_subst: vec![],
            style: Cuda { narrow: narrow_outputs(k) },
            bound: HashMap::new(),
            red_types: HashSet::new(),
            vec_count: 0,
            whole_vector_stores: false,
        }
    }
}

impl R<'_> {
    fn line(&mut self, s: &str) {
        for _ in 0..self.indent {
            self.out.push_str("  ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }

    fn block(&mut self, stmts: &[Stmt]) -> Result<()> {
        for s in stmts {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn var(&self, v: VarId) -> Result<String> {
        if self.k.vars.get(v.0 as usize).is_none() {
            return Err(err(self.k, format!("variable v{} is not declared", v.0)));
        }
        Ok(var_name(self.k, v))
    }

    fn check_buf(&self, b: BufId) -> Result<()> {
        if self.k.buffers.get(b.0 as usize).is_none() {
            return Err(err(self.k, format!("buffer #{} is not declared", b.0)));
        }
        Ok(())
    }

    /// The flat element offset of an access, as an IR expression (kept dims only for register
    /// buffers).
    fn flat_index(&self, b: BufId, index: &[Expr]) -> Result<Expr> {
        self.check_buf(b)?;
        let buf = self.k.buf(b);
        if index.len() != buf.shape.len() {
            return Err(err(
                self.k,
                format!(
                    "buffer {} has rank {}, indexed with {} indices",
                    buf.name,
                    buf.shape.len(),
                    index.len()
                ),
            ));
        }
        let drop = self.reg_drop.get(&b);
        let mut terms = vec![];
        let mut stride = 1i64;
        for d in (0..index.len()).rev() {
            if drop.is_some_and(|dr| dr[d]) {
                continue;
            }
            terms.push((index[d].clone(), stride));
            stride = stride.saturating_mul(buf.shape[d]);
        }
        // An affine sum with re-indexing div/rem pairs folded back (NVRTC 13.0 crashes on some
        // loop nests that index with such pairs); as written when a coefficient overflows.
        if let Some((atoms, konst)) = tilec_tile::affine::linear_offset(&terms) {
            let mut flat = Expr::Int(konst);
            for (c, e) in atoms.into_iter().rev() {
                let t = if c == 1 { e } else { Expr::mul(e, Expr::Int(c)) };
                flat = if flat == Expr::Int(0) { t } else { Expr::add(t, flat) };
            }
            return Ok(flat);
        }
        let mut flat = Expr::Int(0);
        for (e, c) in terms {
            flat = Expr::add(Expr::mul(e, Expr::Int(c)), flat);
        }
        Ok(flat)
    }

    fn kept_numel(&self, b: BufId) -> i64 {
        let buf = self.k.buf(b);
        let drop = self.reg_drop.get(&b);
        buf.shape
            .iter()
            .enumerate()
            .filter(|(d, _)| !drop.is_some_and(|dr| dr[*d]))
            .map(|(_, n)| *n)
            .product::<i64>()
            .max(1)
    }

    /// The lane of the enclosing vectorized loop's array that holds an access, if any.
    fn lane(&self, b: BufId, flat: &Expr) -> Option<String> {
        self.vec_subst.iter().find(|((x, f), _)| *x == b && f == flat).map(|(_, l)| l.clone())
    }

    /// An element of `b` at `index` in its stored form (no conversion).
    fn raw_load(&mut self, b: BufId, index: &[Expr]) -> Result<String> {
        let flat = self.flat_index(b, index)?;
        if let Some(lane) = self.lane(b, &flat) {
            return Ok(lane);
        }
        let idx = self.expr(&flat)?;
        Ok(format!("{}[{idx}]", buf_name(self.k, b)))
    }

    /// The stored form of `value` for a buffer of dtype `d`.
    fn stored_value(&mut self, d: DType, value: &Expr) -> Result<String> {
        match value {
            // A copy between buffers of one dtype moves the stored bits.
            Expr::Load(src, idx) if d != DType::Bool && self.k.buffers.get(src.0 as usize).is_some_and(|b| b.dtype == d) => {
                return self.raw_load(*src, idx)
            }
            // A store of a cast to the buffer's own 16-bit type rounds once, not twice; a native
            // 16-bit chain stores its bits.
            Expr::Cast(cd, inner) if *cd == d && matches!(d, DType::F16 | DType::BF16) => {
                if let Some(bits) = self.bits16(value)? {
                    let t = if d == DType::BF16 { "bf16" } else { "f16" };
                    return Ok(format!("tl_mk_{t}({bits})"));
                }
                if self.k.type_of(inner) == Ty::Elem(DType::F32) {
                    return Ok(store_conv(d, self.expr(inner)?));
                }
            }
            _ => {}
        }
        let (v, t) = cexpr::expr(self, value)?;
        Ok(store_conv(d, cexpr::convert(&self.style, &v, t, Ty::Elem(d))))
    }

    fn stmt(&mut self, s: &Stmt) -> Result<()> {
        match s {
            Stmt::For(l) => self.for_(l)?,
            Stmt::Store { buf, index, value } => {
                self.check_buf(*buf)?;
                let v = self.stored_value(self.k.buf(*buf).dtype, value)?;
                let flat = self.flat_index(*buf, index)?;
                if let Some(lane) = self.lane(*buf, &flat) {
                    let t = format!("{lane} = {v};");
                    self.line(&t);
                    return Ok(());
                }
                let fidx = self.expr(&flat)?;
                let t = format!("{}[{fidx}] = {v};", buf_name(self.k, *buf));
                let scope = self.k.buf(*buf).scope;
                // One thread writes a value computed alike by threads that no enclosing loop
                // tells apart.
                let unbound: Vec<&str> = [GpuAxis::ThreadX, GpuAxis::ThreadY, GpuAxis::ThreadZ]
                    .into_iter()
                    .filter(|a| self.dims.extent(*a) > 1 && !self.bound.values().any(|b| b == a))
                    .map(axis_builtin)
                    .collect();
                if scope != Scope::Register && !unbound.is_empty() {
                    let cond: Vec<String> = unbound.iter().map(|a| format!("{a} == 0")).collect();
                    let t = format!("if ({}) {t}", cond.join(" && "));
                    self.line(&t);
                } else {
                    self.line(&t);
                }
            }
            Stmt::Let { var, value } => {
                let info = self.k.var_info(*var).clone();
                let (v, t) = cexpr::expr(self, value)?;
                let v = cexpr::convert(&self.style, &v, t, info.ty);
                let c = if info.mutable { "" } else { "const " };
                let t = format!("{c}{} {} = {v};", ty_c(info.ty), self.var(*var)?);
                self.line(&t);
            }
            Stmt::Assign { var, value } => {
                let info = self.k.var_info(*var).clone();
                if !info.mutable {
                    return Err(err(
                        self.k,
                        format!("assignment to immutable variable {}", info.name),
                    ));
                }
                let (v, t) = cexpr::expr(self, value)?;
                let v = cexpr::convert(&self.style, &v, t, info.ty);
                let t = format!("{} = {v};", self.var(*var)?);
                self.line(&t);
            }
            Stmt::Alloc(b) => {
                self.check_buf(*b)?;
                let buf = self.k.buf(*b);
                match buf.scope {
                    Scope::Local => {} // declared at function scope
                    Scope::Register => {
                        let t = format!(
                            "__align__(16) {} {}[{}];",
                            storage_ty(buf.dtype),
                            buf_name(self.k, *b),
                            self.kept_numel(*b)
                        );
                        self.line(&t);
                    }
                    Scope::Global => {
                        return Err(err(self.k, format!("alloc of global buffer {}", buf.name)))
                    }
                }
            }
            Stmt::If { cond, then_, else_ } => {
                let c = self.expr(cond)?;
                self.line(&format!("if ({c}) {{"));
                self.indent += 1;
                self.block(then_)?;
                self.indent -= 1;
                if !else_.is_empty() {
                    self.line("} else {");
                    self.indent += 1;
                    self.block(else_)?;
                    self.indent -= 1;
                }
                self.line("}");
            }
            Stmt::Barrier => {
                if self.thread_depth > 0 {
                    return Err(err(self.k, "barrier inside a thread-bound loop (threads past the extent would skip it)".into()));
                }
                self.line("__syncthreads();");
            }
            Stmt::BlockReduce { var, op, axis } => {
                let warp_segments = self.dims.block[1] > 1;
                let inside_own_axis = self.bound.values().any(|a| a == axis);
                if inside_own_axis || (self.thread_depth > 0 && !warp_segments) {
                    return Err(err(
                        self.k,
                        "block reduction inside a thread-bound loop".into(),
                    ));
                }
                let info = self.k.var_info(*var).clone();
                if !info.mutable {
                    return Err(err(
                        self.k,
                        format!("block reduction of immutable variable {}", info.name),
                    ));
                }
                let ct = ty_c(info.ty).to_string();
                let functor = match op {
                    BinOp::Add => "TlAdd",
                    BinOp::Mul => "TlMul",
                    BinOp::Min => "TlMin",
                    BinOp::Max => "TlMax",
                    BinOp::And => "TlAnd",
                    BinOp::Or => "TlOr",
                    BinOp::BitAnd => "TlBitAnd",
                    BinOp::BitOr => "TlBitOr",
                    BinOp::BitXor => "TlBitXor",
                    other => return Err(err(self.k, format!("block reduction with {other:?}"))),
                };
                let nt = self.dims.extent(*axis);
                let name = self.var(*var)?;
                let scratch = format!("tl_red_{}", ct.replace(' ', "_"));
                if warp_segments && *axis != GpuAxis::ThreadX {
                    return Err(err(
                        self.k,
                        format!("a multi-row block reduces over ThreadX, not {axis:?}"),
                    ));
                }
                if !warp_segments {
                    self.red_types.insert(ct.clone());
                }
                let mut v = if warp_segments {
                    format!("tl_warp_allreduce<{nt}>({name}, {functor}())")
                } else {
                    format!("tl_block_allreduce<{nt}>({name}, {functor}(), {scratch})")
                };
                // Sums of rounded types are rounded once more, like every other operation.
                if let Ty::Elem(d) = info.ty {
                    if matches!(op, BinOp::Add | BinOp::Mul) {
                        v = round_to(d, v);
                    }
                }
                self.line(&format!("{name} = {v};"));
            }
            Stmt::Gemm(g) => self.gemm(g)?,
        }
        Ok(())
    }

    fn for_(&mut self, l: &Loop) -> Result<()> {
        let v = self.var(l.var)?;
        if let LoopKind::Bound(a) = l.kind {
            let ext = self.dims.extent(a);
            let (thread, _) = axis_of(a);
            self.line("{");
            self.indent += 1;
            self.line(&format!("const idx_t {v} = (idx_t){};", axis_builtin(a)));
            let guarded = l.extent < ext;
            if guarded {
                self.line(&format!("if ({v} < {}) {{", l.extent));
                self.indent += 1;
            }
            if thread {
                self.thread_depth += 1;
            }
            self.bound.insert(l.var, a);
            let r = self.block(&l.body);
            self.bound.remove(&l.var);
            if thread {
                self.thread_depth -= 1;
            }
            r?;
            if guarded {
                self.indent -= 1;
                self.line("}");
            }
            self.indent -= 1;
            self.line("}");
            return Ok(());
        }
        if l.kind == LoopKind::Vectorized && self.vec_subst.is_empty() {
            return self.vector_loop(l);
        }
        if matches!(l.kind, LoopKind::Unrolled | LoopKind::Vectorized) {
            self.line("#pragma unroll");
        }
        self.line(&format!(
            "for (idx_t {v} = 0; {v} < {}; ++{v}) {{",
            l.extent
        ));
        self.indent += 1;
        self.block(&l.body)?;
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    /// A vectorized loop: contiguous, aligned global accesses move as whole vectors.
    fn vector_loop(&mut self, l: &Loop) -> Result<()> {
        let (loads, stores) = self.vector_accesses(l)?;
        if self.whole_vector_stores {
            // Lane-by-lane stores of a contiguous but misaligned run (rows of an odd length)
            // scatter a warp's store over many partly written sectors: worse than the
            // element-wise form. Strided runs (a transposed output) stay lane by lane.
            let lane = Expr::Var(l.var);
            for st in &l.body {
                let Stmt::Store { buf, index, .. } = st else { continue };
                if self.k.buf(*buf).scope != Scope::Global || stores.iter().any(|a| a.buf == *buf) {
                    continue;
                }
                let flat = self.flat_index(*buf, index)?;
                let unit = linear_offset(&[(flat, 1)]).is_some_and(|(atoms, _)| atoms.iter().any(|(c, a)| *c == 1 && *a == lane));
                if unit {
                    return Err(err(self.k, format!("the store to {} is contiguous but not whole aligned vectors", buf_name(self.k, *buf))));
                }
            }
        }
        let v = self.var(l.var)?;
        self.line("{");
        self.indent += 1;
        for (acc, is_load) in loads
            .iter()
            .map(|a| (a, true))
            .chain(stores.iter().map(|a| (a, false)))
        {
            let buf = self.k.buf(acc.buf);
            let st = storage_ty(buf.dtype);
            let base = self.expr(&acc.base)?;
            self.line(&format!("__align__(16) {st} {}[{}];", acc.name, l.extent));
            if is_load {
                self.copy_vector(
                    &format!("(&{}[{base}])", buf_name(self.k, acc.buf)),
                    &acc.name,
                    buf.dtype,
                    l.extent,
                    true,
                );
            }
        }
        // The accesses of the body that read or write the lane arrays.
        let mut subst = vec![];
        for acc in loads.iter().chain(stores.iter()) {
            for flat in self.vector_indices(l, acc)? {
                subst.push(((acc.buf, flat), format!("{}[{v}]", acc.name)));
            }
        }
        self.line("#pragma unroll");
        self.line(&format!(
            "for (idx_t {v} = 0; {v} < {}; ++{v}) {{",
            l.extent
        ));
        self.indent += 1;
        self.vec_subst = subst;
        let r = self.block(&l.body);
        self.vec_subst.clear();
        r?;
        self.indent -= 1;
        self.line("}");
        for acc in &stores {
            let buf = self.k.buf(acc.buf);
            let base = self.expr(&acc.base)?;
            self.copy_vector(
                &acc.name,
                &format!("(&{}[{base}])", buf_name(self.k, acc.buf)),
                buf.dtype,
                l.extent,
                false,
            );
        }
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    fn vector_width(d: DType, lanes: i64) -> (i64, &'static str) {
        let bytes = d.size_bytes() as i64 * lanes;
        let w = if bytes % 16 == 0 {
            16
        } else if bytes % 8 == 0 {
            8
        } else if bytes % 4 == 0 {
            4
        } else if bytes % 2 == 0 {
            2
        } else {
            1
        };
        let t = match w {
            16 => "uint4",
            8 => "uint2",
            4 => "unsigned int",
            2 => "unsigned short",
            _ => "unsigned char",
        };
        (w, t)
    }

    fn copy_vector(&mut self, src: &str, dst: &str, d: DType, lanes: i64, load: bool) {
        let (w, t) = Self::vector_width(d, lanes);
        let n = d.size_bytes() as i64 * lanes / w;
        for c in 0..n {
            // An epilogue's 16-byte accesses as single instructions (see `tl_st_v4`).
            let line = match (self.whole_vector_stores && w == 16, load) {
                (true, true) => format!("reinterpret_cast<uint4*>({dst})[{c}] = tl_ld_v4(reinterpret_cast<const uint4*>({src}) + {c});"),
                (true, false) => format!("tl_st_v4(reinterpret_cast<uint4*>({dst}) + {c}, reinterpret_cast<const uint4*>({src})[{c}]);"),
                _ => format!("reinterpret_cast<{t}*>({dst})[{c}] = reinterpret_cast<const {t}*>({src})[{c}];"),
            };
            self.line(&line);
        }
    }

    /// The flat indices under which the body refers to an access.
    fn vector_indices(&mut self, l: &Loop, acc: &VecAccess) -> Result<Vec<Expr>> {
        let mut out = vec![];
        let mut idxs: Vec<Vec<Expr>> = vec![];
        for s in &l.body {
            s.visit(&mut |s| {
                if let Stmt::Store { buf, index, .. } = s {
                    if *buf == acc.buf {
                        idxs.push(index.clone());
                    }
                }
            });
            crate::schedule::each_expr(s, &mut |e| {
                if let Expr::Load(b, idx) = e {
                    if *b == acc.buf {
                        idxs.push(idx.clone());
                    }
                }
            });
        }
        for idx in idxs {
            let flat = self.flat_index(acc.buf, &idx)?;
            if flat.clone().substitute(l.var, &Expr::Int(0)) == acc.base {
                out.push(flat);
            }
        }
        Ok(out)
    }

    /// Global loads and stores of a vectorized loop that can move as vectors.
    fn vector_accesses(&mut self, l: &Loop) -> Result<(Vec<VecAccess>, Vec<VecAccess>)> {
        let lanes = l.extent;
        // Variables defined inside the loop body: indices using them are not loop-invariant.
        let mut inner_vars: HashSet<VarId> = HashSet::new();
        let mut stored: HashMap<BufId, usize> = HashMap::new();
        let mut has_nested_store: HashSet<BufId> = HashSet::new();
        for s in &l.body {
            s.visit(&mut |s| match s {
                Stmt::For(x) => {
                    inner_vars.insert(x.var);
                }
                Stmt::Let { var, .. } => {
                    inner_vars.insert(*var);
                }
                Stmt::Store { buf, .. } => {
                    *stored.entry(*buf).or_default() += 1;
                }
                Stmt::Gemm(g) => {
                    inner_vars.extend([g.b_var, g.i_var, g.j_var, g.k_var, g.acc_var]);
                }
                _ => {}
            });
            if !matches!(s, Stmt::Store { .. }) {
                s.visit(&mut |x| {
                    if let Stmt::Store { buf, .. } = x {
                        has_nested_store.insert(*buf);
                    }
                });
            }
        }
        let ok_index = |this: &Self, b: BufId, idx: &[Expr]| -> Result<Option<Expr>> {
            let buf = this.k.buf(b);
            if buf.scope != Scope::Global {
                return Ok(None);
            }
            let (w, _) = Self::vector_width(buf.dtype, lanes);
            let elems = w / buf.dtype.size_bytes() as i64;
            if w < 4 || elems <= 1 {
                return Ok(None);
            }
            let flat = this.flat_index(b, idx)?;
            let mut uses_inner = false;
            flat.visit(&mut |e| {
                if let Expr::Var(x) = e {
                    if inner_vars.contains(x) {
                        uses_inner = true;
                    }
                }
            });
            if uses_inner {
                return Ok(None);
            }
            let Some((atoms, konst)) = linear_offset(&[(flat.clone(), 1)]) else {
                return Ok(None);
            };
            let lane = Expr::Var(l.var);
            let unit = atoms.iter().any(|(c, a)| *c == 1 && *a == lane);
            let rest_aligned = atoms
                .iter()
                .filter(|(_, a)| *a != lane)
                .all(|(c, a)| !a.uses_var(l.var) && c % elems == 0);
            if !unit || !rest_aligned || konst % elems != 0 {
                return Ok(None);
            }
            Ok(Some(flat.substitute(l.var, &Expr::Int(0))))
        };
        let mut loads: Vec<VecAccess> = vec![];
        let mut stores: Vec<VecAccess> = vec![];
        // Loads reachable unconditionally (not under an If or a Select branch).
        let mut cands: Vec<(BufId, Vec<Expr>)> = vec![];
        fn uncond_loads(e: &Expr, out: &mut Vec<(BufId, Vec<Expr>)>) {
            match e {
                Expr::Load(b, idx) => {
                    out.push((*b, idx.clone()));
                    idx.iter().for_each(|x| uncond_loads(x, out));
                }
                Expr::Select(c, _, _) => uncond_loads(c, out),
                Expr::Unary(_, a) | Expr::Cast(_, a) | Expr::ToIndex(a) => uncond_loads(a, out),
                Expr::Binary(BinOp::And | BinOp::Or, a, _) => uncond_loads(a, out),
                Expr::Binary(_, a, b) => {
                    uncond_loads(a, out);
                    uncond_loads(b, out);
                }
                _ => {}
            }
        }
        for s in &l.body {
            match s {
                Stmt::Store { index, value, .. } => {
                    index.iter().for_each(|x| uncond_loads(x, &mut cands));
                    uncond_loads(value, &mut cands);
                }
                Stmt::Let { value, .. } | Stmt::Assign { value, .. } => {
                    uncond_loads(value, &mut cands)
                }
                _ => {}
            }
        }
        for (b, idx) in cands {
            self.check_buf(b)?;
            if stored.contains_key(&b) {
                continue;
            }
            if let Some(base) = ok_index(self, b, &idx)? {
                if !loads.iter().any(|a| a.buf == b && a.base == base) {
                    self.vec_count += 1;
                    let name = format!("tl_ld{}", self.vec_count);
                    loads.push(VecAccess { buf: b, base, name });
                }
            }
        }
        for s in &l.body {
            if let Stmt::Store { buf, index, .. } = s {
                self.check_buf(*buf)?;
                if stored.get(buf) != Some(&1) || has_nested_store.contains(buf) {
                    continue;
                }
                let mut read = false;
                for s2 in &l.body {
                    crate::schedule::each_expr(s2, &mut |e| {
                        if e.reads(*buf) {
                            read = true
                        }
                    });
                }
                if read {
                    continue;
                }
                if let Some(base) = ok_index(self, *buf, index)? {
                    self.vec_count += 1;
                    let name = format!("tl_st{}", self.vec_count);
                    stores.push(VecAccess {
                        buf: *buf,
                        base,
                        name,
                    });
                }
            }
        }
        Ok((loads, stores))
    }

    fn gemm(&mut self, g: &Gemm) -> Result<()> {
        // A plain loop nest: correct on any launch shape, not fast (tensor-core templates come
        // with the GEMM schedules).
        let (b, i, j, kk, acc) = (
            self.var(g.b_var)?,
            self.var(g.i_var)?,
            self.var(g.j_var)?,
            self.var(g.k_var)?,
            self.var(g.acc_var)?,
        );
        let at = compute_ty(g.acc_dtype);
        self.line(&format!("for (idx_t {b} = 0; {b} < {}; ++{b})", g.batch));
        self.line(&format!("for (idx_t {i} = 0; {i} < {}; ++{i})", g.m));
        self.line(&format!("for (idx_t {j} = 0; {j} < {}; ++{j}) {{", g.n));
        self.indent += 1;
        self.line(&format!("{at} {acc}_sum = 0;"));
        let a = self.expr(&g.a)?;
        let bb = self.expr(&g.b)?;
        self.line(&format!("for (idx_t {kk} = 0; {kk} < {}; ++{kk}) {{", g.k));
        self.line(&format!(
            "  {acc}_sum = {};",
            round_to(
                g.acc_dtype,
                format!(
                    "{acc}_sum + {}",
                    round_to(g.acc_dtype, format!("({at})({a}) * ({at})({bb})"))
                )
            )
        ));
        self.line("}");
        self.line(&format!("const {at} {acc} = {acc}_sum;"));
        self.block(&g.epilogue)?;
        self.indent -= 1;
        self.line("}");
        Ok(())
    }

    fn expr(&mut self, e: &Expr) -> Result<String> {
        Ok(cexpr::expr(self, e)?.0)
    }

    /// The raw 16-bit pattern (`unsigned short`) of a bf16/f16 value that is a load, or an add,
    /// subtract or multiply of two such values computed in f32 and rounded back to the type. The
    /// chain then runs in native 16-bit arithmetic: one correctly rounded operation each, as the
    /// graph asks, without converting every intermediate to float and back.
    fn bits16(&mut self, e: &Expr) -> Result<Option<String>> {
        let d = match self.k.type_of(e) {
            Ty::Elem(d @ (DType::BF16 | DType::F16)) => d,
            _ => return Ok(None),
        };
        let t = if d == DType::BF16 { "bf16" } else { "f16" };
        match e {
            Expr::Load(b, idx) => Ok(Some(format!("({}).bits", self.raw_load(*b, idx)?))),
            Expr::Cast(_, inner) => {
                let Expr::Binary(op @ (BinOp::Add | BinOp::Sub | BinOp::Mul), a, b) = inner.as_ref()
                else {
                    return Ok(None);
                };
                let (Expr::Cast(DType::F32, x), Expr::Cast(DType::F32, y)) = (a.as_ref(), b.as_ref())
                else {
                    return Ok(None);
                };
                if self.k.type_of(x) != Ty::Elem(d) || self.k.type_of(y) != Ty::Elem(d) {
                    return Ok(None);
                }
                let (Some(xb), Some(yb)) = (self.bits16(x)?, self.bits16(y)?) else {
                    return Ok(None);
                };
                let f = match op {
                    BinOp::Add => "add",
                    BinOp::Sub => "sub",
                    _ => "mul",
                };
                Ok(Some(format!("tl_{f}_{t}({xb}, {yb})")))
            }
            _ => Ok(None),
        }
    }
}

impl CTarget for R<'_> {
    type Style = Cuda;
    type Error = CudaError;
    fn style(&self) -> &Cuda {
        &self.style
    }
    fn error(&self, msg: String) -> CudaError {
        err(self.k, msg)
    }
    fn kernel(&self) -> &Kernel {
        self.k
    }
    fn var(&mut self, v: VarId) -> Result<String> {
        R::var(self, v)
    }
    fn load(&mut self, b: BufId, idx: &[Expr]) -> Result<String> {
        let raw = self.raw_load(b, idx)?;
        Ok(load_conv(self.k.buf(b).dtype, raw))
    }
    fn check_index(&mut self, c: IndexCheck, i: String) -> String {
        format!("(idx_t)tl_index(tl_st, {}, {i}, {}LL, {})", c.site, c.len, c.wrap)
    }
    fn special(&mut self, e: &Expr) -> Result<Option<(String, Ty)>> {
        let f32 = Ty::Elem(DType::F32);
        match e {
            // A float read of a native 16-bit chain.
            Expr::Cast(DType::F32, a) if matches!(a.as_ref(), Expr::Cast(..)) => {
                let t = match self.k.type_of(a) {
                    Ty::Elem(DType::BF16) => "bf16",
                    Ty::Elem(DType::F16) => "f16",
                    _ => return Ok(None),
                };
                Ok(self.bits16(a)?.map(|bits| (format!("tl_bits_{t}({bits})"), f32)))
            }
            // `1 + erf(x)` (the GELU form) through erfc, so that the negative tail keeps its
            // relative accuracy and no branch diverges.
            Expr::Binary(BinOp::Add, a, b) if self.style.narrow && self.k.type_of(e) == f32 => {
                let one = |x: &Expr| matches!(x, Expr::Lit(Lit::Float(v, DType::F32)) if *v == 1.0);
                let erf_arg = |x: &Expr| match x {
                    Expr::Unary(UnOp::Erf, inner) => Some(inner.as_ref().clone()),
                    _ => None,
                };
                let fused = match (one(a), one(b)) {
                    (true, _) => erf_arg(b),
                    (_, true) => erf_arg(a),
                    _ => None,
                };
                match fused {
                    Some(x) => Ok(Some((format!("tl_one_plus_erf({})", self.expr(&x)?), f32))),
                    None => Ok(None),
                }
            }
            _ => Ok(None),
        }
    }
}

/// Whether every float parameter the kernel writes is f16 or bf16.
fn narrow_outputs(k: &Kernel) -> bool {
    let written = k.stored_buffers();
    let outs: Vec<DType> = k
        .params
        .iter()
        .filter(|b| written.contains(*b))
        .map(|&b| k.buf(b).dtype)
        .filter(|d| d.is_float())
        .collect();
    !outs.is_empty() && outs.iter().all(|d| matches!(d, DType::F16 | DType::BF16))
}

/// How CUDA C++ spells expressions (see [`cexpr`]): indices are `idx_t` (32 bits where every
/// buffer and loop allows), booleans `bool`, `float` math through the hardware's fast paths.
struct Cuda {
    /// Every float the kernel writes is 16-bit: cheaper approximations are exact enough.
    narrow: bool,
}

impl CStyle for Cuda {
    fn index_ty(&self) -> &'static str {
        "idx_t"
    }
    fn i64_ty(&self) -> &'static str {
        "long long"
    }
    fn u64_ty(&self) -> &'static str {
        "unsigned long long"
    }
    fn storage_ty(&self, d: DType) -> &'static str {
        storage_ty(d)
    }
    fn value_ty(&self, d: DType) -> &'static str {
        compute_ty(d)
    }
    fn prefix(&self) -> &'static str {
        "tl_"
    }
    fn truth(&self, c: String) -> String {
        format!("({c})")
    }
    fn bool_lit(&self, b: bool) -> String {
        (if b { "true" } else { "false" }).into()
    }
    fn index_lit(&self, x: i64) -> String {
        if x == i64::MIN {
            "(-9223372036854775807LL - 1)".into()
        } else if x >= i32::MIN as i64 && x <= i32::MAX as i64 {
            format!("{x}")
        } else {
            format!("{x}LL")
        }
    }
    fn nonfinite(&self, x: f64, dbl: bool) -> String {
        let (nan, inf) = if dbl { ("TL_NAN_D", "TL_INF_D") } else { ("TL_NAN_F", "TL_INF_F") };
        if x.is_nan() {
            nan.into()
        } else if x > 0.0 {
            inf.into()
        } else {
            format!("(-{inf})")
        }
    }
    fn round(&self, d: DType, code: String) -> String {
        match d {
            DType::F16 => format!("tl_r_f16({code})"),
            DType::BF16 => format!("tl_r_bf16({code})"),
            DType::F8E4M3 => format!("tl_r_f8e4m3({code})"),
            DType::F8E5M2 => format!("tl_r_f8e5m2({code})"),
            _ => code,
        }
    }
    fn short_circuit(&self) -> bool {
        true
    }
    fn int_fn(&self, f: IntFn, ct: &str, a: &str, b: &str) -> String {
        match f {
            IntFn::Min => format!("tl_min<{ct}>({a}, {b})"),
            IntFn::Max => format!("tl_max<{ct}>({a}, {b})"),
            IntFn::Abs => format!("tl_iabs<{ct}>({a})"),
            IntFn::Sign => format!("tl_isign<{ct}>({a})"),
            IntFn::FloorDiv => format!("tl_ifloordiv<{ct}>({a}, {b})"),
            IntFn::FloorMod => format!("tl_ifloormod<{ct}>({a}, {b})"),
        }
    }
    fn math(&self, op: UnOp, d: DType, a: &str) -> Option<String> {
        let dbl = d == DType::F64;
        Some(match op {
            // The hardware exp2 path (a few ulp for the arguments softmax and activations see):
            // accurate expf costs more than the memory time of a bf16 row.
            UnOp::Exp if !dbl => format!("__expf({a})"),
            UnOp::Rsqrt if dbl => format!("rsqrt({a})"),
            UnOp::Rsqrt => format!("rsqrtf({a})"),
            // A cheaper erf (about 2e-7 absolute) when every float the kernel writes is 16-bit:
            // its error is far below their rounding.
            UnOp::Erf if !dbl && self.narrow => format!("tl_erf_fast({a})"),
            UnOp::Sign => format!("tl_sign({a})"),
            UnOp::Sigmoid if dbl => format!("(1.0 / (1.0 + exp(-({a}))))"),
            UnOp::Sigmoid => format!("(1.0f / (1.0f + __expf(-({a}))))"),
            // GELU in one branchless piece where every float the kernel writes is 16-bit.
            UnOp::GeluErf if !dbl && self.narrow => format!("tl_gelu_erf({a})"),
            UnOp::GeluErf if dbl => format!("tl_gelu_erf_d({a})"),
            UnOp::GeluErf => format!("tl_gelu_erf_exact({a})"),
            UnOp::GeluTanh if !dbl && self.narrow => format!("tl_gelu_tanh_fast({a})"),
            UnOp::GeluTanh if dbl => format!("tl_gelu_tanh_d({a})"),
            UnOp::GeluTanh => format!("tl_gelu_tanh({a})"),
            UnOp::Silu if dbl => format!("tl_silu_d({a})"),
            UnOp::Silu => format!("tl_silu({a})"),
            UnOp::IsNan => format!("isnan({a})"),
            UnOp::IsInf => format!("isinf({a})"),
            _ => return None,
        })
    }
}

/// FNV-1a of a rendered source: a short hash, stable across runs and builds, for kernel names.
pub(crate) fn source_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A 16-bit float type's name in kernel names: `bf16`, else `f16`.
pub(crate) fn short16(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        _ => "f16",
    }
}

/// The name of a parameter as declared (`const tl_f16* __restrict__ t3` -> `t3`).
pub(crate) fn param_name(decl: &str) -> &str {
    decl.rsplit([' ', '*']).next().unwrap_or("")
}
