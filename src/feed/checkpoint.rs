//! A feed's checkpoint: where the feed is in its epoch's order, what that
//! order is a function of, and how a later feed — of another world size,
//! batch size or token budget, over data that may have grown — goes on from
//! it.
//!
//! ```text
//!  Feed::checkpoint()                         (after the batch last handed over)
//!      │  { version, epoch, step, rows,        ← position, the same on every rank
//!      │    query (sha-256 of the SQL), seed,  ← what picks the order
//!      │    rank, world, batch_size,           ← the shape that cut it
//!      │    batch_tokens, drop_last,
//!      │    skipped, appended,                 ← steps left out, continuation
//!      │    data: [[location, size, mtime(, e_tag)], …] }  ← listed at start
//!      ▼
//!  JSON (Python's `state_dict`, `sqlfeed feed --save-checkpoint`)
//!      ▼
//!  Checkpoint::resume_point(here, data now, on_data_change)
//!      │  refuses another query or seed; diffs the manifest:
//!      │    unchanged → the same epoch from `rows`, cut into this shape
//!      │    changed   → error naming the files | restart the epoch |
//!      │                continue over the added files (`appended.rs`)
//!      ▼
//!  ResumePoint → FeedBuilder (resume_after_rows / skip_steps /
//!                             continue_over_appended)
//! ```
//!
//! The format is Python's `Feed.state_dict()` (version 2, which also reads
//! version 1), so a checkpoint written by the CLI or a Rust program resumes
//! a Python feed and the other way round. Rank 0's checkpoint is every
//! rank's: only `rank` differs between ranks, and it is informative.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use datafusion::common::{plan_datafusion_err, plan_err};
use datafusion::error::{DataFusionError, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::batcher::pack::{PackOptions, PackSpan};
use crate::cache::InputFile;

/// The checkpoint format this sqlfeed writes; it also reads version 1.
pub const CHECKPOINT_VERSION: u32 = 2;

/// A feed's position and what it depends on; see the module docs. Written
/// by [`super::Feed::checkpoint`], read by
/// [`super::FeedBuilder::resume_from`].
///
/// # Examples
///
/// Stop after 3 batches, keep the checkpoint as JSON, and resume in what
/// could be another process: the next batch is the one the first run
/// would have handed over.
///
/// ```
/// # fn main() -> datafusion::error::Result<()> {
/// use sqlfeed::datagen::{GenOptions, generate};
/// use sqlfeed::device::Device;
/// use sqlfeed::feed::{Checkpoint, Feed, OnDataChange};
///
/// let dir = tempfile::tempdir()?;
/// generate(&GenOptions::new(1000, dir.path()))?;
/// let session = sqlfeed::Session::try_new()?;
/// let sql = format!("SELECT id AS x FROM '{}/'", dir.path().display());
/// let builder = Feed::builder(&session, sql).shuffle(3).batch_size(100).device(Device::Cpu);
///
/// let mut feed = builder.clone().build()?;
/// for _ in 0..3 {
///     feed.next().transpose()?;
/// }
/// let json = feed.checkpoint()?.to_json();
/// let uninterrupted = feed.next().transpose()?.expect("a 4th batch");
/// drop(feed);
///
/// let checkpoint = Checkpoint::from_json(&json, "ckpt.json")?;
/// assert_eq!((checkpoint.epoch, checkpoint.step), (0, 3));
/// let mut resumed = builder.resume_from(checkpoint, OnDataChange::Error).build()?;
/// let next = resumed.next().transpose()?.expect("the 4th batch");
/// assert_eq!(next.tensor("x")?.as_bytes()?, uninterrupted.tensor("x")?.as_bytes()?);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The format's version ([`CHECKPOINT_VERSION`]).
    pub version: u32,
    /// The epoch of the next batch.
    pub epoch: u64,
    /// The global step (within `epoch`) of the next batch.
    pub step: u64,
    /// Rows of the epoch's order consumed by all ranks together (absent in
    /// version 1 states of token-budget feeds, which count steps only).
    #[serde(default)]
    pub rows: Option<u64>,
    /// The shuffle seed (`None`: unshuffled).
    pub seed: Option<u64>,
    /// Rows per window of a windowed shuffle (`None`: the exact shuffle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle_window: Option<u64>,
    /// Shuffled by position (`SHUFFLE BY POSITION`) rather than content.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shuffle_by_position: bool,
    /// The rank that wrote it (informative: any rank resumes from it).
    pub rank: usize,
    /// The world size it was written under.
    pub world: usize,
    /// Rows per batch.
    pub batch_size: usize,
    /// The token budget of a token-budget feed.
    #[serde(default)]
    pub batch_tokens: Option<usize>,
    /// Whether the last partial step is dropped.
    pub drop_last: bool,
    /// [`query_fingerprint`] of the feed's SQL.
    pub query: String,
    /// Global steps left out, by epoch (keys are epochs, as JSON wants
    /// string keys).
    #[serde(default)]
    pub skipped: BTreeMap<String, Vec<u64>>,
    /// The epoch continues over appended data (see `appended.rs`); `rows`
    /// count from the continuation.
    #[serde(default)]
    pub appended: Option<AppendedState>,
    /// The files the order is over, listed when the feed started (absent in
    /// states that predate manifests: then data changes go unnoticed).
    #[serde(default)]
    pub data: Option<Vec<ManifestEntry>>,
    /// The Delta Lake tables the query names without a version, by name as
    /// written, and the version the feed pinned each to: a resume reads
    /// them again, even after newer commits (absent when it reads none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub delta_versions: BTreeMap<String, u64>,
    /// The rows quarantined before this position (`on_error =
    /// quarantine`): a resume's table starts with them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<super::QuarantinedRow>,
    /// How a packing feed packs (its windows are cut from the epoch's
    /// start: it resumes under the same packing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<PackOptions>,
    /// The shapes a packing feed ran under in `epoch` before its own, as
    /// resumes under other shapes left them, oldest first: a resume replays
    /// their plans to find the documents already fed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pack_history: Vec<PackSpan>,
}

