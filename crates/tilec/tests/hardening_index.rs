//! Index data as ONNX defines it, on the reference interpreter and the compiled CPU path:
//! negative indices count from the end once, anything still out of range is an error that names
//! the node (compiled kernels clamp the index, so memory stays in bounds, and record the
//! violation for the runtime to report). OneHot is the exception ONNX makes: an index out of
//! range gives a row of `off` values.
//!
//! The index tensors are graph inputs, so nothing is folded at compile time and the kernels
//! themselves see the bad values.

use std::path::Path;

use tilec::compiled::{compile, CompileOptions, Compiled};
use tilec::compiled_cuda::{prepare, CudaOptions};
use tilec::cuda::GpuTarget;
use tilec_ir::op::{IndexOp, LossReduction, NnOp, NormOp, ScatterReduction};
use tilec_ir::{DType, Graph, Op, Tensor, TensorType, ValueId};
use tilec_tile::interp::{self, InterpError};

fn compile_cpu(g: &Graph) -> Compiled {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tilec-cache");
    let opts = CompileOptions { cache_dir: Some(cache), ..Default::default() };
    compile(g, &opts).unwrap_or_else(|e| panic!("{}: {e}", g.name))
}

fn f32s(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(shape.to_vec(), (0..n).map(|i| i as f32 * 0.5 - 3.0).collect()).unwrap()
}

fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_vec(shape.to_vec(), v.to_vec()).unwrap()
}

fn input(g: &mut Graph, name: &str, d: DType, shape: &[usize]) -> ValueId {
    g.add_input(name, TensorType::fixed(d, shape))
}

/// The name of the op of node `node`, as errors spell it.
fn op_name(g: &Graph, node: &str) -> &'static str {
    let n = g.node_ids().find(|&n| g.node(n).name == node).expect("node exists");
    g.node(n).op.name()
}

/// Both back ends refuse `inputs`, naming the node and op and quoting the bad index; the
/// compiled path computes the node in a kernel (not on the interpreter) unless `fallback`.
fn both_refuse(g: &Graph, c: &mut Compiled, inputs: &[Tensor], node: &str, index: i64, fallback: bool) {
    let op = op_name(g, node);
    assert_eq!(c.fallback_ops().contains(&op.to_string()), fallback, "{}: fallbacks {:?}", g.name, c.fallback_ops());
    let r = tilec_ref::run(g, inputs.to_vec()).expect_err("the reference accepted a bad index").to_string();
    let k = c.run(inputs).expect_err("the compiled model accepted a bad index").to_string();
    for e in [&r, &k] {
        for want in [format!("node '{node}' ({op})"), index.to_string(), "out of range".to_string()] {
            assert!(e.contains(&want), "{}: error {e:?} does not mention {want:?}", g.name);
        }
    }
}

/// Both back ends compute the same result (index ops copy elements: exactly equal).
fn both_agree(g: &Graph, c: &mut Compiled, inputs: &[Tensor]) -> Vec<Tensor> {
    let want = tilec_ref::run(g, inputs.to_vec()).unwrap_or_else(|e| panic!("{}: reference: {e}", g.name));
    let got = c.run(inputs).unwrap_or_else(|e| panic!("{}: compiled: {e}", g.name));
    assert_eq!(want, got, "{}", g.name);
    got
}

