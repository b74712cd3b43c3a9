//! `cpu.gemv`: matrix products of a few rows (batch-1 classifier heads, LLM decode steps)
//! rendered by the matrix-vector template of `crate::gemm` (`Gemm::vector`): `B` streamed
//! once per call from panels laid out ahead of the calls, `m × v` vector accumulators per
//! panel, the panels shared out among the threads, the fused epilogue per panel.
//!
//! It applies to a kernel whose anchor is a matrix product lowering to one f32 `Gemm` with at
//! most [`GEMV_MAX_ROWS`] rows on one side over all its batches (the product is transposed
//! when the few rows are `B`'s columns) and the other operand one matrix for all batches, a
//! function of kernel parameters alone.
//! By default it is chosen only when that operand is a constant of the graph (weights, packed
//! once at bind) and the rows are at most [`DEFAULT_ROWS`]; forced, it packs a non-constant
//! operand panel by panel on every call.

use tilec_ir::op::LinalgOp;
use tilec_ir::{DType, Op};
use tilec_opt::target::Target;
use tilec_tile::family::{Family, Params, Problem};
use tilec_tile::lower::LowerOptions;
use tilec_tile::schedule::{default_cpu, Primitive, Schedule};
use tilec_tile::{Expr, Gemm, Kernel};

use super::{build_with, the_gemm, CpuBuilt};
use crate::gemm::GEMV_MAX_ROWS;

pub struct Gemv;
pub static GEMV: Gemv = Gemv;

/// Rows up to which the family is chosen by default (`bench/results/gemv-2026-12-02`: at one
/// and two rows it is well ahead of the packed gemm, whose `m × 2` accumulators wait on FMA
/// latency; at three and four both stream the weights alike, its best runs no slower; at six
/// and eight it gains nothing).
pub const DEFAULT_ROWS: i64 = 4;

/// How the problem's gemm maps onto the template: whether it must be transposed first, and
/// the streamed operand's kernel parameters.
struct Plan {
    transpose: bool,
    rows: i64,
    params: Vec<usize>,
}

/// The kernel parameters `e` reads, if it reads only parameters and uses only `vars`.
fn reads_params(k: &Kernel, e: &Expr, vars: &[tilec_tile::VarId]) -> Option<Vec<usize>> {
    let mut ok = !matches!(e, Expr::Lit(_));
    let mut ps = vec![];
    e.visit(&mut |x| match x {
        Expr::Var(v) if !vars.contains(v) => ok = false,
        Expr::Load(b, _) => match k.params.iter().position(|p| p == b) {
            Some(i) if !ps.contains(&i) => ps.push(i),
            Some(_) => {}
            None => ok = false,
        },
        _ => {}
    });
    ps.sort_unstable();
    ok.then_some(ps)
}

fn plan_of(k: &Kernel, g: &Gemm) -> Result<Plan, String> {
    if g.acc_dtype != DType::F32 {
        return Err(format!("it accumulates in {}, not f32", g.acc_dtype));
    }
    // The streamed operand is one for all batches (it does not use the batch variable), so
    // the batches' rows are rows of one product.
    let one = |v| if g.batch == 1 { vec![g.b_var, g.k_var, v] } else { vec![g.k_var, v] };
    let b_params = reads_params(k, &g.b, &one(g.j_var));
    let a_params = reads_params(k, &g.a, &one(g.i_var));
    let (rows, cols) = (g.batch.saturating_mul(g.m), g.batch.saturating_mul(g.n));
    match (b_params, a_params) {
        (Some(params), _) if rows <= GEMV_MAX_ROWS => Ok(Plan { transpose: false, rows, params }),
        (_, Some(params)) if cols <= GEMV_MAX_ROWS => Ok(Plan { transpose: true, rows: cols, params }),
        (None, None) => Err("neither operand is one matrix for all batches read from kernel parameters alone".into()),
        _ => Err(format!(
            "{} batch(es) of a {}x{} product have more than {GEMV_MAX_ROWS} rows on the side whose other operand reads kernel parameters alone",
            g.batch, g.m, g.n
        )),
    }
}

/// The problem's plan (lowered with the default options), computed once.
fn plan(p: &Problem) -> Result<Plan, String> {
    if !matches!(p.anchor_op(), Some(Op::Linalg(LinalgOp::MatMul))) {
        return Err("not a matrix product".into());
    }
    let l = p.lower(LowerOptions::default()).map_err(|e| e.to_string())?;
    let g = the_gemm(&l.kernel).ok_or("it does not lower to one matrix product")?;
    let plan = plan_of(&l.kernel, &g)?;
    Ok(plan)
}

impl Family for Gemv {
    type Target = Target;
    type Built = CpuBuilt;

    fn name(&self) -> &'static str {
        "cpu.gemv"
    }

    fn applies(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        plan(p).map(drop)
    }

    /// Only where the streamed operand is a constant (packed once at bind) and the rows are
    /// few enough.
    fn by_default(&self, p: &Problem, _t: &Target) -> Result<(), String> {
        let plan = plan(p)?;
        if plan.rows > DEFAULT_ROWS {
            return Err(format!("{} rows are more than {DEFAULT_ROWS}", plan.rows));
        }
        let l = p.lower(LowerOptions::default()).map_err(|e| e.to_string())?;
        let constant = plan.params.iter().all(|&i| l.inputs.get(i).is_some_and(|&v| p.graph.const_value(v).is_some()));
        if !constant {
            return Err("the weights are no constant (they would be laid out on every call)".into());
        }
        Ok(())
    }

    fn build(&self, p: &Problem, t: &Target, _params: &Params) -> Result<CpuBuilt, String> {
        let plan = plan(p)?;
        build_with(p, LowerOptions::default(), |k| {
            let row = the_gemm(k).map(|g| k.var_info(g.i_var).name.clone());
            let mut s = Schedule::new();
            if plan.transpose {
                s.push(Primitive::GemmTranspose { gemm: row.clone() });
            }
            s.push(Primitive::GemmVector { gemm: if plan.transpose { None } else { row } });
            // The default schedule's other steps (loops outside the product); its own
            // orientation and blocking of the product are replaced.
            for step in default_cpu(k, &t.cpu).steps {
                if !matches!(step, Primitive::GemmTranspose { .. } | Primitive::GemmBlocking { .. }) {
                    s.push(step);
                }
            }
            s
        })
    }
}
