//! Writes the rows of one batch (slices of record batches) straight into a
//! slot's tensor buffers: one pass per column, converting element types,
//! applying `x * scale + offset`, padding and masks as it goes, with no
//! intermediate Arrow arrays.

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, GenericBinaryArray, GenericListArray,
    OffsetSizeTrait, PrimitiveArray, RecordBatch, StructArray,
};
use datafusion::arrow::datatypes::{
    DataType, Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::common::{exec_err, internal_err};
use datafusion::error::{DataFusionError, Result};

use super::columns::{Padding, Source, TensorColumn};
use crate::device::TensorLayout;
use crate::device::{DType, Slot, SlotPool, bf16, cast_slice_mut, f16, u8_to_f32_affine};

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
        let array = image.column_by_name(name).ok_or_else(|| {
            DataFusionError::Internal(format!("image struct without '{name}'"))
        })?;
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
        DataFusionError::Execution(format!(
            "column '{}', row {row} of the batch (epoch {}, step {}): {what}",
            self.column.name, self.rows.epoch, self.rows.step
        ))
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
                        DataFusionError::Internal("image struct without data".into())
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
                self.write_list_row(array.as_list::<i32>(), row, out, at, take)
            }
            DataType::LargeList(_) => {
                self.write_list_row(array.as_list::<i64>(), row, out, at, take)
            }
            DataType::Binary => {
                self.write_binary_row(array.as_binary::<i32>(), row, out, at, take)
            }
            DataType::LargeBinary => {
                self.write_binary_row(array.as_binary::<i64>(), row, out, at, take)
            }
            other => internal_err!("variable-length writer got {other}"),
        }
    }

    fn write_list_row<O: OffsetSizeTrait>(
        &self,
        list: &GenericListArray<O>,
        row: usize,
        out: &mut [u8],
        at: usize,
        take: usize,
    ) -> Result<()> {
        let start = list.value_offsets()[row].as_usize();
        self.convert(list.values().as_ref(), start, take, out, at)
    }

    fn write_binary_row<O: OffsetSizeTrait>(
        &self,
        binary: &GenericBinaryArray<O>,
        row: usize,
        out: &mut [u8],
        at: usize,
        take: usize,
    ) -> Result<()> {
        self.convert_bytes(&binary.value(row)[..take], out, at)
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
        let result = match values.data_type() {
            DataType::UInt8 if dtype == DType::Float32 => {
                let array: &PrimitiveArray<UInt8Type> = values.as_primitive();
                let (scale, offset) = affine.unwrap_or((1.0, 0.0));
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

/// A number that can become any tensor element.
trait Number: Copy {
    fn to_f32(self) -> f32;
    /// `None` for non-integral values.
    fn to_i64(self) -> Option<i64>;
    fn is_nonzero(self) -> bool;
}

macro_rules! integer {
    ($($t:ty),*) => {$(
        impl Number for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 { self as f32 }
            #[inline(always)]
            fn to_i64(self) -> Option<i64> { i64::try_from(self).ok() }
            #[inline(always)]
            fn is_nonzero(self) -> bool { self != 0 }
        }
    )*};
}
integer!(u8, u16, u32, u64, i8, i16, i32, i64);

impl Number for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    fn to_i64(self) -> Option<i64> {
        None
    }
    fn is_nonzero(self) -> bool {
        self != 0.0
    }
}

impl Number for f64 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn to_i64(self) -> Option<i64> {
        None
    }
    fn is_nonzero(self) -> bool {
        self != 0.0
    }
}

impl Number for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    fn to_i64(self) -> Option<i64> {
        None
    }
    fn is_nonzero(self) -> bool {
        f32::from(self) != 0.0
    }
}

/// Converts `src` into `dst` (exactly `src.len()` elements of `dtype`);
/// on overflow returns the offending value as text.
#[inline]
fn write_native<S: Number + std::fmt::Debug>(
    src: &[S],
    dst: &mut [u8],
    dtype: DType,
    affine: Option<(f32, f32)>,
) -> std::result::Result<(), (usize, String)> {
    let internal = |e: DataFusionError| (0, e.to_string());
    match dtype {
        DType::Float32 => {
            let dst = cast_slice_mut::<f32>(dst).map_err(internal)?;
            match affine {
                // Separate loops so that the compiler vectorises each.
                Some((scale, offset)) => {
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d = s.to_f32() * scale + offset;
                    }
                }
                None => {
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d = s.to_f32();
                    }
                }
            }
        }
        DType::Float16 => {
            let dst = cast_slice_mut::<f16>(dst).map_err(internal)?;
            let (scale, offset) = affine.unwrap_or((1.0, 0.0));
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f16::from_f32(s.to_f32() * scale + offset);
            }
        }
        DType::BFloat16 => {
            let dst = cast_slice_mut::<bf16>(dst).map_err(internal)?;
            let (scale, offset) = affine.unwrap_or((1.0, 0.0));
            for (d, s) in dst.iter_mut().zip(src) {
                *d = bf16::from_f32(s.to_f32() * scale + offset);
            }
        }
        DType::Int64 => {
            let dst = cast_slice_mut::<i64>(dst).map_err(internal)?;
            for (i, (d, s)) in dst.iter_mut().zip(src).enumerate() {
                *d = s.to_i64().ok_or_else(|| (i, format!("{s:?}")))?;
            }
        }
        DType::Int32 => {
            let dst = cast_slice_mut::<i32>(dst).map_err(internal)?;
            for (i, (d, s)) in dst.iter_mut().zip(src).enumerate() {
                *d = s
                    .to_i64()
                    .and_then(|v| i32::try_from(v).ok())
                    .ok_or_else(|| (i, format!("{s:?}")))?;
            }
        }
        DType::UInt8 => {
            for (i, (d, s)) in dst.iter_mut().zip(src).enumerate() {
                *d = s
                    .to_i64()
                    .and_then(|v| u8::try_from(v).ok())
                    .ok_or_else(|| (i, format!("{s:?}")))?;
            }
        }
        DType::Bool => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = u8::from(s.is_nonzero());
            }
        }
    }
    Ok(())
}

/// Fills `dst` with `value` as `dtype`.
fn write_repeated(dst: &mut [u8], dtype: DType, value: f64) -> Result<()> {
    match dtype {
        DType::Float32 => cast_slice_mut::<f32>(dst)?.fill(value as f32),
        DType::Float16 => cast_slice_mut::<f16>(dst)?.fill(f16::from_f64(value)),
        DType::BFloat16 => cast_slice_mut::<bf16>(dst)?.fill(bf16::from_f64(value)),
        DType::Int64 => cast_slice_mut::<i64>(dst)?.fill(value as i64),
        DType::Int32 => cast_slice_mut::<i32>(dst)?.fill(value as i32),
        DType::UInt8 => dst.fill(value as u8),
        DType::Bool => dst.fill(u8::from(value != 0.0)),
    }
    Ok(())
}
