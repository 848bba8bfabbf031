//! Transforms of decoded images: `image_resize`, `image_center_crop`,
//! `image_random_crop`, `image_random_flip` (`image_to_tensor` is in
//! `tensor.rs`). Inputs and outputs are the image struct of
//! [`super::image_type`]; NULL images stay NULL.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, StructArray, UInt8Builder, UInt32Builder,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, UInt8Type, UInt32Type};
use datafusion::common::ScalarValue;
use datafusion::common::{exec_datafusion_err, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility, lit,
};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{image_fields, image_type};

/// One decoded image borrowed from the struct column.
pub(super) struct ImageRef<'a> {
    pub(super) height: usize,
    pub(super) width: usize,
    pub(super) channels: usize,
    pub(super) pixels: &'a [u8],
}

pub(super) fn image_at(images: &StructArray, row: usize) -> Option<ImageRef<'_>> {
    if images.is_null(row) {
        return None;
    }
    Some(ImageRef {
        height: images.column(0).as_primitive::<UInt32Type>().value(row) as usize,
        width: images.column(1).as_primitive::<UInt32Type>().value(row) as usize,
        channels: images.column(2).as_primitive::<UInt8Type>().value(row) as usize,
        pixels: images.column(3).as_binary::<i32>().value(row),
    })
}

/// Builds an image struct column row by row.
struct ImageBuilder {
    heights: UInt32Builder,
    widths: UInt32Builder,
    channels: UInt8Builder,
    pixels: BinaryBuilder,
    valid: Vec<bool>,
}

impl ImageBuilder {
    fn new() -> Self {
        Self {
            heights: UInt32Builder::new(),
            widths: UInt32Builder::new(),
            channels: UInt8Builder::new(),
            pixels: BinaryBuilder::new(),
            valid: Vec::new(),
        }
    }

    fn push(&mut self, image: Option<(usize, usize, usize, &[u8])>) {
        let (h, w, c, data) = image.unwrap_or((0, 0, 0, &[]));
        self.heights.append_value(h as u32);
        self.widths.append_value(w as u32);
        self.channels.append_value(c as u8);
        self.pixels.append_value(data);
        self.valid.push(image.is_some());
    }

    fn finish(mut self) -> Result<ArrayRef> {
        let nulls = NullBuffer::from(std::mem::take(&mut self.valid));
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.heights.finish()),
            Arc::new(self.widths.finish()),
            Arc::new(self.channels.finish()),
            Arc::new(self.pixels.finish()),
        ];
        Ok(Arc::new(StructArray::try_new(
            image_fields(),
            columns,
            nulls,
        )?))
    }
}

pub(super) fn check_image_arg(function: &str, syntax: &str, t: &DataType) -> Result<()> {
    if *t == image_type() || *t == DataType::Null {
        Ok(())
    } else {
        plan_err!(
            "{function}: the first argument must be a decoded image (image_decode(...)), \
             got {t}; signature: {syntax}"
        )
    }
}

fn constant_u32(
    function: &str,
    what: &str,
    value: Option<&ColumnarValue>,
) -> Result<u32> {
    let scalar = match value {
        Some(ColumnarValue::Scalar(v)) if !v.is_null() => v.cast_to(&DataType::Int64)?,
        _ => {
            return plan_err!("{function}: {what} must be a non-null constant");
        }
    };
    match scalar {
        ScalarValue::Int64(Some(v)) if (1..=65_535).contains(&v) => Ok(v as u32),
        other => plan_err!("{function}: {what} must be in 1..=65535, got {other}"),
    }
}

/// `image_center_crop(image, h, w)`: the centred `h × w` window.
/// `image_random_crop(image, h, w, seed)`: a window whose offset is drawn
/// from `xxh3_64_with_seed(pixels, seed)` (inside a feed the seed is mixed
/// with the feed's seed and the epoch: see [`crate::augment`]), so a seed
/// reproduces the crop and
/// different images get different windows. An image smaller than the window
/// is an error naming the row (resize first).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CropFunc {
    /// Random offsets (with a seed argument) instead of the centre.
    random: bool,
    signature: Signature,
}

