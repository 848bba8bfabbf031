//! Python functions as DataFusion scalar functions: `sqlfeed.udf` and
//! `sqlfeed.batch_udf` register here.
//!
//! ```text
//!  engine thread (any partition)             Python (sqlfeed/functions.py)
//!  ─────────────────────────────             ─────────────────────────────
//!  args ─► RecordBatch (one column per ─► attach GIL ─► Function._invoke(batch,
//!          argument, named like it)                      rows, epoch seed)
//!                                                         │ concurrency=1: call here
//!                                                         │ concurrency=N: a worker
//!                                                         │   process (shared memory)
//!  result column ◄─ check rows and type ◄─ Arrow C stream ◄┘ pa.Table, one column
//! ```
//!
//! Both directions cross through the Arrow C stream interface, so no
//! Arrow buffer is copied between Rust and pyarrow in this process. The GIL
//! is held only while Python runs: a pool's Python code waits for its
//! worker with the GIL released, so several partitions keep several
//! workers busy.
//!
//! # Errors
//! A raising function's exception comes back to the caller as itself
//! (`except MyError` matches), carried through the engine in a
//! [`RaisedInPython`] whose text (the traceback, and the note the Python
//! side added: the function, its origin, the batch) is what Rust shows. A
//! result of the wrong length or type is an ExecutionError naming the
//! function, what it returned and what it declared; sqlfeed's own
//! `FunctionFailed` (a worker that died or could not import the function)
//! is an ExecutionError too.
//!
//! # At exit
//! A query that failed leaves engine threads that may still be running its
//! other batches' Python calls (the session's runtime never waits for its
//! threads, see `session.rs`). A thread inside Python while the interpreter
//! finalizes aborts the process ("Fatal Python error: PyGILState_Release").
//! So every call is counted while it runs, and an `atexit` handler
//! ([`close_python_calls`]) refuses new calls and waits, without the GIL,
//! for the running ones to return before finalization starts.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use datafusion::common::{exec_datafusion_err, exec_err, internal_err, plan_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use sqlfeed_udfs::augment::epoch_seed;
use sqlfeed_udfs::user::{DeclaredArgs, FunctionOrigin, user_function, volatility_named};

/// A Python function; see the module docs.
#[derive(Debug)]
pub(crate) struct PyFunction {
    name: String,
    signature: Signature,
    return_type: DataType,
    /// `sqlfeed.Function._invoke`: `(batch, rows, seed) -> pa.Table`.
    invoke: Py<PyAny>,
    /// The declared base seed of a seeded function (`seeded=True`): each
    /// call gets it mixed with the feed's seed and epoch.
    seed: Option<u64>,
    /// `module.qualname`, for messages.
    qualname: String,
}

impl PartialEq for PyFunction {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.invoke.as_ptr() == other.invoke.as_ptr()
    }
}

impl Eq for PyFunction {}

impl std::hash::Hash for PyFunction {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.qualname.hash(state);
    }
}

