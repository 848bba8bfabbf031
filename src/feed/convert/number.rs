//! Numbers into tensor elements: every Arrow number type into every tensor
//! dtype, with overflow and non-integral values reported, not wrapped.

use datafusion::error::Result;

use crate::device::{DType, Element, bf16, cast_slice_mut, f16};

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

macro_rules! float {
    ($($t:ty => $to_f32:expr),*) => {$(
        impl Number for $t {
            #[inline(always)]
            fn to_f32(self) -> f32 { ($to_f32)(self) }
            #[inline(always)]
            fn to_f64(self) -> f64 { f64::from(self) }
            fn to_i64(self) -> Option<i64> { None }
            fn is_nonzero(self) -> bool { self.to_f64() != 0.0 }
        }
    )*};
}
float!(f32 => f32::from, f64 => |x: f64| x as f32, f16 => f32::from);

/// A failed conversion: the element's index and its value as text.
type Offending = (usize, String);

/// `dst`, viewed as `T`s, gets `convert` of each element of `src`; one
/// loop per call site, so the compiler vectorises each.
#[inline(always)]
fn map_into<S: Copy, T: Element>(
    src: &[S],
    dst: &mut [u8],
    convert: impl Fn(S) -> T,
) -> std::result::Result<(), Offending> {
    let dst = cast_slice_mut::<T>(dst).map_err(|e| (0, e.to_string()))?;
    for (d, s) in dst.iter_mut().zip(src) {
        *d = convert(*s);
    }
    Ok(())
}

/// [`map_into`] with a conversion that may fail (`None`: out of range or
/// not integral), which stops at the offending element.
#[inline(always)]
fn try_map_into<S: Number + std::fmt::Debug, T: Element>(
    src: &[S],
    dst: &mut [u8],
    convert: impl Fn(S) -> Option<T>,
) -> std::result::Result<(), Offending> {
    let dst = cast_slice_mut::<T>(dst).map_err(|e| (0, e.to_string()))?;
    for (i, (d, s)) in dst.iter_mut().zip(src).enumerate() {
        *d = convert(*s).ok_or_else(|| (i, format!("{s:?}")))?;
    }
    Ok(())
}

/// Converts `src` into `dst` (exactly `src.len()` elements of `dtype`);
/// on overflow returns the offending value as text.
#[inline]
pub(super) fn write_native<S: Number + std::fmt::Debug>(
    src: &[S],
    dst: &mut [u8],
    dtype: DType,
    affine: Option<(f64, f64)>,
) -> std::result::Result<(), Offending> {
    // The 16- and 32-bit floats are computed in f32 (the vectorised path).
    let affine32 = affine.map(|(scale, offset)| (scale as f32, offset as f32));
    let (scale32, offset32) = affine32.unwrap_or((1.0, 0.0));
    match dtype {
        // Without an affine map, no multiply-add to vectorise around.
        DType::Float32 if affine32.is_none() => map_into(src, dst, S::to_f32),
        DType::Float32 => map_into(src, dst, |s| s.to_f32() * scale32 + offset32),
        DType::Float64 => {
            let (scale, offset) = affine.unwrap_or((1.0, 0.0));
            map_into(src, dst, |s| s.to_f64() * scale + offset)
        }
        DType::Float16 => {
            map_into(src, dst, |s| f16::from_f32(s.to_f32() * scale32 + offset32))
        }
        DType::BFloat16 => map_into(src, dst, |s| {
            bf16::from_f32(s.to_f32() * scale32 + offset32)
        }),
        DType::Int64 => try_map_into(src, dst, S::to_i64),
        DType::Int32 => {
            try_map_into(src, dst, |s| s.to_i64().and_then(|v| i32::try_from(v).ok()))
        }
        DType::UInt8 => {
            try_map_into(src, dst, |s| s.to_i64().and_then(|v| u8::try_from(v).ok()))
        }
        DType::Bool => map_into(src, dst, |s| u8::from(s.is_nonzero())),
    }
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
