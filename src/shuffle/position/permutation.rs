//! [`IndexPermutation`]: a seeded bijection of `0..n`, computed one index at
//! a time in constant memory (an "index shuffle", as Grain's).
//!
//! # Definition
//! Let `b` be the bits of `n - 1` (at least 2), split into a low half of
//! `⌈b/2⌉` bits and a high half of `⌊b/2⌋`. [`ROUNDS`] alternating Feistel
//! rounds map `0..2^b` onto itself: round `i` xors into one half the round
//! function of the other, `F_i(x) = splitmix64(x ^ k_i)` cut to the half's
//! width, with the round keys `k_i` a SplitMix64 stream from
//! `shuffle_seed(seed, epoch) ^ DOMAIN`. Each round is its own inverse, so
//! the rounds are a bijection of `0..2^b`; cycle walking (apply them again
//! while the result is `≥ n`) turns that into a bijection of `0..n`, since
//! every cycle of the bigger permutation that enters `0..n` comes back to it.
//! `2^b < 2n`, so an index takes fewer than two walks on average.
//!
//! # Small domains
//! Rounds over halves of a few bits are measurably biased (at `n = 5`, an
//! index landed at some positions 5% more often than at others). Up to
//! [`TABLE_UP_TO`] indexes the permutation is therefore a table instead: a
//! Fisher–Yates shuffle driven by the same keyed SplitMix64 stream, at most
//! 256 KiB, built once per epoch.
//!
//! # Quality
//! Four full Feistel rounds over a pseudorandom function are a pseudorandom
//! permutation (Luby–Rackoff); [`ROUNDS`] half-rounds give five, plus the
//! walks, over halves of at least 8 bits. Its tests check every position of
//! every index against the uniform law on small `n`, where a position lands
//! on large `n`, and that neighbours do not stay neighbours.

use crate::rand::{SplitMix64, splitmix64};

/// Half-rounds (each updates one half): five full Feistel rounds.
const ROUNDS: usize = 10;

/// Domains up to this size are permuted by a table (see the module docs).
const TABLE_UP_TO: u64 = 1 << 16;

/// Keeps these round keys apart from every other use of `shuffle_seed`.
const DOMAIN: u64 = 0x5155_4646_4c45_5f50; // "QUFFLE_P"

/// A pseudorandom bijection of `0..n` from `(seed, epoch)`; see the module
/// docs.
#[derive(Debug, Clone)]
pub struct IndexPermutation {
    /// Size of the domain.
    n: u64,
    /// Bits of the low half.
    low_bits: u32,
    low_mask: u64,
    high_mask: u64,
    keys: [u64; ROUNDS],
    /// The whole permutation, for domains up to [`TABLE_UP_TO`].
    table: Option<Vec<u32>>,
    /// Its inverse: the position of each index.
    inverse_table: Option<Vec<u32>>,
    /// The order the rows are stored in, when they are an earlier epoch's
    /// (an epoch cache): index `i` is then the row stored `i`-th.
    stored: Option<Box<IndexPermutation>>,
}

impl IndexPermutation {
    /// The permutation of `0..n` for `(seed, epoch)`.
    pub fn new(n: u64, seed: u64, epoch: u64) -> Self {
        let bits = (u64::BITS - n.saturating_sub(1).leading_zeros()).max(2);
        let low_bits = bits.div_ceil(2);
        let high_bits = bits - low_bits;
        let mut stream =
            SplitMix64::new(super::super::shuffle_seed(seed, epoch) ^ DOMAIN);
        let keys = std::array::from_fn(|_| stream.next_u64());
        let table = (n <= TABLE_UP_TO).then(|| {
            let mut table: Vec<u32> = (0..n as u32).collect();
            for i in (1..table.len()).rev() {
                let j = stream.below(i as u64 + 1) as usize;
                table.swap(i, j);
            }
            table
        });
        let inverse_table = table.as_ref().map(|table| {
            let mut inverse = vec![0u32; table.len()];
            for (position, &index) in table.iter().enumerate() {
                inverse[index as usize] = position as u32;
            }
            inverse
        });
        Self {
            n,
            low_bits,
            low_mask: (1u64 << low_bits) - 1,
            high_mask: (1u64 << high_bits) - 1,
            keys,
            table,
            inverse_table,
            stored: None,
        }
    }

