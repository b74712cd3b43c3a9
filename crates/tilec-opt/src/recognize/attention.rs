//! Scaled-dot-product attention: `softmax((Q @ K^T) * scale [+ mask], -1) @ V` on
//! `[B, H, S, D]` tensors → `NnOp::Attention` (4-D form). K^T (see [`k_from_kt`]) is a
//! Transpose of K (`[0,1,3,2]`), of the pre-head-transpose `[B, S, H, D]` view
//! (`[0,2,3,1]`, then a `[0,2,1,3]` Transpose of that view is emitted as K), PyTorch's
//! SDPA chain `reshape [B*H, S, D] → transpose [0,2,1] → reshape [B, H, D, S]`, or any
//! other `[B, H, D, S]` value (nn.MultiheadAttention's K after transpose merging), which
//! is transposed back in the rewrite: the layout passes and the partitioner fold that
//! into index arithmetic. K may come from another sequence than Q (cross-attention: T
//! differs from S). GQA/MQA head repetition (`reshape [B,Hkv,1,S,D] → expand or tile
//! [B,Hkv,n,S,D] → reshape [B,Hkv*n,S,D]`, also merged by the SDPA chain's first
//! reshape, or an expand or tile of a `[B,1,S,D]` K/V; i.e. query head h reads KV head
//! h / n, as the Attention op does) is folded into the op; tiling whole head blocks
//! (h reads h % Hkv) is not. The scale may be split over Q and K (`(Q * c) @ (K * c)^T`,
//! as ONNX's Attention function and PyTorch's exporter spell it, with the factor on
//! either side of K's transpose). Softcapping (`cap * tanh(scores / cap)`, before the
//! mask) becomes the op's `softcap`.
//!
//! Masks, all right-aligned against the scores `[B, H, S, T]` with last dim exactly `T`
//! (the op pads a shorter mask with -inf, which broadcasting would not do) and never
//! broadcasting the scores up:
//! - additive float masks, `scores + mask`; `mask = where(keep, 0, -inf)` with a bool
//!   `keep` becomes the bool mask `keep` itself; two additive terms, `(scores + bias) +
//!   mask` (a relative position bias and a padding mask), become one float mask, their
//!   sum, computed before the op;
//! - boolean masks, `where(keep, scores, -inf)`: the op's bool mask adds 0 where true and
//!   -inf where false, the same logits. Only an exact -inf fill is accepted: a finite
//!   fill (`-1e9`, `finfo.min`) gives a different softmax for a fully masked row (uniform
//!   weights instead of none), and a `0` fill is not a mask at all.
//!
//! - a constant causal mask (`0` / `true` where `j <= i`, `-inf` / `false` elsewhere, over
//!   `[S, T]` with leading ones), alone or added to another mask, becomes `is_causal`.
//!
//! A row masked entirely is the one place the rewrite is not bit-identical: softmax over
//! all -inf is NaN, the Attention op gives zeros there (as ONNX Attention specifies). The
//! ONNX function's own guard, `where(max(mask, -1) == -inf, 0, softmax(..))` (or a constant
//! all-false guard), gives those zeros too and is folded into the op, exactly. PyTorch's
//! exported SDPA guards with `where(isnan(p), 0, p)`, which also zeroes rows with a NaN
//! or +inf logit (non-finite inputs, an overflowing product): it becomes the op's
//! `zero_nan_rows`, which does exactly that, so the rewrite keeps its results there too.
//!
//! Masks built from iotas and comparisons (causal, sliding-window, padding) are bool
//! masks like any other; one small enough to evaluate (see [`MAX_MASK_ELEMS`] and the
//! matcher's constant limit) that is exactly causal becomes `is_causal`. Additive float
//! biases (ALiBi-style `slope * (j - i)`) are float masks.
//!
//! Not recognized: spellings where the QK product, the logits or the probabilities are
//! themselves read outside (a graph output, as for `qk_matmul_output_mode`): the
//! primitives would have to stay anyway.

