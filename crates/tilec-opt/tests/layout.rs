//! Layout passes: transpose sinking on hand-built graphs (transpose counts go down, outputs
//! equal on the reference interpreter on random inputs; no sinking where it would add
//! transposes or break a split-heads pair), no growth in transposes on the light models
//! and the transformer models, and the choose-layout plan per target.

use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use tilec_ir::op::{
    BinaryOp, LayoutOp, LinalgOp, NormOp, Padding, PoolKind, ReduceKind, ReduceOp, UnaryOp, Window,
};
use tilec_ir::{verify, DType, Dim, Graph, Op, Tensor, TensorType, ValueId};
use tilec_opt::manager::{Pipeline, PipelineOptions};
use tilec_opt::passes::layout::{
    apply_plan, count_transposes, inverse, plan_layout, Layout, SinkTransposes, TargetKind,
};
use tilec_opt::Pass;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn input(g: &mut Graph, dt: DType, shape: &[usize]) -> ValueId {
    let name = format!("in{}", g.inputs().len());
    g.add_input(&name, TensorType::fixed(dt, shape))
}

fn tr(g: &mut Graph, x: ValueId, perm: &[usize]) -> ValueId {
    g.add(
        Op::Layout(LayoutOp::Transpose {
            perm: perm.to_vec(),
        }),
        &[x],
    )
    .unwrap()
}

fn random_const(g: &mut Graph, dt: DType, shape: &[usize], seed: u64) -> ValueId {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-2.0..=2.0)).collect();
    g.add_const("c", Tensor::from_f64s(dt, shape.to_vec(), &v).unwrap())
}

/// Runs both graphs on the same random inputs; asserts equal outputs (bit-exact: sinking
/// only reorders data movement).
fn assert_same(a: &Graph, b: &Graph, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ins: Vec<Tensor> = a
        .inputs()
        .iter()
        .map(|&v| {
            let ty = &a.value(v).ty;
            let shape = ty.fixed_shape().unwrap();
            let n: usize = shape.iter().product();
            let vals: Vec<f64> = (0..n)
                .map(|_| match ty.dtype {
                    DType::Bool => rng.gen_range(0..2) as f64,
                    d if d.is_float() => rng.gen_range(-1.0..=1.0),
                    _ => rng.gen_range(-4..=4) as f64,
                })
                .collect();
            Tensor::from_f64s(ty.dtype, shape, &vals).unwrap()
        })
        .collect();
    let x = tilec_ref::run(a, ins.clone()).unwrap();
    let y = tilec_ref::run(b, ins).unwrap();
    assert_eq!(x.len(), y.len());
    for (p, q) in x.iter().zip(&y) {
        assert_eq!(p.shape(), q.shape());
        assert_eq!(p.dtype(), q.dtype());
        for (u, v) in p.to_f64_vec().iter().zip(q.to_f64_vec()) {
            assert!(
                *u == v || (u - v).abs() <= 1e-6 * (1.0 + u.abs()) || (u.is_nan() && v.is_nan()),
                "{u} vs {v}"
            );
        }
    }
}

/// Sinks, verifies, checks equality; returns (transposes before, after).
fn sink(g: &Graph, seed: u64) -> (usize, usize, Graph) {
    let mut h = g.clone();
    SinkTransposes.run(&mut h).unwrap();
    verify(&h).unwrap();
    assert_same(g, &h, seed);
    (count_transposes(g), count_transposes(&h), h)
}

#[test]
fn transpose_through_unary_cancels_with_its_inverse() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[2, 3, 4]);
    let p = [2, 0, 1];
    let t = tr(&mut g, x, &p);
    let r = g.add(Op::Unary(UnaryOp::Relu), &[t]).unwrap();
    let e = g.add(Op::Unary(UnaryOp::Exp), &[r]).unwrap();
    let c = g
        .add(
            Op::Cast {
                to: DType::F64,
                saturate: true,
            },
            &[e],
        )
        .unwrap();
    let back = tr(&mut g, c, &inverse(&p));
    g.set_outputs(vec![back]);
    let (b, a, _) = sink(&g, 1);
    assert_eq!((b, a), (2, 0));
}

#[test]
fn binary_with_same_perm_operands_and_constants() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[2, 3, 4, 5]);
    let y = input(&mut g, DType::F32, &[2, 3, 4, 5]);
    let p = [0, 2, 3, 1];
    let tx = tr(&mut g, x, &p);
    let ty = tr(&mut g, y, &p);
    let s = g.add(Op::Binary(BinaryOp::Add), &[tx, ty]).unwrap(); // [2,4,5,3]
    let c = random_const(&mut g, DType::F32, &[5, 3], 7); // broadcast, lower rank
    let m = g.add(Op::Binary(BinaryOp::Mul), &[c, s]).unwrap();
    let c2 = random_const(&mut g, DType::F32, &[2, 4, 5, 3], 8);
    let d = g.add(Op::Binary(BinaryOp::Sub), &[m, c2]).unwrap();
    g.set_outputs(vec![d]);
    let (b, a, _) = sink(&g, 2);
    assert_eq!(
        (b, a),
        (2, 1),
        "two operand transposes become one output transpose"
    );
}

#[test]
fn where_with_scalar_and_constant_condition() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[3, 4]);
    let s = input(&mut g, DType::F32, &[]);
    let t = tr(&mut g, x, &[1, 0]);
    let cond = g.add_const(
        "cond",
        Tensor::from_i64s(DType::Bool, vec![4, 1], &[1, 0, 1, 0]).unwrap(),
    );
    let w = g.add(Op::Where, &[cond, t, s]).unwrap();
    let back = tr(&mut g, w, &[1, 0]);
    g.set_outputs(vec![back]);
    let (b, a, _) = sink(&g, 3);
    assert_eq!((b, a), (2, 0));
}

