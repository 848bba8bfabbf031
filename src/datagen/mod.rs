//! `sqlfeed gen`: a deterministic synthetic training set as Parquet.
//!
//! The README, examples, tests and benchmarks all run on this data, so it has
//! what a real training set has: ids, a class label, dense numeric features,
//! small images as real PNG and JPEG bytes, a text caption and variable-length
//! token lists, plus a nullable column.
//!
//! | column       | type          | content                                              |
//! |--------------|---------------|------------------------------------------------------|
//! | `id`         | int64         | global row id, `0..rows` across files                |
//! | `label`      | int32         | class `0..10`; decides the shape drawn in the image  |
//! | `f0..f{F-1}` | float32       | `f_j ~ Normal(0.5·j, 1 + 0.1·j)` (in `_meta.json`)   |
//! | `weight`     | float64, null | uniform `[0, 1)`, NULL in ~10% of rows               |
//! | `image_png`  | binary        | RGB `S×S` PNG: gradient background + a shape         |
//! | `image_jpeg` | binary        | the same picture as a baseline JPEG (quality 90)     |
//! | `caption`    | utf8          | e.g. `"a red square on a blue background"`           |
//! | `tokens`     | `list<int32>` | length uniform in `[8, 64]`, values in `[0, 32000)`  |
//!
//! # Determinism
//! Every value comes from SplitMix64 streams seeded by `(seed, file index)`;
//! the Parquet writer's `created_by` is fixed and every encoder is
//! deterministic, so the same options give byte-identical files on any
//! machine and any number of threads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use datafusion::arrow::array::{
    ArrayRef, BinaryBuilder, Float32Array, Float64Array, Int32Array, Int32Builder,
    Int64Array, ListBuilder, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::plan_err;
use datafusion::common::{exec_datafusion_err, internal_datafusion_err, internal_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};

use crate::rand::{SplitMix64, splitmix64};

/// Options of `sqlfeed gen`.
#[derive(Debug, Clone)]
pub struct GenOptions {
    /// Total rows over all files.
    pub rows: u64,
    /// Output directory (created if missing).
    pub out: PathBuf,
    /// Number of Parquet files the rows are split into.
    pub files: usize,
    /// Seed of every random value.
    pub seed: u64,
    /// Number of float32 feature columns.
    pub features: usize,
    /// Side length of the square images, in pixels.
    pub image_size: u32,
    /// Rows per Parquet row group.
    pub row_group_rows: usize,
}

impl GenOptions {
    /// Defaults for `rows` rows written to `out`.
    pub fn new(rows: u64, out: impl Into<PathBuf>) -> Self {
        Self {
            rows,
            out: out.into(),
            files: 4,
            seed: 42,
            features: 8,
            image_size: 32,
            row_group_rows: 8192,
        }
    }
}

/// What [`generate`] wrote.
#[derive(Debug, Clone)]
pub struct GenSummary {
    /// The Parquet files, in order.
    pub files: Vec<PathBuf>,
    /// Total rows written.
    pub rows: u64,
    /// Total bytes of the Parquet files.
    pub bytes: u64,
}

impl std::fmt::Display for GenSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rows in {} files ({:.1} MB)",
            self.rows,
            self.files.len(),
            self.bytes as f64 / 1e6
        )
    }
}

/// Mean of feature `j`.
pub fn feature_mean(j: usize) -> f64 {
    0.5 * j as f64
}

/// Standard deviation of feature `j`.
pub fn feature_std(j: usize) -> f64 {
    1.0 + 0.1 * j as f64
}

const COLORS: [(&str, [u8; 3]); 8] = [
    ("red", [220, 40, 40]),
    ("green", [40, 180, 60]),
    ("blue", [40, 70, 220]),
    ("yellow", [230, 210, 40]),
    ("purple", [140, 50, 170]),
    ("orange", [240, 140, 30]),
    ("white", [245, 245, 245]),
    ("black", [15, 15, 15]),
];
const SHAPES: [&str; 5] = ["square", "circle", "cross", "stripe", "diamond"];
const VOCAB: i32 = 32_000;
const MIN_TOKENS: u64 = 8;
const MAX_TOKENS: u64 = 64;

