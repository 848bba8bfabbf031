//! The cluster's part of the `sqlfeed` command line: the `--cluster` and
//! `--executor-cache-dir` options of every client command, and the
//! `scheduler` and `executor` servers. `crate::cli` flattens these in, so
//! the Ballista switch appears there only where it installs them.

// The servers print the line scripts and tests read the port from.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::process::ExitCode;

use crate::SessionBuilder;

/// The cluster options of every command that runs queries or feeds.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// Run queries and feeds on the Ballista cluster whose scheduler is at
    /// this address (df://host:port) instead of the embedded engine;
    /// `standalone` starts a scheduler and an executor in this process.
    #[arg(long, value_name = "df://HOST:PORT", env = "SQLFEED_CLUSTER")]
    pub cluster: Option<String>,
    /// With --cluster: a folder every executor and rank reaches (a shared
    /// file system) where a cached, shuffled feed's entry is written by the
    /// executors computing the first epoch and read by later epochs' jobs,
    /// instead of each rank's local cache.
    #[arg(long, value_name = "DIR", requires = "cluster")]
    pub executor_cache_dir: Option<PathBuf>,
}

impl ClusterArgs {
    /// `builder` running its queries on the cluster these options name.
    pub fn install(&self, mut builder: SessionBuilder) -> SessionBuilder {
        if let Some(url) = &self.cluster {
            builder = builder.cluster(url);
        }
        if let Some(dir) = &self.executor_cache_dir {
            builder = builder.executor_cache_dir(dir.display().to_string());
        }
        builder
    }
}

/// The cluster's servers.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Run a Ballista scheduler with sqlfeed's functions and operators.
    Scheduler(SchedulerArgs),
    /// Run a Ballista executor with sqlfeed's functions and operators.
    Executor(ExecutorArgs),
}

impl ClusterCommand {
    /// Serves until stopped, with sessions built like `builder`'s; an
    /// executor's memory budget is `memory_limit` (`--memory-limit`).
    /// `python_host`: this process is the Python executor that
    /// `--function-dir` starts, hosting the folders' functions (see
    /// [`python_executor`]).
    pub async fn run(
        &self,
        builder: SessionBuilder,
        memory_limit: Option<usize>,
        python_host: bool,
    ) -> anyhow::Result<ExitCode> {
        match self {
            Self::Scheduler(args) => scheduler(builder, args).await,
            Self::Executor(args) if !args.function_dirs.is_empty() && !python_host => {
                python_executor(args)
            }
            Self::Executor(args) => executor(builder, args, memory_limit).await,
        }
    }
}

/// Options of `sqlfeed scheduler`.
#[derive(Debug, Clone, clap::Args)]
pub struct SchedulerArgs {
    /// Address to listen on; port 0 picks a free port (printed at start).
    #[arg(long, default_value = "127.0.0.1:50050")]
    pub bind: std::net::SocketAddr,
    /// Allow binding to an address other than loopback (the scheduler has no
    /// authentication: anyone who reaches the port can run queries).
    #[arg(long)]
    pub allow_remote: bool,
    /// Host name executors and clients use for this scheduler (default: the
    /// bind address).
    #[arg(long, value_name = "HOST")]
    pub external_host: Option<String>,
    /// Seconds without a heartbeat after which an executor counts as lost
    /// and its tasks run elsewhere.
    #[arg(long, default_value_t = 20, value_name = "SECONDS")]
    pub executor_timeout: u64,
    /// Seconds a completed job's result stays on the executors' disks, for
    /// the ranks to read (its intermediate stages go at once). A windowed
    /// feed (--shuffle-window) runs a job per window: this bounds the disk
    /// to the windows of that many seconds. Longer than the slowest rank's
    /// lag behind the fastest.
    #[arg(long, default_value_t = super::DEFAULT_JOB_DATA_TTL_SECONDS, value_name = "SECONDS")]
    pub job_data_ttl: u64,
}

