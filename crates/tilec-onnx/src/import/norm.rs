//! ONNX mappings for normalizations: Softmax/LogSoftmax/Hardmax, Layer/RMS/Batch/
//! Instance/Group normalization, LRN, LpNormalization, MeanVarianceNormalization, and the
//! NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss losses.

use super::reduce::{axes_of, axis_of};
use super::{ImportError, MapFn, NodeCx};
use tilec_ir::op::{dims_product, IndexOp, LayoutOp, LossReduction, NormOp};
use tilec_ir::{DType, Dim, Op, Tensor, ValueId};

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    Some(match op_type {
        "Softmax" => |cx| map_softmax(cx, 0),
        "LogSoftmax" => |cx| map_softmax(cx, 1),
        "Hardmax" => |cx| map_softmax(cx, 2),
        "LayerNormalization" => map_layer_norm,
        "RMSNormalization" => map_rms_norm,
        "BatchNormalization" => map_batch_norm,
        "InstanceNormalization" => map_instance_norm,
        "GroupNormalization" => map_group_norm,
        "LRN" => map_lrn,
        "LpNormalization" => map_lp_norm,
        "MeanVarianceNormalization" => map_mvn,
        "NegativeLogLikelihoodLoss" => |cx| map_loss(cx, false),
        "SoftmaxCrossEntropyLoss" => |cx| map_loss(cx, true),
        _ => return None,
    })
}

fn epsilon(cx: &NodeCx) -> Result<f32, ImportError> {
    let e = cx.attr_f("epsilon", 1e-5)?;
    if !e.is_finite() || e < 0.0 {
        return Err(cx.invalid(format!("epsilon must be a non-negative number, got {e}")));
    }
    Ok(e)
}

fn expect_float_input(cx: &NodeCx, i: usize) -> Result<(), ImportError> {
    let ty = cx.input_ty(i)?;
    if !ty.dtype.is_float() {
        return Err(cx.invalid(format!(
            "input {i} must be a float tensor, got {}",
            ty.dtype
        )));
    }
    Ok(())
}

/// `which`: 0 softmax, 1 log-softmax, 2 hardmax.
fn map_softmax(cx: &mut NodeCx, which: u8) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let ty = cx.ty(x).clone();
    let rank = ty.rank();
    if rank == 0 {
        return Err(cx.invalid("input must have rank >= 1"));
    }
    let make = |axis: usize| {
        Op::Norm(match which {
            0 => NormOp::Softmax { axis },
            1 => NormOp::LogSoftmax { axis },
            _ => NormOp::Hardmax { axis },
        })
    };
    if cx.opset >= 13 {
        let axis = axis_of(cx, cx.attr_i("axis", -1)?, rank)?;
        return cx.emit(make(axis), &[x]);
    }
    // Before opset 13 the input is coerced to 2-D [prod(..axis), prod(axis..)] and the
    // function applies along the second dimension.
    let axis = axis_of(cx, cx.attr_i("axis", 1)?, rank)?;
    if axis == rank - 1 {
        return cx.emit(make(axis), &[x]);
    }
    let syms = &mut cx.graph_mut().syms;
    let rows = dims_product(&ty.shape[..axis], syms);
    let cols = dims_product(&ty.shape[axis..], syms);
    let flat = cx.emit1(
        Op::Layout(LayoutOp::Reshape {
            shape: vec![rows, cols],
        }),
        &[x],
    )?;
    let y = cx.emit1(make(1), &[flat])?;
    Ok(vec![cx.emit1(
        Op::Layout(LayoutOp::Reshape {
            shape: ty.shape.clone(),
        }),
        &[y],
    )?])
}

fn map_layer_norm(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    expect_float_input(cx, 0)?;
    let x = cx.req_input(0)?;
    let rank = cx.ty(x).rank();
    let axis = axis_of(cx, cx.attr_i("axis", -1)?, rank)?;
    let stash = cx.attr_dtype("stash_type")?.unwrap_or(DType::F32);
    if !stash.is_float() {
        return Err(cx.invalid(format!("stash_type must be a float type, got {stash}")));
    }
    let mut inputs = vec![x, cx.req_input(1)?];
    if let Some(b) = cx.input(2) {
        inputs.push(b);
    }
    let has_bias = inputs.len() == 3;
    cx.emit(
        Op::Norm(NormOp::LayerNorm {
            axis,
            epsilon: epsilon(cx)?,
            stash,
            has_bias,
        }),
        &inputs,
    )
}

