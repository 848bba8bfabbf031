//! Quarantine (issue 61): a row whose functions fail is left out, recorded
//! and its slot filled with the row before it in the epoch's order, so
//! every rank keeps its step count and every other row its place, on any
//! world size and across a resume.

use std::collections::BTreeMap;
use std::path::Path;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::error::Result;
use sqlfeed::device::Device;
use sqlfeed::feed::{
    Checkpoint, Feed, FeedBuilder, OnDataChange, OnError, QuarantineLimit, QuarantinedRow,
};

use crate::common::{arc, assert_contains, run, sqlfeed, write_parquet};
use crate::elastic::session;

/// Ids 0..1000 in 4 files of 250.
fn ids(dir: &Path) -> Result<String> {
    for file in 0..4 {
        let ids = Int64Array::from_iter_values(file * 250..(file + 1) * 250);
        let batch = RecordBatch::try_from_iter(vec![("id", arc(ids))])?;
        write_parquet(&dir.join(format!("part-{file}.parquet")), &batch)?;
    }
    Ok(format!("{}/*.parquet", dir.display()))
}

/// Whether id `id` fails in [`failing`].
fn bad(id: i64) -> bool {
    id % 37 == 5
}

/// `v` = the id through a cast of its text, which fails on the ids
/// [`bad`] says (their text is 'bad'), and the id.
fn failing(files: &str) -> String {
    format!(
        "SELECT CAST(CASE WHEN id % 37 = 5 THEN 'bad' ELSE CAST(id AS VARCHAR) END \
         AS BIGINT) AS v, id FROM '{files}'"
    )
}

/// The same rows with no failure: the same columns read, so the same order.
fn sound(files: &str) -> String {
    format!("SELECT CAST(CAST(id AS VARCHAR) AS BIGINT) AS v, id FROM '{files}'")
}

/// Each batch: (epoch, step, the ids, the v values).
type Fed = (u64, u64, Vec<i64>, Vec<i64>);

fn fed(builder: FeedBuilder) -> Result<(Vec<Fed>, Vec<QuarantinedRow>)> {
    let mut feed = builder.device(Device::Cpu).build()?;
    let mut batches = vec![];
    for batch in feed.by_ref() {
        let batch = batch?;
        batches.push((
            batch.epoch(),
            batch.step(),
            batch.tensor("id")?.as_slice::<i64>()?.to_vec(),
            batch.tensor("v")?.as_slice::<i64>()?.to_vec(),
        ));
    }
    Ok((batches, feed.quarantined()))
}

fn quarantining(builder: FeedBuilder) -> FeedBuilder {
    builder.on_error(OnError::Quarantine(QuarantineLimit::Rows(100)))
}

/// Each epoch's ids in order, from a one-rank run.
fn orders(batches: &[Fed]) -> BTreeMap<u64, Vec<i64>> {
    let mut orders: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for (epoch, _, ids, _) in batches {
        orders.entry(*epoch).or_default().extend(ids);
    }
    orders
}

/// `order` with each failing id replaced by the id before it that does
/// not fail (after it, at the start).
fn filled(order: &[i64]) -> Vec<i64> {
    let first_good = order.iter().copied().find(|id| !bad(*id));
    let mut previous = first_good;
    order
        .iter()
        .map(|&id| {
            if bad(id) {
                previous.unwrap_or(id)
            } else {
                previous = Some(id);
                id
            }
        })
        .collect()
}

#[test]
fn a_failing_row_takes_the_row_before_it_and_nothing_else_moves() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = ids(dir.path())?;
    let session = session()?;
    // Shuffled by content, unshuffled, and shuffled by position (failing
    // rows are isolated above the shuffle: no position moves).
    let mut references = vec![];
    for (seed, by_position) in [(Some(3), false), (None, false), (Some(3), true)] {
        let builder = |sql: String| {
            let builder = Feed::builder(&session, sql)
                .given(seed, FeedBuilder::shuffle)
                .batch_size(64)
                .epochs(2);
            if by_position {
                builder.shuffle_by_position()
            } else {
                builder
            }
        };
        let (reference, none) = fed(quarantining(builder(sound(&files))))?;
        assert!(none.is_empty());
        references.push(orders(&reference));
        let (quarantined, table) = fed(quarantining(builder(failing(&files))))?;
        let failing_ids = (0..1000).filter(|id| bad(*id)).count();
        assert_eq!(table.len(), 2 * failing_ids, "seed {seed:?}");
        assert_eq!(
            quarantined.len(),
            reference.len(),
            "the step count stays what the plan said"
        );
        for (epoch, order) in orders(&reference) {
            let expected = filled(&order);
            assert_eq!(orders(&quarantined)[&epoch], expected, "seed {seed:?}");
            // The table names each failing row at its slot.
            let positions: Vec<u64> = order
                .iter()
                .enumerate()
                .filter(|(_, id)| bad(**id))
                .map(|(position, _)| position as u64)
                .collect();
            let logged: Vec<u64> = table
                .iter()
                .filter(|row| row.epoch == epoch)
                .map(|row| row.position)
                .collect();
            assert_eq!(logged, positions, "seed {seed:?} epoch {epoch}");
        }
        // A replaced slot holds the whole row before it: v is its id.
        for (_, _, ids, v) in &quarantined {
            assert_eq!(ids, v);
        }
        let row = &table[0];
        assert_eq!(row.column, "v");
        assert_contains(&row.function, &["CAST"]);
        assert_contains(&row.error, &["bad"]);
    }
    assert_ne!(references[0], references[2], "by position is another order");
    Ok(())
}

