//! The work of `FeedBuilder::explain_batch` (which resolves the feed of
//! origins): the batch at a position located in the epoch's order, its
//! rows' origins read from the scans' file and row columns, and the files
//! they name resolved to row groups.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::plan_err;
use datafusion::common::{
    exec_datafusion_err, exec_err, internal_datafusion_err, resources_datafusion_err,
};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    DefaultParquetFileReaderFactory, ParquetFileReaderFactory,
};
use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;

use super::{
    BatchOrigins, ORIGIN_FILE_COLUMN, ORIGIN_ROW_COLUMN, RowOrigin, file_ids,
    scanned_files,
};

/// What [`batch_origins`] reports besides the batch: the shape the batch
/// was cut with, for the error of a position the epoch does not reach.
pub(crate) struct ExplainedShape {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) batch_size: usize,
    pub(crate) drop_last: bool,
}

/// The origins of the batch at `(epoch, step)` of `feed`, a feed of each
/// row's origin (`FeedRows::Origins`) started at or before that step, of
/// the query `sql` on `session`.
pub(crate) fn batch_origins(
    feed: super::super::Feed,
    session: &crate::Session,
    sql: &str,
    (epoch, step): (u64, u64),
    shape: ExplainedShape,
) -> Result<BatchOrigins> {
    let mut found = None;
    for batch in feed {
        let batch = batch?;
        if batch.epoch() != epoch || batch.step() > step {
            break;
        }
        if batch.step() == step {
            found = Some((
                batch
                    .tensor(ORIGIN_FILE_COLUMN)?
                    .as_slice::<i64>()?
                    .to_vec(),
                batch.tensor(ORIGIN_ROW_COLUMN)?.as_slice::<i64>()?.to_vec(),
            ));
            break;
        }
    }
    let Some((file_ids, rows)) = found else {
        return plan_err!(
            "epoch {epoch} has no step {step} for rank {} of {} (batch size {}{}): \
             the epoch ends before it",
            shape.rank,
            shape.world,
            shape.batch_size,
            if shape.drop_last { ", drop_last" } else { "" }
        );
    };
    let files = block_on(origin_files(session, sql))?;
    let by_id: HashMap<i64, &OriginFile> =
        files.iter().map(|file| (file.id, file)).collect();
    let mut origins = Vec::with_capacity(rows.len());
    for (id, row) in file_ids.into_iter().zip(rows) {
        let file = by_id.get(&id).ok_or_else(|| {
            internal_datafusion_err!(
                "batch row from a file with id {id} that the query does not list"
            )
        })?;
        let row = u64::try_from(row)
            .map_err(|_| internal_datafusion_err!("negative file row index {row}"))?;
        origins.push(RowOrigin {
            file: file.location.clone(),
            row_group: file.row_group_of(row)?,
            row,
        });
    }
    Ok(BatchOrigins {
        epoch,
        step,
        rank: shape.rank,
        rows: origins,
    })
}

/// The origins of the rows at `positions` (ascending) of the order `feed`
/// yields, a feed of each row's origin with one rank (its batches are the
/// order, cut in turn), of the query `sql` on `session`: what a feed's
/// quarantine table names (`FeedBuilder::quarantine_origins`).
pub(crate) fn position_origins(
    feed: super::super::Feed,
    session: &crate::Session,
    sql: &str,
    positions: &[u64],
) -> Result<Vec<RowOrigin>> {
    let mut wanted = positions.iter().copied().peekable();
    let mut found: Vec<(i64, i64)> = Vec::with_capacity(positions.len());
    let mut offset = 0u64;
    for batch in feed {
        let Some(&next) = wanted.peek() else { break };
        let batch = batch?;
        let rows = batch.rows() as u64;
        if next < offset + rows {
            let files = batch
                .tensor(ORIGIN_FILE_COLUMN)?
                .as_slice::<i64>()?
                .to_vec();
            let file_rows = batch.tensor(ORIGIN_ROW_COLUMN)?.as_slice::<i64>()?.to_vec();
            while let Some(&position) = wanted.peek()
                && position < offset + rows
            {
                let at = (position - offset) as usize;
                found.push((files[at], file_rows[at]));
                wanted.next();
            }
        }
        offset += rows;
    }
    if let Some(position) = wanted.next() {
        return plan_err!(
            "the epoch's order has {offset} rows, no row at position {position}: the data \
             changed since the rows were quarantined"
        );
    }
    let files = block_on(origin_files(session, sql))?;
    let by_id: HashMap<i64, &OriginFile> =
        files.iter().map(|file| (file.id, file)).collect();
    found
        .into_iter()
        .map(|(id, row)| {
            let file = by_id.get(&id).ok_or_else(|| {
                internal_datafusion_err!(
                    "a row from a file with id {id} that the query does not list"
                )
            })?;
            let row = u64::try_from(row)
                .map_err(|_| internal_datafusion_err!("negative file row index {row}"))?;
            Ok(RowOrigin {
                file: file.location.clone(),
                row_group: file.row_group_of(row)?,
                row,
            })
        })
        .collect()
}

/// Runs `future` to completion on a runtime of its own (explaining is
/// called from synchronous code, as building a feed is).
pub(crate) fn block_on<T>(future: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            resources_datafusion_err!("cannot start a thread for explain_batch: {e}")
        })?
        .block_on(future)
}

/// The output columns of `sql` that become padded tensors under the
/// feed's column rules `columns`: what `batch_tokens` and
/// `bucket_by_length` measure.
pub(crate) async fn variable_length_outputs(
    session: &crate::Session,
    sql: &str,
    columns: &[(String, super::super::ColumnSpec)],
) -> Result<Vec<String>> {
    let df = session.sql(sql).await?;
    let columns = super::super::columns::resolve(df.schema().as_arrow(), columns)?;
    Ok(columns
        .into_iter()
        .filter(|column| column.mask_name.is_some())
        .map(|column| column.name.to_string())
        .collect())
}

