//! [`CacheFillExec`]: passes its input through unchanged and writes every
//! batch into a cache entry on the way — a feed's first epoch fills the
//! epoch cache with the rows it streams anyway, instead of the query running
//! a second time beside it.
//!
//! ```text
//!            consumer (a feed's sink)
//!                 ▲ batch b (the same arrays, not copied)
//!  ┌──────────────┴──────────────┐
//!  │ CacheFillExec partition p   │──clone of b──▶ PartitionWriter p ──▶ part files
//!  └──────────────▲──────────────┘   (bounded channel to a blocking writer thread;
//!                 │                   a slow disk slows the stream, never grows memory)
//!            input partition p
//!  input partition p ends ──▶ its parts are finished (footer, sync); the
//!  entry is committed by whoever planned the fill once every partition ended
//!  (`CacheStore::finish_fill`)
//! ```
//!
//! # Partitioning and ordering
//! The same as the input's: batches pass through in order, unchanged.
//! Input partition `p` writes parts `p, p+P, …` (see `fill.rs`): with
//! `parts == P` part `p` holds exactly partition `p`'s rows in order, so a
//! scan of the entry gives an unshuffled consumer the same streams again.
//!
//! # Memory
//! The entry keeps an in-memory prefix of each part while the cache's memory
//! share lasts (reserved from the session's pool); beyond that, at most
//! `WRITE_AHEAD` batches per partition wait for the writer thread.
//!
//! # Failure
//! A write error (a full disk) fails the stream with the error naming the
//! file. A consumer that stops early leaves the entry incomplete: it is not
//! committed, and its files go with the fill.

use std::fmt;
use std::sync::Arc;

use crate::exec::{BatchStream, Setting};
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
};
use futures::StreamExt;

use super::fill::{EntryFill, Layout, PartitionWriter};

/// Writes its input into a cache entry while passing it through; see the
/// module docs.
#[derive(Debug)]
pub struct CacheFillExec {
    /// The rows passed through and written.
    input: Arc<dyn ExecutionPlan>,
    /// The entry they are written into.
    fill: Arc<EntryFill>,
    /// Parts of the entry (at least the input's partitions).
    parts: usize,
    /// Rows passed, bytes written, time spent queueing writes.
    metrics: ExecutionPlanMetricsSet,
}

impl CacheFillExec {
    /// Fills `fill` with `input`'s partitions, spread over `parts` part
    /// files (raised to the input's partition count).
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        fill: Arc<EntryFill>,
        parts: usize,
    ) -> Result<Self> {
        let inputs = input.output_partitioning().partition_count();
        let parts = parts.max(inputs).max(1);
        fill.set_layout(Layout {
            inputs,
            parts,
            schema: input.schema(),
        })?;
        Ok(Self {
            input,
            fill,
            parts,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for CacheFillExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let key = &self.fill.key_hex()[..12.min(self.fill.key_hex().len())];
        let settings: [Setting; 2] = [("key", &key), ("parts", &self.parts)];
        crate::exec::fmt_settings(f, t, "CacheFillExec", &settings)
    }
}

impl ExecutionPlan for CacheFillExec {
    crate::exec::one_input_operator! {
        name: "CacheFillExec",
        properties: passed_through,
        rebuild: |this, child| Self::try_new(child, Arc::clone(&this.fill), this.parts),
    }

    crate::exec::keeps_input_order!();

    // A tee: its input's rows.
    crate::exec::statistics_of_one_input!(first_input_statistics);

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let writer = self.fill.partition(partition)?;
        let input = self.input.execute(partition, ctx)?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let written_bytes =
            MetricBuilder::new(&self.metrics).counter("written_bytes", partition);
        let state = TeeState {
            input,
            writer: Some(writer),
            baseline,
            written_bytes,
        };
        let stream = futures::stream::unfold(Some(state), |state| async move {
            let mut state = state?;
            match state.input.next().await {
                Some(Ok(batch)) => {
                    if let Some(writer) = state.writer.as_mut() {
                        let _timer = state.baseline.elapsed_compute().timer();
                        if let Err(e) = writer.write(&batch).await {
                            return Some((Err(e), None));
                        }
                        state.written_bytes.add(batch.get_array_memory_size());
                    }
                    state.baseline.record_output(batch.num_rows());
                    Some((Ok(batch), Some(state)))
                }
                Some(Err(e)) => Some((Err(e), None)),
                None => {
                    let writer = state.writer.take()?;
                    match writer.finish().await {
                        Ok(()) => None,
                        Err(e) => Some((Err(e), None)),
                    }
                }
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            stream,
        )))
    }

    crate::exec::metrics_of_field!();
}

/// One partition's stream state.
struct TeeState {
    /// The input partition's stream.
    input: SendableRecordBatchStream,
    /// `None` once finished.
    writer: Option<PartitionWriter>,
    /// Rows passed; `elapsed_compute` includes waiting for the writer
    /// thread when it is behind (the disk is the bottleneck then).
    baseline: BaselineMetrics,
    /// Arrow bytes handed to the writer.
    written_bytes: Count,
}
