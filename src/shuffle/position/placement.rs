//! Where each row of an epoch by position goes, from its file and row index
//! alone: what an epoch spilled by position range ([`super::spilled`]) and a
//! cluster's stage-shaped shuffle by position ([`super::PositionKeyExec`])
//! compute as rows stream past, without holding them.
//!
//! ```text
//!  (file, row index) ──► row group g (the file's row groups by first row)
//!                    ──► rank r = starts[g] + the row's offset in g:
//!                          its row index − g's first row, or under a
//!                          filter the rows of g kept before it
//!                    ──► position p = π⁻¹(r)
//! ```
//!
//! # Under a filter
//! A row's offset in its row group is then the rows of that group kept
//! before it, counted as the rows come: every row of a group must come
//! through one reader, in rising row index. A row that comes out of order
//! is an error, never a rank guessed; so is a group claimed by two readers
//! (the caller says how a group is claimed: the spilled epoch checks its
//! readers against each other; a Parquet scan never cuts a row group
//! between two byte ranges).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::common::{
    exec_datafusion_err, exec_err, internal_datafusion_err, internal_err,
};
use datafusion::error::Result;

use super::canonical::FileColumn;
use super::permutation::IndexPermutation;
use super::ranks::RankedRowGroups;

/// Where each row of an epoch goes: its rank from its file and row index,
/// and its position from its rank.
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    pub(crate) permutation: IndexPermutation,
    /// `starts[g]`: the rank of row group `g`'s first row; one more entry,
    /// the rows in all.
    pub(crate) starts: Vec<u64>,
    /// File path → (first row index, row group in rank order) per row group.
    pub(crate) files: HashMap<String, Vec<(u64, usize)>>,
}

impl Placement {
    /// The rows of `groups`, placed by `permutation`.
    pub(crate) fn of_groups(
        groups: &RankedRowGroups,
        permutation: IndexPermutation,
    ) -> Self {
        Self {
            permutation,
            starts: groups.starts().to_vec(),
            files: groups.files().into_iter().collect(),
        }
    }

    /// `rows` stored rows ([`super::stored`]: one "file", ranked by where
    /// each comes), placed by `permutation`.
    pub(crate) fn stored(rows: u64, permutation: IndexPermutation) -> Self {
        Self {
            permutation,
            starts: vec![0, rows],
            files: HashMap::from([(
                super::stored::STORED_ROWS.to_string(),
                vec![(0, 0)],
            )]),
        }
    }
}

/// Which reader (partition) counts each row group under a filter, shared
/// by the readers of one epoch.
pub(crate) type GroupReaders = std::sync::Mutex<HashMap<usize, usize>>;

/// Claims row group `group` of `path` for reader `partition` in `readers`:
/// under a filter a group's rows must all come through one reader.
pub(crate) fn claim_group(
    readers: &GroupReaders,
    partition: usize,
    group: usize,
    path: &str,
) -> Result<()> {
    let mut readers = readers.lock().map_err(|_| {
        internal_datafusion_err!("SHUFFLE BY POSITION: a reader panicked")
    })?;
    let reader = *readers.entry(group).or_insert(partition);
    if reader != partition {
        return internal_err!(
            "SHUFFLE BY POSITION: row group {group} of {path} came through two \
             partitions: its rows cannot be ranked under a filter"
        );
    }
    Ok(())
}

/// One reader's rows placed as they come; see the module docs.
pub(crate) struct RowPlacer {
    placement: Arc<Placement>,
    /// Rows are ranked within their row group by counting (a filter drops
    /// rows), not by their row index.
    counted: bool,
    /// Under a filter: rows of each row group kept so far, and the last row
    /// index seen.
    kept: HashMap<usize, (u64, i64)>,
    /// The row group the last row counted came from (claimed).
    last_group: Option<usize>,
}

impl RowPlacer {
    pub(crate) fn new(placement: Arc<Placement>, counted: bool) -> Self {
        Self {
            placement,
            counted,
            kept: HashMap::new(),
            last_group: None,
        }
    }

    /// The positions of a batch's rows from its `files` and `row_indexes`
    /// columns (the two position columns). Under a filter `claim(group,
    /// path)` is called whenever a row comes from another row group than the
    /// row before it.
    pub(crate) fn positions(
        &mut self,
        files: &dyn Array,
        row_indexes: &dyn Array,
        mut claim: impl FnMut(usize, &str) -> Result<()>,
    ) -> Result<Vec<u64>> {
        let files = FileColumn::try_new(files)?;
        let row_indexes = row_indexes
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| internal_datafusion_err!("the row column is not Int64"))?;
        let mut positions = Vec::with_capacity(row_indexes.len());
        let placement = Arc::clone(&self.placement);
        let mut groups: Option<(&str, &Vec<(u64, usize)>)> = None;
        for row in 0..row_indexes.len() {
            let path = files.path(row);
            let file_groups = match groups {
                Some((p, g)) if p == path => g,
                _ => {
                    let g = placement.files.get(path).ok_or_else(|| {
                        exec_datafusion_err!(
                            "SHUFFLE BY POSITION read a row of {path}, which was not \
                             listed when the epoch was planned: plan it again"
                        )
                    })?;
                    groups = Some((path, g));
                    g
                }
            };
            let row_index = row_indexes.value(row);
            let index = u64::try_from(row_index).map_err(|_| {
                internal_datafusion_err!("row index {row_index} of {path}")
            })?;
            let place = file_groups.partition_point(|&(first, _)| first <= index);
            let Some(&(first_row, group)) =
                place.checked_sub(1).and_then(|p| file_groups.get(p))
            else {
                return internal_err!("row {index} of {path} before its first row group");
            };
            let offset = if self.counted {
                if self.last_group != Some(group) {
                    claim(group, path)?;
                    self.last_group = Some(group);
                }
                let (count, last) = self.kept.entry(group).or_insert((0, -1));
                if row_index <= *last {
                    return internal_err!(
                        "SHUFFLE BY POSITION: rows of row group {group} of {path} came \
                         out of order (row {row_index} after {last}): they cannot be \
                         ranked under a filter"
                    );
                }
                *last = row_index;
                *count += 1;
                *count - 1
            } else {
                index - first_row
            };
            let rank = placement.starts[group] + offset;
            if rank >= placement.starts[group + 1] {
                return exec_err!(
                    "SHUFFLE BY POSITION: row {index} of {path} has rank {rank}, past its \
                     row group's rows: the file changed while the epoch was read; read \
                     the epoch again"
                );
            }
            positions.push(placement.permutation.position_of(rank));
        }
        Ok(positions)
    }
}
