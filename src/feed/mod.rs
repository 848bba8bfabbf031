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
//! - **Cancellation**: dropping the feed stops the query, its tasks and its
//!   threads before `drop` returns; tensors still held keep their slot alive
//!   until they are dropped.
//!
//! # Threads
//! Each feed runs its query on its own Tokio runtime (one worker per core,
//! threads named `sqlfeed-<id>`), so the training loop may be synchronous
//! and the feed never competes with an application's runtime for workers.

mod batcher;
mod columns;
mod convert;
mod epoch_cache;
mod metrics;
mod order;
mod sink;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::time::{Duration, Instant};

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{ExecutionPlan, collect};

pub use columns::ColumnSpec;
pub use metrics::FeedReport;
pub use order::DEFAULT_ORDER_LANES;
pub use sink::DeviceSinkExec;

use self::columns::TensorColumn;
use self::epoch_cache::{EpochCache, EpochQuery};
use self::metrics::FeedMetrics;
use self::sink::{Batching, FeedEvent, SinkTarget};
use crate::Session;
use crate::device::{Backend, DType, Device, Loans, SlotPool, TensorBatch};
use crate::session::catch_panic;
use crate::shuffle::{ShuffleSpec, shuffle};

/// The prefetch ring's share of a finite memory limit, set aside when the
/// feed starts (1/4): what the ring does not use of it is given back once
/// every slot has its buffers.
const RING_SHARE_DIVISOR: usize = 4;

/// Numbers feeds (and their threads) within a process.
static NEXT_FEED_ID: AtomicU64 = AtomicU64::new(0);

/// Options of a [`Feed`]; see the module docs.
#[derive(Debug, Clone)]
pub struct FeedBuilder {
    session: Session,
    sql: String,
    shuffle_seed: Option<u64>,
    batch_size: usize,
    drop_last: bool,
    prefetch: usize,
    rank: usize,
    world: usize,
    epochs: u64,
    resume: (u64, u64),
    device: Option<Device>,
    columns: Vec<(String, ColumnSpec)>,
    token_budget: Option<usize>,
    bucket_window: Option<usize>,
    cache: bool,
    /// Names a training run so that its ranks share one cluster job per epoch.
    run_id: String,
    /// Partitions of an unshuffled feed's plan (see `order.rs`).
    order_lanes: usize,
}

impl FeedBuilder {
    /// Keeps the query's result in the session's epoch cache
    /// ([`crate::cache`]): the first epoch writes it while streaming (the
    /// query runs once, the first batch comes as soon as uncached), later
    /// epochs read it, so decoding and preprocessing run once, while the
    /// shuffle still draws a fresh order per (seed, epoch) and every batch is
    /// the uncached feed's. Stores the compact form where the query's last
    /// step only widens (uint8 pixels under `image_to_tensor`). A later run
    /// of the same query over the same files reuses the entry from disk.
    pub fn cache(mut self, cache: bool) -> Self {
        self.cache = cache;
        self
    }

    /// On a cluster session ([`crate::SessionBuilder::cluster`]), the name
    /// the ranks of one training run share: each epoch runs as one cluster
    /// job that rank 0 submits and every rank reads its own output
    /// partition of (see [`crate::cluster::ClusterShardExec`]). Runs with
    /// the same query, seed, world and batch size but different ids get
    /// separate jobs. Default: empty.
    pub fn run_id(mut self, id: impl Into<String>) -> Self {
        self.run_id = id.into();
        self
    }

    /// Partitions an unshuffled feed's query runs as (default
    /// [`DEFAULT_ORDER_LANES`], the same on every machine): its batches are
    /// a function of (query, data, lanes), never of the core count. More
    /// lanes decode in parallel on more cores, and give another (equally
    /// deterministic) order. Shuffled feeds ignore it.
    pub fn order_lanes(mut self, lanes: usize) -> Self {
        self.order_lanes = lanes;
        self
    }

