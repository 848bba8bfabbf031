//! `VERIFY '<path or glob>' [DECODE <column>[, …]]` and `sqlfeed verify`:
//! the check a user runs on a dataset before a week of training.
//!
//! Every page of every column chunk of every matching Parquet file is read
//! and decoded (with page checksums verified where the file has them, see
//! the README's *Bad input*), and each value of the `DECODE` columns is
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

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, StringBuilder, UInt64Builder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::internal_datafusion_err;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_err, plan_err};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::TableType;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    DefaultParquetFileReaderFactory, ParquetFileReaderFactory,
};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryPool, UnboundedMemoryPool,
};
use datafusion::execution::{FunctionRegistry, SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use datafusion::parquet::arrow::async_reader::{
    AsyncFileReader, ParquetRecordBatchStreamBuilder,
};
use datafusion::parquet::file::metadata::ParquetMetaData;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use datafusion::prelude::SessionContext;
use futures::{StreamExt, TryStreamExt};
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
        let properties = PlanProperties::new(
            EquivalenceProperties::new(verify_schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
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
        let decode = self.decode.join(", ");
        match t {
            DisplayFormatType::TreeRender => {
                write!(f, "files={}", self.files.len())?;
                if !decode.is_empty() {
                    write!(f, "\ndecode=[{decode}]")?;
                }
            }
            _ => {
                write!(f, "VerifyExec: files={}", self.files.len())?;
                if !decode.is_empty() {
                    write!(f, ", decode=[{decode}]")?;
                }
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for VerifyExec {
    fn name(&self) -> &str {
        "VerifyExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            internal_err!("VerifyExec has no children")
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!("VerifyExec has one partition, not {partition}");
        }
        let shared = Arc::new(Shared {
            store: Arc::clone(&self.store),
            decode: self.decode.clone(),
            max_pixels: self.max_pixels,
            chunks_at_once: context.session_config().target_partitions().max(1),
            pool: Arc::clone(context.memory_pool()),
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

/// What every file's verification shares.
struct Shared {
    store: Arc<dyn ObjectStore>,
    decode: Vec<String>,
    max_pixels: u64,
    chunks_at_once: usize,
    /// Where the batches read are reserved.
    pool: Arc<dyn MemoryPool>,
    pages: Counters,
    metrics: ExecutionPlanMetricsSet,
    /// The `DECODE` columns some file had.
    decode_found: Mutex<HashSet<String>>,
}

/// After the last file: an error if a `DECODE` column was in no file (a
/// typo would otherwise verify no image and say `ok`).
fn missing_decode_columns(shared: &Shared) -> Result<Option<RecordBatch>> {
    let found = shared
        .decode_found
        .lock()
        .map_err(|_| internal_datafusion_err!("VERIFY: a file task panicked"))?;
    let missing: Vec<&str> = shared
        .decode
        .iter()
        .filter(|name| !found.contains(*name))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(None);
    }
    plan_err!(
        "VERIFY … DECODE: no file has a top-level column '{}'; the files were read, but no \
         image was decoded. Check the column name (DESCRIBE the files)",
        missing.join("', '")
    )
}

/// The plan's metrics.
struct Counters {
    column_chunks: Count,
    images: Count,
    damaged_files: Count,
}

impl Counters {
    fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        Self {
            column_chunks: MetricBuilder::new(metrics).counter("column_chunks", 0),
            images: MetricBuilder::new(metrics).counter("images_decoded", 0),
            damaged_files: MetricBuilder::new(metrics).counter("damaged_files", 0),
        }
    }
}

/// One file's result.
#[derive(Debug, Default)]
struct FileReport {
    rows: u64,
    row_groups: u64,
    column_chunks: u64,
    images: u64,
    problems: Vec<String>,
}

impl FileReport {
    fn into_batch(self, file: &VerifyFile) -> Result<RecordBatch> {
        let mut text = StringBuilder::new();
        let mut numbers = UInt64Builder::new();
        let problem = match self.problems.len() {
            0 => None,
            n if n <= MAX_PROBLEMS => Some(self.problems.join("; ")),
            n => Some(format!(
                "{}; and {} more",
                self.problems[..MAX_PROBLEMS].join("; "),
                n - MAX_PROBLEMS
            )),
        };
        let mut column = |value: &str| -> ArrayRef {
            text.append_value(value);
            Arc::new(text.finish())
        };
        let file_name = column(&file.display);
        let status = column(if problem.is_none() { "ok" } else { "damaged" });
        let mut number = |value: u64| -> ArrayRef {
            numbers.append_value(value);
            Arc::new(numbers.finish())
        };
        let columns = vec![
            file_name,
            status,
            number(self.rows),
            number(self.row_groups),
            number(self.column_chunks),
            number(self.images),
            number(file.meta.size),
            Arc::new(datafusion::arrow::array::StringArray::from(vec![problem])),
        ];
        Ok(RecordBatch::try_new(verify_schema(), columns)?)
    }
}

/// Reads the footer, then every column chunk of `file`.
async fn verify_file(shared: &Arc<Shared>, file: &VerifyFile) -> Result<FileReport> {
    let mut report = FileReport::default();
    let metadata = match load_metadata(shared, file).await {
        Ok(metadata) => metadata,
        Err(e) => {
            shared.pages.damaged_files.add(1);
            report
                .problems
                .push(format!("footer: {}", footer_reason(&e)));
            return Ok(report);
        }
    };
    let parquet = Arc::clone(metadata.metadata());
    report.row_groups = parquet.num_row_groups() as u64;
    report.rows = parquet.file_metadata().num_rows().max(0) as u64;
    let leaves = parquet.file_metadata().schema_descr().num_columns();
    // A file without a DECODE column has no images to decode (a glob may
    // mix schemas); a column no file has is reported once all are read.
    for name in &shared.decode {
        if (0..leaves).any(|leaf| is_top_level_leaf(&parquet, leaf, name))
            && let Ok(mut found) = shared.decode_found.lock()
        {
            found.insert(name.clone());
        }
    }
    let mut first_row = 0u64;
    let mut chunks = Vec::new();
    for row_group in 0..parquet.num_row_groups() {
        for leaf in 0..leaves {
            chunks.push(ChunkTask {
                row_group,
                leaf,
                first_row,
            });
        }
        first_row += parquet.row_group(row_group).num_rows().max(0) as u64;
    }
    report.column_chunks = chunks.len() as u64;
    let results: Vec<ChunkResult> = futures::stream::iter(chunks)
        .map(|chunk| {
            let shared = Arc::clone(shared);
            let file = file.clone();
            let metadata = metadata.clone();
            let column = metadata
                .metadata()
                .file_metadata()
                .schema_descr()
                .column(chunk.leaf)
                .path()
                .string();
            async move {
                let task = SpawnedTask::spawn(async move {
                    verify_chunk(&shared, &file, metadata, chunk).await
                });
                match task.join().await {
                    Ok(result) => result,
                    // The reader panicked on this chunk's bytes (parquet 59
                    // does on some damaged page headers): damage, not a bug
                    // of the check.
                    Err(e) if e.is_panic() => Ok(ChunkResult {
                        problems: vec![format!(
                            "row group {}, column '{column}': the Parquet reader panicked \
                             on it ({})",
                            chunk.row_group,
                            crate::exec::panic_message(&e.into_panic())
                        )],
                        images: 0,
                        read_error_at: Some(format!(
                            "row group {}, column '{column}'",
                            chunk.row_group
                        )),
                    }),
                    Err(e) => Err(DataFusionError::External(Box::new(e))),
                }
            }
        })
        .buffered(shared.chunks_at_once)
        .try_collect()
        .await?;
    for chunk in results {
        report.images += chunk.images;
        report.problems.extend(chunk.problems);
    }
    if !report.problems.is_empty() {
        shared.pages.damaged_files.add(1);
    }
    Ok(report)
}

/// What one column chunk's verification found.
#[derive(Debug, Default)]
struct ChunkResult {
    problems: Vec<String>,
    /// Images decoded (the chunk belongs to a `DECODE` column).
    images: u64,
    /// Where the reader failed, when it did.
    read_error_at: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct ChunkTask {
    row_group: usize,
    leaf: usize,
    /// The file row of the row group's first row.
    first_row: u64,
}

fn reader_factory_file(file: &VerifyFile) -> PartitionedFile {
    PartitionedFile::from(file.meta.clone())
}

async fn load_metadata(
    shared: &Shared,
    file: &VerifyFile,
) -> Result<ArrowReaderMetadata> {
    let factory = DefaultParquetFileReaderFactory::new(Arc::clone(&shared.store));
    let mut reader: Box<dyn AsyncFileReader> =
        factory.create_reader(0, reader_factory_file(file), None, &shared.metrics)?;
    Ok(ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new()).await?)
}

/// Whether leaf column `leaf` is the top-level column `name`.
fn is_top_level_leaf(parquet: &ParquetMetaData, leaf: usize, name: &str) -> bool {
    let path = parquet
        .file_metadata()
        .schema_descr()
        .column(leaf)
        .path()
        .parts()
        .to_vec();
    path.len() == 1 && path[0] == name
}

/// Reads one column chunk in batches, decoding images if it is a `DECODE`
/// column. Damage is a problem of the result; only a failure of the engine
/// (memory, a task) is an error.
async fn verify_chunk(
    shared: &Shared,
    file: &VerifyFile,
    metadata: ArrowReaderMetadata,
    task: ChunkTask,
) -> Result<ChunkResult> {
    shared.pages.column_chunks.add(1);
    let parquet = Arc::clone(metadata.metadata());
    let chunk_meta = parquet.row_group(task.row_group).column(task.leaf);
    let column_path = chunk_meta.column_path().string();
    let expected_rows = parquet.row_group(task.row_group).num_rows().max(0) as u64;
    // `Position::From(row)`: a read error, in the batch that starts at `row`
    // (the reader does not say which page); `Position::At(row)`: that row.
    let where_ = |row: Option<Position>| {
        let encodings: Vec<String> =
            chunk_meta.encodings().map(|e| format!("{e:?}")).collect();
        let mut text = format!(
            "row group {}, column '{column_path}' ({}, {})",
            task.row_group,
            chunk_meta.compression(),
            encodings.join("/")
        );
        match row {
            Some(Position::From(row)) => text.push_str(&format!(
                ", reading from row {row} of the row group (file row {})",
                task.first_row + row
            )),
            Some(Position::At(row)) => text.push_str(&format!(
                ", at row {row} of the row group (file row {})",
                task.first_row + row
            )),
            None => {}
        }
        text
    };
    let decode_images = shared
        .decode
        .iter()
        .any(|name| is_top_level_leaf(&parquet, task.leaf, name));
    // About BATCH_BYTES of this column per batch, by its uncompressed size.
    let bytes_per_row = (chunk_meta.uncompressed_size().max(1) as u64)
        .div_ceil(expected_rows.max(1))
        .max(1);
    let batch_rows = (BATCH_BYTES as u64 / bytes_per_row).clamp(1, 8192) as usize;

    let factory = DefaultParquetFileReaderFactory::new(Arc::clone(&shared.store));
    let reader: Box<dyn AsyncFileReader> =
        factory.create_reader(0, reader_factory_file(file), None, &shared.metrics)?;
    let mask =
        ProjectionMask::leaves(parquet.file_metadata().schema_descr(), [task.leaf]);
    let mut problems = Vec::new();
    let mut images = 0u64;
    let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, metadata)
        .with_row_groups(vec![task.row_group])
        .with_projection(mask)
        .with_batch_size(batch_rows)
        .build();
    let mut stream = match stream {
        Ok(stream) => stream,
        Err(e) => {
            problems.push(format!("{}: {}", where_(None), reason(&e.into())));
            return Ok(ChunkResult {
                problems,
                images: 0,
                read_error_at: Some(where_(None)),
            });
        }
    };
    let reservation = MemoryConsumer::new(format!("VerifyExec[{}]", file.display))
        .register(&shared.pool);
    let mut rows = 0u64;
    let mut read_error_at = None;
    let mut image_failures = 0u64;
    let mut first_image_failure = None;
    loop {
        let batch = match stream.next().await {
            None => break,
            Some(Ok(batch)) => batch,
            Some(Err(e)) => {
                let place = where_(Some(Position::From(rows)));
                problems.push(format!("{place}: {}", reason(&e.into())));
                read_error_at = Some(place);
                break;
            }
        };
        reservation.try_resize(batch.get_array_memory_size())?;
        if decode_images && let Some(column) = batch.columns().first() {
            for (i, value) in binary_values(column)?.into_iter().enumerate() {
                let Some(bytes) = value else { continue };
                images += 1;
                if let Err(why) =
                    sqlfeed_udfs::image::decode_image(bytes, shared.max_pixels)
                {
                    image_failures += 1;
                    first_image_failure.get_or_insert((rows + i as u64, why));
                }
            }
        }
        rows += batch.num_rows() as u64;
    }
    reservation.free();
    shared.pages.images.add(images as usize);
    if let Some((row, why)) = first_image_failure {
        let more = match image_failures {
            1 => String::new(),
            n => format!(" ({} more images of this chunk fail)", n - 1),
        };
        problems.push(format!(
            "{}: the image does not decode: {why}{more}",
            where_(Some(Position::At(row)))
        ));
    }
    if problems.is_empty() && rows != expected_rows {
        problems.push(format!(
            "{}: {rows} rows decoded, the footer says {expected_rows}",
            where_(None)
        ));
    }
    Ok(ChunkResult {
        problems,
        images,
        read_error_at,
    })
}

/// The first column chunk of `meta` whose pages do not read, as `row group
/// r, column 'c' (codec, encodings), reading from row n …`; `None` when the
/// footer does not read or every chunk does. Reads chunk by chunk, one batch
/// of one column at a time, up to the first failure: for naming the place of
/// an error the query reader found (it does not say).
pub(crate) async fn locate_damage(
    store: &Arc<dyn ObjectStore>,
    meta: &ObjectMeta,
) -> Option<String> {
    let metrics = ExecutionPlanMetricsSet::new();
    let shared = Shared {
        store: Arc::clone(store),
        decode: Vec::new(),
        max_pixels: 0,
        chunks_at_once: 1,
        // One batch at a time, on a path that ends the query anyway.
        pool: Arc::new(UnboundedMemoryPool::default()),
        pages: Counters::new(&metrics),
        metrics,
        decode_found: Mutex::new(HashSet::new()),
    };
    let file = VerifyFile {
        display: meta.location.to_string(),
        meta: meta.clone(),
    };
    let metadata = load_metadata(&shared, &file).await.ok()?;
    let parquet = Arc::clone(metadata.metadata());
    let leaves = parquet.file_metadata().schema_descr().num_columns();
    let mut first_row = 0u64;
    for row_group in 0..parquet.num_row_groups() {
        for leaf in 0..leaves {
            let task = ChunkTask {
                row_group,
                leaf,
                first_row,
            };
            let found = verify_chunk(&shared, &file, metadata.clone(), task)
                .await
                .ok()?;
            if found.read_error_at.is_some() {
                return found.read_error_at;
            }
        }
        first_row += parquet.row_group(row_group).num_rows().max(0) as u64;
    }
    None
}

/// Where in a column chunk a problem is.
#[derive(Debug, Clone, Copy)]
enum Position {
    /// In the batch read from this row of the row group.
    From(u64),
    /// At this row of the row group.
    At(u64),
}

/// The values of a binary column, whatever its Arrow binary type.
fn binary_values(column: &ArrayRef) -> Result<Vec<Option<&[u8]>>> {
    Ok(match column.data_type() {
        DataType::Binary => column.as_binary::<i32>().iter().collect(),
        DataType::LargeBinary => column.as_binary::<i64>().iter().collect(),
        DataType::BinaryView => column.as_binary_view().iter().collect(),
        DataType::FixedSizeBinary(_) => column.as_fixed_size_binary().iter().collect(),
        other => {
            return plan_err!(
                "VERIFY … DECODE: the column is {other}, not binary image bytes"
            );
        }
    })
}

/// The reader's reason for a bad footer, without its wrappers ("Failed to
/// fetch metadata for file …: Parquet error: Parquet error: …").
fn footer_reason(error: &DataFusionError) -> String {
    let text = reason(error);
    let reason = text
        .rsplit_once("Parquet error: ")
        .map(|(_, reason)| reason)
        .unwrap_or(&text);
    format!("{reason}: the file is truncated, corrupt or not Parquet")
}

/// The prefixes DataFusion, arrow and parquet put before a reader error, in
/// whatever nesting they arrive.
const WRAPPER_PREFIXES: &[&str] = &[
    "Arrow error: ",
    "Arrow: ",
    "Parquet error: ",
    "Parquet argument error: ",
    "External error: ",
    "External: ",
    "Object Store error: ",
    "IO error: ",
];

/// `error`'s message without the wrappers' prefixes.
pub(crate) fn reason(error: &DataFusionError) -> String {
    let text = error.to_string();
    let mut rest = text.as_str();
    while let Some(stripped) = WRAPPER_PREFIXES.iter().find_map(|p| rest.strip_prefix(p))
    {
        rest = stripped;
    }
    rest.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
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
