//! Physical planning of [`ShuffleNode`]s, and sqlfeed's query planner.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::compute::SortOptions;
use datafusion::common::{internal_err, not_impl_err};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNode};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::{ExecutionPlan, Partitioning};
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};
use datafusion_session::Session;

use crate::config::SqlfeedOptions;

use super::windowed::cut_to_window;
use super::{
    CopyIdentity, Deal, DealExec, KeySource, LocalShuffleExec, PermuteExec, PermuteMode,
    PositionKeyExec, PositionShuffleExec, RANGE_BUCKET_COLUMN, RANK_ROUTE_COLUMN,
    RangeBucketExec, RankShardExec, SHUFFLE_KEY_COLUMN, ShuffleKey, ShuffleKeyExec,
    ShuffleMergeExec, ShuffleNode, ShuffleSpec, StoredOrderExec, WindowedShuffleExec,
    shuffle_batch_rows, with_positions,
};
use datafusion::common::internal_datafusion_err;
use datafusion::execution::memory_pool::MemoryLimit;

/// Turns [`ShuffleNode`] into the operators drawn in the [module docs](super).
#[derive(Debug, Default, Clone, Copy)]
pub struct ShuffleExtensionPlanner {
    /// Plan global shuffles with [`plan_sorted_shuffle`], whose sorts and
    /// merge a distributed engine runs as separate stages, instead of the
    /// single-machine [`PermuteExec`].
    stage_shaped: bool,
}

impl ShuffleExtensionPlanner {
    /// The planner of the embedded engine ([`PermuteExec`]).
    pub fn embedded() -> Self {
        Self {
            stage_shaped: false,
        }
    }

    /// The planner of a Ballista scheduler ([`plan_sorted_shuffle`]).
    pub fn stage_shaped() -> Self {
        Self { stage_shaped: true }
    }
}

/// Rows per batch for a shuffle of `input` (see [`shuffle_batch_rows`]).
fn batch_rows_for(
    input: &Arc<dyn ExecutionPlan>,
    memory_limit: usize,
    session_batch_size: usize,
) -> usize {
    shuffle_batch_rows(
        &input.schema(),
        memory_limit,
        input.properties().partitioning.partition_count(),
        session_batch_size,
    )
}

/// The global shuffle on one machine: key (content hashes from `source`),
/// then [`PermuteExec`] (index sort and gather, spilling sorted runs), under
/// a [`ShuffleMergeExec`] whose batch size fits `memory_limit`.
///
/// With `carry`, expressions over `input`'s columns computed from each keyed
/// row before the permutation, the permutation moves their columns instead
/// of `input`'s. The order is the key's, so it does not change. What it
/// saves is the gather: a permutation costs a random read per row *and
/// column*, and a row that enters its functions as 32 float columns leaves
/// them as one vector (measured on the largest source of a 3-source mixture
/// of the W2 feed, 600k rows: 2.3 s of permutation with 36 columns, 1.8 s
/// with the 5 they become).
pub fn plan_global_shuffle(
    input: Arc<dyn ExecutionPlan>,
    shuffle: GlobalShuffle,
) -> Result<Arc<dyn ExecutionPlan>> {
    let (seed, epoch) = (shuffle.seed, shuffle.epoch);
    let KeyedRows {
        plan: keyed,
        copies,
        batch_rows,
        ..
    } = key_rows(input, shuffle)?;
    let permuted: Arc<dyn ExecutionPlan> =
        Arc::new(PermuteExec::try_new(keyed)?.with_copies(copies)?);
    Ok(Arc::new(ShuffleMergeExec::new(
        permuted, seed, epoch, batch_rows,
    )))
}

/// A global shuffle's order and what it moves: what [`plan_global_shuffle`]
/// and [`plan_sorted_shuffle`], two plans of the same order, both take.
#[derive(Debug, Clone)]
pub struct GlobalShuffle {
    /// What the content key hashes.
    pub source: KeySource,
    pub seed: u64,
    pub epoch: u64,
    /// The session's memory limit, which the permutation's and merge's
    /// batches are sized against (with `session_batch_size`).
    pub memory_limit: usize,
    pub session_batch_size: usize,
    /// Expressions over the input's columns whose outputs the shuffle moves
    /// instead of those columns (see [`plan_global_shuffle`]).
    pub carry: Option<Outputs>,
}

