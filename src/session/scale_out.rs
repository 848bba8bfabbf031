//! The one seam through which a session's queries run somewhere other than
//! this process: a Ballista cluster today (`crate::cluster`, the only
//! implementation), installed when the session is built.
//!
//! ```text
//!   SessionBuilder ─ with_scale_out(installer) ─► build()
//!        │ embedded SessionState (functions, planners, stores, budget)
//!        ▼
//!   InstallScaleOut::install ──► (client SessionState, Arc<dyn ScaleOut>)
//!        │
//!   Session ── execute_stream ──► ScaleOut::watch(plan)      (lost executors named)
//!        │
//!   feed ── EpochSource::Cluster ──► ScaleOut::epoch_job(…)  (one job all ranks read)
//! ```
//!
//! `session` and `feed` know only these traits; nothing outside
//! `crate::cluster` names Ballista. The cluster module adds the public
//! switches on top (`SessionBuilder::cluster`, `Session::cluster`), the way
//! Ballista's own `SessionConfigExt` extends DataFusion's types.

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::ScalarUDF;
use datafusion::physical_plan::ExecutionPlan;

use super::SessionBuilder;
use crate::config::PartitionOrder;
use crate::shuffle::Deal;

/// Turns a session being built into one whose queries run elsewhere.
pub trait InstallScaleOut: Send + Sync + fmt::Debug {
    /// The client state made from the embedded `state` (which has sqlfeed's
    /// planners, stores and budget), and the scale-out the session keeps.
    /// `embedded` is the builder without this installer: what an in-process
    /// cluster builds its own sessions from. The caller registers
    /// `functions` again on the returned state.
    fn install(
        &self,
        embedded: &SessionBuilder,
        state: SessionState,
        functions: Vec<Arc<ScalarUDF>>,
    ) -> Result<(SessionState, Arc<dyn ScaleOut>)>;
}

/// Where a session's queries run when not in this process.
pub trait ScaleOut: Send + Sync + fmt::Debug {
    /// For the implementation's own accessors (`Session::cluster`).
    fn as_any(&self) -> &dyn Any;

    /// `plan`, whose result this process reads from elsewhere, guarded so
    /// that a lost scheduler or executor is an error naming it, never a hang.
    fn watch(&self, plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan>;

    /// One epoch of a feed as the one job all ranks of the run read.
    fn epoch_job(&self, job: EpochJob) -> Result<EpochJobPlan>;
}

/// Set to `(job name, rows)` when the epoch's job completed (the executor
/// cache commits the entry that job wrote).
pub type CompletedJob = Arc<Mutex<Option<(String, u64)>>>;

/// Set to the rows each source of the job's mixture gave, by name, when
/// the epoch's job completed (a feed's realised proportions; the mixture
/// ran on the cluster, not in this process's plan).
pub type JobMixture = Arc<Mutex<Vec<(String, u64)>>>;

/// What a feed asks of [`ScaleOut::epoch_job`].
pub struct EpochJob {
    /// The epoch's query, not yet optimized.
    pub query: DataFrame,
    /// What the job's plan must keep of its partitions' order.
    pub partition_order: PartitionOrder,
    /// The run's identity (query, seed, run id, cache, lanes): ranks of
    /// one run name the same job, other runs never share it.
    pub run: String,
    /// The epoch.
    pub epoch: u64,
    /// This rank.
    pub rank: usize,
    /// Deal each rank its own batches on the executors, where the plan
    /// allows it; `None` streams the whole epoch to every rank.
    pub deal: Option<Deal>,
    /// Told the completed job, when given.
    pub completed: Option<CompletedJob>,
    /// Told the rows each source of the query's mixture gave, when given
    /// and the query is over a `MIX`.
    pub mixture: Option<JobMixture>,
    /// A window job's: told, with the window and its epoch's window count,
    /// once this rank read the result to the end; the jobs it no longer
    /// keeps have their results removed from the executors. `None`: the
    /// result stays for the scheduler's time to live.
    pub read: Option<ReadWindow>,
    /// A dealt window job's: where its pad partitions go (module docs of
    /// [`DeferredPads`]), one store for all windows of the epoch.
    pub pads: Option<Arc<DeferredPads>>,
}

/// The window jobs one rank of a feed read to the end, of which it keeps
/// the last `kept` in window order: a windowed feed's epoch is one job per
/// window, and without this the executors would hold every window its
/// scheduler's time to live keeps (`sqlfeed.window_jobs_kept`).
///
/// Jobs are reported as their streams end, which is not always window
/// order: the window running ahead, or the next epoch's first window, can
/// be read to its end into a buffer while the current one is still read.
/// So the jobs are released in window order, up to the last window whose
/// every predecessor was read too, less `kept`.
///
/// Every rank of a run releases the jobs it read, so a result goes once the
/// first rank is `kept` windows past it. Training ranks move in lockstep
/// (every step waits for all of them), so they read about the same window;
/// a rank further behind finds the result gone and runs the job again (as
/// after a lost executor), with the same rows.
#[derive(Debug)]
pub struct ReadJobs {
    kept: usize,
    state: Mutex<ReadState>,
}

/// A window of a feed: `(epoch, window)`.
pub type WindowId = (u64, u64);

/// What a window job tells [`ReadJobs`]: the queue, the window, and the
/// windows of its epoch.
pub type ReadWindow = (Arc<ReadJobs>, WindowId, u64);

#[derive(Debug)]
struct ReadState {
    /// The next window in order not read to its end yet.
    next: WindowId,
    /// Windows read to their end past `next`: their job and the epoch's
    /// window count.
    ahead: std::collections::BTreeMap<WindowId, (String, u64)>,
    /// Jobs of the windows before `next`, in window order, not released.
    behind: VecDeque<String>,
}

impl ReadJobs {
    /// Keeps the results of the last `kept` windows read, the first window
    /// read being `first`.
    pub fn new(kept: usize, first: WindowId) -> Self {
        Self {
            kept,
            state: Mutex::new(ReadState {
                next: first,
                ahead: Default::default(),
                behind: VecDeque::new(),
            }),
        }
    }

