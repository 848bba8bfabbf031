//! Queries over local Parquet through the library.

use datafusion::arrow::array::{
    AsArray, Float64Array, Int64Array, ListArray, StringArray,
};
use datafusion::arrow::datatypes::{Float64Type, Int32Type, Int64Type};
use datafusion::error::Result;

use crate::common::{
    arc, chi_square, collect, gen_data, generated, one_column, rows, session,
    write_parquet,
};

fn count(batches: &[datafusion::arrow::array::RecordBatch]) -> i64 {
    batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

#[tokio::test]
async fn glob_folder_and_file_paths_read_the_same_rows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = gen_data(dir.path(), 1000, 3)?;
    let session = session()?;
    let base = dir.path().display();
    for from in [
        format!("'{base}/*.parquet'"),
        format!("'{base}'"),
        format!("'{base}/'"),
    ] {
        let batches =
            collect(&session, &format!("SELECT count(*), sum(id) FROM {from}")).await?;
        assert_eq!(count(&batches), 1000, "{from}");
        let sum = batches[0].column(1).as_primitive::<Int64Type>().value(0);
        assert_eq!(sum, 999 * 1000 / 2, "{from}");
    }
    let one = collect(
        &session,
        &format!("SELECT count(*) FROM '{}'", files[0].display()),
    )
    .await?;
    assert_eq!(count(&one), 333);
    Ok(())
}

#[tokio::test]
async fn hive_partition_columns_come_from_folder_names() -> Result<()> {
    let dir = tempfile::tempdir()?;
    gen_data(&dir.path().join("month=1"), 300, 1)?;
    gen_data(&dir.path().join("month=2"), 200, 2)?;
    // gen writes _meta.json next to the data; it must not confuse the format.
    let session = session()?;
    let batches = collect(
        &session,
        &format!(
            "SELECT month, count(*) AS n FROM '{}/' GROUP BY month ORDER BY month",
            dir.path().display()
        ),
    )
    .await?;
    assert_eq!(rows(&batches), vec![vec!["1", "300"], vec!["2", "200"]]);
    let filtered = collect(
        &session,
        &format!(
            "SELECT count(*) FROM '{}/' WHERE month = '2'",
            dir.path().display()
        ),
    )
    .await?;
    assert_eq!(count(&filtered), 200);
    Ok(())
}

/// x = 1..=10 and one NULL; s = a, b, b, c and NULLs; l has lengths 0..=3.
async fn summarize_fixture(dir: &std::path::Path) -> Result<Vec<Vec<String>>> {
    let x: Int64Array = (1..=10).map(Some).chain([None]).collect();
    let s = StringArray::from(vec![
        Some("b"),
        Some("a"),
        Some("c"),
        Some("b"),
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    ]);
    let l = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
        Some(vec![]),
        Some(vec![Some(1)]),
        Some(vec![Some(1), Some(2)]),
        Some(vec![Some(1), Some(2), Some(3)]),
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    ]);
    let batch = datafusion::arrow::array::RecordBatch::try_from_iter(vec![
        ("x", arc(x)),
        ("s", arc(s)),
        ("l", arc(l)),
    ])?;
    let path = dir.join("t.parquet");
    write_parquet(&path, &batch)?;
    let session = session()?;
    Ok(rows(
        &collect(&session, &format!("SUMMARIZE '{}'", path.display())).await?,
    ))
}

#[tokio::test]
async fn summarize_matches_hand_computed_statistics() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let table = summarize_fixture(dir.path()).await?;
    // columns: name, type, stats_of, count, nulls, distinct, min, max, mean, stddev, q25, q50, q75
    let x = &table[0];
    assert_eq!(
        &x[..8],
        &["x", "Int64", "value", "10", "1", "10", "1", "10"]
    );
    let num = |s: &str| s.parse::<f64>().expect("a number");
    assert_eq!(num(&x[8]), 5.5);
    // sample stddev of 1..=10 = sqrt(110/12)
    assert!(
        (num(&x[9]) - (110.0f64 / 12.0).sqrt()).abs() < 1e-9,
        "{}",
        x[9]
    );
    // t-digest quartiles on 10 values: within one step of the exact 3.25/5.5/7.75
    for (got, exact) in [(&x[10], 3.25), (&x[11], 5.5), (&x[12], 7.75)] {
        assert!((num(got) - exact).abs() <= 1.0, "quartile {got} vs {exact}");
    }
    let s = &table[1];
    assert_eq!(s[0], "s");
    assert_eq!(&s[2..8], &["value", "4", "7", "3", "a", "c"]);
    assert_eq!(s[8], "NULL");
    let l = &table[2];
    assert_eq!(&l[2..8], &["length", "4", "7", "4", "0", "3"]);
    assert_eq!(num(&l[8]), 1.5);
    Ok(())
}