#[test]
fn concat_of_transposes_and_softmax_axis_remap() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[2, 3, 4]);
    let y = input(&mut g, DType::F32, &[2, 5, 4]);
    let p = [2, 0, 1]; // tx: [4, 2, 3], ty: [4, 2, 5]
    let tx = tr(&mut g, x, &p);
    let ty = tr(&mut g, y, &p);
    let c = g
        .add(Op::Layout(LayoutOp::Concat { axis: 2 }), &[tx, ty])
        .unwrap();
    let sm = g.add(Op::Norm(NormOp::Softmax { axis: 2 }), &[c]).unwrap();
    let ls = g
        .add(Op::Norm(NormOp::LogSoftmax { axis: 0 }), &[sm])
        .unwrap();
    let back = tr(&mut g, ls, &inverse(&p));
    g.set_outputs(vec![back]);
    let (b, a, h) = sink(&g, 4);
    assert_eq!((b, a), (3, 0));
    assert!(h
        .nodes()
        .iter()
        .any(|n| n.op == Op::Layout(LayoutOp::Concat { axis: 1 })));
}

#[test]
fn reductions_remap_axes_and_may_drop_the_transpose() {
    for keepdims in [false, true] {
        for axes in [vec![0], vec![1, 3], vec![2], vec![0, 1, 2, 3]] {
            let mut g = Graph::new("t");
            let x = input(&mut g, DType::F32, &[2, 3, 4, 5]);
            let t = tr(&mut g, x, &[3, 1, 0, 2]);
            let r = g
                .add(
                    Op::Reduce(ReduceOp::Reduce {
                        kind: ReduceKind::Sum,
                        axes: axes.clone(),
                        keepdims,
                    }),
                    &[t],
                )
                .unwrap();
            let am = g
                .add(
                    Op::Reduce(ReduceOp::ArgMax {
                        axis: 0,
                        keepdims,
                        select_last_index: false,
                    }),
                    &[t],
                )
                .unwrap();
            g.set_outputs(vec![r, am]);
            // `t` has two users: sinking into one keeps t alive, so nothing may sink unless the
            // result needs no transpose.
            let (b, a, _) = sink(&g, 5);
            assert!(a <= b, "axes {axes:?} keepdims {keepdims}: {b} -> {a}");
            // One user only: always sinks; the result transpose disappears when the kept
            // axes stay in order.
            let mut g1 = Graph::new("t");
            let x = input(&mut g1, DType::F32, &[2, 3, 4, 5]);
            let t = tr(&mut g1, x, &[3, 1, 0, 2]);
            let r = g1
                .add(
                    Op::Reduce(ReduceOp::Reduce {
                        kind: ReduceKind::Max,
                        axes: axes.clone(),
                        keepdims,
                    }),
                    &[t],
                )
                .unwrap();
            let e = g1.add(Op::Unary(UnaryOp::Neg), &[r]).unwrap();
            g1.set_outputs(vec![e]);
            let (b, a, h) = sink(&g1, 6);
            assert!(a <= b);
            assert!(
                !matches!(h.nodes()[0].op, Op::Layout(LayoutOp::Transpose { .. })),
                "the transpose sank below the reduction"
            );
        }
    }
    // Reducing away both moved axes leaves the rest in order: no transpose at all.
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[2, 3, 4]);
    let t = tr(&mut g, x, &[1, 0, 2]);
    let r = g
        .add(
            Op::Reduce(ReduceOp::Reduce {
                kind: ReduceKind::Mean,
                axes: vec![0, 1],
                keepdims: false,
            }),
            &[t],
        )
        .unwrap();
    g.set_outputs(vec![r]);
    assert_eq!(sink(&g, 7).1, 0);
}

#[test]
fn no_sinking_that_adds_transposes() {
    // A transpose with two elementwise users: sinking would need two transposes.
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[3, 4]);
    let t = tr(&mut g, x, &[1, 0]);
    let a = g.add(Op::Unary(UnaryOp::Relu), &[t]).unwrap();
    let b = g.add(Op::Unary(UnaryOp::Exp), &[t]).unwrap();
    g.set_outputs(vec![a, b]);
    let (before, after, _) = sink(&g, 8);
    assert_eq!((before, after), (1, 1));
    // Operands transposed by different perms, or a non-constant operand that is not.
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[3, 3]);
    let y = input(&mut g, DType::F32, &[3, 3]);
    let t = tr(&mut g, x, &[1, 0]);
    let s = g.add(Op::Binary(BinaryOp::Add), &[t, y]).unwrap();
    g.set_outputs(vec![s]);
    assert!(!SinkTransposes.run(&mut g.clone()).unwrap());
}

#[test]
fn split_heads_pairs_stay() {
    // [B,S,H*D] -> reshape [B,S,H,D] -> transpose(0,2,1,3) -> * scale: the transpose stays
    // right after its reshape.
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[1, 4, 6]);
    let shape = [1, 4, 2, 3].iter().map(|&d| Dim::Fixed(d)).collect();
    let r = g
        .add(Op::Layout(LayoutOp::Reshape { shape }), &[x])
        .unwrap();
    let t = tr(&mut g, r, &[0, 2, 1, 3]);
    let c = random_const(&mut g, DType::F32, &[], 9);
    let m = g.add(Op::Binary(BinaryOp::Mul), &[t, c]).unwrap();
    g.set_outputs(vec![m]);
    assert!(!SinkTransposes.run(&mut g.clone()).unwrap());
}

