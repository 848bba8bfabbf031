//! A sqlfeed function plugin: two functions a feature pipeline needs that
//! sqlfeed does not ship, built as a `cdylib` and loaded at run time.
//!
//! * `ngram_hash(text, n, buckets)`: fastText's subword features. Every
//!   character n-gram of `text` hashed (xxh3-64) to a bucket in
//!   `[0, buckets)`, as a list of ids; the same on every machine and in every
//!   run; NULL stays NULL.
//! * `token_dropout(tokens, probability, seed)`: a list of token ids with
//!   each id dropped with `probability`, drawn from the row's tokens and the
//!   feed's (seed, epoch) through `sqlfeed_plugin::epoch_seed`, so the
//!   augmentation differs per epoch and reproduces on resume. Costly: under
//!   `SHUFFLE` it runs after the shuffle, on the rows kept.
//!
//! * `geo_mean(x)`: an aggregate, the geometric mean of the positive values.
//!
//! See this folder's README for building and loading it.

use std::sync::Arc;

use sqlfeed_plugin::datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int64Builder, ListBuilder,
};
use sqlfeed_plugin::datafusion::arrow::datatypes::{
    DataType, Field, Float64Type, Int64Type, UInt64Type,
};
use sqlfeed_plugin::datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use sqlfeed_plugin::datafusion::logical_expr::{
    Accumulator, AggregateUDF, ColumnarValue, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility, create_udaf,
};
use sqlfeed_plugin::{Functions, epoch_seed, export_plugin};

/// The functions this library exports.
fn functions() -> Functions {
    Functions::new()
        .scalar(Arc::new(ScalarUDF::from(NgramHash::new())))
        .costly_scalar(Arc::new(ScalarUDF::from(TokenDropout::new())))
        .aggregate(Arc::new(geo_mean()))
}

/// `geo_mean(x)`: the geometric mean of the positive values of `x` (NULL
/// if there are none), e.g. of per-file compression ratios or growth
/// factors; computed as exp(mean(ln x)) so that it cannot overflow.
pub fn geo_mean() -> AggregateUDF {
    create_udaf(
        "geo_mean",
        vec![DataType::Float64],
        Arc::new(DataType::Float64),
        Volatility::Immutable,
        Arc::new(|_| Ok(Box::new(GeoMean::default()))),
        Arc::new(vec![DataType::Float64, DataType::UInt64]),
    )
}

/// The running sum of logarithms and count of `geo_mean`.
#[derive(Debug, Default)]
struct GeoMean {
    log_sum: f64,
    count: u64,
}

impl Accumulator for GeoMean {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        for value in values[0].as_primitive::<Float64Type>().iter().flatten() {
            if value > 0.0 {
                self.log_sum += value.ln();
                self.count += 1;
            }
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let sums = states[0].as_primitive::<Float64Type>();
        let counts = states[1].as_primitive::<UInt64Type>();
        for (sum, count) in sums.iter().zip(counts.iter()) {
            self.log_sum += sum.unwrap_or(0.0);
            self.count += count.unwrap_or(0);
        }
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::Float64(Some(self.log_sum)),
            ScalarValue::UInt64(Some(self.count)),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Float64(
            (self.count > 0).then(|| (self.log_sum / self.count as f64).exp()),
        ))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
}

export_plugin!(functions);

/// `ngram_hash(text, n, buckets)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NgramHash {
    signature: Signature,
}

