//! Scenario 1: a lazy streaming read. The schema and the first row of a
//! Parquet dataset, local or `s3://`, without reading the dataset: only the
//! footers and one row group's pages are fetched.
//!
//! ```sh
//! cargo run --release --example lazy_read -- [--data 's3://bucket/train/*.parquet']
//! ```

// Examples report on stdout.
#![allow(clippy::print_stdout)]

mod common;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::Result;
use sqlfeed::Session;

#[tokio::main]
async fn main() -> Result<()> {
    let args = common::Args::from_env();
    let data = args.data()?;
    let session = Session::try_new()?;

    let schema = query(&session, &format!("DESCRIBE '{data}'")).await?;
    println!("{}", pretty_format_batches(&schema)?);
    let read_for_schema = session.io_counters().bytes_read();

    let first = query(&session, &format!("SELECT * FROM '{data}' LIMIT 1")).await?;
    let shown = first.iter().map(|b| b.num_rows()).sum::<usize>();
    println!(
        "first row: {shown} row(s), {} columns",
        first[0].num_columns()
    );
    let read = session.io_counters().bytes_read();

    // The whole dataset's size, from the listing (no data read).
    let size = query(&session, &format!("SELECT count(*) AS rows FROM '{data}'")).await?;
    println!("{}", pretty_format_batches(&size)?);
    let total: u64 = local_bytes(&data);
    println!(
        "bytes read: {read_for_schema} for the schema, {read} after the first row \
         ({:.2}% of {total} bytes on disk)",
        100.0 * read as f64 / total.max(1) as f64
    );
    Ok(())
}

/// Plans `sql` and collects its batches.
async fn query(session: &Session, sql: &str) -> Result<Vec<RecordBatch>> {
    session.collect(session.sql(sql).await?).await
}

/// Size of the local files matching `pattern` (0 for URLs).
fn local_bytes(pattern: &str) -> u64 {
    glob::glob(pattern)
        .map(|paths| {
            paths
                .flatten()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
