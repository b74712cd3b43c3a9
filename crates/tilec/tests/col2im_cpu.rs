//! `Col2Im` (PyTorch's `fold`) compiled for the CPU, against the reference interpreter on
//! fresh random inputs, every buffer poisoned before each run: blocks that tile the image
//! (MobileViT's patches folded back, with and without a ragged edge), overlapping blocks with
//! padding, strides and dilations, one and three spatial axes, and a fold fused after a
//! product and before an activation. None of it may fall back to the interpreter.

use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, CompileOptions};

mod poisoned;
use tilec_ir::op::{LinalgOp, UnaryOp};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType};

struct Fold {
    image: Vec<usize>,
    block: Vec<usize>,
    dil: Vec<usize>,
    pads: Vec<usize>,
    strides: Vec<usize>,
}

fn positions(f: &Fold) -> usize {
    let k = f.image.len();
    (0..k).map(|i| (f.image[i] + f.pads[i] + f.pads[k + i] - (f.dil[i] * (f.block[i] - 1) + 1)) / f.strides[i] + 1).product()
}

fn check(name: &str, batch: usize, c: usize, f: Fold, fused: bool) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.bytes().map(u64::from).sum::<u64>() * 17);
    let taps: usize = f.block.iter().product();
    let xs = [batch, c * taps, positions(&f)];
    let mut g = Graph::new("col2im");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &xs));
    let op = Op::Linalg(LinalgOp::Col2Im { image_shape: f.image, block_shape: f.block, dilations: f.dil, pads: f.pads, strides: f.strides });
    let y = if fused {
        // x · W first (the fold reads a product's output), a sigmoid after.
        let w: Vec<f32> = (0..xs[2] * xs[2]).map(|_| rng.gen_range(-0.2..0.2)).collect();
        let w = g.add_const("w", Tensor::from_vec(vec![xs[2], xs[2]], w).unwrap());
        let p = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
        let y = g.add(op, &[p]).unwrap();
        g.add(Op::Unary(UnaryOp::Sigmoid), &[y]).unwrap()
    } else {
        g.add(op, &[x]).unwrap()
    };
    g.set_outputs(vec![y]);
    let cache = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache");
    let mut cc = compile(&g, &CompileOptions { cache_dir: Some(cache), ..Default::default() }).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(cc.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", cc.report.fallbacks);
    let n: usize = xs.iter().product();
    let inputs = vec![Tensor::from_vec(xs.to_vec(), (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()).unwrap()];
    let want = poisoned::reference(&g, &inputs);
    poisoned::check_runs(name, &mut cc, &inputs, &want, 1e-5, 1e-5);
}

fn fold(image: &[usize], block: &[usize], dil: &[usize], pads: &[usize], strides: &[usize]) -> Fold {
    Fold { image: image.to_vec(), block: block.to_vec(), dil: dil.to_vec(), pads: pads.to_vec(), strides: strides.to_vec() }
}

#[test]
fn blocks_that_tile_the_image() {
    // MobileViT: 2x2 patches of a 32x32 map, 64 channels.
    check("patches", 1, 64, fold(&[32, 32], &[2, 2], &[1, 1], &[0; 4], &[2, 2]), false);
    // A ragged edge: 7x9 from 2x4 blocks (the last row and column of pixels are zeros).
    check("ragged", 2, 3, fold(&[7, 9], &[2, 4], &[1, 1], &[0; 4], &[2, 4]), false);
    check("patches_fused", 1, 8, fold(&[8, 8], &[2, 2], &[1, 1], &[0; 4], &[2, 2]), true);
}

#[test]
fn overlapping_blocks() {
    // 3x3 blocks at stride 1 with padding (unfold's inverse sums nine taps per pixel).
    check("same", 1, 4, fold(&[9, 11], &[3, 3], &[1, 1], &[1, 1, 1, 1], &[1, 1]), false);
    // Strides, dilations and asymmetric padding; the ONNX example's 5x5 image.
    check("strided_dilated", 2, 3, fold(&[10, 12], &[2, 3], &[2, 1], &[1, 0, 2, 1], &[2, 3]), false);
    check("onnx_example", 1, 1, fold(&[5, 5], &[1, 5], &[1, 1], &[0; 4], &[1, 1]), false);
    // One axis, and three (a 3-D fold).
    check("one_axis", 1, 5, fold(&[20], &[4], &[1], &[1, 2], &[3]), false);
    check("three_axes", 1, 2, fold(&[4, 5, 6], &[2, 2, 3], &[1, 1, 1], &[0, 1, 0, 0, 0, 1], &[1, 2, 2]), true);
}
