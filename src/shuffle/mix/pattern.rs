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
    Ok(largest_remainder(&exact, u128::from(rows)))
}

/// `exact` shares of `rows` rounded to whole rows that sum to `rows`:
/// each share rounded down, then one more row to each of the largest
/// remainders (ties to the earlier share); a zero share gets no row.
fn largest_remainder(exact: &[f64], rows: u128) -> Vec<u64> {
    let mut rounded: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let given: u128 = rounded.iter().map(|&r| u128::from(r)).sum();
    let mut by_remainder: Vec<usize> =
        (0..exact.len()).filter(|&k| exact[k] > 0.0).collect();
    // Largest remainder first; stable, so ties keep the sources' order.
    by_remainder.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra)
    });
    let missing = rows.saturating_sub(given);
    for k in by_remainder.iter().cycle().take(missing as usize) {
        rounded[*k] += 1;
    }
    rounded
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
        Self::span(rows, u128::from(epoch) * u128::from(quota), quota)
    }

    /// The window of `take` rows from position `start` of the passes of a
    /// source of `rows` rows; rows taken from a source without rows are an
    /// error.
    pub fn span(rows: u64, start: u128, take: u64) -> Result<Self> {
        if take == 0 {
            return Ok(Self {
                first_pass: 0,
                passes: 0,
                skip: 0,
                take: 0,
            });
        }
        if rows == 0 {
            return plan_err!(
                "it has no rows, but its weight asks for {take} rows per epoch"
            );
        }
        let end = start + u128::from(take);
        let (rows_wide, first) = (u128::from(rows), start / u128::from(rows));
        let last = (end - 1) / rows_wide;
        let narrow = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        Ok(Self {
            first_pass: narrow(first),
            passes: narrow(last - first + 1),
            skip: narrow(start % rows_wide),
            take,
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

/// A source's weight as a function of the global step: piecewise linear
/// through its points `(step, weight)`, constant before the first and after
/// the last. Two points at one step are a jump: the later one holds from
/// that step on.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    points: Vec<(u64, f64)>,
}

impl Schedule {
    /// A schedule through `points`, which must be in step order, with
    /// finite, non-negative weights.
    pub fn try_new(points: Vec<(u64, f64)>) -> Result<Self> {
        if points.is_empty() {
            return plan_err!(
                "a weight schedule needs at least one (step: weight) point"
            );
        }
        if let Some(pair) = points.windows(2).find(|p| p[1].0 < p[0].0) {
            return plan_err!(
                "a weight schedule's steps must not go back: step {} after step {}",
                pair[1].0,
                pair[0].0
            );
        }
        if let Some((step, w)) = points.iter().find(|(_, w)| !w.is_finite() || *w < 0.0) {
            return plan_err!(
                "a schedule's weights must be finite and not negative, got {w} at step {step}"
            );
        }
        Ok(Self { points })
    }

    /// A weight that never changes.
    pub fn constant(weight: f64) -> Self {
        Self {
            points: vec![(0, weight)],
        }
    }

    /// The weight at `step`.
    pub fn at(&self, step: u64) -> f64 {
        // The last point at or before `step`, and the first after it.
        let after = self.points.partition_point(|(s, _)| *s <= step);
        match (
            after.checked_sub(1).map(|i| self.points[i]),
            self.points.get(after),
        ) {
            (None, Some(&(_, w))) => w,
            (Some((_, w)), None) => w,
            (Some((s0, w0)), Some(&(s1, w1))) => {
                let t = (step - s0) as f64 / (s1 - s0) as f64;
                w0 + (w1 - w0) * t
            }
            (None, None) => 0.0,
        }
    }
}

/// Weights that change with the global step (`step_rows` rows each, counted
/// over the run: row `r` of epoch `e` is run row `e·N + r`).
///
/// Source `k`'s *target* after `R` run rows is `T_k(R)`, the sum over those
/// rows of its weight share at their step. The rows each source has given
/// at an epoch's start are `T(e·N)` apportioned by largest remainder
/// ([`ScheduledMix::counts_at`], a pure function of the schedule up to that
/// row); within the epoch the source furthest behind its target takes the
/// next position, never beyond the epoch's end count. So each source's
/// window in its passes starts where the last epoch's ended, and a schedule
/// changed for later steps changes nothing before them.
#[derive(Debug, Clone)]
pub struct ScheduledMix {
    schedules: Vec<Schedule>,
    step_rows: u64,
}

impl ScheduledMix {
    /// The mix of `schedules` with steps of `step_rows` rows (at least 1).
    pub fn try_new(schedules: Vec<Schedule>, step_rows: u64) -> Result<Self> {
        if step_rows == 0 {
            return plan_err!("a weight schedule's steps must hold at least 1 row");
        }
        Ok(Self {
            schedules,
            step_rows,
        })
    }

    /// Each source's share of the rows of `step` (summing to 1); all zero
    /// weights are an error naming the step.
    pub fn shares(&self, step: u64) -> Result<Vec<f64>> {
        let weights: Vec<f64> = self.schedules.iter().map(|s| s.at(step)).collect();
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return plan_err!("every source's weight is 0 at step {step}");
        }
        Ok(weights.into_iter().map(|w| w / total).collect())
    }

    /// `T(rows)`: each source's target after `rows` run rows.
    pub fn targets(&self, rows: u128) -> Result<Vec<f64>> {
        let step_rows = u128::from(self.step_rows);
        let mut targets = vec![0.0; self.schedules.len()];
        let whole_steps = rows / step_rows;
        let mut step = 0u128;
        // Runs of steps between schedule points have linear weights, but
        // the shares are normalised per step: sum step by step (a few
        // million steps take milliseconds).
        while step < whole_steps {
            let shares = self.shares(u64::try_from(step).unwrap_or(u64::MAX))?;
            for (t, share) in targets.iter_mut().zip(shares) {
                *t += share * step_rows as f64;
            }
            step += 1;
        }
        let partial = rows % step_rows;
        if partial > 0 {
            let shares = self.shares(u64::try_from(whole_steps).unwrap_or(u64::MAX))?;
            for (t, share) in targets.iter_mut().zip(shares) {
                *t += share * partial as f64;
            }
        }
        Ok(targets)
    }

    /// Rows each source has given after `rows` run rows: `T(rows)`
    /// apportioned by largest remainder (ties to the earlier source).
    pub fn counts_at(&self, rows: u128) -> Result<Vec<u64>> {
        Ok(largest_remainder(&self.targets(rows)?, rows))
    }

    /// Epoch `epoch` of `rows` rows: the rows each source has given at its
    /// start and at its end, and its turns.
    pub fn epoch(
        &self,
        epoch: u64,
        rows: u64,
    ) -> Result<(Vec<u64>, Vec<u64>, ScheduledTurns)> {
        let first = u128::from(epoch) * u128::from(rows);
        let targets = self.targets(first)?;
        let start = largest_remainder(&targets, first);
        // Summed from row 0 like the next epoch's start, so that the two
        // agree to the last bit.
        let end = self.counts_at(first + u128::from(rows))?;
        let turns = ScheduledTurns {
            targets,
            mix: self.clone(),
            epoch,
            rows,
            row: first,
            end_row: first + u128::from(rows),
            counts: start.clone(),
            end: end.clone(),
            shares: None,
        };
        Ok((start, end, turns))
    }
}

/// The turns of a scheduled mixture over one epoch (see [`ScheduledMix`]).
#[derive(Debug, Clone)]
pub struct ScheduledTurns {
    mix: ScheduledMix,
    /// The epoch and its rows, which the state below starts from.
    epoch: u64,
    rows: u64,
    targets: Vec<f64>,
    row: u128,
    end_row: u128,
    counts: Vec<u64>,
    end: Vec<u64>,
    /// The shares of the step `row` is in.
    shares: Option<(u128, Vec<f64>)>,
}

impl ScheduledTurns {
    /// The source of the next position; `None` after the last; an error
    /// when a step has no positive weight.
    pub fn next_turn(&mut self) -> Result<Option<usize>> {
        if self.row >= self.end_row {
            return Ok(None);
        }
        let step = self.row / u128::from(self.mix.step_rows);
        if self.shares.as_ref().is_none_or(|(s, _)| *s != step) {
            let shares = self.mix.shares(u64::try_from(step).unwrap_or(u64::MAX))?;
            self.shares = Some((step, shares));
        }
        if let Some((_, shares)) = &self.shares {
            for (t, share) in self.targets.iter_mut().zip(shares) {
                *t += share;
            }
        }
        // The source furthest behind its target that still has rows left in
        // this epoch.
        let mut best: Option<(usize, f64)> = None;
        for (k, (&count, &end)) in self.counts.iter().zip(&self.end).enumerate() {
            if count >= end {
                continue;
            }
            let lag = self.targets[k] - count as f64;
            if best.is_none_or(|(_, l)| lag > l) {
                best = Some((k, lag));
            }
        }
        let Some((k, _)) = best else {
            return plan_err!(
                "a scheduled mixture ran out of rows at run row {}",
                self.row
            );
        };
        self.counts[k] += 1;
        self.row += 1;
        Ok(Some(k))
    }
}

/// Which source each position of an epoch takes its next row from.
#[derive(Debug, Clone)]
pub enum Turns {
    /// Fixed weights: the quota interleave.
    Fixed(Interleave),
    /// Weights by step.
    Scheduled(ScheduledTurns),
}

impl Turns {
    /// The next position's source; `None` after the epoch's last row.
    pub fn next_turn(&mut self) -> Result<Option<usize>> {
        match self {
            Turns::Fixed(interleave) => Ok(interleave.next()),
            Turns::Scheduled(turns) => turns.next_turn(),
        }
    }

    /// What these turns are built from, for another process to build them
    /// (`crate::cluster`'s codec): the epoch's first position, whatever
    /// position `self` is at.
    pub fn origin(&self) -> TurnsOrigin {
        match self {
            Turns::Fixed(interleave) => TurnsOrigin::Fixed {
                quotas: interleave.quotas.clone(),
            },
            Turns::Scheduled(turns) => TurnsOrigin::Scheduled {
                schedules: turns
                    .mix
                    .schedules
                    .iter()
                    .map(|s| s.points.clone())
                    .collect(),
                step_rows: turns.mix.step_rows,
                epoch: turns.epoch,
                rows: turns.rows,
            },
        }
    }

    /// The turns `origin` describes, at the epoch's first position.
    pub fn from_origin(origin: TurnsOrigin) -> Result<Self> {
        Ok(match origin {
            TurnsOrigin::Fixed { quotas } => Turns::Fixed(Interleave::new(quotas)),
            TurnsOrigin::Scheduled {
                schedules,
                step_rows,
                epoch,
                rows,
            } => {
                let schedules = schedules
                    .into_iter()
                    .map(Schedule::try_new)
                    .collect::<Result<Vec<_>>>()?;
                let (_, _, turns) =
                    ScheduledMix::try_new(schedules, step_rows)?.epoch(epoch, rows)?;
                Turns::Scheduled(turns)
            }
        })
    }
}

/// What a [`Turns`] is built from; see [`Turns::origin`].
#[derive(Debug, Clone, PartialEq)]
pub enum TurnsOrigin {
    /// [`Interleave::new`] of these quotas.
    Fixed {
        /// Each source's rows in the epoch.
        quotas: Vec<u64>,
    },
    /// [`ScheduledMix::epoch`] of these schedules.
    Scheduled {
        /// Each source's schedule points (step, weight).
        schedules: Vec<Vec<(u64, f64)>>,
        /// Rows per global step.
        step_rows: u64,
        /// The epoch.
        epoch: u64,
        /// Its rows.
        rows: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_rebuilt_from_their_origin_take_the_same_turns() -> Result<()> {
        let fixed = Turns::Fixed(Interleave::new(vec![6, 3, 1]));
        let mix = ScheduledMix::try_new(
            vec![
                Schedule::try_new(vec![(0, 0.8), (4, 0.2)])?,
                Schedule::constant(0.5),
            ],
            3,
        )?;
        let (_, _, scheduled) = mix.epoch(2, 10)?;
        for turns in [fixed, Turns::Scheduled(scheduled)] {
            let drain = |mut turns: Turns| -> Result<Vec<usize>> {
                let mut taken = vec![];
                while let Some(k) = turns.next_turn()? {
                    taken.push(k);
                }
                Ok(taken)
            };
            // Part-way through, the origin is still the epoch's start.
            let mut advanced = turns.clone();
            advanced.next_turn()?;
            let rebuilt = Turns::from_origin(advanced.origin())?;
            let expected = drain(turns)?;
            assert_eq!(expected.len(), 10);
            assert_eq!(drain(rebuilt)?, expected);
        }
        Ok(())
    }

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

    #[test]
    fn schedules_interpolate_and_jump() -> Result<()> {
        let linear = Schedule::try_new(vec![(0, 0.6), (100, 0.2)])?;
        assert_eq!(linear.at(0), 0.6);
        assert!((linear.at(50) - 0.4).abs() < 1e-12);
        assert_eq!(linear.at(100), 0.2);
        assert_eq!(linear.at(10_000), 0.2);
        let jump = Schedule::try_new(vec![(0, 0.8), (10, 0.8), (10, 0.2)])?;
        assert_eq!((jump.at(9), jump.at(10), jump.at(11)), (0.8, 0.2, 0.2));
        assert!(Schedule::try_new(vec![(5, 1.0), (4, 1.0)]).is_err());
        assert!(Schedule::try_new(vec![]).is_err());
        Ok(())
    }

    /// A jump at step 10 of 20-row steps: every step before holds 16 and
    /// 4 rows, every step from 10 on 4 and 16, exactly (the shares are whole
    /// rows), also across an epoch boundary.
    #[test]
    fn a_scheduled_mix_holds_each_steps_shares() -> Result<()> {
        let mix = ScheduledMix::try_new(
            vec![
                Schedule::try_new(vec![(0, 0.8), (10, 0.8), (10, 0.2)])?,
                Schedule::try_new(vec![(0, 0.2), (10, 0.2), (10, 0.8)])?,
            ],
            20,
        )?;
        let mut all = vec![];
        // Epochs of 150 rows cut steps in the middle.
        for epoch in 0..3 {
            let (start, end, mut scheduled) = mix.epoch(epoch, 150)?;
            let mut turns = vec![];
            while let Some(k) = scheduled.next_turn()? {
                turns.push(k);
            }
            for k in 0..2 {
                let given = turns.iter().filter(|&&t| t == k).count() as u64;
                assert_eq!(given, end[k] - start[k]);
            }
            all.extend(turns);
        }
        for (step, rows) in all.chunks_exact(20).enumerate() {
            let first = rows.iter().filter(|&&k| k == 0).count();
            let expected = if step < 10 { 16 } else { 4 };
            assert_eq!(first, expected, "step {step}");
        }
        Ok(())
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
