//! The compact form of a query's result: what an epoch cache stores when the
//! query's last step only widens values cheaply.
//!
//! ```text
//!  SELECT image_to_tensor(image_resize(image_decode(jpeg), 64, 64), mean, std) AS x, label
//!
//!  stored (cached): image_resize(image_decode(jpeg), 64, 64) AS x, label     uint8, 12 KB/row
//!  finish (applied on the way out, every epoch): image_to_tensor(x, mean, std) AS x, label
//!                                                                            float32, 48 KB/row
//! ```
//!
//! Which functions only widen is decided by
//! [`sqlfeed_udfs::widens_compact_input`] (by implementation type); they are
//! deterministic and row-wise, so applying them to the cached values gives
//! exactly the query's values. Only the query's top projection is split, and
//! only calls whose other arguments are literals (the normalisation
//! constants), so the finish step reads nothing but the stored columns.

use datafusion::common::tree_node::TreeNode;
use datafusion::common::{Column, internal_err};
use datafusion::error::Result;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Expr, LogicalPlan, LogicalPlanBuilder, Projection, Volatility,
};
use datafusion::physical_expr::PhysicalExpr;
use std::sync::Arc;

/// A query split into what a cache stores and what is applied on the way
/// out.
#[derive(Debug, Clone)]
pub struct CompactPlan {
    /// The plan whose result is cached.
    pub stored: LogicalPlan,
    /// Expressions over `stored`'s columns (by name) that give the query's
    /// columns; plain columns where nothing was split.
    pub finish: Vec<Expr>,
    /// Whether some call was split off (else `stored` is the query).
    pub split: bool,
}

/// `plan` split as the [module docs](self) say; unsplit (`split == false`)
/// when its top is not a projection or nothing in it only widens.
pub fn compact(plan: LogicalPlan) -> Result<CompactPlan> {
    let unsplit = |plan: LogicalPlan| {
        let finish = plan
            .schema()
            .fields()
            .iter()
            .map(|f| Expr::Column(Column::from_name(f.name())))
            .collect();
        CompactPlan {
            stored: plan,
            finish,
            split: false,
        }
    };
    let LogicalPlan::Projection(projection) = &plan else {
        return Ok(unsplit(plan));
    };
    let schema = &projection.schema;
    let mut names: Vec<&str> =
        schema.fields().iter().map(|f| f.name().as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        // Finish expressions read the stored columns by name.
        return Ok(unsplit(plan));
    }
    let mut stored = Vec::with_capacity(projection.expr.len());
    let mut finish = Vec::with_capacity(projection.expr.len());
    let mut split = false;
    for (i, expr) in projection.expr.iter().enumerate() {
        let name = schema.field(i).name();
        match widening_call(expr) {
            Some((call, compact_arg)) => {
                split = true;
                stored.push(compact_arg.clone().alias(name));
                let mut args = call.args.clone();
                args[0] = Expr::Column(Column::from_name(name));
                finish.push(
                    Expr::ScalarFunction(ScalarFunction::new_udf(
                        Arc::clone(&call.func),
                        args,
                    ))
                    .alias(name),
                );
            }
            None => {
                stored.push(expr.clone());
                finish.push(Expr::Column(Column::from_name(name)));
            }
        }
    }
    if !split {
        return Ok(unsplit(plan));
    }
    let stored = LogicalPlan::Projection(Projection::try_new(
        stored,
        Arc::clone(&projection.input),
    )?);
    Ok(CompactPlan {
        stored,
        finish,
        split,
    })
}

/// `finish` applied to `plan` (whose columns include the stored ones).
pub fn apply_finish(plan: LogicalPlan, finish: &[Expr]) -> Result<LogicalPlan> {
    LogicalPlanBuilder::from(plan)
        .project(finish.iter().cloned())?
        .build()
}

