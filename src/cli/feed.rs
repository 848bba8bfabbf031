//! `sqlfeed feed`: runs a training feed against a simulated training step and
//! reports throughput, time to first batch and starvation.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use datafusion::error::DataFusionError;
use xxhash_rust::xxh3::Xxh3;

use super::progress::FeedProgress;
use crate::Session;
use crate::device::Device;
use crate::feed::{
    Checkpoint, ColumnSpec, Feed, FeedBuilder, FeedReport, LongDocuments, NextBatch,
    OnDataChange, OnError, PackOptions, QuarantineLimit,
};

/// Options of `sqlfeed feed`.
#[derive(Debug, Clone, clap::Args)]
pub struct FeedArgs {
    /// The feed's query (sqlfeed SQL); every column becomes a tensor.
    pub sql: String,
    /// Rows per batch.
    #[arg(long, default_value_t = 256)]
    pub batch_size: usize,
    /// Pack variable-size batches of at most this many padded tokens
    /// (instead of --batch-size rows).
    #[arg(long, value_name = "TOKENS")]
    pub batch_tokens: Option<usize>,
    /// Sort windows of this many steps by length to cut padding.
    #[arg(long, value_name = "STEPS")]
    pub bucket_by_length: Option<usize>,
    /// Pack the query's one token-id column (documents) into sequences of
    /// at most this many tokens, --batch-size sequences per rank: batches of
    /// input_ids, position_ids, labels and cu_seqlens (docs/packing.md).
    #[arg(long, value_name = "MAX_TOKENS")]
    pub pack: Option<usize>,
    /// Documents per packing window (with --pack).
    #[arg(long, value_name = "DOCUMENTS", default_value_t = PackOptions::DEFAULT_WINDOW)]
    pub pack_window: usize,
    /// Documents longer than --pack: split, truncate or fail.
    #[arg(long, value_name = "WHAT", default_value = "split", value_parser = parse_long_documents)]
    pub pack_long: LongDocuments,
    /// With --pack: one flat [T] stream per batch instead of [B, MAX_TOKENS].
    #[arg(long)]
    pub pack_flat: bool,
    /// Drop the last partial batch.
    #[arg(long)]
    pub drop_last: bool,
    /// Batches prepared ahead of the training step.
    #[arg(long, default_value_t = 16)]
    pub prefetch: usize,
    /// auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", value_parser = parsed::<Device>)]
    pub device: Device,
    /// Number of epochs.
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Globally shuffle every epoch with this seed.
    #[arg(long, value_name = "SEED")]
    pub shuffle_seed: Option<u64>,
    /// With --shuffle-seed: shuffle in windows of at least ROWS rows drawn
    /// from all over the data (SHUFFLE WINDOW), so the first batch and each
    /// epoch boundary wait for one window, not the epoch; rows of one
    /// Parquet row group land in one window. On a cluster: a job per window.
    #[arg(long, value_name = "ROWS", requires = "shuffle_seed")]
    pub shuffle_window: Option<u64>,
    /// With --shuffle-seed: an exact shuffle keyed by each row's Parquet
    /// file and row instead of its content (SHUFFLE BY POSITION): the first
    /// batch waits for the scan alone; the order follows the files' layout.
    #[arg(long, requires = "shuffle_seed", conflicts_with = "shuffle_window")]
    pub shuffle_by_position: bool,
    /// Without a shuffle: the partitions the query runs as, the same on
    /// every machine (the order depends on it, never on the core count).
    #[arg(long, value_name = "LANES")]
    pub order_lanes: Option<usize>,
    /// This process's data-parallel shard, as RANK/WORLD (e.g. 0/8).
    #[arg(long, value_name = "RANK/WORLD", value_parser = parse_shard)]
    pub shard: Option<(usize, usize)>,
    /// Materialise the query's result once in the epoch cache (--cache-dir)
    /// and read every epoch from it: decoding and preprocessing run once,
    /// the shuffle still differs per epoch. Later runs reuse the entry.
    #[arg(long)]
    pub cache: bool,
    /// With --cluster: the name the ranks of one training run share, so that
    /// each epoch runs as one cluster job that every rank reads its shard of
    /// (default: $SQLFEED_RUN_ID, else $TORCHELASTIC_RUN_ID, else empty).
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,
    /// Resume at EPOCH:STEP of a checkpoint of the same world size and
    /// batch size.
    #[arg(
        long,
        value_name = "EPOCH:STEP",
        conflicts_with = "resume_rows",
        value_parser = parse_resume
    )]
    pub resume: Option<(u64, u64)>,
    /// Resume EPOCH after ROWS rows of its order, consumed by all ranks
    /// together under any world size and batch size (the `resume_rows=`
    /// that --digest prints after each batch): elastic resume.
    #[arg(long, value_name = "EPOCH:ROWS", value_parser = parse_resume_rows)]
    pub resume_rows: Option<(u64, u64)>,
    /// Resume from a checkpoint file that --save-checkpoint (or Python's
    /// `json.dump(feed.state_dict())`) wrote, under this run's shard and
    /// batch settings, which may differ from the checkpoint's. Another
    /// query or seed is refused.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["resume", "resume_rows"])]
    pub resume_from: Option<PathBuf>,
    /// With --resume-from, when the files the query reads changed since the
    /// checkpoint: `error` (refuse, naming the files), `restart_epoch`
    /// (start the checkpoint's epoch anew), `continue` (go on over added
    /// files: the rows not yet consumed plus the new ones).
    #[arg(
        long,
        value_name = "WHAT",
        requires = "resume_from",
        value_parser = parsed::<OnDataChange>
    )]
    pub on_data_change: Option<OnDataChange>,
    /// Write where the feed is to FILE (JSON, the format of Python's
    /// `state_dict()`) when the run stops — at the end, after
    /// --max-batches, on Ctrl-C or SIGTERM — and every --checkpoint-every
    /// batches; written whole or not at all.
    #[arg(long, value_name = "FILE")]
    pub save_checkpoint: Option<PathBuf>,
    /// With --save-checkpoint, also write it every N batches.
    #[arg(long, value_name = "N", requires = "save_checkpoint")]
    pub checkpoint_every: Option<u64>,
    /// Leave out global steps S1,S2,… of EPOCH (a loss spike's batches);
    /// every other batch stays where it was. Repeatable.
    #[arg(long, value_name = "EPOCH:S1,S2,…", value_parser = parse_steps)]
    pub skip_steps: Vec<(u64, Vec<u64>)>,
    /// Print where each row of the batch at EPOCH:STEP (of RANK, default
    /// this --shard's) came from — its Parquet file, row group and row —
    /// without running the query's preprocessing, instead of running the
    /// feed.
    #[arg(long, value_name = "EPOCH:STEP[:RANK]", value_parser = parse_position)]
    pub explain: Option<(u64, u64, Option<usize>)>,
    /// Print rows FIRST, FIRST+1, … (COUNT of them, default 1) of EPOCH's
    /// order — before ranks and batches — as a table, instead of running
    /// the feed; each costs reading its window (--shuffle-window) or its
    /// row group (--shuffle-by-position).
    #[arg(
        long = "rows",
        value_name = "EPOCH:FIRST[:COUNT]",
        value_parser = parse_rows,
        conflicts_with = "explain"
    )]
    pub rows: Option<(u64, u64, u64)>,
    /// Simulated training step: sleep this long after each batch.
    #[arg(long, default_value_t = 0.0, value_name = "MS", value_parser = parse_step_ms)]
    pub step_ms: f64,
    /// How a column becomes a tensor: NAME:dtype=float32,shape=3x32x32,
    /// scale=1/255,offset=0,pad_to=128,pad_value=0,fill_null=0; timestamps,
    /// dates and durations also unit=s|ms|us|ns (e.g. t:dtype=float64,unit=s
    /// for epoch seconds with the fraction). Repeatable.
    #[arg(long = "tensor", value_name = "SPEC", value_parser = parse_tensor)]
    pub tensors: Vec<(String, ColumnSpec)>,
    /// Stop after this many batches.
    #[arg(long, value_name = "N")]
    pub max_batches: Option<u64>,
    /// Print one line per batch: epoch, step, rows and a hash of every
    /// tensor's bytes (to compare runs, ranks and resumes).
    #[arg(long)]
    pub digest: bool,
    /// Print each epoch's plan with its metrics, then the verdict on what
    /// bounds the feed (see --timeline).
    #[arg(long)]
    pub explain_analyze: bool,
    /// Write where the feed's time went to PATH: one self-contained HTML
    /// page (busy cores per stage, the loop's wait, rows/s, the prefetch
    /// ring, memory over time) with a one-line verdict on what bounds the
    /// feed, which is also printed.
    #[arg(long, value_name = "PATH")]
    pub timeline: Option<PathBuf>,
    /// Keep the feed's running totals (rows, batches, bytes, seconds run and
    /// waited, epoch and step, labelled rank and world) in FILE in
    /// Prometheus' text format, for node_exporter's textfile collector:
    /// replaced whole every --prometheus-every seconds and at the end.
    #[arg(long, value_name = "FILE")]
    pub prometheus: Option<PathBuf>,
    /// With --prometheus, how often the file is written.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 15.0,
        requires = "prometheus",
        value_parser = parse_interval
    )]
    pub prometheus_every: f64,
    /// With --prometheus, a label every sample carries (e.g. job=pretrain).
    /// Repeatable.
    #[arg(long, value_name = "NAME=VALUE", requires = "prometheus", value_parser = parse_label)]
    pub prometheus_label: Vec<(String, String)>,
    /// End with `RESULT {json}` (the line ../shared/bench/peers.py reads).
    #[arg(long)]
    pub result_json: bool,
    /// What a row whose functions fail (a truncated image, a function
    /// raising on it) does: `fail` stops the feed naming it; `quarantine`
    /// leaves it out, records it and fills its slot with the row before it
    /// in the epoch's order, so that every rank keeps its step count and
    /// every other row its place, on any world size and on a cluster (not
    /// with --cache yet).
    #[arg(long, value_name = "WHAT", value_enum, default_value_t = OnErrorArg::Fail)]
    pub on_error: OnErrorArg,
    /// With --on-error quarantine: the rows an epoch may quarantine before
    /// the feed fails, a count (100), a percentage (0.5%) or a fraction
    /// (0.005) of the rows of its order read so far, counting at least
    /// 10,000 rows [default: 1%].
    #[arg(long, value_name = "LIMIT", value_parser = parse_max_quarantined)]
    pub max_quarantined: Option<QuarantineLimit>,
    /// With --on-error quarantine: write the quarantined rows (epoch,
    /// position in the order, function, column, error, file, row group,
    /// row) to this Parquet file when the run stops, also on an error or a
    /// signal.
    #[arg(long, value_name = "FILE")]
    pub quarantine_out: Option<PathBuf>,
}

