//! `clip(x, lo, hi)` and `log1p(x)`.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Float32Type, Float64Type,
};
use datafusion::common::{exec_err, internal_err};
use datafusion::error::Result;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl};

const CLIP: &str = "clip(x, lo, hi)";
const LOG1P: &str = "log1p(x)";

crate::coercing_function! {
    /// `clip(x, lo, hi)`: `x` limited to `[lo, hi]`; NaN stays NaN, ±inf is
    /// clipped, `lo > hi` in a row is an error naming the row.
    pub struct ClipFunc;
}

fn clip_typed<T: ArrowPrimitiveType>(
    x: &ArrayRef,
    lo: &ArrayRef,
    hi: &ArrayRef,
) -> Result<ArrayRef>
where
    T::Native: PartialOrd,
{
    let (x, lo, hi) = (
        x.as_primitive::<T>(),
        lo.as_primitive::<T>(),
        hi.as_primitive::<T>(),
    );
    let mut out = Vec::with_capacity(x.len());
    for row in 0..x.len() {
        if x.is_null(row) || lo.is_null(row) || hi.is_null(row) {
            out.push(None);
            continue;
        }
        let (v, low, high) = (x.value(row), lo.value(row), hi.value(row));
        if matches!(
            low.partial_cmp(&high),
            None | Some(std::cmp::Ordering::Greater)
        ) {
            return exec_err!(
                "clip: lo ({low:?}) must be <= hi ({high:?}), not so in row {row}"
            );
        }
        // NaN compares false with everything and so falls through unchanged.
        out.push(Some(if v < low {
            low
        } else if v > high {
            high
        } else {
            v
        }));
    }
    Ok(Arc::new(PrimitiveArray::<T>::from_iter(out)))
}

impl ScalarUDFImpl for ClipFunc {
    crate::function_basics!("clip");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::check_arity("clip", CLIP, arg_types.len(), &[3])?;
        let mut target = DataType::Float32;
        for (position, t) in arg_types.iter().enumerate() {
            if super::float_type("clip", CLIP, position, t)? == DataType::Float64 {
                target = DataType::Float64;
            }
        }
        Ok(vec![target; 3])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(arg_types.first().cloned().unwrap_or(DataType::Float64))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [x, lo, hi] = arrays.as_slice() else {
            return internal_err!("clip takes 3 arguments");
        };
        let out = match x.data_type() {
            DataType::Float32 => clip_typed::<Float32Type>(x, lo, hi)?,
            DataType::Float64 => clip_typed::<Float64Type>(x, lo, hi)?,
            other => {
                return internal_err!("clip on {other}");
            }
        };
        Ok(ColumnarValue::Array(out))
    }
}

crate::coercing_function! {
    /// `log1p(x)`: `ln(1 + x)` computed without the rounding of `1 + x`.
    pub struct Log1pFunc;
}

impl ScalarUDFImpl for Log1pFunc {
    crate::function_basics!("log1p");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::check_arity("log1p", LOG1P, arg_types.len(), &[1])?;
        Ok(vec![super::float_type("log1p", LOG1P, 0, &arg_types[0])?])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(arg_types.first().cloned().unwrap_or(DataType::Float64))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [x] = arrays.as_slice() else {
            return internal_err!("log1p takes 1 argument");
        };
        let out: ArrayRef = match x.data_type() {
            DataType::Float32 => Arc::new(
                x.as_primitive::<Float32Type>()
                    .unary::<_, Float32Type>(f32::ln_1p),
            ),
            DataType::Float64 => Arc::new(
                x.as_primitive::<Float64Type>()
                    .unary::<_, Float64Type>(f64::ln_1p),
            ),
            other => return internal_err!("log1p on {other}"),
        };
        Ok(ColumnarValue::Array(out))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray, Float32Array};
    use datafusion::arrow::datatypes::Float64Type;
    use datafusion::error::Result;

    use crate::numeric::test_util::{query, query_error};

    #[tokio::test]
    async fn clip_limits_keeps_nan_and_propagates_nulls() -> Result<()> {
        let out = query(
            "SELECT clip(x, -1, 2) FROM (VALUES (-5.0), (0.5), (9.0), ('NaN'::double), \
             ('inf'::double), (NULL)) AS t(x)",
        )
        .await?;
        let out = out.as_primitive::<Float64Type>();
        assert_eq!(&out.values()[..3], &[-1.0, 0.5, 2.0]);
        assert!(out.value(3).is_nan());
        assert_eq!(out.value(4), 2.0);
        assert!(out.is_null(5));
        Ok(())
    }

    #[tokio::test]
    async fn clip_keeps_float32() -> Result<()> {
        let out = query("SELECT clip(arrow_cast(3.5, 'Float32'), arrow_cast(0, 'Float32'), arrow_cast(1, 'Float32'))").await?;
        let out = out
            .as_any()
            .downcast_ref::<Float32Array>()
            .expect("float32");
        assert_eq!(out.value(0), 1.0);
        Ok(())
    }

    #[tokio::test]
    async fn clip_with_inverted_bounds_names_the_row() {
        query_error(
            "SELECT clip(x, 2, 1) FROM (VALUES (1.0)) AS t(x)",
            &["lo (2.0) must be <= hi (1.0), not so in row 0"],
        )
        .await;
    }

    #[tokio::test]
    async fn log1p_is_exact_near_zero_and_ieee_below_minus_one() -> Result<()> {
        let out = query(
            "SELECT log1p(x) FROM (VALUES (1e-10), (0.0), (-1.0), (-2.0), (NULL)) AS t(x)",
        )
        .await?;
        let out = out.as_primitive::<Float64Type>();
        assert_eq!(out.value(0), 1e-10_f64.ln_1p());
        assert!((out.value(0) - 1e-10).abs() < 1e-20);
        assert_eq!(out.value(1), 0.0);
        assert_eq!(out.value(2), f64::NEG_INFINITY);
        assert!(out.value(3).is_nan());
        assert!(out.is_null(4));
        Ok(())
    }

    #[tokio::test]
    async fn wrong_argument_types_name_the_signature() {
        query_error("SELECT log1p('a')", &["log1p(x)"]).await;
        query_error("SELECT clip(1.0, 2.0)", &["clip(x, lo, hi)"]).await;
    }
}
