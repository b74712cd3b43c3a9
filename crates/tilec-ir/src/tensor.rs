//! Host tensors: a shape and a typed, contiguous row-major buffer. Constants in the graph
//! and the reference interpreter's values are both `Tensor`s.

use crate::fp8::{F8E4M3, F8E5M2};
use crate::DType;
use half::{bf16, f16};
use std::sync::Arc;

/// A typed contiguous buffer. Variants mirror [`DType`] one to one.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F64(Vec<f64>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
    F8E4M3(Vec<F8E4M3>),
    F8E5M2(Vec<F8E5M2>),
}

/// Runs `$body` with `$v` bound to the typed `Vec` inside a `TensorData` (by reference
/// or by value, depending on what `$data` is). Every arm must produce the same type.
#[macro_export]
macro_rules! dispatch {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::TensorData::F32($v) => $body,
            $crate::TensorData::F16($v) => $body,
            $crate::TensorData::BF16($v) => $body,
            $crate::TensorData::F64($v) => $body,
            $crate::TensorData::I8($v) => $body,
            $crate::TensorData::I16($v) => $body,
            $crate::TensorData::I32($v) => $body,
            $crate::TensorData::I64($v) => $body,
            $crate::TensorData::U8($v) => $body,
            $crate::TensorData::U16($v) => $body,
            $crate::TensorData::U32($v) => $body,
            $crate::TensorData::U64($v) => $body,
            $crate::TensorData::Bool($v) => $body,
            $crate::TensorData::F8E4M3($v) => $body,
            $crate::TensorData::F8E5M2($v) => $body,
        }
    };
}

/// A scalar element type of a tensor. `to_f64`/`from_f64` are exact for every type
/// except 64-bit integers beyond 2^53 (use `to_i64`/`from_i64` there).
pub trait Element: Copy + Default + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    /// Converts with the cast semantics of ONNX: floats round to nearest (saturating for
    /// fp8), integers truncate toward zero and wrap, bool is `x != 0`.
    fn from_f64(x: f64) -> Self;
    fn to_i64(self) -> i64 {
        self.to_f64() as i64
    }
    fn from_i64(x: i64) -> Self {
        Self::from_f64(x as f64)
    }
    fn slice(d: &TensorData) -> Option<&[Self]>;
    fn slice_mut(d: &mut TensorData) -> Option<&mut Vec<Self>>;
    fn wrap(v: Vec<Self>) -> TensorData;
}

macro_rules! float_elem {
    ($t:ty, $var:ident, $dt:expr, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(x: f64) -> Self {
                ($from)(x)
            }
            fn slice(d: &TensorData) -> Option<&[Self]> {
                if let TensorData::$var(v) = d { Some(v) } else { None }
            }
            fn slice_mut(d: &mut TensorData) -> Option<&mut Vec<Self>> {
                if let TensorData::$var(v) = d { Some(v) } else { None }
            }
            fn wrap(v: Vec<Self>) -> TensorData {
                TensorData::$var(v)
            }
        }
    };
}

float_elem!(f32, F32, DType::F32, |x: f32| x as f64, |x: f64| x as f32);
float_elem!(f64, F64, DType::F64, |x: f64| x, |x: f64| x);
float_elem!(f16, F16, DType::F16, |x: f16| x.to_f64(), f16::from_f64);
float_elem!(bf16, BF16, DType::BF16, |x: bf16| x.to_f64(), bf16::from_f64);
float_elem!(F8E4M3, F8E4M3, DType::F8E4M3, |x: F8E4M3| x.to_f64(), |x| F8E4M3::from_f64(x, true));
float_elem!(F8E5M2, F8E5M2, DType::F8E5M2, |x: F8E5M2| x.to_f64(), |x| F8E5M2::from_f64(x, true));

macro_rules! int_elem {
    ($t:ty, $var:ident, $dt:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(x: f64) -> Self {
                // Truncate toward zero, then wrap like a C cast through i128.
                if x.is_nan() {
                    0
                } else {
                    (x.trunc() as i128) as $t
                }
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn from_i64(x: i64) -> Self {
                x as $t
            }
            fn slice(d: &TensorData) -> Option<&[Self]> {
                if let TensorData::$var(v) = d { Some(v) } else { None }
            }
            fn slice_mut(d: &mut TensorData) -> Option<&mut Vec<Self>> {
                if let TensorData::$var(v) = d { Some(v) } else { None }
            }
            fn wrap(v: Vec<Self>) -> TensorData {
                TensorData::$var(v)
            }
        }
    };
}

