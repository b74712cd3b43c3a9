//! Sizes from untrusted models and inputs: shapes whose element count overflows, ranges too
//! long to exist, and empty dimensions. Each case ends in a clear error naming the node, or in
//! the shape onnxruntime gives, on the reference interpreter and the compiled CPU path.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use tilec::onnx::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto};
use tilec::onnx::tensor::tensor_to_proto;
use tilec::{Backend, DType, ImportOptions, Tensor};

mod common;
use common::{vi, D};

const F32: i32 = 1;
const I64: i32 = 7;

/// The shapes whose products wrap in 64 bits (or come within 4 of it).
const HUGE: [[i64; 2]; 3] = [[1 << 31, 1 << 31], [(1 << 62) + 1, 4], [1 << 61, 8]];

fn node(op_type: &str, inputs: &[&str], attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        name: format!("the_{}", op_type.to_lowercase()),
        op_type: op_type.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec!["y".into()],
        attribute,
        ..Default::default()
    }
}

/// A one-node model whose output is `y`; `consts` become initializers.
fn model(n: NodeProto, inputs: Vec<ValueInfoProto>, consts: &[(&str, Tensor)]) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 18 }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![n],
            input: inputs,
            output: vec![ValueInfoProto { name: "y".into(), ..Default::default() }],
            initializer: consts.iter().map(|(name, t)| tensor_to_proto(name, t)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ints(v: &[i64]) -> Tensor {
    Tensor::from_vec(vec![v.len()], v.to_vec()).unwrap()
}

fn scalar(v: i64) -> Tensor {
    Tensor::scalar(v)
}

fn import_err(m: &ModelProto, bind: &[(&str, Tensor)]) -> String {
    let opts = ImportOptions {
        bind_inputs: bind.iter().map(|(n, t)| (n.to_string(), t.clone())).collect(),
        ..Default::default()
    };
    match tilec::import(m, &opts) {
        Ok(_) => panic!("the model imported"),
        Err(e) => e.to_string(),
    }
}

fn assert_names(msg: &str, needles: &[&str]) {
    for n in needles {
        assert!(msg.contains(n), "{msg:?} lacks {n:?}");
    }
}

#[test]
fn expand_tile_and_constant_of_shape_to_overflowing_shapes_are_refused() {
    let x = vi("x", F32, &[D::N(1), D::N(1)]);
    for s in HUGE {
        let shape = format!("[{}, {}]", s[0], s[1]);
        // The target shape as an initializer and as an input the caller binds (what `run`
        // does with a shape input given on the command line).
        let expand = model(node("Expand", &["x", "s"], vec![]), vec![x.clone()], &[("s", ints(&s))]);
        assert_names(&import_err(&expand, &[]), &["the_expand", "Expand", &shape, "too large"]);
        let expand_rt = model(node("Expand", &["x", "s"], vec![]), vec![x.clone(), vi("s", I64, &[D::N(2)])], &[]);
        assert_names(&import_err(&expand_rt, &[("s", ints(&s))]), &["the_expand", &shape, "too large"]);
        let tile = model(node("Tile", &["x", "r"], vec![]), vec![x.clone()], &[("r", ints(&s))]);
        assert_names(&import_err(&tile, &[]), &["the_tile", "Tile", &shape]);
        let cos = model(node("ConstantOfShape", &["s"], vec![]), vec![], &[("s", ints(&s))]);
        assert_names(&import_err(&cos, &[]), &["the_constantofshape", &shape]);
    }
}

/// A size bound only when the model runs: `fill` to `[n, n]` where `n` comes from an empty
/// input of shape `[n, 0]`. Both backends refuse it before allocating.
#[test]
fn sizes_bound_at_run_time_are_checked_before_allocating() {
    let mut g = tilec::Graph::new("g");
    let n = tilec::ir::Dim::Sym(g.syms.free("n"));
    let x = g.add_input("x", tilec::ir::TensorType::new(DType::F32, vec![n, tilec::ir::Dim::Fixed(0)]));
    let fill = tilec::ir::op::SourceOp::Fill { shape: vec![n, n], value: Tensor::scalar(1.0f32) };
    let y = g.add_node("big_fill", tilec::ir::Op::Source(fill), &[]).unwrap()[0];
    let _ = x;
    g.set_outputs(vec![y]);
    for backend in Backend::ALL {
        let input = Tensor::from_vec::<f32>(vec![1 << 31, 0], vec![]).unwrap();
        let e = tilec::run(&g, HashMap::from([("x".to_string(), input)]), backend).unwrap_err().to_string();
        assert_names(&e, &["big_fill", "[2147483648, 2147483648]", "too large"]);
        // A small n runs.
        let input = Tensor::from_vec::<f32>(vec![3, 0], vec![]).unwrap();
        let out = tilec::run(&g, HashMap::from([("x".to_string(), input)]), backend).unwrap();
        assert_eq!(out[0].shape(), &[3, 3], "{backend}");
    }
}

#[test]
fn integer_ranges_too_long_are_errors_not_aborts() {
    let range = |limit: i64| {
        model(
            node("Range", &["a", "b", "c"], vec![]),
            vec![],
            &[("a", scalar(0)), ("b", scalar(limit)), ("c", scalar(1))],
        )
    };
    // More elements than can be addressed: refused at import.
    assert_names(&import_err(&range(1 << 62), &[]), &["the_range", "range(0, 4611686018427387904, 1)", "too many"]);
    assert_names(&import_err(&range(i64::MAX), &[]), &["the_range", "too many"]);
    // Addressable but not allocatable: the model imports (a range op, not a folded
    // constant) and running it fails cleanly on both backends.
    let g = tilec::import(&range(1 << 59), &ImportOptions::default()).unwrap();
    for backend in Backend::ALL {
        let e = tilec::run(&g, HashMap::new(), backend).unwrap_err().to_string();
        assert!(e.contains("the_range") || e.contains("allocat"), "{backend}: {e}");
    }
    // The interpreter's own check, for a limit that is only known when the model runs.
    let rt = model(node("Range", &["a", "b", "c"], vec![]), vec![vi("b", I64, &[])], &[("a", scalar(0)), ("c", scalar(1))]);
    let g = tilec::import(&rt, &ImportOptions::default()).unwrap();
    for (limit, needle) in [(1i64 << 62, "too many"), (1 << 59, "out of memory")] {
        let e = tilec::run(&g, HashMap::from([("b".to_string(), scalar(limit))]), Backend::Ref).unwrap_err().to_string();
        assert_names(&e, &["the_range", needle]);
    }
    // Short ranges are still right.
    let out = tilec::run(&g, HashMap::from([("b".to_string(), scalar(4))]), Backend::Ref).unwrap();
    assert_eq!(out[0].to_i64_vec(), vec![0, 1, 2, 3]);
}

/// GPT-2's `input_ids.view(-1, seq)`, exported as Reshape(x, Concat([-1], Shape(x)[1:2]))
/// with allowzero: onnxruntime infers the -1 from the non-zero dims, so that an empty sequence
/// keeps its batch (and an empty batch of empty sequences becomes one).
#[test]
fn reshape_with_allowzero_keeps_the_batch_of_empty_sequences() {
    let x = vi("x", I64, &[D::P("batch"), D::P("seq")]);
    let nodes = vec![
        NodeProto { op_type: "Shape".into(), input: vec!["x".into()], output: vec!["shp".into()], ..Default::default() },
        NodeProto {
            op_type: "Slice".into(),
            input: vec!["shp".into(), "one".into(), "two".into()],
            output: vec!["seq".into()],
            ..Default::default()
        },
        NodeProto {
            op_type: "Concat".into(),
            input: vec!["minus_one".into(), "seq".into()],
            output: vec!["target".into()],
            attribute: vec![AttributeProto { name: "axis".into(), r#type: 2, i: 0, ..Default::default() }],
            ..Default::default()
        },
        NodeProto {
            name: "view".into(),
            op_type: "Reshape".into(),
            input: vec!["x".into(), "target".into()],
            output: vec!["y".into()],
            attribute: vec![AttributeProto { name: "allowzero".into(), r#type: 2, i: 1, ..Default::default() }],
            ..Default::default()
        },
    ];
    let mut m = model(nodes[3].clone(), vec![x], &[("one", ints(&[1])), ("two", ints(&[2])), ("minus_one", ints(&[-1]))]);
    m.graph.as_mut().unwrap().node = nodes;
    for (b, s, want) in [(1, 0, [1, 0]), (3, 0, [3, 0]), (0, 3, [0, 3]), (0, 0, [1, 0]), (2, 5, [2, 5])] {
        let dims = HashMap::from([("batch".to_string(), b), ("seq".to_string(), s)]);
        let g = tilec::import(&m, &ImportOptions { dim_values: dims, ..Default::default() }).unwrap();
        let input = Tensor::from_vec(vec![b, s], vec![7i64; b * s]).unwrap();
        for backend in Backend::ALL {
            let out = tilec::run(&g, HashMap::from([("x".to_string(), input.clone())]), backend).unwrap();
            assert_eq!(out[0].shape(), &want, "batch {b} seq {s} on {backend}");
        }
    }
    // A zero target dim with -1 needs an empty input, as onnxruntime requires.
    let bad = model(
        NodeProto { name: "view".into(), ..nodes_reshape_only() },
        vec![vi("x", I64, &[D::N(2), D::N(3)])],
        &[("target", ints(&[-1, 0]))],
    );
    assert_names(&import_err(&bad, &[]), &["view", "cannot infer -1", "[2, 3]"]);
}

fn nodes_reshape_only() -> NodeProto {
    NodeProto {
        op_type: "Reshape".into(),
        input: vec!["x".into(), "target".into()],
        output: vec!["y".into()],
        attribute: vec![AttributeProto { name: "allowzero".into(), r#type: 2, i: 1, ..Default::default() }],
        ..Default::default()
    }
}

// ---------------------------------------------------------------- the command line

fn scratch(test: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hardening-sizes").join(test);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the binary; asserts it was neither killed nor panicked. Returns (exit code, stdout,
/// stderr).
fn tilec(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tilec")).args(args).output().expect("the tilec binary runs");
    let (so, se) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(!se.contains("panicked"), "tilec panicked:\n{se}");
    let code = out.status.code().unwrap_or_else(|| panic!("tilec was killed by a signal:\n{se}"));
    (code, so, se)
}

fn gpt2() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/gpt2/model.onnx")
}

#[test]
fn gpt2_with_an_empty_sequence_keeps_its_batch() {
    let m = gpt2();
    let m = m.to_str().unwrap();
    for batch in ["1", "3"] {
        for backend in ["cpu", "ref"] {
            let b = format!("batch={batch}");
            let (code, out, err) =
                tilec(&["run", m, "--dim", &b, "--dim", "seq=0", "--backend", backend, "--compare-ref"]);
            assert_eq!(code, 0, "{out}\n{err}");
            assert!(out.contains(&format!("output 'logits': f32[{batch}, 0, 1024]")), "{out}");
            assert!(!out.contains("warning"), "{out}");
        }
    }
}

#[test]
fn run_checks_outputs_against_declared_shapes() {
    let dir = scratch("declared");
    // Declares y as [3, 2]; the identity makes it [2, 3].
    let mut m = model(
        NodeProto { op_type: "Identity".into(), input: vec!["x".into()], output: vec!["y".into()], ..Default::default() },
        vec![vi("x", F32, &[D::N(2), D::N(3)])],
        &[],
    );
    m.graph.as_mut().unwrap().output = vec![vi("y", F32, &[D::N(3), D::N(2)])];
    let p = dir.join("m.onnx");
    std::fs::write(&p, prost::Message::encode_to_vec(&m)).unwrap();
    let p = p.to_str().unwrap();
    let (code, out, _) = tilec(&["run", p, "--compare-ref"]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("check 'y': MISMATCH: the model declares shape [3, 2], got [2, 3]"), "{out}");
    // Without a check it is a warning.
    let (code, out, _) = tilec(&["run", p]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warning: output 'y': the model declares shape [3, 2], got [2, 3]"), "{out}");
}

#[test]
fn cli_refuses_overflowing_shapes_given_as_inputs() {
    let dir = scratch("expand-input");
    let m = model(node("Expand", &["x", "s"], vec![]), vec![vi("x", F32, &[D::N(1)]), vi("s", I64, &[D::N(2)])], &[]);
    let p = dir.join("m.onnx");
    std::fs::write(&p, prost::Message::encode_to_vec(&m)).unwrap();
    for (i, s) in HUGE.iter().enumerate() {
        let npy = dir.join(format!("s{i}.npy"));
        tilec::tensor_io::write_npy(&npy, &ints(s)).unwrap();
        let arg = format!("s={}", npy.display());
        for backend in ["cpu", "ref"] {
            let (code, out, err) = tilec(&["run", p.to_str().unwrap(), "--input", &arg, "--backend", backend]);
            assert_ne!(code, 0, "{out}");
            assert_names(&err, &["the_expand", &format!("[{}, {}]", s[0], s[1]), "too large"]);
        }
    }
}

#[test]
fn inspect_survives_a_huge_integer_range() {
    let dir = scratch("inspect-range");
    for limit in [1i64 << 59, 1 << 62] {
        let m = model(
            node("Range", &["a", "b", "c"], vec![]),
            vec![],
            &[("a", scalar(0)), ("b", scalar(limit)), ("c", scalar(1))],
        );
        let p = dir.join(format!("r{limit}.onnx"));
        std::fs::write(&p, prost::Message::encode_to_vec(&m)).unwrap();
        let (_, out, err) = tilec(&["inspect", p.to_str().unwrap()]);
        if limit == 1 << 62 {
            assert!(out.contains("FAILED: node 'the_range'") && out.contains("too many"), "{out}\n{err}");
        } else {
            assert!(!out.contains("FAILED") && out.contains("range"), "{out}\n{err}");
        }
    }
}
