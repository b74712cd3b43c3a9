//! The arena a [`MemoryPlan`](crate::MemoryPlan) is laid out in: one owned, zeroed,
//! 64-byte aligned allocation.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of an arena's base address, in bytes (a cache line; enough for AVX-512).
pub const ARENA_ALIGN: usize = 64;

/// Why an arena could not be made or a view into it taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArenaError {
    #[error("arena of {bytes} bytes is too large to allocate")]
    TooLarge { bytes: usize },
    #[error("allocation of {bytes} bytes failed")]
    AllocFailed { bytes: usize },
    #[error("bytes [{offset}, {offset}+{len}) are outside the arena of {size} bytes")]
    OutOfRange {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("offset {offset} is not aligned for {type_name} (alignment {align})")]
    Misaligned {
        offset: usize,
        align: usize,
        type_name: &'static str,
    },
}

/// An owned, zeroed allocation of `len` bytes whose base address is a multiple of
/// [`ARENA_ALIGN`]. Kernels receive raw pointers into it ([`Arena::ptr`]); safe code reads
/// and writes it through bounds-checked slices.
pub struct Arena {
    ptr: NonNull<u8>,
    len: usize,
    /// Size of the allocation (at least one alignment unit, so that no zero-sized
    /// allocation is ever requested).
    cap: usize,
}

