//! Deep graphs: long chains of elementwise ops, and chains in which every value is read
//! twice, go through import, optimization at -O0 and -O3, partitioning, lowering, C
//! compilation, `explain` and a run without overflowing a stack, and compute what the
//! reference interpreter computes.
//!
//! The depths are past where each stage used to recurse off the end of its stack: a
//! 4000-op chain overflowed the 8 MB main thread of the `tilec` binary (and 800 ops the
//! 2 MB thread a test runs on); the two-use chain overflowed the main thread from 1500
//! levels. The library calls below run on the test's own thread, the command-line ones on
//! the binary's main thread.

use prost::Message;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use tilec::compiled::{compile, CompileOptions};
use tilec::{Backend, DType, Graph, ImportOptions, Tensor};
use tilec_onnx::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto};

mod common;
use common::{vi, D};

const CHAIN: usize = 4000;
const TWO_USE_LEVELS: usize = 1500;
const SHAPE: [i64; 2] = [4, 16];

fn scratch(test: &str) -> PathBuf {
    common::scratch(&format!("depth-{test}"))
}

fn f32_info(name: &str) -> ValueInfoProto {
    vi(name, 1, &[D::N(SHAPE[0]), D::N(SHAPE[1])])
}



fn node(name: String, op: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        name,
        op_type: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.to_string()],
        ..Default::default()
    }
}

