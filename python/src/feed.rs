//! `Feed`, `Batch` and `Tensor`: one pass of a training feed, its batches,
//! and their tensors as DLPack producers.
//!
//! ```text
//!  Feed.__next__ ─► GIL released, wait ≤ 100 ms for the Rust feed's next
//!        │          batch, GIL back, check Ctrl-C, repeat
//!        ▼
//!  Batch {name: Tensor} ─► framework.from_dlpack(tensor) ─► __dlpack__(stream=…)
//!                           capsule over the slot's memory, no copy
//!
//!  Feed._next_dict(importer) ─► the same wait, then per tensor in Rust:
//!        capsule ─► importer(capsule) (torch._C._from_dlpack) ─► {name: tensor}
//!        one call from Python per batch (format='torch' and 'numpy')
//! ```
//! A `Tensor` keeps its batch's slot on loan (the batch contract): the feed
//! reuses the memory only after every `Tensor` object and every DLPack
//! capsule or framework tensor made from it is gone.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::error::Result;
use pyo3::exceptions::{PyBufferError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use sqlfeed::Session;
use sqlfeed::device::{ConsumerStream, DType, Device, Tensor, TensorBatch};
use sqlfeed::feed::{
    Checkpoint, ColumnSpec, Feed, FeedBuilder, FeedReport, LongDocuments, NextBatch,
    OnError, PackOptions, QuarantineLimit, QuarantinedRow, Timeline,
};

use crate::dlpack;
use crate::errors::{IntoPy, PlanError, to_py};
use crate::position::{PositionArg, PyFeedPosition, position_of};

/// How long one wait for a batch lasts before Ctrl-C is checked.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// How one column becomes a tensor, as the pure-Python layer passes it:
/// `(name, dtype, shape, scale, offset, pad_to, pad_value, fill_null, unit)`.
type ColumnOptions = (
    String,
    Option<String>,
    Option<Vec<usize>>,
    Option<f64>,
    Option<f64>,
    Option<usize>,
    Option<f64>,
    Option<f64>,
    Option<String>,
);

fn column_spec(options: &ColumnOptions) -> Result<(String, ColumnSpec)> {
    let (name, dtype, shape, scale, offset, pad_to, pad_value, fill_null, unit) = options;
    let mut spec = ColumnSpec::new();
    if let Some(dtype) = dtype {
        spec = spec.dtype(dtype.parse::<DType>()?);
    }
    if let Some(shape) = shape {
        spec = spec.shape(shape.iter().copied());
    }
    if let Some(scale) = scale {
        spec = spec.scale(*scale);
    }
    if let Some(offset) = offset {
        spec = spec.offset(*offset);
    }
    if let Some(len) = pad_to {
        spec = spec.pad_to(*len);
    }
    if let Some(value) = pad_value {
        spec = spec.pad_value(*value);
    }
    if let Some(value) = fill_null {
        spec = spec.fill_null(*value);
    }
    if let Some(unit) = unit {
        spec = spec.unit(ColumnSpec::parse_unit(unit, name)?);
    }
    Ok((name.clone(), spec))
}

/// One pass of a feed, as the pure-Python `sqlfeed.Feed` describes it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct FeedOptions {
    query: String,
    /// `"fail"` or `"quarantine"` (absent: fail).
    #[pyo3(default)]
    on_error: Option<String>,
    /// `max_quarantined` as text: a count, a percentage or a fraction.
    #[pyo3(default)]
    max_quarantined: Option<String>,
    batch_size: usize,
    shuffle: Option<u64>,
    /// Rows per window of a windowed shuffle (absent: the exact shuffle).
    #[pyo3(default)]
    shuffle_window: Option<u64>,
    /// An exact shuffle keyed by the rows' files and rows.
    #[pyo3(default)]
    shuffle_by_position: bool,
    /// The pass runs from `position` (absent: the start of epoch 0) to the
    /// end of epoch `end_epoch - 1`.
    end_epoch: u64,
    /// Where the pass starts: the feed's position (see `position.rs`),
    /// with its skipped steps, continuation and Delta Lake versions.
    #[pyo3(default)]
    position: Option<PositionArg>,
    drop_last: bool,
    prefetch: usize,
    rank: usize,
    world: usize,
    device: String,
    columns: Vec<ColumnOptions>,
    batch_tokens: Option<usize>,
    bucket_by_length: Option<usize>,
    /// `pack`: max tokens per sequence.
    #[pyo3(default)]
    pack: Option<usize>,
    #[pyo3(default)]
    pack_window: Option<usize>,
    #[pyo3(default)]
    pack_long: Option<String>,
    #[pyo3(default)]
    pack_flat: bool,
    cache: bool,
    order_lanes: Option<usize>,
    run_id: String,
}

