//! `sm90_tc_gemm`: the Hopper tensor-core GEMM template of [`crate::gemm`] (wgmma fed by TMA,
//! warp-specialized, persistent) for a kernel that is one `Gemm` over 16-bit operands read
//! straight from buffers, with its epilogue rendered from the tile IR as a device function.
//!
//! A template kernel keeps the ABI of the tile-IR kernel it replaces (one device pointer per
//! parameter, in `Kernel::params` order), so the executor launches it like any other; see
//! [`crate::GpuKernel::launch`]. Its build carries the SIMT GEMM as a fallback, run when the
//! template does not compile or load.

use std::sync::Mutex;

use tilec_ir::DType;
use tilec_tile::{BinOp, BufId, Expr, Gemm, Kernel, Scope, Stmt, VarId};

use crate::driver::{Device, Stream};
use crate::error::{CudaError, Result};
use crate::gemm::{self, CustomEpilogue, GemmArgs, GemmKernel, Layout, Params, Problem};
use crate::render::CudaSource;
use crate::schedule::GpuTarget;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params as FParams, Problem as FProblem};

/// The Hopper tensor-core GEMM family's name.
pub const HOPPER_GEMM: &str = "sm90_tc_gemm";

/// Where an operand starts: a kernel parameter and an offset into it.
#[derive(Clone, Debug, PartialEq)]
pub struct OperandRef {
    /// Index into `Kernel::params`.
    pub param: usize,
    pub offset_bytes: u64,
}

/// A family's plan for one kernel: what to compile and how to launch it.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyPlan {
    pub family: &'static str,
    pub problem: Problem,
    pub params: Params,
    pub a: OperandRef,
    pub b: OperandRef,
    /// The function the source defines.
    pub entry: String,
    /// CUDA C++ (prelude included).
    pub source: String,
}

impl FamilyPlan {
    /// One line for reports: shape, layouts and parameters.
    pub fn describe(&self) -> String {
        let p = &self.problem;
        let q = &self.params;
        let l = |l: Layout| if l == Layout::RowMajor { "row" } else { "col" };
        let mut rows = match p.custom.as_ref().and_then(|c| c.rows) {
            Some(r) => format!(" ({} batches of {r} rows flattened)", p.m / r.max(1)),
            None => String::new(),
        };
        if let Some(s) = p.a_split {
            rows.push_str(&format!(
                " (A read as {} groups of {} rows x {} slices of 64)",
                p.m / s.rows.max(1),
                s.rows,
                p.k / 64
            ));
        }
        format!(
            "{} {}x{}x{} batch {}{rows}, {} A {}-major, B {}-major, f32 accumulation; tile {}x{}x{}, {} stages, {} consumer warpgroups, cluster {}, group {}",
            self.family,
            p.m,
            p.n,
            p.k,
            p.batch,
            p.in_dtype.name(),
            l(p.a_layout),
            l(p.b_layout),
            q.tile_m,
            q.tile_n,
            q.tile_k,
            q.stages,
            q.consumers,
            q.cluster_m,
            q.group_m
        )
    }
}

/// Whether a kernel holds a matrix product (where family decisions are worth reporting).
pub fn has_gemm(k: &Kernel) -> bool {
    let mut found = false;
    for s in &k.body {
        s.visit(&mut |s| found |= matches!(s, Stmt::Gemm(_)));
    }
    found
}

/// A term of an operand's offset: an index variable, or its quotient or remainder by a
/// constant (a split dimension, such as attention heads read back as one K).
#[derive(Copy, Clone, Debug, PartialEq)]
enum Atom {
    Plain(VarId),
    Div(VarId, i64),
    Rem(VarId, i64),
}

/// A 16-bit operand read straight from a buffer: the buffer and its flat offset as
/// `konst + sum(coef * atom)`.
struct Strided {
    buf: BufId,
    dtype: DType,
    konst: i64,
    atoms: Vec<(Atom, i64)>,
}

