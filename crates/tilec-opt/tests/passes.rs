//! Unit tests per pass (the rewrite happens; it does not happen when illegal), pipeline
//! tests, and property tests: random small graphs of elementwise/reshape/transpose/cast
//! ops, optimized and compared against the original on the reference interpreter.

use rand::{Rng, SeedableRng};
use tilec_ir::op::{BinaryOp, IndexOp, LayoutOp, LinalgOp, NormOp, Padding, SliceBound, SourceOp, UnaryOp, Window};
use tilec_ir::{verify, DType, Dim, Graph, Op, Tensor, TensorType, ValueId};
use tilec_opt::manager::{Pipeline, PipelineOptions, Stage};
use tilec_opt::passes::{Cse, Dce, FoldBatchNorm, FoldConstants, Simplify};
use tilec_opt::{OptError, Pass};

fn f32c(g: &mut Graph, shape: &[usize], v: &[f64]) -> ValueId {
    g.add_const(
        "c",
        Tensor::from_f64s(DType::F32, shape.to_vec(), v).unwrap(),
    )
}

fn ops(g: &Graph) -> Vec<&'static str> {
    g.nodes().iter().map(|n| n.op.name()).collect()
}

fn run_pass(p: &dyn Pass, g: &mut Graph) -> bool {
    let changed = p.run(g).unwrap();
    verify(g).unwrap();
    changed
}

fn bin(b: BinaryOp) -> Op {
    Op::Binary(b)
}

fn input(g: &mut Graph, dt: DType, shape: &[usize]) -> ValueId {
    let name = format!("in{}", g.inputs().len());
    g.add_input(&name, TensorType::fixed(dt, shape))
}

/// Runs both graphs on the same random inputs; asserts equal outputs.
fn assert_same(a: &Graph, b: &Graph, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ins: Vec<Tensor> = a
        .inputs()
        .iter()
        .map(|&v| {
            let ty = &a.value(v).ty;
            let shape = ty.fixed_shape().unwrap();
            let n: usize = shape.iter().product();
            let vals: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..=1.0)).collect();
            let vals: Vec<f64> = if ty.dtype.is_float() {
                vals
            } else {
                vals.iter().map(|x| (x * 4.0).round()).collect()
            };
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
                *u == v || (u - v).abs() <= 1e-5 + 1e-4 * u.abs() || (u.is_nan() && v.is_nan()),
                "{u} vs {v}"
            );
        }
    }
}

// ---------------- dce / cse ----------------

#[test]
fn dce_removes_unused_nodes() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[4]);
    let _dead = g.add(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    let y = g.add(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    g.set_outputs(vec![y]);
    assert!(run_pass(&Dce, &mut g));
    assert_eq!(ops(&g), ["relu"]);
    assert!(!run_pass(&Dce, &mut g));
}

#[test]
fn cse_merges_identical_nodes_and_constants() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[3]);
    let c1 = f32c(&mut g, &[3], &[1.0, 2.0, 3.0]);
    let c2 = f32c(&mut g, &[3], &[1.0, 2.0, 3.0]);
    let a = g.add(bin(BinaryOp::Add), &[x, c1]).unwrap();
    let b = g.add(bin(BinaryOp::Add), &[x, c2]).unwrap();
    let m = g.add(bin(BinaryOp::Mul), &[a, b]).unwrap();
    g.set_outputs(vec![m]);
    let orig = g.clone();
    assert!(run_pass(&Cse::default(), &mut g));
    assert_eq!(ops(&g), ["add", "mul"]);
    assert_eq!(g.nodes()[1].inputs[0], g.nodes()[1].inputs[1]);
    assert_same(&orig, &g, 1);
}

#[test]
fn cse_keeps_nodes_that_differ_in_attributes_or_inputs() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[3]);
    let a = g
        .add(Op::Unary(UnaryOp::LeakyRelu { alpha: 0.1 }), &[x])
        .unwrap();
    let b = g
        .add(Op::Unary(UnaryOp::LeakyRelu { alpha: 0.2 }), &[x])
        .unwrap();
    let c = g
        .add(Op::Unary(UnaryOp::LeakyRelu { alpha: f32::NAN }), &[x])
        .unwrap();
    let d = g
        .add(Op::Unary(UnaryOp::LeakyRelu { alpha: f32::NAN }), &[x])
        .unwrap();
    let e = g.add(bin(BinaryOp::Sub), &[x, a]).unwrap();
    let f = g.add(bin(BinaryOp::Sub), &[a, x]).unwrap();
    g.set_outputs(vec![a, b, c, d, e, f]);
    assert!(!run_pass(&Cse::default(), &mut g));
    assert_eq!(g.nodes().len(), 6);
}

