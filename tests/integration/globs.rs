//! Issue 20: globs with wildcards in folder components, local here and on
//! S3 in `s3.rs`; hive `key=value` folders stay partition columns.

use std::path::Path;

use datafusion::arrow::array::Int64Array;
use datafusion::error::Result;

use crate::common::{arc, collect, one_column, rows, session, write_parquet};

fn ids(path: &Path, ids: &[i64]) -> Result<()> {
    std::fs::create_dir_all(path.parent().expect("a parent folder"))?;
    write_parquet(path, &one_column("id", arc(Int64Array::from(ids.to_vec()))))
}

async fn query(sql: &str) -> Result<Vec<Vec<String>>> {
    let session = session()?;
    Ok(rows(&collect(&session, sql).await?))
}

#[tokio::test]
async fn wildcards_in_folders_match_exactly_what_they_say() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().display();
    ids(&dir.path().join("a/x.parquet"), &[1, 2, 3])?;
    ids(&dir.path().join("b/y.parquet"), &[4, 5])?;
    ids(&dir.path().join("b/deeper/z.parquet"), &[6])?;
    ids(&dir.path().join("top.parquet"), &[7])?;
    std::fs::write(dir.path().join("b/notes.txt"), "not parquet")?;
    let sum = |glob: &str| format!("SELECT count(*), sum(id) FROM '{d}/{glob}'");
    for (glob, count, total) in [
        ("*/*.parquet", 5, 15), // one level: not b/deeper, not top
        ("?/*.parquet", 5, 15),
        ("[a]/*.parquet", 3, 6),
        ("[!a]/*.parquet", 2, 9),
        ("*/y*.parquet", 2, 9),
        ("**/*.parquet", 7, 28), // every level
        ("*/deeper/*.parquet", 1, 6),
    ] {
        assert_eq!(
            query(&sum(glob)).await?,
            vec![vec![count.to_string(), total.to_string()]],
            "{glob}"
        );
    }
    let err = collect(&session()?, &sum("*/none-*.parquet"))
        .await
        .expect_err("nothing matches")
        .to_string();
    assert!(err.contains("no .parquet files match"), "{err}");
    // VERIFY reads the same files.
    let verified = query(&format!("VERIFY '{d}/*/*.parquet'")).await?;
    assert_eq!(verified.len(), 2, "{verified:?}");
    Ok(())
}

#[tokio::test]
async fn wildcards_in_partition_folders_filter_partitions() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().display();
    ids(&dir.path().join("h/month=1/x.parquet"), &[1])?;
    ids(&dir.path().join("h/month=2/x.parquet"), &[2])?;
    ids(&dir.path().join("h/month=10/x.parquet"), &[10])?;
    ids(&dir.path().join("g/a/month=1/x.parquet"), &[1])?;
    ids(&dir.path().join("g/b/month=2/x.parquet"), &[2])?;
    let by_month = |glob: &str| {
        format!(
            "SELECT CAST(month AS VARCHAR), sum(id) FROM '{d}/{glob}' GROUP BY 1 ORDER BY 1"
        )
    };
    let row = |m: &str, s: i64| vec![m.to_string(), s.to_string()];
    assert_eq!(
        query(&by_month("h/month=1*/*.parquet")).await?,
        vec![row("1", 1), row("10", 10)]
    );
    assert_eq!(
        query(&by_month("h/month=*/*.parquet")).await?,
        vec![row("1", 1), row("10", 10), row("2", 2)]
    );
    assert_eq!(
        query(&by_month("h/month=[2-9]/*.parquet")).await?,
        vec![row("2", 2)]
    );
    assert_eq!(
        query(&by_month("g/*/month=*/*.parquet")).await?,
        vec![row("1", 1), row("2", 2)]
    );
    let err = collect(
        &session()?,
        &format!("SELECT * FROM '{d}/h/month=*/raw/*.parquet'"),
    )
    .await
    .expect_err("a plain folder after a partition folder")
    .to_string();
    assert!(err.contains("after a key=value folder"), "{err}");
    Ok(())
}

/// Issue 30, item 0: a Delta Lake or Iceberg table's folder keeps the files
/// that later commits removed; read as loose Parquet it would count them.
/// Every way of naming such a folder's files is refused, saying what it is;
/// the Delta table's own folder is opened as the table (`delta.rs` reads
/// real ones), here a log with no metadata, which is an error naming it.
#[tokio::test]
async fn delta_and_iceberg_table_folders_are_refused_not_read_wrong() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path().display();
    // The layout the deltalake package writes: an overwrite left the old
    // file in place, only removed in the log.
    let delta = dir.path().join("events");
    ids(&delta.join("part-00000-old.parquet"), &[1, 2, 3])?;
    ids(&delta.join("day=1/part-00001-new.parquet"), &[4])?;
    std::fs::create_dir_all(delta.join("_delta_log"))?;
    std::fs::write(delta.join("_delta_log/00000000000000000000.json"), "{}")?;
    for table in [format!("{d}/events"), format!("{d}/events/")] {
        let err = query(&format!("SELECT count(*) FROM '{table}'"))
            .await
            .unwrap_err()
            .to_string();
        let expected = if cfg!(feature = "delta") {
            "of the Delta Lake table '"
        } else {
            "Delta Lake table at"
        };
        assert!(
            err.contains(expected) && err.contains("events"),
            "{table}: {err}"
        );
    }
    for table in [
        format!("{d}/events/*.parquet"),
        format!("{d}/events/day=1/*.parquet"),
        format!("{d}/events/*/*.parquet"),
        format!("{d}/*/*.parquet"),
    ] {
        let err = query(&format!("SELECT count(*) FROM '{table}'"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("Delta Lake table at") && err.contains("events"),
            "{table}: {err}"
        );
    }
    let iceberg = dir.path().join("ice");
    ids(&iceberg.join("data/00000-0.parquet"), &[5])?;
    std::fs::create_dir_all(iceberg.join("metadata"))?;
    std::fs::write(iceberg.join("metadata/v1.metadata.json"), "{}")?;
    let err = query(&format!("SELECT count(*) FROM '{d}/ice'"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Apache Iceberg table at"), "{err}");
    // A file named explicitly is read as the file it is.
    let one = query(&format!(
        "SELECT count(*) FROM '{d}/events/part-00000-old.parquet'"
    ))
    .await?;
    assert_eq!(one, [["3"]]);
    Ok(())
}
