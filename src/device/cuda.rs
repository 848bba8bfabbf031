//! The CUDA backend: pinned staging buffers, a dedicated copy stream, and
//! per-slot events, on cudarc with the driver loaded at run time.
//!
//! ```text
//!  converter ─► pinned host buffer ──cuMemcpyHtoDAsync (copy stream)──► device buffer
//!                                    start event ... done event
//!  consumer: done.synchronize() (its own batch only) ─► tensors usable;
//!            a named consumer stream also waits for `done` on the device
//!  release:  `released` recorded on each consumer stream (default: the
//!            legacy default stream), the copy stream waits for each record
//! ```
//!
//! # Which event guards which buffer
//! We turn cudarc's per-buffer event tracking off (it cannot see work a
//! consumer queues after an export) and order everything ourselves:
//! - **pinned host buffer of a slot**: written by the converter only after
//!   `done` completed (`Slot::prepare` → [`CudaBackend::wait_upload`]);
//!   freed only after `done` completed ([`wait_copies_before_free`]).
//! - **device buffer of a slot**: written by the next upload, replaced when
//!   it grows and freed when the slot is dropped, all on the copy stream, and
//!   the copy stream waits for `released` as recorded on every consumer
//!   stream at the moment the batch was released ([`CudaBackend::release`])
//!   before the slot can be taken again. So no reuse, growth, end of epoch or
//!   drop touches memory a consumer's queued kernel may still read.
//!
//! # Errors
//! cudarc 0.19 panics when the driver library cannot be loaded, so
//! [`driver_present`] probes for it first and every entry point that could
//! load it runs under `catch_unwind` as a backstop (this is why the release
//! profile must never set `panic = "abort"`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DriverError, result, sys,
};
use datafusion::common::{exec_datafusion_err, plan_datafusion_err};
use datafusion::common::{exec_err, internal_err, plan_err};
use datafusion::error::{DataFusionError, Result};

use super::host::{HostBuffer, PinnedBuffer};
use super::stream::ConsumerStream;

/// The driver's handle of `stream`.
fn raw_stream(stream: ConsumerStream) -> sys::CUstream {
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

/// A context on one GPU plus the stream all uploads go through.
pub(crate) struct CudaBackend {
    /// The primary context of the device.
    ctx: Arc<CudaContext>,
    /// Host-to-device copies (non-blocking with respect to other streams).
    copy_stream: Arc<CudaStream>,
    /// The device ordinal.
    ordinal: usize,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend(cuda:{})", self.ordinal)
    }
}

