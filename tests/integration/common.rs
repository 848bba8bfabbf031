//! Shared helpers: generated data, the binary, small Parquet writers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result;
use datafusion::parquet::arrow::ArrowWriter;
use sqlfeed::datagen::{GenOptions, generate};

/// Generates `rows` rows in `files` files under `dir` (seed 42).
pub fn gen_data(dir: &Path, rows: u64, files: usize) -> Result<Vec<PathBuf>> {
    let mut options = GenOptions::new(rows, dir);
    options.files = files;
    options.image_size = 8;
    Ok(generate(&options)?.files)
}

/// A temporary folder of `rows` generated rows in `files` files.
pub fn generated(rows: u64, files: usize) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    gen_data(dir.path(), rows, files)?;
    Ok(dir)
}

/// Writes `batch` as one Parquet file.
pub fn write_parquet(path: &Path, batch: &RecordBatch) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let file = std::fs::File::create(path)?;
    let mut writer = ArrowWriter::try_new(file, batch.schema(), None)?;
    writer.write(batch)?;
    writer.close()?;
    Ok(())
}

/// The first column of `batches`, an `Int64` column, as one vector.
pub fn first_int64s(batches: &[RecordBatch]) -> Vec<i64> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;
    batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

/// A one-column batch.
pub fn one_column(name: &str, array: datafusion::arrow::array::ArrayRef) -> RecordBatch {
    RecordBatch::try_from_iter(vec![(name, array)]).expect("one column is a valid batch")
}

/// The `sqlfeed` binary with a private history file and no colour.
pub fn sqlfeed() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sqlfeed"));
    command
        .env(
            "SQLFEED_HISTORY",
            std::env::temp_dir().join("sqlfeed-test-history"),
        )
        .env("RUST_LOG", "warn")
        .env_remove("AWS_ENDPOINT_URL");
    command
}

/// Runs the binary with `args`; returns (success, stdout, stderr).
pub fn run(command: &mut Command) -> (bool, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().expect("sqlfeed runs");
    (
        status.success(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// `sqlfeed feed SQL --device cpu --digest`: a feed that prints a digest
/// line a batch; add the rest of the options to it.
pub fn digest_feed(sql: &str) -> Command {
    let mut command = sqlfeed();
    command.args(["feed", sql, "--device", "cpu", "--digest"]);
    command
}

/// The value after `key` (`epoch=`, `digest=`, `resume_rows=`) in one of
/// a feed's `batch …` lines.
pub fn batch_field(line: &str, key: &str) -> String {
    line.split(' ')
        .find_map(|f| f.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .to_string()
}

/// Asserts that `text` (an error, a plan, a command's output) says each of
/// `needles`, naming the first it misses.
#[track_caller]
pub fn assert_contains(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} missing from: {text}");
    }
}

/// The output of a run of the binary ([`run`]: success, stdout, stderr)
/// that must have succeeded; a failure panics with its stderr.
#[track_caller]
pub fn succeeded<T>((ok, out, err): (bool, T, String)) -> T {
    assert!(ok, "{err}");
    out
}

/// The `batch epoch=… digest=…` lines of a `feed --digest` run's output.
pub fn digest_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("batch "))
        .map(str::to_string)
        .collect()
}

/// Runs `sqlfeed -c sql --format csv` and returns stdout, panicking with
/// stderr on failure.
pub fn csv(sql: &str) -> String {
    csv_with(&[], sql)
}

/// [`csv`] with extra options before `-c`.
pub fn csv_with(options: &[&str], sql: &str) -> String {
    let (ok, out, err) =
        run(sqlfeed().args(options).args(["--format", "csv", "-c", sql]));
    assert!(ok, "sqlfeed {options:?} -c {sql:?} failed: {err}");
    out
}

/// A session small enough for tests.
pub fn session() -> Result<sqlfeed::Session> {
    sqlfeed::Session::builder()
        .memory_limit(256 << 20)
        .target_partitions(2)
        .build()
}

/// A session of one partition under a memory limit of `bytes`.
pub fn budget_session(bytes: usize) -> Result<sqlfeed::Session> {
    sqlfeed::Session::builder()
        .memory_limit(bytes)
        .target_partitions(1)
        .build()
}

