//! sqlfeed's SQL dialect: DataFusion SQL plus the statements of a data tool.
//!
//! | statement                          | what it does                                   |
//! |------------------------------------|------------------------------------------------|
//! | any DataFusion statement           | planned by DataFusion unchanged                |
//! | `SUMMARIZE <table>`                | per-column profile: counts, nulls, distinct, min/max, mean, stddev, quartiles |
//! | `SAMPLE <table> <n> [SEED <s>]`    | `n` uniform random rows, the same for the same seed and data |
//! | `DESCRIBE <table>`                 | column names, types and nullability            |
//! | `DESCRIBE HISTORY '<path>'`        | a Delta Lake table's commits, newest first (see [`delta`]) |
//! | `FROM '<path>' VERSION AS OF n`    | a Delta Lake table at version `n` (also `TIMESTAMP AS OF '…'`, `'<path>@v<n>'`) |
//! | `<query> SHUFFLE [SEED s] [EPOCH e]` | the rows in a seeded global random order (see [`crate::shuffle`]); wherever a query ends (see `shuffle_clause.rs`) |
//! | `<query> LOCAL SHUFFLE BUFFER n [SEED s]` | a streaming shuffle buffer per partition; the same places |
//! | `CACHE TABLE name AS <query>`      | materialise once into the epoch cache (see [`crate::cache`]) |
//! | `UNCACHE TABLE [IF EXISTS] name`   | drop a cached table (its disk entry stays for reuse) |
//! | `CLEAR CACHE`                      | remove every entry of the cache directory      |
//! | `VERIFY '<path>' [DECODE c, …]`    | read every page (and decode image columns) of the files; one row per file (see [`verify`]) |
//!
//! `<table>` is a table name, a quoted path or URL as in `FROM`
//! (`'data/*.parquet'`, `'s3://bucket/x/'`), or a parenthesised query.
//!
//! # How it parses
//! Our keywords are not sqlparser keywords, so the parser peeks at the first
//! token of each statement: ours are parsed here with sqlparser's primitives,
//! everything else goes to DataFusion's [`DFParser`] on the same token stream,
//! so error positions refer to the whole input. `SHUFFLE` clauses are
//! rewritten at the token level first, into derived tables the planner
//! recognises (see `shuffle_clause.rs`): after `FROM t` sqlparser would take
//! the word for a table alias (the pattern of datafusion-cli and DataFusion's
//! `sql_ops/dialect.rs` example).

mod cache_statements;
#[cfg(feature = "delta")]
pub mod delta;
mod explore;
pub mod file_errors;
mod folder_glob;
pub mod function_docs;
mod functions;
mod isolate_row_errors;
mod mix_clause;
pub mod no_new_evaluations;
mod parallel_projection;
mod planner;
pub mod rules;
mod shuffle_clause;
mod table_formats;
pub mod url_table;
pub mod verify;

use datafusion::common::plan_datafusion_err;
use datafusion::common::plan_err;
use datafusion::dataframe::DataFrame;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::{
    DFParser, DFParserBuilder, ParserInput, Statement as DFStatement,
};
use datafusion::sql::sqlparser::ast::{ObjectName, Query};
use datafusion::sql::sqlparser::dialect::{Dialect, GenericDialect, dialect_from_str};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};

pub use isolate_row_errors::{
    IsolateRowErrors, isolate_output_projections, isolating_schema,
};
pub use parallel_projection::{ParallelFunctions, ParallelProjectionExec};
pub use verify::{VerifyExec, VerifyFile, VerifySpec};

pub use functions::{ByteLengthFunc, RowKeyFunc, infos as function_infos};
pub use planner::SqlfeedQueryPlanner;

