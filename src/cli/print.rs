//! Result printing: aligned tables, CSV, JSON and NDJSON.
//!
//! Tables are rendered here rather than with arrow's `pretty` so that long
//! cells (image bytes, token lists) are cut to [`MAX_CELL_CHARS`] and the row
//! limit keeps memory bounded: rows past it are counted, not buffered.

use std::io::Write;
use std::str::FromStr;

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::csv::WriterBuilder as CsvWriterBuilder;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::json::{ArrayWriter, LineDelimitedWriter};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::{DataFusionError, Result};

/// Longest cell shown in table output, in characters.
pub const MAX_CELL_CHARS: usize = 48;

/// How results are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned table with a row count.
    #[default]
    Table,
    /// Comma-separated values with a header.
    Csv,
    /// One JSON array of objects.
    Json,
    /// One JSON object per line.
    Ndjson,
}

impl FromStr for OutputFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "table" => Ok(Self::Table),
            "csv" => Ok(Self::Csv),
            "json" => Ok(Self::Json),
            "ndjson" => Ok(Self::Ndjson),
            other => Err(format!(
                "unknown format '{other}': use table, csv, json or ndjson"
            )),
        }
    }
}

/// Formats one batch's cells as strings, each line cut for table display
/// when `cut` is set.
fn cells(batch: &RecordBatch, cut: bool) -> Result<Vec<Vec<String>>> {
    let options = FormatOptions::default().with_null("NULL");
    let formatters = batch
        .columns()
        .iter()
        .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((0..batch.num_rows())
        .map(|row| {
            formatters
                .iter()
                .map(|f| {
                    let text = f.value(row).to_string();
                    if cut {
                        text.lines().map(shorten).collect::<Vec<_>>().join("\n")
                    } else {
                        text
                    }
                })
                .collect()
        })
        .collect())
}

fn shorten(cell: &str) -> String {
    let cell = cell.replace(['\r', '\t'], " ");
    if cell.chars().count() <= MAX_CELL_CHARS {
        cell
    } else {
        let head: String = cell.chars().take(MAX_CELL_CHARS - 1).collect();
        format!("{head}…")
    }
}

/// CSV has no nested values: lists, structs and maps become their display
/// text (`[1, 2, 3]`), as in the table output but uncut.
fn flatten_for_csv(batch: &RecordBatch) -> Result<RecordBatch> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| f.data_type().is_nested())
    {
        return Ok(batch.clone());
    }
    let options = FormatOptions::default();
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if field.data_type().is_nested() {
            let formatter = ArrayFormatter::try_new(column.as_ref(), &options)?;
            let text: StringArray = (0..column.len())
                .map(|row| {
                    column
                        .is_valid(row)
                        .then(|| formatter.value(row).to_string())
                })
                .collect();
            fields.push(Field::new(field.name(), DataType::Utf8, true));
            columns.push(Arc::new(text) as ArrayRef);
        } else {
            fields.push(field.as_ref().clone());
            columns.push(Arc::clone(column));
        }
    }
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// Renders rows as an aligned table with `+---+` borders; a cell with
/// several lines makes its row that many lines high.
pub fn render_table(schema: &SchemaRef, rows: &[Vec<String>]) -> String {
    let header: Vec<String> = schema.fields().iter().map(|f| shorten(f.name())).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            let widest = cell.lines().map(|l| l.chars().count()).max().unwrap_or(0);
            *w = (*w).max(widest);
        }
    }
    let border: String = widths
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+\n";
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("| {c}{} ", " ".repeat(w - c.chars().count())))
            .collect::<String>()
            + "|\n"
    };
    let mut out = String::new();
    out.push_str(&border);
    out.push_str(&line(&header));
    out.push_str(&border);
    for row in rows {
        let split: Vec<Vec<&str>> = row.iter().map(|c| c.lines().collect()).collect();
        let height = split.iter().map(Vec::len).max().unwrap_or(0).max(1);
        for i in 0..height {
            let cells: Vec<String> = split
                .iter()
                .map(|lines| lines.get(i).copied().unwrap_or_default().to_string())
                .collect();
            out.push_str(&line(&cells));
        }
    }
    if !rows.is_empty() {
        out.push_str(&border);
    }
    out
}

