//! Tests of the image functions with exact expected pixels.

use datafusion::arrow::array::{Array, AsArray, BinaryArray, RecordBatch, StructArray};
use datafusion::arrow::datatypes::{UInt8Type, UInt32Type};
use datafusion::error::Result;
use datafusion::prelude::SessionContext;
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};
use std::sync::Arc;

use super::*;

/// `image_decode(b, mode)` over a table of blobs, with `udf` registered.
async fn decode_with(
    udf: ScalarUDF,
    blobs: Vec<Option<Vec<u8>>>,
    mode: &str,
) -> Result<StructArray> {
    let ctx = SessionContext::new();
    ctx.register_udf(udf.clone());
    let array = BinaryArray::from_iter(blobs);
    let batch = RecordBatch::try_from_iter(vec![("b", Arc::new(array) as ArrayRef)])?;
    ctx.register_batch("t", batch)?;
    let sql = format!("SELECT {}(b, '{mode}') FROM t", udf.name());
    let batches = ctx.sql(&sql).await?.collect().await?;
    Ok(batches[0].column(0).as_struct().clone())
}

async fn decode(blobs: Vec<Option<Vec<u8>>>, mode: &str) -> Result<StructArray> {
    decode_with(
        ScalarUDF::from(ImageDecodeFunc::new(false, DEFAULT_MAX_PIXELS)),
        blobs,
        mode,
    )
    .await
}

fn png(width: u32, height: u32, pixels: &[u8], color: ExtendedColorType) -> Vec<u8> {
    let mut out = Vec::new();
    PngEncoder::new(&mut out)
        .write_image(pixels, width, height, color)
        .expect("valid test image");
    out
}

fn fields(image: &StructArray, row: usize) -> (u32, u32, u8, Vec<u8>) {
    (
        image.column(0).as_primitive::<UInt32Type>().value(row),
        image.column(1).as_primitive::<UInt32Type>().value(row),
        image.column(2).as_primitive::<UInt8Type>().value(row),
        image.column(3).as_binary::<i32>().value(row).to_vec(),
    )
}

#[tokio::test]
async fn png_rgb8_and_rgb16_decode_pixel_exact() -> Result<()> {
    // 3 wide, 2 high, HWC.
    let rgb: Vec<u8> = (0..18).map(|i| (i * 13) as u8).collect();
    let wide: Vec<u8> = rgb
        .iter()
        .flat_map(|v| (u16::from(*v) * 257).to_be_bytes())
        .collect();
    let image = decode(
        vec![
            Some(png(3, 2, &rgb, ExtendedColorType::Rgb8)),
            Some(png(3, 2, &wide, ExtendedColorType::Rgb16)),
            None,
        ],
        "rgb",
    )
    .await?;
    assert_eq!(fields(&image, 0), (2, 3, 3, rgb.clone()));
    assert_eq!(fields(&image, 1), (2, 3, 3, rgb));
    assert!(image.is_null(2));
    Ok(())
}

#[tokio::test]
async fn modes_convert_channels() -> Result<()> {
    // Gray pixels stay their value in every mode; alpha becomes 255.
    let gray_alpha = [10u8, 255, 200, 255];
    let blob = png(2, 1, &gray_alpha, ExtendedColorType::La8);
    let rgba = decode(vec![Some(blob.clone())], "rgba").await?;
    assert_eq!(
        fields(&rgba, 0),
        (1, 2, 4, vec![10, 10, 10, 255, 200, 200, 200, 255])
    );
    let gray = decode(vec![Some(blob)], "gray").await?;
    assert_eq!(fields(&gray, 0), (1, 2, 1, vec![10, 200]));
    Ok(())
}

#[tokio::test]
async fn jpeg_decodes_close_to_the_source() -> Result<()> {
    let (w, h) = (16u32, 8u32);
    let source: Vec<u8> = (0..w * h).flat_map(|_| [200u8, 40, 90]).collect();
    let mut jpeg = Vec::new();
    JpegEncoder::new_with_quality(&mut jpeg, 100)
        .write_image(&source, w, h, ExtendedColorType::Rgb8)
        .expect("encodes");
    let image = decode(vec![Some(jpeg)], "rgb").await?;
    let (height, width, channels, pixels) = fields(&image, 0);
    assert_eq!((height, width, channels), (8, 16, 3));
    let worst = pixels
        .iter()
        .zip(&source)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap_or(0);
    assert!(worst <= 4, "JPEG round trip off by {worst}");
    Ok(())
}

