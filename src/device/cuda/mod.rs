//! The CUDA backend: pinned staging buffers, a dedicated copy stream, and
//! per-slot events, on cudarc with the driver loaded at run time.
//!
//! ```text
//!  converter ─► pinned host buffer ──cuMemcpyHtoDAsync (copy stream)──► device buffer
//!                                    start event ... done event
//!  consumer: done.synchronize() (its own batch only) ─► tensors usable;
//!            a named consumer stream also waits for `done` on the device
//!  release:  `released` recorded on each consumer stream (default: the
//!            legacy default stream), the copy stream waits for each record;
//!            where no stream can be named (stream.rs), the slot is flagged
//!            and the producer waits for the whole device before reusing it
//! ```
//!
//! # Which event guards which buffer
//! We turn cudarc's per-buffer event tracking off (it cannot see work a
//! consumer queues after an export) and order everything ourselves:
//! - **pinned host buffer of a slot**: written by the converter only after
//!   `done` completed (`Slot::prepare` → [`CudaBackend::wait_before_reuse`]);
//!   freed only after `done` completed ([`free_after_copies`]). An upload
//!   that fails after queuing copies waits for them before it reports.
//! - **device buffer of a slot**: written by the next upload, replaced when
//!   it grows and freed when the slot is dropped, all on the copy stream, and
//!   the copy stream waits for `released` as recorded on every consumer
//!   stream at the moment the batch was released ([`CudaBackend::release`])
//!   before the slot can be taken again. A release that could not be
//!   recorded on every stream flags the slot instead, and the producer waits
//!   for the whole device before it reuses, grows or frees it. So no reuse,
//!   growth, end of epoch or drop touches memory a consumer's queued kernel
//!   may still read.
//!
//! # Whose thread, whose context
//! The consumer's calls (the wait for its batch, exports, releases, copies
//! back) run on the training loop's threads, where PyTorch keeps its own
//! current device. Each makes the feed's context current only for the call
//! ([`BoundContext`]) and puts back what was current before, so that a
//! process training on another GPU never finds its device changed. Waits
//! that guard a free or a reuse go straight to the driver: cudarc's safe
//! calls first return (and clear) an error stored by an earlier drop, and
//! would skip the wait.
//!
//! # Errors
//! cudarc 0.19 panics when the driver library cannot be loaded, so
//! [`driver_present`] probes for it first and every entry point that could
//! load it runs under `catch_unwind` as a backstop (this is why the release
//! profile must never set `panic = "abort"`).

use std::mem::ManuallyDrop;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtrMut, DriverError, result, sys,
};
use datafusion::common::{exec_datafusion_err, plan_datafusion_err};
use datafusion::common::{exec_err, internal_err, plan_err};
use datafusion::error::{DataFusionError, Result};

use super::host::{HostBuffer, PinnedBuffer};
use super::stream::{ConsumerStream, NamedStream, order_release};

mod frees;

#[cfg(test)]
pub(crate) use frees::wait_for_frees;
pub(crate) use frees::{SlotSync, free_after_copies, free_elsewhere};

/// The driver's handle of `stream` (never [`ConsumerStream::ANY`], which
/// names none: `stream.rs` turns it into a device-wide wait).
fn raw_stream(stream: ConsumerStream) -> sys::CUstream {
    debug_assert_ne!(stream, ConsumerStream::ANY);
    // 1 and 2 are the driver's CU_STREAM_LEGACY / CU_STREAM_PER_THREAD.
    stream.as_raw() as usize as sys::CUstream
}

/// Whether the CUDA driver library (`libcuda.so` / `nvcuda.dll`) can be loaded.
pub(crate) fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the library by name and
    // drops the handle; loading libcuda runs no code of ours.
    std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// The number of CUDA devices, or an error saying why there are none usable.
pub(crate) fn device_count() -> Result<usize> {
    if !driver_present() {
        return Err(no_driver());
    }
    let count = guarded("counting CUDA devices", CudaContext::device_count)?;
    Ok(usize::try_from(count).unwrap_or(0))
}