fn save(dir: &Path, nodes: Vec<NodeProto>, output: &str) -> PathBuf {
    let m = ModelProto {
        ir_version: 8,
        producer_name: "tilec-tests".into(),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
        graph: Some(GraphProto {
            name: "deep".into(),
            node: nodes,
            input: vec![f32_info("x")],
            output: vec![f32_info(output)],
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = dir.join("model.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p
}

/// `n` unary ops in a row; values stay in [-1, 1].
fn chain(dir: &Path, n: usize) -> PathBuf {
    let mut nodes = Vec::with_capacity(n);
    let mut prev = "x".to_string();
    for i in 0..n {
        let out = format!("v{i}");
        let op = ["Neg", "Tanh", "Sin"][i % 3];
        nodes.push(node(format!("op{i}"), op, &[&prev], &out));
        prev = out;
    }
    save(dir, nodes, &prev)
}

/// `x[i+1] = tanh(x[i] * x[i] + x[i])`: every value is read by two nodes (three times), so
/// an expression that expands each read doubles per level.
fn two_use_chain(dir: &Path, levels: usize) -> PathBuf {
    let mut nodes = Vec::with_capacity(3 * levels);
    let mut prev = "x".to_string();
    for i in 0..levels {
        let (m, a, out) = (format!("m{i}"), format!("a{i}"), format!("v{i}"));
        nodes.push(node(format!("mul{i}"), "Mul", &[&prev, &prev], &m));
        nodes.push(node(format!("add{i}"), "Add", &[&m, &prev], &a));
        nodes.push(node(format!("tanh{i}"), "Tanh", &[&a], &out));
        prev = out;
    }
    save(dir, nodes, &prev)
}

fn input() -> Tensor {
    let n = (SHAPE[0] * SHAPE[1]) as usize;
    let v: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
    Tensor::from_vec(SHAPE.iter().map(|&d| d as usize).collect(), v).unwrap()
}

/// Compiles `g` at `-O level` on this thread, runs it and compares with the interpreter.
fn compiled_matches_reference(g: &Graph, level: u8, cache: &Path, min_kernels: usize) {
    let x = input();
    let want = tilec::run(g, HashMap::from([("x".to_string(), x.clone())]), Backend::Ref).expect("reference run");
    let opts = CompileOptions { opt_level: level, cache_dir: Some(cache.to_path_buf()), threads: 1, ..Default::default() };
    let mut c = compile(g, &opts).unwrap_or_else(|e| panic!("-O{level}: {e}"));
    assert!(c.fallback_ops().is_empty(), "-O{level}: fallbacks {:?}", c.fallback_ops());
    assert!(
        c.report.kernels >= min_kernels,
        "-O{level}: {} kernels; a chain this deep must be cut into at least {min_kernels}",
        c.report.kernels
    );
    let got = c.run(&[x]).unwrap_or_else(|e| panic!("-O{level}: {e}"));
    let cmp = tilec::compare::compare(&want[0], &got[0], 1e-4, 1e-5).unwrap();
    assert!(cmp.ok(), "-O{level}: compiled differs from the reference: {cmp:?}");
    assert_eq!(want[0].dtype(), DType::F32);
}

/// Runs the binary; asserts a clean exit.
fn tilec_ok(args: &[&dyn AsRef<std::ffi::OsStr>], cache: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tilec"))
        .args(args.iter().map(|a| a.as_ref()))
        .env("TILEC_CACHE_DIR", cache)
        .output()
        .expect("the tilec binary runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let line: Vec<String> = args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect();
    assert!(out.status.success(), "tilec {} failed ({}):\n{stderr}", line.join(" "), out.status);
    stdout.into_owned()
}

fn check_deep_model(test: &str, build: impl Fn(&Path) -> PathBuf, min_kernels: usize) {
    let dir = scratch(test);
    let cache = dir.join("cache");
    let model = build(&dir);
    let g = tilec::load(&model, &ImportOptions::default()).expect("import");
    compiled_matches_reference(&g, 0, &cache, min_kernels);
    compiled_matches_reference(&g, 3, &cache, min_kernels);
    drop(g);

    // The binary, on its main thread: explain shows the chain cut for the expression
    // budget; a run at -O0 agrees with the interpreter (kernels come from the cache).
    let ex = tilec_ok(&[&"explain", &model], &cache);
    assert!(ex.contains("fused expressions would nest"), "explain does not report the cut:\n{}", &ex[..ex.len().min(4000)]);
    let out = tilec_ok(&[&"run", &"-O", &"0", &"--compare-ref", &model], &cache);
    assert!(out.contains("against the reference interpreter: ok"), "{out}");
    tilec_ok(&[&"print-ir", &model], &cache);
}

#[test]
fn long_elementwise_chain() {
    check_deep_model("chain", |d| chain(d, CHAIN), CHAIN / 64);
}

#[test]
fn long_chain_reading_every_value_twice() {
    check_deep_model("two-use", |d| two_use_chain(d, TWO_USE_LEVELS), TWO_USE_LEVELS * 3 / 64);
}

/// `If` nested `levels` deep (each then-branch holds the next `If`): the protobuf decoder's
/// nesting limit refuses it with an error before anything recurses over it.
#[test]
fn deeply_nested_control_flow_is_refused() {
    use tilec_onnx::proto::AttributeProto;
    let graph_attr = |name: &str, g: GraphProto| AttributeProto { name: name.into(), r#type: 5, g: Some(g), ..Default::default() };
    let branch = |nodes: Vec<NodeProto>, out: &str| GraphProto {
        name: format!("b_{out}"),
        node: nodes,
        output: vec![f32_info(out)],
        ..Default::default()
    };
    let mut body = branch(vec![node("neg".into(), "Neg", &["x"], "y0")], "y0");
    let mut top = Vec::new();
    for d in 1..200 {
        let other = branch(vec![node(format!("id{d}"), "Identity", &["x"], &format!("e{d}"))], &format!("e{d}"));
        let mut n = node(format!("if{d}"), "If", &["c"], &format!("y{d}"));
        n.attribute = vec![graph_attr("then_branch", body), graph_attr("else_branch", other)];
        top = vec![n.clone()];
        body = branch(vec![n], &format!("y{d}"));
    }
    let dir = scratch("nested-if");
    let model = save(&dir, top, "y199");
    let err = tilec::load(&model, &ImportOptions::default()).expect_err("a 200-level nesting must be refused");
    assert!(err.to_string().contains("decode"), "{err}");
}
