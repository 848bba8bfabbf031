//! Folders whose owner's liveness is decided by a file lock, not by a
//! process id.
//!
//! sqlfeed keeps work in progress in folders that a killed process cannot
//! remove: cache fills (`<cache>/tmp/`), session-only cache entries
//! (`<cache>/sessions/`) and spill files (`<spill dir>/sqlfeed-spill-*`). The
//! next process sweeps what was left. Deciding "left" by whether
//! `/proc/<pid>` exists is wrong as soon as two pid namespaces (two
//! containers) share a folder: a pid of the other container is absent here,
//! so each deletes the other's live work.
//!
//! Here the owner holds an exclusive `flock` on the folder itself for as long
//! as it uses it. The kernel drops the lock when the process ends, however it
//! ends and in whatever namespace, so a sweeper that can take the lock knows
//! the owner is gone. The folder itself is the lock (no `.lock` file inside)
//! so that the folder's contents stay exactly what its user put there: spill
//! folders are checked to be empty after a query.
//!
//! ```text
//!  owner                                   sweeper (another process)
//!  mkdtemp parent/<prefix>XXXX
//!  open it, flock(LOCK_EX|LOCK_NB)  ──▶    open, flock(LOCK_EX|LOCK_NB)
//!  still there, same inode? else retry        WouldBlock: alive, skip
//!  … use it …                                 acquired: owner gone → remove
//!  drop: remove the folder, then unlock
//! ```
//!
//! # Races
//! A sweeper may take the lock of a folder created a moment ago, before its
//! creator locked it, and remove it. The creator therefore checks, once it
//! holds the lock, that the path still names the folder it opened, and
//! otherwise starts over with a new name. A sweeper likewise checks the
//! inode before removing, so a folder renamed away (a committed cache entry)
//! is never followed.
//!
//! # Filesystems without `flock`
//! Where the lock cannot be taken at all (some network filesystems refuse
//! `flock` on a directory), the owner logs a warning and works unlocked, and
//! sweepers keep every folder they cannot lock: nothing is removed wrongly,
//! but what a killed process left stays.

use std::fs::{File, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

/// Attempts to create a folder that no sweeper removes under us; a sweeper
/// wins a race only in a window of microseconds, so a few suffice.
const CREATE_ATTEMPTS: usize = 64;

/// A folder inside a parent, locked while this value lives and removed when
/// it is dropped (unless [`LiveFolder::keep`] was called).
#[derive(Debug)]
pub(crate) struct LiveFolder {
    /// The folder; `TempDir` removes it on drop. Declared before `lock` so
    /// that it is removed while the lock is still held: no sweeper races our
    /// own removal.
    dir: tempfile::TempDir,
    /// The open folder holding the exclusive lock; `None` where the
    /// filesystem refuses locks (see the module docs).
    _lock: Option<File>,
}

impl LiveFolder {
    /// Creates and locks `<parent>/<prefix>XXXXXX` (random suffix). The
    /// error says which parent could not be used.
    pub(crate) fn create(parent: &Path, prefix: &str) -> io::Result<Self> {
        for _ in 0..CREATE_ATTEMPTS {
            let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(parent)?;
            let lock = match File::open(dir.path()) {
                Ok(lock) => lock,
                // A sweeper in another process locked and removed it before
                // we could open it (seen with several ranks starting at
                // once): try a new name.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let _ = dir.keep();
                    continue;
                }
                Err(e) => return Err(e),
            };
            match lock.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    // A sweeper took it first and is removing it: leave it
                    // to that sweeper and try a new name.
                    let _ = dir.keep();
                    continue;
                }
                Err(TryLockError::Error(e)) => {
                    log::warn!(
                        "cannot lock {} ({e}): should this process be killed, later \
                         runs will not remove the folder; use a local filesystem",
                        dir.path().display()
                    );
                    return Ok(Self { dir, _lock: None });
                }
            }
            if same_folder(&lock, dir.path()) {
                return Ok(Self {
                    dir,
                    _lock: Some(lock),
                });
            }
            // Swept between mkdir and our lock: it is gone already.
            let _ = dir.keep();
        }
        Err(io::Error::other(format!(
            "cannot create a folder in '{}': each new folder was removed at once by \
             another process sweeping it",
            parent.display()
        )))
    }

    /// The folder.
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Gives up ownership: the folder is no longer removed on drop and its
    /// lock is released. For a folder that was renamed away (a committed
    /// cache entry) or that must outlive this process.
    pub(crate) fn keep(self) -> PathBuf {
        self.dir.keep()
    }
}

