//! A slot's events, and when its memory may be freed: after its copies
//! and, where a release asked for it, after the whole device (see the
//! parent module's "Which event guards which buffer").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(test)]
use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaStream, DriverError, result};

use super::BoundContext;

/// The events of one slot.
pub(crate) struct SlotSync {
    /// Recorded before the batch's copies.
    pub(super) start: CudaEvent,
    /// Recorded after them: the consumer waits for this one only.
    pub(super) done: CudaEvent,
    /// Recorded on each consumer stream when the consumer releases.
    pub(super) released: CudaEvent,
    /// Whether `start`/`done` have been recorded.
    pub(super) uploaded: AtomicBool,
    /// Whether the last release could not be ordered on every consumer
    /// stream, so the whole device must be waited for before the slot's
    /// memory is touched again.
    pub(super) device_wait: AtomicBool,
    /// The stream the slot's copies and device frees run on (kept alive for
    /// the explicit wait before a free, see `ordered_frees`).
    pub(super) copy_stream: Arc<CudaStream>,
    /// [`CudaBackend::ordered_frees`].
    pub(super) ordered_frees: bool,
}

impl SlotSync {
    /// Waits for the slot's copies and, if a release flagged the slot, for
    /// the whole device. Straight to the driver (module docs); the slot's
    /// context must be current.
    pub(super) fn wait_before_touching(&self) -> std::result::Result<(), DriverError> {
        if self.uploaded.load(Ordering::Acquire) {
            // SAFETY: `done` is a live event (owned by `self`).
            unsafe { result::event::synchronize(self.done.cu_event()) }?;
        }
        if self.device_wait.load(Ordering::Acquire) {
            result::ctx::synchronize()?;
            self.device_wait.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Before a device buffer of the slot is freed where frees are not
    /// stream-ordered: waits for the copy stream, and so for the consumer's
    /// release it waits on. The slot's context must be current.
    pub(super) fn wait_for_unordered_free(&self) -> std::result::Result<(), DriverError> {
        if self.ordered_frees {
            return Ok(());
        }
        // SAFETY: the copy stream is live (`self` holds it).
        unsafe { result::stream::synchronize(self.copy_stream.cu_stream()) }
    }
}

/// Frees a slot's `memory` (its buffers) and `sync` once nothing can read
/// them: after the slot's copies and, if a release asked for it, the whole
/// device. Called by `Slot::drop`, on whatever thread drops the slot; the
/// thread's current context is left as it was.
pub(crate) fn free_after_copies<T>(sync: SlotSync, memory: T) {
    let ctx = sync.done.context().cu_ctx();
    // SAFETY: `sync`'s events retain the context until they drop, inside
    // this scope.
    match unsafe { BoundContext::bind(ctx) } {
        Ok(bound) => {
            let waited = sync
                .wait_before_touching()
                .and_then(|()| sync.wait_for_unordered_free());
            match waited {
                Ok(()) => drop(memory),
                // Not every failure means the device is gone (a global-mode
                // graph capture elsewhere refuses the device-wide wait):
                // nothing proves the memory unread, so it is kept.
                Err(err) => {
                    log::error!(
                        "waiting before freeing a slot failed ({err:?}); its memory is \
                         leaked rather than freed under a reader"
                    );
                    std::mem::forget(memory);
                }
            }
            drop(sync);
            drop(bound);
        }
        Err(err) => {
            // Without our context current no wait can be issued; keeping
            // the memory is the only safe choice.
            log::error!(
                "cannot bind the CUDA context to free a slot ({err:?}); leaking it"
            );
            std::mem::forget((sync, memory));
        }
    }
}

/// Runs `free` (a slot's memory after its waits, or the feed's last hold on
/// the device) on a thread of its own: freeing waits for the slot's copies,
/// maybe for the whole device, and the thread that drops a slot can be a
/// training loop's, Python's holding the GIL. Frees run in the order they
/// are handed over; where no thread can be started, on the caller's.
pub(crate) fn free_elsewhere(free: Box<dyn FnOnce() + Send>) {
    type Free = Box<dyn FnOnce() + Send>;
    static FREER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Free>>> =
        std::sync::OnceLock::new();
    let freer = FREER.get_or_init(|| {
        let (jobs, queue) = std::sync::mpsc::channel::<Free>();
        std::thread::Builder::new()
            .name("sqlfeed-free".into())
            .spawn(move || queue.into_iter().for_each(|free| free()))
            .ok()
            .map(|_| jobs)
    });
    match freer {
        Some(jobs) => {
            if let Err(std::sync::mpsc::SendError(free)) = jobs.send(free) {
                free();
            }
        }
        None => free(),
    }
}

/// Waits until every free handed to [`free_elsewhere`] so far has run.
#[cfg(test)]
pub(crate) fn wait_for_frees() {
    let (done, finished) = std::sync::mpsc::channel();
    free_elsewhere(Box::new(move || {
        let _ = done.send(());
    }));
    let _ = finished.recv_timeout(Duration::from_secs(30));
}

impl std::fmt::Debug for SlotSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlotSync")
    }
}