    /// Records that `window`, one of `windows` windows of its epoch, was
    /// read to its end from job `job_id`; returns the jobs no longer kept,
    /// in window order.
    pub fn read(&self, window: WindowId, windows: u64, job_id: String) -> Vec<String> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if window < state.next {
            // Read again (a retry whose window was released): not kept.
            return vec![job_id];
        }
        state.ahead.insert(window, (job_id, windows));
        loop {
            let next = state.next;
            let Some((job_id, windows)) = state.ahead.remove(&next) else {
                break;
            };
            state.behind.push_back(job_id);
            state.next = if next.1 + 1 < windows {
                (next.0, next.1 + 1)
            } else {
                (next.0 + 1, 0)
            };
        }
        let released = state.behind.len().saturating_sub(self.kept);
        state.behind.drain(..released).collect()
    }
}

/// The plan of an epoch job and the context to run it in.
pub struct EpochJobPlan {
    /// Streams the epoch (or, dealt, this rank's rows) from the job.
    pub plan: Arc<dyn ExecutionPlan>,
    /// The context the plan runs in.
    pub task_ctx: Arc<TaskContext>,
    /// The plan yields this rank's rows only.
    pub dealt: bool,
    /// A dealt window job's: streams this rank's pad rows that the epoch's
    /// window jobs put into [`EpochJob::pads`], finished as `plan`'s rows
    /// are, to be read after the epoch's last window.
    pub pads: Option<Arc<dyn ExecutionPlan>>,
}

/// The pad rows of a windowed epoch dealt to ranks on a cluster: copies of
/// the epoch's first rows that fill its last, partial step (see
/// `crate::shuffle::deal`). The jobs of the windows holding those first
/// rows route the copies into their pad partitions, but a rank reads them
/// after the last window: so each window job's pad partitions are fetched
/// into here while its result is read (before the executors remove it),
/// and the epoch ends with them, in partition order. A window's job read
/// again (a lost executor, a rank behind) puts the same rows again.
#[derive(Debug, Default)]
pub struct DeferredPads {
    partitions: Mutex<BTreeMap<u32, Vec<RecordBatch>>>,
}

impl DeferredPads {
    /// Keeps pad partition `partition`'s batches.
    pub fn put(&self, partition: u32, batches: Vec<RecordBatch>) {
        self.lock().insert(partition, batches);
    }

    /// The batches of every pad partition put so far, in partition order.
    pub fn batches(&self) -> Vec<RecordBatch> {
        self.lock().values().flatten().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Vec<RecordBatch>>> {
        // The map is valid after any panic: each insert is one operation.
        self.partitions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::ReadJobs;

    #[test]
    fn read_jobs_release_in_window_order_behind_the_last_kept() {
        let jobs = ReadJobs::new(1, (0, 0));
        assert!(jobs.read((0, 0), 3, "a".into()).is_empty());
        // The window running ahead ends first: nothing past a gap goes.
        assert!(jobs.read((0, 2), 3, "c".into()).is_empty());
        assert_eq!(jobs.read((0, 1), 3, "b".into()), ["a", "b"]);
        // The next epoch's first window.
        assert_eq!(jobs.read((1, 0), 2, "d".into()), ["c"]);
        let none_kept = ReadJobs::new(0, (4, 0));
        assert_eq!(none_kept.read((4, 0), 1, "x".into()), ["x"]);
        // A window read again after it went is not kept.
        assert_eq!(none_kept.read((4, 0), 1, "y".into()), ["y"]);
    }
}
