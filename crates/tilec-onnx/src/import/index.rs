//! ONNX mappings for the indexing family: gathers, scatters, data-dependent selections
//! (NonZero, Compress, Unique, NonMaxSuppression) and ROI pooling.
//!
//! Data-dependent output sizes get a fresh symbol minted here and recorded in the op
//! (`count`), so the op's inference is deterministic.

use super::{ImportError, MapFn, NodeCx, ShapeElem};
use tilec_ir::op::{norm_axis, IndexOp, RoiPoolMode, ScatterReduction, SourceOp};
use tilec_ir::{DType, Dim, Op, Tensor, ValueId};

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    Some(match op_type {
        "Gather" => map_gather,
        "GatherElements" => map_gather_elements,
        "GatherND" => map_gather_nd,
        "ScatterElements" | "Scatter" => map_scatter_elements,
        "ScatterND" => map_scatter_nd,
        "OneHot" => map_one_hot,
        "NonZero" => map_nonzero,
        "Compress" => map_compress,
        "ReverseSequence" => map_reverse_sequence,
        "Unique" => map_unique,
        "TensorScatter" => map_tensor_scatter,
        "NonMaxSuppression" => map_nms,
        "RoiAlign" => map_roi_align,
        "MaxRoiPool" => map_max_roi_pool,
        _ => return None,
    })
}

fn index(op: IndexOp) -> Op {
    Op::Index(op)
}

/// An axis attribute normalized against `rank`.
fn axis_attr(cx: &NodeCx, name: &str, default: i64, rank: usize) -> Result<usize, ImportError> {
    let a = cx.attr_i(name, default)?;
    norm_axis(a, rank).map_err(|e| cx.invalid(format!("attribute '{name}': {e}")))
}

fn reduction_attr(cx: &NodeCx) -> Result<ScatterReduction, ImportError> {
    // `reduction` exists from opset 16 (add/mul) and 18 (max/min).
    if cx.op_type() == "Scatter" || cx.opset < 16 {
        return Ok(ScatterReduction::None);
    }
    let s = cx.attr_s("reduction")?.unwrap_or_else(|| "none".into());
    ScatterReduction::from_onnx(&s)
        .ok_or_else(|| cx.invalid(format!("reduction must be none, add, mul, max or min, got '{s}'")))
}

fn fresh_count(cx: &mut NodeCx, hint: &str) -> Dim {
    Dim::Sym(cx.graph_mut().syms.fresh(hint))
}

fn map_gather(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (data, idx) = (cx.req_input(0)?, cx.req_input(1)?);
    let dt = cx.input_ty(0)?;
    let axis = axis_attr(cx, "axis", 0, dt.rank())?;
    let out = cx.emit1(index(IndexOp::Gather { axis }), &[data, idx])?;
    // Fold shape computations (Shape -> Gather): a 1-D value with known contents
    // indexed by known integers.
    if dt.rank() == 1 && cx.input_ty(1)?.dtype.is_int() {
        if let (Some(d), Some(i)) = (cx.contents(0), cx.contents(1)) {
            let n = d.len() as i64;
            let mut v = Vec::with_capacity(i.len());
            for e in i {
                let ShapeElem::Int(k) = e else { return Ok(vec![out]) };
                let j = if k < 0 { k + n } else { k };
                if j < 0 || j >= n {
                    return Err(cx.invalid(format!("index {k} out of range for a dimension of size {n}")));
                }
                v.push(d[j as usize]);
            }
            cx.set_contents(out, v);
        }
    }
    Ok(vec![out])
}

fn map_gather_elements(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (data, idx) = (cx.req_input(0)?, cx.req_input(1)?);
    let axis = axis_attr(cx, "axis", 0, cx.input_ty(0)?.rank())?;
    Ok(vec![cx.emit1(index(IndexOp::GatherElements { axis }), &[data, idx])?])
}

fn map_gather_nd(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (data, idx) = (cx.req_input(0)?, cx.req_input(1)?);
    let b = cx.attr_i("batch_dims", 0)?;
    let batch_dims = usize::try_from(b).map_err(|_| cx.invalid(format!("batch_dims must be >= 0, got {b}")))?;
    Ok(vec![cx.emit1(index(IndexOp::GatherND { batch_dims }), &[data, idx])?])
}

