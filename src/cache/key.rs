//! The key of a cache entry: what produced the data, so that a second run of
//! the same query over the same files finds it, and anything else misses.
//!
//! # Definition
//! `key = xxh3-128` of, in this order, each field prefixed with its length:
//!
//! 1. `FORMAT`, the on-disk format version;
//! 2. the sqlfeed version (`CARGO_PKG_VERSION`);
//! 3. the build id ([`BUILD_ID`]: xxh3-128 of `src/**/*.rs`,
//!    `udfs/src/**/*.rs` and `Cargo.lock`, computed by `build.rs`);
//! 4. the salt;
//! 5. the optimized logical plan (indented, with schemas);
//! 6. every input file as (store URL and path, size, modification time,
//!    ETag), sorted by location;
//! 7. every asset a function of the plan reads (a `tokenize` call's
//!    `tokenizer.json`) as (location, xxh3-128 of its content), sorted by
//!    location;
//! 8. the keys of the cached tables read;
//! 9. every user function the plan calls (a plugin's or a Python function,
//!    [`sqlfeed_udfs::user::UserFunction`]) as (name, identity: the plugin
//!    library's content hash, the Python function's code hash or declared
//!    version), sorted by name;
//!
//! written as 32 hex digits.
//!
//! The optimized logical plan says what is computed (projections, filters,
//! function calls with their constant arguments such as a tokenizer path or a
//! resize size); the input files say on what. A changed query or a rewritten,
//! added or removed file changes the key. The plan names an asset but not its
//! content, so the content is hashed too, read through the function's own
//! reader (local paths and object-store URLs alike), and the function is
//! pinned to exactly that content (see [`sqlfeed_udfs::ReadsAssets`]): a
//! rewritten `tokenizer.json` is a miss and computes with the new file. An
//! asset that cannot be read fails the key with the function's own error:
//! the query could not be planned in a new session either, and a key without
//! the content could only be wrong. The build id makes a rebuilt sqlfeed
//! whose code changed miss entries of the old code under the same version.
//! The salt is for session settings that would change results without
//! showing in the plan; none does today (the image pixel limit only decides
//! which images fail, and a failed query caches nothing).
//!
//! # Persistence
//! Only data that is a pure function of files can be reused by another run. A
//! plan that reads anything else (an in-memory table, a view over one) or
//! calls a volatile function (`random()`, `now()`), or an aggregate function
//! of a plugin (whose code has no identity in the plan), gets a *session-only* key:
//! it is cached for this session and never written where another run could
//! find it.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::internal_datafusion_err;
use datafusion::common::plan_err;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::source_as_provider;
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, ScalarUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_ffi::udaf::ForeignAggregateUDF;
use xxhash_rust::xxh3::Xxh3;

use super::exec::CachedTable;

pub use super::identity::{AssetFile, BUILD_ID, CacheKey, FORMAT, InputFile};

/// The key of the query planned as `logical` (optimized) and `physical`,
/// whose functions read `assets` (from [`pin_assets`]).
pub(crate) fn compute(
    logical: &LogicalPlan,
    physical: &Arc<dyn ExecutionPlan>,
    salt: &str,
    assets: Vec<AssetFile>,
) -> Result<CacheKey> {
    compute_for_build(logical, physical, salt, assets, BUILD_ID)
}

