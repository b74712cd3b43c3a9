//! Depthwise convolutions on the compiled CPU path (`cpu.depthwise`), against the reference
//! interpreter on fresh random weights and inputs, the arena poisoned before each run: 3×3,
//! 5×5 and 7×7 kernels, strides 1 and 2, symmetric, asymmetric and no padding, dilation,
//! images smaller than the window, channel counts that are not a multiple of the vector
//! width, batches, channel multipliers 2 to 8 (output channels per input channel), and the
//! fused epilogues (batch norm, ReLU, ReLU6, SiLU, hardswish,
//! residual add). Every case asserts that the family builds the convolution; a MobileNet
//! block through the layout pass keeps the depthwise convolution channels-last.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, CompileOptions};

mod poisoned;
use poisoned::random;
use tilec_ir::op::{BinaryOp, LinalgOp, NormOp, Padding, UnaryOp, Window};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType, ValueId};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    None,
    Relu,
    Relu6,
    Silu,
    HardSwish,
}

struct Case {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: usize,
    stride: usize,
    dil: usize,
    /// top, left, bottom, right
    pads: [usize; 4],
    bn: bool,
    act: Act,
    residual: bool,
    /// Output channels per group.
    mult: usize,
    /// Input channels per group (1: depthwise; `c` counts the groups).
    cin: usize,
}

fn case(c: usize, h: usize, w: usize, k: usize, stride: usize, p: usize) -> Case {
    Case { n: 1, c, h, w, k, stride, dil: 1, pads: [p; 4], bn: false, act: Act::None, residual: false, mult: 1, cin: 1 }
}

fn out_size(i: usize, k: usize, s: usize, d: usize, pb: usize, pe: usize) -> usize {
    (i + pb + pe - (k - 1) * d - 1) / s + 1
}

fn scalar(g: &mut Graph, name: &str, v: f32) -> ValueId {
    g.add_const(name, Tensor::from_vec(vec![1], vec![v]).unwrap())
}

/// One channels-last depthwise conv and its epilogue.
fn graph(t: &Case, rng: &mut impl Rng) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new("dw");
    let xs = [t.n, t.h, t.w, t.c * t.cin];
    let x = g.add_input("x", TensorType::fixed(DType::F32, &xs));
    let scale = 1.0 / (t.k * t.k * t.cin) as f32;
    let co = t.c * t.mult;
    let w = g.add_const("w", random(&[co, t.cin, t.k, t.k], rng, -scale * 2.0, scale * 2.0));
    let b = g.add_const("b", random(&[co], rng, -0.5, 0.5));
    let window = Window {
        kernel: vec![t.k, t.k],
        strides: vec![t.stride, t.stride],
        dilations: vec![t.dil, t.dil],
        pads: Padding::Explicit(vec![t.pads[0], t.pads[1], t.pads[2], t.pads[3]]),
    };
    let mut y = g.add(Op::Linalg(LinalgOp::Conv { window, group: t.c, channels_last: true }), &[x, w, b]).unwrap();
    if t.bn {
        let mut ins = vec![y];
        for (j, (lo, hi)) in [(0.5, 1.5), (-0.3, 0.3), (-0.2, 0.2), (0.5, 1.5)].into_iter().enumerate() {
            ins.push(g.add_const(&format!("bn{j}"), random(&[co], rng, lo, hi)));
        }
        y = g.add(Op::Norm(NormOp::BatchNorm { epsilon: 1e-5, channels_last: true }), &ins).unwrap();
    }
    y = match t.act {
        Act::None => y,
        Act::Relu => g.add(Op::Unary(UnaryOp::Relu), &[y]).unwrap(),
        Act::Relu6 => {
            let (z, six) = (scalar(&mut g, "zero", 0.0), scalar(&mut g, "six", 6.0));
            let m = g.add(Op::Binary(BinaryOp::Max), &[y, z]).unwrap();
            g.add(Op::Binary(BinaryOp::Min), &[m, six]).unwrap()
        }
        Act::Silu => {
            let s = g.add(Op::Unary(UnaryOp::Sigmoid), &[y]).unwrap();
            g.add(Op::Binary(BinaryOp::Mul), &[y, s]).unwrap()
        }
        Act::HardSwish => g.add(Op::Unary(UnaryOp::HardSwish), &[y]).unwrap(),
    };
    let oh = out_size(t.h, t.k, t.stride, t.dil, t.pads[0], t.pads[2]);
    let ow = out_size(t.w, t.k, t.stride, t.dil, t.pads[1], t.pads[3]);
    let mut inputs = vec![random(&xs, rng, -2.0, 2.0)];
    if t.residual {
        let r = g.add_input("r", TensorType::fixed(DType::F32, &[t.n, oh, ow, co]));
        y = g.add(Op::Binary(BinaryOp::Add), &[y, r]).unwrap();
        inputs.push(random(&[t.n, oh, ow, co], rng, -1.0, 1.0));
    }
    g.set_outputs(vec![y]);
    (g, inputs)
}

fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

/// Compiles `g`, asserts that `want_depthwise` kernels are the family's, and compares two
/// poisoned runs with the reference.
fn check_graph(name: &str, g: &Graph, inputs: &[Tensor], want_depthwise: usize) {
    let opts = CompileOptions { cache_dir: Some(cache()), keep_ir: std::env::var_os("DW_IR").is_some(), ..Default::default() };
    let mut c = compile(g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    for (k, _, ir) in &c.report.ir {
        eprintln!("== {k}\n{ir}");
    }
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    let dw = c.report.decisions.iter().filter(|(_, d)| d.family == "cpu.depthwise").count();
    assert_eq!(dw, want_depthwise, "{name}: depthwise kernels in {:?}", c.report.decisions);
    let want = poisoned::reference(g, inputs);
    poisoned::check_runs(name, &mut c, inputs, &want, 1e-5, 1e-5);
}

/// Checks a case the family takes: all but grouped convolutions whose groups' output
/// channels fill whole vectors (8 with AVX2), which are `cpu.group_direct`'s.
fn check(name: &str, t: Case) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.bytes().map(u64::from).sum::<u64>() * 7919);
    let (g, inputs) = graph(&t, &mut rng);
    let lanes = tilec_opt::target::CpuTarget::host().lanes(DType::F32) as usize;
    let whole_vectors = t.cin > 1 && t.mult % lanes == 0;
    check_graph(name, &g, &inputs, usize::from(!whole_vectors));
}

#[test]
fn kernel_3x3() {
    check("s1p1", Case { act: Act::Relu6, ..case(32, 12, 12, 3, 1, 1) });
    // Ragged channels, a batch, stride 2 over odd sizes.
    check("s2p1", Case { n: 2, act: Act::Relu, ..case(37, 13, 13, 3, 2, 1) });
    // Wide rows: several register blocks and a shorter last one.
    check("wide", Case { act: Act::Relu6, residual: true, ..case(24, 5, 43, 3, 1, 1) });
    check("nopad", case(16, 10, 10, 3, 1, 0));
    check("asym", Case { pads: [0, 1, 2, 0], ..case(24, 11, 10, 3, 2, 0) });
    check("dilated", Case { dil: 2, ..case(17, 9, 12, 3, 1, 2) });
    check("pixel", case(5, 1, 1, 3, 1, 1));
}

#[test]
fn kernel_5x5() {
    check("k5s1", Case { act: Act::Silu, residual: true, ..case(20, 9, 11, 5, 1, 2) });
    check("k5s2", Case { bn: true, act: Act::HardSwish, ..case(48, 14, 14, 5, 2, 2) });
    check("k5s2odd", Case { n: 3, bn: true, act: Act::Silu, ..case(40, 15, 15, 5, 2, 2) });
}