/// A quarantined row as Python receives it: `(epoch, position, function,
/// column, error)`.
pub(crate) type QuarantineTuple = (u64, u64, String, String, String);

pub(crate) fn quarantine_tuple(row: QuarantinedRow) -> QuarantineTuple {
    (row.epoch, row.position, row.function, row.column, row.error)
}

impl FeedOptions {
    /// Starts the pass.
    pub(crate) fn build(self, session: &Session) -> Result<Feed> {
        self.builder(session)?.build()
    }

    /// The feed described, for a position rather than a pass: a position
    /// is not bounded by a pass's last epoch (`end_epoch` is not read).
    pub(crate) fn position_builder(self, session: &Session) -> Result<FeedBuilder> {
        Ok(self.builder(session)?.epochs(u64::MAX))
    }

    /// The pass described, not started.
    pub(crate) fn builder(self, session: &Session) -> Result<FeedBuilder> {
        let mut builder = Feed::builder(session, self.query)
            .batch_size(self.batch_size)
            .drop_last(self.drop_last)
            .prefetch(self.prefetch)
            .shard(self.rank, self.world)
            .epochs(self.end_epoch)
            .device(self.device.parse::<Device>()?)
            .cache(self.cache)
            .run_id(self.run_id);
        if let Some(PositionArg(position)) = &self.position {
            builder = position.apply(builder)?;
        }
        builder = builder
            .given(self.shuffle, FeedBuilder::shuffle)
            .given(self.shuffle_window, FeedBuilder::shuffle_window)
            .given(self.shuffle_by_position.then_some(()), |builder, ()| {
                builder.shuffle_by_position()
            })
            .given(self.batch_tokens, FeedBuilder::batch_tokens)
            .given(self.bucket_by_length, FeedBuilder::bucket_by_length)
            .given(self.order_lanes, FeedBuilder::order_lanes);
        if let Some(max_tokens) = self.pack {
            builder = builder.pack(PackOptions {
                max_tokens,
                window: self.pack_window.unwrap_or(PackOptions::DEFAULT_WINDOW),
                long: LongDocuments::parse(self.pack_long.as_deref().unwrap_or("split"))?,
                flat: self.pack_flat,
            });
        } else if self.pack_window.is_some() || self.pack_long.is_some() || self.pack_flat
        {
            return datafusion::common::plan_err!(
                "pack_window, pack_long and pack_flat need pack=MAX_TOKENS"
            );
        }
        for options in &self.columns {
            let (name, spec) = column_spec(options)?;
            builder = builder.column(name, spec);
        }
        let limit = self
            .max_quarantined
            .as_deref()
            .map(QuarantineLimit::parse)
            .transpose()?;
        match self.on_error.as_deref() {
            None | Some("fail") if limit.is_none() => {}
            None | Some("fail") => {
                return datafusion::common::plan_err!(
                    "max_quarantined needs on_error='quarantine'"
                );
            }
            Some("quarantine") => {
                builder =
                    builder.on_error(OnError::Quarantine(limit.unwrap_or_default()));
            }
            Some(other) => {
                return datafusion::common::plan_err!(
                    "on_error={other:?}: expected 'fail' (the default) or 'quarantine'"
                );
            }
        }
        Ok(builder)
    }
}

/// A running pass of a feed; iterating yields `Batch`es.
#[pyclass(module = "sqlfeed._sqlfeed", name = "RawFeed", frozen)]
pub(crate) struct PyFeed {
    /// `None` once finished, failed or closed.
    inner: Mutex<Option<Feed>>,
    /// The metrics as they were when the feed was taken out.
    last: Mutex<Option<Snapshot>>,
    /// Where the pass's time went; it outlives the feed.
    timeline: Arc<Timeline>,
}

impl Drop for PyFeed {
    /// A feed dropped by Python's garbage collector: its threads stop with
    /// the GIL released, since one may be waiting for it to finish a Python
    /// function of the query.
    fn drop(&mut self) {
        let feed = self.inner.get_mut().ok().and_then(Option::take);
        if let Some(feed) = feed {
            // None while the interpreter shuts down: dropped as it is.
            let _ = Python::try_attach(|py| py.detach(|| drop(feed)));
        }
    }
}

