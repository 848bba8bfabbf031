//! [`SqlfeedQueryPlanner`]: DataFusion's physical planner with sqlfeed's
//! extension planners: `SHUFFLE` (crate::shuffle), `MIX`
//! (crate::shuffle::mix) and, on a cluster, the
//! executor cache's writes (`crate::cache::shared`).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::internal_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{
    DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner,
};
use datafusion_session::Session;

use crate::shuffle::ShuffleExtensionPlanner;
use crate::shuffle::mix::MixExtensionPlanner;

/// DataFusion's planner with sqlfeed's extension planners.
#[derive(Debug, Default)]
pub struct SqlfeedQueryPlanner {
    shuffle: ShuffleExtensionPlanner,
    mix: MixExtensionPlanner,
}

impl SqlfeedQueryPlanner {
    /// The planner of the embedded engine.
    pub fn embedded() -> Self {
        Self {
            shuffle: ShuffleExtensionPlanner::embedded(),
            mix: MixExtensionPlanner::embedded(),
        }
    }

    /// The planner of a Ballista scheduler: stage-shaped shuffles.
    pub fn stage_shaped() -> Self {
        Self {
            shuffle: ShuffleExtensionPlanner::stage_shaped(),
            mix: MixExtensionPlanner::stage_shaped(),
        }
    }
}

#[async_trait]
impl QueryPlanner for SqlfeedQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let planners: Vec<Arc<dyn ExtensionPlanner + Send + Sync>> = vec![
            Arc::new(self.shuffle),
            Arc::new(self.mix),
            Arc::new(CachePlanner),
        ];
        DefaultPhysicalPlanner::with_extension_planners(planners)
            .create_physical_plan(logical_plan, session)
            .await
    }
}

/// Plans the executor cache's write node (`crate::cache::shared`).
#[derive(Debug, Default, Clone, Copy)]
struct CachePlanner;

#[async_trait]
impl ExtensionPlanner for CachePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if let Some(write) = node
            .as_any()
            .downcast_ref::<crate::cache::shared::SharedEntryWriteNode>()
        {
            let [input] = physical_inputs else {
                return internal_err!(
                    "SharedEntryWrite has one input, got {}",
                    physical_inputs.len()
                );
            };
            return Ok(Some(Arc::new(
                crate::cache::shared::SharedEntryWriteExec::try_new(
                    Arc::clone(input),
                    write.dir().to_string(),
                )?,
            )));
        }
        let _ = (
            node,
            physical_inputs,
            DataFusionError::Internal(String::new()),
        );
        Ok(None)
    }
}
