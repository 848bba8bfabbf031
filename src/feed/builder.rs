//! [`FeedBuilder`]: a feed's options as the user gives them, checked and
//! resolved (a checkpoint against the data, Delta Lake versions pinned) into
//! the immutable [`FeedPlan`] when the feed is built; the producer, the sink
//! and provenance read the plan, never these options (`tests/module_graph.rs`
//! holds them to it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Instant;

use datafusion::common::plan_err;
use datafusion::common::{internal_err, resources_datafusion_err};
use datafusion::error::Result;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit};

use super::batcher::EpochStart;
use super::batcher::pack::{PackOptions, PackSpan};
use super::checkpoint::{
    Checkpoint, FeedShape, OnDataChange, ResumePoint, query_fingerprint,
};
use super::columns::ColumnSpec;
use super::epoch_cache::EpochCache;
use super::length::FeedLength;
use super::metrics::FeedMetrics;
use super::plan::{FeedPlan, FeedRows};
use super::producer::Producer;
use super::provenance::{self, BatchOrigins, RowOrigin};
use super::timeline::Timeline;
use super::{
    Feed, NEXT_FEED_ID, OnError, QuarantinedRow, RING_SHARE_DIVISOR, appended,
    list_inputs, mixture, on_runtime,
};
use crate::Session;
use crate::cache::InputFile;
use crate::device::{Backend, Device, SlotPool};

/// Options of a [`Feed`]; see the module docs.
///
/// # Examples
///
/// Rank 1 of 2, two shuffled epochs of batches of 64 with the last partial
/// batch dropped, the tensor `x` as float16 and `y` as int32:
///
/// ```
/// # fn main() -> datafusion::error::Result<()> {
/// use sqlfeed::datagen::{GenOptions, generate};
/// use sqlfeed::device::{DType, Device};
/// use sqlfeed::feed::{ColumnSpec, Feed};
///
/// let dir = tempfile::tempdir()?;
/// generate(&GenOptions::new(1000, dir.path()))?;
/// let session = sqlfeed::Session::try_new()?;
/// let sql = format!(
///     "SELECT feature_vector(f0, f1, f2) AS x, label AS y FROM '{}/'",
///     dir.path().display()
/// );
/// let feed = Feed::builder(&session, sql)
///     .shuffle(7)
///     .epochs(2)
///     .batch_size(64)
///     .drop_last(true)
///     .shard(1, 2)
///     .device(Device::Cpu)
///     .column("x", ColumnSpec::new().dtype(DType::Float16))
///     .column("y", ColumnSpec::new().dtype(DType::Int32))
///     .build()?;
/// let batches = feed.collect::<datafusion::error::Result<Vec<_>>>()?;
/// // 1000 rows are 7 global steps of 2 × 64 rows per epoch (the rest dropped).
/// assert_eq!(batches.len(), 2 * 7);
/// assert_eq!(batches[0].tensor("x")?.dtype(), DType::Float16);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FeedBuilder {
    pub(super) session: Session,
    pub(super) sql: String,
    pub(super) shuffle_seed: Option<u64>,
    /// Rows per window of a windowed shuffle (`SHUFFLE WINDOW n`).
    pub(super) shuffle_window: Option<u64>,
    /// Shuffle keyed by the rows' files and rows (`SHUFFLE BY POSITION`).
    pub(super) shuffle_by_position: bool,
    pub(super) batch_size: usize,
    pub(super) drop_last: bool,
    pub(super) prefetch: usize,
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) epochs: u64,
    /// The first epoch and where in it the feed starts.
    pub(super) resume: (u64, EpochStart),
    pub(super) device: Option<Device>,
    pub(super) columns: Vec<(String, ColumnSpec)>,
    pub(super) token_budget: Option<usize>,
    pub(super) bucket_window: Option<usize>,
    pub(super) cache: bool,
    /// Names a training run so that its ranks share one cluster job per epoch.
    pub(super) run_id: String,
    /// Partitions of an unshuffled feed's plan (see `order.rs`).
    pub(super) order_lanes: usize,
    /// Steps not handed over, by epoch.
    pub(super) skipped_steps: BTreeMap<u64, BTreeSet<u64>>,
    /// An epoch continued over appended data (see `appended.rs`).
    pub(super) appended: Option<appended::Appended>,
    /// A checkpoint to resume, resolved against the data when the feed is
    /// built (see `checkpoint.rs`).
    pub(super) checkpoint: Option<(Checkpoint, OnDataChange)>,
    /// The SQL as written, when `sql` is it with Delta Lake versions pinned
    /// (see `sql::delta`).
    pub(super) user_sql: Option<String>,
    /// The pinned Delta Lake tables, by name as written, and their versions.
    pub(super) delta_versions: BTreeMap<String, u64>,
    /// What a row whose functions fail does (see `quarantine`).
    pub(super) on_error: OnError,
    /// The rows a resumed checkpoint had quarantined.
    pub(super) quarantined: Vec<QuarantinedRow>,
    /// Documents packed into sequences (see `batcher::pack`).
    pub(super) pack: Option<PackOptions>,
    /// The shapes a packing feed ran under in its first epoch before this
    /// one (a resume under another shape).
    pub(super) pack_history: Vec<PackSpan>,
}

