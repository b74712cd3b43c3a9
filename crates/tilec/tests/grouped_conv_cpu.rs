//! Grouped and dilated convolutions on the compiled CPU path, against the reference
//! interpreter on fresh random weights and inputs, every buffer poisoned before each run:
//! 2 to 64 input channels per group (ResNeXt's 4 to 32, RegNet's 8 and 16), output channels
//! per group equal to or twice the input's, odd sizes, strides 1 and 2, symmetric and
//! asymmetric padding, dilations 2 and 3 and dilations far beyond the input (taps that read
//! only padding), batches, the fused epilogues (batch norm, ReLU, residual add), and weights
//! that are a graph input. The cases assert which family builds the convolution:
//! `cpu.depthwise` for at least a vector's lanes (16 with AVX-512, 8 with AVX2) of groups of
//! at most 8 channels, `cpu.grouped` wherever fewer groups of fewer output channels than a
//! vector can be merged, `cpu.group_direct` for groups of whole vectors of output channels
//! and at most 32 input channels, the GEMM family for deeper groups, and a dilated depthwise
//! convolution of an NCHW graph entered by two inputs is still run channels-last by
//! `cpu.depthwise`.

use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, CompileOptions};

mod poisoned;
use poisoned::random;
use tilec_ir::op::{BinaryOp, LinalgOp, NormOp, Padding, UnaryOp, Window};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType, ValueId};

#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    h: usize,
    w: usize,
    groups: usize,
    /// Input and output channels per group.
    cg: usize,
    mg: usize,
    k: usize,
    stride: usize,
    dil: usize,
    /// top, left, bottom, right
    pads: [usize; 4],
    bn: bool,
    relu: bool,
    residual: bool,
    /// The weights a graph input instead of a constant.
    input_weights: bool,
}

fn case(groups: usize, cg: usize, h: usize, w: usize, stride: usize) -> Case {
    Case {
        n: 1,
        h,
        w,
        groups,
        cg,
        mg: cg,
        k: 3,
        stride,
        dil: 1,
        pads: [1; 4],
        bn: false,
        relu: false,
        residual: false,
        input_weights: false,
    }
}

fn out_size(i: usize, k: usize, s: usize, d: usize, pb: usize, pe: usize) -> usize {
    (i + pb + pe - (k - 1) * d - 1) / s + 1
}

/// One channels-last grouped conv and its epilogue, with its inputs.
fn graph(t: &Case, rng: &mut impl Rng) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new("grouped");
    let (cin, cout) = (t.groups * t.cg, t.groups * t.mg);
    let xs = [t.n, t.h, t.w, cin];
    let x = g.add_input("x", TensorType::fixed(DType::F32, &xs));
    let ws = [cout, t.cg, t.k, t.k];
    let scale = 1.5 / ((t.cg * t.k * t.k) as f32).sqrt();
    let wv = random(&ws, rng, -scale, scale);
    let mut inputs = vec![random(&xs, rng, -2.0, 2.0)];
    let w = if t.input_weights {
        inputs.push(wv);
        g.add_input("w", TensorType::fixed(DType::F32, &ws))
    } else {
        g.add_const("w", wv)
    };
    let b = g.add_const("b", random(&[cout], rng, -0.5, 0.5));
    let window = Window {
        kernel: vec![t.k, t.k],
        strides: vec![t.stride, t.stride],
        dilations: vec![t.dil, t.dil],
        pads: Padding::Explicit(t.pads.to_vec()),
    };
    let mut y = g.add(Op::Linalg(LinalgOp::Conv { window, group: t.groups, channels_last: true }), &[x, w, b]).unwrap();
    if t.bn {
        let mut ins = vec![y];
        for (j, (lo, hi)) in [(0.5, 1.5), (-0.3, 0.3), (-0.2, 0.2), (0.5, 1.5)].into_iter().enumerate() {
            ins.push(g.add_const(&format!("bn{j}"), random(&[cout], rng, lo, hi)));
        }
        y = g.add(Op::Norm(NormOp::BatchNorm { epsilon: 1e-5, channels_last: true }), &ins).unwrap();
    }
    if t.relu {
        y = g.add(Op::Unary(UnaryOp::Relu), &[y]).unwrap();
    }
    if t.residual {
        let oh = out_size(t.h, t.k, t.stride, t.dil, t.pads[0], t.pads[2]);
        let ow = out_size(t.w, t.k, t.stride, t.dil, t.pads[1], t.pads[3]);
        let r = g.add_input("r", TensorType::fixed(DType::F32, &[t.n, oh, ow, cout]));
        y = g.add(Op::Binary(BinaryOp::Add), &[y, r]).unwrap();
        inputs.push(random(&[t.n, oh, ow, cout], rng, -1.0, 1.0));
    }
    g.set_outputs(vec![y]);
    (g, inputs)
}

