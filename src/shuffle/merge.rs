//! [`ShuffleMergeExec`]: the root of a global shuffle's operators.
//!
//! ```text
//!  ProjectionExec (drop key)                        (stage-shaped plan; on one
//!    ShuffleMergeExec: seed, epoch, batch_rows  ◄──  machine one PermuteExec over
//!      SortPreservingMergeExec (key)                 all partitions takes the
//!        PermuteExec (per partition)                 merge's place and drops the
//!          RepartitionExec (hash of key)             key itself)
//!            ShuffleKeyExec (seed, epoch)       ShuffleMergeExec runs its subtree
//!              <input>                          with batch_size = batch_rows
//! ```
//!
//! # Why a batch size of its own
//! The external sort's merge phase holds one batch per sorted run and the
//! final merge one batch per partition, all outside what can spill. With
//! DataFusion's default 8192-row batches of wide rows (token lists, image
//! bytes) that fixed cost alone can exceed a small memory budget, and a
//! shuffle of a dataset 4× the budget then fails instead of spilling.
//! `ShuffleMergeExec` therefore runs its subtree with batches sized so that those
//! merge buffers take a bounded share of the budget ([`shuffle_batch_rows`]).
//!
//! # Error handling, ordering, memory
//! Errors pass through. The output is one partition in shuffle order, or,
//! [`ranged`](ShuffleMergeExec::ranged), one partition per key range, whose
//! concatenation in partition order is the shuffle order (the parallel final
//! stage of a cluster feed, see `range.rs`). All memory is reserved by the
//! operators below, from the session's pool.

use std::fmt;
use std::sync::Arc;

use super::CopyIdentity;
use crate::exec::{BatchStream, Setting};
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{
    LexOrdering, OrderingRequirements, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan,
};

/// Smallest batch a shuffle uses, whatever the budget.
const MIN_BATCH_ROWS: usize = 64;

/// Rough in-memory bytes of one row of `schema`, for sizing batches:
/// fixed-width columns by width, variable-width ones by a generous typical
/// size. Overestimating only makes batches smaller under a small budget;
/// underestimating made the external sort's merge hold batches of wide rows
/// (kilobyte strings, image blobs) larger than the whole budget, and a
/// shuffle that should have spilled failed (tests/memory_shuffle.rs).
fn estimated_row_bytes(schema: &Schema) -> usize {
    fn width(t: &DataType) -> usize {
        match t {
            t if t.is_primitive() => t.primitive_width().unwrap_or(8),
            DataType::Boolean | DataType::Null => 1,
            DataType::FixedSizeBinary(n) => *n as usize,
            DataType::FixedSizeList(f, n) => width(f.data_type()) * (*n).max(0) as usize,
            DataType::List(f) | DataType::LargeList(f) | DataType::ListView(f) => {
                256 * width(f.data_type()) + 8
            }
            DataType::Struct(fields) => fields.iter().map(|f| width(f.data_type())).sum(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => 1024 + 8,
            // Blobs are usually encoded images or audio.
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
                (16 << 10) + 8
            }
            _ => 64,
        }
    }
    schema
        .fields()
        .iter()
        .map(|f| width(f.data_type()))
        .sum::<usize>()
        + 8
}

/// Rows per batch for a shuffle of rows like `schema` when `partitions`
/// sorts share `memory_limit`: a batch is kept to 1/64 of a partition's
/// share, and never above the session's batch size.
pub fn shuffle_batch_rows(
    schema: &Schema,
    memory_limit: usize,
    partitions: usize,
    session_batch_size: usize,
) -> usize {
    let share = memory_limit / partitions.max(1) / 64;
    (share / estimated_row_bytes(schema))
        .clamp(MIN_BATCH_ROWS, session_batch_size.max(MIN_BATCH_ROWS))
}

/// The root of a global `SHUFFLE`: runs its subtree with the shuffle's
/// batch size and passes its one ordered stream on (or, ranged, one key
/// range per partition, read in turn). Module docs: the plans it roots.
#[derive(Debug)]
pub struct ShuffleMergeExec {
    /// The key → sort → merge → projection subtree.
    input: Arc<dyn ExecutionPlan>,
    /// The seed.
    seed: u64,
    /// The epoch.
    epoch: u64,
    /// Batch size the subtree runs with.
    batch_rows: usize,
    /// Whether its input partitions are key ranges in order (the parallel
    /// final stage, see `range.rs`): then it keeps them, and reading its
    /// output partitions in turn gives the shuffle order.
    ranged: bool,
    /// With `ranged`: the shuffle was planned for unique rows (no copy
    /// stage), and a repeated row fails the task (`unique.rs`).
    unique_rows: bool,
    /// With `unique_rows`: which columns make two rows copies.
    copies: CopyIdentity,
}

