//! Epilogues with clamps and products with short reductions on the compiled CPU path
//! against the reference interpreter on fresh random inputs with the arena poisoned:
//! MobileNet-style inverted residual blocks (1x1 expansion over 13 to 33 channels, ReLU6 as
//! `Max`/`Min` with constants or hard swish, depthwise 3x3, 1x1 projection, residual) over
//! maps whose pixel counts are not multiples of the register tile, matrix products with K of
//! 1 to 33 and ragged M and N, the NaN-propagating `Max`/`Min` themselves (the C helpers
//! the clamps use) on NaNs, infinities and signed zeros, a softmax over scores a boolean
//! mask selects, and a LayerNorm over a concatenation of strided slices (Swin's patch merging).

use std::collections::HashMap;

use rand::SeedableRng;
use tilec::compiled::{compile, CompileOptions};

mod poisoned;
use poisoned::random;
use tilec_ir::op::{BinaryOp, LinalgOp, Padding, UnaryOp, Window};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType, ValueId};

fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

/// Compiles `g`, compares two poisoned runs with the reference and returns the families.
fn check_graph(name: &str, g: &Graph, inputs: &[Tensor]) -> Vec<String> {
    let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let mut c = compile(g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    let want = poisoned::reference(g, inputs);
    poisoned::check_runs(name, &mut c, inputs, &want, 1e-4, 1e-4);
    c.report.decisions.iter().map(|(_, d)| d.family.to_string()).collect()
}

fn conv(g: &mut Graph, rng: &mut rand::rngs::StdRng, x: ValueId, ci: usize, co: usize, ks: usize, group: usize, tag: &str) -> ValueId {
    let s = 1.0 / ((ci / group * ks * ks) as f32).sqrt();
    let w = g.add_const(&format!("w{tag}"), random(&[co, ci / group, ks, ks], rng, -s, s));
    let b = g.add_const(&format!("b{tag}"), random(&[co], rng, -0.5, 0.5));
    let p = ks / 2;
    let window = Window { kernel: vec![ks, ks], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![p; 4]) };
    g.add(Op::Linalg(LinalgOp::Conv { window, group, channels_last: false }), &[x, w, b]).unwrap()
}

fn relu6(g: &mut Graph, y: ValueId, tag: &str) -> ValueId {
    let lo = g.add_const(&format!("lo{tag}"), Tensor::scalar(0.0f32));
    let hi = g.add_const(&format!("hi{tag}"), Tensor::scalar(6.0f32));
    let y = g.add(Op::Binary(BinaryOp::Max), &[y, lo]).unwrap();
    g.add(Op::Binary(BinaryOp::Min), &[y, hi]).unwrap()
}

/// An inverted residual block: `cin` channels expanded 6x, over an `h x w` map.
fn inverted_residual(n: usize, cin: usize, h: usize, w: usize, hswish: bool, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let hid = cin * 6;
    let mut g = Graph::new("ir");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[n, cin, h, w]));
    let act = |g: &mut Graph, y: ValueId, tag: &str| {
        if hswish {
            g.add(Op::Unary(UnaryOp::HardSwish), &[y]).unwrap()
        } else {
            relu6(g, y, tag)
        }
    };
    let e = conv(&mut g, &mut rng, x, cin, hid, 1, 1, "e");
    let e = act(&mut g, e, "e");
    let d = conv(&mut g, &mut rng, e, hid, hid, 3, hid, "d");
    let d = act(&mut g, d, "d");
    let p = conv(&mut g, &mut rng, d, hid, cin, 1, 1, "p");
    let y = g.add(Op::Binary(BinaryOp::Add), &[p, x]).unwrap();
    g.set_outputs(vec![y]);
    let inputs = vec![random(&[n, cin, h, w], &mut rng, -1.0, 1.0)];
    let name = format!("inverted residual {n}x{cin}x{h}x{w} hswish={hswish}");
    let families = check_graph(&name, &g, &inputs);
    assert!(families.iter().any(|f| f == "cpu.blis_gemm"), "{name}: {families:?}");
}

