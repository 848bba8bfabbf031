//! `sqlfeed demo`: the README's main job on the embedded engine.
//!
//! Generates a small training set if it is missing, then runs a preprocessing
//! query over it — normalisation constants fitted and applied in one SQL
//! statement, image and token statistics per class — and prints the result
//! and the scan throughput.

use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::error::Result;

use super::exec::Executor;
use crate::datagen::{self, GenOptions};

/// Options of `sqlfeed demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Rows of generated data.
    #[arg(long, default_value_t = 200_000)]
    pub rows: u64,
    /// Where the generated data lives (reused when present).
    #[arg(long, default_value = "target/sqlfeed-demo")]
    pub dir: PathBuf,
}

/// The preprocessing query of the demo over the files in `dir`.
pub fn demo_sql(dir: &Path) -> String {
    let files = format!("{}/*.parquet", dir.display()).replace('\'', "''");
    format!(
        "WITH stats AS (\n\
         \x20   SELECT avg(f0) AS f0_mean, stddev(f0) AS f0_std,\n\
         \x20          min(f1) AS f1_min, max(f1) AS f1_max\n\
         \x20   FROM '{files}'\n\
         )\n\
         SELECT label,\n\
         \x20      count(*) AS rows,\n\
         \x20      round(avg(standardize(f0, f0_mean, f0_std)), 4) AS f0_standardized_mean,\n\
         \x20      round(avg(min_max_scale(f1, f1_min, f1_max)), 4) AS f1_scaled_mean,\n\
         \x20      round(avg(byte_length(image_png)), 1) AS png_bytes,\n\
         \x20      round(avg(cardinality(tokens)), 1) AS tokens_per_row\n\
         FROM '{files}' CROSS JOIN stats\n\
         WHERE weight IS NOT NULL\n\
         GROUP BY label\n\
         ORDER BY label;"
    )
}

fn data_is_current(dir: &Path, rows: u64) -> bool {
    std::fs::read_to_string(dir.join("_meta.json"))
        .map(|meta| meta.contains(&format!("\"rows\": {rows},")))
        .unwrap_or(false)
}

/// Runs the demo; see the module docs.
pub async fn run(exec: &mut Executor, args: &DemoArgs) -> Result<()> {
    if !data_is_current(&args.dir, args.rows) {
        let start = Instant::now();
        let mut options = GenOptions::new(args.rows, &args.dir);
        options.files = 8;
        let summary = datagen::generate(&options)?;
        eprintln!(
            "generated {summary} under {} in {:.2}s",
            args.dir.display(),
            start.elapsed().as_secs_f64()
        );
    }
    let sql = demo_sql(&args.dir);
    println!("{sql}\n");
    let start = Instant::now();
    let bytes_before = exec.session.io_counters().bytes_read();
    exec.timing = true;
    exec.run_sql(&sql).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let read = exec.session.io_counters().bytes_read() - bytes_before;
    println!(
        "\npreprocessed {} rows twice (fit + apply) in {:.3}s: {:.0} rows/s, {:.1} MB read from Parquet",
        args.rows,
        elapsed,
        2.0 * args.rows as f64 / elapsed.max(1e-9),
        read as f64 / 1e6
    );
    Ok(())
}