fn no_driver() -> DataFusionError {
    plan_datafusion_err!(
        "CUDA was requested but no CUDA driver (libcuda.so) could be loaded on this \
         machine; install the NVIDIA driver, or use --device cpu (or auto)"
    )
}

/// Runs a cudarc call that may panic (missing symbols) or fail.
fn guarded<T>(
    what: &str,
    call: impl FnOnce() -> std::result::Result<T, DriverError>,
) -> Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(driver_error(what, err)),
        Err(_) => exec_err!(
            "the CUDA driver panicked while {what}; is the driver installed and \
             compatible with CUDA 12.8?"
        ),
    }
}

fn driver_error(what: &str, err: DriverError) -> DataFusionError {
    exec_datafusion_err!("CUDA error while {what}: {err:?}")
}

/// The context that was current on this thread when it was made, put back
/// when it is dropped (see the module docs: the consumer's threads keep
/// their own current device).
struct BoundContext {
    /// What was current before (null: none).
    previous: sys::CUcontext,
}

impl BoundContext {
    /// Remembers what is current on this thread, to put it back on drop.
    fn save() -> std::result::Result<Self, DriverError> {
        let previous = result::ctx::get_current()?.unwrap_or(std::ptr::null_mut());
        Ok(Self { previous })
    }

    /// Makes `ours` current on this thread until the result is dropped.
    ///
    /// # Safety
    /// `ours` must be a live context (one a `CudaContext` the caller holds
    /// retains).
    unsafe fn bind(ours: sys::CUcontext) -> std::result::Result<Self, DriverError> {
        let saved = Self::save()?;
        if saved.previous != ours {
            // SAFETY: `ours` is live (the caller's contract).
            unsafe { result::ctx::set_current(ours) }?;
        }
        Ok(saved)
    }
}

impl Drop for BoundContext {
    fn drop(&mut self) {
        let now = result::ctx::get_current().map(|c| c.unwrap_or(std::ptr::null_mut()));
        if now.is_ok_and(|now| now == self.previous) {
            return;
        }
        // SAFETY: `previous` was current on this thread when we saved it
        // (or null, which unbinds); what ran since released no context but
        // the feed's own, which is not `previous` when we get here (had it
        // been, `bind` would not have switched and nothing else does).
        if let Err(err) = unsafe { result::ctx::set_current(self.previous) } {
            log::warn!("putting back this thread's CUDA context failed: {err:?}");
        }
    }
}

/// A context on one GPU plus the stream all uploads go through.
pub(crate) struct CudaBackend {
    /// The primary context of the device (dropped by hand in `drop`, with
    /// the context current there, see the module docs).
    ctx: ManuallyDrop<Arc<CudaContext>>,
    /// Host-to-device copies (non-blocking with respect to other streams;
    /// dropped by hand, like `ctx`).
    copy_stream: ManuallyDrop<Arc<CudaStream>>,
    /// The device ordinal.
    ordinal: usize,
    /// Whether the device frees memory in stream order (memory pools): then
    /// a device buffer dropped on the copy stream is freed after what the
    /// stream waits for; without them cudarc synchronises the stream first,
    /// through `check_err` (which a stored error skips), so we do it.
    ordered_frees: bool,
    /// Whether a failed release ordering has been logged (once per feed).
    warned: AtomicBool,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend(cuda:{})", self.ordinal)
    }
}

