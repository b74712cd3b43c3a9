//! Attention as PyTorch's dynamo exporter spells `scaled_dot_product_attention` and
//! `nn.MultiheadAttention` (built here with the IR builder): K transposed through
//! reshape -> transpose -> reshape (with GQA repetition inside), the scale split as
//! `sqrt(scale)` over Q and K, the `where(isnan(p), 0, p)` guard after the softmax,
//! boolean and additive masks (padding, causal and sliding-window masks built from iotas,
//! ALiBi-style biases), softcapping, cross-attention, MQA. Every rewrite is checked by
//! differential execution on the reference interpreter, and every test fails without
//! the recognizer feature it names.

use std::collections::BTreeMap;
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp, NnOp, NormOp, SourceOp, UnaryOp};
use tilec_ir::{verify, DType, Dim, Graph, Op, Tensor, TensorType, ValueId};

fn hist(g: &Graph) -> BTreeMap<&'static str, usize> {
    let mut h = BTreeMap::new();
    for n in g.nodes() {
        *h.entry(n.op.name()).or_insert(0) += 1;
    }
    h
}

/// Deterministic pseudo-random floats in [-2, 2) (bools: about 3 in 4 true).
fn rand_tensor(ty: &TensorType, seed: &mut u64) -> Tensor {
    let shape = ty.fixed_shape().expect("fixed shape");
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect();
    if ty.dtype == DType::Bool {
        let b: Vec<f64> = v.iter().map(|&x| if x > -1.0 { 1.0 } else { 0.0 }).collect();
        return Tensor::from_f64s(DType::Bool, shape, &b).unwrap();
    }
    Tensor::from_f64s(ty.dtype, shape, &v).unwrap()
}

fn same(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    for i in 0..x.len() {
        let ok = x[i] == y[i] || (x[i] - y[i]).abs() <= 1e-6 + 1e-4 * x[i].abs() || (x[i].is_nan() && y[i].is_nan());
        assert!(ok, "{what}: element {i}: {} before, {} after", x[i], y[i]);
    }
}

/// The attention nodes of `g`.
fn attentions(g: &Graph) -> Vec<&NnOp> {
    g.nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Nn(a @ NnOp::Attention { .. }) => Some(a),
            _ => None,
        })
        .collect()
}

/// Runs the recognition passes; checks exactly one attention came out, `gone` ops
/// vanished, and the outputs match the original graph's on random inputs (and on
/// `extra` inputs). Returns the rewritten graph.
fn check(g: &Graph, gone: &[&str], extra: &[Vec<Tensor>]) -> Graph {
    let mut h = g.clone();
    tilec_opt::recognize::run_all(&mut h).unwrap();
    verify(&h).unwrap();
    let hh = hist(&h);
    assert_eq!(attentions(&h).len(), 1, "attention not recognized; ops after: {hh:?}");
    for o in gone {
        assert!(!hh.contains_key(o), "{o} still present: {hh:?}");
    }
    let mut seed = 7;
    let ins: Vec<Tensor> = g.inputs().iter().map(|&i| rand_tensor(&g.value(i).ty, &mut seed)).collect();
    for ins in std::iter::once(&ins).chain(extra) {
        let a = tilec_ref::run(g, ins.clone()).unwrap();
        let b = tilec_ref::run(&h, ins.clone()).unwrap();
        for (x, y) in a.iter().zip(&b) {
            same(x, y, "attention");
        }
    }
    h
}

struct B {
    g: Graph,
}

fn dims(xs: &[usize]) -> Vec<Dim> {
    xs.iter().map(|&x| Dim::Fixed(x)).collect()
}