fn map_rms_norm(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    expect_float_input(cx, 0)?;
    let x = cx.req_input(0)?;
    let rank = cx.ty(x).rank();
    let axis = axis_of(cx, cx.attr_i("axis", -1)?, rank)?;
    let scale = cx.req_input(1)?;
    cx.emit(
        Op::Norm(NormOp::RmsNorm {
            axis,
            epsilon: epsilon(cx)?,
        }),
        &[x, scale],
    )
}

fn map_batch_norm(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    if cx.attr_i("training_mode", 0)? != 0 {
        return Err(
            cx.unsupported("training_mode=1 (batch statistics); only inference mode is supported")
        );
    }
    // Opsets 6-8: spatial=0 means per-element (not per-channel) statistics.
    if cx.opset < 9 && cx.attr_i("spatial", 1)? == 0 {
        return Err(cx.unsupported("spatial=0 (per-element statistics)"));
    }
    let inputs = (0..5)
        .map(|i| cx.req_input(i))
        .collect::<Result<Vec<_>, _>>()?;
    cx.emit(
        Op::Norm(NormOp::BatchNorm {
            epsilon: epsilon(cx)?,
            channels_last: false,
        }),
        &inputs,
    )
}

fn map_instance_norm(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let inputs = (0..3)
        .map(|i| cx.req_input(i))
        .collect::<Result<Vec<_>, _>>()?;
    cx.emit(
        Op::Norm(NormOp::InstanceNorm {
            epsilon: epsilon(cx)?,
        }),
        &inputs,
    )
}

fn map_group_norm(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let groups = cx
        .attr_i_opt("num_groups")?
        .ok_or_else(|| cx.invalid("attribute 'num_groups' is required"))?;
    if groups <= 0 {
        return Err(cx.invalid(format!("num_groups must be positive, got {groups}")));
    }
    let groups = groups as usize;
    let mut scale = cx.req_input(1)?;
    let mut bias = cx.req_input(2)?;
    if cx.opset < 21 {
        // Opset 18: scale and bias are per group; expand them to per channel.
        let xt = cx.ty(x).clone();
        let c = match xt.shape.get(1) {
            Some(Dim::Fixed(c)) => *c,
            Some(_) => {
                return Err(
                    cx.unsupported("opset-18 GroupNormalization with a symbolic channel count")
                )
            }
            None => return Err(cx.invalid("input must have rank >= 2 ([N, C, ...])")),
        };
        if c % groups != 0 {
            return Err(cx.invalid(format!("{c} channels do not divide into {groups} groups")));
        }
        let idx: Vec<i64> = (0..c).map(|ch| (ch / (c / groups)) as i64).collect();
        let idx =
            cx.constant(Tensor::from_vec(vec![c], idx).map_err(|e| cx.invalid(e.to_string()))?);
        scale = cx.emit1(Op::Index(IndexOp::Gather { axis: 0 }), &[scale, idx])?;
        bias = cx.emit1(Op::Index(IndexOp::Gather { axis: 0 }), &[bias, idx])?;
    }
    cx.emit(
        Op::Norm(NormOp::GroupNorm {
            num_groups: groups,
            epsilon: epsilon(cx)?,
            channels_last: false,
        }),
        &[x, scale, bias],
    )
}

fn map_lrn(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let size = cx
        .attr_i_opt("size")?
        .ok_or_else(|| cx.invalid("attribute 'size' is required"))?;
    if size <= 0 {
        return Err(cx.invalid(format!("size must be positive, got {size}")));
    }
    let op = NormOp::Lrn {
        size: size as usize,
        alpha: cx.attr_f("alpha", 1e-4)?,
        beta: cx.attr_f("beta", 0.75)?,
        bias: cx.attr_f("bias", 1.0)?,
        channels_last: false,
    };
    cx.emit(Op::Norm(op), &[x])
}

fn map_lp_norm(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let rank = cx.ty(x).rank();
    let axis = axis_of(cx, cx.attr_i("axis", -1)?, rank)?;
    let p = cx.attr_i("p", 2)?;
    if p != 1 && p != 2 {
        return Err(cx.invalid(format!("p must be 1 or 2, got {p}")));
    }
    cx.emit(Op::Norm(NormOp::LpNorm { axis, p: p as u32 }), &[x])
}

fn map_mvn(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let rank = cx.ty(x).rank();
    let axes = cx.attr_ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
    let axes = axes_of(cx, &axes, rank)?;
    cx.emit(Op::Norm(NormOp::MeanVarianceNorm { axes }), &[x])
}

