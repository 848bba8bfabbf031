//! Result printing: aligned tables, CSV, JSON and NDJSON.
//!
//! Tables are rendered here rather than with arrow's `pretty` so that long
//! cells (image bytes, token lists) are cut to [`MAX_CELL_CHARS`] and the row
//! limit keeps memory bounded: rows past it are counted, not buffered. Cells
//! are formatted by arrow's display (timestamps as `2013-01-01T10:00:00`).
//!
//! On a terminal a table is fitted to its width as DuckDB's shell does: when
//! it is wider, cells are cut to [`FIT_CELL_WIDTH`], and if that is not enough
//! the first and last columns that fit are kept around one `…` column, with a
//! note under the table. `\format wide` (`--format wide`) shows every column;
//! output that is not a terminal is never fitted, so scripts get every column.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::str::FromStr;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use datafusion::arrow::csv::WriterBuilder as CsvWriterBuilder;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::json::{ArrayWriter, LineDelimitedWriter};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::error::{DataFusionError, Result};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// Longest cell shown in table output, in terminal columns.
pub const MAX_CELL_CHARS: usize = 48;

/// Longest cell of a table that had to be fitted to the terminal.
pub const FIT_CELL_WIDTH: usize = 40;

/// Narrowest a column is cut to so that it still fits beside the others;
/// a column that would be narrower is left out instead.
const MIN_FIT_WIDTH: usize = 4;

/// Width of the `…` column that stands for the columns left out (`| … `).
const ELIDED_COLUMN: usize = 4;

/// How results are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned table with a row count, fitted to the terminal's width.
    #[default]
    #[value(alias = "fit")]
    Table,
    /// Aligned table with every column, however wide the terminal is.
    Wide,
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
            "table" | "fit" => Ok(Self::Table),
            "wide" => Ok(Self::Wide),
            "csv" => Ok(Self::Csv),
            "json" => Ok(Self::Json),
            "ndjson" => Ok(Self::Ndjson),
            other => Err(format!(
                "unknown format '{other}': use table, wide, csv, json or ndjson"
            )),
        }
    }
}

impl OutputFormat {
    /// The line width a result in this format is fitted to when written to
    /// this process's stdout: the terminal's, for `Table` on a terminal.
    pub fn fit_width(self) -> Option<usize> {
        if self != Self::Table || !std::io::stdout().is_terminal() {
            return None;
        }
        let columns = std::env::var("COLUMNS").ok();
        terminal_width(
            console::Term::stdout().size_checked().map(|(_, cols)| cols),
            columns.as_deref(),
        )
    }
}

/// The width of a terminal whose window size is `window` (`None` when the
/// terminal does not say, as a fresh pseudo-terminal's 0 × 0) and whose
/// `$COLUMNS` is `columns`: the window's, else `$COLUMNS`, else unknown.
fn terminal_width(window: Option<u16>, columns: Option<&str>) -> Option<usize> {
    window
        .map(usize::from)
        .filter(|w| *w > 0)
        .or_else(|| columns?.trim().parse::<usize>().ok().filter(|w| *w > 0))
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
    truncate(&cell, MAX_CELL_CHARS).into_owned()
}

/// Terminal columns `text` takes: 2 for each CJK character, 1 for `…`.
fn display_width(text: &str) -> usize {
    UnicodeWidthStr::width(text)
}

/// `text` cut to at most `max` terminal columns (at least 1), ending in `…`
/// when it was cut.
fn truncate(text: &str, max: usize) -> Cow<'_, str> {
    if display_width(text) <= max {
        return Cow::Borrowed(text);
    }
    let mut head = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = c.width().unwrap_or(0);
        // Leave one column for the `…`.
        if used + w + 1 > max {
            break;
        }
        used += w;
        head.push(c);
    }
    head.push('…');
    Cow::Owned(head)
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

/// One column of a rendered table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Result column `index`, cut to `width` terminal columns.
    Column {
        /// Position in the result's schema.
        index: usize,
        /// Terminal columns between the `| ` and the ` ` that frame a cell.
        width: usize,
    },
    /// The `…` column that stands for the columns left out.
    Elided,
}

