//! `SHUFFLE BY POSITION` (issue 55): an exact shuffle keyed by each row's
//! Parquet file and row. Every row once; position `p` holds the row of
//! canonical rank `π(p)` (rows ranked by file path, then row index, after
//! the filters); the same on any partition count and batch size, and under
//! any memory limit (an epoch that does not fit is spilled by position
//! range); what it cannot key, refused by name.

use datafusion::error::Result;
use sqlfeed::shuffle::IndexPermutation;

use crate::common::{
    assert_contains, assert_rows_printed, collect, digest_lines, first_int64s as ids,
    sized_session as session, succeeded, write_ids,
};

/// The order the docs define: position `p` holds `ranked[π(p)]`. The files
/// of [`write_ids`] sort in id order, so an id's canonical rank is the id.
fn defined_order(ranked: &[i64], seed: u64, epoch: u64) -> Vec<i64> {
    let permutation = IndexPermutation::new(ranked.len() as u64, seed, epoch);
    (0..permutation.len())
        .map(|p| ranked[permutation.at(p) as usize])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shuffle_by_position_is_the_defined_permutation_on_any_partitions() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 8, 1000, 100)?;
    let sql = |seed: u64, epoch: u64| {
        format!("SELECT id, v FROM {table} SHUFFLE BY POSITION SEED {seed} EPOCH {epoch}")
    };
    let all: Vec<i64> = (0..8000).collect();
    let reference = ids(&collect(&session(1, 8192)?, &sql(3, 0)).await?);
    assert_eq!(reference, defined_order(&all, 3, 0));
    assert_ne!(reference, all);
    for (partitions, batch) in [(2, 7), (4, 100), (3, 8192)] {
        let got = ids(&collect(&session(partitions, batch)?, &sql(3, 0)).await?);
        assert_eq!(
            got, reference,
            "{partitions} partitions, batches of {batch}"
        );
    }
    // Another epoch or seed is another order, each the defined one.
    for (seed, epoch) in [(3, 1), (4, 0)] {
        let got = ids(&collect(&session(2, 64)?, &sql(seed, epoch)).await?);
        assert_eq!(got, defined_order(&all, seed, epoch));
        assert_ne!(got, reference);
    }
    // Uniform, not by file: the first 1000 positions draw from every file,
    // and neighbours in a file are rarely neighbours in the order.
    let files: std::collections::BTreeSet<i64> =
        reference[..1000].iter().map(|id| id / 1000).collect();
    assert_eq!(files.len(), 8, "{files:?}");
    let adjacent = reference
        .windows(2)
        .filter(|w| (w[0] - w[1]).abs() == 1)
        .count();
    assert!(adjacent < 10, "{adjacent} neighbours stayed together");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_ranks_the_rows_it_keeps_and_functions_do_not_change_the_order()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    // Two files: fewer scan partitions than 3 target partitions.
    let table = write_ids(dir.path(), 2, 1000, 64)?;
    let kept: Vec<i64> = (0..2000).filter(|id| id % 7 != 3).collect();
    for partitions in [1, 3] {
        let filtered = ids(&collect(
            &session(partitions, 100)?,
            &format!("SELECT id FROM {table} WHERE v <> 3 SHUFFLE BY POSITION SEED 9"),
        )
        .await?);
        assert_eq!(
            filtered,
            defined_order(&kept, 9, 0),
            "{partitions} partitions"
        );
    }
    // More partitions than file groups: DataFusion would split the scan's
    // batches round-robin under the filter, and its coalescing would join
    // rows of one file from two partitions; the shuffle reads the scan's
    // own partitions instead.
    let s = session(3, 100)?;
    let df = s
        .sql(&format!(
            "SELECT id FROM {table} WHERE v <> 3 SHUFFLE BY POSITION SEED 9"
        ))
        .await?;
    let plan = df.create_physical_plan().await?;
    let shown = datafusion::physical_plan::displayable(plan.as_ref())
        .indent(false)
        .to_string();
    assert!(shown.contains("PositionShuffleExec"), "{shown}");
    assert!(!shown.contains("RoundRobinBatch"), "{shown}");
    // Row-wise functions run after the shuffle (nothing is keyed by them):
    // the same positions, their values computed.
    let twice = ids(&collect(
        &session(2, 100)?,
        &format!(
            "SELECT id * 2 AS twice, v FROM {table} WHERE v <> 3 \
             SHUFFLE BY POSITION SEED 9"
        ),
    )
    .await?);
    let expected: Vec<i64> = defined_order(&kept, 9, 0).iter().map(|id| id * 2).collect();
    assert_eq!(twice, expected);
    // No rows: no batches, no error.
    let none = collect(
        &session(2, 100)?,
        &format!("SELECT id FROM {table} WHERE v > 100 SHUFFLE BY POSITION SEED 1"),
    )
    .await?;
    assert_eq!(ids(&none), Vec::<i64>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_has_no_position_is_refused_by_name() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 2, 100, 50)?;
    let s = session(2, 64)?;
    for (sql, needles) in [
        (
            format!(
                "SELECT v, count(*) AS n FROM {table} GROUP BY v SHUFFLE BY POSITION"
            ),
            &["SHUFFLE BY POSITION", "Aggregate", "Use SHUFFLE"][..],
        ),
        (
            format!(
                "SELECT a.id FROM {table} a JOIN {table} b ON a.id = b.id \
                 SHUFFLE BY POSITION"
            ),
            &["SHUFFLE BY POSITION", "Join", "Use SHUFFLE"][..],
        ),
        (
            format!(
                "SELECT id FROM {table} UNION ALL SELECT id FROM {table} \
                 SHUFFLE BY POSITION"
            ),
            &["SHUFFLE BY POSITION", "Union", "Use SHUFFLE"][..],
        ),
        (
            "SELECT value FROM generate_series(1, 10) SHUFFLE BY POSITION".to_string(),
            &["SHUFFLE BY POSITION", "Use SHUFFLE"][..],
        ),
        (
            format!("SELECT id FROM {table} SHUFFLE BY POSITION WINDOW 10"),
            &["has no WINDOW", "SHUFFLE WINDOW n or SHUFFLE BY POSITION"][..],
        ),
        (
            format!("SELECT id FROM {table} SHUFFLE BY CONTENT"),
            &["SHUFFLE BY takes POSITION"][..],
        ),
        (
            format!("SELECT id FROM {table} SHUFFLE BY POSITION BY POSITION"),
            &["BY POSITION once"][..],
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
    // Rows whose errors are isolated (a quarantining query): a failing
    // row keeps its position, marked above the shuffle, and no row moves.
    let isolating = session(2, 64)?;
    collect(&isolating, "SET sqlfeed.isolate_row_errors = true").await?;
    // As a quarantining feed sets it: cheap functions stay above the
    // shuffle, in the projection whose failing rows are isolated.
    collect(&isolating, "SET sqlfeed.carry_cheap_outputs = false").await?;
    let isolated = collect(
        &isolating,
        &format!(
            "SELECT id, CAST(CASE WHEN id % 50 = 7 THEN 'bad' ELSE CAST(id AS VARCHAR) \
             END AS BIGINT) AS w FROM {table} SHUFFLE BY POSITION SEED 1"
        ),
    )
    .await?;
    let schema = isolated[0].schema();
    assert_eq!(
        schema.fields().last().map(|f| f.name().as_str()),
        Some("__sqlfeed_row_error"),
        "the marker column comes last, after the shuffle"
    );
    let all: Vec<i64> = (0..200).collect();
    let expected: Vec<Option<i64>> = defined_order(&all, 1, 0)
        .into_iter()
        .map(|id| (id % 50 != 7).then_some(id))
        .collect();
    let got: Vec<Option<i64>> = isolated
        .iter()
        .flat_map(|b| {
            use datafusion::arrow::array::AsArray;
            let w = b
                .column(1)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
            w.iter().collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        got, expected,
        "a failing row's slot is null, the others in order"
    );
    Ok(())
}

/// The `ranges` metric of the plan's `PositionShuffleExec`: the position
/// ranges it spilled the epoch in, 0 when the epoch was held whole.
fn ranges_spilled(
    plan: &std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
) -> usize {
    position_metric(plan, "ranges")
}

/// `sql` planned and run on `session`: the plan (its metrics read after)
/// and the batches.
async fn planned(
    session: &sqlfeed::Session,
    sql: &str,
) -> Result<(
    std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    Vec<datafusion::arrow::array::RecordBatch>,
)> {
    let plan = session.sql(sql).await?.create_physical_plan().await?;
    let batches = datafusion::physical_plan::collect(
        std::sync::Arc::clone(&plan),
        session.context().task_ctx(),
    )
    .await?;
    Ok((plan, batches))
}

/// A session of `partitions` partitions and batches of `batch_size` rows
/// under a memory limit of `bytes`.
fn limited_session(
    partitions: usize,
    batch_size: usize,
    bytes: usize,
) -> Result<sqlfeed::Session> {
    sqlfeed::Session::builder()
        .target_partitions(partitions)
        .batch_size(batch_size)
        .memory_limit(bytes)
        .build()
}

/// Metric `name` of the plan's `PositionShuffleExec`, 0 if it has none.
fn position_metric(
    plan: &std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    name: &str,
) -> usize {
    let mut node = std::sync::Arc::clone(plan);
    loop {
        if node.name() == "PositionShuffleExec" {
            return node
                .metrics()
                .and_then(|m| m.sum_by_name(name))
                .map_or(0, |v| v.as_usize());
        }
        let Some(child) = node.children().first().map(|c| std::sync::Arc::clone(c))
        else {
            return 0;
        };
        node = child;
    }
}

/// An epoch by position that does not fit the memory limit is spilled by
/// position range (the plan's metrics say in how many), and gives the rows
/// and order it gives held whole: with and without a filter (rows then
/// counted by reading every row group first), with a function above the
/// shuffle, on 1 and 2 partitions, with row groups larger than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_that_does_not_fit_is_spilled_by_position_range_in_the_same_order()
-> Result<()> {
    use datafusion::arrow::compute::concat_batches;
    let dir = tempfile::tempdir()?;
    // 200k rows of (id, v): 3.2 MB held; row groups of 10k rows (160 KB).
    let table = write_ids(dir.path(), 2, 100_000, 10_000)?;
    // The same rows in one row group a file (1.6 MB each).
    let whole_files = tempfile::tempdir()?;
    let one_group = write_ids(whole_files.path(), 2, 100_000, 100_000)?;
    let all: Vec<i64> = (0..200_000).collect();
    let kept: Vec<i64> = all.iter().copied().filter(|id| id % 7 != 3).collect();
    for (sql, expected) in [
        (
            format!("SELECT id, v FROM {table} SHUFFLE BY POSITION SEED 3"),
            defined_order(&all, 3, 0),
        ),
        (
            format!("SELECT id, v FROM {one_group} SHUFFLE BY POSITION SEED 3"),
            defined_order(&all, 3, 0),
        ),
        (
            format!(
                "SELECT id, v * 2 AS w FROM {one_group} WHERE v <> 3 \
                 SHUFFLE BY POSITION SEED 3 EPOCH 1"
            ),
            defined_order(&kept, 3, 1),
        ),
        (
            format!(
                "SELECT id, v * 2 AS w FROM {table} WHERE v <> 3 \
                 SHUFFLE BY POSITION SEED 3 EPOCH 1"
            ),
            defined_order(&kept, 3, 1),
        ),
    ] {
        let roomy = session(2, 4096)?;
        let (plan, whole) = planned(&roomy, &sql).await?;
        assert_eq!(ranges_spilled(&plan), 0, "held whole: {sql}");
        assert_eq!(ids(&whole), expected, "{sql}");
        let whole = concat_batches(&whole[0].schema(), &whole)?;
        for partitions in [1, 2] {
            let tight = limited_session(partitions, 4096, 1 << 20)?;
            let (plan, batches) = planned(&tight, &sql).await?;
            let ranges = ranges_spilled(&plan);
            assert!(ranges >= 4, "{ranges} ranges for 3.2 MB in 1 MiB: {sql}");
            // A filter's rows counted by a query over its columns, not by
            // reading every row group whole.
            assert_eq!(position_metric(&plan, "counted_by_reading"), 0, "{sql}");
            // Without a filter the rows are counted and of a fixed width:
            // known not to fit, spilled without first holding what fits.
            let unheld = usize::from(!sql.contains("WHERE"));
            assert_eq!(position_metric(&plan, "spilled_unheld"), unheld, "{sql}");
            let got = concat_batches(&whole.schema(), &batches)?;
            assert!(
                got == whole,
                "{partitions} partitions spilled gave other rows: {sql}"
            );
        }
    }
    Ok(())
}

/// Strings read as views (`schema_force_view_types`), spilled by position:
/// a range's pieces keep their source batches' whole data buffers, so each
/// range is counted as written (compacted). Counted with those buffers, the
/// read-back reserved up front would be many times the pool and refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_columns_spilled_by_position_are_counted_as_written() -> Result<()> {
    use datafusion::arrow::compute::concat_batches;
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 2, 100_000, 10_000)?;
    let strings = dir.path().join("strings.parquet");
    let roomy = session(2, 4096)?;
    collect(
        &roomy,
        &format!(
            "COPY (SELECT id, concat('row ', CAST(v AS VARCHAR), ' of the table') AS s \
             FROM {table} ORDER BY id) TO '{}'",
            strings.display()
        ),
    )
    .await?;
    let sql = format!(
        "SELECT id, s FROM '{}' SHUFFLE BY POSITION SEED 3",
        strings.display()
    );
    let whole = collect(&roomy, &sql).await?;
    let tight = sqlfeed::Session::builder()
        .target_partitions(2)
        .batch_size(4096)
        .memory_limit(2 << 20)
        .setting(
            "datafusion.execution.parquet.schema_force_view_types",
            "true",
        )
        .build()?;
    let (plan, batches) = planned(&tight, &sql).await?;
    assert!(
        plan.schema().field_with_name("s")?.data_type()
            == &datafusion::arrow::datatypes::DataType::Utf8View,
        "s is not read as a view"
    );
    assert!(
        ranges_spilled(&plan) >= 4,
        "not spilled: {}",
        ranges_spilled(&plan)
    );
    assert_eq!(ids(&batches), ids(&whole));
    let cast =
        |batches: &[datafusion::arrow::array::RecordBatch]| -> Result<Vec<String>> {
            let all = concat_batches(&batches[0].schema(), batches)?;
            let s = datafusion::arrow::compute::cast(
                all.column(1),
                &datafusion::arrow::datatypes::DataType::Utf8,
            )?;
            Ok(datafusion::arrow::array::AsArray::as_string::<i32>(&s)
                .iter()
                .map(|v| v.unwrap_or_default().to_string())
                .collect())
        };
    assert!(cast(&batches)? == cast(&whole)?, "other strings");
    Ok(())
}

