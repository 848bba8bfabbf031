//! Scale out on Apache Ballista: the same SQL on a cluster.
//!
//! ```text
//!  sqlfeed --cluster df://host:50050 -c "SELECT … SHUFFLE SEED 42"
//!    │  logical plan (+ ShuffleNode, sqlfeed functions: SqlfeedLogicalCodec)
//!    ▼
//!  sqlfeed scheduler ── plans with sqlfeed's planner (stage-shaped SHUFFLE),
//!    │                 cuts stages at exchanges, merges and coalesces
//!    │  physical stage plans (SqlfeedPhysicalCodec)
//!    ▼
//!  sqlfeed executor × N ── run tasks, write shuffle files in --work-dir,
//!    │                    serve them over Arrow Flight
//!    ▼
//!  client fetches the final stage's partitions from the executors
//! ```
//!
//! # Processes
//! `sqlfeed scheduler` ([`run_scheduler`]) and `sqlfeed executor`
//! ([`run_executor`]) are Ballista's scheduler and executor, used as
//! libraries, with sqlfeed's functions, codecs, object stores and query
//! planner registered; both bind to loopback unless told otherwise. A
//! session built with [`crate::SessionBuilder::cluster`] (`--cluster
//! df://host:port` on the command line) plans locally and runs remotely;
//! the embedded engine stays the default.
//!
//! # SHUFFLE on a cluster
//! The scheduler plans a global shuffle with
//! [`crate::shuffle::plan_sorted_shuffle`]: every executor keys and sorts its
//! partitions (a stage writing sorted shuffle files), and the final stage
//! merges the sorted files by key. The key is a function of the row's
//! content, seed and epoch only, so the order is the embedded engine's on
//! any number of executors and partitions.
//!
//! # Failures
//! A lost executor is noticed by its missed heartbeats (`--heartbeat-interval`
//! on executors, `--executor-timeout` on the scheduler); Ballista then
//! re-runs the lost tasks, and the map stages whose shuffle files were on
//! it, on the remaining executors. Errors of tasks (bad files, bad SQL,
//! failing functions) are carried to the client with the executor's message.

mod balance;
mod cli;
mod client_counts;
mod codec;
mod declared;
mod executor;
mod retry;
mod scale_out;
mod scheduler;
mod shared_job;
mod standalone;
mod watch;
mod wire;

use std::fmt;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use ballista_core::extension::{SessionConfigExt, SessionStateExt};
use datafusion::common::{config_datafusion_err, exec_datafusion_err};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::ScalarUDF;

pub use balance::BalanceScanRows;
pub use cli::{ClusterArgs, ClusterCommand, ExecutorArgs, SchedulerArgs};
pub use codec::{FunctionRegistry, SqlfeedLogicalCodec, SqlfeedPhysicalCodec};
pub use declared::{DeclaredArgs, PythonDeclaration};
pub use executor::{ExecutorOptions, run_executor};
pub use retry::{AttemptFactory, ExactRetryExec, MAX_RETRIES};
pub use scheduler::{DEFAULT_JOB_DATA_TTL_SECONDS, SchedulerOptions, run_scheduler};
pub use shared_job::{CompletedJob, JobDeal, RunJob, SharedJobExec};
pub use standalone::Standalone;
pub use watch::{ExecutorLost, JobWatchExec, executors, is_executor_lost};
pub use wire::WireNode;

/// Port of a scheduler when the URL gives none (Ballista's default).
pub const DEFAULT_SCHEDULER_PORT: u16 = 50050;

/// How long a client waits for a scheduler's port to accept a connection.
const REACH_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a scheduler listens: `df://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerAddress {
    /// Host name or IP address.
    pub host: String,
    /// gRPC port.
    pub port: u16,
}

impl SchedulerAddress {
    /// Parses `df://host[:port]` or `host[:port]`.
    pub fn parse(url: &str) -> Result<Self> {
        let invalid = |why: &str| {
            config_datafusion_err!(
                "invalid scheduler address '{url}': {why}; expected df://host:port, \
                 e.g. df://127.0.0.1:{DEFAULT_SCHEDULER_PORT}"
            )
        };
        let rest = match url.split_once("://") {
            Some(("df", rest)) => rest,
            Some((scheme, _)) => {
                return Err(invalid(&format!("unknown scheme '{scheme}://'")));
            }
            None => url,
        };
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() {
            return Err(invalid("no host"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) => {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| invalid(&format!("'{port}' is not a port")))?;
                (host, port)
            }
            None => (rest, DEFAULT_SCHEDULER_PORT),
        };
        if host.is_empty() || host.contains('/') {
            return Err(invalid("no host"));
        }
        Ok(Self {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port,
        })
    }

    /// The URL Ballista's gRPC clients take.
    pub fn grpc_url(&self) -> String {
        if self.host.contains(':') {
            format!("http://[{}]:{}", self.host, self.port)
        } else {
            format!("http://{}:{}", self.host, self.port)
        }
    }

    /// Fails with an error naming the address unless a TCP connection to
    /// it opens within `timeout`.
    pub fn check_reachable(&self, timeout: Duration) -> Result<()> {
        let unreachable = |why: String| {
            exec_datafusion_err!(
                "cannot reach the sqlfeed scheduler at {self}: {why}. Start one with \
                 `sqlfeed scheduler --bind {}:{}` and at least one `sqlfeed executor \
                 --scheduler {}:{}`, or run without --cluster",
                self.host,
                self.port,
                self.host,
                self.port
            )
        };
        let addresses = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| unreachable(format!("cannot resolve '{}': {e}", self.host)))?;
        let mut last_error = None;
        for address in addresses {
            match TcpStream::connect_timeout(&address, timeout) {
                Ok(_) => return Ok(()),
                Err(e) => last_error = Some(e),
            }
        }
        Err(unreachable(match last_error {
            Some(e) => e.to_string(),
            None => format!("'{}' resolves to no address", self.host),
        }))
    }
}