fn import(path: &Path) -> Graph {
    tilec_onnx::import_file(path, &tilec_onnx::ImportOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Transpose counts: as imported, after the sinking pass alone, after the whole O3
/// pipeline. Sinking may not exceed the imported count; O3 may add only the boundary
/// transposes its layout plan budgets for the regions it switches to NHWC.
fn counts(name: &str, g: &Graph) -> (usize, usize, usize) {
    let before = count_transposes(g);
    let mut s = g.clone();
    SinkTransposes.run(&mut s).unwrap();
    verify(&s).unwrap();
    let mut o = g.clone();
    let opts = PipelineOptions {
        verify: true,
        print_ir_after: None,
    };
    Pipeline::for_level(3).run(&mut o, &opts).unwrap();
    let r = (before, count_transposes(&s), count_transposes(&o));
    println!(
        "{name}: transposes imported {} / after sink-transposes {} / after O3 {}",
        r.0, r.1, r.2
    );
    let budget: usize = plan_layout(g, TargetKind::Cpu)
        .regions
        .iter()
        .filter(|x| x.layout == Layout::Nhwc)
        .map(|x| x.entry_transposes + x.exit_transposes)
        .sum();
    assert!(r.1 <= r.0 && r.2 <= r.0 + budget, "{name}: transposes grew: {r:?} (layout budget {budget})");
    r
}

#[test]
fn no_transpose_growth_on_models() {
    let root = repo_root();
    let mut paths: Vec<(String, PathBuf)> = Vec::new();
    for m in ["gpt2", "bert", "llama"] {
        paths.push((
            m.to_string(),
            root.join("models").join(m).join("model.onnx"),
        ));
    }
    let light = root.join("testdata/gen/light");
    let mut names: Vec<String> = std::fs::read_dir(&light)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for n in names {
        paths.push((format!("light/{n}"), light.join(&n).join("model.onnx")));
    }
    let mut seen = 0;
    for (name, p) in paths {
        if !p.exists() {
            println!("{name}: missing, skipped");
            continue;
        }
        counts(&name, &import(&p));
        seen += 1;
    }
    assert!(seen >= 3, "models missing");
}

fn conv_chain(g: &mut Graph, x: ValueId, n: usize) -> ValueId {
    grouped_conv_chain(g, x, n, 4, 1, 20)
}

/// `n` times a 3x3 convolution of `c` channels in `group` groups (weights seeded from `seed`,
/// biases from `seed + 20`) and a ReLU.
fn grouped_conv_chain(g: &mut Graph, x: ValueId, n: usize, c: usize, group: usize, seed: u64) -> ValueId {
    let mut v = x;
    for i in 0..n {
        let w = random_const(g, DType::F32, &[c, c / group, 3, 3], seed + i as u64);
        let b = random_const(g, DType::F32, &[c], seed + 20 + i as u64);
        let window = Window {
            kernel: vec![3, 3],
            strides: vec![1, 1],
            dilations: vec![1, 1],
            pads: Padding::Explicit(vec![1; 4]),
        };
        v = g
            .add(Op::Linalg(LinalgOp::Conv { window, group, channels_last: false }), &[v, w, b])
            .unwrap();
        v = g.add(Op::Unary(UnaryOp::Relu), &[v]).unwrap();
    }
    v
}

#[test]
fn choose_layout_prefers_nhwc_on_cuda_for_conv_chains() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[1, 4, 8, 8]);
    let y = conv_chain(&mut g, x, 3);
    let shape = vec![Dim::Fixed(1), Dim::Fixed(256)];
    let f = g
        .add(Op::Layout(LayoutOp::Reshape { shape }), &[y])
        .unwrap();
    g.set_outputs(vec![f]);
    let cuda = plan_layout(&g, TargetKind::Cuda);
    print!("{}", cuda.report());
    assert_eq!(cuda.regions.len(), 1);
    let r = &cuda.regions[0];
    assert_eq!((r.convs, r.entry_transposes, r.exit_transposes), (3, 1, 1));
    assert_eq!(r.layout, Layout::Nhwc);
    let cpu = plan_layout(&g, TargetKind::Cpu);
    assert_eq!(cpu.nhwc_regions(), 0);
    // The rewrite: three channels-last convs, one transpose in and one out, same results.
    let mut h = g.clone();
    assert_eq!(apply_plan(&mut h, &cuda).unwrap(), 1);
    verify(&h).unwrap();
    let nhwc = h
        .nodes()
        .iter()
        .filter(|n| matches!(&n.op, Op::Linalg(l) if l.is_channels_last()))
        .count();
    assert_eq!((nhwc, count_transposes(&h)), (3, 2));
    assert_same(&g, &h, 5);
    // A lone conv with inputs and outputs in NCHW does not pay for two transposes.
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[1, 4, 8, 8]);
    let y = conv_chain(&mut g, x, 1);
    g.set_outputs(vec![y]);
    assert_eq!(plan_layout(&g, TargetKind::Cuda).nhwc_regions(), 0);
    // The pipeline for either target leaves results unchanged.
    let mut o = g.clone();
    Pipeline::for_level_and_target(3, TargetKind::Cuda)
        .run(&mut o, &PipelineOptions::default())
        .unwrap();
    verify(&o).unwrap();
}

/// Grouped convolutions of 8 channels per group (RegNet-Y's): channels-last on the CPU exactly
/// where 8 output channels are whole vectors of the machine (AVX2 or narrower), which the
/// within-group direct kernel computes without padding; NCHW where vectors are 16 wide.
#[test]
fn choose_layout_grouped_convs_by_vector_width() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[1, 32, 8, 8]);
    let v = grouped_conv_chain(&mut g, x, 2, 32, 4, 60);
    g.set_outputs(vec![v]);
    let lanes = tilec_opt::target::CpuTarget::host().lanes_of(4);
    let cpu = plan_layout(&g, TargetKind::Cpu);
    print!("{lanes} lanes: {}", cpu.report());
    assert_eq!(cpu.nhwc_regions(), usize::from(8 % lanes == 0), "8 channels per group, {lanes} lanes");
    let mut h = g.clone();
    apply_plan(&mut h, &cpu).unwrap();
    verify(&h).unwrap();
    assert_same(&g, &h, 6);
}

#[test]
fn choose_layout_on_light_cnns() {
    let light = repo_root().join("testdata/gen/light");
    for m in ["resnet50", "squeezenet", "inception_v1"] {
        let p = light.join(m).join("model.onnx");
        if !p.exists() {
            continue;
        }
        let g = import(&p);
        let cuda = plan_layout(&g, TargetKind::Cuda);
        print!("{m}: {}", cuda.report());
        assert!(
            cuda.nhwc_regions() >= 1,
            "{m}: expected an NHWC region on cuda"
        );
        // The CPU reads channels-last inputs in place when output channels are whole vectors.
        assert!(plan_layout(&g, TargetKind::Cpu).nhwc_regions() >= 1, "{m}: expected an NHWC region on the cpu");
    }
    // ShuffleNet's group convolutions have 34, 68, ... output channels per group: NCHW.
    let p = light.join("shufflenet").join("model.onnx");
    if p.exists() {
        let plan = plan_layout(&import(&p), TargetKind::Cpu);
        assert_eq!(plan.nhwc_regions(), 0, "{}", plan.report());
    }
}

