//! The sqlfeed session: one DataFusion context with everything registered.
//!
//! A [`Session`] is what every entry point (REPL, `-c`, feeds, examples) runs
//! SQL through. It owns:
//!
//! * one **memory budget** ([`SessionBuilder::memory_limit`], default
//!   [`DEFAULT_MEMORY_FRACTION`] of physical RAM or of the container's cgroup
//!   limit, whichever is lower) enforced by DataFusion's `FairSpillPool`, so
//!   sorts, joins and aggregates spill instead of failing;
//! * a **spill folder** `sqlfeed-spill-<pid>-XXXX` in the spill directory
//!   (DataFusion's `DiskManager` writes there) whose files are removed when
//!   the query that wrote them ends, also on error or cancellation; the folder
//!   is locked while the session lives, so the next session using that spill
//!   directory removes what a killed process left (see `crate::cache::liveness`);
//! * **object stores resolved from the URL** in the query
//!   (`FROM 's3://bucket/*.parquet'`), see [`object_stores`]; plain `http://`
//!   only with [`SessionBuilder::allow_http`];
//! * **path tables** with checked Parquet footers, see [`url_table`];
//! * the **functions** of `sqlfeed-udfs` plus sqlfeed's internal ones, and
//!   those of the **plugins** it loads ([`SessionBuilder::load_plugin`],
//!   [`SessionBuilder::plugin_dir`], `CREATE FUNCTION … LANGUAGE rust`; see
//!   [`plugins`]);
//! * `target_partitions` = the number of cores.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> datafusion::error::Result<()> {
//! let session = sqlfeed::Session::builder().memory_limit(512 << 20).build()?;
//! let batches = session.sql("SELECT 1 + 1 AS two").await?.collect().await?;
//! assert_eq!(batches[0].num_rows(), 1);
//! # Ok(())
//! # }
//! ```

mod cgroup;
mod create_function;
mod scale_out;
use crate::cache::liveness;
pub mod object_stores;
pub mod plugins;

use std::num::NonZeroUsize;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{exec_datafusion_err, plan_err};
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::cache::cache_manager::CacheManagerConfig;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::cache::{CacheOptions, CacheStore};
pub use crate::config::{PartitionOrder, SqlfeedOptions, deterministic_config};
use crate::exec::{catch_panic, catching_panics, panic_error};
pub use crate::sql::url_table::list_parquet_files;
use crate::sql::{self, Statement};
pub use crate::sql::{file_errors, url_table};
pub use object_stores::{ALLOW_HTTP_ENV, IoCounters, ObjectStoreLimits};
pub use scale_out::{CompletedJob, EpochJob, EpochJobPlan, InstallScaleOut, ScaleOut};

/// Share of the available memory (physical RAM or the cgroup limit, whichever
/// is lower) used as the memory limit when none is given.
pub const DEFAULT_MEMORY_FRACTION: f64 = 0.5;

/// Spill files merged at once. Merge buffers cannot spill, so an unbounded
/// fan-in (DataFusion's default) lets a large sort's final merge outgrow the
/// budget; merging in rounds of at most this many files bounds them.
const SPILL_MERGE_FAN_IN: usize = 8;

/// Name prefix of session spill folders; the pid after it is for humans only,
/// liveness is decided by the folder's lock.
const SPILL_FOLDER_PREFIX: &str = "sqlfeed-spill-";

/// Memory limit when neither physical RAM nor a cgroup limit can be read
/// (non-Linux without `/proc`).
const FALLBACK_MEMORY_LIMIT: usize = 4 << 30;

