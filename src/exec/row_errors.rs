//! Row errors isolated: a projection evaluated so that the rows whose
//! functions fail are marked, not fatal. What a feed with
//! `on_error = quarantine` runs its output projections with (see
//! `crate::feed::quarantine`, which replaces the marked rows).
//!
//! ```text
//!  morsel of rows ──► evaluate every expression ── ok ──► rows + null marker
//!                          │ a row error
//!                          ▼
//!                     evaluated again in chunks of 16 rows, and a chunk
//!                     that fails row by row; each failing row is marked
//!                     with the function that failed, its output column and
//!                     the error text, and its values are nulls
//! ```
//!
//! # The marker
//! The output gains a last column [`ROW_ERROR_COLUMN`]: a struct of
//! `function`, `column` and `error`, null on every row that evaluated. The
//! projection's own fields become nullable, since a marked row holds nulls.
//! A projection whose input already carries the marker (a stack of
//! projections) keeps the input's mark of a row: the first failure is the
//! one reported.
//!
//! # Which errors are a row's
//! Execution errors, errors raised by functions (external, Arrow, a
//! plugin's across the FFI) and panics of a function. Errors that say the plan, the engine or the memory
//! budget is at fault (plan, internal, not implemented, resources, schema,
//! configuration) are no row's and end the stream as before.
//!
//! # Cost
//! Nothing beyond the marker's null column while every row evaluates. A
//! morsel of `n` rows with `k` failing rows is evaluated again: its rows
//! once more in chunks of [`CHUNK_ROWS`], and `CHUNK_ROWS` rows per failing
//! chunk one by one — about `n + 16·k` rows, where halving would evaluate
//! about `n·log2(n/k)` (measured in BENCHMARKS.md, bench-quarantine).
//! Row-wise functions give each row the value it gets in the whole morsel,
//! so the rows that evaluate keep their values.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions, StringArray, StructArray,
    new_null_array,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::concat;
use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::projection::ProjectionExpr;

/// Name of the marker column a projection isolating row errors appends.
pub const ROW_ERROR_COLUMN: &str = "__sqlfeed_row_error";

/// Why one row was marked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    /// The innermost function (or expression) that failed on the row.
    pub function: String,
    /// The output column whose expression failed.
    pub column: String,
    /// The error's text.
    pub error: String,
}

/// The marker column's fields.
fn row_error_fields() -> Fields {
    Fields::from(vec![
        Field::new("function", DataType::Utf8, false),
        Field::new("column", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, false),
    ])
}

/// The marker column's field.
pub fn row_error_field() -> Field {
    Field::new(ROW_ERROR_COLUMN, DataType::Struct(row_error_fields()), true)
}

/// Whether `schema` ends with the marker column.
pub fn has_row_errors(schema: &Schema) -> bool {
    schema
        .fields()
        .last()
        .is_some_and(|f| f.name() == ROW_ERROR_COLUMN)
}

/// A projection's output schema when it isolates row errors: its fields
/// nullable, the marker appended.
pub fn isolating_schema(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    fields.push(row_error_field());
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The marks of `batch`'s rows (`None`: the row evaluated), read from its
/// marker column.
pub fn row_errors(batch: &RecordBatch) -> Result<Vec<Option<RowError>>> {
    let Some(column) = batch.columns().last() else {
        return Ok(vec![]);
    };
    let marks = column.as_struct_opt().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "the {ROW_ERROR_COLUMN} column is {}, not a struct",
            column.data_type()
        ))
    })?;
    let text = |i: usize| {
        marks.column(i).as_string_opt::<i32>().ok_or_else(|| {
            DataFusionError::Internal(format!("the {ROW_ERROR_COLUMN} struct's fields"))
        })
    };
    let (function, column, error) = (text(0)?, text(1)?, text(2)?);
    Ok((0..marks.len())
        .map(|row| {
            marks.is_valid(row).then(|| RowError {
                function: function.value(row).to_string(),
                column: column.value(row).to_string(),
                error: error.value(row).to_string(),
            })
        })
        .collect())
}