    /// The permutation of `(seed, epoch)` over `n` rows stored in the order
    /// of epoch `stored_epoch` (the row stored `i`-th is the one of rank
    /// `π_stored(i)`): position `p` holds the stored row
    /// `π_stored⁻¹(π_epoch(p))`, the row of rank `π_epoch(p)`, as in the
    /// epoch read from the files. An epoch cache filled in one epoch's order
    /// gives every later epoch's order this way, with no rank stored.
    pub fn over_stored(n: u64, seed: u64, epoch: u64, stored_epoch: u64) -> Self {
        Self {
            stored: Some(Box::new(Self::new(n, seed, stored_epoch))),
            ..Self::new(n, seed, epoch)
        }
    }

    /// How many indexes it permutes.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether it permutes nothing.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The index at `position` (`< n`) of the permuted order: the
    /// canonical rank of the row at that position of a `SHUFFLE BY
    /// POSITION` epoch (over stored rows, the stored row's index), in
    /// constant time and memory (map-style access).
    pub fn at(&self, position: u64) -> u64 {
        let rank = self.rank_at(position);
        match &self.stored {
            Some(stored) => stored.position_of(rank),
            None => rank,
        }
    }

    /// The position (`< n`) holding `index` (`< n`): the inverse of
    /// [`Self::at`], in constant time and memory. Where a row goes when it
    /// is read, for an epoch spilled by position range.
    pub fn position_of(&self, index: u64) -> u64 {
        let rank = match &self.stored {
            Some(stored) => stored.at(index),
            None => index,
        };
        self.position_of_rank(rank)
    }

    /// The rank at `position` of this epoch's order.
    fn rank_at(&self, position: u64) -> u64 {
        debug_assert!(position < self.n, "position {position} of {}", self.n);
        if let Some(table) = &self.table {
            return u64::from(table[position as usize]);
        }
        let mut x = self.rounds(position);
        while x >= self.n {
            x = self.rounds(x);
        }
        x
    }

    /// The position of `index` (a rank) in this epoch's order.
    fn position_of_rank(&self, index: u64) -> u64 {
        debug_assert!(index < self.n, "index {index} of {}", self.n);
        if let Some(inverse) = &self.inverse_table {
            return u64::from(inverse[index as usize]);
        }
        // Cycle walking backwards: the rounds undone until back in 0..n.
        let mut x = self.rounds_undone(index);
        while x >= self.n {
            x = self.rounds_undone(x);
        }
        x
    }

    /// The Feistel rounds undone: each round changes one half by a function
    /// of the other, so the same rounds in reverse order undo them.
    fn rounds_undone(&self, x: u64) -> u64 {
        let (mut low, mut high) = (x & self.low_mask, x >> self.low_bits);
        for (i, key) in self.keys.iter().enumerate().rev() {
            self.round(i, *key, &mut low, &mut high);
        }
        (high << self.low_bits) | low
    }

    /// The Feistel rounds over `0..2^b`.
    fn rounds(&self, x: u64) -> u64 {
        let (mut low, mut high) = (x & self.low_mask, x >> self.low_bits);
        for (i, key) in self.keys.iter().enumerate() {
            self.round(i, *key, &mut low, &mut high);
        }
        (high << self.low_bits) | low
    }

