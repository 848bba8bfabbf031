//! A feed's epoch cache (`Feed::builder(…).cache(true)`): the query's
//! result, in its compact form, written while the first epoch streams it and
//! read by every later epoch.
//!
//! ```text
//!  epoch 0, a miss                                  epochs ≥ 1, or a hit
//!  ───────────────                                  ────────────────────
//!  Projection: finish (image_to_tensor(x, …))       Projection: finish
//!    CacheFillExec ──▶ entry (uint8 x, label, hash)   Projection: drop hash
//!      Projection: x, label, content hash               Shuffle: key=content hash
//!        Projection: image_resize(image_decode(…))        CacheScanExec
//!          Shuffle: key=[label, __sqlfeed_row_0]
//!            Parquet scan
//! ```
//!
//! # The same batches
//! Cached rows carry their content hash (see [`crate::shuffle::late`]), and
//! every epoch of a shuffled feed orders by it, whether it reads the query or
//! the entry. An unshuffled feed's first epoch writes partition `p` into
//! part `p`, so later epochs scan the same partition streams in the same
//! order. The finish step applies the split-off functions to the stored
//! values, which is what the query computes. A test compares every batch,
//! cached against uncached.
//!
//! # One evaluation
//! The first epoch's rows are written as the feed consumes them
//! ([`CacheFillExec`]), so the query runs once and the first batch comes as
//! soon as it would uncached. The entry is committed when the epoch ended;
//! if it did not end (an error, a dropped feed), nothing is committed.

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::exec_datafusion_err;
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{Expr, LogicalPlan, ScalarUDF};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;

use crate::Session;
use crate::cache::compact::{apply_finish, compact, finish_exprs};
use crate::cache::{CacheFillExec, CacheLookup, CachedTable, EntryFill};
use crate::shuffle::{
    ShuffleSpec, shuffle_by_content_hash, shuffle_with_content_hash, with_content_hash,
};
use crate::sql::ParallelFunctions;

/// What one epoch reads.
pub(super) enum EpochQuery {
    /// The cache entry (already in finished form), or no cache.
    Plain(DataFrame),
    /// The query with each row's content hash, to be written into `fill`
    /// on the way and then finished by `finish` ([`EpochCache::tee`]).
    Filling {
        df: DataFrame,
        finish: Vec<Expr>,
        fill: Arc<EntryFill>,
    },
}

/// The epoch cache of one feed; see the module docs.
#[derive(Default)]
pub(super) struct EpochCache {
    /// The entry, once found or written, with the query's finish step
    /// (`None`: nothing was split off): later epochs read it without
    /// planning the query again (which lists its files).
    cached: std::sync::OnceLock<(Arc<CachedTable>, Option<Vec<Expr>>)>,
    /// The finish step of the entry being filled, kept for its commit.
    filling_finish: std::sync::Mutex<Option<Vec<Expr>>>,
    /// An earlier epoch of this feed wrote an executor-kept entry (which
    /// rank 0 commits when that epoch ended).
    wrote_shared_entry: std::sync::atomic::AtomicBool,
    /// The committed parts of the executor-kept entry and the finish step,
    /// once found: later epochs read them without planning the query again
    /// (which lists its files and keys its result).
    shared_parts: std::sync::OnceLock<(std::path::PathBuf, Vec<Expr>)>,
    /// A query with a mixture, its sources read from their entries (see
    /// `mixture.rs`): later epochs plan it without planning the sources
    /// again (which lists their files).
    mixture: std::sync::OnceLock<LogicalPlan>,
    /// A feed shuffled by position: the epoch whose order the entry holds
    /// its rows in (the epoch that filled it).
    stored_epoch: std::sync::OnceLock<u64>,
}

