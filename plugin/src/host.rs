//! The host side of the plugin ABI: opening a library and taking its
//! functions. In this crate, next to the layout it reads, so that the one
//! place that trusts a library's symbols is the one that defines them.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use datafusion::arrow::ffi::{FFI_ArrowSchema, to_ffi};
use datafusion::common::config::{ConfigOptions, ExtensionOptions, Extensions};
use datafusion::common::plan_datafusion_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    AggregateUDFImpl, ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
};
use datafusion_ffi::arrow_wrappers::{WrappedArray, WrappedSchema};
use datafusion_ffi::config::FFI_ConfigOptions;
use datafusion_ffi::config::extension_options::FFI_ExtensionOptions;
use datafusion_ffi::udf::FFI_ScalarUDF;
use datafusion_ffi::util::FFI_Result;

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

/// Where cargo puts the `cdylib` of the crate `crate_name` (its name with
/// `_` for `-`) in the target folder `dir`: `dir/libname.so` on Linux,
/// `name.dll` on Windows.
pub fn library_in(dir: &Path, crate_name: &str) -> std::path::PathBuf {
    let (prefix, extension) = (
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_EXTENSION,
    );
    dir.join(format!("{prefix}{crate_name}.{extension}"))
}

/// A Plan error about plugin `path` (the user gave a bad library).
pub fn plugin_error(path: &Path, message: impl std::fmt::Display) -> DataFusionError {
    plan_datafusion_err!("plugin '{}': {message}", path.display())
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
            let function: Arc<dyn ScalarUDFImpl> =
                Arc::new(ForeignCall::new(exported.udf.clone()));
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
/// `FFI_ScalarUDF`, given only the configuration a plugin can read, and
/// that configuration converted once, not per call.
///
/// `datafusion-ffi` sends every configuration entry as a key-value pair,
/// the host's extension options too, and the plugin sets each in a fresh
/// `ConfigOptions`; extension keys arrive without their namespace
/// (DataFusion 55 lists extension entries unprefixed), so any host
/// extension (sqlfeed's own `sqlfeed.*` options) would fail every call with
/// "could not find config namespace". So a call gets DataFusion's own
/// options plus, as `datafusion-ffi` extension entries under their full
/// names, the `sqlfeed_augment` options ([`crate::epoch_seed`] reads them).
///
/// # Why the call does not go through `ForeignScalarUDF`
/// `ForeignScalarUDF::invoke_with_args` converts the configuration to its
/// FFI form on every call: 44 µs for DataFusion 55's 147 entries (measured
/// here), a third of a plugin call's whole overhead (issue 27). A query
/// hands every batch the same `Arc<ConfigOptions>`, so this type keeps the
/// FFI form of the last one and sends a clone (10 µs). The call itself is
/// `datafusion-ffi`'s: the same function pointer with the same arguments,
/// built the way `ForeignScalarUDF` builds them; every other method goes
/// through `ForeignScalarUDF` unchanged.
#[derive(Debug)]
struct ForeignCall {
    /// The plugin's function table.
    udf: FFI_ScalarUDF,
    /// The same function as `datafusion-ffi` wraps it, for all but calls.
    foreign: ScalarUDF,
    /// The configuration the last call was given (weak: it keeps the
    /// allocation, so an equal pointer is the same options) and its FFI
    /// form as the plugin receives it.
    last_config: Mutex<Option<(Weak<ConfigOptions>, FFI_ConfigOptions)>>,
}

impl ForeignCall {
    fn new(udf: FFI_ScalarUDF) -> Self {
        let foreign: Arc<dyn ScalarUDFImpl> = (&udf).into();
        Self {
            udf,
            foreign: ScalarUDF::new_from_shared_impl(foreign),
            last_config: Mutex::new(None),
        }
    }

    /// [`plugin_config`] of `config` in FFI form, converted again only
    /// when `config` is not the options of the last call.
    fn ffi_config_of(&self, config: &Arc<ConfigOptions>) -> Result<FFI_ConfigOptions> {
        // A poisoned lock only means a call panicked while holding it; the
        // cached pair is whole or absent either way.
        let mut last = self
            .last_config
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((given, sent)) = last.as_ref()
            && std::ptr::eq(given.as_ptr(), Arc::as_ptr(config))
        {
            return Ok(sent.clone());
        }
        let sent = FFI_ConfigOptions::from(&plugin_config(config)?);
        *last = Some((Arc::downgrade(config), sent.clone()));
        Ok(sent)
    }
}

// By the function alone: the cached configuration is not part of what the
// function is.
impl PartialEq for ForeignCall {
    fn eq(&self, other: &Self) -> bool {
        self.foreign == other.foreign
    }
}

impl Eq for ForeignCall {}

impl std::hash::Hash for ForeignCall {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.foreign.hash(state);
    }
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

/// A plugin's answer as a `Result`, its error as `datafusion-ffi` reports
/// one (`DataFusionError::Ffi`, the text the plugin gave).
fn plugin_result<T>(result: FFI_Result<T>) -> Result<T> {
    result
        .into_result()
        .map_err(|message| DataFusionError::Ffi(message.to_string()))
}

impl ScalarUDFImpl for ForeignCall {
    crate::answered_by_wrapped_function!(foreign);

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        send_constants_as_one_row(&mut args.args)?;
        let config = self.ffi_config_of(&args.config_options)?;
        let ScalarFunctionArgs {
            args,
            arg_fields,
            number_rows,
            return_field,
            ..
        } = args;
        // Exported through the Arrow C data interface: the plugin imports
        // the same buffers, no copy.
        let arrays = args
            .into_iter()
            .map(|value| {
                let (array, schema) = to_ffi(&value.to_array(number_rows)?.to_data())?;
                Ok(WrappedArray {
                    array,
                    schema: WrappedSchema(schema),
                })
            })
            .collect::<Result<_>>()?;
        let fields = arg_fields
            .iter()
            .map(|field| Ok(WrappedSchema(FFI_ArrowSchema::try_from(field.as_ref())?)))
            .collect::<Result<_>>()?;
        let return_field =
            WrappedSchema(FFI_ArrowSchema::try_from(return_field.as_ref())?);
        // SAFETY: `self.udf` is a function table taken from a plugin whose
        // header `check_header` accepted (the same datafusion-ffi major and
        // plugin ABI), so `invoke_with_args` has the signature its field
        // declares, and its code stays mapped: `open` never unloads a
        // library. `&self.udf` lives for the call; every other argument is
        // owned and moved into the call, which releases it (the contract
        // `ForeignScalarUDF::invoke_with_args` relies on for the same call).
        let result = unsafe {
            (self.udf.invoke_with_args)(
                &self.udf,
                arrays,
                fields,
                number_rows,
                return_field,
                config,
            )
        };
        plugin_result(result)?.try_into()
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let config = FFI_ConfigOptions::from(&plugin_config(config).ok()?);
        // SAFETY: as in `invoke_with_args`: a checked plugin's function
        // table, `&self.udf` borrowed for the call, the configuration moved.
        let result = unsafe { (self.udf.with_updated_config)(&self.udf, config) };
        // An error leaves the function as it is, as `ForeignScalarUDF` does.
        let updated = plugin_result(result).ok()?.into_option()?;
        Some(ScalarUDF::new_from_impl(ForeignCall::new(updated)))
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
