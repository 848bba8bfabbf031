//! Epoch-cache entries kept by a cluster's executors: the first epoch's
//! tasks write the preprocessed rows where they compute them, and later
//! epochs' jobs scan them there, so no epoch after the first decodes an
//! image or moves one through a rank.
//!
//! ```text
//!  epoch 0 (a miss), on the executors          epochs ≥ 1 (a hit)
//!  ───────────────────────────────────         ──────────────────
//!  Projection: finish (image_to_tensor)        Projection: finish
//!    SharedEntryWriteExec ──▶ <dir>/<key>/       Shuffle: key = content hash
//!      Projection: image_resize(decode(…))         DataSourceExec: the parts
//!        ShuffleMergeExec (ranged)                        (Arrow IPC, <dir>/<key>/<job>/)
//!          …
//!  rank 0, when the epoch ended:  <dir>/<key>/COMMITTED = "<job>"
//! ```
//!
//! `dir` (`sqlfeed.executor_cache_dir`, `--executor-cache-dir`) is a folder
//! every executor and every rank reaches (a shared file system): Ballista
//! schedules a task on any executor, so "where they were computed" is a
//! folder they all see.
//!
//! # Exactly once, under retries
//! Each task of the first epoch writes its partition's rows to a temporary
//! file and renames it, once the partition is complete, to
//! `part-<sum of the rows' content hashes>-<rows>.arrow` in a folder named
//! after the job: a task that runs twice writes the same name with the same
//! rows, and an abandoned one leaves only a temporary file. The rank that
//! submitted the job commits the folder of the attempt that completed (the
//! epoch's job or its retry after a lost executor) by writing its name into
//! `COMMITTED`; later epochs read that folder's parts and nothing else.
//!
//! # The same batches
//! The parts hold the rows with their content hashes, and every epoch of a
//! shuffled feed orders by them: a hit gives the batches of an uncached
//! epoch (a test compares them).

use std::fmt;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{SchemaRef, UInt64Type};
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::common::exec_err;
use datafusion::common::{exec_datafusion_err, internal_datafusion_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNodeCore};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;

use crate::exec::BatchStream;
use crate::shuffle::CONTENT_HASH_COLUMN;

/// The file naming the committed folder of an entry.
const COMMITTED: &str = "COMMITTED";

/// The folder of entry `key` under `dir`.
pub fn entry_dir(dir: &Path, key: &str) -> PathBuf {
    dir.join(key)
}

/// The committed parts' folder of entry `key`, if it was committed.
pub fn committed_parts(dir: &Path, key: &str) -> Result<Option<PathBuf>> {
    let entry = entry_dir(dir, key);
    match std::fs::read_to_string(entry.join(COMMITTED)) {
        Ok(job) => {
            let parts = entry.join(job.trim());
            if parts.is_dir() {
                Ok(Some(parts))
            } else {
                exec_err!(
                    "executor cache entry {} names folder '{}', which is gone; remove the \
                     entry to compute it again",
                    entry.display(),
                    job.trim()
                )
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => exec_err!("cannot read {}: {e}", entry.join(COMMITTED).display()),
    }
}

/// Commits the parts written by job `job` as entry `key`: later epochs
/// read them. Fails if the folder holds no part although the epoch had
/// rows (the job wrote elsewhere: the folder is not shared).
pub fn commit(dir: &Path, key: &str, job: &str, rows: u64) -> Result<()> {
    let entry = entry_dir(dir, key);
    let parts = entry.join(job);
    let written: u64 = part_files(&parts)?
        .iter()
        .filter_map(|path| part_rows(path))
        .sum();
    if written != rows {
        return exec_err!(
            "the executors wrote {written} rows of executor cache entry {key} into {}, the \
             epoch had {rows}: is --executor-cache-dir a folder that every executor and \
             rank shares?",
            parts.display()
        );
    }
    let temporary = entry.join(format!(".{COMMITTED}.{}", std::process::id()));
    std::fs::write(&temporary, job)
        .and_then(|()| std::fs::rename(&temporary, entry.join(COMMITTED)))
        .map_err(|e| exec_datafusion_err!("cannot commit {}: {e}", entry.display()))
}

/// The complete parts in `folder`.
fn part_files(folder: &Path) -> Result<Vec<PathBuf>> {
    let listing = match std::fs::read_dir(folder) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => {
            return exec_err!("cannot list {}: {e}", folder.display());
        }
    };
    let mut parts: Vec<PathBuf> = listing
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "arrow"))
        .collect();
    parts.sort();
    Ok(parts)
}