impl CudaBackend {
    /// Opens device `ordinal`, or says why it cannot. The calling thread's
    /// current context is left as it was.
    pub(crate) fn try_new(ordinal: usize) -> Result<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return plan_err!(
                "device cuda:{ordinal} requested, but this machine has {count} CUDA \
                 device(s); use cuda:0..{} or --device cpu",
                count.saturating_sub(1)
            );
        }
        let _callers = guarded("reading the current CUDA context", BoundContext::save)?;
        let ctx = guarded("creating a CUDA context", || CudaContext::new(ordinal))?;
        // SAFETY: we order every access to our buffers with our own per-slot
        // events (see the module docs), so cudarc's automatic tracking is not
        // needed; it would add a wait per buffer per copy.
        unsafe { ctx.disable_event_tracking() };
        let copy_stream = guarded("creating the copy stream", || ctx.new_stream())?;
        let pools = guarded("reading the device's memory pool support", || {
            ctx.attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            )
        })?;
        Ok(Self {
            ctx: ManuallyDrop::new(ctx),
            copy_stream: ManuallyDrop::new(copy_stream),
            ordinal,
            ordered_frees: pools > 0,
            warned: AtomicBool::new(false),
        })
    }

    /// The device ordinal.
    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Runs `call` with the feed's context current on this thread, then puts
    /// back the caller's (module docs).
    fn in_context<T>(
        &self,
        what: &str,
        call: impl FnOnce() -> std::result::Result<T, DriverError>,
    ) -> Result<T> {
        // SAFETY: `self.ctx` retains the context for as long as `self` lives.
        let _bound = unsafe { BoundContext::bind(self.ctx.cu_ctx()) }
            .map_err(|e| driver_error("binding the CUDA context", e))?;
        guarded(what, call)
    }

    /// Page-locked host memory of at least `bytes`, zeroed.
    pub(crate) fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuffer> {
        let len = bytes.max(1).div_ceil(super::host::PAGE) * super::host::PAGE;
        // SAFETY: the allocation is uninitialised; we zero it below before any
        // reference to its bytes is made. Flags 0: cacheable (the converter
        // also reads what it wrote when padding), not write-combined.
        let mut slice = guarded("allocating pinned host memory", || unsafe {
            self.ctx.alloc_pinned_with_flags::<u8>(len, 0)
        })?;
        let ptr = slice
            .as_mut_ptr()
            .map_err(|e| driver_error("mapping pinned host memory", e))?;
        // SAFETY: `ptr` is valid for `len` bytes (just allocated, non-null and
        // aligned, as cudarc asserts) and nothing else refers to it yet.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        // SAFETY: `ptr` is the start of `slice`'s allocation of `len` bytes,
        // all initialised just above, and `slice` moves into the buffer.
        Ok(unsafe { PinnedBuffer::from_parts(slice, ptr, len) })
    }

    /// Device memory of at least `bytes`.
    pub(crate) fn alloc_device(&self, bytes: usize) -> Result<DeviceBuffer> {
        let mut slice = guarded("allocating device memory", || {
            self.copy_stream.alloc_zeros::<u8>(bytes.max(1))
        })?;
        let ptr = {
            let (ptr, _sync) = slice.device_ptr_mut(&self.copy_stream);
            ptr
        };
        Ok(DeviceBuffer {
            ptr,
            capacity: bytes.max(1),
            _slice: slice,
        })
    }

    /// Events for a new slot. `start` and `done` time the copies for the H2D
    /// metric; `done` is blocking-sync, since threads wait on it (a spinning
    /// wait would take a core from the converters); `released` is only
    /// waited on by the copy stream, so it needs neither.
    pub(crate) fn new_slot_sync(&self) -> Result<SlotSync> {
        let event =
            |flags| guarded("creating a CUDA event", || self.ctx.new_event(Some(flags)));
        Ok(SlotSync {
            start: event(sys::CUevent_flags::CU_EVENT_DEFAULT)?,
            done: event(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC)?,
            released: event(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?,
            uploaded: AtomicBool::new(false),
            device_wait: AtomicBool::new(false),
            copy_stream: Arc::clone(&self.copy_stream),
            ordered_frees: self.ordered_frees,
        })
    }

    /// Queues the copies of one batch and records its events. If anything
    /// fails after a copy was queued, waits for the copy stream before
    /// returning the error: the slot's pinned memory may be freed next, and
    /// `done` no longer marks the end of what reads it.
    pub(crate) fn upload<'a>(
        &self,
        copies: impl Iterator<Item = (&'a HostBuffer, &'a mut DeviceBuffer, usize)>,
        sync: &SlotSync,
    ) -> Result<()> {
        // No wait for the release here: `release` made the copy stream wait
        // for it (or flagged the slot, which `wait_before_reuse` handled)
        // before the slot could be acquired again.
        let mut queued = false;
        let outcome = self.queue_copies(copies, sync, &mut queued);
        if outcome.is_err() && queued {
            // SAFETY: the copy stream is live (owned by `self`).
            let waited = self
                .in_context("waiting for the copies of a failed upload", || unsafe {
                    result::stream::synchronize(self.copy_stream.cu_stream())
                });
            if let Err(err) = waited {
                log::error!("{err}; the slot's memory may be freed under a copy");
            }
        }
        outcome
    }

    fn queue_copies<'a>(
        &self,
        copies: impl Iterator<Item = (&'a HostBuffer, &'a mut DeviceBuffer, usize)>,
        sync: &SlotSync,
        queued: &mut bool,
    ) -> Result<()> {
        // cudarc stores the errors of calls in drops and returns them from
        // the next call of any kind: logged here, so that a failed event
        // destroy does not end the feed as a failed copy. A sticky error
        // (the device lost) fails the calls below on its own.
        if let Err(err) = self.ctx.check_err() {
            log::warn!("a CUDA call in an earlier drop failed: {err:?}");
        }
        sync.start
            .record(&self.copy_stream)
            .map_err(|e| driver_error("recording the copy start", e))?;
        for (host, device, bytes) in copies {
            if bytes > device.capacity || bytes > host.capacity() {
                return internal_err!(
                    "copy of {bytes} bytes exceeds its buffers ({} host, {} device)",
                    host.capacity(),
                    device.capacity
                );
            }
            let source = &host.as_slice()[..bytes];
            *queued = true;
            // SAFETY: `device.ptr` is a live allocation of `device.capacity >=
            // bytes` bytes; `source` is pinned memory owned by the slot, which
            // is neither written (`Slot::prepare` waits for `done` first) nor
            // freed (the slot owns it and waits on drop; a failed upload
            // waits before it returns) before the copy ends.
            unsafe {
                result::memcpy_htod_async(
                    device.ptr,
                    source,
                    self.copy_stream.cu_stream(),
                )
            }
            .map_err(|e| driver_error("queuing a host-to-device copy", e))?;
        }
        sync.done
            .record(&self.copy_stream)
            .map_err(|e| driver_error("recording the copy end", e))?;
        sync.uploaded.store(true, Ordering::Release);
        Ok(())
    }

    /// A device buffer of the slot is about to be replaced (it grows); see
    /// [`CudaBackend::ordered_frees`].
    pub(crate) fn wait_before_device_free(&self, sync: &SlotSync) -> Result<()> {
        if sync.ordered_frees {
            return Ok(());
        }
        self.in_context("waiting before a device buffer is freed", || {
            sync.wait_for_unordered_free()
        })
    }

    /// The producer is about to rewrite the slot (host and device memory):
    /// waits for its last upload and, if a release flagged it, for the whole
    /// device.
    pub(crate) fn wait_before_reuse(&self, sync: &SlotSync) -> Result<()> {
        self.in_context("waiting before a slot is reused", || {
            sync.wait_before_touching()
        })
    }

    /// Blocks until the slot's last upload is complete; returns the copy
    /// engine's time for it. Called by the consumer for its batch.
    pub(crate) fn wait_upload(&self, sync: &SlotSync) -> Result<Duration> {
        if !sync.uploaded.load(Ordering::Acquire) {
            return Ok(Duration::ZERO);
        }
        let ms = self.in_context("waiting for a host-to-device copy", || {
            // SAFETY: both events are live (owned by `sync`) and recorded on
            // the copy stream, `start` before `done`.
            unsafe {
                result::event::synchronize(sync.done.cu_event())?;
                result::event::elapsed(sync.start.cu_event(), sync.done.cu_event())
            }
        })?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    /// The driver's id of a stream handle, to notice at the release that it
    /// was destroyed (stream.rs); `None` for the default streams, a handle
    /// the driver rejects, or a driver without stream ids (older than CUDA
    /// 12.0: the symbol is missing, cudarc panics, and we stop asking).
    fn stream_id(&self, stream: ConsumerStream) -> Option<u64> {
        static NO_STREAM_IDS: AtomicBool = AtomicBool::new(false);
        if !stream.is_handle() || NO_STREAM_IDS.load(Ordering::Relaxed) {
            return None;
        }
        // SAFETY: `self.ctx` retains the context for as long as `self` lives.
        let _bound = unsafe { BoundContext::bind(self.ctx.cu_ctx()) }.ok()?;
        let mut id: std::ffi::c_ulonglong = 0;
        // SAFETY: `from_raw`'s contract makes the handle a live stream of
        // this context until the release. A consumer that breaks it (its
        // stream destroyed first) hands the driver a stale handle; drivers
        // reject those they no longer know, which turns the record the
        // release would make on it into a device-wide wait: a best effort
        // for a broken contract, not a guarantee.
        let read = std::panic::catch_unwind(AssertUnwindSafe(|| unsafe {
            sys::cuStreamGetId(raw_stream(stream), &mut id)
        }));
        match read {
            Ok(code) => code.result().ok().map(|()| id),
            Err(_) => {
                NO_STREAM_IDS.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// Refuses a stream of another context (another GPU): the wait at the
    /// export would pass, but neither the release's record nor the
    /// device-wide fallback would cover it.
    fn check_stream_context(&self, stream: ConsumerStream) -> Result<()> {
        let mut owner: sys::CUcontext = std::ptr::null_mut();
        self.in_context("reading a stream's context", || {
            // SAFETY: the handle is a live stream the consumer names now
            // (`ConsumerStream::from_raw`); `owner` is written by the driver.
            unsafe { sys::cuStreamGetCtx(raw_stream(stream), &mut owner) }.result()
        })?;
        if owner != self.ctx.cu_ctx() {
            return plan_err!(
                "CUDA stream {:#x} belongs to another device or context than the feed's \
                 cuda:{}; read the batch on a stream of cuda:{} (or build the feed for \
                 the stream's device)",
                stream.as_raw(),
                self.ordinal,
                self.ordinal
            );
        }
        Ok(())
    }

    /// Makes `stream` wait for the slot's last upload (the exporter's side
    /// of the DLPack stream handshake) and says how its release is to be
    /// ordered. [`ConsumerStream::ANY`] waits for nothing: the batch was
    /// handed over after its copies completed.
    pub(crate) fn order_after_upload(
        &self,
        sync: &SlotSync,
        stream: ConsumerStream,
    ) -> Result<NamedStream> {
        if stream.is_handle() {
            self.check_stream_context(stream)?;
        }
        if stream != ConsumerStream::ANY && sync.uploaded.load(Ordering::Acquire) {
            self.in_context("making the consumer's stream wait for a batch", || {
                // SAFETY: `done` is a live event of this context (owned by
                // `sync`); `stream` is the legacy/per-thread handle or a live
                // stream of this context, as `ConsumerStream::from_raw`
                // requires of its caller at the export.
                unsafe {
                    result::stream::wait_event(
                        raw_stream(stream),
                        sync.done.cu_event(),
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                }
            })?;
        }
        Ok(NamedStream::new(stream, self.stream_id(stream)))
    }

    /// The consumer released the slot: the copy stream waits for the work
    /// queued until now on each stream named for it (module docs). Never
    /// fails and never blocks: a stream that cannot be ordered on (unknown,
    /// destroyed, or its recording failed) flags the slot, and the producer
    /// waits for the whole device before it touches the slot again.
    pub(crate) fn release(&self, sync: &SlotSync, streams: &[NamedStream]) {
        if release_wait_disabled() {
            return;
        }
        let here = std::thread::current().id();
        let ordered = self.in_context("ordering a batch release", || {
            let plan = streams
                .iter()
                .map(|named| named.release_on(here, |s| self.stream_id(s)));
            Ok(order_release(plan, |stream| {
                // A stream being captured into a CUDA graph would take the
                // record (and the copy stream's wait) into the graph instead
                // of running them: the device-wide wait instead.
                // SAFETY: as for the record below.
                let capture =
                    unsafe { result::stream::is_capturing(raw_stream(stream)) }?;
                if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                    return Err(DriverError(
                        sys::cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                    ));
                }
                // SAFETY: `released` is a live event of this context;
                // `stream` is a default stream or a handle whose id still
                // matches the one read at the export (stream.rs), so it is
                // the live stream the consumer named. Re-recording the event
                // after an earlier `wait` is allowed: a wait uses the record
                // current at the time of the call.
                unsafe {
                    result::event::record(sync.released.cu_event(), raw_stream(stream))?;
                    result::stream::wait_event(
                        self.copy_stream.cu_stream(),
                        sync.released.cu_event(),
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                }
            }))
        });
        let device_wait = match ordered {
            Ok((device_wait, failures)) => {
                if !failures.is_empty() && !self.warned.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "ordering a batch release after the consumer's streams failed \
                         ({failures:?}); the feed waits for the whole device before \
                         reusing such a batch's memory"
                    );
                }
                device_wait
            }
            Err(err) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    log::warn!("{err}; the feed waits for the whole device instead");
                }
                true
            }
        };
        if device_wait {
            sync.device_wait.store(true, Ordering::Release);
        }
    }

    /// Copies `bytes` of `device` back to the host (blocking).
    pub(crate) fn download(
        &self,
        device: &DeviceBuffer,
        bytes: usize,
    ) -> Result<Vec<u8>> {
        let bytes = bytes.min(device.capacity);
        let view = device._slice.slice(..bytes);
        self.in_context("copying a tensor to the host", || {
            self.copy_stream.clone_dtoh(&view)
        })
    }
}

