//! Quarantine: a row whose functions fail (a truncated JPEG, a caption
//! that does not tokenize, a user function raising on one row) is left out
//! and recorded, and its slot in the epoch's order is filled, so that every
//! rank keeps the step count the plan said and every other row keeps its
//! place.
//!
//! ```text
//!  the feed's query, its output projections isolating row errors
//!  (ParallelProjectionExec, row_errors=isolated): a failing row is
//!  marked — function, column, error — instead of ending the stream
//!        │ rows in the epoch's order, every rank the same stream
//!        ▼
//!  Replacer (replace.rs), before the batcher: a marked row is logged
//!  (epoch, position in the order) and replaced by the nearest row before
//!  it in the order that evaluated (after it, at the epoch's start); past
//!  max_quarantined the epoch fails with a summary
//!        │
//!        ▼
//!  ShardBatcher: chunks of B×W rows, this rank's B … (unchanged)
//! ```
//!
//! # Why the row before
//! The replacement must be the same on every run and every world size, so
//! it is a function of the epoch's order alone, never of the rank. Every
//! rank of an embedded feed reads the whole order (and keeps its slices),
//! so each sees every marked row and the row before it. The order is a
//! uniform permutation, so the rows that fill slots are a uniform sample of
//! the rows that evaluated: no row is favoured, as one reserve row would
//! be. A quarantined slot changes nothing else: every other batch is
//! byte-identical to a run in which that row evaluated (with `batch_tokens`
//! or `bucket_by_length`, which cut by lengths, the cuts after a filled
//! slot follow its filler's length, on every rank alike), resume (by step or
//! by rows, under any world size) is exact, and `explain_batch` names the
//! quarantined row at its slot (the row that was there, whose origin is
//! the useful answer).
//!
//! # What is isolated
//! The row-wise functions of the query's output — where sqlfeed runs them
//! on a shuffled feed (after the permutation) and on an unshuffled one:
//! the projections at the top of the epoch's plan. With quarantine on,
//! cheap functions are not moved below the shuffle, computing projections
//! are not folded into file scans, and widening functions do not move to
//! a cluster feed's client, so that they are all there. sqlfeed's functions, plugins' and Python's alike; casts and
//! arithmetic as well. A function under a join, an aggregate, a sort or a
//! `MIX` still fails the feed, as do errors no row is at fault for (memory,
//! I/O, a damaged Parquet page, which `sqlfeed verify` finds).
//!
//! # The table
//! Every rank sees every marked row, so every rank holds the same table
//! (write it from rank 0): epoch, position in the order, function, column,
//! error. [`crate::feed::Feed::quarantined`] lists the rows found so far;
//! the file, row group and row of each are resolved on demand by the
//! origins query `explain_batch` runs (one pass without the preprocessing
//! per epoch asked; a feed shuffled by position too, whose failing rows
//! are isolated above the shuffle like the others). Checkpoints carry the rows of the epochs before them,
//! so a resumed run's table is the uninterrupted run's. A row costs about
//! 100 bytes plus its error text (cut to 2,000 characters) on every rank
//! and in every checkpoint, once per epoch it fails in: data that fails
//! by the million is data to fix (`sqlfeed verify`), not to carry.
//!
//! # Limits
//! `max_quarantined` is a count of an epoch's rows, or a fraction of the
//! rows of its order read so far, counting at least
//! [`FRACTION_FLOOR_ROWS`] rows so that a bad row early in the epoch is not
//! already too many. The check is on the order, which every rank reads
//! whole: all ranks fail at the same row, none waits for another in a
//! collective.
//!
//! # Where it runs
//! Embedded and on a cluster. The plan isolates row errors wherever it is
//! planned (`crate::sql::IsolateRowErrors`, on a Ballista scheduler too), so
//! the marked rows reach the client; each rank of a quarantining cluster
//! feed reads the whole epoch's order (the job is not dealt per rank: the
//! row before a slot may be another rank's). A cached feed refuses it for
//! now: the cache stores rows, not which of them failed.

mod replace;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::plan_err;
use datafusion::error::Result;

pub(crate) use replace::Replacer;

use super::RowOrigin;
use crate::exec::row_errors::has_row_errors;

