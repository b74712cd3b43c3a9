//! Composite-op recognition: hand-built exporter spellings, the ONNX `_expanded` node
//! tests, and (when present) the exported transformer models. Every rewrite is checked
//! by differential execution on the reference interpreter.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tilec_ir::op::{BinaryOp, NormOp, ReduceKind, ReduceOp, UnaryOp};
use tilec_ir::{verify, DType, Graph, Op, Tensor, TensorType, ValueId};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn hist(g: &Graph) -> BTreeMap<&'static str, usize> {
    let mut h = BTreeMap::new();
    for n in g.nodes() {
        *h.entry(n.op.name()).or_insert(0) += 1;
    }
    h
}

/// Deterministic pseudo-random floats in [-2, 2).
fn rand_tensor(ty: &TensorType, seed: &mut u64) -> Tensor {
    let shape = ty.fixed_shape().expect("fixed shape");
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0
        })
        .collect();
    Tensor::from_f64s(ty.dtype, shape, &v).unwrap()
}

fn assert_close(a: &Tensor, b: &Tensor, rtol: f64, atol: f64, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
    for i in 0..x.len() {
        let ok = x[i] == y[i]
            || (x[i] - y[i]).abs() <= atol + rtol * x[i].abs()
            || (x[i].is_nan() && y[i].is_nan());
        assert!(ok, "{what}: element {i}: {} vs {}", x[i], y[i]);
    }
}

/// Runs the recognition passes; checks the graph verifies, `want` appears, `gone` ops
/// vanished, and outputs match the original graph's on random inputs.
fn check(g: &Graph, want: &str, gone: &[&str]) -> Graph {
    let mut h = g.clone();
    tilec_opt::recognize::run_all(&mut h).unwrap();
    verify(&h).unwrap();
    let hh = hist(&h);
    assert!(
        hh.contains_key(want),
        "{want} not recognized; ops after: {hh:?}"
    );
    for o in gone {
        assert!(!hh.contains_key(o), "{o} still present: {hh:?}");
    }
    let mut seed = 7;
    let ins: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&i| rand_tensor(&g.value(i).ty, &mut seed))
        .collect();
    let a = tilec_ref::run(g, ins.clone()).unwrap();
    let b = tilec_ref::run(&h, ins).unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert_close(x, y, 1e-4, 1e-6, want);
    }
    h
}

/// Runs the passes and asserts nothing changed.
fn check_unchanged(g: &Graph) {
    let mut h = g.clone();
    tilec_opt::recognize::run_all(&mut h).unwrap();
    verify(&h).unwrap();
    assert_eq!(hist(g), hist(&h), "graph was rewritten");
}

struct B {
    g: Graph,
}

impl B {
    fn new(shape: &[usize]) -> (B, ValueId) {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::fixed(DType::F32, shape));
        (B { g }, x)
    }
    fn input(&mut self, name: &str, shape: &[usize]) -> ValueId {
        self.g.add_input(name, TensorType::fixed(DType::F32, shape))
    }
    fn c(&mut self, x: f32) -> ValueId {
        self.g.add_const("c", Tensor::scalar(x))
    }
    fn un(&mut self, op: UnaryOp, a: ValueId) -> ValueId {
        self.g.add(Op::Unary(op), &[a]).unwrap()
    }
    fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        self.g.add(Op::Binary(op), &[a, b]).unwrap()
    }
    fn mul(&mut self, a: ValueId, b: ValueId) -> ValueId {
        self.bin(BinaryOp::Mul, a, b)
    }
    fn add(&mut self, a: ValueId, b: ValueId) -> ValueId {
        self.bin(BinaryOp::Add, a, b)
    }
    fn red(&mut self, kind: ReduceKind, axes: Vec<usize>, a: ValueId) -> ValueId {
        self.g
            .add(
                Op::Reduce(ReduceOp::Reduce {
                    kind,
                    axes,
                    keepdims: true,
                }),
                &[a],
            )
            .unwrap()
    }
    fn done(mut self, outs: Vec<ValueId>) -> Graph {
        self.g.set_outputs(outs);
        verify(&self.g).unwrap();
        self.g
    }
}

/// GELU erf form, `x * 0.5 * (1 + erf(x * k))` or with Div by `d`.
fn gelu_erf(half: f32, div: Option<f32>, mul: Option<f32>) -> Graph {
    let (mut b, x) = B::new(&[4, 8]);
    let arg = match (div, mul) {
        (Some(d), _) => {
            let c = b.c(d);
            b.bin(BinaryOp::Div, x, c)
        }
        (_, Some(k)) => {
            let c = b.c(k);
            b.mul(x, c)
        }
        _ => unreachable!(),
    };
    let e = b.un(UnaryOp::Erf, arg);
    let one = b.c(1.0);
    let phi = b.add(e, one);
    let xp = b.mul(x, phi);
    let h = b.c(half);
    let y = b.mul(xp, h);
    b.done(vec![y])
}

