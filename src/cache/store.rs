//! [`CacheStore`]: a session's cache — entries keyed, looked up in memory
//! and on disk, filled by the store's own tasks or by a query's
//! [`super::CacheFillExec`], committed, listed and evicted (see the module
//! docs of `crate::cache` for the flow).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use datafusion::arrow::array::RecordBatch;
use datafusion::common::exec_err;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::{exec_datafusion_err, internal_datafusion_err};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::TaskContext;
use datafusion::execution::context::SessionState;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use futures::StreamExt;

use super::disk::{create_dir, evict, modified_unix, remove_entry_dir, touch, unix_now};
use super::entry::{OpenError, Verify, blocking};
use super::exec::{CachedPart, CachedTable};
use super::fill::{EntryFill, Layout, MemoryShare};
use super::key::{self, AssetFile, CacheKey};
use super::liveness::LiveFolder;
use super::{CacheOptions, Manifest, Origin, entry, liveness};

/// One entry as `\cache` lists it.
#[derive(Debug, Clone)]
pub struct EntryInfo {
    /// The key.
    pub key: String,
    /// The query that produced it.
    pub query: String,
    /// Rows.
    pub rows: u64,
    /// Bytes on disk.
    pub disk_bytes: u64,
    /// Bytes this session holds in memory for it.
    pub memory_bytes: usize,
    /// Seconds since the epoch of the last use.
    pub last_used_unix: u64,
    /// Shared across runs (`false`: this session only).
    pub persistent: bool,
    /// The files its functions read (tokenizers), with content hashes.
    pub assets: Vec<AssetFile>,
}

/// The cache of one session; see the module docs. Creates nothing on disk
/// until the first entry is written.
pub struct CacheStore {
    options: CacheOptions,
    /// Bytes all cached tables of this session hold in memory.
    memory_used: Arc<AtomicUsize>,
    /// Open tables by key, so a session shares one copy.
    open: Mutex<HashMap<String, Weak<CachedTable>>>,
    /// This session's folder for session-only entries (created on demand,
    /// locked while this store lives, removed on drop).
    session_dir: Mutex<Option<LiveFolder>>,
    /// Whether leftovers of crashed processes were removed.
    swept: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for CacheStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheStore")
            .field("options", &self.options)
            .field("memory_used", &self.memory_used.load(Ordering::Relaxed))
            .finish()
    }
}

