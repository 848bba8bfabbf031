//! [`ExactRetryExec`]: a cluster feed's epoch survives a lost executor with
//! exactly the batches of an uninterrupted run.
//!
//! ```text
//!  attempt 0: JobWatchExec(SharedJobExec "…-e3")  ── rows 0..k delivered ──▶ feed
//!       │ ExecutorLost (the watch saw an executor vanish and cancelled the
//!       │ job, or a result partition could not be fetched)
//!       ▼ executors left?  no ──▶ error naming the loss
//!  attempt 1: JobWatchExec(SharedJobExec "…-e3-retry1")
//!       │ skip its first k rows (the same rows: the result is a pure
//!       │ function of query, data, seed and epoch) ──▶ rows k.. ──▶ feed
//!       ▼ lost again ──▶ error: the same work failed twice
//! ```
//!
//! # Why the whole job again
//! Ballista 55's own recovery of a running stage stalled or duplicated rows
//! in our tests (see `watch.rs`), and a client cannot tell those outcomes
//! from a correct one while the job runs. A new job computes the same
//! result from scratch; what the rank already consumed is skipped by count,
//! which is exact because every batch is a pure function of (query, data,
//! seed, epoch) on any number of executors. The cost is re-running the
//! epoch's work up to the loss, bounded by the scheduler's
//! `--executor-timeout` to notice it plus one job's time.
//!
//! # Ordering, memory
//! Batches pass through unchanged; skipped rows are sliced off (no copy).

use std::fmt;
use std::sync::Arc;

use crate::exec::{BatchStream, Setting};
use datafusion::common::exec_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use futures::StreamExt;

use super::SchedulerAddress;
use super::watch::{executors, is_executor_lost};

/// Attempts after the first.
pub const MAX_RETRIES: u32 = 1;

/// Builds attempt `n` of the epoch's job.
pub type AttemptFactory = dyn Fn(u32) -> Result<Arc<dyn ExecutionPlan>> + Send + Sync;

/// Streams the epoch's cluster job and, when an executor is lost, runs the
/// job again and skips the rows already delivered, so the batches are those
/// of an uninterrupted run. Module docs: why the whole job, and the bounds.
pub struct ExactRetryExec {
    /// Attempt 0, built when planning (its schema and properties are ours).
    first: Arc<dyn ExecutionPlan>,
    /// Later attempts.
    attempts: Arc<AttemptFactory>,
    /// Asked whether any executor is left before retrying.
    scheduler: SchedulerAddress,
}

impl fmt::Debug for ExactRetryExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExactRetryExec")
            .field("first", &self.first)
            .field("scheduler", &self.scheduler)
            .finish()
    }
}

impl ExactRetryExec {
    /// Runs `attempts(0)`, and on a lost executor `attempts(1)` from where
    /// the first stopped.
    pub fn try_new(
        attempts: Arc<AttemptFactory>,
        scheduler: SchedulerAddress,
    ) -> Result<Self> {
        Ok(Self {
            first: attempts(0)?,
            attempts,
            scheduler,
        })
    }
}

impl DisplayAs for ExactRetryExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let retries: Setting = ("retries", &MAX_RETRIES);
        crate::exec::fmt_settings(f, t, "ExactRetryExec", &[retries])
    }
}

/// One execution's state.
struct Retrying {
    current: SendableRecordBatchStream,
    attempt: u32,
    /// Rows passed on so far.
    delivered: usize,
    /// Rows of the current attempt still to drop (delivered by an earlier one).
    skip: usize,
    attempts: Arc<AttemptFactory>,
    scheduler: SchedulerAddress,
    context: Arc<TaskContext>,
}

