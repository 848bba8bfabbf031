//! SQL array literals of strings planned as constants: `['a', 'b']` becomes
//! one list literal when the SQL is planned, not a `make_array('a', 'b')`
//! call that only the optimizer folds.
//!
//! Functions whose result type depends on a list argument need it as a
//! constant when the logical plan is built: `one_hot(value, ['a', 'b', 'c'])`
//! is three floats wide, and `DESCRIBE`, `DataFrame::schema` and every plan
//! node above the call see the type computed then. DataFusion's own planner
//! (`NestedFunctionPlanner`) turns every array literal into a `make_array`
//! call, which a function sees as a non-constant argument until the
//! simplifier has run. [`StringListPlanner`] runs first and plans the array
//! literals whose elements are all non-null string literals of one type as
//! the very list `make_array` would build, same type included; every other
//! array literal (numbers, NULLs, mixed types, column references) is left to
//! DataFusion, unchanged.

use std::sync::Arc;

use datafusion::common::{DFSchema, ScalarValue};
use datafusion::error::Result;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult};
use datafusion::prelude::SessionContext;

/// The value of `expr` when it is a non-null string literal without
/// metadata (what SQL's `'a'` is).
fn string_literal(expr: &Expr) -> Option<&ScalarValue> {
    match expr {
        Expr::Literal(
            value @ (ScalarValue::Utf8(Some(_))
            | ScalarValue::Utf8View(Some(_))
            | ScalarValue::LargeUtf8(Some(_))),
            None,
        ) => Some(value),
        _ => None,
    }
}

/// The list `make_array(exprs)` evaluates to, when `exprs` are non-null
/// string literals of one type: `List` of that type with DataFusion's
/// default nullable `item` field, one row. `None` for anything else, and for
/// an empty list (whose element type `make_array` decides).
fn string_list(exprs: &[Expr]) -> Option<ScalarValue> {
    let item_type = string_literal(exprs.first()?)?.data_type();
    let items = exprs
        .iter()
        .map(|e| {
            string_literal(e)
                .filter(|v| v.data_type() == item_type)
                .cloned()
        })
        .collect::<Option<Vec<_>>>()?;
    Some(ScalarValue::List(ScalarValue::new_list_nullable(
        &items, &item_type,
    )))
}

/// Plans SQL array literals of string literals (`['a', 'b']`) as one
/// constant list, so that functions see them as constants at logical
/// planning; see the module docs.
///
/// It must come before DataFusion's `NestedFunctionPlanner` in the
/// session's expression planners, which are asked in order and of which
/// that one plans every array literal: [`with_expr_planners`] and
/// [`register_expr_planners`] put it first.
///
/// ```
/// # use datafusion::error::Result;
/// # use datafusion::prelude::SessionContext;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<()> {
/// let ctx = SessionContext::new();
/// sqlfeed_udfs::planner::register_expr_planners(&ctx);
/// let df = ctx.sql("SELECT ['a', 'b'] AS l, [1, 2] AS n").await?;
/// let plan = df.logical_plan().display_indent().to_string();
/// // The strings are one literal, the numbers still a `make_array` call.
/// assert!(!plan.contains("make_array(Utf8"), "{plan}");
/// assert!(plan.contains("make_array(Int64(1), Int64(2))"), "{plan}");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Default)]
pub struct StringListPlanner;

impl ExprPlanner for StringListPlanner {
    fn plan_array_literal(
        &self,
        exprs: Vec<Expr>,
        _schema: &DFSchema,
    ) -> Result<PlannerResult<Vec<Expr>>> {
        Ok(match string_list(&exprs) {
            Some(list) => PlannerResult::Planned(Expr::Literal(list, None)),
            None => PlannerResult::Original(exprs),
        })
    }
}

/// This crate's expression planners, in the order they must be asked,
/// ahead of DataFusion's own.
pub fn expr_planners() -> Vec<Arc<dyn ExprPlanner>> {
    vec![Arc::new(StringListPlanner)]
}

/// `builder` with [`expr_planners`] ahead of the planners it holds, whether
/// or not DataFusion's defaults are there yet (`with_default_features`
/// appends them after).
pub fn with_expr_planners(mut builder: SessionStateBuilder) -> SessionStateBuilder {
    builder
        .expr_planners()
        .get_or_insert_with(Vec::new)
        .splice(0..0, expr_planners());
    builder
}

