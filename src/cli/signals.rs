//! SIGINT and SIGTERM in the CLI's non-interactive commands (`feed`, `-c`,
//! `-f`, `scan`, `demo`, `verify`): what Ctrl-C, Slurm and Kubernetes send
//! before SIGKILL on preemption.
//!
//! ```text
//!  signal ─► watch() (a task on the CLI's runtime) records it
//!               │
//!     ┌─────────┴──────────────────────────┐
//!     ▼                                    ▼
//!  feed loop (its own thread) sees       `-c` / `-f` / scan: the command's
//!  `requested()` within 100 ms, stops     future is dropped at once, which
//!  and drops the feed: its query,         cancels the query's streams and
//!  threads and cache parts end            tasks
//!     └─────────┬──────────────────────────┘
//!               ▼
//!  the session is dropped (its spill folder removed), one line on stderr,
//!  exit 128 + signal: 130 for SIGINT, 143 for SIGTERM
//! ```
//! A feed's planning (`FeedBuilder::build`: listing the files, a stalled
//! object store) and `--explain` (a whole shuffled epoch of origins) are
//! blocking library calls that never look at the signal: they run on a
//! thread of their own while the CLI waits in [`until_signalled`], which
//! returns [`Stopped`] within 100 ms of a signal. The abandoned call ends
//! with the process; the session's spill folder, which it may still hold
//! through a clone of the session, is removed before the exit
//! (`Session::remove_spill_folder`).
//!
//! The REPL keeps its own handling (Ctrl-C cancels the statement); the
//! scheduler and executor servers keep the default action.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// How often a blocked wait looks for a signal.
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The termination signal received, 0 while none.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

/// A signal that asks the CLI to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM (preemption, `kill`).
    Terminate,
}

impl Stop {
    const SIGINT: i32 = 2;
    const SIGTERM: i32 = 15;

    fn number(self) -> i32 {
        match self {
            Stop::Interrupt => Self::SIGINT,
            Stop::Terminate => Self::SIGTERM,
        }
    }

    fn from_number(number: i32) -> Option<Self> {
        match number {
            Self::SIGINT => Some(Stop::Interrupt),
            Self::SIGTERM => Some(Stop::Terminate),
            _ => None,
        }
    }

    /// The shell's convention for a process ended by a signal: 128 + its
    /// number.
    pub(crate) fn exit_code(self) -> u8 {
        128 + self.number() as u8
    }

    /// The one line printed on the way out.
    pub(crate) fn message(self) -> String {
        let name = match self {
            Stop::Interrupt => "SIGINT",
            Stop::Terminate => "SIGTERM",
        };
        format!(
            "sqlfeed: stopped by {name}: the query was cancelled and its spill files and \
             unfinished cache parts removed"
        )
    }
}

/// The signal received so far, if any: long loops that run outside the
/// runtime (the feed loop) poll it.
pub(crate) fn requested() -> Option<Stop> {
    Stop::from_number(RECEIVED.load(Ordering::Acquire))
}

/// Waits for SIGINT or SIGTERM and records it for [`requested`]. Installing
/// the handlers replaces the signals' default action (ending the process at
/// once) for as long as the process lives.
pub(crate) async fn watch() -> std::io::Result<Stop> {
    let stop = wait().await?;
    RECEIVED.store(stop.number(), Ordering::Release);
    Ok(stop)
}

#[cfg(unix)]
async fn wait() -> std::io::Result<Stop> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(tokio::select! {
        _ = interrupt.recv() => Stop::Interrupt,
        _ = terminate.recv() => Stop::Terminate,
    })
}

#[cfg(not(unix))]
async fn wait() -> std::io::Result<Stop> {
    tokio::signal::ctrl_c().await?;
    Ok(Stop::Interrupt)
}

/// Runs `work`, a blocking call that does not look for signals, on a thread
/// of its own and returns its result, or [`Stopped`] within
/// [`SIGNAL_CHECK`] of a signal (see the module docs: the call is then
/// abandoned, to end with the process).
pub(crate) fn until_signalled<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    let (sender, receiver) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("sqlfeed-{what}"))
        .spawn(move || {
            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            // The receiver is gone when a signal came first.
            let _ = sender.send(done);
        })
        .map_err(|e| anyhow::anyhow!("cannot start a thread for {what}: {e}"))?;
    loop {
        if let Some(stop) = requested() {
            return Err(Stopped(stop).into());
        }
        match receiver.recv_timeout(SIGNAL_CHECK) {
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(panic)) => anyhow::bail!(
                "sqlfeed panicked in {what}: {}. This is a bug; please report it",
                crate::exec::panic_message(&panic)
            ),
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                anyhow::bail!("the thread of {what} ended without an answer")
            }
        }
    }
}

/// The error a command returns when it stopped because of a signal, so that
/// `main` prints [`Stop::message`] and exits with [`Stop::exit_code`].
#[derive(Debug)]
pub(crate) struct Stopped(pub(crate) Stop);

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.message())
    }
}

impl std::error::Error for Stopped {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(Stop::Interrupt.exit_code(), 130);
        assert_eq!(Stop::Terminate.exit_code(), 143);
        for stop in [Stop::Interrupt, Stop::Terminate] {
            assert_eq!(Stop::from_number(stop.number()), Some(stop));
        }
        assert_eq!(Stop::from_number(0), None);
        assert!(Stop::Terminate.message().contains("SIGTERM"));
    }
}
