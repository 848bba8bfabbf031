//! What a feed over a `MIX` query cannot be combined with (see
//! `crate::shuffle::mix`): a mixture orders its rows itself, stratified per
//! batch, and draws other rows every epoch.

use datafusion::common::plan_err;
use datafusion::common::tree_node::TreeNode;
use datafusion::error::Result;
use datafusion::logical_expr::LogicalPlan;

use crate::Session;
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

/// Refuses a feed whose query is a mixture when the feed would shuffle its
/// rows again (which undoes the stratification) or keep them in the epoch
/// cache (which would replay one epoch's draw every epoch).
pub(super) async fn check(
    session: &Session,
    sql: &str,
    shuffled: bool,
    cached: bool,
) -> Result<()> {
    let plan = session.sql(sql).await?.into_unoptimized_plan();
    if cached && plan.exists(|node| Ok(is_mix(node)))? {
        return plan_err!(
            "this feed's query has a MIX, which draws other rows every epoch, so the epoch \
             cache (which keeps one epoch's rows) cannot serve it yet; build the feed \
             without the cache (--cache / .cache(true) / cache=True)"
        );
    }
    if shuffled && mixture_on_top(&plan) {
        return plan_err!(
            "this feed's query is a MIX, which orders its rows itself (each source's share \
             in every batch, a new draw each epoch); a feed shuffle would reorder them at \
             random. Build the feed without a shuffle (--shuffle-seed / .shuffle(seed) / \
             shuffle=) and give the mixture its seed: MIX … SEED s"
        );
    }
    Ok(())
}