// ---------------- fold-constants ----------------

#[test]
fn fold_constants_evaluates_constant_chains() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[2]);
    let a = f32c(&mut g, &[2], &[1.0, 2.0]);
    let b = f32c(&mut g, &[2], &[3.0, 4.0]);
    let s = g.add(bin(BinaryOp::Add), &[a, b]).unwrap();
    let t = g.add(Op::Unary(UnaryOp::Neg), &[s]).unwrap();
    let y = g.add(bin(BinaryOp::Mul), &[x, t]).unwrap();
    g.set_outputs(vec![y]);
    let orig = g.clone();
    assert!(run_pass(&FoldConstants::default(), &mut g));
    assert_eq!(ops(&g), ["mul"]);
    let c = g.const_value(g.nodes()[0].inputs[1]).unwrap();
    assert_eq!(c.to_f64_vec(), [-4.0, -6.0]);
    assert_same(&orig, &g, 2);
}

/// A sinusoidal position table built from constants (as Funnel's relative attention exports
/// it: `sin` and `cos` of a 300 x 256 table, concatenated, gathered, multiplied by a weight
/// read nowhere else) folds whole though each step exceeds the small-fold limit: none of it
/// grows the model. A transpose of a large weight that is read elsewhere too stays an op
/// (folding it would duplicate the weight).
#[test]
fn fold_constants_folds_input_independent_tables() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[64, 64]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut rnd = |shape: &[usize]| -> Vec<f64> { (0..shape.iter().product::<usize>()).map(|_| rng.gen_range(-3.0..3.0)).collect() };
    let pos = f32c(&mut g, &[300, 256], &rnd(&[300, 256]));
    let s = g.add(Op::Unary(UnaryOp::Sin), &[pos]).unwrap();
    let c = g.add(Op::Unary(UnaryOp::Cos), &[pos]).unwrap();
    let cat = g.add(Op::Layout(LayoutOp::Concat { axis: 1 }), &[s, c]).unwrap();
    let idx: Vec<f64> = (0..256 * 512).map(|i| ((i * 7) % 300) as f64).collect();
    let idx = g.add_const("idx", Tensor::from_f64s(DType::I64, vec![256, 512], &idx).unwrap());
    let table = g.add(Op::Index(IndexOp::GatherElements { axis: 0 }), &[cat, idx]).unwrap();
    let w = f32c(&mut g, &[512, 64], &rnd(&[512, 64]));
    let proj = g.add(Op::Linalg(LinalgOp::MatMul), &[table, w]).unwrap();
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[proj, x]).unwrap();
    // A weight read twice: as is, and transposed.
    let big = f32c(&mut g, &[64, 1200], &rnd(&[64, 1200]));
    let bt = g.add(Op::Layout(LayoutOp::Transpose { perm: vec![1, 0] }), &[big]).unwrap();
    let z = g.add(Op::Linalg(LinalgOp::MatMul), &[x, big]).unwrap();
    let zt = g.add(Op::Linalg(LinalgOp::MatMul), &[bt, x]).unwrap();
    g.set_outputs(vec![y, z, zt]);
    let orig = g.clone();
    assert!(run_pass(&FoldConstants::default(), &mut g));
    assert_eq!(ops(&g), ["matmul", "transpose", "matmul", "matmul"], "{:?}", ops(&g));
    assert_same(&orig, &g, 4);
}

#[test]
fn fold_constants_does_not_materialize_large_splats() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[1000, 1000]);
    let big = g
        .add(
            Op::Source(SourceOp::Fill {
                shape: vec![Dim::Fixed(1000), Dim::Fixed(1000)],
                value: Tensor::scalar(2.0f32),
            }),
            &[],
        )
        .unwrap();
    let small = g
        .add(
            Op::Source(SourceOp::Fill {
                shape: vec![Dim::Fixed(1000)],
                value: Tensor::scalar(3.0f32),
            }),
            &[],
        )
        .unwrap();
    let y = g.add(bin(BinaryOp::Mul), &[x, big]).unwrap();
    let z = g.add(bin(BinaryOp::Add), &[y, small]).unwrap();
    // A broadcast of a small constant to a large shape is not folded either.
    let one = f32c(&mut g, &[1], &[5.0]);
    let e = g
        .add(
            Op::Layout(LayoutOp::Expand {
                shape: vec![Dim::Fixed(1000), Dim::Fixed(1000)],
            }),
            &[one],
        )
        .unwrap();
    let w = g.add(bin(BinaryOp::Sub), &[z, e]).unwrap();
    g.set_outputs(vec![w]);
    assert!(run_pass(&FoldConstants::default(), &mut g));
    assert!(
        ops(&g).contains(&"fill") && ops(&g).contains(&"expand"),
        "{:?}",
        ops(&g)
    );
    assert_eq!(
        g.nodes().iter().filter(|n| n.op.name() == "fill").count(),
        1,
        "only the small fill folds"
    );
}