/// Whether no row of `batch` (which ends with the marker column) is
/// marked: the common case, told without reading the marks.
pub fn none_marked(batch: &RecordBatch) -> bool {
    batch
        .columns()
        .last()
        .is_some_and(|marks| marks.null_count() == marks.len())
}

/// Whether `err` is a row's fault (see the module docs).
fn is_row_error(err: &DataFusionError) -> bool {
    match err {
        DataFusionError::Context(_, inner) => is_row_error(inner),
        DataFusionError::Shared(inner) => is_row_error(inner),
        DataFusionError::Diagnostic(_, inner) => is_row_error(inner),
        DataFusionError::Collection(errors) => errors.iter().all(is_row_error),
        DataFusionError::Execution(_)
        | DataFusionError::External(_)
        | DataFusionError::ArrowError(..)
        | DataFusionError::Ffi(_) => true,
        _ => false,
    }
}

/// `exprs` evaluated on `batch`; a panic of a function is an execution
/// error naming it (it is then a row error like any other).
fn evaluate_all(exprs: &[ProjectionExpr], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    let rows = batch.num_rows();
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        exprs
            .iter()
            .map(|e| e.expr.evaluate(batch)?.into_array(rows))
            .collect::<Result<Vec<ArrayRef>>>()
    }))
    .unwrap_or_else(|panic| {
        Err(DataFusionError::Execution(format!(
            "a function panicked: {}",
            super::panic_message(&panic)
        )))
    })
}

/// A run of rows that evaluated, or one marked row.
enum Piece {
    Rows(Vec<ArrayRef>),
    Marked(RowError),
}

/// `exprs` evaluated on `batch` into `schema` (an [`isolating_schema`]):
/// see the module docs. The input's own marker column, if it has one, is
/// the last; the input rows it marks keep that mark.
pub fn evaluate_isolating(
    exprs: &[ProjectionExpr],
    schema: &SchemaRef,
    batch: &RecordBatch,
) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut pieces = vec![];
    isolate(exprs, batch, 0, rows, &mut pieces)?;
    let outputs = exprs.len();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(outputs + 1);
    let mut marks: Vec<Option<RowError>> = Vec::with_capacity(rows);
    if let [Piece::Rows(arrays)] = pieces.as_slice() {
        columns.extend(arrays.iter().cloned());
        marks.resize(rows, None);
    } else {
        for (i, expr) in exprs.iter().enumerate() {
            let data_type = expr.expr.data_type(&batch.schema())?;
            let parts: Vec<ArrayRef> = pieces
                .iter()
                .map(|piece| match piece {
                    Piece::Rows(arrays) => Arc::clone(&arrays[i]),
                    Piece::Marked(_) => new_null_array(&data_type, 1),
                })
                .collect();
            let parts: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
            columns.push(concat(&parts)?);
        }
        for piece in pieces {
            match piece {
                Piece::Rows(arrays) => {
                    let n = arrays.first().map_or(0, |a| a.len());
                    marks.extend(std::iter::repeat_n(None, n));
                }
                Piece::Marked(mark) => marks.push(Some(mark)),
            }
        }
    }
    // A mark the input already carried comes first.
    if has_row_errors(&batch.schema()) {
        for (row, inherited) in row_errors(batch)?.into_iter().enumerate() {
            if inherited.is_some() {
                marks[row] = inherited;
            }
        }
    }
    columns.push(marker_array(&marks));
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &options,
    )?)
}

/// Rows a failing morsel is evaluated again in, before a failing chunk is
/// evaluated row by row.
pub const CHUNK_ROWS: usize = 16;

