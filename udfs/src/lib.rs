//! Preprocessing for training pipelines as DataFusion SQL functions.
//!
//! Each family sits behind a cargo feature (all on by default) and every
//! function is vectorised over Arrow arrays. [`register_all`] registers every
//! enabled family on a context, with the [`planner`] that makes `['a', 'b']`
//! a constant when SQL is planned; [`functions`] lists them with their
//! signatures for `\functions` in the REPL.
//!
//! | family    | feature   | functions                          |
//! |-----------|-----------|------------------------------------|
//! | numeric   | `numeric` | `standardize`, `min_max_scale`, `clip`, `log1p`, `bucketize`, `one_hot`, `label_encode`, `hash_bucket`, `feature_vector` |
//! | image     | `image`   | `image_decode`, `try_image_decode`, `image_resize`, `image_center_crop`, `image_random_crop`, `image_random_flip`, `image_to_tensor` |
//! | text      | `text`    | `tokenize`, `tokenize_pair`, `attention_mask`, `pad`, `truncate` |

#![forbid(unsafe_code)]

pub mod augment;
#[cfg(feature = "image")]
pub mod image;
#[cfg(feature = "numeric")]
pub mod numeric;
pub mod planner;
#[cfg(feature = "text")]
pub mod text;
pub mod user;

use std::fmt;
use std::sync::Arc;

use datafusion::common::plan_datafusion_err;
use datafusion::error::Result;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionContext;

/// A function of this crate with its documentation, for listings.
#[derive(Debug, Clone)]
pub struct FunctionInfo {
    /// The SQL name.
    pub name: &'static str,
    /// The family (cargo feature) it belongs to.
    pub family: &'static str,
    /// The call syntax, e.g. `standardize(x, mean, std)`.
    pub syntax: &'static str,
    /// One sentence on what it returns.
    pub description: &'static str,
    /// Each argument (as the syntax names it) and what it is.
    pub arguments: &'static [(&'static str, &'static str)],
    /// A query calling the function …
    pub example: &'static str,
    /// … and its output, as DataFusion's shell prints it (a test runs the
    /// query and compares).
    pub example_output: &'static str,
}

/// A function's listing in its family's `infos()`: (name, syntax,
/// description, arguments, example, example output), as [`FunctionInfo`]
/// names them.
type Listing = dyn Fn(
    &'static str,
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static str,
    &'static str,
) -> FunctionInfo;

/// The maker of `family`'s listings.
pub(crate) fn listing(family: &'static str) -> Box<Listing> {
    Box::new(
        move |name, syntax, description, arguments, example, example_output| {
            FunctionInfo {
                name,
                family,
                syntax,
                description,
                arguments,
                example,
                example_output,
            }
        },
    )
}

impl FunctionInfo {
    /// DataFusion's documentation of the function, from this listing: what
    /// `SHOW FUNCTIONS`, `information_schema` and `\functions <name>` show.
    pub fn documentation(&self) -> datafusion::logical_expr::Documentation {
        let mut builder = datafusion::logical_expr::Documentation::builder(
            doc_section(self.family),
            self.description,
            self.syntax,
        )
        .with_sql_example(format!(
            "```sql\n> {}\n{}\n```",
            self.example,
            self.example_output.trim_end()
        ));
        for (name, description) in self.arguments {
            builder = builder.with_argument(*name, *description);
        }
        builder.build()
    }
}

/// The section of the function docs a family's functions are listed in.
fn doc_section(family: &'static str) -> datafusion::logical_expr::DocSection {
    let (label, description) = match family {
        "numeric" => (
            "sqlfeed: numeric features",
            "Scaling, clipping, encoding and assembling numeric features.",
        ),
        "image" => (
            "sqlfeed: images",
            "Decoding PNG/JPEG bytes, resizing, cropping, augmenting, tensors.",
        ),
        "text" => (
            "sqlfeed: text",
            "Tokenizing with Hugging Face tokenizers and shaping token lists. A feed \
             packs tokenized documents into sequences for a language model with \
             `pack=MAX_TOKENS` (`--pack`): no padding, `cu_seqlens` and restarting \
             positions, attention cost balanced across ranks; see \
             [Sequence packing](packing.md).",
        ),
        _ => ("sqlfeed", "sqlfeed's own functions."),
    };
    datafusion::logical_expr::DocSection {
        include: true,
        label,
        description: Some(description),
    }
}

