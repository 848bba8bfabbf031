//! The held rows in their canonical order, by file and row: what an
//! [`IndexPermutation`](super::permutation::IndexPermutation) permutes.
//!
//! Rows arrive in any order (partitions race), in batches that may hold
//! rows of several files (a filter's batches are coalesced). Each batch is
//! cut into [`Run`]s: rows of one file with ascending row indexes. Sorted by
//! `(file, first row)`, runs whose row ranges do not overlap list every row
//! in `(file, row)` order, so a row's canonical rank is the rows of the runs
//! before its own plus its place in it: the same on any partition count,
//! batch size or arrival order. No per-row index is kept for them: about 64
//! bytes a run, not 16 a row.
//!
//! Runs of one file can overlap: a partition that steals byte ranges of a
//! file (DataFusion's work stealing) reads ranges 0 and 2 while another
//! reads 1, and a filter's coalescing joins the ends of 0 and 2 into one
//! run with a hole that the other partition's run fills. So a run with
//! holes keeps its row indexes (a slice of the scan's column), and
//! overlapping runs are merged row by row into the finer runs of their
//! true order. Only a row that comes twice (a file read twice) is an error.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Int64Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Int32Type};
use datafusion::common::DataFusionError;
use datafusion::common::{exec_err, internal_err};
use datafusion::error::Result;

/// Rows of one held batch from one file, row indexes ascending.
#[derive(Debug, Clone)]
pub(super) struct Run {
    /// The file's path, as the scan names it.
    file: Arc<str>,
    /// Row indexes in the file of the run's first and last row.
    first_row: i64,
    last_row: i64,
    /// The held batch and the run's first row in it.
    batch: u32,
    offset: u32,
    len: u32,
    /// The run's row indexes, when they have holes (`None`: every row from
    /// `first_row` to `last_row`).
    rows: Option<Int64Array>,
}

impl Run {
    /// Whether it keeps its row indexes (they have holes).
    pub(super) fn keeps_rows(&self) -> bool {
        self.rows.is_some()
    }

    /// The row index of the run's `k`-th row.
    fn row(&self, k: usize) -> i64 {
        match &self.rows {
            Some(rows) => rows.value(k),
            None => self.first_row + k as i64,
        }
    }
}

/// Each row's file path, as the scan gives it: a dictionary (one path and a
/// key per row: the scan's per-file literal, cast) or a path per row.
pub(super) enum FileColumn<'a> {
    Keys {
        keys: &'a [i32],
        paths: &'a StringArray,
    },
    Paths(&'a StringArray),
}

impl<'a> FileColumn<'a> {
    /// Whether a column of `data_type` can be read as one.
    pub(super) fn accepts(data_type: &DataType) -> bool {
        match data_type {
            DataType::Utf8 => true,
            DataType::Dictionary(key, value) => {
                **key == DataType::Int32 && **value == DataType::Utf8
            }
            _ => false,
        }
    }

    /// `array` read as each row's file; an internal error for another type
    /// or a row without a file.
    pub(super) fn try_new(array: &'a dyn Array) -> Result<Self> {
        if array.logical_null_count() > 0 {
            return internal_err!("SHUFFLE BY POSITION: a row without its file");
        }
        if let Some(paths) = array.as_string_opt::<i32>() {
            return Ok(Self::Paths(paths));
        }
        let Some(dictionary) = array.as_dictionary_opt::<Int32Type>() else {
            return internal_err!(
                "SHUFFLE BY POSITION: the file column is {}, not Utf8",
                array.data_type()
            );
        };
        let Some(paths) = dictionary.values().as_string_opt::<i32>() else {
            return internal_err!("SHUFFLE BY POSITION: the file dictionary is not Utf8");
        };
        Ok(Self::Keys {
            keys: dictionary.keys().values(),
            paths,
        })
    }

    fn len(&self) -> usize {
        match self {
            Self::Keys { keys, .. } => keys.len(),
            Self::Paths(paths) => paths.len(),
        }
    }

