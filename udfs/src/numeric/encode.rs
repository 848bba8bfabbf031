//! Encodings: `bucketize(x, boundaries)`, `one_hot(i, n)` and
//! `one_hot(value, vocabulary [, 'zeros'])`, `hash_bucket(value, n [, seed])`.

use std::sync::Arc;

use super::vocabulary::{self, ONE_HOT_ENCODER, Vocabulary};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array, Int32Array, Int64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float64Type, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::common::{exec_err, internal_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl,
};
use xxhash_rust::xxh3::xxh3_64_with_seed;

const BUCKETIZE: &str = "bucketize(x, [b0, b1, ...])";
const ONE_HOT: &str = "one_hot(i, n)";
/// Both forms, for messages that cannot tell which one was meant.
const ONE_HOT_FORMS: &str =
    "one_hot(i, n) or one_hot(value, ['a', 'b', ...] [, 'zeros'])";
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
        _ => plan_err!(
            "{function}: {what} must be a non-null constant; signature: {syntax}"
        ),
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
        other => plan_err!(
            "{function}: {what} must be an integer, got {other}; signature: {syntax}"
        ),
    }
}

/// The sorted boundaries of `bucketize`, checked.
fn boundaries(value: Option<&ScalarValue>) -> Result<Vec<f64>> {
    let value = constant("bucketize", BUCKETIZE, "the boundaries", value)?;
    let ScalarValue::List(list) =
        value.cast_to(&DataType::new_list(DataType::Float64, true))?
    else {
        return plan_err!(
            "bucketize: the boundaries must be a list of numbers; signature: {BUCKETIZE}"
        );
    };
    let values = list.value(0);
    let values = values.as_primitive::<Float64Type>();
    if values.null_count() > 0 || values.values().iter().any(|b| b.is_nan()) {
        return plan_err!("bucketize: the boundaries must not contain NULL or NaN");
    }
    let bounds = values.values().to_vec();
    if bounds.windows(2).any(|w| w[0] > w[1]) {
        return plan_err!(
            "bucketize: the boundaries must be sorted ascending, got {bounds:?}"
        );
    }
    Ok(bounds)
}

crate::coercing_function! {
    /// `bucketize(x, [b0, …])`: the number of boundaries `<= x`, as int32, so
    /// bucket `k` holds `b[k-1] <= x < b[k]`; NaN lands after every boundary.
    pub struct BucketizeFunc;
}

impl ScalarUDFImpl for BucketizeFunc {
    crate::function_basics!("bucketize");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::check_arity("bucketize", BUCKETIZE, arg_types.len(), &[2])?;
        super::float_type("bucketize", BUCKETIZE, 0, &arg_types[0])?;
        if !matches!(
            arg_types[1],
            DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..)
        ) {
            return plan_err!(
                "bucketize: the boundaries must be a list such as [0, 1.5, 3], got {}; signature: {BUCKETIZE}",
                arg_types[1]
            );
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
        Ok(crate::nullable_like_first(
            "bucketize",
            DataType::Int32,
            &args,
        ))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let bounds = match args.args.get(1) {
            Some(ColumnarValue::Scalar(v)) => boundaries(Some(v))?,
            _ => {
                return plan_err!(
                    "bucketize: the boundaries must be a constant list; signature: {BUCKETIZE}"
                );
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

crate::coercing_function! {
    /// `one_hot(i, n)`: a fixed-size list of `n` float32 with 1.0 at `i`; an `i`
    /// outside `[0, n)` is an error naming the row and the value.
    ///
    /// `one_hot(value, ['a', 'b', ...] [, 'zeros'])`: the same list, as wide as
    /// the vocabulary, with 1.0 at the position of the string `value` in it
    /// (see [`super::vocabulary`]); a value outside the vocabulary is an error
    /// naming it, or an all-zero row with `'zeros'`. The second argument's type
    /// tells the forms apart: a list is a vocabulary. NULL gives a NULL row in
    /// both.
    pub struct OneHotFunc;
}

fn one_hot_width(value: Option<&ScalarValue>) -> Result<i32> {
    let n = constant_i64("one_hot", ONE_HOT, "n", value)?;
    if !(1..=MAX_ONE_HOT).contains(&n) {
        return plan_err!("one_hot: n must be in 1..={MAX_ONE_HOT}, got {n}");
    }
    Ok(n as i32)
}

/// The width of `one_hot`'s vocabulary form: the vocabulary's length,
/// within the same limit as `n`.
fn vocabulary_width(vocabulary: &Vocabulary) -> Result<i32> {
    let n = vocabulary.len();
    if n as i64 > MAX_ONE_HOT {
        return plan_err!(
            "one_hot: the vocabulary may have at most {MAX_ONE_HOT} entries, got {n}"
        );
    }
    Ok(n as i32)
}

/// The type of `one_hot`'s result: `width` float32 per row.
fn one_hot_type(width: i32) -> DataType {
    DataType::FixedSizeList(
        Arc::new(Field::new("item", DataType::Float32, false)),
        width,
    )
}

/// `one_hot`'s rows from vocabulary codes (see [`vocabulary::encode`]):
/// 1.0 at the code, all zeros for -1, NULL for NULL.
fn one_hot_of_codes(codes: &Int64Array, width: i32) -> Result<FixedSizeListArray> {
    let row_width = width as usize;
    let mut values = vec![0f32; codes.len() * row_width];
    for (row, code) in codes.iter().enumerate() {
        // Codes are positions in the vocabulary, so below `width`: the
        // `get_mut` only keeps a bug from becoming a panic.
        if let Some(code) = code
            && let Ok(code) = usize::try_from(code)
            && let Some(slot) = values.get_mut(row * row_width + code)
        {
            *slot = 1.0;
        }
    }
    Ok(FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Float32, false)),
        width,
        Arc::new(Float32Array::from(values)),
        codes.nulls().cloned(),
    )?)
}

