//! Sorting [`super::PermuteExec`]'s `(key, batch, row)` index on several
//! threads, in the order one `sort_unstable` gives.
//!
//! ```text
//!  held key columns ──count by top bits──► bucket sizes ──prefix sums──► bucket starts
//!        │                                                                   │
//!        └──────────── place each (key, batch, row) in its bucket ◄──────────┘
//!                                       │
//!            buckets 0..a    buckets a..b    …     (contiguous, ~equal entries)
//!            thread 0        thread 1              each sorts its buckets
//!                                       ▼
//!                        the index, sorted by (key, batch, row)
//! ```
//!
//! # Why
//! Where an index is sorted whole (a run before it is spilled, a small
//! input, or `sqlfeed.shuffle_sort_threads = 1`; a large one-machine
//! `SHUFFLE` sorts its index behind its output instead, see
//! `streamed_index.rs`) the sort is 1.1 s of one core for 20M rows here.
//! The buckets split the keys by their top bits, so bucket `i`'s keys are
//! all smaller than bucket `i + 1`'s and sorting each bucket sorts the
//! whole; a bucket of a few thousand entries sorts in the cache.
//!
//! # Ordering
//! Exactly `sort_unstable`'s: the entries are distinct (no two share a
//! batch and row), so the order of `(key, batch, row)` is total and the
//! sorted index is unique.
//!
//! # Memory
//! Nothing besides the index, placed at its final size: the buckets are
//! filled in place from the held key columns, not sorted out of a second
//! copy. Bucket sizes are one `usize` per bucket (at most 2¹⁶).

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::UInt64Type;

/// An index entry: the row's key, its held batch and its row in that batch.
pub(super) type Entry = (u64, u32, u32);

/// Fewer entries than this are sorted on the calling thread: starting
/// threads costs more than it saves.
pub(super) const PARALLEL_SORT_MIN_ENTRIES: usize = 1 << 18;

/// About this many entries per bucket: small enough to sort in the cache.
const ENTRIES_PER_BUCKET: usize = 4096;

/// Each thread sorts at least this many entries (a machine with 64 cores
/// does not start 64 threads for a few hundred thousand rows).
const MIN_ENTRIES_PER_THREAD: usize = 1 << 16;

/// The index of the keys in column `key_column` of `held`, sorted by
/// `(key, batch, row)`, using up to `threads` threads.
pub(super) fn sorted_index(
    held: &[RecordBatch],
    key_column: usize,
    threads: usize,
) -> Vec<Entry> {
    let keys = || entries(held, key_column);
    let rows: usize = held.iter().map(|b| b.num_rows()).sum();
    if threads <= 1 || rows < PARALLEL_SORT_MIN_ENTRIES {
        let mut index = Vec::with_capacity(rows);
        index.extend(keys());
        index.sort_unstable();
        return index;
    }
    let bits = bucket_bits(rows);
    let bucket_of = |key: u64| (key >> (64 - bits)) as usize;
    let mut starts = vec![0usize; (1 << bits) + 1];
    for (key, _, _) in keys() {
        starts[bucket_of(key) + 1] += 1;
    }
    for bucket in 0..1 << bits {
        starts[bucket + 1] += starts[bucket];
    }
    let mut index = vec![(0, 0, 0); starts[1 << bits]];
    let mut next = starts.clone();
    for entry in keys() {
        let slot = &mut next[bucket_of(entry.0)];
        index[*slot] = entry;
        *slot += 1;
    }
    let threads = threads.min(rows / MIN_ENTRIES_PER_THREAD).max(1);
    sort_buckets(&mut index, &starts, threads);
    index
}

/// Every `(key, batch, row)` of the key columns of `held`, in arrival order.
pub(super) fn entries(
    held: &[RecordBatch],
    key_column: usize,
) -> impl Iterator<Item = Entry> + '_ {
    held.iter().enumerate().flat_map(move |(batch, b)| {
        b.column(key_column)
            .as_primitive_opt::<UInt64Type>()
            .map(|keys| keys.values().as_ref())
            .unwrap_or(&[])
            .iter()
            .enumerate()
            .map(move |(row, &key)| (key, batch as u32, row as u32))
    })
}

/// Bits of the key that pick a bucket: about [`ENTRIES_PER_BUCKET`] entries
/// per bucket, between 1 and 16 bits.
fn bucket_bits(rows: usize) -> u32 {
    (rows / ENTRIES_PER_BUCKET).max(2).ilog2().clamp(1, 16)
}

