//! `--cluster standalone`: a scheduler and executors in this process, on
//! loopback with free ports, for trying cluster execution (and testing it)
//! without starting anything. Queries still cross the wire: plans are
//! encoded, stages cut, shuffle files written and fetched over Arrow Flight.

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::common::exec_err;
use datafusion::common::{exec_datafusion_err, resources_datafusion_err};
use datafusion::error::Result;

use super::{
    ExecutorOptions, SchedulerAddress, SchedulerOptions, executors as registered,
    run_executor, run_scheduler,
};
use crate::SessionBuilder;

/// The in-process cluster; dropping the last handle stops it.
pub struct Standalone {
    runtime: Option<tokio::runtime::Runtime>,
    address: SchedulerAddress,
    /// The executors' work folders (removed after the runtime stops).
    work: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Standalone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Standalone")
            .field("address", &self.address)
            .finish()
    }
}

impl Standalone {
    /// Starts a scheduler and `executors` executors, each running `tasks`
    /// tasks at once (0 = one per core), built like sessions of `session`,
    /// and waits until all have registered.
    pub fn start(
        session: &SessionBuilder,
        executors: usize,
        tasks: usize,
    ) -> Result<Arc<Self>> {
        let wanted = executors.max(1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("sqlfeed-standalone")
            .enable_all()
            .build()
            .map_err(|e| {
                resources_datafusion_err!(
                    "cannot start the standalone cluster's threads: {e}"
                )
            })?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let scheduler_session = session.clone();
        let options = SchedulerOptions {
            bind: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            ..SchedulerOptions::default()
        };
        runtime.spawn(async move {
            let ready = ready_tx.clone();
            if let Err(e) = run_scheduler(scheduler_session, options, move |address| {
                let _ = ready.send(Ok(address));
            })
            .await
            {
                let _ = ready_tx.send(Err(e));
            }
        });
        let bound = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| {
                exec_datafusion_err!("the standalone scheduler did not start")
            })??;
        let address = SchedulerAddress {
            host: bound.ip().to_string(),
            port: bound.port(),
        };
        // The executors' work folders, owned here: the executors are tasks
        // of a runtime shut down in the background, which may outlive the
        // process's exit and so never drop folders of their own.
        let work = tempfile::Builder::new()
            .prefix("sqlfeed-standalone-")
            .tempdir()
            .map_err(|e| {
                exec_datafusion_err!(
                    "cannot create the standalone executors' work folder: {e}"
                )
            })?;
        for i in 0..wanted {
            let mut options = ExecutorOptions::new(address.clone());
            options.concurrent_tasks = tasks;
            options.work_dir = Some(work.path().join(format!("executor-{i}")));
            let executor_session = session.clone();
            runtime.spawn(async move {
                if let Err(e) = run_executor(executor_session, options, |_| {}).await {
                    log::error!("standalone executor: {e}");
                }
            });
        }
        // Wait on this runtime's threads: `start` may itself run inside an
        // async runtime, where blocking on a future is not allowed.
        let (registered_tx, registered_rx) = std::sync::mpsc::channel();
        let scheduler = address.clone();
        runtime.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if registered(&scheduler)
                    .await
                    .is_ok_and(|e| e.len() >= wanted)
                {
                    let _ = registered_tx.send(true);
                    return;
                }
                if Instant::now() > deadline {
                    let _ = registered_tx.send(false);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        if !registered_rx.recv().unwrap_or(false) {
            return exec_err!(
                "the standalone executors did not register with {address} within 30 s"
            );
        }
        Ok(Arc::new(Self {
            runtime: Some(runtime),
            address,
            work: Some(work),
        }))
    }

    /// Where its scheduler listens.
    pub fn address(&self) -> &SchedulerAddress {
        &self.address
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        // After the runtime: its tasks no longer start new work.
        drop(self.work.take());
    }
}
