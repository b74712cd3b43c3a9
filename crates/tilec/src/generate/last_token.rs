//! The prefill's logits at each sequence's last prompt token only.
//!
//! A prefill over `[rows, T]` tokens computes logits `[rows, T, vocab]`, of which generation
//! reads one row per sequence: at 16 x 128 tokens and a vocabulary of 32000 that is 262 MB of
//! f32 written, read back from a GPU and converted for 16 rows of 128 KB. [`keep_last`] makes
//! the rewritten prefill return `[rows, 1, vocab]`, the logits at the given positions: when the
//! logits are `cast*(matmul(x, W))` with `W` a constant `[hidden, vocab]` (the LM head, as
//! decoder exports end), the rows of `x` are picked before the product, so that the head runs
//! on `rows` tokens instead of `rows * T`; otherwise the logits' rows are picked after it.

use tilec_ir::op::{IndexOp, LayoutOp, LinalgOp};
use tilec_ir::{Dim, Graph, Op, Tensor, ValueDef, ValueId};
use tilec_opt::decoder::PagedDecoder;

/// `x [rows, T, d]` → `x[b, last[b], :]` as `[rows, 1, d]`.
fn pick_rows(g: &mut Graph, x: ValueId, last: &[usize], name: &str) -> Result<ValueId, String> {
    let s = g.value(x).ty.fixed_shape().filter(|s| s.len() == 3).ok_or_else(|| format!("'{}' is not [rows, tokens, d]", g.value(x).name))?;
    let (rows, t, d) = (s[0], s[1], s[2]);
    if last.len() != rows || last.iter().any(|&l| l >= t) {
        return Err(format!("last positions {last:?} do not fit [{rows}, {t}] tokens"));
    }
    let at: Vec<i64> = last.iter().enumerate().map(|(b, &l)| (b * t + l) as i64).collect();
    let at = g.add_const(&format!("{name}/at"), Tensor::from_vec(vec![rows], at).map_err(|e| e.to_string())?);
    let e = |e: tilec_ir::IrError| e.to_string();
    let flat = g.add_node(&format!("{name}/flat"), Op::Layout(LayoutOp::Reshape { shape: vec![Dim::Fixed(rows * t), Dim::Fixed(d)] }), &[x]).map_err(e)?[0];
    let picked = g.add_node(&format!("{name}/pick"), Op::Index(IndexOp::Gather { axis: 0 }), &[flat, at]).map_err(e)?[0];
    let shape = vec![Dim::Fixed(rows), Dim::Fixed(1), Dim::Fixed(d)];
    Ok(g.add_node(&format!("{name}/rows"), Op::Layout(LayoutOp::Reshape { shape }), &[picked]).map_err(e)?[0])
}

/// The LM head behind the logits: `(x, W, casts)` for `logits = cast_n(..cast_1(matmul(x, W)))`
/// with `W` a constant matrix, the casts in the order they apply.
fn head(g: &Graph, logits: ValueId) -> Option<(ValueId, ValueId, Vec<Op>)> {
    let mut casts = vec![];
    let mut v = logits;
    loop {
        let n = g.node(g.producer(v)?);
        match &n.op {
            Op::Cast { .. } => {
                casts.push(n.op.clone());
                v = n.inputs[0];
            }
            Op::Linalg(LinalgOp::MatMul) => {
                let (x, w) = (n.inputs[0], n.inputs[1]);
                let is_matrix = matches!(g.value(w).def, ValueDef::Const(_)) && g.value(w).ty.rank() == 2;
                casts.reverse();
                return (is_matrix && g.value(x).ty.rank() == 3).then_some((x, w, casts));
            }
            _ => return None,
        }
    }
}

/// Makes the prefill `dec` return the logits of row `b` at token `last[b]` only, as
/// `[rows, 1, vocab]` (see the module's text).
pub fn keep_last(dec: &mut PagedDecoder, last: &[usize]) -> Result<(), String> {
    let g = &mut dec.graph;
    let outs = g.outputs().to_vec();
    let logits = *outs.first().ok_or("the prefill has no outputs")?;
    let name = "last_token";
    let picked = match head(g, logits) {
        Some((x, w, casts)) => {
            let xs = pick_rows(g, x, last, name)?;
            let mut y = g.add_node(&format!("{name}/head"), Op::Linalg(LinalgOp::MatMul), &[xs, w]).map_err(|e| e.to_string())?[0];
            for (i, c) in casts.into_iter().enumerate() {
                y = g.add_node(&format!("{name}/cast{i}"), c, &[y]).map_err(|e| e.to_string())?[0];
            }
            y
        }
        None => pick_rows(g, logits, last, name)?,
    };
    let want = g.value(logits).ty.dtype;
    if g.value(picked).ty.dtype != want {
        return Err(format!("the picked logits are {}, the model's {want}", g.value(picked).ty.dtype));
    }
    g.value_mut(picked).name = g.value(logits).name.clone();
    g.value_mut(logits).name = format!("{name}/all_logits");
    g.set_outputs(std::iter::once(picked).chain(outs[1..].iter().copied()).collect());
    g.cleanup().map_err(|e| e.to_string())?;
    tilec_ir::verify(g).map_err(|e| e.to_string())
}
