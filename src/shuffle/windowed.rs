//! [`WindowedShuffleExec`]: `SHUFFLE WINDOW n`, a shuffle that streams. The
//! epoch is cut into windows of about `n` rows drawn from all over the
//! data; each window is shuffled exactly as `SHUFFLE` shuffles a table, and
//! the windows follow one another, the next one prepared while the current
//! one is read. The first batch waits for one window, not for the data.
//!
//! # Background
//! An exact uniform order (`SHUFFLE`) is a barrier: any row may hold the
//! smallest key, so the first row waits for the last one to be read, and
//! one machine holds (or spills) the whole epoch. At terabytes that is an
//! idle GPU for minutes and memory that does not fit. Streaming loaders
//! (MosaicML Streaming, LitData, Grain over shards) trade a little
//! randomness for a stream: they permute *shards* and shuffle rows within a
//! window of shards. This is that trade, as an option; `SHUFFLE` stays the
//! default.
//!
//! # Definition of the order
//! - **Units.** Every Parquet row group the query's one scan reads is a
//!   unit (files taken in path order; why whole row groups:
//!   [`super::window_units`]).
//! - **Windows.** Each unit gets the key `xxh3(file rank, row group;
//!   seed = mix(seed, epoch))` (`mix` as `SHUFFLE`'s, see
//!   [`super::shuffle_seed`]). Units are taken in key order and cut into
//!   windows of at least `n` rows (the last one may hold fewer), counted
//!   from the footers before any filter.
//! - **Rows.** Within a window, rows are ordered as [`SHUFFLE`](super) orders
//!   a table: by content key, copies numbered and spread. So a window's
//!   order is a pure function of its rows, and the epoch's of (data layout,
//!   seed, epoch, `n`).
//!
//! What it keeps, and what it trades, against `SHUFFLE`:
//! - **Kept:** the order does not change with partitions, cores, batch
//!   size, world size or memory limit (spilling); resume is exact; every
//!   row is fed once per epoch.
//! - **Traded:** rows of one unit land in one window, so two rows of the
//!   same row group are much more likely to be near each other than under a
//!   uniform order (within `n` rows of each other, against `n / N`); the
//!   order changes when the same rows are rewritten into other files or
//!   row groups. Pick `n` as large as memory allows, and many row groups
//!   per window.
//!
//! # Data flow
//! ```text
//!  footers of the scan's files ──► units ──► windows w0, w1, … (by key)
//!
//!  window k (at most 1 + AHEAD started at once, each a fresh instance of
//!  the input plan with its scan cut to window k's row groups):
//!      DataSourceExec (one byte range per row group of window k)
//!        → row-wise operators (filters, projections, functions)
//!        → ShuffleKeyExec → PermuteExec → ShuffleMergeExec
//!
//!  output: window 0's batches, then window 1's, …  (one partition;
//!  crate::exec::sequence)
//! ```
//! While window k is read, window k+1 is scanned, keyed and sorted; it
//! waits once its first batch is ready. On a cluster a feed runs one job
//! per window instead (`SHUFFLE WINDOW` with `only_window`, whose planner
//! cuts the scan with [`cut_to_window`]), read the same way.
//!
//! # Memory
//! At most `1 + AHEAD` windows are held, each reserved from the session's
//! pool by its `PermuteExec` (which spills beyond the budget, as
//! `SHUFFLE` does). Memory grows with `n`, not with the data.
//!
//! # What it accepts
//! A query over one Parquet table whose rows are each made from one input
//! row (scans, filters, projections, row-wise functions): cutting the scan
//! into windows then cuts the result the same way. Aggregates, joins,
//! sorts, limits, window functions and unions are refused when planned,
//! naming the operator.
//!
//! # Starting later
//! A mixture's pass (`MIX … WINDOW n`, see [`super::mix`]) may start at
//! row `r` of the epoch's order ([`WindowedShuffleExec::with_start_row`]):
//! the windows wholly before `r` are not run, their rows known from the
//! footers or counted under a filter, and the rest of the rows before `r`
//! are read and dropped.
//!
//! # Output ordering
//! One partition, no declared ordering (the key is dropped).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Statistics, exec_datafusion_err, internal_err, plan_err};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, Volatility};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, RecordOutput, Time,
};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::{StreamExt, TryStreamExt};

