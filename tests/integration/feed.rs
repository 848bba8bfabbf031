//! Training feeds: exact batches, DDP shards, resume, tensor values,
//! cancellation and bad input, on the CPU backend (the CUDA backend runs the
//! same code path through `scripts/gpu-check.sh`).

use std::collections::HashSet;
use std::path::Path;

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, FixedSizeListArray, Float32Array, Int32Array,
    Int64Array, ListArray, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{Float32Type, Int32Type};
use datafusion::error::Result;
use sqlfeed::device::{DType, Device};
use sqlfeed::feed::{ColumnSpec, Feed, FeedBuilder};

use crate::common::{
    arc, assert_contains, budget_session, digest_lines, generated, run,
    sized_session as session, sqlfeed, succeeded, write_parquet,
};

/// `ids` of every batch of a feed of `SELECT id …`, as (epoch, step, ids).
fn id_batches(builder: FeedBuilder) -> Result<Vec<(u64, u64, Vec<i64>)>> {
    let mut out = vec![];
    for batch in builder.device(Device::Cpu).build()? {
        let batch = batch?;
        let ids = batch.tensor("id")?.as_slice::<i64>()?.to_vec();
        assert_eq!(batch.tensor("id")?.shape(), &[batch.rows()]);
        out.push((batch.epoch(), batch.step(), ids));
    }
    Ok(out)
}

/// 1000 ids in 5 Parquet files of 200 rows each.
fn id_files(dir: &Path) -> Result<String> {
    for file in 0..5 {
        let ids = Int64Array::from_iter_values(file * 200..(file + 1) * 200);
        let batch = RecordBatch::try_from_iter(vec![("id", arc(ids))])?;
        write_parquet(&dir.join(format!("part-{file}.parquet")), &batch)?;
    }
    Ok(format!("{}/*.parquet", dir.display()))
}

#[test]
fn exact_batches_across_record_batch_and_file_boundaries() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = id_files(dir.path())?;
    // Record batches of 7 rows, 5 files, 2 partitions: no batch boundary
    // lines up with a batch of 64.
    let session = session(2, 7)?;
    let sql = format!("SELECT id FROM '{files}'");
    let keep = id_batches(Feed::builder(&session, &sql).batch_size(64))?;
    let sizes: Vec<usize> = keep.iter().map(|(_, _, ids)| ids.len()).collect();
    assert_eq!(sizes.len(), 16);
    assert!(sizes[..15].iter().all(|&n| n == 64), "{sizes:?}");
    assert_eq!(sizes[15], 1000 - 15 * 64, "the last partial batch");
    let mut all: Vec<i64> = keep.iter().flat_map(|(_, _, ids)| ids.clone()).collect();
    all.sort();
    assert_eq!(all, (0..1000).collect::<Vec<_>>());
    let steps: Vec<u64> = keep.iter().map(|(_, step, _)| *step).collect();
    assert_eq!(steps, (0..16).collect::<Vec<_>>());

    let dropped =
        id_batches(Feed::builder(&session, &sql).batch_size(64).drop_last(true))?;
    assert_eq!(dropped.len(), 15);
    assert_eq!(
        dropped,
        keep[..15].to_vec(),
        "drop_last only drops the tail"
    );

    // The unshuffled order is deterministic: the same run twice is equal.
    assert_eq!(
        id_batches(Feed::builder(&session, &sql).batch_size(64))?,
        keep
    );
    Ok(())
}

/// (epoch, step, last_in_epoch, next_position) of every batch.
type EpochMarks = Vec<(u64, u64, bool, (u64, u64))>;

fn epoch_marks(builder: FeedBuilder) -> Result<EpochMarks> {
    let mut out = vec![];
    for batch in builder.device(Device::Cpu).build()? {
        let batch = batch?;
        out.push((
            batch.epoch(),
            batch.step(),
            batch.is_last_in_epoch(),
            batch.next_position(),
        ));
    }
    Ok(out)
}

/// Issue 35: a consumer that stops after an epoch's last batch without
/// asking for another (Lightning, a loop of `len` steps) must be at the next
/// epoch's start, so every batch says whether it is its epoch's last.
#[test]
fn every_batch_knows_whether_it_ends_its_epoch() -> Result<()> {
    let dir = generated(1000, 3)?;
    // Record batches of 7 rows: chunk ends never line up with them.
    let session = session(2, 7)?;
    let sql = format!(
        "SELECT id, tokens FROM '{}/*.parquet'",
        dir.path().display()
    );
    let check = |builder: FeedBuilder, what: &str| -> Result<()> {
        let marks = epoch_marks(builder.epochs(2))?;
        for epoch in 0..2 {
            let steps: Vec<_> = marks.iter().filter(|m| m.0 == epoch).collect();
            assert!(!steps.is_empty(), "{what}: epoch {epoch} has batches");
            for (i, &&(e, step, last, next)) in steps.iter().enumerate() {
                let expect_last = i + 1 == steps.len();
                assert_eq!(last, expect_last, "{what}: epoch {e} step {step}");
                let expect_next = if last { (e + 1, 0) } else { (e, step + 1) };
                assert_eq!(next, expect_next, "{what}: epoch {e} step {step}");
            }
        }
        Ok(())
    };
    for (world, batch) in [(1, 64), (3, 50), (4, 250), (1, 1000), (2, 7)] {
        for drop_last in [false, true] {
            for rank in [0, world - 1] {
                let what = format!("W={world} r={rank} B={batch} drop_last={drop_last}");
                let feed = || {
                    Feed::builder(&session, &sql)
                        .batch_size(batch)
                        .shard(rank, world)
                        .drop_last(drop_last)
                };
                check(feed(), &what)?;
                check(feed().shuffle(5), &format!("{what} shuffled"))?;
                check(
                    feed().shuffle(5).bucket_by_length(3),
                    &format!("{what} bucketed"),
                )?;
            }
        }
    }
    for world in [1, 3] {
        let tokens = || Feed::builder(&session, &sql).shard(0, world).shuffle(2);
        check(
            tokens().batch_tokens(4096),
            &format!("token budget, W={world}"),
        )?;
    }

    // Resuming at the position after an epoch's last batch is the next
    // epoch's start, in old checkpoints' form (epoch, steps) too.
    let feed = || {
        Feed::builder(&session, &sql)
            .batch_size(64)
            .shuffle(5)
            .epochs(3)
    };
    let whole = epoch_marks(feed())?;
    let steps = whole.iter().filter(|m| m.0 == 0).count() as u64;
    assert_eq!(steps, 16);
    let from_next = epoch_marks(feed().resume_at(1, 0))?;
    assert_eq!(from_next, epoch_marks(feed().resume_at(0, steps))?);
    assert_eq!(from_next, whole[steps as usize..].to_vec());
    Ok(())
}

