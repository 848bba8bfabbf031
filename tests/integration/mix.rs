//! `MIX` (issue 28): weighted mixtures of sources, stratified in every batch
//! on every rank, a pure function of (data, weights, rows, seed, epoch), and
//! resumable in feeds.

use std::collections::BTreeMap;
use std::path::Path;

use datafusion::arrow::array::{Int32Array, Int64Array, RecordBatch};
use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::device::Device;
use sqlfeed::feed::Feed;

use crate::common::{
    arc, assert_contains, collect, rows, sized_session as session, write_parquet,
};

/// Ids of `web` start here, of `code` at 10 000 and of `math` at 20 000.
fn source_of(id: i64) -> usize {
    (id / 10_000) as usize
}

/// Quotas of [`mixture`]: 0.6, 0.25 and 0.15 of 400 rows.
const QUOTAS: [u64; 3] = [240, 100, 60];

/// Three sources: `web` 600 rows in two files (down-sampled to 240 per
/// epoch), `code` 50 rows (repeated to 100), `math` 200 of 400 rows after a
/// filter (60 per epoch).
fn mixture(dir: &Path, extra: &str) -> Result<String> {
    for (name, start, rows, files) in [
        ("web", 0, 600, 2),
        ("code", 10_000, 50, 1),
        ("math", 20_000, 400, 1),
    ] {
        std::fs::create_dir_all(dir.join(name))?;
        let per_file = rows / files;
        for file in 0..files {
            let first = start + file * per_file;
            let ids = Int64Array::from_iter_values(first..first + per_file);
            let batch = RecordBatch::try_from_iter(vec![("id", arc(ids))])?;
            write_parquet(&dir.join(name).join(format!("part-{file}.parquet")), &batch)?;
        }
    }
    let d = dir.display();
    Ok(format!(
        "MIX (SELECT id FROM '{d}/web/*.parquet') AS web WEIGHT 0.6, \
             (SELECT id FROM '{d}/code/*.parquet') AS code WEIGHT 0.25, \
             (SELECT id FROM '{d}/math/*.parquet' WHERE id % 2 = 0) AS math WEIGHT 0.15 \
         ROWS 400 {extra}"
    ))
}

async fn ids(session: &Session, sql: &str) -> Result<Vec<i64>> {
    Ok(rows(&collect(session, sql).await?)
        .into_iter()
        .map(|row| row[0].parse().expect("an id"))
        .collect())
}

/// (epoch, step, ids) of every batch of `builder`'s feed on the CPU.
fn fed(builder: sqlfeed::feed::FeedBuilder) -> Result<Vec<(u64, u64, Vec<i64>)>> {
    builder
        .device(Device::Cpu)
        .build()?
        .map(|b| {
            let b = b?;
            Ok((
                b.epoch(),
                b.step(),
                b.tensor("id")?.as_slice::<i64>()?.to_vec(),
            ))
        })
        .collect()
}

/// The error building `builder`'s feed on the CPU fails with (`what` says
/// why it must).
fn refused(builder: sqlfeed::feed::FeedBuilder, what: &str) -> String {
    builder
        .device(Device::Cpu)
        .build()
        .map(|_| ())
        .expect_err(what)
        .to_string()
}

