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
//! The key starts as `seed` and folds in each column in order:
//! `key = xxh3_64_with_seed(value_bytes, rotl(key, 23) ^ TAG)`, where TAG
//! tells a null (hashed as no bytes) from a value. The value bytes are the
//! little-endian value of numbers, dates and timestamps, the bytes of
//! strings and blobs, `0`/`1` for booleans, and the element bytes of
//! (fixed-size) lists of numbers without null elements; a struct without
//! nulls folds in its fields in order. Any other column (nested lists, lists
//! with null elements, structs with nulls) is encoded with arrow's
//! row format (`RowConverter`) and folded in the same way after the others.
//! Hashing the bytes where they lie runs at memory speed (the row format
//! encoded a 12,288-float image tensor element by element, 20× slower).
//! XXH3 is specified and platform-independent; the row format is stable for a
//! given arrow version, so a sample is reproducible for the same seed, data and
//! sqlfeed version.

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
    let rows = columns.first().map_or(0, |c| c.len());
    let mut keys = vec![seed; rows];
    let mut slow = Vec::new();
    for column in columns {
        if !hash_column_into(column.as_ref(), &mut keys) {
            slow.push(Arc::clone(column));
        }
    }
    if !slow.is_empty() {
        let fields = slow
            .iter()
            .map(|c| SortField::new(c.data_type().clone()))
            .collect();
        let converter = RowConverter::new(fields)?;
        let encoded = converter.convert_columns(&slow)?;
        for (key, row) in keys.iter_mut().zip(encoded.iter()) {
            *key = xxh3_64_with_seed(row.as_ref(), chain(*key, VALID));
        }
    }
    Ok(UInt64Array::from(keys))
}

/// Seed tags that keep a null apart from every value.
const VALID: u64 = 0x9e37_79b9_7f4a_7c15;
const NULL: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// The seed for the next column's bytes, from the key so far.
fn chain(key: u64, tag: u64) -> u64 {
    key.rotate_left(23) ^ tag
}

/// Feeds each row's value bytes of a string or binary column with offsets
/// of type `O` (`i32` or `i64`) to `fold`, `None` for nulls.
fn fold_offset_values<O: datafusion::arrow::array::OffsetSizeTrait>(
    column: &dyn datafusion::arrow::array::Array,
    data: &datafusion::arrow::array::ArrayData,
    fold: &mut impl FnMut(usize, Option<&[u8]>),
) {
    let offsets = data.buffers()[0].typed_data::<O>();
    let values = data.buffers()[1].as_slice();
    for row in 0..column.len() {
        let at = data.offset() + row;
        let bytes = column
            .is_valid(row)
            .then(|| &values[offsets[at].as_usize()..offsets[at + 1].as_usize()]);
        fold(row, bytes);
    }
}

/// Folds each row's bytes of `column` into `keys`; `false` when the type has
/// no byte view here (then the caller uses the row format).
fn hash_column_into(
    column: &dyn datafusion::arrow::array::Array,
    keys: &mut [u64],
) -> bool {
    use datafusion::arrow::array::AsArray;
    let data = column.to_data();
    let mut fold = |row: usize, bytes: Option<&[u8]>| {
        keys[row] = match bytes {
            Some(bytes) => xxh3_64_with_seed(bytes, chain(keys[row], VALID)),
            None => xxh3_64_with_seed(&[], chain(keys[row], NULL)),
        };
    };
    let data_type = column.data_type();
    match data_type {
        DataType::Utf8 | DataType::Binary => {
            fold_offset_values::<i32>(column, &data, &mut fold);
            true
        }
        DataType::LargeUtf8 | DataType::LargeBinary => {
            fold_offset_values::<i64>(column, &data, &mut fold);
            true
        }
        DataType::Utf8View => {
            let strings = column.as_string_view();
            for row in 0..column.len() {
                fold(
                    row,
                    column.is_valid(row).then(|| strings.value(row).as_bytes()),
                );
            }
            true
        }
        DataType::BinaryView => {
            let blobs = column.as_binary_view();
            for row in 0..column.len() {
                fold(row, column.is_valid(row).then(|| blobs.value(row)));
            }
            true
        }
        DataType::Boolean => {
            let booleans = column.as_boolean();
            for row in 0..column.len() {
                let byte = [booleans.value(row) as u8];
                fold(row, column.is_valid(row).then_some(&byte[..]));
            }
            true
        }
        t if t.is_primitive() => {
            let Some(width) = t.primitive_width() else {
                return false;
            };
            let values = data.buffers()[0].as_slice();
            for row in 0..column.len() {
                let at = (data.offset() + row) * width;
                fold(row, column.is_valid(row).then(|| &values[at..at + width]));
            }
            true
        }
        DataType::FixedSizeBinary(width) => {
            let width = *width as usize;
            let values = data.buffers()[0].as_slice();
            for row in 0..column.len() {
                let at = (data.offset() + row) * width;
                fold(row, column.is_valid(row).then(|| &values[at..at + width]));
            }
            true
        }
        DataType::FixedSizeList(field, size) => {
            // Element bytes straight from the child, when the child is a
            // primitive without nulls (a null element's bytes are undefined).
            let child = &data.child_data()[0];
            let Some(width) = field.data_type().primitive_width() else {
                return false;
            };
            if child.null_count() > 0 || !field.data_type().is_primitive() {
                return false;
            }
            let values = child.buffers()[0].as_slice();
            let row_bytes = *size as usize * width;
            for row in 0..column.len() {
                let at =
                    (child.offset() + (data.offset() + row) * *size as usize) * width;
                fold(
                    row,
                    column.is_valid(row).then(|| &values[at..at + row_bytes]),
                );
            }
            true
        }
        DataType::List(field) => {
            let child = &data.child_data()[0];
            let Some(width) = field.data_type().primitive_width() else {
                return false;
            };
            if child.null_count() > 0 || !field.data_type().is_primitive() {
                return false;
            }
            let offsets = data.buffers()[0].typed_data::<i32>();
            let values = child.buffers()[0].as_slice();
            for row in 0..column.len() {
                let at = data.offset() + row;
                let start = (child.offset() + offsets[at] as usize) * width;
                let end = (child.offset() + offsets[at + 1] as usize) * width;
                fold(row, column.is_valid(row).then(|| &values[start..end]));
            }
            true
        }
        DataType::Struct(_) if column.null_count() == 0 => {
            // The fields in order, on a copy so that a field without a byte
            // view leaves `keys` untouched for the row-format fallback.
            let mut folded = keys.to_vec();
            for field in column.as_struct().columns() {
                if !hash_column_into(field.as_ref(), &mut folded) {
                    return false;
                }
            }
            keys.copy_from_slice(&folded);
            true
        }
        _ => false,
    }
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
            description: "seeded xxh3 hash of the row's content (the shuffle's content key)",
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
