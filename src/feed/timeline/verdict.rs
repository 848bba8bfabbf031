//! The timeline's one-line verdict: does the training loop wait for the
//! feed, and if so, which stage is the feed's bottleneck.
//!
//! Measured after the first batch (planning and the first batch's work are
//! the start-up, reported apart by the feed's `ttfb_s`):
//! - the loop's **wait share**: seconds it waited in `next()` over the
//!   window's seconds;
//! - each stage's **busy share**: its busy seconds over the window's seconds
//!   × the query's workers (cores). A stage near 100% uses every core.
//!
//! A loop that waits less than [`LOOP_BOUND_WAIT`] of the time is the
//! bottleneck itself: a faster feed would not make training faster. Else
//! the busiest stage is named.

use std::fmt;

use super::TimelineSample;

/// A loop that waits less than this share of the time is not starved.
pub const LOOP_BOUND_WAIT: f64 = 0.05;

/// What bounds a feed's speed.
#[derive(Debug, Clone, PartialEq)]
pub enum Bound {
    /// No batch yet, or too short a window to say.
    Starting,
    /// The training loop: it rarely waits for data.
    Loop,
    /// The loop waits; this stage is the busiest part of the feed.
    Stage(String),
    /// The loop waits, but no stage ran on this machine (a cluster feed's
    /// operators run on its executors).
    Remote,
}

/// The verdict on a feed's samples (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// What bounds the feed.
    pub bound: Bound,
    /// Rows per second delivered after the first batch.
    pub rows_per_s: f64,
    /// Share of the window the loop waited for batches.
    pub wait_frac: f64,
    /// Busy share of each stage in the window, busiest first.
    pub busy_frac: Vec<(String, f64)>,
    /// Seconds after the first batch the verdict covers.
    pub window_s: f64,
    /// The cores the query runs on.
    pub workers: usize,
}

/// The window must be at least this long to say anything.
const MIN_WINDOW_S: f64 = 0.05;

impl Verdict {
    pub(crate) fn of(
        samples: &[TimelineSample],
        first_batch_s: Option<f64>,
        first_wait_s: f64,
        workers: usize,
    ) -> Self {
        let starting = Self {
            bound: Bound::Starting,
            rows_per_s: 0.0,
            wait_frac: 0.0,
            busy_frac: vec![],
            window_s: 0.0,
            workers,
        };
        let (Some(first_batch_s), Some(last)) = (first_batch_s, samples.last()) else {
            return starting;
        };
        let window_s = last.t_s - first_batch_s;
        if window_s < MIN_WINDOW_S {
            return Self {
                window_s: window_s.max(0.0),
                ..starting
            };
        }
        // The last sample taken before the first batch: what start-up did.
        let start = samples.iter().rev().find(|s| s.t_s <= first_batch_s);
        let busy_at_start = |stage: &str| {
            start
                .and_then(|s| s.busy_s.get(stage))
                .copied()
                .unwrap_or(0.0)
        };
        let capacity = window_s * workers as f64;
        let mut busy_frac: Vec<(String, f64)> = last
            .busy_s
            .iter()
            .map(|(stage, busy)| {
                (stage.clone(), (busy - busy_at_start(stage)) / capacity)
            })
            .collect();
        let since_start =
            |value: fn(&TimelineSample) -> f64| value(last) - start.map_or(0.0, value);
        busy_frac.push((
            "convert".to_string(),
            since_start(|s| s.convert_s) / capacity,
        ));
        busy_frac.push(("h2d".to_string(), since_start(|s| s.h2d_s) / window_s));
        busy_frac.retain(|(_, share)| *share > 0.0);
        busy_frac.sort_by(|a, b| b.1.total_cmp(&a.1));
        let rows_at_start = start.map_or(0, |s| s.rows);
        let rows_per_s = last.rows.saturating_sub(rows_at_start) as f64 / window_s;
        let wait_frac = ((last.wait_s - first_wait_s) / window_s).clamp(0.0, 1.0);
        let bound = if wait_frac < LOOP_BOUND_WAIT {
            Bound::Loop
        } else {
            match busy_frac
                .iter()
                .find(|(stage, _)| stage != "convert" && stage != "h2d")
            {
                Some((stage, _)) => Bound::Stage(stage.clone()),
                None if busy_frac.is_empty() => Bound::Remote,
                None => Bound::Stage(busy_frac[0].0.clone()),
            }
        };
        Self {
            bound,
            rows_per_s,
            wait_frac,
            busy_frac,
            window_s,
            workers,
        }
    }

