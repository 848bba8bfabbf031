//! [`DeviceSinkExec`]: the terminal operator of a feed. It cuts the query's
//! rows into this rank's exact batches, writes them as tensors into a free
//! slot of the ring, starts their upload to the device and hands them to the
//! consumer, running ahead of it by up to `prefetch` batches.
//!
//! # Data flow
//! ```text
//!  input partitions p0 … pN-1 (each buffered by its own task)
//!        │ round-robin by record batch, in partition order (deterministic)
//!        ▼            (a SHUFFLE plan has one partition: the global order)
//!  Replacer (on_error = quarantine): rows the plan marked as failing are
//!        │ logged and take the row before them (see `quarantine`)
//!        ▼
//!  ShardBatcher: chunks of B×W rows → this rank's B rows (see batcher.rs)
//!        │ zero-copy slices
//!        ▼
//!  wait for a free slot ──► convert: rows → tensors in the slot's host
//!  (consumer slower:         buffers (dtype, scale, padding, masks)
//!   "stall_time")               │
//!                               ▼
//!                    upload (CUDA: async H2D + event; CPU: nothing)
//!                               │
//!                               ▼
//!                    ready channel ──► Feed::next() in the training loop
//! ```
//!
//! # Output
//! One row per epoch: `steps` (global steps the epoch had), `batches` and
//! `rows` delivered to this rank. The tensors go to the ring, not the
//! output.
//!
//! # Ordering
//! Deterministic for a fixed plan: a one-partition input (a global
//! `SHUFFLE`, an `ORDER BY`) is read in order; several partitions are
//! interleaved in turns of the session's batch size in rows, in partition
//! order (`crate::exec::lanes`), which depends only on each partition's own
//! (deterministic) row sequence, never on timing or on how its record
//! batches are cut. Round-robin repartitioning, which is timing dependent, is turned
//! off for feeds.
//!
//! # Epoch ends
//! Every batch says whether it is the epoch's last on this rank
//! (`BatchMeta::last_in_epoch`), so that a consumer that stops after it
//! without asking for another (a loop of `len(feed)` steps, PyTorch
//! Lightning) is positioned at the next epoch's start. A batch is handed
//! over as soon as the rows prove that a step follows it: for fixed batch
//! sizes one more row after its chunk (with `drop_last`, the next complete
//! chunk); under a token budget the next batch. Only the newest batch waits
//! for that, so the first batch of an epoch comes one row (or one chunk)
//! later and the steady state does not change.
//!
//! # Memory
//! At most one chunk (`B × W` rows of record batches, by reference: a slice
//! keeps its whole record batch), the first `W − 1` rows (copied), a length
//! bucketing window, the newest batch's rows (above), plus two buffered
//! record batches per partition, plus the slot ring. What the batcher, the
//! bucketer and the newest batch hold is reserved from the session's pool
//! after every record batch, and the ring's buffers before they are
//! allocated, so one budget covers the feed. A quarantining feed's
//! replacer holds one row, and the record batches before an epoch's first
//! row that evaluates (rows that all failed: at most the limit's worth),
//! which are not reserved.
//!
//! # Cancellation
//! If the consumer goes away (the feed is dropped), the next hand-off fails
//! and the stream ends with an error, dropping the input streams and with
//! them every task of the query.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::exec_datafusion_err;
use datafusion::common::plan_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, Time,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use futures::StreamExt;

use super::batcher::{Batcher, Cut, EpochStart, LengthBucketer, Shard};
use super::columns::TensorColumn;
use super::convert::packed::{PackedTensors, fill_packed_slot};
use super::convert::{BatchRows, fill_slot};
use super::metrics::FeedMetrics;
use super::quarantine::{Quarantine, Replacer};
use crate::device::{BatchMeta, SlotPool, TensorBatch};
use crate::exec::row_errors::has_row_errors;
use crate::exec::{BatchStream, Setting};

