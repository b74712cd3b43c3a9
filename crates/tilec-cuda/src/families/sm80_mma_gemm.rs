//! `sm80_mma_gemm`: the `mma.sync` tensor-core template of [`crate::mma`] for a kernel that
//! is one `Gemm` over 16-bit operands: a matrix product read straight from buffers (as for the
//! Hopper template, see [`gemm_view`]), or a channels-last 2-D convolution read through an
//! implicit im2col with its constant weights repacked at bind time. Any device of compute
//! capability 8.0 or later; on sm_90 it takes what the Hopper template does not (convolutions,
//! and skinny products that want K split over blocks). Its build carries the SIMT GEMM as a
//! fallback, like the Hopper family's.

use tilec_ir::op::{window_geometry, LinalgOp, Padding};
use tilec_ir::{DType, Op};
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params as FParams, Problem as FProblem};
use tilec_tile::{BufId, Expr, Gemm, Kernel, Stmt};

use super::operands::{epilogue_fn, gemm_view, GemmView};
use super::template::{FamilyPlan, OperandRef, PlanKind};
use crate::gemm::{Layout, Problem};
use crate::mma::{self, ConvGeom, MmaProblem, Params};
use crate::render::CudaSource;
use crate::schedule::GpuTarget;

/// The family's name.
pub const MMA_GEMM: &str = "sm80_mma_gemm";

/// The buffers an expression loads.
fn loads(e: &Expr) -> Vec<BufId> {
    let mut v = vec![];
    e.visit(&mut |x| {
        if let Expr::Load(b, _) = x {
            if !v.contains(b) {
                v.push(*b);
            }
        }
    });
    v
}

/// A convolution group's kernel as an implicit GEMM: `Some` when the anchor is a channels-last
/// 2-D convolution of one group whose lowered kernel is one `Gemm` reading the input and the
/// constant weights straight from their buffers.
fn conv_view(p: &FProblem, k: &Kernel, target: &GpuTarget) -> Option<Result<MmaProblem, String>> {
    let Some(Op::Linalg(LinalgOp::Conv { window, group, channels_last })) = p.anchor_op() else {
        return None;
    };
    Some((|| {
        if !*channels_last || *group != 1 || window.rank() != 2 {
            return Err(format!(
                "convolution: {}-D, {} groups, channels {} (the template takes 2-D, one group, channels-last)",
                window.rank(),
                group,
                if *channels_last { "last" } else { "first" }
            ));
        }
        let node = p.graph.node(p.anchor.ok_or("no anchor")?);
        let (xv, wv) = (node.inputs[0], node.inputs[1]);
        if !matches!(p.graph.value(wv).def, tilec_ir::ValueDef::Const(_)) {
            return Err("convolution weights are not a constant (they are repacked once, when the kernel is bound)".into());
        }
        let fused = crate::schedule::fuse_scratch_epilogue(k);
        let k = fused.as_ref().unwrap_or(k);
        let g: &Gemm = match k.body.as_slice() {
            [Stmt::Gemm(g)] => g,
            _ => return Err("the convolution's kernel is not one matrix product".into()),
        };
        if !k.checks.is_empty() {
            return Err("the kernel checks indices".into());
        }
        if g.acc_dtype != DType::F32 {
            return Err(format!("accumulates in {}", g.acc_dtype.name()));
        }
        let (la, lb) = (loads(&g.a), loads(&g.b));
        let (&[xb], &[wb]) = (la.as_slice(), lb.as_slice()) else {
            return Err("the convolution's operands are computed (a fused prologue)".into());
        };
        // The input as stored: the conv's own input (channels-last), or the channels-first
        // tensor a transpose fused into this kernel makes it from.
        let fused_transpose = match p.graph.value(xv).def {
            tilec_ir::ValueDef::Node { node: t, .. } if p.nodes.contains(&t) => match &p.graph.node(t).op {
                Op::Layout(tilec_ir::op::LayoutOp::Transpose { perm }) if perm == &[0, 2, 3, 1] => Some(p.graph.node(t).inputs[0]),
                _ => return Err("the convolution's input is computed in its kernel (a fused prologue)".into()),
            },
            _ => None,
        };
        let (xs, ws) = (&k.buf(xb).shape, &k.buf(wb).shape);
        let same = |v, s: &[i64]| p.graph.value(v).ty.fixed_shape() == Some(s.iter().map(|&d| d as usize).collect());
        if !same(fused_transpose.unwrap_or(xv), xs) || !same(wv, ws) || xs.len() != 4 || ws.len() != 4 {
            return Err("the convolution's operands are not its input and weights".into());
        }
        let (dx, dw) = (k.buf(xb).dtype, k.buf(wb).dtype);
        if dx != dw || !matches!(dx, DType::F16 | DType::BF16) {
            return Err(format!("convolution over {} and {} (bf16 or f16)", dx.name(), dw.name()));
        }
        let u = |x: i64| x as usize;
        let (n, h, w, c) = match fused_transpose {
            Some(_) => (u(xs[0]), u(xs[2]), u(xs[3]), u(xs[1])),
            None => (u(xs[0]), u(xs[1]), u(xs[2]), u(xs[3])),
        };
        let (o, kh, kw) = (u(ws[0]), u(ws[2]), u(ws[3]));
        let (oh, ph, _) = window_geometry(h, window, 0, false)?;
        let (ow, pw, _) = window_geometry(w, window, 1, false)?;
        if matches!(window.pads, Padding::SameLower | Padding::SameUpper) {
            return Err("SAME padding is resolved by the importer; an unresolved one is not taken".into());
        }
        let geom = ConvGeom {
            n,
            h,
            w,
            c,
            kh,
            kw,
            oh,
            ow,
            stride: (window.strides[0], window.strides[1]),
            pad: (ph, pw),
            dil: (window.dilations[0], window.dilations[1]),
            nchw_input: fused_transpose.is_some(),
        };
        if u(g.batch) != n || u(g.m) != oh * ow || u(g.n) != o || u(g.k) != geom.k() {
            return Err(format!(
                "the lowered product {}x{}x{} x{} is not the convolution's {}x{}x{} x{n}",
                g.m,
                g.n,
                g.k,
                g.batch,
                oh * ow,
                o,
                geom.k()
            ));
        }
        let mut gemm = Problem::new(n * oh * ow, o, geom.k(), dx).with_layouts(Layout::RowMajor, Layout::ColMajor);
        gemm.out_dtype = DType::F32;
        gemm.lda = Some(c);
        gemm.ldb = Some(geom.k_padded());
        gemm.batch_stride_a = 0;
        gemm.batch_stride_b = 0;
        gemm.custom = Some(epilogue_fn(k, g, Some(oh * ow))?);
        let _ = target;
        Ok(MmaProblem { gemm, conv: Some(geom) })
    })())
}

