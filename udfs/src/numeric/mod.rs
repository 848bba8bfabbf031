//! Numeric feature transforms.
//!
//! | function | returns |
//! |---|---|
//! | `standardize(x, mean, std)` | `(x - mean) / std` |
//! | `min_max_scale(x, min, max)` | `(x - min) / (max - min)` |
//! | `clip(x, lo, hi)` | `x` limited to `[lo, hi]` |
//! | `log1p(x)` | `ln(1 + x)`, accurate near 0 |
//! | `bucketize(x, [b0, b1, …])` | int32: how many boundaries are `<= x` |
//! | `one_hot(i, n)` | fixed-size list of `n` float32, 1.0 at `i` |
//! | `one_hot(value, ['a', 'b', …] [, 'zeros'])` | the same, as wide as the vocabulary, 1.0 at the string `value`'s position |
//! | `label_encode(value, ['a', 'b', …] [, '-1'])` | int64: the string `value`'s position in the vocabulary |
//! | `hash_bucket(value, n [, seed])` | int64 in `[0, n)`, stable everywhere |
//! | `feature_vector(x1, …, xn)` | fixed-size list of `n` float32: the row's features as one vector |
//!
//! # Types
//! Float32 and float64 inputs keep their type; other numbers are computed as
//! float64. Parameters may be literals or columns (e.g. constants fitted in
//! the same query: `WITH s AS (SELECT avg(x) m, stddev(x) sd FROM t) SELECT
//! standardize(x, s.m, s.sd) FROM t, s`). Nulls propagate.
//!
//! # NaN and infinities
//! Arithmetic follows IEEE 754, as the same expression in SQL or NumPy would:
//! a zero scale gives ±inf (NaN for 0/0), `log1p(-1)` is -inf and `log1p(x)`
//! for `x < -1` is NaN, ±inf pass through. `clip` keeps NaN as NaN (it is not
//! in any interval) and clips ±inf to the bounds. `bucketize` puts NaN after
//! every boundary (index = number of boundaries), like `numpy.digitize`.
//!
//! # Categorical strings
//! `one_hot` and `label_encode` take strings (Utf8, LargeUtf8, Utf8View) or
//! dictionary-encoded strings and a constant vocabulary. A value outside the
//! vocabulary is an execution error naming it and its row, unless the third
//! argument says what it becomes: `'zeros'` (an all-zero `one_hot` row) or
//! `'-1'` (`label_encode`); `'error'` is the default spelled out. A
//! duplicated or NULL vocabulary entry is a plan error.

mod affine;
mod elementwise;
mod encode;
mod vector;
mod vocabulary;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::logical_expr::ScalarUDF;

use crate::{FunctionInfo, check_arity};

/// The registered functions of this family.
pub fn functions() -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::from(affine::AffineFunc::new(affine::Affine::Standardize)),
        ScalarUDF::from(affine::AffineFunc::new(affine::Affine::MinMaxScale)),
        ScalarUDF::from(elementwise::ClipFunc::new()),
        ScalarUDF::from(elementwise::Log1pFunc::new()),
        ScalarUDF::from(encode::BucketizeFunc::new()),
        ScalarUDF::from(encode::OneHotFunc::new()),
        ScalarUDF::from(vocabulary::LabelEncodeFunc::new()),
        ScalarUDF::from(encode::HashBucketFunc::new()),
        ScalarUDF::from(vector::FeatureVectorFunc::new()),
    ]
}

