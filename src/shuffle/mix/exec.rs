//! [`MixExec`]: interleaves the sources of a mixture, each read as its
//! epoch's window of passes, in the turns of [`Interleave`].
//!
//! ```text
//!                      MixExec: rows in the turns of the interleave;
//!                        │      each source's rows in its window's order
//!        ┌───────────────┼──────────────────────┐
//!   source 0          source 1             source 2   (one task each)
//!   MixWindowExec     ProjectionExec       EmptyExec
//!   (pass p: skip s,  (its functions,      (quota 0)
//!    take quota)       window rows only)
//!     ShuffleMergeExec  MixWindowExec
//!       <source 0>        pass q ─► pass q+1 (shuffles of source 1 as its
//!                                              rows enter its functions)
//! ```
//!
//! [`Interleave`]: super::pattern::Interleave
//!
//! # Order
//! A pure function of (the sources' rows, weights, rows per epoch, seed,
//! epoch): each pass is a global shuffle (content-keyed, so the same on any
//! number of partitions), the window says which of its rows the epoch takes
//! ([`super::window::MixWindowExec`]), and the interleave says which source
//! each position takes its next row from. The output is one partition.
//!
//! # Memory
//! Each source runs in a task of its own, so the sources' shuffles (a
//! barrier each) run side by side; their memory is reserved by the shuffles
//! below, from the session's pool, and spills there. Between a source's task
//! and the interleave are at most two batches. Output batches are gathered
//! (`interleave`) from slices of the sources' batches: the rows are copied
//! once. They hold the session's batch size in rows, or as many as fit in
//! 8 MiB when rows are wide (images).
//!
//! # Errors
//! A source's error ends the stream, with the source's name; a source that
//! gives fewer rows than its window (its data changed since it was counted)
//! is an error that says so.
//!
//! # Metrics
//! `output_rows`, `elapsed_compute`, and `rows_<source>` per source.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::exec::BatchStream;
use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::compute::interleave;
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::stats::Precision;
use datafusion::common::{Statistics, exec_err, internal_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder,
};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::stream::{
    RecordBatchReceiverStream, RecordBatchStreamAdapter,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use futures::StreamExt;

use super::pattern::Turns;

/// One source of a [`MixExec`]: a single-partition plan giving the rows the
/// epoch takes from it, in order (its window of passes, finished by its
/// functions), and how many they are.
#[derive(Debug, Clone)]
pub struct MixSource {
    /// The `source` name, for errors and metrics.
    pub name: String,
    /// The source's rows for this epoch.
    pub plan: Arc<dyn ExecutionPlan>,
    /// Rows the epoch takes from it.
    pub take: u64,
}

/// Interleaves [`MixSource`]s; see the module docs.
#[derive(Debug)]
pub struct MixExec {
    sources: Vec<MixSource>,
    /// The epoch's turns, from its first position.
    turns: Turns,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl MixExec {
    /// Mixes `sources`, whose passes all have `schema`'s columns (nullability
    /// may differ: the output's columns are nullable where any source's is).
    pub fn try_new(
        sources: Vec<MixSource>,
        turns: Turns,
        schema: SchemaRef,
    ) -> Result<Self> {
        let mut fields: Vec<Field> =
            schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        for source in &sources {
            let source_schema = source.plan.schema();
            if source_schema.fields().len() != fields.len() {
                return internal_err!(
                    "mixture source '{}' has {} columns, the mixture {}",
                    source.name,
                    source_schema.fields().len(),
                    fields.len()
                );
            }
            for (field, theirs) in fields.iter_mut().zip(source_schema.fields()) {
                if theirs.is_nullable() {
                    *field = field.clone().with_nullable(true);
                }
            }
        }
        let schema =
            Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
        let properties = Arc::new(crate::exec::one_bounded_partition(
            Arc::clone(&schema),
            EmissionType::Incremental,
        ));
        Ok(Self {
            sources,
            turns,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The sources, with their shares.
    pub fn sources(&self) -> &[MixSource] {
        &self.sources
    }

    /// The epoch's turns, at its first position.
    pub fn turns(&self) -> &Turns {
        &self.turns
    }

    /// Rows each source gave so far, by name, in the sources' order.
    pub fn rows_given(&self) -> Vec<(String, u64)> {
        let metrics = self.metrics.clone_inner();
        self.sources
            .iter()
            .map(|s| {
                let rows = metrics
                    .sum_by_name(&format!("rows_{}", s.name))
                    .map_or(0, |v| v.as_usize() as u64);
                (s.name.clone(), rows)
            })
            .collect()
    }
}

/// Rows each source of the first mixture in `plan` (from the top) gave, by
/// name; empty when `plan` has no mixture. A feed reports them per epoch.
pub fn mixture_rows(plan: &Arc<dyn ExecutionPlan>) -> Vec<(String, u64)> {
    if let Some(mix) = plan.downcast_ref::<MixExec>() {
        return mix.rows_given();
    }
    plan.children()
        .into_iter()
        .map(mixture_rows)
        .find(|rows| !rows.is_empty())
        .unwrap_or_default()
}

/// The rows each source of a mixture named `names` takes, read back from a
/// plan rendered as text (`EXPLAIN`, or a cluster stage's plan from the
/// scheduler): the first `MixExec` line whose sources are `names`, in
/// order. A cluster feed reports the realised proportions of the job's
/// mixture with it: the job gave every row of its epoch, so each source
/// gave its take.
pub fn takes_in_rendered_plan(
    plan: &str,
    names: &[String],
) -> Option<Vec<(String, u64)>> {
    plan.lines()
        .filter_map(|line| line.trim_start().strip_prefix(DISPLAY_NAME))
        .find_map(|sources| {
            // The names are known, so a name holding "; " or ": " parses.
            let mut rest = sources;
            let mut takes = Vec::with_capacity(names.len());
            for (k, name) in names.iter().enumerate() {
                rest = rest.strip_prefix(name.as_str())?.strip_prefix(": ")?;
                let digits = rest.find(|c: char| !c.is_ascii_digit())?;
                takes.push((name.clone(), rest[..digits].parse().ok()?));
                rest = rest[digits..].strip_prefix(" rows")?;
                if k + 1 < names.len() {
                    rest = rest.strip_prefix("; ")?;
                }
            }
            // Only what a display may append (DataFusion's metrics).
            (rest.is_empty() || rest.starts_with(',')).then_some(takes)
        })
}

const DISPLAY_NAME: &str = "MixExec: ";

impl DisplayAs for MixExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{DISPLAY_NAME}")?;
        let parts: Vec<String> = self
            .sources
            .iter()
            .map(|s| format!("{}: {} rows", s.name, s.take))
            .collect();
        write!(f, "{}", parts.join("; "))
    }
}

impl ExecutionPlan for MixExec {
    crate::exec::name_and_properties!("MixExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.sources.iter().map(|s| &s.plan).collect()
    }

    crate::exec::no_expressions!();

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false; self.children().len()]
    }

    // Each source is one partition in its window's order.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; self.children().len()]
    }

    fn required_input_distribution(
        &self,
    ) -> Vec<datafusion::physical_plan::Distribution> {
        vec![
            datafusion::physical_plan::Distribution::SinglePartition;
            self.children().len()
        ]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != self.children().len() {
            return internal_err!(
                "MixExec has {} children, got {}",
                self.children().len(),
                children.len()
            );
        }
        let sources = self
            .sources
            .iter()
            .zip(children)
            .map(|(s, plan)| MixSource {
                name: s.name.clone(),
                plan,
                take: s.take,
            })
            .collect();
        Ok(Arc::new(Self::try_new(
            sources,
            self.turns.clone(),
            Arc::clone(&self.schema),
        )?))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        crate::exec::only_partition("MixExec", partition)?;
        let mut readers = Vec::with_capacity(self.sources.len());
        for source in &self.sources {
            let counter = MetricBuilder::new(&self.metrics)
                .counter(format!("rows_{}", source.name), partition);
            readers.push(SourceReader {
                name: source.name.clone(),
                stream: source_stream(source, &self.schema, Arc::clone(&ctx)),
                batches: VecDeque::new(),
                offset: 0,
                rows: counter,
            });
        }
        let mixer = Mixer {
            readers,
            turns: self.turns.clone(),
            left: self.sources.iter().map(|s| s.take).sum(),
            batch_size: ctx.session_config().batch_size().max(1),
            schema: Arc::clone(&self.schema),
            baseline: BaselineMetrics::new(&self.metrics, partition),
        };
        // Ends after the first error.
        let output = futures::stream::try_unfold(mixer, |mut mixer| async move {
            Ok(mixer.next_batch().await?.map(|batch| (batch, mixer)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            output,
        )))
    }

    crate::exec::metrics_of_field!();

    /// The epoch's rows are known when the mixture is planned: a
    /// `count(*)` of a mixture (a feed's `len()`, its progress bar's total)
    /// costs its planning, not its passes.
    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let rows = self.sources.iter().map(|s| s.take).sum::<u64>();
        let mut statistics = Statistics::new_unknown(&self.schema);
        statistics.num_rows =
            usize::try_from(rows).map_or(Precision::Absent, Precision::Exact);
        Ok(Arc::new(statistics))
    }
}

