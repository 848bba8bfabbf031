//! Write sqlfeed function plugins: scalar and aggregate DataFusion functions
//! in a `cdylib` that `sqlfeed --load`, `CREATE FUNCTION … LANGUAGE rust`,
//! `Session(plugins=…)` and cluster executors (`--plugin-dir`) load.
//!
//! ```text
//!  your crate (cdylib)                         sqlfeed (host)
//!  ───────────────────                         ──────────────
//!  fn functions() -> Functions                 dlopen(lib)
//!  export_plugin!(functions) ──► sqlfeed_plugin_header() ─► magic, plugin ABI,
//!                                                           DataFusion major:
//!                                                           refused by name if
//!                                                           they differ
//!                              ► sqlfeed_plugin_module() ─► FFI_ScalarUDF,
//!                                                           FFI_AggregateUDF
//!                                                           (datafusion-ffi)
//! ```
//!
//! The functions themselves cross through `datafusion-ffi`, DataFusion's
//! stable C ABI: Arrow arrays by the C data interface, errors as strings, no
//! Rust layout shared. A plugin may be built by another `rustc` than the host,
//! but against the same DataFusion **major** version (what `datafusion-ffi`
//! promises to keep stable). The header is the one thing read before that is
//! known, so it holds plain integers and bytes only, and this crate never
//! changes its layout: a new layout gets a new [`PLUGIN_ABI`].
//!
//! ```ignore
//! use std::sync::Arc;
//! use sqlfeed_plugin::{Functions, export_plugin};
//!
//! fn functions() -> Functions {
//!     Functions::new().scalar(Arc::new(my_scalar_udf())).costly_scalar(Arc::new(my_decoder()))
//! }
//! export_plugin!(functions);
//! ```
//!
//! # Randomness per epoch
//! A function that draws random numbers reads the feed's seed and epoch with
//! [`epoch_seed`] from the `config_options` of its `ScalarFunctionArgs`, as
//! sqlfeed's own `image_random_crop` does: the same (seed, feed seed, epoch)
//! draws the same values on any machine and on resume.

use std::sync::Arc;

mod constants;
pub mod host;

pub use datafusion;
use datafusion::common::config::ConfigOptions;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
pub use datafusion_ffi;
use datafusion_ffi::udaf::FFI_AggregateUDF;
use datafusion_ffi::udf::FFI_ScalarUDF;

use crate::constants::ConstantsRestored;

