//! A real Ballista cluster: one `sqlfeed scheduler` and `sqlfeed executor`
//! processes on 127.0.0.1 with free ports, started and stopped by each test.
//!
//! Results on the cluster must equal the embedded engine's, byte for byte in
//! CSV (including the SHUFFLE order, with one executor and with two), and
//! errors must read the same.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::error::Result;

use crate::common::{
    assert_contains, digest_lines, gen_data, generated, run, sqlfeed, succeeded,
    write_parquet,
};

/// Processes of one test cluster; killed on drop.
pub struct Cluster {
    scheduler: Child,
    executors: Vec<Child>,
    port: u16,
    /// Extra arguments of every executor.
    executor_args: Vec<String>,
    /// The executors' work folders: an executor killed with SIGKILL cannot
    /// remove its own, so the test's temporary folder holds them.
    work: tempfile::TempDir,
}

impl Cluster {
    /// A scheduler and `executors` executors, each running one task at a
    /// time (so that work spreads over both), all registered.
    pub fn start(executors: usize) -> Self {
        Self::start_with(executors, &["--concurrent-tasks", "1"], &[])
    }

    /// [`Cluster::start`] with extra executor and scheduler arguments.
    pub fn start_with(
        executors: usize,
        executor_args: &[&str],
        scheduler_args: &[&str],
    ) -> Self {
        let mut scheduler = sqlfeed()
            .args(["scheduler", "--bind", "127.0.0.1:0"])
            .args(scheduler_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the scheduler starts");
        let stdout = scheduler.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the scheduler prints its address");
        let port: u16 = line
            .split("df://127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no port in the scheduler's first line: {line:?}"));
        let mut cluster = Self {
            scheduler,
            executors: vec![],
            port,
            executor_args: executor_args.iter().map(|s| s.to_string()).collect(),
            work: tempfile::tempdir().expect("a temporary folder"),
        };
        for _ in 0..executors {
            cluster.add_executor();
        }
        cluster.wait_for_executors(executors);
        cluster
    }

    /// `df://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("df://127.0.0.1:{}", self.port)
    }

    /// Starts one more executor (not waiting for it to register).
    pub fn add_executor(&mut self) {
        let executor = sqlfeed()
            .args([
                "executor",
                "--scheduler",
                &format!("127.0.0.1:{}", self.port),
            ])
            .args(["--heartbeat-interval", "1"])
            .arg("--work-dir")
            .arg(
                self.work
                    .path()
                    .join(format!("executor-{}", self.executors.len())),
            )
            .args(&self.executor_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("an executor starts");
        self.executors.push(executor);
    }

    /// Bytes of the files in the executors' work folders (shuffle files
    /// of finished stages are removed; result files stay).
    pub fn work_bytes(&self) -> u64 {
        fn bytes(dir: &Path) -> u64 {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|entry| match entry.file_type() {
                    Ok(kind) if kind.is_dir() => bytes(&entry.path()),
                    _ => entry.metadata().map_or(0, |m| m.len()),
                })
                .sum()
        }
        bytes(self.work.path())
    }

    /// The jobs that have files in the executors' work folders.
    pub fn job_folders(&self) -> std::collections::BTreeSet<String> {
        fn has_files(dir: &Path) -> bool {
            std::fs::read_dir(dir).into_iter().flatten().flatten().any(
                |entry| match entry.file_type() {
                    Ok(kind) if kind.is_dir() => has_files(&entry.path()),
                    _ => true,
                },
            )
        }
        std::fs::read_dir(self.work.path())
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|executor| std::fs::read_dir(executor.path()).into_iter().flatten())
            .flatten()
            .filter(|job| has_files(&job.path()))
            .map(|job| job.file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Kills executor `i` at once (SIGKILL: no goodbye to the scheduler).
    pub fn kill_executor(&mut self, i: usize) {
        let _ = self.executors[i].kill();
        let _ = self.executors[i].wait();
    }

    /// GET `path` of the scheduler's REST API.
    pub fn rest(&self, path: &str) -> String {
        let mut stream =
            TcpStream::connect(("127.0.0.1", self.port)).expect("the scheduler accepts");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout set");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .expect("request sent");
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default()
    }

    /// Waits until `n` executors are registered.
    pub fn wait_for_executors(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let body = self.rest("/api/executors");
            let registered = body.matches("\"host\"").count();
            if registered == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{registered} of {n} executors registered after 60 s: {body}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs `sql` on the cluster; returns (success, stdout, stderr). A
    /// query still running after 120 s fails the test.
    pub fn csv(&self, sql: &str) -> (bool, String, String) {
        run_bounded(
            sqlfeed()
                .args(["--cluster", &self.url(), "--target-partitions", "4"])
                .args(["--format", "csv", "-c", sql]),
            Duration::from_secs(120),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for executor in &mut self.executors {
            let _ = executor.kill();
            let _ = executor.wait();
        }
        let _ = self.scheduler.kill();
        let _ = self.scheduler.wait();
    }
}

/// Runs `command`, failing the test if it has not ended after `bound`;
/// returns (success, stdout, stderr). Output is read while it runs.
pub fn run_bounded(
    command: &mut std::process::Command,
    bound: Duration,
) -> (bool, String, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sqlfeed starts");
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waitable") {
            break status;
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} hung for {bound:?}; stderr: {}",
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.success(),
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

/// `sql` on the embedded engine, as CSV.
fn embedded(sql: &str) -> String {
    let (ok, out, err) =
        run(sqlfeed().args(["--target-partitions", "4", "--format", "csv", "-c", sql]));
    assert!(ok, "embedded {sql:?} failed: {err}");
    out
}

/// Writes the test data: 3,000 generated rows in 4 files, and a
/// hive-partitioned copy in month=1 / month=2.
fn data(dir: &Path) -> Result<()> {
    gen_data(&dir.join("flat"), 3000, 4)?;
    gen_data(&dir.join("hive/month=1"), 700, 1)?;
    gen_data(&dir.join("hive/month=2"), 500, 2)?;
    Ok(())
}

/// The flat data's images decoded, resized to 4×4 and normalised: a query
/// whose functions cost more than its scan.
fn image_query(dir: &Path) -> String {
    format!(
        "SELECT id, image_to_tensor(image_resize(image_decode(image_png), 4, 4), \
         [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]) AS px, label AS y FROM '{}/flat/*.parquet'",
        dir.display()
    )
}

const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json"
);

#[test]
fn cluster_results_equal_embedded_results() -> Result<()> {
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let flat = format!("'{}/flat/*.parquet'", dir.path().display());
    let hive = format!("'{}/hive/'", dir.path().display());
    let queries = [
        // Numeric, text and image functions, run on the executors.
        format!(
            "SELECT id, standardize(f0, 0.5, 2.0) AS z, hash_bucket(caption, 100) AS b, \
             one_hot(label, 10) AS l, tokenize(caption, '{TOKENIZER}', 16) AS t \
             FROM {flat} WHERE id % 7 = 0 ORDER BY id"
        ),
        format!(
            "SELECT id, image_to_tensor(image_resize(image_decode(image_png), 2, 2)) AS px \
             FROM {flat} WHERE id < 40 ORDER BY id"
        ),
        // A join and aggregates (exchanges between stages).
        format!(
            "SELECT a.label, count(*) AS n, sum(b.id) AS s, min(b.caption) AS c \
             FROM {flat} a JOIN {flat} b ON a.id = b.id + 1 GROUP BY a.label ORDER BY a.label"
        ),
        // Hive partition columns from folder names.
        format!(
            "SELECT month, count(*) AS n, sum(id) AS s FROM {hive} GROUP BY month ORDER BY month"
        ),
        // The global shuffle: the whole order must match.
        format!("SELECT id, label, caption FROM {flat} SHUFFLE SEED 42"),
        format!("SELECT id FROM {hive} WHERE label < 5 SHUFFLE SEED 7 EPOCH 3"),
        // Functions after the shuffle (keyed on what they read): the same
        // order, decoded on the executors.
        format!(
            "SELECT image_to_tensor(image_resize(image_decode(image_png), 2, 2)) AS px, \
             upper(caption) AS c, label FROM {flat} WHERE id < 60 SHUFFLE SEED 9"
        ),
    ];
    let cluster = Cluster::start(2);
    for sql in &queries {
        let expected = embedded(sql);
        let (ok, got, err) = cluster.csv(sql);
        assert!(ok, "cluster {sql:?} failed: {err}");
        assert!(expected.lines().count() > 2, "{sql}: {expected}");
        assert_eq!(got, expected, "cluster and embedded differ for {sql}");
    }
    Ok(())
}

#[test]
fn shuffle_order_is_the_same_on_one_and_two_executors() -> Result<()> {
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let sql = format!(
        "SELECT id, f1 FROM '{}/flat/*.parquet' SHUFFLE SEED 5",
        dir.path().display()
    );
    let mut cluster = Cluster::start(1);
    let (ok, one, err) = cluster.csv(&sql);
    assert!(ok, "{err}");
    cluster.add_executor();
    cluster.wait_for_executors(2);
    let (ok, two, err) = cluster.csv(&sql);
    assert!(ok, "{err}");
    assert_eq!(one.lines().count(), 3001);
    assert_eq!(one, two, "1 and 2 executors give different orders");
    assert_eq!(
        one,
        embedded(&sql),
        "the cluster's order is not the embedded one"
    );
    // A different seed is a different order (the test can fail).
    let (_, other, _) = cluster.csv(&sql.replace("SEED 5", "SEED 6"));
    assert_ne!(one, other);
    Ok(())
}

#[test]
fn bad_input_on_the_cluster_reads_like_embedded() -> Result<()> {
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let corrupt = dir.path().join("corrupt.parquet");
    std::fs::write(&corrupt, b"PAR1 this is not a parquet file PAR1")?;
    let flat = format!("'{}/flat/*.parquet'", dir.path().display());
    let cluster = Cluster::start(1);
    let cases = [
        // Footer checked while planning: the file is named.
        (
            format!("SELECT * FROM '{}'", corrupt.display()),
            "corrupt.parquet",
        ),
        // SQL errors.
        (format!("SELECT nosuch FROM {flat}"), "nosuch"),
        ("SELEC 1".to_string(), "SELEC"),
        // A function failing on an executor: its message reaches the client.
        (
            format!("SELECT image_decode(caption::bytea) FROM {flat}"),
            "image_decode: cannot decode row",
        ),
        (
            format!("SELECT tokenize(caption, '/no/such/tokenizer.json') FROM {flat}"),
            "/no/such/tokenizer.json",
        ),
    ];
    // A damaged data page, found on the executor while reading: the file
    // is named there too (the executor wraps file scans like the client).
    let damaged_dir = dir.path().join("damaged");
    std::fs::create_dir_all(&damaged_dir)?;
    let damaged = crate::bad_input::parquet_with_damaged_page(
        &damaged_dir,
        "pages",
        datafusion::parquet::basic::Compression::SNAPPY,
        false,
        0,
    )?;
    let damaged_needle = format!("cannot read the data of '{}'", damaged.display());
    let cases = [
        cases.as_slice(),
        &[(
            format!("SELECT sum(id) FROM '{}'", damaged.display()),
            damaged_needle.as_str(),
        )],
    ]
    .concat();
    for (sql, needle) in &cases {
        let (ok, _, err) = cluster.csv(sql);
        assert!(!ok, "{sql} should fail on the cluster");
        assert!(
            err.contains(needle),
            "cluster error for {sql} lacks {needle:?}: {err}"
        );
        let (ok, _, embedded_err) = run(sqlfeed().args(["-c", sql]));
        assert!(!ok && embedded_err.contains(needle), "{embedded_err}");
    }
    // The executor survived every failure and still runs queries.
    let (ok, out, err) = cluster.csv(&format!("SELECT count(*) AS n FROM {flat}"));
    assert!(ok && out.contains("3000"), "{out} {err}");
    Ok(())
}

#[test]
fn an_unreachable_scheduler_is_named_within_seconds() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let start = Instant::now();
    let (ok, _, err) = run(sqlfeed().args([
        "--cluster",
        &format!("df://127.0.0.1:{port}"),
        "-c",
        "SELECT 1",
    ]));
    assert!(!ok);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert!(err.contains(&format!("df://127.0.0.1:{port}")), "{err}");
    assert!(err.contains("cannot reach the sqlfeed scheduler"), "{err}");
    // A malformed address is refused before connecting.
    let (ok, _, err) = run(sqlfeed().args(["--cluster", "http://x", "-c", "SELECT 1"]));
    assert!(!ok && err.contains("df://host:port"), "{err}");
}

