//! [`FeedPlan`]: a feed resolved once, when it is built, from the options
//! the user gave ([`FeedBuilder`]): immutable from then on, it is what the
//! producer, the sink and provenance read, never the builder.
//!
//! ```text
//!  FeedBuilder (the user's options)
//!     │  FeedPlan::resolve: validate; pin the Delta Lake versions; check the
//!     │  MIX; list the files; resolve a checkpoint against them (resume
//!     │  point, skipped steps, continuation over appended data)
//!     ▼
//!  FeedPlan { sql, order, shard, cut, epochs, start, rows, source, … }
//!     │  per epoch: route(epoch) — one match, see EpochRoute
//!     ▼
//!  ExecutorCache │ Continued │ Origins │ LocalCache │ Cluster │ Embedded
//! ```
//!
//! The modes are enums whose variants carry their data: an unshuffled feed
//! has order lanes and no seed ([`FeedOrder`]), a feed cut by token budget
//! has no buckets ([`BatchCut`]), an explain's feed feeds origins instead of
//! the query's rows ([`FeedRows`]); a combination that cannot run cannot be
//! built.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use super::FeedBuilder;
use super::OnError;
use super::appended::Appended;
use super::batcher::pack::{PackOptions, PackSpan};
use super::batcher::{Cut, EpochStart, Pack, Shard, Tokens};
use super::checkpoint::{
    AppendedState, CHECKPOINT_VERSION, Checkpoint, ManifestEntry, query_fingerprint,
};
use super::columns::ColumnSpec;
use super::length::FeedLength;
use super::quarantine::{Quarantine, QuarantineLog};
use super::source::EpochSource;
use crate::Session;
use crate::cache::InputFile;
use crate::session::ScaleOut;
use crate::shuffle::{Deal, ShuffleSpec};
use datafusion::prelude::SessionConfig;

/// The order of a feed's epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FeedOrder {
    /// Epoch `e` is the global shuffle `(seed, e)`, in windows of at least
    /// `window` rows if given, keyed by the rows' positions if
    /// `by_position`.
    Shuffled {
        /// The run's seed.
        seed: u64,
        /// Rows per window of a windowed shuffle.
        window: Option<u64>,
        /// `SHUFFLE BY POSITION` (never with a window).
        by_position: bool,
    },
    /// The query's deterministic order over this many partitions (see
    /// `order.rs`).
    Unshuffled {
        /// Partitions the query runs as.
        lanes: usize,
    },
}

impl FeedOrder {
    /// The shuffle of `epoch`, if the feed is shuffled.
    pub(super) fn spec(self, epoch: u64) -> Option<ShuffleSpec> {
        match self {
            FeedOrder::Shuffled {
                seed,
                window: None,
                by_position: true,
            } => Some(ShuffleSpec::Positional { seed, epoch }),
            FeedOrder::Shuffled {
                seed,
                window: None,
                by_position: false,
            } => Some(ShuffleSpec::Global { seed, epoch }),
            FeedOrder::Shuffled {
                seed,
                window: Some(window_rows),
                ..
            } => Some(ShuffleSpec::Windowed {
                seed,
                epoch,
                window_rows,
                only_window: None,
            }),
            FeedOrder::Unshuffled { .. } => None,
        }
    }

    /// The seed, if shuffled.
    pub(super) fn seed(self) -> Option<u64> {
        match self {
            FeedOrder::Shuffled { seed, .. } => Some(seed),
            FeedOrder::Unshuffled { .. } => None,
        }
    }
}

/// How a feed's epochs are cut into batches, beyond the shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchCut {
    /// `batch_size` rows per rank and step.
    Rows,
    /// Batches within a budget of padded tokens of the one variable-length
    /// column.
    Tokens {
        /// Padded tokens per batch.
        budget: usize,
    },
    /// `batch_size` rows, sorted by length within windows of global steps.
    Buckets {
        /// Global steps per window.
        window: usize,
    },
    /// `batch_size` sequences of documents packed to at most `max_tokens`.
    Pack(PackOptions),
}

impl BatchCut {
    /// Whether batches depend on the variable-length column's lengths.
    pub(super) fn measures_lengths(self) -> bool {
        !matches!(self, BatchCut::Rows)
    }

