//! [`EpochDataset`]: map-style access to one epoch of a windowed feed —
//! row `i` of the epoch's order, and the epoch's length — for samplers and
//! debugging (`feed.dataset()[i]` in Python).
//!
//! ```text
//!  FeedBuilder::dataset(epoch)
//!    the feed's query under SHUFFLE WINDOW (seed, epoch, n), planned with
//!    the epoch's settings, on this machine
//!
//!  len()    rows per window: the footers' (no filter), or each window's
//!           filtered rows, counted once (the filter and the key's columns)
//!  row(i)   window w holding position i (running sums of the sizes)
//!             └─► window w's rows in its order: the query with its scan
//!                 cut to w's row groups, shuffled; kept until another
//!                 window is read
//! ```
//!
//! # The feed's rows
//! Row `i` is the `i`-th row of the epoch's order before it is cut into
//! ranks and batches: a feed of world 1 without `drop_last` hands over rows
//! 0, 1, … in that order, with the same values (the epoch's settings are
//! the feed's, so seeded augmentations draw the same). The columns are the
//! query's, not converted to tensors.
//!
//! # Cost
//! Reading row `i` reads its window: the window's scan, functions and
//! shuffle. The last window read is kept, so reading in order reads each
//! window once; memory holds one window. A windowed order is what makes a
//! row cost one window; an exact `SHUFFLE`'s row would cost the epoch (and
//! hold it), and an unshuffled feed's order interleaves partitions as its
//! sink reads them: both are refused, saying what to do.

use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{exec_datafusion_err, plan_err};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use futures::TryStreamExt;

use super::on_runtime;
use super::plan::{FeedOrder, FeedPlan};
use crate::exec::lanes::ordered_partitions;
use crate::shuffle::{shuffle, window_rows, with_only_window};

/// One epoch of a windowed feed, by position; see the module docs.
pub struct EpochDataset {
    epoch: u64,
    /// Where its plans run; `None` once dropped.
    runtime: Option<tokio::runtime::Runtime>,
    /// The feed's session state with the epoch's settings and the embedded
    /// planner.
    state: SessionState,
    /// The feed's query under the epoch's windowed shuffle.
    query: LogicalPlan,
    /// The feed's query, unshuffled: what counts its windows' rows.
    rows: LogicalPlan,
    schema: SchemaRef,
    /// Rows per window, once counted.
    window_rows: Mutex<Option<Arc<[u64]>>>,
    /// The last window read: its number and rows, in order.
    window: Mutex<Option<(usize, RecordBatch)>>,
}