#[tokio::test]
async fn every_epoch_takes_each_share_covers_before_repeating_and_names_sources()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let mix = mixture(dir.path(), "SEED 5")?;
    let session = session(2, 64)?;
    let mut web_seen: BTreeMap<i64, u32> = BTreeMap::new();
    for epoch in 0..3 {
        let ids = ids(&session, &format!("SELECT id FROM ({mix} EPOCH {epoch})")).await?;
        let mut counts = [0u64; 3];
        let mut per_id: BTreeMap<i64, u32> = BTreeMap::new();
        for &id in &ids {
            counts[source_of(id)] += 1;
            *per_id.entry(id).or_default() += 1;
        }
        assert_eq!(counts, QUOTAS, "epoch {epoch}");
        // Down-sampled: no web row twice in an epoch within one pass (epoch
        // 2 crosses from web's first pass into its second, where a row of
        // the first's tail may come again); repeated: every code row exactly
        // twice; filtered: only even math ids.
        for (&id, &n) in &per_id {
            match source_of(id) {
                0 if epoch < 2 => assert_eq!(n, 1, "web row {id} in epoch {epoch}"),
                0 => assert!(n <= 2, "web row {id} ×{n} in epoch {epoch}"),
                1 => assert_eq!(n, 2, "code row {id} in epoch {epoch}"),
                _ => assert!(id % 2 == 0 && n == 1, "math row {id} ×{n}"),
            }
        }
        assert_eq!(per_id.keys().filter(|&&id| source_of(id) == 1).count(), 50);
        for id in ids.iter().filter(|&&id| source_of(id) == 0) {
            *web_seen.entry(*id).or_default() += 1;
        }
        if epoch == 1 {
            // Epochs 0 and 1 are disjoint slices of web's first pass.
            assert!(web_seen.values().all(|&n| n == 1));
            assert_eq!(web_seen.len(), 480);
        }
    }
    // Three epochs of 240 cover all 600 web rows.
    assert_eq!(web_seen.len(), 600);
    // The source column names each row's source.
    let named = rows(
        &collect(
            &session,
            &format!(
                "SELECT source, source_id, count(*), count(DISTINCT id), \
                 min(id / 10000), max(id / 10000) \
                 FROM ({mix}) GROUP BY source, source_id ORDER BY source"
            ),
        )
        .await?,
    );
    // … and source_id its position, which a feed hands over as a tensor.
    assert_eq!(
        named,
        vec![
            vec!["code", "1", "100", "50", "1", "1"],
            vec!["math", "2", "60", "60", "2", "2"],
            vec!["web", "0", "240", "240", "0", "0"],
        ]
    );
    let batches = Feed::builder(&session, format!("SELECT id, source_id FROM ({mix})"))
        .batch_size(40)
        .device(Device::Cpu)
        .build()?
        .collect::<Result<Vec<_>>>()?;
    assert_eq!(batches.len(), 10);
    for batch in &batches {
        let ids = batch.tensor("id")?.as_slice::<i64>()?.to_vec();
        let source_ids = batch.tensor("source_id")?.as_slice::<i64>()?.to_vec();
        let expected: Vec<i64> = ids.iter().map(|&id| source_of(id) as i64).collect();
        assert_eq!(source_ids, expected);
    }
    Ok(())
}

#[tokio::test]
async fn the_order_is_the_same_on_any_partitions_and_batch_size_and_new_each_epoch()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let mix = mixture(dir.path(), "SEED 9")?;
    let one = ids(&session(1, 8192)?, &format!("SELECT id FROM ({mix})")).await?;
    let many = ids(&session(4, 7)?, &format!("SELECT id FROM ({mix})")).await?;
    assert_eq!(one, many);
    let other_epoch =
        ids(&session(2, 64)?, &format!("SELECT id FROM ({mix} EPOCH 1)")).await?;
    assert_ne!(one, other_epoch);
    let other_seed = ids(
        &session(2, 64)?,
        &format!("SELECT id FROM ({})", mixture(dir.path(), "SEED 10")?),
    )
    .await?;
    assert_ne!(one, other_seed);
    Ok(())
}

