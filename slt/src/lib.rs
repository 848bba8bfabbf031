//! DataFusion's sqllogictest files, and sqlfeed's own, through sqlfeed's SQL
//! layer (issue 20, items 3 and 5).
//!
//! sqlfeed puts its dialect parser in front of DataFusion's: every statement
//! a user writes goes through `sqlfeed::sql::plan_sql`, which must hand
//! DataFusion's SQL on unchanged. This crate runs `.slt` files with
//! DataFusion's runner and validators twice:
//!
//! ```text
//!   file.slt ──► TestContext (DataFusion's, per file: tables, settings)
//!                  │
//!                  ├─► plain:   DataFusion's engine  (ctx.sql)
//!                  └─► sqlfeed: SqlfeedDb            (sqlfeed::sql::plan_sql on the
//!                               same context, plus sqlfeed's functions, shuffle
//!                               planner and read-error rule)
//! ```
//!
//! A file that passes plain must pass through sqlfeed, unless it is listed
//! in [`EXPECTED_DIFFERENCES`] with the reason. The sqlfeed run keeps
//! DataFusion's session settings (partitions, view types) so that plans and
//! types print as the files expect; what it adds is sqlfeed's SQL layer and
//! registrations.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::error::DataFusionError;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_plan::common::collect;
use datafusion::physical_plan::execute_stream;
use datafusion::prelude::SessionContext;
use datafusion_sqllogictest::{
    DFColumnType, DFOutput, DFSqlLogicTestError, DataFusion, TestContext,
    convert_batches, convert_schema_to_types, df_value_validator, value_normalizer,
};
use sqllogictest::{DBOutput, strict_column_validator};

/// DataFusion files that fail through sqlfeed for a reason that is not a
/// bug, with the reason.
pub const EXPECTED_DIFFERENCES: &[(&str, &str)] = &[
    (
        "copy.slt",
        "an incomplete statement's parse error gets the position where the input ends \
         ('Expected: ), found: EOF at the end of the input (Line: 1, Column: 47): the \
         statement is incomplete'); the file matches DataFusion's exact text",
    ),
    (
        "parquet_nested_schema_pruning.slt",
        "an error found while reading a file names the file ('cannot read '…/wide.parquet': \
         Cannot cast column 's' …'); the file matches DataFusion's text without it",
    ),
];

/// How a file is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// DataFusion's own engine on the file's context.
    Plain,
    /// sqlfeed's SQL layer on the same context.
    Sqlfeed,
}

/// An engine for the sqllogictest runner: each statement parsed and planned
/// by sqlfeed, executed and printed as DataFusion's engine does.
pub struct SqlfeedDb {
    ctx: SessionContext,
}

#[async_trait]
impl sqllogictest::AsyncDB for SqlfeedDb {
    type Error = DFSqlLogicTestError;
    type ColumnType = DFColumnType;

    async fn run(&mut self, sql: &str) -> Result<DFOutput, DFSqlLogicTestError> {
        let df = sqlfeed::sql::plan_sql(&self.ctx, sql).await?;
        let task_ctx = Arc::new(df.task_ctx());
        let plan = df.create_physical_plan().await?;
        let schema = plan.schema();
        let stream = execute_stream(plan, task_ctx)?;
        let types = convert_schema_to_types(stream.schema().fields());
        let batches = collect(stream).await?;
        let rows = convert_batches(&schema, batches, false)?;
        if rows.is_empty() && types.is_empty() {
            Ok(DBOutput::StatementComplete(0))
        } else {
            Ok(DBOutput::Rows { types, rows })
        }
    }

    fn engine_name(&self) -> &str {
        "sqlfeed"
    }