#[test]
fn shards_are_disjoint_cover_the_epoch_and_have_equal_batch_counts() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = id_files(dir.path())?;
    let session = session(2, 50)?;
    let sql = format!("SELECT id FROM '{files}'");
    for world in [1usize, 2, 3, 5, 8] {
        for drop_last in [true, false] {
            let shards = (0..world)
                .map(|rank| {
                    id_batches(
                        Feed::builder(&session, &sql)
                            .shuffle(7)
                            .batch_size(48)
                            .drop_last(drop_last)
                            .shard(rank, world),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let counts: Vec<usize> = shards.iter().map(Vec::len).collect();
            assert!(
                counts.iter().all(|&c| c == counts[0]),
                "world {world}: {counts:?}"
            );
            let rows: Vec<i64> = shards
                .iter()
                .flatten()
                .flat_map(|(_, _, ids)| ids.clone())
                .collect();
            let distinct: HashSet<i64> = rows.iter().copied().collect();
            let chunk = 48 * world;
            if drop_last {
                assert_eq!(rows.len(), distinct.len(), "disjoint (world {world})");
                assert_eq!(rows.len(), 1000 / chunk * chunk);
                // Every rank's batch has exactly 48 rows.
                assert!(shards.iter().flatten().all(|(_, _, ids)| ids.len() == 48));
            } else {
                assert_eq!(distinct.len(), 1000, "covered (world {world})");
                assert!(rows.len() - 1000 < world, "at most W-1 repeats");
            }
        }
    }
    Ok(())
}

#[test]
fn shuffled_feed_is_the_same_for_any_partitioning_and_differs_per_epoch() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let files = id_files(dir.path())?;
    let sql = format!("SELECT id FROM '{files}'");
    let run = |partitions: usize, batch: usize| {
        id_batches(
            Feed::builder(&session(partitions, batch)?, &sql)
                .shuffle(42)
                .batch_size(100)
                .epochs(2),
        )
    };
    let reference = run(1, 1000)?;
    assert_eq!(reference.len(), 20);
    assert_eq!(run(2, 7)?, reference);
    assert_eq!(run(8, 64)?, reference);
    let epoch0: Vec<i64> = reference[..10].iter().flat_map(|b| b.2.clone()).collect();
    let epoch1: Vec<i64> = reference[10..].iter().flat_map(|b| b.2.clone()).collect();
    assert_ne!(epoch0, epoch1);
    assert_ne!(epoch0, (0..1000).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn resume_in_a_new_process_equals_the_uninterrupted_run_byte_for_byte() -> Result<()> {
    let dir = generated(1500, 3)?;
    let sql = format!(
        "SELECT id, f0 * 2 AS x, tokens, image_to_tensor(image_decode(image_png)) AS img \
         FROM '{}/*.parquet'",
        dir.path().display()
    );
    let feed = |extra: &[&str]| {
        let out = succeeded(run(sqlfeed()
            .args([
                "--target-partitions",
                "2",
                "feed",
                &sql,
                "--batch-size",
                "64",
            ])
            .args([
                "--shuffle-seed",
                "9",
                "--epochs",
                "3",
                "--device",
                "cpu",
                "--digest",
            ])
            .args(extra)));
        digest_lines(&out)
    };
    let full = feed(&[]);
    assert_eq!(full.len(), 3 * 1500usize.div_ceil(64));
    let at = full
        .iter()
        .position(|l| l.starts_with("batch epoch=1 step=5 "))
        .expect("epoch 1 step 5 exists");
    assert_eq!(feed(&["--resume", "1:5"]), full[at..].to_vec());
    // A sharded resume resumes the shard.
    let rank1 = feed(&["--shard", "1/2"]);
    let at = rank1
        .iter()
        .position(|l| l.starts_with("batch epoch=2 step=3 "))
        .expect("epoch 2 step 3 exists");
    assert_eq!(
        feed(&["--shard", "1/2", "--resume", "2:3"]),
        rank1[at..].to_vec()
    );
    Ok(())
}

#[test]
fn tensors_hold_the_columns_values() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let list = |rows: Vec<Option<Vec<i32>>>| -> ArrayRef {
        arc(ListArray::from_iter_primitive::<Int32Type, _, _>(
            rows.into_iter()
                .map(|r| r.map(|v| v.into_iter().map(Some).collect::<Vec<_>>())),
        ))
    };
    let fixed = FixedSizeListArray::from_iter_primitive::<Float32Type, _, _>(
        (0..3).map(|i| Some(vec![Some(i as f32), Some(-(i as f32))])),
        2,
    );
    let batch = RecordBatch::try_from_iter(vec![
        ("y", arc(Int32Array::from(vec![3, 1, 2]))),
        ("x", arc(Float32Array::from(vec![0.5, 1.5, -2.0]))),
        ("v", arc(fixed)),
        (
            "tokens",
            list(vec![Some(vec![7, 8, 9]), Some(vec![]), Some(vec![5])]),
        ),
        (
            "pixels",
            arc(BinaryArray::from_vec(vec![
                &[0u8, 255, 51, 102],
                &[255, 0, 0, 0],
                &[1, 2, 3, 4],
            ])),
        ),
    ])?;
    write_parquet(&dir.path().join("t.parquet"), &batch)?;
    let session = session(1, 8192)?;
    let sql = format!(
        "SELECT y, x, v, tokens, pixels, tokens AS ids FROM '{}/t.parquet'",
        dir.path().display()
    );
    let mut feed = Feed::builder(&session, &sql)
        .batch_size(3)
        .device(Device::Cpu)
        .column(
            "pixels",
            ColumnSpec::new()
                .dtype(DType::Float32)
                .shape([2, 2])
                .scale(1.0 / 255.0),
        )
        .column(
            "ids",
            ColumnSpec::new()
                .dtype(DType::Int32)
                .pad_to(2)
                .pad_value(-1.0),
        )
        .column("x", ColumnSpec::new().dtype(DType::BFloat16))
        .build()?;
    let names: Vec<String> = feed.tensors().iter().map(|t| t.name.clone()).collect();
    assert_eq!(
        names,
        [
            "y",
            "x",
            "v",
            "tokens",
            "tokens_mask",
            "pixels",
            "ids",
            "ids_mask"
        ]
    );
    let batch = feed.next().expect("one batch")?;
    assert!(feed.next().is_none());
    assert_eq!(batch.tensor("y")?.as_slice::<i64>()?, &[3, 1, 2]);
    let x: Vec<f32> = batch
        .tensor("x")?
        .as_slice::<sqlfeed::device::bf16>()?
        .iter()
        .map(|v| v.to_f32())
        .collect();
    assert_eq!(x, [0.5, 1.5, -2.0]);
    let v = batch.tensor("v")?;
    assert_eq!((v.shape(), v.strides()), (&[3, 2][..], vec![2, 1]));
    assert_eq!(v.as_slice::<f32>()?, &[0., -0., 1., -1., 2., -2.]);
    let tokens = batch.tensor("tokens")?;
    assert_eq!(tokens.shape(), &[3, 3], "padded to the longest row");
    assert_eq!(tokens.as_slice::<i64>()?, &[7, 8, 9, 0, 0, 0, 5, 0, 0]);
    assert_eq!(
        batch.tensor("tokens_mask")?.as_slice::<u8>()?,
        &[1, 1, 1, 0, 0, 0, 1, 0, 0]
    );
    let pixels = batch.tensor("pixels")?;
    assert_eq!(pixels.shape(), &[3, 2, 2]);
    let expected: Vec<f32> = [0u8, 255, 51, 102, 255, 0, 0, 0, 1, 2, 3, 4]
        .iter()
        .map(|&p| p as f32 * (1.0f64 / 255.0) as f32)
        .collect();
    assert_eq!(pixels.as_slice::<f32>()?, expected.as_slice());
    let ids = batch.tensor("ids")?;
    assert_eq!((ids.dtype(), ids.shape()), (DType::Int32, &[3, 2][..]));
    assert_eq!(
        ids.as_slice::<i32>()?,
        &[7, 8, -1, -1, 5, -1],
        "truncated and padded"
    );
    assert_eq!(
        batch.tensor("ids_mask")?.as_slice::<u8>()?,
        &[1, 1, 0, 0, 1, 0]
    );
    let err = batch.tensor("nope").unwrap_err().to_string();
    assert!(err.contains("tokens_mask"), "{err}");
    let report = feed.report();
    assert_eq!((report.batches, report.rows), (1, 3));
    let padding = report.padding_frac.expect("padded tensors");
    assert!((padding - 8.0 / 15.0).abs() < 1e-9, "{padding}");
    Ok(())
}

#[test]
fn decoded_images_become_nhwc_and_image_tensors_nchw() -> Result<()> {
    let dir = generated(20, 1)?;
    let session = session(1, 8192)?;
    let sql = format!(
        "SELECT image_decode(image_png) AS hwc, image_to_tensor(image_decode(image_png)) AS chw, \
         image_decode(image_png) AS raw FROM '{}/*.parquet'",
        dir.path().display()
    );
    let pixels_sql = format!(
        "SELECT image_decode(image_png)['pixels'] AS p FROM '{}/*.parquet'",
        dir.path().display()
    );
    let expected = tokio::runtime::Runtime::new()?
        .block_on(crate::common::collect(&session, &pixels_sql))?;
    let mut feed = Feed::builder(&session, &sql)
        .batch_size(20)
        .device(Device::Cpu)
        .build()?;
    let batch = feed.next().expect("a batch")?;
    let hwc = batch.tensor("hwc")?;
    assert_eq!(
        (hwc.dtype(), hwc.shape()),
        (DType::UInt8, &[20, 8, 8, 3][..])
    );
    let pixels: Vec<u8> = expected
        .iter()
        .flat_map(|b| {
            let binary = b
                .column(0)
                .as_any()
                .downcast_ref::<BinaryArray>()
                .expect("binary");
            (0..binary.len())
                .flat_map(|i| binary.value(i).to_vec())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(hwc.as_slice::<u8>()?, pixels.as_slice());
    let chw = batch.tensor("chw")?;
    assert_eq!(
        (chw.dtype(), chw.shape()),
        (DType::Float32, &[20, 3, 8, 8][..])
    );
    // CHW of row 0: channel c, pixel (y, x) = HWC[(y * 8 + x) * 3 + c] / 255.
    let values = chw.as_slice::<f32>()?;
    for (c, y, x) in [(0, 0, 0), (1, 3, 5), (2, 7, 7)] {
        let want = pixels[(y * 8 + x) * 3 + c] as f32 / 255.0;
        assert!((values[c * 64 + y * 8 + x] - want).abs() < 1e-6);
    }
    Ok(())
}

#[test]
fn dlpack_export_describes_the_tensor_and_keeps_its_slot() -> Result<()> {
    let session = session(1, 8192)?;
    let mut feed =
        Feed::builder(&session, "SELECT value AS v FROM generate_series(1, 12)")
            .batch_size(4)
            .prefetch(1)
            .device(Device::Cpu)
            .build()?;
    let batch = feed.next().expect("batch")?;
    let tensor = batch.tensor("v")?;
    let managed = tensor.to_dlpack()?;
    // SAFETY: `managed` is a live export; fields are read before the deleter.
    let dl = unsafe { &(*managed).dl_tensor };
    assert_eq!((dl.device.device_type, dl.device.device_id), (1, 0));
    assert_eq!((dl.dtype.code, dl.dtype.bits, dl.dtype.lanes), (0, 64, 1));
    assert_eq!(dl.ndim, 1);
    assert_eq!(dl.data, tensor.data_ptr());
    // SAFETY: the export owns `ndim` shape and stride values.
    assert_eq!(unsafe { (*dl.shape, *dl.strides) }, (4, 1));
    // SAFETY: reading 4 i64 the export points at, while it is alive.
    let values = unsafe { std::slice::from_raw_parts(dl.data.cast::<i64>(), 4) };
    assert_eq!(values, &[1, 2, 3, 4]);
    drop(batch);
    // With prefetch 1 there are 2 slots: the export still holds one, so the
    // producer can fill only the other; the feed keeps going regardless.
    let second = feed.next().expect("second batch")?;
    assert_eq!(second.tensor("v")?.as_slice::<i64>()?, &[5, 6, 7, 8]);
    drop(second);
    // SAFETY: the deleter of our export, called once.
    unsafe { ((*managed).deleter.expect("a deleter"))(managed) };
    let third = feed.next().expect("third batch")?;
    assert_eq!(third.tensor("v")?.as_slice::<i64>()?, &[9, 10, 11, 12]);
    Ok(())
}

#[test]
fn dropping_a_feed_mid_epoch_stops_everything() -> Result<()> {
    let dir = generated(20_000, 4)?;
    let session = session(2, 512)?;
    let sql = format!(
        "SELECT id, tokens, image_to_tensor(image_decode(image_png)) AS img FROM '{}/*.parquet'",
        dir.path().display()
    );
    let mut feed = Feed::builder(&session, &sql)
        .shuffle(1)
        .batch_size(32)
        .epochs(5)
        .device(Device::Cpu)
        .build()?;
    let probe = feed.probe();
    assert!(probe.threads_alive() > 0 || !Path::new("/proc/self/task").exists());
    let held = feed.next().expect("first batch")?;
    let _second = feed.next().expect("second batch")?;
    drop(feed);
    assert_eq!(probe.threads_alive(), 0, "feed threads left behind");
    assert_eq!(session.context().runtime_env().memory_pool.reserved(), 0);
    // A batch still held keeps its memory (and only it) alive, and stays valid.
    assert_eq!(held.tensor("id")?.shape(), &[32]);
    drop(held);
    drop(_second);
    assert!(probe.ring_released(), "slot ring left behind");
    Ok(())
}

#[test]
fn columns_that_cannot_be_tensors_are_build_errors() -> Result<()> {
    let dir = generated(10, 1)?;
    let files = format!("'{}/*.parquet'", dir.path().display());
    let session = session(1, 8192)?;
    for (sql, needles) in [
        (
            format!("SELECT id, caption FROM {files}"),
            vec!["column 'caption'", "Utf8", "tokenize"],
        ),
        (
            format!("SELECT make_array(tokens, tokens) AS nested FROM {files}"),
            vec!["column 'nested'", "List(List", "only lists of numbers"],
        ),
        (
            format!("SELECT id FROM {files} WHERE nope > 1"),
            vec!["nope"],
        ),
    ] {
        let err = Feed::builder(&session, &sql)
            .device(Device::Cpu)
            .build()
            .unwrap_err();
        let msg = err.to_string();
        assert!(needles.iter().all(|n| msg.contains(n)), "{sql}: {msg}");
    }
    let err = Feed::builder(&session, "SELECT 1 AS a")
        .shard(2, 2)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("shard 2/2"), "{err}");
    let err = Feed::builder(&session, "SELECT 1 AS a")
        .epochs(2)
        .resume_at(2, 0)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("epoch 2"), "{err}");
    Ok(())
}

#[test]
fn bad_values_name_the_column_and_row() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let batch = RecordBatch::try_from_iter(vec![
        (
            "w",
            arc(Float32Array::from(vec![Some(1.0), None, Some(3.0)])),
        ),
        ("big", arc(Int64Array::from(vec![1, 2, 300]))),
        ("name", arc(StringArray::from(vec!["a", "b", "c"]))),
    ])?;
    write_parquet(&dir.path().join("t.parquet"), &batch)?;
    let file = format!("'{}/t.parquet'", dir.path().display());
    let session = session(1, 8192)?;
    let first_error = |builder: FeedBuilder| -> String {
        match builder.device(Device::Cpu).build() {
            Err(err) => err.to_string(),
            Ok(feed) => feed
                .filter_map(|b| b.err())
                .map(|e| e.to_string())
                .next()
                .unwrap_or_default(),
        }
    };
    let err = first_error(
        Feed::builder(&session, format!("SELECT w FROM {file}")).batch_size(3),
    );
    assert_contains(&err, &["column 'w', row 1", "fill_null"]);
    let mut filled = Feed::builder(&session, format!("SELECT w FROM {file}"))
        .batch_size(3)
        .device(Device::Cpu)
        .column("w", ColumnSpec::new().fill_null(-1.0))
        .build()?;
    assert_eq!(
        filled
            .next()
            .expect("batch")?
            .tensor("w")?
            .as_slice::<f32>()?,
        &[1., -1., 3.]
    );
    let err = first_error(
        Feed::builder(&session, format!("SELECT big FROM {file}"))
            .batch_size(3)
            .column("big", ColumnSpec::new().dtype(DType::UInt8)),
    );
    assert_contains(&err, &["column 'big', row 2", "300"]);
    let err = first_error(
        Feed::builder(&session, format!("SELECT make_array(big) AS l FROM {file}"))
            .batch_size(3)
            .column("l", ColumnSpec::new().shape([2])),
    );
    assert_contains(&err, &["column 'l', row 0", "1 values"]);
    Ok(())
}

#[test]
fn cuda_without_a_gpu_is_a_clear_error() -> Result<()> {
    let session = session(1, 8192)?;
    let result = Feed::builder(&session, "SELECT 1 AS a")
        .device(Device::Cuda(0))
        .build();
    let required = std::env::var("SQLFEED_TEST_CUDA").is_ok_and(|v| v == "require");
    match result {
        // On a machine with a GPU, the same feed runs there.
        Ok(feed) => assert_eq!(feed.device(), Device::Cuda(0)),
        Err(err) if required => panic!("SQLFEED_TEST_CUDA=require: {err}"),
        Err(err) => {
            let msg = err.to_string();
            assert_contains(&msg, &["CUDA", "--device cpu"]);
        }
    }
    assert!(matches!(Device::auto(), Device::Cpu | Device::Cuda(0)));
    Ok(())
}

#[test]
fn epoch_plans_carry_the_sink_metrics() -> Result<()> {
    let session = session(2, 8192)?;
    let mut feed =
        Feed::builder(&session, "SELECT value AS v FROM generate_series(1, 100)")
            .batch_size(10)
            .shuffle(3)
            .device(Device::Cpu)
            .build()?;
    let batches = feed.by_ref().count();
    assert_eq!(batches, 10);
    let (epoch, plan) = &feed.epoch_plans()[0];
    assert_eq!(*epoch, 0);
    assert_contains(plan, &["DeviceSinkExec: device=cpu, batch_size=10"]);
    assert_contains(plan, &["batches=10", "output_rows=100"]);
    assert!(plan.contains("ShuffleMergeExec: seed=3, epoch=0"), "{plan}");
    Ok(())
}

/// (rows, padded length) of each batch, the ids fed, the padding fraction.
type FedTokens = (Vec<(usize, usize)>, Vec<i64>, f64);

#[test]
fn token_budgets_pack_batches_and_bucketing_cuts_padding() -> Result<()> {
    let dir = generated(3000, 3)?;
    let session = session(2, 8192)?;
    let sql = format!(
        "SELECT id, tokens FROM '{}/*.parquet'",
        dir.path().display()
    );
    let collect = |builder: FeedBuilder| -> Result<FedTokens> {
        let mut feed = builder.device(Device::Cpu).build()?;
        let mut shapes = vec![];
        let mut ids = vec![];
        for batch in feed.by_ref() {
            let batch = batch?;
            let tokens = batch.tensor("tokens")?;
            shapes.push((tokens.shape()[0], tokens.shape()[1]));
            ids.extend_from_slice(batch.tensor("id")?.as_slice::<i64>()?);
        }
        Ok((shapes, ids, feed.report().padding_frac.unwrap_or(0.0)))
    };
    let (shapes, mut ids, _) =
        collect(Feed::builder(&session, &sql).shuffle(3).batch_tokens(4096))?;
    assert!(
        shapes
            .iter()
            .all(|&(rows, len)| rows == 1 || rows * len <= 4096),
        "{shapes:?}"
    );
    assert!(
        shapes.iter().map(|s| s.0).collect::<HashSet<_>>().len() > 1,
        "sizes vary"
    );
    ids.sort();
    assert_eq!(ids, (0..3000).collect::<Vec<_>>());
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            collect(
                Feed::builder(&session, &sql)
                    .shuffle(3)
                    .batch_tokens(4096)
                    .shard(rank, 3),
            )
        })
        .collect::<Result<_>>()?;
    assert!(
        ranks.iter().all(|r| r.0.len() == ranks[0].0.len()),
        "equal batch counts"
    );
    let all: Vec<i64> = ranks.iter().flat_map(|r| r.1.clone()).collect();
    assert_eq!(
        all.len(),
        all.iter().collect::<HashSet<_>>().len(),
        "disjoint"
    );

    let (plain, mut plain_ids, plain_padding) =
        collect(Feed::builder(&session, &sql).shuffle(3).batch_size(32))?;
    let (bucketed, mut bucketed_ids, bucketed_padding) = collect(
        Feed::builder(&session, &sql)
            .shuffle(3)
            .batch_size(32)
            .bucket_by_length(16),
    )?;
    assert_eq!(plain.len(), bucketed.len());
    plain_ids.sort();
    bucketed_ids.sort();
    assert_eq!(plain_ids, bucketed_ids, "bucketing reorders, never drops");
    assert!(
        bucketed_padding < plain_padding / 2.0,
        "padding {bucketed_padding} with buckets vs {plain_padding}"
    );
    let err = Feed::builder(
        &session,
        format!("SELECT id FROM '{}/*.parquet'", dir.path().display()),
    )
    .batch_tokens(100)
    .build()
    .unwrap_err()
    .to_string();
    assert_contains(&err, &["exactly one", "has 0"]);
    Ok(())
}