#[test]
fn gather_wraps_negative_indices_once_and_refuses_the_rest() {
    let mut g = Graph::new("gather");
    let table = g.add_const("table", f32s(&[5, 3]));
    let ids = input(&mut g, "ids", DType::I64, &[2, 3]);
    let y = g.add_node("gather_rows", Op::Index(IndexOp::Gather { axis: 0 }), &[table, ids]).unwrap();
    let z = g.add_node("scale", Op::Unary(tilec_ir::op::UnaryOp::Relu), &[y[0]]).unwrap();
    g.set_outputs(vec![z[0]]);
    let mut c = compile_cpu(&g);
    let got = both_agree(&g, &mut c, &[i64s(&[2, 3], &[-1, 0, -5, 4, -2, 1])]);
    // Row -1 is row 4: relu(table[4]) = relu([3.0, 3.5, 4.0]).
    assert_eq!(&got[0].to_f64_vec()[..3], &[3.0, 3.5, 4.0]);
    for bad in [5, -6, 1_000_000_000, i64::MIN] {
        both_refuse(&g, &mut c, &[i64s(&[2, 3], &[0, 1, 2, 3, bad, 4])], "gather_rows", bad, false);
    }
    // The violation does not stick: the next run on good indices succeeds.
    both_agree(&g, &mut c, &[i64s(&[2, 3], &[0, 1, 2, 3, 4, -3])]);
}

/// Token and position embeddings added in one kernel, as in the transformer exports.
fn embeddings() -> Graph {
    let mut g = Graph::new("embeddings");
    let wte = g.add_const("wte", f32s(&[7, 4]));
    let wpe = g.add_const("wpe", f32s(&[3, 4]));
    let tok = input(&mut g, "tok", DType::I64, &[2, 3]);
    let pos = input(&mut g, "pos", DType::I32, &[2, 3]);
    let a = g.add_node("token_embedding", Op::Index(IndexOp::Gather { axis: 0 }), &[wte, tok]).unwrap();
    let b = g.add_node("position_embedding", Op::Index(IndexOp::Gather { axis: 0 }), &[wpe, pos]).unwrap();
    let s = g.add_node("sum", Op::Binary(tilec_ir::op::BinaryOp::Add), &[a[0], b[0]]).unwrap();
    g.set_outputs(vec![s[0]]);
    g
}

#[test]
fn the_error_names_the_gather_that_failed_among_fused_ones() {
    let g = embeddings();
    let mut c = compile_cpu(&g);
    let good_tok = i64s(&[2, 3], &[6, 0, 1, 2, -7, 5]);
    let pos_t = |v: &[i32]| Tensor::from_vec(vec![2, 3], v.to_vec()).unwrap();
    both_agree(&g, &mut c, &[good_tok.clone(), pos_t(&[0, 1, 2, 0, 1, -1])]);
    both_refuse(&g, &mut c, &[good_tok, pos_t(&[0, 1, 2, 0, 1, 3])], "position_embedding", 3, false);
    both_refuse(&g, &mut c, &[i64s(&[2, 3], &[0, 7, 0, 0, 0, 0]), pos_t(&[0; 6])], "token_embedding", 7, false);
}

#[test]
fn gather_elements_checks_every_index() {
    let mut g = Graph::new("gather_elements");
    let data = g.add_const("data", f32s(&[3, 4]));
    let ind = input(&mut g, "ind", DType::I64, &[3, 2]);
    let y = g.add_node("pick", Op::Index(IndexOp::GatherElements { axis: 1 }), &[data, ind]).unwrap();
    g.set_outputs(y);
    let mut c = compile_cpu(&g);
    both_agree(&g, &mut c, &[i64s(&[3, 2], &[-1, 0, 3, -4, 2, -2])]);
    both_refuse(&g, &mut c, &[i64s(&[3, 2], &[0, 0, 4, 0, 0, 0])], "pick", 4, false);
    both_refuse(&g, &mut c, &[i64s(&[3, 2], &[0, 0, 0, 0, 0, -5])], "pick", -5, false);
}

#[test]
fn gather_nd_checks_each_coordinate() {
    let mut g = Graph::new("gather_nd");
    let data = g.add_const("data", f32s(&[3, 4, 2]));
    let ind = input(&mut g, "ind", DType::I64, &[2, 2]);
    let y = g.add_node("pick_nd", Op::Index(IndexOp::GatherND { batch_dims: 0 }), &[data, ind]).unwrap();
    g.set_outputs(y);
    let mut c = compile_cpu(&g);
    both_agree(&g, &mut c, &[i64s(&[2, 2], &[-1, -4, 2, 3])]);
    // Row 1 of 3 is fine, column 4 of 4 is not (the flat offset would still be inside data).
    both_refuse(&g, &mut c, &[i64s(&[2, 2], &[1, 4, 0, 0])], "pick_nd", 4, false);
    both_refuse(&g, &mut c, &[i64s(&[2, 2], &[0, 0, -4, 0])], "pick_nd", -4, false);
}

