//! `tilec inspect MODEL`: what a model is made of and whether it imports.

use super::{graph_of, human_bytes, input_names, load_model, thousands};
use anyhow::Result;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use tilec::onnx::proto::{self, GraphProto, NodeProto, ValueInfoProto};
use tilec::onnx::tensor::{dtype_from_onnx, onnx_type_name};
use tilec::ImportOptions;

/// `f32[batch, 3, 224, 224]` for a value info, symbolic dims by name.
pub fn value_info_type(vi: &ValueInfoProto) -> String {
    use proto::tensor_shape_proto::dimension::Value as D;
    use proto::type_proto::Value;
    match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(Value::TensorType(t)) => {
            let dt = match dtype_from_onnx(t.elem_type) {
                Some(d) => d.name().to_string(),
                None => format!("{} (unsupported)", onnx_type_name(t.elem_type)),
            };
            match &t.shape {
                None => format!("{dt}[unknown rank]"),
                Some(s) => {
                    let dims: Vec<String> = s
                        .dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(D::DimValue(n)) => n.to_string(),
                            Some(D::DimParam(p)) if !p.is_empty() => p.clone(),
                            _ => "?".to_string(),
                        })
                        .collect();
                    format!("{dt}[{}]", dims.join(", "))
                }
            }
        }
        Some(Value::SequenceType(_)) => "sequence".into(),
        Some(Value::MapType(_)) => "map".into(),
        Some(Value::OptionalType(_)) => "optional".into(),
        Some(_) => "non-tensor".into(),
        None => "untyped".into(),
    }
}

/// Calls `f` on every node of `g`, including nodes of subgraphs (If/Loop/Scan bodies).
fn walk_nodes<'a>(g: &'a GraphProto, f: &mut dyn FnMut(&'a NodeProto)) {
    for n in &g.node {
        f(n);
        for a in &n.attribute {
            if let Some(sg) = &a.g {
                walk_nodes(sg, f);
            }
            for sg in &a.graphs {
                walk_nodes(sg, f);
            }
        }
    }
}

/// `Conv` for the default domain, `com.example::Foo` otherwise.
fn qualified_op(n: &NodeProto) -> String {
    if n.domain.is_empty() || n.domain == "ai.onnx" {
        n.op_type.clone()
    } else {
        format!("{}::{}", n.domain, n.op_type)
    }
}

/// Every op type (qualified) in the model that the importer does not map, with counts.
pub fn unsupported_ops(g: &GraphProto) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    walk_nodes(g, &mut |n| {
        let default_domain = n.domain.is_empty() || n.domain == "ai.onnx";
        if !default_domain || !tilec::onnx::import::is_supported(&n.op_type) {
            *out.entry(qualified_op(n)).or_insert(0) += 1;
        }
    });
    out
}

fn sorted_by_count(h: HashMap<String, usize>) -> Vec<(String, usize)> {
    let mut v: Vec<(String, usize)> = h.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

fn print_histogram(title: &str, h: HashMap<String, usize>) {
    let total: usize = h.values().sum();
    let v = sorted_by_count(h);
    println!("{title} ({total} nodes, {} types):", v.len());
    let w = v.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, c) in v {
        println!("  {k:<w$}  {c}");
    }
}

/// Element count and bytes of an ONNX tensor, from its dims and element type.
fn proto_tensor_size(t: &proto::TensorProto) -> (u128, u128) {
    let n = t.dims.iter().fold(1u128, |a, &d| a.saturating_mul(d.max(0) as u128));
    let sz = dtype_from_onnx(t.data_type).map(|d| d.size_bytes() as u128).unwrap_or(0);
    let bytes = if sz > 0 { n.saturating_mul(sz) } else { t.raw_data.len() as u128 };
    (n, bytes)
}