impl fmt::Display for SchedulerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "df://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "df://{}:{}", self.host, self.port)
        }
    }
}

/// Turns an embedded session state into one whose queries run on the
/// scheduler at `url`: sqlfeed's codecs are registered and Ballista's query
/// planner installed. The caller registers `functions` again afterwards
/// (Ballista's upgrade resets the function list).
pub(crate) fn client_state(
    state: SessionState,
    url: &str,
    functions: Vec<Arc<ScalarUDF>>,
) -> Result<(SessionState, SchedulerAddress)> {
    let address = SchedulerAddress::parse(url)?;
    address.check_reachable(REACH_TIMEOUT)?;
    let registry = FunctionRegistry::new(functions);
    let mut config = with_codecs(state.config().clone(), &registry);
    // Shuffle files are not compressed (Ballista's default is LZ4): a
    // feed's exchanges carry what its row functions read, encoded images and
    // audio that LZ4 does not shrink, and its result narrow pixels that it
    // shrinks 1.4×. LZ4 was 13% of an executor's CPU on an image feed and
    // 20% of the client's (`perf`, docs/scaling.md), for bytes that travel
    // on loopback or a network far from full. Set here, on the client, as
    // the session's default: the client's settings travel with every job,
    // so `SET ballista.shuffle.compression.codec = 'lz4'` (or `--set`)
    // brings it back; set in `with_codecs`, the scheduler's sessions would
    // override the client's choice.
    if let Err(e) = config.options_mut().set(
        ballista_core::config::BALLISTA_SHUFFLE_COMPRESSION_CODEC,
        "none",
    ) {
        log::warn!("shuffle files stay compressed: {e}");
    }
    let state = SessionStateBuilder::new_from_existing(state)
        .with_config(config)
        .build()
        .upgrade_for_ballista(address.grpc_url())?;
    // A shuffle by position's filtered rows counted here, where every
    // function runs, rather than on the scheduler.
    let state = client_counts::CountingClientPlanner::install(state);
    Ok((state, address))
}

/// `config` with Ballista's settings as sqlfeed uses them, and sqlfeed's
/// codecs.
///
/// Ballista's adaptive planner is off: in Ballista 55 a job whose executor
/// is lost while a stage runs stays "Running" for ever under it (the lost
/// stage is rolled back but never resubmitted), while the static planner
/// re-runs the lost tasks and map stages on the remaining executors
/// (`tests/integration/cluster.rs` kills an executor mid-job).
pub(crate) fn with_codecs(
    config: datafusion::prelude::SessionConfig,
    functions: &FunctionRegistry,
) -> datafusion::prelude::SessionConfig {
    config
        .upgrade_for_ballista()
        .with_ballista_adaptive_query_planner(false)
        .with_ballista_logical_extension_codec(Arc::new(SqlfeedLogicalCodec::new(
            functions.clone(),
        )))
        .with_ballista_physical_extension_codec(Arc::new(SqlfeedPhysicalCodec::new(
            functions.clone(),
        )))
}

/// A free TCP port on `host`, for servers that must advertise their port
/// before binding it (Ballista's executor). Another process may take it in
/// between; binding then fails with an error naming the port.
pub(crate) fn free_port(host: &str) -> Result<u16> {
    let listener = std::net::TcpListener::bind((host, 0))
        .map_err(|e| exec_datafusion_err!("cannot find a free port on {host}: {e}"))?;
    Ok(listener
        .local_addr()
        .map_err(|e| exec_datafusion_err!("no local address: {e}"))?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_and_without_scheme() -> Result<()> {
        let a = SchedulerAddress::parse("df://10.0.0.5:6000")?;
        assert_eq!((a.host.as_str(), a.port), ("10.0.0.5", 6000));
        assert_eq!(a.to_string(), "df://10.0.0.5:6000");
        assert_eq!(a.grpc_url(), "http://10.0.0.5:6000");
        let b = SchedulerAddress::parse("localhost")?;
        assert_eq!(b.port, DEFAULT_SCHEDULER_PORT);
        let c = SchedulerAddress::parse("df://[::1]:7000")?;
        assert_eq!(c.grpc_url(), "http://[::1]:7000");
        Ok(())
    }

    #[test]
    fn bad_addresses_say_what_is_expected() {
        for bad in [
            "http://x:1",
            "df://",
            "df://host:notaport",
            "df://host:99999",
        ] {
            let err = SchedulerAddress::parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad) && err.contains("df://host:port"), "{err}");
        }
    }

    #[test]
    fn an_unreachable_scheduler_is_named_quickly() -> Result<()> {
        let port = free_port("127.0.0.1")?;
        let address = SchedulerAddress::parse(&format!("df://127.0.0.1:{port}"))?;
        let start = std::time::Instant::now();
        let err = address
            .check_reachable(Duration::from_secs(2))
            .unwrap_err()
            .to_string();
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(err.contains(&format!("df://127.0.0.1:{port}")), "{err}");
        assert!(err.contains("sqlfeed scheduler"), "{err}");
        Ok(())
    }
}
