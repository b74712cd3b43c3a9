//! Decoder-only models over a paged KV cache: the rewrite behind `tilec generate`.
//!
//! [`paged_decoder`] takes a decoder imported with its batch and sequence dims fixed (`T` new
//! tokens per sequence: the padded prompt length for a prefill, 1 for a decode step), finds
//! its causal self-attentions (after attention recognition) and replaces each by
//! `paged_attention` (`tilec_ir::op::paged`), which reads keys and values from a block cache
//! through a block table and appends the new tokens' to it. The same rewrite serves both
//! exports:
//!
//! - with past key/value inputs, an attention's keys are `concat(past_key, new, axis 2)`
//!   (possibly repeated over query heads for grouped-query attention): `new` goes to the cache,
//!   and the past inputs, the present outputs and the mask computed from the past length drop
//!   out;
//! - without them, the keys are the new tokens' own: the whole-sequence causal attention.
//!
//! The result's inputs are `input_ids` and `position_ids` (`[B, T]`, each sequence's own
//! positions), `block_table` (i32 `[B, M]`), `past_lens` (i32 `[B]`) and per layer `k_cache_<l>`
//! and `v_cache_<l>` (`[N, bs, Hkv, D]`); its outputs are the logits, then the updated caches in
//! the same order. The attention is taken to be causal: a decoder's masks are causal masks,
//! and which mask it was is not checked (the generate tests compare with the whole model).

use tilec_ir::op::{LayoutOp, NnOp};
use tilec_ir::{DType, Dim, Graph, NodeId, Op, TensorType, ValueDef, ValueId};

use crate::manager::{Pipeline, PipelineOptions};
use crate::target::TargetKind;

/// The cache geometry a rewritten decoder is built for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CacheShape {
    /// Blocks in the pool (`N`).
    pub blocks: usize,
    /// Tokens per block (`bs`).
    pub block_size: usize,
    /// Logical blocks per sequence in the block table (`M`).
    pub max_blocks: usize,
}

/// One attention layer of a decoder.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
}

/// A decoder rewritten over a paged cache.
#[derive(Clone, Debug)]
pub struct PagedDecoder {
    pub graph: Graph,
    /// Sequences (`B`) and new tokens per sequence (`T`).
    pub batch: usize,
    pub tokens: usize,
    pub vocab: usize,
    /// Layers in graph order: cache `l` belongs to `layers[l]`.
    pub layers: Vec<Layer>,
    /// Whether the model had past key/value inputs.
    pub had_past: bool,
}

/// Names of the rewritten graph's inputs.
pub const INPUT_IDS: &str = "input_ids";
pub const POSITION_IDS: &str = "position_ids";
pub const BLOCK_TABLE: &str = "block_table";
pub const PAST_LENS: &str = "past_lens";

pub fn k_cache_name(l: usize) -> String {
    format!("k_cache_{l}")
}

pub fn v_cache_name(l: usize) -> String {
    format!("v_cache_{l}")
}

/// What one attention reads: its queries and the new tokens' keys and values, and the past
/// inputs (if any) they were concatenated to.
struct Site {
    node: NodeId,
    q: ValueId,
    k: ValueId,
    v: ValueId,
    past: Vec<ValueId>,
    scale: f32,
    layer: Layer,
}

fn fixed(g: &Graph, v: ValueId) -> Option<Vec<usize>> {
    g.value(v).ty.fixed_shape()
}

