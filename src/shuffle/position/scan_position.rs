//! Each row's position, carried from the scan to the shuffle: the logical
//! rewrite that gives [`super::PositionShuffleExec`] its last two columns.
//!
//! ```text
//!  Projection: decode(b) AS x, y            Projection: decode(b) AS x, y,
//!    Filter: w > 0                 ──►        __position_file, __position_row
//!      TableScan: 'data/*.parquet'              Filter: w > 0
//!                                                 Projection: *,
//!                                                   CAST(input_file_name() AS
//!                                                     Dictionary(Int32, Utf8)),
//!                                                   CAST(file_row_index() AS Int64)
//!                                                   TableScan: 'data/*.parquet'
//! ```
//!
//! DataFusion 55 evaluates both functions in the Parquet scan itself. Rows
//! reach the shuffle through projections, filters and aliases only: a
//! position names one row of one file, so anything that makes a row from
//! several rows or from no file is refused, naming the operator.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{Column, DFSchema, not_impl_err};
use datafusion::datasource::{ViewTable, source_as_provider};
use datafusion::error::Result;
use datafusion::functions::core::expr_fn::{file_row_index, input_file_name};

use crate::exec::{column_named, is_parquet_table, node_kind};
use datafusion::logical_expr::{
    Expr, Filter, LogicalPlan, Projection, SubqueryAlias, cast,
};

/// Name of the column that carries each row's file path.
pub(crate) const POSITION_FILE_COLUMN: &str = "__sqlfeed_position_file";
/// Name of the column that carries each row's index in its file.
pub(crate) const POSITION_ROW_COLUMN: &str = "__sqlfeed_position_row";

/// The type of the column that carries each row's file path.
pub(crate) fn position_file_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

/// `plan` with each row's file path and row index in that file as its last
/// two columns; rows and columns otherwise unchanged.
pub(crate) fn with_positions(plan: LogicalPlan) -> Result<LogicalPlan> {
    match plan {
        LogicalPlan::TableScan(scan) => {
            let provider = source_as_provider(&scan.source)?;
            // A folder glob's table is a view over the folders' files (see
            // `crate::sql::url_table`): follow the rows into it.
            if let Some(view) = provider.downcast_ref::<ViewTable>()
                && scan.projection.is_none()
                && scan.filters.is_empty()
            {
                let inner = with_positions(view.logical_plan().clone())?;
                return Ok(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                    Arc::new(inner),
                    scan.table_name.clone(),
                )?));
            }
            if !is_parquet_table(provider.as_ref()) {
                return not_impl_err!(
                    "SHUFFLE BY POSITION orders rows by the Parquet file and row they come \
                     from, but the query reads {}, which is not a table of Parquet files (a \
                     cached table, a view, a Delta Lake table or another format). Use \
                     SHUFFLE, which orders rows by their content",
                    scan.table_name
                );
            }
            let schema = Arc::clone(&scan.projected_schema);
            let mut exprs = columns_of(&schema);
            // The scan evaluates `input_file_name()` as a literal per file:
            // cast to a dictionary, its column is one path and a key per
            // row instead of a copy of the path per row.
            exprs.push(
                cast(input_file_name(), position_file_type()).alias(POSITION_FILE_COLUMN),
            );
            exprs
                .push(cast(file_row_index(), DataType::Int64).alias(POSITION_ROW_COLUMN));
            Ok(LogicalPlan::Projection(Projection::try_new(
                exprs,
                Arc::new(LogicalPlan::TableScan(scan)),
            )?))
        }
        LogicalPlan::Projection(projection) => {
            let input = with_positions(Arc::unwrap_or_clone(projection.input))?;
            let mut exprs = projection.expr;
            exprs.push(column_named(input.schema(), POSITION_FILE_COLUMN)?);
            exprs.push(column_named(input.schema(), POSITION_ROW_COLUMN)?);
            Ok(LogicalPlan::Projection(Projection::try_new(
                exprs,
                Arc::new(input),
            )?))
        }
        LogicalPlan::Filter(filter) => {
            let input = with_positions(Arc::unwrap_or_clone(filter.input))?;
            Ok(LogicalPlan::Filter(Filter::try_new(
                filter.predicate,
                Arc::new(input),
            )?))
        }
        LogicalPlan::SubqueryAlias(alias) => {
            let input = with_positions(Arc::unwrap_or_clone(alias.input))?;
            Ok(LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(
                Arc::new(input),
                alias.alias,
            )?))
        }
        other => not_impl_err!(
            "SHUFFLE BY POSITION orders rows by the Parquet file and row they come from, \
             through scans, projections and filters; this query's rows pass through {}, \
             which makes a row from several rows, from no file, or reads rows in a \
             changed order or number. Use SHUFFLE, which orders rows by their content",
            node_kind(&other)
        ),
    }
}

/// Every column of `schema`, qualified as it has them.
fn columns_of(schema: &DFSchema) -> Vec<Expr> {
    (0..schema.fields().len())
        .map(|i| Expr::Column(Column::from(schema.qualified_field(i))))
        .collect()
}
