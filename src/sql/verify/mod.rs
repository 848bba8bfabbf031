//! `VERIFY '<path or glob>' [DECODE <column>[, …]]` and `sqlfeed verify`:
//! the check a user runs on a dataset before a week of training.
//!
//! Every page of every column chunk of every matching Parquet file is read
//! and decoded (with page checksums verified where the file has them, see
//! docs/bad-input.md), and each value of the `DECODE` columns is
//! decoded as an image with the same checks as `image_decode` (truncated
//! files are errors). One row per file says `ok`, or where it first fails:
//!
//! ```text
//!   files (listing order) ──► up to 2 files at once
//!                               │ footer (a damaged footer: one problem)
//!                               ▼
//!                  column chunks (row group × leaf column), each a task,
//!                  up to `target_partitions` at once, read in batches of
//!                  about 4 MB with only that one leaf projected
//!                               │ pages: checksum, decompress, decode;
//!                               │ rows decoded = rows in the footer;
//!                               │ DECODE columns: every value decoded
//!                               ▼
//!   one row per file: file │ status │ rows │ row_groups │ column_chunks │
//!                     images │ bytes │ problem
//! ```
//!
//! # Memory
//! Each column chunk in flight holds one batch of one column (about 4 MB,
//! fewer rows for wide values) and, while decoding, one image; the batch is
//! reserved from the session's pool. A file's footer is held while its
//! chunks are read.
//!
//! # Ordering
//! Rows come out in listing order (sorted paths) as each file finishes, so
//! the output is the same on every run; the progress bar of the CLI counts
//! the files and bytes of the plan like any scan.
//!
//! # Limits
//! It runs where the statement runs (the embedded engine), reading the files
//! through the session's object stores; `problem` lists up to
//! [`MAX_PROBLEMS`] problems of a file and counts the rest.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::internal_err;
use datafusion::dataframe::DataFrame;
use datafusion::datasource::TableType;
use datafusion::error::Result;
use datafusion::execution::{FunctionRegistry, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use object_store::{ObjectMeta, ObjectStore};

/// Problems listed per file; more are counted.
pub const MAX_PROBLEMS: usize = 5;
/// Bytes of one column's values read at once.
const BATCH_BYTES: usize = 4 << 20;
/// Files whose column chunks are read at once (their footers are held).
const FILES_AT_ONCE: usize = 2;

/// The parsed `VERIFY` statement.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifySpec {
    /// A path, glob or URL, as in `FROM '…'`.
    pub path: String,
    /// Columns whose values are decoded as images.
    pub decode: Vec<String>,
}

/// One file to verify.
#[derive(Debug, Clone)]
pub struct VerifyFile {
    /// As the user knows it: the local path or the full URL.
    pub display: String,
    /// Its location and size in the object store.
    pub meta: ObjectMeta,
}

/// Plans `VERIFY`: lists the files now, reads them when executed.
pub(super) async fn verify(ctx: &SessionContext, spec: &VerifySpec) -> Result<DataFrame> {
    let state = ctx.state();
    let (store, files) =
        crate::sql::url_table::list_parquet_files(&state, &spec.path).await?;
    // The same pixel limit as the session's `image_decode`.
    let max_pixels = ctx
        .udf("image_decode")
        .ok()
        .and_then(|udf| {
            udf.inner()
                .downcast_ref::<sqlfeed_udfs::image::ImageDecodeFunc>()
                .map(|decode| decode.max_pixels())
        })
        .unwrap_or(sqlfeed_udfs::image::DEFAULT_MAX_PIXELS);
    let table = VerifyTable {
        exec: Arc::new(VerifyExec::new(
            store,
            files,
            spec.decode.clone(),
            max_pixels,
        )),
    };
    ctx.read_table(Arc::new(table))
}

/// The output of `VERIFY`.
pub fn verify_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("file", DataType::Utf8, false),
        Field::new("status", DataType::Utf8, false),
        Field::new("rows", DataType::UInt64, false),
        Field::new("row_groups", DataType::UInt64, false),
        Field::new("column_chunks", DataType::UInt64, false),
        Field::new("images", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
        Field::new("problem", DataType::Utf8, true),
    ]))
}

/// Rows of a `VERIFY` result whose status is not `ok`.
pub fn damaged_files(batch: &RecordBatch) -> u64 {
    batch
        .column_by_name("status")
        .and_then(|status| status.as_string_opt::<i32>())
        .map(|status| status.iter().filter(|s| *s != Some("ok")).count() as u64)
        .unwrap_or(0)
}

#[derive(Debug)]
struct VerifyTable {
    exec: Arc<VerifyExec>,
}

