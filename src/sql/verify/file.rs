//! One file's verification: its footer, then every column chunk's pages
//! read and checked (and `DECODE` columns' images decoded), chunks side by
//! side under the memory pool; damage located and named by row group,
//! column and row.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, StringBuilder, UInt64Builder,
};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::internal_datafusion_err;
use datafusion::common::plan_err;
use datafusion::common::runtime::SpawnedTask;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    DefaultParquetFileReaderFactory, ParquetFileReaderFactory,
};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryPool, UnboundedMemoryPool,
};
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use datafusion::parquet::arrow::async_reader::{
    AsyncFileReader, ParquetRecordBatchStreamBuilder,
};
use datafusion::parquet::file::metadata::ParquetMetaData;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStore};

use super::{BATCH_BYTES, MAX_PROBLEMS, VerifyFile, verify_schema};

/// What every file's verification shares.
pub(super) struct Shared {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) decode: Vec<String>,
    pub(super) max_pixels: u64,
    pub(super) chunks_at_once: usize,
    /// Where the batches read are reserved.
    pub(super) pool: Arc<dyn MemoryPool>,
    pub(super) pages: Counters,
    pub(super) metrics: ExecutionPlanMetricsSet,
    /// The `DECODE` columns some file had.
    pub(super) decode_found: Mutex<HashSet<String>>,
}

/// After the last file: an error if a `DECODE` column was in no file (a
/// typo would otherwise verify no image and say `ok`).
pub(super) fn missing_decode_columns(shared: &Shared) -> Result<Option<RecordBatch>> {
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
pub(super) struct Counters {
    column_chunks: Count,
    images: Count,
    damaged_files: Count,
}

impl Counters {
    pub(super) fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        Self {
            column_chunks: MetricBuilder::new(metrics).counter("column_chunks", 0),
            images: MetricBuilder::new(metrics).counter("images_decoded", 0),
            damaged_files: MetricBuilder::new(metrics).counter("damaged_files", 0),
        }
    }
}

/// One file's result.
#[derive(Debug, Default)]
pub(super) struct FileReport {
    pub(super) rows: u64,
    pub(super) row_groups: u64,
    pub(super) column_chunks: u64,
    pub(super) images: u64,
    pub(super) problems: Vec<String>,
}

impl FileReport {
    pub(super) fn into_batch(self, file: &VerifyFile) -> Result<RecordBatch> {
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
pub(super) async fn verify_file(
    shared: &Arc<Shared>,
    file: &VerifyFile,
) -> Result<FileReport> {
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
pub(super) struct ChunkResult {
    problems: Vec<String>,
    /// Images decoded (the chunk belongs to a `DECODE` column).
    images: u64,
    /// Where the reader failed, when it did.
    read_error_at: Option<String>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkTask {
    row_group: usize,
    leaf: usize,
    /// The file row of the row group's first row.
    first_row: u64,
}

pub(super) fn reader_factory_file(file: &VerifyFile) -> PartitionedFile {
    PartitionedFile::from(file.meta.clone())
}

pub(super) async fn load_metadata(
    shared: &Shared,
    file: &VerifyFile,
) -> Result<ArrowReaderMetadata> {
    let factory = DefaultParquetFileReaderFactory::new(Arc::clone(&shared.store));
    let mut reader: Box<dyn AsyncFileReader> =
        factory.create_reader(0, reader_factory_file(file), None, &shared.metrics)?;
    Ok(ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new()).await?)
}

/// Whether leaf column `leaf` is the top-level column `name`.
pub(super) fn is_top_level_leaf(
    parquet: &ParquetMetaData,
    leaf: usize,
    name: &str,
) -> bool {
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
pub(super) async fn verify_chunk(
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
pub(super) enum Position {
    /// In the batch read from this row of the row group.
    From(u64),
    /// At this row of the row group.
    At(u64),
}

/// The values of a binary column, whatever its Arrow binary type.
pub(super) fn binary_values(column: &ArrayRef) -> Result<Vec<Option<&[u8]>>> {
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
pub(super) fn footer_reason(error: &DataFusionError) -> String {
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
