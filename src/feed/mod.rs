//! Training feeds: a query's rows as exact, sharded, prefetched tensor
//! batches, epoch after epoch, resumable from `(epoch, step)` alone.
//!
//! ```no_run
//! # fn main() -> datafusion::error::Result<()> {
//! use sqlfeed::device::Device;
//! use sqlfeed::feed::Feed;
//! let session = sqlfeed::Session::try_new()?;
//! let feed = Feed::builder(&session, "SELECT standardize(f0, 0.1, 2.0) AS x, label AS y FROM 'data/*.parquet'")
//!     .shuffle(42)                 // epoch e is the global shuffle (42, e)
//!     .batch_size(256)
//!     .drop_last(true)
//!     .prefetch(8)                 // batches ready ahead, on the device
//!     .shard(0, 1)                 // (rank, world size)
//!     .epochs(3)
//!     .resume_at(0, 0)             // (epoch, step) of a checkpoint
//!     .device(Device::auto())      // cuda:0 when usable, else the CPU
//!     .build()?;
//! for batch in feed {
//!     let batch = batch?;
//!     let x = batch.tensor("x")?;  // float32 [256], on the feed's device
//!     # let _ = x;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Semantics
//! - **Order**: epoch `e` reads the query's rows in the global shuffle order
//!   of `(seed, e)` ([`crate::shuffle`]), or without `shuffle` in the
//!   query's deterministic order, the same on every machine whatever its
//!   core count (see `order.rs`; plans whose order depends on timing are
//!   refused with a hint to add `ORDER BY`).
//! - **Batches and shards**: consecutive chunks of `batch_size × world` rows
//!   are the global steps; rank `r` gets the `r`-th `batch_size` rows of
//!   each. Shards are disjoint, every rank gets the same number of batches,
//!   and the last partial chunk is dropped (`drop_last`) or padded with the
//!   epoch's first rows and split evenly (see `batcher.rs`).
//! - **Resume**: `resume_at(e, k)` yields exactly what an uninterrupted run
//!   yields from epoch `e` step `k` on, because every batch is a pure
//!   function of `(query, data, seed, epoch, step, rank, world, batch size)`.
//!   [`Feed::checkpoint`] records the position as rows of the epoch's order
//!   with what the order depends on; [`FeedBuilder::resume_from`] resumes
//!   it under any world size and batch size and checks the query, seed and
//!   data (see `checkpoint.rs`).
//! - **Cancellation**: dropping the feed stops the query, its tasks and its
//!   threads before `drop` returns; tensors still held keep their slot alive
//!   until they are dropped.
//!
//! # Threads
//! Each feed runs its query on its own Tokio runtime (one worker per core,
//! threads named `sqlfeed-<id>`), so the training loop may be synchronous
//! and the feed never competes with an application's runtime for workers.

mod appended;
mod batcher;
mod builder;
mod checkpoint;
mod columns;
mod convert;
mod dataset;
mod epoch_cache;
mod inputs;
mod length;
mod lookahead;
mod metrics;
mod mixture;
mod order;
mod plan;
mod producer;
mod prometheus;
mod provenance;
mod quarantine;
mod scan_batches;
mod sink;
mod source;
mod timeline;
mod window_jobs;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::time::{Duration, Instant};

use datafusion::common::internal_datafusion_err;
use datafusion::error::{DataFusionError, Result};

pub use batcher::pack::{LongDocuments, PackOptions, PackSpan};
pub use builder::FeedBuilder;
pub use checkpoint::{
    AppendedState, CHECKPOINT_VERSION, Checkpoint, FeedShape, ManifestEntry,
    OnDataChange, ResumePoint, query_fingerprint,
};
pub use columns::ColumnSpec;
pub use convert::packed::IGNORED_LABEL;
pub use dataset::EpochDataset;
pub use inputs::{input_files, input_files_at};
pub use length::FeedLength;
pub use metrics::FeedReport;
pub use order::DEFAULT_ORDER_LANES;
pub use prometheus::{check_label_name, prometheus_text, write_whole};
pub use provenance::{BatchOrigins, RowOrigin};
pub use quarantine::{
    FRACTION_FLOOR_ROWS, OnError, QuarantineLimit, QuarantinedRow, quarantine_table,
};
pub use sink::DeviceSinkExec;
pub use timeline::{Bound, Timeline, TimelineSample, Verdict};

