//! ONNX mappings for the layout family (Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
//! Concat, Split, Slice, Expand, Tile, Pad, DepthToSpace, SpaceToDepth, Shape, Size,
//! Trilu, Resize, Upsample, CenterCropPad), and import-time *shape folding*.
//!
//! Shape folding ([`fold_shape_op`]) runs before an op's family mapping: when every
//! input of a small integer computation has known contents (constants, or values folded
//! earlier whose elements may be symbolic dimensions), the node is evaluated here and
//! becomes a constant, or a `dim_values` source op when some element is symbolic. This
//! is how `Shape → Gather → Unsqueeze → Concat → Reshape` chains of exported models
//! import into a Reshape with a resolved (possibly symbolic) target shape.

use super::{ImportError, MapFn, NodeCx, ShapeElem};
use tilec_ir::op::{SliceBound, 
    dims_product, norm_axis, CoordMode, DimValue, LayoutOp, NearestMode, PadMode, ResizeAttrs, ResizeMode, SourceOp,
};
use tilec_ir::{DType, Dim, Op, SymExpr, Tensor, ValueId};

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    Some(match op_type {
        "Reshape" => map_reshape,
        "Flatten" => map_flatten,
        "Squeeze" => map_squeeze,
        "Unsqueeze" => map_unsqueeze,
        "Transpose" => map_transpose,
        "Concat" => map_concat,
        "Split" => map_split,
        "Slice" => map_slice,
        "Expand" => map_expand,
        "Tile" => map_tile,
        "Pad" => map_pad,
        "DepthToSpace" => map_depth_to_space,
        "SpaceToDepth" => map_space_to_depth,
        "Shape" => map_shape,
        "Size" => map_size,
        "Trilu" => map_trilu,
        "Resize" => map_resize,
        "Upsample" => map_upsample,
        "CenterCropPad" => map_center_crop_pad,
        _ => return None,
    })
}

// ---- small helpers ----

fn derive(cx: &mut NodeCx, e: SymExpr) -> Dim {
    cx.graph_mut().syms.derive(e)
}

fn rank_of(cx: &NodeCx, v: ValueId) -> usize {
    cx.ty(v).rank()
}

/// Normalizes possibly negative axes against `rank`; errors on out-of-range or repeats.
fn norm_axes(cx: &NodeCx, axes: &[i64], rank: usize) -> Result<Vec<usize>, ImportError> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = axis_in(cx, a, rank)?;
        if out.contains(&n) {
            return Err(cx.invalid(format!("axis {a} is repeated")));
        }
        out.push(n);
    }
    Ok(out)
}

/// A possibly negative axis of a tensor of `rank` (which must be at least 1).
fn axis_in(cx: &NodeCx, a: i64, rank: usize) -> Result<usize, ImportError> {
    if rank == 0 {
        return Err(cx.invalid(format!("axis {a} of a scalar")));
    }
    norm_axis(a, rank).map_err(|e| cx.invalid(e))
}

/// Axes from the `axes` attribute (before `input_from`) or input `idx` (from it on).
fn axes_attr_or_input(cx: &NodeCx, input_from: i64, idx: usize) -> Result<Option<Vec<i64>>, ImportError> {
    if cx.opset < input_from {
        cx.attr_ints("axes")
    } else if cx.input(idx).is_some() {
        Ok(Some(cx.const_ints(idx, "axes")?))
    } else {
        Ok(None)
    }
}

fn reshape(cx: &mut NodeCx, x: ValueId, shape: Vec<Dim>) -> Result<ValueId, ImportError> {
    if cx.ty(x).shape == shape {
        return Ok(x);
    }
    cx.emit1(Op::Layout(LayoutOp::Reshape { shape }), &[x])
}

fn transpose(cx: &mut NodeCx, x: ValueId, perm: Vec<usize>) -> Result<ValueId, ImportError> {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(x);
    }
    cx.emit1(Op::Layout(LayoutOp::Transpose { perm }), &[x])
}

fn elem_to_dim(cx: &NodeCx, e: ShapeElem, what: &str) -> Result<Dim, ImportError> {
    match e {
        ShapeElem::Int(n) if n >= 0 => Ok(Dim::Fixed(n as usize)),
        ShapeElem::Int(n) => Err(cx.invalid(format!("{what} has a negative entry {n}"))),
        ShapeElem::Sym(s) => Ok(Dim::Sym(s)),
    }
}

/// Resolves a Reshape target (0 = copy the input dim unless `allowzero`, -1 = inferred),
/// symbolically when the input has symbolic dims.
pub(super) fn resolve_reshape(
    cx: &mut NodeCx,
    input: &[Dim],
    spec: &[ShapeElem],
    allowzero: bool,
) -> Result<Vec<Dim>, ImportError> {
    let mut out: Vec<Option<Dim>> = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &e) in spec.iter().enumerate() {
        out.push(match e {
            ShapeElem::Int(0) if !allowzero => {
                Some(*input.get(i).ok_or_else(|| {
                    cx.invalid(format!("shape entry {i} is 0 but the input has rank {}", input.len()))
                })?)
            }
            ShapeElem::Int(-1) => {
                if infer_at.is_some() {
                    return Err(cx.invalid("more than one -1 in the target shape"));
                }
                infer_at = Some(i);
                None
            }
            ShapeElem::Int(n) if n < 0 => return Err(cx.invalid(format!("invalid shape entry {n}"))),
            ShapeElem::Int(n) => Some(Dim::Fixed(n as usize)),
            ShapeElem::Sym(s) => Some(Dim::Sym(s)),
        });
    }
    if let Some(k) = infer_at {
        // With `allowzero` and a literal 0 in the target, the input must be empty and -1
        // stands for the product of the input's non-zero dims over that of the target's (as
        // onnxruntime infers it: `[b, 0]` to `[-1, 0]` is `[b, 0]`). Otherwise -1 is
        // numel(input) / prod(target), which needs a non-zero divisor.
        let zero_rule = allowzero && spec.contains(&ShapeElem::Int(0));
        // Non-zero size of a symbolic dim: max(d, 1).
        let nonzero = |cx: &mut NodeCx, d: Dim| if zero_rule { derive(cx, SymExpr::Max(d, Dim::Fixed(1))) } else { d };
        let mut num: Vec<Dim> = Vec::new();
        let mut fixed_num: usize = 1;
        for &d in input {
            match d {
                Dim::Fixed(0) if zero_rule => {}
                // The input is a graph value: its non-zero dims multiply without overflow.
                Dim::Fixed(n) => fixed_num = fixed_num.saturating_mul(n),
                s => num.push(s),
            }
        }
        if zero_rule && num.is_empty() && !input.contains(&Dim::Fixed(0)) {
            return Err(cx.invalid(format!(
                "cannot infer -1: the target shape has a zero dim but the input of shape {} is not empty",
                cx.graph().syms.display_shape(input)
            )));
        }
        let mut den: Vec<Dim> = Vec::new();
        let mut fixed_den: usize = 1;
        for d in out.iter().flatten() {
            match *d {
                Dim::Fixed(0) if zero_rule => {}
                Dim::Fixed(n) => {
                    fixed_den = fixed_den
                        .checked_mul(n)
                        .ok_or_else(|| cx.invalid("the target shape's dims overflow when multiplied"))?
                }
                s => {
                    if let Some(p) = num.iter().position(|&x| x == s) {
                        num.remove(p);
                    } else {
                        den.push(s);
                    }
                }
            }
        }
        let num: Vec<Dim> = num.into_iter().map(|d| nonzero(cx, d)).collect();
        let den: Vec<Dim> = den.into_iter().map(|d| nonzero(cx, d)).collect();
        let d = if fixed_den == 0 {
            return Err(cx.invalid(format!(
                "cannot infer -1 for input shape {}: the other target dims multiply to 0",
                cx.graph().syms.display_shape(input)
            )));
        } else if num.is_empty() && den.is_empty() {
            if fixed_num % fixed_den != 0 {
                return Err(cx.invalid(format!(
                    "cannot reshape {fixed_num} elements into a shape with {fixed_den} elements per -1 unit"
                )));
            }
            Dim::Fixed(fixed_num / fixed_den)
        } else if den.is_empty() && fixed_num % fixed_den == 0 {
            let p = dims_product(&num, &mut cx.graph_mut().syms);
            derive(cx, SymExpr::Mul(p, Dim::Fixed(fixed_num / fixed_den)))
        } else {
            let mut n = dims_product(&num, &mut cx.graph_mut().syms);
            n = derive(cx, SymExpr::Mul(n, Dim::Fixed(fixed_num)));
            let mut dd = dims_product(&den, &mut cx.graph_mut().syms);
            dd = derive(cx, SymExpr::Mul(dd, Dim::Fixed(fixed_den)));
            derive(cx, SymExpr::Div(n, dd))
        };
        out[k] = Some(d);
    }
    Ok(out.into_iter().map(|d| d.unwrap_or(Dim::Fixed(0))).collect())
}

