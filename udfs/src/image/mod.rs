//! Image functions: `image_decode(bytes [, mode])` and its `try_` twin, and
//! the transforms of [`transform`]: `image_resize`, `image_center_crop`, `image_random_crop`,
//! `image_random_flip`,
//! `image_to_tensor`.
//!
//! # The image value
//! A decoded image is a struct that the feed turns into a `[H, W, C]` tensor
//! without copying:
//!
//! | field      | type   | content                                   |
//! |------------|--------|-------------------------------------------|
//! | `height`   | uint32 | rows                                      |
//! | `width`    | uint32 | columns                                   |
//! | `channels` | uint8  | 3 for `rgb`, 4 for `rgba`, 1 for `gray`   |
//! | `pixels`   | binary | `height * width * channels` bytes, HWC    |
//!
//! ```sql
//! SELECT image_decode(image_png).width, image_decode(image_png, 'gray').channels FROM t;
//! -- 32, 1
//! ```
//!
//! # Decoding
//! PNG (8/16-bit, palette, gray, gray+alpha, 1-bit; 16-bit samples are scaled
//! to 8 bits) and JPEG (baseline, progressive, CMYK) through the `image`
//! crate, whose JPEG decoder is zune-jpeg. The EXIF orientation of a JPEG is
//! applied, so pixels come out the way viewers show them.
//!
//! # Decoding only the pixels needed
//! `image_decode(b, mode, completeness, min_height, min_width)` may decode a
//! JPEG at 1/2, 1/4 or 1/8 scale when that still covers `min_height ×
//! min_width` (see [`scaled`]); `image_resize(image_decode(b), h, w)` is
//! rewritten to that form when planned, so pipelines get it without asking.
//!
//! # Bad input
//! A row that cannot be decoded is an error naming the function, the row and
//! the reason; `try_image_decode` returns NULL for it instead. Before any
//! pixel memory is allocated, the declared size is checked against
//! [`DEFAULT_MAX_PIXELS`] (64 megapixels), so a tiny file declaring
//! 100000×100000 pixels, or a PNG that would inflate to gigabytes, is refused
//! rather than allocated. A panic inside a decoder is caught and reported as
//! a decoding error of that row.
//!
//! A truncated or structurally damaged file is an error too, although the
//! decoders would fill in the missing part and return a plausible picture:
//! a JPEG must end with its end-of-image marker after the last scan, a PNG
//! with `IEND`, every PNG chunk's CRC must match (see [`integrity`]). The
//! optional third argument `'partial'` turns this off for one call, for data
//! sets known to hold cut files whose top part is still wanted:
//!
//! ```sql
//! SELECT image_decode(image_jpeg, 'rgb', 'partial') FROM t;
//! ```
//!
//! It is an argument rather than a session setting so that it is visible in
//! the query, travels with the plan to Ballista executors, and is part of
//! every cache key built from the SQL.

use std::io::Cursor;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, StructArray, UInt8Builder, UInt32Builder,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::ScalarValue;
use datafusion::common::{exec_err, plan_datafusion_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use image::{DynamicImage, ImageDecoder, ImageReader, Limits};

use crate::FunctionInfo;

pub mod integrity;
pub mod scaled;
pub mod tensor;
pub mod transform;

pub use integrity::Completeness;

/// Largest image decoded by default: 64 megapixels (8192 × 8192).
pub const DEFAULT_MAX_PIXELS: u64 = 64 << 20;

const DECODE: &str = "image_decode(bytes [, 'rgb' | 'rgba' | 'gray' [, 'complete' | 'partial' \
     [, min_height, min_width]]])";
const TRY_DECODE: &str = "try_image_decode(bytes [, 'rgb' | 'rgba' | 'gray' [, 'complete' | \
     'partial' [, min_height, min_width]]])";

/// The struct type of a decoded image.
pub fn image_type() -> DataType {
    DataType::Struct(image_fields())
}

fn image_fields() -> Fields {
    Fields::from(vec![
        Field::new("height", DataType::UInt32, false),
        Field::new("width", DataType::UInt32, false),
        Field::new("channels", DataType::UInt8, false),
        Field::new("pixels", DataType::Binary, false),
    ])
}

/// The registered functions of this family.
pub fn functions() -> Vec<ScalarUDF> {
    functions_with(DEFAULT_MAX_PIXELS)
}

/// The functions of this family, decoding images of at most `max_pixels`
/// (`width × height`, checked from the header before any allocation).
pub fn functions_with(max_pixels: u64) -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::from(ImageDecodeFunc::new(false, max_pixels)),
        ScalarUDF::from(ImageDecodeFunc::new(true, max_pixels)),
        ScalarUDF::from(transform::ResizeFunc::new()),
        ScalarUDF::from(transform::CropFunc::new(false)),
        ScalarUDF::from(transform::CropFunc::new(true)),
        ScalarUDF::from(transform::RandomFlipFunc::new()),
        ScalarUDF::from(tensor::ToTensorFunc::new()),
    ]
}

