//! [`LookaheadExec`]: the next epoch's plan, started while the current
//! epoch is consumed, so that an epoch boundary does not wait for the next
//! epoch's planning, scan and shuffle.
//!
//! ```text
//!  epoch e     DeviceSinkExec ◄── plan(e) ◄── the training loop takes batches
//!  epoch e+1   LookaheadExec::start(plan(e+1)), once epoch e's first batch
//!              is handed over:
//!                partition p: execute(p) ─► task ─► buffer (BUFFERED_BATCHES)
//!              … epoch e ends …                                  │
//!              DeviceSinkExec ◄── LookaheadExec::execute(p) ◄────┘
//! ```
//!
//! A global shuffle emits its first row only after its last input row is
//! keyed (see [`crate::shuffle`]): started here, epoch e+1's permutation
//! runs while the loop trains on epoch e, and its first batches wait in the
//! buffers when epoch e ends. It starts once epoch e's first batch is
//! handed over, not with epoch e: before, it would take the cores epoch e's
//! first batch waits for (measured: 0.26–0.32 s to the first batch became
//! 0.73–0.79 s on 2 cores). The producer starts it only where the next
//! epoch does not depend on the current one's end (see
//! `FeedPlan::looks_ahead_to`: not while the current epoch fills the cache
//! the next one reads); on a cluster it is the next epoch's job
//! (`SharedJobExec`), submitted or joined while this rank reads the current
//! one.
//!
//! # Ordering
//! Each partition's stream is the input's, replayed in order from its
//! buffer, so the sink's ordered read of the partitions (`crate::exec::
//! lanes`) sees what it would have read from the input itself.
//!
//! # Memory
//! The operators below reserve what they hold from the session's pool as
//! they always do (a shuffle's permutation, spilling beyond its share): the
//! look-ahead shares the one budget with the epoch being consumed, and runs
//! spill rather than exceed it. The buffered batches are reserved too, at
//! most [`BUFFERED_BATCHES`] per partition.
//!
//! # Error handling and cancellation
//! An error of partition `p` is delivered in its stream after the batches
//! before it, when the sink reads it: epoch e+1 fails where it would have
//! failed without the look-ahead. The tasks are `SpawnedTask`s owned by the
//! operator: dropping it (the feed stopped, epoch e failed) aborts them and
//! the streams they hold.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::arrow::array::RecordBatch;
use datafusion::common::internal_err;
use datafusion::common::runtime::SpawnedTask;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::spill::get_record_batch_memory_size;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::exec::BatchStream;

/// Record batches each partition's task holds ahead of the sink.
pub(super) const BUFFERED_BATCHES: usize = 2;

/// What one partition's task hands over: a batch (or the error that ended
/// the stream) and the bytes reserved for it.
type Buffered = (Result<RecordBatch>, usize);

/// A started plan whose partitions are read from buffers filled ahead; see
/// the module docs.
pub(super) struct LookaheadExec {
    /// The plan, executing since [`LookaheadExec::start`].
    input: Arc<dyn ExecutionPlan>,
    /// Per partition, what its task pulled: taken by that partition's one
    /// `execute`.
    buffers: Mutex<Vec<Option<mpsc::Receiver<Buffered>>>>,
    /// The reservation of the buffered batches.
    reserved: Arc<Mutex<MemoryReservation>>,
    /// The tasks pulling the partitions (aborted when dropped).
    tasks: Vec<SpawnedTask<()>>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for LookaheadExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LookaheadExec")
            .field("partitions", &self.tasks.len())
            .finish()
    }
}

impl LookaheadExec {
    /// Starts every partition of `input` in `ctx`, each pulled by a task of
    /// its own into a buffer of [`BUFFERED_BATCHES`].
    pub(super) fn start(
        input: Arc<dyn ExecutionPlan>,
        ctx: Arc<TaskContext>,
    ) -> Result<Self> {
        let partitions = input.output_partitioning().partition_count();
        let reserved = Arc::new(Mutex::new(
            MemoryConsumer::new("LookaheadExec buffers").register(ctx.memory_pool()),
        ));
        let mut buffers = Vec::with_capacity(partitions);
        let mut tasks = Vec::with_capacity(partitions);
        for partition in 0..partitions {
            let (sender, receiver) = mpsc::channel::<Buffered>(BUFFERED_BATCHES);
            let mut stream = input.execute(partition, Arc::clone(&ctx))?;
            let reserved = Arc::clone(&reserved);
            tasks.push(SpawnedTask::spawn(async move {
                while let Some(batch) = stream.next().await {
                    let bytes = batch.as_ref().map_or(0, get_record_batch_memory_size);
                    // Counted, not refused: at most BUFFERED_BATCHES of them.
                    reserved
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .grow(bytes);
                    let failed = batch.is_err();
                    if sender.send((batch, bytes)).await.is_err() || failed {
                        break; // the reader went away, or the stream ended
                    }
                }
            }));
            buffers.push(Some(receiver));
        }
        Ok(Self {
            input,
            buffers: Mutex::new(buffers),
            reserved,
            tasks,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for LookaheadExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        crate::exec::fmt_settings(
            f,
            t,
            "LookaheadExec",
            &[("buffered_batches", &BUFFERED_BATCHES)],
        )
    }
}

impl ExecutionPlan for LookaheadExec {
    crate::exec::one_input_operator! {
        name: "LookaheadExec",
        properties: passed_through,
        rebuild: |_this, _child| {
            internal_err!("a started LookaheadExec cannot be rebuilt over another input")
        },
    }

    fn execute(&self, partition: usize, _ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let taken = self
            .buffers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(partition)
            .and_then(Option::take);
        let Some(receiver) = taken else {
            return internal_err!(
                "LookaheadExec: partition {partition} is not one of its {} or was read \
                 already",
                self.tasks.len()
            );
        };
        let reserved = Arc::clone(&self.reserved);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let stream = futures::stream::unfold(receiver, |mut receiver| async move {
            let buffered = receiver.recv().await?;
            Some((buffered, receiver))
        })
        .map(move |(batch, bytes)| {
            reserved
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .shrink(bytes);
            let batch = batch?;
            baseline.record_output(batch.num_rows());
            Ok(batch)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            stream,
        )))
    }

    crate::exec::metrics_of_field!();
}

#[cfg(test)]
mod tests {
    use datafusion::physical_plan::collect;

    use super::*;

    #[tokio::test]
    async fn partitions_read_ahead_are_the_inputs_and_read_once() -> Result<()> {
        let session = crate::Session::try_new()?;
        let sql = "SELECT value FROM generate_series(1, 10000) ORDER BY value";
        let df = session.sql(sql).await?;
        let plan = df.clone().create_physical_plan().await?;
        let ctx = session.context().task_ctx();
        let expected = collect(Arc::clone(&plan), Arc::clone(&ctx)).await?;
        let ahead: Arc<dyn ExecutionPlan> = Arc::new(LookaheadExec::start(
            df.create_physical_plan().await?,
            Arc::clone(&ctx),
        )?);
        // The tasks run before anyone reads.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let read = collect(Arc::clone(&ahead), Arc::clone(&ctx)).await?;
        let values = crate::test_util::first_int64s;
        assert_eq!(values(&read), values(&expected));
        let again = ahead.execute(0, ctx).map(|_| ()).expect_err("read once");
        assert!(again.to_string().contains("read already"), "{again}");
        Ok(())
    }
}
