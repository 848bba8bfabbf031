//! The batch contract (issue 14): batches a training loop holds stay valid and
//! never deadlock the feed; the unshuffled order does not depend on the
//! machine; seeded augmentations change per epoch and reproduce on resume.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::device::{Device, TensorBatch};
use sqlfeed::feed::{Feed, FeedBuilder};
use xxhash_rust::xxh3::xxh3_64;

use crate::common::{arc, assert_contains, budget_session, generated, write_parquet};

/// Runs `work` on its own thread and fails the test instead of hanging when
/// it takes longer than `limit`.
fn bounded<T: Send + 'static>(
    limit: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("no answer within {limit:?}: the feed hangs"))
}

/// 1200 ids in a hive-partitioned folder: 3 `part=` folders × 2 files × 200.
fn hive_ids(dir: &Path) -> Result<String> {
    for part in 0..3i64 {
        let folder = dir.join(format!("part={part}"));
        std::fs::create_dir_all(&folder)?;
        for file in 0..2i64 {
            let start = (part * 2 + file) * 200;
            let ids = Int64Array::from_iter_values(start..start + 200);
            let batch = RecordBatch::try_from_iter(vec![("id", arc(ids))])?;
            write_parquet(&folder.join(format!("f{file}.parquet")), &batch)?;
        }
    }
    Ok(dir.display().to_string())
}

fn ids(batch: &TensorBatch) -> Result<Vec<i64>> {
    Ok(batch.tensor("id")?.as_slice::<i64>()?.to_vec())
}

fn feed_ids(builder: FeedBuilder) -> Result<Vec<Vec<i64>>> {
    builder
        .device(Device::Cpu)
        .build()?
        .map(|batch| ids(&batch?))
        .collect()
}

#[test]
fn a_collected_epoch_keeps_every_batch_valid() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let folder = hive_ids(dir.path())?;
    let session = Session::builder().memory_limit(256 << 20).build()?;
    let sql = format!("SELECT id FROM '{folder}'");
    let expected = feed_ids(Feed::builder(&session, &sql).batch_size(50))?;
    // prefetch 1 = a ring of 2 slots; the loop holds all 24 batches.
    let batches: Vec<TensorBatch> = bounded(Duration::from_secs(120), {
        let (session, sql) = (session.clone(), sql.clone());
        move || -> Result<Vec<TensorBatch>> {
            Feed::builder(&session, &sql)
                .batch_size(50)
                .prefetch(1)
                .device(Device::Cpu)
                .build()?
                .collect()
        }
    })?;
    assert_eq!(batches.len(), 24);
    let held: Vec<Vec<i64>> = batches.iter().map(ids).collect::<Result<_>>()?;
    assert_eq!(held, expected, "held batches still hold their own rows");
    drop(batches);
    assert_eq!(session.context().runtime_env().memory_pool.reserved(), 0);
    Ok(())
}

#[test]
fn gradient_accumulation_holds_more_batches_than_prefetch() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let folder = hive_ids(dir.path())?;
    let session = Session::builder().memory_limit(256 << 20).build()?;
    let sql = format!("SELECT id FROM '{folder}'");
    let expected = feed_ids(Feed::builder(&session, &sql).batch_size(40))?;
    let seen = bounded(
        Duration::from_secs(120),
        move || -> Result<Vec<Vec<i64>>> {
            let mut feed = Feed::builder(&session, &sql)
                .batch_size(40)
                .prefetch(2)
                .device(Device::Cpu)
                .build()?;
            let mut seen = vec![];
            // Accumulate 6 batches (twice the ring) before each "optimizer step".
            loop {
                let mut window = vec![];
                for batch in feed.by_ref().take(6) {
                    window.push(batch?);
                }
                if window.is_empty() {
                    return Ok(seen);
                }
                for batch in &window {
                    seen.push(ids(batch)?);
                }
            }
        },
    )?;
    assert_eq!(seen, expected);
    Ok(())
}

