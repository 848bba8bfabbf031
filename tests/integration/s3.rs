//! Queries over S3 through a real S3-compatible server (moto) on 127.0.0.1.
//!
//! `.ci/run` installs moto and sets `SQLFEED_TEST_S3=require`, so in CI these
//! tests always run. Elsewhere they run when `moto_server` is on PATH and
//! print a skip line otherwise.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::error::Result;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::common::{assert_contains, gen_data, run, sqlfeed, succeeded};

/// A moto server on a free loopback port, killed on drop.
struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto_binary() -> Option<String> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("moto_server"))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
}

/// Starts moto, or returns `None` (skip) when it is absent and not required.
fn start_moto(test: &str) -> Option<Moto> {
    start_moto_with_env(test, &[])
}

/// [`start_moto`] with the bucket `bucket` made, and a store of it.
fn moto_with_bucket(test: &str, bucket: &str) -> Option<(Moto, Arc<dyn ObjectStore>)> {
    let moto = start_moto(test)?;
    create_bucket(&moto.endpoint, bucket);
    let store = store(&moto.endpoint, bucket);
    Some((moto, store))
}

/// [`start_moto`] with extra environment for the server.
fn start_moto_with_env(test: &str, env: &[(&str, &str)]) -> Option<Moto> {
    let required = std::env::var("SQLFEED_TEST_S3").is_ok_and(|v| v == "require");
    let Some(binary) = moto_binary() else {
        assert!(
            !required,
            "SQLFEED_TEST_S3=require but moto_server is not on PATH"
        );
        // Past the harness's capture: a skip must show in a passing run.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {test}: moto_server not on PATH (pip install 'moto[server]')"
        );
        return None;
    };
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(binary)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server starts");
    let moto = Moto {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "moto did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(moto)
}

/// Creates a bucket with a plain HTTP PUT (object_store cannot create buckets).
fn create_bucket(endpoint: &str, bucket: &str) {
    let address = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).expect("connect to moto");
    write!(
        stream,
        "PUT /{bucket} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "create bucket: {response}"
    );
}

fn store(endpoint: &str, bucket: &str) -> Arc<dyn ObjectStore> {
    Arc::new(
        AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .build()
            .expect("S3 client"),
    )
}

/// Uploads every file under `local` to `prefix`, folders included.
pub(crate) async fn upload_tree(
    store: &dyn ObjectStore,
    local: &std::path::Path,
    prefix: &str,
) -> Result<()> {
    for entry in std::fs::read_dir(local)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if path.is_dir() {
            Box::pin(upload_tree(store, &path, &format!("{prefix}/{name}"))).await?;
        } else {
            store
                .put(
                    &ObjectPath::from(format!("{prefix}/{name}")),
                    PutPayload::from(std::fs::read(&path)?),
                )
                .await
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
        }
    }
    Ok(())
}

fn s3_sqlfeed(moto: &Moto) -> Command {
    let mut command = sqlfeed();
    command
        .env("AWS_ENDPOINT_URL", &moto.endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "secret-never-printed")
        .env("AWS_REGION", "us-east-1");
    command
}

#[tokio::test]
async fn s3_globs_hive_partitions_summarize_and_errors() -> Result<()> {
    let Some((moto, s3)) =
        moto_with_bucket("s3_globs_hive_partitions_summarize_and_errors", "train")
    else {
        return Ok(());
    };
    let local = tempfile::tempdir()?;
    gen_data(&local.path().join("flat"), 500, 3)?;
    gen_data(&local.path().join("month=1"), 120, 1)?;
    gen_data(&local.path().join("month=2"), 80, 1)?;
    upload_tree(s3.as_ref(), &local.path().join("flat"), "flat").await?;
    upload_tree(s3.as_ref(), &local.path().join("month=1"), "hive/month=1").await?;
    upload_tree(s3.as_ref(), &local.path().join("month=2"), "hive/month=2").await?;
    s3.put(
        &ObjectPath::from("broken/x.parquet"),
        PutPayload::from_static(b"PAR1 but not really"),
    )
    .await
    .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;

    let query = |sql: &str| run(s3_sqlfeed(&moto).args(["--format", "csv", "-c", sql]));

    let out = succeeded(query(
        "SELECT count(*) AS n, sum(id) AS s FROM 's3://train/flat/*.parquet'",
    ));
    assert_eq!(out, format!("n,s\n500,{}\n", 499 * 500 / 2));

    let out = succeeded(query(
        "SELECT month, count(*) AS n FROM 's3://train/hive/' GROUP BY month ORDER BY month",
    ));
    assert_eq!(out, "month,n\n1,120\n2,80\n");

    // Wildcards in folders (issue 20), a partition folder among them.
    let out = succeeded(query(
        "SELECT month, count(*) AS n FROM 's3://train/hive/month=*/*.parquet' \
         GROUP BY month ORDER BY month",
    ));
    assert_eq!(out, "month,n\n1,120\n2,80\n");
    let out = succeeded(query(
        "SELECT count(*) AS n FROM 's3://train/hive/month=2*/*.parquet'",
    ));
    assert_eq!(out, "n\n80\n");
    let out = succeeded(query(
        "SELECT count(*) AS n FROM 's3://train/[f]lat/*.parquet'",
    ));
    assert_eq!(out, "n\n500\n");

    let out = succeeded(query("SUMMARIZE 's3://train/flat/'"));
    assert!(
        out.lines().any(|l| l.starts_with("id,Int64,value,500,0,")),
        "{out}"
    );

    let (ok, _, err) = query("SELECT * FROM 's3://train/missing/*.parquet'");
    assert!(!ok);
    assert_contains(&err, &["no files match 's3://train/missing/*.parquet'"]);

    let (ok, _, err) = query("SELECT * FROM 's3://train/broken/x.parquet'");
    assert!(!ok);
    assert!(err.contains("s3://train/broken/x.parquet"), "{err}");

    for text in [&out, &err] {
        assert!(
            !text.contains("secret-never-printed"),
            "a secret leaked: {text}"
        );
    }
    Ok(())
}

