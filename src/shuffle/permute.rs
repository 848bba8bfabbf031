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
//! # Repeated rows
//! The input key is a content key, shared by the copies of a row. Once the
//! index is sorted the copies are adjacent; they are recognised by comparing
//! values and copy `k` gets [`copy_key`]`(content key, k)`, so that copies
//! are spread like independent rows, and the index is sorted again (only
//! when some key changed). With spilled runs, copies may sit in different
//! runs: the merge of the runs in content-key order numbers them and sorts
//! the later copies apart, then the first copies are merged with them (see
//! `merge_runs`). Any numbering of identical rows gives the same output, so
//! this is as partition-invariant as the content key (see [`super::copies`]).
//!
//! # Ordering
//! Output is in ascending key order, the same order as the sort-based plan.
//! Rows with equal final keys are copies of one row only by a 64-bit
//! collision; two different rows with the same content key (probability
//! about n²/2⁶⁵) come out in arrival order.
//!
//! # Modes
//! [`PermuteMode::Gather`] reads every input partition into one output
//! partition and drops the key (the embedded plan).
//! [`PermuteMode::PerPartition`] permutes each partition on its own and keeps
//! the final key for an order-preserving merge above (the stage-shaped plan,
//! after a hash exchange on the content key has put all copies of a row in
//! one partition). [`PermuteMode::Ranged`] sorts each partition of a range
//! exchange by the final key (the parallel final stage, see `range.rs`).
//!
//! # Memory and spilling
//! Held batches and the index are reserved from the session's pool as a
//! spillable consumer. When a batch does not fit, everything held is written
//! as one key-sorted run to a spill file of the session's disk manager and
//! the reservation is freed; at the end the runs are merged by DataFusion's
//! streaming merge, which holds one batch per run it merges and merges in
//! several passes when that does not fit. After a spill, the memory that
//! merge needs is set aside from the pool as unspillable headroom (like
//! `SortExec`'s `sort_spill_reservation_bytes`) and handed to the merge, so
//! a partition that fits in memory cannot take it first and fail another
//! partition's merge depending on scheduling. Spill files are deleted when the
//! stream is dropped, also on error or cancellation. Copies after the first,
//! found when merging spilled runs, are held and spilled the same way by a
//! second consumer and written to disk before the final merge; without
//! repeated rows there are none, and the runs are read twice (once to look
//! for copies).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
    UInt64Array,
};
use datafusion::arrow::compute::{filter_record_batch, interleave, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef, UInt64Type};
use datafusion::common::Statistics;
use datafusion::common::internal_err;
use datafusion::common::{internal_datafusion_err, resources_err};
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
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
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::stream::{
    RecordBatchReceiverStream, RecordBatchStreamAdapter,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    PlanProperties,
};
use futures::StreamExt;

use super::SHUFFLE_KEY_COLUMN;
use super::copies::{CopyCounter, copy_key, spread_copies_in_index};

/// Bytes of one index entry.
const INDEX_ENTRY_BYTES: usize = std::mem::size_of::<(u64, u32, u32)>();

/// Which partitions [`PermuteExec`] permutes together; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermuteMode {
    /// All input partitions into one output partition, without the key.
    Gather,
    /// Each input partition on its own, keeping the final key, sorted by it.
    PerPartition,
    /// Each input partition on its own, whose rows carry final keys already
    /// (copies numbered below a range exchange, see [`super::RangeBucketExec`]):
    /// sorted by the key, which is kept; no copy numbering.
    Ranged,
}

