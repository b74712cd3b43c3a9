//! Layout ops: re-indexing without arithmetic (reshape, transpose, slice, concat, ...).
//! Later stages turn most of them into index expressions rather than kernels.

use super::{expect_arity, fmt_dims, dims_product, InferCtx, OpInfo};
use crate::{Dim, TensorType};

#[derive(Clone, Debug, PartialEq)]
pub enum LayoutOp {
    /// Reshape to a fully resolved target shape (no 0 or -1 placeholders: the importer
    /// resolves them, symbolically when needed).
    Reshape { shape: Vec<Dim> },
    /// Output dim `i` is input dim `perm[i]`.
    Transpose { perm: Vec<usize> },
}

impl OpInfo for LayoutOp {
    fn name(&self) -> &'static str {
        match self {
            LayoutOp::Reshape { .. } => "reshape",
            LayoutOp::Transpose { .. } => "transpose",
        }
    }

    fn infer(&self, inputs: &[&TensorType], cx: &mut InferCtx) -> Result<Vec<TensorType>, String> {
        match self {
            LayoutOp::Reshape { shape } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                let a = dims_product(&x.shape, cx.syms);
                let b = dims_product(shape, cx.syms);
                if let (Dim::Fixed(p), Dim::Fixed(q)) = (a, b) {
                    if p != q {
                        return Err(format!(
                            "cannot reshape {} ({p} elements) to {} ({q} elements)",
                            fmt_dims(&x.shape, cx.syms),
                            fmt_dims(shape, cx.syms)
                        ));
                    }
                }
                Ok(vec![TensorType::new(x.dtype, shape.clone())])
            }
            LayoutOp::Transpose { perm } => {
                expect_arity(inputs, 1)?;
                let x = inputs[0];
                let mut seen = vec![false; x.rank()];
                if perm.len() != x.rank() {
                    return Err(format!("perm {perm:?} does not match rank {}", x.rank()));
                }
                for &p in perm {
                    if p >= x.rank() || seen[p] {
                        return Err(format!("perm {perm:?} is not a permutation"));
                    }
                    seen[p] = true;
                }
                Ok(vec![TensorType::new(x.dtype, perm.iter().map(|&p| x.shape[p]).collect())])
            }
        }
    }
}
