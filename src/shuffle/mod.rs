//! `SHUFFLE`: a seeded, memory-bounded, reproducible global shuffle.
//!
//! ```sql
//! SELECT … FROM 'data/*.parquet' WHERE … SHUFFLE [SEED s] [EPOCH e];
//! SELECT … FROM 'data/*.parquet' WHERE … SHUFFLE WINDOW n [SEED s] [EPOCH e];
//! SELECT … FROM 'data/*.parquet' WHERE … SHUFFLE BY POSITION [SEED s] [EPOCH e];
//! SELECT … LOCAL SHUFFLE BUFFER n [SEED s];
//! ```
//!
//! # Background
//! Every training epoch must see the whole dataset in a fresh random order.
//! `ORDER BY random()` has no seed and its order depends on the plan; Ray
//! Data's `random_shuffle` holds everything in memory and its order changes
//! with the cluster. sqlfeed orders rows by a **shuffle key**, a pure
//! function of `(seed, epoch, row)`, and orders by it, so the order is the
//! same on any number of partitions or batch sizes and the memory is bounded
//! by the session's budget.
//!
//! # Definition of the order
//! Each row has a *content hash* `h(row) = row_key(K(row), 0)`, where
//! `row_key` folds columns, in order, into an xxh3 hash (defined in
//! `crate::sql::functions`: value bytes straight from Arrow, arrow's row
//! format for the remaining types) and `K(row)` are the values the row has
//! as it enters the query's row-wise functions: the columns those functions
//! read plus the outputs that are not such functions (see [`late`]; all
//! output columns when the query has no such functions). Its content key is
//! `c(row) = xxh3(h(row), seed = mix(seed, epoch))` with `mix` SplitMix64 of
//! `seed ^ SplitMix64(epoch)`. The content hash does not depend on the seed
//! or the epoch, so a feed's epoch cache stores it with the preprocessed
//! rows and later epochs shuffle them in exactly the uncached order. The
//! copies of a row that occurs `n` times (equal `K`) are
//! numbered `k = 0..n` and copy `k` gets the key `c` for `k = 0` and
//! `xxh3(k, seed = c)` otherwise (see `copies.rs`). Rows are emitted by
//! ascending key. So the output is a uniform permutation of the rows as a
//! multiset: copies are spread like independent rows (the 3 copies of each
//! row of a table repeated 3 times are not adjacent), and a table without
//! repeated rows is ordered by `c` alone. Copies are identical, so which copy
//! gets which `k` cannot be seen: the order stays a pure function of (seed,
//! epoch, data). Two different rows with equal content hashes (a 2^-64
//! collision) are treated as copies.

//! # Data flow
//! ```text
//!  ShuffleMergeExec: runs the operators below with batches sized to the budget
//!  input partitions (scan, filters, UDFs …)
//!    p0        p1       …   pN-1
//!    │         │            │
//!    ▼         ▼            ▼
//!  ShuffleKeyExec: append __sqlfeed_shuffle_key = c(seed, epoch, row);
//!    │         │            │   split batches wider than 1/64 of a share
//!    └────┬────┴─────┬──────┘
//!         ▼          ▼
//!  PermuteExec: hold batches, sort a (key, batch, row) index; copies are now
//!         │     adjacent: number them, re-key, sort again; gather output in
//!         │     key order; beyond the budget, content-key-sorted runs on
//!         │     disk, merged to number copies, then merged by final key
//!         ▼     (DataFusion's streaming merge); drops the key
//!  one stream in global key order
//! ```
//! [`plan_sorted_shuffle`] gives the same order in the shape Ballista cuts
//! into stages: a hash exchange on the content key (all copies of a row meet
//! in one partition), [`PermuteExec`] per partition keeping the final key,
//! and DataFusion's `SortPreservingMergeExec` on the final stage. When the
//! consumer reads result partitions in order (a cluster feed), the final
//! stage is parallel instead: [`RangeBucketExec`] and a second hash exchange
//! send each row to the partition of its key's range, where it is sorted;
//! the partitions in turn are the same order (`range.rs`). Tests check that
//! all these plans give the same order.
//!
//! # Memory and spilling
//! [`PermuteExec`] reserves the held batches plus 16 bytes of index per row
//! from the session's pool (`--memory-limit`); when a batch does not fit it
//! writes what it holds as a key-sorted run through DataFusion's spill
//! manager, and the runs are deleted when the query ends, fails or is
//! cancelled. The key adds 8 bytes per row. In memory the rows are copied
//! once, when gathered into output batches.