#[test]
fn gelu_erf_variants() {
    let h = check(
        &gelu_erf(0.5, Some(std::f32::consts::SQRT_2), None),
        "gelu",
        &["erf", "mul"],
    );
    assert_eq!(h.nodes().len(), 1);
    check(&gelu_erf(0.5, Some(1.4142), None), "gelu", &["erf"]);
    check(&gelu_erf(0.5, None, Some(0.7071)), "gelu", &["erf"]);
}

#[test]
fn gelu_near_miss_not_rewritten() {
    check_unchanged(&gelu_erf(0.6, Some(std::f32::consts::SQRT_2), None));
    check_unchanged(&gelu_erf(0.5, Some(2.0), None));
    // The erf intermediate is also a graph output.
    let mut g = gelu_erf(0.5, Some(std::f32::consts::SQRT_2), None);
    let erf = g
        .nodes()
        .iter()
        .find(|n| n.op == Op::Unary(UnaryOp::Erf))
        .unwrap()
        .outputs[0];
    let mut outs = g.outputs().to_vec();
    outs.push(erf);
    g.set_outputs(outs);
    check_unchanged(&g);
}

fn gelu_tanh(pow: bool) -> Graph {
    let (mut b, x) = B::new(&[3, 16]);
    let cube = if pow {
        let three = b.c(3.0);
        b.bin(BinaryOp::Pow, x, three)
    } else {
        let x2 = b.mul(x, x);
        b.mul(x2, x)
    };
    let c0 = b.c(0.044715);
    let t = b.mul(cube, c0);
    let inner = b.add(x, t);
    let k = b.c((2.0f32 / std::f32::consts::PI).sqrt());
    let arg = b.mul(inner, k);
    let th = b.un(UnaryOp::Tanh, arg);
    let one = b.c(1.0);
    let phi = b.add(th, one);
    let half = b.c(0.5);
    let hx = b.mul(x, half);
    let y = b.mul(hx, phi);
    b.done(vec![y])
}

#[test]
fn gelu_tanh_forms() {
    let h = check(&gelu_tanh(true), "gelu", &["tanh", "pow"]);
    assert!(matches!(
        h.nodes()[0].op,
        Op::Unary(UnaryOp::Gelu { tanh_approx: true })
    ));
    check(&gelu_tanh(false), "gelu", &["tanh", "mul"]);
}

#[test]
fn silu_and_swiglu() {
    let (mut b, x) = B::new(&[2, 8]);
    let up = b.input("up", &[2, 8]);
    let s = b.un(UnaryOp::Sigmoid, x);
    let silu = b.mul(x, s);
    let y = b.mul(silu, up);
    let g = b.done(vec![y]);
    let h = check(&g, "swiglu", &["sigmoid", "mul"]);
    assert_eq!(h.nodes().len(), 1);
    // Different shapes (broadcasting): SiLU only.
    let (mut b, x) = B::new(&[2, 8]);
    let up = b.input("up", &[8]);
    let s = b.un(UnaryOp::Sigmoid, x);
    let silu = b.mul(s, x);
    let y = b.mul(silu, up);
    check(&b.done(vec![y]), "swish", &["sigmoid"]);
    // sigmoid(x) * y is no SiLU.
    let (mut b, x) = B::new(&[2, 8]);
    let z = b.input("z", &[2, 8]);
    let s = b.un(UnaryOp::Sigmoid, x);
    let y = b.mul(s, z);
    check_unchanged(&b.done(vec![y]));
}

/// PyTorch-style layer norm over the last `naxes` axes, optional gamma/beta.
fn layer_norm(pow: bool, recip: bool, affine: bool, eps: f32) -> Graph {
    let (mut b, x) = B::new(&[2, 3, 8]);
    let mean = b.red(ReduceKind::Mean, vec![2], x);
    let d = b.bin(BinaryOp::Sub, x, mean);
    let sq = if pow {
        let two = b.c(2.0);
        b.bin(BinaryOp::Pow, d, two)
    } else {
        b.mul(d, d)
    };
    let var = b.red(ReduceKind::Mean, vec![2], sq);
    let e = b.c(eps);
    let ve = b.add(var, e);
    let sd = b.un(UnaryOp::Sqrt, ve);
    let n = if recip {
        let r = b.un(UnaryOp::Reciprocal, sd);
        b.mul(d, r)
    } else {
        b.bin(BinaryOp::Div, d, sd)
    };
    let y = if affine {
        let gamma = b.input("gamma", &[8]);
        let beta = b.input("beta", &[8]);
        let s = b.mul(n, gamma);
        b.add(s, beta)
    } else {
        n
    };
    b.done(vec![y])
}

#[test]
fn layer_norm_forms() {
    let h = check(
        &layer_norm(true, false, true, 1e-5),
        "layer_norm",
        &["reduce_mean", "sqrt", "add"],
    );
    assert_eq!(h.nodes().len(), 1);
    match &h.nodes()[0].op {
        Op::Norm(NormOp::LayerNorm {
            axis: 2,
            epsilon,
            has_bias: true,
            ..
        }) => assert!((epsilon - 1e-5).abs() < 1e-9),
        o => panic!("{o:?}"),
    }
    check(
        &layer_norm(false, true, true, 1e-12),
        "layer_norm",
        &["reduce_mean", "reciprocal"],
    );
    check(
        &layer_norm(true, false, false, 1e-5),
        "layer_norm",
        &["reduce_mean"],
    );
}

