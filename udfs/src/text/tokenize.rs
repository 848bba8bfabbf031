//! `tokenize` and `tokenize_pair` on the Hugging Face `tokenizers` crate.
//!
//! A session loads each `tokenizer.json` once and keeps it with the xxh3 of
//! the bytes it was built from. The result cache asks for that fingerprint
//! through [`ReadsAssets::pin_asset`], which reloads a file whose content
//! changed, so that what the cache keys and what the function computes with
//! are always the same bytes.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::sync::{Arc, Mutex, MutexGuard};

use datafusion::arrow::array::{Array, AsArray, Int32Builder, ListBuilder};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::ScalarValue;
use datafusion::common::{
    exec_datafusion_err, internal_datafusion_err, plan_datafusion_err, plan_err,
};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature,
    Volatility,
};
use tokenizers::{Tokenizer, TruncationParams};
use xxhash_rust::xxh3::{Xxh3, xxh3_128};

use crate::{AssetFingerprint, AssetReader, ReadsAssets};

const TOKENIZE: &str = "tokenize(text, tokenizer_json [, max_len])";
const TOKENIZE_PAIR: &str = "tokenize_pair(a, b, tokenizer_json [, max_len])";

/// A `tokenizer.json` as loaded, padding removed.
#[derive(Debug)]
struct LoadedFile {
    /// The bytes it was built from.
    fingerprint: AssetFingerprint,
    tokenizer: Tokenizer,
}

/// The tokenizers a session has loaded.
#[derive(Debug, Default)]
struct Loaded {
    /// By location: the file as last loaded (or pinned).
    files: HashMap<String, Arc<LoadedFile>>,
    /// By (location, max_len): derived from `files`, with the fingerprint of
    /// the file they came from; one whose file was reloaded since is stale.
    tokenizers: HashMap<(String, Option<usize>), (AssetFingerprint, Arc<Tokenizer>)>,
}

type Cache = Mutex<Loaded>;

/// `tokenize` (one text) or `tokenize_pair` (two); see the module docs.
#[derive(Debug)]
pub struct TokenizeFunc {
    signature: Signature,
    /// `tokenize_pair`.
    pair: bool,
    /// This session's loaded tokenizers.
    cache: Arc<Cache>,
    /// Reads tokenizers named by URL; `None` = local paths only.
    assets: Option<Arc<dyn AssetReader>>,
}

// The cache is state, not identity: two instances are the same function.
impl PartialEq for TokenizeFunc {
    fn eq(&self, other: &Self) -> bool {
        self.pair == other.pair && self.signature == other.signature
    }
}
impl Eq for TokenizeFunc {}
impl Hash for TokenizeFunc {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.pair.hash(state);
        self.signature.hash(state);
    }
}

impl TokenizeFunc {
    pub(super) fn new(pair: bool, assets: Option<Arc<dyn AssetReader>>) -> Self {
        Self {
            signature: Signature::user_defined(Volatility::Immutable),
            pair,
            cache: Arc::new(Mutex::new(Loaded::default())),
            assets,
        }
    }

