//! Cuts the query's row stream into this rank's exact batches.
//!
//! ```text
//!   rows in the feed's order
//!     │  (optional) LengthBucketer — sorted windows, chunks in seeded order   buckets.rs
//!     ▼
//!   Batcher::new(Cut, epoch, EpochStart)
//!     ├─ Cut::Shard  → ShardBatcher: chunks of B × W, rank r's slice          shard.rs
//!     ├─ Cut::Dealt  → ShardBatcher over rows already dealt to this rank      shard.rs
//!     ├─ Cut::Tokens → TokenBatcher: batches within a padded-token budget     tokens.rs
//!     └─ Cut::Pack   → PackBatcher: documents packed into sequences           pack/
//!     ▼
//!   BatchRows, one per step of this rank
//! ```
//!
//! Every batcher skips the rows an [`EpochStart`] says were consumed
//! (start.rs), and says after each batch how many rows of the order are
//! consumed once its step is (`BatchRows::rows_after`): what a checkpoint
//! records.

mod buckets;
pub(crate) mod pack;
mod shard;
mod start;
mod tokens;

use datafusion::arrow::array::RecordBatch;

pub(crate) use self::buckets::LengthBucketer;
pub(crate) use self::pack::{Pack, PackBatcher};
pub(crate) use self::shard::{Shard, ShardBatcher};
pub(crate) use self::start::EpochStart;
pub(crate) use self::tokens::{TokenBatcher, Tokens};
use super::convert::BatchRows;

/// How an epoch's rows are cut into this rank's batches.
#[derive(Debug, Clone)]
pub(crate) enum Cut {
    /// Fixed batches, this rank's slice of every chunk of `B × W` rows.
    Shard(Shard),
    /// Fixed batches of `batch_rows` over rows a cluster job already dealt to
    /// this rank (`crate::shuffle::deal`: the executors cut the shard and
    /// the last step), from a feed of `world` ranks.
    Dealt {
        /// `B`.
        batch_rows: usize,
        /// `W`.
        world: usize,
    },
    /// Batches within a budget of padded tokens.
    Tokens(Tokens),
    /// Documents packed into sequences of at most `max_tokens`.
    Pack(Pack),
}

/// The batcher a feed uses.
#[derive(Debug)]
pub(crate) enum Batcher {
    /// Fixed batch size.
    Rows(ShardBatcher),
    /// Token budget.
    Tokens(TokenBatcher),
    /// Packed sequences.
    Pack(PackBatcher),
}

impl Batcher {
    /// The batcher of `epoch`, starting at `start`.
    pub(crate) fn new(cut: Cut, epoch: u64, start: EpochStart) -> Self {
        match cut {
            Cut::Shard(shard) => Batcher::Rows(ShardBatcher::new(shard, epoch, start)),
            Cut::Dealt { batch_rows, world } => {
                // The producer deals only resumes on the step grid: the
                // steps skipped are whole steps of this rank's rows.
                let (skip, first_step) = start.in_chunks(batch_rows * world);
                let steps_skipped = skip / (batch_rows * world).max(1) as u64;
                let start = EpochStart::Rows {
                    rows: steps_skipped * batch_rows as u64,
                    first_step,
                };
                let alone = Shard {
                    batch_rows,
                    rank: 0,
                    world: 1,
                    drop_last: false,
                };
                Batcher::Rows(ShardBatcher::new(alone, epoch, start))
            }
            Cut::Tokens(tokens) => {
                Batcher::Tokens(TokenBatcher::new(tokens, epoch, start))
            }
            Cut::Pack(pack) => Batcher::Pack(PackBatcher::new(pack, epoch, start)),
        }
    }

    /// Cuts `batch`'s rows; the batches they complete go to `out`. Fails
    /// only on a document a packing feed may not take (`pack_long='fail'`).
    pub(crate) fn push(
        &mut self,
        batch: RecordBatch,
        out: &mut Vec<BatchRows>,
    ) -> datafusion::error::Result<()> {
        match self {
            Batcher::Rows(b) => b.push(batch, out),
            Batcher::Tokens(b) => b.push(batch, out),
            Batcher::Pack(b) => return b.push(batch, out),
        }
        Ok(())
    }

    pub(crate) fn finish(
        &mut self,
        out: &mut Vec<BatchRows>,
    ) -> datafusion::error::Result<()> {
        match self {
            Batcher::Rows(b) => b.finish(out),
            Batcher::Tokens(b) => b.finish(out),
            Batcher::Pack(b) => return b.finish(out),
        }
        Ok(())
    }

    pub(crate) fn steps(&self) -> u64 {
        match self {
            Batcher::Rows(b) => b.steps(),
            Batcher::Tokens(b) => b.steps(),
            Batcher::Pack(b) => b.steps(),
        }
    }

    /// After `finish`: why the resume point lies beyond the epoch's end.
    pub(crate) fn beyond_the_end(&self) -> Option<String> {
        match self {
            Batcher::Rows(b) => b.beyond_the_end(),
            Batcher::Tokens(b) => b.beyond_the_end(),
            Batcher::Pack(b) => b.beyond_the_end(),
        }
    }

    /// Whether the epoch is known to have a step after `step` (see
    /// [`ShardBatcher::step_follows`]). A token budget's steps depend on
    /// rows not read yet, so it answers only once a later batch is cut.
    pub(crate) fn step_follows(&self, step: u64) -> bool {
        match self {
            Batcher::Rows(b) => b.step_follows(step),
            Batcher::Tokens(_) | Batcher::Pack(_) => false,
        }
    }

    /// Bytes of input held between calls (for the feed's memory budget).
    pub(crate) fn held_bytes(&self) -> usize {
        match self {
            Batcher::Rows(b) => b.held_bytes(),
            Batcher::Tokens(b) => b.held_bytes(),
            Batcher::Pack(b) => b.held_bytes(),
        }
    }
}

/// Rows whose list length is `lengths[i]` and whose first value is `i`: the
/// variable-length rows the token and bucket tests cut.
#[cfg(test)]
fn test_rows(lengths: &[usize]) -> RecordBatch {
    use std::sync::Arc;

    use datafusion::arrow::array::ListArray;
    use datafusion::arrow::datatypes::Int32Type;

    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
        lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| Some(vec![Some(i as i32); n])),
    );
    RecordBatch::try_from_iter(vec![("t", Arc::new(list) as _)]).unwrap()
}
