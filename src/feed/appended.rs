//! Continuing a shuffled epoch over appended data: after a checkpoint, files
//! were added; the rest of the epoch is every row of the old files that the
//! checkpoint's ranks had not consumed, plus every row of the new files.
//!
//! ```text
//!  checkpoint: epoch e, R rows consumed of the order over the old files
//!
//!  1. consumed = the first R rows of (query SHUFFLE (seed, e)) that come
//!     from an old file, as (file, row)      (the origins query, see
//!     `provenance.rs`: no preprocessing, only the shuffle key's columns)
//!  2. the epoch's rest:
//!       TableScan → Projection: *, file id, file row
//!                 → anti join consumed (file, row)    (a MemTable)
//!                 → Projection: *
//!       … the query as written …
//!       SHUFFLE (seed', e), seed' = f(seed, e, R, old files)
//! ```
//!
//! # Why the consumed rows are the old order's first rows
//! A global shuffle sorts rows by a content key, so the rows of the old
//! files keep their relative order when rows of new files are added: the
//! old order is the new order without the new rows. The consumed rows are
//! therefore the first `R` rows of the new order that come from old files,
//! found by one run of the origins query.
//!
//! # Why the rest is shuffled anew
//! Sorted by the epoch's key, the new rows whose keys fall below the
//! consumed ones would all come first: a burst of only new data. The rest is
//! instead ordered by a seed mixed from (seed, epoch, R, the old files), a
//! fresh uniform order that is again a pure function of the data and the
//! checkpoint. Later epochs are a fresh run's over all the data.
//!
//! # By position
//! A feed shuffled by position (`SHUFFLE BY POSITION`) ranks rows by file
//! and row, so new files move every old position: the old order is the
//! order of the query over the old files alone. The consumed rows are the
//! first `R` rows of that order (the origins query over the old files, each
//! scan filtered to them), and the rest is shuffled by position with the
//! continuation's seed. A shuffle by position takes no join, so the
//! consumed rows are left out by a filter at each scan
//! (`NotConsumedFunc`: each old file's consumed rows, sorted), which
//! its placement counts like any filter (reading no column: the file and
//! row come from the scan).
//!
//! # Limits
//! Shuffled feeds only: an unshuffled order over partitions changes when a
//! file joins the listing, so its old order cannot be recomputed. Each row
//! of a file must be read once (a `UNION ALL` of the same files is
//! refused): a consumed row is known by its file and row. The
//! consumed rows are held in memory, outside the memory pool (16 bytes
//! each; by position, 8 bytes each in the filter's set). A checkpoint taken in a
//! continued epoch records the continuation, and resumes it; data appended
//! a second time within the same epoch is refused.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{BooleanArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, JoinType, plan_err};
use datafusion::common::{internal_datafusion_err, internal_err, plan_datafusion_err};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::{
    MemTable, ViewTable, provider_as_source, source_as_provider,
};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::functions::core::expr_fn::{file_row_index, input_file_name};
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, LogicalPlanBuilder, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, SubqueryAlias, Volatility, cast, col, lit,
};
use datafusion::physical_plan::collect;

// The scan's file id and row, joined against the consumed rows, are named
// by `provenance`, whose origins read them.
use super::provenance::{
    self, APPENDED_SCAN_FILE as SCAN_FILE, APPENDED_SCAN_ROW as SCAN_ROW,
    ORIGIN_FILE_COLUMN,
};
use crate::Session;
use crate::shuffle::{ShuffleSpec, shuffle};

/// A checkpoint's epoch continued over data to which files were added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Appended {
    /// The epoch the checkpoint was in.
    pub(crate) epoch: u64,
    /// Every file the checkpoint's order was over, as its manifest names
    /// them ([`super::input_files`]).
    pub(crate) old_files: Vec<String>,
    /// Rows of that order all ranks together consumed.
    pub(crate) rows: u64,
}

/// The consumed rows' table and its columns.
const CONSUMED_TABLE: &str = "__sqlfeed_consumed";
const CONSUMED_FILE: &str = "__sqlfeed_consumed_file";
const CONSUMED_ROW: &str = "__sqlfeed_consumed_row";