/// A JPEG with an APP1 EXIF segment saying orientation 6 (rotate 90° clockwise).
fn jpeg_with_orientation(width: u32, height: u32, orientation: u16) -> Vec<u8> {
    let pixels: Vec<u8> = (0..width * height)
        .flat_map(|i| [(i * 30) as u8, 0, 0])
        .collect();
    let mut jpeg = Vec::new();
    JpegEncoder::new_with_quality(&mut jpeg, 100)
        .write_image(&pixels, width, height, ExtendedColorType::Rgb8)
        .expect("encodes");
    let mut tiff = b"II*\0\x08\0\0\0".to_vec(); // little-endian TIFF, IFD at 8
    tiff.extend_from_slice(&1u16.to_le_bytes()); // one entry
    tiff.extend_from_slice(&0x0112u16.to_le_bytes()); // Orientation
    tiff.extend_from_slice(&3u16.to_le_bytes()); // SHORT
    tiff.extend_from_slice(&1u32.to_le_bytes()); // count
    tiff.extend_from_slice(&orientation.to_le_bytes());
    tiff.extend_from_slice(&[0, 0]); // value padding
    tiff.extend_from_slice(&0u32.to_le_bytes()); // no next IFD
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend_from_slice(&tiff);
    let mut out = jpeg[..2].to_vec(); // SOI
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&app1);
    out.extend_from_slice(&jpeg[2..]);
    out
}

#[tokio::test]
async fn exif_orientation_is_applied() -> Result<()> {
    let image = decode(
        vec![
            Some(jpeg_with_orientation(4, 2, 6)),
            Some(jpeg_with_orientation(4, 2, 1)),
        ],
        "rgb",
    )
    .await?;
    let (height, width, _, _) = fields(&image, 0);
    assert_eq!((height, width), (4, 2), "orientation 6 turns 4x2 into 2x4");
    let (height, width, _, _) = fields(&image, 1);
    assert_eq!((height, width), (2, 4));
    Ok(())
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A 60-byte PNG whose header declares `width` × `height` RGB pixels,
/// followed by an empty image-data stream: decoded, it would be 30 GB.
fn png_declaring(width: u32, height: u32) -> Vec<u8> {
    let chunk = |kind: &[u8], data: &[u8]| {
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
        out
    };
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(chunk(b"IHDR", &ihdr));
    out.extend(chunk(
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    ));
    out.extend(chunk(b"IEND", &[]));
    out
}

#[tokio::test]
async fn bad_bytes_name_function_row_and_reason() -> Result<()> {
    let good = png(1, 1, &[1, 2, 3], ExtendedColorType::Rgb8);
    let mut jpeg = Vec::new();
    JpegEncoder::new_with_quality(&mut jpeg, 90)
        .write_image(&[9u8; 64 * 64 * 3], 64, 64, ExtendedColorType::Rgb8)
        .expect("encodes");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"definitely not an image".to_vec(), "unknown signature"),
        (vec![], "empty"),
        (
            png_declaring(100_000, 100_000),
            "100000x100000 pixels is more than the limit",
        ),
        (good[..good.len() / 2].to_vec(), ""),
        (jpeg[..jpeg.len() / 3].to_vec(), ""),
    ];
    for (i, (blob, reason)) in cases.into_iter().enumerate() {
        let err = decode(vec![Some(good.clone()), Some(blob)], "rgb")
            .await
            .expect_err(&format!("case {i} decodes"))
            .to_string();
        assert!(
            err.contains("image_decode: cannot decode row 1"),
            "case {i}: {err}"
        );
        assert!(err.contains(reason), "case {i}: {err}");
        assert!(err.contains("try_image_decode"), "case {i}: {err}");
    }
    Ok(())
}

#[tokio::test]
async fn try_image_decode_gives_null_and_limits_hold() -> Result<()> {
    let good = png(1, 1, &[1, 2, 3], ExtendedColorType::Rgb8);
    let lenient = ScalarUDF::from(ImageDecodeFunc::new(true, DEFAULT_MAX_PIXELS));
    let image =
        decode_with(lenient, vec![Some(b"junk".to_vec()), Some(good)], "rgb").await?;
    assert!(image.is_null(0));
    assert_eq!(fields(&image, 1), (1, 1, 3, vec![1, 2, 3]));
    // A configured limit refuses a 10x10 image before decoding it.
    let strict = ScalarUDF::from(ImageDecodeFunc::new(false, 99));
    let blob = png(10, 10, &[0u8; 300], ExtendedColorType::Rgb8);
    let err = decode_with(strict, vec![Some(blob)], "rgb")
        .await
        .expect_err("over limit");
    assert!(
        err.to_string()
            .contains("10x10 pixels is more than the limit of 99"),
        "{err}"
    );
    Ok(())
}

