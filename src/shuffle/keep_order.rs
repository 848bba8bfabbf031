//! [`KeepShuffleOrder`]: no round-robin split of a global shuffle's output.
//!
//! A `SHUFFLE` has one output partition whose order *is* the result, but it
//! cannot state that order to DataFusion (it is by a key column that is
//! dropped). DataFusion's distribution rule then sees a single partition
//! under an operator that benefits from parallelism (a projection computing
//! functions, a filter) and inserts a `RoundRobinBatch` repartition, after
//! which batches are interleaved by timing and the order is lost. This rule
//! removes such repartitions again; [`crate::sql::ParallelProjectionExec`]
//! gives costly functions above a shuffle their parallelism back, in order.
//!
//! A [ranged](ShuffleMergeExec::ranged) shuffle (a cluster feed's parallel final
//! stage) has one partition per key range and its order is "the partitions
//! in turn"; the rule refuses a plan where an operator above merges or
//! reorders them, rather than let the order be lost. It also puts back the
//! range and rank exchanges of such a shuffle where the distribution rule
//! dropped them (over an input of one partition, which "satisfies" any hash
//! distribution): without them every range or rank would share one task.
//!
//! Under a [`PositionShuffleExec`] it takes out the round-robin splits too:
//! rows of one file must reach it in the scan's partitions, in order.
//!
//! ```text
//!  ProjectionExec                        ProjectionExec
//!    RepartitionExec: RoundRobinBatch      ShuffleMergeExec
//!      ShuffleMergeExec                 ──►       …
//!        …
//! ```

use std::sync::Arc;

use datafusion::common::plan_err;
use datafusion::common::tree_node::Transformed;
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use crate::exec::{NodeRewrite, PlanNode, Rewritten};

use super::{
    DealExec, PositionShuffleExec, RANK_ROUTE_COLUMN, RankShardExec, ShuffleMergeExec,
};

/// Whether `plan` streams a global shuffle's order: a [`ShuffleMergeExec`] or
/// [`PositionShuffleExec`], or a
/// single-partition, order-keeping operator over one.
fn carries_shuffle_order(plan: &Arc<dyn ExecutionPlan>) -> bool {
    if plan.as_ref().downcast_ref::<ShuffleMergeExec>().is_some()
        || plan
            .as_ref()
            .downcast_ref::<PositionShuffleExec>()
            .is_some()
        || plan.as_ref().downcast_ref::<RankShardExec>().is_some()
    {
        return true;
    }
    match (
        plan.children().as_slice(),
        plan.maintains_input_order().as_slice(),
    ) {
        ([child], [true]) => {
            plan.output_partitioning().partition_count()
                == child.output_partitioning().partition_count()
                && carries_shuffle_order(child)
        }
        _ => false,
    }
}

/// `exchange` as a hash repartition over a `T`, with that `T`; `None` if
/// it is not one.
fn hash_exchange_over<T: ExecutionPlan>(
    exchange: &Arc<dyn ExecutionPlan>,
) -> Option<(&RepartitionExec, &T)> {
    let repartition = exchange.as_ref().downcast_ref::<RepartitionExec>()?;
    if !matches!(repartition.partitioning(), Partitioning::Hash(..)) {
        return None;
    }
    let input = repartition.input().as_ref().downcast_ref::<T>()?;
    Some((repartition, input))
}

/// `node` over a hash exchange of its one child on the child's column
/// `name` (at `index`) into `partitions`: the exchange the planner put
/// there, which DataFusion's distribution rule removes when the child has a
/// single partition (one row group a window's job scans, say), as a single
/// partition "satisfies" any hash distribution; but the ranges and the
/// ranks need their own.
fn over_exchange(
    node: &PlanNode,
    name: &str,
    index: usize,
    partitions: usize,
) -> Rewritten {
    let column: Arc<dyn datafusion::physical_expr::PhysicalExpr> = Arc::new(
        datafusion::physical_plan::expressions::Column::new(name, index),
    );
    let exchanged: Arc<dyn ExecutionPlan> = Arc::new(RepartitionExec::try_new(
        Arc::clone(node.children()[0]),
        Partitioning::Hash(vec![column], partitions),
    )?);
    Ok(Transformed::yes(replace_children_if_necessary(
        Arc::clone(node),
        vec![exchanged],
    )?))
}

