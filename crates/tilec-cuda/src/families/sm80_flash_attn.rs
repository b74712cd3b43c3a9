//! `sm80_flash_attn`: the FlashAttention kernel of [`crate::flash`] for a kernel whose anchor
//! is the recognized `Attention` op over 16-bit Q, K and V read straight from the kernel's
//! buffers. Re-indexing the partitioner folded into the group (the reshapes and transposes
//! between `[batch, seq, heads * dim]` projections and `[batch, heads, seq, dim]` heads, before
//! Q, K, V and the mask and after the output) becomes the kernel's strides; anything else in
//! the group (a computed prologue, an epilogue that is not a re-indexing store) is refused
//! with the reason, as are the op's features the kernel does not have (past keys, padding
//! lengths, softcapping, windows, a requested QK output, head dims other than 64 and 128).
//! Any device of compute capability 8.0 or later. Its build carries the direct tile-IR nest
//! as a fallback.
//!
//! Attention is recognized on CUDA only with the opt-in (`TILEC_CUDA_ATTENTION=flash`, see
//! `tilec_opt::manager`), so by default this family never sees a kernel.

use tilec_ir::op::{LayoutOp, NnOp};
use tilec_ir::{DType, Graph, Op, ValueDef, ValueId};
use tilec_opt::target::Target;
use tilec_tile::family::{Family, ParamSpace, Params as FParams, Problem as FProblem};
use tilec_tile::lower::Lowered;

use super::template::{FamilyPlan, OperandRef, PlanKind};
use crate::flash::{self, Causal, FlashArgs, FlashProblem, Mask, MaskKind, Params, Strides};
use crate::gemm::Problem;
use crate::render::CudaSource;
use crate::schedule::GpuTarget;

/// The family's name.
pub const FLASH_ATTN: &str = "sm80_flash_attn";
/// The Hopper variant's name (`flash::sm90`: both products on `wgmma`).
pub const FLASH_ATTN_SM90: &str = "sm90_flash_attn";

/// Whether a schedule is one of the FlashAttention families.
pub fn is_flash(schedule: &str) -> bool {
    schedule == FLASH_ATTN || schedule == FLASH_ATTN_SM90
}

/// Strides of `shape` viewed as `new` without copying (size-1 axes get stride 0), or `None`
/// when the reshape merges axes that are not contiguous with each other.
pub fn reshape_view(shape: &[usize], strides: &[usize], new: &[usize]) -> Option<Vec<usize>> {
    if shape.contains(&0) || new.contains(&0) || shape.len() != strides.len() {
        return None;
    }
    let old: Vec<(usize, usize)> = shape.iter().copied().zip(strides.iter().copied()).filter(|&(d, _)| d != 1).collect();
    let mut out = vec![0; new.len()];
    let (mut i, mut j) = (0, 0);
    while j < new.len() {
        if new[j] == 1 {
            j += 1;
            continue;
        }
        let (i0, j0) = (i, j);
        let mut po = old.get(i)?.0;
        i += 1;
        let mut pn = new[j];
        j += 1;
        while po != pn {
            if po < pn {
                po *= old.get(i)?.0;
                i += 1;
            } else {
                pn *= *new.get(j)?;
                j += 1;
            }
        }
        for k in i0..i - 1 {
            if old[k].1 != old[k + 1].1 * old[k + 1].0 {
                return None;
            }
        }
        let mut st = old[i - 1].1;
        for k in (j0..j).rev() {
            out[k] = if new[k] == 1 { 0 } else { st };
            st *= new[k];
        }
    }
    (i == old.len()).then_some(out)
}

fn dense(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![0; shape.len()];
    let mut acc = 1;
    for k in (0..shape.len()).rev() {
        s[k] = if shape[k] == 1 { 0 } else { acc };
        acc *= shape[k];
    }
    s
}

fn shape_of(g: &Graph, v: ValueId) -> Result<Vec<usize>, String> {
    g.value(v).ty.fixed_shape().ok_or_else(|| format!("value '{}' has a symbolic shape", g.value(v).name))
}

/// The re-indexing op (reshape, transpose, or one piece of a split) producing `v` inside the
/// group, if any, with the piece's index for a split.
fn reindex_in_group(g: &Graph, nodes: &[tilec_ir::NodeId], v: ValueId) -> Result<Option<(ValueId, Op, usize)>, String> {
    let ValueDef::Node { node, .. } = g.value(v).def else {
        return Ok(None);
    };
    if !nodes.contains(&node) {
        return Ok(None);
    }
    let n = g.node(node);
    match &n.op {
        Op::Layout(LayoutOp::Reshape { .. } | LayoutOp::Transpose { .. } | LayoutOp::Split { .. }) => {
            let piece = n.outputs.iter().position(|&o| o == v).unwrap_or(0);
            Ok(Some((n.inputs[0], n.op.clone(), piece)))
        }
        op => Err(format!(
            "'{}' is computed in the kernel by {} (only reshapes, transposes and split pieces are read in place)",
            g.value(v).name,
            op.name()
        )),
    }
}

