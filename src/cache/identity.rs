//! What identifies a cache entry: its key and the files it was computed
//! from. Plain data, shared by the key's computation (`key.rs`), the
//! entries on disk (`entry.rs`) and the tables that read them (`exec.rs`).

/// Version of the on-disk format; part of every key, so a format change
/// makes old entries unreachable (and the LRU limit removes them).
pub const FORMAT: u32 = 1;

/// This build's id: xxh3-128 of the source of both crates and `Cargo.lock`
/// (see `build.rs`).
pub const BUILD_ID: &str = env!("SQLFEED_BUILD_ID");

/// One file a cached query read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InputFile {
    /// `scheme://host/path` of the file.
    pub location: String,
    /// Size in bytes.
    pub size: u64,
    /// Modification time in nanoseconds since the epoch.
    pub modified_ns: i64,
    /// The store's ETag, when it has one.
    pub e_tag: Option<String>,
}

/// One file a function of a cached query read (a `tokenizer.json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AssetFile {
    /// The path or URL as the query names it.
    pub location: String,
    /// Size in bytes.
    pub size: u64,
    /// xxh3-128 of the content, 32 hex digits.
    pub xxh3: String,
}

/// The key of a query's result; see the module docs.
#[derive(Debug, Clone)]
pub struct CacheKey {
    /// 32 hex digits.
    pub hex: String,
    /// Whether another run may reuse the entry (see the module docs).
    pub persistent: bool,
    /// Why not, when not persistent (for `\cache` and the CACHE result).
    pub session_only_reason: Option<String>,
    /// The files read.
    pub inputs: Vec<InputFile>,
    /// The files functions read, with their content hashes.
    pub assets: Vec<AssetFile>,
    /// The build id of the sqlfeed that computed the key ([`BUILD_ID`]).
    pub build: String,
}