    fn syntax(&self) -> &'static str {
        if self.pair { TOKENIZE_PAIR } else { TOKENIZE }
    }

    /// Number of text arguments before the tokenizer path.
    fn texts(&self) -> usize {
        if self.pair { 2 } else { 1 }
    }

    fn lock(&self) -> Result<MutexGuard<'_, Loaded>> {
        self.cache.lock().map_err(|_| {
            internal_datafusion_err!("{}: tokenizer cache poisoned", self.name())
        })
    }

    /// The file at `path` as this session loaded it, loaded now if new.
    fn file(&self, path: &str) -> Result<Arc<LoadedFile>> {
        if let Some(file) = self.lock()?.files.get(path) {
            return Ok(Arc::clone(file));
        }
        // Read without the lock: other calls need not wait for the disk.
        let file = Arc::new(load(self.name(), path, self.assets.as_deref())?);
        let mut loaded = self.lock()?;
        let file = loaded.files.entry(path.to_string()).or_insert(file);
        Ok(Arc::clone(file))
    }

    /// The tokenizer at `path` truncating at `max_len`, loaded once (and
    /// again after [`ReadsAssets::pin_asset`] found the file changed).
    fn tokenizer(&self, path: &str, max_len: Option<usize>) -> Result<Arc<Tokenizer>> {
        let file = self.file(path)?;
        let key = (path.to_string(), max_len);
        if let Some((fingerprint, tokenizer)) = self.lock()?.tokenizers.get(&key)
            && *fingerprint == file.fingerprint
        {
            return Ok(Arc::clone(tokenizer));
        }
        let mut tokenizer = file.tokenizer.clone();
        // The file's truncation is kept unless max_len replaces it.
        if let Some(max_length) = max_len {
            tokenizer
                .with_truncation(Some(TruncationParams {
                    max_length,
                    ..Default::default()
                }))
                .map_err(|e| {
                    plan_datafusion_err!(
                        "{}: cannot truncate to {max_length} with '{path}': {e}",
                        self.name()
                    )
                })?;
        }
        let tokenizer = Arc::new(tokenizer);
        self.lock()?
            .tokenizers
            .insert(key, (file.fingerprint, Arc::clone(&tokenizer)));
        Ok(tokenizer)
    }

    /// The constant path and max_len among `scalars` (plan or run time).
    fn constants(
        &self,
        scalars: &[Option<&ScalarValue>],
    ) -> Result<(String, Option<usize>)> {
        let n = self.texts();
        let path = match scalars.get(n).copied().flatten() {
            Some(
                ScalarValue::Utf8(Some(p))
                | ScalarValue::LargeUtf8(Some(p))
                | ScalarValue::Utf8View(Some(p)),
            ) => p.clone(),
            _ => {
                return plan_err!(
                    "{}: the tokenizer must be a constant path of a tokenizer.json; \
                     signature: {}",
                    self.name(),
                    self.syntax()
                );
            }
        };
        let max_len = match scalars.get(n + 1) {
            None => None,
            Some(Some(value)) if !value.is_null() => {
                match value.cast_to(&DataType::Int64)? {
                    ScalarValue::Int64(Some(v)) if v > 0 => Some(v as usize),
                    other => {
                        return plan_err!(
                            "{}: max_len must be a positive integer, got {other}",
                            self.name()
                        );
                    }
                }
            }
            _ => {
                return plan_err!(
                    "{}: max_len must be a constant; signature: {}",
                    self.name(),
                    self.syntax()
                );
            }
        };
        Ok((path, max_len))
    }
}

/// Reads the Hugging Face `tokenizer.json` at `location`: a local path, a
/// `file://` URL, or an object-store URL read through `assets`.
fn load(
    function: &str,
    location: &str,
    assets: Option<&dyn AssetReader>,
) -> Result<LoadedFile> {
    let bytes = read(function, location, assets)?;
    let fingerprint = AssetFingerprint {
        xxh3: xxh3_128(&bytes),
        bytes: bytes.len() as u64,
    };
    // The tokenizers crate panics on some malformed files: catch it here.
    let loaded = std::panic::catch_unwind(|| Tokenizer::from_bytes(&bytes));
    let mut tokenizer = match loaded {
        Ok(Ok(tokenizer)) => tokenizer,
        Ok(Err(e)) => {
            return plan_err!(
                "{function}: '{location}' is not a valid tokenizer.json: {e}"
            );
        }
        Err(_) => {
            return plan_err!(
                "{function}: loading '{location}' crashed the tokenizers library; is \
                 it a tokenizer.json?"
            );
        }
    };
    // Lists stay variable-length: the feed (or pad()) pads per batch, so a
    // tokenizer.json's own padding (often Fixed(128)) is dropped.
    tokenizer.with_padding(None);
    Ok(LoadedFile {
        fingerprint,
        tokenizer,
    })
}

/// The fingerprint of the file at `location` as it is now. Local files are
/// hashed as they stream by, without holding them whole.
fn fingerprint(
    function: &str,
    location: &str,
    assets: Option<&dyn AssetReader>,
) -> Result<AssetFingerprint> {
    let Some(path) = local_path(function, location)? else {
        let bytes = read(function, location, assets)?;
        return Ok(AssetFingerprint {
            xxh3: xxh3_128(&bytes),
            bytes: bytes.len() as u64,
        });
    };
    let cannot_read = |e: std::io::Error| {
        plan_datafusion_err!("{function}: cannot read tokenizer file '{location}': {e}")
    };
    let mut file = std::fs::File::open(path).map_err(cannot_read)?;
    let mut hasher = Xxh3::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buffer).map_err(cannot_read)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        bytes += n as u64;
    }
    Ok(AssetFingerprint {
        xxh3: hasher.digest128(),
        bytes,
    })
}

/// The local path `location` names (`None` for an object-store URL), or an
/// error if there is no such file.
fn local_path<'a>(function: &str, location: &'a str) -> Result<Option<&'a str>> {
    if crate::is_remote_url(location) {
        return Ok(None);
    }
    let path = location.strip_prefix("file://").unwrap_or(location);
    if !std::path::Path::new(path).is_file() {
        return plan_err!(
            "{function}: tokenizer file '{location}' does not exist; pass the path \
             or URL of a Hugging Face tokenizer.json"
        );
    }
    Ok(Some(path))
}