/// Every `ScalarUDFImpl` method of a function that wraps another, answered
/// as the wrapped one answers it, but the two a wrapper must write itself:
/// `invoke_with_args` (what the wrapper is for) and `with_updated_config`
/// (which must wrap the updated function again). The wrapped function is
/// the `ScalarUDF` (or `Arc<ScalarUDF>`) in the field `$wrapped`; its
/// implementation answers, so nothing falls back to a default: DataFusion's
/// own wrappers (`AliasedScalarUDFImpl`) forward the whole contract too, and
/// a wrapper that left out `simplify`, `placement` or the ordering methods
/// silently planned its function as if it had none. For sqlfeed's wrappers
/// (plugin calls, constants restored, user functions); used inside
/// `impl ScalarUDFImpl for …`.
#[doc(hidden)]
#[macro_export]
macro_rules! answered_by_wrapped_function {
    ($wrapped:ident) => {
        fn name(&self) -> &str {
            self.$wrapped.inner().name()
        }

        fn aliases(&self) -> &[String] {
            self.$wrapped.inner().aliases()
        }

        // Deprecated in DataFusion, still part of the contract.
        #[allow(deprecated)]
        fn display_name(
            &self,
            args: &[$crate::datafusion::logical_expr::Expr],
        ) -> $crate::datafusion::error::Result<String> {
            self.$wrapped.inner().display_name(args)
        }

        fn schema_name(
            &self,
            args: &[$crate::datafusion::logical_expr::Expr],
        ) -> $crate::datafusion::error::Result<String> {
            self.$wrapped.inner().schema_name(args)
        }

        fn signature(&self) -> &$crate::datafusion::logical_expr::Signature {
            self.$wrapped.inner().signature()
        }

        fn return_type(
            &self,
            arg_types: &[$crate::datafusion::arrow::datatypes::DataType],
        ) -> $crate::datafusion::error::Result<
            $crate::datafusion::arrow::datatypes::DataType,
        > {
            self.$wrapped.inner().return_type(arg_types)
        }

        fn return_field_from_args(
            &self,
            args: $crate::datafusion::logical_expr::ReturnFieldArgs,
        ) -> $crate::datafusion::error::Result<
            $crate::datafusion::arrow::datatypes::FieldRef,
        > {
            self.$wrapped.inner().return_field_from_args(args)
        }

        // Deprecated in DataFusion, still part of the contract it calls.
        #[allow(deprecated)]
        fn is_nullable(
            &self,
            args: &[$crate::datafusion::logical_expr::Expr],
            schema: &dyn $crate::datafusion::common::ExprSchema,
        ) -> bool {
            self.$wrapped.inner().is_nullable(args, schema)
        }

        fn is_strict(&self) -> bool {
            self.$wrapped.inner().is_strict()
        }

        fn simplify(
            &self,
            args: Vec<$crate::datafusion::logical_expr::Expr>,
            info: &$crate::datafusion::logical_expr::simplify::SimplifyContext,
        ) -> $crate::datafusion::error::Result<
            $crate::datafusion::logical_expr::simplify::ExprSimplifyResult,
        > {
            self.$wrapped.inner().simplify(args, info)
        }

        fn preimage(
            &self,
            args: &[$crate::datafusion::logical_expr::Expr],
            lit_expr: &$crate::datafusion::logical_expr::Expr,
            info: &$crate::datafusion::logical_expr::simplify::SimplifyContext,
        ) -> $crate::datafusion::error::Result<
            $crate::datafusion::logical_expr::preimage::PreimageResult,
        > {
            self.$wrapped.inner().preimage(args, lit_expr, info)
        }

        fn short_circuits(&self) -> bool {
            self.$wrapped.inner().short_circuits()
        }

        fn conditional_arguments<'a>(
            &self,
            args: &'a [$crate::datafusion::logical_expr::Expr],
        ) -> Option<(
            Vec<&'a $crate::datafusion::logical_expr::Expr>,
            Vec<&'a $crate::datafusion::logical_expr::Expr>,
        )> {
            self.$wrapped.inner().conditional_arguments(args)
        }

        fn evaluate_bounds(
            &self,
            input: &[&$crate::datafusion::logical_expr::interval_arithmetic::Interval],
        ) -> $crate::datafusion::error::Result<
            $crate::datafusion::logical_expr::interval_arithmetic::Interval,
        > {
            self.$wrapped.inner().evaluate_bounds(input)
        }

        fn propagate_constraints(
            &self,
            interval: &$crate::datafusion::logical_expr::interval_arithmetic::Interval,
            inputs: &[&$crate::datafusion::logical_expr::interval_arithmetic::Interval],
        ) -> $crate::datafusion::error::Result<
            Option<Vec<$crate::datafusion::logical_expr::interval_arithmetic::Interval>>,
        > {
            self.$wrapped
                .inner()
                .propagate_constraints(interval, inputs)
        }

        fn output_ordering(
            &self,
            inputs: &[$crate::datafusion::logical_expr::sort_properties::ExprProperties],
        ) -> $crate::datafusion::error::Result<
            $crate::datafusion::logical_expr::sort_properties::SortProperties,
        > {
            self.$wrapped.inner().output_ordering(inputs)
        }

        fn preserves_lex_ordering(
            &self,
            inputs: &[$crate::datafusion::logical_expr::sort_properties::ExprProperties],
        ) -> $crate::datafusion::error::Result<bool> {
            self.$wrapped.inner().preserves_lex_ordering(inputs)
        }

        fn strictly_order_preserving(
            &self,
            inputs: &[$crate::datafusion::logical_expr::sort_properties::ExprProperties],
        ) -> $crate::datafusion::error::Result<bool> {
            self.$wrapped.inner().strictly_order_preserving(inputs)
        }

        fn coerce_types(
            &self,
            arg_types: &[$crate::datafusion::arrow::datatypes::DataType],
        ) -> $crate::datafusion::error::Result<
            Vec<$crate::datafusion::arrow::datatypes::DataType>,
        > {
            self.$wrapped.inner().coerce_types(arg_types)
        }

        fn struct_field_mapping(
            &self,
            literal_args: &[Option<$crate::datafusion::common::ScalarValue>],
        ) -> Option<$crate::datafusion::logical_expr::StructFieldMapping> {
            self.$wrapped.inner().struct_field_mapping(literal_args)
        }

        fn documentation(
            &self,
        ) -> Option<&$crate::datafusion::logical_expr::Documentation> {
            self.$wrapped.inner().documentation()
        }

        fn placement(
            &self,
            args: &[$crate::datafusion::logical_expr::ExpressionPlacement],
        ) -> $crate::datafusion::logical_expr::ExpressionPlacement {
            self.$wrapped.inner().placement(args)
        }
    };
}