/// Every batch of 16 rows on each of 2 ranks holds each source's share
/// (16 × q/400: 9.6, 4 and 2.4) within 2 rows, in every epoch.
#[test]
fn every_batch_on_every_rank_holds_each_share() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mix = mixture(dir.path(), "SEED 3")?;
    let session = session(2, 64)?;
    let (batch, world) = (16u64, 2);
    let mut batches = 0;
    for rank in 0..world {
        let mut feed = Feed::builder(&session, format!("SELECT id FROM ({mix})"))
            .batch_size(batch as usize)
            .drop_last(true)
            .shard(rank, world)
            .epochs(2)
            .device(Device::Cpu)
            .build()?;
        for fed in feed.by_ref() {
            let fed = fed?;
            let ids = fed.tensor("id")?.as_slice::<i64>()?.to_vec();
            let mut counts = [0u64; 3];
            for id in ids {
                counts[source_of(id)] += 1;
            }
            for (k, &count) in counts.iter().enumerate() {
                let share = (QUOTAS[k] * batch) as f64 / 400.0;
                assert!(
                    (count as f64 - share).abs() < 2.0,
                    "rank {rank} epoch {} step {}: source {k} has {count} rows, share {share}",
                    fed.epoch(),
                    fed.step()
                );
                assert!(count > 0, "source {k} missing from a batch");
            }
            batches += 1;
        }
        // The realised rows per source of each epoch (all ranks together).
        let given: Vec<(String, u64)> = ["web", "code", "math"]
            .iter()
            .zip(QUOTAS)
            .map(|(name, rows)| (name.to_string(), rows))
            .collect();
        assert_eq!(
            feed.epoch_mixtures(),
            &[(0, given.clone()), (1, given)],
            "rank {rank}"
        );
    }
    // 400 rows: 12 global steps of 32 per epoch, 2 epochs, 2 ranks.
    assert_eq!(batches, 12 * 2 * 2);
    Ok(())
}

/// A source read in two passes runs its plan twice, each run with state of
/// its own: with file work stealing (DataFusion's default, and a feed's over
/// a mixture) the second pass used to find the first's queue of files
/// drained and end short of its share.
#[test]
fn a_source_read_in_two_passes_gives_every_row_twice() -> Result<()> {
    let dir = tempfile::tempdir()?;
    mixture(dir.path(), "")?;
    let d = dir.path().display();
    // web: 600 rows in 2 files, 900 of 1000 rows: two passes; a function,
    // so that the passes read the rows as they enter it.
    let mix = format!(
        "SELECT id FROM (MIX (SELECT abs(id) AS id FROM '{d}/web/*.parquet') AS web WEIGHT 0.9, \
         (SELECT id FROM '{d}/code/*.parquet') AS code WEIGHT 0.1 ROWS 1000 SEED 6)"
    );
    for partitions in [2, 3] {
        let session = session(partitions, 16)?;
        let batches = fed(Feed::builder(&session, mix.clone()).batch_size(100))?;
        let ids: Vec<i64> = batches.into_iter().flat_map(|(_, _, ids)| ids).collect();
        let mut seen = std::collections::HashMap::<i64, usize>::new();
        for id in ids.iter().filter(|&&id| source_of(id) == 0) {
            *seen.entry(*id).or_default() += 1;
        }
        // 900 = all 600 once, then 300 of them again.
        assert_eq!(seen.len(), 600, "{partitions} partitions");
        assert_eq!(seen.values().filter(|&&n| n == 2).count(), 300);
    }
    Ok(())
}

/// A feed over a mixture plans with the session's partitions (the order is
/// the content's, see `feed/order.rs`): its batches are the same on any.
#[test]
fn a_mixture_feed_gives_the_same_batches_on_any_partitions() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mix = mixture(dir.path(), "SEED 5")?;
    let run = |partitions: usize| -> Result<Vec<(u64, u64, Vec<i64>)>> {
        let session = session(partitions, 64)?;
        fed(Feed::builder(
            &session,
            format!("SELECT id FROM ({mix}) WHERE id % 3 <> 1"),
        )
        .batch_size(10)
        .epochs(2))
    };
    let one = run(1)?;
    assert!(one.len() > 20, "{} batches", one.len());
    assert_eq!(one, run(3)?);
    assert_eq!(one, run(8)?);
    Ok(())
}

