//! [`EpochDataset`]: map-style access to one epoch of a feed shuffled in
//! windows or by position — row `i` of the epoch's order, and the epoch's
//! length — for samplers and debugging (`feed.dataset()[i]` in Python).
//!
//! ```text
//!  FeedBuilder::dataset(epoch)
//!    the feed's query under the epoch's SHUFFLE WINDOW (seed, epoch, n) or
//!    SHUFFLE BY POSITION (seed, epoch), planned with the epoch's settings,
//!    on this machine
//!
//!  windows.rs    SHUFFLE WINDOW n
//!    len()       rows per window: the footers' (no filter), or each
//!                window's filtered rows, counted once
//!    row(i)      window w holding position i ─► window w's rows in its
//!                order (its scan, functions and shuffle); the last kept
//!  positions.rs  SHUFFLE BY POSITION
//!    len()       rows per row group: the footers' (no filter), or counted
//!                once
//!    row(i)      rank π(i) ─► its row group, read up to the shuffle and
//!                kept with the last ones read (or, asked for few of its
//!                rows and nothing filtered, the pages holding them) ─►
//!                the functions above the shuffle, on that row alone
//! ```
//!
//! # The feed's rows
//! Row `i` is the `i`-th row of the epoch's order before it is cut into
//! ranks and batches: a feed of world 1 without `drop_last` hands over rows
//! 0, 1, … in that order, with the same values (the epoch's settings are
//! the feed's, so seeded augmentations draw the same). The columns are the
//! query's, not converted to tensors. A function that draws anew on every
//! call (`random()`, a volatile function) is called again when a row is
//! read, so it gives other values than the feed gave; in a filter it may
//! keep other rows, which is reported as the data having changed.
//!
//! # Cost
//! A windowed row costs its window: the window's scan, functions and
//! shuffle; the last window read is kept, so reading in order reads each
//! window once, and memory holds one window. A row by position costs the
//! pages holding it, in the columns under the shuffle, when nothing under
//! the shuffle drops rows and a batch of positions asks for at most one
//! row in 16 of its row group (Parquet row selection; files without a page
//! index read the row group's column chunks, decoding only those pages);
//! else its row group's columns, kept with the row groups read last up to
//! [`positions::HELD_BYTES`], so that a batch of positions reads each of its
//! row groups once. Then the functions above the shuffle, for that row
//! alone. An exact `SHUFFLE` keyed by content is refused: its
//! row would cost the epoch's shuffle (and hold it). So is an unshuffled
//! feed, whose order interleaves partitions as its sink reads them; both
//! are refused saying what to do.

mod positions;
mod windows;

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{exec_datafusion_err, plan_err};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;

use super::on_runtime;
use super::plan::{FeedOrder, FeedPlan};
use crate::shuffle::shuffle;

/// One epoch of a feed shuffled in windows or by position, map-style; see
/// the module docs.
pub struct EpochDataset {
    epoch: u64,
    /// Where its plans run; `None` once dropped.
    runtime: Option<tokio::runtime::Runtime>,
    schema: SchemaRef,
    order: Order,
}

/// How the epoch's rows are found.
enum Order {
    /// `SHUFFLE WINDOW n`: window by window.
    Windows(windows::Windows),
    /// `SHUFFLE BY POSITION`: row group by row group.
    Positions(positions::Positions),
}

/// The epoch's query, as both orders read it.
#[derive(Clone)]
struct EpochQuery {
    /// The feed's session state with the epoch's settings and the embedded
    /// planner.
    state: SessionState,
    /// The feed's query under the epoch's shuffle.
    query: LogicalPlan,
    /// The feed's query, unshuffled: what counts the rows its filters keep.
    rows: LogicalPlan,
}