impl std::fmt::Debug for EpochDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochDataset")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl EpochDataset {
    /// Epoch `epoch` of `feed`, which must be shuffled in windows, read on
    /// `runtime` (shut down when it is refused, or with the dataset).
    pub(super) fn try_new(
        feed: FeedPlan,
        epoch: u64,
        runtime: tokio::runtime::Runtime,
    ) -> Result<Self> {
        match Self::plan(feed, epoch, &runtime) {
            Ok((state, query, rows)) => Ok(Self {
                epoch,
                runtime: Some(runtime),
                schema: Arc::clone(query.schema().inner()),
                state,
                query,
                rows,
                window_rows: Mutex::default(),
                window: Mutex::default(),
            }),
            Err(e) => {
                // Without waiting (see `Drop`).
                runtime.shutdown_background();
                Err(e)
            }
        }
    }

    /// The epoch's query, the state it is planned in and the query
    /// unshuffled.
    fn plan(
        feed: FeedPlan,
        epoch: u64,
        runtime: &tokio::runtime::Runtime,
    ) -> Result<(SessionState, LogicalPlan, LogicalPlan)> {
        let spec = match feed.order {
            FeedOrder::Shuffled {
                window: Some(_), ..
            } => feed.order.spec(epoch),
            FeedOrder::Shuffled { window: None, .. } => {
                return plan_err!(
                    "reading rows by position (dataset(), --rows) reads an epoch a window at \
                     a time, but this feed's SHUFFLE is exact: its row i would cost the whole \
                     epoch's shuffle; shuffle with shuffle_window=n (--shuffle-window, \
                     SHUFFLE WINDOW n)"
                );
            }
            FeedOrder::Unshuffled { .. } => {
                return plan_err!(
                    "reading rows by position (dataset(), --rows) gives an epoch's order by \
                     position, but this feed is not shuffled; shuffle it with shuffle_window=n \
                     (--shuffle-window, SHUFFLE WINDOW n)"
                );
            }
        };
        if feed.quarantine.is_some() {
            // Its failing rows take the row before them in the sink, which
            // reads the epoch in order, not by position.
            return plan_err!(
                "reading rows by position (dataset(), --rows) cannot follow this feed: it \
                 quarantines failing rows (on_error=quarantine), whose slots take the rows \
                 before them; use on_error=fail to look at rows by position"
            );
        }
        let session = feed.session.clone();
        let sql = feed.sql.clone();
        let (df, rows) = on_runtime(runtime, async move {
            let df = session.sql(&sql).await?;
            let rows = df.logical_plan().clone();
            let shuffled = match spec {
                Some(spec) => shuffle(df, spec)?,
                None => df,
            };
            Ok((shuffled, rows))
        })?;
        let (state, query) = df.into_parts();
        let mut config = feed.epoch_config(state.config(), epoch);
        crate::config::deterministic_config(
            &mut config,
            crate::config::PartitionOrder::Content,
        );
        // Here, also in a cluster session: row i is read on this machine.
        let mut state = SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .with_query_planner(Arc::new(crate::sql::SqlfeedQueryPlanner::embedded()))
            .build();
        // Functions see the epoch's settings captured here.
        state.mark_start_execution();
        Ok((state, query, rows))
    }

    fn runtime(&self) -> Result<&tokio::runtime::Runtime> {
        self.runtime
            .as_ref()
            .ok_or_else(|| exec_datafusion_err!("the dataset's runtime is gone"))
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The query's columns.
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Rows in the epoch.
    pub fn len(&self) -> Result<u64> {
        Ok(self.window_rows()?.iter().sum())
    }

    /// Whether the epoch has no rows.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Rows per window of the epoch, in order.
    pub fn window_rows(&self) -> Result<Arc<[u64]>> {
        let mut counted = self
            .window_rows
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(rows) = counted.as_ref() {
            return Ok(Arc::clone(rows));
        }
        let (state, query, unshuffled) =
            (self.state.clone(), self.query.clone(), self.rows.clone());
        let rows: Arc<[u64]> = on_runtime(self.runtime()?, async move {
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

    /// Row `position` of the epoch's order, as a batch of one row; an error
    /// past the end names the epoch's length.
    pub fn row(&self, position: u64) -> Result<RecordBatch> {
        let rows = self.window_rows()?;
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
                "row {position} of epoch {} is past its end: the epoch has {len} rows \
                 (positions 0..{len})",
                self.epoch
            );
        };
        let batch = self.window(window)?;
        let offset = usize::try_from(offset).map_err(|_| {
            exec_datafusion_err!("a window of more rows than memory holds")
        })?;
        if offset >= batch.num_rows() {
            return Err(exec_datafusion_err!(
                "window {window} of epoch {} gave {} rows where it was counted {}: did the \
                 data change while it was read?",
                self.epoch,
                batch.num_rows(),
                rows[window]
            ));
        }
        Ok(batch.slice(offset, 1))
    }

    /// Rows `positions` of the epoch's order, in the order given, as one
    /// batch (a sampler's batch of positions). The rows are read window by
    /// window, so each window they fall in is read once.
    pub fn rows(&self, positions: &[u64]) -> Result<RecordBatch> {
        let mut by_window: Vec<(u64, usize)> = positions
            .iter()
            .enumerate()
            .map(|(slot, &position)| (position, slot))
            .collect();
        by_window.sort_unstable();
        let mut rows: Vec<Option<RecordBatch>> = vec![None; positions.len()];
        for (position, slot) in by_window {
            rows[slot] = Some(self.row(position)?);
        }
        let rows: Vec<RecordBatch> = rows.into_iter().flatten().collect();
        match rows.first() {
            Some(first) => Ok(concat_batches(&first.schema(), &rows)?),
            None => Ok(RecordBatch::new_empty(Arc::clone(&self.schema))),
        }
    }

    /// Window `window`'s rows in order, read unless it is the last one read.
    fn window(&self, window: usize) -> Result<RecordBatch> {
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
        let state = self.state.clone();
        let query = with_only_window(self.query.clone(), window as u64)?;
        let batch = on_runtime(self.runtime()?, async move {
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

impl Drop for EpochDataset {
    // Without waiting: dropping a runtime where blocking is not allowed
    // (an async caller) would panic.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