impl FeedBuilder {
    /// `set(self, value)` for an option that is given, `self` unchanged
    /// for one that is not: `builder.given(seed, FeedBuilder::shuffle)`, for
    /// callers that hold their options as `Option`s (the CLI, Python).
    pub fn given<T>(self, value: Option<T>, set: impl FnOnce(Self, T) -> Self) -> Self {
        match value {
            Some(value) => set(self, value),
            None => self,
        }
    }

    /// Keeps the query's result in the session's epoch cache
    /// ([`crate::cache`]): the first epoch writes it while streaming (the
    /// query runs once, the first batch comes as soon as uncached), later
    /// epochs read it, so decoding and preprocessing run once, while the
    /// shuffle still draws a fresh order per (seed, epoch) and every batch is
    /// the uncached feed's. Stores the compact form where the query's last
    /// step only widens (uint8 pixels under `image_to_tensor`). A later run
    /// of the same query over the same files reuses the entry from disk.
    /// A query with a `MIX` keeps each source's rows instead and draws
    /// every epoch's mixture from them.
    pub fn cache(mut self, cache: bool) -> Self {
        self.cache = cache;
        self
    }

    /// On a cluster session ([`crate::SessionBuilder::cluster`]), the name
    /// the ranks of one training run share: each epoch runs as one cluster
    /// job that rank 0 submits and every rank reads its own output
    /// partition of (see [`crate::cluster::SharedJobExec`]). Runs with
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

    /// Shuffles each epoch in windows of at least `rows` rows drawn from all
    /// over the data (`SHUFFLE WINDOW rows`, see
    /// [`crate::shuffle::WindowedShuffleExec`]) instead of as one exact
    /// permutation: the first batch and every epoch boundary wait for one
    /// window instead of the whole epoch, and memory holds two windows, at
    /// the price of rows of one Parquet row group landing in one window.
    /// Needs [`FeedBuilder::shuffle`]; one Parquet table, row-wise queries.
    /// On a cluster each window is one job, the next submitted while the
    /// current one is read.
    pub fn shuffle_window(mut self, rows: u64) -> Self {
        self.shuffle_window = Some(rows);
        self
    }

