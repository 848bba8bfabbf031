//! sqlfeed's function reference: every function's DataFusion
//! `Documentation` is what the session registers, every example in it runs
//! and prints what it says, and `docs/functions.md` is generated from it.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::Result;
use datafusion::execution::FunctionRegistry;
use sqlfeed::sql::function_docs::{
    documented_functions, example_parts, functions_markdown,
};

use crate::common::{assert_contains, collect, session};

#[tokio::test]
async fn every_documented_example_runs_and_prints_its_output() -> Result<()> {
    let session = session()?;
    let mut wrong = vec![];
    for (name, doc) in documented_functions() {
        // What DataFusion reads (information_schema, SHOW FUNCTIONS).
        let udf = session.context().udf(name)?;
        assert_eq!(udf.documentation(), Some(&doc), "{name}");
        let (query, expected) = example_parts(doc.sql_example.as_deref().unwrap_or(""));
        let batches = collect(&session, &query).await?;
        let actual = pretty_format_batches(&batches)?.to_string();
        if actual.trim() != expected.trim() {
            wrong.push(format!("{name}: {query}\n{actual}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "examples whose output differs from their documentation:\n{}",
        wrong.join("\n\n")
    );
    Ok(())
}

#[test]
fn docs_functions_md_is_generated_from_the_documentation() -> Result<()> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/functions.md");
    let generated = functions_markdown();
    if std::env::var_os("SQLFEED_BLESS").is_some() {
        std::fs::write(path, &generated)?;
    }
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/functions.md is out of date: run `SQLFEED_BLESS=1 cargo test --test integration \
         function_docs` and commit it"
    );
    Ok(())
}

#[tokio::test]
async fn information_schema_shows_the_documentation() -> Result<()> {
    let session = session()?;
    let batches = collect(
        &session,
        "SELECT routine_name, syntax_example FROM information_schema.routines \
         WHERE routine_name = 'image_to_tensor'",
    )
    .await?;
    let text = pretty_format_batches(&batches)?.to_string();
    assert_contains(&text, &["image_to_tensor(image [, mean, std])"]);
    Ok(())
}