/// The bytes of the file at `location` (see [`load`]).
fn read(
    function: &str,
    location: &str,
    assets: Option<&dyn AssetReader>,
) -> Result<Vec<u8>> {
    if let Some(path) = local_path(function, location)? {
        return std::fs::read(path).map_err(|e| {
            plan_datafusion_err!(
                "{function}: cannot read tokenizer file '{location}': {e}"
            )
        });
    }
    let Some(assets) = assets else {
        return plan_err!(
            "{function}: cannot read tokenizer '{location}': this context has no \
             object stores for URLs (use a sqlfeed Session, or a local path)"
        );
    };
    assets.read(location).map_err(|e| {
        plan_datafusion_err!("{function}: cannot read tokenizer '{location}': {e}")
    })
}

impl ReadsAssets for TokenizeFunc {
    fn asset_arguments(&self, _arg_count: usize) -> Vec<usize> {
        // The tokenizer follows the text arguments.
        vec![self.texts()]
    }

    fn pin_asset(&self, location: &str) -> Result<AssetFingerprint> {
        let now = fingerprint(self.name(), location, self.assets.as_deref())?;
        if let Some(file) = self.lock()?.files.get(location)
            && file.fingerprint == now
        {
            return Ok(now);
        }
        // New or changed: load it, and report the bytes actually loaded (a
        // file rewritten again in between is keyed by what is used).
        let file = Arc::new(load(self.name(), location, self.assets.as_deref())?);
        let fingerprint = file.fingerprint;
        self.lock()?.files.insert(location.to_string(), file);
        Ok(fingerprint)
    }
}

impl ScalarUDFImpl for TokenizeFunc {
    crate::function_basics!(if pair { "tokenize_pair" } else { "tokenize" });

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let n = self.texts();
        super::check_arity(self.name(), self.syntax(), arg_types.len(), &[n + 1, n + 2])?;
        let mut types = Vec::with_capacity(arg_types.len());
        for (position, t) in arg_types.iter().enumerate() {
            let coerced = match position {
                p if p <= n => match t {
                    DataType::Utf8
                    | DataType::LargeUtf8
                    | DataType::Utf8View
                    | DataType::Null => DataType::Utf8,
                    other => {
                        return plan_err!(
                            "{}: argument {} must be a string, got {other}; signature: {}",
                            self.name(),
                            position + 1,
                            self.syntax()
                        );
                    }
                },
                _ => super::integer_arg(self.name(), self.syntax(), position, t)?,
            };
            types.push(coerced);
        }
        Ok(types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::new_list(DataType::Int32, false))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        // Load at plan time: a wrong path fails before any row is read.
        let (path, max_len) = self.constants(args.scalar_arguments)?;
        self.tokenizer(&path, max_len)?;
        let nullable = args.arg_fields[..self.texts()]
            .iter()
            .any(|f| f.is_nullable());
        Ok(Arc::new(Field::new(
            self.name(),
            DataType::new_list(DataType::Int32, false),
            nullable,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalars: Vec<Option<&ScalarValue>> = args
            .args
            .iter()
            .map(|a| match a {
                ColumnarValue::Scalar(s) => Some(s),
                ColumnarValue::Array(_) => None,
            })
            .collect();
        let (path, max_len) = self.constants(&scalars)?;
        let tokenizer = self.tokenizer(&path, max_len)?;
        let rows = args.number_rows;
        let texts = args.args[..self.texts()]
            .iter()
            .map(|a| a.to_array(rows))
            .collect::<Result<Vec<_>>>()?;
        let texts: Vec<_> = texts.iter().map(|t| t.as_string::<i32>()).collect();
        let mut out = ListBuilder::with_capacity(Int32Builder::new(), rows)
            .with_field(Field::new_list_field(DataType::Int32, false));
        for row in 0..rows {
            if texts.iter().any(|t| t.is_null(row)) {
                out.append_null();
                continue;
            }
            // encode_fast: the ids without character offsets, which nothing
            // here uses (5–10% less time per row).
            let encoded = if self.pair {
                tokenizer.encode_fast((texts[0].value(row), texts[1].value(row)), true)
            } else {
                tokenizer.encode_fast(texts[0].value(row), true)
            }
            .map_err(|e| {
                exec_datafusion_err!("{} failed on row {row}: {e}", self.name())
            })?;
            for &id in encoded.get_ids() {
                let id = i32::try_from(id).map_err(|_| {
                    exec_datafusion_err!(
                        "{}: token id {id} in row {row} does not fit int32",
                        self.name()
                    )
                })?;
                out.values().append_value(id);
            }
            out.append(true);
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}
