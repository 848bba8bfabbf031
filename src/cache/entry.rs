//! One cache entry on disk: writing it while the query runs, and opening and
//! verifying it later.
//!
//! ```text
//!  <cache dir>/entries/<key>/
//!      part-00000.arrow   Arrow IPC file: partition 0's batches, uncompressed
//!      part-00001.arrow   (one file per partition, also when it is empty)
//!      manifest.json      key, query, inputs, and per part: rows, batches,
//!                         bytes and the xxh3-64 checksum of the whole file;
//!                         written last. Its mtime is the entry's last use.
//! ```
//!
//! Entries are written under `<cache dir>/tmp/` and renamed into `entries/`
//! in one step, so a reader sees a whole entry or none, and two processes
//! computing the same entry race harmlessly: the first rename wins and the
//! other process opens the winner's files. Removal renames the entry out of
//! `entries/` first for the same reason.
//!
//! Files are read with positioned reads (`pread`) on handles opened once, so
//! scans of one part never share a file offset, and an entry removed by
//! another process stays readable by this one until it closes it.
//!
//! All file work runs on Tokio's blocking pool ([`blocking`], [`PartWriters`]),
//! never on the async workers: a slow or full disk then delays the fill that
//! waits for it, not the workers decoding the other partitions.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::common::exec_err;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{exec_datafusion_err, internal_datafusion_err, internal_err};
use datafusion::error::{DataFusionError, Result};
use tokio::sync::mpsc;
use xxhash_rust::xxh3::Xxh3;

use super::identity::{AssetFile, FORMAT, InputFile};

/// The manifest file of an entry.
pub(crate) const MANIFEST: &str = "manifest.json";

/// What `manifest.json` holds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// On-disk format version (`key::FORMAT`).
    pub format: u32,
    /// The entry's key.
    pub key: String,
    /// The query as the user wrote it (for listings).
    pub query: String,
    /// When the entry was written, seconds since the epoch.
    pub created_unix: u64,
    /// The files the query read.
    pub inputs: Vec<InputFile>,
    /// The files its functions read (tokenizers), with content hashes.
    /// Absent in manifests written before assets were keyed.
    #[serde(default)]
    pub assets: Vec<AssetFile>,
    /// The build id of the sqlfeed that wrote it (see `key::BUILD_ID`).
    #[serde(default)]
    pub build: String,
    /// One per output partition, in order.
    pub parts: Vec<PartManifest>,
}

impl Manifest {
    /// Rows in all parts.
    pub fn rows(&self) -> u64 {
        self.parts.iter().map(|p| p.rows).sum()
    }

    /// Bytes of all part files.
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }
}

/// One part file of an entry.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PartManifest {
    /// File name inside the entry directory.
    pub file: String,
    /// Rows in the file.
    pub rows: u64,
    /// Record batches in the file.
    pub batches: u64,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// xxh3-64 of the whole file, hex.
    pub checksum: String,
}

/// Name of part `index`'s file.
pub(crate) fn part_file(index: usize) -> String {
    format!("part-{index:05}.arrow")
}

/// Writes one partition's batches to an IPC file, hashing what it writes.
pub(crate) struct PartWriter {
    path: PathBuf,
    writer: FileWriter<HashingWriter<BufWriter<File>>>,
    rows: u64,
    batches: u64,
}

impl PartWriter {
    /// Creates `dir/part-<index>.arrow` for batches of `schema`.
    pub(crate) fn create(dir: &Path, index: usize, schema: &SchemaRef) -> Result<Self> {
        let path = dir.join(part_file(index));
        let file = File::create(&path).map_err(|e| write_error(&path, e))?;
        let sink = HashingWriter {
            inner: BufWriter::with_capacity(1 << 20, file),
            hasher: Xxh3::new(),
            bytes: 0,
        };
        let writer = FileWriter::try_new(sink, schema)
            .map_err(|e| write_error(&path, std::io::Error::other(e)))?;
        Ok(Self {
            path,
            writer,
            rows: 0,
            batches: 0,
        })
    }