#[test]
fn every_rank_of_any_world_gets_the_slots_of_the_one_order() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = ids(dir.path())?;
    let session = session()?;
    let builder = || {
        quarantining(Feed::builder(&session, failing(&files)))
            .shuffle(9)
            .batch_size(50)
            .drop_last(true)
    };
    let (whole, table) = fed(builder())?;
    let order = &orders(&whole)[&0];
    for world in [2, 3] {
        let ranks = (0..world)
            .map(|rank| fed(builder().shard(rank, world)))
            .collect::<Result<Vec<_>>>()?;
        let steps: Vec<usize> = ranks.iter().map(|(b, _)| b.len()).collect();
        assert!(steps.iter().all(|s| *s == 1000 / (50 * world)), "{steps:?}");
        for (rank, (batches, rank_table)) in ranks.iter().enumerate() {
            assert_eq!(rank_table, &table, "every rank holds the same table");
            for (_, step, ids, _) in batches {
                let start = (*step as usize * world + rank) * 50;
                assert_eq!(ids, &order[start..start + 50], "W={world} r={rank}");
            }
        }
    }
    Ok(())
}

#[test]
fn a_checkpoint_resumes_on_another_world_with_its_table() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = ids(dir.path())?;
    let session = session()?;
    let builder = || {
        quarantining(Feed::builder(&session, failing(&files)))
            .shuffle(4)
            .batch_size(25)
            .drop_last(true)
            .epochs(2)
    };
    let (whole, whole_table) = fed(builder())?;
    let orders = orders(&whole);
    // Rank 0 of 4 after 3 steps of epoch 1: 300 rows of its order consumed.
    let mut feed = builder().shard(0, 4).device(Device::Cpu).build()?;
    let mut handed = 0;
    for batch in feed.by_ref() {
        let batch = batch?;
        if batch.epoch() == 1 && batch.step() == 2 {
            handed += 1;
            break;
        }
        handed += 1;
    }
    assert_eq!(handed, 10 + 3);
    let checkpoint = Checkpoint::from_json(&feed.checkpoint()?.to_json(), "test")?;
    drop(feed);
    assert_eq!((checkpoint.epoch, checkpoint.rows), (1, Some(300)));
    assert_eq!(
        checkpoint.quarantined,
        whole_table
            .iter()
            .filter(|row| (row.epoch, row.position) < (1, 300))
            .cloned()
            .collect::<Vec<_>>(),
        "the checkpoint carries the rows before it"
    );
    let world = 3;
    for rank in 0..world {
        let (after, table) = fed(builder()
            .shard(rank, world)
            .resume_from(checkpoint.clone(), OnDataChange::Error))?;
        assert_eq!(
            table, whole_table,
            "rank {rank}: the uninterrupted run's table"
        );
        // Epoch 1 continues after its 300th row, in steps of 3 × 25.
        let first_step = after.first().map_or(0, |b| b.1);
        assert_eq!(after.len(), 700 / 75, "rank {rank}");
        for (epoch, step, ids, _) in after {
            assert_eq!(epoch, 1);
            let start = 300 + ((step - first_step) as usize * world + rank) * 25;
            assert_eq!(ids, orders[&1][start..start + 25], "step {step}");
        }
    }
    Ok(())
}

#[test]
fn past_the_limit_every_rank_fails_at_the_same_row_with_a_summary() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = ids(dir.path())?;
    let session = session()?;
    let errors = (0..2)
        .map(|rank| {
            let builder = Feed::builder(&session, failing(&files))
                .shuffle(1)
                .batch_size(10)
                .shard(rank, 2)
                .on_error(OnError::Quarantine(QuarantineLimit::Rows(4)));
            match fed(builder) {
                Ok(_) => panic!("rank {rank}: five failing rows are more than 4"),
                Err(err) => err.to_string(),
            }
        })
        .collect::<Vec<_>>();
    assert_contains(
        &errors[0],
        &[
            "epoch 0 quarantined 5 of the first",
            "max_quarantined (4 rows)",
            "(column v): 5 rows, the first at position",
            "Cannot cast string 'bad'",
            "quarantined()",
        ],
    );
    assert_eq!(errors[0], errors[1], "both ranks stop at the same row");
    Ok(())
}

#[test]
fn the_table_names_each_rows_file_and_row() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = ids(dir.path())?;
    let session = session()?;
    // Shuffled by content and by position.
    for by_position in [false, true] {
        let builder = quarantining(Feed::builder(&session, failing(&files)))
            .shuffle(2)
            .batch_size(100)
            .epochs(2);
        let builder = if by_position {
            builder.shuffle_by_position()
        } else {
            builder
        };
        names_each_rows_file_and_row(&builder)?;
    }
    Ok(())
}