/// Rows `[offset, offset + len)` of `batch` evaluated into `pieces`: whole,
/// and if that fails in chunks of [`CHUNK_ROWS`] rows, then rows.
fn isolate(
    exprs: &[ProjectionExpr],
    batch: &RecordBatch,
    offset: usize,
    len: usize,
    pieces: &mut Vec<Piece>,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let slice = batch.slice(offset, len);
    match evaluate_all(exprs, &slice) {
        Ok(arrays) => pieces.push(Piece::Rows(arrays)),
        Err(err) if !is_row_error(&err) => return Err(err),
        Err(err) if len == 1 => pieces.push(Piece::Marked(describe(exprs, &slice, err))),
        Err(_) => {
            let chunk = if len > CHUNK_ROWS { CHUNK_ROWS } else { 1 };
            for start in (0..len).step_by(chunk) {
                isolate(exprs, batch, offset + start, chunk.min(len - start), pieces)?;
            }
        }
    }
    Ok(())
}

/// What failed on the one row of `row`: the first output column whose
/// expression fails, and in it the innermost function that fails on
/// arguments that evaluate.
fn describe(
    exprs: &[ProjectionExpr],
    row: &RecordBatch,
    err: DataFusionError,
) -> RowError {
    for expr in exprs {
        if let Err(own) = evaluate_one(&expr.expr, row) {
            let (function, error) = innermost_failure(&expr.expr, row, own);
            return RowError {
                function,
                column: expr.alias.clone(),
                error: error_text(&error),
            };
        }
    }
    // Each expression evaluates alone: the failure was in how they ran
    // together (a panic).
    RowError {
        function: String::new(),
        column: String::new(),
        error: error_text(&err),
    }
}

fn evaluate_one(expr: &Arc<dyn PhysicalExpr>, row: &RecordBatch) -> Result<ArrayRef> {
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        expr.evaluate(row)?.into_array(row.num_rows())
    }))
    .unwrap_or_else(|panic| {
        Err(DataFusionError::Execution(format!(
            "a function panicked: {}",
            super::panic_message(&panic)
        )))
    })
}

/// The innermost sub-expression of `expr` that fails on `row` while its
/// arguments evaluate, named (a function by its name), with its error.
fn innermost_failure(
    expr: &Arc<dyn PhysicalExpr>,
    row: &RecordBatch,
    err: DataFusionError,
) -> (String, DataFusionError) {
    for child in expr.children() {
        if let Err(child_err) = evaluate_one(child, row) {
            return innermost_failure(child, row, child_err);
        }
    }
    let name = match expr.as_ref().downcast_ref::<ScalarFunctionExpr>() {
        Some(function) => function.name().to_string(),
        None => expr.to_string(),
    };
    (name, err)
}

/// An error's text without the engine's wrapping ("External error: …").
fn error_text(err: &DataFusionError) -> String {
    let mut inner = err;
    loop {
        inner = match inner {
            DataFusionError::Context(_, next) => next,
            DataFusionError::Shared(next) => next,
            _ => break,
        };
    }
    let text = match inner {
        DataFusionError::Execution(message) => message.clone(),
        DataFusionError::External(source) => source.to_string(),
        other => other.strip_backtrace(),
    };
    text.trim_end().to_string()
}