    /// Whether rows `a` and `b` come from one file. Two keys of one path
    /// (a dictionary concatenated without merging) count as two files: the
    /// run is cut there, which ranks the rows the same.
    fn same(&self, a: usize, b: usize) -> bool {
        match self {
            Self::Keys { keys, .. } => keys[a] == keys[b],
            Self::Paths(paths) => paths.value(a) == paths.value(b),
        }
    }

    pub(super) fn path(&self, row: usize) -> &'a str {
        match self {
            Self::Keys { keys, paths } => paths.value(keys[row] as usize),
            Self::Paths(paths) => paths.value(row),
        }
    }
}

/// Cuts held batch number `batch` into runs from its `files` and `rows`
/// columns; `last_file` keeps the previous run's path so that the runs of a
/// file share one allocation.
pub(super) fn runs_of(
    files: &FileColumn<'_>,
    rows: &Int64Array,
    batch: usize,
    last_file: &mut Option<Arc<str>>,
) -> Result<Vec<Run>> {
    if rows.null_count() > 0 {
        return internal_err!("SHUFFLE BY POSITION: a row without its row index");
    }
    let Ok(batch) = u32::try_from(batch) else {
        return exec_err!("SHUFFLE BY POSITION holds at most 2^32 batches");
    };
    let values = rows.values();
    let mut runs = Vec::new();
    let mut start = 0;
    while start < files.len() {
        let name = files.path(start);
        let mut end = start + 1;
        while end < files.len() && values[end] > values[end - 1] && files.same(start, end)
        {
            end += 1;
        }
        let file = match last_file {
            Some(file) if file.as_ref() == name => Arc::clone(file),
            _ => Arc::clone(last_file.insert(Arc::from(name))),
        };
        let (Ok(offset), Ok(len)) = (u32::try_from(start), u32::try_from(end - start))
        else {
            return exec_err!("SHUFFLE BY POSITION: a batch of more than 2^32 rows");
        };
        let dense = values[end - 1] - values[start] == (end - start - 1) as i64;
        runs.push(Run {
            file,
            first_row: values[start],
            last_row: values[end - 1],
            batch,
            offset,
            len,
            rows: (!dense).then(|| rows.slice(start, end - start)),
        });
        start = end;
    }
    Ok(runs)
}

/// `runs` (sorted by file and first row) with every group of overlapping
/// runs of one file replaced by the runs of its rows in row order.
fn merge_overlaps(runs: Vec<Run>) -> Result<Vec<Run>> {
    let mut merged = Vec::with_capacity(runs.len());
    let mut group: Vec<Run> = Vec::new();
    let mut group_end = i64::MIN;
    for run in runs {
        let overlaps = group
            .last()
            .is_some_and(|last| last.file == run.file && run.first_row <= group_end);
        if !overlaps {
            flush(&mut group, &mut merged)?;
            group_end = i64::MIN;
        }
        group_end = group_end.max(run.last_row);
        group.push(run);
    }
    flush(&mut group, &mut merged)?;
    Ok(merged)
}

/// Moves `group` (runs of one file whose ranges chain into one another) to
/// `merged` as the runs of its rows in row order.
fn flush(group: &mut Vec<Run>, merged: &mut Vec<Run>) -> Result<()> {
    if group.len() < 2 {
        merged.append(group);
        return Ok(());
    }
    // Every row of the group: (row index, run in the group, place in it).
    let mut rows: Vec<(i64, u32, u32)> = Vec::new();
    for (g, run) in group.iter().enumerate() {
        rows.extend((0..run.len as usize).map(|k| (run.row(k), g as u32, k as u32)));
    }
    rows.sort_unstable();
    if let Some(pair) = rows.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        return Err(read_twice(&group[0].file, pair[0].0));
    }
    let mut at = 0;
    while at < rows.len() {
        let (first_row, g, k) = rows[at];
        let mut end = at + 1;
        while end < rows.len() && rows[end].1 == g && rows[end].2 == rows[end - 1].2 + 1 {
            end += 1;
        }
        let source = &group[g as usize];
        merged.push(Run {
            file: Arc::clone(&source.file),
            first_row,
            last_row: rows[end - 1].0,
            batch: source.batch,
            offset: source.offset + k,
            len: (end - at) as u32,
            // Merged: ranked by where it stands, never compared again.
            rows: None,
        });
        at = end;
    }
    group.clear();
    Ok(())
}

