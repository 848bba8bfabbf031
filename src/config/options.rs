//! [`SqlfeedOptions`]: sqlfeed's session settings, set like DataFusion's with
//! `SET sqlfeed.<name> = <value>` (or `SessionConfig::options_mut()`).

use std::any::Any;
use std::ops::{Deref, DerefMut};

use datafusion::common::extensions_options;
use datafusion::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::error::Result;

extensions_options! {
    /// The fields of [`SqlfeedOptions`], which lists them under their full
    /// names.
    pub struct SqlfeedSettings {
        /// Run row-wise functions after a `SHUFFLE` instead of before it, so
        /// that the shuffle moves what they read, not what they produce (the
        /// order is the same either way; see `crate::shuffle::late`).
        pub late_materialization: bool, default = true
        /// Of the functions above a one-machine `SHUFFLE`, compute the cheap
        /// ones that do not widen their inputs (`feature_vector`,
        /// arithmetic) between the key and the permutation, which then
        /// gathers their outputs instead of their inputs (the same order and
        /// batches; see `crate::shuffle::CarryCheapOutputs`).
        pub carry_cheap_outputs: bool, default = true
        /// Evaluate costly row-wise functions (image decoding and transforms,
        /// tokenizing) on several cores and in batches of about this many
        /// output bytes, keeping the row order
        /// (`crate::sql::ParallelProjectionExec`); 0 turns it off.
        pub function_batch_bytes: usize, default = 4 << 20
        /// A feed's file scans read record batches of about this many
        /// decoded bytes when their rows are wide (by the files'
        /// statistics), instead of the session's batch size in rows; the
        /// batches a feed hands over are the same (`feed::scan_batches`).
        /// 0 turns it off.
        pub scan_batch_bytes: usize, default = 4 << 20
        /// The consumer reads the result partitions in partition order (a
        /// cluster feed's shared job does): a distributed `SHUFFLE` then
        /// ends in one task per key range instead of one task merging
        /// everything (`crate::shuffle::RangeBucketExec`). Off, the result is
        /// one partition, for consumers that read partitions in any order.
        pub ordered_result_partitions: bool, default = false
        /// With `ordered_result_partitions`, deal the shuffled rows on the
        /// executors to this many training ranks (0 or 1: no deal), so each
        /// rank fetches only its own batches (`crate::shuffle::DealExec`).
        /// Set by a cluster feed's shared job, with the two settings below.
        pub deal_world: usize, default = 0
        /// With `ordered_result_partitions`, plan a distributed `SHUFFLE`
        /// for unique rows: rows go from the scan to their key range, one
        /// exchange fewer than with the stage that numbers repeated rows,
        /// and a repeated row fails the job (`crate::shuffle::REPEATED_ROWS`).
        /// A cluster feed's shared job sets it, and runs the epoch again
        /// without it when rows repeat.
        pub assume_unique_rows: bool, default = false
        /// A cluster feed plans each epoch's job for unique rows first
        /// (`assume_unique_rows`), and runs it again with the stage that
        /// numbers repeated rows if they repeat (then for the rest of the
        /// run). False plans that stage at once: for data known to repeat.
        pub try_unique_rows: bool, default = true
        /// Rows per batch of the dealt feed.
        pub deal_batch_rows: usize, default = 0
        /// Whether the dealt feed drops its last partial step.
        pub deal_drop_last: bool, default = false
        /// With `deal_world`, the job is one window of a windowed epoch
        /// (`SHUFFLE WINDOW` on a cluster) whose rows start at this row of
        /// the epoch; set by a windowed cluster feed with the one below.
        pub deal_epoch_offset: u64, default = 0
        /// With `deal_world`, the rows of the whole epoch the job is a
        /// window of (0: the job is the epoch).
        pub deal_epoch_rows: u64, default = 0
        /// With `deal_epoch_rows`, the rows of the job's own window.
        pub deal_window_rows: u64, default = 0
        /// The rows a `SHUFFLE BY POSITION`'s filter keeps, counted by a
        /// cluster feed's rank before it submits the epoch's job (JSON:
        /// the bucket size and `[file, bucket, rows]` triples), so that the
        /// scheduler places the rows without running the filter itself
        /// (`crate::shuffle::PositionKeyExec`). Empty: the scheduler counts.
        pub position_bucket_rows: String, default = String::new()
        /// A folder every executor and rank of a cluster reaches (a shared
        /// file system): a cached, shuffled cluster feed keeps its entry
        /// there, written by the executors that compute the first epoch
        /// and read by later epochs' jobs (`crate::cache::shared`). Empty:
        /// the entry is kept in each rank's local cache.
        pub executor_cache_dir: String, default = String::new()
        /// On a cluster, run a feed's top-level calls of functions that
        /// only widen their input (`image_to_tensor`: uint8 pixels to
        /// float32, 4× the bytes) on the client after the fetch, so that the
        /// executors write and send the narrow input; the values are the
        /// same either way (`crate::cluster::scale_out`).
        pub widen_on_client: bool, default = true
        /// A feed plans and starts its next epoch while the current one is
        /// consumed (on the embedded engine, where the next epoch does not
        /// read what the current one writes), so that an epoch boundary
        /// does not wait for the next epoch's shuffle; both epochs share the
        /// session's memory limit (`feed::lookahead`).
        pub epoch_lookahead: bool, default = true
        /// Threads that index a one-machine `SHUFFLE`'s permutation once all
        /// its rows are in memory (its scan is over then, and the first
        /// batch waits for this): they place the index in key-range groups,
        /// which a thread of its own then sorts behind the output; 0: the
        /// session's target partitions, 1: the permutation's own task, which
        /// sorts the whole index before the first batch. The order is the
        /// same on any number (`crate::shuffle::PermuteExec`).
        pub shuffle_sort_threads: usize, default = 0
        /// Rows per global step (batch size × world) of the feed the plan
        /// runs for, in which a `MIX`'s weight schedules count their steps;
        /// 0 outside a feed.
        pub feed_step_rows: u64, default = 0
        /// Every projection that computes something runs as a
        /// `crate::sql::ParallelProjectionExec`, so that none is folded
        /// into a file scan, out of reach of a feed's quarantine, which
        /// isolates the failing rows of the projections at the top of the
        /// plan (`feed::quarantine`). Set by a feed with `on_error =
        /// quarantine`.
        pub isolate_row_errors: bool, default = false
        /// A windowed feed on a cluster (`SHUFFLE WINDOW`, one job per
        /// window) keeps this many windows' results on the executors after
        /// a rank read them; older ones are removed at once, so the
        /// executors' disks hold about this many windows plus the one being
        /// read and the one running ahead, not an epoch. A rank further
        /// behind runs a removed window's job again, with the same rows
        /// (`session::ReadJobs`).
        pub window_jobs_kept: usize, default = 1
    }
}