    /// The token budget, if any.
    pub(super) fn token_budget(self) -> Option<usize> {
        match self {
            BatchCut::Tokens { budget } => Some(budget),
            _ => None,
        }
    }

    /// Whether the number of steps depends on the lengths (unknown before
    /// the epoch is read).
    pub(super) fn steps_depend_on_lengths(self) -> bool {
        matches!(self, BatchCut::Tokens { .. } | BatchCut::Pack(_))
    }

    /// The packing, if any.
    pub(super) fn pack(self) -> Option<PackOptions> {
        match self {
            BatchCut::Pack(options) => Some(options),
            _ => None,
        }
    }

    /// The bucketing window, if any.
    pub(super) fn bucket_window(self) -> Option<usize> {
        match self {
            BatchCut::Buckets { window } => Some(window),
            _ => None,
        }
    }
}

/// What a feed's batches hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FeedRows {
    /// The query's rows as tensors (a feed).
    Query,
    /// Each row's origin (file id, row in file) and the output columns
    /// `kept`, computed on the embedded engine: `explain_batch`'s feed (see
    /// `provenance`).
    Origins {
        /// The output columns the batcher measures.
        kept: Vec<String>,
    },
}

/// How one epoch's query is planned and where it runs: chosen by one match
/// in [`FeedPlan::route`].
pub(super) enum EpochRoute<'a> {
    /// A cached, shuffled cluster epoch whose entry the executors keep in
    /// the shared folder `dir` (`crate::cache::shared`).
    ExecutorCache {
        scale_out: &'a Arc<dyn ScaleOut>,
        spec: ShuffleSpec,
        dir: &'a str,
    },
    /// An epoch continued over appended data: the rows not consumed before,
    /// joined against (by position: filtered by) what is held here
    /// (embedded, never cached); with `origins`, each row's origin instead.
    Continued {
        appended: &'a Appended,
        spec: ShuffleSpec,
        origins: Option<&'a [String]>,
    },
    /// Each row's origin, on the embedded engine (the order is the same on
    /// either engine).
    Origins {
        kept: &'a [String],
        spec: Option<ShuffleSpec>,
    },
    /// Through the local epoch cache: a hit reads the entry here; a miss
    /// runs the query (on `cluster` when there is one) and writes it.
    LocalCache {
        spec: Option<ShuffleSpec>,
        cluster: Option<&'a Arc<dyn ScaleOut>>,
    },
    /// The query as one job on the session's cluster.
    Cluster {
        scale_out: &'a Arc<dyn ScaleOut>,
        spec: Option<ShuffleSpec>,
    },
    /// The query on this process's engine.
    Embedded { spec: Option<ShuffleSpec> },
}

/// A feed resolved; see the module docs.
#[derive(Debug)]
pub(super) struct FeedPlan {
    pub(super) session: Session,
    /// The SQL as run: the user's, Delta Lake tables' versions pinned.
    pub(super) sql: String,
    /// The SQL as the user wrote it: what checkpoints fingerprint.
    pub(super) user_sql: String,
    /// The pinned Delta Lake tables, by name as written, and their versions.
    pub(super) delta_versions: BTreeMap<String, u64>,
    pub(super) order: FeedOrder,
    /// Rows per batch, this rank of the world, `drop_last`.
    pub(super) shard: Shard,
    pub(super) cut: BatchCut,
    /// The epochs run: from the resume point's epoch to the last.
    pub(super) epochs: Range<u64>,
    /// Where `epochs.start` starts.
    pub(super) start: EpochStart,
    /// A packing feed's earlier shapes in `epochs.start` (a resume under
    /// another shape; see `batcher::pack`).
    pub(super) pack_history: Arc<[PackSpan]>,
    /// Steps not handed over, by epoch.
    pub(super) skipped_steps: BTreeMap<u64, BTreeSet<u64>>,
    /// How columns become tensors.
    pub(super) columns: Vec<(String, ColumnSpec)>,
    pub(super) rows: FeedRows,
    /// Through the epoch cache.
    pub(super) cache: bool,
    /// An epoch continued over appended data.
    pub(super) appended: Option<Appended>,
    /// The training run's name, shared by its ranks' cluster jobs.
    pub(super) run_id: String,
    /// Where the epochs run.
    pub(super) source: EpochSource,
    /// Failing rows quarantined instead of failing the feed (a feed of the
    /// query's rows with `on_error = quarantine`).
    pub(super) quarantine: Option<Quarantine>,
    /// The session's `sqlfeed.epoch_lookahead`.
    pub(super) lookahead: bool,
}

