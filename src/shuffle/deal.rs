//! [`DealExec`] and [`RankShardExec`]: a cluster feed's final stages deal
//! the shuffled epoch into one output partition per (range, rank), so that
//! each training rank fetches its own batches only (about `1/W` of the
//! epoch's bytes), not the whole epoch.
//!
//! ```text
//!  stage 2: PermuteExec (per partition)
//!           RangeBucketExec (counted): rows → key range k, and at the end one
//!             count row per range: (k, this task's rows in range 0, 1, …)
//!           ── hash exchange on the range ──────────────────────────────
//!  stage 3: PermuteExec (ranged): sorts range k, count rows first
//!           ShuffleMergeExec (ranged)
//!           DealExec: sums the count rows → offset of range k and epoch
//!             size N; row g of the epoch → rank partition (below)
//!           ── hash exchange on the rank partition ─────────────────────
//!  final:   RankShardExec: partition j = rank j mod W's rows of one piece
//!           (projections, the query's functions)
//!  rank r:  fetches partitions r, r + W, r + 2W, … in order
//! ```
//!
//! # The deal is the feed's batching
//! The feed cuts the global order into steps of `B × W` rows and gives
//! rank `r` rows `[r·B, (r+1)·B)` of each (`crate::feed` batcher). The last,
//! partial step of `R` rows is dropped (`drop_last`) or padded to
//! `R' = ⌈R/W⌉·W` rows with the epoch's first rows, cycled, and split into
//! `W` runs of `R'/W`. [`DealShape`] says, for row `g` of the epoch, which
//! rank gets it and where; partitions are numbered so that rank `r`'s in
//! order are its rows in order:
//! - `k·W + r` for `k < P`: rank `r`'s rows of range `k` (full steps, then
//!   its run of the last step);
//! - `P·W + t·W + r`: pad `t` of the last step, if it is rank `r`'s.
//!
//! Reading its partitions, rank `r` sees exactly the rows its embedded
//! batcher would keep, in order; it cuts them into batches of `B` (the last
//! one shorter), so batches, counts and resume are the embedded ones.
//!
//! # Why count rows
//! A task of the final stage holds one range and needs the rows of every
//! range before it. Ballista 55 hands a task only its own partitions'
//! locations (and statistics) and numbers them from 0, so the counts travel
//! in the data: every stage-2 task that saw rows sends each range one count
//! row, keyed with the range's first key so that the range's sort puts it
//! first. A data row whose key *equals* that first key (probability 2⁻⁶⁴
//! per row) could sort before a count row; [`DealExec`] notices and fails
//! rather than deal with partial counts.
//!
//! # Memory
//! One record batch at a time; pad copies are at most `W − 1` rows.

use std::fmt;
use std::sync::Arc;

use crate::exec::{BatchStream, Setting};
use datafusion::arrow::array::{
    Array, AsArray, RecordBatch, UInt32Array, UInt32Builder, UInt64Array, UInt64Builder,
};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::internal_datafusion_err;
use datafusion::common::internal_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{Distribution, EquivalenceProperties, Partitioning};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, RecordOutput,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

use super::range::{RANGE_COUNTS_COLUMN, decode_counts, route_values};

/// Name of the column [`DealExec`] adds (last): the route value of the
/// row's rank partition.
pub const RANK_ROUTE_COLUMN: &str = "__sqlfeed_rank_route";

/// How the feed consuming the job cuts batches: what the deal reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deal {
    /// `B`, rows per batch.
    pub batch_rows: usize,
    /// `W`, the ranks.
    pub world: usize,
    /// Whether the last partial step is dropped.
    pub drop_last: bool,
}

impl Deal {
    /// The deal `options` ask for (`sqlfeed.deal_*`, set by a cluster
    /// feed's shared job), if any.
    pub fn requested(options: &crate::config::SqlfeedOptions) -> Option<Self> {
        (options.ordered_result_partitions
            && options.deal_world >= 2
            && options.deal_batch_rows >= 1)
            .then_some(Self {
                batch_rows: options.deal_batch_rows,
                world: options.deal_world,
                drop_last: options.deal_drop_last,
            })
    }