/// One parsed statement of sqlfeed SQL.
#[derive(Debug, Clone)]
pub enum Statement {
    /// A statement DataFusion plans itself.
    DataFusion(Box<DFStatement>),
    /// `DESCRIBE <table>` for a path or a query (names go to DataFusion).
    Describe(TableTarget),
    /// `DESCRIBE HISTORY '<path>'`: a Delta Lake table's commits.
    DescribeHistory(String),
    /// `SUMMARIZE <table>`.
    Summarize(TableTarget),
    /// `SAMPLE <table> <rows> [SEED <seed>]`.
    Sample {
        /// What to sample from.
        target: TableTarget,
        /// Number of rows wanted (fewer if the table is smaller).
        rows: u64,
        /// Seed of the sample; `None` draws a fresh one.
        seed: Option<u64>,
    },
    /// `CACHE TABLE name AS <query>`.
    CacheTable {
        /// The table name the result is registered under.
        name: ObjectName,
        /// The query.
        query: Box<DFStatement>,
    },
    /// `UNCACHE TABLE [IF EXISTS] name`.
    UncacheTable {
        /// The cached table.
        name: ObjectName,
        /// No error when there is no such table.
        if_exists: bool,
    },
    /// `CLEAR CACHE`.
    ClearCache,
    /// `VERIFY '<path or glob>' [DECODE <column>[, …]]`.
    Verify(VerifySpec),
}

/// The `<table>` of our statements.
#[derive(Debug, Clone, PartialEq)]
pub enum TableTarget {
    /// A table in the catalog.
    Name(ObjectName),
    /// A quoted path or URL, resolved like `FROM 'path'`.
    Path(String),
    /// A parenthesised query.
    Query(Box<Query>),
}

impl TableTarget {
    /// The SQL text that names this target after `FROM`.
    pub fn from_clause(&self) -> String {
        match self {
            TableTarget::Name(name) => name.to_string(),
            TableTarget::Path(path) => format!("'{}'", path.replace('\'', "''")),
            TableTarget::Query(query) => format!("({query}) AS __sqlfeed_subquery"),
        }
    }
}

/// Parses `sql` into statements in DataFusion's default (generic) dialect;
/// errors carry the parser's position.
pub fn parse(sql: &str) -> Result<Vec<Statement>> {
    parse_with_dialect(sql, &GenericDialect {}, DEFAULT_RECURSION_LIMIT)
}

/// DataFusion's default `datafusion.sql_parser.recursion_limit`.
const DEFAULT_RECURSION_LIMIT: usize = 50;

/// Parses `sql` as `ctx` would: in its `datafusion.sql_parser.dialect` and
/// recursion limit (`SET datafusion.sql_parser.dialect = 'MySQL'` applies to
/// sqlfeed's statements too).
pub fn parse_in(ctx: &SessionContext, sql: &str) -> Result<Vec<Statement>> {
    let options = ctx.state().config().options().sql_parser.clone();
    let dialect = dialect_from_str(options.dialect.as_ref()).ok_or_else(|| {
        plan_datafusion_err!("unsupported SQL dialect: {}", options.dialect)
    })?;
    parse_with_dialect(sql, dialect.as_ref(), options.recursion_limit.get())
}

/// Parses `sql` into statements in `dialect`.
fn parse_with_dialect(
    sql: &str,
    dialect: &dyn Dialect,
    recursion_limit: usize,
) -> Result<Vec<Statement>> {
    let tokens = Tokenizer::new(dialect, sql)
        .tokenize_with_location()
        .map_err(|e| parse_error(e.to_string()))?;
    let mut statements = Vec::new();
    for tokens in split_statements(tokens) {
        if tokens.iter().all(|t| is_blank(&t.token)) {
            continue;
        }
        #[cfg(feature = "delta")]
        let tokens = delta::rewrite_time_travel(tokens)?;
        let tokens = mix_clause::rewrite(tokens)?;
        let tokens = shuffle_clause::rewrite(tokens)?;
        let mut parser = DFParserBuilder::new(ParserInput::Tokens(tokens))
            .with_dialect(dialect)
            .with_recursion_limit(recursion_limit)
            .build()?;
        let statement = parse_one(&mut parser).map_err(|e| with_end_position(e, sql))?;
        expect_end(&parser)?;
        statements.push(statement);
    }
    Ok(statements)
}

fn is_blank(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_) | Token::EOF)
}