/// `x` when `v` is `reshape(expand(reshape(x)))` repeating each of `x`'s heads `rep` times in a
/// row (`[B, H, S, D] -> [B, H, 1, S, D] -> [B, H, rep, S, D] -> [B, H*rep, S, D]`: query head `h`
/// reads KV head `h / rep`, as `paged_attention` does); else `v`.
fn unrepeat(g: &Graph, v: ValueId) -> ValueId {
    let step = |v: ValueId, want: fn(&Op) -> bool| -> Option<ValueId> {
        let n = g.node(g.producer(v)?);
        want(&n.op).then_some(n.inputs[0])
    };
    let is_reshape = |o: &Op| matches!(o, Op::Layout(LayoutOp::Reshape { .. }));
    let is_expand = |o: &Op| matches!(o, Op::Layout(LayoutOp::Expand { .. }));
    let Some(e) = step(v, is_reshape) else { return v };
    let Some(r) = step(e, is_expand) else { return v };
    let Some(x) = step(r, is_reshape) else { return v };
    let (sv, se, sr, sx) = (&g.value(v).ty.shape, &g.value(e).ty.shape, &g.value(r).ty.shape, &g.value(x).ty.shape);
    let ok = sx.len() == 4
        && sr.len() == 5
        && se.len() == 5
        && sv.len() == 4
        && sr[1] == sx[1]
        && sr[2] == Dim::Fixed(1)
        && sr[4] == sx[3]
        && se[1] == sx[1]
        && se[4] == sx[3]
        && match (sx[1], se[2], sv[1]) {
            (Dim::Fixed(h), Dim::Fixed(rep), Dim::Fixed(hq)) => h * rep == hq,
            _ => false,
        };
    if ok {
        x
    } else {
        v
    }
}

/// The new tokens' keys (or values) behind an attention input, and the past input they were
/// appended to.
fn split_past(g: &Graph, v: ValueId) -> (ValueId, Option<ValueId>) {
    let x = unrepeat(g, v);
    if let Some(n) = g.producer(x) {
        let n = g.node(n);
        if let (Op::Layout(LayoutOp::Concat { axis: 2 }), [p, new]) = (&n.op, n.inputs.as_slice()) {
            if matches!(g.value(*p).def, ValueDef::Input) {
                return (*new, Some(*p));
            }
        }
    }
    (x, None)
}

fn site(g: &Graph, uses: &[tilec_ir::Uses], id: NodeId, batch: usize, tokens: usize) -> Result<Site, String> {
    let n = g.node(id);
    let Op::Nn(NnOp::Attention {
        scale,
        is_causal,
        softcap,
        left_window,
        right_window,
        has_mask,
        has_past,
        has_nonpad,
        ..
    }) = n.op
    else {
        return Err(format!("node '{}' ({}) is not an attention", n.name, n.op.name()));
    };
    let what = format!("attention '{}'", n.name);
    if has_past || has_nonpad || softcap != 0.0 || left_window >= 0 || right_window >= 0 {
        return Err(format!(
            "{what}: expected plain causal self-attention (no past inputs of the op, padding lengths, softcap or windows)"
        ));
    }
    if !is_causal && !has_mask {
        return Err(format!("{what} is neither causal nor masked: expected a decoder's causal self-attention"));
    }
    for (i, &o) in n.outputs.iter().enumerate().skip(1) {
        if !uses[o.index()].is_empty() {
            return Err(format!("{what}: its output {i} is read; only the attention output (0) can be"));
        }
    }
    let (q, k0, v0) = (n.inputs[0], n.inputs[1], n.inputs[2]);
    let (k, pk) = split_past(g, k0);
    let (v, pv) = split_past(g, v0);
    let (sq, sk, sv) = match (fixed(g, q), fixed(g, k), fixed(g, v)) {
        (Some(a), Some(b), Some(c)) if a.len() == 4 && b.len() == 4 && c.len() == 4 => (a, b, c),
        _ => {
            return Err(format!(
                "{what}: expected 4-D queries, keys and values [batch, heads, {tokens}, head_dim] with fixed sizes, got {} / {} / {}",
                g.syms.display_shape(&g.value(q).ty.shape),
                g.syms.display_shape(&g.value(k).ty.shape),
                g.syms.display_shape(&g.value(v).ty.shape)
            ))
        }
    };
    if sq[0] != batch || sq[2] != tokens || sk[0] != batch || sk[2] != tokens || sv[2] != tokens || sk[1] != sv[1] || sk[3] != sq[3] {
        return Err(format!(
            "{what}: expected queries [{batch}, Hq, {tokens}, D] and new keys/values [{batch}, Hkv, {tokens}, D], got {sq:?} / {sk:?} / {sv:?}"
        ));
    }
    if sk[1] == 0 || sq[1] % sk[1] != 0 {
        return Err(format!("{what}: {} query heads are not a multiple of {} KV heads", sq[1], sk[1]));
    }
    let past = match (pk, pv) {
        (Some(a), Some(b)) => vec![a, b],
        (None, None) => vec![],
        _ => return Err(format!("{what}: keys and values must both or neither be concatenated to past inputs")),
    };
    if has_mask {
        check_causal(g, n.inputs[3], tokens, fixed(g, k0).map(|s| s[2])).map_err(|e| format!("{what}: {e}"))?;
    }
    let layer = Layer { q_heads: sq[1], kv_heads: sk[1], head_dim: sk[3], v_head_dim: sv[3] };
    let scale = scale.unwrap_or(1.0 / (layer.head_dim as f32).sqrt());
    Ok(Site { node: id, q, k, v, past, scale, layer })
}