/// Rows a fractional `max_quarantined` counts at least (see the module
/// docs).
pub const FRACTION_FLOOR_ROWS: u64 = 10_000;

/// What a feed does with a row whose functions fail.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum OnError {
    /// The feed fails, naming the row (the default).
    #[default]
    Fail,
    /// The row is left out, recorded and replaced (module docs), up to a
    /// limit.
    Quarantine(QuarantineLimit),
}

/// How many rows an epoch may quarantine before the feed fails.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QuarantineLimit {
    /// At most this many rows per epoch.
    Rows(u64),
    /// At most this fraction of the rows of the epoch's order read so far
    /// (counting at least [`FRACTION_FLOOR_ROWS`]).
    Fraction(f64),
}

impl Default for QuarantineLimit {
    /// 1% of the epoch's rows.
    fn default() -> Self {
        QuarantineLimit::Fraction(0.01)
    }
}

impl QuarantineLimit {
    /// Parses `100` (rows), `0.5%` or `0.005` (a fraction below 1).
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let limit = if let Some(percent) = text.strip_suffix('%') {
            percent
                .trim()
                .parse::<f64>()
                .ok()
                .map(|p| QuarantineLimit::Fraction(p / 100.0))
        } else if let Ok(rows) = text.parse::<u64>() {
            Some(QuarantineLimit::Rows(rows))
        } else {
            text.parse::<f64>().ok().map(QuarantineLimit::Fraction)
        };
        match limit {
            Some(limit) => limit.checked(),
            None => plan_err!(
                "max_quarantined '{text}' is neither a row count (100) nor a fraction \
                 (0.5% or 0.005)"
            ),
        }
    }

    /// `self` if it is a count or a fraction in [0, 1).
    pub fn checked(self) -> Result<Self> {
        match self {
            QuarantineLimit::Fraction(f) if !(0.0..1.0).contains(&f) => plan_err!(
                "max_quarantined {f} is not a fraction from 0 to below 1 (0.01 is 1%; \
                 a whole number is a count of rows)"
            ),
            limit => Ok(limit),
        }
    }

    /// Whether `quarantined` rows among the first `seen` of an epoch's
    /// order are within the limit.
    pub(crate) fn allows(self, quarantined: u64, seen: u64) -> bool {
        match self {
            QuarantineLimit::Rows(rows) => quarantined <= rows,
            QuarantineLimit::Fraction(f) => {
                quarantined as f64 <= f * seen.max(FRACTION_FLOOR_ROWS) as f64
            }
        }
    }
}

impl fmt::Display for QuarantineLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuarantineLimit::Rows(rows) => write!(f, "{rows} rows"),
            QuarantineLimit::Fraction(fraction) => write!(f, "{}%", fraction * 100.0),
        }
    }
}

/// One quarantined row.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuarantinedRow {
    /// The epoch.
    pub epoch: u64,
    /// The row's position in the epoch's order (from 0): the slot it had,
    /// under any world size and batch size.
    pub position: u64,
    /// The function (or expression) that failed on it.
    pub function: String,
    /// The output column whose expression failed.
    pub column: String,
    /// The error's text.
    pub error: String,
    /// Where the row came from, once resolved (`Feed::quarantined`).
    #[serde(skip)]
    pub origin: Option<RowOrigin>,
}

/// `rows` as one Arrow table: `epoch`, `position`, `function`, `column`,
/// `error`, and the origin's `file`, `row_group` and `row` (null where not
/// resolved): what `--quarantine-out` writes.
pub fn quarantine_table(rows: &[QuarantinedRow]) -> Result<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("epoch", DataType::UInt64, false),
        Field::new("position", DataType::UInt64, false),
        Field::new("function", DataType::Utf8, false),
        Field::new("column", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, false),
        Field::new("file", DataType::Utf8, true),
        Field::new("row_group", DataType::UInt64, true),
        Field::new("row", DataType::UInt64, true),
    ]));
    let text = |pick: fn(&QuarantinedRow) -> &str| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(rows.iter().map(pick)))
    };
    let origin = |pick: fn(&RowOrigin) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter(
            rows.iter().map(|r| r.origin.as_ref().map(pick)),
        ))
    };
    Ok(RecordBatch::try_new(
        schema,
        vec![
            Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.epoch))),
            Arc::new(UInt64Array::from_iter_values(
                rows.iter().map(|r| r.position),
            )),
            text(|r| &r.function),
            text(|r| &r.column),
            text(|r| &r.error),
            Arc::new(StringArray::from_iter(
                rows.iter()
                    .map(|r| r.origin.as_ref().map(|o| o.file.as_str())),
            )),
            origin(|o| o.row_group as u64),
            origin(|o| o.row),
        ],
    )?)
}