/// A feed's metrics, kept after the feed is gone.
#[derive(Clone)]
struct Snapshot {
    report: FeedReport,
    epoch_seconds: Vec<(u64, f64)>,
    epoch_mixtures: Vec<(u64, Vec<(String, u64)>)>,
    device: String,
    /// The position after the batch last handed over.
    position: Option<Checkpoint>,
    /// The rows the pass quarantined.
    quarantined: Vec<QuarantinedRow>,
}

impl Snapshot {
    fn of(feed: &Feed) -> Self {
        Self {
            report: feed.report(),
            epoch_seconds: feed.epoch_seconds().to_vec(),
            epoch_mixtures: feed.epoch_mixtures().to_vec(),
            device: feed.device().to_string(),
            position: feed.checkpoint().ok(),
            quarantined: feed.quarantined(),
        }
    }
}

impl PyFeed {
    /// The next batch (`None` at the end), waiting with the GIL released
    /// and checking for Ctrl-C between waits; a finished, failed or
    /// interrupted feed is dropped without the GIL.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<TensorBatch>> {
        loop {
            let polled = py.detach(|| {
                let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                match guard.as_mut() {
                    Some(feed) => feed.next_within(SIGNAL_CHECK),
                    None => NextBatch::Finished,
                }
            });
            match polled {
                NextBatch::Ready(batch) => return Ok(Some(batch)),
                NextBatch::Failed(err) => {
                    let feed = self.take();
                    py.detach(|| drop(feed));
                    return Err(to_py(err));
                }
                NextBatch::Finished => {
                    let feed = self.take();
                    py.detach(|| drop(feed));
                    return Ok(None);
                }
                NextBatch::Pending => {
                    if let Err(interrupt) = py.check_signals() {
                        // Ctrl-C: stop the query and its threads now, then
                        // let the KeyboardInterrupt through.
                        let feed = self.take();
                        py.detach(|| drop(feed));
                        return Err(interrupt);
                    }
                }
            }
        }
    }

    pub(crate) fn new(feed: Feed) -> Self {
        Self {
            timeline: feed.timeline(),
            inner: Mutex::new(Some(feed)),
            last: Mutex::new(None),
        }
    }

    /// Takes the feed out, to drop it without the GIL (dropping waits for
    /// its threads); its metrics stay readable.
    fn take(&self) -> Option<Feed> {
        let feed = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(feed) = &feed {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(Snapshot::of(feed));
        }
        feed
    }
}

#[pymethods]
impl PyFeed {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<PyBatch> {
        match self.next_batch(py)? {
            Some(batch) => Ok(PyBatch::new(batch)),
            None => Err(PyStopIteration::new_err(())),
        }
    }

