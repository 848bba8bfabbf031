//! Bounded fuzzing on stable Rust (issue 18, item 5): seeded mutations of the
//! committed corpus in `tests/fuzz/corpus/` through four targets — the SQL
//! dialect parser, `image_decode`, `tokenize` and Parquet reading through a
//! session — each of which must answer every input with a value or an error:
//! never a panic (also not one the engine catches and turns into an error),
//! never a hang.
//!
//! - `cargo test --test fuzz` (part of the test command): a fixed number of
//!   mutations per target from fixed seeds, so CI is deterministic, plus a
//!   replay of every saved finding in `tests/fuzz/regressions/<target>/`.
//! - `scripts/fuzz.sh [SECONDS]`: each target for SECONDS with a fresh seed
//!   (`SQLFEED_FUZZ_SECONDS`, `SQLFEED_FUZZ_SEED`). An input that panics or
//!   hangs is written to `tests/fuzz/regressions/<target>/` (commit it: it
//!   is replayed by every later run) and fails the run.
//!
//! The mutator is a small structure-blind one (bit flips, byte sets,
//! truncation, range deletion, duplication and insertion, splices with
//! another corpus entry, and dialect keywords for SQL) in the spirit of
//! libFuzzer's; cargo-fuzz needs a nightly toolchain and sanitizer builds of
//! all of DataFusion, which a 2-core CI cannot afford.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use sqlfeed_udfs::image::{Completeness, decode_image_with};

/// Mutations per target in the deterministic (CI) run.
const CI_ITERATIONS: u64 = 150;
/// An input that takes longer than this is a hang.
const HANG: Duration = Duration::from_secs(20);

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz")
}

/// The corpus files of `kind`, sorted; SQL files give one entry per line.
fn corpus(kind: &str) -> Vec<Vec<u8>> {
    let dir = fuzz_dir().join("corpus").join(kind);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    let mut entries = Vec::new();
    for path in paths {
        let bytes =
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if kind == "sql" {
            entries.extend(
                String::from_utf8_lossy(&bytes)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| l.as_bytes().to_vec()),
            );
        } else {
            entries.push(bytes);
        }
    }
    assert!(!entries.is_empty(), "empty corpus {}", dir.display());
    entries
}

/// Saved findings of `target`, replayed by every run.
fn regressions(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_dir().join("regressions").join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, Vec<u8>)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| std::fs::read(&p).ok().map(|bytes| (p, bytes)))
        .collect();
    found.sort();
    found
}

/// splitmix64: small, seedable, good enough to drive mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const SQL_WORDS: &[&str] = &[
    " SHUFFLE ",
    " SEED ",
    " EPOCH ",
    " LOCAL ",
    " BUFFER ",
    " SAMPLE ",
    " SUMMARIZE ",
    " CACHE TABLE ",
    " UNCACHE ",
    " VERIFY ",
    " DECODE ",
    " DESCRIBE ",
    " EXPLAIN ",
    "(",
    ")",
    "'",
    ";",
    ",",
    " 18446744073709551616 ",
    " -1 ",
    " 0 ",
    " AS ",
    " FROM ",
    " IF EXISTS ",
];

/// One mutation of `input` (1–4 edits), possibly splicing from `corpus`.
fn mutate(input: &[u8], corpus: &[Vec<u8>], rng: &mut Rng, sql: bool) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = out.len();
        match rng.below(if sql { 9 } else { 8 }) {
            0 if len > 0 => {
                let at = rng.below(len);
                out[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                out[at] = rng.next() as u8;
            }
            2 => out.truncate(rng.below(len + 1)),
            3 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(16)).min(len);
                out.drain(start..end);
            }
            4 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(32)).min(len);
                let copy = out[start..end].to_vec();
                let at = rng.below(len + 1);
                out.splice(at..at, copy);
            }
            5 => {
                let at = rng.below(len + 1);
                let bytes: Vec<u8> =
                    (0..1 + rng.below(8)).map(|_| rng.next() as u8).collect();
                out.splice(at..at, bytes);
            }
            6 => {
                let other = &corpus[rng.below(corpus.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let to = (from + 1 + rng.below(64)).min(other.len());
                    let at = rng.below(len + 1);
                    out.splice(at..at, other[from..to].iter().copied());
                }
            }
            7 if len > 0 => {
                // Interesting values: 0x00, 0xFF runs (lengths, offsets).
                let at = rng.below(len);
                let end = (at + 1 + rng.below(8)).min(len);
                let value = if rng.below(2) == 0 { 0 } else { 0xFF };
                out[at..end].fill(value);
            }
            _ if sql => {
                let word = SQL_WORDS[rng.below(SQL_WORDS.len())].as_bytes();
                let at = rng.below(len + 1);
                out.splice(at..at, word.iter().copied());
            }
            _ => {}
        }
    }
    out
}

/// How long and with which seed the mutation loop runs.
struct Budget {
    seed: u64,
    iterations: Option<u64>,
    deadline: Option<Instant>,
}

impl Budget {
    fn from_env(target_seed: u64) -> Self {
        let seconds = std::env::var("SQLFEED_FUZZ_SECONDS")
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        let seed = std::env::var("SQLFEED_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
            ^ target_seed;
        match seconds {
            Some(s) => Self {
                seed,
                iterations: None,
                deadline: Some(Instant::now() + Duration::from_secs(s)),
            },
            None => Self {
                seed,
                iterations: Some(CI_ITERATIONS),
                deadline: None,
            },
        }
    }

    fn more(&self, done: u64) -> bool {
        self.iterations.is_none_or(|n| done < n)
            && self.deadline.is_none_or(|d| Instant::now() < d)
    }
}

/// Saves a finding and fails with what it was.
fn finding(target: &str, input: &[u8], what: &str) -> ! {
    let dir = fuzz_dir().join("regressions").join(target);
    let name = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(input));
    let saved = std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::write(dir.join(&name), input))
        .map(|_| dir.join(&name).display().to_string())
        .unwrap_or_else(|e| format!("(not saved: {e})"));
    panic!("fuzz target {target}: {what}; the input is saved as {saved}");
}

