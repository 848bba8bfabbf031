//! The slot ring: a fixed set of reusable tensor buffers shared by the
//! producer (the device sink) and the consumer (the training loop).
//!
//! ```text
//!  producer: acquire free slot ─► prepare(layouts) ─► write host bytes ─► upload
//!                 ▲                                                       │
//!                 │ free channel                                ready     ▼
//!            SlotLease::drop ◄──── Tensor / TensorBatch / DLPack ◄── consumer
//!                                  (`tensor.rs`: what the consumer holds;
//!                                   `slot.rs`: a slot and its backend)
//! ```
//! A slot is owned by exactly one side at a time (moved through channels),
//! so its buffers are never written while a consumer can read them. On CUDA
//! the hand-back is also ordered on the device: see `stream.rs` for which
//! event guards which buffer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::common::internal_err;
use datafusion::common::{resources_datafusion_err, resources_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use tokio::sync::mpsc;

use super::Device;
use super::slot::{Backend, Slot, TensorLayout};
use super::stream::{ConsumerStream, NamedStream};

/// What the producer and the consumer know about the slots on loan, shared
/// by the pool, every lease and the feed.
#[derive(Debug, Default)]
pub(crate) struct Loans {
    /// Slots leased as batches and not yet released.
    leased: AtomicUsize,
    /// Leased batches handed to the ready channel and not yet taken by the
    /// consumer (so `leased - queued` are held by the training loop).
    queued: AtomicUsize,
    /// Whether the consumer is blocked waiting for the next batch.
    consumer_waiting: AtomicBool,
    /// Slots the ring keeps now (`prefetch + 1`, fewer once fitted to its
    /// memory share; see [`SlotPool`]).
    ring_slots: AtomicUsize,
}

impl Loans {
    /// A batch was put into the ready channel.
    pub(crate) fn queued(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    /// The consumer took a batch out of the ready channel.
    pub(crate) fn taken(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
    }

    /// The consumer starts or stops waiting for a batch.
    pub(crate) fn set_consumer_waiting(&self, waiting: bool) {
        self.consumer_waiting.store(waiting, Ordering::Release);
    }

    /// Slots the ring keeps now: the prefetch depth plus one.
    pub(crate) fn ring_slots(&self) -> usize {
        self.ring_slots.load(Ordering::Acquire)
    }

    /// Batches ready for the consumer (queued and not yet taken).
    pub(crate) fn ready(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Batches the training loop holds (taken and not released).
    pub(crate) fn held(&self) -> usize {
        let leased = self.leased.load(Ordering::Acquire);
        leased.saturating_sub(self.queued.load(Ordering::Acquire))
    }

    /// True when nothing can move: no batch is queued, the consumer waits
    /// for one, and (checked by the caller) no slot is free.
    fn consumer_blocked(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
            && self.consumer_waiting.load(Ordering::Acquire)
    }
}

/// How often the producer re-checks, while no slot is free and the budget
/// allows no extra one, whether the consumer is blocked on it.
const BLOCKED_POLL: Duration = Duration::from_millis(25);

/// Consecutive blocked polls before the feed fails: a consumer in the middle
/// of releasing a batch is not a deadlock.
const BLOCKED_POLLS: u32 = 8;

/// The fewest slots a fitted ring keeps: one for the batch the training loop
/// holds while it asks for the next, one being filled.
const MIN_RING_SLOTS: usize = 2;

/// The slots of a feed and the channel through which released ones come
/// back to the producer.
///
/// # The batch contract
/// A batch stays valid as long as its holder keeps it: its slot returns to
/// the pool only when the batch, its tensors and their DLPack exports are all
/// gone. The ring starts with `prefetch + 1` slots; when the training loop
/// holds all of them (gradient accumulation, `collect()`), the pool lends an
/// extra slot as long as the memory budget has room for one, and gives the
/// extras back once they are released. When the budget has no room and the
/// consumer waits for a batch while holding every slot, the feed fails with
/// an error saying how many batches are held and what they take, within a
/// second, never a hang.
///
/// # Memory
/// Every slot's host buffers are reserved from the session's pool *before*
/// they are allocated; device buffers mirror them on CUDA. The ring's share
/// of the budget is set aside when the feed starts; when the first batch
/// shows that `prefetch + 1` slots of its size do not fit in that share, the
/// ring keeps as many as do (at least [`MIN_RING_SLOTS`]) and says so once
/// (a warning, and the feed's report). A slot that must grow later, past
/// what the budget has, first retires free slots down to that minimum; only
/// a batch that does not fit even then is an error.
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
    /// Bytes of `reservation` set aside for slots not yet sized (the ring's
    /// share, reserved before the query runs); given back once every base
    /// slot has its buffers.
    unused_share: usize,
    /// Base slots whose buffers have been sized at least once.
    sized_slots: usize,
    /// Slots the ring keeps (`prefetch + 1`).
    base_slots: usize,
    /// Slots that exist now (base plus extras lent to a holding consumer).
    total_slots: usize,
    /// Loans, shared with leases and the feed.
    loans: Arc<Loans>,
}

impl SlotPool {
    /// `slots` empty slots for `backend`; buffers are allocated on first use.
    pub(crate) fn new(backend: Backend, slots: usize) -> Self {
        let (returns, free) = mpsc::unbounded_channel();
        for _ in 0..slots.max(1) {
            // Cannot fail: we hold the receiver.
            let _ = returns.send(Slot::empty());
        }
        Self {
            free,
            returns,
            backend,
            reservation: None,
            unused_share: 0,
            sized_slots: 0,
            base_slots: slots.max(1),
            total_slots: slots.max(1),
            loans: Arc::new(Loans {
                ring_slots: AtomicUsize::new(slots.max(1)),
                ..Loans::default()
            }),
        }
    }

    /// Accounts the ring's host memory in `reservation`, setting `share`
    /// bytes aside now (as much of it as the pool has) for the slots'
    /// buffers to come.
    pub(crate) fn with_reservation(
        mut self,
        reservation: MemoryReservation,
        share: usize,
    ) -> Self {
        if reservation.try_grow(share).is_ok() {
            self.unused_share = share;
        }
        self.reservation = Some(reservation);
        self
    }

    /// The loan counters, for the consumer's side.
    pub(crate) fn loans(&self) -> Arc<Loans> {
        Arc::clone(&self.loans)
    }

    /// Makes room in `slot` for tensors of `layouts`: what its buffers must
    /// grow by is reserved from the memory pool first, then allocated.
    pub(crate) fn prepare(
        &mut self,
        slot: &mut Slot,
        layouts: Vec<TensorLayout>,
    ) -> Result<()> {
        let needed = slot.capacity_after(&layouts);
        if needed > slot.reserved {
            if slot.reserved == 0 {
                if self.sized_slots == 0 {
                    self.fit_to_share(needed);
                }
                self.sized_slots += 1;
            }
            self.reserve(needed - slot.reserved)?;
            slot.reserved = needed;
            if self.sized_slots >= self.base_slots {
                self.give_back_share();
            }
        }
        slot.prepare(&self.backend, layouts)
    }

    /// Keeps only as many base slots of `per_slot` bytes as the ring's share
    /// holds (at least [`MIN_RING_SLOTS`]). Called when the first slot is
    /// sized: every other slot is free and empty then, so retiring them
    /// frees nothing that is in use.
    fn fit_to_share(&mut self, per_slot: usize) {
        if self.unused_share == 0 || per_slot == 0 {
            return;
        }
        let fit = (self.unused_share / per_slot).max(MIN_RING_SLOTS);
        let wanted = self.base_slots;
        while self.base_slots > fit && self.retire_free_slot() {}
        if self.base_slots < wanted {
            log::warn!(
                "the feed's batches take {:.1} MB each: its prefetch ring keeps {} slots \
                 (prefetch {}) instead of {} to fit its share of the memory limit \
                 ({:.1} MB); raise --memory-limit for a deeper ring",
                per_slot as f64 / 1e6,
                self.base_slots,
                self.base_slots - 1,
                wanted,
                self.unused_share as f64 / 1e6,
            );
        }
    }

    /// Frees one slot that is free now: a released extra, else a base slot
    /// while more than [`MIN_RING_SLOTS`] remain; false when there is none
    /// to retire. Freeing a released slot is what `give_back_extras` does.
    fn retire_free_slot(&mut self) -> bool {
        let extra = self.total_slots > self.base_slots;
        if !extra && self.base_slots <= MIN_RING_SLOTS {
            return false;
        }
        let Ok(slot) = self.free.try_recv() else {
            return false;
        };
        if let Some(reservation) = &mut self.reservation {
            reservation.shrink(slot.reserved.min(reservation.size()));
        }
        self.total_slots -= 1;
        if !extra {
            if slot.reserved > 0 {
                self.sized_slots = self.sized_slots.saturating_sub(1);
            }
            self.base_slots -= 1;
            self.loans
                .ring_slots
                .store(self.base_slots, Ordering::Release);
        }
        drop(slot);
        if self.sized_slots >= self.base_slots {
            self.give_back_share();
        }
        true
    }

    /// Returns the part of the ring's share that no slot took.
    fn give_back_share(&mut self) {
        if let Some(reservation) = &mut self.reservation {
            reservation.shrink(self.unused_share.min(reservation.size()));
        }
        self.unused_share = 0;
    }

    fn reserve(&mut self, bytes: usize) -> Result<()> {
        let from_share = bytes.min(self.unused_share);
        self.unused_share -= from_share;
        let bytes = bytes - from_share;
        if bytes == 0 {
            return Ok(());
        }
        // Past the share: free slots make room first (a batch grew, or the
        // share was taken), down to the smallest ring.
        loop {
            let Some(reservation) = &mut self.reservation else {
                return Ok(());
            };
            let Err(e) = reservation.try_grow(bytes) else {
                return Ok(());
            };
            let total = reservation.size() + bytes;
            if !self.retire_free_slot() {
                return resources_err!(
                    "the feed's prefetch ring of {} slots needs about {} MB of host memory \
                     ({} MB for this batch), more than the memory limit leaves ({e}); lower \
                     prefetch or the batch size, or raise --memory-limit",
                    self.total_slots,
                    total / 1_000_000,
                    bytes / 1_000_000
                );
            }
        }
    }

    /// The backend of this pool.
    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// A slot to fill: a released one, or an extra one while the training
    /// loop holds every slot and the budget has room (see the type docs).
    pub(crate) async fn acquire(&mut self) -> Result<Slot> {
        let mut blocked_polls = 0;
        loop {
            if let Ok(slot) = self.free.try_recv() {
                self.give_back_extras();
                return Ok(slot);
            }
            if let Some(slot) = self.try_lend_extra() {
                return Ok(slot);
            }
            match tokio::time::timeout(BLOCKED_POLL, self.free.recv()).await {
                Ok(Some(slot)) => {
                    self.give_back_extras();
                    return Ok(slot);
                }
                Ok(None) => {
                    return internal_err!("slot pool closed while the feed runs");
                }
                Err(_elapsed) if self.loans.consumer_blocked() => {
                    blocked_polls += 1;
                    if blocked_polls >= BLOCKED_POLLS {
                        return Err(self.held_too_many());
                    }
                }
                Err(_elapsed) => blocked_polls = 0,
            }
        }
    }

    /// An empty extra slot with the largest slot's bytes reserved, when the
    /// training loop holds every slot (no batch is queued for it) and the
    /// memory budget has room.
    fn try_lend_extra(&mut self) -> Option<Slot> {
        if self.loans.queued.load(Ordering::Acquire) > 0
            || self.loans.held() < self.total_slots
        {
            return None;
        }
        let per_slot = self.bytes_per_slot();
        if let Some(reservation) = &mut self.reservation
            && reservation.try_grow(per_slot).is_err()
        {
            return None;
        }
        self.total_slots += 1;
        let mut slot = Slot::empty();
        slot.reserved = per_slot;
        Some(slot)
    }

    /// Frees released extra slots while more than the base ring exists.
    fn give_back_extras(&mut self) {
        while self.total_slots > self.base_slots {
            let Ok(extra) = self.free.try_recv() else {
                return;
            };
            if let Some(reservation) = &mut self.reservation {
                reservation.shrink(extra.reserved.min(reservation.size()));
            }
            self.total_slots -= 1;
            drop(extra);
        }
    }

    /// Host bytes reserved per slot, on average.
    fn bytes_per_slot(&self) -> usize {
        self.reservation.as_ref().map_or(0, |r| {
            r.size().saturating_sub(self.unused_share) / self.total_slots.max(1)
        })
    }

    fn held_too_many(&self) -> DataFusionError {
        let held = self.loans.held();
        let per_slot = self.bytes_per_slot();
        resources_datafusion_err!(
            "the training loop holds {held} batches of this feed (about {} MB of \
             tensors) and waits for another, but the memory limit leaves no room for \
             one more; a held batch stays valid, so keep fewer at once (drop or copy \
             those you no longer need), lower the batch size, or raise --memory-limit",
            held * per_slot / 1_000_000
        )
    }

    /// Puts a filled, uploaded slot on loan to the consumer (see
    /// `tensor.rs`, which wraps it into the batch the consumer receives).
    pub(super) fn new_lease(&self, slot: Slot) -> Arc<SlotLease> {
        self.loans.leased.fetch_add(1, Ordering::AcqRel);
        Arc::new(SlotLease {
            slot: Some(slot),
            returns: self.returns.clone(),
            backend: self.backend.clone(),
            streams: Mutex::new(Vec::new()),
            loans: Arc::clone(&self.loans),
        })
    }

    /// The device of the pool's slots.
    pub(super) fn device(&self) -> Device {
        self.backend.device()
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
    pub(super) backend: Backend,
    /// The CUDA streams consumers named for this batch (empty: the legacy
    /// default stream), with what their release needs to know.
    streams: Mutex<Vec<NamedStream>>,
    /// Loan counters.
    loans: Arc<Loans>,
}

impl SlotLease {
    pub(super) fn slot(&self) -> &Slot {
        self.slot
            .as_ref()
            .expect("a lease holds its slot until dropped")
    }

    /// Notes that a consumer reads this batch on `stream`: on CUDA `stream`
    /// waits for the batch's copies now, and once that wait is queued, the
    /// release is to be ordered after the work queued on `stream` (a stream
    /// whose wait failed is not noted: its export failed too). A stream
    /// already noted has waited for these copies: nothing to do again (each
    /// tensor of a batch exported on one stream asks).
    pub(super) fn use_on(&self, stream: ConsumerStream) -> Result<()> {
        let here = std::thread::current().id();
        let noted =
            |streams: &[NamedStream]| streams.iter().any(|n| n.is_same(stream, here));
        if noted(&self.streams.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(());
        }
        let named = match &self.backend {
            Backend::Cpu => NamedStream::new(stream, None),
            #[cfg(feature = "cuda")]
            Backend::Cuda(cuda) => match &self.slot().sync {
                Some(sync) => cuda.order_after_upload(sync, stream)?,
                None => NamedStream::new(stream, None),
            },
        };
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if !noted(&streams) {
            streams.push(named);
        }
        Ok(())
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        #[cfg(feature = "cuda")]
        if let (Backend::Cuda(cuda), Some(sync)) = (&self.backend, &slot.sync) {
            // Before the slot can be reused, grown or freed: the copy stream,
            // on which all of those happen, waits for the work the consumer
            // queued on its streams up to now (see `stream.rs`).
            let mut streams = std::mem::take(
                &mut *self.streams.lock().unwrap_or_else(|p| p.into_inner()),
            );
            if streams.is_empty() {
                streams.push(NamedStream::new(ConsumerStream::LEGACY_DEFAULT, None));
            }
            cuda.release(sync, &streams);
        }
        self.loans.leased.fetch_sub(1, Ordering::AcqRel);
        // Fails once the producer is gone: then the slot is dropped here (a
        // CUDA slot's memory is freed on the freeing thread, `Slot::drop`),
        // and so may be the feed's last hold on the device, which goes to
        // the freeing thread too (closing it waits for the copy stream).
        let Err(mpsc::error::SendError(slot)) = self.returns.send(slot) else {
            return;
        };
        drop(slot);
        #[cfg(feature = "cuda")]
        if let Backend::Cuda(cuda) = std::mem::replace(&mut self.backend, Backend::Cpu) {
            super::cuda::free_elsewhere(Box::new(move || drop(cuda)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::dlpack::{self, Access};
    use crate::device::dtype::DType;
    use crate::device::tensor::BatchMeta;
    #[cfg(feature = "cuda")]
    use datafusion::common::exec_datafusion_err;

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
        pool.prepare(&mut slot, vec![layout("x", DType::Float32, &[2, 3])])?;
        let values = super::super::dtype::cast_slice_mut::<f32>(slot.host_mut(0)?)?;
        values.copy_from_slice(&[1., 2., 3., 4., 5., 6.]);
        let batch = pool.lease(
            slot,
            BatchMeta {
                epoch: 0,
                step: 0,
                rows: 2,
                last_in_epoch: false,
                rows_after: 0,
            },
        );
        let x = batch.tensor("x")?.clone();
        assert_eq!(x.as_slice::<f32>()?, &[1., 2., 3., 4., 5., 6.]);
        assert_eq!(x.strides(), vec![3, 1]);
        assert!(x.as_slice::<i64>().is_err());
        drop(batch);
        // The tensor still holds the slot: the pool has nothing free.
        assert!(pool.free.try_recv().is_err());
        // A versioned export is read-only and holds the slot too.
        let export =
            x.to_dlpack_versioned(ConsumerStream::default(), Access::ReadOnly)?;
        // SAFETY: a live export of ours.
        assert_eq!(unsafe { (*export).flags }, dlpack::DLPACK_FLAG_READ_ONLY);
        drop(x);
        assert!(
            pool.free.try_recv().is_err(),
            "the export still holds the slot"
        );
        // SAFETY: the export's deleter, called once.
        unsafe { ((*export).deleter.expect("deleter"))(export) };
        let slot = pool
            .free
            .try_recv()
            .expect("slot returned after the last tensor and export");
        assert_eq!(slot.layouts()[0].shape, vec![2, 3]);
        Ok(())
    }

    fn meta(step: u64) -> BatchMeta {
        BatchMeta {
            epoch: 0,
            step,
            rows: 1,
            last_in_epoch: false,
            rows_after: 0,
        }
    }

    /// The bytes of tensor `a` in round `round`.
    fn pattern(len: usize, round: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(round))
            .collect()
    }

    /// The CUDA path end to end where a GPU exists (the GPU check runs this
    /// test binary with SQLFEED_TEST_CUDA=require).
    #[tokio::test]
    async fn cuda_upload_round_trips_when_a_gpu_is_present() -> Result<()> {
        let Some(backend) = super::super::cuda_for_test("cuda_upload_round_trips") else {
            return Ok(());
        };
        let mut pool = SlotPool::new(backend, 2);
        for round in 0..3u8 {
            let mut slot = pool.acquire().await?;
            pool.prepare(
                &mut slot,
                vec![
                    layout("a", DType::UInt8, &[1000 + round as usize]),
                    layout("b", DType::Int64, &[7]),
                ],
            )?;
            slot.host_mut(0)?
                .copy_from_slice(&pattern(1000 + round as usize, round));
            slot.host_mut(1)?.fill(round);
            pool.backend().upload(&mut slot)?;
            let batch = pool.lease(slot, meta(round as u64));
            batch.wait_ready()?;
            let a = batch.tensor("a")?;
            assert!(a.as_bytes().is_err(), "device tensors are not host slices");
            assert!(!a.data_ptr().is_null());
            assert_eq!(a.to_host_bytes()?, pattern(1000 + round as usize, round));
            assert_eq!(batch.tensor("b")?.to_host_bytes()?, vec![round; 56]);
        }
        Ok(())
    }

    /// What a consumer read against what each round's batch held: per
    /// round, how many bytes differ and the first that does (never whole
    /// vectors: a failure must stay readable in the GPU check's report).
    #[cfg(feature = "cuda")]
    fn mismatches(
        cuda: &super::super::cuda::CudaBackend,
        reads: &[(super::super::cuda::DeviceBuffer, usize, u8)],
    ) -> Result<Vec<String>> {
        let mut found = vec![];
        for (copy, len, round) in reads {
            let got = cuda.download(copy, *len)?;
            let want = pattern(*len, *round);
            let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            if let Some(first) = got.iter().zip(&want).position(|(a, b)| a != b) {
                found.push(format!(
                    "round {round}: {differ} of {len} bytes differ, the first at {first} \
                     (read {}, the batch held {})",
                    got[first], want[first]
                ));
            }
        }
        Ok(found)
    }

    /// A CUDA pool's backend and a consumer on a side stream of its own,
    /// like a training step on PyTorch's stream.
    #[cfg(feature = "cuda")]
    struct SideConsumer {
        backend: Backend,
        cuda: Arc<super::super::cuda::CudaBackend>,
        side: Arc<cudarc::driver::CudaStream>,
        consumer: ConsumerStream,
    }

    /// `None` where there is no GPU (the test skips visibly).
    #[cfg(feature = "cuda")]
    fn side_stream_consumer(test: &str) -> Result<Option<SideConsumer>> {
        let Some(backend) = super::super::cuda_for_test(test) else {
            return Ok(None);
        };
        let Backend::Cuda(cuda) = backend.clone() else {
            return internal_err!("not a CUDA backend");
        };
        let side = cuda.test_side_stream()?;
        // SAFETY: `side` is a live stream of the feed's context, and each
        // test keeps it until after every batch named for it is dropped.
        let consumer =
            unsafe { ConsumerStream::from_raw(side.cu_stream() as usize as u64) };
        Ok(Some(SideConsumer {
            backend,
            cuda,
            side,
            consumer,
        }))
    }

    /// How the side-stream consumer of [`consumer_on_a_side_stream`] reads.
    #[cfg(feature = "cuda")]
    #[derive(Clone, Copy, PartialEq)]
    enum Reader {
        /// Late, on the stream it names: the release must wait for it.
        Late,
        /// At once, while each upload is delayed on the copy stream: its
        /// stream must wait for the copies.
        WhileCopiesAreLate,
        /// Late, naming no stream (DLPack's -1, after the host waited for the
        /// copies): the producer must wait for the whole device.
        LateNamingNoStream,
    }

    /// A consumer that reads every batch on its own stream, after dropping
    /// it, while the producer reuses the two slots: every byte it read must
    /// be the batch's own. `lens` is each round's tensor size. Copy targets
    /// are allocated up front: an allocation in the loop can synchronise the
    /// device and hide a missing wait.
    #[cfg(feature = "cuda")]
    async fn consumer_on_a_side_stream(
        test: &str,
        lens: &[usize],
        reader: Reader,
    ) -> Result<()> {
        let Some(SideConsumer {
            backend,
            cuda,
            side,
            consumer,
        }) = side_stream_consumer(test)?
        else {
            return Ok(());
        };
        let largest = lens.iter().copied().max().unwrap_or(1);
        let targets = lens
            .iter()
            .map(|_| cuda.alloc_device(largest))
            .collect::<Result<Vec<_>>>()?;
        cuda.test_after_copies(&side)?;
        let mut pool = SlotPool::new(backend, 2);
        let mut reads = vec![];
        for ((round, &len), target) in lens.iter().enumerate().zip(targets) {
            let tag = round as u8;
            let mut slot = pool.acquire().await?;
            pool.prepare(&mut slot, vec![layout("a", DType::UInt8, &[len])])?;
            slot.host_mut(0)?.copy_from_slice(&pattern(len, tag));
            if reader == Reader::WhileCopiesAreLate {
                cuda.test_delay_copies(25)?;
            }
            pool.backend().upload(&mut slot)?;
            let batch = pool.lease(slot, meta(round as u64));
            if reader == Reader::LateNamingNoStream {
                batch.wait_ready()?;
                batch.use_on_stream(ConsumerStream::ANY)?;
            } else {
                batch.use_on_stream(consumer)?;
            }
            if reader != Reader::WhileCopiesAreLate {
                // The "training step": slow, then it reads the tensor.
                cuda.test_delay(&side, 25)?;
            }
            cuda.test_copy(&target, batch.tensor("a")?.data_ptr() as u64, len, &side)?;
            // Dropped long before the step ran, as PyTorch does.
            drop(batch);
            reads.push((target, len, tag));
        }
        side.synchronize()
            .map_err(|e| exec_datafusion_err!("{e:?}"))?;
        let found = mismatches(&cuda, &reads)?;
        assert!(
            found.is_empty(),
            "{test}: the consumer read bytes that were not its batch's: {}",
            found.join("; ")
        );
        Ok(())
    }

    /// Same-size reuse, the deterministic form of a missing release wait:
    /// round r + 2 writes the very buffer round r's consumer reads late.
    /// Fails with `SQLFEED_TEST_SKIP_RELEASE_WAIT=1` (the GPU check shows it).
    #[cfg(feature = "cuda")]
    #[tokio::test]
    async fn a_slow_consumer_stream_never_sees_reused_memory() -> Result<()> {
        consumer_on_a_side_stream(
            "a_slow_consumer_stream_reuse",
            &[1 << 20; 12],
            Reader::Late,
        )
        .await
    }

    /// Growth once, in the middle: both slots replace their device buffers
    /// (freed on the copy stream after the release), then reuse the new ones.
    #[cfg(feature = "cuda")]
    #[tokio::test]
    async fn a_slow_consumer_stream_never_sees_grown_or_freed_memory() -> Result<()> {
        let mut lens = vec![1 << 18; 6];
        lens.extend([1 << 20; 6]);
        consumer_on_a_side_stream("a_slow_consumer_stream_growth", &lens, Reader::Late)
            .await
    }

    /// The export's direction: copies queued late, a consumer stream reading
    /// at once still sees its batch (it waits for `done`, not the host).
    #[cfg(feature = "cuda")]
    #[tokio::test]
    async fn a_consumer_stream_waits_for_late_copies() -> Result<()> {
        let reader = Reader::WhileCopiesAreLate;
        consumer_on_a_side_stream("a_consumer_stream_waits", &[1 << 20; 8], reader).await
    }

    /// A consumer naming no stream: the release flags the slot and the
    /// producer's device-wide wait keeps round r + 2 from writing what round
    /// r reads late. Fails with `SQLFEED_TEST_SKIP_RELEASE_WAIT=1` too.
    #[cfg(feature = "cuda")]
    #[tokio::test]
    async fn a_consumer_naming_no_stream_is_waited_for_by_the_device() -> Result<()> {
        let reader = Reader::LateNamingNoStream;
        consumer_on_a_side_stream("a_consumer_naming_no_stream", &[1 << 20; 12], reader)
            .await
    }

    /// A batch held past its feed: its slot is freed on the freeing thread
    /// after the consumer's late read, and the read sees the batch's bytes
    /// even when the freed memory is taken again at once.
    #[cfg(feature = "cuda")]
    #[tokio::test]
    async fn a_batch_held_past_its_feed_is_freed_after_its_reads() -> Result<()> {
        let Some(SideConsumer {
            backend,
            cuda,
            side,
            consumer,
        }) = side_stream_consumer("a_batch_held_past_its_feed")?
        else {
            return Ok(());
        };
        let len = 1 << 20;
        let target = cuda.alloc_device(len)?;
        cuda.test_after_copies(&side)?;
        let mut pool = SlotPool::new(backend, 1);
        let mut slot = pool.acquire().await?;
        pool.prepare(&mut slot, vec![layout("a", DType::UInt8, &[len])])?;
        slot.host_mut(0)?.copy_from_slice(&pattern(len, 7));
        pool.backend().upload(&mut slot)?;
        let batch = pool.lease(slot, meta(0));
        batch.use_on_stream(consumer)?;
        cuda.test_delay(&side, 50)?;
        cuda.test_copy(&target, batch.tensor("a")?.data_ptr() as u64, len, &side)?;
        drop(pool);
        drop(batch);
        super::super::cuda::wait_for_frees();
        // Take device memory again at once (the stream-ordered pool hands
        // back what was just freed) and overwrite it on the copy stream.
        let _scratch = cuda.alloc_device(len)?;
        side.synchronize()
            .map_err(|e| exec_datafusion_err!("{e:?}"))?;
        let found = mismatches(&cuda, &[(target, len, 7)])?;
        assert!(found.is_empty(), "{}", found.join("; "));
        Ok(())
    }

    #[tokio::test]
    async fn extra_slots_are_lent_while_the_loop_holds_every_slot() -> Result<()> {
        let mut pool = SlotPool::new(Backend::Cpu, 2);
        let mut held = vec![];
        for step in 0..5 {
            let mut slot = pool.acquire().await?;
            pool.prepare(&mut slot, vec![layout("x", DType::Int64, &[16])])?;
            held.push(pool.lease(slot, meta(step)));
        }
        assert_eq!(pool.total_slots, 5, "three extras lent to the holder");
        drop(held);
        let _slot = pool.acquire().await?;
        assert_eq!(pool.total_slots, 2, "extras given back once released");
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
