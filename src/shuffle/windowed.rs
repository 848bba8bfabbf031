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
//!   unit; a row group of more than `n / 4` rows is cut into equal slices
//!   of at most `n / 4` rows, so that a window mixes at least four places
//!   of the data whatever the files' layout. Files are taken in path order.
//! - **Windows.** Each unit gets the key `xxh3(file rank, row group, first
//!   row; seed = mix(seed, epoch))` (`mix` as `SHUFFLE`'s, see
//!   [`shuffle_seed`]). Units are taken in key order and cut into windows
//!   of at least `n` rows (the last one may hold fewer), counted from the
//!   footers before any filter.
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
//!   row groups. Pick `n` as large as memory allows.
//!
//! # Data flow
//! ```text
//!  footers of the scan's files ──► units ──► windows w0, w1, … (by key)
//!
//!  window task k (at most 1 + AHEAD at once, each a fresh instance of the
//!  input plan with its scan cut to window k's units):
//!      DataSourceExec (ParquetAccessPlan: window k's row groups / slices)
//!        → row-wise operators (filters, projections, functions)
//!        → ShuffleKeyExec → PermuteExec → ShuffleMergeExec
//!        → channel (1 batch)
//!
//!  output: window 0's batches, then window 1's, …  (one partition)
//! ```
//! While window k is read, window k+1 is scanned, keyed and sorted: its
//! task blocks on its channel once its first batch is ready.
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
//! # Output ordering
//! One partition, no declared ordering (the key is dropped).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{exec_datafusion_err, plan_err};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    CachedParquetFileReaderFactory, ParquetAccessPlan, ParquetFileReaderFactory,
    RowGroupAccess,
};
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfig, FileScanConfigBuilder,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector,
};
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, RecordOutput, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;
use tokio::sync::mpsc;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::shuffle_seed;
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
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Rows per window, at least.
    pub fn window_rows(&self) -> u64 {
        self.window_rows
    }
}

/// The one Parquet scan under `plan` and its configuration, or a plan error
/// naming the operator that makes the query not windowable.
fn the_one_parquet_scan(
    plan: &Arc<dyn ExecutionPlan>,
) -> Result<(Arc<dyn ExecutionPlan>, FileScanConfig)> {
    let mut scans = Vec::new();
    let mut refused = None;
    plan.apply(|node| {
        let name = node.name();
        if !ROW_WISE.contains(&name) {
            refused = Some((name.to_string(), node.children().is_empty()));
            return Ok(TreeNodeRecursion::Stop);
        }
        if name == "DataSourceExec" {
            scans.push(Arc::clone(node));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    match refused {
        Some((name, true)) => {
            return plan_err!(
                "SHUFFLE WINDOW cuts Parquet files by row group, but the query reads \
                 {name}; use SHUFFLE"
            );
        }
        Some((name, false)) => {
            return plan_err!(
                "SHUFFLE WINDOW cuts the scan of one Parquet table into windows, so every \
                 row of its query must come from one input row, but the query has {name} \
                 (an aggregate, join, sort, limit, window function or union); use \
                 SHUFFLE, or move that part above the shuffle"
            );
        }
        None => {}
    }
    let [scan] = scans.as_slice() else {
        return plan_err!(
            "SHUFFLE WINDOW reads one Parquet table, but the query reads {}; use SHUFFLE",
            scans.len()
        );
    };
    let config = scan
        .downcast_ref::<DataSourceExec>()
        .and_then(|s| s.data_source().downcast_ref::<FileScanConfig>())
        .filter(|c| c.file_source().file_type() == "parquet")
        .cloned();
    match config {
        Some(config) => Ok((Arc::clone(scan), config)),
        None => plan_err!(
            "SHUFFLE WINDOW reads Parquet files (it cuts them by row group), but the \
             query reads another source; use SHUFFLE"
        ),
    }
}

impl DisplayAs for WindowedShuffleExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let settings: [Setting; 3] = [
            ("window", &self.window_rows),
            ("seed", &self.seed),
            ("epoch", &self.epoch),
        ];
        crate::exec::fmt_settings(f, t, "WindowedShuffleExec", &settings)
    }
}

impl ExecutionPlan for WindowedShuffleExec {
    crate::exec::one_input_operator! {
        name: "WindowedShuffleExec",
        properties: passed_through,
        rebuild: |this, child| Self::try_new(child, this.seed, this.epoch, this.window_rows),
    }

    crate::exec::statistics_of_one_input!(first_input_statistics);

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
        let run = WindowRun {
            input: Arc::clone(&self.input),
            scan,
            config,
            seed: self.seed,
            epoch: self.epoch,
            window_rows: self.window_rows,
            ctx,
            metrics,
        };
        let (tx, rx) = mpsc::channel::<Result<RecordBatch>>(1);
        let driver = SpawnedTask::spawn(async move {
            if let Err(e) = run.drive(&tx).await {
                // The reader may be gone (dropped stream): nothing to tell.
                let _ = tx.send(Err(e)).await;
            }
        });
        let stream = futures::stream::unfold(
            (rx, Some(driver), baseline),
            |(mut rx, driver, baseline)| async move {
                match rx.recv().await {
                    Some(batch) => {
                        let batch = batch.map(|b| b.record_output(&baseline));
                        Some((batch, (rx, driver, baseline)))
                    }
                    None => {
                        // The driver ended: a panic in it is an error here.
                        let panicked = match driver {
                            Some(task) => task.join().await.err(),
                            None => None,
                        };
                        panicked.map(|e| {
                            (
                                Err(DataFusionError::External(Box::new(e))),
                                (rx, None, baseline),
                            )
                        })
                    }
                }
            },
        );
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    crate::exec::metrics_of_field!();
}

/// The operator's own metrics (the windows' plans are fresh instances, so
/// their operators' metrics are not the plan's).
#[derive(Debug, Clone)]
struct WindowMetrics {
    /// Windows started.
    windows: Count,
    /// Units (row groups or slices) in the epoch.
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
            units: MetricBuilder::new(set).counter("units", 0),
            planning: MetricBuilder::new(set).subset_time("window_planning", 0),
            window_wait: MetricBuilder::new(set).subset_time("window_wait", 0),
        }
    }
}