/// The Parquet reader leaves a binary column's buffers with room to spare
/// (they grow by doubling). An epoch that fits once that room is given back
/// is held whole under a limit it exceeds charged with the room, not
/// spilled. Charged with the room (as before the fit on the pool's first
/// refusal), it is spilled and this fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_that_fits_without_the_readers_spare_room_is_held_whole() -> Result<()> {
    use datafusion::physical_plan::spill::get_record_batch_memory_size;
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 2, 20_000, 5_000)?;
    let strings = dir.path().join("strings.parquet");
    let roomy = session(2, 1024)?;
    collect(
        &roomy,
        &format!(
            "COPY (SELECT id, arrow_cast(concat(CAST(v AS VARCHAR), repeat('.', 700 + \
             CAST(id % 600 AS INT))), 'Binary') AS s FROM {table} ORDER BY id) TO '{}'",
            strings.display()
        ),
    )
    .await?;
    let sql = format!(
        "SELECT id, s FROM '{}' SHUFFLE BY POSITION SEED 3",
        strings.display()
    );
    let (plan, whole) = planned(&roomy, &sql).await?;
    // Charged as the reader left them, against what the rows take.
    let charged = position_metric(&plan, "held_bytes");
    let rows_bytes: usize = whole.iter().map(get_record_batch_memory_size).sum();
    assert!(
        charged > rows_bytes * 9 / 8,
        "the reader left little room to give back ({charged} bytes charged for \
         {rows_bytes} of rows): this test shows nothing"
    );
    let limit = (charged + rows_bytes * 17 / 16) / 2;
    let tight = limited_session(2, 1024, limit)?;
    let (plan, batches) = planned(&tight, &sql).await?;
    assert_eq!(
        ranges_spilled(&plan),
        0,
        "spilled under {limit} bytes: {charged} charged whole, {rows_bytes} of rows"
    );
    let held = position_metric(&plan, "held_bytes");
    assert!(held <= limit, "held {held} bytes under a limit of {limit}");
    assert_eq!(batches, whole);
    assert_eq!(tight.context().runtime_env().memory_pool.reserved(), 0);
    Ok(())
}

