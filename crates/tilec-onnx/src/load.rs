//! Reading ONNX models and serialized protobuf values from disk.
//!
//! [`load_model`] decodes a `.onnx` file and inlines any tensors stored as
//! ONNX *external data* (`data_location == EXTERNAL`), so the rest of the
//! compiler only ever sees self-contained tensors. [`load_tensor_pb`] and
//! friends read the single-value `.pb` files used by ONNX test data
//! (`test_data_set_*/input_*.pb`).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use prost::Message;

use crate::proto::{
    self, tensor_proto::DataLocation, GraphProto, NodeProto, SparseTensorProto, TensorProto,
};

/// Errors from loading ONNX files.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Bytes were not a valid protobuf encoding of the expected message.
    #[error("cannot decode {what}: {source}")]
    Decode {
        /// What was being decoded (e.g. `ONNX model '/path/model.onnx'`).
        what: String,
        #[source]
        source: prost::DecodeError,
    },
    /// A tensor's external data could not be resolved.
    #[error("external data of tensor {tensor}: {msg}")]
    ExternalData {
        /// The tensor's name, or a description of where it sits if unnamed.
        tensor: String,
        msg: String,
    },
}

fn read_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn decode<M: Message + Default>(
    bytes: &[u8],
    what: impl FnOnce() -> String,
) -> Result<M, LoadError> {
    M::decode(bytes).map_err(|source| LoadError::Decode {
        what: what(),
        source,
    })
}

/// Decodes a serialized `ModelProto`. External data is left unresolved.
pub fn decode_model(bytes: &[u8]) -> Result<proto::ModelProto, LoadError> {
    decode(bytes, || "ONNX model".to_string())
}

/// Reads and decodes an ONNX model file, inlining all external tensor data.
///
/// Every tensor with `data_location == EXTERNAL` (graph initializers, sparse
/// initializers, tensor-valued node attributes, recursively through subgraph
/// attributes, model functions and training-info graphs) gets its bytes read
/// from `location` (relative to the model file's directory) at `offset`
/// (default 0) for `length` bytes (default: to the end of the file) into
/// `raw_data`; `external_data` is cleared and `data_location` set to
/// `DEFAULT`.
///
/// `location` must be a relative path that stays inside the model's
/// directory (checked lexically; absolute paths and `..` escapes are rejected).
pub fn load_model(path: &Path) -> Result<proto::ModelProto, LoadError> {
    let bytes = read_file(path)?;
    let mut model: proto::ModelProto =
        decode(&bytes, || format!("ONNX model '{}'", path.display()))?;
    let base_dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    resolve_external_data(&mut model, &base_dir)?;
    Ok(model)
}

/// Reads a file holding one serialized `TensorProto` (ONNX test data
/// `input_<i>.pb` / `output_<i>.pb` for tensor-typed values).
pub fn load_tensor_pb(path: &Path) -> Result<proto::TensorProto, LoadError> {
    let bytes = read_file(path)?;
    decode(&bytes, || format!("TensorProto '{}'", path.display()))
}

/// Reads a file holding one serialized `SequenceProto` (ONNX test data for
/// sequence-typed values).
pub fn load_sequence_pb(path: &Path) -> Result<proto::SequenceProto, LoadError> {
    let bytes = read_file(path)?;
    decode(&bytes, || format!("SequenceProto '{}'", path.display()))
}

/// Reads a file holding one serialized `OptionalProto` (ONNX test data for
/// optional-typed values).
pub fn load_optional_pb(path: &Path) -> Result<proto::OptionalProto, LoadError> {
    let bytes = read_file(path)?;
    decode(&bytes, || format!("OptionalProto '{}'", path.display()))
}

