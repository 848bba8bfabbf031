//! [`ShuffleKeyExec`]: appends the shuffle key of every row.
//!
//! ```text
//!  batch [c0, c1, …]  ──►  batch [c0, c1, …, __sqlfeed_shuffle_key: UInt64]
//! ```
//!
//! Stateless and streaming: one output batch per input batch, same
//! partitioning, no memory held between batches. The key is the *content*
//! key: it depends only on the row's values and the seed (see the
//! [module docs](super)), so it is the same whichever partition or batch a
//! row arrives in, and the copies of a repeated row share it until
//! [`super::PermuteExec`] gives each copy its own.
//!
//! # Error handling
//! Errors of the input and of the row encoding are passed on in the stream.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, AsArray, RecordBatch, UInt32Array, UInt64Array,
};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::UInt64Type;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::internal_datafusion_err;
use datafusion::common::{internal_err, plan_err};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, RecordOutput,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::row_key_hash;
use crate::exec::BatchStream;
use crate::rand::splitmix64;

/// Name of the key column between [`ShuffleKeyExec`] and the sort.
pub const SHUFFLE_KEY_COLUMN: &str = "__sqlfeed_shuffle_key";

/// Checks that [`SHUFFLE_KEY_COLUMN`] is the last column of `input`, what
/// `operator` reads it as: elsewhere, the plan is sqlfeed's mistake.
pub(crate) fn check_key_is_last(operator: &str, input: &SchemaRef) -> Result<()> {
    let last = input.fields().last().map(|f| f.name().as_str());
    if last != Some(SHUFFLE_KEY_COLUMN) {
        return internal_err!(
            "{operator} needs {SHUFFLE_KEY_COLUMN} as the last input column"
        );
    }
    Ok(())
}

/// The hash seed of `(seed, epoch)`: SplitMix64 of `seed ^ SplitMix64(epoch)`,
/// so neighbouring seeds and epochs give unrelated permutations.
pub fn shuffle_seed(seed: u64, epoch: u64) -> u64 {
    splitmix64(seed ^ splitmix64(epoch))
}

/// Largest batch handed to the sort: 1/64 of a partition's share of the
/// memory limit (at least 256 KiB). The external sort must hold a whole
/// batch to accept it; one batch of wide rows (strings of kilobytes built
/// with doubling capacity) can otherwise exceed the whole share.
pub(crate) fn max_batch_bytes(context: &TaskContext, partitions: usize) -> usize {
    match context.memory_pool().memory_limit() {
        MemoryLimit::Finite(limit) => (limit / partitions.max(1) / 64).max(256 << 10),
        _ => usize::MAX,
    }
}

/// The stream of an operator that appends a shuffle key ([`ShuffleKeyExec`],
/// `PositionKeyExec`): each batch of `input` cut to fit the sort's share
/// ([`split_to_fit`] of `max_batch_bytes`), each piece, in order, made into
/// the columns of `schema` by `key`; an error ends the stream.
pub(crate) fn keyed_batches(
    input: BatchStream,
    schema: SchemaRef,
    baseline: BaselineMetrics,
    max_batch_bytes: usize,
    mut key: impl FnMut(&RecordBatch) -> Result<Vec<ArrayRef>> + Send + 'static,
) -> BatchStream {
    let output = Arc::clone(&schema);
    let keyed = input.flat_map(move |batch| {
        let keyed = batch.and_then(|batch| {
            let timer = baseline.elapsed_compute().timer();
            let mut out = vec![];
            for chunk in split_to_fit(&batch, max_batch_bytes)? {
                let keyed = RecordBatch::try_new(Arc::clone(&schema), key(&chunk)?)?;
                out.push(Ok(keyed.record_output(&baseline)));
            }
            timer.done();
            Ok(out)
        });
        futures::stream::iter(keyed.unwrap_or_else(|e| vec![Err(e)]))
    });
    Box::pin(RecordBatchStreamAdapter::new(output, keyed))
}

/// `batch` as one or more compact batches of at most about `max_bytes` each.
/// Slices would share (and be charged for) the whole buffers, so chunks are
/// copied.
pub(crate) fn split_to_fit(
    batch: &RecordBatch,
    max_bytes: usize,
) -> Result<Vec<RecordBatch>> {
    let bytes = batch.get_array_memory_size();
    let rows = batch.num_rows();
    if bytes <= max_bytes || rows <= 1 {
        return Ok(vec![batch.clone()]);
    }
    let chunks = bytes.div_ceil(max_bytes).min(rows);
    let chunk_rows = rows.div_ceil(chunks);
    (0..rows)
        .step_by(chunk_rows)
        .map(|start| {
            let len = chunk_rows.min(rows - start);
            let indices =
                UInt32Array::from_iter_values(start as u32..(start + len) as u32);
            Ok(take_record_batch(batch, &indices)?)
        })
        .collect()
}