fn map_scatter_elements(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (data, idx, upd) = (cx.req_input(0)?, cx.req_input(1)?, cx.req_input(2)?);
    let axis = axis_attr(cx, "axis", 0, cx.input_ty(0)?.rank())?;
    let reduction = reduction_attr(cx)?;
    Ok(vec![cx.emit1(index(IndexOp::ScatterElements { axis, reduction }), &[data, idx, upd])?])
}

fn map_scatter_nd(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (data, idx, upd) = (cx.req_input(0)?, cx.req_input(1)?, cx.req_input(2)?);
    let reduction = reduction_attr(cx)?;
    Ok(vec![cx.emit1(index(IndexOp::ScatterND { reduction }), &[data, idx, upd])?])
}

fn map_one_hot(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (idx, values) = (cx.req_input(0)?, cx.req_input(2)?);
    let rank = cx.input_ty(0)?.rank();
    let d = cx.const_floats(1, "depth")?;
    let depth = match d.as_slice() {
        [x] if x.is_finite() && x.trunc() >= 1.0 => x.trunc() as usize,
        _ => return Err(cx.invalid(format!("depth must be one positive number, got {d:?}"))),
    };
    let axis = axis_attr(cx, "axis", -1, rank + 1)?;
    Ok(vec![cx.emit1(index(IndexOp::OneHot { axis, depth }), &[idx, values])?])
}

fn map_nonzero(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let count = fresh_count(cx, "nonzero");
    Ok(vec![cx.emit1(index(IndexOp::NonZero { count }), &[x])?])
}

fn map_compress(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (data, cond) = (cx.req_input(0)?, cx.req_input(1)?);
    let dt = cx.input_ty(0)?;
    let axis = match cx.attr_i_opt("axis")? {
        None => None,
        Some(a) => Some(norm_axis(a, dt.rank()).map_err(|e| cx.invalid(format!("attribute 'axis': {e}")))?),
    };
    // A constant condition fixes the output size (when the compressed length is known).
    let len = match axis {
        None => dt.numel(),
        Some(a) => dt.shape[a].fixed(),
    };
    let known = match (cx.const_input(1), len) {
        (Some(c), Some(len)) if c.dtype() == DType::Bool => {
            Some(c.to_i64_vec().iter().take(len).filter(|&&b| b != 0).count())
        }
        _ => None,
    };
    let count = match known {
        Some(n) => Dim::Fixed(n),
        None => fresh_count(cx, "compress"),
    };
    Ok(vec![cx.emit1(index(IndexOp::Compress { axis, count }), &[data, cond])?])
}

fn map_reverse_sequence(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (data, lens) = (cx.req_input(0)?, cx.req_input(1)?);
    let rank = cx.input_ty(0)?.rank();
    let batch_axis = axis_attr(cx, "batch_axis", 1, rank)?;
    let time_axis = axis_attr(cx, "time_axis", 0, rank)?;
    Ok(vec![cx.emit1(index(IndexOp::ReverseSequence { batch_axis, time_axis }), &[data, lens])?])
}

fn map_unique(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let rank = cx.input_ty(0)?.rank();
    let axis = match cx.attr_i_opt("axis")? {
        None => None,
        Some(a) => Some(norm_axis(a, rank).map_err(|e| cx.invalid(format!("attribute 'axis': {e}")))?),
    };
    let sorted = cx.attr_i("sorted", 1)? != 0;
    let count = fresh_count(cx, "unique");
    cx.emit(index(IndexOp::Unique { axis, sorted, count }), &[x])
}

