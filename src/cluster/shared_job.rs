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
//! holds the same rows, and if its files are gone the rank waits for a newer
//! one.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ballista_core::client::BallistaClient;
use ballista_core::extension::SessionConfigExt;
use ballista_core::serde::protobuf::execute_query_params::Query;
use ballista_core::serde::protobuf::execute_query_result;
use ballista_core::serde::protobuf::job_status::Status;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::{
    ExecuteQueryParams, GetJobStatusParams, KeyValuePair, PartitionLocation,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::exec_datafusion_err;
use datafusion::common::internal_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning};
use datafusion::physical_plan::common::spawn_buffered;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use datafusion_proto::logical_plan::AsLogicalPlan;
use datafusion_proto::protobuf::LogicalPlanNode;
use futures::{StreamExt, TryStreamExt};

use super::SchedulerAddress;
use super::watch::{ExecutorLost, rest_get};

/// The settings a job is submitted with: DataFusion's and Ballista's, and
/// sqlfeed's under their `sqlfeed.` prefix (DataFusion lists an extension's
/// entries without its prefix, and the scheduler ignores keys it cannot
/// set, so `SET sqlfeed.…` did not reach it).
fn settings(config: &datafusion::prelude::SessionConfig) -> Vec<KeyValuePair> {
    use datafusion::config::{ConfigExtension, ExtensionOptions};
    let pair = |key: String, value: Option<String>| {
        value.map(|value| KeyValuePair {
            key,
            value: Some(value),
        })
    };
    let mut settings: Vec<KeyValuePair> = config
        .options()
        .entries()
        .into_iter()
        // Unprefixed keys are extensions' entries.
        .filter(|entry| entry.key.contains('.'))
        .filter_map(|entry| pair(entry.key, entry.value))
        .collect();
    if let Some(options) = config
        .options()
        .extensions
        .get::<crate::config::SqlfeedOptions>()
    {
        let prefix = crate::config::SqlfeedOptions::PREFIX;
        settings.extend(
            options
                .entries()
                .into_iter()
                .filter_map(|entry| pair(format!("{prefix}.{}", entry.key), entry.value)),
        );
    }
    settings
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
                node.downcast_ref::<crate::shuffle::ShuffleNode>()
                    .is_some_and(|shuffle| {
                        matches!(
                            shuffle.spec(),
                            crate::shuffle::ShuffleSpec::Global { .. }
                        )
                    })
            }
        }
        _ => false,
    }
}

/// Whether `error` is a job's failure on repeated rows in a shuffle planned
/// for unique rows.
fn is_repeated_rows(error: &DataFusionError) -> bool {
    error.to_string().contains(crate::shuffle::REPEATED_ROWS)
}

/// How long a rank other than 0 waits for rank 0's job to appear.
const JOIN_TIMEOUT: Duration = Duration::from_secs(600);

/// One rank's view of the epoch's cluster job: rank 0 submits it, the
/// others find it by name, and each streams the result partitions it needs
/// (its own, when the job is dealt). Module docs: naming, dealing, order.
pub struct SharedJobExec {
    /// What each execution asks of the cluster.
    request: Arc<JobRequest>,
    properties: Arc<PlanProperties>,
    /// Rows, bytes and partitions this rank fetched.
    metrics: ExecutionPlanMetricsSet,
    /// Told the job's name and rows once it succeeded.
    completed: Option<CompletedJob>,
}

/// Where a [`SharedJobExec`] reports the job it read once the job
/// succeeded: its name (with a retry's suffix) and its result's rows.
pub use crate::session::CompletedJob;

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
        deal: Option<crate::shuffle::Deal>,
    ) -> Result<Self> {
        let RunJob {
            name: job_name,
            rows_repeat,
        } = job;
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
            }
        }
        let codec = config.ballista_logical_extension_codec();
        let node = LogicalPlanNode::try_from_logical_plan(plan, codec.as_ref())?;
        let mut buf = vec![];
        node.try_encode(&mut buf)?;
        // The epoch's job is first planned for unique rows (one exchange
        // fewer), unless a job of this run met repeated rows; a retry after
        // a lost executor keeps the copy stage. Not through an executor
        // cache write, whose folder is named by the job that completes.
        let mut unique_settings = None;
        if let Some(options) = config
            .options_mut()
            .extensions
            .get_mut::<crate::config::SqlfeedOptions>()
        {
            let try_unique = options.try_unique_rows || options.assume_unique_rows;
            options.assume_unique_rows = true;
            if try_unique && attempt == 0 && shuffle_under_projections(plan, false) {
                unique_settings = Some(self::settings(&config));
            }
        }
        if let Some(options) = config
            .options_mut()
            .extensions
            .get_mut::<crate::config::SqlfeedOptions>()
        {
            // The fallback always numbers repeated rows.
            options.assume_unique_rows = false;
        }
        let settings = settings(&config);
        // A shuffle's result is its partitions in turn; any other result's
        // partitions are lanes, read like the embedded sink reads them.
        let lane_turn_rows =
            (!shuffle_under_projections(plan, true)).then(|| config.batch_size());
        let schema: SchemaRef = Arc::clone(plan.schema().inner());
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        let request = JobRequest {
            scheduler,
            plan: buf,
            settings,
            unique_settings,
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
        };
        Ok(Self {
            request: Arc::new(request),
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            completed: None,
        })
    }

    /// Reports the job into `completed` once it succeeded (an executor
    /// cache's commit names the folder of the attempt that completed).
    pub fn reporting_completion(mut self, completed: CompletedJob) -> Self {
        self.completed = Some(completed);
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

/// The bytes of `batch`'s values (not of the buffers' spare capacity).
fn data_bytes(batch: &datafusion::arrow::array::RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|column| column.to_data().get_slice_memory_size().unwrap_or(0))
        .sum()
}

