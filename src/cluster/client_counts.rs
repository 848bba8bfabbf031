//! [`CountingClientPlanner`]: a cluster client counts the rows a
//! `SHUFFLE BY POSITION` query's filters keep, and sends them with the job.
//!
//! ```text
//!  client (this process)                              scheduler
//!  SELECT … WHERE f(x) SHUFFLE BY POSITION
//!    one positional shuffle over a filter?
//!    planned here (the embedded planner): the rows
//!    its filters keep per file and bucket, counted
//!    reading the filters' columns only
//!    sqlfeed.position_bucket_rows = the counts ──job──► PositionKeyExec placed
//!    Ballista's planner, its job run with those          from the counts: no
//!    settings (CountedJobExec)                           filter runs here
//! ```
//!
//! A shuffle by position places every row before it is read: from the
//! footers, or under a filter from the rows the filter keeps. A feed's rank
//! counts them (`crate::feed`); a plain query's scheduler counted them
//! itself, where a Python function is only declared, so such a filter
//! failed there. The client runs every function the query calls, so it
//! counts instead, once per query, as a feed's rank does once per run.
//!
//! Only what the scheduler cannot count is counted here: a query with
//! exactly one positional shuffle (the setting carries one count) over a
//! filter that calls a Python function. Any other query, or one whose
//! count is already set (a feed's), goes to Ballista's planner as it is,
//! and the scheduler counts, so planning alone (`explain()`, a cache key)
//! reads nothing here. A count larger than [`MAX_COUNT_BYTES`] (row groups
//! of irregular sizes make buckets of few rows) would not fit a job's
//! messages: refused, saying so.

use std::fmt;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use datafusion_session::Session;
use sqlfeed_udfs::user::FunctionOrigin;

use crate::config::SqlfeedOptions;
use crate::exec::BatchStream;
use crate::shuffle::{
    ShuffleNode, ShuffleSpec, encode_bucket_rows, position_bucket_rows, with_bucket_rows,
};

/// Ballista's client planner, after the client counted a shuffle by
/// position's filtered rows; see the module docs.
pub(crate) struct CountingClientPlanner {
    ballista: Arc<dyn QueryPlanner + Send + Sync>,
}

impl fmt::Debug for CountingClientPlanner {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("CountingClientPlanner")
            .finish_non_exhaustive()
    }
}

impl CountingClientPlanner {
    /// `state` (a cluster client's) with its planner counting first.
    pub(crate) fn install(state: SessionState) -> SessionState {
        let ballista = Arc::clone(state.query_planner());
        SessionStateBuilder::new_from_existing(state)
            .with_query_planner(Arc::new(Self { ballista }))
            .build()
    }

    /// `state` with the rows the filters under `logical`'s one shuffle by
    /// position keep, counted here; `None` when there is nothing to count.
    async fn counted(
        state: &SessionState,
        logical: &LogicalPlan,
    ) -> Result<Option<SessionState>> {
        if !SqlfeedOptions::of(state.config().options())
            .position_bucket_rows
            .is_empty()
        {
            return Ok(None);
        }
        if matches!(logical, LogicalPlan::Explain(_)) {
            return Ok(None);
        }
        let Some(rows) = one_positional_input(logical)? else {
            return Ok(None);
        };
        if !filters_call_python(&rows)? {
            return Ok(None);
        }
        let mut here = SessionStateBuilder::new_from_existing(state.clone())
            .with_query_planner(Arc::new(crate::sql::SqlfeedQueryPlanner::embedded()))
            .build();
        here.mark_start_execution();
        let plan = here.create_physical_plan(logical).await?;
        let Some(buckets) =
            position_bucket_rows(&plan, &here, &rows, &OnceLock::new()).await?
        else {
            return Ok(None);
        };
        let encoded = encode_bucket_rows(&buckets);
        if encoded.len() > MAX_COUNT_BYTES {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "SHUFFLE BY POSITION on a cluster places rows by the counts of what its \
                 filter keeps, counted here since the filter calls a Python function; \
                 they take {} bytes, more than the {MAX_COUNT_BYTES} a job carries (the \
                 files' row groups have irregular sizes, so they are counted in buckets of \
                 {} rows): rewrite the files with row groups of equal rows, filter without \
                 the Python function, or use SHUFFLE",
                encoded.len(),
                buckets.0
            )));
        }
        // The session's id kept: the scheduler's session is the client's.
        Ok(Some(
            with_bucket_rows(state, encoded)
                .with_session_id(state.session_id().to_string())
                .build(),
        ))
    }
}

