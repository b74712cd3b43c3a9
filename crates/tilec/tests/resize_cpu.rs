//! Linear resizes with half-pixel coordinates (a segmentation head's bilinear upsampling)
//! compiled for the CPU, against the reference interpreter on fresh random inputs, every
//! buffer poisoned before each run: integer and rational scales, one and two resized axes,
//! downsampling, a single input position, batches, channels-last (NHWC) and NCHW, and the
//! PyTorch half-pixel variant. A nearest resize stays on the interpreter.

use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, CompileOptions};

mod poisoned;
use tilec_ir::op::{CoordMode, LayoutOp, NearestMode, ResizeAttrs, ResizeMode};
use tilec_ir::{DType, Dim, Graph, Op, Tensor, TensorType};

fn random(shape: &[usize], rng: &mut impl Rng) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

fn graph(xs: &[usize], os: &[usize], mode: ResizeMode, coord: CoordMode) -> Graph {
    let mut g = Graph::new("resize");
    let x = g.add_input("x", TensorType::fixed(DType::F32, xs));
    let attrs = ResizeAttrs {
        mode,
        coord,
        nearest: NearestMode::RoundPreferFloor,
        cubic_a: -0.75,
        exclude_outside: false,
        antialias: false,
        extrapolation_value: 0.0,
        sizes: os.iter().map(|&d| Dim::Fixed(d)).collect(),
        scales: xs.iter().zip(os).map(|(&i, &o)| o as f64 / i as f64).collect(),
        roi: vec![],
    };
    let y = g.add(Op::Layout(LayoutOp::Resize(Box::new(attrs))), &[x]).unwrap();
    g.set_outputs(vec![y]);
    g
}

fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

fn check(name: &str, xs: &[usize], os: &[usize], coord: CoordMode) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.bytes().map(u64::from).sum::<u64>() * 31);
    let g = graph(xs, os, ResizeMode::Linear, coord);
    let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let mut c = compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    let inputs = vec![random(xs, &mut rng)];
    let want = poisoned::reference(&g, &inputs);
    poisoned::check_runs(name, &mut c, &inputs, &want, 1e-5, 1e-5);
}

#[test]
fn linear_half_pixel() {
    // DeepLab-V3's head: 21 channels from 1/16 of the image (here smaller), NCHW.
    check("x16", &[1, 21, 3, 4], &[1, 21, 48, 64], CoordMode::HalfPixel);
    // Rational scales (3/2, 7/5), a batch, a channels-last tensor.
    check("nhwc", &[2, 4, 5, 3], &[2, 6, 7, 3], CoordMode::HalfPixel);
    // One axis only, and downsampling.
    check("rows", &[1, 2, 6, 9], &[1, 2, 15, 9], CoordMode::HalfPixel);
    check("down", &[1, 3, 12, 10], &[1, 3, 4, 5], CoordMode::HalfPixel);
    // A single input position spread over a map (an ASPP pooling branch).
    check("one", &[1, 8, 1, 1], &[1, 8, 7, 7], CoordMode::HalfPixel);
    // One input row beside a resized axis; odd and even integer factors.
    check("row", &[1, 3, 1, 5], &[1, 3, 4, 10], CoordMode::HalfPixel);
    check("x3", &[1, 2, 5, 4], &[1, 2, 15, 12], CoordMode::HalfPixel);
    check("torch", &[1, 3, 4, 6], &[1, 3, 10, 9], CoordMode::PytorchHalfPixel);
}

#[test]
fn large_upsampling_runs_one_axis_at_a_time() {
    // Upsampling by 16 along both axes is split (`split-resizes`) into a resize along W and
    // one along H, which stay two kernels; by 2 it stays one.
    for (xs, os, kernels) in [([1, 21, 3, 4], [1, 21, 48, 64], 2), ([1, 4, 5, 6], [1, 4, 10, 12], 1)] {
        let g = graph(&xs, &os, ResizeMode::Linear, CoordMode::HalfPixel);
        let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
        let c = compile(&g, &opts).unwrap();
        assert!(c.report.fallbacks.is_empty(), "{:?}", c.report.fallbacks);
        assert_eq!(c.report.decisions.len(), kernels, "{xs:?} -> {os:?}: {:?}", c.report.decisions);
    }
}

#[test]
fn nearest_stays_on_the_interpreter() {
    let g = graph(&[1, 2, 3, 3], &[1, 2, 6, 6], ResizeMode::Nearest, CoordMode::Asymmetric);
    let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let c = compile(&g, &opts).unwrap();
    assert!(!c.report.fallbacks.is_empty(), "{:?}", c.report.decisions);
}
