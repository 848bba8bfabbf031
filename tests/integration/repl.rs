//! The interactive REPL through a pseudo-terminal.

use std::time::Duration;

use std::process::Command;

use rexpect::session::spawn_command;

use crate::cli::{twelve_columns, write_times};
use crate::common::{gen_data, run, sqlfeed};

const PROMPT: &str = "sqlfeed> ";

#[test]
fn repl_multiline_errors_cancel_completion_history_and_exit()
-> Result<(), rexpect::error::Error> {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history");
    let mut command = sqlfeed();
    command
        .env("SQLFEED_HISTORY", &history)
        .env("TERM", "xterm");
    let mut p = spawn_command(command, Some(30_000))?;
    p.exp_string(PROMPT)?;

    // A statement over two lines runs at the `;`.
    p.send_line("SELECT 40 +")?;
    p.send_line("2 AS answer;")?;
    p.exp_string("| 42")?;
    p.exp_string("1 row in")?;
    p.exp_string(PROMPT)?;

    // Bad SQL: an error with the position, and the REPL goes on.
    p.send_line("SELEC 1;")?;
    p.exp_string("Error")?;
    p.exp_string(PROMPT)?;

    // Ctrl-C cancels a long query and keeps the REPL.
    p.send_line("SELECT count(*) FROM generate_series(1, 100000000000);")?;
    std::thread::sleep(Duration::from_millis(1500));
    p.send_control('c')?;
    p.exp_string("Query cancelled.")?;
    p.exp_string(PROMPT)?;

    // Completion of a table and a column name.
    p.send_line("CREATE TABLE trips AS SELECT 7 AS trip_distance;")?;
    p.exp_string(PROMPT)?;
    for keys in ["SELECT trip_dis", "\t", " FROM tri", "\t", ";"] {
        p.send(keys)?;
        p.flush()?;
        std::thread::sleep(Duration::from_millis(200));
    }
    p.send_line("")?;
    p.exp_string("| 7")?;
    p.exp_string(PROMPT)?;

    // Ctrl-C at the prompt clears the line; Ctrl-D quits.
    p.send("SELECT 'never run'")?;
    p.send_control('c')?;
    p.exp_string(PROMPT)?;
    p.send_control('d')?;
    p.exp_eof()?;

    let saved = std::fs::read_to_string(&history).expect("history saved");
    assert!(saved.contains("2 AS answer;"), "{saved}");
    assert!(!saved.contains("never run"), "{saved}");
    Ok(())
}

/// Nine million join probes: long enough for the bar in a debug build.
fn slow_query(dir: &std::path::Path) -> String {
    format!(
        "SELECT count(*) AS n FROM '{}' AS a, generate_series(1, 3000) AS b \
         WHERE a.id + b.value < 0;",
        dir.display()
    )
}

#[test]
fn progress_bar_on_a_terminal_only() -> Result<(), rexpect::error::Error> {
    let dir = tempfile::tempdir().expect("tempdir");
    gen_data(dir.path(), 3000, 2).expect("data");
    let mut command = sqlfeed();
    command
        .env("TERM", "xterm")
        .env("SQLFEED_PROGRESS_DELAY_MS", "0")
        .args(["-c", &slow_query(dir.path())]);
    let mut p = spawn_command(command, Some(60_000))?;
    p.exp_regex(r"[0-2]/2 files, [0-9.]+ [KMG]?i?B of [0-9.]+ [KMG]?i?B, [0-9]+ rows")?;
    p.exp_string("| 0 ")?;
    p.exp_eof()?;

    // Piped stderr: no bar, whatever the delay.
    let (ok, _, err) = run(sqlfeed()
        .env("SQLFEED_PROGRESS_DELAY_MS", "0")
        .args(["-c", &slow_query(dir.path())]));
    assert!(ok, "{err}");
    assert!(!err.contains("files,"), "{err}");
    Ok(())
}

