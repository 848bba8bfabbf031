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
//! Which columns are compared is the operator's [`CopyIdentity`]: all of
//! them, or only a content hash column that the other columns ride along
//! with (`explain_batch`'s origins, a cached epoch).
//!
//! # Ordering
//! Output is in ascending key order, the same order as the sort-based plan.
//! Rows with equal final keys are copies of one row only by a 64-bit
//! collision; two different rows with the same content key (probability
//! about n²/2⁶⁵) come out in arrival order.
//!
//! # Modes
//! [`PermuteMode::Gather`] reads every input partition into one output
//! partition and drops the key (the embedded plan); once all of it is in
//! memory, the cores the scan used (`sqlfeed.shuffle_sort_threads`) place
//! its index in key-range groups and look for copies, and the groups are
//! sorted one after another behind the output (`streamed_index.rs`); with
//! one thread, or a small input, the index is sorted whole first
//! (`index_sort.rs`). The order is the same.
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
//! second consumer and written to disk before the final merge. Each run's
//! keys are also written alone beside it (8 bytes a row): their merge tells
//! whether any content key repeats, and without repeated rows the runs are
//! read once, by the final merge; with them, once more to number the copies
//! (the `copy_passes` metric counts those passes).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::Statistics;
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, RecordOutput, SpillMetrics,
};
use datafusion::physical_plan::spill::SpillManager;
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::stream::{
    RecordBatchReceiverStream, RecordBatchStreamAdapter,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    PlanProperties,
};
use futures::StreamExt;

use super::{CopyIdentity, SHUFFLE_KEY_COLUMN};

mod index_sort;
mod permuter;
mod streamed_index;
use crate::exec::BatchStream;
use permuter::Permuter;
pub(super) use permuter::compact_views;
pub(crate) use permuter::{fit_batch, fitted_size};

/// Bytes of one index entry.
const INDEX_ENTRY_BYTES: usize = std::mem::size_of::<(u64, u32, u32)>();

/// Threads that sort a gathering permutation's index: the session's
/// `sqlfeed.shuffle_sort_threads`, or its target partitions (the cores its
/// scan used) where that is 0.
fn sort_threads(ctx: &TaskContext) -> usize {
    let config = ctx.session_config();
    match crate::config::SqlfeedOptions::of(config.options()).shuffle_sort_threads {
        0 => config.target_partitions(),
        threads => threads,
    }
}

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
    /// Which columns make two rows copies (unused by [`PermuteMode::Ranged`],
    /// whose rows have their final keys).
    copies: CopyIdentity,
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
        super::key::check_key_is_last("PermuteExec", &input_schema)?;
        let fields = input_schema.fields();
        let properties = match mode {
            PermuteMode::Gather => {
                let schema = Arc::new(Schema::new_with_metadata(
                    fields[..fields.len() - 1].to_vec(),
                    input_schema.metadata().clone(),
                ));
                crate::exec::one_bounded_partition(schema, EmissionType::Final)
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
            copies: CopyIdentity::Values,
            schema: Arc::clone(properties.eq_properties.schema()),
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Which partitions are permuted together.
    pub fn mode(&self) -> PermuteMode {
        self.mode
    }

    /// Tells copies apart by `copies` ([`CopyIdentity::Values`] unless set);
    /// a content hash column that is not one of the input's columns before
    /// the key is an internal error.
    pub fn with_copies(mut self, copies: CopyIdentity) -> Result<Self> {
        let key_column = self.input.schema().fields().len() - 1;
        if let CopyIdentity::ContentHash(index) = copies
            && index >= key_column
        {
            return internal_err!(
                "PermuteExec: content hash column {index} is not one of the {key_column} \
                 columns before the key"
            );
        }
        self.copies = copies;
        Ok(self)
    }

    /// Which columns make two rows copies.
    pub fn copies(&self) -> CopyIdentity {
        self.copies
    }
}

impl DisplayAs for PermuteExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        // Copies told apart by a content hash column: name it.
        let copies = match self.copies {
            CopyIdentity::Values => None,
            CopyIdentity::ContentHash(index) => {
                Some(self.input.schema().field(index).name().clone())
            }
        };
        if let DisplayFormatType::TreeRender = t {
            let mode = match self.mode {
                PermuteMode::Gather => "gather",
                PermuteMode::PerPartition => "per_partition",
                PermuteMode::Ranged => "ranged",
            };
            write!(f, "key={SHUFFLE_KEY_COLUMN}\nmode={mode}")?;
            if let Some(column) = copies {
                write!(f, "\ncopies_by={column}")?;
            }
            return Ok(());
        }
        match self.mode {
            PermuteMode::Gather => write!(f, "PermuteExec: key={SHUFFLE_KEY_COLUMN}")?,
            PermuteMode::PerPartition => write!(
                f,
                "PermuteExec: key={SHUFFLE_KEY_COLUMN}, preserve_partitioning=true"
            )?,
            PermuteMode::Ranged => write!(
                f,
                "PermuteExec: key={SHUFFLE_KEY_COLUMN}, preserve_partitioning=true, ranged=true"
            )?,
        }
        match copies {
            Some(column) => write!(f, ", copies_by={column}"),
            None => Ok(()),
        }
    }
}