impl EpochCache {
    /// What the epoch shuffled by `spec` (or, unshuffled, read in the ordered
    /// partitions `lanes` names) reads: the entry if there is one, else the
    /// query with a fill of the entry.
    pub(super) async fn epoch_query(
        &self,
        session: &Session,
        sql: &str,
        spec: Option<ShuffleSpec>,
        lanes: String,
    ) -> Result<EpochQuery> {
        if let Some((table, finish)) = self.cached.get() {
            let stored = self.stored_epoch.get().copied();
            return read(session, Arc::clone(table), finish.as_deref(), spec, stored);
        }
        if let Some(plan) = self.mixture.get() {
            let df = DataFrame::new(session.context().state(), plan.clone());
            return shuffled(df, spec);
        }
        let (state, plan) = session.sql(sql).await?.into_parts();
        // By position, before anything runs: what it cannot rank (a
        // mixture among them) is refused when the fill is planned, naming
        // the operator.
        if let Some(ShuffleSpec::Positional { seed, epoch }) = spec {
            let compact = compact(plan)?;
            return self
                .by_position(session, state, compact, sql, (seed, epoch))
                .await;
        }
        // A mixture draws other rows every epoch: its sources are kept, not
        // one epoch's rows.
        if super::mixture::has_mixture(&plan)? {
            let plan =
                super::mixture::with_cached_sources(session, &state, plan, sql).await?;
            let plan = self.mixture.get_or_init(|| plan).clone();
            return shuffled(DataFrame::new(state, plan), spec);
        }
        let compact = compact(plan)?;
        let row_key = Arc::new(ScalarUDF::from(crate::sql::RowKeyFunc::new()));
        let keyed = with_content_hash(compact.stored.clone(), Arc::clone(&row_key))?;
        // The entry's layout is part of what later epochs read: a shuffled
        // fill spreads one partition over the parts, an unshuffled one keeps
        // part p = partition p of `lanes`.
        let salt = match spec {
            Some(_) => "feed:shuffled".to_string(),
            None => format!("feed:ordered:{lanes}"),
        };
        let finish = compact.split.then(|| compact.finish.clone());
        match session
            .cache()
            .lookup_or_begin_fill(&state, keyed, sql, &salt)
            .await?
        {
            CacheLookup::Hit(table) => {
                let (table, finish) = self.cached.get_or_init(|| (table, finish));
                read(session, Arc::clone(table), finish.as_deref(), spec, None)
            }
            CacheLookup::Miss(fill) => {
                *self
                    .filling_finish
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = finish;
                let filled = shuffle_with_content_hash(compact.stored, spec, row_key)?;
                Ok(EpochQuery::Filling {
                    df: DataFrame::new(state, filled),
                    finish: compact.finish,
                    fill,
                })
            }
        }
    }

    /// The epoch `(seed, epoch)` shuffled by position of the query split as
    /// `compact`: the entry that epoch `epoch` filled if there is one (its
    /// rows in that epoch's order), else the query with a fill of it. The
    /// entry's key names the seed and the epoch: its order is theirs.
    async fn by_position(
        &self,
        session: &Session,
        state: SessionState,
        compact: crate::cache::compact::CompactPlan,
        sql: &str,
        (seed, epoch): (u64, u64),
    ) -> Result<EpochQuery> {
        let spec = ShuffleSpec::Positional { seed, epoch };
        let salt = format!("feed:by-position:seed={seed}:epoch={epoch}");
        let finish = compact.split.then(|| compact.finish.clone());
        match session
            .cache()
            .lookup_or_begin_fill(&state, compact.stored.clone(), sql, &salt)
            .await?
        {
            CacheLookup::Hit(table) => {
                self.store_order_of(epoch)?;
                let (table, finish) = self.cached.get_or_init(|| (table, finish));
                read(
                    session,
                    Arc::clone(table),
                    finish.as_deref(),
                    Some(spec),
                    Some(epoch),
                )
            }
            CacheLookup::Miss(fill) => {
                self.store_order_of(epoch)?;
                *self
                    .filling_finish
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = finish;
                let filled = crate::shuffle::late::shuffle_plan(compact.stored, spec)?;
                Ok(EpochQuery::Filling {
                    df: DataFrame::new(state, filled),
                    finish: compact.finish,
                    fill,
                })
            }
        }
    }

