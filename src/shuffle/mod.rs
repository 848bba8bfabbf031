//! `SHUFFLE`: a seeded, memory-bounded, reproducible global shuffle.
//!
//! ```sql
//! SELECT … FROM 'data/*.parquet' WHERE … SHUFFLE [SEED s] [EPOCH e];
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
//! `key(row) = row_key(row, mix(seed, epoch))`, where `row_key` folds every
//! column of the query, in order, into an xxh3 hash (defined in
//! `crate::sql::functions`: value bytes straight from Arrow, arrow's row format
//! for the remaining types) and `mix` is SplitMix64 of `seed ^
//! SplitMix64(epoch)`. Rows are emitted by ascending key. Two rows with equal
//! keys are byte-identical (barring a 2^-64 hash collision), so ties cannot
//! make the output differ. Caveat: identical rows share a key and so come out
//! next to each other; a row identity from the scan (file, row offset) to
//! break such ties is future work.
//!
//! # Data flow
//! ```text
//!  ShuffleExec: runs the operators below with batches sized to the budget
//!  input partitions (scan, filters, UDFs …)
//!    p0        p1       …   pN-1
//!    │         │            │
//!    ▼         ▼            ▼
//!  ShuffleKeyExec: append __sqlfeed_shuffle_key = key(seed, epoch, row);
//!    │         │            │   split batches wider than 1/64 of a share
//!    └────┬────┴─────┬──────┘
//!         ▼          ▼
//!  PermuteExec: hold batches, sort a (key, batch, row) index, gather output
//!         │     in key order; beyond the budget, sorted runs on disk merged
//!         ▼     by DataFusion's streaming merge; drops the key
//!  one stream in global key order
//! ```
//! [`plan_sorted_shuffle`] gives the same order with DataFusion's per-partition
//! `SortExec` and `SortPreservingMergeExec` in place of [`PermuteExec`]: the
//! shape Ballista cuts into stages (sorts on the executors, the merge on the
//! final stage). A test checks that both plans give the same order.
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
//! `LOCAL SHUFFLE BUFFER n` ([`LocalShuffleExec`]) has no barrier: it emits
//! after `n` rows per partition, at the price of only local randomness.
//!
//! # Output ordering
//! One partition, ordered by the (dropped) key. `LOCAL SHUFFLE` keeps the
//! input partitioning and has no ordering.

mod exec;
mod key;
mod local;
mod logical;
mod permute;
mod planner;

use std::sync::Arc;

use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::logical_expr::{Extension, LogicalPlan};

pub use exec::{ShuffleExec, shuffle_batch_rows};
pub use key::{SHUFFLE_KEY_COLUMN, ShuffleKeyExec, shuffle_seed};
pub use local::LocalShuffleExec;
pub use logical::ShuffleNode;
pub use permute::PermuteExec;
pub use planner::{
    ShuffleExtensionPlanner, SqlfeedQueryPlanner, plan_global_shuffle,
    plan_sorted_shuffle,
};

/// The one child of a single-input operator, or an internal error.
pub(crate) fn single_child(
    name: &str,
    children: &[Arc<dyn datafusion::physical_plan::ExecutionPlan>],
) -> Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
    match children {
        [child] => Ok(Arc::clone(child)),
        _ => Err(datafusion::error::DataFusionError::Internal(format!(
            "{name} takes one child, got {}",
            children.len()
        ))),
    }
}

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
    /// `LOCAL SHUFFLE BUFFER n [SEED s]`: a streaming shuffle buffer of `n`
    /// rows per partition, like tf.data's `shuffle(n)`.
    Local {
        /// Rows held per partition.
        buffer_rows: usize,
        /// The seed.
        seed: u64,
    },
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
    let node = ShuffleNode::try_new(plan, spec)?;
    let plan = LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    });
    Ok(DataFrame::new(state, plan))
}
