//! The consumer's CUDA stream: which stream a training loop reads a batch
//! on, so that the feed orders its reuse of the batch's memory after that
//! work (the DLPack stream handshake), and how a release is ordered after
//! each stream named for a batch — decided here, in host code, so that the
//! rules are tested without a GPU.
//!
//! ```text
//!  export on stream S ─► S waits for the batch's copies (event `done`);
//!                        S is noted with the exporting thread and S's id
//!  consumer queues kernels on S that read the tensor, drops its reference
//!  release ─► per named stream (ReleaseOn):
//!               Stream(S)  event recorded on S, the copy stream waits for it
//!               Device     the producer waits for the whole device before
//!                          it touches the slot again (stream unknown or gone)
//!  later uploads into the slot, growth and frees run on the copy stream,
//!  so they start only after the consumer's kernels queued before the release
//! ```
//! The numbers follow the DLPack Python convention and the driver API:
//! 1 is the legacy default stream (`CU_STREAM_LEGACY`, what PyTorch's
//! default stream is), 2 the per-thread default stream
//! (`CU_STREAM_PER_THREAD`); anything else is a `CUstream` handle.
//!
//! # Three streams that cannot be named at the release
//! - **The per-thread default stream (2)** is a different stream on every
//!   thread, and a batch is often released on another thread than the one
//!   that exported it (PyTorch's autograd thread, the garbage collector).
//!   Released elsewhere, the release is recorded on the legacy default
//!   stream instead: the per-thread default streams are blocking streams,
//!   and work on the legacy stream starts only after all work queued before
//!   it on every blocking stream of the context, so the event completes
//!   after the exporting thread's work too.
//! - **A stream destroyed before the release** (a CuPy stream collected
//!   first, `torch.cuda.ExternalStream` of a stream its owner destroyed)
//!   breaks [`ConsumerStream::from_raw`]'s contract. As a best effort, its
//!   driver id, read at the export, is read again: when the driver rejects
//!   the handle or it now names another stream, nothing is recorded on it;
//!   the producer waits for the whole device instead, which covers the work
//!   the destroyed stream still had.
//! - **A stream being captured into a CUDA graph** at the release would
//!   take the record into the graph instead of running it (`cuda/mod.rs`
//!   checks and falls back to the device-wide wait).
//! - **No stream at all** (DLPack's `stream=-1`, [`ConsumerStream::ANY`]:
//!   the consumer synchronises on its own): the producer waits for the whole
//!   device before the slot is reused.
//!
//! A device-wide wait happens on the producer's thread, when it takes the
//! slot again (or frees it), never on the thread that releases the batch.

use std::thread::ThreadId;

/// A CUDA stream a consumer reads a batch on; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConsumerStream(u64);

impl ConsumerStream {
    /// The legacy default stream (`CU_STREAM_LEGACY`): PyTorch's default
    /// stream, and the stream a consumer that names none is assumed to use.
    pub const LEGACY_DEFAULT: ConsumerStream = ConsumerStream(1);

    /// The per-thread default stream (`CU_STREAM_PER_THREAD`) of the thread
    /// that names it.
    pub const PER_THREAD_DEFAULT: ConsumerStream = ConsumerStream(2);

    /// Streams the feed is not told (DLPack's `stream=-1`: the consumer
    /// synchronises on its own). The consumer's side needs no wait (a batch
    /// is handed over once its copies are complete); before the memory is
    /// reused, the producer waits for the whole device.
    pub const ANY: ConsumerStream = ConsumerStream(u64::MAX);

    /// A stream handle from another library (a `cudaStream_t` / `CUstream`,
    /// e.g. `torch.cuda.current_stream().cuda_stream`); 0 (the NULL stream)
    /// and 1 mean the legacy default stream, 2 the per-thread one.
    ///
    /// # Safety
    /// `handle` must be 0, 1, 2, or a stream created in the primary context
    /// of the device the feed writes to (another context's is refused at the
    /// export), and that stream must stay alive until every batch, tensor and
    /// DLPack export it was named for has been released: the release records
    /// an event on it. (A stream destroyed earlier is noticed as a best
    /// effort by its driver id and costs a device-wide wait; see the module
    /// docs.)
    pub unsafe fn from_raw(handle: u64) -> ConsumerStream {
        match handle {
            0 => ConsumerStream::LEGACY_DEFAULT,
            other => ConsumerStream(other),
        }
    }

