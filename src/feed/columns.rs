//! Which tensor each column of a feed's query becomes, decided once from the
//! schema when the feed is built (so a column that cannot become a tensor is
//! a build-time error, not a failure an hour into training).
//!
//! | Arrow column                                   | tensor (per batch of B rows)        | default dtype |
//! |------------------------------------------------|-------------------------------------|---------------|
//! | int / uint / float / bool                      | `[B]`                               | int64 (uint8 stays uint8), float32, bool |
//! | `FixedSizeList` (nested) of numbers            | `[B, d1, d2, …]`                    | as the values |
//! | `FixedSizeBinary(n)`                           | `[B, n]` bytes                      | uint8         |
//! | `List` / `LargeList` of numbers, `Binary`      | `[B, L]` padded + `<name>_mask` `[B, L]` bool; L = longest row in the batch or `pad_to` | as the values |
//! | the same with a declared `shape`               | `[B, …shape]`, every row must have exactly that many values | as the values |
//! | `image_decode` struct (height, width, channels, pixels) | `[B, H, W, C]`             | uint8         |
//! | `image_to_tensor` struct (channels, height, width, values) | `[B, C, H, W]`          | float32       |
//! | `Timestamp` (any unit, any time zone), `Date32`, `Date64`, `Duration` | `[B]` (lists of them as lists of numbers) | int64 in the column's unit |
//!
//! A declared `shape` also reshapes fixed-size values (`FixedSizeBinary(3072)`
//! → `[3, 32, 32]`) as long as the element count matches. `scale`/`offset`
//! (`x * scale + offset`) apply to float outputs, so raw pixel bytes become
//! `float32 / 255` in the same pass that writes the tensor.
//!
//! Timestamps become the UTC instant since the Unix epoch in the column's
//! own unit (a time zone only says how to display the instant, so it does not
//! change the number); `Date32` days since the epoch, `Date64` milliseconds,
//! durations their unit. `unit` (`s`, `ms`, `us`, `ns`) converts: to a finer
//! unit exactly (an overflow of int64 is an error naming the row and value),
//! to a coarser one in int64 by floor division (towards negative infinity,
//! so `-1 ms` is `-1 s`, as Python's `//`), and with a float dtype as the
//! fractional value (`dtype=float64, unit=s`: seconds as a float).

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema, TimeUnit};
use datafusion::common::plan_datafusion_err;
use datafusion::common::plan_err;
use datafusion::error::{DataFusionError, Result};

use crate::device::DType;

/// How one column becomes a tensor; every field is optional.
///
/// ```
/// use sqlfeed::device::DType;
/// use sqlfeed::feed::ColumnSpec;
/// // raw 3×32×32 pixel bytes → float32 in [0, 1]
/// let image = ColumnSpec::new().dtype(DType::Float32).shape([3, 32, 32]).scale(1.0 / 255.0);
/// // token ids padded to 128, with a mask
/// let tokens = ColumnSpec::new().dtype(DType::Int64).pad_to(128);
/// # let _ = (image, tokens);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColumnSpec {
    /// Output element type (default: from the column's type).
    pub dtype: Option<DType>,
    /// Per-sample shape (without the batch dimension).
    pub shape: Option<Vec<usize>>,
    /// Multiply float outputs by this.
    pub scale: Option<f64>,
    /// Then add this.
    pub offset: Option<f64>,
    /// Pad variable-length rows to exactly this length (longer rows are
    /// truncated) instead of to the longest row of the batch.
    pub pad_to: Option<usize>,
    /// The padding value (default 0).
    pub pad_value: f64,
    /// Write this for NULL rows or values instead of failing.
    pub fill_null: Option<f64>,
    /// For timestamp, date and duration columns: the unit of the tensor's
    /// numbers (default: the column's own unit; see the module docs).
    pub unit: Option<TimeUnit>,
}

