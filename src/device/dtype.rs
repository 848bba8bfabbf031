//! Tensor element types and the plain-old-data trait that lets the feed
//! write them into raw slot buffers.

use std::fmt;
use std::str::FromStr;

use datafusion::common::{internal_err, plan_err};
use datafusion::error::{DataFusionError, Result};

pub use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 single precision.
    Float32,
    /// IEEE 754 double precision (e.g. epoch seconds, whose fraction float32
    /// cannot hold).
    Float64,
    /// IEEE 754 half precision.
    Float16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BFloat16,
    /// Signed 64-bit integer (torch's default for labels and token ids).
    Int64,
    /// Signed 32-bit integer.
    Int32,
    /// Unsigned byte (raw pixels).
    UInt8,
    /// Boolean, one byte per element (0 or 1), like torch and DLPack.
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Float32 | DType::Int32 => 4,
            DType::Float16 | DType::BFloat16 => 2,
            DType::Int64 | DType::Float64 => 8,
            DType::UInt8 | DType::Bool => 1,
        }
    }

    /// The name used in specs and messages (`float32`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::Float32 => "float32",
            DType::Float64 => "float64",
            DType::Float16 => "float16",
            DType::BFloat16 => "bfloat16",
            DType::Int64 => "int64",
            DType::Int32 => "int32",
            DType::UInt8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Whether values of this type are floating point.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::Float32 | DType::Float64 | DType::Float16 | DType::BFloat16
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = DataFusionError;

    fn from_str(text: &str) -> Result<Self> {
        Ok(match text.trim().to_ascii_lowercase().as_str() {
            "float32" | "f32" | "float" => DType::Float32,
            "float64" | "f64" | "double" => DType::Float64,
            "float16" | "f16" | "half" => DType::Float16,
            "bfloat16" | "bf16" => DType::BFloat16,
            "int64" | "i64" | "long" => DType::Int64,
            "int32" | "i32" | "int" => DType::Int32,
            "uint8" | "u8" | "byte" => DType::UInt8,
            "bool" | "boolean" => DType::Bool,
            other => {
                return plan_err!(
                    "unknown tensor dtype '{other}': expected one of float32, \
                     float64, bfloat16, float16, int64, int32, uint8, bool"
                );
            }
        })
    }
}

/// A tensor element: plain old data, any bit pattern valid, no padding.
///
/// # Safety
/// Implementors must be `Copy` types without padding bytes or invalid bit
/// patterns, because slot buffers are reinterpreted as `[Self]`.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The tensor dtype this Rust type stores (`u8` is both `UInt8` and the
    /// byte form of `Bool`).
    const DTYPES: &'static [DType];
}

// SAFETY: primitive numeric types: no padding, every bit pattern is a value.
unsafe impl Element for f32 {
    const DTYPES: &'static [DType] = &[DType::Float32];
}
// SAFETY: as above.
unsafe impl Element for f64 {
    const DTYPES: &'static [DType] = &[DType::Float64];
}
// SAFETY: as above.
unsafe impl Element for i64 {
    const DTYPES: &'static [DType] = &[DType::Int64];
}
// SAFETY: as above.
unsafe impl Element for i32 {
    const DTYPES: &'static [DType] = &[DType::Int32];
}
// SAFETY: as above; bools are stored as bytes 0/1, read back as `u8`.
unsafe impl Element for u8 {
    const DTYPES: &'static [DType] = &[DType::UInt8, DType::Bool];
}
// SAFETY: `half::f16` is a `#[repr(transparent)]` wrapper of `u16`.
unsafe impl Element for f16 {
    const DTYPES: &'static [DType] = &[DType::Float16];
}
// SAFETY: `half::bf16` is a `#[repr(transparent)]` wrapper of `u16`.
unsafe impl Element for bf16 {
    const DTYPES: &'static [DType] = &[DType::BFloat16];
}

/// The number of `T` in `bytes`, which must be aligned for `T` (slot
/// buffers are page-aligned and every tensor starts a buffer) and a whole
/// number of elements long.
fn element_count<T: Element>(bytes: &[u8]) -> Result<usize> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size)
        || !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
    {
        return internal_err!(
            "tensor buffer of {} bytes at {:p} is not a whole, aligned [{}]",
            bytes.len(),
            bytes.as_ptr(),
            std::any::type_name::<T>()
        );
    }
    Ok(bytes.len() / size)
}

/// Views `bytes` as elements; see [`element_count`] for the requirements.
pub(crate) fn cast_slice_mut<T: Element>(bytes: &mut [u8]) -> Result<&mut [T]> {
    let len = element_count::<T>(bytes)?;
    // SAFETY: the pointer is aligned for T and holds exactly `len` elements
    // (checked by `element_count`); T is plain old data (`Element`), so
    // every byte pattern is a valid T; the new slice borrows `bytes`
    // mutably, so no alias can exist.
    Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), len) })
}

/// Views `bytes` as elements; see [`element_count`] for the requirements.
pub(crate) fn cast_slice<T: Element>(bytes: &[u8]) -> Result<&[T]> {
    let len = element_count::<T>(bytes)?;
    // SAFETY: as in `cast_slice_mut`, with a shared borrow of `bytes`.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() -> Result<()> {
        for dtype in [
            DType::Float32,
            DType::Float64,
            DType::Float16,
            DType::BFloat16,
            DType::Int64,
            DType::Int32,
            DType::UInt8,
            DType::Bool,
        ] {
            assert_eq!(dtype.name().parse::<DType>()?, dtype);
        }
        assert!("complex64".parse::<DType>().is_err());
        Ok(())
    }

    #[test]
    fn casts_check_alignment_and_length() {
        let mut words = [0u64; 4];
        // SAFETY-free way to get an aligned byte view: a u64 array's bytes.
        let bytes: &mut [u8] = bytemuck_bytes(&mut words);
        assert_eq!(cast_slice_mut::<f32>(bytes).map(|s| s.len()).ok(), Some(8));
        assert!(cast_slice_mut::<f32>(&mut bytes[1..5]).is_err());
        assert!(cast_slice_mut::<i64>(&mut bytes[..12]).is_err());
    }

    fn bytemuck_bytes(words: &mut [u64; 4]) -> &mut [u8] {
        // SAFETY: u64 has no padding; the byte view covers exactly the array
        // and borrows it mutably.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), 32) }
    }
}
