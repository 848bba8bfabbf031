//! A feed's running totals in Prometheus' text exposition format, for long
//! runs watched by node_exporter's textfile collector.
//!
//! ```text
//!   FeedReport ─┐
//!   (epoch, step)├─▶ prometheus_text ─▶ write_whole(path) ─▶ path.prom
//!   labels ─────┘                         (temp file + rename)
//! ```
//!
//! One formatter for both faces: the CLI's `--prometheus FILE` and
//! Python's `sqlfeed.metrics.write_prometheus`, so the metric names, help
//! texts and label checks cannot drift apart. The collector reads the file
//! at every scrape, so it is written whole: a temporary file in the same
//! folder, renamed over the old one.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use datafusion::common::plan_err;
use datafusion::error::Result;

use super::FeedReport;

/// (name, type, help, value) of each sample.
type Sample = (&'static str, &'static str, &'static str, f64);

/// The samples of `report` with the position of the next batch.
fn samples(report: &FeedReport, epoch: u64, step: u64) -> [Sample; 9] {
    [
        (
            "sqlfeed_rows_total",
            "counter",
            "Rows the feed handed over.",
            report.rows as f64,
        ),
        (
            "sqlfeed_batches_total",
            "counter",
            "Batches the feed handed over.",
            report.batches as f64,
        ),
        (
            "sqlfeed_bytes_total",
            "counter",
            "Bytes of tensors the feed handed over.",
            report.bytes as f64,
        ),
        (
            "sqlfeed_running_seconds_total",
            "counter",
            "Seconds a pass of the feed ran.",
            report.wall_s,
        ),
        (
            "sqlfeed_wait_seconds_total",
            "counter",
            "Seconds the training loop waited for a batch.",
            report.wait_s,
        ),
        (
            "sqlfeed_h2d_seconds_total",
            "counter",
            "Seconds of host-to-device copies.",
            report.h2d_s,
        ),
        (
            "sqlfeed_prefetch_batches",
            "gauge",
            "Batches the prefetch ring holds ahead.",
            report.prefetch as f64,
        ),
        (
            "sqlfeed_epoch",
            "gauge",
            "The epoch of the next batch.",
            epoch as f64,
        ),
        (
            "sqlfeed_step",
            "gauge",
            "The step (within the epoch) of the next batch.",
            step as f64,
        ),
    ]
}

/// Checks that `name` is a Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`,
/// not starting with the reserved `__`).
pub fn check_label_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let well_formed = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__");
    if well_formed {
        Ok(())
    } else {
        plan_err!(
            "'{name}' is not a Prometheus label name: use letters, digits and \
             '_', not starting with a digit or '__'"
        )
    }
}

/// A label value with `\`, `"` and line feeds escaped.
fn escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A sample value as the format spells it (`+Inf`, `-Inf`, `NaN`).
fn number(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{value}")
    }
}

/// The running totals of `report`, with the `epoch` and `step` of the next
/// batch, in Prometheus' text format; every sample carries `labels` (in
/// their order; a bad name is an error naming it).
pub fn prometheus_text(
    report: &FeedReport,
    epoch: u64,
    step: u64,
    labels: &[(String, String)],
) -> Result<String> {
    let mut rendered = Vec::with_capacity(labels.len());
    for (name, value) in labels {
        check_label_name(name)?;
        rendered.push(format!("{name}=\"{}\"", escaped(value)));
    }
    let rendered = rendered.join(",");
    let mut text = String::new();
    for (name, kind, help, value) in samples(report, epoch, step) {
        // Writing to a String cannot fail.
        let _ = writeln!(text, "# HELP {name} {help}");
        let _ = writeln!(text, "# TYPE {name} {kind}");
        let _ = writeln!(text, "{name}{{{rendered}}} {}", number(value));
    }
    Ok(text)
}

/// Writes `text` to `path` whole: into a temporary file beside it, then
/// renamed over it, so a reader sees the old file or the new one. The file
/// gets the mode a plain `open()` gives under the process's umask (0644
/// under the usual 022), not a temporary file's 0600: node_exporter's
/// textfile collector runs as a user of its own and must read it.
pub fn write_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".sqlfeed-").suffix(".prom");
    // Created with mode 0666, which the kernel narrows by the umask.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut file = builder.tempfile_in(folder)?;
    file.write_all(text.as_bytes())?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> FeedReport {
        FeedReport {
            wall_s: 2.5,
            batches: 3,
            rows: 300,
            bytes: 2400,
            wait_s: 0.25,
            first_wait_s: 0.1,
            h2d_s: 0.0,
            convert_s: 0.0,
            stall_s: 0.0,
            ttfb_s: Some(0.1),
            padding_frac: None,
            pack_imbalance: None,
            prefetch: 2,
        }
    }

    #[test]
    fn every_sample_has_help_type_and_the_labels() -> Result<()> {
        let labels = [
            ("rank".to_string(), "1".to_string()),
            ("job".to_string(), "train \"a\"\\b\nc".to_string()),
        ];
        let text = prometheus_text(&report(), 4, 7, &labels)?;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 27);
        assert_eq!(
            lines[0],
            "# HELP sqlfeed_rows_total Rows the feed handed over."
        );
        assert_eq!(lines[1], "# TYPE sqlfeed_rows_total counter");
        assert_eq!(
            lines[2],
            r#"sqlfeed_rows_total{rank="1",job="train \"a\"\\b\nc"} 300"#
        );
        assert!(text.contains("sqlfeed_running_seconds_total{rank=\"1\""));
        let last = r#"sqlfeed_step{rank="1",job="train \"a\"\\b\nc"} 7"#;
        assert!(text.ends_with(&format!("{last}\n")), "{text}");
        assert!(text.contains("} 2.5\n") && text.contains("sqlfeed_epoch{"));
        Ok(())
    }

    #[test]
    fn odd_values_are_spelled_as_the_format_wants() {
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(0.25), "0.25");
    }

    #[test]
    fn a_bad_label_name_is_named() {
        for bad in ["", "1rank", "job-name", "__reserved", "é"] {
            let labels = [(bad.to_string(), "x".to_string())];
            let err = prometheus_text(&report(), 0, 0, &labels)
                .expect_err(bad)
                .to_string();
            assert!(
                err.contains(&format!("'{bad}' is not a Prometheus label name")),
                "{err}"
            );
        }
        assert!(check_label_name("_job2").is_ok());
    }

    #[test]
    fn the_file_is_replaced_whole() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sqlfeed.prom");
        write_whole(&path, "old\n")?;
        write_whole(&path, "new\n")?;
        assert_eq!(std::fs::read_to_string(&path)?, "new\n");
        let names: Vec<_> = std::fs::read_dir(dir.path())?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        assert_eq!(names, vec![std::ffi::OsString::from("sqlfeed.prom")]);
        Ok(())
    }

    /// Issue 56, item 7: not a temporary file's 0600, which node_exporter's
    /// own user cannot read, but what `open()` gives under the umask.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_file_gets_the_mode_of_a_plain_open() -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        // Read, not set: `umask(2)` would change it for every thread.
        let status = std::fs::read_to_string("/proc/self/status")?;
        let umask = status
            .lines()
            .find_map(|line| line.strip_prefix("Umask:"))
            .and_then(|octal| u32::from_str_radix(octal.trim(), 8).ok())
            .expect("Linux reports the umask");
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sqlfeed.prom");
        write_whole(&path, "x 1\n")?;
        let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o666 & !umask);
        Ok(())
    }
}