/// Configures and builds a [`Session`].
#[derive(Debug, Clone, Default)]
pub struct SessionBuilder {
    /// Bytes of memory all operators of a query share; `None` = default fraction.
    memory_limit: Option<usize>,
    /// Parallelism of scans and operators; `None` = number of cores.
    target_partitions: Option<usize>,
    /// Directory in which the session's spill folder is created; `None` =
    /// the OS temp directory.
    spill_dir: Option<PathBuf>,
    /// Rows per record batch inside the engine; `None` = DataFusion's default.
    batch_size: Option<usize>,
    /// Timeouts and retries for network object stores.
    object_store_limits: ObjectStoreLimits,
    /// Whether plain `http://` object-store URLs are read; `None` =
    /// [`ALLOW_HTTP_ENV`], else no.
    allow_http: Option<bool>,
    /// Settings of the preprocessing functions (image pixel limit, …).
    udf_options: sqlfeed_udfs::UdfOptions,
    /// Where and how much `CACHE TABLE` and cached feeds keep.
    cache: CacheOptions,
    /// Where queries run instead of this process (a Ballista cluster,
    /// installed by `crate::cluster`); `None` = the embedded engine.
    scale_out: Option<Arc<dyn InstallScaleOut>>,
    /// `sqlfeed.executor_cache_dir`.
    executor_cache_dir: Option<String>,
    /// Plugin libraries to load, in order.
    plugins: Vec<PathBuf>,
    /// Folders whose every library is a plugin to load.
    plugin_dirs: Vec<PathBuf>,
}

impl SessionBuilder {
    /// Caps the memory of all operators; beyond it they spill or fail cleanly.
    pub fn memory_limit(mut self, bytes: usize) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// Number of partitions scans and operators split work into.
    pub fn target_partitions(mut self, partitions: usize) -> Self {
        self.target_partitions = Some(partitions.max(1));
        self
    }

