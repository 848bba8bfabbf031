//! [`StoredOrderExec`]: rows stored in one epoch's order by position (a
//! feed's epoch cache), each given where it comes in that order, so that
//! [`super::PositionShuffleExec`] orders them as any later epoch of the
//! files would.
//!
//! ```text
//!  epoch b (a cache miss): the files ──► PositionShuffleExec(π_b) ──► feed
//!                                                    └──► cache entry, rows
//!                                                         in epoch b's order
//!  epoch e (from the entry):
//!    cache parts (p0 … pN-1, the lanes epoch b was read in)
//!      ──► LaneInterleaveExec: one stream, in turns of the session's batch
//!          size (the feed's order of lanes)
//!      ──► StoredOrderExec: each row + (STORED_ROWS, i), i = 0, 1, …
//!      ──► PositionShuffleExec over the stored order: position p holds
//!          stored row π_b⁻¹(π_e(p)), the row of rank π_e(p)
//! ```
//!
//! # The same batches
//! Row `i` of the entry is the row at position `i` of epoch `b`, the row of
//! canonical rank `π_b(i)` ([`super::IndexPermutation::over_stored`]): so
//! epoch `e` read from the entry puts at position `p` the row of rank
//! `π_e(p)`, as read from the files. No rank is stored; the entry's layout
//! is the order (its parts are read in the turns the feed read them in,
//! see `crate::exec::lanes`).
//!
//! # Memory
//! Streams: it adds two columns to each batch of its one input partition.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    DictionaryArray, Int32Array, Int64Array, RecordBatch, StringArray,
};
use datafusion::arrow::datatypes::{Field, Int32Type, Schema, SchemaRef};
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
};
use futures::StreamExt;

use super::scan_position::{
    POSITION_FILE_COLUMN, POSITION_ROW_COLUMN, position_file_type,
};
use crate::exec::BatchStream;

/// The one "file" stored rows are ranked in.
pub(super) const STORED_ROWS: &str = "stored rows";

/// Its input's one partition (the stored rows in order, through
/// `crate::exec::lanes::LaneInterleaveExec`), each row with [`STORED_ROWS`]
/// and its index in that stream as the two position columns; see the
/// module docs.
#[derive(Debug)]
pub struct StoredOrderExec {
    input: Arc<dyn ExecutionPlan>,
    schema: SchemaRef,
    properties: Arc<datafusion::physical_plan::PlanProperties>,
}

impl StoredOrderExec {
    /// `input`'s rows, numbered; more than one input partition (no order
    /// among them) is an internal error.
    pub fn try_new(input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let partitions = input.output_partitioning().partition_count();
        if partitions != 1 {
            return internal_err!(
                "StoredOrderExec numbers one ordered partition, got {partitions}"
            );
        }
        let input_schema = input.schema();
        let mut fields = input_schema.fields().to_vec();
        fields.push(Arc::new(Field::new(
            POSITION_FILE_COLUMN,
            position_file_type(),
            false,
        )));
        fields.push(Arc::new(Field::new(
            POSITION_ROW_COLUMN,
            datafusion::arrow::datatypes::DataType::Int64,
            false,
        )));
        let schema = Arc::new(Schema::new_with_metadata(
            fields,
            input_schema.metadata().clone(),
        ));
        let properties = Arc::new(crate::exec::one_bounded_partition(
            Arc::clone(&schema),
            EmissionType::Incremental,
        ));
        Ok(Self {
            input,
            schema,
            properties,
        })
    }
}

impl DisplayAs for StoredOrderExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "StoredOrderExec")
    }
}

impl ExecutionPlan for StoredOrderExec {
    crate::exec::one_input_operator! {
        name: "StoredOrderExec",
        properties: own,
        rebuild: |_this, child| Self::try_new(child),
    }

    // The one partition is the stored order: repartitioning it would
    // change it.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    crate::exec::statistics_of_one_input!(rows_passed_through, whole input);

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        crate::exec::only_partition("StoredOrderExec", partition)?;
        let rows = self.input.execute(0, ctx)?;
        let schema = Arc::clone(&self.schema);
        let file = Arc::new(StringArray::from(vec![STORED_ROWS]));
        let mut next: i64 = 0;
        let numbered = rows.map(move |batch| {
            let batch = batch?;
            let n = batch.num_rows();
            let mut columns = batch.columns().to_vec();
            columns.push(Arc::new(DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(vec![0; n]),
                Arc::clone(&file) as _,
            )?));
            columns.push(Arc::new(Int64Array::from_iter_values(
                next..next + n as i64,
            )));
            next += n as i64;
            Ok(RecordBatch::try_new(Arc::clone(&schema), columns)?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            numbered,
        )))
    }
}