/// `--on-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnErrorArg {
    /// Stop the feed with an error naming the row.
    Fail,
    /// Leave the row out, record it and fill its slot.
    Quarantine,
}

/// `--pack-long`.
fn parse_long_documents(text: &str) -> Result<LongDocuments, String> {
    LongDocuments::parse(text).map_err(|e| e.message().into_owned())
}

/// `--max-quarantined`.
fn parse_max_quarantined(text: &str) -> Result<QuarantineLimit, String> {
    QuarantineLimit::parse(text).map_err(|e| e.message().into_owned())
}

// The value parsers of the options: each option is checked once, when the
// command line is parsed, and a bad value is a usage error naming it.

/// A value of one of sqlfeed's `FromStr` types; the error is its message,
/// without DataFusion's prefix ("Error during planning: ").
fn parsed<T: FromStr<Err = DataFusionError>>(text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|e: DataFusionError| e.message().into_owned())
}

fn parse_pair<T: FromStr>(
    text: &str,
    separator: char,
    what: &str,
) -> Result<(T, T), String> {
    text.split_once(separator)
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
        .ok_or_else(|| {
            format!("{what} '{text}' should look like A{separator}B, e.g. 1{separator}8")
        })
}

/// `RANK/WORLD` of `--shard`.
fn parse_shard(text: &str) -> Result<(usize, usize), String> {
    parse_pair(text, '/', "--shard")
}

