//! SIGINT and SIGTERM to the CLI's non-interactive commands (issue 35): what
//! Ctrl-C, Slurm and Kubernetes send before SIGKILL on preemption. The
//! command is cancelled, its spill folder and unfinished cache parts are
//! removed, it prints one line and exits 128 + the signal's number.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{files_below, sqlfeed};

/// Longest a stopped process may take to exit before the test calls it a
/// hang. The goal is a second; this bound leaves room for a loaded
/// 2-core CI machine, and the measured time is printed.
const EXIT_BOUND: Duration = Duration::from_secs(10);

/// Waits until `ready` holds, polling; panics after a minute.
fn wait_for(what: &str, child: &mut Child, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("sqlfeed ended ({status}) before {what}");
        }
        assert!(Instant::now() < deadline, "no {what} within a minute");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` (`TERM`, `INT`) and waits for the exit; returns (exit code,
/// stderr, seconds from the signal to the exit).
fn signal_and_wait(mut child: Child, signal: &str) -> (Option<i32>, String, f64) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let sent = Instant::now();
    let deadline = sent + EXIT_BOUND;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waitable") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sqlfeed did not exit within {EXIT_BOUND:?} of SIG{signal}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = sent.elapsed().as_secs_f64();
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
    }
    eprintln!("SIG{signal}: exited {:?} after {took:.3} s", status.code());
    (status.code(), stderr, took)
}

/// Spill files of the sessions under `dir` (each in `sqlfeed-spill-*`).
fn spilled(dir: &Path) -> usize {
    files_below(dir).len()
}

fn spill_folders(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("sqlfeed-spill-"))
                .collect()
        })
        .unwrap_or_default()
}

/// 200,000 rows of 2 KiB through a shuffle under 64 MiB: it spills.
const HEAVY_FEED: &str =
    "SELECT value AS id, one_hot(value % 100, 512) AS v FROM generate_series(1, 200000)";

#[test]
fn sigterm_to_a_spilling_shuffled_feed_removes_its_spill_and_cache_parts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spill = dir.path().join("spill");
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&spill).expect("spill dir");
    let child = sqlfeed()
        .args(["--memory-limit", "64M", "--spill-dir"])
        .arg(&spill)
        .arg("--cache-dir")
        .arg(&cache)
        .args([
            "feed",
            HEAVY_FEED,
            "--shuffle-seed",
            "3",
            "--batch-size",
            "256",
        ])
        .args(["--device", "cpu", "--cache", "--epochs", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = child.expect("sqlfeed starts");
    wait_for("spill files", &mut child, || spilled(&spill) > 0);
    let (code, stderr, _) = signal_and_wait(child, "TERM");
    assert_eq!(code, Some(143), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("stopped by"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("SIGTERM"), "{stderr}");
    assert!(!stderr.contains("Error"), "{stderr}");
    assert_eq!(
        spill_folders(&spill),
        Vec::<String>::new(),
        "spill folder removed"
    );
    assert_eq!(
        files_below(&cache.join("tmp")),
        Vec::<std::path::PathBuf>::new(),
        "no cache parts left"
    );
}

#[test]
fn sigint_to_a_feed_between_batches_exits_130() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spill = dir.path().join("spill");
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&spill).expect("spill dir");
    let mut child = sqlfeed()
        .args(["--memory-limit", "256M", "--spill-dir"])
        .arg(&spill)
        .arg("--cache-dir")
        .arg(&cache)
        .args(["feed", HEAVY_FEED, "--batch-size", "64", "--device", "cpu"])
        .args(["--cache", "--digest", "--step-ms", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sqlfeed starts");
    // Batches are streaming (and the cache entry filling) when it comes.
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    for _ in 0..5 {
        let line = lines.next().expect("a batch line").expect("utf-8");
        assert!(line.starts_with("batch epoch=0"), "{line}");
    }
    let (code, stderr, _) = signal_and_wait(child, "INT");
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("stopped by SIGINT"), "{stderr}");
    assert_eq!(spill_folders(&spill), Vec::<String>::new());
    assert_eq!(
        files_below(&cache.join("tmp")),
        Vec::<std::path::PathBuf>::new(),
        "no cache parts left"
    );
}

#[test]
fn sigint_to_a_spilling_query_cancels_it_and_exits_130() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spill = dir.path().to_path_buf();
    let mut child = sqlfeed()
        .args(["--memory-limit", "32M", "--spill-dir"])
        .arg(&spill)
        .args([
            "--format",
            "csv",
            "-c",
            "SELECT value, repeat('x', 64) AS pad FROM generate_series(1, 20000000) \
             ORDER BY value DESC",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sqlfeed starts");
    wait_for("spill files", &mut child, || spilled(&spill) > 0);
    let (code, stderr, _) = signal_and_wait(child, "INT");
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("stopped by SIGINT"), "{stderr}");
    assert_eq!(
        spill_folders(&spill),
        Vec::<String>::new(),
        "spill folder removed"
    );
}

/// An HTTP server on 127.0.0.1 that accepts connections and never answers:
/// an object store that stalls.
struct StallingServer {
    port: u16,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl StallingServer {
    fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("bound").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, stopped) = (Arc::clone(&accepted), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut held = vec![];
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        held.push(stream);
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            port,
            accepted,
            stop,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for StallingServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Issue 56, item 2: a feed being planned over a stalled store, and an
/// `--explain`, stop on SIGTERM / SIGINT like a running feed (they were
/// alive 10 s after it; the promise is a second).
#[test]
fn signals_stop_a_feed_while_it_is_planned_and_while_it_explains() {
    for (signal, code, explain) in [("TERM", 143, false), ("INT", 130, true)] {
        let server = StallingServer::start();
        let dir = tempfile::tempdir().expect("tempdir");
        let sql = format!(
            "SELECT * FROM 'http://127.0.0.1:{}/data.parquet'",
            server.port
        );
        let mut command = sqlfeed();
        command
            .args(["--allow-http", "--spill-dir"])
            .arg(dir.path())
            .args(["feed", &sql, "--shuffle-seed", "1", "--device", "cpu"]);
        if explain {
            command.args(["--explain", "0:3"]);
        }
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sqlfeed starts");
        wait_for("a connection to the stalled store", &mut child, || {
            server.accepted() > 0
        });
        let (exit, stderr, _) = signal_and_wait(child, signal);
        assert_eq!(exit, Some(code), "explain {explain}: {stderr}");
        assert!(
            stderr.contains(&format!("stopped by SIG{signal}")),
            "{stderr}"
        );
        assert_eq!(
            spill_folders(dir.path()),
            Vec::<String>::new(),
            "spill folder removed"
        );
    }
}