#[test]
fn binding_beyond_loopback_needs_a_flag() {
    let (ok, _, err) = run(sqlfeed().args(["scheduler", "--bind", "0.0.0.0:0"]));
    assert!(!ok);
    assert!(err.contains("--allow-remote"), "{err}");
    let (ok, _, err) = run(sqlfeed().args(["executor", "--bind", "0.0.0.0:0"]));
    assert!(!ok && err.contains("--allow-remote"), "{err}");
}

#[test]
fn an_executor_killed_mid_job_ends_the_job_promptly_and_clearly() -> Result<()> {
    let dir = generated(10_000, 4)?;
    // 81M joined pairs: seconds of work on every executor.
    let side = format!(
        "(SELECT id FROM '{}/*.parquet' WHERE id < 9000)",
        dir.path().display()
    );
    let sql = format!(
        "SELECT count(*) AS n, sum(a.id * b.id % 7) AS s FROM {side} a CROSS JOIN {side} b"
    );
    let mut per_residue = [0u64; 7];
    for id in 0..9000u64 {
        per_residue[(id % 7) as usize] += 1;
    }
    let mut expected_sum = 0u64;
    for (r1, n1) in per_residue.iter().enumerate() {
        for (r2, n2) in per_residue.iter().enumerate() {
            expected_sum += n1 * n2 * ((r1 * r2 % 7) as u64);
        }
    }

    // 6 s, not less: under the whole suite's load on 2 cores a live
    // executor's 1 s heartbeats can be 3 s apart, and the scheduler then
    // drops it before the test starts (seen once).
    let mut cluster = Cluster::start_with(
        2,
        &["--concurrent-tasks", "1"],
        &["--executor-timeout", "6"],
    );
    let url = cluster.url();
    let client = std::thread::spawn(move || {
        let start = Instant::now();
        let outcome = run_bounded(
            sqlfeed()
                .args(["--cluster", &url, "--target-partitions", "4"])
                .args(["--format", "csv", "-c", &sql]),
            // Bounded: the job must end, either way, well within this.
            Duration::from_secs(150),
        );
        (outcome, start.elapsed())
    });
    // Kill an executor once the job runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cluster.rest("/api/jobs").contains("\"status\":\"Running\"") {
        assert!(Instant::now() < deadline, "the job never started");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    cluster.kill_executor(1);
    let killed_at = Instant::now();
    let ((success, out, err), _) = client.join().expect("the client thread ends");
    eprintln!(
        "kill test: {} {:.1}s after the kill",
        if success { "completed" } else { "cancelled" },
        killed_at.elapsed().as_secs_f64()
    );
    if success {
        // Finished before the loss was noticed: the rows must be right.
        assert_eq!(out, format!("n,s\n81000000,{expected_sum}\n"));
    } else {
        // sqlfeed's guard noticed the lost executor (3 s of missed
        // heartbeats), cancelled the job and named the executor.
        assert_contains(&err, &["was lost while job", "run it again"]);
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "{:?}",
            killed_at.elapsed()
        );
    }
    // The job is over on the scheduler too: cancelled, failed or completed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.rest("/api/jobs").contains("\"status\":\"Running\"") {
        assert!(
            Instant::now() < deadline,
            "the job still runs: {}",
            cluster.rest("/api/jobs")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The survivor still runs queries once the scheduler's executor list has
    // settled (right after a loss it can list the dead executor again for a
    // moment, which the client's guard would report as another loss).
    let mut settled = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while settled < 5 {
        assert!(
            Instant::now() < deadline,
            "{}",
            cluster.rest("/api/executors")
        );
        let listed = cluster.rest("/api/executors").matches("\"host\"").count();
        settled = if listed == 1 { settled + 1 } else { 0 };
        std::thread::sleep(Duration::from_millis(500));
    }
    // Even then the scheduler can list the dead executor once more, and the
    // guard fails the query with its "was lost … run it again" error (the
    // known limitation in docs/scaling.md): do what it says, a few times.
    let query = format!("SELECT count(*) AS n FROM {side} t");
    let (mut ok, mut out, mut err) = cluster.csv(&query);
    for _ in 0..5 {
        if ok || !err.contains("was lost") {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
        (ok, out, err) = cluster.csv(&query);
    }
    assert!(ok && out == "n\n9000\n", "{out} {err}");
    Ok(())
}

/// `sqlfeed feed … --digest` lines (one per batch) of one rank.
fn feed_digests(cluster: Option<&str>, data: &Path, args: &[&str]) -> Vec<String> {
    let sql = format!(
        "SELECT id, standardize(f0, 0.5, 2.0) AS x, label AS y FROM '{}/flat/*.parquet'",
        data.display()
    );
    feed_digests_of(cluster, &sql, args)
}

/// [`feed_digests`] of a feed over `sql`.
fn feed_digests_of(cluster: Option<&str>, sql: &str, args: &[&str]) -> Vec<String> {
    feed_digests_with(cluster, &[], sql, args)
}

/// [`feed_digests_of`] with the session's `settings` (`--set KEY=VALUE`).
fn feed_digests_with(
    cluster: Option<&str>,
    settings: &[&str],
    sql: &str,
    args: &[&str],
) -> Vec<String> {
    let mut command = sqlfeed();
    if let Some(url) = cluster {
        command.args(["--cluster", url, "--target-partitions", "4"]);
    } else {
        command.args(["--target-partitions", "4"]);
    }
    for setting in settings {
        command.args(["--set", setting]);
    }
    command
        .args([
            "feed",
            sql,
            "--batch-size",
            "64",
            "--epochs",
            "2",
            "--device",
            "cpu",
        ])
        .args(["--digest", "--run-id", "cluster-test"])
        .args(args);
    let (ok, out, err) = run_bounded(&mut command, Duration::from_secs(120));
    assert!(ok, "feed {args:?} failed: {err}");
    digest_lines(&out)
}

/// Runs ranks 0 and 1 of a feed of `sql` with `args(rank)` on the cluster
/// at `url` at once, checks that each gets the batches (digests) it gets
/// embedded, none empty, and returns them by rank.
fn two_ranks_get_the_embedded_batches(
    url: &str,
    sql: &str,
    args: impl Fn(usize) -> Vec<String>,
) -> Vec<Vec<String>> {
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let (url, sql, args) = (url.to_string(), sql.to_string(), args(rank));
            std::thread::spawn(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                feed_digests_of(Some(&url), &sql, &args)
            })
        })
        .collect();
    let mut batches = vec![];
    for (rank, on_cluster) in ranks.into_iter().enumerate() {
        let on_cluster = on_cluster.join().expect("rank thread");
        let args = args(rank);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let embedded_batches = feed_digests_of(None, sql, &args);
        assert!(!embedded_batches.is_empty());
        assert_eq!(on_cluster, embedded_batches, "rank {rank}");
        batches.push(embedded_batches);
    }
    batches
}