#[test]
fn layer_norm_shared_intermediate_not_rewritten() {
    let mut g = layer_norm(true, false, true, 1e-5);
    let mean = g.nodes()[0].outputs[0];
    let mut outs = g.outputs().to_vec();
    outs.push(mean);
    g.set_outputs(outs);
    check_unchanged(&g);
}

/// LLaMA-style RMSNorm: `gamma * (x * reciprocal(sqrt(mean(x^2) + eps)))`, optionally
/// computed in f32 for an f16 input.
fn rms_norm(div: bool, cast: bool, gamma: bool) -> Graph {
    let mut g = Graph::new("t");
    let dt = if cast { DType::F16 } else { DType::F32 };
    let x = g.add_input("x", TensorType::fixed(dt, &[2, 5, 16]));
    let mut b = B { g };
    let xf = if cast {
        b.g.add(
            Op::Cast {
                to: DType::F32,
                saturate: true,
            },
            &[x],
        )
        .unwrap()
    } else {
        x
    };
    let two = b.c(2.0);
    let sq = b.bin(BinaryOp::Pow, xf, two);
    let ms = b.red(ReduceKind::Mean, vec![2], sq);
    let e = b.c(1e-6);
    let s = b.add(ms, e);
    let r = b.un(UnaryOp::Sqrt, s);
    let n = if div {
        b.bin(BinaryOp::Div, xf, r)
    } else {
        let inv = b.un(UnaryOp::Reciprocal, r);
        b.mul(xf, inv)
    };
    let n = if cast {
        b.g.add(
            Op::Cast {
                to: DType::F16,
                saturate: true,
            },
            &[n],
        )
        .unwrap()
    } else {
        n
    };
    let y = if gamma {
        let w = b.g.add_input("w", TensorType::fixed(dt, &[16]));
        b.mul(w, n)
    } else {
        n
    };
    b.done(vec![y])
}

#[test]
fn rms_norm_forms() {
    let h = check(
        &rms_norm(false, false, true),
        "rms_norm",
        &["reduce_mean", "sqrt", "reciprocal", "mul"],
    );
    assert_eq!(h.nodes().len(), 1);
    check(
        &rms_norm(true, false, true),
        "rms_norm",
        &["reduce_mean", "div"],
    );
    check(&rms_norm(true, false, false), "rms_norm", &["reduce_mean"]);
    // f16 in, f32 compute, cast back: compare with f16 tolerance.
    let g = rms_norm(false, true, true);
    let mut h = g.clone();
    tilec_opt::recognize::run_all(&mut h).unwrap();
    verify(&h).unwrap();
    assert!(hist(&h).contains_key("rms_norm"), "{:?}", hist(&h));
    assert!(!hist(&h).contains_key("cast"));
    let mut seed = 3;
    let ins: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&i| rand_tensor(&g.value(i).ty, &mut seed))
        .collect();
    let a = tilec_ref::run(&g, ins.clone()).unwrap();
    let c = tilec_ref::run(&h, ins).unwrap();
    assert_close(&a[0], &c[0], 2e-3, 2e-3, "rms f16");
}

#[test]
fn rms_norm_wrong_exponent_not_rewritten() {
    let mut g = rms_norm(true, false, true);
    // Replace the Pow exponent 2 by 3.
    let pow = g
        .nodes()
        .iter()
        .find(|n| n.op == Op::Binary(BinaryOp::Pow))
        .unwrap()
        .inputs[1];
    if let tilec_ir::ValueDef::Const(t) = &mut g.value_mut(pow).def {
        *t = Tensor::scalar(3.0f32);
    }
    check_unchanged(&g);
}

fn softmax(stable: bool, axis: usize) -> Graph {
    let (mut b, x) = B::new(&[3, 4, 5]);
    let z = if stable {
        let m = b.red(ReduceKind::Max, vec![axis], x);
        b.bin(BinaryOp::Sub, x, m)
    } else {
        x
    };
    let e = b.un(UnaryOp::Exp, z);
    let s = b.red(ReduceKind::Sum, vec![axis], e);
    let y = b.bin(BinaryOp::Div, e, s);
    b.done(vec![y])
}

#[test]
fn softmax_forms() {
    let h = check(
        &softmax(true, 2),
        "softmax",
        &["exp", "reduce_sum", "reduce_max"],
    );
    assert_eq!(h.nodes().len(), 1);
    let h = check(&softmax(false, 1), "softmax", &["exp"]);
    assert_eq!(h.nodes()[0].op, Op::Norm(NormOp::Softmax { axis: 1 }));
    // Sum over a different axis than the max: still a softmax of x - max (over the sum
    // axis), so only the exp/sum/div part may become a softmax.
    let (mut b, x) = B::new(&[3, 4, 5]);
    let e = b.un(UnaryOp::Exp, x);
    let s = b.red(ReduceKind::Sum, vec![1, 2], e);
    let y = b.bin(BinaryOp::Div, e, s);
    check_unchanged(&b.done(vec![y]));
}

