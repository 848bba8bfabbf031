//! Spill folders: what a killed process spilled is removed by the next
//! session that uses the same spill directory.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use datafusion::error::Result;

use crate::common::{files_below, gen_data, sqlfeed};

/// The folders directly inside `dir`, sorted.
fn folders(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut folders: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    folders.sort();
    folders
}

#[test]
fn spill_files_of_a_killed_process_are_removed_by_the_next_session() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let spill = dir.path().join("spill");
    gen_data(&data, 12_000, 2)?;
    // A shuffle of about twice its budget spills sorted runs and reads them
    // back while it writes its output; the output goes to a pipe nobody
    // reads, so the process blocks with its spill files open until killed.
    let mut child = sqlfeed()
        .args([
            "--memory-limit",
            "1M",
            "--target-partitions",
            "2",
            "--spill-dir",
        ])
        .arg(&spill)
        .args(["--format", "csv", "-c"])
        .arg(format!(
            "SELECT id, caption, tokens FROM '{}' SHUFFLE SEED 5",
            data.display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while files_below(&spill).is_empty() {
        if Instant::now() > deadline || child.try_wait()?.is_some() {
            let _ = child.kill();
            panic!("sqlfeed never spilled into {}", spill.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGKILL: no destructor runs, the spill files stay on disk.
    child.kill()?;
    child.wait()?;
    let left = folders(&spill);
    assert!(!files_below(&spill).is_empty(), "nothing was left to sweep");

    let session = sqlfeed::Session::builder()
        .memory_limit(64 << 20)
        .spill_dir(&spill)
        .build()?;
    let leftovers = files_below(&spill);
    assert!(
        leftovers.is_empty(),
        "spill files of the killed process: {leftovers:?}"
    );
    let own = session.spill_folder();
    assert!(own.is_dir() && own.starts_with(&spill), "{}", own.display());
    assert!(!left.iter().any(|f| f == own), "{left:?} {}", own.display());
    assert_eq!(folders(&spill), vec![own.to_path_buf()]);
    Ok(())
}
