//! sqlfeed's integration tests, in one binary so that DataFusion is linked once.
//!
//! * `local_sql`: queries over local Parquet (globs, folders, hive partitions),
//!   SUMMARIZE and SAMPLE against hand-computed values, the memory limit.
//! * `bad_input`: every bad input of the foundation issue names what is wrong.
//! * `cache`: CACHE TABLE, reuse across sessions and processes, invalidation,
//!   damaged entries, the LRU limit, cached feeds.
//! * `examples`: every example and every `examples/sql` script on small data.
//! * `cluster`: a real Ballista cluster (scheduler + executors as processes):
//!   results, SHUFFLE order and errors equal the embedded engine's; faults.
//! * `cli`: the binary through `-c`, `-f`, formats, exit codes, `gen`, `demo`.
//! * `contract`: the batch contract: held batches, a machine-independent
//!   unshuffled order, per-epoch augmentations.
//! * `elastic`: checkpoints resumed under another world size and batch size
//!   (every row of the epoch once), skipped steps.
//! * `feed`: training feeds: exact batches, shards, resume across processes,
//!   tensor values, cancellation, bad input.
//! * `http`: plain `http://` URLs refused by default, read with
//!   `--allow-http` / `SQLFEED_ALLOW_HTTP` / `allow_http` from a ranged-GET
//!   server on 127.0.0.1.
//! * `pack`: sequence packing: every token once, equal steps and balanced
//!   attention cost across ranks, the same batches on any partition count,
//!   resume.
//! * `plugins`: Rust function plugins (`--load`, `CREATE FUNCTION … LANGUAGE
//!   rust`, feeds, bad libraries, a cluster's `--plugin-dir`).
//! * `provenance`: `explain_batch` / `--explain` name the file, row group and
//!   row of every row of a batch: the rows the feed hands over there.
//! * `repl`: the interactive shell through a pseudo-terminal.
//! * `s3`: object-store queries against a real S3-compatible server (moto) on
//!   127.0.0.1; skipped unless `moto_server` is on PATH, required when
//!   `SQLFEED_TEST_S3=require` (as in `.ci/run`).
//! * `signals`: SIGINT / SIGTERM to a spilling feed or query: cancelled,
//!   its spill folder and cache parts removed, one line, exit 130 / 143.
//! * `spill`: what a killed process spilled is removed by the next session.
//! * `windowed_shuffle`: `SHUFFLE WINDOW`: every row once, an order that
//!   ignores partitions, whole row groups per window, the first batch before
//!   later windows start, exact resume, refusals.
//! * `timeline`: a feed's timeline names the right bottleneck; the CLI's page
//!   renders in headless Chromium.

mod azure;
mod bad_input;
mod cache;
mod cli;
#[cfg(feature = "ballista")]
mod cluster;
mod common;
mod contract;
#[cfg(feature = "delta")]
mod delta;
mod elastic;
mod examples;
mod feed;
mod function_docs;
mod globs;
mod http;
mod local_sql;
mod mix;
mod pack;
mod plugins;
mod position_shuffle;
mod provenance;
mod quarantine;
mod repl;
mod s3;
mod shuffle;
mod signals;
mod spill;
mod timeline;
mod verify;
mod windowed_shuffle;
