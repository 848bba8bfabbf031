//! The cache folder on disk: creating, sizing and removing entries,
//! least-recently-used eviction, and the times these decisions read.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;

use super::entry;

/// Removes an entry: renamed out of `entries/` into `tmp` first, so no
/// reader ever sees half of it. Returns the bytes freed.
pub(super) fn remove_entry_dir(tmp: &Path, dir: &Path) -> u64 {
    let bytes = dir_bytes(dir);
    let trash = tmp.join(format!("removed-{}-{}", std::process::id(), unix_now_ns()));
    let removed = create_dir(tmp).is_ok() && std::fs::rename(dir, &trash).is_ok();
    let target = if removed { trash.as_path() } else { dir };
    match std::fs::remove_dir_all(target) {
        Ok(()) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => {
            log::warn!("cannot remove cache entry {}: {e}", dir.display());
            0
        }
    }
}

/// Removes the least recently used entries of `entries` (into `tmp`) until
/// they fit `max_bytes`, sparing `keep`.
pub(super) fn evict(entries_dir: &Path, tmp: &Path, max_bytes: u64, keep: Option<&str>) {
    let Ok(read) = std::fs::read_dir(entries_dir) else {
        return;
    };
    let mut entries: Vec<(u64, u64, PathBuf)> = read
        .flatten()
        .map(|item| {
            let dir = item.path();
            (
                modified_unix_ns(&dir.join(entry::MANIFEST)),
                dir_bytes(&dir),
                dir,
            )
        })
        .collect();
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    entries.sort();
    for (_, bytes, dir) in entries {
        if total <= max_bytes {
            break;
        }
        if keep.is_some_and(|k| dir.file_name().is_some_and(|n| n == k)) {
            continue;
        }
        log::info!("cache over its size limit: removing {}", dir.display());
        remove_entry_dir(tmp, &dir);
        total = total.saturating_sub(bytes);
    }
    if total > max_bytes {
        log::warn!(
            "the cache holds {total} bytes, over its limit of {max_bytes} bytes: the \
             newest entry alone is larger; raise --cache-max-size"
        );
    }
}

pub(super) fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| {
        exec_datafusion_err!(
            "cannot create cache directory '{}': {e}. Set --cache-dir \
             (SessionBuilder::cache_dir) to a writable folder",
            dir.display()
        )
    })
}

/// Marks an entry as used now (its manifest's mtime).
pub(super) fn touch(dir: &Path) {
    if let Ok(file) = std::fs::File::options()
        .append(true)
        .open(dir.join(entry::MANIFEST))
    {
        let _ = file.set_modified(SystemTime::now());
    }
}

pub(super) fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|read| {
            read.flatten()
                .filter_map(|item| item.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

pub(super) fn modified_unix_ns(path: &Path) -> u64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64)
}

pub(super) fn modified_unix(path: &Path) -> u64 {
    modified_unix_ns(path) / 1_000_000_000
}

pub(super) fn unix_now() -> u64 {
    unix_now_ns() / 1_000_000_000
}

pub(super) fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
