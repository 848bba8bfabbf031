//! [`RowIndexScanExec`]: a Parquet scan's row index, carried to executors.
//!
//! DataFusion 55 evaluates `file_row_index()` in the Parquet scan: planning
//! adds a *virtual column* (arrow's `RowNumber` extension type) after the
//! table's columns and projects it. The physical plan's protobuf carries a
//! scan's file schema and partition columns but not its virtual columns,
//! so on an executor the decoded projection names a column the table no
//! longer has, and the task fails ("Column index 15 out of bounds for
//! projected expressions of length 15").
//!
//! ```text
//!  scheduler (CarryRowIndexes, its last rule)        executor (decoding)
//!  PositionKeyExec                                   PositionKeyExec
//!    … DataSourceExec                                  … DataSourceExec
//!      projection [x, file, CAST(row_index@15)]   ──►    the clean scan, with
//!      virtual columns [row_index]                       CAST(file_row_index())
//!  becomes RowIndexScanExec: where each row index        pushed into it: the
//!    column goes, over the scan without them (the        scan adds its row index
//!    clean scan, an ordinary DataSourceExec)             as when it was planned
//! ```
//!
//! The clean scan stays a child that Ballista knows: its scheduler gives
//! each task only that task's file groups by rewriting the stage's
//! `DataSourceExec`s (an operator it does not know would be left whole,
//! and every task would read every file).
//!
//! The executor pushes `file_row_index()` into the clean scan the way
//! DataFusion's projection pushdown did when the plan was made, so the
//! scan it runs is the scan the scheduler planned. Only scans under
//! [`PositionKeyExec`] (a `SHUFFLE BY POSITION`'s stage 1) are carried
//! this way; a plain query selecting `file_row_index()` on a cluster fails
//! with DataFusion's error.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_datafusion_err, internal_err};
use datafusion::config::ConfigOptions;
use datafusion::datasource::physical_plan::{
    FileScanConfig, FileScanConfigBuilder, FileSource, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::expressions::{CastExpr, Column};
use datafusion::physical_expr::projection::{ProjectionExpr, ProjectionExprs};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PhysicalExpr, PlanProperties,
};

use crate::exec::{BatchStream, NodeRewrite, PlanNode, Rewritten};
use crate::shuffle::PositionKeyExec;

/// A Parquet scan that projects row indexes, as it travels: where each
/// goes, over the scan without them. See the module docs.
#[derive(Debug)]
pub struct RowIndexScanExec {
    /// The scan without its row index columns.
    clean: Arc<dyn ExecutionPlan>,
    /// Each row index column: its place in the scan's output and its name.
    row_columns: Vec<(usize, String)>,
    /// The clean scan with its row indexes: what runs.
    scan: Arc<dyn ExecutionPlan>,
}

impl RowIndexScanExec {
    /// Row index columns `row_columns` (place, name) over `clean`, a
    /// Parquet scan without them.
    pub fn try_new(
        clean: Arc<dyn ExecutionPlan>,
        row_columns: Vec<(usize, String)>,
    ) -> Result<Self> {
        let scan = Self::restore(&clean, &row_columns)?;
        Ok(Self {
            clean,
            row_columns,
            scan,
        })
    }

    /// `scan` carried as its clean scan and row index columns, if it is a
    /// Parquet scan that projects row indexes.
    pub fn wrap(scan: &Arc<dyn ExecutionPlan>) -> Result<Option<Self>> {
        let Some((config, parquet)) = parquet_scan(scan) else {
            return Ok(None);
        };
        let table = parquet.table_schema();
        if table.virtual_columns().is_empty() {
            return Ok(None);
        }
        let Some(projection) = parquet.projection() else {
            return Ok(None);
        };
        // Columns past this width are virtual: row numbers.
        let width = table.schema_without_virtual_columns().fields().len();
        let mut kept: Vec<ProjectionExpr> = vec![];
        let mut row_columns = vec![];
        for (place, projected) in projection.iter().enumerate() {
            if !references_past(&projected.expr, width)? {
                kept.push(projected.clone());
            } else if is_row_index(&projected.expr, width) {
                row_columns.push((place, projected.alias.clone()));
            } else {
                return internal_err!(
                    "a Parquet scan projects {} over its virtual columns: only a row \
                     index (as Int64) travels to executors",
                    projected.expr
                );
            }
        }
        let table_schema = TableSchema::builder(Arc::clone(table.file_schema()))
            .with_table_partition_cols(table.table_partition_cols().clone())
            .build();
        let clean = with_source(
            config,
            rebuilt(parquet, table_schema),
            &ProjectionExprs::new(kept),
        )?;
        Self::try_new(clean, row_columns).map(Some)
    }

    /// The scan of `clean` with `row_columns` (place, name) pushed into it
    /// as `CAST(file_row_index() AS Int64)`: DataFusion adds the row index
    /// as it did when the scan was planned.
    pub fn restore(
        clean: &Arc<dyn ExecutionPlan>,
        row_columns: &[(usize, String)],
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some((config, parquet)) = parquet_scan(clean) else {
            return internal_err!(
                "RowIndexScanExec reads a Parquet scan, got {}",
                clean.name()
            );
        };
        let schema = clean.schema();
        let mut clean_columns = schema.fields().iter().enumerate();
        let width = schema.fields().len() + row_columns.len();
        let config_options = Arc::new(ConfigOptions::default());
        let mut exprs = Vec::with_capacity(width);
        for place in 0..width {
            if let Some((_, name)) = row_columns.iter().find(|(at, _)| *at == place) {
                let row_index: Arc<dyn PhysicalExpr> =
                    Arc::new(ScalarFunctionExpr::try_new(
                        datafusion::functions::core::file_row_index(),
                        vec![],
                        &schema,
                        Arc::clone(&config_options),
                    )?);
                let cast = Arc::new(CastExpr::new(row_index, DataType::Int64, None));
                exprs.push(ProjectionExpr::new(cast, name.clone()));
            } else {
                let (index, field) = clean_columns.next().ok_or_else(|| {
                    internal_datafusion_err!(
                        "RowIndexScanExec: row index places past the scan"
                    )
                })?;
                exprs.push(ProjectionExpr::new(
                    Arc::new(Column::new(field.name(), index)),
                    field.name().clone(),
                ));
            }
        }
        with_source(config, parquet.clone(), &ProjectionExprs::new(exprs))
    }