    /// Directory in which spill files are created, in a per-session folder
    /// `sqlfeed-spill-<pid>-XXXX` that is removed with the session (or, after
    /// a crash, by the next session using this directory).
    pub fn spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spill_dir = Some(dir.into());
        self
    }

    /// Rows per record batch inside the engine.
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = Some(rows.max(1));
        self
    }

    /// Largest image `image_decode` accepts, in pixels (default 64M): a
    /// header declaring more is refused before any allocation.
    pub fn max_image_pixels(mut self, pixels: u64) -> Self {
        self.udf_options.max_image_pixels = pixels;
        self
    }

    /// Directory of the epoch cache (default: [`crate::cache::default_cache_dir`]).
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache.dir = dir.into();
        self
    }

    /// Size limit of the cache directory; least recently used entries beyond
    /// it are removed.
    pub fn cache_max_bytes(mut self, bytes: u64) -> Self {
        self.cache.max_bytes = bytes;
        self
    }

    /// Timeouts and retries for S3, GCS, Azure and HTTP.
    pub fn object_store_limits(mut self, limits: ObjectStoreLimits) -> Self {
        self.object_store_limits = limits;
        self
    }

    /// Allows plain `http://` object-store URLs (and `http://` endpoints of
    /// S3, GCS and Azure). Without it such a URL is a Plan error naming it and
    /// this switch, before any connection. Unset, [`ALLOW_HTTP_ENV`]
    /// (`SQLFEED_ALLOW_HTTP=1`) decides; `allow_http(false)` overrides it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> datafusion::error::Result<()> {
    /// let refusing = sqlfeed::Session::builder().allow_http(false).build()?;
    /// let err = refusing
    ///     .sql("SELECT count(*) FROM 'http://127.0.0.1:9/t.parquet'")
    ///     .await
    ///     .expect_err("plain HTTP is refused");
    /// assert!(err.to_string().contains("--allow-http"));
    /// sqlfeed::Session::builder().allow_http(true).build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn allow_http(mut self, allow: bool) -> Self {
        self.allow_http = Some(allow);
        self
    }

    /// Loads the function plugin at `path` (a `cdylib` built with
    /// `sqlfeed-plugin`, see `examples/udf-plugin`) when the session is
    /// built: its functions are then called like sqlfeed's own. A library of
    /// another DataFusion major version, or not a plugin at all, fails
    /// `build` with an error naming it.
    pub fn load_plugin(mut self, path: impl Into<PathBuf>) -> Self {
        self.plugins.push(path.into());
        self
    }

    /// Loads every library (`*.so`, `*.dylib`, `*.dll`) in `dir` as a
    /// plugin; what executors and schedulers use (`--plugin-dir`).
    pub fn plugin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugin_dirs.push(dir.into());
        self
    }

    /// Runs the session's queries through `installer` instead of the
    /// embedded engine (what `SessionBuilder::cluster` does; see
    /// [`scale_out`](self::scale_out)).
    pub fn with_scale_out(mut self, installer: Arc<dyn InstallScaleOut>) -> Self {
        self.scale_out = Some(installer);
        self
    }

    /// A folder every executor and rank of the cluster reaches: cached,
    /// shuffled cluster feeds keep their entries there, on the executors'
    /// side (`sqlfeed.executor_cache_dir`, see `crate::cache::shared`).
    /// Only a session on a cluster uses it.
    pub fn executor_cache_dir(mut self, dir: impl Into<String>) -> Self {
        self.executor_cache_dir = Some(dir.into());
        self
    }

    /// Builds the session; fails if the spill directory cannot be used or,
    /// for a cluster session, the scheduler cannot be reached.
    pub fn build(self) -> Result<Session> {
        let engine = self.engine()?;
        let plugins = self.plugins()?;
        let functions = self.functions(&engine, &plugins)?;
        let cache = Arc::new(CacheStore::new(self.cache.clone()));
        let config = self
            .engine_config(engine.memory_limit)
            .with_extension(Arc::clone(&cache));
        let builder = SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(Arc::clone(&engine.runtime))
            .with_default_features()
            .with_optimizer_rules(crate::sql::rules::optimizer_rules())
            .with_physical_optimizer_rules(crate::sql::rules::physical_optimizer_rules(
                true,
            ))
            // Last, so that it sees the final scans: read errors name the file.
            .with_physical_optimizer_rule(Arc::new(
                crate::sql::file_errors::NameFileErrors,
            ))
            .with_query_planner(Arc::new(crate::sql::SqlfeedQueryPlanner::embedded()))
            .with_function_factory(Some(Arc::new(
                create_function::PluginFunctionFactory,
            )));
        // Ahead of DataFusion's planners, so that `['a', 'b']` is a constant
        // when SQL is planned (the width of `one_hot` in the plan's schema).
        // The cluster client's state is derived from this one and keeps them.
        #[cfg_attr(not(feature = "delta"), allow(unused_mut))]
        let mut state = sqlfeed_udfs::planner::with_expr_planners(builder).build();
        #[cfg(feature = "delta")]
        state.table_factories_mut().insert(
            "DELTA".to_string(),
            Arc::new(crate::sql::delta::DeltaTableFactory),
        );
        let (state, factory) = crate::sql::url_table::install(state);
        let (state, scale_out) = match &self.scale_out {
            Some(installer) => {
                let embedded = SessionBuilder {
                    scale_out: None,
                    ..self.clone()
                };
                let (state, scale_out) =
                    installer.install(&embedded, state, functions.clone())?;
                (state, Some(scale_out))
            }
            None => (state, None),
        };
        let ctx = SessionContext::new_with_state(state);
        factory.session_store().with_state(ctx.state_weak_ref());
        factory
            .other_formats_session_store()
            .with_state(ctx.state_weak_ref());
        // After the Ballista upgrade, which resets the function list.
        for udf in &functions {
            ctx.register_udf(udf.as_ref().clone());
        }
        for udaf in Self::aggregate_functions(&plugins) {
            ctx.register_udaf(udaf.as_ref().clone());
        }
        Ok(Session {
            ctx,
            cache,
            io: engine.io,
            memory_limit: engine.memory_limit,
            spill_folder: engine.spill_folder,
            scale_out,
        })
    }

    /// The memory pool, spill files and object stores of a session; a
    /// cluster's scheduler and executors build theirs the same way.
    pub(crate) fn engine(&self) -> Result<Engine> {
        let memory_limit = self.memory_limit.unwrap_or_else(default_memory_limit);
        let io = Arc::new(IoCounters::default());
        let allow_http = match self.allow_http {
            Some(allow) => allow,
            None => object_stores::allow_http_from_env()?,
        };
        let registry = Arc::new(
            object_stores::LazyObjectStoreRegistry::new(
                self.object_store_limits.clone(),
                Arc::clone(&io),
            )
            .with_allow_http(allow_http),
        );
        let pool: Arc<dyn MemoryPool> = Arc::new(TrackConsumersPool::new(
            FairSpillPool::new(memory_limit),
            NonZeroUsize::new(5).expect("5 is not zero"),
        ));
        let spill_folder = Arc::new(spill_folder(self.spill_dir.as_deref())?);
        let disk_mode = DiskManagerMode::Directories(vec![spill_folder.path().into()]);
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(pool)
            .with_disk_manager_builder(
                DiskManagerBuilder::default()
                    .with_mode(disk_mode)
                    .with_max_spill_merge_fan_in(SPILL_MERGE_FAN_IN),
            )
            .with_object_store_registry(Arc::clone(&registry) as _)
            // No listing cache: a file added or rewritten between two queries
            // of a session must be seen (and must change a cache key).
            .with_cache_manager(
                CacheManagerConfig::default().with_list_files_cache_limit(0),
            )
            .build_arc()?;
        Ok(Engine {
            runtime,
            registry,
            io,
            memory_limit,
            spill_folder,
        })
    }

    /// sqlfeed's settings of DataFusion for a session under `memory_limit`.
    pub(crate) fn engine_config(&self, memory_limit: usize) -> SessionConfig {
        let partitions = self.target_partitions.unwrap_or_else(num_cores);
        let mut config = SessionConfig::new()
            .with_information_schema(true)
            .with_target_partitions(partitions)
            .with_option_extension(SqlfeedOptions {
                executor_cache_dir: self.executor_cache_dir.clone().unwrap_or_default(),
                ..SqlfeedOptions::default()
            });
        // Each sorting partition sets this much aside for merging its spill
        // files (DataFusion's default: 10 MB). Under a small budget the
        // reservations alone would exceed it, so scale them to the budget.
        config.options_mut().execution.sort_spill_reservation_bytes =
            (memory_limit / (8 * partitions)).clamp(64 << 10, 10 << 20);
        // Read strings and blobs as Utf8/Binary, not the view types: a view
        // array's batches share data buffers, and DataFusion's accounting then
        // counts a shared buffer once per batch, so sorts and shuffles under
        // a tight budget fail where they should spill.
        config
            .options_mut()
            .execution
            .parquet
            .schema_force_view_types = false;
        if let Some(rows) = self.batch_size {
            config = config.with_batch_size(rows);
        }
        config
    }

    /// The plugins given with [`Self::load_plugin`] and [`Self::plugin_dir`].
    pub(crate) fn plugins(&self) -> Result<Vec<Arc<plugins::Plugin>>> {
        let mut loaded = Vec::new();
        for dir in &self.plugin_dirs {
            loaded.extend(plugins::load_dir(dir)?);
        }
        for path in &self.plugins {
            loaded.push(plugins::load(path)?);
        }
        Ok(loaded)
    }

    /// sqlfeed's functions (`sqlfeed-udfs` and the internal ones), reading
    /// tokenizer files through `engine`'s object stores, and the scalar
    /// functions of `plugins`. A plugin function may not take the name of
    /// another function: which one a query meant would depend on load order.
    pub(crate) fn functions(
        &self,
        engine: &Engine,
        plugins: &[Arc<plugins::Plugin>],
    ) -> Result<Vec<Arc<ScalarUDF>>> {
        let udf_options = sqlfeed_udfs::UdfOptions {
            asset_reader: Some(Arc::new(object_stores::ObjectStoreAssetReader::new(
                Arc::clone(&engine.registry),
            ))),
            ..self.udf_options.clone()
        };
        let mut functions: Vec<Arc<ScalarUDF>> =
            sqlfeed_udfs::scalar_functions_with(&udf_options)
                .into_iter()
                .chain(sql::internal_functions())
                .map(Arc::new)
                .collect();
        let mut origins: std::collections::HashMap<String, String> = functions
            .iter()
            .map(|f| (f.name().to_string(), "sqlfeed".to_string()))
            .collect();
        for plugin in plugins {
            let origin = format!("plugin '{}'", plugin.path.display());
            let aggregates = plugin.aggregate.iter().map(|f| f.name().to_string());
            let scalars = plugin.scalar.iter().map(|f| f.name().to_string());
            for name in scalars.chain(aggregates) {
                if let Some(first) = origins.insert(name.clone(), origin.clone()) {
                    if first == origin {
                        continue;
                    }
                    return plan_err!(
                        "{origin} defines a function '{name}', which {first} already has; \
                         rename one of them (a query could not say which it means)"
                    );
                }
            }
            functions.extend(plugin.scalar.iter().map(Arc::clone));
        }
        Ok(functions)
    }

    /// The aggregate functions of `plugins`.
    pub(crate) fn aggregate_functions(
        plugins: &[Arc<plugins::Plugin>],
    ) -> Vec<Arc<AggregateUDF>> {
        plugins
            .iter()
            .flat_map(|p| p.aggregate.iter().map(Arc::clone))
            .collect()
    }
}

