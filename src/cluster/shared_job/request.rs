//! What one rank asks of the scheduler and the executors for its epoch's
//! job ([`super::SharedJobExec`]): submit it (rank 0) or find it by name
//! (the other ranks), wait until it succeeds, and stream the result
//! partitions this rank reads from the executors holding them.
//!
//! ```text
//!  rank 0:  submit "<name>" planned for unique rows ──► succeeds ──► fetch
//!                 │ fails on a repeated row (crate::shuffle::REPEATED_ROWS)
//!                 ▼
//!           submit "<name>-copies" (the stage that numbers copies) ──► fetch
//!  rank r:  find the newest "<name>" or "<name>-copies" that has not failed
//!           and was not tried ──► wait ──► fetch; a repeated-rows failure
//!           sends it back to finding
//! ```
//!
//! # Unique rows first
//! A job whose result is a global shuffle is first planned without the
//! stage that numbers repeated rows (one exchange of the scanned bytes
//! fewer, `crate::shuffle::unique`). Where rows repeat, its range tasks
//! fail it; rank 0 then submits the epoch with that stage under a name of
//! its own, and every rank of the run marks the run (`rows_repeat`), so
//! that its later epochs plan the stage at once. A retry after a lost
//! executor (`attempt > 0`) and `sqlfeed.try_unique_rows = false` plan it
//! at once too.
//!
//! # Transport
//! Result partitions are fetched as the shuffle files' bytes (Ballista's
//! block transport, decoded once here) unless the session prefers Flight
//! (`ballista.shuffle.remote_read_prefer_flight`).

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ballista_core::client::BallistaClient;
use ballista_core::serde::protobuf::execute_query_params::Query;
use ballista_core::serde::protobuf::execute_query_result;
use ballista_core::serde::protobuf::job_status::Status;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::{
    CleanJobDataParams, ExecuteQueryParams, GetJobStatusParams, KeyValuePair,
    PartitionLocation,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::exec_datafusion_err;
use datafusion::config::ConfigExtension;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::common::spawn_buffered;
use datafusion::physical_plan::metrics::Count;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};

use super::Reports;
use crate::cluster::SchedulerAddress;
use crate::cluster::watch::{ExecutorLost, is_executor_lost, rest_get};
use crate::session::{JobMixture, ReadWindow};
use crate::shuffle::mix::exec::takes_in_rendered_plan;

/// Whether `error` is a job's failure on repeated rows in a shuffle planned
/// for unique rows.
fn is_repeated_rows(error: &DataFusionError) -> bool {
    error.to_string().contains(crate::shuffle::REPEATED_ROWS)
}

/// How long a rank other than 0 waits for rank 0's job to appear.
const JOIN_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a rank waits for the scheduler to take a request to remove
/// results it read.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

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
pub(super) struct Fetched {
    pub(super) rows: Count,
    /// Bytes of the fetched values (Arrow data, as sent).
    pub(super) bytes: Count,
    pub(super) partitions: Count,
}

/// What one rank's epoch needs from the cluster.
pub(super) struct JobRequest {
    pub(super) scheduler: SchedulerAddress,
    /// The encoded logical plan.
    pub(super) plan: Vec<u8>,
    /// The job's settings, planning the stage that numbers repeated rows
    /// (`submit` sets the job's name and that choice).
    pub(super) settings: Vec<KeyValuePair>,
    /// Whether the epoch's job is first tried without that stage, planned
    /// for unique rows: its result is a shuffle's key ranges
    /// (`crate::shuffle::REPEATED_ROWS`).
    pub(super) try_unique_rows: bool,
    /// Set once a job of this run met repeated rows (shared by the run's
    /// epochs): the copy stage is then planned at once.
    pub(super) rows_repeat: Arc<AtomicBool>,
    pub(super) session_id: String,
    pub(super) job_name: String,
    pub(super) rank: usize,
    /// 0, or the retry this job is (then any rank may submit it).
    pub(super) attempt: u32,
    pub(super) max_message_size: usize,
    /// Fetch result partitions as Flight data (the executor decodes its
    /// file and encodes every batch again) instead of the file's bytes
    /// (Ballista's block transport, decoded here once): the session's
    /// `ballista.shuffle.remote_read_prefer_flight`, false by default.
    pub(super) prefer_flight: bool,
    /// The job this rank reads, once known (for the lost-executor guard).
    pub(super) job_id: Mutex<Option<String>>,
    pub(super) schema: SchemaRef,
    /// `None`: the result partitions in turn (a shuffle's key ranges);
    /// `Some(T)`: unshuffled lanes, interleaved in turns of `T` rows
    /// (`crate::exec::lanes`), as the embedded feed reads its partitions.
    pub(super) lane_turn_rows: Option<usize>,
    /// Set when the job deals its rows to `W` ranks: this rank reads the
    /// partitions `j` with `j mod W = rank` only.
    pub(super) deal_world: Option<usize>,
    /// A dealt window job's: its partitions from this one on are pads,
    /// fetched into the store instead of streamed (`DeferredPads`), or not
    /// fetched when the window cannot hold any.
    pub(super) deferred_pads: Option<(u32, Option<Arc<crate::session::DeferredPads>>)>,
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

