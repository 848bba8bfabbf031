//! The trailing `SHUFFLE [SEED s] [EPOCH e]` / `LOCAL SHUFFLE BUFFER n [SEED s]`
//! clause, found at the token level before DataFusion parses the query.

use datafusion::error::Result;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};

use super::{fresh_seed, parse_error};
use crate::shuffle::ShuffleSpec;

/// `EXPLAIN [ANALYZE] [VERBOSE]` in front of a shuffled query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExplainOptions {
    /// `ANALYZE`: run the query and show metrics.
    pub analyze: bool,
    /// `VERBOSE`: every plan stage.
    pub verbose: bool,
}

/// A statement cut into its query tokens and its shuffle clause.
#[derive(Debug)]
pub(super) struct Split {
    /// The tokens of the query, without `EXPLAIN …` and the clause.
    pub query: Vec<TokenWithSpan>,
    /// The clause.
    pub spec: ShuffleSpec,
    /// `EXPLAIN` options, when the statement is an explain.
    pub explain: Option<ExplainOptions>,
}

fn word(token: &Token) -> Option<String> {
    match token {
        Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
        _ => None,
    }
}

fn position(token: &TokenWithSpan) -> String {
    format!(
        "Line: {}, Column: {}",
        token.span.start.line, token.span.start.column
    )
}

/// Finds a `SHUFFLE` clause at parenthesis depth 0; `None` if there is none.
pub(super) fn split(tokens: &[TokenWithSpan]) -> Result<Option<Split>> {
    let significant: Vec<usize> = (0..tokens.len())
        .filter(|&i| !matches!(tokens[i].token, Token::Whitespace(_) | Token::EOF))
        .collect();
    let mut depth = 0i32;
    let mut shuffle_at = None;
    for (n, &i) in significant.iter().enumerate() {
        match &tokens[i].token {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            token if depth == 0 && word(token).as_deref() == Some("SHUFFLE") => {
                shuffle_at = Some(n);
                break;
            }
            _ => {}
        }
    }
    let Some(shuffle_at) = shuffle_at else {
        return Ok(None);
    };
    let local = shuffle_at > 0
        && word(&tokens[significant[shuffle_at - 1]].token).as_deref() == Some("LOCAL");
    let clause_start = if local { shuffle_at - 1 } else { shuffle_at };
    let clause: Vec<&TokenWithSpan> = significant[shuffle_at + 1..]
        .iter()
        .map(|&i| &tokens[i])
        .collect();
    let spec = if local {
        parse_local(&clause, &tokens[significant[shuffle_at]])?
    } else {
        parse_global(&clause)?
    };

    // EXPLAIN [ANALYZE] [VERBOSE] in front: planned around the shuffled query.
    let mut query_from = 0;
    let mut explain = None;
    if word(&tokens[significant[0]].token).as_deref() == Some("EXPLAIN") {
        let mut options = ExplainOptions::default();
        let mut n = 1;
        while n < clause_start {
            match word(&tokens[significant[n]].token).as_deref() {
                Some("ANALYZE") => options.analyze = true,
                Some("VERBOSE") => options.verbose = true,
                _ => break,
            }
            n += 1;
        }
        explain = Some(options);
        query_from = significant.get(n).copied().unwrap_or(tokens.len());
    }
    let query_end = significant[clause_start];
    Ok(Some(Split {
        query: tokens[query_from..query_end].to_vec(),
        spec,
        explain,
    }))
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

fn parse_global(clause: &[&TokenWithSpan]) -> Result<ShuffleSpec> {
    let mut seed = None;
    let mut epoch = None;
    let mut at = 0;
    while at < clause.len() {
        match word(&clause[at].token).as_deref() {
            Some("SEED") if seed.is_none() => {
                seed = Some(number(clause, at + 1, "SEED")?)
            }
            Some("EPOCH") if epoch.is_none() => {
                epoch = Some(number(clause, at + 1, "EPOCH")?)
            }
            _ => {
                return Err(parse_error(format!(
                    "SHUFFLE [SEED s] [EPOCH e] must end the statement; found {} at {}",
                    clause[at].token,
                    position(clause[at])
                )));
            }
        }
        at += 2;
    }
    Ok(ShuffleSpec::Global {
        seed: seed.unwrap_or_else(fresh_seed),
        epoch: epoch.unwrap_or(0),
    })
}

fn parse_local(
    clause: &[&TokenWithSpan],
    shuffle: &TokenWithSpan,
) -> Result<ShuffleSpec> {
    if word(
        &clause
            .first()
            .map(|t| t.token.clone())
            .unwrap_or(Token::EOF),
    )
    .as_deref()
        != Some("BUFFER")
    {
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
    let seed = match clause.get(2) {
        None => fresh_seed(),
        Some(t) if word(&t.token).as_deref() == Some("SEED") && clause.len() == 4 => {
            number(clause, 3, "SEED")?
        }
        Some(t) => {
            return Err(parse_error(format!(
                "LOCAL SHUFFLE BUFFER n [SEED s] must end the statement; found {} at {}",
                t.token,
                position(t)
            )));
        }
    };
    Ok(ShuffleSpec::Local { buffer_rows, seed })
}
