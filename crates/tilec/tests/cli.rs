//! End-to-end tests of the `tilec` binary on small models built here with the ONNX
//! protobuf structs: what `inspect` reports, what `run` computes and writes, and that
//! bad models, files and arguments give clear errors with a non-zero exit, never a panic.

use prost::Message;
use tilec::tensor_io::read_npy;
use tilec::{DType, Tensor};
use tilec_onnx::proto::{type_proto, NodeProto, OperatorSetIdProto, TypeProto};

mod common;
use common::*;

// ---------------------------------------------------------------- inspect / print-ir

#[test]
fn inspect_reports_model_structure() {
    let dir = scratch("inspect");
    let p = save(&dir, "m.onnx", &identity_model());
    let o = tilec(&[&"inspect", &p]);
    o.ok();
    for needle in [
        "producer:   tilec-tests 1.0",
        "ir version: 8",
        "ai.onnx 17",
        "x: f32[batch, 3]",
        "y: f32[batch, 3]",
        "c: f32[2]",
        "Identity",
        "Constant",
        "import:     ok",
        "parameters: 2 in 1 tensors (8 B)",
    ] {
        assert!(o.stdout.contains(needle), "inspect output lacks {needle:?}:\n{}", o.stdout);
    }
}

#[test]
fn inspect_lists_every_unsupported_op_type() {
    let dir = scratch("inspect_unsupported");
    let mut m = model(
        vec![
            node("a", "FrobnicateXyz", &["x"], &["t"]),
            node("b", "Identity", &["t"], &["u"]),
            NodeProto { domain: "com.example".into(), ..node("c", "Custom", &["u"], &["v"]) },
            node("d", "WibbleQux", &["v"], &["y"]),
        ],
        vec![vi("x", F32, &[D::N(2)])],
        vec![vi("y", F32, &[D::N(2)])],
    );
    m.opset_import.push(OperatorSetIdProto { domain: "com.example".into(), version: 1 });
    let p = save(&dir, "m.onnx", &m);
    let o = tilec(&[&"inspect", &p]);
    o.ok();
    assert!(o.stdout.contains("import:     FAILED"), "{}", o.stdout);
    let line = o.stdout.lines().find(|l| l.starts_with("unsupported op types")).expect("an unsupported line");
    for op in ["FrobnicateXyz", "com.example::Custom", "WibbleQux"] {
        assert!(line.contains(op), "{line}");
    }
    assert!(!line.contains("Identity"), "{line}");
    // `run` fails on the first one and lists them all.
    tilec(&[&"run", &p]).fails_with(&["'a'", "FrobnicateXyz", "unsupported", "com.example::Custom", "WibbleQux"]);
}

#[test]
fn print_ir_prints_the_graph() {
    let dir = scratch("print_ir");
    let p = save(&dir, "m.onnx", &identity_model());
    let o = tilec(&[&"print-ir", &p]);
    o.ok();
    assert!(o.stdout.starts_with("graph g("), "{}", o.stdout);
    assert!(o.stdout.contains("f32[batch, 3]") && o.stdout.contains("const f32[2]"), "{}", o.stdout);
    let o = tilec(&[&"print-ir", &p, &"--dim", &"batch=5"]);
    o.ok();
    assert!(o.stdout.contains("f32[5, 3]"), "{}", o.stdout);
}

// ---------------------------------------------------------------- run

