//! Sequence packing: documents (rows of one token column) packed into
//! sequences of at most `max_tokens` tokens, no padding between them, each
//! step the same number of sequences per rank with balanced attention cost.
//!
//! ```text
//!  documents in the feed's order (rows; one list column of token ids)
//!    │  longer than max_tokens: split into pieces, truncated, or an error
//!    ▼
//!  windows of `window` documents (plus the pieces the window before sent
//!  back), cut at fixed positions of the order
//!    │  plan.rs: best-fit decreasing → steps of B × W sequences by cost
//!    ▼
//!  this rank's B sequences of each step → BatchRows with a `Packed`
//!  layout (convert/packed.rs writes input_ids, position_ids, labels and
//!  cu_seqlens from it)
//! ```
//!
//! # Determinism and resume
//! The windows are cut at fixed positions of the epoch's order and every
//! plan is a function of the window's lengths, the shape and `(seed, epoch,
//! window)`, so a step's sequences are the same on every run, for any
//! partition count, embedded or on a cluster (where every rank reads the
//! whole order, as under a token budget). A feed resumes at a step of its
//! own shape (`B`, `W`) by planning the epoch again from its start and
//! skipping the steps before. Under another shape it replays the plan of
//! the checkpoint's shape (and of the shapes before it, `history`) up to
//! the step where the new one took over; what that step's window had not
//! fed yet, or sent back, is packed again under the new shape with the
//! windows after it, so every document is fed once across any chain of
//! resumes. The checkpoint's `rows` are the documents read before the
//! step's window (informative: a packing feed resumes by steps).
//!
//! # Memory
//! The window's record batches (the query's columns, which a packing feed
//! keeps to the token column), held until its plan is made; each step's
//! batch gathers only its own documents.

mod plan;

use std::collections::VecDeque;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::exec_err;
use datafusion::error::Result;

use self::plan::{WindowEnd, attention_cost, plan_window};
use super::EpochStart;
use crate::feed::convert::packed::{Packed, Segment};
use crate::feed::convert::{BatchRows, memory_of, value_len};
use crate::feed::metrics::FeedMetrics;

/// What to do with a document longer than `max_tokens`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LongDocuments {
    /// Cut it into pieces of `max_tokens` (the last shorter), each packed
    /// as a document of its own: positions restart in every piece.
    #[default]
    Split,
    /// Keep its first `max_tokens` tokens.
    Truncate,
    /// Fail the feed, naming the document.
    Fail,
}

impl LongDocuments {
    /// `split`, `truncate` or `fail`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "split" => Ok(LongDocuments::Split),
            "truncate" => Ok(LongDocuments::Truncate),
            "fail" => Ok(LongDocuments::Fail),
            other => datafusion::common::plan_err!(
                "pack_long={other:?}: expected 'split', 'truncate' or 'fail'"
            ),
        }
    }

    /// The option's name.
    pub fn name(self) -> &'static str {
        match self {
            LongDocuments::Split => "split",
            LongDocuments::Truncate => "truncate",
            LongDocuments::Fail => "fail",
        }
    }
}

/// How a feed packs, as its builder is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PackOptions {
    /// Tokens per sequence.
    pub max_tokens: usize,
    /// Documents per packing window.
    pub window: usize,
    /// Documents longer than `max_tokens`.
    pub long: LongDocuments,
    /// One flat `[T]` stream per batch instead of `[B, max_tokens]`.
    pub flat: bool,
}

impl PackOptions {
    /// The default window: 10,000 documents.
    pub const DEFAULT_WINDOW: usize = 10_000;

    /// Packing into sequences of `max_tokens`, with the default window,
    /// long documents split, `[B, max_tokens]` tensors.
    pub fn new(max_tokens: usize) -> Self {
        Self {
            max_tokens,
            window: Self::DEFAULT_WINDOW,
            long: LongDocuments::Split,
            flat: false,
        }
    }
}

/// Steps a packing feed took under one shape, before a resume under
/// another shape took over (see `batcher::pack`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct PackSpan {
    /// Sequences per rank and step.
    pub batch_size: usize,
    /// Ranks.
    pub world: usize,
    /// Steps taken under this shape.
    pub steps: u64,
}