/// Checks that the table of `builder`'s feed names every failing row of
/// both epochs by file and row.
fn names_each_rows_file_and_row(builder: &FeedBuilder) -> Result<()> {
    let (_, table) = fed(builder.clone())?;
    let resolved = builder.quarantine_origins(table)?;
    let mut found: Vec<(u64, i64)> = resolved
        .iter()
        .map(|row| {
            let origin = row.origin.as_ref().expect("every row resolved");
            let file: i64 = origin
                .file
                .rsplit_once("part-")
                .and_then(|(_, name)| name.strip_suffix(".parquet"))
                .and_then(|n| n.parse().ok())
                .expect("a part file");
            assert_eq!(origin.row_group, 0);
            (row.epoch, file * 250 + origin.row as i64)
        })
        .collect();
    found.sort();
    let expected: Vec<(u64, i64)> = (0..2)
        .flat_map(|epoch| (0..1000).filter(|id| bad(*id)).map(move |id| (epoch, id)))
        .collect();
    assert_eq!(found, expected);
    Ok(())
}

#[test]
fn quarantine_with_the_epoch_cache_is_refused_saying_why() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = ids(dir.path())?;
    let session = session()?;
    let err = quarantining(Feed::builder(&session, failing(&files)))
        .cache(true)
        .device(Device::Cpu)
        .build()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_contains(
        &err,
        &["on_error='quarantine'", "epoch cache", "Turn the cache off"],
    );
    Ok(())
}

#[test]
fn the_cli_writes_the_table_and_names_the_limit() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = ids(dir.path())?;
    let out = dir.path().join("q.parquet");
    let (ok, stdout, stderr) = run(sqlfeed().args([
        "feed",
        &failing(&files),
        "--shuffle-seed",
        "1",
        "--batch-size",
        "100",
        "--device",
        "cpu",
        "--on-error",
        "quarantine",
        "--max-quarantined",
        "5%",
        "--quarantine-out",
        out.to_str().unwrap_or_default(),
        "--digest",
    ]));
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("batch ")).count(),
        10
    );
    assert_contains(&stderr, &["quarantined 27 rows"]);
    let (ok, table, stderr) = run(sqlfeed().args([
        "--format",
        "csv",
        "-c",
        &format!(
            "SELECT count(*) AS n, count(DISTINCT file) AS f FROM '{}'",
            out.display()
        ),
    ]));
    assert!(ok, "{stderr}");
    assert_contains(&table, &["n,f\n27,4"]);
    let (ok, _, stderr) = run(sqlfeed().args([
        "feed",
        &failing(&files),
        "--device",
        "cpu",
        "--max-quarantined",
        "5",
    ]));
    assert!(!ok);
    assert_contains(&stderr, &["need --on-error quarantine"]);
    let (ok, _, stderr) = run(sqlfeed().args([
        "feed",
        &failing(&files),
        "--on-error",
        "quarantine",
        "--max-quarantined",
        "lots",
    ]));
    assert!(!ok);
    assert_contains(&stderr, &["--max-quarantined", "neither a row count"]);
    Ok(())
}

/// How a test cuts a feed's batches.
type Cut = fn(FeedBuilder) -> FeedBuilder;

#[test]
fn batches_cut_by_tokens_or_buckets_keep_every_ranks_step_count() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = ids(dir.path())?;
    let session = session()?;
    // A variable-length column: the failing rows' slots take another row's
    // length, so the cut after them follows the row that fills them.
    let sql = format!(
        "SELECT CAST(CASE WHEN id % 37 = 5 THEN 'bad' ELSE CAST(id AS VARCHAR) END \
         AS BIGINT) AS v, array_repeat(id, CAST(id % 7 + 1 AS BIGINT)) AS toks, id \
         FROM '{files}'"
    );
    let cuts: [(&str, Cut); 2] = [
        ("batch_tokens", |b| b.batch_tokens(200)),
        ("bucket_by_length", |b| b.batch_size(20).bucket_by_length(4)),
    ];
    for (cut, apply) in cuts {
        let ranks = (0..2)
            .map(|rank| {
                let builder = quarantining(Feed::builder(&session, sql.clone()))
                    .shuffle(6)
                    .epochs(2)
                    .shard(rank, 2);
                fed(apply(builder))
            })
            .collect::<Result<Vec<_>>>()?;
        let steps: Vec<Vec<(u64, u64)>> = ranks
            .iter()
            .map(|(batches, _)| batches.iter().map(|b| (b.0, b.1)).collect())
            .collect();
        assert_eq!(steps[0], steps[1], "{cut}: both ranks take the same steps");
        let fed_ids: Vec<i64> = ranks
            .iter()
            .flat_map(|(batches, _)| batches.iter().flat_map(|b| b.2.clone()))
            .collect();
        assert!(
            !fed_ids.iter().any(|id| bad(*id)),
            "{cut}: a failing row was fed"
        );
        assert_eq!(
            ranks[0].1, ranks[1].1,
            "{cut}: the same table on both ranks"
        );
        assert_eq!(ranks[0].1.len(), 2 * 27, "{cut}");
    }
    Ok(())
}
