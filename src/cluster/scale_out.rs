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
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::execution::{
    SendableRecordBatchStream, SessionStateBuilder, TaskContext,
};
use datafusion::logical_expr::{Expr, LogicalPlan, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::TryStreamExt;

use super::{
    AttemptFactory, ExactRetryExec, JobDeal, JobWatchExec, RunJob, SchedulerAddress,
    SharedJobExec, Standalone, client_state,
};
use crate::session::{DeferredPads, EpochJob, EpochJobPlan, InstallScaleOut, ScaleOut};
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
                rows_repeat: Mutex::default(),
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
    /// Per feed run (its job names' hash): whether a job met repeated rows,
    /// so that later epochs plan the copy stage at once (`SharedJobExec`).
    rows_repeat: Mutex<HashMap<u64, Arc<AtomicBool>>>,
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
            mixture,
            read,
            pads,
        } = job;
        let (state, query) = query.into_parts();
        // The scheduler plans the job with this rank's settings: the same
        // lanes as an embedded epoch, so its result partitions are the
        // embedded feed's partitions.
        let mut config = state.config().clone();
        crate::config::deterministic_config(&mut config, partition_order);
        let state = SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .build();
        // Functions that only widen their input (image_to_tensor: uint8 to
        // float32) run here after the fetch, so that the executors encode,
        // write and send the narrow input: the cache's compact split, of
        // the optimized plan (where a feed's SHUFFLE is under the functions
        // it moved after itself).
        let (plan, finish) = widened_on_client(&state, state.optimize(&query)?)?;
        // Dealt on the executors, each rank fetches its own batches only.
        let deal = deal.filter(|_| SharedJobExec::can_deal(&plan));
        // Ranks that split the query differently read different jobs.
        let widened = finish.is_some();
        let run =
            xxhash_rust::xxh3::xxh3_64(format!("{run}\0{deal:?}\0{widened}").as_bytes());
        let job_name = format!("sqlfeed-feed-{run:016x}-e{epoch}");
        let rows_repeat = Arc::clone(
            self.rows_repeat
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .entry(run)
                .or_default(),
        );
        // The widening functions over the fetched rows.
        let finish = finish
            .map(|finish| crate::cache::compact::finish_exprs(&state, &plan, &finish))
            .transpose()?;
        // The job's mixture reports what its sources gave once it completed.
        let mixture = mixture.and_then(|rows| Some((mixture_names(&plan)?, rows)));
        // Each attempt is the epoch's job, watched for lost executors; a
        // loss re-runs it and skips what this rank already consumed.
        let (attempt_state, scheduler) = (state.clone(), self.address.clone());
        let pads = pads.filter(|_| deal.is_some_and(|d| d.span.is_some()));
        let attempt_pads = pads.clone();
        let attempts: Arc<AttemptFactory> = Arc::new(move |attempt| {
            let mut job = SharedJobExec::try_new(
                &attempt_state,
                &plan,
                scheduler.clone(),
                RunJob {
                    name: job_name.clone(),
                    rows_repeat: Arc::clone(&rows_repeat),
                },
                rank,
                attempt,
                deal.map(|deal| JobDeal {
                    deal,
                    pads: attempt_pads.clone(),
                }),
            )?;
            if let Some(completed) = &completed {
                job = job.reporting_completion(Arc::clone(completed));
            }
            if let Some((names, rows)) = &mixture {
                job = job.reporting_mixture(names.clone(), Arc::clone(rows));
            }
            if let Some((queue, window, windows)) = &read {
                job = job.releasing((Arc::clone(queue), *window, *windows));
            }
            Ok(
                Arc::new(JobWatchExec::new(Arc::new(job), scheduler.clone()))
                    as Arc<dyn ExecutionPlan>,
            )
        });
        let fetched: Arc<dyn ExecutionPlan> =
            Arc::new(ExactRetryExec::try_new(attempts, self.address.clone())?);
        // The pads the window jobs put aside, finished as the rows are.
        let pads = pads
            .map(|pads| {
                let stream = PadsStream {
                    schema: fetched.schema(),
                    pads,
                };
                StreamingTableExec::try_new(
                    fetched.schema(),
                    vec![Arc::new(stream)],
                    None,
                    vec![],
                    false,
                    None,
                )
                .map(|exec| Arc::new(exec) as Arc<dyn ExecutionPlan>)
            })
            .transpose()?;
        let (plan, pads) = match finish {
            Some(exprs) => (
                Arc::new(ProjectionExec::try_new(exprs.clone(), fetched)?) as _,
                pads.map(|pads| ProjectionExec::try_new(exprs, pads))
                    .transpose()?
                    .map(|pads| Arc::new(pads) as _),
            ),
            None => (fetched, pads),
        };
        Ok(EpochJobPlan {
            plan,
            task_ctx: Arc::new(TaskContext::from(&state)),
            dealt: deal.is_some(),
            pads,
        })
    }
}

/// Streams the pad rows a windowed epoch's dealt jobs put aside
/// ([`DeferredPads`]), when read: after the epoch's last window.
#[derive(Debug)]
struct PadsStream {
    schema: SchemaRef,
    pads: Arc<DeferredPads>,
}

impl PartitionStream for PadsStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let pads = Arc::clone(&self.pads);
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::once(
                async move { Ok::<_, DataFusionError>(pads.batches()) },
            )
            .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
            .try_flatten(),
        ))
    }
}

/// The source names of the first mixture in `plan` (from the top), as a
/// feed reports its realised proportions; `None` without one.
fn mixture_names(plan: &LogicalPlan) -> Option<Vec<String>> {
    let mut names = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::Extension(extension) = node
            && let Some(mix) = extension
                .node
                .as_any()
                .downcast_ref::<crate::shuffle::mix::MixNode>()
        {
            names = Some(mix.spec().names.clone());
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    names
}

/// `query` split into the job the cluster runs and the projection this
/// client applies to its result (`None`: the query runs whole), as an epoch
/// cache stores its compact form ([`crate::cache::compact`]): the job ends
/// before the query's top-level calls of functions that only widen their
/// input, element by element (`image_to_tensor`), so the result partitions
/// are written, served and fetched in the narrow type. The functions are
/// deterministic and row-wise, so the projection gives exactly the query's
/// values; the job's rows are in the query's order (the shuffle keys the
/// same inputs). Off with `SET sqlfeed.widen_on_client = false`.
fn widened_on_client(
    state: &SessionState,
    query: LogicalPlan,
) -> Result<(LogicalPlan, Option<Vec<Expr>>)> {
    let on = state
        .config()
        .options()
        .extensions
        .get::<crate::config::SqlfeedOptions>()
        .is_none_or(|options| options.widen_on_client);
    if !on {
        return Ok((query, None));
    }
    let compact = crate::cache::compact::compact(query.clone())?;
    if !compact.split {
        return Ok((query, None));
    }
    // The finished columns must be the query's, names and types, or the
    // feed's tensors would change; else the job runs whole.
    let finished =
        crate::cache::compact::apply_finish(compact.stored.clone(), &compact.finish)?;
    if finished
        .schema()
        .has_equivalent_names_and_types(query.schema())
        .is_err()
    {
        return Ok((query, None));
    }
    Ok((compact.stored, Some(compact.finish)))
}
