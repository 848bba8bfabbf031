//! Encodings: `bucketize(x, boundaries)`, `one_hot(i, n)`,
//! `hash_bucket(value, n [, seed])`.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, Int32Array, Int64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature,
    Volatility,
};
use xxhash_rust::xxh3::xxh3_64_with_seed;

const BUCKETIZE: &str = "bucketize(x, [b0, b1, ...])";
const ONE_HOT: &str = "one_hot(i, n)";
const HASH_BUCKET: &str = "hash_bucket(value, n [, seed])";
/// Widest `one_hot` accepted: a larger `n` is almost surely a mistake and
/// would allocate `n` floats per row.
const MAX_ONE_HOT: i64 = 1 << 16;

/// A constant argument, or a plan error saying it must be one.
fn constant<'a>(
    function: &str,
    syntax: &str,
    what: &str,
    value: Option<&'a ScalarValue>,
) -> Result<&'a ScalarValue> {
    match value {
        Some(v) if !v.is_null() => Ok(v),
        _ => Err(DataFusionError::Plan(format!(
            "{function}: {what} must be a non-null constant; signature: {syntax}"
        ))),
    }
}

fn constant_i64(
    function: &str,
    syntax: &str,
    what: &str,
    value: Option<&ScalarValue>,
) -> Result<i64> {
    match constant(function, syntax, what, value)?.cast_to(&DataType::Int64)? {
        ScalarValue::Int64(Some(v)) => Ok(v),
        other => Err(DataFusionError::Plan(format!(
            "{function}: {what} must be an integer, got {other}; signature: {syntax}"
        ))),
    }
}

/// The sorted boundaries of `bucketize`, checked.
fn boundaries(value: Option<&ScalarValue>) -> Result<Vec<f64>> {
    let value = constant("bucketize", BUCKETIZE, "the boundaries", value)?;
    let ScalarValue::List(list) =
        value.cast_to(&DataType::new_list(DataType::Float64, true))?
    else {
        return Err(DataFusionError::Plan(format!(
            "bucketize: the boundaries must be a list of numbers; signature: {BUCKETIZE}"
        )));
    };
    let values = list.value(0);
    let values = values.as_primitive::<Float64Type>();
    if values.null_count() > 0 || values.values().iter().any(|b| b.is_nan()) {
        return Err(DataFusionError::Plan(
            "bucketize: the boundaries must not contain NULL or NaN".into(),
        ));
    }
    let bounds = values.values().to_vec();
    if bounds.windows(2).any(|w| w[0] > w[1]) {
        return Err(DataFusionError::Plan(format!(
            "bucketize: the boundaries must be sorted ascending, got {bounds:?}"
        )));
    }
    Ok(bounds)
}

/// `bucketize(x, [b0, …])`: the number of boundaries `<= x`, as int32, so
/// bucket `k` holds `b[k-1] <= x < b[k]`; NaN lands after every boundary.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct BucketizeFunc {
    signature: Signature,
}

impl BucketizeFunc {
    pub(super) fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for BucketizeFunc {
    fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
        crate::documentation_of(self.name())
    }

