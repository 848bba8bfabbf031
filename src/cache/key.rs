//! The key of a cache entry: what produced the data, so that a second run of
//! the same query over the same files finds it, and anything else misses.
//!
//! # Definition
//! `key = xxh3-128(FORMAT, sqlfeed version, salt, optimized logical plan
//! (indented, with schemas), every input file as (store URL, path, size,
//! modification time, ETag) sorted by location, and the keys of cached tables
//! read)`, written as 32 hex digits.
//!
//! The optimized logical plan says what is computed (projections, filters,
//! function calls with their constant arguments such as a tokenizer path or a
//! resize size); the input files say on what. A changed query or a rewritten,
//! added or removed file changes the key. The salt is for session settings
//! that would change results without showing in the plan; none does today
//! (the image pixel limit only decides which images fail, and a failed query
//! caches nothing).
//!
//! # Persistence
//! Only data that is a pure function of files can be reused by another run. A
//! plan that reads anything else (an in-memory table, a view over one) or
//! calls a volatile function (`random()`, `now()`) gets a *session-only* key:
//! it is cached for this session and never written where another run could
//! find it.

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::source_as_provider;
use datafusion::error::Result;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use xxhash_rust::xxh3::Xxh3;

use super::exec::CachedTable;

/// Version of the on-disk format; part of every key, so a format change
/// makes old entries unreachable (and the LRU limit removes them).
pub(crate) const FORMAT: u32 = 1;

/// One file a cached query read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InputFile {
    /// `scheme://host/path` of the file.
    pub location: String,
    /// Size in bytes.
    pub size: u64,
    /// Modification time in nanoseconds since the epoch.
    pub modified_ns: i64,
    /// The store's ETag, when it has one.
    pub e_tag: Option<String>,
}

/// The key of a query's result; see the module docs.
#[derive(Debug, Clone)]
pub struct CacheKey {
    /// 32 hex digits.
    pub hex: String,
    /// Whether another run may reuse the entry (see the module docs).
    pub persistent: bool,
    /// Why not, when not persistent (for `\cache` and the CACHE result).
    pub session_only_reason: Option<String>,
    /// The files read.
    pub inputs: Vec<InputFile>,
}

/// The key of the query planned as `logical` (optimized) and `physical`.
pub(crate) fn compute(
    logical: &LogicalPlan,
    physical: &Arc<dyn ExecutionPlan>,
    salt: &str,
) -> Result<CacheKey> {
    let mut inputs = input_files(physical)?;
    inputs.sort_by(|a, b| a.location.cmp(&b.location));
    inputs.dedup();
    let (session_only_reason, cached_keys) = sources(logical)?;

    let mut hasher = Xxh3::new();
    let mut field = |bytes: &[u8]| {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    field(&FORMAT.to_le_bytes());
    field(env!("CARGO_PKG_VERSION").as_bytes());
    field(salt.as_bytes());
    field(logical.display_indent_schema().to_string().as_bytes());
    for input in &inputs {
        field(input.location.as_bytes());
        field(&input.size.to_le_bytes());
        field(&input.modified_ns.to_le_bytes());
        field(input.e_tag.as_deref().unwrap_or("").as_bytes());
    }
    for key in &cached_keys {
        field(key.as_bytes());
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
    })
}

/// The files every file scan of `plan` reads.
fn input_files(plan: &Arc<dyn ExecutionPlan>) -> Result<Vec<InputFile>> {
    let mut files = Vec::new();
    plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<DataSourceExec>()
            && let Some(config) = scan.data_source().downcast_ref::<FileScanConfig>()
        {
            let store = config.object_store_url.as_str().trim_end_matches('/');
            for group in &config.file_groups {
                for file in group.iter() {
                    let meta = &file.object_meta;
                    files.push(InputFile {
                        location: format!("{store}/{}", meta.location),
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

/// Why the plan's data is not a pure function of files (`None` if it is),
/// and the keys of the cached tables it reads.
fn sources(plan: &LogicalPlan) -> Result<(Option<String>, Vec<String>)> {
    let mut reason = None;
    let mut cached = Vec::new();
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
            }
        }
        for expr in node.expressions() {
            if expr.is_volatile() {
                reason.get_or_insert(format!("calls the volatile {expr}"));
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok((reason, cached))
}

fn is_file_table(provider: &dyn TableProvider) -> bool {
    provider.is::<ListingTable>()
}