#[test]
fn tokenized_captions_feed_as_padded_ids_with_masks() -> Result<()> {
    let dir = generated(300, 2)?;
    let tokenizer = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/udfs/tests/data/all-MiniLM-L6-v2.tokenizer.json"
    );
    let sql = format!(
        "SELECT tokenize(caption, '{tokenizer}', 8) AS ids FROM '{}/*.parquet'",
        dir.path().display()
    );
    let session = session(2, 8192)?;
    let mut rows = 0;
    for batch in Feed::builder(&session, &sql)
        .batch_size(64)
        .device(Device::Cpu)
        .build()?
    {
        let batch = batch?;
        let ids = batch.tensor("ids")?;
        let (b, len) = (ids.shape()[0], ids.shape()[1]);
        assert!(len <= 8, "max_len truncates: {len}");
        let (ids, mask) = (
            ids.as_slice::<i64>()?,
            batch.tensor("ids_mask")?.as_slice::<u8>()?,
        );
        for row in 0..b {
            let ids = &ids[row * len..(row + 1) * len];
            let mask = &mask[row * len..(row + 1) * len];
            let n = mask.iter().filter(|&&m| m == 1).count();
            // [CLS] caption … [SEP], then padding.
            assert_eq!(ids[0], 101, "{ids:?}");
            assert_eq!(ids[n - 1], 102, "{ids:?}");
            assert!(
                ids[n..].iter().all(|&id| id == 0) && mask[..n].iter().all(|&m| m == 1)
            );
        }
        rows += b;
    }
    assert_eq!(rows, 300);
    Ok(())
}