impl FeedPlan {
    /// `config` as epoch `epoch`'s query is planned with, on either engine
    /// (a cluster's scheduler and executors get these settings with the
    /// job): seeded augmentations draw per (feed seed, epoch), see udfs'
    /// augment; a MIX without SEED/EPOCH takes them too, and its weight
    /// schedules count steps of this feed's global batch.
    pub(super) fn epoch_config(
        &self,
        config: &SessionConfig,
        epoch: u64,
    ) -> SessionConfig {
        let feed = self;
        let mut config = config.clone();
        config.options_mut().extensions.insert(
            sqlfeed_udfs::augment::AugmentOptions::for_epoch(
                feed.order.seed().unwrap_or(0),
                epoch,
            ),
        );
        let mut sqlfeed_options =
            crate::config::SqlfeedOptions::of(config.options()).clone();
        sqlfeed_options.feed_step_rows =
            (feed.shard.batch_rows * feed.shard.world) as u64;
        if feed.quarantine.is_some() {
            // Cheap functions stay with the others in the output
            // projection, where their failing rows are isolated.
            sqlfeed_options.carry_cheap_outputs = false;
            sqlfeed_options.isolate_row_errors = true;
            // A projection on the client would drop the marker column.
            sqlfeed_options.widen_on_client = false;
        }
        config.options_mut().extensions.insert(sqlfeed_options);
        config
    }

    /// `builder`, whose checkpoint is resolved and Delta Lake versions are
    /// pinned already (see [`FeedBuilder::build`]), as a plan feeding
    /// `rows`.
    pub(super) fn of_resolved(builder: FeedBuilder, rows: FeedRows) -> Self {
        let order = match builder.shuffle_seed {
            Some(seed) => FeedOrder::Shuffled {
                seed,
                window: builder.shuffle_window,
                by_position: builder.shuffle_by_position,
            },
            None => FeedOrder::Unshuffled {
                lanes: builder.order_lanes,
            },
        };
        let cut = match (builder.token_budget, builder.bucket_window, builder.pack) {
            (_, _, Some(options)) => BatchCut::Pack(options),
            (Some(budget), _, None) => BatchCut::Tokens { budget },
            (None, Some(window), None) => BatchCut::Buckets { window },
            (None, None, None) => BatchCut::Rows,
        };
        let source = EpochSource::choose(
            &builder.session,
            builder.cache,
            builder.shuffle_seed.is_some() && !builder.shuffle_by_position,
        );
        let user_sql = builder.query_sql().to_string();
        let quarantine = match (builder.on_error, &rows) {
            (OnError::Quarantine(limit), FeedRows::Query) => Some(Quarantine {
                limit,
                log: Arc::new(QuarantineLog::with_rows(&builder.quarantined)),
            }),
            _ => None,
        };
        let lookahead = {
            let state = builder.session.context().state_ref();
            let state = state.read();
            crate::config::SqlfeedOptions::of(state.config().options()).epoch_lookahead
        };
        Self {
            session: builder.session,
            sql: builder.sql,
            user_sql,
            delta_versions: builder.delta_versions,
            order,
            shard: Shard {
                batch_rows: builder.batch_size,
                rank: builder.rank,
                world: builder.world,
                drop_last: builder.drop_last,
            },
            cut,
            epochs: builder.resume.0..builder.epochs,
            start: builder.resume.1,
            pack_history: Arc::from(builder.pack_history.clone()),
            skipped_steps: builder.skipped_steps,
            columns: builder.columns,
            rows,
            cache: builder.cache,
            appended: builder.appended,
            run_id: builder.run_id,
            source,
            quarantine,
            lookahead,
        }
    }

