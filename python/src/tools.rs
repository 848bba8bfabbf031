//! Module-level tools that are not a session: the synthetic training set of
//! `sqlfeed gen`, and the raw H2D yardstick of `sqlfeed h2d-bench` (both
//! also what the GPU check runs, which carries no CLI).

use pyo3::prelude::*;
use sqlfeed::device::Device;

use crate::errors::IntoPy;

/// Writes `rows` rows of the synthetic training set (ids, features, labels,
/// PNG and JPEG images, token lists) as `files` Parquet files into `out`, as
/// `sqlfeed gen` does; returns `(rows, bytes)` written.
#[pyfunction]
#[pyo3(signature = (out, rows, *, files = 4, seed = 42, image_size = 32))]
pub(crate) fn generate(
    py: Python<'_>,
    out: std::path::PathBuf,
    rows: u64,
    files: usize,
    seed: u64,
    image_size: u32,
) -> PyResult<(u64, u64)> {
    let mut options = sqlfeed::datagen::GenOptions::new(rows, out);
    options.files = files;
    options.seed = seed;
    options.image_size = image_size;
    let summary = py
        .detach(|| sqlfeed::datagen::generate(&options))
        .py_err()?;
    Ok((summary.rows, summary.bytes))
}

/// Bytes per second of raw pinned host-to-device copies on `device`
/// (`cuda:N`): `iters` rounds of one copy per entry of `sizes`, the sizes of
/// one batch's tensors; the yardstick for a feed's `h2d_s`.
#[pyfunction]
pub(crate) fn raw_h2d_bytes_per_s(
    py: Python<'_>,
    device: &str,
    sizes: Vec<usize>,
    iters: usize,
) -> PyResult<f64> {
    let device = device.parse::<Device>().py_err()?;
    py.detach(|| sqlfeed::device::raw_h2d_bytes_per_s(device, &sizes, iters))
        .py_err()
}
