//! Tables named by a path or URL in `FROM`, with checked Parquet footers.
//!
//! DataFusion's own URL tables (`enable_url_table`) answer a missing file with
//! "table not found", pick the format from whatever file lists first (a stray
//! `_meta.json` turns a Parquet folder into a JSON table), report a corrupt
//! footer without naming the file, and merge conflicting schemas with a message
//! that names neither file. [`ParquetUrlTableFactory`] resolves the same
//! `'path'` / `'s3://…'` table names and does it properly:
//!
//! ```text
//!  FROM 'data/month=*/part-*.parquet'
//!       │
//!       ▼ list (names the URL on failure; empty → error naming the glob;
//!       │       a Delta Lake table's folder → its table, see `delta.rs`;
//!       │       a Delta partition folder or an Iceberg table → error,
//!       │       see `table_formats.rs`)
//!  [file 1] [file 2] … [file n]         every footer fetched concurrently,
//!       │       │           │           a panic in the reader caught per file
//!       ▼       ▼           ▼
//!  schema 1  schema 2 … schema n ──► merge: a column whose type differs names
//!                                           the column and both files
//!       │
//!       ▼
//!  ListingTable (+ hive partition columns inferred from `key=value` folders)
//! ```
//!
//! Names that do not look like paths (`trips`, `t1`) are left to the catalog, so
//! an unknown table still says "table not found".

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::Path as FsPath;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::catalog::{TableProvider, UrlTableFactory};
use datafusion::common::plan_err;
use datafusion::common::{
    exec_datafusion_err, internal_datafusion_err, plan_datafusion_err,
};
use datafusion::datasource::dynamic_file::DynamicListTableFactory;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::datasource::{ViewTable, provider_as_source};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion_session::SessionStore;
use futures::{FutureExt, StreamExt, TryStreamExt};
use object_store::ObjectMeta;

use super::folder_glob::FolderGlob;
use super::looks_like_path;
use super::table_formats::{
    TableRoot, refuse_reads_in_tables, table_error, table_roots_at,
};
use crate::exec::panic_message;

/// Resolves path- and URL-named tables; see the module docs.
#[derive(Debug, Default)]
pub struct ParquetUrlTableFactory {
    /// The session whose object stores and options the tables use.
    session_store: SessionStore,
    /// DataFusion's factory, for CSV, JSON, Arrow and Avro files.
    other_formats: DynamicListTableFactory,
}

impl ParquetUrlTableFactory {
    /// A factory whose session is attached later with [`Self::session_store`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Where the owning session registers itself.
    pub fn session_store(&self) -> &SessionStore {
        &self.session_store
    }

    /// Where the fallback factory finds the session.
    pub fn other_formats_session_store(&self) -> &SessionStore {
        self.other_formats.session_store()
    }

    fn state(&self) -> Result<SessionState> {
        self.session_store
            .get_session()
            .upgrade()
            .and_then(|session| {
                session
                    .read()
                    .as_any()
                    .downcast_ref::<SessionState>()
                    .cloned()
            })
            .ok_or_else(|| {
                internal_datafusion_err!("the session of this table factory is gone")
            })
    }
}

