//! Function plugins: `cdylib`s built with `sqlfeed-plugin` whose scalar and
//! aggregate functions a session registers like its own.
//!
//! ```text
//!  --load libp.so ─┐
//!  CREATE FUNCTION ├─► load(path) ─ read bytes ─► whole ELF? (library_file.rs)
//!  --plugin-dir D ─┘        │                     identity = xxh3-128(content)
//!                           ├─ dlopen ─► sqlfeed_plugin_header(): magic, plugin
//!                           │            ABI, DataFusion major ─► refused by
//!                           │            name on any mismatch, nothing called
//!                           └─ sqlfeed_plugin_module() ─► FFI_ScalarUDF ─►
//!                                ForeignScalarUDF ─► UserFunction(identity,
//!                                costly, origin)   FFI_AggregateUDF ─► AggregateUDF
//! ```
//!
//! # Lifetime
//! A loaded library is never unloaded: every function handle calls into its
//! code, and Rust libraries may leave thread-local destructors behind, so it
//! stays mapped until the process ends (as DataFusion's own FFI examples do).
//! Loading the same file again returns the same [`Plugin`]. A file replaced
//! after it was loaded is refused (the dynamic loader would keep serving
//! the old code under the new content's identity).
//!
//! # Trust
//! Loading a library runs its code. Only paths the user gives (`--load`,
//! `CREATE FUNCTION … AS '<path>'`, `Session(plugins=…)`) or the folder an
//! executor was started with are loaded; a cluster client never makes an
//! executor load a path, it only names functions the executor already has
//! (see `crate::cluster::codec`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use datafusion::common::plan_datafusion_err;
use datafusion::error::Result;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use sqlfeed_plugin::host::plugin_error;
use sqlfeed_udfs::user::{FunctionOrigin, user_function};

/// One loaded plugin library and its functions.
#[derive(Debug)]
pub struct Plugin {
    /// The library's path as loaded (canonical).
    pub path: PathBuf,
    /// xxh3-128 of the library's bytes, in hex.
    pub identity: String,
    /// `name version` of the plugin crate.
    pub crate_name: String,
    /// Its scalar functions, as [`sqlfeed_udfs::user::UserFunction`]s.
    pub scalar: Vec<Arc<ScalarUDF>>,
    /// Its aggregate functions.
    pub aggregate: Vec<Arc<AggregateUDF>>,
}

impl Plugin {
    /// The names of its functions, for messages.
    pub fn function_names(&self) -> Vec<String> {
        let scalar = self.scalar.iter().map(|f| f.name().to_string());
        let aggregate = self.aggregate.iter().map(|f| f.name().to_string());
        scalar.chain(aggregate).collect()
    }
}

/// Plugins loaded by this process, by canonical path.
static LOADED: LazyLock<Mutex<HashMap<PathBuf, Arc<Plugin>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// File name endings of shared libraries on this platform.
const LIBRARY_EXTENSIONS: &[&str] = &["so", "dylib", "dll"];

/// Loads the plugin at `path` (once per process; see the module docs).
pub fn load(path: &Path) -> Result<Arc<Plugin>> {
    let canonical = std::fs::canonicalize(path).map_err(|e| {
        plugin_error(path, format!("cannot open it: {e}. Give the path of the .so a plugin crate builds (target/<profile>/lib<name>.so)"))
    })?;
    let bytes = std::fs::read(&canonical)
        .map_err(|e| plugin_error(&canonical, format!("cannot read it: {e}")))?;
    // A library cut short maps pages past its end: SIGBUS on first touch.
    super::library_file::check_whole_library(&bytes).map_err(|damage| {
        plugin_error(
            &canonical,
            format!(
                "the library is damaged: {damage}. Copy or build it again (a partial \
                 copy or download cuts a file short)"
            ),
        )
    })?;
    let identity = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes));
    drop(bytes);
    let mut loaded = LOADED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(plugin) = loaded.get(&canonical) {
        if plugin.identity != identity {
            return Err(plugin_error(
                &canonical,
                format!(
                    "the file changed since this process loaded it (content {} then, {} now); \
                     a loaded library cannot be replaced: restart the process to use the new one",
                    plugin.identity, identity
                ),
            ));
        }
        return Ok(Arc::clone(plugin));
    }
    let plugin = Arc::new(open(&canonical, identity)?);
    loaded.insert(canonical, Arc::clone(&plugin));
    Ok(plugin)
}

/// Every plugin in `dir` (files ending in .so, .dylib or .dll), by name.
pub fn load_dir(dir: &Path) -> Result<Vec<Arc<Plugin>>> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        plan_datafusion_err!("plugin folder '{}': cannot read it: {e}", dir.display())
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| LIBRARY_EXTENSIONS.contains(&e))
        })
        .collect();
    paths.sort();
    paths.iter().map(|path| load(path)).collect()
}

/// Opens the library (see `sqlfeed_plugin::host`) and wraps its functions.
fn open(path: &Path, identity: String) -> Result<Plugin> {
    let loaded = sqlfeed_plugin::host::open(path)?;
    let crate_name = format!(
        "{} {}",
        loaded.header.plugin_name(),
        loaded.header.plugin_version()
    );
    let origin = FunctionOrigin::Plugin {
        library: path.display().to_string(),
        crate_name: crate_name.clone(),
    };
    let scalar = loaded
        .scalar
        .into_iter()
        .map(|(function, costly)| {
            user_function(
                ScalarUDF::new_from_shared_impl(function),
                identity.clone(),
                costly,
                origin.clone(),
            )
        })
        .collect();
    let aggregate = loaded
        .aggregate
        .into_iter()
        .map(|function| Arc::new(AggregateUDF::new_from_shared_impl(function)))
        .collect();
    Ok(Plugin {
        path: path.to_path_buf(),
        identity,
        crate_name,
        scalar,
        aggregate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_non_library_files_are_plan_errors_naming_them() {
        let err = load(Path::new("/nonexistent/libnone.so")).expect_err("missing");
        assert!(err.to_string().contains("/nonexistent/libnone.so"), "{err}");
        let dir = tempfile::tempdir().expect("temp dir");
        let text = dir.path().join("libtext.so");
        std::fs::write(&text, b"not an ELF file").expect("write");
        let err = load(&text).expect_err("not a library");
        let message = err.to_string();
        assert!(message.contains("libtext.so"), "{message}");
        assert!(
            message.contains("cannot load it as a shared library"),
            "{message}"
        );
    }
}
