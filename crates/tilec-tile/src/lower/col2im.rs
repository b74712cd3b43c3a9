//! `Col2Im` (PyTorch's `fold`) as an inline expression: output `[N, C, y..]` sums, over the
//! block's taps `t..` (`B` of them), the column element `[n, c·B + flat(t), flat(l)]` of the
//! block position `l..` whose tap `t` lands on `y`: along each axis `p = y + pad − t·dil`
//! must be a multiple of the stride with `p / stride` inside the `L` block positions.
//!
//! Blocks that tile the image without overlap (stride equal to the block, no dilation or
//! padding, as MobileViT folds its patches back) read one element: `t = y mod s`,
//! `l = y / s`. Otherwise every tap is a guarded term of the sum (at most [`MAX_TAPS`]).

use tilec_ir::op::LinalgOp;
use tilec_ir::{NodeId, Op};

use super::{bin, compute_dtype, lit, Lowerer, R};
use crate::ir::*;

/// The most taps a block may have (each is a term of every output element's sum).
pub(crate) const MAX_TAPS: usize = 64;

/// Why a `Col2Im` is not lowered (`None`: it is): a block of more than [`MAX_TAPS`] taps.
pub(crate) fn refusal(op: &Op) -> Option<String> {
    let Op::Linalg(LinalgOp::Col2Im { block_shape, .. }) = op else {
        return Some("not a col2im".into());
    };
    let taps: usize = block_shape.iter().product();
    (taps > MAX_TAPS).then(|| format!("a block of {taps} taps (at most {MAX_TAPS} are lowered)"))
}

/// Block positions along each axis: `(image + pads − (dil·(block − 1) + 1)) / stride + 1`.
fn positions(image: &[usize], block: &[usize], dil: &[usize], pads: &[usize], strides: &[usize]) -> Vec<i64> {
    let k = image.len();
    (0..k)
        .map(|i| {
            let span = (dil[i] * (block[i] - 1) + 1) as i64;
            let room = (image[i] + pads[i] + pads[k + i]) as i64 - span;
            if room < 0 || strides[i] == 0 {
                0
            } else {
                room / strides[i] as i64 + 1
            }
        })
        .collect()
}

/// Row-major flat index of `idx` over `dims`.
fn flat(idx: &[Expr], dims: &[i64]) -> Expr {
    let mut e = Expr::Int(0);
    for (x, &d) in idx.iter().zip(dims) {
        e = bin(BinOp::Add, bin(BinOp::Mul, e, Expr::Int(d)), x.clone());
    }
    e
}

impl Lowerer<'_> {
    /// Element `idx` = `[n, c, y..]` of `Col2Im` node `n`.
    pub(crate) fn col2im(&mut self, n: NodeId, idx: &[Expr]) -> R<Expr> {
        let node = self.g.node(n);
        let Op::Linalg(LinalgOp::Col2Im { image_shape, block_shape, dilations, pads, strides }) = &node.op else {
            return self.unsupported(n, "not a col2im");
        };
        if let Some(why) = refusal(&node.op) {
            return self.unsupported(n, why);
        }
        let (x, y) = (node.inputs[0], node.outputs[0]);
        let k = image_shape.len();
        let lens = positions(image_shape, block_shape, dilations, pads, strides);
        let blocks: Vec<i64> = block_shape.iter().map(|&b| b as i64).collect();
        let taps: i64 = blocks.iter().product();
        let ct = compute_dtype(self.dtype(y));
        let (nb, c) = (idx[0].clone(), idx[1].clone());
        let ys = &idx[2..];
        let tiles = (0..k).all(|i| {
            strides[i] == block_shape[i] && dilations[i] == 1 && pads[i] == 0 && pads[k + i] == 0
        });
        if tiles {
            // One tap per output: t = y mod s, l = y / s; pixels past the last whole block
            // (an image that is not a multiple of the block) are zeros.
            let t: Vec<Expr> = (0..k).map(|i| bin(BinOp::Rem, ys[i].clone(), Expr::Int(blocks[i]))).collect();
            let l: Vec<Expr> = (0..k).map(|i| bin(BinOp::Div, ys[i].clone(), Expr::Int(blocks[i]))).collect();
            let ch = bin(BinOp::Add, bin(BinOp::Mul, c, Expr::Int(taps)), flat(&t, &blocks));
            let at = vec![nb, ch, flat(&l, &lens)];
            let inside = (0..k)
                .filter(|&i| lens[i] * blocks[i] < image_shape[i] as i64)
                .map(|i| bin(BinOp::Lt, ys[i].clone(), Expr::Int(lens[i] * blocks[i])))
                .reduce(|a, b| bin(BinOp::And, a, b));
            return Ok(match inside {
                None => self.value_at(x, &at)?,
                Some(cond) => {
                    let v = self.guarded(true, |l| l.value_at(x, &at))?;
                    Expr::select(cond, v, lit(0.0, self.dtype(y)))
                }
            });
        }
        // Every tap: a term when its block position lies on the stride grid and inside.
        let mut sum: Option<Expr> = None;
        for tf in 0..taps {
            let mut rest = tf;
            let mut t = vec![0i64; k];
            for i in (0..k).rev() {
                t[i] = rest % blocks[i];
                rest /= blocks[i];
            }
            let mut conds = vec![];
            let mut l = vec![];
            for i in 0..k {
                let p = self.simp(bin(BinOp::Sub, bin(BinOp::Add, ys[i].clone(), Expr::Int(pads[i] as i64)), Expr::Int(t[i] * dilations[i] as i64)));
                let s = strides[i] as i64;
                conds.push(bin(BinOp::Ge, p.clone(), Expr::Int(0)));
                if s > 1 {
                    conds.push(bin(BinOp::Eq, bin(BinOp::Rem, p.clone(), Expr::Int(s)), Expr::Int(0)));
                }
                let li = if s > 1 { bin(BinOp::Div, p, Expr::Int(s)) } else { p };
                conds.push(bin(BinOp::Lt, li.clone(), Expr::Int(lens[i])));
                l.push(li);
            }
            let ch = bin(BinOp::Add, bin(BinOp::Mul, c.clone(), Expr::Int(taps)), Expr::Int(tf));
            let at = vec![nb.clone(), ch, flat(&l, &lens)];
            let v = self.guarded(true, |lw| lw.value_at(x, &at))?;
            let v = self.up(v, self.dtype(x));
            let cond = conds.into_iter().reduce(|a, b| bin(BinOp::And, a, b)).unwrap_or(Expr::Lit(Lit::Bool(true)));
            let term = Expr::select(cond, v, lit(0.0, ct));
            sum = Some(match sum {
                None => term,
                Some(s) => bin(BinOp::Add, s, term),
            });
        }
        let s = sum.unwrap_or_else(|| lit(0.0, ct));
        Ok(self.down(s, self.dtype(y)))
    }
}
