//! A distributed `SHUFFLE` planned for unique rows: rows routed to their key
//! range from the first stage, and the check that no row repeats.
//!
//! ```text
//!  copy stage (always correct)              unique rows (one exchange fewer)
//!  ShuffleKeyExec                           ShuffleKeyExec
//!  hash exchange on the content key         RangeBucketExec (content key)
//!  PermuteExec: number copies, final keys   range exchange
//!  RangeBucketExec (final key)              PermuteExec (ranged)
//!  range exchange                           ShuffleMergeExec: refuses a
//!  PermuteExec (ranged)                       repeated row (this module)
//!  ShuffleMergeExec
//! ```
//!
//! # Why it is exact
//! Copy 0 of a row keeps its content key (`super::copies::copy_key`), so
//! where no row repeats every final key is the content key, and routing by
//! the content key's range gives the copy stage's ranges and order. Copies
//! of a row share the content key, so they all reach one range task and,
//! sorted, sit in one run of equal keys: the check compares the rows of each
//! such run (different rows whose keys collide pass) and fails the task on
//! the first repeated row, with [`REPEATED_ROWS`] in the message. A cluster
//! feed then runs the epoch again with the copy stage (`crate::cluster`'s
//! shared job), and remembers it for the rest of the run. Count rows of a
//! dealt job (copies of a data row, see `super::range`) are not data and are
//! skipped.
//!
//! # Memory
//! The rows of the current run of equal keys, as one-row slices of their
//! batches (almost always one row).

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{SchemaRef, UInt64Type};
use datafusion::common::{exec_err, internal_err};
use datafusion::error::Result;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use super::copies::rows_equal;
use super::range::{RANGE_BUCKET_COLUMN, RANGE_COUNTS_COLUMN};
use super::{CopyIdentity, SHUFFLE_KEY_COLUMN};

/// What the error of a repeated row says first: the cluster client looks for
/// it in a failed job's message.
pub const REPEATED_ROWS: &str =
    "sqlfeed: repeated rows in a SHUFFLE planned for unique rows";

/// Where the columns of a keyed, range-routed row are.
#[derive(Debug, Clone)]
struct Layout {
    /// The columns that make two rows copies (see [`CopyIdentity`]).
    content: std::ops::Range<usize>,
    key: usize,
    counts: Option<usize>,
}

impl Layout {
    fn of(schema: &SchemaRef, copies: CopyIdentity) -> Result<Self> {
        let index = |name: &str| schema.index_of(name).ok();
        let Some(key) = index(SHUFFLE_KEY_COLUMN) else {
            return internal_err!("the unique-rows check needs {SHUFFLE_KEY_COLUMN}");
        };
        let counts = index(RANGE_COUNTS_COLUMN);
        let content = [counts, index(RANGE_BUCKET_COLUMN), Some(key)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(key);
        if let CopyIdentity::ContentHash(index) = copies
            && index >= content
        {
            return internal_err!(
                "the unique-rows check's content hash column {index} is not one of the \
                 {content} columns of a row"
            );
        }
        Ok(Self {
            content: copies.columns(content),
            key,
            counts,
        })
    }
}

/// The rows of the current run of equal keys.
#[derive(Default)]
struct Run {
    key: Option<u64>,
    rows: Vec<RecordBatch>,
}

impl Run {
    /// Checks row `i` of `batch` against the run; fails on a repeated row.
    fn push(&mut self, batch: &RecordBatch, i: usize, layout: &Layout) -> Result<()> {
        let keys = batch.column(layout.key).as_primitive::<UInt64Type>();
        let key = keys.value(i);
        if self.key != Some(key) {
            self.key = Some(key);
            self.rows.clear();
        } else if self
            .rows
            .iter()
            .any(|seen| rows_equal(batch, i, seen, 0, layout.content.clone()))
        {
            return exec_err!(
                "{REPEATED_ROWS}: two rows hold the same values (key {key:016x}). A cluster \
                 feed runs the epoch again with the stage that numbers repeated rows (SET \
                 sqlfeed.try_unique_rows = false plans it at once); elsewhere, SET \
                 sqlfeed.assume_unique_rows = false"
            );
        }
        self.rows.push(batch.slice(i, 1));
        Ok(())
    }
}

/// `input` (key-sorted rows of one range) passed on unchanged, failing at
/// the first row whose values (as `copies` says) another row of the range
/// holds.
pub(crate) fn refuse_repeated_rows(
    input: SendableRecordBatchStream,
    copies: CopyIdentity,
) -> Result<SendableRecordBatchStream> {
    let schema = input.schema();
    let layout = Layout::of(&schema, copies)?;
    let mut run = Run::default();
    let checked = input.map(move |batch| {
        let batch = batch?;
        let counts = layout.counts.map(|c| Arc::clone(batch.column(c)));
        for i in 0..batch.num_rows() {
            if counts.as_ref().is_some_and(|c| c.is_valid(i)) {
                continue;
            }
            run.push(&batch, i, &layout)?;
        }
        Ok(batch)
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, checked)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{BinaryArray, Int64Array, UInt64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use futures::TryStreamExt;

    fn batch(values: &[i64], keys: &[u64], counts: &[Option<&[u8]>]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, false),
            Field::new(RANGE_COUNTS_COLUMN, DataType::Binary, true),
            Field::new(RANGE_BUCKET_COLUMN, DataType::UInt64, false),
            Field::new(SHUFFLE_KEY_COLUMN, DataType::UInt64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(values.to_vec())),
                Arc::new(BinaryArray::from(counts.to_vec())),
                Arc::new(UInt64Array::from(vec![0; values.len()])),
                Arc::new(UInt64Array::from(keys.to_vec())),
            ],
        )
        .expect("a batch")
    }

    async fn check(batches: Vec<RecordBatch>) -> Result<usize> {
        let schema = batches[0].schema();
        let stream: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::iter(batches.into_iter().map(Ok)),
        ));
        let out: Vec<RecordBatch> = refuse_repeated_rows(stream, CopyIdentity::Values)?
            .try_collect()
            .await?;
        Ok(out.iter().map(RecordBatch::num_rows).sum())
    }

    #[tokio::test]
    async fn unique_rows_and_colliding_keys_pass() -> Result<()> {
        // Rows 2 and 3 share a key but differ: a collision, not a copy. The
        // count row repeats row 0's values and is skipped.
        let first = batch(
            &[1, 1, 2, 3],
            &[5, 5, 7, 7],
            &[None, Some(b"counts"), None, None],
        );
        let second = batch(&[4], &[9], &[None]);
        assert_eq!(check(vec![first, second]).await?, 5);
        Ok(())
    }

    #[tokio::test]
    async fn a_repeated_row_fails_also_across_batches() -> Result<()> {
        let first = batch(&[1, 2], &[5, 7], &[None, None]);
        let second = batch(&[3, 2], &[7, 7], &[None, None]);
        let err = check(vec![first, second])
            .await
            .expect_err("a repeated row");
        assert!(err.to_string().contains(REPEATED_ROWS), "{err}");
        assert!(err.to_string().contains("0000000000000007"), "{err}");
        Ok(())
    }
}