impl ColumnSpec {
    /// A spec with every default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the output dtype.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Sets the per-sample shape.
    pub fn shape(mut self, shape: impl IntoIterator<Item = usize>) -> Self {
        self.shape = Some(shape.into_iter().collect());
        self
    }

    /// Multiplies float outputs by `scale`.
    pub fn scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Adds `offset` to float outputs (after `scale`).
    pub fn offset(mut self, offset: f64) -> Self {
        self.offset = Some(offset);
        self
    }

    /// Pads (and truncates) variable-length rows to `len`.
    pub fn pad_to(mut self, len: usize) -> Self {
        self.pad_to = Some(len);
        self
    }

    /// The value written into padding.
    pub fn pad_value(mut self, value: f64) -> Self {
        self.pad_value = value;
        self
    }

    /// Writes `value` for NULLs instead of failing.
    pub fn fill_null(mut self, value: f64) -> Self {
        self.fill_null = Some(value);
        self
    }

    /// Converts a timestamp, date or duration column to `unit`: exact to a
    /// finer unit, floor division to a coarser one in int64, fractional with
    /// a float dtype.
    ///
    /// ```
    /// use datafusion::arrow::datatypes::TimeUnit;
    /// use sqlfeed::device::DType;
    /// use sqlfeed::feed::ColumnSpec;
    /// // epoch seconds as float64, with the fraction
    /// let t = ColumnSpec::new().dtype(DType::Float64).unit(TimeUnit::Second);
    /// assert_eq!(ColumnSpec::parse_unit("s", "t")?, TimeUnit::Second);
    /// # let _ = t;
    /// # Ok::<(), datafusion::error::DataFusionError>(())
    /// ```
    pub fn unit(mut self, unit: TimeUnit) -> Self {
        self.unit = Some(unit);
        self
    }

    /// Parses a unit as the CLI and Python write it: `s`, `ms`, `us` (or
    /// `µs`), `ns`; `column` names the column in the error.
    pub fn parse_unit(text: &str, column: &str) -> Result<TimeUnit> {
        Ok(match text.trim() {
            "s" => TimeUnit::Second,
            "ms" => TimeUnit::Millisecond,
            "us" | "µs" => TimeUnit::Microsecond,
            "ns" => TimeUnit::Nanosecond,
            other => {
                return plan_err!(
                    "unit '{other}' of column '{column}' is not a tensor unit: expected s, \
                     ms, us or ns (a Date32 column is days without a unit; \
                     CAST(... AS DATE) in SQL makes days of a timestamp)"
                );
            }
        })
    }

    /// Parses the CLI form `name:key=value,key=value` (keys: `dtype`,
    /// `shape` as `3x32x32`, `scale` (a number or `1/255`), `offset`,
    /// `pad_to`, `pad_value`, `fill_null`, `unit` (`s`, `ms`, `us`, `ns`)).
    pub fn parse_named(text: &str) -> Result<(String, ColumnSpec)> {
        let (name, options) = text.split_once(':').ok_or_else(|| {
            plan_datafusion_err!(
                "tensor option '{text}' should look like \
                 name:dtype=float32,shape=3x32x32,scale=1/255"
            )
        })?;
        let mut spec = ColumnSpec::new();
        for option in options.split(',').filter(|o| !o.trim().is_empty()) {
            let (key, value) = option.split_once('=').ok_or_else(|| {
                plan_datafusion_err!(
                    "tensor option '{option}' of column '{name}' should be key=value"
                )
            })?;
            let number = |value: &str| parse_number(value, name, key);
            match key.trim() {
                "dtype" => spec.dtype = Some(value.parse()?),
                "shape" => {
                    let dims = value
                        .split(['x', 'X', '*'])
                        .map(|d| d.trim().parse::<usize>())
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(|_| {
                            plan_datafusion_err!("shape '{value}' of column '{name}' should look like 3x32x32")
                        })?;
                    spec.shape = Some(dims);
                }
                "scale" => spec.scale = Some(number(value)?),
                "offset" => spec.offset = Some(number(value)?),
                "pad_to" => spec.pad_to = Some(number(value)? as usize),
                "pad_value" => spec.pad_value = number(value)?,
                "fill_null" => spec.fill_null = Some(number(value)?),
                "unit" => spec.unit = Some(Self::parse_unit(value, name.trim())?),
                other => {
                    return plan_err!(
                        "unknown tensor option '{other}' for column '{name}': expected \
                         dtype, shape, scale, offset, pad_to, pad_value, fill_null or unit"
                    );
                }
            }
        }
        Ok((name.trim().to_string(), spec))
    }
}