    /// Globally shuffles every epoch: epoch `e` uses `(seed, e)`.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.shuffle_seed = Some(seed);
        self
    }

    /// Rows per batch (default 256).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = rows;
        self
    }

    /// Variable batch sizes: pack rows until the padded batch (rows × the
    /// longest row of the query's one variable-length column) would exceed
    /// `tokens`. Replaces `batch_size` for cutting batches; see the module
    /// docs of `batcher.rs` for the exact rule and how ranks stay equal.
    pub fn batch_tokens(mut self, tokens: usize) -> Self {
        self.token_budget = Some(tokens);
        self
    }

    /// Length bucketing to cut padding: sort windows of `window_steps`
    /// global steps by the length of the variable-length column and emit
    /// their batches in a seeded random order (fixed batch sizes only).
    pub fn bucket_by_length(mut self, window_steps: usize) -> Self {
        self.bucket_window = Some(window_steps);
        self
    }

    /// Drop the last partial batch (default false).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Batches prepared ahead of the consumer (default 4).
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch = batches;
        self
    }

    /// This process is `rank` of `world` data-parallel ranks.
    pub fn shard(mut self, rank: usize, world: usize) -> Self {
        self.rank = rank;
        self.world = world;
        self
    }

    /// Number of epochs (default 1).
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.epochs = epochs;
        self
    }

    /// Starts at `step` of `epoch`, as an uninterrupted run would be there.
    pub fn resume_at(mut self, epoch: u64, step: u64) -> Self {
        self.resume = (epoch, step);
        self
    }

    /// Where tensors go (default [`Device::auto`]).
    pub fn device(mut self, device: Device) -> Self {
        self.device = Some(device);
        self
    }

    /// How column `name` becomes a tensor (dtype, shape, scale, padding, …).
    pub fn column(mut self, name: impl Into<String>, spec: ColumnSpec) -> Self {
        self.columns.push((name.into(), spec));
        self
    }

    /// Checks the options, opens the device, plans the query, checks that
    /// every column can become a tensor and starts producing batches.
    pub fn build(self) -> Result<Feed> {
        self.validate()?;
        let device = self.device.unwrap_or_else(Device::auto);
        let backend = Backend::try_new(device)?;
        let id = NEXT_FEED_ID.fetch_add(1, Ordering::Relaxed);
        let thread_name = format!("sqlfeed-{id}");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            // One worker per core for the query's partitions, plus one so that
            // the sink is never queued behind a partition decoding a whole
            // record batch in one poll (tens of ms): a wake-up that waits
            // for that drains the prefetch ring and starves the consumer.
            .worker_threads(
                std::thread::available_parallelism().map_or(2, |n| n.get()) + 1,
            )
            .thread_name(thread_name.clone())
            .enable_all()
            .build()
            .map_err(|e| {
                DataFusionError::ResourcesExhausted(format!(
                    "cannot start feed threads: {e}"
                ))
            })?;
        let metrics = Arc::new(FeedMetrics::new());
        let memory_pool = &self.session.context().runtime_env().memory_pool;
        let ring_memory =
            MemoryConsumer::new(format!("feed {id} prefetch ring")).register(memory_pool);
        // The ring's share is set aside before the query runs: a shuffle
        // (spillable) would otherwise take the whole pool while it reads,
        // and the ring could not grow once batches come.
        let ring_share = match memory_pool.memory_limit() {
            MemoryLimit::Finite(limit) => limit / RING_SHARE_DIVISOR,
            _ => 0,
        };
        let pool = SlotPool::new(backend, self.prefetch + 1)
            .with_reservation(ring_memory, ring_share);
        let loans = pool.loans();
        let pool = Arc::new(tokio::sync::Mutex::new(pool));
        let (events_tx, events) = mpsc::channel();
        let (init_tx, init_rx) = mpsc::channel();
        let producer = Producer {
            options: self,
            pool: Arc::clone(&pool),
            metrics: Arc::clone(&metrics),
            cache: EpochCache::default(),
        };
        let task = runtime.spawn(producer.run(events_tx, init_tx));
        let mut feed = Feed {
            id,
            thread_name,
            events: Some(events),
            runtime: Some(runtime),
            task: Some(task),
            metrics,
            pool: Arc::downgrade(&pool),
            loans,
            device,
            tensors: vec![],
            epoch_plans: vec![],
            epoch_seconds: vec![],
            finished: false,
            waiting_since: None,
        };
        drop(pool);
        // Planning errors (bad SQL, missing files, untensorable columns) are
        // build errors; the feed's own Drop cleans up on that path.
        match init_rx.recv() {
            Ok(Ok(tensors)) => feed.tensors = tensors,
            Ok(Err(err)) => return Err(err),
            Err(_) => {
                return Err(DataFusionError::Internal(
                    "the feed stopped while planning its query".into(),
                ));
            }
        }
        Ok(feed)
    }

    fn validate(&self) -> Result<()> {
        let plan_error = |msg: String| Err(DataFusionError::Plan(msg));
        if self.batch_size == 0 {
            return plan_error("batch_size must be at least 1".into());
        }
        if self.world == 0 || self.rank >= self.world {
            return plan_error(format!(
                "shard {}/{}: the rank must be below the world size (ranks are 0..{})",
                self.rank,
                self.world,
                self.world.saturating_sub(1)
            ));
        }
        if self.epochs == 0 {
            return plan_error("epochs must be at least 1".into());
        }
        if self.resume.0 >= self.epochs {
            return plan_error(format!(
                "cannot resume at epoch {}: the feed has epochs 0..{}",
                self.resume.0,
                self.epochs - 1
            ));
        }
        if self.prefetch == 0 {
            return plan_error("prefetch must be at least 1".into());
        }
        if self.order_lanes == 0 {
            return plan_error("order_lanes must be at least 1".into());
        }
        if self.token_budget == Some(0) {
            return plan_error("batch_tokens must be at least 1".into());
        }
        if self.token_budget.is_some() && self.bucket_window.is_some() {
            return plan_error(
                "bucket_by_length works with batch_size; with batch_tokens the packing \
                 already adapts batch sizes to lengths"
                    .into(),
            );
        }
        if self.bucket_window == Some(0) {
            return plan_error(
                "bucket_by_length needs a window of at least 1 step".into(),
            );
        }
        Ok(())
    }
}

