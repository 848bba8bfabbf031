//! The units and windows of `SHUFFLE WINDOW n` (see [`super::WindowedShuffleExec`]):
//! which Parquet row groups each window of an epoch holds, from the
//! footers alone, and the scan of one window.
//!
//! ```text
//!  footers ──► units: (file rank, row group), row counts, page offsets
//!          ──► keyed by xxh3(file rank, row group; mix(seed, epoch))
//!          ──► in key order, cut into windows of at least n rows
//!  window k ──► DataSourceExec of its row groups, one file range each
//! ```
//!
//! # Why whole row groups, selected by byte ranges
//! A window's scan must be expressible in a plan a cluster's scheduler
//! sends to its executors: DataFusion's physical codec carries file byte
//! ranges but not access plans, and Ballista cuts a stage's file groups per
//! task. A byte range holding a row group's first page offset selects that
//! row group and no other (DataFusion's rule), so a window is a list of
//! one-byte ranges, the same on one machine and on a cluster: the embedded
//! and the cluster orders are one. The cost: a unit is a whole row group,
//! so files with row groups larger than the window give windows of one
//! row group each (write files with row groups well under `n` rows).

use std::sync::Arc;

use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    CachedParquetFileReaderFactory, ParquetAccessPlan, ParquetFileReaderFactory,
    RowGroupAccess,
};
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfig, FileScanConfigBuilder,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector,
};
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::parquet::file::metadata::PageIndexPolicy;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::shuffle_seed;

/// Marks the files of a window's scan, so that rules re-cutting scans
/// (`crate::cluster::BalanceScanRows`) leave it as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowUnitFile;

/// One unit of the order: a row group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unit {
    /// The file's rank in path order.
    pub(crate) file: usize,
    pub(crate) row_group: usize,
    pub(crate) rows: u64,
}

/// A scan's files in path order and their row groups, from the footers.
#[derive(Debug, Clone)]
pub(crate) struct ScanLayout {
    /// The files, whole (no range), in path order.
    files: Vec<PartitionedFile>,
    /// Per file, per row group: (rows, the first page's byte offset).
    row_groups: Vec<Vec<(u64, i64)>>,
}

impl ScanLayout {
    /// The layout of the Parquet scan `config`, reading each footer through
    /// the runtime's metadata cache (which planning filled).
    pub(crate) async fn read(
        config: &FileScanConfig,
        runtime: &RuntimeEnv,
    ) -> Result<Self> {
        let mut files: Vec<PartitionedFile> = Vec::new();
        for file in config.file_groups.iter().flat_map(|g| g.iter()) {
            if files
                .iter()
                .all(|f| f.object_meta.location != file.object_meta.location)
            {
                let mut whole = file.clone();
                whole.range = None;
                whole.statistics = None;
                files.push(whole);
            }
        }
        files.sort_by(|a, b| a.object_meta.location.cmp(&b.object_meta.location));
        let store = runtime.object_store(&config.object_store_url)?;
        let factory = CachedParquetFileReaderFactory::new(
            store,
            runtime.cache_manager.get_file_metadata_cache(),
        );
        let mut row_groups = Vec::with_capacity(files.len());
        for file in &files {
            let mut reader: Box<dyn AsyncFileReader> = factory.create_reader(
                0,
                file.clone(),
                None,
                &ExecutionPlanMetricsSet::new(),
            )?;
            // With the page index where the file has one: it stays in the
            // metadata cache, where a read of a few rows by position
            // (`RankedRowGroups::read_rows`) finds the pages holding them.
            let options = ArrowReaderOptions::new()
                .with_page_index_policy(PageIndexPolicy::Optional);
            let metadata = ArrowReaderMetadata::load_async(&mut reader, options)
                    .await
                    .map_err(|e| {
                        DataFusionError::Execution(format!(
                            "cannot read the footer of {}, which places its rows in row \
                             groups (for SHUFFLE WINDOW, or rows of an epoch by position): \
                             {e}; check the file, or shuffle with SHUFFLE",
                            file.object_meta.location
                        ))
                    })?;
            let groups = metadata
                .metadata()
                .row_groups()
                .iter()
                .map(|group| {
                    let rows = u64::try_from(group.num_rows()).unwrap_or(0);
                    // DataFusion selects a row group by its first column's
                    // first page (dictionary, else data).
                    let offset = group.columns().first().map_or(0, |column| {
                        column
                            .dictionary_page_offset()
                            .unwrap_or_else(|| column.data_page_offset())
                    });
                    (rows, offset)
                })
                .collect();
            row_groups.push(groups);
        }
        Ok(Self { files, row_groups })
    }

