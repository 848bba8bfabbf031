//! What the numeric and text functions cost on 8,192-row batches, each next
//! to the plain Rust a user would otherwise write over the same Arrow arrays
//! or the same tokenizer:
//!
//! * `standardize(x, 0.5, 0.2)` vs a loop building a `Float32Array`;
//! * `hash_bucket(s, 1000)` and `one_hot(i, 16)`;
//! * `tokenize(text, 'all-MiniLM-L6-v2.tokenizer.json', 64)` vs
//!   `Tokenizer::encode` row by row.
//!
//! ```sh
//! cargo bench --bench udf_numeric_text
//! ```
//! The SQL side runs a prepared physical plan over one in-memory batch, so
//! the numbers include DataFusion's per-batch overhead (scan + projection),
//! which is what a query pays.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use datafusion::arrow::array::{
    ArrayRef, Float32Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};

const ROWS: usize = 8192;

/// Words for generated sentences: common English plus a few rarer ones that
/// split into several word pieces.
const WORDS: &[&str] = &[
    "the",
    "a",
    "model",
    "reads",
    "parquet",
    "files",
    "and",
    "shuffles",
    "every",
    "epoch",
    "with",
    "seed",
    "gpu",
    "tensors",
    "arrive",
    "before",
    "step",
    "ends",
    "tokenization",
    "preprocessing",
    "dataloader",
    "throughput",
    "deterministic",
    "of",
    "in",
    "to",
    "is",
    "fast",
    "batch",
    "training",
];

/// One batch: `x` float32, `i` int32 class ids, `s` short strings, `text`
/// sentences of 8–40 words.
fn batch() -> RecordBatch {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let x: Float32Array = (0..ROWS)
        .map(|_| (next() % 10_000) as f32 / 10_000.0)
        .collect();
    let i: Int32Array = (0..ROWS).map(|_| (next() % 16) as i32).collect();
    let s: StringArray = (0..ROWS)
        .map(|_| Some(format!("user-{}", next() % 100_000)))
        .collect();
    let text: StringArray = (0..ROWS)
        .map(|_| {
            let words = 8 + next() % 33;
            let sentence: Vec<&str> = (0..words)
                .map(|_| WORDS[(next() % WORDS.len() as u64) as usize])
                .collect();
            Some(sentence.join(" "))
        })
        .collect();
    let ids: Int64Array = (0..ROWS as i64).collect();
    RecordBatch::try_from_iter(vec![
        ("id", Arc::new(ids) as ArrayRef),
        ("x", Arc::new(x) as ArrayRef),
        ("i", Arc::new(i) as ArrayRef),
        ("s", Arc::new(s) as ArrayRef),
        ("text", Arc::new(text) as ArrayRef),
    ])
    .expect("batch")
}

fn tokenizer_path() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json")
        .display()
        .to_string()
}

/// A context over `batch` as table `t`, one partition, one batch.
fn context(batch: &RecordBatch) -> SessionContext {
    let ctx = SessionContext::new_with_config(
        SessionConfig::new()
            .with_target_partitions(1)
            .with_batch_size(ROWS),
    );
    sqlfeed_udfs::register_all(&ctx).expect("registers");
    let table =
        MemTable::try_new(batch.schema(), vec![vec![batch.clone()]]).expect("table");
    ctx.register_table("t", Arc::new(table))
        .expect("registered");
    ctx
}

fn plan(
    runtime: &tokio::runtime::Runtime,
    ctx: &SessionContext,
    sql: &str,
) -> Arc<dyn ExecutionPlan> {
    runtime
        .block_on(async { ctx.sql(sql).await?.create_physical_plan().await })
        .expect("plans")
}

fn run(
    runtime: &tokio::runtime::Runtime,
    ctx: &SessionContext,
    plan: &Arc<dyn ExecutionPlan>,
) -> usize {
    let batches = runtime
        .block_on(collect(Arc::clone(plan), ctx.task_ctx()))
        .expect("runs");
    batches.iter().map(|b| b.num_rows()).sum()
}

fn bench(c: &mut Criterion) {
    let batch = batch();
    let ctx = context(&batch);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let mut numeric = c.benchmark_group("numeric_8192");
    numeric.throughput(Throughput::Elements(ROWS as u64));
    let x = batch
        .column_by_name("x")
        .and_then(|a| a.as_any().downcast_ref::<Float32Array>())
        .expect("x")
        .clone();
    numeric.bench_function("standardize_plain_loop", |b| {
        b.iter(|| {
            let out: Float32Array =
                x.iter().map(|v| v.map(|v| (v - 0.5) / 0.2)).collect();
            black_box(out.len())
        })
    });
    let standardize = plan(&runtime, &ctx, "SELECT standardize(x, 0.5, 0.2) FROM t");
    numeric.bench_function("standardize_udf", |b| {
        b.iter(|| black_box(run(&runtime, &ctx, &standardize)))
    });
    let passthrough = plan(&runtime, &ctx, "SELECT x FROM t");
    numeric.bench_function("select_x_no_function", |b| {
        b.iter(|| black_box(run(&runtime, &ctx, &passthrough)))
    });
    let hash = plan(&runtime, &ctx, "SELECT hash_bucket(s, 1000) FROM t");
    numeric.bench_function("hash_bucket_udf", |b| {
        b.iter(|| black_box(run(&runtime, &ctx, &hash)))
    });
    let one_hot = plan(&runtime, &ctx, "SELECT one_hot(i, 16) FROM t");
    numeric.bench_function("one_hot_udf", |b| {
        b.iter(|| black_box(run(&runtime, &ctx, &one_hot)))
    });
    numeric.finish();

    let mut text = c.benchmark_group("tokenize_8192");
    text.throughput(Throughput::Elements(ROWS as u64));
    text.sample_size(10);
    let path = tokenizer_path();
    let mut tokenizer = tokenizers::Tokenizer::from_file(&path).expect("tokenizer");
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(Some(tokenizers::TruncationParams {
            max_length: 64,
            ..Default::default()
        }))
        .expect("truncation");
    let sentences = batch
        .column_by_name("text")
        .and_then(|a| a.as_any().downcast_ref::<StringArray>())
        .expect("text")
        .clone();
    text.bench_function("plain_loop_encode", |b| {
        b.iter(|| {
            let mut ids = 0;
            for sentence in sentences.iter().flatten() {
                ids += tokenizer.encode(sentence, true).expect("encodes").len();
            }
            black_box(ids)
        })
    });
    text.bench_function("plain_loop_encode_fast", |b| {
        b.iter(|| {
            let mut ids = 0;
            for sentence in sentences.iter().flatten() {
                ids += tokenizer
                    .encode_fast(sentence, true)
                    .expect("encodes")
                    .len();
            }
            black_box(ids)
        })
    });
    let tokenize = plan(
        &runtime,
        &ctx,
        &format!("SELECT tokenize(text, '{path}', 64) FROM t"),
    );
    text.bench_function("udf", |b| {
        b.iter(|| black_box(run(&runtime, &ctx, &tokenize)))
    });
    text.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
