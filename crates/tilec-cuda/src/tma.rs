//! Tensor maps for the Hopper bulk tensor copy engine (TMA), encoded on the host through the
//! driver (`cuTensorMapEncodeTiled`) and passed to kernels by value as a
//! `const __grid_constant__` parameter.

use std::ffi::c_void;

use cudarc::driver::sys;

use crate::driver::check;
use crate::error::{CudaError, Result};

/// Element type of a tensor map.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TmaDType {
    F16,
    BF16,
    F32,
    /// Bytes: fp8 operands (the copy engine moves bits; the consumer gives them a format).
    U8,
}

impl TmaDType {
    pub fn size_bytes(self) -> usize {
        match self {
            TmaDType::U8 => 1,
            TmaDType::F16 | TmaDType::BF16 => 2,
            TmaDType::F32 => 4,
        }
    }
    fn raw(self) -> sys::CUtensorMapDataType {
        use sys::CUtensorMapDataType as D;
        match self {
            TmaDType::F16 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            TmaDType::BF16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            TmaDType::F32 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            TmaDType::U8 => D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        }
    }
}

/// Shared-memory swizzle of the boxes a tensor map loads.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TmaSwizzle {
    None,
    B32,
    B64,
    B128,
}

impl TmaSwizzle {
    /// The widest inner box row, in bytes, the swizzle allows (none: no limit but 256 elements).
    pub fn max_inner_bytes(self) -> usize {
        match self {
            TmaSwizzle::None => usize::MAX,
            TmaSwizzle::B32 => 32,
            TmaSwizzle::B64 => 64,
            TmaSwizzle::B128 => 128,
        }
    }
    fn raw(self) -> sys::CUtensorMapSwizzle {
        use sys::CUtensorMapSwizzle as S;
        match self {
            TmaSwizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
            TmaSwizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
            TmaSwizzle::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
            TmaSwizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// An encoded tensor map: 128 opaque bytes, 128-byte aligned (the CUDA 13 declaration).
#[repr(C, align(128))]
#[derive(Copy, Clone)]
pub struct TensorMap {
    raw: sys::CUtensorMap,
}

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorMap(..)")
    }
}

/// A tiled tensor map's description: `dims[0]` is the contiguous dimension; `strides[i]` is the
/// byte stride of dimension `i + 1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TiledMap {
    pub dtype: TmaDType,
    pub address: u64,
    pub dims: Vec<u64>,
    pub strides: Vec<u64>,
    pub box_dims: Vec<u32>,
    pub swizzle: TmaSwizzle,
}

impl TiledMap {
    /// Checks the rules the driver enforces, with a message saying which one failed.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let rank = self.dims.len();
        if !(1..=5).contains(&rank) {
            return Err(format!("tensor map rank {rank} (1 to 5)"));
        }
        if self.strides.len() + 1 != rank || self.box_dims.len() != rank {
            return Err("tensor map: strides must have rank - 1 entries, box dims rank".into());
        }
        if self.address % 16 != 0 {
            return Err(format!(
                "tensor map: address {:#x} is not 16-byte aligned",
                self.address
            ));
        }
        if let Some(d) = self.dims.iter().find(|&&d| d == 0 || d > 1 << 32) {
            return Err(format!("tensor map: dimension {d} outside 1..=2^32"));
        }
        if let Some(s) = self.strides.iter().find(|&&s| s % 16 != 0 || s >= 1 << 40) {
            return Err(format!(
                "tensor map: stride of {s} bytes is not a multiple of 16 below 2^40"
            ));
        }
        if let Some(b) = self.box_dims.iter().find(|&&b| b == 0 || b > 256) {
            return Err(format!("tensor map: box dimension {b} outside 1..=256"));
        }
        let inner = self.box_dims[0] as usize * self.dtype.size_bytes();
        if inner % 16 != 0 {
            return Err(format!(
                "tensor map: inner box row of {inner} bytes is not a multiple of 16"
            ));
        }
        if inner > self.swizzle.max_inner_bytes() {
            return Err(format!(
                "tensor map: inner box row of {inner} bytes exceeds the {:?} swizzle span",
                self.swizzle
            ));
        }
        Ok(())
    }

    /// Encodes the map through the driver (out-of-bounds elements of a box read as zero).
    pub fn encode(&self) -> Result<TensorMap> {
        self.validate().map_err(CudaError::Usage)?;
        let rank = self.dims.len();
        let elem_strides = vec![1u32; rank];
        // SAFETY: plain data; overwritten by the driver.
        let mut map = TensorMap {
            raw: unsafe { std::mem::zeroed() },
        };
        // SAFETY: every array has the lengths the rank implies (checked above); the address is
        // only recorded, not dereferenced, by the encoder.
        unsafe {
            check(
                sys::cuTensorMapEncodeTiled(
                    &mut map.raw,
                    self.dtype.raw(),
                    rank as u32,
                    self.address as *mut c_void,
                    self.dims.as_ptr(),
                    self.strides.as_ptr(),
                    self.box_dims.as_ptr(),
                    elem_strides.as_ptr(),
                    sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                    self.swizzle.raw(),
                    sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                ),
                "cuTensorMapEncodeTiled",
            )?;
        }
        Ok(map)
    }
}