/// Removes the folders in `parent` whose name starts with `prefix` and whose
/// lock is free: their owner is gone. Live folders, files, symbolic links
/// and folders that cannot be locked are left alone. Returns how many
/// folders were removed.
pub(crate) fn sweep_abandoned(parent: &Path, prefix: &str) -> usize {
    let Ok(read) = std::fs::read_dir(parent) else {
        return 0;
    };
    let mut removed = 0;
    for item in read.flatten() {
        let is_dir = item.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || !item.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let path = item.path();
        let Ok(lock) = File::open(&path) else {
            continue;
        };
        // Held: the owner is alive. Error: cannot tell, so keep it.
        if lock.try_lock().is_err() || !same_folder(&lock, &path) {
            continue;
        }
        log::info!(
            "removing {}: the process that made it is gone",
            path.display()
        );
        match std::fs::remove_dir_all(&path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("cannot remove {}: {e}", path.display()),
        }
    }
    removed
}

/// Whether `path` (not followed if a link) is the folder `open` refers to.
#[cfg(unix)]
fn same_folder(open: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (open.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Whether `path` is the folder `open` refers to (no inode to compare: only
/// that it still exists).
#[cfg(not(unix))]
fn same_folder(_open: &File, path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(parent: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(parent)
            .map(|read| {
                read.flatten()
                    .map(|i| i.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn folders_made_while_others_sweep_are_never_lost() -> io::Result<()> {
        let parent = tempfile::tempdir()?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sweeper = {
            let (parent, stop) =
                (parent.path().to_path_buf(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    sweep_abandoned(&parent, "race-");
                }
            })
        };
        for _ in 0..200 {
            let folder = LiveFolder::create(parent.path(), "race-")?;
            assert!(folder.path().is_dir(), "a created folder survives sweeps");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = sweeper.join();
        Ok(())
    }

    #[test]
    fn a_held_folder_is_not_swept_even_by_its_own_process() -> io::Result<()> {
        let parent = tempfile::tempdir()?;
        let live = LiveFolder::create(parent.path(), "w-")?;
        std::fs::write(live.path().join("data"), b"in progress")?;
        // flock locks belong to open file descriptions, so the sweeper's own
        // open of the folder conflicts with ours as another process's would.
        assert_eq!(sweep_abandoned(parent.path(), "w-"), 0);
        assert!(live.path().join("data").exists());
        Ok(())
    }

    #[test]
    fn a_folder_whose_lock_is_free_is_swept() -> io::Result<()> {
        let parent = tempfile::tempdir()?;
        // What a killed owner leaves: the folder, its data, no lock holder.
        let left = parent.path().join("w-123-abc");
        std::fs::create_dir(&left)?;
        std::fs::write(left.join("data"), b"abandoned")?;
        let live = LiveFolder::create(parent.path(), "w-")?;
        assert_eq!(sweep_abandoned(parent.path(), "w-"), 1);
        assert!(!left.exists());
        assert!(live.path().exists());
        Ok(())
    }

    #[test]
    fn sweeping_spares_other_names_files_and_links() -> io::Result<()> {
        let parent = tempfile::tempdir()?;
        std::fs::create_dir(parent.path().join("other"))?;
        std::fs::write(parent.path().join("w-file"), b"")?;
        #[cfg(unix)]
        std::os::unix::fs::symlink(
            parent.path().join("other"),
            parent.path().join("w-link"),
        )?;
        assert_eq!(sweep_abandoned(parent.path(), "w-"), 0);
        assert!(parent.path().join("other").exists());
        assert!(parent.path().join("w-file").exists());
        Ok(())
    }

    #[test]
    fn dropping_removes_the_folder_and_keep_does_not() -> io::Result<()> {
        let parent = tempfile::tempdir()?;
        let dropped = LiveFolder::create(parent.path(), "w-")?;
        let dropped_path = dropped.path().to_path_buf();
        drop(dropped);
        assert!(!dropped_path.exists());
        let kept = LiveFolder::create(parent.path(), "w-")?.keep();
        assert!(kept.is_dir());
        // Kept folders are unlocked: the next sweep takes them.
        assert_eq!(sweep_abandoned(parent.path(), "w-"), 1);
        assert_eq!(names(parent.path()), Vec::<String>::new());
        Ok(())
    }

    #[test]
    fn a_path_that_now_names_another_folder_is_not_the_locked_one() -> io::Result<()> {
        let parent = tempfile::tempdir()?;
        let path = parent.path().join("w-1");
        std::fs::create_dir(&path)?;
        let open = File::open(&path)?;
        assert!(same_folder(&open, &path));
        // Renamed away (a committed cache entry) and the name reused: a
        // sweeper holding `open`'s lock must not remove the new folder.
        std::fs::rename(&path, parent.path().join("entry"))?;
        std::fs::create_dir(&path)?;
        assert!(!same_folder(&open, &path));
        Ok(())
    }
}