/// `finish` as the expressions (and output names) of a physical projection
/// over the rows of `stored`, normalised against its columns (qualified or
/// not): for rows read back in their stored form.
pub fn finish_exprs(
    state: &SessionState,
    stored: &LogicalPlan,
    finish: &[Expr],
) -> Result<Vec<(Arc<dyn PhysicalExpr>, String)>> {
    let LogicalPlan::Projection(finished) = apply_finish(stored.clone(), finish)? else {
        return internal_err!("a compact plan's finish step is not a projection");
    };
    finished
        .expr
        .iter()
        .zip(finished.schema.fields())
        .map(|(expr, field)| {
            let expr = expr.clone().unalias_nested().data;
            Ok((
                state.create_physical_expr(expr, stored.schema())?,
                field.name().clone(),
            ))
        })
        .collect()
}

/// The call and its first argument when `expr` (under aliases) is a call of
/// a widening function on a non-constant value with constant other
/// arguments.
fn widening_call(expr: &Expr) -> Option<(&ScalarFunction, &Expr)> {
    let mut expr = expr;
    while let Expr::Alias(alias) = expr {
        expr = &alias.expr;
    }
    let Expr::ScalarFunction(call) = expr else {
        return None;
    };
    if !sqlfeed_udfs::widens_compact_input(&call.func) {
        return None;
    }
    let (first, rest) = call.args.split_first()?;
    // Only a value the shuffle would key on through the columns it reads
    // (a movable expression, see `crate::shuffle::late`): storing a bare
    // column or a volatile value would change the rows' content hash, and
    // with it the order of a cached shuffled feed.
    if is_constant(first)
        || !crate::shuffle::late::is_movable(first)
        || !rest.iter().all(is_constant)
    {
        return None;
    }
    Some((call, first))
}

/// Whether `expr` is built from literals by deterministic functions and
/// operators only (`[0.485, 0.456, 0.406]` is `make_array(…)` before
/// simplification).
fn is_constant(expr: &Expr) -> bool {
    !expr
        .exists(|e| {
            Ok(match e {
                Expr::Literal(..)
                | Expr::Alias(_)
                | Expr::Cast(_)
                | Expr::TryCast(_)
                | Expr::Negative(_)
                | Expr::BinaryExpr(_) => false,
                Expr::ScalarFunction(f) => {
                    f.func.signature().volatility == Volatility::Volatile
                }
                _ => true,
            })
        })
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn plan(sql: &str) -> Result<LogicalPlan> {
        let ctx = SessionContext::new();
        for udf in sqlfeed_udfs::scalar_functions_with(&Default::default()) {
            ctx.register_udf(udf);
        }
        ctx.sql("CREATE TABLE t (b BYTEA, label INT)").await?;
        Ok(ctx.sql(sql).await?.into_unoptimized_plan())
    }

    #[tokio::test]
    async fn image_to_tensor_is_applied_on_the_way_out() -> Result<()> {
        let query = plan(
            "SELECT image_to_tensor(image_resize(image_decode(b), 8, 8), \
             [0.5, 0.5, 0.5], [0.2, 0.2, 0.2]) AS x, label FROM t",
        )
        .await?;
        let compact = compact(query.clone())?;
        assert!(compact.split);
        let stored = compact.stored.schema();
        assert_eq!(stored.field(0).name(), "x");
        assert!(
            format!("{:?}", stored.field(0).data_type()).contains("UInt8"),
            "{stored}"
        );
        let finished = apply_finish(compact.stored, &compact.finish)?;
        finished
            .schema()
            .has_equivalent_names_and_types(query.schema())?;
        Ok(())
    }

    #[tokio::test]
    async fn calls_with_computed_constants_or_other_tops_are_not_split() -> Result<()> {
        for sql in [
            "SELECT image_to_tensor(image_decode(b), [0.5, 0.5, 0.5], \
             [CAST(label AS DOUBLE), 0.2, 0.2]) AS x FROM t",
            "SELECT image_decode(b) AS x, label FROM t",
            // A bare column: the content hash would read the pixels.
            "SELECT image_to_tensor(img) AS x FROM \
             (SELECT image_decode(b) AS img, label FROM t)",
            "SELECT image_to_tensor(image_decode(b)) AS x FROM t ORDER BY label",
        ] {
            let compact = compact(plan(sql).await?)?;
            assert!(!compact.split, "{sql}");
            assert_eq!(compact.finish.len(), compact.stored.schema().fields().len());
        }
        Ok(())
    }
}