// ---- mappings ----

fn map_reshape(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let spec = if cx.opset < 5 {
        cx.attr_ints("shape")?
            .ok_or_else(|| cx.invalid("missing 'shape' attribute"))?
            .into_iter()
            .map(ShapeElem::Int)
            .collect()
    } else {
        cx.shape_input(1, "target shape")?
    };
    let allowzero = cx.attr_i("allowzero", 0)? != 0;
    let input = cx.ty(x).shape.clone();
    let shape = resolve_reshape(cx, &input, &spec, allowzero)?;
    Ok(vec![reshape(cx, x, shape)?])
}

fn map_flatten(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let shape = cx.ty(x).shape.clone();
    let r = shape.len() as i64;
    let mut axis = cx.attr_i("axis", 1)?;
    if axis < 0 {
        axis += r;
    }
    if axis < 0 || axis > r {
        return Err(cx.invalid(format!("axis {axis} out of range for rank {r}")));
    }
    let a = dims_product(&shape[..axis as usize], &mut cx.graph_mut().syms);
    let b = dims_product(&shape[axis as usize..], &mut cx.graph_mut().syms);
    Ok(vec![reshape(cx, x, vec![a, b])?])
}

/// Output shape of Squeeze.
fn squeeze_shape(cx: &NodeCx, shape: &[Dim], axes: Option<Vec<i64>>) -> Result<Vec<Dim>, ImportError> {
    match axes {
        None => Ok(shape.iter().copied().filter(|&d| d != Dim::Fixed(1)).collect()),
        Some(axes) => {
            let axes = norm_axes(cx, &axes, shape.len())?;
            for &a in &axes {
                if let Dim::Fixed(n) = shape[a] {
                    if n != 1 {
                        return Err(cx.invalid(format!("cannot squeeze axis {a} of size {n}")));
                    }
                }
            }
            Ok(shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect())
        }
    }
}

/// Output shape of Unsqueeze.
fn unsqueeze_shape(cx: &NodeCx, shape: &[Dim], axes: &[i64]) -> Result<Vec<Dim>, ImportError> {
    let r = shape.len() + axes.len();
    let axes = norm_axes(cx, axes, r)?;
    let mut it = shape.iter();
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        if axes.contains(&i) {
            out.push(Dim::Fixed(1));
        } else {
            out.push(*it.next().ok_or_else(|| cx.invalid("bad unsqueeze axes"))?);
        }
    }
    Ok(out)
}

fn map_squeeze(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let axes = axes_attr_or_input(cx, 13, 1)?;
    let shape = squeeze_shape(cx, &cx.ty(x).shape.clone(), axes)?;
    Ok(vec![reshape(cx, x, shape)?])
}

fn map_unsqueeze(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let axes = axes_attr_or_input(cx, 13, 1)?.ok_or_else(|| cx.invalid("Unsqueeze needs axes"))?;
    let shape = unsqueeze_shape(cx, &cx.ty(x).shape.clone(), &axes)?;
    Ok(vec![reshape(cx, x, shape)?])
}

fn map_transpose(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let r = rank_of(cx, x);
    let perm = match cx.attr_ints("perm")? {
        Some(p) => {
            let mut seen = vec![false; r];
            let mut out = Vec::with_capacity(r);
            for &v in &p {
                let a = axis_in(cx, v, r)?;
                if seen[a] {
                    return Err(cx.invalid(format!("perm {p:?} is not a permutation")));
                }
                seen[a] = true;
                out.push(a);
            }
            if out.len() != r {
                return Err(cx.invalid(format!("perm {p:?} does not match rank {r}")));
            }
            out
        }
        None => (0..r).rev().collect(),
    };
    Ok(vec![cx.emit1(Op::Layout(LayoutOp::Transpose { perm }), &[x])?])
}

fn map_concat(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let mut ins = Vec::new();
    for i in 0..cx.n_inputs() {
        if let Some(v) = cx.input(i) {
            ins.push(v);
        }
    }
    let first = *ins.first().ok_or_else(|| cx.invalid("Concat needs inputs"))?;
    let r = rank_of(cx, first);
    let axis = cx.attr_i_opt("axis")?.ok_or_else(|| cx.invalid("missing 'axis' attribute"))?;
    let axis = norm_axis(axis, r).map_err(|e| cx.invalid(e))?;
    if r == 0 {
        return Err(cx.invalid("cannot concatenate scalars"));
    }
    Ok(vec![cx.emit1(Op::Layout(LayoutOp::Concat { axis }), &ins)?])
}

