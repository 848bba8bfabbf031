//! Elastic resume (issue 33): a checkpoint records the rows of the epoch's
//! order that all ranks together consumed, so it resumes under another world
//! size and batch size with no row fed twice and none skipped within the
//! epoch (but the new shape's pads or drops), and later epochs are a fresh
//! run's; skipped steps leave every other batch where it was.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::device::{Device, TensorBatch};
use sqlfeed::feed::{Checkpoint, Feed, FeedBuilder, OnDataChange};

use crate::common::{
    arc, assert_contains, batch_field, digest_feed, digest_lines, run, sqlfeed,
    succeeded, write_parquet,
};

/// One batch: (epoch, step, ids, next row position).
type Fed = (u64, u64, Vec<i64>, (u64, u64));

/// 1000 ids in 4 files.
fn ids(dir: &Path) -> Result<String> {
    for file in 0..4 {
        let ids = Int64Array::from_iter_values(file * 250..(file + 1) * 250);
        let batch = RecordBatch::try_from_iter(vec![("id", arc(ids))])?;
        write_parquet(&dir.join(format!("part-{file}.parquet")), &batch)?;
    }
    Ok(format!("SELECT id FROM '{}/*.parquet'", dir.display()))
}

/// The small-batch session of the elastic and provenance tests.
pub(crate) fn session() -> Result<Session> {
    Session::builder()
        .target_partitions(2)
        .batch_size(7)
        .memory_limit(256 << 20)
        .build()
}

fn fed(builder: FeedBuilder) -> Result<Vec<Fed>> {
    builder
        .device(Device::Cpu)
        .build()?
        .map(|b| record(&b?))
        .collect()
}

/// What a test keeps of a batch.
fn record(batch: &TensorBatch) -> Result<Fed> {
    let ids = batch.tensor("id")?.as_slice::<i64>()?.to_vec();
    Ok((batch.epoch(), batch.step(), ids, batch.next_row_position()))
}

/// Every rank's batches of a run of `world` ranks of `batch` rows.
fn ranks(world: usize, feed: impl Fn(usize) -> FeedBuilder) -> Result<Vec<Vec<Fed>>> {
    (0..world)
        .map(|rank| fed(feed(rank).shard(rank, world)))
        .collect()
}

/// How often each id was fed in `epoch` over all ranks.
fn counts(runs: &[&[Vec<Fed>]], epoch: u64) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for run in runs {
        for rank in run.iter() {
            for (e, _, ids, _) in rank {
                if *e == epoch {
                    for id in ids {
                        *counts.entry(*id).or_default() += 1;
                    }
                }
            }
        }
    }
    counts
}

