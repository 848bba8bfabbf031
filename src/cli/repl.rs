//! The interactive REPL: history, multi-line statements, completion, Ctrl-C.
//!
//! * A statement runs when the input ends with `;` (Enter inside it starts a
//!   new line); a line starting with `\` runs at once.
//! * Tab completes keywords, table names, column names and `\` commands.
//! * Ctrl-C at the prompt clears the line; during a query it cancels the
//!   query (its stream is dropped, which stops every task of the plan) and
//!   the REPL goes on. Ctrl-D or `\q` quits.
//! * History persists in `$SQLFEED_HISTORY` or `~/.sqlfeed_history`.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::keywords::ALL_KEYWORDS;
use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Config, Context, Editor, Helper};

use super::command::COMMANDS;
use super::exec::{Executor, Flow};

/// Statements of ours that sqlparser does not know as keywords.
const OUR_KEYWORDS: &[&str] = &["SUMMARIZE", "SAMPLE", "SEED", "HISTORY"];

/// Names offered by completion, refreshed after every statement.
#[derive(Debug, Default)]
struct CompletionWords {
    /// Table names of every catalog and schema.
    tables: BTreeSet<String>,
    /// Column names of those tables.
    columns: BTreeSet<String>,
}

/// rustyline helper: completion and the `;` validator.
struct ReplHelper {
    words: Arc<Mutex<CompletionWords>>,
}

impl Completer for ReplHelper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let before = &line[..pos];
        let start = before
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == '\\'))
            .map(|i| i + 1)
            .unwrap_or(0);
        let word = &before[start..];
        if word.is_empty() {
            return Ok((pos, vec![]));
        }
        let previous = before[..start]
            .split_whitespace()
            .next_back()
            .unwrap_or_default()
            .to_ascii_uppercase();
        Ok((
            start,
            self.candidates(word, TABLE_CONTEXT.contains(&previous.as_str())),
        ))
    }
}

/// Keywords after which only a table name makes sense.
const TABLE_CONTEXT: &[&str] = &[
    "FROM",
    "JOIN",
    "TABLE",
    "INTO",
    "DESCRIBE",
    "DESC",
    "SUMMARIZE",
    "SAMPLE",
    "\\D",
];

impl ReplHelper {
    /// Completions of `word`; only table names when `tables_only`.
    fn candidates(&self, word: &str, tables_only: bool) -> Vec<Pair> {
        let lower = word.to_ascii_lowercase();
        let mut out: BTreeSet<String> = BTreeSet::new();
        if word.starts_with('\\') {
            for (syntax, _) in COMMANDS {
                let name = syntax.split_whitespace().next().unwrap_or(syntax);
                if name.starts_with(word) {
                    out.insert(name.to_string());
                }
            }
        } else {
            if let Ok(words) = self.words.lock() {
                let columns = if tables_only {
                    None
                } else {
                    Some(&words.columns)
                };
                for name in words.tables.iter().chain(columns.into_iter().flatten()) {
                    if name.to_ascii_lowercase().starts_with(&lower) {
                        out.insert(name.clone());
                    }
                }
            }
            if tables_only {
                return out
                    .into_iter()
                    .map(|w| Pair {
                        display: w.clone(),
                        replacement: w,
                    })
                    .collect();
            }
            // Keywords in the case the user types them.
            let upper_typed = word.chars().any(|c| c.is_ascii_uppercase());
            for keyword in ALL_KEYWORDS.iter().chain(OUR_KEYWORDS) {
                if keyword.to_ascii_lowercase().starts_with(&lower) {
                    out.insert(if upper_typed {
                        keyword.to_string()
                    } else {
                        keyword.to_ascii_lowercase()
                    });
                }
            }
        }
        out.into_iter()
            .map(|w| Pair {
                display: w.clone(),
                replacement: w,
            })
            .collect()
    }
}

impl Hinter for ReplHelper {
    type Hint = String;
}

impl Highlighter for ReplHelper {
    fn highlight<'l>(&self, line: &'l str, _pos: usize) -> Cow<'l, str> {
        Cow::Borrowed(line)
    }
}