use super::mask::RowMask;
use super::pattern::{emit, Build, Matcher, Product};
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp, NnOp, NormOp, ReduceKind, ReduceOp, UnaryOp};
use tilec_ir::{DType, Dim, Op, Tensor, ValueId};

/// `v` with a single-use product by constants around it opened: `(inner, coef)`.
/// Exporters split the scale as `sqrt(scale)` on Q and on K (ONNX's Attention function
/// does), and transpose sinking may leave K's factor under the transpose.
fn strip_scale(m: &mut Matcher, v: ValueId) -> (ValueId, f64) {
    if m.use_count(v) != 1 {
        return (v, 1.0);
    }
    m.attempt(|m| {
        let p = m.product(v);
        (p.denoms.is_empty() && p.factors.len() == 1).then(|| (p.factors[0], p.coef))
    })
    .unwrap_or((v, 1.0))
}

/// How the rewrite gets K `[B, Hkv, S, D]` from the value the match found.
#[derive(Clone, Debug)]
enum KFrom {
    /// The value is K.
    AsIs,
    /// The value is the pre-head-transpose `[B, S, H, D]` view: K is its `[0, 2, 1, 3]`
    /// transpose.
    Bshd,
    /// The value holds K's elements in order under another shape (`[B*H, S, D]`): K is
    /// its reshape to this shape.
    Reshape(Vec<Dim>),
    /// The value is `K^T` itself (`[B, H, D, S]`, however it was computed, left in the
    /// graph): K is its `[0, 1, 3, 2]` transpose, which the layout passes compose with
    /// whatever produced it.
    Transposed,
}

/// K for `kt`: `(value, how K is made from it, scale factor found between K and the
/// transpose)`. Spellings of `K^T`:
/// - `transpose(K, [0, 1, 3, 2])`, or `[0, 2, 3, 1]` of the `[B, S, H, D]` view;
/// - `reshape(transpose(reshape(K, [B*H, S, D]), [0, 2, 1]), [B, H, D, S])`, as
///   PyTorch's exporter transposes K inside SDPA (K may be a GQA-repeated 5-D
///   `[B, Hkv, n, S, D]` view, merged by the first reshape);
/// - anything else of shape `[B, H, D, S]` (e.g. that chain after transpose merging:
///   `reshape(transpose(x, [1, 2, 0]), ..)` in torchvision's ViT), taken whole.
fn k_from_kt(m: &mut Matcher, kt: ValueId) -> Option<(ValueId, KFrom, f64)> {
    let kts = m.g.value(kt).ty.shape.clone();
    if kts.len() != 4 {
        return None;
    }
    if let Some(r) = m.attempt(|m| {
        let n = m.op_where(kt, |op| matches!(op, Op::Layout(LayoutOp::Transpose { .. })))?;
        let Op::Layout(LayoutOp::Transpose { perm }) = &n.op else {
            return None;
        };
        let how = match perm.as_slice() {
            [0, 1, 3, 2] => KFrom::AsIs,
            [0, 2, 3, 1] => KFrom::Bshd,
            _ => return None,
        };
        let (k, coef) = strip_scale(m, n.inputs[0]);
        if m.g.value(k).ty.shape != m.g.value(n.inputs[0]).ty.shape {
            return None;
        }
        Some((k, how, coef))
    }) {
        return Some(r);
    }
    // reshape(transpose(reshape(x, [N, S, D]), [0, 2, 1]), [B, H, D, S])
    if let Some(r) = m.attempt(|m| {
        if m.use_count(kt) != 1 {
            return None;
        }
        let r2 = m.op_where(kt, |op| matches!(op, Op::Layout(LayoutOp::Reshape { .. })))?;
        let t = r2.inputs[0];
        if m.use_count(t) != 1 {
            return None;
        }
        let tn = m.op_where(t, |op| {
            matches!(op, Op::Layout(LayoutOp::Transpose { perm }) if perm.as_slice() == [0, 2, 1])
        })?;
        let r1 = tn.inputs[0];
        if m.use_count(r1) != 1 {
            return None;
        }
        let r1n = m.op_where(r1, |op| matches!(op, Op::Layout(LayoutOp::Reshape { .. })))?;
        let (x, coef) = strip_scale(m, r1n.inputs[0]);
        let xs = m.g.value(x).ty.shape.clone();
        let r1s = m.g.value(r1).ty.shape.clone();
        // x [.., S, D] -> [N, S, D] -> [N, D, S] -> [B, H, D, S]: the leading dims of
        // x merge into N and split again into B, H (element counts agree by typing).
        let n = xs.len();
        if n < 3 || r1s.len() != 3 || r1s[1..] != xs[n - 2..] || kts[2] != xs[n - 1] || kts[3] != xs[n - 2] {
            return None;
        }
        let want = vec![kts[0], kts[1], xs[n - 2], xs[n - 1]];
        if xs == want {
            return Some((x, KFrom::AsIs, coef));
        }
        if n == 5 {
            if let Some(src) = repeat_src(m, x, &want) {
                return Some((src, KFrom::AsIs, coef));
            }
        }
        Some((x, KFrom::Reshape(want), coef))
    }) {
        return Some(r);
    }
    // Any other [B, H, D, S] value: transposed back in the rewrite.
    Some((kt, KFrom::Transposed, 1.0))
}

