//! The producer of a feed: plans each epoch's query (on the embedded
//! engine, as a cluster job, or over the epoch cache) and runs one
//! [`DeviceSinkExec`] per epoch into the feed's slot ring.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use datafusion::common::internal_err;
use datafusion::common::plan_err;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::execution::context::SessionState;
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::logical_expr::{Expr, LogicalPlan, ScalarUDF};
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionConfig;

use super::TensorInfo;
use super::columns::{self, TensorColumn};
use super::convert::packed::PackedTensors;
use super::epoch_cache::{EpochCache, EpochQuery};
use super::lookahead::LookaheadExec;
use super::metrics::FeedMetrics;
use super::order;
use super::plan::FeedRows;
use super::plan::{EpochRoute, FeedOrder, FeedPlan};
use super::provenance;
use super::quarantine;
use super::sink::{Batching, DeviceSinkExec, FeedEvent, SinkTarget};
use super::timeline::Timeline;
use super::window_jobs::{WindowJob, WindowJobsExec};
use crate::device::{DType, SlotPool};
use crate::exec::catch_panic;
use crate::session::{
    CompletedJob, DeferredPads, EpochJob, EpochJobPlan, JobMixture, ReadJobs, ScaleOut,
};
use crate::shuffle::{
    BucketRows, EpochSpan, ShuffleSpec, encode_bucket_rows, filters_may_change,
    position_bucket_rows, shuffle, window_count, window_rows, with_bucket_rows,
    with_only_window,
};

/// How often the look-ahead, waiting for the current epoch's first batch,
/// looks.
const FIRST_BATCH_POLL: Duration = Duration::from_millis(20);

/// The producer task: plans, then runs one [`DeviceSinkExec`] per epoch.
pub(super) struct Producer {
    /// The feed, resolved.
    pub(super) plan: FeedPlan,
    pub(super) pool: Arc<tokio::sync::Mutex<SlotPool>>,
    pub(super) metrics: Arc<FeedMetrics>,
    /// Sees each epoch's plan while it runs.
    pub(super) timeline: Arc<Timeline>,
    /// The epoch cache (with `cache(true)`).
    pub(super) cache: EpochCache,
    /// The window jobs of a windowed cluster feed this rank read, over all
    /// epochs: the results it no longer keeps are removed
    /// (`sqlfeed.window_jobs_kept`); made with the first windowed epoch.
    pub(super) read_window_jobs: std::sync::OnceLock<Arc<ReadJobs>>,
    /// A windowed cluster feed's rows per (file, bucket of rows) after its
    /// filters, with the bucket's rows: counted once per run to deal its
    /// windows (`window_counts`).
    pub(super) filtered_rows: std::sync::OnceLock<BucketRows>,
}