/// Listings for `\functions`.
pub fn infos() -> Vec<FunctionInfo> {
    // A 2x2 PNG: red, green / blue, white.
    vec![
        FunctionInfo {
            name: "image_decode",
            family: "image",
            syntax: DECODE,
            description: "PNG/JPEG bytes -> struct(height, width, channels, pixels HWC uint8); EXIF orientation applied; truncated files are errors unless 'partial'; with min_height, min_width a JPEG may decode at 1/2..1/8 scale covering them (image_resize asks for it)",
            arguments: &[
                ("bytes", "binary: an encoded PNG or JPEG"),
                (
                    "'rgb' | 'rgba' | 'gray'",
                    "a constant: the channels to decode to (default 'rgb')",
                ),
                (
                    "'complete' | 'partial'",
                    "a constant: whether a truncated file is an error (default) or decodes what it holds",
                ),
                (
                    "min_height, min_width",
                    "constant integers: a JPEG may decode at a smaller scale that still covers them",
                ),
            ],
            example: "WITH t AS (SELECT X'89504E470D0A1A0A0000000D4948445200000002000000020802000000FDD49A73000000124944415478DA63F8CFC0C000C20CFF8100001FEE05FBF1ABBA770000000049454E44AE426082' AS png) SELECT image_decode(png) AS image FROM t;",
            example_output: "+----------------------------------------------------------------------+\n| image                                                                |\n+----------------------------------------------------------------------+\n| {height: 2, width: 2, channels: 3, pixels: ff000000ff000000ffffffff} |\n+----------------------------------------------------------------------+",
        },
        FunctionInfo {
            name: "try_image_decode",
            family: "image",
            syntax: TRY_DECODE,
            description: "like image_decode, but NULL for bytes that cannot be decoded (truncated files included)",
            arguments: &[
                ("bytes", "binary: an encoded PNG or JPEG"),
                ("…", "as for image_decode"),
            ],
            example: "SELECT try_image_decode(X'00FF') IS NULL AS undecodable;",
            example_output: "+-------------+\n| undecodable |\n+-------------+\n| true        |\n+-------------+",
        },
        FunctionInfo {
            name: "image_resize",
            family: "image",
            syntax: "image_resize(image, height, width [, filter])",
            description: "SIMD resize (bilinear default; nearest, bicubic, lanczos3), antialiased",
            arguments: &[
                ("image", "a decoded image (image_decode)"),
                ("height, width", "constant integers: the output size"),
                (
                    "filter",
                    "a constant: 'bilinear' (default), 'nearest', 'bicubic' or 'lanczos3'",
                ),
            ],
            example: "WITH t AS (SELECT X'89504E470D0A1A0A0000000D4948445200000002000000020802000000FDD49A73000000124944415478DA63F8CFC0C000C20CFF8100001FEE05FBF1ABBA770000000049454E44AE426082' AS png) SELECT image_resize(image_decode(png), 1, 1) AS small FROM t;",
            example_output: "+----------------------------------------------------+\n| small                                              |\n+----------------------------------------------------+\n| {height: 1, width: 1, channels: 3, pixels: 808080} |\n+----------------------------------------------------+",
        },
        FunctionInfo {
            name: "image_center_crop",
            family: "image",
            syntax: "image_center_crop(image, height, width)",
            description: "the centred height x width window of a decoded image",
            arguments: &[
                ("image", "a decoded image"),
                (
                    "height, width",
                    "constant integers: the window, at most the image's size",
                ),
            ],
            example: "WITH t AS (SELECT X'89504E470D0A1A0A0000000D4948445200000002000000020802000000FDD49A73000000124944415478DA63F8CFC0C000C20CFF8100001FEE05FBF1ABBA770000000049454E44AE426082' AS png) SELECT image_center_crop(image_decode(png), 1, 2) AS crop FROM t;",
            example_output: "+----------------------------------------------------------+\n| crop                                                     |\n+----------------------------------------------------------+\n| {height: 1, width: 2, channels: 3, pixels: ff000000ff00} |\n+----------------------------------------------------------+",
        },
        FunctionInfo {
            name: "image_random_crop",
            family: "image",
            syntax: "image_random_crop(image, height, width, seed)",
            description: "a height x width window at an offset reproducible per (seed, image)",
            arguments: &[
                ("image", "a decoded image"),
                ("height, width", "constant integers: the window"),
                (
                    "seed",
                    "a constant integer; in a feed the epoch is mixed in",
                ),
            ],
            example: "WITH t AS (SELECT X'89504E470D0A1A0A0000000D4948445200000002000000020802000000FDD49A73000000124944415478DA63F8CFC0C000C20CFF8100001FEE05FBF1ABBA770000000049454E44AE426082' AS png) SELECT image_random_crop(image_decode(png), 1, 1, 7) AS crop FROM t;",
            example_output: "+----------------------------------------------------+\n| crop                                               |\n+----------------------------------------------------+\n| {height: 1, width: 1, channels: 3, pixels: ff0000} |\n+----------------------------------------------------+",
        },
        FunctionInfo {
            name: "image_random_flip",
            family: "image",
            syntax: "image_random_flip(image, seed)",
            description: "left-right mirror with probability 1/2, reproducible per (seed, image)",
            arguments: &[
                ("image", "a decoded image"),
                (
                    "seed",
                    "a constant integer; in a feed the epoch is mixed in",
                ),
            ],
            example: "WITH t AS (SELECT X'89504E470D0A1A0A0000000D4948445200000002000000020802000000FDD49A73000000124944415478DA63F8CFC0C000C20CFF8100001FEE05FBF1ABBA770000000049454E44AE426082' AS png) SELECT image_random_flip(image_decode(png), 7) AS flipped FROM t;",
            example_output: "+----------------------------------------------------------------------+\n| flipped                                                              |\n+----------------------------------------------------------------------+\n| {height: 2, width: 2, channels: 3, pixels: ff000000ff000000ffffffff} |\n+----------------------------------------------------------------------+",
        },
        FunctionInfo {
            name: "image_to_tensor",
            family: "image",
            syntax: "image_to_tensor(image [, mean, std])",
            description: "struct(channels, height, width, values float32 CHW = (pixel/255 - mean) / std)",
            arguments: &[
                ("image", "a decoded image"),
                (
                    "mean, std",
                    "constant lists, one number per channel (default 0 and 1)",
                ),
            ],
            example: "WITH t AS (SELECT X'89504E470D0A1A0A0000000D4948445200000002000000020802000000FDD49A73000000124944415478DA63F8CFC0C000C20CFF8100001FEE05FBF1ABBA770000000049454E44AE426082' AS png) SELECT image_to_tensor(image_decode(png))['values'] AS chw FROM t;",
            example_output: "+--------------------------------------------------------------+\n| chw                                                          |\n+--------------------------------------------------------------+\n| [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0] |\n+--------------------------------------------------------------+",
        },
    ]
}