// ---------------- simplify ----------------

fn simplified(build: impl FnOnce(&mut Graph) -> ValueId) -> (Graph, Graph) {
    let mut g = Graph::new("t");
    let y = build(&mut g);
    g.set_outputs(vec![y]);
    let orig = g.clone();
    run_pass(&Simplify, &mut g);
    run_pass(&Dce, &mut g);
    assert_same(&orig, &g, 3);
    (orig, g)
}

#[test]
fn simplify_removes_neutral_arithmetic() {
    for (b, c, left) in [
        (BinaryOp::Mul, 1.0, false),
        (BinaryOp::Mul, 1.0, true),
        (BinaryOp::Add, 0.0, true),
        (BinaryOp::Add, 0.0, false),
        (BinaryOp::Sub, 0.0, false),
        (BinaryOp::Div, 1.0, false),
    ] {
        let (_, g) = simplified(|g| {
            let x = input(g, DType::F32, &[2, 3]);
            let k = f32c(g, &[], &[c]);
            let ins = if left { [k, x] } else { [x, k] };
            g.add(bin(b.clone()), &ins).unwrap()
        });
        assert!(g.nodes().is_empty(), "{b:?} {left}: {:?}", ops(&g));
    }
}

#[test]
fn simplify_keeps_non_identities() {
    // 0 - x, 1 / x, x * 2 and x * [1, 2, 1] are not identities.
    for (b, v, left) in [
        (BinaryOp::Sub, vec![0.0], true),
        (BinaryOp::Div, vec![1.0], true),
        (BinaryOp::Mul, vec![2.0], false),
        (BinaryOp::Mul, vec![1.0, 2.0, 1.0], false),
    ] {
        let (_, g) = simplified(|g| {
            let x = input(g, DType::F32, &[2, 3]);
            let k = f32c(g, &[v.len()], &v);
            let ins = if left { [k, x] } else { [x, k] };
            g.add(bin(b.clone()), &ins).unwrap()
        });
        assert_eq!(g.nodes().len(), 1, "{b:?}");
    }
}

#[test]
fn simplify_broadcasting_one_becomes_expand() {
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[3]);
        let k = f32c(g, &[2, 3], &[1.0; 6]);
        g.add(bin(BinaryOp::Mul), &[x, k]).unwrap()
    });
    assert_eq!(ops(&g), ["expand"]);
}

#[test]
fn simplify_transposes() {
    let t = |p: &[usize]| Op::Layout(LayoutOp::Transpose { perm: p.to_vec() });
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[2, 3, 4]);
        let a = g.add(t(&[1, 2, 0]), &[x]).unwrap();
        g.add(t(&[2, 0, 1]), &[a]).unwrap()
    });
    assert!(g.nodes().is_empty(), "{:?}", ops(&g));
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[2, 3, 4]);
        let a = g.add(t(&[1, 2, 0]), &[x]).unwrap();
        g.add(t(&[1, 0, 2]), &[a]).unwrap()
    });
    assert_eq!(ops(&g), ["transpose"]);
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[2, 3]);
        g.add(t(&[0, 1]), &[x]).unwrap()
    });
    assert!(g.nodes().is_empty());
}

#[test]
fn simplify_reshapes_expand_slice_concat_neg() {
    let r = |s: &[usize]| {
        Op::Layout(LayoutOp::Reshape {
            shape: s.iter().map(|&d| Dim::Fixed(d)).collect(),
        })
    };
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[2, 6]);
        let a = g.add(r(&[3, 4]), &[x]).unwrap();
        g.add(r(&[12]), &[a]).unwrap()
    });
    assert_eq!(ops(&g), ["reshape"]);
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[2, 6]);
        let a = g.add(r(&[3, 4]), &[x]).unwrap();
        g.add(r(&[2, 6]), &[a]).unwrap()
    });
    assert!(g.nodes().is_empty());
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[2, 3]);
        let a = g
            .add(
                Op::Layout(LayoutOp::Expand {
                    shape: vec![Dim::Fixed(3)],
                }),
                &[x],
            )
            .unwrap();
        let b = g
            .add(
                Op::Layout(LayoutOp::Slice {
                    axes: vec![1],
                    starts: vec![SliceBound::Index(0)],
                    ends: vec![SliceBound::Index(i64::MAX)],
                    steps: vec![1],
                }),
                &[a],
            )
            .unwrap();
        let c = g
            .add(Op::Layout(LayoutOp::Concat { axis: 0 }), &[b])
            .unwrap();
        let d = g.add(Op::Unary(UnaryOp::Neg), &[c]).unwrap();
        g.add(Op::Unary(UnaryOp::Neg), &[d]).unwrap()
    });
    assert!(g.nodes().is_empty(), "{:?}", ops(&g));
    // A reversing slice and a partial slice stay.
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[2, 3]);
        let a = g
            .add(
                Op::Layout(LayoutOp::Slice {
                    axes: vec![1],
                    starts: vec![SliceBound::Index(-1)],
                    ends: vec![SliceBound::Index(i64::MIN)],
                    steps: vec![-1],
                }),
                &[x],
            )
            .unwrap();
        g.add(
            Op::Layout(LayoutOp::Slice {
                axes: vec![1],
                starts: vec![SliceBound::Index(1)],
                ends: vec![SliceBound::Index(3)],
                steps: vec![1],
            }),
            &[a],
        )
        .unwrap()
    });
    assert_eq!(ops(&g), ["slice", "slice"]);
}

