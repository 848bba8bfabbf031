//! Fixed batch sizes: each global step is a chunk of `B × W` rows, and
//! rank `r` gets its slice of every chunk.
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

use datafusion::arrow::array::RecordBatch;

use super::EpochStart;
use crate::feed::convert::{BatchRows, memory_of};

/// How [`ShardBatcher`] cuts: `batch_rows` rows per rank and step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shard {
    /// `B`.
    pub(crate) batch_rows: usize,
    /// `r`.
    pub(crate) rank: usize,
    /// `W`.
    pub(crate) world: usize,
    /// Drop the final partial chunk instead of padding it.
    pub(crate) drop_last: bool,
}

/// Cuts fixed batches; see the module docs.
#[derive(Debug)]
pub(crate) struct ShardBatcher {
    /// How it cuts (`batch_rows` and `world` at least 1).
    shard: Shard,
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
    pub(crate) fn new(shard: Shard, epoch: u64, start: EpochStart) -> Self {
        let shard = Shard {
            batch_rows: shard.batch_rows.max(1),
            world: shard.world.max(1),
            ..shard
        };
        let (skip_rows, step) = start.in_chunks(shard.batch_rows * shard.world);
        Self {
            shard,
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
        self.shard.batch_rows * self.shard.world
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
            || (self.step == step + 1 && !self.shard.drop_last && self.chunk_rows > 0)
    }

    /// Adds rows; appends the batches they complete to `out`.
    pub(crate) fn push(&mut self, batch: RecordBatch, out: &mut Vec<BatchRows>) {
        let rows = batch.num_rows();
        if rows == 0 {
            return;
        }
        let want_head = (self.shard.world - 1).saturating_sub(self.head_rows);
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
                let start = self.shard.rank * self.shard.batch_rows;
                out.push(BatchRows {
                    pieces: slice_rows(&self.chunk, start, self.shard.batch_rows),
                    rows: self.shard.batch_rows,
                    epoch: self.epoch,
                    step: self.step,
                    rows_after: before + offset as u64,
                    packed: None,
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
        let steps = if self.shard.drop_last {
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
        memory_of(self.chunk.iter().chain(&self.head))
    }

    /// Ends the epoch: emits this rank's part of the last partial chunk.
    pub(crate) fn finish(&mut self, out: &mut Vec<BatchRows>) {
        let rows = self.chunk_rows;
        if rows == 0 || self.shard.drop_last {
            self.chunk.clear();
            self.chunk_rows = 0;
            return;
        }
        let padded = rows.div_ceil(self.shard.world) * self.shard.world;
        let mut sequence = std::mem::take(&mut self.chunk);
        let mut missing = padded - rows;
        while missing > 0 && self.head_rows > 0 {
            let take = missing.min(self.head_rows);
            sequence.extend(slice_rows(&self.head, 0, take));
            missing -= take;
        }
        let per_rank = padded / self.shard.world;
        out.push(BatchRows {
            pieces: slice_rows(&sequence, self.shard.rank * per_rank, per_rank),
            rows: per_rank,
            epoch: self.epoch,
            step: self.step,
            rows_after: self.seen_rows,
            packed: None,
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
        let mut batcher = ShardBatcher::new(
            Shard {
                batch_rows: b,
                rank: r,
                world: w,
                drop_last: drop,
            },
            0,
            EpochStart::Step(skip),
        );
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
                let mut batcher = ShardBatcher::new(
                    Shard {
                        batch_rows: b,
                        rank: 0,
                        world: w,
                        drop_last: drop,
                    },
                    0,
                    EpochStart::BEGIN,
                );
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
                                span: None,
                            };
                            let rows = crate::shuffle::deal::dealt_rows(deal, sizes, r);
                            let mut alone = ShardBatcher::new(
                                Shard {
                                    batch_rows: b,
                                    rank: 0,
                                    world: 1,
                                    drop_last: false,
                                },
                                0,
                                EpochStart::BEGIN,
                            );
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
        let mut batcher = ShardBatcher::new(
            Shard {
                batch_rows: 100,
                rank: 0,
                world: 2,
                drop_last: false,
            },
            0,
            EpochStart::BEGIN,
        );
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