#[tokio::test]
async fn wrong_arguments_are_plan_errors() {
    let ctx = SessionContext::new();
    crate::register_all(&ctx).expect("registers");
    for (sql, expected) in [
        ("SELECT image_decode('text')", "bytes must be binary"),
        ("SELECT image_decode(X'00', 'cmyk')", "unknown mode 'cmyk'"),
        ("SELECT image_decode()", "takes 1 to 3 or 5 arguments"),
        (
            "SELECT image_decode(X'00', 'rgb', 'sloppy')",
            "unknown third argument 'sloppy'",
        ),
    ] {
        let err = match ctx.sql(sql).await {
            Ok(df) => df.collect().await.expect_err(sql).to_string(),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(expected), "{sql}: {err}");
    }
}

/// Runs `expr` (with `b` bound to each blob) over a table of PNG blobs.
/// Asserts that [`eval`] of `expr` over `blobs` fails saying `expected`.
async fn eval_error(blobs: Vec<Vec<u8>>, expr: &str, expected: &str) {
    let err = eval(blobs, expr).await.expect_err(expr).to_string();
    assert!(err.contains(expected), "{expr}: {err}");
}

async fn eval(blobs: Vec<Vec<u8>>, expr: &str) -> Result<ArrayRef> {
    let ctx = SessionContext::new();
    crate::register_all(&ctx)?;
    let array = BinaryArray::from_iter_values(blobs);
    let batch = RecordBatch::try_from_iter(vec![("b", Arc::new(array) as ArrayRef)])?;
    ctx.register_batch("t", batch)?;
    let batches = ctx
        .sql(&format!("SELECT {expr} FROM t"))
        .await?
        .collect()
        .await?;
    let batch =
        datafusion::arrow::compute::concat_batches(&batches[0].schema(), &batches)?;
    Ok(Arc::clone(batch.column(0)))
}

#[tokio::test]
async fn center_crop_takes_the_middle_window() -> Result<()> {
    // 4x4 RGB, every byte its own index.
    let pixels: Vec<u8> = (0..48).collect();
    let out = eval(
        vec![png(4, 4, &pixels, ExtendedColorType::Rgb8)],
        "image_center_crop(image_decode(b), 2, 2)",
    )
    .await?;
    let expected: Vec<u8> = [(1, 1), (1, 2), (2, 1), (2, 2)]
        .iter()
        .flat_map(|(y, x)| (0..3).map(move |c| (y * 12 + x * 3 + c) as u8))
        .collect();
    assert_eq!(fields(out.as_struct(), 0), (2, 2, 3, expected));
    eval_error(
        vec![png(1, 1, &[0, 0, 0], ExtendedColorType::Rgb8)],
        "image_center_crop(image_decode(b), 2, 2)",
        "row 0 is 1x1, smaller than the 2x2 crop",
    )
    .await;
    Ok(())
}

#[tokio::test]
async fn random_flip_is_reproducible_mirrors_and_varies_by_image() -> Result<()> {
    let blobs: Vec<Vec<u8>> = (0..64u8)
        .map(|i| png(3, 1, &[i, 1, 2, 3, 4, 5, 6, 7, 8], ExtendedColorType::Rgb8))
        .collect();
    let a = eval(blobs.clone(), "image_random_flip(image_decode(b), 7)").await?;
    let b = eval(blobs.clone(), "image_random_flip(image_decode(b), 7)").await?;
    let c = eval(blobs, "image_random_flip(image_decode(b), 8)").await?;
    assert_eq!(a.as_ref(), b.as_ref(), "same seed, same flips");
    let mut flipped = 0;
    for row in 0..64 {
        let (_, _, _, got) = fields(a.as_struct(), row);
        let original = vec![row as u8, 1, 2, 3, 4, 5, 6, 7, 8];
        let mirrored = vec![6, 7, 8, 3, 4, 5, row as u8, 1, 2];
        assert!(got == original || got == mirrored, "row {row}: {got:?}");
        flipped += usize::from(got == mirrored);
    }
    assert!((16..=48).contains(&flipped), "{flipped} of 64 flipped");
    assert_ne!(a.as_ref(), c.as_ref(), "another seed, other flips");
    Ok(())
}

