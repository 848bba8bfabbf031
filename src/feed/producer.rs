//! The producer of a feed: plans each epoch's query (on the embedded
//! engine, as a cluster job, or over the epoch cache) and runs one
//! [`DeviceSinkExec`] per epoch into the feed's slot ring.

use std::sync::{Arc, mpsc};
use std::time::Instant;

use datafusion::common::internal_err;
use datafusion::common::plan_err;
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::logical_expr::{LogicalPlan, ScalarUDF};
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionConfig;

use super::batcher::{EpochStart, Shard};
use super::columns::{self, TensorColumn};
use super::epoch_cache::{EpochCache, EpochQuery};
use super::metrics::FeedMetrics;
use super::order;
use super::provenance;
use super::sink::{Batching, DeviceSinkExec, FeedEvent, SinkTarget};
use super::source::EpochSource;
use super::timeline::Timeline;
use super::{FeedBuilder, TensorInfo};
use crate::device::{DType, SlotPool};
use crate::exec::catch_panic;
use crate::session::{CompletedJob, EpochJob, EpochJobPlan, JobMixture, ScaleOut};
use crate::shuffle::{ShuffleSpec, shuffle};

/// The producer task: plans, then runs one [`DeviceSinkExec`] per epoch.
pub(super) struct Producer {
    pub(super) options: FeedBuilder,
    pub(super) pool: Arc<tokio::sync::Mutex<SlotPool>>,
    pub(super) metrics: Arc<FeedMetrics>,
    /// Sees each epoch's plan while it runs.
    pub(super) timeline: Arc<Timeline>,
    /// The epoch cache (with `cache(true)`).
    pub(super) cache: EpochCache,
    /// Where the epochs run.
    pub(super) source: EpochSource,
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
        let options = &self.options;
        let first_epoch = options.resume.0;
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
                shard: Shard {
                    batch_rows: options.batch_size,
                    rank: options.rank,
                    world: options.world,
                    drop_last: options.drop_last,
                },
                token_budget: options.token_budget,
                bucket_window: options.bucket_window,
                length_column,
                seed: options.shuffle_seed.unwrap_or(0),
            },
            metrics: Arc::clone(&self.metrics),
            skipped_steps: options.skipped_steps.clone(),
        });
        let mut plan = Some(first_plan);
        for epoch in first_epoch..options.epochs {
            let EpochPlan {
                plan: input,
                task_ctx,
                fill,
                dealt,
                after,
                mixture,
            } = match plan.take() {
                Some(plan) => plan,
                None => self.plan_epoch(epoch).await?,
            };
            let start = self.epoch_start(epoch);
            let sink: Arc<dyn ExecutionPlan> = Arc::new(
                DeviceSinkExec::new(input, Arc::clone(&target), epoch, start)
                    .dealt(dealt),
            );
            self.timeline.epoch_started(&sink);
            catch_panic(collect(Arc::clone(&sink), task_ctx)).await?;
            self.timeline.epoch_finished();
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

    /// Where `epoch`'s batches start: the resume point in the first epoch,
    /// the beginning in later ones.
    fn epoch_start(&self, epoch: u64) -> EpochStart {
        match self.options.resume {
            (first, start) if first == epoch => start,
            _ => EpochStart::BEGIN,
        }
    }

    /// Whether `epoch` may be dealt on the executors: its start is a step
    /// of this shape (a resume under another shape is cut here).
    fn start_on_the_grid(&self, epoch: u64) -> bool {
        let options = &self.options;
        self.epoch_start(epoch)
            .on_the_grid(options.batch_size * options.world)
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
        let options = &self.options;
        // Batches by token budget or length buckets depend on the whole
        // stream, and one rank has nothing to deal.
        let deal = (may_deal
            && options.world >= 2
            && options.token_budget.is_none()
            && options.bucket_window.is_none())
        .then_some(crate::shuffle::Deal {
            batch_rows: options.batch_size,
            world: options.world,
            drop_last: options.drop_last,
        });
        // The cache changes the job's result (each row's content hash comes
        // with it): ranks of a cached and an uncached run must not share it.
        let run = format!(
            "{}\0{:?}\0{}\0{}\0{}",
            options.sql,
            options.shuffle_seed,
            options.run_id,
            options.cache,
            options.order_lanes,
        );
        let (state, plan) = query.into_parts();
        let config = self.epoch_config(state.config(), epoch);
        let partition_order = self.epoch_partition_order(&plan);
        let state = SessionStateBuilder::new_from_existing(state)
            .with_config(config)
            .build();
        let mixture = JobMixture::default();
        let job = scale_out.epoch_job(EpochJob {
            query: DataFrame::new(state, plan),
            partition_order,
            run,
            epoch,
            rank: options.rank,
            deal,
            completed,
            mixture: Some(Arc::clone(&mixture)),
        })?;
        Ok((job, mixture))
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
        let options = &self.options;
        let (df, fill) = self
            .cache
            .executor_epoch(&options.session, &options.sql, spec, dir)
            .await?;
        let completed: CompletedJob = Arc::default();
        let (job, mixture) = self.plan_cluster_epoch(
            scale_out,
            df,
            epoch,
            fill.is_none() && self.start_on_the_grid(epoch),
            Some(Arc::clone(&completed)),
        )?;
        let after: Option<AfterEpoch> = match fill {
            Some(fill) if options.rank == 0 => Some(Box::new(move || {
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
        Ok(EpochPlan {
            plan: job.plan,
            task_ctx: job.task_ctx,
            fill: None,
            dealt: job.dealt,
            after,
            mixture: Some(mixture),
        })
    }

    /// `config` as epoch `epoch`'s query is planned with, on either engine
    /// (a cluster's scheduler and executors get these settings with the
    /// job): seeded augmentations draw per (feed seed, epoch), see udfs'
    /// augment; a MIX without SEED/EPOCH takes them too, and its weight
    /// schedules count steps of this feed's global batch.
    fn epoch_config(&self, config: &SessionConfig, epoch: u64) -> SessionConfig {
        let options = &self.options;
        let mut config = config.clone();
        config.options_mut().extensions.insert(
            sqlfeed_udfs::augment::AugmentOptions::for_epoch(
                options.shuffle_seed.unwrap_or(0),
                epoch,
            ),
        );
        let mut sqlfeed_options =
            crate::config::SqlfeedOptions::of(config.options()).clone();
        sqlfeed_options.feed_step_rows = (options.batch_size * options.world) as u64;
        config.options_mut().extensions.insert(sqlfeed_options);
        config
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
        if self.source.scale_out().is_some() {
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
        if let (EpochSource::ExecutorCache { scale_out, dir }, Some(spec)) =
            (&self.source, spec)
        {
            return self
                .plan_executor_cached_epoch(scale_out, spec, epoch, dir)
                .await;
        }
        let continued = options.appended.as_ref().filter(|a| a.epoch == epoch);
        let query = if let (Some(appended), Some(seed)) =
            (continued, options.shuffle_seed)
        {
            // Not cached: the continued epoch is another set of rows.
            EpochQuery::Plain(
                appended
                    .remaining(&options.session, &options.sql, seed)
                    .await?,
            )
        } else if options.cache {
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
            EpochQuery::Plain(df) if let Some(kept) = &options.origins => {
                let (state, plan) = df.into_parts();
                let row_key = Arc::new(ScalarUDF::from(crate::sql::RowKeyFunc::new()));
                let plan = provenance::origins_plan(plan, row_key, kept)?;
                (DataFrame::new(state, plan), None)
            }
            EpochQuery::Plain(df) => (df, None),
            EpochQuery::Filling { df, finish, fill } => (df, Some((finish, fill))),
        };
        // With the epoch cache, epochs that read the entry run here, on the
        // embedded engine, also in a cluster session: the entry is on this
        // machine (the first epoch computed it on the cluster). So do the
        // origins of a batch: the order is the same on either engine.
        let reads_local_cache = options.cache && filling.is_none();
        // A continued epoch joins against rows held here.
        let embedded =
            reads_local_cache || options.origins.is_some() || continued.is_some();
        if let Some(scale_out) = self.source.scale_out().filter(|_| !embedded) {
            let (state, logical) = (df.clone()).into_parts();
            // A cache fill needs every row of the epoch here.
            let may_deal = filling.is_none() && self.start_on_the_grid(epoch);
            let (
                EpochJobPlan {
                    plan,
                    task_ctx,
                    dealt,
                },
                mixture,
            ) = self.plan_cluster_epoch(scale_out, df, epoch, may_deal, None)?;
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
                    mixture: Some(mixture),
                },
                None => EpochPlan {
                    plan,
                    task_ctx,
                    fill: None,
                    dealt,
                    after: None,
                    mixture: Some(mixture),
                },
            });
        }
        let (state, plan) = df.into_parts();
        // Here, also in a cluster session: with the embedded planner.
        let state = if self.source.scale_out().is_some() {
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
                    spec.is_some(),
                )?;
                Some(fill)
            }
            None => None,
        };
        if options.shuffle_seed.is_none() {
            order::check_deterministic_order(&physical)?;
            physical = order::interleave_under_costly_functions(
                physical,
                state.config().batch_size(),
                options
                    .session
                    .context()
                    .copied_config()
                    .target_partitions(),
            )?;
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