/// Splits tokens at `;` outside parentheses.
fn split_statements(tokens: Vec<TokenWithSpan>) -> Vec<Vec<TokenWithSpan>> {
    let mut statements = vec![Vec::new()];
    let mut depth = 0i32;
    for token in tokens {
        match token.token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            Token::SemiColon if depth <= 0 => {
                statements.push(Vec::new());
                continue;
            }
            _ => {}
        }
        if let Some(current) = statements.last_mut() {
            current.push(token);
        }
    }
    statements
}

fn expect_end(parser: &DFParser<'_>) -> Result<()> {
    let next = parser.parser.peek_token();
    if next.token == Token::EOF {
        Ok(())
    } else {
        Err(parse_error(format!(
            "expected ';' between statements, found {next} at Line: {}, Column: {}",
            next.span.start.line, next.span.start.column
        )))
    }
}

fn parse_one(parser: &mut DFParser<'_>) -> Result<Statement> {
    let first = parser.parser.peek_token();
    let keyword = match &first.token {
        Token::Word(word) => word.value.to_ascii_uppercase(),
        _ => String::new(),
    };
    match keyword.as_str() {
        "SUMMARIZE" => {
            parser.parser.next_token();
            Ok(Statement::Summarize(parse_target(parser)?))
        }
        "SAMPLE" => {
            parser.parser.next_token();
            let target = parse_target(parser)?;
            let rows = parser.parser.parse_literal_uint().map_err(|e| {
                parse_error(format!("SAMPLE <table> <rows> [SEED <seed>]: {e}"))
            })?;
            let seed = if next_word_is(parser, "SEED") {
                parser.parser.next_token();
                Some(parser.parser.parse_literal_uint().map_err(|e| {
                    parse_error(format!("SEED takes a non-negative integer: {e}"))
                })?)
            } else {
                None
            };
            Ok(Statement::Sample { target, rows, seed })
        }
        "CACHE" => {
            parser.parser.next_token();
            expect_word(parser, "TABLE", "CACHE TABLE <name> AS <query>")?;
            let name = parser.parser.parse_object_name(false).map_err(|e| {
                parse_error(format!("CACHE TABLE <name> AS <query>: {e}"))
            })?;
            expect_word(parser, "AS", "CACHE TABLE <name> AS <query>")?;
            let query = parser.parser.parse_query().map_err(|e| {
                parse_error(format!("CACHE TABLE <name> AS <query>: {e}"))
            })?;
            let query = DFStatement::Statement(Box::new(
                datafusion::sql::sqlparser::ast::Statement::Query(query),
            ));
            Ok(Statement::CacheTable {
                name,
                query: Box::new(query),
            })
        }
        "UNCACHE" => {
            parser.parser.next_token();
            expect_word(parser, "TABLE", "UNCACHE TABLE [IF EXISTS] <name>")?;
            let if_exists = next_word_is(parser, "IF");
            if if_exists {
                parser.parser.next_token();
                expect_word(parser, "EXISTS", "UNCACHE TABLE [IF EXISTS] <name>")?;
            }
            let name = parser.parser.parse_object_name(false).map_err(|e| {
                parse_error(format!("UNCACHE TABLE [IF EXISTS] <name>: {e}"))
            })?;
            Ok(Statement::UncacheTable { name, if_exists })
        }
        "CLEAR" => {
            parser.parser.next_token();
            expect_word(parser, "CACHE", "CLEAR CACHE")?;
            Ok(Statement::ClearCache)
        }
        "VERIFY" => {
            parser.parser.next_token();
            Ok(Statement::Verify(parse_verify(parser)?))
        }
        "DESCRIBE" | "DESC" => {
            let after = parser.parser.peek_nth_token(1);
            if matches!(&after.token, Token::Word(w) if w.value.eq_ignore_ascii_case("HISTORY"))
            {
                parser.parser.next_token();
                parser.parser.next_token();
                let next = parser.parser.peek_token();
                let Token::SingleQuotedString(path) = &next.token else {
                    return Err(parse_error(format!(
                        "DESCRIBE HISTORY '<Delta table path or URL>': expected a quoted \
                         path, found {next} at Line: {}, Column: {}",
                        next.span.start.line, next.span.start.column
                    )));
                };
                let path = path.clone();
                parser.parser.next_token();
                return Ok(Statement::DescribeHistory(path));
            }
            if matches!(after.token, Token::SingleQuotedString(_) | Token::LParen) {
                parser.parser.next_token();
                Ok(Statement::Describe(parse_target(parser)?))
            } else {
                Ok(Statement::DataFusion(Box::new(parser.parse_statement()?)))
            }
        }
        _ => Ok(Statement::DataFusion(Box::new(parser.parse_statement()?))),
    }
}

