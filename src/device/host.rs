//! Host staging buffers: page-aligned memory for the CPU backend, page-locked
//! (pinned) memory for CUDA.

use std::alloc::Layout;
use std::ptr::NonNull;

use datafusion::common::resources_datafusion_err;
use datafusion::error::Result;

/// Alignment of host buffers: a page, so that every tensor starts at an
/// address any element type (and DMA engines) accept.
pub(crate) const PAGE: usize = 4096;

/// A zero-initialised, page-aligned, fixed-capacity byte buffer.
pub(crate) struct AlignedBuffer {
    /// Start of the allocation (never null, page-aligned).
    ptr: NonNull<u8>,
    /// The allocation's layout (size is a multiple of [`PAGE`], at least one page).
    layout: Layout,
}

// SAFETY: the buffer owns its allocation exclusively, like a `Vec<u8>`;
// shared access only hands out `&[u8]` and mutation needs `&mut self`.
unsafe impl Send for AlignedBuffer {}
// SAFETY: see `Send`; `&AlignedBuffer` only allows reads.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// Allocates at least `bytes` zeroed bytes.
    pub(crate) fn try_new(bytes: usize) -> Result<Self> {
        let size = bytes
            .max(1)
            .div_ceil(PAGE)
            .checked_mul(PAGE)
            .ok_or_else(|| {
                resources_datafusion_err!("a tensor buffer of {bytes} bytes is too large")
            })?;
        let layout = Layout::from_size_align(size, PAGE).map_err(|e| {
            resources_datafusion_err!(
                "a tensor buffer of {bytes} bytes is too large: {e}"
            )
        })?;
        // SAFETY: `layout` has a non-zero size (at least one page).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            resources_datafusion_err!(
                "out of memory allocating a {size}-byte tensor buffer"
            )
        })?;
        Ok(Self { ptr, layout })
    }

    /// Capacity in bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// The whole buffer.
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `layout.size()` initialised (zeroed at
        // allocation) bytes owned by `self`; the borrow is tied to `&self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The whole buffer, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The start address (for DLPack).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed(self.layout)` and is
        // freed exactly once, here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AlignedBuffer({} bytes at {:p})",
            self.capacity(),
            self.ptr
        )
    }
}

/// Page-locked host memory (allocated by the CUDA backend, which is why it
/// exists only with the `cuda` feature).
#[cfg(feature = "cuda")]
pub(crate) struct PinnedBuffer {
    /// Owns the allocation (freed on drop after its event syncs).
    slice: cudarc::driver::PinnedHostSlice<u8>,
    /// Start of the allocation.
    ptr: *mut u8,
    /// Bytes, all initialised (zeroed at allocation).
    len: usize,
}

// SAFETY: like `Vec<u8>`: the buffer is owned exclusively, reads need `&self`
// and writes `&mut self`; cudarc's `PinnedHostSlice` is itself Send + Sync.
#[cfg(feature = "cuda")]
unsafe impl Send for PinnedBuffer {}
// SAFETY: see `Send`.
#[cfg(feature = "cuda")]
unsafe impl Sync for PinnedBuffer {}

#[cfg(feature = "cuda")]
impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PinnedBuffer({} bytes, {} elements)",
            self.len,
            self.slice.len()
        )
    }
}

#[cfg(feature = "cuda")]
impl PinnedBuffer {
    /// The buffer owning `slice`.
    ///
    /// # Safety
    /// `ptr` is the start of `slice`'s allocation, valid for `len`
    /// initialised bytes for as long as `slice` lives.
    pub(crate) unsafe fn from_parts(
        slice: cudarc::driver::PinnedHostSlice<u8>,
        ptr: *mut u8,
        len: usize,
    ) -> Self {
        Self { slice, ptr, len }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Host memory one tensor of a slot is written into.
#[derive(Debug)]
pub(crate) enum HostBuffer {
    /// Page-aligned pageable memory (CPU backend).
    Aligned(AlignedBuffer),
    /// Page-locked memory that the GPU's copy engine reads directly.
    #[cfg(feature = "cuda")]
    Pinned(PinnedBuffer),
}

impl HostBuffer {
    /// Capacity in bytes.
    pub(crate) fn capacity(&self) -> usize {
        match self {
            HostBuffer::Aligned(buffer) => buffer.capacity(),
            #[cfg(feature = "cuda")]
            HostBuffer::Pinned(buffer) => buffer.capacity(),
        }
    }

    /// The whole buffer.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            HostBuffer::Aligned(buffer) => buffer.as_slice(),
            #[cfg(feature = "cuda")]
            HostBuffer::Pinned(buffer) => buffer.as_slice(),
        }
    }

    /// The whole buffer, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            HostBuffer::Aligned(buffer) => buffer.as_mut_slice(),
            #[cfg(feature = "cuda")]
            HostBuffer::Pinned(buffer) => buffer.as_mut_slice(),
        }
    }

    /// The start address.
    pub(crate) fn as_ptr(&self) -> *const u8 {
        match self {
            HostBuffer::Aligned(buffer) => buffer.as_ptr(),
            #[cfg(feature = "cuda")]
            HostBuffer::Pinned(buffer) => buffer.as_slice().as_ptr(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_page_aligned_and_zeroed() -> Result<()> {
        for bytes in [0, 1, 4095, 4096, 10_000] {
            let mut buffer = AlignedBuffer::try_new(bytes)?;
            assert_eq!(buffer.as_ptr() as usize % PAGE, 0);
            assert!(buffer.capacity() >= bytes.max(1));
            assert!(buffer.as_slice().iter().all(|&b| b == 0));
            buffer.as_mut_slice()[0] = 7;
            assert_eq!(buffer.as_slice()[0], 7);
        }
        Ok(())
    }

    #[test]
    fn absurd_sizes_are_an_error_not_an_abort() {
        let err = AlignedBuffer::try_new(usize::MAX - 10)
            .unwrap_err()
            .to_string();
        assert!(err.contains("too large"), "{err}");
    }
}
