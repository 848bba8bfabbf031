//! [`SharedJobExec`]: one cluster job per feed epoch, `W` consumers.
//!
//! ```text
//!  rank 0 ──submit "sqlfeed-feed-<hash>-e<epoch>"──► scheduler ──► stages
//!  rank r ──find the job by that name (REST /api/jobs)──┘            │
//!    │                                                               ▼
//!    └── wait until it succeeds, stream its result ◄────────── executors
//!        (the global shuffle order, or the unshuffled lanes
//!        interleaved as the embedded feed does); keep this rank's batches
//! ```
//!
//! The scan, the functions, the keying and the sorted runs of `SHUFFLE` run
//! once per epoch on the cluster, whatever the number of ranks.
//! Because this reader keeps partition order, a job whose result is a global
//! shuffle under projections is planned with
//! `sqlfeed.ordered_result_partitions`: its final stage is one task per key
//! range (`crate::shuffle::RangeBucketExec`), not one task merging all.
//!
//! # Each rank fetches its own batches
//! When the feed batches by rows ([`crate::shuffle::Deal`]: batch size,
//! world, `drop_last`), such a job is also *dealt*: the executors route
//! every row to a partition of the rank whose batch it falls in
//! (`crate::shuffle::deal`, counts of every range travelling with the rows),
//! and rank `r` fetches only the partitions `j` with `j mod W = r`, in
//! order: about `1/W` of the epoch's bytes, and exactly the rows its
//! embedded batcher would keep. Other results (unshuffled lanes, token
//! budgets, a cache fill that needs every row) are fetched whole, and the
//! rank cuts its shard with the embedded feed's batcher; unshuffled lanes
//! are interleaved in turns of rows as the embedded sink does
//! (`crate::exec::lanes`), so either way a cluster rank's batches are
//! exactly an embedded rank's.
//!
//! Ballista 55 gives a task only its own partitions' locations and numbers
//! them from 0, so a range's task cannot learn the rows of the ranges
//! before it from the scheduler: they arrive as count rows in the data
//! (see `crate::shuffle::deal`). The deal's own exchange is re-sized to the
//! deal's partition count after DataFusion's distribution rule
//! (`crate::shuffle::KeepShuffleOrder`).
//!
//! The job name is a hash of what decides the rows (query, seed, epoch) and
//! the run id, so every rank of a
//! training run derives it alone: rank 0 submits, the others join. A rank
//! that finds an older job of the same name (a restarted run) reads it: it
//! holds the same rows. If its result is gone (removed after the
//! scheduler's `--job-data-ttl`, or once the ranks ahead read it, see
//! `crate::session::ReadJobs`), the rank runs the job again, as after a
//! lost executor.
//!
//! The job of a shuffled feed is first planned for unique rows, without the
//! stage that numbers repeated rows; where rows repeat it fails and the
//! epoch runs again with that stage. What a rank asks of the scheduler and
//! the executors — submit, find, wait, fetch, and that fallback — is
//! `request.rs`; this file is the operator and the job's settings.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ballista_core::extension::SessionConfigExt;
use ballista_core::serde::protobuf::KeyValuePair;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{internal_datafusion_err, internal_err};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use datafusion_proto::logical_plan::AsLogicalPlan;
use datafusion_proto::protobuf::LogicalPlanNode;
use futures::{StreamExt, TryStreamExt};

use super::SchedulerAddress;

mod request;
use crate::exec::BatchStream;
use request::{Fetched, JobRequest};

/// The settings a job is submitted with: DataFusion's, Ballista's and
/// sqlfeed's, each under its prefix (`SqlfeedOptions` and the feed's epoch,
/// `sqlfeed_udfs::augment`, list theirs under their full names). An entry
/// without a prefix is an extension's that lists its entries bare, which
/// the scheduler could not set.
fn settings(config: &datafusion::prelude::SessionConfig) -> Vec<KeyValuePair> {
    config
        .options()
        .entries()
        .into_iter()
        .filter(|entry| entry.key.contains('.'))
        .filter_map(|entry| {
            entry.value.map(|value| KeyValuePair {
                key: entry.key,
                value: Some(value),
            })
        })
        .collect()
}