/// Runs `case` on `input` in a thread: a panic or a hang is a finding.
fn run_sync(target: &str, input: Vec<u8>, case: fn(&[u8])) {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let moved = input.clone();
    let worker = std::thread::spawn(move || {
        let outcome = std::panic::catch_unwind(|| case(&moved));
        let _ = done_tx.send(());
        outcome
    });
    match done_rx.recv_timeout(HANG) {
        Ok(()) => {
            if let Ok(Err(panic)) = worker.join() {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                finding(target, &input, &format!("panicked: {message}"));
            }
        }
        Err(_) => finding(target, &input, &format!("no answer within {HANG:?}")),
    }
}

/// The mutation loop of a synchronous target.
fn fuzz_sync(target: &str, kind: &str, target_seed: u64, case: fn(&[u8])) {
    for (path, input) in regressions(target) {
        eprintln!("replaying {}", path.display());
        run_sync(target, input, case);
    }
    let seeds = corpus(kind);
    for seed in &seeds {
        run_sync(target, seed.clone(), case);
    }
    let budget = Budget::from_env(target_seed);
    let mut rng = Rng(budget.seed);
    let mut done = 0;
    while budget.more(done) {
        let base = &seeds[rng.below(seeds.len())];
        let input = mutate(base, &seeds, &mut rng, kind == "sql");
        run_sync(target, input, case);
        done += 1;
    }
    eprintln!(
        "{target}: {done} mutations (seed {}), no finding",
        budget.seed
    );
}

#[test]
fn dialect_parser() {
    fuzz_sync("dialect_parser", "sql", 0x5EED_0001, |input| {
        let text = String::from_utf8_lossy(input);
        let _ = sqlfeed::sql::parse(&text);
    });
}

#[test]
fn image_decode() {
    fuzz_sync("image_decode", "images", 0x5EED_0002, |input| {
        for completeness in [Completeness::Required, Completeness::AllowPartial] {
            let _ = decode_image_with(input, 1 << 20, completeness);
        }
    });
}

/// Runs a query per input; an error is an answer, unless it is a panic the
/// engine caught (its text says so).
fn fuzz_queries(
    target: &str,
    kind: &str,
    target_seed: u64,
    query: impl Fn(&sqlfeed::Session, &Path, &[u8]) -> datafusion::error::Result<String>,
) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let scratch = tempfile::tempdir().expect("scratch dir");
    let session = sqlfeed::Session::builder()
        .target_partitions(2)
        .memory_limit(256 << 20)
        .build()
        .expect("session");
    let check = |input: &[u8]| {
        let sql = match query(&session, scratch.path(), input) {
            Ok(sql) => sql,
            Err(e) => finding(target, input, &format!("could not stage the input: {e}")),
        };
        let outcome = runtime.block_on(async {
            tokio::time::timeout(HANG, async {
                let df = session.sql(&sql).await?;
                session.collect(df).await
            })
            .await
        });
        match outcome {
            Err(_) => finding(target, input, &format!("no answer within {HANG:?}")),
            // A panic of the Parquet reader caught where the file is known
            // (footer or pages) is an answer: an error naming the damaged
            // file. Any other panic, even one the engine turned into an
            // error, is a finding.
            Ok(Err(e))
                if e.to_string().contains("panicked")
                    && !(e.to_string().contains("the Parquet reader panicked")
                        && e.to_string()
                            .contains(&*scratch.path().to_string_lossy())) =>
            {
                finding(target, input, &format!("a caught panic: {e}"))
            }
            Ok(_) => {}
        }
    };
    for (path, input) in regressions(target) {
        eprintln!("replaying {}", path.display());
        check(&input);
    }
    let seeds = corpus(kind);
    for seed in &seeds {
        check(seed);
    }
    let budget = Budget::from_env(target_seed);
    let mut rng = Rng(budget.seed);
    let mut done = 0;
    while budget.more(done) {
        let base = &seeds[rng.below(seeds.len())];
        check(&mutate(base, &seeds, &mut rng, false));
        done += 1;
    }
    eprintln!(
        "{target}: {done} mutations (seed {}), no finding",
        budget.seed
    );
}

#[test]
fn parquet_read() {
    fuzz_queries("parquet_read", "parquet", 0x5EED_0003, |_, dir, input| {
        let path = dir.join("input.parquet");
        std::fs::write(&path, input)?;
        Ok(format!("SELECT * FROM '{}'", path.display()))
    });
}

/// The published all-MiniLM-L6-v2 tokenizer of the UDF crate's tests.
const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json"
);

#[test]
fn tokenize() {
    fuzz_queries("tokenize", "text", 0x5EED_0004, |session, _, input| {
        // Any bytes, as the text a column could hold (invalid UTF-8 is
        // replaced: a Utf8 column cannot hold it).
        let text = String::from_utf8_lossy(input).into_owned();
        let schema = Arc::new(Schema::new(vec![Field::new("t", DataType::Utf8, true)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(StringArray::from(vec![Some(text)]))],
        )?;
        let table = MemTable::try_new(schema, vec![vec![batch]])?;
        session.context().deregister_table("fuzz_text")?;
        session
            .context()
            .register_table("fuzz_text", Arc::new(table))?;
        Ok(format!(
            "SELECT tokenize(t, '{TOKENIZER}', 16), tokenize_pair(t, t, '{TOKENIZER}', 24) \
             FROM fuzz_text"
        ))
    });
}