/// Applies a reshape, a transpose or a split's piece `piece` to a strided view at element
/// `offset`.
fn apply(g: &Graph, op: &Op, piece: usize, out: ValueId, view: (Vec<usize>, Vec<usize>, usize)) -> Result<(Vec<usize>, Vec<usize>, usize), String> {
    let (shape, strides, offset) = view;
    match op {
        Op::Layout(LayoutOp::Transpose { perm }) => {
            if perm.len() != shape.len() || perm.iter().any(|&p| p >= shape.len()) {
                return Err("a transpose whose permutation does not fit its input".into());
            }
            Ok((perm.iter().map(|&p| shape[p]).collect(), perm.iter().map(|&p| strides[p]).collect(), offset))
        }
        Op::Layout(LayoutOp::Split { axis, .. }) => {
            // A piece is the same strides over a shorter axis, starting after the pieces
            // before it.
            let new = shape_of(g, out)?;
            if *axis >= shape.len() || new.len() != shape.len() {
                return Err("a split that does not fit its input".into());
            }
            let ValueDef::Node { node, .. } = g.value(out).def else { return Err("a split piece without its node".into()) };
            let mut before = 0;
            for &o in &g.node(node).outputs[..piece] {
                before += shape_of(g, o)?[*axis];
            }
            Ok((new, strides.clone(), offset + before * strides[*axis]))
        }
        _ => {
            let new = shape_of(g, out)?;
            let st = reshape_view(&shape, &strides, &new).ok_or_else(|| format!("the reshape to '{}' is not a strided view", g.value(out).name))?;
            Ok((new, st, offset))
        }
    }
}

/// An input of the anchor as a strided view of one of the kernel's input parameters:
/// `(parameter, shape, strides, element offset)`.
fn input_view(g: &Graph, nodes: &[tilec_ir::NodeId], lw: &Lowered, v: ValueId, what: &str) -> Result<(usize, Vec<usize>, Vec<usize>, usize), String> {
    let mut chain = vec![];
    let mut cur = v;
    while let Some((src, op, piece)) = reindex_in_group(g, nodes, cur).map_err(|e| format!("{what}: {e}"))? {
        chain.push((op, piece, cur));
        cur = src;
    }
    let param = lw.inputs.iter().position(|&x| x == cur).ok_or_else(|| format!("{what} is not read from one of the kernel's buffers"))?;
    let shape = shape_of(g, cur)?;
    let mut view = (shape.clone(), dense(&shape), 0);
    for (op, piece, out) in chain.iter().rev() {
        view = apply(g, op, *piece, *out, view).map_err(|e| format!("{what}: {e}"))?;
    }
    Ok((param, view.0, view.1, view.2))
}

/// The anchor's output as a strided view of the kernel's one output parameter, through the
/// reshapes and transposes after it: `(parameter, strides of the output's shape)`.
fn output_view(g: &Graph, nodes: &[tilec_ir::NodeId], lw: &Lowered, y: ValueId) -> Result<(usize, Vec<usize>), String> {
    if lw.outputs.len() != 1 {
        return Err(format!("the kernel writes {} values (only the attention output, no present keys or QK scores)", lw.outputs.len()));
    }
    // Forward from y through single re-indexing readers to the stored value.
    let mut chain: Vec<(Op, ValueId, ValueId)> = vec![];
    let mut cur = y;
    while cur != lw.outputs[0] {
        let readers: Vec<_> = nodes.iter().filter(|&&n| g.node(n).inputs.contains(&cur)).collect();
        let [&n] = readers.as_slice() else {
            return Err(format!("the attention output is read by {} nodes of the kernel", readers.len()));
        };
        let node = g.node(n);
        if !matches!(node.op, Op::Layout(LayoutOp::Reshape { .. } | LayoutOp::Transpose { .. })) {
            return Err(format!("the epilogue computes {} (only reshapes and transposes are stored in place)", node.op.name()));
        }
        let out = node.outputs[0];
        chain.push((node.op.clone(), cur, out));
        cur = out;
    }
    let param = lw.inputs.len();
    let mut shape = shape_of(g, cur)?;
    let mut strides = dense(&shape);
    // Backwards: a transpose's input strides are its output's, permuted back; a reshape's
    // input is the output viewed in the input's shape.
    for (op, input, _) in chain.iter().rev() {
        let ishape = shape_of(g, *input)?;
        match op {
            Op::Layout(LayoutOp::Transpose { perm }) => {
                let mut st = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    st[p] = strides[i];
                }
                strides = st;
            }
            _ => {
                strides = reshape_view(&shape, &strides, &ishape).ok_or("the reshape after the attention output is not a strided view")?;
            }
        }
        shape = ishape;
    }
    Ok((param, strides))
}

