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
//! Resuming at step `k` skips the first `k` chunks without converting them.

use datafusion::arrow::array::RecordBatch;

use super::convert::BatchRows;

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
    /// Chunks to skip (resume).
    skip_steps: u64,
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
    /// Index of the current chunk (= the next step).
    step: u64,
}

impl ShardBatcher {
    pub(crate) fn new(
        batch_rows: usize,
        rank: usize,
        world: usize,
        drop_last: bool,
        epoch: u64,
        skip_steps: u64,
    ) -> Self {
        Self {
            batch_rows: batch_rows.max(1),
            rank,
            world: world.max(1),
            drop_last,
            skip_steps,
            epoch,
            chunk: vec![],
            chunk_rows: 0,
            head: vec![],
            head_rows: 0,
            step: 0,
        }
    }

    fn chunk_capacity(&self) -> usize {
        self.batch_rows * self.world
    }

    /// Steps seen so far (full chunks, plus the last one after `finish`).
    pub(crate) fn steps(&self) -> u64 {
        self.step
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
            self.head.push(batch.slice(0, take));
            self.head_rows += take;
        }
        let mut offset = 0;
        while offset < rows {
            let take = (self.chunk_capacity() - self.chunk_rows).min(rows - offset);
            self.chunk.push(batch.slice(offset, take));
            self.chunk_rows += take;
            offset += take;
            if self.chunk_rows == self.chunk_capacity() {
                if self.step >= self.skip_steps {
                    let start = self.rank * self.batch_rows;
                    out.push(BatchRows {
                        pieces: slice_rows(&self.chunk, start, self.batch_rows),
                        rows: self.batch_rows,
                        epoch: self.epoch,
                        step: self.step,
                    });
                }
                self.chunk.clear();
                self.chunk_rows = 0;
                self.step += 1;
            }
        }
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
        if self.step >= self.skip_steps {
            out.push(BatchRows {
                pieces: slice_rows(&sequence, self.rank * per_rank, per_rank),
                rows: per_rank,
                epoch: self.epoch,
                step: self.step,
            });
        }
        self.chunk_rows = 0;
        self.step += 1;
    }
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
        let mut batcher = ShardBatcher::new(b, r, w, drop, 0, skip);
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
    fn resume_skips_whole_steps() {
        let all = run(50, &[6], 4, 1, 2, false, 0);
        let resumed = run(50, &[6], 4, 1, 2, false, 3);
        assert_eq!(resumed, all[3..].to_vec());
    }
}