/// The schema of generated files for `features` feature columns.
pub fn schema(features: usize) -> SchemaRef {
    let mut fields = vec![
        Field::new("id", DataType::Int64, false),
        Field::new("label", DataType::Int32, false),
    ];
    fields.extend(
        (0..features).map(|j| Field::new(format!("f{j}"), DataType::Float32, false)),
    );
    fields.extend([
        Field::new("weight", DataType::Float64, true),
        Field::new("image_png", DataType::Binary, false),
        Field::new("image_jpeg", DataType::Binary, false),
        Field::new("caption", DataType::Utf8, false),
        Field::new(
            "tokens",
            DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true))),
            false,
        ),
    ]);
    Arc::new(Schema::new(fields))
}

/// Writes the data set; see the module docs.
pub fn generate(options: &GenOptions) -> Result<GenSummary> {
    if options.files == 0 {
        return plan_err!("gen: --files must be at least 1");
    }
    if options.image_size == 0 || options.image_size > 4096 {
        return plan_err!(
            "gen: --image-size must be in 1..=4096, got {}",
            options.image_size
        );
    }
    std::fs::create_dir_all(&options.out).map_err(|e| io_error(&options.out, e))?;
    let plan: Vec<(usize, u64, u64)> = (0..options.files)
        .map(|i| {
            let start = options.rows * i as u64 / options.files as u64;
            let end = options.rows * (i as u64 + 1) / options.files as u64;
            (i, start, end - start)
        })
        .collect();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(options.files);
    let results: Vec<Result<Vec<(usize, PathBuf, u64)>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut written = Vec::new();
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(file, start, rows)) = plan.get(index) else {
                            return Ok(written);
                        };
                        let path = options.out.join(format!("part-{file:05}.parquet"));
                        let bytes = write_file(options, &path, file, start, rows)?;
                        written.push((file, path, bytes));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| internal_err!("a gen worker thread panicked"))
            })
            .collect()
    });
    let mut files = Vec::new();
    for result in results {
        files.extend(result?);
    }
    files.sort_by_key(|(file, _, _)| *file);
    write_meta(options)?;
    Ok(GenSummary {
        bytes: files.iter().map(|(_, _, bytes)| bytes).sum(),
        files: files.into_iter().map(|(_, path, _)| path).collect(),
        rows: options.rows,
    })
}

fn io_error(path: &Path, e: std::io::Error) -> DataFusionError {
    exec_datafusion_err!("gen: cannot write '{}': {e}", path.display())
}

fn write_file(
    options: &GenOptions,
    path: &Path,
    file: usize,
    start: u64,
    rows: u64,
) -> Result<u64> {
    let schema = schema(options.features);
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_max_row_group_row_count(Some(options.row_group_rows.max(1)))
        .set_created_by("sqlfeed gen".to_string())
        .build();
    let out = std::fs::File::create(path).map_err(|e| io_error(path, e))?;
    let mut writer = ArrowWriter::try_new(out, Arc::clone(&schema), Some(props))?;
    // Each file's stream starts at a hashed point: seeded `seed ^ k·γ`
    // (SplitMix64's own increment), file k's draws were file 0's shifted by
    // about k, and 7% of an 80,000-row set repeated another row.
    let mut rng = SplitMix64::new(crate::rand::splitmix64(
        options.seed ^ crate::rand::splitmix64(file as u64),
    ));
    let chunk = 4096u64;
    let mut done = 0;
    while done < rows {
        let n = chunk.min(rows - done);
        let batch = make_batch(options, &schema, &mut rng, start + done, n)?;
        writer.write(&batch)?;
        done += n;
    }
    writer.close()?;
    Ok(std::fs::metadata(path)
        .map_err(|e| io_error(path, e))?
        .len())
}

