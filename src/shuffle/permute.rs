//! [`PermuteExec`]: orders keyed rows by their shuffle key by sorting an
//! index of `(key, batch, row)` triples and gathering, not by sorting rows.
//!
//! ```text
//!   ShuffleKeyExec partitions 0..N  (each batch: columns + __sqlfeed_shuffle_key)
//!            │ one task per partition, batches arrive in any order
//!            ▼
//!   ┌──────────────────────────────────────────────┐ reservation full?
//!   │ held batches + index [(key, batch, row); n]  │──────────────┐
//!   └──────────────────────────────────────────────┘              ▼
//!            │ end of input                         sort index, gather in key order,
//!            ▼                                      write a sorted run (DataFusion's
//!   no runs: sort index (16 B/row), gather          SpillManager), free, go on
//!   output batches with `interleave`                               │
//!   runs: spill the rest too, then DataFusion's  ◄─────────────────┘
//!   StreamingMerge of the runs by key (multi-level, memory-aware)
//!            │ drop the key column
//!            ▼
//!   one partition in shuffle order
//! ```
//!
//! # Why not `SortExec` + `SortPreservingMergeExec`
//! The sort copies every row while sorting each batch and keeps in-memory
//! runs in a merge reservation that cannot spill; a shuffle that fits in
//! memory peaked at about twice the data. Here the rows are copied once,
//! when they are gathered into output batches, and only the index (16 bytes
//! per row) and the key column (8) come on top of the data: about 1.05× for
//! rows of a few hundred bytes. The sort-based plan
//! ([`super::plan_sorted_shuffle`]) stays for distributed execution, where
//! the per-partition sort and the merge are the stage boundaries.
//!
//! # Ordering
//! Output is in ascending key order, the same order as the sort-based plan.
//! Rows with equal keys are identical rows (the key hashes the content), so
//! their relative order cannot be seen. Two different rows with the same
//! 64-bit key (probability about n²/2⁶⁵) would come out in arrival order.
//!
//! # Memory and spilling
//! Held batches and the index are reserved from the session's pool as a
//! spillable consumer. When a batch does not fit, everything held is written
//! as one key-sorted run to a spill file of the session's disk manager and
//! the reservation is freed; at the end the runs are merged by DataFusion's
//! streaming merge, which holds one batch per run it merges and merges in
//! several passes when that does not fit. Spill files are deleted when the
//! stream is dropped, also on error or cancellation.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::interleave_record_batch;
use datafusion::arrow::datatypes::{Schema, SchemaRef, UInt64Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{
    EquivalenceProperties, LexOrdering, Partitioning, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet, RecordOutput, SpillMetrics,
};
use datafusion::physical_plan::sorts::streaming_merge::{
    SortedSpillFile, StreamingMergeBuilder,
};
use datafusion::physical_plan::spill::{SpillManager, get_record_batch_memory_size};
use datafusion::physical_plan::stream::{
    RecordBatchReceiverStream, RecordBatchStreamAdapter,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    PlanProperties,
};
use futures::StreamExt;

use super::SHUFFLE_KEY_COLUMN;

/// Bytes of one index entry.
const INDEX_ENTRY_BYTES: usize = std::mem::size_of::<(u64, u32, u32)>();

/// See the module docs.
#[derive(Debug)]
pub struct PermuteExec {
    /// Keyed rows (the key is the last column).
    input: Arc<dyn ExecutionPlan>,
    /// Output schema: the input's without the key.
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PermuteExec {
    /// Orders the rows of `input` by its last column, [`SHUFFLE_KEY_COLUMN`].
    pub fn try_new(input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let input_schema = input.schema();
        let fields = input_schema.fields();
        if fields.last().map(|f| f.name().as_str()) != Some(SHUFFLE_KEY_COLUMN) {
            return Err(DataFusionError::Internal(format!(
                "PermuteExec needs {SHUFFLE_KEY_COLUMN} as the last input column"
            )));
        }
        let schema = Arc::new(Schema::new_with_metadata(
            fields[..fields.len() - 1].to_vec(),
            input_schema.metadata().clone(),
        ));
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(Self {
            input,
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for PermuteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "PermuteExec: key={SHUFFLE_KEY_COLUMN}")
    }
}

impl ExecutionPlan for PermuteExec {
    fn name(&self) -> &str {
        "PermuteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    // All input partitions are read here, in parallel; nothing to gain from
    // more, and no exchange is wanted in front.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::UnspecifiedDistribution]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let child = super::single_child(self.name(), &children)?;
        Ok(Arc::new(Self::try_new(child)?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "PermuteExec has one output partition, asked for {partition}"
            )));
        }
        let input_schema = self.input.schema();
        let partitions = self.input.output_partitioning().partition_count();
        // One task per input partition, so that they decode in parallel.
        let mut builder = RecordBatchReceiverStream::builder(
            Arc::clone(&input_schema),
            2 * partitions.max(1),
        );
        for input_partition in 0..partitions {
            let tx = builder.tx();
            let input = Arc::clone(&self.input);
            let context = Arc::clone(&context);
            builder.spawn(async move {
                let mut stream = input.execute(input_partition, context)?;
                while let Some(batch) = stream.next().await {
                    if tx.send(batch).await.is_err() {
                        break; // the consumer went away
                    }
                }
                Ok(())
            });
        }
        let arrivals = builder.build();

        let reservation = MemoryConsumer::new("PermuteExec")
            .with_can_spill(true)
            .register(context.memory_pool());
        let spill_manager = SpillManager::new(
            context.runtime_env(),
            SpillMetrics::new(&self.metrics, 0),
            Arc::clone(&input_schema),
        );
        let permuter = Permuter {
            held: Vec::new(),
            index: Vec::new(),
            runs: Vec::new(),
            reservation,
            spill_manager,
            batch_rows: context.session_config().batch_size().max(1),
            key_column: input_schema.fields().len() - 1,
        };
        let baseline = BaselineMetrics::new(&self.metrics, 0);
        let merge_reservation =
            MemoryConsumer::new("PermuteExec merge").register(context.memory_pool());
        let schema = Arc::clone(&self.schema);
        let output = futures::stream::once(async move {
            permuter
                .run(arrivals, baseline, merge_reservation, schema)
                .await
        })
        .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            output,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// The state of one execution.
struct Permuter {
    /// Batches held in memory (with the key column).
    held: Vec<RecordBatch>,
    /// (key, held batch, row) of every held row.
    index: Vec<(u64, u32, u32)>,
    /// Key-sorted runs on disk.
    runs: Vec<SortedSpillFile>,
    /// Held batches and index, in the session's pool.
    reservation: MemoryReservation,
    spill_manager: SpillManager,
    /// Rows per output batch and per spilled batch.
    batch_rows: usize,
    /// Position of the key column.
    key_column: usize,
}

impl Permuter {
    /// Reads all input, then returns the output stream.
    async fn run(
        mut self,
        mut arrivals: SendableRecordBatchStream,
        baseline: BaselineMetrics,
        merge_reservation: MemoryReservation,
        schema: SchemaRef,
    ) -> futures::stream::BoxStream<'static, Result<RecordBatch>> {
        let collected = async {
            while let Some(batch) = arrivals.next().await {
                let batch = batch?;
                let _timer = baseline.elapsed_compute().timer();
                self.push(batch)?;
            }
            Ok::<_, DataFusionError>(())
        }
        .await;
        if let Err(e) = collected {
            return futures::stream::once(async { Err(e) }).boxed();
        }
        drop(arrivals);
        let key_column = self.key_column;
        let output = if self.runs.is_empty() {
            // Gathered from batches whose key column is already dropped.
            self.gather_in_memory(baseline)
        } else {
            self.merge_runs(baseline, merge_reservation).map(|merged| {
                merged
                    .map(move |batch| {
                        let columns: Vec<usize> = (0..key_column).collect();
                        Ok(batch?.project(&columns)?)
                    })
                    .boxed()
            })
        };
        match output {
            Ok(stream) => stream
                .map(move |batch| {
                    let batch = batch?;
                    Ok(RecordBatch::try_new(
                        Arc::clone(&schema),
                        batch.columns().to_vec(),
                    )?)
                })
                .boxed(),
            Err(e) => futures::stream::once(async { Err(e) }).boxed(),
        }
    }

    /// Holds `batch`, first spilling what is held if it does not fit.
    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let bytes = get_record_batch_memory_size(&batch) + rows * INDEX_ENTRY_BYTES;
        if self.reservation.try_grow(bytes).is_err() {
            if self.held.is_empty() {
                return Err(DataFusionError::ResourcesExhausted(format!(
                    "SHUFFLE: one batch of {rows} rows needs {bytes} bytes, more than the \
                     memory limit leaves; raise --memory-limit"
                )));
            }
            self.spill()?;
            self.reservation.try_grow(bytes)?;
        }
        if self.held.len() >= u32::MAX as usize {
            return Err(DataFusionError::ResourcesExhausted(
                "SHUFFLE: more than 4 billion batches held in memory".into(),
            ));
        }
        if batch
            .column(self.key_column)
            .as_primitive_opt::<UInt64Type>()
            .is_none()
        {
            return Err(DataFusionError::Internal(format!(
                "{SHUFFLE_KEY_COLUMN} is not UInt64"
            )));
        }
        self.held.push(batch);
        Ok(())
    }

    /// Builds the index of everything held, sorted by key. It is built once,
    /// at its exact size, from the held key columns (growing it batch by
    /// batch would briefly need three times its size when it reallocates).
    /// Equal keys (identical rows) fall back to arrival order, which cannot
    /// be seen in the output.
    fn build_index(&mut self) {
        let rows = self.held.iter().map(|b| b.num_rows()).sum();
        let mut index = Vec::with_capacity(rows);
        for (batch_index, batch) in self.held.iter().enumerate() {
            if let Some(keys) = batch
                .column(self.key_column)
                .as_primitive_opt::<UInt64Type>()
            {
                index.extend(
                    keys.values()
                        .iter()
                        .enumerate()
                        .map(|(row, &key)| (key, batch_index as u32, row as u32)),
                );
            }
        }
        index.sort_unstable();
        self.index = index;
    }

    /// Gathers held rows in index order, `batch_rows` at a time.
    fn gathered(&self) -> impl Iterator<Item = Result<RecordBatch>> + '_ {
        (0..self.index.len().div_ceil(self.batch_rows)).map(|chunk| self.gather(chunk))
    }

    /// Output batch number `chunk`: the held rows of that slice of the index.
    fn gather(&self, chunk: usize) -> Result<RecordBatch> {
        let start = chunk * self.batch_rows;
        let end = (start + self.batch_rows).min(self.index.len());
        let held: Vec<&RecordBatch> = self.held.iter().collect();
        let indices: Vec<(usize, usize)> = self.index[start..end]
            .iter()
            .map(|&(_, batch, row)| (batch as usize, row as usize))
            .collect();
        Ok(interleave_record_batch(&held, &indices)?)
    }

    /// Writes everything held as one sorted run and frees it.
    fn spill(&mut self) -> Result<()> {
        self.build_index();
        let mut file = self
            .spill_manager
            .create_in_progress_file("PermuteExec run")?;
        let mut max_batch_bytes = 0;
        for batch in self.gathered() {
            let batch = batch?;
            max_batch_bytes = max_batch_bytes.max(file.append_batch(&batch)?);
        }
        if let Some(file) = file.finish()? {
            self.runs.push(SortedSpillFile {
                file,
                max_record_batch_memory: max_batch_bytes,
            });
        }
        self.held.clear();
        self.index = Vec::new();
        self.reservation.free();
        Ok(())
    }

    /// Everything fit: sort the index and stream gathered batches; held
    /// batches are released when the stream ends.
    fn gather_in_memory(
        mut self,
        baseline: BaselineMetrics,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        {
            let _timer = baseline.elapsed_compute().timer();
            self.build_index();
            // The keys are in the index now: drop their column (8 B/row).
            let columns: Vec<usize> = (0..self.key_column).collect();
            for batch in &mut self.held {
                *batch = batch.project(&columns)?;
            }
        }
        let chunks = self.index.len().div_ceil(self.batch_rows);
        let this = Arc::new(self);
        Ok(futures::stream::iter(0..chunks)
            .map(move |chunk| {
                let _timer = baseline.elapsed_compute().timer();
                Ok(this.gather(chunk)?.record_output(&baseline))
            })
            .boxed())
    }

    /// Some runs are on disk: spill the rest and merge all runs by key.
    fn merge_runs(
        mut self,
        baseline: BaselineMetrics,
        merge_reservation: MemoryReservation,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        if !self.held.is_empty() {
            self.spill()?;
        }
        let schema = Arc::clone(self.spill_manager.schema());
        let key: Arc<dyn PhysicalExpr> =
            Arc::new(Column::new(SHUFFLE_KEY_COLUMN, self.key_column));
        let ordering = LexOrdering::new([PhysicalSortExpr::new_default(key)])
            .ok_or_else(|| DataFusionError::Internal("empty shuffle ordering".into()))?;
        let runs = std::mem::take(&mut self.runs);
        let merged = StreamingMergeBuilder::new()
            .with_sorted_spill_files(runs)
            .with_spill_manager(self.spill_manager.clone())
            .with_schema(schema)
            .with_expressions(&ordering)
            .with_metrics(baseline)
            .with_batch_size(self.batch_rows)
            .with_reservation(merge_reservation)
            .build()?;
        Ok(merged.boxed())
    }
}