impl B {
    fn new() -> B {
        B { g: Graph::new("t") }
    }
    fn input(&mut self, name: &str, shape: &[usize]) -> ValueId {
        self.g.add_input(name, TensorType::fixed(DType::F32, shape))
    }
    fn c(&mut self, x: f32) -> ValueId {
        self.g.add_const("c", Tensor::scalar(x))
    }
    fn op(&mut self, op: Op, ins: &[ValueId]) -> ValueId {
        self.g.add(op, ins).unwrap()
    }
    fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        self.op(Op::Binary(op), &[a, b])
    }
    fn reshape(&mut self, x: ValueId, s: &[usize]) -> ValueId {
        self.op(Op::Layout(LayoutOp::Reshape { shape: dims(s) }), &[x])
    }
    fn transpose(&mut self, x: ValueId, perm: &[usize]) -> ValueId {
        self.op(Op::Layout(LayoutOp::Transpose { perm: perm.to_vec() }), &[x])
    }
    fn matmul(&mut self, a: ValueId, b: ValueId) -> ValueId {
        self.op(Op::Linalg(LinalgOp::MatMul), &[a, b])
    }
    /// `[0, 1, .., n-1]` as an i64 iota.
    fn iota(&mut self, n: usize) -> ValueId {
        let z = self.g.add_const("start", Tensor::from_i64s(DType::I64, vec![], &[0]).unwrap());
        let l = self.g.add_const("limit", Tensor::from_i64s(DType::I64, vec![], &[n as i64]).unwrap());
        let d = self.g.add_const("delta", Tensor::from_i64s(DType::I64, vec![], &[1]).unwrap());
        self.op(Op::Source(SourceOp::Range { len: Dim::Fixed(n) }), &[z, l, d])
    }
    fn done(mut self, outs: Vec<ValueId>) -> Graph {
        self.g.set_outputs(outs);
        verify(&self.g).unwrap();
        self.g
    }
}

/// How K^T reaches the QK product.
#[derive(Clone, Copy, Debug, PartialEq)]
enum KT {
    /// `transpose(k, [0, 1, 3, 2])` (the eager spelling).
    Plain,
    /// SDPA's `reshape(transpose(reshape(k, [B*H, T, D]), [0, 2, 1]), [B, H, D, T])`.
    Chain,
    /// torchvision's ViT after transpose merging: K comes as `[T, B*H, D]`, K^T is
    /// `reshape(transpose(k3, [1, 2, 0]), [B, H, D, T])`.
    Merged,
}

/// How KV heads are repeated for GQA / MQA.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rep {
    None,
    /// `reshape [B,Hkv,1,T,D] -> expand [B,Hkv,n,T,D] -> reshape [B,Hq,T,D]`.
    Expand,
    /// The same with `tile` repeats `[1, 1, n, 1, 1]`.
    Tile,
    /// MQA: `expand [B,1,T,D] -> [B,Hq,T,D]`.
    Mqa,
    /// `tile [B,Hkv,T,D]` by `[1, n, 1, 1]`: query head h reads KV head h % Hkv, not the
    /// op's h / n, so the repetition must stay.
    TileHeads,
}

/// The mask spelling.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mask {
    None,
    /// A bool input `[B, 1, 1, T]` (key padding) via `where(keep, 0, -inf)` added.
    PaddingAdditive,
    /// The same bool, `where(keep, scores, -inf)`.
    PaddingSelect,
    /// Causal, built from iotas: `where(j <= i, 0, -inf)` added.
    CausalIota,
    /// Causal from iotas with the `finfo.min` fill transformers writes, expanded over the
    /// batch (`[B, 1, S, T]`: more elements than constant matching inspects by default).
    CausalMinBatch,
    /// Causal from per-batch position ids (`[B, S]`, as transformers builds its masks):
    /// `true & (pos[b, j] <= pos[b, i])` over `[B, 1, S, T]`, `finfo.min` fill.
    CausalPositions,
    /// The same with the last batch's positions reversed: that slice is not causal.
    PositionsReversed,
    /// Sliding window of 2 behind the diagonal, causal, from iotas.
    Window,
    /// ALiBi-style: `scores + slope_h * (j - i)` with per-head slopes.
    Alibi,
    /// A float input `[B, 1, S, T]` added.
    Float,
}

