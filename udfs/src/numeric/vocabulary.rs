//! Categorical strings encoded by their position in a constant vocabulary:
//! `label_encode(value, ['a', 'b', ...] [, '-1'])` here, and the machinery
//! that `one_hot(value, ['a', 'b', ...] [, 'zeros'])` shares with it.
//!
//! Both compute one int64 code per row ([`encode`]): the value's position
//! in the vocabulary, NULL for NULL, and for a value outside the vocabulary
//! either an execution error naming it (the default) or -1 when the call's
//! third argument asks for it. `label_encode` returns the codes; `one_hot`
//! expands them to rows of float32 (-1: all zeros).
//!
//! Dictionary-encoded strings (what Parquet gives for categorical columns)
//! are encoded through their dictionary: each dictionary value is looked up
//! once per batch and the keys are mapped, never a string per row. A
//! dictionary value no row refers to is never an error.

use std::sync::Arc;

use datafusion::arrow::array::{
    AnyDictionaryArray, Array, ArrayRef, AsArray, Int64Array, Int64Builder,
};
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{HashMap, ScalarValue};
use datafusion::common::{
    exec_err, internal_datafusion_err, internal_err, plan_datafusion_err, plan_err,
};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl,
};

const LABEL_ENCODE: &str = "label_encode(value, ['a', 'b', ...] [, '-1'])";
/// How many vocabulary entries an error message shows.
const SHOWN_ENTRIES: usize = 5;
/// Longest value an error message quotes, in characters.
const SHOWN_VALUE_CHARS: usize = 80;

/// A function that encodes strings by their position in a vocabulary, and
/// the words its messages use.
#[derive(Debug, Clone, Copy)]
pub(super) struct Encoder {
    /// The SQL name.
    pub(super) function: &'static str,
    /// The call syntax of the vocabulary form, for messages.
    pub(super) syntax: &'static str,
    /// The third argument that turns unknown values into `fallback_result`.
    fallback: &'static str,
    /// What an unknown value becomes with `fallback`, for messages.
    fallback_result: &'static str,
}

/// `label_encode`: unknown values become -1 with `'-1'`.
pub(super) const LABEL_ENCODER: Encoder = Encoder {
    function: "label_encode",
    syntax: LABEL_ENCODE,
    fallback: "-1",
    fallback_result: "-1",
};

/// `one_hot`'s vocabulary form: unknown values become all-zero rows with
/// `'zeros'`.
pub(super) const ONE_HOT_ENCODER: Encoder = Encoder {
    function: "one_hot",
    syntax: "one_hot(value, ['a', 'b', ...] [, 'zeros'])",
    fallback: "zeros",
    fallback_result: "an all-zero row",
};

/// What a value outside the vocabulary becomes: the third argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnUnknown {
    /// An execution error naming the value, the row and the vocabulary
    /// (`'error'`, the default).
    Error,
    /// Code -1: `label_encode` returns it, `one_hot` writes a row of zeros
    /// (`'-1'` and `'zeros'`).
    MinusOne,
}

/// Whether `t` is a list type, the type of a vocabulary argument: what tells
/// `one_hot`'s vocabulary form from `one_hot(i, n)`.
pub(super) fn is_list(t: &DataType) -> bool {
    matches!(
        t,
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..)
    )
}