    /// The busy share of `stage` (0 when it did nothing).
    pub fn busy_of(&self, stage: &str) -> f64 {
        self.busy_frac
            .iter()
            .find(|(s, _)| s == stage)
            .map_or(0.0, |(_, share)| *share)
    }
}

/// 7600 → "7.6k", 1.25e6 → "1.25M".
pub(crate) fn rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.3}M", per_s / 1e6)
    } else if per_s >= 1e4 {
        format!("{:.1}k", per_s / 1e3)
    } else {
        format!("{per_s:.0}")
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let workers = self.workers;
        let percent = |share: f64| format!("{:.0}%", share * 100.0);
        let busiest = self
            .busy_frac
            .first()
            .map(|(stage, share)| {
                format!("{stage} at {} of {workers} workers", percent(*share))
            })
            .unwrap_or_else(|| "no stage timed on this machine".to_string());
        match &self.bound {
            Bound::Starting => write!(
                f,
                "starting: no verdict yet ({:.2} s of batches to look at)",
                self.window_s
            ),
            Bound::Loop => write!(
                f,
                "bound by the training loop: it waited {} of the time at {} rows/s; \
                 the feed has room (busiest: {busiest})",
                percent(self.wait_frac),
                rate(self.rows_per_s)
            ),
            Bound::Stage(stage) => write!(
                f,
                "bound by {stage} at {} rows/s on {workers} workers (busy {}); the loop \
                 waited {}",
                rate(self.rows_per_s),
                percent(self.busy_of(stage)),
                percent(self.wait_frac)
            ),
            Bound::Remote => write!(
                f,
                "bound by the cluster's query at {} rows/s (its stages run on the \
                 executors); the loop waited {}",
                rate(self.rows_per_s),
                percent(self.wait_frac)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn sample(t_s: f64, rows: u64, wait_s: f64, busy: &[(&str, f64)]) -> TimelineSample {
        TimelineSample {
            t_s,
            busy_s: busy
                .iter()
                .map(|(stage, s)| (stage.to_string(), *s))
                .collect::<BTreeMap<_, _>>(),
            rows,
            wait_s,
            convert_s: 0.0,
            h2d_s: 0.0,
            stall_s: 0.0,
            bytes_scanned: 0,
            spilled_bytes: 0,
            ready_batches: 0,
            memory_reserved: 0,
        }
    }

    #[test]
    fn a_loop_that_waits_names_the_busiest_stage_after_the_first_batch() {
        // Start-up scanned a lot (before the first batch at 1 s); after it,
        // decode is the busy one.
        let samples = [
            sample(0.9, 0, 0.9, &[("scan", 1.5), ("image_decode", 0.1)]),
            sample(3.0, 15_000, 1.9, &[("scan", 1.6), ("image_decode", 3.9)]),
        ];
        let verdict = Verdict::of(&samples, Some(1.0), 1.0, 2);
        assert_eq!(verdict.bound, Bound::Stage("image_decode".into()));
        assert!((verdict.wait_frac - 0.45).abs() < 1e-9, "{verdict:?}");
        assert!((verdict.busy_of("image_decode") - 0.95).abs() < 1e-9);
        assert_eq!(verdict.rows_per_s, 7_500.0);
        assert_eq!(
            verdict.to_string(),
            "bound by image_decode at 7500 rows/s on 2 workers (busy 95%); the loop waited 45%"
        );
    }

    #[test]
    fn a_loop_that_rarely_waits_is_the_bound() {
        let samples = [
            sample(0.5, 256, 0.5, &[("scan", 0.1)]),
            sample(10.5, 2_560_256, 0.6, &[("scan", 2.1)]),
        ];
        let verdict = Verdict::of(&samples, Some(0.5), 0.5, 2);
        assert_eq!(verdict.bound, Bound::Loop);
        assert_eq!(
            verdict.to_string(),
            "bound by the training loop: it waited 1% of the time at 256.0k rows/s; the feed \
             has room (busiest: scan at 10% of 2 workers)"
        );
    }

    #[test]
    fn no_batch_yet_is_no_verdict_and_no_stage_is_a_remote_query() {
        let samples = [sample(2.0, 0, 2.0, &[])];
        assert_eq!(Verdict::of(&samples, None, 0.0, 2).bound, Bound::Starting);
        let samples = [sample(1.0, 0, 1.0, &[]), sample(3.0, 1000, 2.5, &[])];
        let verdict = Verdict::of(&samples, Some(1.0), 1.0, 4);
        assert_eq!(verdict.bound, Bound::Remote);
        assert!(
            verdict.to_string().contains("the loop waited 75%"),
            "{verdict}"
        );
    }
}
