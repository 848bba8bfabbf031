//! The `SHUFFLE [WINDOW n] [SEED s] [EPOCH e]` and `LOCAL SHUFFLE BUFFER n [SEED s]`
//! clauses, wherever a query expression ends: at the end of a statement, of a
//! subquery, of a CTE, of a parenthesised set-operation branch, before
//! `LIMIT`/`OFFSET`, after `CACHE TABLE … AS` and under any `EXPLAIN`.
//!
//! # How
//! sqlparser knows no such clause, and after `FROM t` it would take
//! `SHUFFLE` for a table alias. So before DataFusion parses the statement,
//! each clause is rewritten at the token level into a derived table whose
//! alias carries the spec:
//!
//! ```text
//!   SELECT a FROM t WHERE x SHUFFLE SEED 7 EPOCH 2 LIMIT 10
//!   └────────── query ─────┘└──── clause ────────┘
//!   SELECT * FROM (SELECT a FROM t WHERE x) AS __sqlfeed_shuffle_7_2_0 LIMIT 10
//! ```
//!
//! and [`apply_markers`] puts a [`ShuffleNode`] under every such alias of the
//! planned statement (also inside subqueries, views and `EXPLAIN`). The
//! query is everything back to the unmatched `(` that opens it, or at the
//! top level to the statement's first `SELECT`/`WITH`/`VALUES`; the rewritten
//! tokens keep their positions, so errors still point into the input.
//!
//! # Non-reserved
//! `shuffle`, `seed`, `epoch`, `local` and `buffer` stay usable as names: a
//! word `SHUFFLE` is the clause only when a query can end before it (it
//! follows a name, a literal or `)`, not `AS`, `SELECT`, `,`, `.`, `BY`,
//! `FROM` …) and the clause can follow it (`SEED`, `EPOCH`, `LIMIT`,
//! `OFFSET`, `FETCH`, `)`, `;` or the end). `SELECT 1 AS shuffle`,
//! `SELECT shuffle FROM t` and `FROM shuffle` are names; `FROM t SHUFFLE` is
//! the clause (write `FROM t AS shuffle` for the alias).
//!
//! [`ShuffleNode`]: crate::shuffle::ShuffleNode

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::error::Result;
use datafusion::logical_expr::{LogicalPlan, SubqueryAlias};
use datafusion::sql::sqlparser::tokenizer::{Span, Token, TokenWithSpan, Whitespace};

use super::{fresh_seed, parse_error};
use crate::shuffle::ShuffleSpec;

/// Prefix of the derived-table alias of a global shuffle.
const GLOBAL_ALIAS: &str = "__sqlfeed_shuffle_";
/// Prefix of the derived-table alias of a windowed shuffle.
const WINDOWED_ALIAS: &str = "__sqlfeed_window_shuffle_";
/// Prefix of the derived-table alias of a local shuffle.
const LOCAL_ALIAS: &str = "__sqlfeed_local_shuffle_";
/// Prefix of the derived-table alias of a shuffle by position.
const POSITION_ALIAS: &str = "__sqlfeed_position_shuffle_";

pub(super) fn word(token: &Token) -> Option<String> {
    match token {
        Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
        _ => None,
    }
}

pub(super) fn position(token: &TokenWithSpan) -> String {
    format!(
        "Line: {}, Column: {}",
        token.span.start.line, token.span.start.column
    )
}

pub(super) fn is_blank(token: &Token) -> bool {
    matches!(token, Token::Whitespace(_) | Token::EOF)
}

/// Words after which a `SHUFFLE` is a name, not the clause.
const NAME_CONTEXT: &[&str] = &[
    "AS",
    "SELECT",
    "DISTINCT",
    "BY",
    "FROM",
    "JOIN",
    "TABLE",
    "ON",
    "WHERE",
    "AND",
    "OR",
    "NOT",
    "HAVING",
    "THEN",
    "ELSE",
    "WHEN",
    "CASE",
    "IS",
    "IN",
    "LIKE",
    "ILIKE",
    "INTO",
    "SET",
    "ALL",
    "ANY",
    "SOME",
    "EXISTS",
    "USING",
    "RETURNING",
    "UNION",
    "EXCEPT",
    "INTERSECT",
    "WITH",
    "VALUES",
    "LATERAL",
    "DESCRIBE",
    "DESC",
    "ASC",
    "BETWEEN",
];