/// The error of a row that reached the shuffle twice.
fn read_twice(file: &str, row: i64) -> DataFusionError {
    DataFusionError::Execution(format!(
        "SHUFFLE BY POSITION orders rows by the file and row they come from, but row \
         {row} of {file} reached it twice (a query that reads a file twice, or a table \
         that lists it twice). Use SHUFFLE, which orders rows by their content"
    ))
}

/// Canonical ranks in a block of [`CanonicalRows::first_run`].
const BLOCK: u64 = 4096;

/// Every held row by canonical rank; see the module docs.
#[derive(Debug)]
pub(super) struct CanonicalRows {
    /// Sorted by `(file, first row)`.
    runs: Vec<Run>,
    /// Canonical rank of each run's first row, then the total.
    starts: Vec<u64>,
    /// The run holding rank `k · BLOCK`, for each `k`.
    first_run: Vec<u32>,
}

impl CanonicalRows {
    /// The order of `runs`; two runs that share a row of a file (the file
    /// read twice) are an error naming them.
    pub(super) fn try_new(mut runs: Vec<Run>) -> Result<Self> {
        runs.sort_unstable_by(|a, b| {
            (a.file.as_ref(), a.first_row).cmp(&(b.file.as_ref(), b.first_row))
        });
        let runs = merge_overlaps(runs)?;
        let mut starts = Vec::with_capacity(runs.len() + 1);
        let mut total = 0u64;
        for run in &runs {
            starts.push(total);
            total += u64::from(run.len);
        }
        starts.push(total);
        let mut first_run = Vec::with_capacity(total.div_ceil(BLOCK) as usize);
        let mut run = 0usize;
        let mut rank = 0u64;
        while rank < total {
            while starts[run + 1] <= rank {
                run += 1;
            }
            let Ok(run) = u32::try_from(run) else {
                return exec_err!("SHUFFLE BY POSITION holds at most 2^32 runs");
            };
            first_run.push(run);
            rank += BLOCK;
        }
        Ok(Self {
            runs,
            starts,
            first_run,
        })
    }

    /// Rows in all.
    pub(super) fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The held batch and row of canonical rank `rank` (`< len`).
    pub(super) fn locate(&self, rank: u64) -> (usize, usize) {
        let mut run = self.first_run[(rank / BLOCK) as usize] as usize;
        while self.starts[run + 1] <= rank {
            run += 1;
        }
        let held = &self.runs[run];
        (
            held.batch as usize,
            held.offset as usize + (rank - self.starts[run]) as usize,
        )
    }

