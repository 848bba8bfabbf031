//! Shared by the examples: their command line and where their data comes
//! from.

// Each example uses only some of these.
#![allow(dead_code)]

use std::path::PathBuf;
use std::str::FromStr;

/// An example's command line: `--name value` pairs and bare switches.
pub struct Args(Vec<String>);

impl Args {
    /// The process's arguments.
    pub fn from_env() -> Self {
        Self(std::env::args().collect())
    }

    /// The value after `name`.
    pub fn flag(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .position(|a| a == name)
            .and_then(|at| self.0.get(at + 1))
            .cloned()
    }

    /// The number after `name`, or `default` where it is missing or not a
    /// number.
    pub fn number<T: FromStr>(&self, name: &str, default: T) -> T {
        self.flag(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// Whether the switch `name` is given.
    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }

    /// The data an example reads: the path or URL given as `--data`, or a
    /// generated training set (`sqlfeed gen`, `--rows` rows, default
    /// 20,000) in the temp directory, written once and reused.
    pub fn data(&self) -> datafusion::error::Result<String> {
        if let Some(given) = self.flag("--data") {
            return Ok(given);
        }
        let rows: u64 = self.number("--rows", 20_000);
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
}