    /// The next batch as a dict of framework tensors, made here in one call
    /// (no `Batch` or `Tensor` objects, no `__dlpack__` round trips):
    /// `importer` is called once per tensor, with its DLPack capsule when
    /// `by_capsule` (torch's `_C._from_dlpack`), else with the tensor
    /// (`numpy.from_dlpack`, which then must be on the host: `host_only`).
    /// `stream(ordinal)` gives the consumer's current CUDA stream handle for
    /// a capsule of a CUDA tensor (torch's `current_stream().cuda_stream`),
    /// asked once per batch. Returns the tensors by name, or `None` at the
    /// end; the position after the batch is the pass's (`_position`).
    #[pyo3(signature = (importer, by_capsule, host_only, stream = None))]
    fn _next_dict<'py>(
        &self,
        py: Python<'py>,
        importer: &Bound<'py, PyAny>,
        by_capsule: bool,
        host_only: bool,
        stream: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(batch) = self.next_batch(py)? else {
            return Ok(None);
        };
        let tensors = PyDict::new(py);
        let mut consumer = None;
        for tensor in batch.tensors() {
            let device = tensor.device();
            if host_only && device != Device::Cpu {
                return Err(PlanError::new_err(format!(
                    "format='numpy' needs host tensors; '{}' is on {device}: use \
                     device='cpu' or format='torch'/'jax'",
                    tensor.name()
                )));
            }
            let imported = if by_capsule {
                let consumer = match consumer {
                    Some(consumer) => consumer,
                    None => {
                        let handle = match (device, stream) {
                            (Device::Cuda(ordinal), Some(stream)) => {
                                // As torch.from_dlpack asks: its handle 0 (the
                                // legacy default stream) is DLPack's 1.
                                match stream.call1((ordinal,))?.extract::<i64>()? {
                                    0 => Some(1),
                                    handle => Some(handle),
                                }
                            }
                            _ => None,
                        };
                        *consumer.insert(consumer_stream(device, handle)?)
                    }
                };
                importer.call1((dlpack::capsule(py, tensor, consumer, true)?,))?
            } else {
                importer.call1((PyTensor::new(tensor.clone()),))?
            };
            tensors.set_item(tensor.name(), imported)?;
        }
        Ok(Some(tensors))
    }

    /// The rows the pass quarantined so far (also once the pass is over),
    /// as `(epoch, position, function, column, error)`.
    fn _quarantined(&self) -> Vec<QuarantineTuple> {
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let rows = match guard.as_ref() {
            Some(feed) => feed.quarantined(),
            None => {
                drop(guard);
                let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
                last.as_ref()
                    .map(|snapshot| snapshot.quarantined.clone())
                    .unwrap_or_default()
            }
        };
        rows.into_iter().map(quarantine_tuple).collect()
    }

    /// The pass's position after the batch last handed over (also once
    /// the pass is over), as `Feed::checkpoint` keeps it: its data manifest
    /// is the listing the pass's order is over.
    fn _position(&self) -> PyResult<PyFeedPosition> {
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(feed) = guard.as_ref() {
            return position_of(feed.checkpoint());
        }
        drop(guard);
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match last.as_ref().and_then(|snapshot| snapshot.position.clone()) {
            Some(checkpoint) => Ok(PyFeedPosition::new(checkpoint)),
            None => Err(crate::errors::InternalError::new_err(
                "the pass has no position: it never started",
            )),
        }
    }

    /// The pass's timeline as one self-contained HTML page (see
    /// `Feed.timeline`), and its verdict.
    fn _timeline(&self, py: Python<'_>) -> (String, String) {
        let timeline = Arc::clone(&self.timeline);
        py.detach(|| {
            let (html, verdict) = timeline.page();
            (html, verdict.to_string())
        })
    }

    /// Stops the query and its threads (held batches stay valid).
    fn close(&self, py: Python<'_>) {
        let feed = self.take();
        py.detach(|| drop(feed));
    }

    /// Whether the pass still runs.
    #[getter]
    fn running(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The feed's metrics so far, and seconds per finished epoch.
    fn report(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let snapshot = {
            let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            match guard.as_ref() {
                Some(feed) => Some(Snapshot::of(feed)),
                None => self.last.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            }
        };
        let dict = pyo3::types::PyDict::new(py);
        if let Some(snapshot) = snapshot {
            let r = snapshot.report;
            dict.set_item("wall_s", r.wall_s)?;
            dict.set_item("batches", r.batches)?;
            dict.set_item("rows", r.rows)?;
            dict.set_item("bytes", r.bytes)?;
            dict.set_item("wait_s", r.wait_s)?;
            dict.set_item("first_wait_s", r.first_wait_s)?;
            dict.set_item("h2d_s", r.h2d_s)?;
            dict.set_item("convert_s", r.convert_s)?;
            dict.set_item("stall_s", r.stall_s)?;
            dict.set_item("ttfb_s", r.ttfb_s)?;
            dict.set_item("padding_frac", r.padding_frac)?;
            dict.set_item("pack_imbalance", r.pack_imbalance)?;
            dict.set_item("prefetch", r.prefetch)?;
            dict.set_item("epoch_seconds", snapshot.epoch_seconds)?;
            dict.set_item("epoch_mixtures", snapshot.epoch_mixtures)?;
            dict.set_item("device", snapshot.device)?;
        }
        Ok(dict.into_any().unbind())
    }
}

/// One batch: its tensors by name, and where it sits in the feed.
#[pyclass(module = "sqlfeed._sqlfeed", name = "Batch", frozen)]
pub(crate) struct PyBatch {
    /// The epoch.
    #[pyo3(get)]
    epoch: u64,
    /// The step within the epoch on this rank.
    #[pyo3(get)]
    step: u64,
    /// Rows (samples) in the batch.
    #[pyo3(get)]
    rows: usize,
    /// Whether this is the rank's last batch of its epoch.
    #[pyo3(get)]
    last_in_epoch: bool,
    /// `(epoch, step)` of the batch after this one (`(epoch + 1, 0)` after
    /// the epoch's last): the position a checkpoint taken after it stores.
    #[pyo3(get)]
    next_position: (u64, u64),
    /// `(epoch, rows)` after this batch: rows of the epoch's order all ranks
    /// together consumed (`(epoch + 1, 0)` after the epoch's last).
    #[pyo3(get)]
    next_row_position: (u64, u64),
    /// The tensors, in column order (masks after their column).
    tensors: Vec<Tensor>,
}