/// Documentation of the functions `infos` lists, by name: what a family's
/// `ScalarUDFImpl::documentation` looks up (held in a `LazyLock`, built once).
pub type Documentations =
    std::collections::HashMap<&'static str, datafusion::logical_expr::Documentation>;

/// The [`Documentations`] of `infos`.
pub fn documentations(infos: Vec<FunctionInfo>) -> Documentations {
    infos
        .iter()
        .map(|info| (info.name, info.documentation()))
        .collect()
}

/// The documentation of the enabled function `name`.
pub(crate) fn documentation_of(
    name: &str,
) -> Option<&'static datafusion::logical_expr::Documentation> {
    static DOCS: std::sync::LazyLock<Documentations> =
        std::sync::LazyLock::new(|| documentations(functions()));
    DOCS.get(name)
}

/// The parts of a `ScalarUDFImpl` every function of this crate writes the
/// same way: `documentation` (looked up by its name), `signature` (its field
/// `signature`) and, given one, `name`: a constant, or one of two chosen
/// by a boolean field (`if random { "…" } else { "…" }`). Used inside
/// `impl ScalarUDFImpl for …`.
macro_rules! function_basics {
    () => {
        fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
            $crate::documentation_of(self.name())
        }

        fn signature(&self) -> &datafusion::logical_expr::Signature {
            &self.signature
        }
    };
    ($name:literal) => {
        $crate::function_basics!();

        fn name(&self) -> &str {
            $name
        }
    };
    // Two functions of one struct, told apart by its boolean field `$flag`.
    (if $flag:ident { $yes:literal } else { $no:literal }) => {
        $crate::function_basics!();

        fn name(&self) -> &str {
            if self.$flag { $yes } else { $no }
        }
    };
}
pub(crate) use function_basics;