/// Session settings of sqlfeed's optimizer rules and operators (the
/// fields of [`SqlfeedSettings`]).
///
/// Its entries carry their prefix (`sqlfeed.late_materialization`), where
/// `extensions_options!` lists them bare: a cluster client sends a job the
/// entries of its settings as key-value pairs, and a scheduler cannot set
/// a bare key, so `SET sqlfeed.…` never reached a plain query's job.
#[derive(Debug, Clone, Default)]
pub struct SqlfeedOptions(SqlfeedSettings);

impl Deref for SqlfeedOptions {
    type Target = SqlfeedSettings;

    fn deref(&self) -> &SqlfeedSettings {
        &self.0
    }
}

impl DerefMut for SqlfeedOptions {
    fn deref_mut(&mut self) -> &mut SqlfeedSettings {
        &mut self.0
    }
}

impl ExtensionOptions for SqlfeedOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        self.0.set(key, value)
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        self.0
            .entries()
            .into_iter()
            .map(|entry| ConfigEntry {
                key: format!("{}.{}", Self::PREFIX, entry.key),
                ..entry
            })
            .collect()
    }
}

impl SqlfeedOptions {
    /// The settings in `config`, or the defaults where the session has none
    /// registered; borrowed, so that a rule reading one setting per plan
    /// node copies nothing.
    pub fn of(config: &datafusion::config::ConfigOptions) -> &Self {
        static DEFAULTS: std::sync::LazyLock<SqlfeedOptions> =
            std::sync::LazyLock::new(SqlfeedOptions::default);
        config.extensions.get::<Self>().unwrap_or(&DEFAULTS)
    }
}

impl ConfigExtension for SqlfeedOptions {
    const PREFIX: &'static str = "sqlfeed";
}