    /// Output partitions of a deal over `ranges` key ranges: `W` per range
    /// and `W` per possible pad (at most `W − 1`).
    pub fn partitions(&self, ranges: usize) -> usize {
        self.world * (ranges + self.world - 1)
    }
}

/// Where the rows of an epoch of `total` rows go; see the module docs.
#[derive(Debug, Clone)]
pub struct DealShape {
    deal: Deal,
    ranges: usize,
    /// Rows in full steps.
    full_rows: u64,
    /// `R`, rows of the last, partial step (0 if none or dropped).
    last_rows: u64,
    /// `R' / W`, each rank's run of the padded last step.
    per_rank: u64,
    /// `R' − R`.
    pads: u64,
    /// The epoch's first rows that pads cycle through: `min(W − 1, N)`.
    head: u64,
}

impl DealShape {
    /// The shape of an epoch of `total` rows over `ranges` ranges.
    pub fn new(deal: Deal, ranges: usize, total: u64) -> Self {
        let (batch, world) = (deal.batch_rows.max(1) as u64, deal.world.max(1) as u64);
        let step = batch * world;
        let full_rows = total / step * step;
        let last_rows = if deal.drop_last { 0 } else { total - full_rows };
        let padded = last_rows.div_ceil(world) * world;
        Self {
            deal,
            ranges,
            full_rows,
            last_rows,
            per_rank: padded / world,
            pads: padded - last_rows,
            head: total.min(world - 1),
        }
    }

    /// The partition of row `g` of the epoch, which range `range` holds;
    /// `None` if the row is dropped (`drop_last`).
    pub fn partition(&self, range: usize, g: u64) -> Option<usize> {
        let (batch, world) = (self.deal.batch_rows.max(1) as u64, self.deal.world as u64);
        let rank = if g < self.full_rows {
            g % (batch * world) / batch
        } else if g - self.full_rows < self.last_rows {
            (g - self.full_rows) / self.per_rank
        } else {
            return None;
        };
        Some(range * self.deal.world + rank as usize)
    }

    /// The pad partitions row `g` is copied to, in order.
    pub fn pad_partitions(&self, g: u64) -> impl Iterator<Item = usize> + '_ {
        let world = self.deal.world;
        let pads = if g < self.head { self.pads } else { 0 };
        (g..pads).step_by(self.head.max(1) as usize).map(move |t| {
            let rank = (self.last_rows + t) / self.per_rank;
            self.ranges * world + t as usize * world + rank as usize
        })
    }
}

/// Routes each row of a ranged shuffle to the partition of the rank whose
/// batch it falls in (adding [`RANK_ROUTE_COLUMN`]), from the count rows
/// that tell its range's offset in the epoch. Module docs: the numbering of
/// partitions and why counts travel in the data.
#[derive(Debug)]
pub struct DealExec {
    /// A ranged [`super::ShuffleMergeExec`] over counted ranges.
    input: Arc<dyn ExecutionPlan>,
    deal: Deal,
    ranges: usize,
    /// The value routing to each output partition of the exchange above.
    route: Arc<Vec<u64>>,
    /// Where the input's counts column is.
    counts_index: usize,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl DealExec {
    /// Deals `input`'s `ranges` key ranges as `deal` says.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        deal: Deal,
        ranges: usize,
    ) -> Result<Self> {
        if deal.world < 2 || deal.batch_rows == 0 {
            return internal_err!(
                "DealExec deals to 2 or more ranks in batches of 1 or more rows: {deal:?}"
            );
        }
        let input_schema = input.schema();
        let counts_index = input_schema.index_of(RANGE_COUNTS_COLUMN).map_err(|_| {
            internal_datafusion_err!(
                "DealExec reads counted key ranges (a {RANGE_COUNTS_COLUMN} column)"
            )
        })?;
        let schema = crate::exec::with_u64_column(
            &input_schema,
            RANK_ROUTE_COLUMN,
            Some(counts_index),
        );
        let properties = crate::exec::row_wise_properties(&input, Arc::clone(&schema));
        Ok(Self {
            input,
            deal,
            ranges,
            route: Arc::new(route_values(deal.partitions(ranges))?),
            counts_index,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The deal.
    pub fn deal(&self) -> Deal {
        self.deal
    }

    /// The key ranges it reads.
    pub fn ranges(&self) -> usize {
        self.ranges
    }

    /// Output partitions of the exchange above.
    pub fn partitions(&self) -> usize {
        self.deal.partitions(self.ranges)
    }
}

impl DisplayAs for DealExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let Deal {
            batch_rows,
            world,
            drop_last,
        } = self.deal;
        let settings: [Setting; 5] = [
            ("batch_rows", &batch_rows),
            ("world", &world),
            ("drop_last", &drop_last),
            ("ranges", &self.ranges),
            ("partitions", &self.partitions()),
        ];
        crate::exec::fmt_settings(f, t, "DealExec", &settings)
    }
}

impl ExecutionPlan for DealExec {
    crate::exec::one_input_operator! {
        name: "DealExec",
        properties: own,
        rebuild: |this, child| Self::try_new(child, this.deal, this.ranges),
    }

