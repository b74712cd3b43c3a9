//! `cublas.gemm`: NVIDIA's cuBLASLt (loaded at run time, see [`crate::cublaslt`]) as a kernel
//! family, for a kernel that is one `Gemm` over f16, bf16 or f32 operands read straight from
//! buffers whose epilogue only stores the product (cast to the output's dtype) densely. It is
//! a correctness and speed reference, and a fallback: tried after tilec's own tensor-core
//! template, the registry picks it by default only for 16-bit products (f32 products stay on
//! tilec's exact SIMT GEMM unless it is forced with `--family MatMul=cublas.gemm`).
//!
//! Nothing is compiled: the plan's source is empty. At load the library is opened, the
//! product described and its algorithm and workspace chosen once; a missing library makes the
//! load fail, and the executor runs the SIMT GEMM fallback instead, with a note.

use tilec_ir::DType;
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params as FParams, Problem as FProblem};
use tilec_tile::{Expr, Kernel, Scope, Stmt, VarId};

use crate::cublaslt::{CublasLt, LtGemm, LtMatmul, MatLayout};
use crate::driver::{Device, Stream};
use crate::error::{CudaError, Result};
use crate::gemm::{Layout, Problem};
use crate::render::CudaSource;

use super::operands::{gemm_view, GemmView};
use super::template::{FamilyPlan, OperandRef, PlanKind};

/// The family's name.
pub const CUBLAS_GEMM: &str = "cublas.gemm";

/// What a cuBLAS plan adds to the problem: where C goes and cuBLASLt's view of the product.
#[derive(Clone, Debug, PartialEq)]
pub struct CublasParams {
    pub c: OperandRef,
    pub out_dtype: DType,
    /// The product in cuBLASLt's column-major terms ([`lt_gemm`]); its A is our B.
    pub lt: LtGemm,
}

/// Row-major `C = A·B` (`m x n`, dense) as cuBLASLt's column-major `D = op(A')·op(B')`: the
/// same memory read column-major is `C^T = B^T·A^T`, so A' is our B and B' our A, D is `n x m`
/// with leading dimension `n`. A row-major operand read column-major is already transposed
/// (no `op`); a column-major one is transposed by `op`.
pub fn lt_gemm(p: &Problem, out: DType, tf32: bool) -> std::result::Result<LtGemm, String> {
    let (m, n, k) = (p.m as u64, p.n as u64, p.k as u64);
    if m == 0 || n == 0 || k == 0 {
        return Err("an empty product".into());
    }
    let batch = i32::try_from(p.batch).map_err(|_| format!("{} batches are too many for cuBLASLt", p.batch))?;
    let ld = |x: Option<usize>| x.and_then(|x| i64::try_from(x).ok()).unwrap_or(0);
    let stride = |x: usize| i64::try_from(x).unwrap_or(i64::MAX);
    let (lda, ldb) = (ld(p.lda), ld(p.ldb));
    // A' = B: row-major (K x N, ldb between rows) reads as column-major N x K.
    let (trans_a, a) = match p.b_layout {
        Layout::RowMajor => (false, (n, k, ldb)),
        Layout::ColMajor => (true, (k, n, ldb)),
    };
    // B' = A: row-major (M x K) reads as column-major K x M.
    let (trans_b, b) = match p.a_layout {
        Layout::RowMajor => (false, (k, m, lda)),
        Layout::ColMajor => (true, (m, k, lda)),
    };
    for (name, (rows, _, ld)) in [("B", a), ("A", b)] {
        if ld < rows as i64 {
            return Err(format!(
                "operand {name}: its leading dimension {ld} is below its contiguous extent {rows} (overlapping rows)"
            ));
        }
    }
    let mat = |dtype, (rows, cols, ld): (u64, u64, i64), bs| MatLayout { dtype, rows, cols, ld, batch_stride: bs };
    Ok(LtGemm {
        trans_a,
        trans_b,
        a: mat(p.in_dtype, a, stride(p.batch_stride_b)),
        b: mat(p.in_dtype, b, stride(p.batch_stride_a)),
        d: mat(out, (n, m, n as i64), stride(p.batch_stride_c)),
        batch,
        tf32,
    })
}

/// The product's value as `Some(rounding)` when `e` is the accumulator, possibly cast (`None`:
/// the f32 accumulator itself), through the epilogue's `let`s.
fn of_acc(e: &Expr, acc: &[(VarId, Option<DType>)]) -> Option<Option<DType>> {
    match e {
        Expr::Var(v) => acc.iter().find(|a| a.0 == *v).map(|a| a.1),
        Expr::Cast(DType::F32, x) => of_acc(x, acc),
        Expr::Cast(d, x) => of_acc(x, acc).filter(|r| r.is_none()).map(|_| Some(*d)),
        _ => None,
    }
}