use self::batcher::EpochStart;
use self::metrics::FeedMetrics;
use self::sink::FeedEvent;
use crate::Session;
use crate::cache::InputFile;
use crate::device::{DType, Device, Loans, SlotPool, TensorBatch};

/// The prefetch ring's share of a finite memory limit, set aside when the
/// feed starts (1/4): what the ring does not use of it is given back once
/// every slot has its buffers.
const RING_SHARE_DIVISOR: usize = 4;

/// Numbers feeds (and their threads) within a process.
static NEXT_FEED_ID: AtomicU64 = AtomicU64::new(0);

/// Name, dtype and whether it is a mask, of each tensor of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
}

/// A running feed: an iterator of tensor batches. See the module docs.
///
/// # Examples
///
/// Two features and the label of 1000 rows, shuffled, in batches of 100
/// host tensors:
///
/// ```
/// # fn main() -> datafusion::error::Result<()> {
/// use sqlfeed::datagen::{GenOptions, generate};
/// use sqlfeed::device::Device;
/// use sqlfeed::feed::Feed;
///
/// let dir = tempfile::tempdir()?;
/// generate(&GenOptions::new(1000, dir.path()))?;
/// let session = sqlfeed::Session::try_new()?;
/// let sql = format!(
///     "SELECT feature_vector(f0, f1) AS x, label AS y FROM '{}/*.parquet'",
///     dir.path().display()
/// );
/// let feed = Feed::builder(&session, sql)
///     .shuffle(42)
///     .batch_size(100)
///     .device(Device::Cpu)
///     .build()?;
/// let mut rows = 0;
/// for batch in feed {
///     let batch = batch?;
///     assert_eq!(batch.tensor("x")?.shape(), &[100, 2]);
///     rows += batch.rows();
/// }
/// assert_eq!(rows, 1000);
/// # Ok(())
/// # }
/// ```
pub struct Feed {
    /// Process-unique number.
    id: u64,
    /// Name of this feed's runtime threads.
    thread_name: String,
    /// Batches and events from the producer (`None` once dropped).
    events: Option<mpsc::Receiver<FeedEvent>>,
    /// The feed's own runtime.
    runtime: Option<tokio::runtime::Runtime>,
    /// The producer task.
    task: Option<tokio::task::JoinHandle<()>>,
    /// Counters.
    metrics: Arc<FeedMetrics>,
    /// Where the time goes, sampled while the feed runs.
    timeline: Arc<Timeline>,
    /// Its sampling thread (stopped when the feed ends).
    sampler: Option<timeline::Sampler>,
    /// The slot ring, to check it is gone after drop.
    pool: Weak<tokio::sync::Mutex<SlotPool>>,
    /// Batches queued and held, shared with the ring.
    loans: Arc<Loans>,
    /// Where tensors live.
    device: Device,
    /// The tensors of each batch.
    tensors: Vec<TensorInfo>,
    /// `(epoch, plan with metrics)` of finished epochs.
    epoch_plans: Vec<(u64, String)>,
    /// Seconds each finished epoch took, as (epoch, seconds).
    epoch_seconds: Vec<(u64, f64)>,
    /// Rows each mixture source gave each finished epoch.
    epoch_mixtures: Vec<(u64, Vec<(String, u64)>)>,
    /// No more batches will come.
    finished: bool,
    /// When the consumer started waiting for the batch it waits for.
    waiting_since: Option<Instant>,
    /// The checkpoint after the batch last handed over (`None` for an
    /// explain's internal feed).
    checkpoint: Option<Checkpoint>,
    /// What the number of batches depends on.
    length: FeedLength,
    /// The rows quarantined so far (`on_error = quarantine`).
    quarantine: Option<Arc<quarantine::QuarantineLog>>,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed")
            .field("id", &self.id)
            .field("device", &self.device)
            .field("tensors", &self.tensors)
            .finish()
    }
}