fn map_tensor_scatter(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (past, upd) = (cx.req_input(0)?, cx.req_input(1)?);
    let pt = cx.input_ty(0)?;
    let axis = axis_attr(cx, "axis", -2, pt.rank())?;
    if axis == 0 {
        return Err(cx.invalid("axis must not be 0 (the batch dimension)"));
    }
    let circular = match cx.attr_s("mode")?.as_deref() {
        None | Some("linear") => false,
        Some("circular") => true,
        Some(m) => return Err(cx.invalid(format!("mode must be linear or circular, got '{m}'"))),
    };
    let write = match cx.input(2) {
        Some(w) => w,
        None => {
            // Absent write_indices: zeros, one per batch entry.
            let batch = pt.shape.first().copied().ok_or_else(|| cx.invalid("past_cache must have rank >= 2"))?;
            match batch {
                Dim::Fixed(n) => cx.constant(Tensor::zeros(DType::I64, vec![n])),
                d => cx.emit1(Op::Source(SourceOp::Fill { shape: vec![d], value: Tensor::scalar(0i64) }), &[])?,
            }
        }
    };
    Ok(vec![cx.emit1(index(IndexOp::TensorScatter { axis, circular }), &[past, upd, write])?])
}

fn map_nms(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (boxes, scores) = (cx.req_input(0)?, cx.req_input(1)?);
    let center_point_box = match cx.attr_i("center_point_box", 0)? {
        0 => false,
        1 => true,
        v => return Err(cx.invalid(format!("center_point_box must be 0 or 1, got {v}"))),
    };
    let one = |v: &[f64], what: &str| match v {
        [x] => Ok(*x),
        _ => Err(cx.invalid(format!("{what} must have one element, has {}", v.len()))),
    };
    let max_output_boxes_per_class = match cx.input(2) {
        None => 0,
        Some(_) => match cx.const_ints(2, "max_output_boxes_per_class")?.as_slice() {
            [] => 0,
            [x] => (*x).max(0) as usize,
            v => return Err(cx.invalid(format!("max_output_boxes_per_class must have one element, has {}", v.len()))),
        },
    };
    let iou_threshold = match cx.input(3) {
        None => 0.0,
        Some(_) => {
            let v = cx.const_floats(3, "iou_threshold")?;
            if v.is_empty() {
                0.0
            } else {
                one(&v, "iou_threshold")? as f32
            }
        }
    };
    let score_threshold = match cx.input(4) {
        None => None,
        Some(_) => {
            let v = cx.const_floats(4, "score_threshold")?;
            if v.is_empty() {
                None
            } else {
                Some(one(&v, "score_threshold")? as f32)
            }
        }
    };
    let count = fresh_count(cx, "nms");
    let op = IndexOp::NonMaxSuppression {
        center_point_box,
        max_output_boxes_per_class,
        iou_threshold,
        score_threshold,
        count,
    };
    Ok(vec![cx.emit1(index(op), &[boxes, scores])?])
}

fn positive(cx: &NodeCx, name: &str, default: i64) -> Result<usize, ImportError> {
    let v = cx.attr_i(name, default)?;
    match usize::try_from(v) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(cx.invalid(format!("attribute '{name}' must be positive, got {v}"))),
    }
}

fn map_roi_align(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (x, rois, bi) = (cx.req_input(0)?, cx.req_input(1)?, cx.req_input(2)?);
    let mode = match cx.attr_s("mode")?.as_deref() {
        None | Some("avg") => RoiPoolMode::Avg,
        Some("max") => RoiPoolMode::Max,
        Some(m) => return Err(cx.invalid(format!("mode must be avg or max, got '{m}'"))),
    };
    // Opset 16 added the attribute; before it the behaviour was output_half_pixel.
    let default_ctm = if cx.opset >= 16 { "half_pixel" } else { "output_half_pixel" };
    let half_pixel = match cx.attr_s("coordinate_transformation_mode")?.as_deref().unwrap_or(default_ctm) {
        "half_pixel" => true,
        "output_half_pixel" => false,
        m => {
            return Err(cx
                .invalid(format!("coordinate_transformation_mode must be half_pixel or output_half_pixel, got '{m}'")))
        }
    };
    let output_height = positive(cx, "output_height", 1)?;
    let output_width = positive(cx, "output_width", 1)?;
    let sr = cx.attr_i("sampling_ratio", 0)?;
    let sampling_ratio =
        usize::try_from(sr).map_err(|_| cx.invalid(format!("sampling_ratio must be >= 0, got {sr}")))?;
    let spatial_scale = cx.attr_f("spatial_scale", 1.0)?;
    let op = IndexOp::RoiAlign { mode, output_height, output_width, sampling_ratio, spatial_scale, half_pixel };
    Ok(vec![cx.emit1(index(op), &[x, rois, bi])?])
}