    crate::exec::keeps_input_order!();

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let input = self.input.execute(partition, ctx)?;
        let dealer = Dealer {
            deal: self.deal,
            ranges: self.ranges,
            route: Arc::clone(&self.route),
            counts_index: self.counts_index,
            schema: Arc::clone(&self.schema),
            counted: None,
            shape: None,
            next_row: 0,
            rows: 0,
            pad_rows: MetricBuilder::new(&self.metrics).counter("pad_rows", partition),
            dropped_rows: MetricBuilder::new(&self.metrics)
                .counter("dropped_rows", partition),
            baseline: BaselineMetrics::new(&self.metrics, partition),
        };
        let state = (input, Some(dealer));
        let output = futures::stream::unfold(state, |(mut input, dealer)| async move {
            let mut dealer = dealer?;
            match input.next().await {
                Some(batch) => {
                    let dealt = batch.and_then(|batch| dealer.deal(&batch));
                    Some((dealt, (input, Some(dealer))))
                }
                None => match dealer.finish() {
                    Ok(()) => None,
                    Err(e) => Some((Err(e), (input, None))),
                },
            }
        })
        // A batch may hold only count rows: nothing to send on.
        .filter(|batch| {
            futures::future::ready(!matches!(batch, Ok(b) if b.num_rows() == 0))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            output,
        )))
    }

    crate::exec::metrics_of_field!();
}

/// The state of one [`DealExec`] partition.
struct Dealer {
    deal: Deal,
    ranges: usize,
    route: Arc<Vec<u64>>,
    counts_index: usize,
    schema: SchemaRef,
    /// This task's range and the summed counts of every range, from the
    /// count rows.
    counted: Option<(usize, Vec<u64>)>,
    /// The epoch's shape, once the first data row arrives (every count row
    /// came before it).
    shape: Option<DealShape>,
    /// Row number of the next data row.
    next_row: u64,
    /// Data rows seen.
    rows: u64,
    pad_rows: Count,
    dropped_rows: Count,
    baseline: BaselineMetrics,
}

impl Dealer {
    fn error(&self, what: impl fmt::Display) -> DataFusionError {
        internal_datafusion_err!("DealExec: {what}")
    }

    /// Adds count rows `[0, n)` of `batch`.
    fn add_counts(&mut self, batch: &RecordBatch, n: usize) -> Result<()> {
        let payloads = batch.column(self.counts_index).as_binary::<i32>();
        for row in 0..n {
            let (range, counts) = decode_counts(payloads.value(row), self.ranges)
                .ok_or_else(|| self.error("a malformed count row"))?;
            match &mut self.counted {
                None => self.counted = Some((range, counts)),
                Some((seen, totals)) if *seen == range => {
                    totals.iter_mut().zip(counts).for_each(|(t, c)| *t += c);
                }
                Some((seen, _)) => {
                    let seen = *seen;
                    return Err(self.error(format!(
                        "count rows of ranges {seen} and {range} reached one task: the \
                         range exchange under it was changed after planning"
                    )));
                }
            }
        }
        Ok(())
    }

