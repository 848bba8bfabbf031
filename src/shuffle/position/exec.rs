//! [`PositionShuffleExec`]: holds every row with where it lives and emits
//! them in the order of an index permutation (or, when they do not fit,
//! spills them by position range: [`super::spilled`]); see the
//! [module docs](super).

use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Int64Type, Schema, SchemaRef};
use datafusion::common::DataFusionError;
use datafusion::common::runtime::JoinSet;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{
    internal_datafusion_err, internal_err, resources_datafusion_err,
};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::logical_expr::LogicalPlan;
use datafusion::logical_expr::Volatility;
use datafusion::physical_expr::ScalarFunctionExpr;
use datafusion::physical_plan::execution_plan::{EmissionType, reset_plan_states};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, RecordOutput,
    SpillMetrics,
};
use datafusion::physical_plan::spill::get_record_batch_memory_size;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;

use super::super::permute::{fit_batch, fitted_size};
use super::canonical::{CanonicalRows, FileColumn, Run, runs_of};
use super::permutation::IndexPermutation;
use super::ranks::RankedRowGroups;
use super::spilled::{Fitted, MAX_RANGES, Placement, SpilledEpoch, range_size};
use crate::exec::BatchStream;
use crate::shuffle::windowed::{drops_rows, windowable_scan};