/// What [`SessionBuilder::engine`] builds.
pub(crate) struct Engine {
    /// Memory pool, disk manager, object stores.
    pub(crate) runtime: Arc<RuntimeEnv>,
    /// The object stores, for functions that read files.
    pub(crate) registry: Arc<object_stores::LazyObjectStoreRegistry>,
    /// Bytes read through the object stores.
    pub(crate) io: Arc<IoCounters>,
    /// The memory budget in bytes.
    pub(crate) memory_limit: usize,
    /// The locked folder the disk manager spills into. Hold it as long as
    /// `runtime` is used: dropping it removes the folder and its files.
    pub(crate) spill_folder: Arc<liveness::LiveFolder>,
}

/// A DataFusion context with sqlfeed's tables, functions and limits; see the
/// module docs.
#[derive(Clone)]
pub struct Session {
    /// The DataFusion context everything runs in.
    ctx: SessionContext,
    /// The epoch cache.
    cache: Arc<CacheStore>,
    /// Bytes read through this session's object stores.
    io: Arc<IoCounters>,
    /// The memory budget in bytes.
    memory_limit: usize,
    /// The folder spill files go to, locked and kept while any clone of the
    /// session lives (removed with the last one).
    spill_folder: Arc<liveness::LiveFolder>,
    /// Where this session's queries run instead of this process (`None` =
    /// embedded); it keeps an in-process cluster alive.
    scale_out: Option<Arc<dyn ScaleOut>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("session_id", &self.ctx.session_id())
            .field("memory_limit", &self.memory_limit)
            .field("spill_folder", &self.spill_folder.path())
            .finish()
    }
}