#[test]
fn the_prefetch_ring_counts_against_the_memory_limit() -> Result<()> {
    let session = budget_session(4 << 20)?;
    // 16 KiB per row, 8 MiB per batch: one slot alone exceeds the 4 MiB budget.
    let sql = "SELECT one_hot(value % 10, 4096) AS v FROM generate_series(1, 2000)";
    let mut feed = Feed::builder(&session, sql)
        .batch_size(512)
        .device(Device::Cpu)
        .build()?;
    let err = feed
        .next()
        .expect("an error, not silence")
        .unwrap_err()
        .to_string();
    assert_contains(&err, &["prefetch ring", "--memory-limit"]);
    drop(feed);
    assert_eq!(session.context().runtime_env().memory_pool.reserved(), 0);
    // Small batches fit.
    let fits = Feed::builder(&session, sql)
        .batch_size(16)
        .prefetch(2)
        .device(Device::Cpu)
        .build()?;
    assert_eq!(fits.count(), 125);
    Ok(())
}

/// Issue 35: a feed whose batches are too heavy for `prefetch + 1` slots in
/// the ring's share of the budget keeps fewer slots and runs, instead of
/// failing for a depth it chose itself; the report says how deep it is.
#[test]
fn heavy_batches_fit_the_prefetch_ring_to_its_memory_share() -> Result<()> {
    use datafusion::execution::memory_pool::MemoryConsumer;
    let limit = 64 << 20;
    let session = budget_session(limit)?;
    let pool = &session.context().runtime_env().memory_pool;
    // What a spilling shuffle would hold: the ring has its 16 MiB share and
    // not much more.
    let hog = MemoryConsumer::new("the rest of the query").register(pool);
    hog.try_grow(40 << 20)?;
    // 16 KiB per row, 4 MiB per batch: 9 slots would need 36 MiB.
    let sql = "SELECT one_hot(value % 10, 4096) AS v FROM generate_series(1, 5120)";
    let mut feed = Feed::builder(&session, sql)
        .batch_size(256)
        .prefetch(8)
        .device(Device::Cpu)
        .build()?;
    let mut batches = 0;
    for batch in feed.by_ref() {
        assert_eq!(batch?.tensor("v")?.shape(), &[256, 4096]);
        batches += 1;
    }
    assert_eq!(batches, 20);
    let prefetch = feed.report().prefetch;
    assert!(
        (1..=3).contains(&prefetch),
        "prefetch {prefetch} fits 16 MiB"
    );
    drop(feed);
    drop(hog);
    assert_eq!(pool.reserved(), 0);
    // With room, the ring keeps the depth asked for.
    let roomy = Feed::builder(&session, sql)
        .batch_size(256)
        .prefetch(2)
        .device(Device::Cpu)
        .build()?;
    let report = {
        let mut roomy = roomy;
        for batch in roomy.by_ref() {
            batch?;
        }
        roomy.report()
    };
    assert_eq!(report.prefetch, 2);
    Ok(())
}