impl Validator for ReplHelper {
    fn validate(
        &self,
        ctx: &mut ValidationContext<'_>,
    ) -> rustyline::Result<ValidationResult> {
        let input = ctx.input().trim();
        let complete = input.is_empty()
            || input.starts_with('\\')
            || input.ends_with(';')
            || matches!(input.to_ascii_lowercase().as_str(), "quit" | "exit");
        Ok(if complete {
            ValidationResult::Valid(None)
        } else {
            ValidationResult::Incomplete
        })
    }
}

impl Helper for ReplHelper {}

fn history_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SQLFEED_HISTORY") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".sqlfeed_history"))
}

async fn refresh_words(ctx: &SessionContext, words: &Mutex<CompletionWords>) {
    let mut fresh = CompletionWords::default();
    for catalog_name in ctx.catalog_names() {
        let Some(catalog) = ctx.catalog(&catalog_name) else {
            continue;
        };
        for schema_name in catalog.schema_names() {
            if schema_name == "information_schema" {
                continue;
            }
            let Some(schema) = catalog.schema(&schema_name) else {
                continue;
            };
            for table_name in schema.table_names() {
                if let Ok(Some(table)) = schema.table(&table_name).await {
                    fresh
                        .columns
                        .extend(table.schema().fields().iter().map(|f| f.name().clone()));
                }
                fresh.tables.insert(table_name);
            }
        }
    }
    if let Ok(mut words) = words.lock() {
        *words = fresh;
    }
}

/// Runs the REPL until `\q`, Ctrl-D or an unrecoverable terminal error.
pub async fn run(exec: &mut Executor) -> anyhow::Result<()> {
    let config = Config::builder()
        .auto_add_history(false)
        .max_history_size(10_000)?
        .build();
    let words = Arc::new(Mutex::new(CompletionWords::default()));
    let mut editor: Editor<ReplHelper, DefaultHistory> = Editor::with_config(config)?;
    editor.set_helper(Some(ReplHelper {
        words: Arc::clone(&words),
    }));
    let history = history_path();
    if let Some(path) = &history {
        // A missing history file is the normal first start.
        let _ = editor.load_history(path);
    }
    println!(
        "sqlfeed {} — \\? for help, \\q to quit",
        env!("CARGO_PKG_VERSION")
    );
    refresh_words(exec.session.context(), &words).await;
    loop {
        match editor.readline("sqlfeed> ") {
            Ok(line) => {
                let text = line.trim();
                if text.is_empty() {
                    continue;
                }
                let _ = editor.add_history_entry(text);
                if matches!(text.to_ascii_lowercase().as_str(), "quit" | "exit") {
                    break;
                }
                let outcome = tokio::select! {
                    result = exec.run_text(text) => Some(result),
                    _ = tokio::signal::ctrl_c() => None,
                };
                match outcome {
                    Some(Ok(Flow::Quit)) => break,
                    Some(Ok(Flow::Continue)) => {}
                    Some(Err(e)) => eprintln!("Error: {e}"),
                    None => eprintln!("Query cancelled."),
                }
                refresh_words(exec.session.context(), &words).await;
            }
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(path) = &history
        && let Err(e) = editor.save_history(path)
    {
        eprintln!("warning: cannot save history to '{}': {e}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_tables_columns_keywords_and_commands() {
        let words = Arc::new(Mutex::new(CompletionWords {
            tables: ["trips".to_string()].into(),
            columns: ["trip_id".to_string()].into(),
        }));
        let helper = ReplHelper { words };
        let names = |w: &str| -> Vec<String> {
            helper
                .candidates(w, false)
                .into_iter()
                .map(|p| p.replacement)
                .collect()
        };
        let tri = names("tri");
        assert!(
            tri.contains(&"trip_id".to_string()) && tri.contains(&"trips".to_string())
        );
        assert!(tri.contains(&"trim".to_string()), "{tri:?}");
        assert!(names("SEL").contains(&"SELECT".to_string()));
        assert!(names("summ").contains(&"summarize".to_string()));
        assert_eq!(names("\\ti"), vec!["\\timing"]);
        let tables: Vec<String> = helper
            .candidates("tri", true)
            .into_iter()
            .map(|p| p.replacement)
            .collect();
        assert_eq!(tables, vec!["trips"]);
    }
}
