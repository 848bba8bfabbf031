//! `SHUFFLE WINDOW n` (issue 55): a shuffle that streams window by window.
//! Every row once; the order a function of (data layout, seed, epoch, n)
//! only; each window the rows of whole row groups drawn from all over the
//! data; the first batch out while later windows are not started; resume
//! exact; what it cannot cut refused; on a cluster, a job per window with
//! the embedded batches.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::error::Result;
use datafusion::physical_plan::{ExecutionPlan, collect as collect_plan};
use futures::StreamExt;
use sqlfeed::device::Device;
use sqlfeed::feed::{Feed, OnDataChange};

use crate::common::{
    assert_contains, collect, first_int64s as ids, sized_session as session, write_ids,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_windowed_shuffle_is_a_permutation_whose_order_ignores_partitions() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 8, 1000, 100)?;
    let sql = |window: u64, seed: u64, epoch: u64| {
        format!(
            "SELECT id, v FROM {table} SHUFFLE WINDOW {window} SEED {seed} EPOCH {epoch}"
        )
    };
    let reference = ids(&collect(&session(1, 8192)?, &sql(1000, 3, 0)).await?);
    let mut sorted = reference.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..8000).collect::<Vec<i64>>());
    for (partitions, batch) in [(2, 7), (4, 100), (3, 8192)] {
        let got = ids(&collect(&session(partitions, batch)?, &sql(1000, 3, 0)).await?);
        assert_eq!(
            got, reference,
            "{partitions} partitions, batches of {batch}"
        );
    }
    // Another epoch, seed or window is another order.
    for other in [sql(1000, 3, 1), sql(1000, 4, 0), sql(2000, 3, 0)] {
        assert_ne!(
            ids(&collect(&session(2, 64)?, &other).await?),
            reference,
            "{other}"
        );
    }
    // Windows of 1000 rows of whole 100-row groups: positions k·1000 … hold
    // exactly ten whole row groups, drawn from several files, shuffled.
    let mut files_of_first_windows = BTreeSet::new();
    for window in reference.chunks(1000) {
        let groups: BTreeSet<i64> = window.iter().map(|id| id / 100).collect();
        assert_eq!(groups.len(), 10, "{groups:?}");
        let mut rows = window.to_vec();
        rows.sort_unstable();
        let whole: Vec<i64> =
            groups.iter().flat_map(|g| g * 100..(g + 1) * 100).collect();
        assert_eq!(rows, whole);
        assert_ne!(window.to_vec(), rows, "rows within a window are shuffled");
        files_of_first_windows.insert(window[0] / 1000);
        let files: BTreeSet<i64> = groups.iter().map(|g| g / 10).collect();
        assert!(files.len() > 2, "a window draws from all over: {files:?}");
    }
    assert!(files_of_first_windows.len() > 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_group_larger_than_the_window_is_a_window_of_its_own() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // 4 files of one 1000-row group; windows of at least 400 rows.
    let table = write_ids(dir.path(), 4, 1000, 1000)?;
    let s = session(2, 8192)?;
    let sql = format!("SELECT id FROM {table} SHUFFLE WINDOW 400 SEED 1");
    let order = ids(&collect(&s, &sql).await?);
    assert_eq!(order.len(), 4000);
    for window in order.chunks(1000) {
        let files: BTreeSet<i64> = window.iter().map(|id| id / 1000).collect();
        assert_eq!(files.len(), 1, "one whole row group: {files:?}");
    }
    // A filter drops rows within the windows; the rest keep their order.
    let filtered = ids(&collect(
        &s,
        &format!("SELECT id FROM {table} WHERE v <> 3 SHUFFLE WINDOW 400 SEED 1"),
    )
    .await?);
    let kept: Vec<i64> = order.iter().copied().filter(|id| id % 7 != 3).collect();
    assert_eq!(filtered.len(), kept.len());
    let kept_set: BTreeSet<i64> = kept.iter().copied().collect();
    assert_eq!(
        filtered.iter().copied().collect::<BTreeSet<i64>>(),
        kept_set
    );
    Ok(())
}

