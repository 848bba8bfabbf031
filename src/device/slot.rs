//! A slot of the ring (`ring.rs`): the buffers of one batch's tensors,
//! how they grow and are reused, and how they reach their device
//! ([`Backend`]: nothing to do on the CPU; pinned staging and async copies
//! on CUDA, with the events `cuda/` orders them by).
//!
//! ```text
//!  SlotPool::prepare ─► Slot::prepare(layouts): wait for the slot's last
//!                       upload (and the device, if a release asked), grow
//!                       host buffers that are too small
//!  converter writes host_mut(i) ─► Backend::upload: device buffers grown,
//!                       copies queued on the copy stream, `done` recorded
//! ```

use std::sync::Arc;

use datafusion::common::internal_datafusion_err;
use datafusion::common::internal_err;
use datafusion::error::Result;

use super::Device;
use super::dtype::DType;
use super::host::{AlignedBuffer, HostBuffer, PAGE};

/// Shape and type of one tensor of a batch (always C-contiguous).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorLayout {
    /// The tensor's name (the column, or `<column>_mask`).
    pub(crate) name: Arc<str>,
    /// Element type.
    pub(crate) dtype: DType,
    /// Dimensions, batch first.
    pub(crate) shape: Vec<usize>,
}

impl TensorLayout {
    /// Number of elements.
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of bytes.
    pub(crate) fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

/// One tensor's memory in a slot.
#[derive(Debug)]
pub(super) struct SlotBuffer {
    /// Where the converter writes.
    pub(super) host: HostBuffer,
    /// Where the tensor lives on a GPU.
    #[cfg(feature = "cuda")]
    pub(super) device: Option<super::cuda::DeviceBuffer>,
}

/// A reusable set of tensor buffers; see the module docs.
#[derive(Debug)]
pub(crate) struct Slot {
    /// The buffers, one per tensor of the current batch (and spares).
    pub(super) buffers: Vec<SlotBuffer>,
    /// The tensors of the current batch.
    pub(super) layouts: Vec<TensorLayout>,
    /// Host bytes of this slot already reserved from the memory pool.
    pub(super) reserved: usize,
    /// CUDA events of this slot.
    #[cfg(feature = "cuda")]
    pub(super) sync: Option<super::cuda::SlotSync>,
}

/// Bytes a host buffer asked for `bytes` really takes (whole pages).
fn page_rounded(bytes: usize) -> usize {
    bytes.max(1).div_ceil(PAGE) * PAGE
}

impl Slot {
    /// A slot without buffers (they are allocated on first use).
    pub(super) fn empty() -> Self {
        Slot {
            buffers: vec![],
            layouts: vec![],
            reserved: 0,
            #[cfg(feature = "cuda")]
            sync: None,
        }
    }

    /// Host bytes this slot's buffers hold after [`Slot::prepare`] for
    /// `layouts` (the same growth rule), so that they can be reserved first.
    pub(super) fn capacity_after(&self, layouts: &[TensorLayout]) -> usize {
        let kept: usize = self
            .buffers
            .iter()
            .skip(layouts.len())
            .map(|b| b.host.capacity())
            .sum();
        let used: usize = layouts
            .iter()
            .enumerate()
            .map(|(index, layout)| {
                let bytes = layout.nbytes();
                match self.buffers.get(index) {
                    None => page_rounded(bytes),
                    Some(b) if b.host.capacity() < bytes => {
                        page_rounded(bytes + bytes / 4)
                    }
                    Some(b) => b.host.capacity(),
                }
            })
            .sum();
        kept + used
    }

    /// Makes room for tensors of `layouts`, reusing buffers that are large
    /// enough (the memory is reserved by [`SlotPool::prepare`]). On CUDA this
    /// first waits for the slot's previous upload, whose source is the host
    /// memory about to be overwritten, and for the whole device if the last
    /// release could not be ordered on the consumer's streams; a slot gets
    /// its events before its first buffer, so that every slot holding CUDA
    /// memory knows what to wait for before freeing it.
    pub(super) fn prepare(
        &mut self,
        backend: &Backend,
        layouts: Vec<TensorLayout>,
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Backend::Cuda(cuda) = backend {
            match &self.sync {
                Some(sync) => cuda.wait_before_reuse(sync)?,
                None => self.sync = Some(cuda.new_slot_sync()?),
            }
        }
        for (index, layout) in layouts.iter().enumerate() {
            let bytes = layout.nbytes();
            if index == self.buffers.len() {
                self.buffers.push(SlotBuffer {
                    host: backend.alloc_host(bytes)?,
                    #[cfg(feature = "cuda")]
                    device: None,
                });
            } else if self.buffers[index].host.capacity() < bytes {
                // Grow with headroom so that slowly growing padded batches do
                // not reallocate every time.
                self.buffers[index].host = backend.alloc_host(bytes + bytes / 4)?;
            }
        }
        self.layouts = layouts;
        Ok(())
    }

    /// The host bytes of tensor `index` of the current batch.
    pub(crate) fn host_mut(&mut self, index: usize) -> Result<&mut [u8]> {
        let bytes = self
            .layouts
            .get(index)
            .map(TensorLayout::nbytes)
            .ok_or_else(|| internal_datafusion_err!("slot has no tensor {index}"))?;
        Ok(&mut self.buffers[index].host.as_mut_slice()[..bytes])
    }

