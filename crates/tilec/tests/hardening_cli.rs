//! The `tilec` binary against careless or hostile input: external data that leaves the
//! model's directory, models that break ONNX's rules (opset imports, names defined twice),
//! and out-of-range flags. Each ends in a clear error (or the right answer), never a crash.

mod common;

use common::*;
use tilec::tensor_io::read_npy;
use tilec::Tensor;
use tilec_onnx::proto::tensor_proto::DataLocation;
use tilec_onnx::proto::{ModelProto, OperatorSetIdProto, StringStringEntryProto, TensorProto};

/// The JSON object on the last line of stdout.
fn last_json(o: &Out) -> serde_json::Value {
    let line = o.stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("the last line is not JSON ({e}):\n{}", o.stdout))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `y = Identity(w)` where `w: f32[2]` is stored as external data at `location`.
fn external_model(location: &str, extra: &[(&str, &str)]) -> ModelProto {
    let mut kvs = vec![("location", location)];
    kvs.extend_from_slice(extra);
    let w = TensorProto {
        name: "w".into(),
        dims: vec![2],
        data_type: F32,
        data_location: DataLocation::External as i32,
        external_data: kvs
            .iter()
            .map(|(k, v)| StringStringEntryProto { key: k.to_string(), value: v.to_string() })
            .collect(),
        ..Default::default()
    };
    let mut m = model(vec![node("copy", "Identity", &["w"], &["y"])], vec![], vec![vi("y", F32, &[D::N(2)])]);
    m.graph.as_mut().unwrap().initializer.push(w);
    m
}

// ---------------------------------------------------------------- external data

#[cfg(unix)]
#[test]
fn external_data_through_a_link_stays_inside_the_model_directory() {
    let dir = scratch("hardening_ext_link");
    let outside = scratch("hardening_ext_link_outside");
    std::fs::write(outside.join("secret.bin"), f32_bytes(&[41.0, 42.0])).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.bin"), dir.join("w.bin")).unwrap();
    let p = save(&dir, "m.onnx", &external_model("w.bin", &[]));
    let o = tilec(&[&"run", &p, &"--backend", &"ref"]);
    o.fails_with(&["tensor 'w'", "'w.bin'", "outside the model's directory"]);
    assert!(!o.stdout.contains("42"), "the linked file's bytes came out:\n{}", o.stdout);
    tilec(&[&"run", &p, &"--json"]).fails_with(&["outside the model's directory"]);

    // A link whose target is inside is followed, and the values come out.
    std::fs::remove_file(dir.join("w.bin")).unwrap();
    std::fs::write(dir.join("real.bin"), f32_bytes(&[1.5, -2.5])).unwrap();
    std::os::unix::fs::symlink("real.bin", dir.join("w.bin")).unwrap();
    let out = dir.join("out");
    tilec(&[&"run", &p, &"--out", &out]).ok();
    assert_eq!(read_npy(&out.join("y.npy")).unwrap(), Tensor::from_vec(vec![2], vec![1.5f32, -2.5]).unwrap());
}

#[test]
fn external_data_past_the_end_of_its_file_is_refused() {
    let dir = scratch("hardening_ext_range");
    std::fs::write(dir.join("w.bin"), f32_bytes(&[1.0])).unwrap();
    let p = save(&dir, "short.onnx", &external_model("w.bin", &[]));
    tilec(&[&"run", &p]).fails_with(&["tensor 'w'", "out of bounds", "4 bytes"]);
    let p = save(&dir, "offset.onnx", &external_model("w.bin", &[("offset", "18446744073709551615")]));
    tilec(&[&"run", &p]).fails_with(&["tensor 'w'", "out of bounds"]);
    let p = save(&dir, "length.onnx", &external_model("w.bin", &[("length", "4")]));
    tilec(&[&"run", &p]).fails_with(&["tensor 'w'", "length 4", "8 bytes"]);
}

// ---------------------------------------------------------------- model validation

fn with_opsets(mut m: ModelProto, ir_version: i64, opsets: &[(&str, i64)]) -> ModelProto {
    m.ir_version = ir_version;
    m.opset_import =
        opsets.iter().map(|&(d, v)| OperatorSetIdProto { domain: d.to_string(), version: v }).collect();
    m
}