/// Name, dtype and whether it is a mask, of each tensor of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
}

/// A running feed: an iterator of tensor batches. See the module docs.
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
    /// No more batches will come.
    finished: bool,
    /// When the consumer started waiting for the batch it waits for.
    waiting_since: Option<Instant>,
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
            batch_size: 256,
            drop_last: false,
            prefetch: 4,
            rank: 0,
            world: 1,
            epochs: 1,
            resume: (0, 0),
            device: None,
            columns: vec![],
            token_budget: None,
            bucket_window: None,
            cache: false,
            run_id: String::new(),
            order_lanes: DEFAULT_ORDER_LANES,
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

    /// The metrics so far.
    pub fn report(&self) -> FeedReport {
        self.metrics.report()
    }

    /// Seconds each finished epoch took, as (epoch, seconds): from planning
    /// to the last batch produced (a cache miss's epoch includes writing the
    /// entry).
    pub fn epoch_seconds(&self) -> &[(u64, f64)] {
        &self.epoch_seconds
    }

    /// The physical plan of each finished epoch with its metrics (the feed's
    /// `EXPLAIN ANALYZE`).
    pub fn epoch_plans(&self) -> &[(u64, String)] {
        &self.epoch_plans
    }

    /// A handle that outlives the feed, to check that dropping it released
    /// everything.
    pub fn probe(&self) -> FeedProbe {
        FeedProbe {
            pool: Weak::clone(&self.pool),
            thread_name: self.thread_name.clone(),
        }
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
        loop {
            let Some(events) = self.events.as_ref() else {
                return NextBatch::Finished;
            };
            // While we block here, a producer that finds every slot held by
            // us and no room for another knows the loop cannot go on (see
            // SlotPool). It stays set across `Pending` answers: the caller
            // is still waiting.
            self.loans.set_consumer_waiting(true);
            let event = match deadline {
                None => events
                    .recv()
                    .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                Some(deadline) => events
                    .recv_timeout(deadline.saturating_duration_since(Instant::now())),
            };
            if matches!(event, Err(mpsc::RecvTimeoutError::Timeout)) {
                return NextBatch::Pending;
            }
            self.loans.set_consumer_waiting(false);
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
                    FeedMetrics::add_time(&metrics.wait_ns, waited);
                    if metrics.batches.load(Ordering::Relaxed) == 0 {
                        FeedMetrics::add_time(&metrics.first_wait_ns, waited);
                    }
                    FeedMetrics::add_time(&metrics.h2d_ns, h2d.unwrap_or(Duration::ZERO));
                    FeedMetrics::add(&metrics.batches, 1);
                    FeedMetrics::add(&metrics.rows, batch.rows() as u64);
                    FeedMetrics::add(&metrics.bytes, batch.nbytes() as u64);
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
                }) => {
                    self.epoch_plans.push((epoch, plan));
                    self.epoch_seconds.push((epoch, seconds));
                    // Still waiting for a batch, since the same moment.
                    self.waiting_since = Some(waiting);
                }
                Ok(FeedEvent::Error(err)) => {
                    self.finished = true;
                    FeedMetrics::add_time(&self.metrics.wait_ns, waited);
                    return NextBatch::Failed(err);
                }
                Ok(FeedEvent::Done) | Err(_) => {
                    self.finished = true;
                    FeedMetrics::add_time(&self.metrics.wait_ns, waited);
                    return NextBatch::Finished;
                }
            }
        }
    }
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

