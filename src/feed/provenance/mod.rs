//! Batch provenance: the file, row group and row each row of a batch came
//! from, without running the query's preprocessing.
//!
//! After a loss spike at step 41 213 the question is which samples made
//! that batch. A feed's batches are a pure function of (query, data, seed,
//! epoch, step, rank, world), so the answer can be computed again instead
//! of being logged: [`FeedBuilder::explain_batch`] runs the same feed with
//! its query reduced to where each row comes from, and reads the batch at
//! that position.
//!
//! ```text
//!  the feed's query                        the origins query
//!  ────────────────                        ─────────────────
//!  Projection: decode(b) AS x, y           Projection: origin_file, origin_row
//!    Shuffle: key=[y, __row_0]               Shuffle: key=content hash h
//!      Projection: y, b AS __row_0             Projection: …, h = row_key(0, y, __row_0)
//!        Filter: w > 0                           Projection: y, b AS __row_0,
//!          TableScan: 'data/*.parquet'             __origin_file, __origin_row
//!                                                  Filter: w > 0
//!                                                    Projection: *, id(input_file_name()),
//!                                                      file_row_index()
//!                                                      TableScan: 'data/*.parquet'
//! ```
//!
//! # Why the batch is the feed's
//! The origin columns ride along with the rows and are never part of a
//! shuffle key: the origins query's shuffle orders by the content hash of
//! the feed's own key columns ([`ShuffleKey::AllColumns`]: every column of
//! the shuffle's input as written), computed below it — the hash the feed's
//! shuffle computes — so it puts every row where the feed puts it. Only the
//! 8-byte hash and the origins go through that shuffle: the key's wide
//! columns (an image) stop at the hash. The batch is
//! then cut by the feed's own sink and batcher (shape, `drop_last`, the
//! epoch's first rows padding the last step, resume by rows, skipped
//! steps), so there is no second implementation of the batching rule to
//! drift from the first. The row-wise functions whose results the feed's
//! tensors hold are not in the origins query's output, so they do not run:
//! [`crate::shuffle::late`] moves them above the shuffle and the optimizer
//! drops them there. What the order needs still runs (filters, the columns
//! the shuffle key hashes).
//!
//! Rows with equal content are interchangeable copies in the order (see
//! [`crate::shuffle`]): which of them a batch holds is then not defined, and
//! the answer names, at each position, a copy with that content, each copy
//! once per epoch. The origins query's shuffle counts copies by the content
//! hash alone ([`crate::shuffle::CopyIdentity::ContentHash`]): the origins
//! that ride along differ between copies, and compared with them every copy
//! looked unique and kept its content key, so copies sat side by side where
//! the feed spreads them.
//!
//! # What it follows
//! Rows through scans of Parquet files, projections, filters, sorts,
//! limits, aliases, `UNION ALL` and `SHUFFLE`, and through the anti join of
//! an epoch continued over appended data (`appended.rs`), whose scans carry
//! each row's file and row already. A query whose rows are made from several
//! input rows or from no file (joins, aggregates, windows, `VALUES`, cached
//! tables) is refused naming the operator. A feed cut by `batch_tokens` or
//! `bucket_by_length` keeps its variable-length column (its lengths cut the
//! batches), so the function computing it runs too.

use std::sync::Arc;

use datafusion::arrow::array::{Array, StringArray};
use datafusion::catalog::TableProvider;
use datafusion::common::internal_err;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, JoinType, ScalarValue, not_impl_err, plan_err};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::{ViewTable, source_as_provider};
use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::functions::core::expr_fn::{file_row_index, input_file_name};
use datafusion::logical_expr::{
    Expr, Extension, Filter, LogicalPlan, Projection, SubqueryAlias, Union, cast, lit,
};
use datafusion::physical_plan::ExecutionPlan;

use crate::exec::{column_named, is_parquet_table, node_kind};
use crate::shuffle::{
    CONTENT_HASH_SEED, ShuffleKey, ShuffleNode, ShuffleSpec, row_key_hash,
};

mod explain;
pub(crate) use explain::{
    ExplainedShape, batch_origins, block_on, position_origins, scanned_file_ids,
    variable_length_outputs,
};

