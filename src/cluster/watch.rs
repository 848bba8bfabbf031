//! [`JobWatchExec`]: a client-side guard that turns a lost executor into a
//! prompt, clear error instead of a hang or a wrong result.
//!
//! ```text
//!  client                                     scheduler (REST, same port)
//!  JobWatchExec ── polls every second ──────► /api/executors
//!    │  an executor seen during the job disappears (missed heartbeats)
//!    │    → cancel the job (gRPC CancelJob), fail with an error naming it
//!    ▼
//!  DistributedQueryExec (Ballista's client: submit, poll, fetch)
//! ```
//!
//! # Why not let Ballista recover
//! Ballista 55 re-runs a lost executor's tasks, but killing an executor
//! while a stage runs (tests/integration/cluster.rs) showed three outcomes
//! depending on configuration and timing: the job completed correctly;
//! under push scheduling it stayed "Running" for ever (the rolled-back
//! stage's remaining task update is ignored and the stage never resumes),
//! and so did every later job on the surviving executor; under pull
//! scheduling (which sqlfeed uses) it completed with **duplicated rows**
//! (117M instead of 81M joined pairs). sqlfeed cannot tell the good outcome
//! from the others while the job runs, so it cancels and reports. Every
//! sqlfeed result is a pure function of the query and the data, so running
//! the query again gives the same rows: a cluster feed does so itself
//! ([`super::ExactRetryExec`] recognises the [`ExecutorLost`] error, runs
//! the epoch's job again and skips the rows already delivered). The guard
//! needs the loss to be noticed before the job ends: the scheduler's
//! `--executor-timeout` bounds that window.
//!
//! # Ordering, memory
//! Batches pass through unchanged; the guard holds no data.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::exec::{BatchStream, Setting};
use ballista_core::execution_plans::DistributedQueryExec;
use ballista_core::serde::protobuf::CancelJobParams;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::exec_datafusion_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, RecordBatchStream,
};
use datafusion_proto::protobuf::LogicalPlanNode;
use futures::{FutureExt, Stream};

use super::SchedulerAddress;

/// A job's work or result was lost with an executor: running the job again
/// gives the same rows (see [`super::ExactRetryExec`]).
#[derive(Debug)]
pub struct ExecutorLost(String);

impl ExecutorLost {
    /// `message` as an error that [`is_executor_lost`] recognises.
    pub(crate) fn error(message: String) -> DataFusionError {
        DataFusionError::External(Box::new(Self(message)))
    }
}

impl fmt::Display for ExecutorLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ExecutorLost {}

/// Whether `error` is (or wraps) an [`ExecutorLost`].
pub fn is_executor_lost(error: &DataFusionError) -> bool {
    match error {
        DataFusionError::External(e) => boxed_is_lost(e.as_ref()),
        DataFusionError::Context(_, inner) => is_executor_lost(inner),
        DataFusionError::Shared(inner) => is_executor_lost(inner),
        DataFusionError::ArrowError(arrow, _) => match arrow.as_ref() {
            datafusion::arrow::error::ArrowError::ExternalError(e) => {
                boxed_is_lost(e.as_ref())
            }
            _ => false,
        },
        _ => false,
    }
}

/// [`is_executor_lost`] of a boxed error.
fn boxed_is_lost(e: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    e.downcast_ref::<ExecutorLost>().is_some()
        || e.downcast_ref::<DataFusionError>()
            .is_some_and(is_executor_lost)
}

/// How often the guard asks the scheduler for its executors.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Limit of one REST request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Passes its input through while watching the scheduler's executors, and
/// cancels the cluster job with a typed [`ExecutorLost`] error when one
/// vanishes. Module docs: why, and the timeouts.
#[derive(Debug)]
pub struct JobWatchExec {
    input: Arc<dyn ExecutionPlan>,
    scheduler: SchedulerAddress,
}

impl JobWatchExec {
    /// Guards `input` (a client plan, usually Ballista's `DistributedQueryExec`).
    pub fn new(input: Arc<dyn ExecutionPlan>, scheduler: SchedulerAddress) -> Self {
        Self { input, scheduler }
    }
}

impl DisplayAs for JobWatchExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let scheduler: Setting = ("scheduler", &self.scheduler);
        crate::exec::fmt_settings(f, t, "JobWatchExec", &[scheduler])
    }
}

impl ExecutionPlan for JobWatchExec {
    crate::exec::one_input_operator! {
        name: "JobWatchExec",
        properties: passed_through,
        rebuild: |this, child| Ok(Self::new(child, this.scheduler.clone())),
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    crate::exec::statistics_of_one_input!(first_input_statistics);

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let inner = self.input.execute(partition, ctx)?;
        let job = find_job(&self.input);
        let lost = Arc::new(AtomicBool::new(false));
        let alarm = watch(self.scheduler.clone(), job, Arc::clone(&lost)).boxed();
        Ok(Box::pin(WatchedStream {
            schema: inner.schema(),
            inner,
            alarm,
            lost,
            done: false,
        }))
    }
}