/// A repartition's partition count.
fn partitions(repartition: &RepartitionExec) -> usize {
    repartition.partitioning().partition_count()
}

/// Fails unless a ranged [`super::PermuteExec`] reads a hash exchange into as
/// many partitions as its [`super::RangeBucketExec`] has ranges: the
/// distribution rule re-sizes exchanges to the target partition count, and
/// a re-sized one would send rows to the wrong ranges.
fn check_range_exchange(permute: &super::PermuteExec) -> Result<()> {
    let sized = hash_exchange_over::<super::RangeBucketExec>(permute.children()[0])
        .map(|(exchange, bucket)| (partitions(exchange), bucket.partitions()));
    match sized {
        Some((n, ranges)) if n == ranges => Ok(()),
        Some((n, ranges)) => plan_err!(
            "a SHUFFLE's range exchange was re-sized from {ranges} to {n} partitions; \
             plan it with the session's target partitions ({n})"
        ),
        None => plan_err!("a ranged PermuteExec does not read a range exchange"),
    }
}

/// `shard` (the node `node`) over a rank exchange of the deal's own size:
/// the distribution rule re-sizes every hash exchange to the session's
/// target partitions, which would send rows to other ranks' partitions.
fn resize_rank_exchange(
    shard: &RankShardExec,
    node: &Arc<dyn ExecutionPlan>,
) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
    let Some((exchange, deal)) = hash_exchange_over::<DealExec>(shard.children()[0])
    else {
        return Ok(Transformed::no(Arc::clone(node)));
    };
    let Partitioning::Hash(exprs, n) = exchange.partitioning() else {
        return Ok(Transformed::no(Arc::clone(node)));
    };
    if *n == deal.partitions() {
        return Ok(Transformed::no(Arc::clone(node)));
    }
    let exchange: Arc<dyn ExecutionPlan> = Arc::new(RepartitionExec::try_new(
        Arc::clone(exchange.input()),
        Partitioning::Hash(exprs.clone(), deal.partitions()),
    )?);
    Ok(Transformed::yes(Arc::new(RankShardExec::try_new(
        exchange,
    )?)))
}

/// The [`DealExec`] under `shard`, if the exchange between them has as many
/// partitions as the deal (else an error, like a re-sized range exchange).
fn dealt_input(shard: &RankShardExec) -> Result<&DealExec> {
    let sized = hash_exchange_over::<DealExec>(shard.children()[0])
        .map(|(exchange, deal)| (partitions(exchange), deal));
    match sized {
        Some((n, deal)) if n == deal.partitions() => Ok(deal),
        Some((n, deal)) => plan_err!(
            "a dealt SHUFFLE's rank exchange was re-sized from {} to {n} partitions",
            deal.partitions()
        ),
        None => {
            plan_err!("a RankShardExec does not read a rank exchange over a DealExec")
        }
    }
}