/// Channel layout requested from `image_decode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Rgb,
    Rgba,
    Gray,
}

impl Mode {
    fn parse(function: &str, value: Option<&ScalarValue>) -> Result<Self> {
        let text = match value {
            None => return Ok(Mode::Rgb),
            Some(
                ScalarValue::Utf8(Some(s))
                | ScalarValue::Utf8View(Some(s))
                | ScalarValue::LargeUtf8(Some(s)),
            ) => s,
            Some(other) => {
                return plan_err!(
                    "{function}: mode must be a constant 'rgb', 'rgba' or 'gray', got {other}"
                );
            }
        };
        match text.to_ascii_lowercase().as_str() {
            "rgb" => Ok(Mode::Rgb),
            "rgba" => Ok(Mode::Rgba),
            "gray" | "grey" | "l" => Ok(Mode::Gray),
            other => plan_err!(
                "{function}: unknown mode '{other}', use 'rgb', 'rgba' or 'gray'"
            ),
        }
    }

    fn convert(self, image: DynamicImage) -> (u8, Vec<u8>) {
        match self {
            Mode::Rgb => (3, image.into_rgb8().into_raw()),
            Mode::Rgba => (4, image.into_rgba8().into_raw()),
            Mode::Gray => (1, image.into_luma8().into_raw()),
        }
    }
}

impl Completeness {
    fn parse(function: &str, value: &ScalarValue) -> Result<Self> {
        let text = match value {
            ScalarValue::Utf8(Some(s))
            | ScalarValue::Utf8View(Some(s))
            | ScalarValue::LargeUtf8(Some(s)) => s,
            other => {
                return plan_err!(
                    "{function}: the third argument must be a constant 'complete' or \
                     'partial', got {other}"
                );
            }
        };
        match text.to_ascii_lowercase().as_str() {
            "complete" => Ok(Completeness::Required),
            "partial" => Ok(Completeness::AllowPartial),
            other => plan_err!(
                "{function}: unknown third argument '{other}', use 'complete' (the \
                 default: truncated files are errors) or 'partial'"
            ),
        }
    }
}

