//! Tensors on disk: NumPy `.npy` files (through `npyz`) and serialized ONNX
//! `TensorProto`s (`.pb`, the format of ONNX test data).
//!
//! `.npy` covers f16/f32/f64, signed and unsigned integers of 8 to 64 bits and bool, in
//! C order. NumPy has no bfloat16 or fp8 types: reading them is an error, and
//! [`write_npy`] stores such tensors as float32 (it says so in its result).

use std::path::{Path, PathBuf};
use tilec_ir::{DType, Tensor, TensorData};

/// A tensor file that could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("{}: {msg}", path.display())]
pub struct TensorFileError {
    pub path: PathBuf,
    pub msg: String,
}

fn err(path: &Path, msg: impl Into<String>) -> TensorFileError {
    TensorFileError { path: path.to_path_buf(), msg: msg.into() }
}

/// The file formats tensors are read from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TensorFormat {
    Npy,
    /// A serialized ONNX `TensorProto`.
    Pb,
}

const NPY_MAGIC: &[u8] = b"\x93NUMPY";

impl TensorFormat {
    /// The format of a file: by its `.npy`/`.pb` extension, else by its first bytes.
    pub fn detect(path: &Path, bytes: &[u8]) -> TensorFormat {
        match path.extension().and_then(|e| e.to_str()).map(|e| e.to_ascii_lowercase()).as_deref() {
            Some("npy") => TensorFormat::Npy,
            Some("pb") => TensorFormat::Pb,
            _ if bytes.starts_with(NPY_MAGIC) => TensorFormat::Npy,
            _ => TensorFormat::Pb,
        }
    }
}

/// Reads a tensor from a `.npy` or `.pb` file (see [`TensorFormat::detect`]).
pub fn read_tensor(path: &Path) -> Result<Tensor, TensorFileError> {
    let bytes = std::fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    match TensorFormat::detect(path, &bytes) {
        TensorFormat::Npy => npy_from_bytes(&bytes).map_err(|m| err(path, m)),
        TensorFormat::Pb => pb_from_bytes(&bytes).map_err(|m| err(path, m)),
    }
}

/// Reads a `.npy` file.
pub fn read_npy(path: &Path) -> Result<Tensor, TensorFileError> {
    let bytes = std::fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    npy_from_bytes(&bytes).map_err(|m| err(path, m))
}

/// Reads a file holding one serialized ONNX `TensorProto`.
pub fn read_pb(path: &Path) -> Result<Tensor, TensorFileError> {
    let bytes = std::fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    pb_from_bytes(&bytes).map_err(|m| err(path, m))
}

/// Decodes a serialized ONNX `TensorProto`.
pub fn pb_from_bytes(bytes: &[u8]) -> Result<Tensor, String> {
    use prost::Message;
    let tp = tilec_onnx::proto::TensorProto::decode(bytes).map_err(|e| format!("cannot decode TensorProto: {e}"))?;
    if tp.data_type == 0 {
        return Err("not a tensor (no element type: a sequence, optional or other value?)".into());
    }
    tilec_onnx::tensor::tensor_from_proto(&tp)
}