fn map_split(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let shape = cx.ty(x).shape.clone();
    let axis = axis_in(cx, cx.attr_i("axis", 0)?, shape.len())?;
    let d = shape[axis];
    let split = if cx.opset < 13 {
        match cx.attr_ints("split")? {
            Some(s) if !s.is_empty() => Some(s),
            _ => match cx.input(1) {
                Some(_) => Some(cx.const_ints(1, "split sizes")?),
                None => None,
            },
        }
    } else if cx.input(1).is_some() {
        Some(cx.const_ints(1, "split sizes")?)
    } else {
        None
    };
    let sizes: Vec<Dim> = match split {
        Some(s) => {
            let mut v = Vec::with_capacity(s.len());
            for n in s {
                if n < 0 {
                    return Err(cx.invalid(format!("negative split size {n}")));
                }
                v.push(Dim::Fixed(n as usize));
            }
            v
        }
        None => {
            let n = match cx.attr_i_opt("num_outputs")? {
                Some(n) if cx.opset >= 18 => n,
                _ => cx.node.output.len() as i64,
            };
            if n <= 0 {
                return Err(cx.invalid(format!("cannot split into {n} outputs")));
            }
            let n = n as usize;
            match d {
                Dim::Fixed(len) => {
                    if cx.attr_i_opt("num_outputs")?.is_some() {
                        // Opset 18: ceil-sized chunks, the last one smaller.
                        let chunk = len.div_ceil(n);
                        let mut v = Vec::with_capacity(n);
                        let mut left = len;
                        for _ in 0..n {
                            let c = chunk.min(left);
                            v.push(Dim::Fixed(c));
                            left -= c;
                        }
                        v
                    } else {
                        if len % n != 0 {
                            return Err(cx.invalid(format!("axis of size {len} does not split evenly into {n}")));
                        }
                        vec![Dim::Fixed(len / n); n]
                    }
                }
                s if cx.attr_i_opt("num_outputs")?.is_some() => {
                    let chunk = derive(cx, SymExpr::CeilDiv(s, Dim::Fixed(n)));
                    let head = derive(cx, SymExpr::Mul(chunk, Dim::Fixed(n - 1)));
                    let mut v = vec![chunk; n - 1];
                    v.push(derive(cx, SymExpr::Sub(s, head)));
                    v
                }
                s => {
                    let chunk = derive(cx, SymExpr::Div(s, Dim::Fixed(n)));
                    vec![chunk; n]
                }
            }
        }
    };
    cx.emit(Op::Layout(LayoutOp::Split { axis, sizes }), &[x])
}

/// Slice parameters: (starts, ends, axes, steps) as written. Starts and ends may be
/// symbolic dimensions (from folded shape computations).
#[allow(clippy::type_complexity)]
fn slice_params(
    cx: &NodeCx,
) -> Result<(Vec<SliceBound>, Vec<SliceBound>, Option<Vec<i64>>, Option<Vec<i64>>), ImportError> {
    let bound = |e: ShapeElem| match e {
        ShapeElem::Int(v) => SliceBound::Index(v),
        ShapeElem::Sym(s) => SliceBound::Dim(Dim::Sym(s)),
    };
    if cx.opset < 10 {
        let starts = cx.attr_ints("starts")?.ok_or_else(|| cx.invalid("missing 'starts'"))?;
        let ends = cx.attr_ints("ends")?.ok_or_else(|| cx.invalid("missing 'ends'"))?;
        let idx = |v: Vec<i64>| v.into_iter().map(SliceBound::Index).collect();
        Ok((idx(starts), idx(ends), cx.attr_ints("axes")?, None))
    } else {
        let starts = cx.shape_input(1, "slice starts")?.into_iter().map(bound).collect();
        let ends = cx.shape_input(2, "slice ends")?.into_iter().map(bound).collect();
        let axes = if cx.input(3).is_some() { Some(cx.const_ints(3, "slice axes")?) } else { None };
        let steps = if cx.input(4).is_some() { Some(cx.const_ints(4, "slice steps")?) } else { None };
        Ok((starts, ends, axes, steps))
    }
}

#[allow(clippy::type_complexity)]
fn normalized_slice(
    cx: &NodeCx,
    rank: usize,
) -> Result<(Vec<usize>, Vec<SliceBound>, Vec<SliceBound>, Vec<i64>), ImportError> {
    let (starts, ends, axes, steps) = slice_params(cx)?;
    let n = starts.len();
    if ends.len() != n {
        return Err(cx.invalid("starts and ends differ in length"));
    }
    let axes = match axes {
        Some(a) => {
            if a.len() != n {
                return Err(cx.invalid("axes and starts differ in length"));
            }
            norm_axes(cx, &a, rank)?
        }
        None => {
            if n > rank {
                return Err(cx.invalid(format!("{n} starts for rank {rank}")));
            }
            (0..n).collect()
        }
    };
    let steps = match steps {
        Some(s) => {
            if s.len() != n {
                return Err(cx.invalid("steps and starts differ in length"));
            }
            if s.contains(&0) {
                return Err(cx.invalid("slice step 0"));
            }
            s
        }
        None => vec![1; n],
    };
    Ok((axes, starts, ends, steps))
}

fn map_slice(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let (axes, starts, ends, steps) = normalized_slice(cx, rank_of(cx, x))?;
    Ok(vec![cx.emit1(Op::Layout(LayoutOp::Slice { axes, starts, ends, steps }), &[x])?])
}

fn map_expand(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let spec = cx.shape_input(1, "expand shape")?;
    let mut shape = Vec::with_capacity(spec.len());
    for e in spec {
        shape.push(elem_to_dim(cx, e, "expand shape")?);
    }
    Ok(vec![cx.emit1(Op::Layout(LayoutOp::Expand { shape }), &[x])?])
}

fn map_tile(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let reps = cx.const_ints(1, "tile repeats")?;
    let mut repeats = Vec::with_capacity(reps.len());
    for r in reps {
        if r < 0 {
            return Err(cx.invalid(format!("negative repeat {r}")));
        }
        repeats.push(r as usize);
    }
    Ok(vec![cx.emit1(Op::Layout(LayoutOp::Tile { repeats }), &[x])?])
}

/// A scalar of `dtype` holding `v`.
fn scalar_of(dtype: DType, v: f64) -> Result<Tensor, String> {
    Tensor::from_f64s(dtype, vec![], &[v]).map_err(|e| e.to_string())
}

fn map_pad(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let dtype = cx.ty(x).dtype;
    let r = rank_of(cx, x);
    let mode = match cx.attr_s("mode")?.as_deref().unwrap_or("constant") {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => return Err(cx.unsupported(format!("pad mode '{m}'"))),
    };
    let (raw, value, axes) = if cx.opset < 11 {
        let p = cx
            .attr_ints("pads")?
            .or(cx.attr_ints("paddings")?)
            .ok_or_else(|| cx.invalid("missing 'pads' attribute"))?;
        let v = cx.attr_f("value", 0.0)?;
        let t = scalar_of(dtype, v as f64).map_err(|e| cx.invalid(e))?;
        (p, cx.constant(t), None)
    } else {
        let p = cx.const_ints(1, "pads")?;
        let value = match cx.input(2) {
            Some(v) => {
                let ty = cx.ty(v).clone();
                if ty.dtype != dtype {
                    return Err(cx.invalid(format!("constant_value is {}, data is {dtype}", ty.dtype)));
                }
                if ty.shape.is_empty() {
                    v
                } else if ty.numel() == Some(1) {
                    reshape(cx, v, vec![])?
                } else {
                    return Err(cx.invalid("constant_value must be a scalar"));
                }
            }
            None => {
                let t = Tensor::zeros(dtype, vec![]);
                cx.constant(t)
            }
        };
        let axes = if cx.input(3).is_some() { Some(cx.const_ints(3, "pad axes")?) } else { None };
        (p, value, axes)
    };
    let pads = match axes {
        None => {
            if raw.len() != 2 * r {
                return Err(cx.invalid(format!("{} pads for rank {r}", raw.len())));
            }
            raw
        }
        Some(axes) => {
            let axes = norm_axes(cx, &axes, r)?;
            let k = axes.len();
            if raw.len() != 2 * k {
                return Err(cx.invalid(format!("{} pads for {k} axes", raw.len())));
            }
            let mut p = vec![0; 2 * r];
            for (i, &a) in axes.iter().enumerate() {
                p[a] = raw[i];
                p[a + r] = raw[i + k];
            }
            p
        }
    };
    if pads.iter().all(|&p| p == 0) {
        return Ok(vec![x]);
    }
    Ok(vec![cx.emit1(Op::Layout(LayoutOp::Pad { pads, mode }), &[x, value])?])
}

