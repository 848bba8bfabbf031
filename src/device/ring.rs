//! The slot ring: a fixed set of reusable tensor buffers shared by the
//! producer (the device sink) and the consumer (the training loop).
//!
//! ```text
//!  producer: acquire free slot ─► prepare(layouts) ─► write host bytes ─► upload
//!                 ▲                                                       │
//!                 │ free channel                                ready     ▼
//!            SlotLease::drop ◄──── Tensor / TensorBatch / DLPack ◄── consumer
//! ```
//! A slot is owned by exactly one side at a time (moved through channels),
//! so its buffers are never written while a consumer can read them.

use std::ffi::c_void;
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use tokio::sync::mpsc;

use super::Device;
use super::dlpack::{self, DLManagedTensor};
use super::dtype::{DType, Element, cast_slice};
use super::host::{AlignedBuffer, HostBuffer};

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
struct SlotBuffer {
    /// Where the converter writes.
    host: HostBuffer,
    /// Where the tensor lives on a GPU.
    #[cfg(feature = "cuda")]
    device: Option<super::cuda::DeviceBuffer>,
}

/// A reusable set of tensor buffers; see the module docs.
#[derive(Debug)]
pub(crate) struct Slot {
    /// The buffers, one per tensor of the current batch (and spares).
    buffers: Vec<SlotBuffer>,
    /// The tensors of the current batch.
    layouts: Vec<TensorLayout>,
    /// Host bytes of this slot already reserved from the memory pool.
    reserved: usize,
    /// CUDA events of this slot.
    #[cfg(feature = "cuda")]
    sync: Option<super::cuda::SlotSync>,
}

