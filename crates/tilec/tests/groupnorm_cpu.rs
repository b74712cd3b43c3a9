//! Group and instance normalizations on the compiled CPU path, against the reference
//! interpreter on fresh random inputs, the arena poisoned before each run: 1-D, 2-D and 3-D
//! spatial shapes, groups of one channel (instance norms) up to all channels in one group,
//! spatial sizes that are not a multiple of the vector width, batches, inputs that arrive
//! channels-last (a transpose before the norm), the fused SiLU and GELU epilogues, and the
//! exporter's spelling of a group norm (an instance norm between reshapes, then the
//! per-channel affine), which the optimizer turns into one `GroupNorm`; and the shapes whose
//! loops the schedule fuses over a group's contiguous span.

use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, CompileOptions};

mod poisoned;
use poisoned::random;
use tilec_ir::op::{BinaryOp, LayoutOp, NormOp, UnaryOp};
use tilec_ir::{DType, Dim, Graph, Op, Tensor, TensorType};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Form {
    /// One `GroupNorm` op.
    Native,
    /// `InstanceNorm` between reshapes, then `* gamma + beta`.
    Exported,
    /// The input arrives `[N, *S, C]` and is transposed to `[N, C, *S]` first.
    ChannelsLast,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    None,
    Silu,
    Gelu,
}

fn fixed(s: &[usize]) -> Vec<Dim> {
    s.iter().map(|&d| Dim::Fixed(d)).collect()
}

/// A group norm of `x: [N, C, *S]` (`xs`) in `groups` groups, in `form`, then `act`.
fn graph(xs: &[usize], groups: usize, form: Form, act: Act, rng: &mut impl Rng) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new("gn");
    let (n, c) = (xs[0], xs[1]);
    let mut in_shape = xs.to_vec();
    if form == Form::ChannelsLast {
        in_shape.remove(1);
        in_shape.push(c);
    }
    let x0 = g.add_input("x", TensorType::fixed(DType::F32, &in_shape));
    let x = if form == Form::ChannelsLast {
        let r = xs.len();
        let mut perm = vec![0, r - 1];
        perm.extend(1..r - 1);
        g.add(Op::Layout(LayoutOp::Transpose { perm }), &[x0]).unwrap()
    } else {
        x0
    };
    let mut y = if form == Form::Exported {
        let rest: usize = xs[1..].iter().product::<usize>() / groups;
        let xr = g.add(Op::Layout(LayoutOp::Reshape { shape: fixed(&[n, groups, rest]) }), &[x]).unwrap();
        let ones = g.add_const("ones", Tensor::from_vec(vec![groups], vec![1.0f32; groups]).unwrap());
        let zeros = g.add_const("zeros", Tensor::from_vec(vec![groups], vec![0.0f32; groups]).unwrap());
        let inorm = g.add(Op::Norm(NormOp::InstanceNorm { epsilon: 1e-5 }), &[xr, ones, zeros]).unwrap();
        let back = g.add(Op::Layout(LayoutOp::Reshape { shape: fixed(xs) }), &[inorm]).unwrap();
        let mut ps = vec![c];
        ps.extend(std::iter::repeat(1).take(xs.len() - 2));
        let gamma = g.add_const("gamma", random(&ps, rng, 0.5, 1.5));
        let beta = g.add_const("beta", random(&ps, rng, -0.5, 0.5));
        let m = g.add(Op::Binary(BinaryOp::Mul), &[back, gamma]).unwrap();
        g.add(Op::Binary(BinaryOp::Add), &[m, beta]).unwrap()
    } else {
        let gamma = g.add_const("gamma", random(&[c], rng, 0.5, 1.5));
        let beta = g.add_const("beta", random(&[c], rng, -0.5, 0.5));
        let op = NormOp::GroupNorm { num_groups: groups, epsilon: 1e-5, channels_last: false };
        g.add(Op::Norm(op), &[x, gamma, beta]).unwrap()
    };
    y = match act {
        Act::None => y,
        Act::Silu => {
            let s = g.add(Op::Unary(UnaryOp::Sigmoid), &[y]).unwrap();
            g.add(Op::Binary(BinaryOp::Mul), &[y, s]).unwrap()
        }
        Act::Gelu => g.add(Op::Unary(UnaryOp::Gelu { tanh_approx: false }), &[y]).unwrap(),
    };
    g.set_outputs(vec![y]);
    // Offset inputs: a mean far from 0 is where a one-pass variance would lose digits.
    (g, vec![random(&in_shape, rng, 1.0, 5.0)])
}

fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