    /// Shuffles each epoch exactly, keyed by where each row lives (its
    /// Parquet file and row) instead of by its content (`SHUFFLE BY
    /// POSITION`, see [`crate::shuffle::PositionShuffleExec`]): the first
    /// batch waits for the scan alone, not for hashing and indexing every
    /// row, at the price of an order that follows the files (the same rows
    /// laid out in other files are another order). Needs
    /// [`FeedBuilder::shuffle`]; one Parquet table, row-wise queries; the
    /// epoch is held in memory, or spilled by position range when it does
    /// not fit the session's memory limit (same order). On a cluster each
    /// epoch is one job keyed by position, dealt to the ranks.
    pub fn shuffle_by_position(mut self) -> Self {
        self.shuffle_by_position = true;
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

    /// Sequence packing for language models: the query's one column of
    /// token ids (a list of integers per row, a document) is packed into
    /// `batch_size` sequences per rank of at most `options.max_tokens`
    /// tokens, with no padding between documents; each batch holds
    /// `input_ids`, `position_ids` (restarting per document), `labels` (-100
    /// at each document's first token and in padding) and `cu_seqlens`
    /// (FlashAttention's varlen offsets). Every rank gets the same number of
    /// sequences per step, with balanced attention cost (Σ len²). The plan
    /// is made from the lengths, window by window of the feed's order (see
    /// `docs/packing.md`); a checkpoint resumes under any world size and
    /// batch size, under the same packing.
    ///
    /// ```no_run
    /// # fn main() -> datafusion::error::Result<()> {
    /// use sqlfeed::feed::{Feed, PackOptions};
    /// let session = sqlfeed::Session::builder().build()?;
    /// let tokens = "SELECT tokenize(text, 'tokenizer.json') AS tokens FROM 'corpus/*.parquet'";
    /// let feed = Feed::builder(&session, tokens)
    ///     .shuffle(42)
    ///     .batch_size(8) // sequences per rank
    ///     .pack(PackOptions::new(2048))
    ///     .build()?;
    /// # let _ = feed;
    /// # Ok(())
    /// # }
    /// ```
    pub fn pack(mut self, options: PackOptions) -> Self {
        self.pack = Some(options);
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

    /// Starts at `step` of `epoch`, as an uninterrupted run of this world
    /// size and batch size would be there.
    pub fn resume_at(mut self, epoch: u64, step: u64) -> Self {
        self.resume = (epoch, EpochStart::Step(step));
        self
    }

    /// Starts `epoch` after the first `rows` rows of its order, which all
    /// ranks together consumed before a checkpoint
    /// ([`TensorBatch::next_row_position`]) under any world size and batch
    /// size: the rest of the epoch's order is cut into this feed's batches,
    /// so within the epoch no row is fed twice and none is skipped (but the
    /// pads or drops of the new shape's last step), and later epochs are a
    /// fresh run's. `first_step` numbers the first batch (the checkpoint's
    /// next step; informative under a new shape). Not with
    /// `bucket_by_length`, whose windows are cut from the epoch's start.
    pub fn resume_after_rows(mut self, epoch: u64, rows: u64, first_step: u64) -> Self {
        self.resume = (epoch, EpochStart::Rows { rows, first_step });
        self
    }

    /// Continues `epoch` — whose order over the files `old_files` (as
    /// [`input_files`] names them in a checkpoint's manifest) all ranks had
    /// consumed `rows` rows of at a checkpoint — over the data as it is now,
    /// with files added since: the epoch's batches are then every row of
    /// the old files not consumed plus every row of the added ones, in a
    /// fresh order that is a pure function of (seed, epoch, rows, old files,
    /// data); later epochs are a fresh run's over all of it. Combine with
    /// [`FeedBuilder::resume_after_rows`] to resume a checkpoint taken inside
    /// the continued epoch (its rows count from the continuation). Feeds
    /// shuffled exactly only (by content or by position; not in windows);
    /// an old file that is gone or holds fewer rows is an error naming it.
    /// See `appended.rs`.
    pub fn continue_over_appended(
        mut self,
        epoch: u64,
        old_files: impl IntoIterator<Item = impl Into<String>>,
        rows: u64,
    ) -> Self {
        let mut old_files: Vec<String> = old_files.into_iter().map(Into::into).collect();
        old_files.sort();
        old_files.dedup();
        self.appended = Some(appended::Appended {
            epoch,
            old_files,
            rows,
        });
        if self.resume.0 != epoch {
            self.resume = (epoch, EpochStart::BEGIN);
        }
        self
    }

    /// Resumes `checkpoint` ([`Feed::checkpoint`], or Python's
    /// `state_dict()`): the next batch is the one after the checkpoint's,
    /// under this feed's world size, batch size and token budget, which may
    /// differ from the checkpoint's (the epoch then goes on from the same row
    /// of the same order). Replaces `resume_at`, `resume_after_rows`,
    /// `continue_over_appended` and earlier skipped steps. When the feed is
    /// built the checkpoint is checked against it — another query or seed
    /// is an error saying what differs — and its data manifest against the
    /// files the query reads now: a change is handled as `on_data_change`
    /// says ([`OnDataChange`]).
    pub fn resume_from(
        mut self,
        checkpoint: Checkpoint,
        on_data_change: OnDataChange,
    ) -> Self {
        self.quarantined = checkpoint.quarantined.clone();
        self.checkpoint = Some((checkpoint, on_data_change));
        self
    }

    /// The rows a checkpoint's run quarantined before it (what
    /// [`Self::resume_from`] takes from the checkpoint), for a caller that
    /// resumes by [`Self::resume_point`]: the feed's table starts with them.
    pub fn quarantined_before(mut self, rows: Vec<QuarantinedRow>) -> Self {
        self.quarantined = rows;
        self
    }

    /// What a row whose functions fail does: [`OnError::Fail`] (the
    /// default) ends the feed with an error naming it;
    /// [`OnError::Quarantine`] leaves it out, records it
    /// ([`Feed::quarantined`]) and fills its slot with the nearest row
    /// before it in the epoch's order, so that every rank keeps its step
    /// count and every other row its place (see `feed::quarantine`).
    /// Embedded and on a cluster; not with the epoch cache yet.
    pub fn on_error(mut self, on_error: OnError) -> Self {
        self.on_error = on_error;
        self
    }

    /// What the number of batches of the feed depends on, as the options
    /// say now; after `build`, with a checkpoint resolved, see
    /// [`Feed::length`].
    pub fn length(&self) -> FeedLength {
        FeedPlan::of_resolved(self.clone(), FeedRows::Query).length()
    }

    /// The SQL as the user wrote it (before Delta versions were pinned):
    /// what a checkpoint's query fingerprint is of.
    pub(super) fn query_sql(&self) -> &str {
        self.user_sql.as_deref().unwrap_or(&self.sql)
    }

    /// Pins the Delta Lake tables the query names without a version (see
    /// `sql::delta`): at the resume checkpoint's versions, else at their
    /// newest now. The feed then reads `'…@v<n>'` every epoch.
    #[cfg(feature = "delta")]
    pub(super) fn pin_delta_versions(
        &mut self,
        runtime: &tokio::runtime::Runtime,
    ) -> Result<()> {
        let pins = match &self.checkpoint {
            Some((checkpoint, _)) => checkpoint.delta_versions.clone(),
            None => self.delta_versions.clone(),
        };
        let state = self.session.context().state();
        let sql = self.sql.clone();
        let (pinned, versions) = on_runtime(runtime, async move {
            crate::sql::delta::pin_versions(&state, &sql, &pins).await
        })?;
        if !versions.is_empty() {
            self.user_sql = Some(std::mem::replace(&mut self.sql, pinned));
            self.delta_versions = versions;
        }
        Ok(())
    }

    /// Reads the Delta Lake tables the query names without a version at
    /// these versions (by name as written; a checkpoint's
    /// `delta_versions`) instead of pinning them at their newest when the
    /// feed is built. A checkpoint given to [`FeedBuilder::resume_from`]
    /// brings its own.
    pub fn delta_versions(mut self, versions: BTreeMap<String, u64>) -> Self {
        self.delta_versions = versions;
        self
    }

    /// What a checkpoint's rows depend on, of this feed.
    pub(super) fn shape(&self) -> FeedShape {
        FeedShape {
            query: query_fingerprint(self.query_sql()),
            seed: self.shuffle_seed,
            shuffle_window: self.shuffle_window,
            shuffle_by_position: self.shuffle_by_position,
            world: self.world,
            batch_size: self.batch_size,
            batch_tokens: self.token_budget,
            drop_last: self.drop_last,
            bucketed: self.bucket_window.is_some(),
            pack: self.pack,
        }
    }

    /// Applies the checkpoint given to [`FeedBuilder::resume_from`], if any,
    /// against the files the query reads now (`now`).
    pub(super) fn resolve_checkpoint(mut self, now: &[InputFile]) -> Result<Self> {
        let Some((checkpoint, on_data_change)) = self.checkpoint.take() else {
            return Ok(self);
        };
        let point = checkpoint.resume_point(&self.shape(), now, on_data_change)?;
        Ok(self.resume_point(point))
    }

    /// Leaves out this rank's batches of global steps `steps` of `epoch` —
    /// the batches of a loss spike, when resuming from a checkpoint before
    /// it — and nothing else: every other batch is where it was, so the run
    /// is the uninterrupted one minus those steps. Adds to earlier calls.
    pub fn skip_steps(
        mut self,
        epoch: u64,
        steps: impl IntoIterator<Item = u64>,
    ) -> Self {
        self.skipped_steps.entry(epoch).or_default().extend(steps);
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
        self.build_feeding(FeedRows::Query)
    }

    /// [`Self::build`], the feed's batches holding `rows`: the options are
    /// resolved here, once, into the [`FeedPlan`] the feed runs.
    pub(super) fn build_feeding(self, rows: FeedRows) -> Result<Feed> {
        let started = Instant::now();
        self.validate()?;
        let device = self.device.unwrap_or_else(Device::auto);
        let prefetch = self.prefetch;
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
            .map_err(|e| resources_datafusion_err!("cannot start feed threads: {e}"))?;
        let (plan, data) = self.resolve(&runtime, rows)?;
        let checkpoint = data.map(|data| plan.checkpoint_at_start(&data));
        let metrics = Arc::new(FeedMetrics::started_at(started));
        let memory_pool = &plan.session.context().runtime_env().memory_pool;
        let ring_memory =
            MemoryConsumer::new(format!("feed {id} prefetch ring")).register(memory_pool);
        // The ring's share is set aside before the query runs: a shuffle
        // (spillable) would otherwise take the whole pool while it reads,
        // and the ring could not grow once batches come.
        let ring_share = match memory_pool.memory_limit() {
            MemoryLimit::Finite(limit) => limit / RING_SHARE_DIVISOR,
            _ => 0,
        };
        let pool = SlotPool::new(backend, prefetch + 1)
            .with_reservation(ring_memory, ring_share);
        let loans = pool.loans();
        let pool = Arc::new(tokio::sync::Mutex::new(pool));
        let (events_tx, events) = mpsc::channel();
        let (init_tx, init_rx) = mpsc::channel();
        let timeline = Arc::new(Timeline::new(
            Arc::clone(&metrics),
            Arc::clone(&loans),
            Arc::clone(memory_pool),
            plan.session.context().state().config().target_partitions(),
            plan.user_sql.clone(),
        ));
        let sampler = timeline.start(format!("{thread_name}-timeline"))?;
        let length = plan.length();
        let quarantine = plan.quarantine.as_ref().map(|q| Arc::clone(&q.log));
        let producer = Producer {
            plan,
            pool: Arc::clone(&pool),
            metrics: Arc::clone(&metrics),
            timeline: Arc::clone(&timeline),
            cache: EpochCache::default(),
            read_window_jobs: std::sync::OnceLock::new(),
            filtered_rows: std::sync::OnceLock::new(),
        };
        let task = runtime.spawn(producer.run(events_tx, init_tx));
        let mut feed = Feed {
            id,
            thread_name,
            events: Some(events),
            runtime: Some(runtime),
            task: Some(task),
            metrics,
            timeline,
            sampler: Some(sampler),
            pool: Arc::downgrade(&pool),
            loans,
            device,
            tensors: vec![],
            epoch_plans: vec![],
            epoch_seconds: vec![],
            epoch_mixtures: vec![],
            finished: false,
            waiting_since: None,
            checkpoint,
            length,
            quarantine,
        };
        drop(pool);
        // Planning errors (bad SQL, missing files, untensorable columns) are
        // build errors; the feed's own Drop cleans up on that path.
        match init_rx.recv() {
            Ok(Ok(tensors)) => feed.tensors = tensors,
            Ok(Err(err)) => return Err(err),
            Err(_) => {
                return internal_err!("the feed stopped while planning its query");
            }
        }
        Ok(feed)
    }

    /// Where each row of this rank's batch at `(epoch, step)` came from:
    /// its Parquet file, row group and row, in batch order, without running
    /// the query's preprocessing (see `provenance`). The batch is the one
    /// this feed — or an uninterrupted run of its shape, for a position it
    /// does not reach — hands over there. Feeds cut by `batch_tokens` or
    /// `bucket_by_length` also compute their variable-length column, whose
    /// lengths cut the batches.
    ///
    /// ```no_run
    /// # fn main() -> datafusion::error::Result<()> {
    /// use sqlfeed::feed::Feed;
    /// let session = sqlfeed::Session::try_new()?;
    /// let feed = Feed::builder(
    ///     &session,
    ///     "SELECT image_to_tensor(image_decode(jpeg)) AS x, label AS y FROM 'data/*.parquet'",
    /// )
    /// .shuffle(42)
    /// .batch_size(256)
    /// .shard(5, 8);
    /// // The loss spiked at step 41 213 of epoch 3: what did rank 5 train on?
    /// for row in feed.explain_batch(3, 41_213)?.rows {
    ///     println!("{} row group {} row {}", row.file, row.row_group, row.row);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn explain_batch(&self, epoch: u64, step: u64) -> Result<BatchOrigins> {
        if self.checkpoint.is_some() {
            // The batch of the feed as resumed, over the data as it is now.
            let now = provenance::block_on(super::input_files(&self.session, &self.sql))?;
            return self
                .clone()
                .resolve_checkpoint(&now)?
                .explain_batch(epoch, step);
        }
        if self
            .skipped_steps
            .get(&epoch)
            .is_some_and(|steps| steps.contains(&step))
        {
            return plan_err!(
                "step {step} of epoch {epoch} is skipped (skip_steps): no batch is \
                 handed over there"
            );
        }
        // Batches cut by length need the one variable-length column the
        // batcher measures (and so the function that computes it).
        let kept = if self.token_budget.is_some()
            || self.bucket_window.is_some()
            || self.pack.is_some()
        {
            provenance::block_on(provenance::variable_length_outputs(
                &self.session,
                &self.sql,
                &self.columns,
            ))?
        } else {
            vec![]
        };
        let mut origins = self.clone();
        // Another epoch's continuation does not change this one; this
        // epoch's is followed through its anti join.
        origins.appended = self.appended.clone().filter(|a| a.epoch == epoch);
        origins.columns = self
            .columns
            .iter()
            .filter(|(name, _)| kept.contains(name))
            .cloned()
            .collect();
        origins.device = Some(Device::Cpu);
        origins.cache = false;
        origins.prefetch = 2;
        origins.epochs = origins.epochs.max(epoch + 1);
        origins.resume = match self.resume {
            // A resume under another shape numbers its steps from there.
            (first, start @ EpochStart::Rows { first_step, .. })
                if first == epoch && first_step <= step =>
            {
                (first, start)
            }
            _ => (epoch, EpochStart::Step(step)),
        };
        let feed = origins.build_feeding(FeedRows::Origins { kept })?;
        provenance::batch_origins(
            feed,
            &self.session,
            &self.sql,
            (epoch, step),
            provenance::ExplainedShape {
                rank: self.rank,
                world: self.world,
                batch_size: self.batch_size,
                drop_last: self.drop_last,
            },
        )
    }

    /// `rows` (a feed's [`Feed::quarantined`], by epoch and position) with
    /// the file, row group and row each came from: one pass of the feed's
    /// origins query (see `provenance`: without the preprocessing) per
    /// epoch, up to the last row asked.
    pub fn quarantine_origins(
        &self,
        mut rows: Vec<QuarantinedRow>,
    ) -> Result<Vec<QuarantinedRow>> {
        if self.checkpoint.is_some() {
            // The rows of the feed as resumed, over the data as it is now.
            let now = provenance::block_on(super::input_files(&self.session, &self.sql))?;
            return self
                .clone()
                .resolve_checkpoint(&now)?
                .quarantine_origins(rows);
        }
        rows.sort_by_key(|row| (row.epoch, row.position));
        let epochs: BTreeSet<u64> = rows.iter().map(|row| row.epoch).collect();
        for epoch in epochs {
            let in_epoch: Vec<&mut QuarantinedRow> =
                rows.iter_mut().filter(|row| row.epoch == epoch).collect();
            let mut positions: Vec<u64> =
                in_epoch.iter().map(|row| row.position).collect();
            positions.dedup();
            let mut origins = self.clone();
            origins.appended = self.appended.clone().filter(|a| a.epoch == epoch);
            origins.columns = vec![];
            origins.device = Some(Device::Cpu);
            origins.cache = false;
            origins.prefetch = 2;
            // The order is the same under any cut: one rank, plain batches.
            (origins.rank, origins.world) = (0, 1);
            origins.batch_size = 8192;
            origins.drop_last = false;
            origins.token_budget = None;
            origins.bucket_window = None;
            origins.pack = None;
            origins.skipped_steps = BTreeMap::new();
            origins.on_error = OnError::Fail;
            origins.epochs = epoch + 1;
            origins.resume = (epoch, EpochStart::BEGIN);
            let feed = origins.build_feeding(FeedRows::Origins { kept: vec![] })?;
            let found =
                provenance::position_origins(feed, &self.session, &self.sql, &positions)?;
            let by_position: BTreeMap<u64, RowOrigin> =
                positions.into_iter().zip(found).collect();
            for row in in_epoch {
                row.origin = by_position.get(&row.position).cloned();
            }
        }
        Ok(rows)
    }

    /// What a shuffle by position needs of the rest of the feed.
    fn check_shuffle_by_position(&self) -> Result<()> {
        let refuse = |why: &str| {
            plan_err!(
                "shuffle_by_position (SHUFFLE BY POSITION) {why}; or shuffle by content \
                 (leave shuffle_by_position out)"
            )
        };
        if self.shuffle_seed.is_none() {
            return refuse("orders a shuffled feed: give a shuffle seed too");
        }
        if self.shuffle_window.is_some() {
            return refuse(
                "orders the whole epoch at once and has no windows: give shuffle_window \
                 or shuffle_by_position, not both",
            );
        }
        Ok(())
    }

    /// What a windowed shuffle needs of the rest of the feed.
    fn check_shuffle_window(&self, rows: u64) -> Result<()> {
        let refuse = |why: &str| {
            plan_err!(
                "shuffle_window={rows} (SHUFFLE WINDOW) {why}; or shuffle the whole epoch \
                 exactly (leave shuffle_window out)"
            )
        };
        if rows == 0 {
            return refuse("must hold at least 1 row");
        }
        if self.shuffle_seed.is_none() {
            return refuse("orders a shuffled feed: give a shuffle seed too");
        }
        if self.cache {
            return refuse(
                "does not work with the epoch cache yet: a cached epoch is reshuffled \
                 whole; turn the cache off",
            );
        }
        if self.appended.is_some() {
            return refuse(
                "cannot continue an epoch over appended data (new files change the \
                 windows); start the epoch anew (on_data_change='restart_epoch')",
            );
        }
        Ok(())
    }

    /// The options resolved into the feed's plan, on `runtime`: the Delta
    /// Lake versions pinned, the MIX checked and, for a feed of the query's
    /// rows, the files listed (returned: what its checkpoints record, so
    /// that a resume over changed data is noticed; an explain's feed is
    /// internal and takes none) and a checkpoint resolved against them.
    fn resolve(
        mut self,
        runtime: &tokio::runtime::Runtime,
        rows: FeedRows,
    ) -> Result<(FeedPlan, Option<Vec<InputFile>>)> {
        #[cfg(feature = "delta")]
        if self.user_sql.is_none() {
            self.pin_delta_versions(runtime)?;
        }
        {
            let (session, sql) = (self.session.clone(), self.sql.clone());
            let shuffled = self.shuffle_seed.is_some();
            let window = self.shuffle_window;
            on_runtime(runtime, async move {
                mixture::check(&session, &sql, shuffled, window).await
            })?;
        }
        let data = match rows {
            FeedRows::Origins { .. } => None,
            FeedRows::Query => {
                let data = list_inputs(runtime, &self.session, &self.sql)?;
                if self.checkpoint.is_some() {
                    self = self.resolve_checkpoint(&data)?;
                    self.validate()?;
                }
                Some(data)
            }
        };
        Ok((FeedPlan::of_resolved(self, rows), data))
    }

    /// The checkpoint this feed would start at, resolved as
    /// [`Self::build`] resolves it (a checkpoint given to
    /// [`Self::resume_from`] checked against the data now, the Delta Lake
    /// versions pinned, the files listed), without starting it: what a
    /// position is before its first batch ([`Feed::checkpoint`] then moves
    /// it batch by batch).
    pub fn start_checkpoint(self) -> Result<Checkpoint> {
        self.validate()?;
        let runtime = planning_runtime(1, "sqlfeed-checkpoint")?;
        let (plan, data) = self.resolve(&runtime, FeedRows::Query)?;
        Ok(plan.checkpoint_at_start(&data.unwrap_or_default()))
    }

    /// Epoch `epoch` of this feed by position, map-style: its length and
    /// row `i` of its order (before ranks and batches), at the cost of
    /// reading that row's window, or its row group for a feed shuffled by
    /// position, on this machine. The feed must be shuffled in windows
    /// ([`Self::shuffle_window`]) or by position
    /// ([`Self::shuffle_by_position`]); see [`EpochDataset`].
    ///
    /// ```no_run
    /// # fn main() -> datafusion::error::Result<()> {
    /// use sqlfeed::feed::Feed;
    /// let session = sqlfeed::Session::try_new()?;
    /// let feed = Feed::builder(&session, "SELECT id, label FROM 'data/*.parquet'")
    ///     .shuffle(42)
    ///     .shuffle_window(65_536);
    /// let epoch = feed.dataset(3)?;
    /// println!("{} rows; row 1000: {:?}", epoch.len()?, epoch.row(1000)?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn dataset(&self, epoch: u64) -> Result<super::EpochDataset> {
        self.validate()?;
        // The dataset's own runtime, which also resolves the options.
        // As many threads as cores: a window or a batch of row groups is
        // read by as many partitions as the session has.
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let runtime = planning_runtime(cores.max(2), "sqlfeed-dataset")?;
        match self.clone().resolve(&runtime, FeedRows::Query) {
            Ok((plan, _)) => super::EpochDataset::try_new(plan, epoch, runtime),
            Err(e) => {
                // Without waiting: a runtime dropped where blocking is not
                // allowed (an async caller) would panic.
                runtime.shutdown_background();
                Err(e)
            }
        }
    }