/// Listings for `\functions`.
pub fn infos() -> Vec<FunctionInfo> {
    let info = crate::listing("numeric");
    vec![
        info(
            "standardize",
            "standardize(x, mean, std)",
            "(x - mean) / std",
            &[
                (
                    "x",
                    "a number (float32 stays float32, others become float64)",
                ),
                ("mean", "a number: the feature's mean"),
                ("std", "a number: the feature's standard deviation"),
            ][..],
            "SELECT standardize(3.0, 1.0, 2.0) AS z;",
            "+-----+\n| z   |\n+-----+\n| 1.0 |\n+-----+",
        ),
        info(
            "min_max_scale",
            "min_max_scale(x, min, max)",
            "(x - min) / (max - min)",
            &[
                ("x", "a number"),
                ("min", "the value that maps to 0"),
                ("max", "the value that maps to 1"),
            ],
            "SELECT min_max_scale(5.0, 0.0, 10.0) AS s;",
            "+-----+\n| s   |\n+-----+\n| 0.5 |\n+-----+",
        ),
        info(
            "clip",
            "clip(x, lo, hi)",
            "x limited to [lo, hi]; NaN stays NaN",
            &[
                ("x", "a number"),
                ("lo", "the lower bound"),
                ("hi", "the upper bound"),
            ],
            "SELECT clip(12.5, 0.0, 10.0) AS c;",
            "+------+\n| c    |\n+------+\n| 10.0 |\n+------+",
        ),
        info(
            "log1p",
            "log1p(x)",
            "ln(1 + x), accurate for small x",
            &[("x", "a number above -1")],
            "SELECT log1p(0.0) AS l;",
            "+-----+\n| l   |\n+-----+\n| 0.0 |\n+-----+",
        ),
        info(
            "bucketize",
            "bucketize(x, [b0, b1, ...])",
            "int32 count of sorted boundaries <= x (NaN: all of them)",
            &[
                ("x", "a number"),
                (
                    "[b0, b1, ...]",
                    "a constant list of boundaries in ascending order",
                ),
            ],
            "SELECT bucketize(2.5, [1.0, 2.0, 3.0]) AS b;",
            "+---+\n| b |\n+---+\n| 2 |\n+---+",
        ),
        info(
            "one_hot",
            "one_hot(i, n) | one_hot(value, ['a', 'b', ...] [, 'zeros'])",
            "fixed-size list of float32 with 1.0 at index i (n wide), or at the position \
             of the string value in the vocabulary (as wide as the vocabulary)",
            &[
                ("i", "an integer in [0, n); NULL gives a NULL row"),
                ("n", "a constant integer: the number of classes"),
                (
                    "value",
                    "a string or dictionary-encoded string column; NULL gives a NULL row, \
                     a value outside the vocabulary is an error naming it and its row",
                ),
                (
                    "['a', 'b', ...]",
                    "the vocabulary: a constant list of distinct strings, one per class",
                ),
                (
                    "'zeros'",
                    "optional: values outside the vocabulary give an all-zero row instead \
                     of an error ('error', the default, can be spelled out)",
                ),
            ],
            "SELECT one_hot(2, 4) AS v, one_hot('Gentoo', ['Adelie', 'Chinstrap', 'Gentoo']) AS s, one_hot('Emperor', ['Adelie', 'Chinstrap', 'Gentoo'], 'zeros') AS u;",
            "+----------------------+-----------------+-----------------+\n\
             | v                    | s               | u               |\n\
             +----------------------+-----------------+-----------------+\n\
             | [0.0, 0.0, 1.0, 0.0] | [0.0, 0.0, 1.0] | [0.0, 0.0, 0.0] |\n\
             +----------------------+-----------------+-----------------+",
        ),
        info(
            "label_encode",
            "label_encode(value, ['a', 'b', ...] [, '-1'])",
            "int64 position of the string value in the vocabulary (0-based)",
            &[
                (
                    "value",
                    "a string or dictionary-encoded string column; NULL gives NULL, a \
                     value outside the vocabulary is an error naming it and its row",
                ),
                (
                    "['a', 'b', ...]",
                    "the vocabulary: a constant list of distinct strings",
                ),
                (
                    "'-1'",
                    "optional: values outside the vocabulary give -1 instead of an error \
                     ('error', the default, can be spelled out)",
                ),
            ],
            "SELECT label_encode('Gentoo', ['Adelie', 'Chinstrap', 'Gentoo']) AS l, label_encode('Emperor', ['Adelie', 'Chinstrap', 'Gentoo'], '-1') AS u;",
            "+---+----+\n| l | u  |\n+---+----+\n| 2 | -1 |\n+---+----+",
        ),
        info(
            "hash_bucket",
            "hash_bucket(value, n [, seed])",
            "int64 xxh3_64(value bytes, seed) mod n; stable across runs and machines",
            &[
                ("value", "a string, binary or integer value"),
                ("n", "a constant integer: the number of buckets"),
                ("seed", "a constant integer (default 0)"),
            ],
            "SELECT hash_bucket('cat', 100) AS b;",
            "+----+\n| b  |\n+----+\n| 38 |\n+----+",
        ),
        info(
            "feature_vector",
            "feature_vector(x1, x2, ..., xn)",
            "fixed-size list of n float32 (one [n] tensor per row in a feed)",
            &[("x1, ..., xn", "numbers, one per element")],
            "SELECT feature_vector(1, 2.5, 3) AS v;",
            "+-----------------+\n| v               |\n+-----------------+\n| [1.0, 2.5, 3.0] |\n+-----------------+",
        ),
    ]
}

