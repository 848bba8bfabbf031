//! Feed metrics: what the producer and the consumer did, shared as atomics
//! so that reading them never blocks the feed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Live counters of one feed.
#[derive(Debug)]
pub(crate) struct FeedMetrics {
    /// When the feed's build began — before its device, threads, planning
    /// and input listing — so the wall clock and the first batch's latency
    /// count everything from the call, as the peers' clocks do from their
    /// pipeline's construction.
    pub(crate) started: Instant,
    /// Batches handed to the consumer.
    pub(crate) batches: AtomicU64,
    /// Rows (samples) handed to the consumer.
    pub(crate) rows: AtomicU64,
    /// Tensor bytes handed to the consumer.
    pub(crate) bytes: AtomicU64,
    /// Nanoseconds the consumer spent waiting inside `next()`.
    pub(crate) wait_ns: AtomicU64,
    /// Nanoseconds of that waiting spent on the first batch.
    pub(crate) first_wait_ns: AtomicU64,
    /// Nanoseconds of host-to-device copies (CUDA copy-engine time).
    pub(crate) h2d_ns: AtomicU64,
    /// Nanoseconds the producer spent converting rows into tensors.
    pub(crate) convert_ns: AtomicU64,
    /// Nanoseconds the producer waited for a free slot (consumer is slower).
    pub(crate) stall_ns: AtomicU64,
    /// Padding elements in padded tensors.
    pub(crate) padding: AtomicU64,
    /// All elements of padded tensors.
    pub(crate) padded_total: AtomicU64,
    /// Batches the producer handed over (ahead of the consumer's taking
    /// them): a cluster epoch's first one says its job completed.
    pub(crate) produced: AtomicU64,
    /// Nanoseconds from build to the first batch (`u64::MAX` = none yet).
    pub(crate) first_batch_ns: AtomicU64,
    /// A packing feed's whole steps planned for this rank's batches.
    pub(crate) pack_steps: AtomicU64,
    /// Their worst max ÷ mean attention cost across ranks, in millionths.
    pub(crate) pack_imbalance_ppm: AtomicU64,
    /// Nanoseconds from build to the start of the consumer's current wait
    /// (`u64::MAX` = not waiting): the wait in progress, which `wait_ns`
    /// counts only once it ends.
    waiting_since_ns: AtomicU64,
}

impl FeedMetrics {
    /// Counters of a feed whose build began at `started`.
    pub(crate) fn started_at(started: Instant) -> Self {
        Self {
            started,
            batches: AtomicU64::new(0),
            rows: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            first_wait_ns: AtomicU64::new(0),
            h2d_ns: AtomicU64::new(0),
            convert_ns: AtomicU64::new(0),
            stall_ns: AtomicU64::new(0),
            padding: AtomicU64::new(0),
            padded_total: AtomicU64::new(0),
            produced: AtomicU64::new(0),
            first_batch_ns: AtomicU64::new(u64::MAX),
            pack_steps: AtomicU64::new(0),
            pack_imbalance_ppm: AtomicU64::new(0),
            waiting_since_ns: AtomicU64::new(u64::MAX),
        }
    }

    /// The consumer waits for a batch since `since`.
    pub(crate) fn waiting_since(&self, since: Instant) {
        let ns = since.saturating_duration_since(self.started).as_nanos() as u64;
        self.waiting_since_ns.store(ns, Ordering::Relaxed);
    }

    /// The consumer's wait ended after `waited`: counted, and no longer in
    /// progress (in this order, so a reader never misses it).
    pub(crate) fn wait_ended(&self, waited: Duration) {
        Self::add_time(&self.wait_ns, waited);
        self.waiting_since_ns.store(u64::MAX, Ordering::Relaxed);
    }

    /// Seconds the consumer waited so far at `now` (after the build),
    /// the wait in progress included.
    pub(crate) fn wait_s_at(&self, now: Duration) -> f64 {
        let ended = self.wait_ns.load(Ordering::Relaxed);
        let since = self.waiting_since_ns.load(Ordering::Relaxed);
        let current = if since == u64::MAX {
            0
        } else {
            (now.as_nanos() as u64).saturating_sub(since)
        };
        (ended + current) as f64 / 1e9
    }