/// The `windows` metric of the plan's `WindowedShuffleExec`.
fn windows_started(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let mut node = Arc::clone(plan);
    loop {
        if node.name() == "WindowedShuffleExec" {
            return node
                .metrics()
                .and_then(|m| m.sum_by_name("windows"))
                .map_or(0, |v| v.as_usize());
        }
        let Some(child) = node.children().first().map(|c| Arc::clone(c)) else {
            return 0;
        };
        node = child;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_batch_comes_out_before_later_windows_start() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 8, 1000, 100)?;
    let s = session(2, 100)?;
    let df = s
        .sql(&format!("SELECT id FROM {table} SHUFFLE WINDOW 500 SEED 9"))
        .await?;
    let plan = df.create_physical_plan().await?;
    let mut stream = plan.execute(0, s.context().task_ctx())?;
    let first = stream.next().await.expect("a first batch")?;
    assert!(first.num_rows() > 0);
    // 16 windows in all: the first is read, the next one prepared, no more.
    let started = windows_started(&plan);
    assert!((1..=2).contains(&started), "{started} windows started");
    let mut rows = first.num_rows();
    while let Some(batch) = stream.next().await {
        rows += batch?.num_rows();
    }
    assert_eq!(rows, 8000);
    assert_eq!(windows_started(&plan), 16);
    // The same plan's output as collected whole.
    let again = collect_plan(plan, s.context().task_ctx()).await?;
    assert_eq!(again.iter().map(RecordBatch::num_rows).sum::<usize>(), 8000);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_a_window_cannot_cut_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 2, 100, 50)?;
    let s = session(2, 64)?;
    for (sql, needles) in [
        (
            format!("SELECT v, count(*) AS n FROM {table} GROUP BY v SHUFFLE WINDOW 10"),
            &["SHUFFLE WINDOW", "AggregateExec", "use SHUFFLE"][..],
        ),
        (
            format!(
                "SELECT a.id FROM {table} a JOIN {table} b ON a.id = b.id SHUFFLE WINDOW 10"
            ),
            &["SHUFFLE WINDOW", "Join", "use SHUFFLE"][..],
        ),
        (
            "SELECT value FROM generate_series(1, 10) SHUFFLE WINDOW 10".to_string(),
            &["SHUFFLE WINDOW cuts Parquet files", "use SHUFFLE"][..],
        ),
        (
            format!("SELECT id FROM {table} SHUFFLE WINDOW 0"),
            &["WINDOW must be at least 1 row"][..],
        ),
    ] {
        let err = match s.sql(&sql).await {
            Ok(df) => match s.collect(df).await {
                Ok(_) => panic!("{sql} ran"),
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        assert_contains(&err, needles);
    }
    Ok(())
}

#[test]
fn a_windowed_feed_resumes_exactly_and_refuses_another_window() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 4, 500, 100)?;
    let s = crate::elastic::session()?;
    let sql = format!("SELECT id FROM {table}");
    let feed = |window: u64| {
        Feed::builder(&s, sql.clone())
            .shuffle(11)
            .shuffle_window(window)
            .batch_size(64)
            .epochs(2)
            .device(Device::Cpu)
    };
    let batches = |builder: sqlfeed::feed::FeedBuilder| -> Result<Vec<Vec<i64>>> {
        builder
            .build()?
            .map(|b| Ok(b?.tensor("id")?.as_slice::<i64>()?.to_vec()))
            .collect()
    };
    let whole = batches(feed(300))?;
    assert_eq!(whole.len(), 2 * 2000usize.div_ceil(64));
    let mut first_epoch: Vec<i64> = whole[..32].concat();
    first_epoch.sort_unstable();
    assert_eq!(first_epoch, (0..2000).collect::<Vec<i64>>());
    assert_ne!(whole[..32], whole[32..], "epochs differ");
    // Not the exact shuffle's order.
    let exact = batches(
        Feed::builder(&s, sql.clone())
            .shuffle(11)
            .batch_size(64)
            .epochs(2)
            .device(Device::Cpu),
    )?;
    assert_ne!(exact, whole);
    // Stopped after 5 batches, resumed from the checkpoint: the rest.
    let mut stopped = feed(300).build()?;
    for _ in 0..5 {
        stopped.next().expect("a batch")?;
    }
    let checkpoint = stopped.checkpoint()?;
    drop(stopped);
    assert_eq!(checkpoint.shuffle_window, Some(300));
    let resumed =
        batches(feed(300).resume_from(checkpoint.clone(), OnDataChange::Error))?;
    assert_eq!(resumed, whole[5..].to_vec());
    let err = batches(feed(200).resume_from(checkpoint, OnDataChange::Error))
        .unwrap_err()
        .to_string();
    assert_contains(
        &err,
        &["shuffle_window=300 but this feed has shuffle_window=200"],
    );
    // Without a seed, or through the epoch cache: refused.
    let err = Feed::builder(&s, sql.clone())
        .shuffle_window(300)
        .device(Device::Cpu)
        .build()
        .unwrap_err()
        .to_string();
    assert_contains(&err, &["shuffle_window=300", "give a shuffle seed"]);
    let err = feed(300).cache(true).build().unwrap_err().to_string();
    assert_contains(&err, &["shuffle_window=300", "epoch cache"]);
    Ok(())
}

