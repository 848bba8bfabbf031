//! The memory limit of this process's cgroup (a container's limit).
//!
//! The default memory budget is a share of the memory this process may use.
//! In a container that is the cgroup's limit, not the host's RAM that
//! `/proc/meminfo` shows: sized from RAM, the engine would never spill and
//! the kernel would kill it first.
//!
//! `/proc/self/cgroup` names the cgroup; the limit is a file under the
//! cgroup mount (`/sys/fs/cgroup`):
//!
//! ```text
//!  v2:  0::<path>              → <mount>/<path>/memory.max                 ("max" = none)
//!  v1:  N:…memory…:<path>      → <mount>/memory/<path>/memory.limit_in_bytes (huge = none)
//! ```
//!
//! A parent's limit applies to its children too, so every folder from the
//! cgroup's up to the mount is read and the lowest limit wins. Inside a
//! container the path is often `/`, or names a host path that its own mount
//! does not have; walking up then reaches the mount's root, which is the
//! container's own cgroup. Missing files and unreadable values are ignored:
//! the answer is then "no limit known", never an error.

use std::path::{Component, Path, PathBuf};

/// Where the cgroup filesystems are mounted.
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// Limits at or above this are "unlimited": cgroup v1 writes
/// `9223372036854771712` (`i64::MAX` rounded down to a page) for none.
const UNLIMITED: u64 = 1 << 60;

/// The memory limit of this process's cgroup in bytes, if it has one.
pub(crate) fn memory_limit() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    memory_limit_in(Path::new(CGROUP_MOUNT), &membership)
}

/// The lowest memory limit that applies to the cgroups named in
/// `membership` (the text of `/proc/self/cgroup`), reading the limit files
/// under `mount`; `None` when none is set or none can be read.
pub(crate) fn memory_limit_in(mount: &Path, membership: &str) -> Option<u64> {
    membership
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (id, controllers, path) =
                (fields.next()?, fields.next()?, fields.next()?);
            if id == "0" && controllers.is_empty() {
                lowest_limit(mount, path, "memory.max")
            } else if controllers.split(',').any(|c| c == "memory") {
                lowest_limit(&mount.join("memory"), path, "memory.limit_in_bytes")
            } else {
                None
            }
        })
        .min()
}

/// The lowest limit in `file` from `<root>/<path>` up to `root`.
fn lowest_limit(root: &Path, path: &str, file: &str) -> Option<u64> {
    // Only plain names: the path comes from a file, and `..` or a leading
    // `/` would leave `root` (joining "/x" replaces the base).
    let mut folder: PathBuf = Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let mut lowest: Option<u64> = None;
    loop {
        if let Some(limit) = read_limit(&root.join(&folder).join(file)) {
            lowest = Some(lowest.map_or(limit, |l| l.min(limit)));
        }
        if !folder.pop() {
            return lowest;
        }
    }
}

/// The limit in one file: `None` if absent, unlimited or not a number.
fn read_limit(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let text = text.trim();
    if text == "max" {
        return None;
    }
    match text.parse::<u64>() {
        Ok(bytes) if bytes < UNLIMITED => Some(bytes),
        Ok(_) => None,
        Err(_) => {
            log::debug!(
                "ignoring {}: '{text}' is not a memory limit",
                file.display()
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit found for `membership` (`/proc/self/cgroup`) in a cgroup
    /// mount holding `files` (path below the mount, content).
    fn limit_in(files: &[(&str, &str)], membership: &str) -> Option<u64> {
        let mount = tempfile::tempdir().expect("a temporary mount");
        for (relative, content) in files {
            let file = mount.path().join(relative);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent).expect("the mount's folders");
            }
            std::fs::write(file, content).expect("the mount's files");
        }
        memory_limit_in(mount.path(), membership)
    }

    #[test]
    fn v2_limit_of_the_cgroup_is_found() {
        let files = [("user.slice/job/memory.max", "2147483648\n")];
        assert_eq!(limit_in(&files, "0::/user.slice/job\n"), Some(2 << 30));
    }

    #[test]
    fn v2_max_means_no_limit() {
        let files = [
            ("user.slice/job/memory.max", "max\n"),
            ("user.slice/memory.max", "max\n"),
        ];
        assert_eq!(limit_in(&files, "0::/user.slice/job\n"), None);
    }

    #[test]
    fn v2_lower_parent_limit_wins() {
        let files = [
            ("kubepods/pod1/memory.max", "max\n"),
            ("kubepods/pod1/ctr/memory.max", "8589934592\n"),
            ("kubepods/memory.max", "1073741824\n"),
        ];
        assert_eq!(limit_in(&files, "0::/kubepods/pod1/ctr\n"), Some(1 << 30));
    }

    #[test]
    fn v2_container_root_path_reads_the_mount_root() {
        let files = [("memory.max", "536870912\n")];
        assert_eq!(limit_in(&files, "0::/\n"), Some(512 << 20));
        // A host path the container's mount lacks: walking up reaches it.
        assert_eq!(limit_in(&files, "0::/docker/0123abcd\n"), Some(512 << 20));
    }

    #[test]
    fn v1_memory_controller_limit_is_found() {
        let files = [("memory/docker/abc/memory.limit_in_bytes", "3221225472\n")];
        let membership = "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/x\n";
        assert_eq!(limit_in(&files, membership), Some(3 << 30));
    }

    #[test]
    fn v1_huge_value_means_no_limit() {
        let files = [("memory/memory.limit_in_bytes", "9223372036854771712\n")];
        assert_eq!(limit_in(&files, "9:cpu,cpuacct:/\n4:memory:/\n"), None);
    }

    #[test]
    fn garbage_is_ignored_without_panicking() {
        let files = [
            ("a/memory.max", "lots\n"),
            ("memory.max", "-5"),
            ("memory/memory.limit_in_bytes", ""),
        ];
        for membership in [
            "0::/a\n",
            "",
            "garbage\n:::\n0:\n4:memory\n",
            "0::/../../etc\n",
            "4:memory:/a\n",
        ] {
            assert_eq!(limit_in(&files, membership), None, "{membership}");
        }
    }

    /// The real machine's cgroups, read here file by file: the limit found
    /// is the lowest number in a limit file on this process's cgroup paths,
    /// and none is found only where no such file holds a limit.
    #[test]
    fn this_process_limit_is_the_lowest_limit_file_on_its_cgroup_paths() {
        let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mount = Path::new(CGROUP_MOUNT);
        let mut limits = vec![];
        for line in membership.lines() {
            let Some(path) = line.splitn(3, ':').nth(2) else {
                continue;
            };
            for ancestor in Path::new(path.trim_start_matches('/')).ancestors() {
                for file in [
                    mount.join(ancestor).join("memory.max"),
                    mount
                        .join("memory")
                        .join(ancestor)
                        .join("memory.limit_in_bytes"),
                ] {
                    if let Some(limit) = std::fs::read_to_string(&file)
                        .ok()
                        .and_then(|text| text.trim().parse::<u64>().ok())
                        .filter(|&limit| limit < UNLIMITED)
                    {
                        limits.push(limit);
                    }
                }
            }
        }
        assert_eq!(memory_limit(), limits.iter().copied().min(), "{membership}");
    }
}
