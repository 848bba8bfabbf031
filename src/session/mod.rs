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

mod builder;
mod cgroup;
mod create_function;
mod library_file;
mod scale_out;
use crate::cache::liveness;
pub mod object_stores;
pub mod plugins;

use std::num::NonZeroUsize;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::exec_datafusion_err;
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;

use crate::cache::CacheStore;
pub use crate::config::{PartitionOrder, SqlfeedOptions, deterministic_config};
use crate::exec::{catch_panic, catching_panics, panic_error};
pub use crate::sql::url_table::list_parquet_files;
use crate::sql::{self, Statement};
pub use crate::sql::{file_errors, url_table};
pub use builder::SessionBuilder;
pub use object_stores::{ALLOW_HTTP_ENV, IoCounters, ObjectStoreLimits};
pub use scale_out::{
    CompletedJob, DeferredPads, EpochJob, EpochJobPlan, InstallScaleOut, JobMixture,
    ReadJobs, ReadWindow, ScaleOut, WindowId,
};

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

/// A DataFusion context with sqlfeed's tables, functions and limits; see the
/// module docs.
///
/// # Examples
///
/// Query a folder of Parquet files (here made by `sqlfeed gen`) under a
/// memory budget of 256 MiB:
///
/// ```
/// # fn main() -> datafusion::error::Result<()> {
/// use sqlfeed::datagen::{GenOptions, generate};
///
/// let dir = tempfile::tempdir()?;
/// generate(&GenOptions::new(1000, dir.path()))?;
/// let session = sqlfeed::Session::builder().memory_limit(256 << 20).build()?;
/// let sql = format!(
///     "SELECT label, count(*) AS n FROM '{}/' GROUP BY label ORDER BY label",
///     dir.path().display()
/// );
/// let batches = tokio::runtime::Runtime::new()?
///     .block_on(async { session.sql(&sql).await?.collect().await })?;
/// let labels: usize = batches.iter().map(|batch| batch.num_rows()).sum();
/// assert_eq!(labels, 10);
/// # Ok(())
/// # }
/// ```
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
        catch_panic(sql::plan_sql(&self.ctx, sql)).await
    }

    /// Plans one parsed statement.
    pub async fn plan(&self, statement: Statement) -> Result<DataFrame> {
        catch_panic(sql::plan_statement(&self.ctx, statement)).await
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
