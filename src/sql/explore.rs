//! The exploration statements: `DESCRIBE <path|query>`, `SUMMARIZE`, `SAMPLE`.
//!
//! All three plan `SELECT * FROM <table>` and build on it, so a path, a URL,
//! a catalog table and a parenthesised query behave the same way.
//!
//! `SUMMARIZE` computes every statistic of every column in **one** aggregate
//! pass over the data (DataFusion runs it in parallel across partitions) and
//! pivots the single result row into one row per column.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::ScalarValue;
use datafusion::common::plan_datafusion_err;
use datafusion::common::plan_err;
use datafusion::dataframe::DataFrame;
use datafusion::error::Result;
use datafusion::functions_aggregate::expr_fn::{
    approx_distinct, approx_percentile_cont, avg, count, max, min, stddev,
};
use datafusion::functions_nested::expr_fn::cardinality;
use datafusion::logical_expr::{Expr, ScalarUDF, cast};
use datafusion::prelude::{SessionContext, ident, lit};

use super::functions::ByteLengthFunc;
use super::{TableTarget, fresh_seed};
use crate::shuffle::{ShuffleSpec, shuffle};

async fn select_all(ctx: &SessionContext, target: &TableTarget) -> Result<DataFrame> {
    let (state, plan) = ctx
        .sql(&format!("SELECT * FROM {}", target.from_clause()))
        .await?
        .into_parts();
    // A `(query)` target may hold a rewritten SHUFFLE clause.
    Ok(DataFrame::new(state, super::apply_markers(plan)?))
}

/// `DESCRIBE <target>`: the same columns as DataFusion's `DESCRIBE <name>`.
pub(super) async fn describe(
    ctx: &SessionContext,
    target: &TableTarget,
) -> Result<DataFrame> {
    let df = select_all(ctx, target).await?;
    let fields = df.schema().fields();
    let names: StringArray = fields.iter().map(|f| Some(f.name().clone())).collect();
    let types: StringArray = fields
        .iter()
        .map(|f| Some(f.data_type().to_string()))
        .collect();
    let nullable: StringArray = fields
        .iter()
        .map(|f| Some(if f.is_nullable() { "YES" } else { "NO" }))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("column_name", DataType::Utf8, false),
        Field::new("data_type", DataType::Utf8, false),
        Field::new("is_nullable", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![Arc::new(names), Arc::new(types), Arc::new(nullable)],
    )?;
    ctx.read_batch(batch)
}

/// How `SUMMARIZE` profiles a column of a given type.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ColumnProfile {
    /// Integers, floats, decimals: full statistics of the values.
    Numeric,
    /// Booleans: min/max, and the mean is the share of `true`.
    Boolean,
    /// Strings: min/max and distinct count.
    Text,
    /// Binary blobs and lists: statistics of their lengths.
    Length,
    /// Dates, times, timestamps, durations: min/max (as the results show
    /// them, `2013-01-01T10:00:00`) and distinct count.
    Temporal,
    /// Anything else (structs, maps): counts only.
    CountsOnly,
}

impl ColumnProfile {
    fn of(data_type: &DataType) -> Self {
        use DataType::*;
        match data_type {
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float16
            | Float32 | Float64 | Decimal32(..) | Decimal64(..) | Decimal128(..)
            | Decimal256(..) => Self::Numeric,
            Boolean => Self::Boolean,
            Utf8 | LargeUtf8 | Utf8View => Self::Text,
            Dictionary(_, value) if value.is_string() => Self::Text,
            Binary | LargeBinary | BinaryView | FixedSizeBinary(_) | List(_)
            | LargeList(_) | FixedSizeList(..) | ListView(_) | LargeListView(_) => {
                Self::Length
            }
            Date32 | Date64 | Timestamp(..) | Time32(_) | Time64(_) | Duration(_) => {
                Self::Temporal
            }
            _ => Self::CountsOnly,
        }
    }

    /// The expression whose distribution is summarised, if any.
    fn measured(self, column: &Expr, data_type: &DataType) -> Option<Expr> {
        match self {
            Self::Numeric | Self::Boolean => {
                Some(cast(column.clone(), DataType::Float64))
            }
            Self::Length if data_type.is_nested() => {
                Some(cast(cardinality(column.clone()), DataType::Float64))
            }
            Self::Length => Some(cast(
                ScalarUDF::from(ByteLengthFunc::new()).call(vec![column.clone()]),
                DataType::Float64,
            )),
            _ => None,
        }
    }

    /// The expression counted by `approx_distinct`, if the type allows it.
    fn distinct_input(self, column: &Expr, data_type: &DataType) -> Option<Expr> {
        match (self, data_type) {
            (Self::CountsOnly, _) => None,
            (_, DataType::Float16 | DataType::Float32 | DataType::Float64)
            | (_, DataType::Dictionary(..)) => Some(cast(column.clone(), DataType::Utf8)),
            _ => Some(column.clone()),
        }
    }
}