/// When the mask is a constant (the whole-sequence export at fixed sizes: its positions fold),
/// checks that it is the causal one, bottom-right aligned: query `i` of `sq` sees key `j` of
/// `skv` iff `j <= i + skv - sq` (bool `keep`, or additive 0 / -inf). A mask computed at run
/// time (from the past length) is taken to be causal.
fn check_causal(g: &Graph, mask: ValueId, sq: usize, skv: Option<usize>) -> Result<(), String> {
    let (Some(t), Some(skv)) = (g.const_value(mask), skv) else { return Ok(()) };
    let s = t.shape();
    let r = s.len();
    let (rows, cols) = (if r >= 2 { s[r - 2] } else { 1 }, s.last().copied().unwrap_or(0));
    if sq == 0 || cols == 0 || rows == 0 || cols != skv || (rows != 1 && rows != sq) {
        return Err(format!("its mask {s:?} does not span [{sq}, {skv}] queries by keys: expected a causal mask"));
    }
    let vals = t.to_f64_vec();
    let boolean = t.dtype() == DType::Bool;
    for (at, &x) in vals.iter().enumerate() {
        let (i, j) = ((at / cols) % rows, at % cols);
        // A mask of one row serves every query: it must suit the last one... and the first.
        let ok = |i: usize| {
            let keep = j + sq <= i + skv;
            if boolean {
                (x != 0.0) == keep
            } else {
                (keep && x == 0.0) || (!keep && x == f64::NEG_INFINITY)
            }
        };
        if !(ok(i) && (rows != 1 || ok(sq - 1))) {
            return Err(format!(
                "its constant mask is not causal (entry [{i}, {j}] is {x}): expected query i to see exactly the keys up to i"
            ));
        }
    }
    Ok(())
}

/// Finds an integer `[B, T]` input by name.
fn token_input(g: &Graph, name: &str, batch: usize, tokens: usize) -> Result<ValueId, String> {
    let names: Vec<&str> = g.inputs().iter().map(|&v| g.value(v).name.as_str()).collect();
    let v = g
        .inputs()
        .iter()
        .copied()
        .find(|&v| g.value(v).name == name)
        .ok_or_else(|| format!("no input '{name}': expected a decoder with inputs input_ids and position_ids [batch, seq] (its inputs: {})", names.join(", ")))?;
    let ty = &g.value(v).ty;
    if !ty.dtype.is_int() || fixed(g, v) != Some(vec![batch, tokens]) {
        return Err(format!(
            "input '{name}': expected integers [batch, seq] = [{batch}, {tokens}], got {} {}",
            ty.dtype,
            g.syms.display_shape(&ty.shape)
        ));
    }
    Ok(v)
}

