//! The cache statements: `CACHE TABLE name AS <query>`, `UNCACHE TABLE
//! [IF EXISTS] name` and `CLEAR CACHE` (see [`crate::cache`]).
//!
//! Each returns one row that says what happened, so the REPL shows it and a
//! script can check it.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use datafusion::catalog::TableProvider;
use datafusion::common::plan_datafusion_err;
use datafusion::common::plan_err;
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::ObjectName;

use crate::cache::{CacheStore, CachedTable};

/// The session's cache store.
pub(crate) fn store(ctx: &SessionContext) -> Result<Arc<CacheStore>> {
    ctx.state()
        .config()
        .get_extension::<CacheStore>()
        .ok_or_else(|| {
            plan_datafusion_err!(
                "this context has no epoch cache: cache statements need a sqlfeed Session"
            )
        })
}

/// `CACHE TABLE name AS query`.
pub(super) async fn cache_table(
    ctx: &SessionContext,
    name: &ObjectName,
    query: DFStatement,
) -> Result<DataFrame> {
    let text = query.to_string();
    let state = ctx.state();
    let plan = super::apply_markers(state.statement_to_plan(query).await?)?;
    let table_name = name.to_string();
    let existing = ctx.table_provider(table_name.as_str()).await.ok();
    if let Some(existing) = &existing
        && !existing.is::<CachedTable>()
    {
        return plan_err!(
            "table '{table_name}' already exists and is not a cached table; pick another \
             name or DROP it first"
        );
    }
    let table = store(ctx)?.get_or_create(&state, plan, &text, "").await?;
    if existing.is_some() {
        ctx.deregister_table(table_name.as_str())?;
    }
    ctx.register_table(
        table_name.as_str(),
        Arc::clone(&table) as Arc<dyn TableProvider>,
    )?;
    one_row(
        ctx,
        vec![
            ("table", text_column(&table_name)),
            ("rows", number(table.rows())),
            ("partitions", number(table.partitions() as u64)),
            ("memory_bytes", number(table.memory_bytes() as u64)),
            ("disk_bytes", number(table.disk_bytes())),
            ("source", text_column(&table.origin().to_string())),
            ("key", text_column(&table.key().hex)),
        ],
    )
}

/// `UNCACHE TABLE [IF EXISTS] name`.
pub(super) async fn uncache_table(
    ctx: &SessionContext,
    name: &ObjectName,
    if_exists: bool,
) -> Result<DataFrame> {
    let table_name = name.to_string();
    let memory = match ctx.table_provider(table_name.as_str()).await {
        Ok(provider) => {
            let Some(table) = provider.downcast_ref::<CachedTable>() else {
                return plan_err!(
                    "'{table_name}' is not a cached table (DROP TABLE removes other tables)"
                );
            };
            let memory = table.memory_bytes() as u64;
            ctx.deregister_table(table_name.as_str())?;
            Some(memory)
        }
        Err(_) if if_exists => None,
        Err(_) => {
            return plan_err!(
                "there is no cached table '{table_name}' (UNCACHE TABLE IF EXISTS ignores this)"
            );
        }
    };
    one_row(
        ctx,
        vec![
            ("table", text_column(&table_name)),
            (
                "uncached",
                text_column(if memory.is_some() { "yes" } else { "no" }),
            ),
            ("memory_bytes_released", number(memory.unwrap_or(0))),
        ],
    )
}

/// `CLEAR CACHE`.
pub(super) fn clear_cache(ctx: &SessionContext) -> Result<DataFrame> {
    let (entries, bytes) = store(ctx)?.clear();
    one_row(
        ctx,
        vec![
            ("entries_removed", number(entries as u64)),
            ("bytes_removed", number(bytes)),
        ],
    )
}

fn text_column(value: &str) -> ArrayRef {
    Arc::new(StringArray::from(vec![value]))
}

fn number(value: u64) -> ArrayRef {
    Arc::new(UInt64Array::from(vec![value]))
}

fn one_row(ctx: &SessionContext, columns: Vec<(&str, ArrayRef)>) -> Result<DataFrame> {
    ctx.read_batch(RecordBatch::try_from_iter(columns)?)
}