/// A mixture of the test data: `even` (1,500 rows, repeated to its share,
/// weights by step) and `hive` (1,200 rows, down-sampled), each with a
/// cheap function (computed before its passes' permutations) and a costly
/// one (run on the rows its window takes), 2,000 rows per epoch.
fn mixture_of(data: &Path, extra: &str) -> String {
    let d = data.display();
    let columns = "id, standardize(f0, 0.5, 2.0) AS x, \
                   image_to_tensor(image_resize(image_decode(image_png), 2, 2)) AS px";
    format!(
        "MIX (SELECT {columns} FROM '{d}/flat/*.parquet' WHERE id % 2 = 0) AS even \
             WEIGHT STEPS (0: 0.8, 10: 0.4), \
             (SELECT {columns} FROM '{d}/hive/') AS hive WEIGHT 0.2 \
         ROWS 2000 {extra}"
    )
}

#[test]
fn a_mixture_gives_the_embedded_rows_and_batches_on_one_and_two_executors() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let query = format!(
        "SELECT id, x, source, px FROM ({})",
        mixture_of(dir.path(), "SEED 3 BATCH 64")
    );
    // In a feed the mixture draws with the feed's seed and epoch and counts
    // its steps in the feed's global batches, settings that travel with the
    // job to the scheduler.
    let feed = format!(
        "SELECT id, x, px, source_id FROM ({})",
        mixture_of(dir.path(), "")
    );
    let shards = ["0/2", "1/2"];
    let expected = embedded(&query);
    assert_eq!(expected.lines().count(), 2001, "{expected}");
    let expected_batches: Vec<Vec<String>> = shards
        .iter()
        .map(|shard| feed_digests_of(None, &feed, &["--shard", shard]))
        .collect();
    // 2,000 rows in steps of 2 × 64: 16 batches per epoch and rank.
    assert_eq!(expected_batches[0].len(), 32);
    let digests_of_epoch = |epoch: &str| -> Vec<&str> {
        expected_batches[0]
            .iter()
            .filter(|l| l.contains(&format!("epoch={epoch} ")))
            .filter_map(|l| l.split("digest=").nth(1))
            .collect()
    };
    assert_ne!(digests_of_epoch("0"), digests_of_epoch("1"), "a new draw");
    let mut cluster = Cluster::start(1);
    for executors in [1, 2] {
        if executors == 2 {
            cluster.add_executor();
            cluster.wait_for_executors(2);
        }
        let (ok, got, err) = cluster.csv(&query);
        assert!(ok, "the mixture failed on {executors} executors: {err}");
        assert_eq!(got, expected, "{executors} executors");
        for (shard, expected) in shards.iter().zip(&expected_batches) {
            let got = feed_digests_of(Some(&cluster.url()), &feed, &["--shard", shard]);
            assert_eq!(&got, expected, "rank {shard} on {executors} executors");
        }
    }
    Ok(())
}

#[test]
fn a_cluster_feed_reports_the_embedded_realised_proportions() -> Result<()> {
    use sqlfeed::device::Device;
    use sqlfeed::feed::Feed;

    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let sql = format!("SELECT id, x FROM ({})", mixture_of(dir.path(), ""));
    // (epoch, [(source, rows)]) of each epoch.
    type Mixtures = Vec<(u64, Vec<(String, u64)>)>;
    let mixtures = |cluster: Option<&str>| -> Result<Mixtures> {
        let mut session = sqlfeed::Session::builder().target_partitions(4);
        if let Some(url) = cluster {
            session = session.cluster(url);
        }
        let session = session.build()?;
        let mut feed = Feed::builder(&session, &sql)
            .batch_size(64)
            .shard(0, 2)
            .epochs(2)
            .run_id("mixture-proportions")
            .device(Device::Cpu)
            .build()?;
        for batch in feed.by_ref() {
            batch?;
        }
        Ok(feed.epoch_mixtures().to_vec())
    };
    let expected = mixtures(None)?;
    // Weights by step: 0.8 → 0.4 over the first epoch's steps, 0.4 after.
    assert_eq!(expected.len(), 2, "{expected:?}");
    for (_, rows) in &expected {
        assert_eq!(rows.iter().map(|(_, rows)| rows).sum::<u64>(), 2000);
    }
    assert_ne!(expected[0].1, expected[1].1);
    let cluster = Cluster::start(1);
    assert_eq!(mixtures(Some(&cluster.url()))?, expected);
    Ok(())
}

#[test]
fn seeded_augmentations_draw_per_epoch_on_the_cluster_as_embedded() -> Result<()> {
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let feed = format!(
        "SELECT id, image_to_tensor(image_random_crop(image_decode(image_png), 4, 4, 7)) AS px \
         FROM '{}/flat/*.parquet' WHERE id < 256",
        dir.path().display()
    );
    let args = ["--shuffle-seed", "5"];
    let expected = feed_digests_of(None, &feed, &args);
    let cluster = Cluster::start(1);
    assert_eq!(
        feed_digests_of(Some(&cluster.url()), &feed, &args),
        expected
    );
    Ok(())
}