/// Words (and `)`/`;`/the end) that can follow a complete clause.
const AFTER_CLAUSE: &[&str] =
    &["SEED", "EPOCH", "WINDOW", "BY", "LIMIT", "OFFSET", "FETCH"];

/// A clause found in the tokens: `tokens[start..end]` (`start` at `LOCAL` or
/// `SHUFFLE`), and what it asks for.
struct Clause {
    start: usize,
    end: usize,
    spec: ShuffleSpec,
}

/// Rewrites every shuffle clause of one statement's tokens into a marked
/// derived table (see the module docs).
pub(super) fn rewrite(tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    let mut tokens = rewrite_samples(tokens)?;
    let mut count = 0usize;
    while let Some(clause) = find_clause(&tokens)? {
        let query_start = query_start(&tokens, clause.start)?;
        let alias = match clause.spec {
            ShuffleSpec::Global { seed, epoch } => {
                format!("{GLOBAL_ALIAS}{seed}_{epoch}_{count}")
            }
            ShuffleSpec::Windowed {
                seed,
                epoch,
                window_rows,
                ..
            } => format!("{WINDOWED_ALIAS}{seed}_{epoch}_{window_rows}_{count}"),
            ShuffleSpec::Positional { seed, epoch } => {
                format!("{POSITION_ALIAS}{seed}_{epoch}_{count}")
            }
            ShuffleSpec::Local { buffer_rows, seed } => {
                format!("{LOCAL_ALIAS}{buffer_rows}_{seed}_{count}")
            }
        };
        count += 1;
        let span = tokens[clause.start].span;
        // SELECT * FROM (<query>) AS <alias>
        let mut wrapped = select_star_from(span);
        wrapped.push(TokenWithSpan::new(Token::LParen, span));
        wrapped.extend(tokens[query_start..clause.start].iter().cloned());
        wrapped.extend(each_then_space(
            span,
            [
                Token::RParen,
                Token::make_keyword("AS"),
                Token::make_word(&alias, None),
            ],
        ));
        tokens.splice(query_start..clause.end, wrapped);
    }
    Ok(tokens)
}

/// `(SAMPLE <table> <n> [SEED s])` as a table expression (a subquery, a CTE
/// body) becomes `(SELECT * FROM <table> SHUFFLE SEED s LIMIT n)`, which is
/// what the `SAMPLE` statement returns; `<table>` is a name, a quoted path or
/// a `(query)`. Anything else after `(SAMPLE` is left alone (`(sample)` and
/// `(sample + 1)` are expressions over a column).
fn rewrite_samples(mut tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    let mut from = 0;
    loop {
        let significant: Vec<usize> = (from..tokens.len())
            .filter(|&i| !is_blank(&tokens[i].token))
            .collect();
        let found = significant.windows(2).position(|pair| {
            tokens[pair[0]].token == Token::LParen
                && word(&tokens[pair[1]].token).as_deref() == Some("SAMPLE")
        });
        let Some(at) = found else {
            return Ok(tokens);
        };
        let open = significant[at];
        let sample = significant[at + 1];
        from = sample + 1;
        let Some((target, rows, seed, close)) = sample_parts(&tokens, sample)? else {
            continue;
        };
        // SELECT * FROM <target> SHUFFLE SEED <seed> LIMIT <rows>
        let span = tokens[sample].span;
        let mut body = select_star_from(span);
        body.extend(tokens[target.0..target.1].iter().cloned());
        body.push(TokenWithSpan::new(
            Token::Whitespace(Whitespace::Space),
            span,
        ));
        body.extend(each_then_space(
            span,
            [
                Token::make_keyword("SHUFFLE"),
                Token::make_keyword("SEED"),
                Token::Number(seed.to_string(), false),
                Token::make_keyword("LIMIT"),
            ],
        ));
        body.push(TokenWithSpan::new(
            Token::Number(rows.to_string(), false),
            span,
        ));
        tokens.splice(open + 1..close, body);
    }
}