/// `EPOCH:STEP` of `--resume`.
fn parse_resume(text: &str) -> Result<(u64, u64), String> {
    parse_pair(text, ':', "--resume")
}

/// `EPOCH:ROWS` of `--resume-rows`.
fn parse_resume_rows(text: &str) -> Result<(u64, u64), String> {
    parse_pair(text, ':', "--resume-rows")
}

/// `EPOCH:S1,S2,…` of `--skip-steps`.
fn parse_steps(text: &str) -> Result<(u64, Vec<u64>), String> {
    let parsed = text.split_once(':').and_then(|(epoch, steps)| {
        let steps: Option<Vec<u64>> =
            steps.split(',').map(|s| s.trim().parse().ok()).collect();
        Some((epoch.trim().parse().ok()?, steps?))
    });
    parsed.ok_or_else(|| {
        format!("--skip-steps '{text}' should look like EPOCH:S1,S2,…, e.g. 1:300,301")
    })
}

/// `EPOCH:STEP[:RANK]` of `--explain`.
fn parse_position(text: &str) -> Result<(u64, u64, Option<usize>), String> {
    let parts: Vec<&str> = text.split(':').map(str::trim).collect();
    let parsed = match parts.as_slice() {
        [epoch, step] => epoch
            .parse()
            .ok()
            .zip(step.parse().ok())
            .map(|(e, s)| (e, s, None)),
        [epoch, step, rank] => epoch
            .parse()
            .ok()
            .zip(step.parse().ok())
            .zip(rank.parse().ok())
            .map(|((e, s), r)| (e, s, Some(r))),
        _ => None,
    };
    parsed.ok_or_else(|| {
        format!("--explain '{text}' should look like EPOCH:STEP or EPOCH:STEP:RANK, e.g. 0:41:3")
    })
}

