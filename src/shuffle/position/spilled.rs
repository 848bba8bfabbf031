//! A `SHUFFLE BY POSITION` epoch that does not fit the memory budget,
//! spilled by position range: the same order, in bounded memory, for one
//! write and one read of the rows on disk.
//!
//! ```text
//!  PositionShuffleExec: the whole epoch held ── the pool refuses ──► here
//!    (the rows held so far are dropped; what they held sizes the ranges)
//!
//!  row groups in rank order, rows per row group (the footers, or each row
//!  group read and counted when a filter drops rows)  ── RankedRowGroups
//!
//!  input partitions p0 … pN-1 (scan, filters, functions below the shuffle),
//!  one task each; per row:
//!    (file, row index) ──► row group g ──► rank r (g's first rank, plus
//!       the row's offset in g: its row index, or under a filter the rows
//!       of g kept before it)
//!    position p = π⁻¹(r) ──► range p / R, slot p % R
//!    rows of a batch by range, with their slots ──► the range's buffer
//!       ──(full)──► the range's spill file (DataFusion's SpillManager)
//!
//!  output: range 0, 1, … in turn: its file read back, each row put in its
//!  slot, batches of `batch_size` gathered with `interleave`; the next
//!  range is read while the current one is read out.
//! ```
//!
//! # The order
//! Exactly the order of the epoch held whole: position `p` holds the row of
//! rank `π(p)`, ranks being the same (file path, row index) ranks counted
//! after the filters. Only where the rows wait changes, so batches, resumes
//! and digests are the same under any memory limit.
//!
//! # Memory
//! `R` (positions a range) is sized so that a range takes a quarter of
//! what fitted before the pool refused, and about a sixth of the pool at
//! most (by the rows' average bytes),
//! counting each row's slot and where its position finds it (12 bytes),
//! rounded down to whole batches: the range read out and the range read
//! ahead fit where the epoch did not, and take at most a third of the pool.
//! At most [`MAX_RANGES`] ranges (each an open spill file): an epoch that
//! would need more is an error that says to raise the limit. While the
//! rows are spilled each range buffers a little before its file is written
//! (a share of one range's bytes, at least 64 KiB), reserved from the pool
//! and written early when the pool refuses.
//!
//! The read-back is reserved **once, up front**, when the last row is
//! spilled: the two largest ranges as written ([`ReadBudget`]); each range
//! borrows from it while held and gives back when read out (a range larger
//! than written borrows the rest from the pool, waiting for it as before).
//! So an epoch does not wait for memory once its first batch is out, and a
//! feed's next epoch, started ahead beside it, sizes its own ranges from
//! what is really free: two spilled epochs side by side take about two
//! thirds of the pool (ranges are sized by the rows' average bytes), and
//! neither waits for the other (metric `read_back_bytes`: the bytes
//! reserved up front). Batches read back share their file's
//! buffers, so they are counted once per buffer, not once per batch.
//!
//! # Disk and cost
//! The epoch's rows are written once (in the session's spill folder, as
//! Arrow IPC) and read once; under a filter the rows it keeps are counted
//! first by the query the windowed shuffles count with, which reads only
//! the filters' columns. The files go when the output is
//! dropped. The first batch waits for the whole epoch to be spilled.
//!
//! # What it checks
//! A row group read by two partitions (its rows under a filter could not be
//! ranked) and a range that does not get exactly its rows are errors, never
//! rows out of place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{AsArray, RecordBatch, RecordBatchOptions, UInt32Array};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::runtime::{JoinSet, SpawnedTask};
use datafusion::common::utils::memory::RecordBatchMemoryCounter;
use datafusion::common::{
    DataFusionError, exec_datafusion_err, exec_err, internal_datafusion_err,
    internal_err, resources_datafusion_err,
};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryReservation,
};
use datafusion::execution::spill_file::SpillFile;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, Gauge, RecordOutput, SpillMetrics, Time,
};
use datafusion::physical_plan::spill::{SpillManager, get_record_batch_memory_size};
use futures::StreamExt;
use futures::stream::BoxStream;

