//! Sequence packing (issue 58): documents packed into sequences of at most
//! `max_tokens`, every token once per epoch, equal step counts and balanced
//! attention cost across ranks, the same batches on any partition count and
//! record-batch size, and a resume that continues exactly.

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int32Type;
use datafusion::error::Result;
use sqlfeed::device::Device;
use sqlfeed::feed::{Feed, FeedBuilder, IGNORED_LABEL, OnDataChange, PackOptions};

use crate::common::{generated, sized_session};

/// One rank's packed batches: per batch, its sequences' documents as token
/// lists, read back from `input_ids` and `cu_seqlens` (padding left out).
type Sequences = Vec<Vec<Vec<i64>>>;

fn fed(builder: FeedBuilder) -> Result<Vec<Sequences>> {
    let mut out = vec![];
    for batch in builder.device(Device::Cpu).build()? {
        let batch = batch?;
        let ids = batch.tensor("input_ids")?;
        let (rows, width) = (ids.shape()[0], ids.shape()[1]);
        let ids = ids.as_slice::<i64>()?;
        let labels = batch.tensor("labels")?.as_slice::<i64>()?;
        let positions = batch.tensor("position_ids")?.as_slice::<i64>()?;
        let cu = batch.tensor("cu_seqlens")?.as_slice::<i32>()?;
        assert_eq!(cu.first(), Some(&0));
        assert_eq!(*cu.last().unwrap() as usize, rows * width);
        let mut sequences: Sequences = vec![vec![]; rows];
        for bounds in cu.windows(2) {
            let (start, end) = (bounds[0] as usize, bounds[1] as usize);
            // Padding: pad id 0 and no label (a document of two tokens or
            // more has labels, and the generated ones have at least 8).
            let padding = ids[start..end].iter().all(|&id| id == 0)
                && labels[start..end].iter().all(|&l| l == IGNORED_LABEL);
            if padding {
                continue;
            }
            // A document: positions restart, its first token predicts
            // nothing across, the rest are their own labels.
            assert!(
                positions[start..end]
                    .iter()
                    .enumerate()
                    .all(|(i, &p)| p == i as i64),
                "positions of {start}..{end}"
            );
            assert_eq!(labels[start], IGNORED_LABEL);
            assert_eq!(&labels[start + 1..end], &ids[start + 1..end]);
            assert_eq!(start / width, (end - 1) / width, "within one sequence");
            sequences[start / width].push(ids[start..end].to_vec());
        }
        out.push(sequences);
    }
    Ok(out)
}

fn documents(dir: &std::path::Path) -> Result<Vec<Vec<i64>>> {
    let session = sized_session(2, 1000)?;
    let mut all = vec![];
    for batch in Feed::builder(&session, query(dir))
        .batch_size(1)
        .device(Device::Cpu)
        .build()?
    {
        let batch = batch?;
        let tokens = batch.tensor("tokens")?;
        let mask = batch.tensor("tokens_mask")?.as_slice::<u8>()?.to_vec();
        let values = tokens.as_slice::<i64>()?;
        all.push(
            values
                .iter()
                .zip(&mask)
                .filter(|(_, m)| **m == 1)
                .map(|(&v, _)| v)
                .collect(),
        );
    }
    Ok(all)
}

fn query(dir: &std::path::Path) -> String {
    format!("SELECT tokens FROM '{}/*.parquet'", dir.display())
}

fn packing(session: &sqlfeed::Session, dir: &std::path::Path) -> FeedBuilder {
    Feed::builder(session, query(dir))
        .shuffle(7)
        .batch_size(3)
        .pack(PackOptions {
            window: 500,
            ..PackOptions::new(160)
        })
}

