//! The epoch cache: CACHE TABLE / UNCACHE TABLE / CLEAR CACHE, reuse across
//! sessions and processes, invalidation, damage, the LRU limit, and cached
//! feeds.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray, UInt64Array};
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::device::Device;
use sqlfeed::feed::Feed;
use tempfile::TempDir;

use crate::common::{
    arc, assert_contains, collect, gen_data, rows, run, sqlfeed, succeeded, write_parquet,
};

/// A temporary folder with `rows` generated rows in `files` Parquet files
/// under `data/`, and the path `cache/` for an epoch cache; both go when
/// the folder is dropped.
fn scratch(rows: u64, files: usize) -> Result<(TempDir, PathBuf, PathBuf)> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    gen_data(&data, rows, files)?;
    let cache = dir.path().join("cache");
    Ok((dir, data, cache))
}

fn session(cache_dir: &Path) -> Result<Session> {
    Session::builder()
        .memory_limit(256 << 20)
        .target_partitions(2)
        .cache_dir(cache_dir)
        .build()
}

/// The one-row result of a CACHE TABLE statement, by column name.
struct Cached {
    rows: u64,
    source: String,
    key: String,
    memory_bytes: u64,
}

async fn cache_table(session: &Session, sql: &str) -> Result<Cached> {
    let batches = collect(session, sql).await?;
    let batch = &batches[0];
    let text = |name: &str| {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .map(|a| a.value(0).to_string())
            .unwrap_or_default()
    };
    let number = |name: &str| {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
            .map_or(u64::MAX, |a| a.value(0))
    };
    Ok(Cached {
        rows: number("rows"),
        source: text("source"),
        key: text("key"),
        memory_bytes: number("memory_bytes"),
    })
}

