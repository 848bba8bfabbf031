//! A shuffled image feed (JPEGs decoded, resized to 64×64, float32 tensors)
//! under memory limits far below its decoded size: peak RSS stays within the
//! limit plus a stated constant, because the shuffle moves the JPEG bytes
//! (functions run after it), decoding runs in byte-sized batches, and the
//! prefetch ring is reserved from the same pool.
//!
//! A test binary of its own: peak RSS (`VmHWM`) must belong to this feed.

#[path = "memory/common.rs"]
mod common;

use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::datagen::{GenOptions, generate};
use sqlfeed::device::Device;
use sqlfeed::feed::{ColumnSpec, Feed};

// The system allocator, as a program embedding the library has by default.

const ROWS: u64 = 12_000;
const BATCH: usize = 256;

/// Rows fed and the growth of peak RSS over the feed.
fn feed_under(
    limit: usize,
    prefetch: usize,
    files: &str,
    spill: &std::path::Path,
) -> Result<(usize, u64)> {
    let session = Session::builder()
        .memory_limit(limit)
        .target_partitions(2)
        .spill_dir(spill)
        .build()?;
    let sql = format!(
        "SELECT image_to_tensor(image_resize(image_decode(image_jpeg), 64, 64)) AS x, \
         label AS y FROM '{files}'"
    );
    let before = common::rss_with_peak_reset().unwrap_or(0);
    let mut feed = Feed::builder(&session, &sql)
        .batch_size(BATCH)
        .prefetch(prefetch)
        .shuffle(11)
        .device(Device::Cpu)
        .column("x", ColumnSpec::new())
        .build()?;
    let mut rows = 0;
    for batch in feed.by_ref() {
        let batch = batch?;
        assert_eq!(batch.tensor("x")?.shape()[1..], [3, 64, 64]);
        rows += batch.rows();
    }
    drop(feed);
    Ok((rows, common::peak_growth(before)))
}

#[test]
fn a_shuffled_image_feed_stays_within_its_memory_limit() -> Result<()> {
    let data = tempfile::tempdir()?;
    let spill = tempfile::tempdir()?;
    let mut options = GenOptions::new(ROWS, data.path());
    options.files = 4;
    options.image_size = 128;
    options.row_group_rows = 1024;
    generate(&options)?;
    let files = format!("{}/*.parquet", data.path().display());
    if common::rss_with_peak_reset().is_none() {
        // Visible in the test output; CI runs on Linux, where it is there.
        eprintln!("SKIPPED: no /proc/self/clear_refs on this system");
        return Ok(());
    }
    let decoded = ROWS * 3 * 64 * 64 * 4;
    let mut over = vec![];
    // Prefetch 16 at 128 MiB: 17 slots of 12.6 MB would be 214 MB, more than
    // the whole budget; the ring fits itself to its share (issue 35).
    for (limit, prefetch) in [
        (128 << 20, 4),
        (256 << 20, 4),
        (512 << 20, 4),
        (128 << 20, 16),
    ] {
        let (rows, grown) = feed_under(limit, prefetch, &files, spill.path())?;
        eprintln!(
            "limit {} MiB, prefetch {prefetch}: {rows} rows ({} MiB decoded), peak RSS grew \
             {} MiB",
            limit >> 20,
            decoded >> 20,
            grown >> 20
        );
        assert_eq!(rows as u64, ROWS);
        assert!(decoded > limit as u64, "the limit must bind");
        // Stated overhead outside the pool: the Parquet reader's row
        // groups, decoder scratch per worker, the allocator's slack.
        let bound = limit as u64 + (64 << 20);
        if grown > bound {
            over.push(format!(
                "limit {limit}, prefetch {prefetch}: peak RSS grew {grown} bytes, over {bound}"
            ));
        }
    }
    assert!(over.is_empty(), "{over:#?}");
    Ok(())
}
