//! The `sqlfeed` command line: REPL, `-c`, `-f`, `gen` and `demo`.

// The command line's job is to print; the library modules log instead.
#![allow(clippy::print_stdout)]

mod command;
mod demo;
mod exec;
mod feed;
mod print;
mod progress;
mod repl;
mod signals;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

pub use command::Command;
pub use exec::{Executor, Flow, is_broken_pipe};
pub use print::OutputFormat;
pub use progress::ScanTotals;

use crate::datagen::{self, GenOptions};
use datafusion::common::runtime::SpawnedTask;
use datafusion::logical_expr::ScalarUDF;

use crate::session::{Session, SessionBuilder, parse_memory_size};

/// SQL over Parquet into training batches; with no arguments, an interactive
/// SQL shell.
#[derive(Debug, Parser)]
// The build id tells builds of one version apart (it is part of every cache
// key, see `cache::key`).
#[command(
    name = "sqlfeed",
    version = concat!(env!("CARGO_PKG_VERSION"), " (build ", env!("SQLFEED_BUILD_ID"), ")"),
    about,
    after_help = EXAMPLES
)]
pub struct Cli {
    /// What to run; nothing starts the REPL.
    #[command(subcommand)]
    pub command: Option<SubCommand>,
    /// Run these statements (or `\` commands) and exit. Repeatable.
    #[arg(short = 'c', long = "command", value_name = "SQL")]
    pub commands: Vec<String>,
    /// Run the statements of these files and exit. Repeatable.
    #[arg(short = 'f', long = "file", value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// Output format of results.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub format: OutputFormat,
    /// Memory for all operators of a query, e.g. 4G, 512M or 25% (default:
    /// half of physical RAM, or of the container's cgroup limit if lower).
    /// Beyond it, sorts and aggregations spill to disk.
    #[arg(long, value_parser = parse_memory_size, value_name = "SIZE")]
    pub memory_limit: Option<usize>,
    /// Where spill files go (default: the OS temp directory).
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
    /// Read plain http:// object-store URLs (and http:// endpoints of S3,
    /// GCS, Azure), which are refused otherwise: what travels unencrypted can
    /// be altered on the way. Also SQLFEED_ALLOW_HTTP=1.
    #[arg(long)]
    pub allow_http: bool,
    /// Directory of the epoch cache (CACHE TABLE, feed --cache), shared by
    /// every run that uses it (default: $SQLFEED_CACHE_DIR, else
    /// $XDG_CACHE_HOME/sqlfeed, else ~/.cache/sqlfeed).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Size limit of the cache directory, e.g. 50G; least recently used
    /// entries beyond it are removed (default 20G).
    #[arg(long, value_parser = parse_byte_size, value_name = "SIZE")]
    pub cache_max_size: Option<usize>,
    /// Largest image image_decode accepts, in pixels (default 67108864 =
    /// 8192x8192); larger headers are refused before any allocation.
    #[arg(long, value_name = "PIXELS")]
    pub max_image_pixels: Option<u64>,
    /// Load the functions of this plugin library (a cdylib built with
    /// sqlfeed-plugin; see examples/udf-plugin). Repeatable; also after a
    /// subcommand.
    #[arg(long = "load", value_name = "LIBRARY", global = true)]
    pub plugins: Vec<PathBuf>,
    /// Load every library in this folder as a plugin. Schedulers and
    /// executors load plugins only this way (or with --load): a client names
    /// functions, it never makes them load a path. Repeatable.
    #[arg(long = "plugin-dir", value_name = "DIR", global = true)]
    pub plugin_dirs: Vec<PathBuf>,
    /// Parallelism (default: number of cores).
    #[arg(long, value_name = "N")]
    pub target_partitions: Option<usize>,
    /// A session setting, as `SET KEY = VALUE` would (e.g.
    /// sqlfeed.late_materialization=false, or on a cluster
    /// ballista.shuffle.compression.codec=none, sent with every job).
    /// Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    pub settings: Vec<(String, String)>,
    /// Rows shown per table result; 0 shows all (default: 40 in the REPL, all
    /// with -c and -f).
    #[arg(long, value_name = "N")]
    pub max_rows: Option<usize>,
    /// Print the elapsed time after each table result (always on in the REPL).
    #[arg(long)]
    pub timing: bool,
    /// `--cluster`, `--executor-cache-dir`.
    #[cfg(feature = "ballista")]
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
}