/// The producer task: plans, then runs one [`DeviceSinkExec`] per epoch.
struct Producer {
    options: FeedBuilder,
    pool: Arc<tokio::sync::Mutex<SlotPool>>,
    metrics: Arc<FeedMetrics>,
    /// The epoch cache (with `cache(true)`).
    cache: EpochCache,
}

impl Producer {
    async fn run(
        self,
        events: mpsc::Sender<FeedEvent>,
        init: mpsc::Sender<Result<Vec<TensorInfo>>>,
    ) {
        let mut init = Some(init);
        let result = catch_panic(self.run_epochs(events.clone(), &mut init)).await;
        match (result, init.take()) {
            (Err(err), Some(init)) => {
                let _ = init.send(Err(err));
            }
            (Err(err), None) => {
                let _ = events.send(FeedEvent::Error(err));
            }
            (Ok(()), _) => {
                let _ = events.send(FeedEvent::Done);
            }
        }
    }

    async fn run_epochs(
        &self,
        events: mpsc::Sender<FeedEvent>,
        init: &mut Option<mpsc::Sender<Result<Vec<TensorInfo>>>>,
    ) -> Result<()> {
        let options = &self.options;
        let (first_epoch, first_step) = options.resume;
        let mut epoch_start = Instant::now();
        let first_plan = self.plan_epoch(first_epoch).await?;
        let columns = columns::resolve(&first_plan.plan.schema(), &options.columns)?;
        let length_column =
            if options.token_budget.is_some() || options.bucket_window.is_some() {
                Some(length_column(&columns)?)
            } else {
                None
            };
        if let Some(init) = init.take() {
            let _ = init.send(Ok(tensor_infos(&columns)));
        }
        let target = Arc::new(SinkTarget {
            pool: Arc::clone(&self.pool),
            ready: events.clone(),
            columns,
            batching: Batching {
                batch_rows: options.batch_size,
                rank: options.rank,
                world: options.world,
                drop_last: options.drop_last,
                token_budget: options.token_budget,
                bucket_window: options.bucket_window,
                length_column,
                seed: options.shuffle_seed.unwrap_or(0),
            },
            metrics: Arc::clone(&self.metrics),
        });
        let mut plan = Some(first_plan);
        for epoch in first_epoch..options.epochs {
            let EpochPlan {
                plan: input,
                task_ctx,
                fill,
                dealt,
                after,
            } = match plan.take() {
                Some(plan) => plan,
                None => self.plan_epoch(epoch).await?,
            };
            let skip = if epoch == first_epoch { first_step } else { 0 };
            let sink: Arc<dyn ExecutionPlan> = Arc::new(
                DeviceSinkExec::new(input, Arc::clone(&target), epoch, skip).dealt(dealt),
            );
            catch_panic(collect(Arc::clone(&sink), task_ctx)).await?;
            if let Some(fill) = fill {
                self.cache.commit(&options.session, &fill).await?;
            }
            if let Some(after) = after {
                after()?;
            }
            let rendered = DisplayableExecutionPlan::with_metrics(sink.as_ref())
                .indent(true)
                .to_string();
            let _ = events.send(FeedEvent::EpochEnd {
                epoch,
                plan: rendered,
                seconds: epoch_start.elapsed().as_secs_f64(),
            });
            epoch_start = Instant::now();
        }
        Ok(())
    }

