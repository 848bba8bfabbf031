//! The consumer's CUDA stream: which stream a training loop reads a batch
//! on, so that the feed orders its reuse of the batch's memory after that
//! work (the DLPack stream handshake).
//!
//! ```text
//!  export on stream S ─► S waits for the batch's copies (event `done`)
//!  consumer queues kernels on S that read the tensor, drops its reference
//!  release ─► event recorded on S, the copy stream waits for it
//!  later uploads into the slot, growth and frees run on the copy stream,
//!  so they start only after the consumer's kernels queued before the release
//! ```
//! The numbers follow the DLPack Python convention and the driver API:
//! 1 is the legacy default stream (`CU_STREAM_LEGACY`, what PyTorch's
//! default stream is), 2 the per-thread default stream
//! (`CU_STREAM_PER_THREAD`); anything else is a `CUstream` handle.

/// A CUDA stream a consumer reads a batch on; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConsumerStream(u64);

impl ConsumerStream {
    /// The legacy default stream (`CU_STREAM_LEGACY`): PyTorch's default
    /// stream, and the stream a consumer that names none is assumed to use.
    pub const LEGACY_DEFAULT: ConsumerStream = ConsumerStream(1);

    /// The per-thread default stream (`CU_STREAM_PER_THREAD`).
    pub const PER_THREAD_DEFAULT: ConsumerStream = ConsumerStream(2);

    /// A stream handle from another library (a `cudaStream_t` / `CUstream`,
    /// e.g. `torch.cuda.current_stream().cuda_stream`); 0 (the NULL stream)
    /// and 1 mean the legacy default stream, 2 the per-thread one.
    ///
    /// # Safety
    /// `handle` must be 0, 1, 2, or a stream created in the primary context
    /// of the device the feed writes to, and that stream must stay alive
    /// until every batch, tensor and DLPack export it was named for has been
    /// released: the release records an event on it.
    pub unsafe fn from_raw(handle: u64) -> ConsumerStream {
        match handle {
            0 => ConsumerStream::LEGACY_DEFAULT,
            other => ConsumerStream(other),
        }
    }

    /// The raw handle (1 and 2 are the driver's special handles).
    pub fn as_raw(self) -> u64 {
        self.0
    }
}

impl Default for ConsumerStream {
    fn default() -> Self {
        ConsumerStream::LEGACY_DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_null_stream_is_the_legacy_default() {
        // SAFETY: 0 and 7 are only compared here, never used on a device.
        let (null, other) =
            unsafe { (ConsumerStream::from_raw(0), ConsumerStream::from_raw(7)) };
        assert_eq!(null, ConsumerStream::LEGACY_DEFAULT);
        assert_eq!(ConsumerStream::default().as_raw(), 1);
        assert_eq!(other.as_raw(), 7);
    }
}