/// `EPOCH:FIRST[:COUNT]` of `--rows`.
fn parse_rows(text: &str) -> Result<(u64, u64, u64), String> {
    let parts: Vec<Option<u64>> =
        text.split(':').map(|p| p.trim().parse().ok()).collect();
    match parts.as_slice() {
        [Some(epoch), Some(first)] => Ok((*epoch, *first, 1)),
        [Some(epoch), Some(first), Some(count)] if *count >= 1 => {
            Ok((*epoch, *first, *count))
        }
        _ => Err(format!(
            "--rows '{text}' should look like EPOCH:FIRST or EPOCH:FIRST:COUNT (COUNT at \
             least 1), e.g. 0:1000:5"
        )),
    }
}

/// `NAME:dtype=…,shape=…` of `--tensor`.
fn parse_tensor(text: &str) -> Result<(String, ColumnSpec), String> {
    ColumnSpec::parse_named(text).map_err(|e| e.message().into_owned())
}

/// Milliseconds of `--step-ms`: a number, not negative.
fn parse_step_ms(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(ms) if ms >= 0.0 && ms.is_finite() => Ok(ms),
        _ => Err(format!(
            "--step-ms '{text}' must be a non-negative number of milliseconds"
        )),
    }
}

/// `SECONDS` of `--prometheus-every`: positive and finite.
fn parse_interval(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds.is_finite() => Ok(seconds),
        _ => Err(format!(
            "--prometheus-every '{text}' must be a positive number of seconds"
        )),
    }
}