/// Issue 55, item 4: map-style access. `dataset(epoch)` gives the epoch's
/// length and row `i` of its order: the feed's rows in the feed's order
/// (world 1), with or without a filter (window sizes from the footers, or
/// counted); past the end, an exact SHUFFLE and an unshuffled feed are
/// refused saying what to do.
#[test]
fn a_windowed_feed_gives_row_i_of_an_epoch_by_position() -> Result<()> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 4, 500, 100)?;
    let s = crate::elastic::session()?;
    for sql in [
        format!("SELECT id, v * 10 AS w FROM {table}"),
        format!("SELECT id, v * 10 AS w FROM {table} WHERE v <> 3"),
    ] {
        let feed = Feed::builder(&s, sql.clone())
            .shuffle(11)
            .shuffle_window(300)
            .batch_size(64)
            .epochs(2)
            .device(Device::Cpu);
        let fed: Vec<(i64, i64)> = feed
            .clone()
            .build()?
            .map(|b| {
                let b = b?;
                let ids = b.tensor("id")?.as_slice::<i64>()?.to_vec();
                let w = b.tensor("w")?.as_slice::<i64>()?.to_vec();
                Ok(ids.into_iter().zip(w).collect::<Vec<_>>())
            })
            .collect::<Result<Vec<_>>>()?
            .concat();
        let epoch_rows = fed.len() / 2;
        let epoch = feed.dataset(1)?;
        assert_eq!(epoch.len()? as usize, epoch_rows, "{sql}");
        assert_eq!(epoch.window_rows()?.len(), 7, "{sql}");
        // Out of order too: rows of several windows, back and forth.
        let mut positions: Vec<usize> = (0..epoch_rows).collect();
        positions.reverse();
        positions.rotate_left(epoch_rows / 3);
        for i in positions {
            let row = epoch.row(i as u64)?;
            assert_eq!(row.num_rows(), 1);
            let got = (
                row.column(0).as_primitive::<Int64Type>().value(0),
                row.column(1).as_primitive::<Int64Type>().value(0),
            );
            assert_eq!(got, fed[epoch_rows + i], "row {i} of epoch 1 of {sql}");
        }
        // Several rows at once, in the order asked.
        let two = epoch.rows(&[3, 0])?;
        let ids = two.column(0).as_primitive::<Int64Type>();
        assert_eq!(
            [ids.value(0), ids.value(1)],
            [fed[epoch_rows + 3].0, fed[epoch_rows].0]
        );
        let err = epoch.row(epoch_rows as u64).unwrap_err().to_string();
        assert_contains(&err, &[&format!("the epoch has {epoch_rows} rows")]);
    }
    let sql = format!("SELECT id FROM {table}");
    let exact = Feed::builder(&s, sql.clone())
        .shuffle(11)
        .device(Device::Cpu);
    let err = exact.dataset(0).unwrap_err().to_string();
    assert_contains(&err, &["SHUFFLE is exact", "shuffle_window=n"]);
    let unshuffled = Feed::builder(&s, sql.clone()).device(Device::Cpu);
    let err = unshuffled.dataset(0).unwrap_err().to_string();
    assert_contains(&err, &["not shuffled", "shuffle_window=n"]);
    let quarantining = Feed::builder(&s, sql)
        .shuffle(11)
        .shuffle_window(300)
        .on_error(sqlfeed::feed::OnError::Quarantine(
            sqlfeed::feed::QuarantineLimit::default(),
        ))
        .device(Device::Cpu);
    let err = quarantining.dataset(0).unwrap_err().to_string();
    assert_contains(&err, &["quarantines failing rows", "on_error=fail"]);
    // The CLI's --rows prints the same rows.
    let epoch = Feed::builder(&s, format!("SELECT id, v FROM {table}"))
        .shuffle(11)
        .shuffle_window(300)
        .device(Device::Cpu)
        .dataset(1)?;
    crate::common::assert_rows_printed(&table, &["--shuffle-window", "300"], &epoch)?;
    Ok(())
}