int_elem!(i8, I8, DType::I8);
int_elem!(i16, I16, DType::I16);
int_elem!(i32, I32, DType::I32);
int_elem!(i64, I64, DType::I64);
int_elem!(u8, U8, DType::U8);
int_elem!(u16, U16, DType::U16);
int_elem!(u32, U32, DType::U32);
int_elem!(u64, U64, DType::U64);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(x: f64) -> Self {
        x != 0.0
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(x: i64) -> Self {
        x != 0
    }
    fn slice(d: &TensorData) -> Option<&[Self]> {
        if let TensorData::Bool(v) = d { Some(v) } else { None }
    }
    fn slice_mut(d: &mut TensorData) -> Option<&mut Vec<Self>> {
        if let TensorData::Bool(v) = d { Some(v) } else { None }
    }
    fn wrap(v: Vec<Self>) -> TensorData {
        TensorData::Bool(v)
    }
}

impl TensorData {
    pub fn dtype(&self) -> DType {
        fn dt<T: Element>(_: &[T]) -> DType {
            T::DTYPE
        }
        dispatch!(self, v => dt(v))
    }

    pub fn len(&self) -> usize {
        dispatch!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A buffer of `n` zeros (false for bool).
    pub fn zeros(dtype: DType, n: usize) -> TensorData {
        with_dtype_fn(dtype, n, Z)
    }
}

/// Calls a generic function chosen by dtype. Use [`crate::dispatch_dtype`] when you need
/// a closure; this trait form keeps generic code short in library crates.
pub trait DTypeFn<A, R> {
    fn call<T: Element>(&self, a: A) -> R;
}

struct Z;
impl DTypeFn<usize, TensorData> for Z {
    fn call<T: Element>(&self, n: usize) -> TensorData {
        T::wrap(vec![T::default(); n])
    }
}

struct TryZ;
impl DTypeFn<usize, Result<TensorData, String>> for TryZ {
    fn call<T: Element>(&self, n: usize) -> Result<TensorData, String> {
        crate::size::try_filled(n, T::default()).map(T::wrap)
    }
}

/// Runs `f::<T>` for the element type `T` of `dtype`.
pub fn with_dtype_fn<A, R, F: DTypeFn<A, R>>(dtype: DType, a: A, f: F) -> R {
    match dtype {
        DType::F32 => f.call::<f32>(a),
        DType::F16 => f.call::<f16>(a),
        DType::BF16 => f.call::<bf16>(a),
        DType::F64 => f.call::<f64>(a),
        DType::I8 => f.call::<i8>(a),
        DType::I16 => f.call::<i16>(a),
        DType::I32 => f.call::<i32>(a),
        DType::I64 => f.call::<i64>(a),
        DType::U8 => f.call::<u8>(a),
        DType::U16 => f.call::<u16>(a),
        DType::U32 => f.call::<u32>(a),
        DType::U64 => f.call::<u64>(a),
        DType::Bool => f.call::<bool>(a),
        DType::F8E4M3 => f.call::<F8E4M3>(a),
        DType::F8E5M2 => f.call::<F8E5M2>(a),
    }
}

/// A host tensor: row-major, contiguous. The buffer is shared between clones and copied on
/// the first write through [`Tensor::data_mut`] (copy on write): cloning a graph, or a
/// constant into an evaluation, costs no copy of its weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Arc<TensorData>,
}

/// Error building a tensor whose buffer length does not match its shape (`expected` is
/// `usize::MAX` when the shape's element count overflows).
#[derive(Debug, Clone, thiserror::Error)]
#[error("tensor of shape {shape:?} needs {} elements, buffer has {actual}", Self::needs(*.expected))]
pub struct TensorSizeError {
    pub shape: Vec<usize>,
    pub expected: usize,
    pub actual: usize,
}

impl TensorSizeError {
    fn needs(expected: usize) -> String {
        if expected == usize::MAX {
            "more than addressable".to_string()
        } else {
            expected.to_string()
        }
    }