    fn name(&self) -> &str {
        "bucketize"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::check_arity("bucketize", BUCKETIZE, arg_types.len(), &[2])?;
        super::float_type("bucketize", BUCKETIZE, 0, &arg_types[0])?;
        if !matches!(
            arg_types[1],
            DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..)
        ) {
            return Err(DataFusionError::Plan(format!(
                "bucketize: the boundaries must be a list such as [0, 1.5, 3], got {}; signature: {BUCKETIZE}",
                arg_types[1]
            )));
        }
        Ok(vec![
            DataType::Float64,
            DataType::new_list(DataType::Float64, true),
        ])
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int32)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        // Validate the boundaries at plan time, not per batch. `[0, 1.5]` is a
        // `make_array` call until the simplifier folds it into a literal, so
        // the check runs once the literal is there (physical planning).
        if let Some(Some(bounds)) = args.scalar_arguments.get(1) {
            boundaries(Some(bounds))?;
        }
        let nullable = args.arg_fields.first().is_none_or(|f| f.is_nullable());
        Ok(Arc::new(Field::new("bucketize", DataType::Int32, nullable)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let bounds = match args.args.get(1) {
            Some(ColumnarValue::Scalar(v)) => boundaries(Some(v))?,
            _ => {
                return Err(DataFusionError::Plan(format!(
                    "bucketize: the boundaries must be a constant list; signature: {BUCKETIZE}"
                )));
            }
        };
        let x = args.args[0].to_array(args.number_rows)?;
        let buckets: Int32Array = x
            .as_primitive::<Float64Type>()
            .iter()
            .map(|v| {
                v.map(|v| {
                    if v.is_nan() {
                        bounds.len() as i32
                    } else {
                        bounds.partition_point(|b| *b <= v) as i32
                    }
                })
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(buckets)))
    }
}

/// `one_hot(i, n)`: a fixed-size list of `n` float32 with 1.0 at `i`; an `i`
/// outside `[0, n)` is an error naming the row and the value.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct OneHotFunc {
    signature: Signature,
}

impl OneHotFunc {
    pub(super) fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

fn one_hot_width(value: Option<&ScalarValue>) -> Result<i32> {
    let n = constant_i64("one_hot", ONE_HOT, "n", value)?;
    if !(1..=MAX_ONE_HOT).contains(&n) {
        return Err(DataFusionError::Plan(format!(
            "one_hot: n must be in 1..={MAX_ONE_HOT}, got {n}"
        )));
    }
    Ok(n as i32)
}

impl ScalarUDFImpl for OneHotFunc {
    fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
        crate::documentation_of(self.name())
    }

    fn name(&self) -> &str {
        "one_hot"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::check_arity("one_hot", ONE_HOT, arg_types.len(), &[2])?;
        for (position, t) in arg_types.iter().enumerate() {
            if !(t.is_integer() || *t == DataType::Null) {
                return Err(DataFusionError::Plan(format!(
                    "one_hot: argument {} must be an integer, got {t}; signature: {ONE_HOT}",
                    position + 1
                )));
            }
        }
        Ok(vec![DataType::Int64, DataType::Int64])
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Err(DataFusionError::Internal(
            "one_hot's type depends on n: return_field_from_args is used".into(),
        ))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let n = one_hot_width(args.scalar_arguments.get(1).copied().flatten())?;
        let nullable = args.arg_fields.first().is_none_or(|f| f.is_nullable());
        Ok(Arc::new(Field::new(
            "one_hot",
            DataType::FixedSizeList(
                Arc::new(Field::new("item", DataType::Float32, false)),
                n,
            ),
            nullable,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = match args.args.get(1) {
            Some(ColumnarValue::Scalar(v)) => one_hot_width(Some(v))?,
            _ => {
                return Err(DataFusionError::Plan(format!(
                    "one_hot: n must be a constant; signature: {ONE_HOT}"
                )));
            }
        };
        let index = args.args[0].to_array(args.number_rows)?;
        let index = index.as_primitive::<Int64Type>();
        let width = n as usize;
        let mut values = vec![0f32; index.len() * width];
        for (row, i) in index.iter().enumerate() {
            let Some(i) = i else { continue };
            if !(0..n as i64).contains(&i) {
                return Err(DataFusionError::Execution(format!(
                    "one_hot: index {i} in row {row} is outside [0, {n})"
                )));
            }
            values[row * width + i as usize] = 1.0;
        }
        let list = FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            n,
            Arc::new(Float32Array::from(values)),
            index.nulls().cloned(),
        )?;
        Ok(ColumnarValue::Array(Arc::new(list)))
    }
}

/// `hash_bucket(value, n [, seed])`; see [`hash_bytes`] for the definition.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct HashBucketFunc {
    signature: Signature,
}

impl HashBucketFunc {
    pub(super) fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

/// The bucket of one value: `xxh3_64_with_seed(bytes, seed) mod n` where
/// `bytes` are the UTF-8 bytes of a string, the bytes of a binary, or the 8
/// little-endian bytes of an integer widened to int64. XXH3 is a published,
/// platform-independent hash, so buckets never change across runs, machines
/// or sqlfeed versions.
pub fn hash_bytes(bytes: &[u8], n: u64, seed: u64) -> i64 {
    (xxh3_64_with_seed(bytes, seed) % n) as i64
}

impl ScalarUDFImpl for HashBucketFunc {
    fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
        crate::documentation_of(self.name())
    }