    /// Appends one batch.
    pub(crate) fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.writer
            .write(batch)
            .map_err(|e| write_error(&self.path, std::io::Error::other(e)))?;
        self.rows += batch.num_rows() as u64;
        self.batches += 1;
        Ok(())
    }

    /// Writes the footer, flushes and syncs the file; returns its manifest.
    pub(crate) fn finish(mut self) -> Result<PartManifest> {
        let path = self.path.clone();
        self.writer
            .finish()
            .map_err(|e| write_error(&path, std::io::Error::other(e)))?;
        let mut sink = self
            .writer
            .into_inner()
            .map_err(|e| write_error(&path, std::io::Error::other(e)))?;
        sink.flush().map_err(|e| write_error(&path, e))?;
        let HashingWriter {
            inner,
            hasher,
            bytes,
        } = sink;
        let file = inner
            .into_inner()
            .map_err(|e| write_error(&path, e.into_error()))?;
        file.sync_data().map_err(|e| write_error(&path, e))?;
        Ok(PartManifest {
            file: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            rows: self.rows,
            batches: self.batches,
            bytes,
            checksum: format!("{:016x}", hasher.digest()),
        })
    }
}

/// Batches queued per [`PartWriters`] beyond the one being written: enough
/// to keep the decoder busy while a batch is written, little memory.
const WRITE_AHEAD: usize = 2;

/// What a fill task sends its writer thread.
enum ToWriter {
    /// Append the batch to the part at this position of the writer's list.
    Batch(usize, RecordBatch),
    /// All batches were sent: write footers, sync, report.
    Finish,
}

/// The part files one input partition of a fill writes, written in order on
/// a thread of the blocking pool that the fill task feeds through a channel
/// of [`WRITE_AHEAD`] batches.
///
/// Dropping it without [`finish`](Self::finish) (the fill failed or was
/// cancelled) closes the channel; the thread then stops without writing
/// footers or syncing, and the fill's work folder is removed with the files.
pub(crate) struct PartWriters {
    sender: mpsc::Sender<ToWriter>,
    /// `None` once joined.
    task: Option<SpawnedTask<Result<Vec<PartManifest>>>>,
}

impl PartWriters {
    /// Starts writing the parts numbered `parts` of batches of `schema`
    /// into `dir`.
    pub(crate) fn spawn(dir: PathBuf, parts: Vec<usize>, schema: SchemaRef) -> Self {
        let (sender, mut receiver) = mpsc::channel(WRITE_AHEAD);
        let task = SpawnedTask::spawn_blocking(move || {
            let mut writers = parts
                .iter()
                .map(|&part| PartWriter::create(&dir, part, &schema))
                .collect::<Result<Vec<_>>>()?;
            loop {
                match receiver.blocking_recv() {
                    Some(ToWriter::Batch(slot, batch)) => {
                        let writer = writers.get_mut(slot).ok_or_else(|| {
                            internal_datafusion_err!(
                                "cache part writer has no part at position {slot}"
                            )
                        })?;
                        writer.write(&batch)?;
                    }
                    Some(ToWriter::Finish) => break,
                    None => {
                        return exec_err!(
                            "writing cache files into '{}' was cancelled",
                            dir.display()
                        );
                    }
                }
            }
            writers.into_iter().map(PartWriter::finish).collect()
        });
        Self {
            sender,
            task: Some(task),
        }
    }

    /// Queues `batch` for the part at position `slot` of this writer's
    /// parts; waits while the writer is [`WRITE_AHEAD`] batches behind.
    pub(crate) async fn write(&mut self, slot: usize, batch: RecordBatch) -> Result<()> {
        if self.sender.send(ToWriter::Batch(slot, batch)).await.is_ok() {
            return Ok(());
        }
        // The thread stopped early: its result says why.
        match self.join().await {
            Err(e) => Err(e),
            Ok(_) => internal_err!("cache part writer ended before it was finished"),
        }
    }