impl Feed {
    /// Starts describing a feed of `sql` (sqlfeed SQL) on `session`.
    pub fn builder(session: &Session, sql: impl Into<String>) -> FeedBuilder {
        FeedBuilder {
            session: session.clone(),
            sql: sql.into(),
            shuffle_seed: None,
            shuffle_window: None,
            shuffle_by_position: false,
            batch_size: 256,
            drop_last: false,
            prefetch: 4,
            rank: 0,
            world: 1,
            epochs: 1,
            resume: (0, EpochStart::BEGIN),
            device: None,
            columns: vec![],
            token_budget: None,
            bucket_window: None,
            cache: false,
            run_id: String::new(),
            order_lanes: DEFAULT_ORDER_LANES,
            skipped_steps: BTreeMap::new(),
            appended: None,
            checkpoint: None,
            user_sql: None,
            delta_versions: BTreeMap::new(),
            on_error: OnError::Fail,
            quarantined: vec![],
            pack: None,
            pack_history: vec![],
        }
    }

    /// Where the tensors live.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The tensors every batch has, in order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// What a feed says when it starts: `feed on cpu: x float32, y int64`.
    pub fn describe(&self) -> String {
        let tensors: Vec<String> = (self.tensors.iter())
            .map(|t| format!("{} {}", t.name, t.dtype))
            .collect();
        format!("feed on {}: {}", self.device, tensors.join(", "))
    }

    /// How many batches this feed hands over, once the rows of an epoch are
    /// counted ([`FeedLength::rows_per_epoch`]): a progress bar's total.
    pub fn length(&self) -> FeedLength {
        self.length.clone()
    }

    /// The metrics so far.
    pub fn report(&self) -> FeedReport {
        self.metrics.report(self.loans.ring_slots())
    }

    /// The running totals in Prometheus' text format (see
    /// [`prometheus_text`]), labelled with this feed's `rank` and `world`
    /// and then `labels`.
    pub fn prometheus_text(&self, labels: &[(String, String)]) -> Result<String> {
        let position = self.checkpoint()?;
        let mut all = vec![
            ("rank".to_string(), position.rank.to_string()),
            ("world".to_string(), position.world.to_string()),
        ];
        all.extend(labels.iter().cloned());
        prometheus_text(&self.report(), position.epoch, position.step, &all)
    }

    /// Where the feed's time goes: busy time per stage, the loop's wait, the
    /// ring and memory over time, with a verdict on what bounds it; it
    /// outlives the feed (see [`Timeline::write_html`]).
    pub fn timeline(&self) -> Arc<Timeline> {
        Arc::clone(&self.timeline)
    }

    /// Seconds each finished epoch took, as (epoch, seconds): from planning
    /// to the last batch produced (a cache miss's epoch includes writing the
    /// entry).
    pub fn epoch_seconds(&self) -> &[(u64, f64)] {
        &self.epoch_seconds
    }

    /// For a feed over a `MIX`: the rows each source gave each finished
    /// epoch, as (epoch, [(source, rows)]) — the realised proportions (of
    /// the whole epoch, all ranks together).
    pub fn epoch_mixtures(&self) -> &[(u64, Vec<(String, u64)>)] {
        &self.epoch_mixtures
    }

    /// The physical plan of each finished epoch with its metrics (the feed's
    /// `EXPLAIN ANALYZE`).
    pub fn epoch_plans(&self) -> &[(u64, String)] {
        &self.epoch_plans
    }

    /// Stops the timeline's sampling and takes its last sample.
    fn end_timeline(&mut self) {
        drop(self.sampler.take());
        self.timeline.close();
    }

    /// A handle that outlives the feed, to check that dropping it released
    /// everything.
    pub fn probe(&self) -> FeedProbe {
        FeedProbe {
            pool: Weak::clone(&self.pool),
            thread_name: self.thread_name.clone(),
        }
    }

