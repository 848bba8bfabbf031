//! Delta Lake tables, read through `deltalake-core`'s DataFusion provider,
//! at a version that a feed pins.
//!
//! A Delta table is a folder of Parquet files plus a `_delta_log/` that says
//! which files make each version: an overwrite or a delete leaves the old
//! files in place, removed only in the log. So a folder with a log is never
//! listed as loose files; it is opened as the table it is, at the version
//! its name asks for:
//!
//! ```text
//!  FROM 'tables/events/'                     newest version (pinned by a feed)
//!  FROM 'tables/events/' VERSION AS OF 3     version 3      ─┐ rewritten at the
//!  FROM 'tables/events/' TIMESTAMP AS OF '…' newest ≤ time  ─┤ token level into
//!  FROM 'tables/events/@v3'                  version 3      ◄┘ Databricks' `@v`
//!  FROM 'tables/events/@2026-01-02T00:00:00Z' newest at or before the time
//!  FROM 'tables/events/@latest'              newest, never pinned
//!       │
//!       ▼ log replay (deltalake-core) ── a version older than the newest:
//!       │                                every file it needs must still exist
//!       ▼                                (VACUUM removes them) → else an error
//!  DeltaSnapshotTable { DeltaScan provider, table, version }
//! ```
//!
//! # Pinned in feeds
//! A table named without a version is read at its newest version, which
//! moves when someone commits. A feed reads the same rows every epoch and
//! resumes on the same rows, so when it is built [`pin_versions`] resolves
//! each such table once and rewrites its name to `'…@v<n>'`; the versions go
//! into its checkpoints, and a resume reads them again even if the table
//! moved on (and says so in the log). `'…@latest'` opts out.
//!
//! # What is not yet supported
//! The provider is `deltalake-core`'s, so deletion vectors and column
//! mapping read correctly; what needs the file and row of every row
//! (`explain_batch`, provenance) is refused by name. Delta tables on a
//! Ballista cluster are not supported yet: the provider's scan has no
//! codec in sqlfeed's cluster wire format.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use datafusion::arrow::array::{
    Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{
    Session as CatalogSession, TableProvider, TableProviderFactory,
};
use datafusion::common::{Statistics, exec_err, internal_err, plan_err};
use datafusion::common::{internal_datafusion_err, plan_datafusion_err};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{
    CreateExternalTable, Expr, TableProviderFilterPushDown, TableType,
};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use deltalake_core::DeltaTable;
use deltalake_core::kernel::Version;
use deltalake_core::logstore::{LogStore, StorageConfig, default_logstore};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

/// The folder that marks a Delta Lake table.
const DELTA_LOG: &str = "_delta_log";

/// Which version of a table a name asks for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DeltaAt {
    /// The newest version (pinned by a feed when named without a suffix).
    Latest,
    /// Exactly this version.
    Version(Version),
    /// The newest version committed at or before this time.
    Timestamp(DateTime<Utc>),
}

impl std::fmt::Display for DeltaAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeltaAt::Latest => write!(f, "the newest version"),
            DeltaAt::Version(v) => write!(f, "version {v}"),
            DeltaAt::Timestamp(t) => write!(f, "the version as of {}", t.to_rfc3339()),
        }
    }
}

/// Splits `'…@v3'`, `'…@latest'` and `'…@<RFC 3339 time>'` into the table
/// and the version asked for; `None` when the name has no such suffix (an
/// `@` elsewhere in a path is part of the path).
pub(crate) fn split_version(name: &str) -> Option<(&str, DeltaAt)> {
    let (table, suffix) = name.rsplit_once('@')?;
    if table.is_empty() {
        return None;
    }
    let at = if suffix.eq_ignore_ascii_case("latest") {
        DeltaAt::Latest
    } else if let Some(digits) = suffix.strip_prefix('v')
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
    {
        DeltaAt::Version(digits.parse().ok()?)
    } else {
        DeltaAt::Timestamp(
            DateTime::parse_from_rfc3339(suffix)
                .ok()?
                .with_timezone(&Utc),
        )
    };
    Some((table, at))
}

/// Whether the folder `prefix` of `store` holds a `_delta_log/`.
pub(crate) async fn is_table(store: &dyn ObjectStore, prefix: &Path) -> bool {
    let log = prefix.clone().join(DELTA_LOG);
    store
        .list(Some(&log))
        .next()
        .await
        .is_some_and(|first| first.is_ok())
}