#[test]
fn simplify_cast_chains_only_when_exact() {
    let c = |to| Op::Cast { to, saturate: true };
    let chain = |a: DType, b: DType, cc: DType| {
        simplified(|g| {
            let x = input(g, a, &[4]);
            let y = g.add(c(b), &[x]).unwrap();
            g.add(c(cc), &[y]).unwrap()
        })
        .1
    };
    assert!(chain(DType::F16, DType::F32, DType::F16).nodes().is_empty());
    assert!(chain(DType::I32, DType::I64, DType::I32).nodes().is_empty());
    assert_eq!(
        ops(&chain(DType::F32, DType::F16, DType::F32)),
        ["cast", "cast"]
    );
    assert_eq!(
        ops(&chain(DType::I64, DType::I32, DType::I64)),
        ["cast", "cast"]
    );
    assert_eq!(
        ops(&chain(DType::F32, DType::I32, DType::F32)),
        ["cast", "cast"]
    );
    // Exact widening then a different target: one cast.
    assert_eq!(ops(&chain(DType::F16, DType::F32, DType::F64)), ["cast"]);
    assert!(chain(DType::F32, DType::F32, DType::F32).nodes().is_empty());
    // The test inputs above never hit the narrowing cases' failures; show one directly.
    let v = Tensor::from_f64s(DType::F32, vec![1], &[0.1]).unwrap();
    assert_ne!(
        v.cast(DType::F16).cast(DType::F32).to_f64_vec(),
        v.to_f64_vec()
    );
}

// ---------------- fold-batchnorm ----------------

fn conv_bn(extra_use: bool, fill_bias: bool) -> Graph {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut r = |n: usize| -> Vec<f64> { (0..n).map(|_| rng.gen_range(-1.0..=1.0)).collect() };
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[1, 2, 5, 5]);
    let w = f32c(&mut g, &[3, 2, 3, 3], &r(54));
    let b = if fill_bias {
        g.add(
            Op::Source(SourceOp::Fill {
                shape: vec![Dim::Fixed(3)],
                value: Tensor::scalar(0.0f32),
            }),
            &[],
        )
        .unwrap()
    } else {
        f32c(&mut g, &[3], &r(3))
    };
    let window = Window {
        kernel: vec![3, 3],
        strides: vec![1, 1],
        pads: Padding::Explicit(vec![1, 1, 1, 1]),
        dilations: vec![1, 1],
    };
    let y = g
        .add(Op::Linalg(LinalgOp::Conv {
                window,
                group: 1,
                channels_last: false,
            }), &[x, w, b])
        .unwrap();
    let s = f32c(&mut g, &[3], &r(3));
    let bb = f32c(&mut g, &[3], &r(3));
    let m = f32c(&mut g, &[3], &r(3));
    let v: Vec<f64> = r(3).iter().map(|x| x.abs() + 0.1).collect();
    let v = f32c(&mut g, &[3], &v);
    let z = g
        .add(
            Op::Norm(NormOp::BatchNorm {
                epsilon: 1e-5,
                channels_last: false,
            }),
            &[y, s, bb, m, v],
        )
        .unwrap();
    g.set_outputs(if extra_use { vec![z, y] } else { vec![z] });
    g
}