/// Statistic names in output order after the counts.
const QUANTILES: [(&str, f64); 3] = [("q25", 0.25), ("q50", 0.5), ("q75", 0.75)];

/// `SUMMARIZE <target>`: one row per column; see the module docs.
pub(super) async fn summarize(
    ctx: &SessionContext,
    target: &TableTarget,
) -> Result<DataFrame> {
    let df = select_all(ctx, target).await?;
    let fields: Vec<Arc<Field>> = df.schema().fields().iter().cloned().collect();
    if fields.is_empty() {
        return plan_err!(
            "SUMMARIZE {}: the table has no columns",
            target.from_clause()
        );
    }
    let mut aggregates = vec![count(lit(1)).alias("__rows")];
    for (i, field) in fields.iter().enumerate() {
        let column = ident(field.name());
        let profile = ColumnProfile::of(field.data_type());
        aggregates.push(count(column.clone()).alias(format!("__{i}_count")));
        if let Some(input) = profile.distinct_input(&column, field.data_type()) {
            aggregates.push(approx_distinct(input).alias(format!("__{i}_distinct")));
        }
        let extremes = match profile {
            ColumnProfile::Length => profile.measured(&column, field.data_type()),
            ColumnProfile::CountsOnly => None,
            _ => Some(column.clone()),
        };
        if let Some(value) = extremes {
            aggregates.push(min(value.clone()).alias(format!("__{i}_min")));
            aggregates.push(max(value).alias(format!("__{i}_max")));
        }
        if let Some(measured) = profile.measured(&column, field.data_type()) {
            aggregates.push(avg(measured.clone()).alias(format!("__{i}_mean")));
            aggregates.push(stddev(measured.clone()).alias(format!("__{i}_stddev")));
            if profile != ColumnProfile::Boolean {
                for (name, q) in QUANTILES {
                    aggregates.push(
                        approx_percentile_cont(
                            measured.clone().sort(true, false),
                            lit(q),
                            None,
                        )
                        .alias(format!("__{i}_{name}")),
                    );
                }
            }
        }
    }
    let stats = df.aggregate(vec![], aggregates)?.collect().await?;
    let stats = datafusion::arrow::compute::concat_batches(
        &stats
            .first()
            .map(|b| b.schema())
            .unwrap_or_else(|| Arc::new(Schema::empty())),
        &stats,
    )?;
    let value = |name: String| -> Result<Option<ScalarValue>> {
        match stats.column_by_name(&name) {
            Some(array) if stats.num_rows() == 1 => {
                let v = ScalarValue::try_from_array(array, 0)?;
                Ok((!v.is_null()).then_some(v))
            }
            _ => Ok(None),
        }
    };
    let rows = match value("__rows".into())? {
        Some(ScalarValue::Int64(Some(n))) => n,
        _ => 0,
    };

    let mut names = Vec::new();
    let mut types = Vec::new();
    let mut stats_of = Vec::new();
    let mut counts = Vec::new();
    let mut nulls = Vec::new();
    let mut distincts = Vec::new();
    let mut mins = Vec::new();
    let mut maxs = Vec::new();
    let mut floats: Vec<Vec<Option<f64>>> = vec![Vec::new(); 2 + QUANTILES.len()];
    for (i, field) in fields.iter().enumerate() {
        let profile = ColumnProfile::of(field.data_type());
        names.push(field.name().clone());
        types.push(field.data_type().to_string());
        stats_of.push(if profile == ColumnProfile::Length {
            "length"
        } else {
            "value"
        });
        let non_null = match value(format!("__{i}_count"))? {
            Some(ScalarValue::Int64(Some(n))) => n,
            _ => 0,
        };
        counts.push(non_null);
        nulls.push(rows - non_null);
        distincts.push(match value(format!("__{i}_distinct"))? {
            Some(ScalarValue::UInt64(Some(n))) => Some(n),
            _ => None,
        });
        mins.push(
            value(format!("__{i}_min"))?
                .map(|v| display_scalar(&v))
                .transpose()?,
        );
        maxs.push(
            value(format!("__{i}_max"))?
                .map(|v| display_scalar(&v))
                .transpose()?,
        );
        let float_names = ["mean", "stddev"]
            .into_iter()
            .chain(QUANTILES.iter().map(|(name, _)| *name));
        for (slot, name) in float_names.enumerate() {
            floats[slot].push(as_f64(value(format!("__{i}_{name}"))?));
        }
    }
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        ("column_name", Arc::new(StringArray::from(names))),
        ("data_type", Arc::new(StringArray::from(types))),
        ("stats_of", Arc::new(StringArray::from(stats_of))),
        ("count", Arc::new(Int64Array::from(counts))),
        ("null_count", Arc::new(Int64Array::from(nulls))),
        ("approx_distinct", Arc::new(UInt64Array::from(distincts))),
        ("min", Arc::new(StringArray::from(mins))),
        ("max", Arc::new(StringArray::from(maxs))),
    ];
    let float_names = ["mean", "stddev"]
        .into_iter()
        .chain(QUANTILES.iter().map(|(name, _)| *name));
    for (name, values) in float_names.zip(floats) {
        columns.push((name, Arc::new(Float64Array::from(values))));
    }
    let batch = RecordBatch::try_from_iter_with_nullable(
        columns.into_iter().map(|(name, array)| (name, array, true)),
    )?;
    ctx.read_batch(batch)
}