const VERIFY_SYNTAX: &str = "VERIFY '<path or glob>' [DECODE <column>[, <column>…]]";

/// The rest of `VERIFY '<path>' [DECODE a, b]`.
fn parse_verify(parser: &mut DFParser<'_>) -> Result<VerifySpec> {
    let next = parser.parser.peek_token();
    let Token::SingleQuotedString(path) = &next.token else {
        return Err(parse_error(format!(
            "{VERIFY_SYNTAX}: expected a quoted path, found {next} at Line: {}, Column: {}",
            next.span.start.line, next.span.start.column
        )));
    };
    let path = path.clone();
    parser.parser.next_token();
    let mut decode = Vec::new();
    if next_word_is(parser, "DECODE") {
        parser.parser.next_token();
        loop {
            let column = parser
                .parser
                .parse_identifier()
                .map_err(|e| parse_error(format!("{VERIFY_SYNTAX}: {e}")))?;
            decode.push(column.value);
            if !parser.parser.consume_token(&Token::Comma) {
                break;
            }
        }
    }
    Ok(VerifySpec { path, decode })
}

/// sqlparser reports "found: EOF" without a position; add where input ends.
fn with_end_position(error: DataFusionError, sql: &str) -> DataFusionError {
    let message = error.to_string();
    if message.contains("Line:") || !message.contains("EOF") {
        return error;
    }
    let line = sql.lines().count().max(1);
    let column = sql
        .lines()
        .last()
        .map(|l| l.chars().count() + 1)
        .unwrap_or(1);
    // The parser's own message, not its Display with the wrappers.
    let reason = match &error {
        DataFusionError::SQL(inner, _) => match inner.as_ref() {
            datafusion::sql::sqlparser::parser::ParserError::ParserError(m)
            | datafusion::sql::sqlparser::parser::ParserError::TokenizerError(m) => {
                m.clone()
            }
            other => other.to_string(),
        },
        _ => message.trim_start_matches("SQL error: ").to_string(),
    };
    parse_error(format!(
        "{reason} at the end of the input (Line: {line}, Column: {column}): the statement is incomplete"
    ))
}

/// Consumes `word` or fails naming the statement's syntax.
fn expect_word(parser: &mut DFParser<'_>, word: &str, syntax: &str) -> Result<()> {
    if next_word_is(parser, word) {
        parser.parser.next_token();
        return Ok(());
    }
    let found = parser.parser.peek_token();
    Err(parse_error(format!(
        "{syntax}: expected {word}, found {found} at Line: {}, Column: {}",
        found.span.start.line, found.span.start.column
    )))
}

fn next_word_is(parser: &DFParser<'_>, word: &str) -> bool {
    matches!(&parser.parser.peek_token().token, Token::Word(w) if w.value.eq_ignore_ascii_case(word))
}

fn parse_target(parser: &mut DFParser<'_>) -> Result<TableTarget> {
    let next = parser.parser.peek_token();
    match &next.token {
        Token::SingleQuotedString(path) => {
            let path = path.clone();
            parser.parser.next_token();
            Ok(TableTarget::Path(path))
        }
        Token::LParen => {
            parser.parser.next_token();
            let query = parser
                .parser
                .parse_query()
                .map_err(|e| parse_error(e.to_string()))?;
            parser
                .parser
                .expect_token(&Token::RParen)
                .map_err(|e| parse_error(e.to_string()))?;
            Ok(TableTarget::Query(query))
        }
        Token::Word(_) => parser
            .parser
            .parse_object_name(false)
            .map(TableTarget::Name)
            .map_err(|e| parse_error(e.to_string())),
        _ => Err(parse_error(format!(
            "expected a table name, a quoted path or a (query), found {next} at Line: {}, \
             Column: {}",
            next.span.start.line, next.span.start.column
        ))),
    }
}

