//! SHUFFLE and LOCAL SHUFFLE: permutation, determinism, uniformity, memory.

use datafusion::arrow::array::{Int64Array, RecordBatch};
use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::shuffle::{GlobalShuffle, KeySource, ShuffleSpec, shuffle};

use crate::common::{
    arc, assert_contains, chi_square, collect, files_below, first_int64s as ids,
    generated, rows, sized_session as session, write_parquet,
};

/// A global shuffle keyed on every column, moving them all.
fn all_columns(
    seed: u64,
    epoch: u64,
    memory_limit: usize,
    batch_rows: usize,
) -> GlobalShuffle {
    GlobalShuffle {
        source: KeySource::AllColumns,
        seed,
        epoch,
        memory_limit,
        session_batch_size: batch_rows,
        carry: None,
    }
}

/// 12k generated rows (~2.3 MB of ids, captions and token lists in Arrow)
/// and a 2-partition session with a 1 MB budget spilling into its own folder.
fn spilling_fixture() -> Result<(tempfile::TempDir, tempfile::TempDir, Session)> {
    let dir = generated(12_000, 4)?;
    let spill = tempfile::tempdir()?;
    let session = Session::builder()
        .memory_limit(1 << 20)
        .target_partitions(2)
        .spill_dir(spill.path())
        .build()?;
    Ok((dir, spill, session))
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v
}

#[tokio::test]
async fn shuffle_is_a_permutation_for_any_input() -> Result<()> {
    let dir = generated(1500, 5)?;
    let s = session(4, 128)?;
    let data = format!("'{}'", dir.path().display());
    let cases = [
        // many files and batches
        format!("SELECT id, label, caption FROM {data}"),
        // nulls and duplicate rows
        format!("SELECT label, weight FROM {data}"),
        // one row, empty input
        format!("SELECT id FROM {data} WHERE id = 7"),
        format!("SELECT id FROM {data} WHERE id < 0"),
    ];
    for query in cases {
        let plain = rows(&collect(&s, &query).await?);
        let shuffled = rows(&collect(&s, &format!("{query} SHUFFLE SEED 9")).await?);
        assert_eq!(sorted(&plain), sorted(&shuffled), "{query}");
        if plain.len() > 10 {
            assert_ne!(plain, shuffled, "{query} came out unshuffled");
        }
    }
    Ok(())
}

#[tokio::test]
async fn order_depends_on_seed_epoch_and_data_only() -> Result<()> {
    let dir = generated(2000, 4)?;
    let query = |seed: u64, epoch: u64| {
        format!(
            "SELECT id, caption FROM '{}' WHERE label < 8 SHUFFLE SEED {seed} EPOCH {epoch}",
            dir.path().display()
        )
    };
    let reference = ids(&collect(&session(1, 8192)?, &query(42, 0)).await?);
    for (partitions, batch_size) in [(2, 100), (8, 7), (8, 8192), (3, 1000)] {
        let got = ids(&collect(&session(partitions, batch_size)?, &query(42, 0)).await?);
        assert_eq!(
            got, reference,
            "partitions {partitions}, batch size {batch_size}"
        );
    }
    let epoch1 = ids(&collect(&session(2, 8192)?, &query(42, 1)).await?);
    let seed43 = ids(&collect(&session(2, 8192)?, &query(43, 0)).await?);
    assert_ne!(epoch1, reference);
    assert_ne!(seed43, reference);
    assert_eq!(sorted(&epoch1), sorted(&reference));
    Ok(())
}

/// Positions of 8 rows over 400 seeds: each row lands in each position
/// ~1/8 of the time. A shuffle that kept partitions apart (each partition's
/// rows in a block) or favoured the input order fails the chi-square test.
#[tokio::test]
async fn positions_are_uniform_across_seeds() -> Result<()> {
    let dir = tempfile::tempdir()?;
    for part in 0..2 {
        let values: Int64Array = (part * 4..part * 4 + 4).collect();
        write_parquet(
            &dir.path().join(format!("p{part}.parquet")),
            &crate::common::one_column("v", arc(values)),
        )?;
    }
    let s = session(2, 8192)?;
    let seeds = 400;
    let mut counts = [[0u32; 8]; 8];
    for seed in 0..seeds {
        let order = ids(&collect(
            &s,
            &format!(
                "SELECT v FROM '{}' SHUFFLE SEED {seed}",
                dir.path().display()
            ),
        )
        .await?);
        for (position, value) in order.iter().enumerate() {
            counts[*value as usize][position] += 1;
        }
    }
    let expected = seeds as f64 / 8.0;
    let chi2 = chi_square(counts.iter().flatten().map(|&o| (o, expected)));
    // 49 degrees of freedom: p = 0.001 at 85.35.
    assert!(chi2 < 85.35, "chi2 {chi2}, counts {counts:?}");
    Ok(())
}