/// How [`PackBatcher`] cuts an epoch.
#[derive(Debug, Clone)]
pub(crate) struct Pack {
    /// The feed's options.
    pub(crate) options: PackOptions,
    /// Index of the token column.
    pub(crate) column: usize,
    /// Sequences per rank and step (`B`).
    pub(crate) per_rank: usize,
    /// This rank.
    pub(crate) rank: usize,
    /// Ranks in all.
    pub(crate) world: usize,
    /// Leave the epoch's last, partial step out.
    pub(crate) drop_last: bool,
    /// The feed's seed (0 unshuffled).
    pub(crate) seed: u64,
    /// The shapes the epoch ran under before this one, oldest first (a
    /// resume under another shape): their plans are replayed to find what
    /// was fed.
    pub(crate) history: Arc<[PackSpan]>,
}

/// A document of the window: where its row is, and where it lies in the
/// epoch's order (for messages).
#[derive(Debug, Clone, Copy)]
struct Document {
    batch: usize,
    row: usize,
    position: u64,
}

/// A piece of a document to pack.
#[derive(Debug, Clone, Copy)]
struct Item {
    document: usize,
    start: usize,
    len: usize,
}

/// Packs an epoch's documents into this rank's batches of sequences (see
/// the module docs).
#[derive(Debug)]
pub(crate) struct PackBatcher {
    pack: Pack,
    epoch: u64,
    /// Steps not emitted (the resume point).
    skip_steps: u64,
    /// Batches not yet cut into windows.
    incoming: VecDeque<RecordBatch>,
    /// The window's record batches (the first holds what the last window
    /// sent back).
    batches: Vec<RecordBatch>,
    documents: Vec<Document>,
    items: Vec<Item>,
    /// Documents of the order in this window (not counting those sent back).
    window_documents: usize,
    /// Documents of the order seen so far.
    seen: u64,
    /// Documents of the order read before this window.
    before_window: u64,
    /// Windows planned so far.
    windows: u64,
    /// Global steps planned so far.
    steps: u64,
    /// The history span being replayed (`history.len()`: the feed's own
    /// shape).
    span: usize,
    /// Steps (counted from the epoch's start) at which that span ends.
    span_end: u64,
    /// Where each whole step's balance is reported.
    metrics: Option<Arc<FeedMetrics>>,
}

impl PackBatcher {
    pub(crate) fn new(pack: Pack, epoch: u64, start: EpochStart) -> Self {
        let pack = Pack {
            per_rank: pack.per_rank.max(1),
            world: pack.world.max(1),
            options: PackOptions {
                max_tokens: pack.options.max_tokens.max(1),
                window: pack.options.window.max(1),
                ..pack.options
            },
            ..pack
        };
        // Windows are cut from the epoch's start: a resume plans them again
        // (under the shapes of `history` first) and skips to its step.
        let skip_steps = match start {
            EpochStart::Step(step) => step,
            EpochStart::Rows { first_step, .. } => first_step,
        };
        let span_end = pack.history.first().map_or(0, |span| span.steps);
        Self {
            pack,
            epoch,
            skip_steps,
            incoming: VecDeque::new(),
            batches: vec![],
            documents: vec![],
            items: vec![],
            window_documents: 0,
            seen: 0,
            before_window: 0,
            windows: 0,
            steps: 0,
            span: 0,
            span_end,
            metrics: None,
        }
    }

    /// Reports the balance of every whole step fed to `metrics`.
    pub(crate) fn report_to(&mut self, metrics: Arc<FeedMetrics>) {
        self.metrics = Some(metrics);
    }

    /// Bytes of input held between calls.
    pub(crate) fn held_bytes(&self) -> usize {
        memory_of(self.batches.iter().chain(&self.incoming))
    }

    /// Steps of this shape so far.
    pub(crate) fn steps(&self) -> u64 {
        self.steps
    }

    /// After [`Self::finish`]: why the resume point lies beyond the epoch's
    /// end, if it does.
    pub(crate) fn beyond_the_end(&self) -> Option<String> {
        EpochStart::Step(self.skip_steps)
            .beyond_the_end(self.epoch, self.steps, self.seen)
    }

    pub(crate) fn push(
        &mut self,
        batch: RecordBatch,
        out: &mut Vec<BatchRows>,
    ) -> Result<()> {
        if batch.num_rows() > 0 {
            self.incoming.push_back(batch);
        }
        while let Some(batch) = self.incoming.pop_front() {
            let room = self.pack.options.window - self.window_documents;
            let take = room.min(batch.num_rows());
            if take < batch.num_rows() {
                self.incoming
                    .push_front(batch.slice(take, batch.num_rows() - take));
            }
            self.add_documents(batch.slice(0, take))?;
            if self.window_documents == self.pack.options.window {
                self.plan(WindowEnd::More, out)?;
            }
        }
        Ok(())
    }

