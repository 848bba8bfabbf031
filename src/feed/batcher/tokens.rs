//! Token budgets: variable-size batches of at most a budget of padded
//! tokens, dealt to ranks in turn.

use datafusion::arrow::array::RecordBatch;

use super::EpochStart;
use crate::feed::convert::{BatchRows, memory_of};

/// How [`TokenBatcher`] cuts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tokens {
    /// Padded tokens per batch.
    pub(crate) budget: usize,
    /// Index of the variable-length column that is measured.
    pub(crate) column: usize,
    /// Fixed padded length (`pad_to`), if any.
    pub(crate) pad_to: Option<usize>,
    /// This rank.
    pub(crate) rank: usize,
    /// Ranks in all.
    pub(crate) world: usize,
    /// Drop the last, budget-incomplete batch.
    pub(crate) drop_last: bool,
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
    /// How it packs (`budget` and `world` at least 1).
    tokens: Tokens,
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
        memory_of(self.current.iter().chain(own))
    }

    pub(crate) fn new(tokens: Tokens, epoch: u64, start: EpochStart) -> Self {
        let tokens = Tokens {
            budget: tokens.budget.max(1),
            world: tokens.world.max(1),
            ..tokens
        };
        let (skip_steps, skip_rows, first_step) = match start {
            EpochStart::Step(step) => (step, 0, 0),
            EpochStart::Rows { rows, first_step } => (0, rows, first_step),
        };
        Self {
            tokens,
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
        self.first_step + self.closed / self.tokens.world as u64
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
        let step = self.first_step + index / self.tokens.world as u64;
        let pieces = std::mem::take(&mut self.current);
        if index % self.tokens.world as u64 == self.tokens.rank as u64 {
            self.own = Some(BatchRows {
                pieces,
                rows: self.current_rows,
                epoch: self.epoch,
                step,
                rows_after: 0,
                packed: None,
            });
        }
        self.consumed_rows += self.current_rows as u64;
        self.current_rows = 0;
        self.current_longest = 0;
        self.closed += 1;
        if self.closed.is_multiple_of(self.tokens.world as u64)
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
        let array = std::sync::Arc::clone(batch.column(self.tokens.column));
        let mut run_start = 0;
        for row in 0..batch.num_rows() {
            let len = match self.tokens.pad_to {
                Some(len) => len,
                None => crate::feed::convert::value_len(&array, row),
            };
            let longest = self.current_longest.max(len);
            let rows = self.current_rows + (row - run_start) + 1;
            if rows > 1 && rows * longest > self.tokens.budget {
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
        if self.tokens.drop_last {
            self.current.clear();
            self.current_rows = 0;
        } else {
            self.close(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::Int32Type;

    use super::*;

    use super::super::test_rows as rows;

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
        let mut batcher = TokenBatcher::new(
            Tokens {
                budget: 10,
                column: 0,
                pad_to: None,
                rank: 0,
                world: 1,
                drop_last: false,
            },
            0,
            EpochStart::BEGIN,
        );
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
            let mut b = TokenBatcher::new(
                Tokens {
                    budget: 10,
                    column: 0,
                    pad_to: None,
                    rank,
                    world: 2,
                    drop_last: false,
                },
                0,
                EpochStart::BEGIN,
            );
            let mut out = vec![];
            b.push(rows(&lengths), &mut out);
            b.finish(&mut out);
            out
        };
        let (a, b) = (run(0), run(1));
        assert_eq!(a.len(), b.len());
        assert_eq!(a.len(), sizes.len() / 2);
    }
}