/// Vector lanes of f32 on this machine (16 with AVX-512, 8 with AVX2).
fn lanes() -> i64 {
    tilec_opt::target::CpuTarget::host().lanes(DType::F32)
}

/// The family of few groups of 8 output channels: a whole vector with AVX2
/// (`cpu.group_direct`), merged two at a time with AVX-512 (`cpu.grouped`).
fn eight_out() -> &'static str {
    if lanes() == 8 {
        "cpu.group_direct"
    } else {
        "cpu.grouped"
    }
}

fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

/// Compiles `g`, asserts that its one convolution kernel is `family`'s, and compares two
/// poisoned runs with the reference; returns the reasons other families gave.
fn check_graph(name: &str, g: &Graph, inputs: &[Tensor], family: &str) -> Vec<(String, String)> {
    let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let mut c = compile(g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    let convs: Vec<_> = c.report.decisions.iter().filter(|(k, _)| k.contains("conv")).collect();
    assert_eq!(convs.len(), 1, "{name}: {:?}", c.report.decisions);
    assert_eq!(convs[0].1.family, family, "{name}: {:?}", convs[0].1);
    let rejected = convs[0].1.rejected.iter().map(|(f, r)| (f.to_string(), r.clone())).collect();
    let want = poisoned::reference(g, inputs);
    poisoned::check_runs(name, &mut c, inputs, &want, 1e-4, 1e-4);
    rejected
}

fn check(name: &str, t: Case, family: &str) -> Vec<(String, String)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.bytes().map(u64::from).sum::<u64>() * 7919);
    let (g, inputs) = graph(&t, &mut rng);
    check_graph(name, &g, &inputs, family)
}

#[test]
fn few_channels_per_group() {
    // ResNeXt-50's first stages: 32 groups of 4 and of 8, a stride-2 block, the epilogues: a
    // vector lane per group (the groups of 8 a whole vector each with AVX2).
    check("rx4", Case { bn: true, relu: true, ..case(32, 4, 9, 11, 1) }, "cpu.depthwise");
    let rx8 = if lanes() == 8 { "cpu.group_direct" } else { "cpu.depthwise" };
    check("rx8s2", Case { relu: true, residual: true, ..case(32, 8, 13, 17, 2) }, rx8);
    check("cg2", Case { n: 2, ..case(16, 2, 7, 5, 1) }, "cpu.depthwise");
    // Fewer groups than lanes (8 with AVX2): two and three channels per group merged 4 and 2
    // (AVX2) or 4 and 3 (AVX-512) at a time, ragged sizes, a batch.
    check("cg2few", Case { n: 2, ..case(4, 2, 7, 5, 1) }, "cpu.grouped");
    check("cg3", Case { pads: [0, 1, 2, 0], ..case(6, 3, 10, 9, 2) }, "cpu.grouped");
    // More output channels than input channels per group.
    check("cg4m8", Case { mg: 8, bn: true, ..case(6, 4, 8, 8, 1) }, eight_out());
    // Groups that do not divide into whole vectors: 6 groups of 4 merge 3 at a time.
    check("g6", case(6, 4, 6, 7, 1), "cpu.grouped");
}

#[test]
fn dilated_grouped() {
    check("cg4d2", Case { dil: 2, pads: [2; 4], relu: true, ..case(4, 4, 12, 10, 1) }, "cpu.grouped");
    check("cg8d3s2", Case { dil: 3, pads: [3, 2, 3, 1], ..case(4, 8, 15, 18, 2) }, eight_out());
}