impl GlobalShuffle {
    /// The plan of this shuffle over `input`: stage-shaped, ending with
    /// `final_stage` (a cluster's), or one machine's.
    pub fn plan(
        self,
        input: Arc<dyn ExecutionPlan>,
        final_stage: Option<FinalStage>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match final_stage {
            Some(final_stage) => plan_sorted_shuffle(input, self, final_stage),
            None => plan_global_shuffle(input, self),
        }
    }
}

/// Expressions and the names of the columns they compute.
type Outputs = Vec<(Arc<dyn PhysicalExpr>, String)>;

/// A shuffle's input keyed by content, as the permutation takes it.
struct KeyedRows {
    /// The shuffled columns, then the key.
    plan: Arc<dyn ExecutionPlan>,
    /// How many columns come before the key.
    columns: usize,
    /// Which of those columns make two rows copies.
    copies: CopyIdentity,
    /// Rows per batch of the permutation and merge, sized for the rows they
    /// move: the input's, or with `carry` the outputs'.
    batch_rows: usize,
}

/// `input` keyed by its content (the shuffle's `source`, seed and epoch),
/// and with `carry`'s outputs in place of its columns (see [`carry_keyed`]).
fn key_rows(input: Arc<dyn ExecutionPlan>, shuffle: GlobalShuffle) -> Result<KeyedRows> {
    let GlobalShuffle {
        source,
        seed,
        epoch,
        memory_limit,
        session_batch_size,
        carry,
    } = shuffle;
    let columns = input.schema().fields().len();
    let carrying = carry.is_some();
    let copies = carried_copy_identity(CopyIdentity::of(&source), carry.as_deref());
    let input_batch_rows = batch_rows_for(&input, memory_limit, session_batch_size);
    let keyed: Arc<dyn ExecutionPlan> =
        Arc::new(ShuffleKeyExec::try_new(input, seed, epoch)?.with_source(source)?);
    let (plan, columns) = carry_keyed(keyed, carry, columns)?;
    let batch_rows = if carrying {
        batch_rows_for(&plan, memory_limit, session_batch_size)
    } else {
        input_batch_rows
    };
    Ok(KeyedRows {
        plan,
        columns,
        copies,
        batch_rows,
    })
}

/// The copy identity of the input's rows after `carry` replaced its columns:
/// a content hash column carried as it is keeps telling copies apart (at its
/// new position); otherwise the carried values do.
fn carried_copy_identity(
    copies: CopyIdentity,
    carry: Option<&[(Arc<dyn PhysicalExpr>, String)]>,
) -> CopyIdentity {
    let (CopyIdentity::ContentHash(index), Some(carry)) = (copies, carry) else {
        return copies;
    };
    carry
        .iter()
        .position(|(expr, _)| {
            expr.downcast_ref::<Column>()
                .is_some_and(|column| column.index() == index)
        })
        .map_or(CopyIdentity::Values, CopyIdentity::ContentHash)
}

/// `keyed` (the input's `columns` columns, then the key) with `carry`'s
/// outputs in place of the input's columns; and how many columns come
/// before the key, which stays last, where the permutation finds it.
fn carry_keyed(
    keyed: Arc<dyn ExecutionPlan>,
    carry: Option<Outputs>,
    columns: usize,
) -> Result<(Arc<dyn ExecutionPlan>, usize)> {
    let Some(mut carry) = carry else {
        return Ok((keyed, columns));
    };
    let carried = carry.len();
    carry.push((
        Arc::new(Column::new(SHUFFLE_KEY_COLUMN, columns)),
        SHUFFLE_KEY_COLUMN.to_string(),
    ));
    Ok((Arc::new(ProjectionExec::try_new(carry, keyed)?), carried))
}

/// How the session's options ask a stage-shaped shuffle to end: in one
/// merge, or in the session's partitions as ordered key ranges, dealt to
/// ranks or planned for unique rows when asked.
fn requested_final_stage(session: &dyn Session) -> FinalStage {
    let options = crate::config::SqlfeedOptions::of(session.config().options());
    let ranges = if options.ordered_result_partitions {
        session.config().target_partitions()
    } else {
        1
    };
    FinalStage {
        ranges,
        deal: Deal::requested(options).filter(|_| ranges >= 2),
        unique_rows: options.assume_unique_rows,
    }
}

