//! Physical optimizer rules that rewrite a plan one node at a time.
//!
//! sqlfeed's rules (`KeepShuffleOrder`, `NameFileErrors`, `ParallelFunctions`,
//! `BalanceScanRows`) each look at one node, maybe replace it, and leave the
//! walk to DataFusion's [`TreeNode`]. A rule implements [`NodeRewrite`] and
//! [`node_rewrite_rule!`] makes it a [`PhysicalOptimizerRule`], so the
//! walk, the final check and the schema check are written once.
//!
//! ```text
//!   plan ──walk (leaves up, or root down)──► rewrite(node) per node ──► check(plan) ──► plan
//! ```

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;

/// A node of a physical plan, as a rule sees and returns it.
pub(crate) type PlanNode = Arc<dyn ExecutionPlan>;

/// One node's rewrite: the node, new or as it was.
pub(crate) type Rewritten = Result<Transformed<PlanNode>>;

/// A rule that rewrites a plan node by node; see the module docs.
pub(crate) trait NodeRewrite {
    /// Whether the walk starts at the root (a rewrite may then return
    /// `TreeNodeRecursion::Jump` to leave a subtree alone) rather than at the
    /// leaves.
    const ROOT_FIRST: bool = false;

    /// Rewrites one node whose children are already rewritten (leaves
    /// first) or not yet visited (root first).
    fn rewrite(&self, node: PlanNode, config: &ConfigOptions) -> Rewritten;

    /// Checks the whole rewritten plan.
    fn check(&self, _plan: &PlanNode) -> Result<()> {
        Ok(())
    }
}

/// Walks `plan` with `rule`'s rewrite, then checks the result.
pub(crate) fn rewrite_nodes<R: NodeRewrite>(
    rule: &R,
    plan: PlanNode,
    config: &ConfigOptions,
) -> Result<PlanNode> {
    let rewritten = if R::ROOT_FIRST {
        plan.transform_down(|node| rule.rewrite(node, config))?
    } else {
        plan.transform_up(|node| rule.rewrite(node, config))?
    };
    rule.check(&rewritten.data)?;
    Ok(rewritten.data)
}

/// Implements DataFusion's `PhysicalOptimizerRule` for a [`NodeRewrite`],
/// by the name its optimizer listings show. (A blanket impl is not allowed
/// for a trait of another crate.)
macro_rules! node_rewrite_rule {
    ($rule:ty, $name:literal) => {
        impl datafusion::physical_optimizer::PhysicalOptimizerRule for $rule {
            fn optimize(
                &self,
                plan: $crate::exec::PlanNode,
                config: &datafusion::config::ConfigOptions,
            ) -> datafusion::error::Result<$crate::exec::PlanNode> {
                $crate::exec::rewrite_nodes(self, plan, config)
            }

            fn name(&self) -> &str {
                $name
            }

            fn schema_check(&self) -> bool {
                true
            }
        }
    };
}
pub(crate) use node_rewrite_rule;