#[test]
fn scatters_refuse_out_of_range_indices() {
    let mut g = Graph::new("scatters");
    let data = g.add_const("data", f32s(&[3, 4]));
    let ind = input(&mut g, "ind", DType::I64, &[1, 2]);
    let upd = g.add_const("upd", f32s(&[1, 2]));
    let red = ScatterReduction::None;
    let se = Op::Index(IndexOp::ScatterElements { axis: 1, reduction: red });
    let a = g.add_node("scatter_el", se, &[data, ind, upd]).unwrap();
    let ind_nd = input(&mut g, "ind_nd", DType::I64, &[1, 2]);
    let upd_nd = g.add_const("upd_nd", f32s(&[1]));
    let b = g
        .add_node("scatter_nd", Op::Index(IndexOp::ScatterND { reduction: red }), &[data, ind_nd, upd_nd])
        .unwrap();
    g.set_outputs(vec![a[0], b[0]]);
    let mut c = compile_cpu(&g);
    let fallback = c.fallback_ops().contains(&"scatter_elements".to_string());
    both_agree(&g, &mut c, &[i64s(&[1, 2], &[-1, 2]), i64s(&[1, 2], &[-3, -1])]);
    both_refuse(&g, &mut c, &[i64s(&[1, 2], &[0, 4]), i64s(&[1, 2], &[0, 0])], "scatter_el", 4, fallback);
    both_refuse(&g, &mut c, &[i64s(&[1, 2], &[0, 0]), i64s(&[1, 2], &[0, -5])], "scatter_nd", -5, fallback);
}

#[test]
fn one_hot_gives_off_values_out_of_range() {
    let mut g = Graph::new("one_hot");
    let ind = input(&mut g, "ind", DType::I64, &[5]);
    let vals = g.add_const("vals", Tensor::from_vec(vec![2], vec![-1.0f32, 2.0]).unwrap());
    let y = g.add_node("hot", Op::Index(IndexOp::OneHot { axis: 1, depth: 3 }), &[ind, vals]).unwrap();
    g.set_outputs(y);
    let mut c = compile_cpu(&g);
    let got = both_agree(&g, &mut c, &[i64s(&[5], &[0, -1, 3, -4, 1_000_000])]);
    let rows: Vec<Vec<f64>> = got[0].to_f64_vec().chunks(3).map(|r| r.to_vec()).collect();
    assert_eq!(rows[1], [-1.0, -1.0, 2.0], "-1 is the last class");
    for r in &rows[2..] {
        assert_eq!(r, &[-1.0; 3], "out of range: all off");
    }
}

#[test]
fn nll_loss_refuses_targets_outside_the_classes_unless_ignored() {
    let mut g = Graph::new("nll");
    let x = g.add_const("x", f32s(&[2, 3, 2]));
    let t = input(&mut g, "t", DType::I64, &[2, 2]);
    let op = NormOp::NllLoss { reduction: LossReduction::None, ignore_index: Some(-100), has_weight: false };
    let y = g.add_node("loss", Op::Norm(op), &[x, t]).unwrap();
    g.set_outputs(y);
    let mut c = compile_cpu(&g);
    both_agree(&g, &mut c, &[i64s(&[2, 2], &[0, 2, -100, 1])]);
    both_refuse(&g, &mut c, &[i64s(&[2, 2], &[0, 3, 1, 1])], "loss", 3, false);
    // No wrapping for targets: -1 is not the last class.
    both_refuse(&g, &mut c, &[i64s(&[2, 2], &[0, 1, -1, 1])], "loss", -1, false);
}

