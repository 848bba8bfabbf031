//! Record batches of wide rows kept small: a feed's file scans read about
//! `sqlfeed.scan_batch_bytes` (4 MiB) per record batch instead of the
//! session's batch size in rows.
//!
//! ```text
//!  DataSourceExec (files)  batch_size = None → the session's (8192 rows)
//!        │  bytes per row: statistics (byte size, or its columns' sum) / rows,
//!        │  else the first Parquet file's footer (uncompressed chunk sizes)
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
//! A scan whose width neither statistics nor a Parquet footer tell, or whose rows
//! are narrow enough that the session's batch size fits, is left as planned;
//! so is every scan with `sqlfeed.scan_batch_bytes` 0, and every scan under
//! a global shuffle, which runs its subtree with batches sized for its
//! share of the memory limit (`ShuffleMergeExec`).

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::parquet::{
    CachedParquetFileReaderFactory, ParquetFileReaderFactory,
};
use datafusion::datasource::physical_plan::{FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

use crate::shuffle::ShuffleMergeExec;

/// The fewest rows a fitted scan batch holds, however wide its rows.
pub(super) const MIN_SCAN_BATCH_ROWS: usize = 64;

/// `plan` with each file scan whose rows are wide reading record batches of
/// about `batch_bytes` (0: none); see the module docs. `runtime` holds the
/// object stores a footer is read from when the statistics lack sizes.
pub(super) async fn fit_scan_batches(
    plan: Arc<dyn ExecutionPlan>,
    batch_bytes: usize,
    session_batch_rows: usize,
    runtime: &RuntimeEnv,
) -> Result<Arc<dyn ExecutionPlan>> {
    if batch_bytes == 0 {
        return Ok(plan);
    }
    // The scans to fit, in the order `transform_down` visits them (both
    // walk the tree first node first), and their rows' widths.
    let mut scans = vec![];
    plan.apply(|node| {
        if node.downcast_ref::<ShuffleMergeExec>().is_some() {
            return Ok(TreeNodeRecursion::Jump);
        }
        if unsized_file_scan(node).is_some() {
            scans.push(Arc::clone(node));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut widths = Vec::with_capacity(scans.len());
    for scan in &scans {
        widths.push(row_bytes(scan, runtime).await?);
    }
    let mut widths = widths.into_iter();
    plan.transform_down(|node| {
        // A shuffle runs its subtree with batches sized for its memory share
        // (`ShuffleMergeExec`): its scans read those.
        if node.downcast_ref::<ShuffleMergeExec>().is_some() {
            return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
        }
        let Some(config) = unsized_file_scan(&node) else {
            return Ok(Transformed::no(node));
        };
        let width = widths.next().flatten();
        match fitted_rows(width, batch_bytes, session_batch_rows) {
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

/// `node`'s file scan configuration, if it is a file scan whose batch size
/// is the session's.
fn unsized_file_scan(node: &Arc<dyn ExecutionPlan>) -> Option<&FileScanConfig> {
    node.downcast_ref::<DataSourceExec>()
        .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
        .filter(|config| config.batch_size.is_none())
}

/// Decoded bytes per row of `scan`'s output: from its statistics (the
/// byte size, or its columns' sum where a projection hides the total), else
/// from the first file's Parquet footer (writers such as pyarrow record no
/// size statistics by default, the footer has every column chunk's
/// uncompressed size). `None` when neither tells.
async fn row_bytes(
    scan: &Arc<dyn ExecutionPlan>,
    runtime: &RuntimeEnv,
) -> Result<Option<usize>> {
    let statistics =
        StatisticsContext::new().compute(scan.as_ref(), &StatisticsArgs::new())?;
    let rows = statistics.num_rows.get_value().copied().filter(|&r| r > 0);
    let bytes = statistics.total_byte_size.get_value().copied().or_else(|| {
        statistics
            .column_statistics
            .iter()
            .map(|column| column.byte_size.get_value().copied())
            .sum::<Option<usize>>()
    });
    if let (Some(rows), Some(bytes)) = (rows, bytes) {
        return Ok(Some(bytes.div_ceil(rows)));
    }
    Ok(footer_row_bytes(scan, runtime).await)
}

/// Uncompressed bytes per row of `scan`'s columns in its first Parquet
/// file's footer; `None` for other formats or a footer that cannot be read
/// (the scan then reports that itself, with the file's name).
async fn footer_row_bytes(
    scan: &Arc<dyn ExecutionPlan>,
    runtime: &RuntimeEnv,
) -> Option<usize> {
    let config = unsized_file_scan(scan)?;
    if config.file_source().file_type() != "parquet" {
        return None;
    }
    let file = config.file_groups.iter().flat_map(|g| g.iter()).next()?;
    let store = runtime.object_store(&config.object_store_url).ok()?;
    // Through the runtime's metadata cache, as DataFusion's own scan reads
    // footers: planning already read this one for its statistics, so each
    // epoch of a feed finds it there instead of fetching it again.
    let metadata_cache = runtime.cache_manager.get_file_metadata_cache();
    let mut reader: Box<dyn AsyncFileReader> =
        CachedParquetFileReaderFactory::new(store, metadata_cache)
            .create_reader(0, file.clone(), None, &ExecutionPlanMetricsSet::new())
            .ok()?;
    let metadata =
        ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new())
            .await
            .ok()?;
    // The file columns the scan reads (its own output may be expressions
    // over them, pushed into it).
    let file_schema = config.file_schema();
    let read: Vec<&str> = match config.file_source().projection() {
        Some(projection) => projection
            .column_indices()
            .into_iter()
            .filter_map(|i| file_schema.fields().get(i).map(|f| f.name().as_str()))
            .collect(),
        None => file_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect(),
    };
    let (mut rows, mut bytes) = (0usize, 0usize);
    for row_group in metadata.metadata().row_groups() {
        rows += usize::try_from(row_group.num_rows()).ok()?;
        for chunk in row_group.columns() {
            let top = chunk.column_path().parts().first()?;
            if read.contains(&top.as_str()) {
                bytes += usize::try_from(chunk.uncompressed_size()).ok()?;
            }
        }
    }
    (rows > 0 && bytes > 0).then(|| bytes.div_ceil(rows))
}

/// Rows per scan batch of about `batch_bytes` for rows of `row_bytes` bytes,
/// or `None` when the session's batch size already fits (or nothing is
/// known).
fn fitted_rows(
    row_bytes: Option<usize>,
    batch_bytes: usize,
    session_batch_rows: usize,
) -> Option<usize> {
    let row_bytes = row_bytes.filter(|&b| b > 0)?;
    let fitted = (batch_bytes / row_bytes).max(MIN_SCAN_BATCH_ROWS);
    (fitted < session_batch_rows).then_some(fitted)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{BinaryArray, Int64Array, RecordBatch};
    use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
    use datafusion::prelude::SessionContext;

    use super::*;
    use crate::test_util::plan_over_parquet;

    /// A file of 1000 rows of `id` and a distinct 3000-byte `blob`, written
    /// without statistics.
    fn wide_file_without_statistics(path: &std::path::Path) -> Result<()> {
        let batch = RecordBatch::try_from_iter(vec![
            ("id", Arc::new(Int64Array::from_iter_values(0..1000)) as _),
            (
                "blob",
                Arc::new(BinaryArray::from_iter_values((0..1000).map(|i: u32| {
                    let mut blob = vec![7u8; 3000];
                    blob[..4].copy_from_slice(&i.to_le_bytes());
                    blob
                }))) as _,
            ),
        ])?;
        let properties = WriterProperties::builder()
            .set_statistics_enabled(EnabledStatistics::None)
            .build();
        crate::test_util::write_parquet(path, &batch, Some(properties))
    }

    #[tokio::test]
    async fn a_footer_gives_the_width_of_the_columns_read() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("wide.parquet");
        wide_file_without_statistics(&path)?;
        let context = SessionContext::new();
        let plan = plan_over_parquet(&context, &path, "SELECT blob, id FROM t").await?;
        let mut scans = vec![];
        plan.apply(|node| {
            if unsized_file_scan(node).is_some() {
                scans.push(Arc::clone(node));
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        let [scan] = &scans[..] else {
            panic!("one file scan: {plan:?}");
        };
        // The footer: 3000 bytes of blob, 4-byte lengths and an 8-byte id.
        let width = footer_row_bytes(scan, &context.runtime_env()).await;
        let width = width.expect("a width from the footer");
        assert!((3000..3300).contains(&width), "{width}");
        // Only the columns read count.
        let ids = context
            .sql("SELECT id FROM t")
            .await?
            .create_physical_plan()
            .await?;
        let mut narrow = None;
        ids.apply(|node| {
            if unsized_file_scan(node).is_some() {
                narrow = Some(Arc::clone(node));
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        let narrow = narrow.expect("a file scan");
        let width = footer_row_bytes(&narrow, &context.runtime_env()).await;
        assert!(width.is_some_and(|w| w <= 16), "{width:?}");
        Ok(())
    }

    #[test]
    fn wide_rows_get_batches_of_about_four_mebibytes() {
        // 3 KiB rows (W2's images): 1365 rows of 4 MiB.
        assert_eq!(fitted_rows(Some(3072), 4 << 20, 8192), Some(1365));
        // 1 MiB rows: never fewer than the minimum.
        assert_eq!(
            fitted_rows(Some(1 << 20), 4 << 20, 8192),
            Some(MIN_SCAN_BATCH_ROWS)
        );
    }

    #[test]
    fn narrow_rows_and_unknown_sizes_keep_the_session_batch_size() {
        // 64-byte rows: 65536 rows would fit, the session's 8192 stay.
        assert_eq!(fitted_rows(Some(64), 4 << 20, 8192), None);
        assert_eq!(fitted_rows(None, 4 << 20, 8192), None);
        assert_eq!(fitted_rows(Some(0), 4 << 20, 8192), None);
    }
}
