//! Scenario 2: multi-stage parallel preprocessing in SQL and UDFs, with the
//! parallelism under control: standardisation constants fitted in the same
//! query, JPEG decode → resize → normalised CHW tensor, on N partitions.
//!
//! ```sh
//! cargo run --release --example preprocess -- [--data 'data/*.parquet'] [--partitions 2]
//! ```

// Examples report on stdout.
#![allow(clippy::print_stdout)]

mod common;

use std::time::Instant;

use datafusion::error::Result;
use futures::StreamExt;
use sqlfeed::Session;

#[tokio::main]
async fn main() -> Result<()> {
    let args = common::Args::from_env();
    let data = args.data()?;
    let partitions: usize = args.number("--partitions", 2);
    let session = Session::builder().target_partitions(partitions).build()?;
    let sql = format!(
        "WITH stats AS (SELECT avg(f0) AS m0, stddev(f0) AS s0, avg(f1) AS m1, stddev(f1) AS s1 \
                        FROM '{data}')
         SELECT id,
                feature_vector(standardize(f0, m0, s0), standardize(f1, m1, s1)) AS x,
                image_to_tensor(image_resize(image_decode(image_jpeg), 24, 24),
                                [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) AS image,
                label AS y
         FROM '{data}' CROSS JOIN stats"
    );
    let started = Instant::now();
    let plan = session.sql(&sql).await?.create_physical_plan().await?;
    let scan_partitions =
        datafusion::physical_plan::ExecutionPlanProperties::output_partitioning(&plan)
            .partition_count();
    let mut stream = session.execute_stream(plan)?;
    let (mut rows, mut batches) = (0usize, 0usize);
    while let Some(batch) = stream.next().await {
        rows += batch?.num_rows();
        batches += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "preprocessed {rows} rows in {batches} batches on {partitions} partitions \
         (plan output partitions: {scan_partitions}) in {seconds:.2}s: {:.0} rows/s",
        rows as f64 / seconds
    );
    Ok(())
}
