//! Channels-last convolutions on the compiled CPU path, against the reference interpreter on
//! random weights and inputs: Winograd F(2×2, 3×3) and F(4×4, 3×3) for 3×3 stride-1 convs (odd and even
//! sizes, one and several blocks of tiles, asymmetric padding, fused residual add and ReLU),
//! the in-place (indirect) GEMM for the others, and the packed paths next to them.
//!
//! The light models' weights are constant fills, against which a wrong tile or channel can go
//! unnoticed; these graphs have random weights, and the arena is poisoned before each run.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, CompileOptions};
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp, NormOp, Padding, UnaryOp, Window};
use tilec_ir::{DType, Dim, Graph, Op, Tensor, TensorType, ValueId};

fn random(shape: &[usize], rng: &mut impl Rng, scale: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0) * scale).collect();
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

struct Conv {
    cout: usize,
    k: usize,
    stride: usize,
    pads: [usize; 4],
}

/// `x` (NCHW input) through a chain of convs with ReLU; a residual add where shapes allow.
/// Every conv sits between two others, so the CPU layout pass runs the chain channels-last.
fn chain(name: &str, x: [usize; 4], convs: &[Conv], rng: &mut impl Rng) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new(name);
    let xi = g.add_input("x", TensorType::fixed(DType::F32, &x));
    let mut cur: ValueId = xi;
    let mut shape = x;
    for (i, c) in convs.iter().enumerate() {
        let w = random(&[c.cout, shape[1], c.k, c.k], rng, 0.5 / ((shape[1] * c.k * c.k) as f32).sqrt());
        let w = g.add_const(&format!("w{i}"), w);
        let b = g.add_const(&format!("b{i}"), random(&[c.cout], rng, 0.5));
        let window = Window {
            kernel: vec![c.k, c.k],
            strides: vec![c.stride, c.stride],
            dilations: vec![1, 1],
            pads: Padding::Explicit(c.pads.to_vec()),
        };
        let y = g
            .add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: false }), &[cur, w, b])
            .unwrap();
        let oh = (shape[2] + c.pads[0] + c.pads[2] - c.k) / c.stride + 1;
        let ow = (shape[3] + c.pads[1] + c.pads[3] - c.k) / c.stride + 1;
        let out = [shape[0], c.cout, oh, ow];
        let y = if out == shape { g.add(Op::Binary(BinaryOp::Add), &[y, cur]).unwrap() } else { y };
        cur = g.add(Op::Unary(UnaryOp::Relu), &[y]).unwrap();
        shape = out;
    }
    g.set_outputs(vec![cur]);
    let inputs = vec![random(&x, rng, 1.0)];
    (g, inputs)
}

fn check(name: &str, x: [usize; 4], convs: &[Conv], want_winograd: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.len() as u64 * 7919);
    let (g, inputs) = chain(name, x, convs, &mut rng);
    check_graph(name, g, inputs, want_winograd);
}

fn conv_node(g: &mut Graph, x: ValueId, cin: usize, cout: usize, k: usize, i: usize, rng: &mut impl Rng) -> ValueId {
    let w = random(&[cout, cin, k, k], rng, 0.5 / ((cin * k * k) as f32).sqrt());
    let w = g.add_const(&format!("w{i}"), w);
    let b = g.add_const(&format!("b{i}"), random(&[cout], rng, 0.5));
    let p = k / 2;
    let window = Window { kernel: vec![k, k], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![p; 4]) };
    g.add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: false }), &[x, w, b]).unwrap()
}

/// DenseNet layers: the concatenation of all earlier outputs, batch-normalized and rectified
/// inside the 1×1 conv's operand (computed, contiguous along the channels: packed row by row
/// and read by the indirect micro-kernel), then a 3×3 conv (Winograd) adding 32 channels.
#[test]
fn dense_block_normalized_concatenations() {
    let (g, inputs) = dense_block(3, 11);
    check_graph("dense", g, inputs, 3);
}

