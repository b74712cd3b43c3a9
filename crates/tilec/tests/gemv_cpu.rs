//! Matrix products of few rows on the compiled CPU path (`cpu.gemv`), against the reference
//! interpreter on fresh random weights and inputs, the arena poisoned before each run: 1 to 4
//! rows (8 forced), K and N that are not multiples of the vector width, weights `[K, N]` and
//! transposed `[N, K]` (as PyTorch's Linear exports them), with and without bias, ReLU,
//! hardswish, SiLU and a residual add fused, weights as constants (laid out once at bind) and
//! as graph inputs (forced: laid out on every call), and the product with the weights on the
//! left (`W · x`, transposed onto the template), batches of rows sharing the weights. Every case asserts which family builds the
//! product, so that a dispatcher that stops choosing `cpu.gemv` fails here.

use rand::{Rng, SeedableRng};
use tilec::compiled::{compile, CompileOptions};

mod poisoned;
use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp, UnaryOp};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType, ValueId};

fn random(shape: &[usize], rng: &mut impl Rng) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    Tensor::from_vec(shape.to_vec(), v).unwrap()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    None,
    Relu,
    HardSwish,
    Silu,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    k: usize,
    n: usize,
    /// Weights stored `[N, K]` and transposed in the graph.
    trans: bool,
    bias: bool,
    act: Act,
    residual: bool,
    /// Weights a graph input rather than a constant.
    input_weights: bool,
    /// `W · xᵀ`: the weights on the left, the output `[N, M]`.
    left: bool,
    /// A leading batch axis of `x` (and the output) over the one weight matrix: `[lead, M, K]`.
    lead: usize,
}

fn case(m: usize, k: usize, n: usize) -> Case {
    Case { m, k, n, trans: false, bias: false, act: Act::None, residual: false, input_weights: false, left: false, lead: 0 }
}

fn graph(t: &Case, rng: &mut impl Rng) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new("gemv");
    let mut xs = if t.left { vec![t.k, t.m] } else { vec![t.m, t.k] };
    if t.lead > 0 {
        xs.insert(0, t.lead);
    }
    let x = g.add_input("x", TensorType::fixed(DType::F32, &xs));
    let mut inputs = vec![random(&xs, rng)];
    let ws = if t.trans != t.left { [t.n, t.k] } else { [t.k, t.n] };
    let w = if t.input_weights {
        inputs.push(random(&ws, rng));
        g.add_input("w", TensorType::fixed(DType::F32, &ws))
    } else {
        g.add_const("w", random(&ws, rng))
    };
    let w = if t.trans { g.add(Op::Layout(LayoutOp::Transpose { perm: vec![1, 0] }), &[w]).unwrap() } else { w };
    let (a, b) = if t.left { (w, x) } else { (x, w) };
    let mut y = g.add(Op::Linalg(LinalgOp::MatMul), &[a, b]).unwrap();
    let mut os = if t.left { vec![t.n, t.m] } else { vec![t.m, t.n] };
    if t.lead > 0 {
        os.insert(0, t.lead);
    }
    if t.bias {
        let bs: &[usize] = if t.left { &[t.n, 1] } else { &[t.n] };
        let b = g.add_const("b", random(bs, rng));
        y = g.add(Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
    }
    y = match t.act {
        Act::None => y,
        Act::Relu => g.add(Op::Unary(UnaryOp::Relu), &[y]).unwrap(),
        Act::HardSwish => g.add(Op::Unary(UnaryOp::HardSwish), &[y]).unwrap(),
        Act::Silu => {
            let s = g.add(Op::Unary(UnaryOp::Sigmoid), &[y]).unwrap();
            g.add(Op::Binary(BinaryOp::Mul), &[y, s]).unwrap()
        }
    };
    if t.residual {
        let r = g.add_input("r", TensorType::fixed(DType::F32, &os));
        y = g.add(Op::Binary(BinaryOp::Add), &[y, r]).unwrap();
        inputs.push(random(&os, rng));
    }
    g.set_outputs(vec![y]);
    (g, inputs)
}

fn cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache")
}

/// Compiles `g` (with `families` forced), asserts that exactly one kernel is a matrix product
/// and that `family` builds it, and compares two poisoned runs with the reference.
fn check_graph(name: &str, g: &Graph, inputs: &[Tensor], families: &[(&str, &str)], family: &str) {
    let families = families.iter().map(|(o, f)| (o.to_string(), f.to_string())).collect();
    let opts = CompileOptions { cache_dir: Some(cache()), families, keep_ir: true, ..Default::default() };
    let mut c = compile(g, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(c.report.fallbacks.is_empty(), "{name}: fallbacks {:?}", c.report.fallbacks);
    // The scheduled kernel's product is marked for the matrix-vector template exactly when
    // the family is the one chosen.
    let marked = c.report.ir.iter().filter(|(_, _, scheduled)| scheduled.contains("(matrix-vector)")).count();
    assert_eq!(marked, usize::from(family == "cpu.gemv"), "{name}: {:?}", c.report.ir);
    let products: Vec<&str> = c
        .report
        .decisions
        .iter()
        .filter(|(_, d)| d.family == "cpu.gemv" || d.family == "cpu.blis_gemm")
        .map(|(_, d)| d.family)
        .collect();
    assert_eq!(products, [family], "{name}: {:?}", c.report.decisions);
    let want = poisoned::reference(g, inputs);
    poisoned::check_runs(name, &mut c, inputs, &want, 1e-4, 1e-4);
}

fn check_with(name: &str, t: Case, families: &[(&str, &str)], family: &str) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(name.bytes().map(u64::from).sum::<u64>() * 7919);
    let (g, inputs) = graph(&t, &mut rng);
    check_graph(name, &g, &inputs, families, family);
}

