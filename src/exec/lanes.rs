//! The order of an unshuffled query's partitions read as one stream: turns
//! of `T` rows, lane by lane in partition order.
//!
//! ```text
//!  lane 0: ██████████▌       turn = T rows (the session's batch size)
//!  lane 1: ███████
//!  lane 2: ████████████████
//!
//!  out:    [0: T][1: T][2: T][0: T][1: rest][2: T][0: rest][2: T][2: rest]
//! ```
//!
//! # Why rows, not record batches
//! How an operator cuts its output into record batches is not part of the
//! data: a function evaluated in parallel emits many small batches, a
//! filter emits short ones, a cache or a cluster's shuffle files keep the
//! batches they were given. Turns counted in rows make the order a function
//! of each lane's row sequence alone, so the embedded engine, a cluster job
//! (whose result partitions are the same lanes) and a cached epoch give the
//! same batches. A lane that ends gives up the rest of its turn; an empty
//! record batch is no turn at all.
//!
//! # Memory
//! At most one record batch per lane is held back (the rest of a batch
//! that straddles a turn); callers decide how much each lane reads ahead.
//!
//! # As an operator
//! [`LaneInterleaveExec`] is the interleave as a plan node: one partition,
//! each lane read ahead by two record batches. Placed under a projection
//! that runs costly functions, it lets those functions run on every core
//! over the one ordered stream, instead of one lane's share of the cores
//! while the other lanes wait for their turn: the rows are the same, in the
//! same order, because a projection gives one row per row and turns are
//! counted in rows.

use std::fmt;
use std::sync::Arc;

use super::BatchStream;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::common::spawn_buffered;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::StreamExt;

/// Record batches each lane reads ahead of the interleave.
pub const LANE_READ_AHEAD: usize = 2;

/// The partitions of `input` as one stream in turns of `turn_rows` rows,
/// each read ahead by [`LANE_READ_AHEAD`] record batches: the order an
/// unshuffled feed reads them in.
pub fn ordered_partitions(
    input: &Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
    turn_rows: usize,
) -> Result<SendableRecordBatchStream> {
    let partitions = input.output_partitioning().partition_count();
    if partitions == 1 {
        return input.execute(0, context);
    }
    let lanes = (0..partitions)
        .map(|p| {
            Ok(spawn_buffered(
                input.execute(p, Arc::clone(&context))?,
                LANE_READ_AHEAD,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(interleave_lanes(input.schema(), lanes, turn_rows))
}

/// The partitions of its input read as one, in turns of `turn_rows` rows
/// ([`ordered_partitions`]); see the module docs.
#[derive(Debug)]
pub struct LaneInterleaveExec {
    input: Arc<dyn ExecutionPlan>,
    turn_rows: usize,
    properties: Arc<PlanProperties>,
}

impl LaneInterleaveExec {
    /// Interleaves `input`'s partitions in turns of `turn_rows` rows.
    pub fn new(input: Arc<dyn ExecutionPlan>, turn_rows: usize) -> Self {
        let properties = Arc::new(crate::exec::one_bounded_partition(
            input.schema(),
            EmissionType::Incremental,
        ));
        Self {
            input,
            turn_rows: turn_rows.max(1),
            properties,
        }
    }
}

impl DisplayAs for LaneInterleaveExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "LaneInterleaveExec: {} lanes, turns of {} rows",
            self.input.output_partitioning().partition_count(),
            self.turn_rows
        )
    }
}

impl ExecutionPlan for LaneInterleaveExec {
    crate::exec::one_input_operator! {
        name: "LaneInterleaveExec",
        properties: own,
        rebuild: |this, child| Ok(Self::new(child, this.turn_rows)),
    }

    // The lanes are read as they are: repartitioning them would change
    // the order.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    // Every row of every lane, once: the rows are its input's.
    crate::exec::statistics_of_one_input!(rows_passed_through, whole input);

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        crate::exec::only_partition("LaneInterleaveExec", partition)?;
        ordered_partitions(&self.input, ctx, self.turn_rows)
    }
}

/// One lane: its stream and the part of a batch that did not fit a turn.
struct Lane {
    stream: SendableRecordBatchStream,
    held: Option<RecordBatch>,
}