    /// Whether the epoch runs as one cluster job shared by all ranks (every
    /// feed of a cluster session, see [`crate::cluster::SharedJobExec`]):
    /// its result partitions are read in partition order, so an unshuffled
    /// feed's order is as deterministic as on the embedded engine.
    #[cfg(feature = "ballista")]
    fn shared_cluster_job(&self) -> bool {
        self.options.session.cluster().is_some()
    }

    /// The epoch's query as the one cluster job all ranks of the run read.
    #[cfg(feature = "ballista")]
    fn plan_cluster_epoch(
        &self,
        df: datafusion::dataframe::DataFrame,
        scheduler: crate::cluster::SchedulerAddress,
        epoch: u64,
        may_deal: bool,
        completed: Option<crate::cluster::CompletedJob>,
    ) -> Result<(Arc<dyn ExecutionPlan>, Arc<TaskContext>, bool)> {
        let options = &self.options;
        let (state, plan) = df.into_parts();
        // The scheduler plans the job with this rank's settings: the same
        // lanes as an embedded epoch, so its result partitions are the
        // embedded feed's partitions.
        let mut config = state.config().clone();
        crate::config::deterministic_config(&mut config, self.partition_order());
        let state = SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .build();
        let plan = state.optimize(&plan)?;
        // Dealt on the executors, each rank fetches its own batches only;
        // batches by token budget or length buckets depend on the whole
        // stream, and one rank has nothing to deal.
        let deal = (may_deal
            && options.world >= 2
            && options.token_budget.is_none()
            && options.bucket_window.is_none()
            && crate::cluster::SharedJobExec::can_deal(&plan))
        .then_some(crate::shuffle::Deal {
            batch_rows: options.batch_size,
            world: options.world,
            drop_last: options.drop_last,
        });
        // The cache changes the job's result (each row's content hash comes
        // with it): ranks of a cached and an uncached run must not share it.
        let run = xxhash_rust::xxh3::xxh3_64(
            format!(
                "{}\0{:?}\0{}\0{}\0{}\0{:?}",
                options.sql,
                options.shuffle_seed,
                options.run_id,
                options.cache,
                options.order_lanes,
                deal
            )
            .as_bytes(),
        );
        let job_name = format!("sqlfeed-feed-{run:016x}-e{epoch}");
        // Each attempt is the epoch's job, watched for lost executors; a
        // loss re-runs it and skips what this rank already consumed.
        let (rank, session) = (options.rank, options.session.clone());
        let (attempt_state, attempt_scheduler) = (state.clone(), scheduler.clone());
        let attempts: Arc<crate::cluster::AttemptFactory> = Arc::new(move |attempt| {
            let mut job = crate::cluster::SharedJobExec::try_new(
                &attempt_state,
                &plan,
                attempt_scheduler.clone(),
                job_name.clone(),
                rank,
                attempt,
                deal,
            )?;
            if let Some(completed) = &completed {
                job = job.reporting_completion(Arc::clone(completed));
            }
            let job: Arc<dyn ExecutionPlan> = Arc::new(job);
            Ok(crate::cluster::watched(&session, job))
        });
        let job: Arc<dyn ExecutionPlan> = Arc::new(
            crate::cluster::ExactRetryExec::try_new(attempts, scheduler)?,
        );
        Ok((job, Arc::new(TaskContext::from(&state)), deal.is_some()))
    }

    /// The shared folder of executor-kept cache entries, if the session
    /// has one (`sqlfeed.executor_cache_dir`).
    #[cfg(feature = "ballista")]
    fn executor_cache_dir(&self) -> Option<String> {
        let state = self.options.session.context().state();
        state
            .config()
            .options()
            .extensions
            .get::<crate::config::SqlfeedOptions>()
            .map(|o| o.executor_cache_dir.clone())
            .filter(|dir| !dir.is_empty())
    }

