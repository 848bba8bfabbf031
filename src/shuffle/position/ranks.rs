//! The rows of a `SHUFFLE BY POSITION` by canonical rank, one row group at a
//! time: what map-style access to an epoch (`crate::feed::EpochDataset`)
//! reads to give row `i` instead of the epoch.
//!
//! ```text
//!  PositionShuffleExec's input ──► its one Parquet scan ──► the footers
//!    row groups in (file path, row group) order: the order of the ranks
//!    rows per row group: the footers' (nothing drops rows), or the rows
//!      the query's filters keep, counted once per file and bucket of rows
//!  rank r ──► row group g holding it (running sums of the rows)
//!         ──► the input with its scan cut to g ──► g's rows by row index
//!         ──► row r − (ranks before g)
//!  (no filter: ranks r, s, … of g ──► the scan of g with a row selection
//!   of offsets r − start, s − start, … ──► the pages holding them alone)
//! ```
//!
//! # Why it gives the shuffle's ranks
//! [`super::PositionShuffleExec`] ranks the rows that reach it by (file
//! path, row index in the file). Row groups of one file hold rising row
//! indexes, and files are ranked by the path the object store names, as
//! [`ScanLayout`] sorts them: so the ranks of row group `g` are the rows
//! that reach the shuffle from the row groups before it, onwards, in row
//! index order. A row group read here is the shuffle's own input (scan,
//! filters, projections below the shuffle) with the scan cut to that row
//! group's byte range, the same cut a windowed shuffle's window makes.
//!
//! # When the data changed
//! A file whose size or last change differs from the listing's (rewritten
//! since the epoch was planned) is an error naming it, before its row group
//! is read; so is a row group that gives another number of rows than it was
//! counted at. Never a row of another rank.
//!
//! # Cost and memory
//! Placing a rank reads nothing; reading its row group reads that row
//! group's columns under the shuffle (its scan and what is computed below
//! the shuffle). The caller keeps the row groups it wants to read again.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::{concat_batches, sort_to_indices};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{exec_datafusion_err, exec_err, internal_err, plan_err};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use futures::{StreamExt, TryStreamExt};

use object_store::ObjectStoreExt;

use super::PositionShuffleExec;
use crate::shuffle::window_units::{ScanLayout, Unit};
use crate::shuffle::windowed::{
    count_rows_by_bucket, drops_rows, replace_scan, windowable_scan,
};

/// A position shuffle's input, placed row group by row group in rank order;
/// see the module docs.
#[derive(Debug)]
pub struct RankedRowGroups {
    /// The shuffle's input: its rows, then each row's file and row index.
    input: Arc<dyn ExecutionPlan>,
    /// The input's one Parquet scan and its configuration.
    scan: Arc<dyn ExecutionPlan>,
    config: FileScanConfig,
    layout: ScanLayout,
    /// The row groups in rank order.
    units: Vec<Unit>,
    /// `starts[k]`: the rank of row group `k`'s first row; one more entry,
    /// the rows in all.
    starts: Vec<u64>,
    /// Something under the shuffle drops rows: a rank's offset in its row
    /// group is not its row's offset in the file's row group.
    counted: bool,
}

impl RankedRowGroups {
    /// The row groups of `shuffle`'s input in rank order, with their rows:
    /// from the footers when nothing under the shuffle drops rows, else
    /// counted once by a query over `rows` (the query the shuffle orders,
    /// planned in `state`) that reads only what its filters read.
    pub async fn read(
        shuffle: &PositionShuffleExec,
        state: &SessionState,
        rows: &LogicalPlan,
    ) -> Result<Self> {
        let input = Arc::clone(shuffle.input());
        let scan = windowable_scan(&input).map_err(|why| {
            exec_datafusion_err!(
                "reading rows of an epoch by position (dataset(), --rows) reads the query's \
                 Parquet row groups one at a time, which fails here: like SHUFFLE WINDOW, \
                 it {why}; iterate the feed instead"
            )
        })?;
        Self::read_counting_query(input, scan, state, rows).await
    }

    /// The row groups of `input` (a position shuffle's input, whose one
    /// Parquet scan is `scan` with `config`) in rank order, counted under a
    /// filter by a query over `rows` (the rows the shuffle orders, planned
    /// in `state`) that reads only what its filters read.
    pub(crate) async fn read_counting_query(
        input: Arc<dyn ExecutionPlan>,
        (scan, config): (Arc<dyn ExecutionPlan>, FileScanConfig),
        state: &SessionState,
        rows: &LogicalPlan,
    ) -> Result<Self> {
        let layout = ScanLayout::read(&config, state.runtime_env()).await?;
        let units = layout.units();
        let counts: Vec<u64> = if drops_rows(&input)? {
            let grain = layout.grain();
            let buckets: HashMap<(String, u64), u64> =
                count_rows_by_bucket(state, rows.clone(), grain).await?;
            let one_each: Vec<Vec<Unit>> = units.iter().map(|&u| vec![u]).collect();
            layout.counted_windows(&one_each, &buckets)
        } else {
            units.iter().map(|unit| unit.rows).collect()
        };
        Self::with_counts(input, scan, config, layout, units, counts)
    }