#[test]
fn feed_ranks_share_one_job_per_epoch_and_get_the_embedded_batches() -> Result<()> {
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let cluster = Cluster::start(2);
    let url = cluster.url();
    for shuffle in [&["--shuffle-seed", "42"][..], &[]] {
        // Three ranks as three processes at once, like a training job.
        let ranks: Vec<_> = (0..3)
            .map(|rank| {
                let url = url.clone();
                let data = dir.path().to_path_buf();
                let mut args: Vec<String> =
                    shuffle.iter().map(|s| s.to_string()).collect();
                args.extend(["--shard".to_string(), format!("{rank}/3")]);
                std::thread::spawn(move || {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    feed_digests(Some(&url), &data, &args)
                })
            })
            .collect();
        let ranks: Vec<Vec<String>> = ranks
            .into_iter()
            .map(|r| r.join().expect("rank thread"))
            .collect();
        for (rank, cluster_batches) in ranks.iter().enumerate() {
            let mut args: Vec<&str> = shuffle.to_vec();
            let shard = format!("{rank}/3");
            args.extend(["--shard", &shard]);
            let embedded = feed_digests(None, dir.path(), &args);
            // 3000 rows, 3 × 64 per step: 16 batches per epoch and rank.
            assert_eq!(embedded.len(), 2 * 16);
            assert_eq!(cluster_batches, &embedded, "rank {rank} ({shuffle:?})");
        }
    }
    // One job per epoch served all three ranks.
    let jobs = cluster.rest("/api/jobs");
    assert_eq!(
        jobs.matches("\"job_name\":\"sqlfeed-feed-").count(),
        2 * 2,
        "{jobs}"
    );
    // The shuffled jobs sorted the 4 key ranges (4 target partitions) in
    // parallel tasks, not in one task merging everything, and dealt the
    // rows to 3 × (4 + 2) rank partitions in a final stage of their own.
    let jobs: serde_json::Value = serde_json::from_str(&jobs).expect("jobs as JSON");
    let mut ranged_jobs = 0;
    for job in jobs.as_array().expect("a list of jobs") {
        let id = job["job_id"].as_str().expect("a job id");
        let stages: serde_json::Value =
            serde_json::from_str(&cluster.rest(&format!("/api/job/{id}/stages")))
                .expect("stages as JSON");
        let stages = stages["stages"].as_array().expect("stages");
        let Some(ranged) = stages
            .iter()
            .find(|s| s["stage_plan"].to_string().contains("ranged=true"))
        else {
            continue;
        };
        ranged_jobs += 1;
        let plan = ranged["stage_plan"].to_string();
        assert!(plan.contains("DealExec: batch_rows=64, world=3"), "{plan}");
        // Ballista may give a task several partitions (one per free slot).
        let tasks = ranged["tasks"].as_array().expect("tasks");
        assert!(tasks.len() >= 2, "one merging task: {ranged}");
        let mut partitions: Vec<u64> = tasks
            .iter()
            .flat_map(|t| t["partition_id"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p.as_u64())
            .collect();
        partitions.sort_unstable();
        assert_eq!(partitions, vec![0, 1, 2, 3], "{ranged}");
        let last = stages
            .iter()
            .max_by_key(|s| s["stage_id"].as_str().and_then(|id| id.parse::<u32>().ok()))
            .expect("a final stage");
        assert!(
            last["stage_plan"]
                .to_string()
                .contains("RankShardExec: partitions=18"),
            "{last}"
        );
    }
    assert_eq!(ranged_jobs, 2, "the shuffled epochs' jobs");
    // A rank resumes on the cluster exactly where the embedded rank would.
    let full = feed_digests(
        None,
        dir.path(),
        &["--shuffle-seed", "42", "--shard", "1/3"],
    );
    let resumed = feed_digests(
        Some(&url),
        dir.path(),
        &["--shuffle-seed", "42", "--shard", "1/3", "--resume", "1:5"],
    );
    assert_eq!(resumed, full[16 + 5..].to_vec());
    // Each rank fetched its own rows only: 15 full steps of 64 and a third
    // of the last 120 rows, of the epoch's 3000 (unshuffled: everything).
    // (Metrics print in thousands.)
    for (shuffle, rows) in [(&["--shuffle-seed", "42"][..], "1.00 K"), (&[], "3.00 K")] {
        let mut command = sqlfeed();
        command
            .args(["--cluster", &url, "--target-partitions", "4", "feed"])
            .arg(format!(
                "SELECT id, standardize(f0, 0.5, 2.0) AS x, label AS y FROM '{}/flat/*.parquet'",
                dir.path().display()
            ))
            .args(["--batch-size", "64", "--epochs", "1", "--device", "cpu"])
            .args(["--run-id", "fetch-test", "--shard", "0/3", "--explain-analyze"])
            .args(shuffle);
        let out = succeeded(run_bounded(&mut command, Duration::from_secs(120)));
        assert!(
            out.contains(&format!("fetched_rows={rows}")),
            "{shuffle:?}: {out}"
        );
    }
    Ok(())
}

#[test]
fn standalone_mode_runs_a_cluster_in_process() -> Result<()> {
    let dir = generated(1500, 3)?;
    let sql = format!(
        "SELECT id, hash_bucket(caption, 10) AS b FROM '{}/*.parquet' SHUFFLE SEED 3",
        dir.path().display()
    );
    let out = succeeded(run_bounded(
        sqlfeed().args(["--cluster", "standalone", "--format", "csv", "-c", &sql]),
        Duration::from_secs(120),
    ));
    assert_eq!(out.lines().count(), 1501);
    assert_eq!(out, embedded(&sql));
    // EXPLAIN shows the stages the scheduler cut.
    let out = succeeded(run_bounded(
        sqlfeed().args(["--cluster", "standalone", "-c", &format!("EXPLAIN {sql}")]),
        Duration::from_secs(120),
    ));
    assert_contains(&out, &["distributed_plan", "ShuffleWriterExec"]);
    Ok(())
}

/// A Parquet file of `rows` rows of `payload` bytes each, in row groups of
/// 50 rows (so that a file can be cut between row groups).
fn write_blobs(path: &Path, first_id: i64, rows: usize, payload: usize) -> Result<()> {
    use datafusion::arrow::array::{BinaryArray, Int64Array, RecordBatch};
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;
    let batch = RecordBatch::try_from_iter(vec![
        (
            "id",
            std::sync::Arc::new(Int64Array::from_iter_values(
                first_id..first_id + rows as i64,
            )) as _,
        ),
        (
            "blob",
            std::sync::Arc::new(BinaryArray::from_iter_values(
                (0..rows).map(|i| vec![(i % 251) as u8; payload]),
            )) as _,
        ),
    ])?;
    std::fs::create_dir_all(path.parent().expect("a folder"))?;
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(50))
        .build();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(path)?, batch.schema(), Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}

/// Stage-1 tasks of a shuffle read equal numbers of rows although the files
/// hold the same bytes in 20× different row counts; the order stays the
/// embedded engine's.
#[test]
fn stage_one_tasks_of_a_shuffle_are_balanced_by_rows() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("skewed");
    write_blobs(&data.join("a.parquet"), 0, 200, 4000)?;
    write_blobs(&data.join("b.parquet"), 1000, 4000, 200)?;
    let sql = format!(
        "SELECT id FROM '{}/*.parquet' SHUFFLE SEED 3",
        data.display()
    );
    let cluster = Cluster::start(2);
    let expected = embedded(&sql);
    let (ok, got, err) = cluster.csv(&sql);
    assert!(ok, "{err}");
    assert_eq!(got, expected);
    let jobs: serde_json::Value =
        serde_json::from_str(&cluster.rest("/api/jobs")).expect("jobs as JSON");
    let job = jobs
        .as_array()
        .and_then(|jobs| jobs.iter().max_by_key(|j| j["start_time"].as_u64()))
        .expect("a job");
    let id = job["job_id"].as_str().expect("a job id");
    let stages: serde_json::Value =
        serde_json::from_str(&cluster.rest(&format!("/api/job/{id}/stages")))
            .expect("stages as JSON");
    let scan = stages["stages"]
        .as_array()
        .and_then(|stages| {
            stages
                .iter()
                .find(|s| s["stage_plan"].to_string().contains("ShuffleKeyExec"))
        })
        .expect("the scan stage");
    // Rows per partition (a task may run several).
    let per_partition: Vec<f64> = scan["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| {
            let partitions = t["partition_id"].as_array().map_or(1, Vec::len).max(1);
            t["input_rows"].as_f64().unwrap_or(0.0) / partitions as f64
        })
        .collect();
    let max = per_partition.iter().cloned().fold(0.0, f64::max);
    let min = per_partition.iter().cloned().fold(f64::MAX, f64::min);
    assert!(
        max <= 1.3 * min,
        "stage-1 rows per partition {per_partition:?} ({scan})"
    );
    Ok(())
}

