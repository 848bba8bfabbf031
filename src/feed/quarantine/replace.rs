//! [`Replacer`]: the marked rows of an epoch's order logged and replaced,
//! in the sink before the batcher (see the module docs of `quarantine`).
//!
//! # Memory
//! The latest row that evaluated (one row, copied), and the record batches
//! before the epoch's first row that evaluated (rows that all failed: at
//! most the limit's worth).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, RecordBatch, RecordBatchOptions, UInt32Array,
};
use datafusion::arrow::compute::{interleave, take_record_batch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::exec_err;
use datafusion::error::Result;

use super::{Quarantine, QuarantinedRow, without_marker};
use crate::exec::row_errors::{RowError, none_marked, row_errors};

/// What the summary of a failed epoch says of one function's failures.
#[derive(Debug)]
struct Failures {
    rows: u64,
    first_position: u64,
    first_error: String,
}

/// Replaces the marked rows of one epoch's order; see the module docs.
#[derive(Debug)]
pub(crate) struct Replacer {
    epoch: u64,
    quarantine: Quarantine,
    /// The rows' schema without the marker.
    schema: SchemaRef,
    /// Rows of the order pushed so far.
    seen: u64,
    /// Of which marked.
    quarantined: u64,
    /// The latest row that evaluated, as a one-row batch.
    previous: Option<RecordBatch>,
    /// Batches (without the marker) before the epoch's first row that
    /// evaluated, with which of their rows are marked.
    waiting: Vec<(RecordBatch, Vec<bool>)>,
    /// By (function, column): for the summary of a failed epoch.
    failures: BTreeMap<(String, String), Failures>,
}

impl Replacer {
    /// The replacer of `epoch`, whose rows have `schema` (with the marker).
    pub(crate) fn new(epoch: u64, quarantine: Quarantine, schema: SchemaRef) -> Self {
        Self {
            epoch,
            quarantine,
            schema: without_marker(schema),
            seen: 0,
            quarantined: 0,
            previous: None,
            waiting: vec![],
            failures: BTreeMap::new(),
        }
    }

    /// The rows of `batch`, the next of the order, with its marked rows
    /// replaced: none while the epoch has had no row that evaluated, then
    /// those held back too. Fails past the limit.
    pub(crate) fn push(&mut self, batch: RecordBatch) -> Result<Vec<RecordBatch>> {
        let columns = batch.columns()[..batch.num_columns() - 1].to_vec();
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        let rows = RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?;
        if none_marked(&batch) && self.previous.is_some() {
            // The common case: nothing to replace, one row to remember.
            self.seen += batch.num_rows() as u64;
            if rows.num_rows() > 0 {
                self.previous = Some(one_row(&rows, rows.num_rows() - 1)?);
            }
            return Ok(vec![rows]);
        }
        let marks = row_errors(&batch)?;
        let mut marked = Vec::with_capacity(marks.len());
        for (row, mark) in marks.into_iter().enumerate() {
            marked.push(mark.is_some());
            if let Some(mark) = mark {
                self.record(self.seen + row as u64, mark)?;
            }
        }
        self.seen += batch.num_rows() as u64;
        if self.previous.is_none() {
            let Some(first) = marked.iter().position(|m| !m) else {
                if rows.num_rows() > 0 {
                    self.waiting.push((rows, marked));
                }
                return Ok(vec![]);
            };
            // Rows before the epoch's first row that evaluated take it.
            self.previous = Some(one_row(&rows, first)?);
            let mut out = vec![];
            for (waiting, waiting_marked) in std::mem::take(&mut self.waiting) {
                out.push(self.fill(waiting, &waiting_marked)?);
            }
            out.push(self.fill(rows, &marked)?);
            return Ok(out);
        }
        Ok(vec![self.fill(rows, &marked)?])
    }

    /// The end of the epoch's order: an error if no row of it evaluated.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.waiting.is_empty() {
            return Ok(());
        }
        exec_err!(
            "every one of the {} rows of epoch {}'s order was quarantined: nothing can \
             take their slots.\n{}",
            self.seen,
            self.epoch,
            self.summary()
        )
    }

    /// Logs the row at `position`; fails past the limit.
    fn record(&mut self, position: u64, mark: RowError) -> Result<()> {
        self.quarantined += 1;
        let failures = self
            .failures
            .entry((mark.function.clone(), mark.column.clone()))
            .or_insert_with(|| Failures {
                rows: 0,
                first_position: position,
                first_error: mark.error.clone(),
            });
        failures.rows += 1;
        self.quarantine.log.record(QuarantinedRow {
            epoch: self.epoch,
            position,
            function: mark.function,
            column: mark.column,
            error: bounded(mark.error),
            origin: None,
        });
        let limit = self.quarantine.limit;
        if !limit.allows(self.quarantined, position + 1) {
            return exec_err!(
                "epoch {} quarantined {} of the first {} rows of its order, more than \
                 max_quarantined ({limit}) allows:\n{}",
                self.epoch,
                self.quarantined,
                position + 1,
                self.summary()
            );
        }
        Ok(())
    }

    /// One line per failing function, and what to do.
    fn summary(&self) -> String {
        let mut lines: Vec<String> = self
            .failures
            .iter()
            .map(|((function, column), f)| {
                format!(
                    "  - {function} (column {column}): {} rows, the first at position {} \
                     of the order: {}",
                    f.rows, f.first_position, f.first_error
                )
            })
            .collect();
        lines.push(
            "Fix or remove those rows (`sqlfeed verify` finds damaged images), or raise \
             max_quarantined; the feed's quarantined() (the CLI's --quarantine-out) lists \
             each row with its file and row."
                .into(),
        );
        lines.join("\n")
    }

    /// `rows` with each marked row replaced by the latest row before it
    /// that evaluated; that row becomes the batch's last that evaluated.
    fn fill(&mut self, rows: RecordBatch, marked: &[bool]) -> Result<RecordBatch> {
        let Some(previous) = self.previous.as_ref() else {
            return exec_err!("a marked row with no row to take its slot");
        };
        if !marked.iter().any(|m| *m) {
            if rows.num_rows() > 0 {
                self.previous = Some(one_row(&rows, rows.num_rows() - 1)?);
            }
            return Ok(rows);
        }
        // (0, 0): the row before the batch; (1, i): row i of the batch.
        let mut source = (0, 0);
        let indices: Vec<(usize, usize)> = marked
            .iter()
            .enumerate()
            .map(|(row, marked)| {
                if !marked {
                    source = (1, row);
                }
                source
            })
            .collect();
        let columns = (0..rows.num_columns())
            .map(|c| {
                let sources: [&dyn Array; 2] =
                    [previous.column(c).as_ref(), rows.column(c).as_ref()];
                interleave(&sources, &indices)
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows.num_rows()));
        let filled = RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?;
        if source.0 == 1 {
            self.previous = Some(one_row(&rows, source.1)?);
        }
        Ok(filled)
    }
}