#[test]
fn inverted_residual_blocks_with_shallow_expansions() {
    // K of the expansion: 16 and 24 (MobileNet-V2), 13 (ragged), 32 (the longest short
    // one), 33 (one over); pixel counts of 63, 100, 35, 49 and 12 (no multiple of 8).
    for (i, (n, cin, h, w, hswish)) in
        [(1, 16, 9, 7, false), (1, 24, 10, 10, true), (2, 13, 5, 7, false), (1, 32, 7, 7, true), (1, 33, 4, 3, false)]
            .into_iter()
            .enumerate()
    {
        inverted_residual(n, cin, h, w, hswish, 40 + i as u64);
    }
}

#[test]
fn matrix_products_with_short_reductions() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(71);
    for (m, k, n) in [(37, 1, 19), (100, 16, 96), (9, 24, 144), (131, 20, 33), (64, 32, 48), (17, 33, 50), (200, 7, 5)] {
        let mut g = Graph::new("mm");
        let a = g.add_input("a", TensorType::fixed(DType::F32, &[m, k]));
        let b = g.add_const("b", random(&[k, n], &mut rng, -1.0, 1.0));
        let c = g.add_const("c", random(&[n], &mut rng, -1.0, 1.0));
        let y = g.add(Op::Linalg(LinalgOp::MatMul), &[a, b]).unwrap();
        let y = g.add(Op::Binary(BinaryOp::Add), &[y, c]).unwrap();
        let y = g.add(Op::Unary(UnaryOp::HardSwish), &[y]).unwrap();
        g.set_outputs(vec![y]);
        let inputs = vec![random(&[m, k], &mut rng, -2.0, 2.0)];
        let name = format!("matmul {m}x{k}x{n}");
        let families = check_graph(&name, &g, &inputs);
        assert!(families.iter().any(|f| f == "cpu.blis_gemm"), "{name}: {families:?}");
    }
}

/// `Max` and `Min` against a constant (a clamp) and between two inputs, on NaNs, infinities,
/// signed zeros and finite values: the compiled kernels must agree with the interpreter (a
/// NaN exactly where it has one, equal values elsewhere; the interpreter's `f64::max` leaves
/// the sign of a zero tie unspecified, so that is not compared).
#[test]
fn nan_propagating_min_max() {
    let special = [0.0f32, -0.0, 1.0, -1.0, 6.0, 7.5, -3.25, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, 1e-40];
    let n = special.len();
    // Every ordered pair, 144 of them, laid out as two 12x12 inputs (and a few odd extra rows
    // so that the vector loops have remainders).
    let rows = n + 3;
    let a: Vec<f32> = (0..rows * n).map(|i| special[(i / n) % n]).collect();
    let b: Vec<f32> = (0..rows * n).map(|i| special[i % n]).collect();
    for (what, op) in [("max", BinaryOp::Max), ("min", BinaryOp::Min)] {
        for constant in [None, Some(0.0f32), Some(-0.0), Some(6.0), Some(f32::NAN)] {
            let mut g = Graph::new("minmax");
            let x = g.add_input("x", TensorType::fixed(DType::F32, &[rows, n]));
            let y = g.add_input("y", TensorType::fixed(DType::F32, &[rows, n]));
            let other = match constant {
                Some(c) => g.add_const("c", Tensor::scalar(c)),
                None => y,
            };
            // Times the second input (ones against a constant) so that both inputs are used.
            let z = g.add(Op::Binary(op.clone()), &[x, other]).unwrap();
            let z = if constant.is_some() { g.add(Op::Binary(BinaryOp::Mul), &[z, y]).unwrap() } else { z };
            g.set_outputs(vec![z]);
            let second = if constant.is_some() { vec![1.0f32; rows * n] } else { b.clone() };
            let inputs = vec![
                Tensor::from_vec(vec![rows, n], a.clone()).unwrap(),
                Tensor::from_vec(vec![rows, n], second).unwrap(),
            ];
            let name = format!("{what} with {constant:?}");
            let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
            let mut c = compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
            let want = tilec_ref::run_named(&g, [("x".to_string(), inputs[0].clone()), ("y".to_string(), inputs[1].clone())].into_iter().collect::<HashMap<_, _>>())
                .unwrap()
                .remove(0)
                .to_f64_vec();
            c.poison().unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = c.run(&inputs).unwrap_or_else(|e| panic!("{name}: {e}")).remove(0).to_f64_vec();
            for (i, (w, o)) in want.iter().zip(&got).enumerate() {
                let same = (w.is_nan() && o.is_nan()) || w == o;
                assert!(same, "{name}: element {i} ({} vs {}): reference {w}, compiled {o}", a[i], b[i]);
            }
        }
    }
}

