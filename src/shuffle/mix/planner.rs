//! Physical planning of [`MixNode`]s: count the sources, size their shares,
//! and plan each share's passes as global shuffles under a [`MixExec`] (or,
//! with `WINDOW n`, as windowed shuffles: see "Passes in windows" in
//! [`super`]).
//!
//! # Late row functions
//! A source's passes shuffle its rows as they enter its row-wise functions
//! (any deterministic expression that is more than a column or a literal),
//! keyed on those values, the key a `SHUFFLE` of the same query uses
//! (`crate::shuffle::late`). The order is the same wherever the functions
//! run, so the epoch cache can keep those rows (`crate::feed`'s
//! `mixture.rs`), and each function runs where it costs least:
//! - costly ones (decoding, tokenizing) on the rows the window takes, in a
//!   `ProjectionExec` above it (parallel workers): a down-sampled source is
//!   decoded only where it is used;
//! - cheap ones right after the key, before the permutation, which then
//!   gathers their outputs (one vector) rather than their inputs (32 float
//!   columns): `early_and_late`.
//!
//! Each pass runs the source's plan with state of its own
//! (`reset_plan_states`): a scan's queue of files for work stealing is per
//! plan instance.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::common::plan_datafusion_err;
use datafusion::common::plan_err;
use datafusion::common::stats::Precision;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::functions_aggregate::count::count;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    LogicalPlan, LogicalPlanBuilder, UserDefinedLogicalNode, lit,
};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::physical_planner::{ExtensionPlanner, PhysicalPlanner};
use datafusion_session::Session;

use super::exec::{MixExec, MixSource};
use super::logical::MixNode;
use super::pattern::{Interleave, Schedule, ScheduledMix, Turns, Window, quotas};
use super::source_seed;
use super::window::MixWindowExec;
use crate::exec::calls_costly_function;
use crate::shuffle::late::{RowFunctionsSplit, split_row_functions};
use crate::shuffle::{
    FinalStage, GlobalShuffle, KeySource, WindowedShuffleExec, why_not_windowable,
    window_rows,
};

/// Turns [`MixNode`] into the plan drawn in `exec.rs`.
#[derive(Debug, Default, Clone, Copy)]
pub struct MixExtensionPlanner {
    /// A cluster's scheduler plans here: each pass is a stage-shaped
    /// shuffle (`plan_sorted_shuffle`), whose sorts run on executors.
    stage_shaped: bool,
}

impl MixExtensionPlanner {
    /// The planner of the embedded engine.
    pub fn embedded() -> Self {
        Self {
            stage_shaped: false,
        }
    }

    /// The planner of a Ballista scheduler.
    pub fn stage_shaped() -> Self {
        Self { stage_shaped: true }
    }
}

/// The rows `logical` gives: exact statistics when the plan has them (a
/// Parquet scan without filters), else a `count(*)` query, which reads only
/// the columns the source's filters need.
async fn count_rows(
    logical: &LogicalPlan,
    physical: &Arc<dyn ExecutionPlan>,
    session: &dyn Session,
) -> Result<u64> {
    // The context is not `Send`: it is gone before the first await.
    let known = {
        let context = StatisticsContext::new();
        context
            .compute(physical.as_ref(), &StatisticsArgs::new())?
            .num_rows
    };
    if let Precision::Exact(rows) = known {
        return Ok(rows as u64);
    }
    let counting = LogicalPlanBuilder::from(logical.clone())
        .aggregate(
            Vec::<datafusion::logical_expr::Expr>::new(),
            vec![count(lit(1))],
        )?
        .build()?;
    let plan = session.create_physical_plan(&counting).await?;
    let batches = collect(plan, session.task_ctx()).await?;
    crate::exec::counted_rows(&batches, "a mixture source")
}

/// A source's rows as they enter its row-wise functions, and the functions.
struct SourceRows {
    /// The rows, logical (counted) and physical (shuffled by each pass).
    logical: LogicalPlan,
    physical: Arc<dyn ExecutionPlan>,
    /// The source's output columns over `physical`'s; `None`: it has no
    /// functions to run late, `physical` is its output.
    finish: Option<Vec<(Arc<dyn PhysicalExpr>, String)>>,
}