/// One unit of the order: rows `start..start + rows` of one row group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unit {
    /// The file's rank in path order.
    pub(crate) file: usize,
    pub(crate) row_group: usize,
    /// First row within the row group.
    pub(crate) start: u64,
    pub(crate) rows: u64,
}

/// The epoch's windows: units keyed by `(file, row group, first row)` under
/// `(seed, epoch)`, in key order, cut into windows of at least
/// `window_rows` rows. `row_groups[f]` are file `f`'s row groups' row
/// counts. Pure; see the module docs.
pub(crate) fn plan_windows(
    row_groups: &[Vec<u64>],
    seed: u64,
    epoch: u64,
    window_rows: u64,
) -> Vec<Vec<Unit>> {
    let slice_rows = (window_rows / 4).max(1);
    let hash_seed = shuffle_seed(seed, epoch);
    let mut keyed: Vec<(u64, Unit)> = Vec::new();
    for (file, groups) in row_groups.iter().enumerate() {
        for (row_group, &rows) in groups.iter().enumerate() {
            if rows == 0 {
                continue;
            }
            // Equal slices of at most `slice_rows`.
            let slices = rows.div_ceil(slice_rows);
            let (base, extra) = (rows / slices, rows % slices);
            let mut start = 0;
            for slice in 0..slices {
                let len = base + u64::from(slice < extra);
                let unit = Unit {
                    file,
                    row_group,
                    start,
                    rows: len,
                };
                let mut identity = [0u8; 24];
                identity[..8].copy_from_slice(&(file as u64).to_le_bytes());
                identity[8..16].copy_from_slice(&(row_group as u64).to_le_bytes());
                identity[16..].copy_from_slice(&start.to_le_bytes());
                keyed.push((xxh3_64_with_seed(&identity, hash_seed), unit));
                start += len;
            }
        }
    }
    // Units are distinct, so ties (a 2^-64 chance) fall back to identity.
    keyed.sort_unstable_by_key(|&(key, u)| (key, u.file, u.row_group, u.start));
    let mut windows = Vec::new();
    let mut window = Vec::new();
    let mut rows = 0;
    for (_, unit) in keyed {
        rows += unit.rows;
        window.push(unit);
        if rows >= window_rows {
            windows.push(std::mem::take(&mut window));
            rows = 0;
        }
    }
    if !window.is_empty() {
        windows.push(window);
    }
    windows
}

/// `units` of one file as an access plan over its `row_groups` row counts.
fn access_plan(row_groups: &[u64], units: &[Unit]) -> ParquetAccessPlan {
    let mut by_group: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
    for unit in units {
        by_group
            .entry(unit.row_group)
            .or_default()
            .push((unit.start, unit.rows));
    }
    let mut plan = ParquetAccessPlan::new_none(row_groups.len());
    for (group, mut slices) in by_group {
        let total = row_groups[group];
        slices.sort_unstable();
        if slices.iter().map(|s| s.1).sum::<u64>() == total {
            plan.set(group, RowGroupAccess::Scan);
            continue;
        }
        let mut selectors = Vec::new();
        let mut at = 0;
        for (start, rows) in slices {
            if start > at {
                selectors.push(RowSelector::skip((start - at) as usize));
            }
            selectors.push(RowSelector::select(rows as usize));
            at = start + rows;
        }
        if total > at {
            selectors.push(RowSelector::skip((total - at) as usize));
        }
        plan.set(
            group,
            RowGroupAccess::Selection(RowSelection::from(selectors)),
        );
    }
    plan
}

