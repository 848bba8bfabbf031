//! A plugin function against the same function built in: `ngram_hash` of the
//! template plugin (examples/udf-plugin) registered in-process (its rlib,
//! no FFI) and loaded from its `cdylib` through `datafusion-ffi`, over the
//! same 1,000,000 captions, rounds interleaved A B A B (a shared machine's
//! noise hits both alike). Prints the median per mode and their ratio, then
//! what a call's configuration costs in `datafusion-ffi`'s form: converting
//! it (what `ForeignScalarUDF` does per call) against cloning a converted one
//! (what sqlfeed's host does per call, converting once per configuration).
//!
//! ```sh
//! cargo build --release --workspace --lib   # the plugin's .so
//! cargo bench --bench plugin_call
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::logical_expr::ScalarUDF;
use sqlfeed::Session;

const ROWS: usize = 1_000_000;
const BATCH_ROWS: usize = 8192;
const ROUNDS: usize = 7;
const QUERY: &str =
    "SELECT sum(cardinality(ngram_hash(caption, 3, 65536))) FROM captions";

/// Captions like the generated data's, each a little different.
fn captions() -> Vec<RecordBatch> {
    let colours = ["red", "green", "blue", "yellow", "white", "black", "orange"];
    let shapes = ["circle", "square", "triangle", "star"];
    (0..ROWS)
        .step_by(BATCH_ROWS)
        .map(|start| {
            let text: StringArray = (start..(start + BATCH_ROWS).min(ROWS))
                .map(|i| {
                    Some(format!(
                        "a {} {} on a {} background, number {i}",
                        colours[i % 7],
                        shapes[i % 4],
                        colours[(i / 7) % 7]
                    ))
                })
                .collect();
            RecordBatch::try_from_iter([("caption", Arc::new(text) as _)]).expect("batch")
        })
        .collect()
}

/// The plugin built next to this benchmark (target/release).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's path");
    let release = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/release");
    let library = sqlfeed_plugin::host::library_in(release, "sqlfeed_udf_plugin");
    assert!(
        library.exists(),
        "{} is missing: cargo build --release --workspace --lib",
        library.display()
    );
    library
}

async fn seconds(session: &Session) -> Result<f64> {
    let started = Instant::now();
    let batches = session.collect(session.sql(QUERY).await?).await?;
    assert_eq!(batches[0].num_rows(), 1);
    Ok(started.elapsed().as_secs_f64())
}

/// Microseconds per call of `f`, over `calls` calls.
fn micros_per_call<T>(calls: u32, mut f: impl FnMut() -> T) -> f64 {
    let started = Instant::now();
    for _ in 0..calls {
        std::hint::black_box(f());
    }
    started.elapsed().as_secs_f64() * 1e6 / f64::from(calls)
}

/// The per-call configuration costs (see the module docs).
fn configuration_costs() {
    use datafusion::common::config::ConfigOptions;
    use datafusion_ffi::config::FFI_ConfigOptions;

    let config = ConfigOptions::default();
    let converted = FFI_ConfigOptions::from(&config);
    let calls = 20_000;
    let convert = micros_per_call(calls, || FFI_ConfigOptions::from(&config));
    let clone = micros_per_call(calls, || converted.clone());
    eprintln!(
        "a call's configuration ({} entries) in FFI form: converted {convert:.1} µs, \
         a converted one cloned {clone:.1} µs",
        config.entries().len()
    );
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() -> Result<()> {
    let data = captions();
    let table = || MemTable::try_new(data[0].schema(), vec![data.clone()]).map(Arc::new);
    let builtin = Session::builder().build()?;
    builtin.context().register_table("captions", table()?)?;
    builtin
        .context()
        .register_udf(ScalarUDF::from(sqlfeed_udf_plugin::NgramHash::new()));
    let plugin = Session::builder().load_plugin(library()).build()?;
    plugin.context().register_table("captions", table()?)?;
    // Same answer first.
    let answer = |s: &Session| {
        let s = s.clone();
        async move {
            let batches = s.collect(s.sql(QUERY).await?).await?;
            Ok::<_, datafusion::error::DataFusionError>(
                datafusion::arrow::util::pretty::pretty_format_batches(&batches)?
                    .to_string(),
            )
        }
    };
    assert_eq!(answer(&builtin).await?, answer(&plugin).await?);
    seconds(&builtin).await?;
    seconds(&plugin).await?;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        a.push(seconds(&builtin).await?);
        b.push(seconds(&plugin).await?);
        eprintln!(
            "round {round}: built in {:.3}s, plugin {:.3}s",
            a[round], b[round]
        );
    }
    let (a, b) = (median(a), median(b));
    eprintln!(
        "ngram_hash over {ROWS} captions: built in {:.3}s ({:.2} M rows/s), plugin {:.3}s \
         ({:.2} M rows/s): the plugin takes {:+.1}%",
        a,
        ROWS as f64 / a / 1e6,
        b,
        ROWS as f64 / b / 1e6,
        100.0 * (b / a - 1.0)
    );
    configuration_costs();
    Ok(())
}
