//! Cuts the query's row stream into this rank's exact batches.
//!
//! # Definition
//! Rows arrive in the feed's order (the global shuffle order, or the
//! deterministic scan order). Consecutive **chunks** of `B × W` rows (batch
//! size × world size) form the global steps; rank `r` gets rows
//! `[r·B, (r+1)·B)` of each chunk. So every rank reads the same stream, the
//! shards are disjoint, and rank `r`'s batches depend only on the data, never
//! on how fast other ranks consume.
//!
//! The last chunk has `R < B × W` rows:
//! - `drop_last`: it is dropped, so every rank gets `⌊N / (B·W)⌋` batches of
//!   exactly `B` rows;
//! - otherwise it is padded to `R' = ⌈R / W⌉ · W` rows by repeating the
//!   epoch's first rows (at most `W − 1`, like torch's `DistributedSampler`)
//!   and split evenly: every rank gets one more batch of `R' / W` rows. With
//!   `W = 1` that is the plain last partial batch.
//!
//! # Resuming
//! An epoch can start after the first `R` rows of its order, consumed by all
//! ranks together before a checkpoint ([`EpochStart::Rows`]): those rows
//! are skipped without converting them and the chunks are cut from row `R`
//! on, so a checkpoint taken under one world size and batch size resumes
//! under any other — within the epoch no row is fed twice and none is
//! skipped, except the pads or drops the new shape's last chunk needs (the
//! pads are still the epoch's first rows). Resuming at step `k` of the same
//! shape is `R = k·B·W` ([`EpochStart::Step`]). Every batch says how many
//! rows of the order are consumed once its step is (`BatchRows::rows_after`),
//! which is what a checkpoint records.

use std::collections::VecDeque;

use datafusion::arrow::array::RecordBatch;

use super::convert::BatchRows;

/// Where an epoch's batches start (see "Resuming" above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EpochStart {
    /// At step `k` of this feed's shape (what a token budget, whose steps
    /// depend on the rows before them, resumes by).
    Step(u64),
    /// After the first `rows` rows of the epoch's order, consumed by all
    /// ranks together under any shape; the first batch is step
    /// `first_step`.
    Rows {
        /// Rows of the order consumed before.
        rows: u64,
        /// The step number of the first batch.
        first_step: u64,
    },
}

impl EpochStart {
    /// The start of an epoch read from its beginning.
    pub(crate) const BEGIN: EpochStart = EpochStart::Step(0);

    /// Whether the start is a step boundary of fixed chunks of `chunk` rows
    /// (what a dealt cluster job, whose steps are cut on the executors,
    /// can resume at).
    pub(crate) fn on_the_grid(self, chunk: usize) -> bool {
        let (rows, _) = self.in_chunks(chunk);
        rows.is_multiple_of(chunk.max(1) as u64)
    }

    /// Why this start lies beyond the end of `epoch`, which had `steps`
    /// steps on this rank and `rows` rows in its order, if it does. The end
    /// itself (a checkpoint after the last batch) is a valid start of
    /// nothing.
    fn beyond_the_end(self, epoch: u64, steps: u64, rows: u64) -> Option<String> {
        match self {
            EpochStart::Step(step) if step > steps => Some(format!(
                "cannot resume at epoch {epoch} step {step}: the epoch has only {steps} \
                 steps on this rank (resume at a step from 0 to {steps})"
            )),
            EpochStart::Rows { rows: at, .. } if at > rows => Some(format!(
                "cannot resume epoch {epoch} after {at} rows: its order has only {rows} \
                 rows (the data changed since the checkpoint?)"
            )),
            _ => None,
        }
    }