/// GQA/MQA head repetition ending in `x`, for a K or V of shape `want` = `[B, Hq, S, D]`:
/// the `[B, Hkv, S, D]` source when `x` repeats each KV head `n` times in a row (query
/// head h reads KV head h / n, as the Attention op does). `x` is either the 5-D
/// `[B, Hkv, n, S, D]` expand (or tile) of `reshape(src, [B, Hkv, 1, S, D])`, which a
/// reshape merges into `want`, or (MQA, Hkv = 1) `want` itself as an expand or tile of
/// a `[B, 1, S, D]` source.
fn repeat_src(m: &mut Matcher, x: ValueId, want: &[Dim]) -> Option<ValueId> {
    m.attempt(|m| {
        if m.use_count(x) != 1 || want.len() != 4 {
            return None;
        }
        let xs = m.g.value(x).ty.shape.clone();
        let en = m.op_where(x, |op| {
            matches!(op, Op::Layout(LayoutOp::Expand { .. } | LayoutOp::Tile { .. }))
        })?;
        let inner = en.inputs[0];
        let is_ = m.g.value(inner).ty.shape.clone();
        let tile_ok = |m: &Matcher, axis: usize| match &en.op {
            Op::Layout(LayoutOp::Tile { repeats }) => {
                repeats.iter().enumerate().all(|(i, &r)| r == 1 || i == axis)
            }
            _ => {
                let _ = m;
                true
            }
        };
        if xs.len() == 4 {
            // MQA: [B, 1, S, D] -> [B, Hq, S, D].
            let ok = is_.len() == 4
                && is_[1] == Dim::Fixed(1)
                && is_[0] == want[0]
                && is_[2] == want[2]
                && is_[3] == want[3]
                && xs.as_slice() == want
                && tile_ok(m, 1);
            return ok.then_some(inner);
        }
        if xs.len() != 5 || is_.len() != 5 || m.use_count(inner) != 1 || !tile_ok(m, 2) {
            return None;
        }
        let rn = m.op_where(inner, |op| matches!(op, Op::Layout(LayoutOp::Reshape { .. })))?;
        let src = rn.inputs[0];
        let s = m.g.value(src).ty.shape.clone();
        if s.len() != 4 {
            return None;
        }
        let unsq = is_[0] == s[0] && is_[1] == s[1] && is_[2] == Dim::Fixed(1) && is_[3] == s[2] && is_[4] == s[3];
        let exp = xs[0] == s[0] && xs[1] == s[1] && xs[3] == s[2] && xs[4] == s[3];
        let merged = match (s[1], xs[2], want[1]) {
            (Dim::Fixed(h), Dim::Fixed(n), Dim::Fixed(t)) => h * n == t,
            _ => false,
        };
        let out = want[0] == s[0] && want[2] == s[2] && want[3] == s[3];
        (unsq && exp && merged && out).then_some(src)
    })
}

