//! The binary: `-c`, `-f`, formats, backslash commands, `gen`, `demo`.

use datafusion::error::Result;

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Date32Array, Int64Array, RecordBatch, TimestampMicrosecondArray,
};

use crate::common::{
    assert_contains, csv, csv_with, gen_data, generated, run, sqlfeed, succeeded,
    write_parquet,
};

#[test]
fn formats_csv_json_ndjson_and_table() {
    let sql = "SELECT * FROM (VALUES (1, 'a'), (2, NULL)) AS t(n, s) ORDER BY n";
    assert_eq!(csv(sql), "n,s\n1,a\n2,\n");
    let (ok, json, _) = run(sqlfeed().args(["--format", "json", "-c", sql]));
    assert!(ok);
    assert_eq!(json.trim(), r#"[{"n":1,"s":"a"},{"n":2}]"#);
    let (ok, nd, _) = run(sqlfeed().args(["--format", "ndjson", "-c", sql]));
    assert!(ok);
    assert_eq!(nd, "{\"n\":1,\"s\":\"a\"}\n{\"n\":2}\n");
    let (ok, table, _) = run(sqlfeed().args(["-c", sql]));
    assert!(ok);
    assert_eq!(
        table,
        "+---+------+\n| n | s    |\n+---+------+\n| 1 | a    |\n| 2 | NULL |\n+---+------+\n2 rows\n"
    );
}

#[test]
fn timing_and_row_limit_in_table_output() {
    let (ok, out, _) = run(sqlfeed().args([
        "--timing",
        "--max-rows",
        "3",
        "-c",
        "SELECT * FROM generate_series(1, 10)",
    ]));
    assert!(ok);
    let footer = out.lines().last().expect("a footer");
    assert!(footer.starts_with("10 rows (first 3 shown"), "{footer}");
    assert!(footer.contains(" in ") && footer.ends_with('s'), "{footer}");
}

#[test]
fn script_file_with_statements_and_commands() -> Result<()> {
    let dir = tempfile::tempdir()?;
    gen_data(&dir.path().join("data"), 100, 2)?;
    let script = dir.path().join("explore.sql");
    std::fs::write(
        &script,
        format!(
            "-- a comment\n\
             CREATE EXTERNAL TABLE train STORED AS PARQUET LOCATION '{}/data/';\n\
             \\dt\n\
             SELECT count(*) AS n\n  FROM train\n  WHERE label < 5;\n\
             \\d train\n",
            dir.path().display()
        ),
    )?;
    let out = succeeded(run(sqlfeed().args(["--format", "csv", "-f"]).arg(&script)));
    assert_contains(
        &out,
        &[
            "public,train,BASE TABLE",
            "column_name,data_type,is_nullable",
            "caption,Utf8,",
        ],
    );
    Ok(())
}

#[test]
fn summarize_and_sample_statements() -> Result<()> {
    let dir = generated(400, 2)?;
    let path = format!("{}/*.parquet", dir.path().display());
    let summary = csv(&format!("SUMMARIZE '{path}'"));
    let label = summary
        .lines()
        .find(|l| l.starts_with("label,"))
        .expect("a row for label");
    assert!(
        label.starts_with("label,Int32,value,400,0,10,0,9,"),
        "{label}"
    );
    let a = csv(&format!("SAMPLE '{path}' 5 SEED 3"));
    let b = csv(&format!("SAMPLE (SELECT * FROM '{path}') 5 SEED 3"));
    assert_eq!(a, b, "a path and the same query sample the same rows");
    assert_eq!(a.lines().count(), 6);
    assert_ne!(a, csv(&format!("SAMPLE '{path}' 5 SEED 4")));
    Ok(())
}

/// `SELECT 'aaaaaaaaaa' AS c0, …, 'aaaaaaaaaa' AS c11`: 157 columns wide.
pub fn twelve_columns() -> String {
    let columns: Vec<String> = (0..12).map(|i| format!("'aaaaaaaaaa' AS c{i}")).collect();
    format!("SELECT {}", columns.join(", "))
}

#[test]
fn piped_tables_keep_every_column_whatever_columns_says() {
    let out = succeeded(run(sqlfeed()
        .env("COLUMNS", "40")
        .args(["-c", &twelve_columns()])));
    assert!(out.contains("| c5 ") && out.contains("| c11 "), "{out}");
    assert!(!out.contains('…') && !out.contains("shown"), "{out}");
    assert!(out.ends_with("\n1 row\n"), "{out}");
    // `--format wide` (every column) and `--format fit` (the default).
    for format in ["wide", "fit", "table"] {
        let (ok, same, err) = run(sqlfeed().env("COLUMNS", "40").args([
            "--format",
            format,
            "-c",
            &twelve_columns(),
        ]));
        assert!(ok, "{err}");
        assert_eq!(same, out, "--format {format}");
    }
}

/// Micros of 2013-01-01 10:00:00 UTC and of 2013-01-02 11:30:00 UTC.
const T0: i64 = 1_357_034_400_000_000;
const T1: i64 = 1_357_126_200_000_000;

/// `dir/times.parquet`: timestamps (with and without a zone), dates and
/// integers, one row null.
pub fn write_times(
    dir: &std::path::Path,
) -> datafusion::error::Result<std::path::PathBuf> {
    let path = dir.join("times.parquet");
    let batch = RecordBatch::try_from_iter(vec![
        (
            "t",
            Arc::new(TimestampMicrosecondArray::from(vec![
                Some(T1),
                None,
                Some(T0),
            ])) as ArrayRef,
        ),
        (
            "tz",
            Arc::new(
                TimestampMicrosecondArray::from(vec![Some(T1), None, Some(T0)])
                    .with_timezone("+00:00"),
            ) as ArrayRef,
        ),
        (
            "d",
            Arc::new(Date32Array::from(vec![Some(15707), None, Some(15706)])) as ArrayRef,
        ),
        (
            "n",
            Arc::new(Int64Array::from(vec![Some(T1), None, Some(T0)])) as ArrayRef,
        ),
    ])?;
    write_parquet(&path, &batch)?;
    Ok(path)
}

#[test]
fn summarize_shows_temporal_min_and_max_as_dates_and_times() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = write_times(dir.path())?;
    let summary = csv(&format!("SUMMARIZE '{}'", path.display()));
    let row = |name: &str| {
        summary
            .lines()
            .find(|l| l.starts_with(&format!("{name},")))
            .unwrap_or_else(|| panic!("a row for {name} in {summary}"))
            .to_string()
    };
    assert!(
        row("t").contains(",value,2,1,2,2013-01-01T10:00:00,2013-01-02T11:30:00,,"),
        "{summary}"
    );
    assert!(
        row("tz").contains(",2013-01-01T10:00:00Z,2013-01-02T11:30:00Z,,"),
        "{summary}"
    );
    assert!(row("d").contains(",2013-01-01,2013-01-02,,"), "{summary}");
    // Integers stay numbers, with their statistics.
    assert!(
        row("n").starts_with(&format!("n,Int64,value,2,1,2,{T0},{T1},")),
        "{summary}"
    );
    // Durations are summarised the same way instead of by counts only.
    let durations = csv(
        "SUMMARIZE (SELECT arrow_cast(column1, 'Duration(Second)') AS d \
         FROM (VALUES (3600), (60)))",
    );
    let d = durations.lines().nth(1).expect("a row");
    assert!(d.starts_with("d,Duration(s),value,2,0,2,"), "{durations}");
    assert!(!d.contains(",60,3600,"), "{durations}");
    Ok(())
}

