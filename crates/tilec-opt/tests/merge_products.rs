//! `merge-products`: products of one activation by constant weights merge into one product
//! (biases too when every member has one), and the merged graph computes exactly what the
//! original did on the reference interpreter; products that must stay apart do.

use rand::{Rng, SeedableRng};
use tilec_ir::op::{BinaryOp, LinalgOp, UnaryOp};
use tilec_ir::{verify, DType, Graph, Op, Tensor, TensorType, ValueId};
use tilec_opt::passes::{Dce, MergeProducts};
use tilec_opt::Pass;

fn random(dt: DType, shape: &[usize], rng: &mut impl Rng) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.0..=1.0)).collect();
    Tensor::from_f64s(dt, shape.to_vec(), &v).unwrap()
}

fn count(g: &Graph, op: &Op) -> usize {
    g.nodes().iter().filter(|n| &n.op == op).count()
}

const MATMUL: Op = Op::Linalg(LinalgOp::MatMul);
const ADD: Op = Op::Binary(BinaryOp::Add);

/// Products of `x: [2, 5, 8]` by weights `[8, n]` for each `n` in `widths`; a bias `[n]`
/// (or `[1, 1, n]` for the second member) added to the members flagged in `bias`; each
/// result through its own consumer so that the outputs stay distinct.
fn products(dt: DType, widths: &[usize], bias: &[bool], seed: u64) -> Graph {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut g = Graph::new("mp");
    let x = g.add_input("x", TensorType::fixed(dt, &[2, 5, 8]));
    let mut outs = vec![];
    for (i, (&n, &b)) in widths.iter().zip(bias).enumerate() {
        let w = g.add_const(&format!("w{i}"), random(dt, &[8, n], &mut rng));
        let mut y = g.add(MATMUL, &[x, w]).unwrap();
        if b {
            let shape: Vec<usize> = if i == 1 { vec![1, 1, n] } else { vec![n] };
            let c = g.add_const(&format!("b{i}"), random(dt, &shape, &mut rng));
            let ins = if i == 2 { [c, y] } else { [y, c] };
            y = g.add(ADD, &ins).unwrap();
        }
        outs.push(g.add(Op::Unary(UnaryOp::Tanh), &[y]).unwrap());
    }
    g.set_outputs(outs);
    verify(&g).unwrap();
    g
}

fn merged(g: &Graph) -> (Graph, bool) {
    let mut m = g.clone();
    let changed = MergeProducts.run(&mut m).unwrap();
    Dce.run(&mut m).unwrap();
    verify(&m).unwrap();
    (m, changed)
}

/// Both graphs on the same random input: bit-identical outputs (each output column is the
/// same dot product in the same order either way).
fn assert_identical(a: &Graph, b: &Graph, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ins: Vec<Tensor> = a
        .inputs()
        .iter()
        .map(|&v| {
            let ty = &a.value(v).ty;
            random(ty.dtype, &ty.fixed_shape().unwrap(), &mut rng)
        })
        .collect();
    let x = tilec_ref::run(a, ins.clone()).unwrap();
    let y = tilec_ref::run(b, ins).unwrap();
    assert_eq!(x.len(), y.len());
    for (p, q) in x.iter().zip(&y) {
        assert_eq!(p.shape(), q.shape());
        assert_eq!(p.to_f64_vec(), q.to_f64_vec());
    }
}

#[test]
fn three_products_with_biases_become_one_product_and_one_bias() {
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let g = products(dt, &[4, 6, 3], &[true, true, true], 1);
        let (m, changed) = merged(&g);
        assert!(changed);
        assert_eq!(count(&m, &MATMUL), 1, "{dt:?}");
        assert_eq!(count(&m, &ADD), 1, "{dt:?}");
        let w = m.nodes().iter().find(|n| n.op == MATMUL).unwrap().inputs[1];
        assert_eq!(m.const_value(w).unwrap().shape(), &[8, 13]);
        assert_identical(&g, &m, 2);
    }
}

#[test]
fn products_without_a_bias_each_merge_without_merging_the_biases() {
    let g = products(DType::F32, &[4, 6, 3], &[true, false, true], 3);
    let (m, changed) = merged(&g);
    assert!(changed);
    assert_eq!(count(&m, &MATMUL), 1);
    assert_eq!(count(&m, &ADD), 2, "the two biases stay after their slices");
    assert_identical(&g, &m, 4);
    let g = products(DType::F32, &[5, 5], &[false, false], 5);
    let (m, _) = merged(&g);
    assert_eq!(count(&m, &MATMUL), 1);
    assert_identical(&g, &m, 6);
}

#[test]
fn products_that_must_stay_apart_do() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // One product alone.
    let g = products(DType::F32, &[4], &[true], 8);
    assert!(!merged(&g).1);
    // Different activations; a weight that is an input; a weight read twice; a batched weight.
    let mut g = Graph::new("apart");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[3, 8]));
    let x2 = g.add_input("x2", TensorType::fixed(DType::F32, &[3, 8]));
    let wi = g.add_input("w_in", TensorType::fixed(DType::F32, &[8, 4]));
    let w0 = g.add_const("w0", random(DType::F32, &[8, 4], &mut rng));
    let w1 = g.add_const("w1", random(DType::F32, &[8, 4], &mut rng));
    let wb = g.add_const("wb", random(DType::F32, &[1, 8, 4], &mut rng));
    let a = g.add(MATMUL, &[x, w0]).unwrap();
    let b = g.add(MATMUL, &[x2, w1]).unwrap();
    let c = g.add(MATMUL, &[x, wi]).unwrap();
    let d = g.add(MATMUL, &[x, wb]).unwrap();
    let e = g.add(MATMUL, &[x2, w0]).unwrap();
    g.set_outputs(vec![a, b, c, d, e]);
    verify(&g).unwrap();
    let (m, changed) = merged(&g);
    assert!(!changed, "{:?}", m.nodes().iter().map(|n| &n.name).collect::<Vec<_>>());
    assert_eq!(count(&m, &MATMUL), 5);
}

#[test]
fn merged_outputs_keep_their_graph_output_positions() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut g = Graph::new("outs");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[4, 8]));
    let ws: Vec<ValueId> = (0..3).map(|i| g.add_const(&format!("w{i}"), random(DType::F32, &[8, 2 + i], &mut rng))).collect();
    let ys: Vec<ValueId> = ws.iter().map(|&w| g.add(MATMUL, &[x, w]).unwrap()).collect();
    g.set_outputs(vec![ys[2], ys[0], ys[1]]);
    let (m, changed) = merged(&g);
    assert!(changed);
    assert_eq!(count(&m, &MATMUL), 1);
    let shapes: Vec<_> = m.outputs().iter().map(|&o| m.value(o).ty.fixed_shape().unwrap()).collect();
    assert_eq!(shapes, vec![vec![4, 4], vec![4, 2], vec![4, 3]]);
    assert_identical(&g, &m, 10);
}
