//! Late materialisation through a shuffle: row-wise functions (image
//! decoding, transforms, tokenizing, casts…) run *after* the permutation, so
//! the shuffle moves the columns they read (compressed bytes, small values)
//! instead of what they produce (decoded pixels, 10–50× larger).
//!
//! ```text
//!  as written                          after LateRowFunctions
//!  ──────────                          ──────────────────────
//!  Projection: img, label              Projection: img, label
//!    Shuffle: key=[label, __row_0]       Projection: image_decode(__row_0) AS img,
//!      Projection: image_decode(b)         │           label, __row_0
//!         AS img, label, b AS __row_0      Shuffle: key=[label, __row_0]
//!        TableScan: t                        Projection: label, b AS __row_0
//!                                              TableScan: t
//! ```
//!
//! # The key does not depend on where the functions run
//! A global shuffle orders rows by a hash of their content. If it hashed the
//! decoded images, moving the decoder above it would change the order. So
//! [`shuffle_plan`] always keys a shuffle on the rows *as they enter the
//! row-wise functions*: the projection under the shuffle keeps every output
//! that is not moved (bare columns, volatile expressions, whose values are
//! part of the row) and carries the columns the movable expressions read as
//! hidden `__sqlfeed_row_<i>` columns; the [`ShuffleNode`]'s key names exactly
//! those columns. The plan as written hashes those columns and runs the
//! functions below the shuffle; [`LateRowFunctions`] moves the functions
//! above it and leaves the key as it is. Every output column is a function
//! of the key columns, so rows with equal keys are equal rows and the order
//! is the same either way: a pure function of (seed, epoch, data), whatever
//! the partition or executor count.
//!
//! # What moves
//! Top-level expressions of the projection right under the shuffle that are
//! not bare columns or literals and are deterministic: no volatile function
//! (`random()` stays below, and its value is part of the key), no subquery.
//! sqlfeed's seeded augmentations are deterministic per (seed, epoch, row),
//! so they move. `LOCAL SHUFFLE`, which reorders by arrival rather than by
//! content, moves the same expressions and has no key.
//!
//! A global shuffle whose input is not such a projection keys on all its
//! columns and keeps its functions.
//!
//! The rule is on by default; `SET sqlfeed.late_materialization =
//! false` keeps the functions below the shuffle (same rows, same order).
//!
//! # Cached results
//! A feed's epoch cache stores what the functions produce, not what they
//! read, so it cannot hash the key columns again. [`with_content_hash`]
//! stores each row's content hash (the seed-independent part of the key)
//! with the cached rows, and [`shuffle_by_content_hash`] shuffles them by
//! it: a cached feed gets exactly the uncached feed's batches.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::common::internal_err;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema};
use datafusion::error::Result;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Expr, Extension, LogicalPlan, Projection, ScalarUDF, lit,
};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::{CONTENT_HASH_SEED, ShuffleKey, ShuffleNode, ShuffleSpec};
use crate::config::SqlfeedOptions;

/// Prefix of the hidden columns that carry what moved functions read.
pub const HIDDEN_COLUMN_PREFIX: &str = "__sqlfeed_row_";