#[test]
fn a_checkpoint_resumes_under_another_world_size_and_batch_size() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = ids(dir.path())?;
    let session = session()?;
    let feed = |batch: usize| {
        let (session, sql) = (&session, &sql);
        move |_rank: usize| {
            Feed::builder(session, sql)
                .batch_size(batch)
                .shuffle(5)
                .epochs(2)
        }
    };
    // Two ranks of 64 stop after global step 3: 4 × 128 rows consumed.
    let before: Vec<Vec<Fed>> = ranks(2, feed(64))?
        .into_iter()
        .map(|rank| rank.into_iter().take(4).collect())
        .collect();
    let position = before[0][3].3;
    assert_eq!(position, (0, 512));
    assert_eq!(
        before[1][3].3, position,
        "the position is the same on every rank"
    );
    // The epoch's first rows are the pads of a padded last step.
    let order: Vec<i64> = ranks(1, feed(1000))?[0][0].2.clone();
    for (world, batch, drop_last) in [
        (3, 64, false),
        (2, 96, false),
        (3, 96, false),
        (3, 50, true),
    ] {
        let what = format!("W=2 B=64 → W={world} B={batch} drop_last={drop_last}");
        let resumed = |rank| {
            feed(batch)(rank)
                .drop_last(drop_last)
                .resume_after_rows(position.0, position.1, 0)
        };
        let after = ranks(world, resumed)?;
        let per_rank: Vec<usize> = after
            .iter()
            .map(|r| r.iter().filter(|b| b.0 == 0).count())
            .collect();
        assert!(
            per_rank.iter().all(|&n| n == per_rank[0]),
            "{what}: {per_rank:?}"
        );
        let counts = counts(&[&before, &after], 0);
        let rest = 1000 - 512;
        let chunk = world * batch;
        if drop_last {
            assert!(counts.values().all(|&n| n == 1), "{what}: a row fed twice");
            assert_eq!(
                counts.len(),
                512 + rest / chunk * chunk,
                "{what}: only the tail drops"
            );
        } else {
            assert_eq!(counts.len(), 1000, "{what}: every row is fed");
            let twice: Vec<i64> = counts
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(id, _)| *id)
                .collect();
            let pads = (rest % chunk).div_ceil(world) * world - rest % chunk;
            assert_eq!(
                twice,
                {
                    let mut head = order[..pads].to_vec();
                    head.sort();
                    head
                },
                "{what}: only the epoch's first rows pad the last step"
            );
        }
        // Later epochs are a fresh run's with the new shape.
        let fresh = ranks(world, |rank| feed(batch)(rank).drop_last(drop_last))?;
        for rank in 0..world {
            let later = |run: &[Fed]| -> Vec<Fed> {
                run.iter().filter(|b| b.0 == 1).cloned().collect()
            };
            assert_eq!(later(&after[rank]), later(&fresh[rank]), "{what}: epoch 1");
        }
    }
    Ok(())
}

#[test]
fn resuming_after_the_rows_of_a_step_of_the_same_shape_is_exact() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = ids(dir.path())?;
    let session = session()?;
    let feed = || two_shuffled_epochs(&session, &sql, 9).shard(1, 3);
    // Token budgets pack rows of 1-5 tokens: their steps depend on the rows
    // before them, and greedy packing restarts at a step boundary exactly.
    let tokens = format!(
        "SELECT id, array_repeat(id, CAST(id % 5 + 1 AS INT)) AS tokens FROM ({sql})"
    );
    let token_feed = || two_shuffled_epochs(&session, &tokens, 9).shard(1, 3);
    for builder in [
        &(|| feed().batch_size(40)) as &dyn Fn() -> FeedBuilder,
        &|| token_feed().batch_tokens(37),
    ] {
        let whole = fed(builder())?;
        for k in [0, 3, 7] {
            let (epoch, rows) = whole[k].3;
            let resumed = fed(builder().resume_after_rows(epoch, rows, whole[k].1 + 1))?;
            assert_eq!(resumed, whole[k + 1..].to_vec(), "after step {k}");
        }
    }
    let err = fed(feed().batch_size(40).resume_after_rows(0, 1001, 0)).unwrap_err();
    assert!(err.to_string().contains("only 1000 rows"), "{err}");
    Ok(())
}

#[test]
fn skipped_steps_leave_every_other_batch_where_it_was() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = ids(dir.path())?;
    let session = session()?;
    let feed = || two_shuffled_epochs(&session, &sql, 3).batch_size(64);
    let whole = fed(feed())?;
    let last = whole.iter().filter(|b| b.0 == 0).count() as u64 - 1;
    let skipped = fed(feed().skip_steps(0, [2, 3, last]).skip_steps(1, [0]))?;
    let expected: Vec<Fed> = whole
        .iter()
        .filter(|b| {
            let skipped =
                (b.0 == 0 && [2, 3, last].contains(&b.1)) || (b.0 == 1 && b.1 == 0);
            !skipped
        })
        .cloned()
        .collect();
    let without_positions = |run: &[Fed]| -> Vec<(u64, u64, Vec<i64>)> {
        run.iter()
            .map(|(e, s, ids, _)| (*e, *s, ids.clone()))
            .collect()
    };
    assert_eq!(without_positions(&skipped), without_positions(&expected));
    // The epoch's last batch handed over ends it, though its step was not
    // the epoch's last.
    let end = skipped.iter().rposition(|b| b.0 == 0).expect("epoch 0");
    assert_eq!(skipped[end].3, (1, 0));
    Ok(())
}