impl CacheStore {
    /// A store over `options.dir`.
    pub fn new(options: CacheOptions) -> Self {
        Self {
            options,
            memory_used: Arc::new(AtomicUsize::new(0)),
            open: Mutex::new(HashMap::new()),
            session_dir: Mutex::new(None),
            swept: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The options.
    pub fn options(&self) -> &CacheOptions {
        &self.options
    }

    fn entries_dir(&self) -> PathBuf {
        self.options.dir.join("entries")
    }

    fn tmp_dir(&self) -> PathBuf {
        self.options.dir.join("tmp")
    }

    /// The cached result of `plan` (a logical plan of `state`), computed now
    /// or reused; `query` is the text shown in listings.
    pub async fn get_or_create(
        &self,
        state: &SessionState,
        plan: LogicalPlan,
        query: &str,
        salt: &str,
    ) -> Result<Arc<CachedTable>> {
        match self.lookup_prepared(state, plan, query, salt).await? {
            Lookup::Hit(table) => Ok(table),
            Lookup::Miss(miss) => self.fill(*miss, query).await,
        }
    }

    /// The cached result of `plan` if this store has a sound entry for it
    /// (in memory, or on disk and checked); else an [`EntryFill`] for it,
    /// which the caller fills by running a plan with the same rows through
    /// [`CacheFillExec`] and commits with [`finish_fill`](Self::finish_fill).
    pub async fn lookup_or_begin_fill(
        &self,
        state: &SessionState,
        plan: LogicalPlan,
        query: &str,
        salt: &str,
    ) -> Result<CacheLookup> {
        Ok(
            match self.lookup_prepared(state, plan, query, salt).await? {
                Lookup::Hit(table) => CacheLookup::Hit(table),
                Lookup::Miss(miss) => {
                    CacheLookup::Miss(Arc::new(self.begin_fill(*miss, query)?))
                }
            },
        )
    }

    /// The key of `plan`'s entry as [`CacheStore::lookup_or_begin_fill`]
    /// computes it (the same definition of "the same result"), for entries
    /// a cluster's executors keep (`shared`).
    pub async fn entry_key(
        &self,
        state: &SessionState,
        plan: &LogicalPlan,
        salt: &str,
    ) -> Result<String> {
        let state = deterministic_state(state);
        let (calls, assets) = pin_assets(plan, Vec::new(), Vec::new()).await?;
        let plan = state.optimize(plan)?;
        let physical = state.create_physical_plan(&plan).await?;
        let (_, assets) = pin_assets(&plan, calls, assets).await?;
        Ok(key::compute(&plan, &physical, salt, assets)?.hex)
    }

    /// Keys `plan` and opens its entry if there is a sound one.
    async fn lookup_prepared(
        &self,
        state: &SessionState,
        plan: LogicalPlan,
        query: &str,
        salt: &str,
    ) -> Result<Lookup> {
        let state = deterministic_state(state);
        // Pinned before optimizing: the optimizer folds calls on constants
        // with whatever tokenizer the function holds, which must be the
        // current file's.
        let (calls, assets) = pin_assets(&plan, Vec::new(), Vec::new()).await?;
        let plan = state.optimize(&plan)?;
        let physical = state.create_physical_plan(&plan).await?;
        // Calls inside views appear only once the optimizer inlined them.
        let (_, assets) = pin_assets(&plan, calls, assets).await?;
        let key = key::compute(&plan, &physical, salt, assets)?;

        if let Some(table) = self.open_table(&key.hex) {
            return Ok(Lookup::Hit(table));
        }
        let memory_limit = match state.runtime_env().memory_pool.memory_limit() {
            datafusion::execution::memory_pool::MemoryLimit::Finite(bytes) => bytes,
            _ => usize::MAX / 2,
        };
        let memory_cap = (memory_limit as f64 * self.options.memory_fraction) as usize;
        let reservation = MemoryConsumer::new(format!("cache {}", &key.hex[..12]))
            .register(&state.runtime_env().memory_pool);

        if key.persistent {
            let dir = self.entries_dir().join(&key.hex);
            let (at, hex) = (dir.clone(), key.hex.clone());
            let opened = blocking("opening a cache entry", move || {
                let opened = entry::open(&at, &hex, Verify::Checksums);
                if opened.is_ok() {
                    touch(&at);
                }
                Ok(opened)
            })
            .await?;
            match opened {
                Ok(opened) => {
                    let table =
                        self.table_from_disk(key, query, opened, dir, reservation);
                    return Ok(Lookup::Hit(self.remember(table)));
                }
                Err(OpenError::Missing) => {}
                Err(OpenError::Damaged(why)) => {
                    log::warn!(
                        "cache entry {} is damaged and is recomputed: {why}",
                        dir.display()
                    );
                    let tmp = self.tmp_dir();
                    blocking("removing a damaged cache entry", move || {
                        Ok(remove_entry_dir(&tmp, &dir))
                    })
                    .await?;
                }
            }
        }
        Ok(Lookup::Miss(Box::new(Miss {
            state,
            physical,
            key,
            reservation,
            memory_cap,
        })))
    }

    /// Computes a missed entry.
    async fn fill(&self, miss: Miss, query: &str) -> Result<Arc<CachedTable>> {
        let started = Instant::now();
        let (state, physical) = (miss.state.clone(), Arc::clone(&miss.physical));
        let fill = Arc::new(self.begin_fill(miss, query)?);
        compute(&state, physical, &fill).await?;
        let table = self.finish_fill(&fill).await?;
        log::info!(
            "cached {} rows ({} bytes) in {:.2} s",
            table.rows(),
            table.disk_bytes(),
            started.elapsed().as_secs_f64()
        );
        Ok(table)
    }

    /// The folder and memory share a missed entry is written with.
    fn begin_fill(&self, miss: Miss, query: &str) -> Result<EntryFill> {
        let Miss {
            key,
            reservation,
            memory_cap,
            ..
        } = miss;
        let final_dir = if key.persistent {
            self.entries_dir().join(&key.hex)
        } else {
            self.session_folder()?.join(&key.hex)
        };
        create_dir(&self.tmp_dir())?;
        self.sweep_once();
        let prefix = format!("{}-{}-", std::process::id(), key.hex);
        let work = LiveFolder::create(&self.tmp_dir(), &prefix).map_err(|e| {
            exec_datafusion_err!(
                "cannot create a folder in the cache directory '{}': {e}. Set \
                 --cache-dir (SessionBuilder::cache_dir) to a writable folder",
                self.tmp_dir().display()
            )
        })?;
        let memory = MemoryShare {
            reservation: Mutex::new(reservation),
            used: Arc::clone(&self.memory_used),
            cap: memory_cap,
        };
        Ok(EntryFill::new(
            key,
            query.to_string(),
            final_dir,
            work,
            memory,
        ))
    }

    fn open_table(&self, key: &str) -> Option<Arc<CachedTable>> {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(key).and_then(Weak::upgrade)
    }

    fn remember(&self, table: CachedTable) -> Arc<CachedTable> {
        let table = Arc::new(table);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, t| t.strong_count() > 0);
        open.insert(table.key.hex.clone(), Arc::downgrade(&table));
        table
    }

    /// The callback that returns a table's memory share to this store.
    fn release_hook(&self) -> Box<dyn Fn(usize) + Send + Sync> {
        let used = Arc::clone(&self.memory_used);
        Box::new(move |bytes| {
            used.fetch_sub(bytes, Ordering::Relaxed);
        })
    }

    fn table_from_disk(
        &self,
        key: CacheKey,
        query: &str,
        opened: entry::OpenedEntry,
        dir: PathBuf,
        reservation: MemoryReservation,
    ) -> CachedTable {
        let parts = cached_parts(&opened.manifest, opened.parts, &dir, Vec::new());
        CachedTable {
            disk_bytes: opened.manifest.bytes(),
            query: if opened.manifest.query.is_empty() {
                query.to_string()
            } else {
                opened.manifest.query
            },
            key,
            schema: opened.schema,
            parts: Arc::new(parts),
            memory: reservation,
            origin: Origin::Disk,
            dir,
            on_drop: Some(self.release_hook()),
            remove_on_drop: false,
        }
    }

    /// Commits a complete fill: writes its manifest, moves it into place and
    /// opens it; fails if some partition did not write its last batch (then
    /// the fill's folder goes when the fill is dropped).
    pub async fn finish_fill(&self, fill: &Arc<EntryFill>) -> Result<Arc<CachedTable>> {
        let (manifests, mut kept): (Vec<_>, Vec<_>) = fill
            .take_written()
            .await?
            .into_iter()
            .map(|(_, manifest, kept)| (manifest, kept))
            .unzip();
        let work = fill
            .work
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| internal_datafusion_err!("cache fill committed twice"))?;
        let (key, query, final_dir) =
            (fill.key.clone(), fill.query.as_str(), &fill.final_dir);
        let manifest = Manifest {
            format: key::FORMAT,
            key: key.hex.clone(),
            query: query.to_string(),
            created_unix: unix_now(),
            inputs: key.inputs.clone(),
            assets: key.assets.clone(),
            build: key.build.clone(),
            parts: manifests,
        };
        let (at, written) = (work.path().to_path_buf(), manifest.clone());
        blocking("writing a cache manifest", move || {
            entry::write_manifest(&at, &written)
        })
        .await?;
        let (dir, ours) = self.commit(work, final_dir, &key)?;
        // Open what is now in place: ours (hashed while written, so sizes
        // suffice), or the entry another process committed first (then
        // verified like any entry from elsewhere; our in-memory batches are
        // the same data, but its files are what the scans read).
        let verify = if ours {
            Verify::Sizes
        } else {
            Verify::Checksums
        };
        let (at, hex) = (dir.clone(), key.hex.clone());
        let opened = blocking("opening a cache entry", move || {
            entry::open(&at, &hex, verify).map_err(|e| {
                exec_datafusion_err!(
                    "cache entry '{}' cannot be opened right after writing it: {e:?}",
                    at.display()
                )
            })
        })
        .await?;
        let disk_bytes = opened.manifest.bytes();
        let reservation = fill.memory.take();
        // Keep our in-memory batches only if the files in place are ours
        // byte for byte (another process may have won with other partitions).
        let same_files = opened.manifest.parts.len() == manifest.parts.len()
            && opened
                .manifest
                .parts
                .iter()
                .zip(&manifest.parts)
                .all(|(a, b)| a.checksum == b.checksum && a.rows == b.rows);
        if !same_files {
            kept = Vec::new();
            self.memory_used
                .fetch_sub(reservation.size(), Ordering::Relaxed);
            reservation.free();
        }
        let parts = cached_parts(&opened.manifest, opened.parts, &dir, kept);
        let key_persistent = key.persistent;
        let table = CachedTable {
            key,
            query: query.to_string(),
            schema: opened.schema,
            parts: Arc::new(parts),
            memory: reservation,
            origin: Origin::Computed,
            disk_bytes,
            dir,
            on_drop: Some(self.release_hook()),
            remove_on_drop: !key_persistent,
        };
        if table.key.persistent {
            let (entries, tmp) = (self.entries_dir(), self.tmp_dir());
            let (max_bytes, keep) = (self.options.max_bytes, table.key.hex.clone());
            blocking("evicting cache entries", move || {
                evict(&entries, &tmp, max_bytes, Some(&keep));
                Ok(())
            })
            .await?;
        }
        Ok(self.remember(table))
    }