/// What the producer sends to [`super::Feed`].
pub(crate) enum FeedEvent {
    /// A batch, ready once its upload completes.
    Batch(TensorBatch),
    /// An epoch finished; the plan rendered with its metrics.
    EpochEnd {
        /// The epoch.
        epoch: u64,
        /// `EXPLAIN ANALYZE`-style plan of the epoch.
        plan: String,
        /// Seconds from the start of the epoch's planning to its last batch
        /// (the first epoch includes filling the cache).
        seconds: f64,
        /// Rows each source of a `MIX` gave the epoch, by name (empty
        /// without a mixture).
        mixture: Vec<(String, u64)>,
    },
    /// The feed failed.
    Error(DataFusionError),
    /// Every epoch is done.
    Done,
}

/// The sending side of the ready channel.
pub(crate) type ReadySender = mpsc::Sender<FeedEvent>;

/// How rows become batches besides an epoch's [`Cut`] (fixed for a feed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batching {
    /// Rows per batch (`B`), this rank of `W`, and whether the last partial
    /// chunk is dropped.
    pub(crate) shard: Shard,
    /// Length bucketing: window in global steps.
    pub(crate) bucket_window: Option<usize>,
    /// The measured variable-length column (index, `pad_to`), for token
    /// budgets and bucketing.
    pub(crate) length_column: Option<(usize, Option<usize>)>,
    /// Seed of the bucketed chunk order.
    pub(crate) seed: u64,
}

/// What every epoch's sink writes into, shared with the feed.
pub(crate) struct SinkTarget {
    /// The slot ring (locked by the one running sink).
    pub(crate) pool: Arc<tokio::sync::Mutex<SlotPool>>,
    /// To the consumer.
    pub(crate) ready: ReadySender,
    /// The tensor of each column.
    pub(crate) columns: Vec<TensorColumn>,
    /// Batch layout.
    pub(crate) batching: Batching,
    /// Feed-level counters.
    pub(crate) metrics: Arc<FeedMetrics>,
    /// Steps not handed over, by epoch (a resume that skips the batches of
    /// a loss spike; every other batch stays where it was).
    pub(crate) skipped_steps: BTreeMap<u64, BTreeSet<u64>>,
    /// Marked rows replaced before the batcher (`on_error = quarantine`).
    pub(crate) quarantine: Option<Quarantine>,
    /// A packing feed's tensors (instead of `columns`).
    pub(crate) packed: Option<PackedTensors>,
}

impl fmt::Debug for SinkTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkTarget")
            .field("batching", &self.batching)
            .field("columns", &self.columns.len())
            .finish()
    }
}

/// The end of a feed's epoch: cuts its input (in a deterministic order)
/// into this rank's exact batches, converts them into slots of the device
/// ring and hands them to the training loop; outputs one summary row.
/// Module docs: the data flow, ordering, memory and cancellation.
#[derive(Debug)]
pub struct DeviceSinkExec {
    /// The feed's query.
    input: Arc<dyn ExecutionPlan>,
    /// Ring, channel, columns.
    target: Arc<SinkTarget>,
    /// The epoch this sink runs.
    epoch: u64,
    /// Where the epoch starts (resume).
    start: EpochStart,
    /// How the rows are cut into this rank's batches, as the feed's plan
    /// says: [`Cut::Dealt`] when the input is this rank's rows only (a
    /// cluster job dealt on the executors, which cut the shard and the last
    /// step).
    cut: Cut,
    /// Cached plan properties.
    properties: Arc<PlanProperties>,
    /// Batches, rows, bytes, convert and stall time.
    metrics: ExecutionPlanMetricsSet,
}

fn summary_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("steps", DataType::UInt64, false),
        Field::new("batches", DataType::UInt64, false),
        Field::new("rows", DataType::UInt64, false),
    ]))
}