/// `(batch, head, row)` strides of a 4-D `[B, H, S, D]` view or a 3-D `[B, S, H*D]` one, with
/// the head dim contiguous.
fn bhs(shape: &[usize], st: &[usize], heads: usize, d: usize, what: &str) -> Result<Strides, String> {
    let s = match shape.len() {
        4 => Strides { batch: st[0], head: st[1], row: st[2] },
        3 => {
            let v = reshape_view(shape, st, &[shape[0], shape[1], heads, d]).ok_or_else(|| format!("{what}: heads are not a strided view"))?;
            Strides { batch: v[0], head: v[2], row: v[1] }
        }
        _ => return Err(format!("{what} has rank {}", shape.len())),
    };
    let inner = if shape.len() == 4 { st[3] } else { st[2] };
    if inner != 1 && d > 1 {
        return Err(format!("{what}: the head dim is not contiguous (stride {inner})"));
    }
    Ok(s)
}

/// The family's plan for a lowered attention kernel, or why the family does not take it.
pub fn flash_plan(p: &FProblem, lw: &Lowered, target: &GpuTarget, wgmma: bool) -> Result<FamilyPlan, String> {
    let cc = target.compute_capability;
    if wgmma && cc != (9, 0) {
        return Err(format!("wgmma needs compute capability 9.0 (sm_90a); the device has {}.{}", cc.0, cc.1));
    }
    if cc.0 < 8 {
        return Err(format!("mma.sync and cp.async need compute capability 8.0; the device has {}.{}", cc.0, cc.1));
    }
    let anchor = p.anchor.ok_or("no anchor")?;
    let g = p.graph;
    let node = g.node(anchor);
    let Op::Nn(NnOp::Attention {
        q_num_heads,
        kv_num_heads,
        scale,
        is_causal,
        softcap,
        left_window,
        right_window,
        has_mask,
        has_past,
        has_nonpad,
        zero_nan_rows,
        ..
    }) = &node.op
    else {
        return Err("the anchor is not attention".into());
    };
    if *has_past || *has_nonpad {
        return Err("past keys or padding lengths (not in the kernel yet)".into());
    }
    if *softcap != 0.0 || *left_window >= 0 || *right_window >= 0 {
        return Err("softcapping or a sliding window (not in the kernel yet)".into());
    }
    if !lw.kernel.checks.is_empty() {
        return Err("the kernel checks indices".into());
    }
    let (qv, kv, vv) = (node.inputs[0], node.inputs[1], node.inputs[2]);
    let dtype = g.value(qv).ty.dtype;
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(format!("attention in {}, not bf16 or f16", dtype.name()));
    }
    let (qs, ks, vs) = (shape_of(g, qv)?, shape_of(g, kv)?, shape_of(g, vv)?);
    let rank3 = qs.len() == 3;
    let (batch, hq, sq, dq, hkv, sk, dv) = if rank3 {
        let (hq, hkv) = (*q_num_heads, *kv_num_heads);
        if hq == 0 || hkv == 0 {
            return Err("3-D attention without head counts".into());
        }
        (qs[0], hq, qs[1], qs[2] / hq, hkv, ks[1], vs[2] / hkv)
    } else {
        (qs[0], qs[1], qs[2], qs[3], ks[1], ks[2], vs[3])
    };
    if dq != dv || ks[ks.len() - 1] / if rank3 { hkv } else { 1 } != dq {
        return Err(format!("head dims differ (Q/K {dq}, V {dv})"));
    }
    let y = node.outputs[0];
    if g.value(y).ty.dtype != dtype {
        return Err("the output's dtype differs from the inputs'".into());
    }
    let nodes = &p.nodes;
    let (pq, sq_shape, sq_st, oq) = input_view(g, nodes, lw, qv, "Q")?;
    let (pk, sk_shape, sk_st, ok) = input_view(g, nodes, lw, kv, "K")?;
    let (pv, sv_shape, sv_st, ov) = input_view(g, nodes, lw, vv, "V")?;
    let esize = dtype.size_bytes();
    if let Some((what, _)) = [("Q", oq), ("K", ok), ("V", ov)].into_iter().find(|(_, o)| o * esize % 16 != 0) {
        return Err(format!("{what} starts {} bytes into its buffer (16-byte aligned rows are copied whole)", oq.max(ok).max(ov) * esize));
    }
    let (po, so_st) = output_view(g, nodes, lw, y)?;
    let so_shape = shape_of(g, y)?;
    let mut problem = FlashProblem::new(batch, hq, hkv, sq, sk, dq, dtype);
    problem.q = bhs(&sq_shape, &sq_st, hq, dq, "Q")?;
    problem.k = bhs(&sk_shape, &sk_st, hkv, dq, "K")?;
    problem.v = bhs(&sv_shape, &sv_st, hkv, dq, "V")?;
    problem.o = bhs(&so_shape, &so_st, hq, dq, "the output")?;
    problem.scale = scale.unwrap_or(1.0 / (dq as f32).sqrt());
    // ONNX Attention without a past: key j is visible from query i iff j <= i.
    problem.causal = is_causal.then_some(Causal::TopLeft);
    problem.zero_nan_rows = *zero_nan_rows;
    let mut mask_ref = None;
    if *has_mask {
        let mv = node.inputs[3];
        let (pm, ms, mst, mo) = input_view(g, nodes, lw, mv, "the mask")?;
        if mo != 0 {
            return Err("the mask is a piece of a split (read from its buffer's start only)".into());
        }
        let kind = match g.value(mv).ty.dtype {
            DType::Bool => MaskKind::Bool,
            d if d == dtype => MaskKind::Additive,
            d => return Err(format!("a {} mask", d.name())),
        };
        if ms.is_empty() || ms.len() > 4 {
            return Err(format!("a mask of rank {}", ms.len()));
        }
        let off = 4 - ms.len();
        let full = [batch, hq, sq, sk];
        let mut strides = [0; 4];
        for (i, (&d, &s)) in ms.iter().zip(&mst).enumerate() {
            let a = off + i;
            let ok = if a == 3 { d <= sk } else { d == 1 || d == full[a] };
            if !ok {
                return Err(format!("a mask {ms:?} that does not broadcast to {full:?}"));
            }
            strides[a] = if d == 1 && a != 3 { 0 } else { s };
        }
        problem.mask = Some(Mask { kind, strides, len: ms[ms.len() - 1] });
        mask_ref = Some(OperandRef { param: pm, offset_bytes: 0 });
    }
    let at = |param, off: usize| OperandRef { param, offset_bytes: (off * esize) as u64 };
    let args = FlashArgs { params: lw.inputs.len() + lw.outputs.len(), q: at(pq, oq), k: at(pk, ok), v: at(pv, ov), o: at(po, 0), mask: mask_ref };
    let params = if wgmma {
        flash::sm90::heuristic(&problem, target.sm_count as usize)
    } else {
        flash::heuristic(&problem, target.sm_count as usize)
    };
    flash::applies(&problem, &params, cc)?;
    Ok(plan(problem, params, args))
}