/// An epoch of variable-width rows far over its limit is judged from its
/// first rows and spilled then, not after reading up to the limit: the
/// same batches as held whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_far_over_its_limit_is_spilled_on_its_first_rows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 2, 20_000, 5_000)?;
    let blobs = dir.path().join("blobs.parquet");
    let roomy = session(2, 256)?;
    collect(
        &roomy,
        &format!(
            "COPY (SELECT id, arrow_cast(repeat('.', 700 + CAST(id % 600 AS INT)), \
             'Binary') AS b FROM {table} ORDER BY id) TO '{}'",
            blobs.display()
        ),
    )
    .await?;
    let sql = format!(
        "SELECT id, b FROM '{}' SHUFFLE BY POSITION SEED 5",
        blobs.display()
    );
    let whole = collect(&roomy, &sql).await?;
    let tight = limited_session(2, 256, 12 << 20)?;
    let (plan, batches) = planned(&tight, &sql).await?;
    assert_eq!(position_metric(&plan, "judged_early"), 1);
    assert_eq!(position_metric(&plan, "spilled_unheld"), 0);
    assert!(
        ranges_spilled(&plan) >= 4,
        "{} ranges",
        ranges_spilled(&plan)
    );
    assert_eq!(batches, whole);
    assert_eq!(tight.context().runtime_env().memory_pool.reserved(), 0);
    Ok(())
}