#[async_trait]
impl UrlTableFactory for ParquetUrlTableFactory {
    async fn try_new(&self, url: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if !looks_like_path(url) {
            return Ok(None);
        }
        #[cfg(feature = "delta")]
        if let Some((table, at)) = super::delta::split_version(url) {
            return super::delta::open(&self.state()?, table, at)
                .await
                .map(Some);
        }
        if let Some(glob) = FolderGlob::parse(url)? {
            return folder_glob_table(&self.state()?, url, glob).await.map(Some);
        }
        let table_url = parse_table_url(url)?;
        check_local_path_exists(url, &table_url)?;
        let state = self.state()?;
        let store = state.runtime_env().object_store(&table_url)?;
        // A Delta table's folder is read as the table (its newest version),
        // never as the loose files it holds.
        #[cfg(feature = "delta")]
        if !url.contains(['*', '?', '['])
            && super::delta::is_table(store.as_ref(), table_url.prefix()).await
        {
            return super::delta::open(&state, url, super::delta::DeltaAt::Latest)
                .await
                .map(Some);
        }
        let files = list_files(&state, url, &table_url, store.as_ref()).await?;
        refuse_table_folders(url, &table_url, &files, store.as_ref()).await?;
        if files.is_empty() {
            return plan_err!(
                "no files match '{url}': check the path and the glob pattern"
            );
        }
        let parquet: Vec<ObjectMeta> = files
            .iter()
            .filter(|f| f.location.as_ref().ends_with(".parquet"))
            .cloned()
            .collect();
        if parquet.is_empty() {
            // Not Parquet: DataFusion's own inference handles CSV, JSON and friends.
            return match self.other_formats.try_new(url).await? {
                Some(table) => Ok(Some(table)),
                None => plan_err!(
                    "cannot read '{url}': none of its {} files has a known extension \
                     (.parquet, .csv, .json, .arrow, .avro)",
                    files.len()
                ),
            };
        }
        let format = Arc::new(
            ParquetFormat::default().with_options(state.table_options().parquet.clone()),
        );
        let schema =
            checked_schema(&state, &table_url, &store, format.as_ref(), &parquet).await?;
        let options = ListingOptions::new(format).with_file_extension(".parquet");
        let config = ListingTableConfig::new(table_url)
            .with_listing_options(options)
            .with_schema(schema)
            .infer_partitions_from_path(&state)
            .await?;
        let table = ListingTable::try_new(config)?;
        Ok(Some(Arc::new(table)))
    }
}

/// The table of a glob with a wildcard in a folder: DataFusion's
/// `ListingTable` over the folders that hold matches, under the pattern's
/// partition filter (see [`super::folder_glob`]).
async fn folder_glob_table(
    state: &SessionState,
    url: &str,
    glob: FolderGlob,
) -> Result<Arc<dyn TableProvider>> {
    let (store, files) = glob_files(state, url, &glob).await?;
    let parquet: Vec<ObjectMeta> = files
        .into_iter()
        .filter(|f| f.location.as_ref().ends_with(".parquet"))
        .collect();
    if parquet.is_empty() {
        return plan_err!(
            "no .parquet files match '{url}': check the path and the glob pattern"
        );
    }
    let format = Arc::new(
        ParquetFormat::default().with_options(state.table_options().parquet.clone()),
    );
    let schema =
        checked_schema(state, glob.base(), &store, format.as_ref(), &parquet).await?;
    let options = ListingOptions::new(format).with_file_extension(".parquet");
    let config = ListingTableConfig::new_with_multi_paths(glob.roots(&parquet)?)
        .with_listing_options(options)
        .with_schema(schema)
        .infer_partitions_from_path(state)
        .await?;
    let table: Arc<dyn TableProvider> = Arc::new(ListingTable::try_new(config)?);
    let Some(filter) = glob.partition_filter() else {
        return Ok(table);
    };
    let plan =
        LogicalPlanBuilder::scan("__sqlfeed_glob", provider_as_source(table), None)?
            .filter(filter)?
            .build()?;
    Ok(Arc::new(ViewTable::new(plan, Some(url.to_string()))))
}