/// Options of `sqlfeed executor`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExecutorArgs {
    /// The scheduler to register with (HOST:PORT or df://HOST:PORT).
    #[arg(long, default_value = "127.0.0.1:50050")]
    pub scheduler: String,
    /// Address to serve shuffle files on (Arrow Flight); port 0 picks a
    /// free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: std::net::SocketAddr,
    /// gRPC port of the executor (0 picks a free port).
    #[arg(long, default_value_t = 0, value_name = "PORT")]
    pub grpc_port: u16,
    /// Allow binding to an address other than loopback.
    #[arg(long)]
    pub allow_remote: bool,
    /// Host name others fetch this executor's shuffle files from (default:
    /// the bind address).
    #[arg(long, value_name = "HOST")]
    pub external_host: Option<String>,
    /// Tasks run at once (default: the number of cores).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub concurrent_tasks: usize,
    /// Folder for shuffle files and spills (default: a temporary folder
    /// removed at exit).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Seconds between heartbeats to the scheduler.
    #[arg(long, default_value_t = 5, value_name = "SECONDS")]
    pub heartbeat_interval: u64,
    /// Host the Python functions (`sqlfeed.udf`, `sqlfeed.batch_udf`) of the
    /// modules in this folder, imported by name as clients import them, so
    /// that cluster queries calling them run here. Only this executor's
    /// folders are ever imported: a client names functions, it never sends
    /// code. Repeatable.
    #[arg(long = "function-dir", value_name = "DIR")]
    pub function_dirs: Vec<PathBuf>,
    /// With --function-dir: the Python interpreter that runs the executor
    /// and its functions (a virtual environment's, with the sqlfeed package
    /// and the functions' dependencies installed).
    #[arg(
        long,
        value_name = "PYTHON",
        default_value = "python3",
        requires = "function_dirs"
    )]
    pub python: PathBuf,
}

/// Becomes `sqlfeed executor` inside `args.python`: that interpreter runs
/// `sqlfeed.executor`, which imports the `--function-dir` folders' modules and
/// serves as an executor hosting their functions, with these same
/// arguments. The process is replaced (Unix), so signals sent to this one
/// reach the executor.
fn python_executor(args: &ExecutorArgs) -> anyhow::Result<ExitCode> {
    // A bootstrap that says what to do when the interpreter lacks the
    // package, instead of Python's bare "No module named sqlfeed".
    const BOOTSTRAP: &str = "import sys\n\
        try:\n    from sqlfeed.executor import main\n\
        except ImportError as e:\n    sys.exit(f'sqlfeed executor --python {sys.executable}: this \
        interpreter cannot import the sqlfeed package ({e}); install sqlfeed (the Python package, \
        the same version as this binary) into it, or pass --python the interpreter of the \
        environment that has it')\n\
        sys.exit(main(sys.argv[2:], expect_version=sys.argv[1]))";
    let mut command = std::process::Command::new(&args.python);
    command
        .arg("-c")
        .arg(BOOTSTRAP)
        .arg(env!("CARGO_PKG_VERSION"))
        .args(std::env::args_os().skip(1));
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt as _;
        let error = command.exec();
        anyhow::bail!(
            "cannot start the Python executor with '{}': {error}; pass --python the \
             interpreter of an environment with the sqlfeed package",
            args.python.display()
        )
    }
    #[cfg(not(unix))]
    {
        let status = command.status().map_err(|error| {
            anyhow::anyhow!(
                "cannot start the Python executor with '{}': {error}",
                args.python.display()
            )
        })?;
        Ok(if status.success() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }
}

/// Refuses a non-loopback address unless `allowed` (`--allow-remote`).
fn check_bind(
    what: &str,
    address: std::net::IpAddr,
    allowed: bool,
) -> anyhow::Result<()> {
    if address.is_loopback() || allowed {
        return Ok(());
    }
    anyhow::bail!(
        "the {what} would listen on {address}, which other machines can reach, and \
         Ballista has no authentication; pass --allow-remote to do it anyway, on a \
         trusted network"
    )
}

async fn scheduler(
    builder: SessionBuilder,
    args: &SchedulerArgs,
) -> anyhow::Result<ExitCode> {
    check_bind("scheduler", args.bind.ip(), args.allow_remote)?;
    let options = super::SchedulerOptions {
        bind: args.bind,
        external_host: args.external_host.clone(),
        executor_timeout_seconds: args.executor_timeout,
        job_data_ttl_seconds: args.job_data_ttl,
    };
    super::run_scheduler(builder, options, |address| {
        // Scripts and tests read the port from this line.
        println!(
            "sqlfeed scheduler listening on df://{address} (start executors with \
             `sqlfeed executor --scheduler {address}`)"
        );
        let _ = std::io::Write::flush(&mut std::io::stdout());
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

async fn executor(
    builder: SessionBuilder,
    args: &ExecutorArgs,
    memory_limit: Option<usize>,
) -> anyhow::Result<ExitCode> {
    check_bind("executor", args.bind.ip(), args.allow_remote)?;
    let scheduler = super::SchedulerAddress::parse(&args.scheduler)?;
    let mut options = super::ExecutorOptions::new(scheduler.clone());
    options.bind_host = args.bind.ip().to_string();
    options.flight_port = args.bind.port();
    options.grpc_port = args.grpc_port;
    options.external_host = args.external_host.clone();
    options.concurrent_tasks = args.concurrent_tasks;
    options.work_dir = args.work_dir.clone();
    options.heartbeat_seconds = args.heartbeat_interval;
    options.memory_limit = memory_limit;
    super::run_executor(builder, options, |flight| {
        println!("sqlfeed executor serving {flight}, registering with {scheduler}");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}
