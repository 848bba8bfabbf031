//! [`RangeBucketExec`]: routes each row of a keyed shuffle to the partition
//! that owns its key's range, so that a distributed shuffle's final stage is
//! `P` tasks, each sorting one range, instead of one task merging all.
//!
//! ```text
//!  PermuteExec (per partition: copies numbered, final keys, sorted)
//!    RangeBucketExec: __sqlfeed_range_bucket = route[⌊key · P / 2⁶⁴⌋]
//!      │ RepartitionExec: Hash(__sqlfeed_range_bucket, P)   ◄── a stage boundary
//!      ▼   (Ballista's shuffle files)
//!  PermuteExec (Ranged, per partition: sort by final key)
//!  ShuffleExec (ranged): output partition i = range i in key order
//!  global order = partitions 0, 1, …, P-1 read in turn
//! ```
//!
//! # Why a hash exchange
//! Ballista 55 cuts stages only at hash repartitions (a range repartition is
//! removed from distributed plans), and DataFusion's distribution rule keeps
//! an exchange only when an operator above requires it. So the range
//! becomes a hash: `route[b]` is a value whose hash partition (DataFusion's
//! `BatchPartitioner`, which Ballista's shuffle writer reproduces byte for
//! byte) is exactly `b`, found once per `P` by trying values in turn.
//!
//! # Ordering and balance
//! Keys are uniform 64-bit hashes, so ranges of equal width hold equal row
//! counts (± sampling noise). Within a partition rows arrive in any order;
//! the ranged [`super::PermuteExec`] above sorts them. Every key of range
//! `i` is below every key of range `i+1`, so reading the output partitions
//! in order gives exactly the single-partition shuffle's order.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics;
use datafusion::physical_plan::repartition::BatchPartitioner;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

use super::SHUFFLE_KEY_COLUMN;

/// Name of the column [`RangeBucketExec`] adds (before the key).
pub const RANGE_BUCKET_COLUMN: &str = "__sqlfeed_range_bucket";

/// The range of `key` among `partitions` equal ranges of the u64 space.
pub(crate) fn range_of(key: u64, partitions: usize) -> usize {
    ((u128::from(key) * partitions as u128) >> 64) as usize
}

/// A one-column (u64 bucket) schema and the hash partitioner an exchange on
/// that column into `partitions` uses.
fn bucket_partitioner(partitions: usize) -> Result<(SchemaRef, BatchPartitioner)> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        RANGE_BUCKET_COLUMN,
        DataType::UInt64,
        false,
    )]));
    let column: Arc<dyn PhysicalExpr> = Arc::new(Column::new(RANGE_BUCKET_COLUMN, 0));
    let partitioner = BatchPartitioner::try_new(
        Partitioning::Hash(vec![column], partitions),
        metrics::Time::new(),
        0,
        1,
    )?;
    Ok((schema, partitioner))
}

/// For each partition `i < partitions`, a value whose hash partition is `i`.
pub(crate) fn route_values(partitions: usize) -> Result<Vec<u64>> {
    let (schema, mut partitioner) = bucket_partitioner(partitions)?;
    let mut route: Vec<Option<u64>> = vec![None; partitions];
    let mut next = 0u64;
    while route.iter().any(Option::is_none) {
        // Each value lands in partition i with probability 1/P: a few P
        // candidates cover every partition.
        let candidates =
            UInt64Array::from_iter_values(next..next + 4 * partitions as u64);
        next += 4 * partitions as u64;
        if next > 1 << 32 {
            return Err(DataFusionError::Internal(format!(
                "no value hashes to every one of {partitions} partitions"
            )));
        }
        let batch =
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(candidates)])?;
        for routed in partitioner.partition_iter(batch)? {
            let (partition, rows) = routed?;
            if let Some(slot) = route.get_mut(partition)
                && slot.is_none()
                && rows.num_rows() > 0
            {
                *slot = Some(rows.column(0).as_primitive::<UInt64Type>().value(0));
            }
        }
    }
    Ok(route.into_iter().flatten().collect())
}