fn entry_dirs(cache_dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(cache_dir.join("entries"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs
}

const QUERY: &str = "SELECT id, f0 * 2 AS g, label FROM '{data}' WHERE id % 3 <> 0";

fn query(data: &Path) -> String {
    QUERY.replace("{data}", &format!("{}/*.parquet", data.display()))
}

#[tokio::test]
async fn cached_results_equal_the_query_and_are_reused_by_later_sessions() -> Result<()> {
    let (_dir, data, cache) = scratch(3000, 3)?;
    let query = query(&data);

    let first = session(&cache)?;
    let cached = cache_table(&first, &format!("CACHE TABLE t AS {query}")).await?;
    assert_eq!(cached.rows, 2000);
    assert_eq!(cached.source, "computed");
    assert!(cached.memory_bytes > 0, "a small result stays in memory");
    let expected =
        rows(&collect(&first, &format!("SELECT * FROM ({query}) ORDER BY id")).await?);
    let from_cache = rows(&collect(&first, "SELECT * FROM t ORDER BY id").await?);
    assert_eq!(from_cache, expected);
    // The plan reads the cache, not the Parquet files.
    let plan =
        rows(&collect(&first, "EXPLAIN SELECT sum(g) FROM t WHERE label = 1").await?);
    let plan = format!("{plan:?}");
    assert!(
        plan.contains("CacheScanExec") && !plan.contains("parquet"),
        "{plan}"
    );
    assert_eq!(entry_dirs(&cache).len(), 1);

    // Another session (as another run would) finds the entry on disk.
    let second = session(&cache)?;
    let reused = cache_table(&second, &format!("CACHE TABLE again AS {query}")).await?;
    assert_eq!(reused.source, "reused from disk");
    assert_eq!(reused.key, cached.key);
    let from_disk = rows(&collect(&second, "SELECT * FROM again ORDER BY id").await?);
    assert_eq!(from_disk, expected);

    // UNCACHE drops the table, not the entry; IF EXISTS tolerates absence.
    collect(&second, "UNCACHE TABLE again").await?;
    assert!(collect(&second, "SELECT * FROM again").await.is_err());
    let err = collect(&second, "UNCACHE TABLE again")
        .await
        .expect_err("gone");
    assert!(err.to_string().contains("no cached table 'again'"), "{err}");
    collect(&second, "UNCACHE TABLE IF EXISTS again").await?;
    assert_eq!(entry_dirs(&cache).len(), 1);
    // A table that is not cached is refused by both statements.
    collect(&second, "CREATE TABLE plain AS SELECT 1 AS x").await?;
    let err = collect(&second, "UNCACHE TABLE plain")
        .await
        .expect_err("not cached");
    assert!(
        err.to_string().contains("'plain' is not a cached table"),
        "{err}"
    );
    let err = collect(&second, "CACHE TABLE plain AS SELECT 2")
        .await
        .expect_err("name taken");
    assert!(err.to_string().contains("already exists"), "{err}");

    // CLEAR CACHE empties the directory; the first session's open table
    // keeps reading its (unlinked) files.
    collect(&second, "CLEAR CACHE").await?;
    assert!(entry_dirs(&cache).is_empty());
    let still = rows(&collect(&first, "SELECT * FROM t ORDER BY id").await?);
    assert_eq!(still, expected);
    Ok(())
}

#[tokio::test]
async fn a_changed_input_file_or_query_is_a_miss() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let cache = dir.path().join("cache");
    let files = gen_data(&data, 3000, 3)?;
    let query = query(&data);
    let session = session(&cache)?;
    let original = cache_table(&session, &format!("CACHE TABLE t AS {query}")).await?;

    // The same query over a rewritten file: a new key and the new data,
    // in the same session too.
    let ids = Int64Array::from_iter_values(10_000..10_010);
    let f0 = datafusion::arrow::array::Float32Array::from_iter_values(
        (0..10).map(|i| i as f32),
    );
    let label = datafusion::arrow::array::Int32Array::from_iter_values(0..10);
    let batch = RecordBatch::try_from_iter(vec![
        ("id", arc(ids)),
        ("f0", arc(f0)),
        ("label", arc(label)),
    ])?;
    write_parquet(&files[0], &batch)?;
    let changed = cache_table(&session, &format!("CACHE TABLE t AS {query}")).await?;
    assert_eq!(changed.source, "computed");
    assert_ne!(changed.key, original.key);
    let expected =
        rows(&collect(&session, &format!("SELECT count(*) FROM ({query})")).await?);
    assert_eq!(
        rows(&collect(&session, "SELECT count(*) FROM t").await?),
        expected
    );
    assert_eq!(changed.rows.to_string(), expected[0][0]);

    // A different query over the same files: a new key too.
    let other = cache_table(
        &session,
        &format!("CACHE TABLE u AS {}", query.replace("<> 0", "= 0")),
    )
    .await?;
    assert_eq!(other.source, "computed");
    assert_ne!(other.key, changed.key);
    Ok(())
}

#[tokio::test]
async fn damaged_or_missing_cache_files_are_recomputed_never_served() -> Result<()> {
    let (_dir, data, cache) = scratch(3000, 3)?;
    let query = query(&data);
    let expected = {
        let session = session(&cache)?;
        cache_table(&session, &format!("CACHE TABLE t AS {query}")).await?;
        rows(&collect(&session, "SELECT * FROM t ORDER BY id").await?)
    };
    let entry = entry_dirs(&cache).remove(0);

    // One flipped byte in a part file.
    let part = entry.join("part-00000.arrow");
    let mut bytes = std::fs::read(&part)?;
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&part, bytes)?;
    let session_b = session(&cache)?;
    let again = cache_table(&session_b, &format!("CACHE TABLE t AS {query}")).await?;
    assert_eq!(again.source, "computed", "a damaged entry is not reused");
    assert_eq!(
        rows(&collect(&session_b, "SELECT * FROM t ORDER BY id").await?),
        expected
    );

    // A missing part file, then a missing manifest.
    for victim in ["part-00001.arrow", "manifest.json"] {
        std::fs::remove_file(entry_dirs(&cache)[0].join(victim))?;
        let session_c = session(&cache)?;
        let again = cache_table(&session_c, &format!("CACHE TABLE t AS {query}")).await?;
        assert_eq!(again.source, "computed", "after removing {victim}");
        assert_eq!(
            rows(&collect(&session_c, "SELECT * FROM t ORDER BY id").await?),
            expected
        );
    }

    // Through the binary: the recomputation is announced on stderr.
    let part = entry_dirs(&cache)[0].join("part-00000.arrow");
    let mut bytes = std::fs::read(&part)?;
    let at = bytes.len() / 3;
    bytes[at] ^= 0x80;
    std::fs::write(&part, bytes)?;
    let (ok, out, err) = run(sqlfeed().args([
        "--cache-dir",
        &cache.display().to_string(),
        "--target-partitions",
        "2",
        "--format",
        "csv",
        "-c",
        &format!("CACHE TABLE t AS {query}; SELECT count(*) AS n FROM t"),
    ]));
    assert!(ok, "{err}");
    assert!(out.ends_with("n\n2000\n"), "{out}");
    assert_contains(&err, &["is damaged and is recomputed", "part-00000.arrow"]);
    Ok(())
}

