//! `Session`: a sqlfeed session (memory budget, spill folder, cache, object
//! stores, functions) and the runtime its SQL runs on.

use std::sync::Arc;

use pyo3::prelude::*;
use sqlfeed::Session;
use sqlfeed::session::SessionBuilder;

use crate::errors::{IntoPy, PlanError};
use crate::feed::{FeedOptions, PyFeed};
use crate::result::PySqlResult;

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

/// One file a query reads, as Python gets it: `(location, size,
/// modified_ns, e_tag)`.
type InputFileRow = (String, u64, i64, Option<String>);

/// `(seed, world, batch_size, batch_tokens, drop_last, bucketed)` of a feed.
type FeedShapeArgs = (Option<u64>, usize, usize, Option<usize>, bool, bool);

/// `(epoch, step, rows, skipped steps by epoch, continuation as JSON)`.
type ResumePointRow = (u64, u64, Option<u64>, Vec<(u64, Vec<u64>)>, Option<String>);

impl PySession {
    /// The files `query` reads (its data manifest), listed without the GIL.
    /// The Delta Lake tables `query` names are read at `delta_versions`
    /// (a checkpoint's pins; empty: their newest versions).
    fn input_files(
        &self,
        py: Python<'_>,
        query: &str,
        delta_versions: &std::collections::BTreeMap<String, u64>,
    ) -> PyResult<Vec<sqlfeed::cache::InputFile>> {
        let session = self.session.clone();
        py.detach(|| {
            self.runtime.block_on(sqlfeed::feed::input_files_at(
                &session,
                query,
                delta_versions,
            ))
        })
        .py_err()
    }
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
    ) -> PyResult<Self> {
        let mut builder = Session::builder();
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
        let df = py.detach(|| self.runtime.block_on(session.sql(query)));
        Ok(PySqlResult::new(
            df.py_err()?,
            self.session.clone(),
            Arc::clone(&self.runtime),
        ))
    }

    /// The files `query` reads, as `(location, size, modified_ns, e_tag)`
    /// sorted by location: what a feed's checkpoint records of its data.
    fn _input_files(&self, py: Python<'_>, query: &str) -> PyResult<Vec<InputFileRow>> {
        Ok(self
            .input_files(py, query, &Default::default())?
            .into_iter()
            .map(|f| (f.location, f.size, f.modified_ns, f.e_tag))
            .collect())
    }

    /// Where a feed of `query` and shape `(seed, world, batch_size,
    /// batch_tokens, drop_last, bucketed)` resumes the checkpoint `state`
    /// (JSON) over the data as it is now: `(epoch, step, rows, skipped,
    /// appended)`, `appended` as JSON; see `sqlfeed.Feed.load_state_dict`
    /// and `sqlfeed::feed::Checkpoint::resume_point`, whose rule this is.
    fn _resume_point(
        &self,
        py: Python<'_>,
        query: &str,
        state: &str,
        shape: FeedShapeArgs,
        on_data_change: &str,
    ) -> PyResult<ResumePointRow> {
        let (seed, world, batch_size, batch_tokens, drop_last, bucketed) = shape;
        let here = sqlfeed::feed::FeedShape {
            query: sqlfeed::feed::query_fingerprint(query),
            seed,
            world,
            batch_size,
            batch_tokens,
            drop_last,
            bucketed,
        };
        let on_data_change: sqlfeed::feed::OnDataChange =
            on_data_change.parse().py_err()?;
        let checkpoint =
            sqlfeed::feed::Checkpoint::from_json(state, "the state").py_err()?;
        let now = self.input_files(py, query, &checkpoint.delta_versions)?;
        let point = checkpoint
            .resume_point(&here, &now, on_data_change)
            .py_err()?;
        let appended = point
            .appended
            .map(|appended| serde_json::to_string(&appended).unwrap_or_default());
        Ok((
            point.epoch,
            point.step,
            point.rows,
            point
                .skipped
                .into_iter()
                .map(|(epoch, steps)| (epoch, steps.into_iter().collect()))
                .collect(),
            appended,
        ))
    }

    /// Starts a feed pass; see `sqlfeed.Feed` (which calls this).
    fn _start_feed(&self, py: Python<'_>, options: FeedOptions) -> PyResult<PyFeed> {
        let session = self.session.clone();
        py.detach(|| options.build(&session))
            .py_err()
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
        let origins = py
            .detach(|| options.builder(&session)?.explain_batch(epoch, step))
            .py_err()?;
        Ok(origins
            .rows
            .into_iter()
            .map(|row| (row.file, row.row_group, row.row))
            .collect())
    }

    /// Registers a Python function (see `sqlfeed.functions`); replaces a
    /// Python function of the same name, refuses to shadow any other.
    #[pyo3(signature = (name, invoke, returns, inputs, arg_count, volatility, identity, costly, qualname, seed))]
    #[allow(clippy::too_many_arguments)]
    fn _register_function(
        &self,
        name: String,
        invoke: Py<PyAny>,
        returns: Bound<'_, PyAny>,
        inputs: Option<Bound<'_, PyAny>>,
        arg_count: Option<usize>,
        volatility: String,
        identity: String,
        costly: bool,
        qualname: String,
        seed: Option<u64>,
    ) -> PyResult<()> {
        crate::functions::check_name_free(&self.session, &name).py_err()?;
        let udf = crate::functions::python_udf(crate::functions::FunctionSpec {
            name,
            invoke,
            returns,
            inputs,
            arg_count,
            volatility,
            identity,
            costly,
            qualname,
            seed,
        })?;
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