    pub(super) async fn run(
        &self,
        fetched: &Fetched,
        reports: &Reports,
    ) -> Result<SendableRecordBatchStream> {
        if self.attempt > 0 {
            // A retry: every rank noticed the loss on its own, and rank 0
            // may have finished the epoch before it; whoever finds no job
            // of this name submits one (two submissions hold the same rows).
            // A retry whose result is gone already (another rank's, read
            // and removed, or an earlier run's) is passed over, and this
            // rank submits its own.
            let mut tried = HashSet::new();
            loop {
                let (job_id, found) = match self.find(&tried).await? {
                    Some((job_id, _)) => (job_id, true),
                    None => (self.submit(&self.job_name, false).await?, false),
                };
                self.remember(&job_id);
                let attempt = async {
                    let locations = self.wait(&job_id, &self.job_name, reports).await?;
                    self.fetch(locations, fetched).await
                };
                match attempt.await {
                    Err(e) if found && is_executor_lost(&e) => {
                        log::info!(
                            "{}",
                            self.error(format!("job {job_id}: {e}; running it again"))
                        );
                        tried.insert(job_id);
                    }
                    result => return result,
                }
            }
        }
        if self.rank == 0 {
            if self.plans_unique_rows() {
                let job_id = self.submit(&self.job_name, true).await?;
                self.remember(&job_id);
                match self.wait(&job_id, &self.job_name, reports).await {
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
            let job_id = self.submit(&name, false).await?;
            self.remember(&job_id);
            let locations = self.wait(&job_id, &name, reports).await?;
            return self.fetch(locations, fetched).await;
        }
        // Other ranks join rank 0's job; a job planned for unique rows that
        // met repeated ones is skipped (rank 0 submits the copy stage's job
        // next).
        let deadline = Instant::now() + JOIN_TIMEOUT;
        let mut tried = HashSet::new();
        loop {
            if let Some((job_id, name)) = self.find(&tried).await? {
                self.remember(&job_id);
                let attempt = async {
                    let locations = self.wait(&job_id, &name, reports).await?;
                    self.fetch(locations, fetched).await
                };
                match attempt.await {
                    Ok(stream) => return Ok(stream),
                    Err(e) if is_repeated_rows(&e) => {
                        self.rows_repeat.store(true, Ordering::Relaxed);
                        tried.insert(job_id);
                    }
                    // The job succeeded but its result is gone: removed
                    // once the ranks ahead read it (`ReadJobs`), after the
                    // scheduler's time to live, or with its executor. Rank
                    // 0 has read it and submits it no more, unless this is
                    // an earlier run's job of the same name (a restarted
                    // run): the job names cannot tell. Running it again as
                    // after a lost executor (`ExactRetryExec`) gives the
                    // same rows either way; waiting would wait for ever in
                    // the first case.
                    Err(e) if is_executor_lost(&e) => return Err(e),
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

    /// Whether rank 0 submits the epoch planned for unique rows first: the
    /// plan allows it and no rows of this run repeated.
    fn plans_unique_rows(&self) -> bool {
        self.try_unique_rows && !self.rows_repeat.load(Ordering::Relaxed)
    }

    /// The name of the epoch's job with the copy stage: the epoch's name,
    /// or, where a job planned for unique rows may come first, a name of its
    /// own (`-copies`), so that ranks tell the two apart.
    fn copy_stage_name(&self) -> String {
        if self.try_unique_rows {
            format!("{}-copies", self.job_name)
        } else {
            self.job_name.clone()
        }
    }

    /// Tells `read`'s queue that this rank read its window's job to the
    /// end, and asks the scheduler to remove the results of the jobs the
    /// queue no longer keeps from the executors. Removing is housekeeping:
    /// a failure is logged, the scheduler's time to live removes them later,
    /// and a scheduler that does not answer within [`RELEASE_TIMEOUT`] does
    /// not hold up the feed longer.
    pub(super) async fn release(&self, (read, window, windows): &ReadWindow) {
        let Some(job_id) = self.job_id.lock().ok().and_then(|id| id.clone()) else {
            return;
        };
        let released = read.read(*window, *windows, job_id);
        if released.is_empty() {
            return;
        }
        let clean = async {
            let mut client = self.client().await?;
            for job_id in &released {
                let mut request = tonic::Request::new(CleanJobDataParams {
                    job_id: job_id.clone(),
                    remove_stage_ids: vec![],
                });
                ballista_core::version::insert_version_header(request.metadata_mut());
                client.clean_job_data(request).await.map_err(|e| {
                    self.error(format!(
                        "cannot remove the result of job {job_id}, read: {}",
                        e.message()
                    ))
                })?;
            }
            Ok::<_, DataFusionError>(())
        };
        match tokio::time::timeout(RELEASE_TIMEOUT, clean).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log::warn!("{e}; {released:?} stay until their time to live"),
            Err(_) => log::warn!(
                "{}",
                self.error(format!(
                    "the scheduler did not remove the results of {released:?} within \
                     {RELEASE_TIMEOUT:?}; they stay until their time to live"
                ))
            ),
        }
    }

    fn remember(&self, job_id: &str) {
        if let Ok(mut slot) = self.job_id.lock() {
            *slot = Some(job_id.to_string());
        }
    }

    /// Submits the epoch's job as `name`, planned for unique rows or with
    /// the stage that numbers repeated rows.
    async fn submit(&self, name: &str, unique_rows: bool) -> Result<String> {
        let unique_key = format!(
            "{}.assume_unique_rows",
            <crate::config::SqlfeedOptions as ConfigExtension>::PREFIX
        );
        let mut settings = self.settings.clone();
        // Both are settings of the job (`ballista.job.name`).
        for pair in &mut settings {
            if pair.key == ballista_core::config::BALLISTA_JOB_NAME {
                pair.value = Some(name.to_string());
            } else if pair.key == unique_key {
                pair.value = Some(unique_rows.to_string());
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
        reports: &Reports,
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
                    if let Some((names, rows)) = &reports.mixture {
                        self.report_mixture(job_id, names, rows).await;
                    }
                    if let Some(slot) = &reports.completed {
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

    /// Reads the rows each source of the job's mixture gave from the
    /// scheduler's plans of its stages (the `MixExec` line names each
    /// source's take) into `rows`. The realised proportions are a report:
    /// when the scheduler cannot say, they stay empty and the feed's rows
    /// are not touched.
    async fn report_mixture(&self, job_id: &str, names: &[String], rows: &JobMixture) {
        let path = format!("/api/job/{job_id}/stages");
        // The scheduler files a finished job's graph just after it reports
        // the job's status.
        for _ in 0..20 {
            let stages: Result<ballista_api_types::dto::QueryStagesResponse> =
                rest_get(&self.scheduler, &path).await;
            let found = stages.as_ref().ok().and_then(|response| {
                response
                    .stages
                    .iter()
                    .filter_map(|stage| stage.stage_plan.as_deref())
                    .find_map(|plan| takes_in_rendered_plan(plan, names))
            });
            if let Some(found) = found {
                if let Ok(mut rows) = rows.lock() {
                    *rows = found;
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        log::warn!(
            "{}",
            self.error(format!(
                "job {job_id}: the scheduler's plan names no mixture of {names:?}; \
                 the epoch's realised proportions are not reported"
            ))
        );
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
        // Pads are a few rows: fetched whole now, while the result exists.
        if let Some((first_pad, pads)) = &self.deferred_pads {
            let id =
                |l: &PartitionLocation| l.partition_id.as_ref().map(|p| p.partition_id);
            let split = locations.partition_point(|l| id(l) < Some(*first_pad));
            let pad_locations = locations.split_off(split);
            if let Some(pads) = pads {
                for location in pad_locations {
                    let Some(partition) = id(&location) else {
                        continue;
                    };
                    fetched.partitions.add(1);
                    let batches: Vec<datafusion::arrow::array::RecordBatch> =
                        self.fetch_one(location).await?.try_collect().await?;
                    pads.put(partition, batches);
                }
            }
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