use super::window_units::ScanLayout;
use super::{ShuffleNode, ShuffleSpec};
use crate::exec::sequence::in_sequence;
use crate::exec::{BatchStream, Setting};

/// Windows prepared while the current one is read.
pub const WINDOWS_AHEAD: usize = 1;

/// The operators a windowed shuffle's input may hold: each makes one output
/// row from one input row (or drops it), so cutting the scan cuts the
/// result. Anything else is refused (see the module docs).
const ROW_WISE: &[&str] = &[
    "DataSourceExec",
    "ProjectionExec",
    "FilterExec",
    "CoalesceBatchesExec",
    "CooperativeExec",
    "RepartitionExec",
    "ParallelProjectionExec",
    "ShuffleKeyExec",
    "PermuteExec",
    "ShuffleMergeExec",
    "LaneInterleaveExec",
];

/// `SHUFFLE WINDOW n`: the global shuffle `input` run once per window of
/// the epoch, the windows streamed one after another. Module docs: the
/// order, what it keeps and trades, memory.
#[derive(Debug)]
pub struct WindowedShuffleExec {
    /// The global shuffle of the rows (scan → … → `ShuffleMergeExec`),
    /// instantiated afresh per window with its scan cut to the window.
    input: Arc<dyn ExecutionPlan>,
    seed: u64,
    epoch: u64,
    /// Rows per window, at least.
    window_rows: u64,
    /// The output starts at this row of the epoch's order (a mixture's
    /// window of a pass): windows wholly before it are not run where the
    /// footers give their rows, the rest of it is read and dropped.
    start_row: u64,
    /// The rows each window gives, where a filter decides them and they
    /// were counted (see [`Self::with_window_counts`]).
    window_counts: Option<Arc<[u64]>>,
    metrics: ExecutionPlanMetricsSet,
}