//! # Streaming
//! A global shuffle is a barrier: the first row can only be emitted after the
//! last input row has been keyed (any row may have the smallest key), so time
//! to first row ≈ scan + sort time, after which rows stream from the merge.
//! `SHUFFLE WINDOW n` ([`WindowedShuffleExec`]) is this shuffle over
//! windows of `n` rows drawn from all over the data, streamed one after
//! another: its first row waits for one window. Rows of one row group land
//! in one window; the option for data that does not fit one barrier.
//! `SHUFFLE BY POSITION` ([`PositionShuffleExec`]) is an exact shuffle
//! keyed by each row's Parquet file and row, known before any row is read:
//! its first row waits for the scan alone (no key to hash, no index to
//! sort), at the price of an order that follows the files' layout.
//! `LOCAL SHUFFLE BUFFER n` ([`LocalShuffleExec`]) has no barrier: it emits
//! after `n` rows per partition, at the price of only local randomness.
//!
//! # Output ordering
//! One partition, ordered by the (dropped) key. `LOCAL SHUFFLE` keeps the
//! input partitioning and has no ordering.

mod carry;
mod content_hash;
mod copies;
pub(crate) mod deal;
mod keep_order;
mod key;
pub mod late;
mod local;
mod logical;
mod merge;
pub mod mix;
mod permute;
mod planner;
mod position;
mod range;
mod unique;
mod window_units;
mod windowed;

use datafusion::dataframe::DataFrame;
use datafusion::error::Result;

pub use carry::CarryCheapOutputs;
pub use content_hash::row_key_hash;
pub use copies::CopyIdentity;
pub use deal::{Deal, DealExec, EpochSpan, RANK_ROUTE_COLUMN, RankShardExec};
pub use keep_order::KeepShuffleOrder;
pub use key::{
    CONTENT_HASH_SEED, KeySource, SHUFFLE_KEY_COLUMN, ShuffleKeyExec, shuffle_seed,
};
pub use late::{
    CONTENT_HASH_COLUMN, LateRowFunctions, shuffle_by_content_hash, shuffle_plan,
    shuffle_with_content_hash, with_content_hash,
};
pub use local::LocalShuffleExec;
pub use logical::{ShuffleKey, ShuffleNode};
pub use merge::{ShuffleMergeExec, shuffle_batch_rows};
pub use permute::{PermuteExec, PermuteMode};
pub use planner::{
    FinalStage, GlobalShuffle, ShuffleExtensionPlanner, plan_global_shuffle,
    plan_sorted_shuffle,
};
pub(crate) use position::with_positions;
pub use position::{
    IndexPermutation, PositionKeyExec, PositionKeys, PositionShuffleExec,
    RankedRowGroups, StoredOrderExec,
};
pub use range::{RANGE_BUCKET_COLUMN, RANGE_COUNTS_COLUMN, RangeBucketExec};
pub use unique::REPEATED_ROWS;
pub use window_units::{WindowUnitFile, is_window_scan};
pub use windowed::{
    BucketRows, WINDOWS_AHEAD, WindowedShuffleExec, count_rows_by_bucket,
    decode_bucket_rows, encode_bucket_rows, filters_may_change, position_bucket_rows,
    why_not_windowable, window_count, window_rows, with_bucket_rows, with_only_window,
};