/// Reads the job id of the plan's Ballista client node once it is known.
type JobId = Box<dyn Fn() -> Option<String> + Send>;

fn find_job(plan: &Arc<dyn ExecutionPlan>) -> JobId {
    if let Some(query) = find_client(plan) {
        return Box::new(move || query.job_id().map(|id| id.to_string()));
    }
    if plan.as_ref().is::<super::SharedJobExec>() {
        let plan = Arc::clone(plan);
        return Box::new(move || {
            plan.as_ref()
                .downcast_ref::<super::SharedJobExec>()
                .and_then(|shard| shard.job_id())
        });
    }
    Box::new(|| None)
}

/// The first Ballista client node in `plan`.
fn find_client(
    plan: &Arc<dyn ExecutionPlan>,
) -> Option<DistributedQueryExec<LogicalPlanNode>> {
    if let Some(query) = plan
        .as_ref()
        .downcast_ref::<DistributedQueryExec<LogicalPlanNode>>()
    {
        return Some(query.clone());
    }
    plan.children().into_iter().find_map(find_client)
}

struct WatchedStream {
    schema: SchemaRef,
    inner: SendableRecordBatchStream,
    alarm: futures::future::BoxFuture<'static, DataFusionError>,
    /// Set by the alarm once it has seen a lost executor.
    lost: Arc<AtomicBool>,
    done: bool,
}

impl Stream for WatchedStream {
    type Item = Result<RecordBatch>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(error) = self.alarm.poll_unpin(cx) {
            self.done = true;
            return Poll::Ready(Some(Err(error)));
        }
        if self.lost.load(Ordering::Acquire) {
            // Cancelling; the alarm wakes us with the error.
            return Poll::Pending;
        }
        match self.inner.as_mut().poll_next(cx) {
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                Poll::Ready(Some(Err(tidy_job_error(error))))
            }
            other => other,
        }
    }
}

impl RecordBatchStream for WatchedStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// Ballista reports a task's error as the debug text of nested error values
/// (`Job 1 failed: … DataFusionError(Shared(External(DataFusionError(
/// Execution("image_decode: cannot decode row 0 …")))))`); this keeps the job
/// and the innermost message, which is what the embedded engine would say.
fn tidy_job_error(error: DataFusionError) -> DataFusionError {
    let text = error.to_string();
    let Some(job) = text
        .find("Job ")
        .and_then(|at| text[at..].find(" failed").map(|end| &text[at..at + end]))
    else {
        return error;
    };
    let Some(open) = text.rfind("(\"") else {
        return error;
    };
    let inner = &text[open + 2..];
    let Some(close) = inner.rfind("\")") else {
        return error;
    };
    let message = inner[..close].replace("\\\"", "\"").replace("\\n", "\n");
    exec_datafusion_err!("{job} failed on the cluster: {message}")
}

/// Resolves with the error to report once an executor known to the job is
/// lost; never resolves otherwise.
async fn watch(
    scheduler: SchedulerAddress,
    job: JobId,
    lost: Arc<AtomicBool>,
) -> DataFusionError {
    // Executors listed in two consecutive polls. Right after another
    // executor's loss the scheduler may list it once more before dropping
    // it (seen in CI): counting such a one-time entry would fail a healthy
    // query.
    let mut known: BTreeMap<String, String> = BTreeMap::new();
    let mut previous: Option<BTreeMap<String, String>> = None;
    loop {
        tokio::time::sleep(POLL_INTERVAL).await;
        // A scheduler that does not answer is Ballista's client's to report.
        let current = match executors(&scheduler).await {
            Ok(current) => current,
            Err(e) => {
                log::debug!("job watch: {e}");
                continue;
            }
        };
        if let Some((id, address)) =
            known.iter().find(|(id, _)| !current.contains_key(*id))
        {
            // From here on the stream stops reading Ballista's client, which
            // would otherwise report the job as "Cancelled" without saying
            // why; the job is cancelled before the error is returned, so a
            // process that exits on it leaves no job behind.
            lost.store(true, Ordering::Release);
            let job_id = job();
            if let Some(job_id) = &job_id {
                cancel(&scheduler, job_id).await;
            }
            return ExecutorLost::error(format!(
                "executor {id} at {address} was lost while job {} ran on {scheduler}; \
                 the job was cancelled rather than recovered (Ballista 55's recovery of \
                 a running stage can stall or duplicate rows). Results are a pure \
                 function of the query and the data: run it again",
                job_id.as_deref().unwrap_or("(not yet submitted)")
            ));
        }
        if let Some(previous) = &previous {
            known.extend(
                current
                    .iter()
                    .filter(|(id, _)| previous.contains_key(*id))
                    .map(|(id, address)| (id.clone(), address.clone())),
            );
        }
        previous = Some(current);
    }
}