/// After the `SAMPLE` at `sample`: the target's token range, the rows, the
/// seed and the index of the closing `)`; `None` if it is not that shape.
#[allow(clippy::type_complexity)]
fn sample_parts(
    tokens: &[TokenWithSpan],
    sample: usize,
) -> Result<Option<((usize, usize), u64, u64, usize)>> {
    let next = |from: usize| (from..tokens.len()).find(|&i| !is_blank(&tokens[i].token));
    let Some(target_start) = next(sample + 1) else {
        return Ok(None);
    };
    let mut target_end = target_start + 1;
    match &tokens[target_start].token {
        Token::SingleQuotedString(_) => {}
        Token::Word(_) => {
            // A dotted name: a.b.c
            while let Some(dot) = next(target_end) {
                if tokens[dot].token != Token::Period {
                    break;
                }
                match next(dot + 1) {
                    Some(part) if matches!(tokens[part].token, Token::Word(_)) => {
                        target_end = part + 1
                    }
                    _ => return Ok(None),
                }
            }
        }
        Token::LParen => {
            let mut depth = 0i32;
            let mut end = None;
            for (i, token) in tokens.iter().enumerate().skip(target_start) {
                match token.token {
                    Token::LParen => depth += 1,
                    Token::RParen => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(i + 1);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let Some(end) = end else {
                return Ok(None);
            };
            target_end = end;
        }
        _ => return Ok(None),
    }
    let Some(rows_at) = next(target_end) else {
        return Ok(None);
    };
    let Token::Number(rows, _) = &tokens[rows_at].token else {
        return Ok(None);
    };
    let rows: u64 = rows.parse().map_err(|_| {
        parse_error(format!(
            "SAMPLE <table> <rows>: rows must be a non-negative integer, got {rows} at {}",
            position(&tokens[rows_at])
        ))
    })?;
    let mut after = next(rows_at + 1);
    let mut seed = None;
    if let Some(seed_word) = after
        && word(&tokens[seed_word].token).as_deref() == Some("SEED")
    {
        let value = next(seed_word + 1);
        let Some(Token::Number(text, _)) = value.map(|v| &tokens[v].token) else {
            return Err(parse_error(format!(
                "SEED takes a non-negative integer, at {}",
                position(&tokens[seed_word])
            )));
        };
        seed = Some(text.parse::<u64>().map_err(|_| {
            parse_error(format!("SEED must be a non-negative integer, got {text}"))
        })?);
        after = value.and_then(|v| next(v + 1));
    }
    match after {
        Some(close) if tokens[close].token == Token::RParen => Ok(Some((
            (target_start, target_end),
            rows,
            seed.unwrap_or_else(fresh_seed),
            close,
        ))),
        _ => Ok(None),
    }
}

/// `SELECT * FROM `, the start of both rewrites, at `span`.
pub(super) fn select_star_from(span: Span) -> Vec<TokenWithSpan> {
    each_then_space(
        span,
        [
            Token::make_keyword("SELECT"),
            Token::Mul,
            Token::make_keyword("FROM"),
        ],
    )
}

/// `tokens`, each followed by a space, at `span` (where errors point).
pub(super) fn each_then_space(
    span: Span,
    tokens: impl IntoIterator<Item = Token>,
) -> Vec<TokenWithSpan> {
    tokens
        .into_iter()
        .flat_map(|token| {
            [
                TokenWithSpan::new(token, span),
                TokenWithSpan::new(Token::Whitespace(Whitespace::Space), span),
            ]
        })
        .collect()
}

/// The first shuffle clause of `tokens`, at any depth.
fn find_clause(tokens: &[TokenWithSpan]) -> Result<Option<Clause>> {
    let significant: Vec<usize> = (0..tokens.len())
        .filter(|&i| !is_blank(&tokens[i].token))
        .collect();
    let word_at = |n: usize| significant.get(n).and_then(|&i| word(&tokens[i].token));
    for (n, &i) in significant.iter().enumerate() {
        if word(&tokens[i].token).as_deref() != Some("SHUFFLE") {
            continue;
        }
        let next = significant.get(n + 1).map(|&j| &tokens[j].token);
        // `LOCAL SHUFFLE`, unless `local` is a name (`FROM local SHUFFLE`);
        // without BUFFER it is an error, not a global shuffle of a table
        // aliased `local`.
        let local = n > 0
            && word_at(n - 1).as_deref() == Some("LOCAL")
            && !(n > 1
                && word_at(n - 2).is_some_and(|w| NAME_CONTEXT.contains(&w.as_str())));
        let start_n = if local { n - 1 } else { n };
        let query_can_end = start_n > 0 && {
            let before = &tokens[significant[start_n - 1]].token;
            match before {
                Token::Word(w) if w.quote_style.is_none() => {
                    !NAME_CONTEXT.contains(&w.value.to_ascii_uppercase().as_str())
                }
                Token::Word(_)
                | Token::RParen
                | Token::Number(..)
                | Token::SingleQuotedString(_) => true,
                _ => false,
            }
        };
        let clause_can_follow = local
            || match next {
                None | Some(Token::RParen) | Some(Token::SemiColon) => true,
                Some(token) => {
                    word(token).is_some_and(|w| AFTER_CLAUSE.contains(&w.as_str()))
                }
            };
        if !(query_can_end && clause_can_follow) {
            continue;
        }
        let rest: Vec<&TokenWithSpan> =
            significant[n + 1..].iter().map(|&j| &tokens[j]).collect();
        let (spec, used) = if local {
            parse_local(&rest, &tokens[i])?
        } else {
            parse_global(&rest)?
        };
        let end = significant
            .get(n + 1 + used)
            .copied()
            .unwrap_or(tokens.len());
        return Ok(Some(Clause {
            start: significant[start_n],
            end,
            spec,
        }));
    }
    Ok(None)
}

/// Where the query that `clause_start` ends begins: after the unmatched `(`
/// that opens it, or at the top level at the statement's first
/// `SELECT`/`WITH`/`VALUES` (after `EXPLAIN …`, `CACHE TABLE … AS` …).
fn query_start(tokens: &[TokenWithSpan], clause_start: usize) -> Result<usize> {
    let mut depth = 0i32;
    for i in (0..clause_start).rev() {
        match tokens[i].token {
            Token::RParen => depth += 1,
            Token::LParen if depth == 0 => return Ok(i + 1),
            Token::LParen => depth -= 1,
            _ => {}
        }
    }
    let mut depth = 0i32;
    for (i, token) in tokens[..clause_start].iter().enumerate() {
        match &token.token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            t if depth == 0
                && matches!(word(t).as_deref(), Some("SELECT" | "WITH" | "VALUES")) =>
            {
                return Ok(i);
            }
            _ => {}
        }
    }
    Err(parse_error(format!(
        "SHUFFLE at {} ends no query: it follows a SELECT, WITH or VALUES query",
        position(&tokens[clause_start])
    )))
}

fn number(tokens: &[&TokenWithSpan], at: usize, what: &str) -> Result<u64> {
    match tokens.get(at).map(|t| &t.token) {
        Some(Token::Number(n, _)) => n.parse().map_err(|_| {
            parse_error(format!(
                "{what} must be a non-negative integer, got {n} at {}",
                position(tokens[at])
            ))
        }),
        Some(other) => Err(parse_error(format!(
            "{what} must be a non-negative integer, found {other} at {}",
            position(tokens[at])
        ))),
        None => Err(parse_error(format!(
            "{what} needs a value at the end of the input"
        ))),
    }
}

/// `[WINDOW n | BY POSITION] [SEED s] [EPOCH e]` (in any order) after
/// `SHUFFLE`; returns the spec and the tokens used.
fn parse_global(clause: &[&TokenWithSpan]) -> Result<(ShuffleSpec, usize)> {
    let mut seed = None;
    let mut epoch = None;
    let mut window = None;
    let mut by_position = None;
    let mut at = 0;
    while at < clause.len() {
        match word(&clause[at].token).as_deref() {
            Some("BY") => {
                let what = clause.get(at + 1).and_then(|t| word(&t.token));
                if what.as_deref() != Some("POSITION") {
                    return Err(parse_error(format!(
                        "SHUFFLE BY takes POSITION (SHUFFLE BY POSITION), at {}",
                        position(clause[at])
                    )));
                }
                if by_position.is_some() {
                    return Err(parse_error(format!(
                        "SHUFFLE takes BY POSITION once; found it again at {}",
                        position(clause[at])
                    )));
                }
                by_position = Some(at);
            }
            Some("SEED") if seed.is_none() => {
                seed = Some(number(clause, at + 1, "SEED")?)
            }
            Some("EPOCH") if epoch.is_none() => {
                epoch = Some(number(clause, at + 1, "EPOCH")?)
            }
            Some("WINDOW") if window.is_none() => {
                let rows = number(clause, at + 1, "WINDOW")?;
                if rows == 0 {
                    return Err(parse_error(format!(
                        "WINDOW must be at least 1 row, got 0 at {}",
                        position(clause[at + 1])
                    )));
                }
                window = Some(rows)
            }
            Some(w @ ("SEED" | "EPOCH" | "WINDOW")) => {
                return Err(parse_error(format!(
                    "SHUFFLE takes {w} once; found it again at {}",
                    position(clause[at])
                )));
            }
            _ => break,
        }
        at += 2;
    }
    let seed = seed.unwrap_or_else(fresh_seed);
    let epoch = epoch.unwrap_or(0);
    let spec = match (window, by_position) {
        (Some(_), Some(by)) => {
            return Err(parse_error(format!(
                "SHUFFLE BY POSITION holds the whole epoch and has no WINDOW; write \
                 SHUFFLE WINDOW n or SHUFFLE BY POSITION, at {}",
                position(clause[by])
            )));
        }
        (None, Some(_)) => ShuffleSpec::Positional { seed, epoch },
        (Some(window_rows), None) => ShuffleSpec::Windowed {
            seed,
            epoch,
            window_rows,
            only_window: None,
        },
        (None, None) => ShuffleSpec::Global { seed, epoch },
    };
    Ok((spec, at))
}

/// `BUFFER n [SEED s]` after `LOCAL SHUFFLE`; returns the spec and the
/// tokens used.
fn parse_local(
    clause: &[&TokenWithSpan],
    shuffle: &TokenWithSpan,
) -> Result<(ShuffleSpec, usize)> {
    if clause.first().and_then(|t| word(&t.token)).as_deref() != Some("BUFFER") {
        return Err(parse_error(format!(
            "LOCAL SHUFFLE needs BUFFER <rows> after SHUFFLE at {}",
            position(shuffle)
        )));
    }
    let rows = number(clause, 1, "BUFFER")?;
    let buffer_rows = usize::try_from(rows)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            parse_error(format!("BUFFER must be at least 1 row, got {rows}"))
        })?;
    let (seed, used) = match clause.get(2).and_then(|t| word(&t.token)).as_deref() {
        Some("SEED") => (number(clause, 3, "SEED")?, 4),
        _ => (fresh_seed(), 2),
    };
    Ok((ShuffleSpec::Local { buffer_rows, seed }, used))
}