/// An executor killed (`kill -9`) while a cluster feed's epoch runs: the
/// feed re-runs the epoch's job on the executor left and delivers exactly
/// the batches of an uninterrupted run; with no executor left it fails
/// with an error saying so.
#[test]
fn a_feed_survives_an_executor_killed_mid_epoch_with_the_same_batches() -> Result<()> {
    let dir = generated(10_000, 4)?;
    // 81M candidate pairs (seconds of work on each executor), 81k rows out.
    let side = format!(
        "(SELECT id FROM '{}/*.parquet' WHERE id < 9000)",
        dir.path().display()
    );
    let sql = format!(
        "SELECT a.id * 10000 + b.id AS x FROM {side} a CROSS JOIN {side} b \
         WHERE (a.id * 31 + b.id * 17) % 1000 = 0"
    );
    let feed = move |cluster: Option<&str>| {
        let mut command = sqlfeed();
        if let Some(url) = cluster {
            command.args(["--cluster", url]);
        }
        command
            .args(["--target-partitions", "4", "feed", &sql])
            .args([
                "--shuffle-seed",
                "5",
                "--batch-size",
                "1000",
                "--device",
                "cpu",
            ])
            .args(["--digest", "--run-id", "kill-test"]);
        let (ok, out, err) = run_bounded(&mut command, Duration::from_secs(240));
        (ok, digest_lines(&out), err)
    };
    let (ok, expected, err) = feed(None);
    assert!(ok && expected.len() > 50, "embedded: {err}");

    for executors in [2, 1] {
        // Loose enough that the busy executor left keeps its heartbeats
        // within it on 2 shared cores (3 s expired it too, in a debug build).
        let mut cluster = Cluster::start_with(
            executors,
            &["--concurrent-tasks", "1"],
            &["--executor-timeout", "8"],
        );
        let url = cluster.url();
        let feed = feed.clone();
        let run = std::thread::spawn(move || feed(Some(&url)));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cluster.rest("/api/jobs").contains("\"status\":\"Running\"") {
            assert!(Instant::now() < deadline, "the job never started");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(1000));
        cluster.kill_executor(executors - 1);
        let killed_at = Instant::now();
        let (ok, got, err) = run.join().expect("the feed thread ends");
        let jobs = cluster.rest("/api/jobs");
        if executors == 2 {
            assert!(ok, "the feed failed: {err}");
            assert!(jobs.contains("-retry1"), "the epoch was re-run: {jobs}");
            assert_eq!(got, expected, "the same batches as uninterrupted");
        } else {
            assert!(!ok, "no executor was left, yet: {got:?}");
            assert!(err.contains("no executor is left"), "{err}");
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(120),
            "{:?}",
            killed_at.elapsed()
        );
    }
    Ok(())
}

/// `feed --cache --cluster`: the first epoch runs on the cluster and is
/// written into this machine's epoch cache as it arrives; later epochs read
/// the entry here, with exactly the batches of the uncached cluster feed
/// (shuffled: also the embedded feed's). Unshuffled, a cluster feed whose
/// functions run in small morsels concatenates the result partitions while
/// the embedded sink interleaves them batch by batch, so the two differ
/// there (a known gap, not the cache's).
#[test]
fn a_cached_cluster_feed_computes_once_and_keeps_the_batches() -> Result<()> {
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let sql = image_query(dir.path());
    let cache = dir.path().join("cache");
    let run = |cluster: Option<&str>, extra: &[&str]| {
        let mut command = sqlfeed();
        if let Some(url) = cluster {
            command.args(["--cluster", url]);
        }
        command
            .args(["--target-partitions", "4", "--cache-dir"])
            .arg(&cache)
            .args(["feed", &sql, "--batch-size", "64", "--epochs", "3"])
            .args(["--device", "cpu", "--digest", "--run-id", "cache-test"])
            .args(["--explain-analyze"])
            .args(extra);
        run_bounded(&mut command, Duration::from_secs(120))
    };
    let cluster = Cluster::start(2);
    let url = cluster.url();
    for shuffle in [&["--shuffle-seed", "42"][..], &[]] {
        let (ok, out, err) = run(Some(&url), shuffle);
        assert!(ok, "uncached on the cluster: {err}");
        let expected = digest_lines(&out);
        assert_eq!(expected.len(), 3 * 47, "3000 rows in batches of 64");
        // Also unshuffled, although the functions emit many small record
        // batches per partition (the lanes interleave by rows).
        let (ok, out, err) = run(None, shuffle);
        assert!(ok, "embedded: {err}");
        assert_eq!(
            digest_lines(&out),
            expected,
            "{shuffle:?}: cluster = embedded"
        );
        let mut args = shuffle.to_vec();
        args.push("--cache");
        let (ok, out, err) = run(Some(&url), &args);
        assert!(ok, "cached on the cluster: {err}");
        assert_eq!(digest_lines(&out), expected, "{shuffle:?}");
        // Epoch 0 filled the entry from the cluster's rows; epochs 1 and 2
        // read it here.
        let plans: Vec<&str> = out.split("epoch ").skip(1).collect();
        assert!(
            plans[0].contains("SharedJobExec") && plans[0].contains("CacheFillExec"),
            "{out}"
        );
        for plan in &plans[1..] {
            assert!(
                plan.contains("CacheScanExec") && !plan.contains("SharedJobExec"),
                "{plan}"
            );
        }
    }
    // Per query: the 3 jobs of the uncached feed, 1 (epoch 0) of the cached.
    let jobs = cluster.rest("/api/jobs");
    assert_eq!(
        jobs.matches("\"job_name\":\"sqlfeed-feed-").count(),
        2 * 4,
        "{jobs}"
    );
    Ok(())
}