struct Cfg {
    kt: KT,
    rep: Rep,
    mask: Mask,
    /// `where(isnan(p), 0, p)` after the softmax.
    guard: bool,
    /// sqrt(scale) on Q and on K^T (else the whole scale on the scores).
    split_scale: bool,
    /// `cap * tanh(scores / cap)` before the mask.
    softcap: Option<f32>,
    /// Key length (cross-attention when it differs from the query length).
    t: usize,
}

impl Default for Cfg {
    fn default() -> Cfg {
        Cfg { kt: KT::Chain, rep: Rep::None, mask: Mask::None, guard: true, split_scale: true, softcap: None, t: 6 }
    }
}

const BSZ: usize = 2;
const HQ: usize = 4;
const S: usize = 6;
const D: usize = 8;

fn build(cfg: &Cfg) -> Graph {
    let t = cfg.t;
    let hkv = match cfg.rep {
        Rep::None => HQ,
        Rep::Mqa => 1,
        _ => 2,
    };
    let n = HQ / hkv;
    let mut b = B::new();
    let q = b.input("q", &[BSZ, HQ, S, D]);
    let kin = b.input("k", &[BSZ, hkv, t, D]);
    let vin = b.input("v", &[BSZ, hkv, t, D]);
    let repeat = |b: &mut B, x: ValueId| -> ValueId {
        match cfg.rep {
            Rep::None => x,
            Rep::Expand | Rep::Tile => {
                let u = b.reshape(x, &[BSZ, hkv, 1, t, D]);
                let e = if cfg.rep == Rep::Expand {
                    b.op(Op::Layout(LayoutOp::Expand { shape: dims(&[BSZ, hkv, n, t, D]) }), &[u])
                } else {
                    b.op(Op::Layout(LayoutOp::Tile { repeats: vec![1, 1, n, 1, 1] }), &[u])
                };
                b.reshape(e, &[BSZ, HQ, t, D])
            }
            Rep::Mqa => b.op(Op::Layout(LayoutOp::Expand { shape: dims(&[BSZ, HQ, t, D]) }), &[x]),
            Rep::TileHeads => b.op(Op::Layout(LayoutOp::Tile { repeats: vec![1, n, 1, 1] }), &[x]),
        }
    };
    let k = repeat(&mut b, kin);
    let v = repeat(&mut b, vin);
    let kt = match cfg.kt {
        KT::Plain => b.transpose(k, &[0, 1, 3, 2]),
        KT::Chain => {
            let r = b.reshape(k, &[BSZ * HQ, t, D]);
            let tr = b.transpose(r, &[0, 2, 1]);
            b.reshape(tr, &[BSZ, HQ, D, t])
        }
        KT::Merged => {
            // k3 [T, B*H, D] holds K as torchvision's MHA leaves it (heads merged into
            // the batch, sequence first).
            let k3 = b.transpose(k, &[2, 0, 1, 3]);
            let k3 = b.reshape(k3, &[t, BSZ * HQ, D]);
            let tr = b.transpose(k3, &[1, 2, 0]);
            b.reshape(tr, &[BSZ, HQ, D, t])
        }
    };
    let scale = 1.0 / (D as f32).sqrt();
    let scores = if cfg.split_scale {
        let c = b.c(scale.sqrt());
        let qs = b.bin(BinaryOp::Mul, q, c);
        let c2 = b.c(scale.sqrt());
        let ks = b.bin(BinaryOp::Mul, kt, c2);
        b.matmul(qs, ks)
    } else {
        let qk = b.matmul(q, kt);
        let c = b.c(scale);
        b.bin(BinaryOp::Mul, qk, c)
    };
    let scores = match cfg.softcap {
        Some(cap) => {
            let c = b.c(cap);
            let d = b.bin(BinaryOp::Div, scores, c);
            let th = b.op(Op::Unary(UnaryOp::Tanh), &[d]);
            let c2 = b.c(cap);
            b.bin(BinaryOp::Mul, th, c2)
        }
        None => scores,
    };
    let ninf = f32::NEG_INFINITY;
    // The bool keep[i, j] of iota-built masks, [S, T].
    let iota_keep = |b: &mut B, window: Option<i64>| -> ValueId {
        let i = b.iota(S);
        let j = b.iota(t);
        let i2 = b.reshape(i, &[S, 1]);
        let j2 = b.reshape(j, &[1, t]);
        let causal = b.bin(BinaryOp::LessOrEqual, j2, i2);
        match window {
            None => causal,
            Some(w) => {
                let ww = b.g.add_const("w", Tensor::from_i64s(DType::I64, vec![], &[w]).unwrap());
                let lo = b.bin(BinaryOp::Sub, i2, ww);
                let inside = b.bin(BinaryOp::Greater, j2, lo);
                b.bin(BinaryOp::And, causal, inside)
            }
        }
    };
    let additive = |b: &mut B, keep: ValueId| -> ValueId {
        let z = b.c(0.0);
        let f = b.c(ninf);
        b.op(Op::Where, &[keep, z, f])
    };
    let masked = match cfg.mask {
        Mask::None => scores,
        Mask::PaddingAdditive | Mask::PaddingSelect => {
            let keep = b.g.add_input("keep", TensorType::fixed(DType::Bool, &[BSZ, 1, 1, t]));
            if cfg.mask == Mask::PaddingSelect {
                let f = b.c(ninf);
                b.op(Op::Where, &[keep, scores, f])
            } else {
                let m = additive(&mut b, keep);
                b.bin(BinaryOp::Add, scores, m)
            }
        }
        Mask::CausalIota | Mask::Window => {
            let keep = iota_keep(&mut b, (cfg.mask == Mask::Window).then_some(2));
            let m = additive(&mut b, keep);
            b.bin(BinaryOp::Add, scores, m)
        }
        Mask::CausalMinBatch => {
            let keep = iota_keep(&mut b, None);
            let z = b.c(0.0);
            let f = b.c(f32::MIN);
            let m = b.op(Op::Where, &[keep, z, f]);
            let m4 = b.reshape(m, &[1, 1, S, t]);
            let e = b.op(Op::Layout(LayoutOp::Expand { shape: dims(&[BSZ, 1, S, t]) }), &[m4]);
            b.bin(BinaryOp::Add, scores, e)
        }
        Mask::CausalPositions | Mask::PositionsReversed => {
            assert_eq!(S, t);
            let mut pos: Vec<i64> = (0..BSZ * S).map(|x| (x % S) as i64).collect();
            if cfg.mask == Mask::PositionsReversed {
                pos[(BSZ - 1) * S..].reverse();
            }
            let p = b.g.add_const("pos", Tensor::from_i64s(DType::I64, vec![BSZ, S], &pos).unwrap());
            let pi = b.reshape(p, &[BSZ, 1, S, 1]);
            let pj = b.reshape(p, &[BSZ, 1, 1, t]);
            let le = b.bin(BinaryOp::LessOrEqual, pj, pi);
            let yes = b.g.add_const("yes", Tensor::from_i64s(DType::Bool, vec![], &[1]).unwrap());
            let keep = b.bin(BinaryOp::And, yes, le);
            let z = b.c(0.0);
            let f = b.c(f32::MIN);
            let m = b.op(Op::Where, &[keep, z, f]);
            b.bin(BinaryOp::Add, scores, m)
        }
        Mask::Alibi => {
            let i = b.iota(S);
            let j = b.iota(t);
            let i2 = b.reshape(i, &[S, 1]);
            let j2 = b.reshape(j, &[1, t]);
            let rel = b.bin(BinaryOp::Sub, j2, i2);
            let relf = b.op(Op::Cast { to: DType::F32, saturate: true }, &[rel]);
            let slopes: Vec<f32> = (0..HQ).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
            let sl = b.g.add_const("slopes", Tensor::from_vec(vec![1, HQ, 1, 1], slopes).unwrap());
            let bias = b.bin(BinaryOp::Mul, sl, relf);
            b.bin(BinaryOp::Add, scores, bias)
        }
        Mask::Float => {
            let m = b.input("mask", &[BSZ, 1, S, t]);
            b.bin(BinaryOp::Add, scores, m)
        }
    };
    let p = b.op(Op::Norm(NormOp::Softmax { axis: 3 }), &[masked]);
    let p = if cfg.guard {
        let nan = b.op(Op::Unary(UnaryOp::IsNaN), &[p]);
        let z = b.c(0.0);
        b.op(Op::Where, &[nan, z, p])
    } else {
        p
    };
    let y = b.matmul(p, v);
    b.done(vec![y])
}