    /// Where the feed is: the checkpoint after the batch last handed over
    /// (before the first, the feed's start), the same on every rank. A feed
    /// built with [`FeedBuilder::resume_from`] of it yields exactly the next
    /// batch this one would, under the same shape, or goes on from the same
    /// row under another world size, batch size or token budget.
    /// [`Checkpoint::to_json`] is the format of Python's `state_dict()`.
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        let mut checkpoint = self.checkpoint.clone().ok_or_else(|| {
            internal_datafusion_err!("an explain's feed has no checkpoint")
        })?;
        if let Some(log) = &self.quarantine {
            checkpoint.quarantined =
                log.rows_before(checkpoint.epoch, checkpoint.rows.unwrap_or(0));
        }
        Ok(checkpoint)
    }

    /// The rows quarantined so far (`on_error = quarantine`), by epoch and
    /// position in the epoch's order, with those of the checkpoint it
    /// resumed: the same on every rank. Rows of batches prefetched but not
    /// yet handed over are included. Their origins are not resolved here:
    /// [`FeedBuilder::quarantine_origins`] does that. Empty for a feed that
    /// fails on errors.
    pub fn quarantined(&self) -> Vec<QuarantinedRow> {
        self.quarantine
            .as_ref()
            .map(|log| log.rows())
            .unwrap_or_default()
    }

    /// The next batch, waiting at most `timeout` for it: for callers that
    /// must stay responsive while they wait (a Python loop checking for
    /// Ctrl-C). Time spent across `Pending` answers counts as one wait.
    pub fn next_within(&mut self, timeout: Duration) -> NextBatch {
        self.next_until(Some(Instant::now() + timeout))
    }

    fn next_until(&mut self, deadline: Option<Instant>) -> NextBatch {
        if self.finished {
            return NextBatch::Finished;
        }
        let waiting = *self.waiting_since.get_or_insert_with(Instant::now);
        self.metrics.waiting_since(waiting);
        loop {
            let Some(events) = self.events.as_ref() else {
                return NextBatch::Finished;
            };
            // While we block here, a producer that finds every slot held by
            // us and no room for another knows the loop cannot go on (see
            // SlotPool). Only while we block: after a `Pending` answer the
            // caller runs its own code, which may release batches, so a
            // producer counting blocked polls must not count that time.
            self.loans.set_consumer_waiting(true);
            let event = match deadline {
                None => events
                    .recv()
                    .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                Some(deadline) => events
                    .recv_timeout(deadline.saturating_duration_since(Instant::now())),
            };
            self.loans.set_consumer_waiting(false);
            if matches!(event, Err(mpsc::RecvTimeoutError::Timeout)) {
                return NextBatch::Pending;
            }
            self.waiting_since = None;
            let waited = waiting.elapsed();
            match event {
                Ok(FeedEvent::Batch(batch)) => {
                    self.loans.taken();
                    let h2d = match batch.wait_ready() {
                        Ok(h2d) => h2d,
                        Err(err) => {
                            self.finished = true;
                            return NextBatch::Failed(err);
                        }
                    };
                    let metrics = &self.metrics;
                    metrics.wait_ended(waited);
                    if metrics.batches.load(Ordering::Relaxed) == 0 {
                        FeedMetrics::add_time(&metrics.first_wait_ns, waited);
                    }
                    FeedMetrics::add_time(&metrics.h2d_ns, h2d.unwrap_or(Duration::ZERO));
                    FeedMetrics::add(&metrics.batches, 1);
                    FeedMetrics::add(&metrics.rows, batch.rows() as u64);
                    FeedMetrics::add(&metrics.bytes, batch.nbytes() as u64);
                    if let Some(checkpoint) = &mut self.checkpoint {
                        advance(checkpoint, &batch);
                    }
                    let since_build = metrics.started.elapsed().as_nanos() as u64;
                    let _ = metrics.first_batch_ns.compare_exchange(
                        u64::MAX,
                        since_build,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    return NextBatch::Ready(batch);
                }
                Ok(FeedEvent::EpochEnd {
                    epoch,
                    plan,
                    seconds,
                    mixture,
                }) => {
                    if !mixture.is_empty() {
                        self.epoch_mixtures.push((epoch, mixture));
                    }
                    self.epoch_plans.push((epoch, plan));
                    self.epoch_seconds.push((epoch, seconds));
                    // Still waiting for a batch, since the same moment.
                    self.waiting_since = Some(waiting);
                }
                Ok(FeedEvent::Error(err)) => {
                    self.finished = true;
                    self.metrics.wait_ended(waited);
                    self.end_timeline();
                    return NextBatch::Failed(err);
                }
                Ok(FeedEvent::Done) | Err(_) => {
                    self.finished = true;
                    self.metrics.wait_ended(waited);
                    self.end_timeline();
                    return NextBatch::Finished;
                }
            }
        }
    }
}

