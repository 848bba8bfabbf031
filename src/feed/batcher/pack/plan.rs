//! The packing plan of one window of documents, from their lengths alone:
//! which documents share a sequence, which sequences make a step, and
//! which rank of the step gets which sequence.
//!
//! ```text
//!  window of documents (lengths, in the feed's order)
//!    │  best-fit decreasing: longest first, each into the fullest
//!    ▼  sequence it fits (ties: the oldest), else a new one
//!  sequences of ≤ max_tokens tokens
//!    │  (not the epoch's end) the S mod G emptiest sequences go back:
//!    │  their documents are packed again with the next window
//!    ▼
//!  sequences by attention cost Σ len², costliest first
//!    │  cut into steps of G = B × W consecutive sequences (similar costs),
//!    │  the steps in a seeded order (so costs do not trend in a window)
//!    ▼
//!  each step: costliest first, to the rank with the least cost so far that
//!  has room for it (B sequences each)
//! ```
//!
//! # Why this packer
//! Best-fit decreasing fills sequences as first-fit decreasing does (both
//! within 11/9 of the optimum number of bins) and in practice a little
//! better; over a window of thousands of documents nearly every sequence
//! but the last few is full. Those last few are the emptiest, and they are
//! the ones sent back to the next window (where their documents fill gaps)
//! rather than padded: the waste is the emptiness of one window's worth of
//! sequences per epoch, not per window.
//!
//! Balancing by attention cost rather than tokens: every full sequence has
//! about `max_tokens` tokens, but one document of 2,048 tokens costs as much
//! attention as 64 of 256. A step takes sequences of neighbouring cost, so
//! their ranks finish their forward and backward passes together; within the
//! step the greedy deal (longest processing time first, with equal counts)
//! evens out what remains.
//!
//! # Determinism
//! Everything here is a function of the lengths in order, the shape (`B`,
//! `W`, `max_tokens`) and the seed: ties are broken by position, never by
//! a hash map's order or a sort's instability.

use std::cmp::Reverse;
use std::collections::BTreeSet;

/// One step's sequences, dealt to ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedStep {
    /// `ranks[r]`: the sequences (indices into [`WindowPlan::sequences`]) of
    /// rank `r`, at most `per_rank` of them.
    pub(crate) ranks: Vec<Vec<usize>>,
    /// Sequences each rank's batch has: `B`, or in the epoch's last, partial
    /// step `⌈left / W⌉` (a rank with fewer gets empty sequences).
    pub(crate) per_rank: usize,
}

/// The plan of a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WindowPlan {
    /// Each sequence's items (indices into the window's lengths), longest
    /// first.
    pub(crate) sequences: Vec<Vec<usize>>,
    /// The steps, in the order they are fed.
    pub(crate) steps: Vec<PlannedStep>,
    /// Items that go back to be packed with the next window.
    pub(crate) carried: Vec<usize>,
    /// Items left out with the epoch's last, partial step (`drop_last`).
    pub(crate) dropped: Vec<usize>,
}

/// Where a window lies in its epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowEnd {
    /// More documents follow: a partial step's sequences go back.
    More,
    /// The epoch's last window: a partial step is fed (`drop_last` false,
    /// each rank gets `⌈left / W⌉` sequences, some of them empty) or left out.
    Last {
        /// Leave the partial step out.
        drop_last: bool,
    },
}

/// Packs items of `lengths` (each 1..=`capacity`) into sequences of at most
/// `capacity` tokens, best fit decreasing: longest first (ties: the earlier
/// item), each into the sequence with the least room that still fits it
/// (ties: the older sequence), else into a new one.
pub(crate) fn best_fit_decreasing(lengths: &[usize], capacity: usize) -> Vec<Vec<usize>> {
    let mut by_length: Vec<usize> = (0..lengths.len()).collect();
    by_length.sort_by_key(|&item| (Reverse(lengths[item]), item));
    let mut sequences: Vec<Vec<usize>> = vec![];
    // (room left, sequence) of every sequence with room.
    let mut open: BTreeSet<(usize, usize)> = BTreeSet::new();
    for item in by_length {
        let len = lengths[item];
        let (room, sequence) = match open.range((len, 0)..).next().copied() {
            Some((room, sequence)) => {
                open.remove(&(room, sequence));
                sequences[sequence].push(item);
                (room - len, sequence)
            }
            None => {
                sequences.push(vec![item]);
                (capacity.saturating_sub(len), sequences.len() - 1)
            }
        };
        if room > 0 {
            open.insert((room, sequence));
        }
    }
    sequences
}

