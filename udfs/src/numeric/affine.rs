//! `standardize(x, mean, std)` and `min_max_scale(x, min, max)`.
//!
//! Float32 and float64 inputs keep their type; integers are computed as
//! float64. The parameters may be literals or columns (so that constants
//! fitted in the same query, `WITH s AS (SELECT avg(x) m, stddev(x) sd …)`,
//! can be passed in). Nulls propagate. Division follows IEEE 754: a zero
//! scale gives ±inf (or NaN for 0/0) rather than an error, exactly as the
//! same arithmetic in SQL or NumPy would, so that one degenerate column does
//! not abort a pipeline; NaN and ±inf inputs pass through the arithmetic.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Datum, Scalar};
use datafusion::arrow::compute::kernels::numeric::{div, sub};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

/// Which affine transform a [`AffineFunc`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Affine {
    /// `(x - mean) / std`
    Standardize,
    /// `(x - min) / (max - min)`
    MinMaxScale,
}

/// `standardize(x, mean, std)` and `min_max_scale(x, min, max)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct AffineFunc {
    kind: Affine,
    signature: Signature,
}

impl AffineFunc {
    pub(super) fn new(kind: Affine) -> Self {
        Self {
            kind,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }

    fn syntax(&self) -> &'static str {
        match self.kind {
            Affine::Standardize => "standardize(x, mean, std)",
            Affine::MinMaxScale => "min_max_scale(x, min, max)",
        }
    }
}

impl ScalarUDFImpl for AffineFunc {
    crate::function_basics!();

    fn name(&self) -> &str {
        match self.kind {
            Affine::Standardize => "standardize",
            Affine::MinMaxScale => "min_max_scale",
        }
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::check_arity(self.name(), self.syntax(), arg_types.len(), &[3])?;
        let target = super::float_type(self.name(), self.syntax(), 0, &arg_types[0])?;
        for (position, t) in arg_types.iter().enumerate().skip(1) {
            super::float_type(self.name(), self.syntax(), position, t)?;
        }
        Ok(vec![target; 3])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(arg_types.first().cloned().unwrap_or(DataType::Float64))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [x, a, b] = args.args.as_slice() else {
            return internal_err!(
                "{} called with {} arguments after coercion",
                self.name(),
                args.args.len()
            );
        };
        let all_scalar = [x, a, b]
            .iter()
            .all(|v| matches!(v, ColumnarValue::Scalar(_)));
        let (x, a, b) = (datum(x)?, datum(a)?, datum(b)?);
        let result: ArrayRef = match self.kind {
            Affine::Standardize => div(&sub(x.as_ref(), a.as_ref())?, b.as_ref())?,
            Affine::MinMaxScale => {
                // Keep `max - min` a scalar when both are, so it broadcasts.
                let range = sub(b.as_ref(), a.as_ref())?;
                let range: Arc<dyn Datum> = if a.get().1 && b.get().1 {
                    Arc::new(Scalar::new(range))
                } else {
                    Arc::new(range)
                };
                div(&sub(x.as_ref(), a.as_ref())?, range.as_ref())?
            }
        };
        if all_scalar {
            Ok(ColumnarValue::Scalar(
                datafusion::common::ScalarValue::try_from_array(&result, 0)?,
            ))
        } else {
            Ok(ColumnarValue::Array(result))
        }
    }
}

/// A columnar value as an arrow [`Datum`] (scalars stay scalars, no expansion).
fn datum(value: &ColumnarValue) -> Result<Arc<dyn Datum>> {
    Ok(match value {
        ColumnarValue::Array(array) => Arc::new(Arc::clone(array)),
        ColumnarValue::Scalar(scalar) => Arc::new(scalar.to_scalar()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, Float32Array, Float64Array};

    use crate::numeric::test_util::query;

    #[tokio::test]
    async fn standardize_keeps_float32_and_propagates_nulls() -> Result<()> {
        let out = query(
            "SELECT standardize(x, 1.0, 2.0) FROM \
             (VALUES (arrow_cast(3.0, 'Float32')), (arrow_cast(NULL, 'Float32')), \
             (arrow_cast(-1.0, 'Float32'))) AS t(x)",
        )
        .await?;
        let out = out
            .as_any()
            .downcast_ref::<Float32Array>()
            .expect("float32 out");
        assert_eq!(out.value(0), 1.0);
        assert!(out.is_null(1));
        assert_eq!(out.value(2), -1.0);
        Ok(())
    }

    #[tokio::test]
    async fn min_max_scale_of_integers_is_float64() -> Result<()> {
        let out = query("SELECT min_max_scale(x, 0, 10) FROM (VALUES (5), (10)) AS t(x)")
            .await?;
        let out = out
            .as_any()
            .downcast_ref::<Float64Array>()
            .expect("float64 out");
        assert_eq!(out.values().as_ref(), &[0.5, 1.0]);
        Ok(())
    }

    /// The documented pattern: fit the constants and apply them in one query.
    #[tokio::test]
    async fn constants_fitted_in_the_same_query() -> Result<()> {
        let out = query(
            "WITH t AS (SELECT * FROM (VALUES (1.0), (2.0), (3.0), (4.0)) AS v(x)), \
             s AS (SELECT avg(x) AS m, stddev(x) AS sd FROM t) \
             SELECT standardize(x, s.m, s.sd) AS z FROM t, s ORDER BY x",
        )
        .await?;
        let z = out
            .as_any()
            .downcast_ref::<Float64Array>()
            .expect("float64 out");
        let sd = (5.0f64 / 3.0).sqrt();
        let expected: Vec<f64> = [1.0, 2.0, 3.0, 4.0]
            .iter()
            .map(|x| (x - 2.5) / sd)
            .collect();
        for (got, want) in z.values().iter().zip(expected) {
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        }
        Ok(())
    }

    #[tokio::test]
    async fn zero_scale_follows_ieee() -> Result<()> {
        let out =
            query("SELECT standardize(x, 0.0, 0.0) FROM (VALUES (1.0), (0.0)) AS t(x)")
                .await?;
        let out = out
            .as_any()
            .downcast_ref::<Float64Array>()
            .expect("float64 out");
        assert!(out.value(0).is_infinite());
        assert!(out.value(1).is_nan());
        Ok(())
    }

    #[tokio::test]
    async fn wrong_types_and_arity_are_plan_errors() {
        for sql in ["SELECT standardize('a', 1, 2)", "SELECT standardize(1, 2)"] {
            let err = query(sql).await.expect_err(sql).to_string();
            assert!(err.contains("standardize(x, mean, std)"), "{sql}: {err}");
        }
    }
}