impl WindowedShuffleExec {
    /// Windows of at least `window_rows` rows over `input`, a global shuffle
    /// of a row-wise query over one Parquet table; any other query is a
    /// plan error that names what to change.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        seed: u64,
        epoch: u64,
        window_rows: u64,
    ) -> Result<Self> {
        if window_rows == 0 {
            return plan_err!("SHUFFLE WINDOW must hold at least 1 row");
        }
        the_one_parquet_scan(&input)?;
        Ok(Self {
            input,
            seed,
            epoch,
            window_rows,
            start_row: 0,
            window_counts: None,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The same shuffle, its output starting at row `start_row` of the
    /// epoch's order (the rows before it are not emitted).
    pub fn with_start_row(mut self, start_row: u64) -> Self {
        self.start_row = start_row;
        self
    }

    /// Whether an operator under it keeps fewer rows than the footers
    /// count (a filter).
    pub fn drops_rows(&self) -> Result<bool> {
        drops_rows(&self.input)
    }

    /// The same shuffle told the rows each of its windows gives, in window
    /// order ([`window_rows`]), so that windows wholly before the start row
    /// are skipped even where a filter decides the rows. Counts that do not
    /// match the windows when it runs (the files changed) are not used: the
    /// rows before the start are then read and dropped.
    pub fn with_window_counts(&self, counts: Vec<u64>) -> Self {
        Self {
            input: Arc::clone(&self.input),
            seed: self.seed,
            epoch: self.epoch,
            window_rows: self.window_rows,
            start_row: self.start_row,
            window_counts: Some(Arc::from(counts)),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

/// Why a plan's scan cannot be cut into windows; each caller adds what the
/// user can do instead (a query: `SHUFFLE`; a mixture: leave `WINDOW` out).
pub(crate) enum NotWindowable {
    /// A leaf other than a Parquet scan (named).
    Reads(String),
    /// An operator that makes a row from several input rows, or reorders
    /// or limits them (named).
    Has(String),
    /// Several scans, or none.
    Scans(usize),
    /// A scan of another file format.
    NotParquet,
    /// A scan with a row limit, which each window would apply again.
    Limited(usize),
}

impl fmt::Display for NotWindowable {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Self::Reads(name) => write!(
                f,
                "cuts Parquet files by row group, but the query reads {name}"
            ),
            Self::Has(name) => write!(
                f,
                "cuts the scan of one Parquet table into windows, so every row of its \
                 query must come from one input row, but the query has {name} (an \
                 aggregate, join, sort, limit, window function or union)"
            ),
            Self::Scans(count) => {
                write!(f, "reads one Parquet table, but the query reads {count}")
            }
            Self::NotParquet => write!(
                f,
                "reads Parquet files (it cuts them by row group), but the query reads \
                 another source"
            ),
            Self::Limited(rows) => write!(
                f,
                "cuts the scan into windows, but the scan stops after {rows} rows, which \
                 each window would read again"
            ),
        }
    }
}

/// The one Parquet scan under `plan` and its configuration, or why there is
/// none a window can cut.
pub(crate) fn windowable_scan(
    plan: &Arc<dyn ExecutionPlan>,
) -> std::result::Result<(Arc<dyn ExecutionPlan>, FileScanConfig), NotWindowable> {
    /// Collects the scans under `node`, or the first operator that is not
    /// row-wise, with whether it is a leaf.
    fn walk(
        node: &Arc<dyn ExecutionPlan>,
        scans: &mut Vec<Arc<dyn ExecutionPlan>>,
    ) -> Option<(String, bool)> {
        let name = node.name();
        if !ROW_WISE.contains(&name) {
            return Some((name.to_string(), node.children().is_empty()));
        }
        if name == "DataSourceExec" {
            scans.push(Arc::clone(node));
        }
        node.children()
            .into_iter()
            .find_map(|child| walk(child, scans))
    }
    let mut scans = Vec::new();
    match walk(plan, &mut scans) {
        Some((name, true)) => return Err(NotWindowable::Reads(name)),
        Some((name, false)) => return Err(NotWindowable::Has(name)),
        None => {}
    }
    let [scan] = scans.as_slice() else {
        return Err(NotWindowable::Scans(scans.len()));
    };
    match parquet_config(scan) {
        Some(config) => match config.limit {
            Some(rows) => Err(NotWindowable::Limited(rows)),
            None => Ok((Arc::clone(scan), config)),
        },
        None => Err(NotWindowable::NotParquet),
    }
}

/// The one Parquet scan under `plan` and its configuration, or a plan error
/// naming the operator that makes the query not windowable.
fn the_one_parquet_scan(
    plan: &Arc<dyn ExecutionPlan>,
) -> Result<(Arc<dyn ExecutionPlan>, FileScanConfig)> {
    windowable_scan(plan).map_err(|why| {
        let instead = match why {
            NotWindowable::Has(_) => "use SHUFFLE, or move that part above the shuffle",
            _ => "use SHUFFLE",
        };
        DataFusionError::Plan(format!("SHUFFLE WINDOW {why}; {instead}"))
    })
}

/// Why the global shuffle `plan` of a mixture's source cannot be cut into
/// windows (`MIX … WINDOW`), in words that end a sentence; `None` when it
/// can.
pub fn why_not_windowable(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    windowable_scan(plan).err().map(|why| why.to_string())
}

/// The Parquet scan configuration of `scan`, if it is one.
fn parquet_config(scan: &Arc<dyn ExecutionPlan>) -> Option<FileScanConfig> {
    scan.downcast_ref::<DataSourceExec>()
        .and_then(|s| s.data_source().downcast_ref::<FileScanConfig>())
        .filter(|c| c.file_source().file_type() == "parquet")
        .cloned()
}

impl DisplayAs for WindowedShuffleExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let settings: [Setting; 4] = [
            ("window", &self.window_rows),
            ("seed", &self.seed),
            ("epoch", &self.epoch),
            ("start_row", &self.start_row),
        ];
        // A `SHUFFLE WINDOW` query always starts at row 0: its plan reads
        // as it did before mixtures could start one later.
        let shown = if self.start_row == 0 { 3 } else { 4 };
        crate::exec::fmt_settings(f, t, "WindowedShuffleExec", &settings[..shown])
    }
}

impl ExecutionPlan for WindowedShuffleExec {
    crate::exec::one_input_operator! {
        name: "WindowedShuffleExec",
        properties: passed_through,
        rebuild: |this, child| Self::try_new(child, this.seed, this.epoch, this.window_rows)
            .map(|rebuilt| Self {
                start_row: this.start_row,
                window_counts: this.window_counts.clone(),
                ..rebuilt
            }),
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    // Every row of the input, but those before the start row.
    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        if self.start_row == 0 {
            return Ok(crate::exec::first_input_statistics(
                input_stats,
                &self.schema(),
            ));
        }
        // The columns' statistics and sizes were the whole input's.
        let start = usize::try_from(self.start_row).unwrap_or(usize::MAX);
        let mut stats = Arc::unwrap_or_clone(crate::exec::rows_passed_through(
            input_stats,
            &self.schema(),
        ));
        stats.num_rows = stats.num_rows.map(|rows| rows.saturating_sub(start));
        Ok(Arc::new(stats))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        if partition != 0 {
            return Err(exec_datafusion_err!(
                "WindowedShuffleExec has one partition, asked for {partition}"
            ));
        }
        // Checked again: optimizer rules run after the shuffle was planned.
        let (scan, config) = the_one_parquet_scan(&self.input)?;
        let metrics = WindowMetrics::new(&self.metrics);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let input = Arc::clone(&self.input);
        let shuffle = (self.seed, self.epoch, self.window_rows);
        let schema = self.schema();
        // Whole windows are skipped only where their rows are known: from
        // the footers, or counted under a filter (which keeps rows no
        // footer counts); otherwise the rows before the start are read.
        let footers_count_rows = !drops_rows(&self.input)?;
        let counted = self.window_counts.clone();
        let mut to_drop = self.start_row;
        let windows = futures::stream::once(async move {
            let planning = metrics.planning.timer();
            let layout = ScanLayout::read(&config, &ctx.runtime_env()).await?;
            let mut windows = layout.windows(shuffle.0, shuffle.1, shuffle.2);
            metrics
                .units
                .add(windows.iter().map(Vec::len).sum::<usize>());
            let rows_per_window: Option<Vec<u64>> = match counted {
                Some(counts) if counts.len() == windows.len() => Some(counts.to_vec()),
                _ if footers_count_rows => Some(
                    windows
                        .iter()
                        .map(|units| units.iter().map(|unit| unit.rows).sum())
                        .collect(),
                ),
                _ => None,
            };
            if let Some(rows_per_window) = rows_per_window {
                let before = rows_per_window
                    .into_iter()
                    .take_while(|&rows| {
                        let wholly_before = rows <= to_drop;
                        if wholly_before {
                            to_drop -= rows;
                        }
                        wholly_before
                    })
                    .count();
                windows.drain(..before);
                metrics.windows_skipped.add(before);
            }
            planning.done();
            let started = metrics.windows.clone();
            // Each window: a fresh instance of the input plan, its scan cut
            // to the window's row groups.
            let streams = windows.into_iter().map(move |units| {
                started.add(1);
                let cut = layout.scan(&config, &units);
                replace_scan(Arc::clone(&input), &scan, cut)?.execute(0, Arc::clone(&ctx))
            });
            let windows = in_sequence(
                Arc::clone(&schema),
                streams,
                WINDOWS_AHEAD,
                Some(metrics.window_wait),
            );
            // The rows before the start that whole windows did not cover.
            let from_start = windows.try_filter_map(move |batch| {
                let rows = batch.num_rows() as u64;
                let dropped = to_drop.min(rows);
                to_drop -= dropped;
                let kept = (dropped < rows)
                    .then(|| batch.slice(dropped as usize, (rows - dropped) as usize));
                futures::future::ready(Ok(kept))
            });
            Ok::<_, DataFusionError>(from_start)
        })
        .try_flatten()
        .map(move |batch| batch.map(|b| b.record_output(&baseline)));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            windows,
        )))
    }

    crate::exec::metrics_of_field!();
}