pub(super) use super::placement::Placement;
use super::placement::{RowPlacer, claim_group};
use crate::exec::BatchStream;
use crate::shuffle::windowed::drops_rows;

/// What the epoch held when the pool refused more: the measure the ranges
/// are sized by.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fitted {
    pub(super) rows: usize,
    pub(super) bytes: usize,
}

/// The slot column written beside each spilled row.
const SLOT_COLUMN: &str = "__sqlfeed_position_slot";

/// The most ranges an epoch is spilled in: each is a spill file, open until
/// it is read back.
pub(super) const MAX_RANGES: usize = 512;

/// The least a range buffers before it is written.
const LEAST_BUFFER_BYTES: usize = 64 << 10;

/// The bytes and positions of a range of an epoch spilled under a pool of
/// `limit` bytes, sized by what `fitted`, in batches of `batch_rows`. Two
/// ranges are held (one read out, one read ahead), each with where each
/// position's row is: each a quarter of what fitted, and at most a sixth of
/// the pool, so that a feed's next epoch spilled beside this one fits too
/// (two epochs' ranges: a third each). Slots are numbered in u32.
pub(super) fn range_size(
    fitted: Fitted,
    limit: usize,
    batch_rows: usize,
) -> (usize, u64) {
    let batch = batch_rows.max(1) as u64;
    let range_bytes = (fitted.bytes / 4).min(limit / 6);
    // A row read back takes what it took held, plus its slot (4 bytes) and
    // where its position finds it (8).
    let row_bytes = fitted.bytes / fitted.rows.max(1) + 12;
    let range_rows = (range_bytes / row_bytes).min(u32::MAX as usize) as u64;
    (range_bytes, (range_rows / batch * batch).max(batch))
}

/// An epoch by position spilled by position range; see the module docs.
pub(super) struct SpilledEpoch {
    /// The shuffle's input: its rows, then each row's file and row index.
    input: Arc<dyn ExecutionPlan>,
    ranks: Arc<Ranks>,
    /// Positions a range: a multiple of `batch_rows`.
    range_rows: u64,
    ranges: usize,
    batch_rows: usize,
    /// The output's schema: the input's without the position columns.
    schema: SchemaRef,
    spill: SpillManager,
    ctx: Arc<TaskContext>,
    reservation: MemoryReservation,
    /// What the ranges' buffers hold, shared by the readers.
    buffered: Arc<MemoryReservation>,
    buffer_bytes: usize,
}

/// How a row's rank is found from its file and row index.
struct Ranks {
    placement: Arc<Placement>,
    /// Under a filter, a row's offset in its row group is the rows of that
    /// group kept before it: counted as the rows come, each group by the
    /// one reader that reads it.
    counted: bool,
}

/// A range's rows on their way to disk.
#[derive(Default)]
struct RangeSink {
    buffered: Vec<RecordBatch>,
    /// Bytes buffered, and those of them reserved from the pool.
    bytes: usize,
    reserved: usize,
    rows: u64,
    /// What the batches written take in memory: what reading it back
    /// will take.
    written: usize,
    file: Option<SpillWriting>,
}

/// A spill file being written: `Some(batch)` appends it, `None` finishes
/// the file (DataFusion's in-progress spill file, whose type is not
/// public).
type SpillWriting =
    Box<dyn FnMut(Option<&RecordBatch>) -> Result<Option<Arc<dyn SpillFile>>> + Send>;

/// Opens a spill file of `spill`'s schema.
fn open_spill_file(spill: &SpillManager) -> Result<SpillWriting> {
    let mut file = spill.create_in_progress_file("PositionShuffleExec range")?;
    Ok(Box::new(move |batch| match batch {
        Some(batch) => {
            file.append_batch(batch)?;
            Ok(None)
        }
        None => file.finish(),
    }))
}