impl Retrying {
    /// The next batch to pass on, retrying on a lost executor.
    async fn next(&mut self) -> Option<Result<datafusion::arrow::array::RecordBatch>> {
        loop {
            match self.current.next().await? {
                Ok(batch) => {
                    let drop = self.skip.min(batch.num_rows());
                    self.skip -= drop;
                    if drop == batch.num_rows() {
                        continue;
                    }
                    let batch = batch.slice(drop, batch.num_rows() - drop);
                    self.delivered += batch.num_rows();
                    return Some(Ok(batch));
                }
                Err(e) if is_executor_lost(&e) => {
                    if let Err(e) = self.restart(e).await {
                        return Some(Err(e));
                    }
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// Starts the next attempt after `lost`, or says why it cannot.
    async fn restart(&mut self, lost: DataFusionError) -> Result<()> {
        if self.attempt >= MAX_RETRIES {
            return exec_err!(
                "the epoch's job failed on lost executors {} times; not retrying \
                 again. Last: {lost}",
                self.attempt + 1
            );
        }
        match executors(&self.scheduler).await {
            Ok(left) if left.is_empty() => {
                return exec_err!(
                    "no executor is left on {} to run the epoch again after: {lost}",
                    self.scheduler
                );
            }
            Ok(_) => {}
            Err(e) => {
                return exec_err!(
                    "cannot ask {} for executors to run the epoch again ({e}) after: {lost}",
                    self.scheduler
                );
            }
        }
        self.attempt += 1;
        log::warn!(
            "{lost}; running the epoch again as attempt {} and skipping the {} rows \
             already delivered",
            self.attempt,
            self.delivered
        );
        let plan = (self.attempts)(self.attempt)?;
        self.current = plan.execute(0, Arc::clone(&self.context))?;
        self.skip = self.delivered;
        Ok(())
    }
}

impl ExecutionPlan for ExactRetryExec {
    fn name(&self) -> &str {
        "ExactRetryExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.first.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.first]
    }

    crate::exec::no_expressions!();

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let first = crate::exec::single_child(self.name(), &children)?;
        Ok(Arc::new(Self {
            first,
            attempts: Arc::clone(&self.attempts),
            scheduler: self.scheduler.clone(),
        }))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let state = Retrying {
            current: self.first.execute(partition, Arc::clone(&ctx))?,
            attempt: 0,
            delivered: 0,
            skip: 0,
            attempts: Arc::clone(&self.attempts),
            scheduler: self.scheduler.clone(),
            context: ctx,
        };
        let stream = futures::stream::unfold(state, |mut state| async move {
            let item = state.next().await?;
            Some((item, state))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.first.schema(),
            stream,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

    use crate::test_util::first_int64s as ids;

    /// A plan yielding `ids` in batches of 3, failing with an executor loss
    /// after `fail_after` rows.
    #[derive(Debug)]
    struct Flaky {
        ids: Vec<i64>,
        fail_after: Option<usize>,
        properties: Arc<PlanProperties>,
    }

    impl Flaky {
        fn plan(
            ids: Vec<i64>,
            fail_after: Option<usize>,
        ) -> Result<Arc<dyn ExecutionPlan>> {
            let schema =
                Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
            let memory = MemorySourceConfig::try_new_exec(&[vec![]], schema, None)?;
            Ok(Arc::new(Self {
                ids,
                fail_after,
                properties: Arc::clone(memory.properties()),
            }))
        }
    }

    impl DisplayAs for Flaky {
        fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "Flaky")
        }
    }

    impl ExecutionPlan for Flaky {
        crate::exec::leaf!("Flaky");
        fn execute(
            &self,
            _partition: usize,
            _ctx: Arc<TaskContext>,
        ) -> Result<BatchStream> {
            let schema = self.schema();
            let mut items: Vec<Result<RecordBatch>> = vec![];
            for (i, chunk) in self.ids.chunks(3).enumerate() {
                if self.fail_after.is_some_and(|n| i * 3 >= n) {
                    items.push(Err(super::super::watch::ExecutorLost::error(
                        "executor x was lost".into(),
                    )));
                    break;
                }
                items.push(Ok(RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![Arc::new(Int64Array::from(chunk.to_vec()))],
                )?));
            }
            Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::iter(items),
            )))
        }
    }

    /// A later attempt drops exactly the rows the earlier ones delivered,
    /// across batch boundaries. (`restart` itself needs a scheduler: the
    /// whole path runs with real processes in tests/integration/cluster.rs.)
    #[tokio::test]
    async fn a_retry_continues_after_the_rows_already_delivered() -> Result<()> {
        let all: Vec<i64> = (0..10).collect();
        let attempts: Arc<AttemptFactory> = {
            let all = all.clone();
            Arc::new(move |attempt| Flaky::plan(all.clone(), (attempt == 0).then_some(6)))
        };
        let context = Arc::new(TaskContext::default());
        // Attempt 0 delivers 6 rows (two batches of 3), then loses its executor.
        let mut first = attempts(0)?.execute(0, Arc::clone(&context))?;
        let mut delivered = vec![];
        let lost = loop {
            match first.next().await.expect("an error ends attempt 0") {
                Ok(batch) => delivered.push(batch),
                Err(e) => break e,
            }
        };
        assert!(is_executor_lost(&lost), "{lost}");
        assert_eq!(ids(&delivered), all[..6]);
        // Attempt 1 from where it stopped; 7 rows skipped also cut a batch.
        for skip in [6usize, 7] {
            let mut state = Retrying {
                current: attempts(1)?.execute(0, Arc::clone(&context))?,
                attempt: 1,
                delivered: skip,
                skip,
                attempts: Arc::clone(&attempts),
                scheduler: SchedulerAddress::parse("df://127.0.0.1:1")?,
                context: Arc::clone(&context),
            };
            let mut rest = vec![];
            while let Some(batch) = state.next().await {
                rest.push(batch?);
            }
            assert_eq!(ids(&rest), all[skip..], "skip {skip}");
            assert_eq!(state.delivered, all.len());
        }
        Ok(())
    }
}
