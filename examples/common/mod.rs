//! Shared by the examples: where their data comes from.

use std::path::PathBuf;

/// The data an example reads: the path or URL given as `--data`, or a
/// generated training set (`sqlfeed gen`, `--rows` rows, default 20,000) in
/// the temp directory, written once and reused.
pub fn data(args: &[String]) -> datafusion::error::Result<String> {
    if let Some(given) = flag(args, "--data") {
        return Ok(given);
    }
    let rows: u64 = flag(args, "--rows")
        .and_then(|r| r.parse().ok())
        .unwrap_or(20_000);
    let dir: PathBuf = std::env::temp_dir().join(format!("sqlfeed-examples-{rows}"));
    if !dir.join("_meta.json").exists() {
        let mut options = sqlfeed::datagen::GenOptions::new(rows, &dir);
        options.files = 4;
        let summary = sqlfeed::datagen::generate(&options)?;
        eprintln!(
            "generated {} rows ({} bytes of Parquet) in {}",
            summary.rows,
            summary.bytes,
            dir.display()
        );
    }
    Ok(format!("{}/*.parquet", dir.display()))
}

/// The value after `name` in `args`.
pub fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|at| args.get(at + 1))
        .cloned()
}
