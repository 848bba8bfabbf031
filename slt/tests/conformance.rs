//! DataFusion's `.slt` files through sqlfeed (issue 20, item 3) and
//! sqlfeed's own `.slt` files for its dialect (item 5), with DataFusion's
//! runner and validators; see the crate docs.
//!
//! `cargo test -p sqlfeed-slt` runs a representative subset of DataFusion's
//! files (the test command); `SQLFEED_SLT=all` (scripts/slt.sh) runs every
//! one. Either way, each file that passes on plain DataFusion must pass
//! through sqlfeed unless `EXPECTED_DIFFERENCES` lists it with the reason;
//! files that fail on plain DataFusion here (most read data from
//! DataFusion's repository, which the crate does not ship) are counted and
//! reported, not run through sqlfeed.

use std::path::Path;

use sqlfeed_slt::{
    EXPECTED_DIFFERENCES, Engine, datafusion_test_files, run_file, slt_files,
};

/// DataFusion files run by the test command: queries, joins, aggregates,
/// windows, set operations, DDL and DML, EXPLAIN, types, functions, and the
/// files that switch `datafusion.sql_parser.dialect` (the first run of the
/// suite found sqlfeed ignoring it). Each passes on plain DataFusion here
/// (checked below); the suite's files that read DataFusion's repository data
/// do not (`scripts/slt.sh` runs them all).
const CI_SUBSET: &[&str] = &[
    "aggregate_any_value.slt",
    "aggregates_topk.slt",
    "alias.slt",
    "array/array_any_match.slt",
    "array/array_has.slt",
    "case.slt",
    "cast.slt",
    "coalesce.slt",
    "copy.slt",
    "cse.slt",
    "datetime/dates.slt",
    "datetime/interval_mysql.slt",
    "delete.slt",
    "dml_update.slt",
    "explain_tree.slt",
    "functional_dependencies.slt",
    "grouping.slt",
    "ident_normalization.slt",
    "in_list.slt",
    "join_only.slt",
    "lateral_join.slt",
    "merge_into.slt",
    "named_arguments.slt",
    "nullif.slt",
    "operator.slt",
    "parquet_nested_schema_pruning.slt",
    "pipe_operator.slt",
    "prepare.slt",
    "qualify.slt",
    "regexp/regexp_like.slt",
    "set_variable.slt",
    "simplify_expr.slt",
    "string/string.slt",
    "struct.slt",
    "table_functions.slt",
    "truncate.slt",
    "type_coercion.slt",
    "union_by_name.slt",
    "update.slt",
    "window_topn.slt",
];

/// Runs each file in a scratch folder of its own, where the files expect
/// one (`test_files/scratch/<name>`, relative to the working folder).
async fn run_in_scratch(
    path: &Path,
    relative: &Path,
    engine: Engine,
) -> Result<(), String> {
    let stem = relative
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let scratch = Path::new("test_files/scratch").join(&stem);
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let outcome = run_file(path, relative, engine).await;
    let _ = std::fs::remove_dir_all(&scratch);
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datafusion_files_pass_through_sqlfeed() {
    let dir = datafusion_test_files().expect("DataFusion's test files");
    let all = std::env::var("SQLFEED_SLT").is_ok_and(|v| v == "all");
    let files: Vec<_> = slt_files(&dir)
        .into_iter()
        .filter(|path| {
            let name = path
                .strip_prefix(&dir)
                .map(|r| r.to_string_lossy().into_owned());
            all || name.is_ok_and(|n| CI_SUBSET.contains(&n.as_str()))
        })
        .collect();
    if !all {
        assert_eq!(
            files.len(),
            CI_SUBSET.len(),
            "a subset file is missing in {}",
            dir.display()
        );
    }
    let (mut passed, mut expected, mut plain_failures) = (0, 0, Vec::new());
    let mut failures = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(&dir).unwrap_or(path);
        let name = relative.to_string_lossy().into_owned();
        if let Err(why) = run_in_scratch(path, relative, Engine::Plain).await {
            plain_failures.push((name, why));
            continue;
        }
        let listed = EXPECTED_DIFFERENCES.iter().any(|(f, _)| *f == name);
        match run_in_scratch(path, relative, Engine::Sqlfeed).await {
            Ok(()) if listed => failures.push((
                name,
                "passes through sqlfeed now: remove it from EXPECTED_DIFFERENCES".into(),
            )),
            Ok(()) => passed += 1,
            Err(_) if listed => expected += 1,
            Err(why) => failures.push((name, why)),
        }
    }
    eprintln!(
        "DataFusion .slt files: {} run, {passed} pass on plain DataFusion and through \
         sqlfeed, {expected} differ as listed, {} fail on plain DataFusion here, {} fail \
         only through sqlfeed",
        files.len(),
        plain_failures.len(),
        failures.len()
    );
    for (name, why) in &plain_failures {
        let first = why.lines().next().unwrap_or_default();
        eprintln!("  plain DataFusion fails {name}: {first}");
    }
    if !all {
        assert!(
            plain_failures.is_empty(),
            "the CI subset must pass on plain DataFusion (else it tests nothing): {plain_failures:#?}"
        );
    }
    assert!(
        failures.is_empty(),
        "files that pass on DataFusion but fail through sqlfeed:\n{}",
        failures
            .iter()
            .map(|(name, why)| format!("--- {name}\n{why}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// sqlfeed's own files, in a sqlfeed session (its url tables, cache and
/// settings), with the same runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlfeed_dialect_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("test_files");
    let files = slt_files(&dir);
    assert!(
        files.len() >= 5,
        "sqlfeed's .slt files are missing in {}",
        dir.display()
    );
    let mut failures = Vec::new();
    for path in &files {
        let name = path
            .strip_prefix(&dir)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        if let Err(why) = sqlfeed_slt::run_sqlfeed_file(path).await {
            failures.push(format!("--- {name}\n{why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
