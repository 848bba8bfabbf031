//! `EpochDataset`: one epoch of a feed shuffled in windows or by position,
//! by position (`sqlfeed.Feed.dataset`), over `sqlfeed::feed::EpochDataset`.
//!
//! ```text
//!  Feed.dataset(epoch)[i] ─► _row(i) ─► row i as a one-row SqlResult ─► pyarrow ─► dict
//! ```
//! Counting and reading windows or row groups run on a thread of their own while the
//! caller waits with its signals answered (`crate::wait`).

use std::sync::Arc;

use pyo3::prelude::*;
use sqlfeed::Session;
use sqlfeed::feed::EpochDataset;

use crate::errors::IntoPy;
use crate::result::PySqlResult;
use crate::session::SessionRuntime;

/// One epoch of a feed by position; see `sqlfeed.EpochDataset`.
#[pyclass(module = "sqlfeed._sqlfeed", name = "EpochDataset", frozen)]
pub(crate) struct PyEpochDataset {
    dataset: Arc<EpochDataset>,
    /// The session a row's result is read in.
    session: Session,
    runtime: Arc<SessionRuntime>,
}

impl PyEpochDataset {
    pub(crate) fn new(
        dataset: EpochDataset,
        session: Session,
        runtime: Arc<SessionRuntime>,
    ) -> Self {
        Self {
            dataset: Arc::new(dataset),
            session,
            runtime,
        }
    }
}

#[pymethods]
impl PyEpochDataset {
    /// The epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.dataset.epoch()
    }

    /// Rows in the epoch (the windows' or row groups' sizes are counted on
    /// first use).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let dataset = Arc::clone(&self.dataset);
        let rows = crate::wait::wait_for_call(py, "dataset-len", move || dataset.len())?;
        usize::try_from(rows).map_err(|_| {
            pyo3::exceptions::PyOverflowError::new_err(format!(
                "the epoch's {rows} rows do not fit a Python length"
            ))
        })
    }

    /// Rows per window of the epoch, in order.
    fn window_rows(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        let dataset = Arc::clone(&self.dataset);
        let rows =
            crate::wait::wait_for_call(py, "dataset-len", move || dataset.window_rows())?;
        Ok(rows.to_vec())
    }

    /// Row `position` of the epoch's order as a one-row result.
    fn _row(&self, py: Python<'_>, position: u64) -> PyResult<PySqlResult> {
        let dataset = Arc::clone(&self.dataset);
        let row =
            crate::wait::wait_for_call(py, "dataset-row", move || dataset.row(position))?;
        let df = self.session.context().read_batch(row).py_err()?;
        Ok(PySqlResult::new(
            df,
            self.session.clone(),
            Arc::clone(&self.runtime),
        ))
    }

    /// Rows `positions` of the epoch's order as one result, in that order.
    fn _rows(&self, py: Python<'_>, positions: Vec<u64>) -> PyResult<PySqlResult> {
        let dataset = Arc::clone(&self.dataset);
        let rows = crate::wait::wait_for_call(py, "dataset-rows", move || {
            dataset.rows(&positions)
        })?;
        let df = self.session.context().read_batch(rows).py_err()?;
        Ok(PySqlResult::new(
            df,
            self.session.clone(),
            Arc::clone(&self.runtime),
        ))
    }

    fn __repr__(&self) -> String {
        format!("EpochDataset(epoch={})", self.dataset.epoch())
    }
}