/// Orders keyed rows by their final shuffle key (copies of repeated rows
/// spread apart), spilling sorted runs under memory pressure: all
/// partitions into one ([`PermuteMode::Gather`]), each on its own, or each
/// key range of a parallel final stage. Module docs: spilling and order.
#[derive(Debug)]
pub struct PermuteExec {
    /// Keyed rows (the key is the last column).
    input: Arc<dyn ExecutionPlan>,
    /// Which partitions are permuted together.
    mode: PermuteMode,
    /// Output schema: the input's without the key ([`PermuteMode::Gather`])
    /// or with the final key ([`PermuteMode::PerPartition`]).
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PermuteExec {
    /// Orders all rows of `input` by its last column, [`SHUFFLE_KEY_COLUMN`]
    /// (copies spread), into one partition without the key.
    pub fn try_new(input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Self::try_new_with_mode(input, PermuteMode::Gather)
    }

    /// Orders the rows of `input` as `mode` says.
    pub fn try_new_with_mode(
        input: Arc<dyn ExecutionPlan>,
        mode: PermuteMode,
    ) -> Result<Self> {
        let input_schema = input.schema();
        let fields = input_schema.fields();
        if fields.last().map(|f| f.name().as_str()) != Some(SHUFFLE_KEY_COLUMN) {
            return internal_err!(
                "PermuteExec needs {SHUFFLE_KEY_COLUMN} as the last input column"
            );
        }
        let properties = match mode {
            PermuteMode::Gather => {
                let schema = Arc::new(Schema::new_with_metadata(
                    fields[..fields.len() - 1].to_vec(),
                    input_schema.metadata().clone(),
                ));
                PlanProperties::new(
                    EquivalenceProperties::new(schema),
                    Partitioning::UnknownPartitioning(1),
                    EmissionType::Final,
                    Boundedness::Bounded,
                )
            }
            PermuteMode::PerPartition | PermuteMode::Ranged => {
                let key: Arc<dyn PhysicalExpr> =
                    Arc::new(Column::new(SHUFFLE_KEY_COLUMN, fields.len() - 1));
                PlanProperties::new(
                    EquivalenceProperties::new_with_orderings(
                        Arc::clone(&input_schema),
                        [[PhysicalSortExpr::new_default(key)]],
                    ),
                    input.output_partitioning().clone(),
                    EmissionType::Final,
                    Boundedness::Bounded,
                )
            }
        };
        Ok(Self {
            input,
            mode,
            schema: Arc::clone(properties.eq_properties.schema()),
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Which partitions are permuted together.
    pub fn mode(&self) -> PermuteMode {
        self.mode
    }
}

impl DisplayAs for PermuteExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        if let DisplayFormatType::TreeRender = t {
            let mode = match self.mode {
                PermuteMode::Gather => "gather",
                PermuteMode::PerPartition => "per_partition",
                PermuteMode::Ranged => "ranged",
            };
            return write!(f, "key={SHUFFLE_KEY_COLUMN}\nmode={mode}");
        }
        match self.mode {
            PermuteMode::Gather => write!(f, "PermuteExec: key={SHUFFLE_KEY_COLUMN}"),
            PermuteMode::PerPartition => write!(
                f,
                "PermuteExec: key={SHUFFLE_KEY_COLUMN}, preserve_partitioning=true"
            ),
            PermuteMode::Ranged => write!(
                f,
                "PermuteExec: key={SHUFFLE_KEY_COLUMN}, preserve_partitioning=true, ranged=true"
            ),
        }
    }
}

impl ExecutionPlan for PermuteExec {
    fn name(&self) -> &str {
        "PermuteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    crate::exec::one_input_children!(input);

    // All input partitions are read here, in parallel; nothing to gain from
    // more, and no exchange is wanted in front.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    /// Per partition, every copy of a content must be in the partition that
    /// numbers them: stating it keeps the optimizer from dropping the hash
    /// exchange on the key (EnforceDistribution rebuilds exchanges from what
    /// operators require), which left copies unspread on a cluster.
    fn required_input_distribution(&self) -> Vec<Distribution> {
        match self.mode {
            PermuteMode::Gather => vec![Distribution::UnspecifiedDistribution],
            PermuteMode::PerPartition => {
                let key_column = self.input.schema().fields().len() - 1;
                vec![Distribution::KeyPartitioned(vec![Arc::new(Column::new(
                    SHUFFLE_KEY_COLUMN,
                    key_column,
                ))])]
            }
            // Likewise the range exchange (a hash of the range's route
            // value, see `range.rs`).
            PermuteMode::Ranged => {
                let bucket_column = self.input.schema().fields().len() - 2;
                vec![Distribution::KeyPartitioned(vec![Arc::new(Column::new(
                    super::RANGE_BUCKET_COLUMN,
                    bucket_column,
                ))])]
            }
        }
    }

    // A permutation keeps every row: gathered, the one output partition
    // holds all input partitions' rows.
    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(match self.mode {
            PermuteMode::Gather => None,
            PermuteMode::PerPartition | PermuteMode::Ranged => partition,
        })]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        Ok(crate::exec::rows_passed_through(input_stats, &self.schema))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let child = crate::exec::single_child(self.name(), &children)?;
        Ok(Arc::new(Self::try_new_with_mode(child, self.mode)?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input_schema = self.input.schema();
        let partitions = self.input.output_partitioning().partition_count();
        let arrivals = match self.mode {
            PermuteMode::Gather if partition == 0 => {
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
                builder.build()
            }
            PermuteMode::PerPartition if partition < partitions => {
                self.input.execute(partition, Arc::clone(&context))?
            }
            PermuteMode::Ranged if partition < partitions => {
                // The order is only right if each partition holds one key
                // range: refuse rows of two ranges (an exchange re-sized
                // after planning; `KeepShuffleOrder` checks the plan too).
                // Ballista numbers a task's partitions locally, so the range
                // is compared with the partition's first row, not its index.
                let input = self.input.execute(partition, Arc::clone(&context))?;
                let bucket_column = input_schema.fields().len() - 2;
                let mut first: Option<u64> = None;
                Box::pin(RecordBatchStreamAdapter::new(
                    Arc::clone(&input_schema),
                    input.map(move |batch| {
                        let batch = batch?;
                        let buckets = batch.column(bucket_column).as_primitive::<UInt64Type>();
                        let values = buckets.values();
                        // The first row seen sets the partition's range (an
                        // empty batch sets nothing).
                        let expected = match (first, values.first()) {
                            (Some(bucket), _) => bucket,
                            (None, Some(&bucket)) => *first.insert(bucket),
                            (None, None) => return Ok(batch),
                        };
                        if values.iter().any(|&bucket| bucket != expected) {
                            return internal_err!(
                                "rows of two key ranges reached partition {partition} of a \
                                 ranged PermuteExec: the range exchange under it was changed \
                                 after planning"
                            );
                        }
                        Ok(batch)
                    }),
                ))
            }
            _ => {
                return internal_err!(
                    "PermuteExec ({:?}) has no output partition {partition}",
                    self.mode
                );
            }
        };
        let spill_manager = SpillManager::new(
            context.runtime_env(),
            SpillMetrics::new(&self.metrics, partition),
            Arc::clone(&input_schema),
        );
        let reservation = MemoryConsumer::new(format!("PermuteExec[{partition}]"))
            .with_can_spill(true)
            .register(context.memory_pool());
        let permuter = Permuter::new(
            reservation,
            context.memory_pool(),
            spill_manager,
            context.session_config().batch_size().max(1),
            // Below a range exchange the copies are numbered already.
            self.mode != PermuteMode::Ranged,
        );
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let schema = Arc::clone(&self.schema);
        let key_column = input_schema.fields().len() - 1;
        let keep_key = self.mode != PermuteMode::Gather;
        let work = baseline.intermediate();
        let output =
            futures::stream::once(async move {
                match permuter.run(arrivals, work).await {
                    Ok(stream) => stream,
                    Err(e) => futures::stream::once(async { Err(e) }).boxed(),
                }
            })
            .flatten()
            .map(move |batch| {
                let batch = batch?;
                let columns = if keep_key {
                    // The merge above reserves each batch it holds by its size.
                    compact_views(batch.columns())
                } else {
                    batch.columns()[..key_column].to_vec()
                };
                let options =
                    RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                Ok(RecordBatch::try_new_with_options(
                    Arc::clone(&schema),
                    columns,
                    &options,
                )?
                .record_output(&baseline))
            });
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
    /// Memory set aside, once a run is on disk, for merging the runs
    /// (unspillable, so other partitions' fair shares shrink instead).
    merge_headroom: MemoryReservation,
    /// The pool merges reserve their batches from.
    pool: Arc<dyn MemoryPool>,
    spill_manager: SpillManager,
    /// Rows per output batch and per spilled batch.
    batch_rows: usize,
    /// Position of the key column (= the number of content columns).
    key_column: usize,
    /// The keys are content keys whose copies still need their own keys;
    /// unset for the sorter of copies, whose keys are final.
    spread_copies: bool,
    /// Most bytes held before spilling, besides what the pool allows; set
    /// for the sorter of later copies (see `merge_runs`).
    hold_limit: Option<usize>,
}

impl Permuter {
    /// An empty permuter of batches shaped like `spill_manager`'s schema.
    fn new(
        reservation: MemoryReservation,
        pool: &Arc<dyn MemoryPool>,
        spill_manager: SpillManager,
        batch_rows: usize,
        spread_copies: bool,
    ) -> Self {
        let key_column = spill_manager.schema().fields().len() - 1;
        let merge_headroom = MemoryConsumer::new(format!(
            "{} merge headroom",
            reservation.consumer().name()
        ))
        .register(pool);
        Self {
            held: Vec::new(),
            index: Vec::new(),
            runs: Vec::new(),
            reservation,
            merge_headroom,
            pool: Arc::clone(pool),
            spill_manager,
            batch_rows,
            key_column,
            spread_copies,
            hold_limit: None,
        }
    }

    /// Reads all input, then returns the output stream (with the key column
    /// holding every row's final key).
    async fn run(
        mut self,
        mut arrivals: SendableRecordBatchStream,
        baseline: BaselineMetrics,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        while let Some(batch) = arrivals.next().await {
            let batch = batch?;
            let _timer = baseline.elapsed_compute().timer();
            self.push(batch)?;
        }
        drop(arrivals);
        if self.runs.is_empty() {
            self.gather_in_memory(baseline)
        } else {
            self.merge_runs(baseline).await
        }
    }

    fn is_empty(&self) -> bool {
        self.held.is_empty() && self.runs.is_empty()
    }

    /// Holds `batch`, first spilling what is held if it does not fit.
    fn push(&mut self, batch: RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let bytes = get_record_batch_memory_size(&batch) + rows * INDEX_ENTRY_BYTES;
        let over_limit = self
            .hold_limit
            .is_some_and(|limit| self.reservation.size() + bytes > limit);
        if over_limit && !self.held.is_empty() {
            self.spill()?;
        }
        if self.reservation.try_grow(bytes).is_err() {
            if self.held.is_empty() {
                return resources_err!(
                    "SHUFFLE: one batch of {rows} rows needs {bytes} bytes, more than the \
                     memory limit leaves; raise --memory-limit"
                );
            }
            self.spill()?;
            self.reservation.try_grow(bytes)?;
        }
        if self.held.len() >= u32::MAX as usize {
            return resources_err!("SHUFFLE: more than 4 billion batches held in memory");
        }
        if batch
            .column(self.key_column)
            .as_primitive_opt::<UInt64Type>()
            .is_none()
        {
            return internal_err!("{SHUFFLE_KEY_COLUMN} is not UInt64");
        }
        self.held.push(batch);
        Ok(())
    }

    /// Builds the index of everything held, sorted by key. It is built once,
    /// at its exact size, from the held key columns (growing it batch by
    /// batch would briefly need three times its size when it reallocates).
    /// Equal keys (copies of one row) fall back to arrival order, which
    /// cannot be seen in the output.
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

    /// Output batch number `chunk`: the content columns of that slice of the
    /// index, plus the index's keys as the key column when `with_key`.
    fn gather(&self, chunk: usize, with_key: bool) -> Result<RecordBatch> {
        let start = chunk * self.batch_rows;
        let end = (start + self.batch_rows).min(self.index.len());
        let entries = &self.index[start..end];
        let indices: Vec<(usize, usize)> = entries
            .iter()
            .map(|&(_, batch, row)| (batch as usize, row as usize))
            .collect();
        let mut columns = (0..self.key_column)
            .map(|column| {
                let arrays: Vec<&dyn Array> = self
                    .held
                    .iter()
                    .map(|b| b.column(column).as_ref())
                    .collect();
                interleave(&arrays, &indices)
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
        let schema = if with_key {
            columns.push(Arc::new(UInt64Array::from_iter_values(
                entries.iter().map(|e| e.0),
            )));
            Arc::clone(self.spill_manager.schema())
        } else {
            let fields = self.spill_manager.schema().fields();
            Arc::new(Schema::new(fields[..self.key_column].to_vec()))
        };
        let options = RecordBatchOptions::new().with_row_count(Some(entries.len()));
        Ok(RecordBatch::try_new_with_options(
            schema, columns, &options,
        )?)
    }

    /// Writes everything held as one run sorted by the held keys, and frees it.
    fn spill(&mut self) -> Result<()> {
        self.build_index();
        let mut file = self
            .spill_manager
            .create_in_progress_file("PermuteExec run")?;
        let mut max_batch_bytes = 0;
        for chunk in 0..self.index.len().div_ceil(self.batch_rows) {
            let batch = self.gather(chunk, true)?;
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
        self.reserve_merge_headroom();
        Ok(())
    }

    /// Sets aside what merging the runs will take: two buffered batches of
    /// each of two runs (the least DataFusion's merge works with), twice when
    /// copies are numbered in a nested merge. Like `SortExec`'s
    /// `sort_spill_reservation_bytes`, this is taken while the memory just
    /// freed by the spill is ours: a partition that fits in memory and holds
    /// its batches until its output is read would otherwise leave another
    /// partition's merge nothing, depending on which ran first. It is best
    /// effort: when the pool cannot give it, the merge asks again and fails
    /// with the pool's error if the memory is still not there.
    fn reserve_merge_headroom(&mut self) {
        let largest = self
            .runs
            .iter()
            .map(|run| run.max_record_batch_memory)
            .max()
            .unwrap_or(0);
        let merges = if self.spread_copies { 2 } else { 1 };
        let wanted = largest * 4 * merges;
        if wanted > self.merge_headroom.size() {
            let _ = self.merge_headroom.try_resize(wanted);
        }
    }

    /// Everything fit: sort the index, give copies their keys, and stream
    /// gathered batches; held batches are released when the stream ends.
    fn gather_in_memory(
        mut self,
        baseline: BaselineMetrics,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        {
            let _timer = baseline.elapsed_compute().timer();
            self.build_index();
            if self.spread_copies
                && spread_copies_in_index(&self.held, &mut self.index, self.key_column)
            {
                self.index.sort_unstable();
            }
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
                this.gather(chunk, true)
            })
            .boxed())
    }

    /// DataFusion's streaming merge by key of `runs` and `streams`, each
    /// sorted by key, starting with the memory in `reservation` (the merge
    /// grows it as needed and frees it when the stream ends).
    fn merge(
        &self,
        runs: Vec<SortedSpillFile>,
        streams: Vec<SendableRecordBatchStream>,
        metrics: BaselineMetrics,
        reservation: MemoryReservation,
    ) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(self.spill_manager.schema());
        let key: Arc<dyn PhysicalExpr> =
            Arc::new(Column::new(SHUFFLE_KEY_COLUMN, self.key_column));
        let ordering = LexOrdering::new([PhysicalSortExpr::new_default(key)])
            .ok_or_else(|| internal_datafusion_err!("empty shuffle ordering"))?;
        StreamingMergeBuilder::new()
            .with_sorted_spill_files(runs)
            .with_streams(streams)
            .with_spill_manager(self.spill_manager.clone())
            .with_schema(schema)
            .with_expressions(&ordering)
            .with_metrics(metrics)
            .with_batch_size(self.batch_rows)
            .with_reservation(reservation)
            .build()
    }

    /// Some runs are on disk: spill the rest and merge all runs by key.
    ///
    /// With content keys, copies of a row can sit in different runs, so the
    /// merge in content-key order is walked first to number them (pass 1):
    /// copies after the first go, with their own keys, to a second sorter.
    /// When there are none the runs are merged once more as they are;
    /// otherwise the merge of the runs minus those copies (pass 2, whose
    /// content keys are their final keys) is merged with the sorted copies.
    /// Without repeated rows this costs one more read of the runs.
    async fn merge_runs(
        mut self,
        baseline: BaselineMetrics,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        if !self.held.is_empty() {
            self.spill()?;
        }
        let runs = std::mem::take(&mut self.runs);
        if !self.spread_copies {
            let headroom = self.merge_headroom.take();
            return Ok(self.merge(runs, vec![], baseline, headroom)?.boxed());
        }
        // Everything is on disk: the copies take over the (empty) reservation,
        // so that a fair pool does not split the budget with an idle consumer.
        let reservation = std::mem::replace(
            &mut self.reservation,
            MemoryConsumer::new("PermuteExec runs").register(&self.pool),
        );
        let mut copies = Permuter::new(
            reservation,
            &self.pool,
            self.spill_manager.clone(),
            self.batch_rows,
            false,
        );
        // The later copies accumulate while pass 1 merges and the operators
        // above run: a spillable consumer of a fair pool may take all that
        // is left and starve them, so it holds no more than this partition
        // set aside for a merge, and spills beyond.
        copies.hold_limit = Some(self.merge_headroom.size().max(1));
        let mut counter = CopyCounter::new(self.key_column);
        // Pass 1 merges alone, with all the headroom; it is given back to the
        // pool when the pass ends and set aside again at once for pass 2.
        let headroom_bytes = self.merge_headroom.size();
        let headroom = self.merge_headroom.take();
        let mut merged =
            self.merge(reopen(&runs), vec![], baseline.intermediate(), headroom)?;
        while let Some(batch) = merged.next().await {
            let batch = batch?;
            let _timer = baseline.elapsed_compute().timer();
            if let Some(later) = later_copies(&mut counter, &batch, self.key_column)? {
                copies.push(later)?;
            }
        }
        drop(merged);
        // Best effort, as when it was first set aside.
        let _ = self.merge_headroom.try_resize(headroom_bytes);
        if copies.is_empty() {
            let headroom = self.merge_headroom.take();
            return Ok(self.merge(runs, vec![], baseline, headroom)?.boxed());
        }
        // Pass 2 runs two merges at once: the runs' (half the headroom) and
        // the outer one of its first copies with the later copies (the rest,
        // plus what the copies' sorter set aside if it spilled).
        let key_column = self.key_column;
        let mut counter = CopyCounter::new(key_column);
        let runs_headroom = self.merge_headroom.split(self.merge_headroom.size() / 2);
        let first_copies = self
            .merge(runs, vec![], baseline.intermediate(), runs_headroom)?
            .map(move |batch| first_copies(&mut counter, &batch?, key_column));
        let first_copies: SendableRecordBatchStream =
            Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(self.spill_manager.schema()),
                first_copies,
            ));
        let streams = vec![first_copies];
        // The runs did not fit in memory, so neither does holding the later
        // copies through the final merge next to the merges' buffers (under
        // a tight budget that failed depending on the other partitions'
        // timing): they go to disk too, and are merged as runs.
        if !copies.held.is_empty() {
            copies.spill()?;
        }
        let copy_runs = std::mem::take(&mut copies.runs);
        let headroom = self.merge_headroom.take();
        // The copies' sorter is done: what it set aside moves over to the
        // merge of its runs (best effort, as when it was set aside).
        let copies_bytes = copies.merge_headroom.size();
        drop(copies);
        let _ = headroom.try_grow(copies_bytes);
        Ok(self.merge(copy_runs, streams, baseline, headroom)?.boxed())
    }
}

/// The runs again, for a second merge; the files stay until the last
/// reference is dropped.
fn reopen(runs: &[SortedSpillFile]) -> Vec<SortedSpillFile> {
    runs.iter()
        .map(|run| SortedSpillFile {
            file: Arc::clone(&run.file),
            max_record_batch_memory: run.max_record_batch_memory,
        })
        .collect()
}

/// The rows of `batch` (in content-key order) that are not the first copy of
/// their content, with their [`copy_key`]s in the key column.
fn later_copies(
    counter: &mut CopyCounter,
    batch: &RecordBatch,
    key_column: usize,
) -> Result<Option<RecordBatch>> {
    let keys = content_keys(batch, key_column)?;
    let mut rows = Vec::new();
    let mut new_keys = Vec::new();
    for (row, &key) in keys.values().iter().enumerate() {
        let copy = counter.copy_index(batch, row, key);
        if copy > 0 {
            rows.push(row as u32);
            new_keys.push(copy_key(key, copy));
        }
    }
    if rows.is_empty() {
        return Ok(None);
    }
    let taken = take_record_batch(batch, &UInt32Array::from(rows))?;
    // A taken view array still points into (and would be charged for) the
    // whole merged batch's buffers.
    let mut columns = compact_views(&taken.columns()[..key_column]);
    columns.push(Arc::new(UInt64Array::from(new_keys)));
    Ok(Some(RecordBatch::try_new(taken.schema(), columns)?))
}

/// The rows of `batch` (in content-key order) that are the first copy of
/// their content; their content key is their final key.
fn first_copies(
    counter: &mut CopyCounter,
    batch: &RecordBatch,
    key_column: usize,
) -> Result<RecordBatch> {
    let keys = content_keys(batch, key_column)?;
    let first: BooleanArray = keys
        .values()
        .iter()
        .enumerate()
        .map(|(row, &key)| Some(counter.copy_index(batch, row, key) == 0))
        .collect();
    Ok(filter_record_batch(batch, &first)?)
}

/// `columns` with string and binary views copied into buffers of their own.
/// Taking or interleaving rows of a view array keeps every buffer the rows
/// came from, and a reservation of the batch pays for all of them.
fn compact_views(columns: &[ArrayRef]) -> Vec<ArrayRef> {
    columns
        .iter()
        .map(|column| match column.data_type() {
            DataType::Utf8View => Arc::new(column.as_string_view().gc()) as ArrayRef,
            DataType::BinaryView => Arc::new(column.as_binary_view().gc()),
            _ => Arc::clone(column),
        })
        .collect()
}

fn content_keys(batch: &RecordBatch, key_column: usize) -> Result<&UInt64Array> {
    batch
        .column(key_column)
        .as_primitive_opt::<UInt64Type>()
        .ok_or_else(|| internal_datafusion_err!("{SHUFFLE_KEY_COLUMN} is not UInt64"))
}
