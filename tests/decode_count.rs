//! How many images a feed decodes before its first batch, counted (not
//! timed): with costly functions evaluated in small ordered batches
//! (`ParallelProjectionExec`) and after the shuffle (`LateRowFunctions`),
//! the first batch needs about a few batches' worth of decodes, not a whole
//! 8192-row record batch per partition or, shuffled, the whole data set.
//!
//! A test binary of its own: the decode counter is process-wide.

use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::datagen::{GenOptions, generate};
use sqlfeed::device::Device;
use sqlfeed::feed::{ColumnSpec, Feed};
use sqlfeed_udfs::image::images_decoded;

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