/// The files the feed's query scans, with their ids and row groups.
async fn origin_files(session: &crate::Session, sql: &str) -> Result<Vec<OriginFile>> {
    let (state, scanned) = scanned(session, sql).await?;
    let metrics = ExecutionPlanMetricsSet::new();
    let mut files = Vec::with_capacity(scanned.len());
    for ScannedFile {
        store_url,
        file,
        location,
        id,
        ..
    } in scanned
    {
        let store = state.runtime_env().object_store(&store_url)?;
        let mut reader: Box<dyn AsyncFileReader> = DefaultParquetFileReaderFactory::new(
            store,
        )
        .create_reader(0, file.clone(), None, &metrics)?;
        let metadata =
            ArrowReaderMetadata::load_async(&mut reader, ArrowReaderOptions::new())
                .await
                .map_err(|e| {
                    exec_datafusion_err!(
                        "cannot read the Parquet footer of {location}: {e}"
                    )
                })?;
        let metadata = metadata.metadata();
        let mut row_group_ends = Vec::with_capacity(metadata.num_row_groups());
        let mut end = 0u64;
        for group in metadata.row_groups() {
            end += group.num_rows().max(0) as u64;
            row_group_ends.push(end);
        }
        files.push(OriginFile {
            id,
            location,
            row_group_ends,
        });
    }
    Ok(files)
}

/// A file a query scans.
pub(super) struct ScannedFile {
    /// Its store.
    store_url: ObjectStoreUrl,
    /// The file as the scan reads it.
    file: PartitionedFile,
    /// As the data manifest names it.
    location: String,
    /// Its [`file_ids`] value.
    id: i64,
    /// How many scans of the plan read it.
    scans: usize,
}

/// The files `sql` scans when planned on the embedded engine, in location
/// order, and the state that planned it.
pub(super) async fn scanned(
    session: &crate::Session,
    sql: &str,
) -> Result<(datafusion::execution::SessionState, Vec<ScannedFile>)> {
    let (state, plan) = session.sql(sql).await?.into_parts();
    let state = datafusion::execution::SessionStateBuilder::new_from_existing(state)
        .with_query_planner(Arc::new(crate::sql::SqlfeedQueryPlanner::embedded()))
        .build();
    let physical = state.create_physical_plan(&plan).await?;
    let mut files: Vec<(ObjectStoreUrl, PartitionedFile, String, usize)> =
        scanned_files(&physical)?
            .into_iter()
            .map(|(store_url, file, scan)| {
                let location = crate::cache::key::file_location(
                    &store_url,
                    &file.object_meta.location,
                );
                (store_url, file, location, scan)
            })
            .collect();
    files.sort_by(|a, b| (&a.2, a.3).cmp(&(&b.2, b.3)));
    files.dedup_by(|a, b| a.2 == b.2 && a.3 == b.3);
    // One entry per (file, scan) now: count the scans that read each file.
    let mut scans: HashMap<String, usize> = HashMap::new();
    for (_, _, location, _) in &files {
        *scans.entry(location.clone()).or_default() += 1;
    }
    files.dedup_by(|a, b| a.2 == b.2);
    let paths: Vec<&str> = files
        .iter()
        .map(|(_, file, _, _)| file.object_meta.location.as_ref())
        .collect();
    let ids = file_ids(&paths)?;
    let scanned = files
        .into_iter()
        .zip(ids)
        .map(|((store_url, file, location, _), id)| ScannedFile {
            store_url,
            file,
            scans: scans.get(&location).copied().unwrap_or(1),
            location,
            id,
        })
        .collect();
    Ok((state, scanned))
}

/// `(location, id, scans reading it)` of every file `sql` scans, in
/// location order.
pub(crate) async fn scanned_file_ids(
    session: &crate::Session,
    sql: &str,
) -> Result<Vec<(String, i64, usize)>> {
    let (_, scanned) = scanned(session, sql).await?;
    Ok(scanned
        .into_iter()
        .map(|f| (f.location, f.id, f.scans))
        .collect())
}

/// A file a feed's query scans, as `FeedBuilder::explain_batch` names it.
pub(super) struct OriginFile {
    /// Its [`file_ids`] value.
    id: i64,
    /// As the data manifest names it.
    location: String,
    /// The first row after each row group.
    row_group_ends: Vec<u64>,
}

impl OriginFile {
    /// The row group that holds file row `row`.
    fn row_group_of(&self, row: u64) -> Result<usize> {
        let group = self.row_group_ends.partition_point(|&end| end <= row);
        if group == self.row_group_ends.len() {
            return exec_err!(
                "row {row} of {} is beyond its {} rows: was the file rewritten while \
                 the batch was explained?",
                self.location,
                self.row_group_ends.last().copied().unwrap_or(0)
            );
        }
        Ok(group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fall_in_their_row_group() -> Result<()> {
        let file = OriginFile {
            id: 0,
            location: "file:///f.parquet".into(),
            row_group_ends: vec![100, 200, 250],
        };
        let groups: Vec<usize> = [0, 99, 100, 199, 200, 249]
            .iter()
            .map(|row| file.row_group_of(*row))
            .collect::<Result<_>>()?;
        assert_eq!(groups, [0, 0, 1, 1, 2, 2]);
        let err = file.row_group_of(250).expect_err("beyond the file");
        assert!(err.to_string().contains("beyond its 250 rows"), "{err}");
        Ok(())
    }
}
