//! Issue 18: page checksums are verified, and `VERIFY` / `sqlfeed verify`
//! report per file whether every page (and every image) reads.

use std::path::{Path, PathBuf};

use datafusion::arrow::array::{BinaryArray, Int64Array};
use datafusion::error::Result;
use datafusion::parquet::basic::Compression;

use crate::bad_input::parquet_with_damaged_page;
use crate::common::{
    arc, assert_contains, collect, rows, run, session, sqlfeed, write_parquet,
};

/// The committed fixture with a CRC-32 in every page header (written by
/// `tests/data/make_page_checksums.py`: 4,000 rows of `id`, `word`).
#[cfg(feature = "page-checksums")]
fn checksummed_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/page_checksums.parquet")
}

/// A copy of the fixture in `dir` with one byte flipped inside the values of
/// the first page of `id`: the page still decodes, to a wrong value.
#[cfg(feature = "page-checksums")]
fn flipped_copy(dir: &Path) -> Result<PathBuf> {
    use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
    let path = dir.join("flipped.parquet");
    std::fs::copy(checksummed_fixture(), &path)?;
    let reader = SerializedFileReader::new(std::fs::File::open(&path)?)?;
    let chunk = reader.metadata().row_group(0).column(0).clone();
    // Past the first page header (~30 bytes), inside plain int64 values.
    let at = chunk.data_page_offset() as usize + 200;
    let mut bytes = std::fs::read(&path)?;
    bytes[at] ^= 0x01;
    std::fs::write(&path, bytes)?;
    Ok(path)
}

#[cfg(feature = "page-checksums")]
#[tokio::test]
async fn a_flipped_bit_in_a_checksummed_page_is_an_error_naming_the_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let intact = dir.path().join("intact.parquet");
    std::fs::copy(checksummed_fixture(), &intact)?;
    let session = session()?;
    let sum = |path: &Path| format!("SELECT sum(id) FROM '{}'", path.display());
    assert_eq!(
        rows(&collect(&session, &sum(&intact)).await?),
        vec![vec![(3999 * 4000 / 2).to_string()]]
    );
    let flipped = flipped_copy(dir.path())?;
    let err = collect(&session, &sum(&flipped))
        .await
        .expect_err("a checksum mismatch must not read as data")
        .to_string();
    assert!(
        err.contains(&format!("cannot read the data of '{}'", flipped.display())),
        "{err}"
    );
    assert!(err.contains("CRC checksum mismatch"), "{err}");
    Ok(())
}

/// A tiny valid JPEG (8x8 gray).
fn jpeg() -> Vec<u8> {
    let mut bytes = Vec::new();
    let pixels = vec![128u8; 64];
    image::codecs::jpeg::JpegEncoder::new(&mut bytes)
        .encode(&pixels, 8, 8, image::ExtendedColorType::L8)
        .expect("encode");
    bytes
}

/// `images.parquet`: 4 rows of `id` and `img`; row 2's image is cut in half.
fn images_file(dir: &Path) -> Result<PathBuf> {
    let good = jpeg();
    let cut = good[..good.len() / 2].to_vec();
    let values: Vec<&[u8]> = vec![&good, &good, &cut, &good];
    let batch = datafusion::arrow::array::RecordBatch::try_from_iter(vec![
        ("id", arc(Int64Array::from(vec![0, 1, 2, 3]))),
        ("img", arc(BinaryArray::from(values))),
    ])?;
    let path = dir.join("images.parquet");
    write_parquet(&path, &batch)?;
    Ok(path)
}

/// The `VERIFY` rows of `sql` as (file name, status, problem).
async fn verify_rows(sql: &str) -> Result<Vec<(String, String, String)>> {
    let session = session()?;
    let batches = collect(&session, sql).await?;
    Ok(rows(&batches)
        .into_iter()
        .map(|row| {
            let file = Path::new(&row[0])
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (file, row[1].clone(), row[7].clone())
        })
        .collect())
}

#[tokio::test]
async fn verify_names_the_row_group_column_and_row_of_each_problem() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // b_dict.parquet: a damaged dictionary-encoded page of column `word`.
    let damaged = parquet_with_damaged_page(
        dir.path(),
        "b_dict",
        Compression::UNCOMPRESSED,
        true,
        1,
    )?;
    // c_snappy.parquet: a damaged snappy page of column `id`.
    parquet_with_damaged_page(dir.path(), "c_snappy", Compression::SNAPPY, false, 0)?;
    // d_truncated.parquet: the footer is gone.
    let intact = std::fs::read(dir.path().join("b_dict_intact.parquet"))?;
    std::fs::write(
        dir.path().join("d_truncated.parquet"),
        &intact[..intact.len() / 2],
    )?;
    images_file(dir.path())?;
    let got = verify_rows(&format!(
        "VERIFY '{}/*.parquet' DECODE img",
        dir.path().display()
    ))
    .await?;
    let names: Vec<&str> = got.iter().map(|(f, _, _)| f.as_str()).collect();
    assert_eq!(
        names,
        [
            "b_dict.parquet",
            "b_dict_intact.parquet",
            "c_snappy.parquet",
            "c_snappy_intact.parquet",
            "d_truncated.parquet",
            "images.parquet"
        ],
        "listing order"
    );
    let by_name = |name: &str| {
        got.iter()
            .find(|(f, _, _)| f == name)
            .cloned()
            .unwrap_or_default()
    };
    let (_, status, problem) = by_name("b_dict.parquet");
    assert_eq!(status, "damaged");
    assert!(
        problem.contains("row group 0, column 'word'")
            && problem.contains("key beyond bounds"),
        "{problem}"
    );
    assert!(
        !problem.contains("column 'id'"),
        "only `word` is damaged: {problem}"
    );
    let (_, status, problem) = by_name("c_snappy.parquet");
    assert_eq!(status, "damaged");
    assert_contains(&problem, &["column 'id' (SNAPPY", "snappy"]);
    let (_, status, problem) = by_name("d_truncated.parquet");
    assert_eq!(status, "damaged");
    assert!(problem.starts_with("footer: "), "{problem}");
    // Images: the second file's 4 images decode but the cut one, at row 2.
    let (_, status, problem) = by_name("images.parquet");
    assert_eq!(status, "damaged");
    assert_contains(&problem, &["column 'img'", "(file row 2)"]);
    for intact in ["b_dict_intact.parquet", "c_snappy_intact.parquet"] {
        assert_eq!(by_name(intact).1, "ok", "{intact}: {}", by_name(intact).2);
    }
    drop(damaged);
    Ok(())
}