/// The float type a numeric argument is computed in: float32 stays float32,
/// every other number (and NULL) becomes float64.
fn float_type(
    function: &str,
    syntax: &str,
    position: usize,
    t: &DataType,
) -> Result<DataType> {
    match t {
        DataType::Float32 => Ok(DataType::Float32),
        DataType::Null => Ok(DataType::Float64),
        t if t.is_numeric() => Ok(DataType::Float64),
        other => plan_err!(
            "{function}: argument {} must be a number, got {other}; signature: {syntax}",
            position + 1
        ),
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use datafusion::arrow::array::{ArrayRef, DictionaryArray, StringArray};
    use datafusion::arrow::datatypes::Int8Type;
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::datasource::MemTable;
    use datafusion::error::Result;
    use datafusion::prelude::SessionContext;
    use std::sync::Arc;

    /// First column of `sql`'s result with every function registered.
    pub async fn query(sql: &str) -> Result<ArrayRef> {
        let ctx = SessionContext::new();
        crate::register_all(&ctx)?;
        let batches = ctx.sql(sql).await?.collect().await?;
        let batch =
            datafusion::arrow::compute::concat_batches(&batches[0].schema(), &batches)?;
        Ok(Arc::clone(batch.column(0)))
    }

    /// First column of `sql`'s result with every function registered and
    /// `batch` as table `t`.
    pub async fn query_table(sql: &str, batch: RecordBatch) -> Result<ArrayRef> {
        let ctx = SessionContext::new();
        crate::register_all(&ctx)?;
        let table = MemTable::try_new(batch.schema(), vec![vec![batch]])?;
        ctx.register_table("t", Arc::new(table))?;
        let batches = ctx.sql(sql).await?.collect().await?;
        let batch =
            datafusion::arrow::compute::concat_batches(&batches[0].schema(), &batches)?;
        Ok(Arc::clone(batch.column(0)))
    }

    /// The vocabulary of [`penguins`], as SQL.
    pub const PENGUINS: &str = "['Adelie', 'Chinstrap', 'Gentoo']";

    /// A batch with one dictionary-encoded column `species` (int8 keys) of
    /// the rows `keys` name in the dictionary `Gentoo, Emperor, Adelie,
    /// NULL, Chinstrap`: it holds a value outside [`PENGUINS`] ('Emperor',
    /// key 1) and a NULL value (key 3).
    pub fn penguins(keys: Vec<Option<i8>>) -> Result<RecordBatch> {
        let dictionary = DictionaryArray::<Int8Type>::try_new(
            keys.into(),
            Arc::new(StringArray::from(vec![
                Some("Gentoo"),
                Some("Emperor"),
                Some("Adelie"),
                None,
                Some("Chinstrap"),
            ])),
        )?;
        Ok(RecordBatch::try_from_iter(vec![(
            "species",
            Arc::new(dictionary) as ArrayRef,
        )])?)
    }

    /// The error text of `sql`, which must fail saying each of `needles`.
    pub async fn query_error(sql: &str, needles: &[&str]) -> String {
        let err = match query(sql).await {
            Ok(array) => panic!("{sql} returned {array:?}"),
            Err(e) => e.to_string(),
        };
        for needle in needles {
            assert!(
                err.contains(needle),
                "{sql}: the error does not say {needle:?}: {err}"
            );
        }
        err
    }
}