impl SpilledEpoch {
    /// The spilled epoch of `input`'s rows, placed as `placement` says,
    /// sized by what `fitted`.
    pub(super) fn try_new(
        input: Arc<dyn ExecutionPlan>,
        placement: Placement,
        fitted: Fitted,
        schema: SchemaRef,
        ctx: Arc<TaskContext>,
        spill_metrics: SpillMetrics,
    ) -> Result<Self> {
        let counted = drops_rows(&input)?;
        let batch_rows = ctx.session_config().batch_size().max(1);
        let limit = match ctx.memory_pool().memory_limit() {
            MemoryLimit::Finite(limit) => limit,
            _ => usize::MAX,
        };
        let (range_bytes, range_rows) = range_size(fitted, limit, batch_rows);
        let ranges = placement.permutation.len().div_ceil(range_rows) as usize;
        if ranges > MAX_RANGES {
            return Err(resources_datafusion_err!(
                "SHUFFLE BY POSITION holds the whole epoch in memory, and it does not fit: \
                 {} rows fitted in {} bytes, and spilled by position range the epoch's {} \
                 rows would need {ranges} ranges (more than {MAX_RANGES} open files): raise \
                 the memory limit (--memory-limit), or use SHUFFLE, which spills to disk, or \
                 SHUFFLE WINDOW n, which holds one window",
                fitted.rows,
                fitted.bytes,
                placement.permutation.len()
            ));
        }
        let buffer_bytes = (range_bytes / ranges.max(1)).max(LEAST_BUFFER_BYTES);
        let mut fields = schema.fields().to_vec();
        fields.push(Arc::new(Field::new(SLOT_COLUMN, DataType::UInt32, false)));
        let spilled_schema = Arc::new(Schema::new(fields));
        let reservation = MemoryConsumer::new("PositionShuffleExec spilled ranges")
            .register(ctx.memory_pool());
        let buffered = Arc::new(reservation.new_empty());
        Ok(Self {
            input,
            ranks: Arc::new(Ranks {
                placement: Arc::new(placement),
                counted,
            }),
            range_rows,
            ranges,
            batch_rows,
            schema,
            spill: SpillManager::new(ctx.runtime_env(), spill_metrics, spilled_schema),
            ctx,
            reservation,
            buffered,
            buffer_bytes,
        })
    }

