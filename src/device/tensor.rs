//! What the training loop holds: [`TensorBatch`] and [`Tensor`], views of
//! one slot of the ring on loan (`ring.rs`), valid while held, exported as
//! DLPack with the stream ordering of `stream.rs`.

use std::ffi::c_void;
use std::sync::Arc;

use datafusion::common::plan_datafusion_err;
use datafusion::common::plan_err;
use datafusion::error::Result;

use super::Device;
use super::dlpack::{self, Access, DLManagedTensor, DLManagedTensorVersioned};
use super::dtype::{DType, Element, cast_slice};
use super::ring::{SlotLease, SlotPool};
use super::slot::{Backend, Slot, TensorLayout};
use super::stream::ConsumerStream;

impl SlotPool {
    /// Wraps a filled, uploaded slot into the batch the consumer receives.
    pub(crate) fn lease(&self, slot: Slot, meta: BatchMeta) -> TensorBatch {
        let lease = self.new_lease(slot);
        let device = self.device();
        let tensors = lease
            .slot()
            .layouts
            .iter()
            .enumerate()
            .map(|(index, layout)| Tensor {
                index,
                layout: layout.clone(),
                device,
                lease: Arc::clone(&lease),
            })
            .collect();
        TensorBatch {
            meta,
            tensors,
            lease,
        }
    }
}

/// Where a batch sits in the feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    /// The epoch.
    pub epoch: u64,
    /// The step within the epoch on this rank (0-based; what `resume_at` takes).
    pub step: u64,
    /// Rows in this batch.
    pub rows: usize,
    /// Whether this is this rank's last batch of `epoch`: the position after
    /// it is the start of the next epoch (see [`TensorBatch::next_position`]).
    pub last_in_epoch: bool,
    /// Rows of the epoch's order consumed by all ranks together once this
    /// step is (see [`TensorBatch::next_row_position`]).
    pub rows_after: u64,
}

/// One batch of tensors on the feed's device.
///
/// # The batch contract
/// - **Valid while held.** The batch's memory is neither reused nor changed
///   until the batch, every [`Tensor`] cloned from it and every DLPack
///   export of them are dropped. Holding many batches at once (gradient
///   accumulation, `collect()`) is fine: the feed lends more buffers while
///   its memory budget allows, and past it fails at once with an error that
///   says how many batches are held, never a hang.
/// - **CUDA streams.** Work queued on the consumer's streams before the
///   release is finished before the memory is reused, grown or freed: name
///   your streams with [`TensorBatch::use_on_stream`] or
///   [`Tensor::to_dlpack_on`]; without them the legacy default stream is
///   assumed. A stream should outlive the batches named for it; one
///   destroyed earlier, or [`ConsumerStream::ANY`], makes the feed wait for
///   the whole device before it reuses the memory (`stream.rs`).
/// - **Exports are read-only** ([`Tensor::to_dlpack_versioned`]) unless asked
///   otherwise: the memory is the feed's.
pub struct TensorBatch {
    /// Where the batch sits in the feed.
    meta: BatchMeta,
    /// The tensors, in column order (masks right after their column).
    tensors: Vec<Tensor>,
    /// The slot the tensors live in.
    lease: Arc<SlotLease>,
}

impl std::fmt::Debug for TensorBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorBatch")
            .field("meta", &self.meta)
            .field("tensors", &self.tensors)
            .finish()
    }
}