/// `NAME=VALUE` of `--prometheus-label`, with a Prometheus label name.
fn parse_label(text: &str) -> Result<(String, String), String> {
    let (name, value) = text.split_once('=').ok_or_else(|| {
        format!(
            "--prometheus-label '{text}' should look like NAME=VALUE, e.g. job=pretrain"
        )
    })?;
    crate::feed::check_label_name(name).map_err(|e| e.message().into_owned())?;
    Ok((name.to_string(), value.to_string()))
}

/// One line per row of the explained batch, tab-separated under a header.
/// A reader that stops early (`--explain 0:2 | head`) is not an error, as
/// for query results.
/// `rows` as a table on stdout (`--rows`).
fn print_rows(rows: &datafusion::arrow::array::RecordBatch) -> anyhow::Result<()> {
    use super::print::{OutputFormat, ResultWriter};
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut writer = ResultWriter::new(OutputFormat::Table, &mut out, rows.schema(), 0)
        .with_max_width(OutputFormat::Table.fit_width());
    let written = writer
        .write(rows)
        .and_then(|()| writer.finish(rows.num_rows() as u64, None));
    match written {
        Err(DataFusionError::IoError(err))
            if err.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            Ok(())
        }
        done => Ok(done?),
    }
}

fn print_origins(origins: &crate::feed::BatchOrigins) -> anyhow::Result<()> {
    match write_origins(origins) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        done => Ok(done?),
    }
}

fn write_origins(origins: &crate::feed::BatchOrigins) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    eprintln!(
        "batch epoch={} step={} rank={}: {} rows",
        origins.epoch,
        origins.step,
        origins.rank,
        origins.rows.len()
    );
    writeln!(out, "position\tfile\trow_group\trow")?;
    for (position, row) in origins.rows.iter().enumerate() {
        writeln!(
            out,
            "{position}\t{}\t{}\t{}",
            row.file, row.row_group, row.row
        )?;
    }
    out.flush()?;
    Ok(())
}

/// Writes the feed's checkpoint to `path` through a temporary file renamed
/// over it, so that a run killed while writing leaves the previous one.
fn save_checkpoint(feed: &Feed, path: &Path) -> anyhow::Result<()> {
    let json = feed.checkpoint()?.to_json();
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".partial");
    let temporary = PathBuf::from(temporary);
    std::fs::write(&temporary, json.as_bytes())
        .and_then(|()| std::fs::rename(&temporary, path))
        .with_context(|| format!("cannot write the checkpoint {}", path.display()))
}

/// Writes the rows `feed` quarantined, their origins resolved with
/// `builder` (the feed's options), to the Parquet file `path`.
fn write_quarantine(
    builder: &FeedBuilder,
    feed: &Feed,
    path: &Path,
) -> anyhow::Result<()> {
    let rows = builder.quarantine_origins(feed.quarantined())?;
    let table = crate::feed::quarantine_table(&rows)?;
    let file = std::fs::File::create(path)
        .with_context(|| format!("cannot create --quarantine-out {}", path.display()))?;
    let mut writer =
        datafusion::parquet::arrow::ArrowWriter::try_new(file, table.schema(), None)?;
    writer.write(&table)?;
    writer.close()?;
    eprintln!("quarantined {} rows: {}", rows.len(), path.display());
    Ok(())
}

