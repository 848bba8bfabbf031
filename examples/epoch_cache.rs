//! Scenario 7: the epoch cache. Decode and resize the images once, then
//! train several epochs from the cache: every epoch is still a fresh global
//! shuffle of (seed, epoch). A second run of the same program finds the
//! cache on disk and skips the preprocessing from its first epoch on.
//!
//! ```sh
//! cargo run --release --example epoch_cache -- [--data …] [--epochs 3] [--cache-dir DIR]
//! ```

// Examples report on stdout.
#![allow(clippy::print_stdout)]

mod common;

use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::device::Device;
use sqlfeed::feed::Feed;

fn main() -> Result<()> {
    let args = common::Args::from_env();
    let data = args.data()?;
    let epochs: u64 = args.number("--epochs", 3);
    let mut builder = Session::builder();
    if let Some(dir) = args.flag("--cache-dir") {
        builder = builder.cache_dir(dir);
    }
    let session = builder.build()?;
    let sql = format!(
        "SELECT image_to_tensor(image_resize(image_decode(image_jpeg), 24, 24)) AS image,
                label AS y
         FROM '{data}'"
    );
    let mut feed = Feed::builder(&session, sql)
        .shuffle(42)
        .batch_size(256)
        .epochs(epochs)
        .cache(true)
        .device(Device::Cpu)
        .build()?;
    let mut first_ids_per_epoch = Vec::new();
    for batch in feed.by_ref() {
        let batch = batch?;
        if batch.step() == 0 {
            let labels = batch.tensor("y")?.as_slice::<i64>()?;
            first_ids_per_epoch.push(labels[..8].to_vec());
        }
    }
    for (epoch, seconds) in feed.epoch_seconds() {
        println!("epoch {epoch}: {seconds:.2}s");
    }
    println!(
        "first labels of each epoch (a new order every epoch): {first_ids_per_epoch:?}"
    );
    for entry in session.cache().entries() {
        println!(
            "cache entry {}: {} rows, {} bytes on disk, reused by the next run",
            entry.key, entry.rows, entry.disk_bytes
        );
    }
    Ok(())
}