/// A softmax over scores selected by a boolean mask (GPT-Neo's causal bias: `where(mask,
/// scores, min)` plus an additive mask), rows of 128 and 40: the reductions read single bytes,
/// so their partials take 16 lanes (gcc vectorizes no loop of 8 byte loads; the rows ran
/// scalar). Against the reference with the arena poisoned.
#[test]
fn softmax_over_a_boolean_mask() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(73);
    for cols in [128usize, 40] {
        let mut g = Graph::new("masked_softmax");
        let s = g.add_input("s", TensorType::fixed(DType::F32, &[4, 16, cols]));
        let m: Vec<f64> = (0..16 * cols).map(|i| f64::from(u8::from(i % cols <= (i / cols) * cols / 16 + 3))).collect();
        let m = g.add_const("m", Tensor::from_f64s(DType::Bool, vec![16, cols], &m).unwrap());
        let lo = g.add_const("lo", Tensor::scalar(f32::MIN));
        let add = g.add_const("add", random(&[16, cols], &mut rng, -1.0, 0.0));
        let y = g.add(Op::Where, &[m, s, lo]).unwrap();
        let y = g.add(Op::Binary(BinaryOp::Add), &[y, add]).unwrap();
        let y = g.add(Op::Norm(tilec_ir::op::NormOp::Softmax { axis: 2 }), &[y]).unwrap();
        g.set_outputs(vec![y]);
        let inputs = vec![random(&[4, 16, cols], &mut rng, -3.0, 3.0)];
        check_graph(&format!("masked softmax {cols}"), &g, &inputs);
        let opts = CompileOptions { cache_dir: Some(cache()), keep_ir: true, ..Default::default() };
        let c = compile(&g, &opts).unwrap();
        let scheduled: String = c.report.ir.iter().map(|(_, _, s)| s.as_str()).collect();
        if cols == 128 {
            assert!(scheduled.contains("[16]"), "no 16-lane partials:\n{scheduled}");
        }
    }
}

/// Swin's patch merging: a LayerNorm over the channel concatenation of four strided slices of
/// a channels-last map. Its statistics select an input per element; the loops over the row's
/// vectors are cut where the selection changes, so that no select is left in the scheduled
/// kernel. Against the reference with the arena poisoned.
#[test]
fn layer_norm_over_a_concatenation_of_strided_slices() {
    use tilec_ir::op::{LayoutOp, NormOp, SliceBound};
    let mut rng = rand::rngs::StdRng::seed_from_u64(79);
    let c = 48;
    let mut g = Graph::new("patch_merging");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 8, 8, c]));
    let mut parts = vec![];
    for (h0, w0) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let slice = LayoutOp::Slice {
            axes: vec![1, 2],
            starts: vec![SliceBound::Index(h0), SliceBound::Index(w0)],
            ends: vec![SliceBound::Index(8), SliceBound::Index(8)],
            steps: vec![2, 2],
        };
        parts.push(g.add(Op::Layout(slice), &[x]).unwrap());
    }
    let cat = g.add(Op::Layout(LayoutOp::Concat { axis: 3 }), &parts).unwrap();
    let scale = g.add_const("scale", random(&[4 * c], &mut rng, 0.5, 1.5));
    let bias = g.add_const("bias", random(&[4 * c], &mut rng, -0.5, 0.5));
    let ln = NormOp::LayerNorm { axis: 3, epsilon: 1e-5, stash: DType::F32, has_bias: true };
    let y = g.add(Op::Norm(ln), &[cat, scale, bias]).unwrap();
    g.set_outputs(vec![y]);
    let inputs = vec![random(&[1, 8, 8, c], &mut rng, -2.0, 2.0)];
    check_graph("patch merging", &g, &inputs);
    let opts = CompileOptions { cache_dir: Some(cache()), keep_ir: true, ..Default::default() };
    let comp = compile(&g, &opts).unwrap();
    let scheduled: String = comp.report.ir.iter().map(|(_, _, s)| s.as_str()).collect();
    assert!(!scheduled.contains("select("), "a select left in the scheduled kernel:\n{scheduled}");
}
