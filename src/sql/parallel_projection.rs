//! [`ParallelProjectionExec`]: a projection of costly row-wise functions
//! (image decoding, transforms, tokenizing) evaluated on several cores, in
//! batches sized by output bytes, in input order; and [`ParallelFunctions`],
//! the physical optimizer rule that puts it where such functions are.
//!
//! ```text
//!  input batch (8192 rows of JPEG bytes)
//!    │ cut into morsels as workers free up: 64, 128, … rows until a decoded
//!    │ morsel has been measured, then function_batch_bytes / bytes-per-row
//!    ▼
//!  ┌ worker ┐ ┌ worker ┐  …  up to `workers` morsels evaluated at once
//!  └───┬────┘ └───┬────┘     (tokio tasks of the query's runtime)
//!      └────┬─────┘
//!           ▼ in input order
//!  output batches of about function_batch_bytes each
//! ```
//!
//! # Why
//! DataFusion's `ProjectionExec` evaluates a whole input batch at once, in
//! its partition's task. For a decoder that means 8192 decoded float32
//! images (400 MB at 3×64×64) before the first row leaves, and one core per
//! partition: after a global `SHUFFLE`, which has one output partition, one
//! core decodes for the whole feed. Here the first output batch needs about
//! one small morsel of decodes, memory in flight is `workers × batch bytes`,
//! and a single partition uses every core.
//!
//! # Ordering
//! Output rows are the input rows in input order, per partition: morsels
//! are emitted in the order they were cut, whichever worker finishes first.
//! Batch boundaries differ from the input's (smaller batches).
//!
//! # Memory
//! Each partition reserves `workers × batch bytes` from the session's pool
//! before reading; the batch size shrinks to 1/8 of a worker's share of a
//! finite pool, so a tight budget gets smaller batches rather than an
//! error. A single row larger than the batch size is still evaluated whole.
//!
//! # Errors and cancellation
//! The first error (or a panic of a function, reported as an error naming
//! it) ends the stream, unless the projection isolates row errors (a
//! feed's quarantine, [`ParallelProjectionExec::isolating_row_errors`]):
//! then a row whose functions fail is marked in an extra last column and
//! the stream goes on (`crate::exec::row_errors`). Dropping the stream
//! aborts the workers' tasks.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::common::{exec_datafusion_err, resources_datafusion_err};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder,
};
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};

use crate::config::SqlfeedOptions;
use crate::exec::{
    BatchStream, NodeRewrite, PlanNode, Rewritten, calls_costly_function, row_errors,
};

/// Rows of the first morsel, before any output has been measured; later
/// unmeasured morsels double, up to [`MAX_GUESS_ROWS`].
const FIRST_MORSEL_ROWS: usize = 64;

/// Largest unmeasured morsel.
const MAX_GUESS_ROWS: usize = 1024;

/// The bytes a batch's arrays own or view from the row range they cover
/// (a column passed through shares its input's buffers).
fn output_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| {
            c.to_data()
                .get_slice_memory_size()
                .unwrap_or_else(|_| c.get_array_memory_size())
        })
        .sum()
}

/// A projection whose costly row-wise functions run on several workers, in
/// batches of about `batch_bytes` of output, with the rows kept in their
/// input order (the order of a `SHUFFLE` under it survives). Module docs:
/// the diagram, memory and ordering.
#[derive(Debug)]
pub struct ParallelProjectionExec {
    /// The rows to project.
    input: Arc<dyn ExecutionPlan>,
    /// The projection's expressions and output names.
    exprs: Vec<ProjectionExpr>,
    /// Output schema (the projection's).
    schema: SchemaRef,
    /// The projection's properties: same partitioning, same ordering.
    properties: Arc<PlanProperties>,
    /// Morsels evaluated at once per partition.
    workers: usize,
    /// Target output bytes per morsel.
    batch_bytes: usize,
    /// Failing rows are marked in a last column instead of ending the
    /// stream (see `crate::exec::row_errors`).
    isolate_row_errors: bool,
    /// Output rows, compute time and morsels.
    metrics: ExecutionPlanMetricsSet,
}