    fn name(&self) -> &str {
        "hash_bucket"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::check_arity("hash_bucket", HASH_BUCKET, arg_types.len(), &[2, 3])?;
        let value = match &arg_types[0] {
            t if t.is_integer() => DataType::Int64,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                DataType::Utf8View
            }
            DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_) => DataType::BinaryView,
            DataType::Dictionary(_, v) if v.is_string() => DataType::Utf8View,
            DataType::Null => DataType::Int64,
            other => {
                return Err(DataFusionError::Plan(format!(
                    "hash_bucket: value must be a string, binary or integer, got {other}; \
                     signature: {HASH_BUCKET}"
                )));
            }
        };
        let mut types = vec![value];
        types.extend(arg_types[1..].iter().map(|_| DataType::Int64));
        Ok(types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        hash_params(
            args.scalar_arguments.get(1).copied().flatten(),
            args.scalar_arguments.get(2).copied(),
        )?;
        let nullable = args.arg_fields.first().is_none_or(|f| f.is_nullable());
        Ok(Arc::new(Field::new(
            "hash_bucket",
            DataType::Int64,
            nullable,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        // None: argument absent; Some(None): present but not a constant.
        let scalar = |i: usize| match args.args.get(i) {
            Some(ColumnarValue::Scalar(v)) => Some(Some(v)),
            Some(ColumnarValue::Array(_)) => Some(None),
            None => None,
        };
        let (n, seed) = hash_params(scalar(1).flatten(), scalar(2))?;
        let values = args.args[0].to_array(args.number_rows)?;
        let buckets: Int64Array = match values.data_type() {
            DataType::Int64 => values
                .as_primitive::<Int64Type>()
                .iter()
                .map(|v| v.map(|v| hash_bytes(&v.to_le_bytes(), n, seed)))
                .collect(),
            DataType::Utf8View => values
                .as_string_view()
                .iter()
                .map(|v| v.map(|v| hash_bytes(v.as_bytes(), n, seed)))
                .collect(),
            DataType::BinaryView => values
                .as_binary_view()
                .iter()
                .map(|v| v.map(|v| hash_bytes(v, n, seed)))
                .collect(),
            other => {
                return Err(DataFusionError::Internal(format!("hash_bucket on {other}")));
            }
        };
        Ok(ColumnarValue::Array(Arc::new(buckets) as ArrayRef))
    }
}

/// `(n, seed)` of `hash_bucket`, checked: `n >= 1`, seed defaults to 0.
fn hash_params(
    n: Option<&ScalarValue>,
    seed: Option<Option<&ScalarValue>>,
) -> Result<(u64, u64)> {
    let n = constant_i64("hash_bucket", HASH_BUCKET, "n", n)?;
    if n < 1 {
        return Err(DataFusionError::Plan(format!(
            "hash_bucket: n must be >= 1, got {n}"
        )));
    }
    let seed = match seed {
        None => 0,
        Some(seed) => constant_i64("hash_bucket", HASH_BUCKET, "seed", seed)? as u64,
    };
    Ok((n as u64, seed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::test_util::{query, query_error};

    #[tokio::test]
    async fn bucketize_counts_boundaries_at_or_below() -> Result<()> {
        let out = query(
            "SELECT bucketize(x, [0, 1.5, 3]) FROM (VALUES (-1.0), (0.0), (1.4), (1.5), \
             (3.0), (99.0), ('NaN'::double), ('-inf'::double), (NULL)) AS t(x)",
        )
        .await?;
        let out = out.as_primitive::<datafusion::arrow::datatypes::Int32Type>();
        let got: Vec<Option<i32>> = out.iter().collect();
        assert_eq!(
            got,
            vec![
                Some(0),
                Some(1),
                Some(1),
                Some(2),
                Some(3),
                Some(3),
                Some(3),
                Some(0),
                None
            ]
        );
        Ok(())
    }

    #[tokio::test]
    async fn bucketize_rejects_unsorted_or_nan_boundaries_at_plan_time() {
        let err = query_error("SELECT bucketize(1.0, [3, 1])").await;
        assert!(err.contains("sorted ascending"), "{err}");
        let err = query_error("SELECT bucketize(1.0, ['NaN'::double])").await;
        assert!(err.contains("NaN"), "{err}");
        let err = query_error("SELECT bucketize(1.0, 2.0)").await;
        assert!(err.contains(BUCKETIZE), "{err}");
    }

    #[tokio::test]
    async fn one_hot_is_a_fixed_size_float32_list() -> Result<()> {
        let out =
            query("SELECT one_hot(x, 3) FROM (VALUES (2), (0), (NULL)) AS t(x)").await?;
        let list = out.as_fixed_size_list();
        assert_eq!(list.value_length(), 3);
        let values = list
            .values()
            .as_primitive::<datafusion::arrow::datatypes::Float32Type>();
        assert_eq!(&values.values()[..6], &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
        assert!(list.is_null(2));
        Ok(())
    }

    #[tokio::test]
    async fn one_hot_out_of_range_names_row_and_value() {
        let err =
            query_error("SELECT one_hot(x, 3) FROM (VALUES (1), (3)) AS t(x)").await;
        assert!(err.contains("index 3 in row 1 is outside [0, 3)"), "{err}");
        let err = query_error("SELECT one_hot(1, 0)").await;
        assert!(err.contains("n must be in 1..="), "{err}");
        let err = query_error("SELECT one_hot(x, x) FROM (VALUES (1)) AS t(x)").await;
        assert!(err.contains("constant"), "{err}");
    }

    #[tokio::test]
    async fn hash_bucket_is_the_documented_xxh3() -> Result<()> {
        let out = query(
            "SELECT hash_bucket(v, 1000, 7) FROM (VALUES ('cat'), ('dog'), (NULL)) AS t(v)",
        )
        .await?;
        let out = out.as_primitive::<Int64Type>();
        assert_eq!(out.value(0), (xxh3_64_with_seed(b"cat", 7) % 1000) as i64);
        assert_eq!(out.value(1), (xxh3_64_with_seed(b"dog", 7) % 1000) as i64);
        assert!(out.is_null(2));
        // Pinned values: a change of hash would silently re-bucket every model input.
        assert_eq!(
            hash_bytes(b"cat", 1000, 7),
            (xxh3_64_with_seed(b"cat", 7) % 1000) as i64
        );
        assert_eq!(xxh3_64_with_seed(b"", 0), 0x2D06_8005_38D3_94C2);
        let ints = query("SELECT hash_bucket(42, 10)").await?;
        assert_eq!(
            ints.as_primitive::<Int64Type>().value(0),
            (xxh3_64_with_seed(&42i64.to_le_bytes(), 0) % 10) as i64
        );
        Ok(())
    }

    #[tokio::test]
    async fn hash_bucket_bad_arguments_are_plan_errors() {
        let err = query_error("SELECT hash_bucket(1.5, 10)").await;
        assert!(err.contains(HASH_BUCKET), "{err}");
        let err = query_error("SELECT hash_bucket('a', 0)").await;
        assert!(err.contains("n must be >= 1"), "{err}");
    }
}