/// How a stage-shaped shuffle ends (see [`plan_sorted_shuffle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinalStage {
    /// Key ranges sorted in parallel; below 2, one task merges all.
    pub ranges: usize,
    /// With ranges: the rows dealt to ranks (`deal.rs`).
    pub deal: Option<Deal>,
    /// With ranges: plan for unique rows, without the copy stage; a repeated
    /// row fails the job (`unique.rs`).
    pub unique_rows: bool,
}

impl FinalStage {
    /// One task merging every sorted run.
    pub fn merge() -> Self {
        Self {
            ranges: 1,
            deal: None,
            unique_rows: false,
        }
    }

    /// One task per key range (a single range is the merge).
    pub fn ranged(ranges: usize) -> Self {
        Self {
            ranges,
            deal: None,
            unique_rows: false,
        }
    }

    /// The ranges planned for unique rows (`unique.rs`).
    pub fn unique_rows(self, unique_rows: bool) -> Self {
        Self {
            unique_rows,
            ..self
        }
    }

    /// The ranges, dealt to ranks as `deal` says.
    pub fn dealt(self, deal: Deal) -> Self {
        Self {
            deal: Some(deal),
            ..self
        }
    }
}

/// The same order as [`plan_global_shuffle`] with stage-shaped operators:
/// key, hash exchange on the content key (every copy of a row lands in one
/// partition, where its copies can be numbered), [`PermuteExec`] per
/// partition (copies spread, the final key kept), order-preserving merge by
/// the final key (under [`ShuffleMergeExec`]), drop the key. This is the plan
/// distributed execution cuts into stages (the exchange and the
/// per-partition permutations on executors, the merge on the final stage).
///
/// With `ranges` of 2 or more, the final stage is parallel instead: after the
/// per-partition permutation a [`RangeBucketExec`] routes every row to the
/// partition owning its key's range, a second hash exchange moves it there,
/// and a [`PermuteMode::Ranged`] sort per partition under a ranged
/// [`ShuffleMergeExec`] gives `ranges` output partitions whose concatenation in
/// partition order is the same order (see `range.rs`).
///
/// With `carry`, the shuffle moves its outputs, computed from each keyed
/// row, instead of the input's columns (as [`plan_global_shuffle`] does;
/// the order is the same). They are computed on the tasks that key the
/// rows, before the exchange, which then moves what they produce.
pub fn plan_sorted_shuffle(
    input: Arc<dyn ExecutionPlan>,
    shuffle: GlobalShuffle,
    final_stage: FinalStage,
) -> Result<Arc<dyn ExecutionPlan>> {
    let (seed, epoch) = (shuffle.seed, shuffle.epoch);
    let FinalStage {
        ranges,
        deal,
        unique_rows,
    } = final_stage;
    let unique_rows = unique_rows && ranges >= 2;
    let partitions = input.properties().partitioning.partition_count().max(1);
    let KeyedRows {
        plan: keyed,
        columns,
        copies,
        batch_rows,
    } = key_rows(input, shuffle)?;
    let key: Arc<dyn PhysicalExpr> = Arc::new(Column::new(SHUFFLE_KEY_COLUMN, columns));
    // The copy stage: every copy of a row in one task, numbered, sorted.
    // Planned for unique rows, rows go from the scan to their range.
    let permuted: Arc<dyn ExecutionPlan> = if unique_rows {
        keyed
    } else {
        let exchanged: Arc<dyn ExecutionPlan> = Arc::new(RepartitionExec::try_new(
            keyed,
            Partitioning::Hash(vec![key], partitions),
        )?);
        Arc::new(
            PermuteExec::try_new_with_mode(exchanged, PermuteMode::PerPartition)?
                .with_copies(copies)?,
        )
    };
    let final_stage = FinalStage {
        ranges,
        deal,
        unique_rows,
    };
    sorted_ranges(
        permuted,
        (seed, epoch),
        columns,
        batch_rows,
        copies,
        final_stage,
    )
}