#[test]
fn images_of_different_shapes_in_one_batch_name_the_row_and_the_fix() -> Result<()> {
    let dir = generated(10, 1)?;
    let files = format!("'{}/*.parquet'", dir.path().display());
    let sql = format!(
        "SELECT image_decode(image_png) AS img FROM {files} WHERE id < 3 \
         UNION ALL SELECT image_resize(image_decode(image_png), 4, 4) FROM {files} WHERE id < 3"
    );
    let session = session(1, 8192)?;
    let mut feed = Feed::builder(&session, sql)
        .batch_size(6)
        .device(Device::Cpu)
        .build()?;
    let err = feed.next().expect("an error").unwrap_err().to_string();
    assert_contains(&err, &["column 'img'", "image_resize"]);
    assert_contains(&err, &["[4, 4, 3]", "[8, 8, 3]"]);
    Ok(())
}

/// Four rows of a Timestamp(µs, UTC) column `t` (the same instants in
/// Tokyo time as `tokyo`), a Date32 `d` and a Duration(ms) `dur`, as
/// `<dir>/time.parquet`.
fn time_file(dir: &Path) -> Result<String> {
    use datafusion::arrow::array::{
        Date32Array, DurationMillisecondArray, TimestampMicrosecondArray,
    };
    let micros = vec![1_700_000_000_123_456, -1_500_001, 0, -1];
    let batch = RecordBatch::try_from_iter(vec![
        (
            "t",
            arc(TimestampMicrosecondArray::from(micros.clone()).with_timezone("UTC")),
        ),
        (
            "tokyo",
            arc(TimestampMicrosecondArray::from(micros).with_timezone("Asia/Tokyo")),
        ),
        ("d", arc(Date32Array::from(vec![19_675, -1, 0, 1]))),
        (
            "dur",
            arc(DurationMillisecondArray::from(vec![
                1_500, -250, 0, 86_400_000,
            ])),
        ),
    ])?;
    let path = dir.join("time.parquet");
    write_parquet(&path, &batch)?;
    Ok(path.display().to_string())
}