/// Attention cost of a sequence: Σ len² of its documents (what varlen
/// attention computes).
pub(crate) fn attention_cost(items: &[usize], lengths: &[usize]) -> u64 {
    items.iter().map(|&i| (lengths[i] as u64).pow(2)).sum()
}

/// Deals `sequences` (costliest first) to `world` ranks with room for
/// `per_rank` each: each to the rank with the least cost so far that has
/// room (ties: the lower rank).
fn deal_balanced(
    sequences: &[usize],
    costs: &[u64],
    world: usize,
    per_rank: usize,
) -> Vec<Vec<usize>> {
    let mut ranks: Vec<Vec<usize>> = vec![Vec::with_capacity(per_rank); world];
    let mut loads = vec![0u64; world];
    for &sequence in sequences {
        let rank = (0..world)
            .filter(|&r| ranks[r].len() < per_rank)
            .min_by_key(|&r| (loads[r], r));
        // There is room for every sequence: `sequences.len() ≤ world × per_rank`.
        if let Some(rank) = rank {
            ranks[rank].push(sequence);
            loads[rank] += costs[sequence];
        }
    }
    ranks
}

/// The plan of a window of items of `lengths`, for `world` ranks of
/// `per_rank` sequences of at most `capacity` tokens; `seed` orders the
/// window's steps.
pub(crate) fn plan_window(
    lengths: &[usize],
    capacity: usize,
    world: usize,
    per_rank: usize,
    end: WindowEnd,
    seed: u64,
) -> WindowPlan {
    let world = world.max(1);
    let per_rank = per_rank.max(1);
    let step_size = world * per_rank;
    let sequences = best_fit_decreasing(lengths, capacity);
    let tokens: Vec<usize> = sequences
        .iter()
        .map(|items| items.iter().map(|&i| lengths[i]).sum())
        .collect();
    let costs: Vec<u64> = sequences
        .iter()
        .map(|items| attention_cost(items, lengths))
        .collect();
    let left = sequences.len() % step_size;
    // The emptiest sequences (ties: the newest) are the partial step's.
    let mut by_fill: Vec<usize> = (0..sequences.len()).collect();
    by_fill.sort_by_key(|&s| (tokens[s], Reverse(s)));
    let partial: BTreeSet<usize> = by_fill[..left].iter().copied().collect();
    let mut full: Vec<usize> = (0..sequences.len())
        .filter(|s| !partial.contains(s))
        .collect();
    full.sort_by_key(|&s| (Reverse(costs[s]), s));
    let mut steps: Vec<PlannedStep> = full
        .chunks(step_size)
        .map(|step| PlannedStep {
            ranks: deal_balanced(step, &costs, world, per_rank),
            per_rank,
        })
        .collect();
    let mut rng = crate::rand::SplitMix64::new(seed);
    for i in (1..steps.len()).rev() {
        steps.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut partial: Vec<usize> = partial.into_iter().collect();
    partial.sort_by_key(|&s| (Reverse(costs[s]), s));
    let items_of = |partial: &[usize]| -> Vec<usize> {
        let mut items: Vec<usize> = partial
            .iter()
            .flat_map(|&s| sequences[s].iter().copied())
            .collect();
        items.sort_unstable();
        items
    };
    let (mut carried, mut dropped) = (vec![], vec![]);
    match end {
        WindowEnd::More => carried = items_of(&partial),
        WindowEnd::Last { drop_last: true } => dropped = items_of(&partial),
        WindowEnd::Last { drop_last: false } if !partial.is_empty() => {
            let per_rank = partial.len().div_ceil(world);
            steps.push(PlannedStep {
                ranks: deal_balanced(&partial, &costs, world, per_rank),
                per_rank,
            });
        }
        WindowEnd::Last { drop_last: false } => {}
    }
    WindowPlan {
        sequences,
        steps,
        carried,
        dropped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(n: usize, seed: u64, max: usize) -> Vec<usize> {
        let mut rng = crate::rand::SplitMix64::new(seed);
        // Roughly log-uniform, as text documents are: many short, a few long.
        (0..n)
            .map(|_| {
                let u = rng.unit();
                ((max as f64).powf(u) as usize).clamp(1, max)
            })
            .collect()
    }

    #[test]
    fn best_fit_keeps_every_item_once_within_capacity() {
        let lengths = lengths(5000, 1, 2048);
        let sequences = best_fit_decreasing(&lengths, 2048);
        let mut seen: Vec<usize> = sequences.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for items in &sequences {
            let tokens: usize = items.iter().map(|&i| lengths[i]).sum();
            assert!(tokens <= 2048, "{tokens}");
        }
        // Nearly full: the waste of all sequences but the last few is tiny.
        let total: usize = lengths.iter().sum();
        let waste = 1.0 - total as f64 / (sequences.len() * 2048) as f64;
        assert!(waste < 0.01, "waste {waste}");
    }

    #[test]
    fn a_window_feeds_whole_steps_and_sends_its_emptiest_sequences_back() {
        let lengths = lengths(3000, 2, 1024);
        let plan = plan_window(&lengths, 1024, 4, 3, WindowEnd::More, 7);
        let fed: usize = plan
            .steps
            .iter()
            .map(|step| {
                assert_eq!(step.per_rank, 3);
                step.ranks
                    .iter()
                    .map(|r| {
                        assert_eq!(r.len(), 3, "every rank gets B sequences");
                        r.len()
                    })
                    .sum::<usize>()
            })
            .sum();
        assert_eq!(fed % 12, 0);
        assert_eq!(fed + plan.sequences.len() % 12, plan.sequences.len());
        // Every item is fed or carried, once.
        let mut items: Vec<usize> = plan
            .steps
            .iter()
            .flat_map(|s| s.ranks.iter().flatten())
            .flat_map(|&s| plan.sequences[s].iter().copied())
            .chain(plan.carried.iter().copied())
            .collect();
        items.sort_unstable();
        assert_eq!(items, (0..lengths.len()).collect::<Vec<_>>());
        assert!(plan.dropped.is_empty());
        // The same lengths, seed and shape give the same plan.
        assert_eq!(plan, plan_window(&lengths, 1024, 4, 3, WindowEnd::More, 7));
        assert_ne!(
            plan.steps,
            plan_window(&lengths, 1024, 4, 3, WindowEnd::More, 8).steps,
            "the seed orders the steps"
        );
    }

    #[test]
    fn ranks_of_a_step_get_balanced_attention_costs() {
        let lengths = lengths(10_000, 3, 2048);
        let plan = plan_window(&lengths, 2048, 8, 4, WindowEnd::More, 1);
        let cost = |seqs: &Vec<usize>| -> u64 {
            seqs.iter()
                .map(|&s| attention_cost(&plan.sequences[s], &lengths))
                .sum()
        };
        let mut worst: f64 = 0.0;
        for step in &plan.steps {
            let costs: Vec<u64> = step.ranks.iter().map(cost).collect();
            let mean = costs.iter().sum::<u64>() as f64 / costs.len() as f64;
            let max = *costs.iter().max().unwrap() as f64;
            worst = worst.max(max / mean);
        }
        assert!(worst <= 1.05, "max / mean of a step's rank costs: {worst}");
    }

    #[test]
    fn the_last_window_feeds_or_drops_its_partial_step() {
        let lengths = vec![900, 800, 700, 100, 50, 30];
        // 3 sequences of ≤ 1000 over 2 ranks of 1: one full step, one partial.
        let fed = plan_window(
            &lengths,
            1000,
            2,
            1,
            WindowEnd::Last { drop_last: false },
            0,
        );
        assert_eq!(fed.steps.len(), 2);
        let last = fed.steps.last().unwrap();
        assert_eq!(last.per_rank, 1);
        assert_eq!(
            last.ranks.iter().map(Vec::len).sum::<usize>(),
            1,
            "one rank gets the last sequence, the other an empty one"
        );
        let dropped =
            plan_window(&lengths, 1000, 2, 1, WindowEnd::Last { drop_last: true }, 0);
        assert_eq!(dropped.steps.len(), 1);
        assert!(!dropped.dropped.is_empty());
    }
}
