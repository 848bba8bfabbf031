//! A guard around DataFusion's leaf-expression rules: a rewrite that would
//! call a function more often than the query as planned is not taken.
//!
//! DataFusion 55's `extract_leaf_expressions` and
//! `push_down_leaf_projections` move a struct field read (`get_field`) down
//! towards the scan. Below a projection that *defines* the struct, the read
//! is rewritten in terms of the definition, so a struct made by a function
//! and read field by field is computed once per field:
//!
//! ```text
//!  as planned                                after the push-down (refused here)
//!  ──────────                                ──────────────────────────────────
//!  Projection: p['pixels'], p['label']       Projection: __e1 AS pixels, __e2 AS label
//!    Projection: preprocess(img) AS p          Projection: preprocess(img)['pixels'] AS __e1,
//!      TableScan: t                                        preprocess(img)['label'] AS __e2
//!                                                TableScan: t
//! ```
//!
//! A Python batch function then runs twice per row (half the rows per
//! second), and a volatile one (`random()`, a seeded augmentation) returns
//! fields of two different calls in one row: silently wrong output. Upstream
//! added per-site guards after the reports (apache/datafusion#23655,
//! #24678) and later a plan invariant counting evaluations after every rule;
//! neither is in 55.2. Turning the rules off instead
//! (`enable_leaf_expression_pushdown = false`) also stops what they are
//! there for: `input_file_name()` must reach the scan to be evaluated at
//! all, and provenance needs it.
//!
//! [`NoNewEvaluations`] wraps a rule and keeps its rewrite of a node only if
//! no function is called more often in the rewritten subtree than in the
//! original one. Every other rewrite of the rule is kept as it was.
//!
//! # What is counted
//! An *evaluation site* is one scalar function call that does work per
//! row and that the leaf rules must not copy: a volatile call, or a call
//! DataFusion keeps in place (`ExpressionPlacement::KeepInPlace`) with at
//! least one argument that is not a literal. The placement is asked with
//! every argument reduced to a column or a literal, so that a field read of
//! a costly call (`get_field(f(x), 'a')`) is not a site itself: the call
//! inside it is. Calls of constants only are folded once per query whatever
//! the plan, so they are not sites. Sites are counted per function name.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{Expr, ExpressionPlacement, LogicalPlan, Volatility};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// The DataFusion rules whose rewrites are guarded: they inline a
/// projection's definitions into the expressions they move.
pub(crate) const GUARDED_RULES: [&str; 2] =
    ["extract_leaf_expressions", "push_down_leaf_projections"];

/// An optimizer rule that takes `inner`'s rewrite of a node only if it adds
/// no evaluation site (see the module docs).
#[derive(Debug)]
pub struct NoNewEvaluations {
    /// The rule whose rewrites are checked.
    inner: Arc<dyn OptimizerRule + Send + Sync>,
}

impl NoNewEvaluations {
    /// Guards `inner`.
    pub fn new(inner: Arc<dyn OptimizerRule + Send + Sync>) -> Self {
        Self { inner }
    }
}

impl OptimizerRule for NoNewEvaluations {
    fn name(&self) -> &str {
        // The inner rule's name: the optimizer's per-rule logs and
        // `EXPLAIN VERBOSE` keep naming the rule that did the work.
        self.inner.name()
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        self.inner.apply_order()
    }

    #[allow(deprecated)]
    fn supports_rewrite(&self) -> bool {
        self.inner.supports_rewrite()
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        // A plan's clone shares its inputs (`Arc`s): cheap next to the rule.
        let original = plan.clone();
        let rewritten = self.inner.rewrite(plan, config)?;
        if !rewritten.transformed {
            return Ok(rewritten);
        }
        let before = evaluation_sites(&original)?;
        let after = evaluation_sites(&rewritten.data)?;
        let adds_a_site = after
            .iter()
            .any(|(name, count)| *count > before.get(name).copied().unwrap_or(0));
        if adds_a_site {
            Ok(Transformed::no(original))
        } else {
            Ok(rewritten)
        }
    }
}

