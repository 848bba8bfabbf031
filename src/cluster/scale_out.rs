//! The cluster behind the session's scale-out seam
//! (`crate::session::ScaleOut`): what `SessionBuilder::cluster` installs,
//! and how a feed's epoch becomes one job all ranks read.
//!
//! ```text
//!   SessionBuilder::cluster(url) ── ClusterInstall ──► client_state(url)
//!                                       │ "standalone": Standalone::start first
//!                                       ▼
//!   Session ── ClusterScaleOut { address, standalone }
//!                 ├─ watch(plan)      → JobWatchExec(plan)
//!                 └─ epoch_job(job)   → JobWatchExec(ExactRetryExec(attempt → SharedJobExec))
//! ```

use std::any::Any;
use std::sync::Arc;

use datafusion::error::Result;
use datafusion::execution::context::SessionState;
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::logical_expr::ScalarUDF;
use datafusion::physical_plan::ExecutionPlan;

use super::{
    AttemptFactory, ExactRetryExec, JobWatchExec, SchedulerAddress, SharedJobExec,
    Standalone, client_state,
};
use crate::session::{EpochJob, EpochJobPlan, InstallScaleOut, ScaleOut};
use crate::{Session, SessionBuilder};

impl SessionBuilder {
    /// Runs queries on the Ballista cluster whose scheduler is at `url`
    /// (`df://host:port`) instead of the embedded engine; see
    /// [`crate::cluster`]. `build` checks that the scheduler answers.
    /// `"standalone"` starts a scheduler and an executor in this process.
    pub fn cluster(self, url: impl Into<String>) -> Self {
        self.with_scale_out(Arc::new(ClusterInstall { url: url.into() }))
    }
}

impl Session {
    /// The scheduler this session runs on, or `None` for the embedded engine.
    pub fn cluster(&self) -> Option<&SchedulerAddress> {
        let cluster = self
            .scale_out()?
            .as_any()
            .downcast_ref::<ClusterScaleOut>()?;
        Some(&cluster.address)
    }
}

/// Installs a cluster client on a session being built.
#[derive(Debug)]
struct ClusterInstall {
    /// `df://host:port`, or `standalone`.
    url: String,
}

impl InstallScaleOut for ClusterInstall {
    fn install(
        &self,
        embedded: &SessionBuilder,
        state: SessionState,
        functions: Vec<Arc<ScalarUDF>>,
    ) -> Result<(SessionState, Arc<dyn ScaleOut>)> {
        let (url, standalone) = if self.url == "standalone" {
            let standalone = Standalone::start(embedded, 1, 0)?;
            (standalone.address().to_string(), Some(standalone))
        } else {
            (self.url.clone(), None)
        };
        let (state, address) = client_state(state, &url, functions)?;
        Ok((
            state,
            Arc::new(ClusterScaleOut {
                address,
                _standalone: standalone,
            }),
        ))
    }
}

/// A session's cluster: its scheduler, and the in-process cluster of
/// `cluster("standalone")`, kept alive with the session.
#[derive(Debug)]
struct ClusterScaleOut {
    address: SchedulerAddress,
    _standalone: Option<Arc<Standalone>>,
}

impl ScaleOut for ClusterScaleOut {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn watch(&self, plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        Arc::new(JobWatchExec::new(plan, self.address.clone()))
    }

    fn epoch_job(&self, job: EpochJob) -> Result<EpochJobPlan> {
        let EpochJob {
            query,
            partition_order,
            run,
            epoch,
            rank,
            deal,
            completed,
        } = job;
        let (state, plan) = query.into_parts();
        // The scheduler plans the job with this rank's settings: the same
        // lanes as an embedded epoch, so its result partitions are the
        // embedded feed's partitions.
        let mut config = state.config().clone();
        crate::config::deterministic_config(&mut config, partition_order);
        let state = SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .build();
        let plan = state.optimize(&plan)?;
        // Dealt on the executors, each rank fetches its own batches only.
        let deal = deal.filter(|_| SharedJobExec::can_deal(&plan));
        let run = xxhash_rust::xxh3::xxh3_64(format!("{run}\0{deal:?}").as_bytes());
        let job_name = format!("sqlfeed-feed-{run:016x}-e{epoch}");
        // Each attempt is the epoch's job, watched for lost executors; a
        // loss re-runs it and skips what this rank already consumed.
        let (attempt_state, scheduler) = (state.clone(), self.address.clone());
        let attempts: Arc<AttemptFactory> = Arc::new(move |attempt| {
            let mut job = SharedJobExec::try_new(
                &attempt_state,
                &plan,
                scheduler.clone(),
                job_name.clone(),
                rank,
                attempt,
                deal,
            )?;
            if let Some(completed) = &completed {
                job = job.reporting_completion(Arc::clone(completed));
            }
            Ok(
                Arc::new(JobWatchExec::new(Arc::new(job), scheduler.clone()))
                    as Arc<dyn ExecutionPlan>,
            )
        });
        Ok(EpochJobPlan {
            plan: Arc::new(ExactRetryExec::try_new(attempts, self.address.clone())?),
            task_ctx: Arc::new(TaskContext::from(&state)),
            dealt: deal.is_some(),
        })
    }
}
