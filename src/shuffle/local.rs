//! [`LocalShuffleExec`]: `LOCAL SHUFFLE BUFFER n [SEED s]`, a streaming
//! shuffle buffer per partition (tf.data's `shuffle(n)`).
//!
//! # Background
//! A global shuffle is a barrier; many pipelines only need rows decorrelated
//! within a window. This operator keeps `n` rows per partition and, for each
//! arriving row, emits a uniformly chosen buffered row and puts the new one in
//! its place; at the end of input the rest of the buffer is emitted in random
//! order.
//!
//! ```text
//!  input rows ─► [ buffer of n row slots ] ─► a random slot is emitted and
//!                      ▲                     refilled by the arriving row
//!                      └── slots point into held input batches (no copies);
//!                          batches are compacted when mostly unreferenced
//! ```
//!
//! # Ordering and determinism
//! Partitioning is kept; there is no output ordering. The output of a
//! partition is a pure function of (seed, partition index, that partition's
//! input order), so it is reproducible for the same plan and parallelism, but
//! unlike `SHUFFLE` it changes with `target_partitions`.
//!
//! # Memory
//! The held batches are reserved from the session's memory pool; a buffer
//! that cannot fit is an error that says so (nothing to spill: the buffer *is*
//! the state). At most about `4 × max(n, batch size)` rows are held.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::resources_datafusion_err;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, RecordOutput,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use futures::StreamExt;

use super::shuffle_seed;
use crate::exec::{BatchStream, Setting};
use crate::rand::SplitMix64;

/// A shuffle buffer per partition: holds `buffer_rows` rows and emits a
/// seeded random one for each row that arrives (streaming, not global).
/// Module docs: the algorithm, memory and what it guarantees.
#[derive(Debug)]
pub struct LocalShuffleExec {
    /// Rows to shuffle.
    input: Arc<dyn ExecutionPlan>,
    /// Rows held per partition.
    buffer_rows: usize,
    /// The seed.
    seed: u64,
    /// Cached plan properties.
    properties: Arc<PlanProperties>,
    /// Output rows and compute time.
    metrics: ExecutionPlanMetricsSet,
}