/// The family's plan for a kernel: the problem (a matrix product or a convolution) with its
/// heuristic parameters.
pub fn mma_gemm(p: &FProblem, k: &Kernel, target: &GpuTarget) -> Result<FamilyPlan, String> {
    let cc = target.compute_capability;
    if cc.0 < 8 {
        return Err(format!("mma.sync and cp.async need compute capability 8.0; the device has {}.{}", cc.0, cc.1));
    }
    let pos = |buf: BufId| k.params.iter().position(|&b| b == buf).unwrap_or(0);
    let (problem, a, b) = match conv_view(p, k, target) {
        Some(conv) => {
            let problem = conv?;
            let fused = crate::schedule::fuse_scratch_epilogue(k);
            let kk = fused.as_ref().unwrap_or(k);
            let [Stmt::Gemm(g)] = kk.body.as_slice() else {
                return Err("not one matrix product".into());
            };
            let (xa, wb) = (loads(&g.a)[0], loads(&g.b)[0]);
            (problem, OperandRef { param: pos(xa), offset_bytes: 0 }, OperandRef { param: pos(wb), offset_bytes: 0 })
        }
        None => {
            let GemmView { problem, a, b } = gemm_view(k)?;
            (MmaProblem { gemm: problem, conv: None }, a, b)
        }
    };
    let params = mma::heuristic(&problem, target.sm_count as usize);
    mma::applies(&problem, &params, cc)?;
    Ok(plan(problem, params, a, b))
}

fn plan(problem: MmaProblem, params: Params, a: OperandRef, b: OperandRef) -> FamilyPlan {
    FamilyPlan {
        family: MMA_GEMM,
        entry: mma::kernel_name(&problem, &params, &a, &b),
        source: mma::render(&problem, &params, &a, &b),
        problem: problem.gemm,
        kind: PlanKind::Mma(params, problem.conv),
        a,
        b,
    }
}