/// What a rank fetched from the executors (its metrics).
#[derive(Clone)]
struct Fetched {
    rows: Count,
    /// Bytes of the fetched values (Arrow data, as sent).
    bytes: Count,
    partitions: Count,
}

impl ExecutionPlan for SharedJobExec {
    fn name(&self) -> &str {
        "SharedJobExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    crate::exec::no_expressions!();

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return internal_err!(
                "SharedJobExec has one partition, asked for {partition}"
            );
        }
        let job = Arc::clone(&self.request);
        let fetched = Fetched {
            rows: MetricBuilder::new(&self.metrics).counter("fetched_rows", partition),
            bytes: MetricBuilder::new(&self.metrics).counter("fetched_bytes", partition),
            partitions: MetricBuilder::new(&self.metrics)
                .counter("fetched_partitions", partition),
        };
        let completed = self.completed.clone();
        let stream =
            futures::stream::once(
                async move { job.run(&fetched, completed.as_ref()).await },
            )
            .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// What one rank's epoch needs from the cluster.
struct JobRequest {
    scheduler: SchedulerAddress,
    /// The encoded logical plan.
    plan: Vec<u8>,
    /// Settings of the job planned with the stage that numbers repeated
    /// rows.
    settings: Vec<KeyValuePair>,
    /// Settings of the job planned for unique rows, tried first where the
    /// result is a shuffle's key ranges (`crate::shuffle::REPEATED_ROWS`).
    unique_settings: Option<Vec<KeyValuePair>>,
    /// Set once a job of this run met repeated rows (shared by the run's
    /// epochs): the copy stage is then planned at once.
    rows_repeat: Arc<AtomicBool>,
    session_id: String,
    job_name: String,
    rank: usize,
    /// 0, or the retry this job is (then any rank may submit it).
    attempt: u32,
    max_message_size: usize,
    /// Fetch result partitions as Flight data (the executor decodes its
    /// file and encodes every batch again) instead of the file's bytes
    /// (Ballista's block transport, decoded here once): the session's
    /// `ballista.shuffle.remote_read_prefer_flight`, false by default.
    prefer_flight: bool,
    /// The job this rank reads, once known (for the lost-executor guard).
    job_id: Mutex<Option<String>>,
    schema: SchemaRef,
    /// `None`: the result partitions in turn (a shuffle's key ranges);
    /// `Some(T)`: unshuffled lanes, interleaved in turns of `T` rows
    /// (`crate::exec::lanes`), as the embedded feed reads its partitions.
    lane_turn_rows: Option<usize>,
    /// Set when the job deals its rows to `W` ranks: this rank reads the
    /// partitions `j` with `j mod W = rank` only.
    deal_world: Option<usize>,
}

impl JobRequest {
    fn error(&self, what: impl fmt::Display) -> DataFusionError {
        exec_datafusion_err!(
            "rank {} of feed job '{}' on {}: {what}",
            self.rank,
            self.job_name,
            self.scheduler
        )
    }

    async fn client(&self) -> Result<SchedulerGrpcClient<tonic::transport::Channel>> {
        Ok(SchedulerGrpcClient::connect(self.scheduler.grpc_url())
            .await
            .map_err(|e| self.error(format!("cannot connect: {e}")))?
            .max_decoding_message_size(self.max_message_size)
            .max_encoding_message_size(self.max_message_size))
    }

