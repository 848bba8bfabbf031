//! Scenario 5: distributed training shards. Four ranks, each its own
//! process (as torchrun starts them), consume their own shard of every
//! shuffled epoch: disjoint rows, the same number of batches on every rank.
//! With `--local-cluster` the same four ranks are served by a Ballista
//! cluster this example starts in-process (a scheduler and two executors on
//! 127.0.0.1): each epoch runs once as a cluster job that all ranks read,
//! and every rank gets exactly the batches it gets on the embedded engine.
//!
//! ```sh
//! cargo run --release --example distributed_shards -- [--data …] [--rows N]
//! cargo run --release --example distributed_shards -- --local-cluster
//! cargo run --release --example distributed_shards -- --cluster df://host:50050
//! ```

// Examples report on stdout.
#![allow(clippy::print_stdout)]

mod common;

use std::collections::HashSet;
use std::process::Command;

use datafusion::error::{DataFusionError, Result};
use sqlfeed::Session;
use sqlfeed::device::Device;
use sqlfeed::feed::Feed;

const WORLD: usize = 4;

fn main() -> Result<()> {
    let args = common::Args::from_env();
    if let Some(rank) = args.flag("--rank") {
        return run_rank(&args, &rank);
    }
    let data = args.data()?;
    // Keeps an in-process cluster alive until the ranks are done.
    let mut local_cluster = None;
    let cluster = match (args.flag("--cluster"), args.has("--local-cluster")) {
        (Some(url), _) => Some(url),
        (None, true) => {
            // A scheduler and two executors on 127.0.0.1 (free ports), on
            // threads of this process until it is dropped.
            let cluster = sqlfeed::cluster::Standalone::start(&Session::builder(), 2, 2)?;
            let url = cluster.address().to_string();
            local_cluster = Some(cluster);
            Some(url)
        }
        (None, false) => None,
    };
    println!(
        "{WORLD} ranks on {}",
        cluster.as_deref().unwrap_or("the embedded engine")
    );
    // One process per rank, all at once.
    let exe = std::env::current_exe()?;
    let children = (0..WORLD)
        .map(|rank| {
            let mut command = Command::new(&exe);
            command.args(["--rank", &rank.to_string(), "--data", &data]);
            if let Some(url) = &cluster {
                command.args(["--cluster", url]);
            }
            command.output()
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    drop(local_cluster);
    let mut shards = vec![];
    for (rank, output) in children.iter().enumerate() {
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(DataFusionError::Execution(format!(
                "rank {rank} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        // Each rank prints "rank R: B batches, ids …".
        let ids: Vec<i64> = stdout
            .lines()
            .find_map(|line| line.strip_prefix("ids "))
            .map(|ids| {
                ids.split_whitespace()
                    .filter_map(|i| i.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        print!(
            "{}",
            stdout
                .lines()
                .next()
                .map(|l| format!("{l}\n"))
                .unwrap_or_default()
        );
        shards.push(ids);
    }
    let all: Vec<i64> = shards.iter().flatten().copied().collect();
    let distinct: HashSet<i64> = all.iter().copied().collect();
    println!(
        "{} rows over {WORLD} ranks, {} distinct: shards are {}",
        all.len(),
        distinct.len(),
        if all.len() == distinct.len() {
            "disjoint"
        } else {
            "NOT disjoint"
        }
    );
    Ok(())
}

/// One rank: its shard of one shuffled epoch, batch counts and row ids.
fn run_rank(args: &common::Args, rank: &str) -> Result<()> {
    let rank: usize = rank
        .parse()
        .map_err(|_| DataFusionError::Plan(format!("bad rank '{rank}'")))?;
    let data = args.data()?;
    let mut builder = Session::builder();
    if let Some(url) = args.flag("--cluster") {
        builder = builder.cluster(url);
    }
    let session = builder.build()?;
    let feed = Feed::builder(
        &session,
        format!("SELECT id, f0 AS x, label AS y FROM '{data}'"),
    )
    .shuffle(42)
    .batch_size(64)
    .drop_last(true)
    .shard(rank, WORLD)
    .run_id("distributed_shards example")
    .device(Device::Cpu)
    .build()?;
    let mut batches = 0;
    let mut ids = vec![];
    for batch in feed {
        let batch = batch?;
        ids.extend_from_slice(batch.tensor("id")?.as_slice::<i64>()?);
        batches += 1;
    }
    let first: Vec<String> = ids.iter().take(4).map(i64::to_string).collect();
    println!(
        "rank {rank}: {batches} batches of 64, first ids {}",
        first.join(" ")
    );
    let all: Vec<String> = ids.iter().map(i64::to_string).collect();
    println!("ids {}", all.join(" "));
    Ok(())
}
