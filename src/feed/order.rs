//! The order of an unshuffled feed: a function of (query, data) only, never
//! of the machine's core count or of timing.
//!
//! # How
//! - **Lanes, not cores.** An unshuffled feed plans its query with a fixed
//!   number of partitions ([`DEFAULT_ORDER_LANES`], or
//!   `FeedBuilder::order_lanes`), whatever the session's
//!   `target_partitions`: DataFusion then assigns files and row-group ranges
//!   to partitions in path order by the same rule on every machine, and the
//!   sink interleaves the partitions in turns of rows in partition order (see
//!   `crate::exec::lanes`). The turn is the session's batch size, fixed too
//!   (the session default, never derived from the machine).
//! - **Plans that merge by arrival are refused.** Operators that combine
//!   partitions in the order batches happen to arrive (a hash or round-robin
//!   `RepartitionExec`, `CoalescePartitionsExec`) make the order depend on
//!   timing. They come with `GROUP BY`, joins that repartition, window
//!   functions and `LIMIT` without `ORDER BY`. Below a global `ORDER BY`
//!   (`SortExec` to one partition, `SortPreservingMergeExec`) or a global
//!   `SHUFFLE` the order is re-established, so anything goes there; rows
//!   whose `ORDER BY` keys tie keep their arrival order, so order by columns
//!   that identify a row. The build side of a `CollectLeft` hash join does
//!   not set the output order (the probe side does), so it is not checked.
//!
//! Shuffled feeds need none of this: the shuffle orders rows by content.

use std::sync::Arc;

use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// Partitions an unshuffled feed plans with on every machine. Measured on
/// the W2 feed (2 cores, 2M rows, A B A B): 2 lanes 376–384k rows/s at
/// 545–615 MB peak, 4 lanes 379–409k at 827–872 MB, 8 lanes 337–352k at
/// 1.39–1.42 GB (each lane buffers its own record batches and row group).
pub const DEFAULT_ORDER_LANES: usize = 4;

/// Fails, naming the operator and what to add, when `plan`'s output order
/// depends on timing; see the module docs.
pub(crate) fn check_deterministic_order(plan: &Arc<dyn ExecutionPlan>) -> Result<()> {
    match arrival_order_operator(plan) {
        None => Ok(()),
        Some(operator) => plan_err!(
            "this feed has no SHUFFLE and its query combines partitions in the order \
             their batches arrive ({operator}, planned for a GROUP BY, a join that \
             repartitions, a window function or a LIMIT without ORDER BY), so its \
             batches would change from run to run and with the number of cores; add \
             an ORDER BY on columns that identify a row, or shuffle the feed \
             (--shuffle-seed / .shuffle(seed))"
        ),
    }
}

/// The first operator, from the top, that merges partitions by arrival.
fn arrival_order_operator(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    let name = plan.name();
    match name {
        // The order is established here; what is below cannot change it.
        "SortPreservingMergeExec" | "ShuffleMergeExec" | "PermuteExec" => return None,
        "SortExec" if plan.output_partitioning().partition_count() == 1 => return None,
        "RepartitionExec" | "CoalescePartitionsExec" => {
            return Some(format!("{name}: {}", plan.output_partitioning()));
        }
        _ => {}
    }
    let children = plan.children();
    let checked: Vec<&Arc<dyn ExecutionPlan>> = match plan.downcast_ref::<HashJoinExec>()
    {
        // The probe side (right) sets the output order; the collected build
        // side only supplies matches.
        Some(join) if join.mode == PartitionMode::CollectLeft => {
            children.into_iter().skip(1).collect()
        }
        _ => children,
    };
    checked.into_iter().find_map(arrival_order_operator)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Session;

    async fn physical(session: &Session, sql: &str) -> Result<Arc<dyn ExecutionPlan>> {
        session.sql(sql).await?.create_physical_plan().await
    }

    #[tokio::test]
    async fn group_by_without_order_by_is_refused_and_with_it_accepted() -> Result<()> {
        let session = Session::builder().target_partitions(4).build()?;
        let grouped = "SELECT value % 7 AS k, count(*) AS n FROM generate_series(1, 1000) \
                       GROUP BY value % 7";
        let err = check_deterministic_order(&physical(&session, grouped).await?)
            .expect_err("a GROUP BY merges partitions by arrival");
        let msg = err.to_string();
        assert!(
            msg.contains("RepartitionExec") && msg.contains("ORDER BY"),
            "{msg}"
        );
        let ordered = format!("{grouped} ORDER BY k");
        check_deterministic_order(&physical(&session, &ordered).await?)?;
        Ok(())
    }
}