/// What a `SHUFFLE` clause asks for.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    serde::Serialize,
    serde::Deserialize,
)]
pub enum ShuffleSpec {
    /// `SHUFFLE [SEED s] [EPOCH e]`: a global permutation.
    Global {
        /// The seed of the run.
        seed: u64,
        /// The epoch; each epoch is a different permutation.
        epoch: u64,
    },
    /// `SHUFFLE WINDOW n [SEED s] [EPOCH e]`: the global shuffle of windows
    /// of at least `n` rows drawn from all over the data, streamed one after
    /// another (see [`WindowedShuffleExec`]): the first batch waits for one
    /// window, at the price of rows of one row group landing together.
    Windowed {
        /// The seed of the run.
        seed: u64,
        /// The epoch; each epoch is a different order.
        epoch: u64,
        /// Rows per window, at least.
        window_rows: u64,
        /// Only this window of the epoch, shuffled alone (a cluster feed's
        /// job per window); `None`: every window, one after another.
        only_window: Option<u64>,
    },
    /// `SHUFFLE BY POSITION [SEED s] [EPOCH e]`: a global permutation of
    /// the rows keyed by their Parquet file and row instead of their content
    /// (see [`PositionShuffleExec`]): its first batch waits for the scan
    /// alone, at the price of an order that follows the files' layout.
    Positional {
        /// The seed of the run.
        seed: u64,
        /// The epoch; each epoch is a different permutation.
        epoch: u64,
    },
    /// `LOCAL SHUFFLE BUFFER n [SEED s]`: a streaming shuffle buffer of `n`
    /// rows per partition, like tf.data's `shuffle(n)`.
    Local {
        /// Rows held per partition.
        buffer_rows: usize,
        /// The seed.
        seed: u64,
    },
}

impl ShuffleSpec {
    /// The seed and epoch of a shuffle that orders rows by content key
    /// (`SHUFFLE`, and `SHUFFLE WINDOW` within each window).
    pub fn content_keyed(self) -> Option<(u64, u64)> {
        match self {
            ShuffleSpec::Global { seed, epoch }
            | ShuffleSpec::Windowed { seed, epoch, .. } => Some((seed, epoch)),
            ShuffleSpec::Positional { .. } | ShuffleSpec::Local { .. } => None,
        }
    }
}

/// Why an epoch of `SHUFFLE BY POSITION` read from the epoch cache (keyed
/// by the entry's stored order) does not go to a cluster: the entry is on
/// the rank's machine, which reads it (`crate::feed`). Said by the client
/// before it sends such a plan and by a scheduler's planner.
pub fn refused_by_position_on_a_cluster() -> datafusion::error::DataFusionError {
    datafusion::error::DataFusionError::NotImplemented(
        "SHUFFLE BY POSITION over an epoch cache entry runs where the entry is, on the \
         embedded engine; on a cluster, shuffle the query's Parquet files by position"
            .to_string(),
    )
}

/// Shuffles the result of `df`; the Rust form of the `SHUFFLE` clause.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> datafusion::error::Result<()> {
/// use sqlfeed::shuffle::{shuffle, ShuffleSpec};
/// let session = sqlfeed::Session::try_new()?;
/// let df = session.sql("SELECT * FROM generate_series(1, 5)").await?;
/// let a = shuffle(df.clone(), ShuffleSpec::Global { seed: 42, epoch: 0 })?.collect().await?;
/// let b = shuffle(df, ShuffleSpec::Global { seed: 42, epoch: 0 })?.collect().await?;
/// assert_eq!(a, b);
/// # Ok(())
/// # }
/// ```
pub fn shuffle(df: DataFrame, spec: ShuffleSpec) -> Result<DataFrame> {
    let (state, plan) = df.into_parts();
    Ok(DataFrame::new(state, shuffle_plan(plan, spec)?))
}