/// Moves `checkpoint` past `batch`, just handed over.
fn advance(checkpoint: &mut Checkpoint, batch: &TensorBatch) {
    let epoch_before = checkpoint.epoch;
    let (epoch, step) = batch.next_position();
    let (_, rows) = batch.next_row_position();
    checkpoint.epoch = epoch;
    checkpoint.step = step;
    checkpoint.rows = Some(rows);
    // A continuation over appended data ends with its epoch, and so do
    // the shapes a packing feed ran under before a resume.
    if checkpoint
        .appended
        .as_ref()
        .is_some_and(|appended| appended.epoch != epoch)
    {
        checkpoint.appended = None;
    }
    if checkpoint.epoch != epoch_before {
        checkpoint.pack_history.clear();
    }
}

/// The files the query `sql` reads now (its data manifest), listed on the
/// feed's runtime.
fn list_inputs(
    runtime: &tokio::runtime::Runtime,
    session: &Session,
    sql: &str,
) -> Result<Vec<InputFile>> {
    let (session, sql) = (session.clone(), sql.to_string());
    on_runtime(runtime, async move { input_files(&session, &sql).await })
}

/// Runs `work` to its end on the feed's runtime: `build` may be called from
/// within another runtime, where blocking on a future is not allowed.
fn on_runtime<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let (sender, receiver) = mpsc::channel();
    runtime.spawn(async move {
        let _ = sender.send(work.await);
    });
    receiver.recv().map_err(|_| {
        internal_datafusion_err!("the feed stopped while planning its query")
    })?
}

/// What [`Feed::next_within`] found.
#[derive(Debug)]
pub enum NextBatch {
    /// The next batch.
    Ready(TensorBatch),
    /// The feed failed; no more batches follow.
    Failed(DataFusionError),
    /// Every epoch is done.
    Finished,
    /// Nothing yet; ask again.
    Pending,
}

impl Iterator for Feed {
    type Item = Result<TensorBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_until(None) {
            NextBatch::Ready(batch) => Some(Ok(batch)),
            NextBatch::Failed(err) => Some(Err(err)),
            NextBatch::Finished | NextBatch::Pending => None,
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.finished = true;
        self.end_timeline();
        // First the channel: batches not yet taken return their slots and the
        // producer's next hand-off fails.
        self.events = None;
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(runtime) = self.runtime.take() {
            // Waiting for the threads is not allowed inside another runtime;
            // there they finish in the background.
            if tokio::runtime::Handle::try_current().is_ok() {
                runtime.shutdown_background();
            } else {
                runtime.shutdown_timeout(Duration::from_secs(10));
            }
        }
    }
}

/// Checks, after a feed is dropped, that nothing of it is left.
#[derive(Debug, Clone)]
pub struct FeedProbe {
    pool: Weak<tokio::sync::Mutex<SlotPool>>,
    thread_name: String,
}

impl FeedProbe {
    /// Whether the slot ring (and so every buffer not held by a live tensor)
    /// has been freed.
    pub fn ring_released(&self) -> bool {
        self.pool.strong_count() == 0
    }

    /// Threads of the feed still running (Linux; 0 elsewhere).
    pub fn threads_alive(&self) -> usize {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        tasks
            .filter_map(|task| task.ok())
            .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == self.thread_name)
            .count()
    }
}