fn plan(problem: FlashProblem, params: Params, args: FlashArgs) -> FamilyPlan {
    // The GEMM-shaped summary reports read: the second product per (batch, head).
    let mut summary = Problem::new(problem.seq_q, problem.head_dim, problem.seq_k, problem.dtype);
    summary.batch = problem.batch * problem.heads_q;
    FamilyPlan {
        family: if params.wgmma { FLASH_ATTN_SM90 } else { FLASH_ATTN },
        entry: flash::kernel_name(&problem, &params, &args),
        source: flash::render(&problem, &params, &args),
        problem: summary,
        kind: PlanKind::Flash(Box::new(problem), params, args.clone()),
        a: args.q.clone(),
        b: args.k.clone(),
    }
}

/// The problem, parameters and operands of a flash plan.
pub fn flash_parts(plan: &FamilyPlan) -> Option<(&FlashProblem, Params, &FlashArgs)> {
    match &plan.kind {
        PlanKind::Flash(p, q, a) => Some((p, *q, a)),
        _ => None,
    }
}

/// The family as the registry holds it: the `mma.sync` kernel, or with `wgmma` the Hopper one.
pub struct FlashAttn {
    wgmma: bool,
}
pub static SM80_FLASH_ATTN: FlashAttn = FlashAttn { wgmma: false };
pub static SM90_FLASH_ATTN: FlashAttn = FlashAttn { wgmma: true };

const NAMES: [&str; 4] = ["block_m", "block_n", "warps", "stages"];

