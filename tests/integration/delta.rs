//! Delta Lake tables (issue 30), written by delta-rs's own writer: the folder
//! is read as the table at the version asked for, never as its loose files;
//! a feed pins the version when it starts, its checkpoint records it, and a
//! resume reads it again after newer commits. Python's tests
//! (`python/tests/test_delta.py`) do the same over tables the `deltalake`
//! package writes; `s3.rs` reads one through S3.

use std::ops::Range;
use std::path::Path;

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::error::{DataFusionError, Result};
use deltalake_core::DeltaTable;
use deltalake_core::protocol::SaveMode;
use sqlfeed::Session;
use sqlfeed::device::Device;
use sqlfeed::feed::{Checkpoint, Feed, OnDataChange};

use crate::common::{arc, assert_contains, collect, sql_error};

fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Commits `ids` to the Delta table at `dir` (created by the first commit).
pub(crate) async fn commit(dir: &Path, ids: Range<i64>, mode: SaveMode) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let url = url::Url::from_directory_path(dir).map_err(|()| {
        DataFusionError::Plan(format!("{} is not absolute", dir.display()))
    })?;
    let table = DeltaTable::try_from_url(url).await.map_err(external)?;
    let batch =
        RecordBatch::try_from_iter(vec![("id", arc(Int64Array::from_iter_values(ids)))])?;
    table
        .write(vec![batch])
        .with_save_mode(mode)
        .await
        .map_err(external)?;
    Ok(())
}

/// v0: ids 0..100; v1: + 100..150; v2: overwritten with 0..50 (the older
/// files stay in the folder, removed only in the log).
pub(crate) async fn three_versions(dir: &Path) -> Result<()> {
    commit(dir, 0..100, SaveMode::Append).await?;
    commit(dir, 100..150, SaveMode::Append).await?;
    commit(dir, 0..50, SaveMode::Overwrite).await
}

async fn ids(session: &Session, sql: &str) -> Result<Vec<i64>> {
    let mut ids = vec![];
    for batch in session.sql(sql).await?.collect().await? {
        let column = batch.column(0);
        let column = column
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or_else(|| DataFusionError::Internal("not Int64".into()))?;
        ids.extend(column.iter().flatten());
    }
    ids.sort_unstable();
    Ok(ids)
}

#[tokio::test]
async fn a_delta_folder_is_read_as_its_table_at_the_version_asked_for() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = dir.path().join("events");
    three_versions(&table).await?;
    let t = table.display();
    let session = Session::try_new()?;
    assert_eq!(
        ids(&session, &format!("SELECT id FROM '{t}'")).await?,
        (0..50).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&session, &format!("SELECT id FROM '{t}/' VERSION AS OF 0")).await?,
        (0..100).collect::<Vec<_>>()
    );
    assert_eq!(
        ids(&session, &format!("SELECT id FROM '{t}@v1' WHERE id >= 0")).await?,
        (0..150).collect::<Vec<_>>()
    );
    let history = collect(&session, &format!("DESCRIBE HISTORY '{t}'")).await?;
    let versions: Vec<i64> = history
        .iter()
        .flat_map(|b| {
            let v = b.column(0).as_any().downcast_ref::<Int64Array>().cloned();
            v.into_iter()
                .flat_map(|a| a.iter().flatten().collect::<Vec<_>>())
        })
        .collect();
    assert_eq!(versions, [2, 1, 0]);

    // VERIFY reads every page of the version's files, and only those.
    for (target, files) in [(format!("{t}"), 1), (format!("{t}@v1"), 2)] {
        let verified = collect(&session, &format!("VERIFY '{target}'")).await?;
        let rows: usize = verified.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, files, "VERIFY '{target}'");
    }

    // A catalog table, at the version its location names.
    collect(
        &session,
        &format!("CREATE EXTERNAL TABLE ev STORED AS DELTA LOCATION '{t}@v1'"),
    )
    .await?;
    assert_eq!(ids(&session, "SELECT id FROM ev").await?.len(), 150);
    collect(
        &session,
        &format!("CREATE EXTERNAL TABLE now STORED AS DELTA LOCATION '{t}'"),
    )
    .await?;
    assert_eq!(ids(&session, "SELECT id FROM now").await?.len(), 50);

    let err = sql_error(&session, &format!("SELECT id FROM '{t}@v7'")).await;
    assert_contains(
        &err,
        &["version 7 of the Delta Lake table", "newest version is 2"],
    );
    let err = sql_error(&session, &format!("SELECT id FROM '{t}/*.parquet'")).await;
    assert!(err.contains("reads inside the Delta Lake table"), "{err}");
    // A damaged data file of the version is an error naming the file.
    for entry in std::fs::read_dir(&table)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "parquet") {
            let mut bytes = std::fs::read(&path)?;
            let half = bytes.len() / 2;
            bytes[4..half].iter_mut().for_each(|b| *b ^= 0xa5);
            std::fs::write(&path, bytes)?;
        }
    }
    let err = session
        .sql(&format!("SELECT sum(id) FROM '{t}'"))
        .await?
        .collect()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("'{t}/part-")), "{err}");

    let err = sql_error(
        &session,
        &format!("DESCRIBE HISTORY '{}'", dir.path().display()),
    )
    .await;
    assert!(err.contains("is not a Delta Lake table"), "{err}");
    Ok(())
}

