//! Python functions as the scheduler knows them: by their declaration.
//!
//! ```text
//!  client (Python)            scheduler (no Python)            executor (Python)
//!  preprocess_image ─encode─► DeclaredFunction ──────encode──► preprocess_image
//!  PyFunction, identity h     signature, return type,          imported from its
//!                             volatility, costly, identity h   --function-dir;
//!                             (plans; never runs)              identity must be h
//! ```
//!
//! A client sends a Python function as its name, its identity (the content
//! hash of its code, see `python/sqlfeed/functions.py`) and its
//! **declaration**: argument types, return type, volatility, `module.qualname`.
//! The scheduler plans with the declaration alone, so it needs neither
//! Python nor the team's code: type checking, late materialisation
//! (`costly`) and constant folding decisions (volatility) are the same as
//! the client's. Executors resolve the name against the functions they host
//! (`sqlfeed executor --python … --function-dir …`) and refuse a plan whose
//! identity differs from theirs.
//!
//! A [`DeclaredFunction`] never runs: its `invoke` is an internal error
//! naming the function, which only a scheduler that executes a plan itself
//! could reach.

use std::io::Cursor;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::common::{internal_err, plan_datafusion_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
pub use sqlfeed_udfs::user::DeclaredArgs;
use sqlfeed_udfs::user::{FunctionOrigin, UserFunction, user_function};

/// What a Python function declares: enough to plan a query that calls it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PythonDeclaration {
    /// `module.qualname` of the function.
    pub qualname: String,
    /// Its arguments.
    pub args: DeclaredArgs,
    /// What it returns.
    pub return_type: DataType,
    /// As `sqlfeed.udf(volatility=…)` said.
    pub volatility: Volatility,
    /// Whether it runs on several workers and, under `SHUFFLE`, after the
    /// permutation (`costly=True` with `concurrency` above 1).
    pub costly: bool,
}

impl PythonDeclaration {
    /// The declaration of `user`, a Python function of this process.
    pub fn of(user: &UserFunction) -> Result<Self> {
        let FunctionOrigin::Python { qualname } = user.origin() else {
            return internal_err!("'{}' is not a Python function", user.inner().name());
        };
        let signature = user.inner().signature();
        let Some(args) = DeclaredArgs::of(&signature.type_signature) else {
            return internal_err!(
                "Python function '{}' has a signature sqlfeed does not send: {:?}",
                user.inner().name(),
                signature.type_signature
            );
        };
        let arg_types = match &args {
            DeclaredArgs::Exact(types) => types.clone(),
            DeclaredArgs::Any(_) | DeclaredArgs::Variadic => vec![],
        };
        #[allow(deprecated)] // A Python function's type does not depend on its arguments.
        let return_type = user.inner().return_type(&arg_types)?;
        Ok(Self {
            qualname: qualname.clone(),
            args,
            return_type,
            volatility: signature.volatility,
            costly: user.is_costly(),
        })
    }
}

/// `types` as the bytes of an Arrow IPC stream with no batches: Arrow's own
/// encoding of data types, nested ones included.
pub(crate) fn types_to_ipc(types: &[DataType]) -> Result<Vec<u8>> {
    let schema = Schema::new(
        types
            .iter()
            .enumerate()
            .map(|(i, t)| Field::new(format!("a{i}"), t.clone(), true))
            .collect::<Vec<_>>(),
    );
    let mut bytes = vec![];
    let mut writer = StreamWriter::try_new(&mut bytes, &schema)?;
    writer.finish()?;
    drop(writer);
    Ok(bytes)
}

/// The types [`types_to_ipc`] wrote.
pub(crate) fn types_from_ipc(bytes: &[u8]) -> Result<Vec<DataType>> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)
        .map_err(|e| plan_datafusion_err!("a Python function's declared types: {e}"))?;
    Ok(reader
        .schema()
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect())
}

/// A Python function the scheduler plans with; see the module docs.
#[derive(Debug, PartialEq, Eq, Hash)]
struct DeclaredFunction {
    name: String,
    signature: Signature,
    declaration: PythonDeclaration,
}

impl ScalarUDFImpl for DeclaredFunction {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(self.declaration.return_type.clone())
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        internal_err!(
            "Python function '{}' ({}) was asked to run where it is only declared \
             (a scheduler); executors started with --function-dir run it",
            self.name,
            self.declaration.qualname
        )
    }
}

/// The function `name` as `declaration` and `identity` describe it: a user
/// function with the same identity, cost and origin as the sender's, so that
/// it plans, and encodes again, as the sender's does.
pub(crate) fn declared_function(
    name: &str,
    identity: &str,
    declaration: PythonDeclaration,
) -> Arc<ScalarUDF> {
    let origin = FunctionOrigin::Python {
        qualname: declaration.qualname.clone(),
    };
    let costly = declaration.costly;
    let function = DeclaredFunction {
        name: name.to_string(),
        signature: declaration.args.signature(declaration.volatility),
        declaration,
    };
    user_function(
        ScalarUDF::new_from_impl(function),
        identity.to_string(),
        costly,
        origin,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::logical_expr::create_udf;
    use sqlfeed_udfs::user::as_user_function;

    #[test]
    fn types_travel_through_ipc() -> Result<()> {
        let types = vec![
            DataType::Int64,
            DataType::Binary,
            DataType::List(Arc::new(Field::new("item", DataType::Float32, true))),
            DataType::Struct(
                vec![
                    Field::new("x", DataType::Utf8, true),
                    Field::new("y", DataType::FixedSizeBinary(4), false),
                ]
                .into(),
            ),
        ];
        assert_eq!(types_from_ipc(&types_to_ipc(&types)?)?, types);
        assert_eq!(types_from_ipc(&types_to_ipc(&[])?)?, vec![]);
        assert!(types_from_ipc(b"not ipc").is_err());
        Ok(())
    }

    #[test]
    fn a_declared_function_plans_like_the_original_and_never_runs() -> Result<()> {
        let original = user_function(
            create_udf(
                "prep",
                vec![DataType::Binary, DataType::Int32],
                DataType::Float32,
                Volatility::Volatile,
                Arc::new(|args: &[ColumnarValue]| Ok(args[0].clone())),
            ),
            "0123abcd".into(),
            true,
            FunctionOrigin::Python {
                qualname: "team.images.prep".into(),
            },
        );
        let declaration =
            PythonDeclaration::of(as_user_function(&original).expect("a user function"))?;
        assert_eq!(
            declaration.args,
            DeclaredArgs::Exact(vec![DataType::Binary, DataType::Int32])
        );
        let declared = declared_function("prep", "0123abcd", declaration.clone());
        assert_eq!(declared.signature(), original.signature());
        #[allow(deprecated)]
        let returns = declared.return_type(&[DataType::Binary, DataType::Int32])?;
        assert_eq!(returns, DataType::Float32);
        let user = as_user_function(&declared).expect("a user function");
        assert_eq!((user.identity(), user.is_costly()), ("0123abcd", true));
        assert_eq!(
            PythonDeclaration::of(user)?,
            declaration,
            "encodes again as it came"
        );
        let args = ScalarFunctionArgs {
            args: vec![],
            arg_fields: vec![],
            number_rows: 1,
            return_field: Arc::new(Field::new("r", DataType::Float32, true)),
            config_options: Arc::new(Default::default()),
        };
        let err = declared.invoke_with_args(args).unwrap_err().to_string();
        assert!(err.contains("only declared"), "{err}");
        Ok(())
    }
}