impl ShuffleMergeExec {
    /// Wraps a planned shuffle subtree.
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        seed: u64,
        epoch: u64,
        batch_rows: usize,
    ) -> Self {
        Self {
            input,
            seed,
            epoch,
            batch_rows: batch_rows.max(1),
            ranged: false,
            unique_rows: false,
            copies: CopyIdentity::Values,
        }
    }

    /// Tells repeated rows apart by `copies` (see [`CopyIdentity`]).
    pub fn with_copies(mut self, copies: CopyIdentity) -> Self {
        self.copies = copies;
        self
    }

    /// Which columns make two rows copies.
    pub fn copies(&self) -> CopyIdentity {
        self.copies
    }

    /// This ranged shuffle planned for unique rows: a repeated row fails the
    /// task with [`super::REPEATED_ROWS`].
    pub fn unique_rows(mut self, unique_rows: bool) -> Self {
        self.unique_rows = unique_rows;
        self
    }

    /// Whether a repeated row fails the task.
    pub fn is_unique_rows(&self) -> bool {
        self.unique_rows
    }

    /// This shuffle over key ranges, one per input partition, in order.
    pub fn ranged(mut self, ranged: bool) -> Self {
        self.ranged = ranged;
        self
    }

    /// Whether its output partitions are key ranges in order.
    pub fn is_ranged(&self) -> bool {
        self.ranged
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Rows per batch of the subtree.
    pub fn batch_rows(&self) -> usize {
        self.batch_rows
    }
}

impl DisplayAs for ShuffleMergeExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let mut settings: Vec<Setting> = vec![
            ("seed", &self.seed),
            ("epoch", &self.epoch),
            ("batch_rows", &self.batch_rows),
        ];
        if self.ranged {
            settings.push(("ranged", &true));
        }
        if self.unique_rows {
            settings.push(("unique_rows", &true));
        }
        crate::exec::fmt_settings(f, t, "ShuffleMergeExec", &settings)
    }
}

impl ExecutionPlan for ShuffleMergeExec {
    crate::exec::one_input_operator! {
        name: "ShuffleMergeExec",
        properties: passed_through,
        rebuild: |this, child| {
            Ok(Self::new(child, this.seed, this.epoch, this.batch_rows)
                .ranged(this.ranged)
                .unique_rows(this.unique_rows)
                .with_copies(this.copies))
        },
    }

    // The merged stream is the shuffle order: the optimizer must neither
    // split it (round-robin repartitioning) nor expect more partitions.
    crate::exec::keeps_input_order!();

    fn required_input_distribution(&self) -> Vec<Distribution> {
        if self.ranged {
            // One key range per partition, read in turn by the consumer.
            vec![Distribution::UnspecifiedDistribution]
        } else {
            vec![Distribution::SinglePartition]
        }
    }

    /// Over a merge of sorted runs (the stage-shaped plan, whose input still
    /// carries the key column) the key order is what this operator exists
    /// for: requiring it keeps the optimizer from swapping the merge for an
    /// unordered coalesce. Over [`super::PermuteExec`] the key is gone and
    /// the order is the operator's own.
    fn required_input_ordering(&self) -> Vec<Option<OrderingRequirements>> {
        let schema = self.input.schema();
        let key = schema
            .fields()
            .iter()
            .position(|f| f.name() == super::SHUFFLE_KEY_COLUMN);
        vec![key.and_then(|index| {
            let key: Arc<dyn PhysicalExpr> =
                Arc::new(Column::new(super::SHUFFLE_KEY_COLUMN, index));
            LexOrdering::new([PhysicalSortExpr::new(key, SortOptions::default())])
                .map(OrderingRequirements::from)
        })]
    }

    crate::exec::statistics_of_one_input!(first_input_statistics);

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let config = ctx
            .session_config()
            .clone()
            .with_batch_size(self.batch_rows);
        let ctx = TaskContext::new(
            ctx.task_id(),
            ctx.session_id(),
            config,
            ctx.scalar_functions().clone(),
            ctx.higher_order_functions().clone(),
            ctx.aggregate_functions().clone(),
            ctx.window_functions().clone(),
            ctx.runtime_env(),
        );
        let stream = self.input.execute(partition, Arc::new(ctx))?;
        if self.unique_rows {
            super::unique::refuse_repeated_rows(stream, self.copies)
        } else {
            Ok(stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Field;

    #[test]
    fn batches_shrink_with_the_budget_and_wide_rows() {
        let narrow = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        let wide = Schema::new(vec![Field::new_list(
            "tokens",
            Field::new_list_field(DataType::Int32, true),
            false,
        )]);
        assert_eq!(shuffle_batch_rows(&narrow, 1 << 30, 2, 8192), 8192);
        let small = shuffle_batch_rows(&wide, 20 << 20, 2, 8192);
        assert!((MIN_BATCH_ROWS..8192).contains(&small), "{small}");
        assert!(shuffle_batch_rows(&wide, 1 << 20, 8, 8192) == MIN_BATCH_ROWS);
    }
}
