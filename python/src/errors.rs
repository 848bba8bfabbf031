//! One exception hierarchy for every Rust error, chosen by who is at fault,
//! with the Rust message unchanged.
//!
//! ```text
//!  sqlfeed.Error (Exception)
//!   ├── PlanError            the SQL or the options: fix the call
//!   ├── ExecutionError       the data or a file: fix the input
//!   ├── ResourcesExhausted   the memory budget
//!   └── InternalError        a bug in sqlfeed: please report it
//! ```

use datafusion::error::DataFusionError;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    sqlfeed,
    Error,
    PyException,
    "Base class of sqlfeed's errors."
);
create_exception!(
    sqlfeed,
    PlanError,
    Error,
    "The SQL or an option is wrong (a bad column, a syntax error, an impossible setting)."
);
create_exception!(
    sqlfeed,
    ExecutionError,
    Error,
    "The data could not be processed (a corrupt file, a bad value in a row)."
);
create_exception!(
    sqlfeed,
    ResourcesExhausted,
    Error,
    "The memory budget (memory_limit) does not fit the work."
);
create_exception!(
    sqlfeed,
    InternalError,
    Error,
    "A bug in sqlfeed; the message says what failed."
);

/// Adds the exception classes to the module.
pub(crate) fn register(py: Python<'_>, m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", py.get_type::<Error>())?;
    m.add("PlanError", py.get_type::<PlanError>())?;
    m.add("ExecutionError", py.get_type::<ExecutionError>())?;
    m.add("ResourcesExhausted", py.get_type::<ResourcesExhausted>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}

/// The Python exception for a Rust error: an exception a Python function
/// raised, as itself (wherever in the error's chain it is); otherwise the
/// class by the innermost error's kind, the message as Rust prints it.
pub(crate) fn to_py(err: DataFusionError) -> PyErr {
    if let Some(raised) = raised_in_python(&err) {
        return raised;
    }
    let message = err.to_string();
    match err.find_root() {
        DataFusionError::Plan(_)
        | DataFusionError::SQL(..)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_)
        | DataFusionError::Configuration(_) => PlanError::new_err(message),
        DataFusionError::ResourcesExhausted(_) => ResourcesExhausted::new_err(message),
        DataFusionError::Internal(_) => InternalError::new_err(message),
        _ => ExecutionError::new_err(message),
    }
}

/// The exception a Python function raised that `err` carries, if any.
fn raised_in_python(err: &DataFusionError) -> Option<PyErr> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(error) = cause {
        if let Some(raised) = error.downcast_ref::<crate::functions::RaisedInPython>() {
            return Some(raised.exception());
        }
        cause = error.source();
    }
    None
}

/// `Result` into `PyResult`.
pub(crate) trait IntoPy<T> {
    /// Converts the error side.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for datafusion::error::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