/// The URL of the table folder `name` (a path or URL), with the store that
/// holds it, from `state`'s registry (so S3, GCS, Azure and HTTP are read
/// with the session's own credentials and endpoints).
fn table_location(
    state: &SessionState,
    name: &str,
) -> Result<(url::Url, Arc<dyn ObjectStore>, Path)> {
    let folder = if name.ends_with('/') {
        name.to_string()
    } else {
        format!("{name}/")
    };
    let listing = ListingTableUrl::parse(&folder)
        .map_err(|e| plan_datafusion_err!("'{name}' is not a valid path or URL: {e}"))?;
    let store = state.runtime_env().object_store(&listing)?;
    let url: &url::Url = listing.as_ref();
    Ok((url.clone(), store, listing.prefix().clone()))
}

/// The Delta table `name`, not loaded yet, on `state`'s object stores.
async fn unloaded(state: &SessionState, name: &str, at: &DeltaAt) -> Result<DeltaTable> {
    let (url, root_store, prefix) = table_location(state, name)?;
    if !is_table(root_store.as_ref(), &prefix).await {
        return plan_err!(
            "'{name}' is not a Delta Lake table: it has no {DELTA_LOG}/ folder (a version \
             suffix such as @v3 or VERSION AS OF applies to Delta tables only)"
        );
    }
    let storage = StorageConfig::default();
    let prefixed = storage
        .decorate_store(Arc::clone(&root_store), &url)
        .map_err(|e| delta_error(name, at, e))?;
    let log_store = default_logstore(Arc::new(prefixed), root_store, &url, &storage);
    Ok(DeltaTable::new(log_store))
}

/// The newest version of the Delta table `name`: a listing of its log,
/// without replaying it.
async fn newest_version(state: &SessionState, name: &str) -> Result<Version> {
    unloaded(state, name, &DeltaAt::Latest)
        .await?
        .get_latest_version()
        .await
        .map_err(|e| delta_error(name, &DeltaAt::Latest, e))
}

/// Opens the Delta table `name` at `at` with `state`'s object stores.
async fn load(state: &SessionState, name: &str, at: &DeltaAt) -> Result<DeltaTable> {
    let mut table = unloaded(state, name, at).await?;
    let loaded = match at {
        DeltaAt::Latest => table.load().await,
        DeltaAt::Version(version) => table.load_version(*version).await,
        DeltaAt::Timestamp(time) => table.load_with_datetime(*time).await,
    };
    if let Err(e) = loaded {
        // The kernel's words for a damaged log name neither the version nor
        // the file ("Json error: Truncated record", a `ParsedLogPath`
        // struct): read the log ourselves for those.
        let store = table.log_store().object_store(None);
        if let Some(damage) = damaged_log(store.as_ref()).await {
            return exec_err!(
                "cannot read {at} of the Delta Lake table '{name}': {damage}"
            );
        }
        let newest = match table.get_latest_version().await {
            Ok(newest) => format!(" (its newest version is {newest})"),
            Err(_) => String::new(),
        };
        return plan_err!(
            "cannot read {at} of the Delta Lake table '{name}'{newest}: {e}; DESCRIBE \
             HISTORY '{name}' lists its versions"
        );
    }
    if let DeltaAt::Timestamp(time) = at {
        check_committed_by(name, &table, *time).await?;
    }
    Ok(table)
}

/// Fails when `table`'s loaded version was committed after `time`:
/// deltalake answers a time before the first commit with the first
/// version, which did not exist then. The commit's time is its log file's,
/// as deltalake's own search compares.
async fn check_committed_by(
    name: &str,
    table: &DeltaTable,
    time: DateTime<Utc>,
) -> Result<()> {
    let version = loaded_version(name, table)?;
    let commit = deltalake_core::logstore::commit_uri_from_version(Some(version));
    let committed = table
        .log_store()
        .object_store(None)
        .head(&commit)
        .await
        .map_err(|e| delta_error(name, &DeltaAt::Timestamp(time), e))?
        .last_modified;
    if committed > time {
        return plan_err!(
            "the Delta Lake table '{name}' has no version as of {}: its oldest readable \
             version ({version}) was committed at {}",
            time.to_rfc3339(),
            committed.to_rfc3339()
        );
    }
    Ok(())
}