impl Strided {
    fn coef(&self, a: Atom) -> i64 {
        self.atoms.iter().filter(|c| c.0 == a).map(|c| c.1).sum()
    }
    fn plain(&self) -> bool {
        self.atoms.iter().all(|a| matches!(a.0, Atom::Plain(_)))
    }
    /// A as `[groups][heads][rows][64]`: `Some((rows, lda, head_stride, group_stride))` when
    /// the offset is `(i / R) * g + (i % R) * lda + (k / 64) * h + k % 64` (or `i * lda` for
    /// one group, or `b * g + i * lda` for batches `b` of `m` rows when `batch` is given).
    fn split(
        &self,
        i: VarId,
        k: VarId,
        m: i64,
        batch: Option<VarId>,
    ) -> Option<(i64, i64, i64, i64)> {
        let mut rows = None;
        let (mut g, mut lda, mut h, mut unit) = (0, 0, 0, 0);
        for &(a, c) in &self.atoms {
            match a {
                Atom::Plain(v) if Some(v) == batch => {
                    if rows.replace(m).is_some_and(|r| r != m) {
                        return None;
                    }
                    g = c;
                }
                Atom::Div(v, d) if v == i => {
                    if rows.replace(d).is_some_and(|r| r != d) {
                        return None;
                    }
                    g = c;
                }
                Atom::Rem(v, d) if v == i => {
                    if rows.replace(d).is_some_and(|r| r != d) {
                        return None;
                    }
                    lda = c;
                }
                Atom::Plain(v) if v == i => {
                    if rows.replace(m).is_some_and(|r| r != m) {
                        return None;
                    }
                    lda = c;
                }
                Atom::Div(v, 64) if v == k => h = c,
                Atom::Rem(v, 64) if v == k => unit = c,
                _ => return None,
            }
        }
        let rows = rows?;
        if g == 0 {
            g = h.max(lda) * rows;
        }
        (unit == 1 && h > 0 && lda > 0).then_some((rows, lda, h, g))
    }
}

fn strided(
    k: &Kernel,
    e: &Expr,
    name: &str,
    vars: [VarId; 3],
) -> std::result::Result<Strided, String> {
    let inner = match e {
        Expr::Cast(DType::F32, x) => &**x,
        x => x,
    };
    let Expr::Load(buf, index) = inner else {
        return Err(format!(
            "operand {name} is computed (a fused prologue), not read from a buffer"
        ));
    };
    let b = k
        .buffers
        .get(buf.0 as usize)
        .ok_or_else(|| format!("operand {name} reads an undeclared buffer"))?;
    if b.scope != Scope::Global || !k.params.contains(buf) {
        return Err(format!("operand {name} reads scratch buffer {}", b.name));
    }
    if !matches!(b.dtype, DType::F16 | DType::BF16) {
        return Err(format!(
            "operand {name} ({}) is {}, not f16 or bf16",
            b.name,
            b.dtype.name()
        ));
    }
    if index.len() != b.shape.len() {
        return Err(format!(
            "operand {name}: index rank differs from its buffer's"
        ));
    }
    let terms: Vec<(Expr, i64)> = index.iter().cloned().zip(b.strides()).collect();
    let (atoms, konst) = tilec_tile::affine::linear_offset(&terms)
        .ok_or_else(|| format!("operand {name}: its offset overflows"))?;
    let mut coefs = vec![];
    for (c, atom) in atoms {
        let split = |x: &Expr, d: &Expr| match (x, d) {
            (Expr::Var(v), Expr::Int(d)) if vars.contains(v) && *d > 0 => Some((*v, *d)),
            _ => None,
        };
        let term = match &atom {
            Expr::Var(v) if vars.contains(v) => Some(Atom::Plain(*v)),
            Expr::Binary(BinOp::Div | BinOp::FloorDiv, x, d) => {
                split(x, d).map(|(v, d)| Atom::Div(v, d))
            }
            Expr::Binary(BinOp::Rem | BinOp::FloorMod, x, d) => {
                split(x, d).map(|(v, d)| Atom::Rem(v, d))
            }
            _ => None,
        };
        match term {
            Some(t) => coefs.push((t, c)),
            _ => {
                return Err(format!(
                    "operand {name} ({}) is not a strided view of its buffer (its offset is not \
                     linear in the batch, row and depth indices)",
                    b.name
                ))
            }
        }
    }
    if coefs.iter().any(|c| c.1 < 0) || konst < 0 {
        return Err(format!("operand {name} ({}) runs backwards", b.name));
    }
    Ok(Strided {
        buf: *buf,
        dtype: b.dtype,
        konst,
        atoms: coefs,
    })
}

fn usize_of(x: i64) -> usize {
    usize::try_from(x).unwrap_or(0)
}

