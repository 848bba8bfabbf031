//! Computes `SQLFEED_BUILD_ID`: xxh3-128 of the source of both crates
//! (`src/**/*.rs`, `udfs/src/**/*.rs`) and `Cargo.lock`.
//!
//! The result cache puts it into every key, so entries written by a build
//! whose code differs (even under the same version number) are never served
//! by another. Paths are hashed relative and with `/`, each with its content
//! and both lengths, so the id depends on the source alone, not on where the
//! checkout lies. Folders or files that are missing (a packaged crate has no
//! `udfs/`) are skipped.

use std::fs;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

const SOURCES: [&str; 2] = ["src", "udfs/src"];
const LOCK: &str = "Cargo.lock";

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut files = Vec::new();
    for folder in SOURCES {
        println!("cargo:rerun-if-changed={folder}");
        rust_files(&root, &root.join(folder), &mut files);
    }
    println!("cargo:rerun-if-changed={LOCK}");
    println!("cargo:rerun-if-changed=build.rs");
    files.push(LOCK.to_string());
    files.sort();

    let mut hasher = Xxh3::new();
    for relative in &files {
        // A file that vanished mid-walk is hashed as absent, not an error:
        // cargo reruns this script when it reappears.
        let Ok(content) = fs::read(root.join(relative)) else {
            continue;
        };
        for field in [relative.as_bytes(), content.as_slice()] {
            hasher.update(&(field.len() as u64).to_le_bytes());
            hasher.update(field);
        }
    }
    println!(
        "cargo:rustc-env=SQLFEED_BUILD_ID={:032x}",
        hasher.digest128()
    );
}

/// Adds every `.rs` file under `dir`, as a `/`-separated path relative to
/// `root`, to `out`.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(read) = fs::read_dir(dir) else {
        return;
    };
    for item in read.flatten() {
        let path = item.path();
        if path.is_dir() {
            rust_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && let Ok(relative) = path.strip_prefix(root)
        {
            let parts: Vec<_> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect();
            out.push(parts.join("/"));
        }
    }
}