/// The Parquet files a path, glob or URL names (as `FROM '…'` would read
/// them), in path order, with the store they are read from and the name
/// each is shown by; of a Delta Lake table, its version's files in the log's
/// order. No files, or none of them Parquet, is an error naming `url`.
pub async fn list_parquet_files(
    state: &SessionState,
    url: &str,
) -> Result<(
    Arc<dyn object_store::ObjectStore>,
    Vec<crate::sql::VerifyFile>,
)> {
    #[cfg(feature = "delta")]
    if let Some((table, at)) = super::delta::split_version(url) {
        return super::delta::verify_files(state, table, at).await;
    }
    let (table_url, store, files) = match FolderGlob::parse(url)? {
        Some(glob) => {
            let (store, files) = glob_files(state, url, &glob).await?;
            (glob.base().clone(), store, files)
        }
        None => {
            let table_url = parse_table_url(url)?;
            check_local_path_exists(url, &table_url)?;
            let store = state.runtime_env().object_store(&table_url)?;
            #[cfg(feature = "delta")]
            if !url.contains(['*', '?', '['])
                && super::delta::is_table(store.as_ref(), table_url.prefix()).await
            {
                return super::delta::verify_files(
                    state,
                    url,
                    super::delta::DeltaAt::Latest,
                )
                .await;
            }
            let files = list_files(state, url, &table_url, store.as_ref()).await?;
            refuse_table_folders(url, &table_url, &files, store.as_ref()).await?;
            (table_url, store, files)
        }
    };
    let parquet: Vec<crate::sql::VerifyFile> = files
        .iter()
        .filter(|f| f.location.as_ref().ends_with(".parquet"))
        .map(|f| crate::sql::VerifyFile {
            display: file_display_name(&table_url, f),
            meta: f.clone(),
        })
        .collect();
    if parquet.is_empty() {
        return Err(DataFusionError::Plan(if files.is_empty() {
            format!("no files match '{url}': check the path and the glob pattern")
        } else {
            format!(
                "none of the {} files under '{url}' is a .parquet file",
                files.len()
            )
        }));
    }
    Ok((store, parquet))
}

/// Parses a path or URL; unlike [`ListingTableUrl::parse`], globs work in
/// object-store URLs too (`s3://bucket/train/*.parquet`).
fn parse_table_url(url: &str) -> Result<ListingTableUrl> {
    let invalid = |e: &dyn std::fmt::Display| {
        plan_datafusion_err!("'{url}' is not a valid path or URL: {e}")
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return ListingTableUrl::parse(url).map_err(|e| invalid(&e));
    };
    let glob_start = rest.find(['*', '?', '[']);
    match (scheme, glob_start) {
        ("file", _) | (_, None) => ListingTableUrl::parse(url).map_err(|e| invalid(&e)),
        (_, Some(glob_start)) => {
            let Some(split) = rest[..glob_start].rfind('/') else {
                return Err(invalid(&"a glob cannot be part of the bucket or host name"));
            };
            let (base, pattern) = rest.split_at(split + 1);
            let base = url::Url::parse(&format!("{scheme}://{base}"))
                .map_err(|e| invalid(&e))?;
            let pattern = glob::Pattern::new(pattern).map_err(|e| invalid(&e))?;
            ListingTableUrl::try_new(base, Some(pattern)).map_err(|e| invalid(&e))
        }
    }
}

/// Refuses `url`, whose listing under `table_url` is `files`, when it reads
/// a Delta Lake or Iceberg table's folder (a file named alone is read).
async fn refuse_table_folders(
    url: &str,
    table_url: &ListingTableUrl,
    files: &[ObjectMeta],
    store: &dyn object_store::ObjectStore,
) -> Result<()> {
    if let [file] = files
        && file.location == *table_url.prefix()
    {
        return Ok(());
    }
    // The folder read is the table's or one of its partitions: refused even
    // when its first level holds no file (an Iceberg table's `data/`).
    match table_roots_at(store, table_url.prefix()).await.first() {
        Some(table) => Err(table_error(url, table)),
        None => Ok(()),
    }
}

/// The files `glob` (of `url`) matches, with its store; a match inside a
/// Delta or Iceberg table is refused.
async fn glob_files(
    state: &SessionState,
    url: &str,
    glob: &FolderGlob,
) -> Result<(Arc<dyn object_store::ObjectStore>, Vec<ObjectMeta>)> {
    let store = state.runtime_env().object_store(glob.base())?;
    let (files, tables) = glob
        .expand(store.as_ref())
        .await
        .map_err(|e| list_error(url, e))?;
    refuse_glob_in_tables(url, glob, tables, &files, store.as_ref()).await?;
    Ok((store, files))
}