/// The Hopper family: a kernel that is one `Gemm` (after folding a scratch consumer into its
/// epilogue) over 16-bit operands read by TMA from their buffers, any straight-line epilogue,
/// on an sm_90 device.
pub fn hopper_gemm(k: &Kernel, target: &GpuTarget) -> std::result::Result<FamilyPlan, String> {
    let fused = crate::schedule::fuse_scratch_epilogue(k);
    let k = fused.as_ref().unwrap_or(k);
    let g: &Gemm = match k.body.as_slice() {
        [Stmt::Gemm(g)] => g,
        _ if has_gemm(k) => {
            return Err("the matrix product shares its kernel with other loop nests".into())
        }
        _ => return Err("not a matrix product".into()),
    };
    if !k.checks.is_empty() {
        return Err("the kernel checks indices (the family has no status words yet)".into());
    }
    if target.compute_capability != (9, 0) {
        return Err(format!(
            "needs compute capability 9.0 (wgmma, TMA); the device has {}.{}",
            target.compute_capability.0, target.compute_capability.1
        ));
    }
    if g.acc_dtype != DType::F32 {
        return Err(format!("accumulates in {}, not f32", g.acc_dtype.name()));
    }
    let (m, n, kk, batch) = (
        usize_of(g.m),
        usize_of(g.n),
        usize_of(g.k),
        usize_of(g.batch),
    );
    let a = strided(k, &g.a, "A", [g.b_var, g.i_var, g.k_var])?;
    let b = strided(k, &g.b, "B", [g.b_var, g.k_var, g.j_var])?;
    if a.dtype != b.dtype {
        return Err(format!(
            "operands of two dtypes ({} and {})",
            a.dtype.name(),
            b.dtype.name()
        ));
    }
    if !b.plain() {
        return Err("operand B is not a 2-D strided view of its buffer".into());
    }
    // A read across split dimensions (attention heads): a 4-D view.
    let a_split = if a.plain() {
        None
    } else if batch > 1 && b.coef(Atom::Plain(g.b_var)) != 0 {
        return Err(
            "operand A is split across dimensions in a product whose B is batched too".into(),
        );
    } else {
        let bv = (batch > 1).then_some(g.b_var);
        let (rows, lda, h, gs) = a.split(g.i_var, g.k_var, g.m, bv).ok_or_else(|| {
            "operand A is not a strided view of its buffer (nor rows and 64-wide K slices of one)"
                .to_string()
        })?;
        Some((usize_of(rows), usize_of(lda), usize_of(h), usize_of(gs)))
    };
    // A (M x K): row-major when K is contiguous, column-major when M is.
    let (ai, ak) = (a.coef(Atom::Plain(g.i_var)), a.coef(Atom::Plain(g.k_var)));
    let pad8 = |x: usize| x.next_multiple_of(8);
    let (a_layout, lda) = if let Some((_, lda, _, _)) = a_split {
        (Layout::RowMajor, lda)
    } else if ak == 1 || (kk == 1 && ai != 1) {
        (
            Layout::RowMajor,
            if m == 1 { pad8(kk) } else { usize_of(ai) },
        )
    } else if ai == 1 || m == 1 {
        (
            Layout::ColMajor,
            if kk == 1 { pad8(m) } else { usize_of(ak) },
        )
    } else {
        return Err(format!(
            "operand A: neither its rows nor its columns are contiguous (strides {ai} and {ak})"
        ));
    };
    // B (K x N): row-major when N is contiguous, column-major when K is.
    let (bk, bj) = (b.coef(Atom::Plain(g.k_var)), b.coef(Atom::Plain(g.j_var)));
    let (b_layout, ldb) = if bj == 1 || (n == 1 && bk != 1) {
        (
            Layout::RowMajor,
            if kk == 1 { pad8(n) } else { usize_of(bk) },
        )
    } else if bk == 1 || kk == 1 {
        (
            Layout::ColMajor,
            if n == 1 { pad8(kk) } else { usize_of(bj) },
        )
    } else {
        return Err(format!(
            "operand B: neither its rows nor its columns are contiguous (strides {bk} and {bj})"
        ));
    };
    let es = a.dtype.size_bytes() as i64;
    for (name, op) in [("A", &a), ("B", &b)] {
        if (op.konst * es) % 16 != 0 {
            return Err(format!(
                "operand {name} starts {} elements into its buffer: not 16-byte aligned for TMA",
                op.konst
            ));
        }
    }
    let (sa, sb) = (
        usize_of(a.coef(Atom::Plain(g.b_var))),
        usize_of(b.coef(Atom::Plain(g.b_var))),
    );
    let mut problem = Problem::new(m, n, kk, a.dtype).with_layouts(a_layout, b_layout);
    problem.out_dtype = DType::F32;
    problem.lda = Some(lda);
    problem.ldb = Some(ldb);
    problem.batch = batch.max(1);
    problem.batch_stride_a = if batch > 1 { sa } else { 0 };
    problem.batch_stride_b = if batch > 1 { sb } else { 0 };
    problem.batch_stride_c = m * n;
    problem.a_split = a_split.map(|(rows, _, head_stride, group_stride)| gemm::ASplit {
        rows,
        head_stride,
        group_stride,
    });
    // Batches of a row-major A stacked densely against one shared B: one taller matrix.
    let mut rows = None;
    if batch > 1 && sb == 0 && a_layout == Layout::RowMajor && (sa == m * lda || a_split.is_some())
    {
        rows = Some(m);
        problem.m = m * batch;
        problem.batch = 1;
        problem.batch_stride_a = 0;
        problem.batch_stride_c = problem.m * n;
    }
    let entry_fn = "tl_epi";
    // Buffers renamed by position, so that the same epilogue in every layer of a model is the
    // same source (compiled once).
    let mut plain = k.clone();
    for b in &mut plain.buffers {
        b.name = "t".into();
    }
    let source =
        crate::render::render_gemm_epilogue_fn(&plain, g, entry_fn).map_err(|e| match e {
            CudaError::Render { msg, .. } => format!("epilogue not renderable: {msg}"),
            e => format!("epilogue not renderable: {e}"),
        })?;
    problem.custom = Some(CustomEpilogue {
        name: entry_fn.into(),
        source,
        params: crate::render::param_list(&plain),
        rows,
    });
    let mut params = gemm::heuristic(&problem, target.sm_count as usize);
    // A split A's row groups must hold whole tiles: 64-row tiles where 128 do not fit.
    if problem
        .a_split
        .is_some_and(|s| s.rows % params.tile_m != 0 && s.rows % 64 == 0)
    {
        let narrow = Params {
            tile_m: 64,
            consumers: 1,
            ..params
        };
        let fit = (2..=8).rev().find(|&s| {
            Params {
                stages: s,
                ..narrow
            }
            .smem_bytes()
                <= gemm::MAX_SMEM
        });
        params = Params {
            stages: fit.unwrap_or(2),
            ..narrow
        };
    }
    gemm::applies(&problem, &params, target.compute_capability)?;
    let pos = |buf: BufId| k.params.iter().position(|&p| p == buf).unwrap_or(0);
    Ok(FamilyPlan {
        family: HOPPER_GEMM,
        entry: gemm::kernel_name(&problem, &params),
        source: gemm::render(&problem, &params),
        a: OperandRef {
            param: pos(a.buf),
            offset_bytes: (a.konst * es) as u64,
        },
        b: OperandRef {
            param: pos(b.buf),
            offset_bytes: (b.konst * es) as u64,
        },
        problem,
        params,
    })
}