/// First field of every [`PluginHeader`]: "SQLFEEDP" little-endian.
pub const PLUGIN_MAGIC: u64 = u64::from_le_bytes(*b"SQLFEEDP");

/// Version of [`PluginModule`]'s layout and of how sqlfeed calls through it
/// (2: constants cross as arrays of one row, see `constants.rs`). The
/// header's layout never changes.
pub const PLUGIN_ABI: u32 = 2;

/// The symbol of the `extern "C" fn() -> PluginHeader` a plugin exports.
pub const HEADER_SYMBOL: &str = "sqlfeed_plugin_header";

/// The symbol of the `extern "C" fn() -> PluginModule` a plugin exports.
pub const MODULE_SYMBOL: &str = "sqlfeed_plugin_module";

/// Bytes of each text field of [`PluginHeader`] (NUL-padded UTF-8).
pub const HEADER_TEXT_BYTES: usize = 64;

/// What a host reads first: whether the library is a sqlfeed plugin at all
/// and which ABI and DataFusion it was built for. Plain integers and bytes,
/// readable whatever DataFusion the library was built with.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PluginHeader {
    /// [`PLUGIN_MAGIC`].
    pub magic: u64,
    /// [`PLUGIN_ABI`] of the `sqlfeed-plugin` the library was built with.
    pub plugin_abi: u32,
    /// `datafusion_ffi::version()`: the DataFusion major version.
    pub datafusion_major: u32,
    /// The full DataFusion version, e.g. `55.2.0`.
    pub datafusion_version: [u8; HEADER_TEXT_BYTES],
    /// The plugin crate's name.
    pub plugin_name: [u8; HEADER_TEXT_BYTES],
    /// The plugin crate's version.
    pub plugin_version: [u8; HEADER_TEXT_BYTES],
}

impl PluginHeader {
    /// The header of a plugin crate `name` `version` built with this crate.
    pub fn new(name: &str, version: &str) -> Self {
        Self {
            magic: PLUGIN_MAGIC,
            plugin_abi: PLUGIN_ABI,
            datafusion_major: u32::try_from(datafusion_ffi::version())
                .unwrap_or(u32::MAX),
            datafusion_version: text_field(datafusion::DATAFUSION_VERSION),
            plugin_name: text_field(name),
            plugin_version: text_field(version),
        }
    }

    /// The DataFusion version text.
    pub fn datafusion_version(&self) -> String {
        field_text(&self.datafusion_version)
    }

    /// The plugin crate's name.
    pub fn plugin_name(&self) -> String {
        field_text(&self.plugin_name)
    }

    /// The plugin crate's version.
    pub fn plugin_version(&self) -> String {
        field_text(&self.plugin_version)
    }
}

/// `text` NUL-padded (cut at [`HEADER_TEXT_BYTES`] - 1 bytes).
fn text_field(text: &str) -> [u8; HEADER_TEXT_BYTES] {
    let mut field = [0u8; HEADER_TEXT_BYTES];
    let len = text.len().min(HEADER_TEXT_BYTES - 1);
    field[..len].copy_from_slice(&text.as_bytes()[..len]);
    field
}