fn conv(g: &mut Graph, x: ValueId, cin: usize, cout: usize, seed: u64) -> ValueId {
    let w = random_const(g, DType::F32, &[cout, cin, 3, 3], seed);
    let b = random_const(g, DType::F32, &[cout], seed + 1);
    let window = Window {
        kernel: vec![3, 3],
        strides: vec![1, 1],
        dilations: vec![1, 1],
        pads: Padding::Explicit(vec![1; 4]),
    };
    g.add(
        Op::Linalg(LinalgOp::Conv {
            window,
            group: 1,
            channels_last: false,
        }),
        &[x, w, b],
    )
    .unwrap()
}

/// A batch norm that `fold-batchnorm` cannot fold (its input is no conv output).
fn batch_norm(g: &mut Graph, x: ValueId, c: usize, seed: u64) -> ValueId {
    let s = random_const(g, DType::F32, &[c], seed);
    let b = random_const(g, DType::F32, &[c], seed + 1);
    let m = random_const(g, DType::F32, &[c], seed + 2);
    let v: Vec<f64> = (0..c).map(|i| 0.5 + i as f64 * 0.25).collect();
    let v = g.add_const("var", Tensor::from_f64s(DType::F32, vec![c], &v).unwrap());
    g.add(
        Op::Norm(NormOp::BatchNorm {
            epsilon: 1e-5,
            channels_last: false,
        }),
        &[x, s, b, m, v],
    )
    .unwrap()
}

fn reshape(g: &mut Graph, x: ValueId, shape: &[usize]) -> ValueId {
    let shape = shape.iter().map(|&d| Dim::Fixed(d)).collect();
    g.add(Op::Layout(LayoutOp::Reshape { shape }), &[x])
        .unwrap()
}

/// Applies the cuda plan to `g`, checks it against the original, and returns
/// (channels-last convs, channels-last norms, rank-4 transposes, rewritten graph).
fn apply_cuda(g: &Graph, seed: u64) -> (usize, usize, usize, Graph) {
    let plan = plan_layout(g, TargetKind::Cuda);
    print!("{}", plan.report());
    let mut h = g.clone();
    apply_plan(&mut h, &plan).unwrap();
    verify(&h).unwrap();
    assert_same(g, &h, seed);
    // The whole cuda pipeline too.
    let mut o = g.clone();
    Pipeline::for_level_and_target(3, TargetKind::Cuda)
        .run(&mut o, &PipelineOptions::default())
        .unwrap();
    verify(&o).unwrap();
    assert_same(g, &o, seed + 1);
    let convs = o
        .nodes()
        .iter()
        .filter(|n| matches!(&n.op, Op::Linalg(l @ LinalgOp::Conv { .. }) if l.is_channels_last()))
        .count();
    let norms = o
        .nodes()
        .iter()
        .filter(|n| matches!(&n.op, Op::Norm(nm) if nm.is_channels_last()))
        .count();
    let tr4 = o
        .nodes()
        .iter()
        .filter(|n| matches!(&n.op, Op::Layout(LayoutOp::Transpose { perm }) if perm.len() == 4))
        .count();
    (convs, norms, tr4, o)
}

#[test]
fn nhwc_regions_carry_batch_norm_and_lrn() {
    // conv -> relu -> add(residual) -> batch norm -> lrn -> conv: the norms run
    // channels-last instead of being wrapped in transposes.
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[2, 4, 6, 5]);
    let a = conv(&mut g, x, 4, 6, 1);
    let a = g.add(Op::Unary(UnaryOp::Relu), &[a]).unwrap();
    let r = conv(&mut g, x, 4, 6, 3);
    let s = g.add(Op::Binary(BinaryOp::Add), &[a, r]).unwrap();
    let bn = batch_norm(&mut g, s, 6, 5);
    let lrn = g
        .add(
            Op::Norm(NormOp::Lrn {
                size: 3,
                alpha: 0.2,
                beta: 0.75,
                bias: 1.5,
                channels_last: false,
            }),
            &[bn],
        )
        .unwrap();
    let y = conv(&mut g, lrn, 6, 4, 9);
    g.set_outputs(vec![y]);
    let plan = plan_layout(&g, TargetKind::Cuda);
    assert_eq!(plan.nhwc_regions(), 1);
    assert_eq!(plan.regions[0].norms, 2);
    let (convs, norms, tr4, _) = apply_cuda(&g, 11);
    assert_eq!((convs, norms, tr4), (3, 2, 2));
}

#[test]
fn nhwc_regions_carry_channel_shuffles() {
    // ShuffleNet's unit: conv -> reshape [N, g, C/g, H, W] -> transpose(0,2,1,3,4) ->
    // reshape [N, C, H, W] -> conv. In NHWC the shuffle is reshape [N, H, W, g, C/g] ->
    // transpose(0,1,2,4,3) -> reshape [N, H, W, C].
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[1, 4, 5, 7]);
    let a = conv(&mut g, x, 4, 6, 1);
    let a = reshape(&mut g, a, &[1, 2, 3, 5, 7]);
    let a = tr(&mut g, a, &[0, 2, 1, 3, 4]);
    let a = reshape(&mut g, a, &[1, 6, 5, 7]);
    let y = conv(&mut g, a, 6, 4, 3);
    g.set_outputs(vec![y]);
    let plan = plan_layout(&g, TargetKind::Cuda);
    assert_eq!(plan.regions.len(), 1, "{}", plan.report());
    let (convs, _, tr4, o) = apply_cuda(&g, 13);
    assert_eq!((convs, tr4), (2, 2));
    let perms: Vec<&Vec<usize>> = o
        .nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Layout(LayoutOp::Transpose { perm }) if perm.len() == 5 => Some(perm),
            _ => None,
        })
        .collect();
    assert_eq!(perms, [&vec![0, 1, 2, 4, 3]]);
    // A reshape that mixes channels with a spatial dim is no channel shuffle: the region
    // stops there.
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[1, 4, 6, 6]);
    let a = conv(&mut g, x, 4, 4, 1);
    let a = reshape(&mut g, a, &[1, 6, 4, 6]);
    let y = conv(&mut g, a, 6, 4, 3);
    g.set_outputs(vec![y]);
    let plan = plan_layout(&g, TargetKind::Cuda);
    assert_eq!(plan.regions.len(), 2, "{}", plan.report());
    apply_cuda(&g, 15);
}

