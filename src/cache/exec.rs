//! [`CachedTable`], the table a cache entry is read through, and
//! [`CacheScanExec`], its scan.
//!
//! ```text
//!  CacheScanExec partition p
//!    ┌───────────────────────────┐   batches 0..k   (memory tier: Arc clones,
//!    │ part p: in-memory prefix  │──────────────┐    no copy, no decode)
//!    └───────────────────────────┘              ▼
//!    ┌───────────────────────────┐   batches k..n ┌────────────────────┐
//!    │ part-0000p.arrow (pread)  │───────────────▶│ channel (2 batches) │──▶ stream
//!    └───────────────────────────┘  blocking task └────────────────────┘
//! ```
//!
//! # Partitioning and ordering
//! One output partition per part, i.e. per output partition of the query
//! that filled the cache; within a partition the rows come in the order that
//! query produced them. No sort order is declared.
//!
//! # Memory
//! The in-memory prefixes are held by a [`MemoryReservation`] of the
//! session's pool, taken when the entry was filled and freed when the table
//! is dropped (`UNCACHE TABLE`, the end of a feed or of the session). Reading
//! the rest holds one decoded batch per partition in flight (plus two in the
//! channel); IPC buffers are sliced from the read buffer, not copied again.

use std::fmt;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use crate::exec::{BatchStream, Setting};
use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::catalog::{Session as CatalogSession, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::{Statistics, project_schema};
use datafusion::common::{exec_datafusion_err, internal_datafusion_err};
use datafusion::datasource::TableType;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::stream::RecordBatchReceiverStream;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};

use super::entry::PositionedReader;
use super::identity::CacheKey;

/// How a cached table came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The query ran now and filled the entry.
    Computed,
    /// A verified entry on disk was reused (an earlier run or process).
    Disk,
    /// A table of this session with the same key was shared.
    Session,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Computed => "computed",
            Origin::Disk => "reused from disk",
            Origin::Session => "reused from this session",
        })
    }
}

/// One partition of a cached result.
#[derive(Debug)]
pub(crate) struct CachedPart {
    /// The first batches, kept in memory.
    pub(crate) in_memory: Vec<RecordBatch>,
    /// The part file holding all batches.
    pub(crate) file: Arc<File>,
    /// Its path, for messages.
    pub(crate) path: PathBuf,
    /// Rows in the part.
    pub(crate) rows: u64,
}

/// A materialised query result; see the module docs.
pub struct CachedTable {
    pub(crate) key: CacheKey,
    pub(crate) query: String,
    pub(crate) schema: SchemaRef,
    pub(crate) parts: Arc<Vec<CachedPart>>,
    /// Holds the in-memory prefixes' bytes in the session's pool.
    pub(crate) memory: MemoryReservation,
    pub(crate) origin: Origin,
    pub(crate) disk_bytes: u64,
    /// Directory of the entry.
    pub(crate) dir: PathBuf,
    /// Gives the memory tier's bytes back to the store when dropped.
    pub(crate) on_drop: Option<Box<dyn Fn(usize) + Send + Sync>>,
    /// Whether the entry is this session's alone and goes with the table.
    pub(crate) remove_on_drop: bool,
}

impl fmt::Debug for CachedTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedTable")
            .field("key", &self.key.hex)
            .field("rows", &self.rows())
            .field("memory_bytes", &self.memory_bytes())
            .field("disk_bytes", &self.disk_bytes)
            .finish()
    }
}

impl Drop for CachedTable {
    fn drop(&mut self) {
        if let Some(on_drop) = &self.on_drop {
            on_drop(self.memory.size());
        }
        if self.remove_on_drop {
            // Open handles of running scans keep the data readable.
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl CachedTable {
    /// The entry's key.
    pub fn key(&self) -> &CacheKey {
        &self.key
    }

    /// The query that produced it.
    pub fn query(&self) -> &str {
        &self.query
    }

    /// Rows in the table.
    pub fn rows(&self) -> u64 {
        self.parts.iter().map(|p| p.rows).sum()
    }

    /// Bytes of batches held in memory.
    pub fn memory_bytes(&self) -> usize {
        self.memory.size()
    }

    /// Bytes of the part files.
    pub fn disk_bytes(&self) -> u64 {
        self.disk_bytes
    }

    /// Whether the query ran now or an entry was reused.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Directory of the entry on disk.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Number of partitions (parts).
    pub fn partitions(&self) -> usize {
        self.parts.len()
    }
}

#[async_trait]
impl TableProvider for CachedTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn CatalogSession,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(CacheScanExec::try_new(
            Arc::clone(&self.parts),
            &self.schema,
            projection.cloned(),
            &self.key.hex,
        )?))
    }