    /// Moves the finished `work` folder to `target`; returns where the
    /// entry now is and whether it is ours (else another process committed
    /// the same key first).
    fn commit(
        &self,
        work: LiveFolder,
        target: &Path,
        key: &CacheKey,
    ) -> Result<(PathBuf, bool)> {
        if let Some(parent) = target.parent() {
            create_dir(parent)?;
        }
        // Renamed while still locked, so no sweeper takes it half way; a
        // failed rename leaves `work` in tmp/, removed when it drops.
        match std::fs::rename(work.path(), target) {
            Ok(()) => {
                // Now an entry: nothing left in tmp/ to remove.
                let _ = work.keep();
                Ok((target.to_path_buf(), true))
            }
            Err(_) if target.join(entry::MANIFEST).exists() => {
                log::info!("cache entry {} was written by another process", key.hex);
                Ok((target.to_path_buf(), false))
            }
            Err(e) => exec_err!(
                "cannot move the cache entry into '{}': {e}",
                target.display()
            ),
        }
    }

    /// Removes what killed processes left in `tmp/` and `sessions/`: the
    /// folders whose lock is free (see `liveness.rs`), and
    /// `removed-*` trash whose removal was interrupted.
    fn sweep_once(&self) {
        if self.swept.swap(true, Ordering::Relaxed) {
            return;
        }
        for folder in [self.tmp_dir(), self.options.dir.join("sessions")] {
            liveness::sweep_abandoned(&folder, "");
        }
    }