impl Session {
    /// Options for a new session.
    pub fn builder() -> SessionBuilder {
        SessionBuilder::default()
    }

    /// A session with default options.
    pub fn try_new() -> Result<Self> {
        Self::builder().build()
    }

    /// The underlying DataFusion context.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The memory budget in bytes.
    pub fn memory_limit(&self) -> usize {
        self.memory_limit
    }

    /// The folder this session's spill files go to: `sqlfeed-spill-<pid>-XXXX`
    /// inside the spill directory, removed with the session.
    pub fn spill_folder(&self) -> &Path {
        self.spill_folder.path()
    }

    /// Where this session's queries run, or `None` for the embedded engine.
    pub fn scale_out(&self) -> Option<&Arc<dyn ScaleOut>> {
        self.scale_out.as_ref()
    }

    /// Counters of bytes read from object stores (local files included).
    pub fn io_counters(&self) -> &IoCounters {
        &self.io
    }

    /// The epoch cache of this session.
    pub fn cache(&self) -> &Arc<CacheStore> {
        &self.cache
    }

    /// The same counters, shared.
    pub fn io_counters_arc(&self) -> Arc<IoCounters> {
        Arc::clone(&self.io)
    }

    /// Plans one statement of sqlfeed SQL (DataFusion SQL plus `SUMMARIZE`,
    /// `SAMPLE` and `DESCRIBE '<path>'`) into a [`DataFrame`].
    pub async fn sql(&self, sql: &str) -> Result<DataFrame> {
        let df = catch_panic(sql::plan_sql(&self.ctx, sql)).await?;
        self.check_runs_here(df)
    }