impl Appended {
    /// The rest of the epoch: `sql`'s rows less the consumed ones, shuffled
    /// by the continuation's seed (see the module docs).
    pub(crate) async fn remaining(
        &self,
        session: &Session,
        sql: &str,
        spec: ShuffleSpec,
    ) -> Result<DataFrame> {
        let (rest, spec) = self.remaining_unshuffled(session, sql, spec).await?;
        shuffle(rest, spec)
    }

    /// The rest of the epoch before its shuffle, and that shuffle: what
    /// [`Self::remaining`] shuffles, for readers of rows by position
    /// (`crate::feed::EpochDataset`) that place the rows themselves.
    pub(crate) async fn remaining_unshuffled(
        &self,
        session: &Session,
        sql: &str,
        spec: ShuffleSpec,
    ) -> Result<(DataFrame, ShuffleSpec)> {
        let (seed, by_position) = match spec {
            ShuffleSpec::Global { seed, .. } => (seed, false),
            ShuffleSpec::Positional { seed, .. } => (seed, true),
            other => {
                return plan_err!(
                    "an epoch shuffled by {other:?} cannot be continued over appended \
                     data; start it anew"
                );
            }
        };
        let old_ids = self.old_file_ids(session, sql).await?;
        let consumed = self
            .consumed(session, sql, seed, by_position, &old_ids)
            .await?;
        let (state, plan) = session.sql(sql).await?.into_parts();
        let seed = self.continued_seed(seed);
        let epoch = self.epoch;
        if by_position {
            // One set, shared by every scan's filter.
            let not_consumed = not_consumed_function(&consumed)?;
            drop(consumed);
            let plan = at_scans(plan, &|scan| filter_consumed(scan, &not_consumed))?;
            return Ok((
                DataFrame::new(state, plan),
                ShuffleSpec::Positional { seed, epoch },
            ));
        }
        let plan = exclude(plan, &consumed)?;
        Ok((
            DataFrame::new(state, plan),
            ShuffleSpec::Global { seed, epoch },
        ))
    }

    /// The seed of the rest's order: the feed's mixed with the checkpoint.
    fn continued_seed(&self, seed: u64) -> u64 {
        let mut hasher = xxhash_rust::xxh3::Xxh3::with_seed(seed);
        hasher.update(&self.epoch.to_le_bytes());
        hasher.update(&self.rows.to_le_bytes());
        for file in &self.old_files {
            hasher.update(file.as_bytes());
            hasher.update(&[0]);
        }
        hasher.digest()
    }

    /// The ids (`provenance::file_ids`) of the old files, each checked to
    /// be still among the files `sql` reads.
    async fn old_file_ids(&self, session: &Session, sql: &str) -> Result<Vec<i64>> {
        let files = provenance::scanned_file_ids(session, sql).await?;
        if let Some((twice, _, _)) = files.iter().find(|(_, _, scans)| *scans > 1) {
            return plan_err!(
                "the query reads {twice} in more than one scan (a UNION ALL or a join of \
                 the same files?): a consumed row is known by its file and row, so its \
                 copies could not be told apart; epoch {} cannot be continued over \
                 appended data, start it anew instead",
                self.epoch
            );
        }
        let by_location: HashMap<&str, i64> = files
            .iter()
            .map(|(location, id, _)| (location.as_str(), *id))
            .collect();
        self.old_files
            .iter()
            .map(|old| {
                by_location.get(old.as_str()).copied().ok_or_else(|| {
                    plan_datafusion_err!("cannot continue epoch {} over the data as it is now: {old}, which \
                         the checkpoint's order was over, is no longer read by the query; \
                         only added files can be continued over (start the epoch anew \
                         instead)",
                        self.epoch)
                })
            })
            .collect()
    }

