//! Constant arguments across the plugin ABI.
//!
//! `datafusion-ffi` 55 hands a function every argument as an Arrow array:
//! a constant (`ngram_hash(caption, 3, 65536)`'s `3` and `65536`) becomes
//! an array of the batch's rows before it crosses (apache/datafusion#18201).
//! A function then cannot take its fast path for a constant, and one that
//! checks that an argument *is* constant reads it row by row: in the plugin
//! bench that cost the plugin 12% over the same function built in.
//!
//! So sqlfeed's two sides agree on one more rule, inside the same ABI:
//!
//! ```text
//!  host (host::ForeignCall)                       plugin (ConstantsRestored)
//!  ────────────────────────                       ──────────────────────────
//!  Scalar(3)        ─► array of 1 row ─► FFI ─►  1 row, number_rows ≠ 1 ─► Scalar(3)
//!  column (n rows)  ─► array of n rows ─► FFI ─►  n rows                 ─► Array
//! ```
//!
//! In a call over `number_rows` rows a column has `number_rows` rows, so an
//! argument of one row in a call over any other number is a constant. In a
//! call over exactly one row a constant and a column of one row are the same
//! values, and the argument stays an array. A host that sends one-row
//! constants and a plugin that restores them are both this crate, and
//! [`crate::PLUGIN_ABI`] 2 names the rule: a plugin built for ABI 1 (which
//! would read a one-row array as a column) is refused by name.

use std::sync::Arc;

use datafusion::common::ScalarValue;
use datafusion::common::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
};

/// Host side: each constant argument as an array of one row.
pub(crate) fn send_constants_as_one_row(args: &mut [ColumnarValue]) -> Result<()> {
    for arg in args {
        if let ColumnarValue::Scalar(value) = arg {
            *arg = ColumnarValue::Array(value.to_array_of_size(1)?);
        }
    }
    Ok(())
}

/// Plugin side: each argument of one row in a call over another number of
/// rows back to the constant it was.
pub(crate) fn restore_constants(args: &mut [ColumnarValue], rows: usize) -> Result<()> {
    if rows == 1 {
        return Ok(());
    }
    for arg in args {
        if let ColumnarValue::Array(array) = arg
            && array.len() == 1
        {
            *arg = ColumnarValue::Scalar(ScalarValue::try_from_array(array, 0)?);
        }
    }
    Ok(())
}

/// A plugin's scalar function as it is exported: the user's function, called
/// with its constants restored (module docs). Everything else is the user's.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConstantsRestored {
    function: Arc<ScalarUDF>,
}

impl ConstantsRestored {
    pub(crate) fn new(function: Arc<ScalarUDF>) -> Self {
        Self { function }
    }
}

impl ScalarUDFImpl for ConstantsRestored {
    crate::answered_by_wrapped_function!(function);

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        restore_constants(&mut args.args, args.number_rows)?;
        self.function.invoke_with_args(args)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let updated = self.function.inner().with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(Self::new(Arc::new(updated))))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, ArrayRef, Int64Array};

    use super::*;

    fn column(values: &[i64]) -> ColumnarValue {
        ColumnarValue::Array(Arc::new(Int64Array::from(values.to_vec())) as ArrayRef)
    }

    #[test]
    fn constants_cross_as_one_row_and_come_back_as_constants() {
        let mut args = vec![
            column(&[1, 2, 3]),
            ColumnarValue::from(ScalarValue::from(7i64)),
        ];
        send_constants_as_one_row(&mut args).expect("sent");
        let ColumnarValue::Array(sent) = &args[1] else {
            panic!("a constant crosses as an array: {:?}", args[1]);
        };
        assert_eq!(sent.len(), 1);
        restore_constants(&mut args, 3).expect("restored");
        assert!(matches!(&args[0], ColumnarValue::Array(a) if a.len() == 3));
        assert!(
            matches!(&args[1], ColumnarValue::Scalar(ScalarValue::Int64(Some(7)))),
            "{:?}",
            args[1]
        );
    }

    #[test]
    fn in_a_call_over_one_row_a_one_row_argument_stays_an_array() {
        // A column of one row and a constant are the same values there.
        let mut args = vec![column(&[5]), column(&[6])];
        restore_constants(&mut args, 1).expect("restored");
        assert!(args.iter().all(|a| matches!(a, ColumnarValue::Array(_))));
    }

    #[test]
    fn over_no_rows_a_one_row_argument_is_a_constant() {
        // Zero rows: a column has none, so one row can only be a constant.
        let mut args = vec![column(&[]), column(&[9])];
        restore_constants(&mut args, 0).expect("restored");
        assert!(matches!(&args[0], ColumnarValue::Array(a) if a.is_empty()));
        assert!(matches!(
            &args[1],
            ColumnarValue::Scalar(ScalarValue::Int64(Some(9)))
        ));
    }

    #[test]
    fn a_null_constant_comes_back_as_a_typed_null() {
        let mut args = vec![
            column(&[1, 2]),
            ColumnarValue::from(ScalarValue::Int64(None)),
        ];
        send_constants_as_one_row(&mut args).expect("sent");
        restore_constants(&mut args, 2).expect("restored");
        assert!(matches!(
            &args[1],
            ColumnarValue::Scalar(ScalarValue::Int64(None))
        ));
    }
}