/// The file id and row that the scans of an epoch continued over appended
/// data carry into its anti join (`appended.rs`); the origins take them
/// from there.
pub(super) const APPENDED_SCAN_FILE: &str = "__sqlfeed_appended_file";
pub(super) const APPENDED_SCAN_ROW: &str = "__sqlfeed_appended_row";
/// The origins query's column with each row's file, as [`file_id`] of its
/// path in the object store.
pub(crate) const ORIGIN_FILE_COLUMN: &str = "__sqlfeed_origin_file";
/// The origins query's column with each row's index in its file.
pub(crate) const ORIGIN_ROW_COLUMN: &str = "__sqlfeed_origin_row";
/// The hidden columns that carry the file id and row index from the scan.
const SCAN_FILE_COLUMN: &str = "__sqlfeed_scan_file";
const SCAN_ROW_COLUMN: &str = "__sqlfeed_scan_row";
/// The content hash a shuffle of the origins query orders by.
const ORIGIN_HASH_COLUMN: &str = "__sqlfeed_origin_hash";

/// Where one row of a batch came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowOrigin {
    /// The Parquet file, as the feed's data manifest ([`super::input_files`])
    /// names it: `file:/data/part-0.parquet`, `s3://bucket/part-0.parquet`.
    pub file: String,
    /// The row group of the file that holds the row.
    pub row_group: usize,
    /// The row's index in the file (from 0, across row groups).
    pub row: u64,
}

/// What [`FeedBuilder::explain_batch`] found: the batch's position and the
/// origin of each of its rows, in batch order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOrigins {
    /// The batch's epoch.
    pub epoch: u64,
    /// Its global step.
    pub step: u64,
    /// The rank it belongs to.
    pub rank: usize,
    /// One entry per row of the batch.
    pub rows: Vec<RowOrigin>,
}

/// The `i64` a file's path becomes in [`ORIGIN_FILE_COLUMN`]: its content
/// hash as a shuffle computes it (`sqlfeed_row_key`), folded into the
/// non-negative `i64`s so that it is a tensor. Computed in SQL from
/// `input_file_name()` and here from the listed files.
fn file_ids(paths: &[&str]) -> Result<Vec<i64>> {
    let array: Arc<dyn Array> = Arc::new(StringArray::from(paths.to_vec()));
    let hashes = row_key_hash(&[array], 0)?;
    Ok(hashes
        .values()
        .iter()
        .map(|h| (h % i64::MAX as u64) as i64)
        .collect())
}

/// The SQL expression of [`file_ids`] over the scan's file column.
pub(crate) fn file_id_expr(row_key: Expr) -> Expr {
    cast(
        row_key % lit(i64::MAX as u64),
        datafusion::arrow::datatypes::DataType::Int64,
    )
}

/// `plan` (a feed's query, shuffled or not) reduced to the two origin
/// columns of each row and its output columns named in `kept`, in the same
/// order; see the module docs.
pub(crate) fn origins_plan(
    plan: LogicalPlan,
    row_key: Arc<datafusion::logical_expr::ScalarUDF>,
    kept: &[String],
) -> Result<LogicalPlan> {
    // Hashed at the scan, so that a shuffle carries 8 bytes, not the path.
    let file_id = file_id_expr(row_key.call(vec![lit(0i64), input_file_name()]));
    let carried = carry_origins(plan, &Carry { file_id, row_key })?;
    let schema = Arc::clone(carried.schema());
    let mut outputs = vec![
        column_named(&schema, SCAN_FILE_COLUMN)?.alias(ORIGIN_FILE_COLUMN),
        cast(
            column_named(&schema, SCAN_ROW_COLUMN)?,
            datafusion::arrow::datatypes::DataType::Int64,
        )
        .alias(ORIGIN_ROW_COLUMN),
    ];
    for name in kept {
        outputs.push(column_named(&schema, name)?);
    }
    Ok(LogicalPlan::Projection(Projection::try_new(
        outputs,
        Arc::new(carried),
    )?))
}

/// What [`carry_origins`] adds and hashes with.
struct Carry {
    /// Each row's file: an expression of `input_file_name()`.
    file_id: Expr,
    /// `sqlfeed_row_key`, which hashes a shuffle's key as the shuffle does.
    row_key: Arc<datafusion::logical_expr::ScalarUDF>,
}