fn parse_number(value: &str, column: &str, key: &str) -> Result<f64> {
    let value = value.trim();
    let parsed = match value.split_once('/') {
        Some((a, b)) => a
            .trim()
            .parse::<f64>()
            .ok()
            .zip(b.trim().parse::<f64>().ok())
            .map(|(a, b)| a / b),
        None => value.parse::<f64>().ok(),
    };
    parsed.filter(|v| v.is_finite()).ok_or_else(|| {
        plan_datafusion_err!("{key}={value} for column '{column}' is not a finite number")
    })
}

/// Where a column's values come from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    /// One number per row.
    Scalar,
    /// A fixed number of values per row: nested `FixedSizeList`s (dims
    /// outermost first) or `FixedSizeBinary`.
    Fixed { dims: Vec<usize> },
    /// `List`/`LargeList` of numbers or `Binary`/`LargeBinary`.
    Variable,
    /// The struct of `image_decode`: HWC bytes with a per-row shape.
    Image,
    /// The struct of `image_to_tensor`: CHW float32 with a per-row shape.
    ImageTensor,
}

/// How variable-length rows are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Padding {
    /// Not a variable-length column.
    None,
    /// To the longest row of the batch, with a mask.
    BatchMax,
    /// To exactly this length (truncating), with a mask.
    To(usize),
    /// Every row must have exactly this many values (a declared shape).
    Exact(usize),
}

/// How a timestamp, date or duration count becomes a count of the tensor's
/// unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rescale {
    /// The same unit.
    Keep,
    /// To a finer unit: exact, or an overflow.
    Multiply(i64),
    /// To a coarser unit: floor division (the fraction, for float outputs).
    Divide(i64),
}

/// The numbers of a timestamp, date or duration column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Temporal {
    /// From the column's unit to the tensor's.
    pub(crate) rescale: Rescale,
    /// The column's unit, for messages (`days`, `s`, `ms`, `us`, `ns`).
    pub(crate) from: &'static str,
    /// The tensor's unit, for messages.
    pub(crate) to: &'static str,
}

/// The resolved plan for one tensor column.
#[derive(Debug, Clone)]
pub(crate) struct TensorColumn {
    /// Column (and tensor) name.
    pub(crate) name: Arc<str>,
    /// `<name>_mask` for padded columns.
    pub(crate) mask_name: Option<Arc<str>>,
    /// Position in the query's schema.
    pub(crate) index: usize,
    /// Where values come from.
    pub(crate) source: Source,
    /// Output element type.
    pub(crate) dtype: DType,
    /// Per-sample shape when known at build time (`None` for images, whose
    /// shape comes from the data, and padded columns).
    pub(crate) sample_shape: Option<Vec<usize>>,
    /// Variable-length layout.
    pub(crate) padding: Padding,
    /// `x * scale + offset` for float outputs (computed in f32 for the
    /// 16- and 32-bit floats, in f64 for float64: epoch microseconds need
    /// more than the 24 bits of an f32).
    pub(crate) affine: Option<(f64, f64)>,
    /// Padding value.
    pub(crate) pad_value: f64,
    /// NULL replacement.
    pub(crate) fill_null: Option<f64>,
    /// Set for timestamp, date and duration values.
    pub(crate) temporal: Option<Temporal>,
}