/// Decodes a `.npy` file's contents.
pub fn npy_from_bytes(bytes: &[u8]) -> Result<Tensor, String> {
    use npyz::{DType as NpyDType, NpyFile, NpyHeader, Order, TypeChar};
    if !bytes.starts_with(NPY_MAGIC) {
        return Err("not a .npy file (no NumPy magic header)".into());
    }
    let mut rest: &[u8] = bytes;
    let header = NpyHeader::from_reader(&mut rest).map_err(|e| format!("bad .npy header: {e}"))?;
    if header.order() == Order::Fortran {
        return Err("Fortran-order arrays are not supported; save a C-order array (np.ascontiguousarray)".into());
    }
    let ts = match header.dtype() {
        NpyDType::Plain(ts) => ts,
        other => return Err(format!("structured/array dtype {} is not supported", other.descr())),
    };
    let mut shape = Vec::with_capacity(header.shape().len());
    for &d in header.shape() {
        shape.push(usize::try_from(d).map_err(|_| format!("dimension {d} is too large"))?);
    }
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} has too many elements"))?;
    let item = ts.num_bytes().unwrap_or(0);
    let need = n.checked_mul(item).ok_or_else(|| format!("shape {shape:?} is too large"))?;
    if rest.len() < need {
        return Err(format!("truncated: shape {shape:?} of {ts} needs {need} data bytes, the file has {}", rest.len()));
    }
    let dtype = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Float, 2) => DType::F16,
        (TypeChar::Float, 4) => DType::F32,
        (TypeChar::Float, 8) => DType::F64,
        (TypeChar::Int, 1) => DType::I8,
        (TypeChar::Int, 2) => DType::I16,
        (TypeChar::Int, 4) => DType::I32,
        (TypeChar::Int, 8) => DType::I64,
        (TypeChar::Uint, 1) => DType::U8,
        (TypeChar::Uint, 2) => DType::U16,
        (TypeChar::Uint, 4) => DType::U32,
        (TypeChar::Uint, 8) => DType::U64,
        (TypeChar::Bool, 1) => DType::Bool,
        _ => {
            return Err(format!(
                "element type '{ts}' is not supported (supported: float16/32/64, int8-64, uint8-64, bool)"
            ))
        }
    };
    let file = NpyFile::with_header(header, rest);
    fn get<T: npyz::Deserialize>(f: NpyFile<&[u8]>) -> Result<Vec<T>, String> {
        f.into_vec::<T>().map_err(|e| format!("bad .npy data: {e}"))
    }
    let data = match dtype {
        DType::F16 => TensorData::F16(get(file)?),
        DType::F32 => TensorData::F32(get(file)?),
        DType::F64 => TensorData::F64(get(file)?),
        DType::I8 => TensorData::I8(get(file)?),
        DType::I16 => TensorData::I16(get(file)?),
        DType::I32 => TensorData::I32(get(file)?),
        DType::I64 => TensorData::I64(get(file)?),
        DType::U8 => TensorData::U8(get(file)?),
        DType::U16 => TensorData::U16(get(file)?),
        DType::U32 => TensorData::U32(get(file)?),
        DType::U64 => TensorData::U64(get(file)?),
        DType::Bool => TensorData::Bool(get(file)?),
        _ => return Err(format!("element type {dtype} is not supported")),
    };
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

/// How [`write_npy`] stored a tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NpyStored {
    /// In its own element type.
    Exact,
    /// Converted to float32 (bf16 and fp8 have no NumPy type).
    AsF32,
}

/// Encodes a tensor as `.npy` bytes.
pub fn npy_to_bytes(t: &Tensor) -> Result<(Vec<u8>, NpyStored), String> {
    use npyz::WriterBuilder;
    fn enc<T: npyz::AutoSerialize + Copy>(shape: &[usize], v: &[T]) -> std::io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let mut w = npyz::WriteOptions::new().default_dtype().shape(&shape).writer(&mut buf).begin_nd()?;
        w.extend(v.iter().copied())?;
        w.finish()?;
        Ok(buf)
    }
    let s = t.shape();
    let out = match t.data() {
        TensorData::F16(v) => enc(s, v),
        TensorData::F32(v) => enc(s, v),
        TensorData::F64(v) => enc(s, v),
        TensorData::I8(v) => enc(s, v),
        TensorData::I16(v) => enc(s, v),
        TensorData::I32(v) => enc(s, v),
        TensorData::I64(v) => enc(s, v),
        TensorData::U8(v) => enc(s, v),
        TensorData::U16(v) => enc(s, v),
        TensorData::U32(v) => enc(s, v),
        TensorData::U64(v) => enc(s, v),
        TensorData::Bool(v) => enc(s, v),
        TensorData::BF16(_) | TensorData::F8E4M3(_) | TensorData::F8E5M2(_) => {
            let f = t.cast(DType::F32);
            let v = f.as_slice::<f32>().unwrap_or(&[]);
            return enc(s, v).map(|b| (b, NpyStored::AsF32)).map_err(|e| e.to_string());
        }
    };
    out.map(|b| (b, NpyStored::Exact)).map_err(|e| e.to_string())
}

