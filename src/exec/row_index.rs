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
//!  DataSourceExec                                    the clean scan, with
//!    projection [x, CAST(row_index@15), …]    ──►      [x, CAST(file_row_index()), …]
//!    virtual columns [row_index]                       pushed into it: the scan
//!  becomes RowIndexScanExec: the scan's projection,    adds its row index as
//!    file_row_index() in place of the row index,       when it was planned
//!    over the scan without virtual columns or
//!    projection (the clean scan, an ordinary
//!    DataSourceExec)
//! ```
//!
//! The clean scan stays a child that Ballista knows: its scheduler gives
//! each task only that task's file groups by rewriting the stage's
//! `DataSourceExec`s (an operator it does not know would be left whole,
//! and every task would read every file).
//!
//! The executor pushes the projection into the clean scan the way
//! DataFusion's projection pushdown did when the plan was made, so the
//! scan it runs is the scan the scheduler planned. Every Parquet scan
//! that reads a row index travels this way: a `SHUFFLE BY POSITION`'s
//! stage 1 and a plain query selecting `file_row_index()` alike. Filters
//! on a row index are never pushed into the scan (DataFusion keeps them
//! above it), so the scan's predicate travels as it is.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Statistics, internal_err};
use datafusion::config::ConfigOptions;
use datafusion::datasource::physical_plan::{
    FileScanConfig, FileScanConfigBuilder, FileSource, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PhysicalExpr, PlanProperties,
};

use crate::exec::{BatchStream, NodeRewrite, PlanNode, Rewritten};

/// A Parquet scan that reads row indexes, as it travels: its projection,
/// with `file_row_index()` in place of each row index, over the scan
/// without them. See the module docs.
#[derive(Debug)]
pub struct RowIndexScanExec {
    /// The scan without its virtual columns or projection.
    clean: Arc<dyn ExecutionPlan>,
    /// The scan's projection over `clean`'s columns, `file_row_index()`
    /// in place of its row index.
    projection: ProjectionExprs,
    /// The clean scan with the projection pushed into it: what runs.
    scan: Arc<dyn ExecutionPlan>,
}

impl RowIndexScanExec {
    /// `projection` (over `clean`'s columns, calling `file_row_index()`)
    /// over `clean`, a Parquet scan without virtual columns.
    pub fn try_new(
        clean: Arc<dyn ExecutionPlan>,
        projection: ProjectionExprs,
    ) -> Result<Self> {
        let scan = Self::restore(&clean, &projection)?;
        Ok(Self {
            clean,
            projection,
            scan,
        })
    }

    /// The scan that runs here: on the scheduler the scan as planned (with
    /// what DataFusion's protobuf does not carry either, such as a reversed
    /// row group order), else the one restored from the wire.
    pub fn scan(&self) -> &Arc<dyn ExecutionPlan> {
        &self.scan
    }

    /// `scan` carried as its clean scan and projection, if it is a Parquet
    /// scan that reads a row index.
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
        // Columns past this width are virtual: row numbers, the only
        // virtual column DataFusion 55's Parquet scan has.
        let width = table.schema_without_virtual_columns().fields().len();
        let config_options = Arc::new(ConfigOptions::default());
        let table_schema = TableSchema::builder(Arc::clone(table.file_schema()))
            .with_table_partition_cols(table.table_partition_cols().clone())
            .build();
        let clean_schema = Arc::clone(table_schema.table_schema());
        let mut reads_row_index = false;
        let carried = projection.clone().try_map_exprs(|expr| {
            expr.transform(|e| {
                let Some(column) = e.downcast_ref::<Column>() else {
                    return Ok(Transformed::no(e));
                };
                if column.index() < width {
                    return Ok(Transformed::no(e));
                }
                let field = table.table_schema().field(column.index());
                if field.data_type() != &DataType::Int64 {
                    return internal_err!(
                        "a Parquet scan reads virtual column '{}' of type {}: only a \
                         row index (Int64) travels to executors",
                        field.name(),
                        field.data_type()
                    );
                }
                let row_index: Arc<dyn PhysicalExpr> =
                    Arc::new(ScalarFunctionExpr::try_new(
                        datafusion::functions::core::file_row_index(),
                        vec![],
                        &clean_schema,
                        Arc::clone(&config_options),
                    )?);
                reads_row_index = true;
                Ok(Transformed::yes(row_index))
            })
            .map(|t| t.data)
        })?;
        if !reads_row_index {
            // Its virtual column unread: the scan travels as it is.
            return Ok(None);
        }
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(Arc::new(rebuilt(parquet, table_schema)))
            .build();
        let clean: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(config);
        // Restored once here, so that a projection the clean scan refuses
        // fails on the scheduler, naming it, rather than on every task.
        Self::restore(&clean, &carried)?;
        Ok(Some(Self {
            clean,
            projection: carried,
            scan: Arc::clone(scan),
        }))
    }

    /// The scan of `clean` with `projection` pushed into it: DataFusion
    /// adds the row index for each `file_row_index()`, as it did when the
    /// scan was planned.
    pub fn restore(
        clean: &Arc<dyn ExecutionPlan>,
        projection: &ProjectionExprs,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some((config, parquet)) = parquet_scan(clean) else {
            return internal_err!(
                "RowIndexScanExec reads a Parquet scan, got {}",
                clean.name()
            );
        };
        let Some(source) = parquet.try_pushdown_projection(projection)? else {
            return internal_err!(
                "a Parquet scan refused the projection it was planned with"
            );
        };
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(source)
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }

    /// The scan's projection, `file_row_index()` in place of its row
    /// index.
    pub fn projection(&self) -> &ProjectionExprs {
        &self.projection
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

impl DisplayAs for RowIndexScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "RowIndexScanExec: ")?;
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
        Ok(Arc::new(Self::try_new(clean, self.projection.clone())?))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        self.scan.execute(partition, ctx)
    }

    // The scan's own: a leaf, it needs no input's.
    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.scan.statistics_from_inputs(&[], args)
    }
}

/// `plan` with every [`RowIndexScanExec`] replaced by the scan it carries.
///
/// A plan the scheduler plans inside its planning (a shuffle by position's
/// input, planned again with its positions) has been through every rule,
/// [`CarryRowIndexes`] too. The outer plan's rules must see that input's
/// scans as scans (to cut, balance and place them), and its own last rule
/// carries them again.
pub(crate) fn uncarried(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    Ok(plan
        .transform_up(|node| {
            Ok(match node.downcast_ref::<RowIndexScanExec>() {
                Some(carried) => Transformed::yes(Arc::clone(carried.scan())),
                None => Transformed::no(node),
            })
        })?
        .data)
}

/// Carries every Parquet scan that reads a row index as a
/// [`RowIndexScanExec`]; the scheduler's last rule, once nothing else will
/// touch the scans.
#[derive(Debug, Default)]
pub struct CarryRowIndexes;

crate::exec::node_rewrite_rule!(CarryRowIndexes, "sqlfeed_carry_row_indexes");

impl NodeRewrite for CarryRowIndexes {
    fn rewrite(&self, node: PlanNode, _config: &ConfigOptions) -> Rewritten {
        Ok(match RowIndexScanExec::wrap(&node)? {
            // Leaves first: the new clean scan below is not visited.
            Some(scan) => Transformed::yes(Arc::new(scan) as PlanNode),
            None => Transformed::no(node),
        })
    }
}