    /// Checks that `shape` holds exactly `actual` elements.
    fn check(shape: Vec<usize>, actual: usize) -> Result<Vec<usize>, TensorSizeError> {
        match crate::size::numel(&shape) {
            Ok(n) if n == actual => Ok(shape),
            Ok(expected) => Err(TensorSizeError { shape, expected, actual }),
            Err(_) => Err(TensorSizeError { shape, expected: usize::MAX, actual }),
        }
    }
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<Tensor, TensorSizeError> {
        let shape = TensorSizeError::check(shape, data.len())?;
        Ok(Tensor { shape, data: Arc::new(data) })
    }

    pub fn from_vec<T: Element>(shape: Vec<usize>, v: Vec<T>) -> Result<Tensor, TensorSizeError> {
        Tensor::new(shape, T::wrap(v))
    }

    pub fn scalar<T: Element>(x: T) -> Tensor {
        Tensor { shape: vec![], data: Arc::new(T::wrap(vec![x])) }
    }

    /// Zeros of a small shape the caller controls (use [`Tensor::try_zeros`] for a shape
    /// that comes from a model or its inputs).
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor { shape, data: Arc::new(TensorData::zeros(dtype, n)) }
    }

    /// Zeros of any shape: an error, not an abort, when the shape is not addressable or
    /// the memory cannot be allocated.
    pub fn try_zeros(dtype: DType, shape: Vec<usize>) -> Result<Tensor, String> {
        crate::size::byte_size(dtype, &shape).map_err(|e| e.to_string())?;
        let n = crate::size::numel(&shape).map_err(|e| e.to_string())?;
        Ok(Tensor { shape, data: Arc::new(with_dtype_fn(dtype, n, TryZ)?) })
    }

    /// Converts `values` to `dtype` with [`Element::from_f64`] semantics.
    pub fn from_f64s(dtype: DType, shape: Vec<usize>, values: &[f64]) -> Result<Tensor, TensorSizeError> {
        struct F<'a>(&'a [f64]);
        impl DTypeFn<(), TensorData> for F<'_> {
            fn call<T: Element>(&self, _: ()) -> TensorData {
                T::wrap(self.0.iter().map(|&x| T::from_f64(x)).collect())
            }
        }
        Tensor::new(shape, with_dtype_fn(dtype, (), F(values)))
    }

    /// Converts `values` to `dtype` with [`Element::from_i64`] semantics.
    pub fn from_i64s(dtype: DType, shape: Vec<usize>, values: &[i64]) -> Result<Tensor, TensorSizeError> {
        struct F<'a>(&'a [i64]);
        impl DTypeFn<(), TensorData> for F<'_> {
            fn call<T: Element>(&self, _: ()) -> TensorData {
                T::wrap(self.0.iter().map(|&x| T::from_i64(x)).collect())
            }
        }
        Tensor::new(shape, with_dtype_fn(dtype, (), F(values)))
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// The buffer, for writing: copied first when another clone shares it.
    pub fn data_mut(&mut self) -> &mut TensorData {
        Arc::make_mut(&mut self.data)
    }

    /// Whether `self` and `other` share one buffer (a clone not written since).
    pub fn shares_data(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
    }

    pub fn into_parts(self) -> (Vec<usize>, TensorData) {
        let data = Arc::try_unwrap(self.data).unwrap_or_else(|shared| (*shared).clone());
        (self.shape, data)
    }

    pub fn numel(&self) -> usize {
        self.data.len()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn tensor_type(&self) -> crate::TensorType {
        crate::TensorType::fixed(self.dtype(), &self.shape)
    }

    /// The typed elements, if `T` is this tensor's element type.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        T::slice(&self.data)
    }

    pub fn to_f64_vec(&self) -> Vec<f64> {
        dispatch!(&*self.data, v => v.iter().map(|x| x.to_f64()).collect())
    }

    pub fn to_i64_vec(&self) -> Vec<i64> {
        dispatch!(&*self.data, v => v.iter().map(|x| x.to_i64()).collect())
    }

    /// Same data, new shape with the same element count.
    pub fn reshaped(mut self, shape: Vec<usize>) -> Result<Tensor, TensorSizeError> {
        self.shape = TensorSizeError::check(shape, self.data.len())?;
        Ok(self)
    }

    /// Converts to another dtype with ONNX Cast semantics (saturating for fp8).
    pub fn cast(&self, dtype: DType) -> Tensor {
        if dtype == self.dtype() {
            return self.clone();
        }
        let data = if self.dtype().is_int() || self.dtype().is_bool() {
            let v = self.to_i64_vec();
            if dtype.is_float() {
                // i64 → float goes through f64 (exact below 2^53, correctly rounded above).
                let f: Vec<f64> = v.iter().map(|&x| x as f64).collect();
                Tensor::from_f64s(dtype, vec![f.len()], &f).map(|t| t.data)
            } else {
                Tensor::from_i64s(dtype, vec![v.len()], &v).map(|t| t.data)
            }
        } else {
            let v = self.to_f64_vec();
            Tensor::from_f64s(dtype, vec![v.len()], &v).map(|t| t.data)
        };
        // Lengths match by construction.
        Tensor { shape: self.shape.clone(), data: data.unwrap_or_else(|_| Arc::new(TensorData::zeros(dtype, 0))) }
    }

    /// Raw little-endian bytes of the elements (fp8 as their bit patterns, bool as 0/1).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.numel() * self.dtype().size_bytes()];
        self.write_le_bytes(&mut out);
        out
    }

    /// The elements' little-endian bytes (as [`Tensor::to_le_bytes`]): on a little-endian
    /// host the buffer itself, borrowed (uploading weights copies nothing on the host).
    pub fn le_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        #[cfg(target_endian = "little")]
        {
            fn bytes<T: Element>(v: &[T]) -> &[u8] {
                // SAFETY: every element type is plain data whose memory is its little-endian
                // encoding on this host: integers and floats (`half`'s types are transparent
                // over u16), bool (one byte, 0 or 1) and the fp8 types (transparent over u8).
                unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
            }
            std::borrow::Cow::Borrowed(dispatch!(&*self.data, v => bytes(v)))
        }
        #[cfg(not(target_endian = "little"))]
        std::borrow::Cow::Owned(self.to_le_bytes())
    }

    /// Writes the elements' little-endian bytes (as [`Tensor::to_le_bytes`]) into the front of
    /// `out`, without an intermediate buffer; returns the number of bytes written, which is
    /// less than the tensor's size only when `out` is too short (then `out` is filled).
    pub fn write_le_bytes(&self, out: &mut [u8]) -> usize {
        macro_rules! le {
            ($v:expr, $w:expr, $f:expr) => {{
                let mut n = 0;
                for (c, x) in out.chunks_exact_mut($w).zip($v.iter()) {
                    c.copy_from_slice(&$f(x));
                    n += $w;
                }
                n
            }};
        }
        match &*self.data {
            TensorData::F32(v) => le!(v, 4, |x: &f32| x.to_le_bytes()),
            TensorData::F16(v) => le!(v, 2, |x: &f16| x.to_le_bytes()),
            TensorData::BF16(v) => le!(v, 2, |x: &bf16| x.to_le_bytes()),
            TensorData::F64(v) => le!(v, 8, |x: &f64| x.to_le_bytes()),
            TensorData::I8(v) => le!(v, 1, |x: &i8| x.to_le_bytes()),
            TensorData::I16(v) => le!(v, 2, |x: &i16| x.to_le_bytes()),
            TensorData::I32(v) => le!(v, 4, |x: &i32| x.to_le_bytes()),
            TensorData::I64(v) => le!(v, 8, |x: &i64| x.to_le_bytes()),
            TensorData::U8(v) => le!(v, 1, |x: &u8| [*x]),
            TensorData::U16(v) => le!(v, 2, |x: &u16| x.to_le_bytes()),
            TensorData::U32(v) => le!(v, 4, |x: &u32| x.to_le_bytes()),
            TensorData::U64(v) => le!(v, 8, |x: &u64| x.to_le_bytes()),
            TensorData::Bool(v) => le!(v, 1, |x: &bool| [*x as u8]),
            TensorData::F8E4M3(v) => le!(v, 1, |x: &F8E4M3| [x.0]),
            TensorData::F8E5M2(v) => le!(v, 1, |x: &F8E5M2| [x.0]),
        }
    }

    /// Builds a tensor from raw little-endian bytes. Errors when the byte count does not
    /// match the shape.
    pub fn from_le_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Tensor, TensorSizeError> {
        let sz = dtype.size_bytes();
        if bytes.len() % sz.max(1) != 0 {
            let expected = crate::size::numel(&shape).unwrap_or(usize::MAX);
            return Err(TensorSizeError { shape, expected, actual: bytes.len() / sz.max(1) });
        }
        let shape = TensorSizeError::check(shape, bytes.len() / sz.max(1))?;
        macro_rules! le {
            ($t:ty, $w:expr) => {
                bytes
                    .chunks_exact($w)
                    .map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or([0; $w])))
                    .collect()
            };
        }
        let data = match dtype {
            DType::F32 => TensorData::F32(le!(f32, 4)),
            DType::F16 => TensorData::F16(le!(f16, 2)),
            DType::BF16 => TensorData::BF16(le!(bf16, 2)),
            DType::F64 => TensorData::F64(le!(f64, 8)),
            DType::I8 => TensorData::I8(bytes.iter().map(|&b| b as i8).collect()),
            DType::I16 => TensorData::I16(le!(i16, 2)),
            DType::I32 => TensorData::I32(le!(i32, 4)),
            DType::I64 => TensorData::I64(le!(i64, 8)),
            DType::U8 => TensorData::U8(bytes.to_vec()),
            DType::U16 => TensorData::U16(le!(u16, 2)),
            DType::U32 => TensorData::U32(le!(u32, 4)),
            DType::U64 => TensorData::U64(le!(u64, 8)),
            DType::Bool => TensorData::Bool(bytes.iter().map(|&b| b != 0).collect()),
            DType::F8E4M3 => TensorData::F8E4M3(bytes.iter().map(|&b| F8E4M3(b)).collect()),
            DType::F8E5M2 => TensorData::F8E5M2(bytes.iter().map(|&b| F8E5M2(b)).collect()),
        };
        Tensor::new(shape, data)
    }
}

