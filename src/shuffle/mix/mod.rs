//! `MIX`: weighted mixtures of sources, stratified in every batch,
//! deterministic and resumable.
//!
//! ```sql
//! MIX (SELECT text FROM 'web/*.parquet')  AS web  WEIGHT 0.6,
//!     (SELECT text FROM 'code/*.parquet') AS code WEIGHT 0.25,
//!     (SELECT text FROM 'math/*.parquet') AS math WEIGHT 0.15
//!     [ROWS n] [SEED s] [EPOCH e] [BATCH g] [WINDOW n]
//! ```
//!
//! # Definition
//! A mixture has `N` rows per epoch (`ROWS n`, or all its sources' rows
//! together). Source `k` gives `q_k` of them, `N × w_k / Σw` rounded by
//! largest remainder ([`pattern::quotas`]), and every output row has a
//! `source` column naming where it came from (`AS name`, or the source's
//! position `0`, `1` …) and a `source_id` column with that position.
//!
//! - **Which rows.** Source `k`'s rows are read in *passes*: pass `p` is the
//!   global shuffle of all its rows with seed `SplitMix64(seed ^
//!   SplitMix64(k + 1))` and epoch `p` (the order of `crate::shuffle`, keyed
//!   on the rows as they enter the source's row-wise functions, as a
//!   `SHUFFLE` of the source would be). Epoch `e` takes positions `[e·q_k,
//!   (e+1)·q_k)` of the passes laid end to end ([`pattern::Window`]). A
//!   source smaller than its share repeats, each repetition in a fresh order;
//!   a larger one is down-sampled, consecutive epochs taking consecutive
//!   slices of a pass, so every row is used before any is used again.
//! - **Where they go.** Position `i` takes the next row of the source chosen
//!   by [`pattern::Interleave`]: every prefix of `L` rows holds
//!   `⌊q_k·L/N⌋` or `⌈q_k·L/N⌉` rows of source `k`. So any `B` consecutive
//!   rows — each batch, on each rank, since a rank's batches are runs of the
//!   epoch's order — hold within 2 rows of the share `q_k·B/N` (within 1 for
//!   two sources), and a 15% source is in every batch of 16 rows or more.
//!
//! The order is a pure function of (the sources' rows, weights, `N`, seed,
//! epoch): the same on any number of partitions or cores, for any batch
//! size or world size. In a feed, a mixture without `SEED`/`EPOCH` takes the
//! feed's seed and epoch, so every epoch is a new draw and `resume_at`
//! repeats it exactly; outside a feed they are 0.
//!
//! # Cost
//! Each source is counted once when planned (free for a Parquet scan without
//! filters, from its statistics; else a `count(*)` that reads only the
//! columns the filters need), then each pass is one global shuffle of the
//! source's rows as they enter its row-wise functions, so an epoch costs
//! what shuffling its sources costs, plus one more shuffle of a source whose
//! window straddles two passes. Costly functions (decoding, tokenizing) run
//! on the window's rows only, cheap ones before each pass's permutation, so
//! that it moves what they produce ([`planner`]'s late row functions).
//! Sources run side by side (see [`exec`]), each sizing its batches for its
//! share of the memory pool.
//!
//! # Passes in windows
//! Each pass is a global shuffle of its source: its first row waits for the
//! whole source to be read, and a down-sampled source of terabytes is read
//! whole for every epoch's slice. With `WINDOW n`, pass `p` of source `k`
//! is instead the source's `SHUFFLE WINDOW n` with the same seed and epoch
//! `p` ([`crate::shuffle::WindowedShuffleExec`]: windows of at least `n`
//! rows cut from the source's Parquet row groups, each shuffled exactly).
//! Everything else stays: the quotas, the turns, which slice of the passes
//! an epoch takes. So a batch waits for one window of each source, memory
//! holds about two windows per source (as many again while a feed's next
//! epoch starts ahead), and the slice's first pass starts at its first
//! row: windows wholly before it are not run, their rows known from the
//! footers or, where a filter decides them, counted by a query of the
//! filter's columns ([`crate::shuffle::window_rows`]) when the epoch is
//! planned. What `SHUFFLE WINDOW` trades, a window's
//! rows come from few row groups, a windowed mixture trades per source.
//! It runs on the embedded engine, over sources that are row-wise queries of
//! one Parquet table each; a cluster, the epoch cache and other sources are
//! refused by name.
//!
//! # Weights by step
//! `WEIGHT STEPS (step: weight, …)` makes a source's weight piecewise linear
//! in the global step (rows of the feed's batch size × world, or `BATCH g`),
//! counted over the run. Quotas then come from the summed shares
//! ([`pattern::ScheduledMix`]): the rows each source has given after `R`
//! run rows are its targets apportioned by largest remainder, so each
//! epoch's windows start where the last one's ended, and within the epoch
//! the source furthest behind its target goes next.
//!
//! # The epoch cache
//! A feed with the epoch cache keeps each source's rows, not an epoch's
//! (`crate::feed`'s `mixture.rs`), and draws every epoch from them.
//!
//! # On a cluster
//! A Ballista scheduler plans each pass as a stage-shaped shuffle (its keys
//! and sorts on the executors, the cheap functions on the tasks that key
//! the rows), and the windows, the costly functions and the interleave in
//! the job's final task; the order is the embedded engine's. A source the
//! scheduler cannot count from its statistics (a filter) is counted by the
//! scheduler itself, reading the columns the filter needs. The feed's
//! realised proportions come back from the scheduler's plan of the finished
//! job ([`exec::takes_in_rendered_plan`]): no metrics travel back to a
//! Ballista client.

pub mod exec;
pub mod logical;
pub mod pattern;
pub mod planner;
pub mod window;

pub use exec::{MixExec, MixSource, mixture_rows};
pub use logical::{MixNode, MixSpec};
pub use planner::MixExtensionPlanner;
pub use window::MixWindowExec;

use crate::rand::splitmix64;

/// The shuffle seed of source `k` of a mixture seeded `seed`: sources draw
/// independent orders even when their rows are equal.
pub fn source_seed(seed: u64, k: usize) -> u64 {
    splitmix64(seed ^ splitmix64(k as u64 + 1))
}

/// Why a mixture whose passes are windowed (`WINDOW window_rows`) does not
/// go to a cluster: said by the client before it sends the plan (the wire
/// does not carry the window, so an older scheduler could not misread it
/// as global passes) and by a scheduler's planner.
pub fn refused_on_a_cluster(window_rows: u64) -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::NotImplemented(format!(
        "MIX … WINDOW {window_rows} (each pass over a source shuffled in windows) runs on \
         the embedded engine; on a cluster leave WINDOW out (each pass is then a global \
         shuffle on the executors)"
    ))
}

/// The name of the column that says which source a row came from.
pub const SOURCE_COLUMN: &str = "source";

/// The name of the column that holds the position of a row's source in the
/// `MIX` clause (0, 1 …): a number a feed can hand over as a tensor.
pub const SOURCE_ID_COLUMN: &str = "source_id";
