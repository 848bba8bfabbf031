//! `FeedPosition`: where a Python `sqlfeed.Feed` is between and during its
//! passes, held as the Rust [`Checkpoint`] so that the position rules —
//! moving past a batch, resuming a state under another shape, skipping
//! steps, starting an epoch — exist once, in Rust, and the Python package
//! only carries the object.
//!
//! ```text
//!  Feed.state_dict()  ◄── position.to_json()          (the checkpoint's JSON)
//!  Feed.load_state_dict(state) ─► Session._resume(options, state) ─► position
//!  Feed.set_epoch(e) / skip_steps(e, s) ─► position.at_epoch_start / skipping
//!  iter(feed) ─► Session._start_feed(options with position) ─► a pass, whose
//!                RawFeed._position() follows it batch by batch (Feed::checkpoint)
//! ```

use pyo3::prelude::*;
use sqlfeed::feed::{Checkpoint, FeedBuilder};

use crate::errors::IntoPy;

/// A feed's position; see the module docs.
#[pyclass(module = "sqlfeed._sqlfeed", name = "FeedPosition", frozen)]
pub(crate) struct PyFeedPosition {
    pub(crate) checkpoint: Checkpoint,
}

impl PyFeedPosition {
    pub(crate) fn new(checkpoint: Checkpoint) -> Self {
        Self { checkpoint }
    }

    /// `builder` starting where this position is, over the Delta Lake
    /// versions it recorded.
    pub(crate) fn apply(
        &self,
        builder: FeedBuilder,
    ) -> datafusion::error::Result<FeedBuilder> {
        let point = self.checkpoint.own_point()?;
        let versions = self.checkpoint.delta_versions.clone();
        Ok(builder
            .resume_point(point)
            .delta_versions(versions)
            .quarantined_before(self.checkpoint.quarantined.clone()))
    }
}

#[pymethods]
impl PyFeedPosition {
    /// The epoch of the next batch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.checkpoint.epoch
    }

    /// The global step (within `epoch`) of the next batch.
    #[getter]
    fn step(&self) -> u64 {
        self.checkpoint.step
    }

    /// Rows of the epoch's order consumed by all ranks together (`None`
    /// where only the step is known).
    #[getter]
    fn rows(&self) -> Option<u64> {
        self.checkpoint.rows
    }

    /// The rows quarantined before this position, as `(epoch, position,
    /// function, column, error)`.
    #[getter]
    fn quarantined(&self) -> Vec<crate::feed::QuarantineTuple> {
        self.checkpoint
            .quarantined
            .iter()
            .cloned()
            .map(crate::feed::quarantine_tuple)
            .collect()
    }

    /// Whether the files the order is over are known (a pass listed them).
    #[getter]
    fn listed(&self) -> bool {
        self.checkpoint.data.is_some()
    }

    /// The position at the start of `epoch` (`Feed.set_epoch`).
    fn at_epoch_start(&self, epoch: u64) -> Self {
        Self::new(self.checkpoint.at_epoch_start(epoch))
    }

    /// The position with global steps `steps` of `epoch` left out too.
    fn skipping(&self, epoch: u64, steps: Vec<u64>) -> Self {
        Self::new(self.checkpoint.skipping(epoch, steps))
    }

    /// The checkpoint's JSON: `Feed.state_dict()`.
    fn to_json(&self) -> String {
        self.checkpoint.to_json()
    }

    fn __repr__(&self) -> String {
        format!(
            "sqlfeed.FeedPosition(epoch={}, step={}, rows={:?})",
            self.checkpoint.epoch, self.checkpoint.step, self.checkpoint.rows
        )
    }
}

/// A position as `FeedOptions` carries it (its `position` item).
pub(crate) struct PositionArg(pub(crate) PyFeedPosition);

impl<'a, 'py> FromPyObject<'a, 'py> for PositionArg {
    type Error = PyErr;

    fn extract(object: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let position = object.cast::<PyFeedPosition>()?;
        Ok(Self(PyFeedPosition::new(position.get().checkpoint.clone())))
    }
}

/// `Result<Checkpoint>` as a position for Python.
pub(crate) fn position_of(
    checkpoint: datafusion::error::Result<Checkpoint>,
) -> PyResult<PyFeedPosition> {
    checkpoint.py_err().map(PyFeedPosition::new)
}
