//! Runs SQL text and backslash commands for the REPL, `-c` and `-f`.

use std::io::{BufWriter, Write};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{RecordBatch, StringArray, UInt64Array};
use datafusion::error::{DataFusionError, Result};
use futures::StreamExt;

use super::command::{COMMANDS, Command, STATEMENTS};
use super::print::{OutputFormat, ResultWriter, render_table};
use super::progress::{Progress, ScanTotals};
use crate::session::Session;
use crate::sql::{self, Statement};

/// Whether the caller should go on after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Read the next input.
    Continue,
    /// `\q`: stop.
    Quit,
}

/// Output settings and the session statements run in.
pub struct Executor {
    /// Where statements run.
    pub session: Session,
    /// How results are written.
    pub format: OutputFormat,
    /// Rows shown per table result (`0` = all).
    pub max_rows: usize,
    /// Whether elapsed time follows table results.
    pub timing: bool,
    /// Whether a progress bar may be drawn (stderr is a terminal).
    pub progress: bool,
}

impl Executor {
    /// Runs `text`: SQL statements and lines that start with `\`. Stops at
    /// the first error.
    pub async fn run_text(&mut self, text: &str) -> Result<Flow> {
        let mut sql = String::new();
        for line in text.lines() {
            if line.trim_start().starts_with('\\') && sql.trim().is_empty() {
                sql.clear();
                let command = line.parse::<Command>().map_err(DataFusionError::Plan)?;
                if self.run_command(command).await? == Flow::Quit {
                    return Ok(Flow::Quit);
                }
            } else {
                sql.push_str(line);
                sql.push('\n');
                // A statement is complete at a `;` outside quotes: let the parser
                // decide when the buffer is runnable.
                if line.trim_end().ends_with(';') {
                    self.run_sql(&sql).await?;
                    sql.clear();
                }
            }
        }
        if !sql.trim().is_empty() {
            self.run_sql(&sql).await?;
        }
        Ok(Flow::Continue)
    }

    /// Parses and runs every statement of `sql`.
    pub async fn run_sql(&mut self, sql: &str) -> Result<()> {
        for statement in sql::parse_in(self.session.context(), sql)? {
            self.run_statement(statement).await?;
        }
        Ok(())
    }

    /// Runs one backslash command.
    pub async fn run_command(&mut self, command: Command) -> Result<Flow> {
        match command {
            Command::Quit => return Ok(Flow::Quit),
            Command::Help => self.print_text(&help_text())?,
            Command::ListTables => {
                self.run_sql(
                    "SELECT table_schema, table_name, table_type \
                     FROM information_schema.tables \
                     WHERE table_schema <> 'information_schema' \
                     ORDER BY table_schema, table_name;",
                )
                .await?
            }
            Command::Describe(table) => {
                self.run_sql(&format!("DESCRIBE {table};")).await?
            }
            Command::Functions(pattern) => self.print_functions(pattern.as_deref())?,
            Command::Timing(on) => {
                self.timing = on.unwrap_or(!self.timing);
                let state = if self.timing { "on" } else { "off" };
                self.print_text(&format!("timing is {state}\n"))?;
            }
            Command::Format(format) => self.format = format,
            Command::Cache => self.print_cache()?,
        }
        Ok(Flow::Continue)
    }

    async fn run_statement(&mut self, statement: Statement) -> Result<()> {
        self.run_statement_counting(statement, |_| 0).await?;
        Ok(())
    }

    /// Runs and prints `statement` like any other, and returns the sum of
    /// `count` over its result batches (e.g. the damaged files of `VERIFY`).
    pub async fn run_statement_counting(
        &mut self,
        statement: Statement,
        count: impl Fn(&RecordBatch) -> u64,
    ) -> Result<u64> {
        let start = Instant::now();
        let mut counted = 0;
        let df = self.session.plan(statement).await?;
        let plan = crate::exec::catch_panic(df.create_physical_plan()).await?;
        let schema = plan.schema();
        let progress = self.progress.then(|| {
            Progress::start(ScanTotals::of(&plan), self.session.io_counters_arc())
        });
        let mut stream = self.session.execute_stream(plan)?;
        let mut out = BufWriter::new(std::io::stdout());
        let mut writer = ResultWriter::new(self.format, &mut out, schema, self.max_rows)
            .with_max_width(self.format.fit_width());
        let mut rows = 0u64;
        while let Some(batch) = stream.next().await {
            let batch: RecordBatch = batch?;
            rows += batch.num_rows() as u64;
            counted += count(&batch);
            if let Some(p) = &progress {
                p.add_rows(batch.num_rows());
            }
            writer.write(&batch)?;
        }
        drop(progress);
        writer.finish(rows, self.timing.then(|| start.elapsed()))?;
        out.flush().map_err(DataFusionError::IoError)?;
        Ok(counted)
    }