/// A family kernel loaded on a device, launched with the tile-IR kernel's pointers. The
/// launch arguments (tensor maps hold the operands' addresses) are encoded on the first launch
/// with a set of pointers and reused while the pointers stay the same (the arena and the
/// constants do not move, so in a compiled model: once).
pub struct FamilyKernel {
    plan: FamilyPlan,
    gemm: GemmKernel,
    bound: Mutex<Option<(Vec<u64>, GemmArgs)>>,
}

impl FamilyKernel {
    pub fn load(
        device: &Device,
        plan: &FamilyPlan,
        image: &[u8],
        cache_hit: bool,
    ) -> Result<FamilyKernel> {
        let gemm = GemmKernel::from_image(device, &plan.problem, &plan.params, image, cache_hit)?;
        // Raised now rather than at the first launch, which may be inside a graph capture.
        gemm.function()
            .reserve_dynamic_smem(plan.params.smem_bytes() as u32)?;
        Ok(FamilyKernel {
            plan: plan.clone(),
            gemm,
            bound: Mutex::new(None),
        })
    }

    pub fn plan(&self) -> &FamilyPlan {
        &self.plan
    }

    pub fn gemm(&self) -> &GemmKernel {
        &self.gemm
    }

    fn encode(&self, ptrs: &[u64]) -> Result<GemmArgs> {
        let at = |o: &OperandRef| -> Result<u64> {
            ptrs.get(o.param)
                .map(|p| p + o.offset_bytes)
                .ok_or_else(|| CudaError::Usage(format!("operand parameter {} missing", o.param)))
        };
        let (a, b) = (at(&self.plan.a)?, at(&self.plan.b)?);
        self.gemm.args_with(&self.plan.problem, a, b, 0, None, ptrs)
    }