#[test]
fn a_resumed_feed_gives_the_same_batches_and_epochs_differ() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mix = mixture(dir.path(), "SEED 4")?;
    let session = session(2, 64)?;
    let run = |resume: Option<(u64, u64)>| -> Result<Vec<(u64, u64, Vec<i64>)>> {
        let mut builder = Feed::builder(&session, format!("SELECT id FROM ({mix})"))
            .batch_size(10)
            .epochs(2);
        if let Some((epoch, step)) = resume {
            builder = builder.resume_at(epoch, step);
        }
        fed(builder)
    };
    let whole = run(None)?;
    let resumed = run(Some((1, 7)))?;
    let from = whole
        .iter()
        .position(|(e, s, _)| (*e, *s) == (1, 7))
        .expect("epoch 1 step 7");
    assert_eq!(resumed, whole[from..].to_vec());
    // In a feed the mixture takes the feed's epoch: epoch 1 is a new draw.
    let epoch = |e: u64| -> Vec<i64> {
        whole
            .iter()
            .filter(|(x, _, _)| *x == e)
            .flat_map(|(_, _, ids)| ids.clone())
            .collect()
    };
    assert_ne!(epoch(0), epoch(1));
    assert_eq!(epoch(0).len(), 400);
    Ok(())
}

/// A mixture's rows are known once it is planned: `count(*)` is answered
/// from its plan without running a pass, and a feed over it knows its length.
#[tokio::test]
async fn a_mixtures_count_comes_from_its_plan() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mix = mixture(dir.path(), "SEED 4")?;
    let session = session(2, 64)?;
    let count = format!("SELECT count(*) FROM ({mix})");
    assert_eq!(rows(&collect(&session, &count).await?), vec![vec!["400"]]);
    let explained = rows(&collect(&session, &format!("EXPLAIN {count}")).await?);
    let physical = explained
        .iter()
        .find(|row| row[0] == "physical_plan")
        .expect("EXPLAIN has a physical plan");
    assert!(!physical[1].contains("MixExec"), "{}", physical[1]);

    // 400 rows in steps of 30 × 2 ranks: 7 a rank, the last one padded.
    let length = Feed::builder(&session, format!("SELECT id FROM ({mix})"))
        .batch_size(30)
        .shard(1, 2)
        .epochs(3)
        .length();
    let epoch_rows = length.rows_per_epoch().await?;
    assert_eq!(epoch_rows, 400);
    assert_eq!(length.batches_per_epoch(epoch_rows), Some(7));
    assert_eq!(length.batches_in_run(epoch_rows), Some(21));
    Ok(())
}

#[test]
fn feeds_that_would_undo_a_mixture_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mix = mixture(dir.path(), "")?;
    let session = session(2, 64)?;
    let shuffled = refused(
        Feed::builder(&session, format!("SELECT id FROM ({mix})")).shuffle(1),
        "a shuffled feed over a mixture is refused",
    );
    assert_contains(&shuffled, &["without a shuffle", "SEED"]);
    // A feed shuffled in windows is told the mixture's own windows.
    let windowed = refused(
        Feed::builder(&session, format!("SELECT id FROM ({mix})"))
            .shuffle(1)
            .shuffle_window(64),
        "a windowed feed over a mixture is refused",
    );
    assert_contains(&windowed, &["without a shuffle", "MIX … WINDOW 64"]);
    Ok(())
}

/// The epoch cache keeps each source's rows, and the mixture is drawn anew
/// from them every epoch: the batches are the uncached feed's, also after
/// the sources' files are gone, and a later run reuses the entries.
#[test]
fn a_cached_feed_keeps_the_sources_and_draws_each_epoch_from_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let mix = mixture(&data, "SEED 4")?;
    let cache = dir.path().join("cache");
    let session = Session::builder()
        .target_partitions(2)
        .batch_size(64)
        .memory_limit(256 << 20)
        .cache_dir(&cache)
        .build()?;
    let builder = |cached: bool| {
        Feed::builder(&session, format!("SELECT id FROM ({mix})"))
            .batch_size(16)
            .epochs(3)
            .cache(cached)
            .device(Device::Cpu)
    };
    let uncached = fed(builder(false))?;
    assert_eq!(uncached.len(), 3 * 400 / 16);

    let run = |moved: Option<&Path>| -> Result<Vec<(u64, u64, Vec<i64>)>> {
        let mut batches = vec![];
        for batch in builder(true).build()? {
            let batch = batch?;
            // The entries are filled before the first batch: from here on
            // the sources' files are not read.
            if let Some(moved) = moved.filter(|_| batches.is_empty()) {
                std::fs::rename(&data, moved)?;
            }
            batches.push((
                batch.epoch(),
                batch.step(),
                batch.tensor("id")?.as_slice::<i64>()?.to_vec(),
            ));
        }
        Ok(batches)
    };
    let moved = dir.path().join("moved");
    assert_eq!(run(Some(&moved))?, uncached);
    let entries = std::fs::read_dir(cache.join("entries"))?.count();
    assert_eq!(entries, 3, "one entry per source");

    // A later feed over the same files finds the three entries.
    std::fs::rename(&moved, &data)?;
    assert_eq!(run(None)?, uncached);
    assert_eq!(std::fs::read_dir(cache.join("entries"))?.count(), 3);
    Ok(())
}

