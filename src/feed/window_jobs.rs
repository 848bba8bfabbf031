//! [`WindowJobsExec`]: a windowed shuffle's epoch on a cluster, as one job
//! per window, the next one submitted while the current one is read.
//!
//! ```text
//!  window 0's job plan ─┐
//!  window 1's job plan ─┼─ made in turn (job(k)); each ExactRetryExec →
//!  …                    │  SharedJobExec: submitted (rank 0) or joined by
//!  window K-1's         ─┘  name, completed, its partitions fetched in order
//!        │
//!        ▼ crate::exec::sequence: window k read while k+1 runs
//!  one stream: window 0's rows, then window 1's, …
//! ```
//!
//! Each job shuffles exactly the rows of its window (`SHUFFLE WINDOW` with
//! `only_window`, its scan cut by `WindowScanExec` on the executors), so
//! the stream is the embedded engine's windowed order.
//!
//! # Disk
//! A job's result is one window. Ballista removes a completed job's
//! intermediate stages at once; each window's result is removed once this
//! rank read `sqlfeed.window_jobs_kept` more windows (`ReadJobs`, told by
//! the job's `SharedJobExec`), so the executors' disks hold a few windows,
//! not the epoch. A rank further behind, or one that lost an executor,
//! runs that window's job again and skips the rows already read
//! (`ExactRetryExec`).
//!
//! # Dealt
//! When the feed batches by rows, each window's job is dealt to ranks on
//! the executors like an epoch's (`crate::shuffle::deal`): the window's
//! rows are rows `offset..` of the epoch, counted when the epoch is planned
//! (from the footers; with a filter, from the rows it keeps per row group,
//! counted once per run reading the filter's columns only), so each rank
//! fetches only its own batches. The copies of the epoch's first rows that
//! pad its last step come from the first windows' jobs and are read after
//! the last window (`crate::session::DeferredPads`).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};

use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};

use crate::exec::lanes::ordered_partitions;
use crate::exec::sequence::in_sequence;
use crate::exec::{BatchStream, PlanNode, Setting};
use crate::shuffle::WINDOWS_AHEAD;

/// Makes window `k`'s job plan (k ≥ 1; window 0's is made when planning).
pub(super) type WindowJob = Arc<dyn Fn(usize) -> Result<PlanNode> + Send + Sync>;

/// A cluster epoch of `windows` jobs, read in order; module docs.
pub(super) struct WindowJobsExec {
    /// Window 0's job (its schema is the epoch's).
    first: PlanNode,
    /// Windows in the epoch (at least 1).
    windows: usize,
    job: WindowJob,
    /// A dealt epoch's pad rows, read after the last window.
    pads: Option<PlanNode>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl fmt::Debug for WindowJobsExec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("WindowJobsExec")
            .field("windows", &self.windows)
            .finish_non_exhaustive()
    }
}

impl WindowJobsExec {
    /// The epoch of `windows` windows: `first` and then `job(1)` …, then
    /// `pads` if given.
    pub(super) fn new(
        first: PlanNode,
        windows: usize,
        job: WindowJob,
        pads: Option<PlanNode>,
    ) -> Self {
        let schema: SchemaRef = first.schema();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            first,
            windows: windows.max(1),
            job,
            pads,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for WindowJobsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let settings: [Setting; 1] = [("windows", &self.windows)];
        crate::exec::fmt_settings(f, t, "WindowJobsExec", &settings)
    }
}

impl ExecutionPlan for WindowJobsExec {
    crate::exec::name_and_properties!("WindowJobsExec");

    // Window 0's job; the later ones are made when their turn comes.
    fn children(&self) -> Vec<&PlanNode> {
        vec![&self.first]
    }

    crate::exec::no_expressions!();

    fn with_new_children(self: Arc<Self>, children: Vec<PlanNode>) -> Result<PlanNode> {
        let first = crate::exec::single_child(self.name(), &children)?;
        Ok(Arc::new(Self::new(
            first,
            self.windows,
            Arc::clone(&self.job),
            self.pads.clone(),
        )))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        crate::exec::only_partition("WindowJobsExec", partition)?;
        let started = MetricBuilder::new(&self.metrics).counter("window_jobs", 0);
        let wait = MetricBuilder::new(&self.metrics).subset_time("window_wait", 0);
        let (first, job) = (Arc::clone(&self.first), Arc::clone(&self.job));
        let turn_rows = ctx.session_config().batch_size();
        let pads_ctx = Arc::clone(&ctx);
        let streams = (0..self.windows).map(move |window| {
            started.add(1);
            let plan = match window {
                0 => Arc::clone(&first),
                k => job(k)?,
            };
            ordered_partitions(&plan, Arc::clone(&ctx), turn_rows)
        });
        let windows = in_sequence(self.schema(), streams, WINDOWS_AHEAD, Some(wait));
        let Some(pads) = &self.pads else {
            return Ok(windows);
        };
        // Read once every window was read to its end: each put its pads.
        let (pads, pads_ctx) = (Arc::clone(pads), Arc::clone(&pads_ctx));
        let after =
            futures::stream::once(async move { pads.execute(0, pads_ctx) }).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            windows.chain(after),
        )))
    }

    crate::exec::metrics_of_field!();
}