fn attn_fields(g: &Graph) -> (bool, bool, bool, usize) {
    let n = g.nodes().iter().find(|n| n.op.name() == "attention").expect("attention");
    let Op::Nn(NnOp::Attention { zero_nan_rows, has_mask, is_causal, .. }) = &n.op else { unreachable!() };
    let kv_heads = g.value(n.inputs[1]).ty.fixed_shape().unwrap()[1];
    (*zero_nan_rows, *has_mask, *is_causal, kv_heads)
}

#[test]
fn sdpa_k_transpose_chain_and_split_scale() {
    for kt in [KT::Plain, KT::Chain, KT::Merged] {
        for split_scale in [true, false] {
            let g = build(&Cfg { kt, split_scale, guard: false, ..Default::default() });
            let h = check(&g, &["softmax", "matmul"], &[]);
            let Op::Nn(NnOp::Attention { scale, .. }) = &h.nodes().iter().find(|n| n.op.name() == "attention").unwrap().op else {
                unreachable!()
            };
            let want = 1.0 / (D as f32).sqrt();
            assert!((scale.unwrap() - want).abs() < 1e-6, "{kt:?}: scale {scale:?}");
        }
    }
    // The chain is folded: no reshape or transpose is left at all.
    let h = check(&build(&Cfg { guard: false, ..Default::default() }), &["reshape", "transpose", "mul"], &[]);
    assert_eq!(h.nodes().len(), 1, "{:?}", hist(&h));
}

