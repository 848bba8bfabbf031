//! The `MIX` table expression:
//!
//! ```text
//! MIX (<query>) [AS name] WEIGHT w, (<query>) [AS name] WEIGHT w …
//!     [ROWS n] [SEED s] [EPOCH e] [BATCH g] [WINDOW n]
//!
//! w: a number, or STEPS (step: weight, …) — piecewise linear in the global
//!    step (of g rows; in a feed its batch size × world), constant outside
//!    the points; two points at one step make a jump
//! ```
//!
//! wherever a query can stand: a statement, a subquery or CTE body, after
//! `CACHE TABLE … AS`, `CREATE VIEW … AS` and `EXPLAIN …`.
//!
//! # How
//! Like `SHUFFLE` (see `shuffle_clause.rs`), before DataFusion parses the
//! statement the mixture is rewritten at the token level into a derived
//! table whose alias carries the spec, here hex-encoded JSON:
//!
//! ```text
//!   MIX (SELECT a FROM t) AS web WEIGHT 0.6, (SELECT a FROM u) WEIGHT 0.4 SEED 7
//!   SELECT * FROM (SELECT *, 'web' AS source, 0 AS source_id FROM (SELECT a FROM t)
//!        UNION ALL SELECT *, '1' AS source, 1 AS source_id FROM (SELECT a FROM u))
//!        AS __sqlfeed_mix_<hex>
//! ```
//!
//! and [`apply_markers`] replaces the `UNION ALL` under every such alias
//! with a [`MixNode`] of its branches. What follows the mixture (`LIMIT`,
//! `SHUFFLE`, `)`) stays after the derived table.
//!
//! # Non-reserved
//! `MIX` is the expression only where a query starts (at the start of the
//! statement, after `(`, `AS` or `EXPLAIN …`) and when a `(` and a query
//! (`SELECT`, `WITH`, `VALUES` or `(`) follow it; `mix(a)` stays a function
//! call and `FROM mix` a table.
//!
//! [`MixNode`]: crate::shuffle::mix::MixNode

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan};

use super::parse_error;
use super::shuffle_clause::{
    each_then_space, is_blank, position, replace_under_marked_aliases, select_star_from,
    word,
};
use crate::shuffle::mix::{MixNode, MixSpec, SOURCE_COLUMN, SOURCE_ID_COLUMN};

/// Prefix of the derived-table alias of a mixture.
const ALIAS: &str = "__sqlfeed_mix_";

/// What the alias carries.
#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    names: Vec<String>,
    weights: Vec<f64>,
    rows: Option<u64>,
    seed: Option<u64>,
    epoch: Option<u64>,
    /// Per source: (step, weight) points, empty for a fixed weight.
    schedules: Vec<Vec<(u64, f64)>>,
    step_rows: Option<u64>,
    window_rows: Option<u64>,
}

/// Words before `MIX` at which a query starts.
const QUERY_STARTS_AFTER: &[&str] = &["AS", "EXPLAIN", "ANALYZE", "VERBOSE"];

/// Rewrites every mixture of one statement's tokens into a marked derived
/// table (see the module docs).
pub(super) fn rewrite(mut tokens: Vec<TokenWithSpan>) -> Result<Vec<TokenWithSpan>> {
    while let Some(start) = find_mix(&tokens) {
        let (replacement, end) = rewrite_one(&tokens, start)?;
        tokens.splice(start..end, replacement);
    }
    Ok(tokens)
}

/// Indices of the significant tokens of `tokens` from `from` on.
fn significant(tokens: &[TokenWithSpan], from: usize) -> Vec<usize> {
    (from..tokens.len())
        .filter(|&i| !is_blank(&tokens[i].token))
        .collect()
}

/// The first `MIX` that starts a mixture.
fn find_mix(tokens: &[TokenWithSpan]) -> Option<usize> {
    let order = significant(tokens, 0);
    order.iter().enumerate().find_map(|(n, &i)| {
        if word(&tokens[i].token).as_deref() != Some("MIX") {
            return None;
        }
        let after = |m: usize| order.get(n + m).map(|&j| &tokens[j].token);
        let opens_query = after(1) == Some(&Token::LParen)
            && match after(2) {
                Some(Token::LParen) => true,
                Some(t) => {
                    matches!(word(t).as_deref(), Some("SELECT" | "WITH" | "VALUES"))
                }
                None => false,
            };
        let starts_query = match n.checked_sub(1).map(|b| &tokens[order[b]].token) {
            None | Some(Token::LParen) => true,
            Some(t) => {
                word(t).is_some_and(|w| QUERY_STARTS_AFTER.contains(&w.as_str()))
                    || (n >= 2
                        && word(&tokens[order[n - 2]].token).as_deref() == Some("FORMAT"))
            }
        };
        (opens_query && starts_query).then_some(i)
    })
}