/// The spec a rewritten alias carries, if it is one of ours.
fn spec_of_alias(alias: &str) -> Option<ShuffleSpec> {
    let numbers = |rest: &str| -> Option<(u64, u64)> {
        let mut parts = rest.split('_').map(|p| p.parse::<u64>().ok());
        Some((parts.next()??, parts.next()??))
    };
    if let Some(rest) = alias.strip_prefix(WINDOWED_ALIAS) {
        let mut parts = rest.split('_').map(|p| p.parse::<u64>().ok());
        let (seed, epoch, window_rows) = (parts.next()??, parts.next()??, parts.next()??);
        return Some(ShuffleSpec::Windowed {
            seed,
            epoch,
            window_rows,
            only_window: None,
        });
    }
    if let Some(rest) = alias.strip_prefix(POSITION_ALIAS) {
        let (seed, epoch) = numbers(rest)?;
        return Some(ShuffleSpec::Positional { seed, epoch });
    }
    if let Some(rest) = alias.strip_prefix(GLOBAL_ALIAS) {
        let (seed, epoch) = numbers(rest)?;
        return Some(ShuffleSpec::Global { seed, epoch });
    }
    let (buffer_rows, seed) = numbers(alias.strip_prefix(LOCAL_ALIAS)?)?;
    Some(ShuffleSpec::Local {
        buffer_rows: usize::try_from(buffer_rows).ok()?,
        seed,
    })
}