#[tokio::test]
async fn to_tensor_is_chw_scaled_and_normalised() -> Result<()> {
    let blob = png(2, 1, &[0, 51, 102, 255, 204, 153], ExtendedColorType::Rgb8);
    let values = |out: &ArrayRef| -> Vec<f32> {
        let tensor = out.as_struct();
        let list = tensor.column(3).as_list::<i32>().value(0);
        list.as_primitive::<datafusion::arrow::datatypes::Float32Type>()
            .values()
            .to_vec()
    };
    let plain = eval(vec![blob.clone()], "image_to_tensor(image_decode(b))").await?;
    let expected = [0.0, 1.0, 0.2, 0.8, 0.4, 0.6];
    for (got, want) in values(&plain).iter().zip(expected) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
    let shape = plain.as_struct();
    assert_eq!(shape.column(0).as_primitive::<UInt8Type>().value(0), 3);
    assert_eq!(shape.column(1).as_primitive::<UInt32Type>().value(0), 1);
    assert_eq!(shape.column(2).as_primitive::<UInt32Type>().value(0), 2);
    let normalised = eval(
        vec![blob.clone()],
        "image_to_tensor(image_decode(b), [0.5, 0.5, 0.0], [0.5, 0.5, 2.0])",
    )
    .await?;
    let want = [-1.0, 1.0, -0.6, 0.6, 0.2, 0.3];
    for (got, want) in values(&normalised).iter().zip(want) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
    eval_error(
        vec![blob],
        "image_to_tensor(image_decode(b), [0.5, 0.5], [1.0])",
        "mean has 2 values but the image in row 0 has 3 channels",
    )
    .await;
    Ok(())
}

#[tokio::test]
async fn random_crop_is_a_reproducible_window_that_varies_by_image() -> Result<()> {
    // 8x8 gray images whose pixel value encodes its position (plus an id).
    let blobs: Vec<Vec<u8>> = (0..32u8)
        .map(|id| {
            let mut pixels: Vec<u8> = (0..64).map(|i| i as u8).collect();
            pixels[0] = 200 + id % 50;
            png(8, 8, &pixels, ExtendedColorType::L8)
        })
        .collect();
    let expr = "image_random_crop(image_decode(b, 'gray'), 3, 2, 11)";
    let a = eval(blobs.clone(), expr).await?;
    assert_eq!(a.as_ref(), eval(blobs, expr).await?.as_ref());
    let mut offsets = std::collections::HashSet::new();
    for row in 0..32 {
        let (h, w, c, pixels) = fields(a.as_struct(), row);
        assert_eq!((h, w, c), (3, 2, 1));
        // A real window: consecutive columns, rows 8 apart (ignoring pixel 0).
        // Window pixel (1, 1) is image pixel (top + 1, left + 1).
        let (top, left) = ((pixels[3] / 8) as usize - 1, (pixels[3] % 8) as usize - 1);
        for y in 0..3 {
            for x in 0..2 {
                let at = (top + y) * 8 + left + x;
                if at != 0 {
                    assert_eq!(pixels[y * 2 + x], at as u8, "row {row}");
                }
            }
        }
        offsets.insert((top, left));
    }
    assert!(offsets.len() > 5, "offsets barely vary: {offsets:?}");
    Ok(())
}

#[tokio::test]
async fn resize_keeps_flat_colours_and_nearest_picks_pixels() -> Result<()> {
    let flat = png(7, 5, &[10u8, 120, 240].repeat(35), ExtendedColorType::Rgb8);
    for filter in ["bilinear", "nearest", "bicubic", "lanczos3"] {
        let out = eval(
            vec![flat.clone()],
            &format!("image_resize(image_decode(b), 3, 4, '{filter}')"),
        )
        .await?;
        assert_eq!(
            fields(out.as_struct(), 0),
            (3, 4, 3, [10u8, 120, 240].repeat(12)),
            "{filter}"
        );
        let up = eval(
            vec![flat.clone()],
            &format!("image_resize(image_decode(b), 10, 14, '{filter}')"),
        )
        .await?;
        assert_eq!(
            fields(up.as_struct(), 0),
            (10, 14, 3, [10u8, 120, 240].repeat(140)),
            "{filter}"
        );
    }
    // 4x4 gray with distinct values, nearest to 2x2: one source pixel per output pixel.
    let gray: Vec<u8> = (0..16).map(|i| i * 10).collect();
    let out = eval(
        vec![png(4, 4, &gray, ExtendedColorType::L8)],
        "image_resize(image_decode(b, 'gray'), 2, 2, 'nearest')",
    )
    .await?;
    let (h, w, c, pixels) = fields(out.as_struct(), 0);
    assert_eq!((h, w, c), (2, 2, 1));
    assert!(pixels.iter().all(|p| gray.contains(p)), "{pixels:?}");
    assert!(pixels.windows(2).all(|p| p[0] < p[1]), "{pixels:?}");
    let zero_height = "image_resize(image_decode(b), 0, 4)";
    eval_error(vec![flat], zero_height, "height must be in 1..=65535").await;
    Ok(())
}