impl Producer {
    pub(super) async fn run(
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
        let feed = &self.plan;
        let first_epoch = feed.epochs.start;
        let mut epoch_start = Instant::now();
        let first_plan = self.plan_epoch(first_epoch).await?;
        let schema = quarantine::without_marker(first_plan.plan.schema());
        // A packing feed's batches are its sequences' tensors; an explain's
        // feed (origins) packs too, but hands over each document's origin.
        let packed = match (feed.cut.pack(), &feed.rows) {
            (Some(_), FeedRows::Query) => {
                Some(PackedTensors::resolve(&schema, &feed.columns)?)
            }
            _ => None,
        };
        let columns = columns::resolve(
            &schema,
            match packed {
                Some(_) => &[],
                None => &feed.columns,
            },
        )?;
        let length_column = if feed.cut.measures_lengths() {
            Some(length_column(&columns)?)
        } else {
            None
        };
        if let Some(init) = init.take() {
            let infos = match &packed {
                Some(packed) => packed.tensor_infos(),
                None => tensor_infos(&columns),
            };
            let _ = init.send(Ok(infos));
        }
        let target = Arc::new(SinkTarget {
            pool: Arc::clone(&self.pool),
            ready: events.clone(),
            columns,
            batching: Batching {
                shard: feed.shard,
                bucket_window: feed.cut.bucket_window(),
                length_column,
                seed: feed.order.seed().unwrap_or(0),
            },
            metrics: Arc::clone(&self.metrics),
            skipped_steps: feed.skipped_steps.clone(),
            quarantine: feed.quarantine.clone(),
            packed,
        });
        // The epoch planned ahead (its error surfaces when it would start).
        let mut planned = Some(Ok(first_plan));
        for epoch in feed.epochs.clone() {
            let EpochPlan {
                plan: input,
                task_ctx,
                fill,
                dealt,
                after,
                mixture,
            } = match planned.take() {
                Some(plan) => plan?,
                None => self.plan_epoch(epoch).await?,
            };
            let cut = feed.sink_cut(epoch, length_column, dealt);
            let sink: Arc<dyn ExecutionPlan> = Arc::new(DeviceSinkExec::new(
                input,
                Arc::clone(&target),
                epoch,
                feed.epoch_start(epoch),
                cut,
            ));
            self.timeline.epoch_started(&sink);
            let run = catch_panic(collect(Arc::clone(&sink), task_ctx));
            // The next epoch is planned and started once this one's first
            // batch is here: before, it would take the cores this epoch's
            // first batch waits for (on a cluster: the next job is then
            // planned knowing whether this one met repeated rows).
            if feed.looks_ahead_to(epoch + 1, fill.is_some()) {
                let ended = AtomicBool::new(false);
                let produced = self.metrics.produced.load(Ordering::Relaxed);
                let run = async {
                    let ran = run.await;
                    ended.store(true, Ordering::Relaxed);
                    ran
                };
                let ahead = async {
                    while self.metrics.produced.load(Ordering::Relaxed) == produced
                        && !ended.load(Ordering::Relaxed)
                    {
                        tokio::time::sleep(FIRST_BATCH_POLL).await;
                    }
                    // An epoch shuffled by position holds all its rows: a
                    // second one is started ahead only if the pool has room
                    // for another as large as what it holds now, or, beside
                    // an epoch that spilled, for another spilled one (see
                    // `room_beside_a_spilled_epoch`); else it starts when
                    // this one ends.
                    if feed.holds_epochs_whole()
                        && !(room_for_another_epoch(&feed.session)
                            || spilled_read_back(&sink).is_some_and(|bytes| {
                                room_beside_a_spilled_epoch(&feed.session, bytes)
                            }))
                    {
                        return None;
                    }
                    Some(self.plan_ahead(epoch + 1).await)
                };
                let (ran, ahead) = futures::future::join(run, ahead).await;
                ran?;
                planned = ahead;
            } else {
                run.await?;
            }
            self.timeline.epoch_finished();
            if let Some(fill) = fill {
                self.cache.commit(&feed.session, &fill).await?;
            }
            if let Some(after) = after {
                after()?;
            }
            let rendered = DisplayableExecutionPlan::with_metrics(sink.as_ref())
                .indent(true)
                .to_string();
            let _ = events.send(FeedEvent::EpochEnd {
                epoch,
                mixture: match mixture {
                    // The mixture ran on the cluster.
                    Some(job) => job.lock().map(|rows| rows.clone()).unwrap_or_default(),
                    None => crate::shuffle::mix::mixture_rows(&sink),
                },
                plan: rendered,
                seconds: epoch_start.elapsed().as_secs_f64(),
            });
            epoch_start = Instant::now();
        }
        Ok(())
    }

