//! [`PositionKeyExec`]: a `SHUFFLE BY POSITION` on a cluster, keyed by each
//! row's position so that the stage-shaped shuffle of `SHUFFLE` (key
//! ranges, a sort per range, the deal to ranks) gives the embedded order.
//!
//! ```text
//!  scheduler, planning the job:
//!    the shuffle's input with each row's file and row index (as embedded)
//!    row groups in rank order, rows per row group: the footers, or the
//!      rows the filters keep: counted by a feed's rank (which runs every
//!      function, Python ones too) and sent with the job
//!      (`sqlfeed.position_bucket_rows`), else counted here by a query of
//!      the filters' columns (RankedRowGroups) ──► carried in the plan
//!
//!  stage 1, on the executors, one task per scan partition; per row:
//!    (file, row index) ──► rank ──► position p = π⁻¹(rank)   (placement.rs)
//!    key = ⌊p · 2⁶⁴ / n⌋ (+1 where that is a range's first key)
//!    output: the input's columns without the two position columns, then
//!      the key
//!        │ RangeBucketExec, hash exchange on the range   ◄── stage boundary
//!        ▼
//!  one task per key range: sort by key, ShuffleMergeExec (ranged; a
//!    feed's job deals each range to the ranks, DealExec)
//!  ranges 0, 1, … read in turn: positions 0, 1, …, n − 1
//! ```
//!
//! # Why it gives the embedded order
//! The key of position `p` grows with `p` (keys are at least 2 apart for
//! fewer than 2⁶³ rows), so sorting by key is sorting by position: the
//! output in range order is the embedded [`super::PositionShuffleExec`]'s
//! (position `p` holds the row of rank `π(p)`), and the same on any
//! number of executors, tasks and partitions, since a row's key depends
//! only on its file, its row index and the rows counted before it. No two
//! rows share a key, so the job never needs the copy stage `SHUFFLE` pays
//! for repeated rows. A key is never its range's first key: a counted
//! range's count rows sort first by taking it (`range.rs`, `deal.rs`).
//!
//! # Under a filter
//! A row's rank counts the rows its row group kept before it, so all of a
//! row group's rows must pass through one task in order: a Parquet scan
//! gives each row group to one byte range, and Ballista runs a stage's
//! operators in one task per scan partition (it removes round-robin
//! repartitions from distributed plans). A row out of order or a row group
//! met by two partitions of one process is an error, never a rank guessed.
//!
//! # Memory
//! Streaming: one batch at a time (cut to fit the sort's share, as
//! `ShuffleKeyExec` cuts), and the placement: one entry per row group.
//!
//! # Ordering
//! Keeps its input's partitioning; rows in the order they come (declared
//! as not kept: the key takes the index of a dropped column, see
//! `maintains_input_order`).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{DataFusionError, internal_err, not_impl_err};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};

use super::permutation::IndexPermutation;
use super::placement::{GroupReaders, Placement, RowPlacer, claim_group};
use super::ranks::RankedRowGroups;
use super::scan_position::{POSITION_FILE_COLUMN, POSITION_ROW_COLUMN};
use crate::config::SqlfeedOptions;
use crate::exec::{BatchStream, Setting};
use crate::shuffle::SHUFFLE_KEY_COLUMN;
use crate::shuffle::key::{keyed_batches, max_batch_bytes};
use crate::shuffle::range::{first_key, range_of};
use crate::shuffle::windowed::{decode_bucket_rows, drops_rows, windowable_scan};

/// The key of position `position` of an epoch of `rows` rows, its keys cut
/// into `ranges` key ranges: positions spread over the u64 space in order,
/// never a range's first key (see the module docs). `rows` is below 2⁶³.
pub(crate) fn position_key(position: u64, rows: u64, ranges: usize) -> u64 {
    let key = ((u128::from(position) << 64) / u128::from(rows.max(1))) as u64;
    if key == first_key(range_of(key, ranges), ranges) {
        key + 1
    } else {
        key
    }
}

/// Where a cluster's shuffle by position places every row: what
/// [`PositionKeyExec`] carries to the executors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionKeys {
    pub seed: u64,
    pub epoch: u64,
    /// The key ranges of the final stage.
    pub ranges: usize,
    /// Under a filter: rows are ranked in their row group by counting.
    pub counted: bool,
    /// `starts[g]`: the rank of row group `g`'s first row; one more entry,
    /// the rows in all.
    pub starts: Vec<u64>,
    /// File path → (first row index, row group in rank order) per row group.
    pub files: Vec<(String, Vec<(u64, usize)>)>,
}

