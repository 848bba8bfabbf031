//! How many images a feed decodes before its first batch, counted (not
//! timed): with costly functions evaluated in small ordered batches
//! (`ParallelProjectionExec`) and after the shuffle (`LateRowFunctions`),
//! the first batch needs about a few batches' worth of decodes, not a whole
//! 8192-row record batch per partition or, shuffled, the whole data set.
//!
//! A test binary of its own: the decode counter is process-wide (and the
//! tests here take `COUNTER` in turn).

use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::datagen::{GenOptions, generate};
use sqlfeed::device::Device;
use sqlfeed::feed::{ColumnSpec, Feed};
use sqlfeed_udfs::image::images_decoded;

/// Held by each test: the decode counter counts every thread's decodes.
static COUNTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

const ROWS: u64 = 6000;
const BATCH: usize = 256;

fn first_batch_decodes(
    session: &Session,
    sql: &str,
    shuffle: Option<u64>,
) -> Result<u64> {
    let before = images_decoded();
    let mut builder = Feed::builder(session, sql)
        .batch_size(BATCH)
        .device(Device::Cpu)
        .column("x", ColumnSpec::new());
    if let Some(seed) = shuffle {
        builder = builder.shuffle(seed);
    }
    let mut feed = builder.build()?;
    let first = feed.next().expect("a first batch")?;
    let decoded = images_decoded() - before;
    assert_eq!(first.tensor("x")?.shape(), &[BATCH, 3, 64, 64]);
    drop(first);
    // The rest of the epoch decodes every row exactly once.
    let mut rows = BATCH;
    for batch in feed.by_ref() {
        rows += batch?.rows();
    }
    assert_eq!(rows as u64, ROWS);
    assert_eq!(images_decoded() - before, ROWS, "every image decoded once");
    Ok(decoded)
}

#[test]
fn the_first_batch_needs_about_a_batch_of_decodes() -> Result<()> {
    let _counting = COUNTER.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir()?;
    let mut options = GenOptions::new(ROWS, dir.path());
    options.files = 2;
    options.image_size = 32;
    generate(&options)?;
    let session = Session::builder().target_partitions(2).build()?;
    let sql = format!(
        "SELECT image_to_tensor(image_resize(image_decode(image_jpeg), 64, 64)) AS x, label \
         FROM '{}'",
        dir.path().display()
    );
    for shuffle in [None, Some(3)] {
        let decoded = first_batch_decodes(&session, &sql, shuffle)?;
        eprintln!(
            "shuffle {shuffle:?}: {decoded} decodes before the first batch of {BATCH}"
        );
        // Two partitions (unshuffled), each a first morsel of 64 rows and
        // two of ~85 (4 MiB of 48 KiB rows) buffered ahead, plus the
        // prefetch: a few batches. Evaluated whole, the first batch waited
        // for 3000 decodes per partition (all 6000 when shuffled).
        assert!(
            decoded <= 4 * BATCH as u64,
            "shuffle {shuffle:?}: {decoded} decodes before the first batch"
        );
    }
    Ok(())
}

/// A cached feed decodes every image once in all: its first epoch writes
/// the entry from the rows it streams (no second run of the query beside
/// it), later epochs read the entry; and its first batch comes as soon as
/// uncached.
#[test]
fn a_cached_feed_decodes_each_image_once_over_all_epochs() -> Result<()> {
    let _counting = COUNTER.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let mut options = GenOptions::new(ROWS, &data);
    options.files = 2;
    options.image_size = 32;
    generate(&options)?;
    let session = Session::builder()
        .target_partitions(2)
        .cache_dir(dir.path().join("cache"))
        .build()?;
    let sql = format!(
        "SELECT image_to_tensor(image_resize(image_decode(image_jpeg), 64, 64), \
         [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]) AS x, label FROM '{}'",
        data.display()
    );
    let before = images_decoded();
    let mut feed = Feed::builder(&session, &sql)
        .batch_size(BATCH)
        .shuffle(5)
        .epochs(3)
        .cache(true)
        .device(Device::Cpu)
        .build()?;
    let first = feed.next().expect("a first batch")?;
    let decoded_first = images_decoded() - before;
    assert_eq!(first.tensor("x")?.shape(), &[BATCH, 3, 64, 64]);
    drop(first);
    let mut rows = BATCH as u64;
    for batch in feed.by_ref() {
        rows += batch?.rows() as u64;
    }
    assert_eq!(rows, 3 * ROWS);
    assert_eq!(images_decoded() - before, ROWS, "each image decoded once");
    assert!(
        decoded_first <= 4 * BATCH as u64,
        "{decoded_first} decodes before a cached feed's first batch"
    );
    Ok(())
}
