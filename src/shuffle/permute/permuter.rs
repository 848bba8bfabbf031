//! [`Permuter`]: one execution of a [`super::PermuteExec`] partition: the
//! held batches and their `(key, batch, row)` index, the sorted runs
//! spilled when the reservation is full, and the output in key order
//! (gathered from memory, or merged from the runs).

use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
    UInt64Array,
};
use datafusion::arrow::compute::{
    filter_record_batch, interleave, take, take_record_batch,
};
use datafusion::arrow::datatypes::{DataType, Schema, UInt64Type};
use datafusion::common::internal_err;
use datafusion::common::{internal_datafusion_err, resources_err};
use datafusion::error::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::physical_expr::{LexOrdering, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics::{BaselineMetrics, Count};
use datafusion::physical_plan::sorts::streaming_merge::{
    SortedSpillFile, StreamingMergeBuilder,
};
use datafusion::physical_plan::spill::{SpillManager, get_record_batch_memory_size};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use super::super::SHUFFLE_KEY_COLUMN;
use super::super::copies::{
    CopyCounter, copy_key, order_copies_by_ties, spread_copies_in_index,
};

use super::INDEX_ENTRY_BYTES;
use super::index_sort::{Entry, PARALLEL_SORT_MIN_ENTRIES, sorted_index};
use super::streamed_index::GroupedIndex;

/// The state of one execution.
pub(super) struct Permuter {
    /// Batches held in memory (with the key column).
    held: Vec<RecordBatch>,
    /// (key, held batch, row) of every held row.
    index: Vec<(u64, u32, u32)>,
    /// Key-sorted runs on disk.
    runs: Vec<SortedSpillFile>,
    /// Held batches and index, in the session's pool.
    reservation: MemoryReservation,
    /// Memory set aside, once a run is on disk, for merging the runs
    /// (unspillable, so other partitions' fair shares shrink instead).
    merge_headroom: MemoryReservation,
    /// The pool merges reserve their batches from.
    pool: Arc<dyn MemoryPool>,
    spill_manager: SpillManager,
    /// Rows per output batch and per spilled batch.
    batch_rows: usize,
    /// Position of the key column (= the number of carried columns).
    key_column: usize,
    /// The keys are content keys whose copies still need their own keys,
    /// and these columns tell copies apart ([`CopyIdentity::columns`]);
    /// `None` for the sorter of copies and below a range exchange, whose
    /// keys are final.
    ///
    /// [`CopyIdentity::columns`]: super::super::CopyIdentity
    spread_copies: Option<Range<usize>>,
    /// The columns that order rows of equal keys (copies, before they are
    /// numbered) among themselves; empty where copies are equal in every
    /// column. Runs, merges and the index all follow it (see `copies.rs`).
    ties: Vec<usize>,
    /// Most bytes held before spilling, besides what the pool allows; set
    /// for the sorter of later copies (see `merge_runs`).
    hold_limit: Option<usize>,
    /// Threads that sort the index once all input is held in memory (the
    /// input's tasks are over then); 1 where other partitions still run.
    sort_threads: usize,
    /// Each run's keys, written beside it when copies still need
    /// numbering (see `merge_runs`).
    key_runs: Option<KeyRuns>,
}

/// The keys of a [`Permuter`]'s runs, alone and in each run's order: merged,
/// they tell whether any content key repeats without reading the rows.
struct KeyRuns {
    /// Writes them (its schema is the key column alone).
    manager: SpillManager,
    /// One file per run.
    files: Vec<SortedSpillFile>,
    /// Full passes over the runs made to number copies: 0 when the keys
    /// showed that no row repeats.
    copy_passes: Count,
}

impl Permuter {
    /// An empty permuter of batches shaped like `spill_manager`'s schema.
    pub(super) fn new(
        reservation: MemoryReservation,
        pool: &Arc<dyn MemoryPool>,
        spill_manager: SpillManager,
        batch_rows: usize,
        spread_copies: Option<Range<usize>>,
        ties: Vec<usize>,
    ) -> Self {
        let key_column = spill_manager.schema().fields().len() - 1;
        let merge_headroom = MemoryConsumer::new(format!(
            "{} merge headroom",
            reservation.consumer().name()
        ))
        .register(pool);
        Self {
            held: Vec::new(),
            index: Vec::new(),
            runs: Vec::new(),
            reservation,
            merge_headroom,
            pool: Arc::clone(pool),
            spill_manager,
            batch_rows,
            key_column,
            spread_copies,
            ties,
            hold_limit: None,
            sort_threads: 1,
            key_runs: None,
        }
    }

    /// Writes each run's keys beside it to files of `manager` (whose schema
    /// is the key column alone), so that a merge of the runs looks for
    /// copies in the keys first; counts the full passes in `copy_passes`.
    pub(super) fn with_key_runs(
        mut self,
        manager: SpillManager,
        copy_passes: Count,
    ) -> Self {
        if self.spread_copies.is_some() {
            self.key_runs = Some(KeyRuns {
                manager,
                files: Vec::new(),
                copy_passes,
            });
        }
        self
    }

    /// Sorts the index of a permutation held in memory on up to `threads`
    /// threads.
    pub(super) fn with_sort_threads(mut self, threads: usize) -> Self {
        self.sort_threads = threads.max(1);
        self
    }

    /// Reads all input, then returns the output stream (with the key column
    /// holding every row's final key).
    pub(super) async fn run(
        mut self,
        mut arrivals: SendableRecordBatchStream,
        baseline: BaselineMetrics,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        while let Some(batch) = arrivals.next().await {
            let batch = batch?;
            let _timer = baseline.elapsed_compute().timer();
            self.push(batch)?;
        }
        drop(arrivals);
        if self.runs.is_empty() {
            self.gather_in_memory(baseline)
        } else {
            self.merge_runs(baseline).await
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty() && self.runs.is_empty()
    }

    /// Holds `batch`, first spilling what is held if it does not fit.
    pub(super) fn push(&mut self, batch: RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let bytes = get_record_batch_memory_size(&batch) + rows * INDEX_ENTRY_BYTES;
        let over_limit = self
            .hold_limit
            .is_some_and(|limit| self.reservation.size() + bytes > limit);
        if over_limit && !self.held.is_empty() {
            self.spill()?;
        }
        if self.reservation.try_grow(bytes).is_err() {
            if self.held.is_empty() {
                return resources_err!(
                    "SHUFFLE: one batch of {rows} rows needs {bytes} bytes, more than the \
                     memory limit leaves; raise --memory-limit"
                );
            }
            self.spill()?;
            self.reservation.try_grow(bytes)?;
        }
        if self.held.len() >= u32::MAX as usize {
            return resources_err!("SHUFFLE: more than 4 billion batches held in memory");
        }
        if batch
            .column(self.key_column)
            .as_primitive_opt::<UInt64Type>()
            .is_none()
        {
            return internal_err!("{SHUFFLE_KEY_COLUMN} is not UInt64");
        }
        self.held.push(batch);
        Ok(())
    }

    /// Builds the index of everything held, sorted by key on up to
    /// `threads` threads (see `index_sort.rs`). It is built once, at its
    /// exact size, from the held key columns (growing it batch by batch
    /// would briefly need three times its size when it reallocates). Equal
    /// keys (copies of one row) are then ordered by the tie columns; without
    /// any they stay in arrival order, which cannot be seen in the output
    /// (the copies are equal in every column).
    pub(super) fn build_index(&mut self, threads: usize) -> Result<()> {
        let mut index = sorted_index(&self.held, self.key_column, threads);
        order_copies_by_ties(&self.held, &mut index, &self.ties)?;
        self.index = index;
        Ok(())
    }

    /// Output batch number `chunk`: the content columns of that slice of the
    /// index, plus the index's keys as the key column when `with_key`.
    pub(super) fn gather(&self, chunk: usize, with_key: bool) -> Result<RecordBatch> {
        let start = chunk * self.batch_rows;
        let end = (start + self.batch_rows).min(self.index.len());
        self.gather_entries(&self.index[start..end], with_key)
    }

    /// The rows of `entries`, in their order, plus their keys as the key
    /// column when `with_key`.
    fn gather_entries(&self, entries: &[Entry], with_key: bool) -> Result<RecordBatch> {
        let indices: Vec<(usize, usize)> = entries
            .iter()
            .map(|&(_, batch, row)| (batch as usize, row as usize))
            .collect();
        let mut columns = (0..self.key_column)
            .map(|column| {
                let arrays: Vec<&dyn Array> = self
                    .held
                    .iter()
                    .map(|b| b.column(column).as_ref())
                    .collect();
                interleave(&arrays, &indices)
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
        let schema = if with_key {
            columns.push(Arc::new(UInt64Array::from_iter_values(
                entries.iter().map(|e| e.0),
            )));
            Arc::clone(self.spill_manager.schema())
        } else {
            let fields = self.spill_manager.schema().fields();
            Arc::new(Schema::new(fields[..self.key_column].to_vec()))
        };
        let options = RecordBatchOptions::new().with_row_count(Some(entries.len()));
        Ok(RecordBatch::try_new_with_options(
            schema, columns, &options,
        )?)
    }

    /// Writes everything held as one run sorted by the held keys, and frees it.
    pub(super) fn spill(&mut self) -> Result<()> {
        // The other partitions are still reading: one thread.
        self.build_index(1)?;
        let mut file = self
            .spill_manager
            .create_in_progress_file("PermuteExec run")?;
        let mut max_batch_bytes = 0;
        for chunk in 0..self.index.len().div_ceil(self.batch_rows) {
            let batch = self.gather(chunk, true)?;
            max_batch_bytes = max_batch_bytes.max(file.append_batch(&batch)?);
        }
        if let Some(file) = file.finish()? {
            self.runs.push(SortedSpillFile {
                file,
                max_record_batch_memory: max_batch_bytes,
            });
        }
        if let Some(KeyRuns { manager, files, .. }) = &mut self.key_runs {
            let mut file = manager.create_in_progress_file("PermuteExec run keys")?;
            let mut max_batch_bytes = 0;
            for chunk in self.index.chunks(self.batch_rows) {
                let keys =
                    UInt64Array::from_iter_values(chunk.iter().map(|entry| entry.0));
                let batch = RecordBatch::try_new(
                    Arc::clone(manager.schema()),
                    vec![Arc::new(keys)],
                )?;
                max_batch_bytes = max_batch_bytes.max(file.append_batch(&batch)?);
            }
            if let Some(file) = file.finish()? {
                files.push(SortedSpillFile {
                    file,
                    max_record_batch_memory: max_batch_bytes,
                });
            }
        }
        self.held.clear();
        self.index = Vec::new();
        self.reservation.free();
        self.reserve_merge_headroom();
        Ok(())
    }

    /// Sets aside what merging the runs will take: two buffered batches of
    /// each of two runs (the least DataFusion's merge works with), twice when
    /// copies are numbered in a nested merge. Like `SortExec`'s
    /// `sort_spill_reservation_bytes`, this is taken while the memory just
    /// freed by the spill is ours: a partition that fits in memory and holds
    /// its batches until its output is read would otherwise leave another
    /// partition's merge nothing, depending on which ran first. It is best
    /// effort: when the pool cannot give it, the merge asks again and fails
    /// with the pool's error if the memory is still not there.
    pub(super) fn reserve_merge_headroom(&mut self) {
        let largest = self
            .runs
            .iter()
            .map(|run| run.max_record_batch_memory)
            .max()
            .unwrap_or(0);
        let merges = if self.spread_copies.is_some() { 2 } else { 1 };
        let wanted = largest * 4 * merges;
        if wanted > self.merge_headroom.size() {
            let _ = self.merge_headroom.try_resize(wanted);
        }
    }

    /// Everything fit: sort the index, give copies their keys, and stream
    /// gathered batches; held batches are released when the stream ends.
    pub(super) fn gather_in_memory(
        mut self,
        baseline: BaselineMetrics,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        let rows: usize = self.held.iter().map(|b| b.num_rows()).sum();
        if self.sort_threads > 1 && rows >= PARALLEL_SORT_MIN_ENTRIES {
            return self.stream_in_memory(baseline);
        }
        {
            let _timer = baseline.elapsed_compute().timer();
            self.build_index(self.sort_threads)?;
            if let Some(columns) = self.spread_copies.clone()
                && spread_copies_in_index(&self.held, &mut self.index, columns)
            {
                self.index.sort_unstable();
            }
            // The keys are in the index now: drop their column (8 B/row).
            let columns: Vec<usize> = (0..self.key_column).collect();
            for batch in &mut self.held {
                *batch = batch.project(&columns)?;
            }
        }
        let chunks = self.index.len().div_ceil(self.batch_rows);
        let this = Arc::new(self);
        Ok(futures::stream::iter(0..chunks)
            .map(move |chunk| {
                let _timer = baseline.elapsed_compute().timer();
                this.gather(chunk, true)
            })
            .boxed())
    }

    /// Everything fit and the input's cores are free: the index is placed
    /// in key-range groups and checked for copies, and its groups are
    /// sorted one after another on a thread of their own while the output
    /// streams (see `streamed_index.rs`; the same order as
    /// [`Self::gather_in_memory`]'s whole sort).
    fn stream_in_memory(
        mut self,
        baseline: BaselineMetrics,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        let index = {
            let _timer = baseline.elapsed_compute().timer();
            let index = GroupedIndex::build(
                &self.held,
                self.key_column,
                self.sort_threads,
                &self.ties,
                self.spread_copies.clone(),
            )?;
            // The keys are in the index now: drop their column (8 B/row).
            let columns: Vec<usize> = (0..self.key_column).collect();
            for batch in &mut self.held {
                *batch = batch.project(&columns)?;
            }
            index
        };
        let entries = index.stream(self.batch_rows, baseline.elapsed_compute().clone());
        let this = Arc::new(self);
        Ok(futures::stream::try_unfold(entries, move |mut entries| {
            let this = Arc::clone(&this);
            let baseline = baseline.clone();
            async move {
                let batch = entries.next_batch().await?;
                if batch.is_empty() {
                    return Ok(None);
                }
                let _timer = baseline.elapsed_compute().timer();
                Ok(Some((this.gather_entries(&batch, true)?, entries)))
            }
        })
        .boxed())
    }

    /// DataFusion's streaming merge by key of `runs` and `streams`, each
    /// sorted by key, starting with the memory in `reservation` (the merge
    /// grows it as needed and frees it when the stream ends).
    pub(super) fn merge(
        &self,
        runs: Vec<SortedSpillFile>,
        streams: Vec<SendableRecordBatchStream>,
        metrics: BaselineMetrics,
        reservation: MemoryReservation,
    ) -> Result<SendableRecordBatchStream> {
        let schema = Arc::clone(self.spill_manager.schema());
        let key: Arc<dyn PhysicalExpr> =
            Arc::new(Column::new(SHUFFLE_KEY_COLUMN, self.key_column));
        // Equal keys by the tie columns, as every run was written.
        let ties = self.ties.iter().map(|&c| {
            let column: Arc<dyn PhysicalExpr> =
                Arc::new(Column::new(schema.field(c).name(), c));
            PhysicalSortExpr::new_default(column)
        });
        let ordering = LexOrdering::new(
            std::iter::once(PhysicalSortExpr::new_default(key)).chain(ties),
        )
        .ok_or_else(|| internal_datafusion_err!("empty shuffle ordering"))?;
        StreamingMergeBuilder::new()
            .with_sorted_spill_files(runs)
            .with_streams(streams)
            .with_spill_manager(self.spill_manager.clone())
            .with_schema(schema)
            .with_expressions(&ordering)
            .with_metrics(metrics)
            .with_batch_size(self.batch_rows)
            .with_reservation(reservation)
            .build()
    }

    /// Whether any key repeats in the merge of `key_runs`' files (each
    /// sorted): a walk of the keys alone, with the headroom set aside for
    /// merging (it is set aside again after, best effort, as when it was
    /// first).
    async fn keys_repeat(
        &mut self,
        key_runs: KeyRuns,
        baseline: &BaselineMetrics,
    ) -> Result<bool> {
        let KeyRuns { manager, files, .. } = key_runs;
        let key: Arc<dyn PhysicalExpr> = Arc::new(Column::new(SHUFFLE_KEY_COLUMN, 0));
        let ordering = LexOrdering::new([PhysicalSortExpr::new_default(key)])
            .ok_or_else(|| internal_datafusion_err!("empty key ordering"))?;
        let headroom_bytes = self.merge_headroom.size();
        let mut merged = StreamingMergeBuilder::new()
            .with_sorted_spill_files(files)
            .with_streams(vec![])
            .with_spill_manager(manager.clone())
            .with_schema(Arc::clone(manager.schema()))
            .with_expressions(&ordering)
            .with_metrics(baseline.intermediate())
            .with_batch_size(self.batch_rows)
            .with_reservation(self.merge_headroom.take())
            .build()?;
        let mut last = None;
        let mut repeats = false;
        'walk: while let Some(batch) = merged.next().await {
            let batch = batch?;
            let _timer = baseline.elapsed_compute().timer();
            for &key in content_keys(&batch, 0)?.values() {
                if last == Some(key) {
                    repeats = true;
                    break 'walk;
                }
                last = Some(key);
            }
        }
        drop(merged);
        let _ = self.merge_headroom.try_resize(headroom_bytes);
        Ok(repeats)
    }

    /// Some runs are on disk: spill the rest and merge all runs by key.
    ///
    /// With content keys, copies of a row can sit in different runs. Each
    /// run's keys were written beside it, so their merge, 8 bytes a row, is
    /// walked first: when no key repeats, no row has copies and the runs are
    /// merged once, as they are. Otherwise the merge of the runs in
    /// content-key order is walked to number the copies (pass 1): copies
    /// after the first go, with their own keys, to a second sorter. When
    /// there are none (equal keys of different rows) the runs are merged
    /// once more as they are; otherwise the merge of the runs minus those
    /// copies (pass 2, whose content keys are their final keys) is merged
    /// with the sorted copies.
    pub(super) async fn merge_runs(
        mut self,
        baseline: BaselineMetrics,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        if !self.held.is_empty() {
            self.spill()?;
        }
        let runs = std::mem::take(&mut self.runs);
        let Some(copy_columns) = self.spread_copies.clone() else {
            let headroom = self.merge_headroom.take();
            return Ok(self.merge(runs, vec![], baseline, headroom)?.boxed());
        };
        // No content key repeats (the keys of every run, merged, say so, at
        // 8 bytes a row): no row has copies, and every content key is final.
        if let Some(key_runs) = self.key_runs.take()
            && key_runs.files.len() == runs.len()
        {
            let copy_passes = key_runs.copy_passes.clone();
            if !self.keys_repeat(key_runs, &baseline).await? {
                let headroom = self.merge_headroom.take();
                return Ok(self.merge(runs, vec![], baseline, headroom)?.boxed());
            }
            copy_passes.add(1);
        }
        // Everything is on disk: the copies take over the (empty) reservation,
        // so that a fair pool does not split the budget with an idle consumer.
        let reservation = std::mem::replace(
            &mut self.reservation,
            MemoryConsumer::new("PermuteExec runs").register(&self.pool),
        );
        let mut copies = Permuter::new(
            reservation,
            &self.pool,
            self.spill_manager.clone(),
            self.batch_rows,
            None,
            self.ties.clone(),
        );
        // The later copies accumulate while pass 1 merges and the operators
        // above run: a spillable consumer of a fair pool may take all that
        // is left and starve them, so it holds no more than this partition
        // set aside for a merge, and spills beyond.
        copies.hold_limit = Some(self.merge_headroom.size().max(1));
        let mut counter = CopyCounter::new(copy_columns.clone());
        // Pass 1 merges alone, with all the headroom; it is given back to the
        // pool when the pass ends and set aside again at once for pass 2.
        let headroom_bytes = self.merge_headroom.size();
        let headroom = self.merge_headroom.take();
        let mut merged =
            self.merge(reopen(&runs), vec![], baseline.intermediate(), headroom)?;
        while let Some(batch) = merged.next().await {
            let batch = batch?;
            let _timer = baseline.elapsed_compute().timer();
            if let Some(later) = later_copies(&mut counter, &batch, self.key_column)? {
                copies.push(later)?;
            }
        }
        drop(merged);
        // Best effort, as when it was first set aside.
        let _ = self.merge_headroom.try_resize(headroom_bytes);
        if copies.is_empty() {
            let headroom = self.merge_headroom.take();
            return Ok(self.merge(runs, vec![], baseline, headroom)?.boxed());
        }
        // Pass 2 runs two merges at once: the runs' (half the headroom) and
        // the outer one of its first copies with the later copies (the rest,
        // plus what the copies' sorter set aside if it spilled).
        let key_column = self.key_column;
        let mut counter = CopyCounter::new(copy_columns);
        let runs_headroom = self.merge_headroom.split(self.merge_headroom.size() / 2);
        let first_copies = self
            .merge(runs, vec![], baseline.intermediate(), runs_headroom)?
            .map(move |batch| first_copies(&mut counter, &batch?, key_column));
        let first_copies: SendableRecordBatchStream =
            Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(self.spill_manager.schema()),
                first_copies,
            ));
        let streams = vec![first_copies];
        // The runs did not fit in memory, so neither does holding the later
        // copies through the final merge next to the merges' buffers (under
        // a tight budget that failed depending on the other partitions'
        // timing): they go to disk too, and are merged as runs.
        if !copies.held.is_empty() {
            copies.spill()?;
        }
        let copy_runs = std::mem::take(&mut copies.runs);
        let headroom = self.merge_headroom.take();
        // The copies' sorter is done: what it set aside moves over to the
        // merge of its runs (best effort, as when it was set aside).
        let copies_bytes = copies.merge_headroom.size();
        drop(copies);
        let _ = headroom.try_grow(copies_bytes);
        Ok(self.merge(copy_runs, streams, baseline, headroom)?.boxed())
    }
}

/// The runs again, for a second merge; the files stay until the last
/// reference is dropped.
pub(super) fn reopen(runs: &[SortedSpillFile]) -> Vec<SortedSpillFile> {
    runs.iter()
        .map(|run| SortedSpillFile {
            file: Arc::clone(&run.file),
            max_record_batch_memory: run.max_record_batch_memory,
        })
        .collect()
}

/// The rows of `batch` (in content-key order) that are not the first copy of
/// their content, with their [`copy_key`]s in the key column.
pub(super) fn later_copies(
    counter: &mut CopyCounter,
    batch: &RecordBatch,
    key_column: usize,
) -> Result<Option<RecordBatch>> {
    let keys = content_keys(batch, key_column)?;
    let mut rows = Vec::new();
    let mut new_keys = Vec::new();
    for (row, &key) in keys.values().iter().enumerate() {
        let copy = counter.copy_index(batch, row, key);
        if copy > 0 {
            rows.push(row as u32);
            new_keys.push(copy_key(key, copy));
        }
    }
    if rows.is_empty() {
        return Ok(None);
    }
    let taken = take_record_batch(batch, &UInt32Array::from(rows))?;
    // A taken view array still points into (and would be charged for) the
    // whole merged batch's buffers.
    let mut columns = compact_views(&taken.columns()[..key_column]);
    columns.push(Arc::new(UInt64Array::from(new_keys)));
    Ok(Some(RecordBatch::try_new(taken.schema(), columns)?))
}

/// The rows of `batch` (in content-key order) that are the first copy of
/// their content; their content key is their final key.
pub(super) fn first_copies(
    counter: &mut CopyCounter,
    batch: &RecordBatch,
    key_column: usize,
) -> Result<RecordBatch> {
    let keys = content_keys(batch, key_column)?;
    let first: BooleanArray = keys
        .values()
        .iter()
        .enumerate()
        .map(|(row, &key)| Some(counter.copy_index(batch, row, key) == 0))
        .collect();
    Ok(filter_record_batch(batch, &first)?)
}

/// `columns` with string and binary views copied into buffers of their own.
/// Taking or interleaving rows of a view array keeps every buffer the rows
/// came from, and a reservation of the batch pays for all of them.
pub(crate) fn compact_views(columns: &[ArrayRef]) -> Vec<ArrayRef> {
    columns
        .iter()
        .map(|column| match column.data_type() {
            DataType::Utf8View => Arc::new(column.as_string_view().gc()) as ArrayRef,
            DataType::BinaryView => Arc::new(column.as_binary_view().gc()),
            _ => Arc::clone(column),
        })
        .collect()
}

/// `batch` (its views already compacted, [`compact_views`]) as it should be
/// held for long: a column whose buffers have much more room than its
/// values take copied into buffers of its own size. The Parquet reader
/// grows a binary or string column's buffers by doubling, so a batch
/// straight from a scan has on average half as much again allocated as used
/// (W2's 3 KB images: 4.6 KB a row charged for 3.1 KB of values), and a
/// reservation of the batch pays for all of it. Shrinking in place does not
/// help: the allocator (mimalloc) keeps a block that is at least half used
/// where it is, room and all, so only a copy gives the room back. Columns
/// with at most an eighth unused, and those a copy would not shrink (views,
/// dictionaries, and nested columns holding them: `take` keeps their data
/// buffers), are kept as they are. The copy costs a pass over the bytes (at
/// 2M W2 rows held whole, 6.3 s became 10.4 s to the first batch when every
/// batch was copied), so the position shuffle copies only once the pool
/// refuses a batch.
pub(crate) fn fit_batch(batch: RecordBatch) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut indices = None;
    let (schema, columns, _) = batch.into_parts();
    let columns = columns
        .into_iter()
        .map(|column| {
            Ok(if has_room_to_spare(column.as_ref())? {
                let indices = indices
                    .get_or_insert_with(|| UInt32Array::from_iter_values(0..rows as u32));
                take(column.as_ref(), indices, None)?
            } else {
                column
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new_with_options(
        schema,
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

/// Whether [`fit_batch`] copies `column`: more than an eighth of its
/// buffers unused, and a type whose copy by `take` has buffers of its own.
fn has_room_to_spare(column: &dyn Array) -> Result<bool> {
    if !copies_its_buffers(column.data_type()) {
        return Ok(false);
    }
    let used = column.to_data().get_slice_memory_size()?;
    Ok(column.get_buffer_memory_size() > used + used / 8)
}

/// Whether `take` gives a column of this type buffers of its own, sized to
/// its values: not views and dictionaries (their data buffers or values
/// are kept whole), nor anything nesting them. (A view's used size, as
/// `get_slice_memory_size` counts it, is its views alone.)
fn copies_its_buffers(data_type: &DataType) -> bool {
    match data_type {
        DataType::Utf8View
        | DataType::BinaryView
        | DataType::Dictionary(..)
        | DataType::ListView(_)
        | DataType::LargeListView(_)
        | DataType::RunEndEncoded(..)
        | DataType::Union(..)
        | DataType::Map(..) => false,
        DataType::List(item)
        | DataType::LargeList(item)
        | DataType::FixedSizeList(item, _) => copies_its_buffers(item.data_type()),
        DataType::Struct(fields) => {
            fields.iter().all(|f| copies_its_buffers(f.data_type()))
        }
        _ => true,
    }
}

/// What `batch` would take once [`fit_batch`] fitted it, without copying
/// it: the bytes its values use in the columns it would copy, and the
/// buffers of the others.
pub(crate) fn fitted_size(batch: &RecordBatch) -> Result<usize> {
    let mut bytes = 0;
    for column in batch.columns() {
        bytes += if has_room_to_spare(column.as_ref())? {
            column.to_data().get_slice_memory_size()?
        } else {
            column.get_buffer_memory_size()
        };
    }
    Ok(bytes)
}

pub(super) fn content_keys(
    batch: &RecordBatch,
    key_column: usize,
) -> Result<&UInt64Array> {
    batch
        .column(key_column)
        .as_primitive_opt::<UInt64Type>()
        .ok_or_else(|| internal_datafusion_err!("{SHUFFLE_KEY_COLUMN} is not UInt64"))
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::BinaryArray;
    use datafusion::arrow::buffer::{Buffer, OffsetBuffer};
    use datafusion::arrow::datatypes::Field;

    use super::*;

    /// A binary column with twice the room its values take, as the Parquet
    /// reader leaves it when it grows a column's buffer by doubling.
    fn grown_binary(rows: usize, bytes_a_row: usize) -> ArrayRef {
        let mut values = Vec::with_capacity(2 * rows * bytes_a_row);
        values.resize(rows * bytes_a_row, 7u8);
        Arc::new(BinaryArray::new(
            OffsetBuffer::from_lengths(std::iter::repeat_n(bytes_a_row, rows)),
            Buffer::from_vec(values),
            None,
        ))
    }

    #[test]
    fn a_held_batch_is_charged_what_it_holds() -> Result<()> {
        let rows = 1000;
        let bytes_a_row = 3000;
        let schema = Arc::new(Schema::new(vec![Field::new(
            "img",
            DataType::Binary,
            false,
        )]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![grown_binary(rows, bytes_a_row)],
        )?;
        let grown = get_record_batch_memory_size(&batch);
        let foreseen = fitted_size(&batch)?;
        // Fitted even while another batch shares its buffers: copied.
        let fitted = fit_batch(batch.clone())?;
        let held = get_record_batch_memory_size(&fitted);
        assert_eq!(foreseen, held, "fitted_size foresaw another size");
        assert_eq!(fitted_size(&fitted)?, held);
        let data = rows * bytes_a_row + (rows + 1) * 4;
        assert!(
            grown > data * 3 / 2,
            "the column has {grown} for {data} bytes"
        );
        assert!(
            held < data * 21 / 20,
            "{held} charged for {data} bytes held"
        );
        // Views (their values in data buffers the used size does not
        // count) and dictionaries are kept, and foreseen as they are.
        let mut views = datafusion::arrow::array::StringViewBuilder::new();
        for i in 0..rows {
            views.append_value(format!("{i:0>40}"));
        }
        let views: ArrayRef = Arc::new(views.finish());
        let keys = datafusion::arrow::array::Int32Array::from_iter_values(0..rows as i32);
        let dictionary: ArrayRef =
            Arc::new(datafusion::arrow::array::DictionaryArray::new(
                keys,
                grown_binary(rows, bytes_a_row),
            ));
        let kept = RecordBatch::try_from_iter([("v", views), ("d", dictionary)])?;
        let kept_bytes: usize = kept
            .columns()
            .iter()
            .map(|c| c.get_buffer_memory_size())
            .sum();
        assert_eq!(fitted_size(&kept)?, kept_bytes);
        let refitted = fit_batch(kept.clone())?;
        assert_eq!(refitted, kept);
        assert_eq!(
            get_record_batch_memory_size(&refitted),
            get_record_batch_memory_size(&kept)
        );
        // A column with little room is kept as it is.
        let again = fit_batch(fitted.clone())?;
        assert_eq!(
            again.column(0).to_data().buffers()[1].as_ptr(),
            fitted.column(0).to_data().buffers()[1].as_ptr()
        );
        let expected =
            RecordBatch::try_new(schema, vec![grown_binary(rows, bytes_a_row)])?;
        assert_eq!(fitted, expected);
        Ok(())
    }
}