#[tokio::test]
async fn tables_in_memory_and_volatile_queries_are_cached_for_the_session_only()
-> Result<()> {
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("cache");
    let session = session(&cache)?;
    let batch = RecordBatch::try_from_iter(vec![(
        "x",
        arc(Int64Array::from_iter_values(0..100)),
    )])?;
    session.context().register_table(
        "mem",
        Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?),
    )?;
    let cached =
        cache_table(&session, "CACHE TABLE m AS SELECT x * 2 AS y FROM mem").await?;
    assert!(cached.key.starts_with('s'), "{}", cached.key);
    let random = cache_table(&session, "CACHE TABLE r AS SELECT random() AS v").await?;
    assert!(random.key.starts_with('s'), "{}", random.key);
    assert!(
        entry_dirs(&cache).is_empty(),
        "nothing shared with other runs"
    );
    let entries = session.cache().entries();
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| !e.persistent));
    // The random value is frozen for the session.
    let first = rows(&collect(&session, "SELECT v FROM r").await?);
    assert_eq!(rows(&collect(&session, "SELECT v FROM r").await?), first);
    // Uncaching removes a session-only entry's files.
    collect(&session, "UNCACHE TABLE m").await?;
    collect(&session, "UNCACHE TABLE r").await?;
    assert!(session.cache().entries().is_empty());
    Ok(())
}

