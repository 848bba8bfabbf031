//! The progress bars of long queries (files and bytes read of the total,
//! rows/s) and of `sqlfeed feed` (batches of the run's total, rows/s, the
//! loop's wait).
//!
//! Drawn on stderr only when stderr is a terminal; a query's only once it
//! has run for [`SHOW_AFTER`] (or `$SQLFEED_PROGRESS_DELAY_MS`), so quick
//! queries and piped output see nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;
use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::feed::{FeedLength, FeedReport};
use crate::session::IoCounters;

/// A query shorter than this shows no bar.
const SHOW_AFTER: Duration = Duration::from_millis(800);
/// Refresh interval of the bar.
const TICK: Duration = Duration::from_millis(150);

/// Files and bytes a physical plan scans.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScanTotals {
    /// Distinct files in all scans.
    pub files: usize,
    /// Their total size in bytes.
    pub bytes: u64,
}

impl ScanTotals {
    /// Sums the file scans of `plan`; a file split into ranges counts once.
    pub fn of(plan: &Arc<dyn ExecutionPlan>) -> Self {
        let mut files: HashMap<String, u64> = HashMap::new();
        let _ = plan.apply(|node| {
            if let Some(verify) = node.downcast_ref::<crate::sql::VerifyExec>() {
                for file in verify.files() {
                    files.insert(file.meta.location.to_string(), file.meta.size);
                }
            }
            if let Some(scan) = node.downcast_ref::<DataSourceExec>()
                && let Some(config) = scan.data_source().downcast_ref::<FileScanConfig>()
            {
                for group in &config.file_groups {
                    for file in group.iter() {
                        files.insert(
                            file.object_meta.location.to_string(),
                            file.object_meta.size,
                        );
                    }
                }
            }
            Ok(TreeNodeRecursion::Continue)
        });
        Self {
            files: files.len(),
            bytes: files.values().sum(),
        }
    }
}

/// A running progress bar; cleared when dropped.
pub struct Progress {
    /// The bar (hidden until [`SHOW_AFTER`]).
    bar: ProgressBar,
    /// Rows delivered so far, updated by the consumer.
    rows: Arc<AtomicU64>,
    /// The ticker; aborted on drop.
    _ticker: SpawnedTask<()>,
}

impl Progress {
    /// Starts ticking for a query that scans `totals`, reading `io`.
    pub fn start(totals: ScanTotals, io: Arc<IoCounters>) -> Self {
        let bar = ProgressBar::with_draw_target(
            Some(totals.bytes.max(1)),
            ProgressDrawTarget::hidden(),
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] [{bar:30}] {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        let rows = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let show_after = std::env::var("SQLFEED_PROGRESS_DELAY_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis)
            .unwrap_or(SHOW_AFTER);
        let bytes_at_start = io.bytes_read();
        io.reset_files();
        let ticker = {
            let bar = bar.clone();
            let rows = Arc::clone(&rows);
            SpawnedTask::spawn(async move {
                let mut shown = false;
                loop {
                    tokio::time::sleep(TICK).await;
                    let elapsed = start.elapsed();
                    if !shown && elapsed >= show_after {
                        bar.set_draw_target(ProgressDrawTarget::stderr());
                        shown = true;
                    }
                    let read = io.bytes_read().saturating_sub(bytes_at_start);
                    let rows = rows.load(Ordering::Relaxed);
                    bar.set_position(read.min(totals.bytes));
                    bar.set_message(format!(
                        "{}/{} files, {} of {}, {} rows ({:.0} rows/s)",
                        io.files_read().min(totals.files),
                        totals.files,
                        HumanBytes(read),
                        HumanBytes(totals.bytes),
                        rows,
                        rows as f64 / elapsed.as_secs_f64().max(1e-3)
                    ));
                }
            })
        };
        Self {
            bar,
            rows,
            _ticker: ticker,
        }
    }

    /// Adds delivered rows.
    pub fn add_rows(&self, rows: usize) {
        self.rows.fetch_add(rows as u64, Ordering::Relaxed);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Refresh interval of the feed's bar.
const FEED_TICK: Duration = Duration::from_millis(200);

/// The progress bar of `sqlfeed feed`: a spinner until the run's batches
/// are counted (in the background, so the first batch never waits for the
/// count; the counting task turns it into a bar), then a bar of them.
/// Cleared when dropped.
pub struct FeedProgress {
    bar: ProgressBar,
    /// The last redraw.
    drawn: Instant,
}

impl FeedProgress {
    /// A bar on stderr for a run of `length` capped at `max_batches`,
    /// counted on `runtime`.
    pub fn start(
        length: FeedLength,
        max_batches: Option<u64>,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {pos} batches, {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(FEED_TICK);
        let counted_bar = bar.clone();
        runtime.spawn(async move {
            let counted = match length.rows_per_epoch().await {
                Ok(rows) => length.batches_in_run(rows),
                Err(e) => {
                    log::debug!("the feed's progress bar has no total: {e}");
                    None
                }
            };
            let total = match (counted, max_batches) {
                (Some(counted), Some(max)) => Some(counted.min(max)),
                (counted, max) => counted.or(max),
            };
            if let Some(total) = total {
                counted_bar.set_length(total);
                counted_bar.set_style(
                    ProgressStyle::with_template(
                        "{spinner} [{elapsed_precise}] [{bar:30}] {pos}/{len} batches, \
                         {msg} (ETA {eta})",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
            }
        });
        Self {
            bar,
            drawn: Instant::now(),
        }
    }

    /// Shows `delivered` batches and the feed's `report`, at most every
    /// [`FEED_TICK`].
    pub fn update(&mut self, delivered: u64, report: impl FnOnce() -> FeedReport) {
        if self.drawn.elapsed() < FEED_TICK {
            return;
        }
        self.drawn = Instant::now();
        self.bar.set_position(delivered);
        self.bar.set_message(feed_message(&report()));
    }
}

impl Drop for FeedProgress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Rows, rows/s and the loop's wait of a feed's `report`.
fn feed_message(report: &FeedReport) -> String {
    format!(
        "{} rows, {:.0} rows/s, waited {:.1}%",
        report.rows,
        report.rows_per_s(),
        100.0 * report.wait_frac()
    )
}