#[test]
fn nhwc_regions_carry_channel_concat_and_norm() {
    // DenseNet's pattern: concat of conv outputs along channels, batch norm, relu, conv.
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[2, 3, 5, 5]);
    let a = conv(&mut g, x, 3, 4, 1);
    let b = conv(&mut g, a, 4, 2, 3);
    let c = g
        .add(Op::Layout(LayoutOp::Concat { axis: 1 }), &[x, a, b])
        .unwrap();
    let c = batch_norm(&mut g, c, 9, 5);
    let c = g.add(Op::Unary(UnaryOp::Relu), &[c]).unwrap();
    let y = conv(&mut g, c, 9, 4, 7);
    g.set_outputs(vec![y]);
    let (convs, norms, tr4, o) = apply_cuda(&g, 17);
    assert_eq!((convs, norms, tr4), (3, 1, 2));
    assert!(o
        .nodes()
        .iter()
        .any(|n| n.op == Op::Layout(LayoutOp::Concat { axis: 3 })));
}

/// Every light CNN goes channels-last as a whole on cuda: all convs NHWC, one rank-4
/// transpose in, at most one out (a flatten before the classifier; a global pool's
/// `[N, 1, 1, C]` needs none).
#[test]
fn light_cnns_go_nhwc_on_cuda() {
    let light = repo_root().join("testdata/gen/light");
    let Ok(rd) = std::fs::read_dir(&light) else {
        return;
    };
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for m in names {
        let p = light.join(&m).join("model.onnx");
        if !p.exists() {
            continue;
        }
        let mut g = import(&p);
        Pipeline::for_level_and_target(3, TargetKind::Cuda)
            .run(&mut g, &PipelineOptions::default())
            .unwrap();
        let count = |f: &dyn Fn(&Op) -> bool| g.nodes().iter().filter(|n| f(&n.op)).count();
        let convs = count(&|op| matches!(op, Op::Linalg(LinalgOp::Conv { .. })));
        let nhwc = count(
            &|op| matches!(op, Op::Linalg(l @ LinalgOp::Conv { .. }) if l.is_channels_last()),
        );
        let norms =
            count(&|op| matches!(op, Op::Norm(NormOp::BatchNorm { .. } | NormOp::Lrn { .. })));
        let nhwc_norms = count(&|op| matches!(op, Op::Norm(nm) if nm.is_channels_last()));
        let tr4 =
            count(&|op| matches!(op, Op::Layout(LayoutOp::Transpose { perm }) if perm.len() == 4));
        println!("{m}: {nhwc}/{convs} convs and {nhwc_norms}/{norms} norms NHWC, {tr4} rank-4 transposes");
        assert_eq!(nhwc, convs, "{m}");
        assert_eq!(nhwc_norms, norms, "{m}");
        assert!((1..=2).contains(&tr4), "{m}: {tr4} rank-4 transposes");
    }
}

/// `pad-thin-convs`: a channels-last conv over 3 channels with padding gets an explicit `pad`
/// (same results on the interpreter), wider or NCHW convs and grouped ones of 16 groups or
/// more are left alone, and the partitioner
/// keeps the padded copy out of the conv's kernel.
#[test]
fn thin_channels_last_convs_are_padded_explicitly() {
    use tilec_opt::partition::{partition, Target};
    use tilec_opt::passes::PadThinConvs;
    let mut g = Graph::new("thin");
    let x = input(&mut g, DType::F32, &[1, 17, 19, 3]);
    let cl = |g: &mut Graph, x: ValueId, cin: usize, cout: usize, seed: u64, cl: bool| {
        let w = random_const(g, DType::F32, &[cout, cin, 5, 5], seed);
        let b = random_const(g, DType::F32, &[cout], seed + 1);
        let window = Window {
            kernel: vec![5, 5],
            strides: vec![2, 2],
            dilations: vec![1, 1],
            pads: Padding::Explicit(vec![2, 1, 2, 2]),
        };
        g.add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: cl }), &[x, w, b]).unwrap()
    };
    let y = cl(&mut g, x, 3, 8, 1, true);
    let z = cl(&mut g, y, 8, 8, 3, true);
    g.set_outputs(vec![z]);
    let mut h = g.clone();
    assert!(PadThinConvs.run(&mut h).unwrap());
    verify(&h).unwrap();
    assert_same(&g, &h, 7);
    let pads: Vec<_> = h.nodes().iter().filter(|n| matches!(n.op, Op::Layout(LayoutOp::Pad { .. }))).collect();
    assert_eq!(pads.len(), 1, "only the 3-channel conv is padded");
    let Op::Layout(LayoutOp::Pad { pads: p, .. }) = &pads[0].op else { unreachable!() };
    assert_eq!(p, &vec![0, 2, 1, 0, 0, 2, 2, 0]);
    // Nothing left to do, and NCHW convs are not touched.
    assert!(!PadThinConvs.run(&mut h.clone()).unwrap());
    let mut n = Graph::new("nchw");
    let x = input(&mut n, DType::F32, &[1, 3, 17, 19]);
    let y = cl(&mut n, x, 3, 8, 1, false);
    n.set_outputs(vec![y]);
    assert!(!PadThinConvs.run(&mut n).unwrap());
    // A grouped conv of 4 channels per group is padded with 8 groups, not with 32 (ResNeXt's:
    // the CPU's depthwise family takes it with its padding).
    for (groups, padded) in [(8, true), (32, false)] {
        let mut gg = Graph::new("grouped");
        let x = input(&mut gg, DType::F32, &[1, 9, 9, 4 * groups]);
        let w = random_const(&mut gg, DType::F32, &[4 * groups, 4, 3, 3], 5);
        let b = random_const(&mut gg, DType::F32, &[4 * groups], 6);
        let window =
            Window { kernel: vec![3, 3], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![1; 4]) };
        let y = gg.add(Op::Linalg(LinalgOp::Conv { window, group: groups, channels_last: true }), &[x, w, b]).unwrap();
        gg.set_outputs(vec![y]);
        assert_eq!(PadThinConvs.run(&mut gg).unwrap(), padded, "{groups} groups");
    }
    // The pad is a kernel of its own.
    let p = partition(&h, &Target::preset(TargetKind::Cpu));
    let conv_group = p.groups.iter().find(|grp| grp.nodes.iter().any(|&id| {
        matches!(&h.node(id).op, Op::Linalg(LinalgOp::Conv { .. })) && h.value(h.node(id).inputs[1]).ty.fixed_shape().unwrap()[1] == 3
    }));
    let conv_group = conv_group.expect("a group with the thin conv");
    assert!(
        !conv_group.nodes.iter().any(|&id| matches!(h.node(id).op, Op::Layout(LayoutOp::Pad { .. }))),
        "the pad is folded into the conv"
    );
}

