//! A gathering permutation's index sorted one key range at a time, behind
//! its output: the first batch waits for the index to be placed and checked
//! for copies, not for the whole sort.
//!
//! ```text
//!  held key columns ──► groups by the keys' top bits (threads: each places
//!        │              its own groups, reading every key)
//!        ▼
//!  groups 0 1 2 … G-1   unsorted; every key of group g < every key of g+1
//!        │ any key repeated within a group? (a hash set per group, threads)
//!        ├── yes: sort that group, order ties, number its copies; copies
//!        │        after the first got new keys → `relocated` (sorted)
//!        ▼
//!  sorter thread: sorts group 0, sends it, group 1, …   (channel, in order)
//!        │
//!        ▼
//!  output batches: the groups in turn, merged with `relocated`
//! ```
//!
//! # Why
//! Before, the whole index (16 bytes a row) was sorted before the first
//! batch; at 20M rows on 2 cores that was about 0.6 s after the scan, at
//! 100M several seconds, and the output stream then only gathered. Sorting
//! is now spread over the epoch, on a thread of its own, ahead of the
//! batches it feeds; before the first batch remain placing the entries in
//! groups and the check for repeated keys, both linear and shared by the
//! scan's cores.
//!
//! # Ordering
//! Exactly [`super::index_sort::sorted_index`] followed by copy numbering
//! and a sort of the renumbered index: all copies of a row share a content
//! key, so they are in one group, where they are numbered as in the whole
//! index; copies after the first leave their group (their keys are new and
//! fall anywhere) and are merged back by `(key, batch, row)`.
//!
//! # Memory
//! The groups are allocated at their final sizes from a count (no second
//! copy of the index); each group is freed once its rows are gathered, so
//! the index shrinks as the epoch is read. The check for repeats uses one
//! table of twice a group's entries per thread.

use datafusion::arrow::array::RecordBatch;
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::physical_plan::metrics::Time;
use std::ops::Range;
use tokio::sync::mpsc;

use super::super::copies::{order_copies_by_ties, spread_copies_in_index};
use super::index_sort::{Entry, entries};

/// About this many entries per group: a group sorts in the cache (1 MiB of
/// entries) and there are few enough groups to place entries into.
const ENTRIES_PER_GROUP: usize = 1 << 16;

/// The index of a gathering permutation held in memory, its groups not
/// sorted yet (but those that held copies).
pub(super) struct GroupedIndex {
    /// Entries by group, groups in key order.
    groups: Vec<Vec<Entry>>,
    /// Whether `groups[i]` is sorted already.
    sorted: Vec<bool>,
    /// Copies after the first with their own keys, sorted.
    relocated: Vec<Entry>,
}

impl GroupedIndex {
    /// The index of the keys in column `key_column` of `held`, placed in
    /// groups by up to `threads` threads; then, in every group where a key
    /// repeats, the group is sorted, equal keys ordered by the `ties`
    /// columns, and (if `spread` names the columns that make rows copies)
    /// the copies after the first get their own keys and leave the group.
    pub(super) fn build(
        held: &[RecordBatch],
        key_column: usize,
        threads: usize,
        ties: &[usize],
        spread: Option<Range<usize>>,
    ) -> Result<Self> {
        let rows: usize = held.iter().map(|b| b.num_rows()).sum();
        let bits = group_bits(rows);
        let threads = threads.clamp(1, 1 << bits);
        let mut groups = place_in_groups(held, key_column, bits, threads);
        let repeats = groups_with_repeated_keys(&groups, threads);
        let mut sorted = vec![false; groups.len()];
        let mut relocated = Vec::new();
        for g in repeats {
            let group = &mut groups[g];
            group.sort_unstable();
            order_copies_by_ties(held, group, ties)?;
            if let Some(columns) = spread.clone()
                && spread_copies_in_index(held, group, columns)
            {
                relocated.extend(group.iter().filter(|e| group_of(e.0, bits) != g));
                group.retain(|e| group_of(e.0, bits) == g);
            }
            // Copies numbered in place changed keys: sort again.
            group.sort_unstable();
            sorted[g] = true;
        }
        relocated.sort_unstable();
        Ok(Self {
            groups,
            sorted,
            relocated,
        })
    }

