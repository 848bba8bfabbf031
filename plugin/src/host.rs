//! The host side of the plugin ABI: opening a library and taking its
//! functions. In this crate, next to the layout it reads, so that the one
//! place that trusts a library's symbols is the one that defines them.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::config::{ConfigOptions, ExtensionOptions, Extensions};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    AggregateUDFImpl, ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;

use crate::constants::send_constants_as_one_row;
use crate::{
    HEADER_SYMBOL, MODULE_SYMBOL, PLUGIN_ABI, PLUGIN_MAGIC, PluginHeader, PluginModule,
};

/// What [`open`] takes from a plugin.
#[derive(Debug)]
pub struct Loaded {
    /// The plugin's header.
    pub header: PluginHeader,
    /// Its scalar functions, each with whether it is costly per row.
    pub scalar: Vec<(Arc<dyn ScalarUDFImpl>, bool)>,
    /// Its aggregate functions.
    pub aggregate: Vec<Arc<dyn AggregateUDFImpl>>,
}

/// A Plan error about plugin `path` (the user gave a bad library).
pub fn plugin_error(path: &Path, message: impl std::fmt::Display) -> DataFusionError {
    DataFusionError::Plan(format!("plugin '{}': {message}", path.display()))
}

/// Opens the library at `path`, checks its header and takes its functions.
/// The library stays loaded until the process ends: the functions call
/// into it, and Rust libraries may leave thread-local destructors behind.
pub fn open(path: &Path) -> Result<Loaded> {
    // SAFETY: loading a library runs its initialisers, arbitrary code. The
    // path is one the user named (or the folder an executor was started
    // with): the same trust as running a program they built.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| {
        // libloading's message is "dlopen failed"; the loader's is the source.
        let reason = match std::error::Error::source(&e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        };
        plugin_error(
            path,
            format!(
                "cannot load it as a shared library ({reason}). Build the plugin crate \
                 with crate-type = [\"cdylib\"] for this platform"
            ),
        )
    })?;
    // SAFETY: `HEADER_SYMBOL` is declared by `sqlfeed_plugin::export_plugin!`
    // as `extern "C" fn() -> PluginHeader`, a layout that never changes (see
    // `sqlfeed_plugin`); a library exporting the name with another type is
    // not a sqlfeed plugin and cannot be told apart before calling it.
    let header_fn = unsafe {
        library.get::<extern "C" fn() -> PluginHeader>(HEADER_SYMBOL.as_bytes())
    }
    .map_err(|_| {
        plugin_error(
            path,
            format!(
                "it is not a sqlfeed plugin: it exports no `{HEADER_SYMBOL}`. A plugin \
                 crate calls `sqlfeed_plugin::export_plugin!(functions)`; see \
                 examples/udf-plugin"
            ),
        )
    })?;
    let header = header_fn();
    check_header(path, &header)?;
    // SAFETY: the header says the library was built with plugin ABI
    // `PLUGIN_ABI`, in which `MODULE_SYMBOL` is `extern "C" fn() ->
    // PluginModule`, and for this DataFusion major version, whose
    // datafusion-ffi types the module's functions return.
    let module_fn = unsafe {
        library.get::<extern "C" fn() -> PluginModule>(MODULE_SYMBOL.as_bytes())
    }
    .map_err(|_| {
        plugin_error(
            path,
            format!("its header is sqlfeed's but it exports no `{MODULE_SYMBOL}`"),
        )
    })?;
    let module = module_fn();
    if module.failed {
        return Err(plugin_error(
            path,
            "listing its functions panicked (the panic message went to stderr); fix the \
             plugin's function list",
        ));
    }
    let scalar = (0..module.scalar_count)
        .map(|index| {
            let exported = (module.scalar)(index);
            let foreign: Arc<dyn ScalarUDFImpl> = (&exported.udf).into();
            let function: Arc<dyn ScalarUDFImpl> = Arc::new(ForeignCall {
                foreign: ScalarUDF::new_from_shared_impl(foreign),
            });
            (function, exported.costly)
        })
        .collect();
    let aggregate = (0..module.aggregate_count)
        .map(|index| {
            let exported = (module.aggregate)(index);
            let function: Arc<dyn AggregateUDFImpl> = (&exported).into();
            function
        })
        .collect();
    // Never unloaded: the functions above call into it (module docs).
    std::mem::forget(library);
    Ok(Loaded {
        header,
        scalar,
        aggregate,
    })
}