    /// Whether `epoch` is planned and started while the epoch before it is
    /// consumed (`feed::lookahead`), the one before `filling` the local
    /// epoch cache or not: on the embedded engine and as the next cluster
    /// job; not where it depends on the current epoch's end (a cache the
    /// current epoch fills, an executor-cache entry its end commits), not
    /// for an explain's feed (which stops at its batch), not when the
    /// session turned it off (`sqlfeed.epoch_lookahead`).
    pub(super) fn looks_ahead_to(&self, epoch: u64, filling: bool) -> bool {
        if !self.lookahead || !self.epochs.contains(&epoch) {
            return false;
        }
        match self.route(epoch) {
            EpochRoute::Embedded { .. } | EpochRoute::Cluster { .. } => true,
            EpochRoute::LocalCache { cluster: None, .. } => !filling,
            EpochRoute::LocalCache { .. }
            | EpochRoute::ExecutorCache { .. }
            | EpochRoute::Continued { .. }
            | EpochRoute::Origins { .. } => false,
        }
    }

    /// Whether each epoch holds all its rows in memory unless the pool
    /// refuses them (`SHUFFLE BY POSITION`, which then spills by position
    /// range): a look-ahead then needs room for two.
    pub(super) fn holds_epochs_whole(&self) -> bool {
        matches!(
            self.order,
            FeedOrder::Shuffled {
                by_position: true,
                ..
            }
        )
    }