/// `softmax(q @ k^T * scale + mask) @ v` with optional GQA repetition of K/V.
fn attention(gqa: bool, mask: bool) -> Graph {
    use tilec_ir::op::{LayoutOp, LinalgOp};
    use tilec_ir::Dim;
    let (bsz, hq, s, d) = (2, 4, 6, 8);
    let hkv = if gqa { 2 } else { 4 };
    let (mut b, q) = B::new(&[bsz, hq, s, d]);
    let mut k = b.input("k", &[bsz, hkv, s, d]);
    let mut v = b.input("v", &[bsz, hkv, s, d]);
    if gqa {
        let n = hq / hkv;
        let rep = |b: &mut B, t: ValueId| {
            let f = |xs: &[usize]| xs.iter().map(|&x| Dim::Fixed(x)).collect::<Vec<_>>();
            let u =
                b.g.add(
                    Op::Layout(LayoutOp::Reshape {
                        shape: f(&[bsz, hkv, 1, s, d]),
                    }),
                    &[t],
                )
                .unwrap();
            let e =
                b.g.add(
                    Op::Layout(LayoutOp::Expand {
                        shape: f(&[bsz, hkv, n, s, d]),
                    }),
                    &[u],
                )
                .unwrap();
            b.g.add(
                Op::Layout(LayoutOp::Reshape {
                    shape: f(&[bsz, hq, s, d]),
                }),
                &[e],
            )
            .unwrap()
        };
        k = rep(&mut b, k);
        v = rep(&mut b, v);
    }
    let kt =
        b.g.add(
            Op::Layout(LayoutOp::Transpose {
                perm: vec![0, 1, 3, 2],
            }),
            &[k],
        )
        .unwrap();
    let qk = b.g.add(Op::Linalg(LinalgOp::MatMul), &[q, kt]).unwrap();
    let sc = b.c(1.0 / (d as f32).sqrt());
    let mut sco = b.mul(qk, sc);
    if mask {
        let m = b.input("mask", &[1, 1, s, s]);
        sco = b.add(sco, m);
    }
    let p =
        b.g.add(Op::Norm(NormOp::Softmax { axis: 3 }), &[sco])
            .unwrap();
    let y = b.g.add(Op::Linalg(LinalgOp::MatMul), &[p, v]).unwrap();
    b.done(vec![y])
}

#[test]
fn attention_forms() {
    let h = check(&attention(false, true), "attention", &["softmax", "matmul"]);
    assert_eq!(h.nodes().len(), 1);
    check(&attention(true, true), "attention", &["softmax", "expand"]);
    check(&attention(true, false), "attention", &["softmax"]);
}

/// `softmax((q @ k^T * scale + bias) + mask) @ v`: a relative position bias `[1, H, S, S]`
/// and a padding mask `[B, 1, 1, mask_last]` (MPNet's and T5's form), the terms in either
/// order.
fn attention_biased(swap: bool, mask_last: usize) -> Graph {
    use tilec_ir::op::{LayoutOp, LinalgOp};
    let (bsz, h, s, d) = (2, 4, 6, 8);
    let (mut b, q) = B::new(&[bsz, h, s, d]);
    let k = b.input("k", &[bsz, h, s, d]);
    let v = b.input("v", &[bsz, h, s, d]);
    let bias = b.input("bias", &[1, h, s, s]);
    let mask = b.input("mask", &[bsz, 1, 1, mask_last]);
    let kt = b.g.add(Op::Layout(LayoutOp::Transpose { perm: vec![0, 1, 3, 2] }), &[k]).unwrap();
    let qk = b.g.add(Op::Linalg(LinalgOp::MatMul), &[q, kt]).unwrap();
    let sc = b.c(1.0 / (d as f32).sqrt());
    let sco = b.mul(qk, sc);
    let sco = if swap { b.add(bias, sco) } else { b.add(sco, bias) };
    let sco = if swap { b.add(mask, sco) } else { b.add(sco, mask) };
    let p = b.g.add(Op::Norm(NormOp::Softmax { axis: 3 }), &[sco]).unwrap();
    let y = b.g.add(Op::Linalg(LinalgOp::MatMul), &[p, v]).unwrap();
    b.done(vec![y])
}

#[test]
fn attention_with_a_bias_and_a_mask() {
    for swap in [false, true] {
        let h = check(&attention_biased(swap, 6), "attention", &["softmax", "matmul"]);
        // The two terms summed once, in front of the op.
        assert_eq!(hist(&h).get("add"), Some(&1), "{:?}", hist(&h));
    }
    // A mask broadcast along the keys is not a mask the op takes.
    check_unchanged(&attention_biased(false, 1));
}

/// How [`attention_masked`] masks the scores with the bool `keep = mask_in > -1` (about
/// 3 in 4 kept; with the fixed seed no row is masked entirely).
#[derive(Clone, Copy, Debug)]
enum BoolMask {
    /// `where(keep, scores, fill)`.
    Select { fill: f32 },
    /// `where(keep, fill, scores)` (kept positions replaced: not a mask).
    SelectInverted,
    /// `scores + where(keep, zero, fill)`.
    Additive { zero: f32, fill: f32 },
}