/// The stage-shaped shuffle after its key: `permuted`'s rows (`columns`
/// columns, then the key; with fewer than 2 ranges each partition sorted by
/// key) in `final_stage`'s key ranges, each sorted in a task of its own and
/// dealt to ranks when asked, or merged by one task; the key dropped.
fn sorted_ranges(
    permuted: Arc<dyn ExecutionPlan>,
    (seed, epoch): (u64, u64),
    columns: usize,
    batch_rows: usize,
    copies: CopyIdentity,
    final_stage: FinalStage,
) -> Result<Arc<dyn ExecutionPlan>> {
    let FinalStage {
        ranges,
        deal,
        unique_rows,
    } = final_stage;
    let key: Arc<dyn PhysicalExpr> = Arc::new(Column::new(SHUFFLE_KEY_COLUMN, columns));
    let ordering = LexOrdering::new([PhysicalSortExpr::new(
        Arc::clone(&key),
        SortOptions::default(),
    )])
    .ok_or_else(|| internal_datafusion_err!("empty shuffle ordering"))?;
    let shuffled: Arc<dyn ExecutionPlan> = if ranges >= 2 {
        let bucketed: Arc<dyn ExecutionPlan> = Arc::new(
            RangeBucketExec::try_new_counted(permuted, ranges, deal.is_some())?,
        );
        let bucket_index = bucketed.schema().index_of(RANGE_BUCKET_COLUMN)?;
        let bucket: Arc<dyn PhysicalExpr> =
            Arc::new(Column::new(RANGE_BUCKET_COLUMN, bucket_index));
        let exchanged: Arc<dyn ExecutionPlan> = Arc::new(RepartitionExec::try_new(
            bucketed,
            Partitioning::Hash(vec![bucket], ranges),
        )?);
        let sorted: Arc<dyn ExecutionPlan> = Arc::new(PermuteExec::try_new_with_mode(
            exchanged,
            PermuteMode::Ranged,
        )?);
        let shuffled: Arc<dyn ExecutionPlan> = Arc::new(
            ShuffleMergeExec::new(sorted, seed, epoch, batch_rows)
                .ranged(true)
                .unique_rows(unique_rows)
                .with_copies(copies),
        );
        match deal {
            None => shuffled,
            Some(deal) => {
                // Each rank's rows to partitions of their own (`deal.rs`).
                let dealt = Arc::new(DealExec::try_new(shuffled, deal, ranges)?);
                let partitions = dealt.partitions();
                let route: Arc<dyn PhysicalExpr> = Arc::new(Column::new(
                    RANK_ROUTE_COLUMN,
                    dealt.schema().fields().len() - 1,
                ));
                let exchanged: Arc<dyn ExecutionPlan> =
                    Arc::new(RepartitionExec::try_new(
                        dealt,
                        Partitioning::Hash(vec![route], partitions),
                    )?);
                Arc::new(RankShardExec::try_new(exchanged)?)
            }
        }
    } else {
        let merged: Arc<dyn ExecutionPlan> =
            Arc::new(SortPreservingMergeExec::new(ordering, permuted));
        // ShuffleMergeExec sits right on the merge and requires the key order of
        // its input, so no optimizer pass may replace the merge with an
        // unordered coalesce when nothing above asks for an order (the key is
        // dropped above it, where no ordering on it can be stated).
        Arc::new(ShuffleMergeExec::new(merged, seed, epoch, batch_rows))
    };
    let schema = shuffled.schema();
    let projection: Vec<(Arc<dyn PhysicalExpr>, String)> = schema
        .fields()
        .iter()
        .take(columns)
        .enumerate()
        .map(|(i, f)| {
            (
                Arc::new(Column::new(f.name(), i)) as Arc<dyn PhysicalExpr>,
                f.name().clone(),
            )
        })
        .collect();
    Ok(Arc::new(ProjectionExec::try_new(projection, shuffled)?))
}

/// `shuffle`'s key resolved against its physical input.
fn key_source(
    shuffle: &ShuffleNode,
    input: &Arc<dyn ExecutionPlan>,
) -> Result<KeySource> {
    let schema = input.schema();
    let index = |name: &String| {
        schema.index_of(name).map_err(|_| {
            internal_datafusion_err!(
                "Shuffle key column '{name}' is missing from the physical input ({})",
                crate::exec::column_names(&schema)
            )
        })
    };
    Ok(match shuffle.key() {
        ShuffleKey::AllColumns => KeySource::AllColumns,
        ShuffleKey::Columns(names) => {
            KeySource::Columns(names.iter().map(index).collect::<Result<Vec<_>>>()?)
        }
        ShuffleKey::ContentHash(name) => KeySource::ContentHash(index(name)?),
        ShuffleKey::StoredOrder(_) => {
            return internal_err!("a shuffle by content keyed by a stored order");
        }
    })
}