/// The index after the `)` that closes the `(` at `open`.
fn after_closing(tokens: &[TokenWithSpan], open: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        match token.token {
            Token::LParen => depth += 1,
            Token::RParen => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

fn number_u64(tokens: &[TokenWithSpan], at: Option<usize>, what: &str) -> Result<u64> {
    match at.map(|i| (i, &tokens[i].token)) {
        Some((i, Token::Number(text, _))) => text.parse().map_err(|_| {
            parse_error(format!(
                "MIX: {what} must be a non-negative integer, got {text} at {}",
                position(&tokens[i])
            ))
        }),
        Some((i, other)) => Err(parse_error(format!(
            "MIX: {what} must be a non-negative integer, found {other} at {}",
            position(&tokens[i])
        ))),
        None => Err(parse_error(format!(
            "MIX: {what} needs a value at the end of the input"
        ))),
    }
}

/// The mixture at `start` (its `MIX`): the tokens that replace it and the
/// index after its last token.
fn rewrite_one(
    tokens: &[TokenWithSpan],
    start: usize,
) -> Result<(Vec<TokenWithSpan>, usize)> {
    let next = |from: usize| (from..tokens.len()).find(|&i| !is_blank(&tokens[i].token));
    let mix = &tokens[start];
    let mut sources: Vec<(usize, usize)> = vec![];
    let mut marker = Marker {
        names: vec![],
        weights: vec![],
        rows: None,
        seed: None,
        epoch: None,
        schedules: vec![],
        step_rows: None,
        window_rows: None,
    };
    let mut at = next(start + 1);
    loop {
        // ( query ) [AS name] WEIGHT w
        let open = match at {
            Some(i) if tokens[i].token == Token::LParen => i,
            Some(i) => {
                return Err(parse_error(format!(
                    "MIX: expected a (query) at {}, found {}",
                    position(&tokens[i]),
                    tokens[i].token
                )));
            }
            None => {
                return Err(parse_error(
                    "MIX: expected a (query) at the end of the input".into(),
                ));
            }
        };
        let close = after_closing(tokens, open).ok_or_else(|| {
            parse_error(format!(
                "MIX: the ( at {} is never closed",
                position(&tokens[open])
            ))
        })?;
        sources.push((open, close));
        at = next(close);
        let mut name = None;
        if let Some(i) = at
            && word(&tokens[i].token).as_deref() == Some("AS")
        {
            let value = next(i + 1);
            name = match value.map(|v| &tokens[v].token) {
                Some(Token::Word(w)) => Some(w.value.clone()),
                Some(Token::SingleQuotedString(s)) => Some(s.clone()),
                _ => {
                    return Err(parse_error(format!(
                        "MIX: AS at {} needs a source name",
                        position(&tokens[i])
                    )));
                }
            };
            at = value.and_then(|v| next(v + 1));
        }
        let weight_word = match at {
            Some(i) if word(&tokens[i].token).as_deref() == Some("WEIGHT") => i,
            _ => {
                return Err(parse_error(format!(
                    "MIX: source {} (at {}) needs WEIGHT <w> after it",
                    sources.len(),
                    position(&tokens[open])
                )));
            }
        };
        let value = next(weight_word + 1);
        let k = marker.names.len();
        marker.names.push(name.unwrap_or_else(|| k.to_string()));
        if let Some(steps) = value
            && word(&tokens[steps].token).as_deref() == Some("STEPS")
        {
            // WEIGHT STEPS (step: weight, …)
            let (points, after) = schedule_points(tokens, steps)?;
            marker.weights.push(points[0].1);
            marker.schedules.resize(k, vec![]);
            marker.schedules.push(points);
            at = after;
            match at {
                Some(i) if tokens[i].token == Token::Comma => at = next(i + 1),
                _ => break,
            }
            continue;
        }
        let weight = weight_at(tokens, value).ok_or_else(|| {
            parse_error(format!(
                "MIX: WEIGHT at {} takes a non-negative number (a share: 0.6, or 3 against 1)",
                position(&tokens[weight_word])
            ))
        })?;
        marker.weights.push(weight);
        at = value.and_then(|v| next(v + 1));
        match at {
            Some(i) if tokens[i].token == Token::Comma => at = next(i + 1),
            _ => break,
        }
    }
    // [ROWS n] [SEED s] [EPOCH e] [BATCH g] [WINDOW n], in any order.
    while let Some(i) = at {
        let slot = match word(&tokens[i].token).as_deref() {
            Some("ROWS") => &mut marker.rows,
            Some("SEED") => &mut marker.seed,
            Some("EPOCH") => &mut marker.epoch,
            Some("BATCH") => &mut marker.step_rows,
            Some("WINDOW") => &mut marker.window_rows,
            _ => break,
        };
        let what = word(&tokens[i].token).unwrap_or_default();
        if slot.is_some() {
            return Err(parse_error(format!(
                "MIX takes {what} once; found it again at {}",
                position(&tokens[i])
            )));
        }
        let value = next(i + 1);
        *slot = Some(number_u64(tokens, value, &what)?);
        at = value.and_then(|v| next(v + 1));
    }
    if marker.window_rows == Some(0) {
        return Err(parse_error(format!(
            "MIX at {}: WINDOW n shuffles each pass over a source in windows of at least \
             n rows; n must be at least 1",
            position(mix)
        )));
    }
    let mut names = marker.names.clone();
    names.sort();
    if let Some(pair) = names.windows(2).find(|p| p[0] == p[1]) {
        return Err(parse_error(format!(
            "MIX at {}: two sources are named '{}'; give each its own name",
            position(mix),
            pair[0]
        )));
    }
    if !marker.schedules.is_empty() {
        marker.schedules.resize(marker.names.len(), vec![]);
    } else if marker.step_rows.is_some() {
        return Err(parse_error(format!(
            "MIX at {}: BATCH gives the rows of a step for weights by step \
             (WEIGHT STEPS (step: weight, …)), and no source has them",
            position(mix)
        )));
    }
    if marker.schedules.is_empty() && !marker.weights.iter().any(|w| *w > 0.0) {
        return Err(parse_error(format!(
            "MIX at {}: every weight is 0; give a source a positive weight",
            position(mix)
        )));
    }
    let end = at.unwrap_or(tokens.len());
    let json = serde_json::to_string(&marker)
        .map_err(|e| parse_error(format!("MIX: cannot encode the mixture: {e}")))?;
    let hex: String = json.bytes().map(|b| format!("{b:02x}")).collect();
    // SELECT * FROM ( SELECT *, '<name>' AS source, <k> AS source_id FROM (<q>)
    //                 UNION ALL … ) AS <alias>
    let span = mix.span;
    let mut out = select_star_from(span);
    out.push(TokenWithSpan::new(Token::LParen, span));
    for (k, &(open, close)) in sources.iter().enumerate() {
        if k > 0 {
            out.extend(each_then_space(
                span,
                [Token::make_keyword("UNION"), Token::make_keyword("ALL")],
            ));
        }
        out.extend(each_then_space(
            span,
            [
                Token::make_keyword("SELECT"),
                Token::Mul,
                Token::Comma,
                Token::SingleQuotedString(marker.names[k].clone()),
                Token::make_keyword("AS"),
                Token::make_word(SOURCE_COLUMN, None),
                Token::Comma,
                Token::Number(k.to_string(), false),
                Token::make_keyword("AS"),
                Token::make_word(SOURCE_ID_COLUMN, None),
                Token::make_keyword("FROM"),
            ],
        ));
        out.extend(tokens[open..close].iter().cloned());
        out.push(TokenWithSpan::new(
            Token::Whitespace(datafusion::sql::sqlparser::tokenizer::Whitespace::Space),
            span,
        ));
    }
    out.extend(each_then_space(
        span,
        [
            Token::RParen,
            Token::make_keyword("AS"),
            Token::make_word(&format!("{ALIAS}{hex}"), None),
        ],
    ));
    Ok((out, end))
}

/// The weight at `at`: a finite, non-negative number.
fn weight_at(tokens: &[TokenWithSpan], at: Option<usize>) -> Option<f64> {
    match at.map(|i| &tokens[i].token) {
        Some(Token::Number(text, _)) => text.parse::<f64>().ok(),
        _ => None,
    }
    .filter(|w| w.is_finite() && *w >= 0.0)
}

/// A schedule's (step, weight) points.
type Points = Vec<(u64, f64)>;

/// `STEPS (step: weight, …)` from the `STEPS` at `steps`: the points and
/// where the next significant token is.
fn schedule_points(
    tokens: &[TokenWithSpan],
    steps: usize,
) -> Result<(Points, Option<usize>)> {
    let next = |from: usize| (from..tokens.len()).find(|&i| !is_blank(&tokens[i].token));
    let syntax = || {
        parse_error(format!(
            "MIX: WEIGHT STEPS at {} takes (step: weight, …), e.g. STEPS (0: 0.6, 10000: 0.3)",
            position(&tokens[steps])
        ))
    };
    let open = next(steps + 1)
        .filter(|&i| tokens[i].token == Token::LParen)
        .ok_or_else(syntax)?;
    let mut points = vec![];
    let mut at = next(open + 1);
    loop {
        let (Some(step_at), Some(colon)) = (at, at.and_then(|i| next(i + 1))) else {
            return Err(syntax());
        };
        if tokens[colon].token != Token::Colon {
            return Err(syntax());
        }
        let step = number_u64(tokens, Some(step_at), "a schedule's step")?;
        let value = next(colon + 1);
        let weight = weight_at(tokens, value).ok_or_else(|| {
            parse_error(format!(
                "MIX: the weight at step {step} (at {}) must be a non-negative number",
                position(&tokens[colon])
            ))
        })?;
        if let Some(&(last, _)) = points.last()
            && step < last
        {
            return Err(parse_error(format!(
                "MIX: a schedule's steps must not go back: step {step} after step {last} (at {})",
                position(&tokens[step_at])
            )));
        }
        points.push((step, weight));
        at = value.and_then(|v| next(v + 1));
        match at.map(|i| &tokens[i].token) {
            Some(Token::Comma) => at = at.and_then(|i| next(i + 1)),
            Some(Token::RParen) => return Ok((points, at.and_then(|i| next(i + 1)))),
            _ => return Err(syntax()),
        }
    }
}

/// The spec a rewritten alias carries, if it is one of ours.
fn spec_of_alias(alias: &str) -> Option<MixSpec> {
    let hex = alias.strip_prefix(ALIAS)?;
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let marker: Marker = serde_json::from_slice(&bytes).ok()?;
    Some(
        MixSpec::new(
            marker.names,
            &marker.weights,
            marker.rows,
            marker.seed,
            marker.epoch,
        )
        .with_schedules(&marker.schedules, marker.step_rows)
        .with_window_rows(marker.window_rows),
    )
}

/// The branches of a (nested) `UNION ALL`.
fn union_branches(plan: &LogicalPlan, out: &mut Vec<LogicalPlan>) {
    match plan {
        LogicalPlan::Union(union) => {
            for input in &union.inputs {
                union_branches(input, out);
            }
        }
        other => out.push(other.clone()),
    }
}

/// Puts a [`MixNode`] in place of the `UNION ALL` under every derived table
/// that [`rewrite`] made, anywhere in `plan`.
pub(crate) fn apply_markers(plan: LogicalPlan) -> Result<LogicalPlan> {
    replace_under_marked_aliases(plan, |alias, input| {
        let spec = spec_of_alias(alias)?;
        let mut branches = vec![];
        union_branches(input, &mut branches);
        Some(MixNode::try_new(branches, spec).map(|mix| {
            LogicalPlan::Extension(Extension {
                node: Arc::new(mix),
            })
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> Result<String> {
        super::super::shuffle_clause::rewritten_with(sql, rewrite)
    }

    #[test]
    fn a_mixture_becomes_a_marked_union_of_named_sources() -> Result<()> {
        let sql = rewritten(
            "MIX (SELECT a FROM t) AS web WEIGHT 0.6, (SELECT a FROM u) WEIGHT 0.4 ROWS 10 SEED 7 LIMIT 3",
        )?;
        assert!(
            sql.starts_with(
                "SELECT * FROM (SELECT * , 'web' AS source , 0 AS source_id FROM (SELECT a FROM t) \
                 UNION ALL SELECT * , '1' AS source , 1 AS source_id FROM (SELECT a FROM u) ) \
                 AS __sqlfeed_mix_"
            ),
            "{sql}"
        );
        assert!(sql.ends_with(" LIMIT 3"), "{sql}");
        let alias = sql
            .split_whitespace()
            .find(|w| w.starts_with(ALIAS))
            .expect("alias");
        let spec = spec_of_alias(alias).expect("spec");
        assert_eq!(spec.names, vec!["web", "1"]);
        assert_eq!(spec.weights(), vec![0.6, 0.4]);
        assert_eq!(
            (spec.rows, spec.seed, spec.epoch),
            (Some(10), Some(7), None)
        );
        // Inside a subquery, after AS, under EXPLAIN.
        for sql in [
            "SELECT count(*) FROM (MIX (SELECT 1) WEIGHT 1)",
            "CACHE TABLE m AS MIX (SELECT 1) WEIGHT 1",
            "EXPLAIN ANALYZE MIX (SELECT 1) WEIGHT 1",
            "WITH m AS (MIX ((SELECT 1)) WEIGHT 1) SELECT * FROM m",
        ] {
            assert!(rewritten(sql)?.contains(ALIAS), "{sql}");
        }
        Ok(())
    }

    #[test]
    fn a_window_is_carried_and_checked() -> Result<()> {
        let sql = rewritten("MIX (SELECT 1) AS a WEIGHT 1 WINDOW 4096 SEED 3")?;
        let alias = sql
            .split_whitespace()
            .find(|w| w.starts_with(ALIAS))
            .expect("alias");
        let spec = spec_of_alias(alias).expect("spec");
        assert_eq!((spec.window_rows, spec.seed), (Some(4096), Some(3)));
        super::super::shuffle_clause::assert_refused(
            rewritten,
            &[
                ("MIX (SELECT 1) WEIGHT 1 WINDOW 0", "n must be at least 1"),
                (
                    "MIX (SELECT 1) WEIGHT 1 WINDOW x",
                    "must be a non-negative integer",
                ),
                (
                    "MIX (SELECT 1) WEIGHT 1 WINDOW 2 WINDOW 2",
                    "takes WINDOW once",
                ),
            ],
        );
        Ok(())
    }

    #[test]
    fn weights_by_step_and_the_step_size_are_carried() -> Result<()> {
        let sql = rewritten(
            "MIX (SELECT 1) AS a WEIGHT STEPS (0: 0.8, 10: 0.8, 10: 0.2), (SELECT 2) AS b \
             WEIGHT 0.5 BATCH 32",
        )?;
        let alias = sql
            .split_whitespace()
            .find(|w| w.starts_with(ALIAS))
            .expect("alias");
        let spec = spec_of_alias(alias).expect("spec");
        assert_eq!(
            spec.schedules(),
            Some(vec![vec![(0, 0.8), (10, 0.8), (10, 0.2)], vec![]])
        );
        assert_eq!(spec.step_rows, Some(32));
        super::super::shuffle_clause::assert_refused(
            rewritten,
            &[
                ("MIX (SELECT 1) WEIGHT STEPS 0.5", "takes (step: weight"),
                (
                    "MIX (SELECT 1) WEIGHT STEPS (5: 1, 4: 1)",
                    "must not go back",
                ),
                (
                    "MIX (SELECT 1) WEIGHT STEPS (5: x)",
                    "must be a non-negative number",
                ),
                ("MIX (SELECT 1) WEIGHT 1 BATCH 8", "no source has them"),
            ],
        );
        Ok(())
    }

    #[test]
    fn mix_stays_a_name_elsewhere() -> Result<()> {
        for sql in [
            "SELECT mix(a) FROM t",
            "SELECT * FROM mix",
            "SELECT mix FROM t AS mix",
            "SELECT * FROM t AS mix (a, b)",
        ] {
            assert_eq!(rewritten(sql)?, sql, "{sql}");
        }
        Ok(())
    }

    #[test]
    fn bad_mixtures_say_why() {
        super::super::shuffle_clause::assert_refused(
            rewritten,
            &[
                ("MIX (SELECT 1)", "needs WEIGHT <w> after it"),
                ("MIX (SELECT 1) WEIGHT x", "takes a non-negative number"),
                ("MIX (SELECT 1) WEIGHT -1", "takes a non-negative number"),
                ("MIX (SELECT 1) WEIGHT 0", "every weight is 0"),
                (
                    "MIX (SELECT 1) AS a WEIGHT 1, (SELECT 2) AS a WEIGHT 1",
                    "two sources are named 'a'",
                ),
                ("MIX (SELECT 1) WEIGHT 1 SEED 1 SEED 2", "takes SEED once"),
                ("MIX (SELECT 1) WEIGHT 1 ROWS", "ROWS needs a value"),
                ("MIX (SELECT 1) WEIGHT 1, 5", "expected a (query)"),
                ("MIX (SELECT 1 WEIGHT 1", "never closed"),
            ],
        );
    }
}