#[test]
fn fold_batchnorm_into_conv() {
    for fill_bias in [false, true] {
        let mut g = conv_bn(false, fill_bias);
        let orig = g.clone();
        assert!(run_pass(&FoldBatchNorm, &mut g));
        assert_eq!(ops(&g), ["conv"]);
        assert_same(&orig, &g, 4);
    }
    // The conv output is also a graph output: folding would need the conv twice.
    let mut g = conv_bn(true, false);
    assert!(!run_pass(&FoldBatchNorm, &mut g));
    assert_eq!(ops(&g), ["conv", "batch_norm"]);
}

// ---------------- pipeline ----------------

#[test]
fn pipeline_levels_reports_and_printing() {
    assert!(Pipeline::for_level(0).stages.is_empty());
    let o1 = Pipeline::for_level(1).describe().join(" ");
    let o2 = Pipeline::for_level(2).describe().join(" ");
    assert!(
        !o1.contains("cse") && !o1.contains("fold-batchnorm"),
        "{o1}"
    );
    assert!(o2.contains("cse") && o2.contains("fold-batchnorm"), "{o2}");
    let mut g = conv_bn(false, true);
    let opts = PipelineOptions {
        verify: true,
        print_ir_after: Some("fold-batchnorm".into()),
    };
    let reps = Pipeline::for_level(3).run(&mut g, &opts).unwrap();
    assert_eq!(ops(&g), ["conv"]);
    let fb: Vec<_> = reps.iter().filter(|r| r.pass == "fold-batchnorm").collect();
    assert_eq!(fb.len(), 1);
    assert!(fb[0].changed && fb[0].ir_after.as_deref().unwrap_or("").contains("conv"));
    assert!(reps
        .iter()
        .filter(|r| r.pass != "fold-batchnorm")
        .all(|r| r.ir_after.is_none()));
    // The fixpoint terminates: the last round of each group changed nothing.
    assert!(reps.last().map(|r| !r.changed).unwrap_or(false));
}

struct Breaker;
impl Pass for Breaker {
    fn name(&self) -> &'static str {
        "breaker"
    }
    fn run(&self, g: &mut Graph) -> Result<bool, OptError> {
        g.nodes_mut_unchecked().reverse();
        Ok(true)
    }
}

#[test]
fn verification_names_the_broken_pass() {
    let mut g = Graph::new("t");
    let x = input(&mut g, DType::F32, &[2]);
    let a = g.add(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    let b = g.add(Op::Unary(UnaryOp::Exp), &[a]).unwrap();
    g.set_outputs(vec![b]);
    let p = Pipeline {
        level: 1,
        stages: vec![Stage::Once(Box::new(Dce)), Stage::Once(Box::new(Breaker))],
    };
    let e = p
        .run(
            &mut g,
            &PipelineOptions {
                verify: true,
                print_ir_after: None,
            },
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("breaker"), "{e}");
}

// ---------------- property test: random graphs ----------------

/// A random graph over a [2, 3, 4] f32 input: elementwise ops with neutral and other
/// constants, transposes, reshapes, casts, duplicated subexpressions, constant subgraphs.
fn random_graph(seed: u64) -> Graph {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut g = Graph::new("p");
    let x = input(&mut g, DType::F32, &[2, 3, 4]);
    let mut pool = vec![x];
    let mut extra = Vec::new();
    for _ in 0..rng.gen_range(3..12) {
        let a = pool[rng.gen_range(0..pool.len())];
        let sh = g.value(a).ty.fixed_shape().unwrap();
        let rank = sh.len();
        let v = match rng.gen_range(0..10) {
            0 => {
                let u = [UnaryOp::Relu, UnaryOp::Neg, UnaryOp::Tanh, UnaryOp::Abs]
                    [rng.gen_range(0..4)]
                .clone();
                g.add(Op::Unary(u), &[a])
            }
            1 | 2 => {
                let b = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div]
                    [rng.gen_range(0..4)]
                .clone();
                let val = [0.0, 1.0, 2.0, -0.5][rng.gen_range(0..4)];
                let cshape: Vec<usize> = match rng.gen_range(0..3) {
                    0 => vec![],
                    1 => vec![*sh.last().unwrap_or(&1)],
                    _ => [vec![2], sh.clone()].concat(),
                };
                let n: usize = cshape.iter().product();
                let k = f32c(&mut g, &cshape, &vec![val; n]);
                let ins = if rng.gen_bool(0.5) { [a, k] } else { [k, a] };
                g.add(bin(b), &ins)
            }
            3 => {
                // Same-shape binary with another pool value (or itself).
                let same: Vec<ValueId> = pool
                    .iter()
                    .copied()
                    .filter(|&p| g.value(p).ty == g.value(a).ty)
                    .collect();
                let b = same[rng.gen_range(0..same.len())];
                g.add(bin(BinaryOp::Add), &[a, b])
            }
            4 | 5 => {
                let mut perm: Vec<usize> = (0..rank).collect();
                for i in (1..rank).rev() {
                    perm.swap(i, rng.gen_range(0..=i));
                }
                g.add(Op::Layout(LayoutOp::Transpose { perm }), &[a])
            }
            6 => {
                let shapes = [
                    vec![24],
                    vec![2, 12],
                    vec![6, 4],
                    vec![2, 3, 4],
                    vec![4, 3, 2],
                ];
                let s = &shapes[rng.gen_range(0..shapes.len())];
                g.add(
                    Op::Layout(LayoutOp::Reshape {
                        shape: s.iter().map(|&d| Dim::Fixed(d)).collect(),
                    }),
                    &[a],
                )
            }
            7 => {
                let mid = [DType::F64, DType::F16, DType::F32][rng.gen_range(0..3)];
                let c = g
                    .add(
                        Op::Cast {
                            to: mid,
                            saturate: true,
                        },
                        &[a],
                    )
                    .unwrap();
                g.add(
                    Op::Cast {
                        to: DType::F32,
                        saturate: true,
                    },
                    &[c],
                )
            }
            8 => {
                // A constant subgraph feeding an add.
                let k1 = f32c(&mut g, &[1], &[rng.gen_range(-1.0..1.0)]);
                let k2 = f32c(&mut g, &[1], &[rng.gen_range(-1.0..1.0)]);
                let k = g.add(bin(BinaryOp::Mul), &[k1, k2]).unwrap();
                g.add(bin(BinaryOp::Add), &[a, k])
            }
            _ => {
                // A duplicate of an existing node.
                let src = g.producer(a).map(|n| g.node(n).clone());
                match src {
                    Some(n) => g.add(n.op, &n.inputs),
                    None => g.add(Op::Unary(UnaryOp::Relu), &[a]),
                }
            }
        };
        let v = v.unwrap();
        // Broadcasts to [2, ..] leave the 24-element family: outputs only.
        if g.value(v).ty.numel() == Some(24) {
            pool.push(v);
        } else {
            extra.push(v);
        }
    }
    let mut outs = vec![*pool.last().unwrap()];
    outs.extend(extra);
    if rng.gen_bool(0.5) {
        outs.push(pool[rng.gen_range(0..pool.len())]);
    }
    g.set_outputs(outs);
    verify(&g).unwrap();
    g
}

