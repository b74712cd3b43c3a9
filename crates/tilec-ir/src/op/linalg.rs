//! Linear algebra and windowed ops: matmul, convolution, pooling, attention.

use super::{broadcast_shapes, expect_arity, InferCtx, OpInfo};
use crate::{Dim, TensorType};

#[derive(Clone, Debug, PartialEq)]
pub enum LinalgOp {
    /// numpy `matmul`: batched with broadcasting, 1-D operands promoted and squeezed.
    MatMul,
}

impl OpInfo for LinalgOp {
    fn name(&self) -> &'static str {
        match self {
            LinalgOp::MatMul => "matmul",
        }
    }

    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            LinalgOp::MatMul => {
                expect_arity(inputs, 2)?;
                let (a, b) = (inputs[0], inputs[1]);
                if a.dtype != b.dtype {
                    return Err(format!("operand dtypes differ: {} vs {}", a.dtype, b.dtype));
                }
                if a.rank() == 0 || b.rank() == 0 {
                    return Err("matmul operands must have rank >= 1".into());
                }
                let mut sa = a.shape.clone();
                let mut sb = b.shape.clone();
                let a1 = sa.len() == 1;
                let b1 = sb.len() == 1;
                if a1 {
                    sa.insert(0, Dim::Fixed(1));
                }
                if b1 {
                    sb.push(Dim::Fixed(1));
                }
                let (m, ka) = (sa[sa.len() - 2], sa[sa.len() - 1]);
                let (kb, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
                if let (Dim::Fixed(x), Dim::Fixed(y)) = (ka, kb) {
                    if x != y {
                        return Err(format!("inner dimensions differ: {x} vs {y}"));
                    }
                }
                let batch = broadcast_shapes(&sa[..sa.len() - 2], &sb[..sb.len() - 2], cx.syms)?;
                let mut out = batch;
                if !a1 {
                    out.push(m);
                }
                if !b1 {
                    out.push(n);
                }
                Ok(vec![TensorType::new(a.dtype, out)])
            }
        }
    }
}