/// Emits all rows of its input, without the last two columns (each row's
/// file path and row index in that file), in the order of the
/// [`IndexPermutation`] of `(seed, epoch)` over the rows' canonical ranks.
/// Module docs: the order, memory (and spilling) and what it refuses.
///
/// Metrics: `runs` (held whole), `held_bytes` (what was held, or what was
/// held when the epoch was found not to fit), `ranges` (position ranges read back from
/// spill files; 0 when held whole), `spilled_unheld` (1 when the epoch was
/// known not to fit before a row was read), `judged_early` (1 when its
/// first rows put it at more than twice its room), `counted_by_reading` (1 when a
/// spilled epoch's filtered rows were counted by reading the input whole,
/// for want of the session's count query over the filters' columns) and
/// DataFusion's spill metrics.
#[derive(Debug)]
pub struct PositionShuffleExec {
    /// The rows, then their file (a dictionary of `Utf8`, or `Utf8`) and row
    /// index (`Int64`).
    input: Arc<dyn ExecutionPlan>,
    seed: u64,
    epoch: u64,
    /// The input's schema without the two position columns.
    schema: SchemaRef,
    /// The session and the rows under the shuffle (unshuffled) as planned:
    /// what counts the rows a filter keeps reading only the filters'
    /// columns, when the epoch is spilled. Without it, each row group is
    /// read whole to count them.
    counting: Option<Arc<(SessionState, LogicalPlan)>>,
    /// The epoch whose order the input's rows are stored in (an epoch
    /// cache's, through [`super::StoredOrderExec`]): ranks are then where
    /// the rows come in that order.
    stored: Option<u64>,
    properties: Arc<datafusion::physical_plan::PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PositionShuffleExec {
    /// Shuffles `input`, whose last two columns are each row's file path
    /// and row index (an internal error otherwise).
    pub fn try_new(input: Arc<dyn ExecutionPlan>, seed: u64, epoch: u64) -> Result<Self> {
        let input_schema = input.schema();
        let fields = input_schema.fields();
        let positions_are_last = fields.len() >= 2
            && FileColumn::accepts(fields[fields.len() - 2].data_type())
            && fields[fields.len() - 1].data_type() == &DataType::Int64;
        if !positions_are_last {
            return internal_err!(
                "PositionShuffleExec needs each row's file (Utf8, or a dictionary of Utf8 \
                 with Int32 keys) and row index (Int64) as its input's last columns, got {}",
                crate::exec::column_names(&input_schema)
            );
        }
        let schema = Arc::new(Schema::new_with_metadata(
            fields[..fields.len() - 2].to_vec(),
            input_schema.metadata().clone(),
        ));
        let properties = Arc::new(crate::exec::one_bounded_partition(
            Arc::clone(&schema),
            EmissionType::Final,
        ));
        Ok(Self {
            input,
            seed,
            epoch,
            schema,
            counting: None,
            stored: None,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// With the session and rows query (the rows under the shuffle,
    /// unshuffled) that count a filter's rows if the epoch is spilled.
    pub fn with_counting(mut self, state: SessionState, rows: LogicalPlan) -> Self {
        self.counting = Some(Arc::new((state, rows)));
        self
    }

    /// Shuffles rows stored in the order of epoch `stored` of `seed`
    /// (`input`: a [`super::StoredOrderExec`]) as epoch `epoch` orders the
    /// rows they came from: the epoch cache's later epochs.
    pub fn over_stored_order(
        input: Arc<dyn ExecutionPlan>,
        seed: u64,
        epoch: u64,
        stored: u64,
    ) -> Result<Self> {
        Ok(Self {
            stored: Some(stored),
            ..Self::try_new(input, seed, epoch)?
        })
    }

    /// The permutation of `n` rows: of `(seed, epoch)`, over the stored
    /// order if the rows are stored.
    fn permutation(
        seed: u64,
        epoch: u64,
        stored: Option<u64>,
        n: u64,
    ) -> IndexPermutation {
        match stored {
            Some(stored) => IndexPermutation::over_stored(n, seed, epoch, stored),
            None => IndexPermutation::new(n, seed, epoch),
        }
    }

    /// The same shuffle over `input` (the same rows, other columns): its
    /// seed, epoch and what counts its rows kept.
    pub fn over(&self, input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        Ok(Self {
            counting: self.counting.clone(),
            stored: self.stored,
            ..Self::try_new(input, self.seed, self.epoch)?
        })
    }

    /// What the pool has room for, when the epoch is known not to fit it
    /// before a row is read: a finite pool, an exact row count (no filter)
    /// and every column of a fixed width, whose rows take more than the
    /// pool has free. Then there is nothing to learn by holding rows until
    /// the pool refuses them (a read of up to the limit's worth, dropped).
    fn known_not_to_fit(&self, ctx: &TaskContext) -> Result<Option<Fitted>> {
        let pool = ctx.memory_pool();
        let MemoryLimit::Finite(limit) = pool.memory_limit() else {
            return Ok(None);
        };
        let Some(bytes_a_row) = fixed_row_bytes(&self.schema) else {
            return Ok(None);
        };
        let Some(rows) = exact_rows(&self.input)? else {
            return Ok(None);
        };
        let free = limit.saturating_sub(pool.reserved());
        if rows.saturating_mul(bytes_a_row) <= free {
            return Ok(None);
        }
        Ok(Some(Fitted {
            rows: free / bytes_a_row,
            bytes: free,
        }))
    }

    /// Its input: the rows, then each row's file and row index.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }

    /// The seed and epoch of its order.
    pub fn seed_and_epoch(&self) -> (u64, u64) {
        (self.seed, self.epoch)
    }
}

impl DisplayAs for PositionShuffleExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => {
                write!(f, "seed={}\nepoch={}", self.seed, self.epoch)
            }
            _ => {
                write!(
                    f,
                    "PositionShuffleExec: seed={}, epoch={}",
                    self.seed, self.epoch
                )?;
                match self.stored {
                    Some(stored) => write!(f, ", stored in epoch {stored}'s order"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl ExecutionPlan for PositionShuffleExec {
    crate::exec::one_input_operator! {
        name: "PositionShuffleExec",
        properties: own,
        rebuild: |this, child| this.over(child),
    }

    // All input partitions are read here, in parallel.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    crate::exec::statistics_of_one_input!(rows_passed_through, whole input);

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        crate::exec::only_partition("PositionShuffleExec", partition)?;
        let reservation = Arc::new(
            MemoryConsumer::new("PositionShuffleExec").register(ctx.memory_pool()),
        );
        let held = Arc::new(Mutex::new(Held::default()));
        let overflow = Arc::new(Overflow::default());
        let mut readers = JoinSet::new();
        let columns = self.schema.fields().len();
        // An epoch known not to fit is spilled without trying to hold it.
        let known_not_to_fit = self.known_not_to_fit(&ctx)?;
        let partitions = match known_not_to_fit {
            Some(_) => 0,
            None => self.input.properties().partitioning.partition_count(),
        };
        // Rows in the epoch, when the statistics know them (no filter).
        let epoch_rows = exact_rows(&self.input)?;
        let judged_early =
            MetricBuilder::new(&self.metrics).counter("judged_early", partition);
        for input_partition in 0..partitions {
            let stream = self.input.execute(input_partition, Arc::clone(&ctx))?;
            readers.spawn(read_partition(
                stream,
                columns,
                Arc::clone(&held),
                Arc::clone(&reservation),
                Arc::clone(&overflow),
                EpochRoom {
                    epoch_rows,
                    pool: Arc::clone(ctx.memory_pool()),
                    batch_rows: ctx.session_config().batch_size().max(1),
                    judged_early: judged_early.clone(),
                },
            ));
        }
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let runs_metric = MetricBuilder::new(&self.metrics).counter("runs", partition);
        let held_bytes = MetricBuilder::new(&self.metrics).gauge("held_bytes", partition);
        let ranges_metric =
            MetricBuilder::new(&self.metrics).counter("ranges", partition);
        let read_back_bytes =
            MetricBuilder::new(&self.metrics).gauge("read_back_bytes", partition);
        let counted_by_reading =
            MetricBuilder::new(&self.metrics).counter("counted_by_reading", partition);
        let spilled_unheld =
            MetricBuilder::new(&self.metrics).counter("spilled_unheld", partition);
        if known_not_to_fit.is_some() {
            spilled_unheld.add(1);
        }
        let spill_metrics = SpillMetrics::new(&self.metrics, partition);
        let (seed, epoch, stored) = (self.seed, self.epoch, self.stored);
        let input = Arc::clone(&self.input);
        let counting = self.counting.clone();
        let batch_rows = ctx.session_config().batch_size().max(1);
        // Once the input is in, its cores are free to gather.
        let gatherers = ctx.session_config().target_partitions().max(1);
        let schema = Arc::clone(&self.schema);
        let output = futures::stream::once(async move {
            let gather = async {
                while let Some(finished) = readers.join_next().await {
                    finished.map_err(join_error)??;
                }
                let Held { batches, runs, .. } =
                    std::mem::take(&mut *held.lock().map_err(|_| poisoned())?);
                // What was held when the epoch was found not to fit.
                let held_then = Fitted {
                    rows: batches.iter().map(RecordBatch::num_rows).sum(),
                    bytes: reservation.size(),
                };
                let spilled = match known_not_to_fit {
                    Some(fitted) => Some((
                        fitted,
                        "known from the rows and their fixed width".to_string(),
                    )),
                    None => overflow
                        .refused()?
                        .map(|(refused, sized)| (sized.unwrap_or(held_then), refused)),
                };
                if let Some((fitted, refused)) = spilled {
                    drop(batches);
                    drop(runs);
                    reservation.free();
                    held_bytes.set(held_then.bytes);
                    let placement = match stored {
                        // Stored rows are one run, ranked by where they come.
                        Some(stored) => {
                            let rows = exact_rows(&input)?.ok_or_else(|| {
                                internal_datafusion_err!(
                                    "stored rows shuffled by position have no exact count"
                                )
                            })? as u64;
                            Placement::stored(
                                rows,
                                IndexPermutation::over_stored(rows, seed, epoch, stored),
                            )
                        }
                        None => {
                            let scan = windowable_scan(&input).map_err(|why| {
                                resources_datafusion_err!(
                                    "{}; nor can it be spilled by position range: that \
                                     ranks rows by row group, and like SHUFFLE WINDOW, it \
                                     {why}",
                                    does_not_fit(&held_then, &refused)
                                )
                            })?;
                            // Spilled, rows are read twice (placed, then
                            // written by position): a filter that keeps
                            // other rows each read would misplace them.
                            if let Some(filter) = volatile_filter(&input)? {
                                return Err(resources_datafusion_err!(
                                    "{}; nor can it be spilled by position range: that \
                                     reads the input twice, and the filter `{filter}` calls \
                                     a volatile function, which keeps other rows each \
                                     read; filter by what the rows hold instead (to sample \
                                     half the rows: `sqlfeed_row_key(42, id) % 2 = 0` over \
                                     a key column, not `random() < 0.5`)",
                                    does_not_fit(&held_then, &refused)
                                ));
                            }
                            let groups = match &counting {
                                Some(counting) => {
                                    let (state, rows) = counting.as_ref();
                                    RankedRowGroups::read_counting_query(
                                        Arc::clone(&input),
                                        scan,
                                        state,
                                        rows,
                                    )
                                    .await?
                                }
                                None => {
                                    if drops_rows(&input)? {
                                        counted_by_reading.add(1);
                                    }
                                    RankedRowGroups::read_by_reading(
                                        Arc::clone(&input),
                                        scan,
                                        &ctx,
                                        gatherers,
                                    )
                                    .await?
                                }
                            };
                            let permutation = IndexPermutation::new(groups.len(), seed, epoch);
                            Placement::of_groups(&groups, permutation)
                        }
                    };
                    // A scan executed again shares the first execution's
                    // queue of files (DataFusion's sibling state), which the
                    // readers left half read: a fresh instance reads them all.
                    let input = reset_plan_states(input)?;
                    return Ok(Output::Spilled(SpilledEpoch::try_new(
                        input,
                        placement,
                        fitted,
                        schema,
                        ctx,
                        spill_metrics,
                    )?));
                }
                let rows = CanonicalRows::try_new(runs)?;
                runs_metric.add(rows.runs());
                held_bytes.set(reservation.size());
                Ok::<_, DataFusionError>(Output::Whole(Arc::new(Gather {
                    permutation: PositionShuffleExec::permutation(
                        seed,
                        epoch,
                        stored,
                        rows.len(),
                    ),
                    rows,
                    batches,
                    batch_rows,
                    schema,
                    _reservation: reservation,
                })))
            };
            match gather.await {
                Ok(Output::Whole(gather)) => gather.stream(gatherers, baseline),
                Ok(Output::Spilled(spilled)) => {
                    spilled.stream(baseline, ranges_metric, read_back_bytes)
                }
                Err(e) => futures::stream::once(async { Err(e) }).boxed(),
            }
        })
        .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            output,
        )))
    }

    crate::exec::metrics_of_field!();
}

/// The rows `plan` gives, when its statistics know them exactly.
fn exact_rows(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<usize>> {
    let statistics =
        StatisticsContext::new().compute(plan.as_ref(), &StatisticsArgs::new())?;
    Ok(match statistics.num_rows {
        Precision::Exact(rows) => Some(rows),
        _ => None,
    })
}

/// What the partitions' readers hold, in arrival order.
#[derive(Debug, Default)]
struct Held {
    batches: Vec<RecordBatch>,
    runs: Vec<Run>,
    /// Rows held, and what they would take fitted ([`fitted_size`]).
    rows: usize,
    fitted_bytes: usize,
    /// Whether the epoch was judged from its first rows.
    judged: bool,
    /// Set when the pool first refused a batch and the held batches were
    /// fitted: every batch is held fitted from then on.
    fitting: bool,
}

impl Held {
    /// Gives back the room the held batches do not use: each is copied to
    /// fit ([`fit_batch`]) and `reservation` shrunk by what that freed. Run
    /// once, when the pool first refuses a batch, so that only an epoch
    /// near the limit pays for the copy; every batch held after it is held
    /// fitted.
    fn fit(&mut self, reservation: &MemoryReservation) -> Result<()> {
        if self.fitting {
            return Ok(());
        }
        self.fitting = true;
        for batch in &mut self.batches {
            let before = get_record_batch_memory_size(batch);
            *batch = fit_batch(batch.clone())?;
            let after = get_record_batch_memory_size(batch);
            reservation.shrink(before.saturating_sub(after).min(reservation.size()));
        }
        Ok(())
    }

    /// The epoch of `epoch_rows` rows fitted, judged from the rows held so
    /// far and `more` (a batch's rows and its bytes fitted,
    /// [`fitted_size`]), scaled to the epoch: its bytes, a row's, and the
    /// room the epoch has (what `reservation` holds and `pool` has free).
    /// `None` where the rows are unknown (a filter) or the pool unlimited.
    fn estimate(
        &self,
        (rows, fitted): (usize, usize),
        epoch_rows: Option<usize>,
        reservation: &MemoryReservation,
        pool: &dyn MemoryPool,
    ) -> Option<(f64, f64, usize)> {
        let (Some(epoch_rows), MemoryLimit::Finite(limit)) =
            (epoch_rows, pool.memory_limit())
        else {
            return None;
        };
        let a_row =
            (self.fitted_bytes + fitted) as f64 / (self.rows + rows).max(1) as f64;
        let room = reservation.size() + limit.saturating_sub(pool.reserved());
        Some((a_row * epoch_rows as f64, a_row, room))
    }

    /// Whether the epoch could be held once fitted (see [`Held::estimate`];
    /// unknown: it may).
    fn would_fit(
        &self,
        more: (usize, usize),
        epoch_rows: Option<usize>,
        reservation: &MemoryReservation,
        pool: &dyn MemoryPool,
    ) -> bool {
        self.estimate(more, epoch_rows, reservation, pool)
            .is_none_or(|(bytes, _, room)| bytes <= room as f64)
    }

    /// Why the epoch cannot be held, judged from its first rows, and what
    /// its spilled ranges are sized by: when its rows fitted would take
    /// more than twice its room (the slack is for rows that differ in size
    /// further on). Then it is spilled without reading up to the limit.
    /// Not judged before a 128th of its rows are held, nor when ranges
    /// sized by these rows would be more than a spilled epoch may have (the
    /// pool's refusal, later, sizes them by more rows).
    fn far_over(
        &self,
        epoch_rows: Option<usize>,
        reservation: &MemoryReservation,
        pool: &dyn MemoryPool,
        batch_rows: usize,
    ) -> Option<(String, Fitted)> {
        let epoch_rows_known = epoch_rows?;
        if self.rows < epoch_rows_known / 128 {
            return None;
        }
        let (bytes, a_row, room) =
            self.estimate((0, 0), epoch_rows, reservation, pool)?;
        if bytes <= 2.0 * room as f64 {
            return None;
        }
        let sized = Fitted {
            rows: (room as f64 / a_row.max(1.0)) as usize,
            bytes: room,
        };
        let limit = match pool.memory_limit() {
            MemoryLimit::Finite(limit) => limit,
            _ => return None,
        };
        let (_, range_rows) = range_size(sized, limit, batch_rows);
        if epoch_rows_known.div_ceil(range_rows as usize) > MAX_RANGES {
            return None;
        }
        Some((
            format!(
                "its first {} rows put the epoch at about {} bytes, more than twice the \
                 {room} bytes there is room for",
                self.rows, bytes as u64
            ),
            sized,
        ))
    }
}

/// What a reader judges the epoch's room by: its rows, when the statistics
/// know them (no filter), and the pool; and the metric counting an epoch
/// spilled on its first rows.
struct EpochRoom {
    epoch_rows: Option<usize>,
    pool: Arc<dyn MemoryPool>,
    /// The session's batch size, which spilled ranges are multiples of.
    batch_rows: usize,
    judged_early: Count,
}

/// Batches held, at least, before the epoch is judged from its first rows
/// ([`Held::far_over`]).
const JUDGED_AFTER_BATCHES: usize = 8;

/// The bytes a row of `schema` takes at least when held, if every column
/// has a fixed width (primitives, and fixed-size lists of them); `None`
/// otherwise.
fn fixed_row_bytes(schema: &Schema) -> Option<usize> {
    let mut bytes = 0;
    for field in schema.fields() {
        bytes += match field.data_type() {
            DataType::FixedSizeList(item, n) => {
                item.data_type().primitive_width()? * usize::try_from(*n).ok()?
            }
            other => other.primitive_width()?,
        };
    }
    (bytes > 0).then_some(bytes)
}

/// What the shuffle gives: the epoch held whole, or spilled by position
/// range.
enum Output {
    Whole(Arc<Gather>),
    Spilled(SpilledEpoch),
}

/// Set by the first reader whose batch the pool refused: the epoch does
/// not fit, and every reader stops.
#[derive(Debug, Default)]
struct Overflow {
    /// Why, and what to size the spilled ranges by when it is not what
    /// was held (an epoch judged from its first rows).
    refused: Mutex<Option<(String, Option<Fitted>)>>,
}

impl Overflow {
    fn refuse(&self, why: String) -> Result<()> {
        self.refuse_sized(why, None)
    }

    fn refuse_sized(&self, why: String, sized: Option<Fitted>) -> Result<()> {
        self.refused
            .lock()
            .map_err(|_| poisoned())?
            .get_or_insert((why, sized));
        Ok(())
    }

    /// The pool's refusal, if it refused.
    fn refused(&self) -> Result<Option<(String, Option<Fitted>)>> {
        Ok(self.refused.lock().map_err(|_| poisoned())?.clone())
    }
}

/// The first filter under `input` whose predicate calls one of
/// DataFusion's volatile functions (`random()`), as it reads. A user's
/// function declared volatile may be so only to stay out of caches; if it
/// does keep other rows on the second read, the spilled ranges say so.
fn volatile_filter(input: &Arc<dyn ExecutionPlan>) -> Result<Option<String>> {
    let mut found = None;
    input.apply(|node| {
        if let Some(filter) = node.downcast_ref::<FilterExec>() {
            let mut volatile = false;
            filter.predicate().apply(|e| {
                if let Some(function) = e.downcast_ref::<ScalarFunctionExpr>()
                    && function.fun().signature().volatility == Volatility::Volatile
                    && sqlfeed_udfs::user::as_user_function(function.fun()).is_none()
                {
                    volatile = true;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
            if volatile {
                found = Some(filter.predicate().to_string());
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(found)
}

/// That the epoch does not fit, with what was held when it was found.
fn does_not_fit(held: &Fitted, refused: &str) -> String {
    format!(
        "SHUFFLE BY POSITION holds the whole epoch in memory, and it does not fit \
         ({refused}; {} rows were held in {} bytes): raise the memory limit \
         (--memory-limit), or use SHUFFLE, which spills to disk, or SHUFFLE WINDOW n, \
         which holds one window",
        held.rows, held.bytes
    )
}

/// Reads one input partition into `held`: each batch without its two
/// position columns, reserved from `reservation`, and cut into runs. A
/// batch the pool refuses ends every reader (see [`Overflow`]): the epoch
/// is then spilled by position range.
async fn read_partition(
    mut stream: BatchStream,
    columns: usize,
    held: Arc<Mutex<Held>>,
    reservation: Arc<MemoryReservation>,
    overflow: Arc<Overflow>,
    room: EpochRoom,
) -> Result<()> {
    let EpochRoom {
        epoch_rows,
        pool,
        batch_rows,
        judged_early,
    } = room;
    let kept: Vec<usize> = (0..columns).collect();
    let mut last_file = None;
    // The epoch can be judged by its rows' fitted size only when its rows
    // are known and the pool is finite; else that size is not counted.
    let judging =
        epoch_rows.is_some() && matches!(pool.memory_limit(), MemoryLimit::Finite(_));
    while let Some(batch) = stream.next().await {
        if overflow.refused()?.is_some() {
            return Ok(());
        }
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        let files = FileColumn::try_new(batch.column(columns).as_ref())?;
        let rows = batch
            .column(columns + 1)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| internal_datafusion_err!("the row column is not Int64"))?;
        let mut rows_only = RecordBatch::try_new_with_options(
            batch.schema().project(&kept).map(Arc::new)?,
            super::super::permute::compact_views(&batch.columns()[..columns]),
            &datafusion::arrow::array::RecordBatchOptions::new()
                .with_row_count(Some(batch.num_rows())),
        )?;
        if held.lock().map_err(|_| poisoned())?.fitting {
            rows_only = fit_batch(rows_only)?;
        }
        let mut bytes = get_record_batch_memory_size(&rows_only);
        let fitted_bytes = if judging { fitted_size(&rows_only)? } else { 0 };
        if let Err(refused) = reservation.try_grow(bytes) {
            // Near the limit: the Parquet reader leaves binary and string
            // columns with up to twice the room their values take (W2's
            // 0.2M rows: 923 MB charged for 612 MB of rows). Give that
            // room back before giving up on holding the epoch, unless the
            // epoch is known not to fit even then.
            {
                let mut held = held.lock().map_err(|_| poisoned())?;
                if !held.fitting
                    && !held.would_fit(
                        (rows_only.num_rows(), fitted_bytes),
                        epoch_rows,
                        &reservation,
                        pool.as_ref(),
                    )
                {
                    return overflow.refuse(refused.to_string());
                }
                held.fit(&reservation)?;
            }
            rows_only = fit_batch(rows_only)?;
            bytes = get_record_batch_memory_size(&rows_only);
            if let Err(e) = reservation.try_grow(bytes) {
                return overflow.refuse(e.to_string());
            }
        }
        let index = {
            let mut held = held.lock().map_err(|_| poisoned())?;
            if held.fitting {
                // Another reader may have started fitting since this batch
                // was looked at: fitted under the lock, none is left out
                // (an already fitted batch is not copied again).
                rows_only = fit_batch(rows_only)?;
                let fitted = get_record_batch_memory_size(&rows_only);
                reservation.shrink(bytes.saturating_sub(fitted).min(reservation.size()));
            }
            held.rows += rows_only.num_rows();
            held.fitted_bytes += fitted_bytes;
            held.batches.push(rows_only);
            if !held.judged && held.batches.len() >= JUDGED_AFTER_BATCHES {
                held.judged = epoch_rows.is_none_or(|rows| held.rows >= rows / 128);
                if let Some((why, sized)) =
                    held.far_over(epoch_rows, &reservation, pool.as_ref(), batch_rows)
                {
                    judged_early.add(1);
                    return overflow.refuse_sized(why, Some(sized));
                }
            }
            held.batches.len() - 1
        };
        let runs = runs_of(&files, rows, index, &mut last_file)?;
        // Runs with holes keep slices of the row indexes: count them once.
        if runs.iter().any(Run::keeps_rows)
            && let Err(e) = reservation.try_grow(rows.get_array_memory_size())
        {
            return overflow.refuse(e.to_string());
        }
        held.lock().map_err(|_| poisoned())?.runs.extend(runs);
    }
    Ok(())
}

fn poisoned() -> DataFusionError {
    internal_datafusion_err!("PositionShuffleExec: a reader panicked while holding rows")
}

fn join_error(e: tokio::task::JoinError) -> DataFusionError {
    match e.try_into_panic() {
        Ok(panic) => crate::exec::panic_error(&panic),
        Err(e) => internal_datafusion_err!("PositionShuffleExec: a reader stopped: {e}"),
    }
}

/// The output: `batch_rows` positions of the permutation at a time, each
/// row gathered from where it is held.
struct Gather {
    permutation: IndexPermutation,
    rows: CanonicalRows,
    batches: Vec<RecordBatch>,
    batch_rows: usize,
    schema: SchemaRef,
    /// The held rows' memory, freed with the output.
    _reservation: Arc<MemoryReservation>,
}

/// Output batches each gatherer may have ready ahead of the consumer.
const READY_AHEAD: usize = 2;

impl Gather {
    /// Output batches in all.
    fn output_batches(&self) -> u64 {
        self.permutation.len().div_ceil(self.batch_rows as u64)
    }

    /// Output batch number `number`.
    fn batch(&self, number: u64) -> Result<RecordBatch> {
        let start = number * self.batch_rows as u64;
        let end = (start + self.batch_rows as u64).min(self.permutation.len());
        let indices: Vec<(usize, usize)> = (start..end)
            .map(|position| self.rows.locate(self.permutation.at(position)))
            .collect();
        let batches: Vec<&RecordBatch> = self.batches.iter().collect();
        let batch = crate::exec::batches::interleave_rows(&batches, &indices)?;
        Ok(batch.with_schema(Arc::clone(&self.schema))?)
    }

    /// The output in order, gathered by `gatherers` threads: thread `w`
    /// gathers batches `w`, `w + gatherers`, … up to [`READY_AHEAD`] ahead
    /// of the consumer, which takes them in turn. A gather is one random
    /// read per row and column; the threads overlap those waits.
    fn stream(
        self: Arc<Self>,
        gatherers: usize,
        baseline: BaselineMetrics,
    ) -> futures::stream::BoxStream<'static, Result<RecordBatch>> {
        let total = self.output_batches();
        let gatherers = (gatherers as u64).clamp(1, total.max(1));
        let mut receivers = Vec::with_capacity(gatherers as usize);
        let mut threads = Vec::with_capacity(gatherers as usize);
        for first in 0..gatherers {
            let (tx, rx) = tokio::sync::mpsc::channel(READY_AHEAD);
            let gather = Arc::clone(&self);
            let time = baseline.elapsed_compute().clone();
            let work = move || {
                for number in (first..total).step_by(gatherers as usize) {
                    let batch = {
                        let _timer = time.timer();
                        // A panic (a dependency's) reaches the consumer as
                        // this batch's error, with its message.
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            gather.batch(number)
                        }))
                        .unwrap_or_else(|panic| Err(crate::exec::panic_error(&panic)))
                    };
                    let failed = batch.is_err();
                    // The consumer went away, or this was the error it gets.
                    if tx.blocking_send(batch).is_err() || failed {
                        return;
                    }
                }
            };
            // A dropped handle: the thread ends at its next send once the
            // output is dropped.
            threads.push(tokio::task::spawn_blocking(work));
            receivers.push(rx);
        }
        futures::stream::unfold(
            (receivers, threads, 0u64, baseline),
            move |(mut receivers, threads, number, baseline)| async move {
                if number >= total {
                    // The output ends once every gatherer has let go of the
                    // held rows, so their reservation is back in the pool
                    // when the consumer sees the end (a next epoch sized by
                    // what is free sees it free). Its receiver gone, a
                    // gatherer blocked on a send ends.
                    drop(receivers);
                    for thread in threads {
                        let _ = thread.await;
                    }
                    return None;
                }
                let gatherer = (number % receivers.len() as u64) as usize;
                let batch = match receivers[gatherer].recv().await {
                    Some(batch) => batch.map(|b| b.record_output(&baseline)),
                    None => Err(internal_datafusion_err!(
                        "PositionShuffleExec: a gatherer stopped before batch {number}"
                    )),
                };
                // After an error, nothing more.
                let next = if batch.is_err() { total } else { number + 1 };
                Some((batch, (receivers, threads, next, baseline)))
            },
        )
        .boxed()
    }
}