/// Whether `plan` is a global `SHUFFLE` under nothing but projections,
/// whose per-partition order survives up to the result; `through_cache_write`
/// lets an executor-cache write (in order, one row for one) stand between.
fn shuffle_under_projections(plan: &LogicalPlan, through_cache_write: bool) -> bool {
    match plan {
        LogicalPlan::Projection(projection) => {
            shuffle_under_projections(&projection.input, through_cache_write)
        }
        LogicalPlan::Extension(extension) => {
            let node = extension.node.as_any();
            if node.is::<crate::cache::shared::SharedEntryWriteNode>() {
                through_cache_write
                    && extension
                        .node
                        .inputs()
                        .first()
                        .is_some_and(|input| shuffle_under_projections(input, true))
            } else {
                // A window's job (a windowed feed's) is a global shuffle of
                // that window's rows; a shuffle by position is keyed and cut
                // in key ranges as a global one is (an epoch read from the
                // epoch cache, keyed by its stored order, runs here).
                node.downcast_ref::<crate::shuffle::ShuffleNode>()
                    .is_some_and(|shuffle| {
                        matches!(
                            shuffle.spec(),
                            crate::shuffle::ShuffleSpec::Global { .. }
                                | crate::shuffle::ShuffleSpec::Windowed {
                                    only_window: Some(_),
                                    ..
                                }
                        ) || (matches!(
                            shuffle.spec(),
                            crate::shuffle::ShuffleSpec::Positional { .. }
                        ) && !matches!(
                            shuffle.key(),
                            crate::shuffle::ShuffleKey::StoredOrder(_)
                        ))
                    })
            }
        }
        _ => false,
    }
}

/// How a job is dealt to the ranks: the deal and, for a window's job, the
/// store its pad partitions go to (`crate::session::DeferredPads`).
pub struct JobDeal {
    /// The feed's batching (and a window job's place in its epoch).
    pub deal: crate::shuffle::Deal,
    /// Where a window job's pads wait for the epoch's end.
    pub pads: Option<Arc<crate::session::DeferredPads>>,
}

/// One rank's view of the epoch's cluster job: rank 0 submits it, the
/// others find it by name, and each streams the result partitions it needs
/// (its own, when the job is dealt). Module docs: naming, dealing, order.
pub struct SharedJobExec {
    /// What each execution asks of the cluster.
    request: Arc<JobRequest>,
    properties: Arc<PlanProperties>,
    /// Rows, bytes and partitions this rank fetched.
    metrics: ExecutionPlanMetricsSet,
    /// Told what it asks once the job succeeded.
    reports: Reports,
}

/// Who is told what of the job once it succeeded.
#[derive(Debug, Clone, Default)]
struct Reports {
    /// The job's name and rows.
    completed: Option<CompletedJob>,
    /// The rows each source of the job's mixture, of these names, gave.
    mixture: Option<(Vec<String>, JobMixture)>,
    /// Told the job's window once this rank read it to the end; the jobs
    /// it no longer keeps have their results removed.
    read: Option<ReadWindow>,
}

/// Where a [`SharedJobExec`] reports the job it read once the job
/// succeeded: its name (with a retry's suffix) and its result's rows.
pub use crate::session::CompletedJob;
use crate::session::{JobMixture, ReadWindow};

impl fmt::Debug for SharedJobExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedJobExec")
            .field("scheduler", &self.request.scheduler)
            .field("job_name", &self.request.job_name)
            .field("rank", &self.request.rank)
            .finish()
    }
}

/// The epoch's job of a feed run, as every rank names it.
#[derive(Debug, Clone)]
pub struct RunJob {
    /// The job's name: the same on every rank of the run.
    pub name: String,
    /// Set once a job of the run met repeated rows, shared by the run's
    /// epochs: they plan the copy stage at once (`crate::shuffle::unique`).
    pub rows_repeat: Arc<AtomicBool>,
}