impl Slot {
    /// Terminal columns of this slot's cells.
    fn width(self) -> usize {
        match self {
            Self::Column { width, .. } => width,
            Self::Elided => 1,
        }
    }
}

/// Terminal columns of a table line made of `slots`: `| cell ` per slot and
/// the closing `|`.
fn line_width(slots: &[Slot]) -> usize {
    slots.iter().map(|s| s.width() + 3).sum::<usize>() + 1
}

/// Column positions from both ends inwards: 0, n-1, 1, n-2, …
fn ends_first(n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |taken| {
        if taken % 2 == 0 {
            taken / 2
        } else {
            n - 1 - taken / 2
        }
    })
}

/// The slots of a table whose columns need `widths` terminal columns, on
/// lines of at most `max_width`.
///
/// A table that fits is left alone. Otherwise cells are cut to
/// [`FIT_CELL_WIDTH`]; if it still does not fit, columns are taken from both
/// ends inwards (first, last, second, second to last, …) while they fit
/// beside a `…` column, the last one taken cut to the room left if that is
/// at least [`MIN_FIT_WIDTH`]. The first column is always shown, cut to the
/// line if it must be.
fn fit(widths: &[usize], max_width: usize) -> Vec<Slot> {
    let all = |cap: usize| -> Vec<Slot> {
        widths
            .iter()
            .enumerate()
            .map(|(index, w)| Slot::Column {
                index,
                width: (*w).min(cap),
            })
            .collect()
    };
    let natural = all(usize::MAX);
    if line_width(&natural) <= max_width {
        return natural;
    }
    let capped = all(FIT_CELL_WIDTH);
    if line_width(&capped) <= max_width {
        return capped;
    }
    let n = widths.len();
    // Room for the cells and their frames, less the closing `|`.
    let mut room = max_width.saturating_sub(1);
    let (mut front, mut back) = (Vec::new(), Vec::new());
    for (taken, index) in ends_first(n).enumerate() {
        // While a column is still left out, the `…` column needs its room.
        let elided = if taken + 1 < n { ELIDED_COLUMN } else { 0 };
        let available = room.saturating_sub(elided + 3);
        let wanted = widths[index].min(FIT_CELL_WIDTH);
        let width = if wanted <= available {
            wanted
        } else if taken == 0 || available >= MIN_FIT_WIDTH {
            available.max(1)
        } else {
            break;
        };
        room = room.saturating_sub(width + 3);
        let slot = Slot::Column { index, width };
        if taken % 2 == 0 {
            front.push(slot);
        } else {
            back.push(slot);
        }
        if width < wanted {
            break;
        }
    }
    let shown = front.len() + back.len();
    let mut slots = front;
    if shown < n {
        slots.push(Slot::Elided);
    }
    slots.extend(back.into_iter().rev());
    slots
}

/// A table as text, and how many of the result's columns it shows.
struct Rendered {
    /// The table, one `\n` after each line.
    text: String,
    /// Result columns shown (the others are behind the `…` column).
    shown: usize,
}