/// A deeper dense block: from the sixth layer on the concatenation has more inputs than a
/// convolution folds in, so it is its own kernel (normalized and rectified on the way), cut
/// along the channels into one vector loop per input, and the 1×1 conv reads its result.
#[test]
fn deep_dense_block_materializes_its_concatenations() {
    let (g, inputs) = dense_block(7, 12);
    let cache = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache");
    let opts = CompileOptions { cache_dir: Some(cache), keep_ir: true, ..Default::default() };
    let c = compile(&g, &opts).unwrap();
    // Layers 5 to 7 concatenate 5 to 7 inputs: three kernels of their own, without a product.
    let alone: Vec<&String> = c.report.ir.iter().filter(|(n, l, _)| n.ends_with("_elementwise") && !l.contains("gemm")).map(|(n, _, _)| n).collect();
    assert_eq!(alone.len(), 3, "concatenations on their own: {alone:?}");
    check_graph("dense7", g, inputs, 7);
}

/// `layers` DenseNet layers over a 1×1 conv's 64 channels of 14×14 (batch norm and ReLU before
/// each 1×1 conv, a 3×3 conv adding 32 channels), the block's concatenation as the output.
fn dense_block(layers: usize, seed: u64) -> (Graph, Vec<Tensor>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut g = Graph::new("dense");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 64, 14, 14]));
    let mut feats = vec![conv_node(&mut g, x, 64, 64, 1, 0, &mut rng)];
    let mut c = 64;
    for l in 0..layers {
        let cat = if feats.len() == 1 {
            feats[0]
        } else {
            g.add(Op::Layout(LayoutOp::Concat { axis: 1 }), &feats).unwrap()
        };
        let mut bn_in = vec![cat];
        for (j, scale) in [1.0f32, 0.3, 0.5, 1.0].iter().enumerate() {
            let t = random(&[c], &mut rng, *scale);
            let t = if j == 3 { Tensor::from_vec(vec![c], t.to_f64_vec().iter().map(|v| (v.abs() + 0.5) as f32).collect()).unwrap() } else { t };
            bn_in.push(g.add_const(&format!("bn{l}_{j}"), t));
        }
        let bn = g.add(Op::Norm(NormOp::BatchNorm { epsilon: 1e-5, channels_last: false }), &bn_in).unwrap();
        let r = g.add(Op::Unary(UnaryOp::Relu), &[bn]).unwrap();
        let h = conv_node(&mut g, r, c, 64, 1, 100 + l, &mut rng);
        let h = g.add(Op::Unary(UnaryOp::Relu), &[h]).unwrap();
        let y = conv_node(&mut g, h, 64, 32, 3, 200 + l, &mut rng);
        feats.push(y);
        c += 32;
    }
    let out = g.add(Op::Layout(LayoutOp::Concat { axis: 1 }), &feats).unwrap();
    g.set_outputs(vec![out]);
    let inputs = vec![random(&[1, 64, 14, 14], &mut rng, 1.0)];
    (g, inputs)
}

fn check_graph(name: &str, g: Graph, inputs: Vec<Tensor>, want_winograd: usize) {
    check_with(name, g, inputs, want_winograd, true)
}

fn check_with(name: &str, g: Graph, inputs: Vec<Tensor>, want_winograd: usize, winograd: bool) {
    let cache = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache");
    let opts = CompileOptions { cache_dir: Some(cache), keep_ir: true, winograd, ..Default::default() };
    let mut c = compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    let winograd = c.report.ir.iter().filter(|(_, lowered, _)| lowered.contains("gemm[16 x") || lowered.contains("gemm[36 x")).count();
    assert_eq!(winograd, want_winograd, "{name}: Winograd kernels");
    let names: Vec<String> = g.inputs().iter().map(|&v| g.value(v).name.clone()).collect();
    let want = tilec_ref::run_named(&g, names.into_iter().zip(inputs.clone()).collect::<HashMap<_, _>>())
        .unwrap()
        .remove(0);
    for run in 0..2 {
        c.poison().unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = c.run(&inputs).unwrap_or_else(|e| panic!("{name}: {e}")).remove(0);
        assert_eq!(got.shape(), want.shape(), "{name}");
        let (w, o) = (want.to_f64_vec(), got.to_f64_vec());
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1.0);
        for (i, (a, b)) in w.iter().zip(&o).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * scale + 1e-4 * a.abs(),
                "{name} run {run}: element {i}: reference {a}, compiled {b}"
            );
        }
    }
}

