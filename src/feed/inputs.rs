//! The files a feed's order is a function of: what a checkpoint records so
//! that a resume over changed data is refused by name instead of silently
//! reading another order (an added file moves every row of a shuffled
//! epoch, since the order is over all rows).
//!
//! The query is planned, not run, on the embedded engine (a cluster
//! session's plan would hide its scans in a remote job): one listing of each
//! table it reads.

use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;

use crate::Session;
use crate::cache::InputFile;

/// The files the query `sql` reads on `session`, sorted by location, with
/// their sizes, modification times and entity tags.
pub async fn input_files(session: &Session, sql: &str) -> Result<Vec<InputFile>> {
    let (state, plan) = session.sql(sql).await?.into_parts();
    // Only the files matter here: a MIX whose weights change by step plans
    // with any step size (the feed's comes with each epoch's plan).
    let mut config = state.config().clone();
    let mut options = crate::config::SqlfeedOptions::of(config.options()).clone();
    if options.feed_step_rows == 0 {
        options.feed_step_rows = 1;
        config.options_mut().extensions.insert(options);
    }
    let state = SessionStateBuilder::new_from_existing(state)
        .with_config(config)
        .with_query_planner(std::sync::Arc::new(
            crate::sql::SqlfeedQueryPlanner::embedded(),
        ))
        .build();
    let physical = state.create_physical_plan(&plan).await?;
    let mut files = crate::cache::key::input_files(&physical)?;
    files.sort_by(|a, b| a.location.cmp(&b.location));
    files.dedup();
    Ok(files)
}

/// [`input_files`] with the Delta Lake tables `sql` names without a version
/// read at `delta_versions` (a checkpoint's pins, see `sql::delta`) where
/// given, else at their newest versions.
pub async fn input_files_at(
    session: &Session,
    sql: &str,
    delta_versions: &std::collections::BTreeMap<String, u64>,
) -> Result<Vec<InputFile>> {
    #[cfg(feature = "delta")]
    if !delta_versions.is_empty() {
        let state = session.context().state();
        let (pinned, _) =
            crate::sql::delta::pin_versions(&state, sql, delta_versions).await?;
        return input_files(session, &pinned).await;
    }
    let _ = delta_versions;
    input_files(session, sql).await
}

#[cfg(test)]
pub(super) mod tests {
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::error::Result;

    use super::*;

    /// Writes a Parquet file of one `id` column, 0 to `rows - 1`.
    pub(in crate::feed) fn write(path: &std::path::Path, rows: i64) -> Result<()> {
        let ids = Int64Array::from_iter_values(0..rows);
        let batch = RecordBatch::try_from_iter(vec![(
            "id",
            std::sync::Arc::new(ids) as datafusion::arrow::array::ArrayRef,
        )])?;
        crate::test_util::write_parquet(path, &batch, None)
    }

    #[tokio::test]
    async fn lists_every_file_a_query_reads_and_sees_an_added_one() -> Result<()> {
        let dir = tempfile::tempdir()?;
        write(&dir.path().join("a.parquet"), 10)?;
        write(&dir.path().join("b.parquet"), 20)?;
        let session = Session::try_new()?;
        let sql = format!(
            "SELECT id * 2 AS x FROM '{}/*.parquet' WHERE id > 3",
            dir.path().display()
        );
        let files = input_files(&session, &sql).await?;
        let names: Vec<&str> = files
            .iter()
            .map(|f| f.location.rsplit('/').next().unwrap_or(""))
            .collect();
        assert_eq!(names, ["a.parquet", "b.parquet"]);
        assert!(files.iter().all(|f| f.size > 0));
        write(&dir.path().join("c.parquet"), 5)?;
        assert_eq!(input_files(&session, &sql).await?.len(), 3);
        Ok(())
    }
}