    /// This session's folder for session-only entries.
    fn session_folder(&self) -> Result<PathBuf> {
        let mut folder = self.session_dir.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = folder.as_ref() {
            return Ok(dir.path().to_path_buf());
        }
        let parent = self.options.dir.join("sessions");
        create_dir(&parent)?;
        let dir = LiveFolder::create(&parent, &format!("{}-", std::process::id()))
            .map_err(|e| {
                exec_datafusion_err!(
                    "cannot create a session folder in '{}': {e}. Set --cache-dir \
                     (SessionBuilder::cache_dir) to a writable folder",
                    parent.display()
                )
            })?;
        let path = dir.path().to_path_buf();
        *folder = Some(dir);
        Ok(path)
    }

    /// Entries on disk (shared ones and this session's).
    pub fn entries(&self) -> Vec<EntryInfo> {
        let mut infos = Vec::new();
        let mut folders = vec![self.entries_dir()];
        if let Some(dir) = self
            .session_dir
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            folders.push(dir.path().to_path_buf());
        }
        for (index, folder) in folders.iter().enumerate() {
            let Ok(read) = std::fs::read_dir(folder) else {
                continue;
            };
            for item in read.flatten() {
                let dir = item.path();
                let manifest_path = dir.join(entry::MANIFEST);
                let Ok(text) = std::fs::read(&manifest_path) else {
                    continue;
                };
                let Ok(manifest) = serde_json::from_slice::<Manifest>(&text) else {
                    continue;
                };
                let memory_bytes = self
                    .open_table(&manifest.key)
                    .map_or(0, |t| t.memory_bytes());
                infos.push(EntryInfo {
                    rows: manifest.rows(),
                    disk_bytes: manifest.bytes(),
                    memory_bytes,
                    last_used_unix: modified_unix(&manifest_path),
                    persistent: index == 0,
                    key: manifest.key,
                    query: manifest.query,
                    assets: manifest.assets,
                });
            }
        }
        infos.sort_by_key(|e| std::cmp::Reverse(e.last_used_unix));
        infos
    }

    /// Removes every shared entry; returns (entries, bytes) removed. Tables
    /// already open keep reading their (now unlinked) files until dropped.
    pub fn clear(&self) -> (usize, u64) {
        let mut removed = (0, 0);
        if let Ok(read) = std::fs::read_dir(self.entries_dir()) {
            for item in read.flatten() {
                removed.0 += 1;
                removed.1 += remove_entry_dir(&self.tmp_dir(), &item.path());
            }
        }
        removed
    }
}

