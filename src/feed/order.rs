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
//! Shuffled feeds need none of this: the shuffle orders rows by content. Nor
//! does a query that reads every table under a `MIX` or a global `SHUFFLE`
//! ([`ordered_by_content`]): it plans with the session's partitions and
//! file work stealing, as a shuffled feed does. (Planned with four lanes
//! on two cores, a 3-source mixture's shuffles keyed and permuted at about
//! half the rate of one shuffle over the same rows.)
//!
//! # Costly functions over the interleaved lanes
//! Read lane by lane, each lane's costly functions (image decoding) would
//! have the cores a lane gets, `target_partitions / lanes`, and a lane
//! waiting for its turn stops after reading two batches ahead: most of the
//! time one lane decodes while the others wait. So the lanes are
//! interleaved *under* the projection that runs them
//! ([`interleave_under_costly_functions`]), which then runs on every core
//! over the one ordered stream, as it does above a shuffle. The rows and
//! their order are the same: a projection gives one row per row, and turns
//! are counted in rows.
//!
//! ```text
//!  as planned                           as run
//!  ParallelProjectionExec ×4 lanes,     ParallelProjectionExec: image_decode…,
//!    1 worker each: image_decode…         every core, 1 partition
//!    DataSourceExec: 4 lanes            LaneInterleaveExec: turns of T rows
//!  (interleaved by the sink)              DataSourceExec: 4 lanes
//! ```

use std::sync::Arc;

use datafusion::common::plan_err;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

use crate::exec::lanes::LaneInterleaveExec;
use crate::shuffle::ShuffleNode;
use crate::shuffle::mix::MixNode;
use crate::sql::ParallelProjectionExec;

/// Partitions an unshuffled feed plans with on every machine. Measured on
/// the W2 feed (2 cores, 2M rows, A B A B): 2 lanes 376–384k rows/s at
/// 545–615 MB peak, 4 lanes 379–409k at 827–872 MB, 8 lanes 337–352k at
/// 1.39–1.42 GB (each lane buffers its own record batches and row group).
pub const DEFAULT_ORDER_LANES: usize = 4;

/// Whether every table `plan` reads (also in its subqueries) is read under
/// a `MIX` or a global `SHUFFLE`, and there is at least one: their output
/// order is a function of the rows' content, so how the tables below them
/// are split into partitions cannot change the feed's order. Whatever lies
/// above them is still checked by [`check_deterministic_order`].
pub(crate) fn ordered_by_content(plan: &LogicalPlan) -> bool {
    let mut orders_by_content = false;
    let mut reads_elsewhere = false;
    let visited = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::Extension(extension) = node {
            let any = extension.node.as_any();
            let global_shuffle = any
                .downcast_ref::<ShuffleNode>()
                .is_some_and(|n| n.spec().content_keyed().is_some());
            if global_shuffle || any.is::<MixNode>() {
                orders_by_content = true;
                return Ok(TreeNodeRecursion::Jump);
            }
        }
        if matches!(node, LogicalPlan::TableScan(_)) {
            reads_elsewhere = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    visited.is_ok() && orders_by_content && !reads_elsewhere
}

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
        "SortPreservingMergeExec" | "ShuffleMergeExec" | "PermuteExec" | "MixExec" => {
            return None;
        }
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

/// `plan`, an unshuffled feed's, with its lanes interleaved in turns of
/// `turn_rows` rows under the lowest projection of costly functions that
/// only projections separate from the top, and those projections run by
/// `workers` workers over the one stream; `plan` itself where there is no
/// such projection or only one lane. See the module docs.
pub(super) fn interleave_under_costly_functions(
    plan: Arc<dyn ExecutionPlan>,
    turn_rows: usize,
    workers: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    if plan.output_partitioning().partition_count() <= 1 {
        return Ok(plan);
    }
    // The projections from the top (one row per row, lane by lane), and
    // the position of the lowest that runs costly functions.
    let mut projections: Vec<Arc<dyn ExecutionPlan>> = vec![];
    let mut lowest_costly = None;
    let mut node = Arc::clone(&plan);
    loop {
        let costly = node.downcast_ref::<ParallelProjectionExec>().is_some();
        if !costly && node.downcast_ref::<ProjectionExec>().is_none() {
            break;
        }
        if costly {
            lowest_costly = Some(projections.len());
        }
        let child = Arc::clone(node.children()[0]);
        projections.push(node);
        node = child;
    }
    let Some(lowest) = lowest_costly else {
        return Ok(plan);
    };
    let lanes = Arc::clone(projections[lowest].children()[0]);
    let mut rebuilt: Arc<dyn ExecutionPlan> =
        Arc::new(LaneInterleaveExec::new(lanes, turn_rows));
    for node in projections[..=lowest].iter().rev() {
        rebuilt = match node.downcast_ref::<ParallelProjectionExec>() {
            Some(parallel) => {
                let projection =
                    ProjectionExec::try_new(parallel.exprs().to_vec(), rebuilt)?;
                Arc::new(ParallelProjectionExec::new(
                    &projection,
                    workers,
                    parallel.batch_bytes(),
                ))
            }
            None => replace_children_if_necessary(Arc::clone(node), vec![rebuilt])?,
        };
    }
    Ok(rebuilt)
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

    #[tokio::test]
    async fn only_queries_reading_every_table_under_a_mix_or_shuffle_are_content_ordered()
    -> Result<()> {
        let session = Session::try_new()?;
        let mix = "MIX (SELECT value AS v FROM generate_series(1, 10)) AS a WEIGHT 0.5, \
                   (SELECT value AS v FROM generate_series(11, 20)) AS b WEIGHT 0.5 SEED 1";
        let series = "SELECT value AS v FROM generate_series(1, 10)";
        let cases = [
            (format!("SELECT v + 1 AS w FROM ({mix}) WHERE v > 2"), true),
            (format!("{series} SHUFFLE SEED 3"), true),
            (
                format!("SELECT * FROM ({series} SHUFFLE SEED 3) LIMIT 4"),
                true,
            ),
            (series.to_string(), false),
            (format!("{series} LOCAL SHUFFLE BUFFER 4 SEED 3"), false),
            // A table read beside the mixture, in a join or a subquery.
            (
                format!(
                    "SELECT m.v FROM ({mix}) m JOIN generate_series(1, 5) g ON m.v = g.value"
                ),
                false,
            ),
            (
                format!(
                    "SELECT v FROM ({mix}) WHERE v IN (SELECT value FROM generate_series(1, 3))"
                ),
                false,
            ),
            ("SELECT 1 AS one".to_string(), false),
        ];
        for (sql, expected) in cases {
            let plan = session.sql(&sql).await?.into_unoptimized_plan();
            assert_eq!(ordered_by_content(&plan), expected, "{sql}");
        }
        Ok(())
    }
}
