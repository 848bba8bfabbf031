//! What one batch of uniformly random rows costs to read from Parquet,
//! against one scan of the same columns: the floor under the first batch of
//! an exact shuffle that would not wait for the whole epoch (issue 55,
//! docs/scaling.md item 9).
//!
//! An exact uniform order may put any row first, so a batch of `B` rows is
//! `B` rows from all over the data. Parquet reads a page at a time (the
//! offset index says where each page starts and which rows it holds), so a
//! batch costs the pages its rows fall in, in every column it reads. For
//! every file of a folder this reads the footers with their page indexes,
//! draws `B` rows at random (seeded, 5 draws), and reports:
//!
//! - `pages_%` and `bytes_%`: the share of the columns' pages and of their
//!   compressed bytes (dictionary pages included) the batch falls in,
//!   counted from the offset index, which does not depend on the machine;
//! - `batch_ms`: reading those rows (row selection, page index on, so the
//!   reader skips the other pages), and `scan_ms`: reading every row of the
//!   same columns; both from the page cache, after a first scan, median of
//!   the draws.
//!
//! ```sh
//! cargo bench --bench random_rows -- DIR COLUMNS B...
//! cargo bench --bench random_rows -- target/bench-epochs/unique-20000000 f0,f1,f2,f3,f4,f5,f6,f7,label 256 4096
//! ```

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
    RowSelection,
};
use datafusion::parquet::file::metadata::PageIndexPolicy;

type Error = Box<dyn std::error::Error>;

/// One file's footers, with the leaf columns a batch reads.
struct Footer {
    path: PathBuf,
    metadata: ArrowReaderMetadata,
    rows: u64,
    /// The leaf columns of the asked-for columns.
    leaves: Vec<usize>,
    /// The asked-for root columns, for the reader's projection.
    roots: Vec<usize>,
}

fn footers(dir: &Path, columns: &[&str]) -> Result<Vec<Footer>, Error> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.retain(|p| p.extension().is_some_and(|e| e == "parquet"));
    paths.sort();
    if paths.is_empty() {
        return Err(format!("no .parquet files in {}", dir.display()).into());
    }
    let mut footers = vec![];
    for path in paths {
        let file = File::open(&path)?;
        let options =
            ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Required);
        let metadata = ArrowReaderMetadata::load(&file, options)?;
        let parquet = metadata.metadata();
        if parquet.offset_index().is_none() {
            return Err(format!("{} has no offset index", path.display()).into());
        }
        let schema = parquet.file_metadata().schema_descr();
        let mut leaves = vec![];
        let mut roots = vec![];
        for column in columns {
            let root = (0..schema.root_schema().get_fields().len())
                .find(|&i| schema.root_schema().get_fields()[i].name() == *column)
                .ok_or_else(|| format!("no column {column} in {}", path.display()))?;
            roots.push(root);
            leaves.extend(
                (0..schema.num_columns())
                    .filter(|&l| schema.get_column_root_idx(l) == root),
            );
        }
        let rows = parquet.file_metadata().num_rows() as u64;
        footers.push(Footer {
            path,
            metadata,
            rows,
            leaves,
            roots,
        });
    }
    Ok(footers)
}

/// SplitMix64: the draws are the same on every run.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `b` distinct rows of `total`, sorted, per file (file index, rows in it).
fn draw(footers: &[Footer], b: usize, seed: u64) -> Vec<Vec<u64>> {
    let total: u64 = footers.iter().map(|f| f.rows).sum();
    let mut state = seed;
    let mut picked = std::collections::BTreeSet::new();
    while picked.len() < b.min(total as usize) {
        picked.insert(next(&mut state) % total);
    }
    let mut per_file = vec![vec![]; footers.len()];
    let (mut file, mut start) = (0, 0);
    for row in picked {
        while row >= start + footers[file].rows {
            start += footers[file].rows;
            file += 1;
        }
        per_file[file].push(row - start);
    }
    per_file
}