/// The family as the registry holds it.
pub struct Sm80MmaGemm;
pub static SM80_MMA_GEMM: Sm80MmaGemm = Sm80MmaGemm;

const NAMES: [&str; 8] = ["tile_m", "tile_n", "tile_k", "warps_m", "warps_n", "stages", "split_k", "prefetch"];

fn to_params(q: &Params) -> FParams {
    let v = [q.tile_m, q.tile_n, q.tile_k, q.warps_m, q.warps_n, q.stages, q.split_k, q.prefetch];
    FParams(NAMES.iter().copied().zip(v.map(|x| x as i64)).collect())
}

fn with_params(q: Params, p: &FParams) -> Params {
    let get = |n: &str, d: usize| p.get(n).map_or(d, |v| v.max(0) as usize);
    Params {
        tile_m: get("tile_m", q.tile_m),
        tile_n: get("tile_n", q.tile_n),
        tile_k: get("tile_k", q.tile_k),
        warps_m: get("warps_m", q.warps_m),
        warps_n: get("warps_n", q.warps_n),
        stages: get("stages", q.stages),
        split_k: get("split_k", q.split_k),
        prefetch: get("prefetch", q.prefetch),
    }
}

/// The parameters and convolution geometry of an `mma` plan.
pub fn mma_parts(plan: &FamilyPlan) -> Option<(Params, Option<ConvGeom>)> {
    match &plan.kind {
        PlanKind::Mma(q, c) => Some((*q, *c)),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

fn plan_of(p: &FProblem, t: &Target) -> Result<FamilyPlan, String> {
    p.memo("sm80_mma_gemm.plan", || mma_gemm(p, &super::lowered(p)?.kernel, &t.gpu))
}

impl Family for Sm80MmaGemm {
    type Target = Target;
    type Built = super::GpuBuilt;

    fn name(&self) -> &'static str {
        MMA_GEMM
    }

    fn applies(&self, p: &FProblem, t: &Target) -> Result<(), String> {
        plan_of(p, t).map(drop)
    }

    fn space(&self, _p: &FProblem, _t: &Target) -> ParamSpace {
        ParamSpace {
            axes: vec![
                ("tile_m", vec![16, 32, 64, 128, 256]),
                ("tile_n", vec![64, 128, 256]),
                ("tile_k", vec![64, 128, 256]),
                ("warps_m", vec![1, 2, 4]),
                ("warps_n", vec![1, 2, 4]),
                ("stages", vec![2, 3, 4, 5, 6]),
                ("split_k", vec![1, 2, 4, 8, 16]),
                ("prefetch", vec![0, 128, 256]),
            ],
        }
    }

    fn check(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<(), String> {
        let plan = plan_of(p, t)?;
        let (q, conv) = mma_parts(&plan).ok_or("not an mma plan")?;
        let problem = MmaProblem { gemm: plan.problem.clone(), conv };
        mma::applies(&problem, &with_params(q, params), t.gpu.compute_capability)
    }

    fn heuristic(&self, p: &FProblem, t: &Target) -> FParams {
        plan_of(p, t).ok().and_then(|plan| mma_parts(&plan)).map(|(q, _)| to_params(&q)).unwrap_or_default()
    }

    fn build(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<super::GpuBuilt, String> {
        let mut built = plan_of(p, t)?;
        let (q0, conv) = mma_parts(&built).ok_or("not an mma plan")?;
        let q = with_params(q0, params);
        if q != q0 {
            let problem = MmaProblem { gemm: built.problem.clone(), conv };
            mma::applies(&problem, &q, t.gpu.compute_capability)?;
            built = plan(problem, q, built.a.clone(), built.b.clone());
        }
        let simt = super::TileIr(&super::simt_gemm::SimtGemm).build(p, t, &FParams::default())?;
        let source = CudaSource { name: built.entry.clone(), source: built.source.clone(), launch: built.launch(t.gpu.sm_count) };
        Ok(super::GpuBuilt {
            lowered: simt.lowered,
            scheduled: simt.scheduled,
            schedule: MMA_GEMM,
            source,
            plan: Some(built),
            fallback: Some((simt.schedule, simt.source)),
        })
    }
}