/// Whether a table name is meant as a path or URL rather than a catalog name.
pub(crate) fn looks_like_path(name: &str) -> bool {
    name.contains("://")
        || name.contains('/')
        || name.contains('*')
        || name.ends_with(".parquet")
        || name.ends_with(".csv")
        || name.ends_with(".json")
        || name.ends_with(".arrow")
}

/// A seed for `SAMPLE` or `SHUFFLE` without `SEED`: different on every run.
pub(crate) fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    xxhash_rust::xxh3::xxh3_64(&nanos.to_le_bytes())
}

fn parse_error(message: String) -> DataFusionError {
    DataFusionError::SQL(
        Box::new(datafusion::sql::sqlparser::parser::ParserError::ParserError(message)),
        None,
    )
}

/// The functions sqlfeed's own statements plan with (`SAMPLE`, `SHUFFLE`).
pub fn internal_functions() -> Vec<datafusion::logical_expr::ScalarUDF> {
    vec![
        datafusion::logical_expr::ScalarUDF::from(RowKeyFunc::new()),
        datafusion::logical_expr::ScalarUDF::from(ByteLengthFunc::new()),
    ]
}

/// Parses and plans one statement of sqlfeed SQL in `ctx`, any DataFusion
/// context (a [`crate::Session`] does this in its own): the dialect's
/// statements and clauses on top of DataFusion's SQL.
pub async fn plan_sql(ctx: &SessionContext, sql: &str) -> Result<DataFrame> {
    let mut statements = parse_in(ctx, sql)?;
    match statements.len() {
        1 => plan_statement(ctx, statements.remove(0)).await,
        0 => plan_err!("no SQL statement given"),
        n => plan_err!("expected one SQL statement, got {n}; run them one by one"),
    }
}

/// Puts the operators of sqlfeed's clauses (`SHUFFLE`, `MIX`) where the
/// token rewrites marked them, anywhere in `plan`.
pub(crate) fn apply_markers(
    plan: datafusion::logical_expr::LogicalPlan,
) -> Result<datafusion::logical_expr::LogicalPlan> {
    mix_clause::apply_markers(shuffle_clause::apply_markers(plan)?)
}

/// Plans one statement into a DataFrame.
pub(crate) async fn plan_statement(
    ctx: &SessionContext,
    statement: Statement,
) -> Result<DataFrame> {
    match statement {
        Statement::DataFusion(statement) => {
            let state = ctx.state();
            let plan = state.statement_to_plan(*statement).await?;
            ctx.execute_logical_plan(apply_markers(plan)?).await
        }
        Statement::Describe(target) => explore::describe(ctx, &target).await,
        Statement::DescribeHistory(path) => describe_history(ctx, &path).await,
        Statement::Summarize(target) => explore::summarize(ctx, &target).await,
        Statement::Sample { target, rows, seed } => {
            explore::sample(ctx, &target, rows, seed).await
        }
        Statement::CacheTable { name, query } => {
            cache_statements::cache_table(ctx, &name, *query).await
        }
        Statement::UncacheTable { name, if_exists } => {
            cache_statements::uncache_table(ctx, &name, if_exists).await
        }
        Statement::ClearCache => cache_statements::clear_cache(ctx),
        Statement::Verify(spec) => verify::verify(ctx, &spec).await,
    }
}