impl ExecutionPlan for PermuteExec {
    crate::exec::one_input_operator! {
        name: "PermuteExec",
        properties: own,
        rebuild: |this, child| {
            Self::try_new_with_mode(child, this.mode)?.with_copies(this.copies)
        },
    }

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

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
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
                    let ctx = Arc::clone(&ctx);
                    builder.spawn(async move {
                        let mut stream = input.execute(input_partition, ctx)?;
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
                self.input.execute(partition, Arc::clone(&ctx))?
            }
            PermuteMode::Ranged if partition < partitions => {
                // The order is only right if each partition holds one key
                // range: refuse rows of two ranges (an exchange re-sized
                // after planning; `KeepShuffleOrder` checks the plan too).
                // Ballista numbers a task's partitions locally, so the range
                // is compared with the partition's first row, not its index.
                let input = self.input.execute(partition, Arc::clone(&ctx))?;
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
        let spill_metrics = SpillMetrics::new(&self.metrics, partition);
        let spill_manager = SpillManager::new(
            ctx.runtime_env(),
            spill_metrics.clone(),
            Arc::clone(&input_schema),
        );
        let reservation = MemoryConsumer::new(format!("PermuteExec[{partition}]"))
            .with_can_spill(true)
            .register(ctx.memory_pool());
        let mut permuter = Permuter::new(
            reservation,
            ctx.memory_pool(),
            spill_manager,
            ctx.session_config().batch_size().max(1),
            // Below a range exchange the copies are numbered already.
            (self.mode != PermuteMode::Ranged)
                .then(|| self.copies.columns(input_schema.fields().len() - 1)),
            match self.mode {
                PermuteMode::Ranged => vec![],
                _ => self.copies.ties(input_schema.fields().len() - 1),
            },
        )
        .with_sort_threads(match self.mode {
            // The only partition: when its input is all in, the input's
            // cores are free to sort.
            PermuteMode::Gather => sort_threads(&ctx),
            // Partitions permute side by side, one core each.
            PermuteMode::PerPartition | PermuteMode::Ranged => 1,
        });
        // Copies are numbered here (not below a range exchange): each run's
        // keys go beside it, to look for copies in them first.
        if self.mode != PermuteMode::Ranged {
            let key_spill_manager = SpillManager::new(
                ctx.runtime_env(),
                spill_metrics,
                Arc::new(Schema::new(vec![Field::new(
                    SHUFFLE_KEY_COLUMN,
                    DataType::UInt64,
                    false,
                )])),
            );
            let copy_passes =
                MetricBuilder::new(&self.metrics).counter("copy_passes", partition);
            permuter = permuter.with_key_runs(key_spill_manager, copy_passes);
        }
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

    crate::exec::metrics_of_field!();
}
