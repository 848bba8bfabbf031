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
//! # A windowed epoch, one job per window
//! A windowed cluster feed (`SHUFFLE WINDOW`) runs each window as a job of
//! its own (`crate::feed` `window_jobs`). Its rows are a segment of the
//! epoch's order: rows `offset..offset + n` of an epoch of `N`, counted when
//! the epoch is planned ([`EpochSpan`], with the window's own `n`): from the
//! footers, or, when the query filters, from the rows its filters keep per
//! row group, counted once per run (`crate::feed`'s producer). A window
//! job's [`DealShape`] is the epoch's, over epoch row numbers, so a step
//! may start in one window and end in the next, and the last step is cut
//! where it is, whichever window holds it. The pads copy the epoch's first
//! rows, which the first windows' jobs hold: they route the copies into
//! their pad partitions as the epoch's job would, and each rank fetches
//! those while it reads the window but hands them on after the epoch's last
//! window (`crate::session::DeferredPads`), in partition order, which is pad
//! order. A window whose rows are not what was counted (a file changed
//! mid-epoch) fails its job instead of misplacing every later row.
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
use datafusion::common::internal_err;
use datafusion::common::{exec_datafusion_err, internal_datafusion_err};
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
    /// Where the job's rows sit in the epoch when the job is one window of
    /// it (`SHUFFLE WINDOW` on a cluster); `None`: the job is the epoch.
    pub span: Option<EpochSpan>,
}

/// A window job's place in its epoch: its rows are rows `offset..` of an
/// epoch of `rows` rows (counted before the jobs run).
/// Module docs: how a windowed epoch is dealt. The default is a job of no
/// rows in an epoch of none, dealt as an epoch of its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EpochSpan {
    /// The rows of the windows before this one.
    pub offset: u64,
    /// This window's rows.
    pub window_rows: u64,
    /// The epoch's rows, every window's.
    pub rows: u64,
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
                span: (options.deal_epoch_rows > 0).then_some(EpochSpan {
                    offset: options.deal_epoch_offset,
                    window_rows: options.deal_window_rows,
                    rows: options.deal_epoch_rows,
                }),
            })
    }

    /// This deal for the job of one window of the epoch.
    pub fn within(self, span: EpochSpan) -> Self {
        Self {
            span: Some(span),
            ..self
        }
    }

    /// Output partitions of a deal over `ranges` key ranges: `W` per range
    /// and `W` per possible pad (at most `W − 1`).
    pub fn partitions(&self, ranges: usize) -> usize {
        self.world * (ranges + self.world - 1)
    }
}