#[tokio::test]
/// 12k rows of ids, captions and token lists are ~2.3 MB in Arrow: more than
/// twice the 1 MB budget (scripts/bench-shuffle.sh measures 4.9x at scale).
async fn shuffle_larger_than_memory_spills_and_cleans_up() -> Result<()> {
    let (dir, spill, s) = spilling_fixture()?;
    let query = format!(
        "SELECT id, caption, tokens FROM '{}' SHUFFLE SEED 5",
        dir.path().display()
    );
    let analyzed = rows(&collect(&s, &format!("EXPLAIN ANALYZE {query}")).await?);
    let plan = &analyzed[0][1];
    assert_contains(
        plan,
        &["ShuffleMergeExec: seed=5, epoch=0", "ShuffleKeyExec"],
    );
    let spills: u64 = plan
        .match_indices("spill_count=")
        .filter_map(|(at, m)| {
            plan[at + m.len()..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(spills > 0, "no spill under a 1 MB limit: {plan}");
    // No row repeats, which the runs' keys alone show: the runs are read
    // once, by the final merge, and the order is the in-memory one.
    assert_contains(plan, &["copy_passes=0"]);
    let got = ids(&collect(&s, &query).await?);
    assert_eq!(sorted(&got), (0..12_000).collect::<Vec<i64>>());
    assert_eq!(got, ids(&collect(&session(2, 8192)?, &query).await?));
    let leftovers = files_below(spill.path());
    assert!(leftovers.is_empty(), "spill files left: {leftovers:?}");
    Ok(())
}

#[tokio::test]
async fn rust_api_matches_the_sql_clause() -> Result<()> {
    let dir = generated(300, 2)?;
    let s = session(2, 8192)?;
    let query = format!("SELECT id FROM '{}'", dir.path().display());
    let from_sql = ids(&collect(&s, &format!("{query} SHUFFLE SEED 3 EPOCH 2")).await?);
    let df = s.sql(&query).await?;
    let from_api = ids(&shuffle(df, ShuffleSpec::Global { seed: 3, epoch: 2 })?
        .collect()
        .await?);
    assert_eq!(from_sql, from_api);
    Ok(())
}

#[tokio::test]
async fn local_shuffle_buffer_permutes_within_reach() -> Result<()> {
    let dir = generated(1000, 1)?;
    let s = session(1, 64)?;
    let base = format!("SELECT id FROM '{}'", dir.path().display());
    let plain = ids(&collect(&s, &base).await?);
    let local =
        ids(&collect(&s, &format!("{base} LOCAL SHUFFLE BUFFER 50 SEED 1")).await?);
    assert_eq!(sorted(&local), sorted(&plain));
    assert_ne!(local, plain);
    assert_eq!(
        local,
        ids(&collect(&s, &format!("{base} LOCAL SHUFFLE BUFFER 50 SEED 1")).await?)
    );
    // A row can only leave the buffer after it entered: output position i
    // holds a row from the first i + 50 input rows.
    for (i, id) in local.iter().enumerate() {
        let input_position = plain.iter().position(|p| p == id).expect("present");
        assert!(
            input_position < i + 50,
            "row {id} at {i} came from {input_position}"
        );
    }
    let identity =
        ids(&collect(&s, &format!("{base} LOCAL SHUFFLE BUFFER 1 SEED 1")).await?);
    assert_eq!(identity, plain);
    Ok(())
}

#[tokio::test]
async fn shuffle_clause_parses_where_an_alias_could_be() -> Result<()> {
    let s = session(2, 8192)?;
    // After `FROM t` sqlparser alone would read SHUFFLE as an alias.
    collect(&s, "CREATE TABLE t AS VALUES (1), (2), (3)").await?;
    let got = collect(&s, "SELECT * FROM t SHUFFLE SEED 1").await?;
    assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    let explained =
        rows(&collect(&s, "EXPLAIN SELECT * FROM t SHUFFLE SEED 1 EPOCH 4").await?);
    assert!(
        explained[0][1].contains("Shuffle: seed=1, epoch=4"),
        "{explained:?}"
    );
    for (bad, expected) in [
        (
            "SELECT * FROM t SHUFFLE SEED x",
            "SEED must be a non-negative integer",
        ),
        ("SELECT * FROM t LOCAL SHUFFLE SEED 1", "BUFFER <rows>"),
        ("SELECT * FROM t LOCAL SHUFFLE BUFFER 0", "at least 1 row"),
        (
            "SELECT * FROM t SHUFFLE SEED 1 SEED 2",
            "SHUFFLE takes SEED once",
        ),
    ] {
        let err = s.sql(bad).await.expect_err(bad).to_string();
        assert!(err.contains(expected), "{bad}: {err}");
    }
    Ok(())
}

/// Issue 20: SHUFFLE wherever a query ends, with the same order as the
/// statement-level shuffle of the same query.
#[tokio::test]
async fn shuffle_composes_with_subqueries_ctes_limits_and_explain() -> Result<()> {
    let s = session(2, 16)?;
    collect(
        &s,
        "CREATE TABLE t AS SELECT value AS x FROM generate_series(1, 200)",
    )
    .await?;
    let shuffled = rows(&collect(&s, "SELECT x FROM t SHUFFLE SEED 9").await?);
    assert_eq!(shuffled.len(), 200);
    let mut sorted = shuffled.clone();
    sorted.sort_by_key(|r| r[0].parse::<i64>().unwrap_or_default());
    assert_ne!(shuffled, sorted, "a shuffle of 200 rows is not sorted");

    // Before LIMIT / OFFSET: the first rows of that very shuffle.
    let first = rows(&collect(&s, "SELECT x FROM t SHUFFLE SEED 9 LIMIT 10").await?);
    assert_eq!(first, shuffled[..10]);
    let next =
        rows(&collect(&s, "SELECT x FROM t SHUFFLE SEED 9 LIMIT 5 OFFSET 10").await?);
    assert_eq!(next, shuffled[10..15]);
    // In a subquery, a CTE, a parenthesised branch and CACHE TABLE.
    let counted = rows(
        &collect(&s, "SELECT count(*) FROM (SELECT x FROM t SHUFFLE SEED 2)").await?,
    );
    assert_eq!(counted, vec![vec!["200".to_string()]]);
    let cte = rows(
        &collect(
            &s,
            "WITH s AS (SELECT x FROM t SHUFFLE SEED 9) SELECT x FROM s LIMIT 10",
        )
        .await?,
    );
    assert_eq!(cte, shuffled[..10]);
    let union = rows(
        &collect(
            &s,
            "(SELECT x FROM t SHUFFLE SEED 9 LIMIT 3) UNION ALL (SELECT x FROM t SHUFFLE SEED 9 LIMIT 3)",
        )
        .await?,
    );
    assert_eq!(union.len(), 6);
    assert!(union.iter().all(|r| shuffled[..3].contains(r)), "{union:?}");
    collect(&s, "CACHE TABLE c AS SELECT x FROM t SHUFFLE SEED 9").await?;
    // (A plain read of a cached table has no defined order across its parts.)
    let mut cached = rows(&collect(&s, "SELECT x FROM c").await?);
    cached.sort_by_key(|r| r[0].parse::<i64>().unwrap_or_default());
    assert_eq!(cached, sorted);
    let local = rows(
        &collect(
            &s,
            "SELECT count(*) FROM (SELECT x FROM t LOCAL SHUFFLE BUFFER 8 SEED 1)",
        )
        .await?,
    );
    assert_eq!(local, vec![vec!["200".to_string()]]);
    // Every EXPLAIN form.
    for explain in [
        "EXPLAIN",
        "EXPLAIN VERBOSE",
        "EXPLAIN ANALYZE",
        "EXPLAIN FORMAT TREE",
        "EXPLAIN FORMAT INDENT",
        "EXPLAIN FORMAT GRAPHVIZ",
    ] {
        let sql = format!("{explain} SELECT x FROM t SHUFFLE SEED 9 EPOCH 4 LIMIT 3");
        let text = rows(&collect(&s, &sql).await?).concat().join("\n");
        assert!(
            text.contains("Shuffle") || text.contains("Permute"),
            "{sql}: {text}"
        );
    }
    Ok(())
}

/// Issue 20: the dialect's words stay usable as names.
#[tokio::test]
async fn the_dialects_words_stay_names() -> Result<()> {
    let s = session(2, 8192)?;
    let names = [
        "shuffle",
        "sample",
        "seed",
        "epoch",
        "local",
        "buffer",
        "summarize",
        "cache",
        "verify",
        "decode",
    ];
    let select = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{i} AS {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let got = rows(
        &collect(
            &s,
            &format!("SELECT {} FROM (SELECT {select})", names.join(", ")),
        )
        .await?,
    );
    assert_eq!(
        got,
        vec![(0..names.len()).map(|i| i.to_string()).collect::<Vec<_>>()]
    );
    assert_eq!(
        rows(&collect(&s, "SELECT shuffle FROM (SELECT 1 AS shuffle)").await?),
        vec![vec!["1".to_string()]]
    );
    collect(&s, "CREATE TABLE shuffle AS VALUES (1), (2)").await?;
    assert_eq!(
        rows(&collect(&s, "SELECT count(*) FROM shuffle").await?),
        vec![vec!["2".to_string()]]
    );
    assert_eq!(
        rows(
            &collect(
                &s,
                "SELECT shuffle.column1 FROM shuffle WHERE shuffle.column1 > 1"
            )
            .await?
        ),
        vec![vec!["2".to_string()]]
    );
    // And the clause after such a table.
    assert_eq!(
        rows(
            &collect(
                &s,
                "SELECT count(*) FROM (SELECT * FROM shuffle SHUFFLE SEED 1)"
            )
            .await?
        ),
        vec![vec!["2".to_string()]]
    );
    Ok(())
}

/// A shuffle that fails part-way through its input, and one dropped while
/// its merge reads spill files, leave the spill folder empty.
#[tokio::test]
async fn failed_and_cancelled_shuffles_leave_no_spill_files() -> Result<()> {
    use futures::StreamExt;
    let (dir, spill, s) = spilling_fixture()?;
    let data = dir.path().display();

    // Rows with id > 11500 sit in the last file: the error comes late.
    let failing = format!(
        "SELECT id, caption, tokens, \
         one_hot(CASE WHEN id > 11500 THEN 7 ELSE 0 END, 3) AS oh FROM '{data}' SHUFFLE SEED 2"
    );
    let err = collect(&s, &failing)
        .await
        .expect_err("one_hot index out of range");
    assert!(err.to_string().contains("outside [0, 3)"), "{err}");
    assert!(files_below(spill.path()).is_empty(), "after a failure");

    let df = s
        .sql(&format!(
            "SELECT id, caption, tokens FROM '{data}' SHUFFLE SEED 3"
        ))
        .await?;
    let plan = df.create_physical_plan().await?;
    let mut stream = s.execute_stream(plan)?;
    let first = stream.next().await.expect("a first batch")?;
    assert!(first.num_rows() > 0);
    let during = files_below(spill.path()).len();
    drop(stream);
    // Aborted tasks release their spill files as they unwind.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !files_below(spill.path()).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        files_below(spill.path()).is_empty(),
        "after cancel ({during} files during the merge)"
    );
    assert!(during > 0, "the merge was expected to read spill files");
    Ok(())
}

/// The stage-shaped plan (per-partition sort + merge, what a cluster runs)
/// and the embedded one (`PermuteExec`) give the same order, in memory and
/// spilling.
#[tokio::test]
async fn the_sorted_plan_and_the_permute_plan_agree() -> Result<()> {
    let (dir, _spill, spilling) = spilling_fixture()?;
    let roomy = session(3, 100)?;
    let sql = format!("SELECT id, caption, tokens FROM '{}'", dir.path().display());
    for (s, limit) in [(&spilling, 1 << 20), (&roomy, 256 << 20)] {
        let input = s.sql(&sql).await?.create_physical_plan().await?;
        let batch_rows = s.context().state().config().batch_size();
        let permuted = sqlfeed::shuffle::plan_global_shuffle(
            std::sync::Arc::clone(&input),
            all_columns(11, 2, limit, batch_rows),
        )?;
        // Under an operator that asks for no order (as a cluster's final
        // stage or a feed's sink may be), the optimizer must keep the merge.
        let mut sorted: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan> =
            std::sync::Arc::new(
                datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec::new(
                    sqlfeed::shuffle::plan_sorted_shuffle(input, all_columns(11, 2, limit, batch_rows), sqlfeed::shuffle::FinalStage::merge())?,
                ),
            );
        // As DataFusion plans any query (the optimizer is part of planning).
        let state = s.context().state();
        for rule in state.physical_optimizers() {
            sorted = rule.optimize(sorted, state.config().options())?;
        }
        let task = s.context().task_ctx();
        let a = ids(&datafusion::physical_plan::collect(
            permuted,
            std::sync::Arc::clone(&task),
        )
        .await?);
        let b = ids(&datafusion::physical_plan::collect(sorted, task).await?);
        assert_eq!(a.len(), 12_000);
        assert_eq!(a, b, "limit {limit}");
    }
    Ok(())
}

// ---- Repeated rows (issue 21): a uniform permutation of the multiset ----

/// The columns `a` and `b` of one file of repeated rows.
type RepeatedFile = (Vec<Option<i64>>, Vec<Option<String>>);

/// Writes `distinct` contents `(a, b)`, with NULLs in both columns, content
/// `i` repeated `repeats[i % repeats.len()]` times, over 3 files so that the
/// copies of a row arrive in different files, batches and partitions.
fn write_repeated(
    dir: &std::path::Path,
    distinct: i64,
    repeats: &[usize],
) -> Result<usize> {
    use datafusion::arrow::array::{ArrayRef, StringArray};
    let mut files: Vec<RepeatedFile> = vec![Default::default(); 3];
    let mut total = 0;
    for i in 0..distinct {
        let a = (i % 7 != 3).then_some(i);
        let b = (i % 5 != 1).then(|| format!("row {}", i / 2));
        for copy in 0..repeats[i as usize % repeats.len()] {
            let file = &mut files[(i as usize + copy) % 3];
            file.0.push(a);
            file.1.push(b.clone());
            total += 1;
        }
    }
    for (n, (a, b)) in files.into_iter().enumerate() {
        let batch = RecordBatch::try_from_iter(vec![
            ("a", std::sync::Arc::new(Int64Array::from(a)) as ArrayRef),
            ("b", std::sync::Arc::new(StringArray::from(b)) as ArrayRef),
        ])?;
        write_parquet(&dir.join(format!("part{n}.parquet")), &batch)?;
    }
    Ok(total)
}

/// Adjacent pairs of identical rows.
/// Rank `rank`'s rows of `order` by the feed's batching: steps of `B × W`
/// rows, rank r's `B` of each; the last partial step dropped, or padded with
/// the first rows (cycled) and split evenly.
fn rank_rows<T: Clone>(
    order: &[T],
    b: usize,
    w: usize,
    drop_last: bool,
    rank: usize,
) -> Vec<T> {
    let full = order.len() / (b * w) * (b * w);
    let mut mine: Vec<T> = order[..full]
        .chunks(b * w)
        .flat_map(|step| step[rank * b..(rank + 1) * b].to_vec())
        .collect();
    let last = order.len() - full;
    if last > 0 && !drop_last {
        let padded = last.div_ceil(w) * w;
        let head = order.len().min(w - 1);
        let step: Vec<T> = order[full..]
            .iter()
            .cloned()
            .chain((0..padded - last).map(|t| order[t % head].clone()))
            .collect();
        let per_rank = padded / w;
        mine.extend_from_slice(&step[rank * per_rank..(rank + 1) * per_rank]);
    }
    mine
}

fn adjacent_copies(rows: &[Vec<String>]) -> usize {
    rows.windows(2).filter(|w| w[0] == w[1]).count()
}

/// Expected adjacent identical pairs in a uniform permutation of a multiset
/// with multiplicities `counts`: (N−1) · Σ n(n−1) / (N(N−1)).
fn expected_adjacent_copies(counts: impl Iterator<Item = usize>) -> f64 {
    let counts: Vec<usize> = counts.collect();
    let n: usize = counts.iter().sum();
    counts.iter().map(|&c| (c * (c - 1)) as f64).sum::<f64>() / n as f64
}

#[tokio::test]
async fn issue_21_copies_of_a_row_are_not_shuffled_next_to_each_other() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_repeated(dir.path(), 344, &[1])?;
    let one = format!("SELECT a, b FROM '{}'", dir.path().display());
    let table = format!("{one} UNION ALL {one} UNION ALL {one}");
    let s = session(4, 100)?;
    let shuffled = rows(&collect(&s, &format!("{table} SHUFFLE SEED 7")).await?);
    assert_eq!(shuffled.len(), 1032);
    // A uniform permutation has about 2; hashing content alone gave 692.
    let adjacent = adjacent_copies(&shuffled);
    assert!(adjacent <= 10, "{adjacent} adjacent copies");
    let sample = rows(&collect(&s, &format!("SAMPLE ({table}) 300 SEED 3")).await?);
    assert_eq!(sample.len(), 300);
    // A uniform sample holds ~221 distinct rows; content keys gave 100 × 3.
    let distinct = sorted(&sample)
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>();
    assert!(
        (190..=250).contains(&distinct.len()),
        "{} distinct",
        distinct.len()
    );
    Ok(())
}

/// Several repeat counts, NULLs included: over many seeds the number of
/// adjacent copies averages what a uniform permutation gives, and the rows
/// are the input's multiset.
#[tokio::test]
async fn repeated_rows_are_spread_like_a_uniform_permutation() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let repeats = [1, 2, 3, 5];
    let total = write_repeated(dir.path(), 100, &repeats)?;
    let expected = expected_adjacent_copies((0..100).map(|i| repeats[i % repeats.len()]));
    let query = format!("SELECT a, b FROM '{}'", dir.path().display());
    let s = session(3, 64)?;
    let plain = sorted(&rows(&collect(&s, &query).await?));
    let seeds = 40;
    let mut adjacent = 0;
    for seed in 0..seeds {
        let shuffled = rows(&collect(&s, &format!("{query} SHUFFLE SEED {seed}")).await?);
        assert_eq!(sorted(&shuffled), plain, "seed {seed}");
        adjacent += adjacent_copies(&shuffled);
    }
    let mean = adjacent as f64 / seeds as f64;
    // Mean of 40 draws of a count with mean ~2.5 and variance ~2.5: well
    // within ±1.5; content keys alone gave total − distinct = 175.
    assert_eq!(total, 275);
    assert!(
        (mean - expected).abs() < 1.5,
        "mean {mean}, expected {expected}"
    );
    Ok(())
}

/// Contents with multiplicities 1, 2, 3 and a row of NULLs twice: every
/// content is at every position as often as its share of the rows says.
#[tokio::test]
async fn positions_of_repeated_rows_are_uniform_across_seeds() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let batch = RecordBatch::try_from_iter(vec![(
        "v",
        arc(Int64Array::from(vec![
            Some(0),
            Some(1),
            None,
            Some(2),
            Some(1),
            Some(2),
            None,
            Some(2),
        ])),
    )])?;
    write_parquet(&dir.path().join("p0.parquet"), &batch.slice(0, 5))?;
    write_parquet(&dir.path().join("p1.parquet"), &batch.slice(5, 3))?;
    let multiplicity = [("0", 1.0), ("1", 2.0), ("2", 3.0), ("NULL", 2.0)];
    let s = session(2, 8192)?;
    let seeds = 400;
    let mut counts = [[0u32; 8]; 4];
    for seed in 0..seeds {
        let order = rows(
            &collect(
                &s,
                &format!(
                    "SELECT v FROM '{}' SHUFFLE SEED {seed}",
                    dir.path().display()
                ),
            )
            .await?,
        );
        for (position, row) in order.iter().enumerate() {
            let content = multiplicity
                .iter()
                .position(|(v, _)| *v == row[0])
                .expect("one of the four contents");
            counts[content][position] += 1;
        }
    }
    let chi2 = chi_square(counts.iter().zip(multiplicity).flat_map(|(row, (_, n))| {
        let expected = seeds as f64 * n / 8.0;
        row.iter().map(move |&o| (o, expected))
    }));
    // (4 − 1) × (8 − 1) = 21 degrees of freedom: p = 0.001 at 46.80.
    assert!(chi2 < 46.80, "chi2 {chi2}, counts {counts:?}");
    Ok(())
}