#[test]
fn the_cli_prints_row_positions_and_resumes_from_them_under_another_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sql = ids(dir.path()).expect("data");
    let digest_lines = |args: &[&str]| -> Vec<String> {
        let out = succeeded(run(digest_feed(&sql)
            .args(["--shuffle-seed", "4"])
            .args(args)));
        digest_lines(&out)
    };
    let two = digest_lines(&["--batch-size", "50", "--shard", "0/2"]);
    let position = batch_field(&two[2], "resume_rows=");
    assert_eq!(position, "0:300");
    let mut fed_once = HashMap::new();
    for rank in 0..3 {
        let shard = format!("{rank}/3");
        let lines = digest_lines(&[
            "--batch-size",
            "70",
            "--shard",
            &shard,
            "--resume-rows",
            &position,
        ]);
        assert_eq!(lines.len(), 4, "700 rows in steps of 210: 3 full, 1 padded");
        fed_once.insert(rank, lines.len());
    }
    let skipped = digest_lines(&[
        "--batch-size",
        "50",
        "--shard",
        "0/2",
        "--skip-steps",
        "0:1,2",
    ]);
    let digests = |lines: &[String]| -> Vec<String> {
        lines.iter().map(|l| batch_field(l, "digest=")).collect()
    };
    let mut expected = digests(&two);
    expected.drain(1..3);
    assert_eq!(digests(&skipped), expected);
    let (ok, _, err) = run(sqlfeed().args(["feed", &sql, "--skip-steps", "x"]));
    assert!(
        !ok && err.contains("--skip-steps 'x' should look like EPOCH:S1,S2"),
        "{err}"
    );
}

/// A feed of `sql` over two epochs shuffled with `seed`.
fn two_shuffled_epochs(session: &Session, sql: &str, seed: u64) -> FeedBuilder {
    Feed::builder(session, sql).shuffle(seed).epochs(2)
}

/// [`two_shuffled_epochs`] in a shape: `|batch size, rank, world|`.
fn in_shape<'a>(
    session: &'a Session,
    sql: &'a str,
    seed: u64,
) -> impl Fn(usize, usize, usize) -> FeedBuilder + 'a {
    move |batch, rank, world| {
        two_shuffled_epochs(session, sql, seed)
            .batch_size(batch)
            .shard(rank, world)
    }
}

/// `scheme://host/path` of the files `sql` reads, as a checkpoint lists them.
fn manifest(session: &Session, sql: &str) -> Result<Vec<String>> {
    let runtime = tokio::runtime::Runtime::new()?;
    let files = runtime.block_on(sqlfeed::feed::input_files(session, sql))?;
    Ok(files.into_iter().map(|f| f.location).collect())
}

