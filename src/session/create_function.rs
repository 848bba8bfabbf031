//! `CREATE FUNCTION name(…) LANGUAGE rust AS '<library>'`: registers one
//! function of a plugin library (see [`super::plugins`]) through
//! DataFusion's `FunctionFactory`.
//!
//! ```sql
//! CREATE FUNCTION ngram_hash() LANGUAGE rust AS 'target/debug/libsqlfeed_udf_plugin.so';
//! SELECT ngram_hash(title, 3, 65536) FROM 'items/*.parquet';
//! ```
//!
//! The argument list (empty or not) is not used: the plugin's function
//! declares its own signature, and a call is checked against it. Other
//! languages are refused with what to do instead. `CREATE OR REPLACE` and
//! `TEMPORARY` behave as DataFusion's: the function belongs to this session.

use std::path::Path;

use async_trait::async_trait;
use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::execution::context::{FunctionFactory, RegisterFunction, SessionState};
use datafusion::logical_expr::{CreateFunction, Expr};
use datafusion::scalar::ScalarValue;

use super::plugins;

/// The session's [`FunctionFactory`]: `LANGUAGE rust` plugins.
#[derive(Debug, Default)]
pub struct PluginFunctionFactory;

#[async_trait]
impl FunctionFactory for PluginFunctionFactory {
    async fn create(
        &self,
        _state: &SessionState,
        statement: CreateFunction,
    ) -> Result<RegisterFunction> {
        let name = statement.name.as_str();
        let language = statement
            .params
            .language
            .as_ref()
            .map(|ident| ident.value.to_ascii_lowercase());
        if language.as_deref() != Some("rust") {
            return plan_err!(
                "CREATE FUNCTION {name}: sqlfeed creates functions from Rust plugin \
                 libraries only: CREATE FUNCTION {name}() LANGUAGE rust AS '<path of the \
                 .so>'{}. Python functions are registered from Python \
                 (session.register(...))",
                match &language {
                    Some(other) => format!(", not LANGUAGE {other}"),
                    None => String::new(),
                }
            );
        }
        let library = match &statement.params.function_body {
            Some(Expr::Literal(ScalarValue::Utf8(Some(path)), _))
            | Some(Expr::Literal(ScalarValue::LargeUtf8(Some(path)), _))
            | Some(Expr::Literal(ScalarValue::Utf8View(Some(path)), _)) => path.clone(),
            _ => {
                return plan_err!(
                    "CREATE FUNCTION {name} LANGUAGE rust needs AS '<path of the plugin \
                     library>', a string literal"
                );
            }
        };
        let plugin = plugins::load(Path::new(&library))?;
        if let Some(udf) = plugin.scalar.iter().find(|f| f.name() == name) {
            return Ok(RegisterFunction::Scalar(std::sync::Arc::clone(udf)));
        }
        if let Some(udaf) = plugin.aggregate.iter().find(|f| f.name() == name) {
            return Ok(RegisterFunction::Aggregate(std::sync::Arc::clone(udaf)));
        }
        plan_err!(
            "CREATE FUNCTION {name}: plugin '{}' ({}) has no function '{name}'; it has: {}",
            plugin.path.display(),
            plugin.crate_name,
            plugin.function_names().join(", ")
        )
    }
}
