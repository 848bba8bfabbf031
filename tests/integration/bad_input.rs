//! Bad input names the file, column or position and says what to do; never a
//! panic, never a hang, never a printed result.

use std::path::Path;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Float64Array, Int64Array};
use datafusion::error::Result;

use crate::common::{
    arc, collect, gen_data, one_column, run, session, sqlfeed, write_parquet,
};

async fn query_error(sql: &str) -> String {
    let session = session().expect("session");
    match collect(&session, sql).await {
        Ok(batches) => panic!("{sql} succeeded with {batches:?}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn missing_file_names_the_path() {
    let err = query_error("SELECT * FROM '/nonexistent/dir/train.parquet'").await;
    assert!(
        err.contains("no such file or directory: '/nonexistent/dir/train.parquet'"),
        "{err}"
    );
}

#[tokio::test]
async fn empty_glob_names_the_pattern() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pattern = format!("{}/*.parquet", dir.path().display());
    let err = query_error(&format!("SELECT * FROM '{pattern}'")).await;
    assert!(
        err.contains(&format!("no files match '{pattern}'")),
        "{err}"
    );
    Ok(())
}

fn good_parquet_bytes(dir: &Path) -> Result<Vec<u8>> {
    let path = dir.join("good.parquet");
    write_parquet(
        &path,
        &one_column("x", arc(Int64Array::from_iter_values(0..1000))),
    )?;
    Ok(std::fs::read(path)?)
}

/// Each corruption, alone and next to a good file under one glob.
#[tokio::test]
async fn corrupt_parquet_files_are_named() -> Result<()> {
    let scratch = tempfile::tempdir()?;
    let good = good_parquet_bytes(scratch.path())?;
    let mut huge_footer = good.clone();
    let at = huge_footer.len() - 8;
    huge_footer[at..at + 4].copy_from_slice(&0x7fff_fff0u32.to_le_bytes());
    let mut bad_metadata = good.clone();
    let footer_len =
        u32::from_le_bytes(good[at..at + 4].try_into().expect("4 bytes")) as usize;
    for byte in &mut bad_metadata[at - footer_len..at] {
        *byte = 0xAB;
    }
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("zero_bytes", vec![]),
        ("zeros", vec![0u8; 4096]),
        ("truncated", good[..good.len() / 2].to_vec()),
        ("footer_longer_than_file", huge_footer),
        ("garbage_metadata", bad_metadata),
    ];
    for (name, bytes) in cases {
        let dir = scratch.path().join(name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("a_good.parquet"), &good)?;
        let bad = dir.join(format!("{name}.parquet"));
        std::fs::write(&bad, &bytes)?;
        for from in [
            bad.display().to_string(),
            format!("{}/*.parquet", dir.display()),
        ] {
            let err = query_error(&format!("SELECT count(*) FROM '{from}'")).await;
            assert!(
                err.contains(&bad.display().to_string())
                    && err.contains("Parquet footer"),
                "{name} via {from}: {err}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn conflicting_schemas_name_the_column_and_both_files() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let a = dir.path().join("a.parquet");
    let b = dir.path().join("b.parquet");
    write_parquet(&a, &one_column("x", arc(Int64Array::from(vec![1]))))?;
    write_parquet(&b, &one_column("x", arc(Float64Array::from(vec![1.5]))))?;
    let err = query_error(&format!(
        "SELECT * FROM '{}/*.parquet'",
        dir.path().display()
    ))
    .await;
    assert!(err.contains("column 'x'"), "{err}");
    assert!(err.contains(&a.display().to_string()), "{err}");
    assert!(err.contains(&b.display().to_string()), "{err}");
    Ok(())
}

#[tokio::test]
async fn bad_sql_reports_line_and_column() {
    let err = query_error("SELECT a FROM t WHERE a = = 1").await;
    assert!(err.contains("Line: 1, Column: 27"), "{err}");
}

#[test]
fn cli_errors_exit_non_zero_and_print_no_result() -> Result<()> {
    let dir = tempfile::tempdir()?;
    gen_data(dir.path(), 10, 1)?;
    std::fs::write(dir.path().join("zz.parquet"), b"not parquet at all")?;
    let (ok, out, err) = run(sqlfeed().args([
        "-c",
        &format!("SELECT count(*) FROM '{}/*.parquet'", dir.path().display()),
    ]));
    assert!(!ok);
    assert!(out.is_empty(), "printed a result: {out}");
    assert!(err.contains("zz.parquet"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    Ok(())
}

#[test]
fn unreachable_object_store_fails_fast_naming_the_url() {
    // Port 1 on loopback refuses connections: the retries must give up quickly.
    let start = Instant::now();
    let (ok, out, err) = run(sqlfeed()
        .env("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .args(["-c", "SELECT * FROM 's3://no-bucket/train/*.parquet'"]));
    let took = start.elapsed();
    assert!(!ok);
    assert!(out.is_empty());
    assert!(err.contains("s3://no-bucket/train/*.parquet"), "{err}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[tokio::test]
async fn the_image_pixel_limit_is_a_session_setting() -> Result<()> {
    let dir = tempfile::tempdir()?;
    crate::common::gen_data(dir.path(), 5, 1)?; // 8x8 images
    let files = format!("'{}/*.parquet'", dir.path().display());
    let strict = sqlfeed::Session::builder().max_image_pixels(50).build()?;
    let err = strict
        .collect(
            strict
                .sql(&format!("SELECT image_decode(image_png) FROM {files}"))
                .await?,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("8x8 pixels is more than the limit of 50 pixels"),
        "{err}"
    );
    let sql = format!("SELECT count(try_image_decode(image_png)) AS n FROM {files}");
    let strict_count = crate::common::collect(&strict, &sql).await?;
    assert_eq!(
        crate::common::rows(&strict_count),
        vec![vec!["0".to_string()]]
    );
    let default_count = crate::common::collect(&crate::common::session()?, &sql).await?;
    assert_eq!(
        crate::common::rows(&default_count),
        vec![vec!["5".to_string()]]
    );
    // The same from the command line.
    let out = crate::common::csv_with(&["--max-image-pixels", "50"], &sql);
    assert_eq!(out.trim(), "n\n0");
    Ok(())
}