#[tokio::test]
async fn sources_are_aligned_to_the_first_or_refused_by_name() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ints = Int32Array::from_iter_values(0..5);
    write_parquet(
        &dir.path().join("narrow.parquet"),
        &RecordBatch::try_from_iter(vec![("n", arc(ints))])?,
    )?;
    let d = dir.path().display();
    let session = session(2, 64)?;
    // An Int32 source after an Int64 one is cast, and takes the first's name.
    let mixed = rows(
        &collect(
            &session,
            &format!(
                "SELECT arrow_typeof(v), count(*) FROM (MIX \
                 (SELECT value AS v FROM generate_series(1, 5)) WEIGHT 1, \
                 (SELECT n FROM '{d}/narrow.parquet') WEIGHT 1) GROUP BY 1"
            ),
        )
        .await?,
    );
    assert_eq!(mixed, vec![vec!["Int64", "10"]]);
    let err = collect(
        &session,
        "MIX (SELECT 1 AS a, 2 AS b) WEIGHT 1, (SELECT 1 AS a) AS other WEIGHT 1",
    )
    .await
    .expect_err("different columns")
    .to_string();
    assert!(err.contains("column"), "{err}");
    let empty = collect(
        &session,
        "MIX (SELECT 1 AS a) WEIGHT 1, (SELECT 1 AS a WHERE false) AS nothing WEIGHT 1 ROWS 4",
    )
    .await
    .expect_err("a source without rows")
    .to_string();
    assert_contains(&empty, &["'nothing'", "no rows"]);
    Ok(())
}

/// Weights by step: `a` 0.8 until step 5, then 0.2, in steps of the feed's
/// global batch (10 rows × 2 ranks): every global step holds 16 and 4 rows
/// before the jump and 4 and 16 from it on, across the epoch boundary
/// (epochs of 150 rows end mid-step), and a resumed rank gets the same.
#[test]
fn weights_by_step_follow_the_feeds_global_steps() -> Result<()> {
    let dir = tempfile::tempdir()?;
    mixture(dir.path(), "")?;
    let d = dir.path().display();
    let sql = format!(
        "SELECT id FROM (MIX (SELECT id FROM '{d}/web/*.parquet') AS a \
         WEIGHT STEPS (0: 0.8, 5: 0.8, 5: 0.2), \
         (SELECT id FROM '{d}/code/*.parquet') AS b WEIGHT STEPS (0: 0.2, 5: 0.2, 5: 0.8) \
         ROWS 150 SEED 2)"
    );
    let session = session(2, 64)?;
    let rank =
        |r: usize, resume: Option<(u64, u64)>| -> Result<Vec<(u64, u64, Vec<i64>)>> {
            let mut builder = Feed::builder(&session, sql.clone())
                .batch_size(10)
                .shard(r, 2)
                .epochs(2);
            if let Some((e, s)) = resume {
                builder = builder.resume_at(e, s);
            }
            fed(builder)
        };
    let (zero, one) = (rank(0, None)?, rank(1, None)?);
    assert_eq!(zero.len(), one.len());
    // Global steps run on over epochs: 7.5 steps per epoch.
    let mut stream: Vec<i64> = vec![];
    for epoch in 0..2 {
        for ((_, _, a), (_, _, b)) in zero.iter().zip(&one).filter(|(x, _)| x.0 == epoch)
        {
            stream.extend(a);
            stream.extend(b);
        }
        // The padded last step repeats the epoch's first rows: cut it.
        stream.truncate(150 * (epoch as usize + 1));
    }
    for (step, rows) in stream.chunks_exact(20).enumerate() {
        let a = rows.iter().filter(|&&id| source_of(id) == 0).count();
        assert_eq!(a, if step < 5 { 16 } else { 4 }, "global step {step}");
    }
    let from = zero
        .iter()
        .position(|(e, s, _)| (*e, *s) == (0, 6))
        .expect("step 6");
    assert_eq!(rank(0, Some((0, 6)))?, zero[from..].to_vec());
    Ok(())
}

