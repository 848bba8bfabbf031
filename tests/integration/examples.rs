//! Every example of `examples/` runs on small generated data and prints what
//! it promises; every `examples/sql/*.sql` runs through `sqlfeed -f`.

use std::path::{Path, PathBuf};
use std::process::Command;

use datafusion::error::Result;

use crate::common::{assert_contains, gen_data, run, sqlfeed};

/// The example binary `name`, built by `cargo test` next to the test binaries.
fn example(name: &str) -> Command {
    let deps = std::env::current_exe().expect("test binary path");
    let debug = deps
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    Command::new(debug.join("examples").join(name))
}

/// 2,000 generated rows; returns the glob the examples take as `--data`.
fn data(dir: &Path) -> Result<String> {
    gen_data(&dir.join("data"), 2000, 2)?;
    Ok(format!("{}/data/*.parquet", dir.display()))
}

fn run_example(name: &str, args: &[&str]) -> String {
    let (ok, out, err) = run(example(name).args(args));
    assert!(ok, "example {name} failed: {err}");
    out
}

/// Scenario 5: 4 rank processes, embedded and on an in-process cluster.
#[cfg(feature = "ballista")]
fn distributed_shards(data: &str) {
    // 2000 rows, 4 ranks × 64 rows per step, drop_last: 7 batches each.
    let embedded = run_example("distributed_shards", &["--data", data]);
    assert_contains(&embedded, &["4 ranks on the embedded engine"]);
    for rank in 0..4 {
        assert!(
            embedded.contains(&format!("rank {rank}: 7 batches of 64")),
            "{embedded}"
        );
    }
    assert_contains(
        &embedded,
        &["1792 rows over 4 ranks, 1792 distinct: shards are disjoint"],
    );
    let clustered =
        run_example("distributed_shards", &["--data", data, "--local-cluster"]);
    assert_contains(&clustered, &["4 ranks on df://127.0.0.1:"]);
    // The cluster serves each rank exactly its embedded shard.
    let rank_lines = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with("rank "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(rank_lines(&clustered), rank_lines(&embedded));
    assert!(clustered.contains("shards are disjoint"), "{clustered}");
}

#[test]
fn examples_run_and_report_what_they_promise() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = data(dir.path())?;

    let out = run_example("lazy_read", &["--data", &data]);
    assert_contains(
        &out,
        &[
            "| tokens      | List(Int32) |",
            "first row: 1 row(s), 15 columns",
            "| 2000 |",
            "bytes read:",
        ],
    );

    let out = run_example("preprocess", &["--data", &data, "--partitions", "2"]);
    assert_contains(&out, &["preprocessed 2000 rows", "on 2 partitions"]);

    let out = run_example("prefetch_feed", &["--data", &data, "--step-ms", "1"]);
    assert_contains(&out, &["first batch: image Float32 [256, 3, 8, 8]"]);
    assert_contains(&out, &["7 steps of 1.0 ms", "the loop waited"]);

    #[cfg(feature = "ballista")]
    distributed_shards(&data);

    let out = run_example("global_shuffle", &["--data", &data, "--memory-limit", "1M"]);
    let firsts: Vec<&str> = out.lines().filter(|l| l.starts_with("first ids")).collect();
    assert_eq!(firsts.len(), 3, "{out}");
    let ids = |line: &str| {
        line.split(':')
            .nth(1)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert!(ids(firsts[1]).starts_with(&ids(firsts[0])), "{out}");
    assert_ne!(ids(firsts[0]), ids(firsts[2]), "{out}");
    assert!(
        out.contains("spill_count=") && !out.contains("spill_count=0"),
        "{out}"
    );
    assert!(out.contains("spill files left after the query: 0"), "{out}");

    let out = run_example("text_tokens", &["--data", &data, "--tokens", "2048"]);
    assert_contains(&out, &["2000 rows in", "batches of at most 2048 tokens"]);

    let cache = dir.path().join("cache");
    let cache = cache.display().to_string();
    let args = [
        "--data",
        data.as_str(),
        "--epochs",
        "2",
        "--cache-dir",
        cache.as_str(),
    ];
    let out = run_example("epoch_cache", &args);
    assert_contains(&out, &["epoch 0:", "epoch 1:"]);
    assert!(out.contains("cache entry"), "{out}");
    let again = run_example("epoch_cache", &args);
    let entry = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("cache entry"))
            .map(str::to_string)
    };
    assert_eq!(
        entry(&again),
        entry(&out),
        "the second run reuses the entry"
    );
    Ok(())
}

#[test]
fn sql_examples_run_in_the_cli() -> Result<()> {
    let dir = tempfile::tempdir()?;
    gen_data(&dir.path().join("data"), 2000, 2)?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("examples/sql"))?
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    for file in files {
        // Paths inside the scripts are relative to the repository root.
        let script = std::fs::read_to_string(&file)?
            .replace("'udfs/", &format!("'{}/udfs/", root.display()));
        let local = dir.path().join("script.sql");
        std::fs::write(&local, script)?;
        let (ok, out, err) = run(sqlfeed()
            .current_dir(dir.path())
            .args(["--memory-limit", "64M", "--max-rows", "5", "--cache-dir"])
            .arg(dir.path().join("cache"))
            .arg("-f")
            .arg(&local));
        assert!(ok, "{}: {err}", file.display());
        assert!(out.contains("row"), "{}: {out}", file.display());
    }
    Ok(())
}