#[test]
fn run_with_given_input_computes_and_writes_outputs() {
    let dir = scratch("run_given");
    let p = save(&dir, "m.onnx", &identity_model());
    let x = Tensor::from_vec(vec![2, 3], vec![0.5f32, -1.0, 2.0, 3.0, -4.5, 6.25]).unwrap();
    let xf = save_npy(&dir, "x.npy", &x);
    let out = dir.join("out");
    let o = tilec(&[&"run", &p, &"--input", &format!("x={}", xf.display()), &"--out", &out]);
    o.ok();
    assert!(o.stdout.contains("output 'y': f32[2, 3]"), "{}", o.stdout);
    assert!(o.stdout.contains("min -4.5 max 6.25"), "{}", o.stdout);
    assert_eq!(read_npy(&out.join("y.npy")).unwrap(), x);
    assert_eq!(read_npy(&out.join("c.npy")).unwrap(), Tensor::from_vec(vec![2], vec![1.5f32, -2.5]).unwrap());
    // An expectation that holds, and one that does not.
    tilec(&[&"run", &p, &"-i", &format!("x={}", xf.display()), &"--expect", &format!("y={}", xf.display())]).ok();
    let wrong =
        save_npy(&dir, "wrong.npy", &Tensor::from_vec(vec![2, 3], vec![0.5f32, -1.0, 2.0, 3.0, -4.5, 7.0]).unwrap());
    let o = tilec(&[&"run", &p, &"-i", &format!("x={}", xf.display()), &"--expect", &format!("y={}", wrong.display())]);
    o.fails_with(&["1 of 1 checked outputs differ"]);
    assert!(
        o.stdout.contains("MISMATCH: 1/6 elements differ") && o.stdout.contains("max abs err 0.75"),
        "{}",
        o.stdout
    );
    // Looser tolerances accept it.
    tilec(&[
        &"run",
        &p,
        &"-i",
        &format!("x={}", xf.display()),
        &"--expect",
        &format!("y={}", wrong.display()),
        &"--atol",
        &"1",
    ])
    .ok();
}

#[test]
fn run_with_random_inputs_and_roundtrip_through_npy() {
    let dir = scratch("run_random");
    let p = save(&dir, "m.onnx", &identity_model());
    let out1 = dir.join("out1");
    let o = tilec(&[&"run", &p, &"--out", &out1, &"--seed", &"7"]);
    o.ok();
    assert!(o.stdout.contains("dimension 'batch'") && o.stdout.contains("= 1"), "{}", o.stdout);
    let y = read_npy(&out1.join("y.npy")).unwrap();
    assert_eq!(y.shape(), &[1, 3]);
    assert_eq!(y.dtype(), DType::F32);
    assert!(y.to_f64_vec().iter().all(|v| (-1.0..1.0).contains(v)), "{y:?}");
    // Same seed, same values; the written output fed back in gives itself.
    let out2 = dir.join("out2");
    tilec(&[&"run", &p, &"--out", &out2, &"--seed", &"7"]).ok();
    assert_eq!(read_npy(&out2.join("y.npy")).unwrap(), y);
    let out3 = dir.join("out3");
    let yf = out1.join("y.npy");
    tilec(&[&"run", &p, &"--out", &out3, &"--input", &format!("x={}", yf.display())]).ok();
    assert_eq!(read_npy(&out3.join("y.npy")).unwrap(), y);
    // --dim picks the symbolic size.
    let out4 = dir.join("out4");
    tilec(&[&"run", &p, &"--out", &out4, &"--dim", &"batch=4"]).ok();
    assert_eq!(read_npy(&out4.join("y.npy")).unwrap().shape(), &[4, 3]);
}

#[test]
fn run_writes_every_npy_dtype() {
    let dir = scratch("run_dtypes");
    let cases = [
        ("f", F32, DType::F32),
        ("h", F16, DType::F16),
        ("d", F64, DType::F64),
        ("i", I64, DType::I64),
        ("u", U8, DType::U8),
        ("b", BOOL, DType::Bool),
    ];
    let mut nodes = Vec::new();
    let mut ins = Vec::new();
    let mut outs = Vec::new();
    for (n, code, _) in cases {
        nodes.push(node(&format!("id_{n}"), "Identity", &[n], &[&format!("{n}_out")]));
        ins.push(vi(n, code, &[D::N(2), D::N(2)]));
        outs.push(vi(&format!("{n}_out"), code, &[D::N(2), D::N(2)]));
    }
    let p = save(&dir, "m.onnx", &model(nodes, ins, outs));
    let out = dir.join("out");
    tilec(&[&"run", &p, &"--out", &out]).ok();
    for (n, _, dt) in cases {
        let t = read_npy(&out.join(format!("{n}_out.npy"))).unwrap();
        assert_eq!((t.dtype(), t.shape()), (dt, &[2usize, 2][..]), "{n}");
        // Feeding the file back reproduces it.
        let out2 = dir.join(format!("again_{n}"));
        let f = out.join(format!("{n}_out.npy"));
        tilec(&[&"run", &p, &"--out", &out2, &"--input", &format!("{n}={}", f.display())]).ok();
        assert_eq!(read_npy(&out2.join(format!("{n}_out.npy"))).unwrap(), t);
    }
}