/// A limit so small that the epoch would need more ranges than spill files
/// it may keep open: an error that says so and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_too_large_for_its_spilled_ranges_says_what_to_do() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 2, 100_000, 10_000)?;
    let tiny = limited_session(1, 64, 16 << 10)?;
    let err = match collect(
        &tiny,
        &format!("SELECT id, v FROM {table} SHUFFLE BY POSITION SEED 3"),
    )
    .await
    {
        Ok(_) => panic!("200k rows spilled in ranges of a 16 KiB pool"),
        Err(e) => e.to_string(),
    };
    assert_contains(
        &err,
        &[
            "SHUFFLE BY POSITION holds the whole epoch in memory",
            "200000 rows would need",
            "more than 512 open files",
            "--memory-limit",
            "SHUFFLE WINDOW n",
        ],
    );
    Ok(())
}

/// A session on an in-process cluster (scheduler and executor) of
/// `partitions` target partitions.
#[cfg(feature = "ballista")]
fn standalone_cluster(partitions: usize) -> Result<sqlfeed::Session> {
    sqlfeed::Session::builder()
        .cluster("standalone")
        .target_partitions(partitions)
        .build()
}

/// On a cluster a shuffle by position is keyed by each row's position and
/// runs as `SHUFFLE`'s stage-shaped job (a plain query's: sorted per scan
/// task, merged by one): the defined order, as embedded, on 1, 2 and 4
/// partitions, with and without a filter (the rows it keeps counted once on
/// the scheduler). A feed's job is cut in key ranges and dealt (below).
#[cfg(feature = "ballista")]
#[test]
fn a_shuffle_by_position_on_a_cluster_is_the_embedded_order() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 3, 400, 64)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let all: Vec<i64> = (0..1200).collect();
    let kept: Vec<i64> = (0..1200).filter(|id| id % 7 != 3).collect();
    for partitions in [1, 2, 4] {
        let cluster = standalone_cluster(partitions)?;
        for (sql, expected) in [
            (
                format!("SELECT id FROM {table} SHUFFLE BY POSITION SEED 3 EPOCH 1"),
                defined_order(&all, 3, 1),
            ),
            (
                format!(
                    "SELECT id * 2 AS id, v FROM {table} WHERE v <> 3 \
                     SHUFFLE BY POSITION SEED 9"
                ),
                defined_order(&kept, 9, 0).iter().map(|id| id * 2).collect(),
            ),
        ] {
            let got = runtime.block_on(async {
                let batches = cluster.collect(cluster.sql(&sql).await?).await?;
                Ok::<_, datafusion::error::DataFusionError>(ids(&batches))
            })?;
            assert_eq!(got, expected, "{partitions} partitions: {sql}");
            let embedded = runtime.block_on(collect(&session(partitions, 100)?, &sql))?;
            assert_eq!(
                ids(&embedded),
                expected,
                "embedded, {partitions} partitions"
            );
        }
    }
    Ok(())
}

/// A cluster feed shuffled by position gives every rank the embedded
/// batches: each epoch's job keyed by position and dealt to the ranks on
/// the executors (2 and 3 ranks, a padded last step, a filter counted once).
#[cfg(feature = "ballista")]
#[test]
fn a_cluster_feed_by_position_gives_every_rank_the_embedded_batches() -> Result<()> {
    use sqlfeed::device::Device;
    use sqlfeed::feed::Feed;
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 3, 333, 50)?;
    let cluster = standalone_cluster(2)?;
    let embedded = session(3, 100)?;
    for (sql, world) in [
        (format!("SELECT id FROM {table}"), 2),
        (format!("SELECT id FROM {table} WHERE v <> 3"), 3),
    ] {
        let run = |session: &sqlfeed::Session,
                   rank: usize|
         -> Result<(Vec<Vec<i64>>, Vec<String>)> {
            let mut feed = Feed::builder(session, sql.clone())
                .shuffle(5)
                .shuffle_by_position()
                .batch_size(32)
                .shard(rank, world)
                .epochs(2)
                .device(Device::Cpu)
                .build()?;
            let mut batches = vec![];
            for batch in feed.by_ref() {
                batches.push(batch?.tensor("id")?.as_slice::<i64>()?.to_vec());
            }
            let plans = feed.epoch_plans().iter().map(|(_, p)| p.clone()).collect();
            Ok((batches, plans))
        };
        let mut seen = std::collections::BTreeSet::new();
        for rank in 0..world {
            let (here, _) = run(&embedded, rank)?;
            let (on_cluster, plans) = run(&cluster, rank)?;
            assert_eq!(on_cluster, here, "rank {rank} of {world}: {sql}");
            // Each epoch's job dealt to the ranks: this rank fetched its own.
            assert_eq!(plans.len(), 2);
            for plan in &plans {
                assert_contains(plan, &[&format!("dealt_to={world}")]);
            }
            seen.extend(here.concat());
        }
        let expected = if sql.contains("WHERE") {
            (0..999).filter(|id| id % 7 != 3).count()
        } else {
            999
        };
        assert_eq!(seen.len(), expected, "{sql}");
    }
    // Cached, with an executor cache folder: the executors keep rows by
    // content, so the entry is kept here, filled from the cluster's first
    // epoch in its order and read by position in the next ones.
    let cache = tempfile::tempdir()?;
    let cached_cluster = sqlfeed::Session::builder()
        .cluster("standalone")
        .target_partitions(2)
        .cache_dir(cache.path().join("local"))
        .executor_cache_dir(cache.path().join("shared").display().to_string())
        .build()?;
    let sql = format!("SELECT id FROM {table}");
    let run = |session: &sqlfeed::Session, cached: bool| -> Result<Vec<Vec<i64>>> {
        Feed::builder(session, sql.clone())
            .shuffle(5)
            .shuffle_by_position()
            .batch_size(32)
            .epochs(3)
            .cache(cached)
            .device(Device::Cpu)
            .build()?
            .map(|b| Ok(b?.tensor("id")?.as_slice::<i64>()?.to_vec()))
            .collect()
    };
    assert_eq!(run(&cached_cluster, true)?, run(&embedded, false)?);
    assert!(
        !cache.path().join("shared").exists()
            || std::fs::read_dir(cache.path().join("shared"))?
                .next()
                .is_none(),
        "nothing kept on the executors"
    );
    Ok(())
}