const EXAMPLES: &str = "Examples:
  sqlfeed gen --rows 100000 --out data
  sqlfeed -c \"SUMMARIZE 'data/*.parquet'\"
  sqlfeed -c \"SAMPLE 'data/*.parquet' 5 SEED 42\" --format csv
  sqlfeed -c \"SELECT label, count(*) FROM 's3://bucket/train/*.parquet' GROUP BY label\"
  sqlfeed feed \"SELECT f0 AS x, label AS y FROM 'data/*.parquet'\" --shuffle-seed 42 --epochs 2
  sqlfeed scheduler --bind 127.0.0.1:50050 & sqlfeed executor --scheduler 127.0.0.1:50050 &
  sqlfeed --cluster df://127.0.0.1:50050 -c \"SELECT count(*) FROM 'data/*.parquet'\"
  sqlfeed --load target/release/libmy_udfs.so -c \"SELECT my_fn(x) FROM 'data/*.parquet'\"
  sqlfeed                       # interactive shell";

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum SubCommand {
    /// Write a deterministic synthetic training set as Parquet.
    Gen(GenArgs),
    /// Generate a small data set if missing and feed it to a simulated
    /// training loop as shuffled tensor batches.
    Demo(demo::DemoArgs),
    /// Run a training feed (SQL → exact, shuffled, sharded tensor batches)
    /// against a simulated training step and report throughput.
    Feed(Box<feed::FeedArgs>),
    /// Run a query and stream its whole result without printing it: a scan
    /// benchmark (rows/s, Arrow bytes, time to first batch).
    Scan(ScanArgs),
    /// Read every page of Parquet files (and decode image columns) before
    /// training on them; one row per file, exit status 1 if any is damaged.
    Verify(VerifyArgs),
    /// Measure raw pinned host-to-device copy bandwidth, the yardstick of a
    /// feed's H2D rate (needs a CUDA device).
    H2dBench(H2dArgs),
    /// `scheduler`, `executor`.
    #[cfg(feature = "ballista")]
    #[command(flatten)]
    Cluster(crate::cluster::ClusterCommand),
}

/// Options of `sqlfeed scan`.
#[derive(Debug, Clone, clap::Args)]
pub struct ScanArgs {
    /// The query (sqlfeed SQL).
    pub sql: String,
    /// End with `RESULT {json}` (the line ../shared/bench/peers.py reads).
    #[arg(long)]
    pub result_json: bool,
}

/// Options of `sqlfeed verify` (the `VERIFY` statement).
#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// A path, glob or URL of Parquet files, as in `FROM '…'`.
    pub path: String,
    /// Also decode every value of this image column (repeatable).
    #[arg(long, value_name = "COLUMN")]
    pub decode: Vec<String>,
}

/// Options of `sqlfeed h2d-bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct H2dArgs {
    /// The CUDA device.
    #[arg(long, default_value = "cuda:0")]
    pub device: String,
    /// Bytes of each copy of one round, comma-separated (default: the
    /// tensors of one W2 batch: x `[256, 32]` f32, y `[256]` i64, img `[256, 3, 32, 32]` f32).
    #[arg(long, value_delimiter = ',', default_value = "32768,2048,3145728")]
    pub sizes: Vec<usize>,
    /// Rounds.
    #[arg(long, default_value_t = 500)]
    pub iters: usize,
}

/// Options of `sqlfeed gen`.
#[derive(Debug, Clone, clap::Args)]
pub struct GenArgs {
    /// Total rows.
    #[arg(long)]
    pub rows: u64,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Number of files.
    #[arg(long, default_value_t = 4)]
    pub files: usize,
    /// Seed; the same seed gives byte-identical files.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Number of float32 feature columns f0, f1, ...
    #[arg(long, default_value_t = 8)]
    pub features: usize,
    /// Side of the square PNG/JPEG images in pixels.
    #[arg(long, default_value_t = 32)]
    pub image_size: u32,
}

/// Parses the arguments, runs, and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    init_process();
    let cli = Cli::parse();
    exit_code(run_catching(|| run(cli)))
}

/// `argv` (program name first) parsed as the binary parses its own, or
/// the text the binary would print for it (an error, or the help asked for).
pub fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<Cli, String> {
    Cli::try_parse_from(argv).map_err(|e| e.render().to_string())
}

/// Logging and the panic hook of a sqlfeed process: the binary's, and a
/// Python executor's (`python/sqlfeed/executor.py`).
pub fn init_process() {
    let _ = env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("warn"),
    )
    .format_timestamp(None)
    .try_init();
    // Panics inside the engine are caught at our boundary and reported as
    // errors; keep the default hook's backtrace text out of the user's way.
    std::panic::set_hook(Box::new(|info| log::debug!("caught panic: {info}")));
}

