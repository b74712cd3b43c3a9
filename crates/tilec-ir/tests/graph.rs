use tilec_ir::op::{BinaryOp, LayoutOp, LinalgOp, UnaryOp};
use tilec_ir::*;

fn mlp() -> (Graph, ValueId) {
    let mut g = Graph::new("mlp");
    let b = g.syms.free("batch");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Sym(b), Dim::Fixed(3)]));
    let w = g.add_const("w", Tensor::from_vec(vec![3, 4], vec![0.5f32; 12]).unwrap());
    let y = g.add(Op::Linalg(LinalgOp::MatMul), &[x, w]).unwrap();
    let r = g.add(Op::Unary(UnaryOp::Relu), &[y]).unwrap();
    g.set_outputs(vec![r]);
    (g, r)
}

#[test]
fn builds_verifies_and_prints_symbolic_graph() {
    let (g, r) = mlp();
    verify(&g).unwrap();
    assert_eq!(g.value(r).ty.shape[1], Dim::Fixed(4));
    let text = print_graph(&g);
    assert!(text.contains("matmul(%0, %1) : f32[batch, 4]"), "{text}");
    assert!(text.contains("relu(%2)"), "{text}");
}

#[test]
fn verifier_rejects_use_before_def_and_type_mismatch() {
    let (mut g, _) = mlp();
    // Swap the two nodes: relu now reads matmul's output before it is defined.
    g.nodes_mut_unchecked().swap(0, 1);
    let e = verify(&g).unwrap_err().to_string();
    assert!(e.contains("before it is defined"), "{e}");

    let (mut g, r) = mlp();
    g.value_mut(r).ty.dtype = DType::F16;
    let e = verify(&g).unwrap_err().to_string();
    assert!(e.contains("op infers"), "{e}");
}

#[test]
fn inference_errors_name_node_and_op() {
    let mut g = Graph::new("bad");
    let a = g.add_input("a", TensorType::fixed(DType::F32, &[2, 3]));
    let b = g.add_input("b", TensorType::fixed(DType::F32, &[4, 5]));
    let e = g.add_node("mm", Op::Linalg(LinalgOp::MatMul), &[a, b]).unwrap_err().to_string();
    assert!(e.contains("'mm'") && e.contains("matmul") && e.contains("inner dimensions"), "{e}");
    let e = g.add_node("add", Op::Binary(BinaryOp::Add), &[a, b]).unwrap_err().to_string();
    assert!(e.contains("do not broadcast"), "{e}");
    let e = g
        .add_node("r", Op::Layout(LayoutOp::Reshape { shape: vec![Dim::Fixed(5)] }), &[a])
        .unwrap_err()
        .to_string();
    assert!(e.contains("6 elements"), "{e}");
}

#[test]
fn symbolic_dims_evaluate() {
    let mut s = SymbolTable::default();
    let b = Dim::Sym(s.free("b"));
    let d = s.derive(SymExpr::Mul(b, Dim::Fixed(12)));
    assert_eq!(s.derive(SymExpr::Mul(b, Dim::Fixed(12))), d, "interned");
    let mut bound = std::collections::HashMap::new();
    bound.insert(SymbolId(0), 3usize);
    assert_eq!(s.eval(d, &bound), Some(36));
    assert_eq!(s.display(d), "(b*12)");
}
