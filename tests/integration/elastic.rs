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
use sqlfeed::device::Device;
use sqlfeed::feed::{Feed, FeedBuilder};

use crate::common::{arc, run, sqlfeed, write_parquet};

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
    let mut out = vec![];
    for batch in builder.device(Device::Cpu).build()? {
        let batch = batch?;
        let ids = batch.tensor("id")?.as_slice::<i64>()?.to_vec();
        out.push((batch.epoch(), batch.step(), ids, batch.next_row_position()));
    }
    Ok(out)
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
    let feed = || {
        Feed::builder(&session, &sql)
            .shard(1, 3)
            .shuffle(9)
            .epochs(2)
    };
    // Token budgets pack rows of 1-5 tokens: their steps depend on the rows
    // before them, and greedy packing restarts at a step boundary exactly.
    let tokens = format!(
        "SELECT id, array_repeat(id, CAST(id % 5 + 1 AS INT)) AS tokens FROM ({sql})"
    );
    let token_feed = || {
        Feed::builder(&session, &tokens)
            .shard(1, 3)
            .shuffle(9)
            .epochs(2)
    };
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
    let feed = || {
        Feed::builder(&session, &sql)
            .batch_size(64)
            .shuffle(3)
            .epochs(2)
    };
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
        let mut command = sqlfeed();
        command
            .args([
                "feed",
                &sql,
                "--device",
                "cpu",
                "--digest",
                "--shuffle-seed",
                "4",
            ])
            .args(args);
        let (ok, out, err) = run(&mut command);
        assert!(ok, "{err}");
        out.lines()
            .filter(|l| l.starts_with("batch "))
            .map(String::from)
            .collect()
    };
    let field = |line: &str, key: &str| -> String {
        line.split(' ')
            .find_map(|f| f.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line}"))
            .to_string()
    };
    let two = digest_lines(&["--batch-size", "50", "--shard", "0/2"]);
    let position = field(&two[2], "resume_rows=");
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
        lines.iter().map(|l| field(l, "digest=")).collect()
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
    let feed = |batch: usize, rank: usize, world: usize| {
        Feed::builder(&session, &sql)
            .batch_size(batch)
            .shuffle(6)
            .epochs(2)
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
    assert!(
        err.contains("part-2.parquet") && err.contains("no longer read"),
        "{err}"
    );
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