/// An im2col tensor map over a channels-last 4-D input `[N][H][W][C]` for a convolution: each
/// copy brings `pixels` output positions (W fastest, then H, then images) times `channels`
/// channels of one filter tap, the padding read as zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Im2colMap {
    pub dtype: TmaDType,
    pub address: u64,
    /// (N, H, W, C) in elements, dense.
    pub dims: [u64; 4],
    /// The box of the window's top-left corner in (H, W): lower corner (minus the padding) and
    /// upper corner (the padding less the dilated window's extent less one).
    pub lower: [i32; 2],
    pub upper: [i32; 2],
    /// The traversal strides (the convolution's), (H, W).
    pub stride: [u32; 2],
    pub channels: u32,
    pub pixels: u32,
    pub swizzle: TmaSwizzle,
}

impl Im2colMap {
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.address % 16 != 0 {
            return Err(format!("im2col map: address {:#x} is not 16-byte aligned", self.address));
        }
        if self.dims.iter().any(|&d| d == 0 || d > 1 << 32) {
            return Err(format!("im2col map: dimensions {:?} outside 1..=2^32", self.dims));
        }
        let row = self.dims[3] * self.dtype.size_bytes() as u64;
        if row % 16 != 0 {
            return Err(format!("im2col map: a pixel of {row} bytes is not a multiple of 16"));
        }
        if self.lower.iter().chain(&self.upper).any(|&c| !(-128..=127).contains(&c)) {
            return Err(format!("im2col map: corners {:?} {:?} outside [-128, 127]", self.lower, self.upper));
        }
        if self.stride.iter().any(|&s| !(1..=8).contains(&s)) {
            return Err(format!("im2col map: traversal strides {:?} outside 1..=8", self.stride));
        }
        if !(1..=256).contains(&self.pixels) || !(1..=256).contains(&self.channels) {
            return Err(format!("im2col map: {} pixels of {} channels (1 to 256 each)", self.pixels, self.channels));
        }
        let inner = self.channels as usize * self.dtype.size_bytes();
        if inner % 16 != 0 || inner > self.swizzle.max_inner_bytes() {
            return Err(format!("im2col map: {inner} bytes of channels per pixel do not fit the {:?} swizzle", self.swizzle));
        }
        Ok(())
    }

    pub fn encode(&self) -> Result<TensorMap> {
        self.validate().map_err(CudaError::Usage)?;
        let [n, h, w, c] = self.dims;
        let es = self.dtype.size_bytes() as u64;
        // Innermost first: C, W, H, N.
        let dims = [c, w, h, n];
        let strides = [c * es, w * c * es, h * w * c * es];
        let lower = [self.lower[1], self.lower[0]];
        let upper = [self.upper[1], self.upper[0]];
        let elem_strides = [1u32, self.stride[1], self.stride[0], 1];
        // SAFETY: plain data; overwritten by the driver.
        let mut map = TensorMap { raw: unsafe { std::mem::zeroed() } };
        // SAFETY: the arrays have the lengths a 4-D map needs (4 dims and element strides, 3
        // strides, 2 corners each); the address is recorded, not dereferenced.
        unsafe {
            check(
                sys::cuTensorMapEncodeIm2col(
                    &mut map.raw,
                    self.dtype.raw(),
                    4,
                    self.address as *mut c_void,
                    dims.as_ptr(),
                    strides.as_ptr(),
                    lower.as_ptr(),
                    upper.as_ptr(),
                    self.channels,
                    self.pixels,
                    elem_strides.as_ptr(),
                    sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                    self.swizzle.raw(),
                    sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                ),
                "cuTensorMapEncodeIm2col",
            )?;
        }
        Ok(map)
    }
}

impl TensorMap {
    /// A pointer to the map's bytes, for a kernel parameter list.
    pub fn as_param(&self) -> *mut c_void {
        self as *const TensorMap as *mut c_void
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> TiledMap {
        TiledMap {
            dtype: TmaDType::BF16,
            address: 0x1000,
            dims: vec![4096, 1024, 1],
            strides: vec![8192, 8192 * 1024],
            box_dims: vec![64, 128, 1],
            swizzle: TmaSwizzle::B128,
        }
    }

    #[test]
    fn validation_names_the_broken_rule() {
        assert!(map().validate().is_ok());
        assert_eq!(std::mem::size_of::<TensorMap>(), 128);
        assert_eq!(std::mem::align_of::<TensorMap>(), 128);
        let mut m = map();
        m.strides[0] = 8190;
        assert!(m.validate().unwrap_err().contains("multiple of 16"));
        let mut m = map();
        m.box_dims[0] = 128;
        assert!(m.validate().unwrap_err().contains("swizzle"));
        let mut m = map();
        m.address = 0x1008;
        assert!(m.validate().unwrap_err().contains("aligned"));
        // 128 bytes of fp8 fill one 128-byte swizzle row; 256 do not.
        let mut m = map();
        m.dtype = TmaDType::U8;
        m.box_dims[0] = 128;
        assert!(m.validate().is_ok());
        m.box_dims[0] = 256;
        assert!(m.validate().unwrap_err().contains("swizzle"));
    }
}
