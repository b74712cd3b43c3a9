//! Channel-wise ops in channels-last regions on the compiled CPU path, against the reference
//! interpreter on fresh random inputs with the arena poisoned: global pools vectorized along
//! the channels (mean, max, Lp; channel counts that are and are not multiples of the vector
//! width, one image and several, a fused epilogue), and a squeeze-and-excitation block
//! (EfficientNet's, with its spatial mean) that the layout pass keeps channels-last with its
//! depthwise convolution on `cpu.depthwise`, its scale moved onto the projection's weights.

use std::collections::HashMap;

use rand::SeedableRng;
use tilec::compiled::{compile, CompileOptions};

mod poisoned;
use poisoned::random;
use tilec_ir::op::{BinaryOp, LinalgOp, Padding, PoolKind, ReduceKind, ReduceOp, UnaryOp, Window};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType, ValueId};

fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

/// Compiles `g`, returns the kernels' families, and compares two poisoned runs with the
/// reference.
fn check_graph(name: &str, g: &Graph, inputs: &[Tensor]) -> Vec<(String, String, String)> {
    let opts = CompileOptions { cache_dir: Some(cache()), keep_ir: true, ..Default::default() };
    let mut c = compile(g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    let want = poisoned::reference(g, inputs);
    poisoned::check_runs(name, &mut c, inputs, &want, 1e-5, 1e-5);
    let ir: HashMap<&String, &String> = c.report.ir.iter().map(|(k, _, ir)| (k, ir)).collect();
    c.report
        .decisions
        .iter()
        .map(|(k, d)| (k.clone(), d.family.to_string(), ir.get(k).map(|s| s.to_string()).unwrap_or_default()))
        .collect()
}

#[test]
fn global_pools_along_channels() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let kinds = [
        PoolKind::Avg { count_include_pad: false },
        PoolKind::Max { indices: false, column_major: false },
        PoolKind::Lp { p: 2 },
    ];
    for (i, (n, h, w, c)) in [(1, 7, 5, 24), (2, 3, 4, 13), (1, 1, 1, 40), (2, 9, 11, 96), (1, 4, 4, 8), (3, 2, 5, 1152)].into_iter().enumerate() {
        let kind = kinds[i % kinds.len()].clone();
        let mut g = Graph::new("gp");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[n, h, w, c]));
        let p = g.add(Op::Linalg(LinalgOp::GlobalPool { kind: kind.clone(), channels_last: true }), &[x]).unwrap();
        let y = g.add(Op::Unary(UnaryOp::Sigmoid), &[p]).unwrap();
        g.set_outputs(vec![y]);
        let inputs = vec![random(&[n, h, w, c], &mut rng, -2.0, 2.0)];
        check_graph(&format!("{kind:?} {n}x{h}x{w}x{c}"), &g, &inputs);
    }
}