/// Whether `expr` may run after a shuffle instead of before it: computed
/// from its row alone (no volatile function, no subquery, no placeholder)
/// and more than a bare column or literal, which cost nothing to carry.
pub(crate) fn is_movable(expr: &Expr) -> bool {
    let trivial = matches!(
        expr.clone().unalias_nested().data,
        Expr::Column(_) | Expr::Literal(..)
    );
    if trivial || expr.is_volatile() {
        return false;
    }
    let mut row_wise = true;
    // The closure never fails.
    let _ = expr.apply(|e| {
        if matches!(
            e,
            Expr::ScalarSubquery(_)
                | Expr::Exists(_)
                | Expr::InSubquery(_)
                | Expr::SetComparison(_)
                | Expr::OuterReferenceColumn(..)
                | Expr::Placeholder(_)
                | Expr::AggregateFunction(_)
                | Expr::WindowFunction(_)
                | Expr::Unnest(_)
                | Expr::GroupingSet(_)
                | Expr::ScalarVariable(..)
        ) {
            row_wise = false;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    row_wise
}

/// The columns `expr` reads, in order of first appearance.
fn columns_read(expr: &Expr) -> Vec<Column> {
    let mut columns: Vec<Column> = vec![];
    // The closure never fails.
    let _ = expr.apply(|e| {
        if let Expr::Column(c) = e
            && !columns.contains(c)
        {
            columns.push(c.clone());
        }
        Ok(TreeNodeRecursion::Continue)
    });
    columns
}

/// Whether the unqualified output names of `schema` are all different (the
/// key names columns by unqualified name, as physical plans do).
fn unique_names(schema: &DFSchema) -> bool {
    let mut seen = std::collections::HashSet::new();
    schema
        .fields()
        .iter()
        .all(|f| seen.insert(f.name().clone()))
}

/// `ShuffleNode` as a plan.
fn extension(node: ShuffleNode) -> LogicalPlan {
    LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    })
}

/// A projection widened to output every column of its shuffle key.
struct KeyedProjection {
    /// The projection's expressions plus hidden columns carrying what its
    /// movable expressions read.
    widened: Projection,
    /// Names of the key columns among the widened outputs, in key order.
    key: Vec<String>,
}

/// `projection` keyed as the [module docs](self) define, or `None` when it
/// has no movable expression (then every column is the key).
fn keyed_projection(projection: &Projection) -> Result<Option<KeyedProjection>> {
    let movable: Vec<bool> = projection.expr.iter().map(is_movable).collect();
    if !movable.contains(&true) || !unique_names(&projection.schema) {
        return Ok(None);
    }
    let schema = &projection.schema;
    // Outputs that stay are key columns by their own name; a column that a
    // movable expression reads is a key column through the output that is
    // that bare column, or else through a hidden column carrying it.
    let mut key: Vec<String> = vec![];
    let mut bare: HashMap<Column, String> = HashMap::new();
    for (i, expr) in projection.expr.iter().enumerate() {
        if !movable[i] {
            key.push(schema.field(i).name().clone());
            if let Expr::Column(c) = expr.clone().unalias_nested().data {
                bare.entry(c)
                    .or_insert_with(|| schema.field(i).name().clone());
            }
        }
    }
    let mut exprs = projection.expr.clone();
    for (i, expr) in projection.expr.iter().enumerate() {
        if !movable[i] {
            continue;
        }
        for column in columns_read(expr) {
            if let Entry::Vacant(slot) = bare.entry(column) {
                let hidden =
                    format!("{HIDDEN_COLUMN_PREFIX}{}", exprs.len() - movable.len());
                exprs.push(Expr::Column(slot.key().clone()).alias(&hidden));
                slot.insert(hidden.clone());
                key.push(hidden);
            }
        }
    }
    let widened = Projection::try_new(exprs, Arc::clone(&projection.input))?;
    if !unique_names(&widened.schema) {
        return Ok(None);
    }
    Ok(Some(KeyedProjection { widened, key }))
}

/// A projection of the first `n` columns of `plan` (dropping hidden ones).
fn first_columns(plan: LogicalPlan, n: usize) -> Result<LogicalPlan> {
    let schema = Arc::clone(plan.schema());
    let outputs = (0..n)
        .map(|i| Expr::Column(Column::from(schema.qualified_field(i))))
        .collect();
    Ok(LogicalPlan::Projection(Projection::try_new(
        outputs,
        Arc::new(plan),
    )?))
}

/// `input` shuffled as `spec` says, keyed as the [module docs](self) define:
/// the plan every `SHUFFLE` clause and [`super::shuffle`] build. The result
/// has `input`'s schema.
pub fn shuffle_plan(input: LogicalPlan, spec: ShuffleSpec) -> Result<LogicalPlan> {
    let plain = |input| Ok(extension(ShuffleNode::try_new(input, spec)?));
    if spec.content_keyed().is_none() {
        return plain(input);
    }
    let LogicalPlan::Projection(projection) = &input else {
        return plain(input);
    };
    let Some(KeyedProjection { widened, key }) = keyed_projection(projection)? else {
        return plain(input);
    };
    let outputs = projection.expr.len();
    let hidden_columns = widened.expr.len() - outputs;
    let shuffled = extension(ShuffleNode::try_new_keyed(
        LogicalPlan::Projection(widened),
        spec,
        ShuffleKey::Columns(key),
    )?);
    if hidden_columns == 0 {
        return Ok(shuffled);
    }
    first_columns(shuffled, outputs)
}

/// Name of the column [`with_content_hash`] adds.
pub const CONTENT_HASH_COLUMN: &str = "__sqlfeed_content_hash";

/// `plan` with one more column, [`CONTENT_HASH_COLUMN`]: each row's content
/// hash exactly as a shuffle of `plan` computes it ([`shuffle_plan`]). A
/// feed's epoch cache stores it, so that shuffling the cached rows
/// ([`shuffle_by_content_hash`]) gives the order of shuffling the query,
/// although the cache holds the functions' results and not what they read.
/// `row_key` is `sqlfeed_row_key` (`crate::sql::RowKeyFunc`).
pub fn with_content_hash(
    plan: LogicalPlan,
    row_key: Arc<ScalarUDF>,
) -> Result<LogicalPlan> {
    let ContentKeyed {
        below,
        outputs,
        key,
        ..
    } = content_keyed(plan)?;
    hash_projection(below, outputs, key, row_key)
}

/// [`with_content_hash`]`(input)` shuffled as [`shuffle_plan`]`(input,
/// spec)` shuffles: the same rows in the same order, each with its content
/// hash, the hash computed *after* the shuffle from the key columns it
/// carries, so that the row-wise functions still move above the shuffle
/// ([`LateRowFunctions`]). A feed's first epoch streams this while it fills
/// its epoch cache ([`crate::cache::CacheFillExec`]).
pub fn shuffle_with_content_hash(
    input: LogicalPlan,
    spec: Option<ShuffleSpec>,
    row_key: Arc<ScalarUDF>,
) -> Result<LogicalPlan> {
    let spec = match spec {
        Some(spec) if spec.content_keyed().is_some() => spec,
        Some(spec) => {
            return Ok(extension(ShuffleNode::try_new(
                with_content_hash(input, row_key)?,
                spec,
            )?));
        }
        None => return with_content_hash(input, row_key),
    };
    let ContentKeyed {
        below,
        outputs,
        key,
        key_columns,
    } = content_keyed(input)?;
    let shuffled = match key_columns {
        Some(names) => extension(ShuffleNode::try_new_keyed(
            below,
            spec,
            ShuffleKey::Columns(names),
        )?),
        None => extension(ShuffleNode::try_new(below, spec)?),
    };
    // A shuffle's schema is its input's: the key reads the same columns.
    hash_projection(shuffled, outputs, key, row_key)
}

/// A plan whose first `outputs` columns are a query's, with what its content
/// hash reads: the key columns of [`shuffle_plan`].
struct ContentKeyed {
    below: LogicalPlan,
    outputs: usize,
    key: Vec<Expr>,
    /// The names of `key`'s columns when it is a [`ShuffleKey::Columns`]
    /// (`None`: every column).
    key_columns: Option<Vec<String>>,
}

fn content_keyed(plan: LogicalPlan) -> Result<ContentKeyed> {
    let keyed = match &plan {
        LogicalPlan::Projection(projection) => {
            keyed_projection(projection)?.map(|k| (k, projection.expr.len()))
        }
        _ => None,
    };
    // The hash reads computed columns, never evaluates an expression twice
    // (a volatile one would give other values).
    Ok(match keyed {
        Some((KeyedProjection { widened, key }, outputs)) => ContentKeyed {
            below: LogicalPlan::Projection(widened),
            outputs,
            key: key
                .iter()
                .map(|name| Expr::Column(Column::from_name(name)))
                .collect(),
            key_columns: Some(key),
        },
        None => {
            let schema = Arc::clone(plan.schema());
            let key = (0..schema.fields().len())
                .map(|i| Expr::Column(Column::from(schema.qualified_field(i))));
            ContentKeyed {
                below: plan,
                outputs: schema.fields().len(),
                key: key.collect(),
                key_columns: None,
            }
        }
    })
}

/// The first `outputs` columns of `below` and [`CONTENT_HASH_COLUMN`], the
/// hash of `key`.
fn hash_projection(
    below: LogicalPlan,
    outputs: usize,
    key: Vec<Expr>,
    row_key: Arc<ScalarUDF>,
) -> Result<LogicalPlan> {
    let schema = Arc::clone(below.schema());
    let mut exprs: Vec<Expr> = (0..outputs)
        .map(|i| Expr::Column(Column::from(schema.qualified_field(i))))
        .collect();
    let mut args = vec![lit(ScalarValue::UInt64(Some(CONTENT_HASH_SEED)))];
    args.extend(key);
    exprs.push(
        Expr::ScalarFunction(ScalarFunction::new_udf(row_key, args))
            .alias(CONTENT_HASH_COLUMN),
    );
    Ok(LogicalPlan::Projection(Projection::try_new(
        exprs,
        Arc::new(below),
    )?))
}

/// `plan` (from [`with_content_hash`], possibly cached) without its last
/// column, the content hash, and shuffled by it when `spec` is given.
pub fn shuffle_by_content_hash(
    plan: LogicalPlan,
    spec: Option<ShuffleSpec>,
) -> Result<LogicalPlan> {
    let columns = plan.schema().fields().len();
    match plan.schema().fields().last() {
        Some(last) if last.name() == CONTENT_HASH_COLUMN => {}
        _ => {
            return internal_err!(
                "expected {CONTENT_HASH_COLUMN} as the last column, got {}",
                plan.schema().field_names().join(", ")
            );
        }
    }
    let shuffled = match spec {
        Some(spec) if spec.content_keyed().is_some() => {
            extension(ShuffleNode::try_new_keyed(
                plan,
                spec,
                ShuffleKey::ContentHash(CONTENT_HASH_COLUMN.to_string()),
            )?)
        }
        Some(spec) => extension(ShuffleNode::try_new(plan, spec)?),
        None => plan,
    };
    first_columns(shuffled, columns - 1)
}

/// A projection cut in two where its row-wise functions can run later:
/// `outputs` over `below` compute what the projection does.
pub(crate) struct RowFunctionsSplit {
    /// The expressions that stay, then hidden columns carrying what the
    /// moved expressions read: every column of it is a key column.
    pub(crate) below: Projection,
    /// The projection's outputs (same names and qualifiers) over `below`'s
    /// columns: moved expressions rewritten to read what carries their
    /// columns, the others as bare columns.
    pub(crate) outputs: Vec<Expr>,
}

/// Splits `projection` into what runs before a reordering and what may run
/// after it: every movable expression whose output does not `stays` moves
/// up. `None` when nothing moves or output names repeat.
pub(crate) fn split_row_functions(
    projection: &Projection,
    stays: impl Fn(usize) -> bool,
) -> Result<Option<RowFunctionsSplit>> {
    let schema = &projection.schema;
    let moved: Vec<bool> = (0..projection.expr.len())
        .map(|i| !stays(i) && is_movable(&projection.expr[i]))
        .collect();
    if !moved.contains(&true) || !unique_names(schema) {
        return Ok(None);
    }
    // What stays below, and which of its columns carries each input
    // column that a moved expression reads.
    let mut kept: Vec<Expr> = vec![];
    let mut carried: HashMap<Column, Column> = HashMap::new();
    for (i, expr) in projection.expr.iter().enumerate() {
        if moved[i] {
            continue;
        }
        kept.push(expr.clone());
        if let Expr::Column(c) = expr.clone().unalias_nested().data {
            carried
                .entry(c)
                .or_insert_with(|| Column::from(schema.qualified_field(i)));
        }
    }
    for (i, expr) in projection.expr.iter().enumerate() {
        if !moved[i] {
            continue;
        }
        for column in columns_read(expr) {
            if let Entry::Vacant(slot) = carried.entry(column) {
                let hidden = format!("{HIDDEN_COLUMN_PREFIX}late_{}", kept.len());
                kept.push(Expr::Column(slot.key().clone()).alias(&hidden));
                slot.insert(Column::from_name(hidden));
            }
        }
    }
    let below = Projection::try_new(kept, Arc::clone(&projection.input))?;
    let outputs = projection
        .expr
        .iter()
        .enumerate()
        .map(|(i, expr)| {
            let (qualifier, field) = schema.qualified_field(i);
            if !moved[i] {
                return Ok(Expr::Column(Column::from((qualifier, field))));
            }
            let rewritten = expr
                .clone()
                .unalias_nested()
                .data
                .transform(|e| match e {
                    Expr::Column(c) => match carried.get(&c) {
                        Some(below) => Ok(Transformed::yes(Expr::Column(below.clone()))),
                        None => internal_err!(
                            "late row functions: column {c} is not carried through the shuffle"
                        ),
                    },
                    other => Ok(Transformed::no(other)),
                })?
                .data;
            Ok(rewritten.alias_qualified(qualifier.cloned(), field.name()))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(RowFunctionsSplit { below, outputs }))
}

/// Moves the row-wise functions of the projection under a shuffle above it;
/// see the [module docs](self).
#[derive(Debug, Default)]
pub struct LateRowFunctions;

impl LateRowFunctions {
    /// `Projection(moved…, Shuffle(Projection(kept…, input)))` for a shuffle
    /// over a projection with movable expressions, with the shuffle's
    /// schema; `None` when nothing moves.
    fn rewrite_shuffle(shuffle: &ShuffleNode) -> Result<Option<LogicalPlan>> {
        let LogicalPlan::Projection(projection) = shuffle.input() else {
            return Ok(None);
        };
        // A global shuffle keyed on every column hashes what the functions
        // produce: moving them would change the order.
        let key: &[String] = match (shuffle.spec(), shuffle.key()) {
            // Neither orders by content: the functions may run after it.
            (ShuffleSpec::Local { .. } | ShuffleSpec::Positional { .. }, _) => &[],
            (
                ShuffleSpec::Global { .. } | ShuffleSpec::Windowed { .. },
                ShuffleKey::Columns(names),
            ) => names,
            (ShuffleSpec::Global { .. } | ShuffleSpec::Windowed { .. }, _) => {
                return Ok(None);
            }
        };
        let schema = &projection.schema;
        let in_key = |i: usize| key.contains(schema.field(i).name());
        let Some(RowFunctionsSplit { below, outputs }) =
            split_row_functions(projection, in_key)?
        else {
            return Ok(None);
        };
        let shuffled = extension(shuffle.with_input(LogicalPlan::Projection(below))?);
        let above = Projection::try_new(outputs, Arc::new(shuffled))?;
        // The optimizer requires an unchanged schema; never risk it.
        if above
            .schema
            .has_equivalent_names_and_types(shuffle.input().schema())
            .is_err()
        {
            return Ok(None);
        }
        Ok(Some(LogicalPlan::Projection(above)))
    }
}

impl OptimizerRule for LateRowFunctions {
    fn name(&self) -> &str {
        "sqlfeed_late_row_functions"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        if !SqlfeedOptions::of(config.options().as_ref()).late_materialization {
            return Ok(Transformed::no(plan));
        }
        let LogicalPlan::Extension(extension) = &plan else {
            return Ok(Transformed::no(plan));
        };
        let Some(shuffle) = extension.node.as_any().downcast_ref::<ShuffleNode>() else {
            return Ok(Transformed::no(plan));
        };
        match Self::rewrite_shuffle(shuffle)? {
            Some(rewritten) => Ok(Transformed::yes(rewritten)),
            None => Ok(Transformed::no(plan)),
        }
    }
}