    /// The physical plan of one epoch's query and the context to run it
    /// in: one match over the epoch's route (see [`FeedPlan::route`]).
    async fn plan_epoch(&self, epoch: u64) -> Result<EpochPlan> {
        let feed = &self.plan;
        match feed.route(epoch) {
            EpochRoute::ExecutorCache {
                scale_out,
                spec,
                dir,
            } => {
                self.plan_executor_cached_epoch(scale_out, spec, epoch, dir)
                    .await
            }
            EpochRoute::Continued {
                appended,
                spec,
                origins,
            } => {
                let df = appended.remaining(&feed.session, &feed.sql, spec).await?;
                let df = match origins {
                    Some(kept) => origins_of(df, kept)?,
                    None => df,
                };
                self.plan_embedded(df, None, epoch).await
            }
            EpochRoute::Origins { kept, spec } => {
                let df = origins_of(self.query(spec).await?, kept)?;
                self.plan_embedded(df, None, epoch).await
            }
            EpochRoute::LocalCache { spec, cluster } => {
                let layout = self.cache_layout();
                let query = (self.cache)
                    .epoch_query(&feed.session, &feed.sql, spec, layout)
                    .await?;
                match (query, cluster) {
                    // A hit: the entry is on this machine.
                    (EpochQuery::Plain(df), _) => {
                        self.plan_embedded(df, None, epoch).await
                    }
                    (EpochQuery::Filling { df, finish, fill }, Some(scale_out)) => {
                        self.plan_cluster_fill(scale_out, df, (finish, fill), spec, epoch)
                    }
                    (EpochQuery::Filling { df, finish, fill }, None) => {
                        self.plan_embedded(df, Some((finish, fill)), epoch).await
                    }
                }
            }
            EpochRoute::Cluster {
                scale_out,
                spec:
                    Some(
                        spec @ ShuffleSpec::Windowed {
                            only_window: None, ..
                        },
                    ),
            } => self.plan_cluster_windows(scale_out, spec, epoch).await,
            EpochRoute::Cluster { scale_out, spec } => {
                let mut df = self.query(spec).await?;
                if let Some(ShuffleSpec::Positional { .. }) = spec {
                    df = self.with_position_counts(df, epoch).await?;
                }
                let may_deal = feed.start_on_the_grid(epoch);
                let (job, mixture) =
                    self.plan_cluster_epoch(scale_out, df, epoch, may_deal, None)?;
                Ok(EpochPlan::of_job(job, None, mixture))
            }
            EpochRoute::Embedded { spec } => {
                let df = self.query(spec).await?;
                self.plan_embedded(df, None, epoch).await
            }
        }
    }

    /// `epoch`'s plan, started ([`LookaheadExec`]): its partitions run into
    /// buffers until the sink reads them.
    async fn plan_ahead(&self, epoch: u64) -> Result<EpochPlan> {
        let plan = self.plan_epoch(epoch).await?;
        let started = LookaheadExec::start(plan.plan, Arc::clone(&plan.task_ctx))?;
        Ok(EpochPlan {
            plan: Arc::new(started),
            ..plan
        })
    }

    /// The feed's query, shuffled by `spec`.
    async fn query(&self, spec: Option<ShuffleSpec>) -> Result<DataFrame> {
        let df = self.plan.session.sql(&self.plan.sql).await?;
        Ok(match spec {
            Some(spec) => shuffle(df, spec)?,
            None => df,
        })
    }

    /// The epoch's query as the one job on the session's cluster that all
    /// ranks of the run read: its result partitions are read in partition
    /// order, so an unshuffled feed's order is as deterministic as on the
    /// embedded engine.
    fn plan_cluster_epoch(
        &self,
        scale_out: &Arc<dyn ScaleOut>,
        query: DataFrame,
        epoch: u64,
        may_deal: bool,
        completed: Option<CompletedJob>,
    ) -> Result<(EpochJobPlan, JobMixture)> {
        let feed = &self.plan;
        let (query, partition_order) = self.epoch_job_query(query, epoch);
        let mixture = JobMixture::default();
        let job = scale_out.epoch_job(EpochJob {
            query,
            partition_order,
            run: self.job_run(),
            epoch,
            rank: feed.shard.rank,
            // A quarantining feed's ranks read the whole order, in which
            // the slot of a failing row takes the row before it.
            deal: feed.deal(may_deal && feed.quarantine.is_none()),
            completed,
            mixture: Some(Arc::clone(&mixture)),
            read: None,
            pads: None,
        })?;
        Ok((job, mixture))
    }

    /// What the ranks of this run name their cluster jobs by. The cache
    /// changes a job's result (each row's content hash comes with it):
    /// ranks of a cached and an uncached run must not share it.
    fn job_run(&self) -> String {
        let feed = &self.plan;
        format!(
            "{}\0{:?}\0{}\0{}\0{}",
            feed.sql,
            feed.order,
            feed.run_id,
            feed.cache,
            feed.quarantine.is_some(),
        )
    }

