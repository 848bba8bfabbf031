//! [`FeedLength`]: how many batches a feed hands over, from the rows of its
//! epochs — the total of the CLI's progress bar.
//!
//! An epoch of `R` rows is `⌈R / (B·W)⌉` global steps of `B` rows per rank
//! and `W` ranks (`⌊…⌋` with `drop_last`): every rank gets the same number
//! of batches (see the module docs of `crate::feed`). A run from epoch `e`
//! at row `r` of its order is the rest of epoch `e` cut from `r` on, then
//! whole epochs up to the last, less the steps it skips; an epoch continued
//! over appended data has the rows its checkpoint had not consumed, plus the
//! new ones (all the rows less those consumed). Under a token
//! budget the steps depend on the rows' lengths: no length before the epoch
//! runs.
//!
//! `R` is a `count(*)` of the feed's query: free for a Parquet scan without
//! filters (its statistics), and for a `MIX` (its rows are known when it is
//! planned); otherwise it reads only the columns the filters need, never
//! decoding or tokenizing what the query's projections would.

use std::collections::{BTreeMap, BTreeSet};

use datafusion::error::Result;

use super::batcher::EpochStart;
use crate::Session;

/// The shape of a feed's run that its length depends on; see the module
/// docs. From [`super::Feed::length`].
#[derive(Debug, Clone)]
pub struct FeedLength {
    pub(super) session: Session,
    pub(super) sql: String,
    pub(super) batch_size: usize,
    pub(super) world: usize,
    pub(super) drop_last: bool,
    /// A token budget or packing: steps depend on the rows' lengths.
    pub(super) steps_depend_on_lengths: bool,
    /// Epochs `resume.0..end_epoch` run.
    pub(super) end_epoch: u64,
    pub(super) resume: (u64, EpochStart),
    pub(super) skipped_steps: BTreeMap<u64, BTreeSet<u64>>,
    /// `(epoch, rows consumed before)` of an epoch continued over appended
    /// data.
    pub(super) continued: Option<(u64, u64)>,
}

impl FeedLength {
    /// Rows of one epoch of the feed's order, all ranks together: a
    /// `count(*)` of its query.
    pub async fn rows_per_epoch(&self) -> Result<u64> {
        let query = self.sql.trim().trim_end_matches(';');
        let counting = self
            .session
            .sql(&format!("SELECT count(*) FROM ({query})"))
            .await?;
        let counted = self.session.collect(counting).await?;
        crate::exec::counted_rows(&counted, "a feed's query")
    }

    /// Batches each rank gets in a whole epoch of `rows` rows; `None` under
    /// a token budget or packing.
    pub fn batches_per_epoch(&self, rows: u64) -> Option<u64> {
        self.steps_after(rows, 0)
    }

    /// Batches this rank gets from the whole run over epochs of `rows` rows:
    /// the rest of the first epoch from where it resumes, the later epochs
    /// whole, less the skipped steps; `None` under a token budget or packing.
    pub fn batches_in_run(&self, rows: u64) -> Option<u64> {
        let (first_epoch, start) = self.resume;
        let (rows_before, first_step) = start.in_chunks(self.chunk_rows());
        let mut total = 0u64;
        for epoch in first_epoch..self.end_epoch {
            let (before, first) = match epoch == first_epoch {
                true => (rows_before, first_step),
                false => (0, 0),
            };
            let epoch_rows = match self.continued {
                Some((continued, consumed)) if continued == epoch => {
                    rows.saturating_sub(consumed)
                }
                _ => rows,
            };
            let steps = self.steps_after(epoch_rows, before)?;
            let skipped = self.skipped_steps.get(&epoch).map_or(0, |skipped| {
                skipped.range(first..first.saturating_add(steps)).count() as u64
            });
            total = total.saturating_add(steps - skipped);
            // Every later epoch is alike: no need to walk a long run.
            let alike = !self.skipped_steps.keys().any(|e| *e > epoch)
                && self
                    .continued
                    .is_none_or(|(continued, _)| continued <= epoch);
            if epoch > first_epoch && alike {
                let later = self.end_epoch - epoch - 1;
                return Some(total.saturating_add(later.saturating_mul(steps)));
            }
        }
        Some(total)
    }