#[test]
fn weights_as_input() {
    // Block-diagonal weights built from an input on every call.
    check("inw", Case { input_weights: true, ..case(4, 4, 6, 6, 1) }, "cpu.grouped");
}

#[test]
fn deep_groups_stay_gemm() {
    // 64 input channels per group: products deep enough for the GEMM family's panels.
    let why = check("cg64s2", Case { residual: true, ..case(2, 64, 9, 9, 2) }, "cpu.blis_gemm");
    assert!(why.iter().any(|(f, r)| f == "cpu.group_direct" && r.contains("more than 32")), "{why:?}");
    assert!(why.iter().any(|(f, r)| f == "cpu.grouped" && r.contains("nothing to merge")), "{why:?}");
}

#[test]
fn whole_vector_groups_direct() {
    // RegNet-X's groups of 16 (2, 4, 10 and 25 groups, fewer than a vector's lanes but for
    // the last) and ResNeXt-50's 32 groups of 16 and 32: vectorized within each group. The
    // strided cases have output rows of at least 12 pixels, a block with AVX-512.
    let gd = "cpu.group_direct";
    check("gd16", Case { bn: true, relu: true, ..case(4, 16, 7, 9, 1) }, gd);
    check("gd16s2", Case { relu: true, residual: true, ..case(10, 16, 13, 25, 2) }, gd);
    check("gd16x32", Case { n: 2, bn: true, ..case(32, 16, 6, 5, 1) }, gd);
    check("gd32", Case { pads: [0, 1, 2, 0], ..case(3, 32, 9, 10, 1) }, gd);
    check("gd32s2", Case { relu: true, ..case(5, 32, 8, 27, 2) }, gd);
    // More output channels than input channels per group, fewer input channels than a
    // vector, an odd group count.
    check("gd4m16", Case { mg: 16, ..case(3, 4, 11, 9, 1) }, gd);
    check("gd8m32s2", Case { mg: 32, pads: [1, 0, 0, 1], ..case(5, 8, 9, 26, 2) }, gd);
    // Dilation, a 5x5 and a 1x1 window, a map all border (every column's window reaches the
    // padding), the weights a graph input (transposed on every call).
    check("gd16d2", Case { dil: 2, pads: [2; 4], ..case(3, 16, 10, 11, 1) }, gd);
    check("gd16k5", Case { k: 5, pads: [2; 4], relu: true, ..case(2, 16, 8, 9, 1) }, gd);
    check("gd16k1", Case { k: 1, pads: [0; 4], ..case(2, 16, 5, 7, 1) }, gd);
    check("gd16tiny", case(2, 16, 2, 1, 1), gd);
    check("gd16inw", Case { input_weights: true, ..case(2, 16, 6, 7, 1) }, gd);
    // Output channels per group that are not whole vectors are not this family's.
    let why = check("gd12", case(4, 12, 6, 6, 1), "cpu.blis_gemm");
    assert!(why.iter().any(|(f, r)| f == gd && r.contains("not whole vectors")), "{why:?}");
    // Strided into rows shorter than a block: the GEMM family's.
    let why = check("gd16s2short", case(4, 16, 13, 11, 2), "cpu.blis_gemm");
    assert!(why.iter().any(|(f, r)| f == gd && r.contains("shorter than a block")), "{why:?}");
}

#[test]
fn dilated_dense() {
    // Dilations 2 and 3 on a full convolution.
    check("d2", Case { dil: 2, pads: [2; 4], relu: true, ..case(1, 32, 11, 13, 1) }, "cpu.blis_gemm");
    check("d3s2", Case { dil: 3, pads: [3; 4], bn: true, ..case(1, 24, 14, 15, 2) }, "cpu.blis_gemm");
    // An ASPP branch: dilation 12 over a 7x9 map (padding 12), whose outer taps read only
    // padding along H, and dilation 6 over it, whose taps all read the input somewhere.
    check("d12", Case { dil: 12, pads: [12; 4], relu: true, ..case(1, 32, 7, 9, 1) }, "cpu.blis_gemm");
    check("d6", Case { dil: 6, pads: [6; 4], residual: true, ..case(1, 32, 7, 9, 1) }, "cpu.blis_gemm");
    // DeepLab-V3's ASPP branch: dilation 12 over 14x14, every tap live somewhere but most
    // row tiles meeting only padding through the outer taps (skipped as a whole), a batch.
    check("d12of14", Case { n: 2, dil: 12, pads: [12; 4], relu: true, ..case(1, 64, 14, 14, 1) }, "cpu.blis_gemm");
    // Dead taps on one side only.
    check("d5asym", Case { dil: 5, pads: [5, 0, 1, 5], ..case(1, 32, 6, 8, 1) }, "cpu.blis_gemm");
}