    /// Each row index column's place in the output and its name.
    pub fn row_columns(&self) -> &[(usize, String)] {
        &self.row_columns
    }
}

/// `plan`'s file scan configuration and Parquet source, if it is a Parquet
/// scan.
fn parquet_scan(
    plan: &Arc<dyn ExecutionPlan>,
) -> Option<(&FileScanConfig, &ParquetSource)> {
    let config = plan
        .downcast_ref::<DataSourceExec>()?
        .data_source()
        .downcast_ref::<FileScanConfig>()?;
    let parquet = config.file_source().downcast_ref::<ParquetSource>()?;
    Some((config, parquet))
}

/// A Parquet source like `parquet` (options, reader, predicate) over
/// `table_schema`, projecting all of it.
fn rebuilt(parquet: &ParquetSource, table_schema: TableSchema) -> ParquetSource {
    let mut source = ParquetSource::new(table_schema)
        .with_table_parquet_options(parquet.table_parquet_options().clone());
    if let Some(factory) = parquet.parquet_file_reader_factory() {
        source = source.with_parquet_file_reader_factory(Arc::clone(factory));
    }
    if let Some(predicate) = parquet.filter() {
        source = source.with_predicate(predicate);
    }
    source
}

/// The scan of `config` reading through `source` with `projection` pushed
/// into it (over the source's output).
fn with_source(
    config: &FileScanConfig,
    source: ParquetSource,
    projection: &ProjectionExprs,
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(source) = source.try_pushdown_projection(projection)? else {
        return internal_err!("a Parquet scan refused a projection of its own columns");
    };
    let config = FileScanConfigBuilder::from(config.clone())
        .with_source(source)
        .build();
    Ok(DataSourceExec::from_data_source(config))
}

/// Whether `expr` reads a column at `width` or past it.
fn references_past(expr: &Arc<dyn PhysicalExpr>, width: usize) -> Result<bool> {
    let mut past = false;
    expr.apply(|e| {
        if e.downcast_ref::<Column>()
            .is_some_and(|c| c.index() >= width)
        {
            past = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(past)
}

/// Whether `expr` is a virtual column (at `width` or past it), cast to
/// Int64 or not: the row index as sqlfeed projects it.
fn is_row_index(expr: &Arc<dyn PhysicalExpr>, width: usize) -> bool {
    let column = match expr.downcast_ref::<CastExpr>() {
        Some(cast) if cast.cast_type() == &DataType::Int64 => cast.expr(),
        Some(_) => return false,
        None => expr,
    };
    column
        .downcast_ref::<Column>()
        .is_some_and(|c| c.index() >= width)
}

impl DisplayAs for RowIndexScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "RowIndexScanExec: row_columns=[")?;
        for (i, (place, name)) in self.row_columns.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{name}@{place}")?;
        }
        write!(f, "], ")?;
        self.scan.fmt_as(t, f)
    }
}

impl ExecutionPlan for RowIndexScanExec {
    fn name(&self) -> &str {
        "RowIndexScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.scan.properties()
    }

    fn children(&self) -> Vec<&PlanNode> {
        vec![&self.clean]
    }

    // The scan it carries, partition for partition: nothing may come
    // between (`restore` reads the Parquet scan itself).
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    crate::exec::no_expressions!();

    fn with_new_children(self: Arc<Self>, children: Vec<PlanNode>) -> Result<PlanNode> {
        let clean = crate::exec::single_child("RowIndexScanExec", &children)?;
        Ok(Arc::new(Self::try_new(clean, self.row_columns.clone())?))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        self.scan.execute(partition, ctx)
    }
}

/// Carries every Parquet scan that projects row indexes under a
/// [`PositionKeyExec`] as a [`RowIndexScanExec`]; the scheduler's last
/// rule, once nothing else will touch the scans.
#[derive(Debug, Default)]
pub struct CarryRowIndexes;

crate::exec::node_rewrite_rule!(CarryRowIndexes, "sqlfeed_carry_row_indexes");

impl NodeRewrite for CarryRowIndexes {
    // From the root, to stop below the first `PositionKeyExec`.
    const ROOT_FIRST: bool = true;

    fn rewrite(&self, node: PlanNode, _config: &ConfigOptions) -> Rewritten {
        if node.as_ref().downcast_ref::<PositionKeyExec>().is_none() {
            return Ok(Transformed::no(node));
        }
        let carried = node.transform_up(|below| {
            Ok(match RowIndexScanExec::wrap(&below)? {
                Some(scan) => Transformed::yes(Arc::new(scan) as PlanNode),
                None => Transformed::no(below),
            })
        })?;
        Ok(Transformed::new(
            carried.data,
            carried.transformed,
            TreeNodeRecursion::Jump,
        ))
    }
}