/// `plan` with each row's file (`carry.file_id`) and row index as its last
/// two columns, rows and order unchanged.
fn carry_origins(plan: LogicalPlan, carry: &Carry) -> Result<LogicalPlan> {
    match plan {
        LogicalPlan::TableScan(scan) => {
            let provider = source_as_provider(&scan.source)?;
            // A folder glob's table is a view over the folders' files (see
            // `crate::sql::url_table`): follow the rows into it.
            if let Some(view) = provider.downcast_ref::<ViewTable>()
                && scan.projection.is_none()
                && scan.filters.is_empty()
            {
                let inner = carry_origins(view.logical_plan().clone(), carry)?;
                return Ok(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                    Arc::new(inner),
                    scan.table_name.clone(),
                )?));
            }
            check_parquet_files(scan.table_name.to_string(), provider.as_ref())?;
            let schema = Arc::clone(&scan.projected_schema);
            let mut exprs: Vec<Expr> = (0..schema.fields().len())
                .map(|i| Expr::Column(Column::from(schema.qualified_field(i))))
                .collect();
            exprs.push(carry.file_id.clone().alias(SCAN_FILE_COLUMN));
            exprs.push(file_row_index().alias(SCAN_ROW_COLUMN));
            Ok(LogicalPlan::Projection(Projection::try_new(
                exprs,
                Arc::new(LogicalPlan::TableScan(scan)),
            )?))
        }
        // A scan of an epoch continued over appended data (`appended.rs`):
        // its rows already carry their file and row through the anti join
        // that leaves out the consumed ones.
        LogicalPlan::Projection(projection)
            if let LogicalPlan::Join(join) = projection.input.as_ref()
                && join.join_type == JoinType::LeftAnti
                && join
                    .schema
                    .has_column_with_unqualified_name(APPENDED_SCAN_FILE)
                && join
                    .schema
                    .has_column_with_unqualified_name(APPENDED_SCAN_ROW) =>
        {
            let schema = Arc::clone(projection.input.schema());
            let mut exprs = projection.expr;
            exprs
                .push(column_named(&schema, APPENDED_SCAN_FILE)?.alias(SCAN_FILE_COLUMN));
            exprs.push(column_named(&schema, APPENDED_SCAN_ROW)?.alias(SCAN_ROW_COLUMN));
            Ok(LogicalPlan::Projection(Projection::try_new(
                exprs,
                projection.input,
            )?))
        }
        LogicalPlan::Projection(projection) => {
            let input = carry_origins(Arc::unwrap_or_clone(projection.input), carry)?;
            let mut exprs = projection.expr;
            exprs.push(column_named(input.schema(), SCAN_FILE_COLUMN)?);
            exprs.push(column_named(input.schema(), SCAN_ROW_COLUMN)?);
            Ok(LogicalPlan::Projection(Projection::try_new(
                exprs,
                Arc::new(input),
            )?))
        }
        LogicalPlan::Filter(filter) => {
            let input = carry_origins(Arc::unwrap_or_clone(filter.input), carry)?;
            Ok(LogicalPlan::Filter(Filter::try_new(
                filter.predicate,
                Arc::new(input),
            )?))
        }
        LogicalPlan::SubqueryAlias(alias) => {
            let input = carry_origins(Arc::unwrap_or_clone(alias.input), carry)?;
            Ok(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                Arc::new(input),
                alias.alias,
            )?))
        }
        plan @ (LogicalPlan::Sort(_) | LogicalPlan::Limit(_)) => {
            let input = carry_origins(single_input(&plan)?, carry)?;
            plan.with_new_exprs(plan.expressions(), vec![input])
        }
        LogicalPlan::Union(union) => {
            let inputs = union
                .inputs
                .into_iter()
                .map(|input| {
                    carry_origins(Arc::unwrap_or_clone(input), carry).map(Arc::new)
                })
                .collect::<Result<Vec<_>>>()?;
            // As the SQL planner builds it: the analyzer coerces the types.
            Ok(LogicalPlan::Union(Union::try_new_with_loose_types(inputs)?))
        }
        LogicalPlan::Extension(Extension { node })
            if node.as_any().downcast_ref::<ShuffleNode>().is_some() =>
        {
            let shuffle = node
                .as_any()
                .downcast_ref::<ShuffleNode>()
                .expect("checked by the match guard");
            let input = carry_origins(shuffle.input().clone(), carry)?;
            let key = match (shuffle.spec(), shuffle.key()) {
                // Neither a local shuffle's order nor one by position (the
                // rows' files and row indexes) depends on the rows' content:
                // the origin columns ride along without changing it.
                (ShuffleSpec::Local { .. } | ShuffleSpec::Positional { .. }, key)
                | (_, key @ (ShuffleKey::ContentHash(_) | ShuffleKey::StoredOrder(_))) => {
                    key.clone()
                }
                (
                    ShuffleSpec::Global { .. } | ShuffleSpec::Windowed { .. },
                    ShuffleKey::AllColumns,
                ) => {
                    let schema = shuffle.input().schema();
                    let key = (0..schema.fields().len())
                        .map(|i| Expr::Column(Column::from(schema.qualified_field(i))));
                    return keyed_by_content_hash(
                        input,
                        key.collect(),
                        carry,
                        shuffle.spec(),
                    );
                }
                (
                    ShuffleSpec::Global { .. } | ShuffleSpec::Windowed { .. },
                    ShuffleKey::Columns(names),
                ) => {
                    let key = names
                        .iter()
                        .map(|name| column_named(shuffle.input().schema(), name))
                        .collect::<Result<Vec<_>>>()?;
                    return keyed_by_content_hash(input, key, carry, shuffle.spec());
                }
            };
            Ok(LogicalPlan::Extension(Extension {
                node: Arc::new(ShuffleNode::try_new_keyed(input, shuffle.spec(), key)?),
            }))
        }
        other => not_impl_err!(
            "explain_batch follows each row back to its Parquet file through scans, \
             projections, filters, sorts, limits, UNION ALL and SHUFFLE; this query's \
             rows pass through {}, which makes a row from several input rows or from \
             no file",
            node_kind(&other)
        ),
    }
}