impl DeviceSinkExec {
    pub(crate) fn new(
        input: Arc<dyn ExecutionPlan>,
        target: Arc<SinkTarget>,
        epoch: u64,
        start: EpochStart,
        cut: Cut,
    ) -> Self {
        let properties =
            crate::exec::one_bounded_partition(summary_schema(), EmissionType::Final);
        Self {
            input,
            target,
            epoch,
            start,
            cut,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for DeviceSinkExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let b = &self.target.batching;
        let device = self
            .target
            .pool
            .try_lock()
            .map(|p| p.backend().device().to_string())
            .unwrap_or_else(|_| "busy".into());
        let mut fields = vec![
            ("device", device),
            match &self.cut {
                Cut::Tokens(tokens) => ("batch_tokens", tokens.budget.to_string()),
                Cut::Pack(pack) => ("pack", pack.options.max_tokens.to_string()),
                Cut::Shard(_) | Cut::Dealt { .. } => {
                    ("batch_size", b.shard.batch_rows.to_string())
                }
            },
            ("shard", format!("{}/{}", b.shard.rank, b.shard.world)),
            ("drop_last", b.shard.drop_last.to_string()),
            ("epoch", self.epoch.to_string()),
        ];
        if matches!(self.cut, Cut::Dealt { .. }) {
            fields.push(("dealt", "true".into()));
        }
        if let Some(window) = b.bucket_window {
            fields.push(("bucket_by_length", window.to_string()));
        }
        match self.start {
            EpochStart::Step(0) => {}
            EpochStart::Step(step) => fields.push(("resume_step", step.to_string())),
            EpochStart::Rows { rows, .. } => {
                fields.push(("resume_after_rows", rows.to_string()))
            }
        }
        let settings: Vec<Setting> = fields.iter().map(|(k, v)| (*k, v as _)).collect();
        crate::exec::fmt_settings(f, t, "DeviceSinkExec", &settings)
    }
}

impl ExecutionPlan for DeviceSinkExec {
    crate::exec::one_input_operator! {
        name: "DeviceSinkExec",
        properties: own,
        rebuild: |this, child| {
            let target = Arc::clone(&this.target);
            Ok(Self::new(child, target, this.epoch, this.start, this.cut.clone()))
        },
    }

    // Partitions are consumed in a fixed interleave; splitting them further
    // (round-robin) would make the order depend on timing.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        crate::exec::only_partition("DeviceSinkExec", partition)?;
        let metrics = SinkMetrics::new(&self.metrics);
        let run = SinkRun {
            input: Arc::clone(&self.input),
            target: Arc::clone(&self.target),
            epoch: self.epoch,
            start: self.start,
            cut: self.cut.clone(),
            metrics,
        };
        let stream = futures::stream::once(run.run(ctx));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            summary_schema(),
            stream,
        )))
    }

    crate::exec::metrics_of_field!();
}

/// Operator metrics shown by `EXPLAIN ANALYZE`-style plans.
struct SinkMetrics {
    batches: Count,
    rows: Count,
    bytes: Count,
    padding_elems: Count,
    convert_time: Time,
    stall_time: Time,
}

impl SinkMetrics {
    fn new(set: &ExecutionPlanMetricsSet) -> Self {
        Self {
            batches: MetricBuilder::new(set).counter("batches", 0),
            rows: MetricBuilder::new(set).output_rows(0),
            bytes: MetricBuilder::new(set).counter("tensor_bytes", 0),
            padding_elems: MetricBuilder::new(set).counter("padding_elems", 0),
            convert_time: MetricBuilder::new(set).subset_time("convert_time", 0),
            stall_time: MetricBuilder::new(set).subset_time("stall_time", 0),
        }
    }
}

/// One execution of the sink.
struct SinkRun {
    input: Arc<dyn ExecutionPlan>,
    target: Arc<SinkTarget>,
    epoch: u64,
    start: EpochStart,
    cut: Cut,
    metrics: SinkMetrics,
}