/// (pages, compressed bytes) of the columns in all files, and of the pages
/// the rows `picked` fall in (with each touched chunk's dictionary page).
fn pages(footers: &[Footer], picked: &[Vec<u64>]) -> ((u64, u64), (u64, u64)) {
    let (mut all, mut hit) = ((0, 0), (0, 0));
    for (footer, rows) in footers.iter().zip(picked) {
        let parquet = footer.metadata.metadata();
        let Some(index) = parquet.offset_index() else {
            continue;
        };
        let mut group_start = 0u64;
        for (g, group) in parquet.row_groups().iter().enumerate() {
            let group_rows = group.num_rows() as u64;
            let in_group: Vec<u64> = rows
                .iter()
                .filter(|&&r| r >= group_start && r < group_start + group_rows)
                .map(|r| r - group_start)
                .collect();
            for &leaf in &footer.leaves {
                let chunk = group.column(leaf);
                let locations = index[g][leaf].page_locations();
                let dictionary = chunk.dictionary_page_offset().map_or(0, |offset| {
                    locations.first().map_or(0, |p| (p.offset - offset) as u64)
                });
                all.0 += locations.len() as u64;
                all.1 += chunk.compressed_size() as u64;
                let mut touched: Vec<usize> = in_group
                    .iter()
                    .map(|&r| {
                        locations.partition_point(|p| p.first_row_index as u64 <= r) - 1
                    })
                    .collect();
                touched.dedup();
                if !touched.is_empty() {
                    hit.1 += dictionary;
                }
                hit.0 += touched.len() as u64;
                hit.1 += touched
                    .iter()
                    .map(|&p| locations[p].compressed_page_size as u64)
                    .sum::<u64>();
            }
            group_start += group_rows;
        }
    }
    (all, hit)
}

/// Reads rows `rows` (sorted; `None`: all) of `footer`'s columns; the rows read.
fn read(footer: &Footer, rows: Option<&[u64]>) -> Result<usize, Error> {
    let file = File::open(&footer.path)?;
    let parquet = footer.metadata.metadata();
    let mask = ProjectionMask::roots(
        parquet.file_metadata().schema_descr(),
        footer.roots.clone(),
    );
    let mut builder =
        ParquetRecordBatchReaderBuilder::new_with_metadata(file, footer.metadata.clone())
            .with_projection(mask)
            .with_batch_size(8192);
    if let Some(rows) = rows {
        let ranges: Vec<Range<usize>> =
            rows.iter().map(|&r| r as usize..r as usize + 1).collect();
        builder = builder.with_row_selection(RowSelection::from_consecutive_ranges(
            ranges.into_iter(),
            footer.rows as usize,
        ));
    }
    let mut read = 0;
    for batch in builder.build()? {
        read += batch?.num_rows();
    }
    Ok(read)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> Result<(), Error> {
    // `cargo bench` passes `--bench` first.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let [dir, columns, batches @ ..] = args.as_slice() else {
        return Err("usage: random_rows DIR COLUMN[,COLUMN...] B...".into());
    };
    let columns: Vec<&str> = columns.split(',').collect();
    let footers = footers(Path::new(dir), &columns)?;
    let total: u64 = footers.iter().map(|f| f.rows).sum();
    // A first scan puts the files in the page cache; then the scan's time.
    let mut scans = vec![];
    for _ in 0..3 {
        let started = Instant::now();
        let mut rows = 0;
        for footer in &footers {
            rows += read(footer, None)?;
        }
        assert_eq!(rows as u64, total, "a scan read every row");
        scans.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let scan_ms = median(scans[1..].to_vec());
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<10} {:>6} {:>8} {:>8} {:>10} {:>9}",
        "rows", "B", "pages_%", "bytes_%", "batch_ms", "scan_ms"
    )?;
    for b in batches {
        let b: usize = b.parse()?;
        let (mut shares, mut times) = ((0.0, 0.0), vec![]);
        const DRAWS: u64 = 5;
        for seed in 0..DRAWS {
            let picked = draw(&footers, b, seed);
            let (all, hit) = pages(&footers, &picked);
            shares.0 += hit.0 as f64 / all.0 as f64 / DRAWS as f64;
            shares.1 += hit.1 as f64 / all.1 as f64 / DRAWS as f64;
            let started = Instant::now();
            let mut rows = 0;
            for (footer, rows_in) in footers.iter().zip(&picked) {
                if !rows_in.is_empty() {
                    rows += read(footer, Some(rows_in))?;
                }
            }
            assert_eq!(rows, b.min(total as usize), "a batch read its rows");
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        writeln!(
            out,
            "{:<10} {:>6} {:>8.1} {:>8.1} {:>10.1} {:>9.1}",
            total,
            b,
            100.0 * shares.0,
            100.0 * shares.1,
            median(times),
            scan_ms
        )?;
    }
    Ok(())
}