/// The number of windows of the windowed shuffle `plan` holds (its first
/// `WindowedShuffleExec` from the top), from the footers; `None` without one.
pub async fn window_count(
    plan: &Arc<dyn ExecutionPlan>,
    ctx: &TaskContext,
) -> Result<Option<usize>> {
    let Some((input, (seed, epoch, window_rows))) = first_windowed(plan)? else {
        return Ok(None);
    };
    let (_, config) = the_one_parquet_scan(&input)?;
    let layout = ScanLayout::read(&config, &ctx.runtime_env()).await?;
    Ok(Some(layout.windows(seed, epoch, window_rows).len()))
}

/// Rows per (file location, bucket of rows) that passed a query's filters,
/// with the bucket's rows: what [`window_rows`] counts once and reuses.
pub type BucketRows = (u64, Arc<HashMap<(String, u64), u64>>);

/// The rows each window of the windowed shuffle `plan` (its first
/// `WindowedShuffleExec` from the top) gives, in window order; `None`
/// without one. From the footers when nothing under the shuffle drops rows;
/// else from the rows `rows` (the query the shuffle orders, as a logical
/// plan in `state`) gives per file and bucket of row groups, counted by
/// [`count_rows_by_bucket`] once and kept in `counted`: it reads only what
/// the query's filters read. A cluster feed deals its windows with them,
/// and a map-style view of an epoch (`crate::feed::EpochDataset`) places
/// row `i` with them.
pub async fn window_rows(
    plan: &Arc<dyn ExecutionPlan>,
    state: &SessionState,
    rows: &LogicalPlan,
    counted: &OnceLock<BucketRows>,
) -> Result<Option<Vec<u64>>> {
    let Some((input, (seed, epoch, window_rows))) = first_windowed(plan)? else {
        return Ok(None);
    };
    let (_, config) = the_one_parquet_scan(&input)?;
    let layout = ScanLayout::read(&config, state.runtime_env()).await?;
    let windows = layout.windows(seed, epoch, window_rows);
    if !drops_rows(&input)? {
        return Ok(Some(
            windows
                .iter()
                .map(|units| units.iter().map(|unit| unit.rows).sum())
                .collect(),
        ));
    }
    let buckets = counted_once(state, rows, layout.grain(), counted).await?;
    Ok(Some(layout.counted_windows(&windows, &buckets)))
}

