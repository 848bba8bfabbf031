//! A feed's timeline: where its time goes, sampled while it runs, as a
//! self-contained HTML page with a one-line verdict.
//!
//! ```text
//!  sampler thread ─every interval─► Timeline::sample_now
//!                                     │ reads, never blocks the feed:
//!                                     │  • the running epoch's plan metrics
//!                                     │    (busy time per stage, bytes
//!                                     │    scanned, spilled)       stages.rs
//!                                     │  • the feed's counters (rows, the
//!                                     │    loop's wait, conversion, H2D)
//!                                     │  • ready batches in the ring, the
//!                                     │    memory pool's reservation
//!                                     ▼
//!                                   samples (cumulative)
//!                                     │
//!          Feed::timeline() ──────────┴──► verdict.rs ──► page.rs ──► feed.html
//! ```
//!
//! # Memory
//! Samples are cumulative, so halving them (every other one kept) loses no
//! total: past [`MAX_SAMPLES`] the timeline halves its samples and doubles
//! its interval, and a run of any length keeps at most that many.
//!
//! # What it cannot see
//! A cluster feed's operators run on executors: its timeline has the feed's
//! own counters (conversion, H2D, the loop's wait) but no stages.

mod page;
mod stages;
mod verdict;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use datafusion::common::{exec_datafusion_err, resources_datafusion_err};
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::physical_plan::ExecutionPlan;

pub use verdict::{Bound, Verdict};

use self::stages::{PlanTotals, plan_totals};
use super::metrics::FeedMetrics;
use crate::device::Loans;

/// The first sampling interval.
pub(crate) const FIRST_INTERVAL: Duration = Duration::from_millis(100);
/// Samples kept at most (halved, and the interval doubled, past it).
pub(crate) const MAX_SAMPLES: usize = 2048;

/// One moment of a feed, every quantity counted from the feed's start.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineSample {
    /// Seconds since the feed was built.
    pub t_s: f64,
    /// Busy seconds per stage so far (scan, functions, shuffle, …).
    pub busy_s: BTreeMap<String, f64>,
    /// Rows handed to the training loop.
    pub rows: u64,
    /// Seconds the training loop waited for batches.
    pub wait_s: f64,
    /// Seconds of converting rows into tensors.
    pub convert_s: f64,
    /// Seconds of host-to-device copies.
    pub h2d_s: f64,
    /// Seconds the producer waited for the loop to release a slot.
    pub stall_s: f64,
    /// Bytes the scans read.
    pub bytes_scanned: u64,
    /// Bytes spilled to disk.
    pub spilled_bytes: u64,
    /// Batches ready in the prefetch ring at this moment.
    pub ready_batches: usize,
    /// Bytes reserved in the session's memory pool at this moment.
    pub memory_reserved: usize,
}

/// The sampling thread of a running feed; stopping it (or dropping it)
/// ends the thread before returning.
#[derive(Debug)]
pub(crate) struct Sampler {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the timeline needs besides its samples.
struct Recording {
    samples: Vec<TimelineSample>,
    interval: Duration,
    /// The running epoch's plan, walked at every sample.
    running: Option<Arc<dyn ExecutionPlan>>,
    /// Totals of the epochs that finished.
    finished: PlanTotals,
    /// The feed ended: its last sample is taken, no more come (a sample
    /// after the end would count idle seconds as the feed's).
    closed: bool,
}

/// A feed's timeline (see the module docs). Shared by the feed, its
/// producer and whoever renders it; it outlives the feed.
pub struct Timeline {
    metrics: Arc<FeedMetrics>,
    loans: Arc<Loans>,
    memory: Arc<dyn MemoryPool>,
    /// The cores the query's operators run on (the verdict's "workers").
    workers: usize,
    /// What the feed is (its SQL), for the page's title.
    title: String,
    recording: Mutex<Recording>,
}

impl std::fmt::Debug for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline")
            .field("workers", &self.workers)
            .field("samples", &self.samples().len())
            .finish()
    }
}