#[tokio::test]
async fn the_size_limit_removes_the_least_recently_used_entries() -> Result<()> {
    let (dir, data, cache) = scratch(3000, 3)?;
    let files = format!("{}/*.parquet", data.display());
    let entry_bytes = {
        let probe = session(&dir.path().join("probe"))?;
        cache_table(
            &probe,
            &format!("CACHE TABLE p AS SELECT * FROM '{files}' WHERE id < 1000"),
        )
        .await?;
        probe.cache().entries()[0].disk_bytes
    };
    // Room for two entries of about that size, not three.
    let session = Session::builder()
        .target_partitions(2)
        .cache_dir(&cache)
        .cache_max_bytes(entry_bytes * 5 / 2)
        .build()?;
    let mut keys = vec![];
    for bound in [1000, 1001, 1002] {
        let cached = cache_table(
            &session,
            &format!(
                "CACHE TABLE t{bound} AS SELECT * FROM '{files}' WHERE id < {bound}"
            ),
        )
        .await?;
        keys.push(cached.key);
        // Distinct modification times for the LRU order.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left: Vec<String> = entry_dirs(&cache)
        .iter()
        .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let mut expected = vec![keys[1].clone(), keys[2].clone()];
    expected.sort();
    assert_eq!(left, expected, "the oldest entry went");
    // The evicted table's open handle still reads.
    assert_eq!(
        rows(&collect(&session, "SELECT count(*) FROM t1000").await?),
        vec![vec!["1000".to_string()]]
    );
    Ok(())
}

#[test]
fn concurrent_processes_fill_one_entry_without_corrupting_it() -> Result<()> {
    let (_dir, data, cache) = scratch(20_000, 4)?;
    let sql = format!(
        "CACHE TABLE t AS {}; SELECT count(*) AS n, sum(id) AS s FROM t",
        query(&data)
    );
    let spawn = || {
        sqlfeed()
            .args([
                "--cache-dir",
                &cache.display().to_string(),
                "--format",
                "csv",
                "-c",
                &sql,
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sqlfeed starts")
    };
    let children: Vec<_> = (0..3).map(|_| spawn()).collect();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("sqlfeed ends"))
        .collect();
    let mut results = vec![];
    for output in &outputs {
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        results.push(stdout.lines().last().unwrap_or_default().to_string());
    }
    assert!(results.iter().all(|r| r == &results[0]), "{results:?}");
    assert_eq!(entry_dirs(&cache).len(), 1);
    assert!(
        std::fs::read_dir(cache.join("tmp"))?.next().is_none(),
        "no temporary folders left"
    );
    // The entry left behind is whole: the next process reuses it.
    let out = succeeded(run(sqlfeed().args([
        "--cache-dir",
        &cache.display().to_string(),
        "--format",
        "csv",
        "-c",
        &sql.replace("; SELECT count(*) AS n, sum(id) AS s FROM t", ""),
    ])));
    assert!(out.contains("reused from disk"), "{out}");
    Ok(())
}

/// A pid no process can have here (Linux pids stay below 2^22): what a
/// process in another container, another pid namespace, looks like.
const FOREIGN_PID: u32 = 999_999_999;

/// A folder `<parent>/<name>` holding one file.
fn folder_with_file(parent: &Path, name: &str) -> std::io::Result<PathBuf> {
    let folder = parent.join(name);
    std::fs::create_dir_all(&folder)?;
    std::fs::write(folder.join("part-0.arrow"), b"in progress")?;
    Ok(folder)
}

#[tokio::test]
async fn folders_of_live_processes_in_other_pid_namespaces_survive_a_sweep() -> Result<()>
{
    let (_dir, data, cache) = scratch(300, 1)?;
    // Another container's fill and session folder: their names carry a pid
    // that does not exist in this namespace, but their owner is alive and
    // holds their locks (here: this test, through its own open files).
    let tmp = cache.join("tmp");
    let sessions = cache.join("sessions");
    let filling = folder_with_file(&tmp, &format!("{FOREIGN_PID}-abc-live"))?;
    let session_only = folder_with_file(&sessions, &format!("{FOREIGN_PID}-live"))?;
    let mut owner = Vec::new();
    for folder in [&filling, &session_only] {
        let lock = std::fs::File::open(folder)?;
        lock.try_lock().map_err(std::io::Error::from)?;
        owner.push(lock);
    }
    // What a killed process left: nobody holds the lock.
    let abandoned = folder_with_file(&tmp, &format!("{FOREIGN_PID}-abc-dead"))?;
    let abandoned_session = folder_with_file(&sessions, &format!("{FOREIGN_PID}-dead"))?;
    let trash = folder_with_file(&tmp, &format!("removed-{FOREIGN_PID}-1"))?;

    // The first fill of a session sweeps tmp/ and sessions/.
    let session = session(&cache)?;
    cache_table(&session, &format!("CACHE TABLE t AS {}", query(&data))).await?;
    for live in [&filling, &session_only] {
        assert!(
            live.join("part-0.arrow").exists(),
            "{} was removed",
            live.display()
        );
    }
    for dead in [&abandoned, &abandoned_session, &trash] {
        assert!(!dead.exists(), "{} was left", dead.display());
    }
    // Once its owner is gone, the next process's sweep takes it.
    drop(owner);
    let next = Session::builder()
        .memory_limit(256 << 20)
        .cache_dir(&cache)
        .build()?;
    cache_table(&next, "CACHE TABLE u AS SELECT 1 AS x").await?;
    assert!(!filling.exists() && !session_only.exists());
    Ok(())
}

/// Every batch of a feed as (epoch, step, ids, checksum of the `px`
/// tensor's bits, 0 without one).
type IdBatches = Vec<(u64, u64, Vec<i64>, u64)>;

/// The ids of every batch of a feed, and each epoch's plan.
fn feed_ids(
    session: &Session,
    sql: &str,
    shuffle: Option<u64>,
    cache: bool,
) -> Result<(IdBatches, Vec<String>)> {
    let mut builder = Feed::builder(session, sql)
        .batch_size(100)
        .epochs(3)
        .cache(cache)
        .device(Device::Cpu);
    if let Some(seed) = shuffle {
        builder = builder.shuffle(seed);
    }
    let mut feed = builder.build()?;
    let mut out = vec![];
    for batch in feed.by_ref() {
        let batch = batch?;
        let px = match batch.tensor("px") {
            Ok(px) => px.as_slice::<f32>()?.iter().fold(0u64, |sum, v| {
                sum.wrapping_mul(1_000_003)
                    .wrapping_add(u64::from(v.to_bits()))
            }),
            Err(_) => 0,
        };
        out.push((
            batch.epoch(),
            batch.step(),
            batch.tensor("id")?.as_slice::<i64>()?.to_vec(),
            px,
        ));
    }
    let plans = feed.epoch_plans().iter().map(|(_, p)| p.clone()).collect();
    Ok((out, plans))
}

/// `query(data)` with a decoded, normalised image column `px` (what the
/// epoch cache stores in its compact uint8 form).
fn image_query(data: &Path) -> String {
    query(data).replace(
        "SELECT id, f0 * 2 AS g, label",
        "SELECT id, f0 * 2 AS g, image_to_tensor(image_decode(image_png), \
         [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]) AS px, label",
    )
}

#[test]
fn cached_feeds_reshuffle_every_epoch_like_uncached_ones() -> Result<()> {
    let (_dir, data, cache) = scratch(3000, 3)?;
    // Functions run after the uncached shuffle (keyed on what they read);
    // the cache stores their results with that key's content hash.
    let sql = image_query(&data);
    let session = session(&cache)?;
    let (plain, _) = feed_ids(&session, &sql, Some(7), false)?;
    let (cached, plans) = feed_ids(&session, &sql, Some(7), true)?;
    assert_eq!(cached, plain, "the cache changes nothing a consumer sees");
    assert_ne!(plain[0].2, plain[20].2, "epochs differ");
    assert_ne!(plain[0].3, 0, "pixels compared");
    // A miss: epoch 0 streamed the query and wrote the entry on the way
    // (once: no second run beside it); the later epochs read the cache,
    // not the Parquet files.
    assert_eq!(plans.len(), 3);
    assert!(
        !plans[0].contains("CacheScanExec")
            && plans[0].contains("CacheFillExec")
            && plans[0].contains("parquet"),
        "{}",
        plans[0]
    );
    for plan in &plans[1..] {
        assert!(
            plan.contains("CacheScanExec") && !plan.contains("parquet"),
            "{plan}"
        );
    }
    // Another feed (another run) reuses the entry from disk.
    let later = Session::builder()
        .memory_limit(256 << 20)
        .target_partitions(2)
        .cache_dir(&cache)
        .build()?;
    let (reused, reused_plans) = feed_ids(&later, &sql, Some(7), true)?;
    assert_eq!(reused, plain);
    assert!(
        reused_plans.iter().all(|p| p.contains("CacheScanExec")),
        "a hit reads the cache from the first epoch"
    );
    assert_eq!(entry_dirs(&cache).len(), 1);
    Ok(())
}

/// Unshuffled, a cached feed gives the query's order in every epoch (part
/// `p` of the entry is partition `p`), from a fill and from a hit.
#[test]
fn unshuffled_cached_feeds_keep_the_query_order() -> Result<()> {
    let (_dir, data, cache) = scratch(3000, 3)?;
    let sql = image_query(&data);
    let first = session(&cache)?;
    // A shuffled feed's entry of the same query holds its rows in another
    // layout: it must not be what the unshuffled feed reads.
    feed_ids(&first, &sql, Some(7), true)?;
    let (plain, _) = feed_ids(&first, &sql, None, false)?;
    let (filled, plans) = feed_ids(&first, &sql, None, true)?;
    assert_eq!(entry_dirs(&cache).len(), 2, "one entry per layout");
    assert_eq!(filled, plain);
    assert!(plans[0].contains("CacheFillExec"), "{}", plans[0]);
    assert!(plans[2].contains("CacheScanExec"), "{}", plans[2]);
    let (hit, _) = feed_ids(&session(&cache)?, &sql, None, true)?;
    assert_eq!(hit, plain);
    Ok(())
}

/// The entry holds the uint8 pixels under `image_to_tensor`, not its
/// float32 result: a quarter of the pixel bytes (8×8 test images: the
/// other columns and the content hash make it about a third).
#[tokio::test]
async fn the_feed_cache_stores_pixels_before_normalisation() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    gen_data(&data, 3000, 3)?;
    let sql = image_query(&data);
    let compact_cache = dir.path().join("compact");
    let session_compact = session(&compact_cache)?;
    let (_, _) = feed_ids(&session_compact, &sql, Some(7), true)?;
    let compact: u64 = session_compact
        .cache()
        .entries()
        .iter()
        .map(|e| e.disk_bytes)
        .sum();
    // The whole query, as CACHE TABLE stores it (float32 tensors).
    let full_session = session(&dir.path().join("full"))?;
    cache_table(&full_session, &format!("CACHE TABLE t AS {sql}")).await?;
    let full: u64 = full_session
        .cache()
        .entries()
        .iter()
        .map(|e| e.disk_bytes)
        .sum();
    assert!(
        compact * 10 <= full * 4,
        "the compact entry has {compact} bytes, the float32 one {full}"
    );
    Ok(())
}

/// The published all-MiniLM-L6-v2 tokenizer of the UDF crate's tests.
const MINILM_TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json"
);

