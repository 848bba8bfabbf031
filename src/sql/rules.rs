//! The optimizer rules every sqlfeed engine plans with (the embedded
//! session and a Ballista scheduler): DataFusion's, with sqlfeed's in the
//! places they must run.

use std::sync::Arc;

use datafusion::optimizer::OptimizerRule;

use super::no_new_evaluations::{GUARDED_RULES, NoNewEvaluations};

/// DataFusion's logical optimizer rules with sqlfeed's in front:
/// [`crate::shuffle::LateRowFunctions`] must see a shuffle's input projection
/// as the SQL planner built it, before common subexpression elimination
/// splits it or projection pushdown folds it into the scan. DataFusion's
/// leaf-expression rules are guarded by [`NoNewEvaluations`]: as shipped in
/// 55 they compute a struct made by a function once per field read.
pub fn optimizer_rules() -> Vec<Arc<dyn OptimizerRule + Send + Sync>> {
    let mut rules: Vec<Arc<dyn OptimizerRule + Send + Sync>> =
        vec![Arc::new(crate::shuffle::LateRowFunctions)];
    rules.extend(
        datafusion::optimizer::Optimizer::new()
            .rules
            .into_iter()
            .map(|rule| -> Arc<dyn OptimizerRule + Send + Sync> {
                if GUARDED_RULES.contains(&rule.name()) {
                    Arc::new(NoNewEvaluations::new(rule))
                } else {
                    rule
                }
            }),
    );
    rules
}

/// DataFusion's physical optimizer rules with sqlfeed's after the
/// distribution rules (which insert the round-robin splits that
/// [`crate::shuffle::KeepShuffleOrder`] takes out again, and settle the
/// partition counts that [`crate::sql::ParallelFunctions`] sizes its workers
/// by) and before projection pushdown (which would fold a projection of
/// costly functions into the file scan, out of their reach).
/// [`crate::shuffle::CarryCheapOutputs`] runs before `ParallelFunctions`
/// too: it splits the projection above a shuffle, which that rule would
/// otherwise have turned into its own operator.
/// `parallel_functions`: false on a Ballista scheduler, whose executors
/// parallelise costly functions for their own cores; it keeps only a
/// quarantining feed's projections out of file scans.
pub fn physical_optimizer_rules(
    parallel_functions: bool,
) -> Vec<Arc<dyn datafusion::physical_optimizer::PhysicalOptimizerRule + Send + Sync>> {
    let mut rules =
        datafusion::physical_optimizer::optimizer::PhysicalOptimizer::new().rules;
    let at = rules
        .iter()
        .position(|r| r.name() == "ProjectionPushdown")
        .unwrap_or(rules.len());
    let mut ours: Vec<
        Arc<dyn datafusion::physical_optimizer::PhysicalOptimizerRule + Send + Sync>,
    > = vec![
        Arc::new(crate::shuffle::KeepShuffleOrder),
        Arc::new(crate::shuffle::CarryCheapOutputs),
    ];
    ours.push(Arc::new(if parallel_functions {
        crate::sql::ParallelFunctions::default()
    } else {
        crate::sql::ParallelFunctions::isolation_only()
    }));
    rules.splice(at..at, ours);
    // Last: it changes the plan's schema, and projection pushdown must not
    // fold the projections it isolates into scans afterwards.
    rules.push(Arc::new(crate::sql::IsolateRowErrors));
    rules
}