/// A feed shuffled by position: its epochs are the defined orders, the same
/// batches on any partition count, each epoch started ahead (the default)
/// or not; a resume continues exactly and one under the other key is
/// refused; windows are refused with what to do.
#[test]
fn a_feed_by_position_is_the_defined_order_and_resumes_exactly() -> Result<()> {
    use sqlfeed::device::Device;
    use sqlfeed::feed::{Feed, FeedBuilder, OnDataChange};
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 4, 500, 100)?;
    let sql = format!("SELECT id FROM {table}");
    let feed = |session: &sqlfeed::Session| {
        Feed::builder(session, sql.clone())
            .shuffle(11)
            .shuffle_by_position()
            .batch_size(64)
            .epochs(2)
            .device(Device::Cpu)
    };
    let batches = |builder: FeedBuilder| -> Result<Vec<Vec<i64>>> {
        builder
            .build()?
            .map(|b| Ok(b?.tensor("id")?.as_slice::<i64>()?.to_vec()))
            .collect()
    };
    let s = session(2, 8192)?;
    let whole = batches(feed(&s))?;
    let all: Vec<i64> = (0..2000).collect();
    let per_epoch = 2000usize.div_ceil(64);
    assert_eq!(whole.len(), 2 * per_epoch);
    assert_eq!(whole[..per_epoch].concat(), defined_order(&all, 11, 0));
    assert_eq!(whole[per_epoch..].concat(), defined_order(&all, 11, 1));
    assert_eq!(batches(feed(&session(3, 100)?))?, whole, "3 partitions");
    // Stopped after 5 batches, resumed from the checkpoint: the rest.
    let mut stopped = feed(&s).build()?;
    for _ in 0..5 {
        stopped.next().expect("a batch")?;
    }
    let checkpoint = stopped.checkpoint()?;
    drop(stopped);
    assert!(checkpoint.shuffle_by_position);
    let resumed = batches(feed(&s).resume_from(checkpoint.clone(), OnDataChange::Error))?;
    assert_eq!(resumed, whole[5..].to_vec());
    let by_content = Feed::builder(&s, sql.clone())
        .shuffle(11)
        .batch_size(64)
        .epochs(2)
        .device(Device::Cpu);
    let err = batches(by_content.resume_from(checkpoint, OnDataChange::Error))
        .unwrap_err()
        .to_string();
    assert_contains(
        &err,
        &["shuffled by position but this feed is shuffled by content"],
    );
    let err = feed(&s)
        .shuffle_window(100)
        .build()
        .unwrap_err()
        .to_string();
    assert_contains(&err, &["shuffle_by_position", "not both"]);
    let err = Feed::builder(&s, sql.clone())
        .shuffle_by_position()
        .device(Device::Cpu)
        .build()
        .unwrap_err()
        .to_string();
    assert_contains(&err, &["shuffle_by_position", "give a shuffle seed"]);
    Ok(())
}

/// Every epoch shuffled by position holds all its rows: under a memory
/// limit that fits one epoch but not two, the next epoch is not started
/// ahead (it would not fit), and the feed gives the batches it gives
/// without a limit. Under a limit that fits none, each epoch is spilled by
/// position range and the next one is started ahead beside it (issue 55's
/// epoch boundary under a tight memory limit), with the same batches.
#[test]
fn epochs_that_fit_once_but_not_twice_run_one_after_another() -> Result<()> {
    use sqlfeed::device::Device;
    use sqlfeed::feed::Feed;
    let dir = tempfile::tempdir()?;
    // 200k rows of two Int64 columns: about 3.2 MB held per epoch.
    let table = write_ids(dir.path(), 4, 50_000, 10_000)?;
    let sql = format!("SELECT id, v FROM {table}");
    let run = |session: &sqlfeed::Session| -> Result<(Vec<i64>, Vec<String>)> {
        let mut feed = Feed::builder(session, sql.clone())
            .shuffle(4)
            .shuffle_by_position()
            .batch_size(4096)
            .epochs(3)
            .device(Device::Cpu)
            .build()?;
        let mut ids = vec![];
        for batch in feed.by_ref() {
            ids.extend_from_slice(batch?.tensor("id")?.as_slice::<i64>()?);
            // A training step: the next epoch would be read while this
            // one is still held.
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let plans = feed.epoch_plans().iter().map(|(_, p)| p.clone()).collect();
        Ok((ids, plans))
    };
    let ids_of = |session: &sqlfeed::Session| -> Result<Vec<i64>> { Ok(run(session)?.0) };
    let roomy = ids_of(&session(2, 8192)?)?;
    assert_eq!(roomy.len(), 3 * 200_000);
    let all: Vec<i64> = (0..200_000).collect();
    assert_eq!(roomy[..200_000], defined_order(&all, 4, 0)[..]);
    let tight = limited_session(2, 8192, 7 << 20)?;
    assert!(
        ids_of(&tight)? == roomy,
        "the tight feed gave other batches"
    );
    // Not even one epoch fits: each is spilled by position range, the
    // next one started ahead beside it (each reserves its read-back up
    // front, at most a third of the pool), in the same order.
    let spilled = limited_session(2, 8192, 3 << 20)?;
    let (ids, plans) = run(&spilled)?;
    assert!(ids == roomy, "the spilled feed gave other batches");
    assert_eq!(plans.len(), 3);
    for (epoch, plan) in plans.iter().enumerate() {
        assert_contains(plan, &["PositionShuffleExec", "spilled_unheld=1"]);
        if epoch > 0 {
            assert_contains(plan, &["LookaheadExec"]);
        }
    }
    assert_eq!(spilled.context().runtime_env().memory_pool.reserved(), 0);
    Ok(())
}

/// Issue 55's epoch boundary under a tight memory limit, in a real
/// process: `sqlfeed --memory-limit 3M feed … --shuffle-by-position` over
/// three epochs of 200k rows (3.2 MB an epoch) with a training step spills
/// every epoch and starts the next one ahead beside it (its plan a
/// `LookaheadExec`), and every batch's digest is the roomy run's.
#[test]
fn a_tight_feed_process_spills_each_epoch_beside_the_next_with_the_same_batches()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 4, 50_000, 10_000)?;
    let sql = format!("SELECT id, v FROM {table}");
    let run = |limit: &str| {
        let mut command = crate::common::sqlfeed();
        command
            .args(["--memory-limit", limit, "--target-partitions", "2"])
            .args(["feed", &sql, "--device", "cpu", "--digest"])
            .args(["--shuffle-seed", "4", "--shuffle-by-position"])
            .args(["--batch-size", "4096", "--epochs", "3", "--step-ms", "5"])
            .arg("--explain-analyze");
        let out = succeeded(crate::common::run(&mut command));
        (digest_lines(&out), out)
    };
    let (roomy, _) = run("256M");
    assert_eq!(roomy.len(), 3 * 200_000usize.div_ceil(4096));
    let (tight, out) = run("3M");
    assert!(
        tight == roomy,
        "the tight process gave other batches:\n{out}"
    );
    let epochs: Vec<&str> = out.split("\nepoch ").skip(1).collect();
    assert_eq!(epochs.len(), 3, "{out}");
    for (epoch, plan) in epochs.iter().enumerate() {
        assert_contains(plan, &["PositionShuffleExec", "spilled_unheld=1"]);
        if epoch > 0 {
            assert_contains(plan, &["LookaheadExec"]);
        }
    }
    Ok(())
}