#[test]
fn kernel_7x7() {
    // ConvNeXt: 7×7 on a 7×7 map (one interior pixel), and on a larger one.
    check("k7m7", Case { bn: true, ..case(19, 7, 7, 7, 1, 3) });
    check("k7m16", Case { residual: true, ..case(96, 16, 16, 7, 1, 3) });
    // Smaller than the window: every output pixel a border one.
    check("k7small", Case { act: Act::Relu, ..case(8, 5, 4, 7, 2, 3) });
}

#[test]
fn channel_multipliers() {
    // Output channel c·M + j reads input channel c: strides, padding, dilation, ragged
    // channels, batches and the epilogues on every multiple.
    check("m2", Case { mult: 2, act: Act::Relu6, ..case(32, 12, 12, 3, 1, 1) });
    check("m2s2", Case { n: 2, mult: 2, bn: true, residual: true, ..case(13, 11, 9, 3, 2, 1) });
    check("m3dil", Case { mult: 3, dil: 2, act: Act::Silu, ..case(17, 9, 12, 3, 1, 2) });
    check("m4k5", Case { mult: 4, pads: [2, 1, 0, 2], ..case(8, 10, 13, 5, 2, 0) });
    check("m8", Case { mult: 8, act: Act::HardSwish, ..case(3, 7, 7, 3, 1, 1) });
}

/// Grouped convolutions with a few channels per group (a vector lane per group, summing over
/// its own input channels): ResNeXt's 32×4 and 32×8 and RegNet-like widths of 8, strides 1
/// and 2, ragged group counts and row lengths, batches, and the epilogues.
#[test]
fn grouped() {
    check("g32x4", Case { cin: 4, mult: 4, bn: true, act: Act::Relu, ..case(32, 14, 14, 3, 1, 1) });
    check("g32x4s2", Case { n: 2, cin: 4, mult: 4, act: Act::Relu, residual: true, ..case(32, 15, 13, 3, 2, 1) });
    check("g32x8", Case { cin: 8, mult: 8, bn: true, act: Act::Relu, ..case(32, 9, 11, 3, 1, 1) });
    check("g32x8s2", Case { cin: 8, mult: 8, ..case(32, 12, 17, 3, 2, 1) });
    check("g37x2", Case { cin: 2, mult: 2, act: Act::Silu, ..case(37, 7, 23, 3, 1, 1) });
    check("g20x8", Case { cin: 8, mult: 8, residual: true, ..case(20, 6, 6, 3, 1, 1) });
    check("g16x3to6", Case { cin: 3, mult: 6, ..case(16, 8, 9, 3, 2, 1) });
    check("g16x4k1", Case { cin: 4, mult: 4, ..case(16, 5, 7, 1, 1, 0) });
}

/// Refused with a reason: a channel multiplier above 8, a grouped convolution of fewer groups
/// than a vector's lanes or of 16 input channels per group run elsewhere, and so does padding
/// far beyond the kernel.
#[test]
fn refusals_name_a_reason() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for (name, cin, cout, group, reason) in
        [
        ("mult9", 4, 36, 4, "9 output channels per group, more than 8"),
        ("fewgroups", 8, 8, 4, "fewer groups than the"),
        // 12 output channels per group: not whole vectors, so not `cpu.group_direct`'s either.
        ("wide", 64, 48, 4, "16 input channels per group, more than 8"),
    ]
    {
        let mut g = Graph::new(name);
        let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 6, 6, cin]));
        let w = g.add_const("w", random(&[cout, cin / group, 3, 3], &mut rng, -0.3, 0.3));
        let b = g.add_const("b", random(&[cout], &mut rng, -0.3, 0.3));
        let window = Window { kernel: vec![3, 3], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![1; 4]) };
        let y = g.add(Op::Linalg(LinalgOp::Conv { window, group, channels_last: true }), &[x, w, b]).unwrap();
        g.set_outputs(vec![y]);
        let inputs = vec![random(&[1, 6, 6, cin], &mut rng, -1.0, 1.0)];
        check_graph(name, &g, &inputs, 0);
        let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
        let c = compile(&g, &opts).unwrap();
        let reasons: Vec<String> = c
            .report
            .decisions
            .iter()
            .flat_map(|(_, d)| d.rejected.iter().filter(|(f, _)| *f == "cpu.depthwise").map(|(_, r)| r.clone()))
            .collect();
        assert!(reasons.iter().any(|r| r.contains(reason)), "{name}: {reasons:?}");
    }

    let (g, inputs) = graph(&case(8, 4, 4, 3, 1, 12), &mut rng);
    check_graph("farpad", &g, &inputs, 0);
}