/// Puts [`expr_planners`] ahead of the planners of `ctx`'s state.
///
/// A session state has no way to insert a planner anywhere but last, so the
/// state is rebuilt from itself (same session id, catalogs, functions and
/// settings) with the planners in front, and swapped in place: the context
/// and whoever shares its state see the change. Statements prepared on
/// `ctx` before are forgotten, so call it while setting the context up.
/// Calling it twice adds the planners twice, which is harmless: a planner
/// that declines is followed by one that declines the same way.
pub fn register_expr_planners(ctx: &SessionContext) {
    let state = ctx.state_ref();
    let mut state = state.write();
    let builder = SessionStateBuilder::new_from_existing(state.clone())
        .with_session_id(state.session_id().to_string());
    *state = with_expr_planners(builder).build();
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::util::pretty::pretty_format_batches;

    /// The one value of `sql`, formatted, on `ctx`.
    async fn value(ctx: &SessionContext, sql: &str) -> Result<String> {
        let batches = ctx.sql(sql).await?.collect().await?;
        let text = pretty_format_batches(&batches)?.to_string();
        let lines: Vec<&str> = text.lines().collect();
        Ok(lines[3].trim_matches(|c| c == '|' || c == ' ').to_string())
    }

    fn with_planner() -> SessionContext {
        let ctx = SessionContext::new();
        register_expr_planners(&ctx);
        ctx
    }

    #[tokio::test]
    async fn array_literals_keep_the_type_make_array_gives() -> Result<()> {
        let plain = SessionContext::new();
        let planned = with_planner();
        for expr in [
            "['a', 'b']",
            "['a']",
            "[1, 2.5]",
            "[1, 2]",
            "['a', NULL]",
            "[NULL]",
            "[]",
            "[arrow_cast('a', 'Utf8View'), arrow_cast('b', 'Utf8View')]",
            "[['a'], ['b', 'c']]",
        ] {
            let sql = format!("SELECT arrow_typeof({expr})");
            assert_eq!(
                value(&planned, &sql).await?,
                value(&plain, &sql).await?,
                "{expr}"
            );
        }
        assert_eq!(
            value(&planned, "SELECT arrow_typeof(['a', 'b'])").await?,
            "List(Utf8)"
        );
        assert_eq!(
            value(&planned, "SELECT arrow_typeof([1, 2.5])").await?,
            "List(Float64)"
        );
        Ok(())
    }

    #[tokio::test]
    async fn string_array_literal_equals_make_array() -> Result<()> {
        let ctx = with_planner();
        let sql = "SELECT ['a', 'b'] = make_array('a', 'b')";
        assert_eq!(value(&ctx, sql).await?, "true");
        let sql = "SELECT array_has(['a', 'b'], 'b'), cardinality(['x', 'y', 'z'])";
        let batches = ctx.sql(sql).await?.collect().await?;
        let text = pretty_format_batches(&batches)?.to_string();
        assert!(text.contains("| true "), "{text}");
        assert!(text.contains("| 3 "), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn only_string_literal_arrays_become_literals() -> Result<()> {
        let ctx = with_planner();
        ctx.sql("CREATE TABLE t (s VARCHAR)").await?;
        let plan = |sql: &'static str| {
            let ctx = ctx.clone();
            async move {
                let df = ctx.sql(sql).await?;
                Ok::<_, datafusion::error::DataFusionError>(
                    df.logical_plan().display_indent().to_string(),
                )
            }
        };
        let strings = plan("SELECT ['a', 'b'] AS l FROM t").await?;
        assert!(!strings.contains("make_array"), "{strings}");
        for sql in [
            "SELECT [1, 2.5] AS l FROM t",
            "SELECT ['a', NULL] AS l FROM t",
            "SELECT ['a', s] AS l FROM t",
            "SELECT ['a', 1] AS l FROM t",
        ] {
            let planned = plan(sql).await?;
            assert!(planned.contains("make_array"), "{sql}: {planned}");
        }
        Ok(())
    }

    #[tokio::test]
    async fn planner_runs_before_datafusions_own() -> Result<()> {
        let ctx = with_planner();
        let first = format!("{:?}", ctx.state().expr_planners()[0]);
        assert_eq!(first, "StringListPlanner");
        // A builder gets it first too, before or after the defaults.
        let state = with_expr_planners(SessionStateBuilder::new())
            .with_default_features()
            .build();
        assert_eq!(
            format!("{:?}", state.expr_planners()[0]),
            "StringListPlanner"
        );
        let state =
            with_expr_planners(SessionStateBuilder::new().with_default_features())
                .build();
        assert_eq!(
            format!("{:?}", state.expr_planners()[0]),
            "StringListPlanner"
        );
        Ok(())
    }
}