/// A continuation over appended data, as a checkpoint records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendedState {
    /// The epoch that continues.
    pub epoch: u64,
    /// The files of the order before the files were added.
    pub data: Vec<ManifestEntry>,
    /// Rows of that order consumed before the continuation.
    pub rows: u64,
}

/// One file of a checkpoint's manifest: in JSON the array
/// `[location, size, modified_ns]` or `[location, size, modified_ns, e_tag]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "ManifestJson", into = "ManifestJson")]
pub struct ManifestEntry(pub InputFile);

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum ManifestJson {
    Tagged(String, u64, i64, String),
    Plain(String, u64, i64),
}

impl From<ManifestJson> for ManifestEntry {
    fn from(json: ManifestJson) -> Self {
        let (location, size, modified_ns, e_tag) = match json {
            ManifestJson::Tagged(l, s, m, e) => (l, s, m, Some(e)),
            ManifestJson::Plain(l, s, m) => (l, s, m, None),
        };
        ManifestEntry(InputFile {
            location,
            size,
            modified_ns,
            e_tag,
        })
    }
}

impl From<ManifestEntry> for ManifestJson {
    fn from(ManifestEntry(file): ManifestEntry) -> Self {
        match file.e_tag {
            Some(e_tag) => {
                ManifestJson::Tagged(file.location, file.size, file.modified_ns, e_tag)
            }
            None => ManifestJson::Plain(file.location, file.size, file.modified_ns),
        }
    }
}

/// What a resume does when the data changed since the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDataChange {
    /// Refuse, naming the files (the default).
    #[default]
    Error,
    /// Start the checkpoint's epoch anew over the data as it is now.
    RestartEpoch,
    /// Go on over the added files: every row of the old files not yet
    /// consumed plus every row of the added ones (shuffled feeds; files only
    /// added).
    Continue,
}

impl FromStr for OnDataChange {
    type Err = DataFusionError;