/// Where the rows of an epoch of `total` rows go; see the module docs. Row
/// numbers `g` are the epoch's (a window job's rows start at its offset).
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
            span,
        } = self.deal;
        let partitions = self.partitions();
        let mut settings: Vec<Setting> = vec![
            ("batch_rows", &batch_rows),
            ("world", &world),
            ("drop_last", &drop_last),
            ("ranges", &self.ranges),
            ("partitions", &partitions),
        ];
        let rows = span.map(|s| (s.offset, s.offset + s.window_rows, s.rows));
        let window = rows.map(|(from, to, of)| format!("rows {from}..{to} of {of}"));
        if let Some(window) = &window {
            settings.push(("window", window));
        }
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
                let before: u64 = totals[..range].iter().sum();
                let total: u64 = totals.iter().sum();
                check_window_rows(self.deal, total)?;
                let (offset, epoch_rows) = match self.deal.span {
                    Some(span) => (span.offset, span.rows),
                    None => (0, total),
                };
                self.next_row = offset + before;
                self.shape
                    .insert(DealShape::new(self.deal, self.ranges, epoch_rows))
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

    /// Checks that the range held as many rows as its count rows said (and
    /// a window job, when this task saw none, as many as its footers).
    fn finish(&self) -> Result<()> {
        if self.shape.is_none() {
            let total = self.counted.as_ref().map_or(0, |(_, t)| t.iter().sum());
            check_window_rows(self.deal, total)?;
        }
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

/// A window job's rows, `total`, against what was counted when its epoch
/// was planned: a window with other rows would misplace every later row of
/// the epoch (a file appended to or rewritten mid-epoch).
fn check_window_rows(deal: Deal, total: u64) -> Result<()> {
    match deal.span {
        Some(span) if span.window_rows != total => Err(exec_datafusion_err!(
            "a window of this epoch (rows {} to {} of {}) holds {total} rows, but {} were \
             counted when the epoch was planned (from the footers, or the rows the filters \
             keep): the files changed during the epoch; start the feed again",
            span.offset,
            span.offset + span.window_rows,
            span.rows,
            span.window_rows
        )),
        _ => Ok(()),
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
    // An epoch is an epoch of one window (its pads then come last).
    dealt_window_rows(deal, &[sizes], rank)
}

/// Rank `rank`'s row numbers of an epoch of windows, each a job split into
/// key ranges of the given sizes, as a windowed feed reads them: each
/// window's data partitions in turn, then every window's pad partitions
/// in partition order.
#[cfg(test)]
pub(crate) fn dealt_window_rows(deal: Deal, windows: &[&[u64]], rank: usize) -> Vec<u64> {
    let total: u64 = windows.iter().flat_map(|sizes| sizes.iter()).sum();
    let mut rows = vec![];
    let mut pads = std::collections::BTreeMap::<usize, Vec<u64>>::new();
    let mut offset = 0;
    for sizes in windows {
        let window_rows: u64 = sizes.iter().sum();
        let span = EpochSpan {
            offset,
            window_rows,
            rows: total,
        };
        let shape = DealShape::new(deal.within(span), sizes.len(), total);
        let mut partitions = vec![vec![]; deal.partitions(sizes.len())];
        let mut g = offset;
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
        let first_pad = sizes.len() * deal.world;
        for (j, dealt) in partitions.into_iter().enumerate() {
            if j % deal.world != rank {
                continue;
            }
            if j < first_pad {
                rows.extend(dealt);
            } else {
                pads.entry(j).or_default().extend(dealt);
            }
        }
        offset += window_rows;
    }
    rows.extend(pads.into_values().flatten());
    rows
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
                            span: None,
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

    #[test]
    fn each_rank_reads_its_embedded_rows_from_an_epoch_dealt_window_by_window() {
        // Windows of 3 ranges each; the last step and its pads may straddle
        // windows, and the epoch's first rows (the pads' source) may lie in
        // several small windows.
        let epochs: [&[&[u64]]; 7] = [
            &[&[40, 0, 33], &[27, 1, 0], &[5, 5, 5]],
            &[&[1, 0, 0], &[0, 1, 0], &[0, 0, 1], &[2, 0, 0]],
            &[&[0, 0, 0], &[3, 4, 5]],
            &[&[7, 0, 2]],
            &[&[1, 1, 1], &[1, 1, 1], &[0, 0, 0]],
            &[&[0, 0, 0], &[0, 0, 0]],
            &[&[10, 9, 8], &[1, 0, 0]],
        ];
        for windows in epochs {
            let total: u64 = windows.iter().flat_map(|w| w.iter()).sum();
            for world in 2..=5 {
                for batch_rows in [1, 3, 8] {
                    for drop_last in [false, true] {
                        let deal = Deal {
                            batch_rows,
                            world,
                            drop_last,
                            span: None,
                        };
                        for rank in 0..world {
                            assert_eq!(
                                dealt_window_rows(deal, windows, rank),
                                embedded_rows(deal, total, rank),
                                "{windows:?} {deal:?} rank {rank}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_window_with_other_rows_than_its_footers_said_fails() {
        let deal = Deal {
            batch_rows: 4,
            world: 2,
            drop_last: false,
            span: Some(EpochSpan {
                offset: 8,
                window_rows: 10,
                rows: 30,
            }),
        };
        assert!(check_window_rows(deal, 10).is_ok());
        let error = check_window_rows(deal, 9).unwrap_err().to_string();
        assert!(
            error.contains("rows 8 to 18 of 30) holds 9 rows")
                && error.contains("but 10 were counted")
                && error.contains("start the feed again"),
            "{error}"
        );
        assert!(check_window_rows(Deal { span: None, ..deal }, 9).is_ok());
    }
}