/// Issue 55: an epoch boundary under a tight memory limit. The next epoch's
/// windows are prepared while the current epoch is read (the look-ahead),
/// within the one budget: 2 MiB for 12k rows of ~2.3 MB in 4 files of one
/// row group each, so 4 windows of one file. The batches are those of a roomy session that starts no epoch
/// ahead, every row once per epoch, and nothing is left reserved or on disk.
#[test]
fn windowed_epochs_start_ahead_with_the_same_batches_under_a_tight_memory_limit()
-> Result<()> {
    let dir = crate::common::generated(12_000, 4)?;
    let sql = format!("SELECT id, tokens FROM '{}'", dir.path().display());
    let spill = tempfile::tempdir()?;
    let run = |session: &sqlfeed::Session| -> Result<(Vec<Vec<i64>>, Vec<String>)> {
        let mut feed = Feed::builder(session, &sql)
            .shuffle(6)
            .shuffle_window(1500)
            .batch_size(200)
            .epochs(3)
            .prefetch(2)
            .device(Device::Cpu)
            .build()?;
        let mut ids = vec![];
        for batch in feed.by_ref() {
            ids.push(batch?.tensor("id")?.as_slice::<i64>()?.to_vec());
        }
        let plans = feed.epoch_plans().iter().map(|(_, p)| p.clone()).collect();
        Ok((ids, plans))
    };
    let tight = sqlfeed::Session::builder()
        .memory_limit(2 << 20)
        .target_partitions(2)
        .spill_dir(spill.path())
        .build()?;
    let (ahead, plans) = run(&tight)?;
    assert_eq!(plans.len(), 3);
    for plan in &plans[1..] {
        assert_contains(plan, &["LookaheadExec", "WindowedShuffleExec", "windows=4"]);
    }
    assert_eq!(tight.context().runtime_env().memory_pool.reserved(), 0);
    assert!(crate::common::files_below(spill.path()).is_empty());
    let one_at_a_time = sqlfeed::Session::builder()
        .memory_limit(256 << 20)
        .target_partitions(3)
        .setting("sqlfeed.epoch_lookahead", "false")
        .build()?;
    let (alone, _) = run(&one_at_a_time)?;
    assert_eq!(ahead, alone);
    assert_eq!(ahead.len(), 3 * 60);
    for epoch in ahead.chunks(60) {
        let mut ids: Vec<i64> = epoch.iter().flatten().copied().collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..12_000).collect::<Vec<_>>());
    }
    assert_ne!(ahead[0], ahead[60]);
    Ok(())
}

/// A damaged row group in a later window: the windows before it are fed,
/// then the feed fails naming the file; no later window is read and
/// nothing hangs.
#[test]
fn a_damaged_file_fails_its_window_naming_the_file_after_the_earlier_windows()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 8, 1000, 100)?;
    // Garbage over the first data pages of part-05 (its footer stays).
    let damaged = dir.path().join("part-05.parquet");
    let mut bytes = std::fs::read(&damaged)?;
    for byte in &mut bytes[4..400] {
        *byte = 0xA5;
    }
    std::fs::write(&damaged, bytes)?;
    let s = crate::elastic::session()?;
    let mut feed = Feed::builder(&s, format!("SELECT id FROM {table}"))
        .shuffle(2)
        .shuffle_window(500)
        .batch_size(100)
        .device(Device::Cpu)
        .build()?;
    let mut fed = 0;
    let err = loop {
        match feed.next() {
            Some(Ok(batch)) => fed += batch.rows(),
            Some(Err(e)) => break e.to_string(),
            None => panic!("the damaged file was fed whole ({fed} rows)"),
        }
    };
    assert_contains(&err, &["part-05.parquet"]);
    // With this seed the damaged row group is in a middle window.
    assert!(fed > 0 && fed < 8000, "{fed} rows fed");
    assert!(feed.next().is_none(), "a batch after the error");
    Ok(())
}