fn map_loss(cx: &mut NodeCx, softmax: bool) -> Result<Vec<ValueId>, ImportError> {
    let reduction = match cx.attr_s("reduction")?.as_deref().unwrap_or("mean") {
        "none" => LossReduction::None,
        "sum" => LossReduction::Sum,
        "mean" => LossReduction::Mean,
        other => {
            return Err(cx.invalid(format!(
                "reduction must be none, sum or mean, got '{other}'"
            )))
        }
    };
    let ignore_index = cx.attr_i_opt("ignore_index")?;
    let x = cx.req_input(0)?;
    let target = cx.req_input(1)?;
    if cx.ty(x).rank() < 2 {
        return Err(cx.invalid("input must have rank >= 2 ([N, C, ...])"));
    }
    let log_prob = if softmax {
        cx.emit1(Op::Norm(NormOp::LogSoftmax { axis: 1 }), &[x])?
    } else {
        x
    };
    let mut inputs = vec![log_prob, target];
    if let Some(w) = cx.input(2) {
        inputs.push(w);
    }
    let has_weight = inputs.len() == 3;
    let loss = cx.emit1(
        Op::Norm(NormOp::NllLoss {
            reduction,
            ignore_index,
            has_weight,
        }),
        &inputs,
    )?;
    Ok(if softmax {
        vec![loss, log_prob]
    } else {
        vec![loss]
    })
}

#[cfg(test)]
mod tests {
    use crate::proto::attribute_proto::AttributeType;
    use crate::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto};
    use crate::{import_model, ImportOptions};
    use tilec_ir::op::{LayoutOp, NormOp, ReduceKind, ReduceOp};
    use tilec_ir::{Dim, Op};

    use super::super::test_util::vi;

    fn int_attr(name: &str, v: i64) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: AttributeType::Int as i32,
            i: v,
            ..Default::default()
        }
    }

    fn ints_attr(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto {
            name: name.into(),
            r#type: AttributeType::Ints as i32,
            ints: v.to_vec(),
            ..Default::default()
        }
    }

    /// One node `op(x) -> y` with x of shape [N, 3, 4].
    fn model(op: &str, opset: i64, attrs: Vec<AttributeProto>) -> ModelProto {
        ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
            graph: Some(GraphProto {
                name: "g".into(),
                node: vec![NodeProto {
                    op_type: op.into(),
                    name: "n".into(),
                    input: vec!["x".into()],
                    output: vec!["y".into()],
                    attribute: attrs,
                    ..Default::default()
                }],
                input: vec![vi("x", &[None, Some(3), Some(4)])],
                output: vec![vi("y", &[None, Some(3), Some(4)])],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ops(m: &ModelProto) -> Vec<Op> {
        let g = import_model(m, &ImportOptions::default()).unwrap();
        g.nodes().iter().map(|n| n.op.clone()).collect()
    }

    #[test]
    fn old_softmax_coerces_to_2d_around_axis() {
        let o = ops(&model("Softmax", 11, vec![int_attr("axis", 1)]));
        assert_eq!(o.len(), 3, "{o:?}");
        match &o[0] {
            Op::Layout(LayoutOp::Reshape { shape }) => {
                assert!(matches!(shape[0], Dim::Sym(_)));
                assert_eq!(shape[1], Dim::Fixed(12));
            }
            other => panic!("expected reshape, got {other:?}"),
        }
        assert_eq!(o[1], Op::Norm(NormOp::Softmax { axis: 1 }));
        assert!(matches!(&o[2], Op::Layout(LayoutOp::Reshape { shape }) if shape.len() == 3));
        // The last axis needs no reshape; opset 13 is per-axis with default -1.
        assert_eq!(
            ops(&model("LogSoftmax", 11, vec![int_attr("axis", -1)])),
            vec![Op::Norm(NormOp::LogSoftmax { axis: 2 })]
        );
        assert_eq!(
            ops(&model("Hardmax", 13, vec![int_attr("axis", 1)])),
            vec![Op::Norm(NormOp::Hardmax { axis: 1 })]
        );
    }

    #[test]
    fn reduce_axes_attribute_is_normalized() {
        let o = ops(&model(
            "ReduceMean",
            13,
            vec![ints_attr("axes", &[-1, 0]), int_attr("keepdims", 0)],
        ));
        assert_eq!(
            o,
            vec![Op::Reduce(ReduceOp::Reduce {
                kind: ReduceKind::Mean,
                axes: vec![0, 2],
                keepdims: false
            })]
        );
        let o = ops(&model("ReduceL2", 13, vec![]));
        assert_eq!(
            o,
            vec![Op::Reduce(ReduceOp::Reduce {
                kind: ReduceKind::L2,
                axes: vec![0, 1, 2],
                keepdims: true
            })]
        );
        let bad = model("ReduceMax", 13, vec![ints_attr("axes", &[1, -2])]);
        assert!(import_model(&bad, &ImportOptions::default()).is_err());
    }
}
