//! Rows of an epoch shuffled by position (`SHUFFLE BY POSITION`), by
//! position: row `i` is the row of canonical rank `π(i)`, read with its row
//! group up to the shuffle, then through what the query computes above the
//! shuffle, alone.
//!
//! ```text
//!  the epoch's plan:   above (late functions) ─► PositionShuffleExec ─► input
//!  positions i, j, …   ─► ranks π(i), π(j), …   (IndexPermutation, no read)
//!                      ─► their row groups      (RankedRowGroups, counted once)
//!                      ─► each row group read once, or found among those kept,
//!                         or (few of its rows asked, no filter) the rows
//!                         alone: the pages holding them, not kept
//!                      ─► the rows gathered in the order asked
//!                      ─► above, over a memory source of those rows in place
//!                         of the shuffle
//! ```
//!
//! # Memory
//! The row groups read last are kept (their rows as the shuffle holds them)
//! up to [`HELD_BYTES`] and what the session's memory pool grants, the
//! oldest dropped first; the last one read is always kept. A batch of
//! positions holds the row groups it falls in while it is gathered. Row
//! groups are read `target_partitions` at a time, each on a task of its
//! own (the dataset's runtime has a thread per core).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::concat_batches;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{internal_datafusion_err, internal_err, plan_err};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_plan::ExecutionPlan;
use futures::{StreamExt, TryStreamExt};

use super::EpochQuery;
use crate::feed::on_runtime;
use crate::shuffle::{IndexPermutation, PositionShuffleExec, RankedRowGroups};

/// Bytes of row groups kept for the next positions.
pub(crate) const HELD_BYTES: usize = 256 << 20;

/// A row group's rows are read alone (the pages holding them) when at most
/// one in this many of them is asked for, else the row group is read whole
/// and kept.
const READ_ALONE_SHARE: u64 = 16;

/// One epoch shuffled by position; see the module docs.
pub(super) struct Positions {
    query: EpochQuery,
    /// The epoch's plan and its ranks, once planned and counted.
    planned: Mutex<Option<Arc<Planned>>>,
    /// Row groups read, the last read at the back: (number, rows).
    held: Mutex<VecDeque<(usize, RecordBatch)>>,
    /// What `held` holds, reserved from the session's pool.
    reserved: MemoryReservation,
}

/// The epoch's physical plan with what places a position in it.
struct Planned {
    plan: Arc<dyn ExecutionPlan>,
    /// The plan's `PositionShuffleExec`.
    shuffle: Arc<dyn ExecutionPlan>,
    permutation: IndexPermutation,
    groups: RankedRowGroups,
}

impl Positions {
    pub(super) fn new(query: EpochQuery) -> Self {
        let reserved = MemoryConsumer::new("EpochDataset row groups")
            .register(&query.state.runtime_env().memory_pool);
        Self {
            query,
            planned: Mutex::default(),
            held: Mutex::default(),
            reserved,
        }
    }

    /// Rows in the epoch.
    pub(super) fn len(&self, runtime: &tokio::runtime::Runtime) -> Result<u64> {
        Ok(self.planned(runtime)?.groups.len())
    }