/// What is wrong with the commit log of the table `store` is rooted at, in
/// words naming the version and its file: a commit missing between the
/// newest checkpoint and the newest commit, or a commit file with a line
/// that is not JSON (cut short by a failed copy). `None` when the log reads
/// well (the failure lies elsewhere) or cannot be listed.
async fn damaged_log(store: &dyn ObjectStore) -> Option<String> {
    let log = Path::from(DELTA_LOG);
    let mut commits = std::collections::BTreeMap::new();
    let mut checkpoint: Option<Version> = None;
    let mut listing = store.list(Some(&log));
    while let Some(meta) = listing.next().await {
        let meta = meta.ok()?;
        let Some(file) = meta.location.filename() else {
            continue;
        };
        let Some((digits, kind)) = file.split_once('.') else {
            continue;
        };
        // Log files are named by 20 digits of their version.
        let Some(version) = (digits.len() == 20)
            .then(|| digits.parse::<Version>().ok())
            .flatten()
        else {
            continue;
        };
        if kind == "json" {
            commits.insert(version, meta.location);
        } else if kind.starts_with("checkpoint") {
            checkpoint = checkpoint.max(Some(version));
        }
    }
    let newest = *commits.keys().next_back()?;
    // Below the newest checkpoint, commits may be cleaned up; above it the
    // log is replayed commit by commit, so each must be there and whole.
    let first = match checkpoint {
        Some(checkpoint) => checkpoint + 1,
        None => 0,
    };
    for version in first..=newest {
        let Some(location) = commits.get(&version) else {
            let next = commits.range(version..).next().map_or(newest, |(v, _)| *v);
            return Some(format!(
                "its commit log has no version {version}: {DELTA_LOG}/{version:020}.json is \
                 missing between {} and version {next}. Restore the file from a backup, or \
                 read an earlier version (@v{})",
                match version.checked_sub(1) {
                    Some(before)
                        if commits.contains_key(&before)
                            || checkpoint == Some(before) =>
                        format!("version {before}"),
                    _ => "the start of the log".to_string(),
                },
                version.saturating_sub(1)
            ));
        };
        let bytes = store.get(location).await.ok()?.bytes().await.ok()?;
        let text = String::from_utf8_lossy(&bytes);
        for (number, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            if let Err(e) = serde_json::from_str::<serde_json::Value>(line) {
                return Some(format!(
                    "version {version}'s commit {location} is damaged: line {} of its {} \
                     bytes is not JSON ({e}), as when a copy was cut short. Restore the \
                     file from a backup, or read an earlier version (@v{})",
                    number + 1,
                    bytes.len(),
                    version.saturating_sub(1)
                ));
            }
        }
    }
    None
}

fn delta_error(name: &str, at: &DeltaAt, e: impl std::fmt::Display) -> DataFusionError {
    plan_datafusion_err!("cannot read {at} of the Delta Lake table '{name}': {e}")
}

/// The loaded version of `table`.
fn loaded_version(name: &str, table: &DeltaTable) -> Result<Version> {
    table.version().ok_or_else(|| {
        internal_datafusion_err!("the Delta table '{name}' loaded no version")
    })
}

/// Fails naming the first file of `table`'s loaded version that is gone: an
/// old version's files are deleted by VACUUM once no newer version needs
/// them, and reading it would fail later, in the middle of a feed.
async fn check_files_exist(name: &str, table: &DeltaTable) -> Result<()> {
    let store = table.log_store().object_store(None);
    version_files(name, table, &store, &Path::default()).await?;
    Ok(())
}

/// The files of `table`'s loaded version, as `store` (where the table is
/// at `prefix`) lists them; a missing one is an error naming it (see
/// [`check_files_exist`]).
async fn version_files(
    name: &str,
    table: &DeltaTable,
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
) -> Result<Vec<object_store::ObjectMeta>> {
    let version = loaded_version(name, table)?;
    let paths: Vec<Path> = table
        .snapshot()
        .map_err(|e| delta_error(name, &DeltaAt::Version(version), e))?
        .log_data()
        .into_iter()
        .map(|file| {
            Path::from_iter(prefix.parts().chain(file.object_store_path().parts()))
        })
        .collect();
    let mut heads = futures::stream::iter(paths)
        .map(|path| {
            let store = Arc::clone(store);
            async move { (store.head(&path).await, path) }
        })
        .buffered(32);
    let mut files = vec![];
    while let Some((head, path)) = heads.next().await {
        match head {
            Ok(meta) => files.push(meta),
            Err(object_store::Error::NotFound { .. }) => {
                return plan_err!(
                    "version {version} of the Delta Lake table '{name}' can no longer be \
                     read: its file '{path}' is gone (VACUUM deletes the files that only \
                     old versions need). Read a newer version (DESCRIBE HISTORY '{name}' \
                     lists them); a checkpoint pinned to this one resumes only once the \
                     files are restored"
                );
            }
            Err(e) => return Err(delta_error(name, &DeltaAt::Version(version), e)),
        }
    }
    Ok(files)
}

