//! [`CarryCheapOutputs`]: a global shuffle moves what its cheap functions
//! make, not what they read.
//!
//! # Why
//! `LateRowFunctions` puts a shuffle's row-wise functions above it, keyed on
//! the values that enter them, so that decoding and tokenizing run after the
//! barrier, on the rows kept. For a cheap function that does not widen its
//! inputs it is the wrong side: the permutation's gather costs a random read
//! per row *and column*, and `feature_vector(f0, …, f7)` enters as 8 float
//! columns and leaves as one vector (the W2 feed: 32 columns and one). This
//! rule computes such outputs between the key and the permutation, as a
//! mixture's sources already do (`mix/planner.rs`).
//!
//! ```text
//!  before                                after
//!  ProjectionExec [cheap, costly]        ProjectionExec [carried cols, costly(carried cols)]   (only if any is costly)
//!    ShuffleMergeExec                      ShuffleMergeExec
//!      PermuteExec (gather)                  PermuteExec (gather)
//!        ShuffleKeyExec                        ProjectionExec [cheap outputs, costly inputs, key]
//!          input                                 ShuffleKeyExec
//!                                                  input
//! ```
//!
//! A `SHUFFLE BY POSITION` ([`PositionShuffleExec`]) is rewritten the same
//! way, its two position columns kept last; its order does not depend on
//! the rows' values, so nothing about copies applies to it.
//!
//! The projection may also sit on a projection of cheap expressions that
//! common subexpression elimination made (a `CAST(label AS BIGINT)` read by
//! two outputs): its expressions are substituted into the outer ones. One
//! with a costly function is left alone, since it is computed once there.
//!
//! # Order
//! Unchanged: the key is computed from the same input before the new
//! projection, and the permutation orders by it alone. Copies (equal keys)
//! are told apart by the carried values, which are functions of the values
//! that made the key equal; so only shuffles whose copies are compared by
//! value ([`CopyIdentity::Values`]) are rewritten, never one that orders
//! copies by other columns (a content hash with provenance beside it).
//!
//! `SET sqlfeed.carry_cheap_outputs = false` turns the rule off.
//!
//! # Memory
//! An output is carried only where its fixed width is at most that of the
//! columns it reads (a cast to a wider type, `one_hot` of a label, text
//! made from numbers: computed above, as before), so the permutation never
//! holds more bytes than it did.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::internal_err;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::logical_expr::Volatility;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;

use super::copies::CopyIdentity;
use super::key::ShuffleKeyExec;
use super::merge::ShuffleMergeExec;
use super::permute::{PermuteExec, PermuteMode};
use super::position::PositionShuffleExec;
use crate::exec::{
    NodeRewrite, PlanNode, Rewritten, calls_costly_function, single_child,
};

/// Expressions and the names of the columns they compute.
pub(crate) type Outputs = Vec<(Arc<dyn PhysicalExpr>, String)>;

/// `outputs` (over a shuffle's rows as they enter its functions) split by
/// where they run: what is computed before the permutation (the outputs
/// `late` says no to, plus the columns the late ones read), and the late
/// ones over those carried columns. `(None, Some(outputs))` when every
/// output is late, or when a column a late output reads would clash by name
/// with a carried output; `(Some(carried), None)` when none is.
pub(crate) fn split_carried(
    outputs: Outputs,
    late: impl Fn(&Arc<dyn PhysicalExpr>) -> bool,
) -> Result<(Option<Outputs>, Option<Outputs>)> {
    let late: Vec<bool> = outputs.iter().map(|(expr, _)| late(expr)).collect();
    if late.iter().all(|&late| late) {
        return Ok((None, Some(outputs)));
    }
    let mut carry: Outputs = outputs
        .iter()
        .zip(&late)
        .filter(|(_, late)| !**late)
        .map(|(output, _)| output.clone())
        .collect();
    for (expr, _) in outputs
        .iter()
        .zip(&late)
        .filter(|(_, late)| **late)
        .map(|(o, _)| o)
    {
        for column in collect_columns(expr) {
            match carry.iter().find(|(_, name)| name == column.name()) {
                None => carry.push((Arc::new(column.clone()), column.name().to_string())),
                // The same input column, carried as an output already.
                Some((carried, _))
                    if carried
                        .downcast_ref::<Column>()
                        .is_some_and(|c| c.index() == column.index()) => {}
                Some(_) => return Ok((None, Some(outputs))),
            }
        }
    }
    if !late.contains(&true) {
        return Ok((Some(carry), None));
    }
    // Over the carried columns: carried outputs as they are, late ones
    // reading the columns carried for them.
    let carried = |name: &str| -> Result<Arc<dyn PhysicalExpr>> {
        match carry.iter().position(|(_, carried)| carried == name) {
            Some(index) => Ok(Arc::new(Column::new(name, index))),
            None => internal_err!("shuffle: column {name} is not carried"),
        }
    };
    let after = outputs
        .iter()
        .zip(&late)
        .map(|((expr, name), late)| {
            let expr = if *late {
                Arc::clone(expr)
                    .transform_down(|e| match e.downcast_ref::<Column>() {
                        Some(column) => Ok(Transformed::yes(carried(column.name())?)),
                        None => Ok(Transformed::no(e)),
                    })?
                    .data
            } else {
                carried(name)?
            };
            Ok((expr, name.clone()))
        })
        .collect::<Result<Outputs>>()?;
    Ok((Some(carry), Some(after)))
}