    /// A cached, shuffled cluster epoch whose entry the executors keep in
    /// `dir` (`crate::cache::shared`): the first epoch's job writes it where
    /// it computes the rows (not dealt: every row passes the writing tasks
    /// once), later epochs' jobs scan it (dealt as usual); rank 0 commits
    /// the entry when the first epoch ended.
    #[cfg(feature = "ballista")]
    async fn plan_executor_cached_epoch(
        &self,
        scheduler: crate::cluster::SchedulerAddress,
        spec: ShuffleSpec,
        epoch: u64,
        dir: &str,
    ) -> Result<EpochPlan> {
        let options = &self.options;
        let (df, fill) = self
            .cache
            .executor_epoch(&options.session, &options.sql, spec, dir)
            .await?;
        let completed: crate::cluster::CompletedJob = Arc::default();
        let (plan, task_ctx, dealt) = self.plan_cluster_epoch(
            df,
            scheduler,
            epoch,
            fill.is_none(),
            Some(Arc::clone(&completed)),
        )?;
        let after: Option<AfterEpoch> = match fill {
            Some(fill) if options.rank == 0 => Some(Box::new(move || {
                let job = completed.lock().ok().and_then(|job| job.clone());
                let Some((job, rows)) = job else {
                    return Err(DataFusionError::Internal(
                        "the first cached epoch ended without a completed job".into(),
                    ));
                };
                crate::cache::shared::commit(&fill.dir, &fill.key, &job, rows)
            })),
            _ => None,
        };
        Ok(EpochPlan {
            plan,
            task_ctx,
            fill: None,
            dealt,
            after,
        })
    }

    /// What the epoch's plan must keep of its partitions' order.
    fn partition_order(&self) -> crate::config::PartitionOrder {
        match self.options.shuffle_seed {
            // A global shuffle orders rows by content: it keeps the faster
            // work-stealing scan.
            Some(_) => crate::config::PartitionOrder::Content,
            None => {
                crate::config::PartitionOrder::Partitions(Some(self.options.order_lanes))
            }
        }
    }

    /// What an unshuffled feed's cache entry layout depends on: the ordered
    /// partitions an embedded epoch reads, or a cluster job's one stream.
    fn cache_layout(&self) -> String {
        #[cfg(feature = "ballista")]
        if self.shared_cluster_job() {
            return "cluster".to_string();
        }
        self.options.order_lanes.to_string()
    }

