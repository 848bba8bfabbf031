//! Bad input names the file, column or position and says what to do; never a
//! panic, never a hang, never a printed result.

use std::path::Path;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Float64Array, Int64Array};
use datafusion::error::Result;

use crate::common::{
    arc, assert_contains, collect, generated, one_column, run, session, sqlfeed,
    write_parquet,
};

/// The error text of `sql`, which must fail saying each of `needles`.
async fn query_error(sql: &str, needles: &[&str]) -> String {
    let session = session().expect("session");
    let err = match collect(&session, sql).await {
        Ok(batches) => panic!("{sql} succeeded with {batches:?}"),
        Err(e) => e.to_string(),
    };
    for needle in needles {
        assert!(
            err.contains(needle),
            "{sql}: the error does not say {needle:?}: {err}"
        );
    }
    err
}

#[tokio::test]
async fn missing_file_names_the_path() {
    query_error(
        "SELECT * FROM '/nonexistent/dir/train.parquet'",
        &["no such file or directory: '/nonexistent/dir/train.parquet'"],
    )
    .await;
}

#[tokio::test]
async fn empty_glob_names_the_pattern() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pattern = format!("{}/*.parquet", dir.path().display());
    query_error(
        &format!("SELECT * FROM '{pattern}'"),
        &[&format!("no files match '{pattern}'")],
    )
    .await;
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
            let err = query_error(&format!("SELECT count(*) FROM '{from}'"), &[]).await;
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
    query_error(
        &format!("SELECT * FROM '{}/*.parquet'", dir.path().display()),
        &[
            "column 'x'",
            &a.display().to_string(),
            &b.display().to_string(),
        ],
    )
    .await;
    Ok(())
}

#[tokio::test]
async fn bad_sql_reports_line_and_column() {
    query_error("SELECT a FROM t WHERE a = = 1", &["Line: 1, Column: 27"]).await;
}

#[test]
fn cli_errors_exit_non_zero_and_print_no_result() -> Result<()> {
    let dir = generated(10, 1)?;
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
    assert_contains(&err, &["8x8 pixels is more than the limit of 50 pixels"]);
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

/// Writes `rows` rows of `id` (int64) and `word` (a string of 20 values, so that dictionary indices have spare bits) with
/// `compression` and dictionary encoding on or off, then flips bytes in the
/// middle of the first data page of `column`; returns the file's path. An
/// intact copy lies next to it.
pub(crate) fn parquet_with_damaged_page(
    dir: &Path,
    name: &str,
    compression: datafusion::parquet::basic::Compression,
    dictionary: bool,
    column: usize,
) -> Result<std::path::PathBuf> {
    use datafusion::arrow::array::StringArray;
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;
    use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
    let rows = 20_000i64;
    let batch = RecordBatch::try_from_iter(vec![
        (
            "id",
            arc(Int64Array::from_iter_values(
                (0..rows).map(|i| i * 7919 % 100_003),
            )),
        ),
        (
            "word",
            arc(StringArray::from_iter_values(
                (0..rows).map(|i| format!("word-{}", i * 31 % 20)),
            )),
        ),
    ])?;
    let props = WriterProperties::builder()
        .set_compression(compression)
        .set_dictionary_enabled(dictionary)
        .build();
    let path = dir.join(format!("{name}.parquet"));
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(&path)?, batch.schema(), Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    std::fs::copy(&path, dir.join(format!("{name}_intact.parquet")))?;
    let reader = SerializedFileReader::new(std::fs::File::open(&path)?)?;
    let chunk = reader.metadata().row_group(0).column(column).clone();
    let start = chunk.data_page_offset() as usize;
    let end = (chunk.byte_range().0 + chunk.byte_range().1) as usize;
    // Past the page header (tens of bytes), inside the values.
    let middle = start + (end - start) / 2;
    let mut bytes = std::fs::read(&path)?;
    for byte in &mut bytes[middle..middle + 8] {
        *byte ^= 0x5A;
    }
    std::fs::write(&path, bytes)?;
    Ok(path)
}

/// Issue 18: an error found in a file's data names the file, once, with the
/// reader's reason and no stack of wrapper prefixes; alone and under a glob.
#[tokio::test]
async fn damaged_data_pages_name_the_file_once() -> Result<()> {
    use datafusion::parquet::basic::{Compression, ZstdLevel};
    let scratch = tempfile::tempdir()?;
    let zstd = || Compression::ZSTD(ZstdLevel::default());
    let cases = [
        (
            "dictionary_plain",
            Compression::UNCOMPRESSED,
            true,
            1,
            "key beyond bounds",
        ),
        (
            "snappy",
            Compression::SNAPPY,
            false,
            0,
            "snappy: corrupt input",
        ),
        (
            "dictionary_snappy",
            Compression::SNAPPY,
            true,
            1,
            "snappy: corrupt input",
        ),
        ("dictionary_zstd", zstd(), true, 1, "key beyond bounds"),
    ];
    for (name, compression, dictionary, column, reason) in cases {
        let dir = scratch.path().join(name);
        std::fs::create_dir_all(&dir)?;
        let path =
            parquet_with_damaged_page(&dir, name, compression, dictionary, column)?;
        let file = path.display().to_string();
        for from in [file.clone(), format!("{}/*.parquet", dir.display())] {
            let err = query_error(&format!("SELECT * FROM '{from}'"), &[]).await;
            assert!(
                err.contains(&format!("cannot read the data of '{file}'")),
                "{name} via {from}: {err}"
            );
            assert!(err.contains(reason), "{name} via {from}: {err}");
            // The reader does not say where; the error path finds it.
            let column_name = ["id", "word"][column];
            assert!(
                err.contains(&format!("(row group 0, column '{column_name}' (")),
                "{name} via {from}: {err}"
            );
            assert_eq!(err.matches(&file).count(), 1, "{name} via {from}: {err}");
            assert_eq!(err.matches(reason).count(), 1, "{name} via {from}: {err}");
            assert!(!err.contains("Arrow error"), "{name} via {from}: {err}");
        }
    }
    Ok(())
}