/// Writes a tensor as a `.npy` file.
pub fn write_npy(path: &Path, t: &Tensor) -> Result<NpyStored, TensorFileError> {
    let (bytes, how) = npy_to_bytes(t).map_err(|m| err(path, format!("cannot encode: {m}")))?;
    std::fs::write(path, bytes).map_err(|e| err(path, format!("cannot write: {e}")))?;
    Ok(how)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(t: Tensor) {
        let (b, how) = npy_to_bytes(&t).unwrap();
        assert_eq!(how, NpyStored::Exact);
        assert_eq!(npy_from_bytes(&b).unwrap(), t);
    }

    #[test]
    fn npy_roundtrips_every_numpy_dtype() {
        roundtrip(Tensor::from_vec(vec![2, 3], vec![1.5f32, -2.0, 0.0, 3.25, f32::MAX, -0.5]).unwrap());
        roundtrip(Tensor::from_vec(vec![3], vec![1.5f64, -2.0, 1e300]).unwrap());
        roundtrip(Tensor::from_vec(vec![2], vec![half::f16::from_f32(1.5), half::f16::from_f32(-65504.0)]).unwrap());
        roundtrip(Tensor::from_vec(vec![2, 1], vec![i64::MIN, i64::MAX]).unwrap());
        roundtrip(Tensor::from_vec(vec![2], vec![-7i8, 7]).unwrap());
        roundtrip(Tensor::from_vec(vec![2], vec![-7i16, 7]).unwrap());
        roundtrip(Tensor::from_vec(vec![2], vec![-7i32, 7]).unwrap());
        roundtrip(Tensor::from_vec(vec![2], vec![0u8, 255]).unwrap());
        roundtrip(Tensor::from_vec(vec![2], vec![0u16, 65535]).unwrap());
        roundtrip(Tensor::from_vec(vec![1], vec![u32::MAX]).unwrap());
        roundtrip(Tensor::from_vec(vec![1], vec![u64::MAX]).unwrap());
        roundtrip(Tensor::from_vec(vec![3], vec![true, false, true]).unwrap());
        roundtrip(Tensor::from_vec(vec![], vec![42.0f32]).unwrap());
        roundtrip(Tensor::from_vec(vec![0, 4], Vec::<f32>::new()).unwrap());
    }

    #[test]
    fn bf16_is_written_as_f32() {
        let t = Tensor::from_vec(vec![2], vec![half::bf16::from_f32(1.5), half::bf16::from_f32(-3.0)]).unwrap();
        let (b, how) = npy_to_bytes(&t).unwrap();
        assert_eq!(how, NpyStored::AsF32);
        assert_eq!(npy_from_bytes(&b).unwrap(), Tensor::from_vec(vec![2], vec![1.5f32, -3.0]).unwrap());
    }

    #[test]
    fn npy_rejects_bad_bytes() {
        let t = Tensor::from_vec(vec![4, 4], vec![1.0f32; 16]).unwrap();
        let (b, _) = npy_to_bytes(&t).unwrap();
        let e = npy_from_bytes(&b[..b.len() - 3]).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        let e = npy_from_bytes(&b[..20]).unwrap_err();
        assert!(e.contains("header"), "{e}");
        let e = npy_from_bytes(b"hello world").unwrap_err();
        assert!(e.contains("not a .npy"), "{e}");
    }

    #[test]
    fn pb_roundtrips() {
        use prost::Message;
        let t = Tensor::from_vec(vec![2, 2], vec![1i32, 2, 3, 4]).unwrap();
        let bytes = tilec_onnx::tensor::tensor_to_proto("x", &t).encode_to_vec();
        assert_eq!(pb_from_bytes(&bytes).unwrap(), t);
        assert!(pb_from_bytes(&[0xff; 7]).is_err());
    }
}