#[test]
fn functions_and_help_list_what_exists() {
    let (ok, out, _) = run(sqlfeed().args(["-c", "\\functions"]));
    assert!(ok);
    assert_contains(&out, &["standardize(x, mean, std)", "byte_length(value)"]);
    // One name: its whole documentation, example output included.
    let (ok, out, _) = run(sqlfeed().args(["-c", "\\functions one_hot"]));
    assert!(ok);
    assert!(
        out.contains("#### Arguments")
            && out.contains("- **n**:")
            && out.contains("> SELECT one_hot(2, 4)"),
        "{out}"
    );
    assert!(out.contains("[0.0, 0.0, 1.0, 0.0]"), "{out}");
    let (ok, help, _) = run(sqlfeed().args(["-c", "\\?"]));
    assert!(ok);
    assert_contains(&help, &["SUMMARIZE <table>", "\\timing"]);
}

#[test]
fn unknown_command_and_bad_memory_limit_are_errors() {
    let (ok, _, err) = run(sqlfeed().args(["-c", "\\nope"]));
    assert!(!ok);
    assert!(err.contains("unknown command '\\nope'"), "{err}");
    let (ok, _, err) = run(sqlfeed().args(["--memory-limit", "lots", "-c", "SELECT 1"]));
    assert!(!ok);
    assert!(err.contains("invalid memory size 'lots'"), "{err}");
}