/// Test-only: with `SQLFEED_TEST_SKIP_RELEASE_WAIT=1`, releases order
/// nothing, so that the GPU check can show that it fails without the release
/// wait. Only test builds and `--features gpu-check` builds read it.
#[cfg(any(test, feature = "gpu-check"))]
fn release_wait_disabled() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISABLED.get_or_init(|| {
        let disabled =
            std::env::var("SQLFEED_TEST_SKIP_RELEASE_WAIT").is_ok_and(|v| v == "1");
        if disabled {
            log::warn!(
                "SQLFEED_TEST_SKIP_RELEASE_WAIT=1: batch releases are NOT ordered"
            );
        }
        disabled
    })
}

#[cfg(not(any(test, feature = "gpu-check")))]
fn release_wait_disabled() -> bool {
    false
}

impl CudaBackend {
    /// The yardstick for the feed's copies: `iters` rounds of one pinned
    /// `cuMemcpyHtoDAsync` per size in `sizes` on the copy stream, with
    /// nothing else going on; returns the wall time of all rounds.
    pub(crate) fn raw_h2d(&self, sizes: &[usize], iters: usize) -> Result<Duration> {
        // Called from a user's thread (Python): its context is put back.
        let _callers = guarded("reading the current CUDA context", BoundContext::save)?;
        // The sync first: it is declared before the buffers, so it drops
        // after them, and a failed round waits for its copies (`upload`).
        let sync = self.new_slot_sync()?;
        let mut pairs = sizes
            .iter()
            .map(|&bytes| {
                Ok((
                    HostBuffer::Pinned(self.alloc_pinned(bytes)?),
                    self.alloc_device(bytes)?,
                    bytes,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let round = |pairs: &mut Vec<(HostBuffer, DeviceBuffer, usize)>| {
            self.upload(pairs.iter_mut().map(|(h, d, b)| (&*h, d, *b)), &sync)
        };
        round(&mut pairs)?;
        self.wait_upload(&sync)?;
        let start = std::time::Instant::now();
        for _ in 0..iters {
            round(&mut pairs)?;
        }
        // SAFETY: the copy stream is live (owned by `self`).
        self.in_context("waiting for the copies", || unsafe {
            result::stream::synchronize(self.copy_stream.cu_stream())
        })?;
        Ok(start.elapsed())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // SAFETY: `self.ctx` still retains the context (dropped below).
        let bound = unsafe { BoundContext::bind(self.ctx.cu_ctx()) };
        // Copies may still read pinned buffers freed right after us; straight
        // to the driver, so that no stored error skips the wait.
        let stream = self.copy_stream.cu_stream();
        // SAFETY: the copy stream is live until dropped below.
        if let Err(err) = unsafe { result::stream::synchronize(stream) } {
            log::error!(
                "waiting for the copy stream before closing the feed failed: {err:?}"
            );
        }
        // SAFETY: each field is dropped exactly once, here, and never read
        // again. Inside `bound`, so that cudarc's drops (which make the
        // context current) leave this thread's context as it was.
        unsafe {
            ManuallyDrop::drop(&mut self.copy_stream);
            ManuallyDrop::drop(&mut self.ctx);
        }
        drop(bound);
    }
}

/// Device memory of one tensor of a slot.
pub(crate) struct DeviceBuffer {
    /// The raw device address.
    ptr: sys::CUdeviceptr,
    /// Bytes allocated.
    capacity: usize,
    /// Owns the allocation.
    _slice: CudaSlice<u8>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer({} bytes at {:#x})",
            self.capacity, self.ptr
        )
    }
}

impl DeviceBuffer {
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
}

/// Test-only consumers: a side stream whose work is slow, like a training
/// step queued on PyTorch's own stream.
#[cfg(test)]
impl CudaBackend {
    /// A new stream of this context (not the copy stream).
    pub(crate) fn test_side_stream(&self) -> Result<Arc<CudaStream>> {
        guarded("creating a side stream", || self.ctx.new_stream())
    }

    /// Queues `ms` milliseconds of nothing on `stream` (a host function that
    /// sleeps), so work queued after it runs late.
    pub(crate) fn test_delay(&self, stream: &CudaStream, ms: usize) -> Result<()> {
        unsafe extern "C" fn sleep_ms(ms: *mut std::ffi::c_void) {
            std::thread::sleep(Duration::from_millis(ms as usize as u64));
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("binding the CUDA context", e))?;
        // SAFETY: `sleep_ms` calls no CUDA function (which host functions
        // must not) and reads nothing through its argument, which is just a
        // number smuggled as a pointer; the stream is live.
        unsafe {
            sys::cuLaunchHostFunc(
                stream.cu_stream(),
                Some(sleep_ms),
                ms as *mut std::ffi::c_void,
            )
        }
        .result()
        .map_err(|e| driver_error("queuing a delay", e))
    }

    /// Queues `ms` milliseconds of nothing on the copy stream: the next
    /// upload's copies run late.
    pub(crate) fn test_delay_copies(&self, ms: usize) -> Result<()> {
        self.test_delay(&self.copy_stream, ms)
    }

    /// Makes `stream` wait for the work queued on the copy stream so far
    /// (test buffers are zeroed there).
    pub(crate) fn test_after_copies(&self, stream: &CudaStream) -> Result<()> {
        stream
            .join(&self.copy_stream)
            .map_err(|e| driver_error("ordering after the copy stream", e))
    }

    /// Queues a copy of `bytes` from device address `source` into `target`
    /// on `stream`.
    pub(crate) fn test_copy(
        &self,
        target: &DeviceBuffer,
        source: u64,
        bytes: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        if bytes > target.capacity {
            return internal_err!("test copy too large");
        }
        // SAFETY: `target` holds at least `bytes` and `stream` waits for its
        // zeroing (`test_after_copies`); `source` is a tensor's device
        // address with `bytes` bytes, kept valid by the feed's release
        // ordering, which is exactly what the calling test checks.
        unsafe {
            result::memcpy_dtod_async(target.ptr, source, bytes, stream.cu_stream())
        }
        .map_err(|e| driver_error("queuing a device copy", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (CI, most laptops) asking for a GPU is an error that
    /// says so, never a panic; with one, the context opens.
    #[test]
    fn missing_driver_is_an_error_not_a_panic() {
        match CudaBackend::try_new(0) {
            Ok(backend) => assert_eq!(backend.ordinal(), 0),
            Err(err) => {
                let msg = err.to_string();
                assert!(
                    msg.contains("CUDA") && msg.contains("--device cpu"),
                    "unexpected error: {msg}"
                );
            }
        }
        if !driver_present() {
            assert!(device_count().is_err());
        }
    }
}
