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

mod affine;
mod elementwise;
mod encode;
mod vector;

use datafusion::arrow::datatypes::DataType;
use datafusion::error::{DataFusionError, Result};
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
        ScalarUDF::from(encode::HashBucketFunc::new()),
        ScalarUDF::from(vector::FeatureVectorFunc::new()),
    ]
}

/// Listings for `\functions`.
pub fn infos() -> Vec<FunctionInfo> {
    let info = |name, syntax, description| FunctionInfo {
        name,
        family: "numeric",
        syntax,
        description,
    };
    vec![
        info(
            "standardize",
            "standardize(x, mean, std)",
            "(x - mean) / std",
        ),
        info(
            "min_max_scale",
            "min_max_scale(x, min, max)",
            "(x - min) / (max - min)",
        ),
        info(
            "clip",
            "clip(x, lo, hi)",
            "x limited to [lo, hi]; NaN stays NaN",
        ),
        info("log1p", "log1p(x)", "ln(1 + x), accurate for small x"),
        info(
            "bucketize",
            "bucketize(x, [b0, b1, ...])",
            "int32 count of sorted boundaries <= x (NaN: all of them)",
        ),
        info(
            "one_hot",
            "one_hot(i, n)",
            "fixed-size list of n float32 with 1.0 at index i",
        ),
        info(
            "hash_bucket",
            "hash_bucket(value, n [, seed])",
            "int64 xxh3_64(value bytes, seed) mod n; stable across runs and machines",
        ),
        info(
            "feature_vector",
            "feature_vector(x1, x2, ..., xn)",
            "fixed-size list of n float32 (one [n] tensor per row in a feed)",
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
        other => Err(DataFusionError::Plan(format!(
            "{function}: argument {} must be a number, got {other}; signature: {syntax}",
            position + 1
        ))),
    }
}

#[cfg(test)]
pub(crate) mod test_util {
    use datafusion::arrow::array::ArrayRef;
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

    /// The error text of `sql`.
    pub async fn query_error(sql: &str) -> String {
        match query(sql).await {
            Ok(array) => panic!("{sql} returned {array:?}"),
            Err(e) => e.to_string(),
        }
    }
}