    /// `query` with `epoch`'s configuration, as its cluster job runs it,
    /// and what the job must keep of its partitions' order.
    fn epoch_job_query(
        &self,
        query: DataFrame,
        epoch: u64,
    ) -> (DataFrame, crate::config::PartitionOrder) {
        let (state, plan) = query.into_parts();
        let config = self.epoch_config(state.config(), epoch);
        let partition_order = self.epoch_partition_order(&plan);
        let state = SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .build();
        (DataFrame::new(state, plan), partition_order)
    }

    /// A windowed epoch on the cluster: one job per window, read in turn
    /// with the next one running ahead ([`WindowJobsExec`]). The windows
    /// are counted here from the footers, as the embedded engine cuts them.
    async fn plan_cluster_windows(
        &self,
        scale_out: &Arc<dyn ScaleOut>,
        spec: ShuffleSpec,
        epoch: u64,
    ) -> Result<EpochPlan> {
        let query = self.query(Some(spec)).await?;
        let counted = self.plan_embedded(query.clone(), None, epoch).await?;
        // Dealt on the executors: each window's place in the epoch is
        // counted now, from the footers or the rows the filters keep
        // (module docs of `window_jobs`).
        let feed = &self.plan;
        let may_deal = feed.start_on_the_grid(epoch) && feed.quarantine.is_none();
        let spans = match feed.deal(may_deal) {
            Some(deal) => self
                .window_counts(&counted.plan, epoch)
                .await?
                .map(|counts| (deal, window_spans(&counts))),
            None => None,
        };
        // The counts number the windows; without them, the footers do.
        let windows = match &spans {
            Some((_, spans)) => Some(spans.len()),
            None => window_count(&counted.plan, &counted.task_ctx).await?,
        };
        let Some(windows) = windows else {
            return internal_err!("a windowed epoch's plan has no WindowedShuffleExec");
        };
        let pads = Arc::new(DeferredPads::default());
        let (query, partition_order) = self.epoch_job_query(query, epoch);
        let (state, plan) = query.into_parts();
        // Each window's job is its own: ranks of the run share it by name.
        let run = self.job_run();
        let rank = self.plan.shard.rank;
        let scale_out = Arc::clone(scale_out);
        let task_ctx = Arc::new(TaskContext::from(&state));
        let read = Arc::clone(self.read_window_jobs.get_or_init(|| {
            let options = crate::config::SqlfeedOptions::of(state.config().options());
            Arc::new(ReadJobs::new(options.window_jobs_kept, (epoch, 0)))
        }));
        let make = move |window: usize| {
            let plan = with_only_window(plan.clone(), window as u64)?;
            // An epoch of no rows has no windows, yet one (empty) job.
            let deal = spans.as_ref().map(|(deal, spans)| {
                deal.within(spans.get(window).copied().unwrap_or_default())
            });
            scale_out.epoch_job(EpochJob {
                query: DataFrame::new(state.clone(), plan),
                partition_order,
                run: format!("{run}\0window {window}"),
                epoch,
                rank,
                deal,
                completed: None,
                mixture: None,
                read: Some((Arc::clone(&read), (epoch, window as u64), windows as u64)),
                pads: deal.map(|_| Arc::clone(&pads)),
            })
        };
        let first = make(0)?;
        let job: WindowJob = Arc::new(move |window: usize| Ok(make(window)?.plan));
        Ok(EpochPlan {
            plan: Arc::new(WindowJobsExec::new(first.plan, windows, job, first.pads)),
            task_ctx,
            fill: None,
            dealt: first.dealt,
            after: None,
            mixture: None,
        })
    }