/// Decides the tensor of every column of `schema`.
pub(crate) fn resolve(
    schema: &Schema,
    specs: &[(String, ColumnSpec)],
) -> Result<Vec<TensorColumn>> {
    let names: HashSet<&str> =
        schema.fields().iter().map(|f| f.name().as_str()).collect();
    for (name, _) in specs {
        if !names.contains(name.as_str()) {
            return plan_err!(
                "a tensor option names column '{name}', but the query returns only: {}",
                crate::exec::column_names(schema)
            );
        }
    }
    if schema.fields().is_empty() {
        return plan_err!("the feed's query returns no columns");
    }
    let mut columns = Vec::with_capacity(schema.fields().len());
    let mut tensor_names = HashSet::new();
    for (index, field) in schema.fields().iter().enumerate() {
        let spec = spec_of(specs, field.name());
        let column = resolve_column(index, field, &spec)?;
        for name in std::iter::once(&column.name).chain(column.mask_name.as_ref()) {
            if !tensor_names.insert(Arc::clone(name)) {
                return plan_err!(
                    "two tensors would be called '{name}'; rename a column with AS"
                );
            }
        }
        columns.push(column);
    }
    Ok(columns)
}

/// The options `specs` give column `name` (the last that names it), or the
/// defaults.
pub(crate) fn spec_of(specs: &[(String, ColumnSpec)], name: &str) -> ColumnSpec {
    specs
        .iter()
        .rev()
        .find(|(named, _)| named == name)
        .map(|(_, spec)| spec.clone())
        .unwrap_or_default()
}

fn unsupported(field: &Field, why: &str) -> DataFusionError {
    plan_datafusion_err!(
        "column '{}' of type {} cannot become a tensor: {why}",
        field.name(),
        field.data_type()
    )
}

fn is_number(data_type: &DataType) -> bool {
    data_type.is_numeric()
        && !matches!(
            data_type,
            DataType::Decimal32(..)
                | DataType::Decimal64(..)
                | DataType::Decimal128(..)
                | DataType::Decimal256(..)
        )
        || matches!(data_type, DataType::Boolean)
}

const NANOS_PER_DAY: i64 = 86_400 * 1_000_000_000;

/// Nanoseconds per unit.
fn nanos(unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => 1_000_000_000,
        TimeUnit::Millisecond => 1_000_000,
        TimeUnit::Microsecond => 1_000,
        TimeUnit::Nanosecond => 1,
    }
}

/// Nanoseconds per value of a timestamp, date or duration type; `None` for
/// every other type.
fn nanos_per_value(data_type: &DataType) -> Option<i64> {
    match data_type {
        DataType::Timestamp(unit, _) | DataType::Duration(unit) => Some(nanos(*unit)),
        DataType::Date32 => Some(NANOS_PER_DAY),
        DataType::Date64 => Some(nanos(TimeUnit::Millisecond)),
        _ => None,
    }
}

/// The name of the unit of `nanos` nanoseconds, for messages.
fn unit_name(nanos: i64) -> &'static str {
    match nanos {
        NANOS_PER_DAY => "days",
        1_000_000_000 => "s",
        1_000_000 => "ms",
        1_000 => "us",
        _ => "ns",
    }
}

/// Numbers, and the counts of timestamps, dates and durations.
fn is_tensor_value(data_type: &DataType) -> bool {
    is_number(data_type) || nanos_per_value(data_type).is_some()
}

