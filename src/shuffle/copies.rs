//! Repeated rows: the copy index `k` and the key of the k-th copy.
//!
//! # Background
//! The shuffle key hashes a row's content (see the [module docs](super)), so
//! the copies of a repeated row share it and a sort by it would put them next
//! to each other. A uniform permutation of a multiset spreads the `n` copies
//! of a row like `n` independent rows. So the operator that holds every row
//! of the permutation (or every copy of a content, after a hash exchange on
//! the content key) numbers the copies of each content `0..n` and gives copy
//! `k` the key [`copy_key`]`(content key, k)`.
//!
//! # Why this is partition-invariant
//! Copies are identical, so *which* copy gets which `k` cannot be seen: any
//! numbering `0..n` yields the same multiset of (row, key) pairs, hence the
//! same sorted output. The numbering only has to see all copies of a content
//! together, which the index sort (copies are adjacent in content-key order),
//! the merge of content-key-sorted runs, and a hash exchange on the content
//! key all provide, whatever the partitioning, batch sizes or arrival order.
//!
//! # Hash collisions
//! Copies are recognised by comparing the rows' values (arrow's logical
//! equality), not by the 64-bit key alone, so two different rows whose
//! content keys collide are each numbered as their own content.

use datafusion::arrow::array::{Array, RecordBatch};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The key of copy `copy` of a row whose content key is `content_key`.
///
/// Copy 0 keeps the content key, so a table without repeated rows is ordered
/// exactly as by the content key alone. Later copies get an xxh3 hash of `k`
/// seeded by the content key: a fresh, independent position for each copy.
pub(crate) fn copy_key(content_key: u64, copy: u64) -> u64 {
    if copy == 0 {
        content_key
    } else {
        xxh3_64_with_seed(&copy.to_le_bytes(), content_key)
    }
}

/// Whether row `i` of `a` and row `j` of `b` hold the same values in their
/// first `columns` columns (nulls equal nulls, floats compared by bits, as
/// the content key hashes them).
pub(crate) fn rows_equal(
    a: &RecordBatch,
    i: usize,
    b: &RecordBatch,
    j: usize,
    columns: usize,
) -> bool {
    (0..columns).all(|c| {
        let (x, y) = (a.column(c), b.column(c));
        match (x.is_valid(i), y.is_valid(j)) {
            (false, false) => true,
            (true, true) => x.slice(i, 1).to_data() == y.slice(j, 1).to_data(),
            _ => false,
        }
    })
}

/// Numbers the copies of each content in a stream of rows sorted by content
/// key, where the copies of a content are therefore adjacent (possibly with
/// other rows of a colliding key between them).
#[derive(Debug)]
pub(crate) struct CopyCounter {
    /// Content columns (the key column, last, is not compared).
    columns: usize,
    /// The content key of the current run of equal keys.
    key: Option<u64>,
    /// The distinct contents of the current run: a batch holding the first
    /// copy, its row, and the copies seen so far. One entry unless keys collide.
    contents: Vec<(RecordBatch, usize, u64)>,
}

impl CopyCounter {
    /// A counter comparing the first `columns` columns.
    pub(crate) fn new(columns: usize) -> Self {
        Self {
            columns,
            key: None,
            contents: Vec::new(),
        }
    }

    /// The copy index of row `row` of `batch`, whose content key is `key`.
    pub(crate) fn copy_index(
        &mut self,
        batch: &RecordBatch,
        row: usize,
        key: u64,
    ) -> u64 {
        if self.key != Some(key) {
            self.key = Some(key);
            self.contents.clear();
        }
        for (first, first_row, seen) in &mut self.contents {
            if rows_equal(first, *first_row, batch, row, self.columns) {
                let copy = *seen;
                *seen += 1;
                return copy;
            }
        }
        // Holding a clone keeps at most the batches of one run alive.
        self.contents.push((batch.clone(), row, 1));
        0
    }
}

/// Gives the copies in a key-sorted index of held rows their [`copy_key`]s;
/// returns whether any key changed (then the index must be sorted again).
/// `index` holds `(content key, batch, row)` sorted by key.
pub(crate) fn spread_copies_in_index(
    held: &[RecordBatch],
    index: &mut [(u64, u32, u32)],
    columns: usize,
) -> bool {
    let mut changed = false;
    let mut start = 0;
    while start < index.len() {
        let key = index[start].0;
        let end = start
            + index[start..]
                .iter()
                .take_while(|(k, _, _)| *k == key)
                .count();
        if end - start > 1 {
            // (first entry, copies seen) per distinct content of this run.
            let mut contents: Vec<(usize, u64)> = Vec::new();
            for at in start..end {
                let (_, batch, row) = index[at];
                let found = contents.iter_mut().find(|(first, _)| {
                    let (_, first_batch, first_row) = index[*first];
                    rows_equal(
                        &held[first_batch as usize],
                        first_row as usize,
                        &held[batch as usize],
                        row as usize,
                        columns,
                    )
                });
                match found {
                    Some((_, seen)) => {
                        index[at].0 = copy_key(key, *seen);
                        *seen += 1;
                        changed = true;
                    }
                    None => contents.push((at, 1)),
                }
            }
        }
        start = end;
    }
    changed
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Int32Array, StringArray};

    use super::*;

    fn batch(numbers: Vec<Option<i32>>, strings: Vec<Option<&str>>) -> RecordBatch {
        RecordBatch::try_from_iter(vec![
            ("n", Arc::new(Int32Array::from(numbers)) as ArrayRef),
            ("s", Arc::new(StringArray::from(strings)) as ArrayRef),
        ])
        .expect("two columns of equal length")
    }

    #[test]
    fn copies_get_distinct_keys_and_the_first_keeps_the_content_key() {
        let keys: Vec<u64> = (0..100).map(|k| copy_key(42, k)).collect();
        assert_eq!(keys[0], 42);
        let mut distinct = keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 100);
        assert_ne!(copy_key(43, 1), copy_key(42, 1));
    }

    #[test]
    fn equality_compares_values_and_nulls() {
        let a = batch(
            vec![Some(1), None, Some(1)],
            vec![Some("x"), Some("x"), None],
        );
        let b = batch(vec![Some(1), None], vec![Some("x"), Some("x")]);
        assert!(rows_equal(&a, 0, &b, 0, 2));
        assert!(rows_equal(&a, 1, &b, 1, 2));
        assert!(!rows_equal(&a, 2, &b, 0, 2));
        assert!(rows_equal(&a, 2, &b, 0, 1));
        assert!(!rows_equal(&a, 0, &a, 1, 2));
    }

    #[test]
    fn colliding_keys_of_different_rows_are_not_counted_as_copies() {
        // Rows 0, 2, 3 are copies; row 1 differs but shares the key.
        let held = vec![batch(
            vec![Some(1), Some(2), Some(1), Some(1)],
            vec![Some("a"); 4],
        )];
        let mut index: Vec<(u64, u32, u32)> = (0..4).map(|row| (7, 0, row)).collect();
        assert!(spread_copies_in_index(&held, &mut index, 2));
        let keys: Vec<u64> = index.iter().map(|e| e.0).collect();
        assert_eq!(keys, vec![7, 7, copy_key(7, 1), copy_key(7, 2)]);

        let mut counter = CopyCounter::new(2);
        let copies: Vec<u64> = (0..4)
            .map(|row| counter.copy_index(&held[0], row, 7))
            .collect();
        assert_eq!(copies, vec![0, 0, 1, 2]);
        // A new key starts a new run.
        assert_eq!(counter.copy_index(&held[0], 0, 8), 0);
    }
}