    /// `df`, an epoch shuffled by position for the cluster, with the rows
    /// its filters keep counted here and sent with the job
    /// (`sqlfeed.position_bucket_rows`): counted once per run (each epoch
    /// where a filter may keep other rows), reading only the filters'
    /// columns, by this process, which runs every function the feed does;
    /// the scheduler, where a Python function is only declared, then runs
    /// no filter. Unfiltered, the footers place the rows: `df` as it is.
    async fn with_position_counts(&self, df: DataFrame, epoch: u64) -> Result<DataFrame> {
        let (counting, rows, run_count) = self.counting_query(epoch).await?;
        // Without a filter the footers place the rows: nothing to plan here.
        if !rows.exists(|node| Ok(matches!(node, LogicalPlan::Filter(_))))? {
            return Ok(df);
        }
        let here = self.plan_embedded(df.clone(), None, epoch).await?;
        let this_epoch = std::sync::OnceLock::new();
        let counted = run_count.unwrap_or(&this_epoch);
        let Some(buckets) =
            position_bucket_rows(&here.plan, &counting, &rows, counted).await?
        else {
            return Ok(df);
        };
        let (state, plan) = df.into_parts();
        let state = with_bucket_rows(&state, encode_bucket_rows(&buckets)).build();
        Ok(DataFrame::new(state, plan))
    }

    /// The rows of each window of the windowed epoch `plan` (planned on
    /// this machine), in window order ([`window_rows`]: with a filter, the
    /// rows it keeps are counted once per run, reading only its columns).
    async fn window_counts(
        &self,
        plan: &Arc<dyn ExecutionPlan>,
        epoch: u64,
    ) -> Result<Option<Vec<u64>>> {
        let (state, rows, run_count) = self.counting_query(epoch).await?;
        let this_epoch = std::sync::OnceLock::new();
        window_rows(plan, &state, &rows, run_count.unwrap_or(&this_epoch)).await
    }

    /// The feed's query as this process counts the rows its filters keep
    /// (for windows, or a cluster epoch by position): planned here, also in
    /// a cluster session (the embedded planner), with epoch `epoch`'s
    /// settings, which a seeded filter may read; and where the run keeps
    /// its count, unless a filter may keep other rows in another epoch
    /// (`None`: counted again for this epoch).
    async fn counting_query(
        &self,
        epoch: u64,
    ) -> Result<(
        SessionState,
        LogicalPlan,
        Option<&std::sync::OnceLock<BucketRows>>,
    )> {
        let feed = &self.plan;
        let (state, rows) = feed.session.sql(&feed.sql).await?.into_parts();
        let config = self.epoch_config(state.config(), epoch);
        let mut state = SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .with_query_planner(Arc::new(crate::sql::SqlfeedQueryPlanner::embedded()))
            .build();
        state.mark_start_execution();
        let run_count = (!filters_may_change(&rows)?).then_some(&self.filtered_rows);
        Ok((state, rows, run_count))
    }

    /// The first epoch of a locally cached feed on the cluster: the job's
    /// rows (with their content hashes) are written into the entry here, as
    /// they arrive, and finished on the way. Not dealt: the entry needs
    /// every row of the epoch.
    fn plan_cluster_fill(
        &self,
        scale_out: &Arc<dyn ScaleOut>,
        df: DataFrame,
        (finish, fill): (Vec<Expr>, Arc<crate::cache::EntryFill>),
        spec: Option<ShuffleSpec>,
        epoch: u64,
    ) -> Result<EpochPlan> {
        let (state, logical) = (df.clone()).into_parts();
        let (job, mixture) =
            self.plan_cluster_epoch(scale_out, df, epoch, false, None)?;
        let plan =
            EpochCache::tee(&state, &logical, job.plan, &finish, &fill, spec.is_some())?;
        Ok(EpochPlan {
            plan,
            task_ctx: job.task_ctx,
            fill: Some(fill),
            dealt: job.dealt,
            after: None,
            mixture: Some(mixture),
        })
    }

    /// A cached, shuffled cluster epoch whose entry the executors keep in
    /// `dir` (`crate::cache::shared`): the first epoch's job writes it where
    /// it computes the rows (not dealt: every row passes the writing tasks
    /// once), later epochs' jobs scan it (dealt as usual); rank 0 commits
    /// the entry when the first epoch ended.
    async fn plan_executor_cached_epoch(
        &self,
        scale_out: &Arc<dyn ScaleOut>,
        spec: ShuffleSpec,
        epoch: u64,
        dir: &str,
    ) -> Result<EpochPlan> {
        let feed = &self.plan;
        let (df, fill) = self
            .cache
            .executor_epoch(&feed.session, &feed.sql, spec, dir)
            .await?;
        let completed: CompletedJob = Arc::default();
        let (job, mixture) = self.plan_cluster_epoch(
            scale_out,
            df,
            epoch,
            fill.is_none() && feed.start_on_the_grid(epoch),
            Some(Arc::clone(&completed)),
        )?;
        let after: Option<AfterEpoch> = match fill {
            Some(fill) if feed.shard.rank == 0 => Some(Box::new(move || {
                let job = completed.lock().ok().and_then(|job| job.clone());
                let Some((job, rows)) = job else {
                    return internal_err!(
                        "the first cached epoch ended without a completed job"
                    );
                };
                crate::cache::shared::commit(&fill.dir, &fill.key, &job, rows)
            })),
            _ => None,
        };
        Ok(EpochPlan::of_job(job, after, mixture))
    }