/// A MobileNet-V2 block on NCHW tensors (expand 1×1, depthwise 3×3, project 1×1, residual):
/// the layout pass runs it channels-last, the depthwise conv is the family's, and no
/// transpose sits next to it.
#[test]
fn mobilenet_block_stays_channels_last() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut g = Graph::new("block");
    let (cin, hid, hw) = (16, 96, 14);
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, cin, hw, hw]));
    let pw = |g: &mut Graph, rng: &mut rand::rngs::StdRng, x: ValueId, ci: usize, co: usize, i: usize| {
        let w = g.add_const(&format!("pw{i}"), random(&[co, ci, 1, 1], rng, -0.3, 0.3));
        let b = g.add_const(&format!("pb{i}"), random(&[co], rng, -0.3, 0.3));
        let window = Window { kernel: vec![1, 1], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![0; 4]) };
        g.add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: false }), &[x, w, b]).unwrap()
    };
    let relu6 = |g: &mut Graph, y: ValueId, i: usize| {
        let (z, six) = (scalar(g, &format!("z{i}"), 0.0), scalar(g, &format!("six{i}"), 6.0));
        let m = g.add(Op::Binary(BinaryOp::Max), &[y, z]).unwrap();
        g.add(Op::Binary(BinaryOp::Min), &[m, six]).unwrap()
    };
    let e = pw(&mut g, &mut rng, x, cin, hid, 0);
    let e = relu6(&mut g, e, 0);
    let w = g.add_const("dw", random(&[hid, 1, 3, 3], &mut rng, -0.3, 0.3));
    let b = g.add_const("db", random(&[hid], &mut rng, -0.3, 0.3));
    let window = Window { kernel: vec![3, 3], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![1; 4]) };
    let d = g.add(Op::Linalg(LinalgOp::Conv { window, group: hid, channels_last: false }), &[e, w, b]).unwrap();
    let d = relu6(&mut g, d, 1);
    let p = pw(&mut g, &mut rng, d, hid, cin, 1);
    let y = g.add(Op::Binary(BinaryOp::Add), &[p, x]).unwrap();
    g.set_outputs(vec![y]);
    let inputs = vec![random(&[1, cin, hw, hw], &mut rng, -1.0, 1.0)];

    let opts = CompileOptions { cache_dir: Some(cache()), keep_ir: true, ..Default::default() };
    let c = compile(&g, &opts).unwrap();
    let dw: Vec<&String> = c.report.decisions.iter().filter(|(_, d)| d.family == "cpu.depthwise").map(|(k, _)| k).collect();
    assert_eq!(dw.len(), 1, "{:?}", c.report.decisions);
    // Two boundary transposes (in and out of the region), none between the convs.
    let layout = c.report.decisions.iter().filter(|(k, _)| k.contains("layout") || k.contains("transpose")).count();
    assert!(layout <= 2, "{:?}", c.report.decisions);
    check_graph("block", &g, &inputs, 1);
}

