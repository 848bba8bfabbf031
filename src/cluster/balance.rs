//! [`BalanceScanRows`]: the scan tasks under a global `SHUFFLE` get equal
//! numbers of rows, not equal numbers of bytes.
//!
//! ```text
//!  DataFusion (by bytes)            after BalanceScanRows (by rows)
//!  group 0: a.parquet  4 MB   200 rows   group 0: a.parquet, b.parquet[0..1.9 MB]  2,100 rows
//!  group 1: b.parquet  4 MB 4,000 rows   group 1: b.parquet[1.9 MB..4 MB]          2,100 rows
//! ```
//!
//! DataFusion cuts file scans into byte ranges of equal size. When rows
//! differ in size between files (photos of other resolutions, captions of
//! other lengths), a stage-1 task then reads many more rows than another,
//! and everything above it in the task — keying, the exchange, on a cluster
//! the functions too — waits for the slowest. This rule re-cuts the file
//! groups of a scan under a [`ShuffleKeyExec`] (or `PositionKeyExec`) by the files' row counts
//! (their statistics, which DataFusion collects when it lists Parquet files):
//! the same files, in the same order, as many groups as before, each file
//! range sized by its file's rows per byte. A range's rows are those of the
//! row groups whose first page starts in it (DataFusion's rule), so groups
//! are equal to within a row group.
//!
//! # Ordering
//! Only scans under a global shuffle are touched: the shuffle orders rows by
//! content, or by position (`PositionKeyExec`: a row's key is its file and
//! row, and under a filter a row group is still read whole by one task), so
//! which task reads a row changes nothing a consumer sees.
//! Unshuffled results, whose order follows the file groups, keep them.
//!
//! Scans of files without row statistics are left as they are.

use std::sync::Arc;

use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::datasource::listing::{FileRange, PartitionedFile};
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfig, FileScanConfigBuilder,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::{NodeRewrite, PlanNode, Rewritten};
use crate::shuffle::{PositionKeyExec, ShuffleKeyExec};

/// See the module docs.
#[derive(Debug, Default)]
pub struct BalanceScanRows;

crate::exec::node_rewrite_rule!(BalanceScanRows, "sqlfeed_balance_scan_rows");

impl NodeRewrite for BalanceScanRows {
    // From the root, to stop below the first `ShuffleKeyExec`.
    const ROOT_FIRST: bool = true;

    fn rewrite(&self, node: PlanNode, _config: &ConfigOptions) -> Rewritten {
        if node.as_ref().downcast_ref::<ShuffleKeyExec>().is_none()
            && node.as_ref().downcast_ref::<PositionKeyExec>().is_none()
        {
            return Ok(Transformed::no(node));
        }
        let balanced = node.transform_up(|below| {
            Ok(match balanced_scan(&below) {
                Some(scan) => Transformed::yes(scan),
                None => Transformed::no(below),
            })
        })?;
        Ok(Transformed::new(
            balanced.data,
            balanced.transformed,
            TreeNodeRecursion::Jump,
        ))
    }
}

/// One file range of a scan with the rows it holds (estimated from its
/// file's rows per byte).
struct Piece {
    file: PartitionedFile,
    start: u64,
    end: u64,
    rows_per_byte: f64,
}