/// `VERIFY` of the table `name` at `at`: the Parquet files of that version,
/// in the log's order, with the store they are read from.
pub(crate) async fn verify_files(
    state: &SessionState,
    name: &str,
    at: DeltaAt,
) -> Result<(Arc<dyn ObjectStore>, Vec<super::VerifyFile>)> {
    let (_, store, prefix) = table_location(state, name)?;
    let table = load(state, name, &at).await?;
    let base = name.trim_end_matches('/');
    let files = version_files(name, &table, &store, &prefix)
        .await?
        .into_iter()
        .map(|meta| {
            let display = match meta.location.prefix_match(&prefix) {
                Some(rest) => {
                    let rest: Vec<_> = rest.map(|p| p.as_ref().to_string()).collect();
                    format!("{base}/{}", rest.join("/"))
                }
                None => meta.location.to_string(),
            };
            super::VerifyFile { display, meta }
        })
        .collect();
    Ok((store, files))
}

/// The table `name` at `at`, as a DataFusion table provider.
pub(crate) async fn open(
    state: &SessionState,
    name: &str,
    at: DeltaAt,
) -> Result<Arc<dyn TableProvider>> {
    let table = load(state, name, &at).await?;
    let version = loaded_version(name, &table)?;
    // Only versions older than the newest can have lost files to VACUUM
    // (a feed's pinned table is opened every epoch: no HEADs in the usual
    // case).
    if at != DeltaAt::Latest
        && table
            .get_latest_version()
            .await
            .is_ok_and(|newest| newest > version)
    {
        check_files_exist(name, &table).await?;
    }
    let inner = table
        .table_provider()
        .with_session(Arc::new(state.clone()))
        .await?;
    Ok(Arc::new(DeltaSnapshotTable {
        inner,
        definition: format!(
            "CREATE EXTERNAL TABLE STORED AS DELTA LOCATION '{}@v{version}'",
            name.replace('\'', "''")
        ),
    }))
}

/// One version of a Delta table: `deltalake-core`'s provider, with the
/// table and version it reads as its definition (the epoch cache keys on
/// it: deletion vectors change a version's rows without changing its
/// Parquet files).
#[derive(Debug)]
pub struct DeltaSnapshotTable {
    inner: Arc<dyn TableProvider>,
    definition: String,
}

#[async_trait]
impl TableProvider for DeltaSnapshotTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    fn get_table_definition(&self) -> Option<&str> {
        Some(&self.definition)
    }

    async fn scan(
        &self,
        state: &dyn CatalogSession,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.inner.scan(state, projection, filters, limit).await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.inner.statistics()
    }
}

/// `CREATE EXTERNAL TABLE name STORED AS DELTA LOCATION '<path>'`: the
/// table at the version its location names (`'…@v3'`), else at its newest
/// version when the statement runs; the catalog table keeps that version
/// until it is created again (a feed's checkpoint lists its files, so a
/// resume after a re-creation over a newer version is noticed).
#[derive(Debug, Default)]
pub struct DeltaTableFactory;

#[async_trait]
impl TableProviderFactory for DeltaTableFactory {
    async fn create(
        &self,
        state: &dyn CatalogSession,
        cmd: &CreateExternalTable,
    ) -> Result<Arc<dyn TableProvider>> {
        let Some(state) = state.as_any().downcast_ref::<SessionState>() else {
            return internal_err!("a Delta table is created in a SessionState");
        };
        let [location] = cmd.locations.as_slice() else {
            return plan_err!(
                "CREATE EXTERNAL TABLE {} STORED AS DELTA takes one LOCATION, got {}",
                cmd.name,
                cmd.locations.len()
            );
        };
        let (table, at) =
            split_version(location).unwrap_or((location.as_str(), DeltaAt::Latest));
        open(state, table, at).await
    }
}