/// A cached feed shuffled by position: its first epoch fills the epoch
/// cache in that epoch's order, and every later epoch read from the entry
/// (`StoredOrderExec`, the stored order composed with the epoch's) is the
/// uncached epoch, with and without a filter and a widening function (the
/// entry keeps the compact values); another session's first epoch is
/// served from the entry; a resume reads it too; and under a memory limit
/// that no epoch fits, the epochs read from the entry are spilled by
/// position range, in the same order.
#[test]
fn a_cached_feed_by_position_gives_the_uncached_batches_every_epoch() -> Result<()> {
    use sqlfeed::device::Device;
    use sqlfeed::feed::{Feed, OnDataChange};
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(dir.path().join("small"))?;
    std::fs::create_dir_all(dir.path().join("large"))?;
    let small = write_ids(&dir.path().join("small"), 4, 500, 100)?;
    let large = write_ids(&dir.path().join("large"), 4, 50_000, 10_000)?;
    let sessions = |limit: Option<usize>| -> Result<sqlfeed::Session> {
        let builder = sqlfeed::Session::builder()
            .target_partitions(2)
            .batch_size(8192)
            .cache_dir(&cache);
        match limit {
            Some(bytes) => builder.memory_limit(bytes),
            None => builder,
        }
        .build()
    };
    let feed = |session: &sqlfeed::Session, sql: &str, cached: bool| {
        Feed::builder(session, sql)
            .shuffle(11)
            .shuffle_by_position()
            .batch_size(64)
            .epochs(3)
            .cache(cached)
            .device(Device::Cpu)
    };
    let run = |mut feed: sqlfeed::feed::Feed| -> Result<(Vec<Vec<i64>>, Vec<String>)> {
        let mut ids = vec![];
        for batch in feed.by_ref() {
            ids.push(batch?.tensor("id")?.as_slice::<i64>()?.to_vec());
        }
        let plans = feed.epoch_plans().iter().map(|(_, p)| p.clone()).collect();
        Ok((ids, plans))
    };
    for sql in [
        format!("SELECT id, v FROM {small}"),
        format!("SELECT id, one_hot(v, 7) AS w FROM {small} WHERE v <> 3"),
    ] {
        let s = sessions(None)?;
        let (plain, _) = run(feed(&s, &sql, false).build()?)?;
        let (cached, plans) = run(feed(&s, &sql, true).build()?)?;
        assert!(cached == plain, "the cached feed gave other batches: {sql}");
        assert_eq!(plans.len(), 3);
        assert!(!plans[0].contains("StoredOrderExec"), "{}", plans[0]);
        for plan in &plans[1..] {
            assert_contains(
                plan,
                &[
                    "CacheScanExec",
                    "StoredOrderExec",
                    "stored in epoch 0's order",
                ],
            );
        }
        // Another session over the same cache folder: a hit from the start,
        // whose epoch 0 (the entry's own order) streams the entry.
        let (again, plans) = run(feed(&sessions(None)?, &sql, true).build()?)?;
        assert!(again == plain, "the entry's first epoch: {sql}");
        assert_contains(&plans[0], &["CacheScanExec"]);
        assert!(!plans[0].contains("PositionShuffleExec"), "{}", plans[0]);
        assert_contains(&plans[1], &["CacheScanExec", "StoredOrderExec"]);
        // Resumed after 10 batches (epoch 0, streamed from the entry) and
        // after 40 (epoch 1, which fills an entry of its own order): the
        // rest.
        for done in [10, 40] {
            let mut stopped = feed(&s, &sql, true).build()?;
            for _ in 0..done {
                stopped.next().expect("a batch")?;
            }
            let checkpoint = stopped.checkpoint()?;
            drop(stopped);
            let (resumed, _) = run(feed(&s, &sql, true)
                .resume_from(checkpoint, OnDataChange::Error)
                .build()?)?;
            assert!(resumed[..] == plain[done..], "resumed after {done}: {sql}");
        }
    }
    // 200k rows (3.2 MB an epoch) under 3 MB: the first epoch spills by
    // position range from the files, the later ones from the entry.
    let sql = format!("SELECT id, v FROM {large}");
    let (plain, _) = run(feed(&sessions(None)?, &sql, false)
        .batch_size(4096)
        .build()?)?;
    let (tight, plans) = run(feed(&sessions(Some(3 << 20))?, &sql, true)
        .batch_size(4096)
        .build()?)?;
    assert!(tight == plain, "the tight cached feed gave other batches");
    for plan in &plans[1..] {
        assert_contains(plan, &["StoredOrderExec", "spilled_unheld=1"]);
    }
    Ok(())
}