/// `input` (a shuffle's input with its origin columns) shuffled by the
/// content hash of `key` — the hash the query's own shuffle orders by, so
/// the rows come in its order — with the hash computed before the shuffle.
/// Only the 8-byte hash, the origins and what the rest of the plan reads go
/// through the shuffle (see `ShuffleNode::necessary_children_exprs`), not
/// the key's columns (a 3 KB image). The result has `input`'s columns.
fn keyed_by_content_hash(
    input: LogicalPlan,
    key: Vec<Expr>,
    carry: &Carry,
    spec: ShuffleSpec,
) -> Result<LogicalPlan> {
    let schema = Arc::clone(input.schema());
    let columns: Vec<Expr> = (0..schema.fields().len())
        .map(|i| Expr::Column(Column::from(schema.qualified_field(i))))
        .collect();
    let mut args = vec![lit(ScalarValue::UInt64(Some(CONTENT_HASH_SEED)))];
    args.extend(key);
    let mut hashed = columns.clone();
    hashed.push(carry.row_key.call(args).alias(ORIGIN_HASH_COLUMN));
    let hashed = LogicalPlan::Projection(Projection::try_new(hashed, Arc::new(input))?);
    let shuffled = LogicalPlan::Extension(Extension {
        node: Arc::new(ShuffleNode::try_new_keyed(
            hashed,
            spec,
            ShuffleKey::ContentHash(ORIGIN_HASH_COLUMN.to_string()),
        )?),
    });
    Ok(LogicalPlan::Projection(Projection::try_new(
        columns,
        Arc::new(shuffled),
    )?))
}

/// The one input of a single-input plan node.
fn single_input(plan: &LogicalPlan) -> Result<LogicalPlan> {
    match plan.inputs().as_slice() {
        [input] => Ok((*input).clone()),
        inputs => internal_err!(
            "{} has {} inputs, expected one",
            plan.display(),
            inputs.len()
        ),
    }
}