/// Runs the feed and prints its report.
pub fn run(
    session: &Session,
    args: &FeedArgs,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<()> {
    let mut builder = Feed::builder(session, args.sql.clone())
        .batch_size(args.batch_size)
        .drop_last(args.drop_last)
        .prefetch(args.prefetch)
        .epochs(args.epochs)
        .cache(args.cache)
        .run_id(
            args.run_id
                .clone()
                .or_else(|| std::env::var("SQLFEED_RUN_ID").ok())
                .or_else(|| std::env::var("TORCHELASTIC_RUN_ID").ok())
                .unwrap_or_default(),
        )
        .device(args.device)
        .given(args.shuffle_seed, FeedBuilder::shuffle)
        .given(args.shuffle_window, FeedBuilder::shuffle_window)
        .given(args.shuffle_by_position.then_some(()), |builder, ()| {
            builder.shuffle_by_position()
        })
        .given(args.batch_tokens, FeedBuilder::batch_tokens)
        .given(args.order_lanes, FeedBuilder::order_lanes)
        .given(args.bucket_by_length, FeedBuilder::bucket_by_length)
        .given(args.pack, |builder, max_tokens| {
            builder.pack(PackOptions {
                max_tokens,
                window: args.pack_window,
                long: args.pack_long,
                flat: args.pack_flat,
            })
        });
    let (rank, world) = args.shard.unwrap_or((0, 1));
    let chunk = (args.batch_size * world).max(1) as u64;
    builder = builder
        .shard(rank, world)
        .given(args.resume, |b, (epoch, step)| b.resume_at(epoch, step))
        .given(args.resume_rows, |b, (epoch, rows)| {
            b.resume_after_rows(epoch, rows, rows / chunk)
        });
    if let Some(path) = &args.resume_from {
        let bytes = std::fs::read(path).with_context(|| {
            format!(
                "cannot read the checkpoint --resume-from {}",
                path.display()
            )
        })?;
        // Bytes that are not text are not a checkpoint either: say that.
        let json = String::from_utf8_lossy(&bytes);
        let checkpoint = Checkpoint::from_json(&json, &path.display().to_string())?;
        let on_data_change = args.on_data_change.unwrap_or(OnDataChange::Error);
        builder = builder.resume_from(checkpoint, on_data_change);
    }
    for (epoch, steps) in &args.skip_steps {
        builder = builder.skip_steps(*epoch, steps.iter().copied());
    }
    for (name, spec) in &args.tensors {
        builder = builder.column(name.clone(), spec.clone());
    }
    match args.on_error {
        OnErrorArg::Fail => {
            if args.max_quarantined.is_some() || args.quarantine_out.is_some() {
                bail!(
                    "--max-quarantined and --quarantine-out need --on-error quarantine"
                );
            }
        }
        OnErrorArg::Quarantine => {
            builder = builder.on_error(OnError::Quarantine(
                args.max_quarantined.unwrap_or_default(),
            ));
        }
    }
    if let Some((epoch, step, explained_rank)) = args.explain {
        let explained = explained_rank.unwrap_or(rank);
        if explained >= world {
            bail!(
                "--explain rank {explained} is not a rank of --shard's world of {world}"
            );
        }
        // Explaining reads the epoch up to the batch (a whole shuffle):
        // waited for here, so that a signal ends it.
        let explained = super::signals::until_signalled("explain", move || {
            builder.shard(explained, world).explain_batch(epoch, step)
        })??;
        return print_origins(&explained);
    }
    if let Some((epoch, first, count)) = args.rows {
        // Reading rows reads their windows or row groups: waited for here,
        // so that a signal ends it.
        let rows = super::signals::until_signalled("rows", move || {
            let dataset = builder.dataset(epoch)?;
            let len = dataset.len()?;
            let end = first.saturating_add(count).min(len).max(first.min(len));
            if first >= len {
                return datafusion::common::plan_err!(
                    "--rows {epoch}:{first}: epoch {epoch} has {len} rows (positions \
                     0..{len})"
                );
            }
            dataset.rows(&(first..end).collect::<Vec<_>>())
        })??;
        return print_rows(&rows);
    }
    // Planning lists the files (a stalled object store can hold it).
    let options = builder.clone();
    let mut feed =
        super::signals::until_signalled("feed-planning", move || builder.build())??;
    let result = drive(&mut feed, args, runtime);
    if let Some(path) = &args.quarantine_out {
        // Also after an error or a signal: what was found is what to fix.
        let written = write_quarantine(&options, &feed, path);
        result?;
        written?;
        return Ok(());
    }
    result
}

/// Runs `feed` to its end (or --max-batches, or a signal) and prints its
/// report.
fn drive(
    feed: &mut Feed,
    args: &FeedArgs,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<()> {
    eprintln!("{}", feed.describe());

    let mut progress = std::io::stderr()
        .is_terminal()
        .then(|| FeedProgress::start(feed.length(), args.max_batches, runtime));
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let step = Duration::from_secs_f64(args.step_ms.max(0.0) / 1e3);
    let mut delivered = 0u64;
    let mut prometheus = args.prometheus.as_deref().map(|path| PrometheusFile {
        path,
        every: Duration::from_secs_f64(args.prometheus_every),
        labels: &args.prometheus_label,
        written: None,
    });
    while args.max_batches.is_none_or(|max| delivered < max) {
        if let Some(prometheus) = &mut prometheus {
            prometheus.write_if_due(feed)?;
        }
        if let Some(stop) = super::signals::requested() {
            if let Some(path) = &args.save_checkpoint {
                save_checkpoint(feed, path)?;
            }
            if let Some(prometheus) = &mut prometheus {
                prometheus.write(feed)?;
            }
            return Err(super::signals::Stopped(stop).into());
        }
        let batch = match feed.next_within(super::signals::SIGNAL_CHECK) {
            NextBatch::Ready(batch) => batch,
            NextBatch::Failed(err) => return Err(err.into()),
            NextBatch::Finished => break,
            NextBatch::Pending => continue,
        };
        if args.digest {
            let mut hash = Xxh3::new();
            for tensor in batch.tensors() {
                hash.update(tensor.name().as_bytes());
                for dim in tensor.shape() {
                    hash.update(&(*dim as u64).to_le_bytes());
                }
                hash.update(&tensor.to_host_bytes()?);
            }
            let (next_epoch, next_rows) = batch.next_row_position();
            writeln!(
                out,
                "batch epoch={} step={} rows={} digest={:016x} resume_rows={next_epoch}:{next_rows}",
                batch.epoch(),
                batch.step(),
                batch.rows(),
                hash.digest()
            )?;
        }
        if !step.is_zero() {
            std::thread::sleep(step);
        }
        drop(batch);
        delivered += 1;
        if let (Some(path), Some(every)) = (&args.save_checkpoint, args.checkpoint_every)
            && delivered.is_multiple_of(every.max(1))
        {
            save_checkpoint(feed, path)?;
        }
        if let Some(progress) = &mut progress {
            progress.update(delivered, || feed.report());
        }
    }
    if let Some(path) = &args.save_checkpoint {
        save_checkpoint(feed, path)?;
    }
    if let Some(prometheus) = &mut prometheus {
        prometheus.write(feed)?;
    }
    let report = feed.report();
    drop(progress);
    if args.explain_analyze {
        for (epoch, plan) in feed.epoch_plans() {
            writeln!(out, "epoch {epoch}:\n{plan}")?;
        }
        writeln!(out, "verdict: {}", feed.timeline().verdict())?;
    }
    if let Some(path) = &args.timeline {
        let verdict = feed.timeline().write_html(path)?;
        eprintln!("timeline: {} ({verdict})", path.display());
    }
    if delivered == 0 && args.max_batches != Some(0) {
        eprintln!(
            "the feed produced no batches (empty result, or fewer rows than one batch with --drop-last)"
        );
    }
    print_report(&report, args.step_ms);
    let epoch_seconds: Vec<f64> = feed.epoch_seconds().iter().map(|(_, s)| *s).collect();
    if epoch_seconds.len() > 1 {
        let times: Vec<String> = feed
            .epoch_seconds()
            .iter()
            .map(|(epoch, s)| format!("epoch {epoch} {s:.2}s"))
            .collect();
        eprintln!("{}", times.join(", "));
    }
    if args.result_json {
        writeln!(
            out,
            "RESULT {}",
            result_json(&report, args.step_ms, &epoch_seconds)
        )?;
    }
    out.flush()?;
    Ok(())
}

/// `--prometheus`: the file of running totals and when it was written.
struct PrometheusFile<'a> {
    path: &'a Path,
    every: Duration,
    labels: &'a [(String, String)],
    written: Option<Instant>,
}

impl PrometheusFile<'_> {
    /// Replaces the file with the feed's totals now.
    fn write(&mut self, feed: &Feed) -> anyhow::Result<()> {
        let text = feed.prometheus_text(self.labels)?;
        crate::feed::write_whole(self.path, &text).with_context(|| {
            format!("cannot write --prometheus {}", self.path.display())
        })?;
        self.written = Some(Instant::now());
        Ok(())
    }

    /// Writes the file when it never was, or --prometheus-every ago.
    fn write_if_due(&mut self, feed: &Feed) -> anyhow::Result<()> {
        if self.written.is_none_or(|at| at.elapsed() >= self.every) {
            self.write(feed)?;
        }
        Ok(())
    }
}