impl Timeline {
    pub(crate) fn new(
        metrics: Arc<FeedMetrics>,
        loans: Arc<Loans>,
        memory: Arc<dyn MemoryPool>,
        workers: usize,
        title: String,
    ) -> Self {
        Self {
            metrics,
            loans,
            memory,
            workers: workers.max(1),
            title,
            recording: Mutex::new(Recording {
                samples: vec![],
                interval: FIRST_INTERVAL,
                running: None,
                finished: PlanTotals::default(),
                closed: false,
            }),
        }
    }

    fn recording(&self) -> std::sync::MutexGuard<'_, Recording> {
        self.recording.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the sampling thread: a sample every interval until the
    /// returned handle is stopped. A thread, not a task of the feed's
    /// runtime: the runtime's workers are busy with the query (a decoder
    /// holds one for a whole morsel), and a timer among them fires late.
    pub(crate) fn start(self: &Arc<Self>, name: String) -> Result<Sampler> {
        let (stop, stopped) = mpsc::channel::<()>();
        let timeline = Arc::clone(self);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                loop {
                    let interval = timeline.recording().interval;
                    match stopped.recv_timeout(interval) {
                        Err(mpsc::RecvTimeoutError::Timeout) => timeline.sample_now(),
                        // Stopped (the sender is dropped).
                        _ => break,
                    }
                }
            })
            .map_err(|e| {
                resources_datafusion_err!("cannot start the timeline thread: {e}")
            })?;
        Ok(Sampler {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// An epoch's plan starts running.
    pub(crate) fn epoch_started(&self, plan: &Arc<dyn ExecutionPlan>) {
        self.recording().running = Some(Arc::clone(plan));
    }

    /// The running epoch's plan finished: its totals become the base later
    /// epochs add to.
    pub(crate) fn epoch_finished(&self) {
        {
            let mut recording = self.recording();
            if let Some(plan) = recording.running.take() {
                let totals = plan_totals(&plan);
                recording.finished.add(&totals);
            }
        }
        self.sample_now();
    }

    /// The feed ended (finished, failed or dropped): a last sample, then
    /// no more.
    pub(crate) fn close(&self) {
        self.sample_now();
        self.recording().closed = true;
    }

    /// Takes a sample now (nothing once closed).
    pub(crate) fn sample_now(&self) {
        let mut recording = self.recording();
        if recording.closed {
            return;
        }
        let mut totals = recording.finished.clone();
        if let Some(plan) = &recording.running {
            totals.add(&plan_totals(plan));
        }
        let metrics = &self.metrics;
        let secs =
            |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed) as f64 / 1e9;
        let now = metrics.started.elapsed();
        let sample = TimelineSample {
            t_s: now.as_secs_f64(),
            busy_s: totals
                .busy_ns
                .iter()
                .map(|(stage, ns)| (stage.clone(), *ns as f64 / 1e9))
                .collect(),
            rows: metrics.rows.load(Ordering::Relaxed),
            wait_s: metrics.wait_s_at(now),
            convert_s: secs(&metrics.convert_ns),
            h2d_s: secs(&metrics.h2d_ns),
            stall_s: secs(&metrics.stall_ns),
            bytes_scanned: totals.bytes_scanned,
            spilled_bytes: totals.spilled_bytes,
            ready_batches: self.loans.ready(),
            memory_reserved: self.memory.reserved(),
        };
        // A sample within half an interval of the last one replaces it
        // (the samples are cumulative, so nothing is lost): an epoch's end
        // or the feed's close right after a tick would otherwise make an
        // interval too short for its rates to mean anything.
        let too_close = recording.samples.len() > 1
            && recording.samples.last().is_some_and(|last| {
                sample.t_s - last.t_s < recording.interval.as_secs_f64() / 2.0
            });
        if too_close {
            recording.samples.pop();
        }
        recording.samples.push(sample);
        if recording.samples.len() > MAX_SAMPLES {
            // Cumulative samples: keeping every other one (and the last)
            // keeps every total.
            let last = recording.samples.len() - 1;
            let mut index = 0;
            recording.samples.retain(|_| {
                let keep = index % 2 == 0 || index == last;
                index += 1;
                keep
            });
            recording.interval *= 2;
        }
    }

    /// The samples so far, oldest first.
    pub fn samples(&self) -> Vec<TimelineSample> {
        self.recording().samples.clone()
    }

    /// The cores the query's operators run on.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Seconds from the feed's start to its first batch (`None`: none yet).
    pub fn first_batch_s(&self) -> Option<f64> {
        let ns = self.metrics.first_batch_ns.load(Ordering::Relaxed);
        (ns != u64::MAX).then(|| ns as f64 / 1e9)
    }

    /// What bounds the feed, from its samples so far (see [`Verdict`]).
    pub fn verdict(&self) -> Verdict {
        self.verdict_of(&self.samples())
    }

    fn verdict_of(&self, samples: &[TimelineSample]) -> Verdict {
        let first_wait_s =
            self.metrics.first_wait_ns.load(Ordering::Relaxed) as f64 / 1e9;
        Verdict::of(samples, self.first_batch_s(), first_wait_s, self.workers)
    }

    /// The page: a stacked chart of busy time per stage, the loop's wait,
    /// the ring's ready batches and memory, with the verdict on top; one
    /// HTML file with inline SVG, no script, no server.
    pub fn to_html(&self) -> String {
        self.page().0
    }

    /// The page and the verdict it shows (from the same samples).
    pub fn page(&self) -> (String, Verdict) {
        self.sample_now();
        let samples = self.samples();
        let verdict = self.verdict_of(&samples);
        let html = page::render(&self.title, &samples, &verdict, self.workers);
        (html, verdict)
    }

    /// Writes [`Timeline::to_html`] to `path`; returns the verdict it shows.
    pub fn write_html(&self, path: impl AsRef<Path>) -> Result<Verdict> {
        let path = path.as_ref();
        let (html, verdict) = self.page();
        std::fs::write(path, html).map_err(|e| {
            exec_datafusion_err!(
                "cannot write the feed's timeline to {}: {e}",
                path.display()
            )
        })?;
        Ok(verdict)
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::memory_pool::UnboundedMemoryPool;

    use super::*;

    fn timeline() -> Timeline {
        Timeline::new(
            Arc::new(FeedMetrics::started_at(std::time::Instant::now())),
            Arc::new(Loans::default()),
            Arc::new(UnboundedMemoryPool::default()),
            2,
            "SELECT 1".into(),
        )
    }

    #[test]
    fn a_long_run_keeps_at_most_max_samples_and_every_total() {
        let timeline = timeline();
        // Samples taken back to back count as apart.
        timeline.recording().interval = Duration::from_nanos(1);
        for rows in 0..=MAX_SAMPLES as u64 {
            timeline.metrics.rows.store(rows, Ordering::Relaxed);
            timeline.sample_now();
        }
        let samples = timeline.samples();
        assert_eq!(samples.len(), MAX_SAMPLES / 2 + 1);
        assert_eq!(samples.last().map(|s| s.rows), Some(MAX_SAMPLES as u64));
        assert_eq!(timeline.recording().interval, Duration::from_nanos(2));
    }

    #[test]
    fn a_sample_right_after_another_replaces_it() {
        let timeline = timeline();
        for rows in 0..5 {
            timeline.metrics.rows.store(rows, Ordering::Relaxed);
            timeline.sample_now();
        }
        // The first stays; the others came within half an interval.
        let rows: Vec<u64> = timeline.samples().iter().map(|s| s.rows).collect();
        assert_eq!(rows, [0, 4]);
    }

    #[test]
    fn nothing_is_sampled_after_the_feed_ended() {
        let timeline = timeline();
        timeline.sample_now();
        timeline.close();
        timeline.metrics.rows.store(99, Ordering::Relaxed);
        timeline.sample_now();
        let _ = timeline.to_html();
        let samples = timeline.samples();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[1].rows, 0);
    }
}
