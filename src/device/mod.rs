//! The device side of a feed: tensors, the slot ring they live in, and the
//! CPU and CUDA backends. **All of sqlfeed's `unsafe` lives in this module.**
//!
//! # Data flow
//! ```text
//!   record batches (Arrow) ──► converter (feed::convert) writes rows into a free slot
//!                                   │
//!            ┌──────────────────────▼───────────────────────────┐
//!            │ slot k: one host buffer per tensor               │
//!            │   CPU backend:  page-aligned, reused every round  │
//!            │   CUDA backend: page-locked (pinned) staging      │
//!            └──────────────────────┬───────────────────────────┘
//!                CPU: nothing to do │ CUDA: cuMemcpyHtoDAsync on the copy
//!                                   │ stream into the slot's device buffers,
//!                                   ▼ then an event recorded for this batch
//!   ring of `prefetch + 1` slots ──► consumer: `next()` waits for its own
//!        ▲                           batch's event only, reads tensors
//!        │                           (more slots are lent while the loop
//!        │                            holds them all and the budget allows)
//!        └──── slot returns when the batch and every tensor or DLPack
//!              export of it has been dropped (CUDA: the copy stream waits
//!              for the work queued on the consumer's streams until then)
//! ```
//!
//! # Memory
//! A slot's buffers grow to the largest batch seen and are then reused, so
//! steady state allocates nothing and touches no fresh pages. Memory is
//! `(prefetch + 1) × bytes of one tensor batch` on the host, plus the same on
//! the device for CUDA.
//!
//! # Errors
//! Asking for `cuda:N` on a machine without a usable driver or device is an
//! error that says which, never a panic: cudarc panics when the driver library
//! is missing, so we check [`cuda_available`] first and catch panics as a
//! backstop.

// The one module where `unsafe` is allowed (the crate denies it elsewhere):
// FFI to the CUDA driver, page-locked buffers, DLPack tensors.
#![allow(unsafe_code)]

#[cfg(feature = "cuda")]
mod cuda;
mod dlpack;
mod dtype;
mod host;
mod ring;
mod simd;
mod slot;
mod stream;
mod tensor;

use std::fmt;
use std::str::FromStr;

use datafusion::common::{plan_datafusion_err, plan_err};
use datafusion::error::{DataFusionError, Result};

pub use dlpack::{
    Access, DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_FLAG_READ_ONLY, DLPackManaged, DLPackVersion, DLTensor, hand_over,
};
pub(crate) use dtype::cast_slice_mut;
pub use dtype::{DType, Element, bf16, f16};
pub(crate) use ring::{Loans, SlotPool};
pub(crate) use simd::u8_to_f32_affine;
pub(crate) use slot::{Backend, Slot, TensorLayout};
pub use stream::ConsumerStream;
pub use tensor::{BatchMeta, Tensor, TensorBatch};

/// Where a feed's tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory (page-aligned buffers).
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// `Cuda(0)` when a CUDA driver and at least one device are usable, else
    /// `Cpu`.
    pub fn auto() -> Device {
        if cuda_device_count() > 0 {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

impl FromStr for Device {
    type Err = DataFusionError;

    /// `auto`, `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
    fn from_str(text: &str) -> Result<Self> {
        let text = text.trim().to_ascii_lowercase();
        match text.as_str() {
            "auto" => Ok(Device::auto()),
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => text
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    plan_datafusion_err!(
                        "unknown device '{text}': expected auto, cpu, cuda or cuda:N"
                    )
                }),
        }
    }
}

/// Whether this build can use CUDA and a driver library is present.
pub fn cuda_available() -> bool {
    #[cfg(feature = "cuda")]
    {
        cuda::driver_present()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// The number of usable CUDA devices (0 without a driver, without devices or
/// in a build without the `cuda` feature).
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        cuda::device_count().unwrap_or(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// Bytes per second of raw pinned host-to-device copies on `device`:
/// `iters` rounds of one `cuMemcpyHtoDAsync` per entry of `sizes` (the sizes
/// of one batch's tensors). The yardstick for the feed's H2D rate.
#[cfg_attr(not(feature = "cuda"), expect(unused_variables))]
pub fn raw_h2d_bytes_per_s(device: Device, sizes: &[usize], iters: usize) -> Result<f64> {
    match Backend::try_new(device)? {
        Backend::Cpu => {
            plan_err!("the H2D benchmark needs a CUDA device (--device cuda:N)")
        }
        #[cfg(feature = "cuda")]
        Backend::Cuda(cuda) => {
            let elapsed = cuda.raw_h2d(sizes, iters)?;
            let bytes = sizes.iter().sum::<usize>() * iters;
            Ok(bytes as f64 / elapsed.as_secs_f64().max(1e-9))
        }
    }
}

/// The CUDA backend for a test that needs a GPU: `None` with a visible
/// "SKIPPED" line where there is none, or a failure when
/// `SQLFEED_TEST_CUDA=require` (what `scripts/gpu-check.sh` sets), so a GPU
/// run can never pass by skipping.
#[cfg(test)]
pub(crate) fn cuda_for_test(test: &str) -> Option<Backend> {
    let required = std::env::var("SQLFEED_TEST_CUDA").is_ok_and(|v| v == "require");
    match Backend::try_new(Device::Cuda(0)) {
        Ok(backend) => Some(backend),
        Err(err) if required => {
            panic!("{test}: SQLFEED_TEST_CUDA=require but CUDA is unusable: {err}")
        }
        Err(_) => {
            // Straight to stderr, past the test harness's capture, so that
            // the skip shows in a passing run too.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: no CUDA device (SQLFEED_TEST_CUDA=require fails instead)"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() -> Result<()> {
        assert_eq!("cpu".parse::<Device>()?, Device::Cpu);
        assert_eq!("CUDA:3".parse::<Device>()?, Device::Cuda(3));
        assert_eq!("cuda".parse::<Device>()?, Device::Cuda(0));
        let err = "tpu:0".parse::<Device>().unwrap_err().to_string();
        assert!(err.contains("tpu:0") && err.contains("cuda:N"), "{err}");
        // `auto` never fails: it falls back to the CPU without a GPU.
        let auto: Device = "auto".parse()?;
        assert!(auto == Device::Cpu || auto == Device::Cuda(0));
        Ok(())
    }
}
