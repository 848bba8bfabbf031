//! `Session`: a sqlfeed session (memory budget, spill folder, cache, object
//! stores, functions) and the runtime its SQL runs on.

use std::sync::Arc;

use pyo3::prelude::*;
use sqlfeed::Session;
use sqlfeed::session::SessionBuilder;

use crate::errors::{IntoPy, PlanError};
use crate::feed::{FeedOptions, PyFeed};
use crate::position::PyFeedPosition;
use crate::result::PySqlResult;

/// A quarantined row's `(epoch, position)` and origin `(file, row_group,
/// row)`, if found.
type QuarantineOrigin = (u64, u64, Option<(String, usize, u64)>);

/// A sqlfeed session; see `sqlfeed.Session` for the documented API.
#[pyclass(module = "sqlfeed._sqlfeed", name = "Session", frozen)]
pub(crate) struct PySession {
    /// The Rust session (cheap to clone: shared state).
    pub(crate) session: Session,
    /// Runs planning and result streams (feeds have runtimes of their own).
    pub(crate) runtime: Arc<SessionRuntime>,
}

/// The session's tokio runtime, which may be dropped anywhere: by a garbage
/// collection inside a Python function that an engine thread runs (where
/// waiting for a runtime's threads is not allowed), or by the main thread
/// holding the GIL while an engine thread of a failed query still waits for
/// it to finish a Python function (waiting would deadlock). So it never
/// waits: its threads finish in the background.
pub(crate) struct SessionRuntime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for SessionRuntime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("taken only in drop")
    }
}