/// The values of Int64 column `column` in each batch a CPU feed of `sql`,
/// shaped by `shape`, hands over in `session`, and the plans of its epochs.
#[cfg(feature = "ballista")]
fn fed_column(
    session: &sqlfeed::Session,
    sql: &str,
    column: &str,
    shape: impl FnOnce(sqlfeed::feed::FeedBuilder) -> sqlfeed::feed::FeedBuilder,
) -> Result<(Vec<Vec<i64>>, Vec<String>)> {
    let mut feed = shape(Feed::builder(session, sql))
        .device(Device::Cpu)
        .build()?;
    let mut values = vec![];
    for batch in feed.by_ref() {
        values.push(batch?.tensor(column)?.as_slice::<i64>()?.to_vec());
    }
    Ok((
        values,
        feed.epoch_plans().iter().map(|(_, p)| p.clone()).collect(),
    ))
}

/// A session on an in-process cluster (scheduler and executor) of 2
/// target partitions.
#[cfg(feature = "ballista")]
fn standalone_cluster() -> Result<sqlfeed::Session> {
    sqlfeed::Session::builder()
        .cluster("standalone")
        .target_partitions(2)
        .build()
}

/// Issue 55, item 3: on a cluster a windowed epoch is one job per window,
/// read in turn (the next one running ahead), with the embedded batches:
/// each job shuffles exactly its window's rows, cut from the footers on the
/// executors (`WindowScanExec`), and deals them to the ranks, the rows each
/// window keeps after the query's filter counted once per run.
#[cfg(feature = "ballista")]
#[test]
fn a_windowed_cluster_feed_runs_a_job_per_window_with_the_embedded_batches() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 4, 500, 100)?;
    let sql = format!("SELECT id FROM {table} WHERE v <> 5");
    let run = |session: &sqlfeed::Session, rank: usize| {
        fed_column(session, &sql, "id", |feed| {
            feed.shuffle(7)
                .shuffle_window(400)
                .batch_size(64)
                .shard(rank, 2)
                .epochs(2)
        })
    };
    let cluster = standalone_cluster()?;
    let embedded = session(3, 100)?;
    for rank in 0..2 {
        let (on_cluster, plans) = run(&cluster, rank)?;
        let (here, _) = run(&embedded, rank)?;
        assert_eq!(on_cluster, here, "rank {rank}");
        assert!(!on_cluster.is_empty());
        // Dealt to the ranks: the windows' rows after the filter were
        // counted once, reading `v` only.
        for plan in &plans {
            assert_contains(
                plan,
                &["WindowJobsExec: windows=5", "window_jobs=5", "dealt_to=2"],
            );
        }
    }
    Ok(())
}

/// Issue 55, item 3: a windowed cluster feed over unfiltered rows deals each
/// window's job to the ranks on the executors (every window's place in the
/// epoch is known from the footers), so each rank fetches only its own
/// batches, and still gets the embedded ones: 997 rows, so the last step is
/// padded with copies of the epoch's first rows (from the first window's
/// job, read after the last window) or dropped.
#[cfg(feature = "ballista")]
#[test]
fn a_windowed_cluster_feed_deals_each_window_to_the_ranks() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 1, 997, 100)?;
    let sql = format!("SELECT id, v * 2 AS w FROM {table}");
    let run = |session: &sqlfeed::Session,
               (rank, world, batch, drop_last, epochs): (
        usize,
        usize,
        usize,
        bool,
        u64,
    )| {
        fed_column(session, &sql, "id", |feed| {
            feed.shuffle(11)
                .shuffle_window(250)
                .batch_size(batch)
                .shard(rank, world)
                .drop_last(drop_last)
                .epochs(epochs)
        })
    };
    let cluster = standalone_cluster()?;
    let embedded = session(3, 100)?;
    // 997 = 24 steps of 40 and 37 rows, padded to 40 (3 pads); = 7 steps of
    // 128 and 101, padded to 102 (1 pad). Two epochs once: each has pads.
    for (world, batch, drop_last, epochs) in
        [(4, 10, false, 2), (4, 10, true, 1), (2, 64, false, 1)]
    {
        let mut rows = 0;
        for rank in 0..world {
            let shard = (rank, world, batch, drop_last, epochs);
            let (on_cluster, plans) = run(&cluster, shard)?;
            let (here, _) = run(&embedded, shard)?;
            assert_eq!(
                on_cluster, here,
                "rank {rank} of {world}, drop_last {drop_last}"
            );
            rows += here.iter().map(Vec::len).sum::<usize>();
            for plan in &plans {
                assert_contains(
                    plan,
                    &["WindowJobsExec: windows=4", &format!("dealt_to={world}")],
                );
            }
        }
        let expected = match (world, drop_last) {
            (4, false) => 2 * 1000,
            (4, true) => 960,
            _ => 998,
        };
        assert_eq!(rows, expected, "{world} ranks, drop_last {drop_last}");
    }
    Ok(())
}