    /// `batch`'s data rows with their rank partitions' routes, and the pad
    /// copies after them.
    fn deal(&mut self, batch: &RecordBatch) -> Result<RecordBatch> {
        let payloads = batch.column(self.counts_index);
        // Count rows come first in a range (see the module docs).
        let count_rows = (0..batch.num_rows())
            .take_while(|&row| payloads.is_valid(row))
            .count();
        // A count row after a data row, in this batch or after an earlier one.
        if payloads.null_count() != batch.num_rows() - count_rows
            || (count_rows > 0 && self.shape.is_some())
        {
            return Err(self.error(
                "a count row after a data row: a row's shuffle key equals its range's \
                 first key (probability 2^-64 per row); this epoch cannot be dealt on the \
                 executors: run it with another seed",
            ));
        }
        self.add_counts(batch, count_rows)?;
        let data_rows = batch.num_rows() - count_rows;
        if data_rows == 0 {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let Some((range, totals)) = &self.counted else {
            return Err(self.error("data rows without count rows before them"));
        };
        let range = *range;
        let shape = match &self.shape {
            Some(shape) => shape,
            None => {
                // The first data row: every count row came before it.
                self.next_row = totals[..range].iter().sum();
                let total = totals.iter().sum();
                self.shape
                    .insert(DealShape::new(self.deal, self.ranges, total))
            }
        };
        let mut main_rows = UInt32Builder::with_capacity(data_rows);
        let mut main_routes = UInt64Builder::with_capacity(data_rows);
        let mut pad_rows = UInt32Builder::new();
        let mut pad_routes = UInt64Builder::new();
        for row in count_rows..batch.num_rows() {
            let g = self.next_row;
            self.next_row += 1;
            match shape.partition(range, g) {
                Some(partition) => {
                    main_rows.append_value(row as u32);
                    main_routes.append_value(self.route[partition]);
                }
                None => self.dropped_rows.add(1),
            }
            for partition in shape.pad_partitions(g) {
                pad_rows.append_value(row as u32);
                pad_routes.append_value(self.route[partition]);
            }
        }
        self.rows += data_rows as u64;
        let (main_rows, pad_rows) = (main_rows.finish(), pad_rows.finish());
        self.pad_rows.add(pad_rows.len());
        let main = self.with_routes(batch, &main_rows, main_routes.finish())?;
        let output = if pad_rows.is_empty() {
            main
        } else {
            let pads = self.with_routes(batch, &pad_rows, pad_routes.finish())?;
            datafusion::arrow::compute::concat_batches(&self.schema, [&main, &pads])?
        };
        Ok(output.record_output(&self.baseline))
    }

    /// Rows `rows` of `batch` without the counts column, with `routes`.
    fn with_routes(
        &self,
        batch: &RecordBatch,
        rows: &UInt32Array,
        routes: UInt64Array,
    ) -> Result<RecordBatch> {
        let taken = take_record_batch(batch, rows)?;
        let mut columns: Vec<_> = taken
            .columns()
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.counts_index)
            .map(|(_, c)| Arc::clone(c))
            .collect();
        columns.push(Arc::new(routes));
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// Checks that the range held as many rows as its count rows said.
    fn finish(&self) -> Result<()> {
        let expected = match &self.counted {
            Some((range, totals)) => totals[*range],
            None => 0,
        };
        if self.rows != expected {
            return Err(self.error(format!(
                "range {} held {} rows, its count rows said {expected}",
                self.counted.as_ref().map_or(0, |(range, _)| *range),
                self.rows
            )));
        }
        Ok(())
    }
}

/// The final stage of a dealt feed job: partition `j` of the exchange
/// under it holds rank `j mod W`'s rows of one piece (see the module docs);
/// drops the route column and keeps the partitions as they are.
#[derive(Debug)]
pub struct RankShardExec {
    /// A hash exchange on [`RANK_ROUTE_COLUMN`].
    input: Arc<dyn ExecutionPlan>,
    route_index: usize,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl RankShardExec {
    /// Reads `input`'s partitions, whose last column is the route.
    pub fn try_new(input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let input_schema = input.schema();
        let route_index = input_schema.fields().len().saturating_sub(1);
        if input_schema.fields().last().map(|f| f.name().as_str())
            != Some(RANK_ROUTE_COLUMN)
        {
            return internal_err!(
                "RankShardExec needs {RANK_ROUTE_COLUMN} as the last input column"
            );
        }
        let schema = Arc::new(Schema::new_with_metadata(
            input_schema.fields()[..route_index].to_vec(),
            input_schema.metadata().clone(),
        ));
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(
                input.output_partitioning().partition_count(),
            ),
            input.pipeline_behavior(),
            input.boundedness(),
        );
        Ok(Self {
            input,
            route_index,
            schema,
            properties: Arc::new(properties),
        })
    }
}

impl DisplayAs for RankShardExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let partitions = self.properties.partitioning.partition_count();
        crate::exec::fmt_settings(f, t, "RankShardExec", &[("partitions", &partitions)])
    }
}