#[test]
fn random_graphs_optimize_to_equivalent_graphs() {
    let opts = PipelineOptions {
        verify: true,
        print_ir_after: None,
    };
    let (mut before, mut after) = (0, 0);
    for seed in 0..300 {
        let g = random_graph(seed);
        let mut o = g.clone();
        Pipeline::for_level(3)
            .run(&mut o, &opts)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        before += g.nodes().len();
        after += o.nodes().len();
        // f16 round trips are kept, so results match exactly up to f32 rounding.
        assert_same(&g, &o, seed);
        // Optimizing again changes nothing (the pipeline reached a fixpoint).
        let mut o2 = o.clone();
        Pipeline::for_level(3).run(&mut o2, &opts).unwrap();
        assert_eq!(
            tilec_ir::print_graph(&o2),
            tilec_ir::print_graph(&o),
            "seed {seed}"
        );
    }
    println!("random graphs: {before} -> {after} nodes");
    assert!(after < before);
}

#[test]
fn simplify_gathers_of_every_position_in_order() {
    let gather = |axis: usize| Op::Index(IndexOp::Gather { axis });
    let idx = |g: &mut Graph, v: &[i64]| g.add_const("i", Tensor::from_vec(vec![v.len()], v.to_vec()).unwrap());
    // Every row in order, along axis 0 and axis 1 (i32 and i64 indices): the identity.
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[4, 3]);
        let i = idx(g, &[0, 1, 2, 3]);
        g.add(gather(0), &[x, i]).unwrap()
    });
    assert!(g.nodes().is_empty(), "{:?}", ops(&g));
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[2, 3]);
        let i = g.add_const("i", Tensor::from_vec(vec![3], vec![0i32, 1, 2]).unwrap());
        g.add(gather(1), &[x, i]).unwrap()
    });
    assert!(g.nodes().is_empty(), "{:?}", ops(&g));
    // Not identities: a permutation, a prefix, a repeat, negative positions, indices of
    // another shape ([4, 1]).
    for v in [vec![1i64, 0, 2, 3], vec![0, 1, 2], vec![0, 1, 2, 3, 0], vec![-4, -3, -2, -1]] {
        let (_, g) = simplified(|g| {
            let x = input(g, DType::F32, &[4, 3]);
            let i = idx(g, &v);
            g.add(gather(0), &[x, i]).unwrap()
        });
        assert_eq!(ops(&g), ["gather"], "{v:?}");
    }
    let (_, g) = simplified(|g| {
        let x = input(g, DType::F32, &[4, 3]);
        let i = g.add_const("i", Tensor::from_vec(vec![4, 1], vec![0i64, 1, 2, 3]).unwrap());
        g.add(gather(0), &[x, i]).unwrap()
    });
    assert_eq!(ops(&g), ["gather"]);
}

