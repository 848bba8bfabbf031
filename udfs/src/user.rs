//! Functions users bring: Rust plugins and Python functions, wrapped so that
//! the engine knows what it cannot ask the function itself.
//!
//! A [`UserFunction`] is a [`ScalarUDF`] plus three facts:
//! * its **identity**: the plugin library's content hash, or a Python
//!   function's code hash (or its declared version). Epoch cache keys cover
//!   it, so a changed function never serves a stale cache; a cluster client
//!   sends it, so an executor whose function differs refuses the plan;
//! * whether it is **costly** per row (like `image_decode`), so that it runs
//!   on several workers and, under `SHUFFLE`, after the shuffle;
//! * its **origin**, for errors that name where the function came from, and
//!   whether it can run outside this process (a plugin can, on executors that
//!   loaded the same library; a Python function cannot).
//!
//! Everything else is the wrapped function's own behaviour, unchanged.

use std::any::Any;
use std::hash::Hash;
use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
};

/// Where a [`UserFunction`] comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FunctionOrigin {
    /// A `cdylib` built with `sqlfeed-plugin`: its path and crate.
    Plugin {
        /// The library as it was loaded.
        library: String,
        /// `name version` of the plugin crate.
        crate_name: String,
    },
    /// A Python function: `module.qualname`.
    Python {
        /// `module.qualname` of the function.
        qualname: String,
    },
}

impl FunctionOrigin {
    /// "plugin '/x/libp.so' (p 0.1.0)" or "Python function 'mod.f'".
    pub fn describe(&self) -> String {
        match self {
            FunctionOrigin::Plugin {
                library,
                crate_name,
            } => format!("plugin '{library}' ({crate_name})"),
            FunctionOrigin::Python { qualname } => {
                format!("Python function '{qualname}'")
            }
        }
    }
}

/// A user's scalar function; see the module docs.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct UserFunction {
    inner: ScalarUDF,
    identity: String,
    costly: bool,
    origin: FunctionOrigin,
}

impl UserFunction {
    /// Wraps `inner`, identified by `identity` (a content hash).
    pub fn new(
        inner: ScalarUDF,
        identity: String,
        costly: bool,
        origin: FunctionOrigin,
    ) -> Self {
        Self {
            inner,
            identity,
            costly,
            origin,
        }
    }

    /// The wrapped function as a [`ScalarUDF`].
    pub fn into_udf(self) -> ScalarUDF {
        ScalarUDF::new_from_impl(self)
    }

    /// The content hash that identifies the function's code.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether a row costs far more than a column copy.
    pub fn is_costly(&self) -> bool {
        self.costly
    }

    /// Where the function comes from.
    pub fn origin(&self) -> &FunctionOrigin {
        &self.origin
    }

    /// The wrapped function.
    pub fn inner(&self) -> &ScalarUDF {
        &self.inner
    }
}

/// The [`UserFunction`] behind `udf`, if it is one.
pub fn as_user_function(udf: &ScalarUDF) -> Option<&UserFunction> {
    let any: &dyn Any = udf.inner().as_ref();
    any.downcast_ref::<UserFunction>()
}

impl ScalarUDFImpl for UserFunction {
    sqlfeed_plugin::answered_by_wrapped_function!(inner);

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let updated = self.inner.inner().with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(UserFunction {
            inner: updated,
            identity: self.identity.clone(),
            costly: self.costly,
            origin: self.origin.clone(),
        }))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.inner.invoke_with_args(args)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> Result<SortProperties> {
        self.inner.output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.inner.preserves_lex_ordering(inputs)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

/// `udf` as a shared [`UserFunction`] handle.
pub fn user_function(
    inner: ScalarUDF,
    identity: String,
    costly: bool,
    origin: FunctionOrigin,
) -> Arc<ScalarUDF> {
    Arc::new(UserFunction::new(inner, identity, costly, origin).into_udf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::{Volatility, create_udf};

    #[test]
    fn a_user_function_keeps_the_name_and_is_found_again() {
        let plain = create_udf(
            "twice",
            vec![DataType::Int64],
            DataType::Int64,
            Volatility::Immutable,
            Arc::new(|args: &[ColumnarValue]| Ok(args[0].clone())),
        );
        let udf = user_function(
            plain.clone(),
            "abc".into(),
            true,
            FunctionOrigin::Python {
                qualname: "m.twice".into(),
            },
        );
        assert_eq!(udf.name(), "twice");
        let user = as_user_function(&udf).expect("a user function");
        assert_eq!(user.identity(), "abc");
        assert!(user.is_costly());
        assert!(as_user_function(&plain).is_none());
        assert_eq!(user.origin().describe(), "Python function 'm.twice'");
    }
}