/// Refuses a folder glob whose matches lie in a Delta Lake or Iceberg table:
/// one found under its base (`tables`), or at the base or its parent.
async fn refuse_glob_in_tables(
    url: &str,
    glob: &FolderGlob,
    mut tables: Vec<TableRoot>,
    files: &[ObjectMeta],
    store: &dyn object_store::ObjectStore,
) -> Result<()> {
    tables.extend(table_roots_at(store, glob.base().prefix()).await);
    refuse_reads_in_tables(url, &tables, files)
}

/// A local path without glob characters must exist: say so by name.
fn check_local_path_exists(url: &str, table_url: &ListingTableUrl) -> Result<()> {
    if table_url.scheme() != "file" || url.contains(['*', '?', '[']) {
        return Ok(());
    }
    let local = url.strip_prefix("file://").unwrap_or(url);
    if FsPath::new(local).exists() {
        Ok(())
    } else {
        plan_err!("no such file or directory: '{url}'")
    }
}

async fn list_files(
    state: &SessionState,
    url: &str,
    table_url: &ListingTableUrl,
    store: &dyn object_store::ObjectStore,
) -> Result<Vec<ObjectMeta>> {
    let listing = table_url
        .list_all_files(state, store, "")
        .await
        .map_err(|e| list_error(url, e))?;
    let mut files: Vec<ObjectMeta> = listing
        .try_collect()
        .await
        .map_err(|e| list_error(url, e))?;
    files.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(files)
}

fn list_error(url: &str, e: DataFusionError) -> DataFusionError {
    let message = e.to_string();
    let hint = if message.contains("403") || message.contains("401") {
        ". Access denied: check the credentials for this store (AWS_ACCESS_KEY_ID / \
         AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*)"
    } else if message.contains("timed out") || message.contains("connect") {
        ". The store is unreachable: check the endpoint (AWS_ENDPOINT_URL) and the network"
    } else {
        ""
    };
    plan_datafusion_err!("cannot list '{url}': {message}{hint}")
}

/// The table schema: every file's footer read, conflicts named by file.
async fn checked_schema(
    state: &SessionState,
    table_url: &ListingTableUrl,
    store: &Arc<dyn object_store::ObjectStore>,
    format: &ParquetFormat,
    files: &[ObjectMeta],
) -> Result<SchemaRef> {
    let concurrency = state
        .config_options()
        .execution
        .meta_fetch_concurrency
        .get();
    let schemas: Vec<(String, SchemaRef)> = futures::stream::iter(files)
        .map(|file| file_schema(state, table_url, store, format, file))
        .boxed() // https://github.com/rust-lang/rust/issues/64552
        .buffered(concurrency)
        .try_collect()
        .await?;
    merge_schemas(&schemas)
}

/// One file's schema, with errors and reader panics named by file.
async fn file_schema(
    state: &SessionState,
    table_url: &ListingTableUrl,
    store: &Arc<dyn object_store::ObjectStore>,
    format: &ParquetFormat,
    file: &ObjectMeta,
) -> Result<(String, SchemaRef)> {
    let name = file_display_name(table_url, file);
    let one = std::slice::from_ref(file);
    let read = AssertUnwindSafe(format.infer_schema(state, store, one))
        .catch_unwind()
        .await;
    match read {
        Ok(Ok(schema)) => Ok((name, schema)),
        Ok(Err(e)) => Err(footer_error(&name, file.size, &e.to_string())),
        Err(panic) => Err(footer_error(
            &name,
            file.size,
            &format!("the Parquet reader panicked: {}", panic_message(&panic)),
        )),
    }
}

fn file_display_name(table_url: &ListingTableUrl, file: &ObjectMeta) -> String {
    if table_url.scheme() == "file" {
        format!("/{}", file.location)
    } else {
        let base = table_url.object_store();
        format!("{}{}", base.as_str(), file.location)
    }
}

