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

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet, RecordOutput,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

use crate::rand::splitmix64;
use crate::sql::row_key_hash;

/// Name of the key column between [`ShuffleKeyExec`] and the sort.
pub const SHUFFLE_KEY_COLUMN: &str = "__sqlfeed_shuffle_key";

/// The hash seed of `(seed, epoch)`: SplitMix64 of `seed ^ SplitMix64(epoch)`,
/// so neighbouring seeds and epochs give unrelated permutations.
pub fn shuffle_seed(seed: u64, epoch: u64) -> u64 {
    splitmix64(seed ^ splitmix64(epoch))
}

/// Largest batch handed to the sort: 1/64 of a partition's share of the
/// memory limit (at least 256 KiB). The external sort must hold a whole
/// batch to accept it; one batch of wide rows (strings of kilobytes built
/// with doubling capacity) can otherwise exceed the whole share.
fn max_batch_bytes(context: &TaskContext, partitions: usize) -> usize {
    match context.memory_pool().memory_limit() {
        MemoryLimit::Finite(limit) => (limit / partitions.max(1) / 64).max(256 << 10),
        _ => usize::MAX,
    }
}

/// `batch` as one or more compact batches of at most about `max_bytes` each.
/// Slices would share (and be charged for) the whole buffers, so chunks are
/// copied.
fn split_to_fit(batch: &RecordBatch, max_bytes: usize) -> Result<Vec<RecordBatch>> {
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
    /// Indices of the input columns hashed, in hashing order; `None`: all.
    key_columns: Option<Vec<usize>>,
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
            return Err(DataFusionError::Plan(format!(
                "SHUFFLE: the query already has a column named {SHUFFLE_KEY_COLUMN}"
            )));
        }
        let mut fields: Vec<Arc<Field>> = input_schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(
            SHUFFLE_KEY_COLUMN,
            DataType::UInt64,
            false,
        )));
        let schema = Arc::new(Schema::new_with_metadata(
            fields,
            input_schema.metadata().clone(),
        ));
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            input.output_partitioning().clone(),
            input.pipeline_behavior(),
            input.boundedness(),
        );
        Ok(Self {
            input,
            seed,
            epoch,
            key_columns: None,
            schema,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Hashes only the input columns at `indices`, in that order (see
    /// [`super::ShuffleNode`]'s key); an index out of range is an internal
    /// error.
    pub fn with_key_columns(mut self, indices: Option<Vec<usize>>) -> Result<Self> {
        let columns = self.input.schema().fields().len();
        if let Some(bad) = indices.iter().flatten().find(|&&i| i >= columns) {
            return Err(DataFusionError::Internal(format!(
                "shuffle key column {bad} out of range: the input has {columns} columns"
            )));
        }
        self.key_columns = indices;
        Ok(self)
    }

    /// The input columns hashed (`None`: all).
    pub fn key_columns(&self) -> Option<&[usize]> {
        self.key_columns.as_deref()
    }

    /// Names of the hashed columns, for display.
    fn key_names(&self) -> Option<String> {
        let schema = self.input.schema();
        self.key_columns.as_ref().map(|indices| {
            indices
                .iter()
                .map(|&i| schema.field(i).name().as_str())
                .collect::<Vec<_>>()
                .join(", ")
        })
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
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
                match self.key_names() {
                    Some(names) => write!(f, ", key=[{names}]"),
                    None => Ok(()),
                }
            }
            DisplayFormatType::TreeRender => {
                write!(f, "seed={}\nepoch={}", self.seed, self.epoch)?;
                match self.key_names() {
                    Some(names) => write!(f, "\nkey=[{names}]"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl ExecutionPlan for ShuffleKeyExec {
    fn name(&self) -> &str {
        "ShuffleKeyExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let child = super::single_child(self.name(), &children)?;
        Ok(Arc::new(
            Self::try_new(child, self.seed, self.epoch)?
                .with_key_columns(self.key_columns.clone())?,
        ))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let max_batch_bytes =
            max_batch_bytes(&context, self.input.output_partitioning().partition_count());
        let input = self.input.execute(partition, context)?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let schema = Arc::clone(&self.schema);
        let hash_seed = shuffle_seed(self.seed, self.epoch);
        let key_columns = self.key_columns.clone();
        let keyed = input.flat_map(move |batch| {
            let keyed = batch.and_then(|batch| {
                let timer = baseline.elapsed_compute().timer();
                let chunks = split_to_fit(&batch, max_batch_bytes)?;
                let mut out = Vec::with_capacity(chunks.len());
                for chunk in chunks {
                    let keys = match &key_columns {
                        None => row_key_hash(chunk.columns(), hash_seed)?,
                        Some(indices) => {
                            let hashed: Vec<ArrayRef> = indices
                                .iter()
                                .map(|&i| Arc::clone(chunk.column(i)))
                                .collect();
                            row_key_hash(&hashed, hash_seed)?
                        }
                    };
                    let mut columns: Vec<ArrayRef> = chunk.columns().to_vec();
                    columns.push(Arc::new(keys));
                    let keyed = RecordBatch::try_new(Arc::clone(&schema), columns)?;
                    out.push(Ok(keyed.record_output(&baseline)));
                }
                timer.done();
                Ok(out)
            });
            futures::stream::iter(match keyed {
                Ok(batches) => batches,
                Err(e) => vec![Err(e)],
            })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            keyed,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_and_seeds_give_unrelated_hash_seeds() {
        let seeds: std::collections::HashSet<u64> = (0..10)
            .flat_map(|seed| (0..10).map(move |epoch| shuffle_seed(seed, epoch)))
            .collect();
        assert_eq!(seeds.len(), 100);
        assert_ne!(shuffle_seed(1, 0), shuffle_seed(0, 1));
    }
}
