//! Scenario 3: prefetching into device tensors for a training loop. The feed
//! prepares batches on its own threads while the loop "trains" (a sleep per
//! step); at the end it prints how much of the time the loop starved.
//!
//! ```sh
//! cargo run --release --example prefetch_feed -- [--data …] [--step-ms 5] [--device cuda:0]
//! ```

// Examples report on stdout.
#![allow(clippy::print_stdout)]

mod common;

use std::time::Duration;

use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::device::Device;
use sqlfeed::feed::Feed;

fn main() -> Result<()> {
    let args = common::Args::from_env();
    let data = args.data()?;
    let step = Duration::from_secs_f64(args.number("--step-ms", 5.0) / 1000.0);
    let device: Device = args
        .flag("--device")
        .unwrap_or_else(|| "auto".into())
        .parse()?;
    let session = Session::try_new()?;
    let sql = format!(
        "SELECT feature_vector(f0, f1, f2, f3) AS x,
                image_to_tensor(image_decode(image_png)) AS image,
                label AS y
         FROM '{data}'"
    );
    let mut feed = Feed::builder(&session, sql)
        .shuffle(42)
        .batch_size(256)
        .drop_last(true)
        .prefetch(8)
        .device(device)
        .build()?;
    println!("{}", feed.describe());
    let mut steps = 0;
    for batch in feed.by_ref() {
        let batch = batch?;
        let image = batch.tensor("image")?;
        if steps == 0 {
            println!("first batch: image {:?} {:?}", image.dtype(), image.shape());
        }
        std::thread::sleep(step); // the training step
        steps += 1;
    }
    let report = feed.report();
    println!(
        "{steps} steps of {:.1} ms: {:.0} rows/s; the loop waited {:.1}% of the time \
         ({:.1}% after the first batch, which took {:.2}s)",
        step.as_secs_f64() * 1000.0,
        report.rows_per_s(),
        100.0 * report.wait_frac(),
        100.0 * report.wait_frac_steady(),
        report.ttfb_s.unwrap_or(f64::NAN)
    );
    Ok(())
}