    fn print_functions(&self, pattern: Option<&str>) -> Result<()> {
        let pattern = pattern.map(str::to_ascii_lowercase);
        // One function by its exact name: its whole documentation.
        if let Some((name, doc)) = sql::function_docs::documented_functions()
            .into_iter()
            .find(|(name, _)| Some(*name) == pattern.as_deref())
        {
            let text = sql::function_docs::function_markdown(name, &doc);
            let mut out = std::io::stdout().lock();
            return writeln!(out, "{}", text.trim_end())
                .map_err(DataFusionError::IoError);
        }
        let infos: Vec<_> = sqlfeed_udfs::functions()
            .into_iter()
            .chain(sql::function_infos())
            .filter(|f| pattern.as_ref().is_none_or(|p| f.name.contains(p.as_str())))
            .collect();
        let batch = RecordBatch::try_from_iter(vec![
            (
                "function",
                Arc::new(StringArray::from_iter_values(infos.iter().map(|f| f.name)))
                    as _,
            ),
            (
                "family",
                Arc::new(StringArray::from_iter_values(
                    infos.iter().map(|f| f.family),
                )) as _,
            ),
            (
                "signature",
                Arc::new(StringArray::from_iter_values(
                    infos.iter().map(|f| f.syntax),
                )) as _,
            ),
            (
                "description",
                Arc::new(StringArray::from_iter_values(
                    infos.iter().map(|f| f.description),
                )) as _,
            ),
        ])?;
        // A table whatever the format, fitted to the terminal unless wide.
        print_batch(&batch, OutputFormat::Table, self.format.fit_width())
    }

    fn print_cache(&self) -> Result<()> {
        let store = self.session.cache();
        let entries = store.entries();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let text = |values: Vec<String>| Arc::new(StringArray::from(values)) as _;
        let numbers = |values: Vec<u64>| Arc::new(UInt64Array::from(values)) as _;
        let batch = RecordBatch::try_from_iter(vec![
            ("key", text(entries.iter().map(|e| e.key.clone()).collect())),
            ("rows", numbers(entries.iter().map(|e| e.rows).collect())),
            (
                "disk_bytes",
                numbers(entries.iter().map(|e| e.disk_bytes).collect()),
            ),
            (
                "memory_bytes",
                numbers(entries.iter().map(|e| e.memory_bytes as u64).collect()),
            ),
            (
                "last_used",
                text(
                    entries
                        .iter()
                        .map(|e| format_age(now.saturating_sub(e.last_used_unix)))
                        .collect(),
                ),
            ),
            (
                "shared",
                text(
                    entries
                        .iter()
                        .map(|e| if e.persistent { "yes" } else { "session" }.to_string())
                        .collect(),
                ),
            ),
            (
                "query",
                text(entries.iter().map(|e| e.query.clone()).collect()),
            ),
        ])?;
        let total: u64 = entries.iter().map(|e| e.disk_bytes).sum();
        self.print_text(&format!(
            "cache directory {} ({total} of {} bytes used)\n",
            store.options().dir.display(),
            store.options().max_bytes
        ))?;
        print_batch(&batch, self.format, self.format.fit_width())
    }

    fn print_text(&self, text: &str) -> Result<()> {
        let mut out = std::io::stdout();
        out.write_all(text.as_bytes())
            .and_then(|_| out.flush())
            .map_err(DataFusionError::IoError)
    }
}

/// Writes one result batch, all rows, to stdout in `format`, a table fitted
/// to lines of `max_width` when given.
fn print_batch(
    batch: &RecordBatch,
    format: OutputFormat,
    max_width: Option<usize>,
) -> Result<()> {
    let mut out = BufWriter::new(std::io::stdout());
    let mut writer =
        ResultWriter::new(format, &mut out, batch.schema(), 0).with_max_width(max_width);
    writer.write(batch)?;
    writer.finish(batch.num_rows() as u64, None)?;
    out.flush().map_err(DataFusionError::IoError)
}

/// `90` → `1m 30s ago`.
fn format_age(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds}s ago"),
        60..3600 => format!("{}m {}s ago", seconds / 60, seconds % 60),
        3600..86400 => format!("{}h {}m ago", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{}d ago", seconds / 86400),
    }
}

fn help_text() -> String {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("command", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
    ]));
    let rows = |items: &[(&str, &str)]| -> Vec<Vec<String>> {
        items
            .iter()
            .map(|(a, b)| vec![a.to_string(), b.to_string()])
            .collect()
    };
    let mut text = render_table(&schema, &rows(COMMANDS));
    let statement_schema = Arc::new(Schema::new(vec![
        Field::new("statement", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
    ]));
    text.push_str(&render_table(&statement_schema, &rows(STATEMENTS)));
    text.push_str(
        "Statements end with ';'. Ctrl-C cancels a running query, Ctrl-D quits.\n",
    );
    text
}

/// Whether `err` is a write to a closed pipe (`sqlfeed … | head`), which the
/// binary treats as success.
pub fn is_broken_pipe(err: &DataFusionError) -> bool {
    let broken = |e: &std::io::Error| e.kind() == std::io::ErrorKind::BrokenPipe;
    match err {
        DataFusionError::IoError(e) => broken(e),
        DataFusionError::ArrowError(arrow, _) => match arrow.as_ref() {
            datafusion::arrow::error::ArrowError::IoError(_, e) => broken(e),
            other => other.to_string().contains("Broken pipe"),
        },
        DataFusionError::Context(_, inner) => is_broken_pipe(inner),
        other => other.to_string().contains("Broken pipe"),
    }
}