/// `plan` re-cut by rows if it is a file scan whose files all have row
/// counts; `None` to leave it.
fn balanced_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let source = plan.as_ref().downcast_ref::<DataSourceExec>()?;
    let config = source.data_source().downcast_ref::<FileScanConfig>()?;
    // A window of `SHUFFLE WINDOW` (one range per row group, spread by
    // rows already): re-cut by files, it would read other rows.
    if crate::shuffle::is_window_scan(config) {
        return None;
    }
    let groups = config.file_groups.len();
    if groups < 2 {
        return None;
    }
    let mut pieces = Vec::new();
    for file in config.file_groups.iter().flat_map(|g| g.files()) {
        let size = file.object_meta.size;
        let rows = match file.statistics.as_ref().map(|s| s.num_rows) {
            Some(Precision::Exact(rows) | Precision::Inexact(rows)) => rows as f64,
            _ => return None,
        };
        if size == 0 {
            continue;
        }
        let (start, end) = match &file.range {
            Some(range) => (range.start.max(0) as u64, range.end.max(0) as u64),
            None => (0, size),
        };
        pieces.push(Piece {
            file: file.clone(),
            start,
            end,
            rows_per_byte: rows / size as f64,
        });
    }
    let total: f64 = pieces
        .iter()
        .map(|p| (p.end - p.start) as f64 * p.rows_per_byte)
        .sum();
    if total <= 0.0 {
        return None;
    }
    let quota = total / groups as f64;
    let mut cut: Vec<Vec<PartitionedFile>> = vec![Vec::new(); groups];
    let (mut group, mut filled) = (0usize, 0.0f64);
    for piece in pieces {
        let mut start = piece.start;
        while start < piece.end {
            let left_rows = (piece.end - start) as f64 * piece.rows_per_byte;
            let room = quota - filled;
            let end = if group + 1 == groups || left_rows <= room {
                piece.end
            } else {
                let bytes = (room / piece.rows_per_byte).ceil() as u64;
                (start + bytes.max(1)).min(piece.end)
            };
            let mut file = piece.file.clone();
            file.range = Some(FileRange {
                start: start as i64,
                end: end as i64,
            });
            cut[group].push(file);
            filled += (end - start) as f64 * piece.rows_per_byte;
            start = end;
            if filled >= quota - 0.5 && group + 1 < groups {
                group += 1;
                filled = 0.0;
            }
        }
    }
    let file_groups = cut.into_iter().map(FileGroup::new).collect();
    let config = FileScanConfigBuilder::from(config.clone())
        .with_file_groups(file_groups)
        .build();
    Some(DataSourceExec::from_data_source(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{BinaryArray, Int64Array, RecordBatch};
    use datafusion::error::Result;
    use datafusion::parquet::basic::Compression;
    use datafusion::parquet::file::properties::WriterProperties;
    use datafusion::physical_optimizer::PhysicalOptimizerRule;
    use datafusion::physical_plan::ExecutionPlanProperties;
    use datafusion::prelude::SessionContext;

    use crate::test_util::{plan_over_parquet, write_parquet};

    /// A file of `rows` rows of `payload` bytes each.
    fn write(path: &std::path::Path, rows: usize, payload: usize) -> Result<()> {
        let batch = RecordBatch::try_from_iter(vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..rows as i64)) as _,
            ),
            (
                "blob",
                Arc::new(BinaryArray::from_iter_values(
                    (0..rows).map(|i| vec![(i % 251) as u8; payload]),
                )) as _,
            ),
        ])?;
        let properties = WriterProperties::builder()
            .set_max_row_group_row_count(Some(50))
            .set_compression(Compression::UNCOMPRESSED)
            .build();
        write_parquet(path, &batch, Some(properties))
    }

    /// Rows each partition of `plan` reads.
    async fn rows_per_partition(
        ctx: &SessionContext,
        plan: Arc<dyn ExecutionPlan>,
    ) -> Result<Vec<usize>> {
        let parts =
            datafusion::physical_plan::collect_partitioned(plan, ctx.task_ctx()).await?;
        Ok(parts
            .iter()
            .map(|batches| batches.iter().map(RecordBatch::num_rows).sum())
            .collect())
    }

    #[tokio::test]
    async fn scans_under_a_shuffle_are_cut_by_rows() -> Result<()> {
        let dir = tempfile::tempdir()?;
        // The same bytes, 20× the rows in the second file.
        write(&dir.path().join("a.parquet"), 200, 2000)?;
        write(&dir.path().join("b.parquet"), 4000, 100)?;
        // Which rows a partition reads is what this test counts: so idle
        // partitions must not steal other partitions' files (DataFusion 55
        // lets them by default, which made this test fail now and then).
        let mut config =
            datafusion::prelude::SessionConfig::new().with_target_partitions(2);
        config
            .options_mut()
            .execution
            .enable_file_stream_work_stealing = false;
        let ctx = SessionContext::new_with_config(config);
        let scan = plan_over_parquet(&ctx, dir.path(), "SELECT id, blob FROM t").await?;
        let by_bytes = rows_per_partition(&ctx, Arc::clone(&scan)).await?;
        assert_eq!(by_bytes.len(), 2);
        assert_eq!(by_bytes.iter().sum::<usize>(), 4200);
        let skew = |rows: &[usize]| *rows.iter().max().unwrap_or(&0) as f64 / 2100.0;
        assert!(skew(&by_bytes) > 1.5, "by bytes: {by_bytes:?}");

        // Under a shuffle key the scan is re-cut; alone it is not.
        let keyed: Arc<dyn ExecutionPlan> =
            Arc::new(ShuffleKeyExec::try_new(Arc::clone(&scan), 1, 0)?);
        let balanced = BalanceScanRows.optimize(keyed, ctx.state().config_options())?;
        let scan_below = Arc::clone(balanced.children()[0]);
        assert_eq!(scan_below.output_partitioning().partition_count(), 2);
        let by_rows = rows_per_partition(&ctx, scan_below).await?;
        assert_eq!(by_rows.iter().sum::<usize>(), 4200, "{by_rows:?}");
        assert!(skew(&by_rows) < 1.1, "by rows: {by_rows:?}");
        let untouched =
            BalanceScanRows.optimize(Arc::clone(&scan), ctx.state().config_options())?;
        assert!(Arc::ptr_eq(&untouched, &scan));
        Ok(())
    }
}
