//! The content hash of rows: what a `SHUFFLE` orders by (through each
//! epoch's key) and what `sqlfeed_row_key` returns in SQL.
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
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::error::Result;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The content hash of each row of `columns` under `seed`; see the
/// module docs.
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