/// A source's rows as one stream, each batch cast to the mixture's schema
/// (nullability only). Runs in a task of its own.
fn source_stream(
    source: &MixSource,
    schema: &SchemaRef,
    context: Arc<TaskContext>,
) -> SendableRecordBatchStream {
    let mut builder = RecordBatchReceiverStream::builder(Arc::clone(schema), 2);
    let sender = builder.tx();
    let (plan, schema) = (Arc::clone(&source.plan), Arc::clone(schema));
    builder.spawn(async move {
        let mut stream = plan.execute(0, context)?;
        while let Some(batch) = stream.next().await {
            let batch =
                RecordBatch::try_new(Arc::clone(&schema), batch?.columns().to_vec())?;
            if sender.send(Ok(batch)).await.is_err() {
                // The mixture was dropped: stop reading.
                return Ok(());
            }
        }
        Ok(())
    });
    builder.build()
}

/// The rows of one source not yet handed out.
struct SourceReader {
    name: String,
    stream: SendableRecordBatchStream,
    batches: VecDeque<RecordBatch>,
    /// Rows of the front batch already handed out.
    offset: usize,
    rows: Count,
}

impl SourceReader {
    /// Rows buffered and not yet handed out.
    fn buffered(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum::<usize>() - self.offset
    }

    /// Reads until `rows` rows are buffered.
    async fn fill(&mut self, rows: usize) -> Result<()> {
        let mut buffered = self.buffered();
        while buffered < rows {
            match self.stream.next().await {
                Some(Ok(batch)) => {
                    buffered += batch.num_rows();
                    self.batches.push_back(batch);
                }
                Some(Err(e)) => {
                    return Err(DataFusionError::Context(
                        format!("mixture source '{}'", self.name),
                        Box::new(e),
                    ));
                }
                None => {
                    return exec_err!(
                        "mixture source '{}' ended {} rows short of its share: its data \
                         changed after it was counted (run the query again)",
                        self.name,
                        rows - buffered
                    );
                }
            }
        }
        Ok(())
    }
}