/// The order of a table with repeated rows is the same for any
/// `target_partitions` and batch size, spilling or not, and in the
/// stage-shaped plan a cluster runs.
#[tokio::test]
async fn repeated_rows_keep_the_order_independent_of_partitions_and_plan() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_repeated(dir.path(), 300, &[1, 4, 2, 7])?;
    let query = format!(
        "SELECT a, b FROM '{}' SHUFFLE SEED 5 EPOCH 1",
        dir.path().display()
    );
    let reference = rows(&collect(&session(1, 8192)?, &query).await?);
    for partitions in [2, 4, 8] {
        for batch_size in [7, 8192] {
            let got = rows(&collect(&session(partitions, batch_size)?, &query).await?);
            assert_eq!(
                got, reference,
                "{partitions} partitions, batches of {batch_size}"
            );
        }
    }
    let other_epoch = query.replace("EPOCH 1", "EPOCH 2");
    assert_ne!(
        rows(&collect(&session(2, 64)?, &other_epoch).await?),
        reference
    );

    // Wide repeated rows (12k rows, 3,000 contents, ~2.6 MB) under a 1 MB
    // budget: copies land in different spilled runs.
    let (data, spill, spilling) = spilling_fixture()?;
    // Computed in a subquery: the shuffle then keys the rows it sees (the
    // repeated contents), not the ids they were computed from.
    let sql = format!(
        "SELECT g, w FROM (SELECT id % 3000 AS g, \
         repeat('x', 200) || CAST(id % 3000 AS VARCHAR) AS w FROM '{}')",
        data.path().display()
    );
    let roomy = session(3, 100)?;
    let in_memory = rows(&collect(&roomy, &format!("{sql} SHUFFLE SEED 8")).await?);
    let spilled = rows(&collect(&spilling, &format!("{sql} SHUFFLE SEED 8")).await?);
    assert_eq!(in_memory.len(), 12_000);
    assert_eq!(spilled, in_memory);
    // The runs' keys repeat: one pass over the runs numbers the copies.
    let analyzed =
        collect(&spilling, &format!("EXPLAIN ANALYZE {sql} SHUFFLE SEED 8")).await?;
    assert_contains(&rows(&analyzed)[0][1], &["copy_passes=1"]);
    let adjacent = adjacent_copies(&in_memory);
    assert!(adjacent < 20, "{adjacent} adjacent copies (uniform: ~3)");
    let leftovers = files_below(spill.path());
    assert!(leftovers.is_empty(), "spill files left: {leftovers:?}");

    // The stage-shaped plan holds nested merges per partition when copies
    // span spilled runs (first copies, later copies, final key): 2 MB.
    let tight = Session::builder()
        .memory_limit(2 << 20)
        .target_partitions(2)
        .spill_dir(spill.path())
        .build()?;
    // With one merging task (ranges = 1) and with a parallel final stage of
    // 1–4 key ranges read in partition order: the same rows in the same order.
    for (s, limit) in [(&tight, 2 << 20), (&roomy, 256 << 20)] {
        let target = s.context().state().config().target_partitions();
        for ranges in [1, target] {
            let input = s.sql(&sql).await?.create_physical_plan().await?;
            let batch_rows = s.context().state().config().batch_size();
            let mut staged: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan> =
                sqlfeed::shuffle::plan_sorted_shuffle(
                    input,
                    all_columns(8, 0, limit, batch_rows),
                    sqlfeed::shuffle::FinalStage::ranged(ranges),
                )?;
            let state = s.context().state();
            for rule in state.physical_optimizers() {
                staged = rule.optimize(staged, state.config().options())?;
            }
            let partitions = staged.properties().output_partitioning().partition_count();
            assert_eq!(partitions, ranges.max(1), "ranges {ranges}");
            let plan = datafusion::physical_plan::displayable(staged.as_ref())
                .indent(true)
                .to_string();
            assert_eq!(plan.contains("ranged=true"), ranges > 1, "{plan}");
            let parts = datafusion::physical_plan::collect_partitioned(
                staged,
                s.context().task_ctx(),
            )
            .await?;
            let got = rows(&parts.into_iter().flatten().collect::<Vec<_>>());
            assert_eq!(
                got, in_memory,
                "stage-shaped plan, limit {limit}, ranges {ranges}"
            );
        }
    }
    // Dealt to W ranks (a cluster feed's job, `shuffle::deal`): the counts
    // travel with the rows through the range exchange; rank r's partitions,
    // read in turn, are exactly its rows of the feed's batching of the
    // order above.
    for (s, limit) in [(&roomy, 256 << 20)] {
        let ranges = s.context().state().config().target_partitions();
        for (world, batch_rows, drop_last) in
            [(2, 1000, false), (3, 7, true), (5, 333, false)]
        {
            let deal = sqlfeed::shuffle::Deal {
                batch_rows,
                world,
                drop_last,
                span: None,
            };
            let input = s.sql(&sql).await?.create_physical_plan().await?;
            let mut staged: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan> =
                sqlfeed::shuffle::plan_sorted_shuffle(
                    input,
                    all_columns(8, 0, limit, s.context().state().config().batch_size()),
                    sqlfeed::shuffle::FinalStage::ranged(ranges).dealt(deal),
                )?;
            let state = s.context().state();
            for rule in state.physical_optimizers() {
                staged = rule.optimize(staged, state.config().options())?;
            }
            let plan = datafusion::physical_plan::displayable(staged.as_ref())
                .indent(true)
                .to_string();
            assert_contains(&plan, &["RankShardExec", "counted=true"]);
            let tree = datafusion::physical_plan::displayable(staged.as_ref())
                .tree_render()
                .to_string();
            for operator in [
                "RankShardExec",
                "DealExec",
                "RangeBucketExec",
                "ShuffleMergeExec",
            ] {
                assert!(tree.contains(operator), "{operator}: {tree}");
            }
            let parts = datafusion::physical_plan::collect_partitioned(
                staged,
                s.context().task_ctx(),
            )
            .await?;
            assert_eq!(parts.len(), deal.partitions(ranges));
            for rank in 0..world {
                let mine: Vec<_> = parts
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| j % world == rank)
                    .flat_map(|(_, batches)| batches.iter().cloned())
                    .collect();
                assert_eq!(
                    rows(&mine),
                    rank_rows(&in_memory, batch_rows, world, drop_last, rank),
                    "limit {limit}, {deal:?}, rank {rank}"
                );
            }
        }
    }
    // Ranges other than the session's target partitions: the distribution
    // rule re-sizes the exchange, and the plan is refused instead of
    // returning rows out of order.
    let input = roomy.sql(&sql).await?.create_physical_plan().await?;
    let mut staged: std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan> =
        sqlfeed::shuffle::plan_sorted_shuffle(
            input,
            all_columns(8, 0, 256 << 20, 100),
            sqlfeed::shuffle::FinalStage::ranged(5),
        )?;
    let state = roomy.context().state();
    let mut refused = None;
    for rule in state.physical_optimizers() {
        match rule.optimize(std::sync::Arc::clone(&staged), state.config().options()) {
            Ok(plan) => staged = plan,
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let err = refused.expect("a re-sized range exchange is refused");
    assert!(err.contains("re-sized from 5 to 3 partitions"), "{err}");
    Ok(())
}

/// `SAMPLE` on repeated rows: every row (not every distinct row) has the
/// same chance to be taken, so a content repeated 4 times is taken about 4
/// times as often as one that appears once.
#[tokio::test]
async fn sample_includes_each_copy_as_often_as_any_row() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Even contents once, odd contents 4 times: 100 + 400 rows.
    write_repeated(dir.path(), 200, &[1, 4])?;
    let s = session(3, 64)?;
    let seeds = 30;
    let (mut single, mut repeated) = (0usize, 0usize);
    for seed in 0..seeds {
        let sample = rows(
            &collect(
                &s,
                &format!("SAMPLE '{}' 50 SEED {seed}", dir.path().display()),
            )
            .await?,
        );
        assert_eq!(sample.len(), 50);
        for row in &sample {
            // `a` is NULL for some contents; `b` ("row i/2") then tells.
            let content = if row[0] != "NULL" {
                row[0].parse::<usize>().ok()
            } else {
                None
            };
            match content {
                Some(i) if i % 2 == 0 => single += 1,
                Some(_) => repeated += 1,
                None => {}
            }
        }
        let again = rows(
            &collect(
                &s,
                &format!("SAMPLE '{}' 50 SEED {seed}", dir.path().display()),
            )
            .await?,
        );
        assert_eq!(again, sample, "seed {seed}");
    }
    // Per row, the inclusion rate of both kinds is 50/500; the repeated
    // contents hold 4/5 of the non-NULL-`a` rows.
    let share = repeated as f64 / (single + repeated) as f64;
    assert!((share - 0.8).abs() < 0.05, "share of repeated rows {share}");
    Ok(())
}

