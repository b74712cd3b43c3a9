//! Loading ONNX files: the protobuf encoding, `.pb` test data, and external data, which
//! must be a regular file inside the model's directory (links resolved) holding exactly the
//! tensor's bytes.

use prost::Message;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use tilec_onnx::load::{decode_model, load_model, load_tensor_pb, LoadError};
use tilec_onnx::proto::attribute_proto::AttributeType;
use tilec_onnx::proto::tensor_proto::{DataLocation, DataType};
use tilec_onnx::proto::tensor_shape_proto::{dimension, Dimension};
use tilec_onnx::proto::type_proto;
use tilec_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// A unique scratch directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!(
            "tilec-onnx-{tag}-{}-{n}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn kv(k: &str, v: &str) -> StringStringEntryProto {
    StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    }
}

fn tensor_vi(name: &str, dims: &[Option<i64>]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: DataType::Float as i32,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: Some(match d {
                                Some(v) => dimension::Value::DimValue(*v),
                                None => dimension::Value::DimParam("N".into()),
                            }),
                            denotation: String::new(),
                        })
                        .collect(),
                }),
            })),
            denotation: String::new(),
        }),
        ..Default::default()
    }
}

fn external(name: &str, dims: &[i64], kvs: &[(&str, &str)]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: DataType::Float as i32,
        data_location: DataLocation::External as i32,
        external_data: kvs.iter().map(|(k, v)| kv(k, v)).collect(),
        ..Default::default()
    }
}

