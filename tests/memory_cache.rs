//! A cache three times the memory limit stays within the memory limit plus
//! the batches in flight.

#[path = "memory/common.rs"]
mod common;

use datafusion::arrow::array::{Int64Array, UInt64Array};
use datafusion::error::Result;
use sqlfeed::Session;

// The `sqlfeed` binary's allocator. Under glibc malloc the read-back peaked
// 60–100 MB higher: each blocking reader thread frees into its own arena.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_three_times_the_memory_limit_keeps_peak_rss_bounded() -> Result<()> {
    const LIMIT: usize = 48 << 20;
    const BATCH_ROWS: usize = 2048;
    const ROW_BYTES: usize = 2048;
    let dir = tempfile::tempdir()?;
    let session = Session::builder()
        .memory_limit(LIMIT)
        .target_partitions(2)
        .batch_size(BATCH_ROWS)
        .cache_dir(dir.path())
        .build()?;
    // Warm up DataFusion's lazily built state (function registry, planner,
    // runtime threads) so that it is not counted as the cache's.
    session
        .collect(
            session
                .sql("CACHE TABLE warm AS SELECT value, repeat('x', 100) AS p FROM generate_series(1, 10000)")
                .await?,
        )
        .await?;
    session
        .collect(
            session
                .sql("SELECT count(*), sum(length(p)) FROM warm")
                .await?,
        )
        .await?;
    let Some(before) = common::rss_with_peak_reset() else {
        eprintln!("skipped: no /proc/self/status or clear_refs on this system");
        return Ok(());
    };
    // 90,000 rows of 2 KiB: ~185 MB, almost 4× the limit.
    let cached = session
        .collect(
            session
                .sql(&format!(
                    "CACHE TABLE big AS SELECT value AS id, \
                     repeat(chr(65 + CAST(value % 26 AS INT)), {ROW_BYTES}) AS pad \
                     FROM generate_series(1, 90000)"
                ))
                .await?,
        )
        .await?;
    let disk_bytes = cached[0]
        .column_by_name("disk_bytes")
        .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
        .map_or(0, |a| a.value(0));
    let memory_bytes = cached[0]
        .column_by_name("memory_bytes")
        .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
        .map_or(u64::MAX, |a| a.value(0));
    let grown_filling = common::peak_growth(before);
    assert!(disk_bytes > 3 * LIMIT as u64, "{disk_bytes} bytes cached");
    assert!(
        memory_bytes <= LIMIT as u64 / 2,
        "the memory tier keeps at most half the limit: {memory_bytes}"
    );

    // Read everything back (the disk part too) and check it.
    let sums = session
        .collect(
            session
                .sql("SELECT count(*) AS n, sum(length(pad)) AS l, sum(id) AS s FROM big")
                .await?,
        )
        .await?;
    let value = |name: &str| {
        sums[0]
            .column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
            .map_or(-1, |a| a.value(0))
    };
    assert_eq!(value("n"), 90_000);
    assert_eq!(value("l"), 90_000 * ROW_BYTES as i64);
    assert_eq!(value("s"), 90_000 * 90_001 / 2);

    // Stated overhead: per partition, the batch being produced, the batch
    // being written and two in the scan's channel (4 MiB each here), plus
    // the allocator's slack.
    let in_flight = 2 * 4 * (BATCH_ROWS * ROW_BYTES) as u64;
    let bound = LIMIT as u64 + in_flight + (32 << 20);
    let grown = common::peak_growth(before);
    eprintln!(
        "cache of {disk_bytes} bytes under a {LIMIT}-byte limit: peak RSS grew by \
         {grown_filling} bytes filling it, {grown} bytes after reading it back (bound {bound})"
    );
    assert!(grown <= bound, "RSS grew by {grown} bytes, over {bound}");
    Ok(())
}
