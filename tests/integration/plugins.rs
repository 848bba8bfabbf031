//! Rust function plugins (`examples/udf-plugin`, built by the workspace) in
//! real processes: `--load`, `CREATE FUNCTION … LANGUAGE rust`, feeds, bad
//! libraries, and a 2-executor Ballista cluster loading the plugin from
//! `--plugin-dir`, with a client whose library differs.

use std::path::{Path, PathBuf};
#[cfg(feature = "ballista")]
use std::time::Duration;

use datafusion::error::Result;

use crate::common::{
    assert_contains, batch_field, digest_feed, gen_data, run, sqlfeed, succeeded,
};

/// The template plugin the workspace builds next to the `sqlfeed` binary.
fn plugin() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_sqlfeed"))
        .parent()
        .expect("the binary's folder");
    let library = sqlfeed_plugin::host::library_in(dir, "sqlfeed_udf_plugin");
    assert!(
        library.exists(),
        "{} is missing: build the workspace's libraries first (cargo build --workspace \
         --lib; scripts/test.sh does)",
        library.display()
    );
    library
}

/// [`ngram_hash`]'s values as the CSV output lists them: `1, 2, 3`.
fn ngram_hash_list(text: &str, n: usize, buckets: u64) -> String {
    let hashes: Vec<String> = (ngram_hash(text, n, buckets).iter())
        .map(u64::to_string)
        .collect();
    hashes.join(", ")
}

/// What `ngram_hash(text, n, buckets)` returns, computed here.
fn ngram_hash(text: &str, n: usize, buckets: u64) -> Vec<u64> {
    let chars: Vec<char> = text.chars().collect();
    chars
        .windows(n)
        .map(|gram| {
            let gram: String = gram.iter().collect();
            xxhash_rust::xxh3::xxh3_64(gram.as_bytes()) % buckets
        })
        .collect()
}

fn csv_with_plugin(args: &[&str], sql: &str) -> (bool, String, String) {
    run(sqlfeed()
        .arg("--load")
        .arg(plugin())
        .args(args)
        .args(["--format", "csv", "-c", sql]))
}

#[test]
fn a_loaded_plugin_function_computes_what_it_documents() {
    let out = succeeded(csv_with_plugin(
        &[],
        "SELECT ngram_hash('héllo', 3, 1000) AS g",
    ));
    let expected = ngram_hash_list("héllo", 3, 1000);
    assert_eq!(out, format!("g\n\"[{expected}]\"\n"));
}

#[test]
fn a_plugin_function_gets_constants_as_constants_and_columns_as_columns() {
    // Over three rows the constants 2 and 7 reach the function as scalars
    // (constants.rs); were they columns of three rows, the template would
    // refuse them as it refuses the column below.
    let out = succeeded(csv_with_plugin(
        &[],
        "SELECT ngram_hash(t, 2, 7) AS g FROM (VALUES ('ab'), ('abc'), ('abcd')) v(t)",
    ));
    let rows: Vec<String> = ["ab", "abc", "abcd"]
        .iter()
        .map(|text| {
            let list = format!("[{}]", ngram_hash_list(text, 2, 7));
            // CSV quotes a field only where it holds a comma.
            if list.contains(',') {
                format!("\"{list}\"")
            } else {
                list
            }
        })
        .collect();
    assert_eq!(out, format!("g\n{}\n", rows.join("\n")));
    let (ok, _, err) = csv_with_plugin(
        &[],
        "SELECT ngram_hash(t, n, 7) FROM (VALUES ('abc', 2), ('abcd', 3)) v(t, n)",
    );
    assert!(!ok);
    assert_contains(&err, &["ngram_hash: n must be a constant, not a column"]);
}

#[test]
fn a_plugin_aggregate_merges_across_partitions() {
    // 1, 2, 4, 8, 16, ... in 4 partitions: the geometric mean of 2^0..2^19
    // is 2^9.5; non-positive values and NULLs are left out.
    let sql = "SELECT round(geo_mean(CASE WHEN v = 0 THEN -1 ELSE power(2.0, v - 1) END), 6) AS g \
               FROM (SELECT value AS v FROM range(0, 21))";
    let out = succeeded(csv_with_plugin(&["--target-partitions", "4"], sql));
    let expected = (2f64.powf(9.5) * 1e6).round() / 1e6;
    assert_eq!(out, format!("g\n{expected}\n"));
}

#[test]
fn create_function_registers_one_function_of_a_library() {
    let library = plugin();
    let create = format!(
        "CREATE FUNCTION ngram_hash() LANGUAGE rust AS '{}'",
        library.display()
    );
    let out = succeeded(run(sqlfeed().args([
        "--format",
        "csv",
        "-c",
        &create,
        "-c",
        "SELECT ngram_hash('abcd', 2, 7) AS g",
    ])));
    let expected = ngram_hash_list("abcd", 2, 7);
    assert!(out.ends_with(&format!("g\n\"[{expected}]\"\n")), "{out}");

    // A name the library does not have: the error lists what it has.
    let wrong = format!(
        "CREATE FUNCTION nope() LANGUAGE rust AS '{}'",
        library.display()
    );
    let (ok, _, err) = run(sqlfeed().args(["-c", &wrong]));
    assert!(!ok);
    assert_contains(
        &err,
        &[
            "has no function 'nope'",
            "ngram_hash, token_dropout, geo_mean",
        ],
    );
    // Another language: refused with what to do.
    let (ok, _, err) =
        run(sqlfeed().args(["-c", "CREATE FUNCTION f() LANGUAGE python AS 'x'"]));
    assert!(!ok);
    assert_contains(&err, &["not LANGUAGE python", "session.register"]);
}