/// `--executor-cache-dir`: the first epoch's tasks write the preprocessed
/// rows into the shared folder where they compute them, later epochs' jobs
/// scan them there (no Parquet, no decoding) and are dealt to the ranks;
/// every batch is the uncached one.
#[test]
fn an_executor_cache_is_written_and_read_on_the_executors() -> Result<()> {
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let sql = image_query(dir.path());
    let shared = dir.path().join("shared-cache");
    let cluster = Cluster::start(2);
    let url = cluster.url();
    // Two ranks of one run at once.
    let ranks = |cached: bool, run: &str| -> Vec<(Vec<String>, String)> {
        let threads: Vec<_> = (0..2)
            .map(|rank| {
                let (url, sql, shared, run) =
                    (url.clone(), sql.clone(), shared.clone(), run.to_string());
                std::thread::spawn(move || {
                    let mut command = sqlfeed();
                    command.args(["--cluster", &url, "--target-partitions", "4"]);
                    if cached {
                        command.arg("--executor-cache-dir").arg(&shared);
                    }
                    command
                        .args(["feed", &sql, "--batch-size", "64", "--epochs", "3"])
                        .args(["--shuffle-seed", "42", "--device", "cpu", "--digest"])
                        .args(["--run-id", &run, "--explain-analyze"])
                        .args(["--shard", &format!("{rank}/2")]);
                    if cached {
                        command.arg("--cache");
                    }
                    let (ok, out, err) =
                        run_bounded(&mut command, Duration::from_secs(120));
                    assert!(ok, "rank {rank}: {err}");
                    (digest_lines(&out), out)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect()
    };
    let uncached = ranks(false, "plain");
    let cached = ranks(true, "executor-cache");
    for (rank, ((expected, _), (got, out))) in uncached.iter().zip(&cached).enumerate() {
        // 3000 rows, 2 × 64 per step: 24 batches per epoch and rank.
        assert_eq!(expected.len(), 3 * 24);
        assert_eq!(got, expected, "rank {rank}");
        let epochs: Vec<&str> = out.split("epoch ").skip(1).collect();
        assert!(!epochs[0].contains("dealt=true"), "{}", epochs[0]);
        for epoch in &epochs[1..] {
            // Read from the parts and dealt: each rank fetched its half.
            assert_contains(epoch, &["dealt=true", "fetched_rows=1.50 K"]);
        }
    }
    // One committed entry whose parts hold the epoch's rows.
    let entries: Vec<_> = std::fs::read_dir(&shared)?.flatten().collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = entries[0].path();
    let job = std::fs::read_to_string(entry.join("COMMITTED"))?;
    let parts: Vec<_> = std::fs::read_dir(entry.join(job.trim()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert!(parts.len() >= 2, "{parts:?}");
    let rows: u64 = parts
        .iter()
        .filter_map(|p| {
            p.trim_end_matches(".arrow")
                .rsplit('-')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(rows, 3000, "{parts:?}");
    // Epoch 0's job wrote the parts, epochs 1 and 2 scanned them: no
    // Parquet, no image decoding.
    let jobs: serde_json::Value =
        serde_json::from_str(&cluster.rest("/api/jobs")).expect("jobs as JSON");
    let mut cached_jobs = vec![];
    for job in jobs.as_array().expect("a list of jobs") {
        let id = job["job_id"].as_str().expect("a job id");
        let plans = cluster.rest(&format!("/api/job/{id}/stages"));
        if plans.contains("SharedEntryWriteExec") {
            cached_jobs.push("write");
        } else if plans.contains("file_type=arrow") {
            assert!(
                !plans.contains("image_decode") && !plans.contains("parquet"),
                "{plans}"
            );
            cached_jobs.push("read");
        }
    }
    cached_jobs.sort_unstable();
    assert_eq!(cached_jobs, vec!["read", "read", "write"]);
    Ok(())
}

/// The bytes of `fetched_bytes=…` in an `--explain-analyze` output.
fn fetched_bytes(explained: &str) -> f64 {
    let text = explained
        .split("fetched_bytes=")
        .nth(1)
        .unwrap_or_else(|| panic!("no fetched_bytes in {explained}"));
    let number: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let unit = text[number.len()..].trim_start().chars().next();
    let scale = match unit {
        Some('K') => 1e3,
        Some('M') => 1e6,
        Some('G') => 1e9,
        _ => 1.0,
    };
    number.parse::<f64>().expect("a number of bytes") * scale
}

/// A tensor feed on a cluster stops the job before `image_to_tensor` and
/// applies it on the rank after the fetch, so the executors write and send
/// uint8 pixels, not 4× as many bytes of float32; the batches are the
/// embedded feed's either way.
#[test]
fn a_cluster_feed_widens_tensors_on_the_client_with_the_embedded_batches() -> Result<()> {
    let dir = generated(1000, 2)?;
    let cluster = Cluster::start(2);
    let sql = format!(
        "SELECT id, image_to_tensor(image_resize(image_decode(image_jpeg), 8, 8), \
         [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]) AS x, label AS y FROM '{}/*.parquet'",
        dir.path().display()
    );
    let feed = |cluster: Option<&str>, settings: &[&str]| {
        let mut command = sqlfeed();
        if let Some(url) = cluster {
            command.args(["--cluster", url]);
        }
        command
            .args(["--target-partitions", "4"])
            .args(settings)
            .args(["feed", &sql, "--shuffle-seed", "42", "--shard", "0/2"])
            .args(["--batch-size", "64", "--epochs", "1", "--device", "cpu"])
            .args(["--digest", "--explain-analyze", "--run-id", "widen-test"]);
        let (ok, out, err) = run_bounded(&mut command, Duration::from_secs(120));
        assert!(ok, "feed {cluster:?} {settings:?} failed: {err}");
        out
    };
    let embedded = digest_lines(&feed(None, &[]));
    // 1000 rows, 2 × 64 per step: 8 batches of this rank.
    assert_eq!(embedded.len(), 8);
    let widened = feed(Some(&cluster.url()), &[]);
    let whole = feed(
        Some(&cluster.url()),
        &["--set", "sqlfeed.widen_on_client=false"],
    );
    assert_eq!(digest_lines(&widened), embedded, "widened on the client");
    assert_eq!(digest_lines(&whole), embedded, "widened on the executors");
    // 8×8×3 pixels: 192 bytes of uint8 against 768 of float32 per row.
    let (narrow, wide) = (fetched_bytes(&widened), fetched_bytes(&whole));
    assert!(
        narrow * 2.5 < wide,
        "fetched {narrow} bytes widened on the client, {wide} on the executors"
    );
    Ok(())
}

/// Shuffle files are uncompressed by default, and the client's
/// `ballista.shuffle.compression.codec` reaches the executors' files.
#[test]
fn the_clients_shuffle_codec_reaches_the_executors() -> Result<()> {
    let dir = generated(1000, 2)?;
    let cluster = Cluster::start(1);
    let sql = format!(
        "SELECT get_field(image_resize(image_decode(image_png), 16, 16), 'pixels') AS x, \
         label AS y FROM '{}/*.parquet'",
        dir.path().display()
    );
    let mut written = vec![];
    for settings in [
        &[][..],
        &["--set", "ballista.shuffle.compression.codec=lz4"],
    ] {
        let before = cluster.work_bytes();
        let mut command = sqlfeed();
        command
            .args(["--cluster", &cluster.url(), "--target-partitions", "2"])
            .args(settings)
            .args(["feed", &sql, "--shuffle-seed", "42", "--epochs", "1"])
            .args(["--batch-size", "64", "--device", "cpu", "--digest"]);
        let (ok, out, err) = run_bounded(&mut command, Duration::from_secs(120));
        assert!(ok, "{settings:?}: {err}");
        assert_eq!(out.lines().filter(|l| l.starts_with("batch ")).count(), 16);
        written.push(cluster.work_bytes() - before);
    }
    // 768 bytes of pixels a row: about 770 KB uncompressed.
    let (plain, lz4) = (written[0], written[1]);
    assert!(plain > 700_000, "{written:?}");
    assert!(lz4 * 10 < plain * 9, "{written:?}");
    Ok(())
}

/// Writes `rows` rows (`id`, `x`) from `id = start`, whose values repeat
/// every `period` rows.
fn write_repeating(path: &Path, start: usize, rows: usize, period: usize) -> Result<()> {
    use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch};
    let ids: Vec<i64> = (0..rows).map(|i| (start + i % period) as i64).collect();
    let xs: Vec<f64> = ids.iter().map(|&id| id as f64 * 0.5).collect();
    let batch = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(ids)) as _),
        ("x", Arc::new(Float64Array::from(xs)) as _),
    ])?;
    write_parquet(path, &batch)
}

/// A feed's job is first planned for unique rows: from the scan straight to
/// the key ranges, one exchange fewer. Where rows repeat, the range tasks
/// fail that job, the ranks run the epoch with the stage that numbers the
/// copies, and the run's later epochs plan that stage at once. The batches
/// are the embedded feed's either way.
#[test]
fn a_feed_job_assumes_unique_rows_and_falls_back_to_the_copy_stage() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_repeating(&dir.path().join("unique/a.parquet"), 0, 700, 700)?;
    write_repeating(&dir.path().join("unique/b.parquet"), 700, 300, 300)?;
    write_repeating(&dir.path().join("repeated/a.parquet"), 0, 700, 400)?;
    write_repeating(&dir.path().join("repeated/b.parquet"), 0, 300, 250)?;
    let cluster = Cluster::start(2);
    let feed_with =
        |cluster: Option<String>, data: &str, rank: usize, settings: &[&str]| {
            let sql = format!(
                "SELECT id, x FROM '{}/*.parquet'",
                dir.path().join(data).display()
            );
            let mut command = sqlfeed();
            if let Some(url) = cluster {
                command.args(["--cluster", &url]);
            }
            command
                .args(["--target-partitions", "4"])
                .args(settings)
                .args(["feed", &sql])
                .args(["--shuffle-seed", "42", "--shard", &format!("{rank}/2")])
                .args(["--batch-size", "50", "--epochs", "2", "--device", "cpu"])
                .args([
                    "--digest",
                    "--run-id",
                    &format!("unique-{data}{settings:?}"),
                ]);
            let (ok, out, err) = run_bounded(&mut command, Duration::from_secs(120));
            assert!(ok, "feed of {data}, rank {rank}: {err}");
            digest_lines(&out)
        };
    let feed = |cluster, data, rank| feed_with(cluster, data, rank, &[]);
    for data in ["unique", "repeated"] {
        // Two ranks at once: rank 1 joins the jobs rank 0 submits.
        std::thread::scope(|scope| {
            let ranks: Vec<_> = (0..2)
                .map(|rank| {
                    let url = cluster.url();
                    scope.spawn(move || feed(Some(url), data, rank))
                })
                .collect();
            for (rank, handle) in ranks.into_iter().enumerate() {
                let got = handle.join().expect("a rank");
                // 1000 rows, 2 × 50 per step: 10 batches per epoch and rank.
                let embedded = feed(None, data, rank);
                assert_eq!(embedded.len(), 20);
                assert_eq!(got, embedded, "{data}, rank {rank}");
            }
        });
    }
    let feed_jobs = || -> Vec<(String, String, String)> {
        let jobs: serde_json::Value =
            serde_json::from_str(&cluster.rest("/api/jobs")).expect("jobs as JSON");
        let jobs = jobs.as_array().expect("a list of jobs");
        let mut all: Vec<(String, String, String)> = jobs
            .iter()
            .filter(|job| {
                job["job_name"]
                    .as_str()
                    .is_some_and(|name| name.starts_with("sqlfeed-feed-"))
            })
            .map(|job| {
                let text = |key: &str| job[key].as_str().unwrap_or_default().to_string();
                (text("job_id"), text("job_name"), text("status"))
            })
            .collect();
        all.sort_by(|a, b| a.1.cmp(&b.1));
        all
    };
    let stage_plans = |id: &str| -> String {
        let stages: serde_json::Value =
            serde_json::from_str(&cluster.rest(&format!("/api/job/{id}/stages")))
                .expect("stages as JSON");
        stages.to_string()
    };
    let all = feed_jobs();
    let failed: Vec<_> = all.iter().filter(|j| j.2 == "Failed").collect();
    let copies: Vec<_> = all.iter().filter(|j| j.1.ends_with("-copies")).collect();
    // The repeated rows' first epoch failed once; both of its epochs ran
    // with the copy stage; the unique rows' two epochs without it.
    assert_eq!(failed.len(), 1, "{all:?}");
    assert_eq!(copies.len(), 2, "{all:?}");
    assert!(copies.iter().all(|j| j.2 == "Completed"), "{all:?}");
    assert_eq!(all.len(), 5, "{all:?}");
    for (id, name, status) in &all {
        if status != "Completed" {
            continue;
        }
        let plans = stage_plans(id);
        let unique = plans.contains("unique_rows=true");
        assert_eq!(unique, !name.ends_with("-copies"), "{name}: {plans}");
        // The copy stage is the PermuteExec that is not ranged.
        let permutes = plans.matches("PermuteExec: key=").count();
        let ranged = plans
            .matches("preserve_partitioning=true, ranged=true")
            .count();
        assert_eq!(
            permutes > ranged,
            name.ends_with("-copies"),
            "{name}: {plans}"
        );
    }
    // Data known to repeat skips the attempt: the copy stage at once.
    let off = ["--set", "sqlfeed.try_unique_rows=false"];
    std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let url = cluster.url();
                scope.spawn(move || feed_with(Some(url), "repeated", rank, &off))
            })
            .collect();
        for (rank, handle) in ranks.into_iter().enumerate() {
            assert_eq!(handle.join().expect("a rank"), feed(None, "repeated", rank));
        }
    });
    let new: Vec<_> = feed_jobs()
        .into_iter()
        .filter(|job| !all.contains(job))
        .collect();
    assert_eq!(new.len(), 2, "{new:?}");
    for (id, name, status) in &new {
        assert_eq!(status, "Completed", "{name}");
        assert!(!stage_plans(id).contains("unique_rows=true"), "{name}");
    }
    Ok(())
}