// ---------------- einsum-to-matmul ----------------

#[test]
fn einsum_products_become_matmuls() {
    use tilec_opt::passes::EinsumToMatmul;
    // (subscripts of the inputs, output, shapes): attention's two products over
    // (batch, window, head), a transposed 2-D product, a broadcast batch, and a trace and an
    // outer product, which stay einsums.
    let cases: Vec<(Vec<Vec<u8>>, Vec<u8>, Vec<Vec<usize>>, bool)> = vec![
        (vec![vec![0, 1, 2, 3, 4], vec![0, 1, 2, 5, 4]], vec![0, 1, 2, 3, 5], vec![vec![1, 3, 2, 5, 4], vec![1, 3, 2, 6, 4]], true),
        (vec![vec![0, 1, 2, 3, 5], vec![0, 1, 2, 5, 4]], vec![0, 1, 2, 3, 4], vec![vec![1, 3, 2, 5, 6], vec![1, 3, 2, 6, 4]], true),
        (vec![vec![0, 1], vec![1, 2]], vec![2, 0], vec![vec![3, 5], vec![5, 4]], true),
        (vec![vec![0, 1, 2], vec![0, 2, 3]], vec![0, 3, 1], vec![vec![1, 3, 5], vec![4, 5, 2]], true),
        // Groups of labels flattened: a 3-D weight (Funnel: ij,jkl->ikl), two contracted
        // labels, two batch labels with two M labels and N in the middle of the output.
        (vec![vec![0, 1], vec![1, 2, 3]], vec![0, 2, 3], vec![vec![7, 6], vec![6, 3, 4]], true),
        (vec![vec![0, 1, 2], vec![1, 2, 3]], vec![0, 3], vec![vec![5, 3, 4], vec![3, 4, 6]], true),
        (vec![vec![0, 1, 2, 3, 4], vec![0, 1, 4, 5]], vec![1, 2, 5, 0, 3], vec![vec![2, 3, 4, 5, 6], vec![2, 3, 6, 7]], true),
        (vec![vec![0, 0]], vec![], vec![vec![4, 4]], false),
        (vec![vec![0], vec![1]], vec![0, 1], vec![vec![3], vec![4]], false),
    ];
    for (i, (subs, out, shapes, converts)) in cases.into_iter().enumerate() {
        let mut g = Graph::new("einsum");
        let ins: Vec<ValueId> = shapes.iter().map(|s| input(&mut g, DType::F32, s)).collect();
        let y = g.add(Op::Linalg(LinalgOp::Einsum { inputs: subs, output: out }), &ins).unwrap();
        g.set_outputs(vec![y]);
        let before = g.clone();
        assert_eq!(run_pass(&EinsumToMatmul, &mut g), converts, "case {i}: {:?}", ops(&g));
        assert_eq!(ops(&g).contains(&"einsum"), !converts, "case {i}: {:?}", ops(&g));
        assert_eq!(ops(&g).contains(&"matmul"), converts, "case {i}: {:?}", ops(&g));
        assert_same(&before, &g, 40 + i as u64);
    }
}

#[test]
fn simplify_slice_assignments_written_as_scatters() {
    let scatter = Op::Index(IndexOp::ScatterND { reduction: tilec_ir::op::ScatterReduction::None });
    let idx = |g: &mut Graph, shape: Vec<usize>, v: Vec<i64>| g.add_const("i", Tensor::from_vec(shape, v).unwrap());
    // x[1:4] = y (x of 6 rows), x[0:6] = y (every row: y itself, reshaped from [2, 3, 5]),
    // x[-2:] = y (negative positions): concatenations, no scatter.
    for (shape, v, y_shape, want) in [
        (vec![3, 1], vec![1i64, 2, 3], vec![3, 4, 5], vec!["concat", "slice", "slice"]),
        (vec![2, 3, 1], vec![0, 1, 2, 3, 4, 5], vec![2, 3, 4, 5], vec!["reshape"]),
        (vec![2, 1], vec![-2, -1], vec![2, 4, 5], vec!["concat", "slice"]),
    ] {
        let (_, g) = simplified(|g| {
            let x = input(g, DType::F32, &[6, 4, 5]);
            let y = input(g, DType::F32, &y_shape);
            let i = idx(g, shape.clone(), v.clone());
            g.add(scatter.clone(), &[x, i, y]).unwrap()
        });
        let mut got = ops(&g);
        got.sort();
        assert_eq!(got, want, "{v:?}");
    }
    // Not slices: positions out of order, repeated, or two coordinates each.
    for (shape, v) in [(vec![2, 1], vec![3i64, 1]), (vec![2, 1], vec![2, 2]), (vec![2, 2], vec![0, 1, 1, 1])] {
        let (_, g) = simplified(|g| {
            let x = input(g, DType::F32, &[6, 4, 5]);
            let ys = if shape[1] == 2 { vec![2, 5] } else { vec![2, 4, 5] };
            let y = input(g, DType::F32, &ys);
            let i = idx(g, shape.clone(), v.clone());
            g.add(scatter.clone(), &[x, i, y]).unwrap()
        });
        assert_eq!(ops(&g), ["scatter_nd"], "{v:?}");
    }
}