    /// The row groups of `input` (a position shuffle's input, whose one
    /// Parquet scan is `scan` with `config`) in rank order, with the rows
    /// its filters keep taken from `buckets` (counted per file and bucket
    /// of rows where the query was planned: a cluster feed's rank).
    pub(crate) async fn read_with_buckets(
        input: Arc<dyn ExecutionPlan>,
        (scan, config): (Arc<dyn ExecutionPlan>, FileScanConfig),
        runtime: &datafusion::execution::runtime_env::RuntimeEnv,
        (grain, buckets): &crate::shuffle::windowed::BucketRows,
    ) -> Result<Self> {
        let layout = ScanLayout::read(&config, runtime).await?;
        if layout.grain() != *grain {
            return plan_err!(
                "SHUFFLE BY POSITION: the rows its filters keep were counted in buckets of \
                 {grain} rows, where the files' row groups now give buckets of {}: the \
                 files changed since; run the epoch again",
                layout.grain()
            );
        }
        let units = layout.units();
        let one_each: Vec<Vec<Unit>> = units.iter().map(|&u| vec![u]).collect();
        let counts = layout.counted_windows(&one_each, buckets);
        Self::with_counts(input, scan, config, layout, units, counts)
    }

    /// The row groups of `input` (a position shuffle's input, whose one
    /// Parquet scan is `scan` with `config`) in rank order, counted by
    /// reading them when something under the shuffle drops rows: every row
    /// group's rows through the whole input, `at_once` row groups at a
    /// time, each on its own task. What an epoch spilled by position range
    /// uses, which has no logical plan to count only the filters' columns
    /// with.
    pub(crate) async fn read_by_reading(
        input: Arc<dyn ExecutionPlan>,
        (scan, config): (Arc<dyn ExecutionPlan>, FileScanConfig),
        ctx: &Arc<TaskContext>,
        at_once: usize,
    ) -> Result<Self> {
        let layout = ScanLayout::read(&config, ctx.runtime_env().as_ref()).await?;
        let units = layout.units();
        let counts: Vec<u64> = if drops_rows(&input)? {
            let cuts: Vec<Arc<dyn ExecutionPlan>> = units
                .iter()
                .map(|&unit| {
                    replace_scan(Arc::clone(&input), &scan, layout.scan(&config, &[unit]))
                })
                .collect::<Result<_>>()?;
            // Collected first: a lazy map's closure would make the future
            // not `Send` for every lifetime.
            let counting: Vec<_> = cuts
                .into_iter()
                .map(|cut| {
                    let ctx = Arc::clone(ctx);
                    async move {
                        SpawnedTask::spawn(count_rows(cut, ctx))
                            .join()
                            .await
                            .map_err(|e| {
                                exec_datafusion_err!("counting a row group: {e}")
                            })?
                    }
                })
                .collect();
            futures::stream::iter(counting)
                .buffered(at_once.max(1))
                .try_collect()
                .await?
        } else {
            units.iter().map(|unit| unit.rows).collect()
        };
        Self::with_counts(input, scan, config, layout, units, counts)
    }

    fn with_counts(
        input: Arc<dyn ExecutionPlan>,
        scan: Arc<dyn ExecutionPlan>,
        config: FileScanConfig,
        layout: ScanLayout,
        units: Vec<Unit>,
        counts: Vec<u64>,
    ) -> Result<Self> {
        let counted = drops_rows(&input)?;
        let mut starts = Vec::with_capacity(counts.len() + 1);
        let mut start = 0u64;
        starts.push(start);
        for rows in counts {
            start += rows;
            starts.push(start);
        }
        Ok(Self {
            input,
            scan,
            config,
            layout,
            units,
            starts,
            counted,
        })
    }

    /// Rows that reach the shuffle: the epoch's length.
    pub fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// Whether no row reaches the shuffle.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rank of each row group's first row: one entry per row group in
    /// rank order, then the rows in all.
    pub(crate) fn starts(&self) -> &[u64] {
        &self.starts
    }