/// [`compute`] as the build `build` computes it.
fn compute_for_build(
    logical: &LogicalPlan,
    physical: &Arc<dyn ExecutionPlan>,
    salt: &str,
    mut assets: Vec<AssetFile>,
    build: &str,
) -> Result<CacheKey> {
    let mut inputs = input_files(physical)?;
    inputs.sort_by(|a, b| a.location.cmp(&b.location));
    inputs.dedup();
    assets.sort_by(|a, b| a.location.cmp(&b.location));
    assets.dedup_by(|a, b| a.location == b.location);
    let Sources {
        session_only_reason,
        cached_keys,
        user_functions,
    } = sources(logical)?;

    let mut hasher = Xxh3::new();
    let mut field = |bytes: &[u8]| {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    field(&FORMAT.to_le_bytes());
    field(env!("CARGO_PKG_VERSION").as_bytes());
    field(build.as_bytes());
    field(salt.as_bytes());
    field(logical.display_indent_schema().to_string().as_bytes());
    for input in &inputs {
        field(input.location.as_bytes());
        field(&input.size.to_le_bytes());
        field(&input.modified_ns.to_le_bytes());
        field(input.e_tag.as_deref().unwrap_or("").as_bytes());
    }
    for asset in &assets {
        field(asset.location.as_bytes());
        field(asset.xxh3.as_bytes());
    }
    for key in &cached_keys {
        field(key.as_bytes());
    }
    for (name, identity) in &user_functions {
        field(name.as_bytes());
        field(identity.as_bytes());
    }
    let mut hex = format!("{:032x}", hasher.digest128());
    if session_only_reason.is_some() {
        // Never the name of a shareable entry, even for the same plan.
        hex = format!("s{}", &hex[1..]);
    }
    Ok(CacheKey {
        hex,
        persistent: session_only_reason.is_none(),
        session_only_reason,
        inputs,
        assets,
        build: build.to_string(),
    })
}

/// A call of a function that reads a file: the function and the location.
#[derive(Debug, Clone)]
pub(crate) struct AssetCall {
    function: Arc<ScalarUDF>,
    location: String,
}

/// Calls are the same when they read the same location through the same
/// function (each function holds what it loaded).
impl PartialEq for AssetCall {
    fn eq(&self, other: &Self) -> bool {
        self.function.name() == other.function.name() && self.location == other.location
    }
}

/// Every call in `plan` (subqueries included) of a function that reads a
/// file named by an argument ([`sqlfeed_udfs::reads_assets`]), once per
/// (function, location). Reads nothing.
pub(crate) fn asset_calls(plan: &LogicalPlan) -> Result<Vec<AssetCall>> {
    let mut calls: BTreeMap<(String, String), AssetCall> = BTreeMap::new();
    plan.apply_with_subqueries(|node| {
        for expr in node.expressions() {
            expr.apply(|e| {
                if let Expr::ScalarFunction(call) = e
                    && let Some(reader) = sqlfeed_udfs::reads_assets(&call.func)
                {
                    for position in reader.asset_arguments(call.args.len()) {
                        let location =
                            literal_location(&call.func, &call.args, position)?;
                        calls
                            .entry((call.func.name().to_string(), location.clone()))
                            .or_insert_with(|| AssetCall {
                                function: Arc::clone(&call.func),
                                location,
                            });
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(calls.into_values().collect())
}

/// The constant string argument `position` of a call of `function`.
fn literal_location(
    function: &ScalarUDF,
    args: &[Expr],
    position: usize,
) -> Result<String> {
    use datafusion::common::ScalarValue;
    match args.get(position) {
        Some(Expr::Literal(
            ScalarValue::Utf8(Some(location))
            | ScalarValue::LargeUtf8(Some(location))
            | ScalarValue::Utf8View(Some(location)),
            _,
        )) => Ok(location.clone()),
        other => plan_err!(
            "{}: argument {} must be a constant path or URL of a file, got {}",
            function.name(),
            position + 1,
            other.map_or_else(|| "nothing".to_string(), |e| e.to_string())
        ),
    }
}

/// Reads every asset of `calls` now and pins its function to that content
/// (see the module docs). Blocking: run it off the async workers.
pub(crate) fn pin_assets(calls: Vec<AssetCall>) -> Result<Vec<AssetFile>> {
    calls
        .into_iter()
        .map(|call| {
            let reader = sqlfeed_udfs::reads_assets(&call.function).ok_or_else(|| {
                internal_datafusion_err!(
                    "{} no longer reads assets",
                    call.function.name()
                )
            })?;
            let pinned = reader.pin_asset(&call.location)?;
            Ok(AssetFile {
                location: call.location,
                size: pinned.bytes,
                xxh3: format!("{:032x}", pinned.xxh3),
            })
        })
        .collect()
}

/// The files every file scan of `plan` reads.
/// How a manifest ([`InputFile::location`]) names the file at `path` of
/// the store `store` (`file:/data/a.parquet`, `s3://bucket/a.parquet`).
pub(crate) fn file_location(
    store: &datafusion::execution::object_store::ObjectStoreUrl,
    path: &object_store::path::Path,
) -> String {
    format!("{}/{path}", store.as_str().trim_end_matches('/'))
}

pub(crate) fn input_files(plan: &Arc<dyn ExecutionPlan>) -> Result<Vec<InputFile>> {
    let mut files = Vec::new();
    plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<DataSourceExec>()
            && let Some(config) = scan.data_source().downcast_ref::<FileScanConfig>()
        {
            for group in &config.file_groups {
                for file in group.iter() {
                    let meta = &file.object_meta;
                    files.push(InputFile {
                        location: file_location(&config.object_store_url, &meta.location),
                        size: meta.size,
                        modified_ns: meta
                            .last_modified
                            .timestamp_nanos_opt()
                            .unwrap_or_else(|| meta.last_modified.timestamp()),
                        e_tag: meta.e_tag.clone(),
                    });
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(files)
}

/// What a plan's data comes from besides its files.
struct Sources {
    /// Why the data is not a pure function of files (`None` if it is).
    session_only_reason: Option<String>,
    /// The keys of the cached tables read, and the definitions of other
    /// tables that have one.
    cached_keys: Vec<String>,
    /// (name, identity) of every user function called, sorted.
    user_functions: BTreeMap<String, String>,
}

/// What `plan`'s data comes from besides its files (see [`Sources`]).
fn sources(plan: &LogicalPlan) -> Result<Sources> {
    let mut reason = None;
    let mut cached = Vec::new();
    let mut user_functions = BTreeMap::new();
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            let provider = source_as_provider(&scan.source)?;
            if let Some(table) = provider.downcast_ref::<CachedTable>() {
                cached.push(table.key().hex.clone());
                if !table.key().persistent {
                    reason.get_or_insert(format!(
                        "reads the session-only cached table {}",
                        scan.table_name
                    ));
                }
            } else if !is_file_table(provider.as_ref()) {
                reason.get_or_insert(format!(
                    "reads {}, which is not a file table",
                    scan.table_name
                ));
                // What the table says defines it (a Delta table: its
                // version, which names what deletion vectors keep of the
                // files the physical plan lists).
                if let Some(definition) = provider.get_table_definition() {
                    cached.push(definition.to_string());
                }
            }
        }
        for expr in node.expressions() {
            if expr.is_volatile() {
                reason.get_or_insert(format!("calls the volatile {expr}"));
            }
            expr.apply(|e| {
                match e {
                    Expr::ScalarFunction(call) => {
                        if let Some(user) = sqlfeed_udfs::user::as_user_function(&call.func) {
                            user_functions
                                .insert(call.func.name().to_string(), user.identity().to_string());
                        }
                    }
                    Expr::AggregateFunction(call) if is_plugin_aggregate(&call.func) => {
                        reason.get_or_insert(format!(
                            "calls the plugin aggregate {}, whose code the plan does not identify",
                            call.func.name()
                        ));
                    }
                    _ => {}
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(Sources {
        session_only_reason: reason,
        cached_keys: cached,
        user_functions,
    })
}

/// Whether `udaf` is an aggregate function of a plugin.
fn is_plugin_aggregate(udaf: &datafusion::logical_expr::AggregateUDF) -> bool {
    let any: &dyn std::any::Any = udaf.inner().as_ref();
    any.is::<ForeignAggregateUDF>()
}

fn is_file_table(provider: &dyn TableProvider) -> bool {
    provider.is::<ListingTable>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn the_key_changes_with_the_build_and_with_asset_content() -> Result<()> {
        let ctx = SessionContext::new();
        let frame = ctx.sql("SELECT 1 AS x").await?;
        let logical = frame.logical_plan().clone();
        let physical = frame.create_physical_plan().await?;
        let key = |build: &str, assets: Vec<AssetFile>| {
            compute_for_build(&logical, &physical, "", assets, build)
        };
        let asset = |xxh3: &str| AssetFile {
            location: "/models/tokenizer.json".into(),
            size: 10,
            xxh3: xxh3.into(),
        };
        let base = key("build-a", vec![])?;
        assert_eq!(base.hex, key("build-a", vec![])?.hex, "deterministic");
        assert_eq!(base.build, "build-a");
        assert_ne!(base.hex, key("build-b", vec![])?.hex);
        let with_asset = key("build-a", vec![asset("01")])?;
        assert_ne!(with_asset.hex, base.hex);
        assert_ne!(with_asset.hex, key("build-a", vec![asset("02")])?.hex);
        assert_eq!(with_asset.assets, vec![asset("01")]);
        // The real build id is 32 hex digits and is what `compute` uses.
        assert_eq!(BUILD_ID.len(), 32);
        assert!(BUILD_ID.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(compute(&logical, &physical, "", vec![])?.build, BUILD_ID);
        Ok(())
    }
}