/// One execution: the epoch's windows run one after another.
struct WindowRun {
    input: Arc<dyn ExecutionPlan>,
    /// The scan in `input` that each window replaces.
    scan: Arc<dyn ExecutionPlan>,
    config: FileScanConfig,
    seed: u64,
    epoch: u64,
    window_rows: u64,
    ctx: Arc<TaskContext>,
    metrics: WindowMetrics,
}

/// A window being prepared: its task and the channel it feeds.
struct RunningWindow {
    task: SpawnedTask<()>,
    batches: mpsc::Receiver<Result<RecordBatch>>,
}

impl WindowRun {
    /// Plans the windows, then sends every window's batches to `out`, in
    /// order, with up to [`WINDOWS_AHEAD`] windows prepared ahead.
    async fn drive(self, out: &mpsc::Sender<Result<RecordBatch>>) -> Result<()> {
        let planning = self.metrics.planning.timer();
        let (files, row_groups) = self.files_and_row_groups().await?;
        let windows = plan_windows(&row_groups, self.seed, self.epoch, self.window_rows);
        self.metrics
            .units
            .add(windows.iter().map(Vec::len).sum::<usize>());
        planning.done();
        let mut started: VecDeque<RunningWindow> = VecDeque::new();
        let mut next = windows.iter();
        loop {
            while started.len() <= WINDOWS_AHEAD {
                let Some(units) = next.next() else { break };
                started.push_back(self.start(&files, &row_groups, units)?);
            }
            let Some(mut window) = started.pop_front() else {
                return Ok(());
            };
            let mut first = true;
            loop {
                let waiting = first.then(|| self.metrics.window_wait.timer());
                let batch = window.batches.recv().await;
                drop(waiting);
                first = false;
                match batch {
                    Some(batch) => {
                        let failed = batch.is_err();
                        // The reader gone, or the window failed (its error
                        // passed on): no later window is read. The windows'
                        // tasks are aborted as they drop.
                        if out.send(batch).await.is_err() || failed {
                            return Ok(());
                        }
                    }
                    None => break,
                }
            }
            window
                .task
                .join()
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
    }

    /// The scan's files in path order, and each one's row groups' row
    /// counts, from the footers (through the runtime's metadata cache,
    /// which planning filled).
    async fn files_and_row_groups(
        &self,
    ) -> Result<(Vec<PartitionedFile>, Vec<Vec<u64>>)> {
        let mut files: Vec<PartitionedFile> = Vec::new();
        for file in self.config.file_groups.iter().flat_map(|g| g.iter()) {
            if files
                .iter()
                .all(|f| f.object_meta.location != file.object_meta.location)
            {
                let mut whole = file.clone();
                whole.range = None;
                whole.statistics = None;
                files.push(whole);
            }
        }
        files.sort_by(|a, b| a.object_meta.location.cmp(&b.object_meta.location));
        let runtime = self.ctx.runtime_env();
        let store = runtime.object_store(&self.config.object_store_url)?;
        let factory = CachedParquetFileReaderFactory::new(
            store,
            runtime.cache_manager.get_file_metadata_cache(),
        );
        let mut row_groups = Vec::with_capacity(files.len());
        for file in &files {
            let mut reader: Box<dyn AsyncFileReader> = factory.create_reader(
                0,
                file.clone(),
                None,
                &ExecutionPlanMetricsSet::new(),
            )?;
            let metadata =
                ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new())
                    .await
                    .map_err(|e| {
                        DataFusionError::Execution(format!(
                            "SHUFFLE WINDOW cannot read the footer of {}: {e}",
                            file.object_meta.location
                        ))
                    })?;
            row_groups.push(
                metadata
                    .metadata()
                    .row_groups()
                    .iter()
                    .map(|g| u64::try_from(g.num_rows()).unwrap_or(0))
                    .collect(),
            );
        }
        Ok((files, row_groups))
    }