/// Whether `schema` is the result of `EXPLAIN`, whose plans are shown whole.
fn is_explain(schema: &SchemaRef) -> bool {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    names == ["plan_type", "plan"]
}

/// Writes a result as batches arrive; see [`ResultWriter::finish`].
pub enum ResultWriter<'a, W: Write> {
    /// Buffers up to `max_rows` formatted rows, counts the rest.
    Table {
        /// Destination.
        out: &'a mut W,
        /// Schema of the result.
        schema: SchemaRef,
        /// Formatted rows kept for display.
        rows: Vec<Vec<String>>,
        /// Rows kept at most (`0` = all).
        max_rows: usize,
        /// Whether long cell lines are cut (not for query plans).
        cut: bool,
    },
    /// CSV with a header line.
    Csv(Box<datafusion::arrow::csv::Writer<&'a mut W>>),
    /// JSON array.
    Json(ArrayWriter<&'a mut W>),
    /// Newline-delimited JSON.
    Ndjson(LineDelimitedWriter<&'a mut W>),
}

impl<'a, W: Write> ResultWriter<'a, W> {
    /// A writer of `format` for results with `schema`.
    pub fn new(
        format: OutputFormat,
        out: &'a mut W,
        schema: SchemaRef,
        max_rows: usize,
    ) -> Self {
        match format {
            OutputFormat::Table => Self::Table {
                cut: !is_explain(&schema),
                out,
                schema,
                rows: Vec::new(),
                max_rows,
            },
            OutputFormat::Csv => Self::Csv(Box::new(
                CsvWriterBuilder::new().with_header(true).build(out),
            )),
            OutputFormat::Json => Self::Json(ArrayWriter::new(out)),
            OutputFormat::Ndjson => Self::Ndjson(LineDelimitedWriter::new(out)),
        }
    }

    /// Writes (or keeps) one batch.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        match self {
            Self::Table {
                rows,
                max_rows,
                cut,
                ..
            } => {
                let room = if *max_rows == 0 {
                    usize::MAX
                } else {
                    *max_rows - rows.len().min(*max_rows)
                };
                if room > 0 {
                    let take = room.min(batch.num_rows());
                    rows.extend(cells(&batch.slice(0, take), *cut)?);
                }
                Ok(())
            }
            Self::Csv(w) => Ok(w.write(&flatten_for_csv(batch)?)?),
            Self::Json(w) => Ok(w.write(batch)?),
            Self::Ndjson(w) => Ok(w.write(batch)?),
        }
    }

    /// Finishes the output; `total_rows` and `elapsed` go under a table.
    pub fn finish(
        self,
        total_rows: u64,
        elapsed: Option<std::time::Duration>,
    ) -> Result<()> {
        match self {
            Self::Table {
                out, schema, rows, ..
            } => {
                // DDL and SET return no columns: just say it worked.
                let mut text = if schema.fields().is_empty() {
                    "OK".to_string()
                } else {
                    render_table(&schema, &rows)
                };
                if !schema.fields().is_empty() {
                    let noun = if total_rows == 1 { "row" } else { "rows" };
                    text.push_str(&format!("{total_rows} {noun}"));
                }
                if (rows.len() as u64) < total_rows {
                    text.push_str(&format!(
                        " (first {} shown; --max-rows 0 shows all)",
                        rows.len()
                    ));
                }
                if let Some(elapsed) = elapsed {
                    text.push_str(&format!(" in {:.3}s", elapsed.as_secs_f64()));
                }
                text.push('\n');
                out.write_all(text.as_bytes())
                    .map_err(DataFusionError::IoError)
            }
            Self::Csv(w) => w.into_inner().flush().map_err(DataFusionError::IoError),
            Self::Json(mut w) => {
                w.finish()?;
                let out = w.into_inner();
                out.write_all(b"\n").map_err(DataFusionError::IoError)?;
                out.flush().map_err(DataFusionError::IoError)
            }
            Self::Ndjson(mut w) => {
                w.finish()?;
                w.into_inner().flush().map_err(DataFusionError::IoError)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, ListArray};
    use datafusion::arrow::datatypes::Int32Type;

    #[test]
    fn csv_writes_lists_as_text() -> Result<()> {
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), Some(2)]),
            None,
        ]);
        let b = RecordBatch::try_from_iter(vec![("l", Arc::new(list) as ArrayRef)])?;
        let mut csv = Vec::new();
        let mut w = ResultWriter::new(OutputFormat::Csv, &mut csv, b.schema(), 0);
        w.write(&b)?;
        w.finish(2, None)?;
        assert_eq!(
            String::from_utf8(csv).expect("utf8"),
            "l\n\"[1, 2]\"\n\"\"\n"
        );
        Ok(())
    }

    fn batch() -> RecordBatch {
        RecordBatch::try_from_iter(vec![
            ("n", Arc::new(Int32Array::from(vec![Some(1), None])) as _),
            (
                "s",
                Arc::new(StringArray::from(vec!["a", &"x".repeat(100)])) as _,
            ),
        ])
        .expect("valid batch")
    }

    #[test]
    fn table_aligns_cuts_long_cells_and_counts_rows() -> Result<()> {
        let b = batch();
        let mut out = Vec::new();
        let mut w = ResultWriter::new(OutputFormat::Table, &mut out, b.schema(), 0);
        w.write(&b)?;
        w.finish(2, None)?;
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains("| n    | s "), "{text}");
        assert!(text.contains("| NULL |"), "{text}");
        assert!(text.contains('…'), "{text}");
        assert!(text.ends_with("2 rows\n"), "{text}");
        Ok(())
    }

    #[test]
    fn explain_plans_are_shown_whole_on_several_lines() -> Result<()> {
        let plan = format!("ProjectionExec\n  {}", "x".repeat(80));
        let b = RecordBatch::try_from_iter(vec![
            (
                "plan_type",
                Arc::new(StringArray::from(vec!["physical_plan"])) as ArrayRef,
            ),
            ("plan", Arc::new(StringArray::from(vec![plan])) as ArrayRef),
        ])?;
        let mut out = Vec::new();
        let mut w = ResultWriter::new(OutputFormat::Table, &mut out, b.schema(), 0);
        w.write(&b)?;
        w.finish(1, None)?;
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains("| physical_plan | ProjectionExec "), "{text}");
        assert!(
            text.contains(&format!("|               |   {} |", "x".repeat(80))),
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn table_row_limit_says_how_many_are_shown() -> Result<()> {
        let b = batch();
        let mut out = Vec::new();
        let mut w = ResultWriter::new(OutputFormat::Table, &mut out, b.schema(), 1);
        w.write(&b)?;
        w.finish(2, None)?;
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains("2 rows (first 1 shown"), "{text}");
        Ok(())
    }

    #[test]
    fn csv_and_ndjson_have_every_row() -> Result<()> {
        let b = batch();
        let mut csv = Vec::new();
        let mut w = ResultWriter::new(OutputFormat::Csv, &mut csv, b.schema(), 0);
        w.write(&b)?;
        w.finish(2, None)?;
        assert_eq!(String::from_utf8(csv).expect("utf8").lines().count(), 3);
        let mut nd = Vec::new();
        let mut w = ResultWriter::new(OutputFormat::Ndjson, &mut nd, b.schema(), 0);
        w.write(&b)?;
        w.finish(2, None)?;
        assert_eq!(String::from_utf8(nd).expect("utf8").lines().count(), 2);
        Ok(())
    }
}