impl ParallelProjectionExec {
    /// `projection`, evaluated by `workers` tasks per partition in batches of
    /// about `batch_bytes` output bytes.
    pub fn new(projection: &ProjectionExec, workers: usize, batch_bytes: usize) -> Self {
        Self {
            input: Arc::clone(projection.input()),
            exprs: projection.expr().to_vec(),
            schema: projection.schema(),
            properties: Arc::clone(projection.properties()),
            workers: workers.max(1),
            batch_bytes: batch_bytes.max(1),
            isolate_row_errors: false,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// `projection` like [`Self::new`], with its row errors isolated: the
    /// output's fields become nullable and gain the marker column
    /// ([`row_errors::ROW_ERROR_COLUMN`]); partitioning and emission are the
    /// projection's.
    pub fn isolating_row_errors(
        projection: &ProjectionExec,
        workers: usize,
        batch_bytes: usize,
    ) -> Self {
        let schema = row_errors::isolating_schema(&projection.schema());
        let properties = projection.properties();
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            properties.output_partitioning().clone(),
            properties.emission_type,
            properties.boundedness,
        );
        Self {
            schema,
            properties: Arc::new(properties),
            isolate_row_errors: true,
            ..Self::new(projection, workers, batch_bytes)
        }
    }

    /// Whether failing rows are marked instead of ending the stream.
    pub fn isolates_row_errors(&self) -> bool {
        self.isolate_row_errors
    }

    /// Morsels evaluated at once per partition.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Target output bytes per morsel.
    pub fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// The projection's expressions.
    pub fn exprs(&self) -> &[ProjectionExpr] {
        &self.exprs
    }
}

impl DisplayAs for ParallelProjectionExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let exprs = self
            .exprs
            .iter()
            .map(|e| format!("{} as {}", e.expr, e.alias))
            .collect::<Vec<_>>()
            .join(", ");
        let isolated = if self.isolate_row_errors {
            ", row_errors=isolated"
        } else {
            ""
        };
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "ParallelProjectionExec: workers={}, batch_bytes={}{isolated}, \
                 expr=[{exprs}]",
                self.workers, self.batch_bytes
            ),
            DisplayFormatType::TreeRender => write!(
                f,
                "workers={}\nbatch_bytes={}{}\nexpr=[{exprs}]",
                self.workers,
                self.batch_bytes,
                isolated.replace(", ", "\n")
            ),
        }
    }
}

impl ExecutionPlan for ParallelProjectionExec {
    crate::exec::name_and_properties!("ParallelProjectionExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for e in &self.exprs {
            if f(&e.expr)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    // It parallelises itself; a round-robin split below it would
    // interleave an ordered input's rows (a shuffle's) by timing.
    crate::exec::keeps_input_order!();

    // Row-wise functions: one output row per input row.
    crate::exec::statistics_of_one_input!(rows_passed_through);

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let child = crate::exec::single_child(self.name(), &children)?;
        let projection = ProjectionExec::try_new(self.exprs.clone(), child)?;
        if self.isolate_row_errors {
            return Ok(Arc::new(Self::isolating_row_errors(
                &projection,
                self.workers,
                self.batch_bytes,
            )));
        }
        Ok(Arc::new(Self::new(
            &projection,
            self.workers,
            self.batch_bytes,
        )))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let workers = self.workers;
        let batch_bytes = match ctx.memory_pool().memory_limit() {
            MemoryLimit::Finite(limit) => {
                let partitions = self.properties.output_partitioning().partition_count();
                let share = limit / (partitions.max(1) * workers);
                self.batch_bytes.min(share / 8).max(1)
            }
            _ => self.batch_bytes,
        };
        let reservation =
            MemoryConsumer::new(format!("ParallelProjectionExec[{partition}]"))
                .register(ctx.memory_pool());
        reservation.try_grow(workers * batch_bytes).map_err(|e| {
            resources_datafusion_err!("ParallelProjectionExec needs {} bytes for {workers} batches of {batch_bytes} \
                 decoded bytes in flight: {e}. Raise the memory limit or lower \
                 sqlfeed.function_batch_bytes",
                workers * batch_bytes)
        })?;
        let input = self.input.execute(partition, ctx)?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let morsels: Count =
            MetricBuilder::new(&self.metrics).counter("morsels", partition);
        let schema = Arc::clone(&self.schema);
        let exprs: Arc<[ProjectionExpr]> = self.exprs.clone().into();
        let measured_rows = Arc::new(AtomicUsize::new(0));
        let isolate = self.isolate_row_errors;
        let cutter = MorselCutter {
            input,
            current: None,
            guess: FIRST_MORSEL_ROWS,
            measured_rows: Arc::clone(&measured_rows),
        };
        let evaluated = futures::stream::try_unfold(cutter, MorselCutter::next)
            .map_ok(move |morsel| {
                let exprs = Arc::clone(&exprs);
                let schema = Arc::clone(&schema);
                let measured_rows = Arc::clone(&measured_rows);
                let baseline = baseline.clone();
                let morsels = morsels.clone();
                SpawnedTask::spawn(async move {
                    let timer = baseline.elapsed_compute().timer();
                    let out = if isolate {
                        row_errors::evaluate_isolating(&exprs, &schema, &morsel)?
                    } else {
                        evaluate(&exprs, &schema, &morsel)?
                    };
                    timer.done();
                    let bytes = output_bytes(&out).max(1);
                    let rows_per_batch = (batch_bytes as u128 * out.num_rows() as u128
                        / bytes as u128)
                        .max(1);
                    measured_rows.store(rows_per_batch as usize, Ordering::Relaxed);
                    baseline.record_output(out.num_rows());
                    morsels.add(1);
                    Ok(out)
                })
            })
            .map_ok(|task| async move {
                task.join().await.map_err(|e| {
                    if e.is_panic() {
                        exec_datafusion_err!(
                            "a function panicked: {}",
                            crate::exec::panic_message(&e.into_panic())
                        )
                    } else {
                        exec_datafusion_err!("a function's task failed: {e}")
                    }
                })?
            })
            .try_buffered(workers)
            // The reservation lives as long as the stream.
            .inspect(move |_| {
                let _ = &reservation;
            });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            evaluated,
        )))
    }

    crate::exec::metrics_of_field!();
}