fn map_max_roi_pool(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let (x, rois) = (cx.req_input(0)?, cx.req_input(1)?);
    let ps = cx.attr_ints("pooled_shape")?.ok_or_else(|| cx.invalid("attribute 'pooled_shape' is required"))?;
    let (pooled_h, pooled_w) = match ps.as_slice() {
        [h, w] if *h > 0 && *w > 0 => (*h as usize, *w as usize),
        _ => return Err(cx.invalid(format!("pooled_shape must be two positive ints, got {ps:?}"))),
    };
    let spatial_scale = cx.attr_f("spatial_scale", 1.0)?;
    Ok(vec![cx.emit1(index(IndexOp::MaxRoiPool { pooled_h, pooled_w, spatial_scale }), &[x, rois])?])
}

#[cfg(test)]
mod tests {
    use crate::import::{import_model, ImportError, ImportOptions};
    use crate::proto::tensor_proto::DataType;
    use crate::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto};
    use tilec_ir::op::IndexOp;
    use tilec_ir::{Dim, Op};

    use super::super::test_util::vi;

    fn ints(name: &str, v: &[i64]) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: vec![v.len() as i64],
            data_type: DataType::Int64 as i32,
            int64_data: v.to_vec(),
            ..Default::default()
        }
    }

    fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
        NodeProto {
            op_type: op.into(),
            name: outputs[0].into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn model(nodes: Vec<NodeProto>, init: Vec<TensorProto>, outputs: &[&str]) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 13 }],
            graph: Some(GraphProto {
                name: "g".into(),
                node: nodes,
                initializer: init,
                input: vec![
                    vi("x", &[None, Some(3)]),
                    vi("boxes", &[Some(1), None, Some(4)]),
                    vi("scores", &[Some(1), Some(2), None]),
                ],
                output: outputs.iter().map(|o| vi(o, &[])).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn gather_folds_known_ints_and_counts_verify() {
        let m = model(
            vec![
                node("Gather", &["shp", "i"], &["m"]),
                node("NonMaxSuppression", &["boxes", "scores", "m"], &["sel"]),
                node("NonZero", &["x"], &["nz"]),
                node("Unique", &["x"], &["y", "idx", "inv", "cnt"]),
            ],
            vec![ints("shp", &[5, 7]), ints("i", &[-1])],
            &["sel", "nz", "y", "inv"],
        );
        let g = import_model(&m, &ImportOptions::default()).unwrap();
        tilec_ir::verify(&g).unwrap();
        let nms = g.nodes().iter().find(|n| n.name == "sel").unwrap();
        match &nms.op {
            Op::Index(IndexOp::NonMaxSuppression { max_output_boxes_per_class, .. }) => {
                assert_eq!(*max_output_boxes_per_class, 7)
            }
            o => panic!("unexpected {o:?}"),
        }
        let nz = g.nodes().iter().find(|n| n.name == "nz").unwrap();
        let ty = &g.value(nz.outputs[0]).ty;
        assert_eq!(ty.shape[0], Dim::Fixed(2));
        assert!(matches!(ty.shape[1], Dim::Sym(_)));
        // Two data-dependent ops get distinct symbols.
        let un = g.nodes().iter().find(|n| n.name == "y").unwrap();
        assert_ne!(g.value(un.outputs[0]).ty.shape[0], ty.shape[1]);
    }

    #[test]
    fn out_of_range_constant_index_is_an_error() {
        let m = model(
            vec![node("Gather", &["shp", "i"], &["m"]), node("NonMaxSuppression", &["boxes", "scores", "m"], &["sel"])],
            vec![ints("shp", &[5, 7]), ints("i", &[2])],
            &["sel"],
        );
        match import_model(&m, &ImportOptions::default()) {
            Err(ImportError::Invalid { msg, .. }) => assert!(msg.contains("out of range"), "{msg}"),
            r => panic!("expected an invalid-node error, got {r:?}"),
        }
    }
}