    /// Rows of one global step, all ranks together.
    fn chunk_rows(&self) -> usize {
        self.batch_size.saturating_mul(self.world).max(1)
    }

    /// Steps of an epoch of `rows` rows cut from row `before` on.
    fn steps_after(&self, rows: u64, before: u64) -> Option<u64> {
        if self.steps_depend_on_lengths {
            return None;
        }
        let left = rows.saturating_sub(before);
        let chunk = self.chunk_rows() as u64;
        Some(match self.drop_last {
            true => left / chunk,
            false => left.div_ceil(chunk),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn length(batch_size: usize, world: usize, drop_last: bool) -> FeedLength {
        FeedLength {
            session: Session::try_new().expect("session"),
            sql: "SELECT 1".into(),
            batch_size,
            world,
            drop_last,
            steps_depend_on_lengths: false,
            end_epoch: 1,
            resume: (0, EpochStart::BEGIN),
            skipped_steps: BTreeMap::new(),
            continued: None,
        }
    }

    #[test]
    fn an_epoch_is_its_chunks_rounded_by_drop_last() {
        // 1,000 rows in chunks of 64 (16 rows × 4 ranks): 15 whole, 1 padded.
        assert_eq!(length(16, 4, false).batches_per_epoch(1_000), Some(16));
        assert_eq!(length(16, 4, true).batches_per_epoch(1_000), Some(15));
        assert_eq!(length(16, 4, false).batches_per_epoch(0), Some(0));
        let mut tokens = length(16, 4, false);
        tokens.steps_depend_on_lengths = true;
        assert_eq!(tokens.batches_per_epoch(1_000), None);
        assert_eq!(tokens.batches_in_run(1_000), None);
    }

    /// The start of an epoch after `rows` of it, at step `first_step`.
    fn after_rows(rows: u64, first_step: u64) -> EpochStart {
        EpochStart::Rows { rows, first_step }
    }

    #[test]
    fn a_run_is_the_rest_of_its_first_epoch_then_whole_ones_less_skips() {
        let mut run = length(10, 2, false);
        run.end_epoch = 4;
        // 95 rows: 5 steps of 20 rows an epoch.
        assert_eq!(run.batches_in_run(95), Some(20));
        // From epoch 1 step 3: 2 steps left of it, then epochs 2 and 3.
        run.resume = (1, EpochStart::Step(3));
        assert_eq!(run.batches_in_run(95), Some(12));
        // After 50 rows of epoch 1 (another shape's checkpoint): 45 rows
        // left, 3 steps numbered from 7.
        run.resume = (1, after_rows(50, 7));
        assert_eq!(run.batches_in_run(95), Some(13));
        // Skips count where they fall inside the run: step 8 of epoch 1
        // (steps 7..10), step 4 of epoch 3; not step 2 of epoch 1 (before
        // the resume) nor step 9 of epoch 2 (past its end).
        run.skipped_steps = BTreeMap::from([
            (1, BTreeSet::from([2, 8])),
            (2, BTreeSet::from([9])),
            (3, BTreeSet::from([4])),
        ]);
        assert_eq!(run.batches_in_run(95), Some(11));
    }

    #[test]
    fn an_epoch_continued_over_appended_data_has_the_rows_not_consumed() {
        let mut run = length(10, 1, false);
        run.end_epoch = 2;
        // 100 rows now, 40 of them consumed before the continuation: 60
        // rows, 6 steps; after 20 of them, 4. Epoch 1 is whole again.
        run.continued = Some((0, 40));
        assert_eq!(run.batches_in_run(100), Some(16));
        run.resume = (0, after_rows(20, 2));
        assert_eq!(run.batches_in_run(100), Some(14));
    }

    #[test]
    fn a_long_run_is_counted_without_walking_its_epochs() {
        let mut run = length(1, 1, false);
        run.end_epoch = u64::MAX;
        assert_eq!(run.batches_in_run(3), Some(u64::MAX));
        run.end_epoch = 1_000_000_000_000;
        assert_eq!(run.batches_in_run(3), Some(3_000_000_000_000));
    }
}