    /// The first `rows` rows of the epoch's order that come from an old
    /// file, as a table of (file id, row). By position, the order over the
    /// old files alone (module docs).
    async fn consumed(
        &self,
        session: &Session,
        sql: &str,
        seed: u64,
        by_position: bool,
        old_ids: &[i64],
    ) -> Result<RecordBatch> {
        let epoch = self.epoch;
        let old: Vec<Expr> = old_ids.iter().map(|id| lit(*id)).collect();
        let query = session.sql(sql).await?;
        let (state, plan) = if by_position {
            let (state, plan) = query.into_parts();
            let in_old = scan_file_id().in_list(old.clone(), false);
            let plan = at_scans(plan, &|scan| {
                LogicalPlanBuilder::from(scan)
                    .filter(in_old.clone())?
                    .build()
            })?;
            let spec = ShuffleSpec::Positional { seed, epoch };
            shuffle(DataFrame::new(state, plan), spec)?.into_parts()
        } else {
            shuffle(query, ShuffleSpec::Global { seed, epoch })?.into_parts()
        };
        let row_key = Arc::new(ScalarUDF::from(crate::sql::RowKeyFunc::new()));
        let origins = provenance::origins_plan(plan, row_key, &[])?;
        let plan = LogicalPlanBuilder::from(origins)
            .filter(col(ORIGIN_FILE_COLUMN).in_list(old, false))?
            .limit(0, Some(usize::try_from(self.rows).unwrap_or(usize::MAX)))?
            .build()?;
        let state = SessionStateBuilder::new_from_existing(state)
            .with_query_planner(Arc::new(crate::sql::SqlfeedQueryPlanner::embedded()))
            .build();
        let physical = state.create_physical_plan(&plan).await?;
        let batches = collect(physical, state.task_ctx()).await?;
        let mut files = Vec::with_capacity(self.rows as usize);
        let mut rows = Vec::with_capacity(self.rows as usize);
        for batch in &batches {
            files.extend(int64_column(batch, 0)?.values().iter().copied());
            rows.extend(int64_column(batch, 1)?.values().iter().copied());
        }
        if files.len() as u64 != self.rows {
            return plan_err!(
                "the checkpoint consumed {} rows of epoch {}, but the files it was over hold \
                 only {} rows now: they were rewritten, so the epoch cannot be continued \
                 (start it anew instead)",
                self.rows,
                self.epoch,
                files.len()
            );
        }
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new(CONSUMED_FILE, DataType::Int64, false),
                Field::new(CONSUMED_ROW, DataType::Int64, false),
            ])),
            vec![
                Arc::new(Int64Array::from(files)),
                Arc::new(Int64Array::from(rows)),
            ],
        )?)
    }
}

fn int64_column(batch: &RecordBatch, index: usize) -> Result<&Int64Array> {
    batch
        .column(index)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| internal_datafusion_err!("an origins column is not Int64"))
}

/// Each scanned row's file id, as the origins name it.
fn scan_file_id() -> Expr {
    provenance::file_id_expr(
        Arc::new(ScalarUDF::from(crate::sql::RowKeyFunc::new()))
            .call(vec![lit(0i64), input_file_name()]),
    )
}

/// `plan` without the rows in `consumed`: every scan of Parquet files
/// anti-joined with it on (file id, row), its schema unchanged.
fn exclude(plan: LogicalPlan, consumed: &RecordBatch) -> Result<LogicalPlan> {
    let table = Arc::new(MemTable::try_new(
        consumed.schema(),
        vec![vec![consumed.clone()]],
    )?);
    let file_id = scan_file_id();
    at_scans(plan, &|scan| anti_join(scan, &table, &file_id))
}

/// The filter function that keeps the rows not in `consumed` (file id,
/// row): each file's consumed rows sorted, 8 bytes a row.
fn not_consumed_function(consumed: &RecordBatch) -> Result<ScalarUDF> {
    let mut by_file: HashMap<i64, Vec<i64>> = HashMap::new();
    let files = int64_column(consumed, 0)?.values();
    let rows = int64_column(consumed, 1)?.values();
    for (file, row) in files.iter().zip(rows.iter()) {
        by_file.entry(*file).or_default().push(*row);
    }
    for rows in by_file.values_mut() {
        rows.sort_unstable();
    }
    Ok(ScalarUDF::from(NotConsumedFunc::new(by_file)))
}

/// `scan` without the consumed rows, by a filter (`not_consumed`): a
/// shuffle by position takes no join.
fn filter_consumed(scan: LogicalPlan, not_consumed: &ScalarUDF) -> Result<LogicalPlan> {
    let kept = not_consumed.call(vec![
        scan_file_id(),
        cast(file_row_index(), DataType::Int64),
    ]);
    LogicalPlanBuilder::from(scan).filter(kept)?.build()
}