#[tokio::test]
async fn verify_counts_rows_chunks_and_images_of_good_files() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let good = jpeg();
    let batch = datafusion::arrow::array::RecordBatch::try_from_iter(vec![(
        "img",
        arc(BinaryArray::from(vec![good.as_slice(); 5])),
    )])?;
    write_parquet(&dir.path().join("ok.parquet"), &batch)?;
    let session = session()?;
    let batches = collect(
        &session,
        &format!("VERIFY '{}' DECODE img", dir.path().display()),
    )
    .await?;
    let row = &rows(&batches)[0];
    // file, status, rows, row_groups, column_chunks, images, bytes, problem
    assert_eq!(&row[1..6], ["ok", "5", "1", "1", "5"], "{row:?}");
    assert!(batches[0].column(7).is_null(0));
    // A DECODE column no file has is an error (a typo must not say `ok`).
    let err = collect(
        &session,
        &format!("VERIFY '{}' DECODE picture", dir.path().display()),
    )
    .await
    .expect_err("no file has `picture`")
    .to_string();
    assert_contains(&err, &["no file has a top-level column 'picture'"]);
    Ok(())
}

#[cfg(feature = "page-checksums")]
#[tokio::test]
async fn verify_reports_a_checksum_mismatch() -> Result<()> {
    let dir = tempfile::tempdir()?;
    flipped_copy(dir.path())?;
    let got = verify_rows(&format!("VERIFY '{}'", dir.path().display())).await?;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, "damaged");
    assert!(
        got[0].2.contains("row group 0, column 'id'") && got[0].2.contains("CRC"),
        "{:?}",
        got[0]
    );
    Ok(())
}

#[test]
fn sqlfeed_verify_exits_non_zero_on_a_damaged_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let good = dir.path().join("good");
    std::fs::create_dir_all(&good)?;
    let batch = crate::common::one_column("x", arc(Int64Array::from(vec![1, 2, 3])));
    write_parquet(&good.join("a.parquet"), &batch)?;
    let (ok, out, err) = run(sqlfeed().args(["--format", "csv", "verify"]).arg(&good));
    assert!(ok, "{out}{err}");
    assert!(out.contains("a.parquet,ok,3,1,1,0,"), "{out}");

    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad)?;
    images_file(&bad)?;
    let (ok, out, err) = run(sqlfeed()
        .args(["--format", "csv", "verify", "--decode", "img"])
        .arg(&bad));
    assert!(!ok, "a damaged file must fail the command: {out}");
    assert!(out.contains("images.parquet,damaged"), "{out}");
    assert!(err.contains("1 damaged file"), "{err}");

    let (ok, _, err) = run(sqlfeed().args(["verify"]).arg(dir.path().join("none")));
    assert!(!ok);
    assert!(err.contains("no such file or directory"), "{err}");
    Ok(())
}

/// A page header that parquet 59 unwraps (found by `tests/fuzz.rs`, saved in
/// `tests/fuzz/regressions/parquet_read/`): the reader's panic is an error
/// naming the file, for a query and for `VERIFY`, not an engine bug.
#[tokio::test]
async fn a_reader_panic_on_a_damaged_page_names_the_file() -> Result<()> {
    let found = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/regressions/parquet_read/e0054664e6825178");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("fuzzed.parquet");
    std::fs::copy(found, &path)?;
    let session = session()?;
    let err = collect(&session, &format!("SELECT * FROM '{}'", path.display()))
        .await
        .expect_err("the page header is damaged")
        .to_string();
    assert!(
        err.contains(&format!("cannot read the data of '{}'", path.display()))
            && err.contains("the Parquet reader panicked on it"),
        "{err}"
    );
    assert!(!err.contains("query engine panicked"), "{err}");
    let got = verify_rows(&format!("VERIFY '{}'", path.display())).await?;
    assert_eq!(got[0].1, "damaged");
    assert!(
        got[0].2.contains("the Parquet reader panicked"),
        "{:?}",
        got[0]
    );
    Ok(())
}