/// A PNG with a palette (`bits` per index) or 1-bit grayscale, via the `png`
/// crate: `image` cannot write these.
fn png_raw(
    width: u32,
    height: u32,
    color: png::ColorType,
    bits: png::BitDepth,
    palette: Option<&[u8]>,
    data: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(color);
        encoder.set_depth(bits);
        if let Some(palette) = palette {
            encoder.set_palette(palette.to_vec());
        }
        let mut writer = encoder.write_header().expect("png header");
        writer.write_image_data(data).expect("png data");
    }
    out
}

#[tokio::test]
async fn palette_one_bit_and_gray_alpha_pngs_decode_pixel_exact() -> Result<()> {
    // 3×2, 2-bit indices into red, green, blue, white.
    let palette = [255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255];
    let indexed = png_raw(
        3,
        2,
        png::ColorType::Indexed,
        png::BitDepth::Two,
        Some(&palette),
        &[0b0001_1000, 0b1110_0100],
    );
    // 10×1 1-bit gray: 1011001110.
    let bits = png_raw(
        10,
        1,
        png::ColorType::Grayscale,
        png::BitDepth::One,
        None,
        &[0b1011_0011, 0b1000_0000],
    );
    let gray_alpha = png(2, 1, &[10, 200, 250, 0], ExtendedColorType::La8);

    let image = decode(vec![Some(indexed)], "rgb").await?;
    let expected = [
        255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255, 0, 0, 255, 0, 255, 0,
    ];
    assert_eq!(fields(&image, 0), (2, 3, 3, expected.to_vec()));

    let image = decode(vec![Some(bits.clone())], "gray").await?;
    let gray = [255, 0, 255, 255, 0, 0, 255, 255, 255, 0];
    assert_eq!(fields(&image, 0), (1, 10, 1, gray.to_vec()));
    let image = decode(vec![Some(bits)], "rgb").await?;
    let rgb: Vec<u8> = gray.iter().flat_map(|&g| [g, g, g]).collect();
    assert_eq!(fields(&image, 0), (1, 10, 3, rgb));

    let image = decode(vec![Some(gray_alpha)], "rgba").await?;
    assert_eq!(
        fields(&image, 0),
        (1, 2, 4, vec![10, 10, 10, 200, 250, 250, 250, 0])
    );
    Ok(())
}