/// `MINILM_TOKENIZER` with the ids of two words of every caption swapped:
/// the same kind of file, other tokens.
fn swapped_vocabulary() -> Result<Vec<u8>> {
    let text = std::fs::read(MINILM_TOKENIZER)?;
    let mut json: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
    let vocab = json["model"]["vocab"]
        .as_object_mut()
        .expect("a WordPiece vocabulary");
    let (on, background) = (vocab["on"].clone(), vocab["background"].clone());
    vocab.insert("on".into(), background);
    vocab.insert("background".into(), on);
    serde_json::to_vec(&json)
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))
}

/// The manifest of the shared entry `key` under `cache`, as JSON.
fn only_manifest(cache: &Path, key: &str) -> Result<serde_json::Value> {
    let text = std::fs::read(cache.join("entries").join(key).join("manifest.json"))?;
    serde_json::from_slice(&text)
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))
}

#[tokio::test]
async fn a_rewritten_tokenizer_file_is_a_miss_and_gives_the_new_tokens() -> Result<()> {
    let (dir, data, cache) = scratch(300, 2)?;
    let tokenizer = dir.path().join("model").join("tokenizer.json");
    std::fs::create_dir_all(dir.path().join("model"))?;
    std::fs::copy(MINILM_TOKENIZER, &tokenizer)?;
    let query = format!(
        "SELECT id, tokenize(caption, '{}', 16) AS ids FROM '{}/*.parquet'",
        tokenizer.display(),
        data.display()
    );
    let ordered = "SELECT * FROM t ORDER BY id";

    let first = session(&cache)?;
    let cached = cache_table(&first, &format!("CACHE TABLE t AS {query}")).await?;
    assert_eq!(cached.source, "computed");
    let old_tokens = rows(&collect(&first, ordered).await?);
    // The manifest records the tokenizer's content hash and the build.
    let manifest = only_manifest(&cache, &cached.key)?;
    let assets = manifest["assets"].as_array().expect("assets listed");
    assert_eq!(assets.len(), 1, "{manifest}");
    assert_eq!(assets[0]["location"], tokenizer.display().to_string());
    assert_eq!(assets[0]["xxh3"].as_str().map(str::len), Some(32));
    assert_eq!(manifest["build"], sqlfeed::cache::BUILD_ID);

    // Run again (another session, as another run): a hit.
    let second = session(&cache)?;
    let again = cache_table(&second, &format!("CACHE TABLE t AS {query}")).await?;
    assert_eq!(again.source, "reused from disk");
    assert_eq!(again.key, cached.key);

    // The same path, another vocabulary: a miss with the new tokens, also
    // in the session that still holds the old tokenizer.
    std::fs::write(&tokenizer, swapped_vocabulary()?)?;
    let changed = cache_table(&first, &format!("CACHE TABLE t2 AS {query}")).await?;
    assert_eq!(changed.source, "computed");
    assert_ne!(changed.key, cached.key);
    let new_tokens = rows(&collect(&first, "SELECT * FROM t2 ORDER BY id").await?);
    assert_ne!(new_tokens, old_tokens, "the vocabulary change shows");
    let fresh = session(&dir.path().join("other-cache"))?;
    let expected = rows(&collect(&fresh, &format!("{query} ORDER BY id")).await?);
    assert_eq!(new_tokens, expected);
    // And a later run finds the new entry, not the old one.
    let third = session(&cache)?;
    let reused = cache_table(&third, &format!("CACHE TABLE t AS {query}")).await?;
    assert_eq!(reused.source, "reused from disk");
    assert_eq!(reused.key, changed.key);
    assert_eq!(rows(&collect(&third, ordered).await?), expected);

    // A tokenizer that is gone fails the query with the function's error.
    std::fs::remove_file(&tokenizer)?;
    let err = collect(&first, &format!("CACHE TABLE t3 AS {query}"))
        .await
        .expect_err("missing tokenizer");
    assert!(
        err.to_string().contains("does not exist")
            && err.to_string().contains(&tokenizer.display().to_string()),
        "{err}"
    );
    Ok(())
}