/// `DESCRIBE HISTORY '<table>'`: one row per commit, newest first.
pub(crate) async fn history(state: &SessionState, name: &str) -> Result<RecordBatch> {
    let table = load(state, name, &DeltaAt::Latest).await?;
    let newest = loaded_version(name, &table)?;
    let commits: Vec<_> = table
        .history(None)
        .try_collect()
        .await
        .map_err(|e| delta_error(name, &DeltaAt::Latest, e))?;
    let mut versions = vec![];
    let mut times = vec![];
    let mut operations = vec![];
    let mut parameters = vec![];
    let mut engines = vec![];
    // Newest first and consecutive: the log keeps every commit since its
    // oldest retained one.
    for (back, commit) in commits.iter().enumerate() {
        versions.push(newest as i64 - back as i64);
        times.push(commit.timestamp);
        operations.push(commit.operation.clone());
        parameters.push(
            commit
                .operation_parameters
                .as_ref()
                .map(|p| serde_json::to_string(p).unwrap_or_default()),
        );
        engines.push(commit.engine_info.clone());
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("version", DataType::Int64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("operation", DataType::Utf8, true),
        Field::new("operation_parameters", DataType::Utf8, true),
        Field::new("engine_info", DataType::Utf8, true),
    ]));
    Ok(RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(versions)),
            Arc::new(TimestampMillisecondArray::from(times).with_timezone("UTC")),
            Arc::new(StringArray::from(operations)),
            Arc::new(StringArray::from(parameters)),
            Arc::new(StringArray::from(engines)),
        ],
    )?)
}

/// Rewrites `'<table>' VERSION AS OF <n>` and `'<table>' TIMESTAMP AS OF
/// '<time>'` into `'<table>@v<n>'` and `'<table>@<time>'` (the generic
/// dialect has no time travel; the Databricks suffix is what the table
/// factory reads).
pub(crate) fn rewrite_time_travel(
    mut tokens: Vec<datafusion::sql::sqlparser::tokenizer::TokenWithSpan>,
) -> Result<Vec<datafusion::sql::sqlparser::tokenizer::TokenWithSpan>> {
    let significant =
        |tokens: &[datafusion::sql::sqlparser::tokenizer::TokenWithSpan],
         from: usize|
         -> Vec<usize> {
            (from..tokens.len())
                .filter(|&i| {
                    !matches!(tokens[i].token, Token::Whitespace(_) | Token::EOF)
                })
                .take(5)
                .collect()
        };
    let word = |token: &Token, w: &str| matches!(token, Token::Word(x) if x.value.eq_ignore_ascii_case(w));
    let mut at = 0;
    while at < tokens.len() {
        let Token::SingleQuotedString(table) = &tokens[at].token else {
            at += 1;
            continue;
        };
        let next = significant(&tokens, at + 1);
        let [kind, as_, of, value] = match next.as_slice() {
            [a, b, c, d, ..] => [*a, *b, *c, *d],
            _ => break,
        };
        let travel = word(&tokens[as_].token, "AS") && word(&tokens[of].token, "OF");
        let suffix = if travel && word(&tokens[kind].token, "VERSION") {
            match &tokens[value].token {
                Token::Number(n, _) if n.bytes().all(|b| b.is_ascii_digit()) => {
                    format!("v{n}")
                }
                other => {
                    return plan_err!(
                        "VERSION AS OF takes a version number (0, 1, …), found {other}"
                    );
                }
            }
        } else if travel && word(&tokens[kind].token, "TIMESTAMP") {
            match &tokens[value].token {
                Token::SingleQuotedString(time) => {
                    let parsed = parse_time(time)?;
                    parsed.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
                }
                other => {
                    return plan_err!(
                        "TIMESTAMP AS OF takes a quoted time ('2026-01-02T03:04:05Z'), \
                         found {other}"
                    );
                }
            }
        } else {
            at += 1;
            continue;
        };
        if split_version(table).is_some() {
            return plan_err!(
                "'{table}' already names a version; remove its @ suffix or the AS OF clause"
            );
        }
        let renamed = format!("{table}@{suffix}");
        tokens[at].token = Token::SingleQuotedString(renamed);
        tokens.drain(at + 1..=value);
        at += 1;
    }
    Ok(tokens)
}