    /// The raw handle (1 and 2 are the driver's special handles; [`ANY`]
    /// is none).
    ///
    /// [`ANY`]: ConsumerStream::ANY
    pub fn as_raw(self) -> u64 {
        self.0
    }

    /// Whether this is a handle of a stream someone created (not one of the
    /// driver's default streams, not [`ConsumerStream::ANY`]).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // CUDA's release rules, tested without it
    pub(crate) fn is_handle(self) -> bool {
        self != Self::LEGACY_DEFAULT
            && self != Self::PER_THREAD_DEFAULT
            && self != Self::ANY
    }
}

impl Default for ConsumerStream {
    fn default() -> Self {
        ConsumerStream::LEGACY_DEFAULT
    }
}

/// A stream named for a batch, with what its release needs to know later,
/// possibly on another thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NamedStream {
    /// The stream.
    pub(crate) stream: ConsumerStream,
    /// The thread that named it: the per-thread default stream is its own.
    thread: ThreadId,
    /// The driver's unique id of a stream handle as read when it was named
    /// (`None`: not a handle, or the driver cannot tell).
    id: Option<u64>,
}

/// How a release is ordered after one named stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // CUDA's release rules, tested without it
pub(crate) enum ReleaseOn {
    /// Record the release on this stream; the copy stream waits for it.
    Stream(ConsumerStream),
    /// Only a wait for the whole device covers the stream (unknown or gone).
    Device,
}

impl NamedStream {
    /// `stream`, named now on this thread; `id` is its driver id if it is a
    /// handle whose id could be read.
    pub(crate) fn new(stream: ConsumerStream, id: Option<u64>) -> Self {
        Self {
            stream,
            thread: std::thread::current().id(),
            id,
        }
    }

    /// Whether this names the stream `stream` would name on thread `thread`:
    /// the same handle from any thread, the per-thread default stream only
    /// from the thread that named it.
    pub(crate) fn is_same(&self, stream: ConsumerStream, thread: ThreadId) -> bool {
        self.stream == stream
            && (stream != ConsumerStream::PER_THREAD_DEFAULT || self.thread == thread)
    }

    /// How to order a release on thread `releasing` after this stream;
    /// `id_now` reads a handle's driver id at the release (`None`: the
    /// handle is invalid now). See the module docs for each case.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // CUDA's release rules, tested without it
    pub(crate) fn release_on(
        &self,
        releasing: ThreadId,
        id_now: impl FnOnce(ConsumerStream) -> Option<u64>,
    ) -> ReleaseOn {
        match self.stream {
            ConsumerStream::ANY => ReleaseOn::Device,
            ConsumerStream::PER_THREAD_DEFAULT if releasing != self.thread => {
                ReleaseOn::Stream(ConsumerStream::LEGACY_DEFAULT)
            }
            stream if !stream.is_handle() => ReleaseOn::Stream(stream),
            handle => match self.id {
                // The driver could not tell at the export (older than CUDA
                // 12.0): the handle is trusted, as `from_raw` requires.
                None => ReleaseOn::Stream(handle),
                Some(id) if id_now(handle) == Some(id) => ReleaseOn::Stream(handle),
                Some(_) => ReleaseOn::Device,
            },
        }
    }
}