/// Issue 55, item 4, for the exact order by position: `dataset(epoch)`
/// gives the epoch's length and row `i` of its order, the feed's rows in
/// the feed's order (world 1), with or without a filter (rows per row
/// group from the footers, or counted), in any order asked, each row group
/// read once per batch of positions; past the end, and asked for windows,
/// it says what it has. The CLI's `--rows` prints the same rows.
#[test]
fn a_feed_by_position_gives_row_i_of_an_epoch_by_position() -> Result<()> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Float32Type, Int64Type};
    use sqlfeed::device::Device;
    use sqlfeed::feed::Feed;
    // Where a one-hot vector holds its 1.
    fn hot(vector: &[f32]) -> i64 {
        vector
            .iter()
            .position(|&x| x == 1.0)
            .map_or(-1, |at| at as i64)
    }
    fn hot_at(column: &dyn Array, row: usize) -> i64 {
        let vector = column.as_fixed_size_list().value(row);
        hot(vector.as_primitive::<Float32Type>().values())
    }
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 4, 500, 100)?;
    let s = session(2, 8192)?;
    for sql in [
        format!("SELECT id, one_hot(v, 7) AS w FROM {table}"),
        format!("SELECT id, one_hot(v, 7) AS w FROM {table} WHERE v <> 3"),
        // Row group 1 of the first file keeps no row.
        format!("SELECT id, one_hot(v, 7) AS w FROM {table} WHERE id < 100 OR id >= 200"),
    ] {
        // `w` (wider than `v`) is computed above the shuffle: row i goes
        // through it alone.
        let shuffled = format!("{sql} SHUFFLE BY POSITION SEED 11");
        let plan = tokio::runtime::Runtime::new()?.block_on(async {
            let plan = s.sql(&shuffled).await?.create_physical_plan().await?;
            Ok::<_, datafusion::error::DataFusionError>(
                datafusion::physical_plan::displayable(plan.as_ref())
                    .indent(false)
                    .to_string(),
            )
        })?;
        let above = plan.find("one_hot").expect("w in the plan");
        let shuffle = plan.find("PositionShuffleExec").expect("the shuffle");
        assert!(above < shuffle, "w is computed under the shuffle:\n{plan}");
        let feed = Feed::builder(&s, sql.clone())
            .shuffle(11)
            .shuffle_by_position()
            .batch_size(64)
            .epochs(2)
            .device(Device::Cpu);
        let fed: Vec<(i64, i64)> = feed
            .clone()
            .build()?
            .map(|b| {
                let b = b?;
                let ids = b.tensor("id")?.as_slice::<i64>()?.to_vec();
                let w = b.tensor("w")?.as_slice::<f32>()?.to_vec();
                Ok(ids
                    .into_iter()
                    .zip(w.chunks(7).map(hot))
                    .collect::<Vec<_>>())
            })
            .collect::<Result<Vec<_>>>()?
            .concat();
        let epoch_rows = fed.len() / 2;
        let epoch = feed.dataset(1)?;
        assert_eq!(epoch.len()? as usize, epoch_rows, "{sql}");
        let err = epoch.window_rows().unwrap_err().to_string();
        assert_contains(&err, &["shuffled by position", "no windows"]);
        // One at a time, out of order.
        let mut positions: Vec<usize> = (0..epoch_rows).collect();
        positions.reverse();
        positions.rotate_left(epoch_rows / 3);
        for &i in positions.iter().step_by(7) {
            let row = epoch.row(i as u64)?;
            assert_eq!(row.num_rows(), 1);
            let got = (
                row.column(0).as_primitive::<Int64Type>().value(0),
                hot_at(row.column(1), 0),
            );
            assert_eq!(got, fed[epoch_rows + i], "row {i} of epoch 1 of {sql}");
        }
        // The whole epoch as one batch of positions, in that order.
        let all = epoch.rows(&positions.iter().map(|&i| i as u64).collect::<Vec<_>>())?;
        let ids = all.column(0).as_primitive::<Int64Type>();
        for (k, &i) in positions.iter().enumerate() {
            let got = (ids.value(k), hot_at(all.column(1), k));
            assert_eq!(got, fed[epoch_rows + i], "{sql}");
        }
        assert_eq!(epoch.rows(&[])?.num_rows(), 0);
        let err = epoch.row(epoch_rows as u64).unwrap_err().to_string();
        assert_contains(&err, &[&format!("the epoch has {epoch_rows} rows")]);
    }
    // The CLI's --rows prints the same rows, those the docs define.
    let epoch = Feed::builder(&s, format!("SELECT id, v FROM {table}"))
        .shuffle(11)
        .shuffle_by_position()
        .device(Device::Cpu)
        .dataset(1)?;
    let printed = assert_rows_printed(&table, &["--shuffle-by-position"], &epoch)?;
    let all: Vec<i64> = (0..2000).collect();
    let order = defined_order(&all, 11, 1);
    assert_eq!(printed, [order[1998], order[1999]]);
    Ok(())
}

/// A file rewritten after an epoch by position was counted: reading one of
/// its row groups would give other rows (or fail on a footer that moved),
/// so the error names the file as changed and says to plan again, instead
/// of giving a row of another rank or calling the file damaged.
#[test]
fn a_row_group_that_changed_since_it_was_counted_is_named() -> Result<()> {
    use sqlfeed::device::Device;
    use sqlfeed::feed::Feed;
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 2, 500, 100)?;
    let s = session(2, 8192)?;
    let epoch = Feed::builder(&s, format!("SELECT id FROM {table}"))
        .shuffle(5)
        .shuffle_by_position()
        .device(Device::Cpu)
        .dataset(0)?;
    assert_eq!(epoch.len()?, 1000);
    // The same files, rewritten with row groups of 30 rows.
    let rewritten = tempfile::tempdir()?;
    write_ids(rewritten.path(), 2, 500, 30)?;
    for file in ["part-00.parquet", "part-01.parquet"] {
        std::fs::copy(rewritten.path().join(file), dir.path().join(file))?;
    }
    let err = epoch
        .rows(&(0..1000).collect::<Vec<_>>())
        .unwrap_err()
        .to_string();
    assert_contains(
        &err,
        &[
            "part-0",
            "changed since the epoch was planned",
            "plan the epoch again",
        ],
    );
    Ok(())
}