/// Undoes GQA head repetition: returns the `[B, Hkv, S, D]` source, or `v` itself.
fn strip_repeat(m: &mut Matcher, v: ValueId) -> ValueId {
    let want = m.g.value(v).ty.shape.clone();
    if want.len() != 4 {
        return v;
    }
    m.attempt(|m| {
        // [B, Hkv, n, S, D] merged by a reshape ...
        if let Some(src) = m.attempt(|m| {
            let r2 = m.op_where(v, |op| matches!(op, Op::Layout(LayoutOp::Reshape { .. })))?;
            repeat_src(m, r2.inputs[0], &want)
        }) {
            return Some(src);
        }
        // ... or (MQA) a [B, 1, S, D] expanded or tiled.
        repeat_src(m, v, &want)
    })
    .unwrap_or(v)
}

/// `where(keep, s, fill)` with a bool `keep` and a uniform constant `fill` of exactly
/// -inf: returns `(keep, s)`.
fn where_neg_inf(m: &mut Matcher, v: ValueId) -> Option<(ValueId, ValueId)> {
    let n = m.op_where(v, |op| *op == Op::Where)?;
    let (keep, s, fill) = (*n.inputs.first()?, *n.inputs.get(1)?, *n.inputs.get(2)?);
    if m.g.value(keep).ty.dtype != DType::Bool || m.const_scalar(fill) != Some(f64::NEG_INFINITY) {
        return None;
    }
    Some((keep, s))
}

/// `where(keep, s, fill)` with `keep` a constant causal bool mask over the scores and `fill`
/// a uniform constant of at most -1e9 (GPT-Neo's `finfo.min`): returns `s`. In f32 such a
/// fill gives masked keys exactly zero weight whenever a row keeps one key, as a causal row
/// always does, so the select is the op's `is_causal`.
fn where_causal_fill(m: &mut Matcher, v: ValueId, scores: &[Dim]) -> Option<ValueId> {
    let n = m.op_where(v, |op| *op == Op::Where)?;
    let (keep, s, fill) = (*n.inputs.first()?, *n.inputs.get(1)?, *n.inputs.get(2)?);
    let f = m.const_scalar(fill)?;
    let ok = m.g.value(keep).ty.dtype == DType::Bool
        && f <= -1e9
        && m.g.value(s).ty.shape == m.g.value(v).ty.shape
        && is_causal_mask(m, keep, scores);
    ok.then_some(s)
}

/// An additive mask `where(keep, 0, -inf)` with a bool `keep`: returns `keep`, the same
/// mask in the op's bool form.
fn bool_of_additive(m: &mut Matcher, v: ValueId) -> Option<ValueId> {
    // Not recorded: the where may be shared (one mask for every layer); only its input is read.
    let n = m.node(v).filter(|n| n.op == Op::Where)?;
    let (keep, zero, fill) = (*n.inputs.first()?, *n.inputs.get(1)?, *n.inputs.get(2)?);
    let ok = m.g.value(keep).ty.dtype == DType::Bool
        && m.const_scalar(zero) == Some(0.0)
        && m.const_scalar(fill) == Some(f64::NEG_INFINITY)
        // keep alone must give the where's shape (no broadcasting by the constants).
        && m.g.value(keep).ty.shape == m.g.value(v).ty.shape;
    ok.then_some(keep)
}