/// Where a kernel whose epilogue only stores the product puts C, and C's dtype; the reason
/// when the epilogue does more (bias, activations, other fused ops) or C is not dense.
pub fn plain_store(k: &Kernel) -> std::result::Result<(OperandRef, DType), String> {
    let fused = crate::schedule::fuse_scratch_epilogue(k);
    let k = fused.as_ref().unwrap_or(k);
    let [Stmt::Gemm(g)] = k.body.as_slice() else {
        return Err("not a single matrix product".into());
    };
    let more = || "the epilogue does more than store the product (fused ops); cuBLAS stores plain products only".to_string();
    let mut acc = vec![(g.acc_var, None)];
    let mut store = None;
    for s in &g.epilogue {
        match s {
            Stmt::Let { var, value } => acc.push((*var, of_acc(value, &acc).ok_or_else(more)?)),
            Stmt::Store { buf, index, value } if store.is_none() => {
                store = Some((*buf, index, of_acc(value, &acc).ok_or_else(more)?))
            }
            _ => return Err(more()),
        }
    }
    let (buf, index, rounding) = store.ok_or("the epilogue stores nothing")?;
    let b = k.buffers.get(buf.0 as usize).ok_or("the epilogue stores to an undeclared buffer")?;
    if b.scope != Scope::Global || !k.params.contains(&buf) {
        return Err(format!("the product goes to scratch buffer {}", b.name));
    }
    if rounding.unwrap_or(DType::F32) != b.dtype {
        return Err(format!("the product is stored to {} through another dtype", b.dtype.name()));
    }
    if index.len() != b.shape.len() {
        return Err("the store's index rank differs from its buffer's".into());
    }
    let terms: Vec<(Expr, i64)> = index.iter().cloned().zip(b.strides()).collect();
    let (atoms, konst) = tilec_tile::affine::linear_offset(&terms).ok_or("the output offset overflows")?;
    // (variable, extent, coefficient in a dense row-major C); a variable of extent 1 is 0.
    let want = [(g.i_var, g.m, g.n), (g.j_var, g.n, 1), (g.b_var, g.batch, g.m * g.n)];
    let coef = |v: VarId| atoms.iter().filter(|a| a.1 == Expr::Var(v)).map(|a| a.0).sum::<i64>();
    let dense = atoms.iter().all(|(_, a)| matches!(a, Expr::Var(v) if want.iter().any(|w| w.0 == *v)))
        && want.iter().all(|&(v, extent, c)| extent <= 1 || coef(v) == c);
    let es = b.dtype.size_bytes() as i64;
    if !dense || konst < 0 || (konst * es) % 16 != 0 {
        return Err(format!("the product is not stored densely (row-major, 16-byte aligned) in {}", b.name));
    }
    let param = k.params.iter().position(|&p| p == buf).unwrap_or(0);
    Ok((OperandRef { param, offset_bytes: (konst * es) as u64 }, b.dtype))
}

/// The cuBLAS plan for a kernel, or why cuBLAS cannot run it; `tf32` lets f32 products use
/// TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`; otherwise exact f32).
pub fn cublas_plan(k: &Kernel, tf32: bool) -> std::result::Result<FamilyPlan, String> {
    let GemmView { mut problem, a, b } = gemm_view(k)?;
    if problem.a_split.is_some() || problem.batch_split.is_some() {
        return Err("an operand is read across split dimensions (cuBLAS takes strided matrices only)".into());
    }
    let (c, out) = plain_store(k)?;
    match (problem.in_dtype, out) {
        (DType::F16, DType::F16 | DType::F32) | (DType::BF16, DType::BF16 | DType::F32) | (DType::F32, DType::F32) => {}
        (i, o) => return Err(format!("{} operands with a {} output (cuBLAS: f16, bf16 or f32)", i.name(), o.name())),
    }
    problem.out_dtype = out;
    problem.custom = None;
    let lt = lt_gemm(&problem, out, tf32)?;
    Ok(FamilyPlan {
        family: CUBLAS_GEMM,
        problem,
        kind: PlanKind::Cublas(CublasParams { c, out_dtype: out, lt }),
        a,
        b,
        entry: "cublasLtMatmul".into(),
        source: String::new(),
    })
}

