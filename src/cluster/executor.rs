//! `sqlfeed executor`: Ballista's executor with sqlfeed registered.
//!
//! Executors decode stage plans with sqlfeed's codec, resolve sqlfeed's
//! functions from their own registry (so tokenizers load where they run),
//! read tables through the same object stores as an embedded session, and
//! keep shuffle files in `--work-dir`.

use std::path::PathBuf;
use std::sync::Arc;

use ballista_core::JobId;
use ballista_core::config::TaskSchedulingPolicy;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_executor::execution_engine::{
    DefaultExecutionEngine, ExecutionEngine, QueryStageExecutor,
};
use ballista_executor::executor_process::{
    ExecutorProcessConfig, start_executor_process,
};
use datafusion::common::{config_datafusion_err, exec_datafusion_err};
use datafusion::error::Result;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionConfig;

use super::{
    FunctionRegistry, SchedulerAddress, SqlfeedLogicalCodec, SqlfeedPhysicalCodec,
    free_port, with_codecs,
};
use crate::SessionBuilder;

/// Options of `sqlfeed executor`.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler to register with.
    pub scheduler: SchedulerAddress,
    /// Host to listen on (Arrow Flight for shuffle files, gRPC).
    pub bind_host: String,
    /// Arrow Flight port; 0 picks a free one.
    pub flight_port: u16,
    /// gRPC port; 0 picks a free one.
    pub grpc_port: u16,
    /// Host name other executors and clients fetch shuffle files from
    /// (default: the bind host).
    pub external_host: Option<String>,
    /// Tasks run at once (default: the number of cores).
    pub concurrent_tasks: usize,
    /// Shuffle files and spills (default: a temporary folder removed at exit).
    pub work_dir: Option<PathBuf>,
    /// Seconds between heartbeats to the scheduler.
    pub heartbeat_seconds: u64,
    /// Memory of all tasks together; `None` = Ballista's default fraction of
    /// RAM.
    pub memory_limit: Option<usize>,
    /// Seconds to keep retrying the scheduler at start.
    pub connect_timeout_seconds: u16,
}

impl ExecutorOptions {
    /// Defaults for an executor of the scheduler at `scheduler`.
    pub fn new(scheduler: SchedulerAddress) -> Self {
        Self {
            scheduler,
            bind_host: "127.0.0.1".into(),
            flight_port: 0,
            grpc_port: 0,
            external_host: None,
            concurrent_tasks: 0,
            work_dir: None,
            heartbeat_seconds: 5,
            memory_limit: None,
            connect_timeout_seconds: 10,
        }
    }
}