#[test]
fn feed_progress_bar_counts_the_run_on_a_terminal_only()
-> Result<(), rexpect::error::Error> {
    let dir = tempfile::tempdir().expect("tempdir");
    gen_data(dir.path(), 3000, 2).expect("data");
    let query = format!("SELECT f0 AS x FROM '{}/*.parquet'", dir.path().display());
    // 3,000 rows in batches of 100, two epochs from epoch 0 step 10: 20 + 30
    // batches, counted while the feed runs; 30 ms a step keeps it on screen.
    let feed_args = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "feed",
            query.as_str(),
            "--batch-size",
            "100",
            "--epochs",
            "2",
            "--resume",
            "0:10",
            "--step-ms",
            "30",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };
    let mut command = sqlfeed_in_columns(160);
    command.args(feed_args(&[]));
    let mut p = spawn_command(command, Some(60_000))?;
    p.exp_regex(r"[0-9]+/50 batches, [0-9]+ rows, [0-9]+ rows/s, waited [0-9.]+%")?;
    p.exp_string("50 batches, 5000 rows in")?;
    p.exp_eof()?;

    // --max-batches caps the total.
    let mut command = sqlfeed_in_columns(160);
    command.args(feed_args(&["--max-batches", "25"]));
    let mut p = spawn_command(command, Some(60_000))?;
    p.exp_regex(r"[0-9]+/25 batches")?;
    p.exp_eof()?;

    // Piped stderr: no bar.
    let (ok, _, err) = run(sqlfeed().args(feed_args(&[])));
    assert!(ok, "{err}");
    assert!(!err.contains("/50 batches"), "{err}");
    assert!(err.contains("50 batches, 5000 rows in"), "{err}");
    Ok(())
}

/// `text` as rexpect reads it: one `char` per byte of its UTF-8 (`…` is 3).
fn as_read(text: &str) -> String {
    text.bytes().map(char::from).collect()
}

/// The REPL in a pseudo-terminal `cols` columns wide (`stty` sets the window
/// size the binary reads: a fresh pty is 0 × 0, which says nothing).
fn sqlfeed_in_columns(cols: u16) -> Command {
    let inner = sqlfeed();
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("stty cols {cols} rows 50 && exec \"$0\" \"$@\""))
        .arg(inner.get_program());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    command.env("TERM", "xterm").env_remove("COLUMNS");
    command
}

#[test]
fn wide_results_fit_the_terminal_until_format_wide() -> Result<(), rexpect::error::Error>
{
    let dir = tempfile::tempdir().expect("tempdir");
    let times = write_times(dir.path()).expect("parquet with timestamps");
    let mut p = spawn_command(sqlfeed_in_columns(60), Some(30_000))?;
    p.exp_string(PROMPT)?;

    // 12 columns of 13 on 60: the first two and last two around a `…`.
    p.send_line(&format!("{};", twelve_columns()))?;
    p.exp_string(&as_read(
        "| c0         | c1         | … | c10        | c11        |",
    ))?;
    p.exp_string(&as_read(
        "| aaaaaaaaaa | aaaaaaaaaa | … | aaaaaaaaaa | aaaaaaaaaa |",
    ))?;
    p.exp_string("1 row (12 columns, 4 shown; \\format wide shows all) in")?;
    p.exp_string(PROMPT)?;

    // `\format wide`: every column, however wide the terminal.
    p.send_line("\\format wide")?;
    p.exp_string(PROMPT)?;
    p.send_line(&format!("{};", twelve_columns()))?;
    p.exp_string("| c4         | c5         | c6         |")?;
    p.exp_regex(r"\n1 row in [0-9.]+s")?;
    p.exp_string(PROMPT)?;

    // SUMMARIZE shows a timestamp's min and max as dates and times.
    p.send_line(&format!("SUMMARIZE '{}';", times.display()))?;
    p.exp_string("| 2013-01-01T10:00:00 ")?;
    p.exp_string("| 2013-01-02T11:30:00 ")?;
    p.exp_string("| 2013-01-01T10:00:00Z | 2013-01-02T11:30:00Z |")?;
    p.exp_string("4 rows in")?;
    p.exp_string(PROMPT)?;

    // And back to fitting: SUMMARIZE's 13 columns shrink to the terminal.
    p.send_line("\\format fit")?;
    p.exp_string(PROMPT)?;
    p.send_line(&format!("SUMMARIZE '{}';", times.display()))?;
    p.exp_string("| column_name | ")?;
    p.exp_string(&as_read(" | … | "))?;
    p.exp_string("4 rows (13 columns, ")?;
    p.exp_string(" shown; \\format wide shows all) in")?;
    p.exp_string(PROMPT)?;
    p.send_control('d')?;
    p.exp_eof()?;
    Ok(())
}