/// Issue 35: timestamp, date and duration columns become int64 counts of
/// their own unit since the Unix epoch (UTC whatever the zone), and
/// `unit` converts them: floor division in int64, the fraction in floats.
#[test]
fn timestamps_dates_and_durations_become_epoch_counts() -> Result<()> {
    use datafusion::arrow::datatypes::TimeUnit;
    let dir = tempfile::tempdir()?;
    let file = time_file(dir.path())?;
    let session = session(1, 8192)?;
    let sql = format!(
        "SELECT t, tokyo, d, dur, t AS secs, t AS t_ms, d AS d_s, dur AS dur_s \
         FROM '{file}'"
    );
    let seconds = || {
        ColumnSpec::new()
            .dtype(DType::Float64)
            .unit(TimeUnit::Second)
    };
    let mut feed = Feed::builder(&session, &sql)
        .batch_size(4)
        .device(Device::Cpu)
        .column("secs", seconds())
        .column("t_ms", ColumnSpec::new().unit(TimeUnit::Millisecond))
        .column("d_s", ColumnSpec::new().unit(TimeUnit::Second))
        .column("dur_s", seconds())
        .build()?;
    let dtypes: Vec<(String, DType)> = feed
        .tensors()
        .iter()
        .map(|t| (t.name.clone(), t.dtype))
        .collect();
    let int64 = DType::Int64;
    let float64 = DType::Float64;
    assert_eq!(
        dtypes,
        [
            ("t", int64),
            ("tokyo", int64),
            ("d", int64),
            ("dur", int64),
            ("secs", float64),
            ("t_ms", int64),
            ("d_s", int64),
            ("dur_s", float64),
        ]
        .map(|(name, dtype)| (name.to_string(), dtype))
    );
    let batch = feed.next().expect("one batch")?;
    assert!(feed.next().is_none());
    let micros = [1_700_000_000_123_456, -1_500_001, 0, -1];
    assert_eq!(batch.tensor("t")?.as_slice::<i64>()?, &micros);
    assert_eq!(batch.tensor("t")?.shape(), &[4]);
    assert_eq!(
        batch.tensor("tokyo")?.as_slice::<i64>()?,
        &micros,
        "a time zone does not move the instant"
    );
    assert_eq!(batch.tensor("d")?.as_slice::<i64>()?, &[19_675, -1, 0, 1]);
    assert_eq!(
        batch.tensor("dur")?.as_slice::<i64>()?,
        &[1_500, -250, 0, 86_400_000]
    );
    assert_eq!(
        batch.tensor("secs")?.as_slice::<f64>()?,
        &[1_700_000_000.123_456, -1.500_001, 0.0, -0.000_001]
    );
    assert_eq!(
        batch.tensor("t_ms")?.as_slice::<i64>()?,
        &[1_700_000_000_123, -1_501, 0, -1],
        "floor division"
    );
    assert_eq!(
        batch.tensor("d_s")?.as_slice::<i64>()?,
        &[19_675 * 86_400, -86_400, 0, 86_400]
    );
    assert_eq!(
        batch.tensor("dur_s")?.as_slice::<f64>()?,
        &[1.5, -0.25, 0.0, 86_400.0]
    );
    drop(batch);

    // A unit on a column that is not a timestamp, date or duration.
    let err = Feed::builder(&session, format!("SELECT 1 AS x, t FROM '{file}'"))
        .device(Device::Cpu)
        .column("x", ColumnSpec::new().unit(TimeUnit::Second))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, datafusion::error::DataFusionError::Plan(_)),
        "{err}"
    );
    let err = err.to_string();
    assert_contains(&err, &["column 'x'", "unit=s"]);
    // A finer unit that overflows int64: an execution error naming the row
    // and the value.
    // 10^10 s is in 2286, past int64 nanoseconds (2262).
    let err = Feed::builder(&session, "SELECT to_timestamp_seconds(10000000000) AS far")
        .batch_size(4)
        .device(Device::Cpu)
        .column("far", ColumnSpec::new().unit(TimeUnit::Nanosecond))
        .build()?
        .filter_map(|b| b.err())
        .map(|e| e.to_string())
        .next()
        .unwrap_or_default();
    assert!(
        err.contains("column 'far', row 0")
            && err.contains("10000000000 s")
            && err.contains("coarser unit"),
        "{err}"
    );
    Ok(())
}

