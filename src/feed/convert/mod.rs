//! Writes the rows of one batch (slices of record batches) straight into a
//! slot's tensor buffers: one pass per column, converting element types,
//! applying `x * scale + offset`, padding and masks as it goes, with no
//! intermediate Arrow arrays. Timestamps, dates and durations are their
//! counts, rescaled to the column's `unit` on the way (see `columns`).

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, PrimitiveArray, RecordBatch, StructArray,
};
use datafusion::arrow::datatypes::{
    ArrowNativeType, DataType, Date32Type, Date64Type, DurationMicrosecondType,
    DurationMillisecondType, DurationNanosecondType, DurationSecondType, Float16Type,
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::common::{exec_datafusion_err, internal_datafusion_err};
use datafusion::common::{exec_err, internal_err};
use datafusion::error::{DataFusionError, Result};

use super::columns::{Padding, Source, TensorColumn};

mod number;
pub(crate) mod packed;
mod temporal;
use crate::device::TensorLayout;
use crate::device::{DType, Slot, SlotPool, cast_slice_mut, u8_to_f32_affine};
use number::{write_native, write_repeated};

/// The rows of one output batch: consecutive slices of record batches.
#[derive(Debug)]
pub(crate) struct BatchRows {
    /// Slices, in order; their row counts add up to `rows`.
    pub(crate) pieces: Vec<RecordBatch>,
    /// Total rows.
    pub(crate) rows: usize,
    /// The epoch (for messages).
    pub(crate) epoch: u64,
    /// The step (for messages).
    pub(crate) step: u64,
    /// Rows of the epoch's order consumed by all ranks together once this
    /// step is (what a checkpoint after it records).
    pub(crate) rows_after: u64,
    /// How the rows make packed sequences (a packing feed).
    pub(crate) packed: Option<packed::Packed>,
}

impl BatchRows {
    /// Bytes of input these rows keep alive (a slice keeps its whole
    /// record batch).
    pub(crate) fn held_bytes(&self) -> usize {
        memory_of(&self.pieces)
    }
}

/// The memory `batches` hold (what the feed's budget counts of the record
/// batches a batcher keeps between calls).
pub(crate) fn memory_of<'a>(batches: impl IntoIterator<Item = &'a RecordBatch>) -> usize {
    batches
        .into_iter()
        .map(RecordBatch::get_array_memory_size)
        .sum()
}

/// Padding statistics of one batch.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PadStats {
    /// Elements of padded tensors that are padding.
    pub(crate) padding: u64,
    /// All elements of padded tensors.
    pub(crate) total: u64,
}

/// Lays out, writes and returns the padding statistics of one batch.
pub(crate) fn fill_slot(
    columns: &[TensorColumn],
    rows: &BatchRows,
    pool: &mut SlotPool,
    slot: &mut Slot,
) -> Result<PadStats> {
    let mut layouts = Vec::with_capacity(columns.len() + 1);
    let mut widths = Vec::with_capacity(columns.len());
    for column in columns {
        let (sample, width) = sample_shape(column, rows)?;
        let mut shape = Vec::with_capacity(sample.len() + 1);
        shape.push(rows.rows);
        shape.extend_from_slice(&sample);
        layouts.push(TensorLayout {
            name: std::sync::Arc::clone(&column.name),
            dtype: column.dtype,
            shape: shape.clone(),
        });
        if let Some(mask) = &column.mask_name {
            layouts.push(TensorLayout {
                name: std::sync::Arc::clone(mask),
                dtype: DType::Bool,
                shape,
            });
        }
        widths.push(width);
    }
    pool.prepare(slot, layouts)?;
    let mut stats = PadStats::default();
    let mut tensor = 0;
    for (column, width) in columns.iter().zip(widths) {
        let writer = ColumnWriter {
            column,
            rows,
            width,
        };
        if column.mask_name.is_some() {
            let (values, mask) = slot.host_pair_mut(tensor)?;
            let padded = writer.write_padded(values, mask)?;
            stats.padding += padded;
            stats.total += (rows.rows * width) as u64;
            tensor += 2;
        } else {
            writer.write(slot.host_mut(tensor)?)?;
            tensor += 1;
        }
    }
    Ok(stats)
}