#[test]
fn rotary_embedding_refuses_positions_beyond_the_cache() {
    let mut g = Graph::new("rotary");
    let x = g.add_const("x", f32s(&[1, 2, 8]));
    let cos = g.add_const("cos", f32s(&[3, 2]));
    let sin = g.add_const("sin", f32s(&[3, 2]));
    let pos = input(&mut g, "pos", DType::I64, &[1, 2]);
    let op = NnOp::RotaryEmbedding { interleaved: false, rotary_dim: 0, num_heads: 2, has_position_ids: true };
    let y = g.add_node("rope", Op::Nn(op), &[x, cos, sin, pos]).unwrap();
    g.set_outputs(y);
    let mut c = compile_cpu(&g);
    both_agree(&g, &mut c, &[i64s(&[1, 2], &[2, 0])]);
    both_refuse(&g, &mut c, &[i64s(&[1, 2], &[0, 3])], "rope", 3, false);
    both_refuse(&g, &mut c, &[i64s(&[1, 2], &[-1, 0])], "rope", -1, false);
}

/// The CUDA path (no GPU needed): its kernels take the status, call the check, and keep its
/// semantics through the GPU schedule, on the tile interpreter.
#[test]
fn gpu_kernels_check_indices_after_scheduling() {
    let g = embeddings();
    let p = prepare(&g, &CudaOptions::default(), &GpuTarget::hopper()).unwrap();
    let mut checked = 0;
    for k in p.kernels().iter().filter(|k| !k.lowered.checks.is_empty()) {
        checked += 1;
        assert_eq!(k.lowered.checks, k.scheduled.checks);
        let src = &k.source.source;
        assert!(src.contains("long long* __restrict__ tl_st") && src.contains("tl_index(tl_st, "), "{src}");
        for fill in [0.0, 1000.0] {
            let args: Vec<Tensor> = k
                .lowered
                .params
                .iter()
                .map(|&b| {
                    let buf = k.lowered.buf(b);
                    let shape: Vec<usize> = buf.shape.iter().map(|&d| d as usize).collect();
                    let n = shape.iter().product();
                    let v = if buf.dtype.is_float() { (0..n).map(|i| i as f64).collect() } else { vec![fill; n] };
                    Tensor::from_f64s(buf.dtype, shape, &v).unwrap()
                })
                .collect();
            let (mut a, mut b) = (args.clone(), args);
            let ra = interp::run(&k.lowered, &mut a);
            let rb = interp::run(&k.scheduled, &mut b);
            assert_eq!(a, b, "{}: the schedule changed the clamped results", k.name);
            for r in [ra, rb] {
                match r {
                    Ok(()) => assert_eq!(fill, 0.0, "{}: index {fill} accepted", k.name),
                    Err(InterpError::Index { violation, message }) => {
                        assert_eq!(violation.index, 1000, "{}", k.name);
                        assert!(message.contains("_embedding' (gather)") && message.contains("1000"), "{message}");
                    }
                    Err(e) => panic!("{}: {e}", k.name),
                }
            }
        }
    }
    assert!(checked > 0, "no kernel checks an index");
}