/// An error is said once, however many layers carried it (a missing column
/// was named three times, each layer repeating its source's message), and
/// an added context keeps what it adds.
#[test]
fn an_error_is_said_once_with_its_context() -> Result<()> {
    let dir = generated(100, 1)?;
    let query = format!("SELECT image FROM '{}/*.parquet'", dir.path().display());
    let (ok, _, err) = run(sqlfeed().args(["-c", &query]));
    assert!(!ok);
    assert_eq!(err.matches("No field named image").count(), 1, "{err}");
    assert!(err.contains("Did you mean"), "{err}");
    let missing = dir.path().join("none.sql");
    let (ok, _, err) = run(sqlfeed().args(["-f", &missing.display().to_string()]));
    assert!(!ok);
    assert_contains(&err, &["cannot read SQL file", "No such file"]);
    Ok(())
}

/// Feed options are checked when the command line is parsed, before any
/// file is read: each bad value is a usage error naming its option.
#[test]
fn bad_feed_options_are_usage_errors_naming_the_option() {
    for (option, value, says) in [
        ("--shard", "3", "--shard '3' should look like A/B, e.g. 1/8"),
        ("--resume", "1-2", "--resume '1-2' should look like A:B"),
        (
            "--resume-rows",
            "x:1",
            "--resume-rows 'x:1' should look like A:B",
        ),
        (
            "--device",
            "tpu",
            "unknown device 'tpu': expected auto, cpu, cuda or cuda:N",
        ),
        (
            "--step-ms",
            "-1",
            "--step-ms '-1' must be a non-negative number",
        ),
        (
            "--step-ms",
            "NaN",
            "--step-ms 'NaN' must be a non-negative number",
        ),
        ("--tensor", "x", "tensor option 'x' should look like"),
        (
            "--explain",
            "1",
            "--explain '1' should look like EPOCH:STEP",
        ),
        (
            "--prometheus-every",
            "0",
            "--prometheus-every '0' must be a positive number of seconds",
        ),
        (
            "--prometheus-label",
            "job",
            "--prometheus-label 'job' should look like NAME=VALUE",
        ),
    ] {
        // `--option=value`: `--step-ms -1` would be taken for a flag.
        let (ok, _, err) = run(sqlfeed().args([
            "feed",
            "SELECT 1 AS x FROM 'no/such/*.parquet'",
            &format!("{option}={value}"),
        ]));
        assert!(!ok, "{option} {value} was accepted");
        assert!(
            err.contains(&format!("invalid value '{value}' for '{option}"))
                && err.contains(says),
            "{option} {value}: {err}"
        );
        // A usage error: nothing was planned, so the missing files go unsaid.
        assert!(!err.contains("no/such"), "{option} {value}: {err}");
    }
}

#[test]
fn gen_is_byte_identical_for_a_seed() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let generate = |name: &str, seed: &str| {
        let out = dir.path().join(name);
        succeeded(run(sqlfeed()
            .args([
                "gen",
                "--rows",
                "300",
                "--files",
                "2",
                "--image-size",
                "16",
                "--seed",
                seed,
                "--out",
            ])
            .arg(&out)));
        out
    };
    let (a, b, c) = (generate("a", "5"), generate("b", "5"), generate("c", "6"));
    for file in ["part-00000.parquet", "part-00001.parquet", "_meta.json"] {
        let bytes = |d: &std::path::Path| std::fs::read(d.join(file)).expect("generated");
        assert_eq!(bytes(&a), bytes(&b), "{file}");
        if file != "_meta.json" {
            assert_ne!(bytes(&a), bytes(&c), "{file}");
        }
    }
    let rows = csv(&format!(
        "SELECT count(*) AS n, count(DISTINCT id) AS ids FROM '{}'",
        a.display()
    ));
    assert_eq!(rows, "n,ids\n300,300\n");
    Ok(())
}

#[test]
fn demo_generates_data_and_prints_one_row_per_label() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("demo");
    let (ok, out, err) = run(sqlfeed()
        .args(["demo", "--rows", "2000", "--dir"])
        .arg(&data));
    assert!(ok, "{err}");
    assert!(err.contains("generated 2000 rows"), "{err}");
    assert_contains(&out, &["10 rows in", "preprocessed 2000 rows"]);
    // Then the training feed: 2 epochs of ⌊2000 / 256⌋ = 7 exact batches.
    assert_contains(
        &err,
        &[
            "feed on cpu: x float32, y int64, image float32, tokens int64, tokens_mask bool",
            "14 batches, 3584 rows",
        ],
    );
    // Second run reuses the data.
    let (ok, _, err) = run(sqlfeed()
        .args(["demo", "--rows", "2000", "--dir"])
        .arg(&data));
    assert!(ok);
    assert!(!err.contains("generated"), "{err}");
    Ok(())
}

