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

/// A feed's running totals with the `epoch` and `step` of its next batch,
/// in Prometheus' text format, every sample labelled with `labels` (in
/// order): the formatter of the CLI's `--prometheus`, so both faces write
/// the same metrics. A bad label name is a `PlanError` naming it.
#[pyfunction]
#[pyo3(signature = (*, rows, batches, bytes, wall_s, wait_s, h2d_s, prefetch, epoch, step, labels))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn prometheus_text(
    rows: u64,
    batches: u64,
    bytes: u64,
    wall_s: f64,
    wait_s: f64,
    h2d_s: f64,
    prefetch: usize,
    epoch: u64,
    step: u64,
    labels: Vec<(String, String)>,
) -> PyResult<String> {
    let report = sqlfeed::feed::FeedReport {
        wall_s,
        batches,
        rows,
        bytes,
        wait_s,
        h2d_s,
        prefetch,
        // Not exported: the first wait, conversion, stalls and padding.
        first_wait_s: 0.0,
        convert_s: 0.0,
        stall_s: 0.0,
        ttfb_s: None,
        padding_frac: None,
        pack_imbalance: None,
    };
    sqlfeed::feed::prometheus_text(&report, epoch, step, &labels).py_err()
}

/// Writes `text` to `path` whole (a temporary file renamed over it) with
/// the mode a plain `open()` gives under the umask: the writer of the CLI's
/// `--prometheus`, so both faces write files node_exporter can read.
#[pyfunction]
pub(crate) fn write_whole(path: std::path::PathBuf, text: &str) -> PyResult<()> {
    sqlfeed::feed::write_whole(&path, text).map_err(|e| {
        pyo3::exceptions::PyOSError::new_err(format!(
            "cannot write {}: {e}",
            path.display()
        ))
    })
}
