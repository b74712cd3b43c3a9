//! Reading DLPack capsules: a NumPy array's or a PyTorch tensor's memory as a [`RawTensor`],
//! without a copy.
//!
//! The producer's `__dlpack__()` returns a capsule named `"dltensor"` over a `DLManagedTensor`.
//! tilec only borrows it: the capsule is kept alive (and not renamed) for as long as the
//! address is used, so its own destructor calls the producer's deleter afterwards. Only dense
//! row-major tensors are accepted; the Python layer makes others contiguous first.

use std::ffi::c_void;

use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use tilec::exec::{Memory, RawTensor};
use tilec::DType;

use crate::error::invalid;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;

/// The DLPack type code and bits of a dtype, and back.
fn dtype_of(code: u8, bits: u8) -> Option<DType> {
    Some(match (code, bits) {
        (0, 8) => DType::I8,
        (0, 16) => DType::I16,
        (0, 32) => DType::I32,
        (0, 64) => DType::I64,
        (1, 8) => DType::U8,
        (1, 16) => DType::U16,
        (1, 32) => DType::U32,
        (1, 64) => DType::U64,
        (2, 16) => DType::F16,
        (2, 32) => DType::F32,
        (2, 64) => DType::F64,
        (4, 16) => DType::BF16,
        (6, 8) => DType::Bool,
        _ => return None,
    })
}

/// NumPy's name of a dtype (PyTorch's without the `torch.` prefix), or tilec's for those
/// NumPy lacks.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::U16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        DType::F8E4M3 => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
    }
}

/// A tensor borrowed through DLPack: the capsule that keeps its memory alive, and the memory.
pub struct Borrowed {
    _capsule: Py<PyAny>,
    pub raw: RawTensor,
}

/// Borrows `obj`'s memory through its `__dlpack__` method (`what` names it in errors).
pub fn borrow(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Borrowed> {
    let capsule = obj
        .call_method0("__dlpack__")
        .map_err(|e| invalid(format!("{what}: not a tensor this package can read ({e}); give a NumPy array or a PyTorch tensor")))?;
    let cap = capsule
        .cast::<PyCapsule>()
        .map_err(|_| invalid(format!("{what}: __dlpack__ did not return a capsule")))?;
    // SAFETY: the capsule object is valid and the GIL is held; a wrong name yields null.
    let p = unsafe { pyo3::ffi::PyCapsule_GetPointer(cap.as_ptr(), c"dltensor".as_ptr()) } as *const DLTensor;
    if p.is_null() {
        // A consumed ("used_dltensor") or foreign capsule: clear the error PyCapsule set.
        let _ = PyErr::take(obj.py());
        return Err(invalid(format!("{what}: the DLPack capsule is not a fresh \"dltensor\"")));
    }
    // SAFETY: a "dltensor" capsule points to a DLManagedTensor, whose first field is the
    // DLTensor; it stays valid while the capsule lives (we hold it).
    let t = unsafe { &*p };
    let ndim = usize::try_from(t.ndim).map_err(|_| invalid(format!("{what}: negative rank {}", t.ndim)))?;
    let shape: Vec<usize> = if ndim == 0 {
        vec![]
    } else {
        // SAFETY: DLPack guarantees `ndim` shape entries.
        let s = unsafe { std::slice::from_raw_parts(t.shape, ndim) };
        s.iter()
            .map(|&d| usize::try_from(d).map_err(|_| invalid(format!("{what}: negative dimension {d}"))))
            .collect::<PyResult<_>>()?
    };
    if t.dtype.lanes != 1 {
        return Err(invalid(format!("{what}: vector dtypes ({} lanes) are not supported", t.dtype.lanes)));
    }
    let dtype = dtype_of(t.dtype.code, t.dtype.bits).ok_or_else(|| {
        invalid(format!("{what}: DLPack dtype code {} with {} bits is not supported", t.dtype.code, t.dtype.bits))
    })?;
    if !t.strides.is_null() && ndim > 0 {
        // SAFETY: non-null strides have `ndim` entries.
        let st = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut want = 1i64;
        for k in (0..ndim).rev() {
            // A dimension of size 1 may carry any stride.
            if shape[k] != 1 && st[k] != want {
                return Err(invalid(format!("{what}: not contiguous (strides {st:?} for shape {shape:?})")));
            }
            want = want.saturating_mul(shape[k] as i64);
        }
    }
    let memory = match t.device.device_type {
        KDL_CPU | KDL_CUDA_HOST => Memory::Host,
        KDL_CUDA => Memory::Device(t.device.device_id.max(0) as usize),
        d => return Err(invalid(format!("{what}: DLPack device type {d} is not supported (host or CUDA only)"))),
    };
    let addr = (t.data as u64).wrapping_add(t.byte_offset);
    Ok(Borrowed { _capsule: capsule.unbind(), raw: RawTensor { dtype, shape, addr, memory } })
}