    fn from_str(text: &str) -> Result<Self> {
        match text {
            "error" => Ok(Self::Error),
            "restart_epoch" | "restart-epoch" => Ok(Self::RestartEpoch),
            "continue" => Ok(Self::Continue),
            other => plan_err!(
                "on_data_change={other:?}: expected 'error', 'restart_epoch' or 'continue'"
            ),
        }
    }
}

/// How a message names a choice of [`OnDataChange`], in every front end's
/// spelling.
fn choice(name: &str) -> String {
    format!("on_data_change='{name}' (--on-data-change {name})")
}

/// What a checkpoint's rows depend on, of the feed that resumes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedShape {
    /// [`query_fingerprint`] of the feed's SQL.
    pub query: String,
    /// The shuffle seed.
    pub seed: Option<u64>,
    /// Rows per window of a windowed shuffle.
    pub shuffle_window: Option<u64>,
    /// Shuffled by position rather than content.
    pub shuffle_by_position: bool,
    /// World size.
    pub world: usize,
    /// Rows per batch.
    pub batch_size: usize,
    /// Token budget.
    pub batch_tokens: Option<usize>,
    /// Whether the last partial step is dropped.
    pub drop_last: bool,
    /// Whether batches are bucketed by length (windows cut from the epoch's
    /// start: resumable only under the same shape).
    pub bucketed: bool,
    /// How a packing feed packs (windows cut from the epoch's start too).
    pub pack: Option<PackOptions>,
}

/// Where a feed resumed from a checkpoint starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The first epoch.
    pub epoch: u64,
    /// The global step of the first batch (of this shape's steps).
    pub step: u64,
    /// Rows of the epoch's order already consumed (`None`: start at `step`
    /// of the checkpoint's own shape).
    pub rows: Option<u64>,
    /// Global steps left out, by epoch.
    pub skipped: BTreeMap<u64, BTreeSet<u64>>,
    /// The epoch continues over appended data.
    pub appended: Option<AppendedState>,
    /// A packing feed's earlier shapes in `epoch` (see
    /// [`Checkpoint::pack_history`]); `step` counts their steps too.
    pub pack_history: Vec<PackSpan>,
}