/// The model's parameters after import: the constants, and the values computed only from
/// constants (e.g. weights an exported model fills with ConstantOfShape: `fill` ops), as the rest of the
/// graph reads them — so shape vectors consumed only by such computations are not counted.
/// Returns (elements, bytes, tensors).
fn parameters(g: &tilec::Graph) -> (u128, u128, usize) {
    let mut constant = vec![false; g.values().len()];
    for v in g.value_ids() {
        constant[v.index()] = g.const_value(v).is_some();
    }
    let mut param = vec![false; g.values().len()];
    for node in g.nodes() {
        use tilec::ir::op::{Op, SourceOp};
        let source = matches!(node.op, Op::Source(SourceOp::Fill { .. } | SourceOp::Eye { .. }));
        let all_const = source || !node.inputs.is_empty() && node.inputs.iter().all(|x| constant[x.index()]);
        if all_const {
            node.outputs.iter().for_each(|o| constant[o.index()] = true);
        } else {
            node.inputs.iter().filter(|x| constant[x.index()]).for_each(|x| param[x.index()] = true);
        }
    }
    g.outputs().iter().filter(|o| constant[o.index()]).for_each(|o| param[o.index()] = true);
    let (mut n, mut bytes, mut count) = (0u128, 0u128, 0usize);
    for v in g.value_ids().filter(|v| param[v.index()]) {
        let ty = &g.value(v).ty;
        if let Some(shape) = ty.fixed_shape() {
            let e = shape.iter().fold(1u128, |a, &d| a.saturating_mul(d as u128));
            count += 1;
            n = n.saturating_add(e);
            bytes = bytes.saturating_add(e.saturating_mul(ty.dtype.size_bytes() as u128));
        }
    }
    (n, bytes, count)
}

pub fn inspect(path: &Path) -> Result<()> {
    let model = load_model(path)?;
    let g = graph_of(&model)?;
    println!("model:      {}", path.display());
    let producer = match (model.producer_name.as_str(), model.producer_version.as_str()) {
        ("", _) => "(unknown)".to_string(),
        (p, "") => p.to_string(),
        (p, v) => format!("{p} {v}"),
    };
    println!("producer:   {producer}");
    println!("ir version: {}", model.ir_version);
    let mut opsets: Vec<String> = model
        .opset_import
        .iter()
        .map(|o| format!("{} {}", if o.domain.is_empty() { "ai.onnx" } else { &o.domain }, o.version))
        .collect();
    opsets.sort();
    println!("opsets:     {}", if opsets.is_empty() { "(none)".to_string() } else { opsets.join(", ") });
    if !g.name.is_empty() {
        println!("graph:      {}", g.name);
    }

    let real_inputs = input_names(g);
    println!("inputs ({}):", real_inputs.len());
    for vi in g.input.iter().filter(|vi| real_inputs.contains(&vi.name)) {
        println!("  {}: {}", vi.name, value_info_type(vi));
    }
    println!("outputs ({}):", g.output.len());
    for vi in &g.output {
        println!("  {}: {}", vi.name, value_info_type(vi));
    }

    let mut onnx_hist: HashMap<String, usize> = HashMap::new();
    walk_nodes(g, &mut |n| *onnx_hist.entry(qualified_op(n)).or_insert(0) += 1);
    print_histogram("ONNX ops", onnx_hist);

    let imported = tilec::import(&model, &ImportOptions::default());
    match &imported {
        Ok(graph) => {
            let (n, bytes, count) = parameters(graph);
            println!(
                "parameters: {} in {count} tensors ({}) after import: constants and values computed only from constants",
                thousands(n),
                human_bytes(bytes)
            );
        }
        Err(_) => {
            let (mut n, mut bytes, mut count) = (0u128, 0u128, 0usize);
            let mut add = |t: &proto::TensorProto| {
                let (tn, tb) = proto_tensor_size(t);
                n += tn;
                bytes += tb;
                count += 1;
            };
            g.initializer.iter().for_each(&mut add);
            walk_nodes(g, &mut |node| {
                if node.op_type == "Constant" {
                    node.attribute.iter().filter_map(|a| a.t.as_ref()).for_each(&mut add);
                }
            });
            println!(
                "parameters: {} in {count} initializers and Constant tensors ({})",
                thousands(n),
                human_bytes(bytes)
            );
        }
    }

    let unsupported = unsupported_ops(g);
    match imported {
        Ok(graph) => {
            println!("import:     ok");
            let mut h: HashMap<String, usize> = HashMap::new();
            for node in graph.nodes() {
                *h.entry(node.op.name().to_string()).or_insert(0) += 1;
            }
            print_histogram("canonical ops", h);
        }
        Err(e) => {
            println!("import:     FAILED: {e}");
            if !unsupported.is_empty() {
                let parts: Vec<String> = unsupported.iter().map(|(k, c)| format!("{k} (x{c})")).collect();
                println!("unsupported op types ({}): {}", unsupported.len(), parts.join(", "));
            }
        }
    }
    Ok(())
}