fn blocksize(cx: &NodeCx) -> Result<usize, ImportError> {
    let b = cx.attr_i_opt("blocksize")?.ok_or_else(|| cx.invalid("missing 'blocksize'"))?;
    if b <= 0 {
        return Err(cx.invalid(format!("blocksize {b} must be positive")));
    }
    Ok(b as usize)
}

fn nchw(cx: &NodeCx, x: ValueId) -> Result<[Dim; 4], ImportError> {
    let s = &cx.ty(x).shape;
    if s.len() != 4 {
        return Err(cx.invalid(format!("expects a rank-4 input, got rank {}", s.len())));
    }
    Ok([s[0], s[1], s[2], s[3]])
}

fn div_exact(cx: &mut NodeCx, d: Dim, k: usize, what: &str) -> Result<Dim, ImportError> {
    match d {
        Dim::Fixed(n) if n % k != 0 => Err(cx.invalid(format!("{what} ({n}) is not divisible by {k}"))),
        _ => Ok(derive(cx, SymExpr::Div(d, Dim::Fixed(k)))),
    }
}

fn map_depth_to_space(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let b = blocksize(cx)?;
    let [n, c, h, w] = nchw(cx, x)?;
    let crd = match cx.attr_s("mode")?.as_deref().unwrap_or("DCR") {
        "DCR" => false,
        "CRD" => true,
        m => return Err(cx.invalid(format!("unknown mode '{m}'"))),
    };
    let c2 = div_exact(cx, c, b * b, "channels")?;
    let bd = Dim::Fixed(b);
    let (tmp, perm) = if crd {
        (vec![n, c2, bd, bd, h, w], vec![0, 1, 4, 2, 5, 3])
    } else {
        (vec![n, bd, bd, c2, h, w], vec![0, 3, 4, 1, 5, 2])
    };
    let r = reshape(cx, x, tmp)?;
    let t = transpose(cx, r, perm)?;
    let hb = derive(cx, SymExpr::Mul(h, bd));
    let wb = derive(cx, SymExpr::Mul(w, bd));
    Ok(vec![reshape(cx, t, vec![n, c2, hb, wb])?])
}

fn map_space_to_depth(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let b = blocksize(cx)?;
    let [n, c, h, w] = nchw(cx, x)?;
    let crd = match cx.attr_s("mode")?.as_deref().unwrap_or("DCR") {
        "DCR" => false,
        "CRD" => true,
        m => return Err(cx.invalid(format!("unknown mode '{m}'"))),
    };
    let h2 = div_exact(cx, h, b, "height")?;
    let w2 = div_exact(cx, w, b, "width")?;
    let bd = Dim::Fixed(b);
    let r = reshape(cx, x, vec![n, c, h2, bd, w2, bd])?;
    let perm = if crd { vec![0, 1, 3, 5, 2, 4] } else { vec![0, 3, 5, 1, 2, 4] };
    let t = transpose(cx, r, perm)?;
    let cb = derive(cx, SymExpr::Mul(c, Dim::Fixed(b * b)));
    Ok(vec![reshape(cx, t, vec![n, cb, h2, w2])?])
}

fn map_shape(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    match fold_shape_op(cx)? {
        Some(v) => Ok(v),
        None => Err(cx.invalid("cannot compute the shape")),
    }
}

fn map_size(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    map_shape(cx)
}

fn map_trilu(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let upper = cx.attr_i("upper", 1)? != 0;
    let k = if cx.input(1).is_some() {
        let v = cx.const_ints(1, "k")?;
        *v.first().ok_or_else(|| cx.invalid("k is empty"))?
    } else {
        0
    };
    Ok(vec![cx.emit1(Op::Layout(LayoutOp::Trilu { upper, k }), &[x])?])
}

fn map_center_crop_pad(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let shape = cx.ty(x).shape.clone();
    let r = shape.len();
    let target = cx.const_ints(1, "target shape")?;
    let axes = match cx.attr_ints("axes")? {
        Some(a) => norm_axes(cx, &a, r)?,
        None => (0..r).collect(),
    };
    if target.len() != axes.len() {
        return Err(cx.invalid(format!("{} target sizes for {} axes", target.len(), axes.len())));
    }
    let (mut sl_axes, mut starts, mut ends) = (vec![], vec![], vec![]);
    let mut pads = vec![0i64; 2 * r];
    for (&a, &t) in axes.iter().zip(&target) {
        let d = shape[a].fixed().ok_or_else(|| cx.unsupported("center crop/pad of a symbolic dim"))? as i64;
        if t < 0 {
            return Err(cx.invalid(format!("negative target size {t}")));
        }
        if t < d {
            let s = (d - t) / 2;
            sl_axes.push(a);
            starts.push(SliceBound::Index(s));
            ends.push(SliceBound::Index(s + t));
        } else if t > d {
            let b = (t - d) / 2;
            pads[a] = b;
            pads[a + r] = t - d - b;
        }
    }
    let mut y = x;
    if !sl_axes.is_empty() {
        let steps = vec![1; sl_axes.len()];
        y = cx.emit1(Op::Layout(LayoutOp::Slice { axes: sl_axes, starts, ends, steps }), &[y])?;
    }
    if pads.iter().any(|&p| p != 0) {
        let dtype = cx.ty(x).dtype;
        let zero = cx.constant(Tensor::zeros(dtype, vec![]));
        y = cx.emit1(Op::Layout(LayoutOp::Pad { pads, mode: PadMode::Constant }), &[y, zero])?;
    }
    Ok(vec![y])
}

// ---- Resize / Upsample ----

