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
//!
//! # Which values
//! [`CopyIdentity`] says which columns are compared. Usually all of them:
//! the rows are their content. A shuffle keyed by a content hash column
//! ([`super::KeySource::ContentHash`]) compares that column alone: the hash
//! *is* the content there, and the other columns ride along and may differ
//! between copies. `explain_batch`'s origins query carries each row's file
//! and row index next to the hash of the feed's key columns; compared as
//! values, every copy looked distinct, kept its content key and sat next to
//! the others where the feed spreads them (and a run of `n` equal keys cost
//! `n²` comparisons: minutes over a column of 214 distinct values).
//!
//! # Which copy gets which number
//! Where copies are equal in every column, any numbering gives the same
//! output. Keyed by a content hash, copies differ in what rides along, and
//! an arrival-order numbering would let one run name row 431 where another
//! run names row 17. So copies are numbered in the order of those other
//! columns' values ([`CopyIdentity::ties`], [`order_copies_by_ties`]; the
//! spilled runs are sorted and merged the same way): the same answer on
//! every run, partitioning and memory budget.

use std::ops::Range;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch};
use datafusion::arrow::compute::interleave;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::error::Result;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::KeySource;

/// Which columns of a keyed row make two rows copies of one content; see
/// the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyIdentity {
    /// Every column before the key: the rows are their content.
    #[default]
    Values,
    /// Only the column at this position, a content hash: two rows whose
    /// hashes are equal are copies, whatever else they carry.
    ContentHash(usize),
}

impl CopyIdentity {
    /// The identity of rows keyed from `source`.
    pub fn of(source: &KeySource) -> Self {
        match source {
            KeySource::ContentHash(index) => CopyIdentity::ContentHash(*index),
            KeySource::AllColumns | KeySource::Columns(_) => CopyIdentity::Values,
        }
    }

    /// The compared columns of rows whose first `content` columns come
    /// before the key (and any routing columns).
    pub(crate) fn columns(self, content: usize) -> Range<usize> {
        match self {
            CopyIdentity::Values => 0..content,
            CopyIdentity::ContentHash(index) => index..index + 1,
        }
    }

    /// The columns, of the first `content`, that order copies among
    /// themselves: those outside [`Self::columns`] (none when copies are
    /// equal in every column).
    pub(crate) fn ties(self, content: usize) -> Vec<usize> {
        let compared = self.columns(content);
        (0..content).filter(|c| !compared.contains(c)).collect()
    }
}

/// Entries of runs of copies ordered at once by [`order_copies_by_ties`]:
/// bounds the rows it converts at a time.
const TIE_GROUP_ENTRIES: usize = 1 << 16;

