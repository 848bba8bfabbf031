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

use datafusion::arrow::datatypes::DataType;
use datafusion::common::config::ConfigOptions;
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TypeSignature, Volatility,
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

/// The arguments a Python function declares: what its [`Signature`] is
/// made from in the process that runs it, and what a cluster client sends
/// the scheduler, which plans with it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeclaredArgs {
    /// These types (`input_types=`), none for a nullary function.
    Exact(Vec<DataType>),
    /// This many arguments of any type.
    Any(usize),
    /// Any number of arguments of any type (`*args`).
    Variadic,
}

impl DeclaredArgs {
    /// The signature of a function with these arguments.
    pub fn signature(&self, volatility: Volatility) -> Signature {
        match self {
            Self::Exact(types) if types.is_empty() => Signature::nullary(volatility),
            Self::Exact(types) => Signature::exact(types.clone(), volatility),
            Self::Any(0) => Signature::nullary(volatility),
            Self::Any(n) => Signature::any(*n, volatility),
            Self::Variadic => Signature::variadic_any(volatility),
        }
    }

    /// The arguments `signature` declares, if [`Self::signature`] makes it.
    pub fn of(signature: &TypeSignature) -> Option<Self> {
        match signature {
            TypeSignature::Exact(types) => Some(Self::Exact(types.clone())),
            TypeSignature::Nullary => Some(Self::Exact(vec![])),
            TypeSignature::Any(n) => Some(Self::Any(*n)),
            TypeSignature::VariadicAny => Some(Self::Variadic),
            _ => None,
        }
    }
}

/// `volatility` as `sqlfeed.udf(volatility=…)` names it.
pub fn volatility_name(volatility: Volatility) -> &'static str {
    match volatility {
        Volatility::Immutable => "immutable",
        Volatility::Stable => "stable",
        Volatility::Volatile => "volatile",
    }
}

/// The volatility [`volatility_name`] names `name`, if it names one.
pub fn volatility_named(name: &str) -> Option<Volatility> {
    [
        Volatility::Immutable,
        Volatility::Stable,
        Volatility::Volatile,
    ]
    .into_iter()
    .find(|v| volatility_name(*v) == name)
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

    /// The wrapped function's call; its error comes back inside a
    /// `Context` naming the function, which no operator mistakes for its
    /// own (a scan that names the file it read does not call a raising
    /// function's error a damaged file) and which keeps the error itself
    /// (a Python function's exception reaches its caller as itself).
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        self.inner.invoke_with_args(args).map_err(|error| {
            DataFusionError::Context(
                format!(
                    "in function '{}' ({})",
                    self.inner.name(),
                    self.origin.describe()
                ),
                Box::new(error),
            )
        })
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
    use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
    use datafusion::logical_expr::sort_properties::ExprProperties;
    use datafusion::logical_expr::{
        Expr, ExpressionPlacement, Volatility, col, create_udf, lit,
    };

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

    #[test]
    fn declared_arguments_make_a_signature_and_are_read_back_from_it() {
        for args in [
            DeclaredArgs::Exact(vec![DataType::Binary, DataType::Int32]),
            DeclaredArgs::Exact(vec![]),
            DeclaredArgs::Any(2),
            DeclaredArgs::Variadic,
        ] {
            let signature = args.signature(Volatility::Stable);
            assert_eq!(signature.volatility, Volatility::Stable);
            assert_eq!(DeclaredArgs::of(&signature.type_signature), Some(args));
        }
        // No arguments of any type is no arguments.
        assert_eq!(
            DeclaredArgs::Any(0).signature(Volatility::Immutable),
            DeclaredArgs::Exact(vec![]).signature(Volatility::Immutable)
        );
        assert_eq!(DeclaredArgs::of(&TypeSignature::UserDefined), None);
        for v in [
            Volatility::Immutable,
            Volatility::Stable,
            Volatility::Volatile,
        ] {
            assert_eq!(volatility_named(volatility_name(v)), Some(v));
        }
        assert_eq!(volatility_named("sometimes"), None);
    }

    /// A function whose every optional answer differs from the default.
    #[derive(Debug, PartialEq, Eq, Hash)]
    struct Particular {
        signature: datafusion::logical_expr::Signature,
        aliases: Vec<String>,
    }

    impl ScalarUDFImpl for Particular {
        fn name(&self) -> &str {
            "particular"
        }
        fn aliases(&self) -> &[String] {
            &self.aliases
        }
        fn display_name(&self, _args: &[Expr]) -> Result<String> {
            Ok("shown".into())
        }
        fn schema_name(&self, _args: &[Expr]) -> Result<String> {
            Ok("named".into())
        }
        fn signature(&self) -> &datafusion::logical_expr::Signature {
            &self.signature
        }
        fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
            Ok(DataType::Int64)
        }
        fn is_strict(&self) -> bool {
            true
        }
        fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
            Ok(args.args[0].clone())
        }
        fn simplify(
            &self,
            _args: Vec<Expr>,
            _info: &SimplifyContext,
        ) -> Result<ExprSimplifyResult> {
            Ok(ExprSimplifyResult::Simplified(lit(7i64)))
        }
        fn short_circuits(&self) -> bool {
            true
        }
        fn preserves_lex_ordering(&self, _inputs: &[ExprProperties]) -> Result<bool> {
            Ok(true)
        }
        fn strictly_order_preserving(&self, _inputs: &[ExprProperties]) -> Result<bool> {
            Ok(true)
        }
        fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
            Ok(vec![DataType::Int64; arg_types.len()])
        }
        fn placement(&self, _args: &[ExpressionPlacement]) -> ExpressionPlacement {
            ExpressionPlacement::MoveTowardsLeafNodes
        }
    }

    /// Issue 56, item 8: the wrapper answers every method as the wrapped
    /// function does (half of them fell back to DataFusion's defaults).
    #[test]
    // `display_name` is deprecated in DataFusion, still part of the contract.
    #[allow(deprecated)]
    fn a_user_function_answers_the_whole_contract_as_the_wrapped_one() -> Result<()> {
        let inner = ScalarUDF::new_from_impl(Particular {
            signature: datafusion::logical_expr::Signature::any(1, Volatility::Immutable),
            aliases: vec!["also".into()],
        });
        let wrapped = user_function(
            inner.clone(),
            "id".into(),
            false,
            FunctionOrigin::Python {
                qualname: "m.particular".into(),
            },
        );
        let (inner, wrapped) = (inner.inner(), wrapped.inner());
        let args = [col("x")];
        assert_eq!(wrapped.aliases(), inner.aliases());
        assert_eq!(wrapped.display_name(&args)?, "shown");
        assert_eq!(wrapped.schema_name(&args)?, "named");
        assert!(wrapped.is_strict());
        assert!(wrapped.short_circuits());
        let info = SimplifyContext::default();
        assert!(matches!(
            wrapped.simplify(args.to_vec(), &info)?,
            ExprSimplifyResult::Simplified(e) if e == lit(7i64)
        ));
        let ordered = [ExprProperties::new_unknown()];
        assert!(wrapped.preserves_lex_ordering(&ordered)?);
        assert!(wrapped.strictly_order_preserving(&ordered)?);
        assert_eq!(
            wrapped.coerce_types(&[DataType::Int32])?,
            vec![DataType::Int64]
        );
        assert_eq!(
            wrapped.placement(&[ExpressionPlacement::Column]),
            ExpressionPlacement::MoveTowardsLeafNodes
        );
        Ok(())
    }
}
