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
//!  ShuffleMergeExec (ranged): output partition i = range i in key order
//!  global order = partitions 0, 1, …, P-1 read in turn
//! ```
//!
//! A *counted* bucket (a cluster feed dealt to ranks, see `deal.rs`) also
//! ends each task with one count row per range, so that the range's task
//! learns how many rows come before its range.
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

use crate::exec::{BatchStream, Setting};
use datafusion::arrow::array::{
    Array, AsArray, BinaryArray, RecordBatch, UInt32Array, UInt64Array, new_null_array,
};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::Statistics;
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{Partitioning, PhysicalExpr};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::metrics;
use datafusion::physical_plan::repartition::BatchPartitioner;
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
};
use futures::StreamExt;

/// Name of the column [`RangeBucketExec`] adds (before the key).
pub const RANGE_BUCKET_COLUMN: &str = "__sqlfeed_range_bucket";

/// Name of the column a counted [`RangeBucketExec`] adds (before the
/// bucket): null on data rows, the payload on count rows.
pub const RANGE_COUNTS_COLUMN: &str = "__sqlfeed_range_counts";

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
            return internal_err!(
                "no value hashes to every one of {partitions} partitions"
            );
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
    /// Whether each task ends with its row counts per range (see
    /// [`RangeBucketExec::try_new_counted`]).
    counted: bool,
    route: Arc<Vec<u64>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl RangeBucketExec {
    /// Routes `input` (whose last column is the shuffle key) to `partitions`
    /// key ranges.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, partitions: usize) -> Result<Self> {
        Self::try_new_counted(input, partitions, false)
    }

    /// Like [`RangeBucketExec::try_new`]; with `counted`, the output has a
    /// [`RANGE_COUNTS_COLUMN`] (null on data rows) and each task that saw
    /// rows ends with one *count row* per range: a copy of its first row
    /// whose counts column holds `(range, rows of this task in range 0, 1,
    /// …)` and whose key is the range's first key, so that the range's sort
    /// puts it first. Summed over tasks, a range's task learns how many rows
    /// every range holds: its global offset (see `deal.rs`).
    pub fn try_new_counted(
        input: Arc<dyn ExecutionPlan>,
        partitions: usize,
        counted: bool,
    ) -> Result<Self> {
        let input_schema = input.schema();
        super::key::check_key_is_last("RangeBucketExec", &input_schema)?;
        let fields = input_schema.fields();
        let partitions = partitions.max(1);
        let mut with_bucket: Vec<Arc<Field>> = fields[..fields.len() - 1].to_vec();
        if counted {
            with_bucket.push(Arc::new(Field::new(
                RANGE_COUNTS_COLUMN,
                DataType::Binary,
                true,
            )));
        }
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
        let properties = crate::exec::row_wise_properties(&input, Arc::clone(&schema));
        Ok(Self {
            input,
            partitions,
            counted,
            route: Arc::new(route_values(partitions)?),
            schema,
            properties,
        })
    }

    /// The number of key ranges.
    pub fn partitions(&self) -> usize {
        self.partitions
    }

    /// Whether tasks end with count rows.
    pub fn is_counted(&self) -> bool {
        self.counted
    }
}

impl DisplayAs for RangeBucketExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let mut settings: Vec<Setting> = vec![("ranges", &self.partitions)];
        if self.counted {
            settings.push(("counted", &true));
        }
        crate::exec::fmt_settings(f, t, "RangeBucketExec", &settings)
    }
}

impl ExecutionPlan for RangeBucketExec {
    crate::exec::one_input_operator! {
        name: "RangeBucketExec",
        properties: own,
        rebuild: |this, child| Self::try_new_counted(child, this.partitions, this.counted),
    }

    crate::exec::keeps_input_order!();

    // Every row, plus (counted) a few count rows per task.
    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let statistics = crate::exec::rows_passed_through(input_stats, &self.schema);
        Ok(if self.counted {
            Arc::new(Arc::unwrap_or_clone(statistics).to_inexact())
        } else {
            statistics
        })
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let input = self.input.execute(partition, ctx)?;
        let bucketer = Bucketer {
            schema: Arc::clone(&self.schema),
            route: Arc::clone(&self.route),
            counted: self.counted,
            counts: vec![0; self.partitions],
            first_row: None,
        };
        // (input, what routes it; None once the count rows went out)
        let state = (input, Some(bucketer));
        let output = futures::stream::unfold(state, |(mut input, bucketer)| async move {
            let mut bucketer = bucketer?;
            match input.next().await {
                Some(batch) => {
                    let routed = batch.and_then(|batch| bucketer.route(&batch));
                    Some((routed, (input, Some(bucketer))))
                }
                // The input ended: this task's count rows, if any.
                None => match bucketer.count_rows() {
                    Ok(Some(batch)) => Some((Ok(batch), (input, None))),
                    Ok(None) => None,
                    Err(e) => Some((Err(e), (input, None))),
                },
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            output,
        )))
    }
}

