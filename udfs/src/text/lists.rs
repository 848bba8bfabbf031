//! `attention_mask`, `pad` and `truncate`: the list shaping around
//! tokenization, for any list of numbers.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, GenericListArray, Int8Builder, ListBuilder,
    MutableArrayData, make_array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::common::{exec_datafusion_err, internal_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature,
    Volatility,
};

const ATTENTION_MASK: &str = "attention_mask(ids [, len])";
const PAD: &str = "pad(list, len, value)";
const TRUNCATE: &str = "truncate(list, len)";
/// Longest `len` accepted: larger is almost surely a mistake and would
/// allocate that many values per row.
const MAX_LEN: i64 = 1 << 24;

/// A constant, positive `len` argument.
fn constant_len(
    function: &str,
    syntax: &str,
    value: Option<&ColumnarValue>,
) -> Result<usize> {
    let scalar = match value {
        Some(ColumnarValue::Scalar(s)) if !s.is_null() => s,
        _ => {
            return plan_err!(
                "{function}: len must be a non-null constant; signature: {syntax}"
            );
        }
    };
    match scalar.cast_to(&DataType::Int64)? {
        ScalarValue::Int64(Some(len)) if (0..=MAX_LEN).contains(&len) => Ok(len as usize),
        other => {
            plan_err!("{function}: len must be between 0 and {MAX_LEN}, got {other}")
        }
    }
}

/// The list argument as a `List` array (the coercion made it one).
fn list_of(value: &ColumnarValue, rows: usize) -> Result<GenericListArray<i32>> {
    Ok(value.to_array(rows)?.as_list::<i32>().clone())
}

crate::coercing_function! {
    /// `attention_mask(ids [, len])`; see the module docs.
    pub struct AttentionMaskFunc;
}

impl ScalarUDFImpl for AttentionMaskFunc {
    crate::function_basics!("attention_mask");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        super::check_arity(self.name(), ATTENTION_MASK, arg_types.len(), &[1, 2])?;
        let mut types = vec![super::list_arg(
            self.name(),
            ATTENTION_MASK,
            0,
            &arg_types[0],
        )?];
        if let Some(t) = arg_types.get(1) {
            types.push(super::integer_arg(self.name(), ATTENTION_MASK, 1, t)?);
        }
        Ok(types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::new_list(DataType::Int8, false))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let nullable = args.arg_fields[0].is_nullable();
        Ok(Arc::new(Field::new(
            self.name(),
            DataType::new_list(DataType::Int8, false),
            nullable,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let len = match args.args.get(1) {
            Some(_) => Some(constant_len(self.name(), ATTENTION_MASK, args.args.get(1))?),
            None => None,
        };
        let ids = list_of(&args.args[0], rows)?;
        let mut out = ListBuilder::with_capacity(Int8Builder::new(), rows)
            .with_field(Field::new_list_field(DataType::Int8, false));
        let offsets = ids.value_offsets();
        for row in 0..rows {
            if ids.is_null(row) {
                out.append_null();
                continue;
            }
            let n = (offsets[row + 1] - offsets[row]) as usize;
            let total = len.unwrap_or(n);
            let ones = n.min(total);
            out.values().append_value_n(1, ones);
            out.values().append_value_n(0, total - ones);
            out.append(true);
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

/// `pad(list, len, value)` and `truncate(list, len)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ShapeFunc {
    signature: Signature,
    /// `pad` (else `truncate`).
    pad: bool,
}

impl ShapeFunc {
    /// `pad(list, len, value)`.
    pub(super) fn pad() -> Self {
        Self::with(true)
    }

    /// `truncate(list, len)`.
    pub(super) fn truncate() -> Self {
        Self::with(false)
    }

    fn with(pad: bool) -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
            pad,
        }
    }

    fn syntax(&self) -> &'static str {
        if self.pad { PAD } else { TRUNCATE }
    }
}

impl ScalarUDFImpl for ShapeFunc {
    crate::function_basics!(if pad { "pad" } else { "truncate" });

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let arity = if self.pad { 3 } else { 2 };
        super::check_arity(self.name(), self.syntax(), arg_types.len(), &[arity])?;
        let list = super::list_arg(self.name(), self.syntax(), 0, &arg_types[0])?;
        let mut types = vec![
            list.clone(),
            super::integer_arg(self.name(), self.syntax(), 1, &arg_types[1])?,
        ];
        if self.pad {
            let DataType::List(child) = &list else {
                return internal_err!("list_arg returns a List");
            };
            if !(arg_types[2].is_numeric() || arg_types[2] == DataType::Null) {
                return plan_err!(
                    "pad: the value must be a number, got {}; signature: {PAD}",
                    arg_types[2]
                );
            }
            types.push(child.data_type().clone());
        }
        Ok(types)
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        Ok(arg_types[0].clone())
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        Ok(Arc::new(Field::new(
            self.name(),
            args.arg_fields[0].data_type().clone(),
            args.arg_fields[0].is_nullable(),
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let len = constant_len(self.name(), self.syntax(), args.args.get(1))?;
        let list = list_of(&args.args[0], rows)?;
        let DataType::List(field) = list.data_type().clone() else {
            return internal_err!("{} got a non-list", self.name());
        };
        let values = list.values();
        // The pad value as a one-element array of the element type.
        let filler: ArrayRef = match (self.pad, args.args.get(2)) {
            (true, Some(ColumnarValue::Scalar(v))) => {
                v.cast_to(field.data_type())?.to_array()?
            }
            (true, _) => {
                return plan_err!("pad: the value must be a constant; signature: {PAD}");
            }
            (false, _) => values.slice(0, 0),
        };
        let (values_data, filler_data) = (values.to_data(), filler.to_data());
        let mut out =
            MutableArrayData::new(vec![&values_data, &filler_data], true, values.len());
        let offsets = list.value_offsets();
        let mut new_offsets = Vec::with_capacity(rows + 1);
        new_offsets.push(0i32);
        for row in 0..rows {
            let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
            let mut n = end - start;
            if !list.is_null(row) {
                if !self.pad {
                    n = n.min(len);
                }
                out.try_extend(0, start, start + n)?;
                if self.pad {
                    for _ in n..len {
                        out.try_extend(1, 0, 1)?;
                    }
                    n = n.max(len);
                }
            } else {
                n = 0;
            }
            let last = *new_offsets.last().unwrap_or(&0);
            let next = i32::try_from(n)
                .ok()
                .and_then(|n| last.checked_add(n))
                .ok_or_else(|| {
                    exec_datafusion_err!(
                        "{}: the result exceeds 2^31 values",
                        self.name()
                    )
                })?;
            new_offsets.push(next);
        }
        let result = GenericListArray::<i32>::try_new(
            field,
            OffsetBuffer::new(new_offsets.into()),
            make_array(out.freeze()),
            list.nulls().cloned(),
        )?;
        Ok(ColumnarValue::Array(Arc::new(result)))
    }
}