    pub(crate) fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    pub(crate) fn add_time(counter: &AtomicU64, elapsed: Duration) {
        counter.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    /// A consistent-enough snapshot; `ring_slots` is the ring's size now.
    pub(crate) fn report(&self, ring_slots: usize) -> FeedReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let secs = |ns: u64| ns as f64 / 1e9;
        let first = get(&self.first_batch_ns);
        FeedReport {
            wall_s: self.started.elapsed().as_secs_f64(),
            batches: get(&self.batches),
            rows: get(&self.rows),
            bytes: get(&self.bytes),
            wait_s: secs(get(&self.wait_ns)),
            first_wait_s: secs(get(&self.first_wait_ns)),
            h2d_s: secs(get(&self.h2d_ns)),
            convert_s: secs(get(&self.convert_ns)),
            stall_s: secs(get(&self.stall_ns)),
            ttfb_s: (first != u64::MAX).then(|| secs(first)),
            padding_frac: {
                let total = get(&self.padded_total);
                (total > 0).then(|| get(&self.padding) as f64 / total as f64)
            },
            prefetch: ring_slots.saturating_sub(1),
            pack_imbalance: (get(&self.pack_steps) > 0)
                .then(|| get(&self.pack_imbalance_ppm) as f64 / 1e6),
        }
    }

    /// A packing feed planned a whole step whose ranks' attention costs
    /// have `max ÷ mean` = `imbalance`.
    pub(crate) fn pack_step(&self, imbalance: f64) {
        self.pack_steps.fetch_add(1, Ordering::Relaxed);
        let ppm = (imbalance * 1e6).round() as u64;
        self.pack_imbalance_ppm.fetch_max(ppm, Ordering::Relaxed);
    }
}

/// A snapshot of a feed's metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FeedReport {
    /// Seconds since the feed's build began (planning and listing its
    /// inputs included).
    pub wall_s: f64,
    /// Batches delivered.
    pub batches: u64,
    /// Rows (samples) delivered.
    pub rows: u64,
    /// Tensor bytes delivered.
    pub bytes: u64,
    /// Seconds the consumer waited for data (starvation).
    pub wait_s: f64,
    /// Of which waiting for the first batch (query start-up).
    pub first_wait_s: f64,
    /// Seconds of host-to-device copies (0 on the CPU).
    pub h2d_s: f64,
    /// Seconds the producer spent writing tensors.
    pub convert_s: f64,
    /// Seconds the producer waited for the consumer to release a slot.
    pub stall_s: f64,
    /// Seconds from the start of the build to the first batch.
    pub ttfb_s: Option<f64>,
    /// Share of padded tensors' elements that are padding.
    pub padding_frac: Option<f64>,
    /// Batches the ring prepares ahead now: the `prefetch` option, or fewer
    /// once the ring was fitted to its share of the memory limit.
    pub prefetch: usize,
    /// A packing feed's worst step: the most costly rank's attention cost
    /// (Σ len² of its documents) ÷ the mean over ranks, over the whole
    /// steps fed (an epoch's last, partial step is left out).
    pub pack_imbalance: Option<f64>,
}

impl FeedReport {
    /// Batches per second of wall time.
    pub fn batches_per_s(&self) -> f64 {
        self.batches as f64 / self.wall_s.max(1e-9)
    }

    /// Samples per second of wall time.
    pub fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.wall_s.max(1e-9)
    }

    /// Tensor bytes per second of wall time.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.wall_s.max(1e-9)
    }

    /// Share of wall time the consumer waited for data.
    pub fn wait_frac(&self) -> f64 {
        self.wait_s / self.wall_s.max(1e-9)
    }

    /// The same after the first batch: starvation in steady state.
    pub fn wait_frac_steady(&self) -> f64 {
        let after_first = self.wall_s - self.ttfb_s.unwrap_or(0.0);
        (self.wait_s - self.first_wait_s).max(0.0) / after_first.max(1e-9)
    }
}