#[tokio::test]
async fn weights_by_step_outside_a_feed_need_a_step_size() -> Result<()> {
    let session = session(2, 64)?;
    let mix =
        "MIX (SELECT 1 AS a) WEIGHT STEPS (0: 1, 2: 0), (SELECT 2 AS a) WEIGHT 1 ROWS 8";
    let err = collect(&session, mix)
        .await
        .expect_err("no BATCH")
        .to_string();
    assert!(err.contains("BATCH <rows>"), "{err}");
    let ids = rows(&collect(&session, &format!("SELECT a FROM ({mix} BATCH 4)")).await?);
    // Step 0 (rows 0-3): weights 1 and 1; step 1: 0.5 and 1; step 2 on: 0 and 1.
    let ones: Vec<usize> = ids
        .chunks(4)
        .map(|c| c.iter().filter(|r| r[0] == "1").count())
        .collect();
    assert_eq!(ones, vec![2, 1]);
    Ok(())
}

/// `counted(id)`: `id`, counting the rows it is called on in `calls`.
/// `counted(id)` = `id`, counting the rows it is called on; `costly` as a
/// user function that declares itself costly per row (like a decoder).
fn counted(
    calls: &std::sync::Arc<std::sync::atomic::AtomicU64>,
    costly: bool,
) -> datafusion::logical_expr::ScalarUDF {
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
    use sqlfeed_udfs::user::{FunctionOrigin, UserFunction};
    let calls = std::sync::Arc::clone(calls);
    let udf = create_udf(
        "counted",
        vec![DataType::Int64],
        DataType::Int64,
        Volatility::Immutable,
        std::sync::Arc::new(move |args: &[ColumnarValue]| {
            let rows = match &args[0] {
                ColumnarValue::Array(array) => array.len(),
                ColumnarValue::Scalar(_) => 1,
            };
            calls.fetch_add(rows as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(args[0].clone())
        }),
    );
    if !costly {
        return udf;
    }
    let origin = FunctionOrigin::Python {
        qualname: "tests.counted".into(),
    };
    UserFunction::new(udf, "counted-1".into(), true, origin).into_udf()
}

/// A source's costly functions run on the rows its window takes, not on
/// every row of every pass: 400 evaluations per epoch of 400 rows, where the
/// sources hold 850 rows (web down-sampled, code read in two passes). With
/// the epoch cache the kept rows are those the functions read, and the
/// batches are the uncached feed's. A cheap function runs before each pass's
/// permutation instead, on every row of the pass, with the same batches.
#[test]
fn a_sources_costly_functions_run_on_the_rows_its_window_takes() -> Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let mix = mixture(&data, "SEED 2")?
        .replace("SELECT id FROM", "SELECT counted(id) AS id FROM");
    let calls = std::sync::Arc::new(AtomicU64::new(0));
    let session = Session::builder()
        .target_partitions(2)
        .batch_size(64)
        .memory_limit(256 << 20)
        .cache_dir(dir.path().join("cache"))
        .build()?;
    session.context().register_udf(counted(&calls, true));
    let builder = |cached: bool| {
        Feed::builder(&session, format!("SELECT id FROM ({mix})"))
            .batch_size(16)
            .epochs(2)
            .cache(cached)
            .device(Device::Cpu)
    };
    let uncached = fed(builder(false))?;
    assert_eq!(uncached.len(), 2 * 400 / 16);
    assert_eq!(calls.swap(0, Ordering::Relaxed), 2 * 400);
    // The shares hold with the functions moved.
    let mut per_source = [0u64; 3];
    for (_, _, ids) in uncached.iter().take(400 / 16) {
        for id in ids {
            per_source[source_of(*id)] += 1;
        }
    }
    assert_eq!(per_source, QUOTAS);

    let cached = fed(builder(true))?;
    assert_eq!(cached, uncached);
    assert_eq!(calls.swap(0, Ordering::Relaxed), 2 * 400);

    session.context().register_udf(counted(&calls, false));
    assert_eq!(fed(builder(false))?, uncached);
    let cheap_calls = calls.swap(0, Ordering::Relaxed);
    assert!(cheap_calls > 2 * 400, "{cheap_calls} calls");
    Ok(())
}

