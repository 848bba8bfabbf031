//! The scaffolding single-input operators share: their one child, the
//! statistics of operators that pass their input's rows through, and which
//! expressions are costly per row.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::internal_datafusion_err;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::physical_expr::{
    EquivalenceProperties, PhysicalExpr, ScalarFunctionExpr,
};
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, PlanProperties};

/// Whether `expr` calls a function that is costly per row (see
/// [`sqlfeed_udfs::is_costly_per_row`]).
pub(crate) fn calls_costly_function(expr: &Arc<dyn PhysicalExpr>) -> bool {
    let mut costly = false;
    visit_costly_functions(expr, |_| {
        costly = true;
        TreeNodeRecursion::Stop
    });
    costly
}

/// The names of the costly functions `exprs` call, outermost first, each
/// once: what a feed's timeline names the stage that runs them.
pub(crate) fn costly_function_names<'a>(
    exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>,
) -> Vec<String> {
    let mut names: Vec<String> = vec![];
    for expr in exprs {
        visit_costly_functions(expr, |name| {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
            TreeNodeRecursion::Continue
        });
    }
    names
}

fn visit_costly_functions(
    expr: &Arc<dyn PhysicalExpr>,
    mut visit: impl FnMut(&str) -> TreeNodeRecursion,
) {
    // The closure never fails.
    let _ = expr.apply(|e| {
        if let Some(call) = e.as_ref().downcast_ref::<ScalarFunctionExpr>()
            && sqlfeed_udfs::is_costly_per_row(call.fun())
        {
            return Ok(visit(call.name()));
        }
        Ok(TreeNodeRecursion::Continue)
    });
}

/// Properties of an operator that makes each output row from one row of the
/// same input partition, in order (columns added, dropped or reordered,
/// rows permuted within a partition): its input's partitioning, emission
/// and boundedness; no ordering or equivalences of its own.
pub(crate) fn row_wise_properties(
    input: &Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        input.output_partitioning().clone(),
        input.pipeline_behavior(),
        input.boundedness(),
    ))
}

/// Statistics of an operator that passes its input's rows through one for
/// one (reordered, or with columns added or computed), from its one input's
/// (`input_stats[0]`): the row count, columns unknown.
pub(crate) fn rows_passed_through(
    input_stats: &[Arc<datafusion::common::Statistics>],
    schema: &datafusion::arrow::datatypes::Schema,
) -> Arc<datafusion::common::Statistics> {
    let mut statistics = datafusion::common::Statistics::new_unknown(schema);
    if let Some(input) = input_stats.first() {
        statistics.num_rows = input.num_rows;
    }
    Arc::new(statistics)
}

/// Statistics of an operator whose output is its one input's, rows and
/// columns (`input_stats[0]`).
pub(crate) fn first_input_statistics(
    input_stats: &[Arc<datafusion::common::Statistics>],
    schema: &datafusion::arrow::datatypes::Schema,
) -> Arc<datafusion::common::Statistics> {
    input_stats
        .first()
        .map(Arc::clone)
        .unwrap_or_else(|| Arc::new(datafusion::common::Statistics::new_unknown(schema)))
}

/// The one child of a single-input operator, or an internal error.
pub(crate) fn single_child(
    name: &str,
    children: &[Arc<dyn datafusion::physical_plan::ExecutionPlan>],
) -> Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    match children {
        [child] => Ok(Arc::clone(child)),
        _ => Err(internal_datafusion_err!(
            "{name} takes one child, got {}",
            children.len()
        )),
    }
}

/// `apply_expressions` of an operator that evaluates no expressions of its
/// own. Used inside `impl ExecutionPlan for …`.
macro_rules! no_expressions {
    () => {
        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::error::Result<
                datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> datafusion::error::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }
    };
}
pub(crate) use no_expressions;

/// The `ExecutionPlan` methods of an operator over the one input in its
/// field `$input` that evaluates no expressions of its own: `children` and
/// `apply_expressions`. Used inside `impl ExecutionPlan for …`.
macro_rules! one_input_children {
    ($input:ident) => {
        fn children(
            &self,
        ) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![&self.$input]
        }

        $crate::exec::no_expressions!();
    };
}
pub(crate) use one_input_children;

/// The `ExecutionPlan` methods of a leaf (an operator without inputs) that
/// evaluates no expressions: `children`, `apply_expressions` and
/// `with_new_children`, which refuses children by the operator's name. Used
/// inside `impl ExecutionPlan for …`.
macro_rules! leaf {
    () => {
        fn children(
            &self,
        ) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![]
        }

        $crate::exec::no_expressions!();

        fn with_new_children(
            self: std::sync::Arc<Self>,
            children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::error::Result<
            std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        > {
            if children.is_empty() {
                Ok(self)
            } else {
                datafusion::common::internal_err!(
                    "{} is a leaf and takes no children, got {}",
                    self.name(),
                    children.len()
                )
            }
        }
    };
}
pub(crate) use leaf;

/// `maintains_input_order` and `benefits_from_input_partitioning` of a
/// single-input operator whose rows keep their input's order, partition by
/// partition, over an input that must not be split: a round-robin split
/// below it would interleave an ordered input's rows by timing. Used inside
/// `impl ExecutionPlan for …`.
macro_rules! keeps_input_order {
    () => {
        fn maintains_input_order(&self) -> Vec<bool> {
            vec![true]
        }

        fn benefits_from_input_partitioning(&self) -> Vec<bool> {
            vec![false]
        }
    };
}
pub(crate) use keeps_input_order;

/// `properties`: those of the one input in the field `$input` (an operator
/// that keeps its input's partitioning, order and boundedness).
macro_rules! input_properties {
    ($input:ident) => {
        fn properties(
            &self,
        ) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            self.$input.properties()
        }
    };
}
pub(crate) use input_properties;

/// `child_stats_requests` and `statistics_from_inputs` of an operator whose
/// statistics come from its one input's, for the same partition, through
/// `$from` ([`first_input_statistics`] or [`rows_passed_through`]).
macro_rules! statistics_of_one_input {
    ($from:ident) => {
        fn child_stats_requests(
            &self,
            partition: Option<usize>,
        ) -> Vec<datafusion::physical_plan::statistics::ChildStats> {
            vec![datafusion::physical_plan::statistics::ChildStats::At(
                partition,
            )]
        }

        fn statistics_from_inputs(
            &self,
            input_stats: &[std::sync::Arc<datafusion::common::Statistics>],
            _args: &datafusion::physical_plan::statistics::StatisticsArgs,
        ) -> datafusion::error::Result<std::sync::Arc<datafusion::common::Statistics>> {
            Ok($crate::exec::$from(input_stats, &self.schema()))
        }
    };
}
pub(crate) use statistics_of_one_input;

/// The value of a `count(*)` query's one row, from its `batches`; `what`
/// names the query in an error.
pub(crate) fn counted_rows(
    batches: &[datafusion::arrow::record_batch::RecordBatch],
    what: &str,
) -> datafusion::error::Result<u64> {
    use datafusion::common::ScalarValue;
    let value = batches
        .iter()
        .find(|batch| batch.num_rows() == 1)
        .map(|batch| ScalarValue::try_from_array(batch.column(0), 0))
        .transpose()?;
    match value {
        Some(ScalarValue::Int64(Some(rows))) => Ok(rows.max(0) as u64),
        other => datafusion::common::internal_err!("count(*) of {what} gave {other:?}"),
    }
}