/// The rows a part's name says it holds.
fn part_rows(path: &Path) -> Option<u64> {
    path.file_stem()?.to_str()?.rsplit('-').next()?.parse().ok()
}

/// Logical node: its input's rows, written into `dir` on the way (see the
/// module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct SharedEntryWriteNode {
    input: LogicalPlan,
    dir: String,
}

impl SharedEntryWriteNode {
    /// Writes `input` (which carries [`CONTENT_HASH_COLUMN`]) into the
    /// entry folder `dir`.
    pub fn try_new(input: LogicalPlan, dir: String) -> Result<Self> {
        content_hash_index(input.schema().inner())?;
        Ok(Self { input, dir })
    }

    /// The entry folder.
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The node as a plan.
    pub fn into_plan(self) -> LogicalPlan {
        LogicalPlan::Extension(datafusion::logical_expr::Extension {
            node: Arc::new(self),
        })
    }
}

fn content_hash_index(schema: &SchemaRef) -> Result<usize> {
    schema.index_of(CONTENT_HASH_COLUMN).map_err(|_| {
        internal_datafusion_err!(
            "an executor cache entry is written from rows with {CONTENT_HASH_COLUMN}"
        )
    })
}

impl UserDefinedLogicalNodeCore for SharedEntryWriteNode {
    crate::exec::one_input_logical_node! {
        name: "SharedEntryWrite",
        input: input,
        rebuild: |this, input| Self::try_new(input, this.dir.clone()),
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SharedEntryWrite: dir={}", self.dir)
    }
}

/// Writes each partition of its input into a part of the entry folder while
/// passing the rows through unchanged; see the module docs.
#[derive(Debug)]
pub struct SharedEntryWriteExec {
    input: Arc<dyn ExecutionPlan>,
    dir: String,
    content_hash: usize,
    /// The job a task runs in, which names its folder.
    job_of: JobOf,
}

/// The name of the job a task runs in, if it runs in one: a cluster's
/// executors learn it from the job's settings (`crate::cluster`'s codec
/// installs the reader); elsewhere the folder is `local`.
pub type JobOf = fn(&TaskContext) -> Option<String>;

impl SharedEntryWriteExec {
    /// Writes `input`'s partitions into the entry folder `dir`.
    pub fn try_new(input: Arc<dyn ExecutionPlan>, dir: String) -> Result<Self> {
        let content_hash = content_hash_index(&input.schema())?;
        Ok(Self {
            input,
            dir,
            content_hash,
            job_of: |_| None,
        })
    }

    /// The same writer, naming its folder after the job `job_of` reads.
    pub fn with_job_of(mut self, job_of: JobOf) -> Self {
        self.job_of = job_of;
        self
    }

    /// The entry folder.
    pub fn dir(&self) -> &str {
        &self.dir
    }
}

impl DisplayAs for SharedEntryWriteExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let name = "SharedEntryWriteExec";
        crate::exec::fmt_settings(f, t, name, &[("dir", &self.dir)])
    }
}

impl ExecutionPlan for SharedEntryWriteExec {
    crate::exec::one_input_operator! {
        name: "SharedEntryWriteExec",
        properties: passed_through,
        rebuild: |this, child| {
            Ok(Self::try_new(child, this.dir.clone())?.with_job_of(this.job_of))
        },
    }

    crate::exec::keeps_input_order!();