/// EfficientNet's MBConv with squeeze-and-excitation, channels-first as exported: 1x1
/// expand, depthwise 3x3, mean over H and W, two 1x1 convs (SiLU, sigmoid), the scale,
/// 1x1 project and the residual.
#[test]
fn squeeze_and_excitation_block_stays_channels_last() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let (cin, hid, sq, hw) = (16, 96, 4, 10);
    let mut g = Graph::new("mbconv");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[2, cin, hw, hw]));
    let mut k = 0;
    let mut conv = |g: &mut Graph, rng: &mut rand::rngs::StdRng, x: ValueId, ci: usize, co: usize, ks: usize, group: usize| {
        k += 1;
        let s = 1.0 / ((ci / group * ks * ks) as f32).sqrt();
        let w = g.add_const(&format!("w{k}"), random(&[co, ci / group, ks, ks], rng, -s, s));
        let b = g.add_const(&format!("b{k}"), random(&[co], rng, -0.3, 0.3));
        let p = ks / 2;
        let window = Window { kernel: vec![ks, ks], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![p; 4]) };
        g.add(Op::Linalg(LinalgOp::Conv { window, group, channels_last: false }), &[x, w, b]).unwrap()
    };
    let silu = |g: &mut Graph, y: ValueId| {
        let s = g.add(Op::Unary(UnaryOp::Sigmoid), &[y]).unwrap();
        g.add(Op::Binary(BinaryOp::Mul), &[y, s]).unwrap()
    };
    let e = conv(&mut g, &mut rng, x, cin, hid, 1, 1);
    let e = silu(&mut g, e);
    let d = conv(&mut g, &mut rng, e, hid, hid, 3, hid);
    let d = silu(&mut g, d);
    let m = g.add(Op::Reduce(ReduceOp::Reduce { kind: ReduceKind::Mean, axes: vec![2, 3], keepdims: true }), &[d]).unwrap();
    let s = conv(&mut g, &mut rng, m, hid, sq, 1, 1);
    let s = silu(&mut g, s);
    let s = conv(&mut g, &mut rng, s, sq, hid, 1, 1);
    let s = g.add(Op::Unary(UnaryOp::Sigmoid), &[s]).unwrap();
    let d = g.add(Op::Binary(BinaryOp::Mul), &[d, s]).unwrap();
    let p = conv(&mut g, &mut rng, d, hid, cin, 1, 1);
    let y = g.add(Op::Binary(BinaryOp::Add), &[p, x]).unwrap();
    g.set_outputs(vec![y]);
    let inputs = vec![random(&[2, cin, hw, hw], &mut rng, -1.0, 1.0)];
    let families = check_graph("mbconv", &g, &inputs);
    let count = |f: &str| families.iter().filter(|(_, fam, _)| fam == f).count();
    assert_eq!(count("cpu.depthwise"), 1, "{families:?}");
    let pools = families.iter().filter(|(k, _, _)| k.contains("pool")).count();
    let reductions = families.iter().filter(|(k, _, _)| k.contains("reduction")).count();
    let layout = families.iter().filter(|(k, _, _)| k.contains("layout") || k.contains("transpose")).count();
    assert_eq!((pools, reductions), (1, 0), "{families:?}");
    assert!(layout <= 2, "{families:?}");
    // The projection reads the depthwise output in place; the scale multiplies its weights.
    let scaled_b = families.iter().filter(|(_, _, ir)| {
        let line = |p: &str| ir.lines().map(str::trim).find(|l| l.starts_with(p)).unwrap_or("").to_string();
        let (a, b) = (line("A("), line("B("));
        !a.is_empty() && !a.contains(" * ") && b.contains(" * ")
    });
    assert_eq!(scaled_b.count(), 1, "{families:?}");
}

/// A video block as torchvision's R(2+1)D writes it, channels-first: a 3x3x3 stem conv, a
/// (1, 3, 3) spatial conv and a (3, 1, 1) temporal one (strided), a 1x1x1 projection of the
/// residual, ReLUs and the mean over time, height and width. The layout pass runs the whole
/// block channels-last (one transpose in, one out) and it matches the interpreter.
#[test]
fn video_block_runs_channels_last() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let (n, cin, t, hw) = (2, 3, 6, 12);
    let mut g = Graph::new("r2plus1d");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[n, cin, t, hw, hw]));
    let mut k = 0;
    let mut conv = |g: &mut Graph, rng: &mut rand::rngs::StdRng, x: ValueId, ci: usize, co: usize, ks: [usize; 3], stride: [usize; 3]| {
        k += 1;
        let s = 1.0 / ((ci * ks.iter().product::<usize>()) as f32).sqrt();
        let w = g.add_const(&format!("w{k}"), random(&[co, ci, ks[0], ks[1], ks[2]], rng, -s, s));
        let b = g.add_const(&format!("b{k}"), random(&[co], rng, -0.3, 0.3));
        let pads = ks.iter().map(|k| k / 2).chain(ks.iter().map(|k| k / 2)).collect();
        let window = Window { kernel: ks.to_vec(), strides: stride.to_vec(), dilations: vec![1; 3], pads: Padding::Explicit(pads) };
        g.add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: false }), &[x, w, b]).unwrap()
    };
    let relu = |g: &mut Graph, y: ValueId| g.add(Op::Unary(UnaryOp::Relu), &[y]).unwrap();
    let h = conv(&mut g, &mut rng, x, cin, 16, [3, 3, 3], [1, 1, 1]);
    let h = relu(&mut g, h);
    let s = conv(&mut g, &mut rng, h, 16, 24, [1, 3, 3], [1, 2, 2]);
    let s = relu(&mut g, s);
    let s = conv(&mut g, &mut rng, s, 24, 32, [3, 1, 1], [2, 1, 1]);
    let r = conv(&mut g, &mut rng, h, 16, 32, [1, 1, 1], [2, 2, 2]);
    let y = g.add(Op::Binary(BinaryOp::Add), &[s, r]).unwrap();
    let y = relu(&mut g, y);
    let y = g.add(Op::Reduce(ReduceOp::Reduce { kind: ReduceKind::Mean, axes: vec![2, 3, 4], keepdims: true }), &[y]).unwrap();
    g.set_outputs(vec![y]);
    let inputs = vec![random(&[n, cin, t, hw, hw], &mut rng, -1.0, 1.0)];
    let families = check_graph("r2plus1d", &g, &inputs);
    let layout = families.iter().filter(|(k, _, _)| k.contains("layout") || k.contains("transpose")).count();
    let pools = families.iter().filter(|(k, _, _)| k.contains("pool")).count();
    assert_eq!((layout, pools), (1, 1), "{families:?}");
}