impl TensorBatch {
    /// The epoch this batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.meta.epoch
    }

    /// The step within the epoch on this rank.
    pub fn step(&self) -> u64 {
        self.meta.step
    }

    /// Rows (samples) in the batch.
    pub fn rows(&self) -> usize {
        self.meta.rows
    }

    /// Whether this is this rank's last batch of its epoch.
    pub fn is_last_in_epoch(&self) -> bool {
        self.meta.last_in_epoch
    }

    /// `(epoch, step)` of the batch after this one: what a checkpoint taken
    /// after consuming it stores and [`crate::feed::FeedBuilder::resume_at`]
    /// takes. After an epoch's last batch it is `(epoch + 1, 0)`, so a
    /// consumer that stops without asking for one more batch (a loop of
    /// `len(feed)` steps, PyTorch Lightning) is at the next epoch's start.
    pub fn next_position(&self) -> (u64, u64) {
        if self.meta.last_in_epoch {
            (self.meta.epoch + 1, 0)
        } else {
            (self.meta.epoch, self.meta.step + 1)
        }
    }

    /// `(epoch, rows)` after this batch: the rows of the epoch's order that
    /// all ranks together have consumed once its step is, the same on every
    /// rank. [`crate::feed::FeedBuilder::resume_after_rows`] takes it under
    /// any world size and batch size. After an epoch's last batch it is
    /// `(epoch + 1, 0)`.
    pub fn next_row_position(&self) -> (u64, u64) {
        if self.meta.last_in_epoch {
            (self.meta.epoch + 1, 0)
        } else {
            (self.meta.epoch, self.meta.rows_after)
        }
    }

    /// All tensors.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// The tensor called `name` (a column, or `<column>_mask`).
    pub fn tensor(&self, name: &str) -> Result<&Tensor> {
        self.tensors
            .iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.tensors.iter().map(Tensor::name).collect();
                plan_datafusion_err!(
                    "the batch has no tensor '{name}'; it has: {}",
                    names.join(", ")
                )
            })
    }

    /// Total bytes of all tensors.
    pub fn nbytes(&self) -> usize {
        self.tensors.iter().map(Tensor::nbytes).sum()
    }

    /// Tells the feed that this batch's tensors are read on the CUDA stream
    /// `stream` (like `torch.Tensor.record_stream`): their memory is reused
    /// only after the work queued on `stream` before the batch is released,
    /// and `stream` waits for the batch's copies. Without any call, the
    /// legacy default stream is assumed. A no-op on the CPU.
    pub fn use_on_stream(&self, stream: ConsumerStream) -> Result<()> {
        self.lease.use_on(stream)
    }

    /// Blocks until the batch's copies to the device are complete and returns
    /// how long the copy engine spent on them (`None` on the CPU).
    pub(crate) fn wait_ready(&self) -> Result<Option<std::time::Duration>> {
        match &self.lease.backend {
            Backend::Cpu => Ok(None),
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => match &self.lease.slot().sync {
                Some(sync) => cuda.wait_upload(sync).map(Some),
                None => Ok(None),
            },
        }
    }
}

/// One tensor of a [`TensorBatch`]: C-contiguous, batch dimension first.
///
/// A tensor keeps its slot on loan: the producer reuses the memory only after
/// every tensor, batch and DLPack export of that slot is gone (and, on CUDA,
/// after the work queued on the consumer's streams before that; see
/// [`TensorBatch::use_on_stream`]).
#[derive(Clone)]
pub struct Tensor {
    /// Position in the slot.
    index: usize,
    /// Name, dtype and shape.
    layout: TensorLayout,
    /// Where the data is.
    device: Device,
    /// Keeps the memory alive and unchanged.
    lease: Arc<SlotLease>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({} {}{:?} on {})",
            self.layout.name, self.layout.dtype, self.layout.shape, self.device
        )
    }
}