    crate::exec::statistics_of_one_input!(first_input_statistics);

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        // One folder per job: a retried job writes apart from the one it
        // replaces, and the rank commits the one that completed.
        let job = (self.job_of)(&ctx)
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "local".to_string());
        let folder = Path::new(&self.dir).join(job);
        let input = self.input.execute(partition, ctx)?;
        let part = PartWriter {
            folder,
            temporary: None,
            writer: None,
            rows: 0,
            hash_sum: 0,
            content_hash: self.content_hash,
            partition,
        };
        let schema = self.schema();
        let state = (input, Some(part));
        let output = futures::stream::unfold(state, |(mut input, part)| async move {
            let mut part = part?;
            match input.next().await {
                Some(Ok(batch)) => {
                    let written = part.write(&batch).map(|()| batch);
                    Some((written, (input, Some(part))))
                }
                Some(Err(e)) => Some((Err(e), (input, None))),
                // The partition is complete: the part gets its name.
                None => match part.finish() {
                    Ok(()) => None,
                    Err(e) => Some((Err(e), (input, None))),
                },
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, output)))
    }
}

/// One partition's part: a temporary file until the partition ends.
struct PartWriter {
    folder: PathBuf,
    temporary: Option<PathBuf>,
    writer: Option<FileWriter<File>>,
    rows: u64,
    /// Wrapping sum of the rows' content hashes: with the row count, the
    /// part's name (the same rows, the same name).
    hash_sum: u64,
    content_hash: usize,
    partition: usize,
}

impl PartWriter {
    fn error(&self, what: impl fmt::Display) -> DataFusionError {
        exec_datafusion_err!(
            "writing the executor cache part of partition {} into {}: {what}",
            self.partition,
            self.folder.display()
        )
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.writer.is_none() {
            std::fs::create_dir_all(&self.folder).map_err(|e| self.error(e))?;
            let mut unique = std::collections::hash_map::DefaultHasher::new();
            (
                std::process::id(),
                self.partition,
                std::time::SystemTime::now(),
            )
                .hash(&mut unique);
            let temporary = self
                .folder
                .join(format!(".part-{:016x}.tmp", unique.finish()));
            let file = File::create(&temporary).map_err(|e| self.error(e))?;
            self.writer = Some(FileWriter::try_new(file, &batch.schema())?);
            self.temporary = Some(temporary);
        }
        let hashes = batch
            .column(self.content_hash)
            .as_primitive_opt::<UInt64Type>()
            .ok_or_else(|| self.error("the content hash is not a UInt64 column"))?;
        self.hash_sum = hashes
            .values()
            .iter()
            .fold(self.hash_sum, |sum, h| sum.wrapping_add(*h));
        self.rows += batch.num_rows() as u64;
        if let Some(writer) = self.writer.as_mut() {
            writer.write(batch)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        let (Some(mut writer), Some(temporary)) =
            (self.writer.take(), self.temporary.take())
        else {
            return Ok(());
        };
        writer.finish()?;
        let name = format!("part-{:016x}-{}.arrow", self.hash_sum, self.rows);
        std::fs::rename(&temporary, self.folder.join(name)).map_err(|e| self.error(e))
    }
}

impl Drop for PartWriter {
    // An abandoned partition leaves no temporary file behind.
    fn drop(&mut self) {
        if let Some(temporary) = self.temporary.take() {
            let _ = std::fs::remove_file(temporary);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parts_name_says_its_rows() {
        assert_eq!(
            part_rows(Path::new("/x/part-00ff00ff00ff00ff-1234.arrow")),
            Some(1234)
        );
        assert_eq!(part_rows(Path::new("/x/.part-00ff.tmp")), None);
    }

    #[test]
    fn commit_refuses_a_folder_without_the_epochs_rows() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let parts = dir.path().join("k").join("job-e0");
        std::fs::create_dir_all(&parts)?;
        std::fs::write(parts.join("part-0000000000000001-40.arrow"), b"")?;
        std::fs::write(parts.join("part-0000000000000002-60.arrow"), b"")?;
        std::fs::write(parts.join(".part-3.tmp"), b"")?;
        let err = commit(dir.path(), "k", "job-e0", 101)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("wrote 100 rows") && err.contains("shares"),
            "{err}"
        );
        assert_eq!(committed_parts(dir.path(), "k")?, None);
        commit(dir.path(), "k", "job-e0", 100)?;
        assert_eq!(committed_parts(dir.path(), "k")?, Some(parts));
        Ok(())
    }
}