impl Drop for SessionRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// A memory size given as bytes or as text (`"4G"`, `"512M"`, `"25%"`).
#[derive(FromPyObject)]
pub(crate) enum MemorySize {
    /// Bytes.
    Bytes(usize),
    /// Text for `parse_memory_size`.
    Text(String),
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (
        memory_limit = None,
        target_partitions = None,
        cache_dir = None,
        cluster = None,
        spill_dir = None,
        batch_size = None,
        allow_http = None,
        plugins = Vec::new(),
        functions = Vec::new(),
    ))]
    // One parameter per keyword of `sqlfeed.Session`: Python's signature.
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        memory_limit: Option<MemorySize>,
        target_partitions: Option<usize>,
        cache_dir: Option<std::path::PathBuf>,
        cluster: Option<String>,
        spill_dir: Option<std::path::PathBuf>,
        batch_size: Option<usize>,
        allow_http: Option<bool>,
        plugins: Vec<std::path::PathBuf>,
        functions: Vec<Bound<'_, pyo3::types::PyDict>>,
    ) -> PyResult<Self> {
        let mut builder = Session::builder();
        // Functions given at the start are the session's from its build:
        // registered like sqlfeed's own, and hosted by a standalone
        // cluster's executor (`cluster="standalone"`), which runs in this
        // process.
        let hosted = functions
            .iter()
            .map(|spec| crate::functions::python_udf(spec.extract()?))
            .collect::<PyResult<Vec<_>>>()?;
        builder = builder.host_functions(hosted);
        if let Some(limit) = memory_limit {
            let bytes = match limit {
                MemorySize::Bytes(bytes) => bytes,
                MemorySize::Text(text) => sqlfeed::session::parse_memory_size(&text)
                    .map_err(|e| PlanError::new_err(format!("memory_limit: {e}")))?,
            };
            builder = builder.memory_limit(bytes);
        }
        builder = builder
            .given(target_partitions, SessionBuilder::target_partitions)
            .given(cache_dir, SessionBuilder::cache_dir)
            .given(spill_dir, SessionBuilder::spill_dir)
            .given(batch_size, SessionBuilder::batch_size)
            // None leaves it to SQLFEED_ALLOW_HTTP, as in the Rust builder.
            .given(allow_http, SessionBuilder::allow_http);
        if let Some(url) = cluster {
            #[cfg(feature = "ballista")]
            {
                builder = builder.cluster(url);
            }
            #[cfg(not(feature = "ballista"))]
            return Err(PlanError::new_err(format!(
                "cluster={url:?}: this build of the sqlfeed package has no Ballista \
                 client (a wheel built without its `full` feature)"
            )));
        }
        for library in plugins {
            builder = builder.load_plugin(library);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("sqlfeed-session")
            .enable_all()
            .build()
            .map_err(|e| PlanError::new_err(format!("cannot start threads: {e}")))?;
        let runtime = Arc::new(SessionRuntime(Some(runtime)));
        // Building a cluster session dials the scheduler: not under the GIL,
        // and inside the runtime (Ballista's client needs one).
        let session = py.detach(|| {
            let _guard = runtime.enter();
            builder.build()
        });
        Ok(Self {
            session: session.py_err()?,
            runtime,
        })
    }

    /// Plans one statement of sqlfeed SQL; runs nothing until read.
    fn sql(&self, py: Python<'_>, query: &str) -> PyResult<PySqlResult> {
        let session = self.session.clone();
        let query = query.to_owned();
        let df = crate::wait::wait_for_future(py, &self.runtime, async move {
            session.sql(&query).await
        })?;
        Ok(PySqlResult::new(
            df,
            self.session.clone(),
            Arc::clone(&self.runtime),
        ))
    }

    /// Where a feed described by `options` starts (their `position`, else
    /// the start of epoch 0): with `listed`, resolved as a pass would
    /// resolve it (the Delta Lake versions pinned, the files listed: what a
    /// state records); else as the options say, its files unknown until a
    /// pass lists them. `sqlfeed.Feed`'s position before its first pass.
    fn _start_position(
        &self,
        py: Python<'_>,
        options: FeedOptions,
        listed: bool,
    ) -> PyResult<PyFeedPosition> {
        let session = self.session.clone();
        crate::wait::wait_for_call(py, "feed-position", move || {
            let builder = options.position_builder(&session)?;
            if listed {
                builder.start_checkpoint()
            } else {
                Ok(builder.unlisted_start_checkpoint())
            }
        })
        .map(PyFeedPosition::new)
    }

    /// Where a feed described by `options` resumes the checkpoint `state`
    /// (JSON) over the data as it is now: the checkpoint's rules
    /// (`sqlfeed::feed::Checkpoint::resume_point`), as `FeedBuilder::
    /// resume_from` applies them; see `sqlfeed.Feed.load_state_dict`.
    fn _resume(
        &self,
        py: Python<'_>,
        options: FeedOptions,
        state: &str,
        on_data_change: &str,
    ) -> PyResult<PyFeedPosition> {
        let on_data_change: sqlfeed::feed::OnDataChange =
            on_data_change.parse().py_err()?;
        let checkpoint =
            sqlfeed::feed::Checkpoint::from_json(state, "the state").py_err()?;
        let session = self.session.clone();
        crate::wait::wait_for_call(py, "feed-resume", move || {
            options
                .position_builder(&session)?
                .resume_from(checkpoint, on_data_change)
                .start_checkpoint()
        })
        .map(PyFeedPosition::new)
    }

    /// Starts a feed pass; see `sqlfeed.Feed` (which calls this).
    fn _start_feed(&self, py: Python<'_>, options: FeedOptions) -> PyResult<PyFeed> {
        let session = self.session.clone();
        crate::wait::wait_for_call(py, "feed-start", move || options.build(&session))
            .map(PyFeed::new)
    }

    /// Where each row of the batch at `(epoch, step)` of the pass `options`
    /// describes came from, as `(file, row_group, row)`; see
    /// `sqlfeed.Feed.explain_batch`.
    fn _explain_batch(
        &self,
        py: Python<'_>,
        options: FeedOptions,
        epoch: u64,
        step: u64,
    ) -> PyResult<Vec<(String, usize, u64)>> {
        let session = self.session.clone();
        let origins = crate::wait::wait_for_call(py, "explain", move || {
            options.builder(&session)?.explain_batch(epoch, step)
        })?;
        Ok(origins
            .rows
            .into_iter()
            .map(|row| (row.file, row.row_group, row.row))
            .collect())
    }

    /// Epoch `epoch` of the pass `options` describes, by position; see
    /// `sqlfeed.Feed.dataset`.
    fn _dataset(
        &self,
        py: Python<'_>,
        options: FeedOptions,
        epoch: u64,
    ) -> PyResult<crate::dataset::PyEpochDataset> {
        let session = self.session.clone();
        let dataset = crate::wait::wait_for_call(py, "dataset", move || {
            options.builder(&session)?.dataset(epoch)
        })?;
        Ok(crate::dataset::PyEpochDataset::new(
            dataset,
            self.session.clone(),
            Arc::clone(&self.runtime),
        ))
    }

    /// `rows` (`(epoch, position, function, column, error)`, quarantined by
    /// the feed `options` describes) with the file, row group and row each
    /// came from; see `sqlfeed.Feed.quarantined`.
    fn _quarantine_origins(
        &self,
        py: Python<'_>,
        options: FeedOptions,
        rows: Vec<crate::feed::QuarantineTuple>,
    ) -> PyResult<Vec<QuarantineOrigin>> {
        let session = self.session.clone();
        let rows = rows
            .into_iter()
            .map(|(epoch, position, function, column, error)| {
                sqlfeed::feed::QuarantinedRow {
                    epoch,
                    position,
                    function,
                    column,
                    error,
                    origin: None,
                }
            })
            .collect();
        let resolved = crate::wait::wait_for_call(py, "quarantine-origins", move || {
            options.builder(&session)?.quarantine_origins(rows)
        })?;
        Ok(resolved
            .into_iter()
            .map(|row| {
                let origin = row.origin.map(|o| (o.file, o.row_group, o.row));
                (row.epoch, row.position, origin)
            })
            .collect())
    }

    /// Registers a Python function (see `sqlfeed.functions`) described by
    /// `spec`, a dict of `FunctionSpec`'s fields; replaces a Python function
    /// of the same name, refuses to shadow any other.
    fn _register_function(
        &self,
        spec: crate::functions::FunctionSpec<'_>,
    ) -> PyResult<()> {
        crate::functions::check_name_free(&self.session, &spec.name).py_err()?;
        let udf = crate::functions::python_udf(spec)?;
        self.session.context().register_udf(udf.as_ref().clone());
        Ok(())
    }

    /// The memory budget in bytes.
    #[getter]
    fn memory_limit(&self) -> usize {
        self.session.memory_limit()
    }

    /// This session's spill folder (removed when the session ends).
    #[getter]
    fn spill_folder(&self) -> std::path::PathBuf {
        self.session.spill_folder().to_path_buf()
    }

    fn __repr__(&self) -> String {
        format!(
            "sqlfeed.Session(memory_limit={}, spill_folder='{}')",
            self.session.memory_limit(),
            self.session.spill_folder().display()
        )
    }
}

/// The short sha-256 of a feed's SQL that its checkpoints record.
#[pyfunction]
pub(crate) fn query_fingerprint(sql: &str) -> String {
    sqlfeed::feed::query_fingerprint(sql)
}

/// The number of usable CUDA devices (0 without a driver).
#[pyfunction]
pub(crate) fn cuda_device_count() -> usize {
    sqlfeed::device::cuda_device_count()
}