    /// The host bytes of tensors `index` and `index + 1` (a padded column and
    /// its mask).
    pub(crate) fn host_pair_mut(
        &mut self,
        index: usize,
    ) -> Result<(&mut [u8], &mut [u8])> {
        let bytes = |i: usize| self.layouts.get(i).map(TensorLayout::nbytes);
        let (Some(first), Some(second)) = (bytes(index), bytes(index + 1)) else {
            return internal_err!("slot has no tensors {index}, {}", index + 1);
        };
        let (head, tail) = self.buffers.split_at_mut(index + 1);
        Ok((
            &mut head[index].host.as_mut_slice()[..first],
            &mut tail[0].host.as_mut_slice()[..second],
        ))
    }

    /// The tensors of the current batch.
    #[cfg(test)]
    pub(crate) fn layouts(&self) -> &[TensorLayout] {
        &self.layouts
    }
}

#[cfg(feature = "cuda")]
impl Drop for Slot {
    fn drop(&mut self) {
        // The pinned host buffers must not be freed while a copy may still
        // read them, nor the device buffers while a consumer's kernel may
        // (when the release flagged the slot): freed after those waits.
        // Otherwise the device buffers free on the copy stream, which
        // already waits for the consumer's release (recorded in
        // `SlotLease::drop`) and follows the copies. A slot without events
        // holds no CUDA memory.
        // On the freeing thread: the waits must not run on whichever thread
        // drops the slot (a consumer's, under Python's GIL, when a release
        // races the pool's end).
        if let Some(sync) = self.sync.take() {
            let buffers = std::mem::take(&mut self.buffers);
            super::cuda::free_elsewhere(Box::new(move || {
                super::cuda::free_after_copies(sync, buffers);
            }));
        }
    }
}

/// How tensors reach their device.
#[derive(Clone)]
pub(crate) enum Backend {
    /// Host memory; nothing to copy.
    Cpu,
    /// Pinned staging plus async copies to a CUDA device.
    #[cfg(feature = "cuda")]
    Cuda(Arc<super::cuda::CudaBackend>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Backend({})", self.device())
    }
}

impl Backend {
    /// Opens `device`: always works for the CPU; for CUDA it loads the driver
    /// and creates a context, or says why it cannot.
    pub(crate) fn try_new(device: Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Backend::Cpu),
            #[cfg(feature = "cuda")]
            Device::Cuda(ordinal) => Ok(Backend::Cuda(Arc::new(
                super::cuda::CudaBackend::try_new(ordinal)?,
            ))),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(ordinal) => datafusion::common::plan_err!(
                "device cuda:{ordinal} requested, but this sqlfeed was built without \
                 the `cuda` feature; rebuild with `--features cuda` or use --device cpu"
            ),
        }
    }

    /// The device tensors end up on.
    pub(crate) fn device(&self) -> Device {
        match self {
            Backend::Cpu => Device::Cpu,
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => Device::Cuda(cuda.ordinal()),
        }
    }

    fn alloc_host(&self, bytes: usize) -> Result<HostBuffer> {
        match self {
            Backend::Cpu => Ok(HostBuffer::Aligned(AlignedBuffer::try_new(bytes)?)),
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => Ok(HostBuffer::Pinned(cuda.alloc_pinned(bytes)?)),
        }
    }

    /// Starts moving `slot`'s tensors to the device (CUDA: async copies on
    /// the copy stream, then the slot's event); a no-op on the CPU.
    #[cfg_attr(not(feature = "cuda"), expect(unused_variables))]
    pub(crate) fn upload(&self, slot: &mut Slot) -> Result<()> {
        match self {
            Backend::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => {
                // Created by `prepare`; left in the slot whatever happens, so
                // that its drop waits for copies a failed upload queued.
                let Some(sync) = slot.sync.as_ref() else {
                    return internal_err!("a CUDA slot uploaded before it was prepared");
                };
                for (buffer, layout) in slot.buffers.iter_mut().zip(&slot.layouts) {
                    let bytes = layout.nbytes();
                    let fits = buffer
                        .device
                        .as_ref()
                        .is_some_and(|d| d.capacity() >= bytes);
                    if !fits {
                        // The old buffer is freed on the copy stream, which
                        // already waits for the consumer's release of this
                        // slot (`SlotLease::drop`): never under its kernels.
                        // (Where the device has no stream-ordered frees, the
                        // wait is made explicit first.)
                        if buffer.device.is_some() {
                            cuda.wait_before_device_free(sync)?;
                        }
                        buffer.device = Some(cuda.alloc_device(bytes + bytes / 4)?);
                    }
                }
                let copies = slot.buffers.iter_mut().zip(&slot.layouts).filter_map(
                    |(buffer, layout)| {
                        let bytes = layout.nbytes();
                        let device = buffer.device.as_mut()?;
                        Some((&buffer.host, device, bytes))
                    },
                );
                cuda.upload(copies, sync)
            }
        }
    }
}