/// A plain cluster query reading `file_row_index()` gives the embedded
/// result on 1, 2 and 4 partitions: the scan's projection travels with
/// `file_row_index()` in place of its row index (DataFusion 55's protobuf
/// drops the virtual column), whatever it computes from it, beside the
/// file name and under a filter on the row index, which stays above the
/// scan. Before, every such query failed on the executors ("Column index 2
/// out of bounds").
#[cfg(feature = "ballista")]
#[test]
fn a_plain_cluster_query_reads_row_indexes_as_embedded() -> Result<()> {
    use crate::common::rows;
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 3, 400, 64)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let queries = [
        format!("SELECT id, file_row_index() AS r FROM {table} ORDER BY id"),
        format!(
            "SELECT input_file_name() AS f, file_row_index() * 10 + v AS r \
             FROM {table} WHERE v = 3 ORDER BY f, r"
        ),
        format!(
            "SELECT count(*) AS n, sum(id) AS s FROM {table} \
             WHERE file_row_index() BETWEEN 10 AND 20"
        ),
        format!(
            "SELECT CAST(file_row_index() AS INT) AS r FROM {table} ORDER BY r DESC LIMIT 3"
        ),
    ];
    let embedded = runtime.block_on(async {
        let session = session(2, 100)?;
        let mut out = vec![];
        for sql in &queries {
            out.push(rows(&collect(&session, sql).await?));
        }
        Ok::<_, datafusion::error::DataFusionError>(out)
    })?;
    // What the embedded engine gives, checked against the data itself.
    assert_eq!(embedded[0].len(), 1200);
    assert_eq!(embedded[0][401], vec!["401".to_string(), "1".to_string()]);
    assert_eq!(
        embedded[2],
        vec![vec!["33".to_string(), "13695".to_string()]]
    );
    assert_eq!(embedded[3].len(), 3);
    for partitions in [1, 2, 4] {
        let cluster = standalone_cluster(partitions)?;
        for (sql, expected) in queries.iter().zip(&embedded) {
            let got = runtime.block_on(collect(&cluster, sql))?;
            assert_eq!(&rows(&got), expected, "{partitions} partitions: {sql}");
        }
    }
    Ok(())
}

/// A shuffle whose rows keep no column (`count(*)` over it) counts them:
/// by position, filtered or not, under a roomy and a tight memory limit
/// (rows of no columns take no memory, so both hold the epoch whole), and
/// the other shuffles beside it. Gathering rows of no columns failed in Arrow ("must
/// either specify a row count or at least one column") wherever the rows
/// were taken or interleaved by position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shuffle_of_rows_without_columns_counts_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 4, 500, 64)?;
    let held = session(2, 100)?;
    let tight = limited_session(2, 100, 64 << 10)?;
    for (filter, rows) in [("", 2000), ("WHERE v <> 3", 2000 - 286)] {
        for shuffle in [
            "SHUFFLE BY POSITION SEED 3",
            "SHUFFLE SEED 3",
            "SHUFFLE WINDOW 300 SEED 3",
            "LOCAL SHUFFLE BUFFER 50 SEED 3",
        ] {
            let sql = format!(
                "SELECT count(*) FROM (SELECT id FROM {table} {filter} {shuffle})"
            );
            for (memory, session) in [("256M", &held), ("64K", &tight)] {
                let batches = collect(session, &sql).await?;
                assert_eq!(ids(&batches), vec![rows], "{memory}: {sql}");
            }
        }
    }
    Ok(())
}

/// A volatile filter (`random() < 0.5`) keeps other rows each read: held
/// whole, its epoch is read once and works; spilled, which reads the
/// input twice, it is refused naming the filter and a deterministic
/// sample instead (it failed with "the file changed while the epoch was
/// read"), and that sample spills in the same order it has held whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volatile_filter_is_refused_when_its_epoch_spills_naming_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // 200k rows of (id, v): 3.2 MB held.
    let table = write_ids(dir.path(), 2, 100_000, 10_000)?;
    let roomy = session(2, 4096)?;
    let tight = limited_session(2, 4096, 1 << 20)?;
    let volatile = format!(
        "SELECT id, v FROM {table} WHERE random() < 0.5 SHUFFLE BY POSITION SEED 3"
    );
    let held = ids(&collect(&roomy, &volatile).await?);
    let mut distinct = held.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        (90_000..110_000).contains(&held.len()) && distinct.len() == held.len(),
        "{} rows, {} distinct",
        held.len(),
        distinct.len()
    );
    let err = collect(&tight, &volatile).await.unwrap_err().to_string();
    assert_contains(
        &err,
        &[
            "random() < 0.5",
            "volatile",
            "reads the input twice",
            "sqlfeed_row_key(42, id)",
        ],
    );
    let sampled = format!(
        "SELECT id, v FROM {table} WHERE sqlfeed_row_key(42, id) % 2 = 0 \
         SHUFFLE BY POSITION SEED 3"
    );
    let (plan, spilled) = planned(&tight, &sampled).await?;
    assert!(ranges_spilled(&plan) >= 2, "the sample spills");
    assert_eq!(ids(&spilled), ids(&collect(&roomy, &sampled).await?));
    Ok(())
}

/// A plain cluster query's job carries the session's sqlfeed settings:
/// `SET sqlfeed.…` reached the scheduler only for feeds (DataFusion lists an
/// extension's settings without their prefix, which the scheduler cannot
/// set). A damaged count set by hand is read there and named; unset, the
/// filtered query gives the embedded order (its rows counted by the
/// scheduler: the client counts only filters calling a Python function,
/// see the Python cluster tests).
#[cfg(feature = "ballista")]
#[test]
fn a_plain_cluster_query_carries_the_sessions_sqlfeed_settings() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = write_ids(dir.path(), 3, 400, 64)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let sql = format!("SELECT id FROM {table} WHERE v <> 3 SHUFFLE BY POSITION SEED 9");
    let kept: Vec<i64> = (0..1200).filter(|id| id % 7 != 3).collect();
    let cluster = standalone_cluster(2)?;
    let got = runtime.block_on(collect(&cluster, &sql))?;
    assert_eq!(ids(&got), defined_order(&kept, 9, 0));
    runtime.block_on(async {
        cluster
            .sql("SET sqlfeed.position_bucket_rows = 'not a count'")
            .await?
            .collect()
            .await
    })?;
    let err = runtime
        .block_on(collect(&cluster, &sql))
        .unwrap_err()
        .to_string();
    assert_contains(&err, &["sqlfeed.position_bucket_rows", "leave it unset"]);
    Ok(())
}