impl ScalarUDFImpl for OneHotFunc {
    crate::function_basics!("one_hot");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::check_arity("one_hot", ONE_HOT_FORMS, arg_types.len(), &[2, 3])?;
        if arg_types.len() == 3 || vocabulary::is_list(&arg_types[1]) {
            return vocabulary::coerce(&ONE_HOT_ENCODER, arg_types);
        }
        let value = &arg_types[0];
        if value.is_string()
            || matches!(value, DataType::Dictionary(_, v) if v.is_string())
        {
            return plan_err!(
                "one_hot: the value is a string ({value}), so the second argument must \
                 be its vocabulary, a constant list of strings: {}",
                ONE_HOT_ENCODER.syntax
            );
        }
        for (position, t) in arg_types.iter().enumerate() {
            if !(t.is_integer() || *t == DataType::Null) {
                return plan_err!(
                    "one_hot: argument {} must be an integer, got {t}; signature: {ONE_HOT}",
                    position + 1
                );
            }
        }
        Ok(vec![DataType::Int64, DataType::Int64])
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        internal_err!("one_hot's type depends on n: return_field_from_args is used")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let nullable = args.arg_fields.first().is_none_or(|f| f.is_nullable());
        let vocabulary_form = args.arg_fields.len() == 3
            || args
                .arg_fields
                .get(1)
                .is_some_and(|f| vocabulary::is_list(f.data_type()));
        let n = if vocabulary_form {
            if let Some(Some(option)) = args.scalar_arguments.get(2) {
                vocabulary::on_unknown(&ONE_HOT_ENCODER, Some(Some(option)))?;
            }
            // The width is the vocabulary's length, so the vocabulary must
            // be a literal when the logical plan is built: `['a', 'b']` is
            // one from SQL planning on (`crate::planner`), and anything else
            // is a plan error here rather than a schema of the wrong width.
            vocabulary_width(&Vocabulary::try_new(
                &ONE_HOT_ENCODER,
                args.scalar_arguments.get(1).copied().flatten(),
            )?)?
        } else {
            one_hot_width(args.scalar_arguments.get(1).copied().flatten())?
        };
        Ok(Arc::new(Field::new("one_hot", one_hot_type(n), nullable)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if args.args.len() == 3
            || args
                .args
                .get(1)
                .is_some_and(|a| vocabulary::is_list(&a.data_type()))
        {
            let (vocabulary, on_unknown) =
                vocabulary::parameters(&ONE_HOT_ENCODER, &args.args)?;
            let width = vocabulary_width(&vocabulary)?;
            let values = args.args[0].to_array(args.number_rows)?;
            let codes =
                vocabulary::encode(&ONE_HOT_ENCODER, &values, &vocabulary, on_unknown)?;
            return Ok(ColumnarValue::Array(Arc::new(one_hot_of_codes(
                &codes, width,
            )?)));
        }
        let n = match args.args.get(1) {
            Some(ColumnarValue::Scalar(v)) => one_hot_width(Some(v))?,
            _ => {
                return plan_err!("one_hot: n must be a constant; signature: {ONE_HOT}");
            }
        };
        let index = args.args[0].to_array(args.number_rows)?;
        let index = index.as_primitive::<Int64Type>();
        let width = n as usize;
        let mut values = vec![0f32; index.len() * width];
        for (row, i) in index.iter().enumerate() {
            let Some(i) = i else { continue };
            if !(0..n as i64).contains(&i) {
                return exec_err!("one_hot: index {i} in row {row} is outside [0, {n})");
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

crate::coercing_function! {
    /// `hash_bucket(value, n [, seed])`; see [`hash_bytes`] for the definition.
    pub struct HashBucketFunc;
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
    crate::function_basics!("hash_bucket");

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
                return plan_err!(
                    "hash_bucket: value must be a string, binary or integer, got {other}; \
                     signature: {HASH_BUCKET}"
                );
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
        Ok(crate::nullable_like_first(
            "hash_bucket",
            DataType::Int64,
            &args,
        ))
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
                return internal_err!("hash_bucket on {other}");
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
        return plan_err!("hash_bucket: n must be >= 1, got {n}");
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
    use crate::numeric::test_util::{
        PENGUINS, penguins, query, query_error, query_table,
    };
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;

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
        query_error("SELECT bucketize(1.0, [3, 1])", &["sorted ascending"]).await;
        query_error("SELECT bucketize(1.0, ['NaN'::double])", &["NaN"]).await;
        query_error("SELECT bucketize(1.0, 2.0)", &[BUCKETIZE]).await;
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
            query_error("SELECT one_hot(x, 3) FROM (VALUES (1), (3)) AS t(x)", &[]).await;
        assert!(err.contains("index 3 in row 1 is outside [0, 3)"), "{err}");
        query_error("SELECT one_hot(1, 0)", &["n must be in 1..="]).await;
        query_error(
            "SELECT one_hot(x, x) FROM (VALUES (1)) AS t(x)",
            &["constant"],
        )
        .await;
    }

    /// The rows of a `one_hot` result `width` wide, `None` for a NULL row.
    #[track_caller]
    fn one_hot_rows(out: &ArrayRef, width: i32) -> Vec<Option<Vec<f32>>> {
        assert_eq!(out.data_type(), &one_hot_type(width));
        let list = out.as_fixed_size_list();
        (0..list.len())
            .map(|row| {
                list.is_valid(row).then(|| {
                    let row = list.value(row);
                    row.as_primitive::<datafusion::arrow::datatypes::Float32Type>()
                        .values()
                        .to_vec()
                })
            })
            .collect()
    }

    #[tokio::test]
    async fn one_hot_of_utf8_is_as_wide_as_the_vocabulary() -> Result<()> {
        let out = query(&format!(
            "SELECT one_hot(s, {PENGUINS}) FROM \
             (VALUES ('Gentoo'), ('Adelie'), (NULL), ('Chinstrap')) AS t(s)"
        ))
        .await?;
        assert_eq!(
            one_hot_rows(&out, 3),
            vec![
                Some(vec![0.0, 0.0, 1.0]),
                Some(vec![1.0, 0.0, 0.0]),
                None,
                Some(vec![0.0, 1.0, 0.0]),
            ]
        );
        Ok(())
    }

    #[tokio::test]
    async fn one_hot_of_utf8_view_and_large_utf8() -> Result<()> {
        for t in ["Utf8View", "LargeUtf8"] {
            let out = query(&format!(
                "SELECT one_hot(arrow_cast(s, '{t}'), {PENGUINS}) FROM \
                 (VALUES ('Chinstrap'), (NULL)) AS t(s)"
            ))
            .await?;
            assert_eq!(
                one_hot_rows(&out, 3),
                vec![Some(vec![0.0, 1.0, 0.0]), None],
                "{t}"
            );
        }
        Ok(())
    }

    #[tokio::test]
    async fn one_hot_of_dictionary_strings_maps_the_keys() -> Result<()> {
        // Gentoo, NULL key, NULL dictionary value, Adelie, Chinstrap; the
        // dictionary's 'Emperor' is unused, so it is no error.
        let batch = penguins(vec![Some(0), None, Some(3), Some(2), Some(4)])?;
        let out = query_table(
            &format!("SELECT one_hot(species, {PENGUINS}) FROM t"),
            batch,
        )
        .await?;
        assert_eq!(
            one_hot_rows(&out, 3),
            vec![
                Some(vec![0.0, 0.0, 1.0]),
                None,
                None,
                Some(vec![1.0, 0.0, 0.0]),
                Some(vec![0.0, 1.0, 0.0]),
            ]
        );
        Ok(())
    }

    #[tokio::test]
    async fn one_hot_unknown_value_names_value_row_and_vocabulary() -> Result<()> {
        query_error(
            &format!(
                "SELECT one_hot(s, {PENGUINS}) FROM (VALUES ('Adelie'), ('Emperor')) AS t(s)"
            ),
            &[
                "one_hot: value 'Emperor' in row 1 is not in the vocabulary \
                 ['Adelie', 'Chinstrap', 'Gentoo']; add it to the vocabulary, or pass \
                 'zeros' as the third argument",
                "Execution error",
            ],
        )
        .await;
        // Through a dictionary: the row of the key, not of the dictionary value.
        let batch = penguins(vec![Some(0), Some(0), Some(1)])?;
        let err = query_table(
            &format!("SELECT one_hot(species, {PENGUINS}) FROM t"),
            batch,
        )
        .await
        .expect_err("'Emperor' is not in the vocabulary")
        .to_string();
        assert!(err.contains("value 'Emperor' in row 2"), "{err}");
        Ok(())
    }

    #[tokio::test]
    async fn one_hot_zeros_option_gives_all_zero_rows_for_unknown_values() -> Result<()> {
        let out = query(&format!(
            "SELECT one_hot(s, {PENGUINS}, 'zeros') FROM \
             (VALUES ('Emperor'), ('Gentoo'), (NULL)) AS t(s)"
        ))
        .await?;
        assert_eq!(
            one_hot_rows(&out, 3),
            vec![Some(vec![0.0; 3]), Some(vec![0.0, 0.0, 1.0]), None]
        );
        let batch = penguins(vec![Some(1), Some(2)])?;
        let sql = format!("SELECT one_hot(species, {PENGUINS}, 'zeros') FROM t");
        let out = query_table(&sql, batch).await?;
        assert_eq!(
            one_hot_rows(&out, 3),
            vec![Some(vec![0.0; 3]), Some(vec![1.0, 0.0, 0.0])]
        );
        // 'error' is the default, spelled out.
        query_error(
            &format!("SELECT one_hot('Emperor', {PENGUINS}, 'error')"),
            &["value 'Emperor' in row 0"],
        )
        .await;
        Ok(())
    }

    #[tokio::test]
    async fn one_hot_bad_vocabulary_or_option_is_a_plan_error() {
        query_error(
            "SELECT one_hot('a', ['a', 'b', 'b'])",
            &[
                "Error during planning",
                "'b' appears twice in the vocabulary, at positions 1 and 2",
            ],
        )
        .await;
        query_error(
            "SELECT one_hot('a', ['a'], 'ignore')",
            &[
                "Error during planning",
                "unknown option 'ignore'",
                "accepted: 'error' (the default) or 'zeros'",
            ],
        )
        .await;
        query_error(
            "SELECT one_hot('a', 3)",
            &["the value is a string (Utf8)", "vocabulary"],
        )
        .await;
        query_error("SELECT one_hot(1, ['a'])", &["the value must be a string"]).await;
        query_error("SELECT one_hot('a', [1, 2])", &["constant list of strings"]).await;
    }

    #[tokio::test]
    async fn one_hot_of_dictionary_column_plans_with_the_vocabulary_width() -> Result<()>
    {
        // The SQL path end to end on a dictionary column: the plan's schema,
        // a grouping over the encoded column and a table created from it all
        // see the vocabulary's width.
        let ctx = SessionContext::new();
        crate::register_all(&ctx)?;
        let batch = penguins(vec![Some(0), Some(2), Some(0), None, Some(4)])?;
        let table = MemTable::try_new(batch.schema(), vec![vec![batch]])?;
        ctx.register_table("t", Arc::new(table))?;
        let df = ctx
            .sql(&format!("SELECT one_hot(species, {PENGUINS}) AS v FROM t"))
            .await?;
        let plan = df.create_physical_plan().await?;
        assert_eq!(plan.schema().field(0).data_type(), &one_hot_type(3));
        let grouped = ctx
            .sql(&format!(
                "SELECT v, count(*) AS n FROM (SELECT one_hot(species, {PENGUINS}) AS v \
                 FROM t) GROUP BY v ORDER BY n DESC, v"
            ))
            .await?
            .collect()
            .await?;
        let text = pretty_format_batches(&grouped)?.to_string();
        assert!(text.contains("| [0.0, 0.0, 1.0] | 2 |"), "{text}");
        ctx.sql(&format!(
            "CREATE TABLE encoded AS SELECT one_hot(species, {PENGUINS}) AS v, \
             label_encode(species, {PENGUINS}) AS l FROM t"
        ))
        .await?
        .collect()
        .await?;
        let encoded = ctx.sql("SELECT v, l FROM encoded").await?.collect().await?;
        assert_eq!(encoded[0].schema().field(0).data_type(), &one_hot_type(3));
        assert_eq!(encoded.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
        Ok(())
    }

    /// A context with every function and the table `t (s VARCHAR)`.
    async fn strings_table() -> Result<SessionContext> {
        let ctx = SessionContext::new();
        crate::register_all(&ctx)?;
        ctx.sql("CREATE TABLE t AS SELECT * FROM (VALUES ('a'), ('c'), (NULL)) AS v(s)")
            .await?
            .collect()
            .await?;
        Ok(ctx)
    }

    #[tokio::test]
    async fn vocabulary_functions_have_their_type_in_the_unoptimized_plan() -> Result<()>
    {
        let ctx = strings_table().await?;
        let sql = "SELECT one_hot(s, ['a','b','c']) AS v, label_encode(s, ['a','b']) AS l \
                   FROM t";
        // The logical plan as SQL planning built it, before any optimizer
        // rule: what `DataFrame::schema` shows.
        let schema = ctx.sql(sql).await?.schema().as_arrow().clone();
        assert_eq!(schema.field(0).data_type(), &one_hot_type(3));
        assert_eq!(schema.field(1).data_type(), &DataType::Int64);
        let described = ctx.sql(&format!("DESCRIBE {sql}")).await?.collect().await?;
        let text = pretty_format_batches(&described)?.to_string();
        assert!(
            text.contains("| v           | FixedSizeList(3 x non-null Float32) |"),
            "{text}"
        );
        assert!(text.contains("| l           | Int64 "), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn computed_vocabulary_is_a_plan_error() -> Result<()> {
        let ctx = strings_table().await?;
        for sql in [
            "SELECT one_hot(s, make_array(s)) FROM t",
            "SELECT label_encode(s, make_array(s)) FROM t",
            "SELECT one_hot(s, make_array('a', 'b'), 'zeros') FROM t",
            "SELECT one_hot(s, (SELECT array_agg(s) FROM t)) FROM t",
        ] {
            // At planning (`sql`), not once rows are read.
            let err = ctx
                .sql(sql)
                .await
                .expect_err("a computed vocabulary")
                .to_string();
            assert!(
                err.contains("Error during planning")
                    && err.contains(
                        "the vocabulary must be a constant list of strings written in \
                         the query, such as ['a', 'b']"
                    ),
                "{sql}: {err}"
            );
        }
        Ok(())
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
        query_error("SELECT hash_bucket(1.5, 10)", &[HASH_BUCKET]).await;
        query_error("SELECT hash_bucket('a', 0)", &["n must be >= 1"]).await;
    }
}
