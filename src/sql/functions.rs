//! sqlfeed's own SQL functions, used by its statements and open to users:
//!
//! * `byte_length(binary)` → uint64: the size of a blob (DataFusion's
//!   `octet_length` takes strings only), e.g. image sizes in `SUMMARIZE`.
//! * `sqlfeed_row_key(seed, col, ...)` → uint64: a seeded hash of a row's
//!   content, described below.
//!
//! # `sqlfeed_row_key`
//!
//! `SAMPLE` orders rows by this key and keeps the smallest `n` (a bottom-k
//! sample), which is a uniform sample without replacement that is independent
//! of file order, partitioning and batch sizes: the key depends only on the
//! row's values and the seed.
//!
//! # Definition
//! The columns are encoded with arrow's row format (`RowConverter`, ascending,
//! nulls first), which gives one canonical byte string per row for every data
//! type, nested ones included. The key is `xxh3_64_with_seed(row_bytes, seed)`.
//! XXH3 is specified and platform-independent; the row format is stable for a
//! given arrow version, so a sample is reproducible for the same seed, data and
//! sqlfeed version. Identical rows share a key, which is harmless for sampling:
//! whichever copy is taken, the output is the same.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, UInt64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::compute::kernels::length::length;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};
use xxhash_rust::xxh3::xxh3_64_with_seed;

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

/// The key of each row of `columns` under `seed`; see the module docs.
pub fn row_key_hash(columns: &[ArrayRef], seed: u64) -> Result<UInt64Array> {
    let fields = columns
        .iter()
        .map(|c| SortField::new(c.data_type().clone()))
        .collect();
    let converter = RowConverter::new(fields)?;
    let rows = converter.convert_columns(columns)?;
    Ok(rows
        .iter()
        .map(|row| Some(xxh3_64_with_seed(row.as_ref(), seed)))
        .collect())
}

impl ScalarUDFImpl for RowKeyFunc {
    fn name(&self) -> &str {
        "sqlfeed_row_key"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        if arg_types.len() < 2 {
            return Err(DataFusionError::Plan(
                "sqlfeed_row_key(seed, column, ...) needs a seed and at least one column"
                    .into(),
            ));
        }
        Ok(DataType::UInt64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (seed, columns) = args.args.split_first().ok_or_else(|| {
            DataFusionError::Internal("sqlfeed_row_key called without arguments".into())
        })?;
        let seed = match seed {
            ColumnarValue::Scalar(ScalarValue::Int64(Some(s))) => *s as u64,
            ColumnarValue::Scalar(ScalarValue::UInt64(Some(s))) => *s,
            other => {
                return Err(DataFusionError::Plan(format!(
                    "sqlfeed_row_key: the seed must be a non-null integer literal, got {other:?}"
                )));
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
        },
        sqlfeed_udfs::FunctionInfo {
            name: "sqlfeed_row_key",
            family: "sqlfeed",
            syntax: "sqlfeed_row_key(seed, col, ...)",
            description: "seeded xxh3 hash of the row's content (SAMPLE orders by it)",
        },
    ]
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
    fn name(&self) -> &str {
        "byte_length"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [DataType::Binary | DataType::LargeBinary | DataType::BinaryView]
            | [DataType::FixedSizeBinary(_)]
            | [DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View]
            | [DataType::Null] => Ok(DataType::UInt64),
            other => Err(DataFusionError::Plan(format!(
                "byte_length(value) takes a binary or string value, got {other:?}"
            ))),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [value] = args.args.as_slice() else {
            return Err(DataFusionError::Internal(
                "byte_length takes one argument".into(),
            ));
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
}