/// Index checks that the consumer of a gather could drop with the index itself: an index
/// into a dimension of length 1 (broadcasting reads it as 0), a gather in the branch of a
/// `where` that is not taken, and a gather whose output is empty (the kernel computes no
/// element, so the interpreter checks the indices). Every index is checked, whatever reads
/// the result; on the GPU schedule too.
#[test]
fn checks_survive_what_reads_the_gathered_value() {
    let mut g = Graph::new("unit_and_branch");
    let s = input(&mut g, "s", DType::F32, &[]);
    let x = input(&mut g, "x", DType::F32, &[6, 1]);
    let ind = input(&mut g, "ind", DType::I32, &[6, 2, 1]);
    let cond = input(&mut g, "cond", DType::Bool, &[6, 2]);
    let y = g.add_node("scale", Op::Binary(tilec_ir::op::BinaryOp::Mul), &[s, x]).unwrap();
    let z = g.add_node("pick_nd", Op::Index(IndexOp::GatherND { batch_dims: 1 }), &[y[0], ind]).unwrap();
    let w = g.add_node("choose", Op::Where, &[cond, s, z[0]]).unwrap();
    g.set_outputs(w);
    let mut c = compile_cpu(&g);
    let inputs = |bad: i32, take: bool| {
        let mut v = vec![0i32, -1, 0, 0, -1, -1, 0, 0, 0, -1, 0, 0];
        v[7] = bad;
        [Tensor::scalar(2.0f32), f32s(&[6, 1]), Tensor::from_vec(vec![6, 2, 1], v).unwrap(), Tensor::from_vec(vec![6, 2], vec![take; 12]).unwrap()]
    };
    both_agree(&g, &mut c, &inputs(-1, false));
    for take in [false, true] {
        both_refuse(&g, &mut c, &inputs(-2, take), "pick_nd", -2, false);
        both_refuse(&g, &mut c, &inputs(1, take), "pick_nd", 1, false);
    }

    let p = prepare(&g, &CudaOptions::default(), &GpuTarget::hopper()).unwrap();
    let k = p.kernels().iter().find(|k| !k.lowered.checks.is_empty()).expect("a kernel checks the indices");
    let args = |bad: i32| -> Vec<Tensor> {
        k.lowered
            .params
            .iter()
            .map(|&b| {
                let buf = k.lowered.buf(b);
                let shape: Vec<usize> = buf.shape.iter().map(|&d| d as usize).collect();
                let n: usize = shape.iter().product();
                let v: Vec<f64> = match buf.dtype {
                    DType::I32 => (0..n).map(|j| if j == 7 { bad as f64 } else { 0.0 }).collect(),
                    _ => vec![1.0; n],
                };
                Tensor::from_f64s(buf.dtype, shape, &v).unwrap()
            })
            .collect()
    };
    for kernel in [&k.lowered, &k.scheduled] {
        interp::run(kernel, &mut args(-1)).unwrap_or_else(|e| panic!("{}: {e}", k.name));
        match interp::run(kernel, &mut args(-2)) {
            Err(InterpError::Index { violation, message }) => {
                assert_eq!(violation.index, -2, "{}", k.name);
                assert!(message.contains("pick_nd") && message.contains("-2"), "{message}");
            }
            r => panic!("{}: index -2 into a dimension of 1 gave {r:?}", k.name),
        }
    }

    // Gather and GatherND with an empty output and a bad index: an error on both sides.
    let mut g = Graph::new("empty_output");
    let x = input(&mut g, "x", DType::F32, &[3, 0]);
    let ind = input(&mut g, "ind", DType::I64, &[2]);
    let y = g.add_node("pick_rows", Op::Index(IndexOp::Gather { axis: 0 }), &[x, ind]).unwrap();
    let nd = input(&mut g, "nd", DType::I64, &[2, 1]);
    let z = g.add_node("pick_nd", Op::Index(IndexOp::GatherND { batch_dims: 0 }), &[x, nd]).unwrap();
    g.set_outputs(vec![y[0], z[0]]);
    let mut c = compile_cpu(&g);
    let x = Tensor::zeros(DType::F32, vec![3, 0]);
    both_agree(&g, &mut c, &[x.clone(), i64s(&[2], &[2, -3]), i64s(&[2, 1], &[0, -1])]);
    both_refuse(&g, &mut c, &[x.clone(), i64s(&[2], &[3, 0]), i64s(&[2, 1], &[0, 0])], "pick_rows", 3, true);
    both_refuse(&g, &mut c, &[x, i64s(&[2], &[0, 0]), i64s(&[2, 1], &[0, -4])], "pick_nd", -4, true);
}