    /// `config` as epoch `epoch`'s query is planned with ([`FeedPlan::epoch_config`]).
    fn epoch_config(&self, config: &SessionConfig, epoch: u64) -> SessionConfig {
        self.plan.epoch_config(config, epoch)
    }

    /// What the plan of query `plan` must keep of its partitions' order:
    /// nothing of the tables' partitions where every table is read under a
    /// `MIX` or a global `SHUFFLE`.
    fn epoch_partition_order(&self, plan: &LogicalPlan) -> crate::config::PartitionOrder {
        if order::ordered_by_content(plan) {
            crate::config::PartitionOrder::Content
        } else {
            self.partition_order()
        }
    }

    /// What the epoch's plan must keep of its partitions' order.
    fn partition_order(&self) -> crate::config::PartitionOrder {
        match self.plan.order {
            // A global shuffle orders rows by content: it keeps the faster
            // work-stealing scan.
            FeedOrder::Shuffled { .. } => crate::config::PartitionOrder::Content,
            FeedOrder::Unshuffled { lanes } => {
                crate::config::PartitionOrder::Partitions(Some(lanes))
            }
        }
    }

    /// What an unshuffled feed's cache entry layout depends on: the ordered
    /// partitions an embedded epoch reads, or a cluster job's one stream (a
    /// shuffled entry's layout depends on neither).
    fn cache_layout(&self) -> String {
        match (self.plan.source.scale_out(), self.plan.order) {
            (Some(_), _) => "cluster".to_string(),
            (None, FeedOrder::Unshuffled { lanes }) => lanes.to_string(),
            (None, FeedOrder::Shuffled { .. }) => "shuffled".to_string(),
        }
    }