/// The input of a shuffle by position planned again from `logical`, each
/// row with its file and row index from the scan as its last two columns
/// (the planned input has no such columns).
async fn plan_positioned_input(
    planner: &dyn PhysicalPlanner,
    logical: &LogicalPlan,
    session: &dyn Session,
) -> Result<Arc<dyn ExecutionPlan>> {
    let positioned = with_positions(logical.clone())?;
    let input = if SqlfeedOptions::of(session.config().options()).isolate_row_errors {
        // Failing rows are isolated above the shuffle, in the outer plan's
        // output projections (their slots keep their positions; the feed
        // fills them). Planned here, the input would isolate its own: a
        // marker column after the two position columns.
        let Some(state) = session.as_any().downcast_ref::<SessionState>() else {
            return not_impl_err!(
                "SHUFFLE BY POSITION isolates failing rows only in a sqlfeed session; \
                 turn sqlfeed.isolate_row_errors off, or use SHUFFLE"
            );
        };
        let mut config = state.config().clone();
        let mut options = SqlfeedOptions::of(config.options()).clone();
        options.isolate_row_errors = false;
        config.options_mut().extensions.insert(options);
        let state = SessionStateBuilder::new_from_existing(state.clone())
            .with_config(config)
            .build();
        planner.create_physical_plan(&positioned, &state).await?
    } else {
        planner.create_physical_plan(&positioned, session).await?
    };
    if crate::exec::row_errors::has_row_errors(&input.schema()) {
        return internal_err!(
            "SHUFFLE BY POSITION's input isolates row errors under the shuffle"
        );
    }
    // On a scheduler the input went through its last rule too, which
    // carries scans reading row indexes for the wire: the outer plan cuts
    // and places this input's scan, and carries it at its own end.
    let input = crate::exec::row_index::uncarried(input)?;
    Ok(input)
}

/// A shuffle by position, stage-shaped (a cluster's): each row keyed by
/// its position ([`PositionKeyExec`], its row groups placed from the
/// footers or counted by a query over `rows` in `state`), then the key
/// ranges of `SHUFFLE`'s final stage. No two rows share a key, so there
/// is no copy stage.
async fn plan_position_ranges(
    input: Arc<dyn ExecutionPlan>,
    (seed, epoch): (u64, u64),
    state: &SessionState,
    rows: &LogicalPlan,
    final_stage: FinalStage,
) -> Result<Arc<dyn ExecutionPlan>> {
    let memory_limit = match state.runtime_env().memory_pool.memory_limit() {
        MemoryLimit::Finite(bytes) => bytes,
        _ => usize::MAX / 2,
    };
    // Under a filter a row group's rows are ranked by counting them in
    // order in one task, so no round-robin repartition may come under the
    // filter: Ballista 55 removes them from distributed plans, and plans
    // every job in a session with them turned off (its session manager
    // overrides `enable_round_robin_repartition`), where each stage's input
    // is planned again.
    let keyed: Arc<dyn ExecutionPlan> = Arc::new(
        PositionKeyExec::plan(input, (seed, epoch), final_stage.ranges, state, rows)
            .await?,
    );
    let columns = keyed.schema().fields().len() - 1;
    let batch_rows = batch_rows_for(&keyed, memory_limit, state.config().batch_size());
    let permuted: Arc<dyn ExecutionPlan> = if final_stage.ranges >= 2 {
        keyed
    } else {
        // One task merges: each partition sorted by key first.
        let key: Arc<dyn PhysicalExpr> =
            Arc::new(Column::new(SHUFFLE_KEY_COLUMN, columns));
        let ordering =
            LexOrdering::new([PhysicalSortExpr::new(key, SortOptions::default())])
                .ok_or_else(|| internal_datafusion_err!("empty shuffle ordering"))?;
        Arc::new(SortExec::new(ordering, keyed).with_preserve_partitioning(true))
    };
    let final_stage = FinalStage {
        unique_rows: false,
        ..final_stage
    };
    sorted_ranges(
        permuted,
        (seed, epoch),
        columns,
        batch_rows,
        CopyIdentity::Values,
        final_stage,
    )
}

