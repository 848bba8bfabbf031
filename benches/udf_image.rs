//! What the SQL function layer costs: JPEG decode + resize of 8,192 images
//! through `image_resize(image_decode(b), 24, 24)` versus a plain loop over
//! the same library calls (`decode_image`, `into_rgb8`,
//! fast_image_resize bilinear), and the same query on 1 vs 2 partitions.
//!
//! ```sh
//! cargo bench --bench udf_image
//! ```
//! Goal (issue: UDF library): the UDF takes < 10% longer than the loop.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use datafusion::arrow::array::{ArrayRef, BinaryArray, RecordBatch};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::{SessionConfig, SessionContext};
use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{PixelType, ResizeOptions, Resizer};
use image::codecs::jpeg::JpegEncoder;
use image::{ExtendedColorType, ImageEncoder};
use sqlfeed_udfs::image::{DEFAULT_MAX_PIXELS, decode_image};

const ROWS: usize = 8192;

/// `ROWS` distinct 32×32 JPEGs (gradients of varying colour).
fn jpegs() -> Vec<Vec<u8>> {
    (0..ROWS)
        .map(|i| {
            let pixels: Vec<u8> = (0..32 * 32)
                .flat_map(|p| {
                    let (x, y) = (p % 32, p / 32);
                    [(x * 8 + i) as u8, (y * 8) as u8, (i * 37 % 256) as u8]
                })
                .collect();
            let mut out = Vec::new();
            JpegEncoder::new_with_quality(&mut out, 90)
                .write_image(&pixels, 32, 32, ExtendedColorType::Rgb8)
                .expect("encodes");
            out
        })
        .collect()
}

/// The plain loop a user would write with the same libraries.
fn plain_loop(blobs: &[Vec<u8>]) -> usize {
    let mut resizer = Resizer::new();
    let options = ResizeOptions::new();
    let mut bytes = 0;
    for blob in blobs {
        let rgb = decode_image(blob, DEFAULT_MAX_PIXELS)
            .expect("decodes")
            .to_rgb8();
        let src = ImageRef::new(rgb.width(), rgb.height(), rgb.as_raw(), PixelType::U8x3)
            .expect("valid image");
        let mut dst = Image::new(24, 24, PixelType::U8x3);
        resizer.resize(&src, &mut dst, &options).expect("resizes");
        bytes += dst.buffer().len();
    }
    bytes
}

/// The physical plan of the SQL version over `partitions` partitions.
fn udf_plan(
    runtime: &tokio::runtime::Runtime,
    blobs: &[Vec<u8>],
    partitions: usize,
) -> (SessionContext, Arc<dyn ExecutionPlan>) {
    let ctx = SessionContext::new_with_config(
        SessionConfig::new()
            .with_target_partitions(partitions)
            .with_batch_size(ROWS),
    );
    sqlfeed_udfs::register_all(&ctx).expect("registers");
    let per = ROWS / partitions;
    let batches: Vec<Vec<RecordBatch>> = blobs
        .chunks(per)
        .map(|chunk| {
            let array = BinaryArray::from_iter_values(chunk.iter().map(|b| b.as_slice()));
            vec![
                RecordBatch::try_from_iter(vec![("b", Arc::new(array) as ArrayRef)])
                    .expect("batch"),
            ]
        })
        .collect();
    let table = MemTable::try_new(batches[0][0].schema(), batches).expect("table");
    ctx.register_table("t", Arc::new(table))
        .expect("registered");
    let plan = runtime.block_on(async {
        let df = ctx
            .sql("SELECT image_resize(image_decode(b), 24, 24) FROM t")
            .await?;
        df.create_physical_plan().await
    });
    (ctx, plan.expect("plans"))
}

fn bench(c: &mut Criterion) {
    let blobs = jpegs();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("jpeg_decode_resize_8192");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.sample_size(10);
    group.bench_function("plain_loop", |b| b.iter(|| black_box(plain_loop(&blobs))));
    for partitions in [1, 2] {
        let (ctx, plan) = udf_plan(&runtime, &blobs, partitions);
        group.bench_function(format!("udf_{partitions}_partition"), |b| {
            b.iter(|| {
                let batches = runtime
                    .block_on(collect(Arc::clone(&plan), ctx.task_ctx()))
                    .expect("runs");
                black_box(batches.iter().map(|b| b.num_rows()).sum::<usize>())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