fn footer_error(file: &str, size: u64, reason: &str) -> DataFusionError {
    exec_datafusion_err!(
        "cannot read the Parquet footer of '{file}' ({size} bytes): {reason}. The file \
         is truncated, corrupt or not Parquet: replace it, or exclude it from the path"
    )
}

/// Merges per-file schemas; a column with two types names both files.
fn merge_schemas(schemas: &[(String, SchemaRef)]) -> Result<SchemaRef> {
    let mut seen: BTreeMap<&str, (&DataType, &str)> = BTreeMap::new();
    for (file, schema) in schemas {
        for field in schema.fields() {
            match seen.get(field.name().as_str()) {
                Some((data_type, first_file)) if *data_type != field.data_type() => {
                    return plan_err!(
                        "column '{}' has type {} in '{}' but {} in '{}': files under one \
                         path must agree on column types; select them separately and CAST",
                        field.name(),
                        data_type,
                        first_file,
                        field.data_type(),
                        file
                    );
                }
                Some(_) => {}
                None => {
                    seen.insert(field.name(), (field.data_type(), file));
                }
            }
        }
    }
    let merged = Schema::try_merge(schemas.iter().map(|(_, s)| s.as_ref().clone()))?;
    Ok(Arc::new(merged))
}

/// Installs the factory on a freshly built state, returning the new state.
pub(crate) fn install(
    state: SessionState,
) -> (SessionState, Arc<ParquetUrlTableFactory>) {
    let factory = Arc::new(ParquetUrlTableFactory::new());
    let catalogs = Arc::new(datafusion::catalog::DynamicFileCatalog::new(
        Arc::clone(state.catalog_list()),
        Arc::clone(&factory) as Arc<dyn UrlTableFactory>,
    ));
    let state = SessionStateBuilder::new_from_existing(state)
        .with_catalog_list(catalogs)
        .build();
    (state, factory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Field;

    fn schema(fields: &[(&str, DataType)]) -> SchemaRef {
        Arc::new(Schema::new(
            fields
                .iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        ))
    }

    #[test]
    fn conflicting_column_types_name_column_and_both_files() {
        let schemas = vec![
            ("/a.parquet".to_string(), schema(&[("x", DataType::Int64)])),
            (
                "/b.parquet".to_string(),
                schema(&[("x", DataType::Float64)]),
            ),
        ];
        let err = merge_schemas(&schemas).expect_err("types conflict");
        let msg = err.to_string();
        assert!(msg.contains("'x'"), "{msg}");
        assert!(
            msg.contains("/a.parquet") && msg.contains("/b.parquet"),
            "{msg}"
        );
    }

    #[test]
    fn disjoint_columns_merge() -> Result<()> {
        let schemas = vec![
            ("/a.parquet".to_string(), schema(&[("x", DataType::Int64)])),
            ("/b.parquet".to_string(), schema(&[("y", DataType::Utf8)])),
        ];
        assert_eq!(merge_schemas(&schemas)?.fields().len(), 2);
        Ok(())
    }

    #[test]
    fn globs_in_object_store_urls_are_split_off() -> Result<()> {
        let url = parse_table_url("s3://bucket/train/year=2024/*.parquet")?;
        assert_eq!(url.prefix().as_ref(), "train/year=2024");
        let file = object_store::path::Path::from("train/year=2024/part-1.parquet");
        assert!(url.contains(&file, true));
        let other = object_store::path::Path::from("train/year=2024/part-1.csv");
        assert!(!url.contains(&other, true));
        assert!(parse_table_url("s3://buck*/x").is_err());
        Ok(())
    }

    #[test]
    fn catalog_names_are_not_paths() {
        assert!(!looks_like_path("trips"));
        assert!(looks_like_path("data/x.parquet"));
        assert!(looks_like_path("s3://b/k"));
        assert!(looks_like_path("x.parquet"));
    }
}