fn make_batch(
    options: &GenOptions,
    schema: &SchemaRef,
    rng: &mut SplitMix64,
    first_id: u64,
    rows: u64,
) -> Result<RecordBatch> {
    let n = rows as usize;
    let ids: Int64Array = (first_id..first_id + rows).map(|i| i as i64).collect();
    let labels: Vec<i32> = (0..n).map(|_| rng.below(10) as i32).collect();
    let mut columns: Vec<ArrayRef> =
        vec![Arc::new(ids), Arc::new(Int32Array::from(labels.clone()))];
    for j in 0..options.features {
        let (mean, std) = (feature_mean(j), feature_std(j));
        let values: Float32Array =
            (0..n).map(|_| (mean + std * normal(rng)) as f32).collect();
        columns.push(Arc::new(values));
    }
    let weights: Float64Array = (0..n)
        .map(|_| {
            let w = rng.unit();
            (rng.below(10) != 0).then_some(w)
        })
        .collect();
    columns.push(Arc::new(weights));

    let side = options.image_size;
    let mut pngs = BinaryBuilder::new();
    let mut jpegs = BinaryBuilder::new();
    let mut captions = Vec::with_capacity(n);
    let mut pixels = vec![0u8; (side * side * 3) as usize];
    for &label in &labels {
        let fg = rng.below(COLORS.len() as u64) as usize;
        let bg = (fg + 1 + rng.below(COLORS.len() as u64 - 1) as usize) % COLORS.len();
        let shape = label as usize % SHAPES.len();
        draw(&mut pixels, side, COLORS[bg].1, COLORS[fg].1, shape, rng);
        pngs.append_value(encode_png(&pixels, side)?);
        jpegs.append_value(encode_jpeg(&pixels, side)?);
        let article = if COLORS[fg].0.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        let bg_article = if COLORS[bg].0.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        captions.push(format!(
            "{article} {} {} on {bg_article} {} background",
            COLORS[fg].0, SHAPES[shape], COLORS[bg].0
        ));
    }
    columns.push(Arc::new(pngs.finish()));
    columns.push(Arc::new(jpegs.finish()));
    columns.push(Arc::new(StringArray::from(captions)));

    let mut tokens = ListBuilder::new(Int32Builder::new());
    for _ in 0..n {
        let len = MIN_TOKENS + rng.below(MAX_TOKENS - MIN_TOKENS + 1);
        for _ in 0..len {
            tokens.values().append_value(rng.below(VOCAB as u64) as i32);
        }
        tokens.append(true);
    }
    let tokens = tokens.finish();
    // ListBuilder names its item field "item" and makes it nullable, as `schema()` does.
    columns.push(Arc::new(tokens));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Gradient background in `bg`, a `shape` in `fg` at a random place, mild noise.
fn draw(
    pixels: &mut [u8],
    side: u32,
    bg: [u8; 3],
    fg: [u8; 3],
    shape: usize,
    rng: &mut SplitMix64,
) {
    let s = side as i64;
    let size = (s / 3).max(1);
    let cx = size + rng.below((s - 2 * size).max(1) as u64) as i64;
    let cy = size + rng.below((s - 2 * size).max(1) as u64) as i64;
    let noise_seed = rng.next_u64();
    for y in 0..s {
        for x in 0..s {
            let (dx, dy) = (x - cx, y - cy);
            let inside = match shape {
                0 => dx.abs() <= size / 2 && dy.abs() <= size / 2,
                1 => dx * dx + dy * dy <= (size / 2) * (size / 2),
                2 => dx.abs() <= size / 6 || dy.abs() <= size / 6,
                3 => (x + y) % 6 < 3,
                _ => dx.abs() + dy.abs() <= size / 2,
            };
            let base = if inside { fg } else { bg };
            let shade = ((x + y) * 40 / (2 * s).max(1)) as i32 - 20;
            let noise = (splitmix64(noise_seed ^ (y * s + x) as u64) % 9) as i32 - 4;
            let offset = ((y * s + x) * 3) as usize;
            for c in 0..3 {
                let v = base[c] as i32 + if inside { noise } else { shade + noise };
                pixels[offset + c] = v.clamp(0, 255) as u8;
            }
        }
    }
}

/// Standard normal by Box–Muller (one draw per call keeps the stream simple).
fn normal(rng: &mut SplitMix64) -> f64 {
    let u1 = 1.0 - rng.unit();
    let u2 = rng.unit();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn encode_png(pixels: &[u8], side: u32) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    PngEncoder::new(&mut out)
        .write_image(pixels, side, side, ExtendedColorType::Rgb8)
        .map_err(|e| internal_datafusion_err!("gen: PNG encoding failed: {e}"))?;
    Ok(out)
}

fn encode_jpeg(pixels: &[u8], side: u32) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, 90)
        .write_image(pixels, side, side, ExtendedColorType::Rgb8)
        .map_err(|e| internal_datafusion_err!("gen: JPEG encoding failed: {e}"))?;
    Ok(out)
}