    /// Plans one parsed statement.
    pub async fn plan(&self, statement: Statement) -> Result<DataFrame> {
        let df = catch_panic(sql::plan_statement(&self.ctx, statement)).await?;
        self.check_runs_here(df)
    }

    /// `df`, unless this is a cluster session and `df` calls a function
    /// only this process has (a Python function): a Plan error naming it,
    /// before anything is sent to the scheduler.
    fn check_runs_here(&self, df: DataFrame) -> Result<DataFrame> {
        if self.scale_out.is_some() {
            use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
            use sqlfeed_udfs::user::{FunctionOrigin, as_user_function};
            let mut local = None;
            df.logical_plan().apply_with_subqueries(|node| {
                for expr in node.expressions() {
                    expr.apply(|e| {
                        if let datafusion::logical_expr::Expr::ScalarFunction(call) = e
                            && let Some(user) = as_user_function(&call.func)
                            && matches!(user.origin(), FunctionOrigin::Python { .. })
                        {
                            local.get_or_insert_with(|| {
                                (call.func.name().to_string(), user.origin().describe())
                            });
                        }
                        Ok(TreeNodeRecursion::Continue)
                    })?;
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
            if let Some((name, origin)) = local {
                return plan_err!(
                    "function '{name}' is a {origin}, which cannot run on a Ballista \
                     cluster: executors are sqlfeed processes without your Python \
                     interpreter. Run this query on the embedded engine (a session \
                     without a cluster), or write the function as a Rust plugin \
                     (examples/udf-plugin) and start the scheduler and executors with \
                     --plugin-dir"
                );
            }
        }
        Ok(df)
    }

    /// Runs `df` and collects its batches, turning a panic inside the engine
    /// or a dependency into an error.
    pub async fn collect(&self, df: DataFrame) -> Result<Vec<RecordBatch>> {
        if self.scale_out.is_some() {
            let plan = catch_panic(df.create_physical_plan()).await?;
            let stream = self.execute_stream(plan)?;
            return catch_panic(datafusion::physical_plan::common::collect(stream)).await;
        }
        catch_panic(df.collect()).await
    }

    /// Starts `plan` and returns its output as one stream whose panics become
    /// errors. Dropping the stream cancels the query.
    pub fn execute_stream(
        &self,
        plan: Arc<dyn ExecutionPlan>,
    ) -> Result<SendableRecordBatchStream> {
        let plan = match &self.scale_out {
            Some(scale_out) => scale_out.watch(plan),
            None => plan,
        };
        let task_ctx = self.ctx.task_ctx();
        let stream = std::panic::catch_unwind(AssertUnwindSafe(|| {
            datafusion::physical_plan::execute_stream(plan, task_ctx)
        }))
        .map_err(|panic| panic_error(&panic))??;
        Ok(catching_panics(stream))
    }
}

/// Parses sizes like `512M`, `4G`, `1.5GiB`, `1048576` or `25%` (of the
/// available memory: physical RAM or the cgroup limit, whichever is lower).
pub fn parse_memory_size(text: &str) -> std::result::Result<usize, String> {
    let text = text.trim();
    if let Some(percent) = text.strip_suffix('%') {
        let percent: f64 = percent
            .trim()
            .parse()
            .map_err(|_| format!("invalid memory size '{text}': expected e.g. 25%"))?;
        if !(percent > 0.0 && percent <= 100.0) {
            return Err(format!(
                "invalid memory size '{text}': percent must be in (0, 100]"
            ));
        }
        return Ok(
            (available_memory().unwrap_or(FALLBACK_MEMORY_LIMIT * 2) as f64 * percent
                / 100.0) as usize,
        );
    }
    let upper = text.to_ascii_uppercase();
    let digits_end = upper
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(upper.len());
    let (number, unit) = upper.split_at(digits_end);
    let number: f64 = number.parse().map_err(|_| {
        format!(
            "invalid memory size '{text}': expected a number with K, M, G or T, e.g. 4G"
        )
    })?;
    let scale: u64 = match unit.trim().trim_end_matches("IB").trim_end_matches('B') {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        other => {
            return Err(format!(
                "invalid memory size '{text}': unknown unit '{other}', use K, M, G or T"
            ));
        }
    };
    let bytes = number * scale as f64;
    if bytes < 1.0 {
        return Err(format!("invalid memory size '{text}': must be positive"));
    }
    Ok(bytes as usize)
}

/// [`DEFAULT_MEMORY_FRACTION`] of the memory this process may use: physical
/// RAM, or the memory limit of its cgroup (a container's `--memory`, read
/// from `/sys/fs/cgroup`, v1 or v2) where that is lower. Sized from RAM
/// alone, a session in a container would never spill and be killed instead.
pub fn default_memory_limit() -> usize {
    available_memory()
        .map(|total| (total as f64 * DEFAULT_MEMORY_FRACTION) as usize)
        .unwrap_or(FALLBACK_MEMORY_LIMIT)
}

/// The lower of physical RAM and this process's cgroup memory limit.
fn available_memory() -> Option<usize> {
    let cgroup = cgroup::memory_limit().map(|b| usize::try_from(b).unwrap_or(usize::MAX));
    match (physical_memory(), cgroup) {
        (Some(ram), Some(limit)) => Some(ram.min(limit)),
        (ram, limit) => ram.or(limit),
    }
}

/// Creates the session's spill folder in `spill_dir` (else the OS temp
/// directory), first removing the folders there that killed sessions left.
fn spill_folder(spill_dir: Option<&Path>) -> Result<liveness::LiveFolder> {
    let parent = spill_dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
    std::fs::create_dir_all(&parent).map_err(|e| {
        exec_datafusion_err!(
            "cannot create spill directory '{}': {e}. Set --spill-dir \
             (SessionBuilder::spill_dir) to a writable folder",
            parent.display()
        )
    })?;
    liveness::sweep_abandoned(&parent, SPILL_FOLDER_PREFIX);
    let prefix = format!("{SPILL_FOLDER_PREFIX}{}-", std::process::id());
    liveness::LiveFolder::create(&parent, &prefix).map_err(|e| {
        exec_datafusion_err!(
            "cannot create a spill folder in '{}': {e}. Set --spill-dir \
             (SessionBuilder::spill_dir) to a writable folder",
            parent.display()
        )
    })
}

/// Total physical memory from `/proc/meminfo`.
fn physical_memory() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn num_cores() -> usize {
    std::thread::available_parallelism()
        .map(NonZeroUsize::get)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes_parse_with_units() {
        assert_eq!(parse_memory_size("1024"), Ok(1024));
        assert_eq!(parse_memory_size("512M"), Ok(512 << 20));
        assert_eq!(parse_memory_size("4G"), Ok(4 << 30));
        assert_eq!(parse_memory_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_memory_size("2gb"), Ok(2 << 30));
        assert!(parse_memory_size("25%").is_ok_and(|b| b > 0));
    }

    #[test]
    fn bad_memory_sizes_say_what_is_expected() {
        for bad in ["", "G", "4X", "-1G", "0", "200%"] {
            let err = parse_memory_size(bad).expect_err(bad);
            assert!(err.contains("invalid memory size"), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn session_runs_sql_with_the_given_limit() -> Result<()> {
        let session = Session::builder()
            .memory_limit(64 << 20)
            .target_partitions(2)
            .build()?;
        assert_eq!(session.memory_limit(), 64 << 20);
        let batches = session
            .collect(session.sql("SELECT 40 + 2 AS answer").await?)
            .await?;
        assert_eq!(batches[0].num_rows(), 1);
        Ok(())
    }
}