/// Adds [`RANGE_BUCKET_COLUMN`] before the key; see the module docs.
#[derive(Debug)]
pub struct RangeBucketExec {
    input: Arc<dyn ExecutionPlan>,
    partitions: usize,
    route: Arc<Vec<u64>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl RangeBucketExec {
    /// Routes `input` (whose last column is the shuffle key) to `partitions`
    /// key ranges.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, partitions: usize) -> Result<Self> {
        let input_schema = input.schema();
        let fields = input_schema.fields();
        if fields.last().map(|f| f.name().as_str()) != Some(SHUFFLE_KEY_COLUMN) {
            return Err(DataFusionError::Internal(format!(
                "RangeBucketExec needs {SHUFFLE_KEY_COLUMN} as the last input column"
            )));
        }
        let partitions = partitions.max(1);
        let mut with_bucket: Vec<Arc<Field>> = fields[..fields.len() - 1].to_vec();
        with_bucket.push(Arc::new(Field::new(
            RANGE_BUCKET_COLUMN,
            DataType::UInt64,
            false,
        )));
        with_bucket.push(Arc::clone(&fields[fields.len() - 1]));
        let schema = Arc::new(Schema::new_with_metadata(
            with_bucket,
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
            partitions,
            route: Arc::new(route_values(partitions)?),
            schema,
            properties: Arc::new(properties),
        })
    }

    /// The number of key ranges.
    pub fn partitions(&self) -> usize {
        self.partitions
    }
}

impl DisplayAs for RangeBucketExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => write!(f, "ranges={}", self.partitions),
            _ => write!(f, "RangeBucketExec: ranges={}", self.partitions),
        }
    }
}

impl ExecutionPlan for RangeBucketExec {
    fn name(&self) -> &str {
        "RangeBucketExec"
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

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let child = super::single_child(self.name(), &children)?;
        Ok(Arc::new(Self::try_new(child, self.partitions)?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let (schema, route, partitions) = (
            Arc::clone(&self.schema),
            Arc::clone(&self.route),
            self.partitions,
        );
        let output = input.map(move |batch| {
            let batch = batch?;
            let key_index = batch.num_columns() - 1;
            let keys = batch.column(key_index).as_primitive::<UInt64Type>();
            if keys.null_count() > 0 {
                return Err(DataFusionError::Internal(
                    "a shuffle key is NULL".to_string(),
                ));
            }
            let buckets: UInt64Array = keys
                .values()
                .iter()
                .map(|&key| route[range_of(key, partitions)])
                .collect();
            let mut columns = batch.columns()[..key_index].to_vec();
            columns.push(Arc::new(buckets));
            columns.push(Arc::clone(batch.column(key_index)));
            Ok(RecordBatch::try_new(Arc::clone(&schema), columns)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            output,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_partition_has_a_route_that_hashes_to_it() -> Result<()> {
        for partitions in [1, 2, 3, 4, 7, 16, 64] {
            let route = route_values(partitions)?;
            assert_eq!(route.len(), partitions);
            // Routed again through the partitioner, value i lands in i.
            let (schema, mut partitioner) = bucket_partitioner(partitions)?;
            let batch = RecordBatch::try_new(
                schema,
                vec![Arc::new(UInt64Array::from(route.clone()))],
            )?;
            for routed in partitioner.partition_iter(batch)? {
                let (partition, rows) = routed?;
                let values = rows.column(0).as_primitive::<UInt64Type>();
                for value in values.values() {
                    assert_eq!(route[partition], *value, "{partitions} partitions");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn ranges_are_ordered_and_cover_the_key_space() {
        for partitions in [1, 3, 4, 10] {
            assert_eq!(range_of(0, partitions), 0);
            assert_eq!(range_of(u64::MAX, partitions), partitions - 1);
            let mut last = 0;
            for step in 0..=1000u64 {
                let key = (u64::MAX / 1000) * step;
                let range = range_of(key, partitions);
                assert!(range >= last && range < partitions);
                last = range;
            }
        }
    }
}