impl CudaBackend {
    /// Opens device `ordinal`, or says why it cannot.
    pub(crate) fn try_new(ordinal: usize) -> Result<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return plan_err!(
                "device cuda:{ordinal} requested, but this machine has {count} CUDA \
                 device(s); use cuda:0..{} or --device cpu",
                count.saturating_sub(1)
            );
        }
        let ctx = guarded("creating a CUDA context", || CudaContext::new(ordinal))?;
        // SAFETY: we order every access to our buffers with our own per-slot
        // events (see the module docs), so cudarc's automatic tracking is not
        // needed; it would add a wait per buffer per copy.
        unsafe { ctx.disable_event_tracking() };
        let copy_stream = guarded("creating the copy stream", || ctx.new_stream())?;
        Ok(Self {
            ctx,
            copy_stream,
            ordinal,
        })
    }

    /// The device ordinal.
    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
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

    /// Events for a new slot (timing enabled for the H2D metric).
    pub(crate) fn new_slot_sync(&self) -> Result<SlotSync> {
        let event = || {
            guarded("creating a CUDA event", || {
                self.ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            })
        };
        Ok(SlotSync {
            start: event()?,
            done: event()?,
            released: event()?,
            uploaded: AtomicBool::new(false),
        })
    }

    /// Queues the copies of one batch and records its events.
    pub(crate) fn upload<'a>(
        &self,
        copies: impl Iterator<Item = (&'a HostBuffer, &'a mut DeviceBuffer, usize)>,
        sync: &SlotSync,
    ) -> Result<()> {
        // No wait for the release here: `release` made the copy stream wait
        // for it before the slot could be acquired again.
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
            // SAFETY: `device.ptr` is a live allocation of `device.capacity >=
            // bytes` bytes; `source` is pinned memory owned by the slot, which
            // is neither written (`Slot::prepare` waits for `done` first) nor
            // freed (the slot owns it and waits on drop) before the copy ends.
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

    /// Blocks until the slot's last upload is complete; returns the copy
    /// engine's time for it.
    pub(crate) fn wait_upload(&self, sync: &SlotSync) -> Result<Duration> {
        if !sync.uploaded.load(Ordering::Acquire) {
            return Ok(Duration::ZERO);
        }
        sync.done
            .synchronize()
            .map_err(|e| driver_error("waiting for a host-to-device copy", e))?;
        let ms = sync
            .start
            .elapsed_ms(&sync.done)
            .map_err(|e| driver_error("timing a host-to-device copy", e))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    /// Makes `stream` wait for the slot's last upload (the exporter's side
    /// of the DLPack stream handshake).
    pub(crate) fn order_after_upload(
        &self,
        sync: &SlotSync,
        stream: ConsumerStream,
    ) -> Result<()> {
        if !sync.uploaded.load(Ordering::Acquire) {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("binding the CUDA context", e))?;
        // SAFETY: `done` is a live event of this context (owned by `sync`);
        // `stream` is the legacy/per-thread handle or a live stream of this
        // context, as `ConsumerStream::from_raw` requires of its caller.
        unsafe {
            result::stream::wait_event(
                raw_stream(stream),
                sync.done.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| driver_error("making the consumer's stream wait for a batch", e))
    }

    /// The consumer released the slot: the copy stream waits for the work
    /// queued on each of `streams` until now (see the module docs). Never
    /// fails: if recording fails, it waits for the whole device instead, so
    /// the slot is safe to reuse either way.
    pub(crate) fn release(&self, sync: &SlotSync, streams: &[ConsumerStream]) {
        let ordered = (|| -> std::result::Result<(), DriverError> {
            self.ctx.bind_to_thread()?;
            for &stream in streams {
                // SAFETY: `released` is a live event of this context; the
                // stream handle is valid until the release (the contract of
                // `ConsumerStream::from_raw`). Re-recording the event after
                // `wait` is allowed: a wait uses the record current at the
                // time of the call.
                unsafe {
                    result::event::record(sync.released.cu_event(), raw_stream(stream))
                }?;
                self.copy_stream.wait(&sync.released)?;
            }
            Ok(())
        })();
        if let Err(err) = ordered {
            log::warn!(
                "ordering a batch release failed ({err:?}); waiting for the device"
            );
            self.ctx.record_err(Err::<(), _>(err));
            self.ctx.record_err(self.ctx.synchronize());
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
        guarded("copying a tensor to the host", || {
            self.copy_stream.clone_dtoh(&view)
        })
    }
}

impl CudaBackend {
    /// The yardstick for the feed's copies: `iters` rounds of one pinned
    /// `cuMemcpyHtoDAsync` per size in `sizes` on the copy stream, with
    /// nothing else going on; returns the wall time of all rounds.
    pub(crate) fn raw_h2d(&self, sizes: &[usize], iters: usize) -> Result<Duration> {
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
        let sync = self.new_slot_sync()?;
        let round = |pairs: &mut Vec<(HostBuffer, DeviceBuffer, usize)>| {
            self.upload(pairs.iter_mut().map(|(h, d, b)| (&*h, d, *b)), &sync)
        };
        round(&mut pairs)?;
        self.wait_upload(&sync)?;
        let start = std::time::Instant::now();
        for _ in 0..iters {
            round(&mut pairs)?;
        }
        self.copy_stream
            .synchronize()
            .map_err(|e| driver_error("waiting for the copies", e))?;
        Ok(start.elapsed())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Copies may still read pinned buffers freed right after us.
        self.ctx.record_err(self.copy_stream.synchronize());
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

/// The events of one slot.
pub(crate) struct SlotSync {
    /// Recorded before the batch's copies.
    start: CudaEvent,
    /// Recorded after them: the consumer waits for this one only.
    done: CudaEvent,
    /// Recorded on each consumer stream when the consumer releases.
    released: CudaEvent,
    /// Whether `start`/`done` have been recorded.
    uploaded: AtomicBool,
}

/// Blocks until the slot's copies are done, before its pinned host memory is
/// freed (called by `Slot::drop`; errors resurface at the next CUDA call).
pub(crate) fn wait_copies_before_free(sync: &SlotSync) {
    if sync.uploaded.load(Ordering::Acquire)
        && let Err(err) = sync.done.synchronize()
    {
        log::warn!("waiting for a slot's copies before freeing it failed: {err:?}");
    }
}

impl std::fmt::Debug for SlotSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlotSync")
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
        // `target` was zeroed on the copy stream: write it after that.
        stream
            .join(&self.copy_stream)
            .map_err(|e| driver_error("ordering a test copy", e))?;
        // SAFETY: `target` holds at least `bytes`; `source` is a tensor's
        // device address with `bytes` bytes, kept valid by the feed's release
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