/// Issue 35 through the CLI: `--tensor t:dtype=float64,unit=s` feeds epoch
/// seconds as float64; the digest is that of the expected bytes.
#[test]
fn cli_tensor_unit_feeds_float_epoch_seconds() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = time_file(dir.path())?;
    let (ok, out, err) = run(sqlfeed().args([
        "feed",
        &format!("SELECT t FROM '{file}'"),
        "--batch-size",
        "4",
        "--device",
        "cpu",
        "--digest",
        "--tensor",
        "t:dtype=float64,unit=s",
    ]));
    assert!(ok, "{err}");
    assert!(err.contains("feed on cpu: t float64"), "{err}");
    let mut hash = xxhash_rust::xxh3::Xxh3::new();
    hash.update(b"t");
    hash.update(&4u64.to_le_bytes());
    for seconds in [1_700_000_000.123_456f64, -1.500_001, 0.0, -0.000_001] {
        hash.update(&seconds.to_ne_bytes());
    }
    let expected = format!(
        "batch epoch=0 step=0 rows=4 digest={:016x} resume_rows=1:0",
        hash.digest()
    );
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("batch ")).collect();
    assert_eq!(lines, [expected.as_str()], "{out}");
    let (ok, _, err) = run(sqlfeed().args([
        "feed",
        &format!("SELECT t FROM '{file}'"),
        "--device",
        "cpu",
        "--tensor",
        "t:unit=days",
    ]));
    assert!(!ok && err.contains("unit 'days' of column 't'"), "{err}");
    Ok(())
}

/// Each batch's ids and image bytes, and the first epoch's plan.
type IdsAndImages = (Vec<(Vec<i64>, Vec<u8>)>, String);

/// An unshuffled feed's costly functions run over the interleaved lanes on
/// every core (`LaneInterleaveExec` under them), and its batches are those
/// of the lanes decoded one by one and interleaved by the sink (functions
/// not parallel, `function_batch_bytes = 0`): the same rows in the same
/// order, across turns of 100 rows and 3 lanes (a file each).
#[test]
fn costly_functions_over_interleaved_lanes_give_the_lanes_order() -> Result<()> {
    let dir = generated(1500, 3)?;
    let sql = format!(
        "SELECT id, image_to_tensor(image_decode(image_png)) AS img FROM '{}/*.parquet'",
        dir.path().display()
    );
    let run = |parallel: bool, turn: usize| -> Result<IdsAndImages> {
        let session = session(2, turn)?;
        if !parallel {
            futures::executor::block_on(
                session
                    .context()
                    .sql("SET sqlfeed.function_batch_bytes = 0"),
            )?;
        }
        let mut feed = Feed::builder(&session, sql.clone())
            .batch_size(64)
            .device(Device::Cpu)
            .build()?;
        let mut batches = vec![];
        for batch in feed.by_ref() {
            let batch = batch?;
            batches.push((
                batch.tensor("id")?.as_slice::<i64>()?.to_vec(),
                batch.tensor("img")?.to_host_bytes()?,
            ));
        }
        let plan = feed.epoch_plans()[0].1.clone();
        Ok((batches, plan))
    };
    let (parallel, plan) = run(true, 100)?;
    assert_contains(&plan, &["LaneInterleaveExec: 3 lanes, turns of 100 rows"]);
    let (lane_by_lane, plain) = run(false, 100)?;
    assert!(!plain.contains("LaneInterleaveExec"), "{plain}");
    assert_eq!(parallel.len(), 1500usize.div_ceil(64));
    assert_eq!(parallel, lane_by_lane);
    // Another turn is another order: the comparison sees the order.
    assert_ne!(run(false, 150)?.0, lane_by_lane);
    // The lanes really interleave: ids do not come in file order.
    let ids: Vec<i64> = parallel.iter().flat_map(|(ids, _)| ids.clone()).collect();
    assert!(ids.windows(2).any(|w| w[1] < w[0]));
    Ok(())
}