/// Computes a global shuffle's cheap, narrowing outputs before its
/// permutation; see the module docs.
#[derive(Debug, Default)]
pub struct CarryCheapOutputs;

crate::exec::node_rewrite_rule!(CarryCheapOutputs, "sqlfeed_carry_cheap_outputs");

impl NodeRewrite for CarryCheapOutputs {
    fn rewrite(&self, node: PlanNode, config: &ConfigOptions) -> Rewritten {
        if !crate::config::SqlfeedOptions::of(config).carry_cheap_outputs {
            return Ok(Transformed::no(node));
        }
        match carried_shuffle(&node)? {
            Some(plan) => Ok(Transformed::yes(plan)),
            None => Ok(Transformed::no(node)),
        }
    }
}

/// `node` rewritten when it is a projection over a one-machine shuffle that
/// has a cheap, narrowing output to carry.
fn carried_shuffle(node: &PlanNode) -> Result<Option<PlanNode>> {
    let Some(projection) = node.as_ref().downcast_ref::<ProjectionExec>() else {
        return Ok(None);
    };
    if let Some((outputs, shuffle)) =
        outputs_over_shuffle(projection, is_position_shuffle)?
    {
        return carried_position_shuffle(node, outputs, &shuffle);
    }
    let Some((outputs, merge_node)) = outputs_over_shuffle(projection, is_merge)? else {
        return Ok(None);
    };
    let Some(merge) = merge_node.as_ref().downcast_ref::<ShuffleMergeExec>() else {
        return Ok(None);
    };
    let merged_input = only_child(merge)?;
    let Some(permute) = merged_input.as_ref().downcast_ref::<PermuteExec>() else {
        return Ok(None);
    };
    let keyed = only_child(permute)?;
    if merge.is_ranged()
        || permute.mode() != PermuteMode::Gather
        || permute.copies() != CopyIdentity::Values
        || keyed.as_ref().downcast_ref::<ShuffleKeyExec>().is_none()
    {
        return Ok(None);
    }
    let Some((mut carry, after)) = carried_and_late(outputs, &merge_node.schema())?
    else {
        return Ok(None);
    };
    // The key stays last, where the permutation finds it; the columns before
    // it are the shuffle's input's, at the same positions, so the projection's
    // expressions read the keyed rows as they read the shuffle's output.
    let key_index = keyed.schema().fields().len() - 1;
    let key_name = keyed.schema().field(key_index).name().clone();
    carry.push((Arc::new(Column::new(&key_name, key_index)), key_name));
    let carried: PlanNode = Arc::new(ProjectionExec::try_new(carry, keyed)?);
    let permuted: PlanNode =
        Arc::new(PermuteExec::try_new(carried)?.with_copies(CopyIdentity::Values)?);
    let merged: PlanNode = Arc::new(
        ShuffleMergeExec::new(permuted, merge.seed(), merge.epoch(), merge.batch_rows())
            .with_copies(merge.copies())
            .unique_rows(merge.is_unique_rows()),
    );
    above(node, merged, after)
}

/// `node` (a projection of `outputs` over `shuffle`, a
/// [`PositionShuffleExec`]) with its cheap, narrowing outputs computed
/// before the shuffle: the order does not depend on the rows' values, so
/// any output may move; the position columns stay last.
fn carried_position_shuffle(
    node: &PlanNode,
    outputs: Outputs,
    shuffle: &PlanNode,
) -> Result<Option<PlanNode>> {
    let Some(position) = shuffle.as_ref().downcast_ref::<PositionShuffleExec>() else {
        return Ok(None);
    };
    let Some((mut carry, after)) = carried_and_late(outputs, &shuffle.schema())? else {
        return Ok(None);
    };
    let input = only_child(position)?;
    let input_schema = input.schema();
    let columns = input_schema.fields().len();
    for index in [columns - 2, columns - 1] {
        let name = input_schema.field(index).name().clone();
        carry.push((Arc::new(Column::new(&name, index)), name));
    }
    let carried: PlanNode = Arc::new(ProjectionExec::try_new(carry, input)?);
    let shuffled: PlanNode = Arc::new(position.over(carried)?);
    above(node, shuffled, after)
}

/// `outputs` (over a shuffle's `rows`) split into what is computed before
/// the shuffle and the late outputs above it ([`split_carried`]), when
/// something other than a bare column would be computed before it: else
/// `None` (nothing worth carrying).
fn carried_and_late(
    outputs: Outputs,
    rows: &Schema,
) -> Result<Option<(Outputs, Option<Outputs>)>> {
    let late = |expr: &Arc<dyn PhysicalExpr>| !carries_well(expr, rows);
    if outputs
        .iter()
        .all(|(expr, _)| late(expr) || is_column(expr))
    {
        return Ok(None);
    }
    match split_carried(outputs, late)? {
        (Some(carry), after) => Ok(Some((carry, after))),
        (None, _) => Ok(None),
    }
}

