//! What the crate's unit tests share: Parquet files written and queries
//! planned the way the tests of several modules need them.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::error::Result;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{ParquetReadOptions, SessionContext};

/// Writes `batch` as the Parquet file `path`, with `properties` (the
/// writer's defaults when `None`).
pub(crate) fn write_parquet(
    path: &Path,
    batch: &RecordBatch,
    properties: Option<WriterProperties>,
) -> Result<()> {
    let file = std::fs::File::create(path)?;
    let mut writer = ArrowWriter::try_new(file, batch.schema(), properties)?;
    writer.write(batch)?;
    writer.close()?;
    Ok(())
}

/// The physical plan of `sql` on `ctx` after registering the Parquet file
/// or folder `location` as `t`.
pub(crate) async fn plan_over_parquet(
    ctx: &SessionContext,
    location: &Path,
    sql: &str,
) -> Result<Arc<dyn ExecutionPlan>> {
    let location = location.display().to_string();
    ctx.register_parquet("t", location, ParquetReadOptions::default())
        .await?;
    ctx.sql(sql).await?.create_physical_plan().await
}

/// The values of the first column of `batches`, an `Int64` column (none
/// from a batch whose first column is of another type).
pub(crate) fn first_int64s(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .map(|a| a.values().to_vec())
                .unwrap_or_default()
        })
        .collect()
}
