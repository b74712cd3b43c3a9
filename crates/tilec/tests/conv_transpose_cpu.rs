//! Transposed convolutions on the compiled CPU path (`cpu.conv_transpose`: one matrix product
//! per output phase), against the reference interpreter on fresh random weights and inputs,
//! the arena poisoned before each run: 1-, 2- and 3-D; strides 1, 2 and 3; kernels equal to,
//! a multiple of, not a multiple of, and shorter than the stride; symmetric, asymmetric and
//! negative pads; output padding; odd sizes and channel counts; groups; batches; and the
//! epilogues (ReLU, tanh, a residual add). Every case asserts whether the family builds the
//! convolution; dilated and depthwise ones are refused with a reason and stay correct.

use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, CompileOptions};

mod poisoned;
use poisoned::random;
use tilec_ir::op::{BinaryOp, LinalgOp, UnaryOp};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType};

const FAMILY: &str = "cpu.conv_transpose";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    None,
    Relu,
    Tanh,
}

#[derive(Clone, Debug)]
struct Case {
    n: usize,
    cin: usize,
    cout: usize,
    /// Spatial input sizes (their count is the rank).
    size: Vec<usize>,
    k: usize,
    stride: usize,
    dil: usize,
    /// begin..., end... (may be negative).
    pads: Vec<i64>,
    out_pad: usize,
    group: usize,
    act: Act,
    residual: bool,
}

fn case(cin: usize, cout: usize, size: &[usize], k: usize, stride: usize, p: i64) -> Case {
    Case {
        n: 1,
        cin,
        cout,
        size: size.to_vec(),
        k,
        stride,
        dil: 1,
        pads: vec![p; 2 * size.len()],
        out_pad: 0,
        group: 1,
        act: Act::None,
        residual: false,
    }
}

/// One channels-first transposed convolution, its activation and residual add.
fn graph(t: &Case, rng: &mut impl Rng) -> (Graph, Vec<Tensor>) {
    let nd = t.size.len();
    let mut g = Graph::new("convt");
    let mut xs = vec![t.n, t.cin];
    xs.extend(&t.size);
    let x = g.add_input("x", TensorType::fixed(DType::F32, &xs));
    let mut ws = vec![t.cin, t.cout / t.group];
    ws.extend(std::iter::repeat_n(t.k, nd));
    let scale = 1.0 / ((t.cin / t.group) as f32).sqrt();
    let w = g.add_const("w", random(&ws, rng, -scale, scale));
    let b = g.add_const("b", random(&[t.cout], rng, -0.5, 0.5));
    let op = LinalgOp::ConvTranspose {
        kernel: vec![t.k; nd],
        strides: vec![t.stride; nd],
        dilations: vec![t.dil; nd],
        pads: t.pads.clone(),
        output_padding: vec![t.out_pad; nd],
        group: t.group,
    };
    let mut y = g.add(Op::Linalg(op), &[x, w, b]).unwrap();
    y = match t.act {
        Act::None => y,
        Act::Relu => g.add(Op::Unary(UnaryOp::Relu), &[y]).unwrap(),
        Act::Tanh => g.add(Op::Unary(UnaryOp::Tanh), &[y]).unwrap(),
    };
    let mut inputs = vec![random(&xs, rng, -2.0, 2.0)];
    if t.residual {
        let os: Vec<usize> = g.value(y).ty.fixed_shape().unwrap();
        let r = g.add_input("r", TensorType::fixed(DType::F32, &os));
        y = g.add(Op::Binary(BinaryOp::Add), &[y, r]).unwrap();
        inputs.push(random(&os, rng, -1.0, 1.0));
    }
    g.set_outputs(vec![y]);
    (g, inputs)
}

fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

/// Compiles `g`, asserts whether the family builds its transposed convolution (and, if not,
/// that it says `refused`), and compares two poisoned runs with the reference.
fn check_graph(name: &str, g: &Graph, inputs: &[Tensor], taken: bool, refused: &str) {
    let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let mut c = compile(g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    let ours = c.report.decisions.iter().filter(|(_, d)| d.family == FAMILY).count();
    assert_eq!(ours, usize::from(taken), "{name}: families {:?}", c.report.decisions);
    if !taken {
        let reasons: Vec<&String> = c
            .report
            .decisions
            .iter()
            .flat_map(|(_, d)| d.rejected.iter().filter(|(f, _)| *f == FAMILY).map(|(_, r)| r))
            .collect();
        assert!(reasons.iter().any(|r| r.contains(refused)), "{name}: {reasons:?}");
    }
    let want = poisoned::reference(g, inputs);
    poisoned::check_runs(name, &mut c, inputs, &want, 1e-4, 1e-4);
}

fn check(name: &str, t: Case) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.bytes().map(u64::from).sum::<u64>() * 7919);
    let (g, inputs) = graph(&t, &mut rng);
    check_graph(name, &g, &inputs, true, "");
}