/// Pearson's chi-square of `observed` counts against their `expected` ones.
pub fn chi_square(observed: impl IntoIterator<Item = (u32, f64)>) -> f64 {
    (observed.into_iter())
        .map(|(o, expected)| (o as f64 - expected).powi(2) / expected)
        .sum()
}

/// A session of `partitions` partitions and record batches of
/// `batch_size` rows, under a 256 MiB memory limit.
pub fn sized_session(partitions: usize, batch_size: usize) -> Result<sqlfeed::Session> {
    sqlfeed::Session::builder()
        .target_partitions(partitions)
        .batch_size(batch_size)
        .memory_limit(256 << 20)
        .build()
}

/// Collects `sql` on `session` into batches.
pub async fn collect(session: &sqlfeed::Session, sql: &str) -> Result<Vec<RecordBatch>> {
    session.collect(session.sql(sql).await?).await
}

/// The error of a statement that must fail to plan on `session`.
// Only the Delta Lake tests use it so far.
#[cfg_attr(not(feature = "delta"), allow(dead_code))]
pub async fn sql_error(session: &sqlfeed::Session, sql: &str) -> String {
    match session.sql(sql).await {
        Ok(_) => panic!("{sql} was planned"),
        Err(e) => e.to_string(),
    }
}

/// Rows of `batches` formatted as strings per cell (for order-sensitive checks).
pub fn rows(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let options = FormatOptions::default().with_null("NULL");
    let mut out = Vec::new();
    for batch in batches {
        let formatters: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).expect("formattable"))
            .collect();
        for row in 0..batch.num_rows() {
            out.push(
                formatters
                    .iter()
                    .map(|f| f.value(row).to_string())
                    .collect(),
            );
        }
    }
    out
}

/// `Arc` helper for arrays.
pub fn arc<A: datafusion::arrow::array::Array + 'static>(
    a: A,
) -> datafusion::arrow::array::ArrayRef {
    Arc::new(a)
}

#[path = "../support/files.rs"]
mod files;
pub use files::files_below;

/// `files` files of `rows` ids each (file f holds f·rows …), in row groups
/// of `group` rows; a second column `v = id % 7`; the table's SQL name.
/// File names sort in id order.
pub fn write_ids(dir: &Path, files: i64, rows: i64, group: usize) -> Result<String> {
    for file in 0..files {
        let ids = datafusion::arrow::array::Int64Array::from_iter_values(
            file * rows..(file + 1) * rows,
        );
        let v = datafusion::arrow::array::Int64Array::from_iter_values(
            (file * rows..(file + 1) * rows).map(|i| i % 7),
        );
        let batch = RecordBatch::try_from_iter(vec![("id", arc(ids)), ("v", arc(v))])?;
        let properties =
            datafusion::parquet::file::properties::WriterProperties::builder()
                .set_max_row_group_row_count(Some(group))
                .build();
        let path = dir.join(format!("part-{file:02}.parquet"));
        let mut writer = ArrowWriter::try_new(
            std::fs::File::create(path)?,
            batch.schema(),
            Some(properties),
        )?;
        writer.write(&batch)?;
        writer.close()?;
    }
    Ok(format!("'{}/*.parquet'", dir.display()))
}

/// The CLI's `--rows` against map-style access: `sqlfeed feed "SELECT id, v
/// FROM {table}" --shuffle-seed 11 {order…} --device cpu --rows 1:1998:5`
/// prints rows 1998 and 1999 of `epoch` (epoch 1 of the same feed over
/// [`write_ids`]'s 2000 ids: the last two, so 2 rows of the 5 asked for).
/// Returns their ids.
pub fn assert_rows_printed(
    table: &str,
    order: &[&str],
    epoch: &sqlfeed::feed::EpochDataset,
) -> Result<[i64; 2]> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;
    let printed = sqlfeed()
        .args(["feed", &format!("SELECT id, v FROM {table}")])
        .args(["--shuffle-seed", "11"])
        .args(order)
        .args(["--device", "cpu", "--rows", "1:1998:5"])
        .output()?;
    let out = String::from_utf8_lossy(&printed.stdout);
    assert!(
        printed.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let last = epoch.rows(&[1998, 1999])?;
    let ids = last.column(0).as_primitive::<Int64Type>();
    let ids = [ids.value(0), ids.value(1)];
    assert_contains(
        &out,
        &[
            &format!("| {} ", ids[0]),
            &format!("| {} ", ids[1]),
            "2 rows",
        ],
    );
    Ok(ids)
}