    /// Records that the entry holds its rows in epoch `epoch`'s order; an
    /// entry of another epoch's order is an internal error, never another
    /// order.
    fn store_order_of(&self, epoch: u64) -> Result<()> {
        match *self.stored_epoch.get_or_init(|| epoch) {
            stored if stored == epoch => Ok(()),
            stored => Err(datafusion::common::internal_datafusion_err!(
                "an epoch cache by position in epoch {stored}'s order, filled again in \
                 epoch {epoch}'s"
            )),
        }
    }

    /// `physical` (planned from `logical`, an [`EpochQuery::Filling`]'s
    /// query) writing into `fill` and finished by `finish`. A shuffled
    /// epoch's one ordered partition is spread over the session's target
    /// partitions when `shuffled` (later scans read them in parallel; the
    /// shuffle orders by content anyway); an unshuffled one, or one
    /// shuffled by position (whose entry's order is the epoch's), keeps a
    /// part per partition.
    pub(super) fn tee(
        state: &SessionState,
        logical: &LogicalPlan,
        physical: Arc<dyn ExecutionPlan>,
        finish: &[Expr],
        fill: &Arc<EntryFill>,
        shuffled: bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let parts = if shuffled {
            state.config().target_partitions()
        } else {
            1
        };
        let filling: Arc<dyn ExecutionPlan> =
            Arc::new(CacheFillExec::try_new(physical, Arc::clone(fill), parts)?);
        let exprs = finish_exprs(state, logical, finish)?;
        let finished: Arc<dyn ExecutionPlan> =
            Arc::new(ProjectionExec::try_new(exprs, filling)?);
        // Planned after the physical optimizer ran: the finish step's costly
        // functions (image_to_tensor) get their parallel workers here.
        ParallelFunctions::default().optimize(finished, state.config_options())
    }

    /// Commits a fill whose epoch ended; later epochs read the entry.
    pub(super) async fn commit(
        &self,
        session: &Session,
        fill: &Arc<EntryFill>,
    ) -> Result<()> {
        let table = session.cache().finish_fill(fill).await?;
        let finish = self
            .filling_finish
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let _ = self.cached.set((table, finish));
        Ok(())
    }
}

/// An entry the executors are writing (`crate::cache::shared`): committed
/// once the epoch ended.
pub(super) struct SharedFill {
    /// The shared cache folder.
    pub(super) dir: std::path::PathBuf,
    /// The entry's key.
    pub(super) key: String,
}

impl EpochCache {
    /// The epoch, shuffled by `spec`, of a cached cluster feed whose entry
    /// the executors keep in the shared folder `dir`: a scan of the
    /// committed parts, or the query writing them on the way (then the
    /// returned fill is committed when the epoch ended).
    pub(super) async fn executor_epoch(
        &self,
        session: &Session,
        sql: &str,
        spec: ShuffleSpec,
        dir: &str,
    ) -> Result<(DataFrame, Option<SharedFill>)> {
        use crate::cache::shared;
        if let Some((parts, finish)) = self.shared_parts.get() {
            return Ok((read_parts(session, parts, finish, spec).await?, None));
        }
        let (state, plan) = session.sql(sql).await?.into_parts();
        let compact = compact(plan)?;
        let row_key = Arc::new(ScalarUDF::from(crate::sql::RowKeyFunc::new()));
        let keyed = with_content_hash(compact.stored.clone(), Arc::clone(&row_key))?;
        // The local cache's key, salted apart from its entries.
        let key = session
            .cache()
            .entry_key(&state, &keyed, "feed:shuffled:executors")
            .await?;
        let dir = std::path::PathBuf::from(dir);
        // After the epoch that wrote the entry, every rank reads it: a rank
        // that gets here before rank 0 committed it waits, so that all ranks
        // plan (and name) the same job.
        let committed = if self
            .wrote_shared_entry
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            Some(wait_for_commit(&dir, &key).await?)
        } else {
            shared::committed_parts(&dir, &key)?
        };
        if let Some(parts) = committed {
            let (parts, finish) =
                self.shared_parts.get_or_init(|| (parts, compact.finish));
            return Ok((read_parts(session, parts, finish, spec).await?, None));
        }
        let filled = shuffle_with_content_hash(compact.stored, Some(spec), row_key)?;
        let folder = shared::entry_dir(&dir, &key).display().to_string();
        let written = shared::SharedEntryWriteNode::try_new(filled, folder)?.into_plan();
        let plan = apply_finish(written, &compact.finish)?;
        self.wrote_shared_entry
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok((DataFrame::new(state, plan), Some(SharedFill { dir, key })))
    }
}

