//! The one definition of the settings under which a query's partitions
//! hold the same rows in the same order on every run: what the feed (its
//! unshuffled order, its cluster jobs) and the epoch cache (an entry must
//! be the same however often it is computed) plan with.

use datafusion::prelude::SessionConfig;

/// What a plan's consumer relies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionOrder {
    /// Rows are ordered by content afterwards (a global `SHUFFLE`): only
    /// which rows exist matters, so idle partitions may steal files.
    Content,
    /// Each partition's row sequence matters; with `Some(lanes)` the
    /// partition count is fixed too, whatever the machine's core count.
    Partitions(Option<usize>),
}

/// `config` with round-robin repartitioning off (it hands batches to
/// whichever partition asks first) and, for [`PartitionOrder::Partitions`],
/// file work stealing off (then which rows a partition reads depends on
/// timing) and the lanes as the target partition count (files and row
/// groups go to partitions by a rule that depends on that count).
pub fn deterministic_config(config: &mut SessionConfig, order: PartitionOrder) {
    let options = config.options_mut();
    options.optimizer.enable_round_robin_repartition = false;
    if let PartitionOrder::Partitions(lanes) = order {
        options.execution.enable_file_stream_work_stealing = false;
        if let Some(lanes) = lanes {
            options.execution.target_partitions = lanes.max(1);
        }
    }
}