fn write_meta(options: &GenOptions) -> Result<()> {
    let list = |f: fn(usize) -> f64| {
        (0..options.features)
            .map(|j| format!("{}", f(j)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let meta = format!(
        "{{\"rows\": {}, \"files\": {}, \"seed\": {}, \"features\": {}, \"image_size\": {}, \
         \"feature_mean\": [{}], \"feature_std\": [{}]}}\n",
        options.rows,
        options.files,
        options.seed,
        options.features,
        options.image_size,
        list(feature_mean),
        list(feature_std)
    );
    let path = options.out.join("_meta.json");
    std::fs::write(&path, meta).map_err(|e| io_error(&path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut a = GenOptions::new(300, dir.path().join("a"));
        a.files = 2;
        let mut b = a.clone();
        b.out = dir.path().join("b");
        let mut c = a.clone();
        c.out = dir.path().join("c");
        c.seed = 7;
        let (sa, sb, sc) = (generate(&a)?, generate(&b)?, generate(&c)?);
        for ((fa, fb), fc) in sa.files.iter().zip(&sb.files).zip(&sc.files) {
            let (ba, bb, bc) =
                (std::fs::read(fa)?, std::fs::read(fb)?, std::fs::read(fc)?);
            assert_eq!(ba, bb, "{} differs between runs", fa.display());
            assert_ne!(ba, bc, "seed did not change {}", fc.display());
        }
        assert_eq!(sa.rows, 300);
        Ok(())
    }

    /// No row repeats another one, across files either: a data set with
    /// accidental copies would exercise a shuffle's copy numbering where
    /// the user's data has none (and did, before each file's stream was
    /// seeded at a hashed point).
    #[test]
    fn rows_do_not_repeat_across_files() -> Result<()> {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::datatypes::Float32Type;
        let dir = tempfile::tempdir()?;
        let mut options = GenOptions::new(4000, dir.path().to_path_buf());
        options.files = 8;
        options.image_size = 8;
        let mut seen = std::collections::HashSet::new();
        for file in generate(&options)?.files {
            let reader = datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(
                std::fs::File::open(&file)?,
                1024,
            )?;
            for batch in reader {
                let batch = batch?;
                let feature = |name: &str| -> Result<Vec<u32>> {
                    let column = batch.column_by_name(name).ok_or_else(|| {
                        datafusion::common::internal_datafusion_err!("no {name}")
                    })?;
                    let values = column.as_primitive::<Float32Type>().values();
                    Ok(values.iter().map(|v| v.to_bits()).collect())
                };
                let (f0, f1) = (feature("f0")?, feature("f1")?);
                for (a, b) in f0.into_iter().zip(f1) {
                    assert!(seen.insert((a, b)), "({a:#x}, {b:#x}) repeats in {file:?}");
                }
            }
        }
        assert_eq!(seen.len(), 4000);
        Ok(())
    }
}