/// `LOCAL SHUFFLE` draws slots at random, not by content: with a buffer
/// holding the whole input it is a uniform permutation, copies included.
#[tokio::test]
async fn local_shuffle_spreads_repeated_rows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let repeats = [3];
    write_repeated(dir.path(), 344, &repeats)?;
    let s = session(1, 128)?;
    let query = format!("SELECT a, b FROM '{}'", dir.path().display());
    let mut adjacent = 0;
    let seeds = 10;
    for seed in 0..seeds {
        let shuffled = rows(
            &collect(
                &s,
                &format!("{query} LOCAL SHUFFLE BUFFER 2000 SEED {seed}"),
            )
            .await?,
        );
        assert_eq!(shuffled.len(), 1032);
        adjacent += adjacent_copies(&shuffled);
    }
    let mean = adjacent as f64 / seeds as f64;
    assert!(mean < 5.0, "mean {mean} adjacent copies (uniform: 2)");
    Ok(())
}

/// Shuffled queries with row-wise functions under the shuffle: images,
/// tokens, arithmetic and casts, functions reading a column that is also an
/// output, and nested clauses; each with the text of a function that moves.
fn late_materialization_queries(dir: &std::path::Path) -> Vec<(String, &'static str)> {
    let t = format!("'{}'", dir.display());
    vec![
        (
            format!(
                "SELECT image_to_tensor(image_resize(image_decode(image_jpeg), 8, 8)) AS x, \
                 label FROM {t} WHERE label < 7 SHUFFLE SEED 5"
            ),
            "image_decode(",
        ),
        (
            format!(
                "SELECT id, image_decode(image_png)['width'] AS w, \
                 image_random_flip(image_decode(image_png), 3)['pixels'] AS p \
                 FROM {t} SHUFFLE SEED 2 EPOCH 4"
            ),
            "image_random_flip(",
        ),
        (
            format!(
                "SELECT tokenize(caption, '{}', 16) AS tokens, id FROM {t} SHUFFLE SEED 9",
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json"
                )
            ),
            "tokenize(",
        ),
        (
            format!(
                "SELECT CAST(id AS DOUBLE) * 2 AS twice, upper(caption) AS shout, \
                 label % 3 AS bucket FROM {t} SHUFFLE SEED 1"
            ),
            "upper(",
        ),
        (
            format!("SELECT label * 10 AS l FROM {t} SHUFFLE SEED 3 LIMIT 17"),
            " * Int",
        ),
        (
            format!(
                "SELECT count(*) AS n, sum(w) AS total FROM \
                 (SELECT image_decode(image_jpeg)['width'] AS w FROM {t} SHUFFLE SEED 4)"
            ),
            "image_decode(",
        ),
        (
            format!(
                "SELECT * FROM (SELECT length(caption) AS len, id FROM {t} SHUFFLE SEED 6) \
                 WHERE len > 3 SHUFFLE SEED 7"
            ),
            "length(",
        ),
        // Carried through the permutation (feature_vector, narrowing), computed
        // above it (the widening cast, one_hot, the decoder), side by side.
        (
            format!(
                "SELECT feature_vector(f0, f1, f2) AS x, CAST(label AS BIGINT) AS y, \
                 one_hot(label, 10) AS oh, \
                 image_to_tensor(image_resize(image_decode(image_jpeg), 4, 4)) AS img \
                 FROM {t} SHUFFLE SEED 8"
            ),
            "feature_vector(",
        ),
        // The same over repeated rows: copies told apart by carried values.
        (
            format!(
                "SELECT feature_vector(f0, f1) AS x, label FROM \
                 (SELECT * FROM {t} UNION ALL SELECT * FROM {t}) SHUFFLE SEED 11"
            ),
            "feature_vector(",
        ),
    ]
}