/// Declares a function whose only state is a user-defined signature: it
/// checks and coerces its own arguments in `coerce_types`, so that a wrong
/// call is an error naming the function's syntax rather than DataFusion's
/// generic signature mismatch. `new()` is visible to the declaring module's
/// parent, which registers the function.
///
/// ```ignore
/// crate::coercing_function! {
///     /// `log1p(x)`: …
///     pub struct Log1pFunc;
/// }
/// ```
macro_rules! coercing_function {
    ($(#[$meta:meta])* pub struct $name:ident;) => {
        $(#[$meta])*
        #[derive(Debug, PartialEq, Eq, Hash)]
        pub struct $name {
            signature: datafusion::logical_expr::Signature,
        }

        impl $name {
            pub(super) fn new() -> Self {
                Self {
                    signature: datafusion::logical_expr::Signature::user_defined(
                        datafusion::logical_expr::Volatility::Immutable,
                    ),
                }
            }
        }
    };
}
pub(crate) use coercing_function;

/// Reads the files functions load at plan time (a `tokenizer.json`) when
/// they are named by URL (`s3://…`, `gs://…`, `az://…`, `https://…`).
///
/// This crate knows no object stores: the host (sqlfeed's session) supplies a
/// reader backed by its own, so the same credentials and limits apply as for
/// the tables of the query. Without one, only local paths work.
pub trait AssetReader: Send + Sync + fmt::Debug {
    /// The whole file at `url`. Called at plan time from synchronous code,
    /// possibly on an async runtime's worker thread. Errors name the URL.
    fn read(&self, url: &str) -> Result<Vec<u8>>;
}

/// The content of a file a function reads, as the function now uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AssetFingerprint {
    /// xxh3-128 of the file's bytes.
    pub xxh3: u128,
    /// Size of the file in bytes.
    pub bytes: u64,
}

/// A function that reads files named by its arguments (`tokenize` reads a
/// `tokenizer.json`).
///
/// The location is part of the call, so a plan that names it stays the same
/// when the file is rewritten: whoever keys results on plans (sqlfeed's
/// result cache) must also key them on the files' contents, and must know
/// that the function uses exactly the content it keyed. [`pin_asset`] gives
/// both.
///
/// [`pin_asset`]: ReadsAssets::pin_asset
pub trait ReadsAssets {
    /// Positions (0-based) of the arguments that name a file, for a call
    /// with `arg_count` arguments. They must be constant strings.
    fn asset_arguments(&self, arg_count: usize) -> Vec<usize>;

    /// Reads the file at `location` now (a local path or a URL, through the
    /// same reader the function uses) and returns its fingerprint. From then
    /// on the function computes with that content: a file that changed since
    /// the function loaded it is loaded again. Errors are the ones the
    /// function itself gives for an unreadable or invalid file.
    fn pin_asset(&self, location: &str) -> Result<AssetFingerprint>;
}

/// `udf` as a [`ReadsAssets`], when it is a function of this crate that
/// reads files; `None` for every other function.
pub fn reads_assets(udf: &ScalarUDF) -> Option<&dyn ReadsAssets> {
    let _ = udf;
    #[cfg(feature = "text")]
    if let Some(reader) = text::reads_assets(udf) {
        return Some(reader);
    }
    None
}

/// Whether `location` names an object-store URL rather than a local path.
/// `file://` URLs count as local.
#[allow(dead_code)] // unused when the text family is disabled
pub(crate) fn is_remote_url(location: &str) -> bool {
    match location.split_once("://") {
        Some((scheme, _)) => {
            scheme != "file"
                && !scheme.is_empty()
                && scheme.chars().all(|c| {
                    c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.'
                })
        }
        None => false,
    }
}

/// Settings of the functions that have any.
#[derive(Debug, Clone)]
pub struct UdfOptions {
    /// Largest image `image_decode` accepts, in pixels (`width × height`);
    /// larger headers are refused before any allocation.
    pub max_image_pixels: u64,
    /// Reads tokenizer files named by URL; `None` = local paths only.
    pub asset_reader: Option<Arc<dyn AssetReader>>,
}

impl Default for UdfOptions {
    fn default() -> Self {
        Self {
            #[cfg(feature = "image")]
            max_image_pixels: image::DEFAULT_MAX_PIXELS,
            #[cfg(not(feature = "image"))]
            max_image_pixels: 64 << 20,
            asset_reader: None,
        }
    }
}

/// Every enabled scalar function of this crate, with default options.
pub fn scalar_functions() -> Vec<ScalarUDF> {
    scalar_functions_with(&UdfOptions::default())
}

/// Every enabled scalar function of this crate, configured by `options`.
pub fn scalar_functions_with(options: &UdfOptions) -> Vec<ScalarUDF> {
    let _ = options;
    let mut udfs = Vec::new();
    #[cfg(feature = "numeric")]
    udfs.extend(numeric::functions());
    #[cfg(feature = "image")]
    udfs.extend(image::functions_with(options.max_image_pixels));
    #[cfg(feature = "text")]
    udfs.extend(text::functions_with(options.asset_reader.clone()));
    udfs
}

/// Whether `udf` is one of this crate's functions whose cost per row is far
/// above a column copy (decoding and transforming images, tokenizing), so
/// that an engine does well to run it in parallel on small batches and after
/// any reordering of rows. Decided by the implementation's type, not by name,
/// so that a user function registered under the same name is not mistaken
/// for it; a [`user::UserFunction`] says so itself.
pub fn is_costly_per_row(udf: &ScalarUDF) -> bool {
    if let Some(user) = user::as_user_function(udf) {
        return user.is_costly();
    }
    let any: &dyn std::any::Any = udf.inner().as_ref();
    #[cfg(feature = "image")]
    if any.is::<image::ImageDecodeFunc>()
        || any.is::<image::transform::ResizeFunc>()
        || any.is::<image::transform::CropFunc>()
        || any.is::<image::transform::RandomFlipFunc>()
        || any.is::<image::tensor::ToTensorFunc>()
    {
        return true;
    }
    #[cfg(feature = "text")]
    if text::is_tokenizer(any) {
        return true;
    }
    let _ = any;
    false
}

/// Whether `udf` only widens its first argument element by element, cheaply
/// and deterministically (`image_to_tensor`: uint8 pixels to normalised
/// float32, 4× the bytes), so that a cache does better to store the argument
/// and apply the function on the way out. By implementation type, like
/// [`is_costly_per_row`].
pub fn widens_compact_input(udf: &ScalarUDF) -> bool {
    let any: &dyn std::any::Any = udf.inner().as_ref();
    #[cfg(feature = "image")]
    if any.is::<image::tensor::ToTensorFunc>() {
        return true;
    }
    let _ = any;
    false
}

/// Name, syntax and description of every enabled function.
pub fn functions() -> Vec<FunctionInfo> {
    let mut infos = Vec::new();
    #[cfg(feature = "numeric")]
    infos.extend(numeric::infos());
    #[cfg(feature = "image")]
    infos.extend(image::infos());
    #[cfg(feature = "text")]
    infos.extend(text::infos());
    infos
}

/// Checks a function's argument count at plan time; the error names the
/// function and its signature.
#[allow(dead_code)] // unused when every family is disabled
pub(crate) fn check_arity(
    function: &str,
    syntax: &str,
    got: usize,
    allowed: &[usize],
) -> Result<()> {
    if allowed.contains(&got) {
        return Ok(());
    }
    Err(plan_datafusion_err!(
        "{function} takes {} arguments, got {got}; signature: {syntax}",
        allowed
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" or ")
    ))
}

