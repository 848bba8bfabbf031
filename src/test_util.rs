//! What the crate's unit tests share: Parquet files written and queries
//! planned the way the tests of several modules need them.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
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