impl Tensor {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.layout.name
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }

    /// Dimensions, batch first.
    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }

    /// Strides in elements (C-contiguous).
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.layout.shape.len()];
        for dim in (0..strides.len().saturating_sub(1)).rev() {
            strides[dim] = strides[dim + 1] * self.layout.shape[dim + 1];
        }
        strides
    }

    /// Where the data lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.layout.nbytes()
    }

    /// Address of the first element: a host pointer on the CPU, a
    /// `CUdeviceptr` on CUDA.
    pub fn data_ptr(&self) -> *mut c_void {
        let buffer = &self.lease.slot().buffers[self.index];
        match self.device {
            Device::Cpu => buffer.host.as_ptr().cast_mut().cast(),
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => buffer
                .device
                .as_ref()
                .map_or(std::ptr::null_mut(), |d| d.ptr() as *mut c_void),
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) => std::ptr::null_mut(),
        }
    }

    /// The raw bytes of a host tensor.
    pub fn as_bytes(&self) -> Result<&[u8]> {
        match self.device {
            Device::Cpu => {
                let host = &self.lease.slot().buffers[self.index].host;
                Ok(&host.as_slice()[..self.nbytes()])
            }
            Device::Cuda(_) => plan_err!(
                "tensor '{}' is on {}; use to_host_bytes() or its data_ptr()",
                self.name(),
                self.device
            ),
        }
    }

    /// The elements of a host tensor; `T` must match [`Tensor::dtype`]
    /// (`u8` for `bool`).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if !T::DTYPES.contains(&self.dtype()) {
            return plan_err!(
                "tensor '{}' is {}, not {}",
                self.name(),
                self.dtype(),
                std::any::type_name::<T>()
            );
        }
        cast_slice(self.as_bytes()?)
    }

    /// A copy of the tensor's bytes in host memory (a device-to-host copy on
    /// CUDA).
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        match &self.lease.backend {
            Backend::Cpu => Ok(self.as_bytes()?.to_vec()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => {
                let buffer = &self.lease.slot().buffers[self.index];
                let device = buffer.device.as_ref().ok_or_else(|| {
                    datafusion::common::internal_datafusion_err!(
                        "tensor '{}' has no device buffer",
                        self.name()
                    )
                })?;
                cuda.download(device, self.nbytes())
            }
        }
    }

    /// Tells the feed that this tensor is read on the CUDA stream `stream`:
    /// the same as [`TensorBatch::use_on_stream`] (the batch's tensors share
    /// one slot, so the release of all of them is ordered after `stream`).
    pub fn use_on_stream(&self, stream: ConsumerStream) -> Result<()> {
        self.lease.use_on(stream)
    }

    /// Exports the tensor as a legacy DLPack `DLManagedTensor` (for
    /// `torch.from_dlpack`, without a copy), read on the legacy default
    /// stream. The slot stays on loan until the consumer calls the export's
    /// `deleter`. The legacy struct cannot say read-only: prefer
    /// [`Tensor::to_dlpack_versioned`] where the consumer supports it.
    pub fn to_dlpack(&self) -> Result<*mut DLManagedTensor> {
        self.to_dlpack_on(ConsumerStream::LEGACY_DEFAULT)
    }

    /// [`Tensor::to_dlpack`] for a consumer reading on `stream` (the DLPack
    /// stream handshake: `stream` waits for the batch's copies, and the
    /// release is ordered after the work queued on it).
    pub fn to_dlpack_on(&self, stream: ConsumerStream) -> Result<*mut DLManagedTensor> {
        self.lease.use_on(stream)?;
        Ok(dlpack::export(self.exported(&self.strides())))
    }

    /// Exports the tensor as a DLPack 1.x `DLManagedTensorVersioned` read on
    /// `stream`; read-only unless `access` is [`Access::Writable`] (the
    /// memory is the feed's, reused once every holder has released it).
    pub fn to_dlpack_versioned(
        &self,
        stream: ConsumerStream,
        access: Access,
    ) -> Result<*mut DLManagedTensorVersioned> {
        self.lease.use_on(stream)?;
        Ok(dlpack::export_versioned(
            self.exported(&self.strides()),
            access,
        ))
    }

    /// This tensor as an export describes it, holding its slot's lease.
    fn exported<'a>(&'a self, strides: &'a [usize]) -> dlpack::ExportedTensor<'a> {
        dlpack::ExportedTensor {
            data: self.data_ptr(),
            device: self.device,
            dtype: self.dtype(),
            shape: self.shape(),
            strides,
            keep_alive: Box::new(Arc::clone(&self.lease)),
        }
    }
}