fn to_params(q: &Params) -> FParams {
    let v = [q.block_m, q.block_n, q.warps, q.stages];
    FParams(NAMES.iter().copied().zip(v.map(|x| x as i64)).collect())
}

fn with_params(q: Params, p: &FParams) -> Params {
    let get = |n: &str, d: usize| p.get(n).map_or(d, |v| v.max(0) as usize);
    if q.wgmma {
        let block_m = get("block_m", q.block_m);
        return Params { block_m, block_n: get("block_n", q.block_n), warps: 4 * (1 + block_m / 64), stages: get("stages", q.stages), wgmma: true };
    }
    Params { block_m: get("block_m", q.block_m), block_n: get("block_n", q.block_n), warps: get("warps", q.warps), stages: get("stages", q.stages), wgmma: q.wgmma }
}

fn plan_of(p: &FProblem, t: &Target, wgmma: bool) -> Result<FamilyPlan, String> {
    p.memo(if wgmma { "sm90_flash_attn.plan" } else { "sm80_flash_attn.plan" }, || {
        // Cheap refusals first: only attention anchors.
        match p.anchor_op() {
            Some(Op::Nn(NnOp::Attention { .. })) => {}
            _ => return Err("not an attention kernel".into()),
        }
        flash_plan(p, &super::lowered(p)?, &t.gpu, wgmma)
    })
}

impl Family for FlashAttn {
    type Target = Target;
    type Built = super::GpuBuilt;

    fn name(&self) -> &'static str {
        if self.wgmma {
            FLASH_ATTN_SM90
        } else {
            FLASH_ATTN
        }
    }

    fn applies(&self, p: &FProblem, t: &Target) -> Result<(), String> {
        plan_of(p, t, self.wgmma).map(drop)
    }

    fn space(&self, _p: &FProblem, _t: &Target) -> ParamSpace {
        if self.wgmma {
            // Warps follow from block_m (a producer and one consumer warpgroup per 64 rows).
            return ParamSpace { axes: vec![("block_m", vec![64, 128]), ("block_n", vec![64, 128]), ("stages", vec![2, 3, 4])] };
        }
        ParamSpace {
            axes: vec![("block_m", vec![64, 128]), ("block_n", vec![64, 128]), ("warps", vec![4, 8]), ("stages", vec![2, 3])],
        }
    }

    fn check(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<(), String> {
        let plan = plan_of(p, t, self.wgmma)?;
        let (fp, q, _) = flash_parts(&plan).ok_or("not a flash plan")?;
        flash::applies(fp, &with_params(q, params), t.gpu.compute_capability)
    }

    fn heuristic(&self, p: &FProblem, t: &Target) -> FParams {
        plan_of(p, t, self.wgmma).ok().and_then(|plan| flash_parts(&plan).map(|(_, q, _)| to_params(&q))).unwrap_or_default()
    }

    fn build(&self, p: &FProblem, t: &Target, params: &FParams) -> Result<super::GpuBuilt, String> {
        let mut built = plan_of(p, t, self.wgmma)?;
        let (fp, q0, args) = flash_parts(&built).map(|(a, b, c)| (a.clone(), b, c.clone())).ok_or("not a flash plan")?;
        let q = with_params(q0, params);
        if q != q0 {
            flash::applies(&fp, &q, t.gpu.compute_capability)?;
            built = plan(fp, q, args);
        }
        let direct = super::TileIr(&super::direct::Direct).build(p, t, &FParams::default())?;
        let source = CudaSource { name: built.entry.clone(), source: built.source.clone(), launch: built.launch(t.gpu.sm_count) };
        Ok(super::GpuBuilt {
            lowered: direct.lowered,
            scheduled: direct.scheduled,
            schedule: self.name(),
            source,
            plan: Some(built),
            fallback: Some((direct.schedule, direct.source)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshapes_of_strided_views() {
        // [2, 16, 256] split into heads, then the head transpose.
        let st = reshape_view(&[2, 16, 256], &dense(&[2, 16, 256]), &[2, 16, 4, 64]).unwrap();
        assert_eq!(st, vec![4096, 256, 64, 1]);
        // Merging transposed axes is not a view.
        assert_eq!(reshape_view(&[4, 16, 64], &[64, 256, 1], &[64, 64]), None);
        // Merging contiguous ones is; size-1 axes are free.
        assert_eq!(reshape_view(&[2, 1, 16, 64], &[1024, 0, 64, 1], &[32, 64]), Some(vec![64, 1]));
        assert_eq!(reshape_view(&[6], &[1], &[4]), None);
    }
}
