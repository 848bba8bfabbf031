//! sqlfeed: a training input pipeline written as SQL over Parquet.
//!
//! An ML engineer writes the pipeline as SQL (`SELECT … FROM 'data/*.parquet'`)
//! plus Rust UDFs; sqlfeed runs it on embedded DataFusion or an Apache Ballista
//! cluster and streams the result into training.
//!
//! | module      | what it holds                                                  |
//! |-------------|----------------------------------------------------------------|
//! | [`config`]  | sqlfeed's settings (`SET sqlfeed.…`) and the deterministic execution settings |
//! | [`session`] | the DataFusion context: memory budget, spill, object stores, UDFs |
//! | [`sql`]     | our dialect on DataFusion's parser: `SUMMARIZE`, `SAMPLE`, `SHUFFLE`, … |
//! | [`shuffle`] | the seeded global shuffle and the local shuffle buffer          |
//! | [`feed`]    | training feeds: exact batches, shards, epochs, resume, prefetch |
//! | [`device`]  | tensors, the slot ring, CPU and CUDA backends, DLPack (all `unsafe`) |
//! | [`datagen`] | the deterministic synthetic training set of `sqlfeed gen`      |
//! | [`cache`]   | the epoch cache: `CACHE TABLE`, cached feeds                   |
//! | [`cluster`] | Ballista scheduler, executor, codecs and the cluster client     |
//! | [`cli`]     | the `sqlfeed` command line and REPL                            |

#![deny(clippy::clone_on_ref_ptr)]
// `unsafe` is confined to `device` by the compiler: that module alone
// allows it (see its docs), every other one is refused at build time.
#![deny(unsafe_code)]

pub mod cache;
pub mod cli;
#[cfg(feature = "ballista")]
pub mod cluster;
pub mod config;
pub mod datagen;
pub mod device;
mod exec;
pub mod feed;
pub mod rand;
pub mod session;
pub mod shuffle;
pub mod sql;
#[cfg(test)]
mod test_util;

pub use session::{Session, SessionBuilder};