impl PositionKeys {
    /// The rows placed: the epoch's length.
    pub fn rows(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    fn placement(&self) -> Placement {
        Placement {
            permutation: IndexPermutation::new(self.rows(), self.seed, self.epoch),
            starts: self.starts.clone(),
            files: self.files.iter().cloned().collect(),
        }
    }
}

/// Appends each row's position key, from its file and row index; see the
/// module docs.
#[derive(Debug)]
pub struct PositionKeyExec {
    /// The shuffle's input: its rows, then each row's file and row index.
    input: Arc<dyn ExecutionPlan>,
    keys: PositionKeys,
    placement: Arc<Placement>,
    /// Under a filter, which partition counts each row group.
    readers_of: Arc<GroupReaders>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl PositionKeyExec {
    /// Keys `input` (the shuffle's input with its two position columns
    /// last) as `keys` places its rows.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, keys: PositionKeys) -> Result<Self> {
        let input_schema = input.schema();
        let fields = input_schema.fields();
        let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
        if !names.ends_with(&[POSITION_FILE_COLUMN, POSITION_ROW_COLUMN]) {
            return internal_err!(
                "PositionKeyExec needs each row's file and row index as the last columns, \
                 got {}",
                names.join(", ")
            );
        }
        if keys.rows() >= 1 << 63 {
            return not_impl_err!(
                "SHUFFLE BY POSITION on a cluster keys at most 2^63 rows; the query has {}",
                keys.rows()
            );
        }
        // What a damaged plan could hold, named rather than indexed past.
        let groups = keys.starts.len().saturating_sub(1);
        if keys.ranges == 0
            || groups != keys.files.iter().map(|(_, g)| g.len()).sum::<usize>()
            || keys.starts.windows(2).any(|w| w[0] > w[1])
            || keys
                .files
                .iter()
                .flat_map(|(_, g)| g)
                .any(|&(_, group)| group >= groups)
        {
            return internal_err!(
                "PositionKeyExec: {} key ranges, {groups} row groups placed: the plan is damaged",
                keys.ranges
            );
        }
        let mut with_key: Vec<Arc<Field>> = fields[..fields.len() - 2].to_vec();
        with_key.push(Arc::new(Field::new(
            SHUFFLE_KEY_COLUMN,
            DataType::UInt64,
            false,
        )));
        let schema = Arc::new(Schema::new_with_metadata(
            with_key,
            input_schema.metadata().clone(),
        ));
        let properties = crate::exec::row_wise_properties(&input, Arc::clone(&schema));
        Ok(Self {
            input,
            placement: Arc::new(keys.placement()),
            keys,
            readers_of: Arc::default(),
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Plans the key of a shuffle by position of `input` (its rows, then
    /// each row's file and row index) in `(seed, epoch)`, into `ranges` key
    /// ranges: its row groups placed from the footers, or under a filter
    /// counted by a query over `rows` (the rows the shuffle orders) planned
    /// in `state`, which reads only the filters' columns.
    pub async fn plan(
        input: Arc<dyn ExecutionPlan>,
        (seed, epoch): (u64, u64),
        ranges: usize,
        state: &SessionState,
        rows: &LogicalPlan,
    ) -> Result<Self> {
        let scan = windowable_scan(&input).map_err(|why| {
            DataFusionError::NotImplemented(format!(
                "SHUFFLE BY POSITION on a cluster ranks rows by the footers of the \
                 query's Parquet scan, and it {why}: run it embedded, or use SHUFFLE"
            ))
        })?;
        let counted = drops_rows(&input)?;
        let carried = &SqlfeedOptions::of(state.config().options()).position_bucket_rows;
        let groups = if counted && !carried.is_empty() {
            // Counted by the feed's rank, which can run every filter.
            let buckets = decode_bucket_rows(carried)?;
            RankedRowGroups::read_with_buckets(
                Arc::clone(&input),
                scan,
                state.runtime_env(),
                &buckets,
            )
            .await?
        } else {
            RankedRowGroups::read_counting_query(Arc::clone(&input), scan, state, rows)
                .await
                .map_err(|e| match counted {
                    // The count runs here, on the scheduler.
                    true => e.context(
                        "SHUFFLE BY POSITION on a cluster counts the rows the query's \
                         filters keep on the scheduler, reading the filters' columns, and \
                         that failed (a filter calling a Python function, which runs only \
                         on executors, fails there): filter without it, run the feed \
                         embedded, or use SHUFFLE",
                    ),
                    false => e,
                })?
        };
        let keys = PositionKeys {
            seed,
            epoch,
            ranges: ranges.max(1),
            counted,
            starts: groups.starts().to_vec(),
            files: groups.files(),
        };
        Self::try_new(input, keys)
    }

    /// Where it places the rows.
    pub fn keys(&self) -> &PositionKeys {
        &self.keys
    }
}

impl DisplayAs for PositionKeyExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let rows = self.keys.rows();
        let groups = self.keys.starts.len().saturating_sub(1);
        let mut settings: Vec<Setting> = vec![
            ("seed", &self.keys.seed),
            ("epoch", &self.keys.epoch),
            ("rows", &rows),
            ("row_groups", &groups),
            ("ranges", &self.keys.ranges),
        ];
        if self.keys.counted {
            settings.push(("counted", &true));
        }
        crate::exec::fmt_settings(f, t, "PositionKeyExec", &settings)
    }
}

impl ExecutionPlan for PositionKeyExec {
    crate::exec::one_input_operator! {
        name: "PositionKeyExec",
        properties: own,
        rebuild: |this, child| Self::try_new(child, this.keys.clone()),
    }

    // Rows keep their order, but not their columns' indexes: the key takes
    // the index of the input's file column, so DataFusion, which carries a
    // sort through an operator that keeps order by column index, would sort
    // its input by file instead of this output by key.
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    // A task must read its scan partition's rows as they come (row groups
    // counted under a filter), never split round-robin.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        let max_batch_bytes =
            max_batch_bytes(&ctx, self.input.output_partitioning().partition_count());
        let input = self.input.execute(partition, ctx)?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let schema = Arc::clone(&self.schema);
        let readers_of = Arc::clone(&self.readers_of);
        let (counted, rows, ranges) =
            (self.keys.counted, self.keys.rows(), self.keys.ranges);
        // Each batch's rows placed as they come: under a filter the placer
        // counts each row group's rows across batches.
        let mut placer = RowPlacer::new(Arc::clone(&self.placement), counted);
        Ok(keyed_batches(
            input,
            schema,
            baseline,
            max_batch_bytes,
            move |batch| {
                let columns = batch.num_columns() - 2;
                let positions = placer.positions(
                    batch.column(columns).as_ref(),
                    batch.column(columns + 1).as_ref(),
                    |group, path| claim_group(&readers_of, partition, group, path),
                )?;
                let keys: UInt64Array = positions
                    .into_iter()
                    .map(|position| position_key(position, rows, ranges))
                    .collect();
                let mut out: Vec<ArrayRef> = batch.columns()[..columns].to_vec();
                out.push(Arc::new(keys));
                Ok(out)
            },
        ))
    }

    crate::exec::metrics_of_field!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::physical_plan::empty::EmptyExec;

    #[test]
    fn damaged_placements_are_refused_not_indexed() {
        let input: Arc<dyn ExecutionPlan> =
            Arc::new(EmptyExec::new(Arc::new(Schema::new(vec![
                Field::new("x", DataType::Int64, false),
                Field::new(
                    POSITION_FILE_COLUMN,
                    super::super::scan_position::position_file_type(),
                    false,
                ),
                Field::new(POSITION_ROW_COLUMN, DataType::Int64, false),
            ]))));
        let keys = PositionKeys {
            seed: 1,
            epoch: 0,
            ranges: 2,
            counted: false,
            starts: vec![0, 10, 20],
            files: vec![("/a.parquet".into(), vec![(0, 0), (10, 1)])],
        };
        let keyed = PositionKeyExec::try_new(Arc::clone(&input), keys.clone());
        assert_eq!(
            keyed
                .map(|k| k.schema().field(1).name().clone())
                .ok()
                .as_deref(),
            Some(SHUFFLE_KEY_COLUMN)
        );
        for damaged in [
            PositionKeys {
                ranges: 0,
                ..keys.clone()
            },
            PositionKeys {
                starts: vec![0, 10],
                ..keys.clone()
            },
            PositionKeys {
                starts: vec![0, 20, 10],
                ..keys.clone()
            },
            PositionKeys {
                files: vec![("/a.parquet".into(), vec![(0, 0), (10, 2)])],
                ..keys.clone()
            },
        ] {
            let err = PositionKeyExec::try_new(Arc::clone(&input), damaged).unwrap_err();
            assert!(err.to_string().contains("the plan is damaged"), "{err}");
        }
    }

    #[test]
    fn keys_grow_with_positions_and_avoid_first_keys_of_ranges() {
        for (rows, ranges) in [(1u64, 1usize), (2, 2), (8, 4), (1000, 7), (4096, 16)] {
            let keys: Vec<u64> =
                (0..rows).map(|p| position_key(p, rows, ranges)).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "{rows} rows");
            for (p, &key) in keys.iter().enumerate() {
                let range = range_of(key, ranges);
                assert_ne!(key, first_key(range, ranges), "position {p} of {rows}");
                // Ranges hold runs of positions, about rows / ranges each.
                let expected = (p as u128 * ranges as u128 / rows as u128) as usize;
                assert!(range == expected || range + 1 == expected, "{p}: {range}");
            }
        }
    }
}
