//! [`EntryFill`]: a cache entry being written by whoever drives the query's
//! partitions — the store's own tasks ([`super::CacheStore::get_or_create`])
//! or a consumer reading the rows anyway ([`super::CacheFillExec`], a feed's
//! first epoch).
//!
//! ```text
//!  input partition p ──batches──▶ PartitionWriter p ──▶ parts p, p+P, p+2P, …
//!                                   │ (in turn, batch by batch; P = input partitions)
//!                                   └─ in-memory prefix of each part, while the
//!                                      cache's memory share lasts
//!  every partition finished ──▶ CacheStore::finish_fill: manifest, rename, open
//! ```
//!
//! # Layout
//! The parts an input partition owns are fixed by the partition and part
//! counts alone, and each part receives its batches in the order the
//! partition produced them, so the entry is a pure function of the
//! partitions' streams and the part count (which the store's own fills and a
//! feed's choose differently: a feed keys its entries by its layout).
//!
//! # Failure
//! Until every partition finished, nothing is visible: the files live in a
//! locked folder under `tmp/`, removed when the fill is dropped unfinished
//! (an error, a consumer that stopped early, a killed process).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::internal_datafusion_err;
use datafusion::common::{exec_err, internal_err};
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;

use super::entry::{PartManifest, PartWriters};
use super::identity::CacheKey;
use crate::cache::liveness::LiveFolder;

/// How an entry's parts are fed: fixed before the first batch is written.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// Partitions of the plan that fills it (0: an empty plan, whose one
    /// empty part is written when the fill is committed).
    pub(crate) inputs: usize,
    /// Parts of the entry (at least `inputs`).
    pub(crate) parts: usize,
    /// The schema of every part.
    pub(crate) schema: SchemaRef,
}

/// What one input partition wrote: per part its number, manifest and
/// in-memory prefix.
pub(crate) type WrittenParts = Vec<(usize, PartManifest, Vec<RecordBatch>)>;

/// An entry being written; see the module docs.
pub struct EntryFill {
    /// The entry's key.
    pub(crate) key: CacheKey,
    /// The query text shown in listings.
    pub(crate) query: String,
    /// Where the entry goes once complete.
    pub(crate) final_dir: PathBuf,
    /// The locked folder under `tmp/` the parts are written into; taken
    /// when the entry is committed.
    pub(crate) work: Mutex<Option<LiveFolder>>,
    /// The in-memory prefixes' reservation and cap.
    pub(crate) memory: MemoryShare,
    /// Fixed by the first plan that writes it.
    layout: OnceLock<Layout>,
    /// Which partitions started and finished, and what they wrote.
    progress: Mutex<Progress>,
}

#[derive(Default)]
struct Progress {
    /// Input partitions whose writer was handed out.
    started: Vec<bool>,
    /// Input partitions that wrote their last batch.
    finished: usize,
    written: WrittenParts,
}

impl std::fmt::Debug for EntryFill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryFill")
            .field("key", &self.key.hex)
            .field("layout", &self.layout.get())
            .finish()
    }
}

impl EntryFill {
    pub(crate) fn new(
        key: CacheKey,
        query: String,
        final_dir: PathBuf,
        work: LiveFolder,
        memory: MemoryShare,
    ) -> Self {
        Self {
            key,
            query,
            final_dir,
            work: Mutex::new(Some(work)),
            memory,
            layout: OnceLock::new(),
            progress: Mutex::new(Progress::default()),
        }
    }

    /// The entry's key (hex), for plans and messages.
    pub fn key_hex(&self) -> &str {
        &self.key.hex
    }

    /// Fixes the layout; a second call must agree with the first (one plan
    /// fills one entry).
    pub(crate) fn set_layout(&self, layout: Layout) -> Result<&Layout> {
        let set = self.layout.get_or_init(|| layout.clone());
        if set.inputs != layout.inputs
            || set.parts != layout.parts
            || set.schema.fields() != layout.schema.fields()
        {
            return internal_err!(
                "cache entry {} is filled by two plans of different shapes",
                self.key.hex
            );
        }
        Ok(set)
    }