impl CropFunc {
    pub(super) fn new(random: bool) -> Self {
        Self {
            random,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }

    fn syntax(&self) -> &'static str {
        if self.random {
            "image_random_crop(image, height, width, seed)"
        } else {
            "image_center_crop(image, height, width)"
        }
    }
}

impl ScalarUDFImpl for CropFunc {
    crate::function_basics!(if random {
        "image_random_crop"
    } else {
        "image_center_crop"
    });

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let arity = if self.random { 4 } else { 3 };
        if arg_types.len() != arity {
            return plan_err!(
                "{} takes {arity} arguments, got {}; signature: {}",
                self.name(),
                arg_types.len(),
                self.syntax()
            );
        }
        check_image_arg(self.name(), self.syntax(), &arg_types[0])?;
        let mut types = vec![image_type()];
        types.extend((1..arity).map(|_| DataType::Int64));
        Ok(types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(image_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let height = constant_u32(self.name(), "height", args.args.get(1))? as usize;
        let width = constant_u32(self.name(), "width", args.args.get(2))? as usize;
        let seed = match (self.random, args.args.get(3)) {
            (false, _) => None,
            (true, Some(ColumnarValue::Scalar(ScalarValue::Int64(Some(seed))))) => Some(
                crate::augment::epoch_seed(*seed as u64, &args.config_options),
            ),
            (true, _) => {
                return plan_err!(
                    "{}: seed must be a non-null integer constant; signature: {}",
                    self.name(),
                    self.syntax()
                );
            }
        };
        let images = args.args[0].to_array(args.number_rows)?;
        let images = images.as_struct();
        let mut out = ImageBuilder::new();
        let mut cropped = Vec::new();
        for row in 0..images.len() {
            let Some(image) = image_at(images, row) else {
                out.push(None);
                continue;
            };
            if image.height < height || image.width < width {
                return exec_err!(
                    "{}: the image in row {row} is {}x{}, smaller than the \
                     {height}x{width} crop; resize it first",
                    self.name(),
                    image.height,
                    image.width
                );
            }
            let (spare_y, spare_x) = (image.height - height, image.width - width);
            let (top, left) = match seed {
                None => (spare_y / 2, spare_x / 2),
                Some(seed) => {
                    let draw = xxh3_64_with_seed(image.pixels, seed);
                    (
                        ((draw >> 32) % (spare_y as u64 + 1)) as usize,
                        ((draw & 0xFFFF_FFFF) % (spare_x as u64 + 1)) as usize,
                    )
                }
            };
            let row_bytes = image.width * image.channels;
            cropped.clear();
            for y in top..top + height {
                let start = y * row_bytes + left * image.channels;
                cropped.extend_from_slice(
                    &image.pixels[start..start + width * image.channels],
                );
            }
            out.push(Some((height, width, image.channels, &cropped)));
        }
        Ok(ColumnarValue::Array(out.finish()?))
    }
}

const RESIZE: &str = "image_resize(image, height, width [, 'bilinear' | 'nearest' | 'bicubic' | 'lanczos3'])";

crate::coercing_function! {
    /// `image_resize(image, h, w [, filter])`: SIMD resampling with
    /// `fast_image_resize` (convolution filters, i.e. antialiased when shrinking,
    /// like torchvision's `antialias=True`); bilinear by default. RGBA is
    /// resized with premultiplied alpha so transparent pixels do not bleed.
    pub struct ResizeFunc;
}

/// A literal number of pixels as `i64` (0 to `u32::MAX`).
fn pixels_of(value: &ScalarValue) -> Option<i64> {
    let value = value.cast_to(&DataType::Int64).ok()?;
    match value {
        ScalarValue::Int64(Some(v)) if u32::try_from(v).is_ok() => Some(v),
        _ => None,
    }
}

/// Whether a filter argument is the literal `'nearest'`.
fn is_nearest(filter: &Expr) -> bool {
    match filter {
        Expr::Literal(
            ScalarValue::Utf8(Some(name))
            | ScalarValue::Utf8View(Some(name))
            | ScalarValue::LargeUtf8(Some(name)),
            _,
        ) => name.eq_ignore_ascii_case("nearest"),
        // Unknown at plan time: keep the exact full-size semantics.
        _ => true,
    }
}

fn resize_algorithm(
    filter: Option<&ColumnarValue>,
) -> Result<fast_image_resize::ResizeAlg> {
    use fast_image_resize::{FilterType, ResizeAlg};
    let name = match filter {
        None => return Ok(ResizeAlg::Convolution(FilterType::Bilinear)),
        Some(ColumnarValue::Scalar(
            ScalarValue::Utf8(Some(name))
            | ScalarValue::Utf8View(Some(name))
            | ScalarValue::LargeUtf8(Some(name)),
        )) => name.to_ascii_lowercase(),
        Some(_) => {
            return plan_err!(
                "image_resize: the filter must be a constant string; signature: {RESIZE}"
            );
        }
    };
    match name.as_str() {
        "bilinear" | "linear" => Ok(ResizeAlg::Convolution(FilterType::Bilinear)),
        "nearest" => Ok(ResizeAlg::Nearest),
        "bicubic" | "cubic" => Ok(ResizeAlg::Convolution(FilterType::CatmullRom)),
        "lanczos3" | "lanczos" => Ok(ResizeAlg::Convolution(FilterType::Lanczos3)),
        other => plan_err!("image_resize: unknown filter '{other}'; signature: {RESIZE}"),
    }
}

impl ScalarUDFImpl for ResizeFunc {
    crate::function_basics!("image_resize");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        crate::check_arity(self.name(), RESIZE, arg_types.len(), &[3, 4])?;
        check_image_arg(self.name(), RESIZE, &arg_types[0])?;
        let mut types = vec![image_type(), DataType::Int64, DataType::Int64];
        types.extend(arg_types.get(3).map(|_| DataType::Utf8));
        Ok(types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(image_type())
    }