    pub(crate) fn finish(&mut self, out: &mut Vec<BatchRows>) -> Result<()> {
        self.plan(
            WindowEnd::Last {
                drop_last: self.pack.drop_last,
            },
            out,
        )
    }

    /// Adds the documents of `batch` (rows of the order) to the window.
    fn add_documents(&mut self, batch: RecordBatch) -> Result<()> {
        let max_tokens = self.pack.options.max_tokens;
        let index = self.batches.len();
        let array = Arc::clone(batch.column(self.pack.column));
        for row in 0..batch.num_rows() {
            let position = self.seen;
            self.seen += 1;
            self.window_documents += 1;
            let len = value_len(&array, row);
            if len == 0 {
                // Nothing to feed (NULL or no tokens).
                continue;
            }
            let document = self.documents.len();
            self.documents.push(Document {
                batch: index,
                row,
                position,
            });
            match self.pack.options.long {
                _ if len <= max_tokens => self.items.push(Item {
                    document,
                    start: 0,
                    len,
                }),
                LongDocuments::Split => {
                    for start in (0..len).step_by(max_tokens) {
                        self.items.push(Item {
                            document,
                            start,
                            len: (len - start).min(max_tokens),
                        });
                    }
                }
                LongDocuments::Truncate => self.items.push(Item {
                    document,
                    start: 0,
                    len: max_tokens,
                }),
                LongDocuments::Fail => {
                    return exec_err!(
                        "the document at position {position} of epoch {}'s order has \
                         {len} tokens, more than pack={max_tokens}: pass \
                         pack_long='split' (pieces of {max_tokens}, each its own \
                         document) or 'truncate', or leave such rows out in SQL \
                         (WHERE cardinality(<tokens>) <= {max_tokens})",
                        self.epoch
                    );
                }
            }
        }
        self.batches.push(batch);
        Ok(())
    }

    /// The shape windows are planned under now: `(sequences per rank,
    /// ranks)` of the history span still being replayed, else the feed's.
    fn shape(&self) -> (usize, usize) {
        match self.pack.history.get(self.span) {
            Some(span) => (span.batch_size.max(1), span.world.max(1)),
            None => (self.pack.per_rank, self.pack.world),
        }
    }

    /// Whether the history span being replayed has all its steps: the next
    /// shape takes over.
    fn span_done(&self) -> bool {
        self.span < self.pack.history.len() && self.steps >= self.span_end
    }

    /// Moves to the next shape of the history (or the feed's own).
    fn next_span(&mut self) {
        self.span += 1;
        if let Some(span) = self.pack.history.get(self.span) {
            self.span_end += span.steps;
        }
    }

