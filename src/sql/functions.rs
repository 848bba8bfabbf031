//! sqlfeed's own SQL functions, used by its statements and open to users:
//!
//! * `byte_length(binary)` → uint64: the size of a blob (DataFusion's
//!   `octet_length` takes strings only), e.g. image sizes in `SUMMARIZE`.
//! * `sqlfeed_row_key(seed, col, ...)` → uint64: a seeded hash of a row's
//!   content, described below.
//!
//! # `sqlfeed_row_key`
//!
//! With seed 0, the content hash of the `SHUFFLE` order (and so of
//! `SAMPLE`, a prefix of a shuffle), which derives each epoch's key from it
//! (see `crate::shuffle`): it depends only on the row's values and the
//! seed, so it is independent of file order, partitioning and batch sizes. Identical rows
//! share it; the shuffle gives each copy its own key on top of it (see
//! `crate::shuffle`), so `ORDER BY sqlfeed_row_key(…)` is not a uniform
//! order of a table with repeated rows.
//!
//! # Definition
//! See [`crate::shuffle::row_key_hash`] (`shuffle/content_hash.rs`): the
//! content hash is the shuffle's, this function exposes it to SQL.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, UInt64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::compute::kernels::length::length;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::plan_err;

use crate::shuffle::row_key_hash;
use datafusion::common::ScalarValue;
use datafusion::common::{internal_datafusion_err, internal_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};

/// The `sqlfeed_row_key` scalar function; see the module docs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RowKeyFunc {
    signature: Signature,
}

impl Default for RowKeyFunc {
    fn default() -> Self {
        Self::new()
    }
}

impl RowKeyFunc {
    /// The function, ready to register.
    pub fn new() -> Self {
        Self {
            signature: Signature::variadic_any(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for RowKeyFunc {
    function_basics!("sqlfeed_row_key");

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        if arg_types.len() < 2 {
            return plan_err!(
                "sqlfeed_row_key(seed, column, ...) needs a seed and at least one column"
            );
        }
        Ok(DataType::UInt64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (seed, columns) = args.args.split_first().ok_or_else(|| {
            internal_datafusion_err!("sqlfeed_row_key called without arguments")
        })?;
        let seed = match seed {
            ColumnarValue::Scalar(ScalarValue::Int64(Some(s))) => *s as u64,
            ColumnarValue::Scalar(ScalarValue::UInt64(Some(s))) => *s,
            other => {
                return plan_err!(
                    "sqlfeed_row_key: the seed must be a non-null integer literal, got {other:?}"
                );
            }
        };
        let arrays = columns
            .iter()
            .map(|c| c.to_array(args.number_rows))
            .collect::<Result<Vec<_>>>()?;
        Ok(ColumnarValue::Array(Arc::new(row_key_hash(&arrays, seed)?)))
    }
}

/// Listings of these functions for `\functions`.
pub fn infos() -> Vec<sqlfeed_udfs::FunctionInfo> {
    vec![
        sqlfeed_udfs::FunctionInfo {
            name: "byte_length",
            family: "sqlfeed",
            syntax: "byte_length(value)",
            description: "bytes of a binary or string value (image sizes)",
            arguments: &[("value", "a binary or string value; NULL stays NULL")],
            example: "SELECT byte_length('héllo') AS n;",
            example_output: "+---+\n| n |\n+---+\n| 6 |\n+---+",
        },
        sqlfeed_udfs::FunctionInfo {
            name: "sqlfeed_row_key",
            family: "sqlfeed",
            syntax: "sqlfeed_row_key(seed, col, ...)",
            description: "seeded xxh3 hash of the row's content (the shuffle's content key)",
            arguments: &[
                ("seed", "a constant integer"),
                ("col, ...", "the columns whose values make the key"),
            ],
            example: "SELECT sqlfeed_row_key(42, 'a', 1) AS k;",
            example_output: "+---------------------+\n| k                   |\n+---------------------+\n| 1689358609805866897 |\n+---------------------+",
        },
    ]
}

/// The `ScalarUDFImpl` methods sqlfeed's own functions write alike: `name`,
/// `documentation` (looked up by that name) and `signature` (the field
/// `signature`), as `sqlfeed_udfs` does for its functions.
macro_rules! function_basics {
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
        }

        fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
            documentation_of(self.name())
        }

        fn signature(&self) -> &Signature {
            &self.signature
        }
    };
}
use function_basics;

/// The documentation of sqlfeed's own function `name`.
fn documentation_of(
    name: &str,
) -> Option<&'static datafusion::logical_expr::Documentation> {
    static DOCS: std::sync::LazyLock<sqlfeed_udfs::Documentations> =
        std::sync::LazyLock::new(|| sqlfeed_udfs::documentations(infos()));
    DOCS.get(name)
}