/// `command`'s outcome, a panic that escapes the engine's own catching
/// reported as an error.
fn run_catching(
    command: impl FnOnce() -> anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(command)).unwrap_or_else(
        |panic| {
            Err(anyhow::anyhow!(
                "sqlfeed panicked: {}. This is a bug; please report it",
                crate::exec::panic_message(&panic)
            ))
        },
    )
}

/// Runs `sqlfeed executor` in a Python process that hosts `functions` (the
/// Python functions of its `--function-dir` folders, see
/// `python/sqlfeed/executor.py`), with the exit code the binary would have.
pub fn run_python_executor(cli: Cli, functions: Vec<Arc<ScalarUDF>>) -> ExitCode {
    exit_code(run_catching(|| run_hosting(cli, Some(functions))))
}

/// The exit code of `outcome`, its error printed as the binary prints it.
fn exit_code(outcome: anyhow::Result<ExitCode>) -> ExitCode {
    match outcome {
        Ok(code) => code,
        Err(e) => {
            if let Some(df) = e.downcast_ref::<datafusion::error::DataFusionError>()
                && is_broken_pipe(df)
            {
                return ExitCode::SUCCESS;
            }
            eprintln!("Error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// `error` and its causes, each said once: a DataFusion error's message
/// already holds its source's, which anyhow's `{:#}` would repeat (a
/// missing column was named three times).
fn error_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let message = cause.to_string();
        if text.contains(message.as_str()) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    run_hosting(cli, None)
}

/// Runs the parsed command line; `hosted`: the Python functions this
/// process hosts when it is a Python executor.
fn run_hosting(
    cli: Cli,
    hosted: Option<Vec<Arc<ScalarUDF>>>,
) -> anyhow::Result<ExitCode> {
    #[cfg(not(feature = "ballista"))]
    if hosted.is_some() {
        anyhow::bail!(
            "this build of sqlfeed has no Ballista executor to host functions in"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // One decision per command. Commands other than the servers and the
    // REPL stop cleanly on SIGINT / SIGTERM (see signals.rs); the handlers
    // are installed before any work starts.
    match &cli.command {
        // The servers keep the signals' default action.
        #[cfg(feature = "ballista")]
        Some(SubCommand::Cluster(server)) => {
            if let Some((key, _)) = cli.settings.first() {
                anyhow::bail!(
                    "--set {key}=… applies to queries and feeds, not to a scheduler or an \
                     executor: a cluster's jobs carry the settings of the client that \
                     submits them"
                );
            }
            let python_host = hosted.is_some();
            let builder =
                session_builder(&cli).host_functions(hosted.unwrap_or_default());
            runtime.block_on(server.run(builder, cli.memory_limit, python_host))
        }
        Some(SubCommand::Feed(args)) => {
            let ended = feed_until_stopped(&runtime, &cli, args)?;
            report_end(runtime, ended)
        }
        Some(SubCommand::Gen(args)) => until_stopped(runtime, async { generate(args) }),
        Some(SubCommand::H2dBench(args)) => {
            until_stopped(runtime, async { h2d_bench(args) })
        }
        Some(SubCommand::Scan(args)) => until_stopped(runtime, async {
            scan(&client_builder(&cli).build()?, args).await?;
            Ok(ExitCode::SUCCESS)
        }),
        Some(SubCommand::Demo(args)) => until_stopped(runtime, async {
            demo::run(&mut executor(&cli)?, args).await?;
            Ok(ExitCode::SUCCESS)
        }),
        Some(SubCommand::Verify(args)) => {
            until_stopped(runtime, async { verify(&mut executor(&cli)?, args).await })
        }
        None if cli.is_interactive() => runtime.block_on(async {
            repl::run(&mut executor(&cli)?).await?;
            Ok(ExitCode::SUCCESS)
        }),
        None => until_stopped(runtime, statements(&cli)),
    }
}

/// Runs `command` until it ends or a signal stops it.
fn until_stopped(
    runtime: tokio::runtime::Runtime,
    command: impl std::future::Future<Output = anyhow::Result<ExitCode>>,
) -> anyhow::Result<ExitCode> {
    let ended = runtime.block_on(async {
        tokio::select! {
            outcome = command => outcome.map(Ended::Finished),
            // Dropping the command's future cancels its query, and
            // dropping its session removes the spill folder.
            signal = signals::watch() => signal
                .context("cannot install the SIGINT/SIGTERM handlers")
                .map(Ended::Stopped),
        }
    })?;
    report_end(runtime, ended)
}

/// Runs the feed until it ends or a signal stops it.
fn feed_until_stopped(
    runtime: &tokio::runtime::Runtime,
    cli: &Cli,
    args: &feed::FeedArgs,
) -> anyhow::Result<Ended> {
    let session = runtime.block_on(async { client_builder(cli).build() })?;
    let _watch = {
        let _context = runtime.enter();
        SpawnedTask::spawn(signals::watch())
    };
    // The loop blocks, so it runs here, outside the runtime: dropping the
    // feed then waits for its threads (and their cleanup).
    match feed::run(&session, args, runtime.handle()) {
        Ok(()) => Ok(Ended::Finished(ExitCode::SUCCESS)),
        Err(e) => match e.downcast_ref::<signals::Stopped>() {
            Some(signals::Stopped(stop)) => {
                // A planning or explaining call stopped midway still holds
                // a clone of the session, so dropping ours would not remove
                // the folder (see signals.rs).
                let _ = std::fs::remove_dir_all(session.spill_folder());
                Ok(Ended::Stopped(*stop))
            }
            None => Err(e),
        },
    }
}

/// The exit code of a command that `ended`; a stop is reported in one line.
fn report_end(
    runtime: tokio::runtime::Runtime,
    ended: Ended,
) -> anyhow::Result<ExitCode> {
    match ended {
        Ended::Finished(code) => Ok(code),
        Ended::Stopped(stop) => {
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            eprintln!("{}", stop.message());
            Ok(ExitCode::from(stop.exit_code()))
        }
    }
}

/// How a non-interactive command ended.
enum Ended {
    /// It ran to its end (successfully or not, by its exit code).
    Finished(ExitCode),
    /// A signal stopped it.
    Stopped(signals::Stop),
}

impl Cli {
    /// The REPL: no statements, files or subcommand.
    fn is_interactive(&self) -> bool {
        self.commands.is_empty() && self.files.is_empty() && self.command.is_none()
    }
}

/// The session options shared by every command.
fn session_builder(cli: &Cli) -> SessionBuilder {
    let mut builder = Session::builder()
        .given(cli.memory_limit, SessionBuilder::memory_limit)
        .given(cli.spill_dir.as_ref(), |b, dir| b.spill_dir(dir))
        // Unset, the session reads SQLFEED_ALLOW_HTTP.
        .given(cli.allow_http.then_some(true), SessionBuilder::allow_http)
        .given(cli.target_partitions, SessionBuilder::target_partitions)
        .given(cli.max_image_pixels, SessionBuilder::max_image_pixels)
        .given(cli.cache_dir.as_ref(), |b, dir| b.cache_dir(dir))
        .given(cli.cache_max_size, |b, bytes| {
            b.cache_max_bytes(bytes as u64)
        });
    for dir in &cli.plugin_dirs {
        builder = builder.plugin_dir(dir);
    }
    for library in &cli.plugins {
        builder = builder.load_plugin(library);
    }
    for (key, value) in &cli.settings {
        builder = builder.setting(key, value);
    }
    builder
}

/// `--set KEY=VALUE`.
fn parse_setting(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_string(), value.trim().to_string()))
        }
        _ => Err(format!(
            "expected KEY=VALUE, e.g. sqlfeed.late_materialization=false; got '{text}'"
        )),
    }
}

/// The session of a command that runs queries or feeds (not a server): with
/// the cluster options.
fn client_builder(cli: &Cli) -> SessionBuilder {
    let builder = session_builder(cli);
    #[cfg(feature = "ballista")]
    let builder = cli.cluster.install(builder);
    builder
}

/// `sqlfeed gen`.
fn generate(args: &GenArgs) -> anyhow::Result<ExitCode> {
    let options = GenOptions {
        rows: args.rows,
        out: args.out.clone(),
        files: args.files,
        seed: args.seed,
        features: args.features,
        image_size: args.image_size,
        row_group_rows: 8192,
    };
    let start = std::time::Instant::now();
    let summary = datagen::generate(&options)?;
    eprintln!(
        "wrote {summary} to {} in {:.2}s",
        args.out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// `sqlfeed h2d-bench`.
fn h2d_bench(args: &H2dArgs) -> anyhow::Result<ExitCode> {
    let device: crate::device::Device = args.device.parse()?;
    let rate = crate::device::raw_h2d_bytes_per_s(device, &args.sizes, args.iters)?;
    eprintln!(
        "raw pinned cuMemcpyHtoDAsync on {device}: {:.2} GB/s ({} rounds of {:?} bytes)",
        rate / 1e9,
        args.iters,
        args.sizes
    );
    println!("RESULT {{\"h2d_bytes_per_s\": {rate:.0}}}");
    Ok(ExitCode::SUCCESS)
}

/// The statement runner of the REPL, `-c`, `-f`, `demo` and `verify`.
fn executor(cli: &Cli) -> anyhow::Result<Executor> {
    let interactive = cli.is_interactive();
    Ok(Executor {
        session: client_builder(cli).build()?,
        format: cli.format,
        max_rows: cli.max_rows.unwrap_or(if interactive { 40 } else { 0 }),
        timing: cli.timing || interactive,
        progress: std::io::stderr().is_terminal(),
    })
}

/// `sqlfeed verify`: exit status 1 if any file is damaged.
async fn verify(exec: &mut Executor, args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let statement = crate::sql::Statement::Verify(crate::sql::VerifySpec {
        path: args.path.clone(),
        decode: args.decode.clone(),
    });
    let damaged = exec
        .run_statement_counting(statement, crate::sql::verify::damaged_files)
        .await?;
    if damaged > 0 {
        eprintln!(
            "sqlfeed verify: {damaged} damaged file{}",
            if damaged == 1 { "" } else { "s" }
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// `-c` statements, then `-f` files, until one says `\q`.
async fn statements(cli: &Cli) -> anyhow::Result<ExitCode> {
    let mut exec = executor(cli)?;
    for text in &cli.commands {
        if exec.run_text(text).await? == Flow::Quit {
            return Ok(ExitCode::SUCCESS);
        }
    }
    for path in &cli.files {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read SQL file '{}'", path.display()))?;
        if exec.run_text(&text).await? == Flow::Quit {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `sqlfeed scan`: streams the result, reading every buffer once (one byte
/// per cache line, as the peers of ../shared/bench do), and reports.
async fn scan(session: &Session, args: &ScanArgs) -> anyhow::Result<()> {
    use futures::StreamExt;
    let start = std::time::Instant::now();
    let df = session.sql(&args.sql).await?;
    let plan = df.create_physical_plan().await?;
    let mut stream = session.execute_stream(plan)?;
    let (mut rows, mut bytes, mut checksum) = (0u64, 0u64, 0u64);
    let mut first_batch = None;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        first_batch.get_or_insert_with(|| start.elapsed().as_secs_f64());
        rows += batch.num_rows() as u64;
        for column in batch.columns() {
            let (touched, sum) = touch(&column.to_data());
            bytes += touched;
            checksum = checksum.wrapping_add(sum);
        }
    }
    let wall = start.elapsed().as_secs_f64();
    eprintln!(
        "scanned {rows} rows, {:.1} MB of Arrow buffers in {wall:.2}s: {:.0} rows/s \
         (checksum {checksum:x})",
        bytes as f64 / 1e6,
        rows as f64 / wall.max(1e-9)
    );
    if args.result_json {
        println!(
            "RESULT {{\"rows\": {rows}, \"wall_s\": {wall:.6}, \"ttfb_s\": {}, \"out_bytes\": {bytes}}}",
            first_batch.map_or("null".to_string(), |s| format!("{s:.6}"))
        );
    }
    Ok(())
}

/// Bytes of `data`'s buffers (children included) and a sum of one byte per
/// 64, so that the scan cannot skip materialising them.
fn touch(data: &datafusion::arrow::array::ArrayData) -> (u64, u64) {
    let mut bytes = 0u64;
    let mut sum = 0u64;
    for buffer in data.buffers() {
        bytes += buffer.len() as u64;
        sum += buffer
            .as_slice()
            .iter()
            .step_by(64)
            .map(|b| *b as u64)
            .sum::<u64>();
    }
    for child in data.child_data() {
        let (b, s) = touch(child);
        bytes += b;
        sum = sum.wrapping_add(s);
    }
    (bytes, sum)
}

/// A byte size like `50G` or `512M` (no percentages: they mean RAM).
fn parse_byte_size(text: &str) -> std::result::Result<usize, String> {
    if text.trim().ends_with('%') {
        return Err(format!(
            "invalid size '{text}': give bytes with K, M, G or T, e.g. 50G"
        ));
    }
    parse_memory_size(text).map_err(|e| e.replace("memory size", "size"))
}