    /// Finishes every part (footer, flush, sync); their manifests in the
    /// order of the parts passed to [`spawn`](Self::spawn).
    pub(crate) async fn finish(mut self) -> Result<Vec<PartManifest>> {
        // A failed send means the thread already stopped; join reports why.
        let _ = self.sender.send(ToWriter::Finish).await;
        self.join().await
    }

    async fn join(&mut self) -> Result<Vec<PartManifest>> {
        let task = self
            .task
            .take()
            .ok_or_else(|| internal_datafusion_err!("cache part writer joined twice"))?;
        task.join()
            .await
            .map_err(|e| exec_datafusion_err!("a cache writer thread failed: {e}"))?
    }
}

/// Runs `work` (file I/O) on Tokio's blocking pool and waits for it; `what`
/// names the work if the thread fails.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    SpawnedTask::spawn_blocking(work)
        .join()
        .await
        .map_err(|e| exec_datafusion_err!("{what} failed: {e}"))?
}

fn write_error(path: &Path, e: std::io::Error) -> DataFusionError {
    exec_datafusion_err!(
        "cannot write cache file '{}': {e}. Free disk space, or point --cache-dir \
         (SessionBuilder::cache_dir) at a larger disk",
        path.display()
    )
}

/// A writer that hashes and counts what passes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Xxh3,
    bytes: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.hasher.update(&buf[..written]);
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `manifest.json` into `dir`.
pub(crate) fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<()> {
    let path = dir.join(MANIFEST);
    let text = serde_json::to_vec_pretty(manifest)
        .map_err(|e| internal_datafusion_err!("cache manifest: {e}"))?;
    std::fs::write(&path, text).map_err(|e| write_error(&path, e))
}

/// Why an entry on disk cannot be used. The caller recomputes it.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// There is no entry with this key.
    Missing,
    /// The entry exists but is damaged: the message says how.
    Damaged(String),
}

/// An entry opened and verified: its manifest, schema and part handles.
#[derive(Debug)]
pub(crate) struct OpenedEntry {
    pub(crate) manifest: Manifest,
    pub(crate) schema: SchemaRef,
    pub(crate) parts: Vec<Arc<File>>,
}

/// How much of an entry [`open`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Read every part and compare its checksum: entries written by another
    /// run or process.
    Checksums,
    /// Compare sizes only: the entry this process has just written and
    /// hashed while writing it.
    Sizes,
}

/// Opens the entry in `dir` and checks its parts as `verify` says.
pub(crate) fn open(
    dir: &Path,
    key: &str,
    verify: Verify,
) -> std::result::Result<OpenedEntry, OpenError> {
    let manifest_path = dir.join(MANIFEST);
    let text = match std::fs::read(&manifest_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(if dir.exists() {
                OpenError::Damaged(format!("'{}' is missing", manifest_path.display()))
            } else {
                OpenError::Missing
            });
        }
        Err(e) => {
            return Err(OpenError::Damaged(format!(
                "cannot read '{}': {e}",
                manifest_path.display()
            )));
        }
    };
    let damaged = |msg: String| OpenError::Damaged(msg);
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| {
        damaged(format!("'{}' is not valid: {e}", manifest_path.display()))
    })?;
    if manifest.format != FORMAT || manifest.key != key {
        return Err(damaged(format!(
            "'{}' describes format {} key {}, expected format {FORMAT} key {key}",
            manifest_path.display(),
            manifest.format,
            manifest.key
        )));
    }
    if manifest.parts.is_empty() {
        return Err(damaged(format!(
            "'{}' lists no parts",
            manifest_path.display()
        )));
    }
    let mut parts = Vec::with_capacity(manifest.parts.len());
    for part in &manifest.parts {
        let path = dir.join(&part.file);
        let file = File::open(&path)
            .map_err(|e| damaged(format!("cannot open '{}': {e}", path.display())))?;
        let (bytes, checksum) = match verify {
            Verify::Checksums => checksum_file(&file),
            Verify::Sizes => file.metadata().map(|m| (m.len(), part.checksum.clone())),
        }
        .map_err(|e| damaged(format!("cannot read '{}': {e}", path.display())))?;
        if bytes != part.bytes || checksum != part.checksum {
            return Err(damaged(format!(
                "'{}' does not match its checksum ({bytes} bytes, xxh3 {checksum}; \
                 the manifest says {} bytes, xxh3 {})",
                path.display(),
                part.bytes,
                part.checksum
            )));
        }
        parts.push(Arc::new(file));
    }
    let first = Arc::clone(&parts[0]);
    let reader =
        FileReader::try_new(PositionedReader::new(first), None).map_err(|e| {
            damaged(format!(
                "'{}' is not an Arrow IPC file: {e}",
                dir.join(&manifest.parts[0].file).display()
            ))
        })?;
    let schema = reader.schema();
    Ok(OpenedEntry {
        manifest,
        schema,
        parts,
    })
}