/// How the values of `value_type` become numbers of `dtype`, or an error
/// for a `unit` on a non-temporal column and for dtypes that cannot hold a
/// count of time.
fn temporal(
    field: &Field,
    value_type: &DataType,
    dtype: DType,
    spec: &ColumnSpec,
) -> Result<Option<Temporal>> {
    let Some(from) = nanos_per_value(value_type) else {
        return match spec.unit {
            Some(unit) => plan_err!(
                "column '{}' holds {value_type} values, but unit={} applies only to \
                 timestamp, date and duration columns; drop the unit for this column",
                field.name(),
                unit_name(nanos(unit))
            ),
            None => Ok(None),
        };
    };
    if !matches!(
        dtype,
        DType::Int64 | DType::Int32 | DType::Float64 | DType::Float32
    ) {
        return plan_err!(
            "column '{}' holds {value_type} values, which become int64 (the default), \
             int32, float64 or float32 tensors, not {dtype}",
            field.name()
        );
    }
    let to = spec.unit.map(nanos).unwrap_or(from);
    // Every unit's nanoseconds divide the coarser units' (days included),
    // so the factor is exact.
    let rescale = match from.cmp(&to) {
        std::cmp::Ordering::Equal => Rescale::Keep,
        std::cmp::Ordering::Greater => Rescale::Multiply(from / to),
        std::cmp::Ordering::Less => Rescale::Divide(to / from),
    };
    Ok(Some(Temporal {
        rescale,
        from: unit_name(from),
        to: unit_name(to),
    }))
}

fn default_dtype(value_type: &DataType) -> DType {
    match value_type {
        DataType::Boolean => DType::Bool,
        DataType::UInt8 => DType::UInt8,
        t if t.is_floating() => DType::Float32,
        _ => DType::Int64,
    }
}

fn struct_field<'a>(fields: &'a Fields, name: &str) -> Option<&'a DataType> {
    fields
        .iter()
        .find(|f| f.name() == name)
        .map(|f| f.data_type())
}