    /// `image_resize(image_decode(b [, mode [, completeness]]), h, w [, filter])`
    /// becomes `image_resize(image_decode(b, mode, completeness, h, w), h, w
    /// [, filter])`: the decoder may then decode a JPEG at a reduced DCT
    /// scale that still covers `h × w` (see [`super::scaled`]). Not for the
    /// `nearest` filter, which picks source pixels instead of averaging them.
    fn simplify(
        &self,
        args: Vec<Expr>,
        _info: &SimplifyContext,
    ) -> Result<ExprSimplifyResult> {
        let sized = match args.as_slice() {
            [
                Expr::ScalarFunction(decode),
                Expr::Literal(h, _),
                Expr::Literal(w, _),
                filter @ ..,
            ] if decode.args.len() <= 3
                && decode
                    .func
                    .inner()
                    .as_ref()
                    .downcast_ref::<super::ImageDecodeFunc>()
                    .is_some()
                && !filter.iter().any(is_nearest) =>
            {
                match (pixels_of(h), pixels_of(w)) {
                    (Some(h), Some(w)) => {
                        let mut decode_args = decode.args.clone();
                        if decode_args.len() < 2 {
                            decode_args.push(lit("rgb"));
                        }
                        if decode_args.len() < 3 {
                            decode_args.push(lit("complete"));
                        }
                        decode_args.extend([lit(h), lit(w)]);
                        Some(Expr::ScalarFunction(ScalarFunction::new_udf(
                            Arc::clone(&decode.func),
                            decode_args,
                        )))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let Some(sized) = sized else {
            return Ok(ExprSimplifyResult::Original(args));
        };
        let mut resize_args = args;
        resize_args[0] = sized;
        Ok(ExprSimplifyResult::Simplified(Expr::ScalarFunction(
            ScalarFunction::new_udf(Arc::new(ScalarUDF::from(Self::new())), resize_args),
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        use fast_image_resize::images::{Image, ImageRef};
        use fast_image_resize::{PixelType, ResizeOptions, Resizer};
        let height = constant_u32(self.name(), "height", args.args.get(1))?;
        let width = constant_u32(self.name(), "width", args.args.get(2))?;
        let options =
            ResizeOptions::new().resize_alg(resize_algorithm(args.args.get(3))?);
        let images = args.args[0].to_array(args.number_rows)?;
        let images = images.as_struct();
        let mut resizer = Resizer::new();
        let mut out = ImageBuilder::new();
        for row in 0..images.len() {
            let Some(image) = image_at(images, row) else {
                out.push(None);
                continue;
            };
            let pixel_type = match image.channels {
                1 => PixelType::U8,
                3 => PixelType::U8x3,
                4 => PixelType::U8x4,
                other => {
                    return exec_err!(
                        "image_resize: the image in row {row} has {other} channels; 1, 3 or 4 \
                         are supported"
                    );
                }
            };
            let row_error = |e: &dyn std::fmt::Display| {
                exec_datafusion_err!("image_resize: row {row}: {e}")
            };
            let src = ImageRef::new(
                image.width as u32,
                image.height as u32,
                image.pixels,
                pixel_type,
            )
            .map_err(|e| row_error(&e))?;
            let mut dst = Image::new(width, height, pixel_type);
            resizer
                .resize(&src, &mut dst, &options)
                .map_err(|e| row_error(&e))?;
            out.push(Some((
                height as usize,
                width as usize,
                image.channels,
                dst.buffer(),
            )));
        }
        Ok(ColumnarValue::Array(out.finish()?))
    }
}

const FLIP: &str = "image_random_flip(image, seed)";

crate::coercing_function! {
    /// `image_random_flip(image, seed)`: mirrors the image left-right with
    /// probability ½, decided by `xxh3_64_with_seed(pixels, seed)` (per epoch
    /// inside a feed: see [`crate::augment`]), so a seed
    /// reproduces the augmentation and different images flip independently.
    pub struct RandomFlipFunc;
}

impl ScalarUDFImpl for RandomFlipFunc {
    crate::function_basics!("image_random_flip");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        crate::check_arity(self.name(), FLIP, arg_types.len(), &[2])?;
        check_image_arg(self.name(), FLIP, &arg_types[0])?;
        Ok(vec![image_type(), DataType::Int64])
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(image_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let seed = match args.args.get(1) {
            Some(ColumnarValue::Scalar(ScalarValue::Int64(Some(seed)))) => {
                crate::augment::epoch_seed(*seed as u64, &args.config_options)
            }
            _ => {
                return plan_err!(
                    "image_random_flip: seed must be a non-null integer constant; signature: {FLIP}"
                );
            }
        };
        let images = args.args[0].to_array(args.number_rows)?;
        let images = images.as_struct();
        let mut out = ImageBuilder::new();
        let mut flipped = Vec::new();
        for row in 0..images.len() {
            let Some(image) = image_at(images, row) else {
                out.push(None);
                continue;
            };
            let shape = (image.height, image.width, image.channels);
            if xxh3_64_with_seed(image.pixels, seed) & 1 == 0 {
                out.push(Some((shape.0, shape.1, shape.2, image.pixels)));
                continue;
            }
            flipped.clear();
            for line in image.pixels.chunks_exact(image.width * image.channels) {
                for pixel in line.chunks_exact(image.channels).rev() {
                    flipped.extend_from_slice(pixel);
                }
            }
            out.push(Some((shape.0, shape.1, shape.2, &flipped)));
        }
        Ok(ColumnarValue::Array(out.finish()?))
    }
}