/// The per-sample shape of `column` in this batch, and the number of
/// values per row.
fn sample_shape(column: &TensorColumn, rows: &BatchRows) -> Result<(Vec<usize>, usize)> {
    match (&column.source, column.padding) {
        (_, Padding::BatchMax) => {
            let mut longest = 0;
            for piece in &rows.pieces {
                let array = piece.column(column.index);
                for row in 0..array.len() {
                    longest = longest.max(value_len(array, row));
                }
            }
            Ok((vec![longest], longest))
        }
        (_, Padding::To(len)) => Ok((vec![len], len)),
        (Source::Image | Source::ImageTensor, _) => {
            let mut found: Option<[usize; 3]> = None;
            let mut row_in_batch = 0;
            for piece in &rows.pieces {
                let image = piece.column(column.index).as_struct();
                let shapes = image_dims(column, image)?;
                for (row, &dims) in shapes.iter().enumerate() {
                    if image.is_valid(row) {
                        match found {
                            None => found = Some(dims),
                            Some(first) if first != dims => {
                                return exec_err!(
                                    "column '{}', row {row_in_batch} of the batch (epoch {}, \
                                     step {}): image shape {dims:?} differs from {first:?} \
                                     earlier in the batch; resize or crop in SQL \
                                     (image_resize, image_center_crop) so that every \
                                     image has the same shape",
                                    column.name,
                                    rows.epoch,
                                    rows.step
                                );
                            }
                            Some(_) => {}
                        }
                    }
                    row_in_batch += 1;
                }
            }
            let dims = found.map(|d| d.to_vec()).unwrap_or_else(|| vec![0, 0, 0]);
            let elements = dims.iter().product();
            match &column.sample_shape {
                Some(declared) if declared.iter().product::<usize>() != elements => {
                    exec_err!(
                        "column '{}' (epoch {}, step {}): images have shape {dims:?}, \
                         which does not fit the declared shape {declared:?}",
                        column.name,
                        rows.epoch,
                        rows.step
                    )
                }
                Some(declared) => Ok((declared.clone(), elements)),
                None => Ok((dims, elements)),
            }
        }
        (_, _) => {
            let shape = column.sample_shape.clone().unwrap_or_default();
            let elements = shape.iter().product();
            Ok((shape, elements))
        }
    }
}

/// The per-row shapes of a piece of an image column: `[H, W, C]` for
/// `image_decode` structs, `[C, H, W]` for `image_to_tensor`. The three
/// dimension columns are cast once per piece, not per row.
fn image_dims(column: &TensorColumn, image: &StructArray) -> Result<Vec<[usize; 3]>> {
    let dim = |name: &str| -> Result<ArrayRef> {
        let array = image
            .column_by_name(name)
            .ok_or_else(|| internal_datafusion_err!("image struct without '{name}'"))?;
        Ok(datafusion::arrow::compute::cast(array, &DataType::UInt64)?)
    };
    let (h, w, c) = (dim("height")?, dim("width")?, dim("channels")?);
    let (h, w, c) = (
        h.as_primitive::<UInt64Type>(),
        w.as_primitive::<UInt64Type>(),
        c.as_primitive::<UInt64Type>(),
    );
    Ok((0..image.len())
        .map(|row| {
            let (h, w, c) = (
                h.value(row) as usize,
                w.value(row) as usize,
                c.value(row) as usize,
            );
            match column.source {
                Source::ImageTensor => [c, h, w],
                _ => [h, w, c],
            }
        })
        .collect())
}

