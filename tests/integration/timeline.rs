//! A feed's timeline: the verdict names the right bottleneck on two
//! contrived feeds (decode-bound, loop-bound), the CLI writes the page, and
//! the page renders in a real headless browser (Chromium: skipped, visibly,
//! when it is absent; `SQLFEED_TEST_BROWSER=require`, as in `.ci/run`,
//! makes its absence a failure).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use datafusion::error::Result;
use sqlfeed::datagen::{GenOptions, generate};
use sqlfeed::device::Device;
use sqlfeed::feed::{Bound, Feed};

use super::common::{assert_contains, run, sqlfeed};

/// 64×64 PNGs: decoding them is the feed's work.
fn images(dir: &Path, rows: u64) -> Result<String> {
    let mut options = GenOptions::new(rows, dir);
    options.files = 4;
    options.image_size = 64;
    generate(&options)?;
    Ok(format!("'{}/*.parquet'", dir.display()))
}

const DECODE_SQL: &str =
    "SELECT image_to_tensor(image_resize(image_decode(image_png), 16, 16)) AS px FROM";

#[test]
fn a_feed_that_only_decodes_is_bound_by_its_decoder() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = images(dir.path(), 3000)?;
    let session = super::common::session()?;
    let feed = Feed::builder(&session, format!("{DECODE_SQL} {files}"))
        .batch_size(64)
        .prefetch(2)
        .device(Device::Cpu)
        .build()?;
    let timeline = feed.timeline();
    let mut batches = 0;
    for batch in feed {
        batch?;
        batches += 1;
    }
    assert!(batches > 0);
    let verdict = timeline.verdict();
    // The loop only takes batches: it waits for the decoder all the time.
    match &verdict.bound {
        Bound::Stage(stage) => assert!(stage.contains("image_decode"), "{verdict}"),
        other => panic!("expected the decoder, got {other:?}: {verdict}"),
    }
    assert!(verdict.wait_frac > 0.5, "{verdict}");
    assert!(
        verdict.to_string().starts_with("bound by image_"),
        "{verdict}"
    );
    Ok(())
}

#[test]
fn a_feed_whose_loop_is_slower_is_bound_by_the_loop() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = super::common::gen_data(dir.path(), 4000, 2)?;
    let session = super::common::session()?;
    let sql = format!(
        "SELECT id, f0 FROM '{}/*.parquet'",
        files[0].parent().unwrap_or(dir.path()).display()
    );
    let feed = Feed::builder(&session, sql)
        .batch_size(100)
        .prefetch(4)
        .device(Device::Cpu)
        .build()?;
    let timeline = feed.timeline();
    for batch in feed {
        batch?;
        // A training step far longer than reading 100 rows.
        std::thread::sleep(Duration::from_millis(20));
    }
    let verdict = timeline.verdict();
    assert_eq!(verdict.bound, Bound::Loop, "{verdict}");
    assert!(
        verdict
            .to_string()
            .starts_with("bound by the training loop"),
        "{verdict}"
    );
    assert!(
        timeline.samples().len() >= 5,
        "{:?}",
        timeline.samples().len()
    );
    Ok(())
}

/// Chromium's binary, or `None` (skip) when absent and not required.
fn chromium(test: &str) -> Option<PathBuf> {
    let required = std::env::var("SQLFEED_TEST_BROWSER").is_ok_and(|v| v == "require");
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(PathBuf::from);
    if found.is_none() {
        assert!(
            !required,
            "SQLFEED_TEST_BROWSER=require but no chromium on PATH (apt-get install chromium)"
        );
        eprintln!("SKIPPED {test}: no chromium on PATH (apt-get install chromium)");
    }
    found
}

/// Runs headless Chromium on `page` with `args` (a fresh profile each time).
fn headless(browser: &Path, page: &Path, args: &[&str]) -> (bool, String, String) {
    let profile = tempfile::tempdir().expect("a temporary profile folder");
    run(Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(format!("file://{}", page.display())))
}

#[test]
fn the_cli_writes_a_page_that_renders_in_a_browser_with_the_verdict() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = images(&dir.path().join("data"), 2000)?;
    let page = dir.path().join("feed.html");
    let (ok, out, err) = run(sqlfeed()
        .args([
            "feed",
            &format!("{DECODE_SQL} {files}"),
            "--batch-size",
            "64",
            "--device",
            "cpu",
            "--explain-analyze",
            "--timeline",
        ])
        .arg(&page));
    assert!(ok, "{err}");
    // The verdict ends the feed's EXPLAIN ANALYZE and the timeline's line.
    let verdict_line = out
        .lines()
        .find_map(|line| line.strip_prefix("verdict: "))
        .unwrap_or_else(|| panic!("no verdict in {out}"));
    assert!(
        verdict_line.starts_with("bound by image_"),
        "{verdict_line}"
    );
    assert!(
        err.contains(&format!("timeline: {}", page.display())),
        "{err}"
    );
    let html = std::fs::read_to_string(&page)?;
    assert!(html.contains("data-layer=\"image_to_tensor+image_resize+image_decode\""));

    let Some(browser) = chromium("the_cli_writes_a_page_that_renders_in_a_browser")
    else {
        return Ok(());
    };
    // The browser's DOM holds the verdict and the charts.
    let (ok, dom, err) = headless(&browser, &page, &["--dump-dom"]);
    assert!(ok, "chromium --dump-dom failed: {err}");
    assert_contains(&dom, &["id=\"verdict\"", "bound by image_"]);
    assert_eq!(dom.matches("<svg").count(), 5, "five charts");
    // And it paints them: the busiest stage's colour fills part of the
    // screenshot (#4e79a7, the first colour of the palette).
    let shot = dir.path().join("feed.png");
    let (ok, _, err) = headless(
        &browser,
        &page,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1000,1600",
            "--hide-scrollbars",
        ],
    );
    assert!(ok && shot.exists(), "chromium --screenshot failed: {err}");
    let image = image::open(&shot)
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
        .to_rgb8();
    let painted = image.pixels().filter(|p| p.0 == [0x4e, 0x79, 0xa7]).count();
    assert!(
        painted > 2_000,
        "the decode stage should be painted: {painted} pixels of its colour"
    );
    Ok(())
}