/// The rows `rows` gives per file and bucket of `grain` rows
/// ([`count_rows_by_bucket`]), or the run's count in `counted` if it was
/// made at that grain.
async fn counted_once(
    state: &SessionState,
    rows: &LogicalPlan,
    grain: u64,
    counted: &OnceLock<BucketRows>,
) -> Result<Arc<HashMap<(String, u64), u64>>> {
    if let Some((counted_grain, buckets)) = counted.get()
        && *counted_grain == grain
    {
        return Ok(Arc::clone(buckets));
    }
    let buckets = Arc::new(count_rows_by_bucket(state, rows.clone(), grain).await?);
    // Two epochs planned at once may both count: the same rows.
    let _ = counted.set((grain, Arc::clone(&buckets)));
    Ok(buckets)
}

/// The rows the filters under the first `SHUFFLE BY POSITION` of `plan`
/// (planned on this machine) keep per file and bucket of rows, counted by a
/// query over `rows` planned in `state` (or taken from `counted`, the run's
/// count at the same grain); `None` when nothing under it drops rows (the
/// footers place them). What a cluster feed sends with the epoch's job
/// (`sqlfeed.position_bucket_rows`).
pub async fn position_bucket_rows(
    plan: &Arc<dyn ExecutionPlan>,
    state: &SessionState,
    rows: &LogicalPlan,
    counted: &OnceLock<BucketRows>,
) -> Result<Option<BucketRows>> {
    let mut found = None;
    plan.apply(|node| {
        if let Some(shuffle) = node.downcast_ref::<super::PositionShuffleExec>() {
            found = Some(Arc::clone(shuffle.input()));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let Some(input) = found else {
        return Ok(None);
    };
    if !drops_rows(&input)? {
        return Ok(None);
    }
    let (_, config) = the_one_parquet_scan(&input)?;
    let grain = ScanLayout::read(&config, state.runtime_env())
        .await?
        .grain();
    let buckets = counted_once(state, rows, grain, counted).await?;
    Ok(Some((grain, buckets)))
}

/// A builder of `state` with `encoded` (of [`encode_bucket_rows`]) as its
/// `sqlfeed.position_bucket_rows`: what a cluster job placing rows by
/// position is planned with.
pub fn with_bucket_rows(
    state: &SessionState,
    encoded: String,
) -> datafusion::execution::SessionStateBuilder {
    let mut config = state.config().clone();
    if let Some(options) = config
        .options_mut()
        .extensions
        .get_mut::<crate::config::SqlfeedOptions>()
    {
        options.position_bucket_rows = encoded;
    }
    datafusion::execution::SessionStateBuilder::new_from_existing(state.clone())
        .with_config(config)
}

/// `buckets` as `sqlfeed.position_bucket_rows` carries them.
pub fn encode_bucket_rows((grain, buckets): &BucketRows) -> String {
    let rows: Vec<(&str, u64, u64)> = buckets
        .iter()
        .map(|((file, bucket), rows)| (file.as_str(), *bucket, *rows))
        .collect();
    serde_json::json!({ "grain": grain, "rows": rows }).to_string()
}

/// `sqlfeed.position_bucket_rows` read back; an error names what is wrong.
pub fn decode_bucket_rows(text: &str) -> Result<BucketRows> {
    #[derive(serde::Deserialize)]
    struct Carried {
        grain: u64,
        rows: Vec<(String, u64, u64)>,
    }
    let carried: Carried = serde_json::from_str(text).map_err(|e| {
        DataFusionError::Plan(format!(
            "sqlfeed.position_bucket_rows is not what a feed sends ({e}): leave it unset"
        ))
    })?;
    let buckets = carried
        .rows
        .into_iter()
        .map(|(file, bucket, rows)| ((file, bucket), rows))
        .collect();
    Ok((carried.grain, Arc::new(buckets)))
}

/// The rows `rows` (a query over one Parquet table, planned in `state`)
/// gives per file (by location) and bucket of `grain` rows of it: a query
/// grouping by `input_file_name()` and `file_row_index() / grain`, which
/// DataFusion evaluates in the scan, so that it reads only the columns the
/// query's filters read, not those its outputs compute from.
pub async fn count_rows_by_bucket(
    state: &SessionState,
    rows: LogicalPlan,
    grain: u64,
) -> Result<HashMap<(String, u64), u64>> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::compute::cast;
    use datafusion::arrow::datatypes::{DataType, Int64Type};
    use datafusion::functions::core::expr_fn::{file_row_index, input_file_name};
    use datafusion::functions_aggregate::expr_fn::count;
    use datafusion::logical_expr::lit;
    let grain_literal = i64::try_from(grain.max(1)).unwrap_or(i64::MAX);
    let df = DataFrame::new(state.clone(), rows).aggregate(
        vec![
            input_file_name().alias("file"),
            (file_row_index() / lit(grain_literal)).alias("bucket"),
        ],
        vec![count(lit(1)).alias("rows")],
    )?;
    let (state, plan) = df.into_parts();
    let physical = state.create_physical_plan(&plan).await?;
    let batches =
        datafusion::physical_plan::collect(physical, Arc::new(TaskContext::from(&state)))
            .await?;
    let mut counted = HashMap::new();
    for batch in batches {
        let files = cast(batch.column(0), &DataType::Utf8)?;
        let buckets = cast(batch.column(1), &DataType::Int64)?;
        let rows = cast(batch.column(2), &DataType::Int64)?;
        let (files, buckets, rows) = (
            files.as_string::<i32>(),
            buckets.as_primitive::<Int64Type>(),
            rows.as_primitive::<Int64Type>(),
        );
        for row in 0..batch.num_rows() {
            let (Ok(bucket), Ok(n)) = (
                u64::try_from(buckets.value(row)),
                u64::try_from(rows.value(row)),
            ) else {
                return internal_err!(
                    "a negative row index or count in a file's row count"
                );
            };
            *counted
                .entry((files.value(row).to_string(), bucket))
                .or_insert(0) += n;
        }
    }
    Ok(counted)
}

/// Whether a filter of `plan` calls a function that is not a pure function
/// of its arguments (volatile, or reading the session's settings, such as
/// a seeded draw that reads the epoch): the rows it keeps may then change
/// between epochs, and counts of them hold for one epoch only.
pub fn filters_may_change(plan: &LogicalPlan) -> Result<bool> {
    plan.exists(|node| {
        let LogicalPlan::Filter(filter) = node else {
            return Ok(false);
        };
        filter.predicate.exists(|expr| {
            Ok(match expr {
                Expr::ScalarFunction(call) => {
                    call.func.signature().volatility != Volatility::Immutable
                }
                Expr::AggregateFunction(_) | Expr::WindowFunction(_) => true,
                Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_) => true,
                _ => false,
            })
        })
    })
}

/// A windowed shuffle's `(seed, epoch, window_rows)`.
type WindowOrder = (u64, u64, u64);

/// Whether an operator of `input` (a windowed shuffle's row-wise input)
/// may drop rows: a filter, or a scan with a predicate.
pub(crate) fn drops_rows(input: &Arc<dyn ExecutionPlan>) -> Result<bool> {
    input.exists(|node| {
        Ok(node.name() == "FilterExec"
            || parquet_config(node).is_some_and(|c| c.file_source().filter().is_some()))
    })
}

/// The input and order of the first `WindowedShuffleExec` in `plan` from
/// the top.
fn first_windowed(
    plan: &Arc<dyn ExecutionPlan>,
) -> Result<Option<(Arc<dyn ExecutionPlan>, WindowOrder)>> {
    let mut found = None;
    plan.apply(|node| {
        if let Some(windowed) = node.downcast_ref::<WindowedShuffleExec>() {
            found = Some((
                Arc::clone(&windowed.input),
                (windowed.seed, windowed.epoch, windowed.window_rows),
            ));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

/// `input` (the row-wise plan under a windowed shuffle) with its one
/// Parquet scan cut to window `window` of `(seed, epoch, window_rows)`
/// (empty past the last one): the plan of a cluster job of one window,
/// which its scheduler sends to the executors as it is.
pub(crate) async fn cut_to_window(
    input: Arc<dyn ExecutionPlan>,
    (seed, epoch, window_rows): (u64, u64, u64),
    window: u64,
    runtime: &RuntimeEnv,
) -> Result<Arc<dyn ExecutionPlan>> {
    let (scan, config) = the_one_parquet_scan(&input)?;
    let layout = ScanLayout::read(&config, runtime).await?;
    let windows = layout.windows(seed, epoch, window_rows);
    let units = usize::try_from(window)
        .ok()
        .and_then(|w| windows.get(w))
        .map_or(&[][..], Vec::as_slice);
    replace_scan(input, &scan, layout.scan(&config, units))
}

/// `plan` with `scan` (one of its nodes) replaced by `cut`.
pub(crate) fn replace_scan(
    plan: Arc<dyn ExecutionPlan>,
    scan: &Arc<dyn ExecutionPlan>,
    cut: Arc<dyn ExecutionPlan>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let replaced = plan.transform_up(|node| {
        Ok(if Arc::ptr_eq(&node, scan) {
            Transformed::yes(Arc::clone(&cut))
        } else {
            Transformed::no(node)
        })
    })?;
    if !replaced.transformed {
        return internal_err!("the windowed shuffle's scan is not in its plan");
    }
    Ok(replaced.data)
}

/// `plan` with its windowed shuffles narrowed to window `window` alone
/// (a cluster feed's job of that window); other plans are returned as
/// they are.
pub fn with_only_window(plan: LogicalPlan, window: u64) -> Result<LogicalPlan> {
    Ok(plan
        .transform_up(|node| {
            let LogicalPlan::Extension(extension) = &node else {
                return Ok(Transformed::no(node));
            };
            let Some(shuffle) = extension.node.as_any().downcast_ref::<ShuffleNode>()
            else {
                return Ok(Transformed::no(node));
            };
            let ShuffleSpec::Windowed {
                seed,
                epoch,
                window_rows,
                ..
            } = shuffle.spec()
            else {
                return Ok(Transformed::no(node));
            };
            let spec = ShuffleSpec::Windowed {
                seed,
                epoch,
                window_rows,
                only_window: Some(window),
            };
            let narrowed = ShuffleNode::try_new_keyed(
                shuffle.input().clone(),
                spec,
                shuffle.key().clone(),
            )?;
            Ok(Transformed::yes(LogicalPlan::Extension(Extension {
                node: Arc::new(narrowed),
            })))
        })?
        .data)
}

/// The operator's own metrics (the windows' plans are fresh instances, so
/// their operators' metrics are not the plan's).
#[derive(Debug, Clone)]
struct WindowMetrics {
    /// Windows started.
    windows: Count,
    /// Windows not run: all their rows come before the start row.
    windows_skipped: Count,
    /// Units (row groups) in the epoch.
    units: Count,
    /// Time reading footers and cutting windows.
    planning: Time,
    /// Time the output waited for a window's first batch.
    window_wait: Time,
}

impl WindowMetrics {
    fn new(set: &ExecutionPlanMetricsSet) -> Self {
        Self {
            windows: MetricBuilder::new(set).counter("windows", 0),
            windows_skipped: MetricBuilder::new(set).counter("windows_skipped", 0),
            units: MetricBuilder::new(set).counter("units", 0),
            planning: MetricBuilder::new(set).subset_time("window_planning", 0),
            window_wait: MetricBuilder::new(set).subset_time("window_wait", 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_rows_travel_as_a_setting_and_damage_is_named() -> Result<()> {
        let buckets: HashMap<(String, u64), u64> = HashMap::from([
            (("/data/a \"x\".parquet".to_string(), 0), 7),
            (("/data/b.parquet".to_string(), 3), 0),
        ]);
        let carried = encode_bucket_rows(&(4096, Arc::new(buckets.clone())));
        let (grain, back) = decode_bucket_rows(&carried)?;
        assert_eq!((grain, back.as_ref()), (4096, &buckets));
        let err = decode_bucket_rows("{\"grain\": 1}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("sqlfeed.position_bucket_rows"), "{err}");
        Ok(())
    }

    async fn plan_of(sql: &str) -> Result<LogicalPlan> {
        let session = crate::Session::try_new()?;
        Ok(session.sql(sql).await?.logical_plan().clone())
    }

    #[tokio::test]
    async fn rows_a_filter_keeps_may_change_only_with_functions_of_more_than_the_row()
    -> Result<()> {
        let values = "(VALUES (1, 'a'), (2, 'b')) AS t(x, s)";
        for (filter, may_change) in [
            ("x > 1", false),
            ("upper(s) = 'A' AND x % 2 = 0", false),
            ("random() < 0.5", true),
            ("x < (SELECT max(x) FROM (VALUES (1)) AS u(x))", true),
        ] {
            let plan = plan_of(&format!("SELECT x FROM {values} WHERE {filter}")).await?;
            assert_eq!(filters_may_change(&plan)?, may_change, "{filter}");
        }
        assert!(!filters_may_change(
            &plan_of(&format!("SELECT x FROM {values}")).await?
        )?);
        Ok(())
    }
}