/// Bytes above which output batches are made smaller (see
/// [`Mixer::next_batch`]).
const MAX_OUTPUT_BATCH_BYTES: usize = 8 << 20;

/// The fewest rows an output batch is cut to, however wide the rows.
const MIN_OUTPUT_BATCH_ROWS: usize = 64;

/// Hands out the interleave's turns as output batches.
struct Mixer {
    readers: Vec<SourceReader>,
    turns: Turns,
    /// Rows of the epoch not yet handed out.
    left: u64,
    /// Rows per output batch: the session's batch size, or fewer for wide
    /// rows.
    batch_size: usize,
    schema: SchemaRef,
    baseline: BaselineMetrics,
}

impl Mixer {
    async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        let rows = (self.batch_size as u64).min(self.left) as usize;
        if rows == 0 {
            return Ok(None);
        }
        self.left -= rows as u64;
        let mut turns: Vec<usize> = Vec::with_capacity(rows);
        while turns.len() < rows {
            match self.turns.next_turn()? {
                Some(k) => turns.push(k),
                None => {
                    return internal_err!(
                        "a mixture's turns ended {} rows early",
                        rows - turns.len()
                    );
                }
            }
        }
        let mut wanted = vec![0usize; self.readers.len()];
        for &k in &turns {
            wanted[k] += 1;
        }
        for (reader, &want) in self.readers.iter_mut().zip(&wanted) {
            if want > 0 {
                reader.fill(want).await?;
            }
        }
        let timer = self.baseline.elapsed_compute().timer();
        // The slices the turns read: (reader, batch) in a flat list, and for
        // each reader where its next row is.
        let mut slices: Vec<&RecordBatch> = vec![];
        let mut cursor: Vec<(usize, usize)> = vec![(0, 0); self.readers.len()];
        let mut first_slice = vec![0usize; self.readers.len()];
        for (k, reader) in self.readers.iter().enumerate() {
            first_slice[k] = slices.len();
            cursor[k] = (first_slice[k], reader.offset);
            let mut need = wanted[k];
            let mut offset = reader.offset;
            for batch in &reader.batches {
                if need == 0 {
                    break;
                }
                slices.push(batch);
                need = need.saturating_sub(batch.num_rows() - offset);
                offset = 0;
            }
        }
        let mut indices = Vec::with_capacity(rows);
        for &k in &turns {
            let (slice, row) = &mut cursor[k];
            if *row >= slices[*slice].num_rows() {
                *slice += 1;
                *row = 0;
            }
            indices.push((*slice, *row));
            *row += 1;
        }
        let columns = (0..self.schema.fields().len())
            .map(|c| {
                let arrays: Vec<&dyn Array> =
                    slices.iter().map(|b| b.column(c).as_ref()).collect();
                interleave(&arrays, &indices)
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        // Batches stay a few MiB whatever the rows' width: a batch of 8192
        // image rows is 25 MB, and an allocation above mimalloc's 16 MiB
        // huge-object size takes fresh pages from the kernel every time,
        // zeroed (measured: more CPU than the copy itself).
        let bytes = batch.get_array_memory_size();
        if bytes > MAX_OUTPUT_BATCH_BYTES {
            self.batch_size =
                (rows * MAX_OUTPUT_BATCH_BYTES / bytes).max(MIN_OUTPUT_BATCH_ROWS);
        }
        // Advance each reader past what it gave.
        for (k, reader) in self.readers.iter_mut().enumerate() {
            if wanted[k] == 0 {
                continue;
            }
            reader.rows.add(wanted[k]);
            let (slice, row) = cursor[k];
            let consumed_batches = slice - first_slice[k];
            reader.batches.drain(..consumed_batches);
            reader.offset = row;
            if reader
                .batches
                .front()
                .is_some_and(|b| b.num_rows() == reader.offset)
            {
                reader.batches.pop_front();
                reader.offset = 0;
            }
        }
        timer.done();
        self.baseline.record_output(batch.num_rows());
        Ok(Some(batch))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::displayable;
    use datafusion::physical_plan::empty::EmptyExec;

    use super::*;
    use crate::shuffle::mix::pattern::Interleave;

    #[test]
    fn takes_are_read_back_from_the_rendered_plan_by_their_names() -> Result<()> {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let source = |name: &str, take| MixSource {
            name: name.to_string(),
            plan: Arc::new(EmptyExec::new(Arc::clone(&schema))),
            take,
        };
        // Names holding the separators still parse: the names are known.
        let names = ["web; a: b".to_string(), "code".to_string()];
        let mix = MixExec::try_new(
            vec![source(&names[0], 600), source(&names[1], 25)],
            Turns::Fixed(Interleave::new(vec![600, 25])),
            Arc::clone(&schema),
        )?;
        let rendered = format!(
            "ProjectionExec: expr=[x@0 as x]\n  {}",
            displayable(&mix).indent(true)
        );
        assert_eq!(
            takes_in_rendered_plan(&rendered, &names),
            Some(vec![(names[0].clone(), 600), (names[1].clone(), 25)])
        );
        // Other names, or fewer of them, are another mixture: none.
        let other = ["web".to_string(), "code".to_string()];
        assert_eq!(takes_in_rendered_plan(&rendered, &other), None);
        assert_eq!(takes_in_rendered_plan(&rendered, &names[..1]), None);
        assert_eq!(takes_in_rendered_plan("EmptyExec", &names), None);
        Ok(())
    }
}
