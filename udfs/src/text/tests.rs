use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{Int8Type, Int32Type, Int64Type};
use datafusion::common::exec_datafusion_err;
use datafusion::error::Result;

use crate::numeric::test_util::{query, query_error};

/// A small BERT-like tokenizer.json: lowercase, whitespace split, a word
/// vocabulary, `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` templates.
pub(crate) const TOKENIZER_JSON: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
    {"id": 1, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
  ],
  "normalizer": {"type": "Lowercase"},
  "pre_tokenizer": {"type": "Whitespace"},
  "post_processor": {
    "type": "TemplateProcessing",
    "single": [
      {"SpecialToken": {"id": "[CLS]", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}},
      {"SpecialToken": {"id": "[SEP]", "type_id": 0}}
    ],
    "pair": [
      {"SpecialToken": {"id": "[CLS]", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}},
      {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
      {"Sequence": {"id": "B", "type_id": 1}},
      {"SpecialToken": {"id": "[SEP]", "type_id": 1}}
    ],
    "special_tokens": {
      "[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]},
      "[SEP]": {"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]}
    }
  },
  "decoder": null,
  "model": {
    "type": "WordLevel",
    "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "world": 4, "good": 5, "morning": 6},
    "unk_token": "[UNK]"
  }
}"#;

fn tokenizer_file() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, TOKENIZER_JSON).expect("write tokenizer");
    let path = path.display().to_string();
    (dir, path)
}

fn i32_lists(array: &dyn Array) -> Vec<Option<Vec<i32>>> {
    let list = array.as_list::<i32>();
    (0..list.len())
        .map(|i| {
            list.is_valid(i)
                .then(|| list.value(i).as_primitive::<Int32Type>().values().to_vec())
        })
        .collect()
}

#[tokio::test]
async fn tokenize_applies_the_tokenizer_json() -> Result<()> {
    let (_dir, path) = tokenizer_file();
    let array = query(&format!(
        "SELECT tokenize(t, '{path}') FROM (VALUES ('Hello world'), ('good MORNING zebra'), (NULL)) v(t)"
    ))
    .await?;
    assert_eq!(
        i32_lists(&array),
        vec![Some(vec![1, 3, 4, 2]), Some(vec![1, 5, 6, 0, 2]), None]
    );
    let array = query(&format!(
        "SELECT tokenize('hello good morning world', '{path}', 4)"
    ))
    .await?;
    assert_eq!(
        i32_lists(&array),
        vec![Some(vec![1, 3, 5, 2])],
        "truncated, specials kept"
    );
    let array = query(&format!(
        "SELECT tokenize_pair('hello', 'world good', '{path}')"
    ))
    .await?;
    assert_eq!(i32_lists(&array), vec![Some(vec![1, 3, 2, 4, 5, 2])]);
    Ok(())
}

/// Ids from the reference implementation (Python `tokenizers` 0.23.3) for
/// the published all-MiniLM-L6-v2 BERT tokenizer; see tests/data/README.md.
#[tokio::test]
async fn a_published_bert_tokenizer_matches_the_reference_ids() -> Result<()> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/all-MiniLM-L6-v2.tokenizer.json"
    );
    let array = query(&format!(
        "SELECT tokenize(t, '{path}') FROM (VALUES ('Hello, world!'), \
         ('SQL over Parquet feeds the GPU.'), ('naïve café résumé'), ('')) v(t)"
    ))
    .await?;
    assert_eq!(
        i32_lists(&array),
        vec![
            Some(vec![101, 7592, 1010, 2088, 999, 102]),
            Some(vec![
                101, 29296, 2058, 11968, 12647, 14172, 1996, 14246, 2226, 1012, 102
            ]),
            Some(vec![101, 15743, 7668, 13746, 102]),
            Some(vec![101, 102]),
        ]
    );
    let array = query(&format!(
        "SELECT tokenize_pair('How are you?', 'I am fine.', '{path}')"
    ))
    .await?;
    assert_eq!(
        i32_lists(&array),
        vec![Some(vec![
            101, 2129, 2024, 2017, 1029, 102, 1045, 2572, 2986, 1012, 102
        ])]
    );
    let array = query(&format!(
        "SELECT tokenize('SQL over Parquet feeds the GPU.', '{path}', 6)"
    ))
    .await?;
    assert_eq!(
        i32_lists(&array),
        vec![Some(vec![101, 29296, 2058, 11968, 12647, 102])]
    );
    Ok(())
}

#[tokio::test]
async fn bad_tokenizers_are_plan_errors_naming_the_path() {
    query_error(
        "SELECT tokenize('a', '/nonexistent/tokenizer.json')",
        &["'/nonexistent/tokenizer.json' does not exist"],
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"not\": \"a tokenizer\"}").expect("write");
    query_error(
        &format!("SELECT tokenize('a', '{}')", bad.display()),
        &["is not a valid tokenizer.json", "bad.json"],
    )
    .await;
    // A per-row tokenizer is refused at plan time, not per row.
    query_error(
        "SELECT tokenize('a', p) FROM (VALUES ('x')) v(p)",
        &["must be a constant path"],
    )
    .await;
    query_error("SELECT tokenize(1, 'x')", &["argument 1 must be a string"]).await;
    query_error("SELECT tokenize('a')", &["tokenize takes 2 or 3 arguments"]).await;
}

