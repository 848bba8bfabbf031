//! `sqlfeed demo`: the README's main job on the embedded engine.
//!
//! Generates a small training set if it is missing, explores it with one
//! query (normalisation constants fitted and applied in one SQL statement,
//! image and token statistics per class), then runs the training feed: two
//! globally shuffled epochs of exact batches of tensors (standardised
//! features, decoded and resized images, padded tokens with their mask), on
//! the GPU when one is usable, and prints the feed's throughput.

use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::common::internal_datafusion_err;
use datafusion::error::{DataFusionError, Result};

use super::exec::Executor;
use super::feed::FeedArgs;
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

/// The demo feed's simulated training step (a small model on a GPU).
const DEMO_STEP_MS: f64 = 2.0;

/// The feed's query over the files in `dir`: every column becomes a tensor.
pub fn demo_feed_sql(dir: &Path) -> String {
    let files = format!("{}/*.parquet", dir.display()).replace('\'', "''");
    format!(
        "WITH stats AS (\n\
         \x20   SELECT avg(f0) AS m0, stddev(f0) AS s0, avg(f1) AS m1, stddev(f1) AS s1,\n\
         \x20          avg(f2) AS m2, stddev(f2) AS s2, avg(f3) AS m3, stddev(f3) AS s3\n\
         \x20   FROM '{files}'\n\
         )\n\
         SELECT feature_vector(standardize(f0, m0, s0), standardize(f1, m1, s1),\n\
         \x20                     standardize(f2, m2, s2), standardize(f3, m3, s3)) AS x,\n\
         \x20      label AS y,\n\
         \x20      image_to_tensor(image_resize(image_decode(image_jpeg), 24, 24)) AS image,\n\
         \x20      tokens\n\
         FROM '{files}' CROSS JOIN stats"
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

    let feed = FeedArgs {
        sql: demo_feed_sql(&args.dir),
        batch_size: 256,
        batch_tokens: None,
        bucket_by_length: None,
        pack: None,
        pack_window: crate::feed::PackOptions::DEFAULT_WINDOW,
        pack_long: crate::feed::LongDocuments::Split,
        pack_flat: false,
        drop_last: true,
        prefetch: 8,
        device: crate::device::Device::auto(),
        epochs: 2,
        shuffle_seed: Some(42),
        shuffle_window: None,
        shuffle_by_position: false,
        order_lanes: None,
        shard: None,
        cache: false,
        run_id: None,
        resume: None,
        resume_rows: None,
        resume_from: None,
        on_data_change: None,
        save_checkpoint: None,
        checkpoint_every: None,
        skip_steps: vec![],
        explain: None,
        rows: None,
        // A small simulated training step, so that "consumer waited" says
        // how much of a fast model's time the feed would leave idle.
        step_ms: DEMO_STEP_MS,
        tensors: vec![],
        max_batches: None,
        digest: false,
        explain_analyze: false,
        result_json: false,
        on_error: super::feed::OnErrorArg::Fail,
        max_quarantined: None,
        quarantine_out: None,
        timeline: None,
        prometheus: None,
        prometheus_every: 15.0,
        prometheus_label: vec![],
    };
    println!(
        "\ntraining feed, 2 epochs, SHUFFLE SEED 42, batches of 256, a simulated \
         {DEMO_STEP_MS} ms training step per batch:\n{}\n",
        feed.sql
    );
    let session = exec.session.clone();
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || super::feed::run(&session, &feed, &runtime))
        .await
        .map_err(|e| internal_datafusion_err!("the feed loop panicked: {e}"))?
        .map_err(|e| DataFusionError::External(e.into()))?;
    Ok(())
}
