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
    let state = SessionStateBuilder::new_from_existing(state)
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

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::error::Result;

    use super::*;

    fn write(path: &std::path::Path, rows: i64) -> Result<()> {
        let ids = Int64Array::from_iter_values(0..rows);
        let batch = RecordBatch::try_from_iter(vec![(
            "id",
            std::sync::Arc::new(ids) as datafusion::arrow::array::ArrayRef,
        )])?;
        let file = std::fs::File::create(path)?;
        let mut writer =
            datafusion::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None)?;
        writer.write(&batch)?;
        writer.close()?;
        Ok(())
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