    /// `df`, with the cache entry `filling` it writes on the way, planned
    /// and run on this process's engine (also in a cluster session: the
    /// epoch cache's entry, an explain's origins and a continued epoch's
    /// consumed rows are here).
    async fn plan_embedded(
        &self,
        df: DataFrame,
        filling: Option<(Vec<Expr>, Arc<crate::cache::EntryFill>)>,
        epoch: u64,
    ) -> Result<EpochPlan> {
        let feed = &self.plan;
        let (state, plan) = df.into_parts();
        // Here, also in a cluster session: with the embedded planner.
        let state = if feed.source.scale_out().is_some() {
            SessionStateBuilder::new_from_existing(state)
                .with_query_planner(Arc::new(crate::sql::SqlfeedQueryPlanner::embedded()))
                .build()
        } else {
            state
        };
        let mut config = self.epoch_config(state.config(), epoch);
        crate::config::deterministic_config(
            &mut config,
            self.epoch_partition_order(&plan),
        );
        let mut state = SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .build();
        // Functions see the configuration captured here (the epoch above),
        // not the one from when the SQL was parsed.
        state.mark_start_execution();
        let mut physical = catch_panic(state.create_physical_plan(&plan)).await?;
        let scan_batch_bytes =
            crate::config::SqlfeedOptions::of(state.config().options()).scan_batch_bytes;
        physical = super::scan_batches::fit_scan_batches(
            physical,
            scan_batch_bytes,
            state.config().batch_size(),
            state.runtime_env(),
        )
        .await?;
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
                    // By position, the entry keeps the lanes the feed
                    // reads: their order is the stored order.
                    feed.order.seed().is_some() && !feed.holds_epochs_whole(),
                )?;
                Some(fill)
            }
            None => None,
        };
        if feed.order.seed().is_none() {
            order::check_deterministic_order(&physical)?;
            physical = order::interleave_under_costly_functions(
                physical,
                state.config().batch_size(),
                feed.session.context().copied_config().target_partitions(),
            )?;
        }
        if feed.quarantine.is_some() {
            // Again: the lanes of an unshuffled feed rebuilt the top.
            let batch_bytes = crate::config::SqlfeedOptions::of(state.config().options())
                .function_batch_bytes;
            physical = crate::sql::isolate_output_projections(physical, batch_bytes)?;
        }
        Ok(EpochPlan {
            plan: physical,
            task_ctx: Arc::new(TaskContext::from(&state)),
            fill,
            dealt: false,
            after: None,
            mixture: None,
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
    /// A cluster job's mixture rows, reported when it completed (`None`:
    /// the plan runs here and its `MixExec` counts them).
    mixture: Option<JobMixture>,
}

impl EpochPlan {
    /// The plan of a cluster job: the rows it hands this process (dealt or
    /// the whole epoch), `after` run when the epoch ended.
    fn of_job(job: EpochJobPlan, after: Option<AfterEpoch>, mixture: JobMixture) -> Self {
        Self {
            plan: job.plan,
            task_ctx: job.task_ctx,
            fill: None,
            dealt: job.dealt,
            after,
            mixture: Some(mixture),
        }
    }
}

/// The origins of `df`'s rows (see `provenance`) with the output columns
/// `kept`, instead of its columns.
fn origins_of(df: DataFrame, kept: &[String]) -> Result<DataFrame> {
    let (state, plan) = df.into_parts();
    let row_key = Arc::new(ScalarUDF::from(crate::sql::RowKeyFunc::new()));
    let plan = provenance::origins_plan(plan, row_key, kept)?;
    Ok(DataFrame::new(state, plan))
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
        _ => plan_err!(
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
        ),
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

/// Each window's place in an epoch whose windows give `counts` rows.
fn window_spans(counts: &[u64]) -> Vec<EpochSpan> {
    let rows = counts.iter().sum();
    let mut offset = 0;
    counts
        .iter()
        .map(|&window_rows| {
            let span = EpochSpan {
                offset,
                window_rows,
                rows,
            };
            offset += window_rows;
            span
        })
        .collect()
}

/// What the read-back of a `SHUFFLE BY POSITION` in `plan` that spilled
/// its epoch holds (its metrics, set before its first batch is out), or
/// `None` when none spilled.
fn spilled_read_back(plan: &Arc<dyn ExecutionPlan>) -> Option<usize> {
    let mut read_back = None;
    let _ = plan.apply(|node| {
        if node.name() == "PositionShuffleExec"
            && let Some(bytes) = node
                .metrics()
                .and_then(|m| m.sum_by_name("read_back_bytes"))
                .map(|v| v.as_usize())
                .filter(|&bytes| bytes > 0)
        {
            read_back = Some(bytes);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    read_back
}

/// Whether a next epoch by position could be spilled beside one that
/// spilled and holds `read_back` bytes (its two ranges, reserved up front,
/// about a third of the pool at most): it sizes its own ranges from what
/// is free then, so it has room when at least as much is free; then
/// neither waits for the other.
fn room_beside_a_spilled_epoch(session: &crate::Session, read_back: usize) -> bool {
    has_free(session, |_| read_back)
}

/// Whether the session's pool could hold another epoch as large as what
/// it holds now (a finite pool with at least as much free as reserved).
fn room_for_another_epoch(session: &crate::Session) -> bool {
    has_free(session, |reserved| reserved)
}

/// Whether the session's pool has `bytes(reserved)` free (always, when it
/// has no limit).
fn has_free(session: &crate::Session, bytes: impl FnOnce(usize) -> usize) -> bool {
    use datafusion::execution::memory_pool::MemoryLimit;
    let pool = &session.context().runtime_env().memory_pool;
    match pool.memory_limit() {
        MemoryLimit::Finite(limit) => {
            let reserved = pool.reserved();
            limit.saturating_sub(reserved) >= bytes(reserved)
        }
        _ => true,
    }
}