/// Wide rows (~4 KB PNGs): a feed's scans read record batches of about
/// `sqlfeed.scan_batch_bytes` instead of the session's 8192 rows, and every
/// batch the feed hands over is the one of scans at 8192 rows, unshuffled
/// (four lanes, turns of the session's batch size) and shuffled (whose
/// scans keep the shuffle's own batch size).
#[test]
fn wide_rows_are_scanned_in_small_batches_and_feed_the_same_batches() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut options = sqlfeed::datagen::GenOptions::new(3000, dir.path());
    options.files = 3;
    options.image_size = 48;
    sqlfeed::datagen::generate(&options)?;
    let sql = format!(
        "SELECT id, image_png FROM '{}/*.parquet'",
        dir.path().display()
    );
    let scan_batches = |plan: &str| -> usize {
        plan.lines()
            .filter(|l| l.contains("DataSourceExec"))
            .filter_map(|l| l.split("output_batches=").nth(1))
            .filter_map(|n| n.split([',', ' ', ']']).next()?.parse::<usize>().ok())
            .sum()
    };
    for shuffle in [None, Some(5)] {
        let run = |scan_batch_bytes: usize| -> Result<(Vec<Vec<i64>>, usize)> {
            let session = session(2, 8192)?;
            futures::executor::block_on(session.context().sql(&format!(
                "SET sqlfeed.scan_batch_bytes = {scan_batch_bytes}"
            )))?;
            let mut feed = Feed::builder(&session, sql.clone())
                .batch_size(100)
                .given(shuffle, FeedBuilder::shuffle)
                .device(Device::Cpu)
                .build()?;
            let mut ids = vec![];
            for batch in feed.by_ref() {
                ids.push(batch?.tensor("id")?.as_slice::<i64>()?.to_vec());
            }
            Ok((ids, scan_batches(&feed.epoch_plans()[0].1)))
        };
        let (fitted, fitted_scan_batches) = run(1 << 20)?;
        let (whole, whole_scan_batches) = run(0)?;
        assert_eq!(fitted.len(), 30, "{shuffle:?}");
        assert_eq!(fitted, whole, "{shuffle:?}");
        if shuffle.is_none() {
            // ~4.3 KB rows in 1 MiB: batches of ~240 rows, five per file of
            // 1000 rows, against one per file at 8192.
            assert!(
                fitted_scan_batches >= 4 * whole_scan_batches && whole_scan_batches > 0,
                "{fitted_scan_batches} scan batches fitted, {whole_scan_batches} not"
            );
        } else {
            // Under the shuffle, its own batch size for its memory share.
            assert_eq!(fitted_scan_batches, whole_scan_batches);
        }
    }
    Ok(())
}

/// Issue 55, item 2: a shuffled feed plans and starts epoch e+1 while epoch
/// e is consumed (its plan is a `LookaheadExec`), with the batches of a
/// feed that does not, also under a memory limit the shuffles do not fit
/// (they spill); off with `sqlfeed.epoch_lookahead`.
#[test]
fn later_epochs_start_ahead_with_the_same_batches_under_a_tight_memory_limit()
-> Result<()> {
    let dir = generated(12_000, 4)?;
    let sql = format!("SELECT id, tokens FROM '{}'", dir.path().display());
    let spill = tempfile::tempdir()?;
    let run = |session: &sqlfeed::Session| -> Result<(Vec<Vec<i64>>, Vec<String>)> {
        let mut feed = Feed::builder(session, &sql)
            .shuffle(6)
            .batch_size(200)
            .epochs(3)
            .prefetch(2)
            .device(Device::Cpu)
            .build()?;
        let mut ids = vec![];
        for batch in feed.by_ref() {
            ids.push(batch?.tensor("id")?.as_slice::<i64>()?.to_vec());
        }
        let plans = feed.epoch_plans().iter().map(|(_, p)| p.clone()).collect();
        Ok((ids, plans))
    };
    // Under 2 MiB every epoch's shuffle spills, whether or not the next
    // one has started by then (a timing the test cannot fix).
    let tight = sqlfeed::Session::builder()
        .memory_limit(2 << 20)
        .target_partitions(2)
        .spill_dir(spill.path())
        .build()?;
    let (ahead, plans) = run(&tight)?;
    assert_eq!(plans.len(), 3);
    assert!(!plans[0].contains("LookaheadExec"), "{}", plans[0]);
    for plan in &plans[1..] {
        assert_contains(plan, &["LookaheadExec", "ShuffleMergeExec"]);
    }
    let spilled = plans
        .iter()
        .any(|plan| plan.contains("spill_count=") && !plan.contains("spill_count=0"));
    assert!(spilled, "no spill under 2 MiB: {}", plans[1]);
    assert_eq!(tight.context().runtime_env().memory_pool.reserved(), 0);
    let one_at_a_time = sqlfeed::Session::builder()
        .memory_limit(256 << 20)
        .target_partitions(2)
        .setting("sqlfeed.epoch_lookahead", "false")
        .build()?;
    let (alone, plans) = run(&one_at_a_time)?;
    assert!(plans.iter().all(|p| !p.contains("LookaheadExec")));
    assert_eq!(ahead, alone);
    // Three epochs, each every row once, in different orders.
    assert_eq!(ahead.len(), 3 * 60);
    for epoch in ahead.chunks(60) {
        let mut ids: Vec<i64> = epoch.iter().flatten().copied().collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..12_000).collect::<Vec<_>>());
    }
    assert_ne!(ahead[0], ahead[60]);
    Ok(())
}

/// Issue 55, item 3 (in part): a cluster feed joins (rank 0: submits) the
/// next epoch's job once the current epoch's job has completed and its
/// first batch is here, while the rank reads the rest, with the embedded
/// batches.
#[cfg(feature = "ballista")]
#[test]
fn a_cluster_feed_starts_the_next_epochs_job_while_it_reads_the_current_one() -> Result<()>
{
    let dir = tempfile::tempdir()?;
    let files = id_files(dir.path())?;
    let sql = format!("SELECT id FROM '{files}'");
    let cluster = sqlfeed::Session::builder()
        .cluster("standalone")
        .target_partitions(2)
        .build()?;
    let embedded = session(2, 64)?;
    let run = |session: &sqlfeed::Session| -> Result<(Vec<Vec<i64>>, Vec<String>)> {
        let mut feed = Feed::builder(session, &sql)
            .shuffle(13)
            .batch_size(100)
            .epochs(3)
            .run_id("lookahead")
            .device(Device::Cpu)
            .build()?;
        let mut ids = vec![];
        for batch in feed.by_ref() {
            ids.push(batch?.tensor("id")?.as_slice::<i64>()?.to_vec());
        }
        Ok((
            ids,
            feed.epoch_plans().iter().map(|(_, p)| p.clone()).collect(),
        ))
    };
    let (on_cluster, plans) = run(&cluster)?;
    assert!(!plans[0].contains("LookaheadExec"), "{}", plans[0]);
    for plan in &plans[1..] {
        assert_contains(plan, &["LookaheadExec", "SharedJobExec"]);
    }
    let (here, _) = run(&embedded)?;
    assert_eq!(on_cluster, here);
    Ok(())
}