/// `where(isnan(p), 0, p)`: folded into the op as `zero_nan_rows`, which keeps its
/// results on rows the guard zeroes: fully masked rows and rows with a NaN or +inf logit.
#[test]
fn sdpa_isnan_guard_kept_exactly() {
    let g = build(&Cfg { mask: Mask::PaddingAdditive, ..Default::default() });
    let mut seed = 11;
    let mut ins: Vec<Tensor> = g.inputs().iter().map(|&i| rand_tensor(&g.value(i).ty, &mut seed)).collect();
    // Batch 1 masks every key: all its rows are fully masked.
    let mut keep = vec![1.0; BSZ * 6];
    keep[6..].iter_mut().for_each(|x| *x = 0.0);
    ins[3] = Tensor::from_f64s(DType::Bool, vec![BSZ, 1, 1, 6], &keep).unwrap();
    // A NaN and an +inf in Q: rows whose logits are NaN; the guard zeroes them.
    let mut qv = ins[0].to_f64_vec();
    qv[3] = f64::NAN;
    qv[D * 2 + 1] = f64::INFINITY;
    ins[0] = Tensor::from_f64s(DType::F32, vec![BSZ, HQ, S, D], &qv).unwrap();
    let h = check(&g, &["softmax", "isnan", "where"], &[ins.clone()]);
    assert_eq!(attn_fields(&h), (true, true, false, HQ));
    let out = tilec_ref::run(&h, ins).unwrap()[0].to_f64_vec();
    assert!(out.iter().all(|x| x.is_finite()), "guarded rows are zeros, not NaN");
    assert!(out[..D * 3].iter().take(D).all(|&x| x == 0.0), "row with a NaN logit");
    // Without the guard a NaN row stays NaN (the op's own semantics).
    let g = build(&Cfg { mask: Mask::PaddingAdditive, guard: false, ..Default::default() });
    let h = check(&g, &["softmax"], &[]);
    assert!(!attn_fields(&h).0);
}

