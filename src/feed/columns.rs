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
//!
//! A declared `shape` also reshapes fixed-size values (`FixedSizeBinary(3072)`
//! → `[3, 32, 32]`) as long as the element count matches. `scale`/`offset`
//! (`x * scale + offset`) apply to float outputs, so raw pixel bytes become
//! `float32 / 255` in the same pass that writes the tensor.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema};
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

    /// Parses the CLI form `name:key=value,key=value` (keys: `dtype`,
    /// `shape` as `3x32x32`, `scale` (a number or `1/255`), `offset`,
    /// `pad_to`, `pad_value`, `fill_null`).
    pub fn parse_named(text: &str) -> Result<(String, ColumnSpec)> {
        let (name, options) = text.split_once(':').ok_or_else(|| {
            DataFusionError::Plan(format!(
                "tensor option '{text}' should look like \
                 name:dtype=float32,shape=3x32x32,scale=1/255"
            ))
        })?;
        let mut spec = ColumnSpec::new();
        for option in options.split(',').filter(|o| !o.trim().is_empty()) {
            let (key, value) = option.split_once('=').ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "tensor option '{option}' of column '{name}' should be key=value"
                ))
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
                            DataFusionError::Plan(format!(
                                "shape '{value}' of column '{name}' should look like 3x32x32"
                            ))
                        })?;
                    spec.shape = Some(dims);
                }
                "scale" => spec.scale = Some(number(value)?),
                "offset" => spec.offset = Some(number(value)?),
                "pad_to" => spec.pad_to = Some(number(value)? as usize),
                "pad_value" => spec.pad_value = number(value)?,
                "fill_null" => spec.fill_null = Some(number(value)?),
                other => {
                    return plan_err!(
                        "unknown tensor option '{other}' for column '{name}': expected \
                         dtype, shape, scale, offset, pad_to, pad_value or fill_null"
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
        DataFusionError::Plan(format!(
            "{key}={value} for column '{column}' is not a finite number"
        ))
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
    /// `x * scale + offset` for float outputs.
    pub(crate) affine: Option<(f32, f32)>,
    /// Padding value.
    pub(crate) pad_value: f64,
    /// NULL replacement.
    pub(crate) fill_null: Option<f64>,
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
                schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if schema.fields().is_empty() {
        return Err(DataFusionError::Plan(
            "the feed's query returns no columns".into(),
        ));
    }
    let mut columns = Vec::with_capacity(schema.fields().len());
    let mut tensor_names = HashSet::new();
    for (index, field) in schema.fields().iter().enumerate() {
        let spec = specs
            .iter()
            .rev()
            .find(|(name, _)| name == field.name())
            .map(|(_, spec)| spec.clone())
            .unwrap_or_default();
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

fn unsupported(field: &Field, why: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "column '{}' of type {} cannot become a tensor: {why}",
        field.name(),
        field.data_type()
    ))
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
        t if is_number(t) => (Source::Scalar, t.clone(), Some(vec![])),
        DataType::FixedSizeList(..) => {
            let mut dims = vec![];
            let mut current = field.data_type();
            while let DataType::FixedSizeList(child, size) = current {
                dims.push(usize::try_from(*size).unwrap_or(0));
                current = child.data_type();
            }
            if !is_number(current) {
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
            if !is_number(child.data_type()) {
                return Err(unsupported(
                    field,
                    "only lists of numbers become tensors (nested or ragged lists of \
                     other types have no rectangular layout)",
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
            Some((scale.unwrap_or(1.0) as f32, offset.unwrap_or(0.0) as f32))
        }
    };
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
            (Field::new("d", DataType::Date32, true), "no tensor layout"),
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
        Ok(())
    }
}