/// The rows of `lanes` in turns of `turn_rows` rows, in lane order; see the
/// module docs. The first error of any lane ends the stream.
pub fn interleave_lanes(
    schema: SchemaRef,
    lanes: Vec<SendableRecordBatchStream>,
    turn_rows: usize,
) -> SendableRecordBatchStream {
    let turn_rows = turn_rows.max(1);
    let lanes: Vec<Option<Lane>> = lanes
        .into_iter()
        .map(|stream| Some(Lane { stream, held: None }))
        .collect();
    // (lanes, the lane whose turn it is, rows left in that turn)
    let state = (lanes, 0usize, turn_rows);
    let stream =
        futures::stream::unfold(state, move |(mut lanes, mut index, mut left)| {
            async move {
                loop {
                    if lanes.iter().all(Option::is_none) {
                        return None;
                    }
                    let Some(lane) = lanes[index].as_mut() else {
                        (index, left) = ((index + 1) % lanes.len(), turn_rows);
                        continue;
                    };
                    let batch = match lane.held.take() {
                        Some(batch) => batch,
                        None => match lane.stream.next().await {
                            Some(Ok(batch)) => batch,
                            Some(Err(e)) => {
                                // Nothing after an error: end here.
                                lanes.iter_mut().for_each(|l| *l = None);
                                return Some((Err(e), (lanes, index, left)));
                            }
                            None => {
                                lanes[index] = None;
                                (index, left) = ((index + 1) % lanes.len(), turn_rows);
                                continue;
                            }
                        },
                    };
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    let take = batch.num_rows().min(left);
                    if take < batch.num_rows() {
                        lane.held = Some(batch.slice(take, batch.num_rows() - take));
                    }
                    left -= take;
                    if left == 0 {
                        (index, left) = ((index + 1) % lanes.len(), turn_rows);
                    }
                    return Some((Ok(batch.slice(0, take)), (lanes, index, left)));
                }
            }
        });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::common::exec_err;
    use datafusion::error::Result;

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]))
    }

    /// A lane holding `values` cut into record batches of `cuts` rows.
    fn lane(values: std::ops::Range<i64>, cuts: &[usize]) -> SendableRecordBatchStream {
        let values: Vec<i64> = values.collect();
        let mut batches = vec![];
        let (mut at, mut cut) = (0, 0);
        while at < values.len() {
            let len = cuts[cut % cuts.len()].min(values.len() - at);
            let array = Int64Array::from(values[at..at + len].to_vec());
            batches.push(Ok(
                RecordBatch::try_new(schema(), vec![Arc::new(array)]).expect("batch")
            ));
            (at, cut) = (at + len, cut + 1);
        }
        Box::pin(RecordBatchStreamAdapter::new(
            schema(),
            futures::stream::iter(batches),
        ))
    }

    async fn rows(stream: SendableRecordBatchStream) -> Result<Vec<i64>> {
        let batches: Vec<RecordBatch> = stream
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_>>()?;
        Ok(batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect())
    }

    #[tokio::test]
    async fn the_order_does_not_depend_on_how_lanes_cut_their_batches() -> Result<()> {
        let ranges = [0..23, 100..107, 200..241];
        let expected = {
            let lanes = ranges.iter().map(|r| lane(r.clone(), &[1000])).collect();
            rows(interleave_lanes(schema(), lanes, 5)).await?
        };
        // Turns of 5 rows: 0..5, 100..105, 200..205, 5..10, 105..107, 205..210, …
        assert_eq!(
            &expected[..12],
            &[0, 1, 2, 3, 4, 100, 101, 102, 103, 104, 200, 201]
        );
        assert_eq!(expected.len(), 23 + 7 + 41);
        for cuts in [&[1][..], &[3, 0, 7], &[5], &[2, 9, 4, 1]] {
            let lanes = ranges.iter().map(|r| lane(r.clone(), cuts)).collect();
            let got = rows(interleave_lanes(schema(), lanes, 5)).await?;
            assert_eq!(got, expected, "cuts {cuts:?}");
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_lane_error_ends_the_stream() -> Result<()> {
        let failing: SendableRecordBatchStream = Box::pin(RecordBatchStreamAdapter::new(
            schema(),
            futures::stream::iter(vec![exec_err!("lost")]),
        ));
        let lanes = vec![lane(0..3, &[3]), failing, lane(10..20, &[2])];
        let mut stream = interleave_lanes(schema(), lanes, 4);
        assert_eq!(
            stream.next().await.map(|b| b.map(|b| b.num_rows()).ok()),
            Some(Some(3))
        );
        assert!(matches!(stream.next().await, Some(Err(_))));
        assert!(stream.next().await.is_none());
        Ok(())
    }
}