    async fn sleep(duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    async fn shutdown(&mut self) {}
}

/// `ctx` with what a sqlfeed session adds to DataFusion: its functions, the
/// shuffle planner and the read-error rule (the catalog is shared).
pub fn with_sqlfeed(ctx: &SessionContext) -> Result<SessionContext, DataFusionError> {
    let state = SessionStateBuilder::new_from_existing(ctx.state())
        .with_physical_optimizer_rule(Arc::new(
            sqlfeed::session::file_errors::NameFileErrors,
        ))
        .with_query_planner(Arc::new(sqlfeed::sql::SqlfeedQueryPlanner::embedded()))
        .build();
    let ctx = SessionContext::new_with_state(state);
    sqlfeed_udfs::register_all(&ctx)?;
    for function in sqlfeed::sql::internal_functions() {
        ctx.register_udf(function);
    }
    Ok(ctx)
}

/// Runs one `.slt` file (`relative` names it as DataFusion's setup knows
/// it); `Err` holds the runner's report.
pub async fn run_file(
    path: &Path,
    relative: &Path,
    engine: Engine,
) -> Result<(), String> {
    let Some(test_ctx) = TestContext::try_new_for_test_file(relative).await else {
        return Err("DataFusion's setup skips this file".into());
    };
    let ctx = test_ctx.session_ctx().clone();
    match engine {
        Engine::Plain => {
            let relative = relative.to_path_buf();
            let mut runner = sqllogictest::Runner::new(move || {
                let ctx = ctx.clone();
                let relative = relative.clone();
                async move {
                    Ok(DataFusion::new(
                        ctx,
                        relative,
                        indicatif::ProgressBar::hidden(),
                    ))
                }
            });
            configure(&mut runner);
            timed(runner.run_file_async(path)).await
        }
        Engine::Sqlfeed => {
            let ctx = with_sqlfeed(&ctx).map_err(|e| e.to_string())?;
            let mut runner = sqllogictest::Runner::new(move || {
                let ctx = ctx.clone();
                async move { Ok(SqlfeedDb { ctx }) }
            });
            configure(&mut runner);
            timed(runner.run_file_async(path)).await
        }
    }
}

/// Runs one of sqlfeed's own `.slt` files in a fresh sqlfeed session (its
/// url tables, epoch cache in a temporary folder, functions and settings).
pub async fn run_sqlfeed_file(path: &Path) -> Result<(), String> {
    let cache = std::env::temp_dir().join(format!(
        "sqlfeed-slt-cache-{}-{}",
        std::process::id(),
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let session = sqlfeed::Session::builder()
        .target_partitions(4)
        .cache_dir(&cache)
        .build()
        .map_err(|e| e.to_string())?;
    let ctx = session.context().clone();
    let mut runner = sqllogictest::Runner::new(move || {
        let ctx = ctx.clone();
        async move { Ok(SqlfeedDb { ctx }) }
    });
    configure(&mut runner);
    let outcome = timed(runner.run_file_async(path)).await;
    drop(session);
    let _ = std::fs::remove_dir_all(&cache);
    outcome
}

fn configure<D, M>(runner: &mut sqllogictest::Runner<D, M>)
where
    D: sqllogictest::AsyncDB,
    M: sqllogictest::MakeConnection<Conn = D>,
{
    // The files' `onlyif`/`skipif` name DataFusion's engine.
    runner.add_label("Datafusion");
    runner.with_column_validator(strict_column_validator);
    runner.with_normalizer(value_normalizer);
    runner.with_validator(df_value_validator);
}

/// A file that runs longer than this is a failure (a hang is one too).
const FILE_TIMEOUT: Duration = Duration::from_secs(300);

async fn timed<E: std::fmt::Display>(
    run: impl std::future::Future<Output = Result<(), E>>,
) -> Result<(), String> {
    match tokio::time::timeout(FILE_TIMEOUT, run).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {FILE_TIMEOUT:?}")),
    }
}

/// The platform rustc builds for by default (`host:` of `rustc -vV`).
fn host_triple() -> Result<String, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = std::process::Command::new(rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("rustc -vV: {e}"))?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(|host| host.trim().to_string())
        .ok_or_else(|| "rustc -vV printed no host triple".to_string())
}

/// The `test_files` folder of the datafusion-sqllogictest crate in use, found
/// with `cargo metadata` (it ships in the crate, not in this repository).
pub fn datafusion_test_files() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    // Offline, cargo can describe only the packages it has downloaded: those
    // of this platform on a machine that built the tests and nothing else.
    let host = host_triple()?;
    let output = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &host,
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata: {e}"))?;
    let package = metadata["packages"]
        .as_array()
        .and_then(|packages| {
            packages
                .iter()
                .find(|p| p["name"] == "datafusion-sqllogictest")
        })
        .ok_or("datafusion-sqllogictest is not in the dependency graph")?;
    let manifest_path = package["manifest_path"]
        .as_str()
        .ok_or("no manifest_path for datafusion-sqllogictest")?;
    let dir = Path::new(manifest_path)
        .parent()
        .ok_or("manifest_path has no folder")?
        .join("test_files");
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!("{} is not a folder", dir.display()))
    }
}

/// The `.slt` files below `dir`, sorted, without the folders that need
/// another engine (`pg_compat`: Postgres) or dialect (`spark`).
pub fn slt_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "pg_compat" && name != "spark" && name != "scratch" {
                    folders.push(path);
                }
            } else if name.ends_with(".slt") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}