    /// The epoch planned and its row groups counted, once.
    fn planned(&self, runtime: &tokio::runtime::Runtime) -> Result<Arc<Planned>> {
        let mut planned = self
            .planned
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(planned) = planned.as_ref() {
            return Ok(Arc::clone(planned));
        }
        let EpochQuery { state, query, rows } = self.query.clone();
        let made = on_runtime(runtime, async move {
            let plan = state.create_physical_plan(&query).await?;
            let mut found = None;
            plan.apply(|node| {
                if node.downcast_ref::<PositionShuffleExec>().is_some() {
                    found = Some(Arc::clone(node));
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
            let shuffle = found.ok_or_else(|| {
                internal_datafusion_err!(
                    "an epoch by position without a PositionShuffleExec"
                )
            })?;
            let exec = shuffle
                .downcast_ref::<PositionShuffleExec>()
                .ok_or_else(|| internal_datafusion_err!("not a PositionShuffleExec"))?;
            let (seed, epoch) = exec.seed_and_epoch();
            let groups = RankedRowGroups::read(exec, &state, &rows).await?;
            Ok(Planned {
                permutation: IndexPermutation::new(groups.len(), seed, epoch),
                plan,
                shuffle,
                groups,
            })
        })?;
        let made = Arc::new(made);
        *planned = Some(Arc::clone(&made));
        Ok(made)
    }

    /// Rows `positions` of epoch `epoch`'s order, in the order given, as one
    /// batch; an error past the end names the epoch's length.
    pub(super) fn rows(
        &self,
        runtime: &tokio::runtime::Runtime,
        epoch: u64,
        positions: &[u64],
    ) -> Result<RecordBatch> {
        let planned = self.planned(runtime)?;
        let len = planned.groups.len();
        let mut places = Vec::with_capacity(positions.len());
        for &position in positions {
            if position >= len {
                return plan_err!(
                    "row {position} of epoch {epoch} is past its end: the epoch has {len} \
                     rows (positions 0..{len})"
                );
            }
            let rank = planned.permutation.at(position);
            let place = planned.groups.locate(rank).ok_or_else(|| {
                internal_datafusion_err!("rank {rank} of {len} is in no row group")
            })?;
            places.push(place);
        }
        // Each row group's offsets asked for, rising.
        let mut by_group: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for &(group, offset) in &places {
            by_group.entry(group).or_default().push(offset);
        }
        for offsets in by_group.values_mut() {
            offsets.sort_unstable();
            offsets.dedup();
        }
        let wanted: Vec<(usize, Vec<u64>)> = by_group.into_iter().collect();
        let read = self.groups(runtime, &planned, &wanted)?;
        let mut indices = Vec::with_capacity(places.len());
        for (group, offset) in places {
            let at = wanted
                .binary_search_by_key(&group, |(number, _)| *number)
                .map_err(|_| {
                    internal_datafusion_err!("row group {group} was not read")
                })?;
            let row = match &read[at] {
                GroupRead::Whole(rows) => usize::try_from(offset)
                    .ok()
                    .filter(|&offset| offset < rows.num_rows()),
                GroupRead::Alone { offsets, .. } => offsets.binary_search(&offset).ok(),
            }
            .ok_or_else(|| {
                internal_datafusion_err!("row {offset} of a row group read shorter")
            })?;
            indices.push((at, row));
        }
        let schema = planned.shuffle.schema();
        let gathered = if indices.is_empty() {
            RecordBatch::new_empty(Arc::clone(&schema))
        } else {
            let batches: Vec<&RecordBatch> = read.iter().map(GroupRead::rows).collect();
            let gathered = crate::exec::batches::interleave_rows(&batches, &indices)?;
            // As the shuffle gives them: its schema, not its input's.
            RecordBatch::try_new_with_options(
                schema,
                gathered.columns().to_vec(),
                &RecordBatchOptions::new().with_row_count(Some(gathered.num_rows())),
            )?
        };
        let state = self.query.state.clone();
        on_runtime(
            runtime,
            async move { above(&planned, &state, gathered).await },
        )
    }

    /// Row groups `wanted`'s rows as the shuffle holds them, in that order,
    /// for the offsets each is asked for: those kept from earlier reads;
    /// the others read at once, as many at a time as the session has target
    /// partitions, each whole (and kept) or, when few of its rows are asked
    /// for and nothing under the shuffle drops rows, those rows alone (the
    /// pages holding them; not kept).
    fn groups(
        &self,
        runtime: &tokio::runtime::Runtime,
        planned: &Arc<Planned>,
        wanted: &[(usize, Vec<u64>)],
    ) -> Result<Vec<GroupRead>> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let mut found: Vec<Option<GroupRead>> = wanted
            .iter()
            .map(|(group, _)| {
                let at = held.iter().position(|(number, _)| number == group)?;
                // Asked for again: the last to go.
                let entry = held.remove(at)?;
                let rows = entry.1.clone();
                held.push_back(entry);
                Some(GroupRead::Whole(rows))
            })
            .collect();
        let starts = planned.groups.starts();
        let alone = |group: usize, offsets: &[u64]| {
            planned.groups.reads_rows_alone()
                && (offsets.len() as u64).saturating_mul(READ_ALONE_SHARE)
                    <= starts[group + 1] - starts[group]
        };
        let missing: Vec<(usize, usize, Option<Vec<u64>>)> = found
            .iter()
            .enumerate()
            .filter(|(_, rows)| rows.is_none())
            .map(|(slot, _)| {
                let (group, offsets) = &wanted[slot];
                let offsets = alone(*group, offsets).then(|| offsets.clone());
                (slot, *group, offsets)
            })
            .collect();
        if !missing.is_empty() {
            let reading = Arc::clone(planned);
            let ctx = Arc::new(TaskContext::from(&self.query.state));
            let at_once = ctx.session_config().target_partitions().max(1);
            let read: Vec<(usize, usize, GroupRead)> = on_runtime(runtime, async move {
                let groups: Vec<usize> =
                    missing.iter().map(|&(_, group, _)| group).collect();
                reading.groups.check_unchanged(&groups, &ctx).await?;
                // Each row group decoded on a task of its own.
                let reads: Vec<_> = missing
                    .into_iter()
                    .map(|(slot, group, offsets)| {
                        let reading = Arc::clone(&reading);
                        let ctx = Arc::clone(&ctx);
                        async move {
                            let read = SpawnedTask::spawn(async move {
                                Ok::<_, datafusion::error::DataFusionError>(match offsets
                                {
                                    Some(offsets) => GroupRead::Alone {
                                        rows: reading
                                            .groups
                                            .read_rows(group, &offsets, ctx)
                                            .await?,
                                        offsets,
                                    },
                                    None => GroupRead::Whole(
                                        reading.groups.read_group(group, ctx).await?,
                                    ),
                                })
                            })
                            .join()
                            .await
                            .map_err(|e| {
                                internal_datafusion_err!("reading row group {group}: {e}")
                            })??;
                            Ok::<_, datafusion::error::DataFusionError>((
                                slot, group, read,
                            ))
                        }
                    })
                    .collect();
                futures::stream::iter(reads)
                    .buffer_unordered(at_once)
                    .try_collect()
                    .await
            })?;
            let mut kept_more = false;
            for (slot, group, read) in read {
                if let GroupRead::Whole(rows) = &read {
                    held.push_back((group, rows.clone()));
                    kept_more = true;
                }
                found[slot] = Some(read);
            }
            if kept_more {
                let mut bytes: usize =
                    held.iter().map(|(_, b)| b.get_array_memory_size()).sum();
                // Up to HELD_BYTES, and what the pool grants (the last one
                // read is kept in any case: the batch being gathered needs it).
                while held.len() > 1
                    && (bytes > HELD_BYTES || self.reserved.try_resize(bytes).is_err())
                {
                    if let Some((_, oldest)) = held.pop_front() {
                        bytes -= oldest.get_array_memory_size();
                    }
                }
                if held.len() <= 1 {
                    self.reserved.resize(bytes);
                }
            }
        }
        found
            .into_iter()
            .zip(wanted)
            .map(|(rows, (group, _))| {
                rows.ok_or_else(|| {
                    internal_datafusion_err!("row group {group} was not read")
                })
            })
            .collect()
    }
}

/// What a batch of positions read of one row group.
enum GroupRead {
    /// All its rows, by offset (kept for the next positions).
    Whole(RecordBatch),
    /// Rows `offsets` (rising) alone, in that order.
    Alone {
        offsets: Vec<u64>,
        rows: RecordBatch,
    },
}

impl GroupRead {
    fn rows(&self) -> &RecordBatch {
        match self {
            Self::Whole(rows) | Self::Alone { rows, .. } => rows,
        }
    }
}

/// `rows` (as the shuffle gives them) through what the epoch's plan
/// computes above its shuffle: the plan with the shuffle replaced by a
/// memory source of those rows.
async fn above(
    planned: &Planned,
    state: &datafusion::execution::context::SessionState,
    rows: RecordBatch,
) -> Result<RecordBatch> {
    let source: Arc<dyn ExecutionPlan> = MemorySourceConfig::try_new_exec(
        &[vec![rows.clone()]],
        planned.shuffle.schema(),
        None,
    )?;
    let plan = Arc::clone(&planned.plan)
        .transform_down(|node| {
            Ok(if Arc::ptr_eq(&node, &planned.shuffle) {
                Transformed::new(Arc::clone(&source), true, TreeNodeRecursion::Jump)
            } else {
                Transformed::no(node)
            })
        })?
        .data;
    let schema = plan.schema();
    let batches =
        datafusion::physical_plan::collect(plan, Arc::new(TaskContext::from(state)))
            .await?;
    let out = concat_batches(&schema, &batches)?;
    if out.num_rows() != rows.num_rows() {
        return internal_err!(
            "{} rows by position gave {} rows above the shuffle",
            rows.num_rows(),
            out.num_rows()
        );
    }
    Ok(out)
}