    /// The files in rank order (their paths as the object store names
    /// them, as `input_file_name()` gives them), each with its row groups:
    /// the row index of the group's first row in the file (from the
    /// footers, before any filter) and the group's number in rank order.
    pub(crate) fn files(&self) -> Vec<(String, Vec<(u64, usize)>)> {
        let mut files: Vec<(String, Vec<(u64, usize)>)> = Vec::new();
        let mut first_row = 0;
        for (group, unit) in self.units.iter().enumerate() {
            while files.len() <= unit.file {
                files.push((self.layout.location(files.len()), Vec::new()));
                first_row = 0;
            }
            files[unit.file].1.push((first_row, group));
            first_row += unit.rows;
        }
        files
    }

    /// The row group holding rank `rank` (its number in rank order) and the
    /// rank's offset in it; `None` past the last rank.
    pub fn locate(&self, rank: u64) -> Option<(usize, u64)> {
        locate(&self.starts, rank)
    }

    /// An error naming the first file of row groups `groups` that changed
    /// since the listing: another size, or another entity tag (else last
    /// change, to the second: some stores list finer times than their
    /// headers give). Each file is asked once. Reading a changed file's row
    /// group would read its footer at the listed size, and call it damaged.
    pub async fn check_unchanged(
        &self,
        groups: &[usize],
        ctx: &TaskContext,
    ) -> Result<()> {
        let mut files: Vec<usize> = groups
            .iter()
            .filter_map(|&group| self.units.get(group).map(|unit| unit.file))
            .collect();
        files.sort_unstable();
        files.dedup();
        let store = ctx
            .runtime_env()
            .object_store(&self.config.object_store_url)?;
        for file in files {
            let Some(listed) = self.layout.file_meta(file) else {
                continue;
            };
            let now = store.head(&listed.location).await.map_err(|e| {
                exec_datafusion_err!(
                    "cannot reach {} again to read its rows by position: {e}; check that \
                     it is still there, or plan the epoch again (dataset(epoch))",
                    listed.location
                )
            })?;
            let same_version = match (&listed.e_tag, &now.e_tag) {
                (Some(listed), Some(now)) => listed == now,
                _ => listed.last_modified.timestamp() == now.last_modified.timestamp(),
            };
            if now.size != listed.size || !same_version {
                return plan_err!(
                    "{} changed since the epoch was planned (it had {} bytes, changed {}; now \
                     {} bytes, changed {}): its rows by position would be another file's; \
                     plan the epoch again (dataset(epoch))",
                    listed.location,
                    listed.size,
                    listed.last_modified,
                    now.size,
                    now.last_modified
                );
            }
        }
        Ok(())
    }