fn refused(name: &str, t: Case, why: &str) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.bytes().map(u64::from).sum::<u64>() * 7919);
    let (g, inputs) = graph(&t, &mut rng);
    check_graph(name, &g, &inputs, false, why);
}

#[test]
fn decoders_2d() {
    // UNet: 2×2 stride 2 (every phase one tap); DCGAN: 4×4 stride 2 pad 1; FCN-style 3×3
    // stride 2 with output padding (phases of one and two taps per axis).
    check("unet", Case { act: Act::Relu, ..case(32, 16, &[8, 8], 2, 2, 0) });
    // Phases that read the input alike, stacked as rows of one product: 4×4 stride 2 without
    // padding (taps past the input's edges), 3×3 stride 3 with groups and a batch.
    check("stacked_k4s2", Case { residual: true, ..case(12, 20, &[5, 7], 4, 2, 0) });
    check("stacked_groups", Case { n: 2, group: 3, act: Act::Relu, ..case(24, 18, &[4, 3], 3, 3, 0) });
    check("dcgan", Case { act: Act::Relu, ..case(24, 16, &[7, 7], 4, 2, 1) });
    check("k3s2op1", Case { out_pad: 1, act: Act::Relu, ..case(16, 24, &[9, 7], 3, 2, 1) });
    // DCGAN's first layer (1×1 input, stride 1) and its last (three channels, tanh).
    check("from_pixel", Case { act: Act::Relu, ..case(20, 16, &[1, 1], 4, 1, 0) });
    // From one position with pads (past the kernel and negative), groups and a batch.
    check("pixel_pads", Case { n: 2, group: 2, residual: true, pads: vec![1, -1, 0, 2], ..case(12, 10, &[1, 1], 3, 2, 0) });
    check("pixel_1d", Case { act: Act::Tanh, ..case(9, 7, &[1], 5, 3, 1) });
    check("rgb_tanh", Case { act: Act::Tanh, ..case(16, 3, &[6, 5], 4, 2, 1) });
}

#[test]
fn ragged_2d() {
    // Odd sizes and channels, stride 3 with a kernel not a multiple of it, asymmetric pads.
    check("s3k5", Case { pads: vec![2, 0, 1, 3], ..case(13, 7, &[5, 6], 5, 3, 0) });
    check("s3k3", Case { residual: true, ..case(11, 9, &[4, 7], 3, 3, 0) });
    // A kernel shorter than the stride: some phases are the bias alone.
    check("s3k2", Case { act: Act::Relu, ..case(8, 8, &[5, 4], 2, 3, 0) });
    // Stride 1: one phase, an ordinary convolution of the flipped kernel.
    check("s1k3", Case { residual: true, ..case(12, 10, &[6, 9], 3, 1, 1) });
    // A batch, groups, output padding and a residual add.
    check("batch_groups", Case { n: 2, group: 2, out_pad: 1, residual: true, ..case(16, 12, &[5, 5], 3, 2, 1) });
    // Pads larger than the kernel reach: outputs far from every input.
    check("bigpad", case(8, 8, &[6, 6], 3, 2, 3));
}

#[test]
fn one_and_three_d() {
    check("ct1_k4s2p1", Case { act: Act::Relu, ..case(16, 12, &[33], 4, 2, 1) });
    check("ct1_k3s2op1", Case { out_pad: 1, ..case(9, 16, &[17], 3, 2, 1) });
    check("ct1_k7s3p2", Case { n: 2, residual: true, ..case(12, 8, &[11], 7, 3, 2) });
    // A negative pad (an `output_shape` longer than the natural one).
    check("ct1_negpad", Case { pads: vec![-1, -2], ..case(8, 8, &[10], 4, 2, 0) });
    check("ct3_k2s2", Case { act: Act::Relu, ..case(8, 8, &[3, 4, 5], 2, 2, 0) });
}

/// Dilated and depthwise transposed convolutions stay with the direct nest, with a reason.
#[test]
fn refusals_name_a_reason() {
    refused("dilated", Case { dil: 2, ..case(8, 8, &[6, 6], 3, 2, 1) }, "dilations");
    refused("depthwise", Case { group: 8, ..case(8, 8, &[6, 6], 4, 2, 1) }, "too small for a matrix product");
}