/// `byte_length(binary)`: bytes of each value; NULL stays NULL.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ByteLengthFunc {
    signature: Signature,
}

impl Default for ByteLengthFunc {
    fn default() -> Self {
        Self::new()
    }
}

impl ByteLengthFunc {
    /// The function, ready to register.
    pub fn new() -> Self {
        Self {
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for ByteLengthFunc {
    function_basics!("byte_length");

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [DataType::Binary | DataType::LargeBinary | DataType::BinaryView]
            | [DataType::FixedSizeBinary(_)]
            | [DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View]
            | [DataType::Null] => Ok(DataType::UInt64),
            other => plan_err!(
                "byte_length(value) takes a binary or string value, got {other:?}"
            ),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [value] = args.args.as_slice() else {
            return internal_err!("byte_length takes one argument");
        };
        let array = value.to_array(args.number_rows)?;
        // arrow's `length` counts bytes for strings and binaries (Int32 or
        // Int64 by offset width); NULL-typed input stays NULL.
        let lengths: ArrayRef = match array.data_type() {
            DataType::Null => Arc::new(UInt64Array::new_null(array.len())),
            _ => cast(&length(&array)?, &DataType::UInt64)?,
        };
        Ok(ColumnarValue::Array(lengths))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, StringArray};

    #[test]
    fn key_depends_on_content_and_seed_only() -> Result<()> {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(3)]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["x", "y", "z"]));
        let keys = row_key_hash(&[Arc::clone(&a), Arc::clone(&b)], 42)?;
        // The same rows in another batch (sliced) give the same keys.
        let sliced = row_key_hash(&[a.slice(1, 2), b.slice(1, 2)], 42)?;
        assert_eq!(keys.value(1), sliced.value(0));
        assert_eq!(keys.value(2), sliced.value(1));
        let other_seed = row_key_hash(&[a, b], 43)?;
        assert_ne!(keys.value(0), other_seed.value(0));
        assert_ne!(keys.value(0), keys.value(2));
        Ok(())
    }

    #[test]
    fn row_keys_ignore_slicing_and_tell_nulls_from_values() -> Result<()> {
        use datafusion::arrow::array::{
            Array, FixedSizeListArray, Float32Array, Int64Array, ListArray, StringArray,
            StructArray,
        };
        use datafusion::arrow::datatypes::{Field, Float32Type, Int32Type};
        let strings: ArrayRef = Arc::new(StringArray::from(vec![
            Some("a"),
            Some(""),
            None,
            Some("bc"),
            Some(""),
        ]));
        let numbers: ArrayRef = Arc::new(Int64Array::from(vec![
            Some(1),
            Some(2),
            Some(3),
            None,
            Some(2),
        ]));
        let tensors: ArrayRef =
            Arc::new(
                FixedSizeListArray::from_iter_primitive::<Float32Type, _, _>(
                    (0..5).map(|i| Some(vec![Some(i as f32), Some(0.5)])),
                    2,
                ),
            );
        let lists: ArrayRef =
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
                Some(vec![Some(1)]),
                Some(vec![]),
                None,
                Some(vec![Some(2), Some(3)]),
                Some(vec![]),
            ]));
        let nested: ArrayRef = Arc::new(StructArray::from(vec![(
            Arc::new(Field::new("f", DataType::Float32, true)),
            Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0, 4.0, 2.0])) as ArrayRef,
        )]));
        let columns = vec![strings, numbers, tensors, lists, nested];
        let keys = row_key_hash(&columns, 7)?;
        // A slice hashes exactly like the rows it shows.
        let sliced: Vec<ArrayRef> = columns.iter().map(|c| c.slice(1, 4)).collect();
        let sliced_keys = row_key_hash(&sliced, 7)?;
        assert_eq!(sliced_keys.values(), &keys.values()[1..]);
        // All keys differ (row 4 repeats row 1 except the tensor).
        let mut distinct = keys.values().to_vec();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 5);
        // NULL and '' differ; equal content gives equal keys.
        let null_or_empty: ArrayRef =
            Arc::new(StringArray::from(vec![None, Some(""), Some("")]));
        let keys = row_key_hash(&[null_or_empty], 1)?;
        assert_ne!(keys.value(0), keys.value(1));
        assert_eq!(keys.value(1), keys.value(2));
        // Lists with null elements take the row-format path, deterministically.
        let with_null: ArrayRef =
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
                Some(vec![Some(1), None]),
                Some(vec![Some(1), None]),
            ]));
        let keys = row_key_hash(&[with_null], 1)?;
        assert_eq!(keys.value(0), keys.value(1));
        Ok(())
    }
}