/// The short sha-256 of a feed's SQL that a checkpoint records: the hex of
/// its first 8 bytes (Python's `hashlib.sha256(sql).hexdigest()[:16]`).
pub fn query_fingerprint(sql: &str) -> String {
    Sha256::digest(sql.as_bytes())[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

impl Checkpoint {
    /// Reads a checkpoint from JSON; `origin` names where it came from in
    /// the error.
    pub fn from_json(json: &str, origin: &str) -> Result<Self> {
        serde_json::from_str(json).map_err(|e| {
            plan_datafusion_err!(
                "{origin} is not a sqlfeed feed checkpoint: {e} (it is the JSON that \
                 Feed.state_dict() or `sqlfeed feed --save-checkpoint` writes)"
            )
        })
    }

    /// The checkpoint as JSON.
    pub fn to_json(&self) -> String {
        // A struct of strings, numbers, maps and arrays always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Where the feed that wrote this checkpoint goes on: its position as
    /// it is, without the checks of [`Self::resume_point`] (the shape and
    /// data are its own). A continuation over appended data holds only in
    /// its own epoch.
    pub fn own_point(&self) -> Result<ResumePoint> {
        Ok(ResumePoint {
            epoch: self.epoch,
            step: self.step,
            rows: self.rows,
            skipped: self.skipped_steps()?,
            appended: self
                .appended
                .clone()
                .filter(|appended| appended.epoch == self.epoch),
            pack_history: self.pack_history.clone(),
        })
    }

    /// This checkpoint moved to the start of `epoch` (a training loop's
    /// `set_epoch`): no step, row or continuation of another epoch.
    pub fn at_epoch_start(&self, epoch: u64) -> Self {
        Self {
            epoch,
            step: 0,
            rows: Some(0),
            appended: None,
            pack_history: vec![],
            ..self.clone()
        }
    }

    /// This checkpoint with global steps `steps` of `epoch` left out too.
    pub fn skipping(&self, epoch: u64, steps: impl IntoIterator<Item = u64>) -> Self {
        let mut skipped = self.clone();
        let kept = skipped.skipped.entry(epoch.to_string()).or_default();
        kept.extend(steps);
        kept.sort_unstable();
        kept.dedup();
        skipped
    }

    /// The skipped steps by epoch number.
    fn skipped_steps(&self) -> Result<BTreeMap<u64, BTreeSet<u64>>> {
        let mut skipped = BTreeMap::new();
        for (epoch, steps) in &self.skipped {
            let epoch: u64 = epoch.parse().map_err(|_| {
                plan_datafusion_err!(
                    "the checkpoint's skipped steps are keyed by {epoch:?}, not an epoch \
                     number"
                )
            })?;
            skipped.insert(epoch, steps.iter().copied().collect());
        }
        Ok(skipped)
    }

    /// Where a feed of shape `here`, over the data listed `now`, resumes
    /// this checkpoint. Under the same shape the batches are exactly the
    /// uninterrupted run's. Under another world size, batch size, token
    /// budget or `drop_last` the epoch goes on from the same row of the same
    /// order, cut into `here`'s batches. Refuses another query or seed
    /// (its rows are others); a change of the data is handled as
    /// `on_data_change` says.
    pub fn resume_point(
        &self,
        here: &FeedShape,
        now: &[InputFile],
        on_data_change: OnDataChange,
    ) -> Result<ResumePoint> {
        let plan_error = |message: String| plan_err!("{message}");
        if self.version != 1 && self.version != CHECKPOINT_VERSION {
            return plan_error(format!(
                "feed checkpoint version {}: this sqlfeed reads versions 1 and \
                 {CHECKPOINT_VERSION}",
                self.version
            ));
        }
        if self.query != here.query {
            return plan_error(format!(
                "the checkpoint's feed has query={:?} but this feed has query={:?} (the \
                 sha-256 of the SQL text): its rows are others here; resume with the same \
                 query and seed, or start the feed anew",
                self.query, here.query
            ));
        }
        if self.seed != here.seed {
            let seed = |s: Option<u64>| s.map_or("None".to_string(), |s| s.to_string());
            return plan_error(format!(
                "the checkpoint's feed has seed={} but this feed has seed={}: its rows \
                 are others here; resume with the same query and seed, or start the \
                 feed anew",
                seed(self.seed),
                seed(here.seed)
            ));
        }
        if self.shuffle_window != here.shuffle_window {
            let window = |w: Option<u64>| w.map_or("None".to_string(), |w| w.to_string());
            return plan_error(format!(
                "the checkpoint's feed has shuffle_window={} but this feed has \
                 shuffle_window={}: its order is another here; resume with the same \
                 shuffle_window, or start the feed anew",
                window(self.shuffle_window),
                window(here.shuffle_window)
            ));
        }
        if self.shuffle_by_position != here.shuffle_by_position {
            let keyed =
                |by_position: bool| if by_position { "position" } else { "content" };
            return plan_error(format!(
                "the checkpoint's feed was shuffled by {} but this feed is shuffled by {}: \
                 its order is another here; resume with the same shuffle_by_position, or \
                 start the feed anew",
                keyed(self.shuffle_by_position),
                keyed(here.shuffle_by_position)
            ));
        }
        let mut step = self.step;
        let mut rows = self.rows;
        let mut appended = self
            .appended
            .clone()
            .filter(|appended| appended.epoch == self.epoch);
        let (added, removed, rewritten) = diff(self.data.as_deref(), now);
        let changes = describe(&added, &removed, &rewritten);
        if !changes.is_empty() {
            match on_data_change {
                OnDataChange::Error => {
                    return plan_error(format!(
                        "the data changed since the checkpoint ({changes}): the rest of \
                         epoch {} would be another order. Resume over the files the \
                         checkpoint read, pass {} to go on over the files added (the \
                         rows not yet consumed plus the new ones), or {} to start the \
                         epoch anew over the data as it is now",
                        self.epoch,
                        choice("continue"),
                        choice("restart_epoch")
                    ));
                }
                OnDataChange::RestartEpoch => {
                    step = 0;
                    rows = Some(0);
                    appended = None;
                }
                OnDataChange::Continue => {
                    if !removed.is_empty() || !rewritten.is_empty() {
                        return plan_error(format!(
                            "cannot continue epoch {} over the data as it is now ({}): \
                             only added files can be continued over; resume over the \
                             files the checkpoint read, or pass {}",
                            self.epoch,
                            describe(&[], &removed, &rewritten),
                            choice("restart_epoch")
                        ));
                    }
                    if appended.is_some() {
                        return plan_error(format!(
                            "files were added again ({changes}) during epoch {}, which \
                             already continues over added files: pass {}",
                            self.epoch,
                            choice("restart_epoch")
                        ));
                    }
                    let (Some(consumed), Some(_)) = (rows, here.seed) else {
                        return plan_error(format!(
                            "{} needs a shuffled feed whose checkpoint records rows (an \
                             unshuffled order over partitions changes when files are \
                             added): pass {}",
                            choice("continue"),
                            choice("restart_epoch")
                        ));
                    };
                    appended = Some(AppendedState {
                        epoch: self.epoch,
                        data: self.data.clone().unwrap_or_default(),
                        rows: consumed,
                    });
                    rows = Some(0);
                }
            }
        }
        if self.version == 1 && self.batch_tokens.is_none() {
            // A step of a fixed shape is `batch_size × world` rows.
            rows = Some(step * (self.batch_size * self.world) as u64);
        }
        let mut theirs = vec![];
        let mut ours = vec![];
        let mut compare = |key: &str, them: String, us: String| {
            if them != us {
                theirs.push(format!("{key}={them}"));
                ours.push(format!("{key}={us}"));
            }
        };
        compare("world", self.world.to_string(), here.world.to_string());
        compare(
            "batch_size",
            self.batch_size.to_string(),
            here.batch_size.to_string(),
        );
        let tokens = |t: Option<usize>| t.map_or("None".to_string(), |t| t.to_string());
        compare(
            "batch_tokens",
            tokens(self.batch_tokens),
            tokens(here.batch_tokens),
        );
        compare(
            "drop_last",
            self.drop_last.to_string(),
            here.drop_last.to_string(),
        );
        let packing = |p: Option<PackOptions>| {
            p.map_or("None".to_string(), |p| {
                format!(
                    "{} (window {}, pack_long={})",
                    p.max_tokens,
                    p.window,
                    p.long.name()
                )
            })
        };
        compare("pack", packing(self.pack), packing(here.pack));
        let reshaped = !theirs.is_empty();
        if reshaped && rows.is_none() {
            return plan_error(format!(
                "the checkpoint's feed has {} but this feed has {}, and its version 1 \
                 state of a token-budget feed records steps, not rows: resume it with \
                 the same settings, or start the epoch anew",
                theirs.join(", "),
                ours.join(", ")
            ));
        }
        if reshaped && here.bucketed {
            return plan_error(format!(
                "a bucket_by_length feed resumes only under its own shape; the \
                 checkpoint has {}",
                theirs.join(", ")
            ));
        }
        let mut pack_history = self.pack_history.clone();
        // `flat` lays the same sequences out otherwise: not a change of plan.
        let plan = |p: Option<PackOptions>| p.map(|p| (p.max_tokens, p.window, p.long));
        if plan(self.pack) != plan(here.pack) {
            return plan_error(format!(
                "a packing feed resumes only under its own packing (its windows are \
                 cut from the epoch's start): the checkpoint has {} but this feed has {}",
                theirs.join(", "),
                ours.join(", ")
            ));
        }
        if reshaped && here.pack.is_some() {
            // The plan of the checkpoint's shape is replayed up to its step,
            // and what that step's window still holds is packed anew.
            let before: u64 = pack_history.iter().map(|span| span.steps).sum();
            pack_history.push(PackSpan {
                batch_size: self.batch_size,
                world: self.world,
                steps: self.step.saturating_sub(before),
            });
            if appended.is_some() {
                return plan_error(
                    "a packing feed cannot continue an epoch over appended data".into(),
                );
            }
            return Ok(ResumePoint {
                epoch: self.epoch,
                step: pack_history.iter().map(|span| span.steps).sum(),
                rows: None,
                skipped: self.skipped_steps()?,
                appended: None,
                pack_history,
            });
        }
        if reshaped
            && let Some(rows) = rows
            && here.batch_tokens.is_none()
        {
            // Numbered as this shape's step the rows fall in (informative).
            step = rows / (here.batch_size * here.world).max(1) as u64;
        }
        Ok(ResumePoint {
            epoch: self.epoch,
            step,
            rows,
            skipped: self.skipped_steps()?,
            appended,
            pack_history,
        })
    }
}

/// `(added, removed, rewritten)` locations between two manifests (nothing
/// if the checkpoint predates manifests).
fn diff(
    before: Option<&[ManifestEntry]>,
    now: &[InputFile],
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let Some(before) = before else {
        return (vec![], vec![], vec![]);
    };
    let then: BTreeMap<&str, &InputFile> = before
        .iter()
        .map(|f| (f.0.location.as_str(), &f.0))
        .collect();
    let current: BTreeMap<&str, &InputFile> =
        now.iter().map(|f| (f.location.as_str(), f)).collect();
    let added = current
        .keys()
        .filter(|loc| !then.contains_key(*loc))
        .map(|loc| loc.to_string())
        .collect();
    let removed = then
        .keys()
        .filter(|loc| !current.contains_key(*loc))
        .map(|loc| loc.to_string())
        .collect();
    let rewritten = current
        .iter()
        .filter(|(loc, file)| then.get(*loc).is_some_and(|old| old != *file))
        .map(|(loc, _)| loc.to_string())
        .collect();
    (added, removed, rewritten)
}

/// A manifest difference, for a message (`""` if none).
fn describe(added: &[String], removed: &[String], rewritten: &[String]) -> String {
    fn names(locations: &[String]) -> String {
        let mut sorted: Vec<&str> = locations.iter().map(String::as_str).collect();
        sorted.sort_unstable();
        let shown = sorted[..sorted.len().min(3)].join(", ");
        match sorted.len().saturating_sub(3) {
            0 => shown,
            more => format!("{shown} and {more} more"),
        }
    }
    let mut parts = vec![];
    if !added.is_empty() {
        parts.push(format!("{} added: {}", added.len(), names(added)));
    }
    if !removed.is_empty() {
        parts.push(format!("{} removed: {}", removed.len(), names(removed)));
    }
    if !rewritten.is_empty() {
        parts.push(format!(
            "{} changed (size or modification time): {}",
            rewritten.len(),
            names(rewritten)
        ));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(location: &str, size: u64) -> InputFile {
        InputFile {
            location: location.into(),
            size,
            modified_ns: 7,
            e_tag: None,
        }
    }

    fn shape() -> FeedShape {
        FeedShape {
            query: query_fingerprint("SELECT 1"),
            seed: Some(3),
            shuffle_window: None,
            shuffle_by_position: false,
            world: 2,
            batch_size: 4,
            batch_tokens: None,
            drop_last: false,
            bucketed: false,
            pack: None,
        }
    }

    fn checkpoint(data: &[InputFile]) -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            epoch: 1,
            step: 5,
            rows: Some(40),
            seed: Some(3),
            shuffle_window: None,
            shuffle_by_position: false,
            rank: 0,
            world: 2,
            batch_size: 4,
            batch_tokens: None,
            drop_last: false,
            query: query_fingerprint("SELECT 1"),
            skipped: BTreeMap::from([("1".to_string(), vec![2, 3])]),
            appended: None,
            data: Some(data.iter().cloned().map(ManifestEntry).collect()),
            delta_versions: BTreeMap::new(),
            quarantined: vec![],
            pack: None,
            pack_history: vec![],
        }
    }

    #[test]
    fn the_fingerprint_is_pythons_short_sha256() {
        // hashlib.sha256(b"SELECT 1").hexdigest()[:16]
        assert_eq!(query_fingerprint("SELECT 1"), "e004ebd5b5532a4b");
    }

    #[test]
    fn the_json_is_pythons_state_dict() -> Result<()> {
        let mut tagged = file("s3://b/a.parquet", 10);
        tagged.e_tag = Some("\"x\"".into());
        let checkpoint = checkpoint(&[file("file:/d/a.parquet", 5), tagged]);
        let json = checkpoint.to_json();
        assert!(json.contains(r#"["file:/d/a.parquet",5,7]"#), "{json}");
        assert!(
            json.contains(r#"["s3://b/a.parquet",10,7,"\"x\""]"#),
            "{json}"
        );
        assert!(json.contains(r#""skipped":{"1":[2,3]}"#), "{json}");
        assert_eq!(Checkpoint::from_json(&json, "test")?, checkpoint);
        // A version 1 state: no rows, no manifest, no continuation.
        let v1 = r#"{"version": 1, "epoch": 0, "step": 3, "seed": null, "rank": 1,
            "world": 2, "batch_size": 4, "batch_tokens": null, "drop_last": true,
            "query": "abc", "skipped": {}}"#;
        let read = Checkpoint::from_json(v1, "v1")?;
        assert_eq!((read.rows, read.data), (None, None));
        Ok(())
    }

    #[test]
    fn a_file_that_is_not_a_checkpoint_is_named() {
        let err = Checkpoint::from_json("{\"epoch\": 1}", "ckpt.json").unwrap_err();
        assert!(
            err.to_string()
                .contains("ckpt.json is not a sqlfeed feed checkpoint"),
            "{err}"
        );
    }

    /// The error of resuming `checkpoint` in `shape` over `files`, which
    /// must be refused.
    fn refusal(
        checkpoint: &Checkpoint,
        shape: &FeedShape,
        files: &[InputFile],
        on_change: OnDataChange,
    ) -> String {
        let refused = checkpoint.resume_point(shape, files, on_change);
        refused.expect_err("a refused resume").to_string()
    }

    #[test]
    fn a_new_shape_goes_on_from_the_same_row() -> Result<()> {
        let data = [file("file:/d/a.parquet", 5)];
        let same =
            checkpoint(&data).resume_point(&shape(), &data, OnDataChange::Error)?;
        assert_eq!((same.epoch, same.step, same.rows), (1, 5, Some(40)));
        assert_eq!(same.skipped[&1], BTreeSet::from([2, 3]));
        let three_ranks = FeedShape {
            world: 3,
            batch_size: 6,
            ..shape()
        };
        let point =
            checkpoint(&data).resume_point(&three_ranks, &data, OnDataChange::Error)?;
        // 40 rows are step 2 of 18-row steps.
        assert_eq!((point.step, point.rows), (2, Some(40)));
        let bucketed = FeedShape {
            bucketed: true,
            pack: None,
            ..three_ranks
        };
        let err = refusal(&checkpoint(&data), &bucketed, &data, OnDataChange::Error);
        assert!(err.contains("world=2, batch_size=4"), "{err}");
        Ok(())
    }

    #[test]
    fn a_packing_feed_under_a_new_shape_records_the_shapes_before() -> Result<()> {
        let data = [file("file:/d/a.parquet", 5)];
        let packing = Some(PackOptions::new(2048));
        let written = Checkpoint {
            pack: packing,
            ..checkpoint(&data)
        };
        let here = FeedShape {
            pack: packing,
            ..shape()
        };
        // The same shape: its own step, no history.
        let same = written.resume_point(&here, &data, OnDataChange::Error)?;
        assert_eq!((same.step, same.pack_history.len()), (5, 0));
        // Three ranks: the checkpoint's 5 steps of 2 × 4 are replayed first.
        let three = FeedShape {
            world: 3,
            ..here.clone()
        };
        let point = written.resume_point(&three, &data, OnDataChange::Error)?;
        let first = PackSpan {
            batch_size: 4,
            world: 2,
            steps: 5,
        };
        assert_eq!((point.step, point.rows), (5, None));
        assert_eq!(point.pack_history, vec![first]);
        // 4 steps later on those 3 ranks, then one rank: both shapes replayed.
        let later = Checkpoint {
            world: 3,
            step: 9,
            pack_history: vec![first],
            ..written.clone()
        };
        let one = FeedShape {
            world: 1,
            ..here.clone()
        };
        let point = later.resume_point(&one, &data, OnDataChange::Error)?;
        assert_eq!(point.step, 9);
        assert_eq!(
            point.pack_history,
            vec![
                first,
                PackSpan {
                    batch_size: 4,
                    world: 3,
                    steps: 4
                }
            ]
        );
        // Another packing is another plan.
        let other = FeedShape {
            pack: Some(PackOptions::new(1024)),
            ..here
        };
        let err = refusal(&written, &other, &data, OnDataChange::Error);
        assert!(err.contains("resumes only under its own packing"), "{err}");
        assert!(err.contains("pack=2048"), "{err}");
        Ok(())
    }

    #[test]
    fn another_query_or_seed_is_refused() {
        let data = [file("file:/d/a.parquet", 5)];
        let saved = checkpoint(&data);
        let other_seed = FeedShape {
            seed: Some(4),
            ..shape()
        };
        let err = refusal(&saved, &other_seed, &data, OnDataChange::Continue);
        assert!(err.contains("seed=3 but this feed has seed=4"), "{err}");
        let other_query = FeedShape {
            query: query_fingerprint("SELECT 2"),
            ..shape()
        };
        let err = refusal(&saved, &other_query, &data, OnDataChange::Continue);
        assert!(err.contains("query="), "{err}");
    }

    #[test]
    fn changed_data_is_refused_restarted_or_continued() -> Result<()> {
        let before = [file("file:/d/a.parquet", 5), file("file:/d/b.parquet", 5)];
        let added = [
            before[0].clone(),
            before[1].clone(),
            file("file:/d/c.parquet", 9),
        ];
        let err = refusal(&checkpoint(&before), &shape(), &added, OnDataChange::Error);
        assert!(
            err.contains("1 added: file:/d/c.parquet): the rest of epoch 1"),
            "{err}"
        );
        let restart = checkpoint(&before).resume_point(
            &shape(),
            &added,
            OnDataChange::RestartEpoch,
        )?;
        assert_eq!((restart.epoch, restart.step, restart.rows), (1, 0, Some(0)));
        // A version 1 state counts its rows from its step: the restarted one's.
        let mut v1 = checkpoint(&before);
        (v1.version, v1.rows) = (1, None);
        let restart = v1.resume_point(&shape(), &added, OnDataChange::RestartEpoch)?;
        assert_eq!((restart.step, restart.rows), (0, Some(0)));
        let same = v1.resume_point(&shape(), &before, OnDataChange::Error)?;
        assert_eq!((same.step, same.rows), (5, Some(40)));
        let go_on =
            checkpoint(&before).resume_point(&shape(), &added, OnDataChange::Continue)?;
        let appended = go_on.appended.expect("a continuation");
        assert_eq!(
            (appended.epoch, appended.rows, go_on.rows),
            (1, 40, Some(0))
        );
        assert_eq!(appended.data.len(), 2);
        let rewritten = [file("file:/d/a.parquet", 6), before[1].clone()];
        let err = refusal(
            &checkpoint(&before),
            &shape(),
            &rewritten,
            OnDataChange::Continue,
        );
        assert!(
            err.contains("1 changed (size or modification time): file:/d/a.parquet"),
            "{err}"
        );
        let unshuffled = FeedShape {
            seed: None,
            ..shape()
        };
        let mut unshuffled_checkpoint = checkpoint(&before);
        unshuffled_checkpoint.seed = None;
        let err = refusal(
            &unshuffled_checkpoint,
            &unshuffled,
            &added,
            OnDataChange::Continue,
        );
        assert!(err.contains("needs a shuffled feed"), "{err}");
        Ok(())
    }

    #[test]
    fn on_data_change_names_its_choices() {
        assert_eq!(
            "restart-epoch".parse::<OnDataChange>().ok(),
            Some(OnDataChange::RestartEpoch)
        );
        let err = "resume".parse::<OnDataChange>().unwrap_err();
        assert!(err.to_string().contains("'restart_epoch'"), "{err}");
    }
}
