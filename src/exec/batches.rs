//! Row gathers that keep a batch's row count when it has no columns.
//!
//! Arrow's `take_record_batch` and `interleave_record_batch` build their
//! result from its columns, so a batch of no columns (what a query keeps
//! under `SELECT count(*) FROM (… SHUFFLE …)`: rows, but no values) fails
//! with "must either specify a row count or at least one column". These
//! give such a batch the gathered row count instead.

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions, UInt32Array};
use datafusion::arrow::compute::{interleave_record_batch, take_record_batch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result;

/// The rows of `batch` at `indices`, in their order.
pub(crate) fn take_rows(
    batch: &RecordBatch,
    indices: &UInt32Array,
) -> Result<RecordBatch> {
    if batch.num_columns() == 0 {
        return rows_without_columns(batch.schema(), indices.len());
    }
    Ok(take_record_batch(batch, indices)?)
}

/// Row `row` of `batches[batch]` for each `(batch, row)` of `indices`, in
/// their order; `batches` is not empty.
pub(crate) fn interleave_rows(
    batches: &[&RecordBatch],
    indices: &[(usize, usize)],
) -> Result<RecordBatch> {
    if let Some(first) = batches.first()
        && first.num_columns() == 0
    {
        return rows_without_columns(first.schema(), indices.len());
    }
    Ok(interleave_record_batch(batches, indices)?)
}

fn rows_without_columns(schema: SchemaRef, rows: usize) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new_with_options(
        schema,
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[test]
    fn gathers_keep_the_row_count_of_batches_without_columns() -> Result<()> {
        let empty = rows_without_columns(Arc::new(Schema::empty()), 5)?;
        let taken = take_rows(&empty, &UInt32Array::from(vec![4, 0, 4]))?;
        assert_eq!((taken.num_columns(), taken.num_rows()), (0, 3));
        let interleaved = interleave_rows(&[&empty, &empty], &[(1, 2), (0, 0)])?;
        assert_eq!((interleaved.num_columns(), interleaved.num_rows()), (0, 2));
        // With columns, Arrow's own gathers.
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let values =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![7, 8]))])?;
        let taken = take_rows(&values, &UInt32Array::from(vec![1, 1, 0]))?;
        let column = taken.column(0).as_any().downcast_ref::<Int64Array>();
        assert_eq!(column.map(|c| c.values().to_vec()), Some(vec![8, 8, 7]));
        let interleaved = interleave_rows(&[&values, &values], &[(1, 0), (0, 1)])?;
        let column = interleaved.column(0).as_any().downcast_ref::<Int64Array>();
        assert_eq!(column.map(|c| c.values().to_vec()), Some(vec![7, 8]));
        Ok(())
    }
}