#[test]
fn broken_pipe_is_not_an_error() {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = sqlfeed()
        .args([
            "--format",
            "csv",
            "-c",
            "SELECT * FROM generate_series(1, 2000000)",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 64];
    stdout.read_exact(&mut first).expect("some output");
    drop(stdout);
    let output = child.wait_with_output().expect("exit");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn set_applies_a_setting_and_names_a_bad_one() {
    // Applied before the statements run.
    let out = csv_with(
        &["--set", "datafusion.execution.batch_size=1234"],
        "SELECT value FROM information_schema.df_settings \
         WHERE name = 'datafusion.execution.batch_size'",
    );
    assert_eq!(out, "value\n1234\n");
    // An unknown key and a value the setting cannot take are named.
    for (setting, named) in [
        ("sqlfeed.no_such_setting=1", "sqlfeed.no_such_setting"),
        ("sqlfeed.late_materialization=maybe", "maybe"),
    ] {
        let (ok, _, err) = run(sqlfeed().args(["--set", setting, "-c", "SELECT 1"]));
        assert!(!ok, "{setting} was accepted");
        assert!(err.contains("cannot set") && err.contains(named), "{err}");
    }
    // Not KEY=VALUE.
    let (ok, _, err) = run(sqlfeed().args(["--set", "batch_size", "-c", "SELECT 1"]));
    assert!(!ok && err.contains("expected KEY=VALUE"), "{err}");
}

/// `--prometheus FILE` keeps the run's totals in Prometheus' text format,
/// labelled with the shard and `--prometheus-label`s, ending on the last
/// batch's numbers; a bad label is a usage error naming it.
#[test]
fn feed_keeps_its_totals_in_a_prometheus_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    gen_data(&dir.path().join("data"), 400, 2)?;
    let path = dir.path().join("metrics").join("sqlfeed.prom");
    std::fs::create_dir(dir.path().join("metrics"))?;
    succeeded(run(sqlfeed()
        .args([
            "feed",
            &format!("SELECT id FROM '{}/data/*.parquet'", dir.path().display()),
            "--batch-size",
            "50",
            "--shard",
            "1/2",
            "--device",
            "cpu",
            "--prometheus-every",
            "0.001",
            "--prometheus-label",
            "job=train \"a\"",
            "--prometheus",
        ])
        .arg(&path)));
    let text = std::fs::read_to_string(&path)?;
    let names: Vec<_> = std::fs::read_dir(path.parent().expect("a folder"))?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()?;
    assert_eq!(names, ["sqlfeed.prom"], "replaced whole, by a rename");
    let mut values = std::collections::HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').expect("a sample");
        let (name, labels) = name.split_once('{').expect("labels");
        assert_eq!(labels, r#"rank="1",world="2",job="train \"a\""}"#, "{line}");
        values.insert(name.to_string(), value.parse::<f64>().expect(value));
    }
    // 400 rows over 2 ranks: 4 batches of 50 each, then the next epoch.
    assert_eq!(values["sqlfeed_rows_total"], 200.0, "{text}");
    assert_eq!(values["sqlfeed_batches_total"], 4.0, "{text}");
    assert_eq!(values["sqlfeed_bytes_total"], 200.0 * 8.0, "{text}");
    assert_eq!(
        (values["sqlfeed_epoch"], values["sqlfeed_step"]),
        (1.0, 0.0)
    );
    assert!(
        values["sqlfeed_wait_seconds_total"] <= values["sqlfeed_running_seconds_total"]
    );
    assert_contains(&text, &["# TYPE sqlfeed_rows_total counter\n"]);

    let (ok, _, err) = run(sqlfeed().args([
        "feed",
        "SELECT 1 AS x",
        "--prometheus=m.prom",
        "--prometheus-label=job-name=x",
    ]));
    assert!(!ok, "a bad label name was accepted");
    assert!(
        err.contains("invalid value 'job-name=x' for '--prometheus-label")
            && err.contains("'job-name' is not a Prometheus label name"),
        "{err}"
    );
    Ok(())
}