    /// `(rows to skip, first step)` for fixed chunks of `chunk` rows.
    pub(crate) fn in_chunks(self, chunk: usize) -> (u64, u64) {
        match self {
            EpochStart::Step(step) => (step.saturating_mul(chunk as u64), step),
            EpochStart::Rows { rows, first_step } => (rows, first_step),
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct ShardBatcher {
    /// `B`.
    batch_rows: usize,
    /// `r`.
    rank: usize,
    /// `W`.
    world: usize,
    /// Drop the final partial chunk.
    drop_last: bool,
    /// Where the epoch starts, as given (for the end-of-epoch check).
    start: EpochStart,
    /// Rows of the order still to skip before the first chunk (resume).
    skip_rows: u64,
    /// Rows of the epoch's order seen so far, skipped ones included.
    seen_rows: u64,
    /// The epoch (for messages).
    epoch: u64,
    /// Slices of the current chunk.
    chunk: Vec<RecordBatch>,
    /// Rows in `chunk`.
    chunk_rows: usize,
    /// The epoch's first rows (at most `W − 1`), to pad the last chunk.
    head: Vec<RecordBatch>,
    /// Rows in `head`.
    head_rows: usize,
    /// Number of the current chunk (= the next step).
    step: u64,
}

impl ShardBatcher {
    pub(crate) fn new(
        batch_rows: usize,
        rank: usize,
        world: usize,
        drop_last: bool,
        epoch: u64,
        start: EpochStart,
    ) -> Self {
        let (batch_rows, world) = (batch_rows.max(1), world.max(1));
        let (skip_rows, step) = start.in_chunks(batch_rows * world);
        Self {
            batch_rows,
            rank,
            world,
            drop_last,
            start,
            skip_rows,
            seen_rows: 0,
            epoch,
            chunk: vec![],
            chunk_rows: 0,
            head: vec![],
            head_rows: 0,
            step,
        }
    }

    fn chunk_capacity(&self) -> usize {
        self.batch_rows * self.world
    }

    /// Steps seen so far (full chunks, plus the last one after `finish`).
    pub(crate) fn steps(&self) -> u64 {
        self.step
    }

    /// Whether the rows seen so far prove that the epoch has a step after
    /// `step`: a later chunk is complete, or (without `drop_last`) the chunk
    /// after it has a row, which `finish` turns into a padded step.
    pub(crate) fn step_follows(&self, step: u64) -> bool {
        self.step > step + 1
            || (self.step == step + 1 && !self.drop_last && self.chunk_rows > 0)
    }

    /// Adds rows; appends the batches they complete to `out`.
    pub(crate) fn push(&mut self, batch: RecordBatch, out: &mut Vec<BatchRows>) {
        let rows = batch.num_rows();
        if rows == 0 {
            return;
        }
        let want_head = (self.world - 1).saturating_sub(self.head_rows);
        if want_head > 0 {
            let take = want_head.min(rows);
            // A copy: a slice would keep the epoch's whole first record
            // batch alive until the epoch ends, for at most W − 1 rows.
            self.head.push(compact(&batch.slice(0, take)));
            self.head_rows += take;
        }
        let before = self.seen_rows;
        self.seen_rows += rows as u64;
        // Rows consumed before a resume never enter a chunk.
        let skipped = self.skip_rows.min(rows as u64) as usize;
        self.skip_rows -= skipped as u64;
        let mut offset = skipped;
        while offset < rows {
            let take = (self.chunk_capacity() - self.chunk_rows).min(rows - offset);
            self.chunk.push(batch.slice(offset, take));
            self.chunk_rows += take;
            offset += take;
            if self.chunk_rows == self.chunk_capacity() {
                let start = self.rank * self.batch_rows;
                out.push(BatchRows {
                    pieces: slice_rows(&self.chunk, start, self.batch_rows),
                    rows: self.batch_rows,
                    epoch: self.epoch,
                    step: self.step,
                    rows_after: before + offset as u64,
                });
                self.chunk.clear();
                self.chunk_rows = 0;
                self.step += 1;
            }
        }
    }

    /// After [`Self::finish`]: why the resume point lies beyond the epoch's
    /// end, if it does (see [`EpochStart::beyond_the_end`]).
    pub(crate) fn beyond_the_end(&self) -> Option<String> {
        let rows = self.seen_rows;
        let chunk = self.chunk_capacity() as u64;
        let steps = if self.drop_last {
            rows / chunk
        } else {
            rows.div_ceil(chunk)
        };
        self.start.beyond_the_end(self.epoch, steps, rows)
    }

    /// Bytes of input this batcher keeps between calls: the record batches
    /// its chunk's slices keep alive (a slice keeps its whole batch), and the
    /// head.
    pub(crate) fn held_bytes(&self) -> usize {
        self.chunk
            .iter()
            .chain(&self.head)
            .map(RecordBatch::get_array_memory_size)
            .sum()
    }

    /// Ends the epoch: emits this rank's part of the last partial chunk.
    pub(crate) fn finish(&mut self, out: &mut Vec<BatchRows>) {
        let rows = self.chunk_rows;
        if rows == 0 || self.drop_last {
            self.chunk.clear();
            self.chunk_rows = 0;
            return;
        }
        let padded = rows.div_ceil(self.world) * self.world;
        let mut sequence = std::mem::take(&mut self.chunk);
        let mut missing = padded - rows;
        while missing > 0 && self.head_rows > 0 {
            let take = missing.min(self.head_rows);
            sequence.extend(slice_rows(&self.head, 0, take));
            missing -= take;
        }
        let per_rank = padded / self.world;
        out.push(BatchRows {
            pieces: slice_rows(&sequence, self.rank * per_rank, per_rank),
            rows: per_rank,
            epoch: self.epoch,
            step: self.step,
            rows_after: self.seen_rows,
        });
        self.chunk_rows = 0;
        self.step += 1;
    }
}

/// A copy of `batch` in buffers of its own size.
fn compact(batch: &RecordBatch) -> RecordBatch {
    let indices = datafusion::arrow::array::UInt32Array::from_iter_values(
        0..batch.num_rows() as u32,
    );
    // `take` only fails on out-of-range indices, which these are not.
    datafusion::arrow::compute::take_record_batch(batch, &indices)
        .unwrap_or_else(|_| batch.clone())
}

/// Zero-copy slices covering rows `[start, start + len)` of `batches`.
fn slice_rows(batches: &[RecordBatch], start: usize, len: usize) -> Vec<RecordBatch> {
    let mut pieces = vec![];
    let mut skip = start;
    let mut need = len;
    for batch in batches {
        if need == 0 {
            break;
        }
        let rows = batch.num_rows();
        if skip >= rows {
            skip -= rows;
            continue;
        }
        let take = (rows - skip).min(need);
        pieces.push(batch.slice(skip, take));
        need -= take;
        skip = 0;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;

    /// `n` rows with ids 0..n, in record batches of `sizes` (cycled).
    fn stream(n: i64, sizes: &[usize]) -> Vec<RecordBatch> {
        let schema =
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let mut out = vec![];
        let mut next = 0;
        for size in sizes.iter().cycle() {
            if next >= n {
                break;
            }
            let end = (next + *size as i64).min(n);
            let ids = Int64Array::from_iter_values(next..end);
            out.push(
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(ids)]).unwrap(),
            );
            next = end;
        }
        out
    }

    fn ids(batch: &BatchRows) -> Vec<i64> {
        batch
            .pieces
            .iter()
            .flat_map(|p| p.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect()
    }

    fn run(
        n: i64,
        sizes: &[usize],
        b: usize,
        r: usize,
        w: usize,
        drop: bool,
        skip: u64,
    ) -> Vec<Vec<i64>> {
        let mut batcher = ShardBatcher::new(b, r, w, drop, 0, EpochStart::Step(skip));
        let mut out = vec![];
        for batch in stream(n, sizes) {
            batcher.push(batch, &mut out);
        }
        batcher.finish(&mut out);
        for batch in &out {
            assert_eq!(batch.rows, ids(batch).len());
        }
        out.iter().map(ids).collect()
    }

    /// `step_follows` says "a step follows" exactly when a later step is
    /// delivered, and as early as one row (one whole chunk with
    /// `drop_last`) after the step's chunk.
    #[test]
    fn step_follows_is_true_exactly_for_steps_before_the_last() {
        for (n, b, w) in [
            (100, 10, 1),
            (101, 10, 1),
            (99, 10, 3),
            (60, 10, 3),
            (5, 10, 2),
        ] {
            for drop in [false, true] {
                let mut batcher = ShardBatcher::new(b, 0, w, drop, 0, EpochStart::BEGIN);
                let mut out = vec![];
                let mut proven = vec![];
                // One row at a time: the earliest moment each step is proven.
                for row in stream(n, &[1]) {
                    batcher.push(row, &mut out);
                    for step in 0..batcher.steps() {
                        if batcher.step_follows(step) && !proven.contains(&step) {
                            proven.push(step);
                        }
                    }
                }
                batcher.finish(&mut out);
                let steps = out.len() as u64;
                let expected: Vec<u64> = (0..steps.saturating_sub(1)).collect();
                assert_eq!(proven, expected, "n={n} b={b} w={w} drop={drop}");
                assert!(steps == 0 || !batcher.step_follows(steps - 1));
            }
        }
    }

    /// A cluster job dealt on the executors (`crate::shuffle::deal`) hands
    /// rank `r` its rows only; cut by a one-rank batcher they are the
    /// batches this batcher cuts for rank `r` of `W` from the whole stream.
    #[test]
    fn dealt_rows_cut_alone_are_the_ranks_batches() {
        use crate::shuffle::Deal;
        for (n, sizes) in [(100, &[40u64, 0, 33, 27][..]), (1, &[0, 1]), (23, &[23])] {
            for w in 2..=4 {
                for b in [1, 4, 7] {
                    for drop in [false, true] {
                        for r in 0..w {
                            let deal = Deal {
                                batch_rows: b,
                                world: w,
                                drop_last: drop,
                            };
                            let rows = crate::shuffle::deal::dealt_rows(deal, sizes, r);
                            let mut alone =
                                ShardBatcher::new(b, 0, 1, false, 0, EpochStart::BEGIN);
                            let mut out = vec![];
                            for chunk in rows.chunks(3) {
                                let ids: Vec<i64> =
                                    chunk.iter().map(|&g| g as i64).collect();
                                let batch = RecordBatch::try_new(
                                    Arc::new(Schema::new(vec![Field::new(
                                        "id",
                                        DataType::Int64,
                                        false,
                                    )])),
                                    vec![Arc::new(Int64Array::from(ids))],
                                )
                                .expect("batch");
                                alone.push(batch, &mut out);
                            }
                            alone.finish(&mut out);
                            let dealt: Vec<Vec<i64>> = out.iter().map(ids).collect();
                            assert_eq!(
                                dealt,
                                run(n, &[5, 2], b, r, w, drop, 0),
                                "n {n} {sizes:?} {deal:?} rank {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn exact_batches_across_record_batch_boundaries() {
        let batches = run(10, &[3, 1, 4], 4, 0, 1, false, 0);
        assert_eq!(
            batches,
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]
        );
        let batches = run(10, &[7], 4, 0, 1, true, 0);
        assert_eq!(batches, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert!(run(0, &[1], 4, 0, 1, false, 0).is_empty());
    }

    #[test]
    fn shards_are_disjoint_cover_and_equal_in_count() {
        for world in 1..=8usize {
            for n in [0i64, 1, 5, 31, 64, 100, 257] {
                for drop in [false, true] {
                    let shards: Vec<_> = (0..world)
                        .map(|r| run(n, &[7, 13], 8, r, world, drop, 0))
                        .collect();
                    let counts: Vec<usize> = shards.iter().map(Vec::len).collect();
                    assert!(
                        counts.windows(2).all(|w| w[0] == w[1]),
                        "{n} {world} {counts:?}"
                    );
                    let mut seen: Vec<i64> =
                        shards.iter().flatten().flatten().copied().collect();
                    let total = seen.len();
                    seen.sort();
                    seen.dedup();
                    let chunk = 8 * world as i64;
                    if drop {
                        assert_eq!(total, seen.len(), "disjoint");
                        assert_eq!(total as i64, n / chunk * chunk);
                    } else {
                        // Everything is covered; at most W-1 rows repeat.
                        assert_eq!(seen.len() as i64, n);
                        assert!(total - seen.len() < world);
                    }
                }
            }
        }
    }

    #[test]
    fn the_head_is_a_copy_not_the_whole_first_record_batch() {
        let mut batcher = ShardBatcher::new(100, 0, 2, false, 0, EpochStart::BEGIN);
        let big = stream(1000, &[1000]).remove(0);
        let whole = big.get_array_memory_size();
        let mut out = vec![];
        batcher.push(big, &mut out);
        assert_eq!(out.len(), 5);
        drop(out);
        // Only the one head row is left, in buffers of its own.
        assert!(
            batcher.held_bytes() < whole / 10,
            "{} of {whole}",
            batcher.held_bytes()
        );
    }

    #[test]
    fn resume_skips_whole_steps() {
        let all = run(50, &[6], 4, 1, 2, false, 0);
        let resumed = run(50, &[6], 4, 1, 2, false, 3);
        assert_eq!(resumed, all[3..].to_vec());
    }
}

/// Packs rows into variable-size batches of at most `budget` padded tokens.
///
/// # Definition
/// Over the feed's row stream, a batch grows row by row while
/// `rows × longest row` (the padded size) stays within the budget; a row
/// that does not fit closes the batch and starts the next one (a single
/// row longer than the budget is a batch of its own). Global batch `k` goes
/// to rank `k mod W` as its step `⌊k / W⌋`; only complete steps (all `W`
/// ranks have a batch) are emitted, so every rank gets the same number of
/// batches. The last, budget-incomplete batch is dropped with `drop_last`.
#[derive(Debug)]
pub(crate) struct TokenBatcher {
    /// Padded tokens per batch.
    budget: usize,
    /// Index of the variable-length column that is measured.
    column: usize,
    /// Fixed padded length (`pad_to`), if any.
    pad_to: Option<usize>,
    rank: usize,
    world: usize,
    drop_last: bool,
    /// Steps not emitted (resume at a step of this shape).
    skip_steps: u64,
    /// Rows of the order still to skip before packing (resume after rows).
    skip_rows: u64,
    /// Rows skipped that way, plus those of every closed batch: the rows of
    /// the order consumed once the current step is.
    consumed_rows: u64,
    /// Number of the first step after a resume by rows.
    first_step: u64,
    /// Where the epoch starts, as given (for the end-of-epoch check).
    start: EpochStart,
    /// Rows of the epoch's order seen so far, skipped ones included.
    seen_rows: u64,
    epoch: u64,
    /// Pieces of the batch being packed.
    current: Vec<RecordBatch>,
    /// Rows in `current`.
    current_rows: usize,
    /// Longest row in `current`.
    current_longest: usize,
    /// Global batches closed so far.
    closed: u64,
    /// This rank's batch of the step being completed.
    own: Option<BatchRows>,
}

impl TokenBatcher {
    /// Bytes of input kept between calls (the pieces of the open batch and
    /// the step's batches waiting for the other ranks').
    pub(crate) fn held_bytes(&self) -> usize {
        let own = self.own.iter().flat_map(|b| &b.pieces);
        self.current
            .iter()
            .chain(own)
            .map(RecordBatch::get_array_memory_size)
            .sum()
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        budget: usize,
        column: usize,
        pad_to: Option<usize>,
        rank: usize,
        world: usize,
        drop_last: bool,
        epoch: u64,
        start: EpochStart,
    ) -> Self {
        let (skip_steps, skip_rows, first_step) = match start {
            EpochStart::Step(step) => (step, 0, 0),
            EpochStart::Rows { rows, first_step } => (0, rows, first_step),
        };
        Self {
            budget: budget.max(1),
            column,
            pad_to,
            rank,
            world: world.max(1),
            drop_last,
            skip_steps,
            skip_rows,
            consumed_rows: skip_rows,
            first_step,
            start,
            seen_rows: 0,
            epoch,
            current: vec![],
            current_rows: 0,
            current_longest: 0,
            closed: 0,
            own: None,
        }
    }

    /// Complete steps so far.
    pub(crate) fn steps(&self) -> u64 {
        self.first_step + self.closed / self.world as u64
    }

    /// After [`Self::finish`]: why the resume point lies beyond the epoch's
    /// end, if it does (see [`EpochStart::beyond_the_end`]).
    pub(crate) fn beyond_the_end(&self) -> Option<String> {
        self.start
            .beyond_the_end(self.epoch, self.steps(), self.seen_rows)
    }

    fn close(&mut self, out: &mut Vec<BatchRows>) {
        if self.current_rows == 0 {
            return;
        }
        let index = self.closed;
        let step = self.first_step + index / self.world as u64;
        let pieces = std::mem::take(&mut self.current);
        if index % self.world as u64 == self.rank as u64 {
            self.own = Some(BatchRows {
                pieces,
                rows: self.current_rows,
                epoch: self.epoch,
                step,
                rows_after: 0,
            });
        }
        self.consumed_rows += self.current_rows as u64;
        self.current_rows = 0;
        self.current_longest = 0;
        self.closed += 1;
        if self.closed.is_multiple_of(self.world as u64)
            && let Some(mut own) = self.own.take()
            && own.step >= self.skip_steps
        {
            own.rows_after = self.consumed_rows;
            out.push(own);
        }
    }

    pub(crate) fn push(&mut self, batch: RecordBatch, out: &mut Vec<BatchRows>) {
        self.seen_rows += batch.num_rows() as u64;
        // Rows consumed before a resume are not packed.
        let skipped = self.skip_rows.min(batch.num_rows() as u64) as usize;
        self.skip_rows -= skipped as u64;
        let batch = batch.slice(skipped, batch.num_rows() - skipped);
        let array = std::sync::Arc::clone(batch.column(self.column));
        let mut run_start = 0;
        for row in 0..batch.num_rows() {
            let len = match self.pad_to {
                Some(len) => len,
                None => super::convert::value_len(&array, row),
            };
            let longest = self.current_longest.max(len);
            let rows = self.current_rows + (row - run_start) + 1;
            if rows > 1 && rows * longest > self.budget {
                if row > run_start {
                    self.current.push(batch.slice(run_start, row - run_start));
                    self.current_rows += row - run_start;
                }
                run_start = row;
                self.close(out);
                self.current_longest = len;
            } else {
                self.current_longest = longest;
            }
        }
        if batch.num_rows() > run_start {
            self.current
                .push(batch.slice(run_start, batch.num_rows() - run_start));
            self.current_rows += batch.num_rows() - run_start;
        }
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<BatchRows>) {
        if self.drop_last {
            self.current.clear();
            self.current_rows = 0;
        } else {
            self.close(out);
        }
    }
}

/// Length bucketing: sorts each window of rows by the length of a
/// variable-length column, cuts it into chunks of `B × W` rows (one global
/// step each), and emits the full chunks in a seeded random order (the
/// window's partial tail, its longest rows, last). Batches then hold rows of
/// similar length, which cuts padding, while the order of batches stays
/// random and a pure function of (seed, epoch, data).
///
/// # Memory
/// One window of input rows, plus the rest of the input batch that overflowed
/// it, plus the one chunk being emitted: chunks are gathered from the window
/// one at a time ([`LengthBucketer::next_chunk`]), never the whole sorted
/// window at once next to the unsorted one.
#[derive(Debug)]
pub(crate) struct LengthBucketer {
    /// Rows per window (a multiple of `chunk_rows`).
    window_rows: usize,
    /// `B × W`.
    chunk_rows: usize,
    /// Index of the measured column.
    column: usize,
    /// Seed of this epoch's chunk order.
    seed: u64,
    /// The window's rows.
    buffer: Vec<RecordBatch>,
    /// Rows in `buffer`.
    rows: usize,
    /// Input not yet in the window (what overflowed it).
    incoming: VecDeque<RecordBatch>,
    /// The sorted window's chunks still to emit, in emission order, as
    /// (batch, row) positions in `buffer`.
    pending: VecDeque<Vec<(usize, usize)>>,
    /// The input has ended.
    finished: bool,
    /// Windows emitted so far.
    windows: u64,
}

impl LengthBucketer {
    pub(crate) fn new(
        window_chunks: usize,
        chunk_rows: usize,
        column: usize,
        seed: u64,
        epoch: u64,
    ) -> Self {
        Self {
            window_rows: window_chunks.max(1) * chunk_rows.max(1),
            chunk_rows: chunk_rows.max(1),
            column,
            seed: crate::rand::splitmix64(
                seed ^ crate::rand::splitmix64(epoch ^ 0xb0c4e7),
            ),
            buffer: vec![],
            rows: 0,
            incoming: VecDeque::new(),
            pending: VecDeque::new(),
            finished: false,
            windows: 0,
        }
    }

    /// Adds input rows; take the chunks they complete with `next_chunk`.
    pub(crate) fn push(&mut self, batch: RecordBatch) {
        if batch.num_rows() > 0 {
            self.incoming.push_back(batch);
        }
    }

    /// Ends the input: the last, partial window is emitted too.
    pub(crate) fn finish(&mut self) {
        self.finished = true;
    }

    /// Bytes of input this bucketer holds (for the feed's memory budget).
    pub(crate) fn held_bytes(&self) -> usize {
        self.buffer
            .iter()
            .chain(&self.incoming)
            .map(RecordBatch::get_array_memory_size)
            .sum()
    }

    /// The next chunk in emission order, once its window is complete.
    pub(crate) fn next_chunk(
        &mut self,
    ) -> datafusion::error::Result<Option<RecordBatch>> {
        loop {
            if let Some(indices) = self.pending.pop_front() {
                let batches: Vec<&RecordBatch> = self.buffer.iter().collect();
                let chunk = datafusion::arrow::compute::interleave_record_batch(
                    &batches, &indices,
                )?;
                if self.pending.is_empty() {
                    self.buffer.clear();
                    self.rows = 0;
                }
                return Ok(Some(chunk));
            }
            while self.rows < self.window_rows
                && let Some(batch) = self.incoming.pop_front()
            {
                let take = (self.window_rows - self.rows).min(batch.num_rows());
                if take < batch.num_rows() {
                    self.incoming
                        .push_front(batch.slice(take, batch.num_rows() - take));
                }
                self.buffer.push(batch.slice(0, take));
                self.rows += take;
            }
            let window_ready = self.rows == self.window_rows
                || (self.finished && self.incoming.is_empty() && self.rows > 0);
            if !window_ready {
                return Ok(None);
            }
            self.plan_window();
        }
    }

    /// Sorts the window by length and queues its chunks in a seeded order.
    fn plan_window(&mut self) {
        let mut order: Vec<(usize, usize, usize)> = Vec::with_capacity(self.rows);
        for (index, batch) in self.buffer.iter().enumerate() {
            let array = batch.column(self.column);
            for row in 0..batch.num_rows() {
                order.push((super::convert::value_len(array, row), index, row));
            }
        }
        // Stable: equal lengths keep their (already shuffled) order.
        order.sort_by_key(|&(len, _, _)| len);
        let sorted: Vec<(usize, usize)> = order.iter().map(|&(_, b, r)| (b, r)).collect();
        let full = self.rows / self.chunk_rows;
        let mut chunks: Vec<usize> = (0..full).collect();
        let mut rng = crate::rand::SplitMix64::new(
            self.seed ^ crate::rand::splitmix64(self.windows),
        );
        for i in (1..chunks.len()).rev() {
            chunks.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for chunk in chunks {
            let start = chunk * self.chunk_rows;
            self.pending
                .push_back(sorted[start..start + self.chunk_rows].to_vec());
        }
        if full * self.chunk_rows < self.rows {
            self.pending
                .push_back(sorted[full * self.chunk_rows..].to_vec());
        }
        self.windows += 1;
    }
}

#[cfg(test)]
mod token_tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Array, AsArray, ListArray};
    use datafusion::arrow::datatypes::Int32Type;

    use super::*;

    /// Rows whose list length is `lengths[i]` and whose first value is `i`.
    fn rows(lengths: &[usize]) -> RecordBatch {
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
            lengths
                .iter()
                .enumerate()
                .map(|(i, &n)| Some(vec![Some(i as i32); n])),
        );
        RecordBatch::try_from_iter(vec![("t", Arc::new(list) as _)]).unwrap()
    }

    fn firsts(batch: &BatchRows) -> Vec<(i32, usize)> {
        batch
            .pieces
            .iter()
            .flat_map(|p| {
                let list = p.column(0).as_list::<i32>().clone();
                (0..list.len())
                    .map(|i| {
                        let v = list.value(i);
                        let v = v.as_primitive::<Int32Type>();
                        (v.value(0), v.len())
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn token_budget_packs_rows_and_ranks_get_equal_counts() {
        let lengths = [3, 3, 3, 8, 1, 1, 1, 1, 20, 2, 2];
        let mut batcher =
            TokenBatcher::new(10, 0, None, 0, 1, false, 0, EpochStart::BEGIN);
        let mut out = vec![];
        batcher.push(rows(&lengths[..5]), &mut out);
        batcher.push(rows(&lengths[5..]).slice(0, 6), &mut out);
        batcher.finish(&mut out);
        let sizes: Vec<usize> = out.iter().map(|b| b.rows).collect();
        // [3,3,3] = 9 tokens; [8,1] = 16 > 10 so [8]; [1,1,1,1,1]... the
        // longest row sets the padded size.
        for batch in &out {
            let longest = firsts(batch).iter().map(|&(_, n)| n).max().unwrap_or(0);
            assert!(batch.rows == 1 || batch.rows * longest <= 10, "{sizes:?}");
        }
        assert_eq!(sizes.iter().sum::<usize>(), lengths.len());
        // Two ranks: equal counts, disjoint.
        let run = |rank| {
            let mut b =
                TokenBatcher::new(10, 0, None, rank, 2, false, 0, EpochStart::BEGIN);
            let mut out = vec![];
            b.push(rows(&lengths), &mut out);
            b.finish(&mut out);
            out
        };
        let (a, b) = (run(0), run(1));
        assert_eq!(a.len(), b.len());
        assert_eq!(a.len(), sizes.len() / 2);
    }

    #[test]
    fn bucketing_groups_similar_lengths_and_keeps_every_row()
    -> datafusion::error::Result<()> {
        let lengths: Vec<usize> = (0..64).map(|i| (i * 37) % 50 + 1).collect();
        let mut bucketer = LengthBucketer::new(4, 8, 0, 42, 0);
        let mut out = vec![];
        let all = rows(&lengths);
        bucketer.push(all.slice(0, 20));
        bucketer.push(all.slice(20, 30));
        // One chunk at a time: the window's sorted copy is never whole.
        while let Some(chunk) = bucketer.next_chunk()? {
            out.push(chunk);
        }
        assert_eq!(out.len(), 4, "the first window of 32 rows");
        assert!(
            bucketer.held_bytes() > 0,
            "18 rows wait for the next window"
        );
        bucketer.push(all.slice(50, 14));
        bucketer.finish();
        while let Some(chunk) = bucketer.next_chunk()? {
            out.push(chunk);
        }
        assert_eq!(out.len(), 8);
        assert_eq!(bucketer.held_bytes(), 0);
        let mut seen = vec![];
        let mut spans = 0;
        for chunk in &out {
            let list = chunk.column(0).as_list::<i32>();
            let lens: Vec<usize> = (0..list.len()).map(|i| list.value(i).len()).collect();
            spans += lens.iter().max().unwrap() - lens.iter().min().unwrap();
            seen.extend(
                (0..list.len())
                    .map(|i| list.value(i).as_primitive::<Int32Type>().value(0)),
            );
        }
        seen.sort();
        assert_eq!(seen, (0..64).collect::<Vec<_>>());
        // Sorted windows: each chunk spans a small range of lengths.
        assert!(spans < 8 * 20, "{spans}");
        Ok(())
    }
}

/// The batcher a feed uses.
#[derive(Debug)]
pub(crate) enum Batcher {
    /// Fixed batch size.
    Rows(ShardBatcher),
    /// Token budget.
    Tokens(TokenBatcher),
}

impl Batcher {
    pub(crate) fn push(&mut self, batch: RecordBatch, out: &mut Vec<BatchRows>) {
        match self {
            Batcher::Rows(b) => b.push(batch, out),
            Batcher::Tokens(b) => b.push(batch, out),
        }
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<BatchRows>) {
        match self {
            Batcher::Rows(b) => b.finish(out),
            Batcher::Tokens(b) => b.finish(out),
        }
    }

    pub(crate) fn steps(&self) -> u64 {
        match self {
            Batcher::Rows(b) => b.steps(),
            Batcher::Tokens(b) => b.steps(),
        }
    }

    /// After `finish`: why the resume point lies beyond the epoch's end.
    pub(crate) fn beyond_the_end(&self) -> Option<String> {
        match self {
            Batcher::Rows(b) => b.beyond_the_end(),
            Batcher::Tokens(b) => b.beyond_the_end(),
        }
    }

    /// Whether the epoch is known to have a step after `step` (see
    /// [`ShardBatcher::step_follows`]). A token budget's steps depend on
    /// rows not read yet, so it answers only once a later batch is cut.
    pub(crate) fn step_follows(&self, step: u64) -> bool {
        match self {
            Batcher::Rows(b) => b.step_follows(step),
            Batcher::Tokens(_) => false,
        }
    }

    /// Bytes of input held between calls (for the feed's memory budget).
    pub(crate) fn held_bytes(&self) -> usize {
        match self {
            Batcher::Rows(b) => b.held_bytes(),
            Batcher::Tokens(b) => b.held_bytes(),
        }
    }
}