/// A time as `TIMESTAMP AS OF` takes it: RFC 3339, or a date and time
/// without a zone (UTC), or a date (midnight UTC).
fn parse_time(text: &str) -> Result<DateTime<Utc>> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(time) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Ok(time.and_utc());
        }
    }
    if let Ok(date) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(date.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    plan_err!(
        "TIMESTAMP AS OF '{text}': not a time; write '2026-01-02T03:04:05Z', \
         '2026-01-02 03:04:05' (UTC) or '2026-01-02'"
    )
}

/// The Delta tables `sql` names without a version, pinned: each at
/// `pins[name]` if given (a checkpoint's), else at its newest version now.
/// Returns `sql` with each such name rewritten to `'…@v<n>'`, and the
/// versions by name (see the module docs).
pub async fn pin_versions(
    state: &SessionState,
    sql: &str,
    pins: &BTreeMap<String, u64>,
) -> Result<(String, BTreeMap<String, u64>)> {
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        // Not ours to report: the planner says what is wrong with it.
        return Ok((sql.to_string(), BTreeMap::new()));
    };
    let mut versions = BTreeMap::new();
    let mut out = String::with_capacity(sql.len());
    for token in tokens {
        if let Token::SingleQuotedString(name) = &token
            && super::looks_like_path(name)
            && split_version(name).is_none()
            && !name.contains(['*', '?', '['])
            && let Ok((_, store, prefix)) = table_location(state, name)
            && is_table(store.as_ref(), &prefix).await
        {
            let newest = newest_version(state, name).await?;
            let version = match pins.get(name.as_str()) {
                Some(pinned) => {
                    if newest != *pinned {
                        log::info!(
                            "the Delta table '{name}' is at version {newest} now; the \
                             feed reads version {pinned}, which its checkpoint pinned"
                        );
                    }
                    *pinned
                }
                None => newest,
            };
            versions.insert(name.clone(), version);
            out.push_str(
                &Token::SingleQuotedString(format!("{name}@v{version}")).to_string(),
            );
        } else {
            out.push_str(&token.to_string());
        }
    }
    Ok((out, versions))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_suffix_is_read_only_where_it_is_one() {
        assert_eq!(
            split_version("t/events@v12"),
            Some(("t/events", DeltaAt::Version(12)))
        );
        assert_eq!(
            split_version("t/events@LATEST"),
            Some(("t/events", DeltaAt::Latest))
        );
        assert!(matches!(
            split_version("s3://b/t@2026-01-02T03:04:05Z"),
            Some(("s3://b/t", DeltaAt::Timestamp(_)))
        ));
        assert_eq!(split_version("t/user@host/x.parquet"), None);
        assert_eq!(split_version("t/events@v"), None);
        assert_eq!(split_version("@v1"), None);
    }

    fn rewritten(sql: &str) -> Result<String> {
        let tokens = Tokenizer::new(&GenericDialect {}, sql)
            .tokenize_with_location()
            .map_err(|e| plan_datafusion_err!("{e}"))?;
        Ok(rewrite_time_travel(tokens)?
            .iter()
            .map(|t| t.token.to_string())
            .collect())
    }

    #[test]
    fn time_travel_clauses_become_version_suffixes() -> Result<()> {
        assert_eq!(
            rewritten("SELECT * FROM 't/e' VERSION AS OF 3 WHERE x = 1")?,
            "SELECT * FROM 't/e@v3' WHERE x = 1"
        );
        assert_eq!(
            rewritten("SELECT * FROM 't/e' timestamp as of '2026-01-02' AS a")?,
            "SELECT * FROM 't/e@2026-01-02T00:00:00Z' AS a"
        );
        assert_eq!(rewritten("SELECT 'version' AS v")?, "SELECT 'version' AS v");
        let err = rewritten("SELECT * FROM 't/e' VERSION AS OF 'x'").unwrap_err();
        assert!(err.to_string().contains("takes a version number"), "{err}");
        let err = rewritten("SELECT * FROM 't/e' TIMESTAMP AS OF 'soon'").unwrap_err();
        assert!(err.to_string().contains("not a time"), "{err}");
        let err = rewritten("SELECT * FROM 't/e@v1' VERSION AS OF 2").unwrap_err();
        assert!(err.to_string().contains("already names a version"), "{err}");
        Ok(())
    }
}