/// The text of a NUL-padded field, lossy if it is not UTF-8.
fn field_text(field: &[u8; HEADER_TEXT_BYTES]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// One scalar function of a plugin and what sqlfeed should know about it.
#[repr(C)]
#[derive(Debug)]
pub struct PluginScalarUDF {
    /// The function, through DataFusion's stable ABI.
    pub udf: FFI_ScalarUDF,
    /// Whether a row costs far more than a column copy (decoding, resizing,
    /// tokenizing): sqlfeed then runs it on several workers and, under
    /// `SHUFFLE`, after the shuffle, on the rows that are kept.
    pub costly: bool,
}

/// The functions of a plugin, after its header matched (layout version
/// [`PLUGIN_ABI`]).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PluginModule {
    /// Whether listing the functions panicked (the panic went to stderr);
    /// the counts are then 0.
    pub failed: bool,
    /// Number of scalar functions.
    pub scalar_count: usize,
    /// Scalar function `index` (< `scalar_count`), a new handle each call.
    pub scalar: extern "C" fn(index: usize) -> PluginScalarUDF,
    /// Number of aggregate functions.
    pub aggregate_count: usize,
    /// Aggregate function `index` (< `aggregate_count`), a new handle each call.
    pub aggregate: extern "C" fn(index: usize) -> FFI_AggregateUDF,
}

/// The functions a plugin exports; see [`export_plugin!`].
#[derive(Debug, Default)]
pub struct Functions {
    scalar: Vec<(Arc<ScalarUDF>, bool)>,
    aggregate: Vec<Arc<AggregateUDF>>,
}

impl Functions {
    /// No functions yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a scalar function that costs about what a column copy costs.
    pub fn scalar(mut self, udf: Arc<ScalarUDF>) -> Self {
        self.scalar.push((udf, false));
        self
    }

    /// Adds a scalar function whose rows are costly (see
    /// [`PluginScalarUDF::costly`]).
    pub fn costly_scalar(mut self, udf: Arc<ScalarUDF>) -> Self {
        self.scalar.push((udf, true));
        self
    }

    /// Adds an aggregate function.
    pub fn aggregate(mut self, udaf: Arc<AggregateUDF>) -> Self {
        self.aggregate.push(udaf);
        self
    }

    /// Number of scalar functions.
    pub fn scalar_count(&self) -> usize {
        self.scalar.len()
    }

    /// Number of aggregate functions.
    pub fn aggregate_count(&self) -> usize {
        self.aggregate.len()
    }

    /// Scalar function `index` through the stable ABI; `None` past the last
    /// (never another function in its place).
    pub fn scalar_ffi(&self, index: usize) -> Option<PluginScalarUDF> {
        let (udf, costly) = self.scalar.get(index)?;
        let exported = ScalarUDF::new_from_impl(ConstantsRestored::new(Arc::clone(udf)));
        Some(PluginScalarUDF {
            udf: FFI_ScalarUDF::from(Arc::new(exported)),
            costly: *costly,
        })
    }

    /// Aggregate function `index` through the stable ABI; `None` past the
    /// last.
    pub fn aggregate_ffi(&self, index: usize) -> Option<FFI_AggregateUDF> {
        let udaf = self.aggregate.get(index)?;
        Some(FFI_AggregateUDF::from(Arc::clone(udaf)))
    }
}