/// Sorted ids of `SAMPLE … 50 SEED seed` with `partitions` partitions.
async fn sample_ids(
    dir: &std::path::Path,
    partitions: usize,
    seed: u64,
) -> Result<Vec<i64>> {
    let session = sqlfeed::Session::builder()
        .target_partitions(partitions)
        .batch_size(97)
        .build()?;
    let sql = format!("SAMPLE '{}/*.parquet' 50 SEED {seed}", dir.display());
    let batches = collect(&session, &sql).await?;
    let mut ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

#[tokio::test]
async fn sample_is_reproducible_uniform_and_independent_of_partitioning() -> Result<()> {
    let dir = generated(2000, 4)?;
    let ids = |partitions, seed| sample_ids(dir.path(), partitions, seed);
    let a = ids(1, 7).await?;
    assert_eq!(a.len(), 50);
    assert_eq!(a, ids(4, 7).await?, "partitioning changed the sample");
    assert_ne!(a, ids(4, 8).await?, "the seed did not change the sample");
    assert!(a.iter().all(|id| (0..2000).contains(id)));
    assert!(
        a.windows(2).all(|w| w[0] < w[1]),
        "duplicate rows in a sample"
    );

    // Uniformity: over 40 seeds, each quarter of the id range gets ~1/4 of the
    // picks. A sample biased to the first files or partitions fails this.
    let mut quarters = [0u32; 4];
    for seed in 0..40 {
        for id in ids(2, 1000 + seed).await? {
            quarters[(id / 500) as usize] += 1;
        }
    }
    let expected = 40.0 * 50.0 / 4.0;
    let chi2 = chi_square(quarters.iter().map(|&o| (o, expected)));
    // 3 degrees of freedom: p = 0.001 at 16.27.
    assert!(chi2 < 16.27, "quarters {quarters:?}, chi2 {chi2}");
    Ok(())
}

#[tokio::test]
async fn sample_larger_than_the_table_returns_every_row() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("t.parquet");
    write_parquet(
        &path,
        &one_column("v", arc(Float64Array::from(vec![1.0, 2.0, 2.0]))),
    )?;
    let session = session()?;
    let batches =
        collect(&session, &format!("SAMPLE '{}' 10 SEED 1", path.display())).await?;
    let mut got: Vec<f64> = batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Float64Type>().values().to_vec())
        .collect();
    got.sort_by(f64::total_cmp);
    assert_eq!(got, vec![1.0, 2.0, 2.0]);
    Ok(())
}

#[tokio::test]
async fn describe_a_path_and_a_query() -> Result<()> {
    let dir = generated(10, 1)?;
    let session = session()?;
    let described =
        rows(&collect(&session, &format!("DESCRIBE '{}'", dir.path().display())).await?);
    assert_eq!(described[0], vec!["id", "Int64", "NO"]);
    assert!(
        described
            .iter()
            .any(|r| r[0] == "tokens" && r[1].starts_with("List"))
    );
    let query = rows(&collect(&session, "DESCRIBE (SELECT 1 AS one, 'a' AS s)").await?);
    assert_eq!(query.len(), 2);
    assert_eq!(query[0][0], "one");
    Ok(())
}

#[tokio::test]
async fn sorts_larger_than_the_memory_limit_spill_and_finish() -> Result<()> {
    let dir = generated(6000, 2)?;
    let spill = tempfile::tempdir()?;
    let session = sqlfeed::Session::builder()
        .memory_limit(3 << 20)
        .target_partitions(2)
        .spill_dir(spill.path())
        .build()?;
    let batches = collect(
        &session,
        &format!(
            "SELECT id, caption, tokens FROM '{}' ORDER BY caption DESC, id LIMIT 100000",
            dir.path().display()
        ),
    )
    .await?;
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(total, 6000);
    // Spill files are removed when the query ends.
    let leftovers = crate::common::files_below(spill.path());
    assert!(
        leftovers.is_empty(),
        "spill files left behind: {leftovers:?}"
    );
    Ok(())
}