/// Characters of an error text the table keeps: a Python traceback is
/// about 600; every rank and every checkpoint holds each row's.
const MAX_ERROR_CHARS: usize = 2000;

/// `error`, its middle cut out past [`MAX_ERROR_CHARS`] (the start says
/// what failed, the end what was raised).
fn bounded(error: String) -> String {
    let chars = error.chars().count();
    if chars <= MAX_ERROR_CHARS {
        return error;
    }
    let head: String = error.chars().take(MAX_ERROR_CHARS / 4).collect();
    let tail: String = error
        .chars()
        .skip(chars - MAX_ERROR_CHARS * 3 / 4)
        .collect();
    format!(
        "{head} … ({} characters cut) … {tail}",
        chars - MAX_ERROR_CHARS
    )
}

/// Row `row` of `batch`, copied (a slice would keep the whole batch).
fn one_row(batch: &RecordBatch, row: usize) -> Result<RecordBatch> {
    Ok(take_record_batch(
        batch,
        &UInt32Array::from(vec![row as u32]),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::row_errors::{isolating_schema, row_error_field};
    use crate::feed::quarantine::{QuarantineLimit, QuarantineLog};
    use datafusion::arrow::array::{AsArray, Int64Array, StringArray, StructArray};
    use datafusion::arrow::buffer::NullBuffer;
    use datafusion::arrow::datatypes::{DataType, Field, Fields, Int64Type, Schema};

    /// A batch of `values` (column `x`) whose `bad` values are marked.
    fn marked(values: &[i64], bad: &[i64]) -> RecordBatch {
        let schema =
            isolating_schema(&Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let DataType::Struct(fields) = row_error_field().data_type().clone() else {
            unreachable!()
        };
        let fields: Fields = fields;
        let texts = |text: &str| -> ArrayRef {
            Arc::new(StringArray::from_iter_values(
                values.iter().map(|_| text.to_string()),
            ))
        };
        let marker = StructArray::new(
            fields,
            vec![texts("f"), texts("x"), texts("boom")],
            Some(NullBuffer::from_iter(
                values.iter().map(|v| bad.contains(v)),
            )),
        );
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(values.to_vec())),
                Arc::new(marker),
            ],
        )
        .unwrap()
    }

    fn replacer(limit: QuarantineLimit) -> (Replacer, Arc<QuarantineLog>) {
        let log = Arc::new(QuarantineLog::default());
        let quarantine = Quarantine {
            limit,
            log: Arc::clone(&log),
        };
        (Replacer::new(3, quarantine, marked(&[], &[]).schema()), log)
    }

    fn values(batches: &[RecordBatch]) -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect()
    }

    #[test]
    fn a_marked_row_takes_the_row_before_it_across_batches() -> Result<()> {
        let (mut replacer, log) = replacer(QuarantineLimit::Rows(10));
        let mut out = replacer.push(marked(&[1, 2, 3], &[2]))?;
        out.extend(replacer.push(marked(&[4, 5, 6], &[4, 5]))?);
        replacer.finish()?;
        assert_eq!(values(&out), vec![1, 1, 3, 3, 3, 6]);
        let positions: Vec<(u64, u64)> =
            log.rows().iter().map(|r| (r.epoch, r.position)).collect();
        assert_eq!(positions, vec![(3, 1), (3, 3), (3, 4)]);
        assert_eq!(out[0].schema().fields().len(), 1, "the marker is gone");
        Ok(())
    }

    #[test]
    fn marked_rows_at_the_epochs_start_take_its_first_row_that_evaluated() -> Result<()> {
        let (mut replacer, _) = replacer(QuarantineLimit::Rows(10));
        assert!(replacer.push(marked(&[1, 2], &[1, 2]))?.is_empty());
        let out = replacer.push(marked(&[3, 4, 5], &[3, 5]))?;
        replacer.finish()?;
        assert_eq!(values(&out), vec![4, 4, 4, 4, 4]);
        Ok(())
    }

    #[test]
    fn a_long_error_keeps_its_start_and_end() {
        let long = format!("start{}end", "x".repeat(5000));
        let kept = bounded(long);
        assert!(kept.starts_with("start") && kept.ends_with("end"), "{kept}");
        assert!(kept.contains("(3008 characters cut)"), "{kept}");
        assert_eq!(bounded("short".into()), "short");
    }

    #[test]
    fn an_epoch_with_no_row_that_evaluates_fails() -> Result<()> {
        let (mut replacer, _) = replacer(QuarantineLimit::Rows(10));
        replacer.push(marked(&[1, 2], &[1, 2]))?;
        let err = replacer.finish().unwrap_err().to_string();
        assert!(err.contains("every one of the 2 rows of epoch 3"), "{err}");
        Ok(())
    }

    #[test]
    fn past_the_limit_the_epoch_fails_with_a_summary() -> Result<()> {
        let (mut replacer, log) = replacer(QuarantineLimit::Rows(2));
        let err = replacer
            .push(marked(&[1, 2, 3, 4], &[2, 3, 4]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("epoch 3 quarantined 3 of the first 4 rows")
                && err.contains("max_quarantined (2 rows)")
                && err.contains(
                    "f (column x): 3 rows, the first at position 1 of the order: boom"
                ),
            "{err}"
        );
        assert_eq!(log.rows().len(), 3);
        Ok(())
    }
}
