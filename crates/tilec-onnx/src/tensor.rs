//! Conversion between ONNX tensors/types and tilec's [`Tensor`]/[`DType`].

use crate::proto::{tensor_proto::DataType, TensorProto};
use half::{bf16, f16};
use tilec_ir::{DType, Tensor, TensorData, F8E4M3, F8E5M2};

/// The tilec dtype of an ONNX element type, or `None` when tilec has no such dtype.
pub fn dtype_from_onnx(code: i32) -> Option<DType> {
    let dt = DataType::try_from(code).ok()?;
    Some(match dt {
        DataType::Float => DType::F32,
        DataType::Uint8 => DType::U8,
        DataType::Int8 => DType::I8,
        DataType::Uint16 => DType::U16,
        DataType::Int16 => DType::I16,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Bool => DType::Bool,
        DataType::Float16 => DType::F16,
        DataType::Double => DType::F64,
        DataType::Uint32 => DType::U32,
        DataType::Uint64 => DType::U64,
        DataType::Bfloat16 => DType::BF16,
        DataType::Float8e4m3fn => DType::F8E4M3,
        DataType::Float8e5m2 => DType::F8E5M2,
        _ => return None,
    })
}

pub fn dtype_to_onnx(dt: DType) -> i32 {
    (match dt {
        DType::F32 => DataType::Float,
        DType::U8 => DataType::Uint8,
        DType::I8 => DataType::Int8,
        DType::U16 => DataType::Uint16,
        DType::I16 => DataType::Int16,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::Bool => DataType::Bool,
        DType::F16 => DataType::Float16,
        DType::F64 => DataType::Double,
        DType::U32 => DataType::Uint32,
        DType::U64 => DataType::Uint64,
        DType::BF16 => DataType::Bfloat16,
        DType::F8E4M3 => DataType::Float8e4m3fn,
        DType::F8E5M2 => DataType::Float8e5m2,
    }) as i32
}

/// Name of an ONNX element type code for messages (`FLOAT`, `STRING`, `INT4`, ...).
pub fn onnx_type_name(code: i32) -> String {
    match DataType::try_from(code) {
        Ok(dt) => format!("{dt:?}").to_uppercase(),
        Err(_) => format!("unknown type code {code}"),
    }
}

/// Decodes a TensorProto (raw_data or the typed fields) into a [`Tensor`]. External data
/// must have been resolved by the loader first.
pub fn tensor_from_proto(t: &TensorProto) -> Result<Tensor, String> {
    let what = if t.name.is_empty() { "tensor".to_string() } else { format!("tensor '{}'", t.name) };
    let dt = dtype_from_onnx(t.data_type)
        .ok_or_else(|| format!("{what}: element type {} is not supported", onnx_type_name(t.data_type)))?;
    if t.data_location == 1 {
        return Err(format!("{what}: external data was not loaded"));
    }
    if t.segment.is_some() {
        return Err(format!("{what}: segmented tensors are not supported"));
    }
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(format!("{what}: negative dimension {d}"));
        }
        shape.push(d as usize);
    }
    let need = tilec_ir::size::byte_size(dt, &shape).map_err(|e| format!("{what}: {e}"))?;
    let n = need / dt.size_bytes().max(1);
    if !t.raw_data.is_empty() || n == 0 && t.float_data.is_empty() && t.int32_data.is_empty() && t.int64_data.is_empty() && t.double_data.is_empty() && t.uint64_data.is_empty() {
        if t.raw_data.len() != need {
            return Err(format!("{what}: raw data has {} bytes, shape {:?} of {} needs {}", t.raw_data.len(), shape, dt, need));
        }
        return Tensor::from_le_bytes(dt, shape, &t.raw_data).map_err(|e| format!("{what}: {e}"));
    }
    let check = |len: usize| {
        if len != n {
            Err(format!("{what}: has {len} values, shape {shape:?} needs {n}"))
        } else {
            Ok(())
        }
    };
    let data = match dt {
        DType::F32 => {
            check(t.float_data.len())?;
            TensorData::F32(t.float_data.clone())
        }
        DType::F64 => {
            check(t.double_data.len())?;
            TensorData::F64(t.double_data.clone())
        }
        DType::I64 => {
            check(t.int64_data.len())?;
            TensorData::I64(t.int64_data.clone())
        }
        DType::U32 | DType::U64 => {
            check(t.uint64_data.len())?;
            if dt == DType::U32 {
                TensorData::U32(t.uint64_data.iter().map(|&x| x as u32).collect())
            } else {
                TensorData::U64(t.uint64_data.clone())
            }
        }
        // Everything narrower is stored in int32_data (f16/bf16/fp8 as bit patterns).
        _ => {
            check(t.int32_data.len())?;
            let v = &t.int32_data;
            match dt {
                DType::I32 => TensorData::I32(v.clone()),
                DType::I16 => TensorData::I16(v.iter().map(|&x| x as i16).collect()),
                DType::I8 => TensorData::I8(v.iter().map(|&x| x as i8).collect()),
                DType::U16 => TensorData::U16(v.iter().map(|&x| x as u16).collect()),
                DType::U8 => TensorData::U8(v.iter().map(|&x| x as u8).collect()),
                DType::Bool => TensorData::Bool(v.iter().map(|&x| x != 0).collect()),
                DType::F16 => TensorData::F16(v.iter().map(|&x| f16::from_bits(x as u16)).collect()),
                DType::BF16 => TensorData::BF16(v.iter().map(|&x| bf16::from_bits(x as u16)).collect()),
                DType::F8E4M3 => TensorData::F8E4M3(v.iter().map(|&x| F8E4M3(x as u8)).collect()),
                DType::F8E5M2 => TensorData::F8E5M2(v.iter().map(|&x| F8E5M2(x as u8)).collect()),
                _ => return Err(format!("{what}: unexpected storage for {dt}")),
            }
        }
    };
    Tensor::new(shape, data).map_err(|e| format!("{what}: {e}"))
}

/// Encodes a tensor as a TensorProto with raw data.
pub fn tensor_to_proto(name: &str, t: &Tensor) -> TensorProto {
    TensorProto {
        name: name.to_string(),
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: dtype_to_onnx(t.dtype()),
        raw_data: t.to_le_bytes(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_round_trip_every_dtype() {
        for &dt in DType::ALL.iter() {
            let t = Tensor::from_f64s(dt, vec![2, 2], &[0.0, 1.0, 0.0, 1.0]).unwrap();
            let p = tensor_to_proto("t", &t);
            assert_eq!(tensor_from_proto(&p).unwrap(), t, "{dt}");
            assert_eq!(dtype_from_onnx(dtype_to_onnx(dt)), Some(dt));
        }
    }

    #[test]
    fn typed_fields_and_bad_sizes() {
        let p = TensorProto { dims: vec![3], data_type: 1, float_data: vec![1.0, 2.0, 3.0], ..Default::default() };
        assert_eq!(tensor_from_proto(&p).unwrap().to_f64_vec(), vec![1.0, 2.0, 3.0]);
        let p = TensorProto { dims: vec![4], data_type: 1, float_data: vec![1.0], ..Default::default() };
        assert!(tensor_from_proto(&p).unwrap_err().contains("needs 4"));
        let p = TensorProto { dims: vec![1], data_type: 8, ..Default::default() };
        assert!(tensor_from_proto(&p).unwrap_err().contains("STRING"));
    }
}
