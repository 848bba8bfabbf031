//! Batch provenance (issue 33, item 4): `explain_batch` names the file, row
//! group and row of every row of a batch, and they are the rows the feed
//! hands over there, without running the query's preprocessing.

use std::path::Path;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::error::Result;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use sqlfeed::Session;
use sqlfeed::device::Device;
use sqlfeed::feed::{BatchOrigins, Feed, FeedBuilder, OnDataChange};

use crate::common::{arc, assert_contains, run, sqlfeed};
use crate::elastic::session;

/// Rows per file and per row group of [`ids`].
const FILE_ROWS: i64 = 250;
const GROUP_ROWS: usize = 100;

/// 1000 ids in 4 files of 3 row groups: id = 250 × file + row in file.
fn ids(dir: &Path) -> Result<()> {
    for file in 0..4 {
        ids_file(dir, file)?;
    }
    Ok(())
}

/// `part-{file}.parquet`: ids 250 × file + row, in row groups of 100.
fn ids_file(dir: &Path, file: i64) -> Result<()> {
    let ids = Int64Array::from_iter_values(file * FILE_ROWS..(file + 1) * FILE_ROWS);
    let batch = RecordBatch::try_from_iter(vec![("id", arc(ids))])?;
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .build();
    let out = std::fs::File::create(dir.join(format!("part-{file}.parquet")))?;
    let mut writer = ArrowWriter::try_new(out, batch.schema(), Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}

/// The id each origin names, checking its row group on the way.
fn origin_ids(origins: &BatchOrigins) -> Vec<i64> {
    origins
        .rows
        .iter()
        .map(|origin| {
            let name = origin.file.rsplit('/').next().unwrap_or_default();
            let file: i64 = name
                .trim_start_matches("part-")
                .trim_end_matches(".parquet")
                .parse()
                .unwrap_or_else(|_| panic!("unexpected file {}", origin.file));
            assert!(origin.file.starts_with("file:/"), "{}", origin.file);
            assert_eq!(
                origin.row_group,
                origin.row as usize / GROUP_ROWS,
                "{origin:?}"
            );
            file * FILE_ROWS + origin.row as i64
        })
        .collect()
}

/// Every batch the feed hands over: (epoch, step, ids).
fn fed(builder: FeedBuilder) -> Result<Vec<(u64, u64, Vec<i64>)>> {
    let mut out = vec![];
    for batch in builder.device(Device::Cpu).build()? {
        let batch = batch?;
        let ids = batch.tensor("id")?.as_slice::<i64>()?.to_vec();
        out.push((batch.epoch(), batch.step(), ids));
    }
    Ok(out)
}

/// Checks that `explain_batch` gives the ids of every batch `builder` feeds.
fn check_every_batch(builder: &FeedBuilder) -> Result<usize> {
    let batches = fed(builder.clone())?;
    assert!(!batches.is_empty());
    for (epoch, step, ids) in &batches {
        let origins = builder.explain_batch(*epoch, *step)?;
        assert_eq!((origins.epoch, origins.step), (*epoch, *step));
        assert_eq!(&origin_ids(&origins), ids, "epoch {epoch} step {step}");
    }
    Ok(batches.len())
}

#[test]
fn explained_rows_are_the_rows_of_the_batch() -> Result<()> {
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let session = session()?;
    let glob = format!("{}/*.parquet", dir.path().display());
    // Shuffled, two ranks, a padded last step (1000 = 7 × 128 + 104), two
    // epochs (another order each); and the same query unshuffled, filtered.
    for rank in 0..2 {
        let shuffled = Feed::builder(&session, format!("SELECT id FROM '{glob}'"))
            .shuffle(11)
            .batch_size(64)
            .shard(rank, 2)
            .epochs(2);
        assert_eq!(check_every_batch(&shuffled)?, 2 * 8);
    }
    let filtered = Feed::builder(
        &session,
        format!("SELECT id FROM '{glob}' WHERE id % 3 <> 0 ORDER BY id DESC"),
    )
    .batch_size(50)
    .drop_last(true)
    .shard(2, 3);
    assert_eq!(check_every_batch(&filtered)?, 666 / 150);
    let unordered = Feed::builder(
        &session,
        format!("SELECT id, id * 2 AS twice FROM '{glob}'"),
    )
    .batch_size(33)
    .shard(1, 2);
    check_every_batch(&unordered)?;
    Ok(())
}

/// A feed shuffled by position is explained through its order: the
/// origin columns ride through `SHUFFLE BY POSITION` without changing it
/// (it ranks rows by file and row index, not content); two ranks, two
/// epochs, with and without a filter.
#[test]
fn batches_shuffled_by_position_are_explained() -> Result<()> {
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let session = session()?;
    let glob = format!("{}/*.parquet", dir.path().display());
    for (rank, sql, steps) in [
        (0, format!("SELECT id FROM '{glob}'"), 2 * 8),
        (
            1,
            format!("SELECT id FROM '{glob}' WHERE id % 3 <> 0"),
            2 * 6,
        ),
    ] {
        let by_position = Feed::builder(&session, sql)
            .shuffle(5)
            .shuffle_by_position()
            .batch_size(64)
            .shard(rank, 2)
            .epochs(2);
        assert_eq!(check_every_batch(&by_position)?, steps);
    }
    Ok(())
}

/// A windowed shuffle's batches are explained as the feed cuts them: the
/// origins query runs through the same windows (row groups of 100 and 50
/// rows, windows of 300; each row group read through a byte range, whose
/// `file_row_index` is still the file's row).
#[test]
fn batches_of_a_windowed_shuffle_are_explained() -> Result<()> {
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let session = session()?;
    let glob = format!("{}/*.parquet", dir.path().display());
    for (rank, sql) in [
        (0, format!("SELECT id FROM '{glob}'")),
        (1, format!("SELECT id FROM '{glob}' WHERE id % 3 <> 0")),
    ] {
        let windowed = Feed::builder(&session, sql)
            .shuffle(5)
            .shuffle_window(300)
            .batch_size(40)
            .shard(rank, 2)
            .epochs(2);
        assert!(check_every_batch(&windowed)? >= 2 * 8);
    }
    Ok(())
}

/// Issue 56, item 1: over repeated rows the explained rows hold the values
/// of the batch at each position (the feed spreads copies; explaining put
/// them side by side), and no row is named twice in an epoch.
#[test]
fn explained_copies_of_repeated_rows_are_in_the_batch_where_the_feed_puts_them()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    // Two files of 500 rows, v = i % 700 over i in 0..1000: 300 values
    // twice (copies in one file and across the two), 400 once.
    for file in 0..2i64 {
        let values =
            Int64Array::from_iter_values((file * 500..(file + 1) * 500).map(|i| i % 700));
        let batch = RecordBatch::try_from_iter(vec![("v", arc(values))])?;
        let out = std::fs::File::create(dir.path().join(format!("part-{file}.parquet")))?;
        let mut writer = ArrowWriter::try_new(out, batch.schema(), None)?;
        writer.write(&batch)?;
        writer.close()?;
    }
    let value_at = |origin: &sqlfeed::feed::RowOrigin| -> i64 {
        let file: i64 = if origin.file.ends_with("part-1.parquet") {
            1
        } else {
            0
        };
        (file * 500 + origin.row as i64) % 700
    };
    let session = session()?;
    let glob = format!("{}/*.parquet", dir.path().display());
    for (seed, world) in [(7, 1), (3, 2)] {
        for rank in 0..world {
            let builder = Feed::builder(&session, format!("SELECT v FROM '{glob}'"))
                .shuffle(seed)
                .batch_size(100)
                .shard(rank, world)
                .epochs(2);
            let mut named = std::collections::HashSet::new();
            for batch in builder.clone().device(Device::Cpu).build()? {
                let batch = batch?;
                let fed = batch.tensor("v")?.as_slice::<i64>()?.to_vec();
                let origins = builder.explain_batch(batch.epoch(), batch.step())?;
                let explained: Vec<i64> = origins.rows.iter().map(value_at).collect();
                assert_eq!(
                    explained,
                    fed,
                    "seed {seed} rank {rank}/{world} epoch {} step {}",
                    batch.epoch(),
                    batch.step()
                );
                for origin in origins.rows {
                    assert!(
                        named.insert((batch.epoch(), origin.file.clone(), origin.row)),
                        "{origin:?} named twice in epoch {}",
                        batch.epoch()
                    );
                }
            }
        }
    }
    Ok(())
}