#[test]
fn an_epoch_continues_over_appended_files_without_feeding_a_row_twice() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = ids(dir.path())?;
    let session = session()?;
    let feed = in_shape(&session, &sql, 6);
    // Two ranks of 64 stop after global step 2: 384 rows consumed.
    let before: Vec<Vec<Fed>> = ranks(2, |rank| feed(64, rank, 2))?
        .into_iter()
        .map(|rank| rank.into_iter().take(3).collect())
        .collect();
    let (epoch, rows) = before[0][2].3;
    assert_eq!((epoch, rows), (0, 384));
    let old_files = manifest(&session, &sql)?;
    // A fifth file, ids 1000..1250, is appended; three ranks of 50 go on.
    let added = Int64Array::from_iter_values(1000..1250);
    write_parquet(
        &dir.path().join("part-4.parquet"),
        &RecordBatch::try_from_iter(vec![("id", arc(added))])?,
    )?;
    let continued = |rank: usize| {
        feed(50, rank, 3).continue_over_appended(epoch, old_files.clone(), rows)
    };
    let after = ranks(3, continued)?;
    let per_rank: Vec<usize> = after
        .iter()
        .map(|r| r.iter().filter(|b| b.0 == 0).count())
        .collect();
    assert_eq!(per_rank, [6, 6, 6], "866 rows in steps of 150: 6 per rank");
    let counts = counts(&[&before, &after], 0);
    assert_eq!(counts.len(), 1250, "every old and new row is fed");
    let twice: Vec<&i64> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id)
        .collect();
    // 866 = 5 × 150 + 116: the last step is padded to 117 with the
    // continued order's first row.
    assert_eq!(twice.len(), 1, "only a pad is fed twice: {twice:?}");
    let first_continued = after[0][0].2[0];
    assert_eq!(*twice[0], first_continued);
    // The continued order mixes new and old rows from its first batch.
    let first_step: Vec<i64> = after.iter().flat_map(|r| r[0].2.clone()).collect();
    let new = first_step.iter().filter(|id| **id >= 1000).count();
    assert!(
        (15..75).contains(&new),
        "{new} of 150 rows new (expected ≈ 43)"
    );
    // Epoch 1 is a fresh run's over all five files.
    let fresh = ranks(3, |rank| feed(50, rank, 3))?;
    for rank in 0..3 {
        let later = |run: &[Fed]| -> Vec<Fed> {
            run.iter().filter(|b| b.0 == 1).cloned().collect()
        };
        assert_eq!(later(&after[rank]), later(&fresh[rank]), "epoch 1");
    }
    // A checkpoint inside the continued epoch resumes it exactly.
    let (_, rows_in) = after[1][2].3;
    let resumed = fed(continued(1).resume_after_rows(epoch, rows_in, 3))?;
    assert_eq!(resumed, after[1][3..].to_vec());
    // A query that reads its files twice, a removed old file, an unshuffled
    // feed: refused, saying why.
    let twice = Feed::builder(&session, format!("{sql} UNION ALL {sql}"))
        .shuffle(6)
        .continue_over_appended(epoch, old_files.clone(), rows);
    let err = fed(twice).unwrap_err().to_string();
    assert!(err.contains("in more than one scan"), "{err}");
    std::fs::remove_file(dir.path().join("part-2.parquet"))?;
    let err = fed(continued(0)).unwrap_err().to_string();
    assert_contains(&err, &["part-2.parquet", "no longer read"]);
    let err = fed(Feed::builder(&session, &sql).continue_over_appended(
        0,
        old_files.clone(),
        rows,
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("unshuffled feed cannot continue"), "{err}");
    Ok(())
}

/// Rows left in the continued epoch of the test below: 1250 ids less the
/// 384 consumed, or with the filter 1000 kept less 384.
fn expected_rest(unfiltered: bool) -> usize {
    if unfiltered { 1250 - 384 } else { 1000 - 384 }
}