fn resize_common(
    cx: &mut NodeCx,
    x: ValueId,
    scales_in: Option<Vec<f64>>,
    sizes_in: Option<Vec<ShapeElem>>,
    roi_in: Vec<f64>,
    legacy: bool,
) -> Result<Vec<ValueId>, ImportError> {
    let shape = cx.ty(x).shape.clone();
    let r = shape.len();
    let mode = match cx.attr_s("mode")?.as_deref().unwrap_or("nearest") {
        "nearest" => ResizeMode::Nearest,
        "linear" | "bilinear" | "trilinear" => ResizeMode::Linear,
        "cubic" | "bicubic" => ResizeMode::Cubic,
        m => return Err(cx.invalid(format!("unknown mode '{m}'"))),
    };
    let coord = if legacy {
        CoordMode::Asymmetric
    } else {
        match cx.attr_s("coordinate_transformation_mode")?.as_deref().unwrap_or("half_pixel") {
            "half_pixel" => CoordMode::HalfPixel,
            "half_pixel_symmetric" => CoordMode::HalfPixelSymmetric,
            "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
            "align_corners" => CoordMode::AlignCorners,
            "asymmetric" => CoordMode::Asymmetric,
            "tf_crop_and_resize" => CoordMode::TfCropAndResize,
            "tf_half_pixel_for_nn" => return Err(cx.unsupported("coordinate mode tf_half_pixel_for_nn")),
            m => return Err(cx.invalid(format!("unknown coordinate_transformation_mode '{m}'"))),
        }
    };
    let nearest = if legacy {
        NearestMode::Floor
    } else {
        match cx.attr_s("nearest_mode")?.as_deref().unwrap_or("round_prefer_floor") {
            "round_prefer_floor" => NearestMode::RoundPreferFloor,
            "round_prefer_ceil" => NearestMode::RoundPreferCeil,
            "floor" => NearestMode::Floor,
            "ceil" => NearestMode::Ceil,
            m => return Err(cx.invalid(format!("unknown nearest_mode '{m}'"))),
        }
    };
    let axes = match cx.attr_ints("axes")? {
        Some(a) if cx.opset >= 18 => norm_axes(cx, &a, r)?,
        _ => (0..r).collect(),
    };
    let k = axes.len();
    let policy = cx.attr_s("keep_aspect_ratio_policy")?.unwrap_or_else(|| "stretch".into());
    let mut scales = vec![1.0f64; r];
    let mut sizes: Vec<Dim> = shape.clone();
    if let Some(sz) = sizes_in {
        if sz.len() != k {
            return Err(cx.invalid(format!("{} sizes for {k} axes", sz.len())));
        }
        let mut fixed_in = Vec::with_capacity(k);
        for (i, &a) in axes.iter().enumerate() {
            match (sz[i], shape[a]) {
                // A symbolic size equal to the input's dim: this axis is not resized.
                (ShapeElem::Sym(s), d) if d == Dim::Sym(s) => {
                    if policy != "stretch" {
                        return Err(cx.unsupported("keep_aspect_ratio_policy with symbolic sizes"));
                    }
                    fixed_in.push(f64::NAN);
                }
                (ShapeElem::Int(n), Dim::Fixed(d)) if n >= 0 => {
                    scales[a] = n as f64 / d as f64;
                    sizes[a] = Dim::Fixed(n as usize);
                    fixed_in.push(d as f64);
                }
                (ShapeElem::Int(n), _) if n < 0 => return Err(cx.invalid(format!("negative size {n}"))),
                _ => return Err(cx.unsupported("resize of a symbolic dim by sizes")),
            }
        }
        if policy != "stretch" {
            let it = axes.iter().map(|&a| scales[a]);
            let s = match policy.as_str() {
                "not_larger" => it.fold(f64::INFINITY, f64::min),
                "not_smaller" => it.fold(f64::NEG_INFINITY, f64::max),
                p => return Err(cx.invalid(format!("unknown keep_aspect_ratio_policy '{p}'"))),
            };
            for (i, &a) in axes.iter().enumerate() {
                scales[a] = s;
                sizes[a] = Dim::Fixed((s * fixed_in[i] + 0.5) as usize);
            }
        }
    } else if let Some(sc) = scales_in {
        if sc.len() != k {
            return Err(cx.invalid(format!("{} scales for {k} axes", sc.len())));
        }
        for (i, &a) in axes.iter().enumerate() {
            let s = sc[i];
            if !(s > 0.0) || !s.is_finite() {
                return Err(cx.invalid(format!("scale {s} must be positive")));
            }
            scales[a] = s;
            sizes[a] = match shape[a] {
                Dim::Fixed(n) => Dim::Fixed((s * n as f64) as usize),
                d if s.fract() == 0.0 => derive(cx, SymExpr::Mul(d, Dim::Fixed(s as usize))),
                _ => return Err(cx.unsupported("a fractional scale of a symbolic dim")),
            };
        }
    } else {
        return Err(cx.invalid("Resize needs scales or sizes"));
    }
    let roi = if coord == CoordMode::TfCropAndResize {
        if roi_in.len() != 2 * k {
            return Err(cx.invalid(format!("roi has {} values, expected {}", roi_in.len(), 2 * k)));
        }
        let mut full = vec![0.0; r];
        full.extend(std::iter::repeat_n(1.0, r));
        for (i, &a) in axes.iter().enumerate() {
            full[a] = roi_in[i];
            full[a + r] = roi_in[i + k];
        }
        full
    } else {
        vec![]
    };
    let attrs = ResizeAttrs {
        mode,
        coord,
        nearest,
        cubic_a: cx.attr_f("cubic_coeff_a", -0.75)? as f64,
        exclude_outside: cx.attr_i("exclude_outside", 0)? != 0,
        antialias: cx.attr_i("antialias", 0)? != 0,
        extrapolation_value: cx.attr_f("extrapolation_value", 0.0)? as f64,
        sizes,
        scales,
        roi,
    };
    if attrs.antialias && mode == ResizeMode::Nearest {
        return Err(cx.invalid("antialias is not defined for nearest"));
    }
    Ok(vec![cx.emit1(Op::Layout(LayoutOp::Resize(Box::new(attrs))), &[x])?])
}

/// Float values of an optional input, `None` when absent or empty.
fn opt_floats(cx: &NodeCx, i: usize, what: &str) -> Result<Option<Vec<f64>>, ImportError> {
    if cx.input(i).is_none() {
        return Ok(None);
    }
    let v = cx.const_floats(i, what)?;
    Ok(if v.is_empty() { None } else { Some(v) })
}

fn map_resize(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    if cx.opset < 11 {
        let scales = opt_floats(cx, 1, "scales")?;
        return resize_common(cx, x, scales, None, vec![], true);
    }
    let roi = opt_floats(cx, 1, "roi")?.unwrap_or_default();
    let scales = opt_floats(cx, 2, "scales")?;
    let sizes = if cx.input(3).is_some() {
        let s = cx.shape_input(3, "sizes")?;
        if s.is_empty() {
            None
        } else {
            Some(s)
        }
    } else {
        None
    };
    if scales.is_some() && sizes.is_some() {
        return Err(cx.invalid("only one of scales and sizes may be given"));
    }
    resize_common(cx, x, scales, sizes, roi, false)
}

fn map_upsample(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let scales = if cx.opset < 9 {
        cx.attr_floats("scales")?.map(|v| v.into_iter().map(|f| f as f64).collect())
    } else {
        opt_floats(cx, 1, "scales")?
    };
    resize_common(cx, x, scales, None, vec![], true)
}

// ---- shape folding ----

/// Folding only applies to small tensors.
const FOLD_LIMIT: usize = 4096;

