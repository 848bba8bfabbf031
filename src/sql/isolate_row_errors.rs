//! [`IsolateRowErrors`]: the physical optimizer rule that makes the
//! projections at the top of a plan mark their failing rows instead of
//! failing (`sqlfeed.isolate_row_errors`, which a feed with `on_error =
//! quarantine` sets), on the embedded engine and on a Ballista scheduler
//! alike, so that every process agrees on the result's schema.
//!
//! ```text
//!  Projection: f(a) AS x, g(b) AS y          ParallelProjectionExec:
//!    Projection: h(c) AS a, b         ──►      row_errors=isolated, x, y,
//!      …                                       __sqlfeed_row_error
//!                                            ParallelProjectionExec:
//!                                              row_errors=isolated, a, b, …
//!                                            …
//! ```
//!
//! The result always ends with the marker column
//! ([`crate::exec::row_errors::ROW_ERROR_COLUMN`]): a plan without a
//! projection at its top gets one that passes its columns through (it
//! cannot fail), so a client reading a cluster job knows the schema from
//! the query alone ([`isolating_schema`] of it). It runs last, after
//! projection pushdown, which would otherwise fold the projections into
//! file scans (with the setting on, [`super::ParallelFunctions`] keeps
//! computing projections out of scans on the embedded engine).

use std::sync::Arc;

use datafusion::common::internal_err;
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};

use super::ParallelProjectionExec;
use crate::config::SqlfeedOptions;
use crate::exec::row_errors::has_row_errors;
pub use crate::exec::row_errors::isolating_schema;

/// See the module docs.
#[derive(Debug, Default)]
pub struct IsolateRowErrors;

impl PhysicalOptimizerRule for IsolateRowErrors {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let options = SqlfeedOptions::of(config);
        if !options.isolate_row_errors {
            return Ok(plan);
        }
        isolate_output_projections(plan, options.function_batch_bytes)
    }

    fn name(&self) -> &str {
        "sqlfeed_isolate_row_errors"
    }

    // It appends the marker column to the plan's schema.
    fn schema_check(&self) -> bool {
        false
    }
}

/// `plan` with the projections at its top isolating row errors: each is
/// rebuilt as a [`ParallelProjectionExec`] that marks failing rows (a plain
/// projection with one worker per partition, in morsels of about
/// `batch_bytes`, 0 for the default); a projection over another carries
/// that one's marks. A plan without a projection at its top gets one that
/// passes its columns through. Applied twice, the second changes nothing.
pub fn isolate_output_projections(
    plan: Arc<dyn ExecutionPlan>,
    batch_bytes: usize,
) -> Result<Arc<dyn ExecutionPlan>> {
    let batch_bytes = match batch_bytes {
        0 => SqlfeedOptions::default().function_batch_bytes,
        bytes => bytes,
    };
    let mut chain: Vec<Arc<dyn ExecutionPlan>> = vec![];
    let mut node = Arc::clone(&plan);
    while node.downcast_ref::<ProjectionExec>().is_some()
        || node.downcast_ref::<ParallelProjectionExec>().is_some()
    {
        let child = Arc::clone(node.children()[0]);
        chain.push(node);
        node = child;
    }
    if chain.is_empty() {
        if has_row_errors(&plan.schema()) {
            return internal_err!(
                "a plan whose rows are marked has no projection at its top"
            );
        }
        let schema = plan.schema();
        let columns = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, field)| {
                ProjectionExpr::new(Arc::new(Column::new(field.name(), i)), field.name())
            })
            .collect::<Vec<_>>();
        let identity = ProjectionExec::try_new(columns, plan)?;
        return Ok(Arc::new(ParallelProjectionExec::isolating_row_errors(
            &identity,
            1,
            batch_bytes,
        )));
    }
    let mut rebuilt = node;
    for projection in chain.iter().rev() {
        let (exprs, workers, bytes) =
            match projection.downcast_ref::<ParallelProjectionExec>() {
                Some(parallel) => (
                    parallel.exprs().to_vec(),
                    parallel.workers(),
                    parallel.batch_bytes(),
                ),
                None => match projection.downcast_ref::<ProjectionExec>() {
                    Some(plain) => (plain.expr().to_vec(), 1, batch_bytes),
                    None => {
                        return internal_err!(
                            "a projection chain holds {}",
                            projection.name()
                        );
                    }
                },
            };
        let projection = ProjectionExec::try_new(exprs, rebuilt)?;
        rebuilt = Arc::new(ParallelProjectionExec::isolating_row_errors(
            &projection,
            workers,
            bytes,
        ));
    }
    Ok(rebuilt)
}