#[test]
fn a_quarantining_feed_fills_failed_slots_on_the_cluster_as_embedded() -> Result<()> {
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let cluster = Cluster::start(2);
    let url = cluster.url();
    // 31 of the 3,000 images are not images; image_to_tensor widens (it
    // would run on the client, which a quarantining feed does not do).
    let sql = format!(
        "SELECT id, image_to_tensor(image_resize(image_decode(CASE WHEN id % 97 = 5 \
         THEN CAST('garbage' AS BYTEA) ELSE image_png END), 4, 4)) AS px \
         FROM '{}/flat/*.parquet'",
        dir.path().display()
    );
    let table = |path: &Path| {
        embedded(&format!(
            "SELECT epoch, position, function, file, \"row\" FROM '{}' ORDER BY 1, 2",
            path.display()
        ))
    };
    for (order, shuffle) in [
        ("shuffled", &["--shuffle-seed", "42"][..]),
        ("unshuffled", &[]),
    ] {
        let args = |rank: usize, engine: &str| -> Vec<String> {
            let out = dir
                .path()
                .join(format!("q-{order}-{engine}-{rank}.parquet"));
            let mut args: Vec<String> = shuffle.iter().map(|s| s.to_string()).collect();
            args.extend(
                [
                    "--on-error",
                    "quarantine",
                    "--max-quarantined",
                    "100",
                    "--quarantine-out",
                    &out.display().to_string(),
                    "--shard",
                    &format!("{rank}/2"),
                ]
                .map(String::from),
            );
            args
        };
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (url, sql, args) = (url.clone(), sql.clone(), args(rank, "cluster"));
                std::thread::spawn(move || {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    feed_digests_of(Some(&url), &sql, &args)
                })
            })
            .collect();
        for (rank, on_cluster) in ranks.into_iter().enumerate() {
            let on_cluster = on_cluster.join().expect("rank thread");
            let args = args(rank, "embedded");
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let embedded_batches = feed_digests_of(None, &sql, &args);
            // 3,000 rows, 2 × 64 per step: 24 batches per epoch and rank.
            assert_eq!(embedded_batches.len(), 2 * 24, "{order}");
            assert_eq!(on_cluster, embedded_batches, "{order} rank {rank}");
            let path = |engine: &str| {
                dir.path()
                    .join(format!("q-{order}-{engine}-{rank}.parquet"))
            };
            let (cluster_table, embedded_table) =
                (table(&path("cluster")), table(&path("embedded")));
            assert_eq!(cluster_table, embedded_table, "{order} rank {rank}");
            assert_eq!(cluster_table.lines().count(), 1 + 2 * 31, "{cluster_table}");
            assert!(cluster_table.contains("image_decode"), "{cluster_table}");
        }
    }
    Ok(())
}

#[test]
fn a_packing_feed_gives_every_rank_the_embedded_sequences_on_the_cluster() -> Result<()> {
    let dir = tempfile::tempdir()?;
    data(dir.path())?;
    let cluster = Cluster::start(2);
    let url = cluster.url();
    // 3,000 documents of 8 to 64 tokens; 2 ranks of 64 sequences of 200.
    let sql = format!(
        "SELECT tokens FROM '{}/flat/*.parquet'",
        dir.path().display()
    );
    let args = |rank: usize| -> Vec<String> {
        [
            "--shuffle-seed",
            "42",
            "--pack",
            "200",
            "--pack-window",
            "700",
            "--shard",
            &format!("{rank}/2"),
        ]
        .map(String::from)
        .to_vec()
    };
    let ranks = two_ranks_get_the_embedded_batches(&url, &sql, args);
    assert_eq!(ranks[0].len(), ranks[1].len(), "equal step counts");
    Ok(())
}