/// An epoch shuffled by position goes on over appended files too: new
/// files move every old position, so the consumed rows are the first ones
/// of the order over the old files alone, and the rest (the old rows not
/// consumed, filtered out at the scan, and every new row) is shuffled by
/// position anew. The new file's path sorts among the old ones (every old
/// file after it changes rank), with and without a filter (whose rows the
/// placement counts).
#[test]
fn an_epoch_by_position_continues_over_appended_files_without_feeding_a_row_twice()
-> Result<()> {
    for filter in ["", " WHERE id % 5 <> 2"] {
        let dir = tempfile::tempdir()?;
        let sql = format!("{}{filter}", ids(dir.path())?);
        let kept = |id: &i64| filter.is_empty() || id % 5 != 2;
        let session = session()?;
        let feed = |batch: usize, rank: usize, world: usize| {
            Feed::builder(&session, &sql)
                .shuffle(6)
                .shuffle_by_position()
                .epochs(2)
                .batch_size(batch)
                .shard(rank, world)
        };
        // Two ranks of 64 stop after global step 2: 384 rows consumed.
        let before: Vec<Vec<Fed>> = ranks(2, |rank| feed(64, rank, 2))?
            .into_iter()
            .map(|rank| rank.into_iter().take(3).collect())
            .collect();
        let (epoch, rows) = before[0][2].3;
        assert_eq!((epoch, rows), (0, 384));
        let old_files = manifest(&session, &sql)?;
        // part-00 sorts between part-0 and part-1.
        let added = Int64Array::from_iter_values(1000..1250);
        write_parquet(
            &dir.path().join("part-00.parquet"),
            &RecordBatch::try_from_iter(vec![("id", arc(added))])?,
        )?;
        let continued = |rank: usize| {
            feed(50, rank, 3).continue_over_appended(epoch, old_files.clone(), rows)
        };
        let after = ranks(3, continued)?;
        let counts = counts(&[&before, &after], 0);
        let missing: Vec<i64> = (0..1250)
            .filter(|id| kept(id) && !counts.contains_key(id))
            .collect();
        let strays: Vec<&i64> = counts.keys().filter(|id| !kept(id)).collect();
        assert!(
            missing.is_empty() && strays.is_empty(),
            "every old and new row is fed{filter}: missing {missing:?}, filtered out \
             yet fed {strays:?}"
        );
        let twice = counts.values().filter(|n| **n > 1).count();
        assert!(twice <= 2, "only pads are fed twice{filter}: {twice}");
        // The continued order mixes new and old rows from its first batch.
        let first_step: Vec<i64> = after.iter().flat_map(|r| r[0].2.clone()).collect();
        let new = first_step.iter().filter(|id| **id >= 1000).count();
        assert!(
            (15..90).contains(&new),
            "{new} of 150 rows new{filter} (expected about 40 to 50)"
        );
        // Epoch 1 is a fresh run's over all five files.
        let fresh = ranks(3, |rank| feed(50, rank, 3))?;
        for rank in 0..3 {
            let later = |run: &[Fed]| -> Vec<Fed> {
                run.iter().filter(|b| b.0 == 1).cloned().collect()
            };
            assert_eq!(later(&after[rank]), later(&fresh[rank]), "epoch 1{filter}");
        }
        // A checkpoint inside the continued epoch resumes it exactly.
        let (_, rows_in) = after[1][2].3;
        let resumed = fed(continued(1).resume_after_rows(epoch, rows_in, 3))?;
        assert_eq!(resumed, after[1][3..].to_vec(), "resumed{filter}");
        // Rows by position follow the continuation: row i of the continued
        // epoch is the i-th row the ranks were fed, step by step.
        let steps = after[0].iter().filter(|b| b.0 == 0).count();
        let delivered: Vec<i64> = (0..steps)
            .flat_map(|step| after.iter().flat_map(move |rank| rank[step].2.clone()))
            .collect();
        let dataset = continued(0).dataset(epoch)?;
        let len = dataset.len()?;
        assert_eq!(
            len as usize,
            expected_rest(filter.is_empty()),
            "len{filter}"
        );
        let positions: Vec<u64> = (0..len).collect();
        let rows = dataset.rows(&positions)?;
        let ids = rows
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .expect("ids")
            .values()
            .to_vec();
        assert_eq!(ids, delivered[..len as usize], "rows by position{filter}");
    }
    Ok(())
}

/// Every batch of `feed` after the first `taken` and the feed's checkpoint
/// after them, as a run stopped there would leave it.
fn taken_and_checkpoint(
    builder: FeedBuilder,
    taken: usize,
) -> Result<(Vec<Fed>, Checkpoint)> {
    let mut feed = builder.device(Device::Cpu).build()?;
    let mut out = vec![];
    for _ in 0..taken {
        out.push(record(&feed.next().expect("a batch")?)?);
    }
    Ok((out, feed.checkpoint()?))
}