// The arena owns its memory exclusively; raw pointers handed out are the caller's to
// synchronize, as with any buffer passed to foreign code.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Arena {
    /// Allocates `bytes` zeroed bytes.
    pub fn new(bytes: usize) -> Result<Arena, ArenaError> {
        let cap = bytes
            .max(1)
            .checked_next_multiple_of(ARENA_ALIGN)
            .ok_or(ArenaError::TooLarge { bytes })?;
        let layout = Layout::from_size_align(cap, ARENA_ALIGN)
            .map_err(|_| ArenaError::TooLarge { bytes })?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(ArenaError::AllocFailed { bytes })?;
        Ok(Arena {
            ptr,
            len: bytes,
            cap,
        })
    }

    /// Size in bytes, as requested.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of byte `offset`, for passing to a kernel. `offset == len()` (one past
    /// the end) is allowed; a larger offset is an error.
    pub fn try_ptr(&self, offset: usize) -> Result<*mut u8, ArenaError> {
        if offset > self.len {
            return Err(ArenaError::OutOfRange {
                offset,
                len: 0,
                size: self.len,
            });
        }
        // SAFETY: `offset <= len <= cap`, inside (or one past) the allocation.
        Ok(unsafe { self.ptr.as_ptr().add(offset) })
    }

    /// The address of byte `offset`, for passing to a kernel.
    ///
    /// # Panics
    /// If `offset > len()`: offsets come from a [`MemoryPlan`](crate::MemoryPlan) that fits
    /// the arena, so this is a bug in the caller. Use [`Arena::try_ptr`] to get an error.
    pub fn ptr(&self, offset: usize) -> *mut u8 {
        match self.try_ptr(offset) {
            Ok(p) => p,
            Err(e) => panic!("Arena::ptr: {e}"),
        }
    }

    /// The whole arena as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `len` initialized (zeroed) bytes owned by `self`, borrowed immutably.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole arena as mutable bytes.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// `len` bytes from `offset`.
    pub fn bytes(&self, offset: usize, len: usize) -> Result<&[u8], ArenaError> {
        let end = self.range_end(offset, len)?;
        Ok(&self.as_bytes()[offset..end])
    }

    /// `len` bytes from `offset`, mutable.
    pub fn bytes_mut(&mut self, offset: usize, len: usize) -> Result<&mut [u8], ArenaError> {
        let end = self.range_end(offset, len)?;
        Ok(&mut self.as_bytes_mut()[offset..end])
    }

    /// `count` f32 values from `offset` (which must be 4-byte aligned).
    pub fn f32s(&self, offset: usize, count: usize) -> Result<&[f32], ArenaError> {
        let bytes = count.checked_mul(4).ok_or(ArenaError::OutOfRange {
            offset,
            len: usize::MAX,
            size: self.len,
        })?;
        self.range_end(offset, bytes)?;
        self.check_align::<f32>(offset)?;
        // SAFETY: in range, aligned, and every bit pattern is a valid f32.
        Ok(unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(offset) as *const f32, count)
        })
    }

    /// `count` f32 values from `offset` (which must be 4-byte aligned), mutable.
    pub fn f32s_mut(&mut self, offset: usize, count: usize) -> Result<&mut [f32], ArenaError> {
        let bytes = count.checked_mul(4).ok_or(ArenaError::OutOfRange {
            offset,
            len: usize::MAX,
            size: self.len,
        })?;
        self.range_end(offset, bytes)?;
        self.check_align::<f32>(offset)?;
        // SAFETY: in range, aligned, every bit pattern is a valid f32, borrowed mutably.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset) as *mut f32, count)
        })
    }

    /// Sets every byte to `byte`. `fill(0xFF)` poisons the arena: every f32 and f64 in it
    /// reads as NaN, so a kernel that fails to write its output is caught by a comparison.
    pub fn fill(&mut self, byte: u8) {
        self.as_bytes_mut().fill(byte);
    }

    fn range_end(&self, offset: usize, len: usize) -> Result<usize, ArenaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(end),
            _ => Err(ArenaError::OutOfRange {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    fn check_align<T>(&self, offset: usize) -> Result<(), ArenaError> {
        let align = std::mem::align_of::<T>();
        if (self.ptr.as_ptr() as usize + offset) % align != 0 {
            return Err(ArenaError::Misaligned {
                offset,
                align,
                type_name: std::any::type_name::<T>(),
            });
        }
        Ok(())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.cap, ARENA_ALIGN),
            )
        }
    }
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("len", &self.len)
            .field("base", &self.ptr)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check, plan, BufferReq};

    #[test]
    fn zeroed_aligned_and_bounded() {
        for n in [0usize, 1, 63, 64, 65, 4096, 1 << 20] {
            let a = Arena::new(n).unwrap();
            assert_eq!(a.len(), n);
            assert_eq!(a.ptr(0) as usize % ARENA_ALIGN, 0);
            assert!(a.as_bytes().iter().all(|&b| b == 0));
            assert!(a.try_ptr(n).is_ok());
            assert!(matches!(
                a.try_ptr(n + 1),
                Err(ArenaError::OutOfRange { .. })
            ));
            assert!(a.bytes(n, 1).is_err());
            assert!(a.bytes(usize::MAX, 2).is_err());
        }
        assert!(matches!(
            Arena::new(usize::MAX),
            Err(ArenaError::TooLarge { .. })
        ));
    }

    #[test]
    fn views_and_poison() {
        let mut a = Arena::new(256).unwrap();
        assert!(matches!(a.f32s(2, 1), Err(ArenaError::Misaligned { .. })));
        assert!(a.f32s(0, 65).is_err());
        a.fill(0xFF);
        assert!(a.f32s(0, 64).unwrap().iter().all(|x| x.is_nan()));
        a.f32s_mut(64, 4)
            .unwrap()
            .copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        // Written through the safe view, read through the raw pointer a kernel would get.
        let p = a.ptr(68) as *const f32;
        assert_eq!(unsafe { *p }, 2.0);
        assert_eq!(a.bytes(64, 4).unwrap(), 1.0f32.to_ne_bytes());
    }

    #[test]
    fn planned_buffers_do_not_interfere() {
        // Lay out a chain through a plan, write each buffer's values when it is "produced",
        // and check that every live buffer still holds its own values at each step.
        let reqs: Vec<BufferReq> = (0..6)
            .map(|i| BufferReq::new(4 * (100 + 37 * i), 64, i, i + 2))
            .collect();
        let p = plan(&reqs);
        check(&reqs, &p).unwrap();
        let mut a = Arena::new(p.arena_bytes).unwrap();
        a.fill(0xFF);
        for step in 0..8 {
            for (i, r) in reqs.iter().enumerate() {
                if r.first == step {
                    let v = a.f32s_mut(p.offsets[i], r.size / 4).unwrap();
                    v.iter_mut()
                        .enumerate()
                        .for_each(|(k, x)| *x = (i * 1000 + k) as f32);
                }
            }
            for (i, r) in reqs.iter().enumerate() {
                if r.first <= step && step <= r.last {
                    let v = a.f32s(p.offsets[i], r.size / 4).unwrap();
                    assert!(
                        v.iter()
                            .enumerate()
                            .all(|(k, &x)| x == (i * 1000 + k) as f32),
                        "buffer {i} at step {step}"
                    );
                }
            }
        }
        assert!(p.arena_bytes < p.total_bytes);
    }
}
