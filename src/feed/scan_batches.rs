//! Record batches of wide rows kept small: a feed's file scans read about
//! `sqlfeed.scan_batch_bytes` (4 MiB) per record batch instead of the
//! session's batch size in rows.
//!
//! ```text
//!  DataSourceExec (files)  batch_size = None → the session's (8192 rows)
//!        │  statistics: byte size (or its columns' sum) / rows = bytes per row
//!        ▼
//!  DataSourceExec (files)  batch_size = Some(scan_batch_bytes / bytes per row),
//!                          between MIN_SCAN_BATCH_ROWS and the session's
//! ```
//!
//! # Why
//! At the session's 8192 rows, a record batch of 3 KiB images is 25 MB, and
//! the Parquet reader grows each one from nothing: every batch is fresh
//! memory that the kernel zeroes on first touch, larger than any cache.
//! Measured on the W2 feed (1M rows of 3 KiB images, 2 cores, Python loop,
//! A B A B over five pairs): 8192-row batches 2.25–3.48 s, 2.0–3.5 s of
//! system time and 1.5–1.6 GB peak RSS; 1024-row batches 2.19–2.45 s,
//! 1.1–1.5 s and 1.1–1.2 GB.
//!
//! # Ordering
//! Only the scans' record batches change. An unshuffled feed interleaves
//! its lanes in turns of the session's batch size in rows, whatever the
//! batch boundaries (`crate::exec::lanes`), and a shuffle orders rows by
//! content, so every batch a feed hands over is the same.
//!
//! # When not
//! A scan without both statistics (row count and byte size), or whose rows
//! are narrow enough that the session's batch size fits, is left as planned;
//! so is every scan with `sqlfeed.scan_batch_bytes` 0, and every scan under
//! a global shuffle, which runs its subtree with batches sized for its
//! share of the memory limit (`ShuffleMergeExec`).

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::{FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

use crate::shuffle::ShuffleMergeExec;

/// The fewest rows a fitted scan batch holds, however wide its rows.
pub(super) const MIN_SCAN_BATCH_ROWS: usize = 64;

/// `plan` with each file scan whose rows are wide reading record batches of
/// about `batch_bytes` (0: none); see the module docs.
pub(super) fn fit_scan_batches(
    plan: Arc<dyn ExecutionPlan>,
    batch_bytes: usize,
    session_batch_rows: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    if batch_bytes == 0 {
        return Ok(plan);
    }
    plan.transform_down(|node| {
        // A shuffle runs its subtree with batches sized for its memory share
        // (`ShuffleMergeExec`): its scans read those.
        if node.downcast_ref::<ShuffleMergeExec>().is_some() {
            return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
        }
        let Some(config) = node
            .downcast_ref::<DataSourceExec>()
            .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
        else {
            return Ok(Transformed::no(node));
        };
        if config.batch_size.is_some() {
            return Ok(Transformed::no(node));
        }
        let statistics =
            StatisticsContext::new().compute(node.as_ref(), &StatisticsArgs::new())?;
        let rows = statistics.num_rows.get_value().copied();
        // A projected scan knows its columns' sizes, not always their sum.
        let bytes = statistics.total_byte_size.get_value().copied().or_else(|| {
            statistics
                .column_statistics
                .iter()
                .map(|column| column.byte_size.get_value().copied())
                .sum::<Option<usize>>()
        });
        match fitted_rows(rows, bytes, batch_bytes, session_batch_rows) {
            Some(fitted) => {
                let config = FileScanConfigBuilder::from(config.clone())
                    .with_batch_size(Some(fitted))
                    .build();
                let scan: Arc<dyn ExecutionPlan> =
                    DataSourceExec::from_data_source(config);
                Ok(Transformed::yes(scan))
            }
            None => Ok(Transformed::no(node)),
        }
    })
    .map(|transformed| transformed.data)
}

/// Rows per scan batch of about `batch_bytes` for `rows` rows of `bytes`
/// bytes in all, or `None` when the session's batch size already fits (or
/// nothing is known).
fn fitted_rows(
    rows: Option<usize>,
    bytes: Option<usize>,
    batch_bytes: usize,
    session_batch_rows: usize,
) -> Option<usize> {
    let (rows, bytes) = (rows.filter(|&r| r > 0)?, bytes.filter(|&b| b > 0)?);
    let row_bytes = bytes.div_ceil(rows);
    let fitted = (batch_bytes / row_bytes).max(MIN_SCAN_BATCH_ROWS);
    (fitted < session_batch_rows).then_some(fitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_rows_get_batches_of_about_four_mebibytes() {
        // 3 KiB rows (W2's images): 1365 rows of 4 MiB.
        assert_eq!(
            fitted_rows(Some(1000), Some(3072 * 1000), 4 << 20, 8192),
            Some(1365)
        );
        // 1 MiB rows: never fewer than the minimum.
        assert_eq!(
            fitted_rows(Some(10), Some(10 << 20), 4 << 20, 8192),
            Some(MIN_SCAN_BATCH_ROWS)
        );
    }

    #[test]
    fn narrow_rows_and_unknown_sizes_keep_the_session_batch_size() {
        // 64-byte rows: 65536 rows would fit, the session's 8192 stay.
        assert_eq!(fitted_rows(Some(1000), Some(64_000), 4 << 20, 8192), None);
        assert_eq!(fitted_rows(None, Some(64_000), 4 << 20, 8192), None);
        assert_eq!(fitted_rows(Some(1000), None, 4 << 20, 8192), None);
        assert_eq!(fitted_rows(Some(0), Some(0), 4 << 20, 8192), None);
    }
}