    /// The epoch's batches: every row spilled to its range, then the
    /// ranges read back in turn, the next one while the current one is
    /// read out.
    pub(super) fn stream(
        self,
        baseline: BaselineMetrics,
        ranges_metric: Count,
        read_back_bytes: Gauge,
    ) -> BoxStream<'static, Result<RecordBatch>> {
        let this = Arc::new(self);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Range>>(1);
        let producer = {
            let this = Arc::clone(&this);
            SpawnedTask::spawn(async move {
                let spilled = match this.spill_all().await {
                    Ok(spilled) => spilled,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                let budget = match this.reserve_read_back(&spilled).await {
                    Ok(budget) => {
                        read_back_bytes.set(budget.reservation.size());
                        budget
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                for (k, (file, _)) in spilled.into_iter().enumerate() {
                    // Waits until the range before is taken: two ranges
                    // held at most, the one read out and this one.
                    let Ok(permit) = tx.reserve().await else {
                        return;
                    };
                    let range = this.read_range(k, file, &budget).await;
                    let failed = range.is_err();
                    permit.send(range);
                    if failed {
                        return;
                    }
                }
            })
        };
        let reading = Reading {
            rx,
            _producer: producer,
            ranges: this.ranges,
            received: 0,
            current: None,
            batch_rows: this.batch_rows,
            schema: Arc::clone(&this.schema),
            ranges_metric,
            gathering: baseline.elapsed_compute().clone(),
        };
        futures::stream::unfold(Some(reading), |reading| async move {
            let mut reading = reading?;
            match reading.next().await {
                Some(Ok(batch)) => Some((Ok(batch), Some(reading))),
                // After an error, nothing more.
                Some(Err(e)) => Some((Err(e), None)),
                None => None,
            }
        })
        .map(move |batch| batch.map(|b| b.record_output(&baseline)))
        .boxed()
    }

    /// Reads every input partition (a task each) and spills each row to
    /// its range; the ranges' files, in range order (`None`: no rows),
    /// each with what its rows take in memory.
    async fn spill_all(&self) -> Result<Vec<(Option<Arc<dyn SpillFile>>, usize)>> {
        let sinks: Arc<Vec<Mutex<RangeSink>>> =
            Arc::new((0..self.ranges).map(|_| Mutex::default()).collect());
        // Under a filter: which partition reads each row group.
        let readers_of: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
        let mut readers = JoinSet::new();
        let partitions = self.input.properties().partitioning.partition_count();
        for partition in 0..partitions {
            let stream = self.input.execute(partition, Arc::clone(&self.ctx))?;
            let reader = Reader {
                partition,
                ranks: Arc::clone(&self.ranks),
                range_rows: self.range_rows,
                columns: self.schema.fields().len(),
                sinks: Arc::clone(&sinks),
                readers_of: Arc::clone(&readers_of),
                spill: self.spill.clone(),
                buffered: Arc::clone(&self.buffered),
                buffer_bytes: self.buffer_bytes,
            };
            readers.spawn(reader.run(stream));
        }
        while let Some(finished) = readers.join_next().await {
            finished.map_err(|e| exec_datafusion_err!("spilling by position: {e}"))??;
        }
        let sinks = Arc::try_unwrap(sinks).map_err(|_| {
            internal_datafusion_err!("a spilling reader outlived its task")
        })?;
        let mut files = Vec::with_capacity(sinks.len());
        for (k, sink) in sinks.into_iter().enumerate() {
            let mut sink = sink.into_inner().map_err(|_| poisoned())?;
            flush(&mut sink, &self.spill, &self.buffered)?;
            let expected = self.range_len(k);
            if sink.rows != expected {
                return exec_err!(
                    "SHUFFLE BY POSITION spilled {} rows for positions {}..{}, not {expected}: \
                     the data changed while the epoch was read (a file rewritten, or a \
                     filter that keeps other rows on another read); read the epoch again",
                    sink.rows,
                    k as u64 * self.range_rows,
                    k as u64 * self.range_rows + expected
                );
            }
            let file = match sink.file.take() {
                Some(mut file) => file(None)?,
                None => None,
            };
            files.push((file, sink.written));
        }
        Ok(files)
    }

    /// Positions in range `k`.
    fn range_len(&self, k: usize) -> u64 {
        let start = k as u64 * self.range_rows;
        (start + self.range_rows).min(self.ranks.placement.permutation.len()) - start
    }

    /// The read-back's memory, reserved once before the first range: the
    /// two largest ranges (read out and read ahead), each with where each
    /// position's row is (8 bytes a row). Reserved up front, a feed's next
    /// epoch started beside this one sizes itself from what is really
    /// free, and this one never waits for memory the other holds.
    async fn reserve_read_back(
        &self,
        spilled: &[(Option<Arc<dyn SpillFile>>, usize)],
    ) -> Result<Arc<ReadBudget>> {
        let mut largest = [0usize; 2];
        for (k, (_, bytes)) in spilled.iter().enumerate() {
            let range = bytes + self.range_len(k) as usize * 8;
            if range > largest[0] {
                largest = [range, largest[0]];
            } else if range > largest[1] {
                largest[1] = range;
            }
        }
        let budget = Arc::new(ReadBudget {
            reservation: self.reservation.new_empty(),
            lent: Mutex::new(0),
        });
        let bytes = largest[0] + largest[1];
        grow_waiting(&budget.reservation, bytes)
            .await
            .map_err(|e| {
                resources_datafusion_err!(
                    "SHUFFLE BY POSITION spilled this epoch by position range, as it does \
                     not fit the memory limit, and its two largest ranges ({bytes} bytes, \
                     {} positions each) do not fit either: raise the memory limit \
                     (--memory-limit), or use SHUFFLE WINDOW n. {e}",
                    self.range_rows
                )
            })?;
        Ok(budget)
    }

    /// Range `k` read back from `file`: each row in its slot, its memory
    /// borrowed from `budget`.
    async fn read_range(
        &self,
        k: usize,
        file: Option<Arc<dyn SpillFile>>,
        budget: &Arc<ReadBudget>,
    ) -> Result<Range> {
        let len = self.range_len(k) as usize;
        let does_not_fit = |e| {
            resources_datafusion_err!(
                "SHUFFLE BY POSITION spilled this epoch by position range, as it does not \
                 fit the memory limit, and a range of {len} rows does not fit either: raise \
                 the memory limit (--memory-limit), or use SHUFFLE WINDOW n. {e}"
            )
        };
        // Each position's (piece, row): 8 bytes.
        let mut loan = Loan {
            budget: Arc::clone(budget),
            bytes: 0,
        };
        loan.grow(len * 8).await.map_err(does_not_fit)?;
        let mut rows = Vec::new();
        let mut at = vec![(u32::MAX, 0u32); len];
        if let Some(file) = file {
            let mut stream = self.spill.read_spill_as_stream(file, None)?;
            // The batches read back may share buffers (the file read whole):
            // each buffer counted once.
            let mut counter = RecordBatchMemoryCounter::new();
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                loan.grow(counter.count_batch(&batch))
                    .await
                    .map_err(does_not_fit)?;
                let slots = batch
                    .column(batch.num_columns() - 1)
                    .as_primitive_opt::<datafusion::arrow::datatypes::UInt32Type>()
                    .ok_or_else(|| {
                        internal_datafusion_err!("the slot column is not UInt32")
                    })?;
                let piece = rows.len() as u32;
                for (row, &slot) in slots.values().iter().enumerate() {
                    match at.get_mut(slot as usize) {
                        Some(place) if place.0 == u32::MAX => {
                            *place = (piece, row as u32)
                        }
                        _ => {
                            return internal_err!(
                                "SHUFFLE BY POSITION: slot {slot} of range {k} filled twice \
                                 or out of its {len} positions"
                            );
                        }
                    }
                }
                let kept: Vec<usize> = (0..batch.num_columns() - 1).collect();
                rows.push(batch.project(&kept)?);
            }
        }
        if let Some(slot) = at.iter().position(|place| place.0 == u32::MAX) {
            return internal_err!(
                "SHUFFLE BY POSITION: slot {slot} of range {k} is empty"
            );
        }
        Ok(Range {
            rows,
            at,
            _loan: loan,
        })
    }
}

/// A spilled epoch's read-back memory: reserved once from the pool, lent
/// to each range while it is held.
struct ReadBudget {
    reservation: MemoryReservation,
    /// Bytes lent to the ranges held now.
    lent: Mutex<usize>,
}

/// What one range borrowed from its epoch's [`ReadBudget`], given back
/// when the range is dropped.
struct Loan {
    budget: Arc<ReadBudget>,
    bytes: usize,
}

impl Loan {
    /// Borrows `bytes` more: from the budget while it has them, else from
    /// the pool, which grows the budget (a range larger than its written
    /// batches said).
    async fn grow(&mut self, bytes: usize) -> Result<()> {
        let short = {
            let mut lent = self.budget.lent.lock().map_err(|_| poisoned())?;
            let free = self.budget.reservation.size().saturating_sub(*lent);
            let short = bytes.saturating_sub(free);
            *lent += bytes - short;
            short
        };
        self.bytes += bytes - short;
        if short > 0 {
            grow_waiting(&self.budget.reservation, short).await?;
            *self.budget.lent.lock().map_err(|_| poisoned())? += short;
            self.bytes += short;
        }
        Ok(())
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        if let Ok(mut lent) = self.budget.lent.lock() {
            *lent = lent.saturating_sub(self.bytes);
        }
    }
}

/// One range's rows, read back: `rows` as read, and for each position of
/// the range (in order) the batch and row holding it.
struct Range {
    rows: Vec<RecordBatch>,
    at: Vec<(u32, u32)>,
    _loan: Loan,
}

impl Range {
    /// Its batch `number` of `batch_rows` positions, as `schema`.
    fn batch(
        &self,
        number: usize,
        batch_rows: usize,
        schema: &SchemaRef,
    ) -> Result<RecordBatch> {
        let start = number * batch_rows;
        let end = (start + batch_rows).min(self.at.len());
        let refs: Vec<&RecordBatch> = self.rows.iter().collect();
        let at: Vec<(usize, usize)> = self.at[start..end]
            .iter()
            .map(|&(piece, row)| (piece as usize, row as usize))
            .collect();
        let batch = crate::exec::batches::interleave_rows(&refs, &at)?;
        Ok(batch.with_schema(Arc::clone(schema))?)
    }
}

/// The output's side: ranges as the producer sends them, each range's
/// batches gathered when asked for (the range is held once, until its
/// last batch).
struct Reading {
    rx: tokio::sync::mpsc::Receiver<Result<Range>>,
    /// Aborted with the output.
    _producer: SpawnedTask<()>,
    ranges: usize,
    received: usize,
    /// The range being read out and its next batch.
    current: Option<(Range, usize)>,
    batch_rows: usize,
    schema: SchemaRef,
    ranges_metric: Count,
    /// The output's compute time: gathering each batch from its range.
    gathering: Time,
}

impl Reading {
    async fn next(&mut self) -> Option<Result<RecordBatch>> {
        loop {
            if let Some((range, number)) = &mut self.current {
                if *number * self.batch_rows < range.at.len() {
                    let batch = {
                        let _timer = self.gathering.timer();
                        range.batch(*number, self.batch_rows, &self.schema)
                    };
                    *number += 1;
                    return Some(batch);
                }
                self.current = None;
            }
            if self.received == self.ranges {
                return None;
            }
            match self.rx.recv().await {
                Some(Ok(range)) => {
                    self.received += 1;
                    self.ranges_metric.add(1);
                    self.current = Some((range, 0));
                }
                Some(Err(e)) => return Some(Err(e)),
                // The producer ended before the last range: it panicked.
                None => {
                    return Some(internal_err!(
                        "SHUFFLE BY POSITION: the spilled ranges stopped after {} of {}",
                        self.received,
                        self.ranges
                    ));
                }
            }
        }
    }
}

/// One input partition's reader: places its rows in their ranges.
struct Reader {
    partition: usize,
    ranks: Arc<Ranks>,
    range_rows: u64,
    /// Columns before the two position columns.
    columns: usize,
    sinks: Arc<Vec<Mutex<RangeSink>>>,
    readers_of: Arc<Mutex<HashMap<usize, usize>>>,
    spill: SpillManager,
    buffered: Arc<MemoryReservation>,
    buffer_bytes: usize,
}

impl Reader {
    async fn run(self, mut stream: BatchStream) -> Result<()> {
        let mut placer =
            RowPlacer::new(Arc::clone(&self.ranks.placement), self.ranks.counted);
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let positions = placer.positions(
                batch.column(self.columns).as_ref(),
                batch.column(self.columns + 1).as_ref(),
                |group, path| self.claim(group, path),
            )?;
            // Per range: the batch's rows in it and their slots.
            let mut by_range: HashMap<usize, (Vec<u32>, Vec<u32>)> = HashMap::new();
            for (row, position) in positions.into_iter().enumerate() {
                let range = (position / self.range_rows) as usize;
                let slot = (position % self.range_rows) as u32;
                let (rows, slots) = by_range.entry(range).or_default();
                rows.push(row as u32);
                slots.push(slot);
            }
            // Views compacted as the epoch held whole compacts them: a
            // piece taken from a batch would count the whole batch's data.
            let kept_columns: Vec<usize> = (0..self.columns).collect();
            let rows_only = RecordBatch::try_new_with_options(
                Arc::new(batch.schema().project(&kept_columns)?),
                crate::shuffle::permute::compact_views(&batch.columns()[..self.columns]),
                &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
            )?;
            for (range, (rows, slots)) in by_range {
                let taken = crate::exec::batches::take_rows(
                    &rows_only,
                    &UInt32Array::from(rows),
                )?;
                let mut columns = taken.columns().to_vec();
                columns.push(Arc::new(UInt32Array::from(slots)));
                let piece = RecordBatch::try_new_with_options(
                    Arc::clone(self.spill.schema()),
                    columns,
                    &RecordBatchOptions::new().with_row_count(Some(taken.num_rows())),
                )?;
                self.place(range, piece)?;
            }
        }
        Ok(())
    }