#[test]
fn holding_past_the_memory_budget_is_a_prompt_error() -> Result<()> {
    // 64 KiB per batch against a 2 MiB budget: about 30 can be held.
    let session = budget_session(2 << 20)?;
    let sql = "SELECT one_hot(value % 10, 128) AS v FROM generate_series(1, 40000)";
    let started = Instant::now();
    let outcome = bounded(Duration::from_secs(60), {
        let session = session.clone();
        move || -> std::result::Result<usize, String> {
            let feed = Feed::builder(&session, sql)
                .batch_size(128)
                .prefetch(2)
                .device(Device::Cpu)
                .build()
                .map_err(|e| e.to_string())?;
            let mut held = vec![];
            for batch in feed {
                held.push(batch.map_err(|e| e.to_string())?);
            }
            Ok(held.len())
        }
    });
    let elapsed = started.elapsed();
    let err = outcome.expect_err("holding every batch cannot fit 2 MiB");
    eprintln!("held past the budget: failed after {elapsed:?}: {err}");
    assert!(
        err.contains("holds")
            && err.contains("batches")
            && err.contains("--memory-limit"),
        "{err}"
    );
    // Generous for a loaded CI machine: the point is "not a hang".
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}: {err}");
    assert_eq!(session.context().runtime_env().memory_pool.reserved(), 0);
    Ok(())
}

#[test]
fn unshuffled_batches_do_not_depend_on_target_partitions() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let folder = hive_ids(dir.path())?;
    let sql = format!("SELECT id FROM '{folder}' WHERE id % 3 <> 1 AND part <> '9'");
    let mut orders = vec![];
    for partitions in [1, 2, 3, 8] {
        let session = Session::builder()
            .target_partitions(partitions)
            .batch_size(64)
            .build()?;
        orders.push(feed_ids(Feed::builder(&session, &sql).batch_size(32))?);
    }
    for (order, partitions) in orders.iter().zip([1, 2, 3, 8]).skip(1) {
        assert_eq!(order, &orders[0], "target_partitions {partitions} vs 1");
    }
    let mut all: Vec<i64> = orders[0].iter().flatten().copied().collect();
    all.sort();
    assert_eq!(all, (0..1200).filter(|id| id % 3 != 1).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn a_group_by_feed_needs_an_order_by() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let folder = hive_ids(dir.path())?;
    let session = Session::builder().target_partitions(4).build()?;
    let grouped = format!("SELECT min(id) AS id FROM '{folder}' GROUP BY id % 50");
    let err = Feed::builder(&session, &grouped)
        .device(Device::Cpu)
        .build()
        .expect_err("refused")
        .to_string();
    assert_contains(&err, &["ORDER BY", "--shuffle-seed"]);
    let ordered = feed_ids(
        Feed::builder(&session, format!("{grouped} ORDER BY id")).batch_size(10),
    )?;
    assert_eq!(ordered.concat(), (0..50).collect::<Vec<_>>());
    // Shuffled, the same query needs no ORDER BY.
    let shuffled = feed_ids(Feed::builder(&session, &grouped).shuffle(3).batch_size(10))?;
    assert_eq!(shuffled.concat().len(), 50);
    Ok(())
}

/// (epoch, step, xxh3 of the batch's crop bytes, xxh3 of each row's).
type CropDigest = (u64, u64, u64, Vec<u64>);

/// Every batch's crop digests.
fn augmented(builder: FeedBuilder) -> Result<Vec<CropDigest>> {
    builder
        .device(Device::Cpu)
        .build()?
        .map(|batch| {
            let batch = batch?;
            let bytes = batch.tensor("crop")?.as_bytes()?;
            let row = bytes.len() / batch.rows();
            let rows = bytes.chunks(row).map(xxh3_64).collect();
            Ok((batch.epoch(), batch.step(), xxh3_64(bytes), rows))
        })
        .collect()
}

#[test]
fn seeded_augmentations_change_per_epoch_and_reproduce_on_resume() -> Result<()> {
    let dir = generated(64, 1)?;
    let session = Session::builder().target_partitions(2).build()?;
    let sql = format!(
        "SELECT image_random_flip(image_random_crop(image_decode(image_png), 5, 5, 7), 7) \
         AS crop FROM '{}/*.parquet' ORDER BY id",
        dir.path().display()
    );
    let feed = || Feed::builder(&session, &sql).batch_size(16).epochs(3);
    let run = augmented(feed())?;
    assert_eq!(run.len(), 12);
    let epoch = |e: u64| -> Vec<u64> {
        run.iter()
            .filter(|(epoch, _, _, _)| *epoch == e)
            .flat_map(|(_, _, _, rows)| rows.clone())
            .collect()
    };
    // Most rows get another crop or flip in another epoch (8x8 images, 5x5
    // crops: 16 offsets × 2 flips, so about 1 in 32 repeats by chance).
    let changed = |a: u64, b: u64| {
        epoch(a)
            .iter()
            .zip(epoch(b))
            .filter(|(x, y)| *x != y)
            .count()
    };
    assert!(
        changed(0, 1) > 48,
        "epoch 1 changed only {} of 64 rows",
        changed(0, 1)
    );
    assert!(
        changed(1, 2) > 48,
        "epoch 2 changed only {} of 64 rows",
        changed(1, 2)
    );
    assert_eq!(
        augmented(feed())?,
        run,
        "the same seed and epochs: the same pixels"
    );
    let resumed = augmented(feed().resume_at(1, 2))?;
    assert_eq!(
        resumed,
        run[6..].to_vec(),
        "resume reproduces the augmentation"
    );
    // Another feed seed draws other crops in the same epoch.
    let other = augmented(Feed::builder(&session, &sql).batch_size(16).shuffle(1))?;
    let mut other: Vec<u64> = other.into_iter().flat_map(|(_, _, _, r)| r).collect();
    let mut first = epoch(0);
    // Compare as multisets of rows: the shuffle reorders them.
    first.sort_unstable();
    other.sort_unstable();
    assert_ne!(first, other, "another feed seed, other augmentations");
    Ok(())
}

