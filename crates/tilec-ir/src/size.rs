//! Checked size arithmetic: the one place where a shape becomes an element count or a byte
//! size.
//!
//! Shapes come from models and inputs, so their products can overflow. A shape is
//! *addressable* when the product of its non-zero dimensions, times the element size, is at
//! most `isize::MAX` bytes (the most Rust and C can index). Zero dimensions are left out on
//! purpose: `[0, 2^40, 2^40]` holds no elements, but its strides and the row counts of its
//! sub-shapes are still computed, and they must fit too. Every product of a subset of an
//! addressable shape's dimensions, and every element or byte offset into it, fits in an
//! `isize`; code downstream of a check may multiply freely.

use crate::{DType, ShapeFmt};
use std::fmt;

/// The largest number of bytes a tensor may occupy.
pub const MAX_BYTES: usize = isize::MAX as usize;

/// A shape that does not fit in memory, with what made it too large.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError {
    pub shape: Vec<usize>,
    pub dtype: Option<DType>,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.dtype {
            Some(d) => format!("a {d} tensor of shape {}", ShapeFmt(&self.shape)),
            None => format!("shape {}", ShapeFmt(&self.shape)),
        };
        write!(f, "{what} is too large: its size overflows the {MAX_BYTES}-byte limit")
    }
}

impl std::error::Error for SizeError {}

/// The product of the non-zero dimensions times `elem_bytes`, if it is at most
/// [`MAX_BYTES`].
fn extent(shape: &[usize], elem_bytes: usize) -> Option<usize> {
    let mut p = elem_bytes.max(1);
    for &d in shape {
        if d != 0 {
            p = p.checked_mul(d)?;
        }
    }
    (p <= MAX_BYTES).then_some(p)
}

/// The number of elements of `shape`, if the shape is addressable with one-byte elements.
pub fn numel(shape: &[usize]) -> Result<usize, SizeError> {
    extent(shape, 1).ok_or_else(|| SizeError { shape: shape.to_vec(), dtype: None })?;
    Ok(if shape.contains(&0) { 0 } else { shape.iter().product() })
}

/// The number of bytes of a `dtype` tensor of `shape`, if it is addressable.
pub fn byte_size(dtype: DType, shape: &[usize]) -> Result<usize, SizeError> {
    extent(shape, dtype.size_bytes()).ok_or_else(|| SizeError { shape: shape.to_vec(), dtype: Some(dtype) })?;
    Ok(if shape.contains(&0) { 0 } else { shape.iter().product::<usize>() * dtype.size_bytes() })
}

/// Checks that the fixed dimensions of a type are addressable (symbolic ones are checked
/// when they get their values): a `[batch, 2^62, 8]` can never exist.
pub fn check_type(ty: &crate::TensorType) -> Result<(), SizeError> {
    let fixed: Vec<usize> = ty.shape.iter().filter_map(|d| d.fixed()).collect();
    byte_size(ty.dtype, &fixed).map_err(|_| SizeError {
        shape: ty.shape.iter().map(|d| d.fixed().unwrap_or(1)).collect(),
        dtype: Some(ty.dtype),
    })?;
    Ok(())
}

/// An empty vector with room for `n` elements, or an error instead of an abort when the
/// memory cannot be had. For buffers whose size comes from a model or its inputs.
pub fn try_with_capacity<T>(n: usize) -> Result<Vec<T>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        format!("cannot allocate {n} elements of {} bytes: out of memory", std::mem::size_of::<T>())
    })?;
    Ok(v)
}

/// A vector of `n` copies of `x` (see [`try_with_capacity`]).
pub fn try_filled<T: Clone>(n: usize, x: T) -> Result<Vec<T>, String> {
    let mut v = try_with_capacity(n)?;
    v.resize(n, x);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The definition, computed in 128 bits: the running product is at most 2^63 before
    /// each multiplication by a factor below 2^64, so it never wraps.
    fn exact(shape: &[usize], elem: usize) -> Option<(u128, u128)> {
        let mut nonzero: u128 = elem as u128;
        for &d in shape.iter().filter(|&&d| d != 0) {
            nonzero *= d as u128;
            if nonzero > MAX_BYTES as u128 {
                return None;
            }
        }
        let numel: u128 = if shape.contains(&0) { 0 } else { nonzero / elem as u128 };
        Some((numel, numel * elem as u128))
    }

    #[test]
    fn matches_exact_arithmetic_on_random_shapes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let dtypes = [DType::Bool, DType::F16, DType::F32, DType::I64];
        for _ in 0..200_000 {
            let rank = rng.gen_range(0..6);
            let shape: Vec<usize> = (0..rank)
                .map(|_| match rng.gen_range(0..6) {
                    0 => 0,
                    1 => 1,
                    2 => rng.gen_range(2..64),
                    3 => 1usize << rng.gen_range(0..64),
                    4 => (1usize << rng.gen_range(0..63)) + rng.gen_range(0..3),
                    _ => rng.gen::<usize>() >> rng.gen_range(0..64),
                })
                .collect();
            let dt = dtypes[rng.gen_range(0..dtypes.len())];
            let want = exact(&shape, dt.size_bytes());
            let got = byte_size(dt, &shape).ok();
            assert_eq!(got.map(|b| b as u128), want.map(|w| w.1), "{dt} {shape:?}");
            assert_eq!(numel(&shape).ok().map(|n| n as u128), exact(&shape, 1).map(|w| w.0), "{shape:?}");
        }
    }

    #[test]
    fn rejects_the_shapes_that_wrap() {
        for s in [[1usize << 31, 1 << 31], [(1 << 62) + 1, 4], [1 << 61, 8]] {
            assert!(byte_size(DType::F32, &s).is_err(), "{s:?}");
        }
        assert!(numel(&[0, 1 << 40, 1 << 40]).is_err());
        assert_eq!(numel(&[0, 1 << 20, 1 << 20]), Ok(0));
        assert_eq!(byte_size(DType::F64, &[3, 5]), Ok(120));
        let e = byte_size(DType::F32, &[1 << 31, 1 << 31]).unwrap_err().to_string();
        assert!(e.contains("f32 tensor of shape [2147483648, 2147483648] is too large"), "{e}");
    }

    #[test]
    fn try_filled_reports_what_cannot_be_allocated() {
        assert_eq!(try_filled(3, 7u8), Ok(vec![7, 7, 7]));
        assert!(try_filled(usize::MAX / 2, 0u64).unwrap_err().contains("out of memory"));
    }
}
