//! `sqlfeed._sqlfeed`: the Python extension module. A thin layer over the
//! Rust API (sessions, SQL results as Arrow C streams, feeds whose batches
//! are DLPack tensors); the ergonomic parts (framework conversion, the
//! `state_dict` protocol, `shard="auto"`, the DataLoader adapter) are in the
//! pure-Python package `sqlfeed`.

#![deny(unsafe_code)]

// `unsafe` only where the extension meets C: the DLPack capsule protocol
// (`dlpack`), the one consumer-stream handle DLPack passes (`feed`) and the
// Arrow stream a Python function returns (`functions`).
mod dataset;
#[allow(unsafe_code)]
mod dlpack;
mod errors;
#[cfg(feature = "ballista")]
mod executor;
mod feed;
// `unsafe` once more: reading the Arrow C stream a Python function returns.
#[allow(unsafe_code)]
mod functions;
mod position;
mod result;
mod session;
mod tools;
mod wait;

use pyo3::prelude::*;

/// mimalloc for the extension's own allocations, like the `sqlfeed` binary
/// and datafusion-python. Every Rust allocation is freed by Rust: batches
/// handed to Python (DLPack capsules, Arrow C streams) come back through
/// their deleters and release callbacks, which are this library's code.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The extension module.
#[pymodule]
fn _sqlfeed(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(py, m)?;
    m.add_class::<session::PySession>()?;
    m.add_class::<result::PySqlResult>()?;
    m.add_class::<feed::PyFeed>()?;
    m.add_class::<dataset::PyEpochDataset>()?;
    m.add_class::<feed::PyBatch>()?;
    m.add_class::<feed::PyTensor>()?;
    m.add_class::<position::PyFeedPosition>()?;
    m.add_class::<functions::ArrowBatchExport>()?;
    m.add_function(wrap_pyfunction!(session::cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(session::query_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(tools::generate, m)?)?;
    #[cfg(feature = "ballista")]
    {
        m.add_function(wrap_pyfunction!(executor::executor_options, m)?)?;
        m.add_function(wrap_pyfunction!(executor::serve_executor, m)?)?;
    }
    m.add_function(wrap_pyfunction!(tools::raw_h2d_bytes_per_s, m)?)?;
    m.add_function(wrap_pyfunction!(tools::prometheus_text, m)?)?;
    m.add_function(wrap_pyfunction!(tools::write_whole, m)?)?;
    // Before the interpreter finalizes, no engine thread may be inside a
    // Python function (see `functions::close_python_calls`).
    let close = wrap_pyfunction!(functions::close_python_calls, m)?;
    py.import("atexit")?.call_method1("register", (close,))?;
    Ok(())
}