/// Orders the entries of each run of equal keys of `index` (sorted by key)
/// by the values of the `ties` columns of their rows in `held`, ascending
/// as DataFusion's sort and merge order them (see the module docs). Runs of
/// one entry cost nothing; the others are converted to Arrow's row format
/// in groups of about [`TIE_GROUP_ENTRIES`].
pub(crate) fn order_copies_by_ties(
    held: &[RecordBatch],
    index: &mut [(u64, u32, u32)],
    ties: &[usize],
) -> Result<()> {
    if ties.is_empty() || held.is_empty() {
        return Ok(());
    }
    let fields = ties
        .iter()
        .map(|&c| SortField::new(held[0].column(c).data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields)?;
    let mut group: Vec<Range<usize>> = Vec::new();
    let mut group_entries = 0;
    let mut start = 0;
    while start < index.len() {
        let key = index[start].0;
        let end = start + index[start..].iter().take_while(|e| e.0 == key).count();
        if end - start > 1 {
            group_entries += end - start;
            group.push(start..end);
            if group_entries >= TIE_GROUP_ENTRIES {
                order_group(held, index, ties, &converter, &group)?;
                group.clear();
                group_entries = 0;
            }
        }
        start = end;
    }
    order_group(held, index, ties, &converter, &group)
}

/// [`order_copies_by_ties`] for the runs `group` of `index`.
fn order_group(
    held: &[RecordBatch],
    index: &mut [(u64, u32, u32)],
    ties: &[usize],
    converter: &RowConverter,
    group: &[Range<usize>],
) -> Result<()> {
    if group.is_empty() {
        return Ok(());
    }
    let positions: Vec<(usize, usize)> = group
        .iter()
        .flat_map(|run| index[run.clone()].iter())
        .map(|&(_, batch, row)| (batch as usize, row as usize))
        .collect();
    let columns = ties
        .iter()
        .map(|&c| {
            let arrays: Vec<&dyn Array> =
                held.iter().map(|b| b.column(c).as_ref()).collect();
            interleave(&arrays, &positions)
        })
        .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
    let rows = converter.convert_columns(&columns)?;
    let mut at = 0;
    for run in group {
        let mut order: Vec<usize> = (0..run.len()).collect();
        order.sort_by(|&a, &b| rows.row(at + a).cmp(&rows.row(at + b)));
        let ordered: Vec<(u64, u32, u32)> =
            order.iter().map(|&i| index[run.start + i]).collect();
        index[run.clone()].copy_from_slice(&ordered);
        at += run.len();
    }
    Ok(())
}

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

/// Whether row `i` of `a` and row `j` of `b` hold the same values in
/// `columns` (nulls equal nulls, floats compared by bits, as the content key
/// hashes them).
pub(crate) fn rows_equal(
    a: &RecordBatch,
    i: usize,
    b: &RecordBatch,
    j: usize,
    columns: Range<usize>,
) -> bool {
    columns.into_iter().all(|c| {
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
    /// The compared columns (see [`CopyIdentity::columns`]).
    columns: Range<usize>,
    /// The content key of the current run of equal keys.
    key: Option<u64>,
    /// The distinct contents of the current run: a batch holding the first
    /// copy, its row, and the copies seen so far. One entry unless keys collide.
    contents: Vec<(RecordBatch, usize, u64)>,
}

impl CopyCounter {
    /// A counter comparing `columns`.
    pub(crate) fn new(columns: Range<usize>) -> Self {
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
            if rows_equal(first, *first_row, batch, row, self.columns.clone()) {
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
/// `index` holds `(content key, batch, row)` sorted by key; `columns` are
/// the compared ones.
pub(crate) fn spread_copies_in_index(
    held: &[RecordBatch],
    index: &mut [(u64, u32, u32)],
    columns: Range<usize>,
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
                        columns.clone(),
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
        assert!(rows_equal(&a, 0, &b, 0, 0..2));
        assert!(rows_equal(&a, 1, &b, 1, 0..2));
        assert!(!rows_equal(&a, 2, &b, 0, 0..2));
        assert!(rows_equal(&a, 2, &b, 0, 0..1));
        assert!(!rows_equal(&a, 0, &a, 1, 0..2));
        assert!(rows_equal(&a, 0, &a, 1, 1..2));
    }

    #[test]
    fn colliding_keys_of_different_rows_are_not_counted_as_copies() {
        // Rows 0, 2, 3 are copies; row 1 differs but shares the key.
        let held = vec![batch(
            vec![Some(1), Some(2), Some(1), Some(1)],
            vec![Some("a"); 4],
        )];
        let mut index: Vec<(u64, u32, u32)> = (0..4).map(|row| (7, 0, row)).collect();
        assert!(spread_copies_in_index(&held, &mut index, 0..2));
        let keys: Vec<u64> = index.iter().map(|e| e.0).collect();
        assert_eq!(keys, vec![7, 7, copy_key(7, 1), copy_key(7, 2)]);

        let mut counter = CopyCounter::new(0..2);
        let copies: Vec<u64> = (0..4)
            .map(|row| counter.copy_index(&held[0], row, 7))
            .collect();
        assert_eq!(copies, vec![0, 0, 1, 2]);
        // A new key starts a new run.
        assert_eq!(counter.copy_index(&held[0], 0, 8), 0);
    }

    #[test]
    fn rows_keyed_by_a_content_hash_are_copies_whatever_they_carry() {
        // Column `s` is the content hash's stand-in: equal there, the rows
        // are copies although `n` (an origin riding along) differs.
        let held = vec![batch(
            vec![Some(1), Some(2), Some(3), Some(4)],
            vec![Some("h"), Some("h"), Some("g"), Some("h")],
        )];
        let identity = CopyIdentity::ContentHash(1);
        assert_eq!(identity.columns(2), 1..2);
        assert_eq!(CopyIdentity::Values.columns(2), 0..2);
        let mut index: Vec<(u64, u32, u32)> = (0..4).map(|row| (7, 0, row)).collect();
        assert!(spread_copies_in_index(
            &held,
            &mut index,
            identity.columns(2)
        ));
        let keys: Vec<u64> = index.iter().map(|e| e.0).collect();
        assert_eq!(keys, vec![7, copy_key(7, 1), 7, copy_key(7, 2)]);
        // Compared by value, the same rows are four contents.
        let mut index: Vec<(u64, u32, u32)> = (0..4).map(|row| (7, 0, row)).collect();
        assert!(!spread_copies_in_index(&held, &mut index, 0..2));
    }

    #[test]
    fn copies_are_numbered_in_the_order_of_what_they_carry() -> Result<()> {
        // Copies (equal `s`) arriving in two batches in any order are
        // ordered by `n`, what rides along, before they are numbered.
        let held = vec![
            batch(vec![Some(9), Some(2)], vec![Some("h"), Some("g")]),
            batch(vec![Some(4), Some(1)], vec![Some("h"), Some("h")]),
        ];
        let identity = CopyIdentity::ContentHash(1);
        assert_eq!(identity.ties(2), vec![0]);
        assert!(CopyIdentity::Values.ties(2).is_empty());
        let mut index = vec![(5, 0, 1), (7, 1, 0), (7, 0, 0), (7, 1, 1)];
        order_copies_by_ties(&held, &mut index, &identity.ties(2))?;
        assert_eq!(index, vec![(5, 0, 1), (7, 1, 1), (7, 1, 0), (7, 0, 0)]);
        Ok(())
    }
}
