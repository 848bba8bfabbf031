//! The interactive REPL through a pseudo-terminal.

use std::time::Duration;

use rexpect::session::spawn_command;

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
