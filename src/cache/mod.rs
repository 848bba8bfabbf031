//! The epoch cache: a query's result materialised once, memory first and on
//! disk always, and reused by later queries, by every epoch of a feed and by
//! later runs.
//!
//! ```text
//!  CACHE TABLE t AS <query>            Feed::builder(…).cache(true)
//!              │                                  │
//!              ▼                                  ▼
//!   key = hash(build, plan, input files, assets)  ── see [`key`] ──────────
//!              │
//!   entries/<key>/ valid? ──yes──▶ open, verify checksums ─────┐
//!              │ no (or damaged: warn, remove)                 │
//!              ▼                                               │
//!   run the query, partitions in parallel; each batch is       │
//!   written to tmp/<key>…/part-p.arrow and, while the cache's  │
//!   memory share lasts, also kept in memory                    │
//!              │ manifest.json last, then rename into entries/ │
//!              ▼                                               ▼
//!        CachedTable (TableProvider) ── CacheScanExec: memory prefix, then pread
//! ```
//!
//! # Memory
//! Cached batches kept in memory are reserved from the session's one memory
//! pool, and all cached tables of a session together keep at most
//! [`CacheOptions::memory_fraction`] of the memory limit (default half), so
//! queries over the cache (a feed's shuffle) keep the rest. Everything beyond
//! is read back from the part files, which are plain uncompressed Arrow IPC:
//! reading them is a `pread` per batch, no decoding of images or text again.
//!
//! # Persistence and invalidation
//! Entries whose data is a pure function of files (see [`key`]) are shared
//! across runs and processes through `<cache dir>/entries/<key>`: a changed
//! query, input file, file a function reads (a `tokenizer.json`) or sqlfeed
//! build has another key, so stale data is never found. The
//! others live in a per-session folder removed with the session. A size limit
//! ([`CacheOptions::max_bytes`]) removes the least recently used entries
//! after each write; an entry's last use is its manifest's mtime.
//!
//! # Failure
//! A damaged entry (checksum mismatch, missing part, unreadable manifest) is
//! reported as a warning naming the file, removed and recomputed: never
//! served. Two processes filling the same entry both compute it; the first
//! to rename its folder into place wins and the other uses the winner's.
//! A failed or cancelled fill removes its temporary folder. Fills and
//! session folders are locked while in use (see
//! `liveness.rs`); a process that finds one whose lock is
//! free removes it, as its owner was killed. Liveness is never judged by the
//! process id in the name: in another container that id means nothing.
//!
//! # Blocking I/O
//! Reading assets for the key, opening and verifying entries, writing parts
//! and manifests and evicting run on Tokio's blocking pool (see `entry.rs`),
//! so a slow disk never stalls the async workers that decode partitions.

pub mod compact;
mod disk;
mod entry;
mod exec;
mod fill;
mod identity;
pub mod key;
pub(crate) mod liveness;
pub mod shared;
mod store;
mod tee;

use std::path::PathBuf;

pub use entry::{Manifest, PartManifest};
pub use exec::{CacheScanExec, CachedTable, Origin};
pub use fill::EntryFill;
pub use key::{AssetFile, BUILD_ID, CacheKey, InputFile};
pub use store::{CacheLookup, CacheStore, EntryInfo};
pub use tee::CacheFillExec;

/// Default size limit of a cache directory.
pub const DEFAULT_MAX_BYTES: u64 = 20 << 30;

/// Where and how much a session caches.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// The cache directory (entries are shared by every session using it).
    pub dir: PathBuf,
    /// Size limit of `dir/entries`: least recently used entries beyond it are
    /// removed after each write.
    pub max_bytes: u64,
    /// Share of the session's memory limit that cached batches may hold.
    pub memory_fraction: f64,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            dir: default_cache_dir(),
            max_bytes: DEFAULT_MAX_BYTES,
            memory_fraction: 0.5,
        }
    }
}

/// `$SQLFEED_CACHE_DIR`, else `$XDG_CACHE_HOME/sqlfeed`, else
/// `~/.cache/sqlfeed`, else `<temp dir>/sqlfeed-cache`.
pub fn default_cache_dir() -> PathBuf {
    let from_env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = from_env("SQLFEED_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = from_env("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("sqlfeed");
    }
    if let Some(home) = from_env("HOME") {
        return PathBuf::from(home).join(".cache").join("sqlfeed");
    }
    std::env::temp_dir().join("sqlfeed-cache")
}