/// A 1x1 convolution `cin → cout` with random weights and bias.
fn conv1x1(g: &mut Graph, x: ValueId, cin: usize, cout: usize, seed: u64) -> ValueId {
    let w = random_const(g, DType::F32, &[cout, cin, 1, 1], seed);
    let b = random_const(g, DType::F32, &[cout], seed + 1);
    let window = Window { kernel: vec![1, 1], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![0; 4]) };
    g.add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: false }), &[x, w, b]).unwrap()
}

/// The CPU pipeline on `g`, checked against `g` on random inputs; returns the optimized
/// graph and its rank-4 transposes.
fn cpu_pipeline(g: &Graph, seed: u64) -> (Graph, usize) {
    let mut o = g.clone();
    Pipeline::for_level_and_target(3, TargetKind::Cpu).run(&mut o, &PipelineOptions::default()).unwrap();
    verify(&o).unwrap();
    assert_same(g, &o, seed);
    let tr4 = o
        .nodes()
        .iter()
        .filter(|n| matches!(&n.op, Op::Layout(LayoutOp::Transpose { perm }) if perm.len() == 4))
        .count();
    (o, tr4)
}

#[test]
fn nhwc_regions_carry_squeeze_and_excitation() {
    // conv → mean over H, W (kept) → 1x1 conv → relu → 1x1 conv → sigmoid → scale → conv,
    // as EfficientNet's blocks: the mean becomes a channels-last global pool, the whole
    // block one NHWC region with one transpose in and one out.
    for kind in [ReduceKind::Mean, ReduceKind::Max] {
        let mut g = Graph::new("se");
        let x = input(&mut g, DType::F32, &[2, 32, 9, 7]);
        let a = conv(&mut g, x, 32, 32, 1);
        let s = g.add(Op::Reduce(ReduceOp::Reduce { kind, axes: vec![2, 3], keepdims: true }), &[a]).unwrap();
        let s = conv1x1(&mut g, s, 32, 16, 3);
        let s = g.add(Op::Unary(UnaryOp::Relu), &[s]).unwrap();
        let s = conv1x1(&mut g, s, 16, 32, 5);
        let s = g.add(Op::Unary(UnaryOp::Sigmoid), &[s]).unwrap();
        let y = g.add(Op::Binary(BinaryOp::Mul), &[a, s]).unwrap();
        let y = conv(&mut g, y, 32, 32, 7);
        g.set_outputs(vec![y]);
        let plan = plan_layout(&g, TargetKind::Cpu);
        print!("{}", plan.report());
        assert_eq!((plan.regions.len(), plan.nhwc_regions()), (1, 1), "{kind:?}");
        assert_eq!(plan.regions[0].pools, 1);
        let (o, tr4) = cpu_pipeline(&g, 13);
        let pools = o
            .nodes()
            .iter()
            .filter(|n| matches!(&n.op, Op::Linalg(LinalgOp::GlobalPool { channels_last: true, .. })))
            .count();
        let reduces = o.nodes().iter().filter(|n| matches!(n.op, Op::Reduce(_))).count();
        assert_eq!((pools, reduces, tr4), (1, 0, 2), "{kind:?}");
    }
    // A mean over H alone is no global pool: it stays outside, and the region NCHW.
    let mut g = Graph::new("h-mean");
    let x = input(&mut g, DType::F32, &[1, 32, 6, 6]);
    let a = conv(&mut g, x, 32, 32, 1);
    let s = g.add(Op::Reduce(ReduceOp::Reduce { kind: ReduceKind::Mean, axes: vec![2], keepdims: true }), &[a]).unwrap();
    let y = g.add(Op::Binary(BinaryOp::Mul), &[a, s]).unwrap();
    let y = conv(&mut g, y, 32, 32, 7);
    g.set_outputs(vec![y]);
    let plan = plan_layout(&g, TargetKind::Cpu);
    assert_eq!(plan.nhwc_regions(), 0, "{}", plan.report());
    cpu_pipeline(&g, 17);
}