/// Sorts each bucket `starts[i]..starts[i + 1]` of `index`, the buckets
/// dealt in contiguous groups of about equal entries to `threads` threads,
/// the calling thread one of them. If the system refuses a thread (too many
/// threads), the whole index is sorted again on the calling thread: slower,
/// the same order.
fn sort_buckets(index: &mut [Entry], starts: &[usize], threads: usize) {
    let per_thread = index.len().div_ceil(threads);
    // Group boundaries: the first bucket start at or past each share.
    let mut cuts = vec![0];
    for &start in starts {
        if start >= cuts.last().copied().unwrap_or(0) + per_thread && start < index.len()
        {
            cuts.push(start);
        }
    }
    cuts.push(index.len());
    let all_ran = std::thread::scope(|scope| {
        let mut all_ran = true;
        let mut rest = &mut *index;
        let mut own = None;
        for group in cuts.windows(2) {
            let (slice, tail) = rest.split_at_mut(group[1] - group[0]);
            rest = tail;
            let buckets: Vec<usize> = starts
                .iter()
                .filter(|&&s| s > group[0] && s < group[1])
                .map(|&s| s - group[0])
                .collect();
            if own.is_none() {
                own = Some((slice, buckets));
                continue;
            }
            let spawned = std::thread::Builder::new()
                .name("sqlfeed-shuffle-sort".into())
                .spawn_scoped(scope, move || sort_group(slice, &buckets));
            all_ran &= spawned.is_ok();
        }
        if let Some((slice, buckets)) = own {
            sort_group(slice, &buckets);
        }
        all_ran
    });
    if !all_ran {
        index.sort_unstable();
    }
}

/// Sorts the buckets of `slice` that start at the offsets `inner_starts`
/// (the first bucket starts at 0).
fn sort_group(slice: &mut [Entry], inner_starts: &[usize]) {
    let mut rest = slice;
    let mut at = 0;
    for &start in inner_starts {
        let (bucket, tail) = rest.split_at_mut(start - at);
        bucket.sort_unstable();
        rest = tail;
        at = start;
    }
    rest.sort_unstable();
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, UInt64Array};

    use super::*;
    use crate::rand::splitmix64;

    fn held(batches: &[Vec<u64>]) -> Vec<RecordBatch> {
        batches
            .iter()
            .map(|keys| {
                RecordBatch::try_from_iter(vec![(
                    "k",
                    Arc::new(UInt64Array::from(keys.clone())) as ArrayRef,
                )])
                .expect("one column")
            })
            .collect()
    }

    fn one_sort(held: &[RecordBatch]) -> Vec<Entry> {
        sorted_index(held, 0, 1)
    }

    #[test]
    fn parallel_sort_is_the_one_sort_with_repeated_keys_and_skewed_buckets() {
        // Random keys, many repeated (copies), a block of keys in one bucket
        // (skew), the extremes, and batches of uneven sizes.
        let mut batches = Vec::new();
        let mut state = 7u64;
        let mut next = || {
            state = splitmix64(state);
            state
        };
        for size in [1usize, 70_000, 3, 200_000, 50_000] {
            batches.push(
                (0..size)
                    .map(|i| match i % 7 {
                        0 => 42,
                        1 => next() >> 40,
                        2 => u64::MAX,
                        3 => 0,
                        _ => next(),
                    })
                    .collect(),
            );
        }
        let held = held(&batches);
        let expected = one_sort(&held);
        assert!(expected.len() >= PARALLEL_SORT_MIN_ENTRIES);
        for threads in [2, 3, 8, 64] {
            assert_eq!(
                sorted_index(&held, 0, threads),
                expected,
                "{threads} threads"
            );
        }
        assert!(expected.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn all_keys_equal_sort_in_one_bucket() {
        let held = held(&[vec![5; 300_000]]);
        let index = sorted_index(&held, 0, 4);
        assert_eq!(index, one_sort(&held));
        assert_eq!(index[7], (5, 0, 7));
    }

    #[test]
    fn bucket_bits_grow_with_rows_within_bounds() {
        assert_eq!(bucket_bits(0), 1);
        assert_eq!(bucket_bits(1 << 20), 8);
        assert_eq!(bucket_bits(usize::MAX), 16);
    }
}