/// Compiles `g` and checks two poisoned runs per input set against the reference, the sets
/// in turn (a weight that is a graph input changes between them).
fn check_sets(name: &str, g: &Graph, sets: &[Vec<Tensor>], want_depthwise: usize) {
    let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let mut c = compile(g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    let dw = c.report.decisions.iter().filter(|(_, d)| d.family == "cpu.depthwise").count();
    assert_eq!(dw, want_depthwise, "{name}: depthwise kernels in {:?}", c.report.decisions);
    let names: Vec<String> = g.inputs().iter().map(|&v| g.value(v).name.clone()).collect();
    for (s, inputs) in sets.iter().enumerate() {
        let want = tilec_ref::run_named(g, names.iter().cloned().zip(inputs.iter().cloned()).collect::<HashMap<_, _>>())
            .unwrap()
            .remove(0);
        for run in 0..2 {
            c.poison().unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = c.run(inputs).unwrap_or_else(|e| panic!("{name}: {e}")).remove(0);
            let (w, o) = (want.to_f64_vec(), got.to_f64_vec());
            assert_eq!(w.len(), o.len(), "{name}");
            for (i, (a, b)) in w.iter().zip(&o).enumerate() {
                assert!((a - b).abs() <= 1e-5 + 1e-5 * a.abs(), "{name} set {s} run {run}: element {i}: reference {a}, compiled {b}");
            }
        }
    }
}

/// Two depthwise convs of one shape (one rendered kernel) with different constant weights,
/// odd channel counts and a multiplier: each call must read its own weights, transposed once
/// ahead of the calls, and never another kernel's or a stale copy.
#[test]
fn constant_weights_prepared_per_kernel() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4099);
    for (c, m, k) in [(13usize, 1usize, 5usize), (7, 3, 3), (33, 2, 7)] {
        let name = format!("twice_c{c}_m{m}_k{k}");
        let mut g = Graph::new("dw2");
        let xs = [1, 9, 11, c];
        let x = g.add_input("x", TensorType::fixed(DType::F32, &xs));
        let window = Window { kernel: vec![k, k], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![k / 2; 4]) };
        let mut y = x;
        let mut cin = c;
        for i in 0..2 {
            // The second conv takes the first one's c·m channels with multiplier 1.
            let mi = if i == 0 { m } else { 1 };
            let w = g.add_const(&format!("w{i}"), random(&[cin * mi, 1, k, k], &mut rng, -0.3, 0.3));
            let b = g.add_const(&format!("b{i}"), random(&[cin * mi], &mut rng, -0.5, 0.5));
            let op = Op::Linalg(LinalgOp::Conv { window: window.clone(), group: cin, channels_last: true });
            y = g.add(op, &[y, w, b]).unwrap();
            cin *= mi;
        }
        g.set_outputs(vec![y]);
        let sets: Vec<Vec<Tensor>> = (0..2).map(|_| vec![random(&xs, &mut rng, -2.0, 2.0)]).collect();
        check_sets(&name, &g, &sets, 2);
    }
}

/// Weights that are a graph input are transposed on every call: new weights in the second
/// set must be used, not the first set's.
#[test]
fn input_weights_transposed_per_call() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(8191);
    let (c, m, k) = (19usize, 2usize, 3usize);
    let mut g = Graph::new("dwin");
    let xs = [1, 8, 10, c];
    let x = g.add_input("x", TensorType::fixed(DType::F32, &xs));
    let w = g.add_input("w", TensorType::fixed(DType::F32, &[c * m, 1, k, k]));
    let b = g.add_const("b", random(&[c * m], &mut rng, -0.5, 0.5));
    let window = Window { kernel: vec![k, k], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![1; 4]) };
    let y = g.add(Op::Linalg(LinalgOp::Conv { window, group: c, channels_last: true }), &[x, w, b]).unwrap();
    g.set_outputs(vec![y]);
    let sets: Vec<Vec<Tensor>> =
        (0..2).map(|_| vec![random(&xs, &mut rng, -2.0, 2.0), random(&[c * m, 1, k, k], &mut rng, -0.3, 0.3)]).collect();
    check_sets("input_weights", &g, &sets, 1);
}