/// Fails if a [ranged](ShuffleMergeExec::ranged) shuffle sits under an operator
/// that does not keep each partition's order and the partitions as they are
/// (a coalesce, a repartition, a sort, a limit over all partitions): its
/// order lives in "partition 0, then 1, …" and would be lost silently.
fn check_ranged_shuffles(plan: &Arc<dyn ExecutionPlan>, keeps_order: bool) -> Result<()> {
    if let Some(shuffle) = plan.as_ref().downcast_ref::<ShuffleMergeExec>()
        && shuffle.is_ranged()
        && !keeps_order
    {
        return plan_err!(
            "a SHUFFLE planned with one task per key range \
             (sqlfeed.ordered_result_partitions) is under an operator that merges or \
             reorders partitions; set sqlfeed.ordered_result_partitions = false"
        );
    }
    // A deal's partitions are read in turn, like a ranged shuffle's; under
    // it the exchange is the deal's own, and the ranged shuffle's order is
    // what the deal consumes.
    if let Some(shard) = plan.as_ref().downcast_ref::<RankShardExec>() {
        if !keeps_order {
            return plan_err!(
                "a SHUFFLE dealt to ranks (sqlfeed.deal_world) is under an operator that \
                 merges or reorders partitions; set sqlfeed.deal_world = 0"
            );
        }
        let deal = dealt_input(shard)?;
        return check_ranged_shuffles(deal.children()[0], true);
    }
    if let Some(permute) = plan.as_ref().downcast_ref::<super::PermuteExec>()
        && permute.mode() == super::PermuteMode::Ranged
    {
        check_range_exchange(permute)?;
    }
    let children = plan.children();
    let order = plan.maintains_input_order();
    for (i, child) in children.iter().enumerate() {
        let keeps = keeps_order
            && children.len() == 1
            && order.get(i) == Some(&true)
            && plan.output_partitioning().partition_count()
                == child.output_partitioning().partition_count();
        check_ranged_shuffles(child, keeps)?;
    }
    Ok(())
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct KeepShuffleOrder;

crate::exec::node_rewrite_rule!(KeepShuffleOrder, "sqlfeed_keep_shuffle_order");

/// `plan` (the input of a [`PositionShuffleExec`]) without the round-robin
/// splits under its row-wise operators. A split sends whole batches of
/// different scan partitions to one partition, where a filter's coalescing
/// joins them: rows of one file would reach the shuffle interleaved with
/// another partition's rows of it, which it cannot rank (it refuses them
/// rather than guess). The scan's own partitions read each file's row
/// groups in order.
fn without_round_robin(plan: &PlanNode) -> Result<Transformed<PlanNode>> {
    use datafusion::physical_plan::filter::FilterExec;
    use datafusion::physical_plan::projection::ProjectionExec;
    if let Some(repartition) = plan.as_ref().downcast_ref::<RepartitionExec>()
        && matches!(repartition.partitioning(), Partitioning::RoundRobinBatch(_))
    {
        let input = without_round_robin(repartition.input())?;
        return Ok(Transformed::yes(input.data));
    }
    let row_wise = plan.as_ref().downcast_ref::<FilterExec>().is_some()
        || plan.as_ref().downcast_ref::<ProjectionExec>().is_some();
    let children = plan.children();
    let [child] = children.as_slice() else {
        return Ok(Transformed::no(Arc::clone(plan)));
    };
    if !row_wise {
        return Ok(Transformed::no(Arc::clone(plan)));
    }
    let child = without_round_robin(child)?;
    if !child.transformed {
        return Ok(Transformed::no(Arc::clone(plan)));
    }
    Ok(Transformed::yes(replace_children_if_necessary(
        Arc::clone(plan),
        vec![child.data],
    )?))
}

impl NodeRewrite for KeepShuffleOrder {
    fn rewrite(&self, node: PlanNode, _config: &ConfigOptions) -> Rewritten {
        if node
            .as_ref()
            .downcast_ref::<PositionShuffleExec>()
            .is_some()
        {
            let input = without_round_robin(node.children()[0])?;
            if !input.transformed {
                return Ok(Transformed::no(node));
            }
            return Ok(Transformed::yes(replace_children_if_necessary(
                node,
                vec![input.data],
            )?));
        }
        if let Some(shard) = node.as_ref().downcast_ref::<RankShardExec>() {
            if let Some(deal) = shard.children()[0].as_ref().downcast_ref::<DealExec>() {
                let route = deal.schema().fields().len() - 1;
                return over_exchange(&node, RANK_ROUTE_COLUMN, route, deal.partitions());
            }
            return resize_rank_exchange(shard, &node);
        }
        if let Some(permute) = node.as_ref().downcast_ref::<super::PermuteExec>()
            && permute.mode() == super::PermuteMode::Ranged
            && let Some(bucket) = permute.children()[0]
                .as_ref()
                .downcast_ref::<super::RangeBucketExec>()
        {
            let column = bucket.schema().index_of(super::RANGE_BUCKET_COLUMN)?;
            let ranges = bucket.partitions();
            return over_exchange(&node, super::RANGE_BUCKET_COLUMN, column, ranges);
        }
        let Some(repartition) = node.as_ref().downcast_ref::<RepartitionExec>() else {
            return Ok(Transformed::no(node));
        };
        if matches!(repartition.partitioning(), Partitioning::RoundRobinBatch(_))
            && carries_shuffle_order(repartition.input())
        {
            return Ok(Transformed::yes(Arc::clone(repartition.input())));
        }
        Ok(Transformed::no(node))
    }

    fn check(&self, plan: &PlanNode) -> Result<()> {
        check_ranged_shuffles(plan, true)
    }
}