/// Length and xxh3-64 (hex) of the whole of `file`.
fn checksum_file(file: &File) -> std::io::Result<(u64, String)> {
    let mut reader = PositionedReader::new(Arc::new(file.try_clone()?));
    let mut hasher = Xxh3::new();
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = reader.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        bytes += n as u64;
    }
    Ok((bytes, format!("{:016x}", hasher.digest())))
}

/// `Read + Seek` over a shared file handle with positioned reads, so that
/// readers of one file never move each other's offset.
pub(crate) struct PositionedReader {
    file: Arc<File>,
    position: u64,
}

impl PositionedReader {
    pub(crate) fn new(file: Arc<File>) -> Self {
        Self { file, position: 0 }
    }
}

impl Read for PositionedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.position)?;
        self.position += n as u64;
        Ok(n)
    }
}

impl Seek for PositionedReader {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            SeekFrom::Start(offset) => Some(offset),
            SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
            SeekFrom::End(delta) => self.file.metadata()?.len().checked_add_signed(delta),
        };
        self.position = target.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "seek before the start of the file",
            )
        })?;
        Ok(self.position)
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};

    pub(super) fn batch(from: i64, rows: i64) -> RecordBatch {
        RecordBatch::try_from_iter(vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(from..from + rows)) as _,
            ),
            (
                "s",
                Arc::new(StringArray::from_iter_values(
                    (from..from + rows).map(|i| format!("row {i}")),
                )) as _,
            ),
        ])
        .expect("batch")
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::batch;
    use super::*;

    fn write_entry(dir: &Path) -> Result<Manifest> {
        let schema = batch(0, 1).schema();
        let mut parts = Vec::new();
        for index in 0..2 {
            let mut writer = PartWriter::create(dir, index, &schema)?;
            writer.write(&batch(index as i64 * 100, 10))?;
            writer.write(&batch(index as i64 * 100 + 10, 5))?;
            parts.push(writer.finish()?);
        }
        let manifest = Manifest {
            format: FORMAT,
            key: "k".into(),
            query: "SELECT 1".into(),
            created_unix: 0,
            inputs: vec![],
            assets: vec![],
            build: String::new(),
            parts,
        };
        write_manifest(dir, &manifest)?;
        Ok(manifest)
    }

    #[test]
    fn written_entries_open_and_read_back() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let manifest = write_entry(dir.path())?;
        assert_eq!(manifest.rows(), 30);
        let opened = open(dir.path(), "k", Verify::Checksums)
            .map_err(|e| internal_datafusion_err!("should open: {e:?}"))?;
        assert_eq!(opened.schema, batch(0, 1).schema());
        let reader = FileReader::try_new(
            PositionedReader::new(Arc::clone(&opened.parts[1])),
            None,
        )?;
        let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
        assert_eq!(batches, vec![batch(100, 10), batch(110, 5)]);
        Ok(())
    }

    #[test]
    fn damage_is_detected_not_served() -> Result<()> {
        let dir = tempfile::tempdir()?;
        write_entry(dir.path())?;
        // One flipped byte in the middle of a part.
        let part = dir.path().join(part_file(1));
        let mut bytes = std::fs::read(&part)?;
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x40;
        std::fs::write(&part, bytes)?;
        match open(dir.path(), "k", Verify::Checksums) {
            Err(OpenError::Damaged(msg)) => {
                assert!(
                    msg.contains("part-00001.arrow") && msg.contains("checksum"),
                    "{msg}"
                )
            }
            other => panic!("expected damage, got {other:?}"),
        }
        // Sizes only (for the entry a process just wrote) skips the hash but
        // still catches a truncated part.
        assert!(open(dir.path(), "k", Verify::Sizes).is_ok());
        let bytes = std::fs::read(&part)?;
        std::fs::write(&part, &bytes[..bytes.len() - 1])?;
        assert!(matches!(
            open(dir.path(), "k", Verify::Sizes),
            Err(OpenError::Damaged(m)) if m.contains("checksum")
        ));
        // A missing part, a wrong key, no entry at all.
        std::fs::remove_file(&part)?;
        assert!(
            matches!(open(dir.path(), "k", Verify::Checksums), Err(OpenError::Damaged(m)) if m.contains("cannot open"))
        );
        assert!(
            matches!(open(dir.path(), "other", Verify::Checksums), Err(OpenError::Damaged(m)) if m.contains("expected format"))
        );
        assert!(matches!(
            open(&dir.path().join("nothing"), "k", Verify::Checksums),
            Err(OpenError::Missing)
        ));
        Ok(())
    }
}