/// `where(guard, 0, s)` with a bool `guard` that does not broadcast `s` up: returns
/// `(guard, s)`. ONNX's Attention function zeroes the probabilities of fully masked rows
/// this way, as the Attention op does.
fn zero_guard(m: &mut Matcher, v: ValueId) -> Option<(ValueId, ValueId)> {
    let n = m.op_where(v, |op| *op == Op::Where)?;
    let (c, zero, s) = (*n.inputs.first()?, *n.inputs.get(1)?, *n.inputs.get(2)?);
    let ok = m.g.value(c).ty.dtype == DType::Bool
        && m.const_scalar(zero) == Some(0.0)
        && m.g.value(s).ty.shape == m.g.value(v).ty.shape;
    ok.then_some((c, s))
}

/// The value of a constant or constant-computed value, up to `MAX_MASK_ELEMS` elements
/// along the way (masks that exports build from position iotas are computed, not stored).
fn known(m: &Matcher, v: ValueId) -> Option<std::rc::Rc<Tensor>> {
    m.const_tensor_upto(v, MAX_MASK_ELEMS)
}

/// Largest constant mask inspected (causal detection, all-false guards).
const MAX_MASK_ELEMS: usize = 1 << 22;

/// Whether the zero guard `c` flags exactly the rows the op treats as fully masked: a
/// constant all-false guard (no row is), or `max(mask, last axis) == -inf` of the additive
/// mask itself.
fn guard_ok(m: &Matcher, c: ValueId, additive: Option<ValueId>) -> bool {
    if let Some(t) = known(m, c) {
        return t.dtype() == DType::Bool && t.to_i64_vec().iter().all(|&x| x == 0);
    }
    let Some(mask) = additive else {
        return false;
    };
    let Some(n) = m.node(c) else {
        return false;
    };
    if n.op != Op::Binary(BinaryOp::Equal) || n.inputs.len() != 2 {
        return false;
    }
    let last = m.g.value(mask).ty.rank().wrapping_sub(1);
    [(n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])]
        .into_iter()
        .any(|(a, b)| {
            m.const_scalar(b) == Some(f64::NEG_INFINITY)
                && m.node(a).is_some_and(|r| {
                    r.inputs.first() == Some(&mask)
                        && matches!(&r.op, Op::Reduce(ReduceOp::Reduce {
                            kind: ReduceKind::Max,
                            axes,
                            keepdims: true,
                        }) if axes.as_slice() == [last])
                })
        })
}

/// Whether `mask` is a constant (or constant-computed) causal mask for scores `[.., S, T]`:
/// `[S, T]` after leading dims that broadcast to the scores' (every slice the same),
/// allowing exactly `j <= i` (0 / true) and masking the rest (false; -inf, or an additive
/// fill at or below f16's lowest finite value, -65504, as exporters write `finfo.min`) —
/// the op's `is_causal` without past or padding. A finite fill is exact here because no
/// row is masked whole (every row keeps its diagonal): a masked logit adds nothing unless it
/// exceeds its row's largest visible logit by more than about 65400.
fn is_causal_mask(m: &Matcher, mask: ValueId, scores: &[Dim]) -> bool {
    m.fact("causal", mask, scores, |m| causal_now(m, mask, scores))
}