/// Decodes one complete encoded image; the error says why, for the row
/// message.
pub fn decode_image(
    bytes: &[u8],
    max_pixels: u64,
) -> std::result::Result<DynamicImage, String> {
    decode_image_with(bytes, max_pixels, Completeness::Required)
}

/// Images decoded by this process so far (every call of
/// [`decode_image_with`] that got as far as decoding pixels, failed or not):
/// a cost counter for tests and benchmarks that check how many images an
/// engine decodes before it delivers (counting, unlike timing, does not
/// depend on the machine).
static IMAGES_DECODED: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// See [`IMAGES_DECODED`].
pub fn images_decoded() -> u64 {
    IMAGES_DECODED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts one decode in [`IMAGES_DECODED`].
fn count_decode() {
    IMAGES_DECODED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Decodes one encoded image at a reduced JPEG scale that still covers
/// `min_height × min_width` when that is possible (see [`scaled`]), else at
/// full size.
pub fn decode_image_at_least(
    bytes: &[u8],
    max_pixels: u64,
    completeness: Completeness,
    min_height: u32,
    min_width: u32,
) -> std::result::Result<DynamicImage, String> {
    if !bytes.is_empty() {
        if completeness == Completeness::Required {
            integrity::check_complete(bytes)?;
        }
        if let Some(image) =
            scaled::decode_jpeg_at_least(bytes, max_pixels, min_height, min_width)?
        {
            return Ok(image);
        }
        // Checked above already.
        return decode_image_with(bytes, max_pixels, Completeness::AllowPartial);
    }
    decode_image_with(bytes, max_pixels, completeness)
}

/// Decodes one encoded image, requiring a complete file or not.
pub fn decode_image_with(
    bytes: &[u8],
    max_pixels: u64,
    completeness: Completeness,
) -> std::result::Result<DynamicImage, String> {
    if bytes.is_empty() {
        return Err("the value is empty".into());
    }
    if completeness == Completeness::Required {
        integrity::check_complete(bytes)?;
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| e.to_string())?;
    if reader.format().is_none() {
        return Err("not a PNG or JPEG image (unknown signature)".into());
    }
    let mut limits = Limits::default();
    // Decoders allocate a few buffers of the image size; 4 bytes per pixel
    // covers RGBA8, 16-bit images hit the pixel check first.
    limits.max_alloc = Some(max_pixels.saturating_mul(8));
    let mut reader = reader;
    reader.limits(limits);
    let mut decoder = reader.into_decoder().map_err(|e| e.to_string())?;
    let (width, height) = decoder.dimensions();
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(format!(
            "{width}x{height} pixels is more than the limit of {max_pixels} pixels"
        ));
    }
    let orientation = decoder.orientation().map_err(|e| e.to_string())?;
    count_decode();
    let mut image = DynamicImage::from_decoder(decoder).map_err(|e| e.to_string())?;
    image.apply_orientation(orientation);
    Ok(image)
}

/// `image_decode` and `try_image_decode`; see the module docs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ImageDecodeFunc {
    /// NULL instead of an error for undecodable rows.
    lenient: bool,
    /// Largest accepted `width * height`.
    max_pixels: u64,
    signature: Signature,
}

impl ImageDecodeFunc {
    /// `image_decode` (`lenient = false`) or `try_image_decode`.
    pub fn new(lenient: bool, max_pixels: u64) -> Self {
        Self {
            lenient,
            max_pixels,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }

    fn syntax(&self) -> &'static str {
        if self.lenient { TRY_DECODE } else { DECODE }
    }

    /// Largest accepted `width * height` (the session's image pixel limit).
    pub fn max_pixels(&self) -> u64 {
        self.max_pixels
    }

    /// A constant `min_height` / `min_width` argument as pixels.
    fn size_argument(&self, value: &ColumnarValue, what: &str) -> Result<u32> {
        let pixels = match value {
            ColumnarValue::Scalar(ScalarValue::Int64(Some(v))) => u32::try_from(*v).ok(),
            _ => None,
        };
        pixels.ok_or_else(|| {
            plan_datafusion_err!(
                "{}: {what} must be a constant number of pixels (0 to {}), got {value}; \
                 signature: {}",
                self.name(),
                u32::MAX,
                self.syntax()
            )
        })
    }
}