#[cfg(test)]
mod writer_tests {
    use super::tests_support::batch;
    use super::*;

    #[tokio::test]
    async fn part_writers_keep_batch_order_and_checksums() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let schema = batch(0, 1).schema();
        // Parts 3 and 5, batches alternating between them as a fill does.
        let mut writers =
            PartWriters::spawn(dir.path().to_path_buf(), vec![3, 5], schema);
        for i in 0..6 {
            writers.write(i % 2, batch(i as i64 * 10, 10)).await?;
        }
        let manifests = writers.finish().await?;
        assert_eq!(
            manifests
                .iter()
                .map(|m| m.file.as_str())
                .collect::<Vec<_>>(),
            vec![part_file(3).as_str(), part_file(5).as_str()]
        );
        for (manifest, first) in manifests.iter().zip([0i64, 10]) {
            let file = File::open(dir.path().join(&manifest.file))?;
            assert_eq!(
                checksum_file(&file)?,
                (manifest.bytes, manifest.checksum.clone())
            );
            let reader =
                FileReader::try_new(PositionedReader::new(Arc::new(file)), None)?;
            let batches = reader.collect::<std::result::Result<Vec<_>, _>>()?;
            let expected: Vec<_> = (0..3).map(|k| batch(first + k * 20, 10)).collect();
            assert_eq!(batches, expected);
            assert_eq!(manifest.rows, 30);
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_failing_part_writer_reports_the_path() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let missing = dir.path().join("gone");
        let mut writers = PartWriters::spawn(missing, vec![0], batch(0, 1).schema());
        // Creating the file fails on the thread; the next call says why.
        let mut result = Ok(());
        for i in 0..4 {
            result = writers.write(0, batch(i, 1)).await;
            if result.is_err() {
                break;
            }
        }
        let err = match result {
            Err(e) => e,
            Ok(()) => writers.finish().await.expect_err("the folder is missing"),
        };
        assert!(err.to_string().contains("gone"), "{err}");
        Ok(())
    }
}