#[test]
fn sdpa_isnan_guard_on_another_value_not_folded() {
    // where(isnan(scores), 0, p): not the guard (it tests the logits, not p).
    let mut b = B::new();
    let q = b.input("q", &[BSZ, HQ, S, D]);
    let k = b.input("k", &[BSZ, HQ, S, D]);
    let v = b.input("v", &[BSZ, HQ, S, D]);
    let kt = b.transpose(k, &[0, 1, 3, 2]);
    let s = b.matmul(q, kt);
    let p = b.op(Op::Norm(NormOp::Softmax { axis: 3 }), &[s]);
    let nan = b.op(Op::Unary(UnaryOp::IsNaN), &[s]);
    let z = b.c(0.0);
    let w = b.op(Op::Where, &[nan, z, p]);
    let y = b.matmul(w, v);
    let g = b.done(vec![y]);
    let mut h = g.clone();
    tilec_opt::recognize::run_all(&mut h).unwrap();
    assert!(attentions(&h).is_empty(), "{:?}", hist(&h));
}

#[test]
fn sdpa_gqa_and_mqa() {
    for kt in [KT::Plain, KT::Chain] {
        for (rep, kv) in [(Rep::Expand, 2), (Rep::Tile, 2), (Rep::Mqa, 1)] {
            let g = build(&Cfg { kt, rep, ..Default::default() });
            let h = check(&g, &["expand", "tile"], &[]);
            assert_eq!(attn_fields(&h).3, kv, "{kt:?} {rep:?}: K heads of the op");
        }
    }
    // Tiling whole head blocks pairs query head h with KV head h % Hkv: the repetition
    // stays (the op reads K with all Hq heads), the result is still exact.
    let g = build(&Cfg { rep: Rep::TileHeads, ..Default::default() });
    let h = check(&g, &["softmax"], &[]);
    assert_eq!(attn_fields(&h).3, HQ);
}

#[test]
fn sdpa_masks() {
    for (mask, bool_mask) in [
        (Mask::PaddingAdditive, true),
        (Mask::PaddingSelect, true),
        (Mask::CausalIota, true),
        (Mask::CausalMinBatch, false),
        (Mask::CausalPositions, false),
        (Mask::PositionsReversed, false),
        (Mask::Window, true),
        (Mask::Alibi, false),
        (Mask::Float, false),
    ] {
        let h = check(&build(&Cfg { mask, ..Default::default() }), &["softmax"], &[]);
        let n = h.nodes().iter().find(|n| n.op.name() == "attention").unwrap();
        if matches!(mask, Mask::CausalIota | Mask::CausalMinBatch | Mask::CausalPositions) {
            // Small enough to evaluate: the constant causal mask becomes `is_causal`.
            let (_, has_mask, is_causal, _) = attn_fields(&h);
            assert!(!has_mask && is_causal, "{mask:?}");
            continue;
        }
        assert_eq!(n.inputs.len(), 4, "{mask:?}: a mask input");
        let dt = h.value(n.inputs[3]).ty.dtype;
        assert_eq!(dt == DType::Bool, bool_mask, "{mask:?}: mask dtype {dt}");
    }
}

#[test]
fn sdpa_cross_attention() {
    for kt in [KT::Plain, KT::Chain, KT::Merged] {
        let g = build(&Cfg { kt, t: 9, mask: Mask::PaddingAdditive, ..Default::default() });
        check(&g, &["softmax"], &[]);
    }
}

#[test]
fn sdpa_softcap() {
    let g = build(&Cfg { softcap: Some(5.0), mask: Mask::CausalIota, ..Default::default() });
    let h = check(&g, &["tanh", "softmax"], &[]);
    let n = h.nodes().iter().find(|n| n.op.name() == "attention").unwrap();
    let Op::Nn(NnOp::Attention { softcap, .. }) = &n.op else { unreachable!() };
    assert_eq!(*softcap, 5.0);
}