/// A cuBLAS plan loaded on a device: the described product, launched with the tile-IR
/// kernel's pointers.
pub struct CublasKernel {
    plan: FamilyPlan,
    c: OperandRef,
    mm: LtMatmul,
}

impl CublasKernel {
    /// Opens cuBLASLt ("cuBLAS not found" when it is missing) and describes the product.
    pub fn load(device: &Device, plan: &FamilyPlan) -> Result<CublasKernel> {
        let PlanKind::Cublas(q) = &plan.kind else {
            return Err(CudaError::Usage(format!("{} is not a cuBLAS plan", plan.entry)));
        };
        let lib = CublasLt::load()?;
        let mm = LtMatmul::new(&lib, device, &q.lt)?;
        Ok(CublasKernel { plan: plan.clone(), c: q.c.clone(), mm })
    }

    pub fn plan(&self) -> &FamilyPlan {
        &self.plan
    }

    /// Launches on `stream` with one device pointer per parameter of the tile-IR kernel.
    pub fn launch(&self, stream: &Stream, ptrs: &[u64]) -> Result<()> {
        let at = |o: &OperandRef| {
            ptrs.get(o.param)
                .map(|p| p + o.offset_bytes)
                .ok_or_else(|| CudaError::Usage(format!("operand parameter {} missing", o.param)))
        };
        // cuBLASLt's A is our B (see `lt_gemm`).
        self.mm.launch(stream, at(&self.plan.b)?, at(&self.plan.a)?, at(&self.c)?)
    }
}

/// The family as the registry holds it.
pub struct CublasGemm;
pub static CUBLAS_GEMM_FAMILY: CublasGemm = CublasGemm;

fn plan_of(p: &FProblem) -> std::result::Result<FamilyPlan, String> {
    p.memo("cublas.gemm.plan", || cublas_plan(&super::lowered(p)?.kernel, false))
}

impl Family for CublasGemm {
    type Target = Target;
    type Built = super::GpuBuilt;

    fn name(&self) -> &'static str {
        CUBLAS_GEMM
    }

    fn applies(&self, p: &FProblem, _t: &Target) -> std::result::Result<(), String> {
        plan_of(p).map(drop)
    }

    /// Unforced, only 16-bit products: tilec's own exact SIMT GEMM keeps f32 ones.
    fn by_default(&self, p: &FProblem, _t: &Target) -> std::result::Result<(), String> {
        let plan = plan_of(p)?;
        match plan.problem.in_dtype {
            DType::F16 | DType::BF16 => Ok(()),
            d => Err(format!(
                "{} products stay on tilec's own kernels unless forced (--family {}={CUBLAS_GEMM})",
                d.name(),
                p.op()
            )),
        }
    }

    /// `tf32` (0 or 1): TF32 tensor cores for f32 operands. TF32 changes results, so the
    /// space holds 1 only when the user allowed it (`--allow-tf32`).
    fn space(&self, _p: &FProblem, t: &Target) -> ParamSpace {
        let v = if t.gpu.allow_tf32 { vec![0, 1] } else { vec![0] };
        ParamSpace { axes: vec![("tf32", v)] }
    }

    fn check(&self, _p: &FProblem, _t: &Target, params: &FParams) -> std::result::Result<(), String> {
        match params.get("tf32") {
            None | Some(0 | 1) => Ok(()),
            Some(v) => Err(format!("tf32={v} is not 0 or 1")),
        }
    }

    /// TF32 when the user allowed it (`--allow-tf32`), as PyTorch does for matrix products.
    fn heuristic(&self, _p: &FProblem, t: &Target) -> FParams {
        FParams(vec![("tf32", i64::from(t.gpu.allow_tf32))])
    }

    fn build(&self, p: &FProblem, t: &Target, params: &FParams) -> std::result::Result<super::GpuBuilt, String> {
        let mut plan = plan_of(p)?;
        if params.get("tf32") == Some(1) {
            plan = cublas_plan(&super::lowered(p)?.kernel, true)?;
        }
        // The SIMT GEMM, run if cuBLASLt is missing or refuses the product at load.
        let simt = super::TileIr(&super::simt_gemm::SimtGemm).build(p, t, &FParams::default())?;
        let source = CudaSource { name: plan.entry.clone(), source: String::new(), launch: plan.launch(t.gpu.sm_count) };
        Ok(super::GpuBuilt {
            lowered: simt.lowered,
            scheduled: simt.scheduled,
            schedule: CUBLAS_GEMM,
            source,
            plan: Some(plan),
            fallback: Some((simt.schedule, simt.source)),
        })
    }
}
