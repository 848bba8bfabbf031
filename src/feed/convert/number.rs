//! Numbers into tensor elements: every Arrow number type into every tensor
//! dtype, with overflow and non-integral values reported, not wrapped.

use datafusion::error::{DataFusionError, Result};

use crate::device::{DType, bf16, cast_slice_mut, f16};

/// A number that can become any tensor element.
pub(super) trait Number: Copy {
    fn to_f32(self) -> f32;
    fn to_f64(self) -> f64;
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
            fn to_f64(self) -> f64 { self as f64 }
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
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f64::from(self)
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
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
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
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f64::from(self)
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
pub(super) fn write_native<S: Number + std::fmt::Debug>(
    src: &[S],
    dst: &mut [u8],
    dtype: DType,
    affine: Option<(f64, f64)>,
) -> std::result::Result<(), (usize, String)> {
    let internal = |e: DataFusionError| (0, e.to_string());
    // The 16- and 32-bit floats are computed in f32 (the vectorised path).
    let affine32 = affine.map(|(scale, offset)| (scale as f32, offset as f32));
    match dtype {
        DType::Float32 => {
            let dst = cast_slice_mut::<f32>(dst).map_err(internal)?;
            match affine32 {
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
        DType::Float64 => {
            let dst = cast_slice_mut::<f64>(dst).map_err(internal)?;
            let (scale, offset) = affine.unwrap_or((1.0, 0.0));
            for (d, s) in dst.iter_mut().zip(src) {
                *d = s.to_f64() * scale + offset;
            }
        }
        DType::Float16 => {
            let dst = cast_slice_mut::<f16>(dst).map_err(internal)?;
            let (scale, offset) = affine32.unwrap_or((1.0, 0.0));
            for (d, s) in dst.iter_mut().zip(src) {
                *d = f16::from_f32(s.to_f32() * scale + offset);
            }
        }
        DType::BFloat16 => {
            let dst = cast_slice_mut::<bf16>(dst).map_err(internal)?;
            let (scale, offset) = affine32.unwrap_or((1.0, 0.0));
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
pub(super) fn write_repeated(dst: &mut [u8], dtype: DType, value: f64) -> Result<()> {
    match dtype {
        DType::Float32 => cast_slice_mut::<f32>(dst)?.fill(value as f32),
        DType::Float64 => cast_slice_mut::<f64>(dst)?.fill(value),
        DType::Float16 => cast_slice_mut::<f16>(dst)?.fill(f16::from_f64(value)),
        DType::BFloat16 => cast_slice_mut::<bf16>(dst)?.fill(bf16::from_f64(value)),
        DType::Int64 => cast_slice_mut::<i64>(dst)?.fill(value as i64),
        DType::Int32 => cast_slice_mut::<i32>(dst)?.fill(value as i32),
        DType::UInt8 => dst.fill(value as u8),
        DType::Bool => dst.fill(u8::from(value != 0.0)),
    }
    Ok(())
}