/// How many evaluation sites of each function `plan`'s subtree holds.
fn evaluation_sites(plan: &LogicalPlan) -> Result<HashMap<String, usize>> {
    let mut sites = HashMap::<String, usize>::new();
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Expr::ScalarFunction(call) = e
                    && is_evaluation_site(call)
                {
                    *sites.entry(call.func.name().to_string()).or_default() += 1;
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    Ok(sites)
}

/// Whether `call` is an evaluation site (see the module docs).
fn is_evaluation_site(call: &ScalarFunction) -> bool {
    if call.func.signature().volatility == Volatility::Volatile {
        return true;
    }
    let reduced: Vec<ExpressionPlacement> = call
        .args
        .iter()
        .map(|arg| match arg {
            Expr::Literal(..) => ExpressionPlacement::Literal,
            _ => ExpressionPlacement::Column,
        })
        .collect();
    reduced.contains(&ExpressionPlacement::Column)
        && call.func.placement(&reduced) == ExpressionPlacement::KeepInPlace
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use datafusion::arrow::array::{ArrayRef, AsArray, Int64Array, StructArray};
    use datafusion::arrow::datatypes::{DataType, Field, Fields, Float64Type, Int64Type};
    use datafusion::execution::SessionStateBuilder;
    use datafusion::logical_expr::{
        ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    };
    use datafusion::prelude::SessionContext;

    use super::*;

    /// Rows [`CountedStruct`] was called on; only
    /// `a_costly_struct_read_field_by_field_is_computed_once` calls it.
    static COUNTED_ROWS: AtomicUsize = AtomicUsize::new(0);

    /// A costly (kept in place) function: `x` → `{a: x, b: 2x}`, counting
    /// the rows it is called on in [`COUNTED_ROWS`].
    #[derive(Debug, PartialEq, Eq, Hash)]
    struct CountedStruct {
        signature: Signature,
    }

    fn struct_fields() -> Fields {
        Fields::from(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Int64, true),
        ])
    }

    impl ScalarUDFImpl for CountedStruct {
        fn name(&self) -> &str {
            "counted_struct"
        }
        fn signature(&self) -> &Signature {
            &self.signature
        }
        fn return_type(&self, _: &[DataType]) -> Result<DataType> {
            Ok(DataType::Struct(struct_fields()))
        }
        fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
            let input = args.args[0].to_array(args.number_rows)?;
            COUNTED_ROWS.fetch_add(input.len(), Ordering::SeqCst);
            let doubled: ArrayRef = Arc::new(
                input
                    .as_primitive::<Int64Type>()
                    .iter()
                    .map(|v| v.map(|v| v * 2))
                    .collect::<Int64Array>(),
            );
            Ok(ColumnarValue::Array(Arc::new(StructArray::new(
                struct_fields(),
                vec![input, doubled],
                None,
            ))))
        }
    }

    /// A context planning with `rules` and knowing `counted_struct`.
    fn context(rules: Vec<Arc<dyn OptimizerRule + Send + Sync>>) -> SessionContext {
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_optimizer_rules(rules)
            .build();
        let ctx = SessionContext::new_with_state(state);
        ctx.register_udf(ScalarUDF::new_from_impl(CountedStruct {
            signature: Signature::exact(vec![DataType::Int64], Volatility::Immutable),
        }));
        ctx
    }

    /// Runs `sql` and returns its single Int64 column.
    async fn ints(ctx: &SessionContext, sql: &str) -> Vec<i64> {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect()
    }

    const FIELD_BY_FIELD: &str = "SELECT sum(p['a']) + 0 * sum(p['b']) FROM \
         (SELECT counted_struct(value) AS p FROM generate_series(1, 100))";

    #[tokio::test]
    async fn a_costly_struct_read_field_by_field_is_computed_once() {
        // DataFusion's own rules call it once per field: the bug guarded
        // against. When this fails after an upgrade, the upstream guard has
        // landed and `NoNewEvaluations` may go.
        COUNTED_ROWS.store(0, Ordering::SeqCst);
        let unguarded = context(datafusion::optimizer::Optimizer::new().rules);
        assert_eq!(ints(&unguarded, FIELD_BY_FIELD).await, vec![5050]);
        assert_eq!(COUNTED_ROWS.load(Ordering::SeqCst), 200);

        COUNTED_ROWS.store(0, Ordering::SeqCst);
        let guarded = context(crate::sql::rules::optimizer_rules());
        assert_eq!(ints(&guarded, FIELD_BY_FIELD).await, vec![5050]);
        assert_eq!(COUNTED_ROWS.load(Ordering::SeqCst), 100);
    }

    /// Rows of `SELECT s['a'] AS x, s` over a struct of `random()` whose
    /// read field differs from the field of the struct returned with it.
    async fn volatile_fields_differing(ctx: &SessionContext) -> usize {
        let sql = "SELECT s['a'] AS x, s FROM \
                   (SELECT named_struct('a', random()) AS s FROM generate_series(1, 200))";
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let mut differing = 0;
        for batch in &batches {
            let read = batch.column(0).as_primitive::<Float64Type>();
            let returned = batch.column(1).as_struct().column(0);
            let returned = returned.as_primitive::<Float64Type>();
            differing += (0..batch.num_rows())
                .filter(|&row| read.value(row) != returned.value(row))
                .count();
        }
        differing
    }

    #[tokio::test]
    async fn a_volatile_struct_keeps_its_fields_from_one_call() {
        let guarded = context(crate::sql::rules::optimizer_rules());
        assert_eq!(volatile_fields_differing(&guarded).await, 0);
        // Unguarded, `random()` is called once for the read field and once
        // for the struct (see the first test on upgrading).
        let unguarded = context(datafusion::optimizer::Optimizer::new().rules);
        assert_eq!(volatile_fields_differing(&unguarded).await, 200);
    }

    #[tokio::test]
    async fn a_field_read_of_a_column_still_moves_to_the_scan() {
        // The rewrite the rules exist for adds no site and is kept.
        let ctx = context(crate::sql::rules::optimizer_rules());
        ctx.sql(
            "CREATE TABLE t AS SELECT named_struct('a', value, 'b', value * 2) AS s \
             FROM generate_series(1, 10)",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
        let plan = ctx
            .sql("SELECT s['a'] + 1 AS x FROM t WHERE s['b'] > 4")
            .await
            .unwrap()
            .into_optimized_plan()
            .unwrap();
        let text = plan.display_indent().to_string();
        let scan_line = text.lines().position(|l| l.contains("TableScan")).unwrap();
        let extraction = text
            .lines()
            .position(|l| l.contains("get_field(t.s, Utf8(\"b\"))"))
            .unwrap_or_else(|| panic!("no pushed-down field read in\n{text}"));
        assert_eq!(extraction + 1, scan_line, "{text}");
        assert_eq!(
            ints(&ctx, "SELECT s['a'] FROM t WHERE s['b'] > 4 ORDER BY 1").await,
            vec![3, 4, 5, 6, 7, 8, 9, 10]
        );
    }
}
