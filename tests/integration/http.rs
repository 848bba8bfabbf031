//! Plain `http://` object-store URLs (issue 35): refused by default, before
//! any connection, with an error naming the URL and the three switches
//! (`--allow-http`, `SQLFEED_ALLOW_HTTP=1`, `SessionBuilder::allow_http`);
//! read when allowed, from a real HTTP server on 127.0.0.1.
//!
//! object_store reads Parquet with ranged GETs and expects `206 Partial
//! Content`, so the server here answers `Range` itself (Python's
//! `http.server` does not).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use datafusion::arrow::array::{Array, Int64Array, StringArray};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::{DataFusionError, Result};

use crate::common::{collect, run, sqlfeed, write_parquet};

/// Rows of the served file.
const ROWS: usize = 344;

/// The file name the server serves.
const FILE: &str = "penguins.parquet";

/// A minimal HTTP/1.1 server of one file on 127.0.0.1 (a free port): `GET`
/// whole or with `Range: bytes=…` (`206` + `Content-Range`), `HEAD`, `404`
/// for other paths and `405` for other methods (object_store lists with
/// `PROPFIND`). One request per connection (`Connection: close`). Stops when
/// dropped.
struct RangeServer {
    /// Where it listens.
    address: SocketAddr,
    /// Set on drop; the accept loop ends at the next connection.
    stop: Arc<AtomicBool>,
    /// Connections accepted so far (a refused URL must make none).
    connections: Arc<AtomicUsize>,
}

impl RangeServer {
    /// Serves `body` as `/{FILE}`.
    fn start(body: Vec<u8>) -> Self {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("a free port on 127.0.0.1");
        let address = listener.local_addr().expect("a bound address");
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let body = Arc::new(body);
        let (stopped, counted) = (Arc::clone(&stop), Arc::clone(&connections));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                counted.fetch_add(1, Ordering::SeqCst);
                let body = Arc::clone(&body);
                // A client that hangs up early is not the test's failure.
                std::thread::spawn(move || {
                    let _ = serve(stream, &body);
                });
            }
        });
        Self {
            address,
            stop,
            connections,
        }
    }

    /// `http://127.0.0.1:PORT`.
    fn origin(&self) -> String {
        format!("http://{}", self.address)
    }

    /// The URL of the served file.
    fn url(&self) -> String {
        format!("{}/{FILE}", self.origin())
    }

    /// Connections accepted so far.
    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for RangeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept so that the loop sees the flag.
        let _ = TcpStream::connect(self.address);
    }
}