    /// How `epoch` is planned and where it runs; see [`EpochRoute`].
    pub(super) fn route(&self, epoch: u64) -> EpochRoute<'_> {
        let spec = self.order.spec(epoch);
        let continued = self.appended.as_ref().filter(|a| a.epoch == epoch);
        let origins = match &self.rows {
            FeedRows::Origins { kept } => Some(kept.as_slice()),
            FeedRows::Query => None,
        };
        match (&self.source, spec, continued, origins) {
            (EpochSource::ExecutorCache { scale_out, dir }, Some(spec), ..) => {
                EpochRoute::ExecutorCache {
                    scale_out,
                    spec,
                    dir,
                }
            }
            // Only a feed shuffled exactly continues (checked when built).
            (
                _,
                Some(
                    spec @ (ShuffleSpec::Global { .. } | ShuffleSpec::Positional { .. }),
                ),
                Some(appended),
                origins,
            ) => EpochRoute::Continued {
                appended,
                spec,
                origins,
            },
            (_, spec, _, Some(kept)) => EpochRoute::Origins { kept, spec },
            (source, spec, ..) if self.cache => EpochRoute::LocalCache {
                spec,
                cluster: source.scale_out(),
            },
            (source, spec, ..) => match source.scale_out() {
                Some(scale_out) => EpochRoute::Cluster { scale_out, spec },
                None => EpochRoute::Embedded { spec },
            },
        }
    }

    /// Where `epoch`'s batches start: the resume point in the first epoch,
    /// the beginning in later ones.
    pub(super) fn epoch_start(&self, epoch: u64) -> EpochStart {
        if epoch == self.epochs.start {
            self.start
        } else {
            EpochStart::BEGIN
        }
    }

    /// Whether `epoch` may be dealt on the executors: its start is a step
    /// of this shape (a resume under another shape is cut here).
    pub(super) fn start_on_the_grid(&self, epoch: u64) -> bool {
        self.epoch_start(epoch)
            .on_the_grid(self.shard.batch_rows * self.shard.world)
    }

    /// The deal of a cluster job whose rows every rank reads its own of,
    /// when `may_deal` and the batches do not depend on the whole stream
    /// (a token budget or length buckets do) and there are ranks to deal to.
    pub(super) fn deal(&self, may_deal: bool) -> Option<Deal> {
        (may_deal && self.shard.world >= 2 && !self.cut.measures_lengths()).then_some(
            Deal {
                batch_rows: self.shard.batch_rows,
                world: self.shard.world,
                drop_last: self.shard.drop_last,
                span: None,
            },
        )
    }

    /// How the sink cuts an epoch's rows into this rank's batches, the
    /// variable-length column being `length_column` (index, `pad_to`), and
    /// the rows `dealt` to this rank by a cluster job (the executors cut the
    /// shard and the last step) or the whole epoch's.
    pub(super) fn sink_cut(
        &self,
        epoch: u64,
        length_column: Option<(usize, Option<usize>)>,
        dealt: bool,
    ) -> Cut {
        match self.cut {
            BatchCut::Tokens { budget } => Cut::Tokens(Tokens {
                budget,
                column: length_column.map_or(0, |(index, _)| index),
                pad_to: length_column.and_then(|(_, pad_to)| pad_to),
                rank: self.shard.rank,
                world: self.shard.world,
                drop_last: self.shard.drop_last,
            }),
            BatchCut::Pack(options) => Cut::Pack(Pack {
                options,
                column: length_column.map_or(0, |(index, _)| index),
                per_rank: self.shard.batch_rows,
                rank: self.shard.rank,
                world: self.shard.world,
                drop_last: self.shard.drop_last,
                seed: self.order.seed().unwrap_or(0),
                history: match epoch == self.epochs.start {
                    true => Arc::clone(&self.pack_history),
                    false => Arc::from([]),
                },
            }),
            // A step of dealt rows is `B` of this rank's.
            BatchCut::Rows | BatchCut::Buckets { .. } if dealt => Cut::Dealt {
                batch_rows: self.shard.batch_rows,
                world: self.shard.world,
            },
            BatchCut::Rows | BatchCut::Buckets { .. } => Cut::Shard(self.shard),
        }
    }

    /// What the number of batches of the feed depends on.
    pub(super) fn length(&self) -> FeedLength {
        FeedLength {
            session: self.session.clone(),
            sql: self.sql.clone(),
            batch_size: self.shard.batch_rows,
            world: self.shard.world,
            drop_last: self.shard.drop_last,
            steps_depend_on_lengths: self.cut.steps_depend_on_lengths(),
            end_epoch: self.epochs.end,
            resume: (self.epochs.start, self.start),
            skipped_steps: self.skipped_steps.clone(),
            continued: self.appended.as_ref().map(|a| (a.epoch, a.rows)),
        }
    }

    /// The checkpoint of this feed at its start, over the data `data`:
    /// what [`super::Feed::checkpoint`] fills in as batches are handed over.
    pub(super) fn checkpoint_at_start(&self, data: &[InputFile]) -> Checkpoint {
        let epoch = self.epochs.start;
        let (step, rows) = match self.start {
            EpochStart::Rows { rows, first_step } => (first_step, Some(rows)),
            // A token budget's steps have no fixed number of rows.
            EpochStart::Step(step) => (
                step,
                self.cut
                    .token_budget()
                    .is_none()
                    .then(|| step * (self.shard.batch_rows * self.shard.world) as u64),
            ),
        };
        let appended = self.appended.as_ref().map(|appended| AppendedState {
            epoch: appended.epoch,
            // The old files are unchanged (a continuation refuses others).
            data: data
                .iter()
                .filter(|f| appended.old_files.binary_search(&f.location).is_ok())
                .cloned()
                .map(ManifestEntry)
                .collect(),
            rows: appended.rows,
        });
        Checkpoint {
            version: CHECKPOINT_VERSION,
            epoch,
            step,
            rows,
            seed: self.order.seed(),
            shuffle_window: match self.order {
                FeedOrder::Shuffled { window, .. } => window,
                FeedOrder::Unshuffled { .. } => None,
            },
            shuffle_by_position: matches!(
                self.order,
                FeedOrder::Shuffled {
                    by_position: true,
                    ..
                }
            ),
            rank: self.shard.rank,
            world: self.shard.world,
            batch_size: self.shard.batch_rows,
            batch_tokens: self.cut.token_budget(),
            drop_last: self.shard.drop_last,
            pack: self.cut.pack(),
            pack_history: self.pack_history.to_vec(),
            query: query_fingerprint(&self.user_sql),
            skipped: self
                .skipped_steps
                .iter()
                .filter(|(_, steps)| !steps.is_empty())
                .map(|(epoch, steps)| {
                    (epoch.to_string(), steps.iter().copied().collect())
                })
                .collect(),
            appended,
            data: Some(data.iter().cloned().map(ManifestEntry).collect()),
            delta_versions: self.delta_versions.clone(),
            // The resumed checkpoint's rows, which the feed's table starts with.
            quarantined: self
                .quarantine
                .as_ref()
                .map(|q| q.log.rows_before(epoch, rows.unwrap_or(0)))
                .unwrap_or_default(),
        }
    }
}
