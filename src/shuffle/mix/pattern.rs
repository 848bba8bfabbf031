//! The arithmetic of a mixture: each source's rows per epoch (its quota),
//! which of its rows an epoch takes (a window over its passes), and the
//! order in which the sources take turns (the interleave). Pure functions of
//! their arguments, so every rank and every run computes the same.

use datafusion::common::plan_err;
use datafusion::error::Result;

/// Rows each source gives an epoch of `rows` rows: `rows × w / Σw`, rounded
/// by largest remainder (Hamilton's method; ties go to the earlier source),
/// so the quotas sum to `rows` exactly. Weights must be finite and not
/// negative, and one must be positive.
pub fn quotas(weights: &[f64], rows: u64) -> Result<Vec<u64>> {
    if let Some(bad) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
        return plan_err!(
            "a mixture's weights must be finite and not negative, got {bad}"
        );
    }
    let total: f64 = weights.iter().sum();
    if total <= 0.0 {
        return plan_err!("a mixture needs a source with a positive weight");
    }
    let exact: Vec<f64> = weights.iter().map(|w| w / total * rows as f64).collect();
    let mut quotas: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let given: u64 = quotas.iter().sum();
    let mut by_remainder: Vec<usize> =
        (0..weights.len()).filter(|&k| weights[k] > 0.0).collect();
    // Largest remainder first; stable, so ties keep the sources' order.
    by_remainder.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra)
    });
    let missing = rows.saturating_sub(given);
    for k in by_remainder.iter().cycle().take(missing as usize) {
        quotas[*k] += 1;
    }
    Ok(quotas)
}

/// The rows one source gives one epoch: positions `[epoch × quota,
/// (epoch + 1) × quota)` of the endless sequence of the source's passes, each
/// pass a fresh global shuffle of all its rows. A source smaller than its
/// quota repeats (each repetition another pass, so another order); a larger
/// one gives consecutive slices of one pass to consecutive epochs, so every
/// row is taken once before any is taken again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The first pass the epoch reads.
    pub first_pass: u64,
    /// Passes read, from `first_pass` on.
    pub passes: u64,
    /// Rows of the first pass before the epoch's first row.
    pub skip: u64,
    /// Rows taken in all.
    pub take: u64,
}

impl Window {
    /// The window of a source of `rows` rows with `quota` rows per epoch in
    /// `epoch`; a quota from a source without rows is an error.
    pub fn of(rows: u64, quota: u64, epoch: u64) -> Result<Self> {
        if quota == 0 {
            return Ok(Self {
                first_pass: 0,
                passes: 0,
                skip: 0,
                take: 0,
            });
        }
        if rows == 0 {
            return plan_err!(
                "it has no rows, but its weight asks for {quota} rows per epoch"
            );
        }
        let start = u128::from(epoch) * u128::from(quota);
        let end = start + u128::from(quota);
        let (rows_wide, first) = (u128::from(rows), start / u128::from(rows));
        let last = (end - 1) / rows_wide;
        let narrow = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        Ok(Self {
            first_pass: narrow(first),
            passes: narrow(last - first + 1),
            skip: narrow(start % rows_wide),
            take: quota,
        })
    }
}

/// The order in which sources take turns: position `i` of the epoch goes to
/// the source whose next row is most overdue among those not ahead of their
/// share — earliest-deadline-first with quota bounds (Tijdeman's
/// construction). Every prefix of `L` rows holds `⌊q·L/N⌋` or `⌈q·L/N⌉` rows of
/// a source with quota `q` of `N`, so any `B` consecutive rows (a batch, on
/// any rank) hold within 2 of `q·B/N`, and within 1 for two sources. (For
/// three or more sources with arbitrary shares no sequence keeps every window
/// within 1; see Tijdeman, "The chairman assignment problem", 1980.)
#[derive(Debug, Clone)]
pub struct Interleave {
    quotas: Vec<u64>,
    total: u64,
    taken: Vec<u64>,
    position: u64,
}

impl Interleave {
    /// The turns of an epoch whose sources have these quotas.
    pub fn new(quotas: Vec<u64>) -> Self {
        let total = quotas.iter().sum();
        let taken = vec![0; quotas.len()];
        Self {
            quotas,
            total,
            taken,
            position: 0,
        }
    }

    /// Rows of the epoch, all sources together.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Rows handed out so far.
    pub fn position(&self) -> u64 {
        self.position
    }
}

impl Iterator for Interleave {
    type Item = usize;

