//! Helpers of the `tilec` binary's tests: scratch directories, running the binary, and
//! small ONNX models built with the protobuf structs.
#![allow(dead_code)]

use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;
use tilec::tensor_io::write_npy;
use tilec::Tensor;
use tilec_onnx::proto::{
    tensor_shape_proto::{dimension, Dimension},
    type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};

/// A fresh scratch directory for one test.
pub fn scratch(test: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-tests").join(test);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "expected success\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }

    /// Asserts a clean failure whose stderr contains every needle.
    pub fn fails_with(&self, needles: &[&str]) -> &Self {
        assert_ne!(self.code, 0, "expected failure\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        for n in needles {
            assert!(self.stderr.contains(n), "stderr lacks {n:?}:\n{}", self.stderr);
        }
        self
    }
}

/// Runs the binary; asserts it never panics whatever the outcome.
pub fn tilec(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Out {
    // Never the user's tuning database: a path that does not exist (nothing is created there
    // by `run` or `explain`).
    let no_db = std::env::temp_dir().join("tilec-tests-no-tuning-db").join("none.sqlite");
    let out = Command::new(env!("CARGO_BIN_EXE_tilec"))
        .args(args.iter().map(|a| a.as_ref()))
        .env("TILEC_TUNING_DB", no_db)
        .output()
        .expect("the tilec binary runs");
    let o = Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!o.stderr.contains("panicked"), "tilec panicked:\n{}", o.stderr);
    assert!(o.code >= 0, "tilec was killed by a signal:\n{}", o.stderr);
    o
}

pub const F32: i32 = 1;
pub const U8: i32 = 2;
pub const I64: i32 = 7;
pub const BOOL: i32 = 9;
pub const F16: i32 = 10;
pub const F64: i32 = 11;

pub enum D {
    N(i64),
    P(&'static str),
    /// Unknown and unnamed.
    U,
}

pub fn vi(name: &str, elem_type: i32, dims: &[D]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: match d {
                D::N(n) => Some(dimension::Value::DimValue(*n)),
                D::P(p) => Some(dimension::Value::DimParam(p.to_string())),
                D::U => None,
            },
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type,
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn node(name: &str, op_type: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        name: name.into(),
        op_type: op_type.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

pub fn model(nodes: Vec<NodeProto>, inputs: Vec<ValueInfoProto>, outputs: Vec<ValueInfoProto>) -> ModelProto {
    ModelProto {
        ir_version: 8,
        producer_name: "tilec-tests".into(),
        producer_version: "1.0".into(),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
        graph: Some(GraphProto { name: "g".into(), node: nodes, input: inputs, output: outputs, ..Default::default() }),
        ..Default::default()
    }
}

pub fn save(dir: &Path, name: &str, m: &ModelProto) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p
}

pub fn save_npy(dir: &Path, name: &str, t: &Tensor) -> PathBuf {
    let p = dir.join(name);
    write_npy(&p, t).unwrap();
    p
}

/// `y = Identity(x)` with `x: f32[batch, 3]`, and a Constant output `c`.
pub fn identity_model() -> ModelProto {
    let c = tilec_onnx::tensor::tensor_to_proto("", &Tensor::from_vec(vec![2], vec![1.5f32, -2.5]).unwrap());
    let mut cn = node("make_c", "Constant", &[], &["c"]);
    cn.attribute.push(AttributeProto { name: "value".into(), r#type: 4, t: Some(c), ..Default::default() });
    model(
        vec![node("copy", "Identity", &["x"], &["y"]), cn],
        vec![vi("x", F32, &[D::P("batch"), D::N(3)])],
        vec![vi("y", F32, &[D::P("batch"), D::N(3)]), vi("c", F32, &[D::N(2)])],
    )
}