/// Whether `function` appears above the last shuffle of the logical plan in
/// an EXPLAIN's text.
fn above_last_shuffle(explain: &str, function: &str) -> bool {
    let logical = explain.split("physical_plan").next().unwrap_or(explain);
    let shuffle = logical.rfind("Shuffle:").expect("a Shuffle node");
    logical[..shuffle].contains(function)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_functions_after_the_shuffle_give_the_same_batches() -> Result<()> {
    let dir = generated(300, 3)?;
    for (sql, function) in late_materialization_queries(dir.path()) {
        let mut results = vec![];
        for (late, partitions) in [(true, 2), (false, 2), (true, 3), (false, 1)] {
            let s = session(partitions, 64)?;
            s.context()
                .sql(&format!("SET sqlfeed.late_materialization = {late}"))
                .await?;
            results.push(rows(&collect(&s, &sql).await?));
            let explain = rows(&collect(&s, &format!("EXPLAIN {sql}")).await?)
                .concat()
                .join("\n");
            assert_eq!(
                above_last_shuffle(&explain, function),
                late,
                "late_materialization = {late}, {function}:\n{explain}"
            );
        }
        for (i, other) in results.iter().enumerate().skip(1) {
            assert_eq!(&results[0], other, "run {i} differs for {sql}");
        }
        assert!(!results[0].is_empty(), "{sql}");
    }
    Ok(())
}

/// Issue 55: cheap functions that do not widen their inputs run between the
/// key and the permutation, which then gathers one vector instead of its
/// input columns; widening and costly ones stay above (`carry.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_functions_are_computed_before_the_permutation() -> Result<()> {
    let dir = generated(50, 1)?;
    let s = session(2, 64)?;
    let sql = format!(
        "EXPLAIN SELECT feature_vector(f0, f1, f2) AS x, CAST(label AS BIGINT) AS y, \
         one_hot(label, 10) AS oh, image_to_tensor(image_decode(image_png)) AS img \
         FROM '{}' SHUFFLE SEED 1",
        dir.path().display()
    );
    let plan = rows(&collect(&s, &sql).await?).concat().join("\n");
    let physical = plan.split("physical_plan").nth(1).expect("a physical plan");
    let permute = physical.find("PermuteExec").expect("a permutation");
    let (above, below) = physical.split_at(permute);
    assert!(below.contains("feature_vector("), "{physical}");
    for late in ["AS Int64)", "one_hot(", "image_decode("] {
        assert!(
            above.contains(late) && !below.contains(late),
            "{late}:\n{physical}"
        );
    }
    // Off, the permutation gathers the inputs again: the same rows in the
    // same order.
    let query = sql.trim_start_matches("EXPLAIN ");
    let carried = rows(&collect(&s, query).await?);
    s.context()
        .sql("SET sqlfeed.carry_cheap_outputs = false")
        .await?;
    let plan = rows(&collect(&s, &sql).await?).concat().join("\n");
    let physical = plan.split("physical_plan").nth(1).expect("a physical plan");
    let permute = physical.find("PermuteExec").expect("a permutation");
    assert!(
        !physical[permute..].contains("feature_vector("),
        "{physical}"
    );
    assert_eq!(rows(&collect(&s, query).await?), carried);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volatile_functions_stay_under_the_shuffle() -> Result<()> {
    let dir = generated(50, 1)?;
    let s = session(2, 64)?;
    let sql = format!(
        "EXPLAIN SELECT random() AS r, upper(caption) AS c FROM '{}' SHUFFLE SEED 1",
        dir.path().display()
    );
    let plan = rows(&collect(&s, &sql).await?).concat().join("\n");
    assert!(above_last_shuffle(&plan, "upper("), "{plan}");
    assert!(!above_last_shuffle(&plan, "random()"), "{plan}");
    Ok(())
}

/// Issue 56, item 1: keyed by a content hash column, rows that share it are
/// copies whatever else they carry (`explain_batch`'s origins ride along),
/// so they are spread like independent rows, and each copy's place is the
/// same in memory and spilled, on any partitioning: copies are numbered in
/// the order of what they carry.
#[tokio::test]
async fn rows_sharing_a_content_hash_are_spread_and_placed_the_same_when_spilled()
-> Result<()> {
    use datafusion::logical_expr::{Extension, LogicalPlan};
    use sqlfeed::shuffle::{ShuffleKey, ShuffleNode};

    // 200k rows (~5 MB keyed) of 1000 contents (200 copies each); `origin`
    // rides along.
    let dir = tempfile::tempdir()?;
    let origin = Int64Array::from_iter_values(0..200_000);
    let content = Int64Array::from_iter_values((0..200_000).map(|i| (i * 7919) % 1000));
    let batch = RecordBatch::try_from_iter(vec![
        ("origin", arc(origin)),
        ("content", arc(content)),
    ])?;
    write_parquet(&dir.path().join("rows.parquet"), &batch)?;
    let spill = tempfile::tempdir()?;
    let roomy = session(3, 1024)?;
    let tight = Session::builder()
        .memory_limit(1 << 20)
        .target_partitions(2)
        .batch_size(1024)
        .spill_dir(spill.path())
        .build()?;
    let mut orders = vec![];
    for s in [&roomy, &tight] {
        let sql = format!(
            "SELECT origin, CAST(content AS BIGINT UNSIGNED) AS h FROM '{}'",
            dir.path().display()
        );
        let (state, plan) = s.sql(&sql).await?.into_parts();
        let shuffled = LogicalPlan::Extension(Extension {
            node: std::sync::Arc::new(ShuffleNode::try_new_keyed(
                plan,
                ShuffleSpec::Global { seed: 4, epoch: 1 },
                ShuffleKey::ContentHash("h".into()),
            )?),
        });
        let df = datafusion::dataframe::DataFrame::new(state, shuffled);
        let analyzed = rows(&df.clone().explain(false, true)?.collect().await?);
        let plan = &analyzed[0][1];
        assert_contains(plan, &["copies_by=h"]);
        let spilled = !plan.contains("spill_count=0") && plan.contains("spill_count=");
        orders.push((ids(&df.collect().await?), spilled));
    }
    let [(in_memory, false), (spilled, true)] = &orders[..] else {
        panic!(
            "expected one run in memory and one spilled: {:?}",
            orders.iter().map(|o| o.1).collect::<Vec<_>>()
        );
    };
    assert_eq!(in_memory, spilled, "copies placed differently when spilled");
    assert_eq!(sorted(in_memory), (0..200_000).collect::<Vec<i64>>());
    // Spread: a content's 200 copies do not sit side by side (neighbours of
    // one content are ~1/1000 of the rows when spread, all but 1000 when
    // not).
    let content_of = |origin: i64| (origin * 7919) % 1000;
    let adjacent = in_memory
        .windows(2)
        .filter(|w| content_of(w[0]) == content_of(w[1]))
        .count();
    assert!(adjacent < 1000, "{adjacent} neighbours share their content");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permutation_sorted_on_several_threads_is_the_one_thread_order() -> Result<()>
{
    // 300k rows (more than the parallel sort's threshold), each value three
    // times: copies, numbered after the sort, must land where one thread
    // puts them.
    let s = session(2, 8192)?;
    let sql = "SELECT value % 100000 AS v FROM generate_series(0, 299999) SHUFFLE SEED 3";
    let mut orders = Vec::new();
    for threads in [1, 3, 0] {
        s.context()
            .sql(&format!("SET sqlfeed.shuffle_sort_threads = {threads}"))
            .await?;
        orders.push(ids(&collect(&s, sql).await?));
    }
    assert_eq!(orders[0].len(), 300_000);
    assert_eq!(orders[1], orders[0], "3 threads");
    assert_eq!(orders[2], orders[0], "the session's target partitions");
    let mut expected: Vec<i64> = (0..300_000).map(|v| v % 100_000).collect();
    expected.sort();
    assert_eq!(sorted(&orders[0]), expected);
    Ok(())
}