/// `DESCRIBE HISTORY '<path>'`.
async fn describe_history(ctx: &SessionContext, path: &str) -> Result<DataFrame> {
    #[cfg(feature = "delta")]
    {
        let history = delta::history(&ctx.state(), path).await?;
        ctx.read_batch(history)
    }
    #[cfg(not(feature = "delta"))]
    {
        let _ = ctx;
        plan_err!(
            "DESCRIBE HISTORY '{path}' reads a Delta Lake table's log, and this sqlfeed \
             was built without Delta Lake support (the `delta` feature)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_statements_and_recognises_ours() -> Result<()> {
        let statements = parse(
            "SELECT 1; SUMMARIZE 'data/*.parquet'; SAMPLE t 10 SEED 7;\
             SAMPLE (SELECT * FROM t WHERE x > 1) 3; DESCRIBE 'a.parquet'; DESCRIBE t",
        )?;
        assert_eq!(statements.len(), 6);
        assert!(matches!(statements[0], Statement::DataFusion(_)));
        assert!(
            matches!(&statements[1], Statement::Summarize(TableTarget::Path(p)) if p == "data/*.parquet")
        );
        assert!(matches!(
            &statements[2],
            Statement::Sample {
                target: TableTarget::Name(_),
                rows: 10,
                seed: Some(7)
            }
        ));
        assert!(matches!(
            &statements[3],
            Statement::Sample {
                target: TableTarget::Query(_),
                rows: 3,
                seed: None
            }
        ));
        assert!(matches!(
            statements[4],
            Statement::Describe(TableTarget::Path(_))
        ));
        assert!(matches!(statements[5], Statement::DataFusion(_)));
        Ok(())
    }

    #[test]
    fn parses_the_cache_statements() -> Result<()> {
        let statements = parse(
            "CACHE TABLE feats AS SELECT a, b FROM 'x.parquet' WHERE a > 1; \
             UNCACHE TABLE IF EXISTS feats; uncache table feats; CLEAR CACHE",
        )?;
        assert!(matches!(
            &statements[0],
            Statement::CacheTable { name, query }
                if name.to_string() == "feats" && query.to_string().contains("WHERE a > 1")
        ));
        assert!(matches!(
            &statements[1],
            Statement::UncacheTable {
                if_exists: true,
                ..
            }
        ));
        assert!(matches!(
            &statements[2],
            Statement::UncacheTable {
                if_exists: false,
                ..
            }
        ));
        assert!(matches!(statements[3], Statement::ClearCache));
        shuffle_clause::assert_refused(
            parse,
            &[
                ("CACHE feats AS SELECT 1", "expected TABLE"),
                ("CACHE TABLE feats SELECT 1", "expected AS"),
                ("CACHE TABLE feats AS", "CACHE TABLE <name> AS <query>"),
                ("CLEAR", "CLEAR CACHE: expected CACHE"),
            ],
        );
        Ok(())
    }

    #[test]
    fn parses_verify() -> Result<()> {
        let statements =
            parse("VERIFY 'data/*.parquet'; verify 's3://b/x/' DECODE image, \"Thumb\"")?;
        assert!(matches!(
            &statements[0],
            Statement::Verify(VerifySpec { path, decode }) if path == "data/*.parquet" && decode.is_empty()
        ));
        assert!(matches!(
            &statements[1],
            Statement::Verify(VerifySpec { path, decode })
                if path == "s3://b/x/" && decode == &["image".to_string(), "Thumb".to_string()]
        ));
        shuffle_clause::assert_refused(
            parse,
            &[
                ("VERIFY t", "expected a quoted path, found t"),
                ("VERIFY 'x' DECODE", "VERIFY '<path or glob>'"),
                ("VERIFY 'x' DECODE a,", "VERIFY '<path or glob>'"),
                ("VERIFY 'x' SELECT 1", "expected ';'"),
            ],
        );
        Ok(())
    }

    #[test]
    fn bad_sql_reports_the_position() {
        let err = parse("SELECT * FROM t WHERE x = ").expect_err("incomplete");
        let msg = err.to_string();
        assert!(msg.contains("Line: 1, Column: 27"), "{msg}");
        let err = parse("SELECT * FROM t WHERE AND x").expect_err("bad token");
        assert!(err.to_string().contains("Line: 1, Column: 27"), "{err}");
    }

    #[test]
    fn sample_needs_a_row_count() {
        let err = parse("SAMPLE t SEED 1").expect_err("no count");
        assert!(err.to_string().contains("SAMPLE <table> <rows>"), "{err}");
    }

    #[test]
    fn missing_delimiter_is_an_error() {
        assert!(parse("SUMMARIZE t SELECT 1").is_err());
    }

    #[test]
    fn paths_are_quoted_back_safely() {
        let target = TableTarget::Path("it's.parquet".into());
        assert_eq!(target.from_clause(), "'it''s.parquet'");
    }
}