#[test]
fn a_checkpoint_after_an_epochs_last_batch_resumes_at_the_next_epoch() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let folder = hive_ids(dir.path())?;
    let session = Session::builder().build()?;
    let sql = format!("SELECT id FROM '{folder}'");
    let feed = || {
        Feed::builder(&session, &sql)
            .batch_size(100)
            .shuffle(4)
            .epochs(2)
    };
    let all = feed_ids(feed())?;
    assert_eq!(all.len(), 24);
    // 12 steps per epoch: (0, 12) is "epoch 0 done".
    assert_eq!(feed_ids(feed().resume_at(0, 12))?, all[12..].to_vec());
    let err = feed_ids(feed().resume_at(0, 13)).expect_err("past the epoch's end");
    assert!(err.to_string().contains("only 12 steps"), "{err}");
    Ok(())
}

#[test]
fn next_within_answers_pending_while_the_first_batch_is_computed() -> Result<()> {
    use sqlfeed::feed::NextBatch;
    let session = Session::builder().target_partitions(2).build()?;
    let mut feed = Feed::builder(
        &session,
        "SELECT value AS v FROM generate_series(1, 3000000) ORDER BY value DESC",
    )
    .batch_size(4)
    .device(Device::Cpu)
    .build()?;
    let mut pending = 0;
    let first = loop {
        match feed.next_within(Duration::from_millis(1)) {
            NextBatch::Pending => pending += 1,
            NextBatch::Ready(batch) => break batch,
            other => panic!("expected a batch, got {other:?}"),
        }
    };
    assert!(pending > 0, "a sort of 3M rows takes longer than 1 ms");
    assert_eq!(
        first.tensor("v")?.as_slice::<i64>()?,
        &[3000000, 2999999, 2999998, 2999997]
    );
    Ok(())
}

/// A loop that polls with `next_within`, gets `Pending` while it holds every
/// slot, then does its own work for longer than the feed's deadlock check
/// before releasing: not a deadlock, so no error.
#[test]
fn a_poller_that_holds_every_slot_between_polls_is_not_deadlocked() -> Result<()> {
    use sqlfeed::feed::NextBatch;
    // 512 KiB per batch against a 3 MiB budget: the ring and no extra slot.
    let session = budget_session(3 << 20)?;
    let sql = "SELECT one_hot(value % 10, 128) AS v FROM generate_series(1, 40000)";
    let outcome = bounded(
        Duration::from_secs(60),
        move || -> Result<(usize, usize)> {
            let mut feed = Feed::builder(&session, sql)
                .batch_size(1024)
                .prefetch(1)
                .device(Device::Cpu)
                .build()?;
            let mut held = vec![];
            let mut batches = 0;
            let mut pending_while_holding = 0;
            loop {
                // Shorter than the producer's check (8 polls of 25 ms), which
                // counts only the time the loop really blocks in here.
                match feed.next_within(Duration::from_millis(50)) {
                    NextBatch::Ready(batch) => {
                        batches += 1;
                        held.push(batch);
                    }
                    NextBatch::Pending if !held.is_empty() => {
                        // Our own work, four times the producer's 200 ms check,
                        // still holding every batch; then they are released.
                        pending_while_holding += 1;
                        std::thread::sleep(Duration::from_millis(800));
                        held.clear();
                    }
                    NextBatch::Pending => {}
                    NextBatch::Finished => return Ok((batches, pending_while_holding)),
                    NextBatch::Failed(err) => return Err(err),
                }
            }
        },
    );
    let (batches, pending_while_holding) = outcome?;
    assert_eq!(batches, 40, "40000 rows in batches of 1024");
    assert!(
        pending_while_holding > 0,
        "the loop never held every slot: the test did not test"
    );
    Ok(())
}