/// The argument types of a vocabulary call `(value, vocabulary [, unknown])`
/// after coercion: strings and dictionaries of strings keep their type (the
/// dictionary is what makes encoding cheap), a list of strings keeps its
/// type too (a cast would hide the constant from `return_field_from_args`,
/// which needs it for the plan's schema), a list of NULLs becomes a list of
/// Utf8 and the option Utf8.
pub(super) fn coerce(encoder: &Encoder, arg_types: &[DataType]) -> Result<Vec<DataType>> {
    let Encoder {
        function, syntax, ..
    } = encoder;
    crate::check_arity(function, syntax, arg_types.len(), &[2, 3])?;
    let value = match &arg_types[0] {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => arg_types[0].clone(),
        DataType::Dictionary(_, v) if v.is_string() => arg_types[0].clone(),
        DataType::Null => DataType::Utf8,
        other => {
            return plan_err!(
                "{function}: the value must be a string or a dictionary of strings, got \
                 {other}; signature: {syntax}"
            );
        }
    };
    let vocabulary = match &arg_types[1] {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
            if f.data_type().is_string() =>
        {
            Some(arg_types[1].clone())
        }
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _)
            if *f.data_type() == DataType::Null =>
        {
            Some(DataType::new_list(DataType::Utf8, true))
        }
        _ => None,
    };
    let Some(vocabulary) = vocabulary else {
        return plan_err!(
            "{function}: the vocabulary must be a constant list of strings such as \
             ['a', 'b'], got {}; signature: {syntax}",
            arg_types[1]
        );
    };
    let mut types = vec![value, vocabulary];
    if let Some(option) = arg_types.get(2) {
        if !(option.is_string() || *option == DataType::Null) {
            return plan_err!(
                "{function}: the third argument must be the string 'error' or '{}', got \
                 {option}; signature: {syntax}",
                encoder.fallback
            );
        }
        types.push(DataType::Utf8);
    }
    Ok(types)
}

/// The third argument, checked: absent means [`OnUnknown::Error`].
pub(super) fn on_unknown(
    encoder: &Encoder,
    value: Option<Option<&ScalarValue>>,
) -> Result<OnUnknown> {
    let Some(value) = value else {
        return Ok(OnUnknown::Error);
    };
    let accepted = format!("'error' (the default) or '{}'", encoder.fallback);
    let option = match value {
        Some(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
        ) => s,
        _ => {
            return plan_err!(
                "{}: the third argument must be a constant string, {accepted}; \
                 signature: {}",
                encoder.function,
                encoder.syntax
            );
        }
    };
    if option.eq_ignore_ascii_case("error") {
        Ok(OnUnknown::Error)
    } else if option.eq_ignore_ascii_case(encoder.fallback) {
        Ok(OnUnknown::MinusOne)
    } else {
        plan_err!(
            "{}: unknown option '{option}' for values outside the vocabulary; accepted: \
             {accepted} ({})",
            encoder.function,
            encoder.fallback_result
        )
    }
}

/// The checked vocabulary of a call: its entries in order and the position
/// of each.
#[derive(Debug)]
pub(super) struct Vocabulary {
    /// The entries, in the order the call lists them.
    entries: Vec<String>,
    /// Position of each entry in `entries`.
    positions: HashMap<String, usize>,
}

impl Vocabulary {
    /// The vocabulary argument `value` of `encoder`'s call: a non-null
    /// constant list of distinct, non-null strings, at least one. `None`:
    /// the argument is not a constant when the plan is built.
    pub(super) fn try_new(
        encoder: &Encoder,
        value: Option<&ScalarValue>,
    ) -> Result<Self> {
        let Encoder {
            function, syntax, ..
        } = encoder;
        let Some(value) = value else {
            // The plan's schema needs the vocabulary (`one_hot`'s width), so
            // it must be known before any row is read.
            return plan_err!(
                "{function}: the vocabulary must be a constant list of strings written \
                 in the query, such as ['a', 'b']; got an argument that is not a \
                 constant when the query is planned (a column, a subquery, a function \
                 call such as make_array(...), or a list with a NULL entry); \
                 signature: {syntax}"
            );
        };
        let not_a_list = || {
            plan_datafusion_err!(
                "{function}: the vocabulary must be a non-null constant list of strings \
                 such as ['a', 'b']; signature: {syntax}"
            )
        };
        let list = match value.cast_to(&DataType::new_list(DataType::Utf8, true)) {
            Ok(ScalarValue::List(list)) if list.len() == 1 && !list.is_null(0) => list,
            _ => return Err(not_a_list()),
        };
        let items = list.value(0);
        let items = items.as_string_opt::<i32>().ok_or_else(not_a_list)?;
        if items.is_empty() {
            return plan_err!(
                "{function}: the vocabulary must not be empty; signature: {syntax}"
            );
        }
        let mut entries = Vec::with_capacity(items.len());
        let mut positions = HashMap::with_capacity(items.len());
        for (position, item) in items.iter().enumerate() {
            let Some(item) = item else {
                return plan_err!(
                    "{function}: the vocabulary must not contain NULL (entry {position})"
                );
            };
            if let Some(first) = positions.insert(item.to_string(), position) {
                return plan_err!(
                    "{function}: {} appears twice in the vocabulary, at positions {first} \
                     and {position}; each value needs one position",
                    quoted(item)
                );
            }
            entries.push(item.to_string());
        }
        Ok(Self { entries, positions })
    }

