//! The scaffolding single-input operators share: their one child, the
//! statistics of operators that pass their input's rows through, and which
//! expressions are costly per row.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_datafusion_err, internal_err};
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

/// The names of `schema`'s columns, comma-separated: what an error about a
/// missing column lists.
pub(crate) fn column_names(schema: &datafusion::arrow::datatypes::Schema) -> String {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    names.join(", ")
}

/// The schema of an operator that adds the non-null `UInt64` column `name`
/// (a shuffle key, a rank route) after its input's columns, leaving out
/// the input's column `leave_out` if any; the input's metadata is kept.
pub(crate) fn with_u64_column(
    input: &datafusion::arrow::datatypes::Schema,
    name: &str,
    leave_out: Option<usize>,
) -> SchemaRef {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let mut fields: Vec<Arc<Field>> = input
        .fields()
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != leave_out)
        .map(|(_, f)| Arc::clone(f))
        .collect();
    fields.push(Arc::new(Field::new(name, DataType::UInt64, false)));
    Arc::new(Schema::new_with_metadata(fields, input.metadata().clone()))
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

/// The scaffolding of an operator over the one input in its field `input`
/// that evaluates no expressions of its own: `name`, `properties` (`own`:
/// its field `properties`; `passed_through`: its input's, for an operator
/// that keeps its input's partitioning, order and boundedness), `children`,
/// `apply_expressions`, and `with_new_children`, which checks that there is
/// one child and rebuilds the operator over it with `|this, child| …`
/// (a `Result<Self>`). Used inside `impl ExecutionPlan for …`:
///
/// ```text
/// crate::exec::one_input_operator! {
///     name: "LocalShuffleExec",
///     properties: own,
///     rebuild: |this, child| Ok(Self::new(child, this.buffer_rows, this.seed)),
/// }
/// ```
macro_rules! one_input_operator {
    (name: $name:literal, properties: own, rebuild: $($rebuild:tt)+) => {
        $crate::exec::name_and_properties!($name);

        $crate::exec::one_input_operator!(@common $name, $($rebuild)+);
    };
    (name: $name:literal, properties: passed_through, rebuild: $($rebuild:tt)+) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(
            &self,
        ) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            self.input.properties()
        }

        $crate::exec::one_input_operator!(@common $name, $($rebuild)+);
    };
    (@common $name:literal, |$this:pat, $child:ident| $rebuild:expr $(,)?) => {
        fn children(&self) -> Vec<&$crate::exec::PlanNode> {
            vec![&self.input]
        }

        $crate::exec::no_expressions!();

        fn with_new_children(
            self: std::sync::Arc<Self>,
            children: Vec<$crate::exec::PlanNode>,
        ) -> datafusion::error::Result<$crate::exec::PlanNode> {
            let $child = $crate::exec::single_child($name, &children)?;
            let $this: &Self = &self;
            let rebuilt: datafusion::error::Result<Self> = $rebuild;
            Ok(std::sync::Arc::new(rebuilt?))
        }
    };
}
pub(crate) use one_input_operator;

/// The scaffolding of a logical node over the one input in its field
/// `$input` whose output schema is its input's and that holds no
/// expressions: `name`, `inputs`, `schema`, `expressions`, and
/// `with_exprs_and_inputs`, which checks that there is one input and
/// rebuilds the node over it with `|this, input| …` (a `Result<Self>`).
/// Used inside `impl UserDefinedLogicalNodeCore for …`.
macro_rules! one_input_logical_node {
    (
        name: $name:literal,
        input: $input:ident,
        rebuild: |$this:pat, $new_input:ident| $rebuild:expr $(,)?
    ) => {
        fn name(&self) -> &str {
            $name
        }

        fn inputs(&self) -> Vec<&datafusion::logical_expr::LogicalPlan> {
            vec![&self.$input]
        }

        fn schema(&self) -> &datafusion::common::DFSchemaRef {
            self.$input.schema()
        }

        fn expressions(&self) -> Vec<datafusion::logical_expr::Expr> {
            vec![]
        }

        fn with_exprs_and_inputs(
            &self,
            exprs: Vec<datafusion::logical_expr::Expr>,
            inputs: Vec<datafusion::logical_expr::LogicalPlan>,
        ) -> datafusion::error::Result<Self> {
            let Ok([$new_input]) =
                <[datafusion::logical_expr::LogicalPlan; 1]>::try_from(inputs)
            else {
                return datafusion::common::internal_err!("{} takes one input", $name);
            };
            if !exprs.is_empty() {
                return datafusion::common::internal_err!(
                    "{} takes no expressions, got {}",
                    $name,
                    exprs.len()
                );
            }
            let $this: &Self = self;
            $rebuild
        }
    };
}
pub(crate) use one_input_logical_node;