/// Rewrites a decoder imported with batch `batch` and `tokens` new tokens per sequence over a
/// paged cache of shape `cache`. Errors say which structure was expected and not found.
pub fn paged_decoder(graph: &Graph, batch: usize, tokens: usize, cache: CacheShape) -> Result<PagedDecoder, String> {
    if cache.blocks == 0 || cache.block_size == 0 || cache.max_blocks == 0 {
        return Err(format!("cache shape {cache:?}: blocks, block size and blocks per sequence must be positive"));
    }
    if batch == 0 || tokens == 0 {
        return Err(format!("{batch} sequences of {tokens} tokens: expected at least one of each"));
    }
    let mut g = graph.clone();
    Pipeline::for_level_target_with(3, TargetKind::Cpu, false)
        .run(&mut g, &PipelineOptions::default())
        .map_err(|e| e.to_string())?;
    let ids = token_input(&g, INPUT_IDS, batch, tokens)?;
    let pos = token_input(&g, POSITION_IDS, batch, tokens)?;
    let uses = g.uses();
    let sites: Vec<Site> = g
        .node_ids()
        .filter(|&n| matches!(g.node(n).op, Op::Nn(NnOp::Attention { .. })))
        .map(|n| site(&g, &uses, n, batch, tokens))
        .collect::<Result<_, _>>()?;
    if sites.is_empty() {
        return Err(
            "no attention found: expected a decoder-only transformer whose self-attention (two matrix products around a softmax, or SDPA) tilec recognizes"
                .into(),
        );
    }
    let had_past = !sites[0].past.is_empty();
    if sites.iter().any(|s| s.past.is_empty() == had_past) {
        return Err("some attentions read past key/value inputs and others do not: expected one or the other throughout".into());
    }
    let past: Vec<ValueId> = sites.iter().flat_map(|s| s.past.iter().copied()).collect();
    for &i in g.inputs() {
        if i != ids && i != pos && !past.contains(&i) {
            return Err(format!(
                "input '{}' is neither input_ids, position_ids nor a past key/value appended to by an attention",
                g.value(i).name
            ));
        }
    }
    let logits = g
        .outputs()
        .first()
        .copied()
        .filter(|&o| {
            let t = &g.value(o).ty;
            t.dtype.is_float() && fixed(&g, o).is_some_and(|s| s.len() == 3 && s[0] == batch && s[1] == tokens)
        })
        .ok_or_else(|| format!("expected the first output to be the logits [{batch}, {tokens}, vocab]"))?;
    let vocab = fixed(&g, logits).map(|s| s[2]).unwrap_or(0);

    let i32_in = |g: &mut Graph, name: &str, shape: Vec<usize>| g.add_input(name, TensorType::fixed(DType::I32, &shape));
    let table = i32_in(&mut g, BLOCK_TABLE, vec![batch, cache.max_blocks]);
    let lens = i32_in(&mut g, PAST_LENS, vec![batch]);
    let mut caches = vec![];
    let dt = g.value(sites[0].q).ty.dtype;
    for (l, s) in sites.iter().enumerate() {
        let shape = |d: usize| TensorType::fixed(dt, &[cache.blocks, cache.block_size, s.layer.kv_heads, d]);
        let kc = g.add_input(&k_cache_name(l), shape(s.layer.head_dim));
        let vc = g.add_input(&v_cache_name(l), shape(s.layer.v_head_dim));
        let name = format!("{}/paged", g.node(s.node).name);
        let (y_name, kc_name, vc_name) = (format!("{name}.y"), format!("k_cache_out_{l}"), format!("v_cache_out_{l}"));
        let out_names = [y_name.as_str(), kc_name.as_str(), vc_name.as_str()];
        let o = g
            .add_node_named(&name, Op::Nn(NnOp::PagedAttention { scale: s.scale }), &[s.q, s.k, s.v, kc, vc, table, lens], &out_names)
            .map_err(|e| e.to_string())?;
        let y = g.node(s.node).outputs[0];
        g.replace_all_uses(y, o[0]).map_err(|e| e.to_string())?;
        caches.extend([o[1], o[2]]);
    }
    // Outputs: logits, k_cache_out_0, v_cache_out_0, k_cache_out_1, ...
    g.set_outputs(std::iter::once(logits).chain(caches).collect());
    g.cleanup().map_err(|e| e.to_string())?;
    let past: Vec<ValueId> = g.inputs().iter().copied().filter(|&v| {
        let n = &g.value(v).name;
        n != INPUT_IDS && n != POSITION_IDS && n != BLOCK_TABLE && n != PAST_LENS && !n.starts_with("k_cache_") && !n.starts_with("v_cache_")
    }).collect();
    g.remove_inputs(&past).map_err(|e| format!("the past inputs are still read after the rewrite: {e}"))?;
    tilec_ir::verify(&g).map_err(|e| e.to_string())?;
    if let Some(v) = g.value_ids().find(|&v| fixed(&g, v).is_none()) {
        return Err(format!(
            "value '{}' keeps a symbolic shape {} after the rewrite: expected every size to follow from batch and sequence",
            g.value(v).name,
            g.syms.display_shape(&g.value(v).ty.shape)
        ));
    }
    Ok(PagedDecoder { graph: g, batch, tokens, vocab, layers: sites.iter().map(|s| s.layer).collect(), had_past })
}