    /// The number of entries.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The code of `value` in row `row`: its position, or what `on_unknown`
    /// says for a value outside the vocabulary.
    fn code(
        &self,
        encoder: &Encoder,
        value: &str,
        row: usize,
        on_unknown: OnUnknown,
    ) -> Result<i64> {
        match self.positions.get(value) {
            Some(position) => Ok(*position as i64),
            None => self.unknown(encoder, value, row, on_unknown),
        }
    }

    /// The code of a value outside the vocabulary, or the error naming it.
    fn unknown(
        &self,
        encoder: &Encoder,
        value: &str,
        row: usize,
        on_unknown: OnUnknown,
    ) -> Result<i64> {
        match on_unknown {
            OnUnknown::MinusOne => Ok(-1),
            OnUnknown::Error => exec_err!(
                "{}: value {} in row {row} is not in the vocabulary {}; add it to the \
                 vocabulary, or pass '{}' as the third argument to make values outside \
                 it {}: {}",
                encoder.function,
                quoted(value),
                self.summary(),
                encoder.fallback,
                encoder.fallback_result,
                encoder.syntax
            ),
        }
    }

    /// The first few entries, for messages: `['a', 'b', …] (12 entries)`.
    fn summary(&self) -> String {
        let shown: Vec<String> = self
            .entries
            .iter()
            .take(SHOWN_ENTRIES)
            .map(|e| quoted(e))
            .collect();
        if self.entries.len() <= SHOWN_ENTRIES {
            format!("[{}]", shown.join(", "))
        } else {
            format!("[{}, …] ({} entries)", shown.join(", "), self.entries.len())
        }
    }
}

/// `value` in single quotes, shortened when long.
fn quoted(value: &str) -> String {
    match value.char_indices().nth(SHOWN_VALUE_CHARS) {
        Some((end, _)) => format!("'{}…'", &value[..end]),
        None => format!("'{value}'"),
    }
}

/// The code of every row of `values` (a string array or a dictionary of
/// strings, as [`coerce`] leaves them): the position in `vocabulary`, NULL
/// for NULL, and for a value outside it -1 or the error `on_unknown` asks
/// for. Row numbers in errors count from the batch's first row.
pub(super) fn encode(
    encoder: &Encoder,
    values: &ArrayRef,
    vocabulary: &Vocabulary,
    on_unknown: OnUnknown,
) -> Result<Int64Array> {
    let rows = |strings: &mut dyn Iterator<Item = Option<&str>>| {
        strings
            .enumerate()
            .map(|(row, v)| {
                v.map(|v| vocabulary.code(encoder, v, row, on_unknown))
                    .transpose()
            })
            .collect::<Result<Int64Array>>()
    };
    match values.data_type() {
        DataType::Utf8 => rows(&mut values.as_string::<i32>().iter()),
        DataType::LargeUtf8 => rows(&mut values.as_string::<i64>().iter()),
        DataType::Utf8View => rows(&mut values.as_string_view().iter()),
        DataType::Dictionary(..) => match values.as_any_dictionary_opt() {
            Some(dictionary) => {
                encode_dictionary(encoder, dictionary, vocabulary, on_unknown)
            }
            None => Err(internal(encoder, values.data_type())),
        },
        DataType::Null => Ok(Int64Array::new_null(values.len())),
        other => Err(internal(encoder, other)),
    }
}