    async fn run(
        &self,
        fetched: &Fetched,
        completed: Option<&CompletedJob>,
    ) -> Result<SendableRecordBatchStream> {
        if self.attempt > 0 {
            // A retry: every rank noticed the loss on its own, and rank 0
            // may have finished the epoch before it; whoever finds no job
            // of this name submits one (two submissions hold the same rows).
            let job_id = match self.find(&HashSet::new()).await? {
                Some((job_id, _)) => job_id,
                None => self.submit(&self.job_name, &self.settings).await?,
            };
            self.remember(&job_id);
            let locations = self.wait(&job_id, &self.job_name, completed).await?;
            return self.fetch(locations, fetched).await;
        }
        if self.rank == 0 {
            if let Some(unique) = self.unique_settings() {
                let job_id = self.submit(&self.job_name, unique).await?;
                self.remember(&job_id);
                match self.wait(&job_id, &self.job_name, completed).await {
                    Ok(locations) => return self.fetch(locations, fetched).await,
                    Err(e) if is_repeated_rows(&e) => {
                        log::info!(
                            "{}",
                            self.error(
                                "rows repeat; running the epoch with the copy stage"
                            )
                        );
                        self.rows_repeat.store(true, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e),
                }
            }
            let name = self.copy_stage_name();
            let job_id = self.submit(&name, &self.settings).await?;
            self.remember(&job_id);
            let locations = self.wait(&job_id, &name, completed).await?;
            return self.fetch(locations, fetched).await;
        }
        // Other ranks join rank 0's job; a stale job of the same name whose
        // files are gone is skipped, and so is a job planned for unique rows
        // that met repeated ones (rank 0 submits the copy stage's job next).
        let deadline = Instant::now() + JOIN_TIMEOUT;
        let mut tried = HashSet::new();
        loop {
            if let Some((job_id, name)) = self.find(&tried).await? {
                self.remember(&job_id);
                let attempt = async {
                    let locations = self.wait(&job_id, &name, completed).await?;
                    self.fetch(locations, fetched).await
                };
                match attempt.await {
                    Ok(stream) => return Ok(stream),
                    Err(e) if is_repeated_rows(&e) => {
                        self.rows_repeat.store(true, Ordering::Relaxed);
                        tried.insert(job_id);
                    }
                    Err(e) => {
                        log::warn!(
                            "{}",
                            self.error(format!("job {job_id}: {e}; looking for another"))
                        );
                        tried.insert(job_id);
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(self.error(format!(
                    "no usable job of this name appeared within {JOIN_TIMEOUT:?}; is rank 0 \
                     running the same query with the same seed and run id?"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The settings of a job planned for unique rows, unless the plan does
    /// not allow it or rows of this run repeated.
    fn unique_settings(&self) -> Option<&Vec<KeyValuePair>> {
        self.unique_settings
            .as_ref()
            .filter(|_| !self.rows_repeat.load(Ordering::Relaxed))
    }

    /// The name of the epoch's job with the copy stage: the epoch's name,
    /// or, where a job planned for unique rows may come first, a name of its
    /// own (`-copies`), so that ranks tell the two apart.
    fn copy_stage_name(&self) -> String {
        if self.unique_settings.is_some() {
            format!("{}-copies", self.job_name)
        } else {
            self.job_name.clone()
        }
    }

    fn remember(&self, job_id: &str) {
        if let Ok(mut slot) = self.job_id.lock() {
            *slot = Some(job_id.to_string());
        }
    }

    async fn submit(&self, name: &str, settings: &[KeyValuePair]) -> Result<String> {
        let mut settings = settings.to_vec();
        // The job's name is one of its settings (`ballista.job.name`).
        for pair in &mut settings {
            if pair.key == ballista_core::config::BALLISTA_JOB_NAME {
                pair.value = Some(name.to_string());
            }
        }
        let params = ExecuteQueryParams {
            session_id: self.session_id.clone(),
            settings,
            operation_id: format!("{name}-{}", std::process::id()),
            query: Some(Query::LogicalPlan(self.plan.clone())),
        };
        let mut request = tonic::Request::new(params);
        ballista_core::version::insert_version_header(request.metadata_mut());
        let result = self
            .client()
            .await?
            .execute_query(request)
            .await
            .map_err(|e| self.error(format!("cannot submit: {}", e.message())))?
            .into_inner();
        match result.result {
            Some(execute_query_result::Result::Success(success)) => Ok(success.job_id),
            Some(execute_query_result::Result::Failure(failure)) => {
                Err(self.error(format!("the scheduler refused the job: {failure:?}")))
            }
            None => Err(self.error("the scheduler sent an empty answer")),
        }
    }

    /// The newest job named like ours (the epoch's, or its copy stage's)
    /// that has not failed and was not tried, and its name.
    async fn find(&self, tried: &HashSet<String>) -> Result<Option<(String, String)>> {
        let copies = self.copy_stage_name();
        // Ballista's own response type of the job list.
        let jobs: Vec<ballista_api_types::dto::JobResponse> =
            match rest_get(&self.scheduler, "/api/jobs").await {
                Ok(jobs) => jobs,
                Err(e) => {
                    log::debug!("{e}");
                    return Ok(None);
                }
            };
        Ok(jobs
            .into_iter()
            .filter(|job| job.job_name == self.job_name || job.job_name == copies)
            .filter(|job| job.status != "Failed" && !tried.contains(&job.job_id))
            .map(|job| (job.start_time, job.job_id, job.job_name))
            .max()
            .map(|(_, id, name)| (id, name)))
    }

    /// Polls the job until it succeeds; its final stage's partitions.
    async fn wait(
        &self,
        job_id: &str,
        name: &str,
        completed: Option<&CompletedJob>,
    ) -> Result<Vec<PartitionLocation>> {
        let mut client = self.client().await?;
        loop {
            let status = client
                .get_job_status(GetJobStatusParams {
                    job_id: job_id.to_string(),
                })
                .await
                .map_err(|e| self.error(format!("job {job_id}: {}", e.message())))?
                .into_inner()
                .status
                .and_then(|s| s.status);
            match status {
                Some(Status::Successful(done)) => {
                    if let Some(slot) = completed {
                        let rows = done
                            .partition_location
                            .iter()
                            .filter_map(|l| l.partition_stats.as_ref())
                            .map(|stats| stats.num_rows.max(0) as u64)
                            .sum();
                        if let Ok(mut slot) = slot.lock() {
                            *slot = Some((name.to_string(), rows));
                        }
                    }
                    return Ok(done.partition_location);
                }
                Some(Status::Failed(failed)) => {
                    return Err(
                        self.error(format!("job {job_id} failed: {}", failed.error))
                    );
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Streams the job's result partitions, in partition order, from the
    /// executors holding them.
    async fn fetch(
        &self,
        mut locations: Vec<PartitionLocation>,
        fetched: &Fetched,
    ) -> Result<SendableRecordBatchStream> {
        locations.sort_by_key(|l| {
            (
                l.partition_id.as_ref().map(|p| p.partition_id),
                l.map_partition_id,
            )
        });
        if let Some(world) = self.deal_world {
            let rank = self.rank as u32;
            locations.retain(|l| {
                l.partition_id
                    .as_ref()
                    .is_some_and(|p| p.partition_id % world as u32 == rank)
            });
        }
        let mut streams = Vec::with_capacity(locations.len());
        for location in locations {
            fetched.partitions.add(1);
            let stream = self.fetch_one(location).await?;
            let (schema, fetched) = (stream.schema(), fetched.clone());
            streams.push(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                stream.inspect_ok(move |batch| {
                    fetched.rows.add(batch.num_rows());
                    fetched.bytes.add(data_bytes(batch));
                }),
            )) as SendableRecordBatchStream);
        }
        Ok(match self.lane_turn_rows {
            None => Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                futures::stream::iter(streams).flatten(),
            )),
            Some(turn_rows) => {
                let lanes = streams.into_iter().map(|s| spawn_buffered(s, 2)).collect();
                crate::exec::lanes::interleave_lanes(
                    Arc::clone(&self.schema),
                    lanes,
                    turn_rows,
                )
            }
        })
    }

    async fn fetch_one(
        &self,
        location: PartitionLocation,
    ) -> Result<SendableRecordBatchStream> {
        let layout = location.layout();
        let executor = location
            .executor_meta
            .ok_or_else(|| self.error("a result partition without an executor"))?;
        let partition_id = location
            .partition_id
            .ok_or_else(|| self.error("a result partition without an id"))?;
        let mut client = BallistaClient::try_new(
            &executor.host,
            executor.port as u16,
            self.max_message_size,
            false,
            None,
            3,
            500,
            0,
            0,
        )
        .await
        .map_err(|e| {
            ExecutorLost::error(format!(
                "{}: cannot reach executor {}:{} holding a result partition: {e}",
                self.job_name, executor.host, executor.port
            ))
        })?;
        client
            .fetch_partition(
                &executor.id,
                &partition_id.into(),
                location.file_id,
                layout,
                self.prefer_flight,
            )
            .await
            .map_err(|e| {
                ExecutorLost::error(format!(
                    "{}: cannot fetch a result partition from {}:{}: {e}",
                    self.job_name, executor.host, executor.port
                ))
            })
            .map(|stream| {
                // A stream that breaks half way lost its executor too.
                let schema = stream.schema();
                let job_name = self.job_name.clone();
                Box::pin(RecordBatchStreamAdapter::new(
                    schema,
                    stream.map_err(move |e| {
                        ExecutorLost::error(format!(
                            "{job_name}: reading a result partition failed: {e}"
                        ))
                    }),
                )) as SendableRecordBatchStream
            })
    }
}
