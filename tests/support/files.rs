//! Shared by the integration and memory test binaries: what a test finds
//! left in a folder.

use std::path::{Path, PathBuf};

/// Every file below `dir` (for checking that spill folders end up empty).
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_below(&path));
        } else {
            files.push(path);
        }
    }
    files
}