#[test]
fn packed_batches_feed_every_token_once_and_do_not_depend_on_partitions() -> Result<()> {
    let dir = generated(2000, 4)?;
    let mut expected = documents(dir.path())?;
    expected.sort();
    let world = 4;
    let mut reference: Option<Vec<Vec<Sequences>>> = None;
    for (partitions, record_batch) in [(1, 8192), (2, 100), (4, 37)] {
        let session = sized_session(partitions, record_batch)?;
        let ranks: Vec<Vec<Sequences>> = (0..world)
            .map(|rank| fed(packing(&session, dir.path()).shard(rank, world)))
            .collect::<Result<_>>()?;
        let steps = ranks[0].len();
        assert!(steps > 5, "{steps}");
        for (rank, batches) in ranks.iter().enumerate() {
            assert_eq!(
                batches.len(),
                steps,
                "rank {rank}: every rank gets as many steps"
            );
            for (step, batch) in batches.iter().enumerate() {
                // The epoch's last step shares what is left: ⌈left / W⌉ each.
                match step + 1 == steps {
                    false => assert_eq!(batch.len(), 3, "B sequences"),
                    true => assert!((1..=3).contains(&batch.len())),
                }
                for sequence in batch {
                    let tokens: usize = sequence.iter().map(Vec::len).sum();
                    assert!(tokens <= 160);
                }
            }
        }
        let mut all: Vec<Vec<i64>> = ranks
            .iter()
            .flatten()
            .flatten()
            .flatten()
            .cloned()
            .collect();
        all.sort();
        assert_eq!(
            all, expected,
            "every document once (none is over 160 tokens)"
        );
        match &reference {
            None => reference = Some(ranks),
            Some(first) => assert!(
                *first == ranks,
                "{partitions} partitions of {record_batch}-row batches pack otherwise"
            ),
        }
    }
    Ok(())
}

#[test]
fn ranks_of_a_step_get_balanced_attention_costs_and_little_padding() -> Result<()> {
    let dir = generated(6000, 4)?;
    let session = sized_session(2, 8192)?;
    let world = 8;
    let ranks: Vec<Vec<Sequences>> = (0..world)
        .map(|rank| {
            fed(Feed::builder(&session, query(dir.path()))
                .shuffle(1)
                .batch_size(4)
                .drop_last(true)
                .pack(PackOptions::new(512))
                .shard(rank, world))
        })
        .collect::<Result<_>>()?;
    let cost = |batch: &Sequences| -> u64 {
        batch
            .iter()
            .flatten()
            .map(|d| (d.len() as u64).pow(2))
            .sum()
    };
    let mut worst: f64 = 0.0;
    let (mut tokens, mut slots) = (0usize, 0usize);
    for step in 0..ranks[0].len() {
        let costs: Vec<u64> = ranks.iter().map(|r| cost(&r[step])).collect();
        let mean = costs.iter().sum::<u64>() as f64 / world as f64;
        worst = worst.max(*costs.iter().max().unwrap() as f64 / mean);
        for rank in &ranks {
            tokens += rank[step].iter().flatten().map(Vec::len).sum::<usize>();
            slots += 4 * 512;
        }
    }
    let waste = 1.0 - tokens as f64 / slots as f64;
    assert!(worst <= 1.05, "max / mean of a step's rank costs {worst}");
    assert!(waste < 0.01, "padding {waste}");
    Ok(())
}