fn causal_now(m: &Matcher, mask: ValueId, scores: &[Dim]) -> bool {
    let ty = &m.g.value(mask).ty;
    let Some(sh) = ty.fixed_shape() else {
        return false;
    };
    let (Some(Dim::Fixed(s)), Some(Dim::Fixed(tk))) =
        (scores.get(scores.len().wrapping_sub(2)), scores.last())
    else {
        return false;
    };
    let r = sh.len();
    let lead = &scores[..scores.len() - 2];
    if r < 2 || r > scores.len() || sh[r - 2] != *s || sh[r - 1] != *tk {
        return false;
    }
    // Leading dims: 1 or the scores' own.
    let offset = scores.len() - r;
    if sh[..r - 2].iter().enumerate().any(|(i, &d)| d != 1 && lead.get(offset + i) != Some(&Dim::Fixed(d))) {
        return false;
    }
    let boolean = ty.dtype == DType::Bool;
    let (s, tk) = (*s, *tk);
    // Row `row` (of every [S, T] slice's rows in order) keeps exactly its first `i + 1`.
    let causal_row = |row: usize, xs: &[f64]| {
        let i = row % s;
        xs.len() == tk
            && xs.iter().enumerate().all(|(j, &x)| match (boolean, j <= i) {
                (true, keep) => (x != 0.0) == keep,
                (false, true) => x == 0.0,
                (false, false) => x <= -65504.0,
            })
    };
    // A mask computed elementwise from position iotas is inspected row by row; any other
    // (a constant, or computed otherwise) is evaluated whole.
    if m.g.const_value(mask).is_none() {
        if let Some(rows) = RowMask::of(m, mask, MAX_MASK_ELEMS) {
            return rows.all_rows(causal_row);
        }
    }
    let Some(t) = known(m, mask) else {
        return false;
    };
    t.to_f64_vec().chunks(tk).enumerate().all(|(row, xs)| causal_row(row, xs))
}

/// `mask + causal` (either order) with a constant causal mask that does not broadcast the
/// other mask up: returns the other mask. Not recorded: the sum may have other readers
/// (the fully-masked-row guard reads it).
fn split_causal(m: &Matcher, mask: ValueId, scores: &[Dim]) -> Option<ValueId> {
    let n = m.node(mask)?;
    if n.op != Op::Binary(BinaryOp::Add) || n.inputs.len() != 2 {
        return None;
    }
    let (a, b) = (n.inputs[0], n.inputs[1]);
    let same = |x: ValueId| m.g.value(x).ty == m.g.value(mask).ty;
    [(a, b), (b, a)]
        .into_iter()
        .find(|&(x, c)| same(x) && is_causal_mask(m, c, scores))
        .map(|(x, _)| x)
}

pub fn attention(m: &mut Matcher, root: ValueId) -> Option<Build> {
    attention_with(m, root, false)
}

/// [`attention`] limited to what the CUDA FlashAttention family runs: 16-bit Q, K and V with
/// one head dim of 64 or 128, no softcapping. The CUDA pipeline uses it behind the opt-in
/// (`TILEC_CUDA_ATTENTION=flash`), so that other attention keeps its products and softmax.
pub fn attention_flash(m: &mut Matcher, root: ValueId) -> Option<Build> {
    attention_with(m, root, true)
}