    /// The physical plan of one epoch's query and the context to run it in.
    async fn plan_epoch(&self, epoch: u64) -> Result<EpochPlan> {
        let options = &self.options;
        let spec = options
            .shuffle_seed
            .map(|seed| ShuffleSpec::Global { seed, epoch });
        #[cfg(feature = "ballista")]
        if let (Some(scheduler), Some(spec), true) =
            (options.session.cluster(), spec, options.cache)
            && let Some(dir) = self.executor_cache_dir()
        {
            return self
                .plan_executor_cached_epoch(scheduler.clone(), spec, epoch, &dir)
                .await;
        }
        let query = if options.cache {
            self.cache
                .epoch_query(&options.session, &options.sql, spec, self.cache_layout())
                .await?
        } else {
            let df = options.session.sql(&options.sql).await?;
            EpochQuery::Plain(match spec {
                Some(spec) => shuffle(df, spec)?,
                None => df,
            })
        };
        let (df, filling) = match query {
            EpochQuery::Plain(df) => (df, None),
            EpochQuery::Filling { df, finish, fill } => (df, Some((finish, fill))),
        };
        // With the epoch cache, epochs that read the entry run here, on the
        // embedded engine, also in a cluster session: the entry is on this
        // machine (the first epoch computed it on the cluster).
        let reads_local_cache = options.cache && filling.is_none();
        #[cfg(feature = "ballista")]
        if self.shared_cluster_job()
            && !reads_local_cache
            && let Some(scheduler) = options.session.cluster()
        {
            let (state, logical) = (df.clone()).into_parts();
            // A cache fill needs every row of the epoch here.
            let may_deal = filling.is_none();
            let (plan, task_ctx, dealt) =
                self.plan_cluster_epoch(df, scheduler.clone(), epoch, may_deal, None)?;
            // A miss: the job's rows (with their content hashes) are written
            // into the entry here, as they arrive, and finished on the way.
            return Ok(match filling {
                Some((finish, fill)) => EpochPlan {
                    plan: EpochCache::tee(
                        &state,
                        &logical,
                        plan,
                        &finish,
                        &fill,
                        spec.is_some(),
                    )?,
                    task_ctx,
                    fill: Some(fill),
                    dealt,
                    after: None,
                },
                None => EpochPlan {
                    plan,
                    task_ctx,
                    fill: None,
                    dealt,
                    after: None,
                },
            });
        }
        let (state, plan) = df.into_parts();
        #[cfg(feature = "ballista")]
        let state = if reads_local_cache && options.session.cluster().is_some() {
            SessionStateBuilder::new_from_existing(state)
                .with_query_planner(Arc::new(crate::sql::SqlfeedQueryPlanner::embedded()))
                .build()
        } else {
            state
        };
        let mut config = state.config().clone();
        // Seeded augmentations draw per (feed seed, epoch): see udfs' augment.
        config.options_mut().extensions.insert(
            sqlfeed_udfs::augment::AugmentOptions::for_epoch(
                options.shuffle_seed.unwrap_or(0),
                epoch,
            ),
        );
        crate::config::deterministic_config(&mut config, self.partition_order());
        let mut state = SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .build();
        // Functions see the configuration captured here (the epoch above),
        // not the one from when the SQL was parsed.
        state.mark_start_execution();
        let mut physical = catch_panic(state.create_physical_plan(&plan)).await?;
        let fill = match filling {
            Some((finish, fill)) => {
                // The optimizer keeps a plan's schema: the unoptimized plan
                // names the physical plan's columns.
                physical = EpochCache::tee(
                    &state,
                    &plan,
                    physical,
                    &finish,
                    &fill,
                    spec.is_some(),
                )?;
                Some(fill)
            }
            None => None,
        };
        if options.shuffle_seed.is_none() {
            order::check_deterministic_order(&physical)?;
        }
        #[cfg(feature = "ballista")]
        let physical = if reads_local_cache {
            physical
        } else {
            crate::cluster::watched(&options.session, physical)
        };
        Ok(EpochPlan {
            plan: physical,
            task_ctx: Arc::new(TaskContext::from(&state)),
            fill,
            dealt: false,
            after: None,
        })
    }
}

/// One epoch's physical plan, the context to run it in, and the cache
/// entry it fills on the way (a miss of the epoch cache).
struct EpochPlan {
    plan: Arc<dyn ExecutionPlan>,
    task_ctx: Arc<TaskContext>,
    fill: Option<Arc<crate::cache::EntryFill>>,
    /// The plan yields this rank's rows only (a cluster job dealt on the
    /// executors, see `crate::shuffle::deal`), not the whole epoch.
    dealt: bool,
    /// Run once the epoch ended: commits an entry the executors wrote.
    after: Option<AfterEpoch>,
}

/// Work for the end of an epoch.
type AfterEpoch = Box<dyn FnOnce() -> Result<()> + Send>;

/// The one padded column that token budgets and bucketing measure.
fn length_column(columns: &[TensorColumn]) -> Result<(usize, Option<usize>)> {
    let padded: Vec<&TensorColumn> =
        columns.iter().filter(|c| c.mask_name.is_some()).collect();
    match padded.as_slice() {
        [column] => Ok((
            column.index,
            match column.padding {
                columns::Padding::To(len) => Some(len),
                _ => None,
            },
        )),
        _ => Err(DataFusionError::Plan(format!(
            "batch_tokens and bucket_by_length measure the query's variable-length \
             (padded) column, so it needs exactly one; it has {}{}",
            padded.len(),
            if padded.is_empty() {
                String::new()
            } else {
                format!(
                    ": {}",
                    padded
                        .iter()
                        .map(|c| c.name.as_ref())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ))),
    }
}

fn tensor_infos(columns: &[TensorColumn]) -> Vec<TensorInfo> {
    let mut infos = vec![];
    for column in columns {
        infos.push(TensorInfo {
            name: column.name.to_string(),
            dtype: column.dtype,
        });
        if let Some(mask) = &column.mask_name {
            infos.push(TensorInfo {
                name: mask.to_string(),
                dtype: DType::Bool,
            });
        }
    }
    infos
}