impl ScalarUDFImpl for PyFunction {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(self.return_type.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let mut names = std::collections::HashSet::new();
        let mut fields = Vec::with_capacity(args.args.len());
        let mut arrays = Vec::with_capacity(args.args.len());
        for (i, (value, field)) in args.args.iter().zip(&args.arg_fields).enumerate() {
            let array = value.to_array(rows)?;
            // Argument names key a batch function's input dict: unique ones.
            let mut name = field.name().clone();
            if !names.insert(name.clone()) {
                name = format!("{name}_{i}");
                names.insert(name.clone());
            }
            fields.push(Field::new(name, array.data_type().clone(), true));
            arrays.push(array);
        }
        let batch = RecordBatch::try_new_with_options(
            Arc::new(Schema::new(fields)),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?;
        // The same mixing as sqlfeed's own seeded functions and plugins.
        let seed = self.seed.map(|seed| epoch_seed(seed, &args.config_options));
        let not_run = || {
            exec_datafusion_err!(
                "Python function '{}' ({}) was not run: the Python interpreter is \
                 shutting down",
                self.name,
                self.qualname
            )
        };
        let _running = PythonCall::enter().ok_or_else(not_run)?;
        let result = Python::try_attach(|py| -> Result<ArrayRef> {
            let export = Py::new(py, ArrowBatchExport::new(batch))
                .map_err(|e| exec_datafusion_err!("{e}"))?;
            let out = self
                .invoke
                .call1(py, (export, rows, seed))
                .map_err(|e| raised(py, e))?;
            let mut batches = import_stream(out.bind(py))
                .map_err(|e| raised(py, e))?
                .collect::<std::result::Result<Vec<_>, _>>()?;
            match (batches.len(), batches.pop()) {
                (1, Some(batch)) if batch.num_columns() == 1 => {
                    Ok(Arc::clone(batch.column(0)))
                }
                (n, _) => internal_err!(
                    "sqlfeed's Python side returned {n} batches instead of one column"
                ),
            }
        })
        .ok_or_else(not_run)??;
        if result.len() != rows {
            return exec_err!(
                "Python function '{}' ({}) returned {} values for {rows} rows; it must \
                 return one value per row",
                self.name,
                self.qualname,
                result.len()
            );
        }
        if result.data_type() != &self.return_type {
            return exec_err!(
                "Python function '{}' ({}) returned {} but declares {}",
                self.name,
                self.qualname,
                result.data_type(),
                self.return_type
            );
        }
        Ok(ColumnarValue::Array(result))
    }
}

/// An exception a Python function raised, carried through the engine to
/// the caller, who gets it back as itself (`crate::errors::to_py`).
pub(crate) struct RaisedInPython {
    /// What Rust shows of it (see [`raised`]).
    text: String,
    /// The exception.
    err: PyErr,
}

impl RaisedInPython {
    /// The exception, to raise again.
    pub(crate) fn exception(&self) -> PyErr {
        Python::attach(|py| self.err.clone_ref(py))
    }
}

impl std::fmt::Display for RaisedInPython {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for RaisedInPython {}

/// Only the text: an executor's failed task reaches the client as the debug
/// text of its error (Ballista's), from which the client keeps the innermost
/// quoted message (`sqlfeed::cluster`'s `tidy_job_error`); the `PyErr`'s own
/// debug text would end that message in the middle of the traceback.
impl std::fmt::Debug for RaisedInPython {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RaisedInPython").field(&self.text).finish()
    }
}

/// `err`, raised by a Python function or by sqlfeed's Python side, as the
/// engine's error: sqlfeed's own errors (a `sqlfeed.Error`, such as
/// `FunctionFailed`) by their message, which says it all; a user's
/// exception by its traceback with the note naming the function and the
/// batch (`sqlfeed.functions.apply` adds it).
fn raised(py: Python<'_>, err: PyErr) -> DataFusionError {
    let text = if err.is_instance_of::<crate::errors::Error>(py) {
        err.value(py)
            .str()
            .map_or_else(|_| err.to_string(), |text| text.to_string())
    } else {
        formatted_exception(py, &err).unwrap_or_else(|| err.to_string())
    };
    DataFusionError::External(Box::new(RaisedInPython { text, err }))
}

/// `traceback.format_exception(err)` as one text (notes included).
fn formatted_exception(py: Python<'_>, err: &PyErr) -> Option<String> {
    let lines = py
        .import("traceback")
        .ok()?
        .call_method1("format_exception", (err.value(py),))
        .ok()?;
    let lines: Vec<String> = lines.extract().ok()?;
    Some(lines.concat().trim_end().to_string())
}

/// Python calls that engine threads are running now.
static CALLS_IN_PYTHON: AtomicUsize = AtomicUsize::new(0);
/// Set by [`close_python_calls`]: no new call starts.
static PYTHON_CLOSING: AtomicBool = AtomicBool::new(false);

/// Longest [`close_python_calls`] waits for running calls: a function that
/// never returns must not keep the process from exiting.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// One running Python call, counted while it lives (see the module docs).
struct PythonCall;

impl PythonCall {
    /// Counts a call, unless the interpreter is closing.
    fn enter() -> Option<Self> {
        // SeqCst on both sides: either this sees the flag, or the closing
        // thread sees this count (it sets the flag, then reads the count).
        CALLS_IN_PYTHON.fetch_add(1, Ordering::SeqCst);
        if PYTHON_CLOSING.load(Ordering::SeqCst) {
            CALLS_IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(PythonCall)
    }
}

impl Drop for PythonCall {
    fn drop(&mut self) {
        CALLS_IN_PYTHON.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Registered with `atexit` when the module loads: refuses new Python
/// calls from engine threads and waits (GIL released, at most
/// [`CLOSE_WAIT`]) for the running ones to return, so that no engine
/// thread is inside Python when the interpreter finalizes.
#[pyfunction]
pub(crate) fn close_python_calls(py: Python<'_>) {
    PYTHON_CLOSING.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + CLOSE_WAIT;
    py.detach(|| {
        while CALLS_IN_PYTHON.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

/// One record batch offered through the Arrow PyCapsule stream protocol,
/// once (a second read gets an empty stream of the same schema).
#[pyclass(module = "sqlfeed._sqlfeed", name = "_ArrowBatch", frozen)]
pub(crate) struct ArrowBatchExport {
    schema: Arc<Schema>,
    batch: Mutex<Option<RecordBatch>>,
}

impl ArrowBatchExport {
    fn new(batch: RecordBatch) -> Self {
        Self {
            schema: batch.schema(),
            batch: Mutex::new(Some(batch)),
        }
    }
}

#[pymethods]
impl ArrowBatchExport {
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let batch = self
            .batch
            .lock()
            .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("poisoned"))?
            .take();
        let reader = datafusion::arrow::record_batch::RecordBatchIterator::new(
            batch.into_iter().map(Ok),
            Arc::clone(&self.schema),
        );
        let ffi = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new_with_value(py, ffi, c"arrow_array_stream")
    }
}

/// Reads `obj` (anything with `__arrow_c_stream__`: a pyarrow Table) as a
/// stream of record batches.
fn import_stream(obj: &Bound<'_, PyAny>) -> PyResult<ArrowArrayStreamReader> {
    let capsule = obj.call_method0("__arrow_c_stream__")?;
    let capsule = capsule.cast_into::<PyCapsule>()?;
    let pointer = capsule.pointer_checked(Some(c"arrow_array_stream"))?;
    // SAFETY: a capsule named "arrow_array_stream" holds a pointer to a live
    // `ArrowArrayStream` (the PyCapsule interface's contract), alive while
    // `capsule` is. `from_raw` moves the stream out and leaves a released
    // one behind, so the capsule's destructor does not release it again.
    let reader = unsafe { ArrowArrayStreamReader::from_raw(pointer.as_ptr().cast()) };
    reader.map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

/// The schema of `obj`'s Arrow stream (an empty pyarrow Table).
fn import_schema(obj: &Bound<'_, PyAny>) -> PyResult<Arc<Schema>> {
    use datafusion::arrow::record_batch::RecordBatchReader;
    Ok(import_stream(obj)?.schema())
}

/// What `sqlfeed.functions` registers, by name (a dict): see
/// `_sqlfeed.pyi`.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct FunctionSpec<'py> {
    pub(crate) name: String,
    pub(crate) invoke: Py<PyAny>,
    /// An empty table whose one column has the return type.
    pub(crate) returns: Bound<'py, PyAny>,
    /// An empty table whose columns have the argument types; None = any.
    pub(crate) inputs: Option<Bound<'py, PyAny>>,
    /// Number of arguments when `inputs` is None; None = any number.
    pub(crate) arg_count: Option<usize>,
    pub(crate) volatility: String,
    pub(crate) identity: String,
    pub(crate) costly: bool,
    pub(crate) qualname: String,
    /// The base seed of a seeded function, else None.
    pub(crate) seed: Option<u64>,
}

/// The function `spec` describes, as a sqlfeed user function.
pub(crate) fn python_udf(spec: FunctionSpec<'_>) -> PyResult<Arc<ScalarUDF>> {
    let plan_error = |message: String| crate::errors::PlanError::new_err(message);
    let Some(volatility) = volatility_named(&spec.volatility) else {
        return Err(plan_error(format!(
            "function '{}': volatility must be 'immutable', 'stable' or 'volatile', \
             not '{}'",
            spec.name, spec.volatility
        )));
    };
    let returns = import_schema(&spec.returns)?;
    let [return_field] = returns.fields().iter().collect::<Vec<_>>()[..] else {
        return Err(plan_error(format!(
            "function '{}': the return schema must have one field",
            spec.name
        )));
    };
    let args = match (&spec.inputs, spec.arg_count) {
        (Some(inputs), _) => DeclaredArgs::Exact(
            import_schema(inputs)?
                .fields()
                .iter()
                .map(|f| f.data_type().clone())
                .collect(),
        ),
        (None, Some(n)) => DeclaredArgs::Any(n),
        (None, None) => DeclaredArgs::Variadic,
    };
    let function = PyFunction {
        name: spec.name,
        signature: args.signature(volatility),
        return_type: return_field.data_type().clone(),
        invoke: spec.invoke,
        seed: spec.seed,
        qualname: spec.qualname.clone(),
    };
    Ok(user_function(
        ScalarUDF::new_from_impl(function),
        spec.identity,
        spec.costly,
        FunctionOrigin::Python {
            qualname: spec.qualname,
        },
    ))
}

/// A Plan error if `name` is taken by a function that is not a Python one.
pub(crate) fn check_name_free(session: &sqlfeed::Session, name: &str) -> Result<()> {
    let state = session.context().state();
    if let Some(existing) = state.scalar_functions().get(name) {
        let is_python = sqlfeed_udfs::user::as_user_function(existing)
            .is_some_and(|f| matches!(f.origin(), FunctionOrigin::Python { .. }));
        if !is_python {
            return plan_err!(
                "a function '{name}' exists already ({}); give the Python function \
                 another name (name=...)",
                match sqlfeed_udfs::user::as_user_function(existing) {
                    Some(user) => user.origin().describe(),
                    None => "one of sqlfeed's or DataFusion's".into(),
                }
            );
        }
    }
    if state.aggregate_functions().contains_key(name) {
        return plan_err!(
            "an aggregate function '{name}' exists already; give the Python function \
             another name (name=...)"
        );
    }
    Ok(())
}
