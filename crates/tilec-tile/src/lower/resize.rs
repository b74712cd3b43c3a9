//! `Resize` as an inline expression: linear interpolation (bilinear over two axes, and so
//! on) with half-pixel coordinates, no antialiasing, on floating-point tensors, where every
//! resized axis's scale is exactly its output size over its input size (a segmentation
//! head's upsampling by 8, 16 or 32). Other modes stay on the interpreter.
//!
//! Along a resized axis of `I` inputs and `O` outputs, output `o` reads the source coordinate
//! `(o + 1/2)·I/O − 1/2 = n / d` with `n = (2o + 1)·I − O` and `d = 2O`, integers: the taps
//! `⌊n/d⌋` and `⌊n/d⌋ + 1` clamped into the input (edge values outside, as the reference),
//! weighted `1 − f` and `f`, `f = (n mod d) / d`. The output is the weighted sum over the
//! `2^k` corners of the `k` resized axes.

use tilec_ir::op::{CoordMode, ResizeAttrs, ResizeMode};
use tilec_ir::NodeId;

use super::{bin, compute_dtype, lit, Lowerer, R};
use crate::ir::*;

/// Why a resize is not lowered (`None`: it is), from its attributes and shapes.
pub(crate) fn refusal(a: &ResizeAttrs, xs: &[i64], os: &[i64]) -> Option<String> {
    if a.mode != ResizeMode::Linear || a.antialias {
        return Some("only linear resizes without antialiasing are lowered".into());
    }
    if !matches!(a.coord, CoordMode::HalfPixel | CoordMode::PytorchHalfPixel) {
        return Some(format!("{:?} coordinates are not lowered", a.coord));
    }
    if xs.len() != os.len() || a.scales.len() != xs.len() {
        return Some("a resize without one scale per axis".into());
    }
    for j in 0..xs.len() {
        let (i, o) = (xs[j], os[j]);
        if i == o && a.scales[j] == 1.0 {
            continue;
        }
        if i < 1 || o < 2 || (a.scales[j] * i as f64 - o as f64).abs() > 1e-9 * o as f64 {
            return Some(format!("axis {j}: a scale of {} is not {o}/{i}", a.scales[j]));
        }
    }
    None
}

impl Lowerer<'_> {
    /// The value of resize node `n` (attributes `a`) at output index `idx`.
    pub(super) fn resize(&mut self, n: NodeId, a: &ResizeAttrs, idx: &[Expr]) -> R<Expr> {
        let node = self.g.node(n);
        let (x, out) = (node.inputs[0], node.outputs[0]);
        let (xs, os) = (self.shape(x), self.shape(out));
        if let Some(why) = refusal(a, &xs, &os) {
            return self.unsupported(n, why);
        }
        let d = self.dtype(x);
        if !d.is_float() {
            return self.unsupported(n, "not a floating-point resize");
        }
        let cd = compute_dtype(d);
        // Per resized axis: the two taps and the weight of the second.
        let mut axes: Vec<(usize, [Expr; 2], Option<Expr>)> = vec![];
        for j in 0..xs.len() {
            let (i, o) = (xs[j], os[j]);
            if i == o && a.scales[j] == 1.0 {
                continue;
            }
            if i == 1 {
                // Both taps clamp to the one input: a broadcast (weights summing to 1).
                axes.push((j, [Expr::Int(0), Expr::Int(0)], None));
                continue;
            }
            // `n / d` in lowest terms: `n = 2I·o + (I − O)` and `d = 2O` share `gcd(2I, I − O,
            // 2O)` (`I` and more when `O` is a multiple of `I`), so that an upsampling by an
            // integer factor divides by that factor or twice it (a power of two for factors of
            // two) instead of by `2O`, which the C compiler turns into shifts and vectorizes.
            let g = gcd(gcd(2 * i, (i - o).abs()), 2 * o).max(1);
            let num = self.simp(bin(
                BinOp::Add,
                bin(BinOp::Mul, idx[j].clone(), Expr::Int(2 * i / g)),
                Expr::Int((i - o) / g),
            ));
            let den = 2 * o / g;
            let q = self.simp(bin(BinOp::FloorDiv, num.clone(), Expr::Int(den)));
            let clamp = |e: Expr| bin(BinOp::Min, bin(BinOp::Max, e, Expr::Int(0)), Expr::Int(i - 1));
            let t0 = self.simp(clamp(q.clone()));
            let t1 = self.simp(clamp(bin(BinOp::Add, q, Expr::Int(1))));
            let r = self.simp(bin(BinOp::FloorMod, num, Expr::Int(den)));
            let f = bin(BinOp::Mul, Expr::Cast(cd, Box::new(r)), lit(1.0 / den as f64, cd));
            axes.push((j, [t0, t1], Some(f)));
        }
        let mut sum: Option<Expr> = None;
        // Broadcast axes take their one tap; the others' corners are summed.
        let mut base = idx.to_vec();
        for (j, taps, _) in &axes {
            base[*j] = taps[0].clone();
        }
        let axes: Vec<(usize, [Expr; 2], Expr)> =
            axes.into_iter().filter_map(|(j, t, f)| f.map(|f| (j, t, f))).collect();
        for corner in 0..1usize << axes.len() {
            let mut at = base.clone();
            let mut w: Option<Expr> = None;
            for (b, (j, taps, f)) in axes.iter().enumerate() {
                let hi = corner >> b & 1 == 1;
                at[*j] = taps[hi as usize].clone();
                let wj = if hi { f.clone() } else { bin(BinOp::Sub, lit(1.0, cd), f.clone()) };
                w = Some(match w {
                    None => wj,
                    Some(p) => bin(BinOp::Mul, p, wj),
                });
            }
            let v = self.value_at(x, &at)?;
            let v = self.up(v, d);
            let term = match w {
                Some(w) => bin(BinOp::Mul, v, w),
                None => v,
            };
            sum = Some(match sum {
                None => term,
                Some(s) => bin(BinOp::Add, s, term),
            });
        }
        let s = sum.expect("at least one corner");
        Ok(self.down(s, d))
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}