    fn statistics(&self) -> Option<Statistics> {
        let mut statistics = Statistics::new_unknown(&self.schema);
        statistics.num_rows = Precision::Exact(self.rows() as usize);
        Some(statistics)
    }
}

/// Reads a [`CachedTable`]; see the module docs.
#[derive(Debug)]
pub struct CacheScanExec {
    parts: Arc<Vec<CachedPart>>,
    /// Columns read (`None` = all).
    projection: Option<Vec<usize>>,
    /// The entry's key, for EXPLAIN.
    key: String,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl CacheScanExec {
    fn try_new(
        parts: Arc<Vec<CachedPart>>,
        schema: &SchemaRef,
        projection: Option<Vec<usize>>,
        key: &str,
    ) -> Result<Self> {
        let projected = project_schema(schema, projection.as_ref())?;
        let properties = PlanProperties::new(
            EquivalenceProperties::new(projected),
            Partitioning::UnknownPartitioning(parts.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Self {
            parts,
            projection,
            key: key.to_string(),
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for CacheScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let in_memory: usize = self.parts.iter().map(|p| p.in_memory.len()).sum();
        let settings: [Setting; 3] = [
            ("key", &self.key),
            ("parts", &self.parts.len()),
            ("memory_batches", &in_memory),
        ];
        crate::exec::fmt_settings(f, t, "CacheScanExec", &settings)
    }
}

impl ExecutionPlan for CacheScanExec {
    crate::exec::leaf!("CacheScanExec");

    fn execute(&self, partition: usize, _ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let part = self.parts.get(partition).ok_or_else(|| {
            internal_datafusion_err!(
                "CacheScanExec has {} partitions, asked for {partition}",
                self.parts.len()
            )
        })?;
        let schema = self.properties.eq_properties.schema();
        let output_rows = MetricBuilder::new(&self.metrics).output_rows(partition);
        let memory_batches =
            MetricBuilder::new(&self.metrics).counter("memory_batches", partition);
        let disk_batches =
            MetricBuilder::new(&self.metrics).counter("disk_batches", partition);
        let read_time =
            MetricBuilder::new(&self.metrics).subset_time("read_time", partition);

        let in_memory: Vec<RecordBatch> = part
            .in_memory
            .iter()
            .map(|batch| match &self.projection {
                Some(columns) => batch.project(columns),
                None => Ok(batch.clone()),
            })
            .collect::<std::result::Result<_, _>>()?;
        let skip = in_memory.len();
        let file = Arc::clone(&part.file);
        let path = part.path.clone();
        let projection = self.projection.clone();

        let mut builder = RecordBatchReceiverStream::builder(Arc::clone(schema), 2);
        let tx = builder.tx();
        builder.spawn_blocking(move || {
            for batch in in_memory {
                output_rows.add(batch.num_rows());
                memory_batches.add(1);
                if tx.blocking_send(Ok(batch)).is_err() {
                    return Ok(()); // the consumer went away
                }
            }
            let read_error = |e: datafusion::arrow::error::ArrowError| {
                exec_datafusion_err!(
                    "cannot read cache file '{}': {e}. The cache entry may have been \
                     damaged since it was opened; CLEAR CACHE and rerun",
                    path.display()
                )
            };
            let mut reader = FileReader::try_new(PositionedReader::new(file), projection)
                .map_err(read_error)?;
            if skip >= reader.num_batches() {
                return Ok(());
            }
            reader.set_index(skip).map_err(read_error)?;
            loop {
                let timer = read_time.timer();
                let Some(batch) = reader.next() else { break };
                timer.done();
                let batch = batch.map_err(read_error)?;
                output_rows.add(batch.num_rows());
                disk_batches.add(1);
                if tx.blocking_send(Ok(batch)).is_err() {
                    break;
                }
            }
            Ok(())
        });
        Ok(builder.build())
    }

    crate::exec::metrics_of_field!();

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &datafusion::physical_plan::statistics::StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let partition = args.partition();
        let schema = self.properties.eq_properties.schema();
        let mut statistics = Statistics::new_unknown(schema);
        let rows = match partition {
            Some(p) => self.parts.get(p).map_or(0, |part| part.rows),
            None => self.parts.iter().map(|p| p.rows).sum(),
        };
        statistics.num_rows = Precision::Exact(rows as usize);
        Ok(Arc::new(statistics))
    }
}