fn conv_nchw(g: &mut Graph, rng: &mut impl Rng, x: ValueId, cin: usize, cout: usize, group: usize, dil: usize, i: usize) -> ValueId {
    let scale = 1.5 / ((cin / group * 9) as f32).sqrt();
    let w = g.add_const(&format!("w{i}"), random(&[cout, cin / group, 3, 3], rng, -scale, scale));
    let b = g.add_const(&format!("b{i}"), random(&[cout], rng, -0.3, 0.3));
    let window = Window { kernel: vec![3, 3], strides: vec![1, 1], dilations: vec![dil, dil], pads: Padding::Explicit(vec![dil; 4]) };
    let y = g.add(Op::Linalg(LinalgOp::Conv { window, group, channels_last: false }), &[x, w, b]).unwrap();
    g.add(Op::Unary(UnaryOp::Relu), &[y]).unwrap()
}

/// An NCHW graph as a segmentation backbone's dilated stage: conv, dilated depthwise conv,
/// a second input added, a dilated conv. Its region is entered twice and left once, within
/// the layout plan's budget of one transpose per conv: it runs channels-last and the
/// dilated depthwise conv is `cpu.depthwise`'s.
#[test]
fn dilated_region_with_two_inputs_runs_channels_last() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let (c, h, w) = (32, 11, 12);
    let mut g = Graph::new("seg");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, c, h, w]));
    let s = g.add_input("s", TensorType::fixed(DType::F32, &[1, c, h, w]));
    let a = conv_nchw(&mut g, &mut rng, x, c, c, 1, 1, 0);
    let d = conv_nchw(&mut g, &mut rng, a, c, c, c, 2, 1);
    let d = g.add(Op::Binary(BinaryOp::Add), &[d, s]).unwrap();
    let y = conv_nchw(&mut g, &mut rng, d, c, c, 1, 3, 2);
    g.set_outputs(vec![y]);
    let inputs = vec![random(&[1, c, h, w], &mut rng, -1.0, 1.0), random(&[1, c, h, w], &mut rng, -1.0, 1.0)];
    let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let mut comp = compile(&g, &opts).unwrap();
    let dw = comp.report.decisions.iter().filter(|(_, d)| d.family == "cpu.depthwise").count();
    assert_eq!(dw, 1, "{:?}", comp.report.decisions);
    let want = poisoned::reference(&g, &inputs);
    poisoned::check_runs("seg", &mut comp, &inputs, &want, 1e-4, 1e-4);
}

#[test]
fn dilated_winograd() {
    // Dilations 2, 3 and 4 over maps whose phases hold 8 to 18 outputs (a segmentation
    // backbone's dilated stages): Winograd phase by phase, ragged phases, a batch, the
    // epilogues.
    check("w2", Case { dil: 2, pads: [2; 4], relu: true, ..case(1, 32, 16, 18, 1) }, "cpu.winograd");
    check("w2odd", Case { n: 2, dil: 2, pads: [2; 4], bn: true, residual: true, ..case(1, 48, 35, 33, 1) }, "cpu.winograd");
    check("w3", Case { dil: 3, pads: [3, 2, 1, 3], ..case(1, 32, 34, 33, 1) }, "cpu.winograd");
    check("w4", Case { dil: 4, pads: [4; 4], relu: true, ..case(1, 64, 32, 32, 1) }, "cpu.winograd");
    // Phases too short (4 and 5 outputs) or too ragged for whole tiles (7 of 8) stay GEMMs.
    check("w2dy", Case { dil: 2, pads: [2; 4], ..case(1, 32, 9, 11, 1) }, "cpu.blis_gemm");
    check("w4of28", Case { dil: 4, pads: [4; 4], ..case(1, 32, 28, 28, 1) }, "cpu.blis_gemm");
}