impl PyBatch {
    fn new(batch: sqlfeed::device::TensorBatch) -> Self {
        Self {
            epoch: batch.epoch(),
            step: batch.step(),
            rows: batch.rows(),
            last_in_epoch: batch.is_last_in_epoch(),
            next_position: batch.next_position(),
            next_row_position: batch.next_row_position(),
            tensors: batch.tensors().to_vec(),
        }
    }
}

#[pymethods]
impl PyBatch {
    /// Tensor names in order.
    fn keys(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name().to_string()).collect()
    }

    /// The tensors in order.
    fn tensors(&self) -> Vec<PyTensor> {
        self.tensors.iter().cloned().map(PyTensor::new).collect()
    }

    fn __getitem__(&self, name: &str) -> PyResult<PyTensor> {
        self.tensors
            .iter()
            .find(|t| t.name() == name)
            .cloned()
            .map(PyTensor::new)
            .ok_or_else(|| {
                pyo3::exceptions::PyKeyError::new_err(format!(
                    "the batch has no tensor '{name}'; it has: {}",
                    self.keys().join(", ")
                ))
            })
    }

    fn __len__(&self) -> usize {
        self.tensors.len()
    }

    /// Tells the feed that the batch's tensors are read on the CUDA stream
    /// `stream` (like `torch.Tensor.record_stream`): see
    /// `Tensor.use_on_stream`; a no-op on the CPU.
    fn use_on_stream(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        match self.tensors.first() {
            Some(tensor) => use_on_stream(py, tensor, stream),
            None => Ok(()),
        }
    }

    fn __repr__(&self) -> String {
        let tensors: Vec<String> =
            self.tensors.iter().map(|t| format!("{t:?}")).collect();
        format!(
            "sqlfeed.Batch(epoch={}, step={}, rows={}, tensors=[{}])",
            self.epoch,
            self.step,
            self.rows,
            tensors.join(", ")
        )
    }
}

/// One tensor of a batch: a DLPack producer over the feed's memory.
#[pyclass(module = "sqlfeed._sqlfeed", name = "Tensor", frozen)]
pub(crate) struct PyTensor {
    tensor: Tensor,
}

impl PyTensor {
    fn new(tensor: Tensor) -> Self {
        Self { tensor }
    }
}

#[pymethods]
impl PyTensor {
    /// The DLPack protocol: a capsule over this tensor's memory, without a
    /// copy. `stream` is the consumer's CUDA stream (None or 1: the legacy
    /// default stream, 2: per-thread, -1: no synchronisation wanted,
    /// other: a `cudaStream_t` of the feed's device that stays alive while
    /// the result is used); it waits for the batch's copies and the memory
    /// is reused only after the work queued on it. With `max_version >=
    /// (1, 0)` the capsule is a read-only DLPack 1.x one.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "sqlfeed tensors are exported without a copy; copy after importing \
                 (e.g. tensor.clone())",
            ));
        }
        let device = self.__dlpack_device__();
        if let Some(wanted) = dl_device
            && wanted != device
        {
            let wanted_name = match wanted {
                (1, _) => "cpu".to_string(),
                (2, ordinal) => format!("cuda:{ordinal}"),
                (kind, ordinal) => format!("DLPack device type {kind} #{ordinal}"),
            };
            return Err(PyBufferError::new_err(format!(
                "tensor '{}' is on {}, not {wanted_name}: build the feed with \
                 device='{wanted_name}' (sqlfeed exports without copying)",
                self.tensor.name(),
                self.tensor.device()
            )));
        }
        let consumer = consumer_stream(self.tensor.device(), stream)?;
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        dlpack::capsule(py, &self.tensor, consumer, versioned)
    }

    /// Tells the feed that this tensor (and its batch, which shares its
    /// memory) is read on the CUDA stream `stream`, as Rust's
    /// `Tensor::use_on_stream`: `stream` waits for the batch's copies now,
    /// and the memory is reused only after the work queued on `stream`
    /// before the batch's last reference is released. `stream` is a
    /// `torch.cuda.Stream` (or anything with `cuda_stream`), a CuPy stream
    /// (anything with `ptr`), or a raw handle (0 or 1: the legacy default
    /// stream, 2: the per-thread one) of the feed's device, which must stay
    /// alive until the batch is released. A no-op on the CPU.
    fn use_on_stream(&self, py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
        use_on_stream(py, &self.tensor, stream)
    }

    /// `(device_type, device_id)`: (1, 0) for the CPU, (2, N) for cuda:N.
    fn __dlpack_device__(&self) -> (i32, i32) {
        match self.tensor.device() {
            Device::Cpu => (1, 0),
            Device::Cuda(ordinal) => (2, ordinal as i32),
        }
    }

    /// The tensor's name (its column, or `<column>_mask`).
    #[getter]
    fn name(&self) -> String {
        self.tensor.name().to_string()
    }

    /// The element type (`float32`, `int64`, …).
    #[getter]
    fn dtype(&self) -> String {
        self.tensor.dtype().to_string()
    }

    /// Dimensions, batch first.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.tensor.shape().to_vec()
    }

    /// `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.tensor.device().to_string()
    }

    /// Address of the first element (host or device pointer).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.tensor.data_ptr() as usize
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.tensor.nbytes()
    }

    /// A copy of the bytes in host memory.
    fn to_bytes<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let bytes = py.detach(|| self.tensor.to_host_bytes()).py_err()?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    fn __repr__(&self) -> String {
        format!("sqlfeed.{:?}", self.tensor)
    }
}