/// Fails unless `source` is a table of Parquet files (the file row index
/// is a Parquet reader's).
pub(crate) fn check_parquet_files(
    table: String,
    provider: &dyn TableProvider,
) -> Result<()> {
    if is_parquet_table(provider) {
        return Ok(());
    }
    plan_err!(
        "explain_batch names the Parquet file and row of every row, but the query reads \
         {table}, which is not a table of Parquet files (a cached table, a view, a \
         Delta Lake table or another format); explain the query that reads the files instead"
    )
}

/// Every file `plan` scans, with its store and the number of the scan
/// (one file may be read in byte ranges by several partitions of a scan).
fn scanned_files(
    plan: &Arc<dyn ExecutionPlan>,
) -> Result<Vec<(ObjectStoreUrl, PartitionedFile, usize)>> {
    let mut files = vec![];
    let mut scans = 0;
    plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<DataSourceExec>()
            && let Some(config) = scan.data_source().downcast_ref::<FileScanConfig>()
        {
            for group in &config.file_groups {
                for file in group.iter() {
                    files.push((config.object_store_url.clone(), file.clone(), scans));
                }
            }
            scans += 1;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use datafusion::logical_expr::LogicalPlanBuilder;

    use super::*;
    use crate::shuffle::ShuffleSpec;

    fn write(path: &std::path::Path) -> Result<()> {
        crate::feed::inputs::tests::write(path, 10)
    }

    fn row_key() -> Arc<datafusion::logical_expr::ScalarUDF> {
        Arc::new(datafusion::logical_expr::ScalarUDF::from(
            crate::sql::RowKeyFunc::new(),
        ))
    }

    /// The shuffle nodes of `plan`'s tree.
    fn shuffles(plan: &LogicalPlan) -> Vec<ShuffleNode> {
        let mut found = vec![];
        let _ = plan.apply(|node| {
            if let LogicalPlan::Extension(Extension { node }) = node
                && let Some(shuffle) = node.as_any().downcast_ref::<ShuffleNode>()
            {
                found.push(shuffle.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        });
        found
    }

    #[tokio::test]
    async fn origin_columns_never_join_a_shuffle_key() -> Result<()> {
        let dir = tempfile::tempdir()?;
        write(&dir.path().join("a.parquet"))?;
        let session = crate::Session::try_new()?;
        let sql = format!("SELECT id FROM '{}/a.parquet'", dir.path().display());
        let (_, plan) = session.sql(&sql).await?.into_parts();
        let spec = ShuffleSpec::Global { seed: 1, epoch: 0 };
        // Keyed on every column as written: the same columns by name after.
        let shuffled = LogicalPlanBuilder::from(LogicalPlan::Extension(Extension {
            node: Arc::new(ShuffleNode::try_new(plan, spec)?),
        }))
        .build()?;
        let origins = origins_plan(shuffled, row_key(), &[])?;
        let [shuffle] = shuffles(&origins).try_into().expect("one shuffle");
        assert_eq!(
            shuffle.key(),
            &ShuffleKey::ContentHash(ORIGIN_HASH_COLUMN.into())
        );
        // The hash is of the query's columns as written, nothing else.
        let LogicalPlan::Projection(hashed) = shuffle.input() else {
            panic!(
                "the hash is computed below the shuffle: {}",
                shuffle.input()
            );
        };
        let hash = hashed.expr.last().expect("the hash");
        let hashed_columns: Vec<String> = hash
            .column_refs()
            .into_iter()
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(hashed_columns, ["id"]);
        assert_eq!(
            origins.schema().field_names(),
            [ORIGIN_FILE_COLUMN, ORIGIN_ROW_COLUMN]
        );
        // Optimized, only the origins and the hash go through the shuffle.
        let optimized = session.context().state().optimize(&origins)?;
        let [shuffle] = shuffles(&optimized).try_into().expect("one shuffle");
        let mut through = shuffle.input().schema().field_names();
        through.sort();
        assert_eq!(
            through,
            [ORIGIN_HASH_COLUMN, SCAN_FILE_COLUMN, SCAN_ROW_COLUMN]
        );
        Ok(())
    }

    #[test]
    fn file_ids_are_non_negative_tensor_values_and_distinct() -> Result<()> {
        let ids = file_ids(&["tmp/pv/part-00000.parquet", "a"])?;
        assert!(ids.iter().all(|id| *id >= 0));
        assert_ne!(ids[0], ids[1]);
        Ok(())
    }
}