#[async_trait::async_trait]
impl TableProvider for VerifyTable {
    fn schema(&self) -> SchemaRef {
        verify_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let exec = Arc::clone(&self.exec) as Arc<dyn ExecutionPlan>;
        let schema = exec.schema();
        match projection {
            Some(columns) if columns.len() != schema.fields().len() => {
                let exprs = columns
                    .iter()
                    .map(|&i| {
                        let name = schema.field(i).name().clone();
                        let column: Arc<dyn PhysicalExpr> = Arc::new(
                            datafusion::physical_expr::expressions::Column::new(&name, i),
                        );
                        (column, name)
                    })
                    .collect::<Vec<_>>();
                Ok(Arc::new(
                    datafusion::physical_plan::projection::ProjectionExec::try_new(
                        exprs, exec,
                    )?,
                ))
            }
            _ => Ok(exec),
        }
    }
}

/// Reads every page of `files`; one output row per file (see the module
/// docs).
#[derive(Debug)]
pub struct VerifyExec {
    store: Arc<dyn ObjectStore>,
    files: Vec<VerifyFile>,
    decode: Vec<String>,
    max_pixels: u64,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl VerifyExec {
    /// Verifies `files` of `store`, decoding the `decode` columns as images
    /// of at most `max_pixels`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        files: Vec<VerifyFile>,
        decode: Vec<String>,
        max_pixels: u64,
    ) -> Self {
        let properties = crate::exec::one_bounded_partition(
            verify_schema(),
            EmissionType::Incremental,
        );
        Self {
            store,
            files,
            decode,
            max_pixels,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The files this plan reads (for progress totals).
    pub fn files(&self) -> &[VerifyFile] {
        &self.files
    }
}

impl DisplayAs for VerifyExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let decode = format!("[{}]", self.decode.join(", "));
        let files = self.files.len();
        let mut settings: Vec<Setting> = vec![("files", &files)];
        if !self.decode.is_empty() {
            settings.push(("decode", &decode));
        }
        crate::exec::fmt_settings(f, t, "VerifyExec", &settings)
    }
}

impl ExecutionPlan for VerifyExec {
    crate::exec::leaf!("VerifyExec");

    crate::exec::metrics_of_field!();

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        if partition != 0 {
            return internal_err!("VerifyExec has one partition, not {partition}");
        }
        let shared = Arc::new(Shared {
            store: Arc::clone(&self.store),
            decode: self.decode.clone(),
            max_pixels: self.max_pixels,
            chunks_at_once: ctx.session_config().target_partitions().max(1),
            pool: Arc::clone(ctx.memory_pool()),
            pages: Counters::new(&self.metrics),
            metrics: self.metrics.clone(),
            decode_found: Mutex::new(HashSet::new()),
        });
        let at_end = Arc::clone(&shared);
        let output = futures::stream::iter(self.files.clone())
            .map(move |file| {
                let shared = Arc::clone(&shared);
                async move {
                    let report = verify_file(&shared, &file).await?;
                    report.into_batch(&file)
                }
            })
            .buffered(FILES_AT_ONCE)
            .map(|batch| batch.map(Some))
            .chain(futures::stream::once(async move {
                missing_decode_columns(&at_end)
            }))
            .filter_map(|result| async move { result.transpose() });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            verify_schema(),
            output,
        )))
    }
}

mod file;
use crate::exec::{BatchStream, Setting};
use file::{Counters, Shared, missing_decode_columns, verify_file};
pub(crate) use file::{locate_damage, reason};

#[cfg(test)]
mod tests {
    use super::file::FileReport;
    use super::*;

    #[test]
    fn problems_past_the_limit_are_counted() -> Result<()> {
        let file = VerifyFile {
            display: "/d/a.parquet".into(),
            meta: ObjectMeta {
                location: object_store::path::Path::from("d/a.parquet"),
                last_modified: Default::default(),
                size: 10,
                e_tag: None,
                version: None,
            },
        };
        let report = FileReport {
            problems: (0..7).map(|i| format!("p{i}")).collect(),
            ..FileReport::default()
        };
        let batch = report.into_batch(&file)?;
        let problem = batch.column(7).as_string::<i32>().value(0).to_string();
        assert_eq!(problem, "p0; p1; p2; p3; p4; and 2 more");
        assert_eq!(batch.column(1).as_string::<i32>().value(0), "damaged");
        let ok = FileReport::default().into_batch(&file)?;
        assert_eq!(ok.column(1).as_string::<i32>().value(0), "ok");
        assert!(ok.column(7).is_null(0));
        Ok(())
    }
}
