//! Length bucketing: batches of rows of similar length, in a seeded
//! random order.

use std::collections::VecDeque;

use datafusion::arrow::array::RecordBatch;

use crate::feed::convert::memory_of;

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
        memory_of(self.buffer.iter().chain(&self.incoming))
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
                order.push((crate::feed::convert::value_len(array, row), index, row));
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
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::Int32Type;

    use super::*;

    use super::super::test_rows as rows;

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
