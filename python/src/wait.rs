//! Every blocking wait of the extension, in one place: without the GIL (the
//! query may run Python functions on engine threads, which need it), and
//! looking for signals every [`SIGNAL_CHECK`], as datafusion-python's
//! `wait_for_future` does, so that Ctrl-C raises `KeyboardInterrupt` at
//! once instead of after the query.
//!
//! ```text
//!  Python thread ── detach (GIL released) ──► wait on a channel for the work
//!                                               (a task of the runtime, or a thread)
//!                                               every 100 ms ─► attach, check_signals()
//!                                                                └─► KeyboardInterrupt
//! ```
//! Raised by a signal, [`wait_for_future`] aborts the task, which drops the
//! future and so cancels its query (its streams and tasks end); [`wait_for_call`], for synchronous
//! library calls (building a feed, explaining a batch), leaves the call to
//! end on its thread: what it built is dropped there.

use std::sync::mpsc;
use std::time::Duration;

use pyo3::prelude::*;

use crate::errors::IntoPy;

/// How often a wait looks for a signal.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// Runs `future` on `runtime` to its end, or until a signal's handler
/// raises (see the module docs).
///
/// The future runs as a task of `runtime` and this thread waits on a
/// channel with a timeout, not on a tokio timer: a timer fires only when a
/// worker thread of the runtime services the time driver, and workers busy
/// with a query's blocking calls (Python functions) did so rarely enough
/// that Ctrl-C took 15 s to be seen.
pub(crate) fn wait_for_future<T: Send + 'static>(
    py: Python<'_>,
    runtime: &tokio::runtime::Runtime,
    future: impl Future<Output = datafusion::error::Result<T>> + Send + 'static,
) -> PyResult<T> {
    let (sender, receiver) = mpsc::channel();
    let task = runtime.spawn(async move {
        // Gone when a signal raised first: the result is dropped here.
        let _ = sender.send(future.await);
    });
    // Aborting the task drops the future, which cancels its query.
    wait_for_result(py, receiver, "a query's task", || task.abort())
}

/// Runs `call` (a blocking library call) on a thread of its own and waits
/// for it, or until a signal's handler raises (see the module docs).
pub(crate) fn wait_for_call<T: Send + 'static>(
    py: Python<'_>,
    what: &str,
    call: impl FnOnce() -> datafusion::error::Result<T> + Send + 'static,
) -> PyResult<T> {
    let (sender, receiver) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("sqlfeed-{what}"))
        .spawn(move || {
            // Gone when a signal raised first: the result is dropped here.
            let _ = sender.send(call());
        })
        .map_err(|e| {
            pyo3::exceptions::PyRuntimeError::new_err(format!(
                "cannot start a thread for {what}: {e}"
            ))
        })?;
    wait_for_result(py, receiver, what, || ())
}

/// Waits, without the GIL, for the result `receiver` gets, looking for a
/// signal every [`SIGNAL_CHECK`]; when a signal's handler raises, calls
/// `on_signal` and returns what it raised. `what` names the sender for the
/// error when it ended (panicked) without sending.
fn wait_for_result<T: Send>(
    py: Python<'_>,
    receiver: mpsc::Receiver<datafusion::error::Result<T>>,
    what: &str,
    on_signal: impl FnOnce() + Send,
) -> PyResult<T> {
    py.detach(move || {
        loop {
            match receiver.recv_timeout(SIGNAL_CHECK) {
                Ok(done) => return done.py_err(),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(raised) = Python::attach(|py| py.check_signals()) {
                        on_signal();
                        return Err(raised);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(crate::errors::InternalError::new_err(format!(
                        "{what} panicked; this is a bug in sqlfeed, please report it"
                    )));
                }
            }
        }
    })
}
