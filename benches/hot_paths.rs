//! Criterion micro-benchmarks of the hot paths, each next to the plain Rust
//! a user would write for the same work:
//!
//! * the shuffle key (`row_key_hash`) over 8,192 rows of dense features, of
//!   image tensors and of captions with token lists, next to hashing the
//!   same bytes with one `xxh3` call per row (the floor);
//! * tensor conversion: a feed of 65,536 in-memory rows (32 float features,
//!   a 3×32×32 image as bytes → float32/255, a label) into batches of 256 on
//!   the CPU device, next to a hand-written loop filling the same buffers.
//!
//! ```sh
//! cargo bench --bench hot_paths
//! ```

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, FixedSizeListArray, Int64Array, ListArray,
    RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{Float32Type, Int32Type};
use datafusion::datasource::MemTable;
use sqlfeed::Session;
use sqlfeed::device::Device;
use sqlfeed::feed::{ColumnSpec, Feed};
use sqlfeed::shuffle::row_key_hash;
use xxhash_rust::xxh3::xxh3_64_with_seed;

const KEY_ROWS: usize = 8192;
const FEED_ROWS: usize = 65_536;
const PIXELS: usize = 3 * 32 * 32;

fn features(rows: usize) -> ArrayRef {
    Arc::new(
        FixedSizeListArray::from_iter_primitive::<Float32Type, _, _>(
            (0..rows)
                .map(|r| Some((0..32).map(move |j| Some((r * 31 + j) as f32 * 0.01)))),
            32,
        ),
    )
}

fn images(rows: usize) -> ArrayRef {
    let blobs: Vec<Vec<u8>> = (0..rows)
        .map(|r| (0..PIXELS).map(|p| (r * 7 + p) as u8).collect())
        .collect();
    Arc::new(BinaryArray::from_iter_values(
        blobs.iter().map(|b| b.as_slice()),
    ))
}

fn image_tensors(rows: usize) -> ArrayRef {
    Arc::new(
        FixedSizeListArray::from_iter_primitive::<Float32Type, _, _>(
            (0..rows).map(|r| {
                Some((0..PIXELS).map(move |p| Some(((r + p) % 255) as f32 / 255.0)))
            }),
            PIXELS as i32,
        ),
    )
}

fn text(rows: usize) -> Vec<ArrayRef> {
    let captions: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..rows).map(|r| format!("a shape number {r} on a coloured background")),
    ));
    let tokens: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
        (0..rows)
            .map(|r| Some((0..(8 + r % 57)).map(move |t| Some((r * 13 + t) as i32)))),
    ));
    vec![captions, tokens]
}

/// The floor: one xxh3 call per row over the row's bytes of a
/// fixed-size-list-of-float32 column.
fn hash_rows_floor(column: &ArrayRef) -> u64 {
    let list = column.as_fixed_size_list();
    let width = list.value_length() as usize * 4;
    let values = list.values().as_primitive::<Float32Type>();
    let bytes = values.values().inner().as_slice();
    (0..list.len())
        .map(|r| {
            let start = list.value_offset(r) as usize * 4;
            xxh3_64_with_seed(&bytes[start..start + width], 7)
        })
        .fold(0, u64::wrapping_add)
}

fn shuffle_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("shuffle_key_8192");
    group.throughput(Throughput::Elements(KEY_ROWS as u64));
    let dense = vec![features(KEY_ROWS)];
    let tensors = vec![image_tensors(KEY_ROWS)];
    let text = text(KEY_ROWS);
    group.bench_function("features_32xf32", |b| {
        b.iter(|| black_box(row_key_hash(&dense, 7).expect("hashes")))
    });
    group.bench_function("features_floor_xxh3", |b| {
        b.iter(|| black_box(hash_rows_floor(&dense[0])))
    });
    group.bench_function("image_tensor_3072xf32", |b| {
        b.iter(|| black_box(row_key_hash(&tensors, 7).expect("hashes")))
    });
    group.bench_function("image_tensor_floor_xxh3", |b| {
        b.iter(|| black_box(hash_rows_floor(&tensors[0])))
    });
    group.bench_function("caption_and_tokens", |b| {
        b.iter(|| black_box(row_key_hash(&text, 7).expect("hashes")))
    });
    group.finish();
}

/// The hand-written conversion: every batch of 256 rows into a features,
/// an image and a label buffer.
fn plain_conversion(
    batch: &RecordBatch,
    x: &mut [f32],
    img: &mut [f32],
    y: &mut [i64],
) -> usize {
    let features = batch.column(0).as_fixed_size_list();
    let feature_values = features.values().as_primitive::<Float32Type>();
    let images = batch.column(1).as_binary::<i32>();
    let labels = batch
        .column(2)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
    let mut batches = 0;
    for start in (0..batch.num_rows()).step_by(256) {
        let rows = 256.min(batch.num_rows() - start);
        for r in 0..rows {
            let row = start + r;
            x[r * 32..(r + 1) * 32]
                .copy_from_slice(&feature_values.values()[row * 32..(row + 1) * 32]);
            for (out, &pixel) in img[r * PIXELS..(r + 1) * PIXELS]
                .iter_mut()
                .zip(images.value(row))
            {
                *out = f32::from(pixel) / 255.0;
            }
            y[r] = labels.value(row);
        }
        batches += 1;
    }
    batches
}

fn tensor_feed(c: &mut Criterion) {
    let batch = RecordBatch::try_from_iter(vec![
        ("x", features(FEED_ROWS)),
        ("img", images(FEED_ROWS)),
        (
            "y",
            Arc::new(Int64Array::from_iter_values(0..FEED_ROWS as i64)) as ArrayRef,
        ),
    ])
    .expect("batch");
    let session = Session::builder()
        .target_partitions(2)
        .build()
        .expect("session");
    let chunks: Vec<RecordBatch> = (0..FEED_ROWS)
        .step_by(8192)
        .map(|start| batch.slice(start, 8192))
        .collect();
    let table = MemTable::try_new(
        batch.schema(),
        vec![chunks[..4].to_vec(), chunks[4..].to_vec()],
    )
    .expect("table");
    session
        .context()
        .register_table("t", Arc::new(table))
        .expect("registered");
    let (_, image) =
        ColumnSpec::parse_named("img:dtype=float32,shape=3x32x32,scale=1/255")
            .expect("spec");

    let mut group = c.benchmark_group("tensor_feed_65536");
    group.throughput(Throughput::Elements(FEED_ROWS as u64));
    group.sample_size(10);
    group.bench_function("feed_cpu_batches_of_256", |b| {
        b.iter(|| {
            let feed = Feed::builder(&session, "SELECT x, img, y FROM t")
                .batch_size(256)
                .column("img", image.clone())
                .device(Device::Cpu)
                .build()
                .expect("feed");
            let mut rows = 0;
            for batch in feed {
                rows += batch.expect("batch").rows();
            }
            black_box(rows)
        })
    });
    let mut x = vec![0f32; 256 * 32];
    let mut img = vec![0f32; 256 * PIXELS];
    let mut y = vec![0i64; 256];
    group.bench_function("plain_loop_same_buffers", |b| {
        b.iter(|| black_box(plain_conversion(&batch, &mut x, &mut img, &mut y)))
    });
    group.finish();
}

criterion_group!(benches, shuffle_key, tensor_feed);
criterion_main!(benches);