#[test]
fn nhwc_regions_take_channels_last_mlps_without_transposes() {
    // ConvNeXt's block: a conv, its output permuted to [N, H, W, C] for a matrix product,
    // permuted back and added to the residual, then the next conv. The permutations cancel
    // against the region's boundary transposes: NHWC on the CPU, no transposes inside.
    let mut g = Graph::new("convnext");
    let x = input(&mut g, DType::F32, &[1, 32, 7, 6]);
    let mut h = conv(&mut g, x, 32, 32, 1);
    for i in 0..3 {
        let a = conv(&mut g, h, 32, 32, 10 + 2 * i);
        let t = tr(&mut g, a, &[0, 2, 3, 1]);
        let w = random_const(&mut g, DType::F32, &[32, 32], 20 + i);
        let m = g.add(Op::Linalg(LinalgOp::MatMul), &[t, w]).unwrap();
        let m = g.add(Op::Unary(UnaryOp::Relu), &[m]).unwrap();
        let b = tr(&mut g, m, &[0, 3, 1, 2]);
        h = g.add(Op::Binary(BinaryOp::Add), &[h, b]).unwrap();
    }
    g.set_outputs(vec![h]);
    let plan = plan_layout(&g, TargetKind::Cpu);
    print!("{}", plan.report());
    assert_eq!(plan.nhwc_regions(), 1, "{}", plan.report());
    assert_eq!((plan.regions[0].entry_transposes, plan.regions[0].exit_transposes), (1, 1));
    let (_, tr4) = cpu_pipeline(&g, 19);
    assert_eq!(tr4, 2, "one transpose in, one out");
}

/// `pad-thin-channels` (CUDA): a 16-bit channels-last conv over 3 or 6 channels reads an input
/// padded with zero channels to 4 or 8 and weights padded to match (same results on the
/// interpreter); 4 channels, f32, grouped and NCHW convs are left alone; the GPU partitioner
/// keeps the padded copy a kernel of its own.
#[test]
fn thin_channels_are_padded_to_whole_pixels_for_cuda() {
    use tilec_opt::partition::{partition, Target};
    use tilec_opt::passes::PadThinChannels;
    let conv = |g: &mut Graph, x: ValueId, cin: usize, group: usize, dt: DType, cl: bool, seed: u64| {
        let w = random_const(g, dt, &[16, cin / group, 7, 7], seed);
        let b = random_const(g, dt, &[16], seed + 1);
        let window = Window { kernel: vec![7, 7], strides: vec![2, 2], dilations: vec![1, 1], pads: Padding::Explicit(vec![3; 4]) };
        g.add(Op::Linalg(LinalgOp::Conv { window, group, channels_last: cl }), &[x, w, b]).unwrap()
    };
    for (c, dt, group, cl, padded_to) in [
        (3, DType::F16, 1, true, Some(4)),
        (6, DType::BF16, 1, true, Some(8)),
        (1, DType::F16, 1, true, Some(4)),
        (4, DType::F16, 1, true, None),
        (3, DType::F32, 1, true, None),
        (6, DType::F16, 2, true, None),
        (3, DType::F16, 1, false, None),
    ] {
        let mut g = Graph::new("thin");
        let shape = if cl { [2, 13, 11, c] } else { [2, c, 13, 11] };
        let x = input(&mut g, dt, &shape);
        let y = conv(&mut g, x, c, group, dt, cl, 9);
        g.set_outputs(vec![y]);
        let mut h = g.clone();
        assert_eq!(PadThinChannels.run(&mut h).unwrap(), padded_to.is_some(), "{c} {dt:?} {group} {cl}");
        let Some(cp) = padded_to else { continue };
        verify(&h).unwrap();
        assert_same(&g, &h, 11);
        let pad = h.nodes().into_iter().find(|n| matches!(n.op, Op::Layout(LayoutOp::Pad { .. }))).expect("a pad");
        let Op::Layout(LayoutOp::Pad { pads, .. }) = &pad.op else { unreachable!() };
        assert_eq!(pads, &vec![0, 0, 0, 0, 0, 0, 0, (cp - c) as i64]);
        let conv_id = h.node_ids().find(|&id| matches!(h.node(id).op, Op::Linalg(LinalgOp::Conv { .. }))).unwrap();
        assert_eq!(h.value(h.node(conv_id).inputs[1]).ty.fixed_shape().unwrap(), vec![16, cp, 7, 7]);
        assert!(!PadThinChannels.run(&mut h.clone()).unwrap(), "nothing left to pad");
        // The padded copy stays out of the conv's kernel on a GPU.
        let p = partition(&h, &Target::preset(TargetKind::Cuda));
        let conv_group = p.groups.iter().find(|grp| grp.nodes.contains(&conv_id)).expect("the conv's group");
        assert!(!conv_group.nodes.iter().any(|&id| matches!(h.node(id).op, Op::Layout(LayoutOp::Pad { .. }))), "the pad is folded into the conv");
    }
}

/// A depthwise convolution over a token sequence (SegFormer's Mix-FFN): `[B, L, C]` turned
/// into `[B, C, H, W]` by a transpose and a reshape, and back. `choose-layout` sees the
/// sequence as channels-last on both sides: the convolution runs channels-last with no
/// transpose of rank 4 left, and the graph computes what it did.
#[test]
fn sequence_images_convolve_channels_last() {
    let mut g = Graph::new("mix_ffn");
    let x = input(&mut g, DType::F32, &[1, 64, 32]);
    let t = tr(&mut g, x, &[0, 2, 1]);
    let img = reshape(&mut g, t, &[1, 32, 8, 8]);
    let y = grouped_conv_chain(&mut g, img, 1, 32, 32, 7);
    let flat = reshape(&mut g, y, &[1, 32, 64]);
    let seq = tr(&mut g, flat, &[0, 2, 1]);
    let out = g.add(Op::Unary(UnaryOp::Gelu { tanh_approx: false }), &[seq]).unwrap();
    g.set_outputs(vec![out]);
    let (o, tr4) = cpu_pipeline(&g, 11);
    let nhwc = o.nodes().iter().filter(|n| matches!(n.op, Op::Linalg(LinalgOp::Conv { channels_last: true, .. }))).count();
    assert_eq!((nhwc, tr4), (1, 0), "{}", tilec_ir::print_graph(&o));
}

