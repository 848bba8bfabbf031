//! Work several times the memory limit stays within the limit plus the
//! batches in flight: a cache and a global shuffle. Its own test binary, so
//! that the process's peak RSS (`VmHWM`) belongs to these tests alone; they
//! take turns and reset the peak before measuring. The binary uses the
//! allocator of the `sqlfeed` binary.

use datafusion::arrow::array::{Int64Array, UInt64Array};
use datafusion::error::Result;
use sqlfeed::Session;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One measurement at a time: the peak is per process.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Resets this process's peak RSS to its current RSS (Linux ≥ 4.0), so the
/// next `VmHWM` reads the peak from now on.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// `VmHWM` or `VmRSS` of this process in bytes (Linux).
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_three_times_the_memory_limit_keeps_peak_rss_bounded() -> Result<()> {
    let _turn = TURN.lock().await;
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
    let Some(before) = status_bytes("VmRSS:") else {
        eprintln!("skipped: no /proc/self/status on this system");
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
    let grown_filling = status_bytes("VmHWM:")
        .unwrap_or(u64::MAX)
        .saturating_sub(before);
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

    let peak = status_bytes("VmHWM:").unwrap_or(u64::MAX);
    // Stated overhead: per partition, the batch being produced, the batch
    // being written and two in the scan's channel (4 MiB each here), plus
    // the allocator's slack.
    let in_flight = 2 * 4 * (BATCH_ROWS * ROW_BYTES) as u64;
    let bound = LIMIT as u64 + in_flight + (32 << 20);
    let grown = peak.saturating_sub(before);
    eprintln!(
        "cache of {disk_bytes} bytes under a {LIMIT}-byte limit: peak RSS grew by \
         {grown_filling} bytes filling it, {grown} bytes after reading it back (bound {bound})"
    );
    assert!(grown <= bound, "RSS grew by {grown} bytes, over {bound}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "known gap (issue 4): completes since ShuffleKeyExec splits wide batches, but peak \
            RSS reaches ~2x the data: DataFusion's sort keeps runs in a non-spillable merge \
            reservation and not every copy is accounted. Run with --ignored."]
async fn a_shuffle_four_times_the_memory_limit_spills_within_bounded_rss() -> Result<()> {
    let _turn = TURN.lock().await;
    use futures::StreamExt;
    const LIMIT: usize = 32 << 20;
    const ROW_BYTES: usize = 2048;
    const ROWS: i64 = 64_000;
    let spill = tempfile::tempdir()?;
    let session = Session::builder()
        .memory_limit(LIMIT)
        .target_partitions(2)
        .spill_dir(spill.path())
        .build()?;
    let query = format!(
        "SELECT value AS id, repeat(chr(65 + CAST(value % 26 AS INT)), {ROW_BYTES}) AS pad \
         FROM generate_series(1, {ROWS}) SHUFFLE SEED 3"
    );
    // Warm up on a small shuffle.
    session
        .collect(
            session
                .sql("SELECT value FROM generate_series(1, 1000) SHUFFLE SEED 1")
                .await?,
        )
        .await?;
    let (Some(before), true) = (status_bytes("VmRSS:"), reset_peak()) else {
        eprintln!("skipped: no /proc/self/status or clear_refs on this system");
        return Ok(());
    };
    // Stream it: collecting would hold the whole output by design.
    let plan = session.sql(&query).await?.create_physical_plan().await?;
    let mut stream = session.execute_stream(plan)?;
    let (mut rows, mut id_sum, mut previous, mut ascending) = (0i64, 0i64, 0i64, 0i64);
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("id is int64");
        for id in ids.values() {
            rows += 1;
            id_sum += id;
            ascending += i64::from(*id > previous);
            previous = *id;
        }
    }
    drop(stream);
    assert_eq!(rows, ROWS);
    assert_eq!(id_sum, ROWS * (ROWS + 1) / 2);
    assert!(
        ascending < ROWS * 6 / 10,
        "not shuffled: {ascending} of {ROWS} steps ascend"
    );
    let grown = status_bytes("VmHWM:")
        .unwrap_or(u64::MAX)
        .saturating_sub(before);
    let data = ROWS as u64 * ROW_BYTES as u64;
    // Stated overhead: the merge phase's one batch per sorted run and
    // partition (ShuffleExec sizes them to 1/64 of a partition's share) and
    // the scan's batches in flight, plus the allocator's slack.
    let bound = LIMIT as u64 + (48 << 20);
    eprintln!(
        "shuffle of {data} bytes under a {LIMIT}-byte limit: peak RSS grew by {grown} \
         bytes (bound {bound})"
    );
    assert!(data > 4 * LIMIT as u64);
    assert!(grown <= bound, "RSS grew by {grown} bytes, over {bound}");
    let left: Vec<_> = std::fs::read_dir(spill.path())?.flatten().collect();
    let files: Vec<_> = left
        .iter()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .collect();
    assert!(files.is_empty(), "spill files left: {files:?}");
    Ok(())
}
