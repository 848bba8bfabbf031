//! Timestamps, dates and durations into tensors: their counts rescaled to
//! the column's unit, exactly where the unit is finer, with the offending
//! value named where a count does not fit.

use datafusion::arrow::array::{Array, PrimitiveArray};
use datafusion::common::internal_err;
use datafusion::error::Result;

use super::ColumnWriter;
use crate::device::{DType, cast_slice_mut};
use crate::feed::columns::{Rescale, Temporal};

impl ColumnWriter<'_> {
    /// Converts `len` timestamp, date or duration counts from `start`,
    /// rescaled to the column's unit. NULL slots (whose counts are
    /// undefined, so they must not fail a rescale) are written as 0 here and
    /// filled, or refused, by the caller. `row` is the batch row of the first
    /// value, for messages.
    pub(super) fn convert_temporal<T>(
        &self,
        array: &PrimitiveArray<T>,
        start: usize,
        len: usize,
        out: &mut [u8],
        row: usize,
    ) -> Result<()>
    where
        T: datafusion::arrow::datatypes::ArrowPrimitiveType,
        T::Native: Into<i64>,
    {
        let Some(plan) = self.column.temporal else {
            return internal_err!(
                "column '{}' got {} values without a temporal plan",
                self.column.name,
                array.data_type()
            );
        };
        let values = &array.values()[start..start + len];
        let valid = |i: usize| array.is_valid(start + i);
        let per_row = self.width.max(1);
        let fail = |i: usize, what: String| self.error(row + i / per_row, what);
        match self.column.dtype {
            DType::Int64 => {
                let dst = cast_slice_mut::<i64>(out)?;
                for (i, (d, &v)) in dst.iter_mut().zip(values).enumerate() {
                    let v: i64 = v.into();
                    *d = if valid(i) {
                        rescale_int(v, plan.rescale)
                            .ok_or_else(|| fail(i, overflow(v, &plan, DType::Int64)))?
                    } else {
                        0
                    };
                }
            }
            DType::Int32 => {
                let dst = cast_slice_mut::<i32>(out)?;
                for (i, (d, &v)) in dst.iter_mut().zip(values).enumerate() {
                    let v: i64 = v.into();
                    *d = if valid(i) {
                        rescale_int(v, plan.rescale)
                            .and_then(|x| i32::try_from(x).ok())
                            .ok_or_else(|| fail(i, overflow(v, &plan, DType::Int32)))?
                    } else {
                        0
                    };
                }
            }
            DType::Float64 => {
                let dst = cast_slice_mut::<f64>(out)?;
                for (d, &v) in dst.iter_mut().zip(values) {
                    *d = rescale_float(v.into(), &plan, self.column.affine);
                }
            }
            DType::Float32 => {
                let dst = cast_slice_mut::<f32>(out)?;
                for (d, &v) in dst.iter_mut().zip(values) {
                    *d = rescale_float(v.into(), &plan, self.column.affine) as f32;
                }
            }
            other => {
                return internal_err!(
                    "column '{}': temporal values planned into {other}",
                    self.column.name
                );
            }
        }
        Ok(())
    }
}

/// `value` in the tensor's unit as an integer: exact to a finer unit
/// (`None` on overflow), floor division to a coarser one.
pub(super) fn rescale_int(value: i64, rescale: Rescale) -> Option<i64> {
    match rescale {
        Rescale::Keep => Some(value),
        Rescale::Multiply(factor) => value.checked_mul(factor),
        // `div_euclid` by a positive divisor is the floor.
        Rescale::Divide(divisor) => Some(value.div_euclid(divisor)),
    }
}

/// Integers up to this magnitude are exact in an f64.
const EXACT_IN_F64: u64 = 1 << f64::MANTISSA_DIGITS;

/// `value` in the tensor's unit as a float, with the fraction, then
/// `x * scale + offset`.
pub(super) fn rescale_float(
    value: i64,
    plan: &Temporal,
    affine: Option<(f64, f64)>,
) -> f64 {
    let x = match plan.rescale {
        Rescale::Keep => value as f64,
        Rescale::Multiply(factor) => value as f64 * factor as f64,
        // One correctly rounded division while the count is exact in f64.
        Rescale::Divide(divisor) if value.unsigned_abs() <= EXACT_IN_F64 => {
            value as f64 / divisor as f64
        }
        // Epoch nanoseconds are past 2^53: whole units and the remainder
        // (same sign, so nothing cancels) separately, so that the count's
        // own rounding does not reach the result.
        Rescale::Divide(divisor) => {
            (value / divisor) as f64 + (value % divisor) as f64 / divisor as f64
        }
    };
    match affine {
        Some((scale, offset)) => x * scale + offset,
        None => x,
    }
}

/// The message for a count that does not fit `dtype` in the tensor's unit.
pub(super) fn overflow(value: i64, plan: &Temporal, dtype: DType) -> String {
    let fix = match dtype {
        DType::Int32 => "use dtype=int64 or a coarser unit",
        _ => "choose a coarser unit",
    };
    let (from, to) = (plan.from, plan.to);
    match rescale_int(value, plan.rescale) {
        None => format!("value {value} {from} is more {to} than {dtype} can hold; {fix}"),
        Some(converted) if from != to => format!(
            "value {value} {from} is {converted} {to}, which does not fit {dtype}; {fix}"
        ),
        Some(_) => format!("value {value} {from} does not fit {dtype}; {fix}"),
    }
}
