//! [`SessionBuilder`]: a session's limits, stores, plugins and scale-out,
//! and how they become the runtime and context of a [`Session`].

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::common::{config_datafusion_err, plan_err};
use datafusion::error::Result;
use datafusion::execution::cache::cache_manager::CacheManagerConfig;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{FairSpillPool, MemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::prelude::{SessionConfig, SessionContext};

use super::scale_out::InstallScaleOut;
use super::{
    SPILL_MERGE_FAN_IN, Session, create_function, default_memory_limit, num_cores,
    object_stores, plugins, spill_folder,
};
use crate::cache::{CacheOptions, CacheStore, liveness};
use crate::config::SqlfeedOptions;
use crate::sql::{self};
use object_stores::{IoCounters, ObjectStoreLimits};

/// Configures and builds a [`Session`].
#[derive(Debug, Clone, Default)]
pub struct SessionBuilder {
    /// Bytes of memory all operators of a query share; `None` = default fraction.
    pub(super) memory_limit: Option<usize>,
    /// Parallelism of scans and operators; `None` = number of cores.
    pub(super) target_partitions: Option<usize>,
    /// Directory in which the session's spill folder is created; `None` =
    /// the OS temp directory.
    pub(super) spill_dir: Option<PathBuf>,
    /// Rows per record batch inside the engine; `None` = DataFusion's default.
    pub(super) batch_size: Option<usize>,
    /// Timeouts and retries for network object stores.
    pub(super) object_store_limits: ObjectStoreLimits,
    /// Whether plain `http://` object-store URLs are read; `None` =
    /// [`ALLOW_HTTP_ENV`], else no.
    pub(super) allow_http: Option<bool>,
    /// Settings of the preprocessing functions (image pixel limit, …).
    pub(super) udf_options: sqlfeed_udfs::UdfOptions,
    /// Where and how much `CACHE TABLE` and cached feeds keep.
    pub(super) cache: CacheOptions,
    /// Where queries run instead of this process (a Ballista cluster,
    /// installed by `crate::cluster`); `None` = the embedded engine.
    pub(super) scale_out: Option<Arc<dyn InstallScaleOut>>,
    /// `sqlfeed.executor_cache_dir`.
    pub(super) executor_cache_dir: Option<String>,
    /// Plugin libraries to load, in order.
    pub(super) plugins: Vec<PathBuf>,
    /// Folders whose every library is a plugin to load.
    pub(super) plugin_dirs: Vec<PathBuf>,
    /// `SET key = value` statements applied to the built session, in order.
    pub(super) settings: Vec<(String, String)>,
    /// Functions this process hosts besides sqlfeed's and its plugins'
    /// (an executor's Python functions).
    pub(super) hosted: Vec<Arc<ScalarUDF>>,
}

impl SessionBuilder {
    /// `set(self, value)` for an option that is given, `self` unchanged
    /// for one that is not: `builder.given(n, SessionBuilder::batch_size)`,
    /// for callers that hold their options as `Option`s (the CLI, Python).
    pub fn given<T>(self, value: Option<T>, set: impl FnOnce(Self, T) -> Self) -> Self {
        match value {
            Some(value) => set(self, value),
            None => self,
        }
    }

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

    /// Adds `functions`, which this process hosts, to sqlfeed's and the
    /// plugins' functions: what `sqlfeed executor --function-dir` does with
    /// the Python functions of its folders, so that stage plans naming them
    /// run here. A name taken by another function fails `build` (and an
    /// executor's start).
    pub fn host_functions(
        mut self,
        functions: impl IntoIterator<Item = Arc<ScalarUDF>>,
    ) -> Self {
        self.hosted.extend(functions);
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

    /// Sets a session setting, as `SET key = value` would after the build
    /// (`datafusion.…`, `sqlfeed.…`, and on a cluster `ballista.…`, which
    /// travel with every job). `build` fails on an unknown key or a value
    /// the setting cannot take. Later settings of a key win.
    pub fn setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((key.into(), value.into()));
        self
    }

    /// Builds the session; fails if the spill directory cannot be used, a
    /// [`Self::setting`] is refused or, for a cluster session, the scheduler
    /// cannot be reached.
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
        // Last: a cluster client's state holds Ballista's settings only now.
        for (key, value) in &self.settings {
            ctx.state_ref()
                .write()
                .config_mut()
                .options_mut()
                .set(key, value)
                .map_err(|e| {
                    config_datafusion_err!(
                        "cannot set '{key}' to '{value}': {e}; `SHOW ALL` in the shell \
                         lists the settings and their values"
                    )
                })?;
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
            .with_option_extension({
                let mut options = SqlfeedOptions::default();
                options.executor_cache_dir =
                    self.executor_cache_dir.clone().unwrap_or_default();
                options
            })
            // Registered, so that a feed's epoch travels with a cluster job
            // to the scheduler (a MIX's draw) and executors (seeded
            // augmentations); its default (no epoch) changes nothing.
            .with_option_extension(sqlfeed_udfs::augment::AugmentOptions::default());
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
        for hosted in &self.hosted {
            let origin = sqlfeed_udfs::user::as_user_function(hosted).map_or_else(
                || "a hosted function".into(),
                |user| user.origin().describe(),
            );
            if let Some(first) = origins.insert(hosted.name().to_string(), origin.clone())
            {
                return plan_err!(
                    "a function '{}' exists already ({first}); give {origin} another \
                     name (name=...)",
                    hosted.name()
                );
            }
            functions.push(Arc::clone(hosted));
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