fn worst_error(pixels: &[u8], expected: &[u8]) -> u8 {
    pixels
        .iter()
        .zip(expected)
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn cmyk_and_progressive_jpegs_decode_to_the_right_colours() -> Result<()> {
    use jpeg_encoder::{ColorType, Encoder};
    // Left half cyan (C=255), right half white (no ink), 16×8.
    let (w, h) = (16u16, 8u16);
    let cmyk: Vec<u8> = (0..w as usize * h as usize)
        .flat_map(|i| {
            if i % (w as usize) < 8 {
                [255u8, 0, 0, 0]
            } else {
                [0, 0, 0, 0]
            }
        })
        .collect();
    let mut jpeg = Vec::new();
    Encoder::new(&mut jpeg, 100)
        .encode(&cmyk, w, h, ColorType::Cmyk)
        .expect("cmyk jpeg");
    let image = decode(vec![Some(jpeg)], "rgb").await?;
    let (height, width, channels, pixels) = fields(&image, 0);
    assert_eq!((height, width, channels), (8, 16, 3));
    let expected: Vec<u8> = (0..w as usize * h as usize)
        .flat_map(|i| {
            if i % (w as usize) < 8 {
                [0u8, 255, 255]
            } else {
                [255, 255, 255]
            }
        })
        .collect();
    // Away from the edge between the halves (JPEG blurs it).
    let inner = |v: &[u8]| -> Vec<u8> {
        v.chunks(3)
            .enumerate()
            .filter(|(i, _)| !(5..11).contains(&(i % 16)))
            .flat_map(|(_, p)| p.to_vec())
            .collect()
    };
    let worst = worst_error(&inner(&pixels), &inner(&expected));
    assert!(
        worst <= 12,
        "CMYK colours off by {worst}: {:?}",
        &pixels[..6]
    );

    let source: Vec<u8> = (0..32usize * 16)
        .flat_map(|i| [(i * 7 % 256) as u8 / 2 + 60, 90, 160])
        .collect();
    let mut progressive = Vec::new();
    let mut encoder = Encoder::new(&mut progressive, 100);
    encoder.set_progressive(true);
    encoder
        .encode(&source, 32, 16, ColorType::Rgb)
        .expect("progressive jpeg");
    let image = decode(vec![Some(progressive)], "rgb").await?;
    let (height, width, _, pixels) = fields(&image, 0);
    assert_eq!((height, width), (16, 32));
    let worst = worst_error(&pixels, &source);
    assert!(worst <= 16, "progressive JPEG off by {worst}");
    Ok(())
}

/// A noisy `width` × `height` RGB picture (noise keeps the compressed data
/// long, so that cuts land inside it).
fn noise(width: usize, height: usize) -> Vec<u8> {
    (0..width * height * 3)
        .map(|i| ((i * 2_654_435_761) >> 13) as u8)
        .collect()
}

/// Baseline, progressive and restart-marker JPEGs and a PNG of the same
/// 64 × 48 picture, with their names.
fn complete_images() -> Vec<(&'static str, Vec<u8>)> {
    use jpeg_encoder::{ColorType, Encoder};
    let pixels = noise(64, 48);
    let mut baseline = Vec::new();
    JpegEncoder::new_with_quality(&mut baseline, 90)
        .write_image(&pixels, 64, 48, ExtendedColorType::Rgb8)
        .expect("baseline jpeg");
    let mut progressive = Vec::new();
    let mut encoder = Encoder::new(&mut progressive, 90);
    encoder.set_progressive(true);
    encoder
        .encode(&pixels, 64, 48, ColorType::Rgb)
        .expect("progressive jpeg");
    let mut restarts = Vec::new();
    let mut encoder = Encoder::new(&mut restarts, 90);
    encoder.set_restart_interval(2);
    encoder
        .encode(&pixels, 64, 48, ColorType::Rgb)
        .expect("jpeg with restart markers");
    vec![
        ("baseline jpeg", baseline),
        ("progressive jpeg", progressive),
        ("jpeg with restart markers", restarts),
        ("png", png(64, 48, &pixels, ExtendedColorType::Rgb8)),
    ]
}

/// Where the test cuts each file: inside the data, and just before the end
/// (a JPEG without the last byte of FFD9, a PNG without all of IEND).
fn cut_points(len: usize) -> Vec<usize> {
    vec![len / 4, len / 2, len * 9 / 10, len - 12, len - 2, len - 1]
}

#[tokio::test]
async fn truncated_images_are_errors_naming_the_row() -> Result<()> {
    let strict = || ScalarUDF::from(ImageDecodeFunc::new(false, DEFAULT_MAX_PIXELS));
    let lenient = || ScalarUDF::from(ImageDecodeFunc::new(true, DEFAULT_MAX_PIXELS));
    for (name, image) in complete_images() {
        let whole = decode_with(strict(), vec![Some(image.clone())], "rgb").await?;
        assert_eq!(fields(&whole, 0).0, 48, "{name} decodes whole");
        for cut in cut_points(image.len()) {
            let blobs = vec![Some(image.clone()), Some(image[..cut].to_vec())];
            let err = decode_with(strict(), blobs.clone(), "rgb")
                .await
                .expect_err(&format!("{name} cut at {cut} of {} decodes", image.len()))
                .to_string();
            assert!(
                err.contains("cannot decode row 1") && err.contains("truncated"),
                "{name} cut at {cut}: {err}"
            );
            assert!(err.contains("'partial'"), "{name} cut at {cut}: {err}");
            let nulls = decode_with(lenient(), blobs, "rgb").await?;
            assert!(!nulls.is_null(0) && nulls.is_null(1), "{name} cut at {cut}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn partial_argument_accepts_what_the_decoder_fills_in() -> Result<()> {
    let strict = || ScalarUDF::from(ImageDecodeFunc::new(false, DEFAULT_MAX_PIXELS));
    for (name, image) in complete_images() {
        // JPEG: cut in the middle of the scans. PNG: cut inside a text chunk
        // after the image data (the png crate itself refuses a PNG cut
        // anywhere before the chunk that follows the image data).
        let (image, cut) = if name == "png" {
            let text = with_chunk_before_iend(&image, b"tEXt", &[b'x'; 200]);
            let cut = image.len() - 12 + 100;
            (text, cut)
        } else {
            let cut = image.len() * 9 / 10;
            (image, cut)
        };
        let ctx = SessionContext::new();
        ctx.register_udf(strict());
        let array = BinaryArray::from_iter_values([&image[..cut]]);
        let batch = RecordBatch::try_from_iter(vec![("b", Arc::new(array) as ArrayRef)])?;
        ctx.register_batch("t", batch)?;
        let batches = ctx
            .sql("SELECT image_decode(b, 'rgb', 'PARTIAL') FROM t")
            .await?
            .collect()
            .await?;
        let (height, width, channels, _) = fields(batches[0].column(0).as_struct(), 0);
        assert_eq!((height, width, channels), (48, 64, 3), "{name}");
    }
    Ok(())
}

/// `png` with a chunk of `kind` holding `data` inserted before IEND.
fn with_chunk_before_iend(png: &[u8], kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    let iend = png.len() - 12;
    let mut out = png[..iend].to_vec();
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
    out.extend_from_slice(&png[iend..]);
    out
}

#[tokio::test]
async fn damaged_png_chunks_are_errors_even_after_the_image_data() -> Result<()> {
    let image = png(64, 48, &noise(64, 48), ExtendedColorType::Rgb8);
    let text = with_chunk_before_iend(&image, b"tEXt", b"Comment\0made by a test");
    // Sanity: the extra chunk itself is fine.
    decode(vec![Some(text.clone())], "rgb").await?;
    let mut in_image_data = image.clone();
    in_image_data[image.len() / 2] ^= 0x10;
    let mut text_after_data = text.clone();
    let text_at = image.len() - 12;
    text_after_data[text_at + 10] ^= 0x01;
    let mut iend_crc = image.clone();
    let last = iend_crc.len() - 1;
    iend_crc[last] ^= 0xFF;
    for (name, blob, expected) in [
        ("IDAT byte flipped", in_image_data, "CRC"),
        ("tEXt after IDAT flipped", text_after_data, "tEXt chunk"),
        ("IEND CRC flipped", iend_crc, "IEND chunk"),
    ] {
        let err = decode(vec![Some(blob.clone())], "rgb")
            .await
            .expect_err(name)
            .to_string();
        assert!(err.contains("cannot decode row 0"), "{name}: {err}");
        assert!(err.contains(expected), "{name}: {err}");
        // 'partial' does not excuse a checksum error in the image data.
        if name.starts_with("IDAT") {
            let ctx = SessionContext::new();
            crate::register_all(&ctx)?;
            let array = BinaryArray::from_iter_values([blob]);
            let batch =
                RecordBatch::try_from_iter(vec![("b", Arc::new(array) as ArrayRef)])?;
            ctx.register_batch("t", batch)?;
            let result = ctx
                .sql("SELECT image_decode(b, 'rgb', 'partial') FROM t")
                .await?
                .collect()
                .await;
            assert!(result.is_err(), "{name} decodes with 'partial'");
        }
    }
    Ok(())
}

#[tokio::test]
async fn bytes_after_the_jpeg_end_marker_are_ignored() -> Result<()> {
    for (name, image) in complete_images() {
        let mut padded = image.clone();
        padded.extend_from_slice(b"camera maker trailer \xff\x00");
        let image = decode(vec![Some(padded)], "rgb").await?;
        assert_eq!(fields(&image, 0).0, 48, "{name}");
    }
    Ok(())
}

/// The photographs of `udfs/tests/data/photos` (name, JPEG bytes).
fn photos() -> Vec<(String, Vec<u8>)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/photos");
    let mut photos: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("the photo fixtures")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jpg"))
        .map(|p| {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read(&p).expect("a photo"))
        })
        .collect();
    photos.sort();
    assert!(photos.len() >= 7, "{} photos", photos.len());
    photos
}

/// `sql` (reading column `b`) over `blobs`, with every image function.
async fn images_sql(blobs: Vec<Vec<u8>>, sql: &str) -> Result<(StructArray, String)> {
    let ctx = SessionContext::new();
    for udf in functions() {
        ctx.register_udf(udf);
    }
    let array = BinaryArray::from_iter_values(blobs);
    let batch = RecordBatch::try_from_iter(vec![("b", Arc::new(array) as ArrayRef)])?;
    ctx.register_batch("t", batch)?;
    let df = ctx.sql(sql).await?;
    let plan = format!("{}", df.clone().into_optimized_plan()?.display_indent());
    let batches = df.collect().await?;
    let column = datafusion::arrow::compute::concat(
        &batches
            .iter()
            .map(|b| b.column(0).as_ref())
            .collect::<Vec<_>>(),
    )?;
    Ok((column.as_struct().clone(), plan))
}

#[test]
fn jpegs_decode_at_the_smallest_scale_that_covers_the_target() {
    let photos = photos();
    let bytes = |name: &str| {
        &photos
            .iter()
            .find(|(n, _)| n == name)
            .expect("the fixture")
            .1
    };
    let size = |name: &str, h, w| {
        scaled::decode_jpeg_at_least(bytes(name), DEFAULT_MAX_PIXELS, h, w)
            .expect("decodable")
            .map(|image| (image.height(), image.width()))
    };
    assert_eq!(size("astronaut_128.jpg", 64, 64), Some((64, 64)));
    assert_eq!(size("astronaut_128.jpg", 32, 20), Some((32, 32)));
    assert_eq!(size("astronaut_128.jpg", 16, 16), Some((16, 16)));
    assert_eq!(
        size("astronaut_128.jpg", 65, 64),
        None,
        "1/2 would be too small"
    );
    assert_eq!(size("coffee_256.jpg", 64, 64), Some((64, 64)));
    assert_eq!(size("coffee_256.jpg", 100, 100), Some((128, 128)));
    // Gray stays gray, the scaled output of a 256² photo for a 224² target
    // would be the whole image: full-size path.
    assert_eq!(size("camera_128.jpg", 40, 40), Some((64, 64)));
    assert_eq!(size("coffee_256.jpg", 224, 224), None);
    // Stored 96×160, displayed 160 high... no: displayed 96 high, 160 wide.
    assert_eq!(size("coffee_exif6_96x160.jpg", 48, 80), Some((48, 80)));
    assert_eq!(size("coffee_exif6_96x160.jpg", 80, 48), None);
    // Not a JPEG, or empty: the caller's full-size path decides.
    assert_eq!(
        scaled::decode_jpeg_at_least(b"\x89PNG", DEFAULT_MAX_PIXELS, 8, 8),
        Ok(None)
    );
}

/// Mean and 99th percentile of the absolute channel differences.
fn differences(a: &[u8], b: &[u8]) -> (f64, u8) {
    assert_eq!(a.len(), b.len());
    let mut d: Vec<u8> = a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).collect();
    let mean = d.iter().map(|&v| f64::from(v)).sum::<f64>() / d.len() as f64;
    d.sort_unstable();
    (mean, d[d.len() * 99 / 100])
}

#[tokio::test]
async fn resize_after_decode_uses_the_scaled_decoder_within_tolerance() -> Result<()> {
    let photos = photos();
    let blobs: Vec<Vec<u8>> = photos.iter().map(|(_, b)| b.clone()).collect();
    for (h, w, filter) in [
        (64, 64, ""),
        (32, 32, ", 'lanczos3'"),
        (40, 24, ", 'bicubic'"),
    ] {
        let (fused, plan) = images_sql(
            blobs.clone(),
            &format!("SELECT image_resize(image_decode(b), {h}, {w}{filter}) FROM t"),
        )
        .await?;
        assert!(
            plan.contains(&format!("Utf8(\"complete\"), Int64({h}), Int64({w}))")),
            "the decode was not given the target size:\n{plan}"
        );
        // The 5-argument form with size 0 never scales: full decode, resize.
        let (full, _) = images_sql(
            blobs.clone(),
            &format!(
                "SELECT image_resize(image_decode(b, 'rgb', 'complete', 0, 0), {h}, {w}{filter}) FROM t"
            ),
        )
        .await?;
        for (row, (name, _)) in photos.iter().enumerate() {
            let (fh, fw, fc, fused_px) = fields(&fused, row);
            let (gh, gw, gc, full_px) = fields(&full, row);
            assert_eq!((fh, fw, fc), (gh, gw, gc), "{name}");
            assert_eq!((fh, fw), (h, w), "{name}");
            let (mean, p99) = differences(&fused_px, &full_px);
            // Measured on these photographs: mean 0.0-5.9, p99 0-32 levels
            // (the largest where the reduced image is the target size).
            assert!(
                mean <= 6.5 && p99 <= 36,
                "{name} at {h}x{w}{filter}: mean {mean:.2}, p99 {p99}"
            );
        }
    }
    // The nearest filter keeps the full-size decode.
    let (_, plan) = images_sql(
        blobs,
        "SELECT image_resize(image_decode(b), 8, 8, 'nearest') FROM t",
    )
    .await?;
    assert!(!plan.contains("Int64(8), Int64(8))"), "{plan}");
    Ok(())
}

#[tokio::test]
async fn decode_size_arguments_must_be_constant_pixel_counts() -> Result<()> {
    let blobs = vec![photos()[0].1.clone()];
    for (sql, expected) in [
        (
            "SELECT image_decode(b, 'rgb', 'complete', -1, 8) FROM t",
            "min_height must be a constant number of pixels",
        ),
        (
            "SELECT image_decode(b, 'rgb', 'complete', 8, 'x') FROM t",
            "min_width must be an integer",
        ),
        (
            "SELECT image_decode(b, 'rgb', 'complete', 8) FROM t",
            "takes 1 to 3 or 5 arguments, got 4",
        ),
    ] {
        let err = images_sql(blobs.clone(), sql)
            .await
            .expect_err(sql)
            .to_string();
        assert!(err.contains(expected), "{sql}: {err}");
    }
    Ok(())
}