fn check(name: &str, xs: &[usize], groups: usize, form: Form, act: Act) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.bytes().map(u64::from).sum::<u64>() * 7919);
    let (g, inputs) = graph(xs, groups, form, act, &mut rng);
    let opts = CompileOptions { cache_dir: Some(cache()), ..Default::default() };
    let mut c = compile(&g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    let want = poisoned::reference(&g, &inputs);
    poisoned::check_runs(name, &mut c, &inputs, &want, 2e-5, 2e-5);
}

#[test]
fn native_group_norms() {
    // Ragged groups: 3 channels each over 5x7, a batch.
    check("g4_5x7", &[2, 12, 5, 7], 4, Form::Native, Act::None);
    check("g6_24x24_silu", &[1, 96, 24, 24], 6, Form::Native, Act::Silu);
    // One group of every channel; one channel per group (an instance norm).
    check("g1", &[1, 10, 9, 3], 1, Form::Native, Act::Silu);
    check("instance", &[2, 6, 11, 13], 6, Form::Native, Act::None);
    // 1-D (wav2vec2's feature encoder: one group per channel, GELU), 3-D, and no spatial dims.
    check("conv1d_gelu", &[1, 16, 203], 16, Form::Native, Act::Gelu);
    check("conv1d_g4", &[1, 16, 203], 4, Form::Native, Act::Gelu);
    check("3d", &[1, 8, 3, 5, 7], 2, Form::Native, Act::None);
    check("rank2", &[3, 8], 2, Form::Native, Act::None);
}

#[test]
fn exported_group_norms() {
    check("exp_g32_16x16_silu", &[1, 128, 16, 16], 32, Form::Exported, Act::Silu);
    check("exp_g4_5x7", &[2, 12, 5, 7], 4, Form::Exported, Act::None);
    check("exp_1d", &[1, 24, 77], 3, Form::Exported, Act::Gelu);
}

#[test]
fn channels_last_inputs() {
    check("cl_g4_6x5", &[1, 16, 6, 5], 4, Form::ChannelsLast, Act::Silu);
    check("cl_instance", &[2, 7, 4, 9], 7, Form::ChannelsLast, Act::None);
    check("cl_1d", &[1, 12, 50], 3, Form::ChannelsLast, Act::Gelu);
}

/// Shapes whose group statistics and epilogues the CPU schedule fuses into one loop over a
/// group's span (channels and pixels, contiguous in NCHW) and over each channel's pixels: spans
/// that are not a multiple of the vector width, shorter than two vectors, 1-D and 3-D, groups of
/// one channel and one group of every channel, a batch, and UNet's widths.
#[test]
fn fused_group_spans() {
    check("span_5x7_g8", &[1, 32, 5, 7], 8, Form::Native, Act::Silu);
    check("span_3x3_g16", &[1, 48, 3, 3], 16, Form::Exported, Act::Silu);
    check("span_13x11_g4", &[1, 64, 13, 11], 4, Form::Native, Act::None);
    check("span_1d_37", &[1, 32, 37], 8, Form::Native, Act::Silu);
    check("span_1d_exp", &[1, 40, 29], 5, Form::Exported, Act::Silu);
    check("span_3d", &[1, 16, 3, 4, 5], 4, Form::Native, Act::Silu);
    check("span_3d_exp", &[1, 12, 2, 5, 9], 3, Form::Exported, Act::Gelu);
    check("span_instance_17x19", &[1, 8, 17, 19], 8, Form::Native, Act::Silu);
    check("span_one_group", &[2, 24, 9, 7], 1, Form::Exported, Act::Silu);
    check("span_batch3", &[3, 64, 6, 6], 32, Form::Exported, Act::Silu);
    check("unet_8x8x512", &[1, 512, 8, 8], 32, Form::Exported, Act::Silu);
    check("unet_16x16x256", &[1, 256, 16, 16], 32, Form::Exported, Act::Silu);
    check("unet_32x32x128_native", &[1, 128, 32, 32], 32, Form::Native, Act::Silu);
}

/// The exporter's spelling becomes one `GroupNorm`: the optimized graph has no instance norm
/// left.
#[test]
fn exported_form_is_recognized() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let (mut g, _) = graph(&[1, 64, 8, 8], 16, Form::Exported, Act::Silu, &mut rng);
    tilec_opt::recognize::run_all(&mut g).unwrap();
    let ops: Vec<&str> = g.nodes().iter().map(|n| n.op.name()).collect();
    assert!(ops.contains(&"group_norm") && !ops.contains(&"instance_norm"), "{ops:?}");
}