    /// Row group `group`'s rows (in rank order) as the shuffle holds them:
    /// without the two position columns. The caller checks first that its
    /// file did not change ([`Self::check_unchanged`]).
    pub async fn read_group(
        &self,
        group: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<RecordBatch> {
        let Some(&unit) = self.units.get(group) else {
            return internal_err!("row group {group} of a position shuffle's input");
        };
        let cut = self.layout.scan(&self.config, &[unit]);
        let counted = self.starts[group + 1] - self.starts[group];
        let rows = self.read_cut(cut, unit, ctx).await?;
        if rows.num_rows() as u64 != counted {
            return plan_err!(
                "row group {} of {} gave {} rows where it was counted at {counted}: did \
                 the file change since the epoch was planned? Plan it again",
                unit.row_group,
                self.layout.location(unit.file),
                rows.num_rows()
            );
        }
        without_positions(&rows)
    }

    /// Whether a rank's offset in its row group is its row's offset there
    /// (nothing under the shuffle drops rows), so that [`Self::read_rows`]
    /// can read rows of a row group alone.
    pub fn reads_rows_alone(&self) -> bool {
        !self.counted
    }

    /// Rows `offsets` (rising, no repeats) of row group `group`, as the
    /// shuffle holds them, read alone: the pages holding them, not the row
    /// group (the file's page index permitting). Only where
    /// [`Self::reads_rows_alone`]; the caller checks first that the file did
    /// not change ([`Self::check_unchanged`]).
    pub async fn read_rows(
        &self,
        group: usize,
        offsets: &[u64],
        ctx: Arc<TaskContext>,
    ) -> Result<RecordBatch> {
        let Some(&unit) = self.units.get(group) else {
            return internal_err!("row group {group} of a position shuffle's input");
        };
        if self.counted {
            return internal_err!("rows read alone under a filter");
        }
        if offsets.windows(2).any(|w| w[0] >= w[1])
            || offsets.last().is_some_and(|&last| last >= unit.rows)
        {
            return internal_err!(
                "rows {offsets:?} of a row group of {} rows",
                unit.rows
            );
        }
        let cut = self.layout.rows_scan(&self.config, unit, offsets);
        let rows = self.read_cut(cut, unit, ctx).await?;
        // The rows asked for, by row index in the file.
        let first_row = self.layout.first_row(unit);
        let row_indexes = rows
            .column(rows.num_columns() - 1)
            .as_primitive::<Int64Type>()
            .values();
        let expected = offsets.iter().map(|&offset| (first_row + offset) as i64);
        if rows.num_rows() != offsets.len() || !expected.eq(row_indexes.iter().copied()) {
            return plan_err!(
                "rows of row group {} of {} read alone are not the rows asked for ({} of \
                 {}): did the file change since the epoch was planned? Plan it again",
                unit.row_group,
                self.layout.location(unit.file),
                rows.num_rows(),
                offsets.len()
            );
        }
        without_positions(&rows)
    }

    /// The rows of `cut` (the input with its scan cut to rows of `unit`) by
    /// row index, with their position columns; a row read twice is an error.
    async fn read_cut(
        &self,
        cut: Arc<dyn ExecutionPlan>,
        unit: Unit,
        ctx: Arc<TaskContext>,
    ) -> Result<RecordBatch> {
        let file = self.layout.location(unit.file);
        let input = replace_scan(Arc::clone(&self.input), &self.scan, cut)?;
        let schema = input.schema();
        let batches = datafusion::physical_plan::collect(input, ctx).await?;
        let all = concat_batches(&schema, &batches)?;
        let Some(row_column) = all.num_columns().checked_sub(1) else {
            return internal_err!("a position shuffle's input without columns");
        };
        let rows = all
            .column(row_column)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| exec_datafusion_err!("the row column is not Int64"))?;
        let order = sort_to_indices(rows, None, None)?;
        let sorted = crate::exec::batches::take_rows(&all, &order)?;
        let sorted_rows = sorted.column(row_column).as_primitive::<Int64Type>();
        if let Some(pair) = sorted_rows.values().windows(2).find(|w| w[0] == w[1]) {
            return exec_err!(
                "SHUFFLE BY POSITION: row {} of {file} reached the shuffle twice",
                pair[0]
            );
        }
        Ok(sorted)
    }
}

/// `rows` without their last two columns (the file and row index).
fn without_positions(rows: &RecordBatch) -> Result<RecordBatch> {
    let kept: Vec<usize> = (0..rows.num_columns().saturating_sub(2)).collect();
    Ok(RecordBatch::try_new_with_options(
        Arc::new(rows.schema().project(&kept)?),
        kept.iter().map(|&c| Arc::clone(rows.column(c))).collect(),
        &RecordBatchOptions::new().with_row_count(Some(rows.num_rows())),
    )?)
}

/// The rows `plan` gives, over all its partitions, read one partition
/// after another without holding them.
async fn count_rows(plan: Arc<dyn ExecutionPlan>, ctx: Arc<TaskContext>) -> Result<u64> {
    let mut rows = 0u64;
    for partition in 0..plan.properties().partitioning.partition_count() {
        let mut stream = plan.execute(partition, Arc::clone(&ctx))?;
        while let Some(batch) = stream.next().await {
            rows += batch?.num_rows() as u64;
        }
    }
    Ok(rows)
}

/// The group of running sums `starts` (the first rank of each group, then
/// the rows in all) that holds `rank`, and the rank's offset in it.
fn locate(starts: &[u64], rank: u64) -> Option<(usize, u64)> {
    if rank >= starts.last().copied().unwrap_or(0) {
        return None;
    }
    // The last group starting at or before `rank`: an empty group starts
    // where the next one does, so it is never the one found.
    let group = starts.partition_point(|&start| start <= rank) - 1;
    Some((group, rank - starts[group]))
}

#[cfg(test)]
mod tests {
    use super::locate;

    /// `locate` over running sums with empty row groups: ranks land in the
    /// group that holds them, never in an empty one, and none past the end.
    #[test]
    fn ranks_are_placed_in_the_row_group_that_holds_them() {
        let starts = [0u64, 3, 3, 5, 5, 9];
        let locate = |rank| locate(&starts, rank);
        assert_eq!(locate(0), Some((0, 0)));
        assert_eq!(locate(2), Some((0, 2)));
        assert_eq!(locate(3), Some((2, 0)));
        assert_eq!(locate(4), Some((2, 1)));
        assert_eq!(locate(5), Some((4, 0)));
        assert_eq!(locate(8), Some((4, 3)));
        assert_eq!(locate(9), None);
        assert_eq!(super::locate(&[0], 0), None, "no rows");
        assert_eq!(super::locate(&[0, 0, 2], 0), Some((1, 0)));
    }
}
