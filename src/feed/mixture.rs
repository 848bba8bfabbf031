//! A feed over a `MIX` query (see `crate::shuffle::mix`): what it cannot be
//! combined with, and how the epoch cache serves it.
//!
//! A mixture orders its rows itself, stratified per batch, and draws other
//! rows every epoch, so neither a feed shuffle over it nor a cache of one
//! epoch's rows can serve it. What the epoch cache keeps instead is each
//! source's rows:
//!
//! ```text
//!  epoch 0                                  epochs ≥ 1
//!  ───────                                  ──────────
//!  MixExec (epoch 0's windows and turns)    MixExec (epoch e's)
//!    the source's functions, window rows      the source's functions, window rows
//!      shuffle passes of each source            shuffle passes of each source
//!        CachedTable ◀── filled once from         CachedTable (the same entry:
//!                        the source's scan        no scan, no filter again)
//!                        and filters
//! ```
//!
//! What is kept are the source's rows as they enter its row-wise functions
//! (the compressed image, the text), the values a mixture's passes shuffle
//! by; the functions run on the rows each epoch takes, as they do uncached.
//! So the mixture is recomputed every epoch without scanning or filtering
//! a source again, and every batch is the uncached feed's. Entries are the session
//! cache's (`CACHE TABLE`'s): keyed by the source's plan and files, on disk,
//! and reused by a later run of a source over the same files. A source that
//! holds a mixture itself is not kept (that would freeze its draw); the
//! sources of the mixture inside it are.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{not_impl_err, plan_err};
use datafusion::datasource::provider_as_source;
use datafusion::error::Result;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, LogicalPlanBuilder, Projection,
    UserDefinedLogicalNodeCore,
};

use crate::Session;
use crate::cache::CachedTable;
use crate::shuffle::late::{RowFunctionsSplit, split_row_functions};
use crate::shuffle::mix::MixNode;

fn is_mix(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::Extension(e) if e.node.as_any().is::<MixNode>())
}

/// Whether the rows of `plan` come straight out of a mixture, in its order.
fn mixture_on_top(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => mixture_on_top(&p.input),
        LogicalPlan::SubqueryAlias(a) => mixture_on_top(&a.input),
        other => is_mix(other),
    }
}

/// Whether `plan` holds a mixture anywhere.
pub(super) fn has_mixture(plan: &LogicalPlan) -> Result<bool> {
    plan.exists(|node| Ok(is_mix(node)))
}

/// Refuses a feed whose query is a mixture when the feed would shuffle its
/// rows again, which undoes the stratification; a feed shuffled in windows
/// (`window`) is pointed at the mixture's own windows.
pub(super) async fn check(
    session: &Session,
    sql: &str,
    shuffled: bool,
    window: Option<u64>,
) -> Result<()> {
    let plan = session.sql(sql).await?.into_unoptimized_plan();
    if shuffled && mixture_on_top(&plan) {
        // Who asks for windows wants a mixture that streams: it has them.
        let windows = window.map_or(String::new(), |rows| {
            format!(
                ", and for passes that stream in windows of {rows} rows write MIX … WINDOW \
                 {rows} instead of shuffle_window"
            )
        });
        return plan_err!(
            "this feed's query is a MIX, which orders its rows itself (each source's share \
             in every batch, a new draw each epoch); a feed shuffle would reorder them at \
             random. Build the feed without a shuffle (--shuffle-seed / .shuffle(seed) / \
             shuffle=) and give the mixture its seed: MIX … SEED s{windows}"
        );
    }
    Ok(())
}

/// What the epoch cache keeps of a mixture's sources ([`with_cached_sources`]).
const SOURCE_SALT: &str = "feed:mix-source";

/// `plan` with every mixture source that holds no mixture itself read from
/// its session cache entry (filled now where there is none), under its own
/// column names: see the module docs. `sql` names the entries in listings.
pub(super) async fn with_cached_sources(
    session: &Session,
    state: &SessionState,
    plan: LogicalPlan,
    sql: &str,
) -> Result<LogicalPlan> {
    let mut sources: Vec<(String, LogicalPlan)> = vec![];
    plan.apply(|node| {
        if let LogicalPlan::Extension(Extension { node: mix }) = node
            && let Some(mix) = mix.as_any().downcast_ref::<MixNode>()
        {
            if let Some(window_rows) = mix.spec().window_rows {
                // Windows are cut from the sources' Parquet row groups; an
                // entry has none, and the windows would change with it.
                return not_impl_err!(
                    "MIX … WINDOW {window_rows} does not work with the epoch cache yet: \
                     the cache keeps each source's rows, and a pass in windows is cut from \
                     the source's Parquet row groups. Turn the cache off, or leave WINDOW \
                     out (each pass is then a global shuffle of the cached rows)"
                );
            }
            for (name, input) in mix.spec().names.iter().zip(mix.inputs()) {
                if !has_mixture(input)? {
                    sources.push((name.clone(), input.clone()));
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let mut cached: HashMap<LogicalPlan, LogicalPlan> = HashMap::new();
    for (name, input) in sources {
        if cached.contains_key(&input) {
            continue;
        }
        // The rows as they enter the source's functions, which run on the
        // rows each epoch takes, where they run uncached (see the mixture's
        // planner): the passes then hash the same values either way.
        let optimized = state.optimize(&input)?;
        let split = match &optimized {
            LogicalPlan::Projection(projection) => {
                split_row_functions(projection, |_| false)?
            }
            _ => None,
        };
        let (rows, finish) = match split {
            Some(RowFunctionsSplit { below, outputs }) => {
                (LogicalPlan::Projection(below), Some(outputs))
            }
            None => (input.clone(), None),
        };
        let listed = format!("MIX source '{name}' of {sql}");
        let table = session
            .cache()
            .get_or_create(state, rows.clone(), &listed, SOURCE_SALT)
            .await?;
        let mut scan = cached_scan(table, &rows)?;
        if let Some(outputs) = finish {
            scan = LogicalPlan::Projection(Projection::try_new(outputs, Arc::new(scan))?);
        }
        cached.insert(input, scan);
    }
    plan.transform_down(|node| {
        let LogicalPlan::Extension(Extension { node: mix }) = &node else {
            return Ok(Transformed::no(node));
        };
        let Some(mix) = mix.as_any().downcast_ref::<MixNode>() else {
            return Ok(Transformed::no(node));
        };
        let inputs: Vec<LogicalPlan> = mix
            .inputs()
            .into_iter()
            .map(|input| cached.get(input).cloned().unwrap_or_else(|| input.clone()))
            .collect();
        let mix = MixNode::try_new(inputs, mix.spec().clone())?;
        Ok(Transformed::yes(LogicalPlan::Extension(Extension {
            node: Arc::new(mix),
        })))
    })
    .map(|t| t.data)
}

/// A scan of `table` (the rows of `source`) that names its columns as
/// `source` does, qualifiers included, so the plan above is unchanged.
fn cached_scan(table: Arc<CachedTable>, source: &LogicalPlan) -> Result<LogicalPlan> {
    let scan = LogicalPlanBuilder::scan(
        "mix_source",
        provider_as_source(table as Arc<dyn TableProvider>),
        None,
    )?
    .build()?;
    let exprs = scan
        .schema()
        .columns()
        .into_iter()
        .zip(source.schema().iter())
        .map(|(column, (qualifier, field))| {
            Expr::Column(column).alias_qualified(qualifier.cloned(), field.name())
        })
        .collect();
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(scan),
    )?))
}
