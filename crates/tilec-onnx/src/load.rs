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

use crate::tensor::{dtype_from_onnx, onnx_type_name};
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
/// (default 0) into `raw_data`; `external_data` is cleared and `data_location`
/// set to `DEFAULT`. Exactly the tensor's own bytes are read (its shape times its
/// element size): a `length` that says otherwise, or a range past the end of the
/// file, is an error.
///
/// `location` must be a relative path without `..` escapes, and the file it
/// names, with every symbolic link resolved, must be a regular file inside the
/// model's directory (also resolved): links pointing elsewhere, directories,
/// FIFOs, sockets and devices are refused.
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
    let mut r = Resolver {
        base_dir,
        real_base: None,
    };
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
    /// `base_dir` canonicalized, once a tensor needs it.
    real_base: Option<PathBuf>,
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
        let base = self.real_base_dir().map_err(err)?;
        let (mut file, file_path, file_len) = open_inside(&base, &rel, location).map_err(err)?;

        // The tensor's own size decides how much is read: a `length` that disagrees is an
        // error, a missing one means exactly the tensor's bytes. Only element types whose
        // size tilec does not know fall back to `length`, or the rest of the file.
        let need = stored_bytes(t).map_err(err)?;
        let length = match (need, length) {
            (Some(need), Some(l)) if l != need => {
                return Err(err(format!(
                    "length {l} in '{location}' does not match the tensor's {need} bytes (shape {:?} of {})",
                    t.dims,
                    onnx_type_name(t.data_type)
                )))
            }
            (Some(need), _) => need,
            (None, Some(l)) => l,
            (None, None) => file_len.saturating_sub(offset),
        };
        let in_bounds = matches!(offset.checked_add(length), Some(end) if end <= file_len);
        if !in_bounds {
            return Err(err(format!(
                "range offset {offset} length {length} is out of bounds of '{}' ({file_len} bytes)",
                file_path.display()
            )));
        }
        // In bounds of a file that exists: at most the file's size is allocated.
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

    /// The model's directory with every link resolved, computed once.
    fn real_base_dir(&mut self) -> Result<PathBuf, String> {
        if self.real_base.is_none() {
            let real = self.base_dir.canonicalize().map_err(|e| {
                format!(
                    "cannot resolve the model's directory '{}': {e}",
                    self.base_dir.display()
                )
            })?;
            self.real_base = Some(real);
        }
        Ok(self.real_base.clone().unwrap_or_default())
    }
}

/// Opens the external data file `rel` (already checked lexically) of the model directory
/// `base` (canonical). Links are followed, and where they end must still be inside `base`;
/// only regular files are opened (a FIFO would block, a device would never end). Returns
/// the file, its real path and its size.
fn open_inside(base: &Path, rel: &Path, location: &str) -> Result<(File, PathBuf, u64), String> {
    let joined = base.join(rel);
    let real = joined
        .canonicalize()
        .map_err(|e| format!("cannot open '{}': {e}", joined.display()))?;
    if !real.starts_with(base) {
        return Err(format!(
            "location '{location}' resolves to '{}', outside the model's directory '{}' (a symbolic link?)",
            real.display(),
            base.display()
        ));
    }
    let meta = std::fs::metadata(&real)
        .map_err(|e| format!("cannot stat '{}': {e}", real.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "location '{location}' is {}, not a regular file",
            file_kind(&meta.file_type())
        ));
    }
    let file =
        File::open(&real).map_err(|e| format!("cannot open '{}': {e}", real.display()))?;
    let opened = file
        .metadata()
        .map_err(|e| format!("cannot stat '{}': {e}", real.display()))?;
    if !opened.is_file() || !same_file(&meta, &opened) {
        return Err(format!(
            "'{}' was replaced while it was being opened",
            real.display()
        ));
    }
    let len = opened.len();
    Ok((file, real, len))
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    true
}

/// What a non-regular file is, for messages.
fn file_kind(ft: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO";
        }
        if ft.is_socket() {
            return "a socket";
        }
        if ft.is_block_device() || ft.is_char_device() {
            return "a device";
        }
    }
    if ft.is_dir() {
        "a directory"
    } else {
        "not a plain file"
    }
}

/// The number of bytes a tensor's data occupies when stored raw, from its shape and
/// element type; `None` for element types whose storage size tilec does not know.
fn stored_bytes(t: &TensorProto) -> Result<Option<u64>, String> {
    use proto::tensor_proto::DataType as T;
    let mut n: u64 = 1;
    for &d in &t.dims {
        let d = u64::try_from(d).map_err(|_| format!("negative dimension {d} in shape {:?}", t.dims))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| format!("shape {:?} has too many elements", t.dims))?;
    }
    let bits: u64 = match T::try_from(t.data_type) {
        Ok(T::String) => return Err("string tensors cannot be stored as external data".into()),
        Ok(T::Complex64) => 64,
        Ok(T::Complex128) => 128,
        Ok(T::Float8e4m3fnuz | T::Float8e5m2fnuz | T::Float8e8m0) => 8,
        Ok(T::Uint4 | T::Int4 | T::Float4e2m1) => 4,
        Ok(T::Uint2 | T::Int2) => 2,
        _ => match dtype_from_onnx(t.data_type) {
            Some(dt) => 8 * dt.size_bytes() as u64,
            None => return Ok(None),
        },
    };
    let total_bits = n
        .checked_mul(bits)
        .ok_or_else(|| format!("shape {:?} is too large", t.dims))?;
    Ok(Some(total_bits.div_ceil(8)))
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