/// The rows a feed quarantined, by (epoch, position); shared by the
/// epochs' sinks and the feed.
#[derive(Debug, Default)]
pub(crate) struct QuarantineLog {
    rows: Mutex<BTreeMap<(u64, u64), QuarantinedRow>>,
}

impl QuarantineLog {
    /// A log holding `rows` (a checkpoint's).
    pub(crate) fn with_rows(rows: &[QuarantinedRow]) -> Self {
        let log = Self::default();
        for row in rows {
            log.record(row.clone());
        }
        log
    }

    /// Records `row`; a row found again (an epoch's rows before a resume
    /// point run again) is kept once.
    pub(crate) fn record(&self, row: QuarantinedRow) {
        if let Ok(mut rows) = self.rows.lock() {
            rows.insert((row.epoch, row.position), row);
        }
    }

    /// The rows so far, by epoch and position.
    pub(crate) fn rows(&self) -> Vec<QuarantinedRow> {
        self.rows
            .lock()
            .map(|rows| rows.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The rows before `rows` rows of `epoch`'s order (what a checkpoint
    /// there has consumed).
    pub(crate) fn rows_before(&self, epoch: u64, rows: u64) -> Vec<QuarantinedRow> {
        self.rows
            .lock()
            .map(|log| {
                log.range(..(epoch, rows))
                    .map(|(_, row)| row.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A feed's quarantine: its limit and its log.
#[derive(Debug, Clone)]
pub(crate) struct Quarantine {
    pub(crate) limit: QuarantineLimit,
    pub(crate) log: Arc<QuarantineLog>,
}

/// `schema` without the marker column of isolated row errors, if it has
/// one: what the feed's tensors are made of.
pub(crate) fn without_marker(schema: SchemaRef) -> SchemaRef {
    if !has_row_errors(&schema) {
        return schema;
    }
    let fields = &schema.fields()[..schema.fields().len() - 1];
    Arc::new(Schema::new_with_metadata(
        fields.to_vec(),
        schema.metadata().clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_as_counts_percentages_and_fractions() -> Result<()> {
        assert_eq!(QuarantineLimit::parse("100")?, QuarantineLimit::Rows(100));
        assert_eq!(
            QuarantineLimit::parse("0.5%")?,
            QuarantineLimit::Fraction(0.005)
        );
        assert_eq!(
            QuarantineLimit::parse("0.02")?,
            QuarantineLimit::Fraction(0.02)
        );
        for bad in ["many", "150%", "-1", "1.5"] {
            let err = QuarantineLimit::parse(bad).unwrap_err().to_string();
            assert!(err.contains("max_quarantined"), "{bad}: {err}");
        }
        Ok(())
    }

    #[test]
    fn a_fraction_counts_at_least_the_floor_of_rows() {
        let one_percent = QuarantineLimit::Fraction(0.01);
        // 100 of the first 10 rows: within 1% of the floor's 10,000.
        assert!(one_percent.allows(100, 10));
        assert!(!one_percent.allows(101, 10));
        assert!(one_percent.allows(1_000, 100_000));
        assert!(!one_percent.allows(1_001, 100_000));
        assert!(QuarantineLimit::Rows(3).allows(3, 1));
        assert!(!QuarantineLimit::Rows(3).allows(4, 1_000_000));
    }

    #[test]
    fn the_log_keeps_a_row_found_again_once() {
        let row = |epoch, position| QuarantinedRow {
            epoch,
            position,
            function: "image_decode".into(),
            column: "x".into(),
            error: "truncated".into(),
            origin: None,
        };
        let log = QuarantineLog::with_rows(&[row(0, 5), row(1, 2)]);
        log.record(row(1, 2));
        log.record(row(1, 9));
        assert_eq!(log.rows().len(), 3);
        assert_eq!(log.rows_before(1, 9), vec![row(0, 5), row(1, 2)]);
    }
}