/// Issue 56, item 6: a commit cut short, and a commit missing, are named by
/// version and file (the kernel said "Json error: Truncated record", or
/// printed a `ParsedLogPath` struct), with what to do.
#[tokio::test]
async fn a_damaged_or_missing_commit_is_named_by_version_and_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let session = Session::try_new()?;
    for damage in ["cut", "missing"] {
        let table = dir.path().join(damage);
        three_versions(&table).await?;
        let commit = table.join("_delta_log").join("00000000000000000001.json");
        if damage == "cut" {
            let bytes = std::fs::read(&commit)?;
            std::fs::write(&commit, &bytes[..bytes.len() / 2])?;
        } else {
            std::fs::remove_file(&commit)?;
        }
        let err =
            sql_error(&session, &format!("SELECT id FROM '{}'", table.display())).await;
        assert!(
            !err.contains("ParsedLogPath") && !err.contains("Url {"),
            "{err}"
        );
        match damage {
            "cut" => assert_contains(
                &err,
                &[
                    "version 1's commit",
                    "_delta_log/00000000000000000001.json is damaged",
                    "is not JSON",
                    "read an earlier version (@v0)",
                ],
            ),
            _ => assert_contains(
                &err,
                &[
                    "its commit log has no version 1",
                    "_delta_log/00000000000000000001.json is missing between version 0 and version 2",
                ],
            ),
        }
        // The version before the damage still reads.
        let before = format!("SELECT id FROM '{}@v0'", table.display());
        assert_eq!(ids(&session, &before).await?.len(), 100);
    }
    Ok(())
}

fn fed(feed: Feed) -> Result<Vec<Vec<i64>>> {
    feed.map(|batch| Ok(batch?.tensor("id")?.as_slice::<i64>()?.to_vec()))
        .collect()
}

#[test]
fn a_feed_pins_its_version_and_its_checkpoint_resumes_on_it() -> Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    let dir = tempfile::tempdir()?;
    let table = dir.path().join("events");
    runtime.block_on(three_versions(&table))?;
    let sql = format!("SELECT id FROM '{}'", table.display());
    let session = crate::elastic::session()?;
    let builder = || {
        Feed::builder(&session, &sql)
            .batch_size(8)
            .shuffle(11)
            .epochs(2)
            .device(Device::Cpu)
    };
    let whole = fed(builder().build()?)?;
    assert_eq!(whole.len(), 14, "2 epochs of 50 rows in batches of 8");

    let mut feed = builder().build()?;
    let first: Vec<Vec<i64>> = (&mut feed)
        .take(3)
        .map(|b| Ok(b?.tensor("id")?.as_slice::<i64>()?.to_vec()))
        .collect::<Result<_>>()?;
    assert_eq!(first, whole[..3]);
    let checkpoint = feed.checkpoint()?;
    assert_eq!(
        checkpoint.delta_versions.get(&table.display().to_string()),
        Some(&2),
        "{checkpoint:?}"
    );
    // A commit while the feed runs: it goes on reading version 2.
    runtime.block_on(commit(&table, 1000..1100, SaveMode::Append))?;
    assert_eq!(fed(feed)?, whole[3..]);

    // The checkpoint resumes version 2 after the commit, exactly.
    let json = checkpoint.to_json();
    let resumed = builder()
        .resume_from(Checkpoint::from_json(&json, "test")?, OnDataChange::Error)
        .build()?;
    assert_eq!(fed(resumed)?, whole[3..]);
    // Elastic: the checkpoint resumes on 3 ranks of 4 rows, still on
    // version 2: the epoch's other rows, each once (plus the pads of the
    // last step), none of the new commit's.
    let mut rest: Vec<i64> = vec![];
    for rank in 0..3 {
        let resumed = Feed::builder(&session, &sql)
            .batch_size(4)
            .shuffle(11)
            .shard(rank, 3)
            .device(Device::Cpu)
            .resume_from(Checkpoint::from_json(&json, "test")?, OnDataChange::Error)
            .build()?;
        rest.extend(fed(resumed)?.concat());
    }
    let mut seen: Vec<i64> = first.concat();
    seen.extend(&rest);
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, (0..50).collect::<Vec<_>>());
    assert!(rest.len() - (50 - 24) < 12, "at most one step of pads");

    // A new feed reads the newest version.
    let fresh: usize = fed(builder().epochs(1).build()?)?
        .iter()
        .map(Vec::len)
        .sum();
    assert_eq!(fresh, 150);
    Ok(())
}