#[test]
fn run_accepts_onnx_test_data() {
    let dir = scratch("run_pb");
    let p = save(&dir, "m.onnx", &identity_model());
    let data = dir.join("test_data_set_0");
    std::fs::create_dir_all(&data).unwrap();
    let x = Tensor::from_vec(vec![1, 3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let c = Tensor::from_vec(vec![2], vec![1.5f32, -2.5]).unwrap();
    let pb = |name: &str, t: &Tensor| {
        std::fs::write(data.join(name), tilec_onnx::tensor::tensor_to_proto("", t).encode_to_vec()).unwrap()
    };
    pb("input_0.pb", &x);
    pb("output_0.pb", &x);
    pb("output_1.pb", &c);
    let o = tilec(&[&"run", &p, &"--expect-dir", &data]);
    o.ok();
    assert!(o.stdout.contains("all 2 checked outputs match"), "{}", o.stdout);
    // A wrong expectation fails the run.
    pb("output_1.pb", &Tensor::from_vec(vec![2], vec![1.5f32, 2.5]).unwrap());
    let o = tilec(&[&"run", &p, &"--expect-dir", &data]);
    o.fails_with(&["1 of 2 checked outputs differ"]);
    assert!(o.stdout.contains("check 'c'") && o.stdout.contains("MISMATCH"), "{}", o.stdout);
    // .pb inputs by name.
    let o = tilec(&[&"run", &p, &"--input", &format!("x={}", data.join("input_0.pb").display())]);
    o.ok();
    assert!(o.stdout.contains("[1, 2, 3]"), "{}", o.stdout);
}

/// Relu may or may not be implemented in this tree: either it computes max(x, 0) or the
/// error names the op as unsupported.
#[test]
fn relu_computes_or_is_reported_unsupported() {
    let dir = scratch("relu");
    let p = save(
        &dir,
        "m.onnx",
        &model(
            vec![node("act", "Relu", &["x"], &["y"])],
            vec![vi("x", F32, &[D::N(4)])],
            vec![vi("y", F32, &[D::N(4)])],
        ),
    );
    let xf = save_npy(&dir, "x.npy", &Tensor::from_vec(vec![4], vec![-1.0f32, 0.5, -0.0, 3.0]).unwrap());
    let out = dir.join("out");
    let o = tilec(&[&"run", &p, &"-i", &format!("x={}", xf.display()), &"--out", &out]);
    if o.code == 0 {
        let y = read_npy(&out.join("y.npy")).unwrap();
        assert_eq!(y.to_f64_vec(), vec![0.0, 0.5, 0.0, 3.0]);
    } else {
        o.fails_with(&["'act'", "Relu", "unsupported"]);
    }
}

// ---------------------------------------------------------------- bad input

#[test]
fn bad_model_files_fail_cleanly() {
    let dir = scratch("bad_files");
    let bytes = identity_model().encode_to_vec();
    let trunc = dir.join("truncated.onnx");
    std::fs::write(&trunc, &bytes[..bytes.len() / 2]).unwrap();
    let garbage = dir.join("garbage.onnx");
    std::fs::write(&garbage, [0xffu8; 64]).unwrap();
    let missing = dir.join("missing.onnx");
    for cmd in ["inspect", "run", "print-ir"] {
        tilec(&[&cmd, &trunc]).fails_with(&["truncated.onnx", "cannot decode"]);
        tilec(&[&cmd, &garbage]).fails_with(&["garbage.onnx", "cannot decode"]);
        tilec(&[&cmd, &missing]).fails_with(&["missing.onnx", "cannot read"]);
    }
    let empty = dir.join("empty.onnx");
    std::fs::write(&empty, b"").unwrap();
    tilec(&[&"run", &empty]).fails_with(&["no graph"]);
}

#[test]
fn dangling_reference_is_reported() {
    let dir = scratch("dangling");
    let m = model(
        vec![node("reader", "Identity", &["nowhere"], &["y"])],
        vec![vi("x", F32, &[D::N(2)])],
        vec![vi("y", F32, &[D::N(2)])],
    );
    let p = save(&dir, "m.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["'reader'", "Identity", "'nowhere'", "not defined"]);
    let o = tilec(&[&"inspect", &p]);
    o.ok();
    assert!(o.stdout.contains("FAILED") && o.stdout.contains("nowhere"), "{}", o.stdout);
}

#[test]
fn cycle_is_reported() {
    let dir = scratch("cycle");
    let m = model(
        vec![node("first", "Identity", &["b"], &["a"]), node("second", "Identity", &["a"], &["b"])],
        vec![vi("x", F32, &[D::N(2)])],
        vec![vi("b", F32, &[D::N(2)])],
    );
    let p = save(&dir, "m.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["'first'", "'b'", "cycle"]);
    tilec(&[&"print-ir", &p]).fails_with(&["'first'", "cycle"]);
}

#[test]
fn unknown_domain_and_op_are_reported() {
    let dir = scratch("unknown_ops");
    let mut m = model(
        vec![NodeProto { domain: "com.example".into(), ..node("custom", "Foo", &["x"], &["y"]) }],
        vec![vi("x", F32, &[D::N(2)])],
        vec![vi("y", F32, &[D::N(2)])],
    );
    let p = save(&dir, "no_opset.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["'custom'", "Foo", "com.example"]);
    m.opset_import.push(OperatorSetIdProto { domain: "com.example".into(), version: 1 });
    let p = save(&dir, "with_opset.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["'custom'", "Foo", "com.example", "not supported"]);
    let m = model(
        vec![node("mystery", "NoSuchOpAnywhere", &["x"], &["y"])],
        vec![vi("x", F32, &[D::N(2)])],
        vec![vi("y", F32, &[D::N(2)])],
    );
    let p = save(&dir, "unsupported.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["'mystery'", "NoSuchOpAnywhere", "unsupported"]);
}

#[test]
fn bad_inputs_are_reported() {
    let dir = scratch("bad_inputs");
    let p = save(&dir, "m.onnx", &identity_model());
    let good = save_npy(&dir, "good.npy", &Tensor::from_vec(vec![2, 3], vec![0f32; 6]).unwrap());
    // Wrong name: lists the valid ones.
    tilec(&[&"run", &p, &"--input", &format!("nope={}", good.display())]).fails_with(&["'nope'", "inputs: 'x'"]);
    // Wrong dtype.
    let ints = save_npy(&dir, "ints.npy", &Tensor::from_vec(vec![2, 3], vec![0i64; 6]).unwrap());
    tilec(&[&"run", &p, &"--input", &format!("x={}", ints.display())]).fails_with(&[
        "input 'x'",
        "ints.npy",
        "expected f32[batch, 3]",
        "got i64[2, 3]",
        "dtype",
    ]);
    // Wrong shape, wrong rank.
    let wide = save_npy(&dir, "wide.npy", &Tensor::from_vec(vec![2, 4], vec![0f32; 8]).unwrap());
    tilec(&[&"run", &p, &"--input", &format!("x={}", wide.display())]).fails_with(&[
        "input 'x'",
        "expected f32[batch, 3]",
        "got f32[2, 4]",
        "dimension 1 must be 3",
    ]);
    let flat = save_npy(&dir, "flat.npy", &Tensor::from_vec(vec![6], vec![0f32; 6]).unwrap());
    tilec(&[&"run", &p, &"--input", &format!("x={}", flat.display())]).fails_with(&["input 'x'", "rank"]);
    // A --dim that contradicts the given input.
    tilec(&[&"run", &p, &"--dim", &"batch=3", &"--input", &format!("x={}", good.display())]).fails_with(&[
        "input 'x'",
        "expected f32[3, 3]",
        "got f32[2, 3]",
    ]);
    // Broken and missing input files.
    let bytes = std::fs::read(&good).unwrap();
    let trunc = dir.join("trunc.npy");
    std::fs::write(&trunc, &bytes[..bytes.len() - 5]).unwrap();
    tilec(&[&"run", &p, &"--input", &format!("x={}", trunc.display())]).fails_with(&[
        "input 'x'",
        "trunc.npy",
        "truncated",
    ]);
    let junk = dir.join("junk.npy");
    std::fs::write(&junk, b"\x93NUMPY\x01\x00garbage").unwrap();
    tilec(&[&"run", &p, &"--input", &format!("x={}", junk.display())]).fails_with(&["input 'x'", "junk.npy"]);
    let junk_pb = dir.join("junk.pb");
    std::fs::write(&junk_pb, [0xffu8; 16]).unwrap();
    tilec(&[&"run", &p, &"--input", &format!("x={}", junk_pb.display())]).fails_with(&["input 'x'", "junk.pb"]);
    tilec(&[&"run", &p, &"--input", &format!("x={}", dir.join("absent.npy").display())]).fails_with(&[
        "input 'x'",
        "absent.npy",
        "cannot read",
    ]);
    // Malformed arguments.
    tilec(&[&"run", &p, &"--input", &"x"]).fails_with(&["NAME=FILE"]);
    tilec(&[&"run", &p, &"--dim", &"nosuch=2"]).fails_with(&["'nosuch'", "batch"]);
    tilec(&[&"run", &p, &"--dim", &"batch=two"]).fails_with(&["batch=two"]);
    tilec(&[&"run", &p, &"--backend", &"gpu"]).fails_with(&["gpu", "ref"]);
    tilec(&[&"run", &p, &"--expect", &format!("zz={}", good.display())]).fails_with(&["'zz'", "outputs: 'y', 'c'"]);
    tilec(&[&"run", &p, &"--expect-dir", &dir.join("nodir")]).fails_with(&["not a directory"]);
}

#[test]
fn shape_operand_inputs_are_bound_or_explained() {
    let dir = scratch("shape_operand");
    let m = model(
        vec![node("reshape", "Reshape", &["x", "shape"], &["y"])],
        vec![vi("x", F32, &[D::N(2), D::N(3)]), vi("shape", I64, &[D::N(2)])],
        vec![vi("y", F32, &[D::N(3), D::N(2)])],
    );
    let p = save(&dir, "m.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["'reshape'", "Reshape", "'shape'", "--input shape="]);
    let x = Tensor::from_vec(vec![2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
    let xf = save_npy(&dir, "x.npy", &x);
    let sf = save_npy(&dir, "shape.npy", &Tensor::from_vec(vec![2], vec![3i64, 2]).unwrap());
    let out = dir.join("out");
    let o = tilec(&[
        &"run",
        &p,
        &"-i",
        &format!("x={}", xf.display()),
        &"-i",
        &format!("shape={}", sf.display()),
        &"--out",
        &out,
    ]);
    o.ok();
    assert!(o.stdout.contains("'shape' is compiled in as a constant"), "{}", o.stdout);
    assert_eq!(read_npy(&out.join("y.npy")).unwrap(), x.reshaped(vec![3, 2]).unwrap());
    // The shape operand computed from an input (here through Identity): the given small
    // integer inputs are compiled in.
    let m = model(
        vec![node("alias", "Identity", &["shape"], &["s2"]), node("reshape", "Reshape", &["x", "s2"], &["y"])],
        vec![vi("x", F32, &[D::N(2), D::N(3)]), vi("shape", I64, &[D::N(2)])],
        vec![vi("y", F32, &[D::N(3), D::N(2)])],
    );
    let p = save(&dir, "computed.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["'reshape'", "'s2'", "computed from graph inputs"]);
    let o = tilec(&[&"run", &p, &"-i", &format!("shape={}", sf.display()), &"-i", &format!("x={}", xf.display())]);
    o.ok();
    assert!(o.stdout.contains("'shape' is compiled in as a constant"), "{}", o.stdout);
    assert!(o.stdout.contains("output 'y': f32[3, 2]"), "{}", o.stdout);
}

#[test]
fn non_tensor_values_are_refused() {
    let dir = scratch("non_tensor");
    let mut seq = vi("s", F32, &[D::N(2)]);
    let elem = seq.r#type.take().map(Box::new);
    seq.r#type = Some(TypeProto {
        value: Some(type_proto::Value::SequenceType(type_proto::Sequence { elem_type: elem })),
        ..Default::default()
    });
    let m = model(vec![node("id", "Identity", &["s"], &["y"])], vec![seq], vec![vi("y", F32, &[D::N(2)])]);
    let p = save(&dir, "m.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["'s'", "sequence"]);
    let f = save_npy(&dir, "s.npy", &Tensor::from_vec(vec![2], vec![1f32, 2.]).unwrap());
    tilec(&[&"run", &p, &"-i", &format!("s={}", f.display())]).fails_with(&["input 's' is a sequence, not a tensor"]);
}

#[test]
fn unnamed_dimensions_default_to_one() {
    let dir = scratch("unnamed_dim");
    let m = model(
        vec![node("copy", "Identity", &["x"], &["y"])],
        vec![vi("x", F32, &[D::U, D::N(2)])],
        vec![vi("y", F32, &[D::U, D::N(2)])],
    );
    let p = save(&dir, "m.onnx", &m);
    let o = tilec(&[&"inspect", &p]);
    o.ok();
    assert!(o.stdout.contains("x: f32[?, 2]"), "{}", o.stdout);
    let out = dir.join("out");
    let o = tilec(&[&"run", &p, &"--out", &out]);
    o.ok();
    assert!(o.stdout.contains("unnamed dimension"), "{}", o.stdout);
    assert_eq!(read_npy(&out.join("y.npy")).unwrap().shape(), &[1, 2]);
}

#[test]
fn bfloat16_is_compared_at_its_precision() {
    let dir = scratch("bf16");
    const BF16: i32 = 16;
    let m = model(
        vec![node("copy", "Identity", &["x"], &["y"])],
        vec![vi("x", BF16, &[D::N(2)])],
        vec![vi("y", BF16, &[D::N(2)])],
    );
    let p = save(&dir, "m.onnx", &m);
    let bf = |v: [f32; 2]| Tensor::from_vec(vec![2], v.map(half::bf16::from_f32).to_vec()).unwrap();
    let pb = |name: &str, t: &Tensor| {
        let f = dir.join(name);
        std::fs::write(&f, tilec_onnx::tensor::tensor_to_proto("", t).encode_to_vec()).unwrap();
        f
    };
    let x = pb("x.pb", &bf([1.0, 2.0]));
    // One bf16 ulp above 1.0 (2^-7): within bf16 precision, far outside rtol 1e-3.
    let near = pb("near.pb", &bf([1.0078125, 2.0]));
    let far = pb("far.pb", &bf([1.0625, 2.0]));
    let o = tilec(&[&"run", &p, &"-i", &format!("x={}", x.display()), &"--expect", &format!("y={}", near.display())]);
    o.ok();
    assert!(o.stdout.contains("rtol 0.015625"), "{}", o.stdout);
    tilec(&[&"run", &p, &"-i", &format!("x={}", x.display()), &"--expect", &format!("y={}", far.display())])
        .fails_with(&["1 of 1 checked outputs differ"]);
    // Written as float32 .npy (NumPy has no bfloat16).
    let out = dir.join("out");
    let o = tilec(&[&"run", &p, &"-i", &format!("x={}", x.display()), &"--out", &out]);
    o.ok();
    assert!(o.stdout.contains("as float32"), "{}", o.stdout);
    assert_eq!(read_npy(&out.join("y.npy")).unwrap(), Tensor::from_vec(vec![2], vec![1.0f32, 2.0]).unwrap());
}

#[test]
fn explain_reports_kernel_groups_for_a_transformer() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/gpt2/model.onnx");
    let explain = |target: &str| -> (String, usize) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tilec"))
            .args(["explain", model, "--target", target, "--dim", "batch=2", "--dim", "seq=64"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let groups: usize = stdout
            .lines()
            .find_map(|l| l.strip_prefix("summary: ")?.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no summary:\n{stdout}"));
        (stdout, groups)
    };
    // Four transformer blocks of at most 7 kernels each, plus the preamble and the head.
    let (cpu, groups) = explain("cpu");
    assert!(cpu.contains("Attention 4"), "{cpu}");
    assert!(groups <= 4 * 7 + 4, "{groups} groups");
    // On CUDA attention stays two matrix products around a row softmax (no attention family
    // yet): two more kernels per block.
    let (cuda, groups) = explain("cuda");
    assert!(!cuda.contains("Attention "), "{cuda}");
    assert!(groups <= 4 * 9 + 4, "{groups} groups");
}

#[test]
fn print_ir_after_a_pass_and_unknown_pass() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/bert/model.onnx");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tilec")).args(args).output().unwrap()
    };
    let out = run(&["print-ir", model, "--print-ir-after", "recognize-layernorm", "--time-passes"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("IR after recognize-layernorm"), "{stdout}");
    assert!(stdout.contains("= attention{"), "attention recognized at -O3");
    let out = run(&["print-ir", model, "-O0"]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("= attention{"), "no recognition at -O0");
    let out = run(&["print-ir", model, "--print-ir-after", "no-such-pass"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no pass 'no-such-pass'") && !err.contains("panicked"), "{err}");
}

/// Inputs the importer fuzzer once crashed on (overflowing element counts, a huge declared
/// channel count): they must now end in a clean result or error.
#[test]
fn fuzz_regressions_do_not_crash() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        for cmd in ["inspect", "run"] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_tilec")).arg(cmd).arg(&p).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(matches!(out.status.code(), Some(0) | Some(1)), "{cmd} {}: {:?} {err}", p.display(), out.status);
            assert!(!err.contains("panicked"), "{cmd} {}: {err}", p.display());
        }
        n += 1;
    }
    assert!(n >= 3);
}

// ---------------------------------------------------------------- --dtype

/// `--dtype f16` runs GPT-2's export in 16 bits (its products on f16 tensors, the graph's
/// interface still f32) and `--compare-ref` compares with the f32 model: close, not equal.
/// A model whose values exceed f16's range gets a note pointing at bf16, which keeps f32's.
#[test]
fn run_in_sixteen_bits_compares_with_the_f32_model() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let gpt2 = root.join("models/gpt2/model.onnx");
    if !gpt2.is_file() {
        eprintln!("note: {} missing", gpt2.display());
        return;
    }
    let dir = scratch("dtype");
    let base = [&"run" as &dyn AsRef<std::ffi::OsStr>, &gpt2, &"--dim", &"batch=1", &"--dim", &"seq=8", &"--compare-ref"];
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = base.to_vec();
    args.extend([&"--dtype" as &dyn AsRef<std::ffi::OsStr>, &"f16", &"--rtol", &"2e-2", &"--atol", &"2e-2", &"--out", &dir]);
    let o = tilec(&args);
    o.ok();
    for needle in ["nodes run in f16 (inputs and outputs stay f32)", "reference interpreter on the f32 model", "all 1 checked outputs match"] {
        assert!(o.stdout.contains(needle), "lacks {needle:?}:\n{}", o.stdout);
    }
    let y = read_npy(&dir.join("logits.npy")).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    // At f32's default tolerance the 16-bit result is measurably different: the conversion
    // did something.
    let mut strict: Vec<&dyn AsRef<std::ffi::OsStr>> = base.to_vec();
    strict.extend([&"--dtype" as &dyn AsRef<std::ffi::OsStr>, &"bf16", &"--rtol", &"1e-6", &"--atol", &"1e-7"]);
    tilec(&strict).fails_with(&["differ"]);
    tilec(&[&"run", &gpt2, &"--dtype", &"f64"]).fails_with(&["f64"]);
}

// ---------------------------------------------------------------- profile outputs

/// `--trace` writes one Chrome trace event per profiled call (kernels times runs) and
/// `--roofline` an SVG with a point per kernel that computes; the run prints time by kind.
#[test]
fn profile_writes_a_trace_and_a_roofline() {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gen/light/squeezenet/model.onnx");
    if !model.is_file() {
        eprintln!("note: {} missing", model.display());
        return;
    }
    let dir = scratch("profile_outputs");
    let (trace, svg) = (dir.join("t.json"), dir.join("r.svg"));
    let o = tilec(&[&"run", &model, &"--trace", &trace, &"--roofline", &svg]);
    o.ok();
    assert!(o.stdout.contains("time by kind") && o.stdout.contains("  conv "), "{}", o.stdout);
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let ev = t["traceEvents"].as_array().unwrap();
    let kernels = o.stdout.lines().filter(|l| l.starts_with('k') && l.contains("  5  ")).count();
    assert!(kernels > 10 && ev.len() == kernels * 5, "{} events for {kernels} kernels x 5 runs", ev.len());
    assert!(ev.iter().all(|e| e["ph"] == "X" && e["dur"].as_f64().is_some_and(|d| d >= 0.0)));
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.contains("measured: a 32 MiB copy"), "{}", &s[..200.min(s.len())]);
    assert!(s.matches("<circle").count() >= 20, "{}", s.matches("<circle").count());
}

/// `tilec profile` writes the tables, a JSON account of every kernel against the roofline
/// (what binds it, its fraction of the ceiling, its family's parameters), the trace and the
/// plot into one directory.
#[test]
fn profile_command_writes_its_directory() {
    let model = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gen/light/squeezenet/model.onnx");
    if !model.is_file() {
        eprintln!("note: {} missing", model.display());
        return;
    }
    let dir = scratch("profile_command").join("out");
    let o = tilec(&[&"profile", &model, &"--profile-dir", &dir]);
    o.ok();
    assert!(o.stdout.contains("gap to the roofline"), "{}", o.stdout);
    let text = std::fs::read_to_string(dir.join("profile.txt")).unwrap();
    assert!(text.contains("time by kind") && text.contains("ridge at"), "{text}");
    let j: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("profile.json")).unwrap()).unwrap();
    assert!(j["ceilings"]["gbps"].as_f64().is_some_and(|g| g > 0.0) && j["runs"] == 5, "{j}");
    let ks = j["kernels"].as_array().unwrap();
    assert!(ks.len() > 10, "{} kernels", ks.len());
    for k in ks {
        assert!(k["bound"] == "memory" || k["bound"] == "compute", "{k}");
        assert!(k["roof_fraction"].as_f64().is_some_and(|f| f > 0.0) && k["calls"] == 5, "{k}");
    }
    // Blocked GEMMs carry their blocking; the slowest kernel comes first.
    assert!(ks.iter().any(|k| k["name"].as_str().unwrap().contains("blis_gemm") && k["detail"].as_str().unwrap().contains("kc=")), "{j}");
    let ms: Vec<f64> = ks.iter().map(|k| k["total_ms"].as_f64().unwrap()).collect();
    assert!(ms.windows(2).all(|w| w[0] >= w[1]), "{ms:?}");
    assert!(j["by_kind"].as_array().unwrap().iter().any(|k| k["kind"] == "conv"));
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap();
    assert_eq!(t["traceEvents"].as_array().unwrap().len(), ks.len() * 5);
    assert!(std::fs::read_to_string(dir.join("roofline.svg")).unwrap().starts_with("<svg"));
}