#[test]
fn simplify_elementwise_ops_under_a_unit_view() {
    let reshape = |g: &mut Graph, x: ValueId, s: &[usize]| {
        g.add(Op::Layout(LayoutOp::Reshape { shape: s.iter().map(|&d| Dim::Fixed(d)).collect() }), &[x]).unwrap()
    };
    // Swin's mask at batch 1: scores [4, 3, 5, 5] viewed as [1, 4, 3, 5, 5], plus a mask
    // [1, 4, 1, 5, 5], viewed back: one add at rank 4 (the mask reshaped to [4, 1, 5, 5]).
    let (_, g) = simplified(|g| {
        let s = input(g, DType::F32, &[4, 3, 5, 5]);
        let m = input(g, DType::F32, &[1, 4, 1, 5, 5]);
        let v = reshape(g, s, &[1, 4, 3, 5, 5]);
        let a = g.add(Op::Binary(BinaryOp::Add), &[v, m]).unwrap();
        reshape(g, a, &[4, 3, 5, 5])
    });
    let mut got = ops(&g);
    got.sort();
    assert_eq!(got, ["add", "reshape"]);
    let add = g.nodes().iter().find(|n| n.op.name() == "add").unwrap();
    assert!(add.inputs.iter().all(|&i| g.value(i).ty.rank() == 4), "{:?}", ops(&g));
    // The operand first, and one of lower rank: no reshape needed.
    let (_, g) = simplified(|g| {
        let s = input(g, DType::F32, &[4, 3]);
        let m = input(g, DType::F32, &[3]);
        let v = reshape(g, s, &[1, 1, 4, 3]);
        let a = g.add(Op::Binary(BinaryOp::Sub), &[m, v]).unwrap();
        reshape(g, a, &[4, 3])
    });
    assert_eq!(ops(&g), ["sub"]);
    // Kept: a view that splits a dim ([2, 2, 3, 5, 5]), an operand that grows the result, a
    // result read in the viewed shape too.
    let (_, g) = simplified(|g| {
        let s = input(g, DType::F32, &[4, 3, 5, 5]);
        let m = input(g, DType::F32, &[1, 2, 1, 5, 5]);
        let v = reshape(g, s, &[2, 2, 3, 5, 5]);
        let a = g.add(Op::Binary(BinaryOp::Add), &[v, m]).unwrap();
        reshape(g, a, &[4, 3, 5, 5])
    });
    assert_eq!(ops(&g).iter().filter(|o| **o == "reshape").count(), 2);
    let (_, g) = simplified(|g| {
        let s = input(g, DType::F32, &[4, 3]);
        let m = input(g, DType::F32, &[2, 4, 3]);
        let v = reshape(g, s, &[1, 4, 3]);
        let a = g.add(Op::Binary(BinaryOp::Add), &[v, m]).unwrap();
        reshape(g, a, &[2, 12])
    });
    assert_eq!(ops(&g).iter().filter(|o| **o == "reshape").count(), 2);
    let mut g = Graph::new("t");
    let s = input(&mut g, DType::F32, &[4, 3]);
    let m = input(&mut g, DType::F32, &[1, 4, 3]);
    let v = reshape(&mut g, s, &[1, 4, 3]);
    let a = g.add(Op::Binary(BinaryOp::Mul), &[v, m]).unwrap();
    let y = reshape(&mut g, a, &[4, 3]);
    g.set_outputs(vec![y, a]);
    let orig = g.clone();
    run_pass(&Simplify, &mut g);
    assert_same(&orig, &g, 4);
    assert_eq!(ops(&g).iter().filter(|o| **o == "mul").count(), 1, "{:?}", ops(&g));
}