/// Issue 55, item 3: a window's job is planned for unique rows first (one
/// exchange fewer); over rows that repeat it fails and runs again with the
/// stage that numbers copies, and the dealt windows still give every rank
/// the embedded batches.
#[cfg(feature = "ballista")]
#[test]
fn a_windowed_cluster_feed_over_repeated_rows_deals_the_embedded_batches() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 2, 300, 100)?;
    // 600 rows, 7 distinct.
    let sql = format!("SELECT v, v * 3 AS w FROM {table}");
    let run = |session: &sqlfeed::Session, rank: usize| {
        fed_column(session, &sql, "v", |feed| {
            feed.shuffle(5)
                .shuffle_window(200)
                .batch_size(16)
                .shard(rank, 2)
                .epochs(1)
        })
    };
    let cluster = standalone_cluster()?;
    let embedded = session(3, 100)?;
    for rank in 0..2 {
        let (on_cluster, plans) = run(&cluster, rank)?;
        let (here, _) = run(&embedded, rank)?;
        assert_eq!(on_cluster, here, "rank {rank}");
        assert_eq!(here.iter().map(Vec::len).sum::<usize>(), 300);
        for plan in &plans {
            assert_contains(plan, &["dealt_to=2"]);
        }
    }
    Ok(())
}

/// A windowed cluster feed over a table without rows has no windows; its
/// one (empty) job is dealt as an epoch of its own, and every rank gets no
/// batch, as embedded.
#[cfg(feature = "ballista")]
#[test]
fn a_windowed_cluster_feed_over_no_rows_gives_no_batch() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 1, 0, 100)?;
    let sql = format!("SELECT id FROM {table}");
    let run = |session: &sqlfeed::Session, rank: usize| {
        fed_column(session, &sql, "id", |feed| {
            feed.shuffle(3)
                .shuffle_window(100)
                .batch_size(8)
                .shard(rank, 2)
                .epochs(1)
        })
    };
    let cluster = standalone_cluster()?;
    let embedded = session(3, 100)?;
    for rank in 0..2 {
        let (on_cluster, _) = run(&cluster, rank)?;
        let (here, _) = run(&embedded, rank)?;
        assert_eq!(on_cluster, here, "rank {rank}");
        assert!(here.is_empty(), "{here:?}");
    }
    Ok(())
}

/// `MIX … WINDOW` runs on the embedded engine: the client refuses it by
/// name before the plan leaves, rather than let a scheduler plan global
/// passes, which would give other rows than the embedded engine.
#[cfg(feature = "ballista")]
#[test]
fn a_windowed_mixture_on_a_cluster_is_refused_by_name() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = write_ids(dir.path(), 3, 40, 16)?;
    let session = standalone_cluster()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let error = runtime
        .block_on(async {
            let sql = format!(
                "SELECT id FROM (MIX (SELECT id FROM {data}) AS a WEIGHT 1, \
                 (SELECT id FROM {data}) AS b WEIGHT 1 SEED 3 WINDOW 16)"
            );
            session.collect(session.sql(&sql).await?).await
        })
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains("MIX … WINDOW 16") && error.contains("embedded engine"),
        "{error}"
    );
    Ok(())
}