/// `softmax(masked(q @ k^T * scale)) @ v` with a bool mask of shape `mshape`.
fn attention_masked(mask: BoolMask, mshape: &[usize]) -> Graph {
    use tilec_ir::op::{LayoutOp, LinalgOp};
    let (bsz, h, s, d) = (2, 2, 6, 4);
    let (mut b, q) = B::new(&[bsz, h, s, d]);
    let k = b.input("k", &[bsz, h, s, d]);
    let v = b.input("v", &[bsz, h, s, d]);
    let mf = b.input("mask_in", mshape);
    let kt =
        b.g.add(
            Op::Layout(LayoutOp::Transpose {
                perm: vec![0, 1, 3, 2],
            }),
            &[k],
        )
        .unwrap();
    let qk = b.g.add(Op::Linalg(LinalgOp::MatMul), &[q, kt]).unwrap();
    let sc = b.c(1.0 / (d as f32).sqrt());
    let sco = b.mul(qk, sc);
    let thr = b.c(-1.0);
    let keep = b.bin(BinaryOp::Greater, mf, thr);
    let masked = match mask {
        BoolMask::Select { fill } => {
            let f = b.c(fill);
            b.g.add(Op::Where, &[keep, sco, f]).unwrap()
        }
        BoolMask::SelectInverted => {
            let f = b.c(f32::NEG_INFINITY);
            b.g.add(Op::Where, &[keep, f, sco]).unwrap()
        }
        BoolMask::Additive { zero, fill } => {
            let (z, f) = (b.c(zero), b.c(fill));
            let add = b.g.add(Op::Where, &[keep, z, f]).unwrap();
            b.add(sco, add)
        }
    };
    let p =
        b.g.add(Op::Norm(NormOp::Softmax { axis: 3 }), &[masked])
            .unwrap();
    let y = b.g.add(Op::Linalg(LinalgOp::MatMul), &[p, v]).unwrap();
    b.done(vec![y])
}

/// The bool input of the rewritten Attention node, if it has one.
fn attention_mask_dtype(h: &Graph) -> Option<DType> {
    let n = h.nodes().iter().find(|n| n.op.name() == "attention")?;
    n.inputs.get(3).map(|&m| h.value(m).ty.dtype)
}

#[test]
fn attention_bool_masks() {
    let inf = f32::NEG_INFINITY;
    for mshape in [&[1, 1, 6, 6][..], &[2, 1, 1, 6], &[6]] {
        // where(keep, scores, -inf): the op's own bool-mask semantics.
        let h = check(
            &attention_masked(BoolMask::Select { fill: inf }, mshape),
            "attention",
            &["softmax", "where"],
        );
        assert_eq!(attention_mask_dtype(&h), Some(DType::Bool), "{mshape:?}");
        // scores + where(keep, 0, -inf): the same mask, passed as bool.
        let h = check(
            &attention_masked(
                BoolMask::Additive {
                    zero: 0.0,
                    fill: inf,
                },
                mshape,
            ),
            "attention",
            &["softmax", "where"],
        );
        assert_eq!(attention_mask_dtype(&h), Some(DType::Bool), "{mshape:?}");
        // A finite additive fill is still an exact additive float mask.
        let h = check(
            &attention_masked(
                BoolMask::Additive {
                    zero: 0.0,
                    fill: -1e9,
                },
                mshape,
            ),
            "attention",
            &["softmax"],
        );
        assert_eq!(attention_mask_dtype(&h), Some(DType::F32), "{mshape:?}");
    }
}

#[test]
fn attention_bool_mask_near_misses_not_rewritten() {
    // Finite fills differ from -inf on fully masked rows; 0 is no mask at all.
    for fill in [0.0, -1e9, f32::MIN, -3.4e38] {
        check_unchanged(&attention_masked(BoolMask::Select { fill }, &[1, 1, 6, 6]));
    }
    check_unchanged(&attention_masked(BoolMask::SelectInverted, &[1, 1, 6, 6]));
    // A mask broadcast along keys: the op would pad it with -inf instead.
    let inf = f32::NEG_INFINITY;
    check_unchanged(&attention_masked(
        BoolMask::Select { fill: inf },
        &[1, 1, 6, 1],
    ));
    check_unchanged(&attention_masked(
        BoolMask::Additive {
            zero: 0.0,
            fill: inf,
        },
        &[1, 1, 6, 1],
    ));
}