impl Slot {
    /// Makes room for tensors of `layouts`, reusing buffers that are large
    /// enough. On CUDA this first waits for the slot's previous upload, whose
    /// source is the host memory about to be overwritten.
    pub(crate) fn prepare(
        &mut self,
        backend: &Backend,
        layouts: Vec<TensorLayout>,
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let (Backend::Cuda(cuda), Some(sync)) = (backend, &self.sync) {
            cuda.wait_upload(sync)?;
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

    /// Host bytes held by this slot's buffers.
    fn host_capacity(&self) -> usize {
        self.buffers.iter().map(|b| b.host.capacity()).sum()
    }

    /// The host bytes of tensor `index` of the current batch.
    pub(crate) fn host_mut(&mut self, index: usize) -> Result<&mut [u8]> {
        let bytes = self
            .layouts
            .get(index)
            .map(TensorLayout::nbytes)
            .ok_or_else(|| {
                DataFusionError::Internal(format!("slot has no tensor {index}"))
            })?;
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
            return Err(DataFusionError::Internal(format!(
                "slot has no tensors {index}, {}",
                index + 1
            )));
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
            Device::Cuda(ordinal) => Err(DataFusionError::Plan(format!(
                "device cuda:{ordinal} requested, but this sqlfeed was built without \
                 the `cuda` feature; rebuild with `--features cuda` or use --device cpu"
            ))),
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
    pub(crate) fn upload(&self, slot: &mut Slot) -> Result<()> {
        match self {
            Backend::Cpu => Ok(()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => {
                let sync = match slot.sync.take() {
                    Some(sync) => sync,
                    None => cuda.new_slot_sync()?,
                };
                for (buffer, layout) in slot.buffers.iter_mut().zip(&slot.layouts) {
                    let bytes = layout.nbytes();
                    let fits = buffer
                        .device
                        .as_ref()
                        .is_some_and(|d| d.capacity() >= bytes);
                    if !fits {
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
                cuda.upload(copies, &sync)?;
                slot.sync = Some(sync);
                Ok(())
            }
        }
    }
}

/// The fixed set of slots and the channel through which released ones come
/// back to the producer.
#[derive(Debug)]
pub(crate) struct SlotPool {
    /// Released (and initially all) slots.
    free: mpsc::UnboundedReceiver<Slot>,
    /// Handed to every lease so that dropping it returns the slot.
    returns: mpsc::UnboundedSender<Slot>,
    /// The device of every slot.
    backend: Backend,
    /// The ring's host memory, reserved from the session's memory pool so
    /// that one budget covers the feed too.
    reservation: Option<MemoryReservation>,
    /// Number of slots.
    slots: usize,
}

impl SlotPool {
    /// `slots` empty slots for `backend`; buffers are allocated on first use.
    pub(crate) fn new(backend: Backend, slots: usize) -> Self {
        let (returns, free) = mpsc::unbounded_channel();
        for _ in 0..slots.max(1) {
            let slot = Slot {
                buffers: vec![],
                layouts: vec![],
                reserved: 0,
                #[cfg(feature = "cuda")]
                sync: None,
            };
            // Cannot fail: we hold the receiver.
            let _ = returns.send(slot);
        }
        Self {
            free,
            returns,
            backend,
            reservation: None,
            slots: slots.max(1),
        }
    }

    /// Accounts the ring's host memory in `reservation`.
    pub(crate) fn with_reservation(mut self, reservation: MemoryReservation) -> Self {
        self.reservation = Some(reservation);
        self
    }

    /// Reserves what `slot`'s buffers grew to since last time; fails when
    /// the ring does not fit the memory budget.
    pub(crate) fn account(&mut self, slot: &mut Slot) -> Result<()> {
        let capacity = slot.host_capacity();
        let Some(reservation) = &mut self.reservation else {
            return Ok(());
        };
        if capacity > slot.reserved {
            reservation.try_grow(capacity - slot.reserved).map_err(|e| {
                DataFusionError::ResourcesExhausted(format!(
                    "the feed's prefetch ring of {} slots needs about {} MB of host memory \
                     ({} MB per batch), more than the memory limit leaves ({e}); lower \
                     prefetch or the batch size, or raise --memory-limit",
                    self.slots,
                    self.slots * capacity / 1_000_000,
                    capacity / 1_000_000
                ))
            })?;
            slot.reserved = capacity;
        }
        Ok(())
    }

    /// The backend of this pool.
    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Waits until the consumer has released a slot.
    pub(crate) async fn acquire(&mut self) -> Result<Slot> {
        self.free.recv().await.ok_or_else(|| {
            DataFusionError::Internal("slot pool closed while the feed runs".into())
        })
    }

    /// Wraps a filled, uploaded slot into the batch the consumer receives.
    pub(crate) fn lease(&self, slot: Slot, meta: BatchMeta) -> TensorBatch {
        let lease = Arc::new(SlotLease {
            slot: Some(slot),
            returns: self.returns.clone(),
            backend: self.backend.clone(),
        });
        let device = self.backend.device();
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

/// A slot on loan to the consumer; returns it to the pool when dropped.
pub(crate) struct SlotLease {
    /// Always `Some` until `drop`.
    slot: Option<Slot>,
    /// The pool's return channel (closed once the producer is gone, in which
    /// case the slot is simply freed).
    returns: mpsc::UnboundedSender<Slot>,
    /// To record the release on CUDA.
    backend: Backend,
}

impl SlotLease {
    fn slot(&self) -> &Slot {
        self.slot
            .as_ref()
            .expect("a lease holds its slot until dropped")
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            #[cfg(feature = "cuda")]
            if let (Backend::Cuda(cuda), Some(sync)) = (&self.backend, &slot.sync) {
                // Work the consumer queued on the legacy default stream (torch's
                // default) may still read the device buffers: the next upload
                // into this slot waits for it.
                cuda.record_release(sync);
            }
            #[cfg(not(feature = "cuda"))]
            let _ = &self.backend;
            let _ = self.returns.send(slot);
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
}

/// One batch of tensors on the feed's device.
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
                DataFusionError::Plan(format!(
                    "the batch has no tensor '{name}'; it has: {}",
                    names.join(", ")
                ))
            })
    }

    /// Total bytes of all tensors.
    pub fn nbytes(&self) -> usize {
        self.tensors.iter().map(Tensor::nbytes).sum()
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
/// every tensor, batch and DLPack export of that slot is gone.
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
            Device::Cuda(_) => Err(DataFusionError::Plan(format!(
                "tensor '{}' is on {}; use to_host_bytes() or its data_ptr()",
                self.name(),
                self.device
            ))),
        }
    }

    /// The elements of a host tensor; `T` must match [`Tensor::dtype`]
    /// (`u8` for `bool`).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if !T::DTYPES.contains(&self.dtype()) {
            return Err(DataFusionError::Plan(format!(
                "tensor '{}' is {}, not {}",
                self.name(),
                self.dtype(),
                std::any::type_name::<T>()
            )));
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
                    DataFusionError::Internal(format!(
                        "tensor '{}' has no device buffer",
                        self.name()
                    ))
                })?;
                cuda.download(device, self.nbytes())
            }
        }
    }

    /// Exports the tensor as a DLPack `DLManagedTensor` (for
    /// `torch.from_dlpack`, without a copy). The slot stays on loan until the
    /// consumer calls the export's `deleter`.
    pub fn to_dlpack(&self) -> *mut DLManagedTensor {
        dlpack::export(
            self.data_ptr(),
            self.device,
            self.dtype(),
            self.shape(),
            &self.strides(),
            Box::new(Arc::clone(&self.lease)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(name: &str, dtype: DType, shape: &[usize]) -> TensorLayout {
        TensorLayout {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    #[tokio::test]
    async fn slots_return_when_every_tensor_is_dropped() -> Result<()> {
        let mut pool = SlotPool::new(Backend::Cpu, 1);
        let mut slot = pool.acquire().await?;
        slot.prepare(pool.backend(), vec![layout("x", DType::Float32, &[2, 3])])?;
        let values = super::super::dtype::cast_slice_mut::<f32>(slot.host_mut(0)?)?;
        values.copy_from_slice(&[1., 2., 3., 4., 5., 6.]);
        let batch = pool.lease(
            slot,
            BatchMeta {
                epoch: 0,
                step: 0,
                rows: 2,
            },
        );
        let x = batch.tensor("x")?.clone();
        assert_eq!(x.as_slice::<f32>()?, &[1., 2., 3., 4., 5., 6.]);
        assert_eq!(x.strides(), vec![3, 1]);
        assert!(x.as_slice::<i64>().is_err());
        drop(batch);
        // The tensor still holds the slot: the pool has nothing free.
        assert!(pool.free.try_recv().is_err());
        drop(x);
        let slot = pool
            .free
            .try_recv()
            .expect("slot returned after the last tensor");
        assert_eq!(slot.layouts()[0].shape, vec![2, 3]);
        Ok(())
    }

    /// The CUDA path end to end where a GPU exists (the GPU check runs this
    /// test binary); elsewhere opening the device is the clear error tested
    /// in `cuda.rs`.
    #[tokio::test]
    async fn cuda_upload_round_trips_when_a_gpu_is_present() -> Result<()> {
        let Ok(backend) = Backend::try_new(Device::Cuda(0)) else {
            return Ok(());
        };
        let mut pool = SlotPool::new(backend, 2);
        for round in 0..3u8 {
            let mut slot = pool.acquire().await?;
            slot.prepare(
                pool.backend(),
                vec![
                    layout("a", DType::UInt8, &[1000 + round as usize]),
                    layout("b", DType::Int64, &[7]),
                ],
            )?;
            for (i, byte) in slot.host_mut(0)?.iter_mut().enumerate() {
                *byte = (i as u8).wrapping_mul(31).wrapping_add(round);
            }
            slot.host_mut(1)?.fill(round);
            pool.backend().upload(&mut slot)?;
            let batch = pool.lease(
                slot,
                BatchMeta {
                    epoch: 0,
                    step: round as u64,
                    rows: 1,
                },
            );
            batch.wait_ready()?;
            let a = batch.tensor("a")?;
            assert!(a.as_bytes().is_err(), "device tensors are not host slices");
            assert!(!a.data_ptr().is_null());
            let expected: Vec<u8> = (0..1000 + round as usize)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(round))
                .collect();
            assert_eq!(a.to_host_bytes()?, expected);
            assert_eq!(batch.tensor("b")?.to_host_bytes()?, vec![round; 56]);
        }
        Ok(())
    }

    #[tokio::test]
    async fn buffers_are_reused_and_grown() -> Result<()> {
        let mut pool = SlotPool::new(Backend::Cpu, 1);
        let mut slot = pool.acquire().await?;
        slot.prepare(pool.backend(), vec![layout("t", DType::Int64, &[4, 8])])?;
        let first = slot.buffers[0].host.as_ptr();
        slot.prepare(pool.backend(), vec![layout("t", DType::Int64, &[4, 2])])?;
        assert_eq!(slot.buffers[0].host.as_ptr(), first, "smaller batch reuses");
        slot.prepare(pool.backend(), vec![layout("t", DType::Int64, &[4, 4096])])?;
        assert!(slot.buffers[0].host.capacity() >= 4 * 4096 * 8);
        assert_eq!(slot.host_mut(0)?.len(), 4 * 4096 * 8);
        assert!(slot.host_mut(1).is_err());
        Ok(())
    }
}