/// Puts a [`ShuffleNode`] under every derived table that [`rewrite`] made,
/// anywhere in `plan` (subqueries, views and `EXPLAIN` included).
pub(crate) fn apply_markers(plan: LogicalPlan) -> Result<LogicalPlan> {
    replace_under_marked_aliases(plan, |alias, input| {
        let spec = spec_of_alias(alias)?;
        Some(crate::shuffle::shuffle_plan(input.clone(), spec))
    })
}

/// Replaces the input of every derived table in `plan` (subqueries, views
/// and `EXPLAIN` included) for which `replace(alias, input)` gives a plan:
/// how a token rewrite's marker becomes its operator.
pub(super) fn replace_under_marked_aliases(
    plan: LogicalPlan,
    replace: impl Fn(&str, &LogicalPlan) -> Option<Result<LogicalPlan>>,
) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::SubqueryAlias(alias) = &node else {
            return Ok(Transformed::no(node));
        };
        let Some(replaced) = replace(alias.alias.table(), &alias.input) else {
            return Ok(Transformed::no(node));
        };
        let wrapped = SubqueryAlias::try_new(Arc::new(replaced?), alias.alias.clone())?;
        Ok(Transformed::yes(LogicalPlan::SubqueryAlias(wrapped)))
    })
    .map(|t| t.data)
}