/// Renders rows as an aligned table with `+---+` borders, fitted to lines
/// of `max_width` terminal columns when given (see [`fit`]); a cell with
/// several lines makes its row that many lines high.
fn render(
    schema: &SchemaRef,
    rows: &[Vec<String>],
    max_width: Option<usize>,
) -> Rendered {
    let header: Vec<String> = schema.fields().iter().map(|f| shorten(f.name())).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| display_width(h)).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            let widest = cell.lines().map(display_width).max().unwrap_or(0);
            *w = (*w).max(widest);
        }
    }
    let slots = match max_width {
        Some(max) => fit(&widths, max),
        None => widths
            .iter()
            .enumerate()
            .map(|(index, width)| Slot::Column {
                index,
                width: *width,
            })
            .collect(),
    };
    let border: String = slots
        .iter()
        .map(|s| format!("+{}", "-".repeat(s.width() + 2)))
        .collect::<String>()
        + "+\n";
    let mut out = String::new();
    out.push_str(&border);
    out.push_str(&table_line(&slots, |slot| match slot {
        Slot::Column { index, .. } => header.get(index).map(String::as_str),
        Slot::Elided => Some("…"),
    }));
    out.push_str(&border);
    for row in rows {
        let split: Vec<Vec<&str>> = row.iter().map(|c| c.lines().collect()).collect();
        let height = split.iter().map(Vec::len).max().unwrap_or(0).max(1);
        for i in 0..height {
            out.push_str(&table_line(&slots, |slot| match slot {
                Slot::Column { index, .. } => {
                    split.get(index).and_then(|lines| lines.get(i)).copied()
                }
                Slot::Elided => (i == 0).then_some("…"),
            }));
        }
    }
    if !rows.is_empty() {
        out.push_str(&border);
    }
    let shown = slots
        .iter()
        .filter(|s| matches!(s, Slot::Column { .. }))
        .count();
    Rendered { text: out, shown }
}

/// One line of a table: `cell(slot)` is the text of each slot on it, uncut
/// (`None`: blank).
fn table_line<'a>(slots: &[Slot], cell: impl Fn(Slot) -> Option<&'a str>) -> String {
    slots
        .iter()
        .map(|slot| {
            let text = cell(*slot).unwrap_or_default();
            let text = match *slot {
                Slot::Column { width, .. } => truncate(text, width),
                Slot::Elided => Cow::Borrowed(text),
            };
            let pad = slot.width().saturating_sub(display_width(&text));
            format!("| {text}{} ", " ".repeat(pad))
        })
        .collect::<String>()
        + "|\n"
}

/// Renders rows as an aligned table with `+---+` borders and every column;
/// a cell with several lines makes its row that many lines high.
pub fn render_table(schema: &SchemaRef, rows: &[Vec<String>]) -> String {
    render(schema, rows, None).text
}

