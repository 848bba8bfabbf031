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
//! ```text
//!  ProjectionExec                        ProjectionExec
//!    RepartitionExec: RoundRobinBatch      ShuffleExec
//!      ShuffleExec                 ──►       …
//!        …
//! ```

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use super::ShuffleExec;

/// Whether `plan` streams a global shuffle's order: a [`ShuffleExec`], or a
/// single-partition, order-keeping operator over one.
fn carries_shuffle_order(plan: &Arc<dyn ExecutionPlan>) -> bool {
    if plan.as_ref().downcast_ref::<ShuffleExec>().is_some() {
        return true;
    }
    match (
        plan.children().as_slice(),
        plan.maintains_input_order().as_slice(),
    ) {
        ([child], [true]) => {
            plan.output_partitioning().partition_count() == 1
                && carries_shuffle_order(child)
        }
        _ => false,
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct KeepShuffleOrder;

impl PhysicalOptimizerRule for KeepShuffleOrder {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(repartition) = node.as_ref().downcast_ref::<RepartitionExec>()
            else {
                return Ok(Transformed::no(node));
            };
            if matches!(repartition.partitioning(), Partitioning::RoundRobinBatch(_))
                && carries_shuffle_order(repartition.input())
            {
                return Ok(Transformed::yes(Arc::clone(repartition.input())));
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "sqlfeed_keep_shuffle_order"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