/// Where the rewrite differs, documented: a row masked entirely is NaN before, zeros after.
#[test]
fn attention_bool_mask_fully_masked_row() {
    let g = attention_masked(
        BoolMask::Select {
            fill: f32::NEG_INFINITY,
        },
        &[1, 1, 6, 6],
    );
    let mut h = g.clone();
    tilec_opt::recognize::run_all(&mut h).unwrap();
    assert!(hist(&h).contains_key("attention"));
    let mut seed = 3;
    let mut ins: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&i| rand_tensor(&g.value(i).ty, &mut seed))
        .collect();
    // mask_in: row 2 all below the threshold, the rest kept.
    let mut m = vec![1.0f64; 36];
    m[12..18].iter_mut().for_each(|x| *x = -2.0);
    ins[3] = Tensor::from_f64s(DType::F32, vec![1, 1, 6, 6], &m).unwrap();
    let a = tilec_ref::run(&g, ins.clone()).unwrap()[0].to_f64_vec();
    let b = tilec_ref::run(&h, ins).unwrap()[0].to_f64_vec();
    // [2, 2, 6, 4]: element (b, h, i=2, d) at ((b*2+h)*6+2)*4+d.
    for i in 0..a.len() {
        let row = (i / 4) % 6;
        if row == 2 {
            assert!(
                a[i].is_nan() && b[i] == 0.0,
                "element {i}: {} vs {}",
                a[i],
                b[i]
            );
        } else {
            assert!(
                (a[i] - b[i]).abs() <= 1e-6 + 1e-4 * a[i].abs(),
                "element {i}"
            );
        }
    }
}

// ---- ONNX `_expanded` node tests: what exporters produce for the composite ops ----

fn load_pbs(dir: &Path, prefix: &str) -> Vec<Tensor> {
    let mut out = Vec::new();
    for i in 0.. {
        let p = dir.join(format!("{prefix}_{i}.pb"));
        if !p.exists() {
            break;
        }
        let tp = tilec_onnx::load::load_tensor_pb(&p).unwrap();
        out.push(tilec_onnx::tensor::tensor_from_proto(&tp).unwrap());
    }
    out
}

/// Imports a model dir, runs the passes, checks `want` was recognized and outputs match
/// the expected test data (and the un-rewritten graph). Returns (before, after) histograms.
fn check_model_dir(
    dir: &Path,
    want: &[&str],
    opts: &tilec_onnx::ImportOptions,
    rtol: f64,
    atol: f64,
) -> (String, String) {
    let g = tilec_onnx::import_file(&dir.join("model.onnx"), opts).unwrap();
    let mut h = g.clone();
    tilec_opt::recognize::run_all(&mut h).unwrap();
    verify(&h).unwrap();
    let hh = hist(&h);
    for w in want {
        assert!(
            hh.contains_key(w),
            "{}: {w} not recognized: {hh:?}",
            dir.display()
        );
    }
    let set = dir.join("test_data_set_0");
    let ins = load_pbs(&set, "input");
    let exp = load_pbs(&set, "output");
    let got = tilec_ref::run(&h, ins).unwrap();
    for (k, e) in exp.iter().enumerate() {
        assert_close(
            e,
            &got[k],
            rtol,
            atol,
            &format!("{} output {k}", dir.display()),
        );
    }
    (format!("{:?}", hist(&g)), format!("{hh:?}"))
}

#[test]
fn onnx_expanded_node_tests() {
    let node = root().join("testdata/gen/node");
    if !node.exists() {
        return;
    }
    let cases: &[(&str, &str)] = &[
        ("test_gelu_default_1_expanded", "gelu"),
        ("test_gelu_default_2_expanded", "gelu"),
        ("test_gelu_tanh_1_expanded", "gelu"),
        ("test_gelu_tanh_2_expanded", "gelu"),
        ("test_swish_expanded", "swish"),
        ("test_softmax_axis_0_expanded", "softmax"),
        ("test_softmax_axis_1_expanded", "softmax"),
        ("test_softmax_axis_2_expanded", "softmax"),
        ("test_softmax_default_axis_expanded", "softmax"),
        ("test_softmax_example_expanded", "softmax"),
        ("test_softmax_large_number_expanded", "softmax"),
        ("test_softmax_negative_axis_expanded", "softmax"),
        (
            "test_rms_normalization_2d_axis_negative_1_expanded",
            "rms_norm",
        ),
        (
            "test_rms_normalization_3d_axis2_epsilon_expanded",
            "rms_norm",
        ),
        (
            "test_rms_normalization_3d_axis1_epsilon_expanded",
            "rms_norm",
        ),
        (
            "test_rms_normalization_4d_axis_negative_1_expanded",
            "rms_norm",
        ),
        ("test_rms_normalization_default_axis_expanded", "rms_norm"),
    ];
    let mut failures = vec![];
    for (t, want) in cases {
        let dir = node.join(t);
        if !dir.exists() {
            continue;
        }
        let r = std::panic::catch_unwind(|| {
            check_model_dir(&dir, &[want], &Default::default(), 1e-4, 1e-6)
        });
        match r {
            Ok((a, b)) => println!("{t}: {a} -> {b}"),
            Err(_) => failures.push(*t),
        }
    }
    assert!(failures.is_empty(), "failed: {failures:?}");
}

#[test]
fn transformer_models() {
    for (name, want) in [
        ("gpt2", &["gelu", "attention"][..]),
        ("bert", &["attention"][..]),
        ("llama", &["rms_norm", "swiglu", "attention"][..]),
    ] {
        let dir = root().join("models").join(name);
        if !dir.join("model.onnx").exists() {
            continue;
        }
        let mut opts = tilec_onnx::ImportOptions::default();
        opts.dim_values.insert("batch".into(), 2);
        opts.dim_values.insert("seq".into(), 64);
        let (a, b) = check_model_dir(&dir, want, &opts, 1e-3, 1e-4);
        println!("{name}: before {a}\n{name}: after  {b}");
    }
}