#[test]
fn a_checkpoint_resumes_another_shape_and_refuses_another_query_or_seed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = ids(dir.path())?;
    let session = session()?;
    let feed = in_shape(&session, &sql, 5);
    // Before any batch the checkpoint is the feed's start.
    let (_, start) = taken_and_checkpoint(feed(64, 0, 2), 0)?;
    assert_eq!((start.epoch, start.step, start.rows), (0, 0, Some(0)));
    assert_eq!(start.data.as_ref().map(Vec::len), Some(4));
    // Two ranks of 64 stop after global step 3; their checkpoints are one.
    let (_, zero) = taken_and_checkpoint(feed(64, 0, 2), 4)?;
    let (_, one) = taken_and_checkpoint(feed(64, 1, 2), 4)?;
    assert_eq!((zero.epoch, zero.step, zero.rows), (0, 4, Some(512)));
    assert_eq!(Checkpoint { rank: 0, ..one }, zero);
    let checkpoint = Checkpoint::from_json(&zero.to_json(), "rank 0's checkpoint")?;
    // Same shape: exactly the uninterrupted run's next batches.
    let uninterrupted = fed(feed(64, 1, 2))?;
    let resumed =
        fed(feed(64, 1, 2).resume_from(checkpoint.clone(), OnDataChange::Error))?;
    assert_eq!(resumed, uninterrupted[4..].to_vec());
    // Three ranks of 96: the rows after the 512th, as resume_after_rows cuts
    // them (whose exactness a_checkpoint_resumes_under_another_world_size…
    // checks row by row); 512 rows are step 1 of 288-row steps.
    for rank in 0..3 {
        let resumed =
            fed(feed(96, rank, 3).resume_from(checkpoint.clone(), OnDataChange::Error))?;
        let by_rows = fed(feed(96, rank, 3).resume_after_rows(0, 512, 1))?;
        assert_eq!(resumed, by_rows, "rank {rank} of 3");
    }
    // Another seed or query: refused, saying what differs.
    let err = fed(feed(64, 0, 2)
        .shuffle(6)
        .resume_from(checkpoint.clone(), OnDataChange::Continue))
    .unwrap_err()
    .to_string();
    assert!(err.contains("seed=5 but this feed has seed=6"), "{err}");
    let err = fed(Feed::builder(&session, format!("{sql} WHERE id > 3"))
        .shuffle(5)
        .resume_from(checkpoint.clone(), OnDataChange::Error))
    .unwrap_err()
    .to_string();
    assert_contains(&err, &["query=", "same query and seed"]);

    // A fifth file is appended.
    let added = Int64Array::from_iter_values(1000..1250);
    write_parquet(
        &dir.path().join("part-4.parquet"),
        &RecordBatch::try_from_iter(vec![("id", arc(added))])?,
    )?;
    let err = fed(feed(64, 0, 2).resume_from(checkpoint.clone(), OnDataChange::Error))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("1 added: file:")
            && err.contains("part-4.parquet")
            && err.contains("--on-data-change continue"),
        "{err}"
    );
    // Restarting the epoch is a fresh run's epoch over five files.
    let restarted =
        fed(feed(64, 0, 2).resume_from(checkpoint.clone(), OnDataChange::RestartEpoch))?;
    assert_eq!(restarted, fed(feed(64, 0, 2))?);
    // Continuing is continue_over_appended with the checkpoint's files.
    let old_files: Vec<String> = checkpoint
        .data
        .iter()
        .flatten()
        .map(|f| f.0.location.clone())
        .collect();
    let continued = |rank: usize| {
        feed(50, rank, 3).resume_from(checkpoint.clone(), OnDataChange::Continue)
    };
    let (first, inside) = taken_and_checkpoint(continued(2), 2)?;
    let by_files = fed(feed(50, 2, 3).continue_over_appended(0, old_files, 512))?;
    assert_eq!(first, by_files[..2].to_vec());
    // A checkpoint inside the continued epoch records the continuation and
    // the five files, so it resumes over them without a word.
    let appended = inside.appended.clone().expect("a continuation");
    assert_eq!(
        (appended.epoch, appended.rows, appended.data.len()),
        (0, 512, 4)
    );
    assert_eq!(inside.data.as_ref().map(Vec::len), Some(5));
    let rest = fed(feed(50, 2, 3).resume_from(inside, OnDataChange::Error))?;
    assert_eq!(rest, by_files[2..].to_vec());
    // A changed old file cannot be continued over.
    write_parquet(
        &dir.path().join("part-1.parquet"),
        &RecordBatch::try_from_iter(vec![("id", arc(Int64Array::from(vec![1, 2])))])?,
    )?;
    let err = fed(continued(0)).unwrap_err().to_string();
    assert!(
        err.contains("1 changed (size or modification time): file:")
            && err.contains("part-1.parquet")
            && err.contains("only added files"),
        "{err}"
    );
    Ok(())
}