/// The note under a table that shows `shown` of its `columns` columns.
fn elided_note(columns: usize, shown: usize) -> String {
    format!(" ({columns} columns, {shown} shown; \\format wide shows all)")
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
        /// Line width the table is fitted to; `None` shows every column.
        max_width: Option<usize>,
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
            OutputFormat::Table | OutputFormat::Wide => Self::Table {
                cut: !is_explain(&schema),
                out,
                schema,
                rows: Vec::new(),
                max_rows,
                max_width: None,
            },
            OutputFormat::Csv => Self::Csv(Box::new(
                CsvWriterBuilder::new().with_header(true).build(out),
            )),
            OutputFormat::Json => Self::Json(ArrayWriter::new(out)),
            OutputFormat::Ndjson => Self::Ndjson(LineDelimitedWriter::new(out)),
        }
    }

    /// Fits a table to lines of `width` terminal columns (as `fit` lays it out);
    /// `None`, other formats and query plans (always whole) are unchanged.
    /// The caller picks the width: [`OutputFormat::fit_width`] for stdout.
    pub fn with_max_width(mut self, width: Option<usize>) -> Self {
        if let Self::Table { cut, max_width, .. } = &mut self {
            *max_width = width.filter(|_| *cut);
        }
        self
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
                out,
                schema,
                rows,
                max_width,
                ..
            } => {
                let columns = schema.fields().len();
                // DDL and SET return no columns: just say it worked.
                let (mut text, shown) = if columns == 0 {
                    ("OK".to_string(), 0)
                } else {
                    let table = render(&schema, &rows, max_width);
                    (table.text, table.shown)
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
                if shown < columns {
                    text.push_str(&elided_note(columns, shown));
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

    /// Column `index`, `width` wide.
    fn col(index: usize, width: usize) -> Slot {
        Slot::Column { index, width }
    }

    #[test]
    fn fit_leaves_a_table_that_fits_alone() {
        assert_eq!(fit(&[3, 60], 80), vec![col(0, 3), col(1, 60)]);
        // Exactly the line: `| 3 | 60 |` is 3+3 + 60+3 + 1 = 70.
        assert_eq!(line_width(&fit(&[3, 60], 70)), 70);
    }

    #[test]
    fn fit_cuts_cells_before_it_leaves_columns_out() {
        // 51 + 51 + 1 = 103 columns; cut to 40 each, 87.
        assert_eq!(fit(&[48, 48], 90), vec![col(0, 40), col(1, 40)]);
    }

    #[test]
    fn fit_keeps_the_first_and_last_columns_around_an_ellipsis() {
        // Twelve columns of 8 (`| 12345 `) on 40: 4 of them, the `…` and `|`.
        let slots = fit(&[5; 12], 40);
        assert_eq!(
            slots,
            vec![col(0, 5), col(1, 5), Slot::Elided, col(10, 5), col(11, 5)]
        );
        assert_eq!(line_width(&slots), 37);
        // Odd room: the first side gets the extra column.
        let slots = fit(&[5; 12], 45);
        assert_eq!(
            slots,
            vec![
                col(0, 5),
                col(1, 5),
                col(2, 5),
                Slot::Elided,
                col(10, 5),
                col(11, 5)
            ]
        );
    }

    #[test]
    fn fit_cuts_the_last_column_taken_to_the_room_left() {
        // 10 + 4 + 1 leave 15 for the last column: 12 of text.
        assert_eq!(
            fit(&[7, 30, 30], 30),
            vec![col(0, 7), Slot::Elided, col(2, 12)]
        );
        // Less than MIN_FIT_WIDTH left: that column goes too.
        assert_eq!(fit(&[20, 30, 30], 30), vec![col(0, 20), Slot::Elided]);
        // The only column is cut to the line; the first is always kept.
        assert_eq!(fit(&[100], 30), vec![col(0, 26)]);
        assert_eq!(fit(&[60, 60, 60], 30), vec![col(0, 22), Slot::Elided]);
        // The last column left needs no `…` beside it.
        assert_eq!(fit(&[40, 40], 60), vec![col(0, 40), col(1, 13)]);
    }

    #[test]
    fn fitted_lines_are_never_wider_than_the_terminal() {
        for max in 12..140 {
            for n in 1..15 {
                let widths: Vec<usize> =
                    (0..n).map(|i| 1 + (i * 37 + max) % 55).collect();
                let slots = fit(&widths, max);
                assert!(line_width(&slots) <= max, "{widths:?} on {max}: {slots:?}");
                assert!(
                    matches!(slots[0], Slot::Column { index: 0, .. }),
                    "{slots:?}"
                );
                let shown: Vec<usize> = slots
                    .iter()
                    .filter_map(|s| match s {
                        Slot::Column { index, .. } => Some(*index),
                        Slot::Elided => None,
                    })
                    .collect();
                assert!(shown.windows(2).all(|w| w[0] < w[1]), "{slots:?}");
                let elided = slots.contains(&Slot::Elided);
                assert_eq!(elided, shown.len() < n, "{slots:?}");
                if n > 1 && elided && max >= 2 * (FIT_CELL_WIDTH + 3) + 5 {
                    assert_eq!(shown.last(), Some(&(n - 1)), "{widths:?} on {max}");
                }
            }
        }
    }

    /// One row of `n` columns `c0…` holding `value{i}` padded to 12.
    fn wide_batch(n: usize) -> RecordBatch {
        RecordBatch::try_from_iter((0..n).map(|i| {
            (
                format!("c{i}"),
                Arc::new(StringArray::from(vec![format!("value{i:<7}")])) as ArrayRef,
            )
        }))
        .expect("valid batch")
    }

    /// `b` as a table fitted to `width`.
    fn table(b: &RecordBatch, width: Option<usize>) -> Result<String> {
        let mut out = Vec::new();
        let mut w = ResultWriter::new(OutputFormat::Table, &mut out, b.schema(), 0)
            .with_max_width(width);
        w.write(b)?;
        w.finish(b.num_rows() as u64, None)?;
        Ok(String::from_utf8(out).expect("utf8"))
    }

    #[test]
    fn wide_table_is_fitted_with_a_note() -> Result<()> {
        let text = table(&wide_batch(12), Some(60))?;
        let lines: Vec<&str> = text.lines().collect();
        let (table_lines, footer) = lines.split_at(lines.len() - 1);
        // `…` is one terminal column (three bytes): every line is as wide.
        for line in table_lines {
            assert_eq!(display_width(line), display_width(table_lines[0]), "{text}");
            assert!(display_width(line) <= 60, "{text}");
        }
        assert!(table_lines[0].contains("+---+"), "{text}");
        assert!(table_lines[1].starts_with("| c0 "), "{text}");
        assert!(table_lines[1].contains("| c1 "), "{text}");
        assert!(table_lines[1].contains("| … | c10 "), "{text}");
        assert!(table_lines[1].ends_with("| c11          |"), "{text}");
        assert!(table_lines[3].contains("| value11      |"), "{text}");
        assert!(!text.contains("c5"), "{text}");
        assert_eq!(
            footer,
            ["1 row (12 columns, 4 shown; \\format wide shows all)"],
            "{text}"
        );
        Ok(())
    }

    #[test]
    fn no_width_wide_format_and_plans_show_every_column() -> Result<()> {
        let b = wide_batch(12);
        let whole = table(&b, None)?;
        assert!(
            whole.contains("| c5 ") && whole.ends_with("1 row\n"),
            "{whole}"
        );
        let mut out = Vec::new();
        let mut w = ResultWriter::new(OutputFormat::Wide, &mut out, b.schema(), 0)
            .with_max_width(OutputFormat::Wide.fit_width());
        w.write(&b)?;
        w.finish(1, None)?;
        assert_eq!(String::from_utf8(out).expect("utf8"), whole);
        // A fitting table is unchanged, note and all.
        assert_eq!(table(&b, Some(1000))?, whole);
        let plan = RecordBatch::try_from_iter(vec![
            (
                "plan_type",
                Arc::new(StringArray::from(vec!["p"])) as ArrayRef,
            ),
            (
                "plan",
                Arc::new(StringArray::from(vec!["x".repeat(80)])) as ArrayRef,
            ),
        ])?;
        assert!(table(&plan, Some(40))?.contains(&"x".repeat(80)));
        Ok(())
    }

    #[test]
    fn widths_count_terminal_columns() -> Result<()> {
        assert_eq!(display_width("…"), 1);
        assert_eq!(display_width("数据"), 4);
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("数据集合", 5), "数据…");
        assert_eq!(truncate("abc", 3), "abc");
        let b = RecordBatch::try_from_iter(vec![(
            "s",
            Arc::new(StringArray::from(vec!["数据", "ab"])) as ArrayRef,
        )])?;
        let text = table(&b, Some(80))?;
        assert!(text.starts_with("+------+\n| s    |\n"), "{text}");
        assert!(text.contains("| 数据 |\n| ab   |\n"), "{text}");
        Ok(())
    }

    #[test]
    fn timestamps_print_as_dates_and_times() -> Result<()> {
        use datafusion::arrow::array::TimestampMicrosecondArray;
        let t = TimestampMicrosecondArray::from(vec![1_357_034_400_000_000]);
        let b = RecordBatch::try_from_iter(vec![("t", Arc::new(t) as ArrayRef)])?;
        assert!(table(&b, None)?.contains("| 2013-01-01T10:00:00 |"));
        Ok(())
    }

    #[test]
    fn terminal_width_is_the_window_else_columns() {
        assert_eq!(terminal_width(Some(100), Some("50")), Some(100));
        assert_eq!(terminal_width(None, Some(" 50 ")), Some(50));
        assert_eq!(terminal_width(Some(0), Some("50")), Some(50));
        assert_eq!(terminal_width(None, Some("wide")), None);
        assert_eq!(terminal_width(None, Some("0")), None);
        assert_eq!(terminal_width(None, None), None);
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