#[test]
fn opset_imports_are_checked() {
    let dir = scratch("hardening_opsets");
    let p = save(&dir, "future.onnx", &with_opsets(identity_model(), 8, &[("", 999)]));
    tilec(&[&"run", &p]).fails_with(&["opset 999", "default domain", "opsets 1 to"]);
    // `inspect` still describes the model and says why it does not import.
    let o = tilec(&[&"inspect", &p]);
    o.ok();
    assert!(o.stdout.contains("import:     FAILED") && o.stdout.contains("opset 999"), "{}", o.stdout);
    let p = save(&dir, "zero.onnx", &with_opsets(identity_model(), 8, &[("ai.onnx", 0)]));
    tilec(&[&"run", &p]).fails_with(&["opset 0", "opsets 1 to"]);
    let p = save(&dir, "twice.onnx", &with_opsets(identity_model(), 8, &[("", 13), ("ai.onnx", 17)]));
    tilec(&[&"run", &p]).fails_with(&["imported twice", "13", "17"]);

    // No opset import at all: only IR versions 1 and 2 may omit it (and are then opset 1).
    let p = save(&dir, "none.onnx", &with_opsets(identity_model(), 8, &[]));
    tilec(&[&"run", &p]).fails_with(&["imports no opset", "IR version 8"]);
    let p = save(&dir, "old.onnx", &with_opsets(identity_model(), 2, &[]));
    tilec(&[&"run", &p, &"--backend", &"ref"]).ok();
    // Another domain only: the default domain's nodes are refused by name.
    let p = save(&dir, "other.onnx", &with_opsets(identity_model(), 8, &[("com.example", 1)]));
    tilec(&[&"run", &p]).fails_with(&["'copy'", "Identity", "does not import the default domain"]);
}