/// `shuffled` with the `after` outputs computed above it: the rewrite of
/// `node`, whose schema it must keep.
fn above(
    node: &PlanNode,
    shuffled: PlanNode,
    after: Option<Outputs>,
) -> Result<Option<PlanNode>> {
    let plan = match after {
        Some(after) => Arc::new(ProjectionExec::try_new(after, shuffled)?) as PlanNode,
        None => shuffled,
    };
    if plan.schema().fields() != node.schema().fields() {
        return internal_err!(
            "sqlfeed_carry_cheap_outputs changed a shuffle's schema from {:?} to {:?}",
            node.schema(),
            plan.schema()
        );
    }
    Ok(Some(plan))
}

fn is_merge(plan: &dyn ExecutionPlan) -> bool {
    plan.downcast_ref::<ShuffleMergeExec>().is_some()
}

fn is_position_shuffle(plan: &dyn ExecutionPlan) -> bool {
    plan.downcast_ref::<PositionShuffleExec>().is_some()
}

/// The outputs of `projection` over the shuffle below it (the node that
/// `is_shuffle` accepts), and that shuffle: directly, or through a
/// projection of cheap expressions (common subexpression elimination puts a
/// `CAST(label AS BIGINT)` read twice there), whose expressions are
/// substituted where the outer ones read them. A costly expression there
/// stays where it is computed once: `None`.
fn outputs_over_shuffle(
    projection: &ProjectionExec,
    is_shuffle: fn(&dyn ExecutionPlan) -> bool,
) -> Result<Option<(Outputs, PlanNode)>> {
    let outputs: Outputs = projection
        .expr()
        .iter()
        .map(|e| (Arc::clone(&e.expr), e.alias.clone()))
        .collect();
    let input = Arc::clone(projection.input());
    if is_shuffle(input.as_ref()) {
        return Ok(Some((outputs, input)));
    }
    let Some(inner) = input.as_ref().downcast_ref::<ProjectionExec>() else {
        return Ok(None);
    };
    if !is_shuffle(inner.input().as_ref())
        || inner.expr().iter().any(|e| calls_costly_function(&e.expr))
    {
        return Ok(None);
    }
    let substituted = outputs
        .into_iter()
        .map(|(expr, name)| {
            let expr = expr
                .transform_up(|e| match e.downcast_ref::<Column>() {
                    Some(column) => match inner.expr().get(column.index()) {
                        Some(read) => Ok(Transformed::yes(Arc::clone(&read.expr))),
                        None => internal_err!(
                            "sqlfeed_carry_cheap_outputs: column {} is not one of the {} \
                             the projection below computes",
                            column.index(),
                            inner.expr().len()
                        ),
                    },
                    None => Ok(Transformed::no(e)),
                })?
                .data;
            Ok((expr, name))
        })
        .collect::<Result<Outputs>>()?;
    Ok(Some((substituted, Arc::clone(inner.input()))))
}

fn only_child(plan: &dyn ExecutionPlan) -> Result<PlanNode> {
    let children: Vec<PlanNode> = plan.children().into_iter().cloned().collect();
    single_child(plan.name(), &children)
}

fn is_column(expr: &Arc<dyn PhysicalExpr>) -> bool {
    expr.downcast_ref::<Column>().is_some()
}

/// Whether `expr` (over `rows`) is computed before the permutation: a bare
/// column, or a deterministic expression without costly functions whose
/// output has a fixed width no larger than the columns it reads.
fn carries_well(expr: &Arc<dyn PhysicalExpr>, rows: &Schema) -> bool {
    if is_column(expr) {
        return true;
    }
    if calls_costly_function(expr) || is_volatile(expr) {
        return false;
    }
    let Some(output) = expr.data_type(rows).ok().and_then(|t| fixed_width(&t)) else {
        return false;
    };
    let inputs: usize = collect_columns(expr)
        .iter()
        .map(|column| {
            // A variable-width column is at least its 4-byte offset.
            fixed_width(rows.field(column.index()).data_type()).unwrap_or(4)
        })
        .sum();
    output <= inputs
}

/// Bytes per row of a fixed-width type (booleans count a byte), or `None`.
fn fixed_width(data_type: &DataType) -> Option<usize> {
    match data_type {
        DataType::Boolean => Some(1),
        DataType::FixedSizeList(field, n) => {
            fixed_width(field.data_type()).map(|w| w * usize::try_from(*n).unwrap_or(0))
        }
        t => t.primitive_width(),
    }
}

/// Whether `expr` calls a function that is not immutable (its value may
/// change between evaluations: it must stay where its key was computed).
fn is_volatile(expr: &Arc<dyn PhysicalExpr>) -> bool {
    let mut volatile = false;
    let _ = expr.apply(|e| {
        if let Some(function) = e.downcast_ref::<ScalarFunctionExpr>()
            && function.fun().signature().volatility != Volatility::Immutable
        {
            volatile = true;
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    });
    volatile
}