#[test]
fn a_seeded_plugin_augmentation_differs_per_epoch_and_repeats_on_a_rerun() -> Result<()> {
    let dir = tempfile::tempdir()?;
    gen_data(&dir.path().join("d"), 200, 2)?;
    let sql = format!(
        "SELECT token_dropout(arrow_cast(tokens, 'List(Int64)'), 0.5, 11) AS t, id AS y \
         FROM '{}/d/*.parquet'",
        dir.path().display()
    );
    // Unshuffled: both epochs read the rows in the same order, so only the
    // augmentation can tell them apart.
    let digests =
        || -> Vec<(String, String)> {
            let out = succeeded(run(digest_feed(&sql)
                .arg("--load")
                .arg(plugin())
                .args(["--batch-size", "50", "--epochs", "2"])));
            out.lines()
                .filter(|l| l.starts_with("batch "))
                .map(|l| (batch_field(l, "epoch="), batch_field(l, "digest=")))
                .collect()
        };
    let first = digests();
    assert_eq!(first.len(), 8, "{first:?}");
    let epoch = |e: &str| -> Vec<String> {
        first
            .iter()
            .filter(|(x, _)| x == e)
            .map(|(_, d)| d.clone())
            .collect()
    };
    let (zero, one) = (epoch("0"), epoch("1"));
    assert_eq!(zero.len(), 4);
    for (a, b) in zero.iter().zip(&one) {
        assert_ne!(a, b, "epochs 0 and 1 dropped the same tokens: {first:?}");
    }
    assert_eq!(first, digests(), "a rerun gave other batches");
    Ok(())
}

#[test]
fn libraries_that_are_not_plugins_of_this_datafusion_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Not a library at all.
    let text = dir.path().join("libtext.so");
    std::fs::write(&text, "not an ELF file").expect("write");
    let (ok, _, err) = run(sqlfeed().arg("--load").arg(&text).args(["-c", "SELECT 1"]));
    assert!(!ok);
    assert_contains(&err, &["libtext.so", "cannot load it as a shared library"]);

    // A shared library without sqlfeed's header, and one whose header says
    // it was built against DataFusion 54: built here from C, as a plugin of
    // another version would be laid out.
    let source = dir.path().join("fake.c");
    std::fs::write(
        &source,
        r#"
#include <stdint.h>
#include <string.h>
struct header { uint64_t magic; uint32_t abi; uint32_t major;
                char df[64]; char name[64]; char version[64]; };
struct header sqlfeed_plugin_header(void) {
    struct header h; memset(&h, 0, sizeof h);
    memcpy(&h.magic, "SQLFEEDP", 8); h.abi = 1; h.major = 54;
    strcpy(h.df, "54.0.0"); strcpy(h.name, "old-plugin"); strcpy(h.version, "0.3.0");
    return h;
}
int not_a_plugin(void) { return 1; }
"#,
    )
    .expect("write C");
    let old = dir.path().join("libold.so");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&old)
        .arg(&source)
        .status()
        .expect("a C compiler (cc) builds the fake plugin");
    assert!(status.success());
    let (ok, _, err) = run(sqlfeed().arg("--load").arg(&old).args(["-c", "SELECT 1"]));
    assert!(!ok);
    assert!(err.contains("libold.so"), "{err}");
    assert_contains(
        &err,
        &["old-plugin 0.3.0 was built against DataFusion 54.0.0"],
    );
    assert!(
        err.contains(&format!(
            "uses DataFusion {}",
            datafusion::DATAFUSION_VERSION
        )),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let zlib = [
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists());
    if let Some(zlib) = zlib {
        let (ok, _, err) =
            run(sqlfeed().arg("--load").arg(zlib).args(["-c", "SELECT 1"]));
        assert!(!ok);
        assert!(err.contains("is not a sqlfeed plugin"), "{err}");
    }

    // Two libraries defining the same name: refused, not one chosen.
    let (ok, _, err) = run(sqlfeed()
        .arg("--load")
        .arg(plugin())
        .arg("--plugin-dir")
        .arg(copy_plugin(dir.path(), "again", false))
        .args(["-c", "SELECT 1"]));
    assert!(!ok);
    assert_contains(&err, &["defines a function 'ngram_hash', which plugin"]);
}