/// `exprs` evaluated on `batch`.
fn evaluate(
    exprs: &[ProjectionExpr],
    schema: &SchemaRef,
    batch: &RecordBatch,
) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let arrays = exprs
        .iter()
        .map(|e| e.expr.evaluate(batch)?.into_array(rows))
        .collect::<Result<Vec<ArrayRef>>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        arrays,
        &options,
    )?)
}

/// Cuts input batches into morsels, one per call, sized by the latest
/// measurement (or doubling guesses before there is one).
struct MorselCutter {
    /// The projection's input.
    input: SendableRecordBatchStream,
    /// The batch being cut and the offset of its next row.
    current: Option<(RecordBatch, usize)>,
    /// Rows of the next unmeasured morsel.
    guess: usize,
    /// Rows per morsel from the last evaluated one (0: none yet).
    measured_rows: Arc<AtomicUsize>,
}

impl MorselCutter {
    /// The next morsel, or `None` at the end of the input.
    async fn next(mut self) -> Result<Option<(RecordBatch, Self)>> {
        loop {
            if let Some((batch, offset)) = &mut self.current
                && *offset < batch.num_rows()
            {
                let measured = self.measured_rows.load(Ordering::Relaxed);
                let wanted = if measured > 0 {
                    measured
                } else {
                    let guess = self.guess;
                    self.guess = (guess * 2).min(MAX_GUESS_ROWS);
                    guess
                };
                let rows = wanted.min(batch.num_rows() - *offset);
                let morsel = batch.slice(*offset, rows);
                *offset += rows;
                return Ok(Some((morsel, self)));
            }
            match self.input.next().await {
                Some(batch) => self.current = Some((batch?, 0)),
                None => return Ok(None),
            }
        }
    }
}

/// Replaces every `ProjectionExec` that calls a costly row-wise function
/// with a [`ParallelProjectionExec`] (`sqlfeed.function_batch_bytes`, 0 to
/// turn off), with `target_partitions / input partitions` workers; with
/// `sqlfeed.isolate_row_errors`, every projection that computes something.
#[derive(Debug, Default)]
pub struct ParallelFunctions {
    /// Only the projections a quarantine keeps out of file scans (a Ballista
    /// scheduler's rule: executors parallelise the costly ones themselves,
    /// for their own cores).
    isolation_only: bool,
}

impl ParallelFunctions {
    /// The rule for a Ballista scheduler: see `isolation_only`.
    pub fn isolation_only() -> Self {
        Self {
            isolation_only: true,
        }
    }
}

crate::exec::node_rewrite_rule!(ParallelFunctions, "sqlfeed_parallel_functions");