    /// Plans the window, emits this rank's batches of its steps, and starts
    /// the next window with what it sent back.
    ///
    /// Replaying an earlier shape (a resume under another one), its steps
    /// are counted, not emitted, up to the step where the next shape took
    /// over: what the window's later steps held, and what it sent back or
    /// dropped, is then packed again under the next shape, so every
    /// document is fed once across the resume.
    fn plan(&mut self, end: WindowEnd, out: &mut Vec<BatchRows>) -> Result<()> {
        while self.span_done() {
            self.next_span();
        }
        let pack = self.pack.clone();
        let (per_rank, world) = self.shape();
        let replaying = self.span < pack.history.len();
        let lengths: Vec<usize> = self.items.iter().map(|item| item.len).collect();
        let seed = crate::rand::splitmix64(
            pack.seed
                ^ crate::rand::splitmix64(self.epoch ^ 0x9ac4_0000)
                ^ crate::rand::splitmix64(self.windows.wrapping_add(0x51)),
        );
        let plan = plan_window(
            &lengths,
            pack.options.max_tokens,
            world,
            per_rank,
            end,
            seed,
        );
        self.windows += 1;
        for (index, step) in plan.steps.iter().enumerate() {
            if replaying && self.span_done() {
                let mut left: Vec<usize> = plan.steps[index..]
                    .iter()
                    .flat_map(|step| step.ranks.iter().flatten())
                    .flat_map(|&sequence| plan.sequences[sequence].iter().copied())
                    .chain(plan.carried.iter().copied())
                    .chain(plan.dropped.iter().copied())
                    .collect();
                left.sort_unstable();
                self.next_window(&left)?;
                return match end {
                    // The next shape packs what is left as the last window.
                    WindowEnd::Last { .. } => self.plan(end, out),
                    WindowEnd::More => Ok(()),
                };
            }
            let number = self.steps;
            self.steps += 1;
            if replaying || number < self.skip_steps {
                continue;
            }
            if let Some(metrics) = &self.metrics
                && step.per_rank == pack.per_rank
            {
                let costs: Vec<u64> = step
                    .ranks
                    .iter()
                    .map(|sequences| {
                        sequences
                            .iter()
                            .map(|&s| attention_cost(&plan.sequences[s], &lengths))
                            .sum()
                    })
                    .collect();
                let mean = costs.iter().sum::<u64>() as f64 / costs.len() as f64;
                let max = costs.iter().copied().max().unwrap_or(0) as f64;
                metrics.pack_step(if mean > 0.0 { max / mean } else { 1.0 });
            }
            let own = &step.ranks[pack.rank];
            let mut indices = vec![];
            let mut sequences = Vec::with_capacity(step.per_rank);
            for &sequence in own {
                let mut segments = vec![];
                for &item in &plan.sequences[sequence] {
                    let Item {
                        document,
                        start,
                        len,
                    } = self.items[item];
                    let document = self.documents[document];
                    segments.push(Segment {
                        row: indices.len(),
                        start,
                        len,
                    });
                    indices.push((document.batch, document.row));
                }
                sequences.push(segments);
            }
            sequences.resize(step.per_rank, vec![]);
            let batches: Vec<&RecordBatch> = self.batches.iter().collect();
            let rows =
                datafusion::arrow::compute::interleave_record_batch(&batches, &indices)?;
            out.push(BatchRows {
                pieces: vec![rows],
                rows: indices.len(),
                epoch: self.epoch,
                step: number,
                rows_after: self.before_window,
                packed: Some(Packed {
                    sequences,
                    max_tokens: pack.options.max_tokens,
                    flat: pack.options.flat,
                }),
            });
        }
        if replaying && let WindowEnd::Last { .. } = end {
            // The epoch ended before the next shape's step under the shape
            // replayed (its last step was cut otherwise): what it dropped
            // is the next shape's.
            self.next_window(&plan.dropped)?;
            self.span = self.pack.history.len();
            return self.plan(end, out);
        }
        self.next_window(&plan.carried)
    }