impl SinkRun {
    async fn run(self, context: Arc<TaskContext>) -> Result<RecordBatch> {
        let memory_pool = Arc::clone(context.memory_pool());
        let mut input = ordered_input(&self.input, context)?;
        let b = self.target.batching;
        let epoch = self.epoch;
        // Rows whose functions failed, marked by the plan, are replaced in
        // the epoch's order before any rank's slice is cut from it.
        let mut replacer = match &self.target.quarantine {
            Some(quarantine) if has_row_errors(&self.input.schema()) => Some(
                Replacer::new(epoch, quarantine.clone(), self.input.schema()),
            ),
            _ => None,
        };
        let length_column = b.length_column.map_or(0, |(index, _)| index);
        let mut batcher = Batcher::new(self.cut.clone(), epoch, self.start);
        if let Batcher::Pack(packer) = &mut batcher {
            packer.report_to(Arc::clone(&self.target.metrics));
        }
        let mut bucketer = b.bucket_window.map(|window| {
            LengthBucketer::new(
                window,
                b.shard.batch_rows * b.shard.world,
                length_column,
                b.seed,
                epoch,
            )
        });
        // What the batcher and the bucketer hold between record batches is
        // the feed's too: reserved (not spillable, so the operators below
        // spill to make room) from the session's one pool.
        let held = MemoryConsumer::new(format!("feed batcher (epoch {epoch})"))
            .register(&memory_pool);
        let no_skips = BTreeSet::new();
        let skipped = self.target.skipped_steps.get(&epoch).unwrap_or(&no_skips);
        let mut pool = self.target.pool.lock().await;
        let mut ready = Vec::new();
        let mut handed = Handed::default();
        let mut input_done = false;
        while !input_done {
            match input.next().await {
                Some(batch) => {
                    let batches = match &mut replacer {
                        Some(replacer) => replacer.push(batch?)?,
                        None => vec![batch?],
                    };
                    for batch in batches {
                        match &mut bucketer {
                            Some(bucketer) => bucketer.push(batch),
                            None => batcher.push(batch, &mut ready)?,
                        }
                    }
                }
                None => {
                    input_done = true;
                    if let Some(replacer) = &replacer {
                        replacer.finish()?;
                    }
                    if let Some(bucketer) = &mut bucketer {
                        bucketer.finish();
                    }
                }
            }
            loop {
                self.hand_over_all_but_newest(
                    &mut pool,
                    &mut ready,
                    skipped,
                    &mut handed,
                )
                .await?;
                // With skipped steps, the step that follows might be one of
                // them: only a later batch or the end proves "not last".
                if let Some(step) = handed.newest.as_ref().map(|b| b.step)
                    && skipped.is_empty()
                    && batcher.step_follows(step)
                    && let Some(not_last) = handed.newest.take()
                {
                    self.deliver(&mut pool, not_last, false, &mut handed)
                        .await?;
                }
                held.resize(
                    batcher.held_bytes()
                        + bucketer.as_ref().map_or(0, LengthBucketer::held_bytes)
                        + handed.newest.as_ref().map_or(0, BatchRows::held_bytes),
                );
                // Bucketed chunks one at a time, each delivered before the
                // next is gathered.
                match bucketer
                    .as_mut()
                    .map(LengthBucketer::next_chunk)
                    .transpose()?
                {
                    Some(Some(chunk)) => batcher.push(chunk, &mut ready)?,
                    _ => break,
                }
            }
        }
        batcher.finish(&mut ready)?;
        self.hand_over_all_but_newest(&mut pool, &mut ready, skipped, &mut handed)
            .await?;
        if let Some(last) = handed.newest.take() {
            self.deliver(&mut pool, last, true, &mut handed).await?;
        }
        let steps = batcher.steps();
        // Resuming exactly at the end of an epoch (a checkpoint taken after
        // its last batch) yields nothing of it; beyond the end is an error.
        if let Some(message) = batcher.beyond_the_end() {
            return plan_err!("{message}");
        }
        let column = |v: u64| Arc::new(UInt64Array::from(vec![v])) as _;
        Ok(RecordBatch::try_new(
            summary_schema(),
            vec![column(steps), column(handed.batches), column(handed.rows)],
        )?)
    }