impl NodeRewrite for ParallelFunctions {
    fn rewrite(&self, node: PlanNode, config: &ConfigOptions) -> Rewritten {
        let Some(projection) = node.as_ref().downcast_ref::<ProjectionExec>() else {
            return Ok(Transformed::no(node));
        };
        let options = SqlfeedOptions::of(config);
        let costly = options.function_batch_bytes > 0
            && projection
                .expr()
                .iter()
                .any(|e| calls_costly_function(&e.expr));
        // A quarantining feed keeps every computing projection out of the
        // file scan, where its failing rows could not be isolated.
        let computes = options.isolate_row_errors
            && projection
                .expr()
                .iter()
                .any(|e| e.expr.as_ref().downcast_ref::<Column>().is_none());
        if !computes && (self.isolation_only || !costly) {
            return Ok(Transformed::no(node));
        }
        let batch_bytes = match options.function_batch_bytes {
            0 => SqlfeedOptions::default().function_batch_bytes,
            bytes => bytes,
        };
        let cores = config.execution.target_partitions.max(1);
        let partitions = projection.input().output_partitioning().partition_count();
        let workers = (cores / partitions.max(1)).max(1);
        Ok(Transformed::yes(Arc::new(ParallelProjectionExec::new(
            projection,
            workers,
            batch_bytes,
        )) as PlanNode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::Int64Type;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::error::DataFusionError;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, Literal};
    use datafusion::prelude::SessionContext;
    use datafusion::scalar::ScalarValue;

    /// `a + 1` over `partitions` partitions of `rows` consecutive ids each,
    /// in input batches of 1000 rows.
    fn plus_one(partitions: usize, rows: i64) -> Result<ProjectionExec> {
        let batch = |start: i64| {
            RecordBatch::try_from_iter(vec![(
                "a",
                Arc::new(Int64Array::from_iter_values(start..start + 1000)) as ArrayRef,
            )])
        };
        let data = (0..partitions as i64)
            .map(|p| {
                (0..rows / 1000)
                    .map(|b| batch(p * rows + b * 1000))
                    .collect::<std::result::Result<Vec<_>, _>>()
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let schema = data[0][0].schema();
        let source = MemorySourceConfig::try_new_exec(&data, schema, None)?;
        let expr: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
            Arc::new(Column::new("a", 0)),
            Operator::Plus,
            Arc::new(Literal::new(ScalarValue::Int64(Some(1)))),
        ));
        ProjectionExec::try_new(vec![ProjectionExpr::new(expr, "b")], source)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_workers_keep_the_input_order_in_byte_sized_batches() -> Result<()> {
        let projection = plus_one(2, 10_000)?;
        // 8 bytes per row: 64 bytes is 8 rows per morsel once measured.
        let parallel: Arc<dyn ExecutionPlan> =
            Arc::new(ParallelProjectionExec::new(&projection, 4, 64));
        let ctx = SessionContext::new();
        for partition in 0..2 {
            let stream = parallel.execute(partition, ctx.task_ctx())?;
            let batches: Vec<RecordBatch> = stream.try_collect().await?;
            let values: Vec<i64> = batches
                .iter()
                .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                .collect();
            let start = partition as i64 * 10_000 + 1;
            assert_eq!(values, (start..start + 10_000).collect::<Vec<_>>());
            // The first morsels are guesses (64, 128, … rows), then 8 rows.
            assert_eq!(batches[0].num_rows(), FIRST_MORSEL_ROWS);
            let measured = batches.iter().skip(8).map(|b| b.num_rows()).max();
            assert!(measured <= Some(8), "{measured:?}");
        }
        let metrics = parallel.metrics().expect("metrics");
        assert_eq!(metrics.output_rows(), Some(20_000));
        Ok(())
    }

    #[tokio::test]
    async fn the_rule_parallelises_costly_functions_only() -> Result<()> {
        let session = crate::Session::builder().target_partitions(2).build()?;
        let plan = |sql: &'static str| {
            let session = session.clone();
            async move {
                let df = session.sql(sql).await?;
                let plan = df.create_physical_plan().await?;
                Ok::<_, DataFusionError>(
                    datafusion::physical_plan::displayable(plan.as_ref())
                        .indent(true)
                        .to_string(),
                )
            }
        };
        let costly = plan(
            "SELECT image_decode(b) AS i FROM (VALUES (X'89504E47'), (X'FFD8FF')) AS t(b)",
        )
        .await?;
        assert!(
            costly.contains("ParallelProjectionExec: workers="),
            "{costly}"
        );
        let cheap = plan("SELECT upper(s) FROM (VALUES ('a'), ('b')) AS t(s)").await?;
        assert!(!cheap.contains("ParallelProjectionExec"), "{cheap}");
        let ctx = session.context();
        ctx.sql("SET sqlfeed.function_batch_bytes = 0").await?;
        let off = plan("SELECT image_decode(b) AS i FROM (VALUES (X'89504E47')) AS t(b)")
            .await?;
        assert!(!off.contains("ParallelProjectionExec"), "{off}");
        Ok(())
    }

    #[tokio::test]
    async fn a_bad_row_is_an_error_that_ends_the_stream() -> Result<()> {
        let session = crate::Session::builder().target_partitions(2).build()?;
        let df = session
            .sql("SELECT image_decode(b) AS i FROM (VALUES (X'00'), (X'01')) AS t(b)")
            .await?;
        let err = session
            .collect(df)
            .await
            .expect_err("undecodable bytes")
            .to_string();
        assert!(err.contains("image_decode"), "{err}");
        Ok(())
    }
}