/// Refuses a library that is not a sqlfeed plugin of this ABI and DataFusion.
fn check_header(path: &Path, header: &PluginHeader) -> Result<()> {
    if header.magic != PLUGIN_MAGIC {
        return Err(plugin_error(
            path,
            format!("`{HEADER_SYMBOL}` does not return a sqlfeed plugin header"),
        ));
    }
    let host = datafusion::DATAFUSION_VERSION;
    let host_major = datafusion_ffi::version();
    let name = format!("{} {}", header.plugin_name(), header.plugin_version());
    if u64::from(header.datafusion_major) != host_major {
        return Err(plugin_error(
            path,
            format!(
                "{name} was built against DataFusion {} but this sqlfeed uses DataFusion \
                 {host}; functions cross between them through datafusion-ffi, which only \
                 a matching major version reads: rebuild the plugin with datafusion {host_major}",
                header.datafusion_version()
            ),
        ));
    }
    if header.plugin_abi != PLUGIN_ABI {
        return Err(plugin_error(
            path,
            format!(
                "{name} was built with sqlfeed plugin ABI {} but this sqlfeed reads ABI \
                 {PLUGIN_ABI}: rebuild the plugin with sqlfeed-plugin {}",
                header.plugin_abi,
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    Ok(())
}

/// A plugin's scalar function as the host calls it: the plugin's
/// `ForeignScalarUDF`, given only the configuration a plugin can read.
///
/// `datafusion-ffi` sends every configuration entry as a key-value pair,
/// the host's extension options too, and the plugin sets each in a fresh
/// `ConfigOptions`; extension keys arrive without their namespace
/// (DataFusion 55 lists extension entries unprefixed), so any host
/// extension (sqlfeed's own `sqlfeed.*` options) would fail every call with
/// "could not find config namespace". So a call gets DataFusion's own
/// options plus, as `datafusion-ffi` extension entries under their full
/// names, the `sqlfeed_augment` options ([`crate::epoch_seed`] reads them).
#[derive(Debug, PartialEq, Eq, Hash)]
struct ForeignCall {
    foreign: ScalarUDF,
}

/// `config` as a plugin can receive it (see [`ForeignCall`]).
fn plugin_config(config: &ConfigOptions) -> Result<ConfigOptions> {
    let mut forwarded = FFI_ExtensionOptions::default();
    for (name, extension) in config.extensions.iter() {
        if name != crate::AUGMENT_PREFIX {
            continue;
        }
        for entry in extension.entries() {
            if let Some(value) = entry.value {
                // Listed with or without the prefix.
                let key = entry.key.strip_prefix(name).unwrap_or(&entry.key);
                let key = key.trim_start_matches('.');
                forwarded.set(&format!("{name}.{key}"), &value)?;
            }
        }
    }
    let mut options = config.clone();
    options.extensions = Extensions::new();
    options.extensions.insert(forwarded);
    Ok(options)
}

impl ScalarUDFImpl for ForeignCall {
    fn name(&self) -> &str {
        self.foreign.name()
    }

    fn aliases(&self) -> &[String] {
        self.foreign.aliases()
    }

    fn signature(&self) -> &Signature {
        self.foreign.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.foreign.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.foreign.return_field_from_args(args)
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        args.config_options = Arc::new(plugin_config(&args.config_options)?);
        send_constants_as_one_row(&mut args.args)?;
        self.foreign.invoke_with_args(args)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let config = plugin_config(config).ok()?;
        let updated = self.foreign.inner().with_updated_config(&config)?;
        Some(ScalarUDF::new_from_impl(ForeignCall { foreign: updated }))
    }

    fn short_circuits(&self) -> bool {
        self.foreign.short_circuits()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.foreign.coerce_types(arg_types)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(major: u32, abi: u32) -> PluginHeader {
        let mut header = PluginHeader::new("p", "0.1.0");
        header.datafusion_major = major;
        header.plugin_abi = abi;
        header
    }

    #[test]
    fn headers_of_another_datafusion_or_abi_are_refused_by_name() {
        let path = Path::new("/plugins/libp.so");
        let major = u32::try_from(datafusion_ffi::version()).expect("small");
        check_header(path, &header(major, PLUGIN_ABI)).expect("matching header");
        let err = check_header(path, &header(major - 1, PLUGIN_ABI)).expect_err("old DF");
        let text = err.to_string();
        assert!(text.contains("/plugins/libp.so"), "{text}");
        assert!(text.contains(datafusion::DATAFUSION_VERSION), "{text}");
        assert!(
            text.contains(&format!("rebuild the plugin with datafusion {major}")),
            "{text}"
        );
        let err =
            check_header(path, &header(major, PLUGIN_ABI + 1)).expect_err("new ABI");
        let newer = format!("plugin ABI {}", PLUGIN_ABI + 1);
        assert!(err.to_string().contains(&newer), "{err}");
        let mut bad = header(major, PLUGIN_ABI);
        bad.magic = 0;
        assert!(check_header(path, &bad).is_err());
    }
}