impl SharedJobExec {
    /// Reads the result of the job named `job.name` running `plan`, which
    /// rank 0 submits and the other ranks join.
    ///
    /// `attempt` 0 is the epoch's job; a later attempt (after an executor
    /// was lost, see [`super::ExactRetryExec`]) is a job named
    /// `<job_name>-retry<attempt>` that any rank submits if it finds none.
    pub fn try_new(
        state: &SessionState,
        plan: &LogicalPlan,
        scheduler: SchedulerAddress,
        job: RunJob,
        rank: usize,
        attempt: u32,
        dealt: Option<JobDeal>,
    ) -> Result<Self> {
        let RunJob {
            name: job_name,
            rows_repeat,
        } = job;
        let (deal, pads) = match dealt {
            Some(JobDeal { deal, pads }) => (Some(deal), pads),
            None => (None, None),
        };
        if deal.is_some() && !Self::can_deal(plan) {
            return internal_err!(
                "only a job whose result is a global SHUFFLE under projections can be \
                 dealt to ranks"
            );
        }
        let job_name = if attempt == 0 {
            job_name
        } else {
            format!("{job_name}-retry{attempt}")
        };
        let mut config = state.config().clone().with_ballista_job_name(&job_name);
        // This reader streams the result partitions in partition order, so
        // a global shuffle right under the result may end in one task per
        // key range instead of one merging task (`crate::shuffle::range`).
        if shuffle_under_projections(plan, true)
            && let Some(options) = config
                .options_mut()
                .extensions
                .get_mut::<crate::config::SqlfeedOptions>()
        {
            options.ordered_result_partitions = true;
            // Each rank's batches in partitions of their own, so that it
            // fetches only those (`crate::shuffle::deal`).
            if let Some(deal) = deal {
                options.deal_world = deal.world;
                options.deal_batch_rows = deal.batch_rows;
                options.deal_drop_last = deal.drop_last;
                if let Some(span) = deal.span {
                    options.deal_epoch_offset = span.offset;
                    options.deal_window_rows = span.window_rows;
                    options.deal_epoch_rows = span.rows;
                }
            }
        }
        // A window job's pad partitions, after its `ranges × W` partitions
        // of data, wait for the epoch's end (`DeferredPads`); only a window
        // holding some of the epoch's first `W − 1` rows has any.
        let deferred_pads = match (deal, pads) {
            (Some(deal), Some(pads)) if let Some(span) = deal.span => {
                let first = deal.world * config.target_partitions();
                let first = u32::try_from(first).map_err(|_| {
                    internal_datafusion_err!("{first} result partitions of a window job")
                })?;
                let holds_head = span.offset < deal.world as u64 - 1;
                Some((first, holds_head.then_some(pads)))
            }
            _ => None,
        };
        let codec = config.ballista_logical_extension_codec();
        let node = LogicalPlanNode::try_from_logical_plan(plan, codec.as_ref())?;
        let mut buf = vec![];
        node.try_encode(&mut buf)?;
        // The epoch's job is first planned for unique rows (one exchange
        // fewer), unless a job of this run met repeated rows; a retry after
        // a lost executor keeps the copy stage. Not through an executor
        // cache write, whose folder is named by the job that completes.
        // The settings plan the copy stage; `submit` sets the key per job.
        let try_unique_rows = attempt == 0
            && shuffle_under_projections(plan, false)
            && config
                .options()
                .extensions
                .get::<crate::config::SqlfeedOptions>()
                .is_some_and(|o| o.try_unique_rows || o.assume_unique_rows);
        if let Some(options) = config
            .options_mut()
            .extensions
            .get_mut::<crate::config::SqlfeedOptions>()
        {
            options.assume_unique_rows = false;
        }
        let settings = settings(&config);
        // A shuffle's result is its partitions in turn; any other result's
        // partitions are lanes, read like the embedded sink reads them.
        let lane_turn_rows =
            (!shuffle_under_projections(plan, true)).then(|| config.batch_size());
        let mut schema: SchemaRef = Arc::clone(plan.schema().inner());
        if crate::config::SqlfeedOptions::of(config.options()).isolate_row_errors {
            // The scheduler's plan marks failing rows in an extra column
            // (`crate::sql::IsolateRowErrors`): the result's schema.
            schema = crate::sql::isolating_schema(&schema);
        }
        let properties = crate::exec::one_bounded_partition(
            Arc::clone(&schema),
            EmissionType::Incremental,
        );
        let request = JobRequest {
            scheduler,
            plan: buf,
            settings,
            try_unique_rows,
            rows_repeat,
            session_id: state.session_id().to_string(),
            job_name,
            rank,
            attempt,
            max_message_size: config.ballista_grpc_client_max_message_size(),
            prefer_flight: config.ballista_shuffle_reader_remote_prefer_flight(),
            job_id: Mutex::new(None),
            schema,
            lane_turn_rows,
            deal_world: deal.map(|d| d.world),
            deferred_pads,
        };
        Ok(Self {
            request: Arc::new(request),
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            reports: Reports::default(),
        })
    }