/// Number of values in row `row` of a variable-length column (0 for NULL).
pub(crate) fn value_len(array: &ArrayRef, row: usize) -> usize {
    if array.is_null(row) {
        return 0;
    }
    match array.data_type() {
        DataType::List(_) => {
            let offsets = array.as_list::<i32>().value_offsets();
            (offsets[row + 1] - offsets[row]) as usize
        }
        DataType::LargeList(_) => {
            let offsets = array.as_list::<i64>().value_offsets();
            (offsets[row + 1] - offsets[row]) as usize
        }
        DataType::Binary => array.as_binary::<i32>().value_length(row) as usize,
        DataType::LargeBinary => array.as_binary::<i64>().value_length(row) as usize,
        _ => 0,
    }
}

/// Writes one column of one batch.
struct ColumnWriter<'a> {
    column: &'a TensorColumn,
    rows: &'a BatchRows,
    /// Values per row in the output.
    width: usize,
}

impl ColumnWriter<'_> {
    fn error(&self, row: usize, what: impl std::fmt::Display) -> DataFusionError {
        exec_datafusion_err!(
            "column '{}', row {row} of the batch (epoch {}, step {}): {what}",
            self.column.name,
            self.rows.epoch,
            self.rows.step
        )
    }

    fn null_error(&self, row: usize) -> DataFusionError {
        self.error(
            row,
            "NULL cannot become a tensor value; filter or COALESCE it in SQL, or set \
             fill_null for this column",
        )
    }

    /// Writes a fixed-width column (scalars, fixed-size values, images,
    /// exact-length lists) into `dst`.
    fn write(&self, dst: &mut [u8]) -> Result<()> {
        let size = self.column.dtype.size();
        let row_bytes = self.width * size;
        let mut row0 = 0;
        for piece in &self.rows.pieces {
            let array = piece.column(self.column.index);
            let len = array.len();
            let out = &mut dst[row0 * row_bytes..(row0 + len) * row_bytes];
            match &self.column.source {
                Source::Scalar => self.convert(array.as_ref(), 0, len, out, row0)?,
                Source::Fixed { .. } => {
                    if let DataType::FixedSizeBinary(_) = array.data_type() {
                        let binary = array.as_fixed_size_binary();
                        for row in 0..len {
                            let out = &mut out[row * row_bytes..(row + 1) * row_bytes];
                            if binary.is_null(row) {
                                self.fill(out, row0 + row)?;
                            } else {
                                self.convert_bytes(binary.value(row), out, row0 + row)?;
                            }
                        }
                    } else {
                        // Slicing a FixedSizeList slices its values too, so the
                        // flattened values line up with the piece's rows.
                        let mut values = std::sync::Arc::clone(array);
                        while let DataType::FixedSizeList(..) = values.data_type() {
                            // A NULL list inside a row: its values are
                            // undefined, so it is only accepted with a fill.
                            if values.null_count() > 0 && self.column.fill_null.is_none()
                            {
                                let per_row = values.len() / len.max(1);
                                let first =
                                    (0..values.len()).find(|&i| values.is_null(i));
                                let at = first.unwrap_or(0) / per_row.max(1);
                                return Err(self.null_error(row0 + at));
                            }
                            values = std::sync::Arc::clone(
                                values.as_fixed_size_list().values(),
                            );
                        }
                        self.convert(values.as_ref(), 0, values.len(), out, row0)?;
                        if array.null_count() > 0 {
                            for row in 0..len {
                                if array.is_null(row) {
                                    self.fill(
                                        &mut out[row * row_bytes..(row + 1) * row_bytes],
                                        row0 + row,
                                    )?;
                                }
                            }
                        }
                    }
                }
                Source::Variable => {
                    for row in 0..len {
                        let out = &mut out[row * row_bytes..(row + 1) * row_bytes];
                        let got = value_len(array, row);
                        if array.is_null(row) {
                            self.fill(out, row0 + row)?;
                        } else if got != self.width {
                            return Err(self.error(
                                row0 + row,
                                format!(
                                    "{got} values, but the declared shape {:?} needs {}; \
                                     drop the shape to pad with a mask, or fix the rows",
                                    self.column.sample_shape.as_deref().unwrap_or(&[]),
                                    self.width
                                ),
                            ));
                        } else {
                            self.write_row(array, row, out, row0 + row, self.width)?;
                        }
                    }
                }
                Source::Image | Source::ImageTensor => {
                    let image = array.as_struct();
                    let values = match self.column.source {
                        Source::Image => image.column_by_name("pixels"),
                        _ => image.column_by_name("values"),
                    }
                    .ok_or_else(|| {
                        internal_datafusion_err!("image struct without data")
                    })?;
                    for row in 0..len {
                        let out = &mut out[row * row_bytes..(row + 1) * row_bytes];
                        if image.is_null(row) {
                            self.fill(out, row0 + row)?;
                            continue;
                        }
                        let got = value_len(values, row);
                        if got != self.width {
                            return Err(self.error(
                                row0 + row,
                                format!(
                                    "the image has {got} values, its shape says {}",
                                    self.width
                                ),
                            ));
                        }
                        self.write_row(values, row, out, row0 + row, self.width)?;
                    }
                }
            }
            row0 += len;
        }
        Ok(())
    }

    /// Writes a padded column and its mask; returns the padding elements.
    fn write_padded(&self, dst: &mut [u8], mask: &mut [u8]) -> Result<u64> {
        let size = self.column.dtype.size();
        let width = self.width;
        let mut padding = 0u64;
        let mut row0 = 0;
        for piece in &self.rows.pieces {
            let array = piece.column(self.column.index);
            for row in 0..array.len() {
                let at = row0 + row;
                let out = &mut dst[at * width * size..(at + 1) * width * size];
                let mask = &mut mask[at * width..(at + 1) * width];
                let take = if array.is_null(row) {
                    if self.column.fill_null.is_none() {
                        return Err(self.null_error(at));
                    }
                    0
                } else {
                    value_len(array, row).min(width)
                };
                self.write_row(array, row, &mut out[..take * size], at, take)?;
                write_repeated(
                    &mut out[take * size..],
                    self.column.dtype,
                    self.column.pad_value,
                )?;
                mask[..take].fill(1);
                mask[take..].fill(0);
                padding += (width - take) as u64;
            }
            row0 += array.len();
        }
        Ok(padding)
    }

    /// Writes the first `take` values of variable-length row `row`.
    fn write_row(
        &self,
        array: &ArrayRef,
        row: usize,
        out: &mut [u8],
        at: usize,
        take: usize,
    ) -> Result<()> {
        if take == 0 {
            return Ok(());
        }
        match array.data_type() {
            DataType::List(_) => {
                let list = array.as_list::<i32>();
                let start = list.value_offsets()[row].as_usize();
                self.convert(list.values().as_ref(), start, take, out, at)
            }
            DataType::LargeList(_) => {
                let list = array.as_list::<i64>();
                let start = list.value_offsets()[row].as_usize();
                self.convert(list.values().as_ref(), start, take, out, at)
            }
            DataType::Binary => {
                self.convert_bytes(&array.as_binary::<i32>().value(row)[..take], out, at)
            }
            DataType::LargeBinary => {
                self.convert_bytes(&array.as_binary::<i64>().value(row)[..take], out, at)
            }
            other => internal_err!("variable-length writer got {other}"),
        }
    }

    /// Fills a NULL row with the fill value, or fails.
    fn fill(&self, out: &mut [u8], row: usize) -> Result<()> {
        match self.column.fill_null {
            Some(value) => write_repeated(out, self.column.dtype, value),
            None => Err(self.null_error(row)),
        }
    }

    /// Converts raw bytes (uint8 values).
    fn convert_bytes(&self, bytes: &[u8], out: &mut [u8], row: usize) -> Result<()> {
        if self.column.dtype == DType::Float32 {
            // Pixels to float32: the hot path, vectorised in `device`.
            let (scale, offset) = self.column.affine.unwrap_or((1.0, 0.0));
            let (scale, offset) = (scale as f32, offset as f32);
            u8_to_f32_affine(bytes, cast_slice_mut::<f32>(out)?, scale, offset);
            return Ok(());
        }
        write_native(bytes, out, self.column.dtype, self.column.affine).map_err(
            |(_, value)| {
                self.error(
                    row,
                    format!("value {value} does not fit {}", self.column.dtype),
                )
            },
        )
    }

    /// Converts `len` values of a primitive or boolean array from `start`.
    /// `row` is the batch row of the first value, for messages.
    fn convert(
        &self,
        values: &dyn Array,
        start: usize,
        len: usize,
        out: &mut [u8],
        row: usize,
    ) -> Result<()> {
        let dtype = self.column.dtype;
        let affine = self.column.affine;
        macro_rules! primitive {
            ($t:ty) => {{
                let array: &PrimitiveArray<$t> = values.as_primitive();
                write_native(&array.values()[start..start + len], out, dtype, affine)
            }};
        }
        macro_rules! temporal {
            ($t:ty) => {{
                let array: &PrimitiveArray<$t> = values.as_primitive();
                self.convert_temporal(array, start, len, out, row)?;
                Ok(())
            }};
        }
        use TimeUnit::{Microsecond, Millisecond, Nanosecond, Second};
        let result = match values.data_type() {
            DataType::UInt8 if dtype == DType::Float32 => {
                let array: &PrimitiveArray<UInt8Type> = values.as_primitive();
                let (scale, offset) = affine.unwrap_or((1.0, 0.0));
                let (scale, offset) = (scale as f32, offset as f32);
                let src = &array.values()[start..start + len];
                u8_to_f32_affine(src, cast_slice_mut::<f32>(out)?, scale, offset);
                Ok(())
            }
            DataType::UInt8 => primitive!(UInt8Type),
            DataType::UInt16 => primitive!(UInt16Type),
            DataType::UInt32 => primitive!(UInt32Type),
            DataType::UInt64 => primitive!(UInt64Type),
            DataType::Int8 => primitive!(Int8Type),
            DataType::Int16 => primitive!(Int16Type),
            DataType::Int32 => primitive!(Int32Type),
            DataType::Int64 => primitive!(Int64Type),
            DataType::Float16 => primitive!(Float16Type),
            DataType::Float32 => primitive!(Float32Type),
            DataType::Float64 => primitive!(Float64Type),
            DataType::Date32 => temporal!(Date32Type),
            DataType::Date64 => temporal!(Date64Type),
            DataType::Timestamp(Second, _) => temporal!(TimestampSecondType),
            DataType::Timestamp(Millisecond, _) => temporal!(TimestampMillisecondType),
            DataType::Timestamp(Microsecond, _) => temporal!(TimestampMicrosecondType),
            DataType::Timestamp(Nanosecond, _) => temporal!(TimestampNanosecondType),
            DataType::Duration(Second) => temporal!(DurationSecondType),
            DataType::Duration(Millisecond) => temporal!(DurationMillisecondType),
            DataType::Duration(Microsecond) => temporal!(DurationMicrosecondType),
            DataType::Duration(Nanosecond) => temporal!(DurationNanosecondType),
            DataType::Boolean => {
                let array: &BooleanArray = values.as_boolean();
                let bits: Vec<u8> = (start..start + len)
                    .map(|i| u8::from(array.value(i)))
                    .collect();
                write_native(&bits, out, dtype, affine)
            }
            other => {
                return internal_err!("tensor writer got values of type {other}");
            }
        };
        let per_row = self.width.max(1);
        result.map_err(|(index, value)| {
            self.error(
                row + index / per_row,
                format!("value {value} does not fit {dtype}"),
            )
        })?;
        if values.null_count() > 0 {
            let size = dtype.size();
            for i in 0..len {
                if values.is_null(start + i) {
                    match self.column.fill_null {
                        Some(fill) => write_repeated(
                            &mut out[i * size..(i + 1) * size],
                            dtype,
                            fill,
                        )?,
                        None => return Err(self.null_error(row + i / per_row)),
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        Date32Array, Date64Array, DurationMicrosecondArray, DurationMillisecondArray,
        DurationNanosecondArray, DurationSecondArray, ListArray,
        TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
        TimestampSecondArray,
    };
    use datafusion::arrow::datatypes::{Field, Schema};

    use super::*;
    use crate::device::Backend;
    use crate::feed::ColumnSpec;
    use crate::feed::columns::resolve;

    /// The bytes of every tensor of one batch of `array` as column `t`.
    async fn tensors(array: ArrayRef, spec: ColumnSpec) -> Result<Vec<Vec<u8>>> {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "t",
            array.data_type().clone(),
            true,
        )]));
        let columns = resolve(&schema, &[("t".to_string(), spec)])?;
        let rows = array.len();
        let batch = RecordBatch::try_new(schema, vec![array])?;
        let rows = BatchRows {
            pieces: vec![batch.slice(0, 1), batch.slice(1, rows - 1)],
            rows,
            epoch: 0,
            step: 0,
            rows_after: 0,
            packed: None,
        };
        let mut pool = SlotPool::new(Backend::Cpu, 1);
        let mut slot = pool.acquire().await?;
        fill_slot(&columns, &rows, &mut pool, &mut slot)?;
        let count =
            columns.len() + columns.iter().filter(|c| c.mask_name.is_some()).count();
        (0..count).map(|i| Ok(slot.host_mut(i)?.to_vec())).collect()
    }

    async fn int64s(array: ArrayRef, spec: ColumnSpec) -> Result<Vec<i64>> {
        let bytes = tensors(array, spec).await?;
        Ok(bytes[0]
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect())
    }

    async fn float64s(array: ArrayRef, spec: ColumnSpec) -> Result<Vec<f64>> {
        let bytes = tensors(array, spec).await?;
        Ok(bytes[0]
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect())
    }

    async fn error(array: ArrayRef, spec: ColumnSpec) -> String {
        match tensors(array, spec).await {
            Ok(bytes) => panic!("expected an error, got {bytes:?}"),
            Err(err) => err.to_string(),
        }
    }

    const VALUES: [i64; 4] = [0, 1_700_000_000_123, -1, -1_500];

    /// Every temporal type by default: its own counts, as int64, whatever
    /// the time zone.
    #[tokio::test]
    async fn temporal_columns_default_to_int64_counts_in_their_own_unit() -> Result<()> {
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(TimestampSecondArray::from(VALUES.to_vec())),
            Arc::new(
                TimestampMillisecondArray::from(VALUES.to_vec()).with_timezone("UTC"),
            ),
            Arc::new(
                TimestampMicrosecondArray::from(VALUES.to_vec())
                    .with_timezone("America/New_York"),
            ),
            Arc::new(
                TimestampNanosecondArray::from(VALUES.to_vec()).with_timezone("+05:30"),
            ),
            Arc::new(Date64Array::from(VALUES.to_vec())),
            Arc::new(DurationSecondArray::from(VALUES.to_vec())),
            Arc::new(DurationMillisecondArray::from(VALUES.to_vec())),
            Arc::new(DurationMicrosecondArray::from(VALUES.to_vec())),
            Arc::new(DurationNanosecondArray::from(VALUES.to_vec())),
        ];
        for array in arrays {
            let data_type = array.data_type().clone();
            assert_eq!(
                int64s(array, ColumnSpec::new()).await?,
                VALUES,
                "{data_type}"
            );
        }
        let days = Date32Array::from(vec![0, 19_700, -1, i32::MIN]);
        assert_eq!(
            int64s(Arc::new(days), ColumnSpec::new()).await?,
            [0, 19_700, -1, i64::from(i32::MIN)]
        );
        Ok(())
    }

    #[tokio::test]
    async fn finer_units_are_exact_and_coarser_ones_floor() -> Result<()> {
        let micros = || -> ArrayRef {
            Arc::new(
                TimestampMicrosecondArray::from(vec![
                    1_500_000, 2_999_999, -1, -1_000_001,
                ])
                .with_timezone("UTC"),
            )
        };
        let spec = |unit| ColumnSpec::new().unit(unit);
        assert_eq!(
            int64s(micros(), spec(TimeUnit::Second)).await?,
            [1, 2, -1, -2],
            "floor division, towards negative infinity"
        );
        assert_eq!(
            int64s(micros(), spec(TimeUnit::Millisecond)).await?,
            [1_500, 2_999, -1, -1_001]
        );
        assert_eq!(
            int64s(micros(), spec(TimeUnit::Microsecond)).await?,
            [1_500_000, 2_999_999, -1, -1_000_001]
        );
        assert_eq!(
            int64s(micros(), spec(TimeUnit::Nanosecond)).await?,
            [1_500_000_000, 2_999_999_000, -1_000, -1_000_001_000]
        );
        let days: ArrayRef = Arc::new(Date32Array::from(vec![1, -1, 19_700, 0]));
        assert_eq!(
            int64s(Arc::clone(&days), spec(TimeUnit::Second)).await?,
            [86_400, -86_400, 19_700 * 86_400, 0]
        );
        assert_eq!(
            int64s(days, spec(TimeUnit::Nanosecond)).await?,
            [
                86_400_000_000_000,
                -86_400_000_000_000,
                19_700 * 86_400_000_000_000,
                0
            ]
        );
        let date64: ArrayRef = Arc::new(Date64Array::from(vec![86_400_000, -1, 0, 1]));
        assert_eq!(
            int64s(date64, spec(TimeUnit::Second)).await?,
            [86_400, -1, 0, 0]
        );
        let duration: ArrayRef =
            Arc::new(DurationNanosecondArray::from(vec![1_999_999_999, -1, 0, 5]));
        assert_eq!(
            int64s(duration, spec(TimeUnit::Second)).await?,
            [1, -1, 0, 0]
        );
        let seconds: ArrayRef = Arc::new(DurationSecondArray::from(vec![1, -2, 3, 0]));
        assert_eq!(
            int64s(seconds, spec(TimeUnit::Millisecond)).await?,
            [1_000, -2_000, 3_000, 0]
        );
        Ok(())
    }

    #[tokio::test]
    async fn float_dtypes_hold_the_fraction() -> Result<()> {
        let micros: ArrayRef = Arc::new(
            TimestampMicrosecondArray::from(vec![
                1_500_000,
                -1,
                1_700_000_000_123_456,
                0,
            ])
            .with_timezone("UTC"),
        );
        let seconds = float64s(
            Arc::clone(&micros),
            ColumnSpec::new()
                .dtype(DType::Float64)
                .unit(TimeUnit::Second),
        )
        .await?;
        assert_eq!(seconds, [1.5, -0.000_001, 1_700_000_000.123_456, 0.0]);
        // Without a unit: the column's own unit, as floats.
        let own = float64s(Arc::clone(&micros), ColumnSpec::new().dtype(DType::Float64))
            .await?;
        assert_eq!(own, [1_500_000.0, -1.0, 1_700_000_000_123_456.0, 0.0]);
        // Epoch nanoseconds above 2^53 to float seconds: whole seconds and
        // the fraction separately, so only the result rounds.
        let nanos: ArrayRef = Arc::new(TimestampNanosecondArray::from(vec![
            1_700_000_000_123_456_789,
            -1,
            0,
            1,
        ]));
        let seconds = float64s(
            nanos,
            ColumnSpec::new()
                .dtype(DType::Float64)
                .unit(TimeUnit::Second),
        )
        .await?;
        assert_eq!(seconds, [1_700_000_000.123_456_7, -1e-9, 0.0, 1e-9]);
        // scale/offset apply in f64 (an f32 offset would be 1_700_000_000).
        let shifted = float64s(
            Arc::new(TimestampSecondArray::from(vec![
                1_700_000_001,
                1_700_000_002,
                1_700_000_000,
                1_700_000_003,
            ])),
            ColumnSpec::new()
                .dtype(DType::Float64)
                .scale(2.0)
                .offset(-3_400_000_001.0),
        )
        .await?;
        assert_eq!(shifted, [1.0, 3.0, -1.0, 5.0]);
        let bytes = tensors(
            Arc::new(Date32Array::from(vec![1, 2, 3, -1])),
            ColumnSpec::new()
                .dtype(DType::Float32)
                .unit(TimeUnit::Millisecond),
        )
        .await?;
        let values: Vec<f32> = bytes[0]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        assert_eq!(
            values,
            [86_400_000.0, 172_800_000.0, 259_200_000.0, -86_400_000.0]
        );
        Ok(())
    }

    #[tokio::test]
    async fn counts_that_overflow_name_the_column_row_and_value() -> Result<()> {
        // 10^10 s is the year 2286: past int64 nanoseconds (2262).
        let seconds: ArrayRef =
            Arc::new(TimestampSecondArray::from(vec![0, 1, 10_000_000_000, 2]));
        let err = error(
            Arc::clone(&seconds),
            ColumnSpec::new().unit(TimeUnit::Nanosecond),
        )
        .await;
        assert!(
            err.contains("column 't', row 2")
                && err.contains("10000000000 s")
                && err.contains("int64")
                && err.contains("coarser unit"),
            "{err}"
        );
        let err = error(
            Arc::clone(&seconds),
            ColumnSpec::new()
                .dtype(DType::Int32)
                .unit(TimeUnit::Millisecond),
        )
        .await;
        assert!(
            err.contains("column 't', row 2")
                && err.contains("value 10000000000 s is 10000000000000 ms")
                && err.contains("int32")
                && err.contains("dtype=int64"),
            "{err}"
        );
        let err = error(seconds, ColumnSpec::new().dtype(DType::Int32)).await;
        assert!(
            err.contains("column 't', row 2")
                && err.contains("value 10000000000 s does not fit int32"),
            "{err}"
        );
        // In range: int32 days.
        let days = tensors(
            Arc::new(Date32Array::from(vec![1, -1, 19_700, 0])),
            ColumnSpec::new().dtype(DType::Int32),
        )
        .await?;
        let days: Vec<i32> = days[0]
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        assert_eq!(days, [1, -1, 19_700, 0]);
        Ok(())
    }

    #[tokio::test]
    async fn null_timestamps_follow_fill_null() -> Result<()> {
        // The NULL slot holds a count that would overflow a rescale: it
        // must be filled (or refused as NULL), never reported as a value.
        let array = || -> ArrayRef {
            let values = TimestampSecondArray::from(vec![1, i64::MAX, 3, 4]);
            let nulls = vec![true, false, true, true].into();
            Arc::new(
                TimestampSecondArray::new(values.values().clone(), Some(nulls))
                    .with_timezone("UTC"),
            )
        };
        let spec = || ColumnSpec::new().unit(TimeUnit::Millisecond);
        let err = error(array(), spec()).await;
        assert!(
            err.contains("column 't', row 1") && err.contains("fill_null"),
            "{err}"
        );
        assert_eq!(
            int64s(array(), spec().fill_null(-1.0)).await?,
            [1_000, -1, 3_000, 4_000]
        );
        let seconds =
            float64s(array(), spec().dtype(DType::Float64).fill_null(f64::NAN)).await?;
        assert_eq!(seconds[0], 1_000.0);
        assert!(seconds[1].is_nan());
        Ok(())
    }

    #[tokio::test]
    async fn lists_of_timestamps_pad_like_lists_of_numbers() -> Result<()> {
        let values =
            TimestampMillisecondArray::from(vec![1_000, 2_500, -1, 7_000, 9_999]);
        let field = Arc::new(Field::new_list_field(values.data_type().clone(), true));
        let offsets = datafusion::arrow::buffer::OffsetBuffer::from_lengths([2, 0, 1, 2]);
        let list = ListArray::try_new(field, offsets, Arc::new(values), None)?;
        let bytes = tensors(
            Arc::new(list),
            ColumnSpec::new().unit(TimeUnit::Second).pad_value(-9.0),
        )
        .await?;
        let ids: Vec<i64> = bytes[0]
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        assert_eq!(ids, [1, 2, -9, -9, -1, -9, 7, 9]);
        assert_eq!(bytes[1], [1, 1, 0, 0, 1, 0, 1, 1], "the mask");
        Ok(())
    }
}
