//! `feature_vector(x1, …, xn)`: n numeric columns stacked into one
//! fixed-size float32 vector per row, the layout a feed turns into a
//! `[batch, n]` tensor without copying row by row.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, FixedSizeListArray, Float32Array};
use datafusion::arrow::buffer::{BooleanBuffer, NullBuffer};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float32Type};
use datafusion::common::{plan_datafusion_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl,
};

const FEATURE_VECTOR: &str = "feature_vector(x1, x2, ..., xn)";
/// Widest vector accepted (a plan with more arguments is a mistake).
const MAX_WIDTH: usize = 1 << 16;

crate::coercing_function! {
    /// See the module docs. A NULL argument value becomes a NULL element (the
    /// feed then names the row, or fills it when told to).
    pub struct FeatureVectorFunc;
}

fn vector_type(width: usize, nullable: bool) -> Result<DataType> {
    let width = i32::try_from(width).map_err(|_| {
        plan_datafusion_err!("feature_vector: {width} arguments are too many")
    })?;
    Ok(DataType::FixedSizeList(
        Arc::new(Field::new("item", DataType::Float32, nullable)),
        width,
    ))
}

impl ScalarUDFImpl for FeatureVectorFunc {
    crate::function_basics!("feature_vector");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        if arg_types.is_empty() || arg_types.len() > MAX_WIDTH {
            return plan_err!(
                "feature_vector takes 1 to {MAX_WIDTH} numbers, got {}; signature: \
                 {FEATURE_VECTOR}",
                arg_types.len()
            );
        }
        for (position, t) in arg_types.iter().enumerate() {
            if !(t.is_numeric() || *t == DataType::Null) {
                return plan_err!(
                    "feature_vector: argument {} must be a number, got {t}; signature: \
                     {FEATURE_VECTOR}",
                    position + 1
                );
            }
        }
        Ok(vec![DataType::Float32; arg_types.len()])
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        vector_type(arg_types.len(), true)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let nullable = args.arg_fields.iter().any(|f| f.is_nullable());
        Ok(Arc::new(Field::new(
            "feature_vector",
            vector_type(args.arg_fields.len(), nullable)?,
            false,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let width = args.args.len();
        let nullable = args.arg_fields.iter().any(|f| f.is_nullable());
        let mut values = vec![0f32; rows * width];
        let mut valid = nullable.then(|| vec![true; rows * width]);
        for (column, arg) in args.args.iter().enumerate() {
            let array = arg.to_array(rows)?;
            let array = array.as_primitive::<Float32Type>();
            // A strided scatter: each row's vector is 4·width contiguous
            // bytes, so a batch's output stays in cache while it is filled.
            for (row, value) in array.values().iter().enumerate() {
                values[row * width + column] = *value;
            }
            if let (Some(valid), Some(nulls)) = (valid.as_mut(), array.nulls()) {
                for row in nulls
                    .iter()
                    .enumerate()
                    .filter(|(_, ok)| !ok)
                    .map(|(r, _)| r)
                {
                    valid[row * width + column] = false;
                }
            }
        }
        let nulls = valid
            .map(|v| NullBuffer::new(BooleanBuffer::from(v)))
            .filter(|n| n.null_count() > 0);
        let list = FixedSizeListArray::try_new(
            Arc::new(Field::new("item", DataType::Float32, nullable)),
            width as i32,
            Arc::new(Float32Array::new(values.into(), nulls)),
            None,
        )?;
        Ok(ColumnarValue::Array(Arc::new(list)))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::Float32Type;
    use datafusion::error::Result;

    use crate::numeric::test_util::{query, query_error};

    #[tokio::test]
    async fn stacks_columns_row_by_row() -> Result<()> {
        let array = query(
            "SELECT feature_vector(a, b, 2) FROM (VALUES (1, 0.5), (3, CAST(NULL AS DOUBLE))) t(a, b)",
        )
        .await?;
        let list = array.as_fixed_size_list();
        assert_eq!(list.value_length(), 3);
        let values = list.values().as_primitive::<Float32Type>();
        assert_eq!(&values.values()[..], &[1.0, 0.5, 2.0, 3.0, 0.0, 2.0]);
        assert!(values.is_null(4) && values.null_count() == 1);
        Ok(())
    }

    #[tokio::test]
    async fn arity_and_types_are_plan_errors() {
        query_error("SELECT feature_vector()", &["feature_vector takes 1 to"]).await;
        query_error(
            "SELECT feature_vector(1, 'a')",
            &["argument 2 must be a number"],
        )
        .await;
    }
}