fn print_report(report: &FeedReport, step_ms: f64) {
    eprintln!(
        "{} batches, {} rows in {:.2}s: {:.0} rows/s, {:.1} batches/s, {:.1} MB/s of tensors",
        report.batches,
        report.rows,
        report.wall_s,
        report.rows_per_s(),
        report.batches_per_s(),
        report.bytes_per_s() / 1e6
    );
    let mut line = format!(
        "first batch after {:.3}s; consumer waited {:.1}% of the time ({:.1}% after the first batch)",
        report.ttfb_s.unwrap_or(f64::NAN),
        100.0 * report.wait_frac(),
        100.0 * report.wait_frac_steady()
    );
    if step_ms > 0.0 {
        line.push_str(&format!(" (step {step_ms} ms)"));
    } else {
        // Without a step the loop only takes batches: it always waits.
        line.push_str(
            " (no simulated step, so the loop always waits and the rate is the feed's \
             ceiling; --step-ms N simulates an N ms training step)",
        );
    }
    if report.h2d_s > 0.0 {
        line.push_str(&format!(
            "; H2D {:.3}s ({:.1} GB/s)",
            report.h2d_s,
            report.bytes as f64 / report.h2d_s / 1e9
        ));
    }
    if let Some(padding) = report.padding_frac {
        line.push_str(&format!("; padding {:.1}%", 100.0 * padding));
    }
    if let Some(imbalance) = report.pack_imbalance {
        line.push_str(&format!(
            "; worst step's rank attention cost {imbalance:.3}× the mean"
        ));
    }
    eprintln!("{line}");
}