    /// Hands over the batches in `ready` (but skipped steps) except the
    /// newest, which replaces `handed.newest` until it is known whether it
    /// ends the epoch.
    async fn hand_over_all_but_newest(
        &self,
        pool: &mut SlotPool,
        ready: &mut Vec<BatchRows>,
        skipped: &BTreeSet<u64>,
        handed: &mut Handed,
    ) -> Result<()> {
        for batch_rows in ready.drain(..).filter(|b| !skipped.contains(&b.step)) {
            if let Some(earlier) = handed.newest.replace(batch_rows) {
                self.deliver(pool, earlier, false, handed).await?;
            }
        }
        Ok(())
    }

    /// Converts one batch into a free slot and hands it over.
    async fn deliver(
        &self,
        pool: &mut SlotPool,
        rows: BatchRows,
        last_in_epoch: bool,
        handed: &mut Handed,
    ) -> Result<()> {
        handed.batches += 1;
        handed.rows += rows.rows as u64;
        let stall = self.metrics.stall_time.timer();
        let stall_start = Instant::now();
        let mut slot = pool.acquire().await?;
        FeedMetrics::add_time(&self.target.metrics.stall_ns, stall_start.elapsed());
        stall.done();

        let convert = self.metrics.convert_time.timer();
        let convert_start = Instant::now();
        let stats = match &self.target.packed {
            Some(packed) => fill_packed_slot(packed, &rows, pool, &mut slot)?,
            None => fill_slot(&self.target.columns, &rows, pool, &mut slot)?,
        };
        pool.backend().upload(&mut slot)?;
        FeedMetrics::add_time(&self.target.metrics.convert_ns, convert_start.elapsed());
        convert.done();

        let meta = BatchMeta {
            epoch: rows.epoch,
            step: rows.step,
            rows: rows.rows,
            last_in_epoch,
            // Dealt rows are this rank's only: a step of the global order is
            // `B × W` of them (the last one's count is not needed, since the
            // position after it is the next epoch's start).
            rows_after: match self.cut {
                Cut::Dealt { batch_rows, world } => {
                    (rows.step + 1) * (batch_rows * world) as u64
                }
                Cut::Shard(_) | Cut::Tokens(_) | Cut::Pack(_) => rows.rows_after,
            },
        };
        let batch = pool.lease(slot, meta);
        self.metrics.batches.add(1);
        self.metrics.rows.add(rows.rows);
        self.metrics.bytes.add(batch.nbytes());
        self.metrics.padding_elems.add(stats.padding as usize);
        let feed = &self.target.metrics;
        FeedMetrics::add(&feed.padding, stats.padding);
        FeedMetrics::add(&feed.padded_total, stats.total);
        FeedMetrics::add(&feed.produced, 1);
        // Counted before the send so that the consumer's `taken` never
        // runs ahead of it.
        pool.loans().queued();
        self.target
            .ready
            .send(FeedEvent::Batch(batch))
            .map_err(|_| exec_datafusion_err!("the feed was dropped"))
    }
}

/// What a sink run handed over so far, and the batch it holds back.
#[derive(Debug, Default)]
struct Handed {
    /// Batches.
    batches: u64,
    /// Rows in them.
    rows: u64,
    /// The newest batch, until the rows prove that another step follows it
    /// or the epoch ends: only then is it known whether it is the epoch's
    /// last (see "Epoch ends" above).
    newest: Option<BatchRows>,
}

/// The input's rows in a deterministic order: see "Ordering" above.
fn ordered_input(
    input: &Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let turn_rows = context.session_config().batch_size();
    crate::exec::lanes::ordered_partitions(input, context, turn_rows)
}