/// Window pools channels-last (max, average with and without the padding counted, Lp; 2-D and
/// 3-D; strides, dilations, ceil mode, channel counts that are and are not whole vectors),
/// each with a fused epilogue, against the interpreter.
#[test]
fn window_pools_along_channels() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let max = PoolKind::Max { indices: false, column_major: false };
    let cases: Vec<(PoolKind, Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>, bool)> = vec![
        // kind, input [N, *S, C], kernel, strides, dilations, pads (begin.., end..), ceil
        (max.clone(), vec![1, 4, 7, 6, 24], vec![3, 3, 3], vec![1, 1, 1], vec![1, 1, 1], vec![1, 1, 1, 1, 1, 1], false),
        (max.clone(), vec![2, 9, 9, 13], vec![3, 3], vec![2, 2], vec![1, 1], vec![1, 1, 1, 1], false),
        (max.clone(), vec![1, 8, 10, 16], vec![2, 3], vec![2, 2], vec![2, 1], vec![0, 1, 1, 0], true),
        (PoolKind::Avg { count_include_pad: false }, vec![1, 5, 8, 8, 40], vec![1, 3, 3], vec![1, 2, 2], vec![1, 1, 1], vec![0, 1, 1, 0, 1, 1], false),
        (PoolKind::Avg { count_include_pad: true }, vec![1, 2, 7, 7, 32], vec![2, 7, 7], vec![1, 1, 1], vec![1, 1, 1], vec![0, 0, 0, 0, 0, 0], false),
        (PoolKind::Avg { count_include_pad: true }, vec![2, 6, 6, 9], vec![3, 3], vec![1, 1], vec![1, 1], vec![1, 1, 1, 1], false),
        (PoolKind::Lp { p: 2 }, vec![1, 6, 5, 8], vec![2, 2], vec![2, 1], vec![1, 1], vec![0, 0, 1, 0], true),
    ];
    for (kind, shape, kernel, strides, dilations, pads, ceil) in cases {
        let mut g = Graph::new("pool");
        let x = g.add_input("x", TensorType::fixed(DType::F32, &shape));
        let window = Window { kernel, strides, dilations, pads: Padding::Explicit(pads) };
        let p = g
            .add(Op::Linalg(LinalgOp::Pool { kind: kind.clone(), window, ceil_mode: ceil, channels_last: true }), &[x])
            .unwrap();
        let y = g.add(Op::Unary(UnaryOp::Tanh), &[p]).unwrap();
        g.set_outputs(vec![y]);
        let inputs = vec![random(&shape, &mut rng, -2.0, 2.0)];
        let families = check_graph(&format!("{kind:?} {shape:?}"), &g, &inputs);
        assert!(families.iter().any(|(_, _, ir)| ir.contains("plc")), "{kind:?} {shape:?}: no channel loop {families:?}");
    }
}