/// Splits source `logical` (planned as `physical`) where its row-wise
/// functions can run on its window's rows alone; see the module docs.
async fn source_rows(
    logical: &LogicalPlan,
    physical: &Arc<dyn ExecutionPlan>,
    session: &dyn Session,
) -> Result<SourceRows> {
    let split = match logical {
        LogicalPlan::Projection(projection) => {
            split_row_functions(projection, |_| false)?
        }
        _ => None,
    };
    let Some(RowFunctionsSplit { below, outputs }) = split else {
        return Ok(SourceRows {
            logical: logical.clone(),
            physical: Arc::clone(physical),
            finish: None,
        });
    };
    let below = LogicalPlan::Projection(below);
    let finish = outputs
        .into_iter()
        .zip(logical.schema().fields())
        .map(|(expr, field)| {
            let expr = expr.unalias_nested().data;
            Ok((
                session.create_physical_expr(expr, below.schema())?,
                field.name().clone(),
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(SourceRows {
        physical: session.create_physical_plan(&below).await?,
        logical: below,
        finish: Some(finish),
    })
}

/// Expressions and the names of the columns they compute.
type Outputs = Vec<(Arc<dyn PhysicalExpr>, String)>;

/// A source's outputs (`finish`, over its rows as they enter its functions)
/// split by where they run: what each pass computes before its permutation
/// (cheap functions and bare columns, plus the columns the costly ones
/// read), and what runs on the window's rows over those columns (the
/// costly functions, see [`calls_costly_function`]). `(None, Some(finish))`
/// when every function is costly, or when a column the costly functions
/// read would clash by name with a cheap output; `(Some(finish), None)`
/// when none is.
///
/// Cheap functions run on every row of a pass, the rows the window skips
/// included; what they save is the permutation's gather, one random read
/// per row and column (see [`crate::shuffle::plan_global_shuffle`]).
fn early_and_late(finish: Outputs) -> Result<(Option<Outputs>, Option<Outputs>)> {
    crate::shuffle::carry::split_carried(finish, calls_costly_function)
}

/// The most passes one source may need in one epoch: each pass is a full
/// shuffle of the source, so a share thousands of times the source is better
/// served by a bigger source (or a smaller `ROWS`).
pub const MAX_PASSES: u64 = 1024;

#[async_trait]
impl ExtensionPlanner for MixExtensionPlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(mix) = node.as_any().downcast_ref::<MixNode>() else {
            return Ok(None);
        };
        let spec = mix.spec();
        if let Some(window_rows) = spec.window_rows
            && self.stage_shaped
        {
            return Err(super::refused_on_a_cluster(window_rows));
        }
        let feed = session
            .config()
            .options()
            .extensions
            .get::<sqlfeed_udfs::augment::AugmentOptions>()
            .filter(|options| options.epoch.is_some());
        let seed = spec.seed.or(feed.map(|f| f.feed_seed)).unwrap_or(0);
        let epoch = spec.epoch.or(feed.and_then(|f| f.epoch)).unwrap_or(0);
        let mut inputs = Vec::with_capacity(physical_inputs.len());
        let mut counts = Vec::with_capacity(physical_inputs.len());
        for (logical, physical) in logical_inputs.iter().zip(physical_inputs) {
            let rows = source_rows(logical, physical, session).await?;
            counts.push(count_rows(&rows.logical, &rows.physical, session).await?);
            inputs.push(rows);
        }
        let rows = spec.rows.unwrap_or_else(|| counts.iter().sum());
        // Each source's window: where in its passes the epoch starts, and
        // how many rows it takes; and the turns.
        let (starts, takes, turns) = match spec.schedules() {
            None => {
                let quotas = quotas(&spec.weights(), rows)?;
                let starts = quotas
                    .iter()
                    .map(|&q| u128::from(epoch) * u128::from(q))
                    .collect::<Vec<_>>();
                let turns = Turns::Fixed(Interleave::new(quotas.clone()));
                (starts, quotas, turns)
            }
            Some(points) => {
                let step_rows = spec
                    .step_rows
                    .or_else(|| {
                        let options =
                            crate::config::SqlfeedOptions::of(session.config().options());
                        Some(options.feed_step_rows).filter(|&rows| rows > 0)
                    })
                    .ok_or_else(|| {
                        plan_datafusion_err!("a MIX with weights by step needs the rows of a step: in a feed \
                             they are its batch size × world; elsewhere add BATCH <rows> to \
                             the mixture")
                    })?;
                let schedules = points
                    .into_iter()
                    .zip(spec.weights())
                    .map(|(points, weight)| {
                        if points.is_empty() {
                            Ok(Schedule::constant(weight))
                        } else {
                            Schedule::try_new(points)
                        }
                    })
                    .collect::<Result<Vec<_>>>()?;
                let mix = ScheduledMix::try_new(schedules, step_rows)?;
                let (start, end, turns) = mix.epoch(epoch, rows)?;
                let takes: Vec<u64> =
                    end.iter().zip(&start).map(|(e, s)| e - s).collect();
                let starts = start.iter().map(|&s| u128::from(s)).collect();
                let turns = Turns::Scheduled(turns);
                (starts, takes, turns)
            }
        };
        // The sources' shuffles run side by side on one pool: each sizes its
        // batches for its share, as the inputs of one shuffle of their union
        // would. (Sized for the whole pool, each source's scan read batches
        // of 17 MB of images, above mimalloc's 16 MiB huge-object size: each
        // one fresh pages from the kernel, zeroed, 40% of a mixture's CPU.)
        let sources_taking = takes.iter().filter(|&&take| take > 0).count().max(1);
        let memory_limit = match session.runtime_env().memory_pool.memory_limit() {
            MemoryLimit::Finite(bytes) => bytes,
            _ => usize::MAX / 2,
        } / sources_taking;
        let batch_size = session.config().batch_size();
        let mut sources = Vec::with_capacity(takes.len());
        for (k, ((name, (input, output)), (&count, (&start, &quota)))) in spec
            .names
            .iter()
            .zip(inputs.into_iter().zip(physical_inputs))
            .zip(counts.iter().zip(starts.iter().zip(&takes)))
            .enumerate()
        {
            let window = Window::span(count, start, quota).map_err(|e| {
                DataFusionError::Context(format!("mixture source '{name}'"), Box::new(e))
            })?;
            if window.passes > MAX_PASSES {
                return plan_err!(
                    "mixture source '{name}' has {count} rows for a share of {quota} rows \
                     per epoch: {} passes over it; at most {MAX_PASSES} are planned. Give it \
                     more rows, a smaller weight, or the mixture fewer ROWS",
                    window.passes
                );
            }
            if window.take == 0 {
                sources.push(MixSource {
                    name: name.clone(),
                    plan: Arc::new(EmptyExec::new(output.schema())),
                    take: 0,
                });
                continue;
            }
            let source_seed = source_seed(seed, k);
            let (carry, after_window) = match input.finish {
                Some(finish) => early_and_late(finish)?,
                None => (None, None),
            };
            let mut passes = (0..window.passes)
                .map(|i| {
                    // Each pass runs the source's plan once more: with state
                    // of its own (a scan's work-stealing queue is per
                    // instance, and a second run found it drained).
                    let input = reset_plan_states(Arc::clone(&input.physical))?;
                    let pass = window.first_pass + i;
                    let shuffle = GlobalShuffle {
                        source: KeySource::AllColumns,
                        seed: source_seed,
                        epoch: pass,
                        memory_limit,
                        session_batch_size: batch_size,
                        carry: carry.clone(),
                    };
                    let Some(window_rows) = spec.window_rows else {
                        // On a cluster each pass is its own stages, merged
                        // into one stream in the mixture's task.
                        return shuffle
                            .plan(input, self.stage_shaped.then(FinalStage::merge));
                    };
                    // The pass in windows, streamed; the first pass starts
                    // at the epoch's first row, skipping whole windows
                    // before it where the footers count them.
                    let shuffled = shuffle.plan(input, None)?;
                    if let Some(why) = why_not_windowable(&shuffled) {
                        return plan_err!(
                            "MIX … WINDOW {window_rows}: source '{name}' cannot be shuffled \
                             in windows: a window {why}. Make the source a query of one \
                             Parquet table without aggregates, joins, sorts or limits, or \
                             leave WINDOW out (each pass is then a global shuffle)"
                        );
                    }
                    let windowed = WindowedShuffleExec::try_new(
                        shuffled,
                        source_seed,
                        pass,
                        window_rows,
                    )?;
                    let start_row = if i == 0 { window.skip } else { 0 };
                    Ok(Arc::new(windowed.with_start_row(start_row))
                        as Arc<dyn ExecutionPlan>)
                })
                .collect::<Result<Vec<_>>>()?;
            // Where a filter decides the rows, the windows of the first pass
            // are counted (a query of the filter's columns alone), so that
            // those before the epoch's slice are skipped rather than run.
            if spec.window_rows.is_some()
                && window.skip > 0
                && let Some(state) = session.as_any().downcast_ref::<SessionState>()
                && let Some(first) = passes.first_mut()
                && let Some(windowed) = first.downcast_ref::<WindowedShuffleExec>()
                && windowed.drops_rows()?
                && let Some(counts) =
                    window_rows(first, state, &input.logical, &OnceLock::new()).await?
            {
                *first = Arc::new(windowed.with_window_counts(counts));
            }
            // A windowed pass starts at the epoch's first row itself.
            let window = match spec.window_rows {
                Some(_) => Window { skip: 0, ..window },
                None => window,
            };
            let mut plan: Arc<dyn ExecutionPlan> =
                Arc::new(MixWindowExec::try_new(name.clone(), passes, window)?);
            if let Some(after_window) = after_window {
                plan = Arc::new(ProjectionExec::try_new(after_window, plan)?);
            }
            sources.push(MixSource {
                name: name.clone(),
                plan,
                take: window.take,
            });
        }
        let schema = Arc::new(mix.arrow_schema());
        Ok(Some(Arc::new(MixExec::try_new(sources, turns, schema)?)))
    }
}