/// Inlines the external data of every tensor in `model`, resolving locations
/// relative to `base_dir`. See [`load_model`].
pub fn resolve_external_data(
    model: &mut proto::ModelProto,
    base_dir: &Path,
) -> Result<(), LoadError> {
    let mut r = Resolver { base_dir };
    if let Some(g) = model.graph.as_mut() {
        r.graph(g, "graph")?;
    }
    for f in &mut model.functions {
        let ctx = format!("function '{}'", f.name);
        for n in &mut f.node {
            r.node(n, &ctx)?;
        }
        for a in &mut f.attribute_proto {
            r.attribute(a, &format!("{ctx} default"))?;
        }
    }
    for (i, t) in model.training_info.iter_mut().enumerate() {
        if let Some(g) = t.initialization.as_mut() {
            r.graph(g, &format!("training_info[{i}].initialization"))?;
        }
        if let Some(g) = t.algorithm.as_mut() {
            r.graph(g, &format!("training_info[{i}].algorithm"))?;
        }
    }
    Ok(())
}

struct Resolver<'a> {
    base_dir: &'a Path,
}

impl Resolver<'_> {
    fn graph(&mut self, g: &mut GraphProto, ctx: &str) -> Result<(), LoadError> {
        let ctx = if g.name.is_empty() {
            ctx.to_string()
        } else {
            format!("{ctx} '{}'", g.name)
        };
        for (i, t) in g.initializer.iter_mut().enumerate() {
            self.tensor(t, || format!("{ctx} initializer #{i}"))?;
        }
        for (i, s) in g.sparse_initializer.iter_mut().enumerate() {
            self.sparse(s, &format!("{ctx} sparse initializer #{i}"))?;
        }
        for n in &mut g.node {
            self.node(n, &ctx)?;
        }
        Ok(())
    }

    fn node(&mut self, n: &mut NodeProto, ctx: &str) -> Result<(), LoadError> {
        let ctx = format!("{ctx} node '{}' ({})", n.name, n.op_type);
        for a in &mut n.attribute {
            self.attribute(a, &ctx)?;
        }
        Ok(())
    }

    fn attribute(&mut self, a: &mut proto::AttributeProto, ctx: &str) -> Result<(), LoadError> {
        let ctx = format!("{ctx} attribute '{}'", a.name);
        // Walk every populated field rather than trusting `type`: a tensor
        // left behind with external data would be silently wrong otherwise.
        if let Some(t) = a.t.as_mut() {
            self.tensor(t, || ctx.clone())?;
        }
        for (i, t) in a.tensors.iter_mut().enumerate() {
            self.tensor(t, || format!("{ctx} tensor #{i}"))?;
        }
        if let Some(s) = a.sparse_tensor.as_mut() {
            self.sparse(s, &ctx)?;
        }
        for (i, s) in a.sparse_tensors.iter_mut().enumerate() {
            self.sparse(s, &format!("{ctx} sparse tensor #{i}"))?;
        }
        if let Some(g) = a.g.as_mut() {
            self.graph(g, &format!("{ctx} subgraph"))?;
        }
        for (i, g) in a.graphs.iter_mut().enumerate() {
            self.graph(g, &format!("{ctx} subgraph #{i}"))?;
        }
        Ok(())
    }

    fn sparse(&mut self, s: &mut SparseTensorProto, ctx: &str) -> Result<(), LoadError> {
        if let Some(t) = s.values.as_mut() {
            self.tensor(t, || format!("{ctx} values"))?;
        }
        if let Some(t) = s.indices.as_mut() {
            self.tensor(t, || format!("{ctx} indices"))?;
        }
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &mut TensorProto,
        ctx: impl FnOnce() -> String,
    ) -> Result<(), LoadError> {
        if t.data_location != DataLocation::External as i32 {
            return Ok(());
        }
        let label = if t.name.is_empty() {
            format!("<unnamed> ({})", ctx())
        } else {
            format!("'{}'", t.name)
        };
        let err = |msg: String| LoadError::ExternalData {
            tensor: label.clone(),
            msg,
        };

        let mut location = None;
        let mut offset: u64 = 0;
        let mut length: Option<u64> = None;
        for kv in &t.external_data {
            match kv.key.as_str() {
                "location" => location = Some(kv.value.as_str()),
                "offset" => {
                    offset = kv
                        .value
                        .trim()
                        .parse()
                        .map_err(|_| err(format!("invalid offset '{}'", kv.value)))?
                }
                "length" => {
                    length = Some(
                        kv.value
                            .trim()
                            .parse()
                            .map_err(|_| err(format!("invalid length '{}'", kv.value)))?,
                    )
                }
                // "checksum" and unknown keys are informational.
                _ => {}
            }
        }
        let location = location.ok_or_else(|| err("no 'location' key in external_data".into()))?;
        let rel = check_location(location).map_err(err)?;
        let file_path = self.base_dir.join(&rel);

        let mut file = File::open(&file_path)
            .map_err(|e| err(format!("cannot open '{}': {e}", file_path.display())))?;
        let file_len = file
            .metadata()
            .map_err(|e| err(format!("cannot stat '{}': {e}", file_path.display())))?
            .len();
        let length = match length {
            Some(l) => l,
            None => file_len.checked_sub(offset).ok_or_else(|| {
                err(format!(
                    "offset {offset} is past the end of '{}' ({file_len} bytes)",
                    file_path.display()
                ))
            })?,
        };
        let in_bounds = matches!(offset.checked_add(length), Some(end) if end <= file_len);
        if !in_bounds {
            return Err(err(format!(
                "range offset {offset} length {length} is out of bounds of '{}' ({file_len} bytes)",
                file_path.display()
            )));
        }
        let len = usize::try_from(length)
            .map_err(|_| err(format!("length {length} does not fit in memory")))?;
        let mut data = vec![0u8; len];
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(&mut data))
            .map_err(|e| err(format!("cannot read '{}': {e}", file_path.display())))?;

        t.raw_data = data;
        t.external_data.clear();
        t.data_location = DataLocation::Default as i32;
        Ok(())
    }
}