    /// Runs in all (a metric: how cut up the input was).
    pub(super) fn runs(&self) -> usize {
        self.runs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runs of a batch, from paths per row and from a dictionary of
    /// them (which must agree).
    fn runs(batch: usize, files: &[&str], rows: &[i64]) -> Vec<Run> {
        let paths = StringArray::from(files.to_vec());
        let rows = Int64Array::from(rows.to_vec());
        let plain = runs_of(&FileColumn::Paths(&paths), &rows, batch, &mut None).unwrap();
        let keyed: datafusion::arrow::array::DictionaryArray<Int32Type> =
            files.iter().copied().collect();
        let keyed = runs_of(
            &FileColumn::try_new(&keyed).unwrap(),
            &rows,
            batch,
            &mut None,
        )
        .unwrap();
        let shape = |runs: &[Run]| -> Vec<(String, i64, i64, u32, u32)> {
            runs.iter()
                .map(|r| (r.file.to_string(), r.first_row, r.last_row, r.offset, r.len))
                .collect()
        };
        assert_eq!(shape(&plain), shape(&keyed));
        plain
    }

    #[test]
    fn a_file_column_of_another_type_or_with_nulls_is_an_internal_error() {
        let numbers = Int64Array::from(vec![1, 2]);
        assert!(FileColumn::try_new(&numbers).is_err());
        let missing = StringArray::from(vec![Some("a"), None]);
        assert!(FileColumn::try_new(&missing).is_err());
        assert!(FileColumn::accepts(
            &crate::shuffle::position::scan_position::position_file_type()
        ));
    }

    #[test]
    fn a_batch_is_cut_where_the_file_changes_or_rows_go_back() {
        let cut = runs(3, &["a", "a", "b", "b", "b", "a"], &[4, 9, 0, 1, 1, 10]);
        let shape: Vec<_> = cut
            .iter()
            .map(|r| (r.file.to_string(), r.first_row, r.last_row, r.offset, r.len))
            .collect();
        assert_eq!(
            shape,
            [
                ("a".to_string(), 4, 9, 0, 2),
                ("b".to_string(), 0, 1, 2, 2),
                ("b".to_string(), 1, 1, 4, 1),
                ("a".to_string(), 10, 10, 5, 1),
            ]
        );
    }

    #[test]
    fn ranks_follow_file_then_row_whatever_the_arrival() {
        // Batch 0: rows 5..8 of b; batch 1: rows 0..2 of b and 0..3 of a.
        let mut all = runs(0, &["b", "b", "b"], &[5, 6, 7]);
        all.extend(runs(1, &["b", "b", "a", "a", "a"], &[0, 1, 0, 1, 2]));
        let rows = CanonicalRows::try_new(all).unwrap();
        assert_eq!(rows.len(), 8);
        let located: Vec<_> = (0..8).map(|rank| rows.locate(rank)).collect();
        // a0 a1 a2 b0 b1 b5 b6 b7
        assert_eq!(
            located,
            [
                (1, 2),
                (1, 3),
                (1, 4),
                (1, 0),
                (1, 1),
                (0, 0),
                (0, 1),
                (0, 2)
            ]
        );
    }

    #[test]
    fn a_row_that_comes_twice_is_refused_by_file_and_row() {
        let mut all = runs(0, &["f.parquet", "f.parquet"], &[0, 1]);
        all.extend(runs(1, &["f.parquet"], &[1]));
        let err = CanonicalRows::try_new(all).unwrap_err().to_string();
        assert!(err.contains("row 1 of f.parquet reached it twice"), "{err}");
        assert!(err.contains("Use SHUFFLE"), "{err}");
        // Within runs with holes too.
        let mut all = runs(0, &["f", "f"], &[0, 4]);
        all.extend(runs(1, &["f", "f"], &[2, 4]));
        let err = CanonicalRows::try_new(all).unwrap_err().to_string();
        assert!(err.contains("row 4 of f reached it twice"), "{err}");
    }

    /// Work stealing: one partition read ranges 0 and 2 of a file (joined
    /// into one run with a hole by a filter's coalescing), another range 1.
    #[test]
    fn interleaved_runs_of_a_file_are_ranked_row_by_row() {
        // Batch 0: rows 0, 1, 5, 6 (ranges 0 and 2); batch 1: rows 2, 3, 4
        // (range 1); batch 2: rows 7, 9 of the same file, after both.
        let mut all = runs(0, &["a", "a", "a", "a"], &[0, 1, 5, 6]);
        all.extend(runs(1, &["a", "a", "a"], &[2, 3, 4]));
        all.extend(runs(2, &["a", "a"], &[7, 9]));
        let rows = CanonicalRows::try_new(all).unwrap();
        assert_eq!(rows.len(), 9);
        let located: Vec<_> = (0..9).map(|rank| rows.locate(rank)).collect();
        assert_eq!(
            located,
            [
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
                (1, 2),
                (0, 2),
                (0, 3),
                (2, 0),
                (2, 1)
            ]
        );
    }

    #[test]
    fn ranks_cross_blocks_and_many_runs() {
        // 3 runs of 5000 rows: ranks cross the 4096-rank blocks mid-run.
        let mut all = Vec::new();
        for (batch, file) in ["c", "a", "b"].iter().enumerate() {
            let rows: Vec<i64> = (0..5000).collect();
            all.extend(runs(batch, &vec![*file; 5000], &rows));
        }
        let rows = CanonicalRows::try_new(all).unwrap();
        assert_eq!(rows.locate(0), (1, 0));
        assert_eq!(rows.locate(4999), (1, 4999));
        assert_eq!(rows.locate(5000), (2, 0));
        assert_eq!(rows.locate(8191), (2, 3191));
        assert_eq!(rows.locate(14_999), (0, 4999));
    }
}
