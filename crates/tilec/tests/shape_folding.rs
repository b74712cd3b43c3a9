//! Import-time shape folding: a PyTorch-style `Shape → Gather → Unsqueeze → Concat →
//! Reshape` chain on an input with a symbolic batch dim imports as one Reshape whose
//! target shape holds the batch symbol, and runs for any batch size.

use tilec_ir::{Dim, Op, Tensor};
use tilec_onnx::proto::{
    tensor_proto::DataType, tensor_shape_proto::dimension::Value as DimV, tensor_shape_proto::Dimension, type_proto,
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use tilec_onnx::{import_model, ImportOptions};

fn value_info(name: &str, elem: DataType, dims: &[DimV]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem as i32,
                shape: Some(TensorShapeProto {
                    dim: dims.iter().map(|d| Dimension { value: Some(d.clone()), ..Default::default() }).collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn i64_tensor(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Int64 as i32,
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn node(op: &str, ins: &[&str], outs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: format!("{op}_{}", outs[0]),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto { name: name.into(), i: v, r#type: 2, ..Default::default() }
}

/// y = x.reshape(x.shape[0], -1); s = y.shape (as a graph output).
fn model() -> ModelProto {
    let graph = GraphProto {
        name: "fold".into(),
        node: vec![
            node("Shape", &["x"], &["shp"], vec![]),
            node("Gather", &["shp", "zero"], &["b"], vec![int_attr("axis", 0)]),
            node("Unsqueeze", &["b", "axes0"], &["b1"], vec![]),
            node("Concat", &["b1", "minus1"], &["spec"], vec![int_attr("axis", 0)]),
            node("Reshape", &["x", "spec"], &["y"], vec![]),
            node("Shape", &["y"], &["ys"], vec![]),
        ],
        initializer: vec![
            i64_tensor("zero", &[], &[0]),
            i64_tensor("axes0", &[1], &[0]),
            i64_tensor("minus1", &[1], &[-1]),
        ],
        input: vec![value_info(
            "x",
            DataType::Float,
            &[DimV::DimParam("batch".into()), DimV::DimValue(3), DimV::DimValue(4)],
        )],
        output: vec![value_info("y", DataType::Float, &[]), value_info("ys", DataType::Int64, &[])],
        ..Default::default()
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 13 }],
        graph: Some(graph),
        ..Default::default()
    }
}

#[test]
fn shape_chain_folds_to_a_symbolic_reshape() {
    let g = import_model(&model(), &ImportOptions::default()).expect("import");
    tilec_ir::verify(&g).expect("verify");
    let names: Vec<&str> = g.nodes().iter().map(|n| n.op.name()).collect();
    assert!(!names.iter().any(|n| *n == "gather" || *n == "shape" || *n == "concat"), "unfolded nodes: {names:?}");
    let reshapes: Vec<_> = g
        .nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Layout(tilec_ir::op::LayoutOp::Reshape { shape }) => Some(shape.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(reshapes.len(), 1, "nodes: {names:?}");
    let batch = g.syms.symbols.iter().position(|s| s.name == "batch").expect("batch symbol");
    assert_eq!(reshapes[0], vec![Dim::Sym(tilec_ir::SymbolId(batch as u32)), Dim::Fixed(12)]);

    for b in [1usize, 3] {
        let vals: Vec<f32> = (0..b * 12).map(|i| i as f32).collect();
        let x = Tensor::from_vec(vec![b, 3, 4], vals.clone()).unwrap();
        let outs = tilec_ref::run(&g, vec![x]).expect("run");
        assert_eq!(outs[0].shape(), &[b, 12]);
        assert_eq!(outs[0].as_slice::<f32>().unwrap(), &vals[..]);
        assert_eq!(outs[1].to_i64_vec(), vec![b as i64, 12]);
    }
}

/// ids = range(0, x.shape[0], 1); ones = ConstantOfShape(x.shape).
#[test]
fn range_and_constant_of_shape_over_a_symbolic_dim() {
    let one_f32 =
        TensorProto { dims: vec![1], data_type: DataType::Float as i32, float_data: vec![1.0], ..Default::default() };
    let value = AttributeProto { name: "value".into(), r#type: 4, t: Some(one_f32), ..Default::default() };
    let graph = GraphProto {
        name: "range".into(),
        node: vec![
            node("Shape", &["x"], &["shp"], vec![]),
            node("Gather", &["shp", "zero"], &["b"], vec![int_attr("axis", 0)]),
            node("Range", &["zero", "b", "one"], &["ids"], vec![]),
            node("ConstantOfShape", &["shp"], &["ones"], vec![value]),
        ],
        initializer: vec![i64_tensor("zero", &[], &[0]), i64_tensor("one", &[], &[1])],
        input: vec![value_info("x", DataType::Float, &[DimV::DimParam("batch".into()), DimV::DimValue(2)])],
        output: vec![value_info("ids", DataType::Int64, &[]), value_info("ones", DataType::Float, &[])],
        ..Default::default()
    };
    let m = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 13 }],
        graph: Some(graph),
        ..Default::default()
    };
    let g = import_model(&m, &ImportOptions::default()).expect("import");
    tilec_ir::verify(&g).expect("verify");
    let batch = Dim::Sym(tilec_ir::SymbolId(g.syms.symbols.iter().position(|s| s.name == "batch").unwrap() as u32));
    assert_eq!(g.value(g.outputs()[0]).ty.shape, vec![batch]);
    assert_eq!(g.value(g.outputs()[1]).ty.shape, vec![batch, Dim::Fixed(2)]);
    for b in [2usize, 5] {
        let x = Tensor::from_vec(vec![b, 2], vec![0.0f32; 2 * b]).unwrap();
        let outs = tilec_ref::run(&g, vec![x]).expect("run");
        assert_eq!(outs[0].to_i64_vec(), (0..b as i64).collect::<Vec<_>>());
        assert_eq!(outs[1].shape(), &[b, 2]);
        assert!(outs[1].to_f64_vec().iter().all(|&v| v == 1.0));
    }
}