fn internal(encoder: &Encoder, t: &DataType) -> DataFusionError {
    internal_datafusion_err!(
        "{}: values of type {t} reached the encoder; coerce_types admits strings only",
        encoder.function
    )
}

/// The code of one dictionary value.
#[derive(Debug, Clone, Copy)]
enum ValueCode {
    /// A NULL dictionary value: rows referring to it are NULL.
    Null,
    /// The position in the vocabulary.
    Position(i64),
    /// Outside the vocabulary: an error or -1, but only for rows that refer
    /// to it.
    Unknown,
}

/// [`encode`] of a dictionary: each dictionary value once, then the keys.
fn encode_dictionary(
    encoder: &Encoder,
    dictionary: &dyn AnyDictionaryArray,
    vocabulary: &Vocabulary,
    on_unknown: OnUnknown,
) -> Result<Int64Array> {
    let strings = string_values(encoder, dictionary.values())?;
    if strings.is_empty() {
        // Every key is NULL (a valid key needs a value), and
        // `normalized_keys` panics on an empty dictionary.
        return Ok(Int64Array::new_null(dictionary.len()));
    }
    let codes: Vec<ValueCode> = strings
        .iter()
        .map(|s| match s {
            None => ValueCode::Null,
            Some(s) => vocabulary
                .positions
                .get(*s)
                .map_or(ValueCode::Unknown, |p| ValueCode::Position(*p as i64)),
        })
        .collect();
    let keys = dictionary.normalized_keys();
    let mut out = Int64Builder::with_capacity(keys.len());
    for (row, key) in keys.into_iter().enumerate() {
        if dictionary.is_null(row) {
            out.append_null();
            continue;
        }
        match codes.get(key) {
            Some(ValueCode::Position(p)) => out.append_value(*p),
            Some(ValueCode::Null) => out.append_null(),
            Some(ValueCode::Unknown) => {
                let value = strings.get(key).copied().flatten().unwrap_or_default();
                out.append_value(vocabulary.unknown(encoder, value, row, on_unknown)?);
            }
            None => {
                return internal_err!(
                    "{}: dictionary key {key} in row {row} is outside its {} values",
                    encoder.function,
                    codes.len()
                );
            }
        }
    }
    Ok(out.finish())
}

/// The strings of a dictionary's values array.
fn string_values<'a>(
    encoder: &Encoder,
    values: &'a ArrayRef,
) -> Result<Vec<Option<&'a str>>> {
    Ok(match values.data_type() {
        DataType::Utf8 => values.as_string::<i32>().iter().collect(),
        DataType::LargeUtf8 => values.as_string::<i64>().iter().collect(),
        DataType::Utf8View => values.as_string_view().iter().collect(),
        other => return Err(internal(encoder, other)),
    })
}

/// The vocabulary and option of a vocabulary call's arguments at execution,
/// where they are the literals the plan was built with (`['a', 'b']` is one
/// from SQL planning on, see [`crate::planner`]).
pub(super) fn parameters(
    encoder: &Encoder,
    args: &[ColumnarValue],
) -> Result<(Vocabulary, OnUnknown)> {
    let scalar = |i: usize| match args.get(i) {
        Some(ColumnarValue::Scalar(v)) => Some(Some(v)),
        Some(ColumnarValue::Array(_)) => Some(None),
        None => None,
    };
    let vocabulary = Vocabulary::try_new(encoder, scalar(1).flatten())?;
    Ok((vocabulary, on_unknown(encoder, scalar(2))?))
}

crate::coercing_function! {
    /// `label_encode(value, ['a', 'b', ...] [, '-1'])`: the int64 position of
    /// `value` in the vocabulary; see the module docs.
    pub struct LabelEncodeFunc;
}