#[test]
fn the_cli_saves_a_checkpoint_and_resumes_it_under_another_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sql = ids(dir.path()).expect("data");
    let checkpoint = dir.path().join("checkpoint.json");
    let checkpoint = checkpoint.to_str().expect("utf-8 path");
    let seeded = |seed: &str, args: &[&str]| -> (bool, Vec<String>, String) {
        let (ok, out, err) =
            run(digest_feed(&sql).args(["--shuffle-seed", seed]).args(args));
        let lines = out
            .lines()
            .filter(|l| l.starts_with("batch "))
            .map(|l| l.split(" resume_rows").next().unwrap_or(l).to_string())
            .collect();
        (ok, lines, err)
    };
    let feed = |args: &[&str]| seeded("4", args);
    succeeded(feed(&[
        "--batch-size",
        "50",
        "--shard",
        "0/2",
        "--max-batches",
        "3",
        "--save-checkpoint",
        checkpoint,
    ]));
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(checkpoint).expect("written"))
            .expect("JSON");
    assert_eq!(
        (saved["epoch"].as_u64(), saved["rows"].as_u64()),
        (Some(0), Some(300))
    );
    for rank in 0..3 {
        let shard = format!("{rank}/3");
        let shape = ["--batch-size", "70", "--shard", &shard];
        let (ok, resumed, err) =
            feed(&[&shape[..], &["--resume-from", checkpoint]].concat());
        assert!(ok, "{err}");
        let (ok, by_rows, err) =
            feed(&[&shape[..], &["--resume-rows", "0:300"]].concat());
        assert!(ok, "{err}");
        assert_eq!(resumed, by_rows, "rank {rank} of 3");
        assert_eq!(
            resumed.len(),
            4,
            "700 rows in steps of 210: 3 full, 1 padded"
        );
    }
    // Another seed is refused; a file that is not a checkpoint is named.
    let (ok, _, err) = seeded("9", &["--resume-from", checkpoint]);
    assert!(
        !ok && err.contains("seed=4 but this feed has seed=9"),
        "{err}"
    );
    let not_one = dir.path().join("part-0.parquet");
    let not_one = not_one.to_str().expect("utf-8 path");
    let (ok, _, err) = feed(&["--resume-from", not_one]);
    assert!(
        !ok && err.contains("is not a sqlfeed feed checkpoint"),
        "{err}"
    );
    let (ok, _, err) = feed(&["--resume-from", checkpoint, "--on-data-change", "skip"]);
    assert!(
        !ok && err.contains("expected 'error', 'restart_epoch' or 'continue'"),
        "{err}"
    );
}