#[test]
fn wrong_credentials_fail_fast_naming_the_url() {
    // moto checks credentials after the first request (the bucket creation).
    let Some(moto) = start_moto_with_env(
        "wrong_credentials_fail_fast_naming_the_url",
        &[("INITIAL_NO_AUTH_ACTION_COUNT", "1")],
    ) else {
        return;
    };
    create_bucket(&moto.endpoint, "secure");
    let start = Instant::now();
    let (ok, out, err) = run(s3_sqlfeed(&moto)
        .env("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG")
        .args(["-c", "SELECT * FROM 's3://secure/train/*.parquet'"]));
    assert!(!ok);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("s3://secure/train/*.parquet"), "{err}");
    assert_contains(&err, &["403", "check the credentials"]);
    assert!(!err.contains("secret-never-printed"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn tokenizers_load_from_s3_urls() -> Result<()> {
    let Some((moto, s3)) = moto_with_bucket("tokenizers_load_from_s3_urls", "models")
    else {
        return Ok(());
    };
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json");
    s3.put(
        &ObjectPath::from("minilm/tokenizer.json"),
        PutPayload::from(std::fs::read(fixture)?),
    )
    .await
    .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;

    let query = |sql: &str| run(s3_sqlfeed(&moto).args(["--format", "csv", "-c", sql]));
    // The reference ids of bert-base-uncased's vocabulary (see udfs tests).
    let out = succeeded(query(
        "SELECT tokenize('hello world', 's3://models/minilm/tokenizer.json') AS ids \
         FROM (VALUES (1), (2)) v(x)",
    ));
    assert_eq!(
        out,
        "ids\n\"[101, 7592, 2088, 102]\"\n\"[101, 7592, 2088, 102]\"\n"
    );

    let (ok, _, err) =
        query("SELECT tokenize('hello', 's3://models/minilm/missing.json') AS ids");
    assert!(!ok);
    assert_contains(
        &err,
        &["cannot read tokenizer 's3://models/minilm/missing.json'"],
    );
    assert!(
        !err.contains("secret-never-printed"),
        "a secret leaked: {err}"
    );
    Ok(())
}

/// A Delta Lake table on S3 (issue 30): read with the session's own S3
/// settings, at its newest version and at older ones.
#[cfg(feature = "delta")]
#[tokio::test]
async fn s3_delta_tables_read_at_every_version() -> Result<()> {
    let Some((moto, s3)) =
        moto_with_bucket("s3_delta_tables_read_at_every_version", "lake")
    else {
        return Ok(());
    };
    let local = tempfile::tempdir()?;
    crate::delta::three_versions(&local.path().join("events")).await?;
    upload_tree(s3.as_ref(), &local.path().join("events"), "events").await?;
    let query = |sql: &str| run(s3_sqlfeed(&moto).args(["--format", "csv", "-c", sql]));

    let out = succeeded(query("SELECT count(*) AS n FROM 's3://lake/events/'"));
    assert_eq!(out, "n\n50\n", "never the files the overwrite removed");
    let out = succeeded(query(
        "SELECT count(*) AS n FROM 's3://lake/events' VERSION AS OF 1",
    ));
    assert_eq!(out, "n\n150\n");
    let out = succeeded(query("DESCRIBE HISTORY 's3://lake/events'"));
    assert_eq!(out.lines().count(), 4, "a header and 3 commits: {out}");
    let (ok, _, err) = query("SELECT * FROM 's3://lake/events@v9'");
    assert!(!ok);
    assert_contains(
        &err,
        &["version 9 of the Delta Lake table 's3://lake/events'"],
    );
    Ok(())
}
