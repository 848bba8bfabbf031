//! The scaffolding single-input operators share: their one child, and the
//! statistics of operators that pass their input's rows through.

use std::sync::Arc;

use datafusion::error::Result;

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
        _ => Err(datafusion::error::DataFusionError::Internal(format!(
            "{name} takes one child, got {}",
            children.len()
        ))),
    }
}