/// Whether [`fold_shape_op`] may handle this op type (the framework then accepts the
/// op even when no family maps it, as long as the folding succeeds).
pub(super) fn is_foldable(op_type: &str) -> bool {
    matches!(
        op_type,
        "Shape"
            | "Size"
            | "Gather"
            | "Concat"
            | "Slice"
            | "Unsqueeze"
            | "Squeeze"
            | "Reshape"
            | "Flatten"
            | "Cast"
            | "CastLike"
            | "Add"
            | "Sub"
            | "Mul"
            | "Div"
            | "Mod"
            | "Neg"
            | "Abs"
            | "Max"
            | "Min"
            | "Equal"
            | "Less"
            | "Greater"
            | "LessOrEqual"
            | "GreaterOrEqual"
            | "Not"
            | "And"
            | "Or"
            | "Where"
            | "ConstantOfShape"
            | "Range"
    )
}

/// A small tensor with known elements.
struct Known {
    elems: Vec<ShapeElem>,
    shape: Vec<usize>,
    dtype: DType,
}

fn known(cx: &NodeCx, i: usize) -> Option<Known> {
    let v = cx.input(i)?;
    let ty = cx.ty(v);
    let shape = ty.fixed_shape()?;
    let dtype = ty.dtype;
    if !(dtype.is_int() || dtype.is_bool()) || shape.iter().product::<usize>() > FOLD_LIMIT {
        return None;
    }
    let elems = cx.value_contents(v)?;
    if elems.len() != shape.iter().product::<usize>() {
        return None;
    }
    Some(Known { elems, shape, dtype })
}

/// Wraps integers to `dtype` as a cast would.
fn wrap_to(dtype: DType, v: i64) -> i64 {
    Tensor::from_i64s(dtype, vec![], &[v]).map(|t| t.to_i64_vec()[0]).unwrap_or(v)
}

/// Emits a value with the given known elements: a constant when all are integers, else a
/// `dim_values` op; records its contents.
pub(super) fn known_value(
    cx: &mut NodeCx,
    elems: Vec<ShapeElem>,
    shape: Vec<usize>,
    dtype: DType,
) -> Result<ValueId, ImportError> {
    let elems: Vec<ShapeElem> = elems
        .into_iter()
        .map(|e| match e {
            ShapeElem::Int(v) => ShapeElem::Int(wrap_to(dtype, v)),
            s => s,
        })
        .collect();
    if let Some(ints) = elems.iter().map(|e| e.as_int()).collect::<Option<Vec<i64>>>() {
        let t = Tensor::from_i64s(dtype, shape, &ints).map_err(|e| cx.invalid(e.to_string()))?;
        return Ok(cx.constant(t));
    }
    if !dtype.is_int() {
        return Err(cx.invalid("symbolic contents need an integer dtype"));
    }
    let dv = elems
        .iter()
        .map(|&e| match e {
            ShapeElem::Int(v) => DimValue::Int(v),
            ShapeElem::Sym(s) => DimValue::Dim(Dim::Sym(s)),
        })
        .collect();
    let v = cx.emit1(Op::Source(SourceOp::DimValues { elems: dv, shape, dtype }), &[])?;
    cx.set_contents(v, elems);
    Ok(v)
}

fn dim_elem(d: Dim) -> ShapeElem {
    ShapeElem::from_dim(d)
}

fn elem_dim(e: ShapeElem) -> Option<Dim> {
    match e {
        ShapeElem::Int(v) if v >= 0 => Some(Dim::Fixed(v as usize)),
        ShapeElem::Int(_) => None,
        ShapeElem::Sym(s) => Some(Dim::Sym(s)),
    }
}

/// Numpy broadcast of small fixed shapes: output shape and per-input flat indices.
fn broadcast_known(shapes: &[&[usize]]) -> Option<(Vec<usize>, Vec<Vec<usize>>)> {
    let r = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; r];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[r - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    let n = tilec_ir::size::numel(&out).ok().filter(|&n| n <= FOLD_LIMIT)?;
    let mut maps = vec![Vec::with_capacity(n); shapes.len()];
    for flat in 0..n {
        // Multi-index of `flat` in `out`.
        let mut rem = flat;
        let mut idx = vec![0usize; r];
        for a in (0..r).rev() {
            idx[a] = rem % out[a].max(1);
            rem /= out[a].max(1);
        }
        for (k, s) in shapes.iter().enumerate() {
            let off = r - s.len();
            let mut f = 0;
            for (i, &d) in s.iter().enumerate() {
                f = f * d + if d == 1 { 0 } else { idx[off + i] };
            }
            maps[k].push(f);
        }
    }
    Some((out, maps))
}

/// One element of a binary op on known contents; `None` when not determined.
fn binary_elem(cx: &mut NodeCx, op: &str, a: ShapeElem, b: ShapeElem) -> Option<ShapeElem> {
    use ShapeElem::{Int, Sym};
    let bool_of = |c: bool| Some(Int(c as i64));
    match (op, a, b) {
        ("Add", Int(x), Int(y)) => Some(Int(x.wrapping_add(y))),
        ("Sub", Int(x), Int(y)) => Some(Int(x.wrapping_sub(y))),
        ("Mul", Int(x), Int(y)) => Some(Int(x.wrapping_mul(y))),
        ("Div", Int(x), Int(y)) => x.checked_div(y).map(Int),
        ("Mod", Int(x), Int(y)) => {
            let r = x.checked_rem(y)?;
            // fmod = 0 is Python's modulo (sign of the divisor); fmod = 1 is C's.
            let python = cx.attr_i("fmod", 0).ok()? == 0;
            Some(Int(if python && r != 0 && (r < 0) != (y < 0) { r + y } else { r }))
        }
        ("Max", Int(x), Int(y)) => Some(Int(x.max(y))),
        ("Min", Int(x), Int(y)) => Some(Int(x.min(y))),
        ("Equal", Int(x), Int(y)) => bool_of(x == y),
        ("Less", Int(x), Int(y)) => bool_of(x < y),
        ("Greater", Int(x), Int(y)) => bool_of(x > y),
        ("LessOrEqual", Int(x), Int(y)) => bool_of(x <= y),
        ("GreaterOrEqual", Int(x), Int(y)) => bool_of(x >= y),
        ("And", Int(x), Int(y)) => bool_of(x != 0 && y != 0),
        ("Or", Int(x), Int(y)) => bool_of(x != 0 || y != 0),
        // A symbolic dim is a non-negative size.
        ("Equal", Sym(s), Sym(t)) if s == t => bool_of(true),
        ("Equal", Sym(_), Int(v)) | ("Equal", Int(v), Sym(_)) if v < 0 => bool_of(false),
        ("Less", Sym(_), Int(v)) if v <= 0 => bool_of(false),
        ("Greater", Int(v), Sym(_)) if v <= 0 => bool_of(false),
        ("GreaterOrEqual", Sym(_), Int(v)) if v <= 0 => bool_of(true),
        ("LessOrEqual", Int(v), Sym(_)) if v <= 0 => bool_of(true),
        ("Greater", Sym(_), Int(v)) if v < 0 => bool_of(true),
        ("Less", Int(v), Sym(_)) if v < 0 => bool_of(true),
        ("Max", Sym(s), Int(v)) | ("Max", Int(v), Sym(s)) if v <= 0 => Some(Sym(s)),
        ("Min", Sym(_), Int(v)) | ("Min", Int(v), Sym(_)) if v <= 0 => Some(Int(v)),
        ("Sub", Sym(s), Sym(t)) if s == t => Some(Int(0)),
        ("Div", Sym(s), Sym(t)) if s == t => Some(Int(1)),
        ("Mul", Sym(_), Int(0)) | ("Mul", Int(0), Sym(_)) => Some(Int(0)),
        _ => {
            let e = match (op, a, b) {
                ("Add", Int(k), Sym(s)) | ("Add", Sym(s), Int(k)) if k < 0 => {
                    SymExpr::Sub(Dim::Sym(s), Dim::Fixed(k.unsigned_abs() as usize))
                }
                ("Sub", Sym(s), Int(k)) if k < 0 => SymExpr::Add(Dim::Sym(s), Dim::Fixed(k.unsigned_abs() as usize)),
                ("Sub", Sym(s), Int(k)) => SymExpr::Sub(Dim::Sym(s), Dim::Fixed(k as usize)),
                _ => {
                    let (x, y) = (elem_dim(a)?, elem_dim(b)?);
                    match op {
                        "Add" => SymExpr::Add(x, y),
                        "Mul" => SymExpr::Mul(x, y),
                        "Div" if matches!(y, Dim::Fixed(k) if k > 0) => SymExpr::Div(x, y),
                        "Max" => SymExpr::Max(x, y),
                        "Min" => SymExpr::Min(x, y),
                        _ => return None,
                    }
                }
            };
            Some(dim_elem(derive(cx, e)))
        }
    }
}