/// Answers one request on `stream`.
fn serve(stream: TcpStream, body: &[u8]) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.trim().eq_ignore_ascii_case("range")
        {
            range = Some(value.trim().to_string());
        }
    }
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut stream = stream;
    let len = body.len();
    let fixed = "Accept-Ranges: bytes\r\nLast-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n\
                 Connection: close\r\n";
    if method != "GET" && method != "HEAD" {
        return write!(
            stream,
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }
    if path != format!("/{FILE}") {
        return write!(
            stream,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    }
    let (status, content_range, bytes) = match range
        .as_deref()
        .map(|r| byte_range(r, len))
    {
        None => ("200 OK", String::new(), body),
        Some(Some((start, end))) => (
            "206 Partial Content",
            format!("Content-Range: bytes {start}-{end}/{len}\r\n"),
            &body[start..=end],
        ),
        Some(None) => {
            return write!(
                stream,
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{content_range}{fixed}\r\n",
        bytes.len()
    )?;
    if method == "GET" {
        stream.write_all(bytes)?;
    }
    stream.flush()
}

/// The inclusive byte range of `bytes=a-b`, `bytes=a-` or `bytes=-n` within
/// `len` bytes; `None` if it is not satisfiable (or not one range).
fn byte_range(header: &str, len: usize) -> Option<(usize, usize)> {
    let spec = header.strip_prefix("bytes=")?;
    let (start, end) = spec.split_once('-')?;
    let (start, end) = match (start.trim(), end.trim()) {
        ("", suffix) => {
            let suffix: usize = suffix.parse().ok()?;
            (len.checked_sub(suffix.min(len))?, len.checked_sub(1)?)
        }
        (start, "") => (start.parse().ok()?, len.checked_sub(1)?),
        (start, end) => {
            let end: usize = end.parse().ok()?;
            (start.parse().ok()?, end.min(len.checked_sub(1)?))
        }
    };
    (start <= end && end < len).then_some((start, end))
}

/// A small penguins table (`id`, `species`) as Parquet bytes, served.
fn penguins_server() -> Result<RangeServer> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(FILE);
    let ids = Int64Array::from_iter_values(0..ROWS as i64);
    let species = StringArray::from_iter_values(
        (0..ROWS).map(|i| ["Adelie", "Chinstrap", "Gentoo"][i % 3]),
    );
    let batch = RecordBatch::try_from_iter(vec![
        ("id", Arc::new(ids) as Arc<dyn Array>),
        ("species", Arc::new(species) as Arc<dyn Array>),
    ])?;
    write_parquet(&path, &batch)?;
    Ok(RangeServer::start(std::fs::read(&path)?))
}

fn count_sql(server: &RangeServer) -> String {
    format!("SELECT count(*) AS n FROM '{}'", server.url())
}

/// Asserts that `message` is the refusal of `server`'s URL: it reaches the
/// user naming the server and the way out (its every switch is checked by
/// the unit test beside the message, in `session::object_stores`).
fn assert_refusal(message: &str, server: &RangeServer) {
    for part in [
        server.url().as_str(),
        "plain HTTP is refused",
        "--allow-http",
    ] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}

#[test]
fn plain_http_is_refused_by_default_before_any_connection() -> Result<()> {
    let server = penguins_server()?;
    let (ok, out, err) = run(sqlfeed().env_remove("SQLFEED_ALLOW_HTTP").args([
        "--format",
        "csv",
        "-c",
        &count_sql(&server),
    ]));
    assert!(!ok, "plain HTTP was read without the switch: {out}");
    assert_refusal(&err, &server);
    assert_eq!(server.connections(), 0, "the refusal must come first");
    Ok(())
}

#[tokio::test]
async fn session_refusing_http_is_a_plan_error_naming_the_url() -> Result<()> {
    let server = penguins_server()?;
    let session = sqlfeed::Session::builder()
        .allow_http(false)
        .target_partitions(2)
        .build()?;
    let err = collect(&session, &count_sql(&server))
        .await
        .expect_err("plain HTTP is refused");
    assert!(
        matches!(err.find_root(), DataFusionError::Plan(_)),
        "not a Plan error: {err:?}"
    );
    assert_refusal(&err.to_string(), &server);
    assert_eq!(server.connections(), 0);
    Ok(())
}

#[tokio::test]
async fn session_allow_http_counts_the_rows_of_a_local_http_server() -> Result<()> {
    let server = penguins_server()?;
    let session = sqlfeed::Session::builder()
        .allow_http(true)
        .memory_limit(256 << 20)
        .target_partitions(2)
        .build()?;
    let sql = format!(
        "SELECT count(*) AS n, sum(id) AS total, count(DISTINCT species) AS kinds \
         FROM '{}'",
        server.url()
    );
    let batches = collect(&session, &sql).await?;
    assert_eq!(
        crate::common::rows(&batches),
        vec![vec![
            ROWS.to_string(),
            (ROWS * (ROWS - 1) / 2).to_string(),
            "3".to_string()
        ]]
    );
    assert!(server.connections() > 0, "the rows came from the server");
    Ok(())
}

#[test]
fn cli_allow_http_flag_counts_the_rows_of_a_local_http_server() -> Result<()> {
    let server = penguins_server()?;
    // Without the variable, so that the flag alone allows it.
    let (ok, out, err) = run(sqlfeed().env_remove("SQLFEED_ALLOW_HTTP").args([
        "--allow-http",
        "--format",
        "csv",
        "-c",
        &count_sql(&server),
    ]));
    assert!(ok, "--allow-http: {err}");
    assert_eq!(out, format!("n\n{ROWS}\n"));
    Ok(())
}

#[test]
fn sqlfeed_allow_http_env_switches_plain_http_on_and_off() -> Result<()> {
    let server = penguins_server()?;
    let sql = count_sql(&server);
    let (ok, out, err) = run(sqlfeed()
        .env("SQLFEED_ALLOW_HTTP", "1")
        .args(["--format", "csv", "-c", &sql]));
    assert!(ok, "SQLFEED_ALLOW_HTTP=1: {err}");
    assert_eq!(out, format!("n\n{ROWS}\n"));
    let (ok, _, err) = run(sqlfeed()
        .env("SQLFEED_ALLOW_HTTP", "0")
        .args(["--format", "csv", "-c", &sql]));
    assert!(!ok, "SQLFEED_ALLOW_HTTP=0 read plain HTTP");
    assert_refusal(&err, &server);
    let (ok, _, err) = run(sqlfeed()
        .env("SQLFEED_ALLOW_HTTP", "maybe")
        .args(["--format", "csv", "-c", &sql]));
    assert!(!ok, "SQLFEED_ALLOW_HTTP=maybe was accepted");
    assert!(err.contains("SQLFEED_ALLOW_HTTP='maybe'"), "{err}");
    Ok(())
}

#[test]
fn byte_ranges_of_the_test_server() {
    assert_eq!(byte_range("bytes=0-3", 10), Some((0, 3)));
    assert_eq!(byte_range("bytes=4-", 10), Some((4, 9)));
    assert_eq!(byte_range("bytes=-4", 10), Some((6, 9)));
    assert_eq!(byte_range("bytes=8-20", 10), Some((8, 9)));
    assert_eq!(byte_range("bytes=12-14", 10), None);
    assert_eq!(byte_range("items=0-1", 10), None);
}
