//! Scenario 6: variable-length text. Captions are tokenized in SQL with a
//! Hugging Face `tokenizer.json` (a path or an `s3://…` URL), padded per
//! batch to the longest row (not to a fixed 512), and batched by a token
//! budget so that every batch holds about the same number of tokens.
//!
//! ```sh
//! cargo run --release --example text_tokens -- [--data …] [--tokenizer tokenizer.json] [--tokens 4096]
//! ```

// Examples report on stdout.
#![allow(clippy::print_stdout)]

mod common;

use datafusion::error::Result;
use sqlfeed::Session;
use sqlfeed::device::Device;
use sqlfeed::feed::Feed;

fn main() -> Result<()> {
    let args = common::Args::from_env();
    let data = args.data()?;
    let tokenizer = args.flag("--tokenizer").unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json"
        )
        .to_string()
    });
    let budget: usize = args.number("--tokens", 4096);
    let session = Session::try_new()?;
    // Captions are short; a caption and the generated token list together
    // make the lengths vary the way documents do.
    let sql = format!(
        "SELECT array_concat(tokenize(caption, '{tokenizer}', 64), tokens) AS input_ids,
                label AS y
         FROM '{data}'"
    );
    let mut feed = Feed::builder(&session, sql)
        .shuffle(7)
        .batch_tokens(budget)
        .device(Device::Cpu)
        .build()?;
    let (mut batches, mut rows, mut shapes) = (0usize, 0usize, Vec::new());
    for batch in feed.by_ref() {
        let batch = batch?;
        let ids = batch.tensor("input_ids")?;
        if shapes.len() < 5 {
            shapes.push(format!("{:?}", ids.shape()));
        }
        batches += 1;
        rows += batch.rows();
    }
    let report = feed.report();
    println!(
        "{rows} rows in {batches} batches of at most {budget} tokens; first shapes {}; \
         padding {:.1}% of the tensor elements",
        shapes.join(" "),
        100.0 * report.padding_frac.unwrap_or(0.0)
    );
    Ok(())
}