/// Runs an executor until it is stopped (SIGTERM, Ctrl-C) or its scheduler
/// is unreachable at start; `on_ready` receives the Flight address it
/// advertises before it registers.
pub async fn run_executor(
    session: SessionBuilder,
    options: ExecutorOptions,
    on_ready: impl FnOnce(&str),
) -> Result<()> {
    let flight_port = match options.flight_port {
        0 => free_port(&options.bind_host)?,
        port => port,
    };
    let grpc_port = match options.grpc_port {
        0 => free_port(&options.bind_host)?,
        port => port,
    };
    // A temporary work dir lives as long as this function.
    let (work_dir, _temp) = match &options.work_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| {
                exec_datafusion_err!("cannot create work dir '{}': {e}", dir.display())
            })?;
            (dir.clone(), None)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("sqlfeed-executor-")
                .tempdir()
                .map_err(|e| exec_datafusion_err!("cannot create a work dir: {e}"))?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    let work_dir_text = work_dir.to_str().map(str::to_owned).ok_or_else(|| {
        config_datafusion_err!("work dir '{}' is not valid UTF-8", work_dir.display())
    })?;

    let engine = session.engine()?;
    // Only the plugins of the executor's own `--plugin-dir`: a client names
    // functions, it never makes an executor load a library.
    let plugins = session.plugins()?;
    let udfs = session.functions(&engine, &plugins)?;
    let functions = FunctionRegistry::new(udfs.clone());
    let mut registry = BallistaFunctionRegistry::default();
    for udf in udfs {
        registry
            .scalar_functions
            .insert(udf.name().to_string(), udf);
    }
    for udaf in SessionBuilder::aggregate_functions(&plugins) {
        registry
            .aggregate_functions
            .insert(udaf.name().to_string(), udaf);
    }
    // Every task's runtime reads through sqlfeed's object stores and spills
    // into the work dir; Ballista adds the memory pool per task.
    let object_stores = Arc::clone(&engine.runtime.object_store_registry);
    let spill_dir = work_dir_text.clone();
    let runtime_producer = Arc::new(move |_: &SessionConfig| {
        RuntimeEnvBuilder::new()
            .with_object_store_registry(Arc::clone(&object_stores))
            .with_temp_file_path(spill_dir.clone())
            .build_arc()
    });
    let memory_limit = engine.memory_limit;
    let config_functions = functions.clone();
    let config_producer = Arc::new(move || {
        with_codecs(session.engine_config(memory_limit), &config_functions)
    });
    let advertised = options
        .external_host
        .clone()
        .unwrap_or_else(|| options.bind_host.clone());
    let config = ExecutorProcessConfig {
        bind_host: options.bind_host.clone(),
        external_host: Some(advertised.clone()),
        port: flight_port,
        grpc_port,
        scheduler_host: options.scheduler.host.clone(),
        scheduler_port: options.scheduler.port,
        scheduler_connect_timeout_seconds: options.connect_timeout_seconds.max(1),
        vcores: options.concurrent_tasks,
        // The scheduler's policy (see scheduler.rs).
        task_scheduling_policy: TaskSchedulingPolicy::PullStaged,
        work_dir: Some(work_dir_text),
        print_thread_info: false,
        executor_heartbeat_interval_seconds: options.heartbeat_seconds.max(1),
        memory_pool_size: options.memory_limit.map(|bytes| bytes as u64),
        override_function_registry: Some(Arc::new(registry)),
        override_runtime_producer: Some(runtime_producer),
        override_config_producer: Some(config_producer),
        override_logical_codec: Some(Arc::new(SqlfeedLogicalCodec::new(
            functions.clone(),
        ))),
        override_physical_codec: Some(Arc::new(SqlfeedPhysicalCodec::new(functions))),
        override_execution_engine: Some(Arc::new(NamingExecutionEngine::default())),
        ..ExecutorProcessConfig::default()
    };
    on_ready(&format!("{advertised}:{flight_port}"));
    start_executor_process(Arc::new(config)).await.map_err(|e| {
        exec_datafusion_err!("executor stopped: {e} (scheduler {})", options.scheduler)
    })
}

/// Ballista's execution engine, after wrapping every file scan of the stage
/// in [`crate::sql::file_errors::NameFileErrors`]: stage plans reach the
/// executor as plain `ParquetSource`s (the wrapper is not serialised), so
/// without this a damaged page read on an executor would keep DataFusion's
/// unnamed text while the same query embedded names the file.
#[derive(Default)]
struct NamingExecutionEngine {
    inner: DefaultExecutionEngine,
}

impl ExecutionEngine for NamingExecutionEngine {
    fn create_query_stage_exec(
        &self,
        job_id: JobId,
        stage_id: usize,
        task_id: usize,
        global_output_partition_ids: Vec<usize>,
        plan: Arc<dyn ExecutionPlan>,
        work_dir: &str,
        config: &SessionConfig,
    ) -> Result<Arc<dyn QueryStageExecutor>> {
        let plan =
            crate::sql::file_errors::NameFileErrors.optimize(plan, config.options())?;
        // Not serialised either: costly functions of the stage run on every
        // core of the executor, in order (see ParallelProjectionExec).
        let plan =
            crate::sql::ParallelFunctions::default().optimize(plan, config.options())?;
        self.inner.create_query_stage_exec(
            job_id,
            stage_id,
            task_id,
            global_output_partition_ids,
            plan,
            work_dir,
            config,
        )
    }
}