/// Exports `sqlfeed_plugin_header` and `sqlfeed_plugin_module` for the
/// functions `$functions()` returns (called once, on first load).
#[macro_export]
macro_rules! export_plugin {
    ($functions:path) => {
        static SQLFEED_PLUGIN_FUNCTIONS: ::std::sync::OnceLock<
            ::std::option::Option<$crate::Functions>,
        > = ::std::sync::OnceLock::new();

        fn sqlfeed_plugin_functions() -> ::std::option::Option<&'static $crate::Functions>
        {
            SQLFEED_PLUGIN_FUNCTIONS
                .get_or_init(|| ::std::panic::catch_unwind($functions).ok())
                .as_ref()
        }

        /// sqlfeed's plugin header (see `sqlfeed_plugin::PluginHeader`).
        #[unsafe(no_mangle)]
        pub extern "C" fn sqlfeed_plugin_header() -> $crate::PluginHeader {
            $crate::PluginHeader::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
        }

        /// sqlfeed's plugin module (see `sqlfeed_plugin::PluginModule`).
        #[unsafe(no_mangle)]
        pub extern "C" fn sqlfeed_plugin_module() -> $crate::PluginModule {
            // Only called by a host that read the counts from a module that
            // did not fail, with an index below them (`host::open` loops
            // over `0..count`). Anything else is a host bug: nothing can be
            // returned across `extern "C"` that is not a function, and
            // answering with another function would run the wrong code, so
            // the process stops (a panic may not unwind across the ABI).
            extern "C" fn scalar(index: usize) -> $crate::PluginScalarUDF {
                match sqlfeed_plugin_functions().and_then(|f| f.scalar_ffi(index)) {
                    Some(function) => function,
                    None => ::std::process::abort(),
                }
            }
            extern "C" fn aggregate(
                index: usize,
            ) -> $crate::datafusion_ffi::udaf::FFI_AggregateUDF {
                match sqlfeed_plugin_functions().and_then(|f| f.aggregate_ffi(index)) {
                    Some(function) => function,
                    None => ::std::process::abort(),
                }
            }
            let functions = sqlfeed_plugin_functions();
            $crate::PluginModule {
                failed: functions.is_none(),
                scalar_count: functions.map_or(0, $crate::Functions::scalar_count),
                scalar,
                aggregate_count: functions.map_or(0, $crate::Functions::aggregate_count),
                aggregate,
            }
        }
    };
}

/// Name of the configuration extension in which a feed tells functions the
/// epoch they run in (`sqlfeed_augment.feed_seed`, `sqlfeed_augment.epoch`).
pub const AUGMENT_PREFIX: &str = "sqlfeed_augment";

/// The seed a seeded function draws with: `seed` itself outside a feed,
/// else `seed` mixed with the feed's seed and the epoch, so that
/// augmentations differ per epoch and reproduce on resume. Reads the
/// `sqlfeed_augment` options wherever `config` got them: set by the host
/// in-process, or as strings through `datafusion-ffi`.
pub fn epoch_seed(seed: u64, config: &ConfigOptions) -> u64 {
    let mut feed_seed = 0u64;
    let mut epoch = None;
    for entry in config.entries() {
        let Some(value) = entry.value.as_deref() else {
            continue;
        };
        match entry
            .key
            .strip_prefix(AUGMENT_PREFIX)
            .and_then(|k| k.strip_prefix('.'))
        {
            Some("feed_seed") => feed_seed = value.parse().unwrap_or(0),
            Some("epoch") => epoch = value.parse::<u64>().ok(),
            _ => {}
        }
    }
    mix_epoch_seed(seed, feed_seed, epoch)
}

/// [`epoch_seed`] from its parts.
pub fn mix_epoch_seed(seed: u64, feed_seed: u64, epoch: Option<u64>) -> u64 {
    match epoch {
        Some(epoch) => splitmix64(seed ^ splitmix64(feed_seed ^ splitmix64(epoch))),
        None => seed,
    }
}

/// SplitMix64's finaliser: a bijection that spreads nearby inputs.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_texts_round_trip_and_are_cut() {
        let header = PluginHeader::new("my-plugin", "1.2.3");
        assert_eq!(header.plugin_name(), "my-plugin");
        assert_eq!(header.plugin_version(), "1.2.3");
        assert_eq!(header.datafusion_version(), datafusion::DATAFUSION_VERSION);
        assert_eq!(
            u64::from(header.datafusion_major),
            datafusion_ffi::version()
        );
        let long = "x".repeat(200);
        assert_eq!(
            PluginHeader::new(&long, "1").plugin_name().len(),
            HEADER_TEXT_BYTES - 1
        );
    }

    #[test]
    fn epoch_seed_is_the_seed_outside_a_feed_and_differs_per_epoch() {
        let config = ConfigOptions::new();
        assert_eq!(epoch_seed(7, &config), 7);
        let one = mix_epoch_seed(7, 42, Some(1));
        let two = mix_epoch_seed(7, 42, Some(2));
        assert_ne!(one, two);
        assert_eq!(one, mix_epoch_seed(7, 42, Some(1)));
    }
}