    /// Launches on `stream` with one device pointer per parameter of the tile-IR kernel.
    pub fn launch(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        let mut bound = self
            .bound
            .lock()
            .map_err(|_| CudaError::Usage("a family kernel's launch state is poisoned".into()))?;
        if bound.as_ref().is_none_or(|(p, _)| p.as_slice() != ptrs) {
            *bound = Some((ptrs.to_vec(), self.encode(ptrs)?));
        }
        match bound.as_ref() {
            Some((_, args)) => self.gemm.launch(stream, args),
            None => Err(CudaError::Usage("no launch arguments".into())),
        }
    }
}

/// The family as the registry holds it.
pub struct Sm90TcGemm;
pub static SM90_TC_GEMM: Sm90TcGemm = Sm90TcGemm;

const NAMES: [&str; 7] = ["tile_m", "tile_n", "tile_k", "stages", "consumers", "cluster_m", "group_m"];

fn to_params(q: &Params) -> FParams {
    let v = [q.tile_m, q.tile_n, q.tile_k, q.stages, q.consumers, q.cluster_m, q.group_m];
    FParams(NAMES.iter().copied().zip(v.map(|x| x as i64)).collect())
}

/// `q` with the values `p` sets.
fn with_params(q: Params, p: &FParams) -> Params {
    let get = |n: &str, d: usize| p.get(n).map_or(d, |v| v.max(0) as usize);
    Params {
        tile_m: get("tile_m", q.tile_m),
        tile_n: get("tile_n", q.tile_n),
        tile_k: get("tile_k", q.tile_k),
        stages: get("stages", q.stages),
        consumers: get("consumers", q.consumers),
        cluster_m: get("cluster_m", q.cluster_m),
        group_m: get("group_m", q.group_m),
        ..q
    }
}

/// The plan for a problem's kernel (the fused GEMM kernel, its heuristic parameters).
fn plan_of(p: &FProblem, t: &Target) -> std::result::Result<FamilyPlan, String> {
    p.memo("sm90_tc_gemm.plan", || hopper_gemm(&super::lowered(p)?.kernel, &t.gpu))
}

impl Family for Sm90TcGemm {
    type Target = Target;
    type Built = super::GpuBuilt;

    fn name(&self) -> &'static str {
        HOPPER_GEMM
    }

    fn applies(&self, p: &FProblem, t: &Target) -> std::result::Result<(), String> {
        plan_of(p, t).map(drop)
    }

    fn space(&self, _p: &FProblem, _t: &Target) -> ParamSpace {
        ParamSpace {
            axes: vec![
                ("tile_m", vec![64, 128]),
                ("tile_n", vec![64, 128, 192, 256]),
                ("tile_k", vec![64]),
                ("stages", vec![2, 3, 4, 5, 6, 8]),
                ("consumers", vec![1, 2]),
                ("cluster_m", vec![1, 2]),
                ("group_m", vec![1, 4, 8, 16]),
            ],
        }
    }

    /// Whatever the template accepts for the problem ([`gemm::applies`]).
    fn check(&self, p: &FProblem, t: &Target, params: &FParams) -> std::result::Result<(), String> {
        let plan = plan_of(p, t)?;
        gemm::applies(&plan.problem, &with_params(plan.params, params), t.gpu.compute_capability)
    }

    fn heuristic(&self, p: &FProblem, t: &Target) -> FParams {
        plan_of(p, t).map(|plan| to_params(&plan.params)).unwrap_or_default()
    }

    fn build(&self, p: &FProblem, t: &Target, params: &FParams) -> std::result::Result<super::GpuBuilt, String> {
        let mut plan = plan_of(p, t)?;
        let q = with_params(plan.params, params);
        if q != plan.params {
            plan.params = q;
            plan.entry = gemm::kernel_name(&plan.problem, &q);
            plan.source = gemm::render(&plan.problem, &q);
        }
        // The SIMT GEMM, run if the template does not compile or load.
        let simt = super::TileIr(&super::simt_gemm::SimtGemm).build(p, t, &FParams::default())?;
        let source = CudaSource {
            name: plan.entry.clone(),
            source: plan.source.clone(),
            launch: crate::LaunchConfig {
                grid: (t.gpu.sm_count, 1, 1),
                block: (plan.params.threads() as u32, 1, 1),
                shared_mem_bytes: plan.params.smem_bytes() as u32,
            },
        };
        Ok(super::GpuBuilt {
            lowered: simt.lowered,
            scheduled: simt.scheduled,
            schedule: HOPPER_GEMM,
            source,
            plan: Some(plan),
            fallback: Some((simt.schedule, simt.source)),
        })
    }
}