/// Appends [`SHUFFLE_KEY_COLUMN`]; see the module docs.
#[derive(Debug)]
pub struct ShuffleKeyExec {
    /// Rows to key.
    input: Arc<dyn ExecutionPlan>,
    /// The seed of the run.
    seed: u64,
    /// The epoch.
    epoch: u64,
    /// Where each row's content hash comes from.
    source: KeySource,
    /// Input schema plus the key column.
    schema: SchemaRef,
    /// Cached plan properties.
    properties: Arc<PlanProperties>,
    /// Output rows and compute time.
    metrics: ExecutionPlanMetricsSet,
}

impl ShuffleKeyExec {
    /// Keys the rows of `input` for `(seed, epoch)`.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, seed: u64, epoch: u64) -> Result<Self> {
        let input_schema = input.schema();
        if input_schema.column_with_name(SHUFFLE_KEY_COLUMN).is_some() {
            return plan_err!(
                "SHUFFLE: the query already has a column named {SHUFFLE_KEY_COLUMN}"
            );
        }
        let schema =
            crate::exec::with_u64_column(&input_schema, SHUFFLE_KEY_COLUMN, None);
        let properties = crate::exec::row_wise_properties(&input, Arc::clone(&schema));
        Ok(Self {
            input,
            seed,
            epoch,
            source: KeySource::AllColumns,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Takes each row's content hash from `source` (see
    /// [`super::ShuffleKey`]); a column out of range, or a content hash
    /// column that is not `UInt64`, is an internal error.
    pub fn with_source(mut self, source: KeySource) -> Result<Self> {
        let schema = self.input.schema();
        let columns = schema.fields().len();
        let named: &[usize] = match &source {
            KeySource::AllColumns => &[],
            KeySource::Columns(indices) => indices,
            KeySource::ContentHash(index) => std::slice::from_ref(index),
        };
        if let Some(bad) = named.iter().find(|&&i| i >= columns) {
            return internal_err!(
                "shuffle key column {bad} out of range: the input has {columns} columns"
            );
        }
        if let KeySource::ContentHash(index) = source
            && schema.field(index).data_type() != &DataType::UInt64
        {
            return internal_err!(
                "shuffle content hash column '{}' is {}, not UInt64",
                schema.field(index).name(),
                schema.field(index).data_type()
            );
        }
        self.source = source;
        Ok(self)
    }

    /// Where each row's content hash comes from.
    pub fn source(&self) -> &KeySource {
        &self.source
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The key source for display (`None`: all columns).
    fn source_text(&self) -> Option<String> {
        let schema = self.input.schema();
        let name = |i: &usize| schema.field(*i).name().clone();
        match &self.source {
            KeySource::AllColumns => None,
            KeySource::Columns(indices) => Some(format!(
                "key=[{}]",
                indices.iter().map(name).collect::<Vec<_>>().join(", ")
            )),
            KeySource::ContentHash(index) => {
                Some(format!("content_hash={}", name(index)))
            }
        }
    }
}

/// Where [`ShuffleKeyExec`] gets each row's content hash; the resolved form
/// of [`super::ShuffleKey`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KeySource {
    /// Hash every input column.
    AllColumns,
    /// Hash the input columns at these positions, in this order.
    Columns(Vec<usize>),
    /// The `UInt64` input column at this position is the content hash.
    ContentHash(usize),
}

/// The seed of the content hash: the content hash does not depend on the
/// shuffle's seed or epoch, so that it can be computed once and stored with
/// a cached result (see [`super::ShuffleKey::ContentHash`]).
pub const CONTENT_HASH_SEED: u64 = 0;

/// The content hash of each row of `batch` as `source` says.
fn content_hashes(batch: &RecordBatch, source: &KeySource) -> Result<UInt64Array> {
    match source {
        KeySource::AllColumns => row_key_hash(batch.columns(), CONTENT_HASH_SEED),
        KeySource::Columns(indices) => {
            let hashed: Vec<ArrayRef> = indices
                .iter()
                .map(|&i| Arc::clone(batch.column(i)))
                .collect();
            row_key_hash(&hashed, CONTENT_HASH_SEED)
        }
        KeySource::ContentHash(index) => batch
            .column(*index)
            .as_primitive_opt::<UInt64Type>()
            .cloned()
            .ok_or_else(|| {
                internal_datafusion_err!("shuffle content hash column is not UInt64")
            }),
    }
}

/// The shuffle key of each content hash under `hash_seed` (of seed and
/// epoch): xxh3 of the hash's little-endian bytes. Content hashes are never
/// null (`row_key_hash` gives none, and a cached one was computed by it),
/// so the values are read without the null mask, in one pass that builds no
/// validity bitmap: this runs for every row of every shuffled epoch.
fn shuffle_keys(content: &UInt64Array, hash_seed: u64) -> UInt64Array {
    let keys: Vec<u64> = content
        .values()
        .iter()
        .map(|c| xxh3_64_with_seed(&c.to_le_bytes(), hash_seed))
        .collect();
    UInt64Array::from(keys)
}

impl DisplayAs for ShuffleKeyExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "ShuffleKeyExec: seed={}, epoch={}",
                    self.seed, self.epoch
                )?;
                match self.source_text() {
                    Some(text) => write!(f, ", {text}"),
                    None => Ok(()),
                }
            }
            DisplayFormatType::TreeRender => {
                write!(f, "seed={}\nepoch={}", self.seed, self.epoch)?;
                match self.source_text() {
                    Some(text) => write!(f, "\n{text}"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl ExecutionPlan for ShuffleKeyExec {
    crate::exec::one_input_operator! {
        name: "ShuffleKeyExec",
        properties: own,
        rebuild: |this, child| {
            Self::try_new(child, this.seed, this.epoch)?.with_source(this.source.clone())
        },
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    // One key per row: the input's row counts.
    crate::exec::statistics_of_one_input!(rows_passed_through);

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let max_batch_bytes =
            max_batch_bytes(&ctx, self.input.output_partitioning().partition_count());
        let input = self.input.execute(partition, ctx)?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let schema = Arc::clone(&self.schema);
        let hash_seed = shuffle_seed(self.seed, self.epoch);
        let source = self.source.clone();
        Ok(keyed_batches(
            input,
            schema,
            baseline,
            max_batch_bytes,
            move |chunk| {
                let keys = shuffle_keys(&content_hashes(chunk, &source)?, hash_seed);
                let mut columns: Vec<ArrayRef> = chunk.columns().to_vec();
                columns.push(Arc::new(keys));
                Ok(columns)
            },
        ))
    }

    crate::exec::metrics_of_field!();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `batch` as a plan.
    fn memory_exec(batch: &RecordBatch) -> Result<Arc<dyn ExecutionPlan>> {
        let exec = datafusion::datasource::memory::MemorySourceConfig::try_new_exec(
            &[vec![batch.clone()]],
            batch.schema(),
            None,
        )?;
        Ok(exec)
    }

    /// The keys `ShuffleKeyExec` appends to `batch` with `source`.
    async fn keys(batch: &RecordBatch, source: KeySource) -> Result<Vec<u64>> {
        let exec =
            ShuffleKeyExec::try_new(memory_exec(batch)?, 5, 2)?.with_source(source)?;
        let ctx = datafusion::prelude::SessionContext::new();
        let out =
            datafusion::physical_plan::collect(Arc::new(exec), ctx.task_ctx()).await?;
        Ok(out
            .iter()
            .flat_map(|b| {
                b.column(b.num_columns() - 1)
                    .as_primitive::<UInt64Type>()
                    .values()
                    .to_vec()
            })
            .collect())
    }

    #[tokio::test]
    async fn a_stored_content_hash_keys_rows_like_the_columns_it_hashes() -> Result<()> {
        use datafusion::arrow::array::{Int64Array, StringArray};
        let a: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3, 4]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["w", "x", "y", "z"]));
        let hash: ArrayRef = Arc::new(row_key_hash(
            &[Arc::clone(&b), Arc::clone(&a)],
            CONTENT_HASH_SEED,
        )?);
        let batch = RecordBatch::try_from_iter(vec![("a", a), ("b", b), ("h", hash)])?;
        let by_columns = keys(&batch, KeySource::Columns(vec![1, 0])).await?;
        assert_eq!(keys(&batch, KeySource::ContentHash(2)).await?, by_columns);
        assert_ne!(
            keys(&batch, KeySource::Columns(vec![0, 1])).await?,
            by_columns
        );
        assert_ne!(keys(&batch, KeySource::AllColumns).await?, by_columns);
        let err = ShuffleKeyExec::try_new(memory_exec(&batch)?, 5, 2)?
            .with_source(KeySource::ContentHash(0))
            .expect_err("an Int64 column is no content hash");
        assert!(err.to_string().contains("not UInt64"), "{err}");
        Ok(())
    }

    #[test]
    fn epochs_and_seeds_give_unrelated_hash_seeds() {
        let seeds: std::collections::HashSet<u64> = (0..10)
            .flat_map(|seed| (0..10).map(move |epoch| shuffle_seed(seed, epoch)))
            .collect();
        assert_eq!(seeds.len(), 100);
        assert_ne!(shuffle_seed(1, 0), shuffle_seed(0, 1));
    }
}