impl ExecutionPlan for RankShardExec {
    crate::exec::one_input_operator! {
        name: "RankShardExec",
        properties: own,
        rebuild: |_, child| Self::try_new(child),
    }

    crate::exec::keeps_input_order!();

    // Keeps the exchange under it: the distribution rule drops an exchange
    // nothing above requires.
    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::KeyPartitioned(vec![Arc::new(Column::new(
            RANK_ROUTE_COLUMN,
            self.route_index,
        ))])]
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let input = self.input.execute(partition, ctx)?;
        let (schema, route_index) = (Arc::clone(&self.schema), self.route_index);
        let output = input.map(move |batch| {
            let batch = batch?;
            Ok(RecordBatch::try_new(
                Arc::clone(&schema),
                batch.columns()[..route_index].to_vec(),
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            output,
        )))
    }
}

/// Rank `rank`'s row numbers of an epoch split into key ranges of
/// `sizes` rows, read partition by partition as a rank fetches them.
#[cfg(test)]
pub(crate) fn dealt_rows(deal: Deal, sizes: &[u64], rank: usize) -> Vec<u64> {
    let total = sizes.iter().sum();
    let shape = DealShape::new(deal, sizes.len(), total);
    let mut partitions = vec![vec![]; deal.partitions(sizes.len())];
    let mut g = 0;
    for (range, &size) in sizes.iter().enumerate() {
        for _ in 0..size {
            if let Some(p) = shape.partition(range, g) {
                partitions[p].push(g);
            }
            for p in shape.pad_partitions(g) {
                partitions[p].push(g);
            }
            g += 1;
        }
    }
    partitions
        .into_iter()
        .enumerate()
        .filter(|(j, _)| j % deal.world == rank)
        .flat_map(|(_, rows)| rows)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded batcher's definition, written out row by row.
    fn embedded_rows(deal: Deal, total: u64, rank: usize) -> Vec<u64> {
        let (b, w) = (deal.batch_rows as u64, deal.world as u64);
        let full = total / (b * w) * (b * w);
        let mut rows: Vec<u64> = (0..full)
            .filter(|g| g % (b * w) / b == rank as u64)
            .collect();
        let last = total - full;
        if last > 0 && !deal.drop_last {
            let padded = last.div_ceil(w) * w;
            let head = total.min(w - 1);
            let sequence: Vec<u64> = (full..total)
                .chain((0..padded - last).map(|t| t % head))
                .collect();
            let per_rank = (padded / w) as usize;
            rows.extend(&sequence[rank * per_rank..(rank + 1) * per_rank]);
        }
        rows
    }

    #[test]
    fn each_rank_reads_exactly_its_embedded_rows_in_order() {
        let splits: [&[u64]; 6] = [
            &[40, 0, 33, 27],
            &[0, 0, 0, 100],
            &[1, 0, 0, 0],
            &[2, 1],
            &[5, 5, 5, 5, 5],
            &[0, 0],
        ];
        for sizes in splits {
            let total: u64 = sizes.iter().sum();
            for world in 2..=5 {
                for batch_rows in [1, 3, 8] {
                    for drop_last in [false, true] {
                        let deal = Deal {
                            batch_rows,
                            world,
                            drop_last,
                        };
                        for rank in 0..world {
                            assert_eq!(
                                dealt_rows(deal, sizes, rank),
                                embedded_rows(deal, total, rank),
                                "{sizes:?} {deal:?} rank {rank}"
                            );
                        }
                    }
                }
            }
        }
    }
}