/// Row-major strides of a shape, in elements.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_every_dtype() {
        for &dt in DType::ALL.iter() {
            let vals = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
            let t = Tensor::from_f64s(dt, vec![2, 3], &vals).unwrap();
            let b = t.to_le_bytes();
            assert_eq!(b.len(), 6 * dt.size_bytes());
            let u = Tensor::from_le_bytes(dt, vec![2, 3], &b).unwrap();
            assert_eq!(t, u, "{dt}");
        }
    }

    #[test]
    fn clones_share_until_written() {
        let t = Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap();
        let mut u = t.clone();
        assert!(u.shares_data(&t));
        if let TensorData::F32(v) = u.data_mut() {
            v[1] = 7.0;
        }
        assert!(!u.shares_data(&t));
        assert_eq!(t.to_f64_vec(), vec![1.0, 2.0, 3.0]);
        assert_eq!(u.to_f64_vec(), vec![1.0, 7.0, 3.0]);
        let (_, d) = u.clone().into_parts();
        assert_eq!(d, TensorData::F32(vec![1.0, 7.0, 3.0]));
    }

    #[test]
    fn borrowed_bytes_equal_the_encoded_ones() {
        for &dt in DType::ALL.iter() {
            let t = Tensor::from_f64s(dt, vec![5], &[0.0, 1.0, -2.0, 3.5, 100.0]).unwrap();
            assert_eq!(&*t.le_bytes(), t.to_le_bytes().as_slice(), "{dt}");
        }
    }

    #[test]
    fn shape_mismatch_is_an_error() {
        assert!(Tensor::from_vec(vec![2, 2], vec![1.0f32; 3]).is_err());
        assert!(Tensor::from_le_bytes(DType::F32, vec![2], &[0u8; 7]).is_err());
    }

    #[test]
    fn cast_truncates_and_wraps() {
        let t = Tensor::from_vec(vec![3], vec![-1.7f32, 2.9, 300.0]).unwrap();
        assert_eq!(t.cast(DType::I32).to_i64_vec(), vec![-1, 2, 300]);
        assert_eq!(t.cast(DType::U8).to_i64_vec(), vec![255, 2, 44]);
        let big = Tensor::from_vec(vec![1], vec![i64::MAX]).unwrap();
        assert_eq!(big.cast(DType::I64).to_i64_vec(), vec![i64::MAX]);
    }
}