#[tokio::test]
async fn masks_padding_and_truncation() -> Result<()> {
    let array = query("SELECT attention_mask([7, 8, 9], 5)").await?;
    let mask = array.as_list::<i32>().value(0);
    assert_eq!(
        mask.as_primitive::<Int8Type>().values().to_vec(),
        vec![1, 1, 1, 0, 0]
    );
    let array = query("SELECT attention_mask([7, 8, 9], 2)").await?;
    assert_eq!(array.as_list::<i32>().value(0).len(), 2);
    let array = query("SELECT pad([7, 8], 4, -1)").await?;
    let padded = array.as_list::<i32>().value(0);
    assert_eq!(
        padded.as_primitive::<Int64Type>().values().to_vec(),
        vec![7, 8, -1, -1]
    );
    let array =
        query("SELECT truncate([7, 8, 9], 2), truncate(CAST(NULL AS BIGINT[]), 2)")
            .await?;
    let cut = array.as_list::<i32>().value(0);
    assert_eq!(
        cut.as_primitive::<Int64Type>().values().to_vec(),
        vec![7, 8]
    );
    query_error("SELECT pad([1], -3, 0)", &["len must be between"]).await;
    query_error("SELECT truncate('abc', 2)", &["must be a list of numbers"]).await;
    Ok(())
}

/// Serves tokenizer files from memory by URL, like a session's object stores.
#[derive(Debug)]
struct MemoryAssets;

impl crate::AssetReader for MemoryAssets {
    fn read(&self, url: &str) -> Result<Vec<u8>> {
        match url {
            "s3://models/tokenizer.json" => Ok(TOKENIZER_JSON.as_bytes().to_vec()),
            other => Err(exec_datafusion_err!("object at {other} not found")),
        }
    }
}

async fn query_with_assets(sql: &str) -> Result<Vec<Option<Vec<i32>>>> {
    let ctx = datafusion::prelude::SessionContext::new();
    let options = crate::UdfOptions {
        asset_reader: Some(std::sync::Arc::new(MemoryAssets)),
        ..Default::default()
    };
    crate::register_all_with(&ctx, &options)?;
    let batches = ctx.sql(sql).await?.collect().await?;
    Ok(i32_lists(batches[0].column(0)))
}

#[tokio::test]
async fn tokenizers_load_from_urls_through_the_asset_reader() -> Result<()> {
    let ids = query_with_assets(
        "SELECT tokenize('Hello world', 's3://models/tokenizer.json', 3)",
    )
    .await?;
    assert_eq!(ids, vec![Some(vec![1, 3, 2])]);

    // file:// is a local path, not an object store.
    let (_dir, path) = tokenizer_file();
    let ids = query(&format!("SELECT tokenize('good morning', 'file://{path}')")).await?;
    assert_eq!(i32_lists(&ids), vec![Some(vec![1, 5, 6, 2])]);

    // A missing object is a plan-time error naming the URL and the cause.
    let err = query_with_assets("SELECT tokenize('a', 's3://models/missing.json')")
        .await
        .expect_err("missing object")
        .to_string();
    assert!(
        err.contains("cannot read tokenizer 's3://models/missing.json'")
            && err.contains("not found"),
        "{err}"
    );
    // Without a reader (a bare SessionContext), URLs are refused clearly.
    query_error(
        "SELECT tokenize('a', 's3://models/tokenizer.json')",
        &["no object stores for URLs"],
    )
    .await;
    Ok(())
}

#[tokio::test]
async fn a_pinned_tokenizer_is_reloaded_when_its_file_changes() -> Result<()> {
    use datafusion::execution::FunctionRegistry;
    use datafusion::prelude::SessionContext;
    let (_dir, path) = tokenizer_file();
    let ctx = SessionContext::new();
    crate::register_all(&ctx)?;
    let ids = |ctx: SessionContext, path: String| async move {
        let batches = ctx
            .sql(&format!(
                "SELECT tokenize(t, '{path}') FROM (VALUES ('hello world')) v(t)"
            ))
            .await?
            .collect()
            .await?;
        Ok::<_, datafusion::error::DataFusionError>(i32_lists(batches[0].column(0)))
    };
    assert_eq!(
        ids(ctx.clone(), path.clone()).await?,
        vec![Some(vec![1, 3, 4, 2])]
    );
    let udf = ctx.udf("tokenize")?;
    let reader = crate::reads_assets(&udf).expect("tokenize reads assets");
    assert_eq!(reader.asset_arguments(2), vec![1]);
    let pinned = reader.pin_asset(&path)?;
    assert_eq!(
        pinned.xxh3,
        xxhash_rust::xxh3::xxh3_128(TOKENIZER_JSON.as_bytes())
    );
    assert_eq!(pinned.bytes, TOKENIZER_JSON.len() as u64);

    // The same path, another vocabulary: the session still uses what it
    // loaded until the file is pinned again, then the new content.
    let changed = TOKENIZER_JSON.replace(r#""hello": 3"#, r#""hello": 7"#);
    std::fs::write(&path, &changed)?;
    assert_eq!(
        ids(ctx.clone(), path.clone()).await?,
        vec![Some(vec![1, 3, 4, 2])]
    );
    let repinned = reader.pin_asset(&path)?;
    assert_eq!(
        repinned.xxh3,
        xxhash_rust::xxh3::xxh3_128(changed.as_bytes())
    );
    assert_eq!(
        ids(ctx.clone(), path.clone()).await?,
        vec![Some(vec![1, 7, 4, 2])]
    );

    // Functions that read no files are not asset readers; a missing file
    // gives the function's own error.
    assert!(crate::reads_assets(ctx.udf("pad")?.as_ref()).is_none());
    let err = reader
        .pin_asset("/no/such/tokenizer.json")
        .expect_err("missing");
    assert!(err.to_string().contains("does not exist"), "{err}");
    Ok(())
}