fn attention_with(m: &mut Matcher, root: ValueId, flash: bool) -> Option<Build> {
    let n = m.op_where(root, |op| *op == Op::Linalg(LinalgOp::MatMul))?;
    let (p, v0) = (n.inputs[0], n.inputs[1]);
    let dtype = m.g.value(root).ty.dtype;
    if !dtype.is_float() || m.g.value(root).ty.rank() != 4 {
        return None;
    }
    let guard = m.attempt(|m| zero_guard(m, p));
    let p = guard.map_or(p, |(_, s)| s);
    // `where(isnan(p), 0, p)`: PyTorch's exported SDPA zeroes the NaN rows of the
    // softmax (fully masked rows, and rows with a NaN or +inf logit). The op keeps that
    // exactly through `zero_nan_rows`.
    let nan_guard = guard.is_some_and(|(c, _)| {
        m.attempt(|m| (m.unary(c, UnaryOp::IsNaN)? == p && m.use_count(c) == 1).then_some(()))
            .is_some()
    });
    let sn = m.op_where(p, |op| *op == Op::Norm(NormOp::Softmax { axis: 3 }))?;
    let sc = sn.inputs[0];
    // scores = product(q @ kt), or its softcapped form `cap * tanh(product(q @ kt) / cap)`
    // (`q`, `k`, K from the [B, S, H, D] view, scale, softcap (0: none))
    let core = |m: &mut Matcher, s: ValueId| -> Option<(ValueId, ValueId, KFrom, f64, f64)> {
        let mut pr = m.product(s);
        if !pr.denoms.is_empty() || pr.factors.len() != 1 {
            return None;
        }
        let mut softcap = 0.0;
        if let Some(x) = m.attempt(|m| m.unary(pr.factors[0], UnaryOp::Tanh)) {
            // cap * tanh(y / cap): the outer coefficient is the cap, the inner one 1/cap
            // times whatever scale was folded in there.
            softcap = pr.coef;
            if m.use_count(x) != 1 || !(softcap > 0.0 && softcap.is_finite()) {
                return None;
            }
            let inner = m.product(x);
            if !inner.denoms.is_empty() || inner.factors.len() != 1 {
                return None;
            }
            pr = Product {
                coef: inner.coef * softcap,
                factors: inner.factors,
                denoms: vec![],
            };
        }
        let mm = m.op_where(pr.factors[0], |op| *op == Op::Linalg(LinalgOp::MatMul))?;
        let (qs, kts) = (mm.inputs[0], mm.inputs[1]);
        let pq = m.product(qs);
        let pk = m.product(kts);
        if !pq.denoms.is_empty()
            || !pk.denoms.is_empty()
            || pq.factors.len() != 1
            || pk.factors.len() != 1
        {
            return None;
        }
        let (k, how, kc) = k_from_kt(m, pk.factors[0])?;
        let scale = pr.coef * pq.coef * pk.coef * kc;
        Some((pq.factors[0], k, how, scale, softcap))
    };
    // (core match, scores value the core produced, mask)
    let mut found = None;
    // The additive mask as spelled in the graph (before turning it into a bool mask).
    let mut additive = None;
    // A second additive term, summed with the mask into one float mask in the rewrite:
    // `(scores + bias) + mask`, a relative position bias and a padding mask (MPNet, T5).
    let mut second = None;
    if let Some((a, b)) = m.attempt(|m| m.binary(sc, BinaryOp::Add)) {
        for (s, mask) in [(a, b), (b, a)] {
            if let Some(c) = m.attempt(|m| core(m, s)) {
                additive = Some(mask);
                found = Some((c, s, Some(mask)));
                break;
            }
        }
        if found.is_none() {
            'terms: for (inner, outer) in [(a, b), (b, a)] {
                let Some((x, y)) = m.attempt(|m| m.binary(inner, BinaryOp::Add)) else { continue };
                for (s, bias) in [(x, y), (y, x)] {
                    if let Some(c) = m.attempt(|m| core(m, s)) {
                        (additive, second) = (Some(bias), Some(outer));
                        found = Some((c, s, Some(bias)));
                        break 'terms;
                    }
                }
            }
        }
    }
    if found.is_none() {
        found = m.attempt(|m| {
            let (keep, s) = where_neg_inf(m, sc)?;
            Some((core(m, s)?, s, Some(keep)))
        });
    }
    // `where(causal, scores, finfo.min) + mask` (GPT-Neo): causal, with the float mask.
    let mut causal_fill = false;
    if found.is_none() {
        let sshape = m.g.value(sc).ty.shape.clone();
        found = m.attempt(|m| {
            let (a, b) = m.binary(sc, BinaryOp::Add)?;
            for (w, mask) in [(a, b), (b, a)] {
                if let Some(s) = m.attempt(|m| where_causal_fill(m, w, &sshape)) {
                    if let Some(c) = m.attempt(|m| core(m, s)) {
                        return Some((c, s, Some(mask)));
                    }
                }
            }
            None
        });
        if let Some((_, _, mk)) = &found {
            (additive, causal_fill) = (*mk, true);
        }
    }
    if found.is_none() {
        found = Some((m.attempt(|m| core(m, sc))?, sc, None));
    }
    let ((q, k0, how, scale, softcap), scores, mut mask) = found?;
    let sshape = &m.g.value(scores).ty.shape;
    if m.g.value(sc).ty.shape != *sshape || sshape.len() != 4 {
        return None;
    }
    if let Some((c, _)) = guard.filter(|_| !nan_guard) {
        if !guard_ok(m, c, additive) {
            return None;
        }
    }
    // A constant causal mask becomes the op's `is_causal` (no mask read at all), also
    // when it is added to another mask.
    let mut is_causal = causal_fill;
    if let Some(t) = second {
        // Both terms float masks of the scores' dtype, each with the full last dim.
        for mk in [mask, Some(t)].into_iter().flatten() {
            let ty = &m.g.value(mk).ty;
            if ty.dtype != dtype || ty.rank() == 0 || ty.rank() > 4 || ty.shape.last() != sshape.last() {
                return None;
            }
        }
    }
    if let Some(mk) = mask.filter(|_| second.is_none()) {
        if is_causal_mask(m, mk, sshape) {
            (is_causal, mask) = (true, None);
        } else if let Some(rest) = split_causal(m, mk, sshape) {
            (is_causal, mask) = (true, Some(rest));
        }
    }
    if additive.is_some() && second.is_none() {
        mask = mask.map(|mk| m.attempt(|m| bool_of_additive(m, mk)).unwrap_or(mk));
    }
    if let Some(mk) = mask {
        let t = &m.g.value(mk).ty;
        if (t.dtype != dtype && t.dtype != DType::Bool) || t.rank() == 0 || t.rank() > 4 {
            return None;
        }
        if t.shape.last() != sshape.last() {
            return None;
        }
    }
    let k1 = match how {
        KFrom::AsIs => strip_repeat(m, k0),
        _ => k0,
    };
    let v = strip_repeat(m, v0);
    if m.g.value(q).ty.rank() != 4 || m.g.value(v).ty.rank() != 4 {
        return None;
    }
    // K and V must have as many heads (the op derives the KV heads from K): both
    // repeated or both not.
    let ks = &m.g.value(k1).ty.shape;
    let k_heads = match &how {
        KFrom::AsIs | KFrom::Transposed => ks.get(1),
        KFrom::Bshd => ks.get(2),
        KFrom::Reshape(w) => w.get(1),
    };
    if k_heads != m.g.value(v).ty.shape.get(1) {
        return None;
    }
    if flash {
        let qt = &m.g.value(q).ty;
        let dim = |v: ValueId| m.g.value(v).ty.shape.last().and_then(|d| d.fixed());
        let head = dim(q);
        let ok = matches!(qt.dtype, DType::BF16 | DType::F16)
            && matches!(head, Some(64 | 128))
            && dim(v) == head
            && softcap == 0.0;
        if !ok {
            return None;
        }
    }
    let name = m.g.value(root).name.clone();
    Some(Box::new(move |g| {
        let k = match how {
            KFrom::AsIs => k1,
            KFrom::Bshd => emit(g, &name, Op::Layout(LayoutOp::Transpose { perm: vec![0, 2, 1, 3] }), &[k1])?,
            KFrom::Reshape(shape) => emit(g, &name, Op::Layout(LayoutOp::Reshape { shape }), &[k1])?,
            KFrom::Transposed => {
                emit(g, &name, Op::Layout(LayoutOp::Transpose { perm: vec![0, 1, 3, 2] }), &[k1])?
            }
        };
        let mut ins = vec![q, k, v];
        match (mask, second) {
            (Some(a), Some(b)) => ins.push(emit(g, &name, Op::Binary(BinaryOp::Add), &[a, b])?),
            _ => ins.extend(mask),
        }
        let op = NnOp::Attention {
            q_num_heads: 0,
            kv_num_heads: 0,
            scale: Some(scale as f32),
            is_causal,
            softcap: softcap as f32,
            qk_matmul_output_mode: 0,
            softmax_precision: None,
            left_window: -1,
            right_window: -1,
            has_mask: mask.is_some(),
            has_past: false,
            has_nonpad: false,
            zero_nan_rows: nan_guard,
        };
        emit(g, &name, Op::Nn(op), &ins)
    }))
}