    /// Reports the job into `completed` once it succeeded (an executor
    /// cache's commit names the folder of the attempt that completed).
    pub fn reporting_completion(mut self, completed: CompletedJob) -> Self {
        self.reports.completed = Some(completed);
        self
    }

    /// Reports into `rows` the rows each source of the job's mixture,
    /// whose sources are `names`, gave, once the job succeeded (read from
    /// the scheduler's plan of the job: each source gave its take).
    pub fn reporting_mixture(mut self, names: Vec<String>, rows: JobMixture) -> Self {
        self.reports.mixture = Some((names, rows));
        self
    }

    /// Tells `read`'s queue the job's window once this rank read its result
    /// to the end, and removes the results of the jobs the queue no longer
    /// keeps from the executors (a windowed feed's earlier windows).
    pub fn releasing(mut self, read: ReadWindow) -> Self {
        self.reports.read = Some(read);
        self
    }

    /// Whether a job of `plan` can be dealt to ranks on the executors: its
    /// result is a global `SHUFFLE` under projections (which keep rows 1:1,
    /// so dealing below them deals the result).
    pub fn can_deal(plan: &LogicalPlan) -> bool {
        // Not through an executor-cache write: every row must pass the
        // writing tasks once.
        shuffle_under_projections(plan, false)
    }

    /// The job this rank reads, once known.
    pub fn job_id(&self) -> Option<String> {
        self.request.job_id.lock().ok().and_then(|id| id.clone())
    }
}

impl DisplayAs for SharedJobExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let JobRequest {
            job_name,
            rank,
            scheduler,
            deal_world,
            ..
        } = self.request.as_ref();
        match t {
            DisplayFormatType::TreeRender => {
                write!(f, "job={job_name}\nrank={rank}\nscheduler={scheduler}")?;
                if let Some(world) = deal_world {
                    write!(f, "\ndealt_to={world}")?;
                }
            }
            _ => {
                write!(
                    f,
                    "SharedJobExec: job={job_name}, rank={rank}, scheduler={scheduler}"
                )?;
                if let Some(world) = deal_world {
                    write!(f, ", dealt_to={world}")?;
                }
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for SharedJobExec {
    crate::exec::leaf!("SharedJobExec");

    fn execute(&self, partition: usize, _ctx: Arc<TaskContext>) -> Result<BatchStream> {
        crate::exec::only_partition("SharedJobExec", partition)?;
        let job = Arc::clone(&self.request);
        let fetched = Fetched {
            rows: MetricBuilder::new(&self.metrics).counter("fetched_rows", partition),
            bytes: MetricBuilder::new(&self.metrics).counter("fetched_bytes", partition),
            partitions: MetricBuilder::new(&self.metrics)
                .counter("fetched_partitions", partition),
        };
        let reports = self.reports.clone();
        let read = reports.read.clone();
        let released = Arc::clone(&job);
        let stream =
            futures::stream::once(async move { job.run(&fetched, &reports).await })
                .try_flatten();
        // Read to the end without an error: the jobs read before it that
        // are no longer kept go. A stream that failed is not read to its
        // end (a retry reads its rows from another job).
        let failed = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&failed);
        let stream = stream
            .inspect_err(move |_| seen.store(true, Ordering::Relaxed))
            .chain(
                futures::stream::once(async move {
                    if let Some(read) = read
                        && !failed.load(Ordering::Relaxed)
                    {
                        released.release(&read).await;
                    }
                    None
                })
                .filter_map(futures::future::ready),
            );
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    crate::exec::metrics_of_field!();
}