#[async_trait]
impl ExtensionPlanner for ShuffleExtensionPlanner {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(shuffle) = node.as_any().downcast_ref::<ShuffleNode>() else {
            return Ok(None);
        };
        let [input] = physical_inputs else {
            return internal_err!("Shuffle has one input, got {}", physical_inputs.len());
        };
        let plan = match shuffle.spec() {
            spec @ (ShuffleSpec::Global { seed, epoch }
            | ShuffleSpec::Windowed { seed, epoch, .. }) => {
                // The whole epoch window by window (one machine), or one
                // window's rows shuffled alone (a job per window).
                let (windowed, input) = match spec {
                    ShuffleSpec::Windowed {
                        window_rows,
                        only_window: Some(window),
                        ..
                    } => (
                        None,
                        cut_to_window(
                            Arc::clone(input),
                            (seed, epoch, window_rows),
                            window,
                            session.runtime_env(),
                        )
                        .await?,
                    ),
                    ShuffleSpec::Windowed { window_rows, .. } if self.stage_shaped => {
                        return not_impl_err!(
                            "SHUFFLE WINDOW {window_rows} over a whole epoch runs on the \
                             embedded engine; a cluster feed runs one job per window, and \
                             a cluster query uses SHUFFLE"
                        );
                    }
                    ShuffleSpec::Windowed { window_rows, .. } => {
                        (Some(window_rows), Arc::clone(input))
                    }
                    _ => (None, Arc::clone(input)),
                };
                let memory_limit = match session.runtime_env().memory_pool.memory_limit()
                {
                    MemoryLimit::Finite(bytes) => bytes,
                    _ => usize::MAX / 2,
                };
                let global = GlobalShuffle {
                    source: key_source(shuffle, &input)?,
                    seed,
                    epoch,
                    memory_limit,
                    session_batch_size: session.config().batch_size(),
                    carry: None,
                };
                let final_stage =
                    self.stage_shaped.then(|| requested_final_stage(session));
                let shuffled = global.plan(input, final_stage)?;
                match windowed {
                    Some(window_rows) => Arc::new(WindowedShuffleExec::try_new(
                        shuffled,
                        seed,
                        epoch,
                        window_rows,
                    )?),
                    None => shuffled,
                }
            }
            ShuffleSpec::Positional { .. }
                if self.stage_shaped
                    && matches!(shuffle.key(), ShuffleKey::StoredOrder(_)) =>
            {
                return Err(super::refused_by_position_on_a_cluster());
            }
            ShuffleSpec::Positional { seed, epoch } if self.stage_shaped => {
                let [logical] = logical_inputs else {
                    return internal_err!("Shuffle has one input");
                };
                let Some(state) = session.as_any().downcast_ref::<SessionState>() else {
                    return not_impl_err!(
                        "SHUFFLE BY POSITION on a cluster is planned by a sqlfeed scheduler"
                    );
                };
                let input = plan_positioned_input(planner, logical, session).await?;
                plan_position_ranges(
                    input,
                    (seed, epoch),
                    state,
                    logical,
                    requested_final_stage(session),
                )
                .await?
            }
            ShuffleSpec::Positional { seed, epoch }
                if let ShuffleKey::StoredOrder(stored) = *shuffle.key() =>
            {
                // Rows stored in epoch `stored`'s order (an epoch cache):
                // ranked by where they come in the lanes the feed read them
                // in, turns of the session's batch size.
                let lanes = Arc::new(crate::exec::lanes::LaneInterleaveExec::new(
                    Arc::clone(input),
                    session.config().batch_size(),
                ));
                let ordered = Arc::new(StoredOrderExec::try_new(lanes)?);
                Arc::new(PositionShuffleExec::over_stored_order(
                    ordered, seed, epoch, stored,
                )?)
            }
            ShuffleSpec::Positional { seed, epoch } => {
                let [logical] = logical_inputs else {
                    return internal_err!("Shuffle has one input");
                };
                let input = plan_positioned_input(planner, logical, session).await?;
                let shuffle = PositionShuffleExec::try_new(input, seed, epoch)?;
                // What counts a filter's rows (its columns only) if the
                // epoch does not fit and is spilled.
                match session.as_any().downcast_ref::<SessionState>() {
                    Some(state) => {
                        Arc::new(shuffle.with_counting(state.clone(), (*logical).clone()))
                    }
                    None => Arc::new(shuffle),
                }
            }
            ShuffleSpec::Local { buffer_rows, seed } => {
                Arc::new(LocalShuffleExec::new(Arc::clone(input), buffer_rows, seed))
            }
        };
        Ok(Some(plan))
    }
}