    /// Every row group, in file path order and, within a file, in row
    /// order: the order of a position shuffle's ranks.
    pub(crate) fn units(&self) -> Vec<Unit> {
        self.row_groups
            .iter()
            .enumerate()
            .flat_map(|(file, groups)| {
                groups
                    .iter()
                    .enumerate()
                    .map(move |(row_group, &(rows, _))| Unit {
                        file,
                        row_group,
                        rows,
                    })
            })
            .collect()
    }

    /// What the listing said of file `file` (its rank in path order): its
    /// location, size and last change.
    pub(crate) fn file_meta(&self, file: usize) -> Option<&object_store::ObjectMeta> {
        self.files.get(file).map(|f| &f.object_meta)
    }

    /// The location of file `file` (its rank in path order), as the object
    /// store names it.
    pub(crate) fn location(&self, file: usize) -> String {
        self.files
            .get(file)
            .map_or_else(String::new, |f| f.object_meta.location.to_string())
    }

    /// The epoch's windows (see [`plan_windows`]).
    pub(crate) fn windows(
        &self,
        seed: u64,
        epoch: u64,
        window_rows: u64,
    ) -> Vec<Vec<Unit>> {
        let rows: Vec<Vec<u64>> = self
            .row_groups
            .iter()
            .map(|groups| groups.iter().map(|&(rows, _)| rows).collect())
            .collect();
        plan_windows(&rows, seed, epoch, window_rows)
    }

    /// The rows every row group's first row (within its file) is a multiple
    /// of, so that counts per bucket of this many rows add up to counts per
    /// row group: the greatest common divisor of the row groups' starts
    /// (each file's largest row count when no file has two row groups).
    pub(crate) fn grain(&self) -> u64 {
        let mut grain = 0;
        for groups in &self.row_groups {
            let mut start = 0;
            for &(rows, _) in groups.iter().take(groups.len().saturating_sub(1)) {
                start += rows;
                grain = gcd(grain, start);
            }
        }
        if grain == 0 {
            let rows = self
                .row_groups
                .iter()
                .map(|g| g.iter().map(|&(r, _)| r).sum());
            grain = rows.max().unwrap_or(1);
        }
        grain.max(1)
    }

    /// The rows each of `windows` holds, from rows counted per file (by its
    /// location) and bucket of [`Self::grain`] rows: `counted[(file, b)]`
    /// rows of file `file` in rows `b·grain ..` passed the query's filters.
    pub(crate) fn counted_windows(
        &self,
        windows: &[Vec<Unit>],
        counted: &std::collections::HashMap<(String, u64), u64>,
    ) -> Vec<u64> {
        let grain = self.grain();
        windows
            .iter()
            .map(|units| {
                units
                    .iter()
                    .map(|unit| {
                        let groups = &self.row_groups[unit.file];
                        let start: u64 =
                            groups[..unit.row_group].iter().map(|&(r, _)| r).sum();
                        let location =
                            self.files[unit.file].object_meta.location.to_string();
                        (start / grain..(start + unit.rows).div_ceil(grain))
                            .map(|bucket| {
                                counted
                                    .get(&(location.clone(), bucket))
                                    .copied()
                                    .unwrap_or(0)
                            })
                            .sum::<u64>()
                    })
                    .sum()
            })
            .collect()
    }