    /// Entries in all.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.groups.iter().map(Vec::len).sum::<usize>() + self.relocated.len()
    }

    /// Starts sorting the groups in order on a blocking thread of the
    /// current tokio runtime (time spent in `sort_time`) and returns the
    /// sorted index as a stream of entries, `batch_rows` at a time. Without
    /// a runtime the groups are sorted here first.
    pub(super) fn stream(self, batch_rows: usize, sort_time: Time) -> SortedEntries {
        let Self {
            groups,
            sorted,
            relocated,
        } = self;
        let expected_groups = groups.len();
        let (tx, rx) = mpsc::unbounded_channel();
        let sort_in_order = move || {
            for (mut group, is_sorted) in groups.into_iter().zip(sorted) {
                if !is_sorted {
                    let _timer = sort_time.timer();
                    group.sort_unstable();
                }
                if tx.send(group).is_err() {
                    return; // the output was dropped
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            // Dropped handle: the thread runs on; it stops at its next send
            // once the receiver is gone.
            Ok(runtime) => drop(runtime.spawn_blocking(sort_in_order)),
            Err(_) => sort_in_order(),
        }
        SortedEntries {
            groups: rx,
            groups_left: expected_groups,
            group: Vec::new(),
            at: 0,
            relocated,
            relocated_at: 0,
            batch_rows: batch_rows.max(1),
        }
    }
}

/// The sorted index, read a batch of entries at a time (see
/// [`GroupedIndex::stream`]).
pub(super) struct SortedEntries {
    groups: mpsc::UnboundedReceiver<Vec<Entry>>,
    /// Groups not received yet.
    groups_left: usize,
    /// The group being read, and the next entry of it.
    group: Vec<Entry>,
    at: usize,
    relocated: Vec<Entry>,
    relocated_at: usize,
    batch_rows: usize,
}

impl SortedEntries {
    /// The next up to `batch_rows` entries in order; empty at the end.
    pub(super) async fn next_batch(&mut self) -> Result<Vec<Entry>> {
        let mut out = Vec::with_capacity(self.batch_rows);
        while out.len() < self.batch_rows {
            if self.at == self.group.len() {
                if self.groups_left == 0 {
                    // Only relocated copies remain.
                    let end = (self.relocated_at + self.batch_rows - out.len())
                        .min(self.relocated.len());
                    out.extend_from_slice(&self.relocated[self.relocated_at..end]);
                    self.relocated_at = end;
                    break;
                }
                // Free the group just read before waiting for the next.
                self.group = Vec::new();
                self.at = 0;
                match self.groups.recv().await {
                    Some(group) => self.group = group,
                    None => {
                        return internal_err!(
                            "the thread sorting the shuffle's index stopped with {} groups \
                             left",
                            self.groups_left
                        );
                    }
                }
                self.groups_left -= 1;
                continue;
            }
            let wanted = self.batch_rows - out.len();
            let rest = &self.group[self.at..];
            match self.relocated.get(self.relocated_at) {
                // Nothing to merge before the group's entries (the usual
                // case: no copies): take them in one slice.
                None => {
                    let take = wanted.min(rest.len());
                    out.extend_from_slice(&rest[..take]);
                    self.at += take;
                }
                Some(&copy) if copy < rest[0] => {
                    out.push(copy);
                    self.relocated_at += 1;
                }
                Some(&copy) => {
                    let take = rest
                        .iter()
                        .take(wanted)
                        .take_while(|&&entry| entry < copy)
                        .count();
                    out.extend_from_slice(&rest[..take]);
                    self.at += take;
                }
            }
        }
        Ok(out)
    }
}

/// Bits of the key that pick a group: about [`ENTRIES_PER_GROUP`] entries
/// per group, between 1 and 16 bits.
fn group_bits(rows: usize) -> u32 {
    (rows / ENTRIES_PER_GROUP).max(2).ilog2().clamp(1, 16)
}

fn group_of(key: u64, bits: u32) -> usize {
    (key >> (64 - bits)) as usize
}

/// The groups of `2^bits`, each filled in arrival order. Thread `t` owns
/// a contiguous range of groups and reads every key twice (to count, then
/// to place), so no group is written by two threads.
fn place_in_groups(
    held: &[RecordBatch],
    key_column: usize,
    bits: u32,
    threads: usize,
) -> Vec<Vec<Entry>> {
    let count = 1usize << bits;
    let place = |owned: Range<usize>| -> Vec<Vec<Entry>> {
        let mut sizes = vec![0usize; owned.len()];
        for (key, _, _) in entries(held, key_column) {
            let g = group_of(key, bits);
            if owned.contains(&g) {
                sizes[g - owned.start] += 1;
            }
        }
        let mut groups: Vec<Vec<Entry>> =
            sizes.into_iter().map(Vec::with_capacity).collect();
        for entry in entries(held, key_column) {
            let g = group_of(entry.0, bits);
            if owned.contains(&g) {
                groups[g - owned.start].push(entry);
            }
        }
        groups
    };
    let shares: Vec<Range<usize>> = (0..threads)
        .map(|t| t * count / threads..(t + 1) * count / threads)
        .collect();
    on_threads(&shares, place).into_iter().flatten().collect()
}

/// The groups in which some key occurs more than once, in order.
fn groups_with_repeated_keys(groups: &[Vec<Entry>], threads: usize) -> Vec<usize> {
    let shares: Vec<Range<usize>> = (0..threads)
        .map(|t| t * groups.len() / threads..(t + 1) * groups.len() / threads)
        .collect();
    let find = |share: Range<usize>| -> Vec<usize> {
        let mut seen = KeySet::default();
        share.filter(|&g| seen.any_repeated(&groups[g])).collect()
    };
    on_threads(&shares, find).into_iter().flatten().collect()
}

/// `work` of each share, the first on the calling thread and the others on
/// scoped threads; a share whose thread the system refuses runs on the
/// calling thread. Results in share order.
fn on_threads<T: Send>(
    shares: &[Range<usize>],
    work: impl Fn(Range<usize>) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|scope| {
        let work = &work;
        let spawned: Vec<_> = shares
            .iter()
            .skip(1)
            .map(|share| {
                let for_thread = share.clone();
                std::thread::Builder::new()
                    .name("sqlfeed-shuffle-index".into())
                    .spawn_scoped(scope, move || work(for_thread))
                    .map_err(|_| share.clone())
            })
            .collect();
        let mut results = Vec::with_capacity(shares.len());
        results.extend(shares.first().map(|share| work(share.clone())));
        for handle in spawned {
            results.push(match handle {
                Ok(handle) => match handle.join() {
                    Ok(result) => result,
                    Err(panic) => std::panic::resume_unwind(panic),
                },
                Err(share) => work(share),
            });
        }
        results
    })
}