/// 3,000 images in 4 files of 3 row groups of 250 under `dir`, and a feed's
/// query over them: windows of at least 700 rows hold 3 row groups each, 4
/// windows an epoch.
fn windowed_images(dir: &Path) -> Result<String> {
    let mut options = sqlfeed::datagen::GenOptions::new(3000, dir);
    options.files = 4;
    options.image_size = 8;
    options.row_group_rows = 250;
    sqlfeed::datagen::generate(&options)?;
    Ok(format!(
        "SELECT id, image_to_tensor(image_resize(image_decode(image_png), 4, 4), \
         [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]) AS px, label AS y FROM '{}/*.parquet'",
        dir.display()
    ))
}

/// The arguments of rank `rank` of 2 of the windowed feed over
/// [`windowed_images`].
fn windowed_args(rank: usize) -> Vec<String> {
    [
        "--shuffle-seed",
        "9",
        "--shuffle-window",
        "700",
        "--shard",
        &format!("{rank}/2"),
    ]
    .map(String::from)
    .to_vec()
}

/// Issue 55, item 3: a windowed feed (`--shuffle-window`) on a scheduler and
/// 2 executors runs one job per window, read in turn with the next one
/// running ahead; every rank gets the embedded batches (the executors cut
/// each window's scan from the plan the scheduler sent, byte ranges of
/// whole row groups), and the scheduler saw one job per window and epoch.
#[test]
fn a_windowed_feed_runs_one_job_per_window_with_the_embedded_batches() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = windowed_images(dir.path())?;
    let cluster = Cluster::start(2);
    let url = cluster.url();
    // With the default `sqlfeed.window_jobs_kept` (1): the ranks are not
    // in lockstep here, and one more than a window behind runs that window
    // again (`-retry1`), with the same batches.
    two_ranks_get_the_embedded_batches(&url, &sql, windowed_args);
    // 2 epochs of 4 windows, each window's job shared by both ranks.
    let jobs = cluster.rest("/api/jobs");
    let names: std::collections::BTreeSet<&str> = jobs
        .split("\"job_name\":\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|name| name.starts_with("sqlfeed-feed-"))
        .map(|name| name.split("-retry").next().unwrap_or(name))
        .collect();
    assert_eq!(names.len(), 8, "{names:?}");
    Ok(())
}

/// Issue 55, item 3: a windowed cluster feed removes each window's result
/// from the executors once its rank read `sqlfeed.window_jobs_kept` more
/// windows, so that their disks hold a few windows, not the epoch; a rank
/// that comes after the results were removed runs those windows' jobs again
/// and still gets the embedded batches.
#[test]
fn a_windowed_cluster_feed_removes_read_windows_and_a_late_rank_runs_them_again()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = windowed_images(dir.path())?;
    let cluster = Cluster::start(2);
    let url = cluster.url();
    let kept = ["sqlfeed.window_jobs_kept=1"];
    let digests = |cluster: Option<&str>, rank: usize| {
        let args = windowed_args(rank);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        feed_digests_with(cluster, &kept, &sql, &args)
    };
    // Rank 0 alone reads the 8 windows of 2 epochs, and leaves the last
    // one's result on the executors.
    assert_eq!(digests(Some(&url), 0), digests(None, 0));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut folders = cluster.job_folders();
    while folders.len() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        folders = cluster.job_folders();
    }
    assert_eq!(
        folders.len(),
        1,
        "jobs with results on the executors: {folders:?}"
    );
    // Rank 1 finds 7 results gone: it runs those windows again.
    assert_eq!(digests(Some(&url), 1), digests(None, 1));
    let jobs = cluster.rest("/api/jobs");
    let again = jobs.matches("-retry1\"").count();
    assert_eq!(again, 7, "{jobs}");
    Ok(())
}

/// 12,000 images of 32² under `dir` in 6 windows of 2,000 (8 row groups
/// of 250), and a feed's query over them: each window's job decodes and
/// resizes for a while in a debug build.
fn slow_windows(dir: &Path) -> Result<String> {
    let mut options = sqlfeed::datagen::GenOptions::new(12_000, dir);
    options.files = 6;
    options.image_size = 32;
    options.row_group_rows = 250;
    sqlfeed::datagen::generate(&options)?;
    Ok(format!(
        "SELECT id, image_to_tensor(image_resize(image_decode(image_png), 16, 16), \
         [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]) AS px, label AS y FROM '{}/*.parquet'",
        dir.display()
    ))
}

/// `sqlfeed feed` of [`slow_windows`]' `sql` in windows of 2,000 rows and
/// batches of 500 (24 in the epoch), with digests, on `cluster` if given.
fn slow_windows_feed(
    cluster: Option<&str>,
    sql: &str,
    run_id: &str,
) -> std::process::Command {
    let mut command = sqlfeed();
    if let Some(url) = cluster {
        command.args(["--cluster", url]);
    }
    command
        .args(["--target-partitions", "4", "feed", sql])
        .args(["--shuffle-seed", "5", "--shuffle-window", "2000"])
        .args(["--batch-size", "500", "--device", "cpu"])
        .args(["--digest", "--run-id", run_id]);
    command
}

/// Issue 55, "done when": a windowed cluster feed hands out its first batch
/// while its later windows wait: when the first digest line is out, the
/// scheduler has not seen every window's job (the window read and the one
/// running ahead; the next ones start as those are read); the others come
/// later.
#[test]
fn a_windowed_cluster_feed_hands_out_its_first_batch_before_later_windows_run()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = slow_windows(dir.path())?;
    let cluster = Cluster::start(2);
    let window_jobs = || {
        cluster
            .rest("/api/jobs")
            .matches("\"job_name\":\"sqlfeed-feed-")
            .count()
    };
    let mut child = slow_windows_feed(Some(&cluster.url()), &sql, "first-batch-test")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let mut out = vec![];
    for line in lines.by_ref() {
        let line = line?;
        let batch = line.starts_with("batch ");
        out.push(line);
        if batch {
            break;
        }
    }
    let at_first_batch = window_jobs();
    out.extend(lines.collect::<std::io::Result<Vec<_>>>()?);
    assert!(child.wait()?.success());
    assert_eq!(digest_lines(&out.join("\n")).len(), 24);
    // The window read, the one running ahead, and perhaps one or two more
    // under load; never all of them.
    assert!(
        (1..6).contains(&at_first_batch),
        "{at_first_batch} window jobs at the first batch"
    );
    assert_eq!(window_jobs(), 6, "one job per window");
    Ok(())
}

/// Issue 55, "done when": an executor killed (`kill -9`) mid-epoch while a
/// windowed cluster feed reads a window and the next one starts: the feed
/// delivers exactly the batches of an uninterrupted run, the later windows
/// computed on the executor left.
#[test]
fn a_windowed_cluster_feed_survives_an_executor_killed_mid_window() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let sql = slow_windows(dir.path())?;
    let feed = move |cluster: Option<&str>| {
        let mut command = slow_windows_feed(cluster, &sql, "window-kill-test");
        let (ok, out, err) = run_bounded(&mut command, Duration::from_secs(240));
        (ok, digest_lines(&out), err)
    };
    let (ok, expected, err) = feed(None);
    assert!(ok && expected.len() == 24, "embedded: {err}");

    let mut cluster = Cluster::start_with(
        2,
        &["--concurrent-tasks", "1"],
        &["--executor-timeout", "8"],
    );
    let url = cluster.url();
    let run = std::thread::spawn(move || feed(Some(&url)));
    // Killed as the third window's job is submitted, while the second
    // window is read: what the killed executor held (results, tasks) is
    // lost. Ballista gives its tasks to the executor left, or the feed runs
    // the window's job again (`-retry1`), depending on when the scheduler
    // notices; either way the batches are the uninterrupted ones, and the
    // later windows run on one executor.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let jobs = cluster.rest("/api/jobs");
        let windows = jobs.matches("\"job_name\":\"sqlfeed-feed-").count();
        if windows >= 3 {
            assert!(windows < 6, "the feed ran ahead of the test: {jobs}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the third window never ran: {jobs}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!run.is_finished(), "the feed ended before the kill");
    cluster.kill_executor(1);
    let killed_at = Instant::now();
    let (ok, got, err) = run.join().expect("the feed thread ends");
    assert!(ok, "the feed failed: {err}");
    assert_eq!(got, expected, "the same batches as uninterrupted");
    assert!(
        killed_at.elapsed() < Duration::from_secs(120),
        "{:?}",
        killed_at.elapsed()
    );
    Ok(())
}