/// Import-time evaluation of shape computations. Returns `None` (and emits nothing) when
/// the node is not a foldable op or its inputs are not all known.
pub(super) fn fold_shape_op(cx: &mut NodeCx) -> Result<Option<Vec<ValueId>>, ImportError> {
    let op = cx.op_type().to_string();
    if !is_foldable(&op) {
        return Ok(None);
    }
    let out = match op.as_str() {
        "Shape" => {
            let Some(x) = cx.input(0) else { return Ok(None) };
            let dims = cx.ty(x).shape.clone();
            let r = dims.len() as i64;
            let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let start = clampi(cx.attr_i("start", 0)?);
            let end = match cx.attr_i_opt("end")? {
                Some(e) => clampi(e),
                None => r as usize,
            };
            let sel: Vec<ShapeElem> =
                if start < end { dims[start..end].iter().map(|&d| dim_elem(d)).collect() } else { vec![] };
            let n = sel.len();
            known_value(cx, sel, vec![n], DType::I64)?
        }
        "Size" => {
            let Some(x) = cx.input(0) else { return Ok(None) };
            let dims = cx.ty(x).shape.clone();
            let p = dims_product(&dims, &mut cx.graph_mut().syms);
            known_value(cx, vec![dim_elem(p)], vec![], DType::I64)?
        }
        "Gather" => {
            let (Some(d), Some(i)) = (known(cx, 0), known(cx, 1)) else { return Ok(None) };
            if d.shape.is_empty() {
                return Ok(None);
            }
            let Ok(axis) = norm_axis(cx.attr_i("axis", 0)?, d.shape.len()) else { return Ok(None) };
            let outer: usize = d.shape[..axis].iter().product();
            let len = d.shape[axis];
            let inner: usize = d.shape[axis + 1..].iter().product();
            let mut elems = Vec::new();
            for o in 0..outer {
                for &ix in &i.elems {
                    let Some(mut ix) = ix.as_int() else { return Ok(None) };
                    if ix < 0 {
                        ix += len as i64;
                    }
                    if ix < 0 || ix >= len as i64 {
                        return Err(cx.invalid(format!("gather index {ix} out of range for {len}")));
                    }
                    let base = (o * len + ix as usize) * inner;
                    elems.extend_from_slice(&d.elems[base..base + inner]);
                }
            }
            let mut shape = d.shape[..axis].to_vec();
            shape.extend_from_slice(&i.shape);
            shape.extend_from_slice(&d.shape[axis + 1..]);
            known_value(cx, elems, shape, d.dtype)?
        }
        "Concat" => {
            let mut ins = Vec::new();
            for k in 0..cx.n_inputs() {
                if cx.input(k).is_none() {
                    continue;
                }
                let Some(t) = known(cx, k) else { return Ok(None) };
                ins.push(t);
            }
            let Some(first) = ins.first() else { return Ok(None) };
            let r = first.shape.len();
            let Ok(axis) = norm_axis(cx.attr_i("axis", 0)?, r) else { return Ok(None) };
            if r == 0 || ins.iter().any(|t| t.shape.len() != r || t.dtype != first.dtype) {
                return Ok(None);
            }
            let outer: usize = first.shape[..axis].iter().product();
            let mut shape = first.shape.clone();
            shape[axis] = ins.iter().map(|t| t.shape[axis]).sum();
            let mut elems = Vec::new();
            for o in 0..outer {
                for t in &ins {
                    let chunk: usize = t.shape[axis..].iter().product();
                    elems.extend_from_slice(&t.elems[o * chunk..(o + 1) * chunk]);
                }
            }
            let dt = first.dtype;
            known_value(cx, elems, shape, dt)?
        }
        "Slice" => {
            let Some(d) = known(cx, 0) else { return Ok(None) };
            if d.shape.len() != 1 {
                return Ok(None);
            }
            if cx.opset >= 10
                && (1..5).any(|k| {
                    cx.input(k).is_some() && cx.contents(k).is_none_or(|c| c.iter().any(|e| e.as_int().is_none()))
                })
            {
                return Ok(None);
            }
            let (axes, starts, ends, steps) = normalized_slice(cx, 1)?;
            let mut elems = d.elems.clone();
            if let Some(k) = axes.iter().position(|&a| a == 0) {
                // Known-int inputs were checked above, so both bounds are literal.
                let (Some(b), Some(e)) = (starts[k].index(), ends[k].index()) else { return Ok(None) };
                let (s, n) = tilec_ir::op::slice_range(d.shape[0] as i64, b, e, steps[k]);
                elems = (0..n).map(|j| d.elems[(s + j * steps[k]) as usize]).collect();
            }
            let n = elems.len();
            known_value(cx, elems, vec![n], d.dtype)?
        }
        "Unsqueeze" | "Squeeze" | "Reshape" | "Flatten" => {
            let Some(d) = known(cx, 0) else { return Ok(None) };
            let dims: Vec<Dim> = d.shape.iter().map(|&n| Dim::Fixed(n)).collect();
            let new: Vec<Dim> = match op.as_str() {
                "Unsqueeze" => {
                    let Some(axes) = fold_axes(cx, 13)? else { return Ok(None) };
                    unsqueeze_shape(cx, &dims, &axes)?
                }
                "Squeeze" => {
                    let axes = fold_axes(cx, 13)?;
                    if axes.is_none() && cx.input(1).is_some() {
                        return Ok(None);
                    }
                    squeeze_shape(cx, &dims, axes)?
                }
                "Reshape" => {
                    let spec = if cx.opset < 5 {
                        let Some(s) = cx.attr_ints("shape")? else { return Ok(None) };
                        s.into_iter().map(ShapeElem::Int).collect()
                    } else {
                        match cx.contents(1) {
                            Some(s) => s,
                            None => return Ok(None),
                        }
                    };
                    let allowzero = cx.attr_i("allowzero", 0)? != 0;
                    resolve_reshape(cx, &dims, &spec, allowzero)?
                }
                _ => {
                    let r = dims.len() as i64;
                    let mut axis = cx.attr_i("axis", 1)?;
                    if axis < 0 {
                        axis += r;
                    }
                    if axis < 0 || axis > r {
                        return Ok(None);
                    }
                    let a: usize = d.shape[..axis as usize].iter().product();
                    vec![Dim::Fixed(a), Dim::Fixed(d.elems.len() / a.max(1))]
                }
            };
            let Some(shape) = new.iter().map(|x| x.fixed()).collect::<Option<Vec<usize>>>() else { return Ok(None) };
            if shape.iter().product::<usize>() != d.elems.len() {
                return Err(cx.invalid(format!("cannot reshape {} elements to {shape:?}", d.elems.len())));
            }
            known_value(cx, d.elems, shape, d.dtype)?
        }
        "Cast" | "CastLike" => {
            let Some(d) = known(cx, 0) else { return Ok(None) };
            let to = if op == "Cast" {
                match cx.attr_dtype("to")? {
                    Some(t) => t,
                    None => return Ok(None),
                }
            } else {
                match cx.input(1) {
                    Some(v) => cx.ty(v).dtype,
                    None => return Ok(None),
                }
            };
            if to.is_bool() {
                let Some(ints) = d.elems.iter().map(|e| e.as_int()).collect::<Option<Vec<i64>>>() else {
                    return Ok(None);
                };
                let elems = ints.into_iter().map(|v| ShapeElem::Int((v != 0) as i64)).collect();
                known_value(cx, elems, d.shape, to)?
            } else if to.is_int() {
                known_value(cx, d.elems, d.shape, to)?
            } else {
                return Ok(None);
            }
        }
        "Neg" | "Abs" | "Not" => {
            let Some(d) = known(cx, 0) else { return Ok(None) };
            let mut elems = Vec::with_capacity(d.elems.len());
            for e in d.elems {
                elems.push(match (op.as_str(), e) {
                    ("Neg", ShapeElem::Int(v)) => ShapeElem::Int(v.wrapping_neg()),
                    ("Abs", ShapeElem::Int(v)) => ShapeElem::Int(v.wrapping_abs()),
                    ("Abs", s) => s,
                    ("Not", ShapeElem::Int(v)) if d.dtype.is_bool() => ShapeElem::Int((v == 0) as i64),
                    _ => return Ok(None),
                });
            }
            known_value(cx, elems, d.shape, d.dtype)?
        }
        "Add" | "Sub" | "Mul" | "Div" | "Mod" | "Max" | "Min" | "Equal" | "Less" | "Greater"
        | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" => {
            if cx.n_inputs() != 2 {
                return Ok(None); // variadic Max/Min with other arities
            }
            let (Some(a), Some(b)) = (known(cx, 0), known(cx, 1)) else { return Ok(None) };
            if a.dtype != b.dtype {
                return Ok(None);
            }
            let Some((shape, maps)) = broadcast_known(&[&a.shape, &b.shape]) else { return Ok(None) };
            let mut elems = Vec::with_capacity(maps[0].len());
            for (&i, &j) in maps[0].iter().zip(&maps[1]) {
                match binary_elem(cx, &op, a.elems[i], b.elems[j]) {
                    Some(e) => elems.push(e),
                    None => return Ok(None),
                }
            }
            let comparison = matches!(op.as_str(), "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual");
            let dt = if comparison { DType::Bool } else { a.dtype };
            if dt.is_bool() && elems.iter().any(|e| e.as_int().is_none()) {
                return Ok(None);
            }
            known_value(cx, elems, shape, dt)?
        }
        "Where" => {
            let (Some(c), Some(a), Some(b)) = (known(cx, 0), known(cx, 1), known(cx, 2)) else { return Ok(None) };
            if !c.dtype.is_bool() || a.dtype != b.dtype {
                return Ok(None);
            }
            let Some((shape, maps)) = broadcast_known(&[&c.shape, &a.shape, &b.shape]) else { return Ok(None) };
            let mut elems = Vec::with_capacity(maps[0].len());
            for k in 0..maps[0].len() {
                let Some(cv) = c.elems[maps[0][k]].as_int() else { return Ok(None) };
                elems.push(if cv != 0 { a.elems[maps[1][k]] } else { b.elems[maps[2][k]] });
            }
            known_value(cx, elems, shape, a.dtype)?
        }
        "ConstantOfShape" => {
            let Some(s) = known(cx, 0) else { return Ok(None) };
            let Some(dims) = s.elems.iter().map(|e| e.as_int()).collect::<Option<Vec<i64>>>() else { return Ok(None) };
            if dims.iter().any(|&d| d < 0) {
                return Ok(None);
            }
            let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
            // Declared sizes are untrusted: an overflowing product is simply not folded.
            let Some(n) = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) else { return Ok(None) };
            let value = cx.attr_t("value")?.unwrap_or_else(|| Tensor::scalar(0.0f32));
            if n > FOLD_LIMIT || !(value.dtype().is_int() || value.dtype().is_bool()) || value.numel() != 1 {
                return Ok(None);
            }
            let v = value.to_i64_vec()[0];
            known_value(cx, vec![ShapeElem::Int(v); n], shape, value.dtype())?
        }
        "Range" => {
            let (Some(s), Some(l), Some(d)) = (known(cx, 0), known(cx, 1), known(cx, 2)) else { return Ok(None) };
            let one = |k: &Known| k.elems.len() == 1 && k.elems[0].as_int().is_some();
            if !(one(&s) && one(&l) && one(&d)) || s.dtype != l.dtype || s.dtype != d.dtype {
                return Ok(None);
            }
            let (s0, l0, d0) =
                (s.elems[0].as_int().unwrap_or(0), l.elems[0].as_int().unwrap_or(0), d.elems[0].as_int().unwrap_or(0));
            let n = tilec_ir::op::range_len_i64(s0, l0, d0).map_err(|e| cx.invalid(e))?;
            if n > FOLD_LIMIT {
                return Ok(None);
            }
            let elems = (0..n as i64).map(|i| ShapeElem::Int(s0.wrapping_add(i.wrapping_mul(d0)))).collect();
            known_value(cx, elems, vec![n], s.dtype)?
        }
        _ => return Ok(None),
    };
    Ok(Some(vec![out]))
}

/// Axes for folding Squeeze/Unsqueeze (attribute before `input_from`, else input 1 that
/// must be fully known).
fn fold_axes(cx: &NodeCx, input_from: i64) -> Result<Option<Vec<i64>>, ImportError> {
    if cx.opset < input_from {
        return cx.attr_ints("axes");
    }
    Ok(cx.contents(1).and_then(|c| c.iter().map(|e| e.as_int()).collect()))
}
