//! Backslash commands of the REPL (`\d`, `\dt`, `\timing`, …).

use std::str::FromStr;

use super::print::OutputFormat;

/// One backslash command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `\q`: leave the REPL.
    Quit,
    /// `\?` / `\help`: list commands and statements.
    Help,
    /// `\dt` or a bare `\d`: list tables.
    ListTables,
    /// `\d <table>`: columns of a table, path or `(query)`.
    Describe(String),
    /// `\functions [pattern]`: sqlfeed's functions.
    Functions(Option<String>),
    /// `\timing [on|off]`: show elapsed time after each result.
    Timing(Option<bool>),
    /// `\format <fmt>`: output format of results.
    Format(OutputFormat),
    /// `\cache`: entries of the epoch cache.
    Cache,
}

/// `(syntax, description)` of every command, for `\help`.
pub const COMMANDS: &[(&str, &str)] = &[
    ("\\d", "list tables"),
    ("\\dt", "list tables"),
    (
        "\\d <table>",
        "columns of a table, a quoted path, or a (query)",
    ),
    (
        "\\functions [pattern|name]",
        "sqlfeed's functions; one name: its documentation and example",
    ),
    (
        "\\timing [on|off]",
        "show the elapsed time of each statement",
    ),
    (
        "\\format table|wide|csv|json|ndjson",
        "output format; table fits the terminal (… for the middle columns), wide shows all",
    ),
    (
        "\\cache",
        "entries of the epoch cache: key, rows, bytes, last use, query",
    ),
    ("\\help, \\?", "this help"),
    ("\\q", "quit (Ctrl-D too)"),
];

/// sqlfeed's own statements, for `\help`.
pub const STATEMENTS: &[(&str, &str)] = &[
    (
        "SELECT … FROM 'data/*.parquet'",
        "query files and URLs (s3://, gs://, az://, https://) directly",
    ),
    ("DESCRIBE <table>", "column names, types, nullability"),
    (
        "FROM '<delta table>' VERSION AS OF n",
        "a Delta Lake table at a version (or TIMESTAMP AS OF '…', '<path>@vN')",
    ),
    (
        "DESCRIBE HISTORY '<delta table>'",
        "a Delta Lake table's commits: version, time, operation",
    ),
    (
        "SUMMARIZE <table>",
        "per column: count, nulls, distinct, min, max, mean, stddev, quartiles",
    ),
    (
        "SAMPLE <table> <n> [SEED <s>]",
        "n uniform random rows, reproducible with a seed",
    ),
    (
        "<query> SHUFFLE [SEED s] [EPOCH e]",
        "the rows in a seeded global random order",
    ),
    (
        "MIX (<query>) [AS name] WEIGHT w, … [ROWS n] [SEED s] [EPOCH e]",
        "a weighted mixture, each source's share in every batch, columns source and source_id (WEIGHT STEPS (0: 0.6, 1000: 0.3) by step)",
    ),
    (
        "CACHE TABLE <name> AS <query>",
        "materialise once (memory, then disk); reused by later runs",
    ),
    (
        "UNCACHE TABLE [IF EXISTS] <name>",
        "drop a cached table (the disk entry stays for reuse)",
    ),
    ("CLEAR CACHE", "remove every entry of the cache directory"),
    (
        "VERIFY '<path>' [DECODE <col>, …]",
        "read every page (and decode image columns); one row per file: ok or where it fails",
    ),
    (
        "EXPLAIN [ANALYZE] <query>",
        "the plan, with metrics after ANALYZE",
    ),
];

impl FromStr for Command {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, Self::Err> {
        let line = line.trim().trim_end_matches(';').trim();
        let (name, arg) = match line.split_once(char::is_whitespace) {
            Some((name, arg)) => (name, Some(arg.trim().to_string())),
            None => (line, None),
        };
        let arg = arg.filter(|a| !a.is_empty());
        match (name, arg) {
            ("\\q" | "\\quit", None) => Ok(Self::Quit),
            ("\\?" | "\\help" | "\\h", None) => Ok(Self::Help),
            ("\\d" | "\\dt", None) => Ok(Self::ListTables),
            ("\\d", Some(table)) => Ok(Self::Describe(table)),
            ("\\functions" | "\\df", pattern) => Ok(Self::Functions(pattern)),
            ("\\timing", None) => Ok(Self::Timing(None)),
            ("\\timing", Some(v)) => match v.to_ascii_lowercase().as_str() {
                "on" => Ok(Self::Timing(Some(true))),
                "off" => Ok(Self::Timing(Some(false))),
                other => Err(format!("\\timing takes on or off, got '{other}'")),
            },
            ("\\format", Some(f)) => f.parse().map(Self::Format),
            ("\\cache", None) => Ok(Self::Cache),
            ("\\format", None) => {
                Err("\\format takes table, wide, csv, json or ndjson".into())
            }
            (name, _) => Err(format!("unknown command '{name}'; \\? lists the commands")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_and_arguments() {
        assert_eq!("\\q".parse(), Ok(Command::Quit));
        assert_eq!("\\d".parse(), Ok(Command::ListTables));
        assert_eq!("\\dt;".parse(), Ok(Command::ListTables));
        assert_eq!("\\cache".parse(), Ok(Command::Cache));
        assert_eq!(
            "\\d 'x.parquet'".parse(),
            Ok(Command::Describe("'x.parquet'".into()))
        );
        assert_eq!("\\timing off".parse(), Ok(Command::Timing(Some(false))));
        assert_eq!(
            "\\format csv".parse(),
            Ok(Command::Format(OutputFormat::Csv))
        );
        assert_eq!(
            "\\format wide".parse(),
            Ok(Command::Format(OutputFormat::Wide))
        );
        assert_eq!(
            "\\format fit".parse(),
            Ok(Command::Format(OutputFormat::Table))
        );
        assert_eq!(
            "\\functions std".parse(),
            Ok(Command::Functions(Some("std".into())))
        );
    }

    #[test]
    fn unknown_commands_point_to_help() {
        let err = "\\zz".parse::<Command>().expect_err("unknown");
        assert!(err.contains("\\?"), "{err}");
        assert!("\\timing maybe".parse::<Command>().is_err());
    }
}