fn check(name: &str, t: Case) {
    check_with(name, t, &[], "cpu.gemv");
}

#[test]
fn rows_and_ragged_shapes() {
    check("m1", case(1, 960, 1280));
    check("m1odd", Case { bias: true, ..case(1, 37, 53) });
    check("m2", Case { bias: true, act: Act::Relu, ..case(2, 131, 77) });
    check("m3", Case { bias: true, act: Act::HardSwish, ..case(3, 250, 1000) });
    check("m4", Case { act: Act::Silu, residual: true, ..case(4, 64, 129) });
    // One vector, less than one, a single column, a reduction of one.
    check("n16", case(1, 17, 16));
    check("n5", Case { bias: true, ..case(2, 9, 5) });
    check("n1", case(3, 40, 1));
    check("k1", Case { bias: true, ..case(1, 1, 70) });
}

#[test]
fn transposed_weights() {
    // [N, K] weights as a Linear layer stores them.
    check("t1", Case { trans: true, bias: true, act: Act::HardSwish, ..case(1, 960, 1280) });
    check("t2", Case { trans: true, bias: true, ..case(2, 1280, 1000) });
    check("t3odd", Case { trans: true, act: Act::Relu, residual: true, ..case(3, 101, 203) });
}

#[test]
fn weights_on_the_left() {
    // W · x with x a column (or three): the product is transposed onto the template.
    check("left1", Case { left: true, bias: true, ..case(1, 300, 70) });
    check("left3", Case { left: true, trans: true, act: Act::Relu, ..case(3, 33, 45) });
}

#[test]
fn weights_as_inputs() {
    // Not chosen by default (they would be laid out on every call) ...
    check_with("in1", Case { input_weights: true, bias: true, ..case(1, 96, 130) }, &[], "cpu.blis_gemm");
    // ... but correct when forced: each panel laid out right before it is used.
    let forced = [("matmul", "cpu.gemv")];
    check_with("in1f", Case { input_weights: true, bias: true, ..case(1, 96, 130) }, &forced, "cpu.gemv");
    check_with("in3ft", Case { input_weights: true, trans: true, act: Act::Silu, ..case(3, 77, 49) }, &forced, "cpu.gemv");
}

#[test]
fn row_limits() {
    // Above the default row limit the blocked template runs; forced, up to 8 rows.
    check_with("m8", Case { bias: true, ..case(8, 200, 300) }, &[], "cpu.blis_gemm");
    check_with("m8f", Case { bias: true, act: Act::Relu, ..case(8, 200, 300) }, &[("matmul", "cpu.gemv")], "cpu.gemv");
    check_with("m6f", Case { trans: true, ..case(6, 99, 61) }, &[("matmul", "cpu.gemv")], "cpu.gemv");
}

#[test]
fn batches_sharing_the_weights() {
    // [B, M, K] · [K, N]: the batches' rows are rows of one product.
    check("b3m1", Case { lead: 3, bias: true, act: Act::Relu, ..case(1, 96, 130) });
    check("b2m2t", Case { lead: 2, trans: true, residual: true, ..case(2, 61, 45) });
    check_with("b3m2", Case { lead: 3, bias: true, ..case(2, 50, 70) }, &[], "cpu.blis_gemm");
    check_with("b3m2f", Case { lead: 3, bias: true, ..case(2, 50, 70) }, &[("matmul", "cpu.gemv")], "cpu.gemv");
}

/// Forced on a product of too many rows, the family says why and the blocked template runs.
#[test]
fn refusal_names_a_reason() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (g, inputs) = graph(&case(16, 40, 40), &mut rng);
    check_graph("m16", &g, &inputs, &[("matmul", "cpu.gemv")], "cpu.blis_gemm");
    let opts = CompileOptions {
        cache_dir: Some(cache()),
        families: vec![("matmul".into(), "cpu.gemv".into())],
        ..Default::default()
    };
    let c = compile(&g, &opts).unwrap();
    let reasons: Vec<&String> =
        c.report.decisions.iter().flat_map(|(_, d)| d.rejected.iter().filter(|(f, _)| *f == "cpu.gemv").map(|(_, r)| r)).collect();
    assert!(reasons.iter().any(|r| r.contains("more than 8 rows")), "{reasons:?}");
}

/// A batch of products (three images through one Linear layer each with its own weights) is
/// not a matrix-vector product; the family refuses it.
#[test]
fn batched_products_are_refused() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let mut g = Graph::new("batched");
    let x = g.add_input("x", TensorType::fixed(DType::F32, &[3, 1, 24]));
    let w = g.add_const("w", random(&[3, 24, 40], &mut rng));
    let y: ValueId = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
    g.set_outputs(vec![y]);
    let inputs = vec![random(&[3, 1, 24], &mut rng)];
    check_graph("batched", &g, &inputs, &[], "cpu.blis_gemm");
}