/// Sources in files of 100 rows (one row group each, so a unit of a
/// windowed pass): `web` 600 rows in 6 files, `code` 50 rows in 1, `math`
/// 400 rows in 4 with a filter keeping half. Returns the three sources'
/// queries.
fn sources_in_units(dir: &Path) -> Result<[String; 3]> {
    for (name, start, files) in [("web", 0, 6), ("code", 10_000, 1), ("math", 20_000, 4)]
    {
        for file in 0..files {
            let first = start + file * 100;
            let rows = if name == "code" { 50 } else { 100 };
            let ids = Int64Array::from_iter_values(first..first + rows);
            let batch = RecordBatch::try_from_iter(vec![("id", arc(ids))])?;
            write_parquet(&dir.join(name).join(format!("part-{file}.parquet")), &batch)?;
        }
    }
    let d = dir.display();
    Ok([
        format!("SELECT id FROM '{d}/web/*.parquet'"),
        format!("SELECT id FROM '{d}/code/*.parquet'"),
        format!("SELECT id FROM '{d}/math/*.parquet' WHERE id % 2 = 0"),
    ])
}

/// `MIX … WINDOW n` (issue 55): each pass over a source is that source's
/// `SHUFFLE WINDOW n` with the source's seed and the pass as its epoch, and
/// epoch `e` takes the same slice of the passes laid end to end as without
/// WINDOW: checked source by source against the windowed shuffles
/// themselves, over epochs whose slices start inside a pass (whole windows
/// skipped, `web`), straddle two passes (`code`, `web` in epoch 2) and come
/// from a filtered source (read and dropped, `math`).
#[tokio::test]
async fn a_windowed_mixture_takes_each_share_from_windowed_passes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sources = sources_in_units(dir.path())?;
    let session = session(2, 16)?;
    let mix = |epoch: u64| {
        format!(
            "SELECT id FROM (MIX ({}) AS web WEIGHT 0.6, ({}) AS code WEIGHT 0.25, \
             ({}) AS math WEIGHT 0.15 ROWS 400 SEED 5 EPOCH {epoch} WINDOW 150)",
            sources[0], sources[1], sources[2]
        )
    };
    // Each source's passes laid end to end, from its windowed shuffles (a
    // source's rows carry its `source` and `source_id` columns, which its
    // passes key on too).
    let mut passes: Vec<Vec<i64>> = vec![vec![]; 3];
    for (k, (source, name)) in sources.iter().zip(["web", "code", "math"]).enumerate() {
        let seed = sqlfeed::shuffle::mix::source_seed(5, k);
        let with_columns = source.replacen(
            "SELECT id",
            &format!("SELECT id, '{name}' AS source, {k} AS source_id"),
            1,
        );
        // Four epochs take at most 400 rows of a source (code's 100 a
        // epoch): 8 passes of its 50 rows.
        for pass in 0..8 {
            let order = ids(
                &session,
                &format!("{with_columns} SHUFFLE WINDOW 150 SEED {seed} EPOCH {pass}"),
            )
            .await?;
            passes[k].extend(order);
        }
    }
    for epoch in 0..4u64 {
        let got = ids(&session, &mix(epoch)).await?;
        assert_eq!(got.len(), 400, "epoch {epoch}");
        for (k, &quota) in QUOTAS.iter().enumerate() {
            let taken: Vec<i64> = got
                .iter()
                .copied()
                .filter(|&id| source_of(id) == k)
                .collect();
            let start = (epoch * quota) as usize;
            assert_eq!(
                taken,
                passes[k][start..start + quota as usize],
                "source {k}, epoch {epoch}"
            );
        }
    }
    // Epoch 2 of web starts at row 480 of its first pass (windows of 200
    // rows): two windows are skipped from the footers without being run.
    // Math's starts at row 120 (windows of 100 rows its filter keeps,
    // counted): one is skipped.
    let analyzed =
        rows(&collect(&session, &format!("EXPLAIN ANALYZE {}", mix(2))).await?);
    let plan = analyzed.concat().join("\n");
    for (start, skipped) in [
        ("start_row=480,", "windows_skipped=2,"),
        ("start_row=120,", "windows_skipped=1,"),
    ] {
        let line = plan
            .lines()
            .find(|line| line.contains(start))
            .unwrap_or_else(|| panic!("no pass starts at {start}\n{plan}"));
        assert!(line.contains(skipped), "{line}");
    }
    Ok(())
}