/// Executors registered with the scheduler at `scheduler`: id → host:port
/// of their Flight service (from the scheduler's REST API).
pub async fn executors(scheduler: &SchedulerAddress) -> Result<BTreeMap<String, String>> {
    let list: Vec<ExecutorInfo> = rest_get(scheduler, "/api/executors").await?;
    Ok(list
        .into_iter()
        .map(|executor| {
            let host = if executor.host.is_empty() {
                "?".into()
            } else {
                executor.host
            };
            (executor.id, format!("{host}:{}", executor.port))
        })
        .collect())
}

/// One executor of the scheduler's `GET /api/executors` (the fields sqlfeed
/// reads; others are ignored).
#[derive(Debug, serde::Deserialize)]
pub(crate) struct ExecutorInfo {
    pub id: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub port: u16,
}

/// `GET path` on the scheduler's REST API, its JSON body as `T`.
pub(crate) async fn rest_get<T: serde::de::DeserializeOwned>(
    scheduler: &SchedulerAddress,
    path: &str,
) -> Result<T> {
    let failed =
        |e: String| exec_datafusion_err!("GET {path} on {scheduler} failed: {e}");
    // One client (and connection pool) for the process.
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let client = match CLIENT.get() {
        Some(client) => client.clone(),
        None => {
            let client = reqwest::Client::builder()
                .connect_timeout(REQUEST_TIMEOUT)
                .timeout(REQUEST_TIMEOUT)
                .build()
                .map_err(|e| failed(e.to_string()))?;
            CLIENT.get_or_init(|| client).clone()
        }
    };
    let url = format!("http://{}:{}{path}", scheduler.host, scheduler.port);
    let response = client
        .get(&url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| failed(e.to_string()))?;
    let status = response.status();
    if !status.is_success() {
        return Err(failed(format!("HTTP {status}")));
    }
    let body = response.text().await.map_err(|e| failed(e.to_string()))?;
    serde_json::from_str(&body).map_err(|e| failed(format!("unreadable answer: {e}")))
}

/// Asks the scheduler to cancel `job_id`; failures are logged (the job then
/// ends by itself when its tasks fail).
async fn cancel(scheduler: &SchedulerAddress, job_id: &str) {
    let cancelled = async {
        let mut client = SchedulerGrpcClient::connect(scheduler.grpc_url()).await?;
        client
            .cancel_job(CancelJobParams {
                job_id: job_id.to_string(),
            })
            .await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, cancelled).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::warn!("cannot cancel job {job_id} on {scheduler}: {e}"),
        Err(_) => log::warn!("cancelling job {job_id} on {scheduler} timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::plan_datafusion_err;

    #[test]
    fn the_executor_list_reads_ballistas_json()
    -> std::result::Result<(), serde_json::Error> {
        // The shape of Ballista 55's `GET /api/executors` (extra fields ignored).
        let body = r#"[{"id":"e1","host":"10.0.0.7","port":50051,"last_seen":12,
            "specification":{"task_slots":4},"metrics":[],"os_info":null}]"#;
        let list: Vec<ExecutorInfo> = serde_json::from_str(body)?;
        assert_eq!(list[0].id, "e1");
        assert_eq!((list[0].host.as_str(), list[0].port), ("10.0.0.7", 50051));
        let jobs: Vec<ballista_api_types::dto::JobResponse> = serde_json::from_str(
            r#"[{"job_id":"j","job_name":"sqlfeed-feed-1-e0","job_status":"Running","status":"Running",
                "num_stages":2,"completed_stages":1,"percent_complete":50,"start_time":5,"end_time":0}]"#,
        )?;
        assert_eq!(jobs[0].job_name, "sqlfeed-feed-1-e0");
        Ok(())
    }

    #[test]
    fn job_errors_keep_the_job_and_the_innermost_message() {
        let raw = exec_datafusion_err!(
            "Job 038HCQE74Y000 failed: Job failed due to stage 1 failed: Task failed due to \
             runtime execution error: DataFusionError(Shared(External(DataFusionError(Execution(\
             \"image_decode: cannot decode row 0 (10 bytes starting 6e6f74): not a PNG or JPEG \
             image. Use try_image_decode to get NULL for such rows\")))))"
        );
        let tidy = tidy_job_error(raw).to_string();
        assert_eq!(
            tidy,
            "Execution error: Job 038HCQE74Y000 failed on the cluster: image_decode: cannot \
             decode row 0 (10 bytes starting 6e6f74): not a PNG or JPEG image. Use \
             try_image_decode to get NULL for such rows"
        );
        // Other errors pass unchanged.
        let plain = plan_datafusion_err!("no such column");
        assert_eq!(
            tidy_job_error(plain).to_string(),
            "Error during planning: no such column"
        );
    }
}