impl LocalShuffleExec {
    /// A shuffle buffer of `buffer_rows` (at least 1) per partition.
    pub fn new(input: Arc<dyn ExecutionPlan>, buffer_rows: usize, seed: u64) -> Self {
        let properties = crate::exec::row_wise_properties(&input, input.schema());
        Self {
            input,
            buffer_rows: buffer_rows.max(1),
            seed,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// Rows held per partition.
    pub fn buffer_rows(&self) -> usize {
        self.buffer_rows
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

impl DisplayAs for LocalShuffleExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let settings: [Setting; 2] =
            [("buffer", &self.buffer_rows), ("seed", &self.seed)];
        crate::exec::fmt_settings(f, t, "LocalShuffleExec", &settings)
    }
}

/// Slot of a buffered row: (index into held batches, row).
type RowRef = (usize, usize);

/// The per-partition state of the buffer.
struct ShuffleBuffer {
    /// Input batches that buffered or pending rows point into.
    held: Vec<RecordBatch>,
    /// Rows in `held` (for compaction decisions).
    held_rows: usize,
    /// The `n` buffered rows.
    slots: Vec<RowRef>,
    /// Rows chosen for output, not yet emitted.
    pending: Vec<RowRef>,
    /// Capacity `n`.
    capacity: usize,
    /// Output batch size.
    batch_size: usize,
    /// Chooses the slot to emit.
    rng: SplitMix64,
    /// Memory of `held`.
    reservation: MemoryReservation,
}

impl ShuffleBuffer {
    fn next_below(&mut self, bound: usize) -> usize {
        self.rng.below(bound as u64) as usize
    }

    fn push(
        &mut self,
        batch: RecordBatch,
        out: &mut VecDeque<RecordBatch>,
    ) -> Result<()> {
        self.reservation.try_grow(batch.get_array_memory_size()).map_err(|e| {
            resources_datafusion_err!("LOCAL SHUFFLE BUFFER {} does not fit in the memory limit ({e}); use a \
                 smaller buffer or raise --memory-limit",
                self.capacity)
        })?;
        let index = self.held.len();
        self.held_rows += batch.num_rows();
        for row in 0..batch.num_rows() {
            if self.slots.len() < self.capacity {
                self.slots.push((index, row));
            } else {
                let slot = self.next_below(self.capacity);
                self.pending.push(self.slots[slot]);
                self.slots[slot] = (index, row);
            }
        }
        self.held.push(batch);
        self.emit_full(out)?;
        if self.held_rows > 4 * self.capacity.max(self.batch_size) {
            self.compact()?;
        }
        Ok(())
    }

    fn emit_full(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<()> {
        while self.pending.len() >= self.batch_size {
            let rest = self.pending.split_off(self.batch_size);
            let rows = std::mem::replace(&mut self.pending, rest);
            out.push_back(self.take(&rows)?);
        }
        Ok(())
    }

    fn take(&self, rows: &[RowRef]) -> Result<RecordBatch> {
        let held: Vec<&RecordBatch> = self.held.iter().collect();
        crate::exec::batches::interleave_rows(&held, rows)
    }

    /// Copies the still-referenced rows into one batch and drops the rest.
    fn compact(&mut self) -> Result<()> {
        let mut live = self.slots.clone();
        live.extend_from_slice(&self.pending);
        let batch = self.take(&live)?;
        let slots = self.slots.len();
        self.slots = (0..slots).map(|row| (0, row)).collect();
        self.pending = (slots..live.len()).map(|row| (0, row)).collect();
        self.held_rows = batch.num_rows();
        self.reservation.try_resize(batch.get_array_memory_size())?;
        self.held = vec![batch];
        Ok(())
    }

    /// End of input: the buffer in random order (Fisher–Yates).
    fn finish(&mut self, out: &mut VecDeque<RecordBatch>) -> Result<()> {
        for i in (1..self.slots.len()).rev() {
            let j = self.next_below(i + 1);
            self.slots.swap(i, j);
        }
        let slots = std::mem::take(&mut self.slots);
        self.pending.extend(slots);
        self.emit_full(out)?;
        if !self.pending.is_empty() {
            let rows = std::mem::take(&mut self.pending);
            out.push_back(self.take(&rows)?);
        }
        self.held.clear();
        self.reservation.free();
        Ok(())
    }
}

impl ExecutionPlan for LocalShuffleExec {
    crate::exec::one_input_operator! {
        name: "LocalShuffleExec",
        properties: own,
        rebuild: |this, child| Ok(Self::new(child, this.buffer_rows, this.seed)),
    }

    // A buffer reorders a partition's rows and keeps them all.
    crate::exec::statistics_of_one_input!(first_input_statistics);

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let input = self.input.execute(partition, Arc::clone(&ctx))?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let reservation = MemoryConsumer::new(format!("LocalShuffleExec[{partition}]"))
            .register(ctx.memory_pool());
        let buffer = ShuffleBuffer {
            held: Vec::new(),
            held_rows: 0,
            slots: Vec::with_capacity(self.buffer_rows.min(1 << 20)),
            pending: Vec::new(),
            capacity: self.buffer_rows,
            batch_size: ctx.session_config().batch_size().max(1),
            rng: SplitMix64::new(shuffle_seed(self.seed, partition as u64)),
            reservation,
        };
        let state = (
            input,
            buffer,
            VecDeque::<RecordBatch>::new(),
            false,
            baseline,
        );
        let stream = futures::stream::try_unfold(
            state,
            |(mut input, mut buffer, mut ready, mut done, baseline)| async move {
                loop {
                    if let Some(batch) = ready.pop_front() {
                        let batch = batch.record_output(&baseline);
                        return Ok(Some((batch, (input, buffer, ready, done, baseline))));
                    }
                    if done {
                        return Ok(None);
                    }
                    match input.next().await {
                        Some(batch) => {
                            let batch = batch?;
                            let _timer = baseline.elapsed_compute().timer();
                            buffer.push(batch, &mut ready)?;
                        }
                        None => {
                            let _timer = baseline.elapsed_compute().timer();
                            buffer.finish(&mut ready)?;
                            done = true;
                        }
                    }
                }
            },
        );
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    crate::exec::metrics_of_field!();
}