    /// The source of the next position; `None` after the epoch's last row.
    fn next(&mut self) -> Option<usize> {
        if self.position >= self.total {
            return None;
        }
        let (length, total) = (u128::from(self.position + 1), u128::from(self.total));
        let mut best: Option<usize> = None;
        for (k, (&quota, &taken)) in self.quotas.iter().zip(&self.taken).enumerate() {
            // Not ahead of its share: taken + 1 ≤ ⌈quota × length / total⌉.
            if u128::from(taken) * total >= u128::from(quota) * length {
                continue;
            }
            // The deadline of its next row is (taken + 1) × total / quota.
            let earlier = best.is_none_or(|b| {
                u128::from(taken + 1) * u128::from(self.quotas[b])
                    < u128::from(self.taken[b] + 1) * u128::from(quota)
            });
            if earlier {
                best = Some(k);
            }
        }
        // Σ⌈q·L/N⌉ ≥ L > Σ taken, so some source is eligible.
        let k = best?;
        self.taken[k] += 1;
        self.position += 1;
        Some(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_sum_to_the_rows_and_follow_the_weights() -> Result<()> {
        assert_eq!(quotas(&[0.6, 0.25, 0.15], 100)?, vec![60, 25, 15]);
        assert_eq!(quotas(&[3.0, 1.0], 10)?, vec![8, 2]); // 7.5 / 2.5: tie to the first
        assert_eq!(quotas(&[1.0, 1.0, 1.0], 10)?, vec![4, 3, 3]);
        assert_eq!(quotas(&[1.0, 0.0], 5)?, vec![5, 0]);
        assert_eq!(quotas(&[0.5, 0.5], 0)?, vec![0, 0]);
        for (weights, err) in [
            (vec![0.0, 0.0], "positive weight"),
            (vec![-1.0, 2.0], "not negative"),
            (vec![f64::NAN], "finite"),
        ] {
            let e = quotas(&weights, 10).expect_err("bad weights").to_string();
            assert!(e.contains(err), "{e}");
        }
        Ok(())
    }

    #[test]
    fn windows_cover_every_row_before_repeating_and_repeat_by_passes() -> Result<()> {
        // Down-sampled: 10 rows, 4 per epoch.
        assert_eq!(
            Window::of(10, 4, 0)?,
            Window {
                first_pass: 0,
                passes: 1,
                skip: 0,
                take: 4
            }
        );
        assert_eq!(
            Window::of(10, 4, 2)?,
            Window {
                first_pass: 0,
                passes: 2,
                skip: 8,
                take: 4
            }
        );
        // Up-sampled: 3 rows, 7 per epoch.
        assert_eq!(
            Window::of(3, 7, 1)?,
            Window {
                first_pass: 2,
                passes: 3,
                skip: 1,
                take: 7
            }
        );
        assert_eq!(Window::of(5, 0, 9)?.passes, 0);
        assert!(Window::of(0, 1, 0).is_err());
        Ok(())
    }

    /// The quota property on every prefix, for many random shares.
    #[test]
    fn every_prefix_holds_each_share_rounded_down_or_up() {
        let mut rng = crate::rand::SplitMix64::new(7);
        for _ in 0..200 {
            let sources = 2 + rng.below(7) as usize;
            let weights: Vec<f64> =
                (0..sources).map(|_| rng.unit().powi(2) + 0.01).collect();
            let total = 1 + rng.below(3000);
            let quotas = quotas(&weights, total).expect("weights are positive");
            let mut counts = vec![0u64; sources];
            let mut seen = 0u64;
            for k in Interleave::new(quotas.clone()) {
                counts[k] += 1;
                seen += 1;
                for (j, (&count, &quota)) in counts.iter().zip(&quotas).enumerate() {
                    let share = quota * seen;
                    let (low, high) = (share / total, share.div_ceil(total));
                    assert!(
                        (low..=high).contains(&count),
                        "source {j} of {quotas:?}: {count} rows in the first {seen}"
                    );
                }
            }
            assert_eq!(counts, quotas);
        }
    }

    /// Two sources: any window of `B` rows holds `⌊q·B/N⌋` or `⌈q·B/N⌉`.
    #[test]
    fn two_sources_keep_every_window_within_one_row() {
        let mut rng = crate::rand::SplitMix64::new(11);
        for _ in 0..100 {
            let total = 2 + rng.below(2000);
            let first = rng.below(total + 1);
            let quotas = vec![first, total - first];
            let turns: Vec<usize> = Interleave::new(quotas.clone()).collect();
            let mut prefix = vec![0u64];
            for &k in &turns {
                prefix.push(prefix.last().copied().unwrap_or(0) + u64::from(k == 0));
            }
            for window in [1u64, 3, 8, 16, 100] {
                let share = first * window;
                let (low, high) = (share / total, share.div_ceil(total));
                for start in 0..total.saturating_sub(window) {
                    let count =
                        prefix[(start + window) as usize] - prefix[start as usize];
                    assert!(
                        (low..=high).contains(&count),
                        "{quotas:?}: {count} of source 0 in rows {start}..+{window}"
                    );
                }
            }
        }
    }
}