    /// `config`'s scan cut to `units`: one file range per row group, spread
    /// over the scan's partitions (to the least-loaded one by rows, the
    /// first of equals). A window's order is by key, so how its units are
    /// spread does not change it.
    pub(crate) fn scan(
        &self,
        config: &FileScanConfig,
        units: &[Unit],
    ) -> Arc<dyn ExecutionPlan> {
        let partitions = config.file_groups.len().max(1);
        let mut loads = vec![(0u64, Vec::<PartitionedFile>::new()); partitions];
        for unit in units {
            let (_, offset) = self.row_groups[unit.file][unit.row_group];
            let file = self.files[unit.file]
                .clone()
                .with_range(offset, offset + 1)
                .with_extension(WindowUnitFile);
            if let Some(least) = loads.iter_mut().min_by_key(|(rows, _)| *rows) {
                least.0 += unit.rows;
                least.1.push(file);
            }
        }
        let groups = loads
            .into_iter()
            .map(|(_, files)| FileGroup::new(files))
            .collect();
        DataSourceExec::from_data_source(
            FileScanConfigBuilder::from(config.clone())
                .with_file_groups(groups)
                .build(),
        )
    }
}

impl ScanLayout {
    /// The row index in its file of `unit`'s first row.
    pub(crate) fn first_row(&self, unit: Unit) -> u64 {
        self.row_groups[unit.file][..unit.row_group]
            .iter()
            .map(|&(rows, _)| rows)
            .sum()
    }