/// Issue 56, item 3: a library cut short is named as damaged before the
/// loader maps it (it crashed the process with SIGBUS).
#[test]
fn a_truncated_library_is_named_as_damaged_instead_of_crashing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = std::fs::read(plugin()).expect("the plugin is readable");
    for (name, cut) in [("libhalf.so", whole.len() / 2), ("libshort.so", 60)] {
        let path = dir.path().join(name);
        std::fs::write(&path, &whole[..cut]).expect("write");
        let mut command = sqlfeed();
        command.arg("--load").arg(&path).args(["-c", "SELECT 1"]);
        let output = command.output().expect("sqlfeed runs");
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(1),
            "not killed by a signal: {err}"
        );
        assert_contains(
            &err,
            &[name, "the library is damaged", "Copy or build it again"],
        );
    }
}

#[test]
fn a_cache_entry_of_a_plugin_function_is_not_served_to_another_build() -> Result<()> {
    let dir = tempfile::tempdir()?;
    gen_data(&dir.path().join("d"), 100, 1)?;
    let cache = dir.path().join("cache");
    let sql = format!(
        "CACHE TABLE g AS SELECT ngram_hash(caption, 3, 16) AS g FROM '{}/d/*.parquet'",
        dir.path().display()
    );
    let cache_table = |library: &Path| -> String {
        succeeded(run(sqlfeed()
            .arg("--cache-dir")
            .arg(&cache)
            .arg("--load")
            .arg(library)
            .args(["--format", "csv", "-c", &sql])))
    };
    let first = cache_table(&plugin());
    assert!(first.contains("computed"), "{first}");
    let again = cache_table(&plugin());
    assert!(again.contains("reused from disk"), "{again}");
    // The same code with another content hash (a rebuilt plugin): a miss.
    let rebuilt = copy_plugin(dir.path(), "rebuilt", true)
        .join(plugin().file_name().expect("name"));
    let other = cache_table(&rebuilt);
    assert!(
        other.contains("computed"),
        "a rebuilt plugin got the old entry: {other}"
    );
    Ok(())
}

/// A copy of the plugin in `dir/name/`; `altered` appends a byte (the same
/// code to the loader, another content to sqlfeed's identity check).
fn copy_plugin(dir: &Path, name: &str, altered: bool) -> PathBuf {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).expect("mkdir");
    let source = plugin();
    let target = folder.join(source.file_name().expect("a file name"));
    let mut bytes = std::fs::read(&source).expect("read the plugin");
    if altered {
        bytes.push(0);
    }
    std::fs::write(&target, bytes).expect("copy the plugin");
    folder
}

#[cfg(feature = "ballista")]
#[test]
fn a_cluster_loads_plugins_from_its_folder_and_refuses_a_different_client_library()
-> Result<()> {
    use crate::cluster::{Cluster, run_bounded};

    let dir = tempfile::tempdir()?;
    gen_data(&dir.path().join("d"), 600, 3)?;
    let plugins = copy_plugin(dir.path(), "plugins", false);
    let plugins_arg = plugins.display().to_string();
    let cluster = Cluster::start_with(
        2,
        &["--concurrent-tasks", "1", "--plugin-dir", &plugins_arg],
        &["--plugin-dir", &plugins_arg],
    );
    let sql = format!(
        "SELECT id, ngram_hash(caption, 3, 4096) AS g FROM '{}/d/*.parquet' ORDER BY id",
        dir.path().display()
    );
    let client = |library: &Path| {
        run_bounded(
            sqlfeed()
                .arg("--load")
                .arg(library)
                .args(["--cluster", &cluster.url(), "--target-partitions", "4"])
                .args(["--format", "csv", "-c", &sql]),
            Duration::from_secs(120),
        )
    };
    let library = plugins.join(plugin().file_name().expect("name"));
    let (ok, on_cluster, err) = client(&library);
    assert!(ok, "{err}");
    let (ok, embedded, err) = csv_with_plugin(&["--target-partitions", "4"], &sql);
    assert!(ok, "{err}");
    assert_eq!(on_cluster, embedded);
    assert_eq!(on_cluster.lines().count(), 601);

    // A client whose library differs by one byte: refused by content.
    let other =
        copy_plugin(dir.path(), "other", true).join(plugin().file_name().expect("name"));
    let (ok, _, err) = client(&other);
    assert!(!ok, "a different library ran");
    assert_contains(
        &err,
        &["function 'ngram_hash' differs between the client and this process"],
    );
    Ok(())
}

#[cfg(feature = "ballista")]
#[test]
fn a_cluster_without_the_plugin_names_the_missing_folder() -> Result<()> {
    use crate::cluster::{Cluster, run_bounded};

    let dir = tempfile::tempdir()?;
    gen_data(&dir.path().join("d"), 100, 1)?;
    let cluster = Cluster::start(1);
    let sql = format!(
        "SELECT ngram_hash(caption, 3, 16) AS g FROM '{}/d/*.parquet'",
        dir.path().display()
    );
    let (ok, _, err) = run_bounded(
        sqlfeed().arg("--load").arg(plugin()).args([
            "--cluster",
            &cluster.url(),
            "-c",
            &sql,
        ]),
        Duration::from_secs(120),
    );
    assert!(!ok);
    assert_contains(&err, &["is not loaded in this process", "--plugin-dir"]);
    Ok(())
}