    /// Starts the next window with the `carried` items of this one.
    fn next_window(&mut self, carried: &[usize]) -> Result<()> {
        let mut documents: Vec<Document> = vec![];
        let mut items = Vec::with_capacity(carried.len());
        let mut indices = vec![];
        for &item in carried {
            let item = self.items[item];
            let document = self.documents[item.document];
            // The pieces of one document sent back together share a row.
            let at = match documents.last() {
                Some(last) if last.position == document.position => documents.len() - 1,
                _ => {
                    indices.push((document.batch, document.row));
                    documents.push(Document {
                        batch: 0,
                        row: documents.len(),
                        position: document.position,
                    });
                    documents.len() - 1
                }
            };
            items.push(Item {
                document: at,
                ..item
            });
        }
        let batches = match indices.is_empty() {
            true => vec![],
            false => {
                let batches: Vec<&RecordBatch> = self.batches.iter().collect();
                vec![datafusion::arrow::compute::interleave_record_batch(
                    &batches, &indices,
                )?]
            }
        };
        self.batches = batches;
        self.documents = documents;
        self.items = items;
        self.window_documents = 0;
        self.before_window = self.seen;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::Int32Type;

    use super::*;

    use super::super::test_rows as rows;

    fn pack(rank: usize, world: usize) -> Pack {
        shaped(rank, world, 2, &[])
    }

    /// A packer of `per_rank` sequences for rank `rank` of `world`, after
    /// `history`.
    fn shaped(rank: usize, world: usize, per_rank: usize, history: &[PackSpan]) -> Pack {
        Pack {
            options: PackOptions {
                max_tokens: 64,
                window: 40,
                long: LongDocuments::Split,
                flat: false,
            },
            column: 0,
            per_rank,
            rank,
            world,
            drop_last: false,
            seed: 5,
            history: Arc::from(history),
        }
    }

    /// `(document, start, len)` of every segment of every batch.
    fn fed(batches: &[BatchRows]) -> Vec<Vec<Vec<(i32, usize, usize)>>> {
        batches
            .iter()
            .map(|batch| {
                let list = batch.pieces[0].column(0).as_list::<i32>().clone();
                let packed = batch.packed.as_ref().unwrap();
                packed
                    .sequences
                    .iter()
                    .map(|segments| {
                        segments
                            .iter()
                            .map(|s| {
                                let v = list.value(s.row);
                                (v.as_primitive::<Int32Type>().value(0), s.start, s.len)
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }

    fn run(
        pack: Pack,
        lengths: &[usize],
        start: EpochStart,
        cuts: &[usize],
    ) -> Result<Vec<BatchRows>> {
        let mut batcher = PackBatcher::new(pack, 0, start);
        let all = rows(lengths);
        let mut out = vec![];
        let mut at = 0;
        for &cut in cuts.iter().chain([&lengths.len()]) {
            batcher.push(all.slice(at, cut - at), &mut out)?;
            at = cut;
        }
        batcher.finish(&mut out)?;
        Ok(out)
    }

    fn lengths(n: usize) -> Vec<usize> {
        (0..n).map(|i| (i * 37 + 11) % 90 + 1).collect()
    }

    #[test]
    fn every_token_is_fed_once_in_sequences_within_max_tokens() -> Result<()> {
        let lengths = lengths(300);
        let world = 3;
        let runs: Vec<Vec<BatchRows>> = (0..world)
            .map(|rank| run(pack(rank, world), &lengths, EpochStart::BEGIN, &[7, 100]))
            .collect::<Result<_>>()?;
        let steps = runs[0].len();
        assert!(runs.iter().all(|r| r.len() == steps), "equal step counts");
        let mut tokens = vec![0usize; lengths.len()];
        for batches in &runs {
            for (step, batch) in fed(batches).iter().enumerate() {
                assert_eq!(batch.len(), 2, "B sequences in step {step}");
                for sequence in batch {
                    let used: usize = sequence.iter().map(|s| s.2).sum();
                    assert!(used <= 64);
                    for &(document, _, len) in sequence {
                        tokens[document as usize] += len;
                    }
                }
            }
        }
        assert_eq!(tokens, lengths, "every document's tokens, once");
        Ok(())
    }

    #[test]
    fn the_plan_does_not_depend_on_how_the_rows_arrive() -> Result<()> {
        let lengths = lengths(200);
        let a = fed(&run(pack(1, 2), &lengths, EpochStart::BEGIN, &[])?);
        let b = fed(&run(
            pack(1, 2),
            &lengths,
            EpochStart::BEGIN,
            &[1, 39, 40, 41, 150],
        )?);
        assert_eq!(a, b);
        Ok(())
    }

    #[test]
    fn a_resume_at_a_step_gives_the_rest_of_the_uninterrupted_run() -> Result<()> {
        let lengths = lengths(200);
        let whole = fed(&run(pack(0, 2), &lengths, EpochStart::BEGIN, &[])?);
        let resumed = run(pack(0, 2), &lengths, EpochStart::Step(5), &[60])?;
        assert_eq!(resumed[0].step, 5);
        assert_eq!(fed(&resumed), whole[5..].to_vec());
        Ok(())
    }

    /// Tokens of each document that `runs` (every rank's batches) fed.
    fn tokens_fed(lengths: &[usize], runs: &[Vec<BatchRows>]) -> Vec<usize> {
        let mut tokens = vec![0; lengths.len()];
        for batches in runs {
            for sequence in fed(batches).iter().flatten() {
                for &(document, _, len) in sequence {
                    tokens[document as usize] += len;
                }
            }
        }
        tokens
    }

    #[test]
    fn a_resume_under_other_shapes_feeds_every_token_once() -> Result<()> {
        let lengths = lengths(400);
        // Shape 1: 2 ranks of 2 sequences, 7 steps; shape 2: 3 ranks of 1,
        // 9 steps; shape 3: 4 ranks of 3, to the end.
        let first = PackSpan {
            batch_size: 2,
            world: 2,
            steps: 7,
        };
        let second = PackSpan {
            batch_size: 1,
            world: 3,
            steps: 9,
        };
        let mut runs = vec![];
        for rank in 0..2 {
            let mut all = run(shaped(rank, 2, 2, &[]), &lengths, EpochStart::BEGIN, &[])?;
            all.truncate(7);
            runs.push(all);
        }
        for rank in 0..3 {
            let mut resumed = run(
                shaped(rank, 3, 1, &[first]),
                &lengths,
                EpochStart::Step(7),
                &[],
            )?;
            assert_eq!(resumed[0].step, 7, "steps go on from the resume");
            resumed.truncate(9);
            runs.push(resumed);
        }
        let mut steps = vec![];
        for rank in 0..4 {
            let rest = run(
                shaped(rank, 4, 3, &[first, second]),
                &lengths,
                EpochStart::Step(16),
                &[3, 77],
            )?;
            steps.push(rest.len());
            runs.push(rest);
        }
        assert!(steps.iter().all(|&s| s == steps[0] && s > 0), "{steps:?}");
        assert_eq!(tokens_fed(&lengths, &runs), lengths, "every token once");
        // A resume of the last shape at its own step is the rest of its run.
        let whole = fed(&run(
            shaped(1, 4, 3, &[first, second]),
            &lengths,
            EpochStart::Step(16),
            &[],
        )?);
        let later = fed(&run(
            shaped(1, 4, 3, &[first, second]),
            &lengths,
            EpochStart::Step(18),
            &[],
        )?);
        assert_eq!(later, whole[2..].to_vec());
        Ok(())
    }

    #[test]
    fn long_documents_are_split_truncated_or_named() -> Result<()> {
        let lengths = [10, 150, 20];
        let split = fed(&run(pack(0, 1), &lengths, EpochStart::BEGIN, &[])?);
        let mut pieces: Vec<(i32, usize, usize)> = split
            .iter()
            .flatten()
            .flatten()
            .copied()
            .filter(|p| p.0 == 1)
            .collect();
        pieces.sort();
        assert_eq!(pieces, vec![(1, 0, 64), (1, 64, 64), (1, 128, 22)]);

        let mut truncate = pack(0, 1);
        truncate.options.long = LongDocuments::Truncate;
        let kept = fed(&run(truncate, &lengths, EpochStart::BEGIN, &[])?);
        let total: usize = kept.iter().flatten().flatten().map(|p| p.2).sum();
        assert_eq!(total, 10 + 64 + 20);

        let mut fail = pack(0, 1);
        fail.options.long = LongDocuments::Fail;
        let err = run(fail, &lengths, EpochStart::BEGIN, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("position 1 of epoch 0"), "{err}");
        assert!(err.contains("150 tokens, more than pack=64"), "{err}");
        Ok(())
    }

    #[test]
    fn the_last_partial_step_pads_with_empty_sequences_or_is_dropped() -> Result<()> {
        // 3 documents of 60 tokens: 3 sequences over 2 ranks of 2.
        let lengths = [60, 60, 60];
        let a = run(pack(0, 2), &lengths, EpochStart::BEGIN, &[])?;
        let b = run(pack(1, 2), &lengths, EpochStart::BEGIN, &[])?;
        assert_eq!((a.len(), b.len()), (1, 1));
        let sizes = |batches: &[BatchRows]| -> Vec<usize> {
            batches[0]
                .packed
                .as_ref()
                .unwrap()
                .sequences
                .iter()
                .map(Vec::len)
                .collect()
        };
        let (sa, sb) = (sizes(&a), sizes(&b));
        assert_eq!(sa.len(), 2);
        assert_eq!(sb.len(), 2);
        assert_eq!(sa.iter().chain(&sb).sum::<usize>(), 3);
        // Fewer sequences than ranks: a rank's last batch is all padding.
        let alone = run(shaped(1, 2, 1, &[]), &[60], EpochStart::BEGIN, &[])?;
        assert_eq!(alone.len(), 1);
        assert_eq!(alone[0].rows, 0);
        assert_eq!(alone[0].packed.as_ref().unwrap().sequences, vec![vec![]]);
        let mut dropping = pack(0, 2);
        dropping.drop_last = true;
        assert!(run(dropping, &lengths, EpochStart::BEGIN, &[])?.is_empty());
        Ok(())
    }

    #[test]
    fn empty_and_null_documents_are_left_out() -> Result<()> {
        let lengths = [0, 5, 0, 7];
        let batches = run(pack(0, 1), &lengths, EpochStart::BEGIN, &[])?;
        let fed = fed(&batches);
        let documents: Vec<i32> = fed.iter().flatten().flatten().map(|p| p.0).collect();
        assert_eq!(documents.len(), 2);
        assert!(batches[0].pieces[0].column(0).null_count() == 0);
        Ok(())
    }
}