/// Asserts that each SQL text of `cases` fails in `run` with an error that
/// says the text paired with it.
#[cfg(test)]
#[track_caller]
pub(super) fn assert_refused<T: std::fmt::Debug>(
    run: impl Fn(&str) -> Result<T>,
    cases: &[(&str, &str)],
) {
    for (sql, expected) in cases {
        let err = run(sql).expect_err(sql).to_string();
        assert!(err.contains(expected), "{sql}: {err}");
    }
}

/// `sql`'s tokens through `rewrite`, printed back (for the rewrites' tests).
#[cfg(test)]
pub(super) fn rewritten_with(
    sql: &str,
    rewrite: fn(Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>>,
) -> Result<String> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::Tokenizer;
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| parse_error(e.to_string()))?;
    Ok(rewrite(tokens)?
        .iter()
        .map(|t| t.token.to_string())
        .collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> Result<String> {
        rewritten_with(sql, rewrite)
    }

    #[test]
    fn clauses_become_marked_derived_tables() -> Result<()> {
        assert_eq!(
            rewritten("SELECT a FROM t WHERE x SHUFFLE SEED 7 EPOCH 2 LIMIT 10")?,
            "SELECT * FROM (SELECT a FROM t WHERE x ) AS __sqlfeed_shuffle_7_2_0 LIMIT 10"
        );
        assert_eq!(
            rewritten("SELECT count(*) FROM (SELECT a FROM t SHUFFLE SEED 1)")?,
            "SELECT count(*) FROM (SELECT * FROM (SELECT a FROM t ) AS \
             __sqlfeed_shuffle_1_0_0 )"
        );
        assert_eq!(
            rewritten("EXPLAIN FORMAT TREE SELECT 1 LOCAL SHUFFLE BUFFER 8 SEED 3")?,
            "EXPLAIN FORMAT TREE SELECT * FROM (SELECT 1 ) AS __sqlfeed_local_shuffle_8_3_0 "
        );
        assert_eq!(
            rewritten("SELECT * FROM local SHUFFLE SEED 4")?,
            "SELECT * FROM (SELECT * FROM local ) AS __sqlfeed_shuffle_4_0_0 "
        );
        let two = rewritten(
            "WITH a AS (SELECT x FROM t SHUFFLE SEED 1) SELECT * FROM a SHUFFLE SEED 2",
        )?;
        assert!(
            two.starts_with("SELECT * FROM (WITH a AS (SELECT * FROM (SELECT x FROM t ) AS __sqlfeed_shuffle_1_0_0 )"),
            "{two}"
        );
        assert!(two.ends_with("AS __sqlfeed_shuffle_2_0_1 "), "{two}");
        Ok(())
    }

    #[test]
    fn sample_as_a_table_expression_is_a_limited_shuffle() -> Result<()> {
        assert_eq!(
            rewritten("SELECT count(*) FROM (SAMPLE t 10 SEED 3)")?,
            "SELECT count(*) FROM (SELECT * FROM (SELECT * FROM t ) AS \
             __sqlfeed_shuffle_3_0_0 LIMIT 10)"
        );
        let quoted =
            rewritten("WITH s AS (SAMPLE 'd/*.parquet' 5 SEED 1) SELECT * FROM s")?;
        assert!(
            quoted.contains("(SELECT * FROM (SELECT * FROM 'd/*.parquet' ) AS __sqlfeed_shuffle_1_0_0 LIMIT 5)"),
            "{quoted}"
        );
        let query =
            rewritten("SELECT * FROM (SAMPLE (SELECT a FROM t WHERE a > 1) 2 SEED 4)")?;
        assert!(
            query.contains(
                "FROM (SELECT a FROM t WHERE a > 1) ) AS __sqlfeed_shuffle_4_0_0 LIMIT 2"
            ),
            "{query}"
        );
        for sql in [
            "SELECT (sample) FROM t",
            "SELECT (sample + 1) FROM t",
            "SELECT (sample) AS x",
        ] {
            assert_eq!(rewritten(sql)?, sql, "{sql}");
        }
        Ok(())
    }

    #[test]
    fn our_words_stay_names() -> Result<()> {
        for sql in [
            "SELECT 1 AS shuffle",
            "SELECT shuffle FROM (SELECT 1 AS shuffle)",
            "SELECT seed, epoch, local, buffer FROM t",
            "SELECT * FROM shuffle",
            "SELECT * FROM t AS shuffle",
            "SELECT a, shuffle FROM t WHERE shuffle > 1 ORDER BY shuffle",
            "SELECT t.shuffle FROM t JOIN shuffle ON t.a = shuffle.a",
            "SELECT \"SHUFFLE\" FROM t",
        ] {
            assert_eq!(rewritten(sql)?, sql, "{sql}");
        }
        Ok(())
    }

    #[test]
    fn bad_clauses_say_why() {
        assert_refused(
            rewritten,
            &[
                (
                    "SELECT 1 SHUFFLE SEED x",
                    "SEED must be a non-negative integer",
                ),
                ("SELECT 1 SHUFFLE SEED 1 SEED 2", "SHUFFLE takes SEED once"),
                ("SELECT 1 SHUFFLE EPOCH", "EPOCH needs a value"),
                (
                    "SELECT 1 LOCAL SHUFFLE BUFFER 0",
                    "BUFFER must be at least 1 row",
                ),
                (
                    "SELECT 1 SHUFFLE SEED 99999999999999999999",
                    "non-negative integer",
                ),
            ],
        );
    }

    #[test]
    fn aliases_round_trip_their_spec() {
        assert_eq!(
            spec_of_alias("__sqlfeed_shuffle_18446744073709551615_3_12"),
            Some(ShuffleSpec::Global {
                seed: u64::MAX,
                epoch: 3
            })
        );
        assert_eq!(
            spec_of_alias("__sqlfeed_local_shuffle_64_9_0"),
            Some(ShuffleSpec::Local {
                buffer_rows: 64,
                seed: 9
            })
        );
        assert_eq!(spec_of_alias("__sqlfeed_shuffle_x"), None);
        assert_eq!(spec_of_alias("shuffled"), None);
    }
}