#[test]
fn explained_batches_follow_an_elastic_resume_and_a_folder_glob() -> Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::create_dir_all(dir.path().join("day=1"))?;
    ids(&dir.path().join("day=1"))?;
    let session = session()?;
    // A wildcard in a folder makes the table a view over the folders' files.
    let sql = format!("SELECT id FROM '{}/day=*/*.parquet'", dir.path().display());
    let resumed = Feed::builder(&session, sql)
        .shuffle(5)
        .batch_size(40)
        .shard(2, 3)
        .resume_after_rows(0, 333, 2);
    assert_eq!(
        check_every_batch(&resumed)?,
        (1000 - 333usize).div_ceil(120)
    );
    Ok(())
}

#[test]
fn batches_of_an_epoch_continued_over_appended_data_are_explained() -> Result<()> {
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let session = session()?;
    let sql = format!("SELECT id FROM '{}/*.parquet'", dir.path().display());
    // By content, then by position (the consumed rows left out by a filter
    // at the scan instead of an anti join).
    for by_position in [false, true] {
        let feed = |rank: usize| {
            let feed = Feed::builder(&session, &sql)
                .shuffle(8)
                .batch_size(40)
                .epochs(2)
                .shard(rank, 2);
            if by_position {
                feed.shuffle_by_position()
            } else {
                feed
            }
        };
        // Rank 0 stops after 3 global steps (240 rows); a fifth file arrives.
        let mut stopped = feed(0).device(Device::Cpu).build()?;
        for _ in 0..3 {
            stopped.next().expect("a batch")?;
        }
        let checkpoint = stopped.checkpoint()?;
        drop(stopped);
        ids_file(dir.path(), 4)?;
        // Epoch 0 goes on over 1010 rows, epoch 1 over 1250.
        let continued = feed(1).resume_from(checkpoint, OnDataChange::Continue);
        assert_eq!(
            check_every_batch(&continued)?,
            (1250 - 240usize).div_ceil(80) + 1250usize.div_ceil(80),
            "by position: {by_position}"
        );
        std::fs::remove_file(dir.path().join("part-4.parquet"))?;
    }
    Ok(())
}