/// The epoch shuffled by `spec` over the executor-kept parts in the folder
/// `parts`, finished by `finish`.
async fn read_parts(
    session: &Session,
    parts: &std::path::Path,
    finish: &[Expr],
    spec: ShuffleSpec,
) -> Result<DataFrame> {
    let (state, scan) = session
        .context()
        .read_arrow(
            parts.display().to_string(),
            datafusion::datasource::file_format::options::ArrowReadOptions::default(),
        )
        .await?
        .into_parts();
    let shuffled = shuffle_by_content_hash(scan, Some(spec))?;
    Ok(DataFrame::new(state, apply_finish(shuffled, finish)?))
}

/// The committed parts of entry `key` in `dir`, once rank 0 committed them.
async fn wait_for_commit(dir: &std::path::Path, key: &str) -> Result<std::path::PathBuf> {
    // As long as a rank waits for rank 0's job (`SharedJobExec`).
    const COMMIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
    let deadline = std::time::Instant::now() + COMMIT_TIMEOUT;
    loop {
        if let Some(parts) = crate::cache::shared::committed_parts(dir, key)? {
            return Ok(parts);
        }
        if std::time::Instant::now() > deadline {
            return Err(exec_datafusion_err!(
                "rank 0 did not commit the executor cache entry {key} in {} within \
                 {COMMIT_TIMEOUT:?} after the epoch that wrote it; is it running the same \
                 feed with the same --executor-cache-dir?",
                dir.display()
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `df` shuffled by `spec`, if any.
fn shuffled(df: DataFrame, spec: Option<ShuffleSpec>) -> Result<EpochQuery> {
    Ok(EpochQuery::Plain(match spec {
        Some(spec) => crate::shuffle::shuffle(df, spec)?,
        None => df,
    }))
}

/// The epoch shuffled by `spec` over the cached `table`, finished by
/// `finish`; shuffled by position, the entry holds its rows in the order of
/// epoch `stored`.
fn read(
    session: &Session,
    table: Arc<CachedTable>,
    finish: Option<&[Expr]>,
    spec: Option<ShuffleSpec>,
    stored: Option<u64>,
) -> Result<EpochQuery> {
    let (state, plan) = session
        .context()
        .read_table(table as Arc<dyn TableProvider>)?
        .into_parts();
    let shuffled = match (spec, stored) {
        // The epoch the entry was filled in: its parts, read in the lanes
        // and turns the feed reads them in, are that epoch's order already.
        (Some(ShuffleSpec::Positional { epoch, .. }), Some(stored))
            if epoch == stored =>
        {
            plan
        }
        (Some(spec @ ShuffleSpec::Positional { .. }), Some(stored)) => {
            LogicalPlan::Extension(datafusion::logical_expr::Extension {
                node: Arc::new(crate::shuffle::ShuffleNode::try_new_keyed(
                    plan,
                    spec,
                    crate::shuffle::ShuffleKey::StoredOrder(stored),
                )?),
            })
        }
        (Some(ShuffleSpec::Positional { .. }), None) => {
            return Err(datafusion::common::internal_datafusion_err!(
                "an epoch cache by position without the epoch of its order"
            ));
        }
        (spec, _) => shuffle_by_content_hash(plan, spec)?,
    };
    let plan = match finish {
        Some(finish) => apply_finish(shuffled, finish)?,
        None => shuffled,
    };
    Ok(EpochQuery::Plain(DataFrame::new(state, plan)))
}