/// The marker column for `marks`.
fn marker_array(marks: &[Option<RowError>]) -> ArrayRef {
    if marks.iter().all(Option::is_none) {
        return new_null_array(&DataType::Struct(row_error_fields()), marks.len());
    }
    let text = |pick: fn(&RowError) -> &str| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(
            marks.iter().map(|m| m.as_ref().map_or("", pick)),
        ))
    };
    let nulls = NullBuffer::from_iter(marks.iter().map(Option::is_some));
    Arc::new(StructArray::new(
        row_error_fields(),
        vec![
            text(|m| &m.function),
            text(|m| &m.column),
            text(|m| &m.error),
        ],
        Some(nulls),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::Int64Type;
    use datafusion::common::exec_err;
    use datafusion::logical_expr::{
        ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
        Volatility,
    };
    use datafusion::physical_expr::expressions::Column;

    /// `fails_on(x)`: `x * 10`, an error on multiples of 7, a panic on 50.
    #[derive(Debug, PartialEq, Eq, Hash)]
    struct FailsOn {
        signature: Signature,
    }

    impl ScalarUDFImpl for FailsOn {
        fn name(&self) -> &str {
            "fails_on"
        }
        fn signature(&self) -> &Signature {
            &self.signature
        }
        fn return_type(&self, _: &[DataType]) -> Result<DataType> {
            Ok(DataType::Int64)
        }
        fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
            let values = args.args[0].to_array(args.number_rows)?;
            let values = values.as_primitive::<Int64Type>();
            if values.values().contains(&50) {
                panic!("fifty");
            }
            if let Some(bad) = values.values().iter().find(|v| *v % 7 == 0) {
                return exec_err!("{bad} is a multiple of 7");
            }
            Ok(ColumnarValue::Array(Arc::new(
                Int64Array::from_iter_values(values.values().iter().map(|v| v * 10)),
            )))
        }
    }

    fn fails_on() -> Result<Vec<ProjectionExpr>> {
        let udf = Arc::new(ScalarUDF::new_from_impl(FailsOn {
            signature: Signature::exact(vec![DataType::Int64], Volatility::Immutable),
        }));
        let schema = Schema::new(vec![Field::new("x", DataType::Int64, false)]);
        let call = ScalarFunctionExpr::try_new(
            udf,
            vec![Arc::new(Column::new("x", 0))],
            &schema,
            Arc::new(datafusion::config::ConfigOptions::default()),
        )?;
        Ok(vec![
            ProjectionExpr::new(Arc::new(call), "y"),
            ProjectionExpr::new(Arc::new(Column::new("x", 0)), "x"),
        ])
    }

    fn input(values: impl IntoIterator<Item = i64>) -> Result<RecordBatch> {
        Ok(RecordBatch::try_from_iter(vec![(
            "x",
            Arc::new(Int64Array::from_iter_values(values)) as ArrayRef,
        )])?)
    }

    fn output_schema() -> SchemaRef {
        isolating_schema(&Schema::new(vec![
            Field::new("y", DataType::Int64, false),
            Field::new("x", DataType::Int64, false),
        ]))
    }

    #[test]
    fn failing_rows_are_marked_and_the_others_keep_their_values() -> Result<()> {
        let batch = input(1..=60)?;
        let out = evaluate_isolating(&fails_on()?, &output_schema(), &batch)?;
        assert_eq!(out.num_rows(), 60);
        let marks = row_errors(&out)?;
        let y = out.column(0).as_primitive::<Int64Type>();
        for (row, mark) in marks.iter().enumerate() {
            let x = row as i64 + 1;
            match mark {
                None => assert_eq!(y.value(row), x * 10, "row {row}"),
                Some(mark) => {
                    assert!(y.is_null(row));
                    assert_eq!(mark.function, "fails_on");
                    assert_eq!(mark.column, "y");
                    if x == 50 {
                        assert_eq!(mark.error, "a function panicked: fifty");
                    } else {
                        assert_eq!(x % 7, 0, "row {row} marked: {mark:?}");
                        assert_eq!(mark.error, format!("{x} is a multiple of 7"));
                    }
                }
            }
        }
        let marked: Vec<i64> = (1..=60)
            .filter(|x| marks[(*x - 1) as usize].is_some())
            .collect();
        assert_eq!(marked, vec![7, 14, 21, 28, 35, 42, 49, 50, 56]);
        Ok(())
    }

    #[test]
    fn a_morsel_without_failures_has_a_null_marker() -> Result<()> {
        let out = evaluate_isolating(&fails_on()?, &output_schema(), &input(1..=6)?)?;
        assert_eq!(out.column(2).null_count(), 6);
        assert!(row_errors(&out)?.iter().all(Option::is_none));
        Ok(())
    }

    #[test]
    fn errors_that_are_no_rows_fault_end_the_stream() {
        assert!(!is_row_error(&DataFusionError::ResourcesExhausted(
            "x".into()
        )));
        assert!(!is_row_error(&DataFusionError::Internal("x".into())));
        assert!(is_row_error(&DataFusionError::Context(
            "decoding".into(),
            Box::new(DataFusionError::Execution("bad".into()))
        )));
    }
}