/// A function's result field `name` of `data_type`, nullable where its first
/// argument is (a function of one value that maps NULL to NULL).
#[allow(dead_code)] // unused when every family is disabled
pub(crate) fn nullable_like_first(
    name: &str,
    data_type: datafusion::arrow::datatypes::DataType,
    args: &datafusion::logical_expr::ReturnFieldArgs,
) -> datafusion::arrow::datatypes::FieldRef {
    let nullable = args.arg_fields.first().is_none_or(|f| f.is_nullable());
    Arc::new(datafusion::arrow::datatypes::Field::new(
        name, data_type, nullable,
    ))
}

/// Registers every enabled function on `ctx`, and puts this crate's
/// expression planners ahead of DataFusion's
/// ([`planner::register_expr_planners`]; a session built with a
/// `SessionStateBuilder` can use [`planner::with_expr_planners`] instead).
pub fn register_all(ctx: &SessionContext) -> Result<()> {
    register_all_with(ctx, &UdfOptions::default())
}

/// Registers every enabled function on `ctx`, configured by `options`, and
/// the expression planners, as [`register_all`] does.
pub fn register_all_with(ctx: &SessionContext, options: &UdfOptions) -> Result<()> {
    // Vocabularies (`one_hot(v, ['a', 'b'])`) must be constants when the
    // plan is built, or the plan's schema has the wrong width.
    planner::register_expr_planners(ctx);
    for udf in scalar_functions_with(options) {
        ctx.register_udf(udf);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The module table above lists exactly the functions [`super::functions`]
    /// documents, each under its family: a hand-made list that cannot drift.
    #[test]
    fn the_module_table_lists_every_documented_function() {
        let mut listed = BTreeSet::new();
        for row in include_str!("lib.rs").lines() {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            if let ["//!", family, _, functions, ""] = cells.as_slice() {
                for name in functions.split(',') {
                    let name = name.trim().trim_matches('`');
                    if !name.is_empty() && *family != "family" && !family.starts_with('-')
                    {
                        listed.insert((family.to_string(), name.to_string()));
                    }
                }
            }
        }
        let documented: BTreeSet<(String, String)> = super::functions()
            .iter()
            .map(|f| (f.family.to_string(), f.name.to_string()))
            .collect();
        assert!(
            listed.len() > 10,
            "read too little of the table: {listed:?}"
        );
        assert_eq!(listed, documented);
    }
}