fn as_f64(value: Option<ScalarValue>) -> Option<f64> {
    match value? {
        ScalarValue::Float64(v) => v,
        other => other
            .cast_to(&DataType::Float64)
            .ok()
            .and_then(|v| match v {
                ScalarValue::Float64(v) => v,
                _ => None,
            }),
    }
}

/// A `min`/`max` as text: whole lengths without `.0`, dates, times,
/// timestamps and durations as arrow displays them in results
/// (`2013-01-01T10:00:00`, where `ScalarValue`'s `Display` prints the raw
/// `1357034400000000`), anything else as `ScalarValue` prints it.
fn display_scalar(value: &ScalarValue) -> Result<String> {
    match value {
        ScalarValue::Float64(Some(v)) if v.fract() == 0.0 && v.abs() < 1e15 => {
            Ok(format!("{}", *v as i64))
        }
        temporal if temporal.data_type().is_temporal() => {
            let array = temporal.to_array()?;
            let formatter =
                ArrayFormatter::try_new(array.as_ref(), &FormatOptions::default())?;
            Ok(formatter.value(0).try_to_string()?)
        }
        other => Ok(other.to_string()),
    }
}

/// `SAMPLE <target> <rows> [SEED <seed>]`: the first `rows` rows of
/// `SELECT * FROM <target> SHUFFLE SEED <seed> EPOCH 0`.
///
/// A prefix of a uniform permutation is a uniform sample without
/// replacement, and the shuffle gives every copy of a repeated row its own
/// key (see [`crate::shuffle`]), so repeated rows are sampled as often as a
/// uniform sample of the rows takes them. (Ordering by a hash of the content
/// alone, a bottom-k sample, would take all copies of a row or none: a table
/// repeated 3 times gave 100 distinct rows 3 times instead of ~221.) The
/// numbering of copies needs every copy of a row in one place, so memory is
/// the shuffle's: the session's budget, spilling beyond it.
pub(super) async fn sample(
    ctx: &SessionContext,
    target: &TableTarget,
    rows: u64,
    seed: Option<u64>,
) -> Result<DataFrame> {
    let df = select_all(ctx, target).await?;
    if df.schema().fields().is_empty() {
        return plan_err!("SAMPLE {}: the table has no columns", target.from_clause());
    }
    let seed = seed.unwrap_or_else(fresh_seed);
    let rows = usize::try_from(rows).map_err(|_| {
        plan_datafusion_err!("SAMPLE: {rows} rows is more than this machine can hold")
    })?;
    shuffle(df, ShuffleSpec::Global { seed, epoch: 0 })?.limit(0, Some(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summarize_shows_temporal_extremes_as_results_do() -> Result<()> {
        let micros = 1_357_034_400_000_000; // 2013-01-01 10:00:00 UTC
        let cases = [
            (
                ScalarValue::TimestampMicrosecond(Some(micros), None),
                "2013-01-01T10:00:00",
            ),
            (
                ScalarValue::TimestampMicrosecond(Some(micros), Some("+00:00".into())),
                "2013-01-01T10:00:00Z",
            ),
            (ScalarValue::Date32(Some(15706)), "2013-01-01"),
            (
                ScalarValue::Time64Microsecond(Some(36_000_000_000)),
                "10:00:00",
            ),
            (ScalarValue::Int64(Some(micros)), "1357034400000000"),
            (ScalarValue::Float64(Some(1668.0)), "1668"),
            (ScalarValue::Float64(Some(0.5)), "0.5"),
        ];
        for (value, shown) in cases {
            assert_eq!(display_scalar(&value)?, shown, "{value:?}");
        }
        let duration = display_scalar(&ScalarValue::DurationSecond(Some(3600)))?;
        assert_ne!(duration, "3600", "a duration is shown with its unit");
        Ok(())
    }
}