#[test]
fn a_packing_feed_resumes_at_its_step_and_refuses_another_packing() -> Result<()> {
    let dir = generated(1500, 2)?;
    let session = sized_session(2, 8192)?;
    let whole = fed(packing(&session, dir.path()).shard(1, 2).epochs(2))?;
    let mut feed = packing(&session, dir.path())
        .shard(1, 2)
        .epochs(2)
        .device(Device::Cpu)
        .build()?;
    let half = whole.len() / 2 + 1;
    for _ in 0..half {
        feed.next().expect("a batch")?;
    }
    let checkpoint = feed.checkpoint()?;
    drop(feed);
    let rest = fed(packing(&session, dir.path())
        .shard(1, 2)
        .epochs(2)
        .resume_from(checkpoint.clone(), OnDataChange::Error))?;
    assert_eq!(rest, whole[half..].to_vec());
    // Another packing is another plan: refused, both named.
    let err = Feed::builder(&session, query(dir.path()))
        .shuffle(7)
        .batch_size(3)
        .pack(PackOptions::new(100))
        .shard(1, 2)
        .epochs(2)
        .resume_from(checkpoint, OnDataChange::Error)
        .device(Device::Cpu)
        .build()
        .and_then(|mut feed| feed.next().transpose().map(|_| ()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a packing feed resumes only under its own packing"),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_packing_feed_resumes_on_another_world_and_batch_size_feeding_every_document_once()
-> Result<()> {
    let dir = generated(1500, 2)?;
    let session = sized_session(2, 8192)?;
    let mut expected = documents(dir.path())?;
    expected.sort();
    // 2 ranks take 5 steps, then 3 ranks of 2 sequences go on from there;
    // a checkpoint of theirs 4 steps later resumes on 1 rank of 5.
    let mut fed_before: Vec<Vec<i64>> = vec![];
    let mut checkpoint = None;
    for rank in 0..2 {
        let mut feed = packing(&session, dir.path())
            .shard(rank, 2)
            .device(Device::Cpu)
            .build()?;
        for _ in 0..5 {
            fed_before.extend(documents_of(&feed.next().expect("a batch")?)?);
        }
        checkpoint = Some(feed.checkpoint()?);
    }
    let checkpoint = checkpoint.expect("two ranks ran");
    let mut second = None;
    for rank in 0..3 {
        let mut feed = packing(&session, dir.path())
            .batch_size(2)
            .shard(rank, 3)
            .resume_from(checkpoint.clone(), OnDataChange::Error)
            .device(Device::Cpu)
            .build()?;
        for _ in 0..4 {
            let batch = feed.next().expect("a batch")?;
            fed_before.extend(documents_of(&batch)?);
        }
        second = Some(feed.checkpoint()?);
    }
    let second = second.expect("three ranks ran");
    assert_eq!(second.pack_history.len(), 1, "{:?}", second.pack_history);
    assert_eq!(second.step, 9);
    let rest = fed(packing(&session, dir.path())
        .batch_size(5)
        .resume_from(second, OnDataChange::Error))?;
    let mut all: Vec<Vec<i64>> = fed_before
        .into_iter()
        .chain(rest.into_iter().flatten().flatten())
        .collect();
    all.sort();
    assert_eq!(all, expected, "every document once across the resumes");
    Ok(())
}

/// The documents of one packed batch.
fn documents_of(batch: &sqlfeed::device::TensorBatch) -> Result<Vec<Vec<i64>>> {
    let ids = batch.tensor("input_ids")?.as_slice::<i64>()?;
    let labels = batch.tensor("labels")?.as_slice::<i64>()?;
    let cu = batch.tensor("cu_seqlens")?.as_slice::<i32>()?;
    Ok(cu
        .windows(2)
        .map(|b| (b[0] as usize, b[1] as usize))
        .filter(|&(start, end)| {
            !(ids[start..end].iter().all(|&id| id == 0)
                && labels[start..end].iter().all(|&l| l == IGNORED_LABEL))
        })
        .map(|(start, end)| ids[start..end].to_vec())
        .collect())
}

#[test]
fn a_packing_feed_refuses_a_query_it_cannot_pack() -> Result<()> {
    let dir = generated(100, 1)?;
    let session = sized_session(1, 8192)?;
    for (sql, expected) in [
        (
            format!(
                "SELECT id, tokens FROM '{}/*.parquet'",
                dir.path().display()
            ),
            "packs one column of token ids",
        ),
        (
            format!("SELECT caption FROM '{}/*.parquet'", dir.path().display()),
            "packs a list of token ids",
        ),
    ] {
        let err = Feed::builder(&session, sql)
            .pack(PackOptions::new(64))
            .device(Device::Cpu)
            .build()
            .and_then(|mut feed| feed.next().transpose().map(|_| ()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{err}");
    }
    let err = packing(&session, dir.path())
        .batch_tokens(100)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not combine with batch_tokens"), "{err}");
    Ok(())
}

#[test]
fn explain_batch_names_the_documents_of_a_packed_batch() -> Result<()> {
    let dir = generated(800, 2)?;
    let session = sized_session(2, 8192)?;
    let builder = packing(&session, dir.path()).shard(1, 2);
    let batches = fed(builder.clone())?;
    let step = 2;
    let explained = builder.explain_batch(0, step as u64)?;
    // One origin per piece fed (no document here is over 160 tokens).
    let documents: usize = batches[step].iter().map(Vec::len).sum();
    assert_eq!(explained.rows.len(), documents);
    // They are those documents: each read back from its file (the
    // generated ids run on through the rows of a file).
    let runtime = tokio::runtime::Runtime::new()?;
    let mut named = vec![];
    for origin in &explained.rows {
        let path = origin.file.trim_start_matches("file://");
        let path = path.trim_start_matches("file:");
        let sql = format!(
            "SELECT tokens FROM '{path}' WHERE id = (SELECT min(id) FROM '{path}') + {}",
            origin.row
        );
        let found = runtime.block_on(crate::common::collect(&session, &sql))?;
        let list = found[0].column(0).as_list::<i32>().value(0);
        let tokens: Vec<i64> = list
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .map(|&v| v as i64)
            .collect();
        named.push(tokens);
    }
    let mut fed_documents: Vec<Vec<i64>> =
        batches[step].iter().flatten().cloned().collect();
    fed_documents.sort();
    named.sort();
    assert_eq!(named, fed_documents);
    Ok(())
}
