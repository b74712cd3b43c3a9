//! Reductions: reduce over axes, arg-reductions, scans.

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

#[derive(Clone, Debug, PartialEq)]
pub enum ReduceOp {
    /// Reduces over `axes` (non-negative, sorted, unique; never empty: the importer turns
    /// "no axes" into all axes or an identity).
    Reduce { kind: ReduceKind, axes: Vec<usize>, keepdims: bool },
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
        }
    }

    fn infer(&self, inputs: &[&TensorType], _cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            ReduceOp::Reduce { axes, keepdims, .. } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                if x.dtype == DType::Bool {
                    return Err("cannot reduce bool".into());
                }
                let mut shape = Vec::new();
                for (i, &d) in x.shape.iter().enumerate() {
                    if axes.contains(&i) {
                        if *keepdims {
                            shape.push(Dim::Fixed(1));
                        }
                    } else {
                        shape.push(d);
                    }
                }
                if let Some(&a) = axes.iter().find(|&&a| a >= x.rank()) {
                    return Err(format!("axis {a} out of range for rank {}", x.rank()));
                }
                Ok(vec![TensorType::new(x.dtype, shape)])
            }
        }
    }
}