    /// The writer of input partition `input`; each is handed out once.
    pub(crate) fn partition(self: &Arc<Self>, input: usize) -> Result<PartitionWriter> {
        let layout = self.layout.get().ok_or_else(|| {
            internal_datafusion_err!("cache fill: partition before layout")
        })?;
        // A plan without partitions still writes its one (empty) part.
        let inputs = layout.inputs.max(1);
        if input >= inputs {
            return internal_err!("cache fill: partition {input} of {inputs}");
        }
        {
            let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
            if progress.started.is_empty() {
                progress.started = vec![false; inputs];
            }
            if std::mem::replace(&mut progress.started[input], true) {
                return internal_err!(
                    "cache entry {}: partition {input} was executed twice",
                    self.key.hex
                );
            }
        }
        let dir = {
            let work = self.work.lock().unwrap_or_else(|p| p.into_inner());
            work.as_ref()
                .ok_or_else(|| internal_datafusion_err!("cache fill already committed"))?
                .path()
                .to_path_buf()
        };
        let owned: Vec<usize> = (input..layout.parts).step_by(inputs).collect();
        Ok(PartitionWriter {
            fill: Arc::clone(self),
            writers: PartWriters::spawn(dir, owned.clone(), Arc::clone(&layout.schema)),
            kept: vec![(Vec::new(), true); owned.len()],
            owned,
            next: 0,
        })
    }

    /// Everything written, sorted by part, once complete. The empty part of
    /// a plan without partitions is written here, as nothing executed it.
    pub(crate) async fn take_written(self: &Arc<Self>) -> Result<WrittenParts> {
        let empty_plan = self.layout.get().is_some_and(|l| l.inputs == 0);
        let unwritten = self
            .progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .started
            .is_empty();
        if empty_plan && unwritten {
            self.partition(0)?.finish().await?;
        }
        let mut progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        let inputs = self.layout.get().map_or(0, |l| l.inputs.max(1));
        if progress.finished != inputs || inputs == 0 {
            return exec_err!(
                "cache entry {} is incomplete: {} of {inputs} partitions were written",
                self.key.hex,
                progress.finished
            );
        }
        let mut written = std::mem::take(&mut progress.written);
        written.sort_by_key(|(part, _, _)| *part);
        Ok(written)
    }
}

/// Writes one input partition's batches into the parts it owns; see the
/// module docs.
pub(crate) struct PartitionWriter {
    /// The entry it writes into.
    fill: Arc<EntryFill>,
    /// The parts it owns, in turn.
    owned: Vec<usize>,
    /// The blocking writer thread of those parts.
    writers: PartWriters,
    /// Per owned part: the batches kept in memory, and whether more may be
    /// (only a prefix of each part stays in memory: the scan reads memory
    /// first, then the file from there).
    kept: Vec<(Vec<RecordBatch>, bool)>,
    /// Position in `owned` of the part the next batch goes to.
    next: usize,
}

impl PartitionWriter {
    /// Queues `batch` for the next part in turn.
    pub(crate) async fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let slot = self.next;
        self.next = (self.next + 1) % self.owned.len();
        let (prefix, keeping) = &mut self.kept[slot];
        if *keeping {
            *keeping = self.fill.memory.try_keep(batch.get_array_memory_size());
            if *keeping {
                prefix.push(batch.clone());
            }
        }
        self.writers.write(slot, batch.clone()).await
    }

    /// Finishes the owned parts and records them in the fill.
    pub(crate) async fn finish(self) -> Result<()> {
        let manifests = self.writers.finish().await?;
        let mut progress = self.fill.progress.lock().unwrap_or_else(|p| p.into_inner());
        progress.written.extend(
            self.owned
                .into_iter()
                .zip(manifests)
                .zip(self.kept)
                .map(|((part, manifest), (prefix, _))| (part, manifest, prefix)),
        );
        progress.finished += 1;
        Ok(())
    }
}

/// The memory share of one fill: a reservation in the session's pool, capped
/// together with the session's other cached tables (`used`).
pub(crate) struct MemoryShare {
    /// The bytes kept in memory, in the session's pool.
    pub(crate) reservation: Mutex<MemoryReservation>,
    /// Bytes all cached tables of the session keep (the store's counter).
    pub(crate) used: Arc<AtomicUsize>,
    /// The most `used` may reach.
    pub(crate) cap: usize,
}

impl MemoryShare {
    /// Reserves `bytes` if both the cache's cap and the pool allow it.
    fn try_keep(&self, bytes: usize) -> bool {
        let previous = self.used.fetch_add(bytes, Ordering::Relaxed);
        if previous + bytes > self.cap {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        let reservation = self.reservation.lock().unwrap_or_else(|p| p.into_inner());
        if reservation.try_grow(bytes).is_err() {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The reservation, taken out (this share then holds nothing).
    pub(crate) fn take(&self) -> MemoryReservation {
        self.reservation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Drop for MemoryShare {
    /// A fill dropped unfinished gives its bytes back to the cache's cap
    /// (the pool gets them back when the reservation drops).
    fn drop(&mut self) {
        let held = self
            .reservation
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .size();
        self.used.fetch_sub(held, Ordering::Relaxed);
    }
}