#[test]
fn explaining_runs_no_preprocessing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let session = session()?;
    // Every row's `broken` fails to compute, so the feed itself fails; its
    // batches' origins need only `id` and are still explained.
    let sql = format!(
        "SELECT id, CAST(CAST(id AS VARCHAR) || 'x' AS BIGINT) AS broken \
         FROM '{}/*.parquet'",
        dir.path().display()
    );
    for shuffle in [None, Some(3)] {
        let mut builder = Feed::builder(&session, &sql).batch_size(64);
        if let Some(seed) = shuffle {
            builder = builder.shuffle(seed);
        }
        let err = fed(builder.clone()).expect_err("the feed computes `broken`");
        assert!(err.to_string().contains("Cannot cast"), "{err}");
        let origins = builder.explain_batch(0, 3)?;
        assert_eq!(origins.rows.len(), 64);
        let ids = origin_ids(&origins);
        if shuffle.is_none() {
            // Unshuffled: 4 lanes over the 4 files, taken in turns of the
            // session's 7-row batches.
            assert!(ids.iter().all(|id| (0..1000).contains(id)), "{ids:?}");
        }
    }
    Ok(())
}

#[test]
fn what_cannot_be_explained_says_why() -> Result<()> {
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let session = session()?;
    let glob = format!("{}/*.parquet", dir.path().display());
    let plain =
        Feed::builder(&session, format!("SELECT id FROM '{glob}'")).batch_size(100);
    let err = plain
        .explain_batch(0, 10)
        .expect_err("10 steps of 100 rows");
    assert!(err.to_string().contains("has no step 10"), "{err}");
    let err = plain
        .clone()
        .skip_steps(0, [4])
        .explain_batch(0, 4)
        .expect_err("skipped");
    assert!(err.to_string().contains("is skipped"), "{err}");
    let grouped = Feed::builder(
        &session,
        format!("SELECT id % 10 AS id FROM '{glob}' GROUP BY id % 10 ORDER BY 1"),
    )
    .batch_size(4);
    let err = grouped.explain_batch(0, 0).expect_err("aggregated rows");
    assert!(err.to_string().contains("Aggregate"), "{err}");
    Ok(())
}

