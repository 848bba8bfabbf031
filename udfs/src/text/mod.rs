//! Text: Hugging Face tokenizers and the list helpers around them.
//!
//! | function | returns |
//! |---|---|
//! | `tokenize(text, tokenizer [, max_len])` | list<int32>: the ids of `text`, special tokens included, truncated to `max_len` |
//! | `tokenize_pair(a, b, tokenizer [, max_len])` | list<int32>: the ids of the pair (`[CLS] a [SEP] b [SEP]` for BERT-like tokenizers) |
//! | `attention_mask(ids [, len])` | list<int8>: 1 per id; with `len`, padded with 0 (or cut) to exactly `len` |
//! | `pad(list, len, value)` | the list, followed by `value` up to `len` elements (longer lists are unchanged) |
//! | `truncate(list, len)` | the first `len` elements |
//!
//! `tokenizer` is the path or URL (`s3://`, `gs://`, `az://`, `https://`, read
//! through the session's object stores) of a `tokenizer.json` (the file
//! `save_pretrained` writes). It must be a constant: it is loaded when the query is planned,
//! so a missing or invalid file is a plan-time error naming the location, and it
//! is loaded once per session and `max_len` and then cached. The file's own
//! padding is ignored (lists stay variable-length; the feed pads per batch)
//! and its truncation applies unless `max_len` is given.
//!
//! ```sql
//! SELECT tokenize('hello world', 'tokenizer.json', 16) AS ids;
//! -- [101, 7592, 2088, 102]  (with bert-base-uncased's tokenizer.json)
//! SELECT pad(truncate(ids, 8), 8, 0), attention_mask(ids, 8) FROM t;
//! ```

mod lists;
mod tokenize;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::logical_expr::ScalarUDF;

use std::sync::Arc;

use crate::{AssetReader, FunctionInfo, check_arity};

/// The registered functions of this family; tokenizers load from local paths.
pub fn functions() -> Vec<ScalarUDF> {
    functions_with(None)
}

/// The registered functions of this family; tokenizers named by URL are read
/// through `assets`.
pub fn functions_with(assets: Option<Arc<dyn AssetReader>>) -> Vec<ScalarUDF> {
    vec![
        ScalarUDF::from(tokenize::TokenizeFunc::new(false, assets.clone())),
        ScalarUDF::from(tokenize::TokenizeFunc::new(true, assets)),
        ScalarUDF::from(lists::AttentionMaskFunc::new()),
        ScalarUDF::from(lists::ShapeFunc::pad()),
        ScalarUDF::from(lists::ShapeFunc::truncate()),
    ]
}

/// `udf` as a [`ReadsAssets`](crate::ReadsAssets) if it is `tokenize` or
/// `tokenize_pair` (the functions of this family that read files).
pub(crate) fn reads_assets(udf: &ScalarUDF) -> Option<&dyn crate::ReadsAssets> {
    udf.inner()
        .downcast_ref::<tokenize::TokenizeFunc>()
        .map(|f| f as &dyn crate::ReadsAssets)
}

/// Listings for `\functions`.
pub fn infos() -> Vec<FunctionInfo> {
    let info = crate::listing("text");
    vec![
        info(
            "tokenize",
            "tokenize(text, tokenizer_json [, max_len])",
            "list<int32> token ids (Hugging Face tokenizers; special tokens included)",
            &[
                ("text", "a string"),
                (
                    "tokenizer_json",
                    "a constant path or URL (s3://, gs://, az://, https://) of a tokenizer.json",
                ),
                ("max_len", "a constant integer: truncate to this many ids"),
            ][..],
            "SELECT tokenize('hello world', 'udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json') AS ids;",
            "+------------------------+\n| ids                    |\n+------------------------+\n| [101, 7592, 2088, 102] |\n+------------------------+",
        ),
        info(
            "tokenize_pair",
            "tokenize_pair(a, b, tokenizer_json [, max_len])",
            "list<int32> token ids of a sentence pair",
            &[
                ("a", "the first sentence"),
                ("b", "the second sentence"),
                ("tokenizer_json", "as for tokenize"),
                (
                    "max_len",
                    "a constant integer: truncate the pair to this many ids",
                ),
            ],
            "SELECT tokenize_pair('hi', 'there', 'udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json') AS ids;",
            "+-----------------------------+\n| ids                         |\n+-----------------------------+\n| [101, 7632, 102, 2045, 102] |\n+-----------------------------+",
        ),
        info(
            "attention_mask",
            "attention_mask(ids [, len])",
            "list<int8>: 1 per id, padded with 0 to len",
            &[
                ("ids", "a list (token ids)"),
                ("len", "a constant integer: the padded length"),
            ],
            "SELECT attention_mask([101, 7592, 102], 5) AS mask;",
            "+-----------------+\n| mask            |\n+-----------------+\n| [1, 1, 1, 0, 0] |\n+-----------------+",
        ),
        info(
            "pad",
            "pad(list, len, value)",
            "the list followed by value up to len elements",
            &[
                ("list", "a list"),
                ("len", "a constant integer: the length to pad to"),
                ("value", "the padding value"),
            ],
            "SELECT pad([1, 2, 3], 5, 0) AS p;",
            "+-----------------+\n| p               |\n+-----------------+\n| [1, 2, 3, 0, 0] |\n+-----------------+",
        ),
        info(
            "truncate",
            "truncate(list, len)",
            "the first len elements of the list",
            &[
                ("list", "a list"),
                ("len", "a constant integer: the most elements kept"),
            ],
            "SELECT truncate([1, 2, 3], 2) AS t;",
            "+--------+\n| t      |\n+--------+\n| [1, 2] |\n+--------+",
        ),
    ]
}

/// An integer argument's type, or a plan error naming it.
fn integer_arg(
    function: &str,
    syntax: &str,
    position: usize,
    t: &DataType,
) -> Result<DataType> {
    if t.is_integer() || *t == DataType::Null {
        Ok(DataType::Int64)
    } else {
        plan_err!(
            "{function}: argument {} must be an integer, got {t}; signature: {syntax}",
            position + 1
        )
    }
}

/// A list argument's type, or a plan error naming it.
fn list_arg(
    function: &str,
    syntax: &str,
    position: usize,
    t: &DataType,
) -> Result<DataType> {
    match t {
        DataType::List(child)
        | DataType::LargeList(child)
        | DataType::FixedSizeList(child, _)
            if child.data_type().is_numeric() || *child.data_type() == DataType::Null =>
        {
            Ok(DataType::new_list(child.data_type().clone(), true))
        }
        other => plan_err!(
            "{function}: argument {} must be a list of numbers, got {other}; signature: {syntax}",
            position + 1
        ),
    }
}

/// Whether `function` (a `ScalarUDFImpl` as `Any`) is `tokenize` or
/// `tokenize_pair`.
pub(crate) fn is_tokenizer(function: &dyn std::any::Any) -> bool {
    function.is::<tokenize::TokenizeFunc>()
}

#[cfg(test)]
mod tests;