impl ScalarUDFImpl for ImageDecodeFunc {
    crate::function_basics!(if lenient {
        "try_image_decode"
    } else {
        "image_decode"
    });

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let plan_error = |what: String| {
            plan_datafusion_err!("{}: {what}; signature: {}", self.name(), self.syntax())
        };
        if !matches!(arg_types.len(), 1..=3 | 5) {
            return Err(plan_error(format!(
                "takes 1 to 3 or 5 arguments, got {}",
                arg_types.len()
            )));
        }
        match &arg_types[0] {
            DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::Null => {}
            other => {
                return Err(plan_error(format!("bytes must be binary, got {other}")));
            }
        }
        for (i, what) in [(1, "mode"), (2, "the third argument")] {
            if let Some(t) = arg_types.get(i)
                && !matches!(t, DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8)
            {
                return Err(plan_error(format!("{what} must be a string, got {t}")));
            }
        }
        for (i, what) in [(3, "min_height"), (4, "min_width")] {
            if let Some(t) = arg_types.get(i)
                && !t.is_integer()
            {
                return Err(plan_error(format!("{what} must be an integer, got {t}")));
            }
        }
        let mut types = vec![DataType::BinaryView];
        types.extend(arg_types[1..].iter().take(2).map(|_| DataType::Utf8));
        types.extend(arg_types.iter().skip(3).map(|_| DataType::Int64));
        Ok(types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(image_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let mode = match args.args.get(1) {
            None => Mode::Rgb,
            Some(ColumnarValue::Scalar(v)) => Mode::parse(self.name(), Some(v))?,
            Some(ColumnarValue::Array(_)) => {
                return plan_err!(
                    "{}: mode must be a constant; signature: {}",
                    self.name(),
                    self.syntax()
                );
            }
        };
        let completeness = match args.args.get(2) {
            None => Completeness::Required,
            Some(ColumnarValue::Scalar(v)) => Completeness::parse(self.name(), v)?,
            Some(ColumnarValue::Array(_)) => {
                return plan_err!(
                    "{}: the third argument must be a constant; signature: {}",
                    self.name(),
                    self.syntax()
                );
            }
        };
        let min_size = match (args.args.get(3), args.args.get(4)) {
            (Some(h), Some(w)) => Some((
                self.size_argument(h, "min_height")?,
                self.size_argument(w, "min_width")?,
            )),
            _ => None,
        };
        let bytes = args.args[0].to_array(args.number_rows)?;
        let bytes = bytes.as_binary_view();
        let mut heights = UInt32Builder::with_capacity(bytes.len());
        let mut widths = UInt32Builder::with_capacity(bytes.len());
        let mut channels = UInt8Builder::with_capacity(bytes.len());
        let mut pixels = BinaryBuilder::new();
        let mut valid = Vec::with_capacity(bytes.len());
        for (row, value) in bytes.iter().enumerate() {
            let decoded = value.map(|b| {
                std::panic::catch_unwind(AssertUnwindSafe(|| match min_size {
                    Some((h, w)) => {
                        decode_image_at_least(b, self.max_pixels, completeness, h, w)
                    }
                    None => decode_image_with(b, self.max_pixels, completeness),
                }))
                .unwrap_or_else(|_| Err("the decoder panicked on this data".into()))
            });
            match decoded {
                Some(Ok(image)) => {
                    heights.append_value(image.height());
                    widths.append_value(image.width());
                    let (c, data) = mode.convert(image);
                    channels.append_value(c);
                    pixels.append_value(data);
                    valid.push(true);
                }
                Some(Err(reason)) if !self.lenient => {
                    let value = value.unwrap_or_default();
                    let head: String =
                        value.iter().take(8).map(|b| format!("{b:02x}")).collect();
                    return exec_err!(
                        "image_decode: cannot decode row {row} ({} bytes starting {head}): \
                         {reason}. Use try_image_decode to get NULL for such rows",
                        value.len()
                    );
                }
                _ => {
                    heights.append_value(0);
                    widths.append_value(0);
                    channels.append_value(0);
                    pixels.append_value([]);
                    valid.push(false);
                }
            }
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(heights.finish()),
            Arc::new(widths.finish()),
            Arc::new(channels.finish()),
            Arc::new(pixels.finish()),
        ];
        let nulls = NullBuffer::from(valid);
        let nulls = (nulls.null_count() > 0).then_some(nulls);
        Ok(ColumnarValue::Array(Arc::new(StructArray::try_new(
            image_fields(),
            columns,
            nulls,
        )?)))
    }
}

#[cfg(test)]
mod tests;