/// `plan` with `wrap` applied to every scan of Parquet files (each checked
/// to be one), through the views of folder globs.
fn at_scans(
    plan: LogicalPlan,
    wrap: &dyn Fn(LogicalPlan) -> Result<LogicalPlan>,
) -> Result<LogicalPlan> {
    Ok(plan
        .transform_up(|node| {
            let LogicalPlan::TableScan(scan) = &node else {
                return Ok(Transformed::no(node));
            };
            let provider = source_as_provider(&scan.source)?;
            // A folder glob's table is a view over the folders' files.
            if let Some(view) = provider.downcast_ref::<ViewTable>()
                && scan.projection.is_none()
                && scan.filters.is_empty()
            {
                let inner = at_scans(view.logical_plan().clone(), wrap)?;
                return Ok(Transformed::yes(LogicalPlan::SubqueryAlias(
                    SubqueryAlias::try_new(Arc::new(inner), scan.table_name.clone())?,
                )));
            }
            provenance::check_parquet_files(
                scan.table_name.to_string(),
                provider.as_ref(),
            )?;
            Ok(Transformed::yes(wrap(node)?))
        })?
        .data)
}

/// `scan` anti-joined with `consumed` on (file id, row), its schema
/// unchanged.
fn anti_join(
    scan: LogicalPlan,
    consumed: &Arc<MemTable>,
    file_id: &Expr,
) -> Result<LogicalPlan> {
    let schema = Arc::clone(scan.schema());
    let columns: Vec<Expr> = (0..schema.fields().len())
        .map(|i| Expr::Column(Column::from(schema.qualified_field(i))))
        .collect();
    let mut with_origin = columns.clone();
    with_origin.push(file_id.clone().alias(SCAN_FILE));
    with_origin.push(cast(file_row_index(), DataType::Int64).alias(SCAN_ROW));
    let consumed_scan = LogicalPlanBuilder::scan(
        CONSUMED_TABLE,
        provider_as_source(Arc::clone(consumed) as _),
        None,
    )?
    .build()?;
    LogicalPlanBuilder::from(scan)
        .project(with_origin)?
        .join(
            consumed_scan,
            JoinType::LeftAnti,
            (
                vec![Column::from_name(SCAN_FILE), Column::from_name(SCAN_ROW)],
                vec![
                    Column::new(Some(CONSUMED_TABLE), CONSUMED_FILE),
                    Column::new(Some(CONSUMED_TABLE), CONSUMED_ROW),
                ],
            ),
            None,
        )?
        .project(columns)?
        .build()
}

/// `sqlfeed_not_consumed(file id, row)`: whether a scanned row is not one
/// of a continuation's consumed rows (module docs, "By position"). Built
/// into the continued epoch's plan only, never registered by name.
#[derive(Debug)]
struct NotConsumedFunc {
    /// The consumed rows: each file id's row indexes, sorted.
    consumed: Arc<HashMap<i64, Vec<i64>>>,
    signature: Signature,
}

impl NotConsumedFunc {
    fn new(consumed: HashMap<i64, Vec<i64>>) -> Self {
        Self {
            consumed: Arc::new(consumed),
            signature: Signature::exact(
                vec![DataType::Int64, DataType::Int64],
                Volatility::Immutable,
            ),
        }
    }
}

// Two instances are the same function when they hold the same set; the
// set is built once per continued epoch and shared by its scans' filters.
impl PartialEq for NotConsumedFunc {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.consumed, &other.consumed)
    }
}

impl Eq for NotConsumedFunc {}

impl Hash for NotConsumedFunc {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.consumed).hash(state);
    }
}

impl ScalarUDFImpl for NotConsumedFunc {
    fn name(&self) -> &str {
        "sqlfeed_not_consumed"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [file, row] = args.args.as_slice() else {
            return internal_err!("sqlfeed_not_consumed takes a file id and a row");
        };
        let (file, row) = (
            file.to_array(args.number_rows)?,
            row.to_array(args.number_rows)?,
        );
        let (Some(file), Some(row)) = (
            file.as_any().downcast_ref::<Int64Array>(),
            row.as_any().downcast_ref::<Int64Array>(),
        ) else {
            return internal_err!("sqlfeed_not_consumed takes two Int64 columns");
        };
        let kept: BooleanArray = file
            .iter()
            .zip(row.iter())
            .map(|(file, row)| match (file, row) {
                (Some(file), Some(row)) => Some(
                    self.consumed
                        .get(&file)
                        .is_none_or(|rows| rows.binary_search(&row).is_err()),
                ),
                // Every scanned row has a file and a row index.
                _ => Some(true),
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(kept)))
    }
}