/// Whether a release still needs a device-wide wait after ordering it on
/// each of `plan`'s streams with `order` (tried on every one, so that every
/// failure is reported), and the failures: a stream that needs the device,
/// or whose ordering failed, leaves only the device-wide wait to be safe.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // CUDA's release rules, tested without it
pub(crate) fn order_release<E>(
    plan: impl IntoIterator<Item = ReleaseOn>,
    mut order: impl FnMut(ConsumerStream) -> Result<(), E>,
) -> (bool, Vec<(ConsumerStream, E)>) {
    let mut device_wait = false;
    let mut failures = vec![];
    for on in plan {
        match on {
            ReleaseOn::Device => device_wait = true,
            ReleaseOn::Stream(stream) => {
                if let Err(err) = order(stream) {
                    device_wait = true;
                    failures.push((stream, err));
                }
            }
        }
    }
    (device_wait, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(raw: u64) -> ConsumerStream {
        // SAFETY: only compared and planned here, never used on a device.
        unsafe { ConsumerStream::from_raw(raw) }
    }

    fn other_thread() -> ThreadId {
        std::thread::spawn(|| std::thread::current().id())
            .join()
            .expect("thread")
    }

    #[test]
    fn the_null_stream_is_the_legacy_default() {
        assert_eq!(handle(0), ConsumerStream::LEGACY_DEFAULT);
        assert_eq!(ConsumerStream::default().as_raw(), 1);
        assert_eq!(handle(7).as_raw(), 7);
        assert!(handle(7).is_handle());
        assert!(!ConsumerStream::ANY.is_handle());
        assert!(!ConsumerStream::PER_THREAD_DEFAULT.is_handle());
    }

    #[test]
    fn a_per_thread_stream_released_elsewhere_is_ordered_on_the_legacy_stream() {
        let here = std::thread::current().id();
        let named = NamedStream::new(ConsumerStream::PER_THREAD_DEFAULT, None);
        let no_id = |_| panic!("a default stream has no id to read");
        assert_eq!(
            named.release_on(here, no_id),
            ReleaseOn::Stream(ConsumerStream::PER_THREAD_DEFAULT),
            "released on the exporting thread: that thread's own stream"
        );
        assert_eq!(
            named.release_on(other_thread(), no_id),
            ReleaseOn::Stream(ConsumerStream::LEGACY_DEFAULT),
            "released on another thread (autograd, GC): the legacy stream"
        );
        let legacy = NamedStream::new(ConsumerStream::LEGACY_DEFAULT, None);
        assert_eq!(
            legacy.release_on(other_thread(), no_id),
            ReleaseOn::Stream(ConsumerStream::LEGACY_DEFAULT)
        );
    }

    #[test]
    fn a_per_thread_stream_is_the_same_only_on_its_own_thread() {
        let here = std::thread::current().id();
        let elsewhere = other_thread();
        let per_thread = NamedStream::new(ConsumerStream::PER_THREAD_DEFAULT, None);
        assert!(per_thread.is_same(ConsumerStream::PER_THREAD_DEFAULT, here));
        assert!(!per_thread.is_same(ConsumerStream::PER_THREAD_DEFAULT, elsewhere));
        let named = NamedStream::new(handle(0x5000), Some(41));
        assert!(
            named.is_same(handle(0x5000), elsewhere),
            "a handle is one stream"
        );
        assert!(!named.is_same(handle(0x6000), here));
    }

    #[test]
    fn a_stream_destroyed_or_reused_before_the_release_costs_a_device_wait() {
        let here = std::thread::current().id();
        let named = NamedStream::new(handle(0x5000), Some(41));
        assert_eq!(
            named.release_on(here, |_| Some(41)),
            ReleaseOn::Stream(handle(0x5000)),
            "alive: recorded on it"
        );
        assert_eq!(
            named.release_on(here, |_| None),
            ReleaseOn::Device,
            "destroyed: never recorded on the dead handle"
        );
        assert_eq!(
            named.release_on(here, |_| Some(42)),
            ReleaseOn::Device,
            "the handle now names another stream"
        );
        // A driver without stream ids: the handle is trusted, as from_raw says.
        let untold = NamedStream::new(handle(0x5000), None);
        assert_eq!(
            untold.release_on(here, |_| None),
            ReleaseOn::Stream(handle(0x5000))
        );
    }

    #[test]
    fn an_unnamed_stream_costs_a_device_wait() {
        let named = NamedStream::new(ConsumerStream::ANY, None);
        assert_eq!(
            named.release_on(std::thread::current().id(), |_| None),
            ReleaseOn::Device
        );
    }

    #[test]
    fn every_stream_is_tried_and_a_failure_falls_back_to_the_device() {
        let plan = [
            ReleaseOn::Stream(handle(10)),
            ReleaseOn::Stream(handle(11)),
            ReleaseOn::Stream(handle(12)),
        ];
        let mut tried = vec![];
        let (device_wait, failures) = order_release(plan, |stream| {
            tried.push(stream.as_raw());
            if stream.as_raw() == 11 {
                Err("bad handle")
            } else {
                Ok(())
            }
        });
        assert_eq!(tried, [10, 11, 12], "a bad stream does not stop the others");
        assert!(device_wait, "a failed ordering leaves only the device wait");
        assert_eq!(failures, [(handle(11), "bad handle")]);

        let (device_wait, failures) =
            order_release([ReleaseOn::Stream(handle(10))], |_| Ok::<(), ()>(()));
        assert!(
            !device_wait && failures.is_empty(),
            "all ordered: no device wait"
        );
        let (device_wait, _) =
            order_release([ReleaseOn::Device, ReleaseOn::Stream(handle(10))], |_| {
                Ok::<(), ()>(())
            });
        assert!(device_wait);
    }
}