/// An open-addressing set of keys, reused from group to group.
#[derive(Default)]
struct KeySet {
    keys: Vec<u64>,
    /// The generation that wrote each slot; slots of older ones are empty.
    stamps: Vec<u32>,
    stamp: u32,
}

impl KeySet {
    /// Whether a key occurs twice in `entries`.
    fn any_repeated(&mut self, entries: &[Entry]) -> bool {
        let slots = (entries.len() * 2).next_power_of_two().max(16);
        if self.keys.len() < slots {
            self.keys = vec![0; slots];
            self.stamps = vec![0; slots];
            self.stamp = 0;
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.stamps.fill(0);
            self.stamp = 1;
        }
        let mask = slots - 1;
        for &(key, _, _) in entries {
            // A group's keys share their top bits: mix all of them in.
            let mut slot =
                (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & mask;
            loop {
                if self.stamps[slot] != self.stamp {
                    self.stamps[slot] = self.stamp;
                    self.keys[slot] = key;
                    break;
                }
                if self.keys[slot] == key {
                    return true;
                }
                slot = (slot + 1) & mask;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, AsArray, Int64Array, UInt64Array};

    use super::super::super::copies::copy_key;
    use super::super::index_sort::sorted_index;
    use super::*;
    use crate::rand::splitmix64;

    /// Batches of (value, key) where the key is a hash of the value: equal
    /// values are copies with equal content keys.
    fn held(batches: &[Vec<i64>]) -> Vec<RecordBatch> {
        batches
            .iter()
            .map(|values| {
                let keys: Vec<u64> =
                    values.iter().map(|&v| splitmix64(v as u64)).collect();
                RecordBatch::try_from_iter(vec![
                    ("v", Arc::new(Int64Array::from(values.clone())) as ArrayRef),
                    ("k", Arc::new(UInt64Array::from(keys)) as ArrayRef),
                ])
                .expect("two columns of equal length")
            })
            .collect()
    }

    /// The order before streaming: the whole index sorted, copies numbered,
    /// sorted again.
    fn whole_sort(held: &[RecordBatch]) -> Vec<Entry> {
        let mut index = sorted_index(held, 1, 1);
        if spread_copies_in_index(held, &mut index, 0..1) {
            index.sort_unstable();
        }
        index
    }

    async fn streamed(
        held: &[RecordBatch],
        threads: usize,
        batch_rows: usize,
    ) -> Vec<Entry> {
        let index =
            GroupedIndex::build(held, 1, threads, &[], Some(0..1)).expect("built");
        let len = index.len();
        let mut entries = index.stream(batch_rows, Time::new());
        let mut out = Vec::new();
        loop {
            let batch = entries.next_batch().await.expect("sorted");
            if batch.is_empty() {
                break;
            }
            assert!(batch.len() <= batch_rows);
            out.extend(batch);
        }
        assert_eq!(out.len(), len);
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streamed_index_is_the_whole_sort_with_copies_spread() {
        // 300k rows of uneven batches: most values once, every 5th value
        // three times (copies, numbered and moved to other groups).
        let mut batches = Vec::new();
        let mut next = 0i64;
        for size in [1usize, 70_000, 3, 200_000, 30_000] {
            batches.push(
                (0..size)
                    .map(|i| {
                        next += 1;
                        if i % 5 == 0 {
                            (next / 5) % 20_000
                        } else {
                            1_000_000 + next
                        }
                    })
                    .collect(),
            );
        }
        let held = held(&batches);
        let expected = whole_sort(&held);
        assert!(expected.windows(2).all(|w| w[0] < w[1]));
        // Some copies were renumbered (their keys are not a value's hash).
        assert!(expected.iter().any(|e| {
            let (batch, row) = (e.1 as usize, e.2 as usize);
            let v = held[batch]
                .column(0)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .value(row);
            e.0 == copy_key(splitmix64(v as u64), 1)
        }));
        for threads in [1, 2, 3] {
            for batch_rows in [1, 8192, 1 << 20] {
                assert_eq!(
                    streamed(&held, threads, batch_rows).await,
                    expected,
                    "{threads} threads, batches of {batch_rows}"
                );
            }
        }
    }

    #[tokio::test]
    async fn without_copies_no_group_is_sorted_before_the_stream() {
        let held = held(&[(0..200_000).collect()]);
        let index = GroupedIndex::build(&held, 1, 2, &[], Some(0..1)).expect("built");
        assert!(index.sorted.iter().all(|&s| !s));
        assert!(index.relocated.is_empty());
        assert_eq!(streamed(&held, 2, 4096).await, whole_sort(&held));
    }

    #[test]
    fn a_sorter_that_stops_early_is_an_error_not_a_short_epoch() {
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(vec![(1, 0, 0)]).expect("open");
        drop(tx);
        let mut entries = SortedEntries {
            groups: rx,
            groups_left: 2,
            group: Vec::new(),
            at: 0,
            relocated: Vec::new(),
            relocated_at: 0,
            batch_rows: 4,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let err = runtime
            .block_on(entries.next_batch())
            .expect_err("a group is missing");
        assert!(err.to_string().contains("1 groups left"), "{err}");
    }

    #[test]
    fn key_set_finds_repeats_across_stamps() {
        let mut set = KeySet::default();
        let unique: Vec<Entry> =
            (0..1000).map(|i| (splitmix64(i), 0, i as u32)).collect();
        assert!(!set.any_repeated(&unique));
        assert!(
            !set.any_repeated(&unique),
            "a new generation forgets the last"
        );
        let mut repeated = unique.clone();
        repeated.push((unique[500].0, 1, 0));
        assert!(set.any_repeated(&repeated));
        // Equal top bits (one group) and zero keys.
        let same_top: Vec<Entry> = (0..100).map(|i| (i, 0, i as u32)).collect();
        assert!(!set.any_repeated(&same_top));
        assert!(set.any_repeated(&[(0, 0, 0), (0, 0, 1)]));
    }
}
