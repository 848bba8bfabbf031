//! `sqlfeed executor --function-dir`: the executor as a Python process that
//! hosts the folders' Python functions (`python/sqlfeed/executor.py` imports
//! them and calls [`serve_executor`]).
//!
//! ```text
//!  sqlfeed executor --python PY --function-dir DIR …   (the binary)
//!    └─ exec PY -c bootstrap …  ─► sqlfeed.executor.main
//!         imports DIR's modules, collects their sqlfeed functions
//!         └─ serve_executor(argv, declarations)  (GIL released)
//!              Ballista executor; its tasks call the functions through
//!              the same PyFunction as an embedded session
//! ```

use std::sync::Arc;

use datafusion::logical_expr::ScalarUDF;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sqlfeed::cli::{Cli, SubCommand};
use sqlfeed::cluster::ClusterCommand;

use crate::functions::{FunctionSpec, python_udf};

/// Of the command line `argv` (`sqlfeed`'s, program name first) of an
/// executor: `function_dirs`, its `--function-dir` folders, and
/// `task_slots`, the tasks it runs at once (`--concurrent-tasks`, else the
/// cores, as Ballista counts them). A command line `sqlfeed` would refuse
/// raises ValueError with clap's message.
#[pyfunction]
pub(crate) fn executor_options<'py>(
    py: Python<'py>,
    argv: Vec<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let cli = parse(argv)?;
    let Some(SubCommand::Cluster(ClusterCommand::Executor(args))) = &cli.command else {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "not an `executor` command line",
        ));
    };
    let dirs: Vec<String> = args
        .function_dirs
        .iter()
        .map(|dir| dir.display().to_string())
        .collect();
    let slots = match args.concurrent_tasks {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let options = PyDict::new(py);
    options.set_item("function_dirs", dirs)?;
    options.set_item("task_slots", slots)?;
    Ok(options)
}

/// Runs the executor `argv` describes, hosting `functions` (what
/// `Function._declaration` gives), until it is stopped; returns the exit
/// status the `sqlfeed` binary would have (0 or 1), its error printed as the
/// binary prints it.
#[pyfunction]
pub(crate) fn serve_executor(
    py: Python<'_>,
    argv: Vec<String>,
    functions: Vec<Bound<'_, PyDict>>,
) -> PyResult<i32> {
    let cli = parse(argv)?;
    let udfs = functions
        .iter()
        .map(|spec| python_udf(spec.extract::<FunctionSpec<'_>>()?))
        .collect::<PyResult<Vec<Arc<ScalarUDF>>>>()?;
    sqlfeed::cli::init_process();
    let code = py.detach(|| sqlfeed::cli::run_python_executor(cli, udfs));
    Ok(if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        1
    })
}

fn parse(argv: Vec<String>) -> PyResult<Cli> {
    sqlfeed::cli::parse_args(argv).map_err(pyo3::exceptions::PyValueError::new_err)
}