    /// The checkpoint this feed starts at as its options say, without
    /// resolving them (no checkpoint given to [`Self::resume_from`] is
    /// applied, no Delta Lake version pinned) or listing the files: its
    /// `data` is `None` until a feed lists them.
    pub fn unlisted_start_checkpoint(&self) -> Checkpoint {
        let mut checkpoint =
            FeedPlan::of_resolved(self.clone(), FeedRows::Query).checkpoint_at_start(&[]);
        checkpoint.data = None;
        checkpoint
    }

    /// Starts at `point` (of [`Checkpoint::resume_point`] or
    /// [`Checkpoint::own_point`]): its epoch and step or rows, its skipped
    /// steps and its continuation over appended data. Replaces
    /// `resume_at`, `resume_after_rows`, `continue_over_appended` and
    /// earlier skipped steps.
    pub fn resume_point(mut self, point: ResumePoint) -> Self {
        self.resume = match point.rows {
            Some(rows) => (
                point.epoch,
                EpochStart::Rows {
                    rows,
                    first_step: point.step,
                },
            ),
            None => (point.epoch, EpochStart::Step(point.step)),
        };
        self.skipped_steps = point.skipped;
        self.pack_history = point.pack_history;
        self.appended = point.appended.map(|appended| {
            let mut old_files: Vec<String> =
                appended.data.into_iter().map(|f| f.0.location).collect();
            old_files.sort();
            old_files.dedup();
            appended::Appended {
                epoch: appended.epoch,
                old_files,
                rows: appended.rows,
            }
        });
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        let plan_error = |msg: String| plan_err!("{msg}");
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
        if self.bucket_window.is_some()
            && let (_, EpochStart::Rows { rows, .. }) = self.resume
            && !self.resume.1.on_the_grid(self.batch_size * self.world)
        {
            return plan_error(format!(
                "cannot resume a bucket_by_length feed after {rows} rows: its windows are \
                 cut from the epoch's start, so it resumes only at a step of its own \
                 batch size and world size ({} rows each)",
                self.batch_size * self.world
            ));
        }
        if self.resume.0 >= self.epochs {
            return plan_error(format!(
                "cannot resume at epoch {}: the feed has epochs 0..{}",
                self.resume.0,
                self.epochs - 1
            ));
        }
        if let Some(appended) = &self.appended {
            if self.shuffle_seed.is_none() {
                return plan_error(
                    "an unshuffled feed cannot continue an epoch over appended data: its \
                     order over partitions changes when files join the listing, so the \
                     rows consumed before cannot be found again; start the epoch anew"
                        .into(),
                );
            }
            if self.resume.0 != appended.epoch {
                return plan_error(format!(
                    "the feed resumes at epoch {} but continues epoch {} over appended \
                     data: both must name the checkpoint's epoch",
                    self.resume.0, appended.epoch
                ));
            }
        }
        if self.prefetch == 0 {
            return plan_error("prefetch must be at least 1".into());
        }
        if let OnError::Quarantine(limit) = self.on_error {
            limit.checked()?;
            if self.cache {
                return plan_error(
                    "on_error='quarantine' does not work with the epoch cache yet: the \
                     cache stores rows, not which of them failed. Turn the cache off, or \
                     fix the rows first (`sqlfeed verify` finds damaged images)"
                        .into(),
                );
            }
        }
        if self.order_lanes == 0 {
            return plan_error("order_lanes must be at least 1".into());
        }
        if let Some(rows) = self.shuffle_window {
            self.check_shuffle_window(rows)?;
        }
        if self.shuffle_by_position {
            self.check_shuffle_by_position()?;
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
        if self.pack.is_none() && !self.pack_history.is_empty() {
            return plan_error(
                "the checkpoint is a packing feed's (it records the shapes it was packed \
                 under): resume it with pack=… as it was written"
                    .into(),
            );
        }
        if let Some(pack) = self.pack {
            if pack.max_tokens == 0 || pack.window == 0 {
                return plan_error(format!(
                    "pack={} with a window of {} documents: both must be at least 1",
                    pack.max_tokens, pack.window
                ));
            }
            if self.token_budget.is_some() || self.bucket_window.is_some() {
                return plan_error(
                    "pack cuts batches of batch_size sequences itself: it does not \
                     combine with batch_tokens or bucket_by_length"
                        .into(),
                );
            }
            if self.appended.is_some() {
                return plan_error(
                    "a packing feed cannot continue an epoch over appended data: its \
                     windows are cut from the epoch's start; start the epoch anew \
                     (on_data_change='restart_epoch')"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

/// A runtime of `threads` workers named `name` that resolves a feed's
/// options (and, for a dataset, reads its windows) outside a feed.
fn planning_runtime(threads: usize, name: &str) -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| resources_datafusion_err!("cannot start a thread: {e}"))
}