/// Validates an external-data `location`: it must be relative and must not
/// leave the model directory. Returns the lexically normalized path.
fn check_location(location: &str) -> Result<PathBuf, String> {
    if location.is_empty() {
        return Err("empty 'location'".into());
    }
    let p = Path::new(location);
    let mut out = PathBuf::new();
    let mut depth = 0usize;
    for c in p.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => {
                return Err(format!(
                    "location '{location}' is an absolute path; it must be relative to the model's directory"
                ))
            }
            Component::CurDir => {}
            Component::ParentDir => {
                if depth == 0 {
                    return Err(format!(
                        "location '{location}' escapes the model's directory via '..'"
                    ));
                }
                depth -= 1;
                out.pop();
            }
            Component::Normal(s) => {
                depth += 1;
                out.push(s);
            }
        }
    }
    if depth == 0 {
        return Err(format!("location '{location}' does not name a file"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::attribute_proto::AttributeType;
    use crate::proto::tensor_proto::DataType;
    use crate::proto::tensor_shape_proto::{dimension, Dimension};
    use crate::proto::type_proto;
    use crate::proto::{
        AttributeProto, ModelProto, OperatorSetIdProto, StringStringEntryProto, TensorShapeProto,
        TypeProto, ValueInfoProto,
    };
    use std::sync::atomic::{AtomicU32, Ordering};

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

    fn load_err(tag: &str, w: TensorProto) -> String {
        let dir = TempDir::new(tag);
        std::fs::write(dir.0.join("data.bin"), [0u8; 8]).unwrap();
        let c = TensorProto {
            name: "c".into(),
            ..Default::default()
        };
        let model_path = dir.0.join("model.onnx");
        std::fs::write(&model_path, sample_model(w, c).encode_to_vec()).unwrap();
        let e = load_model(&model_path).unwrap_err();
        assert!(matches!(e, LoadError::ExternalData { .. }), "{e:?}");
        e.to_string()
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
}