impl std::fmt::Debug for EpochDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochDataset")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl EpochDataset {
    /// Epoch `epoch` of `feed`, which must be shuffled in windows or by
    /// position, read on `runtime` (shut down when it is refused, or with
    /// the dataset).
    pub(super) fn try_new(
        feed: FeedPlan,
        epoch: u64,
        runtime: tokio::runtime::Runtime,
    ) -> Result<Self> {
        match Self::plan(feed, epoch, &runtime) {
            Ok((query, by_position)) => Ok(Self {
                epoch,
                runtime: Some(runtime),
                schema: Arc::clone(query.query.schema().inner()),
                order: if by_position {
                    Order::Positions(positions::Positions::new(query))
                } else {
                    Order::Windows(windows::Windows::new(query))
                },
            }),
            Err(e) => {
                // Without waiting (see `Drop`).
                runtime.shutdown_background();
                Err(e)
            }
        }
    }

    /// The epoch's query, and whether it is shuffled by position.
    fn plan(
        feed: FeedPlan,
        epoch: u64,
        runtime: &tokio::runtime::Runtime,
    ) -> Result<(EpochQuery, bool)> {
        let (spec, by_position) = match feed.order {
            FeedOrder::Shuffled {
                window: Some(_), ..
            } => (feed.order.spec(epoch), false),
            FeedOrder::Shuffled {
                window: None,
                by_position: true,
                ..
            } => (feed.order.spec(epoch), true),
            FeedOrder::Shuffled {
                window: None,
                by_position: false,
                ..
            } => {
                return plan_err!(
                    "reading rows by position (dataset(), --rows) reads an epoch a window                      or a row group at a time, but this feed's SHUFFLE is exact and keyed by                      content: its row i would cost the whole epoch's shuffle; shuffle with                      shuffle_window=n (--shuffle-window, SHUFFLE WINDOW n), or exactly by                      file and row with shuffle_by_position=True (--shuffle-by-position,                      SHUFFLE BY POSITION)"
                );
            }
            FeedOrder::Unshuffled { .. } => {
                return plan_err!(
                    "reading rows by position (dataset(), --rows) gives an epoch's order by                      position, but this feed is not shuffled; shuffle it with shuffle_window=n                      (--shuffle-window, SHUFFLE WINDOW n) or shuffle_by_position=True                      (--shuffle-by-position)"
                );
            }
        };
        if feed.quarantine.is_some() {
            // Its failing rows take the row before them in the sink, which
            // reads the epoch in order, not by position.
            return plan_err!(
                "reading rows by position (dataset(), --rows) cannot follow this feed: it                  quarantines failing rows (on_error=quarantine), whose slots take the rows                  before them; use on_error=fail to look at rows by position"
            );
        }
        let session = feed.session.clone();
        let sql = feed.sql.clone();
        // An epoch continued over appended data is its rest, in its order.
        let continued = feed.appended.clone().filter(|a| a.epoch == epoch);
        let (df, rows) = on_runtime(runtime, async move {
            let (df, spec) = match (continued, spec) {
                (Some(appended), Some(spec)) => {
                    let (rest, spec) =
                        appended.remaining_unshuffled(&session, &sql, spec).await?;
                    (rest, Some(spec))
                }
                (_, spec) => (session.sql(&sql).await?, spec),
            };
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
        Ok((EpochQuery { state, query, rows }, by_position))
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
        match &self.order {
            Order::Windows(windows) => {
                Ok(windows.window_rows(self.runtime()?)?.iter().sum())
            }
            Order::Positions(positions) => Ok(positions.len(self.runtime()?)?),
        }
    }

    /// Whether the epoch has no rows.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Rows per window of the epoch, in order; an error for an epoch
    /// shuffled by position, which has no windows.
    pub fn window_rows(&self) -> Result<Arc<[u64]>> {
        match &self.order {
            Order::Windows(windows) => windows.window_rows(self.runtime()?),
            Order::Positions(_) => plan_err!(
                "epoch {} is shuffled by position (SHUFFLE BY POSITION), not in windows: it \
                 has no windows; len() gives its rows",
                self.epoch
            ),
        }
    }

    /// Row `position` of the epoch's order, as a batch of one row; an error
    /// past the end names the epoch's length.
    pub fn row(&self, position: u64) -> Result<RecordBatch> {
        match &self.order {
            Order::Windows(windows) => windows.row(self.runtime()?, self.epoch, position),
            Order::Positions(positions) => {
                positions.rows(self.runtime()?, self.epoch, &[position])
            }
        }
    }

    /// Rows `positions` of the epoch's order, in the order given, as one
    /// batch (a sampler's batch of positions). Each window, or row group,
    /// they fall in is read once.
    pub fn rows(&self, positions: &[u64]) -> Result<RecordBatch> {
        match &self.order {
            Order::Windows(windows) => {
                windows.rows(self.runtime()?, self.epoch, positions, &self.schema)
            }
            Order::Positions(rows) => rows.rows(self.runtime()?, self.epoch, positions),
        }
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