/// `x [N,3] -> Add(x, w) -> If(cond){ then: Constant(value=c) }`.
fn sample_model(w: TensorProto, c: TensorProto) -> ModelProto {
    let then_graph = GraphProto {
        name: "then".into(),
        node: vec![NodeProto {
            op_type: "Constant".into(),
            name: "const".into(),
            output: vec!["c".into()],
            attribute: vec![AttributeProto {
                name: "value".into(),
                r#type: AttributeType::Tensor as i32,
                t: Some(c),
                ..Default::default()
            }],
            ..Default::default()
        }],
        output: vec![tensor_vi("c", &[Some(3)])],
        ..Default::default()
    };
    ModelProto {
        ir_version: 11,
        producer_name: "tilec-test".into(),
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 21,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![
                NodeProto {
                    op_type: "Add".into(),
                    name: "add".into(),
                    input: vec!["x".into(), "w".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                },
                NodeProto {
                    op_type: "If".into(),
                    name: "if".into(),
                    input: vec!["cond".into()],
                    output: vec!["z".into()],
                    attribute: vec![AttributeProto {
                        name: "then_branch".into(),
                        r#type: AttributeType::Graph as i32,
                        g: Some(then_graph),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            initializer: vec![w],
            input: vec![tensor_vi("x", &[None, Some(3)])],
            output: vec![tensor_vi("y", &[None, Some(3)])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn round_trip_model() {
    let w = TensorProto {
        name: "w".into(),
        dims: vec![3],
        data_type: DataType::Float as i32,
        float_data: vec![1.0, 2.0, 3.0],
        ..Default::default()
    };
    let c = TensorProto {
        name: "c".into(),
        dims: vec![3],
        data_type: DataType::Int64 as i32,
        int64_data: vec![-1, 0, 1 << 40],
        ..Default::default()
    };
    let m = sample_model(w, c);
    let bytes = m.encode_to_vec();
    let back = decode_model(&bytes).unwrap();
    assert_eq!(back, m);
    let g = back.graph.as_ref().unwrap();
    assert_eq!(g.node[1].attribute[0].r#type(), AttributeType::Graph);
    let dim0 = &g.input[0].r#type.as_ref().unwrap().value;
    match dim0 {
        Some(type_proto::Value::TensorType(t)) => {
            let d = &t.shape.as_ref().unwrap().dim;
            assert_eq!(d[0].value, Some(dimension::Value::DimParam("N".into())));
            assert_eq!(d[1].value, Some(dimension::Value::DimValue(3)));
        }
        other => panic!("unexpected type {other:?}"),
    }
}

#[test]
fn wire_format_matches_reference_encoding() {
    // Bytes as written by the reference protobuf implementation for
    // TensorProto{dims:[2,3], data_type:FLOAT, float_data:[1.0], name:"t"}:
    // dims unpacked (proto2 default), float_data packed.
    let t = TensorProto {
        dims: vec![2, 3],
        data_type: 1,
        float_data: vec![1.0],
        name: "t".into(),
        ..Default::default()
    };
    let expected: &[u8] = &[
        0x08, 0x02, 0x08, 0x03, // dims = 1 (varint, unpacked)
        0x10, 0x01, // data_type = 2
        0x22, 0x04, 0x00, 0x00, 0x80, 0x3f, // float_data = 4 (packed)
        0x42, 0x01, b't', // name = 8
    ];
    assert_eq!(t.encode_to_vec(), expected);
    assert_eq!(TensorProto::decode(expected).unwrap(), t);
    // Packed dims must decode too.
    let packed: &[u8] = &[0x0a, 0x02, 0x02, 0x03];
    assert_eq!(TensorProto::decode(packed).unwrap().dims, vec![2, 3]);
}

#[test]
fn external_data_resolution() {
    let dir = TempDir::new("ext");
    std::fs::create_dir_all(dir.0.join("weights")).unwrap();
    let mut blob = vec![0xAAu8; 16]; // padding before w
    blob.extend(f32_bytes(&[1.0, 2.0, 3.0]));
    blob.extend(f32_bytes(&[4.0, 5.0, 6.0]));
    std::fs::write(dir.0.join("weights/data.bin"), &blob).unwrap();
    std::fs::write(dir.0.join("c.bin"), f32_bytes(&[7.0, 8.0, 9.0])).unwrap();

    let w = external(
        "w",
        &[3],
        &[
            ("location", "./weights/../weights/data.bin"),
            ("offset", "16"),
            ("length", "12"),
        ],
    );
    // No offset/length: whole file.
    let c = external("", &[3], &[("location", "c.bin")]);
    let model_path = dir.0.join("model.onnx");
    std::fs::write(&model_path, sample_model(w, c).encode_to_vec()).unwrap();

    let m = load_model(&model_path).unwrap();
    let g = m.graph.unwrap();
    let w = &g.initializer[0];
    assert_eq!(w.raw_data, f32_bytes(&[1.0, 2.0, 3.0]));
    assert_eq!(w.data_location, DataLocation::Default as i32);
    assert!(w.external_data.is_empty());
    let c = g.node[1].attribute[0].g.as_ref().unwrap().node[0].attribute[0]
        .t
        .as_ref()
        .unwrap();
    assert_eq!(c.raw_data, f32_bytes(&[7.0, 8.0, 9.0]));
    assert_eq!(c.data_location, DataLocation::Default as i32);
}

/// Writes `model.onnx` (with initializer `w`) and an 8-byte `data.bin` into a fresh
/// directory, lets `prepare` add files, and loads the model.
fn load_in(tag: &str, w: TensorProto, prepare: impl FnOnce(&Path)) -> Result<ModelProto, LoadError> {
    let dir = TempDir::new(tag);
    std::fs::write(dir.0.join("data.bin"), [0u8; 8]).unwrap();
    prepare(&dir.0);
    let c = TensorProto {
        name: "c".into(),
        ..Default::default()
    };
    let model_path = dir.0.join("model.onnx");
    std::fs::write(&model_path, sample_model(w, c).encode_to_vec()).unwrap();
    load_model(&model_path)
}

/// The message of an external-data error from [`load_in`].
fn load_err_in(tag: &str, w: TensorProto, prepare: impl FnOnce(&Path)) -> String {
    let e = load_in(tag, w, prepare).unwrap_err();
    assert!(matches!(e, LoadError::ExternalData { .. }), "{e:?}");
    e.to_string()
}

fn load_err(tag: &str, w: TensorProto) -> String {
    load_err_in(tag, w, |_| {})
}

#[test]
fn external_data_rejects_escaping_paths() {
    let e = load_err(
        "dotdot",
        external("w", &[2], &[("location", "../data.bin")]),
    );
    assert!(e.contains("'w'") && e.contains(".."), "{e}");
    let e = load_err(
        "dotdot2",
        external("w", &[2], &[("location", "a/../../data.bin")]),
    );
    assert!(e.contains("escapes"), "{e}");
    let abs = std::env::temp_dir().join("data.bin");
    let e = load_err(
        "abs",
        external("w", &[2], &[("location", abs.to_str().unwrap())]),
    );
    assert!(e.contains("absolute"), "{e}");
}

#[test]
fn external_data_errors_name_the_tensor() {
    let e = load_err("missing", external("w", &[2], &[("location", "nope.bin")]));
    assert!(e.contains("'w'") && e.contains("nope.bin"), "{e}");
    let e = load_err(
        "range",
        external(
            "w",
            &[2],
            &[("location", "data.bin"), ("offset", "4"), ("length", "8")],
        ),
    );
    assert!(e.contains("'w'") && e.contains("out of bounds"), "{e}");
    let e = load_err(
        "badoff",
        external("w", &[2], &[("location", "data.bin"), ("offset", "x")]),
    );
    assert!(e.contains("invalid offset"), "{e}");
    let e = load_err("noloc", external("w", &[2], &[("offset", "0")]));
    assert!(e.contains("location"), "{e}");
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    let inputs: [&[u8]; 5] = [
        &[0xff; 64],
        &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f], // huge length prefix
        &[0x3a, 0x05, 0x01],                   // truncated graph
        &[0x07],                               // invalid wire type
        b"this is definitely not a protobuf message",
    ];
    for b in inputs {
        assert!(decode_model(b).is_err(), "{b:?}");
    }
    let e = decode_model(&[0xff; 8]).unwrap_err();
    assert!(matches!(e, LoadError::Decode { .. }));
    assert!(e.to_string().contains("ONNX model"), "{e}");

    let dir = TempDir::new("garbage");
    let p = dir.0.join("input_0.pb");
    std::fs::write(&p, [0x0a, 0x80]).unwrap();
    let e = load_tensor_pb(&p).unwrap_err();
    assert!(e.to_string().contains("input_0.pb"), "{e}");
    let e = load_model(&dir.0.join("missing.onnx")).unwrap_err();
    assert!(matches!(e, LoadError::Io { .. }), "{e:?}");
}

#[test]
fn tensor_pb_round_trip() {
    let dir = TempDir::new("pb");
    let t = TensorProto {
        name: "x".into(),
        dims: vec![2],
        data_type: DataType::Float as i32,
        raw_data: f32_bytes(&[0.5, -0.5]),
        ..Default::default()
    };
    let p = dir.0.join("input_0.pb");
    std::fs::write(&p, t.encode_to_vec()).unwrap();
    assert_eq!(load_tensor_pb(&p).unwrap(), t);
}

#[cfg(unix)]
mod links_and_special_files {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_link_to_a_file_outside_the_model_directory_is_refused() {
        let outside = TempDir::new("outside");
        let secret = outside.0.join("secret.bin");
        std::fs::write(&secret, f32_bytes(&[6.0, 7.0])).unwrap();
        let w = external("w", &[2], &[("location", "link.bin")]);
        let e = load_err_in("link-out", w, |d| symlink(&secret, d.join("link.bin")).unwrap());
        assert!(e.contains("'w'") && e.contains("'link.bin'") && e.contains("outside the model's directory"), "{e}");

        // Through a linked directory the same.
        let w = external("w", &[2], &[("location", "sub/secret.bin")]);
        let e = load_err_in("dirlink-out", w, |d| symlink(&outside.0, d.join("sub")).unwrap());
        assert!(e.contains("'sub/secret.bin'") && e.contains("outside"), "{e}");

        // A system file is no different.
        let w = external("w", &[2], &[("location", "passwd")]);
        let e = load_err_in("link-etc", w, |d| symlink("/etc/passwd", d.join("passwd")).unwrap());
        assert!(e.contains("outside"), "{e}");
    }

    #[test]
    fn links_that_stay_inside_are_followed() {
        let w = external("w", &[2], &[("location", "alias.bin")]);
        let m = load_in("link-in", w, |d| {
            std::fs::write(d.join("real.bin"), f32_bytes(&[1.5, -2.0])).unwrap();
            symlink("real.bin", d.join("alias.bin")).unwrap();
        })
        .unwrap();
        assert_eq!(m.graph.unwrap().initializer[0].raw_data, f32_bytes(&[1.5, -2.0]));

        // The model's directory itself may be reached through a link.
        let real = TempDir::new("linked-model-dir");
        let w = external("w", &[2], &[("location", "data.bin"), ("length", "8")]);
        let c = TensorProto { name: "c".into(), ..Default::default() };
        std::fs::write(real.0.join("data.bin"), f32_bytes(&[3.0, 4.0])).unwrap();
        std::fs::write(real.0.join("model.onnx"), sample_model(w, c).encode_to_vec()).unwrap();
        let via = TempDir::new("via");
        symlink(&real.0, via.0.join("m")).unwrap();
        let m = load_model(&via.0.join("m/model.onnx")).unwrap();
        assert_eq!(m.graph.unwrap().initializer[0].raw_data, f32_bytes(&[3.0, 4.0]));
    }

    #[test]
    fn directories_are_refused() {
        let w = external("w", &[2], &[("location", "weights")]);
        let e = load_err_in("dir", w, |d| std::fs::create_dir(d.join("weights")).unwrap());
        assert!(e.contains("'w'") && e.contains("'weights'") && e.contains("a directory"), "{e}");
        // A link to the model's own directory.
        let w = external("w", &[2], &[("location", "self")]);
        let e = load_err_in("dir-self", w, |d| symlink(".", d.join("self")).unwrap());
        assert!(e.contains("a directory"), "{e}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        // Opening a FIFO for reading blocks until a writer comes: run the load on a thread
        // so that a regression fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let w = external("w", &[2], &[("location", "pipe")]);
            let r = load_in("fifo", w, |d| {
                let st = std::process::Command::new("mkfifo").arg(d.join("pipe")).status().unwrap();
                assert!(st.success(), "mkfifo failed");
            });
            let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("loading a model whose external data is a FIFO blocked");
        let e = r.unwrap_err();
        assert!(e.contains("'w'") && e.contains("'pipe'") && e.contains("a FIFO"), "{e}");
    }
}

#[test]
fn exactly_the_tensor_bytes_are_read() {
    // No length: the tensor's own 8 bytes, not the whole (larger) file.
    let w = external("w", &[2], &[("location", "big.bin"), ("offset", "4")]);
    let m = load_in("own-bytes", w, |d| {
        let mut blob = vec![0u8; 4];
        blob.extend(f32_bytes(&[5.0, 6.0]));
        blob.resize(1 << 20, 0xEE);
        std::fs::write(d.join("big.bin"), blob).unwrap();
    })
    .unwrap();
    assert_eq!(m.graph.unwrap().initializer[0].raw_data, f32_bytes(&[5.0, 6.0]));

    // A length that disagrees with the shape.
    let e = load_err("len-short", external("w", &[2], &[("location", "data.bin"), ("length", "4")]));
    assert!(e.contains("'w'") && e.contains("length 4") && e.contains("8 bytes"), "{e}");
    let e = load_err("len-long", external("w", &[1], &[("location", "data.bin"), ("length", "8")]));
    assert!(e.contains("length 8") && e.contains("4 bytes"), "{e}");
}

#[test]
fn ranges_past_the_end_of_the_file_are_refused() {
    // data.bin has 8 bytes; a [4] float tensor needs 16, with or without a length.
    let e = load_err("past-end", external("w", &[4], &[("location", "data.bin")]));
    assert!(e.contains("'w'") && e.contains("out of bounds") && e.contains("8 bytes"), "{e}");
    let e = load_err("past-end-len", external("w", &[4], &[("location", "data.bin"), ("length", "16")]));
    assert!(e.contains("out of bounds"), "{e}");
    let e = load_err("past-end-off", external("w", &[2], &[("location", "data.bin"), ("offset", "1")]));
    assert!(e.contains("offset 1 length 8") && e.contains("out of bounds"), "{e}");
    // A huge shape is refused from the file's size, before anything is allocated.
    let e = load_err("huge", external("w", &[1 << 40, 1 << 10], &[("location", "data.bin")]));
    assert!(e.contains("out of bounds"), "{e}");
    let e = load_err("too-many", external("w", &[1 << 40, 1 << 40], &[("location", "data.bin")]));
    assert!(e.contains("too many elements"), "{e}");
    let e = load_err("negative", external("w", &[-2], &[("location", "data.bin")]));
    assert!(e.contains("negative dimension"), "{e}");
}

#[test]
fn offsets_that_overflow_are_refused() {
    let max = u64::MAX.to_string();
    let e = load_err("off-max", external("w", &[2], &[("location", "data.bin"), ("offset", &max)]));
    assert!(e.contains("'w'") && e.contains("out of bounds"), "{e}");
    let near = (u64::MAX - 3).to_string();
    let e = load_err(
        "off-wrap",
        external("w", &[2], &[("location", "data.bin"), ("offset", &near), ("length", "8")]),
    );
    assert!(e.contains("out of bounds"), "{e}");
    let e = load_err(
        "off-2^64",
        external("w", &[2], &[("location", "data.bin"), ("offset", "18446744073709551616")]),
    );
    assert!(e.contains("invalid offset"), "{e}");
    let e = load_err("off-neg", external("w", &[2], &[("location", "data.bin"), ("offset", "-8")]));
    assert!(e.contains("invalid offset"), "{e}");
}
