//! `image_to_tensor`: a decoded image (the struct of [`super::image_type`])
//! into float32 values in CHW order, normalised per channel through lookup
//! tables of the 256 possible bytes; NULL images stay NULL.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float32Array, ListArray, StructArray, UInt8Builder,
    UInt32Builder,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::ScalarValue;
use datafusion::common::{exec_datafusion_err, exec_err, internal_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl};

use super::image_type;
use super::transform::{check_image_arg, image_at};

const TO_TENSOR: &str = "image_to_tensor(image [, mean, std])";

/// The struct of `image_to_tensor`: the CHW shape and the float32 values.
pub fn tensor_type() -> DataType {
    DataType::Struct(Fields::from(vec![
        Field::new("channels", DataType::UInt8, false),
        Field::new("height", DataType::UInt32, false),
        Field::new("width", DataType::UInt32, false),
        Field::new(
            "values",
            DataType::new_list(DataType::Float32, false),
            false,
        ),
    ]))
}

crate::coercing_function! {
    /// `image_to_tensor(image [, mean, std])`: float32 values in CHW order,
    /// `pixel / 255`, then `(x - mean[c]) / std[c]` when mean and std are given
    /// (numbers, or lists with one value per channel).
    pub struct ToTensorFunc;
}

/// Per-channel constants from a number or a list literal.
fn per_channel(value: Option<&ColumnarValue>, what: &str) -> Result<Vec<f32>> {
    let Some(ColumnarValue::Scalar(value)) = value else {
        return plan_err!(
            "image_to_tensor: {what} must be a constant number or list; signature: {TO_TENSOR}"
        );
    };
    let values = match value {
        ScalarValue::List(list) => {
            let list = list.value(0);
            let list = datafusion::arrow::compute::cast(&list, &DataType::Float32)?;
            let list = list.as_primitive::<datafusion::arrow::datatypes::Float32Type>();
            if list.null_count() > 0 {
                return plan_err!("image_to_tensor: {what} has NULLs");
            }
            list.values().to_vec()
        }
        other => match other.cast_to(&DataType::Float32)? {
            ScalarValue::Float32(Some(v)) => vec![v],
            _ => {
                return plan_err!(
                    "image_to_tensor: {what} must be a number or a list of numbers"
                );
            }
        },
    };
    if values.is_empty() {
        return plan_err!("image_to_tensor: {what} is empty");
    }
    Ok(values)
}

/// `image_to_tensor`'s value of every pixel value, per channel.
struct ChannelTables {
    /// One table per channel index up to the last that has its own mean or
    /// std; later channels use the last table (as the formula does).
    tables: Vec<[f32; 256]>,
}

impl ChannelTables {
    fn new(normalize: Option<&(Vec<f32>, Vec<f32>)>) -> Self {
        let channels = normalize.map_or(1, |(mean, std)| mean.len().max(std.len()));
        let tables = (0..channels)
            .map(|channel| {
                let (m, s) = match normalize {
                    Some((mean, std)) => (
                        mean[channel.min(mean.len() - 1)],
                        std[channel.min(std.len() - 1)],
                    ),
                    None => (0.0, 1.0),
                };
                std::array::from_fn(|p| (p as f32 / 255.0 - m) / s)
            })
            .collect();
        Self { tables }
    }

    fn get(&self, channel: usize) -> &[f32; 256] {
        &self.tables[channel.min(self.tables.len() - 1)]
    }
}

impl ScalarUDFImpl for ToTensorFunc {
    crate::function_basics!("image_to_tensor");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        crate::check_arity(self.name(), TO_TENSOR, arg_types.len(), &[1, 3])?;
        check_image_arg(self.name(), TO_TENSOR, &arg_types[0])?;
        let mut types = vec![image_type()];
        types.extend(arg_types[1..].iter().cloned());
        Ok(types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(tensor_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let normalize = if args.args.len() == 3 {
            Some((
                per_channel(args.args.get(1), "mean")?,
                per_channel(args.args.get(2), "std")?,
            ))
        } else {
            None
        };
        let images = args.args[0].to_array(args.number_rows)?;
        let images = images.as_struct();
        let mut channels = UInt8Builder::new();
        let mut heights = UInt32Builder::new();
        let mut widths = UInt32Builder::new();
        // One table per channel of the 256 values a pixel can take, computed
        // with the formula's own arithmetic (`(p / 255 - mean) / std`), so
        // that a lookup gives exactly the computed value, 4–10× faster.
        let tables = ChannelTables::new(normalize.as_ref());
        let total: usize = (0..images.len())
            .filter_map(|row| image_at(images, row))
            .map(|image| image.pixels.len())
            .sum();
        let mut flat: Vec<f32> = Vec::with_capacity(total);
        let mut offsets: Vec<i32> = Vec::with_capacity(images.len() + 1);
        offsets.push(0);
        let mut valid = Vec::with_capacity(images.len());
        for row in 0..images.len() {
            let image = image_at(images, row);
            let (h, w, c) = image
                .as_ref()
                .map_or((0, 0, 0), |i| (i.height, i.width, i.channels));
            if let (Some(image), Some((mean, std))) = (&image, &normalize) {
                for (what, list) in [("mean", mean), ("std", std)] {
                    if list.len() != 1 && list.len() != image.channels {
                        return exec_err!(
                            "image_to_tensor: {what} has {} values but the image in row {row} \
                             has {} channels",
                            list.len(),
                            image.channels
                        );
                    }
                }
            }
            if let Some(image) = &image
                && c > 0
            {
                // CHW: every channel's plane in turn.
                for channel in 0..c {
                    let table = tables.get(channel);
                    flat.extend(
                        image
                            .pixels
                            .chunks_exact(c)
                            .map(|pixel| table[usize::from(pixel[channel])]),
                    );
                }
            }
            offsets.push(i32::try_from(flat.len()).map_err(|_| {
                exec_datafusion_err!("image_to_tensor: the tensors of rows 0..={row} of this batch hold more \
                     than 2^31 values; lower the batch size (datafusion.execution.batch_size)")
            })?);
            channels.append_value(c as u8);
            heights.append_value(h as u32);
            widths.append_value(w as u32);
            valid.push(image.is_some());
        }
        let values = ListArray::try_new(
            Arc::new(Field::new_list_field(DataType::Float32, false)),
            OffsetBuffer::new(offsets.into()),
            Arc::new(Float32Array::from(flat)),
            None,
        )?;
        let DataType::Struct(fields) = tensor_type() else {
            return internal_err!("tensor type is a struct");
        };
        let nulls = NullBuffer::from(valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(channels.finish()),
            Arc::new(heights.finish()),
            Arc::new(widths.finish()),
            Arc::new(values),
        ];
        Ok(ColumnarValue::Array(Arc::new(StructArray::try_new(
            fields, columns, nulls,
        )?)))
    }
}