fn conv(cout: usize, k: usize, stride: usize, p: usize) -> Conv {
    Conv { cout, k, stride, pads: [p; 4] }
}

#[test]
fn winograd_even_sizes_several_blocks() {
    // 56×56 output: 28 rows of 28 tiles, several blocks; 64 → 64 channels with a residual.
    check("w56", [1, 64, 56, 56], &[conv(64, 1, 1, 0), conv(64, 3, 1, 1), conv(64, 1, 1, 0)], 1);
}

/// An image's first convolutions (3 channels, padded and not, strided): the channels-last
/// copy (`pad-thin-convs`) is materialized and the conv reads it in place.
#[test]
fn first_convolutions_over_three_channels() {
    check("first7", [1, 3, 45, 45], &[conv(32, 7, 2, 3), conv(32, 1, 1, 0), conv(32, 3, 1, 1)], 1);
    check("first3", [2, 3, 33, 31], &[conv(16, 3, 1, 1), conv(32, 3, 2, 0), conv(32, 1, 1, 0)], 0);
    check("first11", [1, 3, 51, 51], &[conv(48, 11, 4, 0), conv(32, 1, 1, 0)], 0);
}

#[test]
fn winograd_can_be_turned_off() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (g, inputs) = chain("off", [1, 32, 28, 28], &[conv(32, 1, 1, 0), conv(32, 3, 1, 1), conv(32, 1, 1, 0)], &mut rng);
    check_with("off", g, inputs, 0, false);
}

#[test]
fn winograd_odd_sizes_and_padding() {
    // 27×27 (the last tile row and column have one pixel), then asymmetric padding; 48
    // output channels (a three-vector register tile).
    check(
        "w27",
        [1, 24, 27, 27],
        &[
            conv(32, 1, 1, 0),
            conv(48, 3, 1, 1),
            Conv { cout: 32, k: 3, stride: 1, pads: [0, 1, 1, 0] },
            conv(16, 1, 1, 0),
        ],
        2,
    );
}

#[test]
fn winograd_batch_and_single_block() {
    // Two images of 12×12: one block of tiles spanning both.
    check("w12", [2, 32, 12, 12], &[conv(32, 1, 1, 0), conv(32, 3, 1, 1), conv(32, 1, 1, 0)], 1);
}

#[test]
fn direct_convs_channels_last() {
    // Strided 3×3 and 1×1, a 5×5, and too few tiles for Winograd (7×7 output).
    check(
        "direct",
        [1, 32, 15, 15],
        &[conv(32, 1, 1, 0), conv(64, 3, 2, 1), conv(64, 3, 1, 1), conv(48, 5, 1, 2), conv(32, 1, 1, 0)],
        0,
    );
}

/// A super-resolution head: 3×3 convs (Winograd), the second's output through a pixel shuffle
/// (reshape, transpose, reshape, as exporters write it) into the model's output. The shuffle
/// runs in the Winograd kernel's epilogue, once per pixel of a tile: each pixel must not read
/// the others' outputs from the conv's buffer before they are stored there.
#[test]
fn winograd_into_a_pixel_shuffle() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let mut g = Graph::new("shuffle");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[1, 32, 16, 16]));
    let h = conv_node(&mut g, x, 32, 32, 3, 0, &mut rng);
    let h = g.add(Op::Unary(UnaryOp::Relu), &[h]).unwrap();
    let y = conv_node(&mut g, h, 32, 128, 3, 1, &mut rng);
    let y = g.add(Op::Layout(LayoutOp::Reshape { shape: [1, 32, 2, 2, 16, 16].map(Dim::Fixed).to_vec() }), &[y]).unwrap();
    let y = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![0, 1, 4, 2, 5, 3] }), &[y]).unwrap();
    let y = g.add(Op::Layout(LayoutOp::Reshape { shape: [1, 32, 32, 32].map(Dim::Fixed).to_vec() }), &[y]).unwrap();
    g.set_outputs(vec![y]);
    let inputs = vec![random(&[1, 32, 16, 16], &mut rng, 1.0)];
    check_graph("shuffle", g, inputs, 2);
}