#[test]
fn batches_cut_by_length_and_unions_are_explained() -> Result<()> {
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let session = session()?;
    let glob = format!("{}/*.parquet", dir.path().display());
    // 1..=17 tokens per row, computed in SQL: the batcher measures them.
    let tokens = format!(
        "SELECT id, array_repeat(CAST(id AS INT), CAST(id % 17 + 1 AS BIGINT)) AS tokens \
         FROM '{glob}'"
    );
    let budget = Feed::builder(&session, &tokens)
        .shuffle(4)
        .batch_tokens(256)
        .shard(1, 2);
    let bucketed = Feed::builder(&session, &tokens)
        .shuffle(4)
        .batch_size(24)
        .bucket_by_length(4)
        .shard(0, 2);
    for builder in [budget, bucketed] {
        let batches = fed(builder.clone())?;
        assert!(batches.len() > 10);
        for (epoch, step, ids) in batches.iter().step_by(5) {
            let origins = builder.explain_batch(*epoch, *step)?;
            assert_eq!(&origin_ids(&origins), ids, "step {step}");
        }
    }
    // UNION ALL of two filtered halves, shuffled.
    let union = Feed::builder(
        &session,
        format!(
            "SELECT id FROM '{glob}' WHERE id < 400 UNION ALL \
             SELECT id FROM '{glob}' WHERE id >= 400 AND id % 2 = 0"
        ),
    )
    .shuffle(8)
    .batch_size(32);
    assert_eq!(check_every_batch(&union)?, 700usize.div_ceil(32));
    Ok(())
}

#[test]
fn an_explained_batch_piped_into_head_is_not_an_error() -> Result<()> {
    use std::io::Read;
    use std::process::Stdio;
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let sql = format!("SELECT id FROM '{}/*.parquet'", dir.path().display());
    // One batch of all 1000 rows: ~70 KB of lines, more than a pipe holds.
    let mut child = sqlfeed()
        .args(["feed", &sql, "--batch-size", "1000", "--explain", "0:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 64];
    stdout.read_exact(&mut first)?;
    drop(stdout);
    let output = child.wait_with_output()?;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

#[test]
fn the_cli_explains_a_batch_of_another_rank() -> Result<()> {
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let sql = format!("SELECT id FROM '{}/*.parquet'", dir.path().display());
    let (ok, out, err) = run(sqlfeed().args([
        "feed",
        &sql,
        "--shuffle-seed",
        "9",
        "--batch-size",
        "16",
        "--shard",
        "0/2",
        "--explain",
        "0:5:1",
    ]));
    assert!(ok, "{err}");
    assert_contains(&err, &["batch epoch=0 step=5 rank=1: 16 rows"]);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("position\tfile\trow_group\trow"));
    let cli: Vec<(String, u64)> = lines
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            (
                fields[1].to_string(),
                fields[3].parse().expect("a row index"),
            )
        })
        .collect();
    let session = Session::try_new()?;
    let api = Feed::builder(&session, &sql)
        .shuffle(9)
        .batch_size(16)
        .shard(1, 2)
        .explain_batch(0, 5)?;
    let api: Vec<(String, u64)> = api.rows.into_iter().map(|r| (r.file, r.row)).collect();
    assert_eq!(cli, api);
    let (ok, _, err) = run(sqlfeed().args(["feed", &sql, "--explain", "0:x"]));
    assert!(!ok);
    assert!(err.contains("should look like EPOCH:STEP"), "{err}");
    Ok(())
}

/// A cluster feed's batches are explained on the embedded engine: the
/// order is a function of (query, data, seed, epoch), not of the engine.
#[cfg(feature = "ballista")]
#[test]
fn batches_of_a_cluster_feed_are_explained() -> Result<()> {
    let dir = tempfile::tempdir()?;
    ids(dir.path())?;
    let session = Session::builder()
        .cluster("standalone")
        .target_partitions(2)
        .build()?;
    let sql = format!("SELECT id FROM '{}/*.parquet'", dir.path().display());
    for rank in 0..2 {
        let feed = Feed::builder(&session, &sql)
            .shuffle(21)
            .batch_size(100)
            .drop_last(true)
            .run_id("provenance")
            .shard(rank, 2);
        assert_eq!(check_every_batch(&feed)?, 5);
    }
    Ok(())
}