    /// Starts one window: `input` with its scan cut to `units`, spread over
    /// the scan's partitions (the order within the window is by key, so how
    /// units are spread does not change it).
    fn start(
        &self,
        files: &[PartitionedFile],
        row_groups: &[Vec<u64>],
        units: &[Unit],
    ) -> Result<RunningWindow> {
        self.metrics.windows.add(1);
        let partitions = self.config.file_groups.len().max(1);
        let mut loads = vec![(0u64, Vec::<Unit>::new()); partitions];
        for unit in units {
            // To the least-loaded partition (the first of equals).
            if let Some(least) = loads.iter_mut().min_by_key(|(rows, _)| *rows) {
                least.0 += unit.rows;
                least.1.push(*unit);
            }
        }
        let groups: Vec<FileGroup> = loads
            .into_iter()
            .map(|(_, units)| {
                let mut by_file: BTreeMap<usize, Vec<Unit>> = BTreeMap::new();
                for unit in units {
                    by_file.entry(unit.file).or_default().push(unit);
                }
                FileGroup::new(
                    by_file
                        .into_iter()
                        .map(|(file, units)| {
                            files[file]
                                .clone()
                                .with_extension(access_plan(&row_groups[file], &units))
                        })
                        .collect(),
                )
            })
            .collect();
        let scan: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(
            FileScanConfigBuilder::from(self.config.clone())
                .with_file_groups(groups)
                .build(),
        );
        let template = &self.scan;
        let plan = Arc::clone(&self.input)
            .transform_up(|node| {
                Ok(if Arc::ptr_eq(&node, template) {
                    Transformed::yes(Arc::clone(&scan))
                } else {
                    Transformed::no(node)
                })
            })?
            .data;
        let mut stream = plan.execute(0, Arc::clone(&self.ctx))?;
        let (tx, batches) = mpsc::channel(1);
        let task = SpawnedTask::spawn(async move {
            while let Some(batch) = stream.next().await {
                let failed = batch.is_err();
                if tx.send(batch).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(RunningWindow { task, batches })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows_of(windows: &[Vec<Unit>]) -> Vec<u64> {
        windows
            .iter()
            .map(|w| w.iter().map(|u| u.rows).sum())
            .collect()
    }

    #[test]
    fn windows_cover_every_row_once_and_hold_at_least_n_rows() {
        let files = vec![vec![1000, 1000, 37], vec![0, 5000], vec![999]];
        let windows = plan_windows(&files, 7, 0, 1000);
        let total: u64 = files.iter().flatten().sum();
        let rows = rows_of(&windows);
        assert_eq!(rows.iter().sum::<u64>(), total);
        // Every window but the last holds at least n rows, and less than
        // n + a unit (a quarter window).
        for &r in &rows[..rows.len() - 1] {
            assert!((1000..1250).contains(&r), "{rows:?}");
        }
        // Each row group's rows are covered exactly once.
        for (file, groups) in files.iter().enumerate() {
            for (group, &n) in groups.iter().enumerate() {
                let mut slices: Vec<(u64, u64)> = windows
                    .iter()
                    .flatten()
                    .filter(|u| u.file == file && u.row_group == group)
                    .map(|u| (u.start, u.rows))
                    .collect();
                slices.sort_unstable();
                let mut at = 0;
                for (start, rows) in slices {
                    assert_eq!(start, at);
                    assert!(rows <= 250);
                    at += rows;
                }
                assert_eq!(at, n);
            }
        }
    }

    #[test]
    fn the_windows_are_a_function_of_seed_and_epoch() {
        let files = vec![vec![400; 20]; 3];
        let a = plan_windows(&files, 1, 0, 1000);
        assert_eq!(a, plan_windows(&files, 1, 0, 1000));
        assert_ne!(a, plan_windows(&files, 1, 1, 1000));
        assert_ne!(a, plan_windows(&files, 2, 0, 1000));
        // A window draws from all over the data, not from neighbours: over
        // the epoch's windows, the first units' files are not all file 0.
        let first_files: Vec<usize> = a.iter().map(|w| w[0].file).collect();
        assert!(first_files.iter().any(|&f| f != first_files[0]));
    }

    #[test]
    fn an_access_plan_selects_exactly_the_units_rows() {
        let groups = [100, 50, 80];
        let units = [
            Unit {
                file: 0,
                row_group: 0,
                start: 25,
                rows: 25,
            },
            Unit {
                file: 0,
                row_group: 0,
                start: 75,
                rows: 25,
            },
            Unit {
                file: 0,
                row_group: 2,
                start: 0,
                rows: 80,
            },
        ];
        let plan = access_plan(&groups, &units);
        assert_eq!(plan.inner()[1], RowGroupAccess::Skip);
        assert_eq!(plan.inner()[2], RowGroupAccess::Scan);
        let RowGroupAccess::Selection(selection) = &plan.inner()[0] else {
            panic!("a selection expected, got {:?}", plan.inner()[0]);
        };
        let selectors: Vec<RowSelector> = selection.iter().copied().collect();
        assert_eq!(
            selectors,
            vec![
                RowSelector::skip(25),
                RowSelector::select(25),
                RowSelector::skip(25),
                RowSelector::select(25),
            ]
        );
    }
}