/// A windowed mixture is also a feed's: the same batches on any partitions,
/// every epoch a new draw, a resumed feed exact.
#[test]
fn a_windowed_mixture_feed_is_the_same_on_any_partitions_and_resumes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sources = sources_in_units(dir.path())?;
    let mix = format!(
        "SELECT id FROM (MIX ({}) AS web WEIGHT 0.6, ({}) AS code WEIGHT 0.25, \
         ({}) AS math WEIGHT 0.15 ROWS 400 SEED 9 WINDOW 150)",
        sources[0], sources[1], sources[2]
    );
    let run = |partitions: usize| -> Result<Vec<(u64, u64, Vec<i64>)>> {
        let session = session(partitions, 16)?;
        fed(Feed::builder(&session, mix.clone())
            .batch_size(40)
            .epochs(3))
    };
    let two = run(2)?;
    assert_eq!(two.len(), 30);
    assert_eq!(run(3)?, two);
    assert_ne!(two[0].2, two[10].2, "epochs draw anew");
    let session = session(2, 16)?;
    let resumed = fed(Feed::builder(&session, mix.clone())
        .batch_size(40)
        .epochs(3)
        .resume_at(1, 4))?;
    assert_eq!(resumed, two[14..].to_vec());
    Ok(())
}

/// What `MIX … WINDOW` cannot do is refused, naming what to change.
#[tokio::test]
async fn a_windowed_mixture_refuses_what_it_cannot_do() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sources = sources_in_units(dir.path())?;
    let session = session(2, 16)?;
    let with = |window: &str, web: &str| {
        format!(
            "SELECT id FROM (MIX ({web}) AS web WEIGHT 1, ({}) AS code WEIGHT 1 {window})",
            sources[1]
        )
    };
    let zero = session
        .sql(&with("WINDOW 0", &sources[0]))
        .await
        .map(|_| ());
    assert_contains(
        &zero.expect_err("no rows").to_string(),
        &["WINDOW", "at least 1"],
    );
    let twice = session
        .sql(&with("WINDOW 10 WINDOW 20", &sources[0]))
        .await
        .map(|_| ());
    assert_contains(&twice.expect_err("twice").to_string(), &["WINDOW once"]);
    // A source that is not row-wise over one Parquet table.
    let grouped = format!("SELECT max(id) AS id FROM ({}) GROUP BY id % 7", sources[0]);
    let error = collect(&session, &with("WINDOW 10", &grouped))
        .await
        .expect_err("an aggregate cannot be cut into windows")
        .to_string();
    assert_contains(
        &error,
        &[
            "MIX … WINDOW 10: source 'web'",
            "AggregateExec",
            "leave WINDOW out",
        ],
    );
    // The epoch cache keeps the sources' rows, not their row groups.
    let cached = refused(
        Feed::builder(&session, with("WINDOW 10", &sources[0])).cache(true),
        "cached",
    );
    assert_contains(
        &cached,
        &["does not work with the epoch cache yet", "leave WINDOW"],
    );
    Ok(())
}