/// `metrics`, read from the `ExecutionPlanMetricsSet` the operator keeps in
/// its field `metrics`. Used inside `impl ExecutionPlan for …`.
macro_rules! metrics_of_field {
    () => {
        fn metrics(&self) -> Option<datafusion::physical_plan::metrics::MetricsSet> {
            Some(self.metrics.clone_inner())
        }
    };
}
pub(crate) use metrics_of_field;

/// The properties of an operator with one bounded output partition of
/// `schema` and no known order, emitting as `emission` says.
pub(crate) fn one_bounded_partition(
    schema: SchemaRef,
    emission: datafusion::physical_plan::execution_plan::EmissionType,
) -> PlanProperties {
    PlanProperties::new(
        EquivalenceProperties::new(schema),
        datafusion::physical_plan::Partitioning::UnknownPartitioning(1),
        emission,
        datafusion::physical_plan::execution_plan::Boundedness::Bounded,
    )
}

/// Checks that `partition` is 0, for an operator `name` with one output
/// partition: another is DataFusion's mistake, not the user's.
pub(crate) fn only_partition(name: &str, partition: usize) -> Result<()> {
    if partition != 0 {
        return internal_err!("{name} has one partition, asked for {partition}");
    }
    Ok(())
}

/// The stream `ExecutionPlan::execute` returns, by a name short enough for
/// its signature to stand on one line.
pub(crate) type BatchStream = datafusion::execution::SendableRecordBatchStream;

/// An operator's `name` and its `properties`, kept in a field of that name.
/// Used inside `impl ExecutionPlan for …`.
macro_rules! name_and_properties {
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(
            &self,
        ) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            &self.properties
        }
    };
}
pub(crate) use name_and_properties;

/// The `ExecutionPlan` methods of a leaf (an operator without inputs) that
/// evaluates no expressions and keeps its `properties` in a field of that
/// name: `name`, `properties`, `children`, `apply_expressions` and
/// `with_new_children`, which refuses children by the operator's name. Used
/// inside `impl ExecutionPlan for …`.
macro_rules! leaf {
    ($name:literal) => {
        $crate::exec::name_and_properties!($name);

        fn children(&self) -> Vec<&$crate::exec::PlanNode> {
            vec![]
        }

        $crate::exec::no_expressions!();

        fn with_new_children(
            self: std::sync::Arc<Self>,
            children: Vec<$crate::exec::PlanNode>,
        ) -> datafusion::error::Result<$crate::exec::PlanNode> {
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

/// `child_stats_requests` and `statistics_from_inputs` of an operator whose
/// statistics come from its one input's, for the same partition, through
/// `$from` ([`first_input_statistics`] or [`rows_passed_through`]); with
/// `whole input`, from the input's over all its partitions (an operator
/// that makes one partition of many).
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

        $crate::exec::statistics_of_one_input!(@from $from);
    };
    ($from:ident, whole input) => {
        fn child_stats_requests(
            &self,
            _partition: Option<usize>,
        ) -> Vec<datafusion::physical_plan::statistics::ChildStats> {
            vec![datafusion::physical_plan::statistics::ChildStats::At(None)]
        }

        $crate::exec::statistics_of_one_input!(@from $from);
    };
    (@from $from:ident) => {

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

/// The column of logical `schema` called `name`, qualified as the schema
/// has it; its absence is an internal error (a rewrite lost it).
pub(crate) fn column_named(
    schema: &datafusion::common::DFSchema,
    name: &str,
) -> Result<datafusion::logical_expr::Expr> {
    let index = schema
        .fields()
        .iter()
        .position(|f| f.name() == name)
        .ok_or_else(|| {
            internal_datafusion_err!(
                "the plan lost its column {name} ({})",
                schema.field_names().join(", ")
            )
        })?;
    Ok(datafusion::logical_expr::Expr::Column(
        datafusion::common::Column::from(schema.qualified_field(index)),
    ))
}

/// A logical plan node's kind, as an error names it.
pub(crate) fn node_kind(plan: &datafusion::logical_expr::LogicalPlan) -> String {
    match plan {
        datafusion::logical_expr::LogicalPlan::Extension(extension) => {
            extension.node.name().to_string()
        }
        other => {
            let line = other.display().to_string();
            line.split(':').next().unwrap_or(&line).to_string()
        }
    }
}

/// Whether `provider` is a table of Parquet files (a listing table).
pub(crate) fn is_parquet_table(
    provider: &dyn datafusion::catalog::TableProvider,
) -> bool {
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::ListingTable;
    provider
        .downcast_ref::<ListingTable>()
        .is_some_and(|t| t.options().format.downcast_ref::<ParquetFormat>().is_some())
}
