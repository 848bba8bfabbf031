//! Where an epoch's batches start: at its beginning, at a step of the
//! feed's shape, or after rows of its order consumed under any shape.
//!
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

/// Where an epoch's batches start (see the module docs).
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
    pub(super) fn beyond_the_end(
        self,
        epoch: u64,
        steps: u64,
        rows: u64,
    ) -> Option<String> {
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
