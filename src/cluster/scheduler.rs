//! `sqlfeed scheduler`: Ballista's scheduler with sqlfeed registered.
//!
//! The scheduler receives logical plans from clients, plans them with a
//! session state built like an embedded session's (object stores, functions)
//! but with the stage-shaped shuffle planner, cuts them into stages and
//! hands tasks to executors.

use std::net::SocketAddr;
use std::sync::Arc;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::{
    create_scheduler, start_grpc_service_with_listener,
};
use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::execution::registry::FunctionRegistry as _;
use datafusion::prelude::SessionConfig;
use datafusion_proto::protobuf::{LogicalPlanNode, PhysicalPlanNode};

use super::{FunctionRegistry, SqlfeedLogicalCodec, SqlfeedPhysicalCodec, with_codecs};
use crate::SessionBuilder;
use crate::sql::SqlfeedQueryPlanner;

/// Options of `sqlfeed scheduler`.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Address to listen on; port 0 picks a free one.
    pub bind: SocketAddr,
    /// Host name executors and clients use to reach this scheduler (default:
    /// the bind host).
    pub external_host: Option<String>,
    /// Seconds without a heartbeat after which an executor counts as lost
    /// and its tasks are re-run elsewhere.
    pub executor_timeout_seconds: u64,
    /// Seconds a completed job's result stays on the executors (Ballista
    /// removes its intermediate stages at once). A feed reads its result in
    /// that time; a windowed feed's jobs (one per window) then keep the
    /// executors' disk to the windows of this many seconds, not the epoch.
    pub job_data_ttl_seconds: u64,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], super::DEFAULT_SCHEDULER_PORT)),
            external_host: None,
            executor_timeout_seconds: 20,
            job_data_ttl_seconds: DEFAULT_JOB_DATA_TTL_SECONDS,
        }
    }
}

/// Ballista's default for `finished_job_data_clean_up_interval_seconds`.
pub const DEFAULT_JOB_DATA_TTL_SECONDS: u64 = 300;

/// Runs a scheduler until the process ends; `on_ready` receives the bound
/// address once clients and executors can connect.
pub async fn run_scheduler(
    session: SessionBuilder,
    options: SchedulerOptions,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(options.bind)
        .await
        .map_err(|e| {
            exec_datafusion_err!("the scheduler cannot listen on {}: {e}", options.bind)
        })?;
    let bound = listener
        .local_addr()
        .map_err(|e| exec_datafusion_err!("no local address: {e}"))?;

    let engine = session.engine()?;
    let plugins = session.plugins()?;
    let udfs = session.functions(&engine, &plugins)?;
    let udafs = SessionBuilder::aggregate_functions(&plugins);
    // The scheduler plans Python functions from the declarations clients
    // send: it hosts no Python and never runs one.
    let functions = FunctionRegistry::new(udfs.clone()).planning_python_by_declaration();
    let runtime = Arc::clone(&engine.runtime);
    let planning_session = session.clone();
    let state_functions = functions.clone();
    let session_builder =
        Arc::new(move |config: SessionConfig| -> Result<SessionState> {
            let config = with_codecs(config, &state_functions);
            let mut state = SessionStateBuilder::new()
                .with_config(config)
                .with_runtime_env(Arc::clone(&runtime))
                .with_default_features()
                .with_optimizer_rules(crate::sql::rules::optimizer_rules())
                .with_physical_optimizer_rules(scheduler_physical_rules())
                .with_query_planner(Arc::new(SqlfeedQueryPlanner::stage_shaped()))
                .build();
            for udf in &udfs {
                state.register_udf(Arc::clone(udf))?;
            }
            for udaf in &udafs {
                state.register_udaf(Arc::clone(udaf))?;
            }
            Ok(state)
        });
    let memory_limit = engine.memory_limit;
    let config_functions = functions.clone();
    let config_producer = Arc::new(move || {
        with_codecs(
            planning_session.engine_config(memory_limit),
            &config_functions,
        )
    });
    let timeout = options.executor_timeout_seconds.max(1);
    let config = SchedulerConfig {
        bind_host: bound.ip().to_string(),
        bind_port: bound.port(),
        external_host: options
            .external_host
            .clone()
            .unwrap_or_else(|| bound.ip().to_string()),
        executor_timeout_seconds: timeout,
        // 0 would keep results for ever (Ballista's meaning of 0).
        finished_job_data_clean_up_interval_seconds: options.job_data_ttl_seconds.max(1),
        // Check for lost executors several times per timeout.
        expire_dead_executor_interval_seconds: (timeout / 4).max(1),
        no_executors_grace_period_seconds: timeout,
        // Pull: executors ask for work when they have a free slot. Under
        // push scheduling (Ballista's default), killing an executor while a
        // stage ran left the survivor's slot taken by a task whose result was
        // ignored, and every later job waited for ever; under pull, lost
        // tasks could be recomputed twice, which the client's guard
        // (watch.rs) prevents from reaching results. Executors must use the
        // same policy.
        scheduling_policy: TaskSchedulingPolicy::PullStaged,
        override_session_builder: Some(session_builder),
        override_config_producer: Some(config_producer),
        override_logical_codec: Some(Arc::new(SqlfeedLogicalCodec::new(
            functions.clone(),
        ))),
        override_physical_codec: Some(Arc::new(SqlfeedPhysicalCodec::new(functions))),
        ..SchedulerConfig::default()
    };
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(|e| exec_datafusion_err!("cannot start the scheduler: {e}"))?;
    let scheduler =
        create_scheduler::<LogicalPlanNode, PhysicalPlanNode>(cluster, Arc::new(config))
            .await
            .map_err(|e| exec_datafusion_err!("cannot start the scheduler: {e}"))?;
    on_ready(bound);
    start_grpc_service_with_listener(listener, scheduler)
        .await
        .map_err(|e| exec_datafusion_err!("the scheduler stopped: {e}"))
}

/// The scheduler's physical optimizer rules: the embedded engine's with
/// `ParallelFunctions` for a quarantine's projections only (executors add
/// the rest, sized to their cores),
/// and [`super::BalanceScanRows`] after the distribution rules, so that the
/// stage-1 tasks of a shuffle read equal numbers of rows; last,
/// [`crate::exec::row_index::CarryRowIndexes`], so that scans reading row
/// indexes reach the executors with them.
fn scheduler_physical_rules()
-> Vec<Arc<dyn datafusion::physical_optimizer::PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = crate::sql::rules::physical_optimizer_rules(false);
    let at = rules
        .iter()
        .position(|r| r.name() == "sqlfeed_keep_shuffle_order")
        .map_or(rules.len(), |i| i + 1);
    rules.insert(at, Arc::new(super::BalanceScanRows));
    // Last: the scans it carries are final.
    rules.push(Arc::new(crate::exec::row_index::CarryRowIndexes));
    rules
}