/// The consumer stream named by a DLPack `stream` argument.
#[allow(unsafe_code)] // the DLPack stream handle (see the SAFETY note below)
fn consumer_stream(device: Device, stream: Option<i64>) -> PyResult<ConsumerStream> {
    match (device, stream) {
        (_, None) | (Device::Cpu, Some(-1)) => Ok(ConsumerStream::LEGACY_DEFAULT),
        (Device::Cpu, Some(other)) => Err(PyBufferError::new_err(format!(
            "stream={other} for a CPU tensor; the DLPack protocol expects None"
        ))),
        // -1: the consumer asks for no synchronisation and names no stream;
        // its reads are ordered after our copies (the batch was handed over
        // once they completed), and the feed waits for the whole device
        // before it reuses the memory (sqlfeed's device/stream.rs).
        (Device::Cuda(_), Some(-1)) => Ok(ConsumerStream::ANY),
        (Device::Cuda(_), Some(1)) => Ok(ConsumerStream::LEGACY_DEFAULT),
        (Device::Cuda(_), Some(2)) => Ok(ConsumerStream::PER_THREAD_DEFAULT),
        (Device::Cuda(_), Some(0)) => Err(PyBufferError::new_err(
            "stream=0 is ambiguous in the DLPack protocol; pass 1 for the legacy \
             default stream or 2 for the per-thread one",
        )),
        (Device::Cuda(_), Some(handle)) if handle > 2 => {
            // SAFETY: the DLPack protocol (or, for `use_on_stream`, its
            // documented contract) makes the consumer pass a live stream of
            // the tensor's device (another context's is refused by the
            // export). That it outlives the tensor's release, which
            // `from_raw` also asks, DLPack does not promise: PyTorch's streams
            // live as long as the process; one destroyed earlier (CuPy's may
            // be collected first) is noticed, as a best effort, by its id,
            // and the feed then waits for the whole device instead.
            Ok(unsafe { ConsumerStream::from_raw(handle as u64) })
        }
        (Device::Cuda(_), Some(other)) => Err(PyBufferError::new_err(format!(
            "stream={other} is not a CUDA stream"
        ))),
    }
}

/// `Tensor.use_on_stream` / `Batch.use_on_stream`: `stream` as a raw handle.
fn use_on_stream(
    py: Python<'_>,
    tensor: &Tensor,
    stream: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let handle = ["cuda_stream", "ptr"]
        .into_iter()
        .find_map(|attribute| stream.getattr(attribute).ok())
        .unwrap_or_else(|| stream.clone());
    let handle = handle.extract::<i64>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "use_on_stream({}): expected a torch.cuda.Stream, a CuPy stream or a raw \
             CUDA stream handle (int)",
            stream
                .repr()
                .map_or_else(|_| "?".to_string(), |r| r.to_string())
        ))
    })?;
    if tensor.device() == Device::Cpu {
        return Ok(());
    }
    // A raw handle: 0 is the NULL stream, i.e. the legacy default stream
    // (what `torch.cuda.default_stream().cuda_stream` gives).
    let consumer =
        consumer_stream(tensor.device(), Some(if handle == 0 { 1 } else { handle }))?;
    py.detach(|| tensor.use_on_stream(consumer)).py_err()
}