#[test]
fn nhwc_regions_carry_group_norm_and_channel_scales() {
    // PoolFormer's block: conv → group norm → (avg pool - x) → a layer scale [C, 1, 1]
    // times it (the scale first) → + residual → group norm → 1x1 convs. On the CPU the
    // whole block is one NHWC region: the group norms run channels-last (one group and
    // several), the scales broadcast in the region's layout; one transpose in, one out.
    // On a GPU the group norms stay channels-first.
    for groups in [1, 4] {
        let mut g = Graph::new("poolformer");
        let x = input(&mut g, DType::F32, &[2, 8, 6, 5]);
        let a = conv(&mut g, x, 8, 16, 1);
        let gn = |g: &mut Graph, v: ValueId, seed: u64| {
            let s = random_const(g, DType::F32, &[16], seed);
            let b = random_const(g, DType::F32, &[16], seed + 1);
            g.add(Op::Norm(NormOp::GroupNorm { num_groups: groups, epsilon: 1e-5, channels_last: false }), &[v, s, b]).unwrap()
        };
        let n = gn(&mut g, a, 3);
        let window = Window { kernel: vec![3, 3], strides: vec![1, 1], dilations: vec![1, 1], pads: Padding::Explicit(vec![1; 4]) };
        let p = g
            .add(Op::Linalg(LinalgOp::Pool { kind: PoolKind::Avg { count_include_pad: false }, window, ceil_mode: false, channels_last: false }), &[n])
            .unwrap();
        let d = g.add(Op::Binary(BinaryOp::Sub), &[p, n]).unwrap();
        let ls = random_const(&mut g, DType::F32, &[16, 1, 1], 5);
        let d = g.add(Op::Binary(BinaryOp::Mul), &[ls, d]).unwrap();
        let r = g.add(Op::Binary(BinaryOp::Add), &[a, d]).unwrap();
        let n2 = gn(&mut g, r, 7);
        let y = conv1x1(&mut g, n2, 16, 16, 9);
        let y = g.add(Op::Binary(BinaryOp::Add), &[r, y]).unwrap();
        let y = conv1x1(&mut g, y, 16, 8, 11);
        g.set_outputs(vec![y]);
        let plan = plan_layout(&g, TargetKind::Cpu);
        print!("{}", plan.report());
        assert_eq!((plan.regions.len(), plan.nhwc_regions()), (1, 1), "{groups} groups");
        assert_eq!(plan.regions[0].norms, 2);
        let (o, tr4) = cpu_pipeline(&g, 17);
        let gns = o
            .nodes()
            .iter()
            .filter(|n| matches!(&n.op, Op::Norm(nm @ NormOp::GroupNorm { .. }) if nm.is_channels_last()))
            .count();
        assert_eq!((gns, tr4), (2, 2), "{groups} groups");
        let cuda = plan_layout(&g, TargetKind::Cuda);
        assert!(cuda.regions.iter().all(|r| r.norms == 0), "{}", cuda.report());
    }
}

/// A 3-D convolution of `cin` to `cout` channels, kernel `k` (same padding), stride 1.
fn conv3d(g: &mut Graph, x: ValueId, cin: usize, cout: usize, k: [usize; 3], seed: u64) -> ValueId {
    let w = random_const(g, DType::F32, &[cout, cin, k[0], k[1], k[2]], seed);
    let bias = random_const(g, DType::F32, &[cout], seed + 20);
    let pads = k.iter().chain(k.iter()).map(|k| k / 2).collect();
    let window = Window { kernel: k.to_vec(), strides: vec![1; 3], dilations: vec![1; 3], pads: Padding::Explicit(pads) };
    g.add(Op::Linalg(LinalgOp::Conv { window, group: 1, channels_last: false }), &[x, w, bias]).unwrap()
}

#[test]
fn video_convs_go_channels_last_on_the_cpu() {
    // Conv3d, ReLU, a (1, 3, 3) and a (3, 1, 1) conv, a residual and the mean over
    // [T, H, W] (kept): one 3-D region. Channels-last on the CPU (one transpose in; the
    // pooled [N, 1, 1, 1, C] leaves as a reshape), left alone on CUDA.
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[1, 3, 4, 6, 6]);
    let a = conv3d(&mut g, x, 3, 16, [3, 3, 3], 1);
    let a = g.add(Op::Unary(UnaryOp::Relu), &[a]).unwrap();
    let b = conv3d(&mut g, a, 16, 16, [1, 3, 3], 2);
    let b = conv3d(&mut g, b, 16, 16, [3, 1, 1], 3);
    let s = g.add(Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
    let m = g.add(Op::Reduce(ReduceOp::Reduce { kind: ReduceKind::Mean, axes: vec![2, 3, 4], keepdims: true }), &[s]).unwrap();
    // A mean over two of the three spatial axes is no global pool: it reads the region's
    // output from outside.
    let p = g.add(Op::Reduce(ReduceOp::Reduce { kind: ReduceKind::Mean, axes: vec![3, 4], keepdims: true }), &[s]).unwrap();
    g.set_outputs(vec![m, p]);
    assert_eq!(plan_layout(&g, TargetKind::Cuda).regions.len(), 0);
    let cpu = plan_layout(&g, TargetKind::Cpu);
    print!("{}", cpu.report());
    assert_eq!(cpu.regions.len(), 1);
    let r = &cpu.regions[0];
    assert_eq!((r.spatial, r.convs, r.pools, r.entry_transposes, r.exit_transposes), (3, 3, 1, 1, 1));
    assert_eq!(r.layout, Layout::Nhwc);
    let mut h = g.clone();
    assert_eq!(apply_plan(&mut h, &cpu).unwrap(), 1);
    verify(&h).unwrap();
    let nhwc = h.nodes().iter().filter(|n| matches!(&n.op, Op::Linalg(l) if l.is_channels_last())).count();
    let perms: Vec<Vec<usize>> = h
        .nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Layout(LayoutOp::Transpose { perm }) => Some(perm.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(nhwc, 4, "three convs and the pool");
    assert_eq!(perms, [vec![0, 2, 3, 4, 1], vec![0, 4, 1, 2, 3]]);
    assert_same(&g, &h, 9);
}
