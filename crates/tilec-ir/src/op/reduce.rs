//! Reductions: reduce over axes, arg-reductions, scans, top-k.

use super::{expect_arity, InferCtx, OpInfo};
use crate::{DType, Dim, TensorType};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

/// Which running combination a scan computes.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ScanKind {
    Sum,
    Prod,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ReduceOp {
    /// Reduces over `axes` (non-negative, sorted, unique). An empty `axes` reduces every
    /// output element over exactly one input element, i.e. applies the reduction's
    /// elementwise part (`x*x` for SumSquare, `log x` for LogSum, identity for Sum); the
    /// importer turns "no axes given" into all axes, or into this form / an alias for
    /// `noop_with_empty_axes`. Reducing an empty set gives the reduction's identity
    /// (0 for Sum, 1 for Prod, -inf for Max and LogSum(Exp), +inf for Min, NaN for Mean).
    Reduce {
        kind: ReduceKind,
        axes: Vec<usize>,
        keepdims: bool,
    },
    /// Index (i64) of the first (or last, with `select_last_index`) maximum along `axis`.
    ArgMax {
        axis: usize,
        keepdims: bool,
        select_last_index: bool,
    },
    /// Index (i64) of the first (or last) minimum along `axis`.
    ArgMin {
        axis: usize,
        keepdims: bool,
        select_last_index: bool,
    },
    /// Inclusive (or exclusive) running sum/product along `axis`, optionally from the end.
    Scan {
        kind: ScanKind,
        axis: usize,
        exclusive: bool,
        reverse: bool,
    },
    /// The `k` largest (or smallest) elements along `axis`, sorted (ties: lower index
    /// first); outputs values and their i64 indices. `sorted: false` allows any order
    /// (the kernel still sorts).
    TopK {
        axis: usize,
        k: usize,
        largest: bool,
        sorted: bool,
    },
}

/// Shape of a reduction over `axes` of `shape`.
fn reduced_shape(shape: &[Dim], axes: &[usize], keepdims: bool) -> Vec<Dim> {
    let mut out = Vec::new();
    for (i, &d) in shape.iter().enumerate() {
        if axes.contains(&i) {
            if keepdims {
                out.push(Dim::Fixed(1));
            }
        } else {
            out.push(d);
        }
    }
    out
}

fn check_axis(axis: usize, rank: usize) -> Result<(), String> {
    if axis >= rank {
        return Err(format!("axis {axis} out of range for rank {rank}"));
    }
    Ok(())
}

impl OpInfo for ReduceOp {
    fn name(&self) -> &'static str {
        match self {
            ReduceOp::Reduce { kind, .. } => match kind {
                ReduceKind::Sum => "reduce_sum",
                ReduceKind::Mean => "reduce_mean",
                ReduceKind::Max => "reduce_max",
                ReduceKind::Min => "reduce_min",
                ReduceKind::Prod => "reduce_prod",
                ReduceKind::L1 => "reduce_l1",
                ReduceKind::L2 => "reduce_l2",
                ReduceKind::LogSum => "reduce_log_sum",
                ReduceKind::LogSumExp => "reduce_log_sum_exp",
                ReduceKind::SumSquare => "reduce_sum_square",
            },
            ReduceOp::ArgMax { .. } => "argmax",
            ReduceOp::ArgMin { .. } => "argmin",
            ReduceOp::Scan {
                kind: ScanKind::Sum,
                ..
            } => "cumsum",
            ReduceOp::Scan {
                kind: ScanKind::Prod,
                ..
            } => "cumprod",
            ReduceOp::TopK { .. } => "topk",
        }
    }

    fn infer(&self, inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        expect_arity(inputs, 1)?;
        let x = inputs[0];
        match self {
            ReduceOp::Reduce {
                kind,
                axes,
                keepdims,
            } => {
                // Max and Min are defined on bool (or / and); the rest needs numbers.
                if x.dtype == DType::Bool && !matches!(kind, ReduceKind::Max | ReduceKind::Min) {
                    return Err(format!("{} cannot reduce bool", self.name()));
                }
                if let Some(&a) = axes.iter().find(|&&a| a >= x.rank()) {
                    return Err(format!("axis {a} out of range for rank {}", x.rank()));
                }
                if axes.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(format!("axes {axes:?} must be sorted and unique"));
                }
                Ok(vec![TensorType::new(
                    x.dtype,
                    reduced_shape(&x.shape, axes, *keepdims),
                )])
            }
            ReduceOp::ArgMax { axis, keepdims, .. } | ReduceOp::ArgMin { axis, keepdims, .. } => {
                check_axis(*axis, x.rank())?;
                if let Some(0) = x.shape[*axis].fixed() {
                    return Err(format!("{} over an empty axis has no result", self.name()));
                }
                Ok(vec![TensorType::new(
                    DType::I64,
                    reduced_shape(&x.shape, &[*axis], *keepdims),
                )])
            }
            ReduceOp::Scan { axis, .. } => {
                check_axis(*axis, x.rank())?;
                if x.dtype == DType::Bool {
                    return Err(format!("{} expects a numeric type, got bool", self.name()));
                }
                Ok(vec![x.clone()])
            }
            ReduceOp::TopK { axis, k, .. } => {
                check_axis(*axis, x.rank())?;
                if x.dtype == DType::Bool {
                    return Err("topk expects a numeric type, got bool".into());
                }
                if let Some(n) = x.shape[*axis].fixed() {
                    if *k > n {
                        return Err(format!("k = {k} exceeds the axis length {n}"));
                    }
                }
                let mut shape = x.shape.clone();
                shape[*axis] = Dim::Fixed(*k);
                Ok(vec![
                    TensorType::new(x.dtype, shape.clone()),
                    TensorType::new(DType::I64, shape),
                ])
            }
        }
    }
}
