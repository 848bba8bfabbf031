//! Scenario 4: a global shuffle with a seed under a memory limit smaller
//! than the data. `SHUFFLE SEED s` orders rows by a hash of (seed, epoch,
//! row), so the order is reproducible; beyond the limit the shuffle spills
//! sorted runs to disk and merges them.
//!
//! ```sh
//! cargo run --release --example global_shuffle -- [--data …] [--memory-limit 16M]
//! ```

// Examples report on stdout.
#![allow(clippy::print_stdout)]

mod common;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::session::parse_memory_size;

#[tokio::main]
async fn main() -> Result<()> {
    let args = common::Args::from_env();
    let data = args.data()?;
    let limit = args.flag("--memory-limit").unwrap_or_else(|| "16M".into());
    let limit =
        parse_memory_size(&limit).map_err(datafusion::error::DataFusionError::Plan)?;
    let spill = tempfile::tempdir()?;
    let session = Session::builder()
        .memory_limit(limit)
        .spill_dir(spill.path())
        .build()?;
    let sql =
        format!("SELECT id, caption, tokens, image_png FROM '{data}' SHUFFLE SEED 42");

    let size = session
        .collect(
            session
                .sql(&format!(
                    "SELECT CAST(sum(octet_length(caption)) + 4 * sum(cardinality(tokens)) \
                            + sum(byte_length(image_png)) + 8 * count(*) AS BIGINT) AS bytes \
                     FROM '{data}'"
                ))
                .await?,
        )
        .await?;
    let data_bytes = size[0]
        .column(0)
        .as_primitive_opt::<Int64Type>()
        .map_or(0, |a| a.value(0));

    let first = first_ids(&session, &sql).await?;
    let again = first_ids(&session, &sql).await?;
    let other_epoch =
        first_ids(&session, &sql.replace("SEED 42", "SEED 42 EPOCH 1")).await?;
    println!("first ids, epoch 0: {first:?}");
    println!("first ids, again:   {again:?} (same seed, same order)");
    println!("first ids, epoch 1: {other_epoch:?}");

    let analyzed = session
        .collect(session.sql(&format!("EXPLAIN ANALYZE {sql}")).await?)
        .await?;
    let plan = analyzed[0]
        .column(1)
        .as_string_opt::<i32>()
        .map(|plans| plans.value(0).to_string())
        .unwrap_or_default();
    let permute = plan
        .lines()
        .find(|l| l.contains("PermuteExec"))
        .unwrap_or_default()
        .trim();
    println!(
        "{data_bytes} bytes of data under a {limit}-byte memory limit:\n{permute}\n\
         spill files left after the query: {}",
        files_below(spill.path())
    );
    Ok(())
}

/// The first ten ids of the shuffled query.
async fn first_ids(session: &Session, sql: &str) -> Result<Vec<i64>> {
    let batches = session.collect(session.sql(sql).await?).await?;
    Ok(batches
        .iter()
        .filter_map(|b| b.column(0).as_primitive_opt::<Int64Type>())
        .flat_map(|ids| ids.values().to_vec())
        .take(10)
        .collect())
}

/// Number of files below `dir`.
fn files_below(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| {
            let path = entry.path();
            if path.is_dir() { files_below(&path) } else { 1 }
        })
        .sum()
}