fn resolve_column(
    index: usize,
    field: &Field,
    spec: &ColumnSpec,
) -> Result<TensorColumn> {
    const HINT_TEXT: &str = "strings are not tensors; tokenize them (tokenize(...)) or \
                             encode them (hash_bucket, one_hot) in SQL";
    let (source, value_type, mut sample_shape) = match field.data_type() {
        t if is_tensor_value(t) => (Source::Scalar, t.clone(), Some(vec![])),
        DataType::FixedSizeList(..) => {
            let mut dims = vec![];
            let mut current = field.data_type();
            while let DataType::FixedSizeList(child, size) = current {
                dims.push(usize::try_from(*size).unwrap_or(0));
                current = child.data_type();
            }
            if !is_tensor_value(current) {
                return Err(unsupported(field, "its innermost values are not numbers"));
            }
            (
                Source::Fixed { dims: dims.clone() },
                current.clone(),
                Some(dims),
            )
        }
        DataType::FixedSizeBinary(size) => {
            let dims = vec![usize::try_from(*size).unwrap_or(0)];
            (
                Source::Fixed { dims: dims.clone() },
                DataType::UInt8,
                Some(dims),
            )
        }
        DataType::List(child) | DataType::LargeList(child) => {
            if !is_tensor_value(child.data_type()) {
                return Err(unsupported(
                    field,
                    "only lists of numbers (or of timestamps, dates, durations) become \
                     tensors (nested or ragged lists of other types have no rectangular \
                     layout)",
                ));
            }
            (Source::Variable, child.data_type().clone(), None)
        }
        DataType::Binary | DataType::LargeBinary => {
            (Source::Variable, DataType::UInt8, None)
        }
        DataType::Struct(fields) => {
            let is = |name: &str, ok: fn(&DataType) -> bool| {
                struct_field(fields, name).is_some_and(ok)
            };
            let int = |t: &DataType| t.is_integer();
            if fields.len() == 4
                && is("height", int)
                && is("width", int)
                && is("channels", int)
                && is("pixels", |t| {
                    matches!(t, DataType::Binary | DataType::LargeBinary)
                })
            {
                (Source::Image, DataType::UInt8, None)
            } else if fields.len() == 4
                && is("height", int)
                && is("width", int)
                && is("channels", int)
                && is(
                    "values",
                    |t| matches!(t, DataType::List(c) | DataType::LargeList(c) if c.data_type() == &DataType::Float32),
                )
            {
                (Source::ImageTensor, DataType::Float32, None)
            } else {
                return Err(unsupported(
                    field,
                    "only the structs of image_decode and image_to_tensor become tensors; \
                     select the struct's fields as separate columns",
                ));
            }
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            return Err(unsupported(field, HINT_TEXT));
        }
        _ => return Err(unsupported(field, "no tensor layout for this type")),
    };
    let dtype = spec.dtype.unwrap_or_else(|| default_dtype(&value_type));
    if value_type.is_floating() && !dtype.is_float() && dtype != DType::Bool {
        return plan_err!(
            "column '{}' holds {value_type} values; converting them to {dtype} would \
             silently truncate: cast or round them in SQL first",
            field.name()
        );
    }
    let affine = match (spec.scale, spec.offset) {
        (None, None) => None,
        (scale, offset) => {
            if !dtype.is_float() {
                return plan_err!(
                    "scale/offset of column '{}' need a float dtype, but it is {dtype}",
                    field.name()
                );
            }
            Some((scale.unwrap_or(1.0), offset.unwrap_or(0.0)))
        }
    };
    let temporal = temporal(field, &value_type, dtype, spec)?;
    let mut padding = if source == Source::Variable {
        match spec.pad_to {
            Some(len) => Padding::To(len),
            None => Padding::BatchMax,
        }
    } else {
        Padding::None
    };
    if let Some(shape) = &spec.shape {
        let elements: usize = shape.iter().product();
        match &source {
            Source::Scalar if elements != 1 => {
                return plan_err!(
                    "column '{}' has one value per row; shape {shape:?} does not fit",
                    field.name()
                );
            }
            Source::Fixed { dims } if dims.iter().product::<usize>() != elements => {
                return plan_err!(
                    "column '{}' has {} values per row; shape {shape:?} has {elements}",
                    field.name(),
                    dims.iter().product::<usize>()
                );
            }
            Source::Variable => {
                if spec.pad_to.is_some() {
                    return plan_err!(
                        "column '{}': give either shape (every row exactly that long) or \
                         pad_to (pad/truncate with a mask), not both",
                        field.name()
                    );
                }
                padding = Padding::Exact(elements);
            }
            Source::Image | Source::ImageTensor => {}
            _ => {}
        }
        sample_shape = Some(shape.clone());
    }
    let name: Arc<str> = field.name().as_str().into();
    let mask_name = matches!(padding, Padding::BatchMax | Padding::To(_))
        .then(|| Arc::from(format!("{name}_mask")));
    Ok(TensorColumn {
        name,
        mask_name,
        index,
        source,
        dtype,
        sample_shape,
        padding,
        affine,
        pad_value: spec.pad_value,
        fill_null: spec.fill_null,
        temporal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(fields: Vec<Field>) -> Schema {
        Schema::new(fields)
    }

    #[test]
    fn columns_resolve_to_tensor_layouts() -> Result<()> {
        let list = |t: DataType| DataType::List(Arc::new(Field::new_list_field(t, true)));
        let s = schema(vec![
            Field::new("y", DataType::Int32, false),
            Field::new("x", DataType::Float64, false),
            Field::new(
                "v",
                DataType::FixedSizeList(
                    Arc::new(Field::new_list_field(DataType::Float32, false)),
                    4,
                ),
                false,
            ),
            Field::new("tokens", list(DataType::Int32), true),
            Field::new("img", DataType::Binary, false),
        ]);
        let specs = vec![(
            "img".to_string(),
            ColumnSpec::new()
                .dtype(DType::Float32)
                .shape([3, 2, 2])
                .scale(1.0 / 255.0),
        )];
        let columns = resolve(&s, &specs)?;
        assert_eq!(columns[0].dtype, DType::Int64);
        assert_eq!(columns[1].dtype, DType::Float32);
        assert_eq!(columns[2].sample_shape, Some(vec![4]));
        assert_eq!(columns[3].padding, Padding::BatchMax);
        assert_eq!(columns[3].mask_name.as_deref(), Some("tokens_mask"));
        assert_eq!(columns[4].padding, Padding::Exact(12));
        assert_eq!(columns[4].sample_shape, Some(vec![3, 2, 2]));
        assert!(columns[4].affine.is_some());
        Ok(())
    }

    #[test]
    fn untensorable_columns_are_build_errors_naming_column_and_type() {
        let nested = DataType::List(Arc::new(Field::new_list_field(
            DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true))),
            true,
        )));
        for (field, needle) in [
            (
                Field::new("caption", DataType::Utf8, true),
                "strings are not tensors",
            ),
            (Field::new("nested", nested, true), "only lists of numbers"),
            (
                Field::new(
                    "i",
                    DataType::Interval(
                        datafusion::arrow::datatypes::IntervalUnit::MonthDayNano,
                    ),
                    true,
                ),
                "no tensor layout",
            ),
        ] {
            let name = field.name().clone();
            let err = resolve(&schema(vec![field]), &[]).unwrap_err().to_string();
            assert!(
                err.contains(&format!("column '{name}'")) && err.contains(needle),
                "{err}"
            );
        }
        let s = schema(vec![Field::new("x", DataType::Float32, false)]);
        let err = resolve(&s, &[("x".into(), ColumnSpec::new().dtype(DType::Int64))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("truncate"), "{err}");
        let err = resolve(&s, &[("nope".into(), ColumnSpec::new())])
            .unwrap_err()
            .to_string();
        assert!(err.contains("'nope'") && err.contains("x"), "{err}");
        let err = resolve(&s, &[("x".into(), ColumnSpec::new().shape([2]))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("shape"), "{err}");
    }

    #[test]
    fn cli_specs_parse() -> Result<()> {
        let (name, spec) =
            ColumnSpec::parse_named("image:dtype=float32,shape=3x32x32,scale=1/255")?;
        assert_eq!(name, "image");
        assert_eq!(spec.shape, Some(vec![3, 32, 32]));
        assert!((spec.scale.unwrap_or(0.0) - 1.0 / 255.0).abs() < 1e-12);
        assert!(ColumnSpec::parse_named("image").is_err());
        assert!(ColumnSpec::parse_named("image:colour=red").is_err());
        assert!(ColumnSpec::parse_named("image:scale=1/0").is_err());
        let (name, spec) = ColumnSpec::parse_named("t:dtype=float64,unit=s")?;
        assert_eq!(name, "t");
        assert_eq!(
            spec,
            ColumnSpec::new()
                .dtype(DType::Float64)
                .unit(TimeUnit::Second)
        );
        for (text, unit) in [
            ("s", TimeUnit::Second),
            ("ms", TimeUnit::Millisecond),
            ("us", TimeUnit::Microsecond),
            ("µs", TimeUnit::Microsecond),
            ("ns", TimeUnit::Nanosecond),
        ] {
            assert_eq!(
                ColumnSpec::parse_named(&format!("t:unit={text}"))?.1.unit,
                Some(unit)
            );
        }
        let err = ColumnSpec::parse_named("t:unit=d").unwrap_err().to_string();
        assert!(
            err.contains("unit 'd' of column 't'") && err.contains("s, ms, us or ns"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn temporal_columns_resolve_to_int64_counts_of_their_unit() -> Result<()> {
        let list = |t: DataType| DataType::List(Arc::new(Field::new_list_field(t, true)));
        let utc = Some(Arc::from("UTC"));
        let s = schema(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Second, None), true),
            Field::new(
                "tms",
                DataType::Timestamp(TimeUnit::Millisecond, utc.clone()),
                true,
            ),
            Field::new("tus", DataType::Timestamp(TimeUnit::Microsecond, utc), true),
            Field::new("tns", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
            Field::new("d32", DataType::Date32, true),
            Field::new("d64", DataType::Date64, true),
            Field::new("ds", DataType::Duration(TimeUnit::Second), true),
            Field::new("dms", DataType::Duration(TimeUnit::Millisecond), true),
            Field::new("dus", DataType::Duration(TimeUnit::Microsecond), true),
            Field::new("dns", DataType::Duration(TimeUnit::Nanosecond), true),
            Field::new(
                "events",
                list(DataType::Timestamp(TimeUnit::Millisecond, None)),
                true,
            ),
        ]);
        let columns = resolve(&s, &[])?;
        let own: Vec<_> = columns
            .iter()
            .map(|c| (c.dtype, c.temporal.map(|t| (t.rescale, t.from, t.to))))
            .collect();
        let keep = |unit| (DType::Int64, Some((Rescale::Keep, unit, unit)));
        assert_eq!(
            own,
            [
                keep("s"),
                keep("ms"),
                keep("us"),
                keep("ns"),
                keep("days"),
                keep("ms"),
                keep("s"),
                keep("ms"),
                keep("us"),
                keep("ns"),
                keep("ms"),
            ]
        );
        assert_eq!(columns[10].padding, Padding::BatchMax);
        let to = |unit: TimeUnit| {
            let specs: Vec<(String, ColumnSpec)> = s
                .fields()
                .iter()
                .map(|f| (f.name().clone(), ColumnSpec::new().unit(unit)))
                .collect();
            resolve(&s, &specs).map(|columns| {
                columns
                    .iter()
                    .map(|c| c.temporal.map(|t| t.rescale))
                    .collect::<Vec<_>>()
            })
        };
        use Rescale::{Divide, Keep, Multiply};
        assert_eq!(
            to(TimeUnit::Second)?,
            [
                Keep,
                Divide(1_000),
                Divide(1_000_000),
                Divide(1_000_000_000),
                Multiply(86_400),
                Divide(1_000),
                Keep,
                Divide(1_000),
                Divide(1_000_000),
                Divide(1_000_000_000),
                Divide(1_000),
            ]
            .map(Some)
        );
        assert_eq!(
            to(TimeUnit::Nanosecond)?,
            [
                Multiply(1_000_000_000),
                Multiply(1_000_000),
                Multiply(1_000),
                Keep,
                Multiply(86_400_000_000_000),
                Multiply(1_000_000),
                Multiply(1_000_000_000),
                Multiply(1_000_000),
                Multiply(1_000),
                Keep,
                Multiply(1_000_000),
            ]
            .map(Some)
        );
        let one = |field: Field, spec: ColumnSpec| {
            let name = field.name().clone();
            resolve(&schema(vec![field]), &[(name, spec)])
        };
        let ts =
            || Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), true);
        let float = one(
            ts(),
            ColumnSpec::new()
                .dtype(DType::Float64)
                .unit(TimeUnit::Second),
        )?;
        assert_eq!(float[0].dtype, DType::Float64);
        assert_eq!(
            float[0].temporal.map(|t| t.rescale),
            Some(Divide(1_000_000))
        );
        for dtype in [DType::Bool, DType::UInt8, DType::Float16, DType::BFloat16] {
            let err = one(ts(), ColumnSpec::new().dtype(dtype))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("column 't'") && err.contains(&format!("not {dtype}")),
                "{err}"
            );
        }
        let err = one(
            Field::new("x", DataType::Int64, false),
            ColumnSpec::new().unit(TimeUnit::Second),
        )
        .unwrap_err();
        assert!(matches!(err, DataFusionError::Plan(_)), "{err}");
        let err = err.to_string();
        assert!(
            err.contains("column 'x'") && err.contains("unit=s") && err.contains("Int64"),
            "{err}"
        );
        Ok(())
    }
}