/// The parts of an opened entry in `dir`, each with the in-memory prefix of
/// its batches from `kept` (missing = none).
fn cached_parts(
    manifest: &Manifest,
    files: Vec<Arc<std::fs::File>>,
    dir: &Path,
    kept: Vec<Vec<RecordBatch>>,
) -> Vec<CachedPart> {
    let mut kept = kept.into_iter();
    manifest
        .parts
        .iter()
        .zip(files)
        .map(|(part, file)| CachedPart {
            in_memory: kept.next().unwrap_or_default(),
            file,
            path: dir.join(&part.file),
            rows: part.rows,
        })
        .collect()
}

/// Runs `physical`, one task per partition so that they decode in
/// parallel, writing every partition into `fill`.
async fn compute(
    state: &SessionState,
    physical: Arc<dyn ExecutionPlan>,
    fill: &Arc<EntryFill>,
) -> Result<()> {
    let task_ctx = Arc::new(TaskContext::from(state));
    let partitions = physical.output_partitioning().partition_count();
    // At least as many parts as the session's target partitions, so that
    // scans of the cache need no round-robin repartitioning (which buffers,
    // and under memory pressure spills, whatever the scan reads ahead).
    fill.set_layout(Layout {
        inputs: partitions,
        parts: partitions.max(state.config().target_partitions()).max(1),
        schema: physical.schema(),
    })?;
    let mut tasks: Vec<SpawnedTask<Result<()>>> = Vec::with_capacity(partitions.max(1));
    for partition in 0..partitions {
        let physical = Arc::clone(&physical);
        let task_ctx = Arc::clone(&task_ctx);
        let mut writer = fill.partition(partition)?;
        tasks.push(SpawnedTask::spawn(async move {
            let mut stream = physical.execute(partition, task_ctx)?;
            while let Some(batch) = stream.next().await {
                writer.write(&batch?).await?;
            }
            writer.finish().await
        }));
    }
    for task in tasks {
        task.join()
            .await
            .map_err(|e| exec_datafusion_err!("a cache writer task failed: {e}"))??;
    }
    Ok(())
}

/// `state` with the partition contents made independent of timing: no
/// round-robin repartitioning and no file work stealing. A cached result is
/// then the same however often it is computed, which unshuffled feeds and
/// the shards of ranks reading one entry rely on.
pub(crate) fn deterministic_state(state: &SessionState) -> SessionState {
    let mut config = state.config().clone();
    crate::config::deterministic_config(
        &mut config,
        crate::config::PartitionOrder::Partitions(None),
    );
    SessionStateBuilder::new_from_existing(state.clone())
        .with_config(config)
        .build()
}

/// `pinned` (the assets read for `calls`) plus those of `plan`'s calls not
/// among `calls`, read and pinned now on the blocking pool (see
/// [`key`]); returns all calls and assets.
async fn pin_assets(
    plan: &LogicalPlan,
    mut calls: Vec<key::AssetCall>,
    mut pinned: Vec<AssetFile>,
) -> Result<(Vec<key::AssetCall>, Vec<AssetFile>)> {
    let new: Vec<_> = key::asset_calls(plan)?
        .into_iter()
        .filter(|call| !calls.contains(call))
        .collect();
    if new.is_empty() {
        return Ok((calls, pinned));
    }
    calls.extend(new.iter().cloned());
    pinned.extend(
        blocking("reading the files the query's functions read", move || {
            key::pin_assets(new)
        })
        .await?,
    );
    Ok((calls, pinned))
}

/// What [`CacheStore::lookup_or_begin_fill`] found.
#[derive(Debug)]
pub enum CacheLookup {
    /// A sound entry.
    Hit(Arc<CachedTable>),
    /// None: the entry to fill.
    Miss(Arc<EntryFill>),
}

/// What [`CacheStore::lookup_prepared`] found.
enum Lookup {
    /// A sound entry.
    Hit(Arc<CachedTable>),
    /// None: what computing it needs.
    Miss(Box<Miss>),
}

/// A keyed plan whose entry is missing.
struct Miss {
    /// The deterministic state it was planned in.
    state: SessionState,
    /// Its physical plan.
    physical: Arc<dyn ExecutionPlan>,
    /// Its key.
    key: CacheKey,
    /// The reservation its in-memory parts are accounted in.
    reservation: MemoryReservation,
    /// The most memory the entry may hold.
    memory_cap: usize,
}
