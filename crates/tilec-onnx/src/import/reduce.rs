//! ONNX mappings for reductions: Reduce*, ArgMax/ArgMin, CumSum/CumProd, TopK.

use super::{ImportError, MapFn, NodeCx};
use tilec_ir::op::{ReduceKind, ReduceOp, ScanKind};
use tilec_ir::{Op, ValueId};

pub(super) fn lookup(op_type: &str) -> Option<MapFn> {
    Some(match op_type {
        "ReduceSum" => |cx| map_reduce(cx, ReduceKind::Sum),
        "ReduceMean" => |cx| map_reduce(cx, ReduceKind::Mean),
        "ReduceMax" => |cx| map_reduce(cx, ReduceKind::Max),
        "ReduceMin" => |cx| map_reduce(cx, ReduceKind::Min),
        "ReduceProd" => |cx| map_reduce(cx, ReduceKind::Prod),
        "ReduceL1" => |cx| map_reduce(cx, ReduceKind::L1),
        "ReduceL2" => |cx| map_reduce(cx, ReduceKind::L2),
        "ReduceLogSum" => |cx| map_reduce(cx, ReduceKind::LogSum),
        "ReduceLogSumExp" => |cx| map_reduce(cx, ReduceKind::LogSumExp),
        "ReduceSumSquare" => |cx| map_reduce(cx, ReduceKind::SumSquare),
        "ArgMax" => |cx| map_arg(cx, true),
        "ArgMin" => |cx| map_arg(cx, false),
        "CumSum" => |cx| map_scan(cx, ScanKind::Sum),
        "CumProd" => |cx| map_scan(cx, ScanKind::Prod),
        "TopK" => map_topk,
        _ => return None,
    })
}

/// Normalizes one possibly negative axis against `rank`.
pub(super) fn axis_of(cx: &NodeCx, axis: i64, rank: usize) -> Result<usize, ImportError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(cx.invalid(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

/// Normalizes a list of axes: non-negative, sorted, duplicates rejected.
pub(super) fn axes_of(cx: &NodeCx, axes: &[i64], rank: usize) -> Result<Vec<usize>, ImportError> {
    let mut out = axes
        .iter()
        .map(|&a| axis_of(cx, a, rank))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(cx.invalid(format!("axes {axes:?} repeat an axis")));
    }
    Ok(out)
}

fn map_reduce(cx: &mut NodeCx, kind: ReduceKind) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let rank = cx.ty(x).rank();
    let keepdims = cx.attr_i("keepdims", 1)? != 0;
    let noop = cx.attr_i("noop_with_empty_axes", 0)? != 0;
    // Axes moved from an attribute to an input in opset 13 (ReduceSum) / 18 (the rest).
    let axes_as_input = cx.opset >= if kind == ReduceKind::Sum { 13 } else { 18 };
    let axes: Vec<i64> = if axes_as_input {
        if cx.input(1).is_some() {
            cx.const_ints(1, "reduction axes")?
        } else {
            vec![]
        }
    } else {
        if cx.input(1).is_some() {
            return Err(cx.invalid(format!(
                "axes are an attribute in opset {}, not an input",
                cx.opset
            )));
        }
        cx.attr_ints("axes")?.unwrap_or_default()
    };
    let axes = if axes.is_empty() {
        if noop {
            // No reduction: identity for reductions whose elementwise part is identity.
            if matches!(
                kind,
                ReduceKind::Sum
                    | ReduceKind::Mean
                    | ReduceKind::Max
                    | ReduceKind::Min
                    | ReduceKind::Prod
            ) {
                return Ok(vec![x]);
            }
            vec![]
        } else {
            (0..rank).collect()
        }
    } else {
        axes_of(cx, &axes, rank)?
    };
    cx.emit(
        Op::Reduce(ReduceOp::Reduce {
            kind,
            axes,
            keepdims,
        }),
        &[x],
    )
}

fn map_arg(cx: &mut NodeCx, max: bool) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let rank = cx.ty(x).rank();
    let axis = axis_of(cx, cx.attr_i("axis", 0)?, rank)?;
    let keepdims = cx.attr_i("keepdims", 1)? != 0;
    let select_last_index = cx.attr_i("select_last_index", 0)? != 0;
    let op = if max {
        ReduceOp::ArgMax {
            axis,
            keepdims,
            select_last_index,
        }
    } else {
        ReduceOp::ArgMin {
            axis,
            keepdims,
            select_last_index,
        }
    };
    cx.emit(Op::Reduce(op), &[x])
}

fn map_scan(cx: &mut NodeCx, kind: ScanKind) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let rank = cx.ty(x).rank();
    let axis = match cx.const_ints(1, "scan axis")?.as_slice() {
        [a] => axis_of(cx, *a, rank)?,
        other => return Err(cx.invalid(format!("axis must have one element, has {}", other.len()))),
    };
    let exclusive = cx.attr_i("exclusive", 0)? != 0;
    let reverse = cx.attr_i("reverse", 0)? != 0;
    cx.emit(
        Op::Reduce(ReduceOp::Scan {
            kind,
            axis,
            exclusive,
            reverse,
        }),
        &[x],
    )
}

fn map_topk(cx: &mut NodeCx) -> Result<Vec<ValueId>, ImportError> {
    let x = cx.req_input(0)?;
    let rank = cx.ty(x).rank();
    let axis = axis_of(cx, cx.attr_i("axis", -1)?, rank)?;
    let k = if cx.opset < 10 {
        cx.attr_i_opt("k")?
            .ok_or_else(|| cx.invalid("attribute 'k' is required"))?
    } else {
        match cx.const_ints(1, "k")?.as_slice() {
            [k] => *k,
            other => {
                return Err(cx.invalid(format!("k must have one element, has {}", other.len())))
            }
        }
    };
    if k < 0 {
        return Err(cx.invalid(format!("k must be non-negative, got {k}")));
    }
    let largest = cx.attr_i("largest", 1)? != 0;
    let sorted = cx.attr_i("sorted", 1)? != 0;
    cx.emit(
        Op::Reduce(ReduceOp::TopK {
            axis,
            k: k as usize,
            largest,
            sorted,
        }),
        &[x],
    )
}