fn result_json(report: &FeedReport, step_ms: f64, epoch_seconds: &[f64]) -> String {
    let number = |v: f64| {
        if v.is_finite() {
            format!("{v:.6}")
        } else {
            "null".into()
        }
    };
    let mut json = format!(
        "{{\"rows\": {}, \"batches\": {}, \"wall_s\": {}, \"ttfb_s\": {}, \"wait_frac\": {}, \
         \"wait_frac_steady\": {}, \"out_bytes\": {}, \"h2d_s\": {}, \"convert_s\": {}",
        report.rows,
        report.batches,
        number(report.wall_s),
        report.ttfb_s.map_or("null".into(), number),
        number(report.wait_frac()),
        number(report.wait_frac_steady()),
        report.bytes,
        number(report.h2d_s),
        number(report.convert_s),
    );
    if step_ms > 0.0 {
        json.push_str(&format!(", \"step_ms\": {}", number(step_ms)));
    }
    if let Some(padding) = report.padding_frac {
        json.push_str(&format!(", \"padding_frac\": {}", number(padding)));
    }
    if let Some(imbalance) = report.pack_imbalance {
        json.push_str(&format!(", \"pack_imbalance\": {}", number(imbalance)));
    }
    json.push_str(&format!(", \"prefetch\": {}", report.prefetch));
    let epochs: Vec<String> = epoch_seconds.iter().map(|s| number(*s)).collect();
    json.push_str(&format!(", \"epoch_s\": [{}]", epochs.join(", ")));
    json.push('}');
    json
}