impl NgramHash {
    /// The function.
    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl Default for NgramHash {
    fn default() -> Self {
        Self::new()
    }
}

/// The value of constant argument `what` of `function`. sqlfeed hands a
/// plugin its constants as `ColumnarValue::Scalar`, as DataFusion hands them
/// to a built-in function; only in a call over one row may a constant come
/// as an array of that row (the same values), which is taken too.
fn constant(function: &str, what: &str, value: &ColumnarValue) -> Result<ScalarValue> {
    match value {
        ColumnarValue::Scalar(scalar) => Ok(scalar.clone()),
        ColumnarValue::Array(array) if array.len() == 1 => {
            ScalarValue::try_from_array(array, 0)
        }
        ColumnarValue::Array(_) => {
            exec_err!("{function}: {what} must be a constant, not a column")
        }
    }
}

/// A positive integer constant argument `what` of `function`.
fn positive_constant(function: &str, what: &str, value: &ColumnarValue) -> Result<u64> {
    match constant(function, what, value)? {
        ScalarValue::Int64(Some(v)) if v > 0 => Ok(v as u64),
        other => exec_err!("{function}: {what} must be a positive integer, got {other}"),
    }
}

impl ScalarUDFImpl for NgramHash {
    fn name(&self) -> &str {
        "ngram_hash"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let [text, n, buckets] = arg_types else {
            return plan_err!(
                "ngram_hash takes 3 arguments (text, n, buckets), got {}",
                arg_types.len()
            );
        };
        if !matches!(
            text,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
        ) {
            return plan_err!("ngram_hash hashes strings, not {text}");
        }
        if !(n.is_integer() && buckets.is_integer()) {
            return plan_err!(
                "ngram_hash(text, n, buckets): n and buckets are integers, got {n} and {buckets}"
            );
        }
        Ok(vec![DataType::Utf8, DataType::Int64, DataType::Int64])
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(token_list_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        if rows == 0 {
            return Ok(ColumnarValue::Array(Arc::new(
                ListBuilder::new(Int64Builder::new())
                    .with_field(Arc::new(Field::new_list_field(DataType::Int64, true)))
                    .finish(),
            )));
        }
        let n = positive_constant("ngram_hash", "n", &args.args[1])? as usize;
        let buckets = positive_constant("ngram_hash", "buckets", &args.args[2])?;
        let texts = args.args[0].to_array(rows)?;
        let texts = texts.as_string::<i32>();
        let mut out = ListBuilder::new(Int64Builder::new())
            .with_field(Arc::new(Field::new_list_field(DataType::Int64, true)));
        let mut boundaries = Vec::new();
        for text in texts.iter() {
            let Some(text) = text else {
                out.append_null();
                continue;
            };
            // Character n-grams (not byte n-grams: a multi-byte character is
            // one unit), each hashed to a bucket: fastText's subword trick.
            boundaries.clear();
            boundaries.extend(text.char_indices().map(|(i, _)| i));
            boundaries.push(text.len());
            let chars = boundaries.len() - 1;
            for start in 0..chars.saturating_sub(n - 1) {
                let gram = &text[boundaries[start]..boundaries[start + n]];
                let hash = xxhash_rust::xxh3::xxh3_64(gram.as_bytes());
                out.values().append_value((hash % buckets) as i64);
            }
            out.append(true);
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish()) as ArrayRef))
    }
}

/// `token_dropout(tokens, probability, seed)`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct TokenDropout {
    signature: Signature,
}

impl TokenDropout {
    /// The function.
    pub fn new() -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl Default for TokenDropout {
    fn default() -> Self {
        Self::new()
    }
}

fn token_list_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true)))
}

impl ScalarUDFImpl for TokenDropout {
    fn name(&self) -> &str {
        "token_dropout"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let [tokens, probability, seed] = arg_types else {
            return plan_err!(
                "token_dropout takes 3 arguments (tokens, probability, seed), got {}",
                arg_types.len()
            );
        };
        let is_int_list = match tokens {
            DataType::List(f)
            | DataType::LargeList(f)
            | DataType::FixedSizeList(f, _) => f.data_type().is_integer(),
            _ => false,
        };
        if !is_int_list {
            return plan_err!(
                "token_dropout's tokens must be a list of integers, not {tokens}"
            );
        }
        if !(probability.is_numeric() && seed.is_integer()) {
            return plan_err!(
                "token_dropout(tokens, probability, seed): probability is a number, \
                 seed an integer; got {probability} and {seed}"
            );
        }
        Ok(vec![token_list_type(), DataType::Float64, DataType::Int64])
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(token_list_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        if rows == 0 {
            return Ok(ColumnarValue::Array(args.args[0].to_array(0)?));
        }
        let probability = match constant("token_dropout", "probability", &args.args[1])? {
            ScalarValue::Float64(Some(p)) if (0.0..=1.0).contains(&p) => p,
            other => {
                return exec_err!(
                    "token_dropout: probability must be in [0, 1], got {other}"
                );
            }
        };
        let seed = match constant("token_dropout", "seed", &args.args[2])? {
            ScalarValue::Int64(Some(s)) => s as u64,
            other => {
                return exec_err!("token_dropout: seed must be an integer, got {other}");
            }
        };
        let seed = epoch_seed(seed, &args.config_options);
        // Keep a token when its draw is above this threshold.
        let threshold = (probability * u64::MAX as f64) as u64;
        let lists = args.args[0].to_array(rows)?;
        let lists = lists.as_list::<i32>();
        let mut out = ListBuilder::new(Int64Builder::new())
            .with_field(Arc::new(Field::new_list_field(DataType::Int64, true)));
        for row in 0..lists.len() {
            if lists.is_null(row) {
                out.append_null();
                continue;
            }
            let tokens = lists.value(row);
            let tokens = tokens.as_primitive::<Int64Type>();
            // The row's draws depend on its own tokens, not on its position:
            // the same row gets the same dropout wherever it lands.
            let row_seed =
                xxhash_rust::xxh3::xxh3_64_with_seed(&bytes_of(tokens.values()), seed);
            for (i, token) in tokens.iter().enumerate() {
                let draw = sqlfeed_plugin::splitmix64(row_seed ^ i as u64);
                if draw >= threshold {
                    out.values().append_option(token);
                }
            }
            out.append(true);
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

/// The little-endian bytes of `values`.
fn bytes_of(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_lists_both_functions() {
        let module = sqlfeed_plugin_module();
        assert!(!module.failed);
        assert_eq!(module.scalar_count, 2);
        assert_eq!(module.aggregate_count, 1);
        let header = sqlfeed_plugin_header();
        assert_eq!(header.plugin_name(), "sqlfeed-udf-plugin");
    }
}