#[test]
fn names_defined_twice_are_refused() {
    let dir = scratch("hardening_duplicates");
    let mut m = identity_model();
    let g = m.graph.as_mut().unwrap();
    g.input.push(vi("x", F32, &[D::P("batch"), D::N(3)]));
    let p = save(&dir, "inputs.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["graph input 'x' is listed twice"]);

    let m = model(
        vec![node("first", "Identity", &["x"], &["y"]), node("second", "Neg", &["x"], &["y"])],
        vec![vi("x", F32, &[D::N(2)])],
        vec![vi("y", F32, &[D::N(2)])],
    );
    let p = save(&dir, "outputs.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["'second'", "Neg", "output 'y' is defined twice"]);

    let w = |v: f32| {
        tilec_onnx::tensor::tensor_to_proto("w", &Tensor::from_vec(vec![2], vec![v, v]).unwrap())
    };
    let mut m = model(
        vec![node("add", "Add", &["x", "w"], &["y"])],
        vec![vi("x", F32, &[D::N(2)])],
        vec![vi("y", F32, &[D::N(2)])],
    );
    m.graph.as_mut().unwrap().initializer.extend([w(1.0), w(2.0)]);
    let p = save(&dir, "inits.onnx", &m);
    tilec(&[&"run", &p]).fails_with(&["initializer 'w' is defined twice"]);
}

// ---------------------------------------------------------------- flags

#[test]
fn numeric_flags_are_bounded() {
    let dir = scratch("hardening_flags");
    let p = save(&dir, "m.onnx", &identity_model());
    for t in ["0", "4097", "2147483648"] {
        tilec(&[&"run", &p, &"--threads", &t]).fails_with(&["--threads", "1..=4096"]);
    }
    tilec(&[&"run", &p, &"--threads=-1"]).fails_with(&["'-1' for '--threads"]);
    tilec(&[&"run", &p, &"--bench", &"1000001"]).fails_with(&["--bench", "0..=1000000"]);
    for (flag, v) in [("--rtol", "nan"), ("--rtol", "-1e-3"), ("--atol", "inf"), ("--atol", "-0.5")] {
        tilec(&[&"run", &p, &flag, &v]).fails_with(&[flag, "must be finite and at least 0"]);
    }
    tilec(&[&"run", &p, &"--dim", &"batch=9223372036854775808"]).fails_with(&["larger than an ONNX dimension"]);
    // The bounds themselves are accepted.
    tilec(&[&"run", &p, &"--threads", &"1", &"--rtol", &"0", &"--atol", &"0"]).ok();
}

#[test]
fn bench_zero_times_no_runs() {
    let dir = scratch("hardening_bench");
    let p = save(&dir, "m.onnx", &identity_model());
    let o = tilec(&[&"run", &p, &"--bench", &"0", &"--json"]);
    o.ok();
    assert!(!o.stdout.contains("bench:"), "{}", o.stdout);
    assert_eq!(last_json(&o)["ok"], true);
    let o = tilec(&[&"run", &p, &"--bench", &"3"]);
    o.ok();
    assert!(o.stdout.contains("bench: 3 runs"), "{}", o.stdout);
}

#[test]
fn out_is_checked_before_compiling() {
    let dir = scratch("hardening_out");
    let p = save(&dir, "m.onnx", &identity_model());
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    for target in [file.clone(), file.join("sub")] {
        let o = tilec(&[&"run", &p, &"--out", &target]);
        o.fails_with(&["--out", "a-file"]);
        assert!(!o.stdout.contains("compiled") && !o.stdout.contains("ran on"), "{}", o.stdout);
    }
    tilec(&[&"run", &p, &"--out", &file]).fails_with(&["exists and is not a directory"]);
    tilec(&[&"run", &p, &"--out", &file.join("sub")]).fails_with(&["cannot create the directory"]);

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let ro = dir.join("read-only");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        // Permissions do not bind a privileged user: check only where they hold.
        if std::fs::File::create(ro.join("probe")).is_err() {
            let o = tilec(&[&"run", &p, &"--out", &ro]);
            o.fails_with(&["cannot write in the directory"]);
            assert!(!o.stdout.contains("compiled"), "{}", o.stdout);
        }
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn expect_reports_nan_and_infinity_mismatches() {
    let dir = scratch("hardening_expect_nan");
    let p = save(&dir, "m.onnx", &identity_model());
    let x = save_npy(&dir, "x.npy", &Tensor::from_vec(vec![1, 3], vec![1.0f32, f32::NAN, f32::INFINITY]).unwrap());
    let run = |want: Vec<f32>, extra: &[&dyn AsRef<std::ffi::OsStr>]| {
        let e = save_npy(&dir, "want.npy", &Tensor::from_vec(vec![1, 3], want).unwrap());
        let (i, y) = (format!("x={}", x.display()), format!("y={}", e.display()));
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
            vec![&"run", &p, &"--backend", &"ref", &"-i", &i, &"--expect", &y];
        args.extend_from_slice(extra);
        tilec(&args)
    };

    // NaN where 2 was expected: a mismatch, and the report says why its errors read 0.
    let o = run(vec![1.0, 2.0, f32::INFINITY], &[]);
    o.fails_with(&["differ from their expected values"]);
    assert!(
        o.stdout.contains("MISMATCH: 1/3 elements differ")
            && o.stdout.contains("1 where a NaN or infinity faces another value")
            && o.stdout.contains("expected 2, got nan"),
        "{}",
        o.stdout
    );
    // An infinity where a number was expected, or the other infinity.
    let o = run(vec![1.0, f32::NAN, 1e30], &[]);
    o.fails_with(&["differ"]);
    assert!(o.stdout.contains("expected 1.0000e30, got inf"), "{}", o.stdout);
    run(vec![1.0, f32::NAN, f32::NEG_INFINITY], &[]).fails_with(&["differ"]);
    // NaN for NaN and the same infinity match.
    let o = run(vec![1.0, f32::NAN, f32::INFINITY], &[]);
    o.ok();
    assert!(o.stdout.contains("all 1 checked outputs match"), "{}", o.stdout);

    // The JSON report counts them.
    let o = run(vec![1.0, 2.0, 3.0], &[&"--json"]);
    o.fails_with(&["differ"]);
    let j = last_json(&o);
    assert_eq!((j["ok"].clone(), j["mismatched"].clone(), j["nonfinite_mismatches"].clone()), (false.into(), 1.into(), 2.into()));
}

#[test]
fn json_reports_errors_as_json() {
    let dir = scratch("hardening_json");
    // A missing model, a model that does not import, a flag out of range: each prints one
    // JSON object with "ok": false and the error, on stdout, and exits non-zero.
    let missing = dir.join("missing.onnx");
    let future = save(&dir, "future.onnx", &with_opsets(identity_model(), 8, &[("", 999)]));
    let good = save(&dir, "m.onnx", &identity_model());
    let cases: [(Vec<&dyn AsRef<std::ffi::OsStr>>, &str); 4] = [
        (vec![&"run", &missing, &"--json"], "missing.onnx"),
        (vec![&"run", &future, &"--json"], "opset 999"),
        (vec![&"run", &good, &"--json", &"--threads", &"0"], "--threads"),
        (vec![&"run", &good, &"--json", &"-i", &"nope=x.npy"], "no input 'nope'"),
    ];
    for (args, needle) in cases {
        let o = tilec(&args);
        assert_ne!(o.code, 0, "{}", o.stdout);
        let j = last_json(&o);
        assert_eq!(j["ok"], false, "{j}");
        assert!(j["error"].as_str().is_some_and(|e| e.contains(needle)), "{j}");
    }
    // On success: "ok": true and no error, on the reference backend too.
    let o = tilec(&[&"run", &good, &"--backend", &"ref", &"--json"]);
    o.ok();
    let j = last_json(&o);
    assert_eq!((j["ok"].clone(), j.get("error")), (true.into(), None), "{j}");
}