    /// `config`'s scan cut to rows `offsets` (rising, each below the unit's
    /// rows) of row group `unit`: its file whole, with an access plan that
    /// skips every other row group and selects those rows of this one, so
    /// that pages holding none of them are not read (given the file's page
    /// index). One machine only: access plans do not travel to executors.
    pub(crate) fn rows_scan(
        &self,
        config: &FileScanConfig,
        unit: Unit,
        offsets: &[u64],
    ) -> Arc<dyn ExecutionPlan> {
        let mut selectors = Vec::with_capacity(2 * offsets.len() + 1);
        let mut at = 0u64;
        for &offset in offsets {
            if offset > at {
                selectors.push(RowSelector::skip((offset - at) as usize));
            }
            selectors.push(RowSelector::select(1));
            at = offset + 1;
        }
        if unit.rows > at {
            selectors.push(RowSelector::skip((unit.rows - at) as usize));
        }
        let mut access = ParquetAccessPlan::new_none(self.row_groups[unit.file].len());
        access.set(
            unit.row_group,
            RowGroupAccess::Selection(RowSelection::from(selectors)),
        );
        let file = self.files[unit.file].clone().with_extension(access);
        DataSourceExec::from_data_source(
            FileScanConfigBuilder::from(config.clone())
                .with_file_groups(vec![FileGroup::new(vec![file])])
                .build(),
        )
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Whether `config` is a window's scan (its files are marked).
pub fn is_window_scan(config: &FileScanConfig) -> bool {
    config
        .file_groups
        .iter()
        .flat_map(|g| g.iter())
        .any(|file| file.extension::<WindowUnitFile>().is_some())
}

/// The epoch's windows: row groups keyed by `(file rank, row group)` under
/// `(seed, epoch)`, in key order, cut into windows of at least
/// `window_rows` rows (the last may hold fewer). `row_groups[f]` are file
/// `f`'s row groups' row counts. Pure; see the module docs.
pub(crate) fn plan_windows(
    row_groups: &[Vec<u64>],
    seed: u64,
    epoch: u64,
    window_rows: u64,
) -> Vec<Vec<Unit>> {
    let hash_seed = shuffle_seed(seed, epoch);
    let mut keyed: Vec<(u64, Unit)> = Vec::new();
    for (file, groups) in row_groups.iter().enumerate() {
        for (row_group, &rows) in groups.iter().enumerate() {
            if rows == 0 {
                continue;
            }
            let mut identity = [0u8; 16];
            identity[..8].copy_from_slice(&(file as u64).to_le_bytes());
            identity[8..].copy_from_slice(&(row_group as u64).to_le_bytes());
            let unit = Unit {
                file,
                row_group,
                rows,
            };
            keyed.push((xxh3_64_with_seed(&identity, hash_seed), unit));
        }
    }
    // Units are distinct, so ties (a 2^-64 chance) fall back to identity.
    keyed.sort_unstable_by_key(|&(key, u)| (key, u.file, u.row_group));
    let mut windows = Vec::new();
    let mut window = Vec::new();
    let mut rows = 0;
    for (_, unit) in keyed {
        rows += unit.rows;
        window.push(unit);
        if rows >= window_rows {
            windows.push(std::mem::take(&mut window));
            rows = 0;
        }
    }
    if !window.is_empty() {
        windows.push(window);
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows_of(windows: &[Vec<Unit>]) -> Vec<u64> {
        windows
            .iter()
            .map(|w| w.iter().map(|u| u.rows).sum())
            .collect()
    }

    #[test]
    fn windows_hold_every_row_group_once_and_at_least_n_rows() {
        let files = vec![vec![100, 100, 37], vec![0, 500], vec![99; 7]];
        let windows = plan_windows(&files, 7, 0, 300);
        let total: u64 = files.iter().flatten().sum();
        let rows = rows_of(&windows);
        assert_eq!(rows.iter().sum::<u64>(), total);
        // Every window but the last holds at least n rows, and less than n
        // plus its last row group.
        for (window, &r) in windows.iter().zip(&rows).take(rows.len() - 1) {
            let last = window.last().map_or(0, |u| u.rows);
            assert!(r >= 300 && r - last < 300, "{rows:?}");
        }
        let mut seen: Vec<(usize, usize)> = windows
            .iter()
            .flatten()
            .map(|u| (u.file, u.row_group))
            .collect();
        seen.sort_unstable();
        let mut expected: Vec<(usize, usize)> = files
            .iter()
            .enumerate()
            .flat_map(|(f, groups)| {
                groups
                    .iter()
                    .enumerate()
                    .filter(|&(_, &n)| n > 0)
                    .map(move |(g, _)| (f, g))
            })
            .collect();
        expected.sort_unstable();
        assert_eq!(seen, expected);
    }

    #[test]
    fn the_windows_are_a_function_of_seed_and_epoch() {
        let files = vec![vec![400; 20]; 3];
        let a = plan_windows(&files, 1, 0, 1000);
        assert_eq!(a, plan_windows(&files, 1, 0, 1000));
        assert_ne!(a, plan_windows(&files, 1, 1, 1000));
        assert_ne!(a, plan_windows(&files, 2, 0, 1000));
        // A window draws from all over the data, not from neighbours.
        let files_in_windows = a
            .iter()
            .filter(|w| w.iter().any(|u| u.file != w[0].file))
            .count();
        assert!(files_in_windows > a.len() / 2, "{a:?}");
    }

    #[test]
    fn rows_counted_per_bucket_add_up_to_each_window_after_a_filter() {
        let layout = ScanLayout {
            files: vec![
                PartitionedFile::new("data/a.parquet", 1),
                PartitionedFile::new("data/b.parquet", 1),
            ],
            row_groups: vec![
                vec![(100, 4), (100, 9), (100, 14), (33, 19)],
                vec![(50, 4), (50, 9)],
            ],
        };
        // Row groups start at 100, 200, 300 and 50: buckets of 50 rows.
        assert_eq!(layout.grain(), 50);
        let windows = layout.windows(3, 1, 120);
        // Half the rows of every bucket pass; a file's last bucket is short.
        let mut counted = std::collections::HashMap::new();
        for bucket in 0..7 {
            let rows = if bucket == 6 { 16 } else { 25 };
            counted.insert(("data/a.parquet".to_string(), bucket), rows);
        }
        counted.insert(("data/b.parquet".to_string(), 1), 7);
        let expected: Vec<u64> = windows
            .iter()
            .map(|units| {
                units
                    .iter()
                    .map(|u| match (u.file, u.row_group) {
                        (0, 3) => 16,
                        (0, _) => 50,
                        (1, 0) => 0,
                        _ => 7,
                    })
                    .sum()
            })
            .collect();
        assert_eq!(layout.counted_windows(&windows, &counted), expected);
        assert_eq!(expected.iter().sum::<u64>(), 150 + 16 + 7);
        // One row group per file: a file is one bucket.
        let whole = ScanLayout {
            files: layout.files.clone(),
            row_groups: vec![vec![(70, 4)], vec![(30, 4)]],
        };
        assert_eq!(whole.grain(), 70);
    }
}