    /// Round `i`: even rounds change the high half by the low one, odd
    /// rounds the low half by the high one (each its own inverse).
    #[inline]
    fn round(&self, i: usize, key: u64, low: &mut u64, high: &mut u64) {
        if i.is_multiple_of(2) {
            *high ^= splitmix64(*low ^ key) & self.high_mask;
        } else {
            *low ^= splitmix64(*high ^ key) & self.low_mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(n: u64, seed: u64, epoch: u64) -> Vec<u64> {
        let permutation = IndexPermutation::new(n, seed, epoch);
        (0..n).map(|p| permutation.at(p)).collect()
    }

    #[test]
    fn every_index_comes_once() {
        for n in [1, 2, 3, 4, 5, 7, 8, 9, 100, 4097, 65_536, 65_537, 200_003] {
            let mut seen = order(n, 42, 3);
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
    }

    /// `position_of` undoes `at`, in the table and past it.
    #[test]
    fn position_of_finds_where_each_index_went() {
        for n in [1u64, 2, 5, 100, 65_536, 65_537, 200_003] {
            let permutation = IndexPermutation::new(n, 7, 2);
            for position in (0..n).step_by((n as usize / 5000).max(1)) {
                let index = permutation.at(position);
                assert_eq!(permutation.position_of(index), position, "n = {n}");
            }
        }
    }

    /// Over rows stored in epoch 3's order, epoch 5 puts at each position
    /// the stored row that holds the rank epoch 5 puts there; `position_of`
    /// undoes it.
    #[test]
    fn an_epoch_over_rows_stored_in_another_epochs_order_is_that_epoch() {
        for n in [1u64, 7, 1000, 65_537, 200_003] {
            let stored = IndexPermutation::new(n, 9, 3);
            let epoch = IndexPermutation::new(n, 9, 5);
            let over = IndexPermutation::over_stored(n, 9, 5, 3);
            for position in (0..n).step_by((n as usize / 3000).max(1)) {
                let row = over.at(position);
                assert_eq!(stored.at(row), epoch.at(position), "n = {n}");
                assert_eq!(over.position_of(row), position, "n = {n}");
            }
            // Over its own order, an epoch is the stored order.
            let same = IndexPermutation::over_stored(n, 9, 3, 3);
            assert!((0..n.min(500)).all(|p| same.at(p) == p), "n = {n}");
        }
    }

    #[test]
    fn seeds_and_epochs_give_other_orders() {
        let base = order(1000, 1, 0);
        assert_ne!(base, order(1000, 2, 0));
        assert_ne!(base, order(1000, 1, 1));
        assert_eq!(base, order(1000, 1, 0));
        assert_ne!(base, (0..1000).collect::<Vec<_>>());
    }

    /// Each index lands at each position about equally often over many
    /// seeds: a chi-square test per index, on domains of a few bits where
    /// the rounds are narrowest.
    #[test]
    fn positions_are_uniform_on_small_domains() {
        for n in [3u64, 5, 8, 10, 37] {
            let trials = 4000 * n;
            let mut counts = vec![vec![0u64; n as usize]; n as usize];
            for seed in 0..trials {
                for (position, index) in order(n, seed, 7).into_iter().enumerate() {
                    counts[index as usize][position] += 1;
                }
            }
            let expected = trials as f64 / n as f64;
            for (index, row) in counts.iter().enumerate() {
                let chi2: f64 = row
                    .iter()
                    .map(|&c| (c as f64 - expected).powi(2) / expected)
                    .sum();
                // n - 1 degrees of freedom; mean n - 1, sd √(2(n - 1)): a
                // bound 6 sd above the mean fails no fair test in practice.
                let dof = (n - 1) as f64;
                let bound = dof + 6.0 * (2.0 * dof).sqrt();
                assert!(
                    chi2 < bound,
                    "n = {n}, index {index}: chi² {chi2:.1} ≥ {bound:.1} ({row:?})"
                );
            }
        }
    }

    /// Past the table, the index at a position is uniform over `0..n`: the
    /// positions of the first batch and the last row, over many seeds, in
    /// 20 bins.
    #[test]
    fn positions_are_uniform_on_large_domains() {
        let n = 1_000_003u64;
        let seeds = 20_000u64;
        for position in [0, 1, 4095, n - 1] {
            let mut bins = [0u64; 20];
            for seed in 0..seeds {
                let index = IndexPermutation::new(n, seed, 2).at(position);
                bins[(index * 20 / n) as usize] += 1;
            }
            let expected = seeds as f64 / 20.0;
            let chi2: f64 = bins
                .iter()
                .map(|&c| (c as f64 - expected).powi(2) / expected)
                .sum();
            // 19 degrees of freedom: mean 19, sd about 6.2.
            assert!(
                chi2 < 19.0 + 6.0 * 38f64.sqrt(),
                "position {position}: {bins:?}"
            );
        }
    }

    /// Indexes next to each other land far apart: about as often next to
    /// each other again as in a uniform permutation (2/n).
    #[test]
    fn neighbours_are_spread() {
        // Past the table: the Feistel rounds.
        let n = 200_000u64;
        let mut adjacent = 0u64;
        let seeds = 20;
        for seed in 0..seeds {
            let order = order(n, seed, 0);
            let mut position = vec![0i64; n as usize];
            for (p, &i) in order.iter().enumerate() {
                position[i as usize] = p as i64;
            }
            adjacent += position
                .windows(2)
                .filter(|w| (w[0] - w[1]).abs() == 1)
                .count() as u64;
        }
        // Expected (n - 1) · 2/n per seed, about 2: allow 3× over all seeds.
        assert!(
            adjacent < 6 * seeds,
            "{adjacent} adjacent pairs in {seeds} orders"
        );
    }
}