impl ScalarUDFImpl for LabelEncodeFunc {
    crate::function_basics!("label_encode");

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        coerce(&LABEL_ENCODER, arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int64)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        // Both are literals when the plan is built (`['a', 'b']` through
        // `crate::planner`): check them once, not per batch.
        Vocabulary::try_new(
            &LABEL_ENCODER,
            args.scalar_arguments.get(1).copied().flatten(),
        )?;
        if let Some(Some(option)) = args.scalar_arguments.get(2) {
            on_unknown(&LABEL_ENCODER, Some(Some(option)))?;
        }
        Ok(crate::nullable_like_first(
            "label_encode",
            DataType::Int64,
            &args,
        ))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (vocabulary, on_unknown) = parameters(&LABEL_ENCODER, &args.args)?;
        let values = args.args[0].to_array(args.number_rows)?;
        let codes = encode(&LABEL_ENCODER, &values, &vocabulary, on_unknown)?;
        Ok(ColumnarValue::Array(Arc::new(codes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::test_util::{
        PENGUINS, penguins, query, query_error, query_table,
    };
    use datafusion::arrow::datatypes::Int64Type;

    fn codes(array: &ArrayRef) -> Vec<Option<i64>> {
        array.as_primitive::<Int64Type>().iter().collect()
    }

    #[tokio::test]
    async fn label_encode_utf8_is_the_position_in_the_vocabulary() -> Result<()> {
        let out = query(&format!(
            "SELECT label_encode(s, {PENGUINS}) FROM \
             (VALUES ('Gentoo'), ('Adelie'), (NULL), ('Chinstrap')) AS t(s)"
        ))
        .await?;
        assert_eq!(out.data_type(), &DataType::Int64);
        assert_eq!(codes(&out), vec![Some(2), Some(0), None, Some(1)]);
        Ok(())
    }

    #[tokio::test]
    async fn label_encode_large_utf8_and_utf8_view() -> Result<()> {
        for t in ["LargeUtf8", "Utf8View"] {
            let out = query(&format!(
                "SELECT label_encode(arrow_cast(s, '{t}'), {PENGUINS}) FROM \
                 (VALUES ('Chinstrap'), (NULL), ('Gentoo')) AS t(s)"
            ))
            .await?;
            assert_eq!(codes(&out), vec![Some(1), None, Some(2)], "{t}");
        }
        Ok(())
    }

    #[tokio::test]
    async fn label_encode_dictionary_maps_keys_and_ignores_unused_values() -> Result<()> {
        // Keys 0 Gentoo, 2 Adelie, NULL key, 3 NULL value, 4 Chinstrap;
        // 'Emperor' (1) is in the dictionary but no row refers to it.
        let batch = penguins(vec![Some(0), Some(2), None, Some(3), Some(4), Some(0)])?;
        let sql = format!("SELECT label_encode(species, {PENGUINS}) FROM t");
        let out = query_table(&sql, batch).await?;
        assert_eq!(
            codes(&out),
            vec![Some(2), Some(0), None, None, Some(1), Some(2)]
        );
        Ok(())
    }

    #[tokio::test]
    async fn label_encode_dictionary_unknown_names_value_and_row() -> Result<()> {
        let batch = penguins(vec![Some(0), Some(2), Some(1)])?;
        let sql = format!("SELECT label_encode(species, {PENGUINS}) FROM t");
        let err = query_table(&sql, batch.clone())
            .await
            .expect_err("'Emperor' is not in the vocabulary")
            .to_string();
        assert!(
            err.contains(
                "label_encode: value 'Emperor' in row 2 is not in the vocabulary \
                 ['Adelie', 'Chinstrap', 'Gentoo']"
            ),
            "{err}"
        );
        assert!(err.contains("pass '-1' as the third argument"), "{err}");
        let sql = format!("SELECT label_encode(species, {PENGUINS}, '-1') FROM t");
        let out = query_table(&sql, batch).await?;
        assert_eq!(codes(&out), vec![Some(2), Some(0), Some(-1)]);
        Ok(())
    }

    #[tokio::test]
    async fn label_encode_unknown_utf8_is_an_error_or_minus_one() -> Result<()> {
        let sql = |option: &str| {
            format!(
                "SELECT label_encode(s, {PENGUINS}{option}) FROM \
                 (VALUES ('Adelie'), ('Emperor')) AS t(s)"
            )
        };
        query_error(&sql(""), &["value 'Emperor' in row 1"]).await;
        query_error(&sql(", 'error'"), &["value 'Emperor' in row 1"]).await;
        let out = query(&sql(", '-1'")).await?;
        assert_eq!(codes(&out), vec![Some(0), Some(-1)]);
        Ok(())
    }

    #[tokio::test]
    async fn label_encode_bad_vocabulary_or_option_is_a_plan_error() {
        let err = query_error(
            "SELECT label_encode('a', ['a', 'b', 'a'])",
            &["'a' appears twice in the vocabulary, at positions 0 and 2"],
        )
        .await;
        assert!(err.contains("Error during planning"), "{err}");
        let err = query_error(
            "SELECT label_encode('a', ['a'], 'zeros')",
            &[
                "unknown option 'zeros'",
                "accepted: 'error' (the default) or '-1'",
            ],
        )
        .await;
        assert!(err.contains("Error during planning"), "{err}");
        query_error(
            "SELECT label_encode('a', [1, 2])",
            &["constant list of strings"],
        )
        .await;
        query_error(
            "SELECT label_encode(1, ['a'])",
            &["the value must be a string"],
        )
        .await;
        // `['a', NULL]` stays a `make_array` call (`crate::planner` plans
        // lists of strings only), so it is no constant either.
        query_error(
            "SELECT label_encode('a', ['a', NULL])",
            &["a list with a NULL entry"],
        )
        .await;
        query_error(
            "SELECT label_encode(s, [s]) FROM (VALUES ('a')) AS t(s)",
            &["constant list of strings written in the query"],
        )
        .await;
    }

    #[tokio::test]
    async fn large_utf8_and_utf8_view_vocabulary_literals_stay_constants() -> Result<()> {
        use datafusion::prelude::{SessionContext, col, lit};
        // The DataFrame API can pass any list literal; coercing it to a list
        // of Utf8 would wrap it in a cast, which is no constant at planning.
        let ctx = SessionContext::new();
        crate::register_all(&ctx)?;
        ctx.sql("CREATE TABLE t AS SELECT * FROM (VALUES ('b'), ('a')) AS v(s)")
            .await?
            .collect()
            .await?;
        for item in [DataType::LargeUtf8, DataType::Utf8View] {
            let entries: Vec<ScalarValue> = ["a", "b"]
                .iter()
                .map(|e| ScalarValue::from(*e).cast_to(&item))
                .collect::<Result<_>>()?;
            let vocabulary =
                ScalarValue::List(ScalarValue::new_list_nullable(&entries, &item));
            let label_encode =
                datafusion::logical_expr::ScalarUDF::from(LabelEncodeFunc::new());
            let df = ctx
                .table("t")
                .await?
                .select(vec![label_encode.call(vec![col("s"), lit(vocabulary)])])?;
            let batches = df.collect().await?;
            assert_eq!(
                codes(batches[0].column(0)),
                vec![Some(1), Some(0)],
                "{item}"
            );
        }
        Ok(())
    }

    #[test]
    fn error_messages_show_the_first_entries_and_shorten_values() -> Result<()> {
        let entries: Vec<String> = (0..12).map(|i| format!("c{i}")).collect();
        let vocabulary = Vocabulary::try_new(
            &LABEL_ENCODER,
            Some(&ScalarValue::List(ScalarValue::new_list_nullable(
                &entries
                    .iter()
                    .map(|e| ScalarValue::from(e.as_str()))
                    .collect::<Vec<_>>(),
                &DataType::Utf8,
            ))),
        )?;
        assert_eq!(vocabulary.len(), 12);
        assert_eq!(
            vocabulary.summary(),
            "['c0', 'c1', 'c2', 'c3', 'c4', …] (12 entries)"
        );
        let long = "x".repeat(200);
        let err = vocabulary
            .code(&LABEL_ENCODER, &long, 7, OnUnknown::Error)
            .expect_err("not in the vocabulary")
            .to_string();
        assert!(
            err.contains(&format!("'{}…' in row 7", "x".repeat(80))),
            "{err}"
        );
        Ok(())
    }
}