    /// Claims row group `group` for this reader (under a filter a group's
    /// rows must all come through one reader, in order).
    fn claim(&self, group: usize, path: &str) -> Result<()> {
        claim_group(&self.readers_of, self.partition, group, path)
    }

    /// Adds `piece` to range `range`'s buffer, writing the buffer to the
    /// range's file once it is full (or the pool refuses the piece).
    fn place(&self, range: usize, piece: RecordBatch) -> Result<()> {
        let sink = self.sinks.get(range).ok_or_else(|| {
            internal_datafusion_err!("range {range} of a spilled epoch")
        })?;
        let mut sink = sink.lock().map_err(|_| poisoned())?;
        let bytes = get_record_batch_memory_size(&piece);
        sink.rows += piece.num_rows() as u64;
        sink.bytes += bytes;
        sink.buffered.push(piece);
        let refused = self.buffered.try_grow(bytes).is_err();
        if !refused {
            sink.reserved += bytes;
        }
        if refused || sink.bytes >= self.buffer_bytes {
            flush(&mut sink, &self.spill, &self.buffered)?;
        }
        Ok(())
    }
}

/// Writes `sink`'s buffered rows to its file (opened on the first write)
/// and gives back what they reserved from `buffered`.
fn flush(
    sink: &mut RangeSink,
    spill: &SpillManager,
    buffered: &MemoryReservation,
) -> Result<()> {
    if sink.buffered.is_empty() {
        return Ok(());
    }
    let batch = concat_batches(spill.schema(), &sink.buffered)?;
    sink.buffered.clear();
    // Pieces of view columns keep their source batches' whole data
    // buffers: compacted, the batch is what is written and read back (the
    // spill writer would compact it too), and what is counted.
    let batch = RecordBatch::try_new_with_options(
        Arc::clone(batch.schema_ref()),
        crate::shuffle::permute::compact_views(batch.columns()),
        &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?;
    sink.written += get_record_batch_memory_size(&batch);
    buffered.shrink(sink.reserved);
    sink.bytes = 0;
    sink.reserved = 0;
    if sink.file.is_none() {
        sink.file = Some(open_spill_file(spill)?);
    }
    if let Some(write) = sink.file.as_mut() {
        write(Some(&batch))?;
    }
    Ok(())
}

/// How long a range waits for the pool before it says it does not fit.
const POOL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Grows `reservation` by `bytes`, waiting up to [`POOL_WAIT`] for the pool
/// to have room: a feed's next epoch started ahead fills the pool while it
/// tries to hold its epoch whole, and gives it all back once refused.
async fn grow_waiting(reservation: &MemoryReservation, bytes: usize) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        match reservation.try_grow(bytes) {
            Ok(()) => return Ok(()),
            Err(e) if started.elapsed() >= POOL_WAIT => return Err(e),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
        }
    }
}

fn poisoned() -> DataFusionError {
    internal_datafusion_err!("SHUFFLE BY POSITION: a reader panicked while spilling")
}
