//! Scaled JPEG decoding: decode only the pixels a resize needs.
//!
//! A JPEG stores 8×8 blocks of DCT coefficients; an inverse DCT of 4×4, 2×2
//! or 1×1 of them yields the block at 1/2, 1/4 or 1/8 of its size directly,
//! skipping most of the IDCT and colour conversion work (libjpeg-turbo's
//! `scale_num/scale_denom`, Pillow's `draft`). `image_decode(b, mode,
//! completeness, min_height, min_width)` decodes at the smallest such scale
//! whose size still covers `min_height × min_width`, and `image_resize`
//! rewrites `image_resize(image_decode(b, …), h, w)` to pass its target
//! size down (see `ResizeFunc::simplify`). The resize then scales that
//! smaller image to exactly `h × w`.
//!
//! # Which decoder
//! zune-jpeg (the `image` crate's JPEG decoder, used for every full-size
//! decode) has no scaled mode; jpeg-decoder has one. Measured on this
//! project's photo benchmark data on one core (scripts/bench/photos.py,
//! decode + bilinear resize): 128→64 11,100/s scaled vs 8,100/s full with
//! zune (1.37×), 256→64 3,980/s vs 2,710/s (1.47×), 256→128 3,200/s vs
//! 2,550/s (1.26×). At full size jpeg-decoder is slower than zune, and for
//! outputs above 128×128 it starts threads per image, so the scaled path is
//! taken only when it reduces and its output is at most
//! [`MAX_SCALED_PIXELS`]; otherwise the full-size decoder runs.
//!
//! # Tolerance
//! A reduced IDCT drops each block's high frequencies instead of filtering
//! decoded pixels, and chroma is not upsampled first, so results differ
//! from full decode + resize, most where the reduced image already has the
//! target size (no resize smooths it further). On this project's photograph
//! fixtures (`udfs/tests/data/photos`), per channel of 255 levels: 128→64
//! and 256→32 mean 1.4–5.9, 99th percentile 13–32; when the reduced image
//! is resized further (→40×24) mean 0.3–1.8, 99th percentile ≤ 11. The
//! tests bound mean ≤ 6.5 and 99th percentile ≤ 36. For the full-size path
//! in any case, call `image_decode(b, mode, completeness, 0, 0)`.
//!
//! # What falls back
//! Not a JPEG, no reduction possible, CMYK or 16-bit JPEGs, and anything
//! jpeg-decoder refuses: the full-size path decides (and reports errors the
//! way it always does).

use image::metadata::Orientation;
use image::{DynamicImage, GrayImage, RgbImage};
use jpeg_decoder::{Decoder, PixelFormat};

/// Largest scaled output decoded by jpeg-decoder: beyond this it hands the
/// image to worker threads of its own, which costs more than it saves when
/// sqlfeed already decodes many images in parallel.
pub const MAX_SCALED_PIXELS: u64 = 128 * 128;

/// Whether `bytes` start like a JPEG (SOI marker).
fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xFF, 0xD8, 0xFF])
}

/// Whether an EXIF orientation turns the image by 90 or 270 degrees, so
/// that stored rows become displayed columns.
fn swaps_axes(orientation: Orientation) -> bool {
    matches!(
        orientation,
        Orientation::Rotate90
            | Orientation::Rotate270
            | Orientation::Rotate90FlipH
            | Orientation::Rotate270FlipH
    )
}

/// `bytes` decoded at the smallest DCT scale (1/8, 1/4, 1/2) whose result,
/// as displayed (EXIF orientation applied), is at least `min_height ×
/// min_width`; `Ok(None)` when the scaled path does not apply (see the
/// module docs) and the caller should decode at full size.
pub fn decode_jpeg_at_least(
    bytes: &[u8],
    max_pixels: u64,
    min_height: u32,
    min_width: u32,
) -> Result<Option<DynamicImage>, String> {
    if !is_jpeg(bytes) || min_height == 0 || min_width == 0 {
        return Ok(None);
    }
    let mut decoder = Decoder::new(bytes);
    if decoder.read_info().is_err() {
        return Ok(None);
    }
    let Some(info) = decoder.info() else {
        return Ok(None);
    };
    if u64::from(info.width) * u64::from(info.height) > max_pixels {
        // The full-size path reports it, with the same words as always.
        return Ok(None);
    }
    if !matches!(info.pixel_format, PixelFormat::RGB24 | PixelFormat::L8) {
        return Ok(None);
    }
    let orientation = decoder
        .exif_data()
        .and_then(Orientation::from_exif_chunk)
        .unwrap_or(Orientation::NoTransforms);
    let (stored_height, stored_width) = if swaps_axes(orientation) {
        (min_width, min_height)
    } else {
        (min_height, min_width)
    };
    // jpeg-decoder's scale covers the request "in at least one axis"; ask
    // for the larger relative side so that both are covered.
    let need = |min: u32, have: u16| f64::from(min) / f64::from(have.max(1));
    let factor = need(stored_height, info.height).max(need(stored_width, info.width));
    if factor > 0.5 {
        // No reduction: 1/2 would already be too small.
        return Ok(None);
    }
    let request_w = (f64::from(info.width) * factor).ceil().max(1.0) as u16;
    let request_h = (f64::from(info.height) * factor).ceil().max(1.0) as u16;
    let Ok((width, height)) = decoder.scale(request_w, request_h) else {
        return Ok(None);
    };
    if u32::from(width) < stored_width
        || u32::from(height) < stored_height
        || u64::from(width) * u64::from(height) > MAX_SCALED_PIXELS
        || (width, height) == (info.width, info.height)
    {
        return Ok(None);
    }
    super::count_decode();
    let Ok(pixels) = decoder.decode() else {
        return Ok(None);
    };
    let (width, height) = (u32::from(width), u32::from(height));
    let image = match info.pixel_format {
        PixelFormat::RGB24 => {
            RgbImage::from_raw(width, height, pixels).map(DynamicImage::from)
        }
        PixelFormat::L8 => {
            GrayImage::from_raw(width, height, pixels).map(DynamicImage::from)
        }
        _ => None,
    };
    let Some(mut image) = image else {
        return Ok(None);
    };
    image.apply_orientation(orientation);
    Ok(Some(image))
}