/// gen's PNG and JPEG hold the same picture: decoded, they agree closely.
#[tokio::test]
async fn generated_png_and_jpeg_decode_to_the_same_picture() -> Result<()> {
    let dir = generated(20, 1)?;
    let session = session()?;
    let batches = collect(
        &session,
        &format!(
            "SELECT image_decode(image_png)['pixels'] AS png, \
                    image_decode(image_jpeg)['pixels'] AS jpeg, \
                    image_decode(image_png)['height'] AS h FROM '{}'",
            dir.path().display()
        ),
    )
    .await?;
    for batch in &batches {
        let (png, jpeg) = (
            batch.column(0).as_binary::<i32>(),
            batch.column(1).as_binary::<i32>(),
        );
        for row in 0..batch.num_rows() {
            let (a, b) = (png.value(row), jpeg.value(row));
            assert_eq!(a.len(), 8 * 8 * 3);
            assert_eq!(a.len(), b.len());
            let mean_error: f64 = a
                .iter()
                .zip(b)
                .map(|(x, y)| f64::from(x.abs_diff(*y)))
                .sum::<f64>()
                / a.len() as f64;
            assert!(
                mean_error < 12.0,
                "row {row}: mean |png - jpeg| = {mean_error}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn udfs_are_registered_in_the_session() -> Result<()> {
    let session = session()?;
    let batches = collect(
        &session,
        "SELECT standardize(3.0, 1.0, 2.0), byte_length(X'0102')",
    )
    .await?;
    assert_eq!(rows(&batches), vec![vec!["1.0", "2"]]);
    Ok(())
}

/// `EXPLAIN FORMAT TREE` renders sqlfeed's operators with their settings,
/// and row counts pass through a shuffle (the optimizer above it plans with
/// them).
#[tokio::test]
async fn explain_tree_and_statistics_see_through_a_shuffle() -> Result<()> {
    use datafusion::common::stats::Precision;
    use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
    let dir = generated(300, 3)?;
    let s = session()?;
    let sql = format!(
        "SELECT id, image_to_tensor(image_decode(image_png)) AS px FROM '{}/*.parquet' \
         SHUFFLE SEED 5",
        dir.path().display()
    );
    let text = rows(&collect(&s, &format!("EXPLAIN FORMAT TREE {sql}")).await?)
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("\n");
    for expected in [
        "ShuffleMergeExec",
        "PermuteExec",
        "ShuffleKeyExec",
        "ParallelProjectionExec",
        "seed: 5",
        "mode: gather",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
    let plan = s.sql(&sql).await?.create_physical_plan().await?;
    let statistics =
        StatisticsContext::new().compute(plan.as_ref(), &StatisticsArgs::new())?;
    assert_eq!(statistics.num_rows, Precision::Exact(300), "{statistics:?}");
    Ok(())
}

/// `['a', 'b']` is a constant at planning, so the plan's schema (what
/// `DESCRIBE` and `DataFrame::schema` show) has `one_hot`'s real width
/// before any optimization.
#[tokio::test]
async fn vocabulary_functions_have_their_width_in_the_unoptimized_schema() -> Result<()> {
    let session = session()?;
    collect(
        &session,
        "CREATE TABLE t AS SELECT * FROM (VALUES ('a'), ('c'), (NULL)) AS v(s)",
    )
    .await?;
    let query = "SELECT one_hot(s, ['a','b','c']) AS v, label_encode(s, ['a','b']) AS l \
                 FROM t";
    let described = rows(&collect(&session, &format!("DESCRIBE {query}")).await?);
    assert_eq!(described[0][0], "v");
    assert!(
        described[0][1].starts_with("FixedSizeList(3 x"),
        "{described:?}"
    );
    assert_eq!(described[1][..2], ["l", "Int64"]);
    let schema = session.sql(query).await?.schema().as_arrow().clone();
    assert_eq!(
        schema.field(0).data_type(),
        &datafusion::arrow::datatypes::DataType::new_fixed_size_list(
            datafusion::arrow::datatypes::DataType::Float32,
            3,
            false
        )
    );
    assert_eq!(
        schema.field(1).data_type(),
        &datafusion::arrow::datatypes::DataType::Int64
    );
    Ok(())
}