// ---- ONNX Attention `_expanded` tests through the -O3 pipeline ----

/// The number of Attention ops in `g`.
fn attention_ops(g: &Graph) -> usize {
    g.nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::Nn(tilec_ir::op::NnOp::Attention { .. })))
        .count()
}

/// The expanded spelling of ONNX's Attention function (what the `_expanded` node tests
/// hold) turns back into one Attention op at -O3, unless an intermediate (the QK product,
/// the logits or the probabilities, for `qk_matmul_output_mode`) is itself a graph output:
/// the rewrite would then have to keep the primitives anyway. Every case must still
/// reproduce the test's expected outputs and the unoptimized graph on random inputs.
#[test]
fn onnx_attention_expanded_tests_at_o3() {
    use tilec_ir::op::{LayoutOp, NnOp};
    let node = root().join("testdata/gen/node");
    let Ok(rd) = std::fs::read_dir(&node) else {
        return;
    };
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("test_attention_") && n.ends_with("_expanded"))
        .collect();
    names.sort();
    let (mut recognized, mut escaped, mut failures) = (0, 0, vec![]);
    for t in &names {
        let dir = node.join(t);
        let g = tilec_onnx::import_file(&dir.join("model.onnx"), &Default::default())
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        // Outputs besides Y that are not the present key/value concats: intermediates.
        let intermediate_out = g.outputs()[1..].iter().any(|&o| {
            !g.producer(o)
                .is_some_and(|p| matches!(g.node(p).op, Op::Layout(LayoutOp::Concat { .. })))
        });
        let mut h = g.clone();
        tilec_opt::manager::Pipeline::for_level(3)
            .run(&mut h, &Default::default())
            .unwrap_or_else(|e| panic!("{t}: {e}"));
        verify(&h).unwrap();
        let n = attention_ops(&h);
        let attrs: Vec<String> = h
            .nodes()
            .iter()
            .filter_map(|n| match &n.op {
                Op::Nn(a @ NnOp::Attention { .. }) => {
                    Some(tilec_ir::Op::Nn(a.clone()).attrs_string())
                }
                _ => None,
            })
            .collect();
        println!("{t}: {n} attention {attrs:?}; {:?}", hist(&h));
        let hh = hist(&h);
        if intermediate_out {
            escaped += 1;
            if n != 0 {
                failures.push(format!(
                    "{t}: rewritten although an intermediate is an output"
                ));
            }
        } else if n == 1 && !hh.contains_key("softmax") && hh.get("matmul").is_none() {
            recognized += 1;
        } else {
            failures.push(format!("{t}: not recognized: {hh:?}"));
        }
        // Expected outputs of the test.
        let set = dir.join("test_data_set_0");
        let ins = load_pbs(&set, "input");
        let exp = load_pbs(&set, "output");
        let got = tilec_ref::run(&h, ins.clone()).unwrap_or_else(|e| panic!("{t}: {e}"));
        for (k, e) in exp.iter().enumerate() {
            let (rtol, atol) = match e.dtype() {
                DType::F16 | DType::BF16 => (2e-2, 2e-2),
                _ => (1e-4, 1e-5),
            };
            assert_close(e, &got[k], rtol, atol, &format!("{t} output {k}"));
        }
        // Fresh random inputs (bool masks included: fully masked rows give 0 both ways).
        let mut seed = t.len() as u64 * 977;
        let rnd: Vec<Tensor> = ins
            .iter()
            .map(|x| {
                let ty = TensorType::new(
                    x.dtype(),
                    x.shape().iter().map(|&d| tilec_ir::Dim::Fixed(d)).collect(),
                );
                if x.dtype() == DType::Bool {
                    let v: Vec<bool> =
                        rand_tensor(&TensorType::new(DType::F32, ty.shape.clone()), &mut seed)
                            .to_f64_vec()
                            .iter()
                            .map(|&f| f > -1.0)
                            .collect();
                    Tensor::from_vec(x.shape().to_vec(), v).unwrap()
                } else if x.dtype().is_float() {
                    rand_tensor(&ty, &mut seed)
                } else {
                    x.clone()
                }
            })
            .collect();
        let a = tilec_ref::run(&g, rnd.clone()).unwrap();
        let b = tilec_ref::run(&h, rnd).unwrap();
        for (k, (x, y)) in a.iter().zip(&b).enumerate() {
            let (rtol, atol) = match x.dtype() {
                DType::F16 | DType::BF16 => (2e-2, 2e-2),
                _ => (1e-4, 1e-5),
            };
            assert_close(x, y, rtol, atol, &format!("{t} random output {k}"));
        }
    }
    println!(
        "attention _expanded tests: {} in all, {recognized} recognized, {escaped} with an intermediate output (kept)",
        names.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// PyTorch's export of `nn.GroupNorm(groups, C)` over `x: [N, C, *S]`: reshape to
/// `[N, G, -1]`, instance norm with unit scale and zero bias, reshape back, `* gamma +
/// beta` with `gamma`, `beta` shaped `[C, 1, ..]`.
fn group_norm_export(xs: &[usize], groups: usize, unit: f32, seed: u64) -> Graph {
    use tilec_ir::op::LayoutOp;
    use tilec_ir::Dim;
    let (mut b, x) = B::new(xs);
    let (n, c) = (xs[0], xs[1]);
    let rest: usize = xs[1..].iter().product::<usize>() / groups;
    let fixed = |s: &[usize]| s.iter().map(|&d| Dim::Fixed(d)).collect::<Vec<_>>();
    let xr =
        b.g.add(
            Op::Layout(LayoutOp::Reshape {
                shape: fixed(&[n, groups, rest]),
            }),
            &[x],
        )
        .unwrap();
    let ones = b.g.add_const(
        "ones",
        Tensor::from_f64s(DType::F32, vec![groups], &vec![unit as f64; groups]).unwrap(),
    );
    let zeros = b.g.add_const(
        "zeros",
        Tensor::from_f64s(DType::F32, vec![groups], &vec![0.0; groups]).unwrap(),
    );
    let inorm =
        b.g.add(
            Op::Norm(NormOp::InstanceNorm { epsilon: 1e-5 }),
            &[xr, ones, zeros],
        )
        .unwrap();
    let back =
        b.g.add(Op::Layout(LayoutOp::Reshape { shape: fixed(xs) }), &[inorm])
            .unwrap();
    let mut pshape = vec![c];
    pshape.extend(std::iter::repeat(1).take(xs.len() - 2));
    let mut s = seed;
    let pty = TensorType::fixed(DType::F32, &pshape);
    let gamma = b.g.add_const("gamma", rand_tensor(&pty, &mut s));
    let beta = b.g.add_const("beta", rand_tensor(&pty, &mut s));
    let m = b.mul(back, gamma);
    let y = b.add(beta, m);
    b.done(vec![y])
}

#[test]
fn group_norm_from_instance_norm_between_reshapes() {
    for (xs, groups) in [
        (vec![2, 12, 5, 7], 3),
        (vec![1, 8, 37], 4),
        (vec![1, 6, 3, 4, 5], 6),
    ] {
        let h = check(
            &group_norm_export(&xs, groups, 1.0, 3),
            "group_norm",
            &["instance_norm"],
        );
        let gn = h
            .nodes()
            .iter()
            .find(|n| matches!(n.op, Op::Norm(NormOp::GroupNorm { .. })))
            .unwrap();
        assert_eq!(
            gn.op,
            Op::Norm(NormOp::GroupNorm {
                num_groups: groups,
                epsilon: 1e-5,
                channels_last: false,
            }),
            "{xs:?}"
        );
    }
    // An instance norm with a scale other than 1 is not a plain group norm.
    check_unchanged(&group_norm_export(&[1, 8, 6, 6], 4, 2.0, 5));
}

/// GPT-Neo's spelling: unscaled scores, `where(causal, scores, finfo.min)` with a constant
/// causal bool buffer, then a float mask added: causal attention with that mask. A fill that
/// is not far below any score (-1e4), or a constant keep that is not causal, stays as it is.
fn attention_causal_fill(fill: f32, causal: bool) -> Graph {
    use tilec_ir::op::{LayoutOp, LinalgOp};
    let (bsz, h, s, d) = (2, 2, 6, 4);
    let (mut b, q) = B::new(&[bsz, h, s, d]);
    let k = b.input("k", &[bsz, h, s, d]);
    let v = b.input("v", &[bsz, h, s, d]);
    let pad = b.input("pad", &[bsz, 1, 1, s]);
    let kt = b.g.add(Op::Layout(LayoutOp::Transpose { perm: vec![0, 1, 3, 2] }), &[k]).unwrap();
    let qk = b.g.add(Op::Linalg(LinalgOp::MatMul), &[q, kt]).unwrap();
    let keep: Vec<bool> = (0..s * s).map(|i| if causal { i % s <= i / s } else { i % s != 1 }).collect();
    let keep = b.g.add_const("bias", Tensor::from_vec(vec![1, 1, s, s], keep).unwrap());
    let f = b.c(fill);
    let w = b.g.add(Op::Where, &[keep, qk, f]).unwrap();
    let masked = b.add(w, pad);
    let p = b.g.add(Op::Norm(NormOp::Softmax { axis: 3 }), &[masked]).unwrap();
    let y = b.g.add(Op::Linalg(LinalgOp::MatMul), &[p, v]).unwrap();
    b.done(vec![y])
}

#[test]
fn attention_causal_select_with_a_finite_fill() {
    let h = check(&attention_causal_fill(f32::MIN, true), "attention", &["softmax", "where"]);
    let n = h.nodes().iter().find(|n| n.op.name() == "attention").unwrap();
    assert!(matches!(n.op, Op::Nn(tilec_ir::op::NnOp::Attention { is_causal: true, has_mask: true, .. })), "{:?}", n.op);
    check(&attention_causal_fill(-1e9, true), "attention", &["softmax"]);
    check_unchanged(&attention_causal_fill(-1e4, true));
    check_unchanged(&attention_causal_fill(f32::MIN, false));
}