/// A cached feed of one epoch streams it and still leaves the entry
/// written (the fill beside the epoch is awaited before the feed ends).
#[test]
fn a_one_epoch_cached_feed_leaves_the_entry_written() -> Result<()> {
    let (_dir, data, cache) = scratch(600, 2)?;
    let session = session(&cache)?;
    let mut feed = Feed::builder(&session, query(&data))
        .shuffle(3)
        .batch_size(64)
        .cache(true)
        .device(Device::Cpu)
        .build()?;
    let rows: usize = feed
        .by_ref()
        .map(|b| b.map(|b| b.rows()))
        .sum::<Result<_>>()?;
    assert_eq!(rows, 400, "ids with id % 3 <> 0");
    drop(feed);
    assert_eq!(entry_dirs(&cache).len(), 1);
    Ok(())
}

/// A feed dropped during its first epoch commits no entry (it holds only
/// part of the rows) and leaves no files; the next feed fills it whole.
#[test]
fn a_feed_stopped_while_filling_leaves_no_entry() -> Result<()> {
    let (_dir, data, cache) = scratch(3000, 3)?;
    let sql = image_query(&data);
    let session = session(&cache)?;
    let mut feed = Feed::builder(&session, &sql)
        .shuffle(7)
        .batch_size(100)
        .epochs(2)
        .cache(true)
        .device(Device::Cpu)
        .build()?;
    feed.next().expect("a first batch")?;
    drop(feed);
    assert!(entry_dirs(&cache).is_empty(), "{:?}", entry_dirs(&cache));
    let leftovers: Vec<_> = std::fs::read_dir(cache.join("tmp"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let (plain, _) = feed_ids(&session, &sql, Some(7), false)?;
    let (cached, _) = feed_ids(&session, &sql, Some(7), true)?;
    assert_eq!(cached, plain);
    assert_eq!(entry_dirs(&cache).len(), 1);
    Ok(())
}

/// A cached feed over an empty table: empty epochs, and the (empty) entry
/// is written and read like any other.
#[test]
fn a_cached_feed_of_an_empty_table_runs_its_epochs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let session = session(&dir.path().join("cache"))?;
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
        datafusion::arrow::datatypes::Field::new(
            "id",
            datafusion::arrow::datatypes::DataType::Int64,
            false,
        ),
    ]));
    session.context().register_table(
        "nothing",
        Arc::new(MemTable::try_new(schema, vec![vec![]])?),
    )?;
    for shuffle in [None, Some(3)] {
        let mut builder = Feed::builder(&session, "SELECT id FROM nothing")
            .batch_size(8)
            .epochs(2)
            .cache(true)
            .device(Device::Cpu);
        if let Some(seed) = shuffle {
            builder = builder.shuffle(seed);
        }
        let mut feed = builder.build()?;
        assert_eq!(feed.by_ref().count(), 0, "{shuffle:?}");
        let plans: Vec<String> =
            feed.epoch_plans().iter().map(|(_, p)| p.clone()).collect();
        assert_eq!(plans.len(), 2);
        assert!(plans[1].contains("CacheScanExec"), "{}", plans[1]);
    }
    Ok(())
}
