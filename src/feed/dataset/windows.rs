//! Rows of an epoch shuffled in windows (`SHUFFLE WINDOW n`), by position:
//! the window holding row `i`, read whole (its scan, functions and
//! shuffle) and kept until another window is read.

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{exec_datafusion_err, plan_err};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use futures::TryStreamExt;

use super::EpochQuery;
use crate::exec::lanes::ordered_partitions;
use crate::feed::on_runtime;
use crate::shuffle::{window_rows, with_only_window};

/// The windows of one epoch; see the module docs.
pub(super) struct Windows {
    query: EpochQuery,
    /// Rows per window, once counted.
    window_rows: Mutex<Option<Arc<[u64]>>>,
    /// The last window read: its number and rows, in order.
    window: Mutex<Option<(usize, RecordBatch)>>,
}

impl Windows {
    pub(super) fn new(query: EpochQuery) -> Self {
        Self {
            query,
            window_rows: Mutex::default(),
            window: Mutex::default(),
        }
    }

    /// Rows per window of the epoch, in order.
    pub(super) fn window_rows(
        &self,
        runtime: &tokio::runtime::Runtime,
    ) -> Result<Arc<[u64]>> {
        let mut counted = self
            .window_rows
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(rows) = counted.as_ref() {
            return Ok(Arc::clone(rows));
        }
        let EpochQuery {
            state,
            query,
            rows: unshuffled,
        } = self.query.clone();
        let rows: Arc<[u64]> = on_runtime(runtime, async move {
            let plan = state.create_physical_plan(&query).await?;
            window_rows(&plan, &state, &unshuffled, &std::sync::OnceLock::new())
                .await?
                .ok_or_else(|| {
                    exec_datafusion_err!(
                        "a windowed epoch's plan has no WindowedShuffleExec"
                    )
                })
        })?
        .into();
        *counted = Some(Arc::clone(&rows));
        Ok(rows)
    }

    /// Row `position` of epoch `epoch`'s order, as a batch of one row; an
    /// error past the end names the epoch's length.
    pub(super) fn row(
        &self,
        runtime: &tokio::runtime::Runtime,
        epoch: u64,
        position: u64,
    ) -> Result<RecordBatch> {
        let rows = self.window_rows(runtime)?;
        let mut start = 0u64;
        let Some((window, offset)) = rows.iter().enumerate().find_map(|(w, &n)| {
            let found = position
                .checked_sub(start)
                .filter(|offset| *offset < n)
                .map(|offset| (w, offset));
            start += n;
            found
        }) else {
            let len: u64 = rows.iter().sum();
            return plan_err!(
                "row {position} of epoch {epoch} is past its end: the epoch has {len} rows \
                 (positions 0..{len})"
            );
        };
        let batch = self.window(runtime, window)?;
        let offset = usize::try_from(offset).map_err(|_| {
            exec_datafusion_err!("a window of more rows than memory holds")
        })?;
        if offset >= batch.num_rows() {
            return Err(exec_datafusion_err!(
                "window {window} of epoch {epoch} gave {} rows where it was counted {}: did \
                 the data change while it was read?",
                batch.num_rows(),
                rows[window]
            ));
        }
        Ok(batch.slice(offset, 1))
    }

    /// Rows `positions` of the epoch's order, in the order given, as one
    /// batch. The rows are read window by window, so each window they fall
    /// in is read once.
    pub(super) fn rows(
        &self,
        runtime: &tokio::runtime::Runtime,
        epoch: u64,
        positions: &[u64],
        schema: &SchemaRef,
    ) -> Result<RecordBatch> {
        let mut by_window: Vec<(u64, usize)> = positions
            .iter()
            .enumerate()
            .map(|(slot, &position)| (position, slot))
            .collect();
        by_window.sort_unstable();
        let mut rows: Vec<Option<RecordBatch>> = vec![None; positions.len()];
        for (position, slot) in by_window {
            rows[slot] = Some(self.row(runtime, epoch, position)?);
        }
        let rows: Vec<RecordBatch> = rows.into_iter().flatten().collect();
        match rows.first() {
            Some(first) => Ok(concat_batches(&first.schema(), &rows)?),
            None => Ok(RecordBatch::new_empty(Arc::clone(schema))),
        }
    }

    /// Window `window`'s rows in order, read unless it is the last one read.
    fn window(
        &self,
        runtime: &tokio::runtime::Runtime,
        window: usize,
    ) -> Result<RecordBatch> {
        let mut kept = self
            .window
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some((read, batch)) = kept.as_ref()
            && *read == window
        {
            return Ok(batch.clone());
        }
        // The last window read goes first: memory holds one.
        *kept = None;
        let state = self.query.state.clone();
        let query = with_only_window(self.query.query.clone(), window as u64)?;
        let batch = on_runtime(runtime, async move {
            let plan = state.create_physical_plan(&query).await?;
            let schema = plan.schema();
            let ctx = Arc::new(TaskContext::from(&state));
            // Partitions read as the feed's sink reads them.
            let turn_rows = ctx.session_config().batch_size();
            let batches: Vec<RecordBatch> = ordered_partitions(&plan, ctx, turn_rows)?
                .try_collect()
                .await?;
            Ok(concat_batches(&schema, &batches)?)
        })?;
        *kept = Some((window, batch.clone()));
        Ok(batch)
    }
}