#[async_trait]
impl QueryPlanner for CountingClientPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(state) = session.as_any().downcast_ref::<SessionState>()
            && let Some(counted) = Self::counted(state, logical_plan).await?
        {
            let job = self
                .ballista
                .create_physical_plan(logical_plan, &counted)
                .await?;
            return Ok(Arc::new(CountedJobExec {
                input: job,
                task_ctx: Arc::new(TaskContext::from(&counted)),
            }));
        }
        self.ballista
            .create_physical_plan(logical_plan, session)
            .await
    }
}

/// A cluster job run with the settings that carry its counts: Ballista's
/// client sends the settings of the task context it runs in, which would
/// be the session's, without them.
#[derive(Debug)]
struct CountedJobExec {
    input: Arc<dyn ExecutionPlan>,
    /// The session's, with `sqlfeed.position_bucket_rows` set.
    task_ctx: Arc<TaskContext>,
}

impl DisplayAs for CountedJobExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        crate::exec::fmt_settings(f, t, "CountedJobExec", &[])
    }
}

impl ExecutionPlan for CountedJobExec {
    crate::exec::one_input_operator! {
        name: "CountedJobExec",
        properties: passed_through,
        rebuild: |this, child| Ok(Self {
            input: child,
            task_ctx: Arc::clone(&this.task_ctx),
        }),
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    crate::exec::statistics_of_one_input!(first_input_statistics);

    fn execute(&self, partition: usize, _ctx: Arc<TaskContext>) -> Result<BatchStream> {
        self.input.execute(partition, Arc::clone(&self.task_ctx))
    }
}

/// The most bytes of counts a plain query's job carries (Ballista's
/// messages are limited to 16 MiB, and the setting travels to every task).
pub(crate) const MAX_COUNT_BYTES: usize = 1 << 20;

/// Whether a filter in `rows` (or pushed into its scans) calls a Python
/// function: on the scheduler such a function is only declared.
fn filters_call_python(rows: &LogicalPlan) -> Result<bool> {
    let calls_python = |expr: &Expr| {
        expr.exists(|e| {
            Ok(matches!(e, Expr::ScalarFunction(call)
            if sqlfeed_udfs::user::as_user_function(&call.func).is_some_and(|user| {
                matches!(user.origin(), FunctionOrigin::Python { .. })
            })))
        })
    };
    rows.exists(|node| {
        Ok(match node {
            LogicalPlan::Filter(filter) => calls_python(&filter.predicate)?,
            LogicalPlan::TableScan(scan) => {
                let mut any = false;
                for filter in &scan.filters {
                    any |= calls_python(filter)?;
                }
                any
            }
            _ => false,
        })
    })
}

/// The input of `logical`'s shuffle by position, if it has exactly one.
fn one_positional_input(logical: &LogicalPlan) -> Result<Option<LogicalPlan>> {
    let mut inputs = vec![];
    logical.apply(|node| {
        if let LogicalPlan::Extension(extension) = node
            && let Some(shuffle) = extension.node.as_any().downcast_ref::<ShuffleNode>()
            && matches!(shuffle.spec(), ShuffleSpec::Positional { .. })
        {
            inputs.push(shuffle.input().clone());
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(match inputs.len() {
        1 => inputs.pop(),
        _ => None,
    })
}