/// The state of one [`RangeBucketExec`] partition.
struct Bucketer {
    schema: SchemaRef,
    route: Arc<Vec<u64>>,
    counted: bool,
    /// Rows of this task per range (counted only).
    counts: Vec<u64>,
    /// A copy of the task's first row: the body of its count rows.
    first_row: Option<RecordBatch>,
}

impl Bucketer {
    /// `batch` (data…, key) with its routes (and null counts).
    fn route(&mut self, batch: &RecordBatch) -> Result<RecordBatch> {
        let key_index = batch.num_columns() - 1;
        let keys = batch.column(key_index).as_primitive::<UInt64Type>();
        if keys.null_count() > 0 {
            return internal_err!("a shuffle key is NULL");
        }
        let partitions = self.counts.len();
        let buckets: UInt64Array = keys
            .values()
            .iter()
            .map(|&key| self.route[range_of(key, partitions)])
            .collect();
        if self.counted {
            for &key in keys.values() {
                self.counts[range_of(key, partitions)] += 1;
            }
        }
        if self.counted && self.first_row.is_none() && batch.num_rows() > 0 {
            self.first_row = Some(take_record_batch(batch, &UInt32Array::from(vec![0]))?);
        }
        let mut columns = batch.columns()[..key_index].to_vec();
        if self.counted {
            columns.push(new_null_array(&DataType::Binary, batch.num_rows()));
        }
        columns.push(Arc::new(buckets));
        columns.push(Arc::clone(batch.column(key_index)));
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// One count row per range (see [`RangeBucketExec::try_new_counted`]),
    /// or nothing for a task without rows (it adds 0 everywhere).
    fn count_rows(&self) -> Result<Option<RecordBatch>> {
        let Some(first_row) = self.first_row.as_ref().filter(|_| self.counted) else {
            return Ok(None);
        };
        let partitions = self.counts.len();
        let copies = UInt32Array::from(vec![0; partitions]);
        let body = take_record_batch(first_row, &copies)?;
        let key_index = body.num_columns() - 1;
        let counts: BinaryArray = (0..partitions)
            .map(|range| Some(encode_counts(range, &self.counts)))
            .collect();
        let mut columns = body.columns()[..key_index].to_vec();
        columns.push(Arc::new(counts));
        columns.push(Arc::new(UInt64Array::from(self.route.as_ref().clone())));
        columns.push(Arc::new(UInt64Array::from_iter_values(
            (0..partitions).map(|range| first_key(range, partitions)),
        )));
        Ok(Some(RecordBatch::try_new(
            Arc::clone(&self.schema),
            columns,
        )?))
    }
}

/// The smallest key of range `range` among `partitions`.
pub(crate) fn first_key(range: usize, partitions: usize) -> u64 {
    // ⌈range · 2⁶⁴ / partitions⌉, below 2⁶⁴ for range < partitions.
    ((range as u128) << 64).div_ceil(partitions as u128) as u64
}

/// A count row's payload: the range it was sent to, then the task's row
/// counts of every range, as little-endian u64s.
fn encode_counts(range: usize, counts: &[u64]) -> Vec<u8> {
    std::iter::once(range as u64)
        .chain(counts.iter().copied())
        .flat_map(u64::to_le_bytes)
        .collect()
}

/// The range and counts of a count row's payload, for `partitions` ranges.
pub(crate) fn decode_counts(
    payload: &[u8],
    partitions: usize,
) -> Option<(usize, Vec<u64>)> {
    if payload.len() != 8 * (partitions + 1) {
        return None;
    }
    let mut values = payload
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()));
    let range = values.next()? as usize;
    Some((range, values.collect()))
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
    fn a_ranges_first_key_is_its_smallest() {
        for partitions in [1usize, 3, 4, 7, 28] {
            for range in 0..partitions {
                let key = first_key(range, partitions);
                assert_eq!(range_of(key, partitions), range);
                if key > 0 {
                    assert_eq!(range_of(key - 1, partitions), range - 1);
                }
            }
        }
    }

    #[test]
    fn count_payloads_round_trip_and_refuse_other_sizes() {
        let payload = encode_counts(2, &[5, 0, 7, u64::MAX]);
        assert_eq!(
            decode_counts(&payload, 4),
            Some((2, vec![5, 0, 7, u64::MAX]))
        );
        assert_eq!(decode_counts(&payload, 3), None);
        assert_eq!(decode_counts(&payload[..39], 4), None);
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
